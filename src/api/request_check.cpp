// GenerateRequest range checks (see request_check.h). Messages start with the field name so a
// client can tell which input to fix: "steps: 0 is outside 1..1000".
#include "zimage/request_check.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "core/utf8.h"
#include "pipeline/image_to_image.h"
#include "pipeline/scheduler.h"

namespace zimage {

std::string text_problem(std::string_view s) {
  const size_t nul = s.find('\0');
  if (nul != std::string_view::npos) return "contains a NUL byte at offset " + std::to_string(nul);
  const size_t bad = utf8_error_offset(s);
  if (bad == kUtf8Valid) return "";
  char hex[8];
  std::snprintf(hex, sizeof(hex), "0x%02X", static_cast<unsigned char>(s[bad]));
  return std::string("is not valid UTF-8 (sequence starting with byte ") + hex + " at offset " +
         std::to_string(bad) + ")";
}

namespace {

Status check_text(const std::string& field, const std::string& text, size_t max_bytes) {
  if (text.size() > max_bytes)
    return FieldError(field, std::to_string(text.size()) + " bytes exceeds the " +
                                 std::to_string(max_bytes) + "-byte limit");
  const std::string problem = text_problem(text);
  if (!problem.empty()) return FieldError(field, problem);
  return Status::Ok();
}

Status check_input_image(const char* field, const Image& img) {
  const std::string f(field);
  if (img.width < 1 || img.height < 1)
    return FieldError(
        f, "empty image (" + std::to_string(img.width) + "x" + std::to_string(img.height) + ")");
  const int64_t pixels = int64_t{img.width} * img.height;
  if (pixels > kMaxInputImagePixels)
    return FieldError(f, std::to_string(img.width) + "x" + std::to_string(img.height) +
                             " exceeds the limit of " + std::to_string(kMaxInputImagePixels) +
                             " pixels");
  if (static_cast<int64_t>(img.rgb.size()) != pixels * 3)
    return FieldError(f, std::to_string(img.width) + "x" + std::to_string(img.height) + " needs " +
                             std::to_string(pixels * 3) + " RGB bytes, has " +
                             std::to_string(img.rgb.size()));
  return Status::Ok();
}

Status check_side(const char* field, int v, const RequestLimits& lim) {
  const std::string f(field);
  if (v <= 0) return FieldError(f, "must be positive, got " + std::to_string(v));
  if (v > lim.max_side)
    return FieldError(f, std::to_string(v) + " exceeds the limit " + std::to_string(lim.max_side));
  if (lim.size_multiple > 0 && v % lim.size_multiple != 0)
    return FieldError(
        f, std::to_string(v) + " is not a multiple of " + std::to_string(lim.size_multiple) +
               " (try " + std::to_string(std::max(1, v / lim.size_multiple) * lim.size_multiple) +
               ")");
  return Status::Ok();
}

}  // namespace

Status check_number(const std::string& field, double v, double min, double max) {
  char buf[160];
  if (!std::isfinite(v)) {
    std::snprintf(buf, sizeof(buf), "%g", v);
    return FieldError(field, std::string("must be a finite number, got ") + buf);
  }
  if (v < min || v > max) {
    std::snprintf(buf, sizeof(buf), "%g is outside %g..%g", v, min, max);
    return FieldError(field, buf);
  }
  return Status::Ok();
}

Status check_request(const GenerateRequest& req, const RequestLimits& lim) {
  if (req.prompts.empty()) return FieldError("prompts", "at least one prompt is needed");
  if (static_cast<int64_t>(req.prompts.size()) > lim.max_batch)  // before any per-prompt work
    return FieldError("prompts", std::to_string(req.prompts.size()) +
                                     " prompts exceed the batch limit " +
                                     std::to_string(lim.max_batch));
  for (size_t i = 0; i < req.prompts.size(); ++i)
    ZI_TRY(check_text("prompts[" + std::to_string(i) + "]", req.prompts[i], lim.max_prompt_bytes));
  if (req.negative_prompt)
    ZI_TRY(check_text("negative_prompt", *req.negative_prompt, lim.max_prompt_bytes));
  if (req.loras.size() > 16)
    return FieldError("loras", std::to_string(req.loras.size()) + " LoRAs, at most 16");
  for (size_t i = 0; i < req.loras.size(); ++i) {
    const std::string field = "loras[" + std::to_string(i) + "]";
    if (req.loras[i].path.empty()) return FieldError(field, "no LoRA file given");
    if (!std::isfinite(req.loras[i].scale))
      return FieldError(field, "scale is not a finite number");
  }
  ZI_TRY(check_side("width", req.width, lim));
  ZI_TRY(check_side("height", req.height, lim));
  if (req.steps < 1 || req.steps > lim.max_steps)
    return FieldError(
        "steps", std::to_string(req.steps) + " is outside 1.." + std::to_string(lim.max_steps));
  ZI_TRY(check_number("guidance", req.guidance, kMinGuidance, kMaxGuidance));
  if (req.images_per_prompt < 1)
    return FieldError("images_per_prompt",
                      "must be at least 1, got " + std::to_string(req.images_per_prompt));
  const int64_t batch = static_cast<int64_t>(req.prompts.size()) * req.images_per_prompt;
  if (batch > lim.max_batch)  // the prompt count alone fits (checked above)
    return FieldError("images_per_prompt",
                      std::to_string(req.prompts.size()) + " prompt(s) x " +
                          std::to_string(req.images_per_prompt) + " = " + std::to_string(batch) +
                          " images exceeds the batch limit " + std::to_string(lim.max_batch));
  const int64_t pixels = int64_t{req.width} * req.height * batch;
  if (pixels > lim.max_pixels)
    return FieldError("width", std::to_string(req.width) + "x" + std::to_string(req.height) +
                                   " x " + std::to_string(batch) +
                                   " images exceeds the pixel limit " +
                                   std::to_string(lim.max_pixels));
  if (req.first_image < 0 || req.first_image > 1024)
    return FieldError("first_image", std::to_string(req.first_image) + " is outside 0..1024");
  if (!std::isfinite(req.cfg_truncation)) return FieldError("cfg_truncation", "must be finite");
  if (!std::isfinite(req.cfg_normalization) || req.cfg_normalization < 0.0f)
    return FieldError("cfg_normalization",
                      "must be a finite number >= 0, got " + std::to_string(req.cfg_normalization));
  if (req.max_sequence_length < 1 || req.max_sequence_length > lim.max_sequence_length)
    return FieldError("max_sequence_length", std::to_string(req.max_sequence_length) +
                                                 " is outside 1.." +
                                                 std::to_string(lim.max_sequence_length));
  return check_image_inputs(req);
}

Status check_image_inputs(const GenerateRequest& req) {
  if (req.control_image) {
    ZI_TRY(check_input_image("control_image", *req.control_image));
    ZI_TRY(check_number("control_scale", req.control_scale, -kMaxControlScale, kMaxControlScale));
  }
  if (!req.init_image) {
    if (req.mask) return FieldError("mask", "needs an init_image to inpaint");
    if (req.strength) return FieldError("strength", "needs an init_image");
    return Status::Ok();
  }
  ZI_TRY(check_input_image("init_image", *req.init_image));
  if (req.mask) {
    ZI_TRY(check_input_image("mask", *req.mask));
    if (req.mask->width != req.init_image->width || req.mask->height != req.init_image->height)
      return FieldError(
          "mask", std::to_string(req.mask->width) + "x" + std::to_string(req.mask->height) +
                      " differs from the image's " + std::to_string(req.init_image->width) + "x" +
                      std::to_string(req.init_image->height) +
                      "; the mask must have the image's size");
  }
  if (req.strength) {
    const double s = *req.strength;
    if (!std::isfinite(s) || !(s > 0.0) || s > 1.0) {
      char buf[64];
      std::snprintf(buf, sizeof(buf), "%g", s);
      return FieldError("strength", std::string("must be in (0, 1], got ") + buf);
    }
    // int(steps - steps * strength) must leave a step (as diffusers' check after get_timesteps).
    if (req.steps >= 1 && !img2img_start_index(req.steps, s).ok()) {
      char buf[64];
      std::snprintf(buf, sizeof(buf), "%g", s);
      return FieldError("strength", std::string(buf) + " of " + std::to_string(req.steps) +
                                        " steps leaves no denoising step");
    }
  }
  return Status::Ok();
}

int denoising_steps(const GenerateRequest& req) {
  if (!req.init_image) return req.steps;
  auto start = img2img_start_index(req.steps, effective_strength(req));
  return start.ok() ? req.steps - *start : 0;
}

}  // namespace zimage
