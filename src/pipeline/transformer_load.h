// The transformer on its own, for the drop-in transformer (include/zimage/transformer.h): where
// its config and weights come from, and the load the pipeline itself runs (LoRAs merged as the
// weights are read, FP8 weight storage or W8A8 compute as options say). One loader for both, so
// the drop-in and `zimage generate` cannot load the same files differently.
#pragma once

#include <memory>
#include <string>

#include "backend/backend.h"
#include "core/status.h"
#include "io/model/model_config.h"
#include "io/weights/weights.h"
#include "model/common/linear.h"
#include "model/dit/zimage_dit.h"
#include "pipeline/text_to_image.h"

namespace zimage {

struct TransformerSource {
  TransformerConfig config;
  WeightStore weights =
      WeightStore::empty("");  // diffusers or ComfyUI names, prefix removed, scaled FP8 made plain
  // "DIR/transformer (config.json)", "FILE (config inferred from the tensor shapes)"
  std::string description;
};

// `path`: a diffusers model folder (its transformer/ is used, the other components are not
// read), a transformer folder (config.json and diffusion_pytorch_model*.safetensors), or a single
// file holding a transformer (.safetensors in diffusers, ComfyUI or original names, plain or
// scaled FP8, all-in-one checkpoints; .gguf), whose config is inferred from the tensor shapes
// (io/model/infer_config.h). Errors name the path and what it lacks.
Result<TransformerSource> open_transformer_source(const std::string& path);

// Loads the transformer of `ws` (config `cfg`) onto `be` as TextToImage::load does: the LoRAs of
// `options` merged into the targeted weights as they are read, then ZImageDiT::load with
// `placement`. Errors carry "loading transformer: " where the DiT loader does not name itself.
Result<std::unique_ptr<ZImageDiT>> load_transformer(const TransformerConfig& cfg, WeightStore& ws,
                                                    Backend& be, const WeightPlacement& placement,
                                                    const PipelineLoadOptions& options);

}  // namespace zimage
