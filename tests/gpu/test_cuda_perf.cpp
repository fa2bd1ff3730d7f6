// Timings of the CUDA backend's hot ops at full model sizes (printed, not asserted beyond
// sanity): bf16 GEMMs of the DiT, flash attention 30 heads x 4224 x 128 (and the general path
// for comparison), the VAE's single-head attention, VAE convolutions, and the memory-bound norms.
// Each figure is the median of 20 timed calls (CUDA events on the backend's stream) after 3
// warm-up calls, on random data (never zeros: tensor cores run faster on zeros).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "backend/cuda/kernels/kernels.h"
#include "backend/cuda/libs/attention_flash3.h"
#include "backend/cuda/libs/gemm_cublaslt.h"
#include "backend/cuda/libs/gemm_cutlass.h"
#include "cuda_test_util.h"
#include "model/common/linear.h"
#include "perf_test_util.h"

namespace zimage::test {
namespace {

TEST(CudaOpsPerf, MatmulBf16) {
  ZI_REQUIRE_GPU();
  cuda::CudaBackend* g = gpu(DType::kBF16);
  struct Shape3 {
    int64_t m, n, k;
  };
  const Shape3 shapes[] = {
      {4096, 3840, 3840}, {4224, 10240, 3840}, {4224, 3840, 10240}, {4224, 11520, 3840}};
  uint32_t seed = 2000;
  for (const Shape3& s : shapes) {
    Tensor x = rand_dev(g, {s.m, s.k}, seed++);
    Tensor w = rand_dev(g, {s.n, s.k}, seed++, -0.05f, 0.05f);
    Tensor y = take(g->alloc(DType::kBF16, {s.m, s.n}), "y");
    const double ms = median_ms(g, [&] { return g->matmul(x, w, Tensor(), y); });
    report(cat("matmul bf16 ", s.m, "x", s.n, "x", s.k), ms, 2.0 * s.m * s.n * s.k, 0);
    EXPECT_GT(ms, 0);
  }
}

constexpr std::pair<cuda::GemmSchedule, const char*> kSchedules[] = {
    {cuda::GemmSchedule::kCooperative, "coop"},
    {cuda::GemmSchedule::kCooperativeTall, "coop-tall"},
    {cuda::GemmSchedule::kPingpong, "pingpong"},
    {cuda::GemmSchedule::kPingpongNarrow, "pingpong-narrow"}};
constexpr std::pair<cuda::GemmRaster, const char*> kRasters[] = {
    {cuda::GemmRaster::kHeuristic, "auto"},
    {cuda::GemmRaster::kAlongM, "m"},
    {cuda::GemmRaster::kAlongN, "n"}};

// Times `op` under every tuning (schedule, raster, swizzle) `set` applies; prints each and the
// best, as the ZIMAGE_*_GEMM setting that gives it.
void sweep(cuda::CudaBackend* g, const std::string& what, double flop, double t_two,
           const std::function<void(const cuda::GemmTuning&)>& set,
           const std::function<Status()>& op) {
  double best = 1e30;
  std::string best_name;
  for (auto [schedule, sname] : kSchedules)
    for (auto [raster, rname] : kRasters)
      for (int swizzle : {1, 2, 4, 8}) {
        set({schedule, raster, swizzle});
        const double t = sustained_ms(g, op);
        const std::string name = cat(sname, ",", rname, ",", swizzle);
        report(cat(what, " fused ", name), t, flop, 0);
        if (t < best) best = t, best_name = name;
      }
  set({});
  std::printf("  PERF %s: best %s %.3f ms, %.3fx the two kernels (%.3f ms)\n", what.c_str(),
              best_name.c_str(), best, t_two / best, t_two);
}

// The same product through CUTLASS with its own (TMA, shared-memory staged) epilogue in each tile
// configuration of the fused GEMMs: whether they lose to cuBLASLt in the mainloop or in their
// register epilogue.
void plain_cutlass_rows(cuda::CudaBackend* g, const std::string& what, const Tensor& x,
                        const Tensor& w, Tensor& y, double flop) {
  const int64_t m = x.dim(0), k = x.dim(1), n = w.dim(0);
  const size_t ws_bytes = cuda::cutlass_bf16_gemm_workspace(m, n, k);
  Tensor ws;
  if (ws_bytes > 0) ws = take(g->alloc(DType::kU8, {static_cast<int64_t>(ws_bytes)}), "ws");
  for (auto [schedule, sname] : kSchedules) {
    for (auto [raster, rname] : kRasters) {
      if (raster == cuda::GemmRaster::kAlongM) continue;  // auto and n: what the sweeps favour
      const cuda::GemmTuning t{schedule, raster, 1};
      auto op = [&] {
        return cuda::cutlass_bf16_gemm(x.data(), w.data(), y.data(), m, n, k,
                                       ws_bytes ? ws.data() : nullptr, ws_bytes, g->stream(), t);
      };
      const Status st = op();
      if (!st.ok()) {
        std::printf("  PERF %s CUTLASS %s: %s\n", what.c_str(), sname, st.to_string().c_str());
        return;
      }
      report(cat(what, " CUTLASS ", sname, ",", rname, " (TMA epilogue)"), sustained_ms(g, op),
             flop, 0);
    }
  }
}

// Tiles larger than the fused GEMMs' (gemm_cutlass.h PlainTile) at the DiT's four linears for
// 1024² and 2048², back to back against cuBLASLt's kernel (measured first and last, since the
// clock drifts under the power limit) and CUTLASS's 128 × 256: whether a mainloop that moves fewer
// operand bytes per product catches cuBLASLt's 192 × 192. Each output is checked against
// cuBLASLt's (both sum in fp32 and round once, so only the summation order differs).
TEST(CudaOpsPerf, MatmulLargeTiles) {
  ZI_REQUIRE_GPU();
  cuda::CudaBackend* g = gpu(DType::kBF16);
  if (!cuda::cutlass_available() || !cuda::cutlass_device_is_sm90() ||
      !cuda::fused_gemms_available())
    GTEST_SKIP() << "no CUTLASS bf16 tiles on this build or device";
  constexpr std::pair<cuda::PlainTile, const char*> kTiles[] = {
      {cuda::PlainTile::kCoop256x192, "256x192 coop 1x2"}};
  for (const int64_t m : {int64_t{4160}, int64_t{16448}}) {
    for (const auto& [n, k] :
         {std::pair<int64_t, int64_t>{20480, 3840}, {11520, 3840}, {3840, 10240}, {3840, 3840}}) {
      Tensor x = rand_dev(g, {m, k}, 5000);
      Tensor w = rand_dev(g, {n, k}, 5001, -0.05f, 0.05f);
      Tensor ref = take(g->alloc(DType::kBF16, {m, n}), "ref");
      Tensor y = take(g->alloc(DType::kBF16, {m, n}), "y");
      const double flop = 2.0 * m * n * k;
      const std::string shape = cat(m, "x", n, "x", k);
      auto lt = [&] { return g->matmul(x, w, Tensor(), ref); };
      const double t_first = sustained_ms(g, lt);
      report(cat("cuBLASLt ", shape), t_first, flop, 0);
      const std::vector<float> want = fetch(*g, ref);
      const size_t ws_bytes = std::max(cuda::cutlass_bf16_gemm_workspace(m, n, k),
                                       cuda::cutlass_bf16_gemm_tile_workspace(m, n, k));
      Tensor ws =
          ws_bytes ? take(g->alloc(DType::kU8, {static_cast<int64_t>(ws_bytes)}), "ws") : Tensor();
      void* wsp = ws_bytes ? ws.data() : nullptr;
      report(cat("CUTLASS 128x256 coop ", shape),
             sustained_ms(g,
                          [&] {
                            return cuda::cutlass_bf16_gemm(x.data(), w.data(), y.data(), m, n, k,
                                                           wsp, ws_bytes, g->stream());
                          }),
             flop, 0);
      double best = 1e30;
      const char* best_name = "";
      for (auto [tile, name] : kTiles) {
        auto op = [&, tile = tile] {
          return cuda::cutlass_bf16_gemm_tile(tile, x.data(), w.data(), y.data(), m, n, k, wsp,
                                              ws_bytes, g->stream());
        };
        const Status st = op();
        if (!st.ok()) {
          std::printf("  PERF CUTLASS %s %s: %s\n", name, shape.c_str(), st.to_string().c_str());
          continue;
        }
        const double t = sustained_ms(g, op);
        report(cat("CUTLASS ", name, " ", shape), t, flop, 0);
        expect_close(cat("CUTLASS ", name, " ", shape, " vs cuBLASLt"), DType::kBF16, fetch(*g, y),
                     want, 2e-3);
        if (t < best) best = t, best_name = name;
      }
      const double t_last = sustained_ms(g, lt);
      report(cat("cuBLASLt again ", shape), t_last, flop, 0);
      std::printf("  PERF %s: best large tile %s %.3f ms, cuBLASLt %.3f / %.3f ms (%.3fx)\n",
                  shape.c_str(), best_name, best, t_first, t_last, 0.5 * (t_first + t_last) / best);
    }
  }
}

// The DiT's feed-forward w1|w3 at 1024² and 2048²: cuBLASLt's GEMM + the swiglu kernel against
// the GEMM with SwiGLU in its epilogue, every tuning.
TEST(CudaOpsPerf, MatmulSwiglu) {
  ZI_REQUIRE_GPU();
  cuda::CudaBackend* g = gpu(DType::kBF16);
  const int64_t f = 10240, k = 3840;
  g->set_fused_swiglu(true);  // opt-in; off again at the end
  if (g->swiglu_block(f, k) <= 0) {
    g->set_fused_swiglu(false);
    GTEST_SKIP() << "no fused SwiGLU GEMM here";
  }
  LinearWeight plain;
  plain.w = rand_dev(g, {2 * f, k}, 3000, -0.05f, 0.05f);
  constexpr int64_t kBlocks[3] = {128, 64, 8};  // the SwiGLU schedules' row blocks
  LinearWeight blocked[3];
  for (int i = 0; i < 3; ++i) {
    blocked[i].w = rand_dev(g, {2 * f, k}, 3000, -0.05f, 0.05f);
    ZI_ASSERT_OK(set_swiglu_block(*g, blocked[i], kBlocks[i]));
  }
  auto blocked_for = [&](int64_t block) -> const LinearWeight& {
    return blocked[block == 128 ? 0 : block == 64 ? 1 : 2];
  };
  for (int64_t m : {int64_t{4160}, int64_t{16448}}) {
    Tensor x = rand_dev(g, {m, k}, 3001);
    Tensor h = take(g->alloc(DType::kBF16, {m, 2 * f}), "h");
    Tensor y = take(g->alloc(DType::kBF16, {m, f}), "y");
    const double flop = 2.0 * m * 2 * f * k;
    const double t_gemm = sustained_ms(g, [&] { return g->matmul(x, plain.w, Tensor(), h); });
    const double t_two = sustained_ms(g, [&] {
      Status s = g->matmul(x, plain.w, Tensor(), h);
      return s.ok() ? g->swiglu(h, y) : s;
    });
    report(cat("w1|w3 GEMM alone (cuBLASLt) ", m, "x", 2 * f, "x", k), t_gemm, flop, 0);
    plain_cutlass_rows(g, cat("w1|w3 GEMM alone ", m), x, plain.w, h, flop);
    report(cat("GEMM + swiglu (two kernels) ", m), t_two, flop, 0);
    sweep(
        g, cat("swiglu ", m), flop, t_two,
        [&](const cuda::GemmTuning& t) { g->set_swiglu_tuning(t); },
        [&] {
          const LinearWeight& w = blocked_for(g->swiglu_block(f, k));
          return g->matmul_swiglu(x, w.w, w.swiglu_block, y);
        });
    // The 256 × 192 tile on 8-row blocks (SwiGLU only, so not in the shared sweep); the kernel
    // itself must take the shape, or the rows below would time the op's fallback.
    {
      const LinearWeight& w = blocked_for(8);
      const size_t ws_bytes = cuda::cutlass_bf16_swiglu_workspace(m, f, k);
      Tensor ws;
      if (ws_bytes > 0) ws = take(g->alloc(DType::kU8, {static_cast<int64_t>(ws_bytes)}), "ws");
      ZI_ASSERT_OK(cuda::cutlass_bf16_swiglu(
          x.data(), w.w.data(), y.data(), m, f, k, ws_bytes ? ws.data() : nullptr, ws_bytes,
          g->stream(), {cuda::GemmSchedule::kCooperative256x192, cuda::GemmRaster::kHeuristic, 1}));
    }
    for (auto [raster, rname] : kRasters)
      for (int swizzle : {1, 2}) {
        g->set_swiglu_tuning({cuda::GemmSchedule::kCooperative256x192, raster, swizzle});
        const LinearWeight& w = blocked_for(g->swiglu_block(f, k));
        const double t =
            sustained_ms(g, [&] { return g->matmul_swiglu(x, w.w, w.swiglu_block, y); });
        report(cat("swiglu ", m, " fused coop-256x192,", rname, ",", swizzle), t, flop, 0);
        std::printf("  PERF swiglu %lld coop-256x192,%s,%d: %.3fx the two kernels\n",
                    static_cast<long long>(m), rname, swizzle, t_two / t);
      }
    g->set_swiglu_tuning({});
  }
  g->set_fused_swiglu(false);
}

// swiglu_fp8 at the DiT's feed-forward (F 10240, 1024² and 2048²): the SwiGLU and the row
// quantisation apart, the two together (ZIMAGE_FUSED_SWIGLU_FP8=0) and the one-kernel form (the
// default), with the bytes each moves.
TEST(CudaOpsPerf, SwigluFp8) {
  ZI_REQUIRE_GPU();
  cuda::CudaBackend* g = gpu(DType::kBF16);
  const int64_t f = 10240;
  for (const int64_t m : {int64_t{4160}, int64_t{16448}}) {
    Tensor h = rand_dev(g, {m, 2 * f}, 4100, -6.f, 6.f);
    Tensor y = take(g->alloc(DType::kBF16, {m, f}), "y");
    Tensor y8 = take(g->alloc(DType::kF8E4M3, {m, f}), "y8");
    Tensor ys = take(g->alloc(DType::kF32, {m}), "ys");
    if (const Status st = g->swiglu_fp8(h, y, y8, ys); !st.ok()) GTEST_SKIP() << st.message();
    const double mf = static_cast<double>(m) * f;
    report(cat("swiglu bf16 ", m, "x", f), sustained_ms(g, [&] { return g->swiglu(h, y); }), 0,
           mf * 6);
    report(cat("fp8 row quantisation ", m, "x", f),
           sustained_ms(g, [&] { return g->quantize_fp8_rows(y, y8, ys); }), 0, mf * 3 + 4.0 * m);
    for (const bool one : {false, true}) {
      g->set_fused_swiglu_fp8(one);
      report(cat("swiglu_fp8 ", one ? "one kernel " : "two kernels ", m, "x", f),
             sustained_ms(g, [&] { return g->swiglu_fp8(h, y, y8, ys); }), 0,
             one ? mf * 5 + 4.0 * m : mf * 9 + 4.0 * m);
    }
    g->set_fused_swiglu_fp8(true);  // the default
  }
}

// The W8A8 FP8 GEMM's tiles (CUTLASS, fast accumulation; gemm_cutlass.h Fp8Tile) at the DiT's
// four linears for 1024² and 2048², on operands quantised once: the fastest per shape is what
// fp8_tile_for should pick. Also the activations' row quantisation (every FP8 GEMM's first
// kernel) against the memory's rate.
TEST(CudaOpsPerf, Fp8GemmTiles) {
  ZI_REQUIRE_GPU();
  cuda::CudaBackend* g = gpu(DType::kBF16);
  if (!cuda::cutlass_available() || !cuda::cutlass_device_is_sm90())
    GTEST_SKIP() << "no CUTLASS FP8 GEMM on this build or device";
  for (const int64_t m : {int64_t{4160}, int64_t{16448}}) {
    for (const auto& [n, k] :
         {std::pair<int64_t, int64_t>{11520, 3840}, {3840, 3840}, {20480, 3840}, {3840, 10240}}) {
      Tensor x = rand_dev(g, {m, k}, 4000, -3.f, 3.f);
      Tensor w = rand_dev(g, {n, k}, 4001, -0.05f, 0.05f);
      Tensor x8 = take(g->alloc(DType::kF8E4M3, {m, k}), "x8");
      Tensor sx = take(g->alloc(DType::kF32, {m}), "sx");
      Tensor w8 = take(g->alloc(DType::kF8E4M3, {n, k}), "w8");
      Tensor sw = take(g->alloc(DType::kF32, {n}), "sw");
      Tensor y = take(g->alloc(DType::kBF16, {m, n}), "y");
      ZI_ASSERT_OK(g->quantize_fp8_rows(w, w8, sw));
      const double tq = sustained_ms(g, [&] { return g->quantize_fp8_rows(x, x8, sx); });
      report(cat("fp8 row quantisation ", m, "x", k), tq, 0, 3.0 * m * k + 4.0 * m);
      const size_t ws_bytes = cuda::cutlass_fp8_rows_workspace(m, n, k);
      Tensor ws =
          ws_bytes ? take(g->alloc(DType::kU8, {static_cast<int64_t>(ws_bytes)}), "ws") : Tensor();
      const double flop = 2.0 * m * n * k;
      double best = 1e30;
      cuda::Fp8Tile best_tile = cuda::Fp8Tile::kAuto;
      for (const cuda::Fp8Tile tile : cuda::kFp8Tiles) {
        const double t = sustained_ms(g, [&] {
          return cuda::cutlass_fp8_rows(x8.data(), w8.data(), sx.data_as<float>(),
                                        sw.data_as<float>(), nullptr, y.data(), m, n, k,
                                        ws_bytes ? ws.data() : nullptr, ws_bytes, g->stream(),
                                        /*fast_accum=*/true, tile);
        });
        report(cat("fp8 GEMM ", m, "x", n, "x", k, " ", cuda::fp8_tile_name(tile)), t, flop, 0);
        if (t < best) best = t, best_tile = tile;
      }
      const cuda::Fp8Tile chosen = cuda::fp8_tile_for(m, n, k);
      std::printf("  PERF fp8 GEMM %lldx%lldx%lld: fastest %s, fp8_tile_for picks %s\n",
                  static_cast<long long>(m), static_cast<long long>(n), static_cast<long long>(k),
                  cuda::fp8_tile_name(best_tile), cuda::fp8_tile_name(chosen));
    }
  }
}

// The DiT's q|k|v linear and attention prologue at 1024² and 2048²: cuBLASLt's GEMM + the prologue
// kernel against the GEMM with the prologue in its epilogue, every tuning.
TEST(CudaOpsPerf, MatmulQkvNormRope) {
  ZI_REQUIRE_GPU();
  cuda::CudaBackend* g = gpu(DType::kBF16);
  g->set_fused_swiglu(true);
  const bool fused = g->swiglu_block(10240, 3840) > 0;
  g->set_fused_swiglu(false);
  if (!fused) GTEST_SKIP() << "no fused GEMMs here";
  const int64_t h = 30, dh = 128, k = 3840, n = 3 * h * dh;
  Tensor w = rand_dev(g, {n, k}, 3100, -0.05f, 0.05f);
  Tensor nq = rand_dev(g, {dh}, 3101, 0.5f, 1.5f), nk = rand_dev(g, {dh}, 3102, 0.5f, 1.5f);
  for (int64_t m : {int64_t{4160}, int64_t{16448}}) {
    Tensor x = rand_dev(g, {m, k}, 3103);
    Tensor f = take(g->upload(rand_host({1, m, dh / 2, 2}, 3104, DType::kF32), DType::kF32), "f");
    Tensor qkv = take(g->alloc(DType::kBF16, {m, n}), "qkv");
    Tensor q = take(g->alloc(DType::kBF16, {1, m, h, dh}), "q");
    Tensor kk = take(g->alloc(DType::kBF16, {1, m, h, dh}), "k");
    Tensor v = take(g->alloc(DType::kBF16, {1, m, h, dh}), "v");
    auto op = [&] { return g->matmul_qkv_norm_rope(x, w, nq, nk, 1e-6f, f, qkv, q, kk, v); };
    const double flop = 2.0 * m * n * k;
    g->set_fused_qkv(false);
    const double t_two = sustained_ms(g, op);
    g->set_fused_qkv(true);
    report(cat("q|k|v GEMM + prologue (two kernels) ", m, "x", n, "x", k), t_two, flop, 0);
    report(cat("q|k|v GEMM alone (cuBLASLt) ", m),
           sustained_ms(g, [&] { return g->matmul(x, w, Tensor(), qkv); }), flop, 0);
    plain_cutlass_rows(g, cat("q|k|v GEMM alone ", m), x, w, qkv, flop);
    sweep(
        g, cat("qkv ", m), flop, t_two, [&](const cuda::GemmTuning& t) { g->set_qkv_tuning(t); },
        op);
    g->set_fused_qkv(false);  // opt-in: off again
  }
}

// cuBLASLt's heuristic candidates at the DiT's four main GEMM shapes (1024² and 2048²), each
// timed under sustained load: whether another candidate than the heuristic's first is faster.
TEST(CudaOpsPerf, GemmCandidates) {
  ZI_REQUIRE_GPU();
  cuda::CudaBackend* g = gpu(DType::kBF16);
  cuda::LtGemm* lt = g->lt_gemm();
  ASSERT_NE(lt, nullptr);
  struct Nk {
    int64_t n, k;
  };
  const Nk shapes[] = {{20480, 3840}, {11520, 3840}, {3840, 10240}, {3840, 3840}};
  uint32_t seed = 3200;
  for (int64_t m : {int64_t{4160}, int64_t{16448}}) {
    for (const Nk& s : shapes) {
      Tensor x = rand_dev(g, {m, s.k}, seed++);
      Tensor w = rand_dev(g, {s.n, s.k}, seed++, -0.05f, 0.05f);
      Tensor y = take(g->alloc(DType::kBF16, {m, s.n}), "y");
      const double flop = 2.0 * m * s.n * s.k;
      auto op = [&] { return g->matmul(x, w, Tensor(), y); };
      const std::string shape = cat(m, "x", s.n, "x", s.k);
      lt->set_candidate(-1);
      const double t0 = sustained_ms(g, op);
      report(cat("gemm ", shape, " default [", take(lt->describe(m, s.n, s.k, DType::kBF16), "d"),
                 "]"),
             t0, flop, 0);
      double best = t0;
      int best_i = -1;
      for (int i = 0; i < cuda::LtGemm::kMaxCandidates; ++i) {
        lt->set_candidate(i);
        if (!op().ok()) break;  // no further candidates
        const double t = sustained_ms(g, op);
        report(cat("gemm ", shape, " candidate ", i, " [",
                   take(lt->describe(m, s.n, s.k, DType::kBF16), "d"), "]"),
               t, flop, 0);
        if (t < best) best = t, best_i = i;
      }
      lt->set_candidate(-1);
      std::printf("  PERF gemm %s: best candidate %d %.3f ms, %.3fx the default (%.3f ms)\n",
                  shape.c_str(), best_i, best, t0 / best, t0);
      EXPECT_GT(t0, 0);
    }
  }
}

// The DiT's memory-bound row kernels at 1024² and 2048² (4160 and 16448 rows of 3840, the
// prologue on 90 heads of 128) under each RowKernelTuning, back to back; bytes are each kernel's
// reads and writes of activations.
TEST(CudaOpsPerf, RowKernelTuning) {
  ZI_REQUIRE_GPU();
  cuda::CudaBackend* g = gpu(DType::kBF16);
  const int64_t d = 3840, h = 30, dh = 128;
  uint32_t seed = 3300;
  Tensor w = rand_dev(g, {d}, seed++);
  Tensor gate = rand_dev(g, {1, d}, seed++);
  Tensor scale = rand_dev(g, {1, d}, seed++);
  Tensor nq = rand_dev(g, {dh}, seed++, 0.5f, 1.5f), nk = rand_dev(g, {dh}, seed++, 0.5f, 1.5f);
  const cuda::RowKernelTuning was = cuda::row_kernel_tuning();
  for (int64_t m : {int64_t{4160}, int64_t{16448}}) {
    Tensor x = rand_dev(g, {1, m, d}, seed++);
    Tensor y = rand_dev(g, {1, m, d}, seed++);
    Tensor out = take(g->alloc(DType::kBF16, {1, m, d}), "out");
    Tensor qkv = rand_dev(g, {m, 3 * h * dh}, seed++);
    Tensor f = take(g->upload(rand_host({1, m, dh / 2, 2}, seed++, DType::kF32), DType::kF32), "f");
    Tensor q = take(g->alloc(DType::kBF16, {1, m, h, dh}), "q");
    Tensor k = take(g->alloc(DType::kBF16, {1, m, h, dh}), "k");
    Tensor v = take(g->alloc(DType::kBF16, {1, m, h, dh}), "v");
    const double row = 2.0 * m * d;  // bytes of one [m, d] bf16 tensor
    for (int t : {1, 2, 4}) {
      cuda::set_row_kernel_tuning({t, t, t == 1 ? 1 : 2});
      report(cat("rms_norm ", m, "x", d, " ppt ", t),
             sustained_ms(g, [&] { return g->rms_norm(x, w, 1e-6f, scale, out); }), 0, 2 * row);
      report(cat("residual_rms_norm_gate ", m, " ppt ", t),
             sustained_ms(g, [&] { return g->residual_rms_norm_gate(x, y, w, 1e-6f, gate); }), 0,
             3 * row);
      report(cat("residual_norm_gate_then_norm ", m, " ppt ", t),
             sustained_ms(g,
                          [&] {
                            // The next norm's output is [rows, d], as the op's contract wants it.
                            Tensor out_rows = out.view({m, d});
                            return g->residual_norm_gate_then_norm(x, y, w, 1e-6f, gate, w, scale,
                                                                   out_rows);
                          }),
             0, 4 * row);
      report(
          cat("qkv_split_norm_rope ", m, "x", 3 * h * dh, " items ", t),
          sustained_ms(g, [&] { return g->qkv_split_norm_rope(qkv, nq, nk, 1e-6f, f, q, k, v); }),
          0, 2.0 * m * 3 * h * dh * 2);
    }
  }
  // The DiT's SwiGLU (4160 and 16448 rows of 2 x 10240), flat (1) against row-walking (2).
  for (int64_t m : {int64_t{4160}, int64_t{16448}}) {
    Tensor up = rand_dev(g, {m, 20480}, seed++);
    Tensor act = take(g->alloc(DType::kBF16, {m, 10240}), "act");
    for (int t : {1, 2}) {
      cuda::set_row_kernel_tuning({0, 0, t});
      report(cat("swiglu ", m, " x 2x10240, kernel ", t == 1 ? "flat" : "rows"),
             sustained_ms(g, [&] { return g->swiglu(up, act); }), 0, 3.0 * m * 10240 * 2);
    }
  }
  // The VAE's widest upsampling (512² × 256 -> 1024²), flat against row-walking.
  {
    Tensor x = rand_dev(g, {1, 512, 512, 256}, seed++);
    Tensor y = take(g->alloc(DType::kBF16, {1, 1024, 1024, 256}), "y");
    for (int t : {1, 2}) {
      cuda::set_row_kernel_tuning({0, 0, t});
      report(cat("upsample_nearest2x 512^2 x 256, kernel ", t == 1 ? "flat" : "rows"),
             sustained_ms(g, [&] { return g->upsample_nearest2x(x, y); }), 0,
             5.0 * 512 * 512 * 256 * 2);
    }
  }
  // The VAE's group norm + SiLU at its widest activations (1024², 2048²: 128 channels), the
  // general kernels (1) against the row-walking ones (2): one read for the statistics, one read and
  // one write to apply.
  for (int64_t side : {int64_t{1024}, int64_t{2048}}) {
    Tensor x = rand_dev(g, {1, side, side, 128}, seed++);
    Tensor y = take(g->alloc(DType::kBF16, {1, side, side, 128}), "y");
    Tensor gam = rand_dev(g, {128}, seed++, 0.5f, 1.5f), bet = rand_dev(g, {128}, seed++);
    for (int t : {1, 2}) {
      cuda::set_row_kernel_tuning({0, 0, t});
      report(cat("group_norm+silu ", side, "^2 x 128, kernels ", t == 1 ? "general" : "rows"),
             sustained_ms(g, [&] { return g->group_norm(x, gam, bet, 32, 1e-6f, true, y); }), 0,
             3.0 * side * side * 128 * 2);
    }
  }
  cuda::set_row_kernel_tuning(was);
}

// The DiT block's adaLN projection + modulation (batch 1, 256 -> 4 x 3840): cuBLASLt's GEMV and
// the modulation kernel against the fused GEMV, back to back; bytes are the weight's.
TEST(CudaOpsPerf, AdalnModulation) {
  ZI_REQUIRE_GPU();
  cuda::CudaBackend* g = gpu(DType::kBF16);
  const int64_t d = 3840, k = 256;
  Tensor c = rand_dev(g, {1, k}, 3400);
  Tensor w = rand_dev(g, {4 * d, k}, 3401, -0.05f, 0.05f);
  Tensor bias = rand_dev(g, {4 * d}, 3402);
  Tensor mod = take(g->alloc(DType::kBF16, {1, 4 * d}), "mod");
  Tensor o[4];
  for (Tensor& t : o) t = take(g->alloc(DType::kBF16, {1, d}), "o");
  auto op = [&] { return g->matmul_dit_modulation(c, w, bias, mod, o[0], o[1], o[2], o[3]); };
  const bool was = g->fused_adaln(), was_layers = g->adaln_layers();
  for (bool fused : {false, true}) {
    g->set_fused_adaln(fused);
    g->set_adaln_layers(false);
    report(fused ? "adaln 1x256 -> 4x3840 fused" : "adaln 1x256 -> 4x3840 GEMV + kernel",
           sustained_ms(g, op), 0, 2.0 * 4 * d * k);
  }
  // A forward's 32 modulated blocks (weights in separate allocations, as loaded): block by block
  // (GEMV + kernel, or the fused kernel), and all in one launch (dit_modulation_layers' default).
  const int64_t layers = 32;
  std::vector<Tensor> ws, bs;
  for (int64_t l = 0; l < layers; ++l) {
    ws.push_back(rand_dev(g, {4 * d, k}, 3410 + static_cast<uint32_t>(l), -0.05f, 0.05f));
    bs.push_back(rand_dev(g, {4 * d}, 3450 + static_cast<uint32_t>(l)));
  }
  Tensor all = take(g->alloc(DType::kBF16, {layers, 4, 1, d}), "mods");
  const double bytes = static_cast<double>(layers) * (4 * d * k + 4 * d) * 2;
  for (int form = 0; form < 3; ++form) {
    g->set_fused_adaln(form == 1);
    g->set_adaln_layers(form == 2);
    report(form == 0   ? "adaln x32 blocks, GEMV + kernel each"
           : form == 1 ? "adaln x32 blocks, fused kernel each"
                       : "adaln x32 blocks, one launch (dit_modulation_layers)",
           sustained_ms(g, [&] { return g->dit_modulation_layers(c, ws, bs, all); }),
           2.0 * layers * 4 * d * k, bytes);
  }
  g->set_fused_adaln(was);
  g->set_adaln_layers(was_layers);
}

TEST(CudaOpsPerf, AttentionBf16) {
  ZI_REQUIRE_GPU();
  cuda::CudaBackend* g = gpu(DType::kBF16);
  struct Case {
    const char* name;
    int64_t s, hq, hkv, d;
    bool causal;
    cuda::AttentionPath path;
  };
  const Case cases[] = {
      {"flash 30 x 4224 x 128", 4224, 30, 30, 128, false, cuda::AttentionPath::kFlash},
      {"flash 30 x 4224 x 64 heads x2", 4224, 60, 60, 64, false, cuda::AttentionPath::kFlash},
      {"general 30 x 4224 x 128", 4224, 30, 30, 128, false, cuda::AttentionPath::kGeneral},
      {"flash 30 x 1088 x 128", 1088, 30, 30, 128, false, cuda::AttentionPath::kFlash},
      {"flash causal 32/8 x 512 x 128 (Qwen3)", 512, 32, 8, 128, true, cuda::AttentionPath::kFlash},
      {"general 1 x 16384 x 512 (VAE 1024^2)", 16384, 1, 1, 512, false,
       cuda::AttentionPath::kGeneral},
      {"general 1 x 25600 x 512 (VAE 1280^2)", 25600, 1, 1, 512, false,
       cuda::AttentionPath::kGeneral},
      {"general 1 x 65536 x 512 (VAE 2048^2)", 65536, 1, 1, 512, false,
       cuda::AttentionPath::kGeneral},
      {"auto 1 x 16384 x 512 (VAE 1024^2)", 16384, 1, 1, 512, false, cuda::AttentionPath::kAuto},
      {"auto 1 x 65536 x 512 (VAE 2048^2)", 65536, 1, 1, 512, false, cuda::AttentionPath::kAuto},
      // The DiT's attention at 1024^2, 1536^2, 2048^2 (image + caption tokens): cuDNN's fused
      // attention against FlashInfer's Hopper (FA3) kernel and FlashAttention-3's own.
      {"cudnn 30 x 4160 x 128 (DiT 1024^2)", 4160, 30, 30, 128, false, cuda::AttentionPath::kCudnn},
      {"fa3 30 x 4160 x 128 (DiT 1024^2)", 4160, 30, 30, 128, false, cuda::AttentionPath::kFa3},
      {"flash3 30 x 4160 x 128 (DiT 1024^2)", 4160, 30, 30, 128, false,
       cuda::AttentionPath::kFlash3},
      {"cudnn 30 x 9280 x 128 (DiT 1536^2)", 9280, 30, 30, 128, false, cuda::AttentionPath::kCudnn},
      {"fa3 30 x 9280 x 128 (DiT 1536^2)", 9280, 30, 30, 128, false, cuda::AttentionPath::kFa3},
      {"flash3 30 x 9280 x 128 (DiT 1536^2)", 9280, 30, 30, 128, false,
       cuda::AttentionPath::kFlash3},
      {"cudnn 30 x 16448 x 128 (DiT 2048^2)", 16448, 30, 30, 128, false,
       cuda::AttentionPath::kCudnn},
      {"fa3 30 x 16448 x 128 (DiT 2048^2)", 16448, 30, 30, 128, false, cuda::AttentionPath::kFa3},
      {"flash3 30 x 16448 x 128 (DiT 2048^2)", 16448, 30, 30, 128, false,
       cuda::AttentionPath::kFlash3},
      {"cudnn causal 32/8 x 512 x 128 (Qwen3)", 512, 32, 8, 128, true, cuda::AttentionPath::kCudnn},
      {"fa3 causal 32/8 x 512 x 128 (Qwen3)", 512, 32, 8, 128, true, cuda::AttentionPath::kFa3},
  };
  uint32_t seed = 2100;
  for (const Case& c : cases) {
    Tensor q = rand_dev(g, {1, c.s, c.hq, c.d}, seed++);
    Tensor k = rand_dev(g, {1, c.s, c.hkv, c.d}, seed++);
    Tensor v = rand_dev(g, {1, c.s, c.hkv, c.d}, seed++);
    Tensor o = take(g->alloc(DType::kBF16, {1, c.s, c.hq, c.d}), "o");
    AttentionParams p;
    p.scale = 1.0f / std::sqrt(static_cast<float>(c.d));
    p.causal = c.causal;
    g->set_attention_path(c.path);
    const double flop = 4.0 * c.s * c.s * c.d * c.hq * (c.causal ? 0.5 : 1.0);
    if (c.path == cuda::AttentionPath::kFlash) {
      const cuda::FlashVariant keep = g->flash_variant();
      for (auto [variant, vname] : {std::pair{cuda::FlashVariant::kQInRegisters, " [Q regs]"},
                                    std::pair{cuda::FlashVariant::kQInShared, " [Q smem]"}}) {
        g->set_flash_variant(variant);
        const double ms = median_ms(g, [&] { return g->attention(q, k, v, p, o); });
        report(cat("attention ", c.name, vname), ms, flop, 0);
      }
      g->set_flash_variant(keep);
    } else if ((c.path == cuda::AttentionPath::kFa3 && !g->has_fa3_attention()) ||
               (c.path == cuda::AttentionPath::kFlash3 && !g->has_flash3_attention()) ||
               (c.path == cuda::AttentionPath::kCudnn && !g->has_cudnn_attention())) {
      std::printf("  PERF attention %s skipped: that kernel is not in this build or GPU\n", c.name);
    } else {
      report(cat("attention ", c.name), median_ms(g, [&] { return g->attention(q, k, v, p, o); }),
             flop, 0);
      if (c.path == cuda::AttentionPath::kGeneral && c.d == 512) {  // the softmax's two kernels
        cuda::set_masked_softmax_on_chip(false);
        report(cat("attention ", c.name, " [three-pass softmax]"),
               median_ms(g, [&] { return g->attention(q, k, v, p, o); }), flop, 0);
        cuda::set_masked_softmax_on_chip(true);
      }
    }
    g->set_attention_path(cuda::AttentionPath::kAuto);
  }
}

// The opt-in FP8 attention at the DiT's shapes: the bf16 path (prologue in place, then
// FlashAttention-3's bf16 kernel reading the projection) against attention_packed_fp8 (the FP8
// prologue, v's scales and quantisation, FlashAttention-3's e4m3 kernel), and that kernel alone.
TEST(CudaOpsPerf, AttentionFp8) {
  ZI_REQUIRE_GPU();
  cuda::CudaBackend* g = gpu(DType::kBF16);
  if (!g->fp8_attention_support().ok()) GTEST_SKIP() << g->fp8_attention_support().message();
  constexpr int64_t h = DitAttentionCase::h, d = DitAttentionCase::d, f = DitAttentionCase::f;
  uint32_t seed = 2300;
  for (int64_t s : {4160, 9280, 16448}) {
    DitAttentionCase c(g, s, seed);
    Tensor &qkv = c.qkv, &wq = c.wq, &wk = c.wk, &o = c.o;
    const AttentionParams& p = c.p;
    const double flop = c.flop;
    const Tensor none;
    g->set_attention_path(cuda::AttentionPath::kFlash3);
    report(cat("attention bf16, prologue + flash3, 30 x ", s),
           median_ms(g,
                     [&] {
                       ZI_TRY(g->qk_norm_rope_packed(qkv, h, h, wq, wk, 1e-6f, none));
                       return g->attention_packed(qkv, h, h, p, o);
                     }),
           flop, 0);
    g->set_attention_path(cuda::AttentionPath::kAuto);
    report(
        cat("attention fp8, prologue + v + flash3 e4m3, 30 x ", s),
        median_ms(g, [&] { return g->attention_packed_fp8(qkv, h, h, wq, wk, 1e-6f, none, p, o); }),
        flop, 0);
    // The e4m3 kernel alone, on an operand the two quantising kernels wrote once.
    Tensor q8 = take(g->alloc(DType::kF8E4M3, {1, s, f}), "q8");
    Tensor sc = take(g->alloc(DType::kF32, {2 + h}), "scales");
    Tensor amax = take(g->alloc(DType::kF32, {h}), "amax");
    Tensor lse = take(g->alloc(DType::kF32, {h * s}), "lse");
    ASSERT_EQ(cuda::launch_qk_norm_rope_packed_fp8(
                  cuda::KType::kBF16, qkv.data(), wq.data(), wk.data(), nullptr, q8.data(),
                  sc.data_as<float>(), s, 0, h, h, d, 1e-6f, g->stream()),
              cudaSuccess);
    ASSERT_EQ(
        cuda::launch_quantize_packed_v_fp8(cuda::KType::kBF16, qkv.data(), q8.data(), amax.data(),
                                           sc.data_as<float>() + 2, s, h, h, d, g->stream()),
        cudaSuccess);
    // The quantising kernels apart (the bytes each moves: q and k read and written in e4m3, with
    // the RoPE table; v read twice, its max then its codes, and written once), and the bf16
    // prologue, at each number of items a warp loads before it computes (RowKernelTuning).
    Tensor fr32 = rand_dev(g, {1, s, d / 2, 2}, seed++);
    Tensor freqs = take(g->alloc(DType::kF32, {1, s, d / 2, 2}), "freqs");
    ZI_ASSERT_OK(g->convert(fr32, freqs));
    const cuda::RowKernelTuning was = cuda::row_kernel_tuning();
    const bool was_staged = cuda::staged_row_kernels();
    for (const int items : {0, 1, 2, 4}) {  // 0: a block per row (the default)
      cuda::set_row_kernel_tuning({was.norm_ppt, items, was.row_walk});
      cuda::set_staged_row_kernels(items == 0);
      report(cat("attention fp8, q/k norm + RoPE to e4m3, items ", items, ", 30 x ", s),
             median_ms(g,
                       [&] {
                         return cuda::launch_qk_norm_rope_packed_fp8(
                                    cuda::KType::kBF16, qkv.data(), wq.data(), wk.data(),
                                    freqs.data_as<float>(), q8.data(), sc.data_as<float>(), s, 0, h,
                                    h, d, 1e-6f, g->stream()) == cudaSuccess
                                    ? Status::Ok()
                                    : InternalError("launch");
                       }),
             0, static_cast<double>(s) * 2 * h * d * 3 + 4.0 * s * d);
      report(cat("attention bf16, q/k norm + RoPE in place, items ", items, ", 30 x ", s),
             median_ms(g, [&] { return g->qk_norm_rope_packed(qkv, h, h, wq, wk, 1e-6f, freqs); }),
             0, static_cast<double>(s) * 2 * h * d * 4 + 4.0 * s * d);
    }
    cuda::set_row_kernel_tuning(was);
    cuda::set_staged_row_kernels(was_staged);
    report(cat("attention fp8, v max + v to e4m3, 30 x ", s),
           median_ms(g,
                     [&] {
                       return cuda::launch_quantize_packed_v_fp8(
                                  cuda::KType::kBF16, qkv.data(), q8.data(), amax.data(),
                                  sc.data_as<float>() + 2, s, h, h, d, g->stream()) == cudaSuccess
                                  ? Status::Ok()
                                  : InternalError("launch");
                     }),
           0, static_cast<double>(s) * h * d * 5);
    auto* b8 = static_cast<uint8_t*>(q8.data());
    const cuda::Fa3Request r{b8, b8 + h * d, b8 + 2 * h * d, o.data(), 1,       s, s, h,
                             h,  d,          p.scale,        false,    nullptr, f, f};
    const float* scp = sc.data_as<float>();
    report(cat("attention fp8, flash3 e4m3 kernel alone, 30 x ", s),
           median_ms(g,
                     [&] {
                       return cuda::flash3_attention_fp8(r, {scp, scp + 1, scp + 2}, lse.data(),
                                                         g->num_sms(), g->stream(),
                                                         g->flash3_cluster_for(true));
                     }),
           flop, 0);
  }
}

TEST(CudaOpsPerf, ConvAndNormsBf16) {
  ZI_REQUIRE_GPU();
  cuda::CudaBackend* g = gpu(DType::kBF16);
  struct ConvCase {
    int64_t hw, cin, cout;
  };
  uint32_t seed = 2200;
  if (!g->has_cudnn()) std::printf("  PERF conv skipped: cuDNN not loaded (direct kernel only)\n");
  for (const ConvCase& c : {ConvCase{128, 512, 512}, ConvCase{512, 256, 256},
                            ConvCase{1024, 128, 128}, ConvCase{1024, 128, 3}}) {
    if (!g->has_cudnn()) break;
    Tensor x = rand_dev(g, {1, c.hw, c.hw, c.cin}, seed++);
    Tensor w = rand_dev(g, {c.cout, 3, 3, c.cin}, seed++, -0.05f, 0.05f);
    Tensor b = rand_dev(g, {c.cout}, seed++);
    Tensor y = take(g->alloc(DType::kBF16, {1, c.hw, c.hw, c.cout}), "y");
    Conv2dParams p{1, 1, 1, 1, 1};
    const double ms = median_ms(g, [&] { return g->conv2d(x, w, b, p, y); });
    report(cat("conv3x3 ", c.hw, "^2 ", c.cin, "->", c.cout), ms,
           2.0 * c.hw * c.hw * c.cin * c.cout * 9, 0);
    if (c.cin != c.cout) continue;
    // A VAE resnet's conv2 with the residual: summed in the epilogue, or conv2d, then add.
    Tensor r = rand_dev(g, {1, c.hw, c.hw, c.cout}, seed++);
    for (bool fused : {false, true}) {
      g->set_fused_conv_add(fused);
      report(cat("conv3x3 ", c.hw, "^2 ", c.cin, "->", c.cout, " + residual",
                 fused ? " (fused)" : " (then add)"),
             median_ms(g, [&] { return g->conv2d_add(x, w, b, r, p, y); }),
             2.0 * c.hw * c.hw * c.cin * c.cout * 9, 0);
    }
    g->set_fused_conv_add(true);
  }
  {
    Tensor x = rand_dev(g, {4224, 3840}, seed++);
    Tensor w = rand_dev(g, {3840}, seed++);
    Tensor s = rand_dev(g, {1, 3840}, seed++);
    Tensor y = take(g->alloc(DType::kBF16, {4224, 3840}), "y");
    const double bytes = 2.0 * 4224 * 3840 * 2;
    report("rms_norm 4224x3840 (+w, +scale)",
           median_ms(g, [&] { return g->rms_norm(x, w, 1e-6f, s, y); }), 0, bytes);
    report("add 4224x3840", median_ms(g, [&] { return g->add(x, y, y); }), 0, 1.5 * bytes);
    Tensor r = rand_dev(g, {1, 4224, 3840}, seed++);
    Tensor gate = rand_dev(g, {1, 3840}, seed++);
    Tensor xr = x.view({1, 4224, 3840});
    report("residual_rms_norm_gate 4224x3840",
           median_ms(g, [&] { return g->residual_rms_norm_gate(xr, r, w, 1e-6f, gate); }), 0,
           1.5 * bytes);
    // The gated residual and the next pre-norm: two kernels against the fused one.
    Tensor normed = take(g->alloc(DType::kBF16, {4224, 3840}), "normed");
    const bool was = g->fused_norm();
    for (bool fused : {false, true}) {
      g->set_fused_norm(fused);
      report(
          fused ? "residual_norm_gate_then_norm 4224x3840 fused"
                : "residual_norm_gate_then_norm 4224x3840 two kernels",
          median_ms(
              g,
              [&] { return g->residual_norm_gate_then_norm(xr, r, w, 1e-6f, gate, w, s, normed); }),
          0, 2.0 * bytes);
    }
    g->set_fused_norm(was);
    Tensor hw = rand_dev(g, {128}, seed++);
    Tensor qk = x.view({1, 4224, 30, 128});
    report("rms_norm q/k per head 126720x128 in place",
           median_ms(g, [&] { return g->rms_norm(qk, hw, 1e-5f, Tensor(), qk); }), 0, bytes);
    Tensor freqs =
        take(g->upload(rand_host({1, 4224, 64, 2}, seed++, DType::kF32), DType::kF32), "freqs");
    report("rope_interleaved 4224 x 30 x 128",
           median_ms(g, [&] { return g->rope_interleaved(qk, freqs); }), 0, bytes);
    Tensor up = rand_dev(g, {4224, 20480}, seed++);
    Tensor act = take(g->alloc(DType::kBF16, {4224, 10240}), "act");
    report("swiglu 4224 x 2x10240", median_ms(g, [&] { return g->swiglu(up, act); }), 0,
           3.0 * 4224 * 10240 * 2);
  }
  // Every group norm shape of the VAE decoder at 1024² (calls per decode: 6, 1, 5, 1, 6, 11).
  for (const auto& [side, ch] : {std::pair<int64_t, int64_t>{1024, 128},
                                 {1024, 256},
                                 {512, 256},
                                 {512, 512},
                                 {256, 512},
                                 {128, 512}}) {
    Tensor x = rand_dev(g, {1, side, side, ch}, seed++);
    Tensor y = take(g->alloc(DType::kBF16, {1, side, side, ch}), "y");
    Tensor gam = rand_dev(g, {ch}, seed++, 0.5f, 1.5f), bet = rand_dev(g, {ch}, seed++);
    report(cat("group_norm+silu ", side, "^2 x ", ch),
           median_ms(g, [&] { return g->group_norm(x, gam, bet, 32, 1e-6f, true, y); }), 0,
           2.0 * side * side * ch * 3);  // stats pass + apply pass (read, write)
  }
}

}  // namespace
}  // namespace zimage::test
