// Helpers for the CPU op tests: seeded random tensors, double-precision reference buffers, and an
// error summary (max abs / max rel) that every test prints, so the measured accuracy of the
// oracle is visible in the test log, not just pass/fail.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/tensor.h"

namespace zimage::test {

// One backend for all CPU op tests (3 threads so the pool is exercised even on small machines).
inline Backend& cpu() {
  static std::unique_ptr<Backend> be = make_cpu_backend(3);
  return *be;
}

// f32 host tensor, uniform in [lo, hi) from a fixed seed; values are never all zero.
inline Tensor rand_f32(const Shape& shape, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  Tensor t = Tensor::host(DType::kF32, shape);
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  float* p = t.data_as<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = dist(gen);
  return t;
}

inline Tensor f32(const Shape& shape) {
  return Tensor::host(DType::kF32, shape);
}

// A throw-away output argument: binds a temporary to the ops' `Tensor&` outputs (it lives until
// the end of the full expression, i.e. the op call).
inline Tensor& lval(Tensor&& t) {
  return t;
}

inline Tensor copy_of(const Tensor& t) {
  Tensor c = Tensor::host(t.dtype(), t.shape());
  std::memcpy(c.data(), t.data(), t.nbytes());
  return c;
}

// Reads element i of a f32 tensor as double.
inline double at(const Tensor& t, int64_t i) {
  return t.data_as<const float>()[i];
}

struct Err {
  double max_abs = 0.0;
  double max_rel = 0.0;  // over elements with |ref| > 1e-3
  int64_t bad = 0;       // elements over the tolerance
};

// Compares a f32 tensor against a double reference with |got - ref| <= atol + rtol * |ref|.
inline Err compare(const Tensor& got, const std::vector<double>& ref, double atol,
                   double rtol = 0.0) {
  Err e;
  if (got.numel() != static_cast<int64_t>(ref.size())) {
    ADD_FAILURE() << "compare: " << got.numel() << " elements vs " << ref.size() << " reference";
    e.bad = 1;
    return e;
  }
  for (size_t i = 0; i < ref.size(); ++i) {
    const double g = at(got, static_cast<int64_t>(i));
    const double d = std::fabs(g - ref[i]);
    if (!(d <= atol + rtol * std::fabs(ref[i]))) ++e.bad;  // NaN counts as bad
    if (!(d <= e.max_abs)) e.max_abs = d;
    if (std::fabs(ref[i]) > 1e-3) e.max_rel = std::max(e.max_rel, d / std::fabs(ref[i]));
  }
  return e;
}

// compare() + a printed line + the assertion.
inline void expect_close(const std::string& what, const Tensor& got, const std::vector<double>& ref,
                         double atol, double rtol = 0.0) {
  const Err e = compare(got, ref, atol, rtol);
  std::printf("[ max err  ] %-44s abs %.3g  rel %.3g  (%zu values)\n", what.c_str(), e.max_abs,
              e.max_rel, ref.size());
  EXPECT_EQ(e.bad, 0) << what << ": " << e.bad << " of " << ref.size() << " values off; max abs "
                      << e.max_abs << ", max rel " << e.max_rel;
}

// The op's Status must be an InvalidArgument error whose message contains `needle`.
inline void expect_invalid(const Status& s, const std::string& needle) {
  EXPECT_FALSE(s.ok()) << "expected an error containing '" << needle << "'";
  EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument) << s.to_string();
  EXPECT_NE(s.message().find(needle), std::string::npos)
      << "message '" << s.message() << "' lacks '" << needle << "'";
}

}  // namespace zimage::test
