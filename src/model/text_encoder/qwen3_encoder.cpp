// Qwen3 decoder stack, written against Backend only (CPU fp32 oracle, CUDA bf16). Per layer
// (spec §3.4, no biases):
//   a = RMSNorm_in(x); q,k,v = a·Wqkv; q,k = RMSNorm per head; q,k = RoPE (rotate-half);
//   x += o_proj(softmax(q kᵀ/√Dh + causal/pad mask) v)   (GQA: q head h uses kv head h/(Hq/Hkv))
//   x += down(silu(gate(RMSNorm_post(x))) ⊙ up(RMSNorm_post(x)))
#include "model/text_encoder/qwen3_encoder.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <string>

#include "core/dtype.h"
#include "core/log.h"
#include "model/common/load_util.h"

namespace zimage {

namespace {

Status validate(const TextEncoderConfig& c) {
  auto bad = [](const std::string& m) { return InvalidArgument("text encoder config: " + m); };
  if (c.hidden_size <= 0 || c.intermediate_size <= 0 || c.head_dim <= 0 || c.vocab_size <= 0)
    return bad("hidden_size, intermediate_size, head_dim and vocab_size must be positive");
  if (c.head_dim % 2 != 0) return bad("head_dim " + std::to_string(c.head_dim) + " must be even");
  if (c.num_attention_heads <= 0 || c.num_key_value_heads <= 0 ||
      c.num_attention_heads % c.num_key_value_heads != 0) {
    return bad("num_attention_heads " + std::to_string(c.num_attention_heads) +
               " must be a positive multiple of num_key_value_heads " +
               std::to_string(c.num_key_value_heads));
  }
  if (c.num_hidden_layers < 1) return bad("num_hidden_layers must be >= 1");
  if (!(c.rope_theta > 0)) return bad("rope_theta must be positive");
  if (c.attention_bias) return Unsupported("text encoder config: attention_bias true");
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<Qwen3Encoder>> Qwen3Encoder::load(const TextEncoderConfig& cfg,
                                                         const WeightStore& ws, Backend& be,
                                                         const WeightPlacement& placement) {
  ZI_TRY(validate(cfg));
  std::unique_ptr<Qwen3Encoder> m(new Qwen3Encoder(cfg, be));
  m->placement_ = placement;
  Status st = m->load_weights(ws);
  if (st.ok()) st = m->apply_placement();
  if (!st.ok()) return st.with_context("loading text encoder");
  // inv_freq_j = 1 / theta^(2j / Dh) in float32 (transformers keeps this buffer in fp32).
  const int half = cfg.head_dim / 2;
  m->inv_freq_.resize(half);
  for (int j = 0; j < half; ++j) {
    const float e = static_cast<float>(2 * j) / static_cast<float>(cfg.head_dim);
    const float p = static_cast<float>(
        std::pow(static_cast<double>(static_cast<float>(cfg.rope_theta)), static_cast<double>(e)));
    m->inv_freq_[j] = 1.0f / p;
  }
  return m;
}

namespace {

// The stored tensors behind a layer's big linears under prefix p: q|k|v, o, gate|up, down.
std::vector<std::vector<LinearPart>> layer_linear_parts(const TextEncoderConfig& c,
                                                        const std::string& p) {
  const int64_t hd = c.hidden_size, dh = c.head_dim, ff = c.intermediate_size;
  const int64_t hq = c.num_attention_heads, hkv = c.num_key_value_heads;
  return {{{p + "self_attn.q_proj.weight", {hq * dh, hd}},
           {p + "self_attn.k_proj.weight", {hkv * dh, hd}},
           {p + "self_attn.v_proj.weight", {hkv * dh, hd}}},
          {{p + "self_attn.o_proj.weight", {hd, hq * dh}}},
          {{p + "mlp.gate_proj.weight", {ff, hd}}, {p + "mlp.up_proj.weight", {ff, hd}}},
          {{p + "mlp.down_proj.weight", {hd, ff}}}};
}

}  // namespace

int64_t Qwen3Encoder::stored_layer_weight_bytes(const TextEncoderConfig& c, const WeightStore& ws,
                                                DType act, const WeightPlacement& placement) {
  const std::string pre = ws.contains("model.embed_tokens.weight") ? "model." : "";
  const int64_t es = dtype_size(act);
  int64_t worst = -1;
  int64_t linear_wide = 0;
  for (int i = 0; i + 1 < c.num_hidden_layers; ++i) {
    int64_t bytes = 0;
    linear_wide = 0;
    for (const auto& g : layer_linear_parts(c, pre + "layers." + std::to_string(i) + ".")) {
      int64_t rows = 0;
      for (const LinearPart& lp : g) rows += lp.shape[0];
      const int64_t e = rows * g[0].shape[1];
      const int64_t wide = placement.fp8_weights ? e + 4 * rows : e * es;
      linear_wide += wide;
      const KeptForm kf = kept_form(ws, g, act, placement.keep_quantized);
      bytes += kf.kind == KeptForm::kWide ? wide : static_cast<int64_t>(kf.device_bytes);
    }
    worst = std::max(worst, bytes);
  }
  const int64_t all = layer_weight_bytes(c, act, placement.fp8_weights);
  return worst < 0 ? all : all - linear_wide + std::min(worst, linear_wide);
}

Status Qwen3Encoder::load_weights(const WeightStore& ws) {
  const std::string pre = ws.contains("model.embed_tokens.weight") ? "model." : "";
  const int64_t hd = cfg_.hidden_size, dh = cfg_.head_dim;
  if (be_.device() == Device::kCPU) {
    ZI_ASSIGN_OR_RETURN(embed_, load::weight(ws, be_, pre + "embed_tokens.weight",
                                             {cfg_.vocab_size, hd}));  // [vocab, hidden]
  } else {
    // On a GPU the table (0.73 GiB for Qwen3-4B in bf16) stays in host memory: a prompt needs
    // a few hundred of its 151936 rows, gathered on the host and uploaded (encode). An owned
    // copy, not a view of the mapped file, so a file replaced under a running server cannot
    // fault the process. Copied on the backend's copy threads: one thread took ~0.4 s for the
    // 0.73 GiB (page faults on both sides, ~2 GB/s), at the head of every load.
    ZI_ASSIGN_OR_RETURN(Tensor view, load::host_view(ws, pre + "embed_tokens.weight",
                                                     {cfg_.vocab_size, hd}));  // [vocab, hidden]
    const auto t0 = std::chrono::steady_clock::now();
    auto copy = be_.host_copy({view}, /*pinned=*/false);
    if (!copy.ok())
      return copy.status().with_context("host copy of the text encoder's embedding table");
    embed_ = copy->view(view.shape());
    ZI_DEBUG("text encoder: embedding table (%.2f GB) copied to host memory in %.3f s",
             static_cast<double>(view.nbytes()) / 1e9,
             std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  const int run = cfg_.num_hidden_layers - 1;  // hidden_states[-2] = output of layer N-2
  layers_.resize(run);
  for (int i = 0; i < run; ++i) {
    const std::string p = pre + "layers." + std::to_string(i) + ".";
    Layer& l = layers_[i];
    // What a streamed layer's files hold as the backend streams it (not the linears that become
    // FP8 rows on the device) is taken from the files (views or host copies); the rest is
    // loaded, then moved to the host by place_layer.
    BlockSources sources(ws, be_, placement_, i);
    auto tensor = [&](const std::string& name, const Shape& shape, Tensor& dst) {
      return sources.tensor(name, shape, dst);
    };
    auto linear_weight = [&](const std::vector<LinearPart>& parts, const std::string& what,
                             LinearWeight& dst) -> Status {
      bool streams = false;
      if (!placement_.fp8_weights) {
        ZI_ASSIGN_OR_RETURN(streams, sources.take(parts, dst.w));
      }
      if (!streams) {
        ZI_ASSIGN_OR_RETURN(dst,
                            load_linear(ws, be_, parts, what, placement_.keep_quantized, &kept_));
      }
      return Status::Ok();
    };
    const auto groups = layer_linear_parts(cfg_, p);
    ZI_TRY(tensor(p + "input_layernorm.weight", {hd}, l.input_norm));
    ZI_TRY(linear_weight(groups[0], p + "self_attn.qkv", l.wqkv));
    ZI_TRY(tensor(p + "self_attn.q_norm.weight", {dh}, l.q_norm));
    ZI_TRY(tensor(p + "self_attn.k_norm.weight", {dh}, l.k_norm));
    ZI_TRY(linear_weight(groups[1], p + "self_attn.o_proj", l.wo));
    ZI_TRY(tensor(p + "post_attention_layernorm.weight", {hd}, l.post_norm));
    ZI_TRY(linear_weight(groups[2], p + "mlp.gate_up", l.wgu));
    ZI_TRY(linear_weight(groups[3], p + "mlp.down_proj", l.wdown));
    if (sources.streamed()) {
      if (layer_sources_.size() <= static_cast<size_t>(i)) layer_sources_.resize(i + 1);
      layer_sources_[i] = sources.unit(l.tensors());
    }
    ZI_TRY(place_layer(l, i));
  }
  // Known and deliberately unused: the last layer, the final norm, a (tied) lm_head.
  const std::string last = pre + "layers." + std::to_string(cfg_.num_hidden_layers - 1) + ".";
  return load::check_all_used(ws, "text encoder", [&](const std::string& n) {
    return n.rfind(last, 0) == 0 || n == pre + "norm.weight" || n.rfind("lm_head.", 0) == 0;
  });
}

int64_t Qwen3Encoder::layer_weight_bytes(const TextEncoderConfig& c, DType act, bool fp8_weights) {
  const int64_t hd = c.hidden_size, dh = c.head_dim, ff = c.intermediate_size;
  const int64_t qkv_rows = (c.num_attention_heads + 2 * c.num_key_value_heads) * dh;
  const int64_t elems = qkv_rows * hd + hd * c.num_attention_heads * dh + 2 * ff * hd + hd * ff;
  const int64_t rows = qkv_rows + hd + 2 * ff + hd;
  const int64_t es = dtype_size(act);
  return (fp8_weights ? elems + 4 * rows : elems * es) + (2 * hd + 2 * dh) * es;
}

Status Qwen3Encoder::place_layer(Layer& l, int index) {
  const std::string what = "text encoder layer " + std::to_string(index);
  if (placement_.fp8_weights) {
    for (LinearWeight* w : {&l.wqkv, &l.wo, &l.wgu, &l.wdown}) ZI_TRY(to_fp8_rows(be_, *w, what));
  }
  if (index >= static_cast<int>(placement_.streamed.size()) || !placement_.streamed[index])
    return Status::Ok();
  // What was loaded (everything not read from the files) becomes a host copy.
  ZI_TRY(move_to_host(be_, l.tensors(), !placement_.is_pageable(index)));
  std::vector<StreamSource>& u = layer_sources_.at(index);
  const std::vector<Tensor*> ts = l.tensors();
  for (size_t k = 0; k < ts.size(); ++k)
    if (!u[k].defined()) u[k] = StreamSource::of(*ts[k]);
  return Status::Ok();
}

Status Qwen3Encoder::apply_placement() {
  const int n = static_cast<int>(layers_.size());
  if (!placement_.streamed.empty() && static_cast<int>(placement_.streamed.size()) != n)
    return InternalError("weight placement for " + std::to_string(placement_.streamed.size()) +
                         " layers, the text encoder runs " + std::to_string(n));
  unit_of_layer_.assign(n, -1);
  std::vector<std::vector<StreamSource>> units;
  for (int i = 0; i < n; ++i) {
    if (placement_.streamed.empty() || !placement_.streamed[i]) continue;
    if (static_cast<size_t>(i) >= layer_sources_.size())
      return InternalError("text encoder layer " + std::to_string(i) + " has no stream sources");
    unit_of_layer_[i] = static_cast<int>(units.size());
    units.push_back(std::move(layer_sources_[i]));
  }
  layer_sources_.clear();
  if (!units.empty()) {
    ZI_ASSIGN_OR_RETURN(streamer_, WeightStreamer::create(be_, std::move(units),
                                                          placement_.first_slot, placement_.slots));
    report_and_lock_files(*streamer_, placement_, unit_of_layer_, "text encoder", "layers");
    streamer_->prepare_staging();
  }
  if (placement_.fp8_weights || kept_.kept > 0) {
    const int64_t hd = cfg_.hidden_size, ff = cfg_.intermediate_size;
    const int64_t qkv_rows =
        (cfg_.num_attention_heads + 2 * cfg_.num_key_value_heads) * cfg_.head_dim;
    const int64_t elems = std::max<int64_t>(2 * ff * hd, qkv_rows * hd);
    ZI_ASSIGN_OR_RETURN(wide_scratch_,
                        load::alloc(be_, be_.act_dtype(), {elems}, "FP8 weight scratch"));
  }
  return be_.synchronize();
}

Status Qwen3Encoder::rope_tables(int64_t seq, Tensor& cos, Tensor& sin) const {
  const int64_t dh = cfg_.head_dim, half = dh / 2;
  Tensor c = Tensor::host(DType::kF32, {seq, dh});  // [S, Dh]
  Tensor s = Tensor::host(DType::kF32, {seq, dh});  // [S, Dh]
  if (!c.defined() || !s.defined()) return OutOfMemory("text encoder RoPE tables");
  // transformers casts the fp32 cos/sin tables to the activation dtype before applying them.
  const bool bf16 = be_.act_dtype() == DType::kBF16;
  for (int64_t p = 0; p < seq; ++p) {
    for (int64_t j = 0; j < half; ++j) {
      const float angle = static_cast<float>(p) * inv_freq_[j];  // fp32 product, as torch
      float cv = static_cast<float>(std::cos(static_cast<double>(angle)));
      float sv = static_cast<float>(std::sin(static_cast<double>(angle)));
      if (bf16) cv = round_bf16(cv), sv = round_bf16(sv);
      c.data_as<float>()[p * dh + j] = c.data_as<float>()[p * dh + j + half] = cv;
      s.data_as<float>()[p * dh + j] = s.data_as<float>()[p * dh + j + half] = sv;
    }
  }
  ZI_ASSIGN_OR_RETURN(cos, load::upload_host(be_, c, DType::kF32));  // [S, Dh] f32
  ZI_ASSIGN_OR_RETURN(sin, load::upload_host(be_, s, DType::kF32));  // [S, Dh] f32
  return Status::Ok();
}

Result<std::vector<Tensor>> Qwen3Encoder::encode(const std::vector<std::vector<int32_t>>& ids,
                                                 DebugSink* dbg) {
  if (ids.empty()) return InvalidArgument("text encoder: no prompts");
  const int64_t b = static_cast<int64_t>(ids.size());
  int64_t s = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i].empty())
      return InvalidArgument("text encoder: prompt " + std::to_string(i) + " has no tokens");
    for (int32_t t : ids[i]) {
      if (t < 0 || t >= cfg_.vocab_size) {
        return InvalidArgument("text encoder: prompt " + std::to_string(i) + " token id " +
                               std::to_string(t) + " outside the vocabulary [0, " +
                               std::to_string(cfg_.vocab_size) + ")");
      }
    }
    s = std::max<int64_t>(s, static_cast<int64_t>(ids[i].size()));
  }
  const int64_t hd = cfg_.hidden_size, dh = cfg_.head_dim, ff = cfg_.intermediate_size;
  const int64_t hq = cfg_.num_attention_heads, hkv = cfg_.num_key_value_heads;
  const int64_t rows = b * s;
  const DType act = be_.act_dtype();

  // Right-padded ids; pad positions only ever see real keys and are dropped at the end.
  Tensor host_ids = Tensor::host(DType::kI32, {rows});  // [B*S]
  if (!host_ids.defined()) return OutOfMemory("text encoder ids");
  AttentionParams ap;
  ap.scale = 1.0f / std::sqrt(static_cast<float>(dh));
  ap.causal = true;
  bool ragged = false;
  for (int64_t i = 0; i < b; ++i) {
    const auto& v = ids[i];
    std::copy(v.begin(), v.end(), host_ids.data_as<int32_t>() + i * s);
    ap.key_len.push_back(static_cast<int32_t>(v.size()));
    ragged = ragged || static_cast<int64_t>(v.size()) != s;
  }
  if (!ragged) ap.key_len.clear();

  ZI_ASSIGN_OR_RETURN(Tensor h, load::alloc(be_, act, {rows, hd}, "te.hidden"));  // [B*S, hidden]
  if (embed_.device() == Device::kCPU && be_.device() != Device::kCPU) {
    // The table stays in host memory on a GPU: gather the rows here, upload them.
    Tensor rows_host = Tensor::host(embed_.dtype(), {rows, hd});  // [B*S, hidden]
    if (!rows_host.defined()) return OutOfMemory("text encoder embedding rows");
    const size_t row_bytes = static_cast<size_t>(hd) * dtype_size(embed_.dtype());
    for (int64_t r = 0; r < rows; ++r) {
      std::memcpy(static_cast<char*>(rows_host.data()) + r * row_bytes,
                  static_cast<const char*>(embed_.data()) +
                      static_cast<size_t>(host_ids.data_as<int32_t>()[r]) * row_bytes,
                  row_bytes);
    }
    ZI_ASSIGN_OR_RETURN(Tensor up, load::upload_host(be_, rows_host, act));
    ZI_TRY(be_.copy_2d(up, 0, hd, h, 0, hd, rows, hd));
  } else {
    ZI_TRY(be_.embedding(embed_, host_ids, h));  // [B*S, hidden]
  }
  Tensor cos, sin;
  ZI_TRY(rope_tables(s, cos, sin));  // [S, Dh] each

  const int64_t qkv_w = (hq + 2 * hkv) * dh, v_off = (hq + hkv) * dh;
  ZI_ASSIGN_OR_RETURN(Tensor a, load::alloc(be_, act, {rows, hd}, "te.norm"));      // [B*S, hidden]
  ZI_ASSIGN_OR_RETURN(Tensor qkv, load::alloc(be_, act, {rows, qkv_w}, "te.qkv"));  // [B*S, QKV]
  ZI_ASSIGN_OR_RETURN(Tensor q, load::alloc(be_, act, {b, s, hq, dh}, "te.q"));     // [B,S,Hq,Dh]
  ZI_ASSIGN_OR_RETURN(Tensor k, load::alloc(be_, act, {b, s, hkv, dh}, "te.k"));    // [B,S,Hkv,Dh]
  ZI_ASSIGN_OR_RETURN(Tensor v, load::alloc(be_, act, {b, s, hkv, dh}, "te.v"));    // [B,S,Hkv,Dh]
  ZI_ASSIGN_OR_RETURN(Tensor o, load::alloc(be_, act, {b, s, hq, dh}, "te.attn"));  // [B,S,Hq,Dh]
  ZI_ASSIGN_OR_RETURN(Tensor proj, load::alloc(be_, act, {rows, hd}, "te.proj"));   // [B*S, hidden]
  ZI_ASSIGN_OR_RETURN(Tensor gu, load::alloc(be_, act, {rows, 2 * ff}, "te.gate_up"));  // [B*S, 2F]
  ZI_ASSIGN_OR_RETURN(Tensor mlp, load::alloc(be_, act, {rows, ff}, "te.mlp"));         // [B*S, F]
  const Tensor none;

  for (size_t li = 0; li < layers_.size(); ++li) {
    const int unit = unit_of_layer_.empty() ? -1 : unit_of_layer_[li];
    Layer l = layers_[li];  // tensor handles: the resident weights or a streamed layer's slot
    if (unit >= 0) {
      ZI_ASSIGN_OR_RETURN(std::vector<Tensor> dev, streamer_->acquire(unit));
      std::vector<Tensor*> dst = l.tensors();
      for (size_t i = 0; i < dst.size(); ++i) *dst[i] = dev[i];
    }
    const float eps = cfg_.rms_norm_eps;
    // --- attention ---
    ZI_TRY(be_.rms_norm(h, l.input_norm, eps, none, a));                            // [B*S, hidden]
    ZI_TRY(linear(be_, a, l.wqkv, none, wide_scratch_, qkv));                       // [B*S, QKV]
    ZI_TRY(be_.copy_2d(qkv, 0, qkv_w, q, 0, hq * dh, rows, hq * dh));               // [B,S,Hq,Dh]
    ZI_TRY(be_.copy_2d(qkv, hq * dh, qkv_w, k, 0, hkv * dh, rows, hkv * dh));       // [B,S,Hkv,Dh]
    ZI_TRY(be_.copy_2d(qkv, v_off, qkv_w, v, 0, hkv * dh, rows, hkv * dh));         // [B,S,Hkv,Dh]
    Tensor q_rows = q.view({rows * hq, dh});                                        // [B*S*Hq, Dh]
    Tensor k_rows = k.view({rows * hkv, dh});                                       // [B*S*Hkv, Dh]
    ZI_TRY(be_.rms_norm(q_rows, l.q_norm, eps, none, q_rows));                      // per head
    ZI_TRY(be_.rms_norm(k_rows, l.k_norm, eps, none, k_rows));                      // per head
    ZI_TRY(be_.rope_half(q, cos, sin));                                             // [B,S,Hq,Dh]
    ZI_TRY(be_.rope_half(k, cos, sin));                                             // [B,S,Hkv,Dh]
    ZI_TRY(be_.attention(q, k, v, ap, o));                                          // [B,S,Hq,Dh]
    ZI_TRY(linear(be_, o.view({rows, hq * dh}), l.wo, none, wide_scratch_, proj));  // [B*S, hd]
    ZI_TRY(be_.add(h, proj, h));                                                    // [B*S, hidden]
    // --- SwiGLU MLP ---
    ZI_TRY(be_.rms_norm(h, l.post_norm, eps, none, a));            // [B*S, hidden]
    ZI_TRY(linear(be_, a, l.wgu, none, wide_scratch_, gu));        // [B*S, 2F]
    ZI_TRY(be_.swiglu(gu, mlp));                                   // [B*S, F]
    ZI_TRY(linear(be_, mlp, l.wdown, none, wide_scratch_, proj));  // [B*S, hidden]
    ZI_TRY(be_.add(h, proj, h));                                   // [B*S, hidden]
    if (unit >= 0) ZI_TRY(streamer_->release(unit));
    debug_tensor(dbg, "te.layer" + std::to_string(li), be_, h.view({b, s, hd}));
  }

  std::vector<Tensor> out;
  for (int64_t i = 0; i < b; ++i) {
    const int64_t len = static_cast<int64_t>(ids[i].size());
    ZI_ASSIGN_OR_RETURN(Tensor e, load::alloc(be_, act, {len, hd}, "te.output"));  // [L_i, hidden]
    ZI_TRY(be_.copy_2d(h, i * s * hd, hd, e, 0, hd, len, hd));                     // [L_i, hidden]
    debug_tensor(dbg, "te.hidden_states." + std::to_string(i), be_, e);
    out.push_back(std::move(e));
  }
  return out;
}

}  // namespace zimage
