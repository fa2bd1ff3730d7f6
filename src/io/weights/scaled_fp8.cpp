// See scaled_fp8.h. The rules follow ComfyUI's loader (comfy/utils.py convert_old_quants turns the
// legacy names into the current ones; comfy/ops.py mixed_precision_ops reads `comfy_quant` and
// `weight_scale`; comfy/quant_ops.py TensorCoreFP8Layout dequantises), written from the file
// formats, not from their code.
#include "io/weights/scaled_fp8.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <thread>
#include <vector>

#include "io/fs/json_util.h"
#include "io/weights/safetensors.h"

namespace zimage {
namespace {

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string q(const std::string& s) {
  return "'" + json_util::printable(s) + "'";
}

bool is_fp8(DType t) {
  return t == DType::kF8E4M3 || t == DType::kF8E5M2;
}

// One layer's quantisation config (a comfy_quant tensor or a _quantization_metadata entry).
struct LayerConf {
  std::string format;
  bool full_precision_mm = false;
  std::string origin;  // where it was read, for messages
};

Result<LayerConf> parse_layer_conf(const nlohmann::json& v, const std::string& origin) {
  LayerConf c;
  c.origin = origin;
  if (v.is_string()) {  // some writers store the format name alone
    c.format = v.get<std::string>();
    return c;
  }
  if (!v.is_object())
    return FormatError(origin + ": expected a JSON object {\"format\": ...}, got " +
                       json_util::type_name(v));
  auto f = v.find("format");
  if (f == v.end() || !f->is_string()) return FormatError(origin + ": no string key 'format'");
  c.format = f->get<std::string>();
  auto fp = v.find("full_precision_matrix_mult");
  if (fp != v.end()) {
    if (!fp->is_boolean())
      return FormatError(origin + ": 'full_precision_matrix_mult' is not a boolean");
    c.full_precision_mm = fp->get<bool>();
  }
  return c;
}

// The FP8 dtype a ComfyUI format name stores, or Unsupported for the formats not implemented.
Result<DType> format_dtype(const LayerConf& c) {
  if (c.format == "float8_e4m3fn") return DType::kF8E4M3;
  if (c.format == "float8_e5m2") return DType::kF8E5M2;
  return Unsupported(c.origin + ": quantisation format " + q(c.format) +
                     " is not supported (float8_e4m3fn and float8_e5m2 are)");
}

// A small host tensor of any float dtype as float32 values.
Result<std::vector<float>> float_values(const Tensor& t, const std::string& what) {
  if (!dtype_is_float(t.dtype()))
    return FormatError(what + " has dtype " + dtype_name(t.dtype()) + ", expected a float type");
  std::vector<float> v(static_cast<size_t>(t.numel()));
  if (!convert_to_f32(t.dtype(), t.data(), v.data(), v.size()))
    return FormatError(what + " cannot be read as float");
  for (float x : v)
    if (!std::isfinite(x)) return FormatError(what + " holds a NaN or infinite value");
  return v;
}

void add_dtype(Fp8Summary& s, DType t) {
  const std::string n = dtype_name(t);
  if (std::find(s.fp8_dtypes.begin(), s.fp8_dtypes.end(), n) == s.fp8_dtypes.end())
    s.fp8_dtypes.push_back(n);
}

}  // namespace

Result<Tensor> dequantize_f32(const ScaledWeight& w, const std::string& name) {
  const Tensor& d = w.data;
  if (!d.defined() || d.device() != Device::kCPU || !is_fp8(d.dtype()) || d.rank() < 1)
    return InternalError("dequantize " + name + ": data must be a host FP8 tensor");
  const int64_t rows = d.dim(0), cols = rows ? d.numel() / rows : 0;
  const int64_t ns = w.scale.defined() ? w.scale.numel() : 0;
  if (!w.scale.defined() || w.scale.dtype() != DType::kF32 || (ns != 1 && ns != rows))
    return InternalError("dequantize " + name + ": scale must be f32 [1] or [rows]");
  Tensor out = Tensor::host(DType::kF32, d.shape());
  if (!out.defined()) return OutOfMemory("dequantising " + name + " " + shape_string(d.shape()));
  const auto* src = static_cast<const uint8_t*>(d.data());
  const float* sc = w.scale.data_as<float>();
  float* dst = out.data_as<float>();
  if (rows == 0 || cols == 0) return out;
  // The 256 FP8 values in a table; the multiply by the row's scale stays per element, in float32.
  float table[256];
  for (int i = 0; i < 256; ++i)
    table[i] = d.dtype() == DType::kF8E4M3 ? f8e4m3_to_f32(static_cast<uint8_t>(i))
                                           : f8e5m2_to_f32(static_cast<uint8_t>(i));
  auto run_rows = [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float s = sc[ns == 1 ? 0 : r];
      const uint8_t* q = src + r * cols;
      float* y = dst + r * cols;
      for (int64_t c = 0; c < cols; ++c) y[c] = table[q[c]] * s;
    }
  };
  // Rows on several threads (a full-size model widens ~10 G weights this way, at load, with
  // LoRAs merged into an FP8 file); one thread for small tensors or when none can be started.
  const int64_t elems = rows * cols;
  const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int threads = static_cast<int>(
      std::min<int64_t>({std::min(hw, 16), rows, std::max<int64_t>(1, elems >> 20)}));
  const int64_t per = (rows + threads - 1) / threads;
  std::vector<std::jthread> pool;  // joined however this function is left
  int64_t handed = 0;              // rows [0, handed) run on the helper threads
  for (int t = 0; t + 1 < threads; ++t) {
    const int64_t r0 = handed, r1 = std::min(rows, r0 + per);
    if (r0 >= r1) break;
    try {
      pool.emplace_back(run_rows, r0, r1);
    } catch (const std::exception&) {
      break;  // no thread (or no memory for one): the rest on this thread
    }
    handed = r1;
  }
  run_rows(handed, rows);
  pool.clear();  // joins
  return out;
}

