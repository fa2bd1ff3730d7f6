// Weight-loading helpers shared by the three models: fetch a tensor with its expected shape
// (errors name the tensor and both shapes), convert it on the host where a layout change or a
// fusion is needed (OIHW -> OHWI, [q; k; v] row concatenation), and upload it in the backend's
// compute dtype. Also the "every tensor of the file was used" check.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/status.h"
#include "core/tensor.h"
#include "io/weights/weights.h"

namespace zimage::load {

// Host float32 copy of `name`, whose shape must be `shape`.
Result<Tensor> host_f32(const WeightStore& ws, const std::string& name, const Shape& shape);

// `name` (shape checked) uploaded to `be` in be.act_dtype(). A scaled-FP8 matrix (a ComfyUI FP8
// file's linear weight; WeightStore::is_scaled_fp8) is widened on the device: widen_scaled_fp8.
Result<Tensor> weight(const WeightStore& ws, Backend& be, const std::string& name,
                      const Shape& shape);

// One f32 scale per row from an FP8 weight's scale: f32 [1] (per tensor) or [rows], or undefined
// (an unscaled FP8 weight: 1).
void fill_row_scales(const Tensor& scale, int64_t rows, float* out);

// A scaled-FP8 matrix [N, K] widened on the device: its stored FP8 bytes and one float32 scale per
// row uploaded, multiplied there (Backend::dequantize_fp8_rows: the float32 product of
// dequantize_f32 in io/weights/scaled_fp8.h, rounded once to the act dtype, the same values).
// Why: widening on the host wrote 4 bytes per weight on one thread, minutes for a full model.
Result<Tensor> widen_scaled_fp8(const WeightStore& ws, Backend& be, const std::string& name,
                                const Shape& shape);

// `name` (shape checked) as a zero-copy host view in the file's dtype (must be a float dtype).
Result<Tensor> host_view(const WeightStore& ws, const std::string& name, const Shape& shape);

// Row-concatenation of host matrices parts[i] = [n_i, K] (any float dtype, e.g. views of the
// mapped file) -> [sum n_i, K] on `be` (act dtype). Each part is uploaded as it is and copied
// into its rows on the device, so the multi-GB fused projections (to_q|to_k|to_v, gate|up) take
// no host staging or host-side conversion. `what` names the result in errors.
Result<Tensor> concat_rows(Backend& be, const std::vector<Tensor>& parts, const std::string& what);

// Row-concatenation of host matrices parts[i] = [n_i, K] -> [sum n_i, K] on `be` in `dtype`: each
// part is uploaded as Backend::upload converts it (float parts to any float dtype; stored forms,
// FP8 bytes or GGUF blocks as kU8 rows, only to their own dtype) and copied into its rows on the
// device; a single part is uploaded as it is. `what` names the result in errors.
Result<Tensor> upload_rows(Backend& be, const std::vector<Tensor>& parts, DType dtype,
                           const std::string& what);

// Conv weight stored OIHW [cout, cin, k, k] -> OHWI [cout, k, k, cin] on `be` (act dtype).
// A 1x1 conv also accepts a linear-style [cout, cin] tensor.
Result<Tensor> conv_weight(const WeightStore& ws, Backend& be, const std::string& name,
                           int64_t cout, int64_t cin, int64_t k);

// A host tensor (any float dtype) uploaded as f32 / act dtype; convenience wrappers.
Result<Tensor> upload_host(Backend& be, const Tensor& host, DType dtype);

// After loading: every tensor of `ws` not fetched so far and not accepted by `foreign`
// (tensors that belong to another model or are known to be unused) is an error naming them.
Status check_all_used(const WeightStore& ws, const std::string& component,
                      const std::function<bool(const std::string&)>& foreign);

// Allocates a tensor with a message naming `what` on failure.
Result<Tensor> alloc(Backend& be, DType dtype, const Shape& shape, const std::string& what);

}  // namespace zimage::load
