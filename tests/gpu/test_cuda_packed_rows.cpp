// The row kernels' bf16x2 forms (ZIMAGE_PACKED_ROWS, src/backend/cuda/kernels/bf16x2.cuh) against
// their fp32 forms, bit for bit: the gated residual + next norm of bf16 rows (written as bf16 and
// as FP8 rows) and the FP8 SwiGLU, at every packs-per-thread setting, with and without the
// weights and the modulation, and on rows of special values: zeros, products that fall to
// subnormals, squares that overflow, values that overflow when added, infinities and NaNs. A NaN
// must stay a NaN (its payload may differ: the two forms make it with different instructions);
// every other value, every FP8 code and every row scale must be the same bits. The other files
// compare these ops with the CPU oracle and with the two-op paths (test_cuda_ops.cpp,
// test_cuda_fp8.cpp), under the default, which is the bf16x2 form. CudaOpsPerf.PackedRowKernels
// times the two forms against each other.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "backend/cuda/kernels/kernels.h"
#include "gpu/cuda_test_util.h"
#include "gpu/perf_test_util.h"

using namespace zimage;
using namespace zimage::test;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

bool bf16_nan(uint16_t b) {
  return (b & 0x7f80u) == 0x7f80u && (b & 0x007fu) != 0;
}

// Two bf16 tensors' bytes: the same bits, or NaN in both. Returns the number of NaNs (so a test
// can tell that its special rows made some).
int64_t expect_same_bf16(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b,
                         const char* what) {
  EXPECT_EQ(a.size(), b.size()) << what;
  int64_t nans = 0, differ = 0, first = -1;
  for (size_t i = 0; i + 1 < a.size() && i + 1 < b.size(); i += 2) {
    uint16_t x, y;
    std::memcpy(&x, &a[i], 2);
    std::memcpy(&y, &b[i], 2);
    if (bf16_nan(x) && bf16_nan(y)) {
      ++nans;
    } else if (x != y) {
      if (first < 0) first = static_cast<int64_t>(i / 2);
      ++differ;
    }
  }
  EXPECT_EQ(differ, 0) << what << ": " << differ << " values differ, the first at " << first;
  return nans;
}

// Host f32 [rows, d] uniform in [lo, hi), rounded to bf16 values.
Tensor host_rows(int64_t rows, int64_t d, uint32_t seed, float lo, float hi) {
  return rand_host({rows, d}, seed, DType::kBF16, lo, hi);
}
void fill_row(Tensor& t, int64_t row, float v) {
  const int64_t d = t.shape().back();
  float* p = t.data_as<float>() + row * d;
  for (int64_t i = 0; i < d; ++i) p[i] = v;
}
void scale_row(Tensor& t, int64_t row, float s) {
  const int64_t d = t.shape().back();
  float* p = t.data_as<float>() + row * d;
  for (int64_t i = 0; i < d; ++i) p[i] = round_bf16(p[i] * s);
}

struct PackedGuard {  // restores the process-wide switches the tests turn
  bool packed = cuda::packed_row_kernels();
  cuda::RowKernelTuning tuning = cuda::row_kernel_tuning();
  ~PackedGuard() {
    cuda::set_packed_row_kernels(packed);
    cuda::set_row_kernel_tuning(tuning);
  }
};

}  // namespace

