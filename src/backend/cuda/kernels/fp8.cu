// FP8 (e4m3) quantisation with one scale per tensor, computed on the device without a host round
// trip, so it can sit inside a CUDA graph: amax = max |x| (atomicMax on the float's bits, which
// order like the values for non-negative floats), then q = saturate(x / s) with s = amax / 448
// written next to the data. cuBLASLt reads s through a device pointer.
#include <cuda_fp8.h>

#include "backend/cuda/kernels/device_utils.cuh"
#include "backend/cuda/kernels/fp8_rows.cuh"
#include "backend/cuda/kernels/kernels.h"
#include "backend/fp8_attention.h"

namespace zimage::cuda {
namespace {

constexpr int kThreads = 256;
constexpr float kE4M3Max = kFp8Max;  // backend/fp8_attention.h

template <typename T>
__global__ void amax_kernel(const T* __restrict__ x, int64_t n, unsigned int* __restrict__ amax) {
  float m = 0.f;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    m = fmaxf(m, fabsf(to_f32<T>(x[i])));
  for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
  __shared__ float warp_max[kThreads / 32];
  if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x >> 5] = m;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kThreads / 32; ++w) m = fmaxf(m, warp_max[w]);
    atomicMax(amax, __float_as_uint(m));  // m >= 0: bit order = value order (NaN: largest)
  }
}

__device__ __forceinline__ float scale_of(unsigned int amax_bits) {
  const float a = __uint_as_float(amax_bits);
  return a > 0.f && a < 3.0e38f ? a / kE4M3Max : 1.f;  // all-zero (or non-finite) input: 1
}

template <typename T>
__global__ void quantize_kernel(const T* __restrict__ x, int64_t n,
                                const unsigned int* __restrict__ amax, float* __restrict__ scale,
                                __nv_fp8_storage_t* __restrict__ q) {
  const float s = scale_of(*amax);
  const float inv = 1.f / s;
  if (blockIdx.x == 0 && threadIdx.x == 0) *scale = s;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float v = fminf(fmaxf(to_f32<T>(x[i]) * inv, -kE4M3Max), kE4M3Max);
    q[i] = __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
  }
}

template <typename T>
__global__ void quantize_rows_kernel(const T* __restrict__ w, int64_t cols,
                                     __nv_fp8_storage_t* __restrict__ q,
                                     float* __restrict__ scale) {
  const int64_t row = blockIdx.x;
  const T* wr = w + row * cols;
  float m = 0.f;
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) m = fmaxf(m, fabsf(to_f32<T>(wr[i])));
  __shared__ float scratch[32];
  const float inv = fp8_row_finish(block_max(m, scratch), threadIdx.x == 0, scale + row);
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x)
    q[row * cols + i] = fp8_code(to_f32<T>(wr[i]), inv);
}

// quantize_rows_kernel with 16-byte loads (8 bf16 / half elements, 4 floats) and the codes
// stored 8 or 4 at a time: the same operations in the same order, so the same bytes and scales,
// for rows whose length is a multiple of the pack and whose operands are aligned to it. The inputs
// of the W8A8 linears that no op before them quantises (matmul_fp8_rows: the attention's output,
// and all of them with ZIMAGE_FP8_INPUTS=0) pass through here, where the element-wise kernel's
// 2-byte loads and 1-byte stores ran well below the memory's rate.
//
// kStaged (rows of up to 48 KB beside block_max's scratch): the row is copied into shared memory
// with cp.async, all of it in flight at once, and both passes (its max, then its codes) read it
// there. Otherwise (longer rows) the row is read twice, the second time from L1 / L2, and each
// thread's loads of the first pass wait on one another around the loop. On an H100, staged,
// 4160 / 16448 bf16 rows of 10240 took 0.048 / 0.169 ms against 0.053 / 0.183 read twice
// (CudaOpsPerf.SwigluFp8), and FP8 forwards (all,sdpa) 59.2 / 345 ms at 1024² / 2048² against
// 59.7 / 347 (docs/BENCHMARKS.md "Session 26").
template <typename T, bool kStaged>
__global__ void quantize_rows_vec_kernel(const T* __restrict__ w, int64_t cols,
                                         __nv_fp8_storage_t* __restrict__ q,
                                         float* __restrict__ scale) {
  constexpr int V = kVec16<T>;
  extern __shared__ uint4 row_tile[];  // kStaged: the row's packs
  const int64_t row = blockIdx.x;
  const T* wr = w + row * cols;
  const int64_t packs = cols / V;
  if constexpr (kStaged) {
    for (int64_t p = threadIdx.x; p < packs; p += blockDim.x)
      cp_async16(smem_addr(&row_tile[p]), wr + p * V, true);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
  }
  auto pack = [&](int64_t p, float(&v)[V]) {
    if constexpr (kStaged)
      load_f32<T, V>(reinterpret_cast<const T*>(&row_tile[p]), v);
    else
      load_f32<T, V>(wr + p * V, v);
  };
  float m = 0.f;
  for (int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
    float v[V];
    pack(p, v);
#pragma unroll
    for (int i = 0; i < V; ++i) m = fmaxf(m, fabsf(v[i]));
  }
  __shared__ float scratch[32];
  const float inv = fp8_row_finish(block_max(m, scratch), threadIdx.x == 0, scale + row);
  for (int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
    float v[V];
    pack(p, v);
    store_fp8_codes<V>(q + row * cols + p * V, v, inv);
  }
}

