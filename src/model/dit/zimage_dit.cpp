// ZImageDiT forward (spec §4), top to bottom:
//   c      = t_embedder(sinusoid(t_model * t_scale))                 [B, adaln]
//   x      = x_embedder(patchify(latents)) (+ x_pad_token rows)      [B, Np, D]
//   x      = noise_refiner blocks (modulated by c)                   [B, Np, D]
//   cap    = cap_embedder(caps) (+ cap_pad_token rows)               [B, Lp, D]
//   cap    = context_refiner blocks (unmodulated)                    [B, Lp, D]
//   u      = [x ; cap] per item, batch padded                        [B, S, D]
//   u      = main blocks (modulated by c)                            [B, S, D]
//   out    = unpatchify(final_layer(u, c)) on the first N rows       [B, C, h, w]
// Block (adaLN has no SiLU, no shift; post-norms before the tanh gates):
//   x += tanh(g_a) ⊙ RMSNorm2(Attn(RMSNorm1(x) ⊙ (1 + s_a)))
//   x += tanh(g_f) ⊙ RMSNorm2'(FFN(RMSNorm1'(x) ⊙ (1 + s_f)))
#include "model/dit/zimage_dit.h"

#include <algorithm>
#include <cmath>

#include "core/log.h"
#include "model/common/load_util.h"

namespace zimage {

namespace {

constexpr float kQkNormEps = 1e-5f;     // Attention(qk_norm="rms_norm", eps=1e-5), fixed
constexpr float kFinalNormEps = 1e-6f;  // FinalLayer LayerNorm, no affine

}  // namespace

// Activation buffers for one sequence length (reused by every block of that stage).
struct ZImageDiT::Scratch {
  Tensor norm;        // [B*S, D]
  Tensor qkv;         // [B*S, 3D]
  Tensor q, k, v, o;  // [B, S, H, Dh]
  Tensor proj;        // [B*S, D]
  Tensor ffn;         // [B*S, 2F]
  Tensor act;         // [B*S, F]
  // FP8 rows made by the op before a W8A8 linear (Backend::takes_fp8_inputs; undefined when no
  // linear takes them): the q|k|v and w1|w3 inputs [B*S, D], the w2 input [B*S, F] (one at a time)
  // and their scales [B*S].
  Tensor x8, x8_scale;
  // A block's adaLN modulation: mod [B, 4D] -> 1 + s_a, tanh(g_a), 1 + s_f, tanh(g_f) [B, D];
  // two sets, so the next block's can be made while this one's gates are still to be used.
  struct Modulation {
    Tensor mod;                               // [B, 4D]
    Tensor scale_a, gate_a, scale_f, gate_f;  // [B, D]
  };
  Modulation mods[2];

  static Result<Scratch> make(Backend& be, const TransformerConfig& c, int64_t b, int64_t s,
                              bool fp8_rows) {
    const int64_t d = c.dim, h = c.n_heads, dh = c.head_dim(), f = c.ffn_hidden(), r = b * s;
    const DType t = be.act_dtype();
    Scratch x;
    ZI_ASSIGN_OR_RETURN(x.norm, load::alloc(be, t, {r, d}, "dit.norm"));
    ZI_ASSIGN_OR_RETURN(x.qkv, load::alloc(be, t, {r, 3 * d}, "dit.qkv"));
    ZI_ASSIGN_OR_RETURN(x.q, load::alloc(be, t, {b, s, h, dh}, "dit.q"));
    ZI_ASSIGN_OR_RETURN(x.k, load::alloc(be, t, {b, s, h, dh}, "dit.k"));
    ZI_ASSIGN_OR_RETURN(x.v, load::alloc(be, t, {b, s, h, dh}, "dit.v"));
    ZI_ASSIGN_OR_RETURN(x.o, load::alloc(be, t, {b, s, h, dh}, "dit.attn"));
    ZI_ASSIGN_OR_RETURN(x.proj, load::alloc(be, t, {r, d}, "dit.proj"));
    ZI_ASSIGN_OR_RETURN(x.ffn, load::alloc(be, t, {r, 2 * f}, "dit.ffn"));
    ZI_ASSIGN_OR_RETURN(x.act, load::alloc(be, t, {r, f}, "dit.ffn_act"));
    if (fp8_rows) {
      ZI_ASSIGN_OR_RETURN(x.x8,
                          load::alloc(be, DType::kF8E4M3, {r, std::max(d, f)}, "dit.fp8_rows"));
      ZI_ASSIGN_OR_RETURN(x.x8_scale, load::alloc(be, DType::kF32, {r}, "dit.fp8_row_scales"));
    }
    for (Modulation& m : x.mods) {
      ZI_ASSIGN_OR_RETURN(m.mod, load::alloc(be, t, {b, 4 * d}, "dit.mod"));
      ZI_ASSIGN_OR_RETURN(m.scale_a, load::alloc(be, t, {b, d}, "dit.scale_attn"));
      ZI_ASSIGN_OR_RETURN(m.gate_a, load::alloc(be, t, {b, d}, "dit.gate_attn"));
      ZI_ASSIGN_OR_RETURN(m.scale_f, load::alloc(be, t, {b, d}, "dit.scale_ffn"));
      ZI_ASSIGN_OR_RETURN(m.gate_f, load::alloc(be, t, {b, d}, "dit.gate_ffn"));
    }
    return x;
  }

