// CPU NHWC conv2d against a direct (seven-loop, double) convolution: 1x1 and 3x3 kernels, any
// Cin/Cout, stride 2 with the VAE downsampler's asymmetric (0, 1, 0, 1) padding, an input large
// enough to span several im2col blocks; nearest 2x upsampling; argument errors.
#include "test_cpu_util.h"

namespace zimage::test {
namespace {

std::vector<double> ref_conv(const Tensor& x, const Tensor& w, const Tensor* bias,
                             const Conv2dParams& p, int64_t ho, int64_t wo) {
  const int64_t b = x.dim(0), h = x.dim(1), wd = x.dim(2), cin = x.dim(3);
  const int64_t cout = w.dim(0), kh = w.dim(1), kw = w.dim(2);
  std::vector<double> y(static_cast<size_t>(b * ho * wo * cout));
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t oy = 0; oy < ho; ++oy)
      for (int64_t ox = 0; ox < wo; ++ox)
        for (int64_t co = 0; co < cout; ++co) {
          double s = bias ? at(*bias, co) : 0.0;
          for (int64_t ky = 0; ky < kh; ++ky) {
            const int64_t iy = oy * p.stride - p.pad_top + ky;
            if (iy < 0 || iy >= h) continue;
            for (int64_t kx = 0; kx < kw; ++kx) {
              const int64_t ix = ox * p.stride - p.pad_left + kx;
              if (ix < 0 || ix >= wd) continue;
              for (int64_t ci = 0; ci < cin; ++ci) {
                s += at(x, ((bi * h + iy) * wd + ix) * cin + ci) *
                     at(w, ((co * kh + ky) * kw + kx) * cin + ci);
              }
            }
          }
          y[static_cast<size_t>(((bi * ho + oy) * wo + ox) * cout + co)] = s;
        }
  return y;
}

struct ConvCase {
  const char* name;
  Shape x;          // [B, H, W, Cin]
  int64_t cout, k;  // square kernel
  Conv2dParams p;
};

TEST(CpuOps, Conv2dAgainstDirectConvolution) {
  const ConvCase cases[] = {
      {"conv2d 3x3 pad 1", {1, 5, 7, 3}, 17, 3, {1, 1, 1, 1, 1}},
      {"conv2d 3x3 pad 1 batch 2", {2, 8, 6, 16}, 33, 3, {1, 1, 1, 1, 1}},
      {"conv2d 1x1", {2, 4, 5, 33}, 7, 1, {1, 0, 0, 0, 0}},
      {"conv2d 1x1 cin 1", {1, 3, 3, 1}, 4, 1, {1, 0, 0, 0, 0}},
      {"conv2d 3x3 s2 pad (0,1,0,1)", {1, 8, 12, 16}, 16, 3, {2, 0, 1, 0, 1}},
      {"conv2d 3x3 s2 pad (0,1,0,1) odd", {2, 7, 9, 5}, 3, 3, {2, 0, 1, 0, 1}},
      {"conv2d 3x3 no pad", {1, 6, 6, 4}, 5, 3, {1, 0, 0, 0, 0}},
      {"conv2d 1x1 s2", {1, 6, 5, 3}, 2, 1, {2, 0, 0, 0, 0}},
  };
  uint32_t seed = 700;
  for (const ConvCase& c : cases) {
    const int64_t h = c.x[1], wd = c.x[2], cin = c.x[3];
    const int64_t ho = (h + c.p.pad_top + c.p.pad_bottom - c.k) / c.p.stride + 1;
    const int64_t wo = (wd + c.p.pad_left + c.p.pad_right - c.k) / c.p.stride + 1;
    Tensor x = rand_f32(c.x, seed++);
    Tensor w = rand_f32({c.cout, c.k, c.k, cin}, seed++);
    Tensor bias = rand_f32({c.cout}, seed++);
    Tensor y = f32({c.x[0], ho, wo, c.cout});
    ASSERT_TRUE(cpu().conv2d(x, w, Tensor(), c.p, y).ok()) << c.name;
    expect_close(c.name, y, ref_conv(x, w, nullptr, c.p, ho, wo), 1e-5, 1e-5);
    ASSERT_TRUE(cpu().conv2d(x, w, bias, c.p, y).ok()) << c.name;
    expect_close(std::string(c.name) + " +bias", y, ref_conv(x, w, &bias, c.p, ho, wo), 1e-5, 1e-5);
  }
}

TEST(CpuOps, Conv2dSpansSeveralIm2colBlocks) {
  // 128x130 pixels x (3*3*64) columns > one 8M-float im2col block.
  Conv2dParams p{1, 1, 1, 1, 1};
  Tensor x = rand_f32({1, 128, 130, 64}, 750);
  Tensor w = rand_f32({5, 3, 3, 64}, 751);
  Tensor bias = rand_f32({5}, 752);
  Tensor y = f32({1, 128, 130, 5});
  ASSERT_TRUE(cpu().conv2d(x, w, bias, p, y).ok());
  expect_close("conv2d 3x3 128x130x64 (blocked im2col)", y, ref_conv(x, w, &bias, p, 128, 130),
               2e-5, 1e-5);
}

TEST(CpuOps, UpsampleNearest2x) {
  Tensor x = rand_f32({2, 3, 5, 7}, 760);
  Tensor y = f32({2, 6, 10, 7});
  ASSERT_TRUE(cpu().upsample_nearest2x(x, y).ok());
  std::vector<double> ref(static_cast<size_t>(y.numel()));
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t oy = 0; oy < 6; ++oy)
      for (int64_t ox = 0; ox < 10; ++ox)
        for (int64_t c = 0; c < 7; ++c)
          ref[static_cast<size_t>(((b * 6 + oy) * 10 + ox) * 7 + c)] =
              at(x, ((b * 3 + oy / 2) * 5 + ox / 2) * 7 + c);
  expect_close("upsample_nearest2x", y, ref, 0.0);
  expect_invalid(cpu().upsample_nearest2x(x, lval(f32({2, 6, 10, 6}))), "must be [2, 6, 10, 7]");
}

