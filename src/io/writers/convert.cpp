// See convert.h. Each component becomes a plan (output name, the stored tensors it is made of,
// shape, whether it is a block linear), then one file written tensor by tensor.
#include "io/writers/convert.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "core/dtype.h"
#include "core/thread_pool.h"
#include "io/gguf/gguf_quantize.h"
#include "io/gguf/gguf_writer.h"
#include "io/weights/safetensors.h"
#include "io/weights/weights.h"

namespace zimage {
namespace {

namespace fs = std::filesystem;

enum class Kind { kBf16, kFp8Tensor, kFp8Rows, kGguf };

struct Format {
  Kind kind = Kind::kBf16;
  GgmlType gguf = GgmlType::kF32;
  std::string name;
};

const std::pair<const char*, GgmlType> kGgufTypes[] = {{"q8_0", GgmlType::kQ8_0},
                                                       {"q4_0", GgmlType::kQ4_0},
                                                       {"q4_k", GgmlType::kQ4_K},
                                                       {"q5_k", GgmlType::kQ5_K},
                                                       {"q6_k", GgmlType::kQ6_K}};

Result<Format> parse_format(const std::string& f) {
  if (f == "bf16") return Format{Kind::kBf16, GgmlType::kF32, f};
  if (f == "fp8") return Format{Kind::kFp8Tensor, GgmlType::kF32, f};
  if (f == "fp8-rows") return Format{Kind::kFp8Rows, GgmlType::kF32, f};
  for (const auto& [n, t] : kGgufTypes)
    if (f == n) return Format{Kind::kGguf, t, f};
  return InvalidArgument("--format '" + f + "' is not one of " + convert_format_list());
}

bool starts_with(const std::string& s, const std::string& p) {
  return s.compare(0, p.size(), p) == 0;
}
bool ends_with(const std::string& s, const std::string& p) {
  return s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
}
void replace_once(std::string& s, const std::string& from, const std::string& to) {
  const size_t at = s.find(from);
  if (at != std::string::npos) s.replace(at, from.size(), to);
}

struct OutTensor {
  std::string name;              // in the output file
  std::vector<std::string> src;  // store tensors, row-concatenated
  Shape shape;                   // output shape
  bool quantize = false;         // a block's 2-D weight (FP8 / the GGUF type)
};

bool is_dit_block(const std::string& n) {
  return starts_with(n, "layers.") || starts_with(n, "noise_refiner.") ||
         starts_with(n, "context_refiner.");
}

Result<std::vector<OutTensor>> dit_plan(const WeightStore& ws, const TransformerConfig& c) {
  std::string pre;
  for (const char* cand : {"model.diffusion_model.", "diffusion_model."})
    if (ws.contains(std::string(cand) + "x_pad_token")) pre = cand;
  const std::string key = std::to_string(c.patch_size) + "-" + std::to_string(c.f_patch_size);
  std::vector<OutTensor> plan;
  for (const std::string& n : ws.names()) {
    const std::string rest = starts_with(n, pre) ? n.substr(pre.size()) : n;
    if (ends_with(rest, ".attention.to_k.weight") || ends_with(rest, ".attention.to_v.weight") ||
        rest == "norm_final.weight")
      continue;  // k, v go into the fused qkv; the Lumina-2 leftover is unused
    OutTensor t;
    t.name = rest;
    if (starts_with(t.name, "all_x_embedder." + key + "."))
      t.name = "x_embedder." + t.name.substr(16 + key.size());
    if (starts_with(t.name, "all_final_layer." + key + "."))
      t.name = "final_layer." + t.name.substr(17 + key.size());
    replace_once(t.name, ".attention.to_out.0.", ".attention.out.");
    replace_once(t.name, ".attention.norm_q.", ".attention.q_norm.");
    replace_once(t.name, ".attention.norm_k.", ".attention.k_norm.");
    ZI_ASSIGN_OR_RETURN(WeightInfo info, ws.info(n));
    t.shape = info.shape;
    t.src = {n};
    if (ends_with(rest, ".attention.to_q.weight")) {
      const std::string base = n.substr(0, n.size() - std::string("to_q.weight").size());
      t.src = {n, base + "to_k.weight", base + "to_v.weight"};
      replace_once(t.name, ".attention.to_q.weight", ".attention.qkv.weight");
      for (size_t i = 1; i < 3; ++i) {
        ZI_ASSIGN_OR_RETURN(WeightInfo part, ws.info(t.src[i]));
        if (part.shape.size() != 2 || info.shape.size() != 2 || part.shape[1] != info.shape[1])
          return FormatError(ws.path() + ": " + t.src[i] + " " + shape_string(part.shape) +
                             " does not fit next to " + n + " " + shape_string(info.shape));
        t.shape[0] += part.shape[0];
      }
    }
    // Every 2-D weight of a block: q|k|v, out, w1, w2, w3 and the adaLN projection (as ComfyUI's
    // scaled files and city96's GGUF files quantise them).
    t.quantize = is_dit_block(t.name) && t.shape.size() == 2 && ends_with(t.name, ".weight");
    plan.push_back(std::move(t));
  }
  return plan;
}

Result<std::vector<OutTensor>> te_plan(const WeightStore& ws) {
  std::vector<OutTensor> plan;
  for (const std::string& n : ws.names()) {
    OutTensor t;
    t.name = starts_with(n, "model.") || starts_with(n, "lm_head.") ? n : "model." + n;
    ZI_ASSIGN_OR_RETURN(WeightInfo info, ws.info(n));
    t.shape = info.shape;
    t.src = {n};
    bool linear = false;
    for (const char* p : {".self_attn.q_proj.weight", ".self_attn.k_proj.weight",
                          ".self_attn.v_proj.weight", ".self_attn.o_proj.weight",
                          ".mlp.gate_proj.weight", ".mlp.up_proj.weight", ".mlp.down_proj.weight"})
      linear = linear || ends_with(t.name, p);
    t.quantize = linear && starts_with(t.name, "model.layers.") && t.shape.size() == 2;
    plan.push_back(std::move(t));
  }
  return plan;
}

// diffusers AutoencoderKL names -> the original (Flux / ldm) names ComfyUI's ae.safetensors uses.
std::string ldm_name(const std::string& k, int levels, bool* to_conv) {
  std::string n = k;
  *to_conv = false;
  for (const std::string side : {"encoder", "decoder"}) {
    replace_once(n, side + ".conv_norm_out.", side + ".norm_out.");
    replace_once(n, side + ".mid_block.resnets.0.", side + ".mid.block_1.");
    replace_once(n, side + ".mid_block.resnets.1.", side + ".mid.block_2.");
    const std::string a = side + ".mid_block.attentions.0.";
    if (starts_with(n, a)) {
      std::string rest = n.substr(a.size());
      for (const auto& [d, l] :
           std::vector<std::pair<std::string, std::string>>{{"group_norm.", "norm."},
                                                            {"to_q.", "q."},
                                                            {"to_k.", "k."},
                                                            {"to_v.", "v."},
                                                            {"to_out.0.", "proj_out."}}) {
        if (starts_with(rest, d)) rest = l + rest.substr(d.size());
      }
      n = side + ".mid.attn_1." + rest;
      *to_conv = true;
    }
  }
  const std::pair<std::string, std::string> blocks[] = {{"encoder.down_blocks.", "encoder.down."},
                                                        {"decoder.up_blocks.", "decoder.up."}};
  for (const auto& [from, to] : blocks) {
    if (!starts_with(n, from)) continue;
    const std::string rest = n.substr(from.size());
    const size_t dot = rest.find('.');
    if (dot == std::string::npos || dot == 0) continue;
    int i = 0;
    for (char ch : rest.substr(0, dot)) {
      if (ch < '0' || ch > '9') return n;
      i = i * 10 + (ch - '0');
    }
    std::string tail = rest.substr(dot + 1);
    replace_once(tail, "resnets.", "block.");
    replace_once(tail, "downsamplers.0.", "downsample.");
    replace_once(tail, "upsamplers.0.", "upsample.");
    const int level = starts_with(from, "decoder") ? levels - 1 - i : i;  // ldm counts up
    n = to + std::to_string(level) + "." + tail;
  }
  replace_once(n, ".conv_shortcut.", ".nin_shortcut.");
  return n;
}

Result<std::vector<OutTensor>> vae_plan(const WeightStore& ws, const VaeConfig& c) {
  const int levels = static_cast<int>(c.block_out_channels.size());
  std::vector<OutTensor> plan;
  for (const std::string& n : ws.names()) {
    OutTensor t;
    bool to_conv = false;
    t.name = ldm_name(n, levels, &to_conv);
    ZI_ASSIGN_OR_RETURN(WeightInfo info, ws.info(n));
    t.shape = info.shape;
    if (to_conv && t.shape.size() == 2) t.shape = {t.shape[0], t.shape[1], 1, 1};
    t.src = {n};
    plan.push_back(std::move(t));
  }
  return plan;
}

// The float32 value of an output tensor (its sources row-concatenated).
Result<Tensor> read_f32(const WeightStore& ws, const OutTensor& t) {
  Tensor out = Tensor::host(DType::kF32, t.shape);
  if (!out.defined()) return OutOfMemory("host buffer for " + t.name + " " + shape_string(t.shape));
  int64_t at = 0;
  for (const std::string& s : t.src) {
    ZI_ASSIGN_OR_RETURN(Tensor v, ws.get(s));
    if (at + v.numel() > out.numel() ||
        !convert_to_f32(v.dtype(), v.data(), out.data_as<float>() + at,
                        static_cast<size_t>(v.numel())))
      return FormatError(ws.path() + ": tensor " + s + " " + v.describe() +
                         " cannot be converted to float32 for " + t.name);
    at += v.numel();
  }
  if (at != out.numel())
    return InternalError("convert: " + t.name + " got " + std::to_string(at) + " of " +
                         std::to_string(out.numel()) + " elements");
  return out;
}

// FP8 e4m3 of x with one scale per group of `per` elements (s = max|x| / 448, 1 for zeros).
void to_fp8(const float* x, int64_t groups, int64_t per, uint8_t* q, float* scale,
            ThreadPool& pool) {
  pool.parallel_for(groups, 1, [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g) {
      float amax = 0.0f;
      for (int64_t i = 0; i < per; ++i) amax = std::max(amax, std::fabs(x[g * per + i]));
      const float s = amax > 0.0f && std::isfinite(amax) ? amax / 448.0f : 1.0f;
      const float inv = 1.0f / s;
      scale[g] = s;
      for (int64_t i = 0; i < per; ++i)
        q[g * per + i] = f32_to_f8e4m3(std::clamp(x[g * per + i] * inv, -448.0f, 448.0f));
    }
  });
}

std::string layer_of(const std::string& weight) {
  return weight.substr(0, weight.size() - std::string(".weight").size());
}

constexpr char kComfyQuant[] = "{\"format\": \"float8_e4m3fn\"}";

Status check_not_input(const std::string& out, const std::set<std::string>& inputs) {
  std::error_code ec;
  if (!fs::exists(out, ec)) return Status::Ok();
  for (const std::string& in : inputs) {
    if (fs::equivalent(out, in, ec))
      return InvalidArgument("convert: the output " + out + " is an input file (" + in +
                             "); choose another --out folder");
  }
  return Status::Ok();
}

struct Writer {
  const WeightStore& ws;
  const Format& fmt;
  ThreadPool& pool;
  const ConvertOptions& o;
};

Result<ConvertedFile> write_safetensors_file(const Writer& w, const std::vector<OutTensor>& plan,
                                             const std::string& path, bool quantize) {
  const bool fp8 = quantize && w.fmt.kind != Kind::kBf16;
  const bool rows = w.fmt.kind == Kind::kFp8Rows;
  std::vector<SafetensorsEntry> entries;
  ConvertedFile cf;
  uint64_t total = 0;
  // Per tensor: a `.comfy_quant` record per layer; per row: the same records in the header's
  // `_quantization_metadata` (both are ComfyUI's current format).
  const size_t record = rows ? 0 : sizeof kComfyQuant - 1;
  nlohmann::json layers = nlohmann::json::object();
  for (const OutTensor& t : plan) {
    if (fp8 && t.quantize) {
      entries.push_back({t.name, DType::kF8E4M3, t.shape});
      entries.push_back(
          {layer_of(t.name) + ".weight_scale", DType::kF32, rows ? Shape{t.shape[0], 1} : Shape{}});
      if (record)
        entries.push_back(
            {layer_of(t.name) + ".comfy_quant", DType::kU8, {static_cast<int64_t>(record)}});
      else
        layers[layer_of(t.name)] = {{"format", "float8_e4m3fn"}};
      total += static_cast<uint64_t>(shape_numel(t.shape)) + 4 * (rows ? t.shape[0] : 1) + record;
      ++cf.quantized;
    } else {
      entries.push_back({t.name, DType::kBF16, t.shape});
      total += 2 * static_cast<uint64_t>(shape_numel(t.shape));
    }
  }
  std::map<std::string, std::string> metadata;
  if (!layers.empty())
    metadata["_quantization_metadata"] =
        nlohmann::json{{"format_version", "1.0"}, {"layers", layers}}.dump();
  ZI_ASSIGN_OR_RETURN(auto out, SafetensorsWriter::create(path, entries, metadata));
  uint64_t done = 0;
  for (const OutTensor& t : plan) {
    ZI_ASSIGN_OR_RETURN(Tensor f, read_f32(w.ws, t));
    const int64_t n = f.numel();
    if (fp8 && t.quantize) {
      const int64_t groups = rows ? t.shape[0] : 1;
      std::vector<uint8_t> q(static_cast<size_t>(n));
      std::vector<float> scale(static_cast<size_t>(groups));
      to_fp8(f.data_as<float>(), groups, n / groups, q.data(), scale.data(), w.pool);
      ZI_TRY(out->write(q.data(), q.size()));
      ZI_TRY(out->write(scale.data(), scale.size() * 4));
      if (record) ZI_TRY(out->write(kComfyQuant, record));
      done += q.size() + scale.size() * 4 + record;
    } else {
      std::vector<uint16_t> b(static_cast<size_t>(n));
      const float* x = f.data_as<float>();
      w.pool.parallel_for(n, 1 << 16, [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) b[i] = f32_to_bf16(x[i]);
      });
      ZI_TRY(out->write(b.data(), b.size() * 2));
      done += b.size() * 2;
    }
    ++cf.tensors;
    if (w.o.progress) w.o.progress(path, done, total);
  }
  ZI_TRY(out->finish());
  cf.path = path;
  cf.bytes = total;
  return cf;
}

