// Helpers for the CUDA op tests: one CUDA backend per compute dtype and the CPU oracle, seeded
// random inputs (rounded to bf16 first when the GPU computes in bf16, so both backends see the
// same numbers), NaN-poisoned outputs, and a comparison that prints its errors (normwise
// |got - ref| / |ref| and the largest absolute error) so the log shows the measured accuracy.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "core/dtype.h"
#include "core/tensor.h"

namespace zimage::test {

// The CUDA backend for `dt`, created once and deliberately never destroyed (library handles
// torn down after the CUDA runtime's own exit handlers can crash); null when there is no device.
inline cuda::CudaBackend* gpu(DType dt) {
  static auto* backends = new std::map<DType, Backend*>();
  static auto* tried = new std::map<DType, bool>();
  if (!(*tried)[dt]) {
    (*tried)[dt] = true;
    auto r = make_cuda_backend(0, dt);
    if (r.ok()) {
      (*backends)[dt] = std::move(r).value().release();
    } else if (r.status().code() != ErrorCode::kUnsupported) {
      ADD_FAILURE() << "make_cuda_backend: " << r.status().to_string();
    }
  }
  auto it = backends->find(dt);
  return it == backends->end() ? nullptr : dynamic_cast<cuda::CudaBackend*>(it->second);
}

// Runs f with the backend's op profiler on and returns how many calls each op made, by the op's
// name (its profile key up to the first space: "matmul_fp8_rows", "dit_modulation_layers"; an
// op not run reads 0). A profile that cannot be read fails the test and gives an empty map.
inline std::map<std::string, int64_t> calls_by_op(cuda::CudaBackend& g,
                                                  const std::function<void()>& f) {
  g.set_profiling(true);
  f();
  auto prof = g.op_profile();
  g.set_profiling(false);
  EXPECT_TRUE(prof.ok()) << prof.status().to_string();
  std::map<std::string, int64_t> calls;
  if (prof.ok())
    for (const auto& e : *prof) calls[e.op.substr(0, e.op.find(' '))] += e.calls;
  return calls;
}

inline Backend& cpu_oracle() {
  static std::unique_ptr<Backend> be = make_cpu_backend(0);
  return *be;
}

#define ZI_REQUIRE_GPU()                                                                         \
  do {                                                                                           \
    if (::zimage::test::gpu(::zimage::DType::kF32) == nullptr) GTEST_SKIP() << "no CUDA device"; \
  } while (0)

#define ZI_ASSERT_OK(expr)                                         \
  do {                                                             \
    const ::zimage::Status zi_s_ = (expr);                         \
    ASSERT_TRUE(zi_s_.ok()) << #expr << ": " << zi_s_.to_string(); \
  } while (0)

// Unwraps a Result<T> inside a test (fails the test on error).
template <typename T>
T take(Result<T> r, const char* what) {
  EXPECT_TRUE(r.ok()) << what << ": " << r.status().to_string();
  if (!r.ok()) return T();
  return std::move(r).value();
}

// f32 host tensor, uniform in [lo, hi); rounded to bf16 values when `dt` is bf16.
inline Tensor rand_host(const Shape& shape, uint32_t seed, DType dt, float lo = -1.f,
                        float hi = 1.f) {
  Tensor t = Tensor::host(DType::kF32, shape);
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  float* p = t.data_as<float>();
  for (int64_t i = 0; i < t.numel(); ++i) {
    const float v = dist(gen);
    p[i] = dt == DType::kBF16 ? round_bf16(v) : v;
  }
  return t;
}

// A bf16 device tensor of rand_host's values (uniform in [lo, hi), rounded to bf16).
inline Tensor rand_dev(cuda::CudaBackend* g, const Shape& s, uint32_t seed, float lo = -1.f,
                       float hi = 1.f) {
  return take(g->upload(rand_host(s, seed, DType::kF32, lo, hi), DType::kBF16), "upload");
}

// A RoPE table of random angles, (cos, sin) pairs as the attention prologue reads them:
// [rows, s, dh / 2, 2] f32 on the host.
inline Tensor rope_table(int64_t rows, int64_t s, int64_t dh, uint32_t seed) {
  const Tensor a = rand_host({rows, s, dh / 2}, seed, DType::kF32, -3.2f, 3.2f);
  Tensor t = Tensor::host(DType::kF32, {rows, s, dh / 2, 2});
  for (int64_t i = 0; i < a.numel(); ++i) {
    t.data_as<float>()[2 * i] = std::cos(a.data_as<float>()[i]);
    t.data_as<float>()[2 * i + 1] = std::sin(a.data_as<float>()[i]);
  }
  return t;
}

// The same host data on both backends: f32 on the CPU, `dt` on the GPU.
struct Both {
  Tensor cpu, gpu;
};
inline Both both(const Tensor& host, DType dt) {
  return {take(cpu_oracle().upload(host, DType::kF32), "cpu upload"),
          take(gpu(dt)->upload(host, dt), "gpu upload")};
}
// Host data as f32 on the CPU and as `gpu_dt` on the `dt` backend (f32 tables, latents).
inline Both both_as(const Tensor& host, DType dt, DType gpu_dt) {
  return {take(cpu_oracle().upload(host, DType::kF32), "cpu upload"),
          take(gpu(dt)->upload(host, gpu_dt), "gpu upload")};
}
inline Both both_rand(const Shape& shape, uint32_t seed, DType dt, float lo = -1.f,
                      float hi = 1.f) {
  return both(rand_host(shape, seed, dt, lo, hi), dt);
}

// Output tensors: CPU f32 and GPU `dt`, the GPU one filled with NaN to catch unwritten elements.
inline Both outputs(const Shape& shape, DType dt, DType gpu_dt) {
  Both o{take(cpu_oracle().alloc(DType::kF32, shape), "cpu alloc"),
         take(gpu(dt)->alloc(gpu_dt, shape), "gpu alloc")};
  EXPECT_TRUE(gpu(dt)->fill(o.gpu, std::numeric_limits<float>::quiet_NaN()).ok());
  return o;
}
inline Both outputs(const Shape& shape, DType dt) {
  return outputs(shape, dt, dt);
}

inline std::vector<float> fetch(Backend& be, const Tensor& t) {
  Tensor h = Tensor::host(DType::kF32, t.shape());
  const Status s = be.download(t, h);
  EXPECT_TRUE(s.ok()) << "download: " << s.to_string();
  const float* p = h.data_as<float>();
  return std::vector<float>(p, p + h.numel());
}

// Bytes of a device tensor, for bit-for-bit comparisons.
inline std::vector<uint8_t> bytes_of(cuda::CudaBackend* g, const Tensor& t) {
  Tensor h = Tensor::host(t.dtype(), t.shape());
  EXPECT_TRUE(g->download(t, h).ok());
  const auto* p = static_cast<const uint8_t*>(h.data());
  return std::vector<uint8_t>(p, p + h.nbytes());
}

struct ErrStats {
  double rel_l2 = 0, max_abs = 0, max_ref = 0;
  int64_t nan = 0;
};

inline ErrStats errors(const std::vector<float>& got, const std::vector<float>& ref) {
  ErrStats e;
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size() && i < got.size(); ++i) {
    if (!std::isfinite(got[i])) {
      ++e.nan;
      continue;
    }
    const double d = static_cast<double>(got[i]) - ref[i];
    num += d * d;
    den += static_cast<double>(ref[i]) * ref[i];
    e.max_abs = std::max(e.max_abs, std::fabs(d));
    e.max_ref = std::max(e.max_ref, std::fabs(static_cast<double>(ref[i])));
  }
  e.rel_l2 = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  return e;
}

