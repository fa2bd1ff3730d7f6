// The scales of the opt-in FP8 attention (Backend::attention_packed_fp8), shared by the CPU
// oracle and the CUDA kernels so both compute them with the same float arithmetic.
//
// q and k: one scale each, from the norm weight alone. After the per-head RMS norm a head's
// squares sum to at most Dh, so no element of q (or k) after the weight and the rotation exceeds
// max|w| · sqrt(Dh); the factor 1 + 2^-6 covers the three bf16 roundings on the way (each at
// most 2^-8 relative: (1 + 2^-8)^3 < 1 + 2^-6), and a clamp to ±448 stays behind it. The scale
// maps that bound to e4m3's largest value, 448. No pass over the activations finds it, so the
// quantisation sits in the prologue; e4m3's relative precision does not depend on the scale,
// only its range does. v: one scale per head, max |v| over the rows / 448.
#pragma once

#include <cmath>

#if defined(__CUDACC__)
#define ZI_FP8_HD __host__ __device__
#else
#define ZI_FP8_HD
#endif

namespace zimage {

inline constexpr float kFp8Max = 448.f;           // e4m3's largest finite value
inline constexpr float kFp8QkMargin = 1.015625f;  // 1 + 2^-6: the bf16 roundings before it

// The q or k scale for a norm weight whose largest magnitude is wmax, in heads of head_dim:
// wmax · (sqrt(head_dim) · (1 + 2^-6) / 448), with IEEE operations on both sides; 1 where that
// is 0 or not finite.
ZI_FP8_HD inline float fp8_attention_qk_scale(float wmax, int head_dim) {
#if defined(__CUDA_ARCH__)
  const float per =
      __fdiv_rn(__fmul_rn(sqrtf(static_cast<float>(head_dim)), kFp8QkMargin), kFp8Max);
  const float d = __fmul_rn(wmax, per);
#else
  const float per = std::sqrt(static_cast<float>(head_dim)) * kFp8QkMargin / kFp8Max;
  const float d = wmax * per;
#endif
  return d > 0.f && d < 3.0e38f ? d : 1.f;
}

// A v head's scale for its largest magnitude amax (IEEE division on both sides); 1 for 0 or not
// finite.
ZI_FP8_HD inline float fp8_attention_v_scale(float amax) {
#if defined(__CUDA_ARCH__)
  return amax > 0.f && amax < 3.0e38f ? __fdiv_rn(amax, kFp8Max) : 1.f;
#else
  return amax > 0.f && amax < 3.0e38f ? amax / kFp8Max : 1.f;
#endif
}

}  // namespace zimage

#undef ZI_FP8_HD
