// Argument checks and Status for the GGUF dequantisation kernels (gguf_dequant.cu).
#include "backend/cuda/kernels/gguf_dequant.h"

#include <string>

#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/kernels/kernels.h"

namespace zimage::cuda {
namespace {

Status dequantize(GgmlType type, const void* blocks, int64_t rows, int64_t cols, void* out,
                  KType out_type, cudaStream_t stream, const char* op) {
  const GgmlTypeInfo* info = ggml_type_info(type);
  if (!info || !info->dequantizable) {
    return Unsupported(std::string(op) + ": type " + ggml_type_name(type) +
                       " cannot be dequantised (zimage reads " + ggml_dequantizable_type_list() +
                       ")");
  }
  uint64_t row_bytes = 0;
  if (rows < 0 || !ggml_row_bytes(type, cols, &row_bytes) || cols % 8 != 0) {
    return InvalidArgument(std::string(op) + ": " + std::to_string(rows) + " x " +
                           std::to_string(cols) + " " + info->name +
                           ": rows must be >= 0 and cols a multiple of " +
                           std::to_string(info->block_size > 8 ? info->block_size : 8));
  }
  if (rows == 0 || cols == 0) return Status::Ok();
  if (!blocks || !out) return InvalidArgument(std::string(op) + ": null pointer");
  ZI_LAUNCH_TRY(
      op, launch_gguf_dequant(static_cast<uint32_t>(type), blocks, rows, cols,
                              static_cast<int64_t>(row_bytes), static_cast<int>(info->block_size),
                              static_cast<int>(info->type_size), out_type, out, stream));
  return Status::Ok();
}

}  // namespace

Status gguf_dequantize_bf16(GgmlType type, const void* blocks, int64_t rows, int64_t cols,
                            void* out_bf16, cudaStream_t stream) {
  return dequantize(type, blocks, rows, cols, out_bf16, KType::kBF16, stream,
                    "gguf_dequantize_bf16");
}

Status gguf_dequantize_f32(GgmlType type, const void* blocks, int64_t rows, int64_t cols,
                           float* out, cudaStream_t stream) {
  return dequantize(type, blocks, rows, cols, out, KType::kF32, stream, "gguf_dequantize_f32");
}

}  // namespace zimage::cuda
