// The GEMMs with an epilogue of ours (CUTLASS on sm_90, gemm_cutlass.h): the feed-forward's with
// SwiGLU (Backend::matmul_swiglu) and the attention's q|k|v with the per-head norm and RoPE
// (Backend::matmul_qkv_norm_rope). Each against the CPU oracle and against the two-kernel path
// it replaces (cuBLASLt GEMM + the elementwise kernel: the same roundings, another order of
// summation), both schedules, recorded (CUDA graph) against eager, a misaligned operand falling
// back; and a transformer running both (the path that ships) against the same transformer
// unfused and against the CPU. Timed in CudaOpsPerf.MatmulSwiglu / MatmulQkvNormRope
// (test_cuda_perf.cpp). Also the adaLN projection with its modulation fused (a GEMV, not a
// CUTLASS GEMM: CudaFusedAdaln), in the same small transformer.
#include <gtest/gtest.h>

#include <filesystem>
#include <limits>
#include <string>
#include <utility>

#include "backend/cuda/libs/gemm_cutlass.h"
#include "gpu/cuda_test_util.h"
#include "gpu/dit_test_util.h"
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
  return g != nullptr && g->swiglu_block(f, k) > 0;
}

// Both fused GEMMs switched on (they are opt-in) for a test's scope.
struct FusedOn {
  cuda::CudaBackend* g;
  bool swiglu, qkv;
  explicit FusedOn(cuda::CudaBackend* be)
      : g(be), swiglu(be && be->fused_swiglu()), qkv(be && be->fused_qkv()) {
    if (g) g->set_fused_swiglu(true), g->set_fused_qkv(true);
  }
  ~FusedOn() {
    if (g) g->set_fused_swiglu(swiglu), g->set_fused_qkv(qkv);
  }
};

// Runs `f` with the backend's SwiGLU / q|k|v GEMMs tuned as `t`, then the defaults again.
template <typename F>
auto with_tuning(cuda::CudaBackend* g, cuda::GemmSchedule schedule, F&& f) {
  const cuda::GemmTuning sw = g->swiglu_tuning(), qkv = g->qkv_tuning();
  g->set_swiglu_tuning({schedule, sw.raster, sw.swizzle});
  g->set_qkv_tuning({schedule, qkv.raster, qkv.swizzle});
  auto r = f();
  g->set_swiglu_tuning(sw);
  g->set_qkv_tuning(qkv);
  return r;
}

#define ZI_REQUIRE_FUSED_GEMMS(g)                                                 \
  FusedOn fused_on_(g);                                                           \
  do {                                                                            \
    ZI_REQUIRE_GPU();                                                             \
    if (!fused_here(g, 256, 64))                                                  \
      GTEST_SKIP() << "no fused GEMMs here (need sm_90 and the CUTLASS kernels)"; \
  } while (0)

struct Case {
  int64_t m, f, k;
};

constexpr std::pair<cuda::GemmSchedule, const char*> kSchedules[] = {
    {cuda::GemmSchedule::kCooperative, "cooperative"},
    {cuda::GemmSchedule::kCooperativeTall, "cooperative tall"},
    {cuda::GemmSchedule::kPingpong, "ping-pong"},
    {cuda::GemmSchedule::kPingpongNarrow, "ping-pong narrow"}};
// The SwiGLU GEMM's: the four above and the 256 × 192 tile on 8-row blocks (SwiGLU only).
constexpr std::pair<cuda::GemmSchedule, const char*> kSwigluSchedules[] = {
    {cuda::GemmSchedule::kCooperative, "cooperative"},
    {cuda::GemmSchedule::kCooperativeTall, "cooperative tall"},
    {cuda::GemmSchedule::kPingpong, "ping-pong"},
    {cuda::GemmSchedule::kPingpongNarrow, "ping-pong narrow"},
    {cuda::GemmSchedule::kCooperative256x192, "cooperative 256x192"}};

// The CUTLASS SwiGLU kernel itself (no fallback behind it) on x [m, k] and w13 already in the
// row blocks `tuning`'s schedule takes, into y [m, f], with a workspace of its own.
Status swiglu_kernel(cuda::CudaBackend* g, const Tensor& x, const Tensor& w13, Tensor& y,
                     const cuda::GemmTuning& tuning) {
  const int64_t k = x.dim(-1), m = x.numel() / k, f = y.dim(-1);
  const size_t ws_bytes = cuda::cutlass_bf16_swiglu_workspace(m, f, k);
  Tensor ws;
  if (ws_bytes > 0) {
    auto a = g->alloc(DType::kU8, {static_cast<int64_t>(ws_bytes)});
    if (!a.ok()) return a.status();
    ws = std::move(*a);
  }
  return cuda::cutlass_bf16_swiglu(x.data(), w13.data(), y.data(), m, f, k,
                                   ws_bytes ? ws.data() : nullptr, ws_bytes, g->stream(), tuning);
}

