// LoRA files for the Z-Image DiT: read a safetensors LoRA, recognise its key layout, and turn
// every key into a patch on one DiT weight named as diffusers names it. Nothing here touches the
// model; model/adapters/lora_merge.h resolves the patches against a transformer's WeightStore and merges
// them.
//
// Key layouts (the module path is the part before the LoRA suffix):
//   prefix            transformer. (diffusers/PEFT), diffusion_model. / model.diffusion_model.
//                     (ai-toolkit, diffusion-pipe, ComfyUI), base_model.model. (PEFT), none,
//                     lora_unet_ / lora_unet__ (kohya, musubi: the module path with '.' -> '_'),
//                     lycoris_ (LyCORIS as ComfyUI names it)
//   module path       diffusers' tree (attention.to_q/to_k/to_v/to_out.0, feed_forward.w1/w2/w3,
//                     adaLN_modulation.0, t_embedder.mlp.0/2, cap_embedder.1, all_x_embedder.2-1,
//                     all_final_layer.2-1.linear/adaLN_modulation.1, in layers.N, noise_refiner.N,
//                     context_refiner.N) or ComfyUI's (attention.qkv fused, attention.out,
//                     x_embedder, final_layer.*)
//   suffix            lora_A/lora_B(.default).weight, lora_down/lora_up.weight, lora.down/lora.up
//                     .weight, lora_linear_layer.down/up.weight, .alpha; LoHa hada_w{1,2}_{a,b};
//                     LoKr lokr_w1 | lokr_w1_{a,b}, lokr_w2 | lokr_w2_{a,b}
//
// Scale (what diffusers' Z-Image loader does, checked against it by tools/make_lora_cases.py):
//   low rank   dW = scale · up · down,  scale = user · alpha / rank  (alpha key present; rank =
//              rows of down) or user · 1 (no alpha key), times lora_alpha / r (or / sqrt(r) with
//              use_rslora) from the PEFT config in the `lora_adapter_metadata` header entry that
//              diffusers' own training scripts write (rank_pattern / alpha_pattern honoured)
//   LoHa       dW = scale · (w1_a · w1_b) ⊙ (w2_a · w2_b),  scale = user · alpha / rows(w1_b)
//   LoKr       dW = scale · kron(w1, w2) with w1 = w1_a · w1_b and w2 = w2_a · w2_b where stored
//              decomposed; scale = user · alpha / rank (rank = rows of w2_b, else of w1_b), or
//              user · 1 when both factors are full matrices
// A LoRA on the fused attention.qkv (up: [3·dim, r]) becomes three patches, one per third of its
// rows, on to_q, to_k and to_v. kohya's ss_network_alpha header entry is not used: kohya files
// carry one alpha tensor per module, which is what diffusers reads too.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"

