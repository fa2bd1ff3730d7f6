// cuDNN convolution plans (see conv_cudnn.h); CudaBackend::conv2d, which uses them, is in
// cuda_conv.cpp.
#include "backend/cuda/libs/conv_cudnn.h"

#include <string>

#include "backend/cuda/runtime/capture_guard.h"
#include "backend/cuda/runtime/cuda_check.h"
#include "core/log.h"

namespace zimage::cuda {
namespace {

constexpr size_t kFindWorkspaceBytes = size_t{256} << 20;

cudnnDataType_t cudnn_type(DType dt) {
  switch (dt) {
    case DType::kBF16:
      return CUDNN_DATA_BFLOAT16;
    case DType::kF16:
      return CUDNN_DATA_HALF;
    default:
      return CUDNN_DATA_FLOAT;
  }
}

}  // namespace

std::unique_ptr<ConvPlanner> ConvPlanner::create(cudaStream_t stream) {
  std::unique_ptr<ConvPlanner> c(new ConvPlanner(stream));
  cudnnHandle_t h = nullptr;
  cudnnStatus_t s = cudnnCreate(&h);
  if (s != CUDNN_STATUS_SUCCESS) {
    ZI_WARN("cuda: cuDNN unavailable (%s); conv2d uses the direct kernel", cudnnGetErrorString(s));
    return c;
  }
  s = cudnnSetStream(h, stream);
  if (s != CUDNN_STATUS_SUCCESS) {
    ZI_WARN("cuda: cudnnSetStream failed (%s); conv2d uses the direct kernel",
            cudnnGetErrorString(s));
    cudnnDestroy(h);
    return c;
  }
  c->handle_ = h;
  return c;
}

void ConvPlanner::destroy(Plan& p) {
  if (p.x) cudnnDestroyTensorDescriptor(p.x);
  if (p.y) cudnnDestroyTensorDescriptor(p.y);
  if (p.w) cudnnDestroyFilterDescriptor(p.w);
  if (p.conv) cudnnDestroyConvolutionDescriptor(p.conv);
  p = Plan{};
}

ConvPlanner::~ConvPlanner() {
  for (auto& [key, p] : plans_) destroy(p);
  if (handle_) cudnnDestroy(handle_);
}

Status ConvPlanner::make_plan(const ConvRequest& r, Plan& p) {
  const cudnnDataType_t dt = cudnn_type(r.dt);
  ZI_CUDNN_TRY(cudnnCreateTensorDescriptor(&p.x));
  ZI_CUDNN_TRY(cudnnCreateTensorDescriptor(&p.y));
  ZI_CUDNN_TRY(cudnnCreateFilterDescriptor(&p.w));
  ZI_CUDNN_TRY(cudnnCreateConvolutionDescriptor(&p.conv));
  ZI_CUDNN_TRY(cudnnSetTensor4dDescriptor(p.x, CUDNN_TENSOR_NHWC, dt, static_cast<int>(r.n),
                                          static_cast<int>(r.cin), static_cast<int>(r.h),
                                          static_cast<int>(r.w_)));
  ZI_CUDNN_TRY(cudnnSetFilter4dDescriptor(p.w, dt, CUDNN_TENSOR_NHWC, static_cast<int>(r.cout),
                                          static_cast<int>(r.cin), static_cast<int>(r.kh),
                                          static_cast<int>(r.kw)));
  ZI_CUDNN_TRY(cudnnSetConvolution2dDescriptor(p.conv, r.pad_h, r.pad_w, r.stride, r.stride, 1, 1,
                                               CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
  const cudnnMathType_t math = r.dt == DType::kF32 ? CUDNN_FMA_MATH : CUDNN_TENSOR_OP_MATH;
  ZI_CUDNN_TRY(cudnnSetConvolutionMathType(p.conv, math));
  int on = 0, oc = 0, oh = 0, ow = 0;
  ZI_CUDNN_TRY(cudnnGetConvolution2dForwardOutputDim(p.conv, p.x, p.w, &on, &oc, &oh, &ow));
  if (on != r.n || oc != r.cout || oh != r.ho || ow != r.wo)
    return InternalError("conv2d: cuDNN output shape disagrees with the expected one");
  ZI_CUDNN_TRY(cudnnSetTensor4dDescriptor(p.y, CUDNN_TENSOR_NHWC, dt, on, oc, oh, ow));

  // Measure the candidates on the real buffers. The search workspace is a plain cudaMalloc,
  // freed right after, so it does not stay in the allocator's cache.
  size_t ws_bytes = kFindWorkspaceBytes;
  void* ws_ptr = nullptr;
  if (cudaMalloc(&ws_ptr, ws_bytes) != cudaSuccess) {
    cudaGetLastError();
    ws_ptr = nullptr;
    ws_bytes = 0;
  }
  cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
  int returned = 0;
  const cudnnStatus_t fs = cudnnFindConvolutionForwardAlgorithmEx(
      handle_, p.x, r.x, p.w, r.w, p.conv, p.y, r.y, CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &returned,
      perf, ws_ptr, ws_bytes);
  if (ws_ptr) {
    std::lock_guard<std::mutex> sync_lock(device_sync_mutex());  // capture_guard.h
    cudaFree(ws_ptr);
  }
  ZI_TRY(cudnn_status(fs, "cudnnFindConvolutionForwardAlgorithmEx"));
  for (int i = 0; i < returned; ++i) {
    if (perf[i].status != CUDNN_STATUS_SUCCESS) continue;
    if (r.dt == DType::kF32 && perf[i].mathType != CUDNN_FMA_MATH) continue;
    p.algo = perf[i].algo;
    p.workspace = perf[i].memory;
    ZI_CUDNN_TRY(cudnnSetConvolutionMathType(p.conv, perf[i].mathType));
    p.supported = true;
    break;
  }
  return Status::Ok();
}

Status ConvPlanner::run(const ConvRequest& r, CachingAllocator& alloc) {
  if (!handle_) return Unsupported("conv2d: cuDNN is not available");
  const Key key = conv_shape_key(r);
  auto it = plans_.find(key);
  if (it == plans_.end()) {
    Plan p;
    Status st = make_plan(r, p);
    if (!st.ok()) {
      ZI_DEBUG("cuda: cuDNN cannot plan conv %lldx%lldx%lldx%lld -> %lld (%s)",
               static_cast<long long>(r.n), static_cast<long long>(r.h),
               static_cast<long long>(r.w_), static_cast<long long>(r.cin),
               static_cast<long long>(r.cout), st.message().c_str());
      destroy(p);  // remembered as unsupported
    }
    it = plans_.emplace(key, p).first;
  }
  Plan& p = it->second;
  if (!p.supported) return Unsupported("conv2d: no cuDNN algorithm for this shape");
  std::shared_ptr<Storage> ws;
  if (p.workspace > 0) {
    ZI_ASSIGN_OR_RETURN(ws, alloc.allocate(p.workspace));
  }
  const float alpha = 1.f, beta = 0.f;
  ZI_CUDNN_TRY(cudnnConvolutionForward(handle_, &alpha, p.x, r.x, p.w, r.w, p.conv, p.algo,
                                       ws ? ws->data() : nullptr, p.workspace, &beta, p.y, r.y));
  return Status::Ok();
}

}  // namespace zimage::cuda
