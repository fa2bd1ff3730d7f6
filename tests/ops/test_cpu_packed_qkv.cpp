// The packed attention ops' defaults (Backend::qk_norm_rope_packed, Backend::attention_packed) on
// the CPU oracle: the same bits as splitting the projection with qkv_split_norm_rope and calling
// attention() on the parts; v left untouched in place; bad shapes named. A backend that works in
// place (CUDA) is held to these in tests/gpu/test_cuda_ops.cpp.
#include <cstring>

#include "test_cpu_util.h"

namespace zimage::test {
namespace {

#define ZI_EXPECT_DONE(expr)                                       \
  do {                                                             \
    const ::zimage::Status zi_s_ = (expr);                         \
    ASSERT_TRUE(zi_s_.ok()) << #expr << ": " << zi_s_.to_string(); \
  } while (0)

// The packed projection's columns [c0, c0 + w) of every row, as a [rows, w] tensor.
Tensor columns(const Tensor& packed, int64_t c0, int64_t w) {
  const int64_t rows = packed.numel() / packed.dim(-1), f = packed.dim(-1);
  Tensor t = f32({rows, w});
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(t.data_as<float>() + r * w, packed.data_as<const float>() + r * f + c0,
                static_cast<size_t>(w) * sizeof(float));
  return t;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.numel() == b.numel() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

struct Case {
  int64_t b, s, hq, hkv, dh;
  bool norm, rope, shared;
};

TEST(CpuOps, QkNormRopePackedIsTheSplitInPlace) {
  const Case cases[] = {{1, 9, 3, 3, 8, true, true, false},
                        {2, 5, 4, 2, 16, true, true, true},
                        {2, 7, 2, 1, 6, false, true, false},
                        {1, 4, 2, 2, 4, true, false, false}};
  uint32_t seed = 7100;
  for (const Case& c : cases) {
    const int64_t rows = c.b * c.s, f = (c.hq + 2 * c.hkv) * c.dh;
    const Tensor qkv = rand_f32({c.b, c.s, f}, seed++, -3.f, 3.f);
    const Tensor wq = rand_f32({c.dh}, seed++, 0.5f, 1.5f), wk = rand_f32({c.dh}, seed++);
    const Tensor fr = rand_f32({c.shared ? 1 : c.b, c.s, c.dh / 2, 2}, seed++);
    const Tensor none;
    Tensor q = f32({c.b, c.s, c.hq, c.dh}), k = f32({c.b, c.s, c.hkv, c.dh}),
           v = f32({c.b, c.s, c.hkv, c.dh});
    ZI_EXPECT_DONE(cpu().qkv_split_norm_rope(qkv.view({rows, f}), c.norm ? wq : none,
                                             c.norm ? wk : none, 1e-6f, c.rope ? fr : none, q, k,
                                             v));
    Tensor packed = copy_of(qkv);
    ZI_EXPECT_DONE(cpu().qk_norm_rope_packed(packed, c.hq, c.hkv, c.norm ? wq : none,
                                             c.norm ? wk : none, 1e-6f, c.rope ? fr : none));
    const int64_t dq = c.hq * c.dh, dkv = c.hkv * c.dh;
    EXPECT_TRUE(same_bits(columns(packed, 0, dq), q.view({rows, dq}))) << "q, dh " << c.dh;
    EXPECT_TRUE(same_bits(columns(packed, dq, dkv), k.view({rows, dkv}))) << "k, dh " << c.dh;
    EXPECT_TRUE(same_bits(columns(packed, dq + dkv, dkv), columns(qkv, dq + dkv, dkv)))
        << "v must be left as it was";
    // And the op did something: q differs from the projection's q wherever norm or RoPE ran.
    EXPECT_FALSE(same_bits(columns(packed, 0, dq), columns(qkv, 0, dq)));
  }
}

TEST(CpuOps, AttentionPackedIsAttentionOfTheParts) {
  struct A {
    int64_t b, s, hq, hkv, d;
    std::vector<int32_t> key_len;
  };
  const A cases[] = {{1, 13, 2, 2, 8, {}}, {2, 11, 4, 2, 16, {11, 6}}, {2, 5, 3, 1, 4, {}}};
  uint32_t seed = 7200;
  for (const A& c : cases) {
    const int64_t f = (c.hq + 2 * c.hkv) * c.d;
    const Tensor qkv = rand_f32({c.b, c.s, f}, seed++, -2.f, 2.f);
    const int64_t dq = c.hq * c.d, dkv = c.hkv * c.d;
    const Tensor q = columns(qkv, 0, dq).view({c.b, c.s, c.hq, c.d});
    const Tensor k = columns(qkv, dq, dkv).view({c.b, c.s, c.hkv, c.d});
    const Tensor v = columns(qkv, dq + dkv, dkv).view({c.b, c.s, c.hkv, c.d});
    AttentionParams p;
    p.scale = 0.3f;
    p.key_len = c.key_len;
    Tensor want = f32({c.b, c.s, c.hq, c.d}), got = f32({c.b, c.s, c.hq, c.d});
    ZI_EXPECT_DONE(cpu().attention(q, k, v, p, want));
    ZI_EXPECT_DONE(cpu().attention_packed(qkv, c.hq, c.hkv, p, got));
    EXPECT_TRUE(same_bits(want, got)) << "b " << c.b << " hq " << c.hq << " hkv " << c.hkv;
  }
}

TEST(CpuOps, PackedQkvShapesAreChecked) {
  Tensor qkv = rand_f32({1, 4, 3 * 2 * 8}, 7300);  // 3 × 2 heads of 8
  AttentionParams p;
  Tensor out = f32({1, 4, 2, 8});
  const Tensor none;
  // Hq 3 with Hkv 2: not a whole GQA ratio (and 7 heads do not divide the row of 48); no query
  // heads; no KV heads. Then a projection that is not [B, S, F].
  for (auto [hq, hkv] : {std::pair<int64_t, int64_t>{3, 2}, {0, 1}, {2, 0}}) {
    const Status a = cpu().attention_packed(qkv, hq, hkv, p, out);
    EXPECT_EQ(a.code(), ErrorCode::kInvalidArgument) << hq << "/" << hkv;
    EXPECT_NE(a.message().find("attention_packed"), std::string::npos) << a.message();
    const Status n = cpu().qk_norm_rope_packed(qkv, hq, hkv, none, none, 1e-6f, none);
    EXPECT_EQ(n.code(), ErrorCode::kInvalidArgument) << hq << "/" << hkv;
  }
  Tensor flat = rand_f32({4, 48}, 7301);
  EXPECT_EQ(cpu().attention_packed(flat, 2, 2, p, out).code(), ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace zimage::test
