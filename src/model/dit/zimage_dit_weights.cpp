// ZImageDiT: config validation, weight binding (diffusers and ComfyUI single-file names) and the
// host-side RoPE tables. Weights are fused on the host before upload: to_q|to_k|to_v -> [3D, D]
// and w1|w3 -> [2F, D] (gate rows first, as Backend::swiglu expects).
#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/log.h"
#include "model/common/load_util.h"
#include "model/dit/zimage_dit.h"

namespace zimage {

namespace {

Status validate(const TransformerConfig& c) {
  auto bad = [](const std::string& m) { return InvalidArgument("transformer config: " + m); };
  if (c.patch_size < 1 || c.in_channels < 1 || c.dim < 1 || c.n_heads < 1 || c.cap_feat_dim < 1)
    return bad("patch_size, in_channels, dim, n_heads and cap_feat_dim must be positive");
  if (c.f_patch_size != 1)
    return Unsupported("transformer config: f_patch_size " + std::to_string(c.f_patch_size) +
                       " (only 1 is supported for images)");
  if (c.dim % c.n_heads != 0)
    return bad("dim " + std::to_string(c.dim) + " is not a multiple of n_heads " +
               std::to_string(c.n_heads));
  if (c.n_layers < 0 || c.n_refiner_layers < 0) return bad("negative layer count");
  if (c.axes_dims.size() != 3 || c.axes_lens.size() != 3)
    return bad("axes_dims and axes_lens must have 3 entries");
  int sum = 0;
  for (size_t a = 0; a < 3; ++a) {
    if (c.axes_dims[a] <= 0 || c.axes_dims[a] % 2 != 0 || c.axes_lens[a] <= 0)
      return bad("axes_dims must be positive and even, axes_lens positive");
    sum += c.axes_dims[a];
  }
  if (sum != c.head_dim())
    return bad("sum(axes_dims) = " + std::to_string(sum) + " != head_dim " +
               std::to_string(c.head_dim()));
  if (!(c.rope_theta > 0) || !(c.norm_eps > 0)) return bad("rope_theta and norm_eps must be > 0");
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<ZImageDiT>> ZImageDiT::load(const TransformerConfig& cfg,
                                                   const WeightStore& ws, Backend& be,
                                                   const WeightPlacement& placement) {
  ZI_TRY(validate(cfg));
  if (placement.fp8_compute & kFp8AllLinears) {
    // Fail at load, not at the first image, where the backend has no FP8 GEMM (the CPU oracle
    // has one; the CUDA backend needs sm_89 or newer).
    ZI_ASSIGN_OR_RETURN(Tensor x, load::alloc(be, be.act_dtype(), {1, 16}, "FP8 probe"));
    ZI_ASSIGN_OR_RETURN(Tensor w8, load::alloc(be, DType::kF8E4M3, {16, 16}, "FP8 probe"));
    ZI_ASSIGN_OR_RETURN(Tensor ws8, load::alloc(be, DType::kF32, {16}, "FP8 probe"));
    ZI_ASSIGN_OR_RETURN(Tensor y, load::alloc(be, be.act_dtype(), {1, 16}, "FP8 probe"));
    ZI_TRY(be.fill(x, 1.0f));
    ZI_ASSIGN_OR_RETURN(Tensor w, load::alloc(be, be.act_dtype(), {16, 16}, "FP8 probe"));
    ZI_TRY(be.fill(w, 1.0f));
    ZI_TRY(be.quantize_fp8_rows(w, w8, ws8));
    Status st = be.matmul_fp8_rows(x, w8, ws8, Tensor(), y);
    if (st.ok()) st = be.synchronize();
    if (!st.ok()) return st.with_context("precision fp8");
  }
  std::unique_ptr<ZImageDiT> m(new ZImageDiT(cfg, be));
  m->placement_ = placement;
  Status st = m->load_weights(ws);
  if (st.ok()) st = m->apply_placement(placement);
  if (!st.ok()) return st.with_context("loading transformer");
  m->build_rope_tables();
  return m;
}

Result<Tensor> ZImageDiT::load_pad_block(const WeightStore& ws, const std::string& name) {
  const int64_t d = cfg_.dim;
  // Stored [1, D] (diffusers, ComfyUI) or [D] (stable-diffusion.cpp).
  ZI_ASSIGN_OR_RETURN(WeightInfo probe, ws.info(name));
  const Shape shape = probe.shape.size() == 1 ? Shape{d} : Shape{1, d};
  ZI_ASSIGN_OR_RETURN(Tensor tok, load::host_f32(ws, name, shape));  // [1, D] or [D]
  Tensor block = Tensor::host(DType::kF32, {kSeqMultiple, d});       // [32, D]
  if (!block.defined()) return OutOfMemory("pad block for " + name);
  for (int64_t r = 0; r < kSeqMultiple; ++r)
    std::copy(tok.data_as<float>(), tok.data_as<float>() + d, block.data_as<float>() + r * d);
  return load::upload_host(be_, block, be_.act_dtype());
}

namespace {

// The stored tensors behind a block's big linears under prefix p: q|k|v, out, w1|w3, w2.
std::vector<std::vector<LinearPart>> block_linear_parts(const TransformerConfig& c,
                                                        const WeightStore& ws,
                                                        const std::string& p) {
  const int64_t d = c.dim, f = c.ffn_hidden();
  std::vector<std::vector<LinearPart>> g;
  if (ws.contains(p + "attention.qkv.weight"))  // ComfyUI: rows [q; k; v]
    g.push_back({{p + "attention.qkv.weight", {3 * d, d}}});
  else
    g.push_back({{p + "attention.to_q.weight", {d, d}},
                 {p + "attention.to_k.weight", {d, d}},
                 {p + "attention.to_v.weight", {d, d}}});
  const bool comfy_out = ws.contains(p + "attention.out.weight");
  g.push_back({{p + (comfy_out ? "attention.out.weight" : "attention.to_out.0.weight"), {d, d}}});
  g.push_back({{p + "feed_forward.w1.weight", {f, d}}, {p + "feed_forward.w3.weight", {f, d}}});
  g.push_back({{p + "feed_forward.w2.weight", {d, f}}});
  return g;
}

std::string dit_prefix(const WeightStore& ws) {
  std::string pre;
  for (const char* cand : {"model.diffusion_model.", "diffusion_model."})
    if (ws.contains(std::string(cand) + "x_pad_token")) pre = cand;
  return pre;
}

}  // namespace

Status ZImageDiT::load_block(const WeightStore& ws, const std::string& p, bool modulated, int index,
                             Block& b) {
  const int64_t d = cfg_.dim, dh = cfg_.head_dim();
  b.modulated = modulated;
  // A streamed block's tensors that the files hold as the backend streams them (all but the
  // linears this placement turns into FP8 rows on the device) are taken from the files (views or
  // host copies) without the trip through the device the rest of the block takes (loaded here,
  // then moved to the host by place_block).
  BlockSources sources(ws, be_, placement_, index);
  auto tensor = [&](const std::string& name, const Shape& shape, Tensor& dst) {
    return sources.tensor(name, shape, dst);
  };
  const auto groups = block_linear_parts(cfg_, ws, p);
  const char* names[] = {"attention.qkv", "attention.out", "feed_forward.w13", "feed_forward.w2"};
  const unsigned fp8_bits[] = {kFp8Qkv, kFp8Out, kFp8W13, kFp8W2};
  const bool refiner = index < 2 * cfg_.n_refiner_layers;
  const unsigned fp8 = placement_.fp8_compute;
  std::vector<LinearWeight*> dst = b.linears();
  for (size_t i = 0; i < groups.size(); ++i) {
    const bool fp8_here =
        placement_.fp8_weights || ((fp8 & fp8_bits[i]) && (!refiner || (fp8 & kFp8Refiners)));
    bool streams = false;
    if (!fp8_here) {
      ZI_ASSIGN_OR_RETURN(streams, sources.take(groups[i], dst[i]->w));
    }
    if (streams) continue;
    ZI_ASSIGN_OR_RETURN(
        *dst[i], load_linear(ws, be_, groups[i], p + names[i], placement_.keep_quantized, &kept_));
  }
  if (cfg_.qk_norm) {
    const bool comfy_norm = ws.contains(p + "attention.q_norm.weight");
    ZI_TRY(tensor(p + (comfy_norm ? "attention.q_norm.weight" : "attention.norm_q.weight"), {dh},
                  b.norm_q));
    ZI_TRY(tensor(p + (comfy_norm ? "attention.k_norm.weight" : "attention.norm_k.weight"), {dh},
                  b.norm_k));
  }
  ZI_TRY(tensor(p + "attention_norm1.weight", {d}, b.attn_norm1));
  ZI_TRY(tensor(p + "attention_norm2.weight", {d}, b.attn_norm2));
  ZI_TRY(tensor(p + "ffn_norm1.weight", {d}, b.ffn_norm1));
  ZI_TRY(tensor(p + "ffn_norm2.weight", {d}, b.ffn_norm2));
  if (modulated) {
    const int64_t ad = cfg_.adaln_dim();
    ZI_TRY(tensor(p + "adaLN_modulation.0.weight", {4 * d, ad}, b.adaln_w));
    ZI_TRY(tensor(p + "adaLN_modulation.0.bias", {4 * d}, b.adaln_b));
  }
  if (sources.streamed()) {
    // Positions as Block::tensors() lists them; the loaded ones are filled in by place_block.
    if (block_sources_.size() <= static_cast<size_t>(index)) block_sources_.resize(index + 1);
    block_sources_[index] = sources.unit(b.tensors());
  }
  return Status::Ok();
}

Status ZImageDiT::load_weights(const WeightStore& ws) {
  const int64_t d = cfg_.dim, ad = cfg_.adaln_dim(), tf = cfg_.token_features();
  const int64_t fc = cfg_.cap_feat_dim;
  const std::string pre = dit_prefix(ws);
  const bool comfy = ws.contains(pre + "x_embedder.weight");
  const std::string key = std::to_string(cfg_.patch_size) + "-" + std::to_string(cfg_.f_patch_size);
  const std::string xe = pre + (comfy ? "x_embedder." : "all_x_embedder." + key + ".");
  const std::string fl = pre + (comfy ? "final_layer." : "all_final_layer." + key + ".");

  ZI_ASSIGN_OR_RETURN(
      t_w1_, load::weight(ws, be_, pre + "t_embedder.mlp.0.weight", {kTimeMidDim, kTimeFreqDim}));
  ZI_ASSIGN_OR_RETURN(t_b1_, load::weight(ws, be_, pre + "t_embedder.mlp.0.bias", {kTimeMidDim}));
  ZI_ASSIGN_OR_RETURN(t_w2_,
                      load::weight(ws, be_, pre + "t_embedder.mlp.2.weight", {ad, kTimeMidDim}));
  ZI_ASSIGN_OR_RETURN(t_b2_, load::weight(ws, be_, pre + "t_embedder.mlp.2.bias", {ad}));
  ZI_ASSIGN_OR_RETURN(x_w_, load::weight(ws, be_, xe + "weight", {d, tf}));
  ZI_ASSIGN_OR_RETURN(x_b_, load::weight(ws, be_, xe + "bias", {d}));
  ZI_ASSIGN_OR_RETURN(cap_norm_, load::weight(ws, be_, pre + "cap_embedder.0.weight", {fc}));
  ZI_ASSIGN_OR_RETURN(cap_w_, load::weight(ws, be_, pre + "cap_embedder.1.weight", {d, fc}));
  ZI_ASSIGN_OR_RETURN(cap_b_, load::weight(ws, be_, pre + "cap_embedder.1.bias", {d}));
  ZI_ASSIGN_OR_RETURN(x_pad_, load_pad_block(ws, pre + "x_pad_token"));
  ZI_ASSIGN_OR_RETURN(cap_pad_, load_pad_block(ws, pre + "cap_pad_token"));
  ZI_ASSIGN_OR_RETURN(final_ada_w_,
                      load::weight(ws, be_, fl + "adaLN_modulation.1.weight", {d, ad}));
  ZI_ASSIGN_OR_RETURN(final_ada_b_, load::weight(ws, be_, fl + "adaLN_modulation.1.bias", {d}));
  ZI_ASSIGN_OR_RETURN(final_w_, load::weight(ws, be_, fl + "linear.weight", {tf, d}));
  ZI_ASSIGN_OR_RETURN(final_b_, load::weight(ws, be_, fl + "linear.bias", {tf}));

  auto blocks = [&](const std::string& name, int n, bool modulated, std::vector<Block>& out) {
    out.resize(n);
    for (int i = 0; i < n; ++i) {
      ZI_TRY(load_block(ws, pre + name + "." + std::to_string(i) + ".", modulated, loaded_blocks_,
                        out[i]));
      ZI_TRY(place_block(out[i], loaded_blocks_++));
    }
    return Status::Ok();
  };
  ZI_TRY(blocks("noise_refiner", cfg_.n_refiner_layers, true, noise_refiner_));
  ZI_TRY(blocks("context_refiner", cfg_.n_refiner_layers, false, context_refiner_));
  ZI_TRY(blocks("layers", cfg_.n_layers, true, layers_));

  Tensor ones = Tensor::host(DType::kF32, {d});  // [D]
  if (!ones.defined()) return OutOfMemory("transformer ones vector");
  std::fill(ones.data_as<float>(), ones.data_as<float>() + d, 1.0f);
  ZI_ASSIGN_OR_RETURN(ones_, load::upload_host(be_, ones, be_.act_dtype()));

  // Lumina-2's leftover final norm is present in some single-file checkpoints and unused.
  return load::check_all_used(ws, "transformer",
                              [&](const std::string& n) { return n == pre + "norm_final.weight"; });
}

int64_t ZImageDiT::block_weight_bytes(const TransformerConfig& c, DType act, bool fp8_weights) {
  const int64_t d = c.dim, f = c.ffn_hidden(), dh = c.head_dim(), es = dtype_size(act);
  // Big linears: q|k|v [3D, D], out [D, D], w1|w3 [2F, D], w2 [D, F]; FP8 adds a scale per row.
  const int64_t linear_elems = 3 * d * d + d * d + 2 * f * d + d * f;
  const int64_t linear_rows = 3 * d + d + 2 * f + d;
  const int64_t linear = fp8_weights ? linear_elems + 4 * linear_rows : linear_elems * es;
  const int64_t small = (4 * d * c.adaln_dim() + 4 * d + 4 * d + 2 * dh) * es;
  return linear + small;
}

int64_t ZImageDiT::stored_block_weight_bytes(const TransformerConfig& c, const WeightStore& ws,
                                             DType act, const WeightPlacement& placement) {
  const int64_t d = c.dim, f = c.ffn_hidden(), es = dtype_size(act);
  const int64_t wide = block_weight_bytes(c, act, placement.fp8_weights);
  const int64_t linear_elems = 3 * d * d + d * d + 2 * f * d + d * f;
  const int64_t linear_rows = 3 * d + d + 2 * f + d;
  const int64_t linear_wide =
      placement.fp8_weights ? linear_elems + 4 * linear_rows : linear_elems * es;
  const std::string pre = dit_prefix(ws);
  int64_t worst = 0;
  bool any = false;
  auto scan = [&](const std::string& name, int n) {
    for (int i = 0; i < n; ++i) {
      int64_t bytes = 0;
      for (const auto& g : block_linear_parts(c, ws, pre + name + "." + std::to_string(i) + ".")) {
        const KeptForm kf = kept_form(ws, g, act, placement.keep_quantized);
        if (kf.kind == KeptForm::kWide) {  // as block_weight_bytes counts it
          int64_t rows = 0;
          for (const LinearPart& lp : g) rows += lp.shape[0];
          const int64_t e = rows * g[0].shape[1];
          bytes += placement.fp8_weights ? e + 4 * rows : e * es;
        } else {
          bytes += static_cast<int64_t>(kf.device_bytes);
        }
      }
      worst = std::max(worst, bytes);
      any = true;
    }
  };
  scan("noise_refiner", c.n_refiner_layers);
  scan("context_refiner", c.n_refiner_layers);
  scan("layers", c.n_layers);
  return any ? wide - linear_wide + std::min(worst, linear_wide) : wide;
}

Status ZImageDiT::place_block(Block& b, int index) {
  const std::string what = "transformer block " + std::to_string(index);
  if (placement_.fp8_weights) {
    for (LinearWeight* w : {&b.wqkv, &b.wo, &b.w13, &b.w2}) ZI_TRY(to_fp8_rows(be_, *w, what));
  }
  // W8A8 (--precision fp8): the chosen linears as FP8 rows multiplied in FP8. Blocks load in
  // execution order: noise refiners, context refiners, then the main layers.
  const unsigned fp8 = placement_.fp8_compute;
  const bool refiner = index < 2 * cfg_.n_refiner_layers;
  // FP8 attention (opt-in), in the same layers as the FP8 linears; its q and k scales come from
  // the qk norm weights.
  b.fp8_attention = (fp8 & kFp8Sdpa) && (!refiner || (fp8 & kFp8Refiners));
  if (b.fp8_attention) {
    if (!b.norm_q.defined())
      return InvalidArgument(what + ": FP8 attention (sdpa) needs the q/k norms (qk_norm)");
    ZI_TRY(be_.fp8_attention_support().with_context("--fp8-layers sdpa"));
  }
  if ((fp8 & kFp8AllLinears) && (!refiner || (fp8 & kFp8Refiners))) {
    const std::pair<unsigned, LinearWeight*> linears[] = {
        {kFp8Qkv, &b.wqkv}, {kFp8Out, &b.wo}, {kFp8W13, &b.w13}, {kFp8W2, &b.w2}};
    for (const auto& [bit, w] : linears) {
      if (!(fp8 & bit)) continue;
      ZI_TRY(to_fp8_compute(be_, *w, what));
    }
  }
  const bool streamed =
      index < static_cast<int>(placement_.streamed.size()) && placement_.streamed[index];
  if (!streamed) return block_ffn_weight(b);
  // What load_block loaded (everything not read from the files) becomes a host copy.
  ZI_TRY(move_to_host(be_, b.tensors(), !placement_.is_pageable(index)));
  std::vector<StreamSource>& u = block_sources_.at(index);
  const std::vector<Tensor*> ts = b.tensors();
  for (size_t k = 0; k < ts.size(); ++k)
    if (!u[k].defined()) u[k] = StreamSource::of(*ts[k]);
  return Status::Ok();
}

Status ZImageDiT::block_ffn_weight(Block& b) {
  LinearWeight& w = b.w13;
  if (w.swiglu_block > 0 || w.lora || !w.w.defined() || w.w.device() != be_.device())
    return Status::Ok();
  // A W8A8 w1|w3 that takes FP8 rows (no LoRA side) in the blocks of the backend's fused FP8
  // GEMM; an act-dtype one in those of its fused bf16 GEMM; anything else stays as loaded.
  int64_t block = 0;
  if (takes_fp8_input(be_, w) && !w.packed())
    block = be_.fp8_swiglu_block(w.rows() / 2, w.cols());
  else if (!w.quantized() && w.w.dtype() == be_.act_dtype())
    block = be_.swiglu_block(w.rows() / 2, w.cols());
  return block > 0 ? set_swiglu_block(be_, w, block) : Status::Ok();
}

Status ZImageDiT::block_ffn_weights() {
  bool changed = false;
  for (int i = 0; i < num_blocks(); ++i) {
    const bool streamed = !unit_of_block_.empty() && unit_of_block_[i] >= 0;
    Block& b = block_at(i);
    if (streamed || b.w13.swiglu_block > 0) continue;
    ZI_TRY(block_ffn_weight(b));
    changed = changed || b.w13.swiglu_block > 0;
  }
  if (changed) release_graphs();
  return Status::Ok();
}

Status ZImageDiT::apply_placement(const WeightPlacement& placement) {
  const int n = num_blocks();
  if (!placement.streamed.empty() && static_cast<int>(placement.streamed.size()) != n)
    return InternalError("weight placement for " + std::to_string(placement.streamed.size()) +
                         " blocks, the transformer has " + std::to_string(n));
  unit_of_block_.assign(n, -1);
  std::vector<std::vector<StreamSource>> units;
  for (int i = 0; i < n; ++i) {
    if (placement.streamed.empty() || !placement.streamed[i]) continue;
    if (static_cast<size_t>(i) >= block_sources_.size())
      return InternalError("transformer block " + std::to_string(i) + " has no stream sources");
    unit_of_block_[i] = static_cast<int>(units.size());
    units.push_back(std::move(block_sources_[i]));
  }
  block_sources_.clear();
  if (!units.empty()) {
    ZI_ASSIGN_OR_RETURN(streamer_, WeightStreamer::create(be_, std::move(units),
                                                          placement.first_slot, placement.slots));
    report_and_lock_files(*streamer_, placement, unit_of_block_, "transformer", "blocks");
    streamer_->prepare_staging();
  }
  if (placement.fp8_weights || kept_.kept > 0) {  // the widest weight: w1|w3 [2F, D]
    const int64_t elems =
        std::max<int64_t>(2 * cfg_.ffn_hidden() * cfg_.dim, 3 * cfg_.dim * cfg_.dim);
    ZI_ASSIGN_OR_RETURN(wide_scratch_,
                        load::alloc(be_, be_.act_dtype(), {elems}, "FP8 weight scratch"));
  }
  return be_.synchronize();
}

ZImageDiT::Block& ZImageDiT::block_at(int index) {
  const int nr = static_cast<int>(noise_refiner_.size());
  const int nc = static_cast<int>(context_refiner_.size());
  if (index < nr) return noise_refiner_[index];
  if (index < nr + nc) return context_refiner_[index - nr];
  return layers_[index - nr - nc];
}

Result<ZImageDiT::Block> ZImageDiT::use_block(int index) {
  Block& b = block_at(index);
  const int unit = unit_of_block_.empty() ? -1 : unit_of_block_[index];
  if (unit < 0) return b;
  ZI_ASSIGN_OR_RETURN(std::vector<Tensor> dev, streamer_->acquire(unit));
  Block view = b;  // flags; every tensor replaced by its slot view
  std::vector<Tensor*> dst = view.tensors();
  for (size_t i = 0; i < dst.size(); ++i) *dst[i] = dev[i];
  return view;
}

Status ZImageDiT::done_block(int index) {
  const int unit = unit_of_block_.empty() ? -1 : unit_of_block_[index];
  // While refine_captions runs the context refiner out of the passes' order, its releases queue
  // nothing: the next pass's first blocks are the ones to copy next, not those after it.
  return unit < 0 ? Status::Ok() : streamer_->release(unit, !refining_);
}

void ZImageDiT::build_rope_tables() {
  rope_cos_.assign(3, {});
  rope_sin_.assign(3, {});
  for (int a = 0; a < 3; ++a) {
    const int half = cfg_.axes_dims[a] / 2;
    const int len = cfg_.axes_lens[a];
    rope_cos_[a].resize(static_cast<size_t>(len) * half);
    rope_sin_[a].resize(static_cast<size_t>(len) * half);
    for (int k = 0; k < half; ++k) {
      // omega in float64, outer product in float64, then cast to float32 (spec §4.5).
      const double omega =
          1.0 / std::pow(static_cast<double>(cfg_.rope_theta),
                         static_cast<double>(2 * k) / static_cast<double>(cfg_.axes_dims[a]));
      for (int p = 0; p < len; ++p) {
        const float phi = static_cast<float>(static_cast<double>(p) * omega);
        rope_cos_[a][static_cast<size_t>(p) * half + k] =
            static_cast<float>(std::cos(static_cast<double>(phi)));
        rope_sin_[a][static_cast<size_t>(p) * half + k] =
            static_cast<float>(std::sin(static_cast<double>(phi)));
      }
    }
  }
}

int64_t ZImageDiT::max_caption_tokens() const {
  // Caption tokens sit at positions 1..Lp (Lp = L rounded up to kSeqMultiple), image tokens at
  // Lp + 1; every position must be < axes_lens[0].
  const int64_t max_padded = (cfg_.axes_lens.empty() ? 0 : cfg_.axes_lens[0]) - 2;
  return std::max<int64_t>(0, max_padded / kSeqMultiple * kSeqMultiple);
}

bool ZImageDiT::rope_row(int64_t p0, int64_t p1, int64_t p2, float* dst) const {
  const int64_t pos[3] = {p0, p1, p2};
  for (int a = 0; a < 3; ++a) {
    if (pos[a] < 0 || pos[a] >= cfg_.axes_lens[a]) return false;
    const int half = cfg_.axes_dims[a] / 2;
    const float* c = rope_cos_[a].data() + pos[a] * half;
    const float* s = rope_sin_[a].data() + pos[a] * half;
    for (int k = 0; k < half; ++k) {
      *dst++ = c[k];
      *dst++ = s[k];
    }
  }
  return true;
}

}  // namespace zimage
