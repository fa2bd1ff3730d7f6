// Argument checks of the drop-in transformer (api/transformer_views.h).
#include "api/transformer_views.h"

#include <limits>

namespace zimage {

const char* element_type_name(ElementType t) {
  switch (t) {
    case ElementType::kF32:
      return "f32";
    case ElementType::kBF16:
      return "bf16";
    case ElementType::kF16:
      return "f16";
  }
  return "unknown";
}

DType to_dtype(ElementType t) {
  switch (t) {
    case ElementType::kBF16:
      return DType::kBF16;
    case ElementType::kF16:
      return DType::kF16;
    case ElementType::kF32:
      break;
  }
  return DType::kF32;
}

std::string memory_device_name(const MemoryDevice& d) {
  return d.kind == MemoryDevice::Kind::kCPU ? std::string("cpu")
                                            : "cuda:" + std::to_string(d.index);
}

Tensor wrap_view(const TensorView& v) {
  return Tensor::wrap(v.data, to_dtype(v.dtype), v.shape,
                      v.device.kind == MemoryDevice::Kind::kCUDA ? Device::kCUDA : Device::kCPU);
}

namespace {

std::string shape_text(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

bool same_device(const MemoryDevice& a, const MemoryDevice& b) {
  return a.kind == b.kind && (a.kind == MemoryDevice::Kind::kCPU || a.index == b.index);
}

// What every view must be: a known dtype, non-negative dims, a non-null pointer (unless empty),
// contiguous row-major strides (size-1 dims may have any stride), on `where` when given.
Status check_view(const std::string& field, const TensorView& v, const MemoryDevice* where) {
  if (v.dtype != ElementType::kF32 && v.dtype != ElementType::kBF16 && v.dtype != ElementType::kF16)
    return FieldError(field, "dtype must be float32, bfloat16 or float16");
  int64_t numel = 1;
  for (int64_t d : v.shape) {
    if (d < 0) return FieldError(field, "shape " + shape_text(v.shape) + " has a negative size");
    if (d != 0 && numel > std::numeric_limits<int64_t>::max() / d)
      return FieldError(field, "shape " + shape_text(v.shape) + " is too large");
    numel *= d;
  }
  if (!v.strides.empty()) {
    if (v.strides.size() != v.shape.size())
      return FieldError(field, "has " + std::to_string(v.strides.size()) + " strides for " +
                                   std::to_string(v.shape.size()) + " dimensions");
    int64_t expect = 1;
    for (size_t i = v.shape.size(); i-- > 0;) {
      if (v.shape[i] != 1 && v.strides[i] != expect)
        return FieldError(field, "strides " + shape_text(v.strides) + " of shape " +
                                     shape_text(v.shape) +
                                     " are not contiguous row-major (make it contiguous first)");
      expect *= v.shape[i];
    }
  }
  if (numel > 0 && v.data == nullptr) return FieldError(field, "data is a null pointer");
  if (where != nullptr && !same_device(v.device, *where))
    return FieldError(field, "is on " + memory_device_name(v.device) +
                                 ", the transformer runs on " + memory_device_name(*where));
  return Status::Ok();
}

}  // namespace

Status check_call(const TransformerCall& call, const TransformerInfo& info) {
  const size_t b = call.x.size();
  if (b == 0) return FieldError("x", "no latents given");
  if (call.cap_feats.size() != b)
    return FieldError("cap_feats", "has " + std::to_string(call.cap_feats.size()) +
                                       " items, x has " + std::to_string(b));
  if (call.out.size() != b)
    return FieldError(
        "out", "has " + std::to_string(call.out.size()) + " items, x has " + std::to_string(b));
  const MemoryDevice& dev = info.memory;
  const int64_t p = info.patch_size;
  for (size_t i = 0; i < b; ++i) {
    const std::string f = "x[" + std::to_string(i) + "]";
    const TensorView& x = call.x[i];
    ZI_TRY(check_view(f, x, &dev));
    const auto& s = x.shape;
    if (s.size() != 4 || s[0] != info.in_channels || s[1] != 1)
      return FieldError(f, "shape " + shape_text(s) + " is not [" +
                               std::to_string(info.in_channels) + ", 1, H, W]");
    if (s[2] < p || s[3] < p || s[2] % p != 0 || s[3] % p != 0)
      return FieldError(f, "height " + std::to_string(s[2]) + " and width " + std::to_string(s[3]) +
                               " must be positive multiples of the patch size " +
                               std::to_string(p));
    if (s[2] / p > info.axes_lens[1] || s[3] / p > info.axes_lens[2])
      return FieldError(f, "shape " + shape_text(s) +
                               " has more patches per side than the RoPE "
                               "tables hold (axes_lens " +
                               std::to_string(info.axes_lens[1]) + " x " +
                               std::to_string(info.axes_lens[2]) + ")");
    const std::string fo = "out[" + std::to_string(i) + "]";
    ZI_TRY(check_view(fo, call.out[i], &dev));
    if (call.out[i].shape != s)
      return FieldError(fo, "shape " + shape_text(call.out[i].shape) + " differs from x[" +
                                std::to_string(i) + "]'s " + shape_text(s));
    const std::string fc = "cap_feats[" + std::to_string(i) + "]";
    const TensorView& c = call.cap_feats[i];
    ZI_TRY(check_view(fc, c, &dev));
    if (c.shape.size() != 2 || c.shape[1] != info.cap_feat_dim)
      return FieldError(fc, "shape " + shape_text(c.shape) + " is not [L, " +
                                std::to_string(info.cap_feat_dim) + "]");
    if (c.shape[0] < 1 || c.shape[0] > info.max_caption_tokens)
      return FieldError(fc, std::to_string(c.shape[0]) + " caption tokens; 1 to " +
                                std::to_string(info.max_caption_tokens) + " fit the RoPE tables");
  }
  // t is read on the host: host memory, or the transformer's device.
  ZI_TRY(check_view("t", call.t, nullptr));
  if (call.t.device.kind != MemoryDevice::Kind::kCPU && !same_device(call.t.device, dev))
    return FieldError("t", "is on " + memory_device_name(call.t.device) +
                               ", the transformer runs on " + memory_device_name(dev));
  int64_t tn = 1;
  for (int64_t d : call.t.shape) tn *= d;
  if (call.t.shape.size() > 1 || (tn != static_cast<int64_t>(b) && tn != 1))
    return FieldError("t", "shape " + shape_text(call.t.shape) + " is not [" + std::to_string(b) +
                               "] (one timestep per latent) or a single number");
  return Status::Ok();
}

}  // namespace zimage
