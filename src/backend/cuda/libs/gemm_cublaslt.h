// GEMMs through cuBLASLt (the linear layers) and cuBLAS (the general attention path's batched
// products). A cuBLASLt plan (operation descriptor, three layouts, heuristic algorithm) is built
// once per (M, N, K, dtype, bias, pointer alignments) and cached; the bias rides on the BIAS
// epilogue. bf16 in/out accumulates in fp32 (CUBLAS_COMPUTE_32F); f32 uses CUBLAS_COMPUTE_32F
// too, which never rounds operands to TF32. One 32 MiB workspace serves every call on the stream.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <array>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "backend/cuda/libs/gemm_algo_config.h"
#include "backend/cuda/runtime/allocator.h"
#include "core/status.h"
#include "core/tensor.h"
#include "io/fs/plan_cache.h"

namespace zimage::cuda {

class LtGemm {
 public:
  static constexpr size_t kWorkspaceBytes = size_t{32} << 20;

  static Result<std::unique_ptr<LtGemm>> create(cudaStream_t stream, CachingAllocator& alloc);

  // Records (never runs) linear() for each {m, n, k} of `dt` on `side`, on handles of its own,
  // into a throwaway CUDA graph: the heuristics are asked and the driver loads the kernels they
  // choose, which the backend's own handles then find loaded (a process's first products of a
  // shape, issue 24). Returns how many were recorded; never fails.
  static int warm_up(cudaStream_t side, const std::vector<std::array<int64_t, 3>>& linears,
                     DType dt) noexcept;
  ~LtGemm();
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;

  // Row-major y[m, n] = x[m, k] · w[n, k]ᵀ (+ bias[n]); all of `dt` (kF32 or kBF16 or kF16).
  Status linear(const void* x, const void* w, const void* bias, void* y, int64_t m, int64_t n,
                int64_t k, DType dt);

  // FP8: row-major y[m, n] = (sx * x8[m, k]) · (sw * w8[n, k])ᵀ with e4m3 operands, per-tensor
  // scales read from device memory (sx, sw: one float each), fp32 accumulation, y in `out_dt`
  // (bf16). Hopper FP8 tensor cores; k a multiple of 16, 16-byte aligned operands.
  Status linear_fp8(const void* x8, const void* w8, const float* sx, const float* sw, void* y,
                    int64_t m, int64_t n, int64_t k, DType out_dt);

  // W8A8 with per-row scales (cuBLASLt's outer-vector scaling): row-major y[m, n] = sx[m] ·
  // sw[n] · Σ_k x8[m, k] · w8[n, k], e4m3 operands, fp32 accumulation, y in `out_dt`. sx [m] and
  // sw [n] f32 in device memory. kUnsupported when cuBLASLt offers no algorithm (the caller
  // falls back).
  Status linear_fp8_rows(const void* x8, const void* w8, const float* sx, const float* sw, void* y,
                         int64_t m, int64_t n, int64_t k, DType out_dt);

  cublasHandle_t blas() const { return blas_; }

  // Autotuning (opt-in: ZIMAGE_GEMM_AUTOTUNE=1): the first time a plan for a product of at least
  // kTuneMinRows rows runs outside a graph capture, its first kTuneCandidates heuristic
  // candidates are timed on the call's own operands (the output is written again each time) and
  // the fastest is kept where it beats the heuristic's first by kTuneMargin or more; the choice is
  // remembered in `cache` (io/fs/plan_cache.h, keyed by the plan's shape and alignments; null: in
  // this process only), so a later process takes it without timing.
  static constexpr int64_t kTuneMinRows = 256;
  static constexpr int kTuneCandidates = 8;
  static constexpr double kTuneMargin = 0.02;
  void set_autotune(bool on, std::shared_ptr<PlanCache> cache);
  bool autotune() const { return autotune_; }
  // The candidate index the plan for a bias-free, 16-byte aligned linear of this shape uses, and
  // whether it was chosen by timing (or read from the cache); for tests.
  Result<std::pair<int, bool>> tuned_choice(int64_t m, int64_t n, int64_t k, DType dt);
  static std::string cache_key(int64_t m, int64_t n, int64_t k, DType dt, bool bias, int al_x,
                               int al_w, int al_y);

