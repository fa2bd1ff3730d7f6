// 2-D convolutions through cuDNN on NHWC tensors with KRSC (= our OHWI) filters. The algorithm is
// measured once per shape (cudnnFindConvolutionForwardAlgorithmEx) and cached with its workspace
// size; bf16 runs on tensor cores with fp32 accumulation, f32 is restricted to FMA kernels (no
// TF32) so it matches the CPU oracle. cuDNN pads symmetrically only: asymmetric padding (the VAE
// encoder's (0,1,0,1)) is done by the caller with a pad kernel. Shapes cuDNN rejects are
// remembered and reported as kUnsupported so the caller can use the direct kernel.
#pragma once

#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <map>
#include <memory>
#include <tuple>

#include "backend/cuda/runtime/allocator.h"
#include "core/status.h"
#include "core/tensor.h"

namespace zimage::cuda {

struct ConvRequest {
  const void* x;  // [n, h, w, cin]
  const void* w;  // [cout, kh, kw, cin]
  void* y;        // [n, ho, wo, cout]
  int64_t n, h, w_, cin, cout, kh, kw, ho, wo;
  int stride, pad_h, pad_w;
  DType dt;
};

// What a convolution plan depends on (shapes, stride, padding, dtype): the plan caches' key
// (ConvPlanner; ConvGraphs adds its epilogue).
using ConvShapeKey =
    std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int, int, int, int>;
inline ConvShapeKey conv_shape_key(const ConvRequest& r) {
  return {r.n,
          r.h,
          r.w_,
          r.cin,
          r.cout,
          r.kh,
          r.kw,
          r.stride,
          r.pad_h,
          r.pad_w,
          static_cast<int>(r.dt)};
}

class ConvPlanner {
 public:
  // Never fails: without a usable cuDNN, available() is false and run() answers kUnsupported.
  static std::unique_ptr<ConvPlanner> create(cudaStream_t stream);
  ~ConvPlanner();
  ConvPlanner(const ConvPlanner&) = delete;
  ConvPlanner& operator=(const ConvPlanner&) = delete;

  bool available() const { return handle_ != nullptr; }
  // y = conv(x, w), no bias. kUnsupported when cuDNN has no algorithm for this shape.
  Status run(const ConvRequest& r, CachingAllocator& alloc);

 private:
  struct Plan {
    bool supported = false;
    cudnnTensorDescriptor_t x = nullptr, y = nullptr;
    cudnnFilterDescriptor_t w = nullptr;
    cudnnConvolutionDescriptor_t conv = nullptr;
    cudnnConvolutionFwdAlgo_t algo{};
    size_t workspace = 0;
  };
  using Key = ConvShapeKey;

  explicit ConvPlanner(cudaStream_t stream) : stream_(stream) {}
  Status make_plan(const ConvRequest& r, Plan& p);
  static void destroy(Plan& p);

  cudaStream_t stream_;
  cudnnHandle_t handle_ = nullptr;
  std::map<Key, Plan> plans_;
};

}  // namespace zimage::cuda
