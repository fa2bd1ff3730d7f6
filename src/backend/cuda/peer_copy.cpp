// Device-to-device copies between two CUDA backends (the same GPU or two GPUs) for the in-process
// communicator (backend/comm.cpp). Both backends' queued work is complete when this is called
// (the communicator synchronises them first); the copy runs on a stream of its own and is waited
// for, so the caller may hand the buffers back at once.
#include <cuda_runtime_api.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/runtime/cuda_check.h"

namespace zimage {

Status cuda_copy_between_backends(Backend& from, const void* src, Backend& to, void* dst,
                                  size_t bytes) {
  auto* a = dynamic_cast<cuda::CudaBackend*>(&from);
  auto* b = dynamic_cast<cuda::CudaBackend*>(&to);
  if (a == nullptr || b == nullptr)
    return Unsupported("peer copy between " + from.name() + " and " + to.name());
  int current = 0;
  ZI_CUDA_TRY(cudaGetDevice(&current));
  ZI_CUDA_TRY(cudaSetDevice(b->device_index()));
  cudaStream_t s = nullptr;
  Status st = cuda::cuda_status(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking),
                                "cudaStreamCreateWithFlags");
  if (st.ok()) {
    st = a->device_index() == b->device_index()
             ? cuda::cuda_status(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s),
                                 "cudaMemcpyAsync")
             : cuda::cuda_status(
                   cudaMemcpyPeerAsync(dst, b->device_index(), src, a->device_index(), bytes, s),
                   "cudaMemcpyPeerAsync");
    if (st.ok()) st = cuda::cuda_status(cudaStreamSynchronize(s), "cudaStreamSynchronize");
    const Status d = cuda::cuda_status(cudaStreamDestroy(s), "cudaStreamDestroy");
    if (st.ok()) st = d;
  }
  const Status back = cuda::cuda_status(cudaSetDevice(current), "cudaSetDevice");
  return st.ok() ? back : st;
}

}  // namespace zimage
