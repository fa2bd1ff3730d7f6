// LoRA reading and merging (io/lora/lora.h, model/adapters/lora_merge.h) on small synthetic files: the key
// grammar of every layout (table-driven), PEFT's metadata scaling, the checks that make a bad
// file an error naming its key, and the merge itself against a float64 reference, on a store
// named as diffusers names the DiT and on one named as ComfyUI does (fused attention.qkv).
// End-to-end parity with diffusers: tests/parity/test_lora_parity.cpp.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "io/lora/lora.h"
#include "io/weights/safetensors.h"
#include "io/weights/weights.h"
#include "model/adapters/lora_merge.h"

using namespace zimage;

namespace {

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "zimage_lora_XXXXXX").string();
    if (::mkdtemp(tmpl.data())) path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

std::mt19937 g_rng(1234);

Tensor randn(const Shape& shape, DType dtype = DType::kF32) {
  Tensor f = Tensor::host(DType::kF32, shape);
  std::normal_distribution<float> nd(0.0f, 0.5f);
  for (int64_t i = 0; i < f.numel(); ++i) f.data_as<float>()[i] = nd(g_rng);
  if (dtype == DType::kF32) return f;
  Tensor out = Tensor::host(dtype, shape);
  convert_from_f32(dtype, f.data_as<float>(), out.data(), static_cast<size_t>(f.numel()));
  return out;
}

Tensor scalar(float v) {
  Tensor t = Tensor::host(DType::kF32, {});
  t.data_as<float>()[0] = v;
  return t;
}

std::vector<double> as_f64(const Tensor& t) {
  std::vector<float> f(static_cast<size_t>(t.numel()));
  convert_to_f32(t.dtype(), t.data(), f.data(), f.size());
  return {f.begin(), f.end()};
}

using Tensors = std::vector<std::pair<std::string, Tensor>>;

std::string write(const TempDir& dir, const std::string& name, const Tensors& ts,
                  const std::map<std::string, std::string>& meta = {}) {
  const std::string path = dir.file(name);
  const Status st = write_safetensors(path, ts, meta);
  EXPECT_TRUE(st.ok()) << st.to_string();
  return path;
}

void expect_error(const Status& st, const std::vector<std::string>& parts) {
  ASSERT_FALSE(st.ok());
  for (const std::string& p : parts)
    EXPECT_NE(st.message().find(p), std::string::npos)
        << "expected \"" << p << "\" in: " << st.message();
}

// (W + scale · up · down) in float64.
std::vector<double> reference_merge(const Tensor& w, const std::vector<double>& up,
                                    const std::vector<double>& down, int64_t r, double scale,
                                    int64_t row0, int64_t rows) {
  std::vector<double> out = as_f64(w);
  const int64_t k = w.dim(1);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < k; ++j) {
      double s = 0;
      for (int64_t x = 0; x < r; ++x) s += up[(row0 + i) * r + x] * down[x * k + j];
      out[(row0 + i) * k + j] += scale * s;
    }
  return out;
}

double max_diff(const std::vector<double>& a, const Tensor& b) {
  const std::vector<double> bb = as_f64(b);
  if (a.size() != bb.size()) return INFINITY;
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(a[i] - bb[i]));
  return m;
}

}  // namespace

TEST(LoraKeys, SplitsEverySuffix) {
  struct Row {
    const char* key;
    const char* module;
    LoraPart part;
  };
  const Row rows[] = {
      {"transformer.layers.0.attention.to_q.lora_A.weight", "transformer.layers.0.attention.to_q",
       LoraPart::kDown},
      {"layers.0.attention.to_q.lora_B.weight", "layers.0.attention.to_q", LoraPart::kUp},
      {"x.lora_A.default.weight", "x", LoraPart::kDown},
      {"x.lora_B.default.weight", "x", LoraPart::kUp},
      {"lora_unet_layers_0_attention_to_q.lora_down.weight", "lora_unet_layers_0_attention_to_q",
       LoraPart::kDown},
      {"lora_unet_layers_0_attention_to_q.lora_up.weight", "lora_unet_layers_0_attention_to_q",
       LoraPart::kUp},
      {"lora_unet_layers_0_attention_to_q.alpha", "lora_unet_layers_0_attention_to_q",
       LoraPart::kAlpha},
      {"layers.0.attention.to.q.lora.down.weight", "layers.0.attention.to.q", LoraPart::kDown},
      {"layers.0.attention.to.q.lora.up.weight", "layers.0.attention.to.q", LoraPart::kUp},
      {"m.lora_linear_layer.down.weight", "m", LoraPart::kDown},
      {"m.lora_linear_layer.up.weight", "m", LoraPart::kUp},
      {"m.hada_w1_a", "m", LoraPart::kHadaW1A},
      {"m.hada_w2_b", "m", LoraPart::kHadaW2B},
      {"m.lokr_w1", "m", LoraPart::kLokrW1},
      {"m.lokr_w1_b", "m", LoraPart::kLokrW1B},
      {"m.lokr_w2_a", "m", LoraPart::kLokrW2A},
      {"m.dora_scale", "m", LoraPart::kUnsupported},
      {"m.hada_t1", "m", LoraPart::kUnsupported},
      {"m.lora_B.bias", "m", LoraPart::kUnsupported},
  };
  for (const Row& r : rows) {
    auto k = split_lora_key(r.key);
    ASSERT_TRUE(k.has_value()) << r.key;
    EXPECT_EQ(k->module, r.module) << r.key;
    EXPECT_EQ(k->part, r.part) << r.key;
  }
  for (const char* bad : {"layers.0.attention.to_q.weight", "x_pad_token", ".alpha", "m.lora_C"})
    EXPECT_FALSE(split_lora_key(bad).has_value()) << bad;
}

