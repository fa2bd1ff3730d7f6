// The W8A8 feed-forward's w1|w3 GEMM with SwiGLU in its epilogue (matmul_fp8_swiglu,
// ZIMAGE_FUSED_SWIGLU_GEMM_FP8): the bytes of the two ops it replaces (the FP8 GEMM in the same
// 128 × 256 tile, then swiglu_fp8), at the DiT's shapes, a partial row tile and a narrow one; with
// its w2 rows in the memory of its input rows, as the DiT runs it; and in a transformer, where
// the recorded forward equals the eager one and every feed-forward took the fused op. And the
// time of each way at the DiT's 1024² and 2048² rows (CudaOpsPerf.Fp8SwigluGemm).
#include <gtest/gtest.h>

#include <filesystem>
#include <limits>
#include <map>
#include <tuple>

#include "backend/cuda/libs/gemm_cutlass.h"
#include "gpu/cuda_test_util.h"
#include "gpu/dit_test_util.h"
#include "gpu/perf_test_util.h"
#include "io/weights/weights.h"
#include "model/common/linear.h"
#include "model/dit/zimage_dit.h"

using namespace zimage;
using namespace zimage::test;

namespace {

// The fused op on for a test's span; the plain FP8 GEMM's tile back to its choice after it.
struct FusedFp8SwigluOn {
  explicit FusedFp8SwigluOn(cuda::CudaBackend* g) : g_(g) {
    if (g_) g_->set_fused_swiglu_gemm_fp8(true);
  }
  ~FusedFp8SwigluOn() {
    if (!g_) return;
    g_->set_fused_swiglu_gemm_fp8(false);
    g_->set_fp8_tile(cuda::Fp8Tile::kAuto);
  }
  cuda::CudaBackend* g_;
};

// A feed-forward's FP8 operands: x [m, k] and a w1|w3 weight [2f, k] of random bf16 values as
// FP8 rows (quantize_fp8_rows), the weight W8A8 with its gate rows first.
struct Fp8Ffn {
  Tensor x8, sx;
  LinearWeight w13;
};
Fp8Ffn fp8_ffn(cuda::CudaBackend* g, int64_t m, int64_t f, int64_t k, uint32_t seed) {
  Fp8Ffn o;
  const Tensor x = rand_dev(g, {m, k}, seed, -3.f, 3.f);
  const Tensor w = rand_dev(g, {2 * f, k}, seed + 1, -0.05f, 0.05f);
  o.x8 = take(g->alloc(DType::kF8E4M3, {m, k}), "alloc");
  o.sx = take(g->alloc(DType::kF32, {m}), "alloc");
  EXPECT_TRUE(g->quantize_fp8_rows(x, o.x8, o.sx).ok());
  o.w13.w = take(g->alloc(DType::kF8E4M3, {2 * f, k}), "alloc");
  o.w13.scale = take(g->alloc(DType::kF32, {2 * f}), "alloc");
  o.w13.fp8_compute = true;
  EXPECT_TRUE(g->quantize_fp8_rows(w, o.w13.w, o.w13.scale).ok());
  return o;
}

Tensor dev_copy(cuda::CudaBackend* g, const Tensor& t) {
  Tensor c = take(g->alloc(t.dtype(), t.shape()), "alloc");
  EXPECT_TRUE(g->copy_2d(t, 0, t.numel(), c, 0, t.numel(), 1, t.numel()).ok());
  return c;
}

}  // namespace

