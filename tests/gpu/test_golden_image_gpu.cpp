// The image-to-image and inpainting golden cases (tests/data/golden/image) on the GPU: the whole
// pipeline on the CUDA backend in fp32 and in bf16, against diffusers' fp32 CPU reference. What
// is compared: the image latents (the VAE encoder's posterior sample, draw 1), the start latents,
// the DiT output of every step and the image. The noise is drawn on the host and must match as on
// the CPU. Measured on an H200 (7 cases): fp32 image latents <= 2.2e-6, start latents <= 7.5e-7,
// DiT <= 1.1e-5, image <= 4.6e-6; bf16 (the encoder, DiT and decoder in bf16, as diffusers' bf16
// pipeline) image latents <= 1.7e-2, start latents <= 5.1e-3, DiT <= 1.3e-2 relative, image
// <= 3.6e-2. The bounds sit 2-5x above: fp32 as the CPU suite (test_golden_image.cpp), bf16
// latents 5e-2 / 2e-2, DiT 4e-2 relative, image 8e-2.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "common/npy.h"
#include "model/common/debug.h"
#include "pipeline/text_to_image.h"

namespace zimage {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> image_cases() {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(std::string(ZIMAGE_GOLDEN_DIR) + "/image", ec))
    if (e.is_directory() && fs::exists(e.path() / "case.json"))
      names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

class CaptureSink : public DebugSink {
 public:
  bool wants(const std::string& n) const override {
    return n == "image_latents" || n == "init_noise" || n == "init_latents" ||
           n.rfind("dit_out.step", 0) == 0;
  }
  void tensor(const std::string& name, Backend& be, const Tensor& t) override {
    Tensor h = Tensor::host(DType::kF32, t.shape());
    if (t.device() == Device::kCPU && t.dtype() == DType::kF32) {
      std::memcpy(h.data(), t.data(), t.nbytes());
    } else if (!be.download(t, h).ok()) {
      return;
    }
    got[name] = h;
  }
  std::map<std::string, Tensor> got;
};

struct Errors {
  double image_latents = 0, init_latents = 0, noise = 0, dit = 0, dit_rel = 0, image = 0;
};

Errors run_case(const std::string& name, DType act) {
  const std::string dir = std::string(ZIMAGE_GOLDEN_DIR) + "/image/" + name;
  std::ifstream f(dir + "/case.json");
  const auto s = nlohmann::json::parse(f);
  GenerateRequest r;
  r.prompts = s["prompts"].get<std::vector<std::string>>();
  if (!s["neg"].is_null()) r.negative_prompt = s["neg"].get<std::string>();
  r.width = s["width"];
  r.height = s["height"];
  r.steps = s["steps"];
  r.guidance = s["guidance"];
  r.seed = s["seed"];
  r.images_per_prompt = s["images_per_prompt"];
  if (!s["strength"].is_null()) r.strength = s["strength"].get<double>();
  auto init = image_load(dir + "/inputs/" + s["init"].get<std::string>());
  EXPECT_TRUE(init.ok()) << init.status().to_string();
  if (!init.ok()) return {};
  r.init_image = *init;
  if (!s["mask"].is_null()) {
    auto mask = mask_load(dir + "/inputs/" + s["mask"].get<std::string>());
    EXPECT_TRUE(mask.ok()) << mask.status().to_string();
    if (!mask.ok()) return {};
    r.mask = *mask;
  }
  auto be = make_cuda_backend(0, act);
  EXPECT_TRUE(be.ok()) << be.status().to_string();
  if (!be.ok()) return {};
  const std::string model =
      std::string(ZIMAGE_GOLDEN_DIR) + "/" + s["model"].get<std::string>() + "/model";
  auto pipe = TextToImage::load(model, **be);
  EXPECT_TRUE(pipe.ok()) << pipe.status().to_string();
  if (!pipe.ok()) return {};
  CaptureSink sink;
  TextToImageHooks hooks;
  hooks.debug = &sink;
  auto out = (*pipe)->run(r, hooks);
  EXPECT_TRUE(out.ok()) << out.status().to_string();
  if (!out.ok()) return {};
  Errors e;
  const auto cmp = [&](const std::string& ours, const std::string& file) {
    auto ref = test::load_npy(dir + "/" + file);
    auto it = sink.got.find(ours);
    if (!ref.ok() || it == sink.got.end()) {
      ADD_FAILURE() << name << ": no " << ours;
      return 1e9;
    }
    return test::max_abs_diff(it->second, *ref);
  };
  e.image_latents = cmp("image_latents", "image_latents.npy");
  e.init_latents = cmp("init_latents", "init_latents.npy");
  e.noise = cmp("init_noise", "init_noise.npy");
  for (size_t k = 0; k < s["timesteps"].size(); ++k) {
    auto ref = test::load_npy(dir + "/debug/dit_out_step" + std::to_string(k) + ".npy");
    auto it = sink.got.find("dit_out.step" + std::to_string(k));
    if (!ref.ok() || it == sink.got.end()) {
      ADD_FAILURE() << name << ": no DiT output for step " << k;
      continue;
    }
    const double d = test::max_abs_diff(it->second, *ref);
    double mx = 0;
    for (int64_t i = 0; i < ref->numel(); ++i)
      mx = std::max(mx, double(std::fabs(ref->data_as<float>()[i])));
    e.dit = std::max(e.dit, d);
    e.dit_rel = std::max(e.dit_rel, d / std::max(mx, 1e-12));
  }
  auto img = test::load_npy(dir + "/image.npy");
  EXPECT_TRUE(img.ok());
  if (img.ok()) e.image = test::max_abs_diff(out->image, *img);
  return e;
}

bool have_gpu() {
  auto be = make_cuda_backend(0, DType::kF32);
  if (!be.ok() && be.status().code() != ErrorCode::kUnsupported)
    ADD_FAILURE() << "a CUDA device is present but the backend failed: " << be.status().to_string();
  return be.ok();
}

void print(const std::string& c, const char* dt, const Errors& e) {
  std::printf(
      "  %-20s %s: image latents %.2e, start latents %.2e, noise %.2e, DiT %.2e (rel %.2e), "
      "image %.2e\n",
      c.c_str(), dt, e.image_latents, e.init_latents, e.noise, e.dit, e.dit_rel, e.image);
}

TEST(GoldenImageGpu, Fp32MatchesDiffusers) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const auto cases = image_cases();
  ASSERT_GE(cases.size(), 7u);
  for (const auto& c : cases) {
    const Errors e = run_case(c, DType::kF32);
    print(c, "fp32", e);
    EXPECT_LT(e.noise, 2e-6) << c;
    EXPECT_LT(e.image_latents, 1e-4) << c;
    EXPECT_LT(e.init_latents, 1e-4) << c;
    EXPECT_LT(e.dit, 5e-5) << c;
    EXPECT_LT(e.image, 3e-5) << c;
  }
}

TEST(GoldenImageGpu, Bf16WithinStatedTolerance) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (const auto& c : image_cases()) {
    const Errors e = run_case(c, DType::kBF16);
    print(c, "bf16", e);
    EXPECT_LT(e.noise, 2e-6) << c;  // drawn on the host: the same as on the CPU
    EXPECT_LT(e.image_latents, 5e-2) << c;
    EXPECT_LT(e.init_latents, 2e-2) << c;
    EXPECT_LT(e.dit_rel, 4e-2) << c;
    EXPECT_LT(e.image, 8e-2) << c;
  }
}

}  // namespace
}  // namespace zimage