TEST(CudaPackedRows, ResidualNormThenNormIsTheFp32FormsBits) {
  ZI_REQUIRE_GPU();
  cuda::CudaBackend* g = gpu(DType::kBF16);
  PackedGuard guard;
  const float eps = 1e-6f;
  // rows, width, whether the weights and the modulation (a gate and scale a row) are given.
  struct Case {
    int64_t rows, d;
    bool mod;
  };
  int64_t nans = 0;
  for (const int ppt : {0, 2, 4}) {
    for (const Case& c : {Case{40, 3840, true}, Case{9, 3840, false}, Case{12, 1032, true},
                          Case{6, 8192, true}, Case{5, 30720, true}}) {
      SCOPED_TRACE(cat("rows ", c.rows, " d ", c.d, c.mod ? " +mod" : " plain", " ppt ", ppt));
      cuda::set_row_kernel_tuning({ppt, 0, 0});
      const int64_t rows = c.rows, d = c.d;
      Tensor x = host_rows(rows, d, 11, -4.f, 4.f);
      Tensor y = host_rows(rows, d, 12, -30.f, 30.f);
      Tensor gate = host_rows(rows, d, 13, -1.f, 1.f);
      Tensor scale = host_rows(rows, d, 14, 0.f, 2.f);
      if (rows >= 9) {
        fill_row(y, 0, 0.f);        // a zero row: r = 1/sqrt(eps)
        scale_row(y, 1, 1e-36f);    // squares underflow; with a small gate, subnormal products
        scale_row(gate, 1, 1e-4f);  // (1e-36 · 1e3 · 1e-4 < 1.2e-38)
        scale_row(y, 2, 1e37f);     // squares overflow: r = 0
        y.data_as<float>()[3 * d + 5] = kInf;  // 0 · inf: NaNs through the second norm
        scale_row(x, 4, 8e37f);                // x + o overflows to inf in places
        x.data_as<float>()[5 * d + 7] = kNaN;
        scale_row(scale, 6, 1e36f);  // the output overflows
        fill_row(scale, 7, 0.f);     // an all-zero output row: FP8 scale 1
        scale_row(x, 8, 1e-39f);     // x subnormal
      }
      const Tensor yd = take(g->upload(y, DType::kBF16), "upload");
      const Tensor w =
          take(g->upload(host_rows(1, d, 15, 0.5f, 1.5f), DType::kBF16), "upload").view({d});
      const Tensor wn =
          take(g->upload(host_rows(1, d, 16, 0.5f, 2.f), DType::kBF16), "upload").view({d});
      const Tensor gd = take(g->upload(gate, DType::kBF16), "upload");
      const Tensor sd = take(g->upload(scale, DType::kBF16), "upload");
      const Tensor none;
      // One run of each op under `packed`: x after it, out (bf16), then x, codes and scales (FP8).
      auto run = [&](bool packed) {
        cuda::set_packed_row_kernels(packed);
        std::vector<std::vector<uint8_t>> r;
        for (const bool fp8 : {false, true}) {
          Tensor xd = take(g->upload(x.view({rows, 1, d}), DType::kBF16), "upload");
          Tensor out = take(g->alloc(DType::kBF16, {rows, d}), "alloc");
          EXPECT_TRUE(g->fill(out, kNaN).ok());
          const Tensor& wv = c.mod ? w : none;
          const Tensor& gv = c.mod ? gd : none;
          const Tensor& wnv = c.mod ? wn : none;
          const Tensor& sv = c.mod ? sd : none;
          const Tensor yv = yd.view({rows, 1, d});
          if (!fp8) {
            EXPECT_TRUE(g->residual_norm_gate_then_norm(xd, yv, wv, eps, gv, wnv, sv, out).ok());
            r.push_back(bytes_of(g, xd));
            r.push_back(bytes_of(g, out));
          } else {
            Tensor q = take(g->alloc(DType::kF8E4M3, {rows, d}), "alloc");
            Tensor qs = take(g->alloc(DType::kF32, {rows}), "alloc");
            const Status st =
                g->residual_norm_gate_then_norm_fp8(xd, yv, wv, eps, gv, wnv, sv, out, q, qs);
            EXPECT_TRUE(st.ok()) << st.to_string();
            r.push_back(bytes_of(g, xd));
            r.push_back(bytes_of(g, q));
            r.push_back(bytes_of(g, qs));
          }
        }
        return r;
      };
      const auto fp32 = run(false);
      const auto packed = run(true);
      ASSERT_EQ(fp32.size(), 5u);
      ASSERT_EQ(packed.size(), 5u);
      nans += expect_same_bf16(packed[0], fp32[0], "x (bf16 form)");
      nans += expect_same_bf16(packed[1], fp32[1], "out");
      nans += expect_same_bf16(packed[2], fp32[2], "x (FP8 form)");
      EXPECT_EQ(packed[3], fp32[3]) << "e4m3 codes";
      EXPECT_EQ(packed[4], fp32[4]) << "row scales";
    }
  }
  EXPECT_GT(nans, 0) << "the special rows made no NaN: the NaN cases went untested";
}

