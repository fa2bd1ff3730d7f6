// See quantized_linear.h. Quantised weights go from the file's mapping to the device as they are;
// only the per-row scales are made on the host.
#include "model/common/quantized_linear.h"

#include <cstdio>
#include <cstring>
#include <vector>

#include "core/log.h"
#include "io/gguf/gguf_quants.h"
#include "model/common/load_util.h"

namespace zimage {

namespace {

bool is_fp8_dtype(DType d) {
  return d == DType::kF8E4M3 || d == DType::kF8E5M2;
}

std::string bytes_text(uint64_t b) {
  char buf[32];
  if (b >= (uint64_t{1} << 30))
    std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(b) / (1u << 30));
  else
    std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(b) / (1u << 20));
  return buf;
}

// The FP8 form of a part: its stored dtype, or false when it is not FP8.
bool fp8_dtype_of(const WeightStore& ws, const LinearPart& p, DType* d) {
  if (ws.is_scaled_fp8(p.name)) {
    auto s = ws.peek_fp8(p.name);
    if (!s.ok() || s->data.shape() != p.shape) return false;
    *d = s->data.dtype();
    return is_fp8_dtype(*d);
  }
  auto info = ws.info(p.name);
  if (!info.ok() || info->shape != p.shape || !is_fp8_dtype(info->dtype)) return false;
  *d = info->dtype;
  return true;
}

}  // namespace

void KeptQuantStats::add(const KeptQuantStats& o) {
  kept += o.kept;
  widened += o.widened;
  kept_bytes += o.kept_bytes;
  kept_wide_bytes += o.kept_wide_bytes;
  for (const auto& [k, n] : o.kinds) kinds[k] += n;
}

std::string KeptQuantStats::describe() const {
  if (kept == 0) return "";
  std::string kinds_text;
  for (const auto& [k, n] : kinds)
    kinds_text += (kinds_text.empty() ? "" : ", ") + k + " " + std::to_string(n);
  return std::to_string(kept) + " linear weights kept quantised (" + kinds_text +
         "): " + bytes_text(kept_bytes) + " on the device instead of " +
         bytes_text(kept_wide_bytes) + "; " + std::to_string(widened) + " widened";
}

KeptForm kept_form(const WeightStore& ws, const std::vector<LinearPart>& parts, DType act,
                   bool keep_quantized) {
  KeptForm f;
  if (parts.empty() || parts[0].shape.size() != 2) return f;
  const int64_t k = parts[0].shape[1];
  int64_t rows = 0;
  for (const LinearPart& p : parts) {
    if (p.shape.size() != 2 || p.shape[1] != k) return f;
    rows += p.shape[0];
  }
  f.device_bytes = static_cast<uint64_t>(rows) * k * dtype_size(act);
  if (!keep_quantized) return f;

  // All parts FP8 of one dtype: bytes + one f32 scale per row.
  DType d0 = DType::kF32;
  bool fp8 = fp8_dtype_of(ws, parts[0], &d0);
  for (size_t i = 1; fp8 && i < parts.size(); ++i) {
    DType d = DType::kF32;
    fp8 = fp8_dtype_of(ws, parts[i], &d) && d == d0;
  }
  if (fp8) {
    f.kind = KeptForm::kFp8;
    f.fp8_dtype = d0;
    f.device_bytes = static_cast<uint64_t>(rows) * k + 4 * static_cast<uint64_t>(rows);
    return f;
  }
  // All parts packed blocks of one block-quantised type.
  uint32_t type = 0;
  uint64_t bytes = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (!ws.is_packed(parts[i].name)) return f;
    auto pw = ws.peek_packed(parts[i].name);
    if (!pw.ok() || pw->rows != parts[i].shape[0] || pw->cols != k) return f;
    if (!ggml_type_is_quantized(static_cast<GgmlType>(pw->ggml_type))) return f;
    const GgmlTypeInfo* info = ggml_type_info(pw->ggml_type);
    if (!info || !info->dequantizable) return f;
    if (i > 0 && pw->ggml_type != type) return f;
    type = pw->ggml_type;
    bytes += pw->bytes;
  }
  f.kind = KeptForm::kPacked;
  f.ggml_type = type;
  f.device_bytes = bytes;
  return f;
}

