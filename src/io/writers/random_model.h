// A complete Z-Image model folder in the published diffusers layout, filled with random weights of
// realistic scale. The real 20.5 GB checkpoint cannot be downloaded where zimage is developed, so
// speed is measured (and zimage is compared with diffusers at full size) on such a folder: both
// stacks load the same files, so the load path, the tensor names and the numerics are exercised
// exactly as with the real model. Values come from a counter-based generator, so a folder is
// reproducible from its seed and written in parallel without holding a whole shard in memory.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "io/model/model_config.h"

namespace zimage {

// How a tensor's random values are drawn.
enum class InitKind {
  kFanIn,  // N(0, 1/fan_in), fan_in = product of all dims but the first (linear and conv weights)
  kNormGain,  // 1 + 0.1·N(0, 1) (RMSNorm / GroupNorm / LayerNorm weights)
  kBias,      // 0.02·N(0, 1)
  kUnit,      // N(0, 1) (learned pad tokens)
  kEmbed,     // 0.05·N(0, 1) (token embeddings)
};

struct TensorSpec {
  std::string name;  // diffusers / transformers name
  Shape shape;
  InitKind init = InitKind::kFanIn;
  // Outlier input channels (RandomModelOptions::outlier_fraction) apply to this 2-D weight.
  bool outlier_columns = false;
};

// Every tensor of each component as diffusers / transformers save it (shapes in PyTorch order).
std::vector<TensorSpec> dit_tensor_specs(const TransformerConfig& c);
std::vector<TensorSpec> qwen3_tensor_specs(const TextEncoderConfig& c);
std::vector<TensorSpec> vae_tensor_specs(const VaeConfig& c);
// The tensors of one DiT block under `prefix` ("layers.3."): attention, norms, feed-forward and,
// when `modulated`, adaLN_modulation.0 (also the layout of a ControlNet's control blocks).
void append_dit_block_specs(std::vector<TensorSpec>& v, const TransformerConfig& c,
                            const std::string& prefix, bool modulated);

struct RandomModelOptions {
  TransformerConfig dit;
  TextEncoderConfig text_encoder;
  VaeConfig vae;
  float scheduler_shift = 3.0f;
  DType dtype = DType::kBF16;  // stored dtype of every tensor
  uint64_t seed = 0;
  uint64_t max_shard_bytes = 5'000'000'000ull;  // split a component into shards past this size
  std::string tokenizer_dir;  // copied into <dir>/tokenizer/ (tokenizer.json etc.)
  int threads = 0;            // 0 = hardware concurrency
  // Outlier channels, as trained transformers show and plain Gaussian weights lack (they flatter
  // quantisation): in the DiT blocks' linear weights (attention q/k/v/out, feed-forward w1/w2/w3)
  // the input channels (columns) picked with probability `outlier_fraction` are multiplied by
  // `outlier_scale`. A channel is picked by its index and the seed alone, so every weight with
  // the same input width shares the same outlier channels. 0 = none.
  double outlier_fraction = 0.0;
  float outlier_scale = 30.0f;
};

// Whether input channel `column` is an outlier channel for (seed, fraction).
bool is_outlier_channel(uint64_t seed, int64_t column, double fraction);

// Fills `out` (n floats) with the values tensor `spec` gets at element offset `offset`.
void random_tensor_values(const TensorSpec& spec, uint64_t seed, uint64_t offset, float* out,
                          size_t n);

// Writes `specs` (random values from options.seed, stored as options.dtype) under `dir` as
// <stem>.safetensors, or as numbered shards plus `index_name` past options.max_shard_bytes. The
// values are generated and written a chunk at a time: memory stays small for any size.
Status write_random_tensors(const std::string& dir, const std::string& stem,
                            const std::string& index_name, const std::vector<TensorSpec>& specs,
                            const RandomModelOptions& options,
                            const std::function<void(const std::string&)>& progress = {});

// Writes model_index.json, the component configs, the tokenizer and the weights (sharded with an
// index.json where a component exceeds max_shard_bytes) under `dir`, which must not exist or be
// empty. `progress` (optional) gets one line per file written.
Status write_random_model(const std::string& dir, const RandomModelOptions& options,
                          const std::function<void(const std::string&)>& progress = {});

}  // namespace zimage