TEST(CudaPackedRows, SwigluFp8IsTheFp32FormsBits) {
  ZI_REQUIRE_GPU();
  cuda::CudaBackend* g = gpu(DType::kBF16);
  PackedGuard guard;
  for (const auto& [m, f] : {std::pair<int64_t, int64_t>{37, 10240}, {6, 16384}, {9, 64}}) {
    SCOPED_TRACE(cat("swiglu m ", m, " f ", f));
    Tensor h = host_rows(m, 2 * f, 21, -8.f, 8.f);
    float* p = h.data_as<float>();
    // Gates whose SiLU is -0, subnormal, overflowing or NaN, and ups that overflow the product,
    // in the first row (every row scale is compared, so the others stay ordinary).
    const float gates[] = {-100.f, -88.f, -87.f, 88.f,  1e-39f, -1e-39f, 0.f,  -0.f,
                           kInf,   -kInf, kNaN,  3e38f, -3e38f, 1e-30f,  1.5f, -2.5f};
    const float ups[] = {1.f, 2.f, 1e30f, 3e38f, 1.f, 1.f, 5.f,   5.f,
                         2.f, 1.f, 1.f,   2.f,   2.f, 1.f, 3e38f, 3e38f};
    for (int i = 0; i < 16 && i < f; ++i) {
      p[i] = gates[i];
      p[f + i] = ups[i];
    }
    const Tensor hd = take(g->upload(h, DType::kBF16), "upload");
    auto run = [&](bool packed) {
      cuda::set_packed_row_kernels(packed);
      Tensor tmp = take(g->alloc(DType::kBF16, {m, f}), "alloc");
      Tensor q = take(g->alloc(DType::kF8E4M3, {m, f}), "alloc");
      Tensor qs = take(g->alloc(DType::kF32, {m}), "alloc");
      const Status st = g->swiglu_fp8(hd, tmp, q, qs);
      EXPECT_TRUE(st.ok()) << st.to_string();
      return std::pair{bytes_of(g, q), bytes_of(g, qs)};
    };
    const auto fp32 = run(false);
    const auto packed = run(true);
    EXPECT_EQ(packed.first, fp32.first) << "e4m3 codes";
    EXPECT_EQ(packed.second, fp32.second) << "row scales";
  }
}

// The two forms' times at the DiT's shapes for 1024² and 2048² (4160 and 16448 rows of 3840; the
// SwiGLU's 2 x 10240), the norm at 1 and 2 packs a thread, in the order fp32, bf16x2, fp32,
// bf16x2 so that a drifting clock shows. Bytes: each kernel's reads and writes of activations.
TEST(CudaOpsPerf, PackedRowKernels) {
  ZI_REQUIRE_GPU();
  cuda::CudaBackend* g = gpu(DType::kBF16);
  PackedGuard guard;
  const int64_t d = 3840, f = 10240;
  uint32_t seed = 5100;
  const Tensor w = rand_dev(g, {d}, seed++, 0.5f, 1.5f);
  const Tensor gate = rand_dev(g, {1, d}, seed++);
  const Tensor scale = rand_dev(g, {1, d}, seed++, 0.5f, 1.5f);
  for (const int64_t m : {int64_t{4160}, int64_t{16448}}) {
    Tensor x = rand_dev(g, {1, m, d}, seed++);
    const Tensor y = rand_dev(g, {1, m, d}, seed++, -3.f, 3.f);
    Tensor out = take(g->alloc(DType::kBF16, {m, d}), "out");
    Tensor q = take(g->alloc(DType::kF8E4M3, {m, d}), "q");
    Tensor qs = take(g->alloc(DType::kF32, {m}), "qs");
    const Tensor h = rand_dev(g, {m, 2 * f}, seed++, -6.f, 6.f);
    Tensor act = take(g->alloc(DType::kBF16, {m, f}), "act");
    Tensor act8 = take(g->alloc(DType::kF8E4M3, {m, f}), "act8");
    Tensor acts = take(g->alloc(DType::kF32, {m}), "acts");
    const double row = 2.0 * m * d;  // bytes of one [m, d] bf16 tensor
    for (const int ppt : {1, 2}) {
      cuda::set_row_kernel_tuning({ppt, 0, 0});
      for (int rep = 0; rep < 2; ++rep) {
        for (const bool packed : {false, true}) {
          cuda::set_packed_row_kernels(packed);
          const char* form = packed ? "bf16x2" : "fp32";
          report(cat("residual_norm_then_norm ", m, " ppt ", ppt, " ", form),
                 sustained_ms(g,
                              [&] {
                                return g->residual_norm_gate_then_norm(x, y, w, 1e-6f, gate, w,
                                                                       scale, out);
                              }),
                 0, 4 * row);
          report(cat("residual_norm_then_norm_fp8 ", m, " ppt ", ppt, " ", form),
                 sustained_ms(g,
                              [&] {
                                return g->residual_norm_gate_then_norm_fp8(x, y, w, 1e-6f, gate, w,
                                                                           scale, out, q, qs);
                              }),
                 0, 3 * row + row / 2 + 4.0 * m);
        }
      }
    }
    cuda::set_row_kernel_tuning(guard.tuning);
    const double mf = static_cast<double>(m) * f;
    for (int rep = 0; rep < 2; ++rep) {
      for (const bool packed : {false, true}) {
        cuda::set_packed_row_kernels(packed);
        report(cat("swiglu_fp8 ", m, "x", f, " ", packed ? "bf16x2" : "fp32"),
               sustained_ms(g, [&] { return g->swiglu_fp8(h, act, act8, acts); }), 0,
               mf * 5 + 4.0 * m);
      }
    }
  }
}
