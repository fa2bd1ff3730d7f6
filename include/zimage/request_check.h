// Range checks of a GenerateRequest that do not depend on the loaded model's weights: every
// numeric field, the batch size, the prompt texts (byte cap, valid UTF-8, no NUL). Why separate:
// the server validates a whole job before queueing it (docs/reliability.md, "Requests"), and the
// checks must be testable without a model. Each error is a FieldError: kInvalidArgument naming
// the field, in its message and in Status::field().
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "zimage/status.h"
#include "zimage/zimage.h"

namespace zimage {

struct RequestLimits {
  int size_multiple = 16;  // width and height must be multiples of this
  int max_side = 4096;
  int64_t max_pixels = int64_t{4096} * 4096;  // width * height * images
  int max_batch = 16;                         // prompts * images_per_prompt
  size_t max_prompt_bytes = 16384;
  int max_steps = 1000;
  int max_sequence_length = 512;
};

// Image inputs (init_image, mask): each side >= 1, at most this many pixels (as the file reader,
// io/image/image_read.h kMaxInputPixels), the RGB buffer of the right length.
inline constexpr int64_t kMaxInputImagePixels = int64_t{1} << 26;

Status check_request(const GenerateRequest& req, const RequestLimits& limits);

// The float fields' ranges: one rule for every entry point. check_request applies them; the CLI
// flags (`zimage generate`, `zimage submit`) and the server's and the worker's JSON parsers
// (serve/request_parse.h) check the value as given with check_number before narrowing it to a
// float, so 1e39 is out of range rather than infinity.
inline constexpr double kMinGuidance = 0.0;  // guidance (guidance_scale, cfg_scale, --guidance)
inline constexpr double kMaxGuidance = 100.0;
inline constexpr double kMaxControlScale = 100.0;  // control_scale in -100..100
// cfg_truncation and cfg_normalization: finite; cfg_normalization >= 0. strength: (0, 1].

// `v` finite and in [min, max], else kInvalidArgument naming `field`: "<field>: must be a finite
// number, got nan" or "<field>: 150 is outside 0..100" (%g).
Status check_number(const std::string& field, double v, double min, double max);

// The image-conditioned fields alone (check_request runs it last): mask and strength need
// init_image; the images are well formed; the mask has init_image's size; strength is in (0, 1]
// and leaves at least one of the steps.
Status check_image_inputs(const GenerateRequest& req);

// Empty when `text` is valid UTF-8 with no NUL byte (no overlongs, surrogates or code points past
// U+10FFFF); else what is wrong and at which byte offset.
std::string text_problem(std::string_view text);

}  // namespace zimage
