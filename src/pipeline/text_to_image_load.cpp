// Loading the text-to-image pipeline from a diffusers folder: configs first (io/model_folder.h
// validates them before any weight is read), then each component onto the backend. Kept apart
// from the loop in text_to_image.cpp because it is the only part that touches the file system.
//
// check_folder() runs the same code against the check-only backend (backend/check), which binds
// every weight without holding it: `zimage info` then reports exactly what `generate` would reject,
// and there is no second list of expected tensors that could drift from the loaders.
#include <chrono>
#include <utility>

#include "backend/check/check_backend.h"
#include "core/log.h"
#include "io/model_folder.h"
#include "model/lora_merge.h"
#include "pipeline/text_to_image.h"

namespace zimage {

namespace {

// The components in the order load() binds them (its first error is the one reported).
constexpr const char* kParts[] = {"tokenizer", "text_encoder", "transformer", "vae"};

// Loads one component of `folder` onto `be` into `parts`; errors carry "loading <part>: ".
Status load_part(const ModelFolder& folder, const std::string& part, Backend& be,
                 TextToImageComponents& parts, const TextToImageLoadOptions& options = {}) {
  const std::string what = "loading " + part;
  if (part == "tokenizer") {
    auto tok = Tokenizer::load(folder.tokenizer_dir());
    if (!tok.ok()) return tok.status().with_context(what);
    parts.tokenizer = std::make_unique<Tokenizer>(std::move(tok).value());
    return Status::Ok();
  }
  auto ws = folder.open_weights(part);
  if (!ws.ok()) return ws.status().with_context(what);
  if (part == "text_encoder") {
    // The loaders name themselves ("loading text encoder: ..."): no second prefix.
    auto te = Qwen3Encoder::load(folder.text_encoder(), ws.value(), be);
    if (!te.ok()) return te.status();
    parts.text_encoder = std::move(te).value();
  } else if (part == "transformer") {
    if (!options.loras.empty()) {  // the targeted tensors become W + LoRA, made as they are read
      Status st = merge_loras(ws.value(), options.loras, options.lora_lenient, options.threads);
      if (!st.ok()) return st.with_context(what);
    }
    auto dit = ZImageDiT::load(folder.transformer(), ws.value(), be);
    if (!dit.ok()) return dit.status();
    parts.transformer = std::move(dit).value();
  } else {
    auto vae = VaeDecoder::load(folder.vae(), ws.value(), be);
    if (!vae.ok()) return vae.status();
    parts.vae = std::move(vae).value();
  }
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<TextToImage>> TextToImage::load(const std::string& model_dir, Backend& be) {
  return load(model_dir, be, TextToImageLoadOptions{});
}

Result<std::unique_ptr<TextToImage>> TextToImage::load(const std::string& model_dir, Backend& be,
                                                       const TextToImageLoadOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  ZI_ASSIGN_OR_RETURN(ModelFolder folder, ModelFolder::open(model_dir));
  TextToImageComponents parts;
  parts.scheduler = folder.scheduler();
  for (const char* part : kParts) ZI_TRY(load_part(folder, part, be, parts, options));
  // Uploads may still be in flight (the CUDA backend's DMA is asynchronous): wait for them, so
  // the time below is the real load time, and free the upload staging memory.
  if (Status s = be.finish_uploads(); !s.ok()) return s.with_context("loading " + model_dir);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ZI_INFO("loaded %s on %s in %.2f s", model_dir.c_str(), be.name().c_str(), seconds);
  ZI_ASSIGN_OR_RETURN(auto pipeline, create(std::move(parts), be));
  pipeline->model_dir_ = model_dir;
  return pipeline;
}

std::vector<Status> TextToImage::check_folder(const std::string& model_dir) {
  auto folder = ModelFolder::open(model_dir);
  if (!folder.ok()) return {folder.status()};
  std::unique_ptr<Backend> be = make_check_backend();
  TextToImageComponents parts;
  parts.scheduler = folder->scheduler();
  std::vector<Status> errors;
  for (const char* part : kParts) {
    Status st = load_part(*folder, part, *be, parts);
    if (!st.ok()) errors.push_back(std::move(st));
  }
  if (errors.empty()) {  // the cross-component checks load() makes last
    auto pipeline = create(std::move(parts), *be);
    if (!pipeline.ok()) errors.push_back(pipeline.status());
  }
  return errors;
}

}  // namespace zimage
