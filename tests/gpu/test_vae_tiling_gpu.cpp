// The tiled VAE decode on CUDA: against the CPU tiled decode (and diffusers' tiled decode) on the
// golden tile cases in f32 and bf16, and the full-size Z-Image decoder (random weights) at
// 2048x2048 and 1536x2560, tiled within a stated bound of device memory; the untiled 2048²
// decode stays within its estimate too (its mid-block attention over 65536 pixels never builds
// the 65536² score matrix, 8 GiB in bf16).
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "common/npy.h"
#include "cuda_test_util.h"
#include "io/model/model_folder.h"
#include "io/writers/random_model.h"
#include "io/weights/weights.h"
#include "model/vae/vae.h"
#include "model/vae/vae_tiling.h"

namespace zimage::test {
namespace {

std::string case_dir(const std::string& name) {
  return std::string(ZIMAGE_TEST_DATA_DIR) + "/vae_tiling/" + name;
}

std::unique_ptr<VaeDecoder> load_case_vae(const std::string& name, Backend& be) {
  const std::string file = case_dir(name) + "/vae/config.json";
  std::ifstream f(file);
  std::stringstream ss;
  ss << f.rdbuf();
  auto cfg = parse_vae_config(ss.str(), file);
  EXPECT_TRUE(cfg.ok()) << cfg.status().to_string();
  auto ws = WeightStore::open(case_dir(name) + "/vae");
  EXPECT_TRUE(ws.ok()) << ws.status().to_string();
  if (!cfg.ok() || !ws.ok()) return nullptr;
  auto vae = VaeDecoder::load(*cfg, *ws, be);
  EXPECT_TRUE(vae.ok()) << vae.status().to_string();
  return vae.ok() ? std::move(vae).value() : nullptr;
}

Tensor tiled_image(const std::string& name, Backend& be) {
  auto vae = load_case_vae(name, be);
  if (!vae) return Tensor();
  auto lat = load_npy(case_dir(name) + "/latents.npy");
  EXPECT_TRUE(lat.ok());
  if (!lat.ok()) return Tensor();
  Tensor dev = take(be.upload(*lat, DType::kF32), "latents");
  auto img = vae_decode_tiled(*vae, dev);
  EXPECT_TRUE(img.ok()) << name << ": " << img.status().to_string();
  return img.ok() ? *img : Tensor();
}

// The same bounds as GoldenGpu's images: fp32 within 3e-5 of diffusers, bf16 within 6e-2.
TEST(VaeTilingGpu, TiledDecodeMatchesCpu) {
  ZI_REQUIRE_GPU();
  for (const std::string name : {"tile_f4", "tile_f8"}) {
    const Tensor cpu_img = tiled_image(name, cpu_oracle());
    auto golden = load_npy(case_dir(name) + "/image_tiled.npy");
    ASSERT_TRUE(cpu_img.defined() && golden.ok());
    for (DType dt : kDTypes) {
      auto be = make_cuda_backend(0, dt);
      ASSERT_TRUE(be.ok()) << be.status().to_string();
      const Tensor img = tiled_image(name, **be);
      ASSERT_EQ(img.shape(), cpu_img.shape()) << name;
      const double vs_cpu = max_abs_diff(img, cpu_img), vs_diffusers = max_abs_diff(img, *golden);
      std::printf("  %-8s %-4s tiled: max |cuda - cpu| %.2e, max |cuda - diffusers| %.2e\n",
                  name.c_str(), dtype_name(dt), vs_cpu, vs_diffusers);
      const double bound = dt == DType::kF32 ? 3e-5 : 6e-2;
      EXPECT_LE(vs_cpu, bound) << name << " " << dtype_name(dt);
      EXPECT_LE(vs_diffusers, bound) << name << " " << dtype_name(dt);
    }
  }
}

// Z-Image's decoder with random weights (io/writers/random_model.h's values), made on demand.
std::unique_ptr<VaeDecoder> full_size_decoder(Backend& be) {
  const VaeConfig cfg = zimage_turbo_reference_configs().vae;
  WeightStore ws = WeightStore::empty("random vae");
  for (const TensorSpec& s : vae_tensor_specs(cfg)) {
    if (s.name.rfind("decoder.", 0) != 0) continue;
    ComputedWeight w;
    w.info = {DType::kF32, s.shape, "random vae"};
    w.stored_bytes = 4;
    w.make = [s]() -> Result<Tensor> {
      Tensor t = Tensor::host(DType::kF32, s.shape);
      random_tensor_values(s, 1, 0, t.data_as<float>(), static_cast<size_t>(t.numel()));
      return t;
    };
    EXPECT_TRUE(ws.add_computed(s.name, std::move(w)).ok()) << s.name;
  }
  auto vae = VaeDecoder::load(cfg, ws, be);
  EXPECT_TRUE(vae.ok()) << vae.status().to_string();
  return vae.ok() ? std::move(vae).value() : nullptr;
}

struct Measured {
  uint64_t peak = 0;  // peak bytes in use above what was in use before the decode
  int64_t nonfinite = 0;
  double ms = 0;  // wall time of the measured run, image on the host
};

// Decodes twice (the first run plans the convolutions for every tile shape) and measures the
// second run's peak.
Measured measure(cuda::CudaBackend& be, VaeDecoder& vae, const Tensor& lat, bool tiled) {
  Measured m;
  for (int run = 0; run < 2; ++run) {
    EXPECT_TRUE(be.synchronize().ok());
    be.reset_peak_memory();
    const uint64_t base = be.memory_use().in_use;
    const auto t0 = std::chrono::steady_clock::now();
    auto img = tiled ? vae_decode_tiled(vae, lat) : vae.decode(lat);
    EXPECT_TRUE(img.ok()) << img.status().to_string();
    if (!img.ok()) return m;
    EXPECT_TRUE(be.synchronize().ok());
    m.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    m.peak = be.memory_use().peak_in_use - base;
    m.nonfinite = 0;
    const float* p = img->data_as<const float>();
    for (int64_t i = 0; i < img->numel(); ++i) m.nonfinite += std::isfinite(p[i]) ? 0 : 1;
  }
  return m;
}

double gib(uint64_t b) {
  return static_cast<double>(b) / (1u << 30);
}

// Bound: the estimate of one 1024² tile (1.25 GiB in bf16) plus kVaeTilingMargin (1 GiB) for
// convolution workspaces and the attention's score chunks, whatever the image size.
TEST(VaeTilingGpu, FullSizeLargeImagesTiledWithinBound) {
  ZI_REQUIRE_GPU();
  auto made = make_cuda_backend(0, DType::kBF16);
  ASSERT_TRUE(made.ok()) << made.status().to_string();
  auto* be = dynamic_cast<cuda::CudaBackend*>(made->get());
  ASSERT_NE(be, nullptr);
  auto vae = full_size_decoder(*be);
  ASSERT_NE(vae, nullptr);
  const uint64_t tile_est = vae->estimate_decode_bytes(1, 128, 128);
  const uint64_t bound = tile_est + kVaeTilingMargin;
  uint64_t tiled_2048 = 0;
  for (auto [h, w] : {std::pair<int64_t, int64_t>{256, 256}, {192, 320}}) {
    const Tensor lat = take(
        be->upload(rand_host({1, 16, h, w}, 5, DType::kF32, -2.f, 2.f), DType::kF32), "latents");
    const Measured m = measure(*be, *vae, lat, true);
    std::printf(
        "  %lldx%lld tiled bf16: peak %.2f GiB above the weights (bound %.2f GiB; "
        "untiled estimate %.2f GiB), %.0f ms\n",
        static_cast<long long>(w * 8), static_cast<long long>(h * 8), gib(m.peak), gib(bound),
        gib(vae->estimate_decode_bytes(1, h, w)), m.ms);
    EXPECT_EQ(m.nonfinite, 0);
    EXPECT_LE(m.peak, bound) << h << "x" << w;
    if (h == 256) tiled_2048 = m.peak;
  }
  // Untiled 2048²: within its own estimate plus the margin (5 + 1 GiB), so no 8 GiB score matrix.
  const Tensor lat =
      take(be->upload(rand_host({1, 16, 256, 256}, 5, DType::kF32, -2.f, 2.f), DType::kF32), "lat");
  const Measured u = measure(*be, *vae, lat, false);
  const uint64_t est = vae->estimate_decode_bytes(1, 256, 256);
  std::printf(
      "  2048x2048 untiled bf16: peak %.2f GiB above the weights (estimate %.2f GiB), "
      "%.0f ms\n",
      gib(u.peak), gib(est), u.ms);
  EXPECT_EQ(u.nonfinite, 0);
  EXPECT_LE(u.peak, est + kVaeTilingMargin);
  EXPECT_LT(tiled_2048, u.peak);
  // The policy with a budget between the two picks tiling; with the untiled need, not.
  EXPECT_TRUE(vae_should_tile(*vae, {VaeTiling::kAuto, bound}, 1, 256, 256));
  EXPECT_FALSE(vae_should_tile(*vae, {VaeTiling::kAuto, est}, 1, 256, 256));
  std::string why;
  const bool auto_tiles = vae_should_tile(*vae, {VaeTiling::kAuto, 0}, 1, 256, 256, &why);
  std::printf("  auto with the free device memory at 2048²: %s (%s)\n",
              auto_tiles ? "tiled" : "untiled", why.c_str());
  // Under an allocator cap (--vram-budget) 3 GiB above what is held, auto tiles 2048² and the
  // decode succeeds within the cap (untiled it would need 5 GiB).
  ZI_ASSERT_OK(be->empty_cache());
  be->set_memory_limit(be->memory_use().reserved + (uint64_t{3} << 30));
  EXPECT_TRUE(vae_should_tile(*vae, {VaeTiling::kAuto, 0}, 1, 256, 256, &why)) << why;
  std::printf("  auto under a cap 3 GiB above the weights: %s\n", why.c_str());
  auto capped = vae_decode_with_policy(*vae, lat, {VaeTiling::kAuto, 0});
  EXPECT_TRUE(capped.ok()) << capped.status().to_string();
  auto refused = vae->decode(lat);  // the untiled decode does not fit the cap
  EXPECT_FALSE(refused.ok());
  if (!refused.ok()) {
    EXPECT_EQ(refused.status().code(), ErrorCode::kOutOfMemory) << refused.status().to_string();
  }
  be->set_memory_limit(0);
}

}  // namespace
}  // namespace zimage::test
