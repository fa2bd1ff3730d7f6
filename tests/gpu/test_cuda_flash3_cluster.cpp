// FlashAttention-3's kernels with clusters of two CTAs (CudaBackend::set_flash3_cluster(2):
// neighbouring query tiles share each K and V tile by TMA multicast; the query tiles rounded up to
// an even count, the extra tile's rows out of range). Each CTA sums the same keys in the same
// order as without clusters, so the outputs must be the same bytes: bf16 and e4m3 operands, odd
// and even tile counts (the DiT's 4160 tokens: 33 tiles), one tile, padded keys (a launch per
// item), and a whole forward recorded as a CUDA graph against eager and the one-CTA forward.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "gpu/cuda_test_util.h"
#include "gpu/dit_test_util.h"
#include "gpu/perf_test_util.h"
#include "io/weights/weights.h"
#include "model/common/linear.h"

namespace zimage::test {
namespace {

// max |a - b| (NaN where either holds one); infinity when the sizes differ.
double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return std::numeric_limits<double>::infinity();
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::fabs(static_cast<double>(a[i]) - b[i]);
    if (std::isnan(d)) return d;
    m = std::max(m, d);
  }
  return m;
}

// Restores the backend's cluster size and attention path when a test ends, however it ends.
struct ClusterGuard {
  cuda::CudaBackend* g;
  int was;
  explicit ClusterGuard(cuda::CudaBackend* b) : g(b), was(b->flash3_cluster()) {}
  ~ClusterGuard() {
    g->set_flash3_cluster(was);
    g->set_attention_path(cuda::AttentionPath::kAuto);
  }
};

TEST(CudaFlash3Cluster, Bf16SameBytesAsOneCta) {
  ZI_REQUIRE_GPU();
  cuda::CudaBackend* g = gpu(DType::kBF16);
  if (!g->has_flash3_attention()) GTEST_SKIP() << "no FlashAttention-3 kernel on this GPU/build";
  ClusterGuard guard(g);
  struct Case {
    int64_t b, sq, sk, h;
    std::vector<int32_t> key_len;
  };
  const Case cases[] = {
      {1, 4160, 4160, 30, {}},       // the DiT at 1024²: 33 query tiles, rounded up to 34
      {1, 256, 256, 2, {}},          // two tiles: no rounding
      {1, 77, 300, 4, {}},           // one tile, Sq != Sk
      {2, 600, 600, 6, {600, 544}},  // padded keys: one launch per item
      {2, 640, 640, 3, {}},          // a batch, five tiles an item
  };
  uint32_t seed = 8800;
  for (const Case& c : cases) {
    const Shape sq = {c.b, c.sq, c.h, 128}, sk = {c.b, c.sk, c.h, 128};
    Tensor q = take(g->upload(rand_host(sq, seed++, DType::kBF16, -2.f, 2.f), DType::kBF16), "q");
    Tensor k = take(g->upload(rand_host(sk, seed++, DType::kBF16, -2.f, 2.f), DType::kBF16), "k");
    Tensor v = take(g->upload(rand_host(sk, seed++, DType::kBF16), DType::kBF16), "v");
    AttentionParams p;
    p.scale = 1.0f / std::sqrt(128.0f);
    p.key_len = c.key_len;
    std::vector<float> got[2];
    g->set_attention_path(cuda::AttentionPath::kFlash3);
    for (int cl : {1, 2}) {
      Tensor o = take(g->alloc(DType::kBF16, sq), "o");
      ZI_ASSERT_OK(g->fill(o, std::numeric_limits<float>::quiet_NaN()));
      g->set_flash3_cluster(cl);
      ZI_ASSERT_OK(g->attention(q, k, v, p, o));
      got[cl - 1] = fetch(*g, o);
    }
    g->set_attention_path(cuda::AttentionPath::kGeneral);
    Tensor og = take(g->alloc(DType::kBF16, sq), "og");
    ZI_ASSERT_OK(g->attention(q, k, v, p, og));
    const std::string tag =
        cat("b", c.b, " q", c.sq, " k", c.sk, " h", c.h, c.key_len.empty() ? "" : " padded");
    EXPECT_EQ(max_diff(got[1], got[0]), 0.0) << tag << ": clusters of two differ from one CTA";
    EXPECT_EQ(got[1].size(), got[0].size());
    bool same = got[1].size() == got[0].size();
    for (size_t i = 0; same && i < got[0].size(); ++i)
      same = std::isfinite(got[1][i]) && got[1][i] == got[0][i];
    EXPECT_TRUE(same) << tag << ": a value differs or was not written (NaN)";
    expect_close("flash3, clusters of two, vs general " + tag, DType::kBF16, got[1], fetch(*g, og));
  }
}

