// Images as bytes for HTTP: PNG (with the same text chunks `zimage generate` writes), JPEG through
// libjpeg-turbo and WebP through libwebp, plus base64 for JSON bodies. Why here: encoding is the
// server's concern (the engine hands back RGB8), and one place keeps the metadata identical to
// the CLI's (tested: ServeCli.SeededImageMatchesCli compares both files' chunks).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "serve/request_parse.h"
#include "zimage/zimage.h"

namespace zimage::serve {

// Encodes `image` in `format`; `quality` (0..100) for JPEG and WebP; `text` only for PNG.
Result<std::vector<uint8_t>> encode_image(const Image& image, OutputFormat format, int quality,
                                          const PngTextChunks& text);

// Standard base64 (RFC 4648, with padding).
std::string base64_encode(const std::vector<uint8_t>& bytes);

}  // namespace zimage::serve
