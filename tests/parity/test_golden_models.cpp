// Golden parity of the three models on the CPU backend (fp32, the oracle) against tensors dumped
// by diffusers / transformers on the same tiny random checkpoints (tests/data/golden, made by
// tools/make_goldens.py, whose header lists the files): text-encoder embeddings, DiT outputs at
// step 0 and at a later step, the decoded image; and the VAE encoder against a naive
// double-precision reference.
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

// ---- text encoder ----

void check_text_encoder(const std::string& name, double tol) {
  const Case c = load_case(name);
  auto te = load_te(c);
  ASSERT_NE(te, nullptr);
  EXPECT_EQ(te->layers_run(), c.te.num_hidden_layers - 1);
  // All prompts (and the negative one) as one right-padded batch of different lengths.
  std::vector<std::vector<int32_t>> batch = c.ids;
  if (c.cfg) batch.push_back(c.neg_ids);
  auto out = te->encode(batch);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  ASSERT_EQ(out->size(), batch.size());
  for (size_t i = 0; i < c.ids.size(); ++i) {
    const Tensor ref = npy(c.dir + "/prompt_embeds_" + std::to_string(i) + ".npy");
    const Tensor got = to_host((*out)[i]);
    ASSERT_EQ(got.shape(), ref.shape()) << "prompt " << i;
    const double err = max_abs_diff(got, ref);
    report(name + " te prompt " + std::to_string(i), err);
    EXPECT_LE(err, tol);
  }
  // Each prompt alone gives the same rows as inside the padded batch.
  for (size_t i = 0; i < batch.size(); ++i) {
    auto single = te->encode({batch[i]});
    ASSERT_TRUE(single.ok()) << single.status().to_string();
    const double err = max_abs_diff(to_host((*single)[0]), to_host((*out)[i]));
    report(name + " te single-vs-batch " + std::to_string(i), err);
    EXPECT_LE(err, 1e-6);
  }
}

// ---- DiT ----

// Runs the DiT on the golden input of `step` and compares with debug/dit_out_step<step>.npy.
// The DiT batch is built as the pipeline does: each prompt's embeddings repeated
// images_per_prompt times; on CFG steps (not skipped by cfg_truncation) latents twice and the
// negative embeddings (from our encoder) after the positive ones.
void check_dit_step(const std::string& name, int step, double tol) {
  const Case c = load_case(name);
  auto dit = load_dit(c);
  ASSERT_NE(dit, nullptr);
  const Tensor lat =
      npy(c.dir + (step == 0 ? std::string("/init_noise.npy")
                             : "/debug/latents_after_step" + std::to_string(step - 1) + ".npy"));
  ASSERT_TRUE(lat.defined());
  std::vector<Tensor> caps;
  for (size_t i = 0; i < c.ids.size(); ++i) {
    const Tensor e = to_device(npy(c.dir + "/prompt_embeds_" + std::to_string(i) + ".npy"));
    for (int k = 0; k < c.images_per_prompt; ++k) caps.push_back(e);
  }
  ASSERT_EQ(static_cast<int64_t>(caps.size()), lat.dim(0));
  const float t_model = t_model_at(c.steps, step);
  const bool cfg_step = c.cfg && !(c.cfg_truncation <= 1.0 && t_model > c.cfg_truncation);
  Tensor input = lat;
  if (cfg_step) {
    auto te = load_te(c);
    ASSERT_NE(te, nullptr);
    auto neg = te->encode(std::vector<std::vector<int32_t>>(c.ids.size(), c.neg_ids));
    ASSERT_TRUE(neg.ok()) << neg.status().to_string();
    for (const Tensor& t : *neg)
      for (int k = 0; k < c.images_per_prompt; ++k) caps.push_back(t);
    input = cat0({lat, lat});
  }
  const int64_t b = input.dim(0);
  const std::vector<float> t(static_cast<size_t>(b), t_model);
  Tensor out;
  const Status st = dit->forward(to_device(input), t, caps, out);
  ASSERT_TRUE(st.ok()) << st.to_string();
  const Tensor ref = npy(c.dir + "/debug/dit_out_step" + std::to_string(step) + ".npy");
  ASSERT_EQ(ref.numel(), out.numel()) << ref.describe() << " vs " << out.describe();
  const double err = max_abs_diff(to_host(out), ref);
  report(name + " dit step " + std::to_string(step) + " (batch " + std::to_string(b) + ")", err);
  EXPECT_LE(err, tol);
}

