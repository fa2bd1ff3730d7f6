// A Z-Image model in the diffusers folder layout (model_index.json, transformer/, text_encoder/,
// vae/, scheduler/, tokenizer/): its configs parsed into the typed structs of io/model/model_config.h
// and validated before any weight is touched, so a bad folder fails in milliseconds with the file
// and key named instead of deep inside a model loader.
//
// Rule for absent keys: a key that decides a tensor shape (dim, n_layers, hidden_size, ...) is
// required; other hyperparameters take the defaults of the upstream class (diffusers /
// transformers), as from_pretrained would. Values that are present are checked for type and
// range; features the engine does not implement (karras sigmas, shift_terminal, rope scaling,
// several patch sizes, ...) are Unsupported errors rather than silently ignored.
#pragma once

#include <string>
#include <string_view>

#include "core/status.h"
#include "io/model/model_config.h"
#include "io/weights/weights.h"

namespace zimage {

// Each parser takes the file's text and the name to use in messages; each validates its result.
Result<TransformerConfig> parse_transformer_config(std::string_view json, const std::string& file);
Result<TextEncoderConfig> parse_text_encoder_config(std::string_view json, const std::string& file);
Result<VaeConfig> parse_vae_config(std::string_view json, const std::string& file);
Result<SchedulerConfig> parse_scheduler_config(std::string_view json, const std::string& file);
// model_index.json: ZImagePipeline with the expected component classes.
Status check_model_index(std::string_view json, const std::string& file);

// Consistency checks on already-typed configs (also used for configs built in code).
Status validate_transformer_config(const TransformerConfig& c, const std::string& file);
Status validate_text_encoder_config(const TextEncoderConfig& c, const std::string& file);
Status validate_vae_config(const VaeConfig& c, const std::string& file);
Status validate_scheduler_config(const SchedulerConfig& c, const std::string& file);

struct ZImageConfigs {
  TransformerConfig transformer;
  TextEncoderConfig text_encoder;
  VaeConfig vae;
  SchedulerConfig scheduler;
};

// Cross-component checks: the DiT's cap_feat_dim is the text encoder's hidden size, its
// in_channels the VAE's latent channels. `where` prefixes messages.
Status validate_configs(const ZImageConfigs& c, const std::string& where);

// The published Tongyi-MAI/Z-Image-Turbo configs (model spec §2): for benchmarks that run the
// full-size architecture with random weights.
ZImageConfigs zimage_turbo_reference_configs();

class ModelFolder {
 public:
  // Reads and validates model_index.json and every component config. The tokenizer folder must
  // hold tokenizer.json. Weights are not opened here (see open_weights).
  static Result<ModelFolder> open(const std::string& dir);

  const std::string& dir() const { return dir_; }
  const ZImageConfigs& configs() const { return configs_; }
  const TransformerConfig& transformer() const { return configs_.transformer; }
  const TextEncoderConfig& text_encoder() const { return configs_.text_encoder; }
  const VaeConfig& vae() const { return configs_.vae; }
  const SchedulerConfig& scheduler() const { return configs_.scheduler; }
  const std::string& tokenizer_dir() const { return tokenizer_dir_; }
  // "<dir>/<component>"
  std::string component_dir(const std::string& component) const;

  // Weights of "transformer", "text_encoder" or "vae"; anything else is InvalidArgument.
  Result<WeightStore> open_weights(const std::string& component) const;

 private:
  std::string dir_;
  std::string tokenizer_dir_;
  ZImageConfigs configs_;
};

}  // namespace zimage
