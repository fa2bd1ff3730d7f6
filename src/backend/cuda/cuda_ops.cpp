// CudaBackend compute ops other than attention and conv: validation at the boundary, then one
// launcher call (dtype dispatch happens inside the launcher, once). Shapes and in-place rules are
// those of backend/backend.h.
#include <algorithm>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/kernels/kernels.h"
#include "backend/cuda/libs/gemm_cublaslt.h"
#include "backend/cuda/libs/gemm_cutlass.h"
#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/validate.h"

namespace zimage::cuda {
namespace {

// Rows per scale / gate row for the norm kernels: all rows when there is none.
int64_t rows_per_group(const contract::RowNorm& r) {
  return r.group > 0 ? r.group : std::max<int64_t>(r.rows, 1);
}

}  // namespace

Status CudaBackend::matmul(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& y) {
  ZI_OP_SCOPE("matmul", &x, &w);
  constexpr const char* op = "matmul";
  ZI_TRY(contract::matmul(cuda_env(act_), x, w, bias, y));
  const int64_t n = w.dim(0), k = w.dim(1);
  const int64_t m = shape_numel(Shape(x.shape().begin(), x.shape().end() - 1));
  if (!fused_ && bias.defined()) {  // ablation: the bias as its own pass, not in the epilogue
    ZI_TRY(
        gemm_->linear(x.data(), w.data(), nullptr, y.data(), m, n, k, x.dtype()).with_context(op));
    ZI_ASSIGN_OR_RETURN(KType kt, ktype_of(op, x.dtype()));
    ZI_LAUNCH_TRY("matmul bias",
                  launch_add(kt, y.data(), bias.data(), y.data(), m * n, n, stream_));
    return Status::Ok();
  }
  if (bf16_wide_tile_ && use_cutlass_ && !bias.defined() && m >= 1024 && sm_ == 90 &&
      x.dtype() == DType::kBF16 && w.dtype() == DType::kBF16 && y.dtype() == DType::kBF16) {
    const size_t ws_bytes = cutlass_bf16_gemm_tile_workspace(m, n, k);
    Tensor ws;
    if (ws_bytes > 0) {
      ZI_ASSIGN_OR_RETURN(ws, alloc(DType::kU8, {static_cast<int64_t>(ws_bytes)}));
    }
    const Status st = cutlass_bf16_gemm_tile(PlainTile::kCoop256x192, x.data(), w.data(), y.data(),
                                             m, n, k, ws_bytes ? ws.data() : nullptr, ws_bytes,
                                             stream_, gemm_order_for(m, n, k, /*fp8=*/false));
    if (st.code() != ErrorCode::kUnsupported) return st.with_context(op);
  }
  return gemm_->linear(x.data(), w.data(), ptr_or_null(bias), y.data(), m, n, k, x.dtype())
      .with_context(op);
}

GemmOrder CudaBackend::gemm_order_for(int64_t m, int64_t n, int64_t k, bool fp8) const {
  if (gemm_order_) return *gemm_order_;
  // The FP8 GEMM's wide linears at 2048²-class rows (w1|w3, q|k|v: n >= 2k), in the default fast-
  // accumulation tile (256 × 192, the one measured), walk along M two tile columns at a time:
  // neither operand fits the L2 there (at M 16448 x8 is 63 MB, w1|w3's weight 79 MB). For w1|w3
  // (107 tile columns, 65 rows) CUTLASS's heuristic walks one column down all of M, reading the
  // whole of x8 again for each column pair; for q|k|v (60 columns) it walks along N. Measured on
  // an H100 (CudaOpsPerf.GemmOrder, docs/BENCHMARKS.md "Session 31"): w1|w3 at M 16448 1.927
  // against 2.138 ms, q|k|v equal; every other order, and this one at M 4160 or for w2 and the
  // out projection, slower or equal.
  // (fp8_tile_by_waves keeps 256 × 192 at these shapes: ZIMAGE_FP8_GEMM=waves keeps the order.)
  if (fp8 && (fp8_tile_ == Fp8Tile::kAuto || fp8_tile_ == Fp8Tile::kAutoWaves) && fp8_fast_accum_ &&
      m >= 12288 && n >= 2 * k)
    return {GemmRaster::kAlongM, 2};
  return {};  // CUTLASS's default: its heuristic raster, swizzle 1
}

// FP8 tensor-core GEMMs (cuBLASLt) exist from Ada (sm_89) and Hopper (sm_90) on.
Status CudaBackend::check_fp8_capable() const {
  if (sm_ >= 89) return Status::Ok();
  return Unsupported(
      "FP8 needs a GPU of compute capability 8.9 or newer (Ada, Hopper); this one "
      "is sm_" +
      std::to_string(sm_));
}

Status CudaBackend::quantize_fp8(const Tensor& x, Tensor& x8, Tensor& scale) {
  ZI_OP_SCOPE("quantize_fp8", &x);
  constexpr const char* op = "quantize_fp8";
  ZI_TRY(check_fp8_capable());
  ZI_TRY(contract::quantize_fp8(cuda_env(act_), x, x8, scale));
  ZI_ASSIGN_OR_RETURN(KType kt, ktype_of(op, x.dtype()));
  ZI_ASSIGN_OR_RETURN(Tensor amax, alloc(DType::kU8, {4}));
  ZI_LAUNCH_TRY(op, launch_quantize_fp8(kt, x.data(), x.numel(), amax.data(),
                                        scale.data_as<float>(), x8.data(), stream_));
  return Status::Ok();
}

Status CudaBackend::matmul_fp8(const Tensor& x, const Tensor& w8, const Tensor& w_scale,
                               Tensor& y) {
  ZI_OP_SCOPE("matmul_fp8", &x, &w8);
  constexpr const char* op = "matmul_fp8";
  ZI_TRY(check_fp8_capable());
  ZI_TRY(contract::matmul_fp8(cuda_env(act_), x, w8, w_scale, y));
  if (act_ == DType::kF32) return Unsupported("matmul_fp8: needs the bf16 compute dtype");
  const int64_t n = w8.dim(0), k = w8.dim(1);
  const int64_t m = x.numel() / std::max<int64_t>(k, 1);
  ZI_ASSIGN_OR_RETURN(Tensor x8, alloc(DType::kF8E4M3, x.shape()));
  ZI_ASSIGN_OR_RETURN(Tensor sx, alloc(DType::kF32, {1}));
  ZI_TRY(quantize_fp8(x, x8, sx));
  return gemm_
      ->linear_fp8(x8.data(), w8.data(), sx.data_as<float>(), w_scale.data_as<float>(), y.data(), m,
                   n, k, act_)
      .with_context(op);
}

Status CudaBackend::rms_norm(const Tensor& x, const Tensor& w, float eps, const Tensor& scale,
                             Tensor& y) {
  ZI_OP_SCOPE("rms_norm", &x, &scale);
  constexpr const char* op = "rms_norm";
  ZI_ASSIGN_OR_RETURN(contract::RowNorm r, contract::rms_norm(cuda_env(act_), x, w, scale, y));
  const int64_t rpg = rows_per_group(r);
  ZI_ASSIGN_OR_RETURN(KType kt, ktype_of(op, act_));
  ZI_LAUNCH_TRY(op, launch_rms_norm(kt, x.data(), ptr_or_null(w), ptr_or_null(scale), y.data(),
                                    r.rows, r.d, rpg, eps, stream_));
  return Status::Ok();
}

Status CudaBackend::layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, float eps,
                               const Tensor& scale, Tensor& y) {
  ZI_OP_SCOPE("layer_norm", &x);
  constexpr const char* op = "layer_norm";
  ZI_ASSIGN_OR_RETURN(contract::RowNorm r, contract::layer_norm(cuda_env(act_), x, w, b, scale, y));
  const int64_t rpg = rows_per_group(r);
  ZI_ASSIGN_OR_RETURN(KType kt, ktype_of(op, act_));
  ZI_LAUNCH_TRY(op,
                launch_layer_norm(kt, x.data(), ptr_or_null(w), ptr_or_null(b), ptr_or_null(scale),
                                  y.data(), r.rows, r.d, rpg, eps, stream_));
  return Status::Ok();
}