TEST(CudaFp8Swiglu, FusedGemmIsTheTwoOpsBytes) {
  ZI_REQUIRE_GPU();
  cuda::CudaBackend* g = gpu(DType::kBF16);
  FusedFp8SwigluOn on(g);
  if (g->fp8_swiglu_block(10240, 3840) != cuda::kFp8SwigluBlock)
    GTEST_SKIP() << "no fused FP8 SwiGLU GEMM here (needs sm_90 and the fused CUTLASS GEMMs)";
  // rows, F, K: the DiT's 1024² and context-refiner rows, a partial row tile, F of one tile.
  for (const auto& [m, f, k] : {std::tuple<int64_t, int64_t, int64_t>{4160, 10240, 3840},
                                {64, 10240, 3840},
                                {517, 384, 272},
                                {130, 128, 64}}) {
    SCOPED_TRACE(cat("rows ", m, " f ", f, " k ", k));
    Fp8Ffn ops = fp8_ffn(g, m, f, k, 31);
    const Tensor &x8 = ops.x8, &sx = ops.sx;
    LinearWeight& lw = ops.w13;
    const Tensor w8 = dev_copy(g, lw.w), sw = dev_copy(g, lw.scale);  // gate rows first

    // The two ops, the GEMM in the fused op's tile (gate rows first).
    g->set_fp8_tile(cuda::Fp8Tile::kCoopWide);
    Tensor h = take(g->alloc(DType::kBF16, {m, 2 * f}), "alloc");
    ZI_ASSERT_OK(g->matmul_fp8_quantized(x8, sx, lw.w, lw.scale, Tensor(), h));
    Tensor y_ref = take(g->alloc(DType::kBF16, {m, f}), "alloc");
    ZI_ASSERT_OK(g->swiglu(h, y_ref));
    Tensor q_ref = take(g->alloc(DType::kF8E4M3, {m, f}), "alloc");
    Tensor s_ref = take(g->alloc(DType::kF32, {m}), "alloc");
    ZI_ASSERT_OK(g->quantize_fp8_rows(y_ref, q_ref, s_ref));

    ZI_ASSERT_OK(set_swiglu_block(*g, lw, g->fp8_swiglu_block(f, k)));
    ASSERT_EQ(lw.swiglu_block, cuda::kFp8SwigluBlock);
    Tensor y = take(g->alloc(DType::kBF16, {m, f}), "alloc");
    Tensor q = take(g->alloc(DType::kF8E4M3, {m, f}), "alloc");
    Tensor sc = take(g->alloc(DType::kF32, {m}), "alloc");
    ZI_ASSERT_OK(g->fill(y, std::numeric_limits<float>::quiet_NaN()));
    std::map<std::string, int64_t> calls = calls_by_op(*g, [&] {
      ZI_ASSERT_OK(g->matmul_fp8_swiglu(x8, sx, lw.w, lw.scale, lw.swiglu_block, y, q, sc));
    });
    EXPECT_EQ(calls["matmul_fp8_swiglu"], 1);
    EXPECT_EQ(calls["matmul_fp8_quantized"], 0) << "the composed ops ran, not the fused GEMM";
    EXPECT_EQ(bytes_of(g, y), bytes_of(g, y_ref));
    EXPECT_EQ(bytes_of(g, q), bytes_of(g, q_ref));
    EXPECT_EQ(bytes_of(g, sc), bytes_of(g, s_ref));

    // Without the rows' quantisation: y alone, the same bytes.
    Tensor y2 = take(g->alloc(DType::kBF16, {m, f}), "alloc");
    Tensor none8, none_scale;
    ZI_ASSERT_OK(
        g->matmul_fp8_swiglu(x8, sx, lw.w, lw.scale, lw.swiglu_block, y2, none8, none_scale));
    EXPECT_EQ(bytes_of(g, y2), bytes_of(g, y_ref));

    // As the DiT runs it: the w2 rows and scales written where the input rows and scales were.
    const int64_t wide = std::max(k, f);
    Tensor buf = take(g->alloc(DType::kF8E4M3, {m * wide}), "alloc");
    Tensor in8(buf.storage(), buf.byte_offset(), DType::kF8E4M3, {m, k});
    Tensor out8(buf.storage(), buf.byte_offset(), DType::kF8E4M3, {m, f});
    ZI_ASSERT_OK(g->copy_2d(x8, 0, k, in8, 0, k, m, k));
    Tensor s_io = dev_copy(g, sx);
    Tensor y3 = take(g->alloc(DType::kBF16, {m, f}), "alloc");
    ZI_ASSERT_OK(g->matmul_fp8_swiglu(in8, s_io, lw.w, lw.scale, lw.swiglu_block, y3, out8, s_io));
    EXPECT_EQ(bytes_of(g, out8), bytes_of(g, q_ref));
    EXPECT_EQ(bytes_of(g, s_io), bytes_of(g, s_ref));

    // Back to gate rows first: the weight and its scales as quantised, byte for byte.
    ZI_ASSERT_OK(set_swiglu_block(*g, lw, 0));
    EXPECT_EQ(bytes_of(g, lw.w), bytes_of(g, w8));
    EXPECT_EQ(bytes_of(g, lw.scale), bytes_of(g, sw));
    g->set_fp8_tile(cuda::Fp8Tile::kAuto);
  }
  // A row block the fused GEMM does not take runs the composed ops, with the same result.
  const int64_t m = 40, f = 256;
  Fp8Ffn ops = fp8_ffn(g, m, f, 64, 41);
  const Tensor &x8 = ops.x8, &sx = ops.sx;
  LinearWeight& lw = ops.w13;
  ZI_ASSERT_OK(set_swiglu_block(*g, lw, 64));
  Tensor y = take(g->alloc(DType::kBF16, {m, f}), "alloc");
  Tensor q = take(g->alloc(DType::kF8E4M3, {m, f}), "alloc");
  Tensor sc = take(g->alloc(DType::kF32, {m}), "alloc");
  std::map<std::string, int64_t> calls = calls_by_op(
      *g, [&] { ZI_ASSERT_OK(g->matmul_fp8_swiglu(x8, sx, lw.w, lw.scale, 64, y, q, sc)); });
  EXPECT_GT(calls["matmul_fp8_quantized"], 0) << "blocks of 64 must take the composed ops";
  Tensor bad_scale;
  const Status bad = g->matmul_fp8_swiglu(x8, sx, lw.w, lw.scale, 64, y, q, bad_scale);
  EXPECT_EQ(bad.code(), ErrorCode::kInvalidArgument) << bad.to_string();
}

