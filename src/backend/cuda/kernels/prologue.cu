// Fused model prologues: the attention prologue of a transformer block (split the fused QKV
// projection into q/k/v, per-head RMS norm of q and k, interleaved RoPE) and the DiT's adaLN
// modulation (1 + scale, tanh gate). Unfused, the first is seven passes over the activations (three
// strided copies, two norms, two RoPEs) and the second nine launches of a few KB each; fused, one
// pass and one launch. Roundings match the composed ops (norm -> round -> * weight -> round ->
// RoPE in f32 -> round), so fused and unfused results agree to an ulp (FMA contraction and the
// order of the sum of squares may differ).
#include <cuda_fp8.h>

#include <type_traits>

#include "backend/cuda/kernels/device_utils.cuh"
#include "backend/cuda/kernels/kernels.h"
#include "backend/fp8_attention.h"

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

// The same prologue for head_dim 128 (the DiT's and Qwen3's). A lane holds 16 bytes of a head
// (8 bf16 or 4 f32: four or two RoPE pairs), so a head takes 16 lanes (bf16) or 32 (f32) and a
// warp holds two heads or one at a time; it takes kPasses such groups of consecutive (row, head)
// items per iteration and issues all their loads before it computes. The row and head of an item
// are found with one division per iteration (stepping on from there), and a lane reloads its
// (cos, sin) only when its row changes. The general kernel above walks a row's 90 heads with 8
// warps and 2-byte accesses (~35 % of memory bandwidth on an H200 at the DiT's 4160 x 11520,
// docs/BENCHMARKS.md, session 9); an earlier version of this one, 8-byte accesses and four 64-bit
// divisions per head, ran the packed case at 1.27 TB/s (session 19). Same roundings as the
// composed ops; the sum of squares is added lane by lane, then across the head's lanes.
//
// kPacked: in place on the packed projection (`io`: each row's q heads, k heads, v heads) for
// attention that reads q, k and v there (Backend::qk_norm_rope_packed): only the q and k heads
// are items, each written back where it was read; qkv, q, k and v are unused (null).
//
// kFp8 (with kPacked): the same items read from `io`, which is left as it is, and written as
// e4m3 at the same element offsets of `out8` (the FP8 attention's packed operand), divided by
// one scale for q and one for k, bounds known from the norm weights (backend/fp8_attention.h).
// Each lane holds its part of the weights; the head's lanes reduce the max, every block finds
// the same scales, and block 0 writes them to descale[0] (q) and descale[1] (k).
constexpr int kD128 = 128;

template <typename T>
struct alignas(16) Pack16 {
  T v[16 / sizeof(T)];
};

template <int N>
struct alignas(N) Bytes {
  uint8_t b[N];
};

// The per-head steps of the two head_dim-128 kernels below, shared so that both compile the same
// expressions (and so give the same bits): a lane's 16 bytes of a head as floats with their sum
// of squares (zeros where the lane's item does not exist), the RMS norm by the head's summed
// squares and its weight pack, interleaved RoPE on (cos, sin) pairs, and a value's e4m3 code
// (the value as the bf16 prologue would store it, divided by its scale).
template <typename T, int V>
__device__ __forceinline__ float unpack_sum_sq(const Pack16<T>& in, bool valid, float (&e)[V]) {
  float ss = 0.f;
#pragma unroll
  for (int i = 0; i < V; ++i) {
    e[i] = valid ? to_f32<T>(in.v[i]) : 0.f;
    ss += e[i] * e[i];
  }
  return ss;
}
template <typename T, int V>
__device__ __forceinline__ void norm_head(float (&e)[V], float ss, const Pack16<T>& w, float eps) {
  const float rs = rsqrtf(ss / static_cast<float>(kD128) + eps);
#pragma unroll
  for (int i = 0; i < V; ++i) e[i] = round_to<T>(round_to<T>(e[i] * rs) * to_f32<T>(w.v[i]));
}
template <int V>
__device__ __forceinline__ void rope_pairs(float (&e)[V], const float (&fr)[V]) {
#pragma unroll
  for (int i = 0; i < V; i += 2) {
    const float c = fr[i], sn = fr[i + 1];
    const float y0 = e[i] * c - e[i + 1] * sn, y1 = e[i] * sn + e[i + 1] * c;
    e[i] = y0, e[i + 1] = y1;
  }
}
template <typename T>
__device__ __forceinline__ uint8_t e4m3_code(float e, float inv) {
  const float x = fminf(fmaxf(__fmul_rn(round_to<T>(e), inv), -kFp8Max), kFp8Max);
  return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
}

