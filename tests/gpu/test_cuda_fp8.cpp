// W8A8 FP8 on the GPU (--precision fp8):
//  * matmul_fp8_rows (per-token activation scales, per-channel weight scales), both ways it runs
//    (CUTLASS with the scales and bias in its epilogue; cuBLASLt's FP8 GEMM and a scaling pass),
//    against the CPU oracle at the DiT's own GEMM shapes, ragged tiles, and a shape no FP8 GEMM
//    takes (the widened fallback), with its speed against the bf16 GEMM printed;
//  * the golden DiT with every linear in FP8: the recorded (CUDA graph) forward equals the eager
//    one bit for bit, and stays close to the bf16 model.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <tuple>

#include "backend/cuda/libs/gemm_cutlass.h"
#include "common/npy.h"
#include "gpu/cuda_test_util.h"
#include "io/model/model_folder.h"
#include "io/weights/weights.h"
#include "model/common/linear.h"
#include "model/dit/zimage_dit.h"

using namespace zimage;
using namespace zimage::test;

namespace {

// y = W8A8(x, w) (+ bias) on the GPU (bf16) and on the CPU oracle from the same bf16 values,
// through CUTLASS (scales and bias in its epilogue) or cuBLASLt (per-tensor FP8 GEMM, then a
// scaling pass).
// The three ways a W8A8 GEMM runs on the H200 (kCutlassFastAccum ships).
enum class Fp8Path { kCutlass, kCutlassFastAccum, kCublasLt };
const char* path_name(Fp8Path p) {
  return p == Fp8Path::kCutlass            ? "CUTLASS fp32-promoted"
         : p == Fp8Path::kCutlassFastAccum ? "CUTLASS fast-accum"
                                           : "cuBLASLt";
}
void use_path(cuda::CudaBackend* g, Fp8Path p) {
  g->set_cutlass(p != Fp8Path::kCublasLt);
  g->set_fp8_fast_accum(p == Fp8Path::kCutlassFastAccum);
}

void compare_with_oracle(int64_t m, int64_t n, int64_t k, bool with_bias, Fp8Path path,
                         cuda::Fp8Tile tile = cuda::Fp8Tile::kAuto) {
  cuda::CudaBackend* g = gpu(DType::kBF16);
  ASSERT_NE(g, nullptr);
  const Tensor xh = rand_host({m, k}, 5, DType::kBF16, -3.f, 3.f);
  const Tensor wh = rand_host({n, k}, 6, DType::kBF16, -0.05f, 0.05f);
  const Tensor bh = with_bias ? rand_host({n}, 7, DType::kBF16, -1.f, 1.f) : Tensor();  // f32
  // The CPU oracle's FP8 weight bytes (the same bytes the GPU's row kernel makes: CudaFp8Rows).
  Tensor c8 = Tensor::host(DType::kF8E4M3, {n, k}), cs = Tensor::host(DType::kF32, {n});
  ZI_ASSERT_OK(cpu_oracle().quantize_fp8_rows(wh, c8, cs));
  Tensor cy = Tensor::host(DType::kF32, {m, n});
  ZI_ASSERT_OK(cpu_oracle().matmul_fp8_rows(xh, c8, cs, bh, cy));

  Tensor x = take(g->upload(xh, DType::kBF16), "upload");
  Tensor w = take(g->upload(wh, DType::kBF16), "upload");
  Tensor b = with_bias ? take(g->upload(bh, DType::kBF16), "upload") : Tensor();
  Tensor w8 = take(g->alloc(DType::kF8E4M3, {n, k}), "alloc");
  Tensor sw = take(g->alloc(DType::kF32, {n}), "alloc");
  ZI_ASSERT_OK(g->quantize_fp8_rows(w, w8, sw));
  Tensor y = take(g->alloc(DType::kBF16, {m, n}), "alloc");
  ZI_ASSERT_OK(g->fill(y, std::numeric_limits<float>::quiet_NaN()));
  use_path(g, path);
  g->set_fp8_tile(tile);
  const Status st = g->matmul_fp8_rows(x, w8, sw, b, y);
  use_path(g, Fp8Path::kCutlassFastAccum);  // the default again
  g->set_fp8_tile(cuda::Fp8Tile::kAuto);
  ZI_ASSERT_OK(st);
  const std::vector<float> ref(cy.data_as<float>(), cy.data_as<float>() + cy.numel());
  // The same quantised operands; the accumulation order and the bf16 roundings differ: one
  // rounding of the scaled sum through CUTLASS, two through cuBLASLt (the raw sums, then the
  // scaled value: ~2.8e-3 each, measured).
  expect_close(std::string(path_name(path)) + " " + cuda::fp8_tile_name(tile) +
                   " matmul_fp8_rows [" + std::to_string(m) + "x" + std::to_string(k) + "]x[" +
                   std::to_string(n) + "]" + (with_bias ? " + bias" : ""),
               DType::kBF16, fetch(*g, y), ref, path == Fp8Path::kCutlass ? 4e-3 : 6e-3);
}

// CUTLASS's FP8 GEMM called directly at m × n × k (operands uninitialised: only that it runs,
// not answers unsupported, which the backend would hide behind its cuBLASLt path).
Status run_cutlass_fp8(cuda::CudaBackend* g, int64_t m, int64_t n, int64_t k, bool fast,
                       cuda::Fp8Tile tile) {
  Tensor x8 = take(g->alloc(DType::kF8E4M3, {m, k}), "alloc");
  Tensor w8 = take(g->alloc(DType::kF8E4M3, {n, k}), "alloc");
  Tensor sx = take(g->alloc(DType::kF32, {m}), "alloc");
  Tensor sw = take(g->alloc(DType::kF32, {n}), "alloc");
  Tensor y = take(g->alloc(DType::kBF16, {m, n}), "alloc");
  const size_t ws = cuda::cutlass_fp8_rows_workspace(m, n, k);
  Tensor wsp = ws ? take(g->alloc(DType::kU8, {static_cast<int64_t>(ws)}), "alloc") : Tensor();
  ZI_TRY(cuda::cutlass_fp8_rows(x8.data(), w8.data(), sx.data_as<float>(), sw.data_as<float>(),
                                nullptr, y.data(), m, n, k, ws ? wsp.data() : nullptr, ws,
                                g->stream(), fast, tile));
  return g->synchronize();
}

Tensor run_dit(ZImageDiT& dit, const std::string& dir, Backend& be) {
  auto lat = load_npy(dir + "/init_noise.npy");
  auto cap = load_npy(dir + "/prompt_embeds_0.npy");
  EXPECT_TRUE(lat.ok() && cap.ok());
  if (!lat.ok() || !cap.ok()) return Tensor();
  Tensor l = take(be.upload(*lat, DType::kF32), "upload");
  Tensor c = take(be.upload(*cap, be.act_dtype()), "upload");
  Tensor out;
  const Status st = dit.forward(l, {0.25f}, {c}, out);
  EXPECT_TRUE(st.ok()) << st.to_string();
  if (!st.ok()) return Tensor();
  Tensor h = Tensor::host(DType::kF32, out.shape());
  EXPECT_TRUE(be.download(out, h).ok());
  return h;
}

}  // namespace

