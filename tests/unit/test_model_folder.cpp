// Model folder configs: the three golden folders parse to the values their JSON says, the
// published full-size configs validate, and broken configs (missing keys, wrong types, inconsistent
// head dims, unknown classes, unsupported scheduler features, ...) fail naming the file and key.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "io/fs/json_util.h"
#include "io/model/model_folder.h"

using namespace zimage;
namespace fs = std::filesystem;

namespace {

std::string golden_model(const std::string& name) {
  return std::string(ZIMAGE_GOLDEN_DIR) + "/" + name + "/model";
}

std::string read_text(const std::string& path) {
  auto r = json_util::read_text(path);
  return r.ok() ? *r : std::string();
}

// A copy of a golden folder's configs (weights left out: open() does not read them) whose JSON
// files can be edited.
class FolderCopy {
 public:
  explicit FolderCopy(const std::string& golden = "v_turbo") {
    std::string tmpl = (fs::temp_directory_path() / "zimage_mf_XXXXXX").string();
    if (!::mkdtemp(tmpl.data())) return;
    dir_ = tmpl;
    const std::string src = golden_model(golden);
    for (const char* rel :
         {"model_index.json", "transformer/config.json", "text_encoder/config.json",
          "vae/config.json", "scheduler/scheduler_config.json", "tokenizer/tokenizer.json",
          "tokenizer/tokenizer_config.json"}) {
      fs::create_directories(fs::path(dir_ + "/" + rel).parent_path());
      if (std::string(rel) == "tokenizer/tokenizer.json") {  // large and never edited
        fs::create_symlink(src + "/" + rel, dir_ + "/" + rel);
      } else {
        fs::copy_file(src + "/" + rel, dir_ + "/" + rel);
      }
    }
  }
  ~FolderCopy() {
    std::error_code ec;
    if (!dir_.empty()) fs::remove_all(dir_, ec);
  }
  const std::string& dir() const { return dir_; }
  std::string path(const std::string& rel) const { return dir_ + "/" + rel; }
  // Applies `edit` to the JSON in `rel` and writes it back.
  template <typename F>
  void edit(const std::string& rel, F edit_fn) const {
    nlohmann::json j = nlohmann::json::parse(read_text(path(rel)));
    edit_fn(j);
    std::ofstream(path(rel)) << j.dump(2);
  }

 private:
  std::string dir_;
};

void expect_error(const Status& s, ErrorCode code, const std::vector<std::string>& parts) {
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), code) << s.to_string();
  for (const std::string& p : parts) {
    EXPECT_NE(s.message().find(p), std::string::npos)
        << "expected \"" << p << "\" in: " << s.message();
  }
}

template <typename T>
Status status_of(const Result<T>& r) {
  return r.status();
}

}  // namespace

