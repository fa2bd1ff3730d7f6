// Fused model prologues: the attention prologue of a transformer block (split the fused QKV
// projection into q/k/v, per-head RMS norm of q and k, interleaved RoPE) and the DiT's adaLN
// modulation (1 + scale, tanh gate). Unfused, the first is seven passes over the activations (three
// strided copies, two norms, two RoPEs) and the second nine launches of a few KB each; fused, one
// pass and one launch. Roundings match the composed ops (norm -> round -> * weight -> round ->
// RoPE in f32 -> round), so fused and unfused results agree to an ulp (FMA contraction and the
// order of the sum of squares may differ).
#include <type_traits>

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

// The same prologue for head_dim 128 (the DiT's and Qwen3's), one warp per (token row, head): each
// lane holds 4 consecutive elements (two RoPE pairs), loaded and stored as one 8-byte (bf16) or
// 16-byte (f32) access, with (cos, sin) of its two pairs as one 16-byte load. The general kernel
// above walks a row's 90 heads with 8 warps and 2-byte accesses: measured on an H200 at ~35 % of
// memory bandwidth at the DiT's 4160 x 11520 (docs/BENCHMARKS.md, session 9). Same roundings;
// the sum of squares is added in another order (an ulp at most after the rounding to T).
constexpr int kD128 = 128;

template <typename T>
struct alignas(4 * sizeof(T)) Vec4 {
  T v[4];
};