// Normwise tolerance per compute dtype (bf16: ~2-3 roundings of 2^-9 each).
inline double tol(DType dt) {
  return dt == DType::kF32 ? 1e-5 : 1e-2;
}

inline void expect_close(const std::string& what, DType dt, const std::vector<float>& got,
                         const std::vector<float>& ref, double tolerance = -1) {
  if (tolerance < 0) tolerance = tol(dt);
  ASSERT_EQ(got.size(), ref.size()) << what;
  const ErrStats e = errors(got, ref);
  std::printf("  %-56s %-4s rel_l2 %.2e  max_abs %.2e  (max |ref| %.2e)\n", what.c_str(),
              dtype_name(dt), e.rel_l2, e.max_abs, e.max_ref);
  EXPECT_EQ(e.nan, 0) << what << ": " << e.nan << " non-finite outputs (unwritten?)";
  EXPECT_LE(e.rel_l2, tolerance) << what;
  // No single element far off either (8x the normwise bound, relative to the largest value).
  EXPECT_LE(e.max_abs, 8 * tolerance * std::max(e.max_ref, 1e-30)) << what;
}

// Compares a GPU output against the CPU output of the same op.
inline void expect_match(const std::string& what, DType dt, const Both& out,
                         double tolerance = -1) {
  expect_close(what, dt, fetch(*gpu(dt), out.gpu), fetch(cpu_oracle(), out.cpu), tolerance);
}

inline std::string shape_str(const Shape& s) {
  return shape_string(s);
}

// Concatenates anything streamable (avoids a g++ 12 -Wrestrict false positive on
// `"literal" + std::string`).
template <typename... A>
std::string cat(const A&... a) {
  std::ostringstream os;
  (os << ... << a);
  return os.str();
}

// "op [shape]extra": the name an op's comparison prints.
inline std::string label(const char* op, const Shape& s, const std::string& extra = "") {
  return cat(op, " ", shape_str(s), extra);
}

constexpr DType kDTypes[] = {DType::kF32, DType::kBF16};

}  // namespace zimage::test