TEST(LoraKeys, MapsModulesOfEveryLayout) {
  struct Row {
    const char* module;
    std::vector<std::string> targets;  // empty: unmatched
    const char* prefix;
    bool comfy;
  };
  const std::vector<std::string> qkv0 = {"layers.0.attention.to_q", "layers.0.attention.to_k",
                                         "layers.0.attention.to_v"};
  const Row rows[] = {
      // diffusers / PEFT
      {"transformer.layers.3.attention.to_q", {"layers.3.attention.to_q"}, "transformer.", false},
      {"transformer.layers.3.attention.to_out.0",
       {"layers.3.attention.to_out.0"},
       "transformer.",
       false},
      {"layers.29.feed_forward.w2", {"layers.29.feed_forward.w2"}, "", false},
      {"base_model.model.layers.1.adaLN_modulation.0",
       {"layers.1.adaLN_modulation.0"},
       "base_model.model.",
       false},
      {"transformer.cap_embedder.1", {"cap_embedder.1"}, "transformer.", false},
      {"transformer.t_embedder.mlp.2", {"t_embedder.mlp.2"}, "transformer.", false},
      {"transformer.all_x_embedder.2-1", {"all_x_embedder.2-1"}, "transformer.", false},
      {"transformer.all_final_layer.2-1.adaLN_modulation.1",
       {"all_final_layer.2-1.adaLN_modulation.1"},
       "transformer.",
       false},
      {"layers.007.attention.to_k", {"layers.7.attention.to_k"}, "", false},
      // ai-toolkit / diffusion-pipe / ComfyUI
      {"diffusion_model.layers.3.attention.to_k",
       {"layers.3.attention.to_k"},
       "diffusion_model.",
       false},
      {"model.diffusion_model.noise_refiner.1.feed_forward.w3",
       {"noise_refiner.1.feed_forward.w3"},
       "model.diffusion_model.",
       false},
      {"diffusion_model.layers.0.attention.qkv", qkv0, "diffusion_model.", true},
      {"diffusion_model.layers.0.attention.out",
       {"layers.0.attention.to_out.0"},
       "diffusion_model.",
       true},
      {"diffusion_model.x_embedder", {"all_x_embedder.2-1"}, "diffusion_model.", true},
      {"diffusion_model.final_layer.linear",
       {"all_final_layer.2-1.linear"},
       "diffusion_model.",
       true},
      // kohya / musubi / LyCORIS
      {"lora_unet_layers_12_attention_to_v", {"layers.12.attention.to_v"}, "lora_unet_", false},
      {"lora_unet__layers_0_feed_forward_w3", {"layers.0.feed_forward.w3"}, "lora_unet__", false},
      {"lora_unet_context_refiner_1_attention_to_out_0",
       {"context_refiner.1.attention.to_out.0"},
       "lora_unet_",
       false},
      {"lora_unet_noise_refiner_0_adaLN_modulation_0",
       {"noise_refiner.0.adaLN_modulation.0"},
       "lora_unet_",
       false},
      {"lora_unet_layers_0_attention_qkv", qkv0, "lora_unet_", true},
      {"lora_unet_layers_0_attention_out", {"layers.0.attention.to_out.0"}, "lora_unet_", true},
      {"lora_unet_t_embedder_mlp_0", {"t_embedder.mlp.0"}, "lora_unet_", false},
      {"lora_unet_all_x_embedder_2-1", {"all_x_embedder.2-1"}, "lora_unet_", false},
      {"lora_unet_all_final_layer_2-1_linear", {"all_final_layer.2-1.linear"}, "lora_unet_", false},
      {"lora_unet_final_layer_adaLN_modulation_1",
       {"all_final_layer.2-1.adaLN_modulation.1"},
       "lora_unet_",
       true},
      {"lycoris_layers_5_feed_forward_w1", {"layers.5.feed_forward.w1"}, "lycoris_", false},
      // the dot form some trainers write (Anime-Z): to.q instead of to_q
      {"layers.0.attention.to.q", {"layers.0.attention.to_q"}, "", false},
      // matches nothing
      {"transformer.layers.0.attention.to_x", {}, "transformer.", false},
      {"transformer.layers.x.attention.to_q", {}, "transformer.", false},
      {"transformer.layers.0.attention.to_q.extra", {}, "transformer.", false},
      {"transformer.layers.0.attention", {}, "transformer.", false},
      {"transformer.all_x_embedder.2", {}, "transformer.", false},
      {"lora_unet_down_blocks_0_attentions_0_proj_in", {}, "lora_unet_", false},
      {"lora_te_text_model_encoder_layers_0_self_attn_q_proj", {}, "", false},
      {"text_encoder.layers.0.self_attn.q_proj", {}, "", false},
  };
  for (const Row& r : rows) {
    const LoraModuleMap m = map_lora_module(r.module);
    std::vector<std::string> got;
    for (const LoraTarget& t : m.targets) got.push_back(t.module);
    EXPECT_EQ(got, r.targets) << r.module;
    if (r.targets.empty()) {
      EXPECT_FALSE(m.reason.empty()) << r.module;
      continue;
    }
    EXPECT_EQ(m.prefix, r.prefix) << r.module;
    EXPECT_EQ(m.comfy_name, r.comfy) << r.module;
    EXPECT_EQ(m.fused_qkv, r.targets.size() == 3) << r.module;
    for (size_t i = 0; i < m.targets.size(); ++i)
      EXPECT_EQ(m.targets[i].part, r.targets.size() == 3 ? int(i) : -1) << r.module;
  }
  EXPECT_NE(map_lora_module("lora_te1_text_model_x").reason.find("text-encoder"),
            std::string::npos);
}