TEST(ModelFolder, GoldenTurboFolderParses) {
  auto f = ModelFolder::open(golden_model("v_turbo"));
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  const TransformerConfig& t = f->transformer();
  EXPECT_EQ(t.patch_size, 2);
  EXPECT_EQ(t.f_patch_size, 1);
  EXPECT_EQ(t.in_channels, 16);
  EXPECT_EQ(t.dim, 64);
  EXPECT_EQ(t.n_layers, 2);
  EXPECT_EQ(t.n_refiner_layers, 1);
  EXPECT_EQ(t.n_heads, 4);
  EXPECT_EQ(t.head_dim(), 16);
  EXPECT_EQ(t.cap_feat_dim, 32);
  EXPECT_EQ(t.axes_dims, (std::vector<int>{8, 4, 4}));
  EXPECT_EQ(t.axes_lens, (std::vector<int>{256, 64, 64}));
  EXPECT_FLOAT_EQ(t.norm_eps, 1e-5f);
  EXPECT_FLOAT_EQ(t.rope_theta, 256.0f);
  EXPECT_FLOAT_EQ(t.t_scale, 1000.0f);
  EXPECT_TRUE(t.qk_norm);
  const TextEncoderConfig& te = f->text_encoder();
  EXPECT_EQ(te.hidden_size, 32);
  EXPECT_EQ(te.intermediate_size, 64);
  EXPECT_EQ(te.num_hidden_layers, 2);
  EXPECT_EQ(te.num_attention_heads, 4);
  EXPECT_EQ(te.num_key_value_heads, 2);
  EXPECT_EQ(te.head_dim, 8);
  EXPECT_EQ(te.vocab_size, 151936);
  EXPECT_EQ(te.max_position_embeddings, 1024);
  EXPECT_DOUBLE_EQ(te.rope_theta, 1e6);  // from rope_parameters
  EXPECT_FLOAT_EQ(te.rms_norm_eps, 1e-6f);
  EXPECT_TRUE(te.tie_word_embeddings);
  const VaeConfig& v = f->vae();
  EXPECT_EQ(v.block_out_channels, (std::vector<int>{32, 64}));
  EXPECT_EQ(v.layers_per_block, 1);
  EXPECT_EQ(v.latent_channels, 16);
  EXPECT_EQ(v.norm_num_groups, 32);
  EXPECT_EQ(v.spatial_factor(), 2);
  EXPECT_FLOAT_EQ(v.scaling_factor, 0.3611f);
  EXPECT_FLOAT_EQ(v.shift_factor, 0.1159f);
  EXPECT_FALSE(v.use_quant_conv);
  EXPECT_FALSE(v.use_post_quant_conv);
  const SchedulerConfig& s = f->scheduler();
  EXPECT_FLOAT_EQ(s.shift, 3.0f);
  EXPECT_EQ(s.num_train_timesteps, 1000);
  EXPECT_FALSE(s.use_dynamic_shifting);
  EXPECT_EQ(f->tokenizer_dir(), golden_model("v_turbo") + "/tokenizer");
  EXPECT_TRUE(fs::exists(f->tokenizer_dir() + "/tokenizer.json"));
}

TEST(ModelFolder, GoldenCfgAndBatchFoldersParseAndOpenWeights) {
  auto cfg = ModelFolder::open(golden_model("v_cfg") + "/");  // trailing slash tolerated
  ASSERT_TRUE(cfg.ok()) << cfg.status().to_string();
  EXPECT_EQ(cfg->transformer().dim, 96);
  EXPECT_EQ(cfg->transformer().axes_dims, (std::vector<int>{4, 6, 6}));
  EXPECT_EQ(cfg->text_encoder().num_hidden_layers, 3);
  EXPECT_EQ(cfg->vae().block_out_channels, (std::vector<int>{32, 32, 64, 64}));
  EXPECT_EQ(cfg->vae().spatial_factor(), 8);
  EXPECT_EQ(cfg->component_dir("vae"), golden_model("v_cfg") + "/vae");

  auto batch = ModelFolder::open(golden_model("v_batch"));
  ASSERT_TRUE(batch.ok()) << batch.status().to_string();
  for (const char* comp : {"transformer", "text_encoder", "vae"}) {
    auto w = batch->open_weights(comp);
    ASSERT_TRUE(w.ok()) << comp << ": " << w.status().to_string();
    EXPECT_GT(w->size(), 0u);
    EXPECT_EQ(w->files().size(), 2u);  // sharded
  }
  // The DiT's embedder matches the configs.
  auto dit = batch->open_weights("transformer");
  ASSERT_TRUE(dit.ok());
  auto cap = dit->info("cap_embedder.1.weight");
  ASSERT_TRUE(cap.ok()) << cap.status().to_string();
  EXPECT_EQ(cap->shape, (Shape{batch->transformer().dim, batch->transformer().cap_feat_dim}));
  expect_error(status_of(batch->open_weights("tokenizer")), ErrorCode::kInvalidArgument,
               {"'tokenizer' is not a weight component"});
}

