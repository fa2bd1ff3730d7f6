// The CUDA backend's environment settings, read and checked in one place (cuda_settings.h).
#include "backend/cuda/cuda_settings.h"

#include <cstdlib>
#include <string>

#include "core/text.h"

namespace zimage::cuda {
namespace {

// The variable's value, or nullptr where it is unset. An empty value is a value (and an error
// where the variable takes none such), as env_switch has it; only ZIMAGE_ATTENTION, as before
// this reader, takes empty for unset.
const char* env(const char* name) {
  return std::getenv(name);
}

// One of `choices` (comma-separated in the message), else InvalidArgument naming the variable.
Status not_one_of(const char* name, const std::string& value, const char* choices) {
  return InvalidArgument(std::string(name) + ": '" + value + "' is not one of " + choices);
}

// An on/off switch (env_switch's "1" / "0") into an optional: unset leaves it empty.
Status read_switch(const char* name, std::optional<bool>& out) {
  if (env(name) == nullptr) return Status::Ok();
  bool on = false;
  ZI_TRY(env_switch(name, on));
  out = on;
  return Status::Ok();
}

Status needs_fused_gemms(const std::string& what) {
  if (fused_gemms_available()) return Status::Ok();
  return InvalidArgument(what +
                         ": this build has no fused GEMMs (configure with "
                         "-DZIMAGE_FUSED_GEMMS=ON, which needs CUTLASS and sm_90a)");
}

}  // namespace

Result<CudaSettings> read_cuda_settings() {
  CudaSettings s;
  if (const char* v = env("ZIMAGE_ATTENTION"); v != nullptr && *v != '\0') {
    const std::string a(v);
    if (a == "flashinfer")
      s.attention = AttentionPath::kFlashInferFirst;
    else if (a == "cudnn")
      s.attention = AttentionPath::kCudnnFirst;
    else if (a == "own")
      s.attention = AttentionPath::kOwn;
    else if (a == "general")
      s.attention = AttentionPath::kGeneral;
    else if (a != "auto")
      return not_one_of("ZIMAGE_ATTENTION", a, "auto, flashinfer, cudnn, own, general");
  }
  if (env("ZIMAGE_CUBLAS_THREAD")) ZI_TRY(env_switch("ZIMAGE_CUBLAS_THREAD", s.blas_on_thread));
  if (const char* v = env("ZIMAGE_ALLOC_REPEAT")) {
    const std::string r(v);
    if (r != "0" && r != "1") return not_one_of("ZIMAGE_ALLOC_REPEAT", r, "0, 1");
    s.alloc_repeat = r == "1";
  }
  if (const char* v = env("ZIMAGE_PLAN_CACHE")) {
    const std::string p(v);
    if (p != "on" && p != "off" && p != "1" && p != "0")
      return not_one_of("ZIMAGE_PLAN_CACHE", p, "on, off, 1, 0");
    s.plan_cache = p == "on" || p == "1";
  }
  if (const char* v = env("ZIMAGE_FP8_ACCUM")) {
    const std::string a(v);
    if (a != "fast" && a != "fp32") return not_one_of("ZIMAGE_FP8_ACCUM", a, "fast, fp32");
    s.fp8_fast_accum = a == "fast";
  }
  if (const char* v = env("ZIMAGE_UPLOAD")) {
    const std::string u(v);
    if (u != "staged" && u != "locked") return not_one_of("ZIMAGE_UPLOAD", u, "staged, locked");
    s.upload_locked = u == "locked";
  }
  if (const char* v = env("ZIMAGE_ROW_KERNELS")) {
    auto t = parse_row_kernel_tuning(v);
    if (!t.ok()) return t.status().with_context("ZIMAGE_ROW_KERNELS");
    s.row_kernels = *t;
  }
  if (const char* v = env("ZIMAGE_FP8_GEMM")) {
    auto t = parse_fp8_tile(v);
    if (!t.ok()) return t.status().with_context("ZIMAGE_FP8_GEMM");
    s.fp8_tile = *t;
  }
  if (const char* v = env("ZIMAGE_GEMM_ORDER")) {
    auto o = parse_gemm_order(v);
    if (!o.ok()) return o.status().with_context("ZIMAGE_GEMM_ORDER");
    s.gemm_order = *o;
  }
  if (const char* v = env("ZIMAGE_BF16_GEMM")) {
    const std::string g(v);
    if (g != "cublaslt" && g != "cutlass-256x192")
      return not_one_of("ZIMAGE_BF16_GEMM", g, "cublaslt, cutlass-256x192");
    s.bf16_wide_tile = g == "cutlass-256x192";
    if (*s.bf16_wide_tile) {
      // Worded for this tile (the bf16 tiles are built with the fused GEMMs).
      if (!fused_gemms_available())
        return InvalidArgument(
            "ZIMAGE_BF16_GEMM=cutlass-256x192: this build has no CUTLASS bf16 tiles (configure "
            "with -DZIMAGE_FUSED_GEMMS=ON, which needs CUTLASS and sm_90a)");
    }
  }
  if (const char* v = env("ZIMAGE_SWIGLU_GEMM")) {
    auto t = parse_gemm_tuning(v);
    if (!t.ok()) return t.status().with_context("ZIMAGE_SWIGLU_GEMM");
    s.swiglu_tuning = *t;
  }
  if (const char* v = env("ZIMAGE_QKV_GEMM")) {
    auto t = parse_gemm_tuning(v);
    if (!t.ok()) return t.status().with_context("ZIMAGE_QKV_GEMM");
    if (t->schedule == GemmSchedule::kCooperative256x192)
      return InvalidArgument(
          "ZIMAGE_QKV_GEMM: coop-256x192 is a tile of the SwiGLU GEMM only (ZIMAGE_SWIGLU_GEMM); "
          "the q|k|v GEMM takes coop, coop-tall, pingpong or pingpong-narrow");
    s.qkv_tuning = *t;
  }
  ZI_TRY(read_switch("ZIMAGE_STAGED_ROWS", s.staged_rows));
  ZI_TRY(read_switch("ZIMAGE_PACKED_ROWS", s.packed_rows));
  ZI_TRY(read_switch("ZIMAGE_FUSED_NORM", s.fused_norm));
  ZI_TRY(read_switch("ZIMAGE_FUSED_CONV_ADD", s.fused_conv_add));
  ZI_TRY(read_switch("ZIMAGE_CONV_PAD_COUT", s.pad_narrow_conv));
  ZI_TRY(read_switch("ZIMAGE_WARM_EXECUTE", s.warm_execute));
  ZI_TRY(read_switch("ZIMAGE_CONV_RUNTIME_COMPILE", s.conv_runtime_compile));
  ZI_TRY(read_switch("ZIMAGE_PACKED_QKV", s.packed_qkv));
  ZI_TRY(read_switch("ZIMAGE_FP8_INPUTS", s.fp8_inputs));
  ZI_TRY(read_switch("ZIMAGE_FUSED_SWIGLU_FP8", s.fused_swiglu_fp8));
  ZI_TRY(read_switch("ZIMAGE_FUSED_ADALN", s.fused_adaln));
  ZI_TRY(read_switch("ZIMAGE_ADALN_LAYERS", s.adaln_layers));
  ZI_TRY(read_switch("ZIMAGE_FUSED_SWIGLU", s.fused_swiglu));
  ZI_TRY(read_switch("ZIMAGE_FUSED_QKV", s.fused_qkv));
  ZI_TRY(read_switch("ZIMAGE_FUSED_SWIGLU_GEMM_FP8", s.fused_swiglu_gemm_fp8));
  for (const auto& [name, on] :
       {std::pair{"ZIMAGE_FUSED_SWIGLU", s.fused_swiglu},
        std::pair{"ZIMAGE_FUSED_QKV", s.fused_qkv},
        std::pair{"ZIMAGE_FUSED_SWIGLU_GEMM_FP8", s.fused_swiglu_gemm_fp8}})
    if (on.value_or(false)) ZI_TRY(needs_fused_gemms(std::string(name) + "=1"));
  if (const char* v = env("ZIMAGE_WARM_UP")) {
    const std::string w(v);
    if (w != "0" && w != "1" && w != "2") return not_one_of("ZIMAGE_WARM_UP", w, "0, 1, 2");
    s.warm_up = w[0] - '0';
  }
  if (const char* v = env("ZIMAGE_GEMM_CANDIDATE")) {
    const std::string c(v);
    char* end = nullptr;
    const long i = std::strtol(c.c_str(), &end, 10);
    if (c.empty() || *end != '\0' || i < 0 || i >= kGemmCandidates)
      return InvalidArgument("ZIMAGE_GEMM_CANDIDATE: '" + c + "' is not a number from 0 to " +
                             std::to_string(kGemmCandidates - 1));
    s.gemm_candidate = static_cast<int>(i);
  }
  if (const char* v = env("ZIMAGE_GEMM_CONFIG")) {
    auto c = parse_gemm_algo_config(v);
    if (!c.ok()) return c.status().with_context("ZIMAGE_GEMM_CONFIG");
    s.gemm_config = *c;
  }
  if (const char* v = env("ZIMAGE_FLASH3_CLUSTER")) {
    const std::string c(v);
    if (c != "1" && c != "2") return not_one_of("ZIMAGE_FLASH3_CLUSTER", c, "1, 2");
    s.flash3_cluster = c[0] - '0';
  }
  if (env("ZIMAGE_GEMM_AUTOTUNE")) ZI_TRY(env_switch("ZIMAGE_GEMM_AUTOTUNE", s.gemm_autotune));
  if (const char* v = env("ZIMAGE_HOST_PIN")) {
    const std::string how(v);
    if (how != "huge" && how != "register" && how != "alloc")
      return not_one_of("ZIMAGE_HOST_PIN", how, "huge, register, alloc");
    s.pin_by_register = how == "register";
  }
  return s;
}

}  // namespace zimage::cuda