  // The same buffers for a shorter sequence s <= the one made for (views of their leading
  // elements): the noise refiner, context refiner and main layers share one set, so a forward
  // holds one stage's activations, not three (0.55 GiB less at 1024²).
  Scratch view(int64_t b, int64_t s, const TransformerConfig& c) const {
    const int64_t d = c.dim, h = c.n_heads, dh = c.head_dim(), f = c.ffn_hidden(), r = b * s;
    auto lead = [](const Tensor& t, Shape shape) {
      return Tensor(t.storage(), t.byte_offset(), t.dtype(), std::move(shape));
    };
    Scratch x = *this;
    x.norm = lead(norm, {r, d});
    x.qkv = lead(qkv, {r, 3 * d});
    x.q = lead(q, {b, s, h, dh});
    x.k = lead(k, {b, s, h, dh});
    x.v = lead(v, {b, s, h, dh});
    x.o = lead(o, {b, s, h, dh});
    x.proj = lead(proj, {r, d});
    x.ffn = lead(ffn, {r, 2 * f});
    x.act = lead(act, {r, f});
    if (x8.defined()) {
      x.x8 = lead(x8, {r, std::max(d, f)});
      x.x8_scale = lead(x8_scale, {r});
    }
    return x;
  }
  // The leading [B*S, cols] of x8 (cols: D for q|k|v and w1|w3 inputs, F for w2's).
  Tensor rows8(int64_t cols) const {
    const int64_t r = x8_scale.numel();
    return Tensor(x8.storage(), x8.byte_offset(), x8.dtype(), {r, cols});
  }
};

Result<std::shared_ptr<ZImageDiT::Scratch>> ZImageDiT::make_scratch(int64_t b, int64_t s) {
  ZI_ASSIGN_OR_RETURN(Scratch x, Scratch::make(be_, cfg_, b, s, fp8_rows()));
  return std::make_shared<Scratch>(std::move(x));
}

Tensor ZImageDiT::timestep_sinusoid(const std::vector<float>& t_model) const {
  const int64_t b = static_cast<int64_t>(t_model.size());
  const int half = kTimeFreqDim / 2;
  // Sinusoid in float32, evaluated in the same order as diffusers' timestep_embedding:
  // f_k = exp((-ln(10000) * k) / half); arg = (t * t_scale) * f_k; [cos | sin].
  Tensor e = Tensor::host(DType::kF32, {b, kTimeFreqDim});  // [B, 256]
  if (!e.defined()) return e;
  const float neg_log = static_cast<float>(-std::log(10000.0));
  for (int64_t i = 0; i < b; ++i) {
    const float u = t_model[i] * cfg_.t_scale;
    for (int k = 0; k < half; ++k) {
      const float expo = (neg_log * static_cast<float>(k)) / static_cast<float>(half);
      const float freq = static_cast<float>(std::exp(static_cast<double>(expo)));
      const float arg = u * freq;
      e.data_as<float>()[i * kTimeFreqDim + k] =
          static_cast<float>(std::cos(static_cast<double>(arg)));
      e.data_as<float>()[i * kTimeFreqDim + half + k] =
          static_cast<float>(std::sin(static_cast<double>(arg)));
    }
  }
  return e;
}

Status ZImageDiT::timestep_embedding(const Tensor& sinusoid, Tensor& c) {
  const int64_t b = sinusoid.dim(0);
  ZI_ASSIGN_OR_RETURN(Tensor mid, load::alloc(be_, be_.act_dtype(), {b, kTimeMidDim}, "dit.t_mid"));
  ZI_TRY(be_.matmul(sinusoid, t_w1_, t_b1_, mid));  // [B, 1024]
  ZI_TRY(be_.silu(mid, mid));                       // [B, 1024]
  ZI_ASSIGN_OR_RETURN(c, load::alloc(be_, be_.act_dtype(), {b, cfg_.adaln_dim()}, "dit.t_emb"));
  return be_.matmul(mid, t_w2_, t_b2_, c);  // [B, adaln]
}

Status ZImageDiT::modulate(const Block& blk, const Tensor& c, Scratch& s, int set) {
  if (!blk.modulated) return Status::Ok();
  Scratch::Modulation& m = s.mods[set];
  // mod = c · adaLNᵀ [B, 4D] -> 1 + s_a, tanh(g_a), 1 + s_f, tanh(g_f): [B, D] each
  return be_.matmul_dit_modulation(c, blk.adaln_w, blk.adaln_b, m.mod, m.scale_a, m.gate_a,
                                   m.scale_f, m.gate_f);
}

Status ZImageDiT::modulate_all(Pass& P) {
  // With streamed blocks some weights are not on the device until their block runs.
  if (streamer_) return Status::Ok();
  const int n = static_cast<int>(noise_refiner_.size() + context_refiner_.size() + layers_.size());
  std::vector<Tensor> w, bias;
  P.mod_slot.assign(n, -1);
  for (int i = 0; i < n; ++i) {
    const Block& blk = block_at(i);
    if (!blk.modulated) continue;
    P.mod_slot[i] = static_cast<int>(w.size());
    w.push_back(blk.adaln_w);
    bias.push_back(blk.adaln_b);
  }
  if (w.empty()) return Status::Ok();
  const int64_t m = static_cast<int64_t>(w.size());
  ZI_ASSIGN_OR_RETURN(
      P.mods, load::alloc(be_, be_.act_dtype(), {m, 4, P.c.dim(0), cfg_.dim}, "dit.modulations"));
  return be_.dit_modulation_layers(P.c, w, bias, P.mods);
}

Status ZImageDiT::modulate_block(const Pass& P, int index, const Block& blk, const Tensor& c,
                                 Scratch& s, int set) {
  if (!blk.modulated) return Status::Ok();
  const int slot = index < static_cast<int>(P.mod_slot.size()) ? P.mod_slot[index] : -1;
  if (!P.mods.defined() || slot < 0) return modulate(blk, c, s, set);
  const std::array<Tensor, 4> v = dit_modulation_of(P.mods, slot);
  Scratch::Modulation& m = s.mods[set];
  m.scale_a = v[0];
  m.gate_a = v[1];
  m.scale_f = v[2];
  m.gate_f = v[3];
  return Status::Ok();
}

Status ZImageDiT::run_block(const Block& blk, Tensor& x, const Tensor& freqs, const Tensor& c,
                            const AttentionParams& ap, Scratch& s, const AttentionFn* attn) {
  ZI_TRY(modulate(blk, c, s, 0));
  return run_block(blk, 0, /*prenormed=*/false, nullptr, x, freqs, ap, s, attn);
}

bool ZImageDiT::fp8_rows() const {
  // The linears whose inputs the norms and the SwiGLU make (the out projection's comes from the
  // attention, which makes act-dtype rows).
  return be_.takes_fp8_inputs() && (fp8_compute() & (kFp8Qkv | kFp8W13 | kFp8W2)) != 0;
}

bool ZImageDiT::qkv_takes_fp8(const Block& blk, const Scratch& s, const AttentionFn* attn) const {
  return s.x8.defined() && attn == nullptr && (blk.fp8_attention || be_.reads_packed_qkv()) &&
         takes_fp8_input(be_, blk.wqkv);
}

Status ZImageDiT::run_block(const Block& blk, int set, bool prenormed, const Block* next, Tensor& x,
                            const Tensor& freqs, const AttentionParams& ap, Scratch& s,
                            const AttentionFn* attn) {
  const int64_t b = x.dim(0), sq = x.dim(1), d = cfg_.dim;
  const int64_t rows = b * sq;
  const float eps = cfg_.norm_eps;
  const Tensor none;
  Tensor xr = x.view({rows, d});  // [B*S, D]
  // Undefined = unmodulated (s = 1, g = 1).
  const Scratch::Modulation& m = s.mods[set];
  const Tensor& scale_a = blk.modulated ? m.scale_a : none;
  const Tensor& gate_a = blk.modulated ? m.gate_a : none;
  const Tensor& scale_f = blk.modulated ? m.scale_f : none;
  const Tensor& gate_f = blk.modulated ? m.gate_f : none;
  // Where a W8A8 linear takes FP8 rows (qkv_takes_fp8, takes_fp8_input), the op before it makes
  // them in s.x8 instead of act-dtype rows, so no quantisation pass of its own runs.
  Tensor norm8 = s.x8.defined() ? s.rows8(d) : Tensor();
  // --- attention ---
  // Its pre-norm, unless the previous block's last op made it (prenormed: s.norm holds it, or
  // s.x8 where this block's q|k|v linear takes FP8 rows: the same test there and here).
  const bool qkv8 = prenormed && qkv_takes_fp8(blk, s, attn);
  if (!prenormed) ZI_TRY(be_.rms_norm(xr, blk.attn_norm1, eps, scale_a, s.norm));  // [B*S, D]
  // q|k|v [B*S, 3D]: per-head RMS norm of q and k (when qk_norm), then RoPE, then attention
  // [B, S, H, Dh]. Where the backend reads q, k and v inside the projection (reads_packed_qkv)
  // they stay there; otherwise (and always under sequence parallelism) they are split out. FP8
  // attention (opt-in) reads the projection too: its prologue writes q, k and v as e4m3.
  if (attn == nullptr && (blk.fp8_attention || be_.reads_packed_qkv())) {
    const int64_t h = cfg_.n_heads;
    Tensor qkv = s.qkv.view({b, sq, 3 * d});
    if (qkv8)
      ZI_TRY(linear_fp8_input(be_, norm8, s.x8_scale, blk.wqkv, none, s.qkv));
    else
      ZI_TRY(linear(be_, s.norm, blk.wqkv, none, wide_scratch_, s.qkv));
    if (blk.fp8_attention) {
      ZI_TRY(
          be_.attention_packed_fp8(qkv, h, h, blk.norm_q, blk.norm_k, kQkNormEps, freqs, ap, s.o));
    } else {
      ZI_TRY(be_.qk_norm_rope_packed(qkv, h, h, blk.norm_q, blk.norm_k, kQkNormEps, freqs));
      ZI_TRY(be_.attention_packed(qkv, h, h, ap, s.o));
    }
  } else {
    ZI_TRY(linear_qkv_norm_rope(be_, s.norm, blk.wqkv, blk.norm_q, blk.norm_k, kQkNormEps, freqs,
                                wide_scratch_, s.qkv, s.q, s.k, s.v));
    if (attn != nullptr) {
      ZI_TRY((*attn)(s.q, s.k, s.v, ap, s.o));  // sequence parallel: Ulysses
    } else {
      ZI_TRY(be_.attention(s.q, s.k, s.v, ap, s.o));
    }
  }
  ZI_TRY(linear(be_, s.o.view({rows, d}), blk.wo, none, wide_scratch_, s.proj));  // [B*S, D]
  // x += gate_a * norm(proj), then the feed-forward's pre-norm of that x: [B*S, D]
  const bool w13_8 = s.x8.defined() && takes_fp8_input(be_, blk.w13);
  if (w13_8)
    ZI_TRY(be_.residual_norm_gate_then_norm_fp8(x, s.proj.view({b, sq, d}), blk.attn_norm2, eps,
                                                gate_a, blk.ffn_norm1, scale_f, s.norm, norm8,
                                                s.x8_scale));
  else
    ZI_TRY(be_.residual_norm_gate_then_norm(x, s.proj.view({b, sq, d}), blk.attn_norm2, eps, gate_a,
                                            blk.ffn_norm1, scale_f, s.norm));
  ZI_TRY(feed_forward(blk, w13_8, s));  // s.proj [B*S, D]
  if (next == nullptr)
    return be_.residual_rms_norm_gate(x, s.proj.view({b, sq, d}), blk.ffn_norm2, eps, gate_f);
  // x += gate_f * norm(proj), then the next block's attention pre-norm of that x (its
  // modulation in the other set): one pass over x instead of two.
  const Tensor& next_scale = next->modulated ? s.mods[1 - set].scale_a : none;
  if (qkv_takes_fp8(*next, s, attn))
    return be_.residual_norm_gate_then_norm_fp8(x, s.proj.view({b, sq, d}), blk.ffn_norm2, eps,
                                                gate_f, next->attn_norm1, next_scale, s.norm, norm8,
                                                s.x8_scale);
  return be_.residual_norm_gate_then_norm(x, s.proj.view({b, sq, d}), blk.ffn_norm2, eps, gate_f,
                                          next->attn_norm1, next_scale, s.norm);
}

Status ZImageDiT::feed_forward(const Block& blk, bool in8, Scratch& s) {
  const Tensor none;
  // A w1|w3 weight in row blocks runs fused with its SwiGLU: a W8A8 one (it takes the FP8 rows
  // in8 says) as matmul_fp8_swiglu, which also makes w2's FP8 rows where w2 takes them; an
  // act-dtype one as matmul_swiglu, whose act-dtype rows w2 then takes.
  const bool fp8_blocks = in8 && blk.w13.swiglu_block > 0;
  const bool w2_8 =
      s.x8.defined() && (blk.w13.swiglu_block == 0 || fp8_blocks) && takes_fp8_input(be_, blk.w2);
  if (fp8_blocks) {
    Tensor act8 = w2_8 ? s.rows8(cfg_.ffn_hidden()) : Tensor();
    Tensor act_scale = w2_8 ? s.x8_scale : Tensor();
    ZI_TRY(be_.matmul_fp8_swiglu(s.rows8(cfg_.dim), s.x8_scale, blk.w13.w, blk.w13.scale,
                                 blk.w13.swiglu_block, s.act, act8, act_scale));
    if (w2_8) return linear_fp8_input(be_, act8, s.x8_scale, blk.w2, none, s.proj);
    return linear(be_, s.act, blk.w2, none, wide_scratch_, s.proj);
  }
  if (!in8 && !w2_8) {
    ZI_TRY(linear_swiglu(be_, s.norm, blk.w13, wide_scratch_, s.ffn, s.act));  // [B*S, F]
    return linear(be_, s.act, blk.w2, none, wide_scratch_, s.proj);            // [B*S, D]
  }
  // Through s.ffn [B*S, 2F] (w1|w3 in the files' row order: not in blocks, as checked).
  if (in8)
    ZI_TRY(linear_fp8_input(be_, s.rows8(cfg_.dim), s.x8_scale, blk.w13, none, s.ffn));
  else
    ZI_TRY(linear(be_, s.norm, blk.w13, none, wide_scratch_, s.ffn));
  if (!w2_8) {
    ZI_TRY(be_.swiglu(s.ffn, s.act));
    return linear(be_, s.act, blk.w2, none, wide_scratch_, s.proj);
  }
  Tensor act8 = s.rows8(cfg_.ffn_hidden());
  ZI_TRY(be_.swiglu_fp8(s.ffn, s.act, act8, s.x8_scale));
  return linear_fp8_input(be_, act8, s.x8_scale, blk.w2, none, s.proj);
}

Result<ZImageDiT::Layout> ZImageDiT::make_layout(int64_t b, int64_t lh, int64_t lw,
                                                 const std::vector<int64_t>& cap_len) {
  const int64_t p = cfg_.patch_size, half = cfg_.head_dim() / 2;
  // The caption part (its RoPE table on the device, and on the host for the unified one).
  Tensor cap_f;  // [B, Lp, Dh/2, 2]
  ZI_ASSIGN_OR_RETURN(Layout L, caption_layout(cap_len, &cap_f));
  L.lh = lh, L.lw = lw;
  const std::vector<int64_t>& cap_pad = L.cap_pad;
  const int64_t lp_max = L.lp_max;
  const int64_t ht = lh / p, wt = lw / p, n_img = ht * wt;
  const int64_t np = padded(n_img);
  std::vector<int64_t> seq(b);
  int64_t s_max = 0;
  for (int64_t i = 0; i < b; ++i) {
    seq[i] = np + cap_pad[i];
    s_max = std::max(s_max, seq[i]);
  }

  // ---- RoPE tables: [B, S, Dh/2, (cos, sin)] f32; batch-padding rows stay 0 ----
  Tensor img_f = Tensor::host(DType::kF32, {b, np, half, 2});     // [B, Np, Dh/2, 2]
  Tensor uni_f = Tensor::host(DType::kF32, {b, s_max, half, 2});  // [B, S, Dh/2, 2]
  if (!img_f.defined() || !uni_f.defined()) return OutOfMemory("transformer RoPE tables");
  for (int64_t i = 0; i < b; ++i) {
    float* fi = img_f.data_as<float>() + i * np * half * 2;
    const float* fc = cap_f.data_as<float>() + i * lp_max * half * 2;
    for (int64_t n = 0; n < np; ++n) {  // image token (r, s) -> (Lp + 1, r, s); pads -> 0
      const bool real = n < n_img;
      if (!rope_row(real ? cap_pad[i] + 1 : 0, real ? n / wt : 0, real ? n % wt : 0,
                    fi + n * half * 2)) {
        return InvalidArgument(
            "transformer: image of " + std::to_string(ht) + "x" + std::to_string(wt) +
            " tokens with a " + std::to_string(cap_pad[i]) +
            "-token caption exceeds the RoPE axes_lens " + std::to_string(cfg_.axes_lens[0]) + "/" +
            std::to_string(cfg_.axes_lens[1]) + "/" + std::to_string(cfg_.axes_lens[2]));
      }
    }
    float* fu = uni_f.data_as<float>() + i * s_max * half * 2;
    std::copy(fi, fi + np * half * 2, fu);
    std::copy(fc, fc + cap_pad[i] * half * 2, fu + np * half * 2);
  }
  ZI_ASSIGN_OR_RETURN(L.img_freqs, load::upload_host(be_, img_f, DType::kF32));
  ZI_ASSIGN_OR_RETURN(L.uni_freqs, load::upload_host(be_, uni_f, DType::kF32));
  L.n_img = n_img, L.np = np, L.s_max = s_max;
  L.seq = std::move(seq);
  return L;
}

Result<Tensor> ZImageDiT::patch_tokens(const Layout& L, const Tensor& latents) {
  ZI_ASSIGN_OR_RETURN(
      Tensor tokens,
      load::alloc(be_, be_.act_dtype(), {L.b, L.n_img, cfg_.token_features()}, "dit.patches"));
  ZI_TRY(be_.patchify(latents, static_cast<int>(cfg_.patch_size), tokens));  // [B, N, p*p*C]
  return tokens;
}

Result<Tensor> ZImageDiT::embed_image(const Layout& L, const Tensor& tokens) {
  const int64_t b = L.b, n_img = L.n_img, np = L.np, d = cfg_.dim, tf = cfg_.token_features();
  const DType act = be_.act_dtype();
  ZI_ASSIGN_OR_RETURN(Tensor x, load::alloc(be_, act, {b, np, d}, "dit.image_tokens"));
  // No pads: the embedding goes straight into x.
  if (np == n_img) {
    Tensor x_rows = x.view({b * np, d});                                   // [B*N, D]
    ZI_TRY(be_.matmul(tokens.view({b * n_img, tf}), x_w_, x_b_, x_rows));  // [B*N, D]
    return x;
  }
  ZI_ASSIGN_OR_RETURN(Tensor xe, load::alloc(be_, act, {b * n_img, d}, "dit.x_embed"));
  ZI_TRY(be_.matmul(tokens.view({b * n_img, tf}), x_w_, x_b_, xe));  // [B*N, D]
  for (int64_t i = 0; i < b; ++i) {
    ZI_TRY(be_.copy_2d(xe, i * n_img * d, d, x, i * np * d, d, n_img, d));         // real
    ZI_TRY(be_.copy_2d(x_pad_, 0, d, x, (i * np + n_img) * d, d, np - n_img, d));  // pads
  }
  return x;
}

Result<Tensor> ZImageDiT::unify(const Layout& L, Tensor x, Tensor cap) {
  const int64_t b = L.b, np = L.np, lp_max = L.lp_max, s_max = L.s_max, d = cfg_.dim;
  ZI_ASSIGN_OR_RETURN(Tensor u, load::alloc(be_, be_.act_dtype(), {b, s_max, d}, "dit.unified"));
  if (L.ragged) ZI_TRY(be_.fill(u, 0.0f));
  for (int64_t i = 0; i < b; ++i) {
    ZI_TRY(be_.copy_2d(x, i * np * d, d, u, i * s_max * d, d, np, d));  // image
    ZI_TRY(be_.copy_2d(cap, i * lp_max * d, d, u, (i * s_max + np) * d, d, L.cap_pad[i], d));
  }
  return u;
}

Status ZImageDiT::run_stage(const Pass& P, Stage st, Tensor& x, const Tensor& freqs,
                            const Scratch& scratch, const AttentionFn* attn) {
  const int n_noise = static_cast<int>(noise_refiner_.size());
  const int n_context = static_cast<int>(context_refiner_.size());
  int first = 0, count = n_noise;
  const char* name = "noise_refiner";
  const std::vector<int64_t>* key_len = nullptr;  // masks when the batch is ragged
  const Tensor none;
  const Tensor* c = &P.c;
  if (st == Stage::kContextRefiner) {
    first = n_noise, count = n_context, name = "context_refiner";
    key_len = &P.L.cap_pad;
    c = &none;  // unmodulated
  } else if (st == Stage::kLayers) {
    first = n_noise + n_context, count = static_cast<int>(layers_.size()), name = "layers";
    key_len = &P.L.seq;
  }
  const ControlResiduals* control = st == Stage::kLayers ? P.control : nullptr;

  Scratch s = scratch.view(x.dim(0), x.dim(1), cfg_);
  AttentionParams ap{1.0f / std::sqrt(static_cast<float>(2 * (cfg_.head_dim() / 2))), false, {}};
  if (P.L.ragged && key_len != nullptr)
    for (int64_t len : *key_len) ap.key_len.push_back(static_cast<int32_t>(len));
  // Each block's last op also makes the next block's attention pre-norm (the gated residual and
  // that norm in one pass over x), with the next block's modulation made first into the other
  // set. Not where a ControlNet hint is added between the two, nor with streamed blocks (the
  // next block's weights are acquired only when it runs).
  auto hinted = [&](int l) {
    for (size_t k = 0; control != nullptr && k < control->layers.size(); ++k)
      if (control->layers[k] == l) return true;
    return false;
  };
  Block blk, next;
  int set = 0;
  bool prenormed = false;
  for (int l = 0; l < count; ++l) {
    if (prenormed) {
      blk = std::move(next);  // acquired, modulated and pre-normed by the previous block
    } else {
      ZI_ASSIGN_OR_RETURN(blk, use_block(first + l));
      ZI_TRY(modulate_block(P, first + l, blk, *c, s, set));
    }
    const bool fuse = l + 1 < count && !streamer_ && !hinted(l);
    if (fuse) {
      ZI_ASSIGN_OR_RETURN(next, use_block(first + l + 1));
      ZI_TRY(modulate_block(P, first + l + 1, next, *c, s, 1 - set));
    }
    ZI_TRY(run_block(blk, set, prenormed, fuse ? &next : nullptr, x, freqs, ap, s,
                     attn));  // [B, S, D]
    ZI_TRY(done_block(first + l));
    for (size_t k = 0; control != nullptr && k < control->layers.size(); ++k)
      if (control->layers[k] == l) ZI_TRY(be_.add(x, control->hints[k], x));
    if (P.dbg != nullptr) debug_tensor(P.dbg, P.pfx + "." + name + "." + std::to_string(l), be_, x);
    prenormed = fuse;
    if (fuse) set = 1 - set;
  }
  return Status::Ok();
}

Result<Tensor> ZImageDiT::final_layer(const Tensor& u, const Tensor& c) {
  const int64_t b = u.dim(0), s = u.dim(1), d = cfg_.dim, tf = cfg_.token_features();
  const DType act = be_.act_dtype();
  const Tensor none;
  ZI_ASSIGN_OR_RETURN(Tensor sc, load::alloc(be_, act, {b, cfg_.adaln_dim()}, "dit.final_silu"));
  ZI_TRY(be_.silu(c, sc));  // [B, adaln]
  ZI_ASSIGN_OR_RETURN(Tensor scale, load::alloc(be_, act, {b, d}, "dit.final_scale"));
  ZI_TRY(be_.matmul(sc, final_ada_w_, final_ada_b_, scale));  // [B, D]
  ZI_TRY(be_.add(scale, ones_, scale));                       // 1 + scale
  ZI_ASSIGN_OR_RETURN(Tensor y, load::alloc(be_, act, {b * s, d}, "dit.final_norm"));
  ZI_TRY(be_.layer_norm(u.view({b * s, d}), none, none, kFinalNormEps, scale, y));  // [B*S, D]
  ZI_ASSIGN_OR_RETURN(Tensor o, load::alloc(be_, act, {b, s, tf}, "dit.final"));
  Tensor o_rows = o.view({b * s, tf});                // [B*S, p*p*C]
  ZI_TRY(be_.matmul(y, final_w_, final_b_, o_rows));  // [B*S, p*p*C]
  return o;
}

Status ZImageDiT::compute(const Layout& L, const Tensor& latents, const Tensor& sinusoid,
                          const std::vector<Tensor>& caps, const Tensor& refined, Tensor& out,
                          DebugSink* dbg, const std::string& pfx, const ControlResiduals* control) {
  // One set of activation buffers for the longest stage (Scratch::view).
  ZI_ASSIGN_OR_RETURN(
      Scratch scratch,
      Scratch::make(be_, cfg_, L.b, std::max({L.np, L.lp_max, L.s_max}), fp8_rows()));
  Pass P{L, Tensor(), dbg, pfx, control};
  ZI_TRY(timestep_embedding(sinusoid, P.c));  // [B, adaln]
  debug_tensor(dbg, pfx + ".t_emb", be_, P.c);
  ZI_TRY(modulate_all(P));  // every block's adaLN modulation, from c

  ZI_ASSIGN_OR_RETURN(Tensor tokens, patch_tokens(L, latents));  // [B, N, p*p*C]
  ZI_ASSIGN_OR_RETURN(Tensor x, embed_image(L, tokens));         // [B, Np, D]
  debug_tensor(dbg, pfx + ".x_embed", be_, x);
  ZI_TRY(run_stage(P, Stage::kNoiseRefiner, x, L.img_freqs, scratch));

  Tensor cap = refined;  // [B, Lp, D]: refine_captions' tokens, else made here
  if (!cap.defined()) {
    ZI_ASSIGN_OR_RETURN(cap, caption_tokens(P, caps, scratch));
  }

  ZI_ASSIGN_OR_RETURN(Tensor u, unify(L, std::move(x), std::move(cap)));  // [B, S, D]
  ZI_TRY(run_stage(P, Stage::kLayers, u, L.uni_freqs, scratch));

  ZI_ASSIGN_OR_RETURN(Tensor o, final_layer(u, P.c));  // [B, S, p*p*C]
  debug_tensor(dbg, pfx + ".final", be_, o);
  ZI_TRY(be_.unpatchify(o, static_cast<int>(cfg_.patch_size), 1.0f, out));  // [B, C, h, w] f32
  debug_tensor(dbg, pfx + ".out", be_, out);
  return Status::Ok();
}

Result<std::vector<int64_t>> ZImageDiT::check_inputs(const Tensor& latents,
                                                     const std::vector<float>& t_model,
                                                     const std::vector<Tensor>* caps,
                                                     const RefinedCaptions* refined, Tensor& out) {
  const int64_t p = cfg_.patch_size, ch = cfg_.in_channels;
  if (!latents.defined() || latents.rank() != 4 || latents.dtype() != DType::kF32 ||
      latents.dim(1) != ch || latents.dim(2) % p != 0 || latents.dim(3) % p != 0 ||
      latents.dim(0) < 1 || latents.dim(2) < p || latents.dim(3) < p) {
    return InvalidArgument("transformer: latents must be f32 [B, " + std::to_string(ch) +
                           ", h, w] with h, w multiples of " + std::to_string(p) + ", got " +
                           (latents.defined() ? latents.describe() : std::string("undefined")));
  }
  const int64_t b = latents.dim(0), lh = latents.dim(2), lw = latents.dim(3);
  std::vector<int64_t> cap_len;
  if (refined != nullptr) {
    if (static_cast<int64_t>(t_model.size()) != b)
      return InvalidArgument("transformer: batch " + std::to_string(b) + " but " +
                             std::to_string(t_model.size()) + " timesteps");
    ZI_TRY(check_refined(*refined, b));
    cap_len = refined->cap_len;
  } else {
    const size_t n = caps != nullptr ? caps->size() : 0;
    if (static_cast<int64_t>(t_model.size()) != b || static_cast<int64_t>(n) != b) {
      return InvalidArgument("transformer: batch " + std::to_string(b) + " but " +
                             std::to_string(t_model.size()) + " timesteps and " +
                             std::to_string(n) + " caption tensors");
    }
    ZI_ASSIGN_OR_RETURN(cap_len, check_captions(*caps));
  }
  const Shape out_shape{b, ch, lh, lw};
  if (!out.defined()) {
    ZI_ASSIGN_OR_RETURN(out, load::alloc(be_, DType::kF32, out_shape, "dit.out"));
  } else if (out.shape() != out_shape || out.dtype() != DType::kF32) {
    return InvalidArgument("transformer: out must be f32 " + shape_string(out_shape) + ", got " +
                           out.describe());
  }
  return cap_len;
}

Status ZImageDiT::alloc_graph_buffers(const Tensor& latents, const std::vector<Tensor>& caps,
                                      const Tensor& out, Graphed& g) {
  ZI_ASSIGN_OR_RETURN(g.latents, load::alloc(be_, DType::kF32, latents.shape(), "dit.graph_in"));
  ZI_ASSIGN_OR_RETURN(
      g.sinusoid, load::alloc(be_, be_.act_dtype(), {latents.dim(0), kTimeFreqDim}, "dit.graph_t"));
  for (const Tensor& c : caps) {
    ZI_ASSIGN_OR_RETURN(Tensor cc, load::alloc(be_, c.dtype(), c.shape(), "dit.graph_caption"));
    g.caps.push_back(cc);
  }
  ZI_ASSIGN_OR_RETURN(g.out, load::alloc(be_, DType::kF32, out.shape(), "dit.graph_out"));
  return Status::Ok();
}

Status ZImageDiT::forward(const Tensor& latents, const std::vector<float>& t_model,
                          const std::vector<Tensor>& caps, Tensor& out, DebugSink* dbg,
                          const std::string& pfx, const ControlResiduals* control) {
  return forward_impl(latents, t_model, &caps, nullptr, out, dbg, pfx, control);
}

Status ZImageDiT::forward_impl(const Tensor& latents, const std::vector<float>& t_model,
                               const std::vector<Tensor>* caps, const RefinedCaptions* refined,
                               Tensor& out, DebugSink* dbg, const std::string& pfx,
                               const ControlResiduals* control) {
  ZI_ASSIGN_OR_RETURN(const std::vector<int64_t> cap_len,
                      check_inputs(latents, t_model, caps, refined, out));
  ZI_TRY(skip_streamed_context(refined != nullptr));
  static const std::vector<Tensor> kNoCaptions;
  const std::vector<Tensor>& cap_list = caps != nullptr ? *caps : kNoCaptions;
  const Tensor& tokens = refined != nullptr ? refined->tokens : Tensor();
  const int64_t b = latents.dim(0), lh = latents.dim(2), lw = latents.dim(3);
  if (control != nullptr) ZI_TRY(check_control(*control, b, lh, lw, cap_len));
  Tensor sin_host = timestep_sinusoid(t_model);  // [B, 256] f32
  if (!sin_host.defined()) return OutOfMemory("timestep sinusoid");

  // Eager: tables and every op queued now (debug dumps need this; so do backends that cannot
  // record).
  auto run_eagerly = [&]() -> Status {
    ZI_ASSIGN_OR_RETURN(Layout lay, make_layout(b, lh, lw, cap_len));
    ZI_ASSIGN_OR_RETURN(Tensor sinusoid, load::upload_host(be_, sin_host, be_.act_dtype()));
    ZI_TRY(compute(lay, latents, sinusoid, cap_list, tokens, out, dbg, pfx, control));
    if (refined == nullptr) ++caption_refinements_;
    return Status::Ok();
  };
  // Streamed weights: eager too (the copies and their events run beside the compute stream; at
  // the link's speed the launch overhead a graph saves is noise).
  if (!use_graphs_ || dbg != nullptr || no_graphs_ || streamer_) return run_eagerly();

  // Recorded (CUDA graphs): per input shape, the tables, input and output buffers stay on the
  // device and the forward is recorded once; each call copies its inputs in, replays, copies out.
  std::vector<int64_t> key{b, lh, lw};
  key.insert(key.end(), cap_len.begin(), cap_len.end());
  if (refined != nullptr) key.push_back(-2);  // reads caption tokens: its own recording
  if (control != nullptr) {  // with control: its own recording, keyed by the layers it feeds
    key.push_back(-1);
    key.insert(key.end(), control->layers.begin(), control->layers.end());
  }
  auto it = graphs_.find(key);
  if (it == graphs_.end()) {
    if (graphs_.size() >= max_graphs_) graphs_.clear();  // bounded: shapes seen recently
    Graphed g;
    ZI_ASSIGN_OR_RETURN(g.layout, make_layout(b, lh, lw, cap_len));
    ZI_TRY(alloc_graph_buffers(latents, cap_list, out, g));
    if (refined != nullptr) {
      ZI_ASSIGN_OR_RETURN(
          g.refined, load::alloc(be_, tokens.dtype(), tokens.shape(), "dit.graph_caption_tokens"));
    }
    if (control != nullptr) {
      g.control.layers = control->layers;
      for (const Tensor& h : control->hints) {
        ZI_ASSIGN_OR_RETURN(Tensor hh, load::alloc(be_, h.dtype(), h.shape(), "dit.graph_hint"));
        g.control.hints.push_back(hh);
      }
    }
    it = graphs_.emplace(key, std::move(g)).first;
  }
  Graphed& g = it->second;
  ZI_TRY(be_.convert(latents, g.latents));
  for (size_t i = 0; i < cap_list.size(); ++i) ZI_TRY(be_.convert(cap_list[i], g.caps[i]));
  if (refined != nullptr) ZI_TRY(be_.convert(tokens, g.refined));
  for (size_t k = 0; control != nullptr && k < control->hints.size(); ++k)
    ZI_TRY(be_.convert(control->hints[k], g.control.hints[k]));
  {
    ZI_ASSIGN_OR_RETURN(Tensor sinusoid, load::upload_host(be_, sin_host, be_.act_dtype()));
    ZI_TRY(be_.convert(sinusoid, g.sinusoid));
  }
  // The call that records has its results from the recording's warm-up run (Backend::record):
  // replaying too would compute the forward a second time.
  bool recorded_now = false;
  if (!g.work) {
    const ControlResiduals* gc = control != nullptr ? &g.control : nullptr;
    auto rec = be_.record([&] {
      return compute(g.layout, g.latents, g.sinusoid, g.caps, g.refined, g.out, nullptr, pfx, gc);
    });
    if (!rec.ok()) {
      if (rec.status().code() != ErrorCode::kUnsupported) return rec.status();
      ZI_DEBUG("transformer: forwards run eagerly (%s)", rec.status().message().c_str());
      no_graphs_ = true;  // this backend cannot record: from now on, eagerly
      graphs_.clear();
      return run_eagerly();
    }
    g.work = std::move(*rec);
    recorded_now = true;
  }
  if (!recorded_now) ZI_TRY(g.work->replay());
  if (refined == nullptr) ++caption_refinements_;
  return be_.convert(g.out, out);
}

Status ZImageDiT::check_control(const ControlResiduals& control, int64_t b, int64_t lh, int64_t lw,
                                const std::vector<int64_t>& cap_len) const {
  const int64_t p = cfg_.patch_size;
  const int64_t np = padded((lh / p) * (lw / p));
  int64_t s_max = 0;
  for (int64_t len : cap_len) s_max = std::max(s_max, np + padded(len));
  const Shape want{b, s_max, cfg_.dim};
  if (control.layers.size() != control.hints.size())
    return InvalidArgument(
        "transformer: control residuals: " + std::to_string(control.layers.size()) +
        " layers but " + std::to_string(control.hints.size()) + " hints");
  for (size_t k = 0; k < control.hints.size(); ++k) {
    const Tensor& h = control.hints[k];
    if (control.layers[k] < 0 || control.layers[k] >= cfg_.n_layers)
      return InvalidArgument("transformer: control residual for layer " +
                             std::to_string(control.layers[k]) + " of a " +
                             std::to_string(cfg_.n_layers) + "-layer transformer");
    if (!h.defined() || h.shape() != want || h.dtype() != be_.act_dtype())
      return InvalidArgument("transformer: control residual " + std::to_string(k) + " must be " +
                             shape_string(want) + " in the act dtype, got " +
                             (h.defined() ? h.describe() : std::string("undefined")));
  }
  return Status::Ok();
}

}  // namespace zimage
