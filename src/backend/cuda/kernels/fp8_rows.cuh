// The per-row e4m3 quantisation every FP8 row kernel shares: quantize_fp8_rows (fp8.cu) and the
// norm and SwiGLU kernels that write a W8A8 linear's input as FP8 rows (norm.cu, elementwise.cu).
// One definition, so that their bytes and scales are the same by construction.
#pragma once

#include <cuda_fp8.h>

#include "backend/fp8_attention.h"

namespace zimage::cuda {

// A row's scale from its max |value|: amax / 448 (correctly rounded), 1 for an all-zero or
// non-finite row.
__device__ __forceinline__ float fp8_row_scale(float amax) {
  return amax > 0.f && amax < 3.0e38f ? __fdiv_rn(amax, kFp8Max) : 1.f;
}

// The end of a row's reduction in every FP8 row kernel: the row's scale from its max |value|,
// stored at *scale_out by the one thread that is `writer`, and its reciprocal, which each of the
// row's codes is made with (fp8_code).
__device__ __forceinline__ float fp8_row_finish(float amax, bool writer, float* scale_out) {
  const float sc = fp8_row_scale(amax);
  if (writer) *scale_out = sc;
  return __frcp_rn(sc);
}

// A value's e4m3 code, given the reciprocal of its row's scale (fp8_row_finish):
// v · inv rounded once, clamped to ±448, rounded to nearest even.
__device__ __forceinline__ __nv_fp8_storage_t fp8_code(float v, float inv) {
  return __nv_cvt_float_to_fp8(fminf(fmaxf(__fmul_rn(v, inv), -kFp8Max), kFp8Max), __NV_SATFINITE,
                               __NV_E4M3);
}

// Two values' codes, each as fp8_code gives it, in one conversion: a's in the low byte.
__device__ __forceinline__ __nv_fp8x2_storage_t fp8_codes2(float a, float b, float inv) {
  const float2 v = make_float2(fminf(fmaxf(__fmul_rn(a, inv), -kFp8Max), kFp8Max),
                               fminf(fmaxf(__fmul_rn(b, inv), -kFp8Max), kFp8Max));
  return __nv_cvt_float2_to_fp8x2(v, __NV_SATFINITE, __NV_E4M3);
}

// VEC values' codes stored as one unit at q (aligned to VEC bytes).
template <int VEC>
__device__ __forceinline__ void store_fp8_codes(__nv_fp8_storage_t* q, const float (&v)[VEC],
                                                float inv) {
  if constexpr (VEC % 2 == 0) {  // two codes a conversion
    struct alignas(VEC) Codes {
      __nv_fp8x2_storage_t c[VEC / 2];
    } out;
#pragma unroll
    for (int k = 0; k < VEC / 2; ++k) out.c[k] = fp8_codes2(v[2 * k], v[2 * k + 1], inv);
    *reinterpret_cast<Codes*>(q) = out;
  } else {
    struct alignas(VEC) Codes {
      __nv_fp8_storage_t c[VEC];
    } out;
#pragma unroll
    for (int k = 0; k < VEC; ++k) out.c[k] = fp8_code(v[k], inv);
    *reinterpret_cast<Codes*>(q) = out;
  }
}

}  // namespace zimage::cuda
