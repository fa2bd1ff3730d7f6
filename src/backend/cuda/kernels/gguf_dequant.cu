// GGUF block dequantisation on the device: packed ggml blocks [rows, cols / block_size blocks]
// -> f32 or bf16 [rows, cols]. Each thread makes 8 consecutive elements of one row (every block
// size and every k-quant group is a multiple of 8, so the 8 share their scales) and stores them
// with one or two 16-byte writes when the output is aligned.
//
// Bit-exact with the CPU oracle (io/gguf/gguf_quants.cpp) in f32: the same float32 operations in
// the same order, each written as a round-to-nearest intrinsic (__fmul_rn, __fsub_rn, __fadd_rn) so
// nvcc cannot contract a product and a sum into a fused multiply-add (it would by default, and
// the result would differ in the last bit). bf16 output rounds that f32 value to nearest even,
// NaN kept quiet, exactly as core/dtype.h's f32_to_bf16.
#include <cuda_fp16.h>

#include <cstdint>

#include "backend/cuda/kernels/device_utils.cuh"
#include "backend/cuda/kernels/kernels.h"
#include "io/gguf/ggml_types.h"

namespace zimage::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kPerThread = 8;

using GT = GgmlType;

__device__ __forceinline__ float half_at(const uint8_t* p) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(p[0] | (p[1] << 8))));
}

__device__ __forceinline__ uint32_t u32_at(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
         (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24);
}

// Elements e0 .. e0+7 of one block (e0 a multiple of 8) into y.
template <GgmlType T>
__device__ __forceinline__ void dequant8(const uint8_t* b, int e0, float* y);

template <>
__device__ __forceinline__ void dequant8<GT::kQ4_0>(const uint8_t* b, int e0, float* y) {
  const float d = half_at(b);
  const uint8_t* qs = b + 2;
#pragma unroll
  for (int k = 0; k < kPerThread; ++k) {
    const int e = e0 + k;
    const int q = e < 16 ? (qs[e] & 0x0F) : (qs[e - 16] >> 4);
    y[k] = __fmul_rn(static_cast<float>(q - 8), d);
  }
}

template <>
__device__ __forceinline__ void dequant8<GT::kQ4_1>(const uint8_t* b, int e0, float* y) {
  const float d = half_at(b), m = half_at(b + 2);
  const uint8_t* qs = b + 4;
#pragma unroll
  for (int k = 0; k < kPerThread; ++k) {
    const int e = e0 + k;
    const int q = e < 16 ? (qs[e] & 0x0F) : (qs[e - 16] >> 4);
    y[k] = __fadd_rn(__fmul_rn(static_cast<float>(q), d), m);
  }
}

template <>
__device__ __forceinline__ void dequant8<GT::kQ5_0>(const uint8_t* b, int e0, float* y) {
  const float d = half_at(b);
  const uint32_t qh = u32_at(b + 2);
  const uint8_t* qs = b + 6;
#pragma unroll
  for (int k = 0; k < kPerThread; ++k) {
    const int e = e0 + k;
    const int lo = e < 16 ? (qs[e] & 0x0F) : (qs[e - 16] >> 4);
    const int q = lo | (static_cast<int>((qh >> e) & 1u) << 4);
    y[k] = __fmul_rn(static_cast<float>(q - 16), d);
  }
}

template <>
__device__ __forceinline__ void dequant8<GT::kQ5_1>(const uint8_t* b, int e0, float* y) {
  const float d = half_at(b), m = half_at(b + 2);
  const uint32_t qh = u32_at(b + 4);
  const uint8_t* qs = b + 8;
#pragma unroll
  for (int k = 0; k < kPerThread; ++k) {
    const int e = e0 + k;
    const int lo = e < 16 ? (qs[e] & 0x0F) : (qs[e - 16] >> 4);
    const int q = lo | (static_cast<int>((qh >> e) & 1u) << 4);
    y[k] = __fadd_rn(__fmul_rn(static_cast<float>(q), d), m);
  }
}

template <>
__device__ __forceinline__ void dequant8<GT::kQ8_0>(const uint8_t* b, int e0, float* y) {
  const float d = half_at(b);
#pragma unroll
  for (int k = 0; k < kPerThread; ++k)
    y[k] = __fmul_rn(static_cast<float>(static_cast<int8_t>(b[2 + e0 + k])), d);
}

template <>
__device__ __forceinline__ void dequant8<GT::kQ2_K>(const uint8_t* b, int e0, float* y) {
  const int sc = b[e0 / 16];
  const float d = half_at(b + 80), dmin = half_at(b + 82);
  const float dl = __fmul_rn(d, static_cast<float>(sc & 0x0F));
  const float ml = __fmul_rn(dmin, static_cast<float>(sc >> 4));
  const uint8_t* qs = b + 16 + (e0 / 128) * 32;
  const int shift = 2 * ((e0 % 128) / 32);
#pragma unroll
  for (int k = 0; k < kPerThread; ++k) {
    const int q = (qs[(e0 + k) % 32] >> shift) & 3;
    y[k] = __fsub_rn(__fmul_rn(dl, static_cast<float>(q)), ml);
  }
}