// The FP8 prologue's q and k scales, bounded from the norm weights alone
// (backend/fp8_attention.h): each lane holds its part of the two weights (L lanes a head), the
// head's lanes reduce the max, every block finds the same scales and block 0 writes them to
// descale[0] (q) and descale[1] (k); inv_q and inv_k get their reciprocals.
template <typename T, int V, int L>
__device__ __forceinline__ void qk_e4m3_scales(const Pack16<T>& wqv, const Pack16<T>& wkv,
                                               float* descale, float& inv_q, float& inv_k) {
  float mq = 0.f, mk = 0.f;
#pragma unroll
  for (int i = 0; i < V; ++i) {
    mq = fmaxf(mq, fabsf(to_f32<T>(wqv.v[i])));
    mk = fmaxf(mk, fabsf(to_f32<T>(wkv.v[i])));
  }
#pragma unroll
  for (int o = L / 2; o > 0; o >>= 1) {
    mq = fmaxf(mq, __shfl_xor_sync(0xffffffffu, mq, o));
    mk = fmaxf(mk, __shfl_xor_sync(0xffffffffu, mk, o));
  }
  const float dq = fp8_attention_qk_scale(mq, kD128), dk = fp8_attention_qk_scale(mk, kD128);
  inv_q = __frcp_rn(dq), inv_k = __frcp_rn(dk);
  if (blockIdx.x == 0 && threadIdx.x == 0) descale[0] = dq, descale[1] = dk;
}