TEST(ModelFolder, ReferenceConfigsValidate) {
  const ZImageConfigs c = zimage_turbo_reference_configs();
  EXPECT_TRUE(validate_configs(c, "").ok());
  EXPECT_EQ(c.transformer.dim, 3840);
  EXPECT_EQ(c.transformer.head_dim(), 128);
  EXPECT_EQ(c.transformer.ffn_hidden(), 10240);
  EXPECT_EQ(c.transformer.axes_lens, (std::vector<int>{1536, 512, 512}));
  EXPECT_EQ(c.text_encoder.num_hidden_layers, 36);
  EXPECT_EQ(c.text_encoder.hidden_size, c.transformer.cap_feat_dim);
  EXPECT_EQ(c.vae.spatial_factor(), 8);
  EXPECT_FLOAT_EQ(c.scheduler.shift, 3.0f);
  // Breaking it is caught.
  ZImageConfigs broken = c;
  broken.transformer.n_heads = 32;  // 3840 / 32 = 120 != 128
  expect_error(validate_configs(broken, ""), ErrorCode::kFormat,
               {"transformer/config.json", "key 'axes_dims'", "head_dim"});
}

TEST(ModelFolder, ParsersApplyClassDefaults) {
  // Only the shape-deciding keys: everything else takes the upstream class defaults.
  auto t = parse_transformer_config(R"({"all_patch_size":[2],"all_f_patch_size":[1],
      "in_channels":16,"dim":3840,"n_layers":30,"n_refiner_layers":2,"n_heads":30,
      "cap_feat_dim":2560})",
                                    "t.json");
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_EQ(t->axes_dims, (std::vector<int>{32, 48, 48}));
  EXPECT_EQ(t->axes_lens, (std::vector<int>{1024, 512, 512}));
  auto s = parse_scheduler_config("{}", "s.json");
  ASSERT_TRUE(s.ok());
  EXPECT_FLOAT_EQ(s->shift, 1.0f);
  EXPECT_EQ(s->base_image_seq_len, 256);
  auto v = parse_vae_config(R"({"in_channels":3,"out_channels":3,"latent_channels":4,
      "block_out_channels":[64],"layers_per_block":1,"shift_factor":null})",
                            "v.json");
  ASSERT_TRUE(v.ok()) << v.status().to_string();
  EXPECT_FLOAT_EQ(v->scaling_factor, 0.18215f);
  EXPECT_FLOAT_EQ(v->shift_factor, 0.0f);
  EXPECT_TRUE(v->use_quant_conv);
  auto te = parse_text_encoder_config(R"({"hidden_size":16,"intermediate_size":16,
      "num_hidden_layers":2,"num_attention_heads":2,"num_key_value_heads":2,"vocab_size":100,
      "rope_theta":5000.0})",
                                      "te.json");
  ASSERT_TRUE(te.ok()) << te.status().to_string();
  EXPECT_EQ(te->head_dim, 128);
  EXPECT_DOUBLE_EQ(te->rope_theta, 5000.0);  // top-level form
  EXPECT_FALSE(te->tie_word_embeddings);
}