template <>
__device__ __forceinline__ void dequant8<GT::kQ3_K>(const uint8_t* b, int e0, float* y) {
  const uint8_t* hmask = b;
  const uint8_t* scales = b + 96;
  const int s = e0 / 16;
  const int lo_sc = s < 8 ? (scales[s] & 0x0F) : (scales[s - 8] >> 4);
  const int hi_sc = (scales[8 + s % 4] >> (2 * (s / 4))) & 3;
  const float dl = __fmul_rn(half_at(b + 108), static_cast<float>((lo_sc | (hi_sc << 4)) - 32));
  const uint8_t* qs = b + 32 + (e0 / 128) * 32;
  const int shift = 2 * ((e0 % 128) / 32);
  const int hbit = e0 / 32;
#pragma unroll
  for (int k = 0; k < kPerThread; ++k) {
    const int l = (e0 + k) % 32;
    const int low = (qs[l] >> shift) & 3;
    const int high = (hmask[l] >> hbit) & 1;
    y[k] = __fmul_rn(dl, static_cast<float>(low - (high ? 0 : 4)));
  }
}

__device__ __forceinline__ void k4_scale_min(const uint8_t* q, int g, int* sc, int* m) {
  if (g < 4) {
    *sc = q[g] & 63;
    *m = q[g + 4] & 63;
  } else {
    *sc = (q[g + 4] & 0x0F) | ((q[g - 4] >> 6) << 4);
    *m = (q[g + 4] >> 4) | ((q[g] >> 6) << 4);
  }
}

template <>
__device__ __forceinline__ void dequant8<GT::kQ4_K>(const uint8_t* b, int e0, float* y) {
  const int g = e0 / 32;
  int sc = 0, m = 0;
  k4_scale_min(b + 4, g, &sc, &m);
  const float dl = __fmul_rn(half_at(b), static_cast<float>(sc));
  const float ml = __fmul_rn(half_at(b + 2), static_cast<float>(m));
  const uint8_t* q = b + 16 + (g / 2) * 32;
  const int shift = (g % 2) * 4;
#pragma unroll
  for (int k = 0; k < kPerThread; ++k) {
    const int v = (q[(e0 + k) % 32] >> shift) & 0x0F;
    y[k] = __fsub_rn(__fmul_rn(dl, static_cast<float>(v)), ml);
  }
}

template <>
__device__ __forceinline__ void dequant8<GT::kQ5_K>(const uint8_t* b, int e0, float* y) {
  const int g = e0 / 32;
  int sc = 0, m = 0;
  k4_scale_min(b + 4, g, &sc, &m);
  const float dl = __fmul_rn(half_at(b), static_cast<float>(sc));
  const float ml = __fmul_rn(half_at(b + 2), static_cast<float>(m));
  const uint8_t* qh = b + 16;
  const uint8_t* q = b + 48 + (g / 2) * 32;
  const int shift = (g % 2) * 4;
#pragma unroll
  for (int k = 0; k < kPerThread; ++k) {
    const int l = (e0 + k) % 32;
    const int v = ((q[l] >> shift) & 0x0F) | (((qh[l] >> g) & 1) << 4);
    y[k] = __fsub_rn(__fmul_rn(dl, static_cast<float>(v)), ml);
  }
}

template <>
__device__ __forceinline__ void dequant8<GT::kQ6_K>(const uint8_t* b, int e0, float* y) {
  const int half = e0 / 128, quarter = (e0 % 128) / 32;
  const uint8_t* ql = b + half * 64 + (quarter % 2) * 32;
  const uint8_t* qh = b + 128 + half * 32;
  const int lo_shift = quarter < 2 ? 0 : 4;
  const float dl =
      __fmul_rn(half_at(b + 208), static_cast<float>(static_cast<int8_t>(b[192 + e0 / 16])));
#pragma unroll
  for (int k = 0; k < kPerThread; ++k) {
    const int l = (e0 + k) % 32;
    const int lo = (ql[l] >> lo_shift) & 0x0F;
    const int hi = (qh[l] >> (2 * quarter)) & 3;
    y[k] = __fmul_rn(dl, static_cast<float>((lo | (hi << 4)) - 32));
  }
}

template <>
__device__ __forceinline__ void dequant8<GT::kF32>(const uint8_t* b, int e0, float* y) {
#pragma unroll
  for (int k = 0; k < kPerThread; ++k) y[k] = __uint_as_float(u32_at(b + 4 * (e0 + k)));
}

template <>
__device__ __forceinline__ void dequant8<GT::kF16>(const uint8_t* b, int e0, float* y) {
#pragma unroll
  for (int k = 0; k < kPerThread; ++k) y[k] = half_at(b + 2 * (e0 + k));
}

template <>
__device__ __forceinline__ void dequant8<GT::kBF16>(const uint8_t* b, int e0, float* y) {
#pragma unroll
  for (int k = 0; k < kPerThread; ++k) {
    const uint8_t* p = b + 2 * (e0 + k);
    y[k] =
        __uint_as_float((static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8)) << 16);
  }
}

