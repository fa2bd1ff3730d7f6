// Loading the text-to-image pipeline from a diffusers folder and/or single files
// (io/model_source.h): configs first (parsed or inferred and validated before any weight is read),
// then each component onto the backend. Kept apart from the loop in text_to_image.cpp because it is
// the only part that touches the file system.
//
// check_folder() runs the same code against the check-only backend (backend/check), which binds
// every weight without holding it: `zimage info` then reports exactly what `generate` would reject,
// and there is no second list of expected tensors that could drift from the loaders.
#include <chrono>
#include <utility>

#include "backend/check/check_backend.h"
#include "core/log.h"
#include "io/infer_config.h"
#include "io/model_folder.h"
#include "io/model_source.h"
#include "io/single_file.h"
#include "pipeline/text_to_image.h"

namespace zimage {

namespace {

// The components in the order load() binds them (its first error is the one reported).
constexpr const char* kParts[] = {"tokenizer", "text_encoder", "transformer", "vae"};

// Loads one component of `src` onto `be` into `parts`; errors carry "loading <part>: ".
Status load_part(const ModelSource& src, const std::string& part, Backend& be,
                 TextToImageComponents& parts) {
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
  if (part == "text_encoder") {
    // The loaders name themselves ("loading text encoder: ..."): no second prefix.
    auto te = Qwen3Encoder::load(cfg.text_encoder, ws.value(), be);
    if (!te.ok()) return te.status();
    parts.text_encoder = std::move(te).value();
  } else if (part == "transformer") {
    auto dit = ZImageDiT::load(cfg.transformer, ws.value(), be);
    if (!dit.ok()) return dit.status();
    parts.transformer = std::move(dit).value();
  } else {
    auto vae = VaeDecoder::load(cfg.vae, ws.value(), be);
    if (!vae.ok()) return vae.status();
    parts.vae = std::move(vae).value();
  }
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<TextToImage>> TextToImage::load(const std::string& model_dir, Backend& be) {
  ModelPaths paths;
  paths.model_dir = model_dir;
  return load(paths, be);
}

Result<std::unique_ptr<TextToImage>> TextToImage::load(const ModelPaths& paths, Backend& be) {
  const auto start = std::chrono::steady_clock::now();
  const std::string what = paths.describe();
  ZI_ASSIGN_OR_RETURN(ModelSource src, ModelSource::open(paths));
  for (Component c : {Component::kTransformer, Component::kTextEncoder, Component::kVae}) {
    if (src.file(c).empty()) continue;
    const std::string fp8 = src.fp8(c).describe();
    ZI_INFO("%s from %s: config %s%s%s", component_name(c), src.file(c).c_str(),
            src.config_origin(c).c_str(), fp8.empty() ? "" : "; ", fp8.c_str());
  }
  TextToImageComponents parts;
  parts.scheduler = src.configs().scheduler;
  for (const char* part : kParts) ZI_TRY(load_part(src, part, be, parts));
  // Uploads may still be in flight (the CUDA backend's DMA is asynchronous): wait for them, so
  // the time below is the real load time, and free the upload staging memory.
  if (Status s = be.finish_uploads(); !s.ok()) return s.with_context("loading " + what);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ZI_INFO("loaded %s on %s in %.2f s", what.c_str(), be.name().c_str(), seconds);
  ZI_ASSIGN_OR_RETURN(auto pipeline, create(std::move(parts), be));
  pipeline->paths_ = paths;
  return pipeline;
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

}  // namespace zimage