TEST(LoraKeys, PeftMetadataScalesAsPeftDoes) {
  const std::string meta = R"({"transformer.r": 4, "transformer.lora_alpha": 6,
      "transformer.peft_type": "LORA", "transformer.use_rslora": false,
      "transformer.rank_pattern": {"layers.1.attention.to_k": 2, "w2": 3,
                                   "^noise_refiner.0.attention.to_q": 1},
      "transformer.alpha_pattern": {"noise_refiner.0.feed_forward.w1": 1, "to_v": 12}})";
  auto p = parse_peft_metadata(meta, "f");
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  ASSERT_TRUE(p->has_value());
  const PeftScaling& s = **p;
  struct Row {
    const char* module;
    double r, alpha;
  };
  const Row rows[] = {
      {"layers.0.attention.to_q", 4, 6},         {"layers.1.attention.to_k", 2, 6},
      {"layers.11.attention.to_k", 4, 6},        {"layers.0.feed_forward.w2", 3, 6},
      {"noise_refiner.0.feed_forward.w1", 4, 1}, {"context_refiner.0.attention.to_v", 4, 12},
      {"noise_refiner.0.attention.to_q", 1, 6},  {"layers.0.noise_refiner.0.attention.to_q", 4, 6},
  };
  for (const Row& r : rows) {
    EXPECT_EQ(*s.rank_for(r.module), r.r) << r.module;
    EXPECT_EQ(*s.alpha_for(r.module), r.alpha) << r.module;
  }
  auto none = parse_peft_metadata(R"({"text_encoder.r": 4})", "f");
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
  expect_error(
      parse_peft_metadata(R"({"transformer.r": 4, "transformer.use_dora": true})", "f").status(),
      {"DoRA"});
  expect_error(
      parse_peft_metadata(R"({"transformer.r": 4, "transformer.peft_type": "LOKR"})", "f").status(),
      {"LOKR"});
  expect_error(parse_peft_metadata(R"({"transformer.r": -1})", "f").status(), {"'transformer.r'"});
  expect_error(parse_peft_metadata(R"({"transformer.r": 4,)", "f").status(), {"f"});
  auto bad_regex =
      parse_peft_metadata(R"({"transformer.r": 4, "transformer.rank_pattern": {"(": 2}})", "f");
  ASSERT_TRUE(bad_regex.ok());
  expect_error((*bad_regex)->rank_for("layers.0.attention.to_q").status(), {"pattern '('"});
}

