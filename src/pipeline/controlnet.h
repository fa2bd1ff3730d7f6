// ControlNet requests (diffusers' ZImageControlNetPipeline and ZImageControlNetInpaintPipeline,
// model/adapters/zimage_controlnet.h): what they add to the text-to-image loop is the control context, made
// once per request here; every denoising step then runs the ControlNet on the step's DiT input
// and hands its residuals to the DiT (TextToImage::step).
//
// The control context, float32 on the host, as the pipelines build it:
//   control = VaeImageProcessor.preprocess(control_image, height, width): PIL Lanczos resize to
//             W x H when the size differs (io/image/image_resize.h), /255, 2x - 1   (dump
//             "control_image")
//   z_c     = (vae.encode(control).mode() - shift)·scale: the posterior MEAN ("argmax": no
//             generator draw, so the noise is the text-to-image noise of the seed)
//   text-to-image: [z_c ; zeros] up to control_in_dim channels (2.x: 16 + 17 zero channels)
//   inpainting (2.x only; 1.0 has no mask channels, diffusers refuses it):
//     mask    = the inpainting mask processor (resize, convert("L"), binarise at 0.5)
//     z_i     = (vae.encode(init_image · (mask < 0.5)).mode() - shift)·scale
//     m       = F.interpolate(1 - mask, (h, w), mode="nearest")
//     context = [z_c ; m ; z_i]                                   (16 + 1 + 16 = 33 channels)
//   repeated over the request's n images                          (dump "control_context")
// The loop is the text-to-image one: no strength, no per-step blend (the inpainting is the
// ControlNet's work), the DiT's pos and neg rows under CFG get the same context.
#pragma once

#include "backend/backend.h"
#include "core/status.h"
#include "core/tensor.h"
#include "model/common/debug.h"
#include "model/vae/vae.h"
#include "pipeline/image_to_image.h"
#include "zimage/zimage.h"

namespace zimage {

// The control context [n, control_in_dim, h, w] f32 on the host for `req` (control_image set;
// init_image and mask too for ControlNet inpainting). The encoder runs on `be`; `host` is a CPU
// backend for dumps. Errors name the input ("control_image: ...").
Result<Tensor> prepare_control_context(const GenerateRequest& req, int control_in_dim,
                                       VaeEncoder& enc, Backend& be, const LatentShape& s,
                                       DebugSink* dbg, Backend& host);

}  // namespace zimage