// y for `x` and the gate-first `w13` on the GPU: the two kernels (block 0) or the fused op on the
// weight put in blocks. Fused, the CUTLASS kernel is also called directly (unless `fallback`, a
// case the kernel must decline): it must take the case and write the op's bytes, so that a
// kernel declining behind the op's quiet fallback to the two kernels fails here.
std::vector<float> run_gpu(cuda::CudaBackend* g, const Tensor& x, const Tensor& w13_host,
                           bool fused, const Tensor& x_view = Tensor(), bool fallback = false) {
  const Tensor& in = x_view.defined() ? x_view : x;
  const int64_t f = w13_host.dim(0) / 2, m = in.numel() / in.dim(-1);
  LinearWeight lw;
  lw.w = take(g->upload(w13_host, DType::kBF16), "upload w13");
  if (fused) {
    const Status s = set_swiglu_block(*g, lw, g->swiglu_block(f, w13_host.dim(1)));
    EXPECT_TRUE(s.ok()) << s.to_string();
  }
  Tensor y = take(g->alloc(DType::kBF16, {m, f}), "alloc y");
  EXPECT_TRUE(g->fill(y, std::numeric_limits<float>::quiet_NaN()).ok());
  const Status s = g->matmul_swiglu(in, lw.w, lw.swiglu_block, y);
  EXPECT_TRUE(s.ok()) << s.to_string();
  std::vector<float> out = fetch(*g, y);
  if (fused && !fallback) {
    Tensor direct = take(g->alloc(DType::kBF16, {m, f}), "alloc direct");
    EXPECT_TRUE(g->fill(direct, std::numeric_limits<float>::quiet_NaN()).ok());
    const Status d = swiglu_kernel(g, in, lw.w, direct, g->swiglu_tuning());
    EXPECT_TRUE(d.ok()) << "the fused kernel declined: " << d.to_string();
    EXPECT_EQ(fetch(*g, direct), out) << "the op's bytes are not the fused kernel's";
  }
  return out;
}

TEST(CudaFusedGemm, SwigluFusedAgainstOracleAndTwoKernels) {
  cuda::CudaBackend* g = gpu(DType::kBF16);
  ZI_REQUIRE_FUSED_GEMMS(g);
  // Rows past a tile (M % 128, M % 64, M % 256), one tile of F, several, K of one and many
  // 64-deep steps, the DiT's K; the DiT's F last (2F 20480: the 256 × 192 tile's last column
  // tile is 128 wide, as at 1024² and 2048²).
  const Case cases[] = {{1, 128, 64},     {37, 256, 136},     {130, 384, 512},
                        {200, 512, 3840}, {4160, 1280, 3840}, {70, 10240, 3840}};
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
    expect_close(tag + " two kernels vs CPU", DType::kBF16, two, ref);
    // Every tile configuration (row blocks of 128, 64 and 8) against the oracle and against the
    // two kernels: the same roundings, only the GEMMs' order of summation may differ, so at
    // most a few bf16 roundings flip.
    for (auto [schedule, name] : kSwigluSchedules) {
      const std::vector<float> y =
          with_tuning(g, schedule, [&] { return run_gpu(g, x, wh, true); });
      expect_close(tag + " fused (" + name + ") vs CPU", DType::kBF16, y, ref);
      expect_close(tag + " fused (" + name + ") vs two kernels", DType::kBF16, y, two, 4e-3);
    }
  }
}

TEST(CudaFusedGemm, SwigluRecordedEqualsEagerAndMisalignedFallsBack) {
  cuda::CudaBackend* g = gpu(DType::kBF16);
  ZI_REQUIRE_FUSED_GEMMS(g);
  const int64_t m = 300, f = 512, k = 768;
  const Tensor xh = rand_host({m + 1, k}, 900, DType::kBF16);
  const Tensor wh = rand_host({2 * f, k}, 901, DType::kBF16, -0.06f, 0.06f);
  Tensor x = take(g->upload(xh, DType::kBF16), "upload x");
  Tensor xa = x.slice0(0, m);
  LinearWeight lw;
  lw.w = take(g->upload(wh, DType::kBF16), "upload w13");
  ZI_ASSERT_OK(set_swiglu_block(*g, lw, g->swiglu_block(f, k)));
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
  expect_close("matmul_swiglu misaligned x (fallback)", DType::kBF16,
               run_gpu(g, x, wsh, true, xm, /*fallback=*/true), ref);
}