// The chosen type where the row fits its blocks; a K-quant on a row that is not a multiple of 256
// falls back to Q8_0 (llama.cpp also falls back, to legacy quants); else F32 / BF16.
GgmlType gguf_type_of(const OutTensor& t, GgmlType chosen) {
  const int64_t numel = shape_numel(t.shape);
  if (t.quantize && t.shape.size() == 2) {
    if (t.shape[1] % ggml_type_info(chosen)->block_size == 0) return chosen;
    if (t.shape[1] % 32 == 0) return GgmlType::kQ8_0;
  }
  if (t.shape.size() <= 1 || numel < 4096) return GgmlType::kF32;
  return GgmlType::kBF16;
}

Result<ConvertedFile> write_gguf_file(const Writer& w, const std::vector<OutTensor>& plan,
                                      const std::string& path) {
  std::vector<GgufWriteTensor> specs;
  ConvertedFile cf;
  for (const OutTensor& t : plan) {
    const GgmlType type = gguf_type_of(t, w.fmt.gguf);
    specs.push_back({t.name, type, t.shape.empty() ? Shape{1} : t.shape});
    if (ggml_type_is_quantized(type)) ++cf.quantized;
  }
  GgufWriteMetadata meta;
  meta.strings = {{"general.architecture", "lumina2"},
                  {"general.name", "Z-Image (zimage convert)"}};
  meta.u32s = {{"general.quantization_version", 2}};
  ZI_ASSIGN_OR_RETURN(auto out, GgufWriter::create(path, meta, specs));
  uint64_t total = 0, done = 0;
  for (size_t i = 0; i < specs.size(); ++i) total += out->tensor_bytes(i);
  for (size_t i = 0; i < plan.size(); ++i) {
    ZI_ASSIGN_OR_RETURN(Tensor f, read_f32(w.ws, plan[i]));
    const Shape& shape = specs[i].shape;
    const int64_t cols = shape.back(), rows = f.numel() / cols;
    uint64_t row_bytes = 0;
    if (!ggml_row_bytes(specs[i].type, cols, &row_bytes))
      return InternalError("convert: " + plan[i].name + " does not fit its GGUF type");
    std::vector<uint8_t> q(static_cast<size_t>(row_bytes * rows));
    const float* x = f.data_as<float>();
    bool ok = true;
    w.pool.parallel_for(rows, 4, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r)
        if (!quantize_row(specs[i].type, x + r * cols, q.data() + r * row_bytes, cols)) ok = false;
    });
    if (!ok) return InternalError("convert: quantising " + plan[i].name + " failed");
    if (!q.empty()) ZI_TRY(out->write(q.data(), q.size()));
    done += q.size();
    ++cf.tensors;
    if (w.o.progress) w.o.progress(path, done, total);
  }
  ZI_TRY(out->finish());
  cf.path = path;
  cf.bytes = total;
  return cf;
}

}  // namespace

