// zimage::Transformer (include/zimage/transformer.h): the engine's DiT (model/dit/zimage_dit.h),
// loaded alone by the pipeline's own loader (pipeline/transformer_load.h) and run on the
// caller's memory. Per call: the engine's stream waits for the caller's; each latent and caption
// is converted on the device into the engine's buffers (f32 latents, captions in the compute
// dtype, as the pipeline hands them to ZImageDiT::forward); each size of latents runs as one
// forward; each output is converted into the caller's buffer; the caller's stream waits for the
// engine's.
#include "zimage/transformer.h"

#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>

#include "api/backend_choice.h"
#include "api/guarded.h"
#include "api/transformer_views.h"
#include "backend/backend.h"
#include "core/log.h"
#include "model/common/linear.h"
#include "model/dit/zimage_dit.h"
#include "pipeline/text_to_image.h"
#include "pipeline/transformer_load.h"

namespace zimage {

struct Transformer::Impl {
  TransformerInfo info;
  std::unique_ptr<Backend> backend;  // declared before the model, which holds its tensors
  std::unique_ptr<ZImageDiT> dit;
  std::mutex mu;  // one forward at a time: the backend's buffers and recordings are shared

  Status forward(const TransformerCall& call);
  // The timesteps as host floats, one per latent (a single number repeated).
  Result<std::vector<float>> read_timesteps(const TransformerCall& call);
};

namespace {

// `st` about option `field`: the field set, the message starting with "<field>: ".
Status about(const std::string& field, const Status& st) {
  if (st.ok() || !st.field().empty()) return st;
  if (st.message().rfind(field + ": ", 0) == 0) return st.with_field(field);
  return Status(st.code(), field + ": " + st.message()).with_field(field);
}

// One forward's worth of latents of the same size.
struct Group {
  std::vector<size_t> items;  // indices into the call's lists
  Tensor latents;             // [n, C, H, W] f32
  std::vector<Tensor> caps;   // [L_i, cap_feat_dim] in the compute dtype
  std::vector<float> t;
  Tensor out;  // [n, C, H, W] f32
};

}  // namespace

Transformer::Transformer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Transformer::~Transformer() = default;

const TransformerInfo& Transformer::info() const {
  return impl_->info;
}

Status Transformer::validate(const TransformerCall& call) const {
  return guarded("Transformer::validate", [&] { return check_call(call, impl_->info); });
}

Status Transformer::forward(const TransformerCall& call) {
  return guarded("Transformer::forward", [&] {
    std::lock_guard<std::mutex> lock(impl_->mu);
    return impl_->forward(call);
  });
}

Result<std::unique_ptr<Transformer>> Transformer::load(const TransformerOptions& o) {
  return guarded("Transformer::load", [&]() -> Result<std::unique_ptr<Transformer>> {
    if (o.path.empty()) return FieldError("path", "no transformer folder or file given");
    if (o.weights != "bf16" && o.weights != "fp8")
      return FieldError("weights", "'" + o.weights + "' is not one of bf16, fp8");
    for (size_t i = 0; i < o.loras.size(); ++i) {
      const std::string f = "loras[" + std::to_string(i) + "]";
      if (o.loras[i].path.empty()) return FieldError(f, "no LoRA file given");
      if (!std::isfinite(o.loras[i].scale))
        return FieldError(f, "scale of " + o.loras[i].path + " is not a finite number");
    }
    auto layers = parse_fp8_layers(o.fp8_layers);
    if (!layers.ok()) return about("fp8_layers", layers.status());
    auto impl = std::make_unique<Impl>();
    TransformerInfo& info = impl->info;
    ZI_ASSIGN_OR_RETURN(impl->backend,
                        make_backend(o.device, o.precision, o.threads, info.precision));
    if (o.fp8_layers != "all" && info.precision != "fp8")
      return FieldError("fp8_layers", "'" + o.fp8_layers + "' needs precision fp8 (precision is " +
                                          info.precision + ")");
    auto src = open_transformer_source(o.path);
    if (!src.ok()) return about("path", src.status());
    WeightPlacement placement;
    placement.fp8_weights = o.weights == "fp8";
    placement.fp8_compute = info.precision == "fp8" ? *layers : 0u;
    PipelineLoadOptions load_options;
    load_options.loras = o.loras;
    load_options.lora_lenient = o.lora_lenient;
    load_options.lora_threads = o.threads;
    Backend& be = *impl->backend;
    ZI_ASSIGN_OR_RETURN(impl->dit,
                        load_transformer(src->config, src->weights, be, placement, load_options));
    if (Status st = be.finish_uploads(); !st.ok()) return st.with_context("loading transformer");
    ZI_INFO("loaded transformer %s on %s", src->description.c_str(), be.name().c_str());

    const TransformerConfig& c = src->config;
    info.device = be.name();
    info.memory.kind =
        be.device() == Device::kCUDA ? MemoryDevice::Kind::kCUDA : MemoryDevice::Kind::kCPU;
    const int gpu = cuda_index(o.device);
    info.memory.index = info.memory.kind == MemoryDevice::Kind::kCUDA && gpu > 0 ? gpu : 0;
    info.source = src->description;
    info.patch_size = c.patch_size;
    info.f_patch_size = c.f_patch_size;
    info.in_channels = c.in_channels;
    info.dim = c.dim;
    info.n_layers = c.n_layers;
    info.n_refiner_layers = c.n_refiner_layers;
    info.n_heads = c.n_heads;
    info.n_kv_heads = c.n_kv_heads;
    info.norm_eps = c.norm_eps;
    info.qk_norm = c.qk_norm;
    info.cap_feat_dim = c.cap_feat_dim;
    info.rope_theta = c.rope_theta;
    info.t_scale = c.t_scale;
    info.axes_dims = c.axes_dims;
    info.axes_lens = c.axes_lens;
    info.max_caption_tokens = static_cast<int>(impl->dit->max_caption_tokens());
    return std::unique_ptr<Transformer>(new Transformer(std::move(impl)));
  });
}

Result<std::vector<float>> Transformer::Impl::read_timesteps(const TransformerCall& call) {
  const TensorView& v = call.t;
  const size_t n = v.shape.empty() ? 1 : static_cast<size_t>(v.shape[0]);
  Tensor host = Tensor::host(DType::kF32, {static_cast<int64_t>(n)});
  if (!host.defined()) return OutOfMemory("t: host buffer");
  if (v.device.kind == MemoryDevice::Kind::kCPU) {
    if (!convert_to_f32(to_dtype(v.dtype), v.data, host.data_as<float>(), n))
      return FieldError("t", "cannot be read as float32");
  } else {
    Tensor dev = wrap_view(v).view({static_cast<int64_t>(n)});
    // Waits for the engine's stream, which waits for the caller's: t as the caller wrote it.
    if (Status st = backend->download(dev, host); !st.ok()) return about("t", st);
  }
  const float* p = host.data_as<float>();
  std::vector<float> t(call.x.size(), p[0]);
  if (n == call.x.size()) t.assign(p, p + n);
  return t;
}

Status Transformer::Impl::forward(const TransformerCall& call) {
  ZI_TRY(check_call(call, info));
  Backend& be = *backend;
  ZI_TRY(be.bind_thread());
  const bool cuda = info.memory.kind == MemoryDevice::Kind::kCUDA;
  if (cuda) ZI_TRY(about("cuda_stream", be.wait_for_stream(call.cuda_stream)));
  auto run = [&]() -> Status {
    ZI_ASSIGN_OR_RETURN(std::vector<float> t, read_timesteps(call));
    // Latents of one size run as one batch (ZImageDiT::forward takes [B, C, H, W]).
    std::map<std::pair<int64_t, int64_t>, Group> groups;
    for (size_t i = 0; i < call.x.size(); ++i)
      groups[{call.x[i].shape[2], call.x[i].shape[3]}].items.push_back(i);
    const int64_t c = info.in_channels;
    // Every input into the engine's buffers before any output is written (out may alias x).
    for (auto& [size, g] : groups) {
      const int64_t n = static_cast<int64_t>(g.items.size());
      ZI_ASSIGN_OR_RETURN(g.latents, be.alloc(DType::kF32, {n, c, size.first, size.second}));
      for (int64_t j = 0; j < n; ++j) {
        const size_t i = g.items[static_cast<size_t>(j)];
        const std::string f = "x[" + std::to_string(i) + "]";
        Tensor dst = g.latents.slice0(j, j + 1);
        ZI_TRY(about(f, be.convert(wrap_view(call.x[i]), dst)));
        const TensorView& cv = call.cap_feats[i];
        ZI_ASSIGN_OR_RETURN(Tensor cap, be.alloc(be.act_dtype(), cv.shape));
        ZI_TRY(about("cap_feats[" + std::to_string(i) + "]", be.convert(wrap_view(cv), cap)));
        g.caps.push_back(std::move(cap));
        g.t.push_back(t[i]);
      }
    }
    for (auto& [size, g] : groups) ZI_TRY(dit->forward(g.latents, g.t, g.caps, g.out));
    for (auto& [size, g] : groups) {
      for (size_t j = 0; j < g.items.size(); ++j) {
        const size_t i = g.items[j];
        Tensor dst = wrap_view(call.out[i]);
        const int64_t k = static_cast<int64_t>(j);
        ZI_TRY(about("out[" + std::to_string(i) + "]", be.convert(g.out.slice0(k, k + 1), dst)));
      }
    }
    return Status::Ok();
  };
  const Status st = run();
  // Even after an error the caller's stream waits for what was queued on the inputs, so it
  // cannot reuse their memory under a pending read.
  if (cuda) {
    const Status sig = about("cuda_stream", be.signal_stream(call.cuda_stream));
    if (st.ok()) return sig;
  }
  return st;
}

}  // namespace zimage