// The backend's SwiGLU and q|k|v tunings, restored when the scope ends (a failed ASSERT included).
struct TuningsRestored {
  cuda::CudaBackend* g;
  cuda::GemmTuning swiglu, qkv;
  explicit TuningsRestored(cuda::CudaBackend* be)
      : g(be), swiglu(be->swiglu_tuning()), qkv(be->qkv_tuning()) {}
  ~TuningsRestored() {
    g->set_swiglu_tuning(swiglu);
    g->set_qkv_tuning(qkv);
  }
};

// The 256 × 192 tile (ZIMAGE_SWIGLU_GEMM=coop-256x192) is what runs, not a fallback behind the
// op: the kernel called directly accepts the DiT's F and a partial row tile and writes the op's
// bytes; recorded = replayed = eager.
TEST(CudaFusedGemm, Swiglu256x192TileRunsAndRecordedEqualsEager) {
  cuda::CudaBackend* g = gpu(DType::kBF16);
  ZI_REQUIRE_FUSED_GEMMS(g);
  const TuningsRestored restore(g);
  const int64_t m = 300, f = 10240, k = 3840;
  const cuda::GemmTuning before = g->swiglu_tuning();
  const cuda::GemmTuning wide{cuda::GemmSchedule::kCooperative256x192, before.raster,
                              before.swizzle};
  g->set_swiglu_tuning(wide);
  ASSERT_EQ(g->swiglu_block(f, k), 8);
  const Tensor xh = rand_host({m, k}, 910, DType::kBF16, -2.f, 2.f);
  const Tensor wh = rand_host({2 * f, k}, 911, DType::kBF16, -0.05f, 0.05f);
  Tensor x = take(g->upload(xh, DType::kBF16), "upload x");
  LinearWeight lw;
  lw.w = take(g->upload(wh, DType::kBF16), "upload w13");
  ZI_ASSERT_OK(set_swiglu_block(*g, lw, 8));
  Tensor eager = take(g->alloc(DType::kBF16, {m, f}), "alloc");
  Tensor direct = take(g->alloc(DType::kBF16, {m, f}), "alloc");
  Tensor rec = take(g->alloc(DType::kBF16, {m, f}), "alloc");
  ZI_ASSERT_OK(g->fill(eager, std::numeric_limits<float>::quiet_NaN()));
  ZI_ASSERT_OK(g->matmul_swiglu(x, lw.w, lw.swiglu_block, eager));
  ZI_ASSERT_OK(g->fill(direct, std::numeric_limits<float>::quiet_NaN()));
  ZI_ASSERT_OK(swiglu_kernel(g, x, lw.w, direct, wide));
  EXPECT_EQ(fetch(*g, direct), fetch(*g, eager)) << "the op did not run the 256 x 192 kernel";
  ZI_ASSERT_OK(g->fill(rec, std::numeric_limits<float>::quiet_NaN()));
  auto work = g->record([&] { return g->matmul_swiglu(x, lw.w, lw.swiglu_block, rec); });
  ASSERT_TRUE(work.ok()) << work.status().to_string();
  ZI_ASSERT_OK(g->fill(rec, std::numeric_limits<float>::quiet_NaN()));
  ZI_ASSERT_OK((*work)->replay());
  EXPECT_EQ(fetch(*g, rec), fetch(*g, eager)) << "the replayed graph wrote other values";
  // Against the two kernels on the weight in the files' order.
  g->set_swiglu_tuning(before);
  expect_close("coop-256x192 300x10240x3840 vs two kernels", DType::kBF16, fetch(*g, eager),
               run_gpu(g, x, wh, false), 4e-3);
}

