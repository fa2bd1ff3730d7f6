// Loading the text-to-image pipeline from a diffusers folder and/or single files
// (io/model/model_source.h): configs first (parsed or inferred and validated before any weight is
// read), then each component onto the backend. Kept apart from the loop in text_to_image.cpp
// because it is the only part that touches the file system.
//
// check_folder() runs the same code against the check-only backend (backend/check), which binds
// every weight without holding it: `zimage info` then reports exactly what `generate` would reject,
// and there is no second list of expected tensors that could drift from the loaders.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <future>
#include <new>
#include <optional>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>

#include "backend/check/check_backend.h"
#include "core/log.h"
#include "core/text.h"
#include "io/model/infer_config.h"
#include "io/model/model_folder.h"
#include "io/model/model_source.h"
#include "io/weights/single_file.h"
#include "pipeline/text_to_image.h"
#include "pipeline/transformer_load.h"

namespace zimage {

namespace {

// The components in the order load() binds them (its first error is the one reported).
constexpr const char* kParts[] = {"tokenizer", "text_encoder", "transformer", "vae"};

// Drops `store` (its files' mappings) on a thread of its own. The load faulted in every page of
// the mappings it uploaded from, and unmapping them costs the kernel ~3 ms a GB (measured on the
// development machine: 6.3-6.9 ms for a 2.15 GB file read through its mapping), ~60 ms for the
// full-size model, which the next component's load (or the first image) need not wait for.
// Mappings that loaded tensors still view (weights streamed from the files) stay alive through
// those views, as before. Without a thread to spare, the store is dropped here.
void release_in_background(WeightStore&& store) noexcept {
  try {
    auto owned = std::make_shared<WeightStore>(std::move(store));
    std::thread([owned = std::move(owned)]() mutable noexcept { owned.reset(); }).detach();
  } catch (...) {  // no memory or no thread: `store` (or the lambda's copy) is dropped here
  }
}

// Loads one component of `src` onto `be` into `parts`; errors carry "loading <part>: ".
Status load_part(const ModelSource& src, const std::string& part, Backend& be,
                 TextToImageComponents& parts, const MemoryPlan* plan = nullptr,
                 const PipelineLoadOptions& options = {}) {
  WeightPlacement te_place, dit_place;
  if (plan) {
    te_place.streamed = plan->te_streamed;
    dit_place.streamed = plan->dit_streamed;
    te_place.pageable = plan->te_pageable;
    dit_place.pageable = plan->dit_pageable;
  }
  te_place.fp8_weights = dit_place.fp8_weights = options.fp8_weights;
  dit_place.fp8_compute = options.dit_fp8_compute;
  te_place.keep_quantized = dit_place.keep_quantized = options.keep_quantized;
  te_place.stream_from_files = dit_place.stream_from_files = options.stream_from_files;
  te_place.lock_files = dit_place.lock_files = options.lock_files;
  te_place.first_slot = 2;  // the DiT streams through slots 0-1, the text encoder 2-3
  const std::string what = "loading " + part;
  if (part == "tokenizer") {
    auto tok = Tokenizer::load(src.tokenizer_dir());
    if (!tok.ok()) return tok.status().with_context(what);
    parts.tokenizer = std::make_unique<Tokenizer>(std::move(tok).value());
    return Status::Ok();
  }
  auto ws = src.open_weights(part);
  if (!ws.ok()) return ws.status().with_context(what);
  const ZImageConfigs& cfg = src.configs();
  // Uploads straight from the files' pages (Backend::upload_from_locked_files): each mapping
  // page-locked in place while this component loads, released (after the device is done with
  // them) when it has. Not with weights streamed from the files, which lock their own pages.
  std::vector<std::shared_ptr<void>> locks;
  if (be.upload_from_locked_files() && !options.stream_from_files) {
    const long ps = ::sysconf(_SC_PAGESIZE);
    const uint64_t page = ps > 0 ? static_cast<uint64_t>(ps) : 4096;
    for (const auto& [base, bytes] : ws->mappings()) {
      auto lock = be.lock_host_range(base, (bytes + page - 1) / page * page);
      if (!lock.ok()) {
        ZI_WARN("%s: %s; uploading through staging", part.c_str(), lock.status().message().c_str());
        break;
      }
      locks.push_back(std::move(lock).value());
    }
  }
  if (part == "text_encoder") {
    // The loaders name themselves ("loading text encoder: ..."): no second prefix.
    auto te = Qwen3Encoder::load(cfg.text_encoder, ws.value(), be, te_place);
    if (!te.ok()) return te.status();
    if (const std::string k = (*te)->kept_quantized().describe(); !k.empty())
      ZI_INFO("text encoder: %s", k.c_str());
    parts.text_encoder = std::move(te).value();
  } else if (part == "transformer") {
    ZI_ASSIGN_OR_RETURN(parts.transformer,
                        load_transformer(cfg.transformer, ws.value(), be, dit_place, options));
  } else {
    auto vae = VaeDecoder::load(cfg.vae, ws.value(), be);
    if (!vae.ok()) return vae.status();
    parts.vae = std::move(vae).value();
  }
  locks.clear();  // the pages are unlocked (after the device is done with them) before unmapping
  release_in_background(std::move(ws).value());
  return Status::Ok();
}

// The planner counts the blocks' linear weights as the files store them where they stay
// quantised on the device (model/common/quantized_linear.h); a LoRA-merged transformer keeps the
// widened estimate (its targeted weights are widened at load).
Status count_stored_weights(const ModelSource& src, DType act, const PipelineLoadOptions& o,
                            MemoryPlanInput& in) {
  if (!o.keep_quantized) return Status::Ok();
  WeightPlacement place;
  place.fp8_weights = o.fp8_weights;
  bool kept = false;
  {
    auto opened = src.open_weights(Component::kTextEncoder);
    if (!opened.ok()) return opened.status().with_context("loading text_encoder");
    const WeightStore& ws = *opened;
    const auto b = static_cast<uint64_t>(
        Qwen3Encoder::stored_layer_weight_bytes(src.configs().text_encoder, ws, act, place));
    kept = kept || b != in.te_layer_bytes;
    in.te_layer_bytes = b;
  }
  if (o.loras.empty()) {
    auto opened = src.open_weights(Component::kTransformer);
    if (!opened.ok()) return opened.status().with_context("loading transformer");
    const WeightStore& ws = *opened;
    const auto b = static_cast<uint64_t>(
        ZImageDiT::stored_block_weight_bytes(src.configs().transformer, ws, act, place));
    kept = kept || b != in.dit_block_bytes;
    in.dit_block_bytes = b;
  }
  if (kept && in.fp8_scratch_bytes == 0) {
    const TransformerConfig& tc = src.configs().transformer;
    const TextEncoderConfig& ec = src.configs().text_encoder;
    in.fp8_scratch_bytes =
        static_cast<uint64_t>(std::max<int64_t>({2 * tc.ffn_hidden() * tc.dim, 3 * tc.dim * tc.dim,
                                                 2 * ec.intermediate_size * ec.hidden_size})) *
        dtype_size(act);
  }
  return Status::Ok();
}

// The device memory the context and libraries hold, from the driver's view (0 on the CPU).
Result<uint64_t> fixed_device_bytes(Backend& be) {
  if (be.device() == Device::kCPU) return uint64_t{0};
  ZI_ASSIGN_OR_RETURN(auto mem, be.device_memory());  // {total, free}
  const uint64_t used = mem.first - mem.second;
  const uint64_t ours = be.memory_use().reserved;
  return used > ours ? used - ours : 0;
}

// Device memory the warm-up may hold for a moment while the weights load
// (Backend::WarmUpHints::scratch_bytes): without a budget, what the device has free beyond every
// weight still to come and a 2 GiB margin, at most 2 GiB; none under a budget, where the plan
// counts every byte.
uint64_t warm_up_scratch(Backend& be, const MemoryPlan& plan, const PipelineLoadOptions& o) {
  constexpr uint64_t kGiB = uint64_t{1} << 30;
  if (o.vram_budget != 0 || be.device() == Device::kCPU) return 0;
  auto mem = be.device_memory();  // {total, free}
  if (!mem.ok()) return 0;
  const uint64_t spare = mem->second > plan.resident_bytes ? mem->second - plan.resident_bytes : 0;
  return spare > 2 * kGiB ? std::min(spare - 2 * kGiB, 2 * kGiB) : 0;
}

}  // namespace

Result<std::unique_ptr<TextToImage>> TextToImage::load(const std::string& model_dir, Backend& be,
                                                       const PipelineLoadOptions& options) {
  ModelPaths paths;
  paths.model_dir = model_dir;
  return load(paths, be, options);
}

Result<PreparedLoad> TextToImage::prepare(const ModelPaths& paths) {
  const auto start = std::chrono::steady_clock::now();
  PreparedLoad p;
  p.paths = paths;
  ZI_ASSIGN_OR_RETURN(ModelSource src, ModelSource::open(paths));
  p.source = std::make_unique<ModelSource>(std::move(src));
  // The files in the order load() reads them: text encoder, transformer, VAE.
  std::vector<std::string> files;
  for (Component c : {Component::kTextEncoder, Component::kTransformer, Component::kVae}) {
    if (!p.source->file(c).empty()) {
      files.push_back(p.source->file(c));
      continue;
    }
    auto ws = p.source->open_weights(c);
    if (!ws.ok()) continue;  // load() reports it
    for (std::string& f : ws->files()) files.push_back(std::move(f));
  }
  // A file given for two components (an all-in-one checkpoint) is read once.
  std::vector<std::string> unique;
  for (std::string& f : files)
    if (std::find(unique.begin(), unique.end(), f) == unique.end()) unique.push_back(std::move(f));
  FilePrefetcher::Options read_ahead;
  read_ahead.max_bytes = FilePrefetcher::default_limit();
  // ZIMAGE_PREFETCH_GATE=1: the uploads wait for the read-ahead rather than fault the files in
  // (io/fs/prefetch.h, "the gate"; measured slower from a cold cache, so off by default).
  ZI_TRY(env_switch("ZIMAGE_PREFETCH_GATE", read_ahead.gate));
  p.prefetch = FilePrefetcher::start(std::move(unique), std::move(read_ahead));
  p.started = start;
  // Not noexcept: an exception these handlers cannot turn into a Status (a second bad_alloc)
  // travels in the future, and load() reports it.
  auto parse = [dir = p.source->tokenizer_dir()]() -> Result<std::unique_ptr<Tokenizer>> {
    try {
      ZI_ASSIGN_OR_RETURN(Tokenizer tok, Tokenizer::load(dir));
      return std::make_unique<Tokenizer>(std::move(tok));
    } catch (const std::bad_alloc&) {
      return OutOfMemory("parsing the tokenizer: out of host memory");
    } catch (const std::exception& e) {
      return InternalError(std::string("parsing the tokenizer: ") + e.what());
    }
  };
  try {
    p.tokenizer = std::async(std::launch::async, parse);
  } catch (const std::exception&) {  // no thread (or memory) to spare: parsed here, as before
    std::promise<Result<std::unique_ptr<Tokenizer>>> now;
    now.set_value(parse());
    p.tokenizer = now.get_future();
  }
  p.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ZI_INFO("model sources opened in %.3f s", p.seconds);
  return p;
}

Result<std::unique_ptr<TextToImage>> TextToImage::load(const ModelPaths& paths, Backend& be,
                                                       const PipelineLoadOptions& options) {
  ZI_ASSIGN_OR_RETURN(PreparedLoad prepared, prepare(paths));
  return load(std::move(prepared), be, options);
}

Result<std::unique_ptr<TextToImage>> TextToImage::load(PreparedLoad prepared, Backend& be,
                                                       const PipelineLoadOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  if (!prepared.source) return InvalidArgument("TextToImage::load: nothing prepared");
  const ModelPaths& paths = prepared.paths;
  const std::string what = paths.describe();
  const ModelSource& src = *prepared.source;
  TextToImageComponents parts;
  parts.scheduler = src.configs().scheduler;
  // The tokenizer prepare() parses on its own thread (PreparedLoad::tokenizer): taken at the first
  // boundary between parts where it is ready, so a broken one stops the load there; at the
  // latest after the weights. And before any other error is reported, so the first error is a
  // bad tokenizer's whatever the timing, as when it was parsed first (kParts' order, which
  // check_folder keeps).
  auto take_tokenizer = [&]() -> Status {
    if (!prepared.tokenizer.valid()) return Status::Ok();
    const auto t0 = std::chrono::steady_clock::now();
    Result<std::unique_ptr<Tokenizer>> tok = InternalError("the tokenizer was not parsed");
    try {
      tok = prepared.tokenizer.get();
    } catch (const std::bad_alloc&) {
      tok = OutOfMemory("parsing the tokenizer: out of host memory");
    } catch (const std::exception& e) {
      tok = InternalError(std::string("parsing the tokenizer: ") + e.what());
    }
    if (!tok.ok()) return tok.status().with_context("loading tokenizer");
    parts.tokenizer = std::move(tok).value();
    ZI_INFO(
        "tokenizer ready (waited %.3f s, %.3f s after the load began)",
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
        std::chrono::duration<double>(std::chrono::steady_clock::now() - prepared.started).count());
    return Status::Ok();
  };
  auto tokenizer_ready = [&] {
    return prepared.tokenizer.valid() &&
           prepared.tokenizer.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
  };
  std::optional<MemoryPlan> plan;
  // Library start-up the first image would otherwise wait for (Backend::warm_up) runs beside the
  // uploads from the memory plan on, and is joined before the last upload is waited for. Started
  // after the plan so that the plan's reading of the device's memory sees none of it.
  std::jthread warmer;
  const Status loaded = [&]() -> Status {
    for (Component c : {Component::kTransformer, Component::kTextEncoder, Component::kVae}) {
      if (src.file(c).empty()) continue;
      const std::string fp8 = src.fp8(c).describe();
      ZI_INFO("%s from %s: config %s%s%s", component_name(c), src.file(c).c_str(),
              src.config_origin(c).c_str(), fp8.empty() ? "" : "; ", fp8.c_str());
    }
    using Clock = std::chrono::steady_clock;
    const Clock::time_point p0 = Clock::now();
    ZI_ASSIGN_OR_RETURN(uint64_t fixed, fixed_device_bytes(be));
    const Clock::time_point p1 = Clock::now();
    uint64_t vae_params = 0;
    {
      auto vae_ws = src.open_weights("vae");
      if (!vae_ws.ok()) return vae_ws.status().with_context("loading vae");
      vae_params = static_cast<uint64_t>(vae_ws->total_params());
    }
    MemoryPlanInput plan_in = plan_input(src.configs(), be.act_dtype(), options, vae_params, fixed);
    ZI_TRY(count_stored_weights(src, be.act_dtype(), options, plan_in));
    ZI_ASSIGN_OR_RETURN(plan, plan_memory(plan_in));
    ZI_INFO("%s", plan->describe().c_str());
    auto ms = [](Clock::time_point a, Clock::time_point b) {
      return std::chrono::duration<double, std::milli>(b - a).count();
    };
    ZI_DEBUG(
        "memory plan made in %.1f ms (the device's fixed bytes %.1f ms, the weights counted "
        "%.1f ms)",
        ms(p0, Clock::now()), ms(p0, p1), ms(p1, Clock::now()));
    if (be.device() != Device::kCPU) {  // the CPU has nothing to warm
      try {
        Backend::WarmUpHints hints = warm_up_hints(src.configs(), options);
        hints.scratch_bytes = warm_up_scratch(be, *plan, options);
        warmer = std::jthread([&be](Backend::WarmUpHints h) noexcept { be.warm_up(h); },
                              std::move(hints));
      } catch (const std::exception&) {  // no thread or memory to spare: the first image pays
      }
    }
    if (options.vram_budget != 0)  // the allocator's share: the budget less the context's
      be.set_memory_limit(options.vram_budget > plan_in.fixed ? options.vram_budget - plan_in.fixed
                                                              : 1);
    for (const char* part : kParts) {
      if (tokenizer_ready()) ZI_TRY(take_tokenizer());
      // The prepared tokenizer is taken as above; only a load without one parses it here.
      if (std::string_view(part) == "tokenizer" && (prepared.tokenizer.valid() || parts.tokenizer))
        continue;
      const auto t0 = std::chrono::steady_clock::now();
      ZI_TRY(load_part(src, part, be, parts, &*plan, options));
      ZI_INFO("%s loaded in %.3f s", part,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    return Status::Ok();
  }();
  if (warmer.joinable()) warmer.join();
  ZI_TRY(take_tokenizer());  // its error first, whatever else failed
  ZI_TRY(loaded);
  // Uploads may still be in flight (the CUDA backend's DMA is asynchronous): wait for them, so
  // the time below is the real load time, and free the upload staging memory.
  if (Status s = be.finish_uploads(); !s.ok()) return s.with_context("loading " + what);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (prepared.prefetch) {
    const FilePrefetcher::Stats ps = prepared.prefetch->stats();
    prepared.prefetch.reset();  // stops at its current chunk
    ZI_INFO(
        "prefetch: %.2f GB read ahead, %.2f GB found in the page cache; the load waited for it "
        "%llu times, %.2f s in all",
        static_cast<double>(ps.read_bytes) / 1e9, static_cast<double>(ps.cached_bytes) / 1e9,
        static_cast<unsigned long long>(ps.gate_waits), ps.gate_wait_seconds);
  }
  ZI_INFO("loaded %s on %s in %.2f s (+ %.2f s opening)", what.c_str(), be.name().c_str(), seconds,
          prepared.seconds);
  if (options.vram_budget != 0) parts.transformer->set_max_graphs(1);
  ZI_ASSIGN_OR_RETURN(auto pipeline, create(std::move(parts), be));
  pipeline->paths_ = paths;
  pipeline->plan_ = std::move(*plan);
  return pipeline;
}

Result<std::unique_ptr<VaeEncoder>> load_vae_encoder(const std::string& model_dir, Backend& be) {
  ModelPaths paths;
  paths.model_dir = model_dir;
  return load_vae_encoder(paths, be);
}

Result<std::unique_ptr<VaeEncoder>> load_vae_encoder(const ModelPaths& paths, Backend& be) {
  const auto start = std::chrono::steady_clock::now();
  auto src = ModelSource::open(paths);
  if (!src.ok()) return src.status().with_context("loading vae encoder");
  auto ws = src->open_weights(Component::kVae);
  if (!ws.ok()) return ws.status().with_context("loading vae encoder");
  ZI_ASSIGN_OR_RETURN(std::unique_ptr<VaeEncoder> enc,
                      VaeEncoder::load(src->configs().vae, *ws, be));
  if (Status s = be.finish_uploads(); !s.ok()) return s.with_context("loading vae encoder");
  ZI_INFO("loaded the vae encoder in %.2f s",
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return enc;
}

std::vector<Status> TextToImage::check_folder(const std::string& model_dir) {
  ModelPaths paths;
  paths.model_dir = model_dir;
  return check(paths);
}

std::vector<Status> TextToImage::check(const ModelPaths& paths) {
  auto src = ModelSource::open(paths);
  if (!src.ok()) return {src.status()};
  std::unique_ptr<Backend> be = make_check_backend();
  TextToImageComponents parts;
  parts.scheduler = src->configs().scheduler;
  std::vector<Status> errors;
  for (const char* part : kParts) {
    Status st = load_part(*src, part, *be, parts);
    if (!st.ok()) errors.push_back(std::move(st));
  }
  if (errors.empty()) {  // the cross-component checks load() makes last
    auto pipeline = create(std::move(parts), *be);
    if (!pipeline.ok()) errors.push_back(pipeline.status());
  }
  return errors;
}

std::vector<Status> TextToImage::check_file(const std::string& path) {
  auto ws = WeightStore::open(path);
  if (!ws.ok()) return {ws.status()};
  const SingleFileLayout layout = detect_single_file(ws->names());
  if (layout.count() == 0)
    return {NotFound(path + ": holds no Z-Image transformer, text encoder or VAE tensors")};
  std::unique_ptr<Backend> be = make_check_backend();
  std::vector<Status> errors;
  for (Component c : {Component::kTransformer, Component::kTextEncoder, Component::kVae}) {
    if (!layout.part(c).present) continue;
    auto cw = open_component_file(path, c);
    if (!cw.ok()) {
      errors.push_back(cw.status());
      continue;
    }
    const TensorShapes shapes = tensor_shapes(cw->store);
    Status st;
    if (c == Component::kTransformer) {
      auto cfg = infer_transformer_config(shapes, path);
      st = cfg.ok() ? ZImageDiT::load(*cfg, cw->store, *be).status() : cfg.status();
    } else if (c == Component::kTextEncoder) {
      auto cfg = infer_text_encoder_config(shapes, path);
      st = cfg.ok() ? Qwen3Encoder::load(*cfg, cw->store, *be).status() : cfg.status();
    } else {
      auto cfg = infer_vae_config(shapes, path);
      st = cfg.ok() ? VaeDecoder::load(*cfg, cw->store, *be).status() : cfg.status();
    }
    if (!st.ok()) errors.push_back(std::move(st));
  }
  return errors;
}

Backend::WarmUpHints TextToImage::warm_up_hints(const ZImageConfigs& configs,
                                                const PipelineLoadOptions& o) {
  Backend::WarmUpHints h;
  const TextEncoderConfig& ec = configs.text_encoder;
  const int64_t hd = ec.hidden_size, ff = ec.intermediate_size;
  const int64_t q = int64_t{ec.num_attention_heads} * ec.head_dim;
  const int64_t kv = int64_t{ec.num_key_value_heads} * ec.head_dim;
  // A prompt's length is not known at load: the usual ones (cuBLASLt picks by ranges of M).
  for (const int64_t m : {16, 32, 48, 64, 128}) {
    h.linears.push_back({m, q + 2 * kv, hd});
    h.linears.push_back({m, hd, q});
    h.linears.push_back({m, 2 * ff, hd});
    h.linears.push_back({m, hd, ff});
  }
  const TransformerConfig& tc = configs.transformer;
  const int64_t d = tc.dim, f = tc.ffn_hidden();
  const int64_t fac = int64_t{configs.vae.spatial_factor()} * tc.patch_size;
  auto up = [](int64_t n) {
    return (n + ZImageDiT::kSeqMultiple - 1) / ZImageDiT::kSeqMultiple * ZImageDiT::kSeqMultiple;
  };
  const int64_t img = up((o.plan_height / fac) * (o.plan_width / fac));
  const int64_t cap = 64;  // a prompt of 33-64 tokens
  for (const int64_t m : {img + cap, img, cap}) {
    h.linears.push_back({m, 3 * d, d});
    h.linears.push_back({m, d, d});
    h.linears.push_back({m, 2 * f, d});
    h.linears.push_back({m, d, f});
  }
  h.linears.push_back({1, 4 * d, tc.adaln_dim()});
  // The decode's feature maps: the latent's size, doubled by each up block's upsampler.
  const int64_t sf = configs.vae.spatial_factor();
  for (int64_t s = 1; s <= sf; s *= 2) {
    for (const int64_t n : {int64_t{1}, int64_t{o.plan_batch}}) {
      const std::array<int64_t, 3> in{n, o.plan_height / sf * s, o.plan_width / sf * s};
      if (std::find(h.conv_inputs.begin(), h.conv_inputs.end(), in) == h.conv_inputs.end())
        h.conv_inputs.push_back(in);
    }
  }
  return h;
}

// The planner's inputs: weight sizes from the configs, activations for the largest planned
// request, the device memory the context and libraries hold from the driver's view.
MemoryPlanInput TextToImage::plan_input(const ZImageConfigs& configs, DType act,
                                        const PipelineLoadOptions& o, uint64_t vae_params,
                                        uint64_t fixed) {
  const TransformerConfig& tc = configs.transformer;
  const TextEncoderConfig& ec = configs.text_encoder;
  const uint64_t es = dtype_size(act);
  MemoryPlanInput in;
  in.budget = o.vram_budget;
  in.host_pinned_limit = o.host_pinned_limit;
  in.pin_copies = o.pin_host_copies;
  // Streamed from the files unless the loader turns the linears into FP8 rows on the device
  // (then they are copies). Files in another dtype than `act` (FP8 or GGUF files, bf16 files on
  // an f32 GPU) stream copies too: the plan's host figures assume the usual bf16 folder.
  in.dit_from_files =
      o.stream_from_files && !o.fp8_weights && (o.dit_fp8_compute & kFp8AllLinears) == 0;
  in.te_from_files = o.stream_from_files && !o.fp8_weights;
  in.lock_files = o.lock_files;
  in.fixed = fixed;
  const int64_t d = tc.dim, ad = tc.adaln_dim(), tf = tc.token_features(), fc = tc.cap_feat_dim;
  in.dit_blocks = 2 * tc.n_refiner_layers + tc.n_layers;
  // W8A8 on every big linear of every block stores them as FP8 rows too; a partial choice is
  // planned as bf16 (an over-estimate).
  const bool dit_fp8 = o.fp8_weights || (o.dit_fp8_compute & kFp8Default) == kFp8Default;
  in.dit_block_bytes = static_cast<uint64_t>(ZImageDiT::block_weight_bytes(tc, act, dit_fp8));
  in.dit_other_bytes = static_cast<uint64_t>(1024 * 256 + 1024 + ad * 1024 + ad + d * tf + d + fc +
                                             d * fc + d + 64 * d + d * ad + d + tf * d + tf + d) *
                       es;
  in.te_layers = ec.num_hidden_layers - 1;
  in.te_layer_bytes =
      static_cast<uint64_t>(Qwen3Encoder::layer_weight_bytes(ec, act, o.fp8_weights));
  // The embedding table stays in host memory on a GPU (Qwen3Encoder::load): no device bytes.
  in.te_embed_bytes = 0;
  in.te_other_bytes = static_cast<uint64_t>(ec.hidden_size) * es;
  in.vae_bytes = vae_params * es;
  if (o.fp8_weights)
    in.fp8_scratch_bytes =
        static_cast<uint64_t>(
            std::max<int64_t>(2 * tc.ffn_hidden() * d, 2 * ec.intermediate_size * ec.hidden_size)) *
        es;
  // Activations (bytes per row of the widest phase buffers, plus a quarter for attention
  // workspaces and temporaries).
  const int64_t f = tc.ffn_hidden(), b = std::max(1, o.plan_batch);
  const int64_t fac = configs.vae.spatial_factor() * tc.patch_size;
  const int64_t img_tokens = (o.plan_height / fac) * (o.plan_width / fac);
  const int64_t dit_rows = b * (img_tokens + 512 + 64);
  // FP8 attention (sdpa) adds its e4m3 copy of q|k|v: 3d bytes a row.
  const int64_t fp8_qkv = (o.dit_fp8_compute & kFp8Sdpa) ? 3 * d : 0;
  // W8A8 linears take their inputs as FP8 rows (ZImageDiT's scratch): F bytes and a scale a row.
  const int64_t fp8_rows = (o.dit_fp8_compute & (kFp8Qkv | kFp8W13 | kFp8W2)) ? f + 4 : 0;
  in.dit_activation_bytes =
      static_cast<uint64_t>(dit_rows * ((12 * d + 3 * f) * es + fp8_qkv + fp8_rows) * 5 / 4);
  const int64_t hd = ec.hidden_size, ff = ec.intermediate_size;
  const int64_t q = ec.num_attention_heads * ec.head_dim, kv = ec.num_key_value_heads * ec.head_dim;
  in.te_activation_bytes =
      static_cast<uint64_t>(b * 512 * (4 * hd + 3 * q + 3 * kv + 3 * ff) * es * 5 / 4);
  // The VAE as VaeDecoder estimates it: the untiled decode of the planned request, and the tiled
  // decode's one tile of one image (model/vae/vae_tiling.h: tiles of the config's sample_size, only
  // for a latent larger than a tile; otherwise tiling saves nothing).
  const VaeConfig& vc = configs.vae;
  const int64_t lh = o.plan_height / vc.spatial_factor(), lw = o.plan_width / vc.spatial_factor();
  in.vae_activation_bytes = VaeDecoder::estimate_decode_bytes(vc, act, b, lh, lw);
  const VaeTileGeometry g = vae_tile_geometry(vc);
  in.vae_tiled_activation_bytes =
      vae_tiling_applies(g, lh, lw) && check_vae_tiling(g, lh, lw).ok()
          ? VaeDecoder::estimate_decode_bytes(vc, act, 1, std::min(g.latent, lh),
                                              std::min(g.latent, lw))
          : in.vae_activation_bytes;
  return in;
}

}  // namespace zimage
