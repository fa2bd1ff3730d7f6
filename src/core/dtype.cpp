#include "core/dtype.h"

#include <cmath>

namespace zimage {
namespace {

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace

size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF64:
    case DType::kI64:
      return 8;
    case DType::kF32:
    case DType::kI32:
      return 4;
    case DType::kF16:
    case DType::kBF16:
    case DType::kI16:
      return 2;
    case DType::kF8E4M3:
    case DType::kF8E5M2:
    case DType::kI8:
    case DType::kU8:
    case DType::kBool:
      return 1;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kF32:
      return "f32";
    case DType::kF16:
      return "f16";
    case DType::kBF16:
      return "bf16";
    case DType::kF8E4M3:
      return "f8_e4m3";
    case DType::kF8E5M2:
      return "f8_e5m2";
    case DType::kF64:
      return "f64";
    case DType::kI64:
      return "i64";
    case DType::kI32:
      return "i32";
    case DType::kI16:
      return "i16";
    case DType::kI8:
      return "i8";
    case DType::kU8:
      return "u8";
    case DType::kBool:
      return "bool";
  }
  return "?";
}

bool dtype_is_float(DType t) {
  return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16 || t == DType::kF8E4M3 ||
         t == DType::kF8E5M2 || t == DType::kF64;
}

std::optional<DType> dtype_from_safetensors(std::string_view s) {
  if (s == "F32") return DType::kF32;
  if (s == "F16") return DType::kF16;
  if (s == "BF16") return DType::kBF16;
  if (s == "F8_E4M3") return DType::kF8E4M3;
  if (s == "F8_E5M2") return DType::kF8E5M2;
  if (s == "F64") return DType::kF64;
  if (s == "I64") return DType::kI64;
  if (s == "I32") return DType::kI32;
  if (s == "I16") return DType::kI16;
  if (s == "I8") return DType::kI8;
  if (s == "U8") return DType::kU8;
  if (s == "BOOL") return DType::kBool;
  return std::nullopt;
}

const char* dtype_to_safetensors(DType t) {
  switch (t) {
    case DType::kF32:
      return "F32";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
    case DType::kF8E4M3:
      return "F8_E4M3";
    case DType::kF8E5M2:
      return "F8_E5M2";
    case DType::kF64:
      return "F64";
    case DType::kI64:
      return "I64";
    case DType::kI32:
      return "I32";
    case DType::kI16:
      return "I16";
    case DType::kI8:
      return "I8";
    case DType::kU8:
      return "U8";
    case DType::kBool:
      return "BOOL";
  }
  return "?";
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  float v;
  if (exp == 0) {
    v = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -v : v;
  }
  if (exp == 31) return float_of(sign | 0x7f800000u | (mant << 13));
  return float_of(sign | ((exp + 112) << 23) | (mant << 13));
}

