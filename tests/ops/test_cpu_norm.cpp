// CPU normalisations against double references: RMSNorm and LayerNorm (optional weight, bias and
// per-batch modulation scale, in place), the gated residual RMSNorm, and NHWC GroupNorm with
// PyTorch semantics (biased variance over H*W*C/groups, eps inside the rsqrt, optional SiLU).
#include "test_cpu_util.h"

namespace zimage::test {
namespace {

// x viewed as [R, D]; w, b, scale optional (scale [B, D], rows split into B groups).
std::vector<double> ref_norm(const Tensor& x, const Tensor* w, const Tensor* b, const Tensor* sc,
                             double eps, bool layer) {
  const int64_t d = x.dim(-1), r = x.numel() / d;
  const int64_t group = sc ? r / sc->dim(0) : 1;
  std::vector<double> y(static_cast<size_t>(r * d));
  for (int64_t i = 0; i < r; ++i) {
    double mean = 0.0;
    if (layer) {
      for (int64_t j = 0; j < d; ++j) mean += at(x, i * d + j);
      mean /= static_cast<double>(d);
    }
    double var = 0.0;
    for (int64_t j = 0; j < d; ++j) var += std::pow(at(x, i * d + j) - mean, 2);
    var /= static_cast<double>(d);
    for (int64_t j = 0; j < d; ++j) {
      double v = (at(x, i * d + j) - mean) / std::sqrt(var + eps);
      if (w) v *= at(*w, j);
      if (b) v += at(*b, j);
      if (sc) v *= at(*sc, (i / group) * d + j);
      y[static_cast<size_t>(i * d + j)] = v;
    }
  }
  return y;
}

TEST(CpuOps, RmsNormVariants) {
  const int64_t dims[][2] = {{1, 1}, {3, 17}, {33, 100}, {100, 33}, {6, 96}};
  uint32_t seed = 100;
  for (const auto& dm : dims) {
    const int64_t r = dm[0], d = dm[1];
    Tensor x = rand_f32({r, d}, seed++, -3.0f, 3.0f);
    Tensor w = rand_f32({d}, seed++, 0.5f, 1.5f);
    Tensor y = f32({r, d});
    const std::string tag = "rms_norm [" + std::to_string(r) + "," + std::to_string(d) + "]";
    ASSERT_TRUE(cpu().rms_norm(x, Tensor(), 1e-6f, Tensor(), y).ok());
    expect_close(tag, y, ref_norm(x, nullptr, nullptr, nullptr, 1e-6, false), 1e-5, 1e-5);
    ASSERT_TRUE(cpu().rms_norm(x, w, 1e-5f, Tensor(), y).ok());
    expect_close(tag + " w", y, ref_norm(x, &w, nullptr, nullptr, 1e-5, false), 1e-5, 1e-5);
    // scale over B groups of rows (B = r when r is odd, else 2)
    const int64_t bgroups = r % 2 == 0 ? 2 : r;
    Tensor sc = rand_f32({bgroups, d}, seed++, 0.5f, 2.0f);
    ASSERT_TRUE(cpu().rms_norm(x, w, 1e-5f, sc, y).ok());
    expect_close(tag + " w scale", y, ref_norm(x, &w, nullptr, &sc, 1e-5, false), 1e-5, 1e-5);
    // in place
    Tensor xi = copy_of(x);
    ASSERT_TRUE(cpu().rms_norm(xi, w, 1e-5f, sc, xi).ok());
    expect_close(tag + " in place", xi, ref_norm(x, &w, nullptr, &sc, 1e-5, false), 1e-5, 1e-5);
  }
}

TEST(CpuOps, RmsNormRank4PerHead) {
  // q-norm of the DiT / Qwen3: x [B, S, H, Dh], weight [Dh].
  Tensor x = rand_f32({2, 5, 3, 16}, 7, -2.0f, 2.0f);
  Tensor w = rand_f32({16}, 8);
  Tensor y = f32({2, 5, 3, 16});
  ASSERT_TRUE(cpu().rms_norm(x, w, 1e-6f, Tensor(), y).ok());
  expect_close("rms_norm [2,5,3,16] per head", y, ref_norm(x, &w, nullptr, nullptr, 1e-6, false),
               1e-5, 1e-5);
}

TEST(CpuOps, LayerNormVariants) {
  const int64_t dims[][2] = {{1, 3}, {17, 33}, {100, 17}, {4, 96}};
  uint32_t seed = 200;
  for (const auto& dm : dims) {
    const int64_t r = dm[0], d = dm[1];
    Tensor x = rand_f32({r, d}, seed++, -2.0f, 4.0f);  // non-zero mean
    Tensor w = rand_f32({d}, seed++, 0.5f, 1.5f);
    Tensor b = rand_f32({d}, seed++);
    Tensor y = f32({r, d});
    const std::string tag = "layer_norm [" + std::to_string(r) + "," + std::to_string(d) + "]";
    ASSERT_TRUE(cpu().layer_norm(x, Tensor(), Tensor(), 1e-6f, Tensor(), y).ok());
    expect_close(tag, y, ref_norm(x, nullptr, nullptr, nullptr, 1e-6, true), 2e-5, 1e-5);
    ASSERT_TRUE(cpu().layer_norm(x, w, b, 1e-5f, Tensor(), y).ok());
    expect_close(tag + " w b", y, ref_norm(x, &w, &b, nullptr, 1e-5, true), 2e-5, 1e-5);
    ASSERT_TRUE(cpu().layer_norm(x, w, Tensor(), 1e-5f, Tensor(), y).ok());
    expect_close(tag + " w only", y, ref_norm(x, &w, nullptr, nullptr, 1e-5, true), 2e-5, 1e-5);
    Tensor sc = rand_f32({1, d}, seed++, 0.5f, 2.0f);
    Tensor xi = copy_of(x);
    ASSERT_TRUE(cpu().layer_norm(xi, w, b, 1e-6f, sc, xi).ok());
    expect_close(tag + " w b scale in place", xi, ref_norm(x, &w, &b, &sc, 1e-6, true), 2e-5, 1e-5);
  }
}

TEST(CpuOps, ResidualRmsNormGate) {
  const int64_t b = 2, s = 17, d = 48;
  Tensor x = rand_f32({b, s, d}, 300);
  Tensor y = rand_f32({b, s, d}, 301, -3.0f, 3.0f);
  Tensor w = rand_f32({d}, 302, 0.5f, 1.5f);
  Tensor gate = rand_f32({b, d}, 303);
  for (int variant = 0; variant < 3; ++variant) {
    const Tensor* gp = variant == 1 ? nullptr : &gate;
    const Tensor* wp = variant == 2 ? nullptr : &w;
    std::vector<double> ref = ref_norm(y, wp, nullptr, gp, 1e-5, false);
    for (size_t i = 0; i < ref.size(); ++i) ref[i] += at(x, static_cast<int64_t>(i));
    Tensor xo = copy_of(x);
    ASSERT_TRUE(
        cpu().residual_rms_norm_gate(xo, y, wp ? w : Tensor(), 1e-5f, gp ? gate : Tensor()).ok());
    const char* names[] = {"residual_rms_norm_gate w gate", "residual_rms_norm_gate w",
                           "residual_rms_norm_gate gate"};
    expect_close(names[variant], xo, ref, 1e-5, 1e-5);
  }
  Tensor bad_gate = rand_f32({3, d}, 304);
  Tensor xo = copy_of(x);
  expect_invalid(cpu().residual_rms_norm_gate(xo, y, w, 1e-5f, bad_gate), "gate f32[3, 48]");
}

// Reference group norm on NHWC x.
std::vector<double> ref_group_norm(const Tensor& x, const Tensor* g, const Tensor* bt, int groups,
                                   double eps, bool silu) {
  const int64_t b = x.dim(0), hw = x.dim(1) * x.dim(2), c = x.dim(3), cg = c / groups;
  std::vector<double> y(static_cast<size_t>(x.numel()));
  for (int64_t bi = 0; bi < b; ++bi) {
    for (int64_t gi = 0; gi < groups; ++gi) {
      double mean = 0.0, var = 0.0;
      for (int64_t p = 0; p < hw; ++p)
        for (int64_t j = 0; j < cg; ++j) mean += at(x, (bi * hw + p) * c + gi * cg + j);
      mean /= static_cast<double>(hw * cg);
      for (int64_t p = 0; p < hw; ++p)
        for (int64_t j = 0; j < cg; ++j)
          var += std::pow(at(x, (bi * hw + p) * c + gi * cg + j) - mean, 2);
      var /= static_cast<double>(hw * cg);
      for (int64_t p = 0; p < hw; ++p) {
        for (int64_t j = 0; j < cg; ++j) {
          const int64_t ch = gi * cg + j, idx = (bi * hw + p) * c + ch;
          double v = (at(x, idx) - mean) / std::sqrt(var + eps);
          if (g) v *= at(*g, ch);
          if (bt) v += at(*bt, ch);
          if (silu) v = v / (1.0 + std::exp(-v));
          y[static_cast<size_t>(idx)] = v;
        }
      }
    }
  }
  return y;
}

TEST(CpuOps, GroupNormNhwc) {
  struct Case {
    Shape shape;
    int groups;
  };
  const Case cases[] = {
      {{1, 3, 5, 6}, 3}, {{2, 7, 9, 64}, 32}, {{1, 17, 1, 32}, 1}, {{2, 4, 6, 96}, 32}};
  uint32_t seed = 400;
  for (const Case& cs : cases) {
    const int64_t c = cs.shape[3];
    Tensor x = rand_f32(cs.shape, seed++, -1.0f, 3.0f);
    Tensor g = rand_f32({c}, seed++, 0.5f, 1.5f);
    Tensor bt = rand_f32({c}, seed++);
    Tensor y = f32(cs.shape);
    const std::string tag =
        "group_norm " + shape_string(cs.shape) + " g" + std::to_string(cs.groups);
    ASSERT_TRUE(cpu().group_norm(x, g, bt, cs.groups, 1e-6f, false, y).ok());
    expect_close(tag, y, ref_group_norm(x, &g, &bt, cs.groups, 1e-6, false), 2e-5, 1e-5);
    ASSERT_TRUE(cpu().group_norm(x, Tensor(), Tensor(), cs.groups, 1e-6f, false, y).ok());
    expect_close(tag + " no affine", y, ref_group_norm(x, nullptr, nullptr, cs.groups, 1e-6, false),
                 2e-5, 1e-5);
    Tensor xi = copy_of(x);
    ASSERT_TRUE(cpu().group_norm(xi, g, bt, cs.groups, 1e-6f, true, xi).ok());
    expect_close(tag + " silu in place", xi, ref_group_norm(x, &g, &bt, cs.groups, 1e-6, true),
                 2e-5, 1e-5);
  }
}

TEST(CpuOps, NormErrors) {
  Tensor x = rand_f32({4, 8}, 1), y = f32({4, 8});
  expect_invalid(cpu().rms_norm(x, rand_f32({7}, 2), 1e-6f, Tensor(), y), "w f32[7] must be [8]");
  expect_invalid(cpu().rms_norm(x, Tensor(), 1e-6f, rand_f32({3, 8}, 3), y),
                 "scale f32[3, 8] must be [B, 8]");
  expect_invalid(cpu().rms_norm(x, Tensor(), 1e-6f, Tensor(), lval(f32({4, 9}))), "shapes differ");
  // An output view shifted 4 floats into x's storage runs past its end.
  Tensor shifted(x.storage(), 16, DType::kF32, {4, 8});
  expect_invalid(cpu().rms_norm(x, Tensor(), 1e-6f, Tensor(), shifted), "exceeds its storage");
  Tensor xs = rand_f32({8, 8}, 4);
  Tensor lo = xs.slice0(0, 4), hi = xs.slice0(2, 6);
  expect_invalid(cpu().layer_norm(lo, Tensor(), Tensor(), 1e-6f, Tensor(), hi),
                 "without being the same memory");
  Tensor g4 = rand_f32({1, 2, 2, 6}, 5), g4y = f32({1, 2, 2, 6});
  expect_invalid(cpu().group_norm(g4, Tensor(), Tensor(), 4, 1e-6f, false, g4y),
                 "4 groups do not divide 6 channels");
  expect_invalid(cpu().group_norm(x, Tensor(), Tensor(), 4, 1e-6f, false, y), "must have rank 4");
  Tensor xh = Tensor::host(DType::kF16, {4, 8});
  expect_invalid(cpu().layer_norm(xh, Tensor(), Tensor(), 1e-6f, Tensor(), y),
                 "x f16[4, 8]: dtype must be f32");
}

}  // namespace
}  // namespace zimage::test
