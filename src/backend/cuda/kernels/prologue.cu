// Fused model prologues: the attention prologue of a transformer block (split the fused QKV
// projection into q/k/v, per-head RMS norm of q and k, interleaved RoPE) and the DiT's adaLN
// modulation (1 + scale, tanh gate). Unfused, the first is seven passes over the activations (three
// strided copies, two norms, two RoPEs) and the second nine launches of a few KB each; fused, one
// pass and one launch. Roundings match the composed ops (norm -> round -> * weight -> round ->
// RoPE in f32 -> round), so fused and unfused results agree to an ulp (FMA contraction and the
// order of the sum of squares may differ).
#include "backend/cuda/kernels/device_utils.cuh"
#include "backend/cuda/kernels/kernels.h"

namespace zimage::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kMaxPairsPerLane = 4;  // head_dim up to 2 * 32 * 4 = 256

// One block per token row; each warp takes whole heads. Lane l holds pairs l, l + 32, ...
template <typename T>
__global__ void qkv_norm_rope_kernel(const T* __restrict__ qkv, const T* __restrict__ wq,
                                     const T* __restrict__ wk, const float* __restrict__ freqs,
                                     T* __restrict__ q, T* __restrict__ k, T* __restrict__ v,
                                     int64_t rows, int64_t seq_if_shared, int hq, int hkv, int dh,
                                     float eps) {
  const int warp = static_cast<int>(threadIdx.x >> 5), lane = static_cast<int>(threadIdx.x & 31);
  const int heads = hq + 2 * hkv, pairs = dh / 2;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* src = qkv + row * heads * dh;
    const int64_t token = seq_if_shared > 0 ? row % seq_if_shared : row;
    const float* f = freqs ? freqs + token * dh : nullptr;  // (cos, sin) per pair
    for (int h = warp; h < heads; h += kWarps) {
      const bool is_q = h < hq, is_v = h >= hq + hkv;
      T* dst =
          is_q ? q + (row * hq + h) * dh
               : (is_v ? v + (row * hkv + (h - hq - hkv)) * dh : k + (row * hkv + (h - hq)) * dh);
      const T* w = is_v ? nullptr : (is_q ? wq : wk);
      const T* xs = src + static_cast<int64_t>(h) * dh;
      float a[kMaxPairsPerLane], b[kMaxPairsPerLane];
      float ss = 0.f;
#pragma unroll
      for (int i = 0; i < kMaxPairsPerLane; ++i) {
        const int j = lane + 32 * i;
        a[i] = b[i] = 0.f;
        if (j < pairs) {
          a[i] = to_f32<T>(xs[2 * j]);
          b[i] = to_f32<T>(xs[2 * j + 1]);
          ss += a[i] * a[i] + b[i] * b[i];
        }
      }
      if (!is_v && w) {  // warp-uniform branch: every lane takes part in the reduction
        const float r = rsqrtf(warp_sum(ss) / static_cast<float>(dh) + eps);
#pragma unroll
        for (int i = 0; i < kMaxPairsPerLane; ++i) {
          const int j = lane + 32 * i;
          if (j >= pairs) continue;
          a[i] = round_to<T>(round_to<T>(a[i] * r) * to_f32<T>(w[2 * j]));
          b[i] = round_to<T>(round_to<T>(b[i] * r) * to_f32<T>(w[2 * j + 1]));
        }
      }
#pragma unroll
      for (int i = 0; i < kMaxPairsPerLane; ++i) {
        const int j = lane + 32 * i;
        if (j >= pairs) continue;
        float x0 = a[i], x1 = b[i];
        if (!is_v && f) {
          const float c = f[2 * j], s = f[2 * j + 1];
          const float y0 = x0 * c - x1 * s, y1 = x0 * s + x1 * c;
          x0 = y0;
          x1 = y1;
        }
        dst[2 * j] = from_f32<T>(x0);
        dst[2 * j + 1] = from_f32<T>(x1);
      }
    }
  }
}

template <typename T>
__global__ void dit_modulation_kernel(const T* __restrict__ mod, T* __restrict__ scale_a,
                                      T* __restrict__ gate_a, T* __restrict__ scale_f,
                                      T* __restrict__ gate_f, int64_t b, int64_t d) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < b * d;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t bi = i / d, c = i % d;
    const T* m = mod + bi * 4 * d;
    scale_a[i] = from_f32<T>(to_f32<T>(m[c]) + 1.0f);
    gate_a[i] = from_f32<T>(tanhf(to_f32<T>(m[d + c])));
    scale_f[i] = from_f32<T>(to_f32<T>(m[2 * d + c]) + 1.0f);
    gate_f[i] = from_f32<T>(tanhf(to_f32<T>(m[3 * d + c])));
  }
}

}  // namespace

cudaError_t launch_qkv_norm_rope(KType t, const void* qkv, const void* wq, const void* wk,
                                 const float* freqs, void* q, void* k, void* v, int64_t rows,
                                 int64_t seq_if_shared, int hq, int hkv, int dh, float eps,
                                 cudaStream_t s) {
  if (rows <= 0) return cudaSuccess;
  if (dh % 2 != 0 || dh > 2 * 32 * kMaxPairsPerLane) return cudaErrorInvalidValue;
  return dispatch_ktype(t, [&](auto tag) {
    using T = decltype(tag);
    const unsigned grid = static_cast<unsigned>(rows < 65535 * 16 ? rows : 65535 * 16);
    qkv_norm_rope_kernel<T><<<grid, kWarps * 32, 0, s>>>(
        static_cast<const T*>(qkv), static_cast<const T*>(wq), static_cast<const T*>(wk), freqs,
        static_cast<T*>(q), static_cast<T*>(k), static_cast<T*>(v), rows, seq_if_shared, hq, hkv,
        dh, eps);
    return cudaGetLastError();
  });
}

cudaError_t launch_dit_modulation(KType t, const void* mod, void* scale_a, void* gate_a,
                                  void* scale_f, void* gate_f, int64_t b, int64_t d,
                                  cudaStream_t s) {
  if (b * d <= 0) return cudaSuccess;
  return dispatch_ktype(t, [&](auto tag) {
    using T = decltype(tag);
    dit_modulation_kernel<T><<<grid_for(b * d, 256), 256, 0, s>>>(
        static_cast<const T*>(mod), static_cast<T*>(scale_a), static_cast<T*>(gate_a),
        static_cast<T*>(scale_f), static_cast<T*>(gate_f), b, d);
    return cudaGetLastError();
  });
}

}  // namespace zimage::cuda
