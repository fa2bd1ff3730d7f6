// Applying LoRAs (io/lora/lora.h) to the Z-Image transformer by merging them into its weights at load:
// every targeted tensor of the transformer's WeightStore becomes a computed tensor
//   W' = W + Σ scale · ΔW   (float32 on the host, patches added in --lora order)
// made when the DiT loader fetches it, then uploaded like any weight (rounded once to the compute
// dtype). Why merging: it costs nothing per step, and diffusers' image is matched as closely as
// its own unmerged PEFT path allows: PEFT computes base(x) + scale · B(A(x)) in the module dtype,
// which in float32 differs from x · W'ᵀ by rounding only (measured: <= 5e-7 on the test images).
//
// The store may name the DiT as diffusers does (to_q/to_k/to_v apart) or as ComfyUI does (fused
// attention.qkv, attention.out, x_embedder, final_layer, a diffusion_model. prefix): a patch on
// to_k then lands on the middle third of the rows of attention.qkv. Patches are computed into
// their own buffer and then added, so both layouts give the same bits.
#pragma once

#include <string>
#include <vector>

#include "core/status.h"
#include "io/lora/lora.h"
#include "io/weights/weights.h"
#include "zimage/zimage.h"

namespace zimage {

// Reads `loras` in order, resolves each patch against `ws` and replaces the targeted tensors.
// Keys that match no transformer weight (an unknown module, a text-encoder key, a layer the model
// does not have, DoRA scales) are an error naming the file and the first keys, or with `lenient`
// a warning (the rest is applied). A patch whose shape does not fit its target is an error
// naming the key, its shape and the target's. At log level info (--verbose) each LoRA's format,
// patch count and targets with ranks are listed.
// `threads` host threads make the merged tensors (0: every hardware thread).
Status merge_loras(WeightStore& ws, const std::vector<LoraSpec>& loras, bool lenient,
                   int threads = 0);

// Where the diffusers-named DiT weight `canonical` lives in `ws`: the store's name and the first
// row (non-zero for to_k / to_v inside a fused attention.qkv). NotFound when the model has none.
struct StoreTarget {
  std::string name;
  int64_t row0 = 0;
  int64_t rows = 0;  // rows of the canonical weight (a third of a fused qkv)
  int64_t cols = 0;
};
Result<StoreTarget> resolve_dit_weight(const WeightStore& ws, const std::string& canonical);

// scale · ΔW of one patch as a float32 host tensor [rows, cols].
Result<Tensor> lora_delta(const LoraPatch& p);

}  // namespace zimage