Status CudaBackend::residual_rms_norm_gate(Tensor& x, const Tensor& y, const Tensor& w, float eps,
                                           const Tensor& gate) {
  ZI_OP_SCOPE("residual_rms_norm_gate", &x);
  constexpr const char* op = "residual_rms_norm_gate";
  ZI_ASSIGN_OR_RETURN(contract::RowNorm r,
                      contract::residual_rms_norm_gate(cuda_env(act_), x, y, w, gate));
  const int64_t rpg = rows_per_group(r);
  ZI_ASSIGN_OR_RETURN(KType kt, ktype_of(op, act_));
  ZI_LAUNCH_TRY(
      op, launch_residual_rms_norm_gate(kt, x.data(), y.data(), ptr_or_null(w), ptr_or_null(gate),
                                        r.rows, r.d, rpg, eps, stream_));
  return Status::Ok();
}

Status CudaBackend::residual_norm_gate_then_norm(Tensor& x, const Tensor& y, const Tensor& w,
                                                 float eps, const Tensor& gate,
                                                 const Tensor& w_next, const Tensor& scale_next,
                                                 Tensor& out) {
  if (!fused_norm_)
    return Backend::residual_norm_gate_then_norm(x, y, w, eps, gate, w_next, scale_next, out);
  ZI_OP_SCOPE("residual_norm_gate_then_norm", &x);
  constexpr const char* op = "residual_norm_gate_then_norm";
  ZI_ASSIGN_OR_RETURN(contract::RowNorm a,
                      contract::residual_rms_norm_gate(cuda_env(act_), x, y, w, gate));
  const Tensor xr = x.view({a.rows, a.d});
  ZI_ASSIGN_OR_RETURN(contract::RowNorm b,
                      contract::rms_norm(cuda_env(act_), xr, w_next, scale_next, out));
  // In place, or gate and scale of different groupings: the two kernels.
  const bool fusable =
      !overlaps(out, x) && !overlaps(out, y) &&
      (!gate.defined() || !scale_next.defined() || rows_per_group(a) == rows_per_group(b));
  ZI_ASSIGN_OR_RETURN(KType kt, ktype_of(op, act_));
  const cudaError_t e =
      fusable ? launch_residual_norm_then_norm(
                    kt, x.data(), y.data(), ptr_or_null(w), ptr_or_null(gate), ptr_or_null(w_next),
                    ptr_or_null(scale_next), out.data(), a.rows, a.d,
                    gate.defined() ? rows_per_group(a) : rows_per_group(b), eps, stream_)
              : cudaErrorNotSupported;
  if (e == cudaErrorNotSupported) {  // or a row the fused form does not take
    cudaGetLastError();
    return Backend::residual_norm_gate_then_norm(x, y, w, eps, gate, w_next, scale_next, out);
  }
  ZI_LAUNCH_TRY(op, e);
  return Status::Ok();
}

