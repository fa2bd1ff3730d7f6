// CPU matmul: y = x · wᵀ through cblas_sgemm (row-major, w stored [N, K] so it is the "T"
// operand), bias added afterwards in a row-parallel pass, as PyTorch's fp32 linear does
// numerically (the BLAS result, then + b).
#include "backend/cpu/cpu_gemm.h"

#include <cblas.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cmath>
#include <mutex>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_check.h"
#include "core/log.h"
#include "io/gguf/gguf_quants.h"

namespace zimage::cpu {

namespace {

// v clamped to e4m3's ±448 as the GPU kernels clamp (fminf(fmaxf(v, -448), 448)): a NaN becomes
// -448 on both backends, so both write the same code for it.
float clamp_e4m3(float v) {
  return std::fmin(std::fmax(v, -448.f), 448.f);
}

constexpr int64_t kMaxBlasM = INT_MAX / 2;  // M is split into pieces below this
}  // namespace

void sgemm_nt(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
              const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  for (int64_t m0 = 0; m0 < m; m0 += kMaxBlasM) {
    const int64_t mm = std::min(kMaxBlasM, m - m0);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(mm), static_cast<int>(n),
                static_cast<int>(k), alpha, a + m0 * lda, static_cast<int>(lda), b,
                static_cast<int>(ldb), beta, c + m0 * ldc, static_cast<int>(ldc));
  }
}

void sgemm_nn(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
              const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  for (int64_t m0 = 0; m0 < m; m0 += kMaxBlasM) {
    const int64_t mm = std::min(kMaxBlasM, m - m0);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(mm),
                static_cast<int>(n), static_cast<int>(k), alpha, a + m0 * lda,
                static_cast<int>(lda), b, static_cast<int>(ldb), beta, c + m0 * ldc,
                static_cast<int>(ldc));
  }
}

void set_blas_threads(int threads) {
  threads = std::max(1, threads);
  if (openblas_get_num_threads() != threads) openblas_set_num_threads(threads);
}
int blas_threads() {
  return openblas_get_num_threads();
}
std::string blas_config() {
  const char* c = openblas_get_config();
  return c ? std::string(c) : std::string("OpenBLAS");
}

std::string blas_core_name() {
  const char* c = openblas_get_corename();
  return c ? std::string(c) : std::string("unknown");
}

void warn_if_slow_blas_kernels() {
  static std::once_flag once;
  std::call_once(once, [] {
    const std::string core = blas_core_name();
    const bool generic = core == "Prescott" || core == "Core2" || core == "Nehalem" ||
                         core == "Sandybridge" || core == "Penryn" || core == "Dunnington";
    if (generic && __builtin_cpu_supports("avx2")) {
      ZI_WARN(
          "OpenBLAS selected its '%s' kernels on a CPU with AVX2 (unrecognised CPU model); "
          "CPU GEMMs will be several times slower than they could be. Set "
          "OPENBLAS_CORETYPE=Haswell (or SkylakeX with AVX-512) in the environment.",
          core.c_str());
    }
  });
}

Status CpuBackend::matmul(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& y) {
  ZI_TRY(contract::matmul(cpu_env(), x, w, bias, y));
  const int64_t k = x.dim(-1);
  const int64_t n = w.dim(0);
  if (n >= INT_MAX || k >= INT_MAX) {
    return Unsupported("matmul: w " + desc(w) + ": N and K must be below 2^31 for the BLAS");
  }
  const int64_t m = k > 0 ? x.numel() / k : y.numel() / std::max<int64_t>(n, 1);
  if (m == 0 || n == 0) return Status::Ok();
  set_blas_threads(threads_);

  float* yp = y.data_as<float>();
  if (k == 0) {
    std::fill(yp, yp + m * n, 0.0f);
  } else {
    sgemm_nt(m, n, k, 1.0f, x.data_as<const float>(), k, w.data_as<const float>(), k, 0.0f, yp, n);
  }
  if (bias.defined()) {
    const float* bp = bias.data_as<const float>();
    pool_.parallel_for(m, std::max<int64_t>(1, 65536 / n), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        float* row = yp + r * n;
        for (int64_t j = 0; j < n; ++j) row[j] += bp[j];
      }
    });
  }
  return Status::Ok();
}