TEST(CudaFp8Compute, MatchesTheCpuOracleAtDitShapes) {
  ZI_REQUIRE_GPU();
  // One 1024² image: 4096 image + 32 caption tokens; the DiT's GEMM shapes (D 3840, F 10240).
  const int64_t m = 512;  // fewer rows keep the CPU oracle quick; the kernels tile the same
  for (Fp8Path p : {Fp8Path::kCutlass, Fp8Path::kCutlassFastAccum, Fp8Path::kCublasLt}) {
    compare_with_oracle(m, 3 * 3840, 3840, false, p);  // attention q|k|v
    compare_with_oracle(m, 3840, 10240, true, p);      // feed-forward w2
    compare_with_oracle(517, 264, 272, true, p);       // ragged tiles in m, n and k
    compare_with_oracle(24, 40, 40, true, p);          // k % 16 != 0: the widened fallback
  }
  // Where this build carries the CUTLASS kernel, the H200 runs it at these shapes (not a silent
  // fallback to the cuBLASLt path).
  if (cuda::cutlass_available()) {
    cuda::CudaBackend* g = gpu(DType::kBF16);
    for (const auto& [mm, n, k] :
         {std::tuple<int64_t, int64_t, int64_t>{4128, 3 * 3840, 3840}, {517, 264, 272}}) {
      for (bool fast : {false, true})
        ZI_ASSERT_OK(run_cutlass_fp8(g, mm, n, k, fast, cuda::Fp8Tile::kAuto));
    }
  } else {
    std::printf("  this build has no CUTLASS kernels: only the cuBLASLt path was tested\n");
  }
  // Speed at the real row count (printed, not asserted: the bench measures the forward).
  for (const auto& [n, k] : {std::pair<int64_t, int64_t>{3 * 3840, 3840},
                             {3840, 3840},
                             {2 * 10240, 3840},
                             {3840, 10240}}) {
    cuda::CudaBackend* g = gpu(DType::kBF16);
    const int64_t rows = 4128;
    Tensor x = take(g->upload(rand_host({rows, k}, 1, DType::kBF16), DType::kBF16), "upload");
    Tensor w =
        take(g->upload(rand_host({n, k}, 2, DType::kBF16, -0.05f, 0.05f), DType::kBF16), "upload");
    Tensor w8 = take(g->alloc(DType::kF8E4M3, {n, k}), "alloc");
    Tensor sw = take(g->alloc(DType::kF32, {n}), "alloc");
    ZI_ASSERT_OK(g->quantize_fp8_rows(w, w8, sw));
    Tensor y = take(g->alloc(DType::kBF16, {rows, n}), "alloc");
    Tensor yb = take(g->alloc(DType::kBF16, {rows, n}), "alloc");
    ZI_ASSERT_OK(g->matmul_fp8_rows(x, w8, sw, Tensor(), y));
    auto time_ms = [&](const std::function<Status()>& f) {
      for (int i = 0; i < 3; ++i) EXPECT_TRUE(f().ok());
      EXPECT_TRUE(g->synchronize().ok());
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < 20; ++i) EXPECT_TRUE(f().ok());
      EXPECT_TRUE(g->synchronize().ok());
      return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                 .count() /
             20;
    };
    use_path(g, Fp8Path::kCutlass);
    const double t8 = time_ms([&] { return g->matmul_fp8_rows(x, w8, sw, Tensor(), y); });
    use_path(g, Fp8Path::kCublasLt);
    const double t8lt = time_ms([&] { return g->matmul_fp8_rows(x, w8, sw, Tensor(), y); });
    use_path(g, Fp8Path::kCutlassFastAccum);
    const double t8fast = time_ms([&] { return g->matmul_fp8_rows(x, w8, sw, Tensor(), y); });
    const double t16 = time_ms([&] { return g->matmul(x, w, Tensor(), yb); });
    const double flop = 2.0 * rows * n * k;
    std::printf(
        "  [%lld x %lld] x [%lld x %lld]: W8A8 %.3f ms (%.0f TFLOP/s incl. quantising; "
        "fp32-promoted %.3f ms; cuBLASLt + scaling pass %.3f ms), bf16 %.3f ms (%.0f TFLOP/s): "
        "%.2fx\n",
        static_cast<long long>(rows), static_cast<long long>(k), static_cast<long long>(n),
        static_cast<long long>(k), t8fast, flop / t8fast / 1e9, t8, t8lt, t16, flop / t16 / 1e9,
        t16 / t8fast);
  }
}