TEST(LoraRead, ScalesSplitsAndListsKeys) {
  TempDir dir;
  const Tensor down = randn({2, 4}), up = randn({6, 2}), qkv_up = randn({18, 3}),
               qkv_down = randn({3, 4});
  const std::string path =
      write(dir, "kohya.safetensors",
            {{"lora_unet_layers_0_attention_to_out_0.lora_down.weight", down},
             {"lora_unet_layers_0_attention_to_out_0.lora_up.weight", up},
             {"lora_unet_layers_0_attention_to_out_0.alpha", scalar(3.0f)},
             {"lora_unet_layers_1_attention_qkv.lora_down.weight", qkv_down},
             {"lora_unet_layers_1_attention_qkv.lora_up.weight", qkv_up},
             {"lora_unet_layers_1_attention_to_x.lora_down.weight", down},
             {"lora_unet_layers_1_attention_to_x.lora_up.weight", up},
             {"lora_te_text_model_q.lora_down.weight", down},
             {"lora_unet_layers_0_attention_to_out_0.dora_scale", randn({1, 4})}});
  auto lora = read_lora(path, 0.5f);
  ASSERT_TRUE(lora.ok()) << lora.status().to_string();
  EXPECT_EQ(lora->key_count, 9u);
  EXPECT_NE(lora->format.find("kohya"), std::string::npos) << lora->format;
  EXPECT_NE(lora->format.find("fused attention.qkv"), std::string::npos) << lora->format;
  ASSERT_EQ(lora->patches.size(), 4u);  // qkv x3, to_out.0 (modules in sorted order)
  const LoraPatch& out = lora->patches[0];
  EXPECT_EQ(out.target, "layers.0.attention.to_out.0.weight");
  EXPECT_EQ(out.rank, 2);
  EXPECT_FLOAT_EQ(out.scale, 0.5f * 3.0f / 2.0f);  // user x alpha / rank
  EXPECT_EQ(out.keys.size(), 3u);
  const char* parts[] = {"to_q", "to_k", "to_v"};
  for (int i = 0; i < 3; ++i) {
    const LoraPatch& p = lora->patches[1 + i];
    EXPECT_EQ(p.target, std::string("layers.1.attention.") + parts[i] + ".weight");
    EXPECT_FLOAT_EQ(p.scale, 0.5f);  // no alpha: the user's scale only
    EXPECT_EQ(p.rows, 6);
    EXPECT_EQ(p.cols, 4);
    ASSERT_EQ(p.up.shape(), (Shape{6, 3}));
    EXPECT_EQ(p.up.data(), static_cast<char*>(lora->patches[1].up.data()) + i * 6 * 3 * 4);
  }
  std::vector<std::string> unmatched;
  for (const LoraSkippedKey& k : lora->unmatched) unmatched.push_back(k.key);
  std::sort(unmatched.begin(), unmatched.end());
  EXPECT_EQ(unmatched,
            (std::vector<std::string>{"lora_te_text_model_q.lora_down.weight",
                                      "lora_unet_layers_0_attention_to_out_0.dora_scale",
                                      "lora_unet_layers_1_attention_to_x.lora_down.weight",
                                      "lora_unet_layers_1_attention_to_x.lora_up.weight"}));
}

TEST(LoraRead, SkipsFusedQkvNextToSplitKeysAsDiffusersDoes) {
  TempDir dir;
  const std::string path = write(dir, "animez.safetensors",
                                 {{"layers.0.attention.qkv.lora.down.weight", randn({2, 4})},
                                  {"layers.0.attention.qkv.lora.up.weight", randn({18, 2})},
                                  {"layers.0.attention.to.q.lora.down.weight", randn({2, 4})},
                                  {"layers.0.attention.to.q.lora.up.weight", randn({6, 2})},
                                  {"layers.0.attention.out.lora.down.weight", randn({2, 4})},
                                  {"layers.0.attention.out.lora.up.weight", randn({6, 2})},
                                  {"layers.0.attention.to_out.0.lora.down.weight", randn({2, 4})},
                                  {"layers.0.attention.to_out.0.lora.up.weight", randn({6, 2})}});
  auto lora = read_lora(path, 1.0f);
  ASSERT_TRUE(lora.ok()) << lora.status().to_string();
  ASSERT_EQ(lora->patches.size(), 2u);  // modules in sorted order: "to.q" < "to_out.0"
  EXPECT_EQ(lora->patches[0].target, "layers.0.attention.to_q.weight");
  EXPECT_EQ(lora->patches[1].target, "layers.0.attention.to_out.0.weight");
  EXPECT_EQ(lora->patches[1].module, "layers.0.attention.to_out.0");
  EXPECT_EQ(lora->redundant.size(), 4u);
  EXPECT_TRUE(lora->unmatched.empty());
}

