// Elementwise kernels: fill, convert, SiLU/tanh, SwiGLU, axpby, broadcast add, sum of squares.
// Memory-bound, so each thread moves one 16-byte pack when every pointer is 16-byte aligned (and
// the broadcast period is a whole number of packs); otherwise the same kernel runs with packs of
// one element. A pack that straddles the end is finished element by element (tails).
#include <algorithm>
#include <climits>
#include <type_traits>

#include "backend/cuda/kernels/bf16x2.cuh"
#include "backend/cuda/kernels/device_utils.cuh"
#include "backend/cuda/kernels/fp8_rows.cuh"

namespace zimage::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float silu_f(float v) {
  return v / (1.0f + expf(-v));
}

// y = f(x) element by element over [0, n), VEC elements a thread at a time (then the tail),
// computed in f32 and stored as D (S = D for the unary ops, S != D for conversions).
template <typename S, typename D, int VEC, typename F>
__global__ void unary_kernel(const S* x, D* y, int64_t n, F f) {
  const int64_t npack = (n + VEC - 1) / VEC;
  for (int64_t p = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; p < npack;
       p += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i0 = p * VEC;
    if (i0 + VEC <= n) {
      float v[VEC];
      load_f32<S, VEC>(x + i0, v);
#pragma unroll
      for (int k = 0; k < VEC; ++k) v[k] = f(v[k]);
      store_f32<D, VEC>(y + i0, v);
    } else {
      for (int64_t i = i0; i < n; ++i) y[i] = from_f32<D>(f(to_f32<S>(x[i])));
    }
  }
}

template <typename T, typename F>
cudaError_t run_unary(const void* x, void* y, int64_t n, F f, cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  const T* xp = static_cast<const T*>(x);
  T* yp = static_cast<T*>(y);
  if (aligned16(x) && aligned16(y)) {
    constexpr int V = kVec16<T>;
    unary_kernel<T, T, V><<<grid_for((n + V - 1) / V, kThreads), kThreads, 0, s>>>(xp, yp, n, f);
  } else {
    unary_kernel<T, T, 1><<<grid_for(n, kThreads), kThreads, 0, s>>>(xp, yp, n, f);
  }
  return cudaGetLastError();
}

struct SiluOp {
  __device__ float operator()(float v) const { return silu_f(v); }
};
struct TanhOp {
  __device__ float operator()(float v) const { return tanhf(v); }
};
// NaN stays NaN, as in torch.clamp and the CPU oracle: fminf/fmaxf alone would turn a NaN image
// into a black one and hide the failure from the pipeline's finite check.
struct ClampOp {
  float lo, hi;
  __device__ float operator()(float v) const { return v != v ? v : fminf(fmaxf(v, lo), hi); }
};

template <typename T, int VEC>
__global__ void fill_kernel(T* dst, int64_t n, float value) {
  const T v = from_f32<T>(value);
  const int64_t npack = (n + VEC - 1) / VEC;
  for (int64_t p = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; p < npack;
       p += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i0 = p * VEC;
    if (i0 + VEC <= n) {
      Pack<T, VEC> pk;
#pragma unroll
      for (int k = 0; k < VEC; ++k) pk.v[k] = v;
      *reinterpret_cast<Pack<T, VEC>*>(dst + i0) = pk;
    } else {
      for (int64_t i = i0; i < n; ++i) dst[i] = v;
    }
  }
}

template <typename S, typename D>
__global__ void convert_kernel(const S* src, D* dst, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    dst[i] = from_f32<D>(to_f32<S>(src[i]));
}

// The identity, for conversions through unary_kernel.
struct CopyOp {
  __device__ float operator()(float v) const { return v; }
};

