// Loading the text-to-image pipeline from a diffusers folder: configs first (io/model_folder.h
// validates them before any weight is read), then each component onto the backend. Kept apart
// from the loop in text_to_image.cpp because it is the only part that touches the file system.
#include <utility>

#include "core/log.h"
#include "io/model_folder.h"
#include "pipeline/text_to_image.h"

namespace zimage {

Result<std::unique_ptr<TextToImage>> TextToImage::load(const std::string& model_dir, Backend& be) {
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
    if (!te.ok()) return te.status().with_context("loading text_encoder");
    parts.text_encoder = std::move(te).value();
  }
  {
    auto ws = folder.open_weights("transformer");
    if (!ws.ok()) return ws.status().with_context("loading transformer");
    auto dit = ZImageDiT::load(folder.transformer(), ws.value(), be);
    if (!dit.ok()) return dit.status().with_context("loading transformer");
    parts.transformer = std::move(dit).value();
  }
  {
    auto ws = folder.open_weights("vae");
    if (!ws.ok()) return ws.status().with_context("loading vae");
    auto vae = VaeDecoder::load(folder.vae(), ws.value(), be);
    if (!vae.ok()) return vae.status().with_context("loading vae");
    parts.vae = std::move(vae).value();
  }
  ZI_INFO("loaded %s on %s", model_dir.c_str(), be.name().c_str());
  return create(std::move(parts), be);
}

}  // namespace zimage
