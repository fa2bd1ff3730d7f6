// CPU matmul: y = x · wᵀ through cblas_sgemm (row-major, w stored [N, K] so it is the "T"
// operand), bias added afterwards in a row-parallel pass, as PyTorch's fp32 linear does
// numerically (the BLAS result, then + b).
#include "backend/cpu/cpu_gemm.h"

#include <cblas.h>

#include <algorithm>
#include <climits>
#include <mutex>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_check.h"
#include "core/log.h"

namespace zimage::cpu {

namespace {
constexpr int64_t kMaxBlasM = INT_MAX / 2;  // M is split into pieces below this
}

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
  const char* op = "matmul";
  ZI_TRY(check_f32(op, "x", x));
  ZI_TRY(check_f32(op, "w", w));
  ZI_TRY(check_f32(op, "y", y));
  if (x.rank() < 1) return InvalidArgument("matmul: x " + desc(x) + " must have rank >= 1");
  ZI_TRY(check_rank(op, "w", w, 2));
  const int64_t k = x.dim(-1);
  const int64_t n = w.dim(0);
  if (w.dim(1) != k) {
    return InvalidArgument("matmul: x " + desc(x) + " and w " + desc(w) + ": K differs (" +
                           std::to_string(k) + " vs " + std::to_string(w.dim(1)) + ")");
  }
  Shape want = x.shape();
  want.back() = n;
  if (y.shape() != want) {
    return InvalidArgument("matmul: y " + desc(y) + " must be " + shape_string(want) + " for x " +
                           desc(x) + " and w " + desc(w));
  }
  if (bias.defined()) {
    ZI_TRY(check_f32(op, "bias", bias));
    if (bias.numel() != n || bias.rank() != 1) {
      return InvalidArgument("matmul: bias " + desc(bias) + " must be [" + std::to_string(n) +
                             "] for w " + desc(w));
    }
    ZI_TRY(check_alias(op, "bias", bias, "y", y, false));
  }
  ZI_TRY(check_alias(op, "x", x, "y", y, false));
  ZI_TRY(check_alias(op, "w", w, "y", y, false));
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

}  // namespace zimage::cpu
