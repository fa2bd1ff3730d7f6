// W8A8 FP8 (--precision fp8) on the CPU oracle:
//  * matmul_fp8_rows' contract, checked against an independent double-precision evaluation of
//    the formula: activations quantised per row (token) with their own scale, so one row's
//    outlier does not coarsen the others (the failure of per-tensor activation scales);
//  * the layer-group names of --fp8-layers;
//  * the golden DiT with each layer group in FP8 stays close to the f32 model (cosine reported),
//    really differs from it (the FP8 path ran), and streams bit for bit like the resident one;
//  * the FP8 attention's oracle (attention_packed_fp8): close to exact attention, scale-exact
//    per v head, unsaturated where q passes e4m3's range before its scale, arguments checked.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "core/dtype.h"
#include "io/weights/weights.h"
#include "model/common/linear.h"
#include "parity/golden_models_util.h"

using namespace zimage;
using namespace zimage::golden;

namespace {

Tensor gaussian(Shape shape, uint32_t seed, float sigma) {
  Tensor t = Tensor::host(DType::kF32, shape);
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.f, sigma);
  for (int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = g(rng);
  return t;
}

// The formula of Backend::matmul_fp8_rows in double precision, quantising with the e4m3
// conversion of core/dtype.h (a different code path from the backend's row quantiser).
std::vector<double> reference_w8a8(const Tensor& x, const Tensor& w8, const Tensor& sw) {
  const int64_t m = x.dim(0), k = x.dim(1), n = w8.dim(0);
  std::vector<double> y(static_cast<size_t>(m * n));
  const auto* q = static_cast<const uint8_t*>(w8.data());
  for (int64_t r = 0; r < m; ++r) {
    const float* xr = x.data_as<float>() + r * k;
    float amax = 0;
    for (int64_t i = 0; i < k; ++i) amax = std::max(amax, std::fabs(xr[i]));
    const float sx = amax > 0 ? amax / 448.f : 1.f;
    std::vector<double> xq(static_cast<size_t>(k));
    for (int64_t i = 0; i < k; ++i)
      xq[i] = f8e4m3_to_f32(f32_to_f8e4m3(std::clamp(xr[i] * (1.f / sx), -448.f, 448.f)));
    for (int64_t c = 0; c < n; ++c) {
      double acc = 0;
      for (int64_t i = 0; i < k; ++i) acc += xq[i] * f8e4m3_to_f32(q[c * k + i]);
      y[r * n + c] = acc * sx * sw.data_as<float>()[c];
    }
  }
  return y;
}

double cosine(const Tensor& a, const Tensor& b) {
  double ab = 0, aa = 0, bb = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double x = a.data_as<float>()[i], y = b.data_as<float>()[i];
    ab += x * y, aa += x * x, bb += y * y;
  }
  return ab / std::sqrt(aa * bb);
}

double max_abs(const Tensor& a, const Tensor& b) {
  double m = 0;
  for (int64_t i = 0; i < a.numel(); ++i)
    m = std::max(m, std::fabs(static_cast<double>(a.data_as<float>()[i]) - b.data_as<float>()[i]));
  return m;
}

std::unique_ptr<ZImageDiT> dit_with(const Case& c, const WeightPlacement& p) {
  auto ws = WeightStore::open(c.dir + "/model/transformer");
  EXPECT_TRUE(ws.ok()) << ws.status().to_string();
  if (!ws.ok()) return nullptr;
  auto dit = ZImageDiT::load(c.dit, *ws, cpu(), p);
  EXPECT_TRUE(dit.ok()) << dit.status().to_string();
  return dit.ok() ? std::move(dit).value() : nullptr;
}

Tensor dit_step0(const Case& c, ZImageDiT& dit) {
  std::vector<Tensor> caps;
  for (size_t i = 0; i < c.ids.size(); ++i)
    caps.push_back(to_device(npy(c.dir + "/prompt_embeds_" + std::to_string(i) + ".npy")));
  Tensor out;
  const std::vector<float> t(caps.size(), t_model_at(c.steps, 0));
  const Status st = dit.forward(to_device(npy(c.dir + "/init_noise.npy")), t, caps, out);
  EXPECT_TRUE(st.ok()) << st.to_string();
  return st.ok() ? to_host(out) : Tensor();
}

}  // namespace

