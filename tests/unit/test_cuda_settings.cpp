// The CUDA backend's environment settings (backend/cuda/cuda_settings.h): every variable read in
// one place before the GPU is looked for, each bad value an InvalidArgument naming the variable,
// each good value the setting it names, unset variables left to the backend's defaults. Reads
// only the environment, so it runs without a GPU, in builds with the CUDA backend; the last test
// loads an engine with device auto, which on a machine without a GPU would otherwise fall back to
// the CPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#if ZIMAGE_WITH_CUDA
#include "backend/cuda/cuda_settings.h"
#include "common/tiny_engine.h"
#include "zimage/zimage.h"

namespace zimage::cuda {
namespace {

// Every variable read_cuda_settings reads (docs/ENVIRONMENT.md; keep in step with
// read_cuda_settings).
const std::vector<std::string> kNames = {
    "ZIMAGE_ATTENTION",
    "ZIMAGE_CUBLAS_THREAD",
    "ZIMAGE_ALLOC_REPEAT",
    "ZIMAGE_PLAN_CACHE",
    "ZIMAGE_FP8_ACCUM",
    "ZIMAGE_UPLOAD",
    "ZIMAGE_ROW_KERNELS",
    "ZIMAGE_FP8_GEMM",
    "ZIMAGE_GEMM_ORDER",
    "ZIMAGE_BF16_GEMM",
    "ZIMAGE_SWIGLU_GEMM",
    "ZIMAGE_QKV_GEMM",
    "ZIMAGE_STAGED_ROWS",
    "ZIMAGE_PACKED_ROWS",
    "ZIMAGE_FUSED_NORM",
    "ZIMAGE_FUSED_CONV_ADD",
    "ZIMAGE_CONV_PAD_COUT",
    "ZIMAGE_WARM_EXECUTE",
    "ZIMAGE_CONV_RUNTIME_COMPILE",
    "ZIMAGE_PACKED_QKV",
    "ZIMAGE_FP8_INPUTS",
    "ZIMAGE_FUSED_SWIGLU_FP8",
    "ZIMAGE_FUSED_ADALN",
    "ZIMAGE_ADALN_LAYERS",
    "ZIMAGE_FUSED_SWIGLU",
    "ZIMAGE_FUSED_QKV",
    "ZIMAGE_FUSED_SWIGLU_GEMM_FP8",
    "ZIMAGE_WARM_UP",
    "ZIMAGE_GEMM_CANDIDATE",
    "ZIMAGE_GEMM_CONFIG",
    "ZIMAGE_FLASH3_CLUSTER",
    "ZIMAGE_GEMM_AUTOTUNE",
    "ZIMAGE_HOST_PIN",
};

// Clears every variable above for the test and puts back what the process had.
class CudaSettingsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const std::string& n : kNames) {
      const char* v = std::getenv(n.c_str());
      saved_.emplace_back(n, v ? std::optional<std::string>(v) : std::nullopt);
      ::unsetenv(n.c_str());
    }
  }
  void TearDown() override {
    for (const auto& [n, v] : saved_) {
      if (v)
        ::setenv(n.c_str(), v->c_str(), 1);
      else
        ::unsetenv(n.c_str());
    }
  }
  // read_cuda_settings with `name` set to `value` alone.
  static Result<CudaSettings> with(const std::string& name, const std::string& value) {
    ::setenv(name.c_str(), value.c_str(), 1);
    Result<CudaSettings> s = read_cuda_settings();
    ::unsetenv(name.c_str());
    return s;
  }

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

TEST_F(CudaSettingsTest, UnsetLeavesTheBackendsDefaults) {
  auto s = read_cuda_settings();
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_EQ(s->attention, AttentionPath::kAuto);
  EXPECT_TRUE(s->blas_on_thread);
  EXPECT_TRUE(s->alloc_repeat);
  EXPECT_TRUE(s->plan_cache);
  EXPECT_FALSE(s->gemm_autotune);
  for (const auto* o : {&s->fp8_fast_accum, &s->upload_locked, &s->bf16_wide_tile, &s->staged_rows,
                        &s->packed_rows, &s->fused_norm, &s->fused_conv_add, &s->pad_narrow_conv,
                        &s->warm_execute, &s->conv_runtime_compile, &s->packed_qkv, &s->fp8_inputs,
                        &s->fused_swiglu_fp8, &s->fused_adaln, &s->adaln_layers, &s->fused_swiglu,
                        &s->fused_qkv, &s->fused_swiglu_gemm_fp8, &s->pin_by_register})
    EXPECT_FALSE(o->has_value());
  EXPECT_FALSE(s->row_kernels || s->fp8_tile || s->gemm_order || s->swiglu_tuning ||
               s->qkv_tuning || s->warm_up || s->gemm_candidate || s->gemm_config ||
               s->flash3_cluster);
}