Status CudaBackend::residual_norm_gate_then_norm_fp8(Tensor& x, const Tensor& y, const Tensor& w,
                                                     float eps, const Tensor& gate,
                                                     const Tensor& w_next, const Tensor& scale_next,
                                                     Tensor& out, Tensor& out8, Tensor& out_scale) {
  auto composed = [&] {
    return Backend::residual_norm_gate_then_norm_fp8(x, y, w, eps, gate, w_next, scale_next, out,
                                                     out8, out_scale);
  };
  if (!fused_norm_) return composed();
  ZI_OP_SCOPE("residual_norm_gate_then_norm_fp8", &x);
  constexpr const char* op = "residual_norm_gate_then_norm_fp8";
  ZI_TRY(check_fp8_capable());
  ZI_ASSIGN_OR_RETURN(contract::RowNorm a,
                      contract::residual_rms_norm_gate(cuda_env(act_), x, y, w, gate));
  const Tensor xr = x.view({a.rows, a.d});
  ZI_ASSIGN_OR_RETURN(contract::RowNorm b,
                      contract::rms_norm(cuda_env(act_), xr, w_next, scale_next, out));
  ZI_TRY(contract::fp8_rows_out(cuda_env(act_), op, a.rows, a.d, out8, out_scale));
  const bool fusable =
      !overlaps(out8, x) && !overlaps(out8, y) && !overlaps(out_scale, x) &&
      !overlaps(out_scale, y) &&
      (!gate.defined() || !scale_next.defined() || rows_per_group(a) == rows_per_group(b));
  ZI_ASSIGN_OR_RETURN(KType kt, ktype_of(op, act_));
  const cudaError_t e =
      fusable ? launch_residual_norm_then_norm_fp8(
                    kt, x.data(), y.data(), ptr_or_null(w), ptr_or_null(gate), ptr_or_null(w_next),
                    ptr_or_null(scale_next), out8.data(), out_scale.data_as<float>(), a.rows, a.d,
                    gate.defined() ? rows_per_group(a) : rows_per_group(b), eps, stream_)
              : cudaErrorNotSupported;
  if (e == cudaErrorNotSupported) {  // a row the fused form does not take
    cudaGetLastError();
    return composed();
  }
  ZI_LAUNCH_TRY(op, e);
  return Status::Ok();
}

Status CudaBackend::group_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, int groups,
                               float eps, bool silu, Tensor& y) {
  ZI_OP_SCOPE("group_norm", &x);
  constexpr const char* op = "group_norm";
  ZI_TRY(contract::group_norm(cuda_env(act_), x, gamma, beta, groups, y));
  const int64_t b = x.dim(0), hw = x.dim(1) * x.dim(2), c = x.dim(3);
  if (c > 3072) return Unsupported("group_norm: more than 3072 channels");
  if (b > 65535) return Unsupported("group_norm: batch above 65535");
  if (x.numel() == 0) return Status::Ok();
  ZI_ASSIGN_OR_RETURN(KType kt, ktype_of(op, act_));
  const size_t ws_bytes = group_norm_workspace_bytes(b, hw, c, groups);
  ZI_ASSIGN_OR_RETURN(Tensor ws, alloc(DType::kU8, {static_cast<int64_t>(ws_bytes)}));
  ZI_LAUNCH_TRY(op, launch_group_norm(kt, x.data(), ptr_or_null(gamma), ptr_or_null(beta), y.data(),
                                      b, hw, c, groups, eps, silu, ws.data(), stream_));
  return Status::Ok();
}

Status CudaBackend::rope_half(Tensor& x, const Tensor& cos, const Tensor& sin) {
  ZI_OP_SCOPE("rope_half", &x);
  constexpr const char* op = "rope_half";
  ZI_TRY(contract::rope_half(cuda_env(act_), x, cos, sin));
  const int64_t s = x.dim(1), dh = x.dim(3);
  ZI_ASSIGN_OR_RETURN(KType kt, ktype_of(op, act_));
  ZI_LAUNCH_TRY(op, launch_rope_half(kt, x.data(), cos.data_as<float>(), sin.data_as<float>(),
                                     x.dim(0), s, x.dim(2), dh, stream_));
  return Status::Ok();
}

Status CudaBackend::rope_interleaved(Tensor& x, const Tensor& freqs) {
  ZI_OP_SCOPE("rope_interleaved", &x);
  constexpr const char* op = "rope_interleaved";
  ZI_TRY(contract::rope_interleaved(cuda_env(act_), x, freqs));
  const int64_t b = x.dim(0), s = x.dim(1), dh = x.dim(3);
  // A leading 1 shares the table over the batch.
  const bool shared = freqs.dim(0) == 1 && b != 1;
  ZI_ASSIGN_OR_RETURN(KType kt, ktype_of(op, act_));
  ZI_LAUNCH_TRY(op, launch_rope_interleaved(kt, x.data(), freqs.data_as<float>(), shared, b, s,
                                            x.dim(2), dh, stream_));
  return Status::Ok();
}

Status CudaBackend::qkv_split_norm_rope(const Tensor& qkv, const Tensor& norm_q,
                                        const Tensor& norm_k, float eps, const Tensor& freqs,
                                        Tensor& q, Tensor& k, Tensor& v) {
  if (!fused_) return Backend::qkv_split_norm_rope(qkv, norm_q, norm_k, eps, freqs, q, k, v);
  ZI_OP_SCOPE("qkv_split_norm_rope", &qkv);
  constexpr const char* op = "qkv_split_norm_rope";
  for (const Tensor* t : std::initializer_list<const Tensor*>{&qkv, &q, &k, &v}) {
    ZI_TRY(check_cuda_tensor(op, "qkv/q/k/v", *t));
    ZI_TRY(check_dtype(op, "qkv/q/k/v", *t, act_));
  }
  ZI_TRY(check_rank(op, "qkv", qkv, 2));
  ZI_TRY(check_rank(op, "q", q, 4));
  ZI_TRY(check_rank(op, "k", k, 4));
  ZI_TRY(check_shape(op, "v", v, k.shape()));
  const int64_t b = q.dim(0), s = q.dim(1), hq = q.dim(2), dh = q.dim(3), hkv = k.dim(2);
  const int64_t rows = b * s;
  ZI_TRY(check_shape(op, "k", k, {b, s, hkv, dh}));
  ZI_TRY(check_shape(op, "qkv", qkv, {rows, (hq + 2 * hkv) * dh}));
  ZI_ASSIGN_OR_RETURN(const bool shared,
                      check_prologue_tables(op, norm_q, norm_k, freqs, b, s, dh, act_));
  if (dh % 2 != 0 || dh > 256)
    return Unsupported("qkv_split_norm_rope: head_dim must be even and at most 256");
  if (hq + 2 * hkv > INT32_MAX / dh) return Unsupported("qkv_split_norm_rope: too many heads");
  for (const Tensor* t : std::initializer_list<const Tensor*>{&q, &k, &v})
    if (overlaps(*t, qkv))
      return InvalidArgument("qkv_split_norm_rope: outputs must not alias qkv");
  if (rows == 0) return Status::Ok();
  ZI_ASSIGN_OR_RETURN(KType kt, ktype_of(op, act_));
  ZI_LAUNCH_TRY(op,
                launch_qkv_norm_rope(kt, qkv.data(), ptr_or_null(norm_q), ptr_or_null(norm_k),
                                     freqs.defined() ? freqs.data_as<float>() : nullptr, q.data(),
                                     k.data(), v.data(), rows, shared ? s : 0, static_cast<int>(hq),
                                     static_cast<int>(hkv), static_cast<int>(dh), eps, stream_));
  return Status::Ok();
}