template <typename T, int kPasses, bool kPacked, bool kFp8 = false>
__global__ void qkv_norm_rope_d128_kernel(const T* __restrict__ qkv, const T* __restrict__ wq,
                                          const T* __restrict__ wk, const float* __restrict__ freqs,
                                          T* __restrict__ q, T* __restrict__ k, T* __restrict__ v,
                                          T* io, int64_t rows, int64_t seq_if_shared, int hq,
                                          int hkv, float eps, uint8_t* __restrict__ out8 = nullptr,
                                          float* __restrict__ descale = nullptr) {
  static_assert(!kFp8 || kPacked, "the FP8 output is the packed operand's");
  constexpr int V = 16 / sizeof(T);  // elements a lane holds
  constexpr int L = kD128 / V;       // lanes a head takes
  constexpr int G = 32 / L;          // heads a warp holds at once
  constexpr int kHeads = kPasses * G;
  const int lane = static_cast<int>(threadIdx.x & 31), sub = lane / L, part = lane % L;
  const int heads_in = hq + 2 * hkv;             // heads in a row of the projection
  const int nh = kPacked ? hq + hkv : heads_in;  // items in a row: v is left alone in place
  const int64_t total = rows * nh;
  const int64_t stride = int64_t{gridDim.x} * kWarps * kHeads;
  // The norm weights are the same for every item: this lane's part of each, loaded once.
  Pack16<T> wqv{}, wkv{};
  if (wq) wqv = reinterpret_cast<const Pack16<T>*>(wq)[part];
  if (wk) wkv = reinterpret_cast<const Pack16<T>*>(wk)[part];
  float inv_q = 1.f, inv_k = 1.f;  // kFp8: 1 / scale
  if constexpr (kFp8) qk_e4m3_scales<T, V, L>(wqv, wkv, descale, inv_q, inv_k);
  int64_t f_row = -1;  // the row whose (cos, sin) fr holds
  float fr[V] = {};
  for (int64_t base = (int64_t{blockIdx.x} * kWarps + (threadIdx.x >> 5)) * kHeads; base < total;
       base += stride) {
    const int64_t row0 = base / nh;
    const int h0 = static_cast<int>(base - row0 * nh);
    Pack16<T> in[kPasses];
    int64_t rr[kPasses];
    int hh[kPasses];
#pragma unroll
    for (int p = 0; p < kPasses; ++p) {
      int h = h0 + p * G + sub;
      int64_t r = row0;
      while (h >= nh) h -= nh, ++r;
      rr[p] = r;
      hh[p] = h;
      if (r < rows) {
        const T* src = kPacked ? io + (r * heads_in + h) * kD128 : qkv + (r * nh + h) * kD128;
        in[p] = reinterpret_cast<const Pack16<T>*>(src)[part];
      }
    }
#pragma unroll
    for (int p = 0; p < kPasses; ++p) {
      const int64_t r = rr[p];
      const int h = hh[p];
      const bool valid = r < rows;
      const bool is_q = h < hq, is_v = !kPacked && h >= hq + hkv;
      float e[V];
      float ss = unpack_sum_sq<T, V>(in[p], valid, e);
      // Every lane takes part in the reduction over its head's L lanes (xor offsets below L stay
      // inside the group), whatever its head needs.
#pragma unroll
      for (int o = L / 2; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
      if (!valid) continue;
      const bool norm = is_v ? false : (is_q ? wq != nullptr : wk != nullptr);
      if (norm) norm_head<T, V>(e, ss, is_q ? wqv : wkv, eps);
      if (!is_v && freqs) {
        if (r != f_row) {
          const int64_t token = seq_if_shared > 0 ? r % seq_if_shared : r;
          const float4* f4 = reinterpret_cast<const float4*>(freqs + token * kD128 + part * V);
#pragma unroll
          for (int i = 0; i < V / 4; ++i) {
            const float4 c = f4[i];
            fr[4 * i] = c.x, fr[4 * i + 1] = c.y, fr[4 * i + 2] = c.z, fr[4 * i + 3] = c.w;
          }
          f_row = r;
        }
        rope_pairs<V>(e, fr);
      }
      if constexpr (kFp8) {
        // The value the bf16 prologue writes, then divided by its scale and rounded to e4m3.
        const float inv = is_q ? inv_q : inv_k;
        Bytes<V> o8;
#pragma unroll
        for (int i = 0; i < V; ++i) o8.b[i] = e4m3_code<T>(e[i], inv);
        reinterpret_cast<Bytes<V>*>(out8 + (r * heads_in + h) * kD128)[part] = o8;
        continue;
      }
      T* dst = kPacked ? io + (r * heads_in + h) * kD128
               : is_q  ? q + (r * hq + h) * kD128
                       : (is_v ? v + (r * hkv + (h - hq - hkv)) * kD128
                               : k + (r * hkv + (h - hq)) * kD128);
      Pack16<T> out;
#pragma unroll
      for (int i = 0; i < V; ++i) out.v[i] = from_f32<T>(e[i]);
      reinterpret_cast<Pack16<T>*>(dst)[part] = out;
    }
  }
}

// The packed prologue (in place, or to e4m3 as kFp8 above) with a block per token row, staged
// through shared memory: the block copies the row's q and k heads (contiguous at the row's start:
// 60 heads, 15 KB of bf16 in the DiT) and its (cos, sin) table with cp.async, which holds no
// registers while in flight, then each 16 lanes take a head (16 bytes a lane) from shared memory
// and write it back. The warp-item kernel above holds its loads in registers (64 a thread, so 32
// warps and ~32 KB in flight a multiprocessor, each warp one round of loads and then the RoPE
// table's): 1.35 TB/s to e4m3 and 1.92 TB/s in place at 16448 rows (docs/BENCHMARKS.md, session
// 24). Holding the row in registers instead took 104-114 registers a thread. Same items, sums and
// roundings as that kernel, so the same bytes. 2-byte T; rows of up to kRowHeads q and k heads.
constexpr int kRowThreads = 256;
constexpr int kRowHeads = 64;

template <typename T, bool kFp8>
__global__ void __launch_bounds__(kRowThreads, 6)
    qk_norm_rope_row_kernel(T* io, const T* __restrict__ wq, const T* __restrict__ wk,
                            const float* __restrict__ freqs, int64_t rows, int64_t seq_if_shared,
                            int hq, int hkv, float eps, uint8_t* __restrict__ out8,
                            float* __restrict__ descale) {
  static_assert(sizeof(T) == 2, "16 lanes of 8 elements a head");
  constexpr int V = 8, L = kD128 / V, kSlots = kRowThreads / L;
  __shared__ Pack16<T> tile[kRowHeads * L];
  __shared__ float4 table[kD128 / 4];
  const int part = static_cast<int>(threadIdx.x) % L, slot = static_cast<int>(threadIdx.x) / L;
  const int nh = hq + hkv, heads_in = hq + 2 * hkv, chunks = nh * L;
  Pack16<T> wqv{}, wkv{};
  if (wq) wqv = reinterpret_cast<const Pack16<T>*>(wq)[part];
  if (wk) wkv = reinterpret_cast<const Pack16<T>*>(wk)[part];
  float inv_q = 1.f, inv_k = 1.f;  // kFp8: 1 / scale
  if constexpr (kFp8) qk_e4m3_scales<T, V, L>(wqv, wkv, descale, inv_q, inv_k);
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    T* row = io + r * heads_in * kD128;
    const auto* src = reinterpret_cast<const Pack16<T>*>(row);
    for (int c = static_cast<int>(threadIdx.x); c < chunks; c += kRowThreads)
      cp_async16(smem_addr(&tile[c]), src + c, true);
    if (freqs && threadIdx.x < kD128 / 4) {
      const int64_t token = seq_if_shared > 0 ? r % seq_if_shared : r;
      cp_async16(smem_addr(&table[threadIdx.x]), freqs + token * kD128 + threadIdx.x * 4, true);
    }
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    float fr[V];
    if (freqs) {
#pragma unroll
      for (int i = 0; i < V / 4; ++i) {
        const float4 c = table[part * (V / 4) + i];
        fr[4 * i] = c.x, fr[4 * i + 1] = c.y, fr[4 * i + 2] = c.z, fr[4 * i + 3] = c.w;
      }
    }
    for (int h0 = 0; h0 < nh; h0 += kSlots) {
      const int h = h0 + slot;  // the same for the 16 lanes of a head
      const bool valid = h < nh, is_q = h < hq;
      float e[V];
      float ss = unpack_sum_sq<T, V>(valid ? tile[h * L + part] : Pack16<T>{}, valid, e);
      // Both half-warps join the reduction (xor offsets below 16 stay inside a head).
#pragma unroll
      for (int o = L / 2; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
      if (!valid) continue;
      if (is_q ? wq != nullptr : wk != nullptr) {
        Pack16<T>
            wv;  // chosen element by element: a reference to either pack put both on the stack
#pragma unroll
        for (int i = 0; i < V; ++i) wv.v[i] = is_q ? wqv.v[i] : wkv.v[i];
        norm_head<T, V>(e, ss, wv, eps);
      }
      if (freqs) rope_pairs<V>(e, fr);
      if constexpr (kFp8) {
        const float inv = is_q ? inv_q : inv_k;
        Bytes<V> o8;
#pragma unroll
        for (int i = 0; i < V; ++i) o8.b[i] = e4m3_code<T>(e[i], inv);
        reinterpret_cast<Bytes<V>*>(out8 + (r * heads_in + h) * kD128)[part] = o8;
      } else {
        Pack16<T> out;
#pragma unroll
        for (int i = 0; i < V; ++i) out.v[i] = from_f32<T>(e[i]);
        reinterpret_cast<Pack16<T>*>(row + h * kD128)[part] = out;
      }
    }
    __syncthreads();  // the tile is refilled for the next row
  }
}

// Launches the head_dim-128 prologue for `rows` rows: the packed forms (q and k heads in place, or
// to e4m3) of 2-byte types in qk_norm_rope_row_kernel under staged_row_kernels(), where the row's
// q and k heads fit it; otherwise, or under ZIMAGE_ROW_KERNELS' items 1, 2 or 4,
// qkv_norm_rope_d128_kernel (also the split form's) with that many passes per warp
// (RowKernelTuning::prologue_items).
template <typename T, bool kPacked, bool kFp8 = false>
cudaError_t launch_d128(const T* qkv, const T* wq, const T* wk, const float* freqs, T* q, T* k,
                        T* v, T* io, int64_t rows, int64_t seq_if_shared, int hq, int hkv,
                        float eps, cudaStream_t s, uint8_t* out8 = nullptr,
                        float* descale = nullptr) {
  const int tuned = row_kernel_tuning().prologue_items;
  if constexpr (kPacked && sizeof(T) == 2) {
    // The packed forms under staged_row_kernels(): a block per row where the row's q and k heads
    // fit it (ZIMAGE_ROW_KERNELS' items 1, 2 or 4 choose the warp-item kernel instead).
    if (tuned == 0 && staged_row_kernels() && hq + hkv <= kRowHeads) {
      const unsigned grid = static_cast<unsigned>(rows < (int64_t{1} << 30) ? rows : 1 << 30);
      qk_norm_rope_row_kernel<T, kFp8><<<grid, kRowThreads, 0, s>>>(
          io, wq, wk, freqs, rows, seq_if_shared, hq, hkv, eps, out8, descale);
      return cudaGetLastError();
    }
  }
  const int passes = tuned != 0 ? tuned : row_kernel_defaults().prologue_items;
  constexpr int64_t G = 32 / (kD128 / (16 / sizeof(T)));  // heads a warp holds at once
  const int64_t items = rows * (kPacked ? hq + hkv : hq + 2 * hkv);
  const int64_t warps = (items + passes * G - 1) / (passes * G);
  const int64_t blocks = (warps + kWarps - 1) / kWarps;
  const unsigned grid = static_cast<unsigned>(blocks < (int64_t{1} << 30) ? blocks : 1 << 30);
  auto launch = [&](auto n) {
    qkv_norm_rope_d128_kernel<T, decltype(n)::value, kPacked, kFp8><<<grid, kWarps * 32, 0, s>>>(
        qkv, wq, wk, freqs, q, k, v, io, rows, seq_if_shared, hq, hkv, eps, out8, descale);
    return cudaGetLastError();
  };
  if (passes == 4) return launch(std::integral_constant<int, 4>{});
  if (passes == 2) return launch(std::integral_constant<int, 2>{});
  return launch(std::integral_constant<int, 1>{});
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

// One warp's kAdaRows rows j0.. of w (all lanes; warp-uniform exits): dst[q] is the output of
// quarter q of 4D, [kB, d] each.
template <typename T, int kB>
__device__ __forceinline__ void adaln_warp_rows(const T* __restrict__ c, const T* __restrict__ w,
                                                const T* __restrict__ bias, T* const (&dst)[4],
                                                int64_t d, int k, int64_t j0, int lane) {
  constexpr int V = kVec16<T>;
  const int64_t n = 4 * d;
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
    T* out = dst[q];
    const float bj = bias ? to_f32<T>(bias[j]) : 0.f;
#pragma unroll
    for (int bi = 0; bi < kB; ++bi) {
      const float m = round_to<T>(warp_sum(acc[r][bi]) + bj);  // the GEMM's output, rounded
      if (lane == bi) out[bi * d + col] = from_f32<T>(q % 2 == 0 ? m + 1.0f : tanhf(m));
    }
  }
}

template <typename T, int kB>
__global__ void adaln_modulation_kernel(const T* __restrict__ c, const T* __restrict__ w,
                                        const T* __restrict__ bias, T* scale_a, T* gate_a,
                                        T* scale_f, T* gate_f, int64_t d, int k) {
  T* const dst[4] = {scale_a, gate_a, scale_f, gate_f};
  const int64_t j0 = (int64_t{blockIdx.x} * kWarps + (threadIdx.x >> 5)) * kAdaRows;
  adaln_warp_rows<T, kB>(c, w, bias, dst, d, k, j0, static_cast<int>(threadIdx.x & 31));
}

// Every layer's projection and modulation in one launch (blockIdx.y: the layer): the weights of
// up to kAdaLayers layers by value, out [layers, 4, kB, d].
template <typename T, int kB>
__global__ void adaln_modulation_layers_kernel(AdaLayerWeights p, const T* __restrict__ c,
                                               T* __restrict__ out, int64_t d, int k) {
  const int layer = static_cast<int>(blockIdx.y);
  T* o = out + int64_t{layer} * 4 * kB * d;
  T* const dst[4] = {o, o + kB * d, o + 2 * kB * d, o + 3 * kB * d};
  const int64_t j0 = (int64_t{blockIdx.x} * kWarps + (threadIdx.x >> 5)) * kAdaRows;
  adaln_warp_rows<T, kB>(c, static_cast<const T*>(p.w[layer]), static_cast<const T*>(p.bias[layer]),
                         dst, d, k, j0, static_cast<int>(threadIdx.x & 31));
}

}  // namespace