std::string convert_format_list() {
  return "bf16, fp8, fp8-rows, q8_0, q4_0, q4_k, q5_k, q6_k";
}

Result<std::vector<ConvertedFile>> convert_model(const ModelSource& src, const ConvertOptions& o) {
  ZI_ASSIGN_OR_RETURN(Format fmt, parse_format(o.format));
  if (o.out_dir.empty()) return InvalidArgument("convert: --out is required");
  std::error_code ec;
  fs::create_directories(o.out_dir, ec);
  if (ec || !fs::is_directory(o.out_dir))
    return InvalidArgument("convert: cannot create the output folder " + o.out_dir + ": " +
                           ec.message());
  const bool gguf = fmt.kind == Kind::kGguf;
  const std::string suffix = fmt.kind == Kind::kBf16 ? "bf16" : "fp8_scaled";
  struct Job {
    Component c;
    bool on;
    std::string file;
  };
  std::vector<Job> jobs = {
      {Component::kTransformer, o.transformer,
       gguf ? "z_image_turbo-" + ggml_type_name(fmt.gguf) + ".gguf"
            : "z_image_turbo_" + suffix + ".safetensors"},
      {Component::kTextEncoder, o.text_encoder && !gguf,
       fmt.kind == Kind::kBf16 ? "qwen_3_4b.safetensors" : "qwen_3_4b_fp8_scaled.safetensors"},
      {Component::kVae, o.vae && !gguf, "ae.safetensors"}};
  if (fmt.kind == Kind::kFp8Rows) {
    jobs[0].file = "z_image_turbo_fp8_scaled_rows.safetensors";
    jobs[1].file = "qwen_3_4b_fp8_scaled_rows.safetensors";
  }
  // Every input file, so no output replaces one.
  std::set<std::string> inputs;
  for (const Job& j : jobs) {
    ZI_ASSIGN_OR_RETURN(WeightStore ws, src.open_weights(j.c));
    for (const std::string& f : ws.files()) inputs.insert(f);
    if (!src.file(j.c).empty()) inputs.insert(src.file(j.c));
  }
  for (const Job& j : jobs)
    if (j.on) ZI_TRY(check_not_input(o.out_dir + "/" + j.file, inputs));

  ThreadPool pool(o.threads);
  std::vector<ConvertedFile> files;
  for (const Job& j : jobs) {
    if (!j.on) continue;
    ZI_ASSIGN_OR_RETURN(WeightStore ws, src.open_weights(j.c));
    std::vector<OutTensor> plan;
    if (j.c == Component::kTransformer) {
      ZI_ASSIGN_OR_RETURN(plan, dit_plan(ws, src.configs().transformer));
    } else if (j.c == Component::kTextEncoder) {
      ZI_ASSIGN_OR_RETURN(plan, te_plan(ws));
    } else {
      ZI_ASSIGN_OR_RETURN(plan, vae_plan(ws, src.configs().vae));
    }
    const Writer w{ws, fmt, pool, o};
    const std::string path = o.out_dir + "/" + j.file;
    Result<ConvertedFile> cf = gguf ? write_gguf_file(w, plan, path)
                                    : write_safetensors_file(w, plan, path, j.c != Component::kVae);
    if (!cf.ok()) return cf.status().with_context("writing " + path);
    cf->component = component_name(j.c);
    files.push_back(std::move(cf).value());
  }
  return files;
}

}  // namespace zimage
