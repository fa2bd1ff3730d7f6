// ggml block types: geometry table and the CPU dequantisation (the oracle). See gguf_quants.h for
// the layouts. Each block function turns one block into block_size floats; the element order and
// the float32 operation order follow the format definitions exactly (no fused multiply-add: the
// build uses ISO C++ mode, where GCC does not contract, and x86-64 without -mfma has no FMA).
#include "io/gguf/gguf_quants.h"

#include <algorithm>
#include <cstring>

#include "core/dtype.h"
#include "core/thread_pool.h"

namespace zimage {
namespace {

constexpr int64_t kQK = 256;  // k-quant super-block

// id -> geometry; nullptr name = not a ggml type.
struct TypeRow {
  uint32_t id;
  GgmlTypeInfo info;
};
constexpr TypeRow kTypes[] = {
    {0, {"F32", 1, 4, true}},          {1, {"F16", 1, 2, true}},
    {2, {"Q4_0", 32, 18, true}},       {3, {"Q4_1", 32, 20, true}},
    {6, {"Q5_0", 32, 22, true}},       {7, {"Q5_1", 32, 24, true}},
    {8, {"Q8_0", 32, 34, true}},       {9, {"Q8_1", 32, 36, false}},
    {10, {"Q2_K", kQK, 84, true}},     {11, {"Q3_K", kQK, 110, true}},
    {12, {"Q4_K", kQK, 144, true}},    {13, {"Q5_K", kQK, 176, true}},
    {14, {"Q6_K", kQK, 210, true}},    {15, {"Q8_K", kQK, 292, false}},
    {16, {"IQ2_XXS", kQK, 66, false}}, {17, {"IQ2_XS", kQK, 74, false}},
    {18, {"IQ3_XXS", kQK, 98, false}}, {19, {"IQ1_S", kQK, 50, false}},
    {20, {"IQ4_NL", 32, 18, false}},   {21, {"IQ3_S", kQK, 110, false}},
    {22, {"IQ2_S", kQK, 82, false}},   {23, {"IQ4_XS", kQK, 136, false}},
    {24, {"I8", 1, 1, false}},         {25, {"I16", 1, 2, false}},
    {26, {"I32", 1, 4, false}},        {27, {"I64", 1, 8, false}},
    {28, {"F64", 1, 8, false}},        {29, {"IQ1_M", kQK, 56, false}},
    {30, {"BF16", 1, 2, true}},        {34, {"TQ1_0", kQK, 54, false}},
    {35, {"TQ2_0", kQK, 66, false}},   {39, {"MXFP4", 32, 17, false}},
    {40, {"NVFP4", 64, 36, false}},    {41, {"Q1_0", 128, 18, false}},
};

inline float half_at(const uint8_t* p) {
  return f16_to_f32(static_cast<uint16_t>(p[0] | (p[1] << 8)));
}

inline uint32_t u32_at(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
         (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24);
}

// ---- 32-element blocks ----

void block_q4_0(const uint8_t* b, float* y) {
  const float d = half_at(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    y[j] = static_cast<float>((qs[j] & 0x0F) - 8) * d;
    y[j + 16] = static_cast<float>((qs[j] >> 4) - 8) * d;
  }
}

void block_q4_1(const uint8_t* b, float* y) {
  const float d = half_at(b), m = half_at(b + 2);
  const uint8_t* qs = b + 4;
  for (int j = 0; j < 16; ++j) {
    y[j] = static_cast<float>(qs[j] & 0x0F) * d + m;
    y[j + 16] = static_cast<float>(qs[j] >> 4) * d + m;
  }
}

void block_q5_0(const uint8_t* b, float* y) {
  const float d = half_at(b);
  const uint32_t qh = u32_at(b + 2);
  const uint8_t* qs = b + 6;
  for (int j = 0; j < 16; ++j) {
    const int h0 = static_cast<int>((qh >> j) & 1u) << 4;
    const int h1 = static_cast<int>((qh >> (j + 16)) & 1u) << 4;
    y[j] = static_cast<float>(((qs[j] & 0x0F) | h0) - 16) * d;
    y[j + 16] = static_cast<float>(((qs[j] >> 4) | h1) - 16) * d;
  }
}

void block_q5_1(const uint8_t* b, float* y) {
  const float d = half_at(b), m = half_at(b + 2);
  const uint32_t qh = u32_at(b + 4);
  const uint8_t* qs = b + 8;
  for (int j = 0; j < 16; ++j) {
    const int h0 = static_cast<int>((qh >> j) & 1u) << 4;
    const int h1 = static_cast<int>((qh >> (j + 16)) & 1u) << 4;
    y[j] = static_cast<float>((qs[j] & 0x0F) | h0) * d + m;
    y[j + 16] = static_cast<float>((qs[j] >> 4) | h1) * d + m;
  }
}

void block_q8_0(const uint8_t* b, float* y) {
  const float d = half_at(b);
  for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(static_cast<int8_t>(b[2 + j])) * d;
}

// ---- 256-element k-quant super-blocks ----

void block_q2_k(const uint8_t* b, float* y) {
  const uint8_t* scales = b;
  const uint8_t* qs = b + 16;
  const float d = half_at(b + 80), dmin = half_at(b + 82);
  // Element e: 2-bit field (e % 128) / 32 of byte qs[(e / 128) * 32 + e % 32]; group e / 16.
  for (int e = 0; e < kQK; ++e) {
    const int sc = scales[e / 16];
    const float dl = d * static_cast<float>(sc & 0x0F);
    const float ml = dmin * static_cast<float>(sc >> 4);
    const int q = (qs[(e / 128) * 32 + e % 32] >> (2 * ((e % 128) / 32))) & 3;
    y[e] = dl * static_cast<float>(q) - ml;
  }
}

// The sixteen 6-bit scales of Q3_K: low 4 bits are the nibbles of bytes 0..7 (groups 0-7 low
// nibbles, groups 8-15 high nibbles), the top 2 bits come from bytes 8..11.
inline int q3k_scale(const uint8_t* scales, int s) {
  const int lo = s < 8 ? (scales[s] & 0x0F) : (scales[s - 8] >> 4);
  const int hi = (scales[8 + s % 4] >> (2 * (s / 4))) & 3;
  return lo | (hi << 4);
}

void block_q3_k(const uint8_t* b, float* y) {
  const uint8_t* hmask = b;
  const uint8_t* qs = b + 32;
  const uint8_t* scales = b + 96;
  const float d = half_at(b + 108);
  for (int s = 0; s < 16; ++s) {
    const float dl = d * static_cast<float>(q3k_scale(scales, s) - 32);
    for (int i = 0; i < 16; ++i) {
      const int e = s * 16 + i;
      const int l = e % 32;
      const int low = (qs[(e / 128) * 32 + l] >> (2 * ((e % 128) / 32))) & 3;
      const int high = (hmask[l] >> (e / 32)) & 1;  // set: no offset; clear: -4
      y[e] = dl * static_cast<float>(low - (high ? 0 : 4));
    }
  }
}

// Q4_K / Q5_K: scale and min of group g (0..7), 6 bits each, packed in 12 bytes.
inline void k4_scale_min(const uint8_t* q, int g, int* sc, int* m) {
  if (g < 4) {
    *sc = q[g] & 63;
    *m = q[g + 4] & 63;
  } else {
    *sc = (q[g + 4] & 0x0F) | ((q[g - 4] >> 6) << 4);
    *m = (q[g + 4] >> 4) | ((q[g] >> 6) << 4);
  }
}

void block_q4_k(const uint8_t* b, float* y) {
  const float d = half_at(b), dmin = half_at(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qs = b + 16;
  // Groups of 32: group g reads the low (even g) or high (odd g) nibbles of qs[(g/2)*32 ...].
  for (int g = 0; g < 8; ++g) {
    int sc = 0, m = 0;
    k4_scale_min(scales, g, &sc, &m);
    const float dl = d * static_cast<float>(sc);
    const float ml = dmin * static_cast<float>(m);
    const uint8_t* q = qs + (g / 2) * 32;
    const int shift = (g % 2) * 4;
    for (int l = 0; l < 32; ++l)
      y[g * 32 + l] = dl * static_cast<float>((q[l] >> shift) & 0x0F) - ml;
  }
}

void block_q5_k(const uint8_t* b, float* y) {
  const float d = half_at(b), dmin = half_at(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* qs = b + 48;
  for (int g = 0; g < 8; ++g) {
    int sc = 0, m = 0;
    k4_scale_min(scales, g, &sc, &m);
    const float dl = d * static_cast<float>(sc);
    const float ml = dmin * static_cast<float>(m);
    const uint8_t* q = qs + (g / 2) * 32;
    const int shift = (g % 2) * 4;
    for (int l = 0; l < 32; ++l) {
      const int v = ((q[l] >> shift) & 0x0F) | (((qh[l] >> g) & 1) << 4);
      y[g * 32 + l] = dl * static_cast<float>(v) - ml;
    }
  }
}

void block_q6_k(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* scales = reinterpret_cast<const int8_t*>(b + 192);
  const float d = half_at(b + 208);
  // Element e = half*128 + quarter*32 + l: low nibble (quarter 0, 1) or high nibble (2, 3) of
  // ql[half*64 + (quarter%2)*32 + l], two high bits from qh[half*32 + l] >> 2*quarter.
  for (int e = 0; e < kQK; ++e) {
    const int half = e / 128, quarter = (e % 128) / 32, l = e % 32;
    const int lo = (ql[half * 64 + (quarter % 2) * 32 + l] >> (quarter < 2 ? 0 : 4)) & 0x0F;
    const int hi = (qh[half * 32 + l] >> (2 * quarter)) & 3;
    const float dl = d * static_cast<float>(scales[e / 16]);
    y[e] = dl * static_cast<float>((lo | (hi << 4)) - 32);
  }
}

using BlockFn = void (*)(const uint8_t*, float*);

BlockFn block_fn(GgmlType t) {
  switch (t) {
    case GgmlType::kQ4_0:
      return block_q4_0;
    case GgmlType::kQ4_1:
      return block_q4_1;
    case GgmlType::kQ5_0:
      return block_q5_0;
    case GgmlType::kQ5_1:
      return block_q5_1;
    case GgmlType::kQ8_0:
      return block_q8_0;
    case GgmlType::kQ2_K:
      return block_q2_k;
    case GgmlType::kQ3_K:
      return block_q3_k;
    case GgmlType::kQ4_K:
      return block_q4_k;
    case GgmlType::kQ5_K:
      return block_q5_k;
    case GgmlType::kQ6_K:
      return block_q6_k;
    default:
      return nullptr;
  }
}

}  // namespace

const GgmlTypeInfo* ggml_type_info(uint32_t id) {
  for (const TypeRow& r : kTypes)
    if (r.id == id) return &r.info;
  return nullptr;
}

std::string ggml_type_name(uint32_t id) {
  const GgmlTypeInfo* i = ggml_type_info(id);
  return i ? std::string(i->name) : "type " + std::to_string(id);
}

std::string ggml_dequantizable_type_list() {
  std::string out;
  for (const TypeRow& r : kTypes) {
    if (!r.info.dequantizable) continue;
    if (!out.empty()) out += ", ";
    out += r.info.name;
  }
  return out;
}

bool ggml_type_is_quantized(GgmlType t) {
  const GgmlTypeInfo* i = ggml_type_info(t);
  return i && i->block_size > 1;
}

bool ggml_row_bytes(GgmlType t, int64_t n, uint64_t* bytes) {
  const GgmlTypeInfo* i = ggml_type_info(t);
  if (!i || n < 0 || n % i->block_size != 0) return false;
  uint64_t out = 0;
  if (__builtin_mul_overflow(static_cast<uint64_t>(n / i->block_size),
                             static_cast<uint64_t>(i->type_size), &out)) {
    return false;
  }
  *bytes = out;
  return true;
}

bool dequantize_row(GgmlType t, const void* src, float* dst, int64_t n) {
  const GgmlTypeInfo* info = ggml_type_info(t);
  if (!info || !info->dequantizable || n < 0 || n % info->block_size != 0) return false;
  const auto* s = static_cast<const uint8_t*>(src);
  switch (t) {
    case GgmlType::kF32:
      std::memcpy(dst, s, static_cast<size_t>(n) * 4);
      return true;
    case GgmlType::kF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = half_at(s + 2 * i);
      return true;
    case GgmlType::kBF16:
      for (int64_t i = 0; i < n; ++i)
        dst[i] = bf16_to_f32(static_cast<uint16_t>(s[2 * i] | (s[2 * i + 1] << 8)));
      return true;
    default:
      break;
  }
  const BlockFn fn = block_fn(t);
  if (!fn) return false;
  const int64_t blocks = n / info->block_size;
  for (int64_t b = 0; b < blocks; ++b) fn(s + b * info->type_size, dst + b * info->block_size);
  return true;
}

bool dequantize_rows(GgmlType t, const void* src, float* dst, int64_t rows, int64_t cols,
                     ThreadPool* pool) {
  uint64_t row_bytes = 0;
  const GgmlTypeInfo* info = ggml_type_info(t);
  if (!info || !info->dequantizable || rows < 0 || !ggml_row_bytes(t, cols, &row_bytes))
    return false;
  const auto* s = static_cast<const uint8_t*>(src);
  auto run = [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) dequantize_row(t, s + r * row_bytes, dst + r * cols, cols);
  };
  constexpr int64_t kGrainElems = 1 << 16;  // below this a thread costs more than it saves
  if (!pool || rows * cols < 2 * kGrainElems || rows < 2) {
    run(0, rows);
    return true;
  }
  const int64_t grain = std::max<int64_t>(1, kGrainElems / std::max<int64_t>(cols, 1));
  pool->parallel_for(rows, grain, run);
  return true;
}

}  // namespace zimage