Result<LinearWeight> load_linear(const WeightStore& ws, Backend& be,
                                 const std::vector<LinearPart>& parts, const std::string& what,
                                 bool keep_quantized, KeptQuantStats* stats) {
  if (parts.empty()) return InternalError("load_linear(" + what + "): no parts");
  const KeptForm f = kept_form(ws, parts, be.act_dtype(), keep_quantized);
  LinearWeight lw;
  if (f.kind == KeptForm::kWide) {
    if (parts.size() == 1) {
      ZI_ASSIGN_OR_RETURN(lw.w, load::weight(ws, be, parts[0].name, parts[0].shape));
    } else {
      // Each part uploaded in the act dtype (a scaled-FP8 one widened on the device,
      // load::widen_scaled_fp8) and copied into its rows there: no host staging.
      const int64_t k = parts[0].shape[1];
      int64_t rows = 0;
      for (const LinearPart& p : parts) rows += p.shape[0];
      ZI_ASSIGN_OR_RETURN(Tensor fused, load::alloc(be, be.act_dtype(), {rows, k}, what));
      int64_t r0 = 0;
      for (const LinearPart& p : parts) {
        ZI_ASSIGN_OR_RETURN(Tensor part, load::weight(ws, be, p.name, p.shape));
        ZI_TRY(be.copy_2d(part, 0, k, fused, r0 * k, k, p.shape[0], k));
        r0 += p.shape[0];
      }
      lw.w = std::move(fused);
    }
    if (stats) ++stats->widened;
    return lw;
  }

  const int64_t k = parts[0].shape[1];
  int64_t rows = 0;
  for (const LinearPart& p : parts) rows += p.shape[0];
  std::string kind;
  // Each part goes from its file view straight to the device (the backend's uploader reads the
  // mapping on several threads); a fused weight is assembled there by row copies. No host copy of
  // the weight is made: a single-threaded one cost seconds for a whole FP8 or GGUF model.
  if (f.kind == KeptForm::kFp8) {
    Tensor scale = Tensor::host(DType::kF32, {rows});  // [N]
    if (!scale.defined()) return OutOfMemory("host staging of the scales of " + what);
    std::vector<Tensor> views;
    int64_t r0 = 0;
    for (const LinearPart& p : parts) {
      Tensor data, sc;
      if (ws.is_scaled_fp8(p.name)) {
        ZI_ASSIGN_OR_RETURN(Fp8StoredWeight s, ws.fp8(p.name));
        data = s.data;
        sc = s.scale;
      } else {
        ZI_ASSIGN_OR_RETURN(data, ws.get(p.name, p.shape));
      }
      if (data.shape() != p.shape || data.dtype() != f.fp8_dtype ||
          (sc.defined() &&
           (sc.dtype() != DType::kF32 || (sc.numel() != 1 && sc.numel() != p.shape[0]))))
        return FormatError(ws.path() + ": tensor " + p.name + " " + data.describe() +
                           " does not match its expected " + dtype_name(f.fp8_dtype) + " " +
                           shape_string(p.shape));
      load::fill_row_scales(sc, p.shape[0], scale.data_as<float>() + r0);
      views.push_back(std::move(data));
      r0 += p.shape[0];
    }
    ZI_ASSIGN_OR_RETURN(lw.w, load::upload_rows(be, views, f.fp8_dtype, what));
    ZI_ASSIGN_OR_RETURN(lw.scale, load::upload_host(be, scale, DType::kF32));
    kind = f.fp8_dtype == DType::kF8E5M2 ? "f8_e5m2" : "f8_e4m3";
  } else {
    const GgmlType type = static_cast<GgmlType>(f.ggml_type);
    uint64_t row_bytes = 0;
    if (!ggml_row_bytes(type, k, &row_bytes))
      return FormatError(what + ": rows of " + std::to_string(k) + " " +
                         ggml_type_name(f.ggml_type) + " elements do not fit its blocks");
    std::vector<Tensor> views;
    std::vector<PackedWeight> held;  // keeps each part's bytes alive until the upload read them
    for (const LinearPart& p : parts) {
      ZI_ASSIGN_OR_RETURN(PackedWeight pw, ws.packed(p.name));
      if (pw.ggml_type != f.ggml_type || pw.rows != p.shape[0] || pw.cols != k ||
          pw.bytes != static_cast<uint64_t>(pw.rows) * row_bytes || pw.data == nullptr)
        return FormatError(ws.path() + ": packed tensor " + p.name + " (" +
                           ggml_type_name(pw.ggml_type) + ", " + std::to_string(pw.rows) + " x " +
                           std::to_string(pw.cols) + ") does not match " + shape_string(p.shape) +
                           " " + ggml_type_name(f.ggml_type));
      // A view of the file's bytes (read only: upload reads it, nothing writes through it).
      views.push_back(Tensor::wrap(const_cast<void*>(pw.data), DType::kU8,
                                   {pw.rows, static_cast<int64_t>(row_bytes)}));
      held.push_back(std::move(pw));
    }
    ZI_ASSIGN_OR_RETURN(lw.w, load::upload_rows(be, views, DType::kU8, what));
    lw.ggml_type = f.ggml_type;
    lw.packed_cols = k;
    kind = ggml_type_name(f.ggml_type);
  }
  if (stats) {
    ++stats->kept;
    stats->kept_bytes += f.device_bytes;
    stats->kept_wide_bytes += static_cast<uint64_t>(rows) * k * dtype_size(be.act_dtype());
    ++stats->kinds[kind];
  }
  return lw;
}