namespace zimage {

class SafetensorsFile;  // io/weights/safetensors.h

enum class LoraKind { kLowRank, kLoHa, kLoKr };
const char* lora_kind_name(LoraKind k);  // "LoRA", "LoHa", "LoKr"

// One update of one DiT weight: target[rows] += delta rows [delta_row0, delta_row0 + rows) of the
// module's full delta. For a low-rank patch `up` is already cut to those rows (delta_row0 0), so
// the update is scale · up · down: the form a runtime side GEMM (x · downᵀ · upᵀ · scale) can use.
struct LoraPatch {
  std::string target;  // diffusers weight name, e.g. "layers.3.attention.to_q.weight"
  LoraKind kind = LoraKind::kLowRank;
  float scale = 1.0f;      // the whole factor: user scale x alpha / rank x PEFT config
  int64_t rank = 0;        // low-rank / LoHa rank; LoKr: the decomposed factor's rank (0: none)
  int64_t rows = 0;        // rows of the target this patch adds to (N)
  int64_t cols = 0;        // columns (K)
  int64_t delta_row0 = 0;  // first row of the module's full delta that lands on row 0 of target
  // Host views of the file's tensors, in the file's float dtype. kLowRank: down [r, K], up
  // [rows, r]. kLoHa: w1_a [N, r], w1_b [r, K], w2_a, w2_b. kLoKr: w1 or (w1_a, w1_b), w2 or
  // (w2_a, w2_b).
  Tensor down, up;
  Tensor w1, w1_a, w1_b, w2, w2_a, w2_b;
  std::string module;             // the module as the file names it (messages, --verbose)
  std::vector<std::string> keys;  // the file's keys this patch is made from
};

// A key the patches do not use, and why (no such module, text encoder, DoRA, ...).
struct LoraSkippedKey {
  std::string key;
  std::string reason;
};

// One LoRA file, read and mapped.
struct LoraFile {
  std::string path;
  float user_scale = 1.0f;
  std::string format;  // for --verbose: "kohya (lora_unet_; lora_down/lora_up + alpha)"
  size_t key_count = 0;
  std::vector<LoraPatch> patches;         // in key order; a fused qkv gives three
  std::vector<LoraSkippedKey> unmatched;  // keys that name no DiT weight: an error unless lenient
  std::vector<LoraSkippedKey> redundant;  // duplicates diffusers skips too (fused qkv next to
                                          // to_q/to_k/to_v, out next to to_out.0)
  std::shared_ptr<const SafetensorsFile> file;  // keeps the views' mapping alive
};

// Reads `path` (a safetensors file) and maps every key. Errors (FormatError naming the file and
// the key): a down without its up (or the reverse), factors of the wrong rank or shape, a
// non-float tensor, an alpha that is not one finite number, a file with no LoRA key at all, an
// unreadable lora_adapter_metadata. Keys that name no DiT module are not errors here: they are
// listed in `unmatched`. `scale` must be finite.
Result<LoraFile> read_lora(const std::string& path, float scale);

// ---- the pieces, exposed for tests ----

// Which part of a LoRA a key's suffix names.
enum class LoraPart {
  kDown,
  kUp,
  kAlpha,
  kHadaW1A,
  kHadaW1B,
  kHadaW2A,
  kHadaW2B,
  kLokrW1,
  kLokrW1A,
  kLokrW1B,
  kLokrW2,
  kLokrW2A,
  kLokrW2B,
  kUnsupported,  // a known suffix zimage does not apply (dora_scale, Tucker cores, biases, ...)
};

struct LoraKey {
  std::string
      module;  // the key without its suffix, as written ("lora_unet_layers_0_attention_to_q")
  LoraPart part = LoraPart::kUnsupported;
  std::string suffix;  // as written (".lora_down.weight")
};
// Splits a key into module and suffix; nullopt when the suffix is none of the known ones.
std::optional<LoraKey> split_lora_key(const std::string& key);

// A LoRA module mapped onto the DiT: a diffusers module name and, for the fused attention.qkv,
// which third (0 q, 1 k, 2 v) of the module's output rows lands on it (-1: the whole module).
struct LoraTarget {
  std::string module;  // "layers.0.attention.to_q"
  int part = -1;
};
struct LoraModuleMap {
  std::vector<LoraTarget> targets;  // empty: unmatched
  std::string prefix;               // the prefix that was removed ("lora_unet_", "" ...)
  std::string reason;               // when unmatched: why
  bool fused_qkv = false;
  bool comfy_name = false;  // ComfyUI's spelling (qkv, out, x_embedder, final_layer)
};
// Maps a module path as a LoRA writes it (any prefix above) to DiT modules.
LoraModuleMap map_lora_module(const std::string& module);

// PEFT's per-module scale from a diffusers lora_adapter_metadata entry (the JSON text):
// lora_alpha / r (or / sqrt(r) with use_rslora), with rank_pattern / alpha_pattern matched as PEFT
// matches them (the first key k, in sorted order, with `(.*\.)?(k)$` matching the module).
struct PeftScaling {
  double r = 0, lora_alpha = 0;
  bool use_rslora = false;
  std::vector<std::pair<std::string, double>> rank_pattern, alpha_pattern;
  // The rank and alpha PEFT gives `module` (diffusers name without prefix).
  Result<double> rank_for(const std::string& module) const;
  Result<double> alpha_for(const std::string& module) const;
};
// nullopt when the metadata has no transformer LoRA config; errors name `file`.
Result<std::optional<PeftScaling>> parse_peft_metadata(const std::string& json_text,
                                                       const std::string& file);

}  // namespace zimage