// CUTLASS's persistent scheduler rounds the column tiles up to a multiple of its swizzle times
// the cluster's width and hands out the extra tiles; the register epilogues must skip them. Each
// output lies at the start of a larger buffer filled with a sentinel, and every case's tile count
// is not such a multiple: the kernels, called directly (no fallback can hide them), write the
// default order's bytes (the order does not change a tile's sums) and not one element past them.
// Before the guard, a SwiGLU tile past F wrote into the next row and past the end, and a q|k|v head
// past v wrote past v's end.
TEST(CudaFusedGemm, TilesPastTheColumnsWriteNothing) {
  cuda::CudaBackend* g = gpu(DType::kBF16);
  ZI_REQUIRE_FUSED_GEMMS(g);
  constexpr float kSentinel = 7.f;
  constexpr int64_t kGuard = 1 << 16;  // elements after each output
  auto guarded = [&](int64_t elems) {
    Tensor buf = take(g->alloc(DType::kBF16, {elems + kGuard}), "guarded buffer");
    EXPECT_TRUE(g->fill(buf, kSentinel).ok());
    return buf;
  };
  auto guard_intact = [&](const Tensor& buf, int64_t elems, const std::string& what) {
    const std::vector<float> all = fetch(*g, buf);
    int64_t changed = 0;
    for (int64_t i = elems; i < elems + kGuard; ++i) changed += all[i] != kSentinel;
    EXPECT_EQ(changed, 0) << what << ": elements past the output were written";
  };
  struct SwigluCase {
    cuda::GemmSchedule schedule;
    int64_t m, f;
    int swizzle;
  };
  // 128 × 256: 3 column tiles, swizzle 4 -> 4. 256 × 192 (1 × 2 clusters): 1 tile -> 2 at
  // swizzle 1; 13 tiles -> 16 at swizzle 2 (4 row tiles, so the scheduler keeps the swizzle).
  const SwigluCase cases[] = {{cuda::GemmSchedule::kCooperative, 520, 384, 4},
                              {cuda::GemmSchedule::kCooperative256x192, 70, 96, 1},
                              {cuda::GemmSchedule::kCooperative256x192, 800, 1184, 2}};
  uint32_t seed = 950;
  for (const SwigluCase& c : cases) {
    const int64_t k = 256;
    const std::string tag = cat("swiglu ", c.m, "x", c.f, " swizzle ", c.swizzle);
    const Tensor xh = rand_host({c.m, k}, seed++, DType::kBF16, -2.f, 2.f);
    const Tensor wh = rand_host({2 * c.f, k}, seed++, DType::kBF16, -0.06f, 0.06f);
    Tensor x = take(g->upload(xh, DType::kBF16), "upload x");
    LinearWeight lw;
    lw.w = take(g->upload(wh, DType::kBF16), "upload w13");
    ZI_ASSERT_OK(set_swiglu_block(*g, lw, cuda::gemm_swiglu_block(c.schedule)));
    auto swiglu_into = [&](Tensor& y, cuda::GemmRaster raster, int swizzle) {
      return swiglu_kernel(g, x, lw.w, y, {c.schedule, raster, swizzle});
    };
    Tensor ref = take(g->alloc(DType::kBF16, {c.m, c.f}), "ref");
    ZI_ASSERT_OK(swiglu_into(ref, cuda::GemmRaster::kHeuristic, 1));
    Tensor buf = guarded(c.m * c.f);
    Tensor y(buf.storage(), buf.byte_offset(), DType::kBF16, {c.m, c.f});
    ZI_ASSERT_OK(swiglu_into(y, cuda::GemmRaster::kAlongN, c.swizzle));
    EXPECT_EQ(fetch(*g, y), fetch(*g, ref)) << tag << ": another order changed the sums";
    guard_intact(buf, c.m * c.f, tag);
  }
  // q|k|v: 3 + 2 × 1 heads of 128 (5 column tiles), 512 rows (4 row tiles), swizzle 4 -> 8.
  const int64_t m = 512, k = 256, hq = 3, hkv = 1, dh = 128;
  const Tensor xh = rand_host({m, k}, seed++, DType::kBF16, -2.f, 2.f);
  const Tensor wh = rand_host({(hq + 2 * hkv) * dh, k}, seed++, DType::kBF16, -0.06f, 0.06f);
  const Tensor nq = rand_host({dh}, seed++, DType::kBF16, 0.5f, 1.5f);
  const Tensor nk = rand_host({dh}, seed++, DType::kBF16, 0.5f, 1.5f);
  const Tensor fh = rand_host({1, m, dh / 2, 2}, seed++, DType::kF32);
  Tensor x = take(g->upload(xh, DType::kBF16), "x"), w = take(g->upload(wh, DType::kBF16), "w");
  Tensor wq = take(g->upload(nq, DType::kBF16), "nq"), wk = take(g->upload(nk, DType::kBF16), "nk");
  Tensor fr = take(g->upload(fh, DType::kF32), "freqs");
  const int64_t nqe = m * hq * dh, nke = m * hkv * dh;
  const size_t qws_bytes = cuda::cutlass_bf16_qkv_norm_rope_workspace(m, (hq + 2 * hkv) * dh, k);
  Tensor qws;
  if (qws_bytes > 0) qws = take(g->alloc(DType::kU8, {static_cast<int64_t>(qws_bytes)}), "ws");
  auto qkv_into = [&](Tensor& q, Tensor& kk, Tensor& v, const cuda::GemmTuning& t) {
    cuda::QkvPrologue p;
    p.q = q.data(), p.k = kk.data(), p.v = v.data();
    p.norm_q = wq.data(), p.norm_k = wk.data();
    p.freqs = static_cast<const float*>(fr.data());
    p.hq = static_cast<int>(hq), p.hkv = static_cast<int>(hkv), p.eps = 1e-6f;
    return cuda::cutlass_bf16_qkv_norm_rope(
        x.data(), w.data(), p, m, k, qws_bytes ? qws.data() : nullptr, qws_bytes, g->stream(), t);
  };
  for (const auto& [schedule, name] : kSchedules) {
    const std::string tag = cat("q|k|v ", name, " swizzle 4");
    Tensor q0 = take(g->alloc(DType::kBF16, {1, m, hq, dh}), "q0");
    Tensor k0 = take(g->alloc(DType::kBF16, {1, m, hkv, dh}), "k0");
    Tensor v0 = take(g->alloc(DType::kBF16, {1, m, hkv, dh}), "v0");
    ZI_ASSERT_OK(qkv_into(q0, k0, v0, {schedule, cuda::GemmRaster::kHeuristic, 1}));
    Tensor qb = guarded(nqe), kb = guarded(nke), vb = guarded(nke);
    Tensor q(qb.storage(), qb.byte_offset(), DType::kBF16, {1, m, hq, dh});
    Tensor kk(kb.storage(), kb.byte_offset(), DType::kBF16, {1, m, hkv, dh});
    Tensor v(vb.storage(), vb.byte_offset(), DType::kBF16, {1, m, hkv, dh});
    ZI_ASSERT_OK(qkv_into(q, kk, v, {schedule, cuda::GemmRaster::kAlongN, 4}));
    EXPECT_EQ(fetch(*g, q), fetch(*g, q0)) << tag << ": q";
    EXPECT_EQ(fetch(*g, kk), fetch(*g, k0)) << tag << ": k";
    EXPECT_EQ(fetch(*g, v), fetch(*g, v0)) << tag << ": v";
    guard_intact(qb, nqe, tag + ", q");
    guard_intact(kb, nke, tag + ", k");
    guard_intact(vb, nke, tag + ", v");
  }
}

