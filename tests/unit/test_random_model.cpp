// The random-weight model folder (used for full-size benchmarks and for the diffusers comparison)
// must name and shape every tensor exactly as diffusers / transformers save them: checked here
// against the golden folders, which upstream wrote.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "common/npy.h"
#include "io/writers/random_model.h"
#include "io/weights/safetensors.h"

namespace zimage {
namespace {

namespace fs = std::filesystem;

// name -> shape of every tensor in a component folder (all shards).
std::map<std::string, Shape> folder_tensors(const fs::path& dir) {
  std::map<std::string, Shape> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() != ".safetensors") continue;
    auto f = SafetensorsFile::open(e.path().string());
    EXPECT_TRUE(f.ok()) << f.status().to_string();
    if (!f.ok()) continue;
    for (const auto& t : (*f)->tensors()) out[t.name] = t.shape;
  }
  return out;
}

std::map<std::string, Shape> spec_map(const std::vector<TensorSpec>& specs) {
  std::map<std::string, Shape> m;
  for (const auto& s : specs) m[s.name] = s.shape;
  return m;
}

nlohmann::json read_json(const fs::path& p) {
  std::ifstream f(p);
  return nlohmann::json::parse(f);
}

class RandomModelSpecs : public ::testing::TestWithParam<std::string> {};

TEST_P(RandomModelSpecs, MatchUpstreamNamesAndShapes) {
  const fs::path model = fs::path(test::golden_dir(GetParam())) / "model";
  ASSERT_TRUE(fs::exists(model)) << model;
  const auto tj = read_json(model / "transformer" / "config.json");
  TransformerConfig dc;
  dc.dim = tj["dim"];
  dc.n_layers = tj["n_layers"];
  dc.n_refiner_layers = tj["n_refiner_layers"];
  dc.n_heads = tj["n_heads"];
  dc.cap_feat_dim = tj["cap_feat_dim"];
  dc.axes_dims = tj["axes_dims"].get<std::vector<int>>();
  EXPECT_EQ(spec_map(dit_tensor_specs(dc)), folder_tensors(model / "transformer"));

  const auto ej = read_json(model / "text_encoder" / "config.json");
  TextEncoderConfig ec;
  ec.hidden_size = ej["hidden_size"];
  ec.intermediate_size = ej["intermediate_size"];
  ec.num_hidden_layers = ej["num_hidden_layers"];
  ec.num_attention_heads = ej["num_attention_heads"];
  ec.num_key_value_heads = ej["num_key_value_heads"];
  ec.head_dim = ej["head_dim"];
  ec.vocab_size = ej["vocab_size"];
  EXPECT_EQ(spec_map(qwen3_tensor_specs(ec)), folder_tensors(model / "text_encoder"));

  const auto vj = read_json(model / "vae" / "config.json");
  VaeConfig vc;
  vc.block_out_channels = vj["block_out_channels"].get<std::vector<int>>();
  vc.layers_per_block = vj["layers_per_block"];
  EXPECT_EQ(spec_map(vae_tensor_specs(vc)), folder_tensors(model / "vae"));
}

INSTANTIATE_TEST_SUITE_P(Golden, RandomModelSpecs,
                         ::testing::Values("v_turbo", "v_cfg", "v_batch"));

TEST(RandomModel, FullSizeParameterCountsMatchTheSpec) {
  // Spec §12: DiT 6,154,908,736; text encoder 4,022,468,096 (tied embeddings); VAE 83,819,683.
  auto count = [](const std::vector<TensorSpec>& v) {
    int64_t n = 0;
    for (const auto& s : v) n += shape_numel(s.shape);
    return n;
  };
  EXPECT_EQ(count(dit_tensor_specs(TransformerConfig{})), 6154908736LL);
  EXPECT_EQ(count(qwen3_tensor_specs(TextEncoderConfig{})), 4022468096LL);
  EXPECT_EQ(count(vae_tensor_specs(VaeConfig{})), 83819683LL);
}

TEST(RandomModel, ValuesAreDeterministicWithRealisticScale) {
  TensorSpec lin{"layers.0.attention.to_q.weight", {3840, 3840}, InitKind::kFanIn};
  std::vector<float> a(100000), b(100000), c(50000);
  random_tensor_values(lin, 7, 0, a.data(), a.size());
  random_tensor_values(lin, 7, 0, b.data(), b.size());
  random_tensor_values(lin, 7, 50000, c.data(), c.size());  // chunked draws agree
  EXPECT_EQ(a, b);
  EXPECT_TRUE(std::equal(c.begin(), c.end(), a.begin() + 50000));
  double s = 0, s2 = 0;
  for (float v : a) s += v, s2 += double(v) * v;
  const double mean = s / a.size(), stdv = std::sqrt(s2 / a.size() - mean * mean);
  EXPECT_NEAR(mean, 0.0, 3e-4);
  EXPECT_NEAR(stdv, 1.0 / std::sqrt(3840.0), 2e-4);
  std::vector<float> other(1000);
  random_tensor_values(lin, 8, 0, other.data(), other.size());
  EXPECT_NE(other[0], a[0]);
}

