// `zimage convert`: writes a loadable model (a diffusers folder, single files, FP8 or GGUF files:
// anything io/model/model_source.h opens) as the files people download:
//   bf16      ComfyUI-named single files in bf16: the DiT (x_embedder, fused attention.qkv,
//             attention.out, final_layer), the Qwen3 text encoder (transformers names under
//             "model."), the VAE (original Flux / ldm names).
//   fp8       ComfyUI's current scaled FP8 format: every 2-D weight of the DiT blocks (q|k|v,
//             out, w1, w2, w3, adaLN) and the text-encoder layers' linears as F8_E4M3 `.weight`
//             with a float32 `.weight_scale` (one per tensor, shape
//             []) and a `.comfy_quant` record {"format": "float8_e4m3fn"}; the rest in bf16; the
//             VAE as in bf16.
//   fp8-rows  as fp8 with one scale per output row (`.weight_scale` [N, 1]), the format records in
//             the header's `_quantization_metadata` instead of `.comfy_quant` tensors.
//   q8_0, q4_0, q4_k, q5_k, q6_k (GGUF, the DiT only): architecture "lumina2", ComfyUI names as
//             city96's ComfyUI-GGUF converter writes them; the block linear weights and the
//             blocks' adaLN weights in the chosen type (io/gguf/gguf_quantize.h; a K-quant on a row
//             that is not a multiple of 256 elements falls back to Q8_0), 1-D and small tensors
//             (< 4096 elements) F32, the other 2-D tensors (embedders, final layer) BF16.
// Quantisation: FP8 s = max|w| / 448 (1 for an all-zero tensor/row), q = e4m3(w * (1 / s)),
// rounded to nearest even.
// The writers stream: one tensor at a time is read (or dequantised) into float32, converted and
// appended; each file is written to a temporary sibling and renamed when complete; an output path
// that is one of the inputs is refused.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/status.h"
#include "io/model/model_source.h"

namespace zimage {

struct ConvertOptions {
  std::string format;                                        // see above
  std::string out_dir;                                       // created if missing
  bool transformer = true, text_encoder = true, vae = true;  // components to write
  int threads = 0;                                           // quantisation threads (0: all)
  // Called after each tensor: the output file, bytes written so far and its total.
  std::function<void(const std::string& file, uint64_t done, uint64_t total)> progress;
};

struct ConvertedFile {
  std::string component;  // "transformer", "text_encoder", "vae"
  std::string path;
  uint64_t bytes = 0;
  int tensors = 0;
  int quantized = 0;  // tensors written FP8 or in a GGUF block type
};

// The format names convert accepts ("bf16, fp8, fp8-rows, q8_0, ...").
std::string convert_format_list();

// Writes the chosen components of `src` in `o.format` into `o.out_dir`.
Result<std::vector<ConvertedFile>> convert_model(const ModelSource& src, const ConvertOptions& o);

}  // namespace zimage