// y[m, f] = silu(x[m, f]) * x[m, F + f]; the silu result is rounded to T first, as a framework
// computing silu and the product as two ops in T would.
template <typename T, int VEC>
__global__ void swiglu_kernel(const T* x, T* y, int64_t m, int64_t f) {
  const int64_t ppr = (f + VEC - 1) / VEC;  // packs per row
  const int64_t total = m * ppr;
  for (int64_t p = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; p < total;
       p += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = p / ppr, c0 = (p % ppr) * VEC;
    const T* g = x + row * 2 * f;
    const T* u = g + f;
    T* o = y + row * f;
    if (c0 + VEC <= f) {
      float gv[VEC], uv[VEC];
      load_f32<T, VEC>(g + c0, gv);
      load_f32<T, VEC>(u + c0, uv);
#pragma unroll
      for (int k = 0; k < VEC; ++k) gv[k] = round_to<T>(silu_f(gv[k])) * uv[k];
      store_f32<T, VEC>(o + c0, gv);
    } else {
      for (int64_t c = c0; c < f; ++c)
        o[c] = from_f32<T>(round_to<T>(silu_f(to_f32<T>(g[c]))) * to_f32<T>(u[c]));
    }
  }
}

// The same for f a multiple of VEC, laid out as (packs of a row) × (rows): grid.x covers a row's
// packs, grid.y walks the rows, so no thread divides a flat index (two 64-bit divisions per pack
// above, which with SiLU's exp and division make that kernel compute-bound).
template <typename T, int VEC>
__global__ void swiglu_rows_kernel(const T* x, T* y, int64_t m, int64_t f) {
  const int64_t c0 = (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) * VEC;
  if (c0 >= f) return;
  for (int64_t row = blockIdx.y; row < m; row += gridDim.y) {
    const T* g = x + row * 2 * f;
    float gv[VEC], uv[VEC];
    load_f32<T, VEC>(g + c0, gv);
    load_f32<T, VEC>(g + f + c0, uv);
#pragma unroll
    for (int k = 0; k < VEC; ++k) gv[k] = round_to<T>(silu_f(gv[k])) * uv[k];
    store_f32<T, VEC>(y + row * f + c0, gv);
  }
}

// swiglu_rows_kernel's rows quantised as quantize_fp8_rows quantises a row (fp8.cu: the same
// amax, scale, reciprocal and rounding of the values y would hold) into y8 [m, f] e4m3 and
// ys [m]: the feed-forward's w2 input without a pass of its own. One block a row, each of its
// blockDim.x threads holding up to PPT packs of it in registers, as T (the SwiGLU's values are
// T's to begin with: y would hold them): session 24 measured the first form of this kernel at
// 1.5 TB/s, whether with 256 threads of 5 packs each (fp32 registers for a whole row: few rows
// in flight) or 640 threads of 2 packs as fp32 (54 registers a thread, so one block a
// multiprocessor). Rows of up to 640 threads (F = 10240) are compiled for two blocks a
// multiprocessor (47 registers; three would spill).
template <typename T, int VEC, int PPT, int kMaxThreads, int kMinBlocks>
__global__ void __launch_bounds__(kMaxThreads, kMinBlocks)
    swiglu_fp8_rows_kernel(const T* x, __nv_fp8_storage_t* y8, float* ys, int64_t f) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const int packs = static_cast<int>(f / VEC);
  const int nt = static_cast<int>(blockDim.x);
  const T* g = x + row * 2 * f;
  Pack<T, VEC> gate[PPT], up[PPT];
#pragma unroll
  for (int p = 0; p < PPT; ++p) {  // every load issued before any math
    const int pk = threadIdx.x + p * nt;
    if (pk >= packs) continue;
    gate[p] = reinterpret_cast<const Pack<T, VEC>*>(g)[pk];
    up[p] = reinterpret_cast<const Pack<T, VEC>*>(g + f)[pk];
  }
  float amax = 0.f;
