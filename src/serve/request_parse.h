// Request bodies (untrusted JSON) -> a validated JobSpec, before anything is queued. Why separate
// from the routes: it is the server's attack surface, so it is pure (no engine, no I/O, no clock,
// the random seed passed in) and fuzzed on its own (fuzz/fuzz_serve_request.cpp). Two dialects:
// the OpenAI Images API (+ the SGLang / vLLM-Omni extensions) and Automatic1111's txt2img, each
// also with an input image (OpenAI's edits, A1111's img2img).
// Every error is kInvalidArgument whose message starts with the client's field name
// ("num_inference_steps: -1 is outside 1..1000"), so the HTTP layer can fill "param".
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "zimage/request_check.h"
#include "zimage/status.h"
#include "zimage/zimage.h"

namespace zimage::serve {

enum class Dialect { kOpenAi, kA1111 };
enum class ResponseFormat { kB64Json, kUrl };
enum class OutputFormat { kPng, kJpeg, kWebp };

const char* format_name(OutputFormat f);  // "png", "jpeg", "webp"
const char* mime_type(OutputFormat f);    // "image/png", ...

struct ParseLimits {
  RequestLimits request;  // the engine's model-free checks (sizes, steps, batch, prompt bytes)
  int default_width = 1024;
  int default_height = 1024;
  int default_steps = 8;
};

// One job: one or more engine calls run one after the other (A1111's n_iter), each a batch.
struct JobSpec {
  Dialect dialect = Dialect::kOpenAi;
  std::vector<GenerateRequest> runs;  // >= 1; same prompt, size and steps; seeds may differ
  bool random_seed = false;           // the seed was drawn by the server
  ResponseFormat response_format = ResponseFormat::kB64Json;
  OutputFormat output_format = OutputFormat::kPng;
  int quality = 90;      // JPEG / WebP quality 0..100 (OpenAI's output_compression)
  bool preview = false;  // "preview": true, live previews from the first step (docs/SERVER.md)

  int images() const;       // total images over all runs
  int total_steps() const;  // denoising steps over all runs (fewer than steps with an init image)
};

// The OpenAI Images body (POST /v1/images/generations and POST /v1/jobs). `random_seed` is used
// when "seed" is absent, null or -1. Unknown fields are errors (typos must not pass silently),
// except OpenAI's own fields this server ignores (model, quality, style, user, ...).
Result<JobSpec> parse_openai(std::string_view body, const ParseLimits& limits,
                             uint64_t random_seed);

// The Automatic1111 body (POST /sdapi/v1/txt2img). Unknown fields are ignored (A1111 clients send
// dozens of sampler options this model has no use for); the known ones are checked strictly.
Result<JobSpec> parse_a1111(std::string_view body, const ParseLimits& limits, uint64_t random_seed);

// One part of a multipart/form-data body: a text field (empty filename) or a file.
struct FormPart {
  std::string name;
  std::string filename;
  std::string content;
};

// OpenAI's POST /v1/images/edits: the files "image" (one; "image[]" is accepted) and "mask"
// (optional: inpainting), the text fields of parse_openai (numbers as their decimal text) plus
// "strength" (0..1]; default 0.6 without a mask, 1.0 with one: diffusers' defaults). Without
// "size" (or with "auto") the output has the image's size rounded down to the size multiple.
// Mask convention: see request_images.h decode_openai_mask.
Result<JobSpec> parse_openai_edit(const std::vector<FormPart>& form, const ParseLimits& limits,
                                  uint64_t random_seed);

// Automatic1111's POST /sdapi/v1/img2img: init_images (one base64 image), mask (base64,
// optional), denoising_strength (default 0.75, A1111's; none with a ControlNet unit, ControlNet
// inpainting having no strength: a value sent then is refused), inpainting_mask_invert (0 / 1),
// resize_mode (0 only: "just resize", the image stretched to width x height with Lanczos), width
// and height (default: the image's size rounded down to the size multiple), and txt2img's
// fields. mask_blur, inpainting_fill, inpaint_full_res and other A1111 options are ignored.
Result<JobSpec> parse_a1111_img2img(std::string_view body, const ParseLimits& limits,
                                    uint64_t random_seed);

// An engine Status about a GenerateRequest field (Status::field() "guidance", message
// "guidance: ...") renamed to the client's field name in `dialect` ("guidance_scale: ..." /
// "cfg_scale: ...", field() the new name). Other statuses, and those whose message no longer
// starts with the field (a context put before it), pass unchanged.
Status rename_fields(const Status& st, Dialect dialect);

}  // namespace zimage::serve