// q, k, v of the q|k|v linear and prologue for x on the GPU, fused or as the two ops.
struct Qkv {
  std::vector<float> q, k, v;
};
Qkv run_qkv(cuda::CudaBackend* g, Backend& be, const Tensor& xh, const Tensor& wh, int64_t b,
            int64_t s, int64_t hq, int64_t hkv, bool norm, bool rope, bool shared, bool fused) {
  const int64_t dh = 128;
  const Tensor nq = rand_host({dh}, 801, DType::kBF16, 0.5f, 1.5f);
  const Tensor nk = rand_host({dh}, 802, DType::kBF16, 0.5f, 1.5f);
  const Tensor fh = rand_host({shared ? 1 : b, s, dh / 2, 2}, 803, DType::kF32);
  const DType dt = be.act_dtype();
  auto up = [&](const Tensor& h, DType d) { return take(be.upload(h, d), "upload"); };
  Tensor x = up(xh, dt), w = up(wh, dt);
  Tensor q = take(be.alloc(dt, {b, s, hq, dh}), "q"), k = take(be.alloc(dt, {b, s, hkv, dh}), "k");
  Tensor v = take(be.alloc(dt, {b, s, hkv, dh}), "v");
  for (Tensor* t : {&q, &k, &v})
    EXPECT_TRUE(be.fill(*t, std::numeric_limits<float>::quiet_NaN()).ok());
  Tensor qkv;  // taken from the backend where the op is not fused
  if (g != nullptr) g->set_fused_qkv(fused);
  const Status st =
      be.matmul_qkv_norm_rope(x, w, norm ? up(nq, dt) : Tensor(), norm ? up(nk, dt) : Tensor(),
                              1e-6f, rope ? up(fh, DType::kF32) : Tensor(), qkv, q, k, v);
  if (g != nullptr) g->set_fused_qkv(true);
  EXPECT_TRUE(st.ok()) << st.to_string();
  return {fetch(be, q), fetch(be, k), fetch(be, v)};
}

