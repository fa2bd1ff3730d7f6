#include "model/linear.h"

#include <string>

namespace zimage {

Status linear(Backend& be, const Tensor& x, const LinearWeight& w, const Tensor& bias,
              const Tensor& scratch, Tensor& y) {
  if (!w.quantized()) return be.matmul(x, w.w, bias, y);
  const int64_t n = w.rows(), k = w.cols();
  if (!scratch.defined() || scratch.numel() < n * k || scratch.dtype() != be.act_dtype())
    return InternalError("linear: quantised weight " + w.w.describe() + " needs a scratch of " +
                         std::to_string(n * k) + " elements, got " + scratch.describe());
  Tensor wide(scratch.storage(), scratch.byte_offset(), scratch.dtype(), {n, k});
  if (w.packed())
    ZI_TRY(be.dequantize_packed(w.ggml_type, w.w, wide));
  else
    ZI_TRY(be.dequantize_fp8_rows(w.w, w.scale, wide));
  return be.matmul(x, wide, bias, y);
}

Status to_fp8_rows(Backend& be, LinearWeight& w, const std::string& what) {
  if (w.quantized() || !w.defined()) return Status::Ok();
  auto w8 = be.alloc(DType::kF8E4M3, w.w.shape());
  if (!w8.ok()) return w8.status().with_context("allocating FP8 " + what);
  auto sc = be.alloc(DType::kF32, {w.rows()});
  if (!sc.ok()) return sc.status().with_context("allocating FP8 scales of " + what);
  Status st = be.quantize_fp8_rows(w.w, *w8, *sc);
  if (!st.ok()) return st.with_context("quantising " + what + " to FP8");
  w.w = std::move(w8).value();
  w.scale = std::move(sc).value();
  return Status::Ok();
}

Status move_to_host(Backend& be, const std::vector<Tensor*>& tensors) {
  for (Tensor* t : tensors) {
    if (t == nullptr || !t->defined() || t->device() == Device::kCPU) continue;
    auto host = be.alloc_pinned(t->dtype(), t->shape());
    if (!host.ok()) return host.status().with_context("host copy of " + t->describe());
    ZI_TRY(be.download(*t, *host));
    *t = std::move(host).value();
  }
  return Status::Ok();
}

}  // namespace zimage