TEST(CudaFlash3Cluster, Fp8SameBytesAsOneCta) {
  ZI_REQUIRE_GPU();
  cuda::CudaBackend* g = gpu(DType::kBF16);
  const Status support = g->fp8_attention_support();
  if (!support.ok()) GTEST_SKIP() << support.message();
  ClusterGuard guard(g);
  struct Case {
    int64_t b, s, h;
    std::vector<int32_t> key_len;
  };
  const Case cases[] = {{1, 4160, 30, {}}, {2, 600, 4, {600, 544}}, {1, 300, 2, {}}};
  constexpr int64_t d = 128;
  uint32_t seed = 8900;
  for (const Case& c : cases) {
    const int64_t f = 3 * c.h * d;
    Tensor qkv = take(
        g->upload(rand_host({c.b, c.s, f}, seed++, DType::kBF16, -2.f, 2.f), DType::kBF16), "qkv");
    Tensor wq =
        take(g->upload(rand_host({d}, seed++, DType::kBF16, 0.5f, 1.5f), DType::kBF16), "wq");
    Tensor wk =
        take(g->upload(rand_host({d}, seed++, DType::kBF16, 0.5f, 1.5f), DType::kBF16), "wk");
    Tensor fr = take(g->upload(rope_table(c.b, c.s, d, seed++), DType::kF32), "freqs");  // per item
    AttentionParams p;
    p.scale = 1.0f / std::sqrt(static_cast<float>(d));
    p.key_len = c.key_len;
    std::vector<float> got[2];
    for (int cl : {1, 2}) {
      Tensor o = take(g->alloc(DType::kBF16, {c.b, c.s, c.h, d}), "o");
      ZI_ASSERT_OK(g->fill(o, std::numeric_limits<float>::quiet_NaN()));
      g->set_flash3_cluster(cl);
      ZI_ASSERT_OK(g->attention_packed_fp8(qkv, c.h, c.h, wq, wk, 1e-6f, fr, p, o));
      got[cl - 1] = fetch(*g, o);
    }
    const std::string tag =
        cat("fp8 b", c.b, " s", c.s, " h", c.h, c.key_len.empty() ? "" : " padded");
    bool same = got[1].size() == got[0].size() && !got[0].empty();
    for (size_t i = 0; same && i < got[0].size(); ++i)
      same = std::isfinite(got[1][i]) && got[1][i] == got[0][i];
    EXPECT_TRUE(same) << tag << ": clusters of two differ from one CTA (max |diff| "
                      << max_diff(got[1], got[0]) << ")";
  }
}

// The path that ships, recorded: a forward recorded as a CUDA graph with clusters of two equals
// its eager run and the one-CTA forward bit for bit (bf16, and every linear and the attention in
// FP8). The small DiT's sequence (256 image tokens + 20 caption tokens padded to 32) is three
// query tiles, rounded up to four.
TEST(CudaFlash3Cluster, TransformerRecordedEqualsOneCta) {
  ZI_REQUIRE_GPU();
  cuda::CudaBackend* g = gpu(DType::kBF16);
  if (!g->has_flash3_attention()) GTEST_SKIP() << "no FlashAttention-3 kernel on this GPU/build";
  ClusterGuard guard(g);
  TransformerConfig cfg;
  const std::string dir = write_wide_dit(cfg, "zimage_flash3_cluster_dit");
  auto ws = WeightStore::open(dir);
  ASSERT_TRUE(ws.ok()) << ws.status().to_string();
  const Tensor lat = rand_host({1, 16, 32, 32}, 61, DType::kBF16);
  const Tensor cap = rand_host({20, cfg.cap_feat_dim}, 62, DType::kBF16);
  for (const bool fp8 : {false, true}) {
    if (fp8 && !g->fp8_attention_support().ok()) continue;
    WeightPlacement place;
    if (fp8) place.fp8_compute = kFp8Default | kFp8Sdpa;
    auto dit = ZImageDiT::load(cfg, *ws, *g, place);
    ASSERT_TRUE(dit.ok()) << dit.status().to_string();
    const char* tag = fp8 ? "fp8 all,sdpa" : "bf16";
    g->set_flash3_cluster(1);
    std::map<std::string, int64_t> calls;
    const Tensor one = profiled_forward(**dit, *g, lat, cap, calls);
    EXPECT_EQ(calls[fp8 ? "attention_packed_fp8" : "attention_packed"], 4)
        << tag << ": every block's attention (2 layers, 2 refiners)";
    g->set_flash3_cluster(2);
    const Tensor eager = profiled_forward(**dit, *g, lat, cap, calls);
    const Tensor recorded = forward(**dit, *g, lat, cap);
    const Tensor replayed = forward(**dit, *g, lat, cap);
    ASSERT_TRUE(one.defined() && eager.defined() && recorded.defined() && replayed.defined());
    EXPECT_EQ(values(eager), values(one)) << tag << ": clusters of two differ from one CTA";
    EXPECT_EQ(values(recorded), values(eager)) << tag << ": recorded differs from eager";
    EXPECT_EQ(values(replayed), values(eager)) << tag << ": replayed differs from eager";
    dit->reset();
  }
  std::filesystem::remove_all(dir);
}

