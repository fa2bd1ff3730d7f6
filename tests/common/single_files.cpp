// See single_files.h. Every rule here mirrors tools/make_single_file_cases.py; the manifest check
// (compare_with_manifest) is what keeps the two in step.
#include "common/single_files.h"

#include <zlib.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <tuple>

#include "core/dtype.h"
#include "io/fs/json_util.h"
#include "io/weights/safetensors.h"
#include "io/weights/weights.h"

namespace zimage::test {
namespace {

using Tensors = std::vector<std::pair<std::string, Tensor>>;

bool starts_with(const std::string& s, const std::string& p) {
  return s.compare(0, p.size(), p) == 0;
}

bool contains(const std::string& s, const std::string& p) {
  return s.find(p) != std::string::npos;
}

void replace(std::string& s, const std::string& from, const std::string& to) {
  const size_t at = s.find(from);
  if (at != std::string::npos) s.replace(at, from.size(), to);
}

Result<Tensors> read_all(const std::string& dir) {
  ZI_ASSIGN_OR_RETURN(WeightStore ws, WeightStore::open(dir));
  Tensors out;
  for (const std::string& n : ws.names()) {
    ZI_ASSIGN_OR_RETURN(Tensor t, ws.get(n));
    out.emplace_back(n, t);
  }
  return out;
}

const Tensor* find(const Tensors& ts, const std::string& name) {
  for (const auto& [n, t] : ts)
    if (n == name) return &t;
  return nullptr;
}

Tensor concat_rows(const std::vector<const Tensor*>& parts) {
  int64_t rows = 0;
  for (const Tensor* p : parts) rows += p->dim(0);
  Tensor out = Tensor::host(parts[0]->dtype(), {rows, parts[0]->dim(1)});
  size_t at = 0;
  for (const Tensor* p : parts) {
    std::memcpy(static_cast<char*>(out.data()) + at, p->data(), p->nbytes());
    at += p->nbytes();
  }
  return out;
}

Tensors dit_to_comfy(const Tensors& sd) {
  Tensors out;
  for (const auto& [k, v] : sd) {
    if (contains(k, ".attention.to_k.") || contains(k, ".attention.to_v.")) continue;
    std::string n = k;
    replace(n, "all_x_embedder.2-1.", "x_embedder.");
    replace(n, "all_final_layer.2-1.", "final_layer.");
    replace(n, ".attention.to_out.0.", ".attention.out.");
    replace(n, ".attention.norm_q.", ".attention.q_norm.");
    replace(n, ".attention.norm_k.", ".attention.k_norm.");
    Tensor t = v;
    if (contains(k, ".attention.to_q.weight")) {
      const std::string p = k.substr(0, k.size() - std::string("to_q.weight").size());
      replace(n, ".attention.to_q.weight", ".attention.qkv.weight");
      t = concat_rows(
          {find(sd, p + "to_q.weight"), find(sd, p + "to_k.weight"), find(sd, p + "to_v.weight")});
    }
    out.emplace_back(n, t);
  }
  return out;
}

Tensors vae_to_ldm(const Tensors& sd, int levels) {
  Tensors out;
  for (const auto& [k, v] : sd) {
    std::string n = k;
    Tensor t = v;
    for (const std::string side : {"encoder", "decoder"}) {
      replace(n, side + ".conv_norm_out.", side + ".norm_out.");
      replace(n, side + ".mid_block.resnets.0.", side + ".mid.block_1.");
      replace(n, side + ".mid_block.resnets.1.", side + ".mid.block_2.");
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
        if (t.rank() == 2) t = t.view({t.dim(0), t.dim(1), 1, 1});
      }
    }
    for (const auto& [from, to, reverse] : std::vector<std::tuple<std::string, std::string, bool>>{
             {"encoder.down_blocks.", "encoder.down.", false},
             {"decoder.up_blocks.", "decoder.up.", true}}) {
      if (!starts_with(n, from)) continue;
      const std::string rest = n.substr(from.size());
      const size_t dot = rest.find('.');
      int i = std::stoi(rest.substr(0, dot));
      std::string tail = rest.substr(dot + 1);
      replace(tail, "resnets.", "block.");
      replace(tail, "downsamplers.0.", "downsample.");
      replace(tail, "upsamplers.0.", "upsample.");
      n = to + std::to_string(reverse ? levels - 1 - i : i) + "." + tail;
    }
    replace(n, ".conv_shortcut.", ".nin_shortcut.");
    out.emplace_back(n, t);
  }
  return out;
}

Tensor f32_of(const Tensor& t) {
  Tensor out = Tensor::host(DType::kF32, t.shape());
  convert_to_f32(t.dtype(), t.data(), out.data_as<float>(), static_cast<size_t>(t.numel()));
  return out;
}

Tensor cast(const Tensor& t, DType to) {
  const Tensor f = f32_of(t);
  Tensor out = Tensor::host(to, t.shape());
  convert_from_f32(to, f.data_as<float>(), out.data(), static_cast<size_t>(t.numel()));
  return out;
}

Tensor scalar(float v, Shape shape = {}) {
  Tensor t = Tensor::host(DType::kF32, std::move(shape));
  t.data_as<float>()[0] = v;
  return t;
}

// scale = float32(amax) / 448 (1 when amax is 0), inv = 1 / scale, q = e4m3(w * inv).
std::pair<Tensor, Tensor> quantise(const Tensor& w, bool per_row) {
  const Tensor f = f32_of(w);
  const int64_t rows = w.dim(0), cols = w.dim(1);
  Tensor q = Tensor::host(DType::kF8E4M3, w.shape());
  Tensor scale = per_row ? Tensor::host(DType::kF32, {rows, 1}) : Tensor::host(DType::kF32, {});
  const float* x = f.data_as<float>();
  auto* out = static_cast<uint8_t*>(q.data());
  const int64_t groups = per_row ? rows : 1, per = per_row ? cols : rows * cols;
  for (int64_t g = 0; g < groups; ++g) {
    float amax = 0.0f;
    for (int64_t i = 0; i < per; ++i) amax = std::max(amax, std::fabs(x[g * per + i]));
    const float s = amax > 0.0f ? amax / 448.0f : 1.0f;
    const float inv = 1.0f / s;
    scale.data_as<float>()[g] = s;
    for (int64_t i = 0; i < per; ++i) out[g * per + i] = f32_to_f8e4m3(x[g * per + i] * inv);
  }
  return {q, scale};
}

bool is_block_linear(const std::string& n, const Tensor& v) {
  return (starts_with(n, "layers.") || starts_with(n, "noise_refiner.") ||
          starts_with(n, "context_refiner.")) &&
         n.size() > 7 && n.compare(n.size() - 7, 7, ".weight") == 0 && v.rank() == 2;
}

Tensor comfy_quant() {
  const std::string j = "{\"format\": \"float8_e4m3fn\"}";  // json.dumps spelling
  Tensor t = Tensor::host(DType::kU8, {static_cast<int64_t>(j.size())});
  std::memcpy(t.data(), j.data(), j.size());
  return t;
}

std::string layer_of(const std::string& weight) {
  return weight.substr(0, weight.size() - 7);  // minus ".weight"
}

}  // namespace

