// The Qwen3 text encoder (spec §3): token ids -> hidden_states[-2], i.e. the raw output of
// decoder layer num_hidden_layers-2, on the real tokens of each prompt. Only the layers that
// output depends on are loaded and run; the last layer and the final norm are skipped.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "core/status.h"
#include "io/model_config.h"
#include "io/weights.h"
#include "model/debug.h"

namespace zimage {

class Qwen3Encoder {
 public:
  // Validates `cfg`, fetches every needed tensor with its expected shape (names with or without
  // a leading "model."), fuses q|k|v and gate|up, uploads to `be`. Tensors of the skipped last
  // layer, the final norm and an lm_head are accepted and ignored; anything else unused is an
  // error naming it.
  static Result<std::unique_ptr<Qwen3Encoder>> load(const TextEncoderConfig& cfg,
                                                    const WeightStore& ws, Backend& be);

  // For each prompt, hidden_states[-2] on its real tokens: [L_i, hidden_size] in the backend's
  // act dtype, on the backend. Prompts of different lengths run as one right-padded batch
  // (causal + key-length masking, positions 0..L_i-1). Intermediates: "te.layer<k>"
  // [B, S, hidden] and "te.hidden_states.<i>" [L_i, hidden].
  Result<std::vector<Tensor>> encode(const std::vector<std::vector<int32_t>>& ids,
                                     DebugSink* dbg = nullptr);

  const TextEncoderConfig& config() const { return cfg_; }
  // Number of decoder layers actually run (num_hidden_layers - 1).
  int layers_run() const { return static_cast<int>(layers_.size()); }

 private:
  struct Layer {
    Tensor input_norm;  // [hidden]
    Tensor wqkv;        // [(Hq + 2 Hkv) * Dh, hidden]: q rows, then k, then v
    Tensor q_norm;      // [Dh]
    Tensor k_norm;      // [Dh]
    Tensor wo;          // [hidden, Hq * Dh]
    Tensor post_norm;   // [hidden]
    Tensor wgu;         // [2 * inter, hidden]: gate rows, then up
    Tensor wdown;       // [hidden, inter]
  };

  Qwen3Encoder(const TextEncoderConfig& cfg, Backend& be) : cfg_(cfg), be_(be) {}
  Status load_weights(const WeightStore& ws);
  // cos/sin tables [S, Dh] (f32, on the backend) for positions 0..S-1.
  Status rope_tables(int64_t seq, Tensor& cos, Tensor& sin) const;

  TextEncoderConfig cfg_;
  Backend& be_;
  Tensor embed_;  // [vocab, hidden]
  std::vector<Layer> layers_;
  std::vector<float> inv_freq_;  // [Dh / 2], float32 as in transformers
};

}  // namespace zimage