// ---- VAE ----

void check_vae(const std::string& name, double tol) {
  const Case c = load_case(name);
  auto vae = load_vae(c);
  ASSERT_NE(vae, nullptr);
  const Tensor lat =
      npy(c.dir + "/debug/latents_after_step" + std::to_string(c.steps - 1) + ".npy");
  auto img = vae->decode(to_device(lat));
  ASSERT_TRUE(img.ok()) << img.status().to_string();
  const Tensor ref = npy(c.dir + "/image.npy");
  ASSERT_EQ(img->shape(), ref.shape());
  const double err = max_abs_diff(*img, ref);
  report(name + " vae image", err);
  EXPECT_LE(err, tol);
}

// Every golden case: text encoder, DiT at step 0 and at its last step, VAE decode.
// Measured max |diff| over the nine cases (CPU fp32): text encoder 1.9e-8, DiT 5.9e-6,
// VAE image 1.6e-6; the tolerances sit a little above.
#define ZIMAGE_GOLDEN_CASE(Name, id, steps) \
  TEST(GoldenModels, TextEncoder_##Name) {  \
    check_text_encoder(id, kTeTol);         \
  }                                         \
  TEST(GoldenModels, DiTFirstStep_##Name) { \
    check_dit_step(id, 0, kDitTol);         \
  }                                         \
  TEST(GoldenModels, DiTLastStep_##Name) {  \
    check_dit_step(id, steps - 1, kDitTol); \
  }                                         \
  TEST(GoldenModels, VaeDecode_##Name) {    \
    check_vae(id, kVaeTol);                 \
  }

constexpr double kTeTol = 1e-7;
constexpr double kDitTol = 1.5e-5;
constexpr double kVaeTol = 5e-6;

ZIMAGE_GOLDEN_CASE(Turbo, "v_turbo", 2)
ZIMAGE_GOLDEN_CASE(Cfg, "v_cfg", 3)
ZIMAGE_GOLDEN_CASE(Batch, "v_batch", 2)
ZIMAGE_GOLDEN_CASE(BatchCfg, "v_batch_cfg", 2)
ZIMAGE_GOLDEN_CASE(CfgTruncation, "v_cfg_trunc", 4)
ZIMAGE_GOLDEN_CASE(ImagesPerPrompt, "v_multi", 2)
ZIMAGE_GOLDEN_CASE(Tall, "v_tall", 2)
ZIMAGE_GOLDEN_CASE(Wide, "v_wide", 3)
ZIMAGE_GOLDEN_CASE(Vae8, "v_vae8", 2)

// ---- VAE encoder: no upstream golden yet; checked against a naive double-precision
// re-implementation of diffusers' Encoder written here from spec §8 (diffusers names only). ----

struct RefMap {  // NHWC feature map in double
  int64_t h = 0, w = 0, c = 0;
  std::vector<double> v;
  double& at(int64_t y, int64_t x, int64_t ch) { return v[(y * w + x) * c + ch]; }
};

std::vector<double> ref_weights(const WeightStore& ws, const std::string& name) {
  auto t = ws.get(name);
  EXPECT_TRUE(t.ok()) << t.status().to_string();
  if (!t.ok()) return {};
  std::vector<float> f(static_cast<size_t>(t->numel()));
  convert_to_f32(t->dtype(), t->data(), f.data(), f.size());
  return std::vector<double>(f.begin(), f.end());
}

// Conv2d, weight OIHW as stored; zero padding (top, left) = pt, (bottom, right) = pb.
RefMap ref_conv(const WeightStore& ws, const std::string& p, const RefMap& x, int64_t k,
                int64_t stride, int64_t pt, int64_t pb) {
  const std::vector<double> w = ref_weights(ws, p + "weight"), b = ref_weights(ws, p + "bias");
  RefMap y;
  y.c = static_cast<int64_t>(b.size());
  y.h = (x.h + pt + pb - k) / stride + 1;
  y.w = (x.w + pt + pb - k) / stride + 1;
  y.v.assign(static_cast<size_t>(y.h * y.w * y.c), 0.0);
  for (int64_t oy = 0; oy < y.h; ++oy)
    for (int64_t ox = 0; ox < y.w; ++ox)
      for (int64_t o = 0; o < y.c; ++o) {
        double acc = b[static_cast<size_t>(o)];
        for (int64_t ky = 0; ky < k; ++ky)
          for (int64_t kx = 0; kx < k; ++kx) {
            const int64_t iy = oy * stride + ky - pt, ix = ox * stride + kx - pt;
            if (iy < 0 || ix < 0 || iy >= x.h || ix >= x.w) continue;
            for (int64_t i = 0; i < x.c; ++i)
              acc += w[static_cast<size_t>(((o * x.c + i) * k + ky) * k + kx)] *
                     x.v[static_cast<size_t>((iy * x.w + ix) * x.c + i)];
          }
        y.at(oy, ox, o) = acc;
      }
  return y;
}