Status CudaBackend::qk_norm_rope_packed(Tensor& qkv, int64_t hq, int64_t hkv, const Tensor& norm_q,
                                        const Tensor& norm_k, float eps, const Tensor& freqs) {
  constexpr const char* op = "qk_norm_rope_packed";
  ZI_TRY(check_cuda_tensor(op, "qkv", qkv));
  ZI_TRY(check_dtype(op, "qkv", qkv, act_));
  ZI_TRY(check_rank(op, "qkv", qkv, 3));
  if (hq <= 0 || hkv <= 0 || hq % hkv != 0 || qkv.dim(2) % (hq + 2 * hkv) != 0)
    return InvalidArgument("qk_norm_rope_packed: qkv " + qkv.describe() + " is not [B, S, (" +
                           std::to_string(hq) + " + 2*" + std::to_string(hkv) + ") * Dh]");
  const int64_t b = qkv.dim(0), s = qkv.dim(1), dh = qkv.dim(2) / (hq + 2 * hkv);
  ZI_ASSIGN_OR_RETURN(const bool shared,
                      check_prologue_tables(op, norm_q, norm_k, freqs, b, s, dh, act_));
  const float* f = freqs.defined() ? freqs.data_as<float>() : nullptr;
  // The fused kernel where it fits (head_dim 128, aligned); otherwise split, fused, copied back.
  if (!fused_ || dh > INT32_MAX ||
      !qk_norm_rope_packed_fits(qkv.data(), ptr_or_null(norm_q), ptr_or_null(norm_k), f,
                                static_cast<int>(dh)))
    return Backend::qk_norm_rope_packed(qkv, hq, hkv, norm_q, norm_k, eps, freqs);
  ZI_OP_SCOPE("qk_norm_rope_packed", &qkv);
  if (qkv.numel() == 0) return Status::Ok();
  ZI_ASSIGN_OR_RETURN(KType kt, ktype_of(op, act_));
  ZI_LAUNCH_TRY(
      op, launch_qk_norm_rope_packed(kt, qkv.data(), ptr_or_null(norm_q), ptr_or_null(norm_k), f,
                                     b * s, shared ? s : 0, static_cast<int>(hq),
                                     static_cast<int>(hkv), static_cast<int>(dh), eps, stream_));
  return Status::Ok();
}

Status CudaBackend::matmul_qkv_norm_rope(const Tensor& x, const Tensor& wqkv, const Tensor& norm_q,
                                         const Tensor& norm_k, float eps, const Tensor& freqs,
                                         Tensor& qkv, Tensor& q, Tensor& k, Tensor& v) {
  auto unfused = [&] {
    return Backend::matmul_qkv_norm_rope(x, wqkv, norm_q, norm_k, eps, freqs, qkv, q, k, v);
  };
  if (!fused_qkv_ || !fused_ || !use_cutlass_ || act_ != DType::kBF16 || sm_ != 90 ||
      !fused_gemms_available())
    return unfused();
  // Anything this kernel does not take goes the unfused way, whose ops validate and explain.
  auto bf16_here = [&](const Tensor& t) {
    return t.defined() && t.dtype() == DType::kBF16 && check_cuda_tensor("", "", t).ok();
  };
  for (const Tensor* t : std::initializer_list<const Tensor*>{&x, &wqkv, &q, &k, &v})
    if (!bf16_here(*t)) return unfused();
  if (x.rank() < 1 || wqkv.rank() != 2 || q.rank() != 4 || k.rank() != 4) return unfused();
  const int64_t b = q.dim(0), s = q.dim(1), hq = q.dim(2), dh = q.dim(3), hkv = k.dim(2);
  const int64_t rows = b * s, kd = x.dim(-1);
  if (dh != kQkvHeadDim || k.shape() != Shape{b, s, hkv, dh} || v.shape() != k.shape() || kd <= 0 ||
      x.numel() != rows * kd || wqkv.dim(0) != (hq + 2 * hkv) * dh || wqkv.dim(1) != kd ||
      hq > INT32_MAX || hkv > INT32_MAX)
    return unfused();
  if (norm_q.defined() != norm_k.defined()) return unfused();
  if (norm_q.defined() && (!bf16_here(norm_q) || !bf16_here(norm_k) ||
                           norm_q.shape() != Shape{dh} || norm_k.shape() != Shape{dh}))
    return unfused();
  bool shared = false;
  if (freqs.defined()) {
    if (freqs.dtype() != DType::kF32 || !check_cuda_tensor("", "", freqs).ok() || freqs.rank() != 4)
      return unfused();
    shared = freqs.dim(0) == 1 && b != 1;
    if (freqs.shape() != Shape{shared ? 1 : b, s, dh / 2, 2}) return unfused();
  }
  for (const Tensor* o : std::initializer_list<const Tensor*>{&q, &k, &v})
    for (const Tensor* i : std::initializer_list<const Tensor*>{&x, &wqkv, &q, &k, &v})
      if (o != i && overlaps(*o, *i)) return unfused();
  ZI_OP_SCOPE("matmul_qkv_norm_rope", &x, &wqkv);
  const size_t ws_bytes = cutlass_bf16_qkv_norm_rope_workspace(rows, wqkv.dim(0), kd);
  Tensor ws;
  if (ws_bytes > 0) {
    ZI_ASSIGN_OR_RETURN(ws, alloc(DType::kU8, {static_cast<int64_t>(ws_bytes)}));
  }
  QkvPrologue p;
  p.q = q.data(), p.k = k.data(), p.v = v.data();
  p.norm_q = norm_q.defined() ? norm_q.data() : nullptr;
  p.norm_k = norm_k.defined() ? norm_k.data() : nullptr;
  p.freqs = freqs.defined() ? freqs.data_as<float>() : nullptr;
  p.seq_if_shared = shared ? s : 0;
  p.hq = static_cast<int>(hq), p.hkv = static_cast<int>(hkv);
  p.eps = eps;
  const Status st =
      cutlass_bf16_qkv_norm_rope(x.data(), wqkv.data(), p, rows, kd, ws_bytes ? ws.data() : nullptr,
                                 ws_bytes, stream_, qkv_tuning_);
  if (st.code() == ErrorCode::kUnsupported) return unfused();
  return st.with_context("matmul_qkv_norm_rope");
}

