// cuDNN convolution plans and CudaBackend::conv2d (validation, asymmetric padding, cuDNN or the
// direct-kernel fallback, bias). See conv_cudnn.h.
#include "backend/cuda/conv_cudnn.h"

#include <string>

#include "backend/cuda/conv_graph.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/validate.h"
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
  if (ws_ptr) cudaFree(ws_ptr);
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
  const Key key{r.n,
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

bool CudaBackend::has_cudnn() const {
  return conv_ && conv_->available();
}

Status CudaBackend::conv2d(const Tensor& x, const Tensor& w, const Tensor& bias,
                           const Conv2dParams& p, Tensor& y) {
  ZI_OP_SCOPE("conv2d", &x, &w);
  constexpr const char* op = "conv2d";
  ZI_TRY(check_cuda_tensor(op, "x", x));
  ZI_TRY(check_cuda_tensor(op, "w", w));
  ZI_TRY(check_optional(op, "bias", bias));
  ZI_TRY(check_cuda_tensor(op, "y", y));
  ZI_TRY(check_rank(op, "x", x, 4));
  ZI_TRY(check_rank(op, "w", w, 4));
  for (const Tensor* t : std::initializer_list<const Tensor*>{&x, &w, &y})
    ZI_TRY(check_dtype(op, "x/w/y", *t, act_));
  if (bias.defined()) ZI_TRY(check_dtype(op, "bias", bias, act_));
  if (p.stride < 1 || p.pad_top < 0 || p.pad_bottom < 0 || p.pad_left < 0 || p.pad_right < 0)
    return InvalidArgument("conv2d: stride must be >= 1 and padding >= 0");
  const int64_t n = x.dim(0), h = x.dim(1), wd = x.dim(2), cin = x.dim(3);
  const int64_t cout = w.dim(0), kh = w.dim(1), kw = w.dim(2);
  if (w.dim(3) != cin)
    return InvalidArgument("conv2d: w " + w.describe() + " does not match x " + x.describe());
  const int64_t hp = h + p.pad_top + p.pad_bottom, wp = wd + p.pad_left + p.pad_right;
  if (kh < 1 || kw < 1 || hp < kh || wp < kw)
    return InvalidArgument("conv2d: kernel larger than the padded input");
  const int64_t ho = (hp - kh) / p.stride + 1, wo = (wp - kw) / p.stride + 1;
  ZI_TRY(check_shape(op, "y", y, {n, ho, wo, cout}));
  if (bias.defined()) ZI_TRY(check_shape(op, "bias", bias, {cout}));
  if (overlaps(x, y)) return InvalidArgument("conv2d: y must not alias x");
  ZI_ASSIGN_OR_RETURN(KType kt, ktype_of(op, act_));
  if (y.numel() == 0) return Status::Ok();

  // cuDNN pads symmetrically: pad explicitly when the two sides differ.
  Tensor src = x;
  int64_t sh = h, sw = wd;
  int pad_h = p.pad_top, pad_w = p.pad_left;
  if (p.pad_top != p.pad_bottom || p.pad_left != p.pad_right) {
    ZI_ASSIGN_OR_RETURN(src, alloc(act_, {n, hp, wp, cin}));
    ZI_LAUNCH_TRY("conv2d pad", launch_pad_nhwc(kt, x.data(), src.data(), n, h, wd, cin, p.pad_top,
                                                p.pad_bottom, p.pad_left, p.pad_right, stream_));
    sh = hp;
    sw = wp;
    pad_h = pad_w = 0;
  }
  const ConvRequest req{src.data(), w.data(), y.data(), n,  sh,       sw,    cin,   cout,
                        kh,         kw,       ho,       wo, p.stride, pad_h, pad_w, act_};
  if (fused_ && use_conv_graphs_ && conv_graphs_->available()) {
    const Status gs = conv_graphs_->run(req, ptr_or_null(bias), *allocator_);
    if (gs.ok()) return Status::Ok();
    if (gs.code() != ErrorCode::kUnsupported) return gs.with_context("conv2d");
    // cuDNN's tensor-core engines want channel counts in multiples of 8: the VAE's conv_out has 3
    // output channels. Run it with the filter and bias zero-padded to 8 outputs into a scratch
    // tensor and keep the first 3 channels (the legacy call that would run instead costs ~10 ms
    // of host time per call).
    constexpr int64_t kAlign = 8;
    if (cout % kAlign != 0 && cin % kAlign == 0 && act_ != DType::kF32) {
      const int64_t cp = (cout + kAlign - 1) / kAlign * kAlign, per = kh * kw * cin;
      ZI_ASSIGN_OR_RETURN(Tensor w8, alloc(act_, {cp, kh, kw, cin}));
      ZI_TRY(fill(w8, 0.f));
      ZI_TRY(copy_2d(w, 0, per, w8, 0, per, cout, per));
      Tensor bp;
      if (bias.defined()) {
        ZI_ASSIGN_OR_RETURN(bp, alloc(act_, {cp}));
        ZI_TRY(fill(bp, 0.f));
        ZI_TRY(copy_2d(bias, 0, cout, bp, 0, cout, 1, cout));
      }
      ZI_ASSIGN_OR_RETURN(Tensor yp, alloc(act_, {n, ho, wo, cp}));
      ConvRequest rp = req;
      rp.w = w8.data();
      rp.y = yp.data();
      rp.cout = cp;
      const Status ps = conv_graphs_->run(rp, ptr_or_null(bp), *allocator_);
      if (ps.ok()) return copy_2d(yp, 0, cp, y, 0, cout, n * ho * wo, cout);
      if (ps.code() != ErrorCode::kUnsupported) return ps.with_context("conv2d");
    }
  }
  Status st = conv_->run(req, *allocator_);
  if (st.ok()) {
    if (bias.defined())
      ZI_LAUNCH_TRY("conv2d bias",
                    launch_add(kt, y.data(), bias.data(), y.data(), y.numel(), cout, stream_));
    return Status::Ok();
  }
  if (st.code() != ErrorCode::kUnsupported) return st.with_context("conv2d");
  const ConvShape shape{n, sh, sw, cin, cout, kh, kw, ho, wo, p.stride, pad_h, pad_w};
  ZI_LAUNCH_TRY("conv2d (direct)", launch_conv2d_direct(kt, src.data(), w.data(), ptr_or_null(bias),
                                                        y.data(), shape, stream_));
  return Status::Ok();
}

}  // namespace zimage::cuda