std::string single_file_data_dir() {
  return std::string(ZIMAGE_TEST_DATA_DIR) + "/single_file";
}

Result<std::map<std::string, std::string>> write_single_file_cases(const std::string& model_dir,
                                                                   const std::string& out_dir) {
  ZI_ASSIGN_OR_RETURN(Tensors dit_d, read_all(model_dir + "/transformer"));
  ZI_ASSIGN_OR_RETURN(Tensors te_d, read_all(model_dir + "/text_encoder"));
  ZI_ASSIGN_OR_RETURN(Tensors vae_d, read_all(model_dir + "/vae"));
  ZI_ASSIGN_OR_RETURN(nlohmann::json vcfg, json_util::read_file(model_dir + "/vae/config.json"));
  const Tensors dit = dit_to_comfy(dit_d);
  Tensors te;
  for (const auto& [k, v] : te_d) te.emplace_back("model." + k, v);
  const Tensors vae = vae_to_ldm(vae_d, static_cast<int>(vcfg["block_out_channels"].size()));

  std::map<std::string, std::pair<Tensors, std::map<std::string, std::string>>> files;
  files["dit_bf16"] = {dit, {}};
  files["te_bf16"] = {te, {}};
  files["vae_ldm"] = {vae, {}};
  Tensors aio;
  for (const auto& [k, v] : dit) aio.emplace_back("model.diffusion_model." + k, v);
  const int64_t dim = find(dit, "x_embedder.weight")->dim(0);
  Tensor nf = Tensor::host(DType::kF32, {dim});
  for (int64_t i = 0; i < dim; ++i) nf.data_as<float>()[i] = 1.0f;
  aio.emplace_back("model.diffusion_model.norm_final.weight", cast(nf, DType::kBF16));
  for (const auto& [k, v] : te) aio.emplace_back("text_encoders.qwen3_4b.transformer." + k, v);
  for (const auto& [k, v] : vae) aio.emplace_back("vae." + k, v);
  files["all_in_one"] = {aio, {}};
  for (const auto& [name, dt] :
       {std::pair{"dit_fp8_e4m3", DType::kF8E4M3}, std::pair{"dit_fp8_e5m2", DType::kF8E5M2}}) {
    Tensors t;
    for (const auto& [k, v] : dit) t.emplace_back(k, is_block_linear(k, v) ? cast(v, dt) : v);
    files[name] = {t, {}};
  }

  Tensors legacy, current, rows;
  nlohmann::json layers = nlohmann::json::object();
  for (const auto& [k, v] : dit) {
    if (!is_block_linear(k, v)) {
      for (Tensors* sd : {&legacy, &current, &rows}) sd->emplace_back(k, v);
      continue;
    }
    const std::string layer = layer_of(k);
    auto [q, s] = quantise(v, false);
    legacy.emplace_back(k, q);
    legacy.emplace_back(layer + ".scale_weight", s);
    legacy.emplace_back(layer + ".scale_input", scalar(1.0f));
    current.emplace_back(k, q);
    current.emplace_back(layer + ".weight_scale", s);
    current.emplace_back(layer + ".comfy_quant", comfy_quant());
    auto [qr, sr] = quantise(v, true);
    rows.emplace_back(k, qr);
    rows.emplace_back(layer + ".weight_scale", sr);
    layers[layer] = {{"format", "float8_e4m3fn"}};
  }
  legacy.emplace_back("scaled_fp8", Tensor::host(DType::kF8E4M3, {0}));
  for (const char* layer : {"layers.0.feed_forward.w1", "layers.0.feed_forward.w3"})
    current.emplace_back(std::string(layer) + ".input_scale", scalar(0.03125f));
  files["dit_scaled_legacy"] = {legacy, {}};
  files["dit_scaled"] = {current, {}};
  files["dit_scaled_rows"] = {
      rows,
      {{"_quantization_metadata",
        nlohmann::json{{"format_version", "1.0"}, {"layers", layers}}.dump()}}};

  Tensors mixed;
  for (const auto& [k, v] : te) {
    const bool quant = v.rank() == 2 && starts_with(k, "model.layers.") &&
                       (starts_with(k, "model.layers.1.") || !contains(k, ".down_proj."));
    if (!quant) {
      mixed.emplace_back(k, v);
      continue;
    }
    auto [q, s] = quantise(v, false);
    mixed.emplace_back(k, q);
    mixed.emplace_back(layer_of(k) + ".weight_scale", s);
    mixed.emplace_back(layer_of(k) + ".comfy_quant", comfy_quant());
  }
  files["te_fp8_mixed"] = {mixed, {}};

  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  std::map<std::string, std::string> paths;
  for (const auto& [name, content] : files) {
    const std::string path = out_dir + "/" + name + ".safetensors";
    ZI_TRY(write_safetensors(path, content.first, content.second));
    paths[name] = path;
  }
  return paths;
}

