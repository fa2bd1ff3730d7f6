// The plan cache on the GPU: a VAE decode (bf16: cuDNN convolution graphs) in a fresh backend
// searches the convolution plans and records the winners and the built plans themselves; a second
// backend on the same cache loads the saved plans (nothing built) and decodes the identical image,
// as does one whose saved plans are damaged (dropped, the recorded winners built again); a corrupt
// cache file and bogus plan indices are ignored (searched again) and the decode stays correct.
// A backend warmed up beside the load (Backend::warm_up) loads every saved plan ahead and decodes
// the identical image.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "backend/cuda/cuda_backend.h"
#include "common/npy.h"
#include "gpu/cuda_test_util.h"
#include "io/model/model_folder.h"
#include "io/weights/weights.h"
#include "model/vae/vae.h"

using namespace zimage;
using namespace zimage::test;

namespace {

namespace fs = std::filesystem;

// `warmed`: the backend's warm_up() runs on another thread while the VAE loads, as the engine
// runs it, and what it did is returned there.
// `scratch`: the warm-up's scratch grant (WarmUpHints::scratch_bytes), with the decode's
// convolution inputs as its first image's.
Tensor decode_once(const std::string& dir, cuda::CudaBackend::WarmUp* warmed = nullptr,
                   uint64_t scratch = 0) {
  auto be = make_cuda_backend(0, DType::kBF16);
  EXPECT_TRUE(be.ok()) << be.status().to_string();
  if (!be.ok()) return Tensor();
  auto folder = ModelFolder::open(dir + "/model");
  auto ws = WeightStore::open(dir + "/model/vae");
  EXPECT_TRUE(folder.ok() && ws.ok());
  if (!folder.ok() || !ws.ok()) return Tensor();
  std::thread warmer;
  Backend::WarmUpHints hints;  // a text encoder's and a DiT's products (ZIMAGE_WARM_UP=2)
  hints.linears = {{35, 6144, 2560}, {4160, 11520, 3840}, {1, 15360, 256}};
  auto lat = load_npy(dir + "/debug/latents_after_step2.npy");  // [1, c, h, w]
  EXPECT_TRUE(lat.ok());
  if (!lat.ok()) return Tensor();
  hints.scratch_bytes = scratch;
  for (int64_t s = 1; s <= 8; s *= 2)
    hints.conv_inputs.push_back({1, lat->dim(2) * s, lat->dim(3) * s});
  if (warmed) warmer = std::thread([&be, &hints] { (*be)->warm_up(hints); });
  auto vae = VaeDecoder::load(folder->configs().vae, *ws, **be);
  if (warmer.joinable()) warmer.join();
  if (warmed) *warmed = dynamic_cast<cuda::CudaBackend&>(**be).last_warm_up();
  EXPECT_TRUE(vae.ok()) << vae.status().to_string();
  if (!vae.ok()) return Tensor();
  auto dl = (*be)->upload(*lat, DType::kF32);
  EXPECT_TRUE(dl.ok());
  auto img = (*vae)->decode(*dl);
  EXPECT_TRUE(img.ok()) << img.status().to_string();
  return img.ok() ? *img : Tensor();
}

std::vector<fs::path> cache_files(const fs::path& root, const char* ext = ".json") {
  std::vector<fs::path> out;
  std::error_code ec;
  for (const auto& e : fs::recursive_directory_iterator(root, ec))
    if (e.path().extension() == ext) out.push_back(e.path());
  return out;
}

}  // namespace