std::string Fp8Summary::describe() const {
  if (!any()) return "";
  std::string dtypes;
  for (const std::string& d : fp8_dtypes) dtypes += (dtypes.empty() ? "" : ", ") + d;
  std::string s = format + ": ";
  if (scaled_weights > 0) {
    s += std::to_string(scaled_weights) + " scaled FP8 weight(s)";
    if (per_row_scales > 0) s += " (" + std::to_string(per_row_scales) + " with per-row scales)";
  }
  if (plain_fp8 > 0) {
    s += std::string(scaled_weights > 0 ? ", " : "") + std::to_string(plain_fp8) +
         " unscaled FP8 tensor(s)";
  }
  if (input_scales > 0) s += ", " + std::to_string(input_scales) + " input scale(s) (unused)";
  return s + " [" + dtypes + "]";
}

Result<ScaledWeight> ScaledFp8Index::get(const std::string& weight) const {
  auto it = layers_.find(weight);
  if (it == layers_.end()) return NotFound("no scaled FP8 weight named " + q(weight));
  ScaledWeight w;
  ZI_ASSIGN_OR_RETURN(w.data, file_->tensor(it->second.raw_name));
  w.scale = it->second.scale;
  w.input_scale = it->second.input_scale;
  w.full_precision_mm = it->second.full_precision_mm;
  return w;
}

std::vector<std::string> ScaledFp8Index::names() const {
  std::vector<std::string> out;
  for (const auto& [n, e] : layers_) out.push_back(n);
  return out;
}