  // Which of cuBLASLt's heuristic candidates (best first, at most kMaxCandidates) the plans use:
  // -1, the default, takes the first that works. For measuring the candidates against each
  // other (CudaOpsPerf.GemmCandidates); changing it drops the plans made so far.
  static constexpr int kMaxCandidates = 16;
  void set_candidate(int i);
  int candidate() const { return candidate_; }
  // A measuring switch for whole forwards (ZIMAGE_GEMM_CANDIDATE=i): the plans of products of at
  // least kWideRows rows (the DiT's linears) take candidate i where cuBLASLt offers it, the rest
  // (and shapes with fewer candidates) the first; each such plan names its choice in the log.
  // -1, the default: off. Changing it drops the plans made so far.
  static constexpr int64_t kWideRows = 1024;
  void set_wide_candidate(int i);
  int wide_candidate() const { return wide_candidate_; }
  // A measuring switch for whole forwards (ZIMAGE_GEMM_CONFIG, e.g. "cluster=6,swizzle=1"): fields
  // of cuBLASLt's algorithm configuration (cublasLt.h's ids: CUBLASLT_ALGO_CONFIG_TILE_ID,
  // _STAGES_ID, _CLUSTER_SHAPE_ID, _CTA_SWIZZLING, _CUSTOM_OPTION) set over the chosen candidate's
  // on the plans of products of at least kWideRows rows; -1 leaves a field as the candidate has
  // it. A plan whose shape cuBLASLt's check refuses the configuration for (or which would need
  // more than the workspace) stays on the candidate. Each such plan names what it runs and what
  // the algorithm offers (tiles, stages, swizzle, custom options) in the ZIMAGE_LOG=info log.
  // Autotuning is off while it is set. Changing it drops the plans made so far.
  using AlgoConfig = GemmAlgoConfig;  // parse_gemm_algo_config reads ZIMAGE_GEMM_CONFIG
  void set_wide_config(const AlgoConfig& c);
  const AlgoConfig& wide_config() const { return wide_config_; }
  // Whether the plan for a bias-free, 16-byte aligned linear of this shape runs with the
  // configuration above (false: below kWideRows rows, none set, or refused); for tests.
  Result<bool> wide_configured(int64_t m, int64_t n, int64_t k, DType dt);
  // What an algorithm offers: "swizzle S, custom options 0-C, tiles [..], stages [..]".
  static std::string describe_caps(const cublasLtMatmulAlgo_t& algo);
  // The algorithm the plan for a bias-free, 16-byte aligned linear of this shape uses, as cuBLASLt
  // describes it ("algo 66 tile 21 stages 19 cluster 2 ..."; the ids are cublasLt.h's enums), or
  // "none" where this candidate does not exist.
  Result<std::string> describe(int64_t m, int64_t n, int64_t k, DType dt);
  static std::string describe_algo(const cublasLtMatmulAlgo_t& algo);

 private:
  struct Plan {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
    bool has_algo = false;    // false: no cuBLASLt algorithm, use cublasGemmEx
    bool missing = false;     // the candidate set_candidate asked for does not exist
    int index = 0;            // which heuristic candidate `algo` is
    bool tuned = false;       // chosen by timing or from the cache (autotune)
    bool configured = false;  // runs with wide_config_ (ZIMAGE_GEMM_CONFIG)
    std::vector<cublasLtMatmulAlgo_t> candidates;  // the first kTuneCandidates (autotune)
    std::vector<int> candidate_index;              // their places in the heuristic's list
  };
  // FP8 operand scaling: none (bf16/f32 operands), one scale per tensor, one per row.
  enum Fp8Mode : int { kNoFp8 = 0, kFp8Tensor = 1, kFp8Rows = 2 };
  // (m, n, k, dtype, fused bias, alignment in bytes of x, w, y, Fp8Mode)
  using Key = std::tuple<int64_t, int64_t, int64_t, int, bool, int, int, int, int>;

  LtGemm(cudaStream_t stream) : stream_(stream) {}
  Result<Plan*> plan(const Key& key);
  static void destroy(Plan& p);
  static std::string cache_key(const Key& key);
  // Times p's candidates on these operands and keeps the fastest (autotune).
  Status tune(Plan& p, const Key& key, const void* x, const void* w, void* y);

  cudaStream_t stream_;
  cublasLtHandle_t lt_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  std::shared_ptr<Storage> workspace_;  // null where the caller owns it (warm_up)
  void* ws_ = nullptr;                  // the workspace's bytes
  std::map<Key, Plan> plans_;
  int candidate_ = -1;
  int wide_candidate_ = -1;
  AlgoConfig wide_config_;
  bool autotune_ = false;
  std::shared_ptr<PlanCache> cache_;
};

}  // namespace zimage::cuda