bool adaln_modulation_fits(int64_t b, int64_t k, const void* c, const void* w, const void* bias,
                           size_t elem) {
  const int64_t v = static_cast<int64_t>(16 / elem);
  return b >= 1 && b <= kAdaMaxBatch && k > 0 && k <= (int64_t{1} << 30) && k % v == 0 &&
         aligned16(c) && aligned16(w) &&
         (bias == nullptr || reinterpret_cast<uintptr_t>(bias) % elem == 0);
}

namespace {

// launch(std::integral_constant<int, b>) for the batches the adaLN kernels are built for (1..4).
template <typename F>
cudaError_t with_ada_batch(int64_t b, F&& launch) {
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
}

// Blocks of kWarps warps, kAdaRows rows of the 4d outputs a warp; 0 when that does not fit a grid.
int64_t ada_blocks(int64_t d) {
  const int64_t warps = (4 * d + kAdaRows - 1) / kAdaRows;
  const int64_t blocks = (warps + kWarps - 1) / kWarps;
  return blocks < (int64_t{1} << 31) ? blocks : 0;
}

}  // namespace

cudaError_t launch_adaln_modulation(KType t, const void* c, const void* w, const void* bias,
                                    void* scale_a, void* gate_a, void* scale_f, void* gate_f,
                                    int64_t b, int64_t d, int64_t k, cudaStream_t s) {
  if (b <= 0 || d <= 0) return cudaSuccess;
  if (b > kAdaMaxBatch || k <= 0 || k > (int64_t{1} << 30)) return cudaErrorInvalidValue;
  const int64_t blocks = ada_blocks(d);
  if (blocks == 0) return cudaErrorInvalidValue;
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
    return with_ada_batch(b, launch);
  });
}

