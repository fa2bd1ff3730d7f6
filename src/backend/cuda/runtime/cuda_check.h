// Turns CUDA / cuBLAS / cuDNN return codes into zimage Status values. Every library call in the
// CUDA backend goes through one of these macros, so a failure names the call that failed and
// nothing aborts (errors are values, see include/zimage/status.h).
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <string>

#include "core/status.h"

namespace zimage::cuda {

inline Status cuda_status(cudaError_t e, const char* call) {
  if (e == cudaSuccess) return Status::Ok();
  if (e == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // clear the sticky-free error so later calls are not poisoned
    return OutOfMemory(std::string(call) + ": " + cudaGetErrorString(e));
  }
  return DeviceError(std::string(call) + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) +
                     ")");
}

inline Status cublas_status(cublasStatus_t s, const char* call) {
  if (s == CUBLAS_STATUS_SUCCESS) return Status::Ok();
  return DeviceError(std::string(call) + ": " + cublasGetStatusName(s) + " (" +
                     cublasGetStatusString(s) + ")");
}

inline Status cudnn_status(cudnnStatus_t s, const char* call) {
  if (s == CUDNN_STATUS_SUCCESS) return Status::Ok();
  return DeviceError(std::string(call) + ": " + cudnnGetErrorString(s));
}

// Whether host pointer `p` lies in page-locked memory (cudaHostAlloc'd or registered); an
// ordinary pointer is not an error to keep.
inline bool is_page_locked(const void* p) {
  cudaPointerAttributes a{};
  const bool locked =
      cudaPointerGetAttributes(&a, p) == cudaSuccess && a.type == cudaMemoryTypeHost;
  cudaGetLastError();
  return locked;
}

}  // namespace zimage::cuda

#define ZI_CUDA_TRY(call) ZI_TRY(::zimage::cuda::cuda_status((call), #call))
#define ZI_CUBLAS_TRY(call) ZI_TRY(::zimage::cuda::cublas_status((call), #call))
#define ZI_CUDNN_TRY(call) ZI_TRY(::zimage::cuda::cudnn_status((call), #call))
// For kernel launchers that return cudaError_t: names the op that launched.
#define ZI_LAUNCH_TRY(op_name, expr) ZI_TRY(::zimage::cuda::cuda_status((expr), op_name))
