// The drop-in transformer in Python: class Transformer over include/zimage/transformer.h. Arrays
// arrive as DLPack-capable objects (torch tensors, NumPy arrays, ...) through nanobind's ndarray,
// which reads their pointer, dtype, shape, strides and device without a copy; the engine then
// reads and writes that memory itself. python/zimage/torch.py builds the diffusers-shaped class
// on it. The module init calls register_transformer(m) once (transformer_binding.h).
#include "transformer_binding.h"

#include <nanobind/ndarray.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bindings.h"
#include "zimage/transformer.h"

namespace nb = nanobind;

namespace zimage::python {
namespace {

using InArray = nb::ndarray<nb::ro>;  // inputs may be read-only (np.load, torch inference tensors)
using OutArray = nb::ndarray<>;

template <typename Array>
TensorView to_view(const Array& a, const std::string& what) {
  TensorView v;
  v.data = const_cast<void*>(static_cast<const void*>(a.data()));  // data + byte_offset
  const nb::dlpack::dtype dt = a.dtype();
  if (dt.lanes == 1 && dt.bits == 32 &&
      dt.code == static_cast<uint8_t>(nb::dlpack::dtype_code::Float))
    v.dtype = ElementType::kF32;
  else if (dt.lanes == 1 && dt.bits == 16 &&
           dt.code == static_cast<uint8_t>(nb::dlpack::dtype_code::Float))
    v.dtype = ElementType::kF16;
  else if (dt.lanes == 1 && dt.bits == 16 &&
           dt.code == static_cast<uint8_t>(nb::dlpack::dtype_code::Bfloat))
    v.dtype = ElementType::kBF16;
  else
    raise_status(FieldError(what, "dtype (DLPack code " + std::to_string(dt.code) + ", " +
                                      std::to_string(dt.bits) +
                                      " bits) is not float32, bfloat16 or float16"));
  for (size_t i = 0; i < a.ndim(); ++i) {
    v.shape.push_back(static_cast<int64_t>(a.shape(i)));
    v.strides.push_back(static_cast<int64_t>(a.stride(i)));
  }
  const int32_t type = a.device_type();
  if (type == nb::device::cpu::value || type == nb::device::cuda_host::value) {
    v.device = {MemoryDevice::Kind::kCPU, 0};
  } else if (type == nb::device::cuda::value) {
    v.device = {MemoryDevice::Kind::kCUDA, a.device_id()};
  } else {
    raise_status(FieldError(what, "lives on DLPack device type " + std::to_string(type) +
                                      "; the transformer takes host or CUDA memory"));
  }
  return v;
}

nb::dict info_dict(const TransformerInfo& i) {
  nb::dict d;
  d["device"] = i.device;
  d["memory_device"] = i.memory.kind == MemoryDevice::Kind::kCUDA
                           ? "cuda:" + std::to_string(i.memory.index)
                           : std::string("cpu");
  d["precision"] = i.precision;
  d["source"] = i.source;
  d["all_patch_size"] = std::vector<int>{i.patch_size};
  d["all_f_patch_size"] = std::vector<int>{i.f_patch_size};
  d["in_channels"] = i.in_channels;
  d["dim"] = i.dim;
  d["n_layers"] = i.n_layers;
  d["n_refiner_layers"] = i.n_refiner_layers;
  d["n_heads"] = i.n_heads;
  d["n_kv_heads"] = i.n_kv_heads;
  d["norm_eps"] = i.norm_eps;
  d["qk_norm"] = i.qk_norm;
  d["cap_feat_dim"] = i.cap_feat_dim;
  d["rope_theta"] = i.rope_theta;
  d["t_scale"] = i.t_scale;
  d["axes_dims"] = i.axes_dims;
  d["axes_lens"] = i.axes_lens;
  d["max_caption_tokens"] = i.max_caption_tokens;
  return d;
}

struct PyTransformer {
  std::unique_ptr<Transformer> t;
};

}  // namespace

void register_transformer(nb::module_& m) {
  nb::class_<PyTransformer>(m, "Transformer",
                            "zimage's Z-Image DiT called as diffusers' ZImageTransformer2DModel "
                            "(include/zimage/transformer.h); zimage.torch wraps it for PyTorch.")
      .def(
          "__init__",
          [](PyTransformer* self, const std::string& path, const std::string& device,
             const std::string& precision, const std::string& weights,
             const std::string& fp8_layers, const std::vector<std::pair<std::string, float>>& loras,
             bool lora_lenient, int threads) {
            TransformerOptions o;
            o.path = path;
            o.device = device;
            o.precision = precision;
            o.weights = weights;
            o.fp8_layers = fp8_layers;
            for (const auto& [p, s] : loras) o.loras.push_back({p, s});
            o.lora_lenient = lora_lenient;
            o.threads = threads;
            Result<std::unique_ptr<Transformer>> r = Status(ErrorCode::kInternal, "not run");
            {
              nb::gil_scoped_release unlocked;
              r = Transformer::load(o);
            }
            if (!r.ok()) raise_status(r.status());
            new (self) PyTransformer{std::move(r).value()};
          },
          nb::arg("path"), nb::arg("device") = "auto", nb::arg("precision") = "auto",
          nb::arg("weights") = "bf16", nb::arg("fp8_layers") = "all",
          nb::arg("loras") = std::vector<std::pair<std::string, float>>{},
          nb::arg("lora_lenient") = false, nb::arg("threads") = 0,
          "Loads a model folder, transformer folder or single DiT file (.safetensors, .gguf).")
      .def_prop_ro(
          "info", [](const PyTransformer& self) { return info_dict(self.t->info()); },
          "The config diffusers' model holds, plus device, precision and source.")
      .def(
          "forward",
          [](PyTransformer& self, const std::vector<InArray>& x, const InArray& t,
             const std::vector<InArray>& cap_feats, const std::vector<OutArray>& out,
             uintptr_t cuda_stream) {
            TransformerCall call;
            for (size_t i = 0; i < x.size(); ++i)
              call.x.push_back(to_view(x[i], "x[" + std::to_string(i) + "]"));
            call.t = to_view(t, "t");
            for (size_t i = 0; i < cap_feats.size(); ++i)
              call.cap_feats.push_back(
                  to_view(cap_feats[i], "cap_feats[" + std::to_string(i) + "]"));
            for (size_t i = 0; i < out.size(); ++i)
              call.out.push_back(to_view(out[i], "out[" + std::to_string(i) + "]"));
            call.cuda_stream = reinterpret_cast<void*>(cuda_stream);
            Status st;
            {
              nb::gil_scoped_release unlocked;  // the arrays stay referenced by the caller
              st = self.t->forward(call);
            }
            if (!st.ok()) raise_status(st);
          },
          nb::arg("x"), nb::arg("t"), nb::arg("cap_feats"), nb::arg("out"),
          nb::arg("cuda_stream") = 0,
          "Runs the DiT: x [C, 1, H, W] each, t [B], cap_feats [L_i, cap_feat_dim] each, into out "
          "(shaped as x); cuda_stream: the cudaStream_t (int) the work is ordered with.");
}

}  // namespace zimage::python
