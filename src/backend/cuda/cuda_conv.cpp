// CudaBackend::conv2d: validation, asymmetric padding, cuDNN (libs/conv_cudnn.h, libs/conv_graph.h)
// or the direct-kernel fallback, and the bias. The planners it calls know nothing of the backend.
#include <string>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/kernels/kernels.h"
#include "backend/cuda/libs/conv_cudnn.h"
#include "backend/cuda/libs/conv_graph.h"
#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/validate.h"
#include "core/log.h"

namespace zimage::cuda {

bool CudaBackend::has_cudnn() const {
  return conv_ && conv_->available();
}

Status CudaBackend::conv2d(const Tensor& x, const Tensor& w, const Tensor& bias,
                           const Conv2dParams& p, Tensor& y) {
  ZI_OP_SCOPE("conv2d", &x, &w);
  ZI_TRY(contract::conv2d(cuda_env(act_), x, w, bias, p, y));
  return conv2d_impl(x, w, bias, nullptr, p, y);
}

void CudaBackend::set_conv_runtime_compile(bool on) {
  if (conv_graphs_) conv_graphs_->set_runtime_compile(on);
}

Status CudaBackend::conv2d_add(const Tensor& x, const Tensor& w, const Tensor& bias,
                               const Tensor& residual, const Conv2dParams& p, Tensor& y) {
  if (!fused_conv_add_) return Backend::conv2d_add(x, w, bias, residual, p, y);
  ZI_OP_SCOPE("conv2d_add", &x, &w);
  ZI_TRY(contract::conv2d_add(cuda_env(act_), x, w, bias, residual, p, y));
  return conv2d_impl(x, w, bias, &residual, p, y);
}

Status CudaBackend::conv2d_impl(const Tensor& x, const Tensor& w, const Tensor& bias,
                                const Tensor* residual, const Conv2dParams& p, Tensor& y) {
  constexpr const char* op = "conv2d";
  const int64_t n = x.dim(0), h = x.dim(1), wd = x.dim(2), cin = x.dim(3);
  const int64_t cout = w.dim(0), kh = w.dim(1), kw = w.dim(2);
  const int64_t hp = h + p.pad_top + p.pad_bottom, wp = wd + p.pad_left + p.pad_right;
  const int64_t ho = (hp - kh) / p.stride + 1, wo = (wp - kw) / p.stride + 1;
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
  const bool graphs = fused_ && use_conv_graphs_ && conv_graphs_->available();
  if (residual) {
    // The sum in the graph's epilogue (conv, + bias, + residual, rounded once); where cuDNN has
    // no such plan, the convolution as conv2d runs it, then the add (the CPU oracle's order).
    if (graphs) {
      const Status gs = conv_graphs_->run(req, ptr_or_null(bias), *allocator_, residual->data());
      if (gs.ok()) return Status::Ok();
      if (gs.code() != ErrorCode::kUnsupported) return gs.with_context("conv2d_add");
    }
    // The padded source (if any) as is: no second padded copy.
    Conv2dParams padded = p;
    if (src.data() != x.data()) padded = Conv2dParams{p.stride, 0, 0, 0, 0};
    ZI_TRY(conv2d_impl(src, w, bias, nullptr, padded, y));
    ZI_LAUNCH_TRY("conv2d_add (add)", launch_add(kt, residual->data(), y.data(), y.data(),
                                                 y.numel(), y.numel(), stream_));
    return Status::Ok();
  }
  if (graphs) {
    // cuDNN's tensor-core engines want channel counts in multiples of 8: the VAE's conv_out has 3
    // output channels. It can run with the filter and bias zero-padded to 8 outputs into a
    // scratch tensor, keeping the first 3 channels: where the graph has no plan for the narrow
    // convolution (the legacy call that would run instead costs ~10 ms of host time per call),
    // or first with ZIMAGE_CONV_PAD_COUT=1 (a new process's first narrow execution took 51-73 ms
    // of host time on an H100, BENCHMARKS.md "Session 18"; which is faster is measured there).
    constexpr int64_t kAlign = 8;
    const bool paddable = cout % kAlign != 0 && cin % kAlign == 0 && act_ != DType::kF32;
    auto padded_outputs = [&]() -> Status {
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
      ZI_TRY(conv_graphs_->run(rp, ptr_or_null(bp), *allocator_));
      return copy_2d(yp, 0, cp, y, 0, cout, n * ho * wo, cout);
    };
    if (paddable && pad_narrow_conv_) {
      const Status ps = padded_outputs();
      if (ps.ok()) return Status::Ok();
      if (ps.code() != ErrorCode::kUnsupported) return ps.with_context("conv2d");
    }
    const Status gs = conv_graphs_->run(req, ptr_or_null(bias), *allocator_);
    if (gs.ok()) return Status::Ok();
    if (gs.code() != ErrorCode::kUnsupported) return gs.with_context("conv2d");
    if (paddable && !pad_narrow_conv_) {
      const Status ps = padded_outputs();
      if (ps.ok()) return Status::Ok();
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
