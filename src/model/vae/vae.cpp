// AutoencoderKL decoder / encoder on the Backend interface (NHWC feature maps).
//   ResnetBlock2D: h = conv2(SiLU(GN2(conv1(SiLU(GN1(x)))))); out = shortcut(x) + h
//   Mid attention: x + out(softmax(q kᵀ/√C) v), q/k/v from GN(x) (one head over C channels)
//   Decoder: conv_in -> mid -> up_blocks (resnets, nearest x2 + conv) -> GN+SiLU -> conv_out
//   Encoder: conv_in -> down_blocks (resnets, pad (0,1,0,1) + stride-2 conv) -> mid -> GN+SiLU
//            -> conv_out -> [mean | logvar]
// GroupNorm eps is 1e-6 everywhere (diffusers' resnet_eps for the VAE).
#include "model/vae/vae.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "core/log.h"
#include "model/common/load_util.h"

namespace zimage {

namespace {

constexpr float kGroupNormEps = 1e-6f;

Status validate(const VaeConfig& c) {
  auto bad = [](const std::string& m) { return InvalidArgument("vae config: " + m); };
  if (c.block_out_channels.empty()) return bad("block_out_channels is empty");
  if (c.layers_per_block < 1 || c.norm_num_groups < 1 || c.latent_channels < 1 ||
      c.in_channels < 1 || c.out_channels < 1) {
    return bad("layers_per_block, norm_num_groups and channel counts must be positive");
  }
  for (int ch : c.block_out_channels) {
    if (ch < 1 || ch % c.norm_num_groups != 0) {
      return bad("block_out_channels entry " + std::to_string(ch) +
                 " is not a positive multiple of norm_num_groups " +
                 std::to_string(c.norm_num_groups));
    }
  }
  if (!(c.scaling_factor != 0.0f) || !std::isfinite(c.scaling_factor))
    return bad("scaling_factor must be finite and non-zero");
  return Status::Ok();
}

// Diffusers names or LDM / BFL names (`ae.safetensors`), spec §8.5.
class Names {
 public:
  explicit Names(const WeightStore& ws)
      : ldm_(ws.contains("decoder.mid.block_1.conv1.weight") ||
             ws.contains("encoder.mid.block_1.conv1.weight")) {}
  std::string mid_resnet(const std::string& side, int j) const {
    return side + (ldm_ ? ".mid.block_" + std::to_string(j + 1) + "."
                        : ".mid_block.resnets." + std::to_string(j) + ".");
  }
  std::string mid_attn(const std::string& side) const {
    return side + (ldm_ ? ".mid.attn_1." : ".mid_block.attentions.0.");
  }
  std::string attn_norm() const { return ldm_ ? "norm." : "group_norm."; }
  std::string attn_q() const { return ldm_ ? "q." : "to_q."; }
  std::string attn_k() const { return ldm_ ? "k." : "to_k."; }
  std::string attn_v() const { return ldm_ ? "v." : "to_v."; }
  std::string attn_out() const { return ldm_ ? "proj_out." : "to_out.0."; }
  std::string shortcut() const { return ldm_ ? "nin_shortcut." : "conv_shortcut."; }
  std::string norm_out(const std::string& side) const {
    return side + (ldm_ ? ".norm_out." : ".conv_norm_out.");
  }
  // Decoder up block i (diffusers order); LDM numbers them in reverse.
  std::string up_resnet(int i, int n, int j) const {
    return ldm_ ? "decoder.up." + std::to_string(n - 1 - i) + ".block." + std::to_string(j) + "."
                : "decoder.up_blocks." + std::to_string(i) + ".resnets." + std::to_string(j) + ".";
  }
  std::string upsampler(int i, int n) const {
    return ldm_ ? "decoder.up." + std::to_string(n - 1 - i) + ".upsample.conv."
                : "decoder.up_blocks." + std::to_string(i) + ".upsamplers.0.conv.";
  }
  std::string down_resnet(int i, int j) const {
    return ldm_
               ? "encoder.down." + std::to_string(i) + ".block." + std::to_string(j) + "."
               : "encoder.down_blocks." + std::to_string(i) + ".resnets." + std::to_string(j) + ".";
  }
  std::string downsampler(int i) const {
    return ldm_ ? "encoder.down." + std::to_string(i) + ".downsample.conv."
                : "encoder.down_blocks." + std::to_string(i) + ".downsamplers.0.conv.";
  }