#pragma unroll
  for (int p = 0; p < PPT; ++p) {
    const int pk = threadIdx.x + p * nt;
    if (pk >= packs) continue;
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      // The value y would hold, kept as T (exact: it is rounded to T).
      const float y =
          round_to<T>(round_to<T>(silu_f(to_f32<T>(gate[p].v[k]))) * to_f32<T>(up[p].v[k]));
      gate[p].v[k] = from_f32<T>(y);
      amax = fmaxf(amax, fabsf(y));
    }
  }
  amax = block_max(amax, scratch);
  const float inv = fp8_row_finish(amax, threadIdx.x == 0, ys + row);
#pragma unroll
  for (int p = 0; p < PPT; ++p) {
    const int pk = threadIdx.x + p * nt;
    if (pk >= packs) continue;
    float v[VEC];
#pragma unroll
    for (int k = 0; k < VEC; ++k) v[k] = to_f32<T>(gate[p].v[k]);
    store_fp8_codes<VEC>(y8 + row * f + int64_t{pk} * VEC, v, inv);
  }
}

// swiglu_fp8_rows_kernel for bf16 on bf16x2 pairs (bf16x2.cuh): the same bytes with fewer
// instructions (the fp32 form is issue-bound, docs/BENCHMARKS.md "Session 27"). The SiLU itself
// stays fp32, expf and an IEEE division, as every other SwiGLU here computes it.
template <int PPT, int kMaxThreads, int kMinBlocks>
__global__ void __launch_bounds__(kMaxThreads, kMinBlocks)
    swiglu_fp8_rows_bf16x2_kernel(const __nv_bfloat16* x, __nv_fp8_storage_t* y8, float* ys,
                                  int64_t f) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const int packs = static_cast<int>(f / 8);
  const int nt = static_cast<int>(blockDim.x);
  const __nv_bfloat16* g = x + row * 2 * f;
  Bf16x8 gate[PPT], up[PPT];
#pragma unroll
  for (int p = 0; p < PPT; ++p) {  // every load issued before any math
    const int pk = threadIdx.x + p * nt;
    if (pk >= packs) continue;
    gate[p] = load_bf16x8(g + pk * 8);
    up[p] = load_bf16x8(g + f + pk * 8);
  }
  __nv_bfloat162 amax2 = __float2bfloat162_rn(0.f);
#pragma unroll
  for (int p = 0; p < PPT; ++p) {
    const int pk = threadIdx.x + p * nt;
    if (pk >= packs) continue;
#pragma unroll
    for (int k = 0; k < 4; ++k) {  // y = silu(gate) rounded, times up rounded: y's values
      const float2 gf = __bfloat1622float2(gate[p].h[k]);
      gate[p].h[k] = __hmul2(__floats2bfloat162_rn(silu_f(gf.x), silu_f(gf.y)), up[p].h[k]);
    }
    amax2 = max_abs_bf16x8(gate[p], amax2);
  }
  const float amax = block_max(fmaxf(__low2float(amax2), __high2float(amax2)), scratch);
  const float inv = fp8_row_finish(amax, threadIdx.x == 0, ys + row);
#pragma unroll
  for (int p = 0; p < PPT; ++p) {
    const int pk = threadIdx.x + p * nt;
    if (pk < packs) store_fp8_codes_bf16x8(y8 + row * f + int64_t{pk} * 8, gate[p], inv);
  }
}

template <typename T, int VEC>
__global__ void axpby_kernel(float a, const T* x, float b, const T* y, T* out, int64_t n) {
  const int64_t npack = (n + VEC - 1) / VEC;
  for (int64_t p = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; p < npack;
       p += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i0 = p * VEC;
    if (i0 + VEC <= n) {
      float xv[VEC], yv[VEC];
      load_f32<T, VEC>(x + i0, xv);
      load_f32<T, VEC>(y + i0, yv);
#pragma unroll
      for (int k = 0; k < VEC; ++k) xv[k] = a * xv[k] + b * yv[k];
      store_f32<T, VEC>(out + i0, xv);
    } else {
      for (int64_t i = i0; i < n; ++i)
        out[i] = from_f32<T>(a * to_f32<T>(x[i]) + b * to_f32<T>(y[i]));
    }
  }
}

