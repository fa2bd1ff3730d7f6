// The DiT's packed attention path on the GPU (Backend::qk_norm_rope_packed, attention_packed):
// q and k normalised and rotated in place inside the q|k|v projection, and FlashInfer's kernel
// reading q, k and v there by their strides. Held to the split path bit for bit (the same kernels
// on the same numbers: only the addresses differ) and to the CPU oracle; the fallbacks (head_dim
// other than 128 for the prologue, f32, a fully masked row) give the same results as the split.
#include <gtest/gtest.h>

#include <cstring>

#include "backend/cuda/kernels/kernels.h"
#include "gpu/cuda_test_util.h"
#include "gpu/dit_test_util.h"
#include "io/weights/weights.h"

namespace zimage::test {
namespace {

// Columns [c0, c0 + w) of every row of a [rows, f] float vector.
std::vector<float> columns(const std::vector<float>& packed, int64_t f, int64_t c0, int64_t w) {
  std::vector<float> out;
  const int64_t rows = static_cast<int64_t>(packed.size()) / f;
  out.reserve(static_cast<size_t>(rows * w));
  for (int64_t r = 0; r < rows; ++r)
    out.insert(out.end(), packed.begin() + r * f + c0, packed.begin() + r * f + c0 + w);
  return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(CudaPackedQkv, PrologueInPlaceIsTheSplitBitForBit) {
  ZI_REQUIRE_GPU();
  struct Case {
    int64_t b, s, hq, hkv, dh;
    bool norm, rope, shared;
  };
  const Case cases[] = {
      {1, 17, 3, 3, 128, true, true, false},  {2, 33, 30, 30, 128, true, true, true},
      {1, 17, 4, 2, 128, false, true, false}, {2, 5, 32, 8, 128, true, false, false},
      {2, 9, 1, 1, 128, true, true, false},   {1, 64, 30, 30, 128, true, true, false},
      {2, 33, 6, 2, 64, true, true, false},    // head_dim 64: split, fused, copied back
      {1, 9, 32, 32, 128, true, true, true},   // 64 q and k heads: the row kernel's tile, full
      {1, 9, 40, 40, 128, true, true, false},  // 80 q and k heads: past the row kernel's 64
  };
  const cuda::RowKernelTuning was = cuda::row_kernel_tuning();
  const bool was_staged = cuda::staged_row_kernels();
  cuda::set_staged_row_kernels(true);
  // 0 with the staging on (the default): for 2-byte types a block per row staged through
  // shared memory, where the row's q and k heads fit it; 1, 2, 4: the warp-item kernel's items in
  // flight. Each ships.
  for (int items : {0, 1, 2, 4}) {
    cuda::set_row_kernel_tuning({was.norm_ppt, items, was.row_walk});
    for (DType dt : kDTypes) {
      uint32_t seed = 9100;
      cuda::CudaBackend* g = gpu(dt);
      for (const Case& c : cases) {
        const int64_t rows = c.b * c.s, f = (c.hq + 2 * c.hkv) * c.dh;
        const int64_t dq = c.hq * c.dh, dkv = c.hkv * c.dh;
        const Tensor host = rand_host({c.b, c.s, f}, seed++, dt, -3.f, 3.f);
        Both wq = both_rand({c.dh}, seed++, dt, 0.5f, 1.5f);
        Both wk = both_rand({c.dh}, seed++, dt, 0.5f, 1.5f);
        Both fr = both_as(rand_host({c.shared ? 1 : c.b, c.s, c.dh / 2, 2}, seed++, DType::kF32),
                          dt, DType::kF32);
        const Tensor none;
        const Tensor& wqg = c.norm ? wq.gpu : none;
        const Tensor& wkg = c.norm ? wk.gpu : none;
        const Tensor& frg = c.rope ? fr.gpu : none;
        // The split path, GPU and CPU.
        Tensor qkv = take(g->upload(host, dt), "qkv");
        Both q = outputs({c.b, c.s, c.hq, c.dh}, dt), k = outputs({c.b, c.s, c.hkv, c.dh}, dt),
             v = outputs({c.b, c.s, c.hkv, c.dh}, dt);
        ZI_ASSERT_OK(
            g->qkv_split_norm_rope(qkv.view({rows, f}), wqg, wkg, 1e-6f, frg, q.gpu, k.gpu, v.gpu));
        Tensor qkv_cpu = take(cpu_oracle().upload(host, DType::kF32), "qkv cpu");
        ZI_ASSERT_OK(cpu_oracle().qkv_split_norm_rope(
            qkv_cpu.view({rows, f}), c.norm ? wq.cpu : none, c.norm ? wk.cpu : none, 1e-6f,
            c.rope ? fr.cpu : none, q.cpu, k.cpu, v.cpu));
        // In place.
        ZI_ASSERT_OK(g->qk_norm_rope_packed(qkv, c.hq, c.hkv, wqg, wkg, 1e-6f, frg));
        const std::vector<float> packed = fetch(*g, qkv);
        const std::vector<float> before = fetch(*g, take(g->upload(host, dt), "again"));
        const std::string tag = cat(" b", c.b, " s", c.s, " hq", c.hq, " hkv", c.hkv, " dh", c.dh,
                                    c.norm ? " norm" : "", c.rope ? " rope" : "",
                                    c.shared ? " shared" : "", " items ", items);
        EXPECT_TRUE(same_bits(columns(packed, f, 0, dq), fetch(*g, q.gpu))) << "q" << tag;
        EXPECT_TRUE(same_bits(columns(packed, f, dq, dkv), fetch(*g, k.gpu))) << "k" << tag;
        EXPECT_TRUE(same_bits(columns(packed, f, dq + dkv, dkv), columns(before, f, dq + dkv, dkv)))
            << "v must be left as it was" << tag;
        if (items == 0 && c.b == 2 && c.hq == 30) {  // one print per dtype: the oracle's distance
          expect_close("packed prologue q vs CPU" + tag, dt, columns(packed, f, 0, dq),
                       fetch(cpu_oracle(), q.cpu));
          expect_close("packed prologue k vs CPU" + tag, dt, columns(packed, f, dq, dkv),
                       fetch(cpu_oracle(), k.cpu));
        }
      }
    }
  }
  cuda::set_row_kernel_tuning(was);
  cuda::set_staged_row_kernels(was_staged);
}

TEST(CudaPackedQkv, AttentionReadsTheProjectionInPlace) {
  ZI_REQUIRE_GPU();
  struct Case {
    int64_t b, s, hq, hkv, d;
    std::vector<int32_t> key_len;
  };
  const Case cases[] = {
      {1, 300, 4, 4, 128, {}},     {2, 257, 6, 2, 128, {257, 100}}, {1, 130, 2, 2, 64, {}},
      {2, 64, 3, 3, 256, {}},      {1, 4160, 30, 30, 128, {}},      {2, 77, 2, 1, 128, {77, 1}},
      {2, 40, 2, 2, 96, {40, 33}},  // head_dim 96: not the kernel's; copied out, attention()
  };
  for (DType dt : kDTypes) {
    cuda::CudaBackend* g = gpu(dt);
    if (dt == DType::kBF16 && (g->has_fa3_attention() || g->has_flash3_attention())) {
      EXPECT_TRUE(g->reads_packed_qkv()) << "bf16 on sm_90: the DiT keeps q|k|v packed";
    }
    if (dt == DType::kF32) {
      EXPECT_FALSE(g->reads_packed_qkv()) << "f32 has no strided kernel";
    }
    uint32_t seed = 9200;
    for (const Case& c : cases) {
      const int64_t f = (c.hq + 2 * c.hkv) * c.d, dq = c.hq * c.d, dkv = c.hkv * c.d;
      const Tensor host = rand_host({c.b, c.s, f}, seed++, dt, -2.f, 2.f);
      Tensor qkv = take(g->upload(host, dt), "qkv");
      AttentionParams p;
      p.scale = 1.0f / std::sqrt(static_cast<float>(c.d));
      p.key_len = c.key_len;
      // The parts, split on the host: the split path's inputs and the CPU oracle's.
      const std::vector<float> all = fetch(*g, qkv);
      auto part = [&](int64_t c0, int64_t w, int64_t h) {
        const std::vector<float> v = columns(all, f, c0, w);
        Tensor t = Tensor::host(DType::kF32, {c.b, c.s, h, c.d});
        std::memcpy(t.data(), v.data(), v.size() * sizeof(float));
        return both(t, dt);
      };
      Both q = part(0, dq, c.hq), k = part(dq, dkv, c.hkv), v = part(dq + dkv, dkv, c.hkv);
      Both split = outputs({c.b, c.s, c.hq, c.d}, dt);
      ZI_ASSERT_OK(g->attention(q.gpu, k.gpu, v.gpu, p, split.gpu));
      ZI_ASSERT_OK(cpu_oracle().attention(q.cpu, k.cpu, v.cpu, p, split.cpu));
      Both packed = outputs({c.b, c.s, c.hq, c.d}, dt);
      ZI_ASSERT_OK(g->attention_packed(qkv, c.hq, c.hkv, p, packed.gpu));
      const std::string tag = cat(" b", c.b, " s", c.s, " hq", c.hq, " hkv", c.hkv, " d", c.d,
                                  c.key_len.empty() ? "" : " padded");
      EXPECT_TRUE(same_bits(fetch(*g, packed.gpu), fetch(*g, split.gpu)))
          << "attention_packed differs from attention on the split parts" << tag;
      packed.cpu = split.cpu;
      expect_match(label("attention_packed", {c.b, c.s, c.hq, c.d}, tag), dt, packed);
      EXPECT_TRUE(same_bits(fetch(*g, qkv), all)) << "the projection is read, not written" << tag;
    }
  }
}

// A whole forward with the model's head_dim: the packed path (the default where FlashInfer's
// kernel runs) gives the split path's output bit for bit, eager and recorded, and stays with the
// CPU.
TEST(CudaPackedQkv, TransformerPackedEqualsSplit) {
  ZI_REQUIRE_GPU();
  cuda::CudaBackend* g = gpu(DType::kBF16);
  if (!g->reads_packed_qkv()) GTEST_SKIP() << "no strided attention kernel on this GPU";
  TransformerConfig cfg;
  const std::string dir = write_wide_dit(cfg, "zimage_packed_qkv_dit");
  auto ws = WeightStore::open(dir);
  ASSERT_TRUE(ws.ok()) << ws.status().to_string();
  const Tensor lat = rand_host({1, 16, 32, 32}, 41, DType::kBF16);
  const Tensor cap = rand_host({20, cfg.cap_feat_dim}, 42, DType::kBF16);
  auto dit = ZImageDiT::load(cfg, *ws, *g);
  ASSERT_TRUE(dit.ok()) << dit.status().to_string();
  auto cpu_dit = ZImageDiT::load(cfg, *ws, cpu_oracle());
  ASSERT_TRUE(cpu_dit.ok()) << cpu_dit.status().to_string();
  std::map<std::string, int64_t> calls;
  const Tensor packed = profiled_forward(**dit, *g, lat, cap, calls);
  EXPECT_EQ(calls["attention_packed"], 4)
      << "every block's attention (2 layers, 2 refiners) reads in place";
  EXPECT_EQ(calls["qkv_split_norm_rope"], 0);
  const Tensor recorded = forward(**dit, *g, lat, cap);
  const Tensor replayed = forward(**dit, *g, lat, cap);
  g->set_packed_qkv(false);
  (*dit)->set_use_graphs(false);
  const Tensor split = forward(**dit, *g, lat, cap);
  g->set_packed_qkv(true);
  const Tensor ref = forward(**cpu_dit, cpu_oracle(), lat, cap);
  ASSERT_TRUE(packed.defined() && recorded.defined() && replayed.defined() && split.defined() &&
              ref.defined());
  EXPECT_EQ(values(packed), values(split)) << "packed differs from split";
  EXPECT_EQ(values(recorded), values(packed)) << "recorded differs from eager";
  EXPECT_EQ(values(replayed), values(packed)) << "replayed differs from eager";
  expect_close("transformer, packed q|k|v vs CPU", DType::kBF16, values(packed), values(ref), 3e-2);
  dit->reset();
  std::filesystem::remove_all(dir);
}

TEST(CudaPackedQkv, BadShapesAreNamed) {
  ZI_REQUIRE_GPU();
  cuda::CudaBackend* g = gpu(DType::kBF16);
  Tensor qkv = take(g->alloc(DType::kBF16, {1, 8, 3 * 2 * 128}), "qkv");
  Tensor out = take(g->alloc(DType::kBF16, {1, 8, 2, 128}), "out");
  AttentionParams p;
  const Tensor none;
  for (auto [hq, hkv] : {std::pair<int64_t, int64_t>{3, 2}, {0, 2}, {2, 0}}) {
    const Status a = g->attention_packed(qkv, hq, hkv, p, out);
    EXPECT_EQ(a.code(), ErrorCode::kInvalidArgument) << a.to_string();
    EXPECT_NE(a.message().find("attention_packed"), std::string::npos) << a.message();
    const Status n = g->qk_norm_rope_packed(qkv, hq, hkv, none, none, 1e-6f, none);
    EXPECT_EQ(n.code(), ErrorCode::kInvalidArgument) << n.to_string();
  }
  Tensor wrong = take(g->alloc(DType::kBF16, {1, 8, 3, 128}), "wrong");
  EXPECT_EQ(g->attention_packed(qkv, 2, 2, p, wrong).code(), ErrorCode::kInvalidArgument);
  p.key_len = {8, 8};  // two entries for a batch of one
  EXPECT_EQ(g->attention_packed(qkv, 2, 2, p, out).code(), ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace zimage::test