TEST(ModelFolder, BrokenConfigsNameFileAndKey) {
  struct Case {
    const char* rel;
    std::function<void(nlohmann::json&)> edit;
    ErrorCode code;
    std::vector<std::string> parts;
  };
  using J = nlohmann::json;
  const std::vector<Case> cases = {
      {"transformer/config.json",
       [](J& j) { j.erase("dim"); },
       ErrorCode::kNotFound,
       {"transformer/config.json: required key 'dim' is missing"}},
      {"transformer/config.json",
       [](J& j) { j["dim"] = "64"; },
       ErrorCode::kFormat,
       {"transformer/config.json: key 'dim': expected an integer, got string"}},
      {"transformer/config.json",
       [](J& j) { j["dim"] = 64.5; },
       ErrorCode::kFormat,
       {"key 'dim': expected an integer, got number"}},
      {"transformer/config.json",
       [](J& j) { j["n_layers"] = -2; },
       ErrorCode::kFormat,
       {"key 'n_layers': value -2 is out of range"}},
      {"transformer/config.json",
       [](J& j) {
         j["axes_dims"] = {8, 4, 8};
       },
       ErrorCode::kFormat,
       {"key 'axes_dims'", "sums to 20 but head_dim = dim / n_heads = 16"}},
      {"transformer/config.json",
       [](J& j) { j["n_heads"] = 5; },
       ErrorCode::kFormat,
       {"key 'dim': 64 is not divisible by n_heads 5"}},
      {"transformer/config.json",
       [](J& j) {
         j["axes_dims"] = {7, 5, 4};
       },
       ErrorCode::kFormat,
       {"key 'axes_dims'", "positive even"}},
      {"transformer/config.json",
       [](J& j) {
         j["axes_lens"] = {256, 64};
       },
       ErrorCode::kFormat,
       {"key 'axes_lens': expected 3 axes"}},
      {"transformer/config.json",
       [](J& j) {
         j["all_patch_size"] = {2, 4};
       },
       ErrorCode::kUnsupported,
       {"key 'all_patch_size'", "exactly one patch size"}},
      {"transformer/config.json",
       [](J& j) { j["_class_name"] = "FluxTransformer2DModel"; },
       ErrorCode::kUnsupported,
       {"key '_class_name': 'FluxTransformer2DModel'"}},
      {"transformer/config.json",
       [](J& j) { j["cap_feat_dim"] = 48; },
       ErrorCode::kFormat,
       {"key 'cap_feat_dim': 48 differs from the text encoder's hidden_size 32"}},
      {"transformer/config.json",
       [](J& j) { j["in_channels"] = 4; },
       ErrorCode::kFormat,
       {"key 'in_channels': 4 differs from the VAE's latent_channels 16"}},
      {"model_index.json",
       [](J& j) {
         j["transformer"] = {"diffusers", "SD3Transformer2DModel"};
       },
       ErrorCode::kUnsupported,
       {"model_index.json: key 'transformer'", "SD3Transformer2DModel"}},
      {"model_index.json",
       [](J& j) { j["_class_name"] = "FluxPipeline"; },
       ErrorCode::kUnsupported,
       {"'FluxPipeline' is not ZImagePipeline"}},
      {"model_index.json",
       [](J& j) { j.erase("vae"); },
       ErrorCode::kNotFound,
       {"model_index.json: required component 'vae' is missing"}},
      {"model_index.json",
       [](J& j) { j["vae"] = "AutoencoderKL"; },
       ErrorCode::kFormat,
       {"key 'vae': expected [library, class]"}},
      {"text_encoder/config.json",
       [](J& j) { j["num_key_value_heads"] = 3; },
       ErrorCode::kFormat,
       {"text_encoder/config.json: key 'num_key_value_heads': 3 does not divide"}},
      {"text_encoder/config.json",
       [](J& j) { j.erase("hidden_size"); },
       ErrorCode::kNotFound,
       {"text_encoder/config.json: required key 'hidden_size' is missing"}},
      {"text_encoder/config.json",
       [](J& j) {
         j["rope_scaling"] = {{"rope_type", "yarn"}};
       },
       ErrorCode::kUnsupported,
       {"key 'rope_scaling'"}},
      {"text_encoder/config.json",
       [](J& j) { j["rope_parameters"]["rope_type"] = "llama3"; },
       ErrorCode::kUnsupported,
       {"key 'rope_parameters.rope_type'"}},
      {"text_encoder/config.json",
       [](J& j) { j["model_type"] = "llama"; },
       ErrorCode::kUnsupported,
       {"key 'model_type': 'llama' is not qwen3"}},
      {"text_encoder/config.json",
       [](J& j) { j["hidden_act"] = "gelu"; },
       ErrorCode::kUnsupported,
       {"key 'hidden_act'"}},
      {"vae/config.json",
       [](J& j) {
         j["block_out_channels"] = {32, 48};
       },
       ErrorCode::kFormat,
       {"vae/config.json: key 'block_out_channels'",
        "48 is not a positive multiple of norm_num_groups 32"}},
      {"vae/config.json",
       [](J& j) { j["down_block_types"][0] = "CrossAttnDownBlock2D"; },
       ErrorCode::kUnsupported,
       {"key 'down_block_types': 'CrossAttnDownBlock2D'"}},
      {"vae/config.json",
       [](J& j) { j["up_block_types"] = {"UpDecoderBlock2D"}; },
       ErrorCode::kFormat,
       {"key 'up_block_types': 1 blocks but block_out_channels has 2"}},
      {"vae/config.json",
       [](J& j) { j["use_quant_conv"] = "no"; },
       ErrorCode::kFormat,
       {"key 'use_quant_conv': expected true or false"}},
      {"scheduler/scheduler_config.json",
       [](J& j) { j["use_karras_sigmas"] = true; },
       ErrorCode::kUnsupported,
       {"scheduler_config.json: key 'use_karras_sigmas'"}},
      {"scheduler/scheduler_config.json",
       [](J& j) { j["shift_terminal"] = 0.02; },
       ErrorCode::kUnsupported,
       {"key 'shift_terminal'"}},
      {"scheduler/scheduler_config.json",
       [](J& j) { j["shift"] = -1.0; },
       ErrorCode::kFormat,
       {"key 'shift': must be positive"}},
      {"scheduler/scheduler_config.json",
       [](J& j) { j["time_shift_type"] = "cubic"; },
       ErrorCode::kFormat,
       {"key 'time_shift_type'"}},
  };
  ASSERT_GE(cases.size(), 10u);
  for (const Case& c : cases) {
    FolderCopy f;
    ASSERT_FALSE(f.dir().empty());
    f.edit(c.rel, c.edit);
    auto r = ModelFolder::open(f.dir());
    SCOPED_TRACE(c.parts[0]);
    expect_error(r.status(), c.code, c.parts);
    if (!r.ok()) {
      EXPECT_NE(r.status().message().find(f.dir()), std::string::npos);
    }
  }
}

