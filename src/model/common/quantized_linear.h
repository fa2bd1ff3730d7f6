// Linear weights kept on the device in the form the file stores them, instead of widened to the
// compute dtype at load: an FP8 checkpoint's weights stay FP8 bytes with one f32 scale per output
// row (a per-tensor scale is broadcast to the rows), a GGUF file's block-quantised weights stay
// their raw blocks (kU8 [N, row bytes]). linear() (model/common/linear.h) dequantises such a weight
// into the model's scratch buffer just before its GEMM, with the same float32 arithmetic as the
// host dequantisation at load (Backend::dequantize_fp8_rows, Backend::dequantize_packed), so the
// weight the GEMM sees is the same value either way: only the resident and streamed bytes change.
//
// A weight the loader fuses from several stored tensors (q|k|v, w1|w3, gate|up) is kept only when
// every part has the same stored form (all FP8 of one dtype, or all packed blocks of one ggml
// type); the rows are then concatenated as they are. Anything else (a mixed fusion, a LoRA-merged
// weight, plain bf16/f16/f32 tensors, GGUF F16/BF16/F32) is widened as before.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "core/status.h"
#include "io/weights/weights.h"
#include "model/common/linear.h"
#include "model/common/weight_streamer.h"

namespace zimage {

// What a model kept quantised (for --verbose and `zimage info`).
struct KeptQuantStats {
  int kept = 0;                      // linear weights kept quantised
  int widened = 0;                   // linear weights in the act dtype
  uint64_t kept_bytes = 0;           // device bytes of the kept ones (blocks or FP8 + scales)
  uint64_t kept_wide_bytes = 0;      // what those would take in the act dtype
  std::map<std::string, int> kinds;  // "Q4_K" / "f8_e4m3" -> number of weights
  void add(const KeptQuantStats& o);
  // "180 linear weights kept quantised (Q4_K 120, Q6_K 60): 1.2 GiB on the device instead of
  // 4.5 GiB" or "" when nothing is kept.
  std::string describe() const;
};

// One part of a fused linear weight: a stored tensor and its expected [rows, K] shape.
struct LinearPart {
  std::string name;
  Shape shape;
};

// How the row-concatenation of `parts` would be held on the device: the kind and its bytes
// (act dtype bytes when widened). Reads no tensor data and marks nothing used.
struct KeptForm {
  enum Kind { kWide, kFp8, kPacked } kind = kWide;
  DType fp8_dtype = DType::kF8E4M3;  // kFp8
  uint32_t ggml_type = 0;            // kPacked
  uint64_t device_bytes = 0;
};
KeptForm kept_form(const WeightStore& ws, const std::vector<LinearPart>& parts, DType act,
                   bool keep_quantized);

// Loads the row-concatenation of `parts` (each shape checked) as one LinearWeight on `be`: kept
// quantised where kept_form() says so, else in the act dtype (load::weight / load::concat_rows).
// `stats` (optional) counts it. `what` names the weight in errors.
Result<LinearWeight> load_linear(const WeightStore& ws, Backend& be,
                                 const std::vector<LinearPart>& parts, const std::string& what,
                                 bool keep_quantized, KeptQuantStats* stats = nullptr);

// The row-concatenation of `parts` (a single part: any rank) as the host side of a streamed
// tensor in the act dtype, read from the weight files at every stream (WeightStreamer) instead of
// loaded and copied: when every part is a plain f32, bf16 or f16 tensor of its expected shape
// that the backend streams as stored (Backend::can_stream; on CUDA the act dtype itself), and the
// parts share their row length. Otherwise an undefined source, with nothing marked used: the caller
// loads the weight as usual.
Result<StreamSource> stream_from_files(const WeightStore& ws, const Backend& be,
                                       const std::vector<LinearPart>& parts);

// After a model made its streamer (units in the order of `unit_of`, -1 = resident): with
// stream_from_files, says how many units read the files, and with lock_files page-locks the file
// pages of the units the placement keeps within the host-memory limit. `model` and `units` name
// them in the log ("transformer", "blocks").
void report_and_lock_files(WeightStreamer& streamer, const WeightPlacement& placement,
                           const std::vector<int>& unit_of, const char* model, const char* units);

// Loading one block or layer that may stream (WeightPlacement::streamed[index]): the tensors its
// files hold as the backend streams them are taken from the files instead of loaded, kept as
// views (WeightPlacement::stream_from_files) or copied straight into host memory (copy_to_host;
// page-locked unless the placement makes the unit pageable). The model loads the rest as usual
// and moves it to the host; unit() gives the taken sources in the model's tensor positions.
class BlockSources {
 public:
  BlockSources(const WeightStore& ws, Backend& be, const WeightPlacement& placement, int index);
  bool streamed() const { return streamed_; }
  // Takes `parts` (stream_from_files) as the host side of the tensor `dst`, which then stays
  // undefined: true. False: not streamed, or not streamable as stored; the caller loads it.
  Result<bool> take(const std::vector<LinearPart>& parts, const Tensor& dst);
  // One stored tensor: taken, or loaded into `dst` (load::weight).
  Status tensor(const std::string& name, const Shape& shape, Tensor& dst);
  // The taken sources at the positions of `tensors` (undefined elsewhere).
  std::vector<StreamSource> unit(const std::vector<Tensor*>& tensors);

 private:
  const WeightStore& ws_;
  Backend& be_;
  const WeightPlacement& placement_;
  int index_;
  bool streamed_;
  std::vector<std::pair<const Tensor*, StreamSource>> taken_;
};

}  // namespace zimage