// Every fast-accumulation tile (gemm_cutlass.h Fp8Tile; ZIMAGE_FP8_GEMM) against the CPU oracle
// through the backend, at DiT shapes and ragged tiles; and each tile called directly must run
// (not answer unsupported, which the backend would hide behind its cuBLASLt path).
TEST(CudaFp8Compute, EveryTileMatchesTheCpuOracle) {
  ZI_REQUIRE_GPU();
  if (!cuda::cutlass_available() || !cuda::cutlass_device_is_sm90())
    GTEST_SKIP() << "no CUTLASS FP8 GEMM on this build or device";
  for (cuda::Fp8Tile tile : cuda::kFp8Tiles) {
    for (const auto& [m, n, k, bias] :
         {std::tuple<int64_t, int64_t, int64_t, bool>{300, 3 * 3840, 3840, false},
          {300, 3840, 10240, true},
          {517, 264, 272, true}}) {  // the last ragged
      compare_with_oracle(m, n, k, bias, Fp8Path::kCutlassFastAccum, tile);
      ZI_ASSERT_OK(run_cutlass_fp8(gpu(DType::kBF16), m, n, k, true, tile));
    }
  }
}

TEST(CudaFp8Compute, GoldenDitRecordedEqualsEagerAndStaysClose) {
  ZI_REQUIRE_GPU();
  const std::string dir = golden_dir("v_turbo");
  auto folder = ModelFolder::open(dir + "/model");
  ASSERT_TRUE(folder.ok()) << folder.status().to_string();
  auto ws = WeightStore::open(dir + "/model/transformer");
  ASSERT_TRUE(ws.ok()) << ws.status().to_string();
  cuda::CudaBackend* g = gpu(DType::kBF16);
  auto ref = ZImageDiT::load(folder->configs().transformer, *ws, *g);
  ASSERT_TRUE(ref.ok()) << ref.status().to_string();
  WeightPlacement p;
  p.fp8_compute = kFp8Default;
  auto dit = ZImageDiT::load(folder->configs().transformer, *ws, *g, p);
  ASSERT_TRUE(dit.ok()) << dit.status().to_string();
  const Tensor a = run_dit(**ref, dir, *g);
  const Tensor recorded = run_dit(**dit, dir, *g);  // graphs on: the recording's warm-up run
  const Tensor replayed = run_dit(**dit, dir, *g);
  (*dit)->set_use_graphs(false);
  const Tensor eager = run_dit(**dit, dir, *g);
  ASSERT_TRUE(a.defined() && recorded.defined() && replayed.defined() && eager.defined());
  EXPECT_EQ(max_abs_diff(recorded, eager), 0.0);
  EXPECT_EQ(max_abs_diff(replayed, eager), 0.0);
  const std::vector<float> av(a.data_as<float>(), a.data_as<float>() + a.numel());
  const std::vector<float> bv(eager.data_as<float>(), eager.data_as<float>() + eager.numel());
  const ErrStats e = errors(bv, av);
  std::printf("  golden DiT W8A8 (all linears) vs bf16: rel_l2 %.3e, max_abs %.3e\n", e.rel_l2,
              e.max_abs);
  EXPECT_LT(e.rel_l2, 0.1);
  EXPECT_GT(e.max_abs, 0.0);  // the FP8 path ran
  // The W8A8 linears' inputs quantised by the ops that make them (takes_fp8_inputs) against
  // each linear quantising its own: the same bytes, so the same output bit for bit.
  g->set_fp8_inputs(false);
  const Tensor own = run_dit(**dit, dir, *g);
  g->set_fp8_inputs(true);
  ASSERT_TRUE(own.defined());
  EXPECT_EQ(max_abs_diff(own, eager), 0.0);
  // ... and the eager forward above took the FP8-input ops (not only the linears' own path).
  Tensor again;
  auto calls = calls_by_op(*g, [&] { again = run_dit(**dit, dir, *g); });
  EXPECT_GT(calls["residual_norm_gate_then_norm_fp8"], 0);
  EXPECT_GT(calls["swiglu_fp8"], 0);
  EXPECT_GT(calls["matmul_fp8_quantized"], 0);
  EXPECT_GT(calls["matmul_fp8_rows"], 0);  // the out projection quantises its own input
  EXPECT_EQ(max_abs_diff(again, eager), 0.0);
}

