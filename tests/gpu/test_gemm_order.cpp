// The order of the CUTLASS GEMMs' output tiles (GemmOrder: the persistent scheduler's raster and
// swizzle; ZIMAGE_GEMM_ORDER): the same bytes in every order, through the entry points and the
// backend's matmul, and the time of each order at the DiT's shapes against the default, for the
// W8A8 FP8 GEMM in its default tile and the bf16 256 × 192 tile (with cuBLASLt's GEMM beside it).
#include <gtest/gtest.h>

#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "backend/cuda/libs/gemm_cutlass.h"
#include "cuda_test_util.h"
#include "perf_test_util.h"

namespace zimage::test {
namespace {

std::vector<cuda::GemmOrder> every_order() {
  std::vector<cuda::GemmOrder> out;
  for (const cuda::GemmRaster r :
       {cuda::GemmRaster::kHeuristic, cuda::GemmRaster::kAlongM, cuda::GemmRaster::kAlongN})
    for (const int z : {1, 2, 4, 8}) out.push_back({r, z});
  return out;
}

std::vector<uint8_t> host_bytes(cuda::CudaBackend* g, const Tensor& t) {
  std::vector<uint8_t> b(t.nbytes());
  EXPECT_EQ(cudaStreamSynchronize(g->stream()), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(b.data(), t.data(), b.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  return b;
}

// FP8 operands of an m × n × k GEMM: x8 [m, k] with its row scales, w8 [n, k] with its.
struct Fp8Operands {
  Tensor x8, sx, w8, sw;
};
Fp8Operands fp8_operands(cuda::CudaBackend* g, int64_t m, int64_t n, int64_t k, uint32_t seed) {
  Fp8Operands o;
  Tensor x = rand_dev(g, {m, k}, seed, -3.f, 3.f);
  Tensor w = rand_dev(g, {n, k}, seed + 1, -0.05f, 0.05f);
  o.x8 = take(g->alloc(DType::kF8E4M3, {m, k}), "x8");
  o.sx = take(g->alloc(DType::kF32, {m}), "sx");
  o.w8 = take(g->alloc(DType::kF8E4M3, {n, k}), "w8");
  o.sw = take(g->alloc(DType::kF32, {n}), "sw");
  EXPECT_TRUE(g->quantize_fp8_rows(x, o.x8, o.sx).ok());
  EXPECT_TRUE(g->quantize_fp8_rows(w, o.w8, o.sw).ok());
  return o;
}

// A workspace of `bytes` (undefined when none is needed).
Tensor workspace(cuda::CudaBackend* g, size_t bytes) {
  return bytes ? take(g->alloc(DType::kU8, {static_cast<int64_t>(bytes)}), "workspace") : Tensor();
}

Status fp8_gemm(cuda::CudaBackend* g, const Fp8Operands& o, Tensor& y, const Tensor& ws,
                const cuda::GemmOrder& order, cuda::Fp8Tile tile = cuda::Fp8Tile::kAuto) {
  const int64_t m = o.x8.dim(0), k = o.x8.dim(1), n = o.w8.dim(0);
  return cuda::cutlass_fp8_rows(o.x8.data(), o.w8.data(), o.sx.data_as<float>(),
                                o.sw.data_as<float>(), nullptr, y.data(), m, n, k,
                                ws.defined() ? ws.data() : nullptr, ws.nbytes(), g->stream(),
                                /*fast_accum=*/true, tile, order);
}

Status bf16_tile_gemm(cuda::CudaBackend* g, const Tensor& x, const Tensor& w, Tensor& y,
                      const Tensor& ws, const cuda::GemmOrder& order) {
  const int64_t m = x.dim(0), k = x.dim(1), n = w.dim(0);
  return cuda::cutlass_bf16_gemm_tile(cuda::PlainTile::kCoop256x192, x.data(), w.data(), y.data(),
                                      m, n, k, ws.defined() ? ws.data() : nullptr, ws.nbytes(),
                                      g->stream(), order);
}

bool have_cutlass() {
  return cuda::cutlass_available() && cuda::cutlass_device_is_sm90();
}

// Every order gives the default order's bytes: the FP8 GEMM in each tile (partial tiles in both
// dimensions), the bf16 256 × 192 tile, and the backend's FP8 matmul under set_gemm_order. (An
// order passed but dropped would pass too: CudaOpsPerf.GemmOrder's times show each is applied.)
TEST(CudaGemmOrder, SameBytesInEveryOrder) {
  ZI_REQUIRE_GPU();
  cuda::CudaBackend* g = gpu(DType::kBF16);
  if (!have_cutlass()) GTEST_SKIP() << "no CUTLASS GEMMs on this build or device";
  const int64_t m = 2100, n = 1544, k = 1024;
  const Fp8Operands o = fp8_operands(g, m, n, k, 5100);
  Tensor y = take(g->alloc(DType::kBF16, {m, n}), "y");
  const Tensor ws = workspace(g, cuda::cutlass_fp8_rows_workspace(m, n, k));
  for (const cuda::Fp8Tile tile : cuda::kFp8Tiles) {
    ZI_ASSERT_OK(fp8_gemm(g, o, y, ws, {}, tile));
    const std::vector<uint8_t> ref = host_bytes(g, y);
    for (const cuda::GemmOrder& order : every_order()) {
      ZI_ASSERT_OK(g->fill(y, 0.f));
      ZI_ASSERT_OK(fp8_gemm(g, o, y, ws, order, tile));
      EXPECT_TRUE(host_bytes(g, y) == ref)
          << cuda::fp8_tile_name(tile) << " in order " << cuda::gemm_order_name(order);
    }
  }
  // The backend's FP8 matmul (the path the DiT takes) under each order.
  Tensor y_ref = take(g->alloc(DType::kBF16, {m, n}), "y_ref");
  ZI_ASSERT_OK(g->matmul_fp8_quantized(o.x8, o.sx, o.w8, o.sw, {}, y_ref));
  const std::vector<uint8_t> ref = host_bytes(g, y_ref);
  const std::optional<cuda::GemmOrder> keep = g->gemm_order();
  for (const cuda::GemmOrder& order : every_order()) {
    g->set_gemm_order(order);
    ZI_ASSERT_OK(g->fill(y, 0.f));
    ZI_ASSERT_OK(g->matmul_fp8_quantized(o.x8, o.sx, o.w8, o.sw, {}, y));
    EXPECT_TRUE(host_bytes(g, y) == ref)
        << "matmul_fp8_quantized in order " << cuda::gemm_order_name(order);
  }
  g->set_gemm_order(keep);
  if (!cuda::fused_gemms_available()) {
    std::printf("  bf16 256 x 192 tile not built (ZIMAGE_FUSED_GEMMS off): FP8 only\n");
    return;
  }
  Tensor x = rand_dev(g, {m, k}, 5102), w = rand_dev(g, {n, k}, 5103, -0.05f, 0.05f);
  const Tensor ws16 = workspace(g, cuda::cutlass_bf16_gemm_tile_workspace(m, n, k));
  ZI_ASSERT_OK(bf16_tile_gemm(g, x, w, y, ws16, {}));
  const std::vector<uint8_t> ref16 = host_bytes(g, y);
  for (const cuda::GemmOrder& order : every_order()) {
    ZI_ASSERT_OK(g->fill(y, 0.f));
    ZI_ASSERT_OK(bf16_tile_gemm(g, x, w, y, ws16, order));
    EXPECT_TRUE(host_bytes(g, y) == ref16)
        << "bf16 256 x 192 in order " << cuda::gemm_order_name(order);
  }
}

// The backend's rule (CudaBackend::gemm_order_for): the FP8 GEMM's wide linears at 2048²-class
// rows walk along M two columns at a time, everything else in CUTLASS's default order; a set
// order (ZIMAGE_GEMM_ORDER) wins everywhere.
TEST(CudaGemmOrder, RuleForTheDitShapes) {
  ZI_REQUIRE_GPU();
  cuda::CudaBackend* g = gpu(DType::kBF16);
  const std::optional<cuda::GemmOrder> keep = g->gemm_order();
  g->set_gemm_order(std::nullopt);
  auto order = [&](int64_t m, int64_t n, int64_t k, bool fp8) {
    return cuda::gemm_order_name(g->gemm_order_for(m, n, k, fp8));
  };
  EXPECT_EQ(order(16448, 20480, 3840, true), "m,2");      // w1|w3 at 2048²
  EXPECT_EQ(order(16448, 11520, 3840, true), "m,2");      // q|k|v
  EXPECT_EQ(order(16640, 20480, 3840, true), "m,2");      // four 1024² images
  EXPECT_EQ(order(16448, 3840, 10240, true), "auto,1");   // w2
  EXPECT_EQ(order(16448, 3840, 3840, true), "auto,1");    // out
  EXPECT_EQ(order(4160, 20480, 3840, true), "auto,1");    // 1024²
  EXPECT_EQ(order(16448, 20480, 3840, false), "auto,1");  // the bf16 tile
  g->set_fp8_tile(cuda::Fp8Tile::kCoopWide);  // a forced tile: the rule was measured on 256x192
  EXPECT_EQ(order(16448, 20480, 3840, true), "auto,1");
  g->set_fp8_tile(cuda::Fp8Tile::kAuto);
  g->set_gemm_order(cuda::GemmOrder{cuda::GemmRaster::kAlongN, 4});
  EXPECT_EQ(order(4160, 3840, 3840, true), "n,4");
  EXPECT_EQ(order(16448, 20480, 3840, false), "n,4");
  g->set_gemm_order(keep);
}

// Every order at the DiT's linears, 1024² and 2048² rows (sustained medians): the FP8 GEMM in its
// default tile and the bf16 256 × 192 tile, with cuBLASLt's bf16 GEMM as the reference; the
// fastest order of each printed.
TEST(CudaOpsPerf, GemmOrder) {
  ZI_REQUIRE_GPU();
  cuda::CudaBackend* g = gpu(DType::kBF16);
  if (!have_cutlass()) GTEST_SKIP() << "no CUTLASS GEMMs on this build or device";
  const bool bf16_tile = cuda::fused_gemms_available();
  for (const int64_t m : {int64_t{4160}, int64_t{16448}}) {
    for (const auto& [n, k] :
         {std::pair<int64_t, int64_t>{20480, 3840}, {11520, 3840}, {3840, 10240}, {3840, 3840}}) {
      const double flop = 2.0 * m * n * k;
      const Fp8Operands o = fp8_operands(g, m, n, k, 5200);
      Tensor y = take(g->alloc(DType::kBF16, {m, n}), "y");
      const Tensor ws = workspace(g, cuda::cutlass_fp8_rows_workspace(m, n, k));
      double best = 1e30;
      cuda::GemmOrder best_order;
      for (const cuda::GemmOrder& order : every_order()) {
        const double t = sustained_ms(g, [&] { return fp8_gemm(g, o, y, ws, order); });
        report(cat("fp8 GEMM ", m, "x", n, "x", k, " order ", cuda::gemm_order_name(order)), t,
               flop, 0);
        if (t < best) best = t, best_order = order;
      }
      std::printf("  PERF fp8 GEMM %lldx%lldx%lld: fastest order %s\n", static_cast<long long>(m),
                  static_cast<long long>(n), static_cast<long long>(k),
                  cuda::gemm_order_name(best_order).c_str());
      if (!bf16_tile) continue;
      Tensor x = rand_dev(g, {m, k}, 5202), w = rand_dev(g, {n, k}, 5203, -0.05f, 0.05f);
      const Tensor ws16 = workspace(g, cuda::cutlass_bf16_gemm_tile_workspace(m, n, k));
      const double lt = sustained_ms(g, [&] { return g->matmul(x, w, {}, y); });
      report(cat("bf16 GEMM ", m, "x", n, "x", k, " cuBLASLt"), lt, flop, 0);
      best = 1e30;
      for (const cuda::GemmOrder& order : every_order()) {
        const double t = sustained_ms(g, [&] { return bf16_tile_gemm(g, x, w, y, ws16, order); });
        report(
            cat("bf16 GEMM ", m, "x", n, "x", k, " 256x192 order ", cuda::gemm_order_name(order)),
            t, flop, 0);
        if (t < best) best = t, best_order = order;
      }
      std::printf("  PERF bf16 256x192 %lldx%lldx%lld: fastest order %s, %.3f of cuBLASLt's time\n",
                  static_cast<long long>(m), static_cast<long long>(n), static_cast<long long>(k),
                  cuda::gemm_order_name(best_order).c_str(), best / lt);
    }
  }
}

// The FP8 GEMM's wide linears at 2048² rows (w1|w3, q|k|v): every tile in every order.
TEST(CudaOpsPerf, Fp8TileOrder) {
  ZI_REQUIRE_GPU();
  cuda::CudaBackend* g = gpu(DType::kBF16);
  if (!have_cutlass()) GTEST_SKIP() << "no CUTLASS GEMMs on this build or device";
  const int64_t m = 16448, k = 3840;
  for (const int64_t n : {int64_t{20480}, int64_t{11520}}) {
    const double flop = 2.0 * m * n * k;
    const Fp8Operands o = fp8_operands(g, m, n, k, 5300);
    Tensor y = take(g->alloc(DType::kBF16, {m, n}), "y");
    const Tensor ws = workspace(g, cuda::cutlass_fp8_rows_workspace(m, n, k));
    for (const cuda::Fp8Tile tile : cuda::kFp8Tiles)
      for (const cuda::GemmOrder& order : every_order()) {
        const double t = sustained_ms(g, [&] { return fp8_gemm(g, o, y, ws, order, tile); });
        report(cat("fp8 GEMM ", m, "x", n, "x", k, " tile ", cuda::fp8_tile_name(tile), " order ",
                   cuda::gemm_order_name(order)),
               t, flop, 0);
      }
  }
}

}  // namespace
}  // namespace zimage::test
