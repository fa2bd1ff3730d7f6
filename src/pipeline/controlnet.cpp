// The control context of a ControlNet request (see controlnet.h), written to be read next to
// pipeline_z_image_controlnet.py / pipeline_z_image_controlnet_inpaint.py.
#include "pipeline/controlnet.h"

#include <new>
#include <string>
#include <vector>

#include "io/image/image_resize.h"
#include "model/common/load_util.h"
#include "pipeline/host_dump.h"

namespace zimage {
namespace {

// (vae.encode(image).latent_dist.mode() - shift)·scale: [C, h, w] on the host.
Result<std::vector<float>> encode_mode(VaeEncoder& enc, Backend& be, const Tensor& image_nhwc) {
  ZI_ASSIGN_OR_RETURN(Tensor dev, load::upload_host(be, image_nhwc, DType::kF32));
  Tensor mean, logvar;
  ZI_TRY(enc.encode(dev, mean, logvar, nullptr));
  Tensor m = Tensor::host(DType::kF32, mean.shape());
  if (!m.defined()) return OutOfMemory("vae encode: host copy");
  ZI_TRY(be.download(mean, m));
  const VaeConfig& cfg = enc.config();
  std::vector<float> z(static_cast<size_t>(m.numel()));
  const float* mp = m.data_as<float>();
  for (size_t k = 0; k < z.size(); ++k) {
    const float shifted = mp[k] - cfg.shift_factor;
    z[k] = shifted * cfg.scaling_factor;
  }
  return z;
}

}  // namespace

Result<Tensor> prepare_control_context(const GenerateRequest& req, int control_in_dim,
                                       VaeEncoder& enc, Backend& be, const LatentShape& s,
                                       DebugSink* dbg, Backend& host) {
  if (!req.control_image) return FieldError("control_image", "missing");
  try {
    const int64_t plane = s.h * s.w, ch = s.c;
    const int64_t need = req.mask ? 2 * ch + 1 : ch;
    if (control_in_dim < need)
      return InvalidArgument(std::string(req.mask ? "mask: ControlNet inpainting needs a "
                                                    "ControlNet with mask channels (2.x, 33 "
                                                    "control channels); this one has "
                                                  : "controlnet: ") +
                             std::to_string(control_in_dim) + " control channels");
    // 1. The control image as the VAE sees it, then its latents (the posterior mean).
    ZI_ASSIGN_OR_RETURN(Tensor control,
                        preprocess_image(*req.control_image, req.width, req.height));
    if (dbg != nullptr && dbg->wants("control_image")) {
      std::vector<float> nchw(static_cast<size_t>(3 * req.width * req.height));
      const float* p = control.data_as<float>();
      const int64_t px = int64_t{req.width} * req.height;
      for (int64_t k = 0; k < px; ++k)
        for (int c = 0; c < 3; ++c) nchw[static_cast<size_t>(c * px + k)] = p[k * 3 + c];
      dump_host(dbg, host, "control_image", nchw.data(), {1, 3, req.height, req.width});
    }
    auto zc = encode_mode(enc, be, control);
    if (!zc.ok())
      return zc.status().with_context("control_image: vae encode").with_field("control_image");
    if (static_cast<int64_t>(zc->size()) != ch * plane)
      return InternalError("control_image: " + std::to_string(zc->size()) +
                           " latent values, expected " + std::to_string(ch * plane));
    std::vector<float> one(static_cast<size_t>(control_in_dim * plane), 0.0f);
    std::copy(zc->begin(), zc->end(), one.begin());
    // 2. ControlNet inpainting: 1 - mask at latent size, then the masked image's latents.
    if (req.mask) {
      if (!req.init_image) return FieldError("mask", "ControlNet inpainting needs init_image");
      ZI_ASSIGN_OR_RETURN(std::vector<float> mask,
                          preprocess_mask(*req.mask, req.width, req.height));
      ZI_ASSIGN_OR_RETURN(Tensor init, preprocess_image(*req.init_image, req.width, req.height));
      float* px = init.data_as<float>();
      for (int64_t p = 0; p < int64_t{req.width} * req.height; ++p)
        for (int c = 0; c < 3; ++c) px[p * 3 + c] = px[p * 3 + c] * (mask[p] < 0.5f ? 1.0f : 0.0f);
      std::vector<float> keep(mask.size());
      for (size_t k = 0; k < mask.size(); ++k) keep[k] = 1.0f - mask[k];
      const std::vector<float> m = nearest_resize(keep, req.height, req.width, s.h, s.w);
      std::copy(m.begin(), m.end(), one.begin() + ch * plane);
      auto zi = encode_mode(enc, be, init);
      if (!zi.ok())
        return zi.status().with_context("init_image: vae encode").with_field("init_image");
      std::copy(zi->begin(), zi->end(), one.begin() + (ch + 1) * plane);
    }
    Tensor out = Tensor::host(DType::kF32, {s.n, control_in_dim, s.h, s.w});
    if (!out.defined()) return OutOfMemory("control context");
    for (int64_t i = 0; i < s.n; ++i)
      std::copy(one.begin(), one.end(), out.data_as<float>() + i * control_in_dim * plane);
    dump_host(dbg, host, "control_context", out.data_as<float>(), out.shape());
    return out;
  } catch (const std::bad_alloc&) {
    return OutOfMemory("control context");
  }
}

}  // namespace zimage