TEST(CudaFusedGemm, QkvNormRopeAgainstOracleAndTwoKernels) {
  cuda::CudaBackend* g = gpu(DType::kBF16);
  ZI_REQUIRE_FUSED_GEMMS(g);
  struct QCase {
    int64_t b, s, hq, hkv, k;
    bool norm, rope, shared;
  };
  // A partial row tile, grouped k/v heads, freqs shared by a batch of two, no norm, no RoPE,
  // the DiT's heads and K.
  const QCase cases[] = {{1, 37, 2, 2, 64, true, true, false},
                         {2, 70, 3, 1, 256, true, true, true},
                         {1, 200, 2, 2, 136, false, true, false},
                         {1, 130, 1, 2, 128, true, false, false},
                         {1, 1040, 30, 30, 3840, true, true, false}};
  uint32_t seed = 820;
  for (const QCase& c : cases) {
    const int64_t rows = c.b * c.s, n = (c.hq + 2 * c.hkv) * 128;
    const Tensor xh = rand_host({rows, c.k}, seed++, DType::kBF16, -2.f, 2.f);
    const Tensor wh = rand_host({n, c.k}, seed++, DType::kBF16, -0.06f, 0.06f);
    const std::string tag =
        cat("matmul_qkv_norm_rope b", c.b, " s", c.s, " heads ", c.hq, "+2x", c.hkv, " k", c.k,
            c.norm ? " norm" : "", c.rope ? " rope" : "", c.shared ? " shared" : "");
    const Qkv ref = run_qkv(nullptr, cpu_oracle(), xh, wh, c.b, c.s, c.hq, c.hkv, c.norm, c.rope,
                            c.shared, false);
    const Qkv two = run_qkv(g, *g, xh, wh, c.b, c.s, c.hq, c.hkv, c.norm, c.rope, c.shared, false);
    const std::pair<const char*, std::vector<float> Qkv::*> parts[] = {
        {" q", &Qkv::q}, {" k", &Qkv::k}, {" v", &Qkv::v}};
    for (const auto& [part_name, part] : parts)
      expect_close(tag + part_name + " two kernels vs CPU", DType::kBF16, two.*part, ref.*part);
    for (auto [schedule, name] : kSchedules) {
      const Qkv y = with_tuning(g, schedule, [&] {
        return run_qkv(g, *g, xh, wh, c.b, c.s, c.hq, c.hkv, c.norm, c.rope, c.shared, true);
      });
      for (const auto& [part_name, part] : parts) {
        expect_close(tag + part_name + " fused (" + name + ") vs CPU", DType::kBF16, y.*part,
                     ref.*part);
        expect_close(tag + part_name + " fused (" + name + ") vs two kernels", DType::kBF16,
                     y.*part, two.*part, 4e-3);
      }
    }
  }
}

TEST(CudaFusedGemm, QkvRecordedEqualsEager) {
  cuda::CudaBackend* g = gpu(DType::kBF16);
  ZI_REQUIRE_FUSED_GEMMS(g);
  const int64_t s = 300, h = 2, kd = 256, dh = 128;
  Tensor x = take(g->upload(rand_host({s, kd}, 850, DType::kBF16), DType::kBF16), "x");
  Tensor w = take(
      g->upload(rand_host({3 * h * dh, kd}, 851, DType::kBF16, -0.06f, 0.06f), DType::kBF16), "w");
  Tensor nq = take(g->upload(rand_host({dh}, 852, DType::kBF16), DType::kBF16), "nq");
  Tensor nk = take(g->upload(rand_host({dh}, 853, DType::kBF16), DType::kBF16), "nk");
  Tensor f = take(g->upload(rand_host({1, s, dh / 2, 2}, 854, DType::kF32), DType::kF32), "f");
  auto outs = [&] {
    std::vector<Tensor> o;
    for (int i = 0; i < 3; ++i) o.push_back(take(g->alloc(DType::kBF16, {1, s, h, dh}), "o"));
    return o;
  };
  std::vector<Tensor> e = outs(), r = outs();
  Tensor none;
  ZI_ASSERT_OK(g->matmul_qkv_norm_rope(x, w, nq, nk, 1e-6f, f, none, e[0], e[1], e[2]));
  auto work = g->record(
      [&] { return g->matmul_qkv_norm_rope(x, w, nq, nk, 1e-6f, f, none, r[0], r[1], r[2]); });
  ASSERT_TRUE(work.ok()) << work.status().to_string();
  for (Tensor& t : r) ZI_ASSERT_OK(g->fill(t, std::numeric_limits<float>::quiet_NaN()));
  ZI_ASSERT_OK((*work)->replay());
  for (int i = 0; i < 3; ++i) EXPECT_EQ(fetch(*g, r[i]), fetch(*g, e[i])) << "output " << i;
}

