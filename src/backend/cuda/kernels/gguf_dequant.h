// GGUF tensors dequantised on the device, one weight at a time, into the compute dtype: the
// launchers the CUDA backend uses to keep quantised weights packed in device memory and expand
// each one right before its GEMM (or once at load). Blocks are the bytes io/gguf/gguf.h's packed()
// views (or WeightStore::packed) hand out, already copied to the device.
//
// f32 output equals the CPU oracle (io/gguf/gguf_quants.h dequantize_rows) bit for bit: the kernels
// do the same float32 operations in the same order, without fused multiply-adds. bf16 output is
// that f32 value rounded to nearest even (core/dtype.h f32_to_bf16).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/status.h"
#include "io/gguf/gguf_quants.h"

namespace zimage::cuda {

// blocks: device bytes of rows x (cols / block_size) blocks; out: device [rows, cols].
// F32, F16, BF16 and the block types Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K..Q6_K; cols a multiple of
// the block size (and of 8 for the plain types). InvalidArgument names a bad shape, Unsupported a
// type zimage cannot dequantise; a launch failure is a DeviceError.
Status gguf_dequantize_bf16(GgmlType type, const void* blocks, int64_t rows, int64_t cols,
                            void* out_bf16, cudaStream_t stream);
Status gguf_dequantize_f32(GgmlType type, const void* blocks, int64_t rows, int64_t cols,
                           float* out, cudaStream_t stream);

}  // namespace zimage::cuda
