// cuda_visible_devices() (backend.h): how many GPUs `--devices all` means.
#include <cuda_runtime_api.h>

#include "backend/backend.h"

namespace zimage {

int cuda_visible_devices() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device / no driver" error for later calls
    return 0;
  }
  return count;
}

}  // namespace zimage
