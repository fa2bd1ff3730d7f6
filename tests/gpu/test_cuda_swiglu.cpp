// The feed-forward's GEMM with SwiGLU in its epilogue (Backend::matmul_swiglu; CUTLASS on sm_90,
// gemm_cutlass.h): against the CPU oracle and against the two-kernel path it replaces (cuBLASLt
// GEMM + swiglu, the same roundings, another order of summation), both schedules, recorded
// (CUDA graph) against eager, a misaligned operand falling back, and a transformer whose
// feed-forward weights are in row blocks (the path that ships) against the same transformer
// unfused and against the CPU. Timed in CudaOpsPerf.MatmulSwiglu (test_cuda_perf.cpp).
#include <gtest/gtest.h>

#include <filesystem>
#include <limits>
#include <string>

#include "backend/cuda/libs/gemm_cutlass.h"
#include "gpu/cuda_test_util.h"
#include "io/weights/weights.h"
#include "io/writers/random_model.h"
#include "model/common/linear.h"
#include "model/dit/zimage_dit.h"

using namespace zimage;
using namespace zimage::test;

namespace {

// The fused path exists on this device (sm_90 with the CUTLASS kernels built); otherwise the
// tests skip, saying why.
bool fused_here(cuda::CudaBackend* g, int64_t f, int64_t k) {
  return g != nullptr && g->swiglu_block(f, k) == cuda::kSwigluBlock;
}

#define ZI_REQUIRE_FUSED_SWIGLU(g)                                                       \
  do {                                                                                   \
    ZI_REQUIRE_GPU();                                                                    \
    if (!fused_here(g, 256, 64))                                                         \
      GTEST_SKIP() << "no fused SwiGLU GEMM here (needs sm_90 and the CUTLASS kernels)"; \
  } while (0)

struct Case {
  int64_t m, f, k;
};

// y for `x` and the gate-first `w13` on the GPU: the two kernels (block 0) or the fused op on the
// weight put in blocks.
std::vector<float> run_gpu(cuda::CudaBackend* g, const Tensor& x, const Tensor& w13_host,
                           bool fused, const Tensor& x_view = Tensor()) {
  const int64_t f = w13_host.dim(0) / 2, m = x.numel() / x.dim(-1);
  LinearWeight lw;
  lw.w = take(g->upload(w13_host, DType::kBF16), "upload w13");
  if (fused) {
    const Status s = set_swiglu_block(*g, lw, cuda::kSwigluBlock);
    EXPECT_TRUE(s.ok()) << s.to_string();
  }
  Tensor y = take(g->alloc(DType::kBF16, {m, f}), "alloc y");
  EXPECT_TRUE(g->fill(y, std::numeric_limits<float>::quiet_NaN()).ok());
  const Status s = g->matmul_swiglu(x_view.defined() ? x_view : x, lw.w, lw.swiglu_block, y);
  EXPECT_TRUE(s.ok()) << s.to_string();
  return fetch(*g, y);
}

TEST(CudaSwiglu, FusedAgainstOracleAndTwoKernels) {
  cuda::CudaBackend* g = gpu(DType::kBF16);
  ZI_REQUIRE_FUSED_SWIGLU(g);
  // Rows past a tile (M % 128, M % 64), one tile of F, several, K of one and many 64-deep steps,
  // the DiT's K.
  const Case cases[] = {
      {1, 128, 64}, {37, 256, 136}, {130, 384, 512}, {200, 512, 3840}, {4160, 1280, 3840}};
  uint32_t seed = 700;
  for (const Case& c : cases) {
    const Tensor xh = rand_host({c.m, c.k}, seed++, DType::kBF16, -2.f, 2.f);
    const Tensor wh = rand_host({2 * c.f, c.k}, seed++, DType::kBF16, -0.06f, 0.06f);
    Tensor cy = Tensor::host(DType::kF32, {c.m, c.f});
    ZI_ASSERT_OK(cpu_oracle().matmul_swiglu(xh, wh, 0, cy));
    const std::vector<float> ref(cy.data_as<float>(), cy.data_as<float>() + cy.numel());
    Tensor x = take(g->upload(xh, DType::kBF16), "upload x");
    const std::string tag = cat("matmul_swiglu ", c.m, "x", c.f, "x", c.k);
    const std::vector<float> two = run_gpu(g, x, wh, false);
    const std::vector<float> coop = run_gpu(g, x, wh, true);
    g->set_swiglu_pingpong(true);
    const std::vector<float> ping = run_gpu(g, x, wh, true);
    g->set_swiglu_pingpong(false);
    expect_close(tag + " two kernels vs CPU", DType::kBF16, two, ref);
    expect_close(tag + " fused (cooperative) vs CPU", DType::kBF16, coop, ref);
    expect_close(tag + " fused (ping-pong) vs CPU", DType::kBF16, ping, ref);
    // The fused op against the two kernels: the same roundings, only the GEMMs' order of
    // summation differs, so at most a few bf16 roundings flip.
    expect_close(tag + " fused vs two kernels", DType::kBF16, coop, two, 4e-3);
    EXPECT_EQ(coop, ping) << tag << ": the two schedules sum in the same order";
  }
}

TEST(CudaSwiglu, RecordedEqualsEagerAndMisalignedFallsBack) {
  cuda::CudaBackend* g = gpu(DType::kBF16);
  ZI_REQUIRE_FUSED_SWIGLU(g);
  const int64_t m = 300, f = 512, k = 768;
  const Tensor xh = rand_host({m + 1, k}, 900, DType::kBF16);
  const Tensor wh = rand_host({2 * f, k}, 901, DType::kBF16, -0.06f, 0.06f);
  Tensor x = take(g->upload(xh, DType::kBF16), "upload x");
  Tensor xa = x.slice0(0, m);
  LinearWeight lw;
  lw.w = take(g->upload(wh, DType::kBF16), "upload w13");
  ZI_ASSERT_OK(set_swiglu_block(*g, lw, cuda::kSwigluBlock));
  Tensor eager = take(g->alloc(DType::kBF16, {m, f}), "alloc");
  Tensor rec = take(g->alloc(DType::kBF16, {m, f}), "alloc");
  ZI_ASSERT_OK(g->matmul_swiglu(xa, lw.w, lw.swiglu_block, eager));
  ZI_ASSERT_OK(g->fill(rec, std::numeric_limits<float>::quiet_NaN()));
  auto work = g->record([&] { return g->matmul_swiglu(xa, lw.w, lw.swiglu_block, rec); });
  ASSERT_TRUE(work.ok()) << work.status().to_string();
  ZI_ASSERT_OK(g->fill(rec, std::numeric_limits<float>::quiet_NaN()));
  ZI_ASSERT_OK((*work)->replay());
  EXPECT_EQ(fetch(*g, rec), fetch(*g, eager)) << "the replayed graph wrote other values";
  // x one element off 16-byte alignment: the CUTLASS kernel declines, the op falls back to the
  // GEMM + swiglu on the blocked weight, with the same result as the oracle.
  Tensor xm = Tensor(x.storage(), x.byte_offset() + 2, DType::kBF16, {m, k - 8});
  const Tensor wsh = rand_host({2 * f, k - 8}, 902, DType::kBF16, -0.06f, 0.06f);
  Tensor xmh = Tensor::host(DType::kF32, {m, k - 8});
  {
    const std::vector<float> all = fetch(*g, x);
    for (int64_t i = 0; i < m * (k - 8); ++i) xmh.data_as<float>()[i] = all[i + 1];
  }
  Tensor cy = Tensor::host(DType::kF32, {m, f});
  ZI_ASSERT_OK(cpu_oracle().matmul_swiglu(xmh, wsh, 0, cy));
  const std::vector<float> ref(cy.data_as<float>(), cy.data_as<float>() + cy.numel());
  expect_close("matmul_swiglu misaligned x (fallback)", DType::kBF16, run_gpu(g, x, wsh, true, xm),
               ref);
}

// A transformer whose F is a multiple of the block (dim 384: F = 1024, head_dim 128 as the
// model's), random weights written as a diffusers transformer folder.
std::string write_wide_dit(TransformerConfig& cfg) {
  cfg.dim = 384;
  cfg.n_heads = cfg.n_kv_heads = 3;
  cfg.n_layers = 2;
  cfg.n_refiner_layers = 1;
  cfg.cap_feat_dim = 64;
  cfg.axes_dims = {32, 48, 48};
  cfg.axes_lens = {256, 64, 64};
  const std::string dir = (std::filesystem::temp_directory_path() / "zimage_swiglu_dit").string();
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  RandomModelOptions o;
  o.dit = cfg;
  o.seed = 17;
  const Status s = write_random_tensors(dir, "diffusion_pytorch_model",
                                        "diffusion_pytorch_model.safetensors.index.json",
                                        dit_tensor_specs(cfg), o);
  EXPECT_TRUE(s.ok()) << s.to_string();
  return dir;
}

Tensor forward(ZImageDiT& dit, Backend& be, const Tensor& lat, const Tensor& cap) {
  Tensor l = take(be.upload(lat, DType::kF32), "upload latents");
  Tensor c = take(be.upload(cap, be.act_dtype()), "upload caption");
  Tensor out;
  const Status st = dit.forward(l, {0.4f}, {c}, out);
  EXPECT_TRUE(st.ok()) << st.to_string();
  if (!st.ok()) return Tensor();
  Tensor h = Tensor::host(DType::kF32, out.shape());
  EXPECT_TRUE(be.download(out, h).ok());
  return h;
}

std::vector<float> values(const Tensor& t) {
  return t.defined() ? std::vector<float>(t.data_as<float>(), t.data_as<float>() + t.numel())
                     : std::vector<float>();
}

TEST(CudaSwiglu, TransformerInRowBlocksAgainstUnfusedAndCpu) {
  cuda::CudaBackend* g = gpu(DType::kBF16);
  ZI_REQUIRE_FUSED_SWIGLU(g);
  TransformerConfig cfg;
  const std::string dir = write_wide_dit(cfg);
  ASSERT_EQ(g->swiglu_block(cfg.ffn_hidden(), cfg.dim), cuda::kSwigluBlock);
  auto ws = WeightStore::open(dir);
  ASSERT_TRUE(ws.ok()) << ws.status().to_string();
  const Tensor lat = rand_host({1, 16, 32, 32}, 31, DType::kBF16);
  const Tensor cap = rand_host({20, cfg.cap_feat_dim}, 32, DType::kBF16);

  auto fused = ZImageDiT::load(cfg, *ws, *g);
  ASSERT_TRUE(fused.ok()) << fused.status().to_string();
  g->set_fused_swiglu(false);
  auto plain = ZImageDiT::load(cfg, *ws, *g);
  g->set_fused_swiglu(true);
  ASSERT_TRUE(plain.ok()) << plain.status().to_string();
  auto cpu_dit = ZImageDiT::load(cfg, *ws, cpu_oracle());
  ASSERT_TRUE(cpu_dit.ok()) << cpu_dit.status().to_string();

  // The fused model runs the fused op in every block (2 layers, 2 refiners), eagerly here.
  (*fused)->set_use_graphs(false);
  g->set_profiling(true);
  const Tensor eager = forward(**fused, *g, lat, cap);
  auto prof = g->op_profile();
  g->set_profiling(false);
  ASSERT_TRUE(prof.ok()) << prof.status().to_string();
  int64_t fused_calls = 0;
  for (const auto& e : *prof)
    if (e.op.rfind("matmul_swiglu", 0) == 0) fused_calls += e.calls;
  EXPECT_EQ(fused_calls, 4) << "feed-forwards that ran fused";
  (*fused)->set_use_graphs(true);
  const Tensor recorded = forward(**fused, *g, lat, cap);
  const Tensor replayed = forward(**fused, *g, lat, cap);
  const Tensor unfused = forward(**plain, *g, lat, cap);
  const Tensor ref = forward(**cpu_dit, cpu_oracle(), lat, cap);
  ASSERT_TRUE(eager.defined() && recorded.defined() && replayed.defined() && unfused.defined() &&
              ref.defined());
  EXPECT_EQ(values(recorded), values(eager)) << "recorded forward differs from eager";
  EXPECT_EQ(values(replayed), values(eager)) << "replayed forward differs from eager";
  expect_close("transformer, fused feed-forward vs CPU", DType::kBF16, values(eager), values(ref),
               3e-2);
  expect_close("transformer, unfused vs CPU", DType::kBF16, values(unfused), values(ref), 3e-2);
  expect_close("transformer, fused vs unfused", DType::kBF16, values(eager), values(unfused), 2e-2);
  fused->reset();
  plain->reset();
  std::filesystem::remove_all(dir);
}

}  // namespace