void transformer_against_unfused_and_cpu(cuda::CudaBackend* g);

// Once with the default SwiGLU tile (row blocks of 128) and once with the 256 × 192 tile (blocks
// of 8): the tuning at load decides the blocks the weights are put in.
TEST(CudaFusedGemm, TransformerAgainstUnfusedAndCpu) {
  cuda::CudaBackend* g = gpu(DType::kBF16);
  ZI_REQUIRE_FUSED_GEMMS(g);
  const cuda::GemmTuning before = g->swiglu_tuning();
  for (const cuda::GemmSchedule schedule :
       {cuda::GemmSchedule::kCooperative, cuda::GemmSchedule::kCooperative256x192}) {
    SCOPED_TRACE(schedule == cuda::GemmSchedule::kCooperative ? "cooperative" : "wide");
    g->set_swiglu_tuning({schedule, before.raster, before.swizzle});
    transformer_against_unfused_and_cpu(g);
  }
  g->set_swiglu_tuning(before);
}

void transformer_against_unfused_and_cpu(cuda::CudaBackend* g) {
  TransformerConfig cfg;
  const std::string dir = write_wide_dit(cfg, "zimage_swiglu_dit");
  ASSERT_GT(g->swiglu_block(cfg.ffn_hidden(), cfg.dim), 0);
  auto ws = WeightStore::open(dir);
  ASSERT_TRUE(ws.ok()) << ws.status().to_string();
  const Tensor lat = rand_host({1, 16, 32, 32}, 31, DType::kBF16);
  const Tensor cap = rand_host({20, cfg.cap_feat_dim}, 32, DType::kBF16);

  auto fused = ZImageDiT::load(cfg, *ws, *g);
  ASSERT_TRUE(fused.ok()) << fused.status().to_string();
  g->set_fused_swiglu(false);
  auto plain = ZImageDiT::load(cfg, *ws, *g);
  g->set_fused_swiglu(true);
  // The unfused transformer runs the q|k|v GEMM and the prologue as two kernels too.
  auto run_plain = [&] {
    g->set_fused_qkv(false);
    Tensor t = forward(**plain, *g, lat, cap);
    g->set_fused_qkv(true);
    return t;
  };
  ASSERT_TRUE(plain.ok()) << plain.status().to_string();
  auto cpu_dit = ZImageDiT::load(cfg, *ws, cpu_oracle());
  ASSERT_TRUE(cpu_dit.ok()) << cpu_dit.status().to_string();

  // The fused model runs the fused op in every block (2 layers, 2 refiners), eagerly here.
  std::map<std::string, int64_t> calls;
  const Tensor eager = profiled_forward(**fused, *g, lat, cap, calls);
  EXPECT_EQ(calls["matmul_swiglu"], 4) << "feed-forwards that ran fused";
  EXPECT_EQ(calls["matmul_qkv_norm_rope"], 4) << "attention prologues that ran fused";
  const Tensor recorded = forward(**fused, *g, lat, cap);
  const Tensor replayed = forward(**fused, *g, lat, cap);
  (*plain)->set_use_graphs(false);
  const Tensor unfused = run_plain();
  const Tensor ref = forward(**cpu_dit, cpu_oracle(), lat, cap);
  ASSERT_TRUE(eager.defined() && recorded.defined() && replayed.defined() && unfused.defined() &&
              ref.defined());
  EXPECT_EQ(values(recorded), values(eager)) << "recorded forward differs from eager";
  EXPECT_EQ(values(replayed), values(eager)) << "replayed forward differs from eager";
  expect_close("transformer, fused GEMMs vs CPU", DType::kBF16, values(eager), values(ref), 3e-2);
  expect_close("transformer, unfused vs CPU", DType::kBF16, values(unfused), values(ref), 3e-2);
  expect_close("transformer, fused vs unfused", DType::kBF16, values(eager), values(unfused), 2e-2);
  fused->reset();
  plain->reset();
  std::filesystem::remove_all(dir);
}

