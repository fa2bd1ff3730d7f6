// The DiT's adaLN modulation on the GPU against the CPU oracle: the modulation alone, the
// projection and modulation of one block (the fused kernel and the two ops), and every block's at
// once (dit_modulation_layers, the default), bit for bit against the per-block kernel. Split from
// test_cuda_ops.cpp; the test names stay CudaOps.*. Without a CUDA device every test is skipped.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "cuda_test_util.h"

namespace zimage::test {
namespace {

TEST(CudaOps, DitModulation) {
  ZI_REQUIRE_GPU();
  for (DType dt : kDTypes) {
    for (int64_t b : {1, 3}) {
      for (int64_t d : {1, 7, 3840}) {
        Both mod = both_rand({b, 4 * d}, static_cast<uint32_t>(950 + b + d), dt, -3.f, 3.f);
        Both sa = outputs({b, d}, dt), ga = outputs({b, d}, dt), sf = outputs({b, d}, dt),
             gf = outputs({b, d}, dt);
        ZI_ASSERT_OK(cpu_oracle().dit_modulation(mod.cpu, sa.cpu, ga.cpu, sf.cpu, gf.cpu));
        ZI_ASSERT_OK(gpu(dt)->dit_modulation(mod.gpu, sa.gpu, ga.gpu, sf.gpu, gf.gpu));
        const Shape s{b, d};
        expect_match(label("dit_modulation scale_a", s), dt, sa);
        expect_match(label("dit_modulation gate_a", s), dt, ga);
        expect_match(label("dit_modulation scale_f", s), dt, sf);
        expect_match(label("dit_modulation gate_f", s), dt, gf);
      }
    }
  }
}

// The adaLN projection + modulation (ZIMAGE_FUSED_ADALN's kernel) against the CPU oracle's two
// ops and the GPU's own two; `mod` (poisoned with NaN) shows which path ran: left unwritten by the
// fused kernel (batches up to 4, K a multiple of the 16-byte pack), written by the fallback.
TEST(CudaOps, MatmulDitModulation) {
  ZI_REQUIRE_GPU();
  struct Case {
    int64_t b, d, k;
    bool bias;
  };
  const Case cases[] = {{1, 7, 256, true},   {2, 3840, 256, true}, {3, 33, 64, false},
                        {4, 100, 264, true}, {1, 5, 1024, false},  {5, 16, 256, true},
                        {1, 8, 12, true}};
  for (DType dt : kDTypes) {
    cuda::CudaBackend* g = gpu(dt);
    const bool was = g->fused_adaln(), was_layers = g->adaln_layers();
    g->set_adaln_layers(false);  // which otherwise has every block take the fused kernel
    uint32_t seed = 970;
    for (const Case& c : cases) {
      Both cv = both_rand({c.b, c.k}, seed++, dt, -2.f, 2.f);
      Both w = both_rand({4 * c.d, c.k}, seed++, dt, -0.2f, 0.2f);
      Both bias = both_rand({4 * c.d}, seed++, dt, -0.5f, 0.5f);
      const Tensor bc = c.bias ? bias.cpu : Tensor(), bg = c.bias ? bias.gpu : Tensor();
      const Shape s{c.b, c.d};
      Both mod = outputs({c.b, 4 * c.d}, dt);
      Both sa = outputs(s, dt), ga = outputs(s, dt), sf = outputs(s, dt), gf = outputs(s, dt);
      ZI_ASSERT_OK(cpu_oracle().matmul_dit_modulation(cv.cpu, w.cpu, bc, mod.cpu, sa.cpu, ga.cpu,
                                                      sf.cpu, gf.cpu));
      g->set_fused_adaln(true);
      const Status st =
          g->matmul_dit_modulation(cv.gpu, w.gpu, bg, mod.gpu, sa.gpu, ga.gpu, sf.gpu, gf.gpu);
      g->set_fused_adaln(false);
      ZI_ASSERT_OK(st);
      const std::string tag = cat(" k", c.k, c.bias ? " +bias" : "");
      expect_match(label("matmul_dit_modulation scale_a", s, tag), dt, sa);
      expect_match(label("matmul_dit_modulation gate_a", s, tag), dt, ga);
      expect_match(label("matmul_dit_modulation scale_f", s, tag), dt, sf);
      expect_match(label("matmul_dit_modulation gate_f", s, tag), dt, gf);
      const int64_t pack = 16 / static_cast<int64_t>(dtype_size(dt));
      const bool fits = c.b <= 4 && c.k % pack == 0;
      const std::vector<float> m = fetch(*g, mod.gpu);
      const bool untouched = std::all_of(m.begin(), m.end(), [](float v) { return std::isnan(v); });
      EXPECT_EQ(untouched, fits) << tag << (fits ? ": fell back to the two ops" : ": not composed");
      // Against the GPU's two ops: the same roundings, sums in another order.
      Both sa2 = outputs(s, dt), ga2 = outputs(s, dt), sf2 = outputs(s, dt), gf2 = outputs(s, dt);
      ZI_ASSERT_OK(
          g->matmul_dit_modulation(cv.gpu, w.gpu, bg, mod.gpu, sa2.gpu, ga2.gpu, sf2.gpu, gf2.gpu));
      expect_close("fused vs two ops scale_a" + tag, dt, fetch(*g, sa.gpu), fetch(*g, sa2.gpu));
      expect_close("fused vs two ops gate_f" + tag, dt, fetch(*g, gf.gpu), fetch(*g, gf2.gpu));
    }
    g->set_fused_adaln(was);
    g->set_adaln_layers(was_layers);
  }
}

// Every block's adaLN projection and modulation at once (dit_modulation_layers, the DiT's
// default): against the CPU oracle's per-block ops, bit for bit against the per-block fused
// kernel (the same sums), over more layers than one launch takes (70 > 64), with and without
// biases; batches past 4 and operands the kernel does not take run block by block, still right.
TEST(CudaOps, DitModulationLayers) {
  ZI_REQUIRE_GPU();
  struct Case {
    int64_t layers, b, d, k;
  };
  const Case cases[] = {{1, 1, 7, 256},   {3, 2, 3840, 256}, {70, 1, 33, 64},
                        {5, 4, 100, 264}, {4, 5, 16, 256},   {2, 1, 8, 12}};
  for (DType dt : kDTypes) {
    cuda::CudaBackend* g = gpu(dt);
    const bool was = g->fused_adaln(), was_layers = g->adaln_layers();
    uint32_t seed = 1170;
    for (const Case& c : cases) {
      const std::string tag = cat(" L", c.layers, " b", c.b, " d", c.d, " k", c.k);
      Both cv = both_rand({c.b, c.k}, seed++, dt, -2.f, 2.f);
      std::vector<Both> w, bias;
      std::vector<Tensor> wc, wg, bc, bg;
      for (int64_t l = 0; l < c.layers; ++l) {
        w.push_back(both_rand({4 * c.d, c.k}, seed++, dt, -0.2f, 0.2f));
        bias.push_back(both_rand({4 * c.d}, seed++, dt, -0.5f, 0.5f));
        wc.push_back(w.back().cpu);
        wg.push_back(w.back().gpu);
        const bool has_bias = l % 3 != 1;  // some blocks without one
        bc.push_back(has_bias ? bias.back().cpu : Tensor());
        bg.push_back(has_bias ? bias.back().gpu : Tensor());
      }
      const Shape shape{c.layers, 4, c.b, c.d};
      Both out = outputs(shape, dt);
      ZI_ASSERT_OK(cpu_oracle().dit_modulation_layers(cv.cpu, wc, bc, out.cpu));
      g->set_adaln_layers(true);
      auto calls = calls_by_op(
          *g, [&] { EXPECT_TRUE(g->dit_modulation_layers(cv.gpu, wg, bg, out.gpu).ok()); });
      const int64_t kernel_calls = calls["dit_modulation_layers"];
      const int64_t pack = 16 / static_cast<int64_t>(dtype_size(dt));
      const bool fits = c.b <= 4 && c.k % pack == 0;
      EXPECT_EQ(kernel_calls, fits ? 1 : 0) << tag << ": which path ran";
      expect_match("dit_modulation_layers" + tag, dt, out);
      // The per-block fused kernel, block by block into the same layout (GPU only).
      Both per = outputs(shape, dt);
      g->set_fused_adaln(true);
      g->set_adaln_layers(false);
      ZI_ASSERT_OK(g->dit_modulation_layers(cv.gpu, wg, bg, per.gpu));
      g->set_fused_adaln(was);
      if (fits) {
        EXPECT_EQ(fetch(*g, out.gpu), fetch(*g, per.gpu)) << tag << ": one kernel vs per block";
      } else {  // against the CPU oracle's output above
        expect_close("dit_modulation_layers, per block" + tag, dt, fetch(*g, per.gpu),
                     fetch(cpu_oracle(), out.cpu));
      }
    }
    // Operands that do not fit the layout are named.
    Both cv = both_rand({1, 16}, seed++, dt);
    Both w = both_rand({4 * 8, 16}, seed++, dt);
    Both bad = outputs({2, 4, 1, 8}, dt);
    const Status st = g->dit_modulation_layers(cv.gpu, {w.gpu}, {Tensor()}, bad.gpu);
    EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument) << st.to_string();
    EXPECT_NE(st.message().find("dit_modulation_layers"), std::string::npos) << st.to_string();
    g->set_adaln_layers(was_layers);
  }
}

}  // namespace
}  // namespace zimage::test
