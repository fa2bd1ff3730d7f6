// Every CUDA op against the CPU oracle, in f32 (normwise tolerance 1e-5) and bf16 (inputs rounded
// to bf16 first, tolerance 1e-2), over odd shapes that exercise the vector paths and their tails.
// GPU outputs are poisoned with NaN before each op so an unwritten element fails the test. Each
// comparison prints its measured errors. Attention, convolution and the memory/graph machinery
// have their own files (test_cuda_attention.cpp, test_cuda_conv.cpp, test_cuda_memory.cpp), as
// does the DiT's adaLN modulation (test_cuda_adaln.cpp); timings are in test_cuda_perf.cpp.
// Without a CUDA device every test is skipped.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "backend/cuda/kernels/kernels.h"
#include "cuda_test_util.h"

namespace zimage::test {
namespace {

// Runs `body` under each setting of the row kernels' tuning (the defaults with and without the
// shared-memory staging, ZIMAGE_STAGED_ROWS; 1, 2 and 4 packs per thread / items per warp; the
// flat and the row-walking group norm and SwiGLU; cuda::RowKernelTuning), then restores the
// settings: each layout is a path that ships.
template <typename F>
void for_each_row_tuning(F&& body) {
  const cuda::RowKernelTuning was = cuda::row_kernel_tuning();
  const bool was_staged = cuda::staged_row_kernels();
  struct Setting {
    int t;
    bool staged;
  };
  for (const Setting& c : {Setting{0, true}, Setting{0, false}, Setting{1, true}, Setting{2, true},
                           Setting{4, true}}) {
    SCOPED_TRACE(cat("RowKernelTuning ", c.t, c.staged ? " staged" : " unstaged"));
    cuda::set_row_kernel_tuning({c.t, c.t, c.t == 1 ? 1 : c.t == 0 ? 0 : 2});
    cuda::set_staged_row_kernels(c.staged);
    body();
  }
  cuda::set_row_kernel_tuning(was);
  cuda::set_staged_row_kernels(was_staged);
}

TEST(CudaOps, Matmul) {
  ZI_REQUIRE_GPU();
  struct Case {
    int64_t m, n, k;
    bool bias;
  };
  const Case cases[] = {{1, 1, 1, false},      {3, 17, 5, true},   {17, 100, 129, true},
                        {129, 64, 256, false}, {100, 3, 17, true}, {257, 384, 512, true},
                        {1, 3840, 256, true}};
  for (DType dt : kDTypes) {
    uint32_t seed = 1;
    for (const Case& c : cases) {
      Both x = both_rand({c.m, c.k}, seed++, dt);
      Both w = both_rand({c.n, c.k}, seed++, dt, -0.5f, 0.5f);
      Both b = c.bias ? both_rand({c.n}, seed++, dt) : Both{};
      Both y = outputs({c.m, c.n}, dt);
      ZI_ASSERT_OK(cpu_oracle().matmul(x.cpu, w.cpu, b.cpu, y.cpu));
      ZI_ASSERT_OK(gpu(dt)->matmul(x.gpu, w.gpu, b.gpu, y.gpu));
      expect_match(cat("matmul ", c.m, "x", c.n, "x", c.k, c.bias ? " +bias" : ""), dt, y);
    }
    // Rank-3 x and an odd element offset (misaligned for 16-byte loads): x rows 1..33 of [34, 17].
    Both xx = both_rand({34, 17}, seed++, dt);
    Tensor xv_cpu = xx.cpu.slice0(1, 34).view({3, 11, 17});
    Tensor xv_gpu = xx.gpu.slice0(1, 34).view({3, 11, 17});
    Both w = both_rand({9, 17}, seed++, dt);
    Both b = both_rand({9}, seed++, dt);
    Both y = outputs({3, 11, 9}, dt);
    ZI_ASSERT_OK(cpu_oracle().matmul(xv_cpu, w.cpu, b.cpu, y.cpu));
    ZI_ASSERT_OK(gpu(dt)->matmul(xv_gpu, w.gpu, b.gpu, y.gpu));
    expect_match("matmul misaligned rank-3 x [3, 11, 17]", dt, y);
  }
}

// FP8: the quantisation against the CPU oracle byte for byte (same scale, same rounding), and the
// FP8 GEMM against the oracle's GEMM of the dequantised operands, at DiT shapes and odd M.
TEST(CudaOps, Fp8QuantizeAndMatmul) {
  ZI_REQUIRE_GPU();
  cuda::CudaBackend* g = gpu(DType::kBF16);
  struct Case {
    int64_t m, n, k;
  };
  uint32_t seed = 1300;
  for (const Case& c :
       {Case{1, 64, 32}, Case{37, 96, 128}, Case{300, 256, 3840}, Case{4160, 3840, 10240}}) {
    Both x = both_rand({c.m, c.k}, seed++, DType::kBF16, -4.f, 4.f);
    Both w = both_rand({c.n, c.k}, seed++, DType::kBF16, -0.05f, 0.05f);
    // Weights: quantised on each side, then compared byte for byte.
    Tensor w8c = Tensor::host(DType::kF8E4M3, {c.n, c.k}), wsc = Tensor::host(DType::kF32, {1});
    ZI_ASSERT_OK(cpu_oracle().quantize_fp8(w.cpu, w8c, wsc));
    Tensor w8g = take(g->alloc(DType::kF8E4M3, {c.n, c.k}), "w8");
    Tensor wsg = take(g->alloc(DType::kF32, {1}), "ws");
    ZI_ASSERT_OK(g->quantize_fp8(w.gpu, w8g, wsg));
    Tensor w8h = Tensor::host(DType::kF8E4M3, {c.n, c.k}), wsh = Tensor::host(DType::kF32, {1});
    ZI_ASSERT_OK(g->download(w8g, w8h));
    ZI_ASSERT_OK(g->download(wsg, wsh));
    EXPECT_EQ(wsh.data_as<float>()[0], wsc.data_as<float>()[0]) << "fp8 weight scale";
    int64_t differ = 0;
    for (int64_t i = 0; i < w8h.numel(); ++i)
      differ +=
          static_cast<const uint8_t*>(w8h.data())[i] != static_cast<const uint8_t*>(w8c.data())[i];
    EXPECT_EQ(differ, 0) << "fp8 bytes differ from the CPU oracle for w " << c.n << "x" << c.k;
    Both y = outputs({c.m, c.n}, DType::kBF16);
    ZI_ASSERT_OK(cpu_oracle().matmul_fp8(x.cpu, w8c, wsc, y.cpu));
    ZI_ASSERT_OK(g->matmul_fp8(x.gpu, w8g, wsg, y.gpu));
    expect_match(label("matmul_fp8", {c.m, c.n, c.k}), DType::kBF16, y);
    // And how far FP8 is from the bf16 GEMM it replaces (reported, loose bound).
    Both yb = outputs({c.m, c.n}, DType::kBF16);
    ZI_ASSERT_OK(g->matmul(x.gpu, w.gpu, Tensor(), yb.gpu));
    expect_close(label("matmul_fp8 vs bf16 matmul", {c.m, c.n, c.k}), DType::kBF16,
                 fetch(*g, y.gpu), fetch(*g, yb.gpu), 0.08);
  }
  // An all-zero tensor: scale 1, zeros.
  Both z = both_rand({4, 32}, seed, DType::kBF16);
  ZI_ASSERT_OK(g->fill(z.gpu, 0.f));
  Tensor z8 = take(g->alloc(DType::kF8E4M3, {4, 32}), "z8");
  Tensor zs = take(g->alloc(DType::kF32, {1}), "zs");
  ZI_ASSERT_OK(g->quantize_fp8(z.gpu, z8, zs));
  EXPECT_EQ(fetch(*g, zs)[0], 1.f);
}

TEST(CudaOps, RmsNormAndLayerNorm) {
  ZI_REQUIRE_GPU();
  // Widths cover every thread layout of the register-cached path (1..32 threads per row, 2 and 4
  // packs per thread, whole-block rows with 1, 2 and 4 packs) and the loop fallback (odd widths).
  const Shape shapes[] = {{1, 1},   {3, 17},   {17, 100},  {129, 128}, {4, 3840}, {2, 5, 64},
                          {5, 512}, {3, 1024}, {2, 10240}, {3, 16384}, {2, 40000}};
  for_each_row_tuning([&] {
    for (DType dt : kDTypes) {
      uint32_t seed = 100;
      for (const Shape& s : shapes) {
        const int64_t d = s.back(), rows = shape_numel(s) / d;
        const int64_t groups = rows % 2 == 0 ? 2 : 1;
        Both x = both_rand(s, seed++, dt, -2.f, 2.f);
        Both w = both_rand({d}, seed++, dt, 0.5f, 1.5f);
        Both bias = both_rand({d}, seed++, dt);
        Both scale = both_rand({groups, d}, seed++, dt, 0.5f, 1.5f);
        for (int variant = 0; variant < 3; ++variant) {
          const Tensor wc = variant == 0 ? Tensor() : w.cpu, wg = variant == 0 ? Tensor() : w.gpu;
          const Tensor sc = variant == 2 ? scale.cpu : Tensor(),
                       sg = variant == 2 ? scale.gpu : Tensor();
          const char* tag = variant == 0 ? " plain" : variant == 1 ? " +w" : " +w +scale";
          Both y = outputs(s, dt);
          ZI_ASSERT_OK(cpu_oracle().rms_norm(x.cpu, wc, 1e-6f, sc, y.cpu));
          ZI_ASSERT_OK(gpu(dt)->rms_norm(x.gpu, wg, 1e-6f, sg, y.gpu));
          expect_match(label("rms_norm", s, tag), dt, y);
          Both z = outputs(s, dt);
          const Tensor bc = variant == 0 ? Tensor() : bias.cpu;
          const Tensor bg = variant == 0 ? Tensor() : bias.gpu;
          ZI_ASSERT_OK(cpu_oracle().layer_norm(x.cpu, wc, bc, 1e-6f, sc, z.cpu));
          ZI_ASSERT_OK(gpu(dt)->layer_norm(x.gpu, wg, bg, 1e-6f, sg, z.gpu));
          expect_match(label("layer_norm", s, tag), dt, z);
        }
        // In place.
        Both ip = both(rand_host(s, seed++, dt), dt);
        ZI_ASSERT_OK(cpu_oracle().rms_norm(ip.cpu, w.cpu, 1e-5f, Tensor(), ip.cpu));
        ZI_ASSERT_OK(gpu(dt)->rms_norm(ip.gpu, w.gpu, 1e-5f, Tensor(), ip.gpu));
        expect_match(label("rms_norm in place", s), dt, ip);
      }
    }
  });
}

TEST(CudaOps, ResidualRmsNormGate) {
  ZI_REQUIRE_GPU();
  const Shape shapes[] = {{1, 1, 7}, {2, 17, 100}, {2, 33, 128}, {1, 5, 3840}, {2, 3, 10240}};
  for_each_row_tuning([&] {
    for (DType dt : kDTypes) {
      uint32_t seed = 200;
      for (const Shape& s : shapes) {
        const int64_t d = s.back();
        const Tensor xh = rand_host(s, seed++, dt);
        Both y = both_rand(s, seed++, dt, -3.f, 3.f);
        Both w = both_rand({d}, seed++, dt, 0.5f, 1.5f);
        Both gate = both_rand({s[0], d}, seed++, dt);
        for (int variant = 0; variant < 2; ++variant) {
          Both x = both(xh, dt);
          const Tensor wc = variant ? w.cpu : Tensor(), wg = variant ? w.gpu : Tensor();
          const Tensor gc = variant ? gate.cpu : Tensor(), gg = variant ? gate.gpu : Tensor();
          ZI_ASSERT_OK(cpu_oracle().residual_rms_norm_gate(x.cpu, y.cpu, wc, 1e-5f, gc));
          ZI_ASSERT_OK(gpu(dt)->residual_rms_norm_gate(x.gpu, y.gpu, wg, 1e-5f, gg));
          expect_match(label("residual_rms_norm_gate", s, variant ? " +w +gate" : " plain"), dt, x);
        }
      }
    }
  });
}

// The gated residual and the next pre-norm fused (ZIMAGE_FUSED_NORM's kernel) against the CPU
// oracle's two ops, and bit for bit against the GPU's own two kernels: both outputs (x updated,
// out), every register-cached thread layout, with and without weights, gate and scale; rows the
// fused form does not take (odd widths) and out == x fall back to the two kernels.
TEST(CudaOps, ResidualNormGateThenNormFused) {
  ZI_REQUIRE_GPU();
  // 3840, 2048 and 6144 wide at one pack a thread (per-row gate and scale of 1, 2 and 3 groups);
  // 10240 at two packs a thread; the narrow ones in warps.
  const Shape shapes[] = {{1, 1, 8},    {2, 17, 128}, {2, 33, 512},  {1, 5, 3840}, {2, 9, 3840},
                          {3, 4, 2048}, {1, 3, 6144}, {2, 3, 10240}, {1, 3, 7}};
  for_each_row_tuning([&] {
    for (DType dt : kDTypes) {
      uint32_t seed = 250;
      for (const Shape& s : shapes) {
        const int64_t d = s.back(), rows = shape_numel(s) / d;
        const Tensor xh = rand_host(s, seed++, dt);
        Both y = both_rand(s, seed++, dt, -3.f, 3.f);
        Both w = both_rand({d}, seed++, dt, 0.5f, 1.5f);
        Both wn = both_rand({d}, seed++, dt, 0.5f, 1.5f);
        Both gate = both_rand({s[0], d}, seed++, dt);
        Both scale = both_rand({s[0], d}, seed++, dt, 0.5f, 1.5f);
        for (int variant = 0; variant < 2; ++variant) {
          auto pick = [&](const Both& b, bool cpu) {
            return variant ? (cpu ? b.cpu : b.gpu) : Tensor();
          };
          const std::string tag =
              label("residual_norm_gate_then_norm", s, variant ? " +all" : " plain");
          // The CPU oracle's two ops.
          Both x = both(xh, dt);
          Both out = outputs({rows, d}, dt);
          ZI_ASSERT_OK(cpu_oracle().residual_norm_gate_then_norm(x.cpu, y.cpu, pick(w, true), 1e-5f,
                                                                 pick(gate, true), pick(wn, true),
                                                                 pick(scale, true), out.cpu));
          // The GPU's two kernels, then the fused one on a fresh x.
          cuda::CudaBackend* g = gpu(dt);
          const bool was = g->fused_norm();
          g->set_fused_norm(false);
          Both x2 = both(xh, dt);
          Both out2 = outputs({rows, d}, dt);
          ZI_ASSERT_OK(g->residual_norm_gate_then_norm(x2.gpu, y.gpu, pick(w, false), 1e-5f,
                                                       pick(gate, false), pick(wn, false),
                                                       pick(scale, false), out2.gpu));
          g->set_fused_norm(true);
          ZI_ASSERT_OK(g->residual_norm_gate_then_norm(x.gpu, y.gpu, pick(w, false), 1e-5f,
                                                       pick(gate, false), pick(wn, false),
                                                       pick(scale, false), out.gpu));
          g->set_fused_norm(was);
          expect_match(tag + " x", dt, x);
          expect_match(tag + " out", dt, out);
          EXPECT_EQ(fetch(*g, x.gpu), fetch(*g, x2.gpu)) << tag;  // the same bits
          EXPECT_EQ(fetch(*g, out.gpu), fetch(*g, out2.gpu)) << tag;
        }
      }
    }
  });
}

TEST(CudaOps, GroupNorm) {
  ZI_REQUIRE_GPU();
  struct Case {
    Shape s;
    int groups;
    bool silu, affine;
  };
  const Case cases[] = {{{1, 5, 7, 64}, 32, false, true},
                        {{2, 3, 3, 17}, 1, true, true},
                        {{1, 16, 16, 128}, 32, true, true},
                        {{2, 9, 5, 24}, 6, false, false},
                        {{1, 64, 64, 512}, 32, true, true},
                        {{3, 1, 1, 8}, 4, true, true},
                        // The row-walking kernels (channels a power-of-two count of packs): a
                        // batch of two, several rows per thread, a short last chunk.
                        {{2, 7, 9, 256}, 32, true, true},
                        {{1, 256, 256, 128}, 32, true, true},
                        {{1, 255, 257, 64}, 32, false, true}};
  for_each_row_tuning([&] {
    for (DType dt : kDTypes) {
      uint32_t seed = 300;
      for (const Case& c : cases) {
        const int64_t ch = c.s[3];
        Both x = both_rand(c.s, seed++, dt, -1.f, 3.f);
        Both g = c.affine ? both_rand({ch}, seed++, dt, 0.5f, 1.5f) : Both{};
        Both b = c.affine ? both_rand({ch}, seed++, dt) : Both{};
        Both y = outputs(c.s, dt);
        ZI_ASSERT_OK(cpu_oracle().group_norm(x.cpu, g.cpu, b.cpu, c.groups, 1e-6f, c.silu, y.cpu));
        ZI_ASSERT_OK(gpu(dt)->group_norm(x.gpu, g.gpu, b.gpu, c.groups, 1e-6f, c.silu, y.gpu));
        expect_match(label("group_norm", c.s, c.silu ? " +silu" : ""), dt, y);
      }
      // In place.
      Both x = both_rand({1, 8, 8, 32}, seed++, dt);
      ZI_ASSERT_OK(cpu_oracle().group_norm(x.cpu, Tensor(), Tensor(), 8, 1e-6f, true, x.cpu));
      ZI_ASSERT_OK(gpu(dt)->group_norm(x.gpu, Tensor(), Tensor(), 8, 1e-6f, true, x.gpu));
      expect_match("group_norm in place [1, 8, 8, 32]", dt, x);
    }
  });
  // In place, with enough rows that the row-walking apply pass loads 4 rows a step (its grid is
  // capped at 8192 blocks: 1024 channels = 2 rows a block, so more than 3 x 16384 rows), as the
  // VAE calls it (x == y, + SiLU, affine).
  const DType dt = DType::kBF16;
  Both x = both_rand({1, 224, 224, 1024}, 390, dt, -1.f, 3.f);
  Both g = both_rand({1024}, 391, dt, 0.5f, 1.5f), b = both_rand({1024}, 392, dt);
  ZI_ASSERT_OK(cpu_oracle().group_norm(x.cpu, g.cpu, b.cpu, 32, 1e-6f, true, x.cpu));
  ZI_ASSERT_OK(gpu(dt)->group_norm(x.gpu, g.gpu, b.gpu, 32, 1e-6f, true, x.gpu));
  expect_match("group_norm in place [1, 224, 224, 1024] +silu", dt, x);
}

TEST(CudaOps, Rope) {
  ZI_REQUIRE_GPU();
  const Shape shapes[] = {{2, 17, 3, 128}, {1, 5, 2, 6}, {1, 3, 2, 10}, {3, 33, 4, 64}};
  for (DType dt : kDTypes) {
    uint32_t seed = 400;
    for (const Shape& s : shapes) {
      const int64_t b = s[0], seq = s[1], dh = s[3];
      const Tensor xh = rand_host(s, seed++, dt);
      // Rotate-half: tables [S, Dh] f32 (any values exercise the formula).
      Both cs = both_as(rand_host({seq, dh}, seed++, DType::kF32), dt, DType::kF32);
      Both sn = both_as(rand_host({seq, dh}, seed++, DType::kF32), dt, DType::kF32);
      {
        Both x = both(xh, dt);
        ZI_ASSERT_OK(cpu_oracle().rope_half(x.cpu, cs.cpu, sn.cpu));
        ZI_ASSERT_OK(gpu(dt)->rope_half(x.gpu, cs.gpu, sn.gpu));
        expect_match(label("rope_half", s), dt, x);
      }
      for (int shared = 0; shared < 2; ++shared) {
        Both x = both(xh, dt);
        Both f = both_as(rand_host({shared ? 1 : b, seq, dh / 2, 2}, seed++, DType::kF32), dt,
                         DType::kF32);
        ZI_ASSERT_OK(cpu_oracle().rope_interleaved(x.cpu, f.cpu));
        ZI_ASSERT_OK(gpu(dt)->rope_interleaved(x.gpu, f.gpu));
        expect_match(label("rope_interleaved", s, shared ? " shared freqs" : ""), dt, x);
      }
    }
  }
}

// The fused attention prologue against the CPU oracle (the composed ops), with and without norm
// and RoPE, GQA, shared tables, odd head counts and head_dim; and fused vs composed on the GPU.
TEST(CudaOps, QkvSplitNormRope) {
  ZI_REQUIRE_GPU();
  struct Case {
    int64_t b, s, hq, hkv, dh;
    bool norm, rope, shared;
  };
  const Case cases[] = {
      {1, 17, 3, 3, 128, true, true, false},
      {2, 33, 6, 2, 64, true, true, false},
      {3, 5, 2, 1, 10, false, true, true},
      {2, 7, 4, 4, 256, true, false, false},
      {1, 64, 30, 30, 128, true, true, false},
      {2, 9, 1, 1, 2, true, true, true},
      // head_dim 128 takes the vectorised kernel: shared freqs, no norm, grouped KV heads
      {2, 33, 30, 30, 128, true, true, true},
      {1, 17, 4, 2, 128, false, true, false},
      {2, 5, 32, 8, 128, true, false, false},
      // 3 heads a row: a warp's 2 or 4 items often span two rows (each row's (cos, sin) loaded
      // once); a shared table (batch 2). (Three rows in one warp's items need fewer than 3
      // heads, i.e. no k/v heads; the kernel loads such a middle row's table directly.)
      {2, 9, 1, 1, 128, true, true, false},
      {2, 7, 1, 1, 128, true, true, true}};
  for_each_row_tuning([&] {
    for (DType dt : kDTypes) {
      uint32_t seed = 900;
      for (const Case& c : cases) {
        const int64_t rows = c.b * c.s, f = (c.hq + 2 * c.hkv) * c.dh;
        Both qkv = both_rand({rows, f}, seed++, dt, -3.f, 3.f);
        Both wq = both_rand({c.dh}, seed++, dt, 0.5f, 1.5f);
        Both wk = both_rand({c.dh}, seed++, dt, 0.5f, 1.5f);
        Both fr = both_as(rand_host({c.shared ? 1 : c.b, c.s, c.dh / 2, 2}, seed++, DType::kF32),
                          dt, DType::kF32);
        Both q = outputs({c.b, c.s, c.hq, c.dh}, dt), k = outputs({c.b, c.s, c.hkv, c.dh}, dt),
             v = outputs({c.b, c.s, c.hkv, c.dh}, dt);
        const Tensor none;
        const Tensor& wqc = c.norm ? wq.cpu : none;
        const Tensor& wkc = c.norm ? wk.cpu : none;
        const Tensor& wqg = c.norm ? wq.gpu : none;
        const Tensor& wkg = c.norm ? wk.gpu : none;
        ZI_ASSERT_OK(cpu_oracle().qkv_split_norm_rope(qkv.cpu, wqc, wkc, 1e-5f,
                                                      c.rope ? fr.cpu : none, q.cpu, k.cpu, v.cpu));
        cuda::CudaBackend* g = gpu(dt);
        ZI_ASSERT_OK(g->qkv_split_norm_rope(qkv.gpu, wqg, wkg, 1e-5f, c.rope ? fr.gpu : none, q.gpu,
                                            k.gpu, v.gpu));
        const std::string tag = cat(" hq", c.hq, " hkv", c.hkv, c.norm ? " norm" : "",
                                    c.rope ? " rope" : "", c.shared ? " shared" : "");
        expect_match(label("qkv_split_norm_rope q", {c.b, c.s, c.hq, c.dh}, tag), dt, q);
        expect_match(label("qkv_split_norm_rope k", {c.b, c.s, c.hkv, c.dh}, tag), dt, k);
        expect_match(label("qkv_split_norm_rope v", {c.b, c.s, c.hkv, c.dh}, tag), dt, v);
        // Fused vs the composed ops on the GPU: the same roundings, so they agree to within an ulp
        // where FMA contraction or the reduction order differs.
        Both q2 = outputs({c.b, c.s, c.hq, c.dh}, dt), k2 = outputs({c.b, c.s, c.hkv, c.dh}, dt),
             v2 = outputs({c.b, c.s, c.hkv, c.dh}, dt);
        g->set_fused(false);
        const Status st = g->qkv_split_norm_rope(qkv.gpu, wqg, wkg, 1e-5f, c.rope ? fr.gpu : none,
                                                 q2.gpu, k2.gpu, v2.gpu);
        g->set_fused(true);
        ZI_ASSERT_OK(st);
        expect_close("fused vs composed q" + tag, dt, fetch(*g, q.gpu), fetch(*g, q2.gpu));
        expect_close("fused vs composed k" + tag, dt, fetch(*g, k.gpu), fetch(*g, k2.gpu));
        expect_close("fused vs composed v" + tag, dt, fetch(*g, v.gpu), fetch(*g, v2.gpu), 0.0);
      }
    }
  });
}

TEST(CudaOps, ElementwiseOps) {
  ZI_REQUIRE_GPU();
  const Shape shapes[] = {{1}, {3, 1001}, {8, 64}, {17, 129}};
  for (DType dt : kDTypes) {
    uint32_t seed = 500;
    for (const Shape& s : shapes) {
      Both x = both_rand(s, seed++, dt, -6.f, 6.f);
      Both y = both_rand(s, seed++, dt);
      Both o1 = outputs(s, dt), o2 = outputs(s, dt), o3 = outputs(s, dt), o4 = outputs(s, dt);
      ZI_ASSERT_OK(cpu_oracle().silu(x.cpu, o1.cpu));
      ZI_ASSERT_OK(gpu(dt)->silu(x.gpu, o1.gpu));
      expect_match(label("silu", s), dt, o1);
      ZI_ASSERT_OK(cpu_oracle().tanh(x.cpu, o2.cpu));
      ZI_ASSERT_OK(gpu(dt)->tanh(x.gpu, o2.gpu));
      expect_match(label("tanh", s), dt, o2);
      Both o5 = outputs(s, dt);
      ZI_ASSERT_OK(cpu_oracle().clamp(x.cpu, -2.5f, 1.25f, o5.cpu));
      ZI_ASSERT_OK(gpu(dt)->clamp(x.gpu, -2.5f, 1.25f, o5.gpu));
      expect_match(label("clamp", s), dt, o5);
      ZI_ASSERT_OK(cpu_oracle().axpby(0.75f, x.cpu, -1.25f, y.cpu, o3.cpu));
      ZI_ASSERT_OK(gpu(dt)->axpby(0.75f, x.gpu, -1.25f, y.gpu, o3.gpu));
      expect_match(label("axpby", s), dt, o3);
      ZI_ASSERT_OK(cpu_oracle().add(x.cpu, y.cpu, o4.cpu));
      ZI_ASSERT_OK(gpu(dt)->add(x.gpu, y.gpu, o4.gpu));
      expect_match(label("add", s), dt, o4);
      // In place: silu(x) -> x, then x += y.
      Both ip = both(rand_host(s, seed++, dt), dt);
      ZI_ASSERT_OK(cpu_oracle().silu(ip.cpu, ip.cpu));
      ZI_ASSERT_OK(gpu(dt)->silu(ip.gpu, ip.gpu));
      ZI_ASSERT_OK(cpu_oracle().add(ip.cpu, y.cpu, ip.cpu));
      ZI_ASSERT_OK(gpu(dt)->add(ip.gpu, y.gpu, ip.gpu));
      expect_match(label("silu + add in place", s), dt, ip);
    }
    // Broadcast add: y over leading dims (aligned and odd periods), y of one element.
    const std::pair<Shape, Shape> bc[] = {
        {{17, 100}, {100}}, {{4, 9, 64}, {9, 64}}, {{5, 7}, {1}}, {{3, 13, 8}, {8}}};
    for (const auto& [xs, ys] : bc) {
      Both x = both_rand(xs, seed++, dt);
      Both y = both_rand(ys, seed++, dt);
      Both o = outputs(xs, dt);
      ZI_ASSERT_OK(cpu_oracle().add(x.cpu, y.cpu, o.cpu));
      ZI_ASSERT_OK(gpu(dt)->add(x.gpu, y.gpu, o.gpu));
      expect_match(label("add broadcast", xs, cat(" + ", shape_str(ys))), dt, o);
    }
    // SwiGLU, under each row layout (the row-walking kernel takes widths of whole 16-byte packs:
    // 2x128, 2x264, 2x24000, and 2x100 in f32; the rest stay on the flat kernels).
    const Shape sw[] = {{1, 2}, {17, 200}, {3, 258}, {4, 2, 256}, {5, 528}, {2, 48000}};
    for_each_row_tuning([&] {
      for (const Shape& s : sw) {
        Shape ys = s;
        ys.back() /= 2;
        Both x = both_rand(s, seed++, dt, -4.f, 4.f);
        Both o = outputs(ys, dt);
        ZI_ASSERT_OK(cpu_oracle().swiglu(x.cpu, o.cpu));
        ZI_ASSERT_OK(gpu(dt)->swiglu(x.gpu, o.gpu));
        expect_match(label("swiglu", s), dt, o);
      }
    });
  }
}

// clamp keeps NaN as NaN (torch.clamp and the CPU oracle do): the VAE's final clamp must not turn
// a NaN image into a black one that the pipeline's finite check cannot see.
TEST(CudaOps, ClampPropagatesNaN) {
  ZI_REQUIRE_GPU();
  for (DType dt : kDTypes) {
    Tensor h = Tensor::host(DType::kF32, {4});
    float* p = h.data_as<float>();
    p[0] = std::numeric_limits<float>::quiet_NaN();
    p[1] = -3.0f;
    p[2] = 0.25f;
    p[3] = std::numeric_limits<float>::infinity();
    Both x = both(h, dt);
    Both o = outputs({4}, dt);
    ZI_ASSERT_OK(cpu_oracle().clamp(x.cpu, 0.0f, 1.0f, o.cpu));
    ZI_ASSERT_OK(gpu(dt)->clamp(x.gpu, 0.0f, 1.0f, o.gpu));
    Tensor got = Tensor::host(DType::kF32, {4});
    ZI_ASSERT_OK(gpu(dt)->download(o.gpu, got));
    const float* g = got.data_as<float>();
    const float* c = o.cpu.data_as<float>();
    EXPECT_TRUE(std::isnan(c[0])) << "cpu";
    EXPECT_TRUE(std::isnan(g[0])) << dtype_name(dt);
    EXPECT_EQ(g[1], 0.0f);
    EXPECT_EQ(g[2], 0.25f);
    EXPECT_EQ(g[3], 1.0f);
  }
}

TEST(CudaOps, SumSquares) {
  ZI_REQUIRE_GPU();
  const Shape shapes[] = {{1, 1}, {3, 1001}, {2, 16, 64, 64}, {7, 5}};
  for (DType dt : kDTypes) {
    uint32_t seed = 600;
    for (const Shape& s : shapes) {
      Both x = both_rand(s, seed++, dt);
      auto c = take(cpu_oracle().sum_squares(x.cpu), "cpu sum_squares");
      auto g = take(gpu(dt)->sum_squares(x.gpu), "gpu sum_squares");
      ASSERT_EQ(c.size(), g.size());
      double worst = 0;
      for (size_t i = 0; i < c.size(); ++i) worst = std::max(worst, std::fabs(g[i] - c[i]) / c[i]);
      std::printf("  %-56s %-4s max rel %.2e\n", label("sum_squares", s).c_str(), dtype_name(dt),
                  worst);
      EXPECT_LE(worst, 1e-9) << label("sum_squares", s);
    }
  }
}

TEST(CudaOps, LayoutOps) {
  ZI_REQUIRE_GPU();
  for (DType dt : kDTypes) {
    uint32_t seed = 800;
    // Upsample, flat and row-walking (channels of whole packs: batch 2, rows wider than a block).
    const Shape us[] = {{2, 3, 5, 17}, {1, 4, 4, 64}, {1, 1, 1, 1}, {2, 7, 300, 32}};
    for_each_row_tuning([&] {
      for (const Shape& s : us) {
        Both x = both_rand(s, seed++, dt);
        Both y = outputs({s[0], 2 * s[1], 2 * s[2], s[3]}, dt);
        ZI_ASSERT_OK(cpu_oracle().upsample_nearest2x(x.cpu, y.cpu));
        ZI_ASSERT_OK(gpu(dt)->upsample_nearest2x(x.gpu, y.gpu));
        expect_match(label("upsample_nearest2x", s), dt, y, 0.0);
      }
    });
    // Embedding (ids include both ends of the table).
    for (const auto& [v, d] : {std::pair<int64_t, int64_t>{1000, 100}, {50, 64}, {7, 3}}) {
      Both table = both_rand({v, d}, seed++, dt);
      Tensor ids = Tensor::host(DType::kI32, {13});
      for (int i = 0; i < 13; ++i) ids.data_as<int32_t>()[i] = static_cast<int32_t>((i * 37) % v);
      ids.data_as<int32_t>()[12] = static_cast<int32_t>(v - 1);
      Both out = outputs({13, d}, dt);
      ZI_ASSERT_OK(cpu_oracle().embedding(table.cpu, ids, out.cpu));
      ZI_ASSERT_OK(gpu(dt)->embedding(table.gpu, ids, out.gpu));
      expect_match(label("embedding", {v, d}), dt, out, 0.0);
    }
    // Patchify / unpatchify (f32 latents, act-dtype tokens; unpatchify reads a longer sequence).
    for (int p : {1, 2}) {
      const Shape ls = {2, 16, 8, 12};
      const int64_t n = (8 / p) * (12 / p), f = int64_t{p} * p * 16;
      Both lat = both_as(rand_host(ls, seed++, dt), dt, DType::kF32);
      Both tok = outputs({2, n, f}, dt);
      ZI_ASSERT_OK(cpu_oracle().patchify(lat.cpu, p, tok.cpu));
      ZI_ASSERT_OK(gpu(dt)->patchify(lat.gpu, p, tok.gpu));
      expect_match(label("patchify", ls, p == 2 ? " p2" : " p1"), dt, tok, 0.0);
      Both longer = both_rand({2, n + 5, f}, seed++, dt);
      Both out = outputs(ls, dt, DType::kF32);
      ZI_ASSERT_OK(cpu_oracle().unpatchify(longer.cpu, p, -1.5f, out.cpu));
      ZI_ASSERT_OK(gpu(dt)->unpatchify(longer.gpu, p, -1.5f, out.gpu));
      expect_match(label("unpatchify", ls, " alpha -1.5"), dt, out, 1e-7);
    }
  }
}

TEST(CudaOps, ConvertUploadDownloadCopyFill) {
  ZI_REQUIRE_GPU();
  cuda::CudaBackend* g = gpu(DType::kBF16);
  const Tensor h = rand_host({3, 1001}, 900, DType::kF32, -100.f, 100.f);
  // f32 -> bf16 on upload rounds exactly like the host conversion; back to f32 is exact.
  Tensor b = take(g->upload(h, DType::kBF16), "upload bf16");
  std::vector<float> back = fetch(*g, b);
  int64_t mismatches = 0;
  for (int64_t i = 0; i < h.numel(); ++i)
    mismatches += back[i] != round_bf16(h.data_as<float>()[i]);
  EXPECT_EQ(mismatches, 0) << "upload f32 -> bf16 rounding";
  // Device convert chain f32 -> f16 -> bf16 -> f32 versus the host conversions.
  Tensor f = take(g->upload(h, DType::kF32), "upload f32");
  Tensor f16 = take(g->alloc(DType::kF16, h.shape()), "alloc");
  Tensor bf = take(g->alloc(DType::kBF16, h.shape()), "alloc");
  Tensor f32b = take(g->alloc(DType::kF32, h.shape()), "alloc");
  ZI_ASSERT_OK(g->convert(f, f16));
  ZI_ASSERT_OK(g->convert(f16, bf));
  ZI_ASSERT_OK(g->convert(bf, f32b));
  std::vector<float> chain = fetch(*g, f32b);
  mismatches = 0;
  for (int64_t i = 0; i < h.numel(); ++i) {
    const float want = round_bf16(f16_to_f32(f32_to_f16(h.data_as<float>()[i])));
    mismatches += chain[i] != want;
  }
  EXPECT_EQ(mismatches, 0) << "convert f32 -> f16 -> bf16 -> f32";
  // Download into a bf16 host tensor converts on the device.
  Tensor hb = Tensor::host(DType::kBF16, h.shape());
  ZI_ASSERT_OK(g->download(f, hb));
  EXPECT_EQ(reinterpret_cast<uint16_t*>(hb.data())[5], f32_to_bf16(h.data_as<float>()[5]));
  // copy_2d: a [5 x 7] block from offset 3, stride 11 into offset 2, stride 9.
  const Tensor src_h = rand_host({64}, 901, DType::kF32);
  Tensor src = take(g->upload(src_h, DType::kF32), "src");
  Tensor dst = take(g->alloc(DType::kF32, {50}), "dst");
  ZI_ASSERT_OK(g->fill(dst, -7.f));
  ZI_ASSERT_OK(g->copy_2d(src, 3, 11, dst, 2, 9, 5, 7));
  std::vector<float> d = fetch(*g, dst);
  for (int64_t i = 0; i < 50; ++i) {
    const int64_t r = (i - 2) / 9, c = (i - 2) % 9;
    const bool inside = i >= 2 && r < 5 && c < 7;
    const float want = inside ? src_h.data_as<float>()[3 + r * 11 + c] : -7.f;
    ASSERT_EQ(d[i], want) << "copy_2d element " << i;
  }
  EXPECT_FALSE(g->copy_2d(src, 60, 11, dst, 0, 9, 1, 7).ok()) << "copy_2d past the end";
  // fill in bf16 with a value bf16 cannot hold exactly.
  ZI_ASSERT_OK(g->fill(b, 0.1f));
  std::vector<float> fb = fetch(*g, b);
  EXPECT_EQ(fb.front(), round_bf16(0.1f));
  EXPECT_EQ(fb.back(), round_bf16(0.1f));
}

TEST(CudaOps, ErrorsAreStatuses) {
  ZI_REQUIRE_GPU();
  cuda::CudaBackend* g = gpu(DType::kBF16);
  Tensor x = take(g->alloc(DType::kBF16, {4, 8}), "x");
  Tensor w = take(g->alloc(DType::kBF16, {6, 9}), "w");
  Tensor y = take(g->alloc(DType::kBF16, {4, 6}), "y");
  Tensor xf = take(g->alloc(DType::kF32, {4, 8}), "xf");
  Tensor host = Tensor::host(DType::kBF16, {4, 8});
  EXPECT_EQ(g->matmul(x, w, Tensor(), y).code(), ErrorCode::kInvalidArgument) << "K mismatch";
  EXPECT_EQ(g->matmul(host, w, Tensor(), y).code(), ErrorCode::kInvalidArgument) << "host input";
  EXPECT_EQ(g->rms_norm(xf, Tensor(), 1e-6f, Tensor(), xf).code(), ErrorCode::kInvalidArgument)
      << "f32 tensor on a bf16 backend";
  Tensor scale = take(g->alloc(DType::kBF16, {3, 8}), "scale");
  EXPECT_EQ(g->rms_norm(x, Tensor(), 1e-6f, scale, x).code(), ErrorCode::kInvalidArgument)
      << "3 scale groups for 4 rows";
  Tensor q = take(g->alloc(DType::kBF16, {2, 5, 4, 16}), "q");
  Tensor k = take(g->alloc(DType::kBF16, {2, 5, 3, 16}), "k");
  Tensor o = take(g->alloc(DType::kBF16, {2, 5, 4, 16}), "o");
  EXPECT_EQ(g->attention(q, k, k, {}, o).code(), ErrorCode::kInvalidArgument) << "4 % 3 heads";
  AttentionParams bad_len;
  bad_len.key_len = {5};
  EXPECT_EQ(g->attention(q, q, q, bad_len, o).code(), ErrorCode::kInvalidArgument)
      << "key_len size";
  bad_len.key_len = {5, 6};
  EXPECT_EQ(g->attention(q, q, q, bad_len, o).code(), ErrorCode::kInvalidArgument)
      << "key_len > Sk";
  EXPECT_EQ(g->attention(q, q, q, {}, q).code(), ErrorCode::kInvalidArgument) << "out aliases q";
  Tensor img = take(g->alloc(DType::kBF16, {1, 8, 8, 4}), "img");
  Tensor cw = take(g->alloc(DType::kBF16, {4, 3, 3, 5}), "cw");
  EXPECT_EQ(g->conv2d(img, cw, Tensor(), {}, img).code(), ErrorCode::kInvalidArgument)
      << "conv Cin mismatch";
  Tensor table = take(g->alloc(DType::kBF16, {10, 8}), "table");
  Tensor ids = Tensor::host(DType::kI32, {2});
  ids.data_as<int32_t>()[1] = 10;
  Tensor emb = take(g->alloc(DType::kBF16, {2, 8}), "emb");
  EXPECT_EQ(g->embedding(table, ids, emb).code(), ErrorCode::kInvalidArgument) << "id 10 of 10";
  Tensor sw = take(g->alloc(DType::kBF16, {4, 16}), "sw");
  Tensor sw_out(sw.storage(), sw.byte_offset(), DType::kBF16, {4, 8});  // aliases sw's start
  EXPECT_EQ(g->swiglu(sw, sw_out).code(), ErrorCode::kInvalidArgument)
      << "swiglu in place over several rows";
  EXPECT_EQ(g->group_norm(img, Tensor(), Tensor(), 3, 1e-6f, false, img).code(),
            ErrorCode::kInvalidArgument)
      << "3 groups of 4 channels";
  EXPECT_EQ(g->alloc(DType::kBF16, {-1, 4}).status().code(), ErrorCode::kInvalidArgument);
  auto bad = make_cuda_backend(0, DType::kI32);
  EXPECT_FALSE(bad.ok());
  auto none = make_cuda_backend(1000, DType::kBF16);
  EXPECT_EQ(none.status().code(), ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace zimage::test

namespace zimage::test {
namespace {

// The CUDA denoising update is bit-identical to the CPU oracle (itself the pipeline's host
// arithmetic, tests/ops): no fused multiply-add may slip in.
TEST(CudaOps, GuidedEulerStepBitIdenticalToCpu) {
  ZI_REQUIRE_GPU();
  Backend& g = *gpu(DType::kBF16);  // the latents path is f32 on either backend
  for (int64_t n : {1, 4099, 262144}) {
    Tensor pos = rand_host({n}, 910, DType::kF32, -3.f, 3.f);
    Tensor neg = rand_host({n}, 911, DType::kF32, -3.f, 3.f);
    Tensor lat = rand_host({n}, 912, DType::kF32, -2.f, 2.f);
    for (float gs : {0.0f, 1.0f, 4.5f}) {
      const float dt = -0.0873f;
      Tensor want = take(cpu_oracle().upload(lat, DType::kF32), "cpu");
      ZI_ASSERT_OK(cpu_oracle().guided_euler_step(pos, gs > 0 ? neg : Tensor(), gs, dt, want));
      Tensor gp = take(g.upload(pos, DType::kF32), "pos");
      Tensor gn = take(g.upload(neg, DType::kF32), "neg");
      Tensor gl = take(g.upload(lat, DType::kF32), "lat");
      ZI_ASSERT_OK(g.guided_euler_step(gp, gs > 0 ? gn : Tensor(), gs, dt, gl));
      Tensor got = Tensor::host(DType::kF32, {n});
      ZI_ASSERT_OK(g.download(gl, got));
      EXPECT_EQ(std::memcmp(got.data(), want.data(), static_cast<size_t>(n) * 4), 0)
          << "n=" << n << " g=" << gs;
    }
  }
}

TEST(CudaOps, CountNonfinite) {
  ZI_REQUIRE_GPU();
  for (DType dt : {DType::kF32, DType::kBF16}) {
    Tensor h = rand_host({100000}, 913, DType::kF32);
    h.data_as<float>()[7] = std::numeric_limits<float>::quiet_NaN();
    h.data_as<float>()[99999] = std::numeric_limits<float>::infinity();
    h.data_as<float>()[500] = -std::numeric_limits<float>::infinity();
    Tensor x = take(gpu(dt)->upload(h, dt), "x");
    auto bad = gpu(dt)->count_nonfinite(x);
    ASSERT_TRUE(bad.ok()) << bad.status().to_string();
    EXPECT_EQ(*bad, 3) << dtype_name(dt);
    auto none = gpu(dt)->count_nonfinite(x.slice0(8, 500));
    ASSERT_TRUE(none.ok());
    EXPECT_EQ(*none, 0);
  }
}

}  // namespace
}  // namespace zimage::test