//
// kPacked: in place on the packed projection (`io`, each row's q heads, k heads, v heads) for
// attention that reads q, k and v there (Backend::qk_norm_rope_packed): only the q and k heads are
// items, each written back where it was read; qkv, q, k and v are unused (null).
template <typename T, int kItems, bool kPacked>
__global__ void qkv_norm_rope_d128_kernel(const T* __restrict__ qkv, const T* __restrict__ wq,
                                          const T* __restrict__ wk, const float* __restrict__ freqs,
                                          T* __restrict__ q, T* __restrict__ k, T* __restrict__ v,
                                          T* io, int64_t rows, int64_t seq_if_shared, int hq,
                                          int hkv, float eps) {
  const int lane = static_cast<int>(threadIdx.x & 31);
  const int heads_in = hq + 2 * hkv;                // heads in a row of the projection
  const int heads = kPacked ? hq + hkv : heads_in;  // items in a row: v is left alone in place
  const int64_t total = rows * heads;
  const int64_t stride = int64_t{gridDim.x} * kWarps * kItems;
  // The norm weights are the same for every item: loaded once.
  Vec4<T> wqv{}, wkv{};
  if (wq) wqv = reinterpret_cast<const Vec4<T>*>(wq)[lane];
  if (wk) wkv = reinterpret_cast<const Vec4<T>*>(wk)[lane];
  // A warp takes kItems consecutive items (kItems * 256 bytes of one or two rows) and issues all
  // their loads before it computes: more bytes in flight per multiprocessor.
  for (int64_t base = (int64_t{blockIdx.x} * kWarps + (threadIdx.x >> 5)) * kItems; base < total;
       base += stride) {
    Vec4<T> in[kItems];
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      const int64_t item = base + j;
      if (item >= total) break;
      if constexpr (kPacked) {
        const int64_t row = item / heads;
        in[j] = reinterpret_cast<const Vec4<T>*>(io + (row * heads_in + (item - row * heads)) *
                                                          kD128)[lane];
      } else {
        in[j] = reinterpret_cast<const Vec4<T>*>(qkv + item * kD128)[lane];
      }
    }
    // The heads of one token row share their (cos, sin): one load per row, not per head (the
    // table was read from L2 once for every q and k head: 60 × 512 bytes a token at the DiT's
    // shapes). A warp's items lie in the rows of its first and last item, except with fewer
    // heads a row than kItems - 1 (no k/v heads), where a row in between is loaded below.
    const int64_t row_a = base / heads;
    const int64_t last = base + kItems - 1 < total ? base + kItems - 1 : total - 1;
    const int64_t row_b = last / heads;
    float4 fa = make_float4(0.f, 0.f, 0.f, 0.f), fb = fa;
    if (freqs) {
      if (base - row_a * heads < hq + hkv) {
        const int64_t token = seq_if_shared > 0 ? row_a % seq_if_shared : row_a;
        fa = reinterpret_cast<const float4*>(freqs + token * kD128)[lane];
      }
      if (row_b != row_a) {
        const int64_t token = seq_if_shared > 0 ? row_b % seq_if_shared : row_b;
        fb = reinterpret_cast<const float4*>(freqs + token * kD128)[lane];
      }
    }
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      const int64_t item = base + j;
      if (item >= total) break;  // warp-uniform
      const int64_t row = item / heads;
      const int h = static_cast<int>(item - row * heads);
      const bool is_q = h < hq, is_v = !kPacked && h >= hq + hkv;
      T* dst = kPacked ? io + (row * heads_in + h) * kD128
               : is_q  ? q + (row * hq + h) * kD128
                       : (is_v ? v + (row * hkv + (h - hq - hkv)) * kD128
                               : k + (row * hkv + (h - hq)) * kD128);
      float e[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) e[i] = to_f32<T>(in[j].v[i]);
      const bool norm = is_v ? false : (is_q ? wq != nullptr : wk != nullptr);
      if (norm) {  // warp-uniform: the whole warp holds one head
        const Vec4<T>& wv = is_q ? wqv : wkv;
        float ss = 0.f;
#pragma unroll
        for (int i = 0; i < 4; ++i) ss += e[i] * e[i];
        const float r = rsqrtf(warp_sum(ss) / static_cast<float>(kD128) + eps);
#pragma unroll
        for (int i = 0; i < 4; ++i) e[i] = round_to<T>(round_to<T>(e[i] * r) * to_f32<T>(wv.v[i]));
      }
      if (!is_v && freqs) {
        float4 c = row == row_a ? fa : fb;
        if (row != row_a && row != row_b) {  // a row in between (see above)
          const int64_t token = seq_if_shared > 0 ? row % seq_if_shared : row;
          c = reinterpret_cast<const float4*>(freqs + token * kD128)[lane];
        }
        const float y0 = e[0] * c.x - e[1] * c.y, y1 = e[0] * c.y + e[1] * c.x;
        const float y2 = e[2] * c.z - e[3] * c.w, y3 = e[2] * c.w + e[3] * c.z;
        e[0] = y0, e[1] = y1, e[2] = y2, e[3] = y3;
      }
      Vec4<T> out;
#pragma unroll
      for (int i = 0; i < 4; ++i) out.v[i] = from_f32<T>(e[i]);
      reinterpret_cast<Vec4<T>*>(dst)[lane] = out;
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

// The adaLN projection and modulation for a small batch: mod[b, j] = c[b, :] · w[j, :] + bias[j]
// (fp32 sums, rounded to T as the GEMM's output), then 1 + mod or tanh(mod) by the quarter of 4D
// j falls in, written to that output. A GEMV (B rows of c, a few KB) reading w once: each warp
// takes kAdaRows rows of w, its lanes 16-byte packs of each row, all loads issued first.
constexpr int kAdaRows = 4;
constexpr int kAdaMaxBatch = 4;

template <typename T, int kB>
__global__ void adaln_modulation_kernel(const T* __restrict__ c, const T* __restrict__ w,
                                        const T* __restrict__ bias, T* __restrict__ scale_a,
                                        T* __restrict__ gate_a, T* __restrict__ scale_f,
                                        T* __restrict__ gate_f, int64_t d, int k) {
  constexpr int V = kVec16<T>;
  const int lane = static_cast<int>(threadIdx.x & 31);
  const int64_t n = 4 * d;
  const int64_t j0 = (int64_t{blockIdx.x} * kWarps + (threadIdx.x >> 5)) * kAdaRows;
  if (j0 >= n) return;  // warp-uniform
  float acc[kAdaRows][kB];
#pragma unroll
  for (int r = 0; r < kAdaRows; ++r)
#pragma unroll
    for (int bi = 0; bi < kB; ++bi) acc[r][bi] = 0.f;
  for (int k0 = lane * V; k0 < k; k0 += 32 * V) {
    float wv[kAdaRows][V];
#pragma unroll
    for (int r = 0; r < kAdaRows; ++r)
      if (j0 + r < n) load_f32<T, V>(w + (j0 + r) * k + k0, wv[r]);
    float cv[kB][V];
#pragma unroll
    for (int bi = 0; bi < kB; ++bi) load_f32<T, V>(c + int64_t{bi} * k + k0, cv[bi]);
#pragma unroll
    for (int r = 0; r < kAdaRows; ++r) {
      if (j0 + r >= n) continue;
#pragma unroll
      for (int bi = 0; bi < kB; ++bi)
#pragma unroll
        for (int e = 0; e < V; ++e) acc[r][bi] = fmaf(wv[r][e], cv[bi][e], acc[r][bi]);
    }
  }
#pragma unroll
  for (int r = 0; r < kAdaRows; ++r) {
    const int64_t j = j0 + r;
    if (j >= n) break;  // warp-uniform
    const int q = static_cast<int>(j / d);
    const int64_t col = j - q * d;
    T* dst = q == 0 ? scale_a : q == 1 ? gate_a : q == 2 ? scale_f : gate_f;
    const float bj = bias ? to_f32<T>(bias[j]) : 0.f;
#pragma unroll
    for (int bi = 0; bi < kB; ++bi) {
      const float m = round_to<T>(warp_sum(acc[r][bi]) + bj);  // the GEMM's output, rounded
      if (lane == bi) dst[bi * d + col] = from_f32<T>(q % 2 == 0 ? m + 1.0f : tanhf(m));
    }
  }
}

}  // namespace

