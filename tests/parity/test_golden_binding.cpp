// Weight binding and model inputs on the golden checkpoints: alternative namings (ComfyUI / the
// original single files, LDM VAE names, a "model." prefix) give identical results; missing,
// wrongly shaped and unexpected tensors fail with errors that name them; bad inputs are errors;
// the debug sink writes named tensors; the FP8 feed-forward stays close to the reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "common/npy.h"
#include "golden_models_util.h"
#include "io/model/model_config.h"
#include "io/model/model_folder.h"
#include "io/weights/safetensors.h"
#include "io/weights/weights.h"
#include "model/common/debug.h"
#include "model/text_encoder/qwen3_encoder.h"
#include "model/vae/vae.h"
#include "model/dit/zimage_dit.h"

namespace zimage {
namespace {

using namespace golden;  // NOLINT: the helpers read as the test's own vocabulary
using nlohmann::json;
using test::golden_dir;
using test::load_npy;
using test::max_abs_diff;

// ---- weight binding: alternative namings, errors that name the tensor ----

using TensorList = std::vector<std::pair<std::string, Tensor>>;

// All tensors of a component folder, as (name, host view) in name order.
TensorList read_all(const std::string& folder) {
  TensorList out;
  auto ws = WeightStore::open(folder);
  EXPECT_TRUE(ws.ok()) << ws.status().to_string();
  if (!ws.ok()) return out;
  for (const std::string& n : ws->names()) {
    auto t = ws->get(n);
    EXPECT_TRUE(t.ok()) << t.status().to_string();
    if (t.ok()) out.emplace_back(n, *t);
  }
  return out;
}

// A fresh directory under the test temp dir holding `tensors` as model.safetensors.
std::string write_folder(const std::string& tag, const TensorList& tensors) {
  const std::string dir =
      ::testing::TempDir() + "zimage_models_" + std::to_string(getpid()) + "_" + tag;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const Status st = write_safetensors(dir + "/model.safetensors", tensors);
  EXPECT_TRUE(st.ok()) << st.to_string();
  return dir;
}

TensorList without(TensorList list, const std::string& name) {
  TensorList out;
  for (auto& [n, t] : list)
    if (n != name) out.emplace_back(n, t);
  EXPECT_EQ(out.size() + 1, list.size()) << name << " not in the list";
  return out;
}

TensorList reshaped(TensorList list, const std::string& name, const Shape& shape) {
  bool found = false;
  for (auto& [n, t] : list) {
    if (n == name) {
      t = t.view(shape);
      found = t.defined();
    }
  }
  EXPECT_TRUE(found) << name;
  return list;
}

Tensor find(const TensorList& list, const std::string& name) {
  for (const auto& [n, t] : list)
    if (n == name) return t;
  ADD_FAILURE() << name << " missing";
  return Tensor();
}

// Row concatenation of same-dtype host tensors (the ComfyUI fused qkv).
Tensor cat_rows(const std::vector<Tensor>& parts) {
  Shape s = parts[0].shape();
  s[0] = 0;
  for (const Tensor& p : parts) s[0] += p.dim(0);
  Tensor out = Tensor::host(parts[0].dtype(), s);
  char* dst = static_cast<char*>(out.data());
  for (const Tensor& p : parts) {
    std::memcpy(dst, p.data(), p.nbytes());
    dst += p.nbytes();
  }
  return out;
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

// diffusers DiT names -> ComfyUI single-file names (spec §5.2), with the "model.diffusion_model."
// prefix, the Lumina-2 leftover norm_final.weight, and x_pad_token stored 1-D as sd.cpp does.
TensorList to_comfy_dit(const TensorList& src, int64_t dim) {
  const std::string pre = "model.diffusion_model.";
  TensorList out;
  for (const auto& [n, t] : src) {
    if (ends_with(n, "attention.to_k.weight") || ends_with(n, "attention.to_v.weight")) continue;
    if (ends_with(n, "attention.to_q.weight")) {
      const std::string base = n.substr(0, n.size() - std::string("to_q.weight").size());
      out.emplace_back(pre + base + "qkv.weight", cat_rows({t, find(src, base + "to_k.weight"),
                                                            find(src, base + "to_v.weight")}));
      continue;
    }
    std::string m = n;
    m = replace_once(m, "all_x_embedder.2-1.", "x_embedder.");
    m = replace_once(m, "all_final_layer.2-1.", "final_layer.");
    m = replace_once(m, "attention.to_out.0.", "attention.out.");
    m = replace_once(m, "attention.norm_q.", "attention.q_norm.");
    m = replace_once(m, "attention.norm_k.", "attention.k_norm.");
    out.emplace_back(pre + m, m == "x_pad_token" ? t.view({dim}) : t);
  }
  out.emplace_back(pre + "norm_final.weight", find(src, "cap_embedder.1.bias"));
  return out;
}

// diffusers VAE names -> LDM / BFL names (spec §8.5); attention linears become 1x1 convs.
TensorList to_ldm_vae(const TensorList& src, int n_blocks) {
  TensorList out;
  for (const auto& [n, t] : src) {
    std::string m = n;
    for (int i = 0; i < n_blocks; ++i) {
      const std::string up = "decoder.up_blocks." + std::to_string(i) + ".";
      const std::string ldm_up = "decoder.up." + std::to_string(n_blocks - 1 - i) + ".";
      m = replace_once(m, up, ldm_up);
      m = replace_once(m, "encoder.down_blocks." + std::to_string(i) + ".",
                       "encoder.down." + std::to_string(i) + ".");
    }
    m = replace_once(m, ".resnets.", ".block.");
    m = replace_once(m, ".upsamplers.0.", ".upsample.");
    m = replace_once(m, ".downsamplers.0.", ".downsample.");
    m = replace_once(m, ".mid_block.block.0.", ".mid.block_1.");
    m = replace_once(m, ".mid_block.block.1.", ".mid.block_2.");
    m = replace_once(m, ".mid_block.attentions.0.", ".mid.attn_1.");
    m = replace_once(m, "attn_1.group_norm.", "attn_1.norm.");
    m = replace_once(m, "attn_1.to_q.", "attn_1.q.");
    m = replace_once(m, "attn_1.to_k.", "attn_1.k.");
    m = replace_once(m, "attn_1.to_v.", "attn_1.v.");
    m = replace_once(m, "attn_1.to_out.0.", "attn_1.proj_out.");
    m = replace_once(m, ".conv_shortcut.", ".nin_shortcut.");
    m = replace_once(m, ".conv_norm_out.", ".norm_out.");
    const bool attn_w = m.find("attn_1.") != std::string::npos && t.rank() == 2;
    out.emplace_back(m, attn_w ? t.view({t.dim(0), t.dim(1), 1, 1}) : t);
  }
  return out;
}

TEST(GoldenModels, DiTComfyNamingGivesIdenticalOutput) {
  const Case c = load_case("v_turbo");
  const std::string dir =
      write_folder("comfy_dit", to_comfy_dit(read_all(c.dir + "/model/transformer"), c.dit.dim));
  auto ref_dit = load_dit(c);
  auto comfy_dit = load_dit(c, dir);
  ASSERT_NE(ref_dit, nullptr);
  ASSERT_NE(comfy_dit, nullptr);
  const Tensor lat = to_device(npy(c.dir + "/init_noise.npy"));
  const std::vector<Tensor> caps{to_device(npy(c.dir + "/prompt_embeds_0.npy"))};
  Tensor a, b;
  ASSERT_TRUE(ref_dit->forward(lat, {0.25f}, caps, a).ok());
  ASSERT_TRUE(comfy_dit->forward(lat, {0.25f}, caps, b).ok());
  const double err = max_abs_diff(to_host(a), to_host(b));
  report("comfy-vs-diffusers dit", err);
  EXPECT_EQ(err, 0.0);
}

TEST(GoldenModels, VaeLdmNamingGivesIdenticalImage) {
  const Case c = load_case("v_cfg");  // 4 blocks: exercises the reversed up-block numbering
  const int n = static_cast<int>(c.vae.block_out_channels.size());
  const std::string dir = write_folder("ldm_vae", to_ldm_vae(read_all(c.dir + "/model/vae"), n));
  auto ref_vae = load_vae(c);
  auto ldm_vae = load_vae(c, dir);
  ASSERT_NE(ref_vae, nullptr);
  ASSERT_NE(ldm_vae, nullptr);
  const Tensor lat = to_device(npy(c.dir + "/debug/latents_after_step2.npy"));
  auto a = ref_vae->decode(lat);
  auto b = ldm_vae->decode(lat);
  ASSERT_TRUE(a.ok() && b.ok());
  const double err = max_abs_diff(*a, *b);
  report("ldm-vs-diffusers vae", err);
  EXPECT_EQ(err, 0.0);
}

TEST(GoldenModels, TextEncoderModelPrefixAndLmHeadAccepted) {
  const Case c = load_case("v_turbo");
  TensorList list;
  for (auto& [n, t] : read_all(c.dir + "/model/text_encoder")) list.emplace_back("model." + n, t);
  list.emplace_back("lm_head.weight", find(list, "model.embed_tokens.weight"));
  const std::string dir = write_folder("te_prefix", list);
  auto ref_te = load_te(c);
  auto pre_te = load_te(c, dir);
  ASSERT_NE(ref_te, nullptr);
  ASSERT_NE(pre_te, nullptr);
  auto a = ref_te->encode(c.ids);
  auto b = pre_te->encode(c.ids);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(max_abs_diff(to_host((*a)[0]), to_host((*b)[0])), 0.0);
}

// Loads `tensors` as a component and returns the error message (empty when loading succeeded).
template <typename Model, typename Config>
Status load_error(const std::string& tag, const TensorList& tensors, const Config& cfg) {
  auto ws = WeightStore::open(write_folder(tag, tensors));
  if (!ws.ok()) return ws.status();
  auto m = Model::load(cfg, *ws, cpu());
  return m.ok() ? Status::Ok() : m.status();
}

TEST(GoldenModels, MissingTensorIsNamed) {
  const Case c = load_case("v_turbo");
  const std::string dit_name = "layers.1.feed_forward.w3.weight";
  Status st = load_error<ZImageDiT>(
      "missing_dit", without(read_all(c.dir + "/model/transformer"), dit_name), c.dit);
  EXPECT_EQ(st.code(), ErrorCode::kNotFound) << st.to_string();
  EXPECT_NE(st.message().find(dit_name), std::string::npos) << st.to_string();

  const std::string vae_name = "decoder.up_blocks.1.resnets.0.conv2.bias";
  st = load_error<VaeDecoder>("missing_vae", without(read_all(c.dir + "/model/vae"), vae_name),
                              c.vae);
  EXPECT_EQ(st.code(), ErrorCode::kNotFound) << st.to_string();
  EXPECT_NE(st.message().find(vae_name), std::string::npos) << st.to_string();

  const std::string te_name = "layers.0.self_attn.k_norm.weight";
  st = load_error<Qwen3Encoder>("missing_te",
                                without(read_all(c.dir + "/model/text_encoder"), te_name), c.te);
  EXPECT_EQ(st.code(), ErrorCode::kNotFound) << st.to_string();
  EXPECT_NE(st.message().find(te_name), std::string::npos) << st.to_string();
}

TEST(GoldenModels, WrongShapeIsNamed) {
  const Case c = load_case("v_turbo");  // dim 64
  const std::string name = "noise_refiner.0.attention.to_k.weight";
  const Status st = load_error<ZImageDiT>(
      "shape_dit", reshaped(read_all(c.dir + "/model/transformer"), name, {32, 128}), c.dit);
  EXPECT_EQ(st.code(), ErrorCode::kFormat) << st.to_string();
  EXPECT_NE(st.message().find(name), std::string::npos) << st.to_string();
  EXPECT_NE(st.message().find("[32, 128]"), std::string::npos) << st.to_string();
  EXPECT_NE(st.message().find("[64, 64]"), std::string::npos) << st.to_string();

  const std::string conv = "decoder.conv_in.weight";  // [64, 16, 3, 3]
  const Status vs = load_error<VaeDecoder>(
      "shape_vae", reshaped(read_all(c.dir + "/model/vae"), conv, {16, 64, 3, 3}), c.vae);
  EXPECT_EQ(vs.code(), ErrorCode::kFormat) << vs.to_string();
  EXPECT_NE(vs.message().find(conv), std::string::npos) << vs.to_string();
}

TEST(GoldenModels, UnexpectedTensorIsNamed) {
  const Case c = load_case("v_turbo");
  TensorList list = read_all(c.dir + "/model/text_encoder");
  list.emplace_back("layers.0.self_attn.o_proj.bias",
                    find(list, "layers.0.input_layernorm.weight"));
  const Status st = load_error<Qwen3Encoder>("extra_te", list, c.te);
  EXPECT_EQ(st.code(), ErrorCode::kFormat) << st.to_string();
  EXPECT_NE(st.message().find("layers.0.self_attn.o_proj.bias"), std::string::npos)
      << st.to_string();

  TensorList dit = read_all(c.dir + "/model/transformer");
  dit.emplace_back("layers.2.ffn_norm1.weight", find(dit, "layers.1.ffn_norm1.weight"));
  const Status ds = load_error<ZImageDiT>("extra_dit", dit, c.dit);  // config says 2 layers
  EXPECT_EQ(ds.code(), ErrorCode::kFormat) << ds.to_string();
  EXPECT_NE(ds.message().find("layers.2.ffn_norm1.weight"), std::string::npos) << ds.to_string();
}

TEST(GoldenModels, BadInputsAreErrors) {
  const Case c = load_case("v_turbo");
  auto te = load_te(c);
  auto dit = load_dit(c);
  ASSERT_NE(te, nullptr);
  ASSERT_NE(dit, nullptr);
  EXPECT_EQ(te->encode({{1, 2, c.te.vocab_size}}).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(te->encode({{}}).status().code(), ErrorCode::kInvalidArgument);
  const Tensor lat = to_device(npy(c.dir + "/init_noise.npy"));       // [1, 16, 16, 16]
  const Tensor cap = to_device(npy(c.dir + "/prompt_embeds_0.npy"));  // [17, 32]
  Tensor out;
  EXPECT_EQ(dit->forward(lat, {0.f, 0.f}, {cap}, out).code(), ErrorCode::kInvalidArgument);
  const Status wrong_cap =
      dit->forward(lat, {0.f}, {to_device(npy(c.dir + "/init_noise.npy"))}, out);
  EXPECT_EQ(wrong_cap.code(), ErrorCode::kInvalidArgument) << wrong_cap.to_string();
  Tensor odd = to_device(Tensor::host(DType::kF32, {1, 16, 15, 16}));
  EXPECT_EQ(dit->forward(odd, {0.f}, {cap}, out).code(), ErrorCode::kInvalidArgument);
  // A caption too long for RoPE axis 0 (axes_lens[0] = 256 here).
  const Tensor long_cap = to_device(Tensor::host(DType::kF32, {300, c.dit.cap_feat_dim}));
  const Status too_long = dit->forward(lat, {0.f}, {long_cap}, out);
  EXPECT_EQ(too_long.code(), ErrorCode::kInvalidArgument) << too_long.to_string();
}

TEST(GoldenModels, DebugSinkWritesNamedTensors) {
  const Case c = load_case("v_turbo");
  auto dit = load_dit(c);
  ASSERT_NE(dit, nullptr);
  const std::string dir = ::testing::TempDir() + "zimage_dump_" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  auto sink = make_directory_dump_sink(dir, "step0.");
  Tensor out;
  ASSERT_TRUE(dit->forward(to_device(npy(c.dir + "/init_noise.npy")), {0.0f},
                           {to_device(npy(c.dir + "/prompt_embeds_0.npy"))}, out, sink.get(),
                           "dit.step0")
                  .ok());
  const Tensor dumped = npy(dir + "/dit.step0.out.npy");
  ASSERT_EQ(dumped.shape(), out.shape());
  EXPECT_EQ(max_abs_diff(dumped, to_host(out)), 0.0);
  EXPECT_TRUE(std::filesystem::exists(dir + "/dit.step0.layers.1.npy"));
  EXPECT_TRUE(std::filesystem::exists(dir + "/dit.step0.context_refiner.0.npy"));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace zimage
