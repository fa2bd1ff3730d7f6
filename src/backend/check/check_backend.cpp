// See check_backend.h. Memory ops validate their arguments as a real backend would (an upload of
// a non-float tensor, a copy_2d out of bounds are errors) but move no bytes; compute ops answer
// kUnsupported, so a model that tried to run here would fail loudly instead of reading nothing.
#include "backend/check/check_backend.h"

#include <string>

namespace zimage {
namespace {

// Storage with a size but no bytes.
class NoStorage final : public Storage {
 public:
  explicit NoStorage(size_t bytes) : Storage(nullptr, bytes, Device::kCPU) {}
};

Status no_op(const char* op) {
  return Unsupported(std::string(op) + ": the check-only backend binds weights and runs nothing");
}

class CheckBackend final : public Backend {
 public:
  Device device() const override { return Device::kCPU; }
  std::string name() const override { return "check (binds weights, holds and runs nothing)"; }
  DType act_dtype() const override { return DType::kF32; }

  Result<Tensor> alloc(DType dtype, const Shape& shape) override {
    const int64_t n = shape_numel(shape);
    if (n < 0) return InvalidArgument("alloc: invalid shape " + shape_string(shape));
    auto st = std::make_shared<NoStorage>(static_cast<size_t>(n) * dtype_size(dtype));
    return Tensor(std::move(st), 0, dtype, shape);
  }
  Result<Tensor> upload(const Tensor& host, DType dtype) override {
    if (!host.defined()) return InvalidArgument("upload: undefined host tensor");
    if (host.device() != Device::kCPU)
      return InvalidArgument("upload: " + host.describe() + " is not a host tensor");
    if (host.dtype() != dtype && (!dtype_is_float(host.dtype()) || !dtype_is_float(dtype))) {
      return InvalidArgument("upload: host " + host.describe() + " cannot be converted to " +
                             dtype_name(dtype) + " (only float dtypes convert)");
    }
    return alloc(dtype, host.shape());
  }
  Status download(const Tensor&, Tensor&) override { return no_op("download"); }
  Status convert(const Tensor&, Tensor&) override { return no_op("convert"); }
  Status copy_2d(const Tensor& src, int64_t src_offset, int64_t src_row_stride, Tensor& dst,
                 int64_t dst_offset, int64_t dst_row_stride, int64_t rows, int64_t cols) override {
    if (!src.defined() || !dst.defined() || src.dtype() != dst.dtype())
      return InvalidArgument("copy_2d: undefined tensors or different dtypes");
    auto fits = [&](const Tensor& t, int64_t off, int64_t stride) {
      if (rows <= 0 || cols <= 0) return rows == 0 || cols == 0;
      return off >= 0 && stride >= cols && off + (rows - 1) * stride + cols <= t.numel();
    };
    if (!fits(src, src_offset, src_row_stride) || !fits(dst, dst_offset, dst_row_stride)) {
      return InvalidArgument("copy_2d: a " + std::to_string(rows) + "x" + std::to_string(cols) +
                             " block does not fit " + src.describe() + " -> " + dst.describe());
    }
    return Status::Ok();
  }
  // Loaders widen scaled-FP8 weights with it (model/common/load_util.h): validated and bound
  // as a memory op, no bytes moved.
  Status dequantize_fp8_rows(const Tensor& w8, const Tensor& scale, Tensor& y) override {
    if (!w8.defined() || !scale.defined() || !y.defined() || w8.rank() != 2 ||
        scale.numel() != w8.dim(0) || y.numel() != w8.numel())
      return InvalidArgument("dequantize_fp8_rows: " + w8.describe() + " x " + scale.describe() +
                             " -> " + y.describe());
    return Status::Ok();
  }
  Status fill(Tensor&, float) override { return Status::Ok(); }
  Status synchronize() override { return Status::Ok(); }

  Status matmul(const Tensor&, const Tensor&, const Tensor&, Tensor&) override {
    return no_op("matmul");
  }
  Status rms_norm(const Tensor&, const Tensor&, float, const Tensor&, Tensor&) override {
    return no_op("rms_norm");
  }
  Status layer_norm(const Tensor&, const Tensor&, const Tensor&, float, const Tensor&,
                    Tensor&) override {
    return no_op("layer_norm");
  }
  Status residual_rms_norm_gate(Tensor&, const Tensor&, const Tensor&, float,
                                const Tensor&) override {
    return no_op("residual_rms_norm_gate");
  }
  Status group_norm(const Tensor&, const Tensor&, const Tensor&, int, float, bool,
                    Tensor&) override {
    return no_op("group_norm");
  }
  Status rope_half(Tensor&, const Tensor&, const Tensor&) override { return no_op("rope_half"); }
  Status rope_interleaved(Tensor&, const Tensor&) override { return no_op("rope_interleaved"); }
  Status attention(const Tensor&, const Tensor&, const Tensor&, const AttentionParams&,
                   Tensor&) override {
    return no_op("attention");
  }
  // Binding a model that asks for FP8 attention is fine here; running it is not.
  Status fp8_attention_support() const override { return Status::Ok(); }
  Status silu(const Tensor&, Tensor&) override { return no_op("silu"); }
  Status tanh(const Tensor&, Tensor&) override { return no_op("tanh"); }
  Status clamp(const Tensor&, float, float, Tensor&) override { return no_op("clamp"); }
  Status swiglu(const Tensor&, Tensor&) override { return no_op("swiglu"); }
  Status axpby(float, const Tensor&, float, const Tensor&, Tensor&) override {
    return no_op("axpby");
  }
  Status add(const Tensor&, const Tensor&, Tensor&) override { return no_op("add"); }
  Result<std::vector<double>> sum_squares(const Tensor&) override { return no_op("sum_squares"); }
  Status guided_euler_step(const Tensor&, const Tensor&, float, float, Tensor&) override {
    return no_op("guided_euler_step");
  }
  Status latent_to_rgb(const Tensor&, const LatentRgbMap&, Tensor&) override {
    return no_op("latent_to_rgb");
  }
  Result<int64_t> count_nonfinite(const Tensor&) override { return no_op("count_nonfinite"); }
  Status image_to_rgb8(const Tensor&, Tensor&) override { return no_op("image_to_rgb8"); }
  Status conv2d(const Tensor&, const Tensor&, const Tensor&, const Conv2dParams&,
                Tensor&) override {
    return no_op("conv2d");
  }
  Status conv2d_add(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Conv2dParams&,
                    Tensor&) override {
    return no_op("conv2d_add");
  }
  Status upsample_nearest2x(const Tensor&, Tensor&) override { return no_op("upsample_nearest2x"); }
  Status embedding(const Tensor&, const Tensor&, Tensor&) override { return no_op("embedding"); }
  Status patchify(const Tensor&, int, Tensor&) override { return no_op("patchify"); }
  Status unpatchify(const Tensor&, int, float, Tensor&) override { return no_op("unpatchify"); }
};

}  // namespace

std::unique_ptr<Backend> make_check_backend() {
  return std::make_unique<CheckBackend>();
}

}  // namespace zimage
