// CudaBackend::attention: FlashInfer's Hopper kernel or cuDNN's fused attention (bf16; see
// AttentionPath), the own flash kernel (bf16, head_dim 64/128) or the general path for any
// head_dim and f32: per (batch item, position within a GQA group, chunk of queries) one cuBLAS
// strided-batched GEMM over the KV heads for the scores (fp32), the masked softmax kernel, and a
// second batched GEMM for P·V written straight into out's [B, S, H, D] layout. Queries are
// chunked so the score buffer stays under a budget (the VAE's 16384- and 65536-token single
// head): a quarter of the memory available to the allocator at a shape's first call, between
// 256 MiB and 1 GiB (measured
// on the H200 at 65536 tokens: 50.1 ms with 256 MiB of scores, 40.5 with 1 GiB; session 7), or
// what set_attention_score_budget fixed.
#include <algorithm>
#include <chrono>
#include <mutex>
#include <string>
#include <tuple>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/kernels/kernels.h"
#include "backend/cuda/libs/attention_fa3.h"
#include "backend/cuda/libs/attention_flash3.h"
#include "backend/cuda/libs/gemm_cublaslt.h"
#include "backend/cuda/libs/sdpa_cudnn.h"
#include "backend/cuda/runtime/capture_guard.h"
#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/validate.h"
#include "core/log.h"