bool adaln_modulation_fits(int64_t b, int64_t k, const void* c, const void* w, const void* bias,
                           size_t elem) {
  const int64_t v = static_cast<int64_t>(16 / elem);
  return b >= 1 && b <= kAdaMaxBatch && k > 0 && k <= (int64_t{1} << 30) && k % v == 0 &&
         aligned16(c) && aligned16(w) &&
         (bias == nullptr || reinterpret_cast<uintptr_t>(bias) % elem == 0);
}

cudaError_t launch_adaln_modulation(KType t, const void* c, const void* w, const void* bias,
                                    void* scale_a, void* gate_a, void* scale_f, void* gate_f,
                                    int64_t b, int64_t d, int64_t k, cudaStream_t s) {
  if (b <= 0 || d <= 0) return cudaSuccess;
  if (b > kAdaMaxBatch || k <= 0 || k > (int64_t{1} << 30)) return cudaErrorInvalidValue;
  const int64_t warps = (4 * d + kAdaRows - 1) / kAdaRows;
  const int64_t blocks = (warps + kWarps - 1) / kWarps;
  if (blocks >= (int64_t{1} << 31)) return cudaErrorInvalidValue;
  return dispatch_ktype(t, [&](auto tag) {
    using T = decltype(tag);
    auto launch = [&](auto nb) {
      adaln_modulation_kernel<T, decltype(nb)::value>
          <<<static_cast<unsigned>(blocks), kWarps * 32, 0, s>>>(
              static_cast<const T*>(c), static_cast<const T*>(w), static_cast<const T*>(bias),
              static_cast<T*>(scale_a), static_cast<T*>(gate_a), static_cast<T*>(scale_f),
              static_cast<T*>(gate_f), d, static_cast<int>(k));
      return cudaGetLastError();
    };
    switch (b) {
      case 1:
        return launch(std::integral_constant<int, 1>{});
      case 2:
        return launch(std::integral_constant<int, 2>{});
      case 3:
        return launch(std::integral_constant<int, 3>{});
      default:
        return launch(std::integral_constant<int, 4>{});
    }
  });
}