RefMap ref_group_norm(const WeightStore& ws, const std::string& p, RefMap x, int groups,
                      bool silu) {
  const std::vector<double> g = ref_weights(ws, p + "weight"), b = ref_weights(ws, p + "bias");
  const int64_t cg = x.c / groups, n = x.h * x.w;
  for (int64_t gi = 0; gi < groups; ++gi) {
    double sum = 0, sq = 0;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t ch = gi * cg; ch < (gi + 1) * cg; ++ch) sum += x.v[i * x.c + ch];
    const double mean = sum / static_cast<double>(n * cg);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t ch = gi * cg; ch < (gi + 1) * cg; ++ch)
        sq += (x.v[i * x.c + ch] - mean) * (x.v[i * x.c + ch] - mean);
    const double rstd = 1.0 / std::sqrt(sq / static_cast<double>(n * cg) + 1e-6);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t ch = gi * cg; ch < (gi + 1) * cg; ++ch) {
        double v = (x.v[i * x.c + ch] - mean) * rstd * g[ch] + b[ch];
        if (silu) v = v / (1.0 + std::exp(-v));
        x.v[i * x.c + ch] = v;
      }
  }
  return x;
}

RefMap ref_resnet(const WeightStore& ws, const std::string& p, const RefMap& x, int groups) {
  RefMap h =
      ref_conv(ws, p + "conv1.", ref_group_norm(ws, p + "norm1.", x, groups, true), 3, 1, 1, 1);
  h = ref_conv(ws, p + "conv2.", ref_group_norm(ws, p + "norm2.", h, groups, true), 3, 1, 1, 1);
  const RefMap s = ws.contains(p + "conv_shortcut.weight")
                       ? ref_conv(ws, p + "conv_shortcut.", x, 1, 1, 0, 0)
                       : x;
  for (size_t i = 0; i < h.v.size(); ++i) h.v[i] += s.v[i];
  return h;
}

RefMap ref_attention(const WeightStore& ws, const std::string& p, const RefMap& x, int groups) {
  const RefMap n = ref_group_norm(ws, p + "group_norm.", x, groups, false);
  const int64_t t = x.h * x.w, c = x.c;
  auto linear = [&](const std::string& name, const std::vector<double>& in) {
    const std::vector<double> w = ref_weights(ws, p + name + ".weight");
    const std::vector<double> b = ref_weights(ws, p + name + ".bias");
    std::vector<double> out(static_cast<size_t>(t * c));
    for (int64_t i = 0; i < t; ++i)
      for (int64_t o = 0; o < c; ++o) {
        double acc = b[o];
        for (int64_t k = 0; k < c; ++k) acc += w[o * c + k] * in[i * c + k];
        out[i * c + o] = acc;
      }
    return out;
  };
  const auto q = linear("to_q", n.v), k = linear("to_k", n.v), v = linear("to_v", n.v);
  std::vector<double> o(static_cast<size_t>(t * c), 0.0), sc(static_cast<size_t>(t));
  for (int64_t i = 0; i < t; ++i) {
    double mx = -1e300, sum = 0;
    for (int64_t j = 0; j < t; ++j) {
      double d = 0;
      for (int64_t ch = 0; ch < c; ++ch) d += q[i * c + ch] * k[j * c + ch];
      sc[j] = d / std::sqrt(static_cast<double>(c));
      mx = std::max(mx, sc[j]);
    }
    for (int64_t j = 0; j < t; ++j) sum += (sc[j] = std::exp(sc[j] - mx));
    for (int64_t j = 0; j < t; ++j)
      for (int64_t ch = 0; ch < c; ++ch) o[i * c + ch] += sc[j] / sum * v[j * c + ch];
  }
  RefMap y = x;
  const auto out = linear("to_out.0", o);
  for (size_t i = 0; i < y.v.size(); ++i) y.v[i] += out[i];
  return y;
}