namespace zimage::cuda {
namespace {

constexpr int64_t kScoreBudgetMin = int64_t{256} << 20;  // bytes of scores + probabilities
constexpr int64_t kScoreBudgetMax = int64_t{1} << 30;
constexpr int64_t kCudnnMaxHeadDim = 256;  // auto's cuDNN path (see CudaBackend::attention)

cudaDataType_t cuda_type(DType dt) {
  return dt == DType::kBF16 ? CUDA_R_16BF : dt == DType::kF16 ? CUDA_R_16F : CUDA_R_32F;
}

// The packed projection's dimensions: qkv[B, S, F] with F = (Hq + 2·Hkv)·D.
struct PackedDims {
  int64_t b = 0, s = 0, f = 0, d = 0;
};

// The checks attention_packed and attention_packed_fp8 share: qkv [B, S, (Hq + 2·Hkv)·D] and out
// [B, S, Hq, D] on this device in the act dtype, not overlapping; one key_len per item or none.
Result<PackedDims> check_packed(const char* op, const Tensor& qkv, int64_t hq, int64_t hkv,
                                const AttentionParams& p, const Tensor& out, DType act) {
  ZI_TRY(check_cuda_tensor(op, "qkv", qkv));
  ZI_TRY(check_cuda_tensor(op, "out", out));
  ZI_TRY(check_dtype(op, "qkv", qkv, act));
  ZI_TRY(check_dtype(op, "out", out, act));
  ZI_TRY(check_rank(op, "qkv", qkv, 3));
  if (hq <= 0 || hkv <= 0 || hq % hkv != 0 || qkv.dim(2) % (hq + 2 * hkv) != 0)
    return InvalidArgument(std::string(op) + ": qkv " + qkv.describe() + " is not [B, S, (" +
                           std::to_string(hq) + " + 2*" + std::to_string(hkv) + ") * D]");
  PackedDims n{qkv.dim(0), qkv.dim(1), qkv.dim(2), qkv.dim(2) / (hq + 2 * hkv)};
  ZI_TRY(check_shape(op, "out", out, {n.b, n.s, hq, n.d}));
  if (overlaps(out, qkv)) return InvalidArgument(std::string(op) + ": out must not alias qkv");
  if (!p.key_len.empty() && static_cast<int64_t>(p.key_len.size()) != n.b)
    return InvalidArgument(std::string(op) + ": key_len has " + std::to_string(p.key_len.size()) +
                           " entries for a batch of " + std::to_string(n.b));
  return n;
}

// The Hopper kernels' request over a packed projection at `base` (`es` bytes an element): q, k
// and v are its three parts, a token F elements after the previous one.
Fa3Request packed_request(const uint8_t* base, size_t es, const PackedDims& n, int64_t hq,
                          int64_t hkv, const AttentionParams& p, void* out) {
  return Fa3Request{base,
                    base + hq * n.d * es,
                    base + (hq + hkv) * n.d * es,
                    out,
                    n.b,
                    n.s,
                    n.s,
                    hq,
                    hkv,
                    n.d,
                    p.scale,
                    p.causal,
                    &p.key_len,
                    n.f,
                    n.f};
}

}  // namespace

Status CudaBackend::attention(const Tensor& q, const Tensor& k, const Tensor& v,
                              const AttentionParams& p, Tensor& out) {
  ZI_OP_SCOPE("attention", &q, &k);
  ZI_TRY(contract::attention(cuda_env(act_), q, k, v, p, out));
  const int64_t b = q.dim(0), sq = q.dim(1), hq = q.dim(2), d = q.dim(3);
  const int64_t sk = k.dim(1), hkv = k.dim(2);
  if (out.numel() == 0) return Status::Ok();
  if (b > 65535 || hq > 65535 || sq > INT32_MAX || sk > INT32_MAX)
    return Unsupported("attention: shape too large");

  // The Hopper kernels' request (contiguous q, k, v: token strides 0).
  const Fa3Request hopper{q.data(), k.data(), v.data(), out.data(), b,          sq, sk, hq,
                          hkv,      d,        p.scale,  p.causal,   &p.key_len, 0,  0};
  const bool bf16 = q.dtype() == DType::kBF16;
  // FlashAttention-3's own Hopper kernel first where it is built for the request (the DiT's:
  // bf16, head_dim 128, non-causal; measured against FlashInfer's in docs/BENCHMARKS.md);
  // kFlash3 forces it.
  if (attention_path_ == AttentionPath::kFlash3 || flash3_allowed()) {
    const Status s = !flash3_ ? Unsupported("FlashAttention-3: not built, or this GPU is not sm_90")
                     : !bf16  ? Unsupported("FlashAttention-3: needs bf16")
                              : run_flash3(hopper);
    if (s.code() != ErrorCode::kUnsupported || attention_path_ == AttentionPath::kFlash3) return s;
  }
  // FlashInfer's Hopper kernel next (FA3 design; measured against cuDNN at the DiT's shapes in
  // docs/BENCHMARKS.md), where it takes the request (bf16, head_dim 64/128/256, see
  // fa3_supported); kFa3 forces it.
  if (attention_path_ == AttentionPath::kFa3 || fa3_allowed()) {
    const Status s = !fa3_   ? Unsupported("FA3 attention: not built, or this GPU is not sm_90")
                     : !bf16 ? Unsupported("FA3 attention: needs bf16")
                             : fa3_attention(hopper, stream_);
    if (s.code() != ErrorCode::kUnsupported || attention_path_ == AttentionPath::kFa3) return s;
  }
  // cuDNN's fused attention for head_dim up to 256 (the DiT's 128, Qwen3's 128). The VAE's one
  // 512-wide head also has a cuDNN engine, but a slow one: measured on an H200 (bf16,
  // CudaOpsPerf.AttentionBf16) 6.76 ms at 16384 tokens and 112.6 ms at 65536 (~80 TFLOP/s),
  // against 2.73 / 50.1 ms (~200 TFLOP/s) for the general path's two GEMMs around a softmax.
  // So auto sends head_dim > 256 to the general path; kCudnn still forces cuDNN.
  const bool cudnn_first = attention_path_ == AttentionPath::kCudnn ||
                           ((attention_path_ == AttentionPath::kAuto ||
                             attention_path_ == AttentionPath::kFlashInferFirst ||
                             attention_path_ == AttentionPath::kCudnnFirst) &&
                            d <= kCudnnMaxHeadDim);
  if (cudnn_first) {
    Status s = Unsupported("cuDNN attention: f32");
    if (q.dtype() != DType::kF32) {
      const SdpaRequest r{q.data(), k.data(), v.data(), out.data(), b,        sq,        sk,
                          hq,       hkv,      d,        p.scale,    p.causal, p.key_len, q.dtype()};
      s = sdpa_->run(r, *allocator_);
    }
    if (s.ok() || s.code() != ErrorCode::kUnsupported) return s;
    if (attention_path_ == AttentionPath::kCudnn) return s;
  }
  FlashArgs fa{};
  fa.q = q.data();
  fa.k = k.data();
  fa.v = v.data();
  fa.out = out.data();
  fa.batch = static_cast<int>(b);
  fa.seq_q = static_cast<int>(sq);
  fa.seq_k = static_cast<int>(sk);
  fa.heads_q = static_cast<int>(hq);
  fa.heads_kv = static_cast<int>(hkv);
  fa.head_dim = static_cast<int>(d);
  fa.scale = p.scale;
  fa.causal = p.causal;
  fa.variant = flash_variant_;
  fa.has_key_len = !p.key_len.empty() && b <= kMaxAttentionBatch;
  if (fa.has_key_len) std::copy(p.key_len.begin(), p.key_len.end(), fa.key_len);
  const bool flash_ok = q.dtype() == DType::kBF16 && (p.key_len.empty() || fa.has_key_len) &&
                        flash_attention_supported(fa.head_dim, fa);
  if (attention_path_ == AttentionPath::kFlash && !flash_ok)
    return Unsupported("attention: the flash kernel does not handle " + q.describe());
  if (flash_ok && attention_path_ != AttentionPath::kGeneral) {  // all but kGeneral
    ZI_LAUNCH_TRY("attention (flash)", launch_flash_attention(fa, stream_));
    return Status::Ok();
  }
  return attention_general(q, k, v, p, out);
}

Result<Tensor> CudaBackend::flash3_scratch(const Fa3Request& r) {
  return alloc(DType::kF32, {(flash3_scratch_bytes(r) + 3) / 4});
}

Status CudaBackend::run_flash3(const Fa3Request& r) {
  ZI_TRY(flash3_supported(r));
  Result<Tensor> lse = flash3_scratch(r);
  // No memory for its scratch: the next kernel (FlashInfer's needs none) takes the request.
  if (!lse.ok())
    return Unsupported("FlashAttention-3: no device memory for its scratch (" +
                       lse.status().message() + ")");
  return flash3_attention(r, lse->data(), num_sms_, stream_, flash3_cluster_for(false));
}

bool CudaBackend::flash3_allowed() const {
  return flash3_ &&
         (attention_path_ == AttentionPath::kAuto || attention_path_ == AttentionPath::kFlash3);
}

bool CudaBackend::fa3_allowed() const {
  return fa3_ && (attention_path_ == AttentionPath::kAuto ||
                  attention_path_ == AttentionPath::kFlashInferFirst ||
                  attention_path_ == AttentionPath::kFa3);
}

bool CudaBackend::reads_packed_qkv() const {
  // Either Hopper kernel reads q, k and v by their token stride.
  return packed_qkv_ && (flash3_allowed() || fa3_allowed()) && act_ == DType::kBF16 && !fused_qkv_;
}

Status CudaBackend::attention_packed(const Tensor& qkv, int64_t hq, int64_t hkv,
                                     const AttentionParams& p, Tensor& out) {
  if (!reads_packed_qkv()) return Backend::attention_packed(qkv, hq, hkv, p, out);
  ZI_OP_SCOPE("attention_packed", &qkv);
  ZI_ASSIGN_OR_RETURN(const PackedDims n,
                      check_packed("attention_packed", qkv, hq, hkv, p, out, act_));
  if (out.numel() == 0) return Status::Ok();
  const Fa3Request r = packed_request(static_cast<const uint8_t*>(qkv.data()), dtype_size(act_), n,
                                      hq, hkv, p, out.data());
  Status st = Unsupported("no Hopper kernel chosen");
  if (flash3_allowed()) {
    st = run_flash3(r);
    if (st.code() != ErrorCode::kUnsupported || attention_path_ == AttentionPath::kFlash3)
      return st;
  }
  if (fa3_allowed()) st = fa3_attention(r, stream_);
  // Shapes the kernels do not take (a head_dim other than 64/128/256, a row with no key): the
  // parts are copied out and attention() picks its path.
  if (st.code() == ErrorCode::kUnsupported) return Backend::attention_packed(qkv, hq, hkv, p, out);
  return st;
}

Status CudaBackend::fp8_attention_support() const {
  if (!flash3_)
    return Unsupported(
        "FP8 attention runs on FlashAttention-3's kernel: it needs an sm_90 GPU (H100, H200) "
        "and a build with its headers (scripts/setup.sh)");
  if (act_ != DType::kBF16) return Unsupported("FP8 attention needs bf16 activations");
  return Status::Ok();
}

Status CudaBackend::attention_packed_fp8(const Tensor& qkv, int64_t hq, int64_t hkv,
                                         const Tensor& norm_q, const Tensor& norm_k, float eps,
                                         const Tensor& freqs, const AttentionParams& p,
                                         Tensor& out) {
  constexpr const char* op = "attention_packed_fp8";
  ZI_TRY(fp8_attention_support());
  ZI_OP_SCOPE("attention_packed_fp8", &qkv);
  ZI_ASSIGN_OR_RETURN(const PackedDims n, check_packed(op, qkv, hq, hkv, p, out, act_));
  const int64_t b = n.b, s = n.s, f = n.f, d = n.d;
  if (!norm_q.defined() || !norm_k.defined())
    return InvalidArgument("attention_packed_fp8: needs the q and k norm weights (their scales)");
  ZI_ASSIGN_OR_RETURN(const bool shared,
                      check_prologue_tables(op, norm_q, norm_k, freqs, b, s, d, act_));
  if (out.numel() == 0) return Status::Ok();
  if (hkv > 128) return Unsupported("attention_packed_fp8: more than 128 KV heads");
  const float* fr = freqs.defined() ? freqs.data_as<float>() : nullptr;
  if (d != 128 ||
      !qk_norm_rope_packed_fits(qkv.data(), norm_q.data(), norm_k.data(), fr, static_cast<int>(d)))
    return Unsupported("attention_packed_fp8: head_dim 128 and 16-byte aligned operands only");
  // The e4m3 operand (q, k, v at the projection's offsets) and its scales: q, k, v per KV head.
  ZI_ASSIGN_OR_RETURN(Tensor qkv8, alloc(DType::kF8E4M3, {b, s, f}));
  auto* base = static_cast<uint8_t*>(qkv8.data());
  const Fa3Request r = packed_request(base, 1, n, hq, hkv, p, out.data());
  ZI_TRY(flash3_supported_fp8(r));  // grouped heads, causal, shapes: before the other buffers
  ZI_ASSIGN_OR_RETURN(Tensor scales, alloc(DType::kF32, {2 + hkv}));
  ZI_ASSIGN_OR_RETURN(Tensor amax, alloc(DType::kF32, {hkv}));
  ZI_ASSIGN_OR_RETURN(Tensor lse, flash3_scratch(r));
  float* sc = scales.data_as<float>();
  ZI_ASSIGN_OR_RETURN(KType kt, ktype_of(op, act_));
  ZI_LAUNCH_TRY(
      "attention_packed_fp8 (q, k)",
      launch_qk_norm_rope_packed_fp8(kt, qkv.data(), norm_q.data(), norm_k.data(), fr, base, sc,
                                     b * s, shared ? s : 0, static_cast<int>(hq),
                                     static_cast<int>(hkv), static_cast<int>(d), eps, stream_));
  ZI_LAUNCH_TRY("attention_packed_fp8 (v)",
                launch_quantize_packed_v_fp8(kt, qkv.data(), base, amax.data(), sc + 2, b * s,
                                             static_cast<int>(hq), static_cast<int>(hkv),
                                             static_cast<int>(d), stream_));
  return flash3_attention_fp8(r, Flash3Fp8Scales{sc, sc + 1, sc + 2}, lse.data(), num_sms_, stream_,
                              flash3_cluster_for(true));
}

Status CudaBackend::attention_general(const Tensor& q, const Tensor& k, const Tensor& v,
                                      const AttentionParams& p, Tensor& out) {
  const DType dt = q.dtype();
  ZI_ASSIGN_OR_RETURN(KType kt, ktype_of("attention", dt));
  const int64_t b = q.dim(0), sq = q.dim(1), hq = q.dim(2), d = q.dim(3);
  const int64_t sk = k.dim(1), hkv = k.dim(2), group = hq / hkv;
  if (sk == 0 || d == 0) return fill(out, 0.f);
  if (d > INT32_MAX) return Unsupported("attention: head_dim too large");
  const size_t es = dtype_size(dt);
  const bool probs_in_place = dt == DType::kF32;
  const int64_t per_row = hkv * sk * static_cast<int64_t>(4 + (probs_in_place ? 0 : es));
  // The chunk is chosen once per shape and kept: a recorded forward's capture then allocates what
  // its warm-up did, and repeated calls split the rows the same way (the same bits).
  const std::tuple<int64_t, int64_t, int64_t, int64_t, int> shape{hkv, sq, sk, d,
                                                                  static_cast<int>(dt)};
  int64_t chunk = 0;
  bool first_of_shape = false;  // its host time is a debug line (the VAE's first decode)
  std::chrono::steady_clock::time_point t0;  // read on a shape's first call only
  if (score_budget_ > 0) {
    chunk = std::clamp<int64_t>(score_budget_ / std::max<int64_t>(per_row, 1), 1, sq);
  } else if (auto known = score_chunks_.find(shape); known != score_chunks_.end()) {
    chunk = known->second;
  } else {
    t0 = std::chrono::steady_clock::now();
    const std::optional<uint64_t> avail = available_memory();
    const int64_t budget = avail ? std::clamp<int64_t>(static_cast<int64_t>(*avail / 4),
                                                       kScoreBudgetMin, kScoreBudgetMax)
                                 : kScoreBudgetMin;
    chunk = std::clamp<int64_t>(budget / std::max<int64_t>(per_row, 1), 1, sq);
    score_chunks_[shape] = chunk;
    first_of_shape = true;
  }
  ZI_ASSIGN_OR_RETURN(Tensor scores, alloc(DType::kF32, {hkv, chunk, sk}));
  Tensor probs = scores;
  if (!probs_in_place) {
    ZI_ASSIGN_OR_RETURN(probs, alloc(dt, {hkv, chunk, sk}));
  }
  const cudaDataType_t ct = cuda_type(dt);
  cublasHandle_t blas = gemm_->blas();
  const float one = 1.f, zero = 0.f;
  const char* qp = static_cast<const char*>(q.data());
  const char* kp = static_cast<const char*>(k.data());
  const char* vp = static_cast<const char*>(v.data());
  char* op = static_cast<char*>(out.data());
  for (int64_t bi = 0; bi < b; ++bi) {
    const int64_t key_len = p.key_len.empty() ? -1 : p.key_len[static_cast<size_t>(bi)];
    const char* kb = kp + static_cast<size_t>(bi * sk * hkv * d) * es;
    const char* vb = vp + static_cast<size_t>(bi * sk * hkv * d) * es;
    for (int64_t g = 0; g < group; ++g) {
      for (int64_t i0 = 0; i0 < sq; i0 += chunk) {
        const int64_t rows = std::min(chunk, sq - i0);
        // q head h = kvh * group + g; batch over kvh.
        const size_t q_off = static_cast<size_t>(((bi * sq + i0) * hq + g) * d) * es;
        // scoresᵀ (column-major [sk, rows]) = Kᵀ-op · Q: m = sk, n = rows, k = d.
        ZI_CUBLAS_TRY(cublasGemmStridedBatchedEx(
            blas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(sk), static_cast<int>(rows),
            static_cast<int>(d), &one, kb, ct, static_cast<int>(hkv * d), d, qp + q_off, ct,
            static_cast<int>(hq * d), group * d, &zero, scores.data(), CUDA_R_32F,
            static_cast<int>(sk), rows * sk, static_cast<int>(hkv), CUBLAS_COMPUTE_32F,
            CUBLAS_GEMM_DEFAULT));
        ZI_LAUNCH_TRY("attention softmax",
                      launch_masked_softmax(kt, scores.data_as<float>(), probs.data(), hkv, rows,
                                            sk, i0, p.scale, p.causal, key_len, stream_));
        // outᵀ (column-major [d, rows], ld hq*d) = V (column-major [d, sk]) · Pᵀ-view.
        ZI_CUBLAS_TRY(cublasGemmStridedBatchedEx(
            blas, CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(d), static_cast<int>(rows),
            static_cast<int>(sk), &one, vb, ct, static_cast<int>(hkv * d), d, probs.data(), ct,
            static_cast<int>(sk), rows * sk, &zero, op + q_off, ct, static_cast<int>(hq * d),
            group * d, static_cast<int>(hkv), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      }
    }
  }
  if (first_of_shape)
    ZI_DEBUG(
        "attention (general) %lld x %lld heads of %lld, %lld keys: %lld rows a chunk; first "
        "call queued in %.1f ms",
        static_cast<long long>(sq), static_cast<long long>(hq), static_cast<long long>(d),
        static_cast<long long>(sk), static_cast<long long>(chunk),
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  return Status::Ok();
}

bool CudaBackend::warm_general_attention(cudaStream_t side) noexcept {
  // The VAE decoder's mid-block attention at 1024² (16384 tokens, one head of 512, bf16) with the
  // largest score budget, the chunk attention_general picks on a large GPU, and the last chunk's
  // rows: cuBLAS chooses its kernels by shape, and recording a call makes the driver load them.
  // A handle of its own (with its own workspace, as gemm_'s has) so the compute stream is never
  // touched; nothing recorded ever runs.
  constexpr int kTokens = 16384, kDim = 512;
  const int64_t per_row = int64_t{kTokens} * (4 + 2);
  const int chunk = static_cast<int>(std::min<int64_t>(kScoreBudgetMax / per_row, kTokens));
  cublasHandle_t h = nullptr;
  if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) return false;
  void* mem = nullptr;
  bool ok = cublasSetStream(h, side) == CUBLAS_STATUS_SUCCESS &&
            cudaMallocAsync(&mem, LtGemm::kWorkspaceBytes, side) == cudaSuccess &&
            cublasSetWorkspace(h, mem, LtGemm::kWorkspaceBytes) == CUBLAS_STATUS_SUCCESS;
  std::unique_lock<std::mutex> sync_lock(device_sync_mutex(), std::defer_lock);
  if (ok) sync_lock.lock();  // no device-wide synchronisation meets the capture (capture_guard.h)
  if (ok && cudaStreamBeginCapture(side, cudaStreamCaptureModeRelaxed) == cudaSuccess) {
    OpenCaptureGuard close_capture(side);  // closed below; on any other way out, here
    const float one = 1.f, zero = 0.f;
    for (const int rows : {chunk, kTokens - chunk}) {
      if (rows <= 0) continue;
      ok = ok &&
           cublasGemmStridedBatchedEx(h, CUBLAS_OP_T, CUBLAS_OP_N, kTokens, rows, kDim, &one, mem,
                                      CUDA_R_16BF, kDim, kDim, mem, CUDA_R_16BF, kDim, kDim, &zero,
                                      mem, CUDA_R_32F, kTokens, int64_t{rows} * kTokens, 1,
                                      CUBLAS_COMPUTE_32F,
                                      CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS &&
           cublasGemmStridedBatchedEx(
               h, CUBLAS_OP_N, CUBLAS_OP_N, kDim, rows, kTokens, &one, mem, CUDA_R_16BF, kDim, kDim,
               mem, CUDA_R_16BF, kTokens, int64_t{rows} * kTokens, &zero, mem, CUDA_R_16BF, kDim,
               kDim, 1, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS;
    }
    cudaGraph_t graph = nullptr;
    if (cudaStreamEndCapture(side, &graph) != cudaSuccess) ok = false;
    if (graph) cudaGraphDestroy(graph);
  } else {
    ok = false;
  }
  if (sync_lock.owns_lock()) sync_lock.unlock();
  cublasDestroy(h);
  if (mem) cudaFreeAsync(mem, side);
  cudaGetLastError();
  return ok;
}

bool CudaBackend::has_cudnn_attention() const {
  return sdpa_ && sdpa_->available();
}

}  // namespace zimage::cuda