TEST(LoraRead, BadFilesAreErrorsNamingTheKey) {
  TempDir dir;
  struct Row {
    const char* name;
    Tensors tensors;
    std::vector<std::string> expect;
  };
  Tensor nan = randn({2, 4});
  nan.data_as<float>()[3] = NAN;
  Tensor ints = Tensor::host(DType::kI32, {6, 2});
  const std::string a = "transformer.layers.0.attention.to_q.lora_A.weight";
  const std::string b = "transformer.layers.0.attention.to_q.lora_B.weight";
  const std::vector<Row> rows = {
      {"no_up", {{a, randn({2, 4})}}, {"has no up (lora_B) weight", "to_q"}},
      {"rank", {{a, randn({2, 4})}, {b, randn({6, 3})}}, {"do not fit together", "[6, 3]"}},
      {"nan", {{a, nan}, {b, randn({6, 2})}}, {"NaN or Inf", a}},
      {"int", {{a, randn({2, 4})}, {b, ints}}, {"non-float dtype", b}},
      {"conv", {{a, randn({2, 4, 1, 1})}, {b, randn({6, 2})}}, {"expected a matrix", a}},
      {"alpha",
       {{a, randn({2, 4})},
        {b, randn({6, 2})},
        {"transformer.layers.0.attention.to_q.alpha", randn({2})}},
       {"expected one number", ".alpha"}},
      {"mixed",
       {{a, randn({2, 4})},
        {b, randn({6, 2})},
        {"transformer.layers.0.attention.to_q.hada_w1_a", randn({6, 2})}},
       {"mixes"}},
      {"twice",
       {{a, randn({2, 4})},
        {b, randn({6, 2})},
        {"diffusion_model.layers.0.attention.to_q.lora_A.weight", randn({2, 4})},
        {"diffusion_model.layers.0.attention.to_q.lora_B.weight", randn({6, 2})}},
       {"both patch layers.0.attention.to_q.weight"}},
      {"alpha_only",
       {{"transformer.layers.0.attention.to_q.alpha", scalar(1)}},
       {"no LoRA weights"}},
      {"not_lora", {{"layers.0.attention.to_q.weight", randn({6, 4})}}, {"is it a LoRA file?"}},
      {"qkv3",
       {{"lora_unet_layers_0_attention_qkv.lora_down.weight", randn({2, 4})},
        {"lora_unet_layers_0_attention_qkv.lora_up.weight", randn({7, 2})}},
       {"not a multiple of 3"}},
      {"lokr_both",
       {{"layers.0.attention.to_q.lokr_w1", randn({2, 2})},
        {"layers.0.attention.to_q.lokr_w1_a", randn({2, 1})},
        {"layers.0.attention.to_q.lokr_w1_b", randn({1, 2})},
        {"layers.0.attention.to_q.lokr_w2", randn({3, 2})}},
       {"has both lokr_w1 and lokr_w1_a/_b"}},
  };
  for (const Row& r : rows) {
    const std::string path = write(dir, std::string(r.name) + ".safetensors", r.tensors);
    auto lora = read_lora(path, 1.0f);
    ASSERT_FALSE(lora.ok()) << r.name;
    EXPECT_EQ(lora.status().code(), ErrorCode::kFormat) << r.name;
    std::vector<std::string> expect = r.expect;
    expect.push_back(path);
    expect_error(lora.status(), expect);
  }
  auto missing = read_lora(dir.file("none.safetensors"), 1.0f);
  EXPECT_EQ(missing.status().code(), ErrorCode::kNotFound);
  auto inf = read_lora(dir.file("rank.safetensors"), INFINITY);
  EXPECT_EQ(inf.status().code(), ErrorCode::kInvalidArgument);
}

namespace {

// A two-block "transformer" in diffusers' names and the same weights in ComfyUI's.
struct Stores {
  TempDir dir;
  Tensor q, k, v, out, w1;
  std::string diffusers, comfy;
  Stores() {
    q = randn({6, 4}, DType::kBF16), k = randn({6, 4}, DType::kBF16);
    v = randn({6, 4}, DType::kBF16), out = randn({6, 4}, DType::kBF16);
    w1 = randn({5, 4}, DType::kBF16);
    diffusers = write(dir, "diffusers.safetensors",
                      {{"x_pad_token", randn({1, 4})},
                       {"layers.0.attention.to_q.weight", q},
                       {"layers.0.attention.to_k.weight", k},
                       {"layers.0.attention.to_v.weight", v},
                       {"layers.0.attention.to_out.0.weight", out},
                       {"layers.0.feed_forward.w1.weight", w1}});
    Tensor qkv = Tensor::host(DType::kBF16, {18, 4});
    for (int i = 0; i < 3; ++i) {
      const Tensor& src = i == 0 ? q : i == 1 ? k : v;
      std::memcpy(static_cast<char*>(qkv.data()) + i * src.nbytes(), src.data(), src.nbytes());
    }
    comfy = write(dir, "comfy.safetensors",
                  {{"diffusion_model.x_pad_token", randn({1, 4})},
                   {"diffusion_model.layers.0.attention.qkv.weight", qkv},
                   {"diffusion_model.layers.0.attention.out.weight", out},
                   {"diffusion_model.layers.0.feed_forward.w1.weight", w1}});
  }
};

}  // namespace