Status CudaBackend::dit_modulation(const Tensor& mod, Tensor& scale_a, Tensor& gate_a,
                                   Tensor& scale_f, Tensor& gate_f) {
  if (!fused_) return Backend::dit_modulation(mod, scale_a, gate_a, scale_f, gate_f);
  ZI_OP_SCOPE("dit_modulation", &mod);
  constexpr const char* op = "dit_modulation";
  ZI_TRY(check_cuda_tensor(op, "mod", mod));
  ZI_TRY(check_dtype(op, "mod", mod, act_));
  ZI_TRY(check_rank(op, "mod", mod, 2));
  if (mod.dim(1) % 4 != 0) return InvalidArgument("dit_modulation: mod must be [B, 4D]");
  const int64_t b = mod.dim(0), d = mod.dim(1) / 4;
  for (Tensor* t : {&scale_a, &gate_a, &scale_f, &gate_f}) {
    ZI_TRY(check_cuda_tensor(op, "outputs", *t));
    ZI_TRY(check_dtype(op, "outputs", *t, act_));
    ZI_TRY(check_shape(op, "outputs", *t, {b, d}));
  }
  ZI_ASSIGN_OR_RETURN(KType kt, ktype_of(op, act_));
  ZI_LAUNCH_TRY(op, launch_dit_modulation(kt, mod.data(), scale_a.data(), gate_a.data(),
                                          scale_f.data(), gate_f.data(), b, d, stream_));
  return Status::Ok();
}

Status CudaBackend::matmul_dit_modulation(const Tensor& c, const Tensor& w, const Tensor& bias,
                                          Tensor& mod, Tensor& scale_a, Tensor& gate_a,
                                          Tensor& scale_f, Tensor& gate_f) {
  auto composed = [&] {
    return Backend::matmul_dit_modulation(c, w, bias, mod, scale_a, gate_a, scale_f, gate_f);
  };
  // Under dit_modulation_layers' one kernel (the default) a block that makes its own modulation
  // (streamed weights, a ControlNet's blocks) takes the per-block kernel, the same sums: the bits
  // do not depend on where the weights live.
  if (!fused_ || !(fused_adaln_ || adaln_layers_)) return composed();
  // The fused GEMV takes plain act-dtype operands of a small batch; anything else (quantised or
  // FP8 weights, other dtypes, wide batches, odd widths) runs the two ops.
  auto plain = [&](const Tensor& t) {
    return check_cuda_tensor("matmul_dit_modulation", "operand", t).ok() && t.dtype() == act_;
  };
  if (!plain(c) || !plain(w) || (bias.defined() && !plain(bias)) || c.rank() != 2 ||
      w.rank() != 2 || w.dim(1) != c.dim(1) || w.dim(0) % 4 != 0 ||
      (bias.defined() && bias.shape() != Shape{w.dim(0)}))
    return composed();
  const int64_t b = c.dim(0), k = c.dim(1), d = w.dim(0) / 4;
  for (const Tensor* t : {&scale_a, &gate_a, &scale_f, &gate_f})
    if (!plain(*t) || t->shape() != Shape{b, d}) return composed();
  if (!adaln_modulation_fits(b, k, c.data(), w.data(), bias.defined() ? bias.data() : nullptr,
                             dtype_size(act_)))
    return composed();
  ZI_OP_SCOPE("matmul_dit_modulation", &c, &w);
  constexpr const char* op = "matmul_dit_modulation";
  ZI_ASSIGN_OR_RETURN(KType kt, ktype_of(op, act_));
  ZI_LAUNCH_TRY(
      op, launch_adaln_modulation(kt, c.data(), w.data(), bias.defined() ? bias.data() : nullptr,
                                  scale_a.data(), gate_a.data(), scale_f.data(), gate_f.data(), b,
                                  d, k, stream_));
  return Status::Ok();
}

Status CudaBackend::dit_modulation_layers(const Tensor& c, const std::vector<Tensor>& w,
                                          const std::vector<Tensor>& bias, Tensor& out) {
  constexpr const char* op = "dit_modulation_layers";
  ZI_TRY(check_dit_modulation_layers(op, c, w, bias, out));
  auto composed = [&] { return Backend::dit_modulation_layers(c, w, bias, out); };
  if (!fused_ || !adaln_layers_) return composed();
  // Plain act-dtype operands of a small batch, aligned for 16-byte loads; anything else
  // (quantised or FP8 weights, other dtypes, wide batches) runs block by block.
  auto plain = [&](const Tensor& t) {
    return check_cuda_tensor(op, "operand", t).ok() && t.dtype() == act_;
  };
  const int64_t b = c.dim(0), k = c.dim(1), d = w[0].dim(0) / 4;
  if (!plain(c) || !plain(out)) return composed();
  for (size_t l = 0; l < w.size(); ++l)
    if (!plain(w[l]) || (bias[l].defined() && !plain(bias[l])) ||
        !adaln_modulation_fits(b, k, c.data(), w[l].data(),
                               bias[l].defined() ? bias[l].data() : nullptr, dtype_size(act_)))
      return composed();
  ZI_OP_SCOPE(op, &c, &w[0]);
  ZI_ASSIGN_OR_RETURN(KType kt, ktype_of(op, act_));
  const int64_t layers = static_cast<int64_t>(w.size());
  for (int64_t l0 = 0; l0 < layers; l0 += kAdaLayers) {
    const int n = static_cast<int>(std::min<int64_t>(kAdaLayers, layers - l0));
    AdaLayerWeights p{};
    for (int i = 0; i < n; ++i) {
      p.w[i] = w[l0 + i].data();
      p.bias[i] = bias[l0 + i].defined() ? bias[l0 + i].data() : nullptr;
    }
    ZI_LAUNCH_TRY(op, launch_adaln_modulation_layers(
                          kt, p, n, c.data(), out.slice0(l0, l0 + n).data(), b, d, k, stream_));
  }
  return Status::Ok();
}

