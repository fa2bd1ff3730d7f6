// Shared set-up of NVIDIA's cudnn-frontend for the files that build cuDNN graphs (sdpa_cudnn.cpp,
// conv_graph.cpp). Both are compiled with NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING (CMakeLists.txt),
// so the frontend reaches cuDNN through a dlopen handle that this project owns.
#pragma once

#include <cuda_runtime_api.h>
#include <cudnn.h>

namespace zimage::cuda {

// Opens the handle once (libcudnn.so.9, already loaded for the convolutions). False when cuDNN is
// missing or older than 9.0; the callers then report themselves unavailable.
bool cudnn_frontend_ready();

// A cuDNN handle on `stream` for building and running graphs, or nullptr when the frontend is
// not ready or cuDNN refuses (the caller then reports itself unavailable). The caller destroys it.
cudnnHandle_t cudnn_graph_handle(cudaStream_t stream);

}  // namespace zimage::cuda