// FP8 oracle: the same quantisation as the CUDA kernels (fp8.cu), then an f32 GEMM of the
// dequantised operands. The scale is computed as in f32 there: amax / 448.
Status CpuBackend::quantize_fp8(const Tensor& x, Tensor& x8, Tensor& scale) {
  ZI_TRY(contract::quantize_fp8(cpu_env(), x, x8, scale));
  const float* xp = x.data_as<float>();
  const int64_t n = x.numel();
  float amax = 0.f;
  for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(xp[i]));
  const float s = amax > 0.f && amax < 3.0e38f ? amax / 448.f : 1.f;
  const float inv = 1.f / s;
  auto* q = static_cast<uint8_t*>(x8.data());
  for (int64_t i = 0; i < n; ++i) q[i] = f32_to_f8e4m3(clamp_e4m3(xp[i] * inv));
  scale.data_as<float>()[0] = s;
  return Status::Ok();
}

Status CpuBackend::matmul_fp8(const Tensor& x, const Tensor& w8, const Tensor& w_scale, Tensor& y) {
  ZI_TRY(contract::matmul_fp8(cpu_env(), x, w8, w_scale, y));
  Tensor x8 = Tensor::host(DType::kF8E4M3, x.shape());
  Tensor sx = Tensor::host(DType::kF32, {1});
  Tensor xd = Tensor::host(DType::kF32, x.shape());
  Tensor wd = Tensor::host(DType::kF32, w8.shape());
  if (!x8.defined() || !sx.defined() || !xd.defined() || !wd.defined())
    return OutOfMemory("matmul_fp8: host buffers");
  ZI_TRY(quantize_fp8(x, x8, sx));
  const float s_x = sx.data_as<float>()[0], s_w = w_scale.data_as<float>()[0];
  const auto* qx = static_cast<const uint8_t*>(x8.data());
  const auto* qw = static_cast<const uint8_t*>(w8.data());
  float* xf = xd.data_as<float>();
  float* wf = wd.data_as<float>();
  for (int64_t i = 0, n = xd.numel(); i < n; ++i) xf[i] = f8e4m3_to_f32(qx[i]) * s_x;
  for (int64_t i = 0, n = wd.numel(); i < n; ++i) wf[i] = f8e4m3_to_f32(qw[i]) * s_w;
  return matmul(xd, wd, Tensor(), y);
}

// The oracle of the W8A8 GEMM: the activations quantised per row by the weights' own row
// quantiser, both operands widened to f32 (exact: an e4m3 value times a float scale is one f32
// rounding), then the ordinary f32 GEMM. The GPU applies the scales after its exact FP8 products
// instead, so the two differ by f32 rounding only.
Status CpuBackend::matmul_fp8_rows(const Tensor& x, const Tensor& w8, const Tensor& w_scale,
                                   const Tensor& bias, Tensor& y) {
  ZI_TRY(contract::matmul_fp8_rows(cpu_env(), x, w8, w_scale, bias, y));
  const int64_t k = w8.dim(1);
  const int64_t m = x.numel() / std::max<int64_t>(k, 1);
  Tensor x8 = Tensor::host(DType::kF8E4M3, {m, k});
  Tensor sx = Tensor::host(DType::kF32, {m});
  if (!x8.defined() || !sx.defined()) return OutOfMemory("matmul_fp8_rows: host buffers");
  ZI_TRY(quantize_fp8_rows(x.view({m, k}), x8, sx));
  return matmul_fp8_quantized(x8, sx, w8, w_scale, bias, y);
}

Status CpuBackend::matmul_fp8_quantized(const Tensor& x8, const Tensor& x_scale, const Tensor& w8,
                                        const Tensor& w_scale, const Tensor& bias, Tensor& y) {
  ZI_TRY(contract::matmul_fp8_quantized(cpu_env(), x8, x_scale, w8, w_scale, bias, y));
  const int64_t n = w8.dim(0), k = w8.dim(1);
  const int64_t m = x8.numel() / std::max<int64_t>(k, 1);
  Tensor xd = Tensor::host(DType::kF32, {m, k});
  Tensor wd = Tensor::host(DType::kF32, {n, k});
  if (!xd.defined() || !wd.defined()) return OutOfMemory("matmul_fp8_quantized: host buffers");
  ZI_TRY(dequantize_fp8_rows(x8.view({m, k}), x_scale.view({m}), xd));
  ZI_TRY(dequantize_fp8_rows(w8, w_scale, wd));
  return matmul(xd, wd, bias, y);
}