// One value each variable does not take: the error is InvalidArgument and names the variable
// (and, where the reader lists them, the values it takes). Every variable is in the table.
TEST_F(CudaSettingsTest, EveryBadValueIsAnErrorNamingTheVariable) {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"ZIMAGE_ATTENTION", "fastest"},
      {"ZIMAGE_CUBLAS_THREAD", "yes"},
      {"ZIMAGE_ALLOC_REPEAT", "2"},
      {"ZIMAGE_PLAN_CACHE", "disabled"},
      {"ZIMAGE_FP8_ACCUM", "fp16"},
      {"ZIMAGE_UPLOAD", "pinned"},
      {"ZIMAGE_ROW_KERNELS", "x"},
      {"ZIMAGE_FP8_GEMM", "huge"},
      {"ZIMAGE_GEMM_ORDER", "diagonal"},
      {"ZIMAGE_BF16_GEMM", "cublas"},
      {"ZIMAGE_SWIGLU_GEMM", "wide"},
      {"ZIMAGE_QKV_GEMM", "coop-256x192"},
      {"ZIMAGE_STAGED_ROWS", "on"},
      {"ZIMAGE_PACKED_ROWS", "true"},
      {"ZIMAGE_FUSED_NORM", ""},
      {"ZIMAGE_FUSED_CONV_ADD", "2"},
      {"ZIMAGE_CONV_PAD_COUT", "y"},
      {"ZIMAGE_WARM_EXECUTE", "off"},
      {"ZIMAGE_CONV_RUNTIME_COMPILE", "1 "},
      {"ZIMAGE_PACKED_QKV", "no"},
      {"ZIMAGE_FP8_INPUTS", "-1"},
      {"ZIMAGE_FUSED_SWIGLU_FP8", "01"},
      {"ZIMAGE_FUSED_ADALN", "True"},
      {"ZIMAGE_ADALN_LAYERS", "all"},
      {"ZIMAGE_FUSED_SWIGLU", "maybe"},
      {"ZIMAGE_FUSED_QKV", "10"},
      {"ZIMAGE_FUSED_SWIGLU_GEMM_FP8", "o"},
      {"ZIMAGE_WARM_UP", "3"},
      {"ZIMAGE_GEMM_CANDIDATE", "16"},
      {"ZIMAGE_GEMM_CONFIG", "tile"},
      {"ZIMAGE_FLASH3_CLUSTER", "4"},
      {"ZIMAGE_GEMM_AUTOTUNE", "fast"},
      {"ZIMAGE_HOST_PIN", "mlock"},
  };
  std::vector<std::string> covered;
  for (const auto& [name, value] : bad) {
    auto s = with(name, value);
    covered.push_back(name);
    ASSERT_FALSE(s.ok()) << name << "='" << value << "' was taken";
    EXPECT_EQ(s.status().code(), ErrorCode::kInvalidArgument) << s.status().to_string();
    EXPECT_NE(s.status().to_string().find(name), std::string::npos)
        << name << ": " << s.status().to_string();
  }
  std::sort(covered.begin(), covered.end());
  std::vector<std::string> all = kNames;
  std::sort(all.begin(), all.end());
  EXPECT_EQ(covered, all);
  // The lists of values, where the reader gives them.
  EXPECT_EQ(with("ZIMAGE_FP8_ACCUM", "fp16").status().message(),
            "ZIMAGE_FP8_ACCUM: 'fp16' is not one of fast, fp32");
  EXPECT_EQ(with("ZIMAGE_UPLOAD", "pinned").status().message(),
            "ZIMAGE_UPLOAD: 'pinned' is not one of staged, locked");
  EXPECT_EQ(with("ZIMAGE_PLAN_CACHE", "disabled").status().message(),
            "ZIMAGE_PLAN_CACHE: 'disabled' is not one of on, off, 1, 0");
  EXPECT_EQ(with("ZIMAGE_GEMM_CANDIDATE", "").status().message(),
            "ZIMAGE_GEMM_CANDIDATE: '' is not a number from 0 to 15");
}

