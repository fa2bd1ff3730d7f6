// Image-to-image and inpainting arithmetic (see image_to_image.h), written to be read next to
// pipeline_z_image_img2img.py / pipeline_z_image_inpaint.py and VaeImageProcessor.
#include "pipeline/image_to_image.h"

#include <algorithm>
#include <cmath>
#include <new>
#include <string>

#include "io/image/image_read.h"
#include "io/image/image_resize.h"
#include "model/common/load_util.h"
#include "pipeline/host_dump.h"

namespace zimage {
namespace {

Result<Image8> as_image8(const Image& img, const char* field) {
  const int64_t want = int64_t{img.width} * img.height * 3;
  if (img.width < 1 || img.height < 1 || static_cast<int64_t>(img.rgb.size()) != want)
    return FieldError(field, std::to_string(img.width) + "x" + std::to_string(img.height) +
                                 " needs " + std::to_string(want) + " RGB bytes, has " +
                                 std::to_string(img.rgb.size()));
  Image8 out;
  out.width = img.width;
  out.height = img.height;
  out.channels = 3;
  out.pixels = img.rgb;
  return out;
}

// NHWC [1, H, W, 3] -> NCHW [1, 3, H, W] (diffusers' layout, for the dump).
std::vector<float> to_nchw(const Tensor& nhwc) {
  const int64_t H = nhwc.dim(1), W = nhwc.dim(2), C = nhwc.dim(3);
  std::vector<float> out(static_cast<size_t>(H * W * C));
  const float* p = nhwc.data_as<float>();
  for (int64_t y = 0; y < H; ++y)
    for (int64_t x = 0; x < W; ++x)
      for (int64_t c = 0; c < C; ++c)
        out[static_cast<size_t>((c * H + y) * W + x)] = p[(y * W + x) * C + c];
  return out;
}

// vae.encode(image).latent_dist.sample(gen), then (z - shift)·scale: [1, C, h, w] on the host.
// Draws one randn of the posterior's shape from `gen`.
Result<std::vector<float>> encode_sample(VaeEncoder& enc, Backend& be, const Tensor& image_nhwc,
                                         TorchCpuGenerator& gen, DebugSink* dbg,
                                         const std::string& prefix, Backend& host) {
  ZI_ASSIGN_OR_RETURN(Tensor dev, load::upload_host(be, image_nhwc, DType::kF32));
  Tensor mean, logvar;
  ZI_TRY(enc.encode(dev, mean, logvar, dbg));
  Tensor m = Tensor::host(DType::kF32, mean.shape());
  Tensor lv = Tensor::host(DType::kF32, logvar.shape());
  if (!m.defined() || !lv.defined()) return OutOfMemory("vae encode: host copies");
  ZI_TRY(be.download(mean, m));
  ZI_TRY(be.download(logvar, lv));
  dump_host(dbg, host, prefix + "vae_mean", m.data_as<float>(), m.shape());
  dump_host(dbg, host, prefix + "vae_logvar", lv.data_as<float>(), lv.shape());
  ZI_ASSIGN_OR_RETURN(Tensor eps, gen.randn(m.shape()));
  const VaeConfig& cfg = enc.config();
  const size_t n = static_cast<size_t>(m.numel());
  std::vector<float> z(n);
  const float* mp = m.data_as<float>();
  const float* lp = lv.data_as<float>();
  const float* ep = eps.data_as<float>();
  for (size_t k = 0; k < n; ++k) {
    // DiagonalGaussianDistribution: std = exp(0.5·logvar); sample = mean + std·eps.
    const float half = 0.5f * lp[k];
    const float sd = std::exp(half);
    const float se = sd * ep[k];
    const float x = mp[k] + se;
    // (image_latents - shift_factor) * scaling_factor
    const float shifted = x - cfg.shift_factor;
    z[k] = shifted * cfg.scaling_factor;
  }
  return z;
}

// [1, C, h, w] repeated n times (torch.cat([latents] * n)).
std::vector<float> repeat(const std::vector<float>& one, int64_t n) {
  std::vector<float> out;
  out.reserve(one.size() * static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out.insert(out.end(), one.begin(), one.end());
  return out;
}

}  // namespace

double effective_strength(const GenerateRequest& req) {
  if (req.strength) return *req.strength;
  return req.mask ? kInpaintDefaultStrength : kImg2ImgDefaultStrength;
}

Result<Tensor> preprocess_image(const Image& image, int width, int height) {
  ZI_ASSIGN_OR_RETURN(Image8 rgb, as_image8(image, "init_image"));
  ZI_ASSIGN_OR_RETURN(Image8 sized, resize_lanczos(rgb, width, height));
  Tensor t = Tensor::host(DType::kF32, {1, height, width, 3});
  if (!t.defined())
    return OutOfMemory("init_image: the preprocessed image").with_field("init_image");
  float* p = t.data_as<float>();
  for (size_t k = 0; k < sized.pixels.size(); ++k) {
    // np.array(img).astype(np.float32) / 255.0, then 2.0 * x - 1.0, in float32.
    const float u = static_cast<float>(sized.pixels[k]) / 255.0f;
    const float two_u = 2.0f * u;
    p[k] = two_u - 1.0f;
  }
  return t;
}

Result<std::vector<float>> preprocess_mask(const Image& mask, int width, int height) {
  ZI_ASSIGN_OR_RETURN(Image8 rgb, as_image8(mask, "mask"));
  // As the mask processor: resize first (in the mask's RGB), then convert("L").
  ZI_ASSIGN_OR_RETURN(Image8 sized, resize_lanczos(rgb, width, height));
  const Image8 gray = to_gray(sized);
  std::vector<float> out(gray.pixels.size());
  for (size_t k = 0; k < out.size(); ++k) {
    const float v = static_cast<float>(gray.pixels[k]) / 255.0f;
    out[k] = v < 0.5f ? 0.0f : 1.0f;  // binarize: < 0.5 -> 0, >= 0.5 -> 1
  }
  return out;
}

std::vector<float> nearest_resize(const std::vector<float>& mask, int64_t H, int64_t W, int64_t h,
                                  int64_t w) {
  const auto index = [](int64_t o, int64_t in, int64_t out) -> int64_t {
    if (out == in) return o;
    if (out == 2 * in) return o >> 1;
    const float scale = static_cast<float>(in) / static_cast<float>(out);
    return std::min(static_cast<int64_t>(std::floor(static_cast<float>(o) * scale)), in - 1);
  };
  std::vector<float> out(static_cast<size_t>(h * w));
  for (int64_t y = 0; y < h; ++y)
    for (int64_t x = 0; x < w; ++x)
      out[static_cast<size_t>(y * w + x)] =
          mask[static_cast<size_t>(index(y, H, h) * W + index(x, W, w))];
  return out;
}

void scale_noise(const float* x, const float* noise, float sigma, float* out, size_t n) {
  const float keep = 1.0f - sigma;
  for (size_t k = 0; k < n; ++k) {
    const float a = sigma * noise[k];
    const float b = keep * x[k];
    out[k] = a + b;
  }
}

Result<ImageStart> prepare_image_start(const GenerateRequest& req,
                                       const FlowMatchEulerScheduler& sched, VaeEncoder& enc,
                                       Backend& be, TorchCpuGenerator& gen, const LatentShape& s,
                                       DebugSink* dbg, Backend& host) {
  if (!req.init_image) return FieldError("init_image", "missing");
  try {
    ImageStart out;
    ZI_ASSIGN_OR_RETURN(out.first_step, img2img_start_index(req.steps, effective_strength(req)));
    // 1. The image as the VAE sees it.
    ZI_ASSIGN_OR_RETURN(Tensor image, preprocess_image(*req.init_image, req.width, req.height));
    if (dbg != nullptr && dbg->wants("init_image")) {
      const std::vector<float> nchw = to_nchw(image);
      dump_host(dbg, host, "init_image", nchw.data(), {1, 3, req.height, req.width});
    }
    // 3. Draw 1: the image's posterior sample.
    auto one = encode_sample(enc, be, image, gen, dbg, "", host);
    if (!one.ok())
      return one.status().with_context("init_image: vae encode").with_field("init_image");
    if (static_cast<int64_t>(one->size()) != s.c * s.h * s.w)
      return InternalError("vae encode: " + std::to_string(one->size()) +
                           " latent values, expected " + std::to_string(s.c * s.h * s.w));
    std::vector<float> image_latents = repeat(*one, s.n);
    const Shape shape{s.n, s.c, s.h, s.w};
    dump_host(dbg, host, "image_latents", image_latents.data(), shape);
    // 4. Draw 2: the noise.
    ZI_TRY(gen.skip_images(req.first_image, s.c * s.h * s.w));  // a part of a larger batch
    ZI_ASSIGN_OR_RETURN(Tensor noise, gen.randn(shape));
    dump_host(dbg, host, "init_noise", noise.data_as<float>(), shape);
    // 5. The start latents at σ of the first step run.
    out.latents = Tensor::host(DType::kF32, shape);
    if (!out.latents.defined()) return OutOfMemory("init latents");
    const float sigma = sched.sigmas()[static_cast<size_t>(out.first_step)];
    scale_noise(image_latents.data(), noise.data_as<float>(), sigma, out.latents.data_as<float>(),
                image_latents.size());
    dump_host(dbg, host, "init_latents", out.latents.data_as<float>(), shape);
    if (!req.mask) return out;

    // 6. The mask, at pixel and latent size.
    ZI_ASSIGN_OR_RETURN(std::vector<float> mask, preprocess_mask(*req.mask, req.width, req.height));
    dump_host(dbg, host, "mask_image", mask.data(), {1, 1, req.height, req.width});
    InpaintLatents inp;
    inp.mask = nearest_resize(mask, req.height, req.width, s.h, s.w);
    if (dbg != nullptr && dbg->wants("mask_latent")) {
      const std::vector<float> all = repeat(inp.mask, s.n);
      dump_host(dbg, host, "mask_latent", all.data(), {s.n, 1, s.h, s.w});
    }
    // 7. Draw 3, only for a dump: the masked image's latents, which the loop never reads.
    if (dbg != nullptr && dbg->wants("masked_image_latents")) {
      float* px = image.data_as<float>();
      for (int64_t p = 0; p < int64_t{req.width} * req.height; ++p)
        for (int c = 0; c < 3; ++c) px[p * 3 + c] = px[p * 3 + c] * (mask[p] < 0.5f ? 1.0f : 0.0f);
      auto masked = encode_sample(enc, be, image, gen, nullptr, "masked_", host);
      if (!masked.ok()) return masked.status().with_context("masked image: vae encode");
      const std::vector<float> all = repeat(*masked, s.n);
      dump_host(dbg, host, "masked_image_latents", all.data(), shape);
    }
    inp.image_latents = std::move(image_latents);
    inp.noise.assign(noise.data_as<float>(), noise.data_as<float>() + noise.numel());
    out.inpaint = std::move(inp);
    return out;
  } catch (const std::bad_alloc&) {
    return OutOfMemory("image-to-image start latents");
  }
}

void inpaint_blend(const InpaintLatents& in, const FlowMatchEulerScheduler& sched, int i,
                   const LatentShape& s, float* latents) {
  const size_t plane = static_cast<size_t>(s.h * s.w);
  const size_t total = static_cast<size_t>(s.n * s.c) * plane;
  const bool last = i + 1 >= sched.num_steps();
  const float sigma = sched.sigmas()[static_cast<size_t>(i) + 1];
  const float keep = 1.0f - sigma;
  for (size_t k = 0; k < total; ++k) {
    const float x0 = in.image_latents[k];
    float known = x0;
    if (!last) {  // scheduler.scale_noise(image_latents, timesteps[i + 1], noise)
      const float a = sigma * in.noise[k];
      const float b = keep * x0;
      known = a + b;
    }
    const float m = in.mask[k % plane];
    // (1 - mask) * init_latents_proper + mask * latents
    const float inv = 1.0f - m;
    const float kept = inv * known;
    const float fresh = m * latents[k];
    latents[k] = kept + fresh;
  }
}

}  // namespace zimage
