// LoRAs on the GPU: the LoRA parity cases (tools/make_lora_cases.py, tests/data/lora) through the
// pipeline on the CUDA backend in fp32 and bf16 against diffusers' fp32 images. The merge itself
// runs on the host at load (model/adapters/lora_merge.h) and is tested on the CPU (LoraParity.*); this
// checks that the merged weights reach the device as they should. Bounds: fp32 1/255 (the CPU
// measures <= 3.4e-4, the bf16-folded cases); bf16 as GoldenGpu.Bf16WithinStatedTolerance (6e-2).
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "common/lora_case.h"
#include "common/npy.h"
#include "common/tiny_engine.h"
#include "pipeline/text_to_image.h"

namespace zimage {
namespace {

std::string lora_file(const std::string& name) {
  return std::string(ZIMAGE_LORA_DIR) + "/" + name;
}

using test::turbo_request;  // common/lora_case.h

TEST(LoraGpu, CasesMatchDiffusersInFp32AndBf16) {
  {
    auto probe = make_cuda_backend(0, DType::kF32);
    if (!probe.ok() && probe.status().code() == ErrorCode::kUnsupported)
      GTEST_SKIP() << "no CUDA device";
    ASSERT_TRUE(probe.ok()) << probe.status().to_string();
  }
  std::ifstream f(lora_file("cases.json"));
  ASSERT_TRUE(f.good()) << lora_file("cases.json");
  const nlohmann::json cases = nlohmann::json::parse(f).at("cases");
  ASSERT_FALSE(cases.empty());
  for (DType act : {DType::kF32, DType::kBF16}) {
    for (const auto& c : cases) {
      const std::string name = c.at("name").get<std::string>();
      PipelineLoadOptions opts;
      for (const auto& l : c.at("loras"))
        opts.loras.push_back(
            {lora_file(l.at("file").get<std::string>()), l.at("scale").get<float>()});
      auto be = make_cuda_backend(0, act);
      ASSERT_TRUE(be.ok()) << be.status().to_string();
      auto pipe = TextToImage::load(test::tiny_model_dir(), **be, opts);
      ASSERT_TRUE(pipe.ok()) << name << ": " << pipe.status().to_string();
      auto out = (*pipe)->run(turbo_request(), {});
      ASSERT_TRUE(out.ok()) << name << ": " << out.status().to_string();
      auto ref = test::load_npy(lora_file(name + ".image.npy"));
      ASSERT_TRUE(ref.ok()) << ref.status().to_string();
      const double d = test::max_abs_diff(out->image, *ref);
      std::printf("  %-13s %s: image max|diff| %.3g (%.2f/255)\n", name.c_str(), dtype_name(act), d,
                  d * 255);
      EXPECT_GE(d, 0.0) << name;
      EXPECT_LE(d, act == DType::kF32 ? 1.0 / 255.0 : 6e-2) << name << " " << dtype_name(act);
    }
  }
}

}  // namespace
}  // namespace zimage
