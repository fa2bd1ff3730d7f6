// CPU matmul against a double-precision reference: y = x · wᵀ + b over odd shapes, rank-3
// activations, with and without bias, and the validation errors the op must return.
#include "test_cpu_util.h"

namespace zimage::test {
namespace {

std::vector<double> ref_matmul(const Tensor& x, const Tensor& w, const Tensor* b) {
  const int64_t k = w.dim(1), n = w.dim(0), m = x.numel() / k;
  std::vector<double> y(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double s = 0.0;
      for (int64_t l = 0; l < k; ++l) s += at(x, i * k + l) * at(w, j * k + l);
      if (b) s += at(*b, j);
      y[static_cast<size_t>(i * n + j)] = s;
    }
  }
  return y;
}

TEST(CpuOps, MatmulOddShapesWithAndWithoutBias) {
  const int64_t shapes[][3] = {{1, 1, 1},     {3, 5, 4},    {17, 33, 100},
                               {100, 17, 33}, {33, 100, 3}, {64, 96, 32}};
  uint32_t seed = 1;
  for (const auto& s : shapes) {
    const int64_t m = s[0], n = s[1], k = s[2];
    Tensor x = rand_f32({m, k}, seed++);
    Tensor w = rand_f32({n, k}, seed++);
    Tensor b = rand_f32({n}, seed++);
    Tensor y = f32({m, n});
    const std::string tag =
        "matmul " + std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k);
    ASSERT_TRUE(cpu().matmul(x, w, Tensor(), y).ok());
    expect_close(tag, y, ref_matmul(x, w, nullptr), 1e-5, 1e-5);
    ASSERT_TRUE(cpu().matmul(x, w, b, y).ok());
    expect_close(tag + " +bias", y, ref_matmul(x, w, &b), 1e-5, 1e-5);
  }
}

TEST(CpuOps, MatmulRank3Activations) {
  Tensor x = rand_f32({2, 7, 48}, 11);
  Tensor w = rand_f32({80, 48}, 12);
  Tensor b = rand_f32({80}, 13);
  Tensor y = f32({2, 7, 80});
  ASSERT_TRUE(cpu().matmul(x, w, b, y).ok());
  expect_close("matmul [2,7,48] x [80,48]", y, ref_matmul(x, w, &b), 1e-5, 1e-5);
}

TEST(CpuOps, MatmulErrors) {
  Tensor x = rand_f32({3, 5}, 1), w = rand_f32({4, 6}, 2), y = f32({3, 4});
  Status s = cpu().matmul(x, w, Tensor(), y);
  expect_invalid(s, "K differs (5 vs 6)");
  EXPECT_NE(s.message().find("x f32[3, 5] and w f32[4, 6]"), std::string::npos) << s.message();

  Tensor w5 = rand_f32({4, 5}, 3);
  Tensor bad_y = f32({3, 5});
  expect_invalid(cpu().matmul(x, w5, Tensor(), bad_y), "y f32[3, 5] must be [3, 4]");
  Tensor bad_b = rand_f32({5}, 4);
  expect_invalid(cpu().matmul(x, w5, bad_b, y), "bias f32[5] must be [4]");
  Tensor xb = Tensor::host(DType::kBF16, {3, 5});
  expect_invalid(cpu().matmul(xb, w5, Tensor(), y), "x bf16[3, 5]: dtype must be f32");
  expect_invalid(cpu().matmul(Tensor(), w5, Tensor(), y), "x is undefined");
  // y aliasing x is refused (the BLAS would read overwritten input).
  Tensor sq = rand_f32({4, 4}, 5), w4 = rand_f32({4, 4}, 6);
  expect_invalid(cpu().matmul(sq, w4, Tensor(), sq), "overlaps x");
  Tensor w3 = rand_f32({2, 2, 5}, 7);
  expect_invalid(cpu().matmul(x, w3, Tensor(), y), "must have rank 2");
  // A tensor claiming more bytes than its storage holds.
  float small[4] = {1, 2, 3, 4};
  Tensor liar(Tensor::wrap(small, DType::kF32, {4}).storage(), 0, DType::kF32, {3, 5});
  expect_invalid(cpu().matmul(liar, w5, Tensor(), y), "exceeds its storage");
}

TEST(CpuOps, MatmulEmptyK) {
  Tensor x = f32({3, 0}), w = f32({4, 0}), b = rand_f32({4}, 9), y = rand_f32({3, 4}, 10);
  ASSERT_TRUE(cpu().matmul(x, w, b, y).ok());
  for (int64_t i = 0; i < 12; ++i) EXPECT_EQ(at(y, i), at(b, i % 4));
}

}  // namespace
}  // namespace zimage::test
