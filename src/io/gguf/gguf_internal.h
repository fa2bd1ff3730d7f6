// Helpers shared by the GGUF parser (gguf.cpp) and the file's accessors (gguf_file.cpp): value
// type sizes and little-endian loads from bytes the caller has bounds-checked.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "io/gguf/gguf.h"
#include "io/fs/json_util.h"

namespace zimage::gguf_detail {

inline std::string in_quotes(std::string_view s) {
  std::string out(1, '\'');
  out += json_util::printable(std::string(s));
  out += '\'';
  return out;
}

inline bool known_value_type(uint32_t t) {
  return t <= static_cast<uint32_t>(GgufType::kF64);
}

// Bytes of a fixed-size value type; 0 for string and array.
inline uint64_t fixed_size(GgufType t) {
  switch (t) {
    case GgufType::kU8:
    case GgufType::kI8:
    case GgufType::kBool:
      return 1;
    case GgufType::kU16:
    case GgufType::kI16:
      return 2;
    case GgufType::kU32:
    case GgufType::kI32:
    case GgufType::kF32:
      return 4;
    case GgufType::kU64:
    case GgufType::kI64:
    case GgufType::kF64:
      return 8;
    default:
      return 0;
  }
}

inline bool is_integer(GgufType t) {
  switch (t) {
    case GgufType::kU8:
    case GgufType::kI8:
    case GgufType::kU16:
    case GgufType::kI16:
    case GgufType::kU32:
    case GgufType::kI32:
    case GgufType::kU64:
    case GgufType::kI64:
      return true;
    default:
      return false;
  }
}

inline bool is_signed(GgufType t) {
  return t == GgufType::kI8 || t == GgufType::kI16 || t == GgufType::kI32 || t == GgufType::kI64;
}

// Little-endian loads from a pointer already bounds-checked by the caller.
inline uint64_t load_uint(const uint8_t* p, uint64_t n) {
  uint64_t v = 0;
  for (uint64_t k = 0; k < n; ++k) v |= static_cast<uint64_t>(p[k]) << (8 * k);
  return v;
}

inline int64_t load_int(const uint8_t* p, uint64_t n) {
  const uint64_t u = load_uint(p, n);
  if (n == 8) return static_cast<int64_t>(u);
  const uint64_t sign = uint64_t{1} << (8 * n - 1);
  return static_cast<int64_t>((u ^ sign) - sign);  // sign-extend
}

inline double load_float(const uint8_t* p, GgufType t) {
  if (t == GgufType::kF32) {
    const uint32_t u = static_cast<uint32_t>(load_uint(p, 4));
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  const uint64_t u = load_uint(p, 8);
  double d;
  std::memcpy(&d, &u, 8);
  return d;
}

}  // namespace zimage::gguf_detail