TEST(LoraMerge, MatchesFloat64OnDiffusersAndComfyNamesBitForBit) {
  Stores s;
  // A kohya LoRA on the fused qkv + out (scale 0.8 x alpha 3 / rank 2), and a PEFT one on to_k
  // and w1 at -0.5: two LoRAs on one tensor add up.
  const Tensor qd = randn({2, 4}), qu = randn({18, 2}), od = randn({1, 4}), ou = randn({6, 1});
  const Tensor kd = randn({3, 4}), ku = randn({6, 3}), wd = randn({2, 4}), wu = randn({5, 2});
  const std::string l1 = write(s.dir, "l1.safetensors",
                               {{"lora_unet_layers_0_attention_qkv.lora_down.weight", qd},
                                {"lora_unet_layers_0_attention_qkv.lora_up.weight", qu},
                                {"lora_unet_layers_0_attention_qkv.alpha", scalar(3)},
                                {"lora_unet_layers_0_attention_out.lora_down.weight", od},
                                {"lora_unet_layers_0_attention_out.lora_up.weight", ou}});
  const std::string l2 = write(s.dir, "l2.safetensors",
                               {{"transformer.layers.0.attention.to_k.lora_A.weight", kd},
                                {"transformer.layers.0.attention.to_k.lora_B.weight", ku},
                                {"transformer.layers.0.feed_forward.w1.lora_A.weight", wd},
                                {"transformer.layers.0.feed_forward.w1.lora_B.weight", wu}});
  const std::vector<LoraSpec> loras = {{l1, 0.8f}, {l2, -0.5f}};
  auto d = WeightStore::open(s.diffusers);
  auto c = WeightStore::open(s.comfy);
  ASSERT_TRUE(d.ok() && c.ok());
  ASSERT_TRUE(merge_loras(*d, loras, false).ok());
  Status st = merge_loras(*c, loras, false);
  ASSERT_TRUE(st.ok()) << st.to_string();

  // float64 reference per weight: part i of the fused LoRA uses rows 6i .. 6i+5 of its up
  std::vector<double> ref[3];
  const Tensor* base[3] = {&s.q, &s.k, &s.v};
  const std::vector<double> qkv_up = as_f64(qu);
  for (int i = 0; i < 3; ++i) {
    const std::vector<double> rows(qkv_up.begin() + i * 12, qkv_up.begin() + (i + 1) * 12);
    ref[i] = reference_merge(*base[i], rows, as_f64(qd), 2, 0.8 * 3 / 2, 0, 6);
  }
  {  // to_k also gets the second LoRA
    Tensor k_once = Tensor::host(DType::kF32, {6, 4});
    for (int i = 0; i < 24; ++i) k_once.data_as<float>()[i] = static_cast<float>(ref[1][i]);
    ref[1] = reference_merge(k_once, as_f64(ku), as_f64(kd), 3, -0.5, 0, 6);
  }
  const char* names[3] = {"layers.0.attention.to_q.weight", "layers.0.attention.to_k.weight",
                          "layers.0.attention.to_v.weight"};
  auto fused = c->get("diffusion_model.layers.0.attention.qkv.weight", {18, 4});
  ASSERT_TRUE(fused.ok()) << fused.status().to_string();
  ASSERT_EQ(fused->dtype(), DType::kF32);
  for (int i = 0; i < 3; ++i) {
    auto w = d->get(names[i], {6, 4});
    ASSERT_TRUE(w.ok());
    ASSERT_EQ(w->dtype(), DType::kF32);
    const double err = max_diff(ref[i], *w);
    std::printf("  %s: max |merged - float64| %.2g\n", names[i], err);
    EXPECT_LT(err, 2e-6) << names[i];
    EXPECT_EQ(std::memcmp(w->data(), fused->data_as<float>() + i * 24, 24 * sizeof(float)), 0)
        << names[i] << ": the ComfyUI store's rows differ from the diffusers store's";
  }
  auto out_d = d->get("layers.0.attention.to_out.0.weight", {6, 4});
  auto out_c = c->get("diffusion_model.layers.0.attention.out.weight", {6, 4});
  ASSERT_TRUE(out_d.ok() && out_c.ok());
  EXPECT_LT(max_diff(reference_merge(s.out, as_f64(ou), as_f64(od), 1, 0.8, 0, 6), *out_d), 2e-6);
  EXPECT_EQ(std::memcmp(out_d->data(), out_c->data(), out_d->nbytes()), 0);
  auto w1 = d->get("layers.0.feed_forward.w1.weight", {5, 4});
  ASSERT_TRUE(w1.ok());
  EXPECT_LT(max_diff(reference_merge(s.w1, as_f64(wu), as_f64(wd), 2, -0.5, 0, 5), *w1), 2e-6);
  // Untouched tensors stay views of the file.
  auto pad = d->get("x_pad_token");
  ASSERT_TRUE(pad.ok());
  EXPECT_EQ(pad->dtype(), DType::kF32);
  EXPECT_EQ(d->info("layers.0.attention.to_q.weight")->dtype, DType::kF32);
}