// out[i] = x[i] + y[i % ny]. With VEC > 1, ny is a multiple of VEC so a pack never wraps.
template <typename T, int VEC>
__global__ void add_kernel(const T* x, const T* y, T* out, int64_t n, int64_t ny) {
  const int64_t npack = (n + VEC - 1) / VEC;
  for (int64_t p = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; p < npack;
       p += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i0 = p * VEC;
    if (i0 + VEC <= n) {
      float xv[VEC], yv[VEC];
      load_f32<T, VEC>(x + i0, xv);
      load_f32<T, VEC>(y + i0 % ny, yv);
#pragma unroll
      for (int k = 0; k < VEC; ++k) xv[k] += yv[k];
      store_f32<T, VEC>(out + i0, xv);
    } else {
      for (int64_t i = i0; i < n; ++i) out[i] = from_f32<T>(to_f32<T>(x[i]) + to_f32<T>(y[i % ny]));
    }
  }
}

// Grid (blocks_per_row, rows); each block adds its partial sum (fp64) into out[row].
template <typename T>
__global__ void sum_squares_kernel(const T* x, int64_t cols, double* out) {
  __shared__ double scratch[32];
  const T* row = x + blockIdx.y * cols;
  double acc = 0.0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < cols;
       i += int64_t{gridDim.x} * blockDim.x) {
    const double v = to_f32<T>(row[i]);
    acc += v * v;
  }
  acc = block_sum(acc, scratch);
  if (threadIdx.x == 0) atomicAdd(out + blockIdx.y, acc);
}

// The reference pipeline's host arithmetic, one IEEE rounding per operation: the explicit _rn
// intrinsics keep nvcc from contracting a*b + c into a fused multiply-add, so the result is
// bit-identical to the CPU's.
__global__ void guided_euler_kernel(const float* pos, const float* neg, float g, float dt, float* x,
                                    int64_t n) {
  for (int64_t k = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; k < n;
       k += int64_t{gridDim.x} * blockDim.x) {
    float pred = pos[k];
    if (neg != nullptr) {
      const float d = __fsub_rn(pred, neg[k]);
      const float gd = __fmul_rn(g, d);
      pred = __fadd_rn(pred, gd);
    }
    const float dv = __fmul_rn(dt, -pred);
    x[k] = __fadd_rn(x[k], dv);
  }
}

// One thread per latent pixel: the three colours of Backend::latent_to_rgb, the CPU oracle's
// order and roundings (the _rn intrinsics forbid contraction into fused multiply-adds).
__global__ void latent_to_rgb_kernel(const float* x, int64_t n, int64_t hw, LatentRgbParams p,
                                     uint8_t* rgb) {
  for (int64_t q = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; q < n * hw;
       q += int64_t{gridDim.x} * blockDim.x) {
    const float* xp = x + (q / hw) * p.channels * hw + q % hw;
    float v[3] = {p.bias[0], p.bias[1], p.bias[2]};
    for (int c = 0; c < p.channels; ++c) {
      const float xc = xp[c * hw];
      for (int k = 0; k < 3; ++k) v[k] = __fadd_rn(v[k], __fmul_rn(p.w[c * 3 + k], xc));
    }
    for (int k = 0; k < 3; ++k) {
      float u = __fdiv_rn(__fadd_rn(v[k], 1.0f), 2.0f);
      if (!(u > 0.0f)) u = 0.0f;  // NaN too
      if (u > 1.0f) u = 1.0f;
      rgb[q * 3 + k] = static_cast<uint8_t>(__fmul_rn(u, 255.0f));
    }
  }
}