std::vector<std::string> compare_with_manifest(const std::string& path,
                                               const nlohmann::json& entry) {
  std::vector<std::string> diffs;
  auto file = SafetensorsFile::open(path);
  if (!file.ok()) return {file.status().to_string()};
  const auto& want = entry.at("tensors");
  for (const auto& t : (*file)->tensors()) {
    if (!want.contains(t.name)) {
      diffs.push_back("extra tensor " + t.name);
      continue;
    }
    const auto& w = want.at(t.name);
    auto view = (*file)->tensor(t.name);
    if (!view.ok()) {
      diffs.push_back(view.status().to_string());
      continue;
    }
    const uint32_t crc = static_cast<uint32_t>(
        crc32(0L, static_cast<const Bytef*>(view->data()), static_cast<uInt>(view->nbytes())));
    if (w[0].get<std::string>() != dtype_to_safetensors(t.dtype))
      diffs.push_back(t.name + ": dtype " + dtype_to_safetensors(t.dtype) + " vs " +
                      w[0].get<std::string>());
    if (w[1].get<Shape>() != t.shape)
      diffs.push_back(t.name + ": shape " + shape_string(t.shape) + " vs " + w[1].dump());
    if (w[2].get<uint32_t>() != crc) diffs.push_back(t.name + ": bytes differ (CRC-32)");
  }
  for (const auto& [name, w] : want.items())
    if (!(*file)->contains(name)) diffs.push_back("missing tensor " + name);
  const auto& md = entry.at("metadata");
  std::map<std::string, std::string> got = (*file)->metadata();
  if (md.size() != got.size()) diffs.push_back("header metadata keys differ");
  for (const auto& [k, v] : md.items()) {
    auto it = got.find(k);
    if (it == got.end()) {
      diffs.push_back("metadata " + k + " missing");
      continue;
    }
    // compared as JSON values: key order is the writer's
    const auto a = nlohmann::json::parse(v.get<std::string>(), nullptr, false);
    const auto b = nlohmann::json::parse(it->second, nullptr, false);
    if (a != b) diffs.push_back("metadata " + k + " differs");
  }
  return diffs;
}

}  // namespace zimage::test
