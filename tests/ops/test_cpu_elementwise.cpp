// CPU element-wise ops and RoPE against double references: SiLU, tanh, SwiGLU (also in place),
// axpby in f32 / bf16 / f16 (also in place), broadcast add, per-row sum of squares, rotate-half
// and interleaved RoPE, the decoded image to RGB8 (against the ops it replaces), plus their
// argument errors.
#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>

#include "pipeline/scheduler.h"
#include "pipeline/text_to_image.h"
#include "test_cpu_util.h"

namespace zimage::test {
namespace {

std::vector<double> map(const Tensor& x, double (*f)(double)) {
  std::vector<double> r(static_cast<size_t>(x.numel()));
  for (size_t i = 0; i < r.size(); ++i) r[i] = f(at(x, static_cast<int64_t>(i)));
  return r;
}

double silu_d(double v) {
  return v / (1.0 + std::exp(-v));
}
double tanh_d(double v) {
  return std::tanh(v);
}

TEST(CpuOps, SiluTanhInPlaceAndNot) {
  for (int64_t n : {1, 17, 100, 40000}) {  // 40000 spans several pool chunks
    Tensor x = rand_f32({n}, 800 + static_cast<uint32_t>(n), -8.0f, 8.0f);
    Tensor y = f32({n});
    ASSERT_TRUE(cpu().silu(x, y).ok());
    expect_close("silu n=" + std::to_string(n), y, map(x, silu_d), 1e-6, 1e-6);
    ASSERT_TRUE(cpu().tanh(x, y).ok());
    expect_close("tanh n=" + std::to_string(n), y, map(x, tanh_d), 1e-6, 1e-6);
    Tensor xi = copy_of(x);
    ASSERT_TRUE(cpu().silu(xi, xi).ok());
    expect_close("silu in place n=" + std::to_string(n), xi, map(x, silu_d), 1e-6, 1e-6);
  }
  expect_invalid(cpu().silu(rand_f32({3}, 1), lval(f32({4}))), "silu: x f32[3] and y f32[4]");
}

std::vector<double> ref_swiglu(const Tensor& x) {
  const int64_t f = x.dim(-1) / 2, m = x.numel() / (2 * f);
  std::vector<double> y(static_cast<size_t>(m * f));
  for (int64_t r = 0; r < m; ++r)
    for (int64_t j = 0; j < f; ++j)
      y[static_cast<size_t>(r * f + j)] = silu_d(at(x, r * 2 * f + j)) * at(x, r * 2 * f + f + j);
  return y;
}

TEST(CpuOps, SwigluAndInPlace) {
  for (int64_t m : {1, 3, 33}) {
    for (int64_t f : {1, 17, 96}) {
      Tensor x = rand_f32({m, 2 * f}, 900 + static_cast<uint32_t>(m * f), -4.0f, 4.0f);
      Tensor y = f32({m, f});
      ASSERT_TRUE(cpu().swiglu(x, y).ok());
      const std::string tag = "swiglu [" + std::to_string(m) + "," + std::to_string(2 * f) + "]";
      expect_close(tag, y, ref_swiglu(x), 1e-6, 1e-6);
      // In place: y is a view of x's first m*f floats.
      Tensor xi = copy_of(x);
      Tensor yi(xi.storage(), 0, DType::kF32, {m, f});
      ASSERT_TRUE(cpu().swiglu(xi, yi).ok());
      expect_close(tag + " in place", yi, ref_swiglu(x), 1e-6, 1e-6);
    }
  }
  Tensor x = rand_f32({2, 6}, 1);
  expect_invalid(cpu().swiglu(x, lval(f32({2, 4}))), "must be [2, 3]");
  expect_invalid(cpu().swiglu(rand_f32({2, 5}, 2), lval(f32({2, 2}))), "even last dimension");
  Tensor shifted(x.storage(), 4, DType::kF32, {2, 3});
  expect_invalid(cpu().swiglu(x, shifted), "without starting at the same address");
}

TEST(CpuOps, AxpbyDtypesAndInPlace) {
  const int64_t n = 1000;
  Tensor x = rand_f32({10, 100}, 1000, -3.0f, 3.0f), y = rand_f32({10, 100}, 1001, -3.0f, 3.0f);
  const float a = 0.75f, b = -1.25f;
  std::vector<double> ref(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) ref[static_cast<size_t>(i)] = a * at(x, i) + b * at(y, i);
  Tensor out = f32({10, 100});
  ASSERT_TRUE(cpu().axpby(a, x, b, y, out).ok());
  expect_close("axpby f32", out, ref, 1e-6, 1e-6);
  Tensor xi = copy_of(x);
  ASSERT_TRUE(cpu().axpby(a, xi, b, y, xi).ok());
  expect_close("axpby f32 in place (out = x)", xi, ref, 1e-6, 1e-6);
  Tensor yi = copy_of(y);
  ASSERT_TRUE(cpu().axpby(a, x, b, yi, yi).ok());
  expect_close("axpby f32 in place (out = y)", yi, ref, 1e-6, 1e-6);
  for (DType dt : {DType::kBF16, DType::kF16}) {
    auto xh = cpu().upload(x, dt), yh = cpu().upload(y, dt), oh = cpu().alloc(dt, {10, 100});
    ASSERT_TRUE(xh.ok() && yh.ok() && oh.ok());
    ASSERT_TRUE(cpu().axpby(a, *xh, b, *yh, *oh).ok());
    Tensor back = f32({10, 100});
    ASSERT_TRUE(cpu().download(*oh, back).ok());
    // Inputs and output are rounded to the 16-bit type: relative error ~2^-8 (bf16), 2^-11 (f16).
    const double tol = dt == DType::kBF16 ? 0.04 : 0.005;
    expect_close(std::string("axpby ") + dtype_name(dt), back, ref, tol, 0.0);
  }
  auto xb = cpu().upload(x, DType::kBF16);
  ASSERT_TRUE(xb.ok());
  expect_invalid(cpu().axpby(a, *xb, b, y, out), "dtypes differ");
}

TEST(CpuOps, AddBroadcast) {
  Tensor x = rand_f32({3, 7, 17}, 1100);
  for (const Shape& ys : {Shape{3, 7, 17}, Shape{7, 17}, Shape{17}, Shape{1}}) {
    Tensor y = rand_f32(ys, 1101);
    const int64_t yn = y.numel();
    std::vector<double> ref(static_cast<size_t>(x.numel()));
    for (int64_t i = 0; i < x.numel(); ++i) ref[static_cast<size_t>(i)] = at(x, i) + at(y, i % yn);
    Tensor out = f32({3, 7, 17});
    ASSERT_TRUE(cpu().add(x, y, out).ok());
    expect_close("add y " + shape_string(ys), out, ref, 1e-6, 1e-6);
    Tensor xi = copy_of(x);
    ASSERT_TRUE(cpu().add(xi, y, xi).ok());
    expect_close("add in place y " + shape_string(ys), xi, ref, 1e-6, 1e-6);
  }
  expect_invalid(cpu().add(x, rand_f32({5}, 1), lval(f32({3, 7, 17}))), "does not broadcast");
}

TEST(CpuOps, SumSquaresPerRow) {
  Tensor x = rand_f32({3, 16, 5, 7}, 1200, -2.0f, 2.0f);
  auto r = cpu().sum_squares(x);
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->size(), 3u);
  double worst = 0.0;
  for (int64_t b = 0; b < 3; ++b) {
    double s = 0.0;
    for (int64_t i = 0; i < 560; ++i) s += at(x, b * 560 + i) * at(x, b * 560 + i);
    worst = std::max(worst, std::fabs((*r)[static_cast<size_t>(b)] - s) / s);
  }
  std::printf("[ max err  ] %-44s rel %.3g\n", "sum_squares [3,16,5,7]", worst);
  EXPECT_LT(worst, 1e-12);
  EXPECT_FALSE(cpu().sum_squares(Tensor::host(DType::kI32, {3})).ok());
}

TEST(CpuOps, RopeHalf) {
  const int64_t b = 2, s = 5, h = 3, dh = 16;
  Tensor x = rand_f32({b, s, h, dh}, 1300, -2.0f, 2.0f);
  Tensor cs = f32({s, dh}), sn = f32({s, dh});
  for (int64_t p = 0; p < s; ++p)  // Qwen3 tables: emb = cat(freqs, freqs)
    for (int64_t j = 0; j < dh; ++j) {
      const double ang = p * std::pow(1e6, -2.0 * (j % (dh / 2)) / dh);
      cs.data_as<float>()[p * dh + j] = static_cast<float>(std::cos(ang));
      sn.data_as<float>()[p * dh + j] = static_cast<float>(std::sin(ang));
    }
  std::vector<double> ref(static_cast<size_t>(x.numel()));
  for (int64_t r = 0; r < b * s; ++r)
    for (int64_t hh = 0; hh < h; ++hh)
      for (int64_t j = 0; j < dh; ++j) {
        const int64_t base = (r * h + hh) * dh, p = r % s;
        const double rot = j < dh / 2 ? -at(x, base + j + dh / 2) : at(x, base + j - dh / 2);
        ref[static_cast<size_t>(base + j)] =
            at(x, base + j) * at(cs, p * dh + j) + rot * at(sn, p * dh + j);
      }
  Tensor xi = copy_of(x);
  ASSERT_TRUE(cpu().rope_half(xi, cs, sn).ok());
  expect_close("rope_half [2,5,3,16]", xi, ref, 1e-6, 1e-6);
  expect_invalid(cpu().rope_half(xi, f32({4, dh}), sn), "must be [5, 16]");
}

TEST(CpuOps, RopeInterleaved) {
  const int64_t b = 2, s = 7, h = 2, dh = 12;
  Tensor x = rand_f32({b, s, h, dh}, 1400, -2.0f, 2.0f);
  Tensor fr = f32({b, s, dh / 2, 2});
  for (int64_t i = 0; i < b * s * dh / 2; ++i) {
    const double ang = 0.37 * static_cast<double>(i % 41) - 3.0;
    fr.data_as<float>()[2 * i] = static_cast<float>(std::cos(ang));
    fr.data_as<float>()[2 * i + 1] = static_cast<float>(std::sin(ang));
  }
  auto reference = [&](bool shared) {
    std::vector<double> ref(static_cast<size_t>(x.numel()));
    for (int64_t r = 0; r < b * s; ++r)
      for (int64_t hh = 0; hh < h; ++hh)
        for (int64_t j = 0; j < dh / 2; ++j) {
          const int64_t base = (r * h + hh) * dh, fi = ((shared ? r % s : r) * dh / 2 + j) * 2;
          const double x0 = at(x, base + 2 * j), x1 = at(x, base + 2 * j + 1);
          const double c = at(fr, fi), sn = at(fr, fi + 1);
          ref[static_cast<size_t>(base + 2 * j)] = x0 * c - x1 * sn;
          ref[static_cast<size_t>(base + 2 * j + 1)] = x0 * sn + x1 * c;
        }
    return ref;
  };
  Tensor xi = copy_of(x);
  ASSERT_TRUE(cpu().rope_interleaved(xi, fr).ok());
  expect_close("rope_interleaved [2,7,2,12]", xi, reference(false), 1e-6, 1e-6);
  Tensor xs = copy_of(x);
  ASSERT_TRUE(cpu().rope_interleaved(xs, fr.slice0(0, 1)).ok());
  expect_close("rope_interleaved freqs shared over batch", xs, reference(true), 1e-6, 1e-6);
  expect_invalid(cpu().rope_interleaved(xi, f32({b, s, dh, 2})), "must be [2, 7, 6, 2]");
}

}  // namespace
}  // namespace zimage::test