// Rows whose max |value| the op that wrote them already took (row_amax: float bits, e.g. the FP8
// SwiGLU GEMM's epilogue, gemm_fp8_swiglu.cu), quantised as quantize_rows_vec_kernel quantises
// them: the same scale, reciprocal and codes, without the pass that finds the max. Rows of a
// multiple of the pack; a thread takes one pack of each row it visits (grid.x across a row,
// grid.y down the rows).
template <typename T>
__global__ void quantize_rows_amax_kernel(const T* __restrict__ x,
                                          const unsigned int* __restrict__ row_amax, int64_t rows,
                                          int64_t cols, __nv_fp8_storage_t* __restrict__ q,
                                          float* __restrict__ scale) {
  constexpr int V = kVec16<T>;
  const int64_t packs = cols / V;
  const int64_t p = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const float inv =
        fp8_row_finish(__uint_as_float(row_amax[r]), p == 0, scale + r);  // one writer a row
    if (p >= packs) continue;
    float v[V];
    load_f32<T, V>(x + r * cols + p * V, v);
    store_fp8_codes<V>(q + r * cols + p * V, v, inv);
  }
}

template <typename T, __nv_fp8_interpretation_t kFormat>
__global__ void dequantize_rows_kernel(const __nv_fp8_storage_t* __restrict__ q,
                                       const float* __restrict__ scale, int64_t rows, int64_t cols,
                                       T* __restrict__ out) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const __half_raw h = __nv_cvt_fp8_to_halfraw(q[i], kFormat);
    out[i] = from_f32<T>(__fmul_rn(__half2float(__half(h)), scale[i / cols]));
  }
}

template <typename T>
__global__ void scale_rows_cols_kernel(T* __restrict__ y, const float* __restrict__ sx,
                                       const float* __restrict__ sw, const T* __restrict__ bias,
                                       int64_t m, int64_t n) {
  const int64_t total = m * n;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / n, c = i - r * n;
    float v = __fmul_rn(__fmul_rn(to_f32<T>(y[i]), sx[r]), sw[c]);
    if (bias) v = __fadd_rn(v, to_f32<T>(bias[c]));
    y[i] = from_f32<T>(v);
  }
}

// The v heads of a packed projection to e4m3, one scale per head (the FP8 attention's V):
// packed_v_amax_kernel takes max |v| per head over the rows (a block's threads keep their packs'
// heads fixed from row to row, so each reduces in registers, then over the lanes sharing a
// head, then one atomic per head and block); quantize_packed_v_kernel divides by amax / 448 and
// writes the bytes at the same element offsets of out8. Head dim 128 (16 lanes of 8 bf16).
constexpr int kVHeadDim = 128;
constexpr int kVMaxPacksPerThread = 8;  // hkv · 128 / pack <= 8 · kThreads

template <typename T>
__global__ void packed_v_amax_kernel(const T* __restrict__ qkv, int64_t rows, int heads_in, int v0,
                                     int hkv, unsigned int* __restrict__ amax) {
  constexpr int V = kVec16<T>, L = kVHeadDim / V;  // elements per pack, packs per head
  const int packs = hkv * L;
  float m[kVMaxPacksPerThread];
#pragma unroll
  for (int j = 0; j < kVMaxPacksPerThread; ++j) m[j] = 0.f;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* row = qkv + (r * heads_in + v0) * kVHeadDim;
#pragma unroll
    for (int j = 0; j < kVMaxPacksPerThread; ++j) {
      const int p = static_cast<int>(threadIdx.x) + j * kThreads;
      if (p >= packs) break;
      const Pack<T, V> pk = reinterpret_cast<const Pack<T, V>*>(row)[p];
#pragma unroll
      for (int i = 0; i < V; ++i) m[j] = fmaxf(m[j], fabsf(to_f32<T>(pk.v[i])));
    }
  }
