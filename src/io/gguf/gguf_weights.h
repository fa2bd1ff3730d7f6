// A GGUF file as a WeightStore (io/weights/weights.h), so the model loaders read it like a safetensors
// folder:
//   - shapes in PyTorch order (GGUF's ne[] reversed), or the shape ComfyUI-GGUF recorded under
//     `comfy.gguf.orig_shape.<tensor>` when the converter had to reshape the tensor;
//   - F32 / F16 / BF16 (and integer / F64) tensors are zero-copy views of the mapping; quantised
//     tensors are dequantised into owned host f32 tensors when fetched (WeightStore::get), and
//     their packed blocks stay reachable through WeightStore::packed;
//   - names: DiT files (architecture `lumina2`, city96's ComfyUI-GGUF converter) carry the
//     original / ComfyUI names the DiT loader accepts, and stay as they are; text-encoder files
//     made by llama.cpp (architecture `qwen3`: token_embd, blk.N.attn_q, ...) are renamed to the
//     transformers names the Qwen3 loader expects (gguf_store_name).
// Every tensor type must be one zimage dequantises (io/gguf/gguf_quants.h); another type is an error
// naming the tensor when the file is opened.
#pragma once

#include <memory>
#include <string>

#include "core/status.h"
#include "io/gguf/gguf.h"
#include "io/weights/weights.h"

namespace zimage {

Result<WeightStore> open_gguf_weights(const std::string& path);
// The same over an already validated file (GgufFile::open or ::view); the store keeps it alive.
Result<WeightStore> gguf_weight_store(std::shared_ptr<const GgufFile> file);

// The store name of GGUF tensor `tensor` in a file of architecture `arch`: for `qwen3`, the
// transformers name ("blk.3.attn_q.weight" -> "model.layers.3.self_attn.q_proj.weight",
// "token_embd.weight" -> "model.embed_tokens.weight", "output.weight" -> "lm_head.weight");
// any other architecture or an unknown name keeps its name.
std::string gguf_store_name(const std::string& arch, const std::string& tensor);

}  // namespace zimage
