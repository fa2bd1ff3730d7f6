// Live previews on the GPU: Backend::latent_to_rgb against the CPU oracle (byte for byte: the
// kernel keeps the oracle's order and roundings), and its cost at the latent sizes of 1024² and
// 2048² images next to a whole preview (projection + download), printed for docs/SERVER.md.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

#include "cuda_test_util.h"
#include "pipeline/latent_preview.h"

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

}  // namespace
}  // namespace zimage::test
