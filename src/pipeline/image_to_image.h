// Image-to-image and inpainting: what diffusers' ZImageImg2ImgPipeline and ZImageInpaintPipeline
// add to the text-to-image loop, reproduced operation for operation (model spec §8.4, §9). The
// loop itself is TextToImage's (begin / step / finish): a request with an init image starts part
// of the way down the same schedule from latents built here, and an inpainting request has its
// known region put back after every step. Everything here is float32 on the host, as the
// reference computes it on the CPU.
//
// Order of work and of the random draws, with ONE generator seeded with the request's seed:
//   1. image  = VaeImageProcessor.preprocess: PIL Lanczos resize to W x H when the size differs
//               (io/image/image_resize.h), /255, 2x - 1                        (dump "init_image")
//   2. schedule of N steps as text-to-image; t_start = int(max(N - min(N·strength, N), 0)) in
//      double; the loop runs steps t_start .. N-1
//   3. z = vae.encode(image): mean + exp(0.5·logvar)·randn([1, C, h, w])  draw 1
//      image_latents = (z - shift)·scale, repeated over the n images    (dump "image_latents")
//   4. noise = randn([n, C, h, w])                                       draw 2 (dump "init_noise")
//   5. latents = σ_start·noise + (1 - σ_start)·image_latents           (dump "init_latents")
//   inpainting also:
//   6. mask = mask processor: resize (in the mask's own channels), convert("L"), /255,
//      binarise (>= 0.5 -> 1)                                            (dump "mask_image")
//      mask_latent = F.interpolate(mask, (h, w), mode="nearest")        (dump "mask_latent")
//   7. masked_image_latents = the same encode of image·(mask < 0.5)      draw 3
//      diffusers computes it and never reads it; it is computed here only when a dump asks for
//      "masked_image_latents" (no draw follows it, so skipping it changes nothing else).
//   after Euler step k (scheduler index i):
//      known = i + 1 < N ? σ_{i+1}·noise + (1 - σ_{i+1})·image_latents : image_latents
//      latents = (1 - mask_latent)·known + mask_latent·latents
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "backend/backend.h"
#include "core/status.h"
#include "core/tensor.h"
#include "model/common/debug.h"
#include "model/vae/vae.h"
#include "pipeline/rng.h"
#include "pipeline/scheduler.h"
#include "zimage/zimage.h"

namespace zimage {

// The strength diffusers uses when none is given.
inline constexpr double kImg2ImgDefaultStrength = 0.6;  // ZImageImg2ImgPipeline
inline constexpr double kInpaintDefaultStrength = 1.0;  // ZImageInpaintPipeline

// effective_strength(req), the request's strength or these defaults, is public (zimage.h).

// VaeImageProcessor.preprocess of an RGB image for a width x height output: [1, height, width, 3]
// NHWC f32 in [-1, 1] on the host (the encoder's layout).
Result<Tensor> preprocess_image(const Image& image, int width, int height);
// The inpainting mask processor: [height * width] of 0 / 1 (1 = repaint).
Result<std::vector<float>> preprocess_mask(const Image& mask, int width, int height);
// F.interpolate(mask [1, 1, H, W], size=(h, w), mode="nearest") as PyTorch's CPU kernel indexes:
// source = min(floor(dst · (float)H / h), H - 1), exact for equal or doubled sizes.
std::vector<float> nearest_resize(const std::vector<float>& mask, int64_t H, int64_t W, int64_t h,
                                  int64_t w);
// FlowMatchEulerDiscreteScheduler.scale_noise: out = σ·noise + (1 - σ)·x, float32, each product
// and the sum rounded as PyTorch does.
void scale_noise(const float* x, const float* noise, float sigma, float* out, size_t n);

// What an inpainting request keeps for the blend after each step (n images, [n, C, h, w] / [h, w]).
struct InpaintLatents {
  std::vector<float> image_latents;  // [n, C, h, w]
  std::vector<float> noise;          // [n, C, h, w]
  std::vector<float> mask;           // [h, w], 1 = repaint (the same for every image)
};

// The start of an image-conditioned request (steps 1-7 above).
struct ImageStart {
  int first_step = 0;  // t_start
  Tensor latents;      // [n, C, h, w] f32 host: the loop's input
  std::optional<InpaintLatents> inpaint;
};

// Latent batch shape of the request.
struct LatentShape {
  int64_t n = 0, c = 0, h = 0, w = 0;
};

// Steps 1-7 for `req` (init_image set): `enc` runs on `be`; `gen` is the request's generator,
// fresh; `sched` its full schedule; `host` a CPU backend for dumps. Errors name the stage.
Result<ImageStart> prepare_image_start(const GenerateRequest& req,
                                       const FlowMatchEulerScheduler& sched, VaeEncoder& enc,
                                       Backend& be, TorchCpuGenerator& gen, const LatentShape& s,
                                       DebugSink* dbg, Backend& host);

// The blend after the Euler step at scheduler index `i` (0-based in the full schedule) on the
// host latents [n, C, h, w].
void inpaint_blend(const InpaintLatents& in, const FlowMatchEulerScheduler& sched, int i,
                   const LatentShape& s, float* latents);

}  // namespace zimage
