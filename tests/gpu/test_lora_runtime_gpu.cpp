// Runtime LoRAs on the GPU (model/adapters/lora_runtime.h, ZImageDiT::set_loras): the side GEMM and the
// device merge against the load-time merge on the same device, in fp32 and bf16; CUDA-graph
// replays never use a stale set (the DiT records its forward once per shape: side GEMMs coming
// or going must re-record, merges change the weights in place under the recorded graph); FP8-row
// weights and the W8A8 FP8 GEMMs (--precision fp8) carry the LoRA through side GEMMs. The CPU suite
// (LoraRuntime.*) holds the float32 parity figures; these check the device paths.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "common/lora_case.h"
#include "common/npy.h"
#include "common/tiny_engine.h"
#include "io/lora/lora.h"
#include "model/adapters/lora_runtime.h"
#include "pipeline/text_to_image.h"

namespace zimage {
namespace {

std::string lora_file(const std::string& name) {
  return std::string(ZIMAGE_LORA_DIR) + "/" + name;
}

using test::turbo_request;  // common/lora_case.h

bool have_cuda() {
  auto probe = make_cuda_backend(0, DType::kF32);
  return probe.ok() || probe.status().code() != ErrorCode::kUnsupported;
}

std::vector<RuntimeLora> read_set(const std::vector<LoraSpec>& specs) {
  std::vector<RuntimeLora> out;
  for (const LoraSpec& s : specs) {
    auto f = read_lora(s.path, 1.0f);
    EXPECT_TRUE(f.ok()) << f.status().to_string();
    if (f.ok()) out.push_back({std::make_shared<const LoraFile>(std::move(*f)), s.scale});
  }
  return out;
}

Tensor run(TextToImage& pipe) {
  auto out = pipe.run(turbo_request(), {});
  EXPECT_TRUE(out.ok()) << out.status().to_string();
  return out.ok() ? out->image : Tensor();
}

const std::vector<std::pair<std::string, std::vector<LoraSpec>>>& sets() {
  static const std::vector<std::pair<std::string, std::vector<LoraSpec>>> s = {
      {"peft", {{lora_file("peft.safetensors"), 1.0f}}},
      {"kohya_qkv", {{lora_file("kohya_qkv.safetensors"), 1.0f}}},
      {"stack", {{lora_file("peft.safetensors"), 0.7f}, {lora_file("kohya.safetensors"), -0.5f}}},
      {"comfy_peft", {{lora_file("comfy_peft.safetensors"), 1.0f}}},
      {"lokr", {{lora_file("lokr.safetensors"), 1.0f}}},
  };
  return s;
}

// Side GEMM and device merge vs the load-time (host float32) merge on the same device. Bounds:
// fp32 2e-3 (the paths differ in summation order only), bf16 6e-2 as GoldenGpu's bf16 bound (the
// side path rounds x·downᵀ and its product to bf16; the merge rounds up·down to bf16 before the
// add). The LoRAs here move the image by 0.29..0.51 (pairwise, diffusers' images), so a missing
// or wrong one cannot pass.
TEST(LoraRuntimeGpu, SideAndMergeMatchLoadTimeMerge) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device";
  for (DType act : {DType::kF32, DType::kBF16}) {
    auto be = make_cuda_backend(0, act);
    ASSERT_TRUE(be.ok()) << be.status().to_string();
    auto pipe = TextToImage::load(test::tiny_model_dir(), **be);
    ASSERT_TRUE(pipe.ok()) << pipe.status().to_string();
    ZImageDiT& dit = (*pipe)->transformer();
    const double tol = act == DType::kF32 ? 2e-3 : 6e-2;
    for (const auto& [name, specs] : sets()) {
      PipelineLoadOptions opts;
      opts.loras = specs;
      auto be2 = make_cuda_backend(0, act);
      ASSERT_TRUE(be2.ok());
      auto merged = TextToImage::load(test::tiny_model_dir(), **be2, opts);
      ASSERT_TRUE(merged.ok()) << merged.status().to_string();
      const Tensor ref = run(**merged);
      const std::vector<RuntimeLora> set = read_set(specs);
      for (LoraMethod m : {LoraMethod::kMerge, LoraMethod::kSide}) {
        ASSERT_TRUE(dit.set_loras(set, m, false).ok()) << name;
        const Tensor img = run(**pipe);
        const double d = test::max_abs_diff(img, ref);
        std::printf("  %-4s %-6s %-11s vs load-time merge: image max|diff| %.3g\n", dtype_name(act),
                    lora_method_name(m), name.c_str(), d);
        EXPECT_LE(d, tol) << name << " " << lora_method_name(m) << " " << dtype_name(act);
      }
    }
    ASSERT_TRUE(dit.set_loras({}, LoraMethod::kAuto, false).ok());
  }
}

// Graphs on (the default): a sequence of sets, methods and the base model on one pipeline; each
// image must equal the same set's image from a pipeline that never records (eager), and differ
// from the previous set's (what a stale replay would give: diffusers' images of these sets differ
// pairwise by >= 0.29, the bound is 6e-2 against 0.2). Also times the first forward after
// a side set comes in (the re-recording) against the steady one.
TEST(LoraRuntimeGpu, RecordedForwardsNeverReplayAStaleSet) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device";
  auto be_e = make_cuda_backend(0, DType::kBF16);
  auto be_g = make_cuda_backend(0, DType::kBF16);
  ASSERT_TRUE(be_e.ok() && be_g.ok());
  auto eager = TextToImage::load(test::tiny_model_dir(), **be_e);
  auto graphed = TextToImage::load(test::tiny_model_dir(), **be_g);
  ASSERT_TRUE(eager.ok() && graphed.ok());
  (*eager)->transformer().set_use_graphs(false);
  struct Step {
    std::string set;  // "" = base
    LoraMethod method;
  };
  const std::vector<Step> steps = {
      {"", LoraMethod::kAuto},          {"peft", LoraMethod::kSide},
      {"", LoraMethod::kAuto},          {"peft", LoraMethod::kMerge},
      {"kohya_qkv", LoraMethod::kSide}, {"kohya_qkv", LoraMethod::kMerge},
      {"stack", LoraMethod::kSide},     {"", LoraMethod::kSide},
      {"peft", LoraMethod::kMerge},     {"stack", LoraMethod::kMerge},
      {"", LoraMethod::kMerge},
  };
  std::map<std::string, std::vector<LoraSpec>> specs;
  for (const auto& [n, s] : sets()) specs[n] = s;
  auto set_of = [&](const std::string& n) {
    return n.empty() ? std::vector<RuntimeLora>{} : read_set(specs.at(n));
  };
  std::map<std::string, Tensor> ref;  // eager image per set (method-independent within tol)
  for (const Step& s : steps) {
    if (ref.count(s.set)) continue;
    ASSERT_TRUE((*eager)->transformer().set_loras(set_of(s.set), LoraMethod::kMerge, false).ok());
    ref[s.set] = run(**eager);
  }
  ZImageDiT& dit = (*graphed)->transformer();
  std::string prev = "<none>";
  for (const Step& s : steps) {
    ASSERT_TRUE(dit.set_loras(set_of(s.set), s.method, false).ok());
    const auto t0 = std::chrono::steady_clock::now();
    const Tensor img = run(**graphed);
    const double first_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    const double d = test::max_abs_diff(img, ref[s.set]);
    std::printf("  graphed %-9s %-6s: vs eager %.3g; first image %.1f ms\n",
                s.set.empty() ? "base" : s.set.c_str(), lora_method_name(s.method), d, first_ms);
    EXPECT_LE(d, 6e-2) << s.set << " " << lora_method_name(s.method);
    if (prev != "<none>" && prev != s.set) {
      const double stale = test::max_abs_diff(img, ref[prev]);
      EXPECT_GT(stale, 0.2) << "the image of " << s.set << " looks like " << prev << "'s";
    }
    prev = s.set;
  }
}

