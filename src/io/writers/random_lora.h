// A random LoRA for a Z-Image transformer, for benchmarks (zimage make-random-lora, zimage bench
// --lora): diffusers/PEFT keys (transformer.<block>.attention.to_q.lora_A.weight, ...) on every
// attention (to_q, to_k, to_v, to_out.0) and feed-forward (w1, w2, w3) weight of every block
// (noise refiners, context refiners, main layers), bf16, down ~ U(-1, 1)/sqrt(K) and up small, so
// the update is a modest one as trained LoRAs make. Deterministic for a seed.
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"
#include "io/model/model_config.h"

namespace zimage {

struct RandomLoraOptions {
  int rank = 32;
  uint64_t seed = 1;
  bool attention = true;     // to_q, to_k, to_v, to_out.0
  bool feed_forward = true;  // w1, w2, w3
};

// Writes the file (replacing it; all or nothing). Returns its parameter count.
Result<int64_t> write_random_lora(const std::string& path, const TransformerConfig& cfg,
                                  const RandomLoraOptions& o);

}  // namespace zimage
