// ggml tensor types as GGUF files store them: the block geometry of every type ggml knows (so a
// reader can size any tensor) and the dequantisation of the types zimage reads (the CPU oracle
// the CUDA kernels are tested against).
//
// A quantised row of n elements is n / block_size blocks of type_size bytes. The layouts, written
// from the format definitions (ggml-common.h's block structs, "QK_K" = 256 for the k-quants):
//   Q4_0  [d f16][16 B: 32 nibbles]            x = (q - 8) * d
//   Q4_1  [d f16][m f16][16 B]                 x = q * d + m
//   Q5_0  [d f16][qh u32][16 B]                x = (q | hbit << 4) - 16) * d
//   Q5_1  [d f16][m f16][qh u32][16 B]         x = (q | hbit << 4) * d + m
//   Q8_0  [d f16][32 x i8]                     x = q * d
//   Q2_K  [scales 16][qs 64][d f16][dmin f16]  16 groups of 16: x = d*sc * q - dmin*m (sc, m 4 bit)
//   Q3_K  [hmask 32][qs 64][scales 12][d f16]  16 groups of 16: x = d*(sc - 32) * (q - 4*!hbit)
//   Q4_K  [d f16][dmin f16][scales 12][qs 128] 8 groups of 32, 6-bit sc/m: x = d*sc*q - dmin*m
//   Q5_K  [d f16][dmin f16][scales 12][qh 32][qs 128]  as Q4_K with a fifth bit
//   Q6_K  [ql 128][qh 64][scales 16 x i8][d f16]       16 groups of 16: x = d*sc * (q - 32)
// Every product and difference is one float32 operation in the order above (no fused
// multiply-add), so the result equals the gguf Python package's numpy dequantisation bit for bit.
#pragma once

#include <cstdint>
#include <string>

#include "io/gguf/ggml_types.h"

namespace zimage {

class ThreadPool;  // core/thread_pool.h

struct GgmlTypeInfo {
  const char* name;    // "Q4_K"
  int64_t block_size;  // elements per block (1 for plain types)
  int64_t type_size;   // bytes per block
  bool dequantizable;  // zimage can turn it into floats (dequantize_row)
};

// The geometry of type id `id`; nullptr for an id ggml does not define (or retired).
const GgmlTypeInfo* ggml_type_info(uint32_t id);
inline const GgmlTypeInfo* ggml_type_info(GgmlType t) {
  return ggml_type_info(static_cast<uint32_t>(t));
}
// "Q4_K", or "type 77" for an unknown id.
std::string ggml_type_name(uint32_t id);
inline std::string ggml_type_name(GgmlType t) {
  return ggml_type_name(static_cast<uint32_t>(t));
}
// "F32, F16, BF16, Q8_0, ..." (for messages).
std::string ggml_dequantizable_type_list();
// True for the block-quantised types (block_size > 1).
bool ggml_type_is_quantized(GgmlType t);

// Bytes of a row of `n` elements; false when n is negative, not a multiple of the block size, the
// type is unknown, or the size overflows.
bool ggml_row_bytes(GgmlType t, int64_t n, uint64_t* bytes);

// Dequantises one row: n elements (a multiple of the block size) from `src` (n / block_size
// blocks, any alignment) into dst. False (and nothing written) for a type that is not
// dequantizable or an n that does not fit the blocks. Plain types convert by value (F32, F16,
// BF16 exactly).
bool dequantize_row(GgmlType t, const void* src, float* dst, int64_t n);

// `rows` rows of `cols` elements each, consecutive in src and dst; rows run in parallel on `pool`
// (null: the calling thread) once the tensor is large enough to pay for it.
bool dequantize_rows(GgmlType t, const void* src, float* dst, int64_t rows, int64_t cols,
                     ThreadPool* pool = nullptr);

}  // namespace zimage
