// The v_turbo DiT and text encoder read from GGUF files (tools/make_gguf_cases.py): the DiT as
// city96's ComfyUI-GGUF writes it (arch lumina2, ComfyUI names with the fused qkv, an orig_shape
// record), the text encoder as llama.cpp writes it (arch qwen3, token_embd / blk.N.* names), both
// quantised (Q8_0, Q4_K, Q6_K, Q5_0, Q5_1, Q4_0, Q4_1) where the row length allows and F32 / F16 /
// BF16 elsewhere.
//   1. Every weight the loaders fetch, under its diffusers / transformers name, equals the gguf
//      package's numpy dequantisation bit for bit (CRC-32 of the float32 bytes and the first
//      values, recorded by the script).
//   2. The GGUF model gives exactly the output of the same model loaded from a safetensors folder
//      holding those (package-equal) weights under the diffusers / transformers names.
//   3. It stays close to the unquantised golden model (stated bound: the quantisation error).
//   4. A model folder whose transformer/ and text_encoder/ hold these .gguf files (next to their
//      config.json) generates, through the public Engine, exactly the image of the folder holding
//      the same weights as safetensors.
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "common/npy.h"
#include "common/tiny_engine.h"
#include "golden_models_util.h"
#include "io/weights/safetensors.h"
#include "io/weights/weights.h"
#include "zimage/zimage.h"

