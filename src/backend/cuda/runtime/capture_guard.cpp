// The process-wide lock of capture_guard.h.
#include "backend/cuda/runtime/capture_guard.h"

namespace zimage::cuda {

std::mutex& device_sync_mutex() {
  // Never destroyed: page-locked buffers freed during static destruction still take it.
  static std::mutex* mu = new std::mutex;
  return *mu;
}

}  // namespace zimage::cuda
