// CPU attention against a double-precision softmax(scale · Q Kᵀ) V reference: plain, GQA,
// causal, key_len padding masks (including a fully masked batch item, which must give zeros, not
// NaN), Sq != Sk, and the argument errors.
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

}  // namespace
}  // namespace zimage::test
