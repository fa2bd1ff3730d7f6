// The bf16 GEMM in CUTLASS's 256 × 192 tile (ZIMAGE_BF16_GEMM=cutlass-256x192,
// gemm_bf16_tiles.cu), through CudaBackend::matmul: against the CPU oracle, against cuBLASLt's
// output, and against the tile called directly (so that a refusal the backend hides behind
// cuBLASLt fails the test). Its timings are CudaOpsPerf.MatmulLargeTiles. Without a CUDA device
// the test is skipped.
#include <string>
#include <vector>

#include "backend/cuda/libs/gemm_cutlass.h"
#include "cuda_test_util.h"

namespace zimage::test {
namespace {

// ZIMAGE_BF16_GEMM=cutlass-256x192 (CudaBackend::set_bf16_gemm_wide_tile): bias-free bf16 GEMMs
// from 1024 rows run CUTLASS's 256 × 192 tile (others, and builds or devices without it, stay on
// cuBLASLt). Against the CPU oracle at ragged and DiT shapes, an operand at an odd offset (the
// tile refuses it: cuBLASLt's path), and the distance to cuBLASLt's own output printed (both sum
// in fp32 and round once).
TEST(CudaOps, MatmulWideTileAgainstCpuAndCublasLt) {
  ZI_REQUIRE_GPU();
  cuda::CudaBackend* g = gpu(DType::kBF16);
  const bool tile = cuda::fused_gemms_available() && cuda::cutlass_device_is_sm90();
  struct Case {
    int64_t m, n, k;
  };
  uint32_t seed = 900;
  for (const Case& c : {Case{1024, 264, 272}, Case{1100, 3840, 3840}, Case{4160, 1000, 520},
                        Case{1500, 11520, 3840}}) {
    Both x = both_rand({c.m, c.k}, seed++, DType::kBF16);
    Both w = both_rand({c.n, c.k}, seed++, DType::kBF16, -0.5f, 0.5f);
    Both y = outputs({c.m, c.n}, DType::kBF16);
    Tensor ref = take(g->alloc(DType::kBF16, {c.m, c.n}), "ref");
    ZI_ASSERT_OK(cpu_oracle().matmul(x.cpu, w.cpu, Tensor(), y.cpu));
    g->set_bf16_gemm_wide_tile(false);
    ZI_ASSERT_OK(g->matmul(x.gpu, w.gpu, Tensor(), ref));  // cuBLASLt
    g->set_bf16_gemm_wide_tile(true);
    const Status st = g->matmul(x.gpu, w.gpu, Tensor(), y.gpu);
    g->set_bf16_gemm_wide_tile(false);
    ZI_ASSERT_OK(st);
    const std::string what = cat("matmul 256x192 tile ", c.m, "x", c.n, "x", c.k);
    expect_match(what, DType::kBF16, y);
    const std::vector<float> got = fetch(*g, y.gpu);
    const ErrStats e = errors(got, fetch(*g, ref));
    std::printf("  %-56s against cuBLASLt: max |diff| %.2e (%s)\n", what.c_str(), e.max_abs,
                tile ? "the tile ran" : "no tile here: cuBLASLt both times");
    if (!tile) {
      EXPECT_EQ(e.max_abs, 0.0);
      continue;
    }
    // matmul must have run the tile, not hidden a refusal behind cuBLASLt: the tile called
    // directly gives the same bytes.
    Tensor direct = take(g->alloc(DType::kBF16, {c.m, c.n}), "direct");
    const size_t ws_bytes = cuda::cutlass_bf16_gemm_tile_workspace(c.m, c.n, c.k);
    Tensor ws =
        ws_bytes ? take(g->alloc(DType::kU8, {static_cast<int64_t>(ws_bytes)}), "ws") : Tensor();
    ZI_ASSERT_OK(cuda::cutlass_bf16_gemm_tile(
        cuda::PlainTile::kCoop256x192, x.gpu.data(), w.gpu.data(), direct.data(), c.m, c.n, c.k,
        ws_bytes ? ws.data() : nullptr, ws_bytes, g->stream()));
    EXPECT_EQ(errors(got, fetch(*g, direct)).max_abs, 0.0) << what;
  }
  // x one element into its buffer (not 16-byte aligned): the tile answers unsupported, cuBLASLt
  // computes it.
  Both xx = both_rand({1024 * 64 + 1}, seed++, DType::kBF16);
  Tensor xv_cpu = xx.cpu.slice0(1, 1024 * 64 + 1).view({1024, 64});
  Tensor xv_gpu = xx.gpu.slice0(1, 1024 * 64 + 1).view({1024, 64});
  Both w = both_rand({72, 64}, seed++, DType::kBF16);
  Both y = outputs({1024, 72}, DType::kBF16);
  ZI_ASSERT_OK(cpu_oracle().matmul(xv_cpu, w.cpu, Tensor(), y.cpu));
  g->set_bf16_gemm_wide_tile(true);
  const Status st = g->matmul(xv_gpu, w.gpu, Tensor(), y.gpu);
  g->set_bf16_gemm_wide_tile(false);
  ZI_ASSERT_OK(st);
  expect_match("matmul 256x192 tile, x at an odd offset", DType::kBF16, y);
}

}  // namespace
}  // namespace zimage::test
