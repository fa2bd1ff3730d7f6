// Config inference from tensor shapes (io/model/infer_config.h): every tiny golden model (diffusers
// names, and ComfyUI / LDM names made from them) gives back its config.json's shapes, the full-size
// published shape lists (built without data) give back the published configs field for field,
// and incomplete or inconsistent tensor sets fail with messages naming what is wrong.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "common/npy.h"
#include "io/model/infer_config.h"
#include "io/model/model_folder.h"
#include "io/writers/random_model.h"

namespace zimage {
namespace {

namespace fs = std::filesystem;

TensorShapes from_specs(const std::vector<TensorSpec>& specs) {
  TensorShapes t;
  for (const TensorSpec& s : specs) t[s.name] = s.shape;
  return t;
}

bool replace(std::string& s, const std::string& from, const std::string& to) {
  const size_t at = s.find(from);
  if (at == std::string::npos) return false;
  s.replace(at, from.size(), to);
  return true;
}

// diffusers DiT names -> ComfyUI names (shapes only: q|k|v fused into qkv [3D, D]).
TensorShapes dit_to_comfy(const TensorShapes& d) {
  TensorShapes out;
  for (const auto& [k, s] : d) {
    std::string n = k;
    if (n.find(".attention.to_k.") != std::string::npos ||
        n.find(".attention.to_v.") != std::string::npos)
      continue;
    Shape shape = s;
    replace(n, "all_x_embedder.2-1.", "x_embedder.");
    replace(n, "all_final_layer.2-1.", "final_layer.");
    replace(n, ".attention.to_out.0.", ".attention.out.");
    replace(n, ".attention.norm_q.", ".attention.q_norm.");
    replace(n, ".attention.norm_k.", ".attention.k_norm.");
    if (replace(n, ".attention.to_q.weight", ".attention.qkv.weight")) shape[0] *= 3;
    out[n] = shape;
  }
  return out;
}

// diffusers VAE names -> LDM names (the decoder part is enough for inference).
TensorShapes vae_to_ldm(const TensorShapes& d, int levels) {
  TensorShapes out;
  for (const auto& [k, s] : d) {
    std::string n = k;
    replace(n, "decoder.mid_block.resnets.0.", "decoder.mid.block_1.");
    replace(n, "decoder.mid_block.resnets.1.", "decoder.mid.block_2.");
    replace(n, "decoder.mid_block.attentions.0.to_q.", "decoder.mid.attn_1.q.");
    if (n.rfind("decoder.up_blocks.", 0) == 0) {
      const std::string rest = n.substr(18);
      const int i = std::stoi(rest.substr(0, rest.find('.')));
      std::string tail = rest.substr(rest.find('.') + 1);
      replace(tail, "resnets.", "block.");
      n = "decoder.up." + std::to_string(levels - 1 - i) + "." + tail;
    }
    if (n.rfind("encoder.", 0) == 0 && n != "encoder.conv_in.weight") continue;
    out[n] = s;
  }
  return out;
}

std::vector<std::string> golden_models() {
  std::vector<std::string> dirs;
  for (const auto& e : fs::directory_iterator(ZIMAGE_GOLDEN_DIR))
    if (fs::exists(e.path() / "model" / "model_index.json"))
      dirs.push_back((e.path() / "model").string());
  std::sort(dirs.begin(), dirs.end());
  return dirs;
}

TEST(InferConfig, EveryTinyGoldenModelGivesItsConfigShapes) {
  const auto dirs = golden_models();
  ASSERT_GE(dirs.size(), 9u);
  for (const std::string& dir : dirs) {
    SCOPED_TRACE(dir);
    auto folder = ModelFolder::open(dir);
    ASSERT_TRUE(folder.ok()) << folder.status().to_string();
    auto shapes = [&](const char* c) {
      auto ws = folder->open_weights(c);
      EXPECT_TRUE(ws.ok());
      return tensor_shapes(*ws);
    };
    const TensorShapes dit = shapes("transformer"), te = shapes("text_encoder"),
                       vae = shapes("vae");
    for (const TensorShapes& t : {dit, dit_to_comfy(dit)}) {
      auto c = infer_transformer_config(t, dir);
      ASSERT_TRUE(c.ok()) << c.status().to_string();
      EXPECT_TRUE(same_shapes(*c, folder->transformer()));
      EXPECT_EQ(c->head_dim(), folder->transformer().head_dim());
    }
    TensorShapes te_model;  // the ComfyUI text encoder file: "model." + transformers names
    for (const auto& [k, s] : te) te_model["model." + k] = s;
    for (const TensorShapes& t : {te, te_model}) {
      auto c = infer_text_encoder_config(t, dir);
      ASSERT_TRUE(c.ok()) << c.status().to_string();
      EXPECT_TRUE(same_shapes(*c, folder->text_encoder()));
    }
    const int levels = static_cast<int>(folder->vae().block_out_channels.size());
    for (const TensorShapes& t : {vae, vae_to_ldm(vae, levels)}) {
      auto c = infer_vae_config(t, dir);
      ASSERT_TRUE(c.ok()) << c.status().to_string();
      EXPECT_TRUE(same_shapes(*c, folder->vae()))
          << "levels " << c->block_out_channels.size() << " lpb " << c->layers_per_block;
    }
  }
}

// The published Z-Image-Turbo shapes (521 DiT tensors, 398 Qwen3-4B tensors, the Flux VAE),
// listed without data: inference gives the published configs, every field.
TEST(InferConfig, PublishedFullSizeShapesGiveThePublishedConfigs) {
  const ZImageConfigs ref = zimage_turbo_reference_configs();
  const TensorShapes dit = from_specs(dit_tensor_specs(ref.transformer));
  EXPECT_EQ(dit.size(), 521u);
  EXPECT_EQ(dit_to_comfy(dit).size(), 453u);  // ComfyUI's count (model spec §5.2)
  for (const TensorShapes& t : {dit, dit_to_comfy(dit)}) {
    auto c = infer_transformer_config(t, "published");
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    EXPECT_EQ(c->dim, 3840);
    EXPECT_EQ(c->n_layers, 30);
    EXPECT_EQ(c->n_refiner_layers, 2);
    EXPECT_EQ(c->n_heads, 30);
    EXPECT_EQ(c->n_kv_heads, 30);
    EXPECT_EQ(c->cap_feat_dim, 2560);
    EXPECT_EQ(c->in_channels, 16);
    EXPECT_EQ(c->patch_size, 2);
    EXPECT_EQ(c->f_patch_size, 1);
    EXPECT_EQ(c->axes_dims, (std::vector<int>{32, 48, 48}));
    EXPECT_EQ(c->axes_lens, (std::vector<int>{1536, 512, 512}));
    EXPECT_EQ(c->rope_theta, 256.0f);
    EXPECT_EQ(c->norm_eps, 1e-5f);
    EXPECT_EQ(c->t_scale, 1000.0f);
    EXPECT_TRUE(c->qk_norm);
  }
  TensorShapes te = from_specs(qwen3_tensor_specs(ref.text_encoder));
  EXPECT_EQ(te.size(), 398u);
  auto tc = infer_text_encoder_config(te, "published");
  ASSERT_TRUE(tc.ok()) << tc.status().to_string();
  EXPECT_EQ(tc->hidden_size, 2560);
  EXPECT_EQ(tc->intermediate_size, 9728);
  EXPECT_EQ(tc->num_hidden_layers, 36);
  EXPECT_EQ(tc->num_attention_heads, 32);
  EXPECT_EQ(tc->num_key_value_heads, 8);
  EXPECT_EQ(tc->head_dim, 128);
  EXPECT_EQ(tc->vocab_size, 151936);
  EXPECT_EQ(tc->rope_theta, 1000000.0);
  EXPECT_EQ(tc->rms_norm_eps, 1e-6f);
  EXPECT_EQ(tc->max_position_embeddings, 40960);
  const TensorShapes vae = from_specs(vae_tensor_specs(ref.vae));
  for (const TensorShapes& t : {vae, vae_to_ldm(vae, 4)}) {
    auto vc = infer_vae_config(t, "published");
    ASSERT_TRUE(vc.ok()) << vc.status().to_string();
    EXPECT_EQ(vc->block_out_channels, (std::vector<int>{128, 256, 512, 512}));
    EXPECT_EQ(vc->layers_per_block, 2);
    EXPECT_EQ(vc->latent_channels, 16);
    EXPECT_EQ(vc->in_channels, 3);
    EXPECT_EQ(vc->out_channels, 3);
    EXPECT_EQ(vc->scaling_factor, 0.3611f);
    EXPECT_EQ(vc->shift_factor, 0.1159f);
    EXPECT_TRUE(vc->mid_block_add_attention);
    EXPECT_FALSE(vc->use_quant_conv);
    EXPECT_FALSE(vc->use_post_quant_conv);
  }
  const SchedulerConfig s = published_scheduler_config();
  EXPECT_EQ(s.shift, 3.0f);
  EXPECT_FALSE(s.use_dynamic_shifting);
  EXPECT_EQ(s.num_train_timesteps, 1000);
}

// Other head sizes get the published proportions; one without them is an error.
TEST(InferConfig, AxesDimsFollowThePublishedSplit) {
  TransformerConfig c = zimage_turbo_reference_configs().transformer;
  c.dim = 1920;
  c.n_heads = 30;  // head_dim 64 -> [16, 24, 24]
  c.axes_dims = {16, 24, 24};
  c.n_layers = 2;
  auto r = infer_transformer_config(dit_to_comfy(from_specs(dit_tensor_specs(c))), "f");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->axes_dims, (std::vector<int>{16, 24, 24}));
  c.dim = 96;
  c.n_heads = 4;  // head_dim 24: no published split
  c.axes_dims = {8, 8, 8};
  auto bad = infer_transformer_config(from_specs(dit_tensor_specs(c)), "f.safetensors");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("head_dim 24"), std::string::npos)
      << bad.status().message();
  EXPECT_NE(bad.status().message().find("f.safetensors"), std::string::npos);
}