// The denoising update op is the reference pipeline's host arithmetic, bit for bit: the CPU op
// against pipeline/scheduler.h's cfg_combine + negation + euler_step (what the CUDA op is then
// compared with, bit for bit, in the GPU suite).
namespace zimage::test {
namespace {

TEST(CpuOps, GuidedEulerStepIsThePipelinesArithmetic) {
  for (int64_t n : {1, 1000, 70000}) {
    const Tensor pos = rand_f32({n}, 900, -3.0f, 3.0f);
    const Tensor neg = rand_f32({n}, 901, -3.0f, 3.0f);
    const Tensor lat = rand_f32({n}, 902, -2.0f, 2.0f);
    for (float g : {0.0f, 1.0f, 4.5f}) {
      const float dt = -0.0873f;
      std::vector<float> pred(static_cast<size_t>(n));
      if (g > 0.0f) {
        cfg_combine(pos.data_as<float>(), neg.data_as<float>(), g, pred.data(), pred.size());
      } else {
        std::copy(pos.data_as<float>(), pos.data_as<float>() + n, pred.begin());
      }
      for (float& v : pred) v = -v;
      std::vector<float> want(lat.data_as<float>(), lat.data_as<float>() + n);
      euler_step(want.data(), pred.data(), dt, want.size());
      Tensor got = copy_of(lat);
      ASSERT_TRUE(cpu().guided_euler_step(pos, g > 0.0f ? neg : Tensor(), g, dt, got).ok());
      EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * 4), 0)
          << "n=" << n << " g=" << g << ": not bit-identical to the pipeline's host arithmetic";
    }
  }
  Tensor lat = f32({3});
  EXPECT_FALSE(cpu().guided_euler_step(rand_f32({4}, 1), Tensor(), 0.0f, 0.1f, lat).ok());
}

