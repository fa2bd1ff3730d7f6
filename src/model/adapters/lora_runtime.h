// Runtime LoRAs: a request's LoRAs applied to a loaded model and taken off again, without
// reloading its weights (the server's per-request LoRAs; lora_merge.h is the CLI's merge at load).
// Two methods, per target weight:
//   merge  W[rows] += scale · up · down on the device (one GEMM per patch, in the act dtype), the
//          touched rows first copied aside so that removing the set copies them back: the base
//          weights come back bit for bit. Costs nothing per step; recorded forwards stay valid
//          (the weights change in place).
//   side   a low-rank side GEMM after the layer's own (LinearWeight::lora, linear.h): y += s ·
//          (x · downᵀ) · upᵀ. For weights that cannot be merged: FP8 rows, quantised or streamed
//          blocks, the W8A8 FP8 linears of --precision fp8. Costs two thin GEMMs and an add per
//          layer per step; the weights are never touched. Recorded forwards hold the side buffers'
//          addresses, so the model drops them when a set with side GEMMs comes or goes
//          (ZImageDiT::set_loras).
// auto (the default) merges every weight it can and uses side GEMMs for the rest. Why: merging a
// rank-r LoRA costs one [N, r]·[r, K] GEMM and a copy of the touched rows per switch, once per
// request, while the side GEMM adds an [M, N] pass (write, read, add) per layer per step to every
// step of the request; `zimage bench --lora FILE` measures both (docs/BENCHMARKS.md).
// LoHa and LoKr patches have no low-rank form and are merged only.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/status.h"
#include "io/lora/lora.h"
#include "model/common/linear.h"

namespace zimage {

enum class LoraMethod { kAuto, kMerge, kSide };
const char* lora_method_name(LoraMethod m);  // "auto", "merge", "side"
// "auto" | "merge" | "side"; the error names `what` (a flag or field).
Result<LoraMethod> parse_lora_method(const std::string& s, const std::string& what);

// One LoRA of a request: the file as read_lora(path, 1.0) maps it, and the request's strength.
struct RuntimeLora {
  std::shared_ptr<const LoraFile> file;
  float scale = 1.0f;
};
// The identity of a set (per LoRA: path, scale, the parsed file object): equal sets give equal
// keys; empty: no LoRA.
std::string lora_set_key(const std::vector<RuntimeLora>& loras);

// Where a diffusers-named DiT weight lives in a loaded model.
struct LoraSlot {
  std::string name;                // the model's name for it (messages)
  LinearWeight* linear = nullptr;  // a linear layer: a side GEMM is possible
  Tensor* tensor = nullptr;        // the stored weight [full_rows, cols] (merge); null: none
  int64_t row0 = 0;                // the canonical weight's first row in it (to_k in fused qkv)
  int64_t rows = 0, cols = 0;      // the canonical weight's shape
  int64_t full_rows = 0;           // rows of the stored weight (side GEMM output width)
};
// canonical name -> slot; kNotFound when the model has no such weight.
using LoraSlotFinder = std::function<Result<LoraSlot>(const std::string& canonical)>;

// What an applied set changed, to take it off again.
struct AppliedLoras {
  struct Backup {
    Tensor target;  // a view of the merged rows
    Tensor saved;   // their bytes before the merge (same dtype, the backend's memory)
  };
  std::string key;
  std::vector<RuntimeLora> loras;    // held: the key's file objects stay alive (and unique)
  std::vector<Backup> backups;       // in merge order
  std::vector<LinearWeight*> sided;  // weights given a side GEMM
  int merged_weights = 0, side_weights = 0, patches = 0;
  bool empty() const { return backups.empty() && sided.empty(); }
};

// Applies `loras` (in order; their updates add up) to the weights `find` resolves. Keys that
// match no weight of the model are an error naming the file and keys (a warning with `lenient`,
// as merge_loras); shapes must fit (the error names the key). On an error nothing stays applied.
Result<AppliedLoras> apply_runtime_loras(Backend& be, const std::vector<RuntimeLora>& loras,
                                         LoraMethod method, bool lenient,
                                         const LoraSlotFinder& find);
// The checks apply_runtime_loras makes before touching the model (keys, shapes), and nothing
// else: a request's LoRAs checked when it arrives.
Status check_runtime_loras(const std::vector<RuntimeLora>& loras, bool lenient,
                           const LoraSlotFinder& find);
// Takes an applied set off: merged rows copied back (bit-exact), side GEMMs dropped.
Status remove_runtime_loras(Backend& be, AppliedLoras& applied);

}  // namespace zimage
