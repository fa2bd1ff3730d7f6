// Quantisation of float32 rows into GGUF (ggml) blocks, the inverse of io/gguf/gguf_quants.h's
// dequantisation, for `zimage convert`:
//   Q8_0, Q4_0: ports of the gguf Python package's numpy quantisers (gguf-py quants.py, itself
//     bit-exact with ggml-quants.c's reference quantize_row_*_ref): same float32 operations in
//     the same order, f16 scales rounded to nearest even, so the bytes equal the package's
//     (tested against bytes it wrote).
//   Q4_K, Q5_K, Q6_K: the gguf package has no quantiser for them and llama.cpp's reference
//     (make_qkx2_quants / make_qx_quants) searches scales iteratively over a weighted error. Here
//     a simpler, stated method, correct for the format and within about a step of it:
//       Q4_K / Q5_K: per group of 32, min m = max(0, -min(x)) and scale (max(x) + m) / L
//         (L = 15 / 31); the super-block's d = max scale / 63 and dmin = max m / 63 (f16); each
//         group's 6-bit scale and min = round(scale / d), round(m / dmin); q = round((x + dmin*mq)
//         / (d*sq)) clamped to 0..L.
//       Q6_K: per group of 16, scale = max|x| / 31; d = max scale / 127 (f16); 8-bit scale
//         round(scale / d); q = round(x / (d*sq)) + 32 clamped to 0..63.
//     Their round-trip error is tested against stated bounds (tests/unit/test_gguf_quantize.cpp).
// Plain types: F32 as is, F16 and BF16 rounded to nearest even.
#pragma once

#include <cstdint>

#include "io/gguf/gguf_quants.h"

namespace zimage {

// True for the types quantize_row() writes.
bool ggml_can_quantize(GgmlType t);

// Quantises one row of n floats (n a multiple of the block size) into n / block_size blocks at
// dst (ggml_row_bytes(t, n) bytes). False (nothing written) for an unsupported type or a bad n.
bool quantize_row(GgmlType t, const float* src, void* dst, int64_t n);

}  // namespace zimage
