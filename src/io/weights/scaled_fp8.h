// FP8 checkpoints with scales, as ComfyUI and other tools write them. Why: most downloadable
// Z-Image files (`*_fp8_scaled.safetensors`, the `fp8_mixed` Qwen3) store linear weights as FP8
// with a multiplier per tensor; read as plain FP8 they give a wrong model without any error.
//
// Formats (names relative to one component, prefix already stripped):
//   legacy ComfyUI "scaled_fp8": a marker tensor `scaled_fp8` (its dtype is the FP8 type; two
//     elements mean full_precision_matrix_mult), per layer `<layer>.scale_weight` and optionally
//     `<layer>.scale_input`.
//   current ComfyUI: per layer `<layer>.weight_scale`, optional `<layer>.input_scale` and a
//     `<layer>.comfy_quant` uint8 tensor holding JSON {"format": "float8_e4m3fn", ...}, or the
//     same per-layer JSON in the header metadata `_quantization_metadata`
//     ({"format_version": ..., "layers": {"<layer>": {"format": ...}}}).
//   a `<layer>.weight_scale` without ComfyUI's markers (other exporters) is read the same way.
// The weight is `<layer>.weight` in F8_E4M3 or F8_E5M2; the scale is the dequantisation
// multiplier, one per tensor ([], [1]) or one per output row ([N], [N, 1]):
//   W[n, k] = float32(q[n, k]) * scale[n or 0]      (one float32 multiply)
// On a bf16 backend the upload rounds W to bf16 once. ComfyUI multiplies in the compute dtype
// (q.to(bf16) * scale), which can differ from this by one bf16 rounding; the float32 product is
// the exact value both approximate. The input scale only serves an FP8 GEMM with static
// activation scales; it is validated and recorded, not used.
//
// First version: apply_scaled_fp8() replaces each scaled weight in the store by its dequantised
// float32 value, made on demand (io/weights/weights.h computed tensors: one tensor at a time, at load),
// so every loader sees plain weights. ScaledFp8Index keeps the FP8 bytes and scales reachable
// for a per-layer FP8 weight path that keeps them FP8 on the device.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "io/weights/weights.h"

namespace zimage {

class SafetensorsFile;  // io/weights/safetensors.h

// One linear weight as the file stores it.
struct ScaledWeight {
  Tensor data;                     // host view of the file, F8_E4M3 or F8_E5M2, [N, K]
  Tensor scale;                    // host f32, [1] (per tensor) or [N] (per output row)
  float input_scale = 0.0f;        // static activation scale; 0 when the file has none
  bool full_precision_mm = false;  // ComfyUI's "full_precision_matrix_mult" (no FP8 GEMM)
};

// W = float32(data) * scale as a host f32 tensor of data's shape. `name` is for messages.
Result<Tensor> dequantize_f32(const ScaledWeight& w, const std::string& name);

// What a component's file holds in FP8 (for logs and `zimage info`).
struct Fp8Summary {
  std::string format;                   // "" none, "fp8" plain casts, "comfy scaled_fp8 (legacy)",
                                        // "comfy quant", "weight_scale"
  int scaled_weights = 0;               // weights with a scale
  int per_row_scales = 0;               // of which with one scale per output row
  int input_scales = 0;                 // static activation scales recorded (unused)
  int plain_fp8 = 0;                    // FP8 tensors without a scale (converted by value)
  std::vector<std::string> fp8_dtypes;  // "f8_e4m3" / "f8_e5m2" seen
  bool any() const { return scaled_weights > 0 || plain_fp8 > 0; }
  std::string describe() const;  // "comfy quant: 180 scaled FP8 weights (f8_e4m3), ..." or ""
};

// The scaled layers of one component: the FP8 bytes and scales behind each dequantised weight.
class ScaledFp8Index {
 public:
  bool contains(const std::string& weight) const { return layers_.count(weight) != 0; }
  // The weight as stored (`weight` is the component-level name, e.g.
  // "layers.0.attention.qkv.weight").
  Result<ScaledWeight> get(const std::string& weight) const;
  std::vector<std::string> names() const;

 private:
  friend Result<Fp8Summary> apply_scaled_fp8(WeightStore&, const std::shared_ptr<SafetensorsFile>&,
                                             const std::string&, ScaledFp8Index*);
  struct Entry {
    std::string raw_name;  // name in the file (with the component prefix)
    Tensor scale;
    float input_scale = 0.0f;
    bool full_precision_mm = false;
  };
  std::shared_ptr<SafetensorsFile> file_;
  std::map<std::string, Entry> layers_;
};

// Finds the scaled FP8 layers of `ws` (the tensors of `file` under `prefix`, already renamed
// without it; `file` supplies the header metadata and the FP8 bytes for `index`), replaces each
// scaled weight by its dequantised float32 value (made when the loader fetches it) and removes
// the scales and markers, which are thereby accounted for. Errors name the file and layer: a
// scale next to a weight that is not FP8, a scale of the wrong shape or not finite, a layer
// marked quantised without a scale, a format other than float8_e4m3fn / float8_e5m2 (nvfp4,
// int8, ...: Unsupported), malformed comfy_quant / _quantization_metadata JSON.
// `index` (optional) receives the FP8 bytes and scales of every scaled weight.
Result<Fp8Summary> apply_scaled_fp8(WeightStore& ws, const std::shared_ptr<SafetensorsFile>& file,
                                    const std::string& prefix, ScaledFp8Index* index = nullptr);

}  // namespace zimage
