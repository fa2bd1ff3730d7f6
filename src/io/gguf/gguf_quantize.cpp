// See gguf_quantize.h. Block layouts as io/gguf/gguf_quants.h documents them (and dequantises them).
#include "io/gguf/gguf_quantize.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/dtype.h"

namespace zimage {
namespace {

constexpr int kQK = 256;

void put_half(uint8_t* p, float v) {
  const uint16_t h = f32_to_f16(v);
  std::memcpy(p, &h, 2);
}

float half_value(float v) {
  return f16_to_f32(f32_to_f16(v));
}

// gguf-py's np_roundf: round half away from zero, in float32 steps.
float roundf_ref(float n) {
  const float a = std::fabs(n);
  const float floored = std::floor(a);
  const float b = floored + std::floor(2.0f * (a - floored));
  return n > 0 ? b : (n < 0 ? -b : 0.0f * b);
}

int nearest(float v) {
  return static_cast<int>(std::lrintf(v));
}

void q8_0(const float* x, uint8_t* b) {
  float amax = 0.0f;
  for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float d = amax / 127.0f;
  const float id = d == 0.0f ? 0.0f : 1.0f / d;
  put_half(b, d);
  for (int i = 0; i < 32; ++i) {
    const float q = roundf_ref(x[i] * id);
    b[2 + i] = static_cast<uint8_t>(static_cast<int8_t>(q));
  }
}

void q4_0(const float* x, uint8_t* b) {
  int imax = 0;  // first index of the largest magnitude (numpy argmax)
  for (int i = 1; i < 32; ++i)
    if (std::fabs(x[i]) > std::fabs(x[imax])) imax = i;
  const float d = x[imax] / -8.0f;
  const float id = d == 0.0f ? 0.0f : 1.0f / d;
  put_half(b, d);
  uint8_t q[32];
  for (int i = 0; i < 32; ++i) {
    const float t = std::trunc(x[i] * id + 8.5f);
    q[i] = static_cast<uint8_t>(std::clamp(t, 0.0f, 15.0f));
  }
  for (int i = 0; i < 16; ++i) b[2 + i] = static_cast<uint8_t>(q[i] | (q[i + 16] << 4));
}

// Q4_K / Q5_K scales: the inverse of gguf_quants.cpp's k4_scale_min.
void pack_scale_min(uint8_t* s, const int* sc, const int* m) {
  std::memset(s, 0, 12);
  for (int g = 0; g < 4; ++g) {
    s[g] = static_cast<uint8_t>(sc[g] & 63);
    s[g + 4] = static_cast<uint8_t>(m[g] & 63);
  }
  for (int g = 4; g < 8; ++g) {
    s[g + 4] = static_cast<uint8_t>((sc[g] & 0x0F) | ((m[g] & 0x0F) << 4));
    s[g - 4] = static_cast<uint8_t>(s[g - 4] | ((sc[g] >> 4) << 6));
    s[g] = static_cast<uint8_t>(s[g] | ((m[g] >> 4) << 6));
  }
}

// Shared by Q4_K (levels 15) and Q5_K (levels 31): q[256] receives the quantised values.
void k_scale_min_quant(const float* x, int levels, uint8_t* head, int* q) {
  float scale[8], mins[8];
  float max_scale = 0.0f, max_min = 0.0f;
  for (int g = 0; g < 8; ++g) {
    float lo = x[g * 32], hi = x[g * 32];
    for (int l = 1; l < 32; ++l) {
      lo = std::min(lo, x[g * 32 + l]);
      hi = std::max(hi, x[g * 32 + l]);
    }
    mins[g] = lo < 0.0f ? -lo : 0.0f;
    scale[g] = (hi + mins[g]) / static_cast<float>(levels);
    max_scale = std::max(max_scale, scale[g]);
    max_min = std::max(max_min, mins[g]);
  }
  const float d = half_value(max_scale / 63.0f), dmin = half_value(max_min / 63.0f);
  put_half(head, d);
  put_half(head + 2, dmin);
  int sc[8], m[8];
  for (int g = 0; g < 8; ++g) {
    sc[g] = d > 0.0f ? std::clamp(nearest(scale[g] / d), 0, 63) : 0;
    m[g] = dmin > 0.0f ? std::clamp(nearest(mins[g] / dmin), 0, 63) : 0;
    const float dl = d * static_cast<float>(sc[g]);
    const float ml = dmin * static_cast<float>(m[g]);
    for (int l = 0; l < 32; ++l)
      q[g * 32 + l] = dl > 0.0f ? std::clamp(nearest((x[g * 32 + l] + ml) / dl), 0, levels) : 0;
  }
  pack_scale_min(head + 4, sc, m);
}

void q4_k(const float* x, uint8_t* b) {
  int q[kQK];
  k_scale_min_quant(x, 15, b, q);
  uint8_t* qs = b + 16;
  std::memset(qs, 0, 128);
  for (int g = 0; g < 8; ++g)
    for (int l = 0; l < 32; ++l)
      qs[(g / 2) * 32 + l] =
          static_cast<uint8_t>(qs[(g / 2) * 32 + l] | (q[g * 32 + l] << ((g % 2) * 4)));
}

void q5_k(const float* x, uint8_t* b) {
  int q[kQK];
  k_scale_min_quant(x, 31, b, q);
  uint8_t* qh = b + 16;
  uint8_t* qs = b + 48;
  std::memset(qh, 0, 32);
  std::memset(qs, 0, 128);
  for (int g = 0; g < 8; ++g) {
    for (int l = 0; l < 32; ++l) {
      const int v = q[g * 32 + l];
      qs[(g / 2) * 32 + l] =
          static_cast<uint8_t>(qs[(g / 2) * 32 + l] | ((v & 0x0F) << ((g % 2) * 4)));
      qh[l] = static_cast<uint8_t>(qh[l] | (((v >> 4) & 1) << g));
    }
  }
}

void q6_k(const float* x, uint8_t* b) {
  float scale[16], max_scale = 0.0f;
  for (int j = 0; j < 16; ++j) {
    float amax = 0.0f;
    for (int l = 0; l < 16; ++l) amax = std::max(amax, std::fabs(x[j * 16 + l]));
    scale[j] = amax / 31.0f;
    max_scale = std::max(max_scale, scale[j]);
  }
  const float d = half_value(max_scale / 127.0f);
  uint8_t* ql = b;
  uint8_t* qh = b + 128;
  auto* scales = reinterpret_cast<int8_t*>(b + 192);
  std::memset(b, 0, 208);
  put_half(b + 208, d);
  for (int j = 0; j < 16; ++j)
    scales[j] = static_cast<int8_t>(d > 0.0f ? std::clamp(nearest(scale[j] / d), 0, 127) : 0);
  for (int e = 0; e < kQK; ++e) {
    const float dl = d * static_cast<float>(scales[e / 16]);
    const int v = dl > 0.0f ? std::clamp(nearest(x[e] / dl) + 32, 0, 63) : 32;
    const int half = e / 128, quarter = (e % 128) / 32, l = e % 32;
    uint8_t& lo = ql[half * 64 + (quarter % 2) * 32 + l];
    lo = static_cast<uint8_t>(lo | ((v & 0x0F) << (quarter < 2 ? 0 : 4)));
    uint8_t& hi = qh[half * 32 + l];
    hi = static_cast<uint8_t>(hi | (((v >> 4) & 3) << (2 * quarter)));
  }
}

}  // namespace

bool ggml_can_quantize(GgmlType t) {
  switch (t) {
    case GgmlType::kF32:
    case GgmlType::kF16:
    case GgmlType::kBF16:
    case GgmlType::kQ8_0:
    case GgmlType::kQ4_0:
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K:
    case GgmlType::kQ6_K:
      return true;
    default:
      return false;
  }
}

bool quantize_row(GgmlType t, const float* src, void* dst, int64_t n) {
  uint64_t bytes = 0;
  if (!ggml_can_quantize(t) || !ggml_row_bytes(t, n, &bytes)) return false;
  auto* out = static_cast<uint8_t*>(dst);
  switch (t) {
    case GgmlType::kF32:
      std::memcpy(out, src, static_cast<size_t>(n) * 4);
      return true;
    case GgmlType::kF16:
    case GgmlType::kBF16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = t == GgmlType::kF16 ? f32_to_f16(src[i]) : f32_to_bf16(src[i]);
        std::memcpy(out + 2 * i, &h, 2);
      }
      return true;
    default:
      break;
  }
  const GgmlTypeInfo* info = ggml_type_info(t);
  const int64_t blocks = n / info->block_size;
  for (int64_t k = 0; k < blocks; ++k) {
    const float* x = src + k * info->block_size;
    uint8_t* b = out + k * info->type_size;
    switch (t) {
      case GgmlType::kQ8_0:
        q8_0(x, b);
        break;
      case GgmlType::kQ4_0:
        q4_0(x, b);
        break;
      case GgmlType::kQ4_K:
        q4_k(x, b);
        break;
      case GgmlType::kQ5_K:
        q5_k(x, b);
        break;
      case GgmlType::kQ6_K:
        q6_k(x, b);
        break;
      default:
        return false;
    }
  }
  return true;
}

}  // namespace zimage