TEST(Fp8Compute, MatmulFp8RowsFollowsItsFormula) {
  const int64_t m = 9, k = 320, n = 24;
  Tensor x = gaussian({m, k}, 1, 1.f);
  for (int64_t i = 0; i < k; ++i) x.data_as<float>()[4 * k + i] *= 1e-3f;  // a quiet token
  x.data_as<float>()[2 * k + 5] = 2000.f;                                  // an outlier token
  Tensor w = gaussian({n, k}, 2, 0.05f);
  Tensor w8 = Tensor::host(DType::kF8E4M3, {n, k}), sw = Tensor::host(DType::kF32, {n});
  ASSERT_TRUE(cpu().quantize_fp8_rows(w, w8, sw).ok());
  Tensor bias = gaussian({n}, 3, 0.1f);
  Tensor y = Tensor::host(DType::kF32, {m, n});
  ASSERT_TRUE(cpu().matmul_fp8_rows(x, w8, sw, bias, y).ok());
  const std::vector<double> ref = reference_w8a8(x, w8, sw);
  double worst = 0;
  for (int64_t r = 0; r < m; ++r) {
    double row_max = 0;
    for (int64_t c = 0; c < n; ++c) row_max = std::max(row_max, std::fabs(ref[r * n + c]));
    for (int64_t c = 0; c < n; ++c) {
      const double want = ref[r * n + c] + bias.data_as<float>()[c];
      worst = std::max(worst, std::fabs(y.data_as<float>()[r * n + c] - want) /
                                  (row_max + std::fabs(bias.data_as<float>()[c])));
    }
  }
  report("matmul_fp8_rows vs double-precision formula (relative to each row's max)", worst);
  EXPECT_LT(worst, 1e-5);  // f32 accumulation only

  // Per-token scales: the quiet row keeps its precision although another row holds an outlier.
  // Against the exact f32 product its error is e4m3's (a few %), not the outlier's scale (which
  // would flush it to zero under a per-tensor scale).
  Tensor exact = Tensor::host(DType::kF32, {m, n}), wd = Tensor::host(DType::kF32, {n, k});
  ASSERT_TRUE(cpu().dequantize_fp8_rows(w8, sw, wd).ok());
  ASSERT_TRUE(cpu().matmul(x, wd, Tensor(), exact).ok());
  double num = 0, den = 0;
  for (int64_t c = 0; c < n; ++c) {
    const double e = exact.data_as<float>()[4 * n + c];
    const double g = y.data_as<float>()[4 * n + c] - bias.data_as<float>()[c];
    num += (g - e) * (g - e), den += e * e;
  }
  const double quiet_rel = std::sqrt(num / den);
  report("quiet token next to an outlier token: relative L2 error", quiet_rel);
  EXPECT_LT(quiet_rel, 0.05);

  // Shapes are checked.
  Tensor bad_scale = Tensor::host(DType::kF32, {n - 1});
  EXPECT_FALSE(cpu().matmul_fp8_rows(x, w8, bad_scale, Tensor(), y).ok());
  Tensor bad_x = Tensor::host(DType::kF32, {m, k + 1});
  EXPECT_FALSE(cpu().matmul_fp8_rows(bad_x, w8, sw, Tensor(), y).ok());
}

