// zimage::Engine (include/zimage/zimage.h): picks the backend, loads the pipeline once, and
// serves generate() calls one at a time. The only place where public options become engine
// internals, so the public header stays free of src/ types.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <new>
#include <thread>
#include <utility>

#include "api/backend_choice.h"
#include "api/engine_impl.h"
#include "api/guarded.h"
#include "backend/backend.h"
#include "core/host_memory.h"
#include "core/log.h"
#include "model/common/debug.h"
#include "model/vae/vae_tiling.h"
#include "pipeline/text_to_image.h"
#include "zimage/request_check.h"
#include "zimage/zimage.h"

namespace zimage {

const char* phase_name(Phase p) {
  switch (p) {
    case Phase::kTokenize:
      return "tokenize";
    case Phase::kTextEncoder:
      return "text_encoder";
    case Phase::kDenoise:
      return "denoise";
    case Phase::kVae:
      return "vae";
    case Phase::kVaeEncode:
      return "vae_encode";
  }
  return "unknown";
}

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Engine::~Engine() = default;

Result<std::unique_ptr<Engine>> Engine::load(const EngineOptions& options) {
  return guarded("Engine::load", [&] { return load_impl(options); });
}

Status Engine::validate(const GenerateRequest& req) const {
  return guarded("Engine::validate", [&] { return validate_impl(req); });
}

Result<GenerateResult> Engine::generate(const GenerateRequest& req, const GenerateHooks& hooks) {
  return guarded("Engine::generate", [&] { return generate_impl(req, hooks); });
}

Result<std::unique_ptr<Engine>> Engine::load_impl(const EngineOptions& options) {
  const bool all_files =
      !options.dit_file.empty() && !options.text_encoder_file.empty() && !options.vae_file.empty();
  if (options.model_dir.empty() && !all_files)
    return InvalidArgument(
        "model_dir: no model folder given (or give dit_file, text_encoder_file and vae_file)");
  if (options.model_dir.empty() && options.tokenizer_dir.empty())
    return InvalidArgument("tokenizer_dir: needed when no model folder is given");
  if (options.max_side < 1 || options.max_batch < 1 || options.max_pixels < 1 ||
      options.max_prompt_bytes < 1)
    return InvalidArgument(
        "EngineOptions: max_side, max_batch, max_pixels and "
        "max_prompt_bytes must be positive");
  ZI_ASSIGN_OR_RETURN(const VaeTiling vae_tiling, parse_vae_tiling(options.vae_tiling));
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  const std::vector<std::string>& sp_devices = options.sequence_parallel_devices;
  ModelPaths paths;
  paths.model_dir = options.model_dir;
  paths.transformer_file = options.dit_file;
  paths.text_encoder_file = options.text_encoder_file;
  paths.vae_file = options.vae_file;
  paths.tokenizer_dir = options.tokenizer_dir;
  // The backend starts (CUDA context, cuBLASLt, cuDNN: a few hundred ms) on a thread of its own
  // while this one opens the model's files, parses the tokenizer and starts reading the weights
  // into the page cache. A backend error is reported before a model error, as when the two ran
  // one after the other.
  Result<PreparedLoad> prepared = InternalError("model sources not opened");
  {
    EngineOptions first = options;  // sequence parallel: rank 0 is the first device
    if (!sp_devices.empty()) first.device = sp_devices[0];
    Result<std::unique_ptr<Backend>> backend = InternalError("backend not started");
    std::string precision;
    auto start_backend = [&]() noexcept {
      try {
        backend = guarded("starting the backend", [&]() -> Result<std::unique_ptr<Backend>> {
          auto be = make_backend(first.device, first.precision, first.threads, precision);
          // The upload staging too (CUDA: page-locked buffers, 0.09-0.15 s), while the files open.
          if (be.ok()) (*be)->prepare_uploads();
          return be;
        });
      } catch (...) {  // guarded's own message could not be allocated
        backend = InternalError("starting the backend: out of host memory");
      }
    };
    std::jthread starter;  // joined on every way out of this scope, exceptions included
    try {
      starter = std::jthread(start_backend);
    } catch (const std::exception&) {
      start_backend();  // no thread to spare: one after the other
    }
    prepared = guarded("opening the model", [&] { return TextToImage::prepare(paths); });
    if (starter.joinable()) starter.join();
    if (!backend.ok()) return backend.status();
    impl->backend = std::move(backend).value();
    impl->precision = precision;
    // The backend was made on the starter thread: make it current on this one.
    ZI_TRY(impl->backend->bind_thread());
  }
  if (sp_devices.size() > 1 && options.vram_budget_gib > 0)
    return InvalidArgument(
        "vram_budget_gib: not with sequence parallelism (every rank holds the whole DiT)");
  PipelineLoadOptions load_options;
  if (options.weights != "bf16" && options.weights != "fp8")
    return InvalidArgument("weights: '" + options.weights + "' is not one of bf16, fp8");
  if (!(options.vram_budget_gib >= 0) || options.vram_budget_gib > 1e6)
    return InvalidArgument("vram_budget_gib: must be a number of GiB >= 0 (0 = no limit)");
  if (impl->backend->device() == Device::kCPU && options.vram_budget_gib > 0)
    return InvalidArgument("vram_budget_gib: a device-memory budget needs a CUDA device");
  {
    auto layers = parse_fp8_layers(options.fp8_layers);
    if (!layers.ok()) return layers.status();
    if (options.fp8_layers != "all" && impl->precision != "fp8")
      return InvalidArgument("fp8_layers: '" + options.fp8_layers +
                             "' needs precision fp8 (precision is " + impl->precision + ")");
    if (impl->precision == "fp8") load_options.dit_fp8_compute = *layers;
  }
  load_options.vram_budget =
      static_cast<uint64_t>(options.vram_budget_gib * 1024.0 * 1024.0 * 1024.0);
  if (!(options.host_memory_gib >= 0) || options.host_memory_gib > 1e6)
    return InvalidArgument("host_memory_gib: must be a number of GiB >= 0 (0 = half of memory)");
  load_options.host_pinned_limit =
      options.host_memory_gib > 0
          ? std::max<uint64_t>(
                1, static_cast<uint64_t>(options.host_memory_gib * 1024.0 * 1024.0 * 1024.0))
          : default_pinned_limit();
  if (options.streamed_weights != "copy" && options.streamed_weights != "files" &&
      options.streamed_weights != "locked-files")
    return InvalidArgument("streamed_weights: '" + options.streamed_weights +
                           "' is not one of copy, files, locked-files");
  load_options.stream_from_files = options.streamed_weights != "copy";
  // "files" is the one-shot mode: what must still be copied (FP8 rows) stays pageable unless a
  // host-memory limit is given. Measured on an H100 (docs/BENCHMARKS.md, "Session 18"), one
  // 1024² image with --weights fp8: 3.8-4.1 / 4.3-4.4 s at --vram-budget 8 / 4 against
  // 5.3-5.6 / 7.1-8.2 s with the copies page-locked.
  load_options.pin_host_copies =
      !(options.streamed_weights == "files" && options.host_memory_gib == 0);
  load_options.lock_files = options.streamed_weights == "locked-files";
  load_options.fp8_weights = options.weights == "fp8";
  load_options.plan_width = load_options.plan_height = std::min(options.max_side, 1024);
  for (size_t i = 0; i < options.loras.size(); ++i) {
    if (options.loras[i].path.empty())
      return InvalidArgument("loras[" + std::to_string(i) + "]: no LoRA file given");
    if (!std::isfinite(options.loras[i].scale))
      return InvalidArgument("loras[" + std::to_string(i) + "]: scale of " + options.loras[i].path +
                             " is not a finite number");
  }
  load_options.loras = options.loras;
  load_options.lora_lenient = options.lora_lenient;
  load_options.lora_threads = options.threads;
  if (!prepared.ok()) return prepared.status();
  ZI_ASSIGN_OR_RETURN(impl->pipeline,
                      TextToImage::load(std::move(prepared).value(), *impl->backend, load_options));
  if (!options.controlnet.empty()) ZI_TRY(impl->pipeline->load_controlnet(options.controlnet));
  for (size_t r = 1; r < sp_devices.size(); ++r) {  // ranks 1..P-1 (docs/PARALLEL.md)
    EngineOptions o = options;
    o.device = sp_devices[r];
    std::string precision;
    auto be = make_backend(o.device, o.precision, o.threads, precision);
    if (!be.ok())
      return be.status().with_context("sequence_parallel_devices[" + std::to_string(r) + "]");
    if ((*be)->device() != impl->backend->device() || precision != impl->precision)
      return InvalidArgument("sequence_parallel_devices: " + sp_devices[r] + " (" + (*be)->name() +
                             ", " + precision + ") differs in kind from " + sp_devices[0] + " (" +
                             impl->backend->name() + ", " + impl->precision + ")");
    impl->rank_backends.push_back(std::move(be).value());
  }
  if (!impl->rank_backends.empty()) {
    std::vector<Backend*> ranks;
    for (auto& b : impl->rank_backends) ranks.push_back(b.get());
    ZI_TRY(impl->pipeline->enable_sequence_parallel(ranks, options.sequence_parallel_comm,
                                                    load_options));
    ZI_TRY(impl->backend->bind_thread());
  }
  impl->pipeline->set_vae_tiling({.mode = vae_tiling, .budget_bytes = 0});
  impl->pipeline->set_float_image(false);  // the API returns RGB8 only: made on the backend
  ZI_ASSIGN_OR_RETURN(impl->lora_method, parse_lora_method(options.lora_method, "lora_method"));
  impl->lora_cache = std::make_unique<LoraCache>(options.lora_cache_bytes);
  impl->limits.size_multiple = impl->pipeline->size_multiple();
  // The model's own limit (RoPE tables: latent side / patch < axes_lens) may be lower than the
  // configured one: info() and the range checks report the smaller.
  const int model_side = impl->pipeline->max_image_tokens_side() * impl->pipeline->size_multiple();
  impl->limits.max_side =
      model_side > 0 ? std::min(options.max_side, model_side) : options.max_side;
  impl->limits.max_pixels = options.max_pixels;
  impl->limits.max_batch = options.max_batch;
  impl->limits.max_prompt_bytes = options.max_prompt_bytes;
  return std::unique_ptr<Engine>(new Engine(std::move(impl)));
}

Status Engine::validate_impl(const GenerateRequest& req) const {
  ZI_TRY(check_request(req, impl_->limits));
  return impl_->pipeline->check(req);
}

Result<GenerateResult> Engine::generate_impl(const GenerateRequest& req,
                                             const GenerateHooks& hooks) {
  ZI_TRY(validate_impl(req));
  std::unique_ptr<DebugSink> sink;
  if (!hooks.dump_dir.empty()) {
    ZI_TRY(prepare_dump_dir(hooks.dump_dir));
    sink = make_directory_dump_sink(hooks.dump_dir, hooks.dump_filter);
  }
  TextToImageHooks h;
  h.on_progress = hooks.on_progress;
  h.on_preview = hooks.on_preview;
  h.preview_enabled = hooks.preview_enabled;
  h.cancel = hooks.cancel;
  h.debug = sink.get();
  ZI_ASSIGN_OR_RETURN(std::vector<RuntimeLora> loras, impl_->resolve_loras(req.loras));
  std::lock_guard<std::mutex> lock(impl_->mu);
  ZI_TRY(impl_->backend->bind_thread());
  ZI_TRY(impl_->use_loras(loras));
  ZI_ASSIGN_OR_RETURN(TextToImageOutput out, impl_->pipeline->run(req, h));
  if (sink) ZI_TRY(sink->status());  // a dump that failed fails the call
  GenerateResult result;
  result.images = std::move(out.images);
  result.timings = std::move(out.timings);
  result.seed = req.seed;
  result.device = impl_->backend->name();
  return result;
}

EngineInfo Engine::info() const {
  EngineInfo i;
  i.device = impl_->backend->name();
  i.precision = impl_->precision;
  if (impl_->precision == "fp8") i.fp8_layers = fp8_layers_string(impl_->pipeline->fp8_layers());
  i.size_multiple = impl_->pipeline->size_multiple();
  i.vae_factor = impl_->pipeline->vae_factor();
  i.latent_channels = impl_->pipeline->latent_channels();
  i.max_side = impl_->limits.max_side;
  i.max_batch = impl_->limits.max_batch;
  i.weights = impl_->options.weights;
  i.memory_plan = impl_->pipeline->memory_plan().describe();
  return i;
}

}  // namespace zimage