struct BadCase {
  const char* what;
  std::function<void(TensorShapes&)> edit;
  const char* expect;
};

TEST(InferConfig, IncompleteOrInconsistentTransformerIsNamed) {
  const TensorShapes base =
      dit_to_comfy(from_specs(dit_tensor_specs(zimage_turbo_reference_configs().transformer)));
  const std::vector<BadCase> cases = {
      {"no x_embedder", [](TensorShapes& t) { t.erase("x_embedder.weight"); },
       "'x_embedder.weight' is missing"},
      {"no final layer", [](TensorShapes& t) { t.erase("final_layer.linear.weight"); },
       "'final_layer.linear.weight' is missing"},
      {"a gap in the blocks",
       [](TensorShapes& t) {
         for (auto it = t.begin(); it != t.end();)
           it = it->first.rfind("layers.7.", 0) == 0 ? t.erase(it) : std::next(it);
       },
       "block 7 is missing"},
      {"refiners disagree",
       [](TensorShapes& t) { t["context_refiner.2.attention_norm1.weight"] = {3840}; },
       "2 noise_refiner block(s) but 3 context_refiner"},
      {"no q_norm", [](TensorShapes& t) { t.erase("layers.0.attention.q_norm.weight"); },
       "'layers.0.attention.q_norm.weight' or 'layers.0.attention.norm_q.weight' is missing"},
      {"feed-forward width",
       [](TensorShapes& t) {
         t["layers.0.feed_forward.w1.weight"] = {10000, 3840};
       },
       "int(dim / 3 * 8)"},
      {"cap embedder rows",
       [](TensorShapes& t) {
         t["cap_embedder.1.weight"] = {4096, 2560};
       },
       "'cap_embedder.1.weight' has 4096 rows"},
      {"patch input width",
       [](TensorShapes& t) {
         t["x_embedder.weight"] = {3840, 66};
       },
       "not a multiple of patch_size^2"},
      {"not a transformer",
       [](TensorShapes& t) {
         t = {{"decoder.conv_in.weight", {512, 16, 3, 3}}};
       },
       "no Z-Image transformer tensors"},
  };
  for (const BadCase& b : cases) {
    SCOPED_TRACE(b.what);
    TensorShapes t = base;
    b.edit(t);
    auto r = infer_transformer_config(t, "dit.safetensors");
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), ErrorCode::kFormat);
    EXPECT_NE(r.status().message().find(b.expect), std::string::npos) << r.status().message();
    EXPECT_EQ(r.status().message().rfind("dit.safetensors: cannot infer the transformer config", 0),
              0u)
        << r.status().message();
  }
}