// core/dtype.h f32_to_bf16, bit for bit.
__device__ __forceinline__ uint16_t bf16_bits(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// Plain types are treated as blocks of 8 elements (their block size is 1; a run of 8 is one
// thread's work and never crosses a row because cols is a multiple of 8).
template <GgmlType T, bool kBf16Out>
__global__ void dequant_kernel(const uint8_t* __restrict__ src, void* __restrict__ out,
                               int64_t rows, int64_t cols, int64_t row_bytes, int block_size,
                               int type_size, bool aligned) {
  const int64_t tasks = rows * (cols / kPerThread);
  for (int64_t t = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; t < tasks;
       t += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i0 = t * kPerThread;  // first output element
    const int64_t r = i0 / cols, c = i0 % cols;
    const int64_t blk = c / block_size;
    const int e0 = static_cast<int>(c % block_size);
    const uint8_t* b = src + r * row_bytes + blk * type_size;
    float y[kPerThread];
    dequant8<T>(b, e0, y);
    if (kBf16Out) {
      uint16_t* o = static_cast<uint16_t*>(out) + i0;
      if (aligned) {
        uint4 v;
        v.x = bf16_bits(y[0]) | (static_cast<uint32_t>(bf16_bits(y[1])) << 16);
        v.y = bf16_bits(y[2]) | (static_cast<uint32_t>(bf16_bits(y[3])) << 16);
        v.z = bf16_bits(y[4]) | (static_cast<uint32_t>(bf16_bits(y[5])) << 16);
        v.w = bf16_bits(y[6]) | (static_cast<uint32_t>(bf16_bits(y[7])) << 16);
        *reinterpret_cast<uint4*>(o) = v;
      } else {
#pragma unroll
        for (int k = 0; k < kPerThread; ++k) o[k] = bf16_bits(y[k]);
      }
    } else {
      float* o = static_cast<float*>(out) + i0;
      if (aligned) {
        reinterpret_cast<float4*>(o)[0] = make_float4(y[0], y[1], y[2], y[3]);
        reinterpret_cast<float4*>(o)[1] = make_float4(y[4], y[5], y[6], y[7]);
      } else {
#pragma unroll
        for (int k = 0; k < kPerThread; ++k) o[k] = y[k];
      }
    }
  }
}

template <GgmlType T>
cudaError_t launch_type(const void* src, void* out, bool bf16, int64_t rows, int64_t cols,
                        int64_t row_bytes, int block_size, int type_size, cudaStream_t s) {
  const int64_t tasks = rows * (cols / kPerThread);
  if (tasks == 0) return cudaSuccess;
  const int64_t want = (tasks + kThreads - 1) / kThreads;
  const int grid = static_cast<int>(want < 65536 ? want : 65536);
  const bool aligned = reinterpret_cast<uintptr_t>(out) % 16 == 0;
  const auto* p = static_cast<const uint8_t*>(src);
  if (bf16) {
    dequant_kernel<T, true>
        <<<grid, kThreads, 0, s>>>(p, out, rows, cols, row_bytes, block_size, type_size, aligned);
  } else {
    dequant_kernel<T, false>
        <<<grid, kThreads, 0, s>>>(p, out, rows, cols, row_bytes, block_size, type_size, aligned);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_gguf_dequant(uint32_t ggml_type, const void* blocks, int64_t rows, int64_t cols,
                                int64_t row_bytes, int block_size, int type_size, KType out_type,
                                void* out, cudaStream_t s) {
  if (out_type != KType::kF32 && out_type != KType::kBF16) return cudaErrorInvalidValue;
  if (rows < 0 || cols < 0 || cols % kPerThread != 0 || block_size < 1 || type_size < 1)
    return cudaErrorInvalidValue;
  const bool bf16 = out_type == KType::kBF16;
  // Plain types: a "block" of 8 elements keeps every thread inside one row.
  switch (static_cast<GgmlType>(ggml_type)) {
    case GT::kF32:
      return launch_type<GT::kF32>(blocks, out, bf16, rows, cols, row_bytes, 8, 32, s);
    case GT::kF16:
      return launch_type<GT::kF16>(blocks, out, bf16, rows, cols, row_bytes, 8, 16, s);
    case GT::kBF16:
      return launch_type<GT::kBF16>(blocks, out, bf16, rows, cols, row_bytes, 8, 16, s);
#define ZI_GGUF_CASE(T) \
  case T:               \
    return launch_type<T>(blocks, out, bf16, rows, cols, row_bytes, block_size, type_size, s);
      ZI_GGUF_CASE(GT::kQ4_0)
      ZI_GGUF_CASE(GT::kQ4_1)
      ZI_GGUF_CASE(GT::kQ5_0)
      ZI_GGUF_CASE(GT::kQ5_1)
      ZI_GGUF_CASE(GT::kQ8_0)
      ZI_GGUF_CASE(GT::kQ2_K)
      ZI_GGUF_CASE(GT::kQ3_K)
      ZI_GGUF_CASE(GT::kQ4_K)
      ZI_GGUF_CASE(GT::kQ5_K)
      ZI_GGUF_CASE(GT::kQ6_K)
#undef ZI_GGUF_CASE
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace zimage::cuda