namespace {

Tensor copy_of(cuda::CudaBackend* g, const Tensor& t) {
  Tensor c = take(g->alloc(t.dtype(), t.shape()), "alloc");
  EXPECT_TRUE(g->copy_2d(t, 0, t.numel(), c, 0, t.numel(), 1, t.numel()).ok());
  return c;
}

// True when every value of the device tensor is NaN (a buffer the op did not write).
bool untouched(cuda::CudaBackend* g, const Tensor& t) {
  for (float v : fetch(*g, t))
    if (!std::isnan(v)) return false;
  return true;
}

}  // namespace

// residual_norm_gate_then_norm_fp8 and swiglu_fp8 give the bytes of the op, then
// quantize_fp8_rows, bit for bit: at the DiT's widths (one row a block), at widths a warp's
// threads share, and at widths the fused kernels do not take (the backend composes the two ops).
// Where the fused kernel ran, the act-dtype buffer stays unwritten.
TEST(CudaFp8Inputs, NormAndSwigluRowsAreTheTwoOpsBytes) {
  ZI_REQUIRE_GPU();
  const float eps = 1e-6f;
  const cuda::RowKernelTuning was = cuda::row_kernel_tuning();
  // rows, width, modulation groups (0: no gate or scale, the context refiner's), a gate grouped
  // unlike the scale (the composed ops), the activations' dtype, packs per thread, fused.
  struct Case {
    int64_t rows, d, groups;
    bool mixed;
    DType act;
    int ppt;
    bool fused;
  };
  for (const Case& c : {Case{300, 3840, 2, false, DType::kBF16, 0, true},
                        Case{300, 3840, 2, false, DType::kBF16, 2, true},
                        Case{300, 3840, 2, false, DType::kBF16, 4, true},
                        Case{64, 3840, 0, false, DType::kBF16, 0, true},
                        Case{33, 64, 3, false, DType::kBF16, 0, true},
                        Case{40, 1000, 1, false, DType::kBF16, 0, true},
                        Case{60, 3840, 2, false, DType::kF32, 0, true},
                        Case{300, 3840, 2, true, DType::kBF16, 0, false},
                        Case{17, 100, 1, false, DType::kBF16, 0, false}}) {
    const int64_t rows = c.rows, d = c.d, groups = std::max<int64_t>(c.groups, 1);
    SCOPED_TRACE(cat("norm rows ", rows, " d ", d, " groups ", c.groups, c.mixed ? " mixed" : "",
                     " ", dtype_name(c.act), " ppt ", c.ppt));
    cuda::set_row_kernel_tuning({c.ppt, was.prologue_items, was.row_walk});
    cuda::CudaBackend* g = gpu(c.act);
    auto dev = [&](const Shape& sh, uint32_t seed, float lo, float hi) {
      return take(g->upload(rand_host(sh, seed, DType::kF32, lo, hi), c.act), "upload");
    };
    const Tensor x0 = dev({groups, rows / groups, d}, 1, -4.f, 4.f);
    const Tensor y = dev({groups, rows / groups, d}, 2, -30.f, 30.f);
    const Tensor w = dev({d}, 3, 0.5f, 1.5f);
    const Tensor gate = c.groups > 0 ? dev({groups, d}, 4, -1.f, 1.f) : Tensor();
    const Tensor w_next = dev({d}, 5, 0.5f, 2.f);
    const Tensor scale = c.groups > 0 ? dev({c.mixed ? 3 : groups, d}, 6, 0.f, 2.f) : Tensor();
    Tensor xa = copy_of(g, x0), xb = copy_of(g, x0);
    Tensor out = take(g->alloc(c.act, {rows, d}), "alloc");
    Tensor q_ref = take(g->alloc(DType::kF8E4M3, {rows, d}), "alloc");
    Tensor s_ref = take(g->alloc(DType::kF32, {rows}), "alloc");
    ZI_ASSERT_OK(g->residual_norm_gate_then_norm(xa, y, w, eps, gate, w_next, scale, out));
    ZI_ASSERT_OK(g->quantize_fp8_rows(out, q_ref, s_ref));
    Tensor tmp = take(g->alloc(c.act, {rows, d}), "alloc");
    ZI_ASSERT_OK(g->fill(tmp, std::numeric_limits<float>::quiet_NaN()));
    Tensor q = take(g->alloc(DType::kF8E4M3, {rows, d}), "alloc");
    Tensor sc = take(g->alloc(DType::kF32, {rows}), "alloc");
    ZI_ASSERT_OK(
        g->residual_norm_gate_then_norm_fp8(xb, y, w, eps, gate, w_next, scale, tmp, q, sc));
    EXPECT_EQ(bytes_of(g, xa), bytes_of(g, xb));
    EXPECT_EQ(bytes_of(g, q), bytes_of(g, q_ref));
    EXPECT_EQ(bytes_of(g, sc), bytes_of(g, s_ref));
    EXPECT_EQ(untouched(g, tmp), c.fused);
  }
  cuda::set_row_kernel_tuning(was);
  cuda::CudaBackend* g = gpu(DType::kBF16);
  for (const auto& [m, f, fused] : {std::tuple<int64_t, int64_t, bool>{300, 10240, true},
                                    {5, 16384, true},
                                    {7, 64, true},
                                    {9, 20000, false},
                                    {9, 100, false}}) {
    SCOPED_TRACE(cat("swiglu m ", m, " f ", f));
    const Tensor h = rand_dev(g, {m, 2 * f}, 7, -6.f, 6.f);
    Tensor y = take(g->alloc(DType::kBF16, {m, f}), "alloc");
    Tensor q_ref = take(g->alloc(DType::kF8E4M3, {m, f}), "alloc");
    Tensor s_ref = take(g->alloc(DType::kF32, {m}), "alloc");
    ZI_ASSERT_OK(g->swiglu(h, y));
    ZI_ASSERT_OK(g->quantize_fp8_rows(y, q_ref, s_ref));
    // The two kernels (ZIMAGE_FUSED_SWIGLU_FP8=0) and the one-kernel form (the default).
    for (const bool one_kernel : {false, true}) {
      SCOPED_TRACE(one_kernel ? "one kernel" : "two kernels");
      g->set_fused_swiglu_fp8(one_kernel);
      Tensor tmp = take(g->alloc(DType::kBF16, {m, f}), "alloc");
      ZI_ASSERT_OK(g->fill(tmp, std::numeric_limits<float>::quiet_NaN()));
      Tensor q = take(g->alloc(DType::kF8E4M3, {m, f}), "alloc");
      Tensor sc = take(g->alloc(DType::kF32, {m}), "alloc");
      const Status st = g->swiglu_fp8(h, tmp, q, sc);
      g->set_fused_swiglu_fp8(true);  // the default
      ZI_ASSERT_OK(st);
      EXPECT_EQ(bytes_of(g, q), bytes_of(g, q_ref));
      EXPECT_EQ(bytes_of(g, sc), bytes_of(g, s_ref));
      EXPECT_EQ(untouched(g, tmp), one_kernel && fused);
    }
  }
}