// A transformer with its W8A8 w1|w3 weights in the fused GEMM's blocks: every feed-forward (two
// layers, two refiners) takes the fused op, recorded equals eager bit for bit, and the output is
// the gate-rows-first FP8 model's (the same sums in another tile: within FP8's own noise) and
// stays with the CPU's bf16 model.
TEST(CudaFp8Swiglu, TransformerRecordedEqualsEagerAndMatchesUnfused) {
  ZI_REQUIRE_GPU();
  cuda::CudaBackend* g = gpu(DType::kBF16);
  TransformerConfig cfg;
  const std::string dir = write_wide_dit(cfg, "zimage_fp8_swiglu_dit");
  FusedFp8SwigluOn on(g);
  if (g->fp8_swiglu_block(cfg.ffn_hidden(), cfg.dim) != cuda::kFp8SwigluBlock)
    GTEST_SKIP() << "no fused FP8 SwiGLU GEMM here (needs sm_90 and the fused CUTLASS GEMMs)";
  auto ws = WeightStore::open(dir);
  ASSERT_TRUE(ws.ok()) << ws.status().to_string();
  const Tensor lat = rand_host({1, 16, 32, 32}, 61, DType::kBF16);
  const Tensor cap = rand_host({20, cfg.cap_feat_dim}, 62, DType::kBF16);
  WeightPlacement p;
  p.fp8_compute = kFp8Default;
  auto fused = ZImageDiT::load(cfg, *ws, *g, p);
  ASSERT_TRUE(fused.ok()) << fused.status().to_string();
  g->set_fused_swiglu_gemm_fp8(false);
  auto plain = ZImageDiT::load(cfg, *ws, *g, p);
  g->set_fused_swiglu_gemm_fp8(true);
  ASSERT_TRUE(plain.ok()) << plain.status().to_string();
  auto cpu_dit = ZImageDiT::load(cfg, *ws, cpu_oracle());
  ASSERT_TRUE(cpu_dit.ok()) << cpu_dit.status().to_string();

  std::map<std::string, int64_t> calls;
  const Tensor eager = profiled_forward(**fused, *g, lat, cap, calls);
  EXPECT_EQ(calls["matmul_fp8_swiglu"], 4) << "feed-forwards that ran fused";
  EXPECT_EQ(calls["swiglu_fp8"], 0);
  const Tensor recorded = forward(**fused, *g, lat, cap);
  const Tensor replayed = forward(**fused, *g, lat, cap);
  std::map<std::string, int64_t> plain_calls;
  const Tensor unfused = profiled_forward(**plain, *g, lat, cap, plain_calls);
  EXPECT_EQ(plain_calls["matmul_fp8_swiglu"], 0);
  EXPECT_EQ(plain_calls["swiglu_fp8"], 4);
  const Tensor ref = forward(**cpu_dit, cpu_oracle(), lat, cap);
  ASSERT_TRUE(eager.defined() && recorded.defined() && replayed.defined() && unfused.defined() &&
              ref.defined());
  EXPECT_EQ(values(recorded), values(eager)) << "recorded forward differs from eager";
  EXPECT_EQ(values(replayed), values(eager)) << "replayed forward differs from eager";
  const ErrStats to_unfused = errors(values(eager), values(unfused));
  const ErrStats to_cpu = errors(values(eager), values(ref));
  const ErrStats unfused_to_cpu = errors(values(unfused), values(ref));
  std::printf(
      "  FP8 transformer, fused w1|w3 GEMM vs gate rows first: rel_l2 %.3e, max_abs %.3e; vs the "
      "CPU's bf16 model %.3e (unfused %.3e)\n",
      to_unfused.rel_l2, to_unfused.max_abs, to_cpu.rel_l2, unfused_to_cpu.rel_l2);
  EXPECT_LT(to_unfused.rel_l2, 1e-2);
  EXPECT_LT(to_cpu.rel_l2, 1.5 * unfused_to_cpu.rel_l2 + 1e-3);
  fused->reset();
  plain->reset();
  std::filesystem::remove_all(dir);
}

