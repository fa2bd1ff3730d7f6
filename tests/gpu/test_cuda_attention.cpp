// CUDA attention against the CPU oracle: the flash kernel (bf16, head_dim 64/128) and the general
// path (any head_dim, f32, forced for bf16 too), with GQA, causal masks (Sq != Sk included),
// key_len padding (a fully masked batch item must give zeros), S > 1000 with head_dim 128, and
// the VAE's single 512-wide head; FlashInfer's Hopper (FA3) kernel and FlashAttention-3's own
// (non-causal head_dim 128, ungrouped) where the GPU has them, at the DiT's 1024^2 shape too; long
// key rows for the general path's softmax (kept on chip up to 65536 keys, read three times past it,
// and with the hook off). A DiT-sized case (30 heads x 4224 x 128) checks the flash kernel against
// the general path on the GPU alone.
#include <cmath>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "cuda_test_util.h"

namespace zimage::test {
namespace {

struct AttnCase {
  int64_t b, sq, sk, hq, hkv, d;
  bool causal;
  std::vector<int32_t> key_len;
};

std::string describe(const AttnCase& c) {
  std::string s = cat("attn b", c.b, " q", c.sq, " k", c.sk, " h", c.hq, "/", c.hkv, " d", c.d);
  if (c.causal) s += " causal";
  if (!c.key_len.empty()) {
    s += " len";
    for (int32_t l : c.key_len) s += cat(" ", l);
  }
  return s;
}

void run_case(const AttnCase& c, DType dt, cuda::AttentionPath path, uint32_t seed) {
  cuda::CudaBackend* g = gpu(dt);
  Both q = both_rand({c.b, c.sq, c.hq, c.d}, seed, dt);
  Both k = both_rand({c.b, c.sk, c.hkv, c.d}, seed + 1, dt);
  Both v = both_rand({c.b, c.sk, c.hkv, c.d}, seed + 2, dt);
  Both o = outputs({c.b, c.sq, c.hq, c.d}, dt);
  AttentionParams p;
  p.scale = 1.0f / std::sqrt(static_cast<float>(c.d));
  p.causal = c.causal;
  p.key_len = c.key_len;
  ZI_ASSERT_OK(cpu_oracle().attention(q.cpu, k.cpu, v.cpu, p, o.cpu));
  g->set_attention_path(path);
  const Status st = g->attention(q.gpu, k.gpu, v.gpu, p, o.gpu);
  g->set_attention_path(cuda::AttentionPath::kAuto);
  const bool library = path == cuda::AttentionPath::kCudnn || path == cuda::AttentionPath::kFa3 ||
                       path == cuda::AttentionPath::kFlash3;
  if (library && st.code() == ErrorCode::kUnsupported) {
    // cuDNN may have no engine for an odd shape, the Hopper kernels refuse some masks and shapes;
    // kAuto then falls back. Say so, visibly.
    std::printf("  %s [%s]: unsupported (%s)\n", describe(c).c_str(),
                path == cuda::AttentionPath::kFa3      ? "fa3"
                : path == cuda::AttentionPath::kFlash3 ? "flash3"
                                                       : "cudnn",
                st.message().c_str());
    return;
  }
  ZI_ASSERT_OK(st);
  const char* tag = path == cuda::AttentionPath::kCudnn                       ? " [cudnn]"
                    : path == cuda::AttentionPath::kFa3                       ? " [fa3]"
                    : path == cuda::AttentionPath::kFlash3                    ? " [flash3]"
                    : path == cuda::AttentionPath::kAuto                      ? " [auto]"
                    : path != cuda::AttentionPath::kFlash                     ? " [general]"
                    : g->flash_variant() == cuda::FlashVariant::kQInRegisters ? " [flash, Q regs]"
                                                                              : " [flash, Q smem]";
  expect_match(describe(c) + tag, dt, o);
  // A fully masked item must be exactly zero.
  for (size_t bi = 0; bi < c.key_len.size(); ++bi) {
    if (c.key_len[bi] != 0) continue;
    std::vector<float> got = fetch(*g, o.gpu);
    const int64_t per = c.sq * c.hq * c.d;
    int64_t nonzero = 0;
    for (int64_t i = 0; i < per; ++i) nonzero += got[bi * per + i] != 0.f;
    EXPECT_EQ(nonzero, 0) << describe(c) << tag << ": masked item " << bi << " not zero";
  }
}

TEST(CudaOps, AttentionAgainstCpu) {
  ZI_REQUIRE_GPU();
  const AttnCase cases[] = {
      {1, 17, 17, 2, 2, 16, false, {}},
      {2, 33, 33, 6, 2, 8, false, {}},
      {1, 100, 100, 4, 1, 32, true, {}},
      {1, 1, 1, 1, 1, 128, false, {}},
      {2, 1031, 1031, 4, 2, 128, false, {1031, 700}},
      {1, 1031, 1031, 2, 2, 128, true, {}},
      {2, 77, 300, 4, 4, 128, false, {300, 0}},
      {1, 77, 300, 4, 4, 128, false, {}},  // non-causal Sq != Sk (FlashAttention-3 takes it)
      {1, 129, 200, 2, 1, 64, true, {}},
      {2, 130, 65, 8, 2, 64, true, {65, 33}},
      {1, 300, 257, 1, 1, 512, false, {}},
      {1, 4160, 4160, 2, 2, 128, false, {}},          // the DiT's sequence at 1024^2
      {2, 600, 600, 30, 30, 128, false, {600, 544}},  // a ragged DiT batch (padded caption)
      {1, 77, 77, 32, 8, 128, true, {}},              // Qwen3: causal, grouped KV heads
      {1, 200, 200, 4, 4, 256, false, {}},
      // The general path's softmax with the row on chip: in registers (up to 16384 keys), half in
      // shared memory (up to 65536), masked; and past it (65540 keys: read three times).
      {1, 24, 16384, 1, 1, 16, false, {}},
      {2, 24, 20000, 2, 1, 8, true, {20000, 12345}},
      {1, 8, 65536, 1, 1, 8, false, {}},
      {1, 8, 65540, 1, 1, 8, false, {}},
  };
  uint32_t seed = 1000;
  for (DType dt : kDTypes) {
    for (const AttnCase& c : cases) {
      run_case(c, dt, cuda::AttentionPath::kGeneral, seed);
      run_case(c, dt, cuda::AttentionPath::kAuto, seed);  // the dispatch that ships
      if (dt == DType::kBF16 && (c.d == 64 || c.d == 128)) {
        cuda::CudaBackend* g = gpu(dt);
        const cuda::FlashVariant keep = g->flash_variant();
        for (auto v : {cuda::FlashVariant::kQInRegisters, cuda::FlashVariant::kQInShared}) {
          g->set_flash_variant(v);
          run_case(c, dt, cuda::AttentionPath::kFlash, seed);
        }
        g->set_flash_variant(keep);
        if (g->has_cudnn_attention()) run_case(c, dt, cuda::AttentionPath::kCudnn, seed);
      }
      if (dt == DType::kBF16 && gpu(dt)->has_fa3_attention())
        run_case(c, dt, cuda::AttentionPath::kFa3, seed);
      if (dt == DType::kBF16 && gpu(dt)->has_flash3_attention())
        run_case(c, dt, cuda::AttentionPath::kFlash3, seed);
      seed += 3;
    }
  }
}

TEST(CudaOps, FlashMatchesGeneralAtDitSize) {
  ZI_REQUIRE_GPU();
  cuda::CudaBackend* g = gpu(DType::kBF16);
  const Shape s = {1, 4224, 30, 128};
  Tensor q = take(g->upload(rand_host(s, 1100, DType::kBF16, -2.f, 2.f), DType::kBF16), "q");
  Tensor k = take(g->upload(rand_host(s, 1101, DType::kBF16, -2.f, 2.f), DType::kBF16), "k");
  Tensor v = take(g->upload(rand_host(s, 1102, DType::kBF16), DType::kBF16), "v");
  Tensor of = take(g->alloc(DType::kBF16, s), "of");
  Tensor og = take(g->alloc(DType::kBF16, s), "og");
  ZI_ASSERT_OK(g->fill(of, std::numeric_limits<float>::quiet_NaN()));
  ZI_ASSERT_OK(g->fill(og, std::numeric_limits<float>::quiet_NaN()));
  AttentionParams p;
  p.scale = 1.0f / std::sqrt(128.0f);
  g->set_attention_path(cuda::AttentionPath::kFlash);
  ZI_ASSERT_OK(g->attention(q, k, v, p, of));
  g->set_attention_path(cuda::AttentionPath::kGeneral);
  ZI_ASSERT_OK(g->attention(q, k, v, p, og));
  g->set_attention_path(cuda::AttentionPath::kAuto);
  expect_close("attn 30 x 4224 x 128 flash vs general", DType::kBF16, fetch(*g, of), fetch(*g, og));
}

// The library kernels on the shapes zimage runs, cuDNN's fused attention, FlashInfer's Hopper
// (FA3) kernel and FlashAttention-3's own: the DiT (30 heads x 4224 x 128, its 1024^2, 1536^2
// and 2048^2 sequences, batch 2 with key padding), the text encoder (causal GQA 32/8; FA3 only
// unpadded, its causal mask being bottom-right aligned; FlashAttention-3 is built for the DiT's
// case only). Each must be supported where it is meant to be (no silent fallback) and match the
// general path.
TEST(CudaOps, LibraryAttentionAtModelShapes) {
  ZI_REQUIRE_GPU();
  cuda::CudaBackend* g = gpu(DType::kBF16);
  if (!g->has_cudnn_attention() && !g->has_fa3_attention())
    GTEST_SKIP() << "built without cuDNN attention and FA3 attention";
  const AttnCase cases[] = {
      {1, 4224, 4224, 30, 30, 128, false, {}},   {2, 4160, 4160, 30, 30, 128, false, {4160, 4128}},
      {2, 64, 64, 30, 30, 128, false, {64, 32}}, {2, 35, 35, 32, 8, 128, true, {35, 20}},
      {1, 35, 35, 32, 8, 128, true, {}},         {1, 9280, 9280, 30, 30, 128, false, {}},
      {1, 16448, 16448, 30, 30, 128, false, {}},
  };
  uint32_t seed = 1200;
  for (const AttnCase& c : cases) {
    Tensor q = take(
        g->upload(rand_host({c.b, c.sq, c.hq, c.d}, seed, DType::kBF16, -2.f, 2.f), DType::kBF16),
        "q");
    Tensor k = take(g->upload(rand_host({c.b, c.sk, c.hkv, c.d}, seed + 1, DType::kBF16, -2.f, 2.f),
                              DType::kBF16),
                    "k");
    Tensor v = take(
        g->upload(rand_host({c.b, c.sk, c.hkv, c.d}, seed + 2, DType::kBF16), DType::kBF16), "v");
    seed += 3;
    AttentionParams p;
    p.scale = 1.0f / std::sqrt(static_cast<float>(c.d));
    p.causal = c.causal;
    p.key_len = c.key_len;
    Tensor og = take(g->alloc(DType::kBF16, q.shape()), "og");
    ZI_ASSERT_OK(g->fill(og, std::numeric_limits<float>::quiet_NaN()));
    g->set_attention_path(cuda::AttentionPath::kGeneral);
    ZI_ASSERT_OK(g->attention(q, k, v, p, og));
    g->set_attention_path(cuda::AttentionPath::kAuto);
    const bool fa3_takes = !(c.causal && !c.key_len.empty());
    const bool flash3_takes = !c.causal && c.hq == c.hkv && c.d == 128;
    for (auto [path, name, have] :
         {std::tuple{cuda::AttentionPath::kCudnn, "cudnn", g->has_cudnn_attention()},
          std::tuple{cuda::AttentionPath::kFa3, "fa3", g->has_fa3_attention() && fa3_takes},
          std::tuple{cuda::AttentionPath::kFlash3, "flash3",
                     g->has_flash3_attention() && flash3_takes}}) {
      if (!have) continue;
      Tensor oc = take(g->alloc(DType::kBF16, q.shape()), "oc");
      ZI_ASSERT_OK(g->fill(oc, std::numeric_limits<float>::quiet_NaN()));
      g->set_attention_path(path);
      const Status st = g->attention(q, k, v, p, oc);
      g->set_attention_path(cuda::AttentionPath::kAuto);
      ASSERT_TRUE(st.ok()) << describe(c) << " " << name << ": " << st.to_string();
      expect_close(describe(c) + " " + name + " vs general", DType::kBF16, fetch(*g, oc),
                   fetch(*g, og));
    }
  }
}

// The general path's query chunks (the score budget): forced to several chunks (one, a few and
// an odd remainder of rows), the output matches the CPU oracle and the one-chunk run, for the
// VAE's single 512-wide head and a GQA case with padded keys.
TEST(CudaOps, AttentionGeneralChunksMatchOneChunk) {
  ZI_REQUIRE_GPU();
  const AttnCase cases[] = {{1, 1000, 1000, 1, 1, 512, false, {}},
                            {2, 301, 257, 4, 2, 64, false, {257, 100}}};
  for (DType dt : kDTypes) {
    cuda::CudaBackend* g = gpu(dt);
    uint32_t seed = 2500;
    for (const AttnCase& c : cases) {
      Both q = both_rand({c.b, c.sq, c.hq, c.d}, seed++, dt);
      Both k = both_rand({c.b, c.sk, c.hkv, c.d}, seed++, dt);
      Both v = both_rand({c.b, c.sk, c.hkv, c.d}, seed++, dt);
      AttentionParams p;
      p.scale = 1.0f / std::sqrt(static_cast<float>(c.d));
      p.key_len = c.key_len;
      Both one = outputs({c.b, c.sq, c.hq, c.d}, dt);
      ZI_ASSERT_OK(cpu_oracle().attention(q.cpu, k.cpu, v.cpu, p, one.cpu));
      g->set_attention_path(cuda::AttentionPath::kGeneral);
      const Status st1 = g->attention(q.gpu, k.gpu, v.gpu, p, one.gpu);  // the default budget
      if (!st1.ok()) g->set_attention_path(cuda::AttentionPath::kAuto);
      ZI_ASSERT_OK(st1);
      expect_match(describe(c) + " [general, one chunk]", dt, one);
      const std::vector<float> whole = fetch(*g, one.gpu);
      const std::vector<float> oracle = fetch(cpu_oracle(), one.cpu);
      // Bytes per query row: hkv * sk scores in f32, plus the probabilities in bf16.
      const int64_t per_row = c.hkv * c.sk * (4 + (dt == DType::kF32 ? 0 : 2));
      for (int64_t rows : {int64_t{1}, int64_t{7}, int64_t{128}}) {
        Both o = outputs({c.b, c.sq, c.hq, c.d}, dt);
        g->set_attention_score_budget(rows * per_row);
        const Status st = g->attention(q.gpu, k.gpu, v.gpu, p, o.gpu);
        g->set_attention_score_budget(0);
        if (!st.ok()) g->set_attention_path(cuda::AttentionPath::kAuto);
        ZI_ASSERT_OK(st);
        const std::vector<float> got = fetch(*g, o.gpu);
        expect_close(describe(c) + cat(" [general, chunks of ", rows, " rows] vs CPU"), dt, got,
                     oracle);
        expect_close(describe(c) + cat(" chunks of ", rows, " vs one chunk"), dt, got, whole);
      }
      g->set_attention_path(cuda::AttentionPath::kAuto);
    }
  }
}

// The general path's softmax kept on chip against the same rows read three times (the kernel it
// replaced): the same expression per element, only the order of the block's sums differs. Rows of
// 16384 keys (registers) and 40000 (half in shared memory), with padded keys.
TEST(CudaOps, AttentionSoftmaxOnChipMatchesThreePass) {
  ZI_REQUIRE_GPU();
  const AttnCase cases[] = {{1, 48, 16384, 1, 1, 64, false, {}},
                            {2, 40, 40000, 2, 2, 32, false, {40000, 30001}}};
  for (DType dt : kDTypes) {
    cuda::CudaBackend* g = gpu(dt);
    uint32_t seed = 2700;
    for (const AttnCase& c : cases) {
      Tensor q = take(g->upload(rand_host({c.b, c.sq, c.hq, c.d}, seed++, dt, -2.f, 2.f), dt), "q");
      Tensor k =
          take(g->upload(rand_host({c.b, c.sk, c.hkv, c.d}, seed++, dt, -2.f, 2.f), dt), "k");
      Tensor v = take(g->upload(rand_host({c.b, c.sk, c.hkv, c.d}, seed++, dt), dt), "v");
      AttentionParams p;
      p.scale = 1.0f / std::sqrt(static_cast<float>(c.d));
      p.key_len = c.key_len;
      std::vector<float> got[2];
      for (int on = 0; on < 2; ++on) {
        Tensor o = take(g->alloc(dt, {c.b, c.sq, c.hq, c.d}), "o");
        ZI_ASSERT_OK(g->fill(o, std::numeric_limits<float>::quiet_NaN()));
        cuda::set_masked_softmax_on_chip(on == 1);
        g->set_attention_path(cuda::AttentionPath::kGeneral);
        const Status st = g->attention(q, k, v, p, o);
        g->set_attention_path(cuda::AttentionPath::kAuto);
        cuda::set_masked_softmax_on_chip(true);
        ZI_ASSERT_OK(st);
        got[on] = fetch(*g, o);
      }
      expect_close(describe(c) + cat(" ", dtype_name(dt), " on chip vs three passes"), dt, got[1],
                   got[0]);
    }
  }
}

}  // namespace
}  // namespace zimage::test