TEST(CpuOps, Conv2dErrors) {
  Tensor x = rand_f32({1, 4, 4, 3}, 1), w = rand_f32({2, 3, 3, 4}, 2), y = f32({1, 4, 4, 2});
  Conv2dParams p{1, 1, 1, 1, 1};
  expect_invalid(cpu().conv2d(x, w, Tensor(), p, y), "Cin differs (3 vs 4)");
  Tensor w3 = rand_f32({2, 3, 3, 3}, 3);
  expect_invalid(cpu().conv2d(x, w3, Tensor(), p, lval(f32({1, 3, 3, 2}))), "must be [1, 4, 4, 2]");
  expect_invalid(cpu().conv2d(x, w3, rand_f32({3}, 4), p, y), "bias f32[3] must be [2]");
  Conv2dParams bad{0, 0, 0, 0, 0};
  expect_invalid(cpu().conv2d(x, w3, Tensor(), bad, y), "stride 0 must be >= 1");
  Tensor big_w = rand_f32({2, 7, 7, 3}, 5);
  Conv2dParams nopad{1, 0, 0, 0, 0};
  expect_invalid(cpu().conv2d(x, big_w, Tensor(), nopad, y), "does not fit the padded input");
  Tensor xb = Tensor::host(DType::kBF16, {1, 4, 4, 3});
  expect_invalid(cpu().conv2d(xb, w3, Tensor(), p, y), "x bf16[1, 4, 4, 3]: dtype must be f32");
}

// conv2d_add (Backend's default: conv2d, then add) is the convolution plus the residual, the
// residual read and never written; a residual overlapping y or of another shape is refused.
TEST(CpuOps, Conv2dAdd) {
  const Conv2dParams p{1, 1, 1, 1, 1};
  Tensor x = rand_f32({2, 6, 5, 8}, 770), w = rand_f32({4, 3, 3, 8}, 771);
  Tensor bias = rand_f32({4}, 772), r = rand_f32({2, 6, 5, 4}, 773), y = f32({2, 6, 5, 4});
  const std::vector<float> r_before(r.data_as<float>(), r.data_as<float>() + r.numel());
  ASSERT_TRUE(cpu().conv2d_add(x, w, bias, r, p, y).ok());
  std::vector<double> ref = ref_conv(x, w, &bias, p, 6, 5);
  for (size_t i = 0; i < ref.size(); ++i) ref[i] += r_before[i];
  expect_close("conv2d_add", y, ref, 1e-5, 1e-5);
  EXPECT_EQ(std::vector<float>(r.data_as<float>(), r.data_as<float>() + r.numel()), r_before);
  expect_invalid(cpu().conv2d_add(x, w, bias, y, p, y), "overlaps y");
  expect_invalid(cpu().conv2d_add(x, w, bias, lval(f32({2, 6, 5, 3})), p, y), "f32[2, 6, 5, 3]");
}

}  // namespace
}  // namespace zimage::test
