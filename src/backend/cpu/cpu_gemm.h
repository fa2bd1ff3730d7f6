// Thin wrappers over OpenBLAS used by the CPU ops (matmul, attention, conv2d) and by the GEMM
// benchmark, which needs the raw BLAS call without the engine's include path to cblas.h.
// No validation here: callers check shapes, and every dimension / leading dimension must fit in
// a 32-bit int except M, which is split into int-sized pieces.
#pragma once

#include <cstdint>
#include <string>

namespace zimage::cpu {

// c[M, N] = alpha * a[M, K] · b[N, K]ᵀ + beta * c   (row-major, leading dims in elements)
void sgemm_nt(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
              const float* b, int64_t ldb, float beta, float* c, int64_t ldc);
// c[M, N] = alpha * a[M, K] · b[K, N] + beta * c
void sgemm_nn(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
              const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// OpenBLAS's (process-global) thread count, and its build description. Several CPU backends
// may live in one process (a pipeline keeps a 1-thread one for host-side work), so each op that
// calls the BLAS first re-applies its own count; set_blas_threads is a no-op when unchanged.
void set_blas_threads(int threads);
int blas_threads();
std::string blas_config();
// The kernel family OpenBLAS picked at load time ("Haswell", "SkylakeX", "Prescott", ...).
std::string blas_core_name();
// Warns once per process when OpenBLAS fell back to its generic SSE3 ("Prescott") kernels on a
// CPU that has AVX2 (an unrecognised CPU model, common in VMs): GEMMs then run 2-5x slower.
// OPENBLAS_CORETYPE=Haswell or SkylakeX in the environment selects the fast kernels.
void warn_if_slow_blas_kernels();

}  // namespace zimage::cpu
