// Persistent, double-buffered row kernels: the pieces the pipelined forms of the DiT's wide row
// kernels share (norm.cu residual_norm_then_norm_pipe_kernel, elementwise.cu
// swiglu_fp8_pipe_kernel).
//
// Why: a block-per-row kernel issues its row's loads as it starts and then spends the rest of its
// life on block reductions and stores with nothing in flight, so a multiprocessor has only the
// rows of its blocks that happen to be starting in flight (the residual norm's FP8 form and the
// FP8 SwiGLU measured 1.6-1.75 TB/s on an H100, docs/BENCHMARKS.md "Session 24"). Here a block
// stays resident and walks rows `blockIdx.x, + gridDim.x, ...`; while it reduces and stores one
// row, the next row is already on its way into the other half of a two-row shared-memory buffer
// (cp.async: no registers held while in flight). Each thread copies exactly the 16-byte packs it
// will later read, in the layout of the register kernel it replaces, so no barrier orders the
// buffer and the sums (and so the bits) are that kernel's.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "backend/cuda/kernels/device_utils.cuh"
#include "backend/cuda/kernels/kernels.h"  // pipelined_row_kernels()

namespace zimage::cuda {

// Copies this thread's packs of a row (pack pk = t + p * tpr for p < PPT, pk < packs) from global
// src to shared dst, asynchronously (cp_async_commit / cp_async_wait complete it).
template <typename T, int VEC, int PPT>
__device__ __forceinline__ void stage_packs(T* dst, const T* src, int t, int tpr, int packs) {
#pragma unroll
  for (int p = 0; p < PPT; ++p) {
    const int pk = t + p * tpr;
    if (pk < packs) cp_async16(smem_addr(dst + pk * VEC), src + pk * VEC, true);
  }
}

// This thread's packs of a staged row, read back as fp32 (the packs stage_packs copied).
template <typename T, int VEC, int PPT>
__device__ __forceinline__ void read_staged(const T* src, int t, int tpr, int packs,
                                            float (&v)[PPT][VEC]) {
#pragma unroll
  for (int p = 0; p < PPT; ++p) {
    const int pk = t + p * tpr;
    if (pk < packs) load_f32<T, VEC>(src + pk * VEC, v[p]);
  }
}

// The grid of a persistent kernel: how many blocks of `kernel` with `threads` threads and `smem`
// bytes of dynamic shared memory the current device holds at once (occupancy times the
// multiprocessors), raising the kernel's dynamic shared-memory limit past the 48 KB default where
// needed. 0 when it holds none or a query fails; the caller then launches its other kernel.
// Cached per (kernel, threads, smem, device); safe from any thread.
int64_t resident_blocks(const void* kernel, int threads, size_t smem);

}  // namespace zimage::cuda