cudaError_t launch_adaln_modulation_layers(KType t, const AdaLayerWeights& p, int layers,
                                           const void* c, void* out, int64_t b, int64_t d,
                                           int64_t k, cudaStream_t s) {
  if (layers <= 0 || b <= 0 || d <= 0) return cudaSuccess;
  if (layers > kAdaLayers || b > kAdaMaxBatch || k <= 0 || k > (int64_t{1} << 30))
    return cudaErrorInvalidValue;
  const int64_t blocks = ada_blocks(d);
  if (blocks == 0) return cudaErrorInvalidValue;
  return dispatch_ktype(t, [&](auto tag) {
    using T = decltype(tag);
    auto launch = [&](auto nb) {
      adaln_modulation_layers_kernel<T, decltype(nb)::value>
          <<<dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(layers)), kWarps * 32, 0,
             s>>>(p, static_cast<const T*>(c), static_cast<T*>(out), d, static_cast<int>(k));
      return cudaGetLastError();
    };
    return with_ada_batch(b, launch);
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
    if (d128)
      return launch_d128<T, false>(static_cast<const T*>(qkv), static_cast<const T*>(wq),
                                   static_cast<const T*>(wk), freqs, static_cast<T*>(q),
                                   static_cast<T*>(k), static_cast<T*>(v), nullptr, rows,
                                   seq_if_shared, hq, hkv, eps, s);
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
    return launch_d128<T, true>(nullptr, static_cast<const T*>(wq), static_cast<const T*>(wk),
                                freqs, nullptr, nullptr, nullptr, static_cast<T*>(qkv), rows,
                                seq_if_shared, hq, hkv, eps, s);
  });
}

cudaError_t launch_qk_norm_rope_packed_fp8(KType t, const void* qkv, const void* wq, const void* wk,
                                           const float* freqs, void* out8, float* descale,
                                           int64_t rows, int64_t seq_if_shared, int hq, int hkv,
                                           int dh, float eps, cudaStream_t s) {
  if (rows <= 0 || hq + hkv <= 0) return cudaSuccess;
  if (wq == nullptr || wk == nullptr || descale == nullptr || !aligned16(out8) ||
      !qk_norm_rope_packed_fits(qkv, wq, wk, freqs, dh))
    return cudaErrorInvalidValue;
  return dispatch_ktype(t, [&](auto tag) {
    using T = decltype(tag);
    return launch_d128<T, true, true>(
        nullptr, static_cast<const T*>(wq), static_cast<const T*>(wk), freqs, nullptr, nullptr,
        nullptr, const_cast<T*>(static_cast<const T*>(qkv)), rows, seq_if_shared, hq, hkv, eps, s,
        static_cast<uint8_t*>(out8), descale);
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
