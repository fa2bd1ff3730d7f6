#include "backend/backend.h"

namespace zimage {

#ifndef ZIMAGE_WITH_CUDA
Result<std::unique_ptr<Backend>> make_cuda_backend(int, DType) {
  return Unsupported("this zimage was built without CUDA (configure with nvcc on PATH)");
}
#endif

}  // namespace zimage
