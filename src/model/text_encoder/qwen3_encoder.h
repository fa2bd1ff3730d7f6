// The Qwen3 text encoder (spec §3): token ids -> hidden_states[-2], i.e. the raw output of
// decoder layer num_hidden_layers-2, on the real tokens of each prompt. Only the layers that
// output depends on are loaded and run; the last layer and the final norm are skipped.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "core/status.h"
#include "io/model/model_config.h"
#include "io/weights/weights.h"
#include "model/common/debug.h"
#include "model/common/linear.h"
#include "model/common/quantized_linear.h"
#include "model/common/weight_streamer.h"

namespace zimage {

class Qwen3Encoder {
 public:
  // Validates `cfg`, fetches every needed tensor with its expected shape (names with or without
  // a leading "model."), fuses q|k|v and gate|up, uploads to `be`. Tensors of the skipped last
  // layer, the final norm and an lm_head are accepted and ignored; anything else unused is an
  // error naming it.
  // `placement` (memory planner): FP8 weight storage, and which layers stay in host memory and
  // stream in. On a GPU backend the embedding table always stays in host memory: its rows are
  // gathered on the host.
  static Result<std::unique_ptr<Qwen3Encoder>> load(const TextEncoderConfig& cfg,
                                                    const WeightStore& ws, Backend& be,
                                                    const WeightPlacement& placement = {});
  // Device bytes of one layer's weights, and of the embedding table.
  static int64_t layer_weight_bytes(const TextEncoderConfig& cfg, DType act, bool fp8_weights);
  // As layer_weight_bytes, for the weights as `ws` stores them (kept-quantised linears at their
  // stored size; model/common/quantized_linear.h); the largest layer.
  static int64_t stored_layer_weight_bytes(const TextEncoderConfig& cfg, const WeightStore& ws,
                                           DType act, const WeightPlacement& placement);
  const KeptQuantStats& kept_quantized() const { return kept_; }
  uint64_t streamed_bytes_per_forward() const { return streamer_ ? streamer_->stream_bytes() : 0; }
  uint64_t streaming_slot_bytes() const { return streamer_ ? streamer_->slot_bytes() : 0; }
  // Streamed units read from the weight files at each stream, of streamed_units() (the rest from
  // host copies made at load).
  int streamed_units() const { return streamer_ ? streamer_->units() : 0; }
  int streamed_units_from_files() const { return streamer_ ? streamer_->units_from_files() : 0; }

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
    Tensor input_norm;   // [hidden]
    LinearWeight wqkv;   // [(Hq + 2 Hkv) * Dh, hidden]: q rows, then k, then v
    Tensor q_norm;       // [Dh]
    Tensor k_norm;       // [Dh]
    LinearWeight wo;     // [hidden, Hq * Dh]
    Tensor post_norm;    // [hidden]
    LinearWeight wgu;    // [2 * inter, hidden]: gate rows, then up
    LinearWeight wdown;  // [hidden, inter]
    std::vector<Tensor*> tensors() {
      return {&input_norm, &wqkv.w,    &wqkv.scale, &q_norm,    &k_norm,  &wo.w,
              &wo.scale,   &post_norm, &wgu.w,      &wgu.scale, &wdown.w, &wdown.scale};
    }
  };

  Qwen3Encoder(const TextEncoderConfig& cfg, Backend& be) : cfg_(cfg), be_(be) {}
  Status load_weights(const WeightStore& ws);
  Status place_layer(Layer& l, int index);
  Status apply_placement();
  // cos/sin tables [S, Dh] (f32, on the backend) for positions 0..S-1.
  Status rope_tables(int64_t seq, Tensor& cos, Tensor& sin) const;

  TextEncoderConfig cfg_;
  Backend& be_;
  Tensor embed_;  // [vocab, hidden]
  std::vector<Layer> layers_;
  WeightPlacement placement_;
  std::vector<int> unit_of_layer_;  // -1 = resident
  std::unique_ptr<WeightStreamer> streamer_;
  // While loading: per streamed layer, its tensors' host side in Layer::tensors() order (views of
  // the weight files, or the host copies place_layer made); handed to the streamer.
  std::vector<std::vector<StreamSource>> layer_sources_;
  Tensor wide_scratch_;          // FP8 weights are widened here before their GEMM
  KeptQuantStats kept_;          // linears kept quantised as the file stores them
  std::vector<float> inv_freq_;  // [Dh / 2], float32 as in transformers
};

}  // namespace zimage