// image NHWC in [-1, 1] -> conv_out features [h, w, 2 * latent] (one batch item).
RefMap ref_encoder(const WeightStore& ws, const VaeConfig& cfg, RefMap x) {
  const int g = cfg.norm_num_groups, n = static_cast<int>(cfg.block_out_channels.size());
  x = ref_conv(ws, "encoder.conv_in.", x, 3, 1, 1, 1);
  for (int i = 0; i < n; ++i) {
    const std::string p = "encoder.down_blocks." + std::to_string(i) + ".";
    for (int j = 0; j < cfg.layers_per_block; ++j)
      x = ref_resnet(ws, p + "resnets." + std::to_string(j) + ".", x, g);
    if (i < n - 1) x = ref_conv(ws, p + "downsamplers.0.conv.", x, 3, 2, 0, 1);
  }
  x = ref_resnet(ws, "encoder.mid_block.resnets.0.", x, g);
  x = ref_attention(ws, "encoder.mid_block.attentions.0.", x, g);
  x = ref_resnet(ws, "encoder.mid_block.resnets.1.", x, g);
  x = ref_group_norm(ws, "encoder.conv_norm_out.", x, g, true);
  return ref_conv(ws, "encoder.conv_out.", x, 3, 1, 1, 1);
}

void check_vae_encoder(const std::string& name, double tol) {
  const Case c = load_case(name);
  auto ws = WeightStore::open(c.dir + "/model/vae");
  ASSERT_TRUE(ws.ok()) << ws.status().to_string();
  auto enc = VaeEncoder::load(c.vae, *ws, cpu());
  ASSERT_TRUE(enc.ok()) << enc.status().to_string();
  Tensor img = npy(c.dir + "/image.npy");  // [B, H, W, 3] in [0, 1]
  ASSERT_TRUE(img.defined());
  for (int64_t i = 0; i < img.numel(); ++i)
    img.data_as<float>()[i] = img.data_as<float>()[i] * 2.0f - 1.0f;  // -> [-1, 1]
  Tensor mean, logvar;
  const Status st = (*enc)->encode(to_device(img), mean, logvar);
  ASSERT_TRUE(st.ok()) << st.to_string();
  const int64_t b = img.dim(0), f = c.vae.spatial_factor(), lat = c.vae.latent_channels;
  const int64_t h = img.dim(1) / f, w = img.dim(2) / f;
  ASSERT_EQ(mean.shape(), (Shape{b, lat, h, w}));
  ASSERT_EQ(logvar.shape(), (Shape{b, lat, h, w}));
  const Tensor mh = to_host(mean), lh = to_host(logvar);
  double err = 0, scale = 0;
  for (int64_t bi = 0; bi < b; ++bi) {
    RefMap x;
    x.h = img.dim(1), x.w = img.dim(2), x.c = img.dim(3);
    const float* src = img.data_as<float>() + bi * x.h * x.w * x.c;
    x.v.assign(src, src + x.h * x.w * x.c);
    const RefMap r = ref_encoder(*ws, c.vae, x);  // [h, w, 2 * lat]
    ASSERT_EQ(r.h, h);
    ASSERT_EQ(r.w, w);
    for (int64_t ch = 0; ch < lat; ++ch)
      for (int64_t y = 0; y < h; ++y)
        for (int64_t xx = 0; xx < w; ++xx) {
          const int64_t o = ((bi * lat + ch) * h + y) * w + xx;
          const double rm = r.v[(y * w + xx) * r.c + ch];
          const double rl = std::clamp(r.v[(y * w + xx) * r.c + lat + ch], -30.0, 20.0);
          err = std::max({err, std::fabs(mh.data_as<float>()[o] - rm),
                          std::fabs(lh.data_as<float>()[o] - rl)});
          scale = std::max(scale, std::fabs(rm));
        }
  }
  report(name + " vae encoder (vs naive f64)", err);
  EXPECT_GT(scale, 1e-3);  // the comparison is not vacuous
  EXPECT_LE(err, tol);
}

TEST(GoldenModels, VaeEncoderMatchesNaiveReference2Blocks) {
  check_vae_encoder("v_turbo", 5e-6);
}
TEST(GoldenModels, VaeEncoderMatchesNaiveReference4Blocks) {
  check_vae_encoder("v_cfg", 5e-6);
}

}  // namespace
}  // namespace zimage
