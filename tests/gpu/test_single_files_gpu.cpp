// Single files and FP8 checkpoints on the GPU (tests/parity/test_single_files.cpp runs them on
// the CPU): each variant written from the tiny golden model, loaded on the CUDA backend in fp32
// and in bf16 and run through the whole pipeline, against the same upstream references
// (tests/data/single_file, tools/make_single_file_cases.py). Bounds as GoldenGpu's: fp32 image
// 3e-5; bf16 image 6e-2. Also `--precision fp8`'s FP8 feed-forward GEMMs on a scaled-FP8
// transformer, against the fp32 reference with a looser bound.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "common/npy.h"
#include "common/single_files.h"
#include "pipeline/text_to_image.h"

namespace zimage {
namespace {

namespace fs = std::filesystem;

struct Variant {
  const char* dit;
  const char* te;
  const char* vae;
  const char* reference;
};

const Variant kVariants[] = {
    {"dit_bf16", "te_bf16", "vae_ldm", "bf16"}, {"all_in_one", "all_in_one", "all_in_one", "bf16"},
    {"dit_fp8_e4m3", "", "", "fp8_e4m3"},       {"dit_scaled_legacy", "", "", "scaled_tensor"},
    {"dit_scaled", "", "", "scaled_tensor"},    {"dit_scaled_rows", "", "", "scaled_rows"},
    {"", "te_fp8_mixed", "", "te_fp8_mixed"},
};

GenerateRequest case_request() {
  std::ifstream f(test::golden_dir("v_turbo") + "/case.json");
  const nlohmann::json s = nlohmann::json::parse(f);
  GenerateRequest r;
  r.prompts = s["prompts"].get<std::vector<std::string>>();
  r.width = s["W"];
  r.height = s["H"];
  r.steps = s["steps"];
  r.guidance = s["guidance"];
  r.seed = s["seed"];
  return r;
}

bool have_gpu() {
  auto be = make_cuda_backend(0, DType::kF32);
  if (!be.ok() && be.status().code() != ErrorCode::kUnsupported)
    ADD_FAILURE() << "a CUDA device is present but the backend failed: " << be.status().to_string();
  return be.ok();
}

TEST(SingleFilesGpu, EveryFormatMatchesItsReference) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const std::string model = test::golden_dir("v_turbo") + "/model";
  const std::string dir =
      (fs::temp_directory_path() / ("zimage_single_gpu_" + std::to_string(getpid()))).string();
  auto files = test::write_single_file_cases(model, dir);
  ASSERT_TRUE(files.ok()) << files.status().to_string();
  for (DType act : {DType::kF32, DType::kBF16}) {
    for (const Variant& v : kVariants) {
      ModelPaths p;
      p.model_dir = model;
      auto pick = [&](const char* n) { return *n ? files->at(n) : std::string(); };
      p.transformer_file = pick(v.dit);
      p.text_encoder_file = pick(v.te);
      p.vae_file = pick(v.vae);
      auto be = make_cuda_backend(0, act);
      ASSERT_TRUE(be.ok()) << be.status().to_string();
      auto pipe = TextToImage::load(p, **be);
      ASSERT_TRUE(pipe.ok()) << pipe.status().to_string();
      auto out = (*pipe)->run(case_request(), {});
      ASSERT_TRUE(out.ok()) << out.status().to_string();
      auto ref = test::load_npy(test::single_file_data_dir() + "/" + v.reference + "/image.npy");
      ASSERT_TRUE(ref.ok());
      const double d = test::max_abs_diff(out->image, *ref);
      std::printf("  %-18s %-14s %s image max|diff| %.2e\n", *v.dit ? v.dit : v.te, v.reference,
                  dtype_name(act), d);
      EXPECT_LT(d, act == DType::kF32 ? 3e-5 : 6e-2) << v.reference << " " << dtype_name(act);
      if (act == DType::kBF16 && std::string(v.dit) == "dit_scaled") {
        PipelineLoadOptions o;  // --precision fp8: W8A8 on every DiT linear
        o.dit_fp8_compute = kFp8Default;
        auto pipe8 = TextToImage::load(p, **be, o);
        ASSERT_TRUE(pipe8.ok()) << pipe8.status().to_string();
        auto fp8 = (*pipe8)->run(case_request(), {});
        ASSERT_TRUE(fp8.ok()) << fp8.status().to_string();
        const double e = test::max_abs_diff(fp8->image, *ref);
        std::printf("  %-18s %-14s W8A8 FP8 image max|diff| %.2e\n", v.dit, v.reference, e);
        EXPECT_LT(e, 1e-1);
        EXPECT_GT(e, 0.0);  // the FP8 path ran
      }
    }
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace zimage
