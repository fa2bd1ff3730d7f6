// One component of Z-Image from a single .safetensors file, as people download them: ComfyUI's
// split files (`diffusion_models/z_image_turbo_*.safetensors`,
// `text_encoders/qwen_3_4b*.safetensors`, `vae/ae.safetensors`), the original release's names, and
// "all-in-one" checkpoints holding all three under ComfyUI's prefixes. Why a layer of its own: the
// model loaders accept the tensor names of every known layout, but they bind one component at a
// time and know nothing of prefixes, other components sharing the file, or scaled FP8
// (io/weights/scaled_fp8.h).
//
// Component prefixes recognised (first match wins; "" = the tensors sit at the top level):
//   transformer    "model.diffusion_model.", "diffusion_model.", ""   (marker:
//   cap_embedder.1.weight) text encoder   "text_encoders.qwen3_4b.transformer.",
//   "text_encoders.qwen3_4b.",
//                  "cond_stage_model.", ""            (marker: [model.]embed_tokens.weight)
//   VAE            "vae.", "first_stage_model.", ""   (marker: decoder.conv_in.weight)
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "io/weights/scaled_fp8.h"
#include "io/weights/weights.h"

namespace zimage {

enum class Component { kTransformer, kTextEncoder, kVae };
const char* component_name(Component c);  // "transformer", "text_encoder", "vae"

// Which components a file holds and under which prefix.
struct SingleFileLayout {
  struct Part {
    bool present = false;
    std::string prefix;
  };
  Part transformer, text_encoder, vae;
  const Part& part(Component c) const;
  int count() const { return transformer.present + text_encoder.present + vae.present; }
  std::string describe() const;  // "transformer (prefix 'model.diffusion_model.'), vae ('vae.')"
};
SingleFileLayout detect_single_file(const std::vector<std::string>& names);

// One component's weights, ready for its model loader.
struct ComponentWeights {
  WeightStore store;  // the component's tensors without the prefix; scaled FP8 made plain
  std::string prefix;
  Fp8Summary fp8;
  std::shared_ptr<const ScaledFp8Index> fp8_index;  // the FP8 bytes + scales behind `store`
};

// Opens `path` (a single .safetensors file, or a .gguf file: io/gguf/gguf_weights.h) and takes
// component `c` out of it: tensors of the other components the file holds are dropped, the
// prefix is removed, scaled FP8 weights are dequantised on demand. NotFound names the file and
// what it does hold when `c` is absent.
Result<ComponentWeights> open_component_file(const std::string& path, Component c);

}  // namespace zimage