 private:
  bool ldm_;
};

// ---- loading ----

Result<vae::Conv> load_conv(const WeightStore& ws, Backend& be, const std::string& p, int64_t cin,
                            int64_t cout, int64_t k) {
  vae::Conv c;
  c.cin = cin, c.cout = cout, c.k = k;
  ZI_ASSIGN_OR_RETURN(c.w, load::conv_weight(ws, be, p + "weight", cout, cin, k));  // OHWI
  ZI_ASSIGN_OR_RETURN(c.b, load::weight(ws, be, p + "bias", {cout}));
  return c;
}

Result<vae::Norm> load_norm(const WeightStore& ws, Backend& be, const std::string& p, int64_t c) {
  vae::Norm n;
  ZI_ASSIGN_OR_RETURN(n.gamma, load::weight(ws, be, p + "weight", {c}));
  ZI_ASSIGN_OR_RETURN(n.beta, load::weight(ws, be, p + "bias", {c}));
  return n;
}

Result<vae::Resnet> load_resnet(const WeightStore& ws, Backend& be, const Names& nm,
                                const std::string& p, int64_t cin, int64_t cout) {
  vae::Resnet r;
  ZI_ASSIGN_OR_RETURN(r.norm1, load_norm(ws, be, p + "norm1.", cin));
  ZI_ASSIGN_OR_RETURN(r.conv1, load_conv(ws, be, p + "conv1.", cin, cout, 3));
  ZI_ASSIGN_OR_RETURN(r.norm2, load_norm(ws, be, p + "norm2.", cout));
  ZI_ASSIGN_OR_RETURN(r.conv2, load_conv(ws, be, p + "conv2.", cout, cout, 3));
  r.has_shortcut = cin != cout;
  if (r.has_shortcut) {
    ZI_ASSIGN_OR_RETURN(r.shortcut, load_conv(ws, be, p + nm.shortcut(), cin, cout, 1));
  }
  return r;
}

// A linear stored [C, C] (diffusers) or as a 1x1 conv [C, C, 1, 1] (LDM), as host f32 [C, C].
Result<Tensor> linear_f32(const WeightStore& ws, const std::string& name, int64_t c) {
  ZI_ASSIGN_OR_RETURN(WeightInfo probe, ws.info(name));
  if (probe.shape.size() == 4) {
    ZI_ASSIGN_OR_RETURN(Tensor w, load::host_f32(ws, name, {c, c, 1, 1}));
    return w.view({c, c});
  }
  return load::host_f32(ws, name, {c, c});
}

Result<vae::Attention> load_attn(const WeightStore& ws, Backend& be, const Names& nm,
                                 const std::string& p, int64_t c) {
  vae::Attention a;
  a.c = c;
  ZI_ASSIGN_OR_RETURN(a.norm, load_norm(ws, be, p + nm.attn_norm(), c));
  ZI_ASSIGN_OR_RETURN(Tensor wq, linear_f32(ws, p + nm.attn_q() + "weight", c));  // [C, C]
  ZI_ASSIGN_OR_RETURN(Tensor wk, linear_f32(ws, p + nm.attn_k() + "weight", c));  // [C, C]
  ZI_ASSIGN_OR_RETURN(Tensor wv, linear_f32(ws, p + nm.attn_v() + "weight", c));  // [C, C]
  ZI_ASSIGN_OR_RETURN(a.wqkv, load::concat_rows(be, {wq, wk, wv}, p + "qkv.weight"));
  ZI_ASSIGN_OR_RETURN(Tensor bq, load::host_f32(ws, p + nm.attn_q() + "bias", {c}));
  ZI_ASSIGN_OR_RETURN(Tensor bk, load::host_f32(ws, p + nm.attn_k() + "bias", {c}));
  ZI_ASSIGN_OR_RETURN(Tensor bv, load::host_f32(ws, p + nm.attn_v() + "bias", {c}));
  ZI_ASSIGN_OR_RETURN(Tensor bqkv,
                      load::concat_rows(be, {bq.view({c, 1}), bk.view({c, 1}), bv.view({c, 1})},
                                        p + "qkv.bias"));  // [3C, 1]
  a.bqkv = bqkv.view({3 * c});
  ZI_ASSIGN_OR_RETURN(Tensor wo, linear_f32(ws, p + nm.attn_out() + "weight", c));  // [C, C]
  ZI_ASSIGN_OR_RETURN(a.wo, load::upload_host(be, wo, be.act_dtype()));
  ZI_ASSIGN_OR_RETURN(a.bo, load::weight(ws, be, p + nm.attn_out() + "bias", {c}));
  return a;
}

Result<vae::Mid> load_mid(const WeightStore& ws, Backend& be, const Names& nm,
                          const std::string& side, int64_t c, bool attn) {
  vae::Mid m;
  ZI_ASSIGN_OR_RETURN(m.res0, load_resnet(ws, be, nm, nm.mid_resnet(side, 0), c, c));
  m.has_attn = attn;
  if (attn) {
    ZI_ASSIGN_OR_RETURN(m.attn, load_attn(ws, be, nm, nm.mid_attn(side), c));
  }
  ZI_ASSIGN_OR_RETURN(m.res1, load_resnet(ws, be, nm, nm.mid_resnet(side, 1), c, c));
  return m;
}

// ---- forward building blocks (x: [B, H, W, C] act dtype) ----

Result<Tensor> conv(Backend& be, const Tensor& x, const vae::Conv& c, const Conv2dParams& p) {
  const int64_t ho = (x.dim(1) + p.pad_top + p.pad_bottom - c.k) / p.stride + 1;
  const int64_t wo = (x.dim(2) + p.pad_left + p.pad_right - c.k) / p.stride + 1;
  ZI_ASSIGN_OR_RETURN(Tensor y, load::alloc(be, be.act_dtype(), {x.dim(0), ho, wo, c.cout},
                                            "vae conv output"));  // [B, Ho, Wo, Cout]
  ZI_TRY(be.conv2d(x, c.w, c.b, p, y));
  return y;
}

Conv2dParams same_pad(int64_t k) {
  Conv2dParams p;
  p.pad_top = p.pad_bottom = p.pad_left = p.pad_right = static_cast<int>(k / 2);
  return p;
}

Result<Tensor> resnet(Backend& be, const Tensor& x, const vae::Resnet& r, int groups) {
  ZI_ASSIGN_OR_RETURN(Tensor h, load::alloc(be, be.act_dtype(), x.shape(), "vae resnet norm"));
  ZI_TRY(be.group_norm(x, r.norm1.gamma, r.norm1.beta, groups, kGroupNormEps, true,
                       h));                                           // [B,H,W,Cin]
  ZI_ASSIGN_OR_RETURN(Tensor h1, conv(be, h, r.conv1, same_pad(3)));  // [B,H,W,Cout]
  h = Tensor();
  ZI_TRY(be.group_norm(h1, r.norm2.gamma, r.norm2.beta, groups, kGroupNormEps, true, h1));
  // out = shortcut(x) + conv2(h1), the sum in the convolution where the backend fuses it.
  Tensor sc = x;
  if (r.has_shortcut) {
    ZI_ASSIGN_OR_RETURN(sc, conv(be, x, r.shortcut, same_pad(1)));  // [B,H,W,Cout]
  }
  ZI_ASSIGN_OR_RETURN(Tensor out, load::alloc(be, be.act_dtype(), h1.shape(), "vae conv output"));
  ZI_TRY(be.conv2d_add(h1, r.conv2.w, r.conv2.b, sc, same_pad(3), out));  // [B,H,W,Cout]
  return out;
}

Result<Tensor> attention(Backend& be, const Tensor& x, const vae::Attention& a, int groups) {
  const int64_t b = x.dim(0), n = x.dim(1) * x.dim(2), c = a.c;
  const DType act = be.act_dtype();
  const Tensor none;
  ZI_ASSIGN_OR_RETURN(Tensor h, load::alloc(be, act, x.shape(), "vae attn norm"));  // [B,H,W,C]
  ZI_TRY(be.group_norm(x, a.norm.gamma, a.norm.beta, groups, kGroupNormEps, false, h));
  ZI_ASSIGN_OR_RETURN(Tensor qkv, load::alloc(be, act, {b * n, 3 * c}, "vae attn qkv"));
  ZI_TRY(be.matmul(h.view({b * n, c}), a.wqkv, a.bqkv, qkv));                       // [B*N, 3C]
  ZI_ASSIGN_OR_RETURN(Tensor q, load::alloc(be, act, {b, n, 1, c}, "vae attn q"));  // [B,N,1,C]
  ZI_ASSIGN_OR_RETURN(Tensor k, load::alloc(be, act, {b, n, 1, c}, "vae attn k"));  // [B,N,1,C]
  ZI_ASSIGN_OR_RETURN(Tensor v, load::alloc(be, act, {b, n, 1, c}, "vae attn v"));  // [B,N,1,C]
  ZI_TRY(be.copy_2d(qkv, 0, 3 * c, q, 0, c, b * n, c));
  ZI_TRY(be.copy_2d(qkv, c, 3 * c, k, 0, c, b * n, c));
  ZI_TRY(be.copy_2d(qkv, 2 * c, 3 * c, v, 0, c, b * n, c));
  qkv = Tensor();
  AttentionParams ap;
  ap.scale = 1.0f / std::sqrt(static_cast<float>(c));
  Tensor o = h.view({b, n, 1, c});                                                   // [B,N,1,C]
  ZI_TRY(be.attention(q, k, v, ap, o));                                              // [B,N,1,C]
  ZI_ASSIGN_OR_RETURN(Tensor out, load::alloc(be, act, x.shape(), "vae attn out"));  // [B,H,W,C]
  Tensor out_rows = out.view({b * n, c});                                            // [B*N, C]
  ZI_TRY(be.matmul(h.view({b * n, c}), a.wo, a.bo, out_rows));                       // [B*N, C]
  ZI_TRY(be.add(x, out, out));                                                       // residual
  return out;
}

Result<Tensor> mid(Backend& be, const Tensor& x, const vae::Mid& m, int groups) {
  ZI_ASSIGN_OR_RETURN(Tensor h, resnet(be, x, m.res0, groups));  // [B, h, w, C]
  if (m.has_attn) {
    ZI_ASSIGN_OR_RETURN(h, attention(be, h, m.attn, groups));
  }
  return resnet(be, h, m.res1, groups);  // [B, h, w, C]
}

}  // namespace

// =============================== decoder ===============================

Result<std::unique_ptr<VaeDecoder>> VaeDecoder::load(const VaeConfig& cfg, const WeightStore& ws,
                                                     Backend& be) {
  ZI_TRY(validate(cfg));
  std::unique_ptr<VaeDecoder> m(new VaeDecoder(cfg, be));
  Status st = m->load_weights(ws);
  if (!st.ok()) return st.with_context("loading vae decoder");
  return m;
}

Status VaeDecoder::load_weights(const WeightStore& ws) {
  const Names nm(ws);
  const auto& boc = cfg_.block_out_channels;
  const int n = static_cast<int>(boc.size());
  const int64_t lat = cfg_.latent_channels, top = boc[n - 1];
  has_post_quant_ = cfg_.use_post_quant_conv;
  if (has_post_quant_) {
    ZI_ASSIGN_OR_RETURN(post_quant_, load_conv(ws, be_, "post_quant_conv.", lat, lat, 1));
  }
  ZI_ASSIGN_OR_RETURN(conv_in_, load_conv(ws, be_, "decoder.conv_in.", lat, top, 3));
  ZI_ASSIGN_OR_RETURN(mid_, load_mid(ws, be_, nm, "decoder", top, cfg_.mid_block_add_attention));
  up_.resize(n);
  int64_t prev = top;
  for (int i = 0; i < n; ++i) {
    const int64_t out_c = boc[n - 1 - i];
    up_[i].resnets.resize(cfg_.layers_per_block + 1);
    for (int j = 0; j <= cfg_.layers_per_block; ++j) {
      ZI_ASSIGN_OR_RETURN(up_[i].resnets[j], load_resnet(ws, be_, nm, nm.up_resnet(i, n, j),
                                                         j == 0 ? prev : out_c, out_c));
    }
    up_[i].has_resample = i < n - 1;
    if (up_[i].has_resample) {
      ZI_ASSIGN_OR_RETURN(up_[i].resample, load_conv(ws, be_, nm.upsampler(i, n), out_c, out_c, 3));
    }
    prev = out_c;
  }
  ZI_ASSIGN_OR_RETURN(norm_out_, load_norm(ws, be_, nm.norm_out("decoder"), boc[0]));
  ZI_ASSIGN_OR_RETURN(conv_out_,
                      load_conv(ws, be_, "decoder.conv_out.", boc[0], cfg_.out_channels, 3));
  // The encoder's tensors live in the same file.
  return load::check_all_used(ws, "vae decoder", [](const std::string& s) {
    return s.rfind("encoder.", 0) == 0 || s.rfind("quant_conv.", 0) == 0;
  });
}

Result<Tensor> VaeDecoder::decode(const Tensor& latents, DebugSink* dbg,
                                  const std::atomic<bool>* cancel) {
  // Where the time goes (ZIMAGE_LOG=debug): host preparation, queuing the convolutions, waiting
  // for the device, the image download and the host post-processing.
  using Clock = std::chrono::steady_clock;
  const auto ms_since = [](Clock::time_point t) {
    return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
  };
  const Clock::time_point t_start = Clock::now();
  double t_pre = 0, t_queue = 0, t_wait = 0, t_down = 0;
  ZI_ASSIGN_OR_RETURN(Tensor zh, scale_latents(latents));  // [B, C, h, w] host f32
  t_pre = ms_since(t_start);
  ZI_ASSIGN_OR_RETURN(Tensor x, decode_scaled(zh, dbg, cancel, "vae"));  // [B, H, W, 3]
  t_queue = ms_since(t_start);
  if (log_level() == LogLevel::kDebug) {
    ZI_TRY(be_.synchronize());
    t_wait = ms_since(t_start);
  }
  ZI_ASSIGN_OR_RETURN(Tensor img, postprocess(x));  // [B, H, W, 3] host f32
  t_down = ms_since(t_start);
  ZI_DEBUG(
      "vae decode %lldx%lld: prepare %.1f ms, queued by %.1f, device done %.1f, downloaded "
      "%.1f, returned %.1f ms",
      static_cast<long long>(latents.dim(2)), static_cast<long long>(latents.dim(3)), t_pre,
      t_queue, t_wait, t_down, ms_since(t_start));
  return img;
}

Result<Tensor> VaeDecoder::decode_rgb8(const Tensor& latents, int64_t* nonfinite, DebugSink* dbg,
                                       const std::atomic<bool>* cancel) {
  if (nonfinite == nullptr) return InvalidArgument("vae decode_rgb8: nonfinite is required");
  using Clock = std::chrono::steady_clock;
  const auto ms_since = [](Clock::time_point t) {
    return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
  };
  const Clock::time_point t_start = Clock::now();
  ZI_ASSIGN_OR_RETURN(Tensor zh, scale_latents(latents));  // [B, C, h, w] host f32
  const double t_pre = ms_since(t_start);
  ZI_ASSIGN_OR_RETURN(Tensor x, decode_scaled(zh, dbg, cancel, "vae"));  // [B, H, W, 3]
  const double t_queue = ms_since(t_start);
  ZI_ASSIGN_OR_RETURN(Tensor rgb, load::alloc(be_, DType::kU8, x.shape(), "vae rgb8"));
  ZI_TRY(be_.image_to_rgb8(x, rgb));                        // queued behind the decode
  ZI_ASSIGN_OR_RETURN(*nonfinite, be_.count_nonfinite(x));  // waits for both
  const double t_wait = ms_since(t_start);
  Tensor host = Tensor::host(DType::kU8, x.shape());
  if (!host.defined()) return OutOfMemory("vae output image " + shape_string(x.shape()));
  ZI_TRY(be_.download(rgb, host));
  ZI_DEBUG(
      "vae decode to rgb8 %lldx%lld: prepare %.1f ms, queued by %.1f, device done %.1f, "
      "downloaded %.1f ms",
      static_cast<long long>(latents.dim(2)), static_cast<long long>(latents.dim(3)), t_pre,
      t_queue, t_wait, ms_since(t_start));
  return host;
}

Result<Tensor> VaeDecoder::scale_latents(const Tensor& latents) const {
  const int64_t lat = cfg_.latent_channels;
  if (!latents.defined() || latents.rank() != 4 || latents.dtype() != DType::kF32 ||
      latents.dim(1) != lat || latents.dim(0) < 1 || latents.dim(2) < 1 || latents.dim(3) < 1) {
    return InvalidArgument("vae decode: latents must be f32 [B, " + std::to_string(lat) +
                           ", h, w], got " +
                           (latents.defined() ? latents.describe() : std::string("undefined")));
  }
  // z = latents / scaling + shift in f32 on the host (the latents are small).
  Tensor zh = Tensor::host(DType::kF32, latents.shape());  // [B, C, h, w]
  if (!zh.defined()) return OutOfMemory("vae latents host copy");
  ZI_TRY(be_.download(latents, zh));
  // One pointer and one count: with data_as() and numel() per element, this loop took 4.4 ms at
  // 1024² and 17 ms at 2048² (H100 host, ZIMAGE_LOG=debug's "prepare"), ~17 ns a value.
  float* z = zh.data_as<float>();
  const float scale = cfg_.scaling_factor, shift = cfg_.shift_factor;
  for (int64_t i = 0, n = zh.numel(); i < n; ++i) z[i] = z[i] / scale + shift;
  return zh;
}

Result<Tensor> VaeDecoder::decode_scaled(const Tensor& zh, DebugSink* dbg,
                                         const std::atomic<bool>* cancel,
                                         const std::string& prefix) {
  const auto cancelled = [cancel] { return cancel != nullptr && cancel->load(); };
  const int64_t lat = cfg_.latent_channels;
  if (!zh.defined() || zh.device() != Device::kCPU || zh.rank() != 4 || zh.dtype() != DType::kF32 ||
      zh.dim(1) != lat || zh.numel() == 0) {
    return InvalidArgument("vae decode: scaled latents must be host f32 [B, " +
                           std::to_string(lat) + ", h, w], got " +
                           (zh.defined() ? zh.describe() : std::string("undefined")));
  }
  const int64_t b = zh.dim(0), h = zh.dim(2), w = zh.dim(3);
  const int groups = cfg_.norm_num_groups;
  // NCHW -> NHWC in the compute dtype.
  ZI_ASSIGN_OR_RETURN(Tensor z, load::upload_host(be_, zh, DType::kF32));  // [B, C, h, w]
  ZI_ASSIGN_OR_RETURN(Tensor x, load::alloc(be_, be_.act_dtype(), {b, h * w, lat}, "vae input"));
  ZI_TRY(be_.patchify(z, 1, x));  // [B, h*w, C]
  z = Tensor();
  x = x.view({b, h, w, lat});  // [B, h, w, C]
  if (has_post_quant_) {
    ZI_ASSIGN_OR_RETURN(x, conv(be_, x, post_quant_, same_pad(1)));
  }

  ZI_ASSIGN_OR_RETURN(x, conv(be_, x, conv_in_, same_pad(3)));  // [B, h, w, top]
  debug_tensor(dbg, prefix + ".conv_in", be_, x);
  ZI_ASSIGN_OR_RETURN(x, mid(be_, x, mid_, groups));  // [B, h, w, top]
  debug_tensor(dbg, prefix + ".mid", be_, x);
  for (size_t i = 0; i < up_.size(); ++i) {
    if (cancelled()) return Cancelled("generation cancelled during the VAE decode");
    for (const vae::Resnet& r : up_[i].resnets) {
      ZI_ASSIGN_OR_RETURN(x, resnet(be_, x, r, groups));
    }
    if (up_[i].has_resample) {
      ZI_ASSIGN_OR_RETURN(
          Tensor up, load::alloc(be_, be_.act_dtype(), {b, x.dim(1) * 2, x.dim(2) * 2, x.dim(3)},
                                 "vae upsample"));  // [B, 2H, 2W, C]
      ZI_TRY(be_.upsample_nearest2x(x, up));
      ZI_ASSIGN_OR_RETURN(x, conv(be_, up, up_[i].resample, same_pad(3)));  // [B, 2H, 2W, C]
    }
    debug_tensor(dbg, prefix + ".up." + std::to_string(i), be_, x);
  }
  if (cancelled()) return Cancelled("generation cancelled during the VAE decode");
  ZI_TRY(be_.group_norm(x, norm_out_.gamma, norm_out_.beta, groups, kGroupNormEps, true, x));
  ZI_ASSIGN_OR_RETURN(x, conv(be_, x, conv_out_, same_pad(3)));  // [B, H, W, 3]
  debug_tensor(dbg, prefix + ".conv_out", be_, x);
  return x;
}

Result<Tensor> VaeDecoder::postprocess(Tensor& x) {
  // image = clamp(x / 2 + 0.5, 0, 1) on the device in the compute dtype, as the reference
  // post-processes (x / 2 is exact; the + 0.5 rounds to bf16 in bf16).
  ZI_TRY(be_.axpby(0.5f, x, 0.0f, x, x));
  ZI_ASSIGN_OR_RETURN(Tensor half, load::alloc(be_, be_.act_dtype(), {1}, "vae 0.5"));
  ZI_TRY(be_.fill(half, 0.5f));
  ZI_TRY(be_.add(x, half, x));
  ZI_TRY(be_.clamp(x, 0.0f, 1.0f, x));
  Tensor img = Tensor::host(DType::kF32, x.shape());  // [B, H, W, 3]
  if (!img.defined()) return OutOfMemory("vae output image " + shape_string(x.shape()));
  ZI_TRY(be_.download(x, img));
  return img;
}

uint64_t VaeDecoder::estimate_decode_bytes(int64_t batch, int64_t h, int64_t w) const {
  return estimate_decode_bytes(cfg_, be_.act_dtype(), batch, h, w);
}

uint64_t VaeDecoder::estimate_decode_bytes(const VaeConfig& cfg, DType act, int64_t batch,
                                           int64_t h, int64_t w) {
  // Follows decode_scaled's allocations: which feature maps are alive together at each step.
  // Sizes in bytes as doubles (no overflow; the answer is an estimate).
  const auto& boc = cfg.block_out_channels;
  if (boc.empty() || batch < 1 || h < 1 || w < 1) return 0;
  const double es = static_cast<double>(dtype_size(act));
  double px = static_cast<double>(batch) * static_cast<double>(h) *
              static_cast<double>(w);  // pixels of the current stage, batch included
  const double lat = cfg.latent_channels;
  const auto fm = [&](double channels) { return px * channels * es; };  // one feature map
  double peak = px * lat * (4.0 + es);  // the f32 latents on the device and their NHWC copy
  const auto note = [&](double bytes) { peak = std::max(peak, bytes); };
  // resnet(x): x + GN(x) + conv1 out, then x + conv1 out + conv2 out (+ the shortcut's out).
  const auto resnet_peak = [&](double ci, double co) {
    return fm(ci) + std::max(fm(ci) + fm(co), fm(co) * (ci != co ? 3 : 2));
  };
  if (cfg.use_post_quant_conv) note(2 * fm(lat));
  const int n = static_cast<int>(boc.size());
  const double top = boc[n - 1];
  note(fm(lat) + fm(top));  // conv_in
  // mid: conv_in's output stays alive throughout (the caller's x).
  note(fm(top) + resnet_peak(top, top));
  if (cfg.mid_block_add_attention) note(fm(top) * 9);  // x, res0 out, GN, qkv (3), q, k, v
  double prev = top;
  for (int i = 0; i < n; ++i) {
    const double c = boc[n - 1 - i];
    for (int j = 0; j <= cfg.layers_per_block; ++j) note(resnet_peak(j == 0 ? prev : c, c));
    if (i < n - 1) {
      note(9 * fm(c));  // x, its nearest x2 upsample and the conv's output (4x each)
      px *= 4;
    }
    prev = c;
  }
  note(fm(boc[0]) + fm(cfg.out_channels));  // conv_out
  return static_cast<uint64_t>(peak);
}

// =============================== encoder ===============================

Result<std::unique_ptr<VaeEncoder>> VaeEncoder::load(const VaeConfig& cfg, const WeightStore& ws,
                                                     Backend& be) {
  ZI_TRY(validate(cfg));
  std::unique_ptr<VaeEncoder> m(new VaeEncoder(cfg, be));
  Status st = m->load_weights(ws);
  if (!st.ok()) return st.with_context("loading vae encoder");
  return m;
}

Status VaeEncoder::load_weights(const WeightStore& ws) {
  const Names nm(ws);
  const auto& boc = cfg_.block_out_channels;
  const int n = static_cast<int>(boc.size());
  const int64_t lat2 = 2 * static_cast<int64_t>(cfg_.latent_channels);
  ZI_ASSIGN_OR_RETURN(conv_in_,
                      load_conv(ws, be_, "encoder.conv_in.", cfg_.in_channels, boc[0], 3));
  down_.resize(n);
  int64_t prev = boc[0];
  for (int i = 0; i < n; ++i) {
    const int64_t out_c = boc[i];
    down_[i].resnets.resize(cfg_.layers_per_block);
    for (int j = 0; j < cfg_.layers_per_block; ++j) {
      ZI_ASSIGN_OR_RETURN(down_[i].resnets[j], load_resnet(ws, be_, nm, nm.down_resnet(i, j),
                                                           j == 0 ? prev : out_c, out_c));
    }
    down_[i].has_resample = i < n - 1;
    if (down_[i].has_resample) {
      ZI_ASSIGN_OR_RETURN(down_[i].resample,
                          load_conv(ws, be_, nm.downsampler(i), out_c, out_c, 3));
    }
    prev = out_c;
  }
  ZI_ASSIGN_OR_RETURN(mid_,
                      load_mid(ws, be_, nm, "encoder", boc[n - 1], cfg_.mid_block_add_attention));
  ZI_ASSIGN_OR_RETURN(norm_out_, load_norm(ws, be_, nm.norm_out("encoder"), boc[n - 1]));
  ZI_ASSIGN_OR_RETURN(conv_out_, load_conv(ws, be_, "encoder.conv_out.", boc[n - 1], lat2, 3));
  has_quant_ = cfg_.use_quant_conv;
  if (has_quant_) {
    ZI_ASSIGN_OR_RETURN(quant_, load_conv(ws, be_, "quant_conv.", lat2, lat2, 1));
  }
  return load::check_all_used(ws, "vae encoder", [](const std::string& s) {
    return s.rfind("decoder.", 0) == 0 || s.rfind("post_quant_conv.", 0) == 0;
  });
}

Status VaeEncoder::encode(const Tensor& image, Tensor& mean, Tensor& logvar, DebugSink* dbg) {
  const int64_t f = cfg_.spatial_factor(), lat = cfg_.latent_channels;
  if (!image.defined() || image.rank() != 4 || image.dim(3) != cfg_.in_channels ||
      image.dim(0) < 1 || image.dim(1) < f || image.dim(2) < f || image.dim(1) % f != 0 ||
      image.dim(2) % f != 0 || !dtype_is_float(image.dtype())) {
    return InvalidArgument("vae encode: image must be [B, H, W, " +
                           std::to_string(cfg_.in_channels) + "] with H, W multiples of " +
                           std::to_string(f) + ", got " +
                           (image.defined() ? image.describe() : std::string("undefined")));
  }
  const int groups = cfg_.norm_num_groups;
  Tensor x = image;  // [B, H, W, 3]
  if (image.dtype() != be_.act_dtype()) {
    ZI_ASSIGN_OR_RETURN(x, load::alloc(be_, be_.act_dtype(), image.shape(), "vae encode input"));
    ZI_TRY(be_.convert(image, x));
  }
  ZI_ASSIGN_OR_RETURN(x, conv(be_, x, conv_in_, same_pad(3)));  // [B, H, W, c0]
  Conv2dParams down;  // diffusers Downsample2D(padding=0): pad right/bottom by 1, stride 2
  down.stride = 2;
  down.pad_bottom = down.pad_right = 1;
  for (size_t i = 0; i < down_.size(); ++i) {
    for (const vae::Resnet& r : down_[i].resnets) {
      ZI_ASSIGN_OR_RETURN(x, resnet(be_, x, r, groups));
    }
    if (down_[i].has_resample) {
      ZI_ASSIGN_OR_RETURN(x, conv(be_, x, down_[i].resample, down));
    }
    debug_tensor(dbg, "vae_enc.down." + std::to_string(i), be_, x);
  }
  ZI_ASSIGN_OR_RETURN(x, mid(be_, x, mid_, groups));  // [B, h, w, top]
  debug_tensor(dbg, "vae_enc.mid", be_, x);
  ZI_TRY(be_.group_norm(x, norm_out_.gamma, norm_out_.beta, groups, kGroupNormEps, true, x));
  ZI_ASSIGN_OR_RETURN(x, conv(be_, x, conv_out_, same_pad(3)));  // [B, h, w, 2L]
  if (has_quant_) {
    ZI_ASSIGN_OR_RETURN(x, conv(be_, x, quant_, same_pad(1)));
  }

  const int64_t b = x.dim(0), h = x.dim(1), w = x.dim(2), rows = b * h * w;
  ZI_ASSIGN_OR_RETURN(Tensor m_tok, load::alloc(be_, be_.act_dtype(), {b, h * w, lat}, "vae mean"));
  ZI_ASSIGN_OR_RETURN(Tensor l_tok,
                      load::alloc(be_, be_.act_dtype(), {b, h * w, lat}, "vae logvar"));
  ZI_TRY(be_.copy_2d(x, 0, 2 * lat, m_tok, 0, lat, rows, lat));    // [B, h*w, L]
  ZI_TRY(be_.copy_2d(x, lat, 2 * lat, l_tok, 0, lat, rows, lat));  // [B, h*w, L]
  ZI_ASSIGN_OR_RETURN(mean, load::alloc(be_, DType::kF32, {b, lat, h, w}, "vae mean"));
  ZI_ASSIGN_OR_RETURN(Tensor lv, load::alloc(be_, DType::kF32, {b, lat, h, w}, "vae logvar"));
  ZI_TRY(be_.unpatchify(m_tok, 1, 1.0f, mean));  // [B, L, h, w]
  ZI_TRY(be_.unpatchify(l_tok, 1, 1.0f, lv));    // [B, L, h, w]
  // clamp(logvar, -30, 20) on the host (the backend has no clamp op; the tensor is small).
  Tensor host = Tensor::host(DType::kF32, lv.shape());  // [B, L, h, w]
  if (!host.defined()) return OutOfMemory("vae logvar host copy");
  ZI_TRY(be_.download(lv, host));
  float* lvh = host.data_as<float>();
  for (int64_t i = 0, n = host.numel(); i < n; ++i) lvh[i] = std::clamp(lvh[i], -30.0f, 20.0f);
  ZI_ASSIGN_OR_RETURN(logvar, load::upload_host(be_, host, DType::kF32));
  debug_tensor(dbg, "vae_enc.mean", be_, mean);
  return Status::Ok();
}

}  // namespace zimage