Result<Fp8Summary> apply_scaled_fp8(WeightStore& ws, const std::shared_ptr<SafetensorsFile>& file,
                                    const std::string& prefix, ScaledFp8Index* index) {
  const std::string where = file->path();
  const std::vector<std::string> names = ws.names();
  const std::set<std::string> present(names.begin(), names.end());
  Fp8Summary sum;

  // ---- per-layer configs: header metadata, then comfy_quant tensors ----
  std::map<std::string, LayerConf> conf;
  auto meta = file->metadata().find("_quantization_metadata");
  if (meta != file->metadata().end()) {
    const std::string origin = where + ": header metadata '_quantization_metadata'";
    ZI_ASSIGN_OR_RETURN(nlohmann::json root, json_util::parse_strict(meta->second, origin));
    auto layers = root.is_object() ? root.find("layers") : root.end();
    if (!root.is_object() || layers == root.end() || !layers->is_object())
      return FormatError(origin + ": expected an object with an object 'layers'");
    for (const auto& [layer, v] : layers->items()) {
      if (layer.compare(0, prefix.size(), prefix) != 0) continue;  // another component's
      const std::string name = layer.substr(prefix.size());
      ZI_ASSIGN_OR_RETURN(conf[name], parse_layer_conf(v, origin + ": layer " + q(layer)));
    }
  }
  for (const std::string& n : names) {
    if (!ends_with(n, ".comfy_quant")) continue;
    const std::string layer = n.substr(0, n.size() - 12);
    const std::string origin = where + ": " + q(prefix + n);
    ZI_ASSIGN_OR_RETURN(Tensor t, ws.get(n));
    if ((t.dtype() != DType::kU8 && t.dtype() != DType::kI8) || t.rank() != 1 || t.numel() > 65536)
      return FormatError(origin + ": expected a 1-D uint8 tensor of JSON text, got " +
                         dtype_name(t.dtype()) + " " + shape_string(t.shape()));
    const std::string text(static_cast<const char*>(t.data()), static_cast<size_t>(t.numel()));
    ZI_ASSIGN_OR_RETURN(nlohmann::json j, json_util::parse_strict(text, origin));
    ZI_ASSIGN_OR_RETURN(LayerConf c, parse_layer_conf(j, origin));
    auto [it, inserted] = conf.emplace(layer, c);
    if (!inserted && it->second.format != c.format)
      return FormatError(origin + ": format " + q(c.format) + " differs from " + it->second.origin +
                         "'s " + q(it->second.format));
    ZI_TRY(ws.remove(n));
  }

  const bool comfy_quant = !conf.empty();

  // ---- the legacy marker ----
  bool legacy = false, legacy_fpmm = false;
  if (present.count("scaled_fp8")) {
    ZI_ASSIGN_OR_RETURN(Tensor m, ws.get("scaled_fp8"));
    if (!is_fp8(m.dtype()) && m.dtype() != DType::kF32)
      return FormatError(where + ": marker " + q(prefix + "scaled_fp8") + " has dtype " +
                         dtype_name(m.dtype()) + ", expected an FP8 type (or f32)");
    legacy = true;
    legacy_fpmm = m.numel() == 2;  // ComfyUI: two elements = full_precision_matrix_mult
    ZI_TRY(ws.remove("scaled_fp8"));
  }

  // ---- scales ----
  std::map<std::string, std::string> weight_scale, input_scale;  // layer -> scale tensor name
  for (const std::string& n : names) {
    for (const char* suffix : {".scale_weight", ".weight_scale"}) {
      if (!ends_with(n, suffix)) continue;
      const std::string layer = n.substr(0, n.size() - 13);
      auto [it, inserted] = weight_scale.emplace(layer, n);
      if (!inserted)
        return FormatError(where + ": layer " + q(prefix + layer) + " has two weight scales (" +
                           q(prefix + it->second) + " and " + q(prefix + n) + ")");
      legacy = legacy || std::string(suffix) == ".scale_weight";
    }
    for (const char* suffix : {".scale_input", ".input_scale"}) {
      if (!ends_with(n, suffix)) continue;
      const std::string layer = n.substr(0, n.size() - 12);
      auto [it, inserted] = input_scale.emplace(layer, n);
      if (!inserted)
        return FormatError(where + ": layer " + q(prefix + layer) + " has two input scales (" +
                           q(prefix + it->second) + " and " + q(prefix + n) + ")");
    }
  }
  if (index) {
    index->file_ = file;
    index->layers_.clear();
  }

  for (const auto& [layer, scale_name] : weight_scale) {
    const std::string wname = layer + ".weight";
    const std::string what = where + ": " + q(prefix + wname);
    if (!present.count(wname))
      return FormatError(where + ": scale " + q(prefix + scale_name) + " has no weight " +
                         q(prefix + wname));
    ZI_ASSIGN_OR_RETURN(WeightInfo wi, ws.info(wname));
    if (!is_fp8(wi.dtype))
      return FormatError(what + " has dtype " + dtype_name(wi.dtype) + " but a scale " +
                         q(prefix + scale_name) + ": a scaled weight must be F8_E4M3 or F8_E5M2");
    if (wi.shape.empty() || wi.shape[0] < 1)
      return FormatError(what + " has shape " + shape_string(wi.shape) +
                         "; a scaled weight needs rows");
    bool fpmm = legacy_fpmm;
    auto c = conf.find(layer);
    if (c != conf.end()) {
      ZI_ASSIGN_OR_RETURN(DType want, format_dtype(c->second));
      if (want != wi.dtype)
        return FormatError(what + " is " + dtype_name(wi.dtype) + " but " + c->second.origin +
                           " says " + q(c->second.format));
      fpmm = c->second.full_precision_mm;
      conf.erase(c);
    }
    // The scale: per tensor ([], [1], [1, 1]) or per output row ([N], [N, 1]).
    const std::string swhat = where + ": scale " + q(prefix + scale_name);
    ZI_ASSIGN_OR_RETURN(Tensor st, ws.get(scale_name));
    const int64_t rows = wi.shape[0];
    const bool per_tensor = st.numel() == 1 && st.rank() <= 2;
    const bool per_row =
        !per_tensor && st.numel() == rows && (st.rank() == 1 || (st.rank() == 2 && st.dim(1) == 1));
    if (!per_tensor && !per_row)
      return FormatError(swhat + " has shape " + shape_string(st.shape()) +
                         "; expected one value ([] or [1]) or one per output row ([" +
                         std::to_string(rows) + "] or [" + std::to_string(rows) + ", 1]) of " +
                         q(prefix + wname) + " " + shape_string(wi.shape));
    ZI_ASSIGN_OR_RETURN(std::vector<float> sv, float_values(st, swhat));
    Tensor scale = Tensor::host(DType::kF32, {static_cast<int64_t>(sv.size())});
    if (!scale.defined()) return OutOfMemory(swhat);
    std::copy(sv.begin(), sv.end(), scale.data_as<float>());
    ZI_TRY(ws.remove(scale_name));

    float in_scale = 0.0f;
    auto in = input_scale.find(layer);
    if (in != input_scale.end()) {
      const std::string iwhat = where + ": input scale " + q(prefix + in->second);
      ZI_ASSIGN_OR_RETURN(Tensor it, ws.get(in->second));
      if (it.numel() != 1)
        return FormatError(iwhat + " has shape " + shape_string(it.shape()) +
                           ", expected one value");
      ZI_ASSIGN_OR_RETURN(std::vector<float> iv, float_values(it, iwhat));
      in_scale = iv[0];
      ++sum.input_scales;
      ZI_TRY(ws.remove(in->second));
      input_scale.erase(in);
    }

    const std::string raw = prefix + wname;
    ZI_TRY(ws.transform(wname, DType::kF32, [scale, raw](const Tensor& base) -> Result<Tensor> {
      ScaledWeight w;
      w.data = base;
      w.scale = scale;
      return dequantize_f32(w, raw);
    }));
    ZI_TRY(ws.set_fp8_source(wname, [file, raw, scale]() -> Result<Fp8StoredWeight> {
      ZI_ASSIGN_OR_RETURN(Tensor data, file->tensor(raw));
      return Fp8StoredWeight{data, scale};
    }));
    ++sum.scaled_weights;
    if (per_row) ++sum.per_row_scales;
    add_dtype(sum, wi.dtype);
    if (index) index->layers_[wname] = ScaledFp8Index::Entry{raw, scale, in_scale, fpmm};
  }

  // Layers marked quantised that have no scale; input scales of layers without one.
  for (const auto& [layer, c] : conf) {
    ZI_TRY(format_dtype(c).status());
    if (!present.count(layer + ".weight"))
      return FormatError(c.origin + ": names layer " + q(prefix + layer) +
                         ", which has no weight in the file");
    return FormatError(c.origin + ": layer " + q(prefix + layer) + " is marked " + q(c.format) +
                       " but has no weight_scale");
  }
  for (const auto& [layer, n] : input_scale) {
    ZI_ASSIGN_OR_RETURN(Tensor it, ws.get(n));
    ZI_ASSIGN_OR_RETURN(std::vector<float> iv, float_values(it, where + ": " + q(prefix + n)));
    // ComfyUI drops a legacy scale_input of 1 (no scaling); anything else needs a weight scale.
    if (!(ends_with(n, ".scale_input") && iv.size() == 1 && iv[0] == 1.0f))
      return FormatError(where + ": input scale " + q(prefix + n) + " belongs to layer " +
                         q(prefix + layer) + ", which has no weight scale");
    ZI_TRY(ws.remove(n));
  }

  for (const std::string& n : ws.names()) {
    auto info = ws.info(n);
    if (info.ok() && is_fp8(info->dtype)) {
      ++sum.plain_fp8;
      add_dtype(sum, info->dtype);
    }
  }
  if (legacy)
    sum.format = "comfy scaled_fp8 (legacy)";
  else if (sum.scaled_weights > 0 && comfy_quant)
    sum.format = "comfy quant";
  else if (sum.scaled_weights > 0)
    sum.format = "weight_scale";
  else if (sum.plain_fp8 > 0)
    sum.format = "fp8";
  return sum;
}

}  // namespace zimage
