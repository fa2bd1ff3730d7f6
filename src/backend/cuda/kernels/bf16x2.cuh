// bf16 values two at a time (__nv_bfloat162), for the row kernels whose work is mostly the
// roundings a framework's separate bf16 ops make (the DiT's gated residual + next norm, the FP8
// SwiGLU). Each helper gives, bit for bit, what the fp32 form with a rounding after each op gives
// (round_to<__nv_bfloat16>(a * b) and so on, device_utils.cuh), in fewer instructions:
//  - a product of two bf16 values is exact in fp32 (two 8-bit significands), so rounding it once
//    is what mul.bf16x2 does;
//  - a sum of two bf16 values rounded to fp32 and then to bf16 equals the sum rounded once:
//    double rounding through a format of p' >= 2p + 2 bits is innocuous for + - * / (Figueroa,
//    "When is double rounding innocuous?", SIGNUM 1995; p = 8, p' = 24), so add.bf16x2 matches;
//  - cvt.rn.bf16x2.f32 is two __float2bfloat16_rn in one instruction;
//  - the max of two values does not round; max.bf16x2, like fmaxf, returns the other operand
//    when one is NaN.
// Subnormals are kept by all of them (none of these instructions flushes). Only .cu files include
// this.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "backend/cuda/kernels/fp8_rows.cuh"

namespace zimage::cuda {

// A 16-byte pack of a bf16 row: 8 values as 4 pairs, element 2k in h[k].x, 2k + 1 in h[k].y.
struct alignas(16) Bf16x8 {
  __nv_bfloat162 h[4];
};

// One 16-byte load or store (p 16-byte aligned). Through uint4: copying Bf16x8 itself compiles
// to four 4-byte accesses (__nv_bfloat162 is copied member by member).
__device__ __forceinline__ Bf16x8 load_bf16x8(const __nv_bfloat16* p) {
  const uint4 u = *reinterpret_cast<const uint4*>(p);
  Bf16x8 v;
  __builtin_memcpy(&v, &u, sizeof v);
  return v;
}
__device__ __forceinline__ void store_bf16x8(__nv_bfloat16* p, const Bf16x8& v) {
  uint4 u;
  __builtin_memcpy(&u, &v, sizeof u);
  *reinterpret_cast<uint4*>(p) = u;
}

// s plus the squares of the pack's values, added in element order (the order of the fp32 row
// kernels' loops, so the same sum).
__device__ __forceinline__ float add_squares(const Bf16x8& v, float s) {
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float2 f = __bfloat1622float2(v.h[k]);
    s += f.x * f.x;
    s += f.y * f.y;
  }
  return s;
}

// Each value times r in fp32, rounded once to bf16.
__device__ __forceinline__ Bf16x8 scale_to_bf16(const Bf16x8& v, float r) {
  Bf16x8 o;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float2 f = __bfloat1622float2(v.h[k]);
    o.h[k] = __floats2bfloat162_rn(f.x * r, f.y * r);
  }
  return o;
}

// a * b and a + b value by value, each rounded once to bf16.
__device__ __forceinline__ Bf16x8 mul_bf16x8(const Bf16x8& a, const Bf16x8& b) {
  Bf16x8 o;
#pragma unroll
  for (int k = 0; k < 4; ++k) o.h[k] = __hmul2(a.h[k], b.h[k]);
  return o;
}
__device__ __forceinline__ Bf16x8 add_bf16x8(const Bf16x8& a, const Bf16x8& b) {
  Bf16x8 o;
#pragma unroll
  for (int k = 0; k < 4; ++k) o.h[k] = __hadd2(a.h[k], b.h[k]);
  return o;
}

// m with the pack's |values| folded in (two running maxima, one a lane of the pair).
__device__ __forceinline__ __nv_bfloat162 max_abs_bf16x8(const Bf16x8& v, __nv_bfloat162 m) {
#pragma unroll
  for (int k = 0; k < 4; ++k) m = __hmax2(m, __habs2(v.h[k]));
  return m;
}

// The pack's e4m3 codes (fp8_code's, two conversions an instruction) stored at q (8-byte aligned).
__device__ __forceinline__ void store_fp8_codes_bf16x8(__nv_fp8_storage_t* q, const Bf16x8& v,
                                                       float inv) {
  uint32_t c[2];
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const float2 a = __bfloat1622float2(v.h[2 * k]), b = __bfloat1622float2(v.h[2 * k + 1]);
    c[k] = uint32_t{fp8_codes2(a.x, a.y, inv)} | uint32_t{fp8_codes2(b.x, b.y, inv)} << 16;
  }
  *reinterpret_cast<uint2*>(q) = make_uint2(c[0], c[1]);
}

// Launches the gated residual + next norm (norm.cu launch_residual_norm_then_norm and its FP8
// form; out8 set: the FP8 form) on bf16 rows of d values, one block of `threads` threads a row,
// each holding `ppt` (1, 2 or 4) packs of it (norm.cu chooses both); the same bits as norm.cu's
// register-cached kernel. Returns the launch's error.
cudaError_t launch_residual_norm_then_norm_bf16x2(int ppt, unsigned threads, void* x, const void* y,
                                                  const void* w, const void* gate,
                                                  const void* w_next, const void* scale, void* out,
                                                  void* out8, float* out_scale, int64_t rows, int d,
                                                  int64_t rows_per_group, float eps,
                                                  cudaStream_t s);

}  // namespace zimage::cuda