TEST(CpuOps, CountNonfinite) {
  Tensor x = rand_f32({1000}, 903);
  auto zero = cpu().count_nonfinite(x);
  ASSERT_TRUE(zero.ok());
  EXPECT_EQ(*zero, 0);
  x.data_as<float>()[3] = std::numeric_limits<float>::quiet_NaN();
  x.data_as<float>()[999] = -std::numeric_limits<float>::infinity();
  auto two = cpu().count_nonfinite(x);
  ASSERT_TRUE(two.ok());
  EXPECT_EQ(*two, 2);
}

// image_to_rgb8 against the ops it replaces (VaeDecoder::postprocess's axpby, add and clamp on the
// same backend, then the pipeline's to_u8): the same bytes, for every value class.
TEST(CpuOps, ImageToRgb8IsPostprocessThenToU8) {
  Tensor x = rand_f32({4, 5, 7, 3}, 904, -1.6f, 1.6f);  // saturates both ends
  float* xp = x.data_as<float>();
  const float specials[] = {0.0f,
                            -0.0f,
                            1.0f,
                            -1.0f,
                            1e-30f,
                            -1e-30f,
                            1e-40f,  // subnormal
                            -1e-40f,
                            0.999f,
                            std::numeric_limits<float>::max(),
                            -std::numeric_limits<float>::max(),
                            std::numeric_limits<float>::quiet_NaN(),
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity()};
  for (size_t i = 0; i < std::size(specials); ++i) xp[i * 5] = specials[i];
  Tensor rgb = Tensor::host(DType::kU8, x.shape());
  ASSERT_TRUE(cpu().image_to_rgb8(x, rgb).ok());
  Tensor y = f32(x.shape());
  ASSERT_TRUE(cpu().axpby(0.5f, x, 0.0f, x, y).ok());
  Tensor half = f32({1});
  half.data_as<float>()[0] = 0.5f;
  ASSERT_TRUE(cpu().add(y, half, y).ok());
  ASSERT_TRUE(cpu().clamp(y, 0.0f, 1.0f, y).ok());
  const auto* got = static_cast<const uint8_t*>(rgb.data());
  const float* yp = y.data_as<float>();
  for (int64_t k = 0; k < x.numel(); ++k) {
    EXPECT_EQ(got[k], std::isfinite(xp[k]) ? to_u8(yp[k]) : 0) << "x = " << xp[k];
  }
  // bf16 and f16 inputs, every one of the 65536 bit patterns (NaN, ±Inf, subnormals included):
  // postprocess's ops with each result rounded to the input's dtype (the CPU backend runs those
  // ops in f32 only; the GPU test compares its bf16 ops themselves).
  for (DType dt : {DType::kBF16, DType::kF16}) {
    const bool bf = dt == DType::kBF16;
    Tensor h = Tensor::host(dt, {65536});
    auto* hp = static_cast<uint16_t*>(h.data());
    for (int k = 0; k < 65536; ++k) hp[k] = static_cast<uint16_t>(k);
    Tensor out = Tensor::host(DType::kU8, {65536});
    ASSERT_TRUE(cpu().image_to_rgb8(h, out).ok());
    const auto round = [bf](float v) { return bf ? round_bf16(v) : f16_to_f32(f32_to_f16(v)); };
    int64_t differ = 0;
    for (int k = 0; k < 65536; ++k) {
      const float in = bf ? bf16_to_f32(hp[k]) : f16_to_f32(hp[k]);
      const float v =
          round(round(0.5f * in + 0.0f * in) + 0.5f);          // axpby(0.5, x, 0, x): NaN at ±Inf
      const float c = v != v ? v : std::clamp(v, 0.0f, 1.0f);  // clamp keeps NaN
      differ += static_cast<const uint8_t*>(out.data())[k] != to_u8(c);
    }
    EXPECT_EQ(differ, 0) << dtype_name(dt);
  }
  // x and rgb may not overlap.
  Tensor bytes = Tensor::host(DType::kU8, {16});
  Tensor as_f32 = Tensor::wrap(bytes.data(), DType::kF32, {4}, Device::kCPU);
  Tensor narrow_alias = Tensor::wrap(bytes.data(), DType::kU8, {4}, Device::kCPU);
  EXPECT_FALSE(cpu().image_to_rgb8(as_f32, narrow_alias).ok());
  // Errors: rgb not u8, shapes that differ.
  Tensor wrong = f32(x.shape());
  EXPECT_FALSE(cpu().image_to_rgb8(x, wrong).ok());
  Tensor narrow = Tensor::host(DType::kU8, {4, 5, 7, 2});
  EXPECT_FALSE(cpu().image_to_rgb8(x, narrow).ok());
}

}  // namespace
}  // namespace zimage::test
