// Stream captures on a side thread (Backend::warm_up records library calls into throwaway CUDA
// graphs while the load runs) against calls that synchronise the whole device (cudaFree,
// cudaFreeHost, cudaHostUnregister, cudaDeviceSynchronize): a device-wide synchronisation while
// another stream is capturing fails on the synchronising thread (cudaErrorStreamCaptureUnsupported
// and friends) and invalidates the capture, whatever the capture mode. Both sides take this
// process-wide lock, so they never overlap; a warm-up's capture lasts milliseconds, and the
// synchronising calls are rare (the allocator's segment frees, page-locked buffers released).
#pragma once

#include <cuda_runtime_api.h>

#include <mutex>

namespace zimage::cuda {

std::mutex& device_sync_mutex();

// Ends a capture still open on `stream` when its scope unwinds (an error or exception between
// BeginCapture and EndCapture) and drops what it recorded.
class OpenCaptureGuard {
 public:
  explicit OpenCaptureGuard(cudaStream_t stream) : stream_(stream) {}
  ~OpenCaptureGuard() {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream_, &status) == cudaSuccess &&
        status != cudaStreamCaptureStatusNone) {
      cudaGraph_t graph = nullptr;
      cudaStreamEndCapture(stream_, &graph);
      if (graph) cudaGraphDestroy(graph);
    }
    cudaGetLastError();
  }
  OpenCaptureGuard(const OpenCaptureGuard&) = delete;
  OpenCaptureGuard& operator=(const OpenCaptureGuard&) = delete;

 private:
  cudaStream_t stream_;
};

}  // namespace zimage::cuda