#pragma unroll
  for (int j = 0; j < kVMaxPacksPerThread; ++j) {
    const int p = static_cast<int>(threadIdx.x) + j * kThreads;
    float x = m[j];
#pragma unroll
    for (int o = L / 2; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    if (p < packs && p % L == 0) atomicMax(amax + p / L, __float_as_uint(x));
  }
}

__device__ __forceinline__ float v_descale_of(unsigned int amax_bits) {
  return fp8_attention_v_scale(__uint_as_float(amax_bits));
}

template <typename T>
__global__ void quantize_packed_v_kernel(const T* __restrict__ qkv, int64_t rows, int heads_in,
                                         int v0, int hkv, const unsigned int* __restrict__ amax,
                                         float* __restrict__ v_descale,
                                         uint8_t* __restrict__ out8) {
  constexpr int V = kVec16<T>, L = kVHeadDim / V;
  const int packs = hkv * L;
  if (blockIdx.x == 0)
    for (int h = static_cast<int>(threadIdx.x); h < hkv; h += kThreads)
      v_descale[h] = v_descale_of(amax[h]);
  float inv[kVMaxPacksPerThread];
#pragma unroll
  for (int j = 0; j < kVMaxPacksPerThread; ++j) {
    const int p = static_cast<int>(threadIdx.x) + j * kThreads;
    inv[j] = p < packs ? __frcp_rn(v_descale_of(amax[p / L])) : 1.f;
  }
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t off = (r * heads_in + v0) * kVHeadDim;
#pragma unroll
    for (int j = 0; j < kVMaxPacksPerThread; ++j) {
      const int p = static_cast<int>(threadIdx.x) + j * kThreads;
      if (p >= packs) break;
      const Pack<T, V> pk = reinterpret_cast<const Pack<T, V>*>(qkv + off)[p];
      Pack<uint8_t, V> o;
#pragma unroll
      for (int i = 0; i < V; ++i) {
        const float x = fminf(fmaxf(__fmul_rn(to_f32<T>(pk.v[i]), inv[j]), -kE4M3Max), kE4M3Max);
        o.v[i] = __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
      }
      reinterpret_cast<Pack<uint8_t, V>*>(out8 + off)[p] = o;
    }
  }
}

}  // namespace

cudaError_t launch_scale_rows_cols(KType t, void* y, const float* sx, const float* sw,
                                   const void* bias, int64_t m, int64_t n, cudaStream_t s) {
  const int64_t total = m * n;
  if (total <= 0) return cudaSuccess;
  return dispatch_ktype(t, [&](auto tag) {
    using T = decltype(tag);
    const unsigned grid =
        grid_for(total, kThreads) < 65535u * 8 ? grid_for(total, kThreads) : 65535u * 8;
    scale_rows_cols_kernel<T>
        <<<grid, kThreads, 0, s>>>(static_cast<T*>(y), sx, sw, static_cast<const T*>(bias), m, n);
    return cudaGetLastError();
  });
}

cudaError_t launch_quantize_fp8_rows(KType t, const void* w, int64_t rows, int64_t cols, void* q,
                                     float* scale, cudaStream_t s) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  if (rows > 0x7fffffff) return cudaErrorInvalidValue;
  return dispatch_ktype(t, [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = kVec16<T>;
    const size_t row_bytes = static_cast<size_t>(cols) * sizeof(T);
    if (cols % V == 0 && aligned16(w) && (reinterpret_cast<uintptr_t>(q) % V) == 0) {
      if (row_bytes + 32 * sizeof(float) <= 48 * 1024)
        quantize_rows_vec_kernel<T, true><<<static_cast<unsigned>(rows), kThreads, row_bytes, s>>>(
            static_cast<const T*>(w), cols, static_cast<__nv_fp8_storage_t*>(q), scale);
      else
        quantize_rows_vec_kernel<T, false><<<static_cast<unsigned>(rows), kThreads, 0, s>>>(
            static_cast<const T*>(w), cols, static_cast<__nv_fp8_storage_t*>(q), scale);
    } else
      quantize_rows_kernel<T><<<static_cast<unsigned>(rows), kThreads, 0, s>>>(
          static_cast<const T*>(w), cols, static_cast<__nv_fp8_storage_t*>(q), scale);
    return cudaGetLastError();
  });
}