TEST_F(CudaSettingsTest, GoodValuesSetWhatTheyName) {
  auto get = [&](const std::string& name, const std::string& value) {
    auto s = with(name, value);
    EXPECT_TRUE(s.ok()) << name << "=" << value << ": " << s.status().to_string();
    return s.ok() ? *s : CudaSettings{};
  };
  EXPECT_EQ(get("ZIMAGE_ATTENTION", "cudnn").attention, AttentionPath::kCudnnFirst);
  EXPECT_EQ(get("ZIMAGE_ATTENTION", "").attention, AttentionPath::kAuto);  // empty: unset
  EXPECT_EQ(get("ZIMAGE_ATTENTION", "flashinfer").attention, AttentionPath::kFlashInferFirst);
  EXPECT_EQ(get("ZIMAGE_ATTENTION", "own").attention, AttentionPath::kOwn);
  EXPECT_EQ(get("ZIMAGE_ATTENTION", "general").attention, AttentionPath::kGeneral);
  EXPECT_FALSE(with("ZIMAGE_GEMM_CANDIDATE", "-1").ok());
  EXPECT_FALSE(get("ZIMAGE_CUBLAS_THREAD", "0").blas_on_thread);
  EXPECT_FALSE(get("ZIMAGE_ALLOC_REPEAT", "0").alloc_repeat);
  EXPECT_FALSE(get("ZIMAGE_PLAN_CACHE", "off").plan_cache);
  EXPECT_FALSE(get("ZIMAGE_PLAN_CACHE", "0").plan_cache);
  EXPECT_TRUE(get("ZIMAGE_PLAN_CACHE", "on").plan_cache);
  EXPECT_EQ(get("ZIMAGE_FP8_ACCUM", "fp32").fp8_fast_accum, std::optional<bool>(false));
  EXPECT_EQ(get("ZIMAGE_FP8_ACCUM", "fast").fp8_fast_accum, std::optional<bool>(true));
  EXPECT_EQ(get("ZIMAGE_UPLOAD", "locked").upload_locked, std::optional<bool>(true));
  EXPECT_EQ(get("ZIMAGE_UPLOAD", "staged").upload_locked, std::optional<bool>(false));
  EXPECT_EQ(get("ZIMAGE_BF16_GEMM", "cublaslt").bf16_wide_tile, std::optional<bool>(false));
  EXPECT_EQ(get("ZIMAGE_FUSED_NORM", "0").fused_norm, std::optional<bool>(false));
  EXPECT_EQ(get("ZIMAGE_ADALN_LAYERS", "1").adaln_layers, std::optional<bool>(true));
  EXPECT_EQ(get("ZIMAGE_CONV_RUNTIME_COMPILE", "1").conv_runtime_compile,
            std::optional<bool>(true));
  EXPECT_EQ(get("ZIMAGE_WARM_UP", "2").warm_up, std::optional<int>(2));
  EXPECT_EQ(get("ZIMAGE_GEMM_CANDIDATE", "15").gemm_candidate, std::optional<int>(15));
  EXPECT_EQ(get("ZIMAGE_FLASH3_CLUSTER", "2").flash3_cluster, std::optional<int>(2));
  EXPECT_TRUE(get("ZIMAGE_GEMM_AUTOTUNE", "1").gemm_autotune);
  EXPECT_EQ(get("ZIMAGE_HOST_PIN", "register").pin_by_register, std::optional<bool>(true));
  EXPECT_EQ(get("ZIMAGE_HOST_PIN", "huge").pin_by_register, std::optional<bool>(false));
  EXPECT_TRUE(get("ZIMAGE_ROW_KERNELS", "2,4,2").row_kernels.has_value());
  EXPECT_TRUE(get("ZIMAGE_FP8_GEMM", "coop-wide").fp8_tile.has_value());
  EXPECT_TRUE(get("ZIMAGE_GEMM_ORDER", "m,2").gemm_order.has_value());
  EXPECT_TRUE(get("ZIMAGE_SWIGLU_GEMM", "coop,auto,1").swiglu_tuning.has_value());
  EXPECT_TRUE(get("ZIMAGE_QKV_GEMM", "pingpong,n,1").qkv_tuning.has_value());
}

// Through the API with device auto: a bad value is an error naming it, on a machine with a GPU
// and on one without (where a setting read after the device lookup used to be ignored and the
// CPU taken).
TEST_F(CudaSettingsTest, EngineWithDeviceAutoRefusesABadValue) {
  EngineOptions o;
  o.model_dir = test::tiny_model_dir();
  o.device = "auto";
  for (const auto& [name, value] : std::vector<std::pair<std::string, std::string>>{
           {"ZIMAGE_FP8_ACCUM", "fp16"}, {"ZIMAGE_FUSED_NORM", "yes"}, {"ZIMAGE_WARM_UP", "9"}}) {
    ::setenv(name.c_str(), value.c_str(), 1);
    auto e = Engine::load(o);
    ::unsetenv(name.c_str());
    ASSERT_FALSE(e.ok()) << name << "=" << value << " was taken";
    EXPECT_EQ(e.status().code(), ErrorCode::kInvalidArgument) << e.status().to_string();
    EXPECT_NE(e.status().to_string().find(name), std::string::npos) << e.status().to_string();
  }
}

}  // namespace
}  // namespace zimage::cuda
#endif
