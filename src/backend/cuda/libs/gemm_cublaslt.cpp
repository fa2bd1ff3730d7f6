// cuBLASLt linear layers: see gemm_cublaslt.h. Row-major y = x·Wᵀ is, read column-major,
// yᵀ[n, m] = W[n, k] (stored k-major, i.e. a column-major k×n matrix, transposed) · xᵀ (a
// column-major k×m matrix): A = w with op T, B = x with op N, C = D = y with leading dim n.
#include "backend/cuda/libs/gemm_cublaslt.h"

#include <algorithm>
#include <mutex>
#include <string>
#include <vector>

#include "backend/cuda/kernels/kernels.h"
#include "backend/cuda/runtime/capture_guard.h"
#include "backend/cuda/runtime/cuda_check.h"
#include "core/log.h"

namespace zimage::cuda {
namespace {

cudaDataType_t cuda_type(DType dt) {
  switch (dt) {
    case DType::kBF16:
      return CUDA_R_16BF;
    case DType::kF16:
      return CUDA_R_16F;
    default:
      return CUDA_R_32F;
  }
}

KType ktype(DType dt) {
  return dt == DType::kBF16 ? KType::kBF16 : dt == DType::kF16 ? KType::kF16 : KType::kF32;
}

// Largest power of two <= 16 dividing the address (null counts as fully aligned).
int alignment(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  if (a == 0) return 16;
  int r = 1;
  while (r < 16 && (a % (2 * r)) == 0) r *= 2;
  return r;
}

}  // namespace

Result<std::unique_ptr<LtGemm>> LtGemm::create(cudaStream_t stream, CachingAllocator& alloc) {
  std::unique_ptr<LtGemm> g(new LtGemm(stream));
  ZI_CUBLAS_TRY(cublasLtCreate(&g->lt_));
  ZI_CUBLAS_TRY(cublasCreate(&g->blas_));
  ZI_CUBLAS_TRY(cublasSetStream(g->blas_, stream));
  ZI_ASSIGN_OR_RETURN(g->workspace_, alloc.allocate(kWorkspaceBytes));
  g->ws_ = g->workspace_->data();
  // cuBLAS would otherwise allocate its own workspace lazily, which graph capture forbids.
  ZI_CUBLAS_TRY(cublasSetWorkspace(g->blas_, g->ws_, kWorkspaceBytes));
  return g;
}

int LtGemm::warm_up(cudaStream_t side, const std::vector<std::array<int64_t, 3>>& linears,
                    DType dt) noexcept {
  int recorded = 0;
  void* mem = nullptr;  // the workspace, and every operand: nothing recorded ever runs
  if (cudaMallocAsync(&mem, kWorkspaceBytes, side) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  try {
    std::unique_ptr<LtGemm> g(new LtGemm(side));
    g->ws_ = mem;
    if (cublasLtCreate(&g->lt_) == CUBLAS_STATUS_SUCCESS &&
        cublasCreate(&g->blas_) == CUBLAS_STATUS_SUCCESS &&
        cublasSetStream(g->blas_, side) == CUBLAS_STATUS_SUCCESS &&
        cublasSetWorkspace(g->blas_, mem, kWorkspaceBytes) == CUBLAS_STATUS_SUCCESS) {
      // No device-wide synchronisation meets the capture (capture_guard.h); an exception
      // (out of host memory in plan()) closes it on the way out.
      std::lock_guard<std::mutex> sync_lock(device_sync_mutex());
      if (cudaStreamBeginCapture(side, cudaStreamCaptureModeRelaxed) == cudaSuccess) {
        OpenCaptureGuard close_capture(side);
        for (const auto& [m, n, k] : linears)
          if (g->linear(mem, mem, nullptr, mem, m, n, k, dt).ok()) ++recorded;
        cudaGraph_t graph = nullptr;
        if (cudaStreamEndCapture(side, &graph) != cudaSuccess) recorded = 0;
        if (graph) cudaGraphDestroy(graph);
      }
    }
  } catch (...) {  // out of host memory: what was not recorded loads at its first use
  }
  cudaFreeAsync(mem, side);
  cudaGetLastError();
  return recorded;
}

void LtGemm::destroy(Plan& p) {
  if (p.op) cublasLtMatmulDescDestroy(p.op);
  if (p.a) cublasLtMatrixLayoutDestroy(p.a);
  if (p.b) cublasLtMatrixLayoutDestroy(p.b);
  if (p.c) cublasLtMatrixLayoutDestroy(p.c);
  p = Plan{};
}

LtGemm::~LtGemm() {
  for (auto& [key, p] : plans_) destroy(p);
  if (blas_) cublasDestroy(blas_);
  if (lt_) cublasLtDestroy(lt_);
}

Result<LtGemm::Plan*> LtGemm::plan(const Key& key) {
  auto it = plans_.find(key);
  if (it != plans_.end()) return &it->second;
  const auto [m, n, k, dti, has_bias, al_x, al_w, al_y, fp8] = key;
  const DType dt = static_cast<DType>(dti);
  const cudaDataType_t ct = cuda_type(dt);                               // output (and bias)
  const cudaDataType_t operand_t = fp8 != kNoFp8 ? CUDA_R_8F_E4M3 : ct;  // x and w
  Plan p;
  // Builds the plan; on failure the descriptors made so far are destroyed.
  auto build = [&]() -> Status {
    ZI_CUBLAS_TRY(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    ZI_CUBLAS_TRY(
        cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    ZI_CUBLAS_TRY(
        cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    if (fp8 == kFp8Rows) {  // A = w: a scale per row of op(A) (n); B = x: per column (m)
      const int32_t mode = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
      ZI_CUBLAS_TRY(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode,
                                                   sizeof(mode)));
      ZI_CUBLAS_TRY(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode,
                                                   sizeof(mode)));
    }
    if (has_bias) {
      const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
      ZI_CUBLAS_TRY(
          cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
      ZI_CUBLAS_TRY(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &ct,
                                                   sizeof(ct)));
    }
    ZI_CUBLAS_TRY(cublasLtMatrixLayoutCreate(&p.a, operand_t, static_cast<uint64_t>(k),
                                             static_cast<uint64_t>(n), k));
    ZI_CUBLAS_TRY(cublasLtMatrixLayoutCreate(&p.b, operand_t, static_cast<uint64_t>(k),
                                             static_cast<uint64_t>(m), k));
    ZI_CUBLAS_TRY(cublasLtMatrixLayoutCreate(&p.c, ct, static_cast<uint64_t>(n),
                                             static_cast<uint64_t>(m), n));
    struct PrefGuard {
      cublasLtMatmulPreference_t p = nullptr;
      ~PrefGuard() {
        if (p) cublasLtMatmulPreferenceDestroy(p);
      }
    } pref;
    ZI_CUBLAS_TRY(cublasLtMatmulPreferenceCreate(&pref.p));
    const uint64_t ws = kWorkspaceBytes;
    const uint32_t aw = static_cast<uint32_t>(al_w), ax = static_cast<uint32_t>(al_x),
                   ay = static_cast<uint32_t>(al_y);
    ZI_CUBLAS_TRY(cublasLtMatmulPreferenceSetAttribute(
        pref.p, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    ZI_CUBLAS_TRY(cublasLtMatmulPreferenceSetAttribute(
        pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &aw, sizeof(aw)));
    ZI_CUBLAS_TRY(cublasLtMatmulPreferenceSetAttribute(
        pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ax, sizeof(ax)));
    ZI_CUBLAS_TRY(cublasLtMatmulPreferenceSetAttribute(
        pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ay, sizeof(ay)));
    ZI_CUBLAS_TRY(cublasLtMatmulPreferenceSetAttribute(
        pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ay, sizeof(ay)));
    cublasLtMatmulHeuristicResult_t results[kMaxCandidates];
    int returned = 0;
    const int wanted = candidate_ >= 0 || wide_candidate_ >= 0 || autotune_ ? kMaxCandidates : 4;
    const cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(lt_, p.op, p.a, p.b, p.c, p.c, pref.p,
                                                             wanted, results, &returned);
    if (hs != CUBLAS_STATUS_SUCCESS) returned = 0;
    if (candidate_ >= 0) {
      p.missing = candidate_ >= returned || results[candidate_].state != CUBLAS_STATUS_SUCCESS;
      if (!p.missing) p.algo = results[candidate_].algo, p.index = candidate_;
      p.has_algo = !p.missing;
      return Status::Ok();
    }
    const int64_t rows = std::get<0>(key);
    // ZIMAGE_GEMM_CONFIG: its fields over the chosen candidate's, where cuBLASLt's check takes
    // them for this shape.
    auto configure = [&]() {
      if (!wide_config_.any() || !p.has_algo || rows < kWideRows) return;
      const AlgoConfig& c = wide_config_;
      cublasLtMatmulAlgo_t algo = p.algo;
      bool set = true;
      auto set32 = [&](cublasLtMatmulAlgoConfigAttributes_t a, int v) {
        const uint32_t u = static_cast<uint32_t>(v);
        if (v >= 0)
          set = set && cublasLtMatmulAlgoConfigSetAttribute(&algo, a, &u, sizeof(u)) ==
                           CUBLAS_STATUS_SUCCESS;
      };
      set32(CUBLASLT_ALGO_CONFIG_TILE_ID, c.tile);
      set32(CUBLASLT_ALGO_CONFIG_STAGES_ID, c.stages);
      set32(CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, c.swizzle);
      set32(CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, c.custom);
      if (c.cluster >= 0) {  // the one 16-bit field
        const uint16_t u = static_cast<uint16_t>(c.cluster);
        set = set &&
              cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &u,
                                                   sizeof(u)) == CUBLAS_STATUS_SUCCESS;
      }
      cublasLtMatmulHeuristicResult_t check{};
      const bool taken = set &&
                         cublasLtMatmulAlgoCheck(lt_, p.op, p.a, p.b, p.c, p.c, &algo, &check) ==
                             CUBLAS_STATUS_SUCCESS &&
                         check.workspaceSize <= kWorkspaceBytes;
      ZI_INFO("gemm %s: %s [%s] (ZIMAGE_GEMM_CONFIG %s); candidate %d: [%s], which offers %s",
              cache_key(key).c_str(), taken ? "runs" : "configuration refused, runs the candidate",
              describe_algo(taken ? algo : p.algo).c_str(), c.str().c_str(), p.index,
              describe_algo(p.algo).c_str(), describe_caps(p.algo).c_str());
      if (taken) p.algo = algo, p.configured = true;
    };
    if (wide_candidate_ >= 0 && rows >= kWideRows && wide_candidate_ < returned &&
        results[wide_candidate_].state == CUBLAS_STATUS_SUCCESS) {
      p.algo = results[wide_candidate_].algo, p.index = wide_candidate_, p.has_algo = true;
      ZI_INFO("gemm %s: cuBLASLt candidate %d of %d [%s] (ZIMAGE_GEMM_CANDIDATE); the first: [%s]",
              cache_key(key).c_str(), wide_candidate_, returned, describe_algo(p.algo).c_str(),
              describe_algo(results[0].algo).c_str());
      configure();
      return Status::Ok();
    }
    for (int i = 0; i < returned; ++i) {
      if (results[i].state != CUBLAS_STATUS_SUCCESS) continue;
      if (!p.has_algo) p.algo = results[i].algo, p.index = i, p.has_algo = true;
      if (autotune_ && static_cast<int>(p.candidates.size()) < kTuneCandidates) {
        p.candidates.push_back(results[i].algo);
        p.candidate_index.push_back(i);
      }
    }
    if (autotune_ && p.has_algo && cache_) {
      // A remembered choice is a hint: taken when that candidate is still offered, else dropped.
      if (const auto hint = cache_->get(cache_key(key))) {
        bool found = false;
        for (size_t c = 0; c < p.candidates.size(); ++c) {
          if (p.candidate_index[c] != *hint) continue;
          p.algo = p.candidates[c], p.index = p.candidate_index[c], p.tuned = found = true;
        }
        if (!found) cache_->forget(cache_key(key));
      }
    }
    configure();
    return Status::Ok();
  };
  Status st = build();
  if (!st.ok()) {
    destroy(p);
    return st;
  }
  auto [pos, inserted] = plans_.emplace(key, p);
  (void)inserted;
  return &pos->second;
}

std::string LtGemm::cache_key(int64_t m, int64_t n, int64_t k, DType dt, bool bias, int al_x,
                              int al_w, int al_y) {
  return "gemm " + std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k) + " " +
         dtype_name(dt) + (bias ? " bias" : "") + " align " + std::to_string(al_x) + "/" +
         std::to_string(al_w) + "/" + std::to_string(al_y);
}

std::string LtGemm::cache_key(const Key& key) {
  const auto [m, n, k, dti, has_bias, al_x, al_w, al_y, fp8] = key;
  std::string s = cache_key(m, n, k, static_cast<DType>(dti), has_bias, al_x, al_w, al_y);
  if (fp8 != kNoFp8) s += fp8 == kFp8Rows ? " fp8rows" : " fp8";
  return s;
}

void LtGemm::set_autotune(bool on, std::shared_ptr<PlanCache> cache) {
  autotune_ = on;
  cache_ = std::move(cache);
  for (auto& [key, p] : plans_) destroy(p);
  plans_.clear();
}

Result<std::pair<int, bool>> LtGemm::tuned_choice(int64_t m, int64_t n, int64_t k, DType dt) {
  const Key key{m, n, k, static_cast<int>(dt), false, 16, 16, 16, kNoFp8};
  ZI_ASSIGN_OR_RETURN(Plan * p, plan(key));
  if (!p->has_algo) return NotFound("no cuBLASLt algorithm for this shape");
  return std::make_pair(p->index, p->tuned);
}

Status LtGemm::tune(Plan& p, const Key& key, const void* x, const void* w, void* y) {
  p.tuned = true;  // once, whatever the timing gives
  if (p.candidates.size() < 2) {
    if (cache_) cache_->put(cache_key(key), p.index);
    return Status::Ok();
  }
  struct Events {
    cudaEvent_t a = nullptr, b = nullptr;
    ~Events() {
      if (a) cudaEventDestroy(a);
      if (b) cudaEventDestroy(b);
    }
  } ev;
  ZI_CUDA_TRY(cudaEventCreate(&ev.a));
  ZI_CUDA_TRY(cudaEventCreate(&ev.b));
  const float alpha = 1.f, beta = 0.f;
  auto run = [&](const cublasLtMatmulAlgo_t& algo) {
    return cublasLtMatmul(lt_, p.op, &alpha, w, p.a, x, p.b, &beta, y, p.c, y, p.c, &algo, ws_,
                          kWorkspaceBytes, stream_);
  };
  constexpr int kWarm = 2, kTimed = 5;
  double first_ms = -1, best_ms = 0;
  size_t best = 0;
  bool any = false;
  for (size_t c = 0; c < p.candidates.size(); ++c) {
    bool ok = true;
    for (int i = 0; i < kWarm && ok; ++i) ok = run(p.candidates[c]) == CUBLAS_STATUS_SUCCESS;
    ok = ok && cudaEventRecord(ev.a, stream_) == cudaSuccess;
    for (int i = 0; i < kTimed && ok; ++i) ok = run(p.candidates[c]) == CUBLAS_STATUS_SUCCESS;
    ok = ok && cudaEventRecord(ev.b, stream_) == cudaSuccess &&
         cudaEventSynchronize(ev.b) == cudaSuccess;
    float ms = 0;
    ok = ok && cudaEventElapsedTime(&ms, ev.a, ev.b) == cudaSuccess;
    if (!ok) {  // a candidate that does not run here is passed over
      (void)cudaGetLastError();
      continue;
    }
    const double t = ms / kTimed;
    if (p.candidate_index[c] == p.index) first_ms = t;
    if (!any || t < best_ms) best_ms = t, best = c, any = true;
  }
  if (any && p.candidate_index[best] != p.index &&
      (first_ms < 0 || best_ms <= first_ms * (1.0 - kTuneMargin))) {
    ZI_DEBUG("gemm autotune %s: candidate %d %.3f ms over the heuristic's %d %.3f ms",
             cache_key(key).c_str(), p.candidate_index[best], best_ms, p.index, first_ms);
    p.algo = p.candidates[best];
    p.index = p.candidate_index[best];
  }
  if (cache_) cache_->put(cache_key(key), p.index);
  return Status::Ok();
}

void LtGemm::set_wide_candidate(int i) {
  wide_candidate_ = i < 0 ? -1 : std::min(i, kMaxCandidates - 1);
  for (auto& [key, p] : plans_) destroy(p);
  plans_.clear();
}

void LtGemm::set_wide_config(const AlgoConfig& c) {
  wide_config_ = c;
  for (auto& [key, p] : plans_) destroy(p);
  plans_.clear();
}

Result<bool> LtGemm::wide_configured(int64_t m, int64_t n, int64_t k, DType dt) {
  const Key key{m, n, k, static_cast<int>(dt), false, 16, 16, 16, kNoFp8};
  ZI_ASSIGN_OR_RETURN(Plan * p, plan(key));
  return p->configured;
}

std::string LtGemm::describe_caps(const cublasLtMatmulAlgo_t& algo) {
  auto scalar = [&](cublasLtMatmulAlgoCapAttributes_t a) {
    int32_t v = -1;
    size_t written = 0;
    return cublasLtMatmulAlgoCapGetAttribute(&algo, a, &v, sizeof(v), &written) ==
                   CUBLAS_STATUS_SUCCESS
               ? std::to_string(v)
               : std::string("?");
  };
  auto list = [&](cublasLtMatmulAlgoCapAttributes_t a) {
    size_t bytes = 0;
    if (cublasLtMatmulAlgoCapGetAttribute(&algo, a, nullptr, 0, &bytes) != CUBLAS_STATUS_SUCCESS)
      return std::string("?");
    std::vector<uint32_t> ids(bytes / sizeof(uint32_t));
    size_t written = 0;
    if (!ids.empty() &&
        cublasLtMatmulAlgoCapGetAttribute(&algo, a, ids.data(), ids.size() * sizeof(uint32_t),
                                          &written) != CUBLAS_STATUS_SUCCESS)
      return std::string("?");
    std::string s = "[";
    for (size_t i = 0; i < ids.size(); ++i) s += (i ? " " : "") + std::to_string(ids[i]);
    return s + "]";
  };
  return "swizzle " + scalar(CUBLASLT_ALGO_CAP_CTA_SWIZZLING_SUPPORT) + ", custom options 0-" +
         scalar(CUBLASLT_ALGO_CAP_CUSTOM_OPTION_MAX) + ", tiles " +
         list(CUBLASLT_ALGO_CAP_TILE_IDS) + ", stages " + list(CUBLASLT_ALGO_CAP_STAGES_IDS);
}

void LtGemm::set_candidate(int i) {
  candidate_ = i < 0 ? -1 : std::min(i, kMaxCandidates - 1);
  for (auto& [key, p] : plans_) destroy(p);
  plans_.clear();
}

Result<std::string> LtGemm::describe(int64_t m, int64_t n, int64_t k, DType dt) {
  const Key key{m, n, k, static_cast<int>(dt), false, 16, 16, 16, kNoFp8};
  ZI_ASSIGN_OR_RETURN(Plan * p, plan(key));
  if (!p->has_algo) return std::string("none");
  return describe_algo(p->algo);
}

std::string LtGemm::describe_algo(const cublasLtMatmulAlgo_t& algo) {
  // Each attribute is read at its own size (cuBLASLt refuses another): the cluster and inner
  // shape ids are uint16, the rest 32-bit.
  auto attr = [&](cublasLtMatmulAlgoConfigAttributes_t a) {
    const bool narrow =
        a == CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID || a == CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID;
    uint16_t v16 = 0;
    int32_t v32 = -1;
    size_t written = 0;
    const cublasStatus_t st =
        narrow ? cublasLtMatmulAlgoConfigGetAttribute(&algo, a, &v16, sizeof(v16), &written)
               : cublasLtMatmulAlgoConfigGetAttribute(&algo, a, &v32, sizeof(v32), &written);
    if (st != CUBLAS_STATUS_SUCCESS) return std::string("?");
    return std::to_string(narrow ? static_cast<int32_t>(v16) : v32);
  };
  return "algo " + attr(CUBLASLT_ALGO_CONFIG_ID) + " tile " + attr(CUBLASLT_ALGO_CONFIG_TILE_ID) +
         " stages " + attr(CUBLASLT_ALGO_CONFIG_STAGES_ID) + " cluster " +
         attr(CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID) + " splitk " +
         attr(CUBLASLT_ALGO_CONFIG_SPLITK_NUM) + " swizzle " +
         attr(CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING) + " inner " +
         attr(CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID);
}

Status LtGemm::linear(const void* x, const void* w, const void* bias, void* y, int64_t m, int64_t n,
                      int64_t k, DType dt) {
  if (m == 0 || n == 0) return Status::Ok();
  if (k == 0) {  // empty sum: y = bias or 0
    ZI_LAUNCH_TRY("linear (k = 0)", launch_fill(ktype(dt), y, m * n, 0.f, stream_));
    if (bias) ZI_LAUNCH_TRY("linear bias", launch_add(ktype(dt), y, bias, y, m * n, n, stream_));
    return Status::Ok();
  }
  // The BIAS epilogue wants an aligned bias vector; otherwise the bias is a separate add.
  const bool fuse_bias = bias != nullptr && alignment(bias) == 16;
  const Key key{
      m, n, k, static_cast<int>(dt), fuse_bias, alignment(x), alignment(w), alignment(y), kNoFp8};
  ZI_ASSIGN_OR_RETURN(Plan * p, plan(key));
  if (p->missing) return Unsupported("matmul: no cuBLASLt candidate " + std::to_string(candidate_));
  const float alpha = 1.f, beta = 0.f;
  if (p->has_algo) {
    if (fuse_bias)
      ZI_CUBLAS_TRY(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                                   sizeof(bias)));
    // Not under a forced candidate: the timing would put it in the plan cache as the choice.
    if (autotune_ && candidate_ < 0 && wide_candidate_ < 0 && !wide_config_.any() && !p->tuned &&
        m >= kTuneMinRows) {
      cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
      ZI_CUDA_TRY(cudaStreamIsCapturing(stream_, &capture));
      if (capture == cudaStreamCaptureStatusNone) ZI_TRY(tune(*p, key, x, w, y));
    }
    ZI_CUBLAS_TRY(cublasLtMatmul(lt_, p->op, &alpha, w, p->a, x, p->b, &beta, y, p->c, y, p->c,
                                 &p->algo, ws_, kWorkspaceBytes, stream_));
    if (bias && !fuse_bias)
      ZI_LAUNCH_TRY("linear bias", launch_add(ktype(dt), y, bias, y, m * n, n, stream_));
    return Status::Ok();
  }
  // No cuBLASLt algorithm for this shape/alignment: plain cuBLAS (int dimensions).
  if (m > INT32_MAX || n > INT32_MAX || k > INT32_MAX)
    return Unsupported("matmul: no cuBLASLt algorithm for a GEMM this large");
  const cudaDataType_t ct = cuda_type(dt);
  ZI_CUBLAS_TRY(cublasGemmEx(blas_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n),
                             static_cast<int>(m), static_cast<int>(k), &alpha, w, ct,
                             static_cast<int>(k), x, ct, static_cast<int>(k), &beta, y, ct,
                             static_cast<int>(n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  if (bias) ZI_LAUNCH_TRY("linear bias", launch_add(ktype(dt), y, bias, y, m * n, n, stream_));
  return Status::Ok();
}

Status LtGemm::linear_fp8(const void* x8, const void* w8, const float* sx, const float* sw, void* y,
                          int64_t m, int64_t n, int64_t k, DType out_dt) {
  if (m == 0 || n == 0) return Status::Ok();
  if (k % 16 != 0 || alignment(x8) < 16 || alignment(w8) < 16 || alignment(y) < 16)
    return Unsupported("matmul_fp8: k must be a multiple of 16 and the operands 16-byte aligned");
  const Key key{
      m,         n, k, static_cast<int>(out_dt), false, alignment(x8), alignment(w8), alignment(y),
      kFp8Tensor};
  ZI_ASSIGN_OR_RETURN(Plan * p, plan(key));
  if (!p->has_algo) return Unsupported("matmul_fp8: no cuBLASLt FP8 algorithm for this shape");
  // A is the weight (scale sw), B the activations (scale sx): see linear().
  ZI_CUBLAS_TRY(
      cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sw, sizeof(sw)));
  ZI_CUBLAS_TRY(
      cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sx, sizeof(sx)));
  const float alpha = 1.f, beta = 0.f;
  ZI_CUBLAS_TRY(cublasLtMatmul(lt_, p->op, &alpha, w8, p->a, x8, p->b, &beta, y, p->c, y, p->c,
                               &p->algo, ws_, kWorkspaceBytes, stream_));
  return Status::Ok();
}

Status LtGemm::linear_fp8_rows(const void* x8, const void* w8, const float* sx, const float* sw,
                               void* y, int64_t m, int64_t n, int64_t k, DType out_dt) {
  if (m == 0 || n == 0) return Status::Ok();
  if (k % 16 != 0 || alignment(x8) < 16 || alignment(w8) < 16 || alignment(y) < 16)
    return Unsupported(
        "matmul_fp8_rows: k must be a multiple of 16 and the operands 16-byte aligned");
  const Key key{
      m,       n, k, static_cast<int>(out_dt), false, alignment(x8), alignment(w8), alignment(y),
      kFp8Rows};
  ZI_ASSIGN_OR_RETURN(Plan * p, plan(key));
  if (!p->has_algo)
    return Unsupported("matmul_fp8_rows: no cuBLASLt algorithm with per-row FP8 scales for [" +
                       std::to_string(m) + ", " + std::to_string(k) + "] x [" + std::to_string(n) +
                       ", " + std::to_string(k) + "]");
  ZI_CUBLAS_TRY(
      cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sw, sizeof(sw)));
  ZI_CUBLAS_TRY(
      cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sx, sizeof(sx)));
  const float alpha = 1.f, beta = 0.f;
  ZI_CUBLAS_TRY(cublasLtMatmul(lt_, p->op, &alpha, w8, p->a, x8, p->b, &beta, y, p->c, y, p->c,
                               &p->algo, ws_, kWorkspaceBytes, stream_));
  return Status::Ok();
}

}  // namespace zimage::cuda