// The FP8-input ops (Backend::takes_fp8_inputs) on the CPU oracle: the norm's and SwiGLU's FP8
// rows are the op into act-dtype rows then quantize_fp8_rows, whatever the outputs' leading shape
// ([B, S, D] here), and matmul_fp8_quantized on those rows is matmul_fp8_rows of the act-dtype
// rows, bit for bit; a scale that does not match x8's rows is named.
TEST(Fp8Compute, Fp8InputOpsAreTheComposedOps) {
  Backend& be = cpu();
  ASSERT_TRUE(be.takes_fp8_inputs());
  const int64_t b = 2, s = 5, d = 64, f = 48;
  const float eps = 1e-6f;
  const Tensor x0 = gaussian({b, s, d}, 11, 2.f), y = gaussian({b, s, d}, 12, 5.f);
  const Tensor w = gaussian({d}, 13, 1.f), gate = gaussian({b, d}, 14, 1.f);
  const Tensor w_next = gaussian({d}, 15, 1.f), scale = gaussian({b, d}, 16, 1.f);
  auto copy = [](const Tensor& t) {
    Tensor c = Tensor::host(t.dtype(), t.shape());
    std::memcpy(c.data(), t.data(), t.nbytes());
    return c;
  };
  Tensor xa = copy(x0), xb = copy(x0);
  Tensor out = Tensor::host(DType::kF32, {b * s, d});
  Tensor q_ref = Tensor::host(DType::kF8E4M3, {b * s, d}),
         s_ref = Tensor::host(DType::kF32, {b * s});
  ASSERT_TRUE(be.residual_norm_gate_then_norm(xa, y, w, eps, gate, w_next, scale, out).ok());
  ASSERT_TRUE(be.quantize_fp8_rows(out, q_ref, s_ref).ok());
  Tensor tmp = Tensor::host(DType::kF32, {b * s, d});
  Tensor q = Tensor::host(DType::kF8E4M3, {b, s, d}), sc = Tensor::host(DType::kF32, {b, s});
  const Status st =
      be.residual_norm_gate_then_norm_fp8(xb, y, w, eps, gate, w_next, scale, tmp, q, sc);
  ASSERT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(std::memcmp(xa.data(), xb.data(), xa.nbytes()), 0);
  EXPECT_EQ(std::memcmp(q.data(), q_ref.data(), q.nbytes()), 0);
  EXPECT_EQ(std::memcmp(sc.data(), s_ref.data(), sc.nbytes()), 0);

  const Tensor h = gaussian({b * s, 2 * f}, 17, 3.f);
  Tensor act = Tensor::host(DType::kF32, {b * s, f});
  Tensor a8_ref = Tensor::host(DType::kF8E4M3, {b * s, f}),
         as_ref = Tensor::host(DType::kF32, {b * s});
  ASSERT_TRUE(be.swiglu(h, act).ok());
  ASSERT_TRUE(be.quantize_fp8_rows(act, a8_ref, as_ref).ok());
  Tensor act2 = Tensor::host(DType::kF32, {b * s, f});
  Tensor a8 = Tensor::host(DType::kF8E4M3, {b * s, f}), as = Tensor::host(DType::kF32, {b * s});
  ASSERT_TRUE(be.swiglu_fp8(h, act2, a8, as).ok());
  EXPECT_EQ(std::memcmp(a8.data(), a8_ref.data(), a8.nbytes()), 0);
  EXPECT_EQ(std::memcmp(as.data(), as_ref.data(), as.nbytes()), 0);

  const int64_t n = 24;
  Tensor w8 = Tensor::host(DType::kF8E4M3, {n, f}), sw = Tensor::host(DType::kF32, {n});
  ASSERT_TRUE(be.quantize_fp8_rows(gaussian({n, f}, 18, 0.05f), w8, sw).ok());
  const Tensor bias = gaussian({n}, 19, 0.1f);
  Tensor ya = Tensor::host(DType::kF32, {b * s, n}), yb = Tensor::host(DType::kF32, {b * s, n});
  ASSERT_TRUE(be.matmul_fp8_rows(act, w8, sw, bias, ya).ok());
  ASSERT_TRUE(be.matmul_fp8_quantized(a8, as, w8, sw, bias, yb).ok());
  EXPECT_EQ(std::memcmp(ya.data(), yb.data(), ya.nbytes()), 0);
  Tensor bad = Tensor::host(DType::kF32, {b * s - 1});
  const Status e = be.matmul_fp8_quantized(a8, bad, w8, sw, bias, yb);
  EXPECT_FALSE(e.ok());
  EXPECT_NE(e.message().find("x_scale"), std::string::npos) << e.to_string();
}

TEST(Fp8Compute, LayerNames) {
  EXPECT_EQ(*parse_fp8_layers("all"), static_cast<unsigned>(kFp8Default));
  EXPECT_EQ(*parse_fp8_layers("none"), 0u);
  EXPECT_EQ(*parse_fp8_layers("ffn"), static_cast<unsigned>(kFp8W13 | kFp8W2));
  EXPECT_EQ(*parse_fp8_layers("qkv,w2,refiners"),
            static_cast<unsigned>(kFp8Qkv | kFp8W2 | kFp8Refiners));
  EXPECT_EQ(fp8_layers_string(kFp8Default), "qkv,out,w13,w2,refiners");
  EXPECT_EQ(fp8_layers_string(0), "none");
  EXPECT_EQ(*parse_fp8_layers("sdpa"), static_cast<unsigned>(kFp8Sdpa));
  EXPECT_EQ(*parse_fp8_layers("all,sdpa"), static_cast<unsigned>(kFp8Default | kFp8Sdpa));
  EXPECT_EQ(fp8_layers_string(kFp8Default | kFp8Sdpa), "qkv,out,w13,w2,refiners,sdpa");
  EXPECT_EQ((kFp8Default & kFp8Sdpa), 0u) << "FP8 attention is opt-in, outside the default";
  for (const char* bad : {"", "qkv,", "mlp", "qkv,,out", "none,sdpa"}) {
    auto r = parse_fp8_layers(bad);
    EXPECT_FALSE(r.ok()) << bad;
  }
  auto r = parse_fp8_layers("qkv,mlp");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("'mlp'"), std::string::npos) << r.status().message();
}