// Per-output-channel FP8 weights: the same arithmetic as fp8.cu's row kernels (amax over the
// row, s = amax / 448, q = e4m3(clamp(w * (1 / s), ±448))), so both backends hold the same bytes.
Status CpuBackend::quantize_fp8_rows(const Tensor& w, Tensor& w8, Tensor& scale) {
  if (!w.defined() || w.rank() != 2 || !dtype_is_float(w.dtype()) || w.device() != Device::kCPU)
    return InvalidArgument("quantize_fp8_rows: w must be a float [N, K] host tensor, got " +
                           w.describe());
  const int64_t n = w.dim(0), k = w.dim(1);
  if (!w8.defined() || w8.dtype() != DType::kF8E4M3 || w8.shape() != w.shape())
    return InvalidArgument("quantize_fp8_rows: w8 must be f8e4m3 " + shape_string(w.shape()));
  if (!scale.defined() || scale.dtype() != DType::kF32 || scale.shape() != Shape{n})
    return InvalidArgument("quantize_fp8_rows: scale must be f32 [" + std::to_string(n) + "]");
  const size_t esz = dtype_size(w.dtype());
  const auto* base = static_cast<const uint8_t*>(w.data());
  auto* q = static_cast<uint8_t*>(w8.data());
  float* sp = scale.data_as<float>();
  std::atomic<bool> ok{true};
  pool_.parallel_for(n, 1, [&](int64_t r0, int64_t r1) {
    std::vector<float> row(static_cast<size_t>(k));
    for (int64_t r = r0; r < r1; ++r) {
      if (!convert_to_f32(w.dtype(), base + static_cast<size_t>(r * k) * esz, row.data(),
                          static_cast<size_t>(k))) {
        ok = false;
        return;
      }
      float amax = 0.f;
      for (float v : row) amax = std::max(amax, std::fabs(v));
      const float s = amax > 0.f && amax < 3.0e38f ? amax / 448.f : 1.f;
      const float inv = 1.f / s;
      for (int64_t i = 0; i < k; ++i) q[r * k + i] = f32_to_f8e4m3(clamp_e4m3(row[i] * inv));
      sp[r] = s;
    }
  });
  if (!ok) return InvalidArgument("quantize_fp8_rows: cannot read " + w.describe());
  return Status::Ok();
}

Status CpuBackend::dequantize_fp8_rows(const Tensor& w8, const Tensor& scale, Tensor& y) {
  ZI_TRY(contract::dequantize_fp8_rows(cpu_env(), w8, scale, y));
  const int64_t n = w8.dim(0), k = w8.dim(1);
  const auto* q = static_cast<const uint8_t*>(w8.data());
  const float* sp = scale.data_as<float>();
  float* yp = y.data_as<float>();
  const bool e5m2 = w8.dtype() == DType::kF8E5M2;
  pool_.parallel_for(n, 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t i = 0; i < k; ++i)
        yp[r * k + i] = (e5m2 ? f8e5m2_to_f32(q[r * k + i]) : f8e4m3_to_f32(q[r * k + i])) * sp[r];
  });
  return Status::Ok();
}

Status CpuBackend::dequantize_packed(uint32_t ggml_type, const Tensor& blocks, Tensor& y) {
  constexpr const char* op = "dequantize_packed";
  const GgmlType type = static_cast<GgmlType>(ggml_type);
  const GgmlTypeInfo* info = ggml_type_info(type);
  if (!info || !info->dequantizable)
    return Unsupported(std::string(op) + ": type " + ggml_type_name(ggml_type) +
                       " cannot be dequantised");
  if (!blocks.defined() || blocks.dtype() != DType::kU8 || blocks.rank() != 2 ||
      blocks.device() != Device::kCPU)
    return InvalidArgument(std::string(op) + ": blocks must be a u8 [N, row bytes] host tensor");
  ZI_TRY(check_f32(op, "y", y));
  const int64_t n = blocks.dim(0);
  if (y.rank() != 2 || y.dim(0) != n)
    return InvalidArgument(std::string(op) + ": y " + y.describe() + " must be [" +
                           std::to_string(n) + ", K]");
  const int64_t k = y.dim(1);
  uint64_t row_bytes = 0;
  if (!ggml_row_bytes(type, k, &row_bytes) || row_bytes != static_cast<uint64_t>(blocks.dim(1)))
    return InvalidArgument(std::string(op) + ": " + blocks.describe() + " does not hold " +
                           std::to_string(n) + " rows of " + std::to_string(k) + " " + info->name +
                           " elements");
  if (!dequantize_rows(type, blocks.data(), y.data_as<float>(), n, k, &pool_))
    return InvalidArgument(std::string(op) + ": cannot dequantise " + blocks.describe());
  return Status::Ok();
}

}  // namespace zimage::cpu
