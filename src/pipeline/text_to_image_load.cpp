// Loading the text-to-image pipeline from a diffusers folder: configs first (io/model_folder.h
// validates them before any weight is read), then each component onto the backend. Kept apart
// from the loop in text_to_image.cpp because it is the only part that touches the file system.
#include <chrono>
#include <utility>

#include "core/log.h"
#include "io/model_folder.h"
#include "pipeline/text_to_image.h"

namespace zimage {

Result<std::unique_ptr<TextToImage>> TextToImage::load(const std::string& model_dir, Backend& be) {
  const auto start = std::chrono::steady_clock::now();
  ZI_ASSIGN_OR_RETURN(ModelFolder folder, ModelFolder::open(model_dir));
  TextToImageComponents parts;
  parts.scheduler = folder.scheduler();
  {
    auto tok = Tokenizer::load(folder.tokenizer_dir());
    if (!tok.ok()) return tok.status().with_context("loading tokenizer");
    parts.tokenizer = std::make_unique<Tokenizer>(std::move(tok).value());
  }
  {
    auto ws = folder.open_weights("text_encoder");
    if (!ws.ok()) return ws.status().with_context("loading text_encoder");
    auto te = Qwen3Encoder::load(folder.text_encoder(), ws.value(), be);
    if (!te.ok()) return te.status();  // already says "loading text encoder"
    parts.text_encoder = std::move(te).value();
  }
  {
    auto ws = folder.open_weights("transformer");
    if (!ws.ok()) return ws.status().with_context("loading transformer");
    auto dit = ZImageDiT::load(folder.transformer(), ws.value(), be);
    if (!dit.ok()) return dit.status();  // already says "loading transformer"
    parts.transformer = std::move(dit).value();
  }
  {
    auto ws = folder.open_weights("vae");
    if (!ws.ok()) return ws.status().with_context("loading vae");
    auto vae = VaeDecoder::load(folder.vae(), ws.value(), be);
    if (!vae.ok()) return vae.status();  // already says "loading vae decoder"
    parts.vae = std::move(vae).value();
  }
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

}  // namespace zimage