TEST(Fp8Compute, GoldenDitPerLayerGroup) {
  const Case c = load_case("v_turbo");
  auto ref = dit_with(c, {});
  ASSERT_NE(ref, nullptr);
  const Tensor a = dit_step0(c, *ref);
  ASSERT_TRUE(a.defined());
  for (const char* groups :
       {"qkv", "out", "w13", "w2", "qkv,out,w13,w2", "all", "sdpa,refiners", "all,sdpa"}) {
    WeightPlacement p;
    p.fp8_compute = *parse_fp8_layers(groups);
    auto dit = dit_with(c, p);
    ASSERT_NE(dit, nullptr) << groups;
    EXPECT_EQ(dit->fp8_compute(), p.fp8_compute);
    const Tensor b = dit_step0(c, *dit);
    ASSERT_TRUE(b.defined()) << groups;
    const double cos = cosine(a, b);
    report(std::string("v_turbo dit W8A8 [") + groups + "] vs f32 (cosine " + std::to_string(cos) +
               ")",
           max_abs(a, b));
    EXPECT_GT(cos, 0.998) << groups;          // measured 0.99938 (all) to 0.99995
    EXPECT_GT(max_abs(a, b), 0.0) << groups;  // the FP8 path ran
  }
  // W8A8 and streaming together: the streamed model equals the resident one bit for bit.
  WeightPlacement p;
  p.fp8_compute = kFp8Default;
  auto resident = dit_with(c, p);
  p.streamed.assign(resident->num_blocks(), true);
  auto streamed = dit_with(c, p);
  ASSERT_NE(streamed, nullptr);
  EXPECT_EQ(max_abs(dit_step0(c, *resident), dit_step0(c, *streamed)), 0.0);
}

namespace {

// A packed projection [b, s, 3·h·dh] with its norm weights and RoPE table for the FP8 attention.
struct PackedAttention {
  int64_t b, s, h, dh;
  Tensor qkv, wq, wk, freqs;
};

PackedAttention packed_case(int64_t b, int64_t s, int64_t h, int64_t dh, uint32_t seed, float wq_hi,
                            float wk_hi) {
  PackedAttention c{b,
                    s,
                    h,
                    dh,
                    gaussian({b, s, 3 * h * dh}, seed, 1.f),
                    Tensor::host(DType::kF32, {dh}),
                    Tensor::host(DType::kF32, {dh}),
                    Tensor::host(DType::kF32, {b, s, dh / 2, 2})};
  std::mt19937 rng(seed + 1);
  std::uniform_real_distribution<float> u(0.f, 1.f);
  for (int64_t i = 0; i < dh; ++i) {
    c.wq.data_as<float>()[i] = wq_hi * (1.f + 2.f * u(rng)) / 3.f;
    c.wk.data_as<float>()[i] = wk_hi * (1.f + 2.f * u(rng)) / 3.f;
  }
  for (int64_t i = 0; i < c.freqs.numel() / 2; ++i) {
    const float a = 6.4f * u(rng) - 3.2f;
    c.freqs.data_as<float>()[2 * i] = std::cos(a);
    c.freqs.data_as<float>()[2 * i + 1] = std::sin(a);
  }
  return c;
}

Tensor run_fp8_attention(const PackedAttention& c, const AttentionParams& p) {
  Tensor out = Tensor::host(DType::kF32, {c.b, c.s, c.h, c.dh});
  const Status st = cpu().attention_packed_fp8(c.qkv, c.h, c.h, c.wq, c.wk, 1e-6f, c.freqs, p, out);
  EXPECT_TRUE(st.ok()) << st.to_string();
  return out;
}

Tensor run_exact_attention(const PackedAttention& c, const AttentionParams& p) {
  Tensor qkv = Tensor::host(DType::kF32, c.qkv.shape());
  std::memcpy(qkv.data(), c.qkv.data(), static_cast<size_t>(c.qkv.numel()) * 4);
  EXPECT_TRUE(cpu().qk_norm_rope_packed(qkv, c.h, c.h, c.wq, c.wk, 1e-6f, c.freqs).ok());
  Tensor out = Tensor::host(DType::kF32, {c.b, c.s, c.h, c.dh});
  EXPECT_TRUE(cpu().attention_packed(qkv, c.h, c.h, p, out).ok());
  return out;
}

double rel_l2(const Tensor& a, const Tensor& ref) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double d = static_cast<double>(a.data_as<float>()[i]) - ref.data_as<float>()[i];
    num += d * d;
    den += static_cast<double>(ref.data_as<float>()[i]) * ref.data_as<float>()[i];
  }
  return std::sqrt(num / den);
}

}  // namespace