// One thread per element; the _rn intrinsics keep the CPU oracle's separate roundings.
template <typename T>
__global__ void image_to_rgb8_kernel(const T* x, int64_t n, uint8_t* rgb) {
  for (int64_t k = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; k < n;
       k += int64_t{gridDim.x} * blockDim.x) {
    const float v = to_f32<T>(x[k]);
    if (!isfinite(v)) {
      rgb[k] = 0;
      continue;
    }
    const float u = round_to<T>(__fadd_rn(round_to<T>(__fmul_rn(0.5f, v)), 0.5f));
    const float c = fminf(fmaxf(u, 0.0f), 1.0f);
    rgb[k] = static_cast<uint8_t>(__float2int_rn(__fmul_rn(c, 255.0f)));  // ties to even
  }
}

template <typename T>
__global__ void count_nonfinite_kernel(const T* x, int64_t n, unsigned long long* out) {
  unsigned long long bad = 0;
  for (int64_t k = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; k < n;
       k += int64_t{gridDim.x} * blockDim.x) {
    bad += isfinite(to_f32<T>(x[k])) ? 0 : 1;
  }
  if (bad != 0) atomicAdd(out, bad);  // rare: only a broken run pays for atomics
}

__global__ void write_i32_kernel(int32_t* dst, I32Values values) {
  const int i = static_cast<int>(threadIdx.x);
  if (i < values.n) dst[i] = values.v[i];
}

}  // namespace

cudaError_t launch_write_i32(int32_t* dst, const I32Values& values, cudaStream_t s) {
  if (values.n <= 0) return cudaSuccess;
  if (values.n > I32Values::kMax) return cudaErrorInvalidValue;
  write_i32_kernel<<<1, I32Values::kMax, 0, s>>>(dst, values);
  return cudaGetLastError();
}

cudaError_t launch_guided_euler(const float* pos, const float* neg, float g, float dt, float* x,
                                int64_t n, cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  guided_euler_kernel<<<grid_for(n, kThreads), kThreads, 0, s>>>(pos, neg, g, dt, x, n);
  return cudaGetLastError();
}

cudaError_t launch_image_to_rgb8(KType t, const void* x, int64_t n, uint8_t* rgb, cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  return dispatch_ktype(t, [&](auto tag) {
    using T = decltype(tag);
    image_to_rgb8_kernel<T>
        <<<grid_for(n, kThreads), kThreads, 0, s>>>(static_cast<const T*>(x), n, rgb);
    return cudaGetLastError();
  });
}

cudaError_t launch_latent_to_rgb(const float* x, int64_t n, int64_t hw, const LatentRgbParams& p,
                                 uint8_t* rgb, cudaStream_t s) {
  if (n * hw <= 0) return cudaSuccess;
  latent_to_rgb_kernel<<<grid_for(n * hw, kThreads), kThreads, 0, s>>>(x, n, hw, p, rgb);
  return cudaGetLastError();
}

cudaError_t launch_count_nonfinite(KType t, const void* x, int64_t n, unsigned long long* out,
                                   cudaStream_t s) {
  cudaError_t e = cudaMemsetAsync(out, 0, sizeof(unsigned long long), s);
  if (e != cudaSuccess || n <= 0) return e;
  return dispatch_ktype(t, [&](auto tag) {
    using T = decltype(tag);
    int64_t blocks = (n + kThreads * 8 - 1) / (kThreads * 8);
    if (blocks > 4096) blocks = 4096;
    count_nonfinite_kernel<T>
        <<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(static_cast<const T*>(x), n, out);
    return cudaGetLastError();
  });
}

cudaError_t launch_fill(KType t, void* dst, int64_t n, float value, cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  return dispatch_ktype(t, [&](auto tag) {
    using T = decltype(tag);
    T* p = static_cast<T*>(dst);
    if (aligned16(dst)) {
      constexpr int V = kVec16<T>;
      fill_kernel<T, V><<<grid_for((n + V - 1) / V, kThreads), kThreads, 0, s>>>(p, n, value);
    } else {
      fill_kernel<T, 1><<<grid_for(n, kThreads), kThreads, 0, s>>>(p, n, value);
    }
    return cudaGetLastError();
  });
}

