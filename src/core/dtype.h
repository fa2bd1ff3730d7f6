// Element types and scalar conversions between them. The conversions are exact where the
// target can represent the value and round-to-nearest-even otherwise, matching PyTorch's
// `.to(dtype)` (bf16/f16/fp8 e4m3fn/e5m2 with saturation rules as torch implements them).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace zimage {

enum class DType : uint8_t {
  kF32,
  kF16,
  kBF16,
  kF8E4M3,  // float8_e4m3fn: no infinities, 0x7f/0xff are NaN, max 448
  kF8E5M2,  // float8_e5m2: IEEE-like, max 57344
  kF64,
  kI64,
  kI32,
  kI16,
  kI8,
  kU8,
  kBool,
};

size_t dtype_size(DType t);
const char* dtype_name(DType t);  // "f32", "bf16", ...
bool dtype_is_float(DType t);
// safetensors spellings: "F32", "BF16", "F8_E4M3", ...
std::optional<DType> dtype_from_safetensors(std::string_view s);
const char* dtype_to_safetensors(DType t);

inline float bf16_to_f32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}

// Rounds a float to the nearest bf16 value and back: the effect of a bf16 cast point.
inline float round_bf16(float f) {
  return bf16_to_f32(f32_to_bf16(f));
}

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);
float f8e4m3_to_f32(uint8_t v);
uint8_t f32_to_f8e4m3(float f);
float f8e5m2_to_f32(uint8_t v);
uint8_t f32_to_f8e5m2(float f);

// Converts n elements of type `from` at `src` to float32 at `dst`. Integer types convert
// by value. Returns false for types with no float meaning (never for the ones above).
bool convert_to_f32(DType from, const void* src, float* dst, size_t n);
// Converts n floats to `to` at `dst` (rounding as described above).
bool convert_from_f32(DType to, const float* src, void* dst, size_t n);

}  // namespace zimage