TEST(Fp8Attention, OracleCloseToExactAttention) {
  AttentionParams p;
  p.scale = 1.f / std::sqrt(128.f);
  // Norm weights near 1, then q far past e4m3's 448 before its scale (k small, so the scores
  // stay as they were): a missing or wrong scale would saturate q and show here.
  for (auto [wq, wk] : {std::pair<float, float>{1.5f, 1.5f}, {300.f, 0.005f}}) {
    const PackedAttention c = packed_case(2, 96, 3, 128, 77, wq, wk);
    p.key_len = {96, 70};
    const Tensor fp8 = run_fp8_attention(c, p);
    const Tensor exact = run_exact_attention(c, p);
    const double e = rel_l2(fp8, exact);
    report("fp8 attention (oracle) vs exact, |wq| <= " + std::to_string(wq) + ": relative L2", e);
    EXPECT_LT(e, 0.06);  // e4m3's rounding of q, k and v
    EXPECT_GT(e, 1e-4);  // it rounded
  }
}

TEST(Fp8Attention, VScaleIsPerHeadAndExact) {
  // Scaling one v head by 2^10 scales its scale by 2^10 and leaves its e4m3 values as they were:
  // that head's output scales exactly, the other heads' outputs do not move.
  AttentionParams p;
  p.scale = 1.f / std::sqrt(128.f);
  PackedAttention c = packed_case(1, 40, 3, 128, 91, 1.f, 1.f);
  const Tensor before = run_fp8_attention(c, p);
  const int64_t f = 3 * c.h * c.dh, v1 = (2 * c.h + 1) * c.dh;  // v of head 1
  for (int64_t r = 0; r < c.s; ++r)
    for (int64_t i = 0; i < c.dh; ++i) c.qkv.data_as<float>()[r * f + v1 + i] *= 1024.f;
  const Tensor after = run_fp8_attention(c, p);
  for (int64_t r = 0; r < c.s; ++r)
    for (int64_t h = 0; h < c.h; ++h)
      for (int64_t i = 0; i < c.dh; ++i) {
        const int64_t at = (r * c.h + h) * c.dh + i;
        const float want = before.data_as<float>()[at] * (h == 1 ? 1024.f : 1.f);
        ASSERT_EQ(after.data_as<float>()[at], want) << "row " << r << " head " << h << " " << i;
      }
}

TEST(Fp8Attention, BadCallsAreNamed) {
  const PackedAttention c = packed_case(1, 8, 2, 128, 5, 1.f, 1.f);
  AttentionParams p;
  Tensor out = Tensor::host(DType::kF32, {1, 8, 2, 128});
  const Tensor none;
  const Status no_norm = cpu().attention_packed_fp8(c.qkv, 2, 2, none, none, 1e-6f, none, p, out);
  EXPECT_EQ(no_norm.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(no_norm.message().find("norm"), std::string::npos) << no_norm.message();
  const Status heads = cpu().attention_packed_fp8(c.qkv, 3, 2, c.wq, c.wk, 1e-6f, none, p, out);
  EXPECT_EQ(heads.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(heads.message().find("attention_packed_fp8"), std::string::npos) << heads.message();
  EXPECT_TRUE(cpu().fp8_attention_support().ok());
}
