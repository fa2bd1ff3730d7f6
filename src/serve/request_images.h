// Image inputs of the server's image-to-image / inpainting requests (untrusted bytes): base64
// text, the images themselves and the two mask conventions clients use. Pure, like
// request_parse.h (no engine, no I/O). Errors are kInvalidArgument starting with the client's
// field name ("mask: not a PNG, JPEG or WebP file ...").
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "zimage/status.h"
#include "zimage/zimage.h"

namespace zimage::serve {

// Standard base64 (RFC 4648), padding optional, line breaks and spaces ignored, an optional
// "data:<type>;base64," prefix (what browsers' FileReader produce) dropped. Any other byte is
// an error naming `field`.
Result<std::vector<uint8_t>> base64_decode(std::string_view text, const std::string& field);

// A PNG / JPEG / WebP as the engine reads files (zimage::image_decode: orientation applied,
// converted to RGB).
Result<Image> decode_request_image(const std::vector<uint8_t>& bytes, const std::string& field);

// OpenAI's /v1/images/edits mask: with an alpha channel, the fully transparent pixels (alpha 0)
// are repainted and every other pixel kept; without one, white (>= 128 after conversion to
// gray) is repainted, as in diffusers. Returned as the engine's mask (RGB, white = repaint).
Result<Image> decode_openai_mask(const std::vector<uint8_t>& bytes, const std::string& field);

// Automatic1111's img2img mask: an image with an alpha channel that is not fully opaque gives its
// alpha (> 128 -> repaint); otherwise the image converted to gray, white = repaint. `invert`
// (inpainting_mask_invert = 1) swaps the two.
Result<Image> decode_a1111_mask(const std::vector<uint8_t>& bytes, const std::string& field,
                                bool invert);

// The output size diffusers gives an image when none is asked for: each side rounded down to a
// multiple of `multiple`. Error (naming `field`) when a side would be 0.
Status default_size(const Image& image, int multiple, const std::string& field, int* width,
                    int* height);

}  // namespace zimage::serve