cudaError_t launch_convert(KType from, const void* src, KType to, void* dst, int64_t n,
                           cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  return dispatch_ktype(from, [&](auto stag) {
    using S = decltype(stag);
    return dispatch_ktype(to, [&](auto dtag) {
      using D = decltype(dtag);
      const S* sp = static_cast<const S*>(src);
      D* dp = static_cast<D*>(dst);
      constexpr int V = 8;  // 8 elements: 16 or 32 bytes of f32, 16 of bf16/f16
      if ((reinterpret_cast<uintptr_t>(src) % (sizeof(S) * V)) == 0 &&
          (reinterpret_cast<uintptr_t>(dst) % (sizeof(D) * V)) == 0) {
        unary_kernel<S, D, V>
            <<<grid_for((n + V - 1) / V, kThreads), kThreads, 0, s>>>(sp, dp, n, CopyOp{});
      } else {
        convert_kernel<S, D><<<grid_for(n, kThreads), kThreads, 0, s>>>(sp, dp, n);
      }
      return cudaGetLastError();
    });
  });
}

cudaError_t launch_unary(UnaryOp op, KType t, const void* x, void* y, int64_t n, cudaStream_t s) {
  return dispatch_ktype(t, [&](auto tag) {
    using T = decltype(tag);
    return op == UnaryOp::kSilu ? run_unary<T>(x, y, n, SiluOp{}, s)
                                : run_unary<T>(x, y, n, TanhOp{}, s);
  });
}

cudaError_t launch_clamp(KType t, const void* x, void* y, int64_t n, float lo, float hi,
                         cudaStream_t s) {
  return dispatch_ktype(t, [&](auto tag) {
    using T = decltype(tag);
    return run_unary<T>(x, y, n, ClampOp{lo, hi}, s);
  });
}

cudaError_t launch_swiglu(KType t, const void* x, void* y, int64_t m, int64_t f, cudaStream_t s) {
  if (m <= 0 || f <= 0) return cudaSuccess;
  return dispatch_ktype(t, [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = kVec16<T>;
    const T* xp = static_cast<const T*>(x);
    T* yp = static_cast<T*>(y);
    const int walk = row_kernel_tuning().row_walk;
    if (aligned16(x) && aligned16(y) && f % V == 0 &&
        (walk != 0 ? walk : row_kernel_defaults().row_walk) == 2) {
      const int64_t bx = (f / V + kThreads - 1) / kThreads;
      const int64_t by = std::min<int64_t>(m, 65535);
      if (bx > INT32_MAX) return cudaErrorInvalidValue;
      swiglu_rows_kernel<T, V>
          <<<dim3(static_cast<unsigned>(bx), static_cast<unsigned>(by)), kThreads, 0, s>>>(xp, yp,
                                                                                           m, f);
    } else if (aligned16(x) && aligned16(y) && f % V == 0) {
      swiglu_kernel<T, V><<<grid_for(m * (f / V), kThreads), kThreads, 0, s>>>(xp, yp, m, f);
    } else {
      swiglu_kernel<T, 1><<<grid_for(m * f, kThreads), kThreads, 0, s>>>(xp, yp, m, f);
    }
    return cudaGetLastError();
  });
}

