// Strict UTF-8 validation shared by everything that takes text from outside (requests, PNG
// metadata): overlong forms, surrogates, code points past U+10FFFF and truncated sequences are
// all rejected. (The tokenizer keeps its own decoder, which also implements lossy decoding.)
#pragma once

#include <cstddef>
#include <string_view>

namespace zimage {

inline constexpr size_t kUtf8Valid = static_cast<size_t>(-1);

// Offset of the first byte that does not begin a well-formed sequence, or kUtf8Valid.
// NUL bytes are valid UTF-8; callers that refuse them check separately.
size_t utf8_error_offset(std::string_view s);

}  // namespace zimage
