// The opt-in FP8 attention on the GPU (Backend::attention_packed_fp8: the prologue writing q and
// k as e4m3 with scales bounded from the norm weights, v quantised per head, FlashAttention-3's
// e4m3 kernel) against the CPU oracle of the same formula, and against exact attention (what
// FP8 costs); in a whole forward, recorded against eager, and against the CPU model with the
// same layers in FP8.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "backend/cuda/kernels/kernels.h"
#include "gpu/cuda_test_util.h"
#include "gpu/dit_test_util.h"
#include "io/weights/weights.h"
#include "model/common/linear.h"

namespace zimage::test {
namespace {

TEST(CudaFp8Attention, AgainstCpuOracle) {
  ZI_REQUIRE_GPU();
  cuda::CudaBackend* g = gpu(DType::kBF16);
  const Status support = g->fp8_attention_support();
  if (!support.ok()) GTEST_SKIP() << support.message();
  struct Case {
    int64_t b, s, h;
    std::vector<int32_t> key_len;
    bool shared_freqs;
    float wq_hi, wk_hi;  // norm weights uniform in [wq_hi / 3, wq_hi]
  };
  const Case cases[] = {
      {1, 4160, 30, {}, false, 1.5f, 1.5f},       // the DiT at 1024²
      {2, 600, 4, {600, 544}, true, 1.5f, 1.5f},  // padded keys, freqs shared over the batch
      {1, 300, 2, {}, false, 1.5f, 1.5f},         // shorter than one key tile
      {1, 513, 3, {}, false, 300.f, 0.005f},      // q past e4m3's 448 before its scale
  };
  constexpr int64_t d = 128;
  uint32_t seed = 9700;
  for (const Case& c : cases) {
    const int64_t f = 3 * c.h * d;
    Tensor host = rand_host({c.b, c.s, f}, seed++, DType::kBF16, -2.f, 2.f);
    // The last v head 64 times larger (exact in bf16): its own scale, or a wrong per-head
    // scale (stride, head index) shows.
    for (int64_t r = 0; r < c.b * c.s; ++r)
      for (int64_t i = 0; i < d; ++i) host.data_as<float>()[r * f + f - d + i] *= 64.f;
    Both wq = both_rand({d}, seed++, DType::kBF16, c.wq_hi / 3, c.wq_hi);
    Both wk = both_rand({d}, seed++, DType::kBF16, c.wk_hi / 3, c.wk_hi);
    Both fr =
        both_as(rope_table(c.shared_freqs ? 1 : c.b, c.s, d, seed++), DType::kBF16, DType::kF32);
    AttentionParams p;
    p.scale = 1.0f / std::sqrt(static_cast<float>(d));
    p.key_len = c.key_len;
    Tensor qkv = take(g->upload(host, DType::kBF16), "qkv");
    const std::vector<float> before = fetch(*g, qkv);
    Both out = outputs({c.b, c.s, c.h, d}, DType::kBF16);
    ZI_ASSERT_OK(g->attention_packed_fp8(qkv, c.h, c.h, wq.gpu, wk.gpu, 1e-6f, fr.gpu, p, out.gpu));
    Tensor qkv_cpu = take(cpu_oracle().upload(host, DType::kF32), "qkv cpu");
    ZI_ASSERT_OK(cpu_oracle().attention_packed_fp8(qkv_cpu, c.h, c.h, wq.cpu, wk.cpu, 1e-6f, fr.cpu,
                                                   p, out.cpu));
    // Exact attention on the same prologue: what the FP8 rounding costs.
    Tensor exact_in = take(cpu_oracle().upload(host, DType::kF32), "exact");
    ZI_ASSERT_OK(
        cpu_oracle().qk_norm_rope_packed(exact_in, c.h, c.h, wq.cpu, wk.cpu, 1e-6f, fr.cpu));
    Tensor exact = take(cpu_oracle().alloc(DType::kF32, {c.b, c.s, c.h, d}), "exact out");
    ZI_ASSERT_OK(cpu_oracle().attention_packed(exact_in, c.h, c.h, p, exact));
    const std::string tag = cat(" b", c.b, " s", c.s, " h", c.h, c.key_len.empty() ? "" : " padded",
                                c.shared_freqs ? " shared" : "", " |wq| <= ", c.wq_hi);
    const std::vector<float> got = fetch(*g, out.gpu);
    // The probabilities' e4m3 rounding (the kernel's, not the oracle's) and bf16 on the way
    // account for the distance to the oracle; against exact attention FP8 costs more.
    expect_close("fp8 attention vs CPU fp8 oracle" + tag, DType::kBF16, got,
                 fetch(cpu_oracle(), out.cpu), 5e-2);
    expect_close("fp8 attention vs exact attention" + tag, DType::kBF16, got,
                 fetch(cpu_oracle(), exact), 1e-1);
    const std::vector<float> after = fetch(*g, qkv);
    EXPECT_EQ(std::memcmp(before.data(), after.data(), before.size() * sizeof(float)), 0)
        << "the projection is read, not written" << tag;
  }
}

// The e4m3 prologue in each form that ships (the default block-per-row kernel and the
// warp-item kernel at 1, 2 and 4 items): the same codes and scales byte for byte, the projection
// left as it was. Rows of 60 q and k heads (the DiT's), 40 with a shared table, and 80 (past the
// row kernel, so the default takes the warp-item kernel).
TEST(CudaFp8Attention, PrologueFormsWriteTheSameBytes) {
  ZI_REQUIRE_GPU();
  cuda::CudaBackend* g = gpu(DType::kBF16);
  if (!g->fp8_attention_support().ok()) GTEST_SKIP() << g->fp8_attention_support().message();
  struct Case {
    int64_t s, h;
    bool shared;  // two sequences of s tokens sharing one table of s rows
  };
  constexpr int64_t d = 128;
  uint32_t seed = 9900;
  const cuda::RowKernelTuning was = cuda::row_kernel_tuning();
  const bool was_staged = cuda::staged_row_kernels();
  cuda::set_staged_row_kernels(true);  // items 0: the block-per-row kernel where it applies
  for (const Case& c : {Case{4160, 30, false}, Case{77, 20, true}, Case{33, 40, false}}) {
    const int64_t f = 3 * c.h * d, rows = c.shared ? 2 * c.s : c.s;
    const Tensor host = rand_host({1, rows, f}, seed++, DType::kBF16, -3.f, 3.f);
    Tensor qkv = take(g->upload(host, DType::kBF16), "qkv");
    Tensor wq =
        take(g->upload(rand_host({d}, seed++, DType::kBF16, 0.5f, 1.5f), DType::kBF16), "wq");
    Tensor wk =
        take(g->upload(rand_host({d}, seed++, DType::kBF16, 0.2f, 2.f), DType::kBF16), "wk");
    Tensor fr = take(g->upload(rope_table(1, c.s, d, seed++), DType::kF32), "freqs");
    const std::vector<float> before = fetch(*g, qkv);
    std::vector<uint8_t> first;
    for (int items : {0, 1, 2, 4}) {
      cuda::set_row_kernel_tuning({was.norm_ppt, items, was.row_walk});
      Tensor q8 = take(g->alloc(DType::kF8E4M3, {1, rows, f}), "q8");
      ASSERT_EQ(cudaMemset(q8.data(), 0, static_cast<size_t>(rows * f)), cudaSuccess);
      Tensor sc = take(g->alloc(DType::kF32, {2}), "scales");
      ASSERT_EQ(cuda::launch_qk_norm_rope_packed_fp8(cuda::KType::kBF16, qkv.data(), wq.data(),
                                                     wk.data(), fr.data_as<float>(), q8.data(),
                                                     sc.data_as<float>(), rows, c.shared ? c.s : 0,
                                                     c.h, c.h, d, 1e-6f, g->stream()),
                cudaSuccess);
      ZI_ASSERT_OK(g->synchronize());
      std::vector<uint8_t> got(static_cast<size_t>(rows * f) + 2 * sizeof(float));
      ASSERT_EQ(
          cudaMemcpy(got.data(), q8.data(), static_cast<size_t>(rows * f), cudaMemcpyDeviceToHost),
          cudaSuccess);
      ASSERT_EQ(
          cudaMemcpy(got.data() + rows * f, sc.data(), 2 * sizeof(float), cudaMemcpyDeviceToHost),
          cudaSuccess);
      const std::string tag =
          cat(" s", c.s, " h", c.h, c.shared ? " shared" : "", " items ", items);
      if (first.empty()) {
        first = got;
        size_t nonzero = 0;
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t i = r * f; i < r * f + 2 * c.h * d; ++i)
            nonzero += got[static_cast<size_t>(i)] != 0;
        EXPECT_GT(nonzero, static_cast<size_t>(rows * 2 * c.h * d / 2)) << "q and k written" << tag;
      } else {
        EXPECT_EQ(got, first) << "e4m3 codes and scales against the default's" << tag;
      }
      const std::vector<float> after = fetch(*g, qkv);
      EXPECT_EQ(std::memcmp(before.data(), after.data(), before.size() * sizeof(float)), 0)
          << "the projection is read, not written" << tag;
    }
  }
  cuda::set_row_kernel_tuning(was);
  cuda::set_staged_row_kernels(was_staged);
}

TEST(CudaFp8Attention, BadCallsAreNamed) {
  ZI_REQUIRE_GPU();
  cuda::CudaBackend* g = gpu(DType::kBF16);
  if (!g->fp8_attention_support().ok()) GTEST_SKIP() << g->fp8_attention_support().message();
  Tensor qkv = take(g->alloc(DType::kBF16, {1, 8, 3 * 2 * 128}), "qkv");
  Tensor out = take(g->alloc(DType::kBF16, {1, 8, 2, 128}), "out");
  Tensor w = take(g->alloc(DType::kBF16, {128}), "w");
  ZI_ASSERT_OK(g->fill(w, 1.f));
  AttentionParams p;
  const Tensor none;
  const Status no_norm = g->attention_packed_fp8(qkv, 2, 2, none, none, 1e-6f, none, p, out);
  EXPECT_EQ(no_norm.code(), ErrorCode::kInvalidArgument) << no_norm.to_string();
  EXPECT_NE(no_norm.message().find("norm"), std::string::npos) << no_norm.message();
  const Status heads = g->attention_packed_fp8(qkv, 3, 2, w, w, 1e-6f, none, p, out);
  EXPECT_EQ(heads.code(), ErrorCode::kInvalidArgument) << heads.to_string();
  Tensor wrong = take(g->alloc(DType::kBF16, {1, 8, 3, 128}), "wrong");
  EXPECT_EQ(g->attention_packed_fp8(qkv, 2, 2, w, w, 1e-6f, none, p, wrong).code(),
            ErrorCode::kInvalidArgument);
  Tensor grouped = take(g->alloc(DType::kBF16, {1, 8, (4 + 2 * 2) * 128}), "grouped");
  Tensor out4 = take(g->alloc(DType::kBF16, {1, 8, 4, 128}), "out4");
  EXPECT_EQ(g->attention_packed_fp8(grouped, 4, 2, w, w, 1e-6f, none, p, out4).code(),
            ErrorCode::kUnsupported)
      << "grouped KV heads: the kernel is built ungrouped";
}

// A whole forward with FP8 attention in every block: each block's attention goes through the FP8
// op, the recorded forward equals the eager one bit for bit, and the output stays with the CPU
// model of the same formula.
TEST(CudaFp8Attention, TransformerRecordedEqualsEagerAndCpu) {
  ZI_REQUIRE_GPU();
  cuda::CudaBackend* g = gpu(DType::kBF16);
  if (!g->fp8_attention_support().ok()) GTEST_SKIP() << g->fp8_attention_support().message();
  TransformerConfig cfg;
  const std::string dir = write_wide_dit(cfg, "zimage_fp8_attention_dit");
  auto ws = WeightStore::open(dir);
  ASSERT_TRUE(ws.ok()) << ws.status().to_string();
  const Tensor lat = rand_host({1, 16, 32, 32}, 51, DType::kBF16);
  const Tensor cap = rand_host({20, cfg.cap_feat_dim}, 52, DType::kBF16);
  WeightPlacement fp8;
  fp8.fp8_compute = kFp8Sdpa | kFp8Refiners;
  auto dit = ZImageDiT::load(cfg, *ws, *g, fp8);
  ASSERT_TRUE(dit.ok()) << dit.status().to_string();
  auto bf16 = ZImageDiT::load(cfg, *ws, *g);
  ASSERT_TRUE(bf16.ok()) << bf16.status().to_string();
  auto cpu_dit = ZImageDiT::load(cfg, *ws, cpu_oracle(), fp8);
  ASSERT_TRUE(cpu_dit.ok()) << cpu_dit.status().to_string();
  auto cpu_exact = ZImageDiT::load(cfg, *ws, cpu_oracle());
  ASSERT_TRUE(cpu_exact.ok()) << cpu_exact.status().to_string();
  std::map<std::string, int64_t> calls;
  const Tensor eager = profiled_forward(**dit, *g, lat, cap, calls);
  EXPECT_EQ(calls["attention_packed_fp8"], 4)
      << "every block's attention (2 layers, 2 refiners) in FP8";
  EXPECT_EQ(calls["attention_packed"], 0) << "a block ran bf16 attention";
  const Tensor recorded = forward(**dit, *g, lat, cap);
  const Tensor replayed = forward(**dit, *g, lat, cap);
  const Tensor plain = forward(**bf16, *g, lat, cap);
  const Tensor ref = forward(**cpu_dit, cpu_oracle(), lat, cap);
  const Tensor exact = forward(**cpu_exact, cpu_oracle(), lat, cap);
  ASSERT_TRUE(eager.defined() && recorded.defined() && replayed.defined() && plain.defined() &&
              ref.defined() && exact.defined());
  EXPECT_EQ(values(recorded), values(eager)) << "recorded differs from eager";
  EXPECT_EQ(values(replayed), values(eager)) << "replayed differs from eager";
  EXPECT_NE(values(eager), values(plain)) << "the FP8 path ran";
  expect_close("transformer, fp8 attention vs CPU fp8 model", DType::kBF16, values(eager),
               values(ref), 5e-2);
  expect_close("transformer, fp8 attention vs CPU exact model", DType::kBF16, values(eager),
               values(exact), 1e-1);
  dit->reset();
  bf16->reset();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace zimage::test