TEST(PlanCacheGpu, CachedPlansDecodeTheSameImage) {
  ZI_REQUIRE_GPU();
  const fs::path cache =
      fs::temp_directory_path() / ("zimage_plan_gpu_" + std::to_string(getpid()));
  fs::remove_all(cache);
  const char* old = std::getenv("XDG_CACHE_HOME");
  const std::string saved = old ? old : "";
  setenv("XDG_CACHE_HOME", cache.c_str(), 1);
  const std::string dir = golden_dir("v_cfg");
  const Tensor searched = decode_once(dir);
  auto files = cache_files(cache);
  ASSERT_EQ(files.size(), 1u) << "the first decode records its plans";
  std::ifstream in(files[0]);
  const auto j = nlohmann::json::parse(in);
  const size_t n = j["entries"].size();
  size_t only_compiled = 0;  // graphs only runtime-compiled engines take (conv_graph.cpp: -2)
  for (const auto& [k, v] : j["entries"].items()) only_compiled += v.get<int64_t>() == -2;
  std::printf(
      "  plan cache %s: %zu convolution plans recorded, %zu of them graphs only "
      "runtime-compiled engines take (run unfused)\n",
      files[0].c_str(), n, only_compiled);
  EXPECT_GT(n, 0u);
  const auto blobs = cache_files(cache, ".plan");
  std::printf("  %zu built plans saved\n", blobs.size());
  EXPECT_GT(blobs.size(), 0u) << "the recorded winners are saved built (" << n << " recorded)";
  const Tensor cached = decode_once(dir);  // the saved plans, loaded
  ASSERT_TRUE(searched.defined() && cached.defined());
  EXPECT_EQ(max_abs_diff(searched, cached), 0.0);  // the recorded plans are the searched ones
  // Loaded ahead by the warm-up, beside the VAE's load (issue 24): every saved plan, the same
  // image.
  cuda::CudaBackend::WarmUp warmed;
  setenv("ZIMAGE_WARM_UP", "2", 1);  // the hinted linears too
  const Tensor preloaded = decode_once(dir, &warmed);
  unsetenv("ZIMAGE_WARM_UP");
  ASSERT_TRUE(preloaded.defined());
  EXPECT_EQ(static_cast<size_t>(warmed.plans), blobs.size());
  EXPECT_TRUE(warmed.attention);
  EXPECT_EQ(warmed.linears, 3);
  EXPECT_EQ(max_abs_diff(searched, preloaded), 0.0);
  EXPECT_EQ(warmed.plans_executed, 0) << "no scratch granted";
  // With scratch granted, the decode's plans also run once on scratch operands: the same image.
  cuda::CudaBackend::WarmUp exercised;
  const Tensor after_exercise = decode_once(dir, &exercised, uint64_t{1} << 30);
  ASSERT_TRUE(after_exercise.defined());
  EXPECT_EQ(static_cast<size_t>(exercised.plans), blobs.size());
  EXPECT_GT(exercised.plans_executed, 0);
  std::printf("  warm-up with scratch: %d of %d plans executed\n", exercised.plans_executed,
              exercised.plans);
  EXPECT_EQ(max_abs_diff(searched, after_exercise), 0.0);
  // Damaged saved plans: dropped, the recorded winners built again, then saved again.
  for (const auto& b : blobs) std::ofstream(b, std::ios::trunc) << "zimage-plan 1 3 3\nxyz";
  const Tensor rebuilt = decode_once(dir);
  ASSERT_TRUE(rebuilt.defined());
  EXPECT_EQ(max_abs_diff(searched, rebuilt), 0.0);
  for (const auto& b : blobs) EXPECT_GT(fs::file_size(b), 64u) << b;
  // Bogus indices: ignored, searched again, the hints replaced.
  nlohmann::json bad = j;
  for (auto& [k, v] : bad["entries"].items()) v = 100000;
  std::ofstream(files[0]) << bad.dump();
  const Tensor after_bogus = decode_once(dir);
  ASSERT_TRUE(after_bogus.defined());
  EXPECT_LT(max_abs_diff(after_bogus, searched), 2e-2);  // another timing may pick another plan
  std::ifstream in2(files[0]);
  for (const auto& [k, v] : nlohmann::json::parse(in2)["entries"].items()) {
    EXPECT_LT(v.get<int64_t>(), 100000) << k;
    EXPECT_GE(v.get<int64_t>(), -2) << k;
  }
  // A corrupt file: ignored and rewritten (without saved plans, which would spare the search and
  // so the rewrite).
  for (const auto& b : cache_files(cache, ".plan")) fs::remove(b);
  std::ofstream(files[0]) << "{ not json";
  const Tensor after_corrupt = decode_once(dir);
  ASSERT_TRUE(after_corrupt.defined());
  EXPECT_LT(max_abs_diff(after_corrupt, searched), 2e-2);
  std::ifstream in3(files[0]);
  EXPECT_FALSE(nlohmann::json::parse(in3, nullptr, false).is_discarded());
  if (saved.empty())
    unsetenv("XDG_CACHE_HOME");
  else
    setenv("XDG_CACHE_HOME", saved.c_str(), 1);
  fs::remove_all(cache);
}