// The defaults measured in session 33 (docs/BENCHMARKS.md): one CTA for bf16 (clusters of two
// gained nothing as whole forwards), two for e4m3 (6 ms of a 2048² FP8 forward).
TEST(CudaFlash3Cluster, DefaultsAreTheMeasuredChoice) {
  ZI_REQUIRE_GPU();
  if (std::getenv("ZIMAGE_FLASH3_CLUSTER") != nullptr)
    GTEST_SKIP() << "ZIMAGE_FLASH3_CLUSTER is set";
  cuda::CudaBackend* g = gpu(DType::kBF16);
  EXPECT_EQ(g->flash3_cluster(), 0);
  EXPECT_EQ(g->flash3_cluster_for(false), 1);
  EXPECT_EQ(g->flash3_cluster_for(true), 2);
}

// ZIMAGE_FLASH3_CLUSTER forces one size on both kernels; another value fails the backend's
// creation with a message naming the variable.
TEST(CudaFlash3Cluster, EnvSwitchSetsBothKernelsOrIsRefused) {
  ZI_REQUIRE_GPU();
  const char* was = std::getenv("ZIMAGE_FLASH3_CLUSTER");
  const std::string keep = was ? was : "";
  setenv("ZIMAGE_FLASH3_CLUSTER", "1", 1);
  auto one = cuda::CudaBackend::create(0, DType::kBF16);
  setenv("ZIMAGE_FLASH3_CLUSTER", "3", 1);
  auto bad = cuda::CudaBackend::create(0, DType::kBF16);
  if (was != nullptr)
    setenv("ZIMAGE_FLASH3_CLUSTER", keep.c_str(), 1);
  else
    unsetenv("ZIMAGE_FLASH3_CLUSTER");
  ASSERT_TRUE(one.ok()) << one.status().to_string();
  EXPECT_EQ((*one)->flash3_cluster_for(false), 1);
  EXPECT_EQ((*one)->flash3_cluster_for(true), 1);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("ZIMAGE_FLASH3_CLUSTER: '3'"), std::string::npos)
      << bad.status().message();
}

TEST(CudaFlash3Cluster, OtherSizesAreRefused) {
  ZI_REQUIRE_GPU();
  cuda::CudaBackend* g = gpu(DType::kBF16);
  if (!g->has_flash3_attention()) GTEST_SKIP() << "no FlashAttention-3 kernel on this GPU/build";
  ClusterGuard guard(g);
  const Shape s = {1, 64, 2, 128};
  Tensor q = take(g->upload(rand_host(s, 1, DType::kBF16), DType::kBF16), "q");
  Tensor o = take(g->alloc(DType::kBF16, s), "o");
  AttentionParams p;
  p.scale = 0.1f;
  g->set_attention_path(cuda::AttentionPath::kFlash3);
  g->set_flash3_cluster(4);
  const Status st = g->attention(q, q, q, p, o);
  EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument) << st.to_string();
  EXPECT_NE(st.message().find("clusters of 4"), std::string::npos) << st.message();
}

// Timings, one CTA against clusters of two, alternating, at the DiT's sequences (30 heads x 128):
// the bf16 kernel on the packed projection, and the whole FP8 attention (prologue, v, e4m3
// kernel), each as one call and sustained (10 calls back to back, as in a forward).
TEST(CudaOpsPerf, Flash3Clusters) {
  ZI_REQUIRE_GPU();
  cuda::CudaBackend* g = gpu(DType::kBF16);
  if (!g->has_flash3_attention()) GTEST_SKIP() << "no FlashAttention-3 kernel on this GPU/build";
  ClusterGuard guard(g);
  const bool fp8 = g->fp8_attention_support().ok();
  constexpr int64_t h = DitAttentionCase::h;
  uint32_t seed = 9100;
  for (int64_t s : {4160, 9280, 16448}) {
    DitAttentionCase c(g, s, seed);
    Tensor& o = c.o;
    const double flop = c.flop;
    const Tensor none;
    for (int round = 0; round < 2; ++round) {
      for (int cl : {1, 2}) {
        g->set_flash3_cluster(cl);
        g->set_attention_path(cuda::AttentionPath::kFlash3);
        auto bf16 = [&] { return g->attention_packed(c.qkv, h, h, c.p, o); };
        report(cat("flash3 bf16, cluster ", cl, ", 30 x ", s), median_ms(g, bf16), flop, 0);
        report(cat("flash3 bf16, cluster ", cl, ", 30 x ", s, " sustained"), sustained_ms(g, bf16),
               flop, 0);
        g->set_attention_path(cuda::AttentionPath::kAuto);
        if (!fp8) continue;
        auto f8 = [&] {
          return g->attention_packed_fp8(c.qkv, h, h, c.wq, c.wk, 1e-6f, none, c.p, o);
        };
        report(cat("attention fp8, cluster ", cl, ", 30 x ", s), median_ms(g, f8), flop, 0);
        report(cat("attention fp8, cluster ", cl, ", 30 x ", s, " sustained"), sustained_ms(g, f8),
               flop, 0);
      }
    }
  }
}

}  // namespace
}  // namespace zimage::test