uint16_t f32_to_f16(float f) {
  uint32_t x = bits_of(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  x &= 0x7fffffffu;
  if (x > 0x7f800000u) return sign | 0x7e00u;   // NaN
  if (x >= 0x477ff000u) return sign | 0x7c00u;  // rounds to infinity
  if (x < 0x38800000u) {                        // half subnormal (or zero)
    // Adding 0.5 puts the value's 2^-24 units in the low mantissa bits, rounded to nearest even.
    const float a = float_of(x) + 0.5f;
    return static_cast<uint16_t>(sign | (bits_of(a) - 0x3f000000u));
  }
  const uint32_t odd = (x >> 13) & 1u;
  x += (static_cast<uint32_t>(15 - 127) << 23) + 0xfffu + odd;
  return static_cast<uint16_t>(sign | (x >> 13));
}

namespace {

float f8e4m3_value(uint8_t v) {
  const bool neg = v & 0x80;
  const int exp = (v >> 3) & 0xf;
  const int mant = v & 7;
  float r;
  if (exp == 15 && mant == 7) return std::nanf("");
  if (exp == 0)
    r = std::ldexp(static_cast<float>(mant), -9);
  else
    r = std::ldexp(1.0f + mant / 8.0f, exp - 7);
  return neg ? -r : r;
}

// All 256 values, made once: a table lookup instead of ldexp per element (FP8 files widen
// billions of weights; ldexp made that tens of times slower).
struct Fp8Table {
  float e4m3[256];
  float e5m2[256];
  Fp8Table() {
    for (int i = 0; i < 256; ++i) {
      e4m3[i] = f8e4m3_value(static_cast<uint8_t>(i));
      e5m2[i] = f16_to_f32(static_cast<uint16_t>(i << 8));
    }
  }
};

const Fp8Table& fp8_table() {
  static const Fp8Table table;
  return table;
}

}  // namespace

float f8e4m3_to_f32(uint8_t v) {
  return fp8_table().e4m3[v];
}

uint8_t f32_to_f8e4m3(float f) {
  uint32_t x = bits_of(f);
  const uint32_t sign = x & 0x80000000u;
  x ^= sign;
  uint8_t r;
  if (x >= 0x43f00000u) {  // >= 480 (past the max 448 + half ulp) or NaN: NaN, as torch does
    r = 0x7f;
  } else if (x < (121u << 23)) {  // below 2^-6: subnormal in e4m3
    const float a = float_of(x) + float_of(141u << 23);
    r = static_cast<uint8_t>(bits_of(a) - (141u << 23));
  } else {
    const uint32_t odd = (x >> 20) & 1u;
    x += (static_cast<uint32_t>(7 - 127) << 23) + 0x7ffffu + odd;
    r = static_cast<uint8_t>(x >> 20);
  }
  return static_cast<uint8_t>(r | (sign >> 24));
}

float f8e5m2_to_f32(uint8_t v) {
  return fp8_table().e5m2[v];
}

uint8_t f32_to_f8e5m2(float f) {
  uint32_t x = bits_of(f);
  const uint32_t sign = x & 0x80000000u;
  x ^= sign;
  uint8_t r;
  if (x >= (143u << 23)) {  // overflow to infinity, NaN stays NaN
    r = x > 0x7f800000u ? 0x7f : 0x7c;
  } else if (x < (113u << 23)) {  // subnormal in e5m2
    const float a = float_of(x) + float_of(134u << 23);
    r = static_cast<uint8_t>(bits_of(a) - (134u << 23));
  } else {
    const uint32_t odd = (x >> 21) & 1u;
    x += (static_cast<uint32_t>(15 - 127) << 23) + 0xfffffu + odd;
    r = static_cast<uint8_t>(x >> 21);
  }
  return static_cast<uint8_t>(r | (sign >> 24));
}

bool convert_to_f32(DType from, const void* src, float* dst, size_t n) {
  switch (from) {
    case DType::kF32:
      std::memcpy(dst, src, n * 4);
      return true;
    case DType::kBF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
      return true;
    }
    case DType::kF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = f16_to_f32(s[i]);
      return true;
    }
    case DType::kF8E4M3: {
      const auto* s = static_cast<const uint8_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = f8e4m3_to_f32(s[i]);
      return true;
    }
    case DType::kF8E5M2: {
      const auto* s = static_cast<const uint8_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = f8e5m2_to_f32(s[i]);
      return true;
    }
    case DType::kF64: {
      const auto* s = static_cast<const double*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = static_cast<float>(s[i]);
      return true;
    }
    case DType::kI64: {
      const auto* s = static_cast<const int64_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = static_cast<float>(s[i]);
      return true;
    }
    case DType::kI32: {
      const auto* s = static_cast<const int32_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = static_cast<float>(s[i]);
      return true;
    }
    case DType::kI16: {
      const auto* s = static_cast<const int16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = static_cast<float>(s[i]);
      return true;
    }
    case DType::kI8: {
      const auto* s = static_cast<const int8_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = static_cast<float>(s[i]);
      return true;
    }
    case DType::kU8:
    case DType::kBool: {
      const auto* s = static_cast<const uint8_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = static_cast<float>(s[i]);
      return true;
    }
  }
  return false;
}

bool convert_from_f32(DType to, const float* src, void* dst, size_t n) {
  switch (to) {
    case DType::kF32:
      std::memcpy(dst, src, n * 4);
      return true;
    case DType::kBF16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = f32_to_bf16(src[i]);
      return true;
    }
    case DType::kF16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = f32_to_f16(src[i]);
      return true;
    }
    case DType::kF8E4M3: {
      auto* d = static_cast<uint8_t*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = f32_to_f8e4m3(src[i]);
      return true;
    }
    case DType::kF8E5M2: {
      auto* d = static_cast<uint8_t*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = f32_to_f8e5m2(src[i]);
      return true;
    }
    case DType::kF64: {
      auto* d = static_cast<double*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = src[i];
      return true;
    }
    case DType::kI32: {
      auto* d = static_cast<int32_t*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = static_cast<int32_t>(std::lrintf(src[i]));
      return true;
    }
    default:
      return false;
  }
}

}  // namespace zimage