namespace zimage {
namespace {

using namespace golden;  // NOLINT: the helpers read as the test's own vocabulary
using test::max_abs_diff;
using TensorList = std::vector<std::pair<std::string, Tensor>>;

std::string models_dir() {
  return std::string(ZIMAGE_GGUF_DIR) + "/models";
}

nlohmann::json read_ref(const std::string& name) {
  std::ifstream f(models_dir() + "/" + name);
  EXPECT_TRUE(f.good()) << "missing " << models_dir() << "/" << name;
  return f.good() ? nlohmann::json::parse(f) : nlohmann::json::object();
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string replace_once(std::string s, const std::string& from, const std::string& to) {
  const size_t p = s.find(from);
  if (p != std::string::npos) s.replace(p, from.size(), to);
  return s;
}

// Host float32 copy of rows [row0, row0 + rows) of a store tensor (rows < 0: all of it).
Tensor f32_rows(const WeightStore& ws, const std::string& name, int64_t row0, int64_t rows) {
  auto t = ws.get(name);
  EXPECT_TRUE(t.ok()) << t.status().to_string();
  if (!t.ok()) return Tensor();
  Shape shape = t->shape();
  const int64_t inner = shape.empty() ? 1 : t->numel() / shape[0];
  if (rows >= 0) shape[0] = rows;
  Tensor out = Tensor::host(DType::kF32, shape);
  const size_t esz = dtype_size(t->dtype());
  const auto* src = static_cast<const uint8_t*>(t->data()) + (rows >= 0 ? row0 * inner * esz : 0);
  EXPECT_TRUE(
      convert_to_f32(t->dtype(), src, out.data_as<float>(), static_cast<size_t>(out.numel())));
  return out;
}

uint32_t crc_of(const Tensor& f32) {
  return static_cast<uint32_t>(
      crc32(0L, static_cast<const Bytef*>(f32.data()), static_cast<uInt>(f32.nbytes())));
}

// Checks `t` against the script's record for `name` (shape, CRC-32 of the f32 bytes, first values).
void expect_matches_record(const std::string& name, const Tensor& t, const nlohmann::json& rec) {
  ASSERT_TRUE(t.defined()) << name;
  EXPECT_EQ(t.shape(), rec["shape"].get<Shape>()) << name;
  const auto first = rec["first"].get<std::vector<double>>();
  for (size_t k = 0; k < first.size() && static_cast<int64_t>(k) < t.numel(); ++k)
    EXPECT_EQ(t.data_as<float>()[k], static_cast<float>(first[k])) << name << " element " << k;
  EXPECT_EQ(crc_of(t), rec["crc32"].get<uint32_t>()) << name;
}

// The DiT's weights under their diffusers names, read from the GGUF store: ComfyUI names, q/k/v
// as row blocks of the fused qkv. `used` collects the store names read.
TensorList dit_weights_by_diffusers_name(const WeightStore& ws, const nlohmann::json& ref,
                                         int64_t dim, std::set<std::string>* used) {
  TensorList out;
  for (const auto& [name, rec] : ref.items()) {
    std::string src = name;
    int64_t row0 = 0, rows = -1;
    for (int p = 0; p < 3; ++p) {
      const std::string part = std::string("attention.to_") + "qkv"[p] + ".weight";
      if (ends_with(name, part)) {
        src = name.substr(0, name.size() - part.size()) + "attention.qkv.weight";
        row0 = p * dim;
        rows = dim;
      }
    }
    src = replace_once(src, "all_x_embedder.2-1.", "x_embedder.");
    src = replace_once(src, "all_final_layer.2-1.", "final_layer.");
    src = replace_once(src, "attention.to_out.0.", "attention.out.");
    src = replace_once(src, "attention.norm_q.", "attention.q_norm.");
    src = replace_once(src, "attention.norm_k.", "attention.k_norm.");
    used->insert(src);
    out.emplace_back(name, f32_rows(ws, src, row0, rows));
  }
  return out;
}

std::string write_folder(const std::string& tag, const TensorList& tensors) {
  const std::string dir =
      ::testing::TempDir() + "zimage_gguf_models_" + std::to_string(getpid()) + "_" + tag;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const Status st = write_safetensors(dir + "/model.safetensors", tensors);
  EXPECT_TRUE(st.ok()) << st.to_string();
  return dir;
}

double cosine(const Tensor& a, const Tensor& b) {
  double dot = 0, na = 0, nb = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double x = a.data_as<float>()[i], y = b.data_as<float>()[i];
    dot += x * y, na += x * x, nb += y * y;
  }
  return dot / std::sqrt(na * nb);
}

TEST(GgufModels, DiTWeightsEqualTheGgufPackagesDequantisation) {
  const Case c = load_case("v_turbo");
  const nlohmann::json ref = read_ref("dit_ref.json");
  auto ws = WeightStore::open(models_dir() + "/dit.gguf");
  ASSERT_TRUE(ws.ok()) << ws.status().to_string();
  std::set<std::string> used;
  const TensorList w = dit_weights_by_diffusers_name(*ws, ref, c.dit.dim, &used);
  ASSERT_EQ(w.size(), ref.size());
  for (const auto& [name, t] : w) expect_matches_record(name, t, ref[name]);
  // Every tensor of the file was checked.
  const std::vector<std::string> names = ws->names();
  EXPECT_EQ(std::set<std::string>(names.begin(), names.end()), used);
  std::printf("[ gguf ] DiT: %zu weights equal the gguf package's dequantisation (CRC-32)\n",
              w.size());
}

TEST(GgufModels, DiTFromGgufEqualsTheFolderModelWithTheSameWeights) {
  const Case c = load_case("v_turbo");
  const std::string gguf = models_dir() + "/dit.gguf";
  auto ws = WeightStore::open(gguf);
  ASSERT_TRUE(ws.ok()) << ws.status().to_string();
  std::set<std::string> used;
  const std::string folder = write_folder(
      "dit", dit_weights_by_diffusers_name(*ws, read_ref("dit_ref.json"), c.dit.dim, &used));
  auto gguf_dit = load_dit(c, gguf);
  auto folder_dit = load_dit(c, folder);
  auto golden_dit = load_dit(c);
  ASSERT_TRUE(gguf_dit && folder_dit && golden_dit);
  const Tensor lat = to_device(npy(c.dir + "/init_noise.npy"));
  const std::vector<Tensor> caps{to_device(npy(c.dir + "/prompt_embeds_0.npy"))};
  for (float t : {t_model_at(c.steps, 0), 0.75f}) {
    Tensor a, b, g;
    ASSERT_TRUE(gguf_dit->forward(lat, {t}, caps, a).ok());
    ASSERT_TRUE(folder_dit->forward(lat, {t}, caps, b).ok());
    ASSERT_TRUE(golden_dit->forward(lat, {t}, caps, g).ok());
    const Tensor ha = to_host(a), hb = to_host(b), hg = to_host(g);
    const double err = max_abs_diff(ha, hb);
    report("gguf-vs-folder dit t=" + std::to_string(t), err);
    EXPECT_EQ(err, 0.0);
    // Against the unquantised model: the quantisation error only.
    const double cos = cosine(ha, hg);
    std::printf(
        "[ gguf ] quantised DiT vs bf16 golden DiT (t=%.3f): cosine %.6f, max |diff| %.4g\n", t,
        cos, max_abs_diff(ha, hg));
    EXPECT_GT(cos, 0.99);
  }
  std::filesystem::remove_all(folder);
}

TEST(GgufModels, TextEncoderWeightsEqualTheGgufPackagesDequantisation) {
  const nlohmann::json ref = read_ref("te_ref.json");
  auto ws = WeightStore::open(models_dir() + "/te.gguf");
  ASSERT_TRUE(ws.ok()) << ws.status().to_string();
  // llama.cpp names were renamed to exactly the transformers names the script recorded.
  std::vector<std::string> expected;
  for (const auto& [name, rec] : ref.items()) expected.push_back(name);
  EXPECT_EQ(ws->names(), expected);
  for (const auto& [name, rec] : ref.items())
    expect_matches_record(name, f32_rows(*ws, name, 0, -1), rec);
}

TEST(GgufModels, TextEncoderFromGgufEqualsTheFolderModelWithTheSameWeights) {
  const Case c = load_case("v_turbo");
  const std::string gguf = models_dir() + "/te.gguf";
  auto ws = WeightStore::open(gguf);
  ASSERT_TRUE(ws.ok()) << ws.status().to_string();
  TensorList w;
  for (const std::string& name : ws->names()) w.emplace_back(name, f32_rows(*ws, name, 0, -1));
  const std::string folder = write_folder("te", w);
  auto gguf_te = load_te(c, gguf);
  auto folder_te = load_te(c, folder);
  ASSERT_TRUE(gguf_te && folder_te);
  auto a = gguf_te->encode(c.ids);
  auto b = folder_te->encode(c.ids);
  ASSERT_TRUE(a.ok() && b.ok());
  const Tensor ha = to_host((*a)[0]), hb = to_host((*b)[0]);
  const double err = max_abs_diff(ha, hb);
  report("gguf-vs-folder text encoder", err);
  EXPECT_EQ(err, 0.0);
  // The prompt's embedding rows are the golden ones (quantised): close to the golden encoder.
  const Tensor ref = npy(c.dir + "/prompt_embeds_0.npy");
  const double cos = cosine(ha, ref);
  std::printf("[ gguf ] quantised text encoder vs bf16 golden: cosine %.6f, max |diff| %.4g\n", cos,
              max_abs_diff(ha, ref));
  EXPECT_GT(cos, 0.99);
  std::filesystem::remove_all(folder);
}

// Copies the tiny model folder to `dir`, replacing the weight file of `component` by `weights`
// (a path to copy, keeping its file name).
void replace_weights(const std::string& dir, const std::string& component,
                     const std::string& weights) {
  std::vector<std::filesystem::path> old;
  for (const auto& e : std::filesystem::directory_iterator(dir + "/" + component)) {
    const std::string n = e.path().filename().string();
    if (ends_with(n, ".safetensors") || ends_with(n, ".safetensors.index.json"))
      old.push_back(e.path());
  }
  for (const auto& p : old) std::filesystem::remove(p);
  std::filesystem::copy_file(
      weights, dir + "/" + component + "/" + std::filesystem::path(weights).filename().string());
}

Image generate_one(const std::string& model_dir) {
  EngineOptions o;
  o.model_dir = model_dir;
  o.device = "cpu";
  o.threads = 2;
  auto e = Engine::load(o);
  EXPECT_TRUE(e.ok()) << e.status().to_string();
  if (!e.ok()) return Image();
  GenerateRequest req;
  req.prompts = {"a cat sitting on a red sofa, photo"};
  req.width = req.height = 32;
  req.steps = 2;
  req.seed = 7;
  auto r = (*e)->generate(req);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? r->images[0] : Image();
}

TEST(GgufModels, PipelineFromGgufComponentsEqualsTheSafetensorsFolder) {
  const Case c = load_case("v_turbo");
  const std::string root =
      ::testing::TempDir() + "zimage_gguf_pipeline_" + std::to_string(getpid());
  std::filesystem::remove_all(root);
  std::filesystem::create_directories(root);
  const auto opts = std::filesystem::copy_options::recursive;
  std::filesystem::copy(test::tiny_model_dir(), root + "/gguf", opts);
  std::filesystem::copy(test::tiny_model_dir(), root + "/ref", opts);
  replace_weights(root + "/gguf", "transformer", models_dir() + "/dit.gguf");
  replace_weights(root + "/gguf", "text_encoder", models_dir() + "/te.gguf");
  // The reference folder: the same (package-equal) weights as safetensors, diffusers names.
  auto dit_ws = WeightStore::open(models_dir() + "/dit.gguf");
  auto te_ws = WeightStore::open(models_dir() + "/te.gguf");
  ASSERT_TRUE(dit_ws.ok() && te_ws.ok());
  std::set<std::string> used;
  const std::string dit_dir = write_folder(
      "pipe_dit",
      dit_weights_by_diffusers_name(*dit_ws, read_ref("dit_ref.json"), c.dit.dim, &used));
  TensorList te;
  for (const std::string& name : te_ws->names())
    te.emplace_back(name, f32_rows(*te_ws, name, 0, -1));
  const std::string te_dir = write_folder("pipe_te", te);
  replace_weights(root + "/ref", "transformer", dit_dir + "/model.safetensors");
  replace_weights(root + "/ref", "text_encoder", te_dir + "/model.safetensors");

  const Image a = generate_one(root + "/gguf");
  const Image b = generate_one(root + "/ref");
  ASSERT_EQ(a.rgb.size(), 32u * 32u * 3u);
  ASSERT_EQ(a.rgb.size(), b.rgb.size());
  int max_diff = 0;
  for (size_t i = 0; i < a.rgb.size(); ++i)
    max_diff = std::max(max_diff, std::abs(a.rgb[i] - b.rgb[i]));
  std::printf(
      "[ gguf ] pipeline with GGUF DiT + text encoder vs safetensors folder: max pixel diff %d\n",
      max_diff);
  EXPECT_EQ(max_diff, 0);
  std::filesystem::remove_all(root);
  std::filesystem::remove_all(dit_dir);
  std::filesystem::remove_all(te_dir);
}

}  // namespace
}  // namespace zimage
