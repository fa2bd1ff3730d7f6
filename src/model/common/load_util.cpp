// See load_util.h. Host-side conversions go through float32, which is exact for every stored
// weight dtype (bf16, f16, fp8, f32), so fusing or transposing never changes a weight value;
// the only rounding is the final upload to the compute dtype.
#include "model/common/load_util.h"

#include <algorithm>
#include <cstring>
#include <thread>
#include <vector>

namespace zimage::load {

Result<Tensor> host_f32(const WeightStore& ws, const std::string& name, const Shape& shape) {
  ZI_ASSIGN_OR_RETURN(Tensor src, ws.get(name, shape));  // file dtype, shape checked
  Tensor out = Tensor::host(DType::kF32, shape);         // same shape, f32
  if (!out.defined()) return OutOfMemory("host copy of " + name + " " + shape_string(shape));
  if (!convert_to_f32(src.dtype(), src.data(), out.data_as<float>(),
                      static_cast<size_t>(src.numel()))) {
    return Unsupported("tensor " + name + " has non-float dtype " + dtype_name(src.dtype()));
  }
  return out;
}

Result<Tensor> upload_host(Backend& be, const Tensor& host, DType dtype) {
  auto r = be.upload(host, dtype);
  if (!r.ok()) return r.status().with_context("uploading " + host.describe());
  return r;
}

void fill_row_scales(const Tensor& scale, int64_t rows, float* out) {
  for (int64_t r = 0; r < rows; ++r)
    out[r] = !scale.defined() ? 1.0f : scale.data_as<float>()[scale.numel() == 1 ? 0 : r];
}

Result<Tensor> widen_scaled_fp8(const WeightStore& ws, Backend& be, const std::string& name,
                                const Shape& shape) {
  ZI_ASSIGN_OR_RETURN(Fp8StoredWeight s, ws.fp8(name));
  if (s.data.shape() != shape || shape.size() != 2)
    return FormatError(ws.path() + ": tensor " + name + " " + s.data.describe() +
                       " does not match its expected shape " + shape_string(shape));
  const int64_t rows = shape[0];
  if (!s.scale.defined() || s.scale.dtype() != DType::kF32 ||
      (s.scale.numel() != 1 && s.scale.numel() != rows))
    return FormatError(ws.path() + ": the scale of " + name + " is not f32 [1] or [" +
                       std::to_string(rows) + "]");
  Tensor scale = Tensor::host(DType::kF32, {rows});
  if (!scale.defined()) return OutOfMemory("scales of " + name);
  fill_row_scales(s.scale, rows, scale.data_as<float>());
  ZI_ASSIGN_OR_RETURN(Tensor w8, upload_host(be, s.data, s.data.dtype()));
  ZI_ASSIGN_OR_RETURN(Tensor dscale, upload_host(be, scale, DType::kF32));
  auto out = be.alloc(be.act_dtype(), shape);
  if (!out.ok()) return out.status().with_context("widening " + name);
  Status st = be.dequantize_fp8_rows(w8, dscale, *out);
  if (!st.ok()) return st.with_context("widening " + name);
  return out;
}

Result<Tensor> weight(const WeightStore& ws, Backend& be, const std::string& name,
                      const Shape& shape) {
  if (shape.size() == 2 && ws.is_scaled_fp8(name)) return widen_scaled_fp8(ws, be, name, shape);
  ZI_ASSIGN_OR_RETURN(Tensor src, ws.get(name, shape));  // file dtype, shape checked
  if (!dtype_is_float(src.dtype())) {
    return Unsupported("tensor " + name + " has non-float dtype " + dtype_name(src.dtype()));
  }
  auto r = be.upload(src, be.act_dtype());
  if (!r.ok()) return r.status().with_context("uploading " + name);
  return r;
}

Result<Tensor> host_view(const WeightStore& ws, const std::string& name, const Shape& shape) {
  ZI_ASSIGN_OR_RETURN(Tensor src, ws.get(name, shape));  // file dtype, shape checked
  if (!dtype_is_float(src.dtype()))
    return Unsupported("tensor " + name + " has non-float dtype " + dtype_name(src.dtype()));
  return src;
}

Result<Tensor> upload_rows(Backend& be, const std::vector<Tensor>& parts, DType dtype,
                           const std::string& what) {
  if (parts.empty()) return InternalError("upload_rows(" + what + "): no parts");
  const int64_t k = parts[0].rank() == 2 ? parts[0].dim(1) : -1;
  int64_t rows = 0;
  for (const Tensor& p : parts) {
    if (p.rank() != 2 || p.dim(1) != k)
      return InternalError("upload_rows(" + what + "): part " + p.describe() +
                           " does not fit [*, " + std::to_string(k) + "]");
    rows += p.dim(0);
  }
  if (parts.size() == 1) return upload_host(be, parts[0], dtype);
  auto fused = be.alloc(dtype, {rows, k});
  if (!fused.ok()) return fused.status().with_context("allocating fused " + what);
  int64_t row0 = 0;
  for (const Tensor& p : parts) {
    auto dev = be.upload(p, dtype);
    if (!dev.ok()) return dev.status().with_context("uploading part of fused " + what);
    ZI_TRY(be.copy_2d(*dev, 0, k, *fused, row0 * k, k, p.dim(0), k));
    row0 += p.dim(0);
  }
  return fused;
}

Result<Tensor> concat_rows(Backend& be, const std::vector<Tensor>& parts, const std::string& what) {
  for (const Tensor& p : parts)
    if (!dtype_is_float(p.dtype()))
      return InternalError("concat_rows(" + what + "): part " + p.describe() + " is not float");
  return upload_rows(be, parts, be.act_dtype(), what);
}

Result<Tensor> conv_weight(const WeightStore& ws, Backend& be, const std::string& name,
                           int64_t cout, int64_t cin, int64_t k) {
  Shape oihw{cout, cin, k, k};
  if (k == 1) {  // 1x1 convs may be stored as linears [cout, cin]
    ZI_ASSIGN_OR_RETURN(WeightInfo probe, ws.info(name));
    if (probe.shape.size() == 2) oihw = {cout, cin};
  }
  // [cout, cin, k, k] -> [cout, k, k, cin], element by element, output channels split over a
  // few threads for the large weights (one thread took most of the VAE's ~0.1 s load).
  auto to_ohwi = [&](const auto* s, auto* d) {
    auto rows = [&](int64_t o0, int64_t o1) {
      for (int64_t o = o0; o < o1; ++o)
        for (int64_t i = 0; i < cin; ++i)
          for (int64_t y = 0; y < k; ++y)
            for (int64_t x = 0; x < k; ++x)
              d[((o * k + y) * k + x) * cin + i] = s[((o * cin + i) * k + y) * k + x];
    };
    const int64_t per_o = cin * k * k;
    const int64_t want = std::min<int64_t>(
        {8, cout, std::max<int64_t>(1, cout * per_o >> 20),
         std::max<int64_t>(1, static_cast<int64_t>(std::thread::hardware_concurrency()))});
    std::vector<std::thread> threads;
    int64_t o = 0;
    try {
      for (int64_t t = 1; t < want; ++t) {
        const int64_t end = cout * t / want;
        threads.emplace_back(rows, o, end);
        o = end;
      }
    } catch (const std::exception&) {  // no thread to spare: the rest on this one
    }
    rows(o, cout);
    for (std::thread& th : threads) th.join();
  };
  ZI_ASSIGN_OR_RETURN(Tensor stored, ws.get(name, oihw));
  if (stored.dtype() == be.act_dtype() && dtype_size(stored.dtype()) == 2) {
    // Stored as computed (a bf16 VAE on a bf16 GPU): moved as it is, no widening to f32 and back
    // (the same bits; the VAE's load took 0.15 s of host work before, mostly those two passes).
    Tensor ohwi = Tensor::host_for_overwrite(stored.dtype(), {cout, k, k, cin});
    if (!ohwi.defined()) return OutOfMemory("host buffer for " + name);
    to_ohwi(static_cast<const uint16_t*>(stored.data()), static_cast<uint16_t*>(ohwi.data()));
    auto r = be.upload(ohwi, stored.dtype());
    if (!r.ok()) return r.status().with_context("uploading " + name);
    return r;
  }
  ZI_ASSIGN_OR_RETURN(Tensor w, host_f32(ws, name, oihw));  // [cout, cin, k, k] f32
  Tensor ohwi = Tensor::host_for_overwrite(DType::kF32, {cout, k, k, cin});  // [cout, k, k, cin]
  if (!ohwi.defined()) return OutOfMemory("host buffer for " + name);
  to_ohwi(w.data_as<float>(), ohwi.data_as<float>());
  auto r = be.upload(ohwi, be.act_dtype());
  if (!r.ok()) return r.status().with_context("uploading " + name);
  return r;
}

Status check_all_used(const WeightStore& ws, const std::string& component,
                      const std::function<bool(const std::string&)>& foreign) {
  std::vector<std::string> unexpected;
  for (const std::string& n : ws.unused_names())
    if (!foreign || !foreign(n)) unexpected.push_back(n);
  if (unexpected.empty()) return Status::Ok();
  std::string list;
  const size_t shown = std::min<size_t>(unexpected.size(), 8);
  for (size_t i = 0; i < shown; ++i) list += (i ? ", " : "") + unexpected[i];
  if (shown < unexpected.size())
    list += ", ... (" + std::to_string(unexpected.size() - shown) + " more)";
  return FormatError(component + ": " + std::to_string(unexpected.size()) +
                     " unexpected tensor(s) in " + ws.path() +
                     " (checkpoint and config disagree?): " + list);
}

Result<Tensor> alloc(Backend& be, DType dtype, const Shape& shape, const std::string& what) {
  auto r = be.alloc(dtype, shape);
  if (!r.ok()) return r.status().with_context("allocating " + what + " " + shape_string(shape));
  return r;
}

}  // namespace zimage::load
