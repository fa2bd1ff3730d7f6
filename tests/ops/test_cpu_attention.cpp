// CPU attention against a double-precision softmax(scale · Q Kᵀ) V reference: plain, GQA,
// causal, key_len padding masks (including a fully masked batch item, which must give zeros, not
// NaN), Sq != Sk, and the argument errors.
#include <cstdio>

#include "backend/cpu/cpu_backend.h"
#include "test_cpu_util.h"

namespace zimage::test {
namespace {

std::vector<double> ref_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                  const AttentionParams& p) {
  const int64_t b = q.dim(0), sq = q.dim(1), hq = q.dim(2), d = q.dim(3);
  const int64_t sk = k.dim(1), hkv = k.dim(2), group = hq / hkv;
  std::vector<double> out(static_cast<size_t>(q.numel()), 0.0);
  std::vector<double> w(static_cast<size_t>(sk));
  for (int64_t bi = 0; bi < b; ++bi) {
    const int64_t klen = p.key_len.empty() ? sk : p.key_len[static_cast<size_t>(bi)];
    for (int64_t h = 0; h < hq; ++h) {
      const int64_t kh = h / group;
      for (int64_t i = 0; i < sq; ++i) {
        const int64_t valid = p.causal ? std::min(klen, i + 1) : klen;
        if (valid <= 0) continue;  // all keys masked: zeros
        double mx = -1e300;
        for (int64_t j = 0; j < valid; ++j) {
          double s = 0.0;
          for (int64_t c = 0; c < d; ++c) {
            s +=
                at(q, ((bi * sq + i) * hq + h) * d + c) * at(k, ((bi * sk + j) * hkv + kh) * d + c);
          }
          w[static_cast<size_t>(j)] = s * p.scale;
          mx = std::max(mx, w[static_cast<size_t>(j)]);
        }
        double sum = 0.0;
        for (int64_t j = 0; j < valid; ++j) {
          w[static_cast<size_t>(j)] = std::exp(w[static_cast<size_t>(j)] - mx);
          sum += w[static_cast<size_t>(j)];
        }
        for (int64_t c = 0; c < d; ++c) {
          double o = 0.0;
          for (int64_t j = 0; j < valid; ++j) {
            o += w[static_cast<size_t>(j)] * at(v, ((bi * sk + j) * hkv + kh) * d + c);
          }
          out[static_cast<size_t>(((bi * sq + i) * hq + h) * d + c)] = o / sum;
        }
      }
    }
  }
  return out;
}

struct AttnCase {
  const char* name;
  int64_t b, sq, sk, hq, hkv, d;
  bool causal;
  std::vector<int32_t> key_len;
};

TEST(CpuOps, AttentionMasksAndGqa) {
  const AttnCase cases[] = {
      {"attention plain", 1, 17, 17, 2, 2, 16, false, {}},
      {"attention gqa 6/2", 2, 33, 33, 6, 2, 8, false, {}},
      {"attention gqa 4/1 causal", 1, 100, 100, 4, 1, 32, true, {}},
      {"attention key_len", 3, 20, 20, 2, 1, 16, false, {20, 7, 1}},
      {"attention causal + key_len", 2, 17, 17, 3, 3, 12, true, {17, 5}},
      {"attention sq != sk", 2, 5, 33, 2, 1, 16, false, {33, 30}},
      {"attention head dim 1", 1, 3, 3, 1, 1, 1, false, {}},
  };
  uint32_t seed = 500;
  for (const AttnCase& c : cases) {
    Tensor q = rand_f32({c.b, c.sq, c.hq, c.d}, seed++, -2.0f, 2.0f);
    Tensor k = rand_f32({c.b, c.sk, c.hkv, c.d}, seed++, -2.0f, 2.0f);
    Tensor v = rand_f32({c.b, c.sk, c.hkv, c.d}, seed++);
    Tensor out = f32({c.b, c.sq, c.hq, c.d});
    AttentionParams p;
    p.scale = 1.0f / std::sqrt(static_cast<float>(c.d));
    p.causal = c.causal;
    p.key_len = c.key_len;
    Status s = cpu().attention(q, k, v, p, out);
    ASSERT_TRUE(s.ok()) << c.name << ": " << s.to_string();
    expect_close(c.name, out, ref_attention(q, k, v, p), 1e-5, 1e-5);
  }
}

TEST(CpuOps, AttentionFullyMaskedRowsAreZero) {
  Tensor q = rand_f32({2, 4, 2, 8}, 600), k = rand_f32({2, 6, 2, 8}, 601);
  Tensor v = rand_f32({2, 6, 2, 8}, 602);
  Tensor out = rand_f32({2, 4, 2, 8}, 603);  // garbage that must be overwritten
  AttentionParams p;
  p.scale = 0.35f;
  p.key_len = {0, 6};
  ASSERT_TRUE(cpu().attention(q, k, v, p, out).ok());
  for (int64_t i = 0; i < 4 * 2 * 8; ++i) ASSERT_EQ(at(out, i), 0.0) << i;
  for (int64_t i = 0; i < out.numel(); ++i) ASSERT_TRUE(std::isfinite(at(out, i))) << i;
  expect_close("attention key_len {0, 6}", out, ref_attention(q, k, v, p), 1e-5, 1e-5);
}

TEST(CpuOps, AttentionLargeLogitsStayFinite) {
  // Logits of a few hundred: only max subtraction keeps exp() finite.
  Tensor q = rand_f32({1, 9, 1, 16}, 610, 4.0f, 6.0f), k = rand_f32({1, 9, 1, 16}, 611, 4.0f, 6.0f);
  Tensor v = rand_f32({1, 9, 1, 16}, 612), out = f32({1, 9, 1, 16});
  AttentionParams p;
  p.scale = 1.0f;
  ASSERT_TRUE(cpu().attention(q, k, v, p, out).ok());
  expect_close("attention logits ~400", out, ref_attention(q, k, v, p), 1e-4, 1e-4);
}

TEST(CpuOps, AttentionErrors) {
  Tensor q = rand_f32({1, 4, 3, 8}, 1), k = rand_f32({1, 4, 2, 8}, 2),
         v = rand_f32({1, 4, 2, 8}, 3);
  Tensor out = f32({1, 4, 3, 8});
  AttentionParams p;
  expect_invalid(cpu().attention(q, k, v, p, out), "3 query heads are not a multiple of 2");
  Tensor k3 = rand_f32({1, 4, 3, 8}, 4), v3 = rand_f32({1, 4, 3, 8}, 5);
  p.key_len = {5};
  expect_invalid(cpu().attention(q, k3, v3, p, out), "key_len[0] = 5 is outside [0, 4]");
  p.key_len = {1, 2};
  expect_invalid(cpu().attention(q, k3, v3, p, out), "key_len has 2 entries for batch 1");
  p.key_len.clear();
  Tensor v_bad = rand_f32({1, 5, 3, 8}, 6);
  expect_invalid(cpu().attention(q, k3, v_bad, p, out), "shapes differ");
  Tensor k_bad = rand_f32({1, 4, 3, 4}, 7);
  expect_invalid(cpu().attention(q, k_bad, k_bad, p, out), "batch or head dim differs");
  expect_invalid(cpu().attention(q, k3, v3, p, q), "out f32[1, 4, 3, 8] overlaps q");
}

// The score buffer is bounded (query blocks of attention_score_floats / Sk rows): the VAE's
// single-head attention over every latent pixel never builds the [N, N] matrix. Blocks of 1, 7
// and 64 query rows (the last one ragged) against one block holding every row: the rows are
// computed by the same code on the same data, so the outputs agree to a few ulps (BLAS picks
// another kernel for another M). Measured: 0 for blocks of 64 rows, up to 3.3e-7 for 1 and 7.
TEST(CpuOps, AttentionQueryBlocksMatchOneBlock) {
  cpu::CpuBackend be(2);
  struct Shape4 {
    int64_t b, sq, sk, h, d;
    bool causal;
    std::vector<int32_t> key_len;
  };
  const Shape4 shapes[] = {
      {1, 301, 301, 1, 64, false, {}},  // the VAE's shape: one head over every pixel
      {2, 130, 97, 2, 16, false, {97, 40}},
      {1, 150, 150, 2, 32, true, {}},
  };
  uint32_t seed = 700;
  for (const Shape4& c : shapes) {
    Tensor q = rand_f32({c.b, c.sq, c.h, c.d}, seed++, -2.0f, 2.0f);
    Tensor k = rand_f32({c.b, c.sk, c.h, c.d}, seed++, -2.0f, 2.0f);
    Tensor v = rand_f32({c.b, c.sk, c.h, c.d}, seed++);
    AttentionParams p;
    p.scale = 1.0f / std::sqrt(static_cast<float>(c.d));
    p.causal = c.causal;
    p.key_len = c.key_len;
    be.set_attention_score_floats(c.sq * c.sk);  // one block
    Tensor whole = f32({c.b, c.sq, c.h, c.d});
    ASSERT_TRUE(be.attention(q, k, v, p, whole).ok());
    expect_close("attention one block", whole, ref_attention(q, k, v, p), 1e-5, 1e-5);
    for (int64_t rows : {int64_t{1}, int64_t{7}, int64_t{64}}) {
      be.set_attention_score_floats(rows * c.sk);
      Tensor sliced = f32({c.b, c.sq, c.h, c.d});
      ASSERT_TRUE(be.attention(q, k, v, p, sliced).ok());
      double worst = 0;
      for (int64_t i = 0; i < whole.numel(); ++i)
        worst = std::max(worst, std::fabs(at(sliced, i) - at(whole, i)));
      std::printf(
          "  attention [%lld, %lld] x %lld, blocks of %lld rows: max |sliced - whole| %.2e\n",
          static_cast<long long>(c.sq), static_cast<long long>(c.sk), static_cast<long long>(c.d),
          static_cast<long long>(rows), worst);
      EXPECT_LE(worst, 1e-6) << rows << " rows per block";
    }
  }
  be.set_attention_score_floats(0);  // below one row: still one row per block, not a failure
  Tensor q = rand_f32({1, 5, 1, 8}, 800), k = rand_f32({1, 5, 1, 8}, 801);
  Tensor v = rand_f32({1, 5, 1, 8}, 802), out = f32({1, 5, 1, 8});
  AttentionParams p;
  p.scale = 0.3f;
  ASSERT_TRUE(be.attention(q, k, v, p, out).ok());
  expect_close("attention blocks of 1 row", out, ref_attention(q, k, v, p), 1e-5, 1e-5);
}

}  // namespace
}  // namespace zimage::test