cudaError_t launch_swiglu_fp8(KType t, const void* x, void* y8, float* y_scale, int64_t m,
                              int64_t f, cudaStream_t s) {
  if (m <= 0 || f <= 0) return cudaSuccess;
  return dispatch_ktype(t, [&](auto tag) -> cudaError_t {
    using T = decltype(tag);
    constexpr int V = kVec16<T>;
    const int64_t packs = f / V;
    if (f % V != 0 || packs > int64_t{2} * 1024 || !aligned16(x) ||
        reinterpret_cast<uintptr_t>(y8) % V != 0 || m > 0x7fffffff)
      return cudaErrorNotSupported;
    // Two packs a thread, as many threads as the row needs (640 for F = 10240), whole warps.
    const unsigned threads = static_cast<unsigned>(((packs + 1) / 2 + 31) / 32 * 32);
    const auto* xp = static_cast<const T*>(x);
    auto* qp = static_cast<__nv_fp8_storage_t*>(y8);
    const unsigned grid = static_cast<unsigned>(m);
    if constexpr (std::is_same_v<T, __nv_bfloat16>) {
      if (packed_row_kernels()) {
        auto* bp = static_cast<const __nv_bfloat16*>(x);
        if (threads <= 640)
          swiglu_fp8_rows_bf16x2_kernel<2, 640, 2><<<grid, threads, 0, s>>>(bp, qp, y_scale, f);
        else
          swiglu_fp8_rows_bf16x2_kernel<2, 1024, 1><<<grid, threads, 0, s>>>(bp, qp, y_scale, f);
        return cudaGetLastError();
      }
    }
    if (threads <= 640)
      swiglu_fp8_rows_kernel<T, V, 2, 640, 2><<<grid, threads, 0, s>>>(xp, qp, y_scale, f);
    else
      swiglu_fp8_rows_kernel<T, V, 2, 1024, 1><<<grid, threads, 0, s>>>(xp, qp, y_scale, f);
    return cudaGetLastError();
  });
}

cudaError_t launch_axpby(KType t, float a, const void* x, float b, const void* y, void* out,
                         int64_t n, cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  return dispatch_ktype(t, [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = kVec16<T>;
    const T* xp = static_cast<const T*>(x);
    const T* yp = static_cast<const T*>(y);
    T* op = static_cast<T*>(out);
    if (aligned16(x) && aligned16(y) && aligned16(out)) {
      axpby_kernel<T, V>
          <<<grid_for((n + V - 1) / V, kThreads), kThreads, 0, s>>>(a, xp, b, yp, op, n);
    } else {
      axpby_kernel<T, 1><<<grid_for(n, kThreads), kThreads, 0, s>>>(a, xp, b, yp, op, n);
    }
    return cudaGetLastError();
  });
}

cudaError_t launch_add(KType t, const void* x, const void* y, void* out, int64_t n, int64_t ny,
                       cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  if (ny <= 0 || n % ny != 0) return cudaErrorInvalidValue;
  return dispatch_ktype(t, [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = kVec16<T>;
    const T* xp = static_cast<const T*>(x);
    const T* yp = static_cast<const T*>(y);
    T* op = static_cast<T*>(out);
    if (aligned16(x) && aligned16(y) && aligned16(out) && ny % V == 0) {
      add_kernel<T, V><<<grid_for((n + V - 1) / V, kThreads), kThreads, 0, s>>>(xp, yp, op, n, ny);
    } else {
      add_kernel<T, 1><<<grid_for(n, kThreads), kThreads, 0, s>>>(xp, yp, op, n, ny);
    }
    return cudaGetLastError();
  });
}

cudaError_t launch_sum_squares(KType t, const void* x, int64_t rows, int64_t cols, double* out,
                               cudaStream_t s) {
  if (rows <= 0) return cudaSuccess;
  cudaError_t e = cudaMemsetAsync(out, 0, sizeof(double) * rows, s);
  if (e != cudaSuccess || cols <= 0) return e;
  return dispatch_ktype(t, [&](auto tag) {
    using T = decltype(tag);
    int64_t bx = (cols + kThreads * 8 - 1) / (kThreads * 8);
    if (bx > 1024) bx = 1024;
    for (int64_t r0 = 0; r0 < rows; r0 += 65535) {  // grid.y is limited to 65535
      const int64_t nr = rows - r0 < 65535 ? rows - r0 : 65535;
      dim3 grid(static_cast<unsigned>(bx), static_cast<unsigned>(nr));
      sum_squares_kernel<T>
          <<<grid, kThreads, 0, s>>>(static_cast<const T*>(x) + r0 * cols, cols, out + r0);
      cudaError_t err = cudaGetLastError();
      if (err != cudaSuccess) return err;
    }
    return cudaSuccess;
  });
}

}  // namespace zimage::cuda