Status CudaBackend::silu(const Tensor& x, Tensor& y) {
  ZI_OP_SCOPE("silu", &x);
  ZI_TRY(contract::unary(cuda_env(act_), "silu", x, y));
  ZI_ASSIGN_OR_RETURN(KType kt, ktype_of("silu", x.dtype()));
  ZI_LAUNCH_TRY("silu", launch_unary(UnaryOp::kSilu, kt, x.data(), y.data(), x.numel(), stream_));
  return Status::Ok();
}

Status CudaBackend::tanh(const Tensor& x, Tensor& y) {
  ZI_OP_SCOPE("tanh", &x);
  ZI_TRY(contract::unary(cuda_env(act_), "tanh", x, y));
  ZI_ASSIGN_OR_RETURN(KType kt, ktype_of("tanh", x.dtype()));
  ZI_LAUNCH_TRY("tanh", launch_unary(UnaryOp::kTanh, kt, x.data(), y.data(), x.numel(), stream_));
  return Status::Ok();
}

Status CudaBackend::clamp(const Tensor& x, float lo, float hi, Tensor& y) {
  ZI_OP_SCOPE("clamp", &x);
  ZI_TRY(contract::clamp(cuda_env(act_), x, lo, hi, y));
  ZI_ASSIGN_OR_RETURN(KType kt, ktype_of("clamp", x.dtype()));
  ZI_LAUNCH_TRY("clamp", launch_clamp(kt, x.data(), y.data(), x.numel(), lo, hi, stream_));
  return Status::Ok();
}

Status CudaBackend::swiglu(const Tensor& x, Tensor& y) {
  ZI_OP_SCOPE("swiglu", &x);
  constexpr const char* op = "swiglu";
  ZI_TRY(contract::swiglu(cuda_env(act_), x, y));
  const int64_t f = y.dim(-1), m = f == 0 ? 0 : y.numel() / f;
  // Row m of y overlaps rows of x that other threads still read, except for a single row
  // written over its own gate half.
  if (contract::overlaps(x, y) && m != 1)
    return InvalidArgument("swiglu: y must not alias x (except one row in place)");
  ZI_ASSIGN_OR_RETURN(KType kt, ktype_of(op, x.dtype()));
  ZI_LAUNCH_TRY(op, launch_swiglu(kt, x.data(), y.data(), m, f, stream_));
  return Status::Ok();
}

Status CudaBackend::swiglu_fp8(const Tensor& x, Tensor& y, Tensor& y8, Tensor& y_scale) {
  ZI_OP_SCOPE("swiglu_fp8", &x);
  constexpr const char* op = "swiglu_fp8";
  ZI_TRY(check_fp8_capable());
  ZI_TRY(contract::swiglu(cuda_env(act_), x, y));
  const int64_t f = y.dim(-1), m = f == 0 ? 0 : y.numel() / f;
  ZI_TRY(contract::fp8_rows_out(cuda_env(act_), op, m, f, y8, y_scale));
  if (overlaps(x, y8) || overlaps(x, y_scale))
    return InvalidArgument("swiglu_fp8: y8 and y_scale must not alias x");
  // One kernel (the rows the fused form takes), or the SwiGLU, then the row quantisation
  // (ZIMAGE_FUSED_SWIGLU_FP8=0): the same bytes either way.
  if (!fused_swiglu_fp8_) return Backend::swiglu_fp8(x, y, y8, y_scale);
  ZI_ASSIGN_OR_RETURN(KType kt, ktype_of(op, x.dtype()));
  const cudaError_t e =
      launch_swiglu_fp8(kt, x.data(), y8.data(), y_scale.data_as<float>(), m, f, stream_);
  if (e == cudaErrorNotSupported) {  // rows the fused form does not take
    cudaGetLastError();
    return Backend::swiglu_fp8(x, y, y8, y_scale);
  }
  ZI_LAUNCH_TRY(op, e);
  return Status::Ok();
}

int64_t CudaBackend::swiglu_block(int64_t f, int64_t k) const {
  const int64_t block = gemm_swiglu_block(swiglu_tuning_.schedule);
  const bool fits =
      f > 0 && f % block == 0 && k > 0 && k % 8 == 0 && 2 * f <= INT32_MAX && k <= INT32_MAX;
  return fused_swiglu_ && use_cutlass_ && act_ == DType::kBF16 && sm_ == 90 &&
                 fused_gemms_available() && fits
             ? block
             : 0;
}

Status CudaBackend::matmul_swiglu(const Tensor& x, const Tensor& w13, int64_t block, Tensor& y) {
  constexpr const char* op = "matmul_swiglu";
  ZI_TRY(contract::matmul_swiglu(cuda_env(act_), x, w13, block, y));
  const int64_t k = x.dim(-1), f = w13.dim(0) / 2, m = x.numel() / std::max<int64_t>(k, 1);
  if (block <= 0 || swiglu_block(f, k) != block || x.dtype() != DType::kBF16 || m > INT32_MAX)
    return Backend::matmul_swiglu(x, w13, block, y);
  if (m == 0) return Status::Ok();
  ZI_OP_SCOPE("matmul_swiglu", &x, &w13);
  const size_t ws_bytes = cutlass_bf16_swiglu_workspace(m, f, k);
  Tensor ws;
  if (ws_bytes > 0) {
    ZI_ASSIGN_OR_RETURN(ws, alloc(DType::kU8, {static_cast<int64_t>(ws_bytes)}));
  }
  const Status st =
      cutlass_bf16_swiglu(x.data(), w13.data(), y.data(), m, f, k, ws_bytes ? ws.data() : nullptr,
                          ws_bytes, stream_, swiglu_tuning_);
  if (st.code() == ErrorCode::kUnsupported) return Backend::matmul_swiglu(x, w13, block, y);
  return st.with_context(op);
}