cudaError_t launch_quantize_rows_amax(KType t, const void* x, const unsigned int* row_amax,
                                      int64_t rows, int64_t cols, void* q, float* scale,
                                      cudaStream_t s) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  return dispatch_ktype(t, [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = kVec16<T>;
    if (cols % V != 0 || !aligned16(x) || (reinterpret_cast<uintptr_t>(q) % V) != 0 ||
        row_amax == nullptr || scale == nullptr)
      return cudaErrorInvalidValue;
    const int64_t packs = cols / V;
    if (packs > int64_t{kThreads} * 65535) return cudaErrorInvalidValue;
    const dim3 grid(static_cast<unsigned>((packs + kThreads - 1) / kThreads),
                    static_cast<unsigned>(rows < 65535 ? rows : 65535));
    quantize_rows_amax_kernel<T><<<grid, kThreads, 0, s>>>(
        static_cast<const T*>(x), row_amax, rows, cols, static_cast<__nv_fp8_storage_t*>(q), scale);
    return cudaGetLastError();
  });
}

cudaError_t launch_dequantize_fp8_rows(KType t, const void* q, const float* scale, int64_t rows,
                                       int64_t cols, void* out, cudaStream_t s, bool e5m2) {
  const int64_t n = rows * cols;
  if (n <= 0) return cudaSuccess;
  return dispatch_ktype(t, [&](auto tag) {
    using T = decltype(tag);
    const unsigned grid = grid_for(n, kThreads) < 65535u * 8 ? grid_for(n, kThreads) : 65535u * 8;
    const auto* qp = static_cast<const __nv_fp8_storage_t*>(q);
    if (e5m2)
      dequantize_rows_kernel<T, __NV_E5M2>
          <<<grid, kThreads, 0, s>>>(qp, scale, rows, cols, static_cast<T*>(out));
    else
      dequantize_rows_kernel<T, __NV_E4M3>
          <<<grid, kThreads, 0, s>>>(qp, scale, rows, cols, static_cast<T*>(out));
    return cudaGetLastError();
  });
}

cudaError_t launch_quantize_fp8(KType t, const void* x, int64_t n, void* amax_scratch, float* scale,
                                void* q, cudaStream_t s) {
  auto* amax = static_cast<unsigned int*>(amax_scratch);
  const cudaError_t e = cudaMemsetAsync(amax, 0, sizeof(unsigned int), s);
  if (e != cudaSuccess) return e;
  if (n <= 0) {  // nothing to scan: the scale is 1
    quantize_kernel<float><<<1, 1, 0, s>>>(nullptr, 0, amax, scale, nullptr);
    return cudaGetLastError();
  }
  return dispatch_ktype(t, [&](auto tag) {
    using T = decltype(tag);
    // The max: a capped grid (one atomic per block); the quantisation: one thread per element.
    const unsigned scan = grid_for(n, kThreads) < 2048u ? grid_for(n, kThreads) : 2048u;
    amax_kernel<T><<<scan, kThreads, 0, s>>>(static_cast<const T*>(x), n, amax);
    quantize_kernel<T><<<grid_for(n, kThreads), kThreads, 0, s>>>(
        static_cast<const T*>(x), n, amax, scale, static_cast<__nv_fp8_storage_t*>(q));
    return cudaGetLastError();
  });
}

cudaError_t launch_quantize_packed_v_fp8(KType t, const void* qkv, void* out8, void* amax_scratch,
                                         float* v_descale, int64_t rows, int hq, int hkv, int dh,
                                         cudaStream_t s) {
  if (dh != kVHeadDim || hkv <= 0 || hq < 0 || !aligned16(qkv) || !aligned16(out8) ||
      amax_scratch == nullptr || v_descale == nullptr)
    return cudaErrorInvalidValue;
  auto* amax = static_cast<unsigned int*>(amax_scratch);
  cudaError_t e = cudaMemsetAsync(amax, 0, sizeof(unsigned int) * hkv, s);
  if (e != cudaSuccess) return e;
  return dispatch_ktype(t, [&](auto tag) {
    using T = decltype(tag);
    if (hkv * (kVHeadDim / kVec16<T>) > kVMaxPacksPerThread * kThreads)
      return cudaErrorInvalidValue;
    const int heads_in = hq + 2 * hkv, v0 = hq + hkv;
    // The max over a capped grid (one atomic per head and block); the quantisation over all rows.
    const unsigned scan = rows < 1024 ? static_cast<unsigned>(rows > 0 ? rows : 1) : 1024u;
    const unsigned grid =
        rows < 65535 * 16 ? static_cast<unsigned>(rows > 0 ? rows : 1) : 65535u * 16;
    const auto* x = static_cast<const T*>(qkv);
    packed_v_amax_kernel<T><<<scan, kThreads, 0, s>>>(x, rows, heads_in, v0, hkv, amax);
    quantize_packed_v_kernel<T><<<grid, kThreads, 0, s>>>(x, rows, heads_in, v0, hkv, amax,
                                                          v_descale, static_cast<uint8_t*>(out8));
    return cudaGetLastError();
  });
}

}  // namespace zimage::cuda
