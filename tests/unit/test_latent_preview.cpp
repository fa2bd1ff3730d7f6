// Live previews (GenerateHooks::on_preview): the CPU latent_to_rgb oracle against a double
// reference, its argument errors, its cost at a 1024² image's latent size, and the engine's
// contract: no preview op runs unless a request asks (the process-wide counter does not move),
// one preview per denoising step when it does, for the first image at latent resolution.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>

#include "backend/backend.h"
#include "common/tiny_engine.h"
#include "pipeline/latent_preview.h"
#include "zimage/zimage.h"

namespace zimage::test {
namespace {

Tensor random_latents(const Shape& s, uint32_t seed) {
  Tensor t = Tensor::host(DType::kF32, s);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-6.0f, 6.0f);
  for (int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = u(rng);
  return t;
}

TEST(LatentPreview, CpuOracleMatchesDoubleReference) {
  auto be = make_cpu_backend(2);
  const LatentRgbMap& map = flux_latent_rgb_map();
  const Shape s{2, 16, 9, 7};
  Tensor lat = random_latents(s, 5);
  Tensor rgb = Tensor::host(DType::kU8, {2, 9, 7, 3});
  ASSERT_TRUE(be->latent_to_rgb(lat, map, rgb).ok());
  const int64_t hw = 9 * 7;
  int max_diff = 0, saturated = 0;
  for (int64_t img = 0; img < 2; ++img) {
    for (int64_t p = 0; p < hw; ++p) {
      for (int k = 0; k < 3; ++k) {
        double v = map.bias[k];
        for (int c = 0; c < 16; ++c)
          v += double{map.weight[c][k]} * lat.data_as<float>()[(img * 16 + c) * hw + p];
        const double u = std::clamp((v + 1.0) / 2.0, 0.0, 1.0);
        const int want = static_cast<int>(u * 255.0);
        const int got = static_cast<const uint8_t*>(rgb.data())[(img * hw + p) * 3 + k];
        max_diff = std::max(max_diff, std::abs(got - want));
        saturated += want == 0 || want == 255;
      }
    }
  }
  // float32 sums against double: a truncation may land one byte apart at an integer boundary.
  std::printf("latent_to_rgb vs double: max %d byte(s), %d of %lld values saturated\n", max_diff,
              saturated, static_cast<long long>(rgb.numel()));
  EXPECT_LE(max_diff, 1);
  EXPECT_GT(saturated, 0);  // the range ±6 reaches both ends
}

TEST(LatentPreview, ArgumentErrorsNameTheTensor) {
  auto be = make_cpu_backend(1);
  Tensor lat = random_latents({1, 16, 4, 4}, 6);
  Tensor bad = Tensor::host(DType::kU8, {1, 4, 5, 3});
  Status st = be->latent_to_rgb(lat, flux_latent_rgb_map(), bad);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("latent_to_rgb: rgb"), std::string::npos) << st.to_string();
  Tensor f = Tensor::host(DType::kF32, {1, 4, 4, 3});
  st = be->latent_to_rgb(lat, flux_latent_rgb_map(), f);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("dtype must be u8"), std::string::npos) << st.to_string();
  Tensor rgb = Tensor::host(DType::kU8, {1, 4, 4, 3});
  st = be->latent_to_rgb(random_latents({1, 4, 4, 4}, 7), flux_latent_rgb_map(), rgb);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("must be [n, 16, h, w]"), std::string::npos) << st.to_string();
}

// What a preview costs on the CPU at a 1024² image's latents (128x128): the projection and the
// copy of 49152 bytes (a download is a copy on the CPU). Printed; bounded loosely so a pathological
// slowdown fails.
TEST(LatentPreview, CpuCostPerStep) {
  auto be = make_cpu_backend(2);
  Tensor lat = random_latents({1, 16, 128, 128}, 8);
  constexpr int kRuns = 20;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kRuns; ++i) {
    auto p = latent_preview(*be, lat, 1, 8);
    ASSERT_TRUE(p.ok()) << p.status().to_string();
    ASSERT_EQ(p->width, 128);
    ASSERT_EQ(p->rgb.size(), 128u * 128u * 3u);
  }
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() /
      kRuns;
  std::printf("CPU preview of a 128x128 latent (2 threads): %.3f ms per step\n", ms);
  EXPECT_LT(ms, 200.0);
}

class EnginePreview : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { engine_ = load_tiny_engine().release(); }
  static void TearDownTestSuite() {
    delete engine_;
    engine_ = nullptr;
  }
  static GenerateRequest request() {
    GenerateRequest r;
    r.prompts = {"a preview"};
    r.width = r.height = 64;
    r.steps = 3;
    r.seed = 7;
    r.images_per_prompt = 2;
    return r;
  }
  static Engine* engine_;
};
Engine* EnginePreview::engine_ = nullptr;

TEST_F(EnginePreview, NoPreviewOpRunsWithoutOptIn) {
  ASSERT_NE(engine_, nullptr);
  const uint64_t before = latent_previews_computed();
  auto plain = engine_->generate(request());
  ASSERT_TRUE(plain.ok()) << plain.status().to_string();
  EXPECT_EQ(latent_previews_computed(), before);

  // A hook whose flag reads false: still none.
  std::atomic<bool> off{false};
  int calls = 0;
  GenerateHooks hooks;
  hooks.on_preview = [&calls](const Preview&) { ++calls; };
  hooks.preview_enabled = &off;
  auto gated = engine_->generate(request(), hooks);
  ASSERT_TRUE(gated.ok()) << gated.status().to_string();
  EXPECT_EQ(latent_previews_computed(), before);
  EXPECT_EQ(calls, 0);
  EXPECT_EQ(gated->images[0].rgb, plain->images[0].rgb);
}

TEST_F(EnginePreview, OnePreviewPerStepOfTheFirstImage) {
  ASSERT_NE(engine_, nullptr);
  const EngineInfo info = engine_->info();
  const uint64_t before = latent_previews_computed();
  std::vector<Preview> seen;
  GenerateHooks hooks;
  hooks.on_preview = [&seen](const Preview& p) { seen.push_back(p); };
  auto r = engine_->generate(request(), hooks);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  ASSERT_EQ(seen.size(), 3u);
  EXPECT_EQ(latent_previews_computed(), before + 3);
  for (size_t i = 0; i < seen.size(); ++i) {
    EXPECT_EQ(seen[i].step, static_cast<int>(i) + 1);
    EXPECT_EQ(seen[i].total, 3);
    EXPECT_EQ(seen[i].width, 64 / info.vae_factor);
    EXPECT_EQ(seen[i].height, 64 / info.vae_factor);
    EXPECT_EQ(seen[i].rgb.size(), static_cast<size_t>(seen[i].width * seen[i].height * 3));
  }
  EXPECT_NE(seen.front().rgb, seen.back().rgb);  // the latents move between steps
  // Previews change nothing in the result.
  auto plain = engine_->generate(request());
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(r->images[0].rgb, plain->images[0].rgb);
  EXPECT_EQ(r->images[1].rgb, plain->images[1].rgb);
}

}  // namespace
}  // namespace zimage::test