int64_t CudaBackend::fp8_swiglu_block(int64_t f, int64_t k) const {
  const bool fits = f > 0 && f % kFp8SwigluBlock == 0 && k > 0 && k % 16 == 0 &&
                    2 * f <= INT32_MAX && k <= INT32_MAX;
  return fused_swiglu_gemm_fp8_ && use_cutlass_ && fp8_fast_accum_ && act_ == DType::kBF16 &&
                 sm_ == 90 && fused_gemms_available() && fits
             ? kFp8SwigluBlock
             : 0;
}

Status CudaBackend::matmul_fp8_swiglu(const Tensor& x8, const Tensor& x_scale, const Tensor& w13_8,
                                      const Tensor& w13_scale, int64_t block, Tensor& y, Tensor& y8,
                                      Tensor& y_scale) {
  constexpr const char* op = "matmul_fp8_swiglu";
  ZI_TRY(check_fp8_capable());
  ZI_TRY(contract::matmul_fp8_swiglu(cuda_env(act_), x8, x_scale, w13_8, w13_scale, block, y, y8,
                                     y_scale));
  const int64_t k = w13_8.dim(1), f = w13_8.dim(0) / 2, m = x8.numel() / std::max<int64_t>(k, 1);
  auto composed = [&] {
    return Backend::matmul_fp8_swiglu(x8, x_scale, w13_8, w13_scale, block, y, y8, y_scale);
  };
  if (block <= 0 || fp8_swiglu_block(f, k) != block || m > INT32_MAX) return composed();
  if (m == 0) return Status::Ok();
  ZI_OP_SCOPE("matmul_fp8_swiglu", &x8, &w13_8);
  const size_t ws_bytes = cutlass_fp8_swiglu_rows_workspace(m, f, k);
  Tensor ws, amax;
  if (ws_bytes > 0) {
    ZI_ASSIGN_OR_RETURN(ws, alloc(DType::kU8, {static_cast<int64_t>(ws_bytes)}));
  }
  if (y8.defined()) {  // each row's max |y| as float bits, folded in by the epilogue's atomics
    ZI_ASSIGN_OR_RETURN(amax, alloc(DType::kI32, {m}));
    ZI_LAUNCH_TRY(op, cudaMemsetAsync(amax.data(), 0, sizeof(int32_t) * m, stream_));
  }
  auto* amax_bits = y8.defined() ? static_cast<unsigned int*>(amax.data()) : nullptr;
  const Status st = cutlass_fp8_swiglu_rows(x8.data(), w13_8.data(), x_scale.data_as<float>(),
                                            w13_scale.data_as<float>(), y.data(), amax_bits, m, f,
                                            k, ws_bytes ? ws.data() : nullptr, ws_bytes, stream_);
  if (st.code() == ErrorCode::kUnsupported) return composed();
  ZI_TRY(st.with_context(op));
  if (!y8.defined()) return Status::Ok();
  ZI_ASSIGN_OR_RETURN(KType kt, ktype_of(op, act_));
  ZI_LAUNCH_TRY(op, launch_quantize_rows_amax(kt, y.data(), amax_bits, m, f, y8.data(),
                                              y_scale.data_as<float>(), stream_));
  return Status::Ok();
}

Status CudaBackend::axpby(float a, const Tensor& x, float b, const Tensor& y, Tensor& out) {
  ZI_OP_SCOPE("axpby", &x);
  constexpr const char* op = "axpby";
  ZI_TRY(contract::axpby(cuda_env(act_), x, y, out));
  ZI_ASSIGN_OR_RETURN(KType kt, ktype_of(op, x.dtype()));
  ZI_LAUNCH_TRY(op, launch_axpby(kt, a, x.data(), b, y.data(), out.data(), x.numel(), stream_));
  return Status::Ok();
}

Status CudaBackend::add(const Tensor& x, const Tensor& y, Tensor& out) {
  ZI_OP_SCOPE("add", &x, &y);
  constexpr const char* op = "add";
  ZI_TRY(contract::add(cuda_env(act_), x, y, out));
  ZI_ASSIGN_OR_RETURN(KType kt, ktype_of(op, x.dtype()));
  if (x.numel() == 0) return Status::Ok();
  ZI_LAUNCH_TRY(op, launch_add(kt, x.data(), y.data(), out.data(), x.numel(), y.numel(), stream_));
  return Status::Ok();
}

Result<std::vector<double>> CudaBackend::sum_squares(const Tensor& x) {
  constexpr const char* op = "sum_squares";
  ZI_TRY(contract::sum_squares(cuda_env(act_), x));
  ZI_ASSIGN_OR_RETURN(KType kt, ktype_of(op, x.dtype()));
  const int64_t rows = x.dim(0), cols = rows == 0 ? 0 : x.numel() / rows;
  std::vector<double> out(static_cast<size_t>(rows), 0.0);
  if (rows == 0) return out;
  ZI_ASSIGN_OR_RETURN(Tensor acc, alloc(DType::kF64, {rows}));
  ZI_LAUNCH_TRY(op, launch_sum_squares(kt, x.data(), rows, cols, acc.data_as<double>(), stream_));
  ZI_CUDA_TRY(cudaMemcpyAsync(out.data(), acc.data(), sizeof(double) * rows, cudaMemcpyDeviceToHost,
                              stream_));
  ZI_CUDA_TRY(cudaStreamSynchronize(stream_));
  return out;
}