// FP8 rows (--weights fp8) cannot be merged: side GEMMs carry the LoRA; with precision fp8 the
// W8A8 GEMMs of every block linear get theirs after them. The image lands near diffusers' LoRA
// image.
TEST(LoraRuntimeGpu, Fp8WeightsAndFp8FeedForwardUseSideGemms) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device";
  const Tensor lora_img = *test::load_npy(lora_file("peft.image.npy"));
  const Tensor base_img = *test::load_npy(lora_file("base.image.npy"));
  const std::vector<RuntimeLora> set = read_set({{lora_file("peft.safetensors"), 1.0f}});
  for (int mode = 0; mode < 2; ++mode) {
    auto be = make_cuda_backend(0, DType::kBF16);
    ASSERT_TRUE(be.ok());
    PipelineLoadOptions opts;
    opts.fp8_weights = mode == 0;
    if (mode == 1) opts.dit_fp8_compute = kFp8Default;  // --precision fp8 (W8A8)
    auto pipe = TextToImage::load(test::tiny_model_dir(), **be, opts);
    if (mode == 1 && !pipe.ok() && pipe.status().code() == ErrorCode::kUnsupported) {
      std::printf("  precision fp8 not available here: %s\n", pipe.status().message().c_str());
      continue;
    }
    ASSERT_TRUE(pipe.ok()) << pipe.status().to_string();
    ZImageDiT& dit = (*pipe)->transformer();
    ASSERT_TRUE(dit.set_loras(set, LoraMethod::kAuto, false).ok());
    EXPECT_GT(dit.applied_loras().side_weights, 0);
    auto out = (*pipe)->run(turbo_request(), {});
    if (!out.ok() && out.status().code() == ErrorCode::kUnsupported) {
      // cuBLASLt may have no FP8 algorithm for the tiny shapes (see SingleFilesGpu).
      std::printf("  %s: %s\n", mode == 0 ? "fp8 weights" : "fp8 W8A8",
                  out.status().message().c_str());
      continue;
    }
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    const double to_lora = test::max_abs_diff(out->image, lora_img);
    const double to_base = test::max_abs_diff(out->image, base_img);
    std::printf("  %s + runtime peft: to diffusers' LoRA image %.3g, to the base %.3g\n",
                mode == 0 ? "fp8 weights" : "fp8 W8A8", to_lora, to_base);
    EXPECT_LT(to_lora, 0.25 * to_base);
  }
}

}  // namespace
}  // namespace zimage
