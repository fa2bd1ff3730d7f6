// Where a pipeline's parts come from: a diffusers model folder, single files that replace some of
// its components (`--dit`, `--text-encoder`, `--vae`), or only single files plus a tokenizer.
// Why: the loaders need, per component, a config and a WeightStore; this is the one place that
// decides both, so `generate`, `serve` and `info` agree.
//
// Config of a component given as a file: inferred from its tensor shapes (io/model/infer_config.h).
// When a model folder is given too and its config for that component describes the same shapes,
// the folder's config is used as is (it also carries the values a file cannot, e.g. axes_dims);
// otherwise the inferred one, with the published values for the rest. The scheduler is the
// folder's, else the published one; the tokenizer is `tokenizer_dir` when given, else the
// folder's.
#pragma once

#include <map>
#include <string>

#include "core/status.h"
#include "io/model/model_config.h"
#include "io/model/model_folder.h"
#include "io/weights/scaled_fp8.h"
#include "io/weights/single_file.h"
#include "io/weights/weights.h"

namespace zimage {

struct ModelPaths {
  std::string model_dir;         // diffusers folder; may be empty when the three files are given
  std::string transformer_file;  // each overrides that component of model_dir
  std::string text_encoder_file;
  std::string vae_file;
  std::string tokenizer_dir;  // a folder with tokenizer.json; overrides model_dir/tokenizer
  // "DIR" for a plain folder, else "DIR + dit FILE + ..." (for logs and messages).
  std::string describe() const;
};

class ModelSource {
 public:
  // Validates the paths and every config (folder configs parsed, file configs inferred), cross-
  // checks the components. No weight is read beyond the few FP8 scales.
  static Result<ModelSource> open(const ModelPaths& paths);

  const ModelPaths& paths() const { return paths_; }
  const ZImageConfigs& configs() const { return configs_; }
  const std::string& tokenizer_dir() const { return tokenizer_dir_; }
  // The file a component comes from ("" = the model folder).
  const std::string& file(Component c) const;
  // How its config was obtained: "config.json", "inferred from the tensor shapes", "model
  // folder config (same shapes)".
  const std::string& config_origin(Component c) const;
  // FP8 content of a file component (empty for folder components).
  const Fp8Summary& fp8(Component c) const;

  // The store a component's loader binds: the folder's component folder, or the file's
  // component (prefix removed, scaled FP8 dequantised on demand). Each call opens it afresh.
  Result<WeightStore> open_weights(Component c) const;
  // As above by name ("transformer", "text_encoder", "vae"); InvalidArgument otherwise.
  Result<WeightStore> open_weights(const std::string& component) const;
  // The store with what stands behind it: for a file component its prefix, FP8 summary and the
  // FP8 bytes + scales of every dequantised weight (ScaledFp8Index), for a per-layer FP8 weight
  // path; for a folder component an empty index.
  Result<ComponentWeights> open_component(Component c) const;

 private:
  struct Part {
    std::string file;
    std::string config_origin = "config.json";
    Fp8Summary fp8;
  };
  const Part& part(Component c) const { return parts_.at(static_cast<int>(c)); }

  ModelPaths paths_;
  std::string folder_dir_;  // the model folder as ModelFolder normalised it ("" without one)
  ZImageConfigs configs_;
  std::string tokenizer_dir_;
  std::map<int, Part> parts_;
};

}  // namespace zimage