Result<StreamSource> stream_from_files(const WeightStore& ws, const Backend& be,
                                       const std::vector<LinearPart>& parts) {
  StreamSource none;
  if (parts.empty()) return none;
  const DType act = be.act_dtype();
  int64_t rows = 0;
  for (const LinearPart& p : parts) {
    if (!ws.contains(p.name) || ws.is_packed(p.name) || ws.is_scaled_fp8(p.name)) return none;
    ZI_ASSIGN_OR_RETURN(WeightInfo info, ws.info(p.name));
    // The wide float dtypes only: an FP8 tensor has its own kept form (kept_form), which a
    // widening stream would bypass.
    const bool wide =
        info.dtype == DType::kF32 || info.dtype == DType::kBF16 || info.dtype == DType::kF16;
    if (info.shape != p.shape || !wide || !be.can_stream(info.dtype, act)) return none;
    if (parts.size() > 1 && (p.shape.size() != 2 || p.shape[1] != parts[0].shape[1])) return none;
    rows += p.shape.empty() ? 1 : p.shape[0];
  }
  StreamSource src;
  src.dtype = act;
  src.from_file = true;
  src.shape = parts.size() == 1 ? parts[0].shape : Shape{rows, parts[0].shape[1]};
  for (const LinearPart& p : parts) {
    ZI_ASSIGN_OR_RETURN(Tensor view, ws.get(p.name, p.shape));  // counts as used
    src.parts.push_back(std::move(view));
  }
  return src;
}

BlockSources::BlockSources(const WeightStore& ws, Backend& be, const WeightPlacement& placement,
                           int index)
    : ws_(ws),
      be_(be),
      placement_(placement),
      index_(index),
      streamed_(index >= 0 && index < static_cast<int>(placement.streamed.size()) &&
                placement.streamed[index]) {}

Result<bool> BlockSources::take(const std::vector<LinearPart>& parts, const Tensor& dst) {
  if (!streamed_) return false;
  ZI_ASSIGN_OR_RETURN(StreamSource src, stream_from_files(ws_, be_, parts));
  if (!src.defined()) return false;
  if (!placement_.stream_from_files)
    ZI_TRY(copy_to_host(be_, src, !placement_.is_pageable(index_)));
  taken_.emplace_back(&dst, std::move(src));
  return true;
}

Status BlockSources::tensor(const std::string& name, const Shape& shape, Tensor& dst) {
  ZI_ASSIGN_OR_RETURN(bool taken, take({{name, shape}}, dst));
  if (!taken) {
    ZI_ASSIGN_OR_RETURN(dst, load::weight(ws_, be_, name, shape));
  }
  return Status::Ok();
}

std::vector<StreamSource> BlockSources::unit(const std::vector<Tensor*>& tensors) {
  std::vector<StreamSource> u(tensors.size());
  for (auto& [t, src] : taken_)
    for (size_t k = 0; k < tensors.size(); ++k)
      if (tensors[k] == t) u[k] = std::move(src);
  taken_.clear();
  return u;
}

void report_and_lock_files(WeightStreamer& streamer, const WeightPlacement& placement,
                           const std::vector<int>& unit_of, const char* model, const char* units) {
  if (!placement.stream_from_files) return;
  ZI_INFO(
      "%s: %d of %d streamed %s read from the weight files at each use, the rest from host "
      "copies",
      model, streamer.units_from_files(), streamer.units(), units);
  if (!placement.lock_files) return;
  std::vector<bool> lock;
  for (size_t i = 0; i < unit_of.size(); ++i)
    if (unit_of[i] >= 0) lock.push_back(!placement.is_pageable(static_cast<int>(i)));
  const uint64_t locked = streamer.lock_file_pages(lock);
  ZI_INFO("%s: %.2f GiB of weight-file pages page-locked in place", model,
          static_cast<double>(locked) / (1024.0 * 1024.0 * 1024.0));
}

}  // namespace zimage