TEST(InferConfig, IncompleteTextEncoderAndVaeAreNamed) {
  const ZImageConfigs ref = zimage_turbo_reference_configs();
  TensorShapes te = from_specs(qwen3_tensor_specs(ref.text_encoder));
  te.erase("layers.0.mlp.gate_proj.weight");
  auto r = infer_text_encoder_config(te, "te.safetensors");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("'layers.0.mlp.gate_proj.weight' is missing"),
            std::string::npos)
      << r.status().message();
  te = from_specs(qwen3_tensor_specs(ref.text_encoder));
  te["layers.0.self_attn.q_proj.bias"] = {4096};
  r = infer_text_encoder_config(te, "te.safetensors");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kUnsupported);
  TensorShapes one_layer;
  for (const auto& [k, s] : from_specs(qwen3_tensor_specs(ref.text_encoder)))
    if (k.rfind("layers.", 0) != 0 || k.rfind("layers.0.", 0) == 0) one_layer[k] = s;
  r = infer_text_encoder_config(one_layer, "te.safetensors");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("at least 2"), std::string::npos) << r.status().message();

  TensorShapes vae = from_specs(vae_tensor_specs(ref.vae));
  vae.erase("decoder.conv_out.weight");
  auto v = infer_vae_config(vae, "ae.safetensors");
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.status().message().find("'decoder.conv_out.weight' is missing"), std::string::npos)
      << v.status().message();
  TensorShapes enc_only;
  for (const auto& [k, s] : from_specs(vae_tensor_specs(ref.vae)))
    if (k.rfind("encoder.", 0) == 0) enc_only[k] = s;
  v = infer_vae_config(enc_only, "ae.safetensors");
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.status().message().find("no VAE decoder tensors"), std::string::npos);
}

}  // namespace
}  // namespace zimage
