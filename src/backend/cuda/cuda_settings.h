// The CUDA backend's settings from the environment (every ZIMAGE_* variable it reads; the list
// with values, defaults and measurements is docs/ENVIRONMENT.md).
//
// Why one reader, called before the GPU is looked for: a bad value is then an error naming the
// variable on any machine, with or without a GPU, never a value silently ignored and never a
// silent fall back to the CPU under --device auto (api/backend_choice.cpp turns InvalidArgument
// into an error, not a fall back). An unset variable leaves the backend's own default: the
// optional fields stay empty and CudaBackend::create applies only what is set.
#pragma once

#include <optional>

#include "backend/cuda/kernels/row_tuning.h"
#include "backend/cuda/libs/gemm_algo_config.h"
#include "backend/cuda/libs/gemm_cutlass.h"
#include "core/status.h"

namespace zimage::cuda {

// kAuto: on sm_90, FlashAttention-3's own Hopper kernel where it is built for the request (bf16,
// head_dim 128, non-causal: the DiT's; libs/attention_flash3.h), else FlashInfer's FA3-class
// Hopper kernel (bf16, head_dim 64/128/256; libs/attention_fa3.h), else cuDNN's fused attention
// where it has an engine, else the own flash kernel (bf16, head_dim 64/128), else the general
// GEMM + softmax path. kFlashInferFirst: kAuto without FlashAttention-3's kernel. kCudnnFirst:
// kAuto without either Hopper kernel (the path before them; benchmarks compare them). kOwn: the
// project's kernels only (flash, else general). kFlash3 / kFa3 / kCudnn / kFlash / kGeneral force
// one path (kUnsupported where it cannot run).
enum class AttentionPath {
  kAuto,
  kFlashInferFirst,
  kCudnnFirst,
  kOwn,
  kFlash3,
  kFa3,
  kCudnn,
  kFlash,
  kGeneral
};

struct CudaSettings {
  // Read on the way to the device (CudaBackend::create uses them before the backend exists).
  AttentionPath attention = AttentionPath::kAuto;  // ZIMAGE_ATTENTION
  bool blas_on_thread = true;                      // ZIMAGE_CUBLAS_THREAD
  bool alloc_repeat = true;                        // ZIMAGE_ALLOC_REPEAT
  bool plan_cache = true;  // ZIMAGE_PLAN_CACHE (io/fs/plan_cache.h reads it)

  // Applied to the backend where set; unset keeps CudaBackend's default.
  std::optional<bool> fp8_fast_accum;          // ZIMAGE_FP8_ACCUM=fast|fp32
  std::optional<bool> upload_locked;           // ZIMAGE_UPLOAD=staged|locked
  std::optional<RowKernelTuning> row_kernels;  // ZIMAGE_ROW_KERNELS
  std::optional<Fp8Tile> fp8_tile;             // ZIMAGE_FP8_GEMM
  std::optional<GemmOrder> gemm_order;         // ZIMAGE_GEMM_ORDER
  std::optional<bool> bf16_wide_tile;          // ZIMAGE_BF16_GEMM=cublaslt|cutlass-256x192
  std::optional<GemmTuning> swiglu_tuning;     // ZIMAGE_SWIGLU_GEMM
  std::optional<GemmTuning> qkv_tuning;        // ZIMAGE_QKV_GEMM
  std::optional<bool> staged_rows;             // ZIMAGE_STAGED_ROWS
  std::optional<bool> packed_rows;             // ZIMAGE_PACKED_ROWS
  std::optional<bool> fused_norm;              // ZIMAGE_FUSED_NORM
  std::optional<bool> fused_conv_add;          // ZIMAGE_FUSED_CONV_ADD
  std::optional<bool> pad_narrow_conv;         // ZIMAGE_CONV_PAD_COUT
  std::optional<bool> warm_execute;            // ZIMAGE_WARM_EXECUTE
  std::optional<bool> conv_runtime_compile;    // ZIMAGE_CONV_RUNTIME_COMPILE
  std::optional<bool> packed_qkv;              // ZIMAGE_PACKED_QKV
  std::optional<bool> fp8_inputs;              // ZIMAGE_FP8_INPUTS
  std::optional<bool> fused_swiglu_fp8;        // ZIMAGE_FUSED_SWIGLU_FP8
  std::optional<bool> fused_adaln;             // ZIMAGE_FUSED_ADALN
  std::optional<bool> adaln_layers;            // ZIMAGE_ADALN_LAYERS
  std::optional<bool> fused_swiglu;            // ZIMAGE_FUSED_SWIGLU
  std::optional<bool> fused_qkv;               // ZIMAGE_FUSED_QKV
  std::optional<bool> fused_swiglu_gemm_fp8;   // ZIMAGE_FUSED_SWIGLU_GEMM_FP8
  std::optional<int> warm_up;                  // ZIMAGE_WARM_UP=0|1|2
  std::optional<int> gemm_candidate;           // ZIMAGE_GEMM_CANDIDATE=0..15
  std::optional<GemmAlgoConfig> gemm_config;   // ZIMAGE_GEMM_CONFIG
  std::optional<int> flash3_cluster;           // ZIMAGE_FLASH3_CLUSTER=1|2
  bool gemm_autotune = false;                  // ZIMAGE_GEMM_AUTOTUNE
  std::optional<bool> pin_by_register;         // ZIMAGE_HOST_PIN=huge|register|alloc
};

// cuBLASLt candidates ZIMAGE_GEMM_CANDIDATE may name (LtGemm::kMaxCandidates; checked there).
inline constexpr int kGemmCandidates = 16;

// Every variable above, read and checked: InvalidArgument naming the variable and the values it
// takes for a value it does not take, or for a fused GEMM this build lacks.
Result<CudaSettings> read_cuda_settings();

}  // namespace zimage::cuda