TEST(LoraMerge, ScaleZeroKeepsTheWeights) {
  Stores s;
  const std::string l =
      write(s.dir, "l.safetensors",
            {{"diffusion_model.layers.0.attention.to_v.lora_A.weight", randn({2, 4})},
             {"diffusion_model.layers.0.attention.to_v.lora_B.weight", randn({6, 2})}});
  auto d = WeightStore::open(s.diffusers);
  ASSERT_TRUE(d.ok());
  ASSERT_TRUE(merge_loras(*d, {{l, 0.0f}}, false).ok());
  auto v = d->get("layers.0.attention.to_v.weight", {6, 4});
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(max_diff(as_f64(s.v), *v), 0.0);
  // A scale that overflows float32 is an error when the weight is made, not an Inf weight.
  auto fours = [](const Shape& shape) {
    Tensor t = Tensor::host(DType::kF32, shape);
    for (int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = 4.0f;
    return t;
  };
  const std::string huge = write(s.dir, "huge.safetensors",
                                 {{"layers.0.attention.to_v.lora_A.weight", fours({2, 4})},
                                  {"layers.0.attention.to_v.lora_B.weight", fours({6, 2})}});
  auto big = WeightStore::open(s.diffusers);
  ASSERT_TRUE(big.ok());
  ASSERT_TRUE(merge_loras(*big, {{huge, 1e38f}}, false).ok());
  expect_error(big->get("layers.0.attention.to_v.weight").status(),
               {"layers.0.attention.to_v.weight", "overflows"});
}

TEST(LoraMerge, UnmatchedKeysFailOrWarnAndShapesMustFit) {
  Stores s;
  const Tensor a = randn({2, 4}), b = randn({6, 2});
  const std::string unknown = write(s.dir, "unknown.safetensors",
                                    {{"transformer.layers.0.attention.to_v.lora_A.weight", a},
                                     {"transformer.layers.0.attention.to_v.lora_B.weight", b},
                                     {"transformer.layers.9.attention.to_q.lora_A.weight", a},
                                     {"transformer.layers.9.attention.to_q.lora_B.weight", b},
                                     {"transformer.layers.0.attention.to_x.lora_A.weight", a},
                                     {"transformer.layers.0.attention.to_x.lora_B.weight", b}});
  {
    auto d = WeightStore::open(s.diffusers);
    ASSERT_TRUE(d.ok());
    expect_error(merge_loras(*d, {{unknown, 1.0f}}, false),
                 {unknown, "4 of its 6 keys match no transformer weight",
                  "transformer.layers.0.attention.to_x.lora_A.weight",
                  "the model has no weight layers.9.attention.to_q.weight", "--lora-lenient"});
    EXPECT_EQ(d->info("layers.0.attention.to_v.weight")->dtype, DType::kBF16);  // untouched
  }
  {
    auto d = WeightStore::open(s.diffusers);
    ASSERT_TRUE(d.ok());
    ASSERT_TRUE(merge_loras(*d, {{unknown, 1.0f}}, true).ok());
    auto v = d->get("layers.0.attention.to_v.weight", {6, 4});
    ASSERT_TRUE(v.ok());
    EXPECT_LT(max_diff(reference_merge(s.v, as_f64(b), as_f64(a), 2, 1.0, 0, 6), *v), 2e-6);
  }
  const std::string wide =
      write(s.dir, "wide.safetensors",
            {{"transformer.layers.0.feed_forward.w1.lora_A.weight", randn({2, 7})},
             {"transformer.layers.0.feed_forward.w1.lora_B.weight", randn({5, 2})}});
  for (const std::string& store : {s.diffusers, s.comfy}) {
    auto w = WeightStore::open(store);
    ASSERT_TRUE(w.ok());
    expect_error(merge_loras(*w, {{wide, 1.0f}}, true),
                 {wide, "transformer.layers.0.feed_forward.w1.lora_A.weight", "[2, 7]",
                  "layers.0.feed_forward.w1.weight [5, 4]"});
  }
  const std::string tall =
      write(s.dir, "tall.safetensors",
            {{"lora_unet_layers_0_attention_qkv.lora_down.weight", a},
             {"lora_unet_layers_0_attention_qkv.lora_up.weight", randn({24, 2})}});
  auto c = WeightStore::open(s.comfy);
  ASSERT_TRUE(c.ok());
  expect_error(
      merge_loras(*c, {{tall, 1.0f}}, false),
      {"lora_unet_layers_0_attention_qkv", "[24, 2]", "layers.0.attention.to_q.weight [6, 4]",
       "stored as diffusion_model.layers.0.attention.qkv.weight"});
}

TEST(LoraMerge, LoHaAndLoKrDeltasMatchFloat64) {
  TempDir dir;
  const Tensor a1 = randn({6, 2}), b1 = randn({2, 4}), a2 = randn({6, 3}), b2 = randn({3, 4});
  const Tensor k1 = randn({2, 2}), k2a = randn({3, 1}), k2b = randn({1, 2});
  const std::string path =
      write(dir, "lyco.safetensors",
            {{"lora_unet_layers_1_attention_to_q.hada_w1_a", a1},
             {"lora_unet_layers_1_attention_to_q.hada_w1_b", b1},
             {"lora_unet_layers_1_attention_to_q.hada_w2_a", a2},
             {"lora_unet_layers_1_attention_to_q.hada_w2_b", b2},
             {"lora_unet_layers_1_attention_to_q.alpha", scalar(5)},
             {"diffusion_model.layers.0.attention.qkv.lokr_w1", k1},
             {"diffusion_model.layers.0.attention.qkv.lokr_w2_a", randn({9, 1})},
             {"diffusion_model.layers.0.attention.qkv.lokr_w2_b", k2b},
             {"diffusion_model.layers.0.attention.qkv.alpha", scalar(2)},
             {"layers.1.feed_forward.w2.lokr_w1", k1},
             {"layers.1.feed_forward.w2.lokr_w2_a", k2a},
             {"layers.1.feed_forward.w2.lokr_w2_b", k2b},
             {"layers.1.feed_forward.w2.alpha", scalar(3)}});
  auto lora = read_lora(path, 0.5f);
  ASSERT_TRUE(lora.ok()) << lora.status().to_string();
  ASSERT_EQ(lora->patches.size(), 5u);  // qkv (LoKr, three parts), to_q (LoHa), w2 (LoKr)
  for (const LoraPatch& p : lora->patches) {
    auto delta = lora_delta(p);
    ASSERT_TRUE(delta.ok()) << p.target << ": " << delta.status().to_string();
    ASSERT_EQ(delta->shape(), (Shape{p.rows, p.cols})) << p.target;
    std::vector<double> ref(static_cast<size_t>(p.rows * p.cols));
    if (p.kind == LoraKind::kLoHa) {
      EXPECT_EQ(p.target, "layers.1.attention.to_q.weight");
      EXPECT_FLOAT_EQ(p.scale, 0.5f * 5 / 2);
      const auto x1 = as_f64(a1), y1 = as_f64(b1), x2 = as_f64(a2), y2 = as_f64(b2);
      for (int i = 0; i < 6; ++i)
        for (int j = 0; j < 4; ++j) {
          double s1 = 0, s2 = 0;
          for (int r = 0; r < 2; ++r) s1 += x1[i * 2 + r] * y1[r * 4 + j];
          for (int r = 0; r < 3; ++r) s2 += x2[i * 3 + r] * y2[r * 4 + j];
          ref[i * 4 + j] = p.scale * s1 * s2;
        }
    } else {
      ASSERT_EQ(p.kind, LoraKind::kLoKr);
      EXPECT_EQ(p.rank, 1);
      const bool fused = p.target.find("attention") != std::string::npos;
      EXPECT_FLOAT_EQ(p.scale, 0.5f * (fused ? 2.0f : 3.0f));  // alpha / rank 1
      // kron(w1 [2, 2], w2a · w2b [c, 2]) rows delta_row0 .. + rows
      const auto w1 = as_f64(k1), w2a = as_f64(p.w2_a), w2b = as_f64(k2b);
      const int64_t c = p.w2_a.dim(0);
      for (int64_t row = 0; row < p.rows; ++row)
        for (int64_t col = 0; col < 4; ++col) {
          const int64_t R = row + p.delta_row0, i = R / c, kk = R % c, j = col / 2, l = col % 2;
          ref[row * 4 + col] = p.scale * w1[i * 2 + j] * w2a[kk] * w2b[l];
        }
    }
    const double err = max_diff(ref, *delta);
    EXPECT_LT(err, 1e-5) << p.target;
  }
}