TEST(ModelFolder, MissingFilesAndMalformedJson) {
  {
    FolderCopy f;
    fs::remove(f.path("vae/config.json"));
    expect_error(ModelFolder::open(f.dir()).status(), ErrorCode::kNotFound,
                 {f.path("vae/config.json") + ": no such file"});
  }
  {
    FolderCopy f;
    fs::remove(f.path("tokenizer/tokenizer.json"));
    expect_error(ModelFolder::open(f.dir()).status(), ErrorCode::kNotFound,
                 {f.path("tokenizer/tokenizer.json")});
  }
  {
    FolderCopy f;
    std::ofstream(f.path("transformer/config.json")) << "{\"dim\": 64,";
    expect_error(ModelFolder::open(f.dir()).status(), ErrorCode::kFormat,
                 {f.path("transformer/config.json") + ": invalid JSON"});
  }
  {
    FolderCopy f;
    std::ofstream(f.path("scheduler/scheduler_config.json")) << "[1, 2]";
    expect_error(ModelFolder::open(f.dir()).status(), ErrorCode::kFormat,
                 {"scheduler_config.json: expected a JSON object, got array"});
  }
  {
    FolderCopy f;
    std::ofstream(f.path("vae/config.json")) << R"({"in_channels": 3, "in_channels": 4})";
    expect_error(ModelFolder::open(f.dir()).status(), ErrorCode::kFormat,
                 {"vae/config.json: duplicate key 'in_channels'"});
  }
  expect_error(ModelFolder::open("/nonexistent/zimage-model").status(), ErrorCode::kNotFound,
               {"/nonexistent/zimage-model: no such model folder"});
  expect_error(ModelFolder::open(golden_model("v_turbo") + "/model_index.json").status(),
               ErrorCode::kInvalidArgument, {"not a folder"});
}