TEST(RandomModel, WritesALoadableTinyFolder) {
  const fs::path dir = fs::temp_directory_path() / "zimage_random_model_test";
  fs::remove_all(dir);
  RandomModelOptions o;
  o.dit.dim = 64;
  o.dit.n_heads = 4;
  o.dit.n_layers = 1;
  o.dit.n_refiner_layers = 1;
  o.dit.cap_feat_dim = 32;
  o.dit.axes_dims = {8, 4, 4};
  o.text_encoder.hidden_size = 32;
  o.text_encoder.intermediate_size = 64;
  o.text_encoder.num_hidden_layers = 2;
  o.text_encoder.num_attention_heads = 4;
  o.text_encoder.num_key_value_heads = 2;
  o.text_encoder.head_dim = 8;
  o.vae.block_out_channels = {32, 64};
  o.vae.layers_per_block = 1;
  o.max_shard_bytes = 4'000'000;  // forces the text encoder (embeddings ~9.7 MB) into shards
  o.tokenizer_dir = test::golden_dir("v_turbo") + "/model/tokenizer";
  ASSERT_TRUE(write_random_model(dir.string(), o).ok());
  EXPECT_TRUE(fs::exists(dir / "text_encoder" / "model.safetensors.index.json"));
  EXPECT_TRUE(fs::exists(dir / "transformer" / "diffusion_pytorch_model.safetensors"));
  EXPECT_TRUE(fs::exists(dir / "tokenizer" / "tokenizer.json"));
  EXPECT_EQ(spec_map(dit_tensor_specs(o.dit)), folder_tensors(dir / "transformer"));
  EXPECT_EQ(spec_map(qwen3_tensor_specs(o.text_encoder)), folder_tensors(dir / "text_encoder"));
  // A second write into the now non-empty folder is refused.
  EXPECT_FALSE(write_random_model(dir.string(), o).ok());
  fs::remove_all(dir);
}

// --outlier-channels: the picked input channels of the DiT blocks' linears are exactly the plain
// folder's values times the scale; every other value (other columns, other tensors) is unchanged.
TEST(RandomModel, OutlierChannelsScaleExactlyThePickedColumns) {
  // Per process: two test runs on one machine (several checkouts) must not share the folder.
  const fs::path base =
      fs::temp_directory_path() / ("zimage_random_outliers_" + std::to_string(::getpid()));
  fs::remove_all(base);
  RandomModelOptions o;
  o.dit.dim = 256;
  o.dit.n_heads = 4;
  o.dit.n_layers = 1;
  o.dit.n_refiner_layers = 1;
  o.dit.cap_feat_dim = 32;
  o.dit.axes_dims = {32, 16, 16};
  o.text_encoder.hidden_size = 32;
  o.text_encoder.intermediate_size = 64;
  o.text_encoder.num_hidden_layers = 2;
  o.text_encoder.num_attention_heads = 4;
  o.text_encoder.num_key_value_heads = 2;
  o.text_encoder.head_dim = 8;
  o.vae.block_out_channels = {32, 64};
  o.vae.layers_per_block = 1;
  o.dtype = DType::kF32;
  o.tokenizer_dir = test::golden_dir("v_turbo") + "/model/tokenizer";
  ASSERT_TRUE(write_random_model((base / "plain").string(), o).ok());
  o.outlier_fraction = 0.05;
  o.outlier_scale = 30.0f;
  ASSERT_TRUE(write_random_model((base / "outliers").string(), o).ok());
  const std::string file = "transformer/diffusion_pytorch_model.safetensors";
  auto a = SafetensorsFile::open((base / "plain" / file).string());
  auto b = SafetensorsFile::open((base / "outliers" / file).string());
  ASSERT_TRUE(a.ok() && b.ok());
  int picked = 0;
  for (int64_t c = 0; c < o.dit.dim; ++c) picked += is_outlier_channel(0, c, 0.05) ? 1 : 0;
  EXPECT_GT(picked, 3);  // about 5 % of 256
  EXPECT_LT(picked, 30);
  int scaled_tensors = 0;
  for (const auto& t : (*a)->tensors()) {
    auto x = (*a)->tensor(t.name);
    auto y = (*b)->tensor(t.name);
    ASSERT_TRUE(x.ok() && y.ok()) << t.name;
    const bool target =
        t.shape.size() == 2 && (t.name.find(".attention.to_") != std::string::npos ||
                                t.name.find(".feed_forward.w") != std::string::npos);
    const int64_t k = t.shape.size() == 2 ? t.shape[1] : 1;
    bool any = false;
    for (int64_t i = 0; i < x->numel(); ++i) {
      const float want = target && is_outlier_channel(0, i % k, 0.05)
                             ? x->data_as<float>()[i] * 30.0f
                             : x->data_as<float>()[i];
      any = any || want != x->data_as<float>()[i];
      ASSERT_EQ(y->data_as<float>()[i], want) << t.name << " element " << i;
    }
    scaled_tensors += any ? 1 : 0;
  }
  EXPECT_EQ(scaled_tensors, 3 * 7);  // 3 blocks x (q, k, v, out, w1, w2, w3)
  fs::remove_all(base);
}

}  // namespace
}  // namespace zimage
