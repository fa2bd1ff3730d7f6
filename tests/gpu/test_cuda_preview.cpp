// Colours made on the GPU. Live previews: Backend::latent_to_rgb against the CPU oracle (byte for
// byte: the kernel keeps the oracle's order and roundings), and its cost at the latent sizes of
// 1024² and 2048² images next to a whole preview (projection + download), printed for
// docs/SERVER.md. The decoded image: Backend::image_to_rgb8 against the CPU oracle and against the
// path it replaces (postprocess's ops on the GPU, the f32 image downloaded, to_u8 on the host),
// byte for byte, and the two paths' cost at 1024² and 2048².
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

#include "cuda_test_util.h"
#include "pipeline/latent_preview.h"
#include "pipeline/text_to_image.h"

namespace zimage::test {
namespace {

TEST(CudaPreview, LatentToRgbMatchesCpu) {
  ZI_REQUIRE_GPU();
  const LatentRgbMap& map = flux_latent_rgb_map();
  for (DType act : {DType::kBF16, DType::kF32}) {  // latents are f32 whatever the compute dtype
    Backend& g = *gpu(act);
    for (const Shape& s : {Shape{1, 16, 128, 128}, Shape{2, 16, 33, 17}, Shape{1, 16, 1, 1}}) {
      Tensor lat = rand_host(s, 920, DType::kF32, -6.f, 6.f);  // saturates both ends too
      if (s[2] == 33) lat.data_as<float>()[5] = std::numeric_limits<float>::quiet_NaN();
      const Shape rs{s[0], s[2], s[3], 3};
      Tensor want = Tensor::host(DType::kU8, rs);
      ZI_ASSERT_OK(cpu_oracle().latent_to_rgb(lat, map, want));
      Tensor gl = take(g.upload(lat, DType::kF32), "lat");
      Tensor gr = take(g.alloc(DType::kU8, rs), "rgb");
      ZI_ASSERT_OK(g.latent_to_rgb(gl, map, gr));
      Tensor got = Tensor::host(DType::kU8, rs);
      ZI_ASSERT_OK(g.download(gr, got));
      const auto* a = static_cast<const uint8_t*>(got.data());
      const auto* b = static_cast<const uint8_t*>(want.data());
      int max_diff = 0;
      int64_t differ = 0;
      for (int64_t i = 0; i < got.numel(); ++i) {
        const int d = std::abs(int{a[i]} - int{b[i]});
        max_diff = std::max(max_diff, d);
        differ += d != 0;
      }
      std::printf("latent_to_rgb %s [%lld, 16, %lld, %lld]: %lld of %lld bytes differ, max %d\n",
                  dtype_name(act), static_cast<long long>(s[0]), static_cast<long long>(s[2]),
                  static_cast<long long>(s[3]), static_cast<long long>(differ),
                  static_cast<long long>(got.numel()), max_diff);
      EXPECT_EQ(max_diff, 0) << dtype_name(act) << " " << shape_string(s);
    }
  }
}

TEST(CudaPreview, Cost) {
  ZI_REQUIRE_GPU();
  Backend& g = *gpu(DType::kBF16);
  for (int64_t side : {128, 256}) {  // 1024² and 2048² images
    Tensor lat =
        take(g.upload(rand_host({1, 16, side, side}, 921, DType::kF32), DType::kF32), "lat");
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(latent_preview(g, lat, 1, 8).ok());  // warm up
    constexpr int kRuns = 50;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < kRuns; ++i) {
      auto p = latent_preview(g, lat, 1, 8);
      ASSERT_TRUE(p.ok()) << p.status().to_string();
      ASSERT_EQ(p->rgb.size(), static_cast<size_t>(side * side * 3));
    }
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() /
        kRuns;
    std::printf("preview of a %lldx%lld latent (projection + download): %.3f ms\n",
                static_cast<long long>(side), static_cast<long long>(side), ms);
  }
}

// The old path on `g`: VaeDecoder::postprocess's ops, the f32 image downloaded, to_u8 per value.
std::vector<uint8_t> rgb8_through_f32(Backend& g, const Tensor& x) {
  Tensor y = take(g.alloc(x.dtype(), x.shape()), "y");
  EXPECT_TRUE(g.axpby(0.5f, x, 0.0f, x, y).ok());
  Tensor half = take(g.alloc(x.dtype(), {1}), "half");
  EXPECT_TRUE(g.fill(half, 0.5f).ok());
  EXPECT_TRUE(g.add(y, half, y).ok());
  EXPECT_TRUE(g.clamp(y, 0.0f, 1.0f, y).ok());
  Tensor img = Tensor::host(DType::kF32, x.shape());
  EXPECT_TRUE(g.download(y, img).ok());
  std::vector<uint8_t> out(static_cast<size_t>(img.numel()));
  const float* p = img.data_as<float>();
  for (size_t k = 0; k < out.size(); ++k) out[k] = to_u8(p[k]);
  return out;
}

std::vector<uint8_t> rgb8_on_device(Backend& g, const Tensor& x) {
  Tensor rgb = take(g.alloc(DType::kU8, x.shape()), "rgb");
  EXPECT_TRUE(g.image_to_rgb8(x, rgb).ok());
  Tensor h = Tensor::host(DType::kU8, x.shape());
  EXPECT_TRUE(g.download(rgb, h).ok());
  const auto* p = static_cast<const uint8_t*>(h.data());
  return std::vector<uint8_t>(p, p + h.numel());
}

TEST(CudaPreview, ImageToRgb8MatchesCpuAndTheFloatPath) {
  ZI_REQUIRE_GPU();
  for (DType act : {DType::kBF16, DType::kF32}) {  // the CUDA backend's compute dtypes
    ASSERT_NE(gpu(act), nullptr) << dtype_name(act);
    Backend& g = *gpu(act);
    for (const Shape& s : {Shape{1, 64, 48, 3}, Shape{2, 17, 33, 3}}) {
      Tensor host = rand_host(s, 922, DType::kF32, -1.6f, 1.6f);  // saturates both ends
      host.data_as<float>()[0] = 0.0f;
      host.data_as<float>()[1] = 1.0f;
      host.data_as<float>()[2] = -1.0f;
      Tensor x = take(g.upload(host, act), "x");
      // The CPU oracle on the very values the GPU holds (x downloaded in its own dtype).
      Tensor xh = Tensor::host(act, s);
      ZI_ASSERT_OK(g.download(x, xh));
      Tensor want = Tensor::host(DType::kU8, s);
      ZI_ASSERT_OK(cpu_oracle().image_to_rgb8(xh, want));
      const auto* w = static_cast<const uint8_t*>(want.data());
      const std::vector<uint8_t> got = rgb8_on_device(g, x);
      const std::vector<uint8_t> old = rgb8_through_f32(g, x);
      int64_t vs_cpu = 0, vs_old = 0;
      for (size_t k = 0; k < got.size(); ++k) {
        vs_cpu += got[k] != w[k];
        vs_old += got[k] != old[k];
      }
      std::printf("image_to_rgb8 %s %s: %lld bytes differ from the CPU, %lld from the f32 path\n",
                  dtype_name(act), shape_string(s).c_str(), static_cast<long long>(vs_cpu),
                  static_cast<long long>(vs_old));
      EXPECT_EQ(vs_cpu, 0) << dtype_name(act);
      EXPECT_EQ(vs_old, 0) << dtype_name(act);
    }
    if (act == DType::kBF16) {
      // Every bf16 bit pattern (NaN, ±Inf, subnormals, ±0, the largest) against the old path.
      Tensor all = Tensor::host(DType::kBF16, {65536});
      auto* ap = static_cast<uint16_t*>(all.data());
      for (int k = 0; k < 65536; ++k) ap[k] = static_cast<uint16_t>(k);
      Tensor x = take(g.upload(all, DType::kBF16), "all bf16");
      const std::vector<uint8_t> got = rgb8_on_device(g, x);
      const std::vector<uint8_t> old = rgb8_through_f32(g, x);
      int64_t differ = 0;
      for (size_t k = 0; k < got.size(); ++k) differ += got[k] != old[k];
      std::printf("image_to_rgb8 bf16, all 65536 patterns: %lld bytes differ from the f32 path\n",
                  static_cast<long long>(differ));
      EXPECT_EQ(differ, 0);
    }
    // NaN and ±Inf give 0 (the pipeline has counted them first).
    Tensor bad = Tensor::host(DType::kF32, {1, 1, 1, 3});
    bad.data_as<float>()[0] = std::numeric_limits<float>::quiet_NaN();
    bad.data_as<float>()[1] = std::numeric_limits<float>::infinity();
    bad.data_as<float>()[2] = -std::numeric_limits<float>::infinity();
    const std::vector<uint8_t> z = rgb8_on_device(g, take(g.upload(bad, act), "bad"));
    EXPECT_EQ(z, std::vector<uint8_t>(3, 0)) << dtype_name(act);
  }
}

TEST(CudaPreview, ImageToRgb8Cost) {
  ZI_REQUIRE_GPU();
  ASSERT_NE(gpu(DType::kBF16), nullptr);
  Backend& g = *gpu(DType::kBF16);
  for (int64_t side : {1024, 2048}) {
    Tensor x = take(
        g.upload(rand_host({1, side, side, 3}, 923, DType::kF32, -1.2f, 1.2f), DType::kBF16), "x");
    const auto time_ms = [&](auto&& f) {
      f();  // warm up
      constexpr int kRuns = 10;
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < kRuns; ++i) f();
      return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                 .count() /
             kRuns;
    };
    const double ms_old = time_ms([&] { (void)rgb8_through_f32(g, x); });
    const double ms_new = time_ms([&] {
      ASSERT_TRUE(g.count_nonfinite(x).ok());
      (void)rgb8_on_device(g, x);
    });
    std::printf(
        "decoded %lld² image to RGB8: f32 download + host to_u8 %.2f ms, count + "
        "image_to_rgb8 + byte download %.2f ms\n",
        static_cast<long long>(side), ms_old, ms_new);
  }
}

}  // namespace
}  // namespace zimage::test