// The feed-forward's w1|w3 half at the DiT's rows (1024², 2048²), sustained medians: the FP8
// GEMM in the default tile (256 × 192 from 1024 rows) and in the fused op's (128 × 256), each
// then swiglu_fp8, against the fused op (its GEMM, then the codes' pass). Bytes moved: the
// two-op paths write [m, 2F] bf16 and read it back; the fused one writes [m, F] bf16 and reads it
// back.
TEST(CudaOpsPerf, Fp8SwigluGemm) {
  ZI_REQUIRE_GPU();
  cuda::CudaBackend* g = gpu(DType::kBF16);
  FusedFp8SwigluOn on(g);
  const int64_t f = 10240, k = 3840;
  if (g->fp8_swiglu_block(f, k) != cuda::kFp8SwigluBlock)
    GTEST_SKIP() << "no fused FP8 SwiGLU GEMM here (needs sm_90 and the fused CUTLASS GEMMs)";
  for (const int64_t m : {int64_t{4160}, int64_t{16448}}) {
    Fp8Ffn ops = fp8_ffn(g, m, f, k, 4200);
    const Tensor &x8 = ops.x8, &sx = ops.sx;
    const LinearWeight& lw = ops.w13;
    LinearWeight blocked = lw;
    blocked.w = dev_copy(g, lw.w);
    blocked.scale = dev_copy(g, lw.scale);
    ZI_ASSERT_OK(set_swiglu_block(*g, blocked, cuda::kFp8SwigluBlock));
    Tensor h = take(g->alloc(DType::kBF16, {m, 2 * f}), "h");
    Tensor y = take(g->alloc(DType::kBF16, {m, f}), "y");
    Tensor y8 = take(g->alloc(DType::kF8E4M3, {m, f}), "y8");
    Tensor ys = take(g->alloc(DType::kF32, {m}), "ys");
    const double flop = 4.0 * m * f * k, mf = static_cast<double>(m) * f;
    for (const cuda::Fp8Tile tile : {cuda::Fp8Tile::kAuto, cuda::Fp8Tile::kCoopWide}) {
      g->set_fp8_tile(tile);
      const double gemm =
          sustained_ms(g, [&] { return g->matmul_fp8_quantized(x8, sx, lw.w, lw.scale, {}, h); });
      const double both = sustained_ms(g, [&]() -> Status {
        ZI_TRY(g->matmul_fp8_quantized(x8, sx, lw.w, lw.scale, {}, h));
        return g->swiglu_fp8(h, y, y8, ys);
      });
      const char* name = tile == cuda::Fp8Tile::kAuto ? "default tile" : "128x256";
      report(cat("fp8 w1|w3 GEMM (", name, ") ", m, "x", 2 * f, "x", k), gemm, flop, 0);
      report(cat("fp8 w1|w3 GEMM (", name, ") + swiglu_fp8 ", m), both, flop, mf * 9 + 4.0 * m);
    }
    g->set_fp8_tile(cuda::Fp8Tile::kAuto);
    const double fused = sustained_ms(g, [&] {
      return g->matmul_fp8_swiglu(x8, sx, blocked.w, blocked.scale, blocked.swiglu_block, y, y8,
                                  ys);
    });
    Tensor none8, none_scale;
    const double gemm_only = sustained_ms(g, [&] {
      return g->matmul_fp8_swiglu(x8, sx, blocked.w, blocked.scale, blocked.swiglu_block, y, none8,
                                  none_scale);
    });
    report(cat("fp8 SwiGLU GEMM alone (y bf16) ", m), gemm_only, flop, mf * 2);
    report(cat("fp8 SwiGLU GEMM + codes pass ", m), fused, flop, mf * 5 + 8.0 * m);
  }
}