// The fused adaLN projection + modulation in a transformer, block by block (ZIMAGE_FUSED_ADALN,
// with ZIMAGE_ADALN_LAYERS=0) and for every block in one kernel (the default): each modulated
// block takes it, recorded equals eager, the output stays with the two-op model and the CPU, and
// the one-kernel form gives the block-by-block kernel's bits (the same sums per block).
TEST(CudaFusedAdaln, TransformerAgainstTwoOpsAndCpu) {
  ZI_REQUIRE_GPU();
  cuda::CudaBackend* g = gpu(DType::kBF16);
  TransformerConfig cfg;
  const std::string dir = write_wide_dit(cfg, "zimage_swiglu_dit");
  auto ws = WeightStore::open(dir);
  ASSERT_TRUE(ws.ok()) << ws.status().to_string();
  const Tensor lat = rand_host({1, 16, 32, 32}, 41, DType::kBF16);
  const Tensor cap = rand_host({20, cfg.cap_feat_dim}, 42, DType::kBF16);
  auto dit = ZImageDiT::load(cfg, *ws, *g);
  ASSERT_TRUE(dit.ok()) << dit.status().to_string();
  auto cpu_dit = ZImageDiT::load(cfg, *ws, cpu_oracle());
  ASSERT_TRUE(cpu_dit.ok()) << cpu_dit.status().to_string();
  const bool was = g->fused_adaln(), was_layers = g->adaln_layers();

  g->set_adaln_layers(false);
  (*dit)->set_use_graphs(false);
  const Tensor two_ops = forward(**dit, *g, lat, cap);
  g->set_fused_adaln(true);
  Tensor eager;
  auto calls = calls_by_op(*g, [&] { eager = forward(**dit, *g, lat, cap); });
  EXPECT_EQ(calls["matmul_dit_modulation"], cfg.n_layers + cfg.n_refiner_layers)
      << "modulated blocks that ran fused";
  (*dit)->set_use_graphs(true);
  const Tensor recorded = forward(**dit, *g, lat, cap);
  const Tensor replayed = forward(**dit, *g, lat, cap);
  g->set_fused_adaln(was);

  // Every block's modulation in one kernel (the default).
  g->set_adaln_layers(true);
  (*dit)->set_use_graphs(false);
  Tensor layers_eager;
  calls = calls_by_op(*g, [&] { layers_eager = forward(**dit, *g, lat, cap); });
  EXPECT_EQ(calls["dit_modulation_layers"], 1) << "one launch for every modulated block";
  EXPECT_EQ(calls["matmul_dit_modulation"] + calls["dit_modulation"], 0)
      << "no block made its own modulation";
  (*dit)->set_use_graphs(true);
  const Tensor layers_recorded = forward(**dit, *g, lat, cap);
  const Tensor layers_replayed = forward(**dit, *g, lat, cap);
  g->set_adaln_layers(was_layers);

  const Tensor ref = forward(**cpu_dit, cpu_oracle(), lat, cap);
  ASSERT_TRUE(two_ops.defined() && eager.defined() && recorded.defined() && replayed.defined() &&
              ref.defined() && layers_eager.defined() && layers_recorded.defined() &&
              layers_replayed.defined());
  EXPECT_EQ(values(recorded), values(eager)) << "recorded forward differs from eager";
  EXPECT_EQ(values(replayed), values(eager)) << "replayed forward differs from eager";
  expect_close("transformer, fused adaLN vs CPU", DType::kBF16, values(eager), values(ref), 3e-2);
  expect_close("transformer, fused adaLN vs two ops", DType::kBF16, values(eager), values(two_ops),
               2e-2);
  EXPECT_EQ(values(layers_eager), values(eager)) << "one kernel differs from block by block";
  EXPECT_EQ(values(layers_recorded), values(layers_eager)) << "recorded (one kernel) vs eager";
  EXPECT_EQ(values(layers_replayed), values(layers_eager)) << "replayed (one kernel) vs eager";
  dit->reset();
  std::filesystem::remove_all(dir);
}

}  // namespace