Status CudaBackend::guided_euler_step(const Tensor& pos, const Tensor& neg, float g, float dt,
                                      Tensor& latents) {
  ZI_OP_SCOPE("guided_euler_step", &pos);
  constexpr const char* op = "guided_euler_step";
  ZI_TRY(contract::guided_euler_step(cuda_env(act_), pos, neg, latents));
  const float* negp = neg.defined() ? neg.data_as<float>() : nullptr;
  ZI_LAUNCH_TRY(op, launch_guided_euler(pos.data_as<float>(), negp, g, dt, latents.data_as<float>(),
                                        latents.numel(), stream_));
  return Status::Ok();
}

Status CudaBackend::latent_to_rgb(const Tensor& latents, const LatentRgbMap& map, Tensor& rgb) {
  ZI_OP_SCOPE("latent_to_rgb", &latents);
  constexpr const char* op = "latent_to_rgb";
  ZI_TRY(contract::latent_to_rgb(cuda_env(act_), latents, map.channels, rgb));
  LatentRgbParams p;
  p.channels = map.channels;
  for (int c = 0; c < map.channels; ++c)
    for (int k = 0; k < 3; ++k) p.w[c * 3 + k] = map.weight[c][k];
  for (int k = 0; k < 3; ++k) p.bias[k] = map.bias[k];
  ZI_LAUNCH_TRY(op, launch_latent_to_rgb(latents.data_as<float>(), latents.dim(0),
                                         latents.dim(2) * latents.dim(3), p,
                                         static_cast<uint8_t*>(rgb.data()), stream_));
  return Status::Ok();
}

Result<int64_t> CudaBackend::count_nonfinite(const Tensor& x) {
  constexpr const char* op = "count_nonfinite";
  ZI_TRY(contract::count_nonfinite(cuda_env(act_), x));
  ZI_ASSIGN_OR_RETURN(KType kt, ktype_of(op, x.dtype()));
  ZI_ASSIGN_OR_RETURN(Tensor acc, alloc(DType::kI64, {1}));
  ZI_LAUNCH_TRY(op, launch_count_nonfinite(kt, x.data(), x.numel(),
                                           static_cast<unsigned long long*>(acc.data()), stream_));
  unsigned long long bad = 0;
  ZI_CUDA_TRY(cudaMemcpyAsync(&bad, acc.data(), sizeof(bad), cudaMemcpyDeviceToHost, stream_));
  ZI_CUDA_TRY(cudaStreamSynchronize(stream_));
  return static_cast<int64_t>(bad);
}

Status CudaBackend::image_to_rgb8(const Tensor& x, Tensor& rgb) {
  ZI_OP_SCOPE("image_to_rgb8", &x);
  constexpr const char* op = "image_to_rgb8";
  ZI_TRY(contract::image_to_rgb8(cuda_env(act_), x, rgb));
  ZI_ASSIGN_OR_RETURN(KType kt, ktype_of(op, x.dtype()));
  ZI_LAUNCH_TRY(op, launch_image_to_rgb8(kt, x.data(), x.numel(), static_cast<uint8_t*>(rgb.data()),
                                         stream_));
  return Status::Ok();
}

Status CudaBackend::upsample_nearest2x(const Tensor& x, Tensor& y) {
  ZI_OP_SCOPE("upsample_nearest2x", &x);
  constexpr const char* op = "upsample_nearest2x";
  ZI_TRY(contract::upsample_nearest2x(cuda_env(act_), x, y));
  ZI_ASSIGN_OR_RETURN(KType kt, ktype_of(op, x.dtype()));
  ZI_LAUNCH_TRY(op, launch_upsample_nearest2x(kt, x.data(), y.data(), x.dim(0), x.dim(1), x.dim(2),
                                              x.dim(3), stream_));
  return Status::Ok();
}

Status CudaBackend::embedding(const Tensor& table, const Tensor& ids, Tensor& out) {
  ZI_OP_SCOPE("embedding", &out);
  constexpr const char* op = "embedding";
  ZI_TRY(contract::embedding(cuda_env(act_), table, ids, out));
  const int64_t n = ids.numel(), d = table.dim(1);
  const int32_t* id = ids.data_as<int32_t>();
  ZI_ASSIGN_OR_RETURN(KType kt, ktype_of(op, table.dtype()));
  if (n == 0) return Status::Ok();
  ZI_ASSIGN_OR_RETURN(Tensor dev_ids, alloc(DType::kI32, {n}));
  ZI_CUDA_TRY(
      cudaMemcpyAsync(dev_ids.data(), id, sizeof(int32_t) * n, cudaMemcpyHostToDevice, stream_));
  ZI_LAUNCH_TRY(op, launch_embedding(kt, table.data(), dev_ids.data_as<int32_t>(), out.data(), n, d,
                                     stream_));
  return Status::Ok();
}

Status CudaBackend::patchify(const Tensor& latents, int p, Tensor& tokens) {
  ZI_OP_SCOPE("patchify", &latents);
  constexpr const char* op = "patchify";
  ZI_TRY(contract::patchify(cuda_env(act_), latents, p, tokens));
  const int64_t b = latents.dim(0), c = latents.dim(1), h = latents.dim(2), w = latents.dim(3);
  ZI_ASSIGN_OR_RETURN(KType kt, ktype_of(op, tokens.dtype()));
  ZI_LAUNCH_TRY(
      op, launch_patchify(kt, latents.data_as<float>(), tokens.data(), b, c, h, w, p, stream_));
  return Status::Ok();
}

Status CudaBackend::unpatchify(const Tensor& tokens, int p, float alpha, Tensor& out) {
  ZI_OP_SCOPE("unpatchify", &tokens);
  constexpr const char* op = "unpatchify";
  ZI_TRY(contract::unpatchify(cuda_env(act_), tokens, p, out));
  const int64_t b = out.dim(0), c = out.dim(1), h = out.dim(2), w = out.dim(3);
  ZI_ASSIGN_OR_RETURN(KType kt, ktype_of(op, tokens.dtype()));
  ZI_LAUNCH_TRY(op, launch_unpatchify(kt, tokens.data(), tokens.dim(1), out.data_as<float>(), b, c,
                                      h, w, p, alpha, stream_));
  return Status::Ok();
}

}  // namespace zimage::cuda