cudaError_t launch_qkv_norm_rope(KType t, const void* qkv, const void* wq, const void* wk,
                                 const float* freqs, void* q, void* k, void* v, int64_t rows,
                                 int64_t seq_if_shared, int hq, int hkv, int dh, float eps,
                                 cudaStream_t s) {
  if (rows <= 0) return cudaSuccess;
  if (dh % 2 != 0 || dh > 2 * 32 * kMaxPairsPerLane) return cudaErrorInvalidValue;
  const bool d128 = dh == kD128 && aligned16(qkv) && aligned16(q) && aligned16(k) && aligned16(v) &&
                    aligned16(wq) && aligned16(wk) && aligned16(freqs);
  return dispatch_ktype(t, [&](auto tag) {
    using T = decltype(tag);
    if (d128) {
      const int tuned = row_kernel_tuning().prologue_items;
      const int items = tuned != 0 ? tuned : row_kernel_defaults().prologue_items;
      const int64_t warps = (rows * (hq + 2 * hkv) + items - 1) / items;
      const int64_t blocks = (warps + kWarps - 1) / kWarps;
      const unsigned grid = static_cast<unsigned>(blocks < (int64_t{1} << 30) ? blocks : 1 << 30);
      auto launch = [&](auto n) {
        qkv_norm_rope_d128_kernel<T, decltype(n)::value, false><<<grid, kWarps * 32, 0, s>>>(
            static_cast<const T*>(qkv), static_cast<const T*>(wq), static_cast<const T*>(wk), freqs,
            static_cast<T*>(q), static_cast<T*>(k), static_cast<T*>(v), nullptr, rows,
            seq_if_shared, hq, hkv, eps);
        return cudaGetLastError();
      };
      if (items == 4) return launch(std::integral_constant<int, 4>{});
      if (items == 2) return launch(std::integral_constant<int, 2>{});
      return launch(std::integral_constant<int, 1>{});
    }
    const unsigned grid = static_cast<unsigned>(rows < 65535 * 16 ? rows : 65535 * 16);
    qkv_norm_rope_kernel<T><<<grid, kWarps * 32, 0, s>>>(
        static_cast<const T*>(qkv), static_cast<const T*>(wq), static_cast<const T*>(wk), freqs,
        static_cast<T*>(q), static_cast<T*>(k), static_cast<T*>(v), rows, seq_if_shared, hq, hkv,
        dh, eps);
    return cudaGetLastError();
  });
}

bool qk_norm_rope_packed_fits(const void* qkv, const void* wq, const void* wk, const float* freqs,
                              int dh) {
  return dh == kD128 && aligned16(qkv) && aligned16(wq) && aligned16(wk) && aligned16(freqs);
}

cudaError_t launch_qk_norm_rope_packed(KType t, void* qkv, const void* wq, const void* wk,
                                       const float* freqs, int64_t rows, int64_t seq_if_shared,
                                       int hq, int hkv, int dh, float eps, cudaStream_t s) {
  if (rows <= 0 || hq + hkv <= 0) return cudaSuccess;
  if (!qk_norm_rope_packed_fits(qkv, wq, wk, freqs, dh)) return cudaErrorInvalidValue;
  return dispatch_ktype(t, [&](auto tag) {
    using T = decltype(tag);
    const int tuned = row_kernel_tuning().prologue_items;
    const int items = tuned != 0 ? tuned : row_kernel_defaults().prologue_items;
    const int64_t warps = (rows * (hq + hkv) + items - 1) / items;
    const int64_t blocks = (warps + kWarps - 1) / kWarps;
    const unsigned grid = static_cast<unsigned>(blocks < (int64_t{1} << 30) ? blocks : 1 << 30);
    auto launch = [&](auto n) {
      qkv_norm_rope_d128_kernel<T, decltype(n)::value, true><<<grid, kWarps * 32, 0, s>>>(
          nullptr, static_cast<const T*>(wq), static_cast<const T*>(wk), freqs, nullptr, nullptr,
          nullptr, static_cast<T*>(qkv), rows, seq_if_shared, hq, hkv, eps);
      return cudaGetLastError();
    };
    if (items == 4) return launch(std::integral_constant<int, 4>{});
    if (items == 2) return launch(std::integral_constant<int, 2>{});
    return launch(std::integral_constant<int, 1>{});
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
