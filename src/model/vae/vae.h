// The AutoencoderKL of Z-Image (spec §8), decoder and encoder, for any consistent
// block_out_channels / layers_per_block (spatial factor 2^(len-1)). Feature maps are NHWC on
// the backend; the public edges take / return the pipeline's layouts (latents NCHW f32, image
// NHWC). Accepts diffusers names and the LDM / BFL names of `ae.safetensors` (spec §8.5).
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/status.h"
#include "io/model/model_config.h"
#include "io/weights/weights.h"
#include "model/common/debug.h"

namespace zimage {

namespace vae {

struct Conv {
  Tensor w;  // [cout, k, k, cin] (OHWI)
  Tensor b;  // [cout]
  int64_t cin = 0, cout = 0, k = 0;
};
struct Norm {
  Tensor gamma, beta;  // [C]
};
struct Resnet {
  Norm norm1, norm2;
  Conv conv1, conv2;
  bool has_shortcut = false;
  Conv shortcut;  // 1x1, only when cin != cout
};
struct Attention {  // single head over all channels, with a residual
  Norm norm;
  Tensor wqkv, bqkv;  // [3C, C], [3C]: q rows, k rows, v rows
  Tensor wo, bo;      // [C, C], [C]
  int64_t c = 0;
};
struct Mid {
  Resnet res0, res1;
  bool has_attn = true;
  Attention attn;
};
struct Stage {  // one up_block (decoder) or down_block (encoder)
  std::vector<Resnet> resnets;
  bool has_resample = false;
  Conv resample;  // upsampler conv (after nearest x2) or downsampler conv (stride 2)
};

}  // namespace vae

class VaeDecoder {
 public:
  static Result<std::unique_ptr<VaeDecoder>> load(const VaeConfig& cfg, const WeightStore& ws,
                                                  Backend& be);
  // latents [B, latent_channels, h, w] f32 on the backend (the pipeline's latents). Applies
  // z = latents / scaling + shift, decodes, and returns the image [B, H, W, out_channels] f32 in
  // [0, 1] (clamp(x/2 + 0.5, 0, 1), spec §8.6) on the host; H = h * spatial_factor.
  // Intermediates: vae.conv_in, vae.mid, vae.up.<i>, vae.conv_out. `cancel` is polled between
  // the blocks: when it reads true, decode() stops with kCancelled.
  Result<Tensor> decode(const Tensor& latents, DebugSink* dbg = nullptr,
                        const std::atomic<bool>* cancel = nullptr);
  // decode() as 8-bit colours made on the backend (Backend::image_to_rgb8): to_u8 of decode()'s
  // image, byte for byte, as a host kU8 [B, H, W, out_channels]. `nonfinite` (required) gets how
  // many of the decoder's raw outputs were NaN or ±Inf (those bytes read 0): where decode()'s
  // image would hold NaN.
  Result<Tensor> decode_rgb8(const Tensor& latents, int64_t* nonfinite, DebugSink* dbg = nullptr,
                             const std::atomic<bool>* cancel = nullptr);
  const VaeConfig& config() const { return cfg_; }
  Backend& backend() const { return be_; }

  // decode() in three pieces, for the tiled decode (model/vae/vae_tiling.h), which scales once,
  // decodes crops of the scaled latents and blends the raw outputs before post-processing.
  // scale_latents: latents as decode() takes them -> z = latents / scaling + shift, host f32
  // [B, C, h, w] (float32 arithmetic, as the reference pipeline).
  Result<Tensor> scale_latents(const Tensor& latents) const;
  // The decoder proper on a scaled host f32 [B, C, h, w]: its raw output [B, H, W, out_channels]
  // in the act dtype on the backend (before x/2 + 0.5 and the clamp). Intermediates are named
  // `<prefix>.conv_in`, `<prefix>.mid`, `<prefix>.up.<i>`, `<prefix>.conv_out`.
  Result<Tensor> decode_scaled(const Tensor& z_host, DebugSink* dbg,
                               const std::atomic<bool>* cancel, const std::string& prefix = "vae");
  // clamp(x/2 + 0.5, 0, 1) in the act dtype on the backend (x is overwritten), downloaded as a
  // host f32 tensor of x's shape.
  Result<Tensor> postprocess(Tensor& x);

  // Bytes of activations the untiled decode of a [batch, C, h, w] latent holds at its peak: the
  // feature maps alive together at the most expensive step (a resnet or upsampler at the largest
  // stage), in the backend's act dtype. Excludes weights, convolution workspaces and the
  // attention's score buffer (bounded by the backends: 64 MiB CPU, 256 MiB CUDA).
  uint64_t estimate_decode_bytes(int64_t batch, int64_t h, int64_t w) const;
  // The same from the config alone (for the memory planner, before the VAE is loaded).
  static uint64_t estimate_decode_bytes(const VaeConfig& cfg, DType act, int64_t batch, int64_t h,
                                        int64_t w);

 private:
  VaeDecoder(const VaeConfig& cfg, Backend& be) : cfg_(cfg), be_(be) {}
  Status load_weights(const WeightStore& ws);

  VaeConfig cfg_;
  Backend& be_;
  bool has_post_quant_ = false;
  vae::Conv post_quant_, conv_in_, conv_out_;
  vae::Mid mid_;
  std::vector<vae::Stage> up_;  // diffusers order: up_blocks.0 works at the lowest resolution
  vae::Norm norm_out_;
};

class VaeEncoder {
 public:
  static Result<std::unique_ptr<VaeEncoder>> load(const VaeConfig& cfg, const WeightStore& ws,
                                                  Backend& be);
  // image [B, H, W, in_channels] in [-1, 1] on the backend (f32 or act dtype), H and W multiples
  // of spatial_factor -> mean, logvar [B, latent_channels, H/f, W/f] f32 on the backend
  // (logvar clamped to [-30, 20]). Both outputs are (re)assigned.
  Status encode(const Tensor& image, Tensor& mean, Tensor& logvar, DebugSink* dbg = nullptr);
  const VaeConfig& config() const { return cfg_; }

 private:
  VaeEncoder(const VaeConfig& cfg, Backend& be) : cfg_(cfg), be_(be) {}
  Status load_weights(const WeightStore& ws);

  VaeConfig cfg_;
  Backend& be_;
  vae::Conv conv_in_, conv_out_;
  std::vector<vae::Stage> down_;
  vae::Mid mid_;
  vae::Norm norm_out_;
  bool has_quant_ = false;
  vae::Conv quant_;
};

}  // namespace zimage
