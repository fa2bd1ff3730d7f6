// cuBLASLt's GEMM choice at run time (LtGemm, ZIMAGE_GEMM_AUTOTUNE): the products stay the
// CPU oracle's whichever candidate is kept, and the choice round-trips through the plan cache.
// Timings of every candidate are in test_cuda_perf.cpp (CudaOpsPerf.GemmCandidates).
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "backend/cuda/libs/gemm_cublaslt.h"
#include "cuda_test_util.h"
#include "io/fs/plan_cache.h"

namespace zimage::test {
namespace {

// ZIMAGE_GEMM_AUTOTUNE: whichever candidate the timing keeps, the product is the oracle's (also
// under a bias and in f32); the choice is remembered in the plan cache and a new set of plans (a
// new process) takes it from there; a remembered candidate that is no longer offered is dropped;
// products below kTuneMinRows rows are not timed.
TEST(CudaOps, MatmulAutotuneKeepsResultsAndRemembersTheChoice) {
  ZI_REQUIRE_GPU();
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / "zimage_gemm_autotune_test";
  std::filesystem::remove_all(dir);
  for (DType dt : kDTypes) {
    cuda::CudaBackend* g = gpu(dt);
    cuda::LtGemm* lt = g->lt_gemm();
    const bool was = lt->autotune();
    std::shared_ptr<PlanCache> cache = PlanCache::open(dir.string(), "autotune test");
    ASSERT_NE(cache, nullptr);
    lt->set_autotune(true, cache);
    const int64_t m = 512, n = 384, k = 256;
    uint32_t seed = 60;
    for (bool bias : {false, true}) {
      Both x = both_rand({m, k}, seed++, dt);
      Both w = both_rand({n, k}, seed++, dt, -0.5f, 0.5f);
      Both b = bias ? both_rand({n}, seed++, dt) : Both{};
      Both y = outputs({m, n}, dt);
      ZI_ASSERT_OK(cpu_oracle().matmul(x.cpu, w.cpu, b.cpu, y.cpu));
      ZI_ASSERT_OK(g->matmul(x.gpu, w.gpu, b.gpu, y.gpu));
      expect_match(cat("matmul autotuned ", m, "x", n, "x", k, bias ? " +bias" : ""), dt, y);
    }
    const auto choice = take(lt->tuned_choice(m, n, k, dt), "tuned choice");
    EXPECT_TRUE(choice.second) << "the first call outside a capture times the candidates";
    const std::string key = cuda::LtGemm::cache_key(m, n, k, dt, false, 16, 16, 16);
    ASSERT_TRUE(cache->get(key).has_value());
    EXPECT_EQ(*cache->get(key), choice.first);
    std::printf("  autotune %s: candidate %d\n", key.c_str(), choice.first);

    lt->set_autotune(true, cache);  // new plans, as in a new process: the remembered choice
    const auto again = take(lt->tuned_choice(m, n, k, dt), "remembered choice");
    EXPECT_EQ(again, choice);

    cache->put(key, 99);  // a candidate cuBLASLt does not offer: dropped, the heuristic's first
    lt->set_autotune(true, cache);
    const auto dropped = take(lt->tuned_choice(m, n, k, dt), "dropped choice");
    EXPECT_FALSE(dropped.second);
    EXPECT_FALSE(cache->get(key).has_value());

    // Below kTuneMinRows rows: not timed.
    Both xs = both_rand({8, k}, seed++, dt);
    Both ws = both_rand({n, k}, seed++, dt, -0.5f, 0.5f);
    Both ys = outputs({8, n}, dt);
    ZI_ASSERT_OK(cpu_oracle().matmul(xs.cpu, ws.cpu, Tensor(), ys.cpu));
    ZI_ASSERT_OK(g->matmul(xs.gpu, ws.gpu, Tensor(), ys.gpu));
    expect_match("matmul 8 rows, autotune on", dt, ys);
    EXPECT_FALSE(take(lt->tuned_choice(8, n, k, dt), "small").second);

    lt->set_autotune(was, nullptr);
  }
  std::filesystem::remove_all(dir);
}

// A bf16 product of random operands on the GPU against the CPU oracle's.
void bf16_matmul_matches_oracle(cuda::CudaBackend* g, int64_t m, int64_t n, int64_t k,
                                uint32_t seed, const std::string& what) {
  Both x = both_rand({m, k}, 2 * seed, DType::kBF16);
  Both w = both_rand({n, k}, 2 * seed + 1, DType::kBF16, -0.5f, 0.5f);
  Both y = outputs({m, n}, DType::kBF16);
  ZI_ASSERT_OK(cpu_oracle().matmul(x.cpu, w.cpu, Tensor(), y.cpu));
  ZI_ASSERT_OK(g->matmul(x.gpu, w.gpu, Tensor(), y.gpu));
  expect_match("matmul, " + what, DType::kBF16, y);
}

// ZIMAGE_GEMM_CANDIDATE (LtGemm::set_wide_candidate): products of kWideRows rows or more take the
// candidate asked for, smaller ones the heuristic's first; the products stay the oracle's.
TEST(CudaOps, MatmulWideCandidateKeepsResults) {
  ZI_REQUIRE_GPU();
  cuda::CudaBackend* g = gpu(DType::kBF16);
  cuda::LtGemm* lt = g->lt_gemm();
  const int was = lt->wide_candidate();
  const int64_t n = 384, k = 256;
  uint32_t seed = 70;
  for (const int c : {1, 2}) {
    lt->set_wide_candidate(c);
    for (const int64_t m : {cuda::LtGemm::kWideRows, cuda::LtGemm::kWideRows - 1}) {
      bf16_matmul_matches_oracle(g, m, n, k, seed++, cat("wide candidate ", c, ", ", m, " rows"));
      const auto choice = take(lt->tuned_choice(m, n, k, DType::kBF16), "choice");
      if (m < cuda::LtGemm::kWideRows)
        EXPECT_EQ(choice.first, 0) << "fewer rows: the heuristic's first";
      else
        EXPECT_TRUE(choice.first == c || choice.first == 0) << "candidate " << c;
    }
  }
  lt->set_wide_candidate(was);
}

// ZIMAGE_GEMM_CONFIG (LtGemm::set_wide_config): products of kWideRows rows or more run with the
// configuration where cuBLASLt takes it, smaller ones never; the products stay the oracle's.
TEST(CudaOps, MatmulWideConfigKeepsResults) {
  ZI_REQUIRE_GPU();
  cuda::CudaBackend* g = gpu(DType::kBF16);
  cuda::LtGemm* lt = g->lt_gemm();
  const cuda::LtGemm::AlgoConfig was = lt->wide_config();
  const int64_t n = 384, k = 256;
  uint32_t seed = 90;
  int configured = 0;
  // 1x1x1 and 2x1x1 clusters, CTA swizzling; a tile no Hopper kernel has (refused: the candidate).
  for (const char* spec : {"cluster=2", "cluster=3,swizzle=1", "swizzle=1", "tile=1"}) {
    const auto config = cuda::parse_gemm_algo_config(spec);
    ZI_ASSERT_OK(config.status());
    lt->set_wide_config(*config);
    for (const int64_t m : {cuda::LtGemm::kWideRows, cuda::LtGemm::kWideRows - 1}) {
      bf16_matmul_matches_oracle(g, m, n, k, seed++, cat(spec, ", ", m, " rows"));
      const bool on = take(lt->wide_configured(m, n, k, DType::kBF16), "configured");
      if (m < cuda::LtGemm::kWideRows) {
        EXPECT_FALSE(on) << spec << ": fewer rows, no configuration";
      }
      configured += on;
      const std::string algo = take(lt->describe(m, n, k, DType::kBF16), "describe");
      std::printf("[ config ] %s, %lld rows: %s, runs [%s]\n", spec, static_cast<long long>(m),
                  on ? "taken" : "not taken", algo.c_str());
      if (on && config->cluster >= 0) {
        EXPECT_NE(algo.find(cat("cluster ", config->cluster, " ")), std::string::npos) << algo;
      }
      if (on && config->swizzle >= 0) {
        EXPECT_NE(algo.find(cat("swizzle ", config->swizzle, " ")), std::string::npos) << algo;
      }
    }
  }
  EXPECT_GT(configured, 0) << "cuBLASLt took none of the configurations";
  lt->set_wide_config(was);
}

}  // namespace
}  // namespace zimage::test