// matmul_fp8_quantized on the rows quantize_fp8_rows made is matmul_fp8_rows bit for bit (the
// same GEMM on the same operands), at the DiT's q|k|v and w2 shapes and a ragged one.
TEST(CudaFp8Inputs, QuantizedInputGemmIsMatmulFp8Rows) {
  ZI_REQUIRE_GPU();
  cuda::CudaBackend* g = gpu(DType::kBF16);
  for (const auto& [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{4160, 3 * 3840, 3840},
                                {300, 3840, 10240},
                                {517, 264, 272}}) {
    SCOPED_TRACE(cat("gemm ", m, "x", n, "x", k));
    const Tensor x = rand_dev(g, {m, k}, 8, -3.f, 3.f);
    const Tensor w = rand_dev(g, {n, k}, 9, -0.05f, 0.05f);
    const Tensor bias = rand_dev(g, {n}, 10, -1.f, 1.f);
    Tensor w8 = take(g->alloc(DType::kF8E4M3, {n, k}), "alloc");
    Tensor sw = take(g->alloc(DType::kF32, {n}), "alloc");
    ZI_ASSERT_OK(g->quantize_fp8_rows(w, w8, sw));
    Tensor x8 = take(g->alloc(DType::kF8E4M3, {m, k}), "alloc");
    Tensor sx = take(g->alloc(DType::kF32, {m}), "alloc");
    ZI_ASSERT_OK(g->quantize_fp8_rows(x, x8, sx));
    Tensor ya = take(g->alloc(DType::kBF16, {m, n}), "alloc");
    Tensor yb = take(g->alloc(DType::kBF16, {m, n}), "alloc");
    ZI_ASSERT_OK(g->matmul_fp8_rows(x, w8, sw, bias, ya));
    ZI_ASSERT_OK(g->matmul_fp8_quantized(x8, sx, w8, sw, bias, yb));
    EXPECT_EQ(bytes_of(g, ya), bytes_of(g, yb));
  }
  // A scale that does not match x8's rows is named.
  Tensor x8 = take(g->alloc(DType::kF8E4M3, {4, 32}), "alloc");
  Tensor sx = take(g->alloc(DType::kF32, {3}), "alloc");
  Tensor w8 = take(g->alloc(DType::kF8E4M3, {16, 32}), "alloc");
  Tensor sw = take(g->alloc(DType::kF32, {16}), "alloc");
  Tensor y = take(g->alloc(DType::kBF16, {4, 16}), "alloc");
  const Status bad = g->matmul_fp8_quantized(x8, sx, w8, sw, Tensor(), y);
  EXPECT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("x_scale"), std::string::npos) << bad.to_string();
}
