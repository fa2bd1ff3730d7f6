// CPU matmul against a double-precision reference: y = x · wᵀ + b over odd shapes, rank-3
// activations, with and without bias, and the validation errors the op must return.
#include <algorithm>
#include <cstring>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "model/common/linear.h"
#include "test_cpu_util.h"

namespace zimage::test {
namespace {

std::vector<double> ref_matmul(const Tensor& x, const Tensor& w, const Tensor* b) {
  const int64_t k = w.dim(1), n = w.dim(0), m = x.numel() / k;
  std::vector<double> y(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double s = 0.0;
      for (int64_t l = 0; l < k; ++l) s += at(x, i * k + l) * at(w, j * k + l);
      if (b) s += at(*b, j);
      y[static_cast<size_t>(i * n + j)] = s;
    }
  }
  return y;
}

TEST(CpuOps, MatmulOddShapesWithAndWithoutBias) {
  const int64_t shapes[][3] = {{1, 1, 1},     {3, 5, 4},    {17, 33, 100},
                               {100, 17, 33}, {33, 100, 3}, {64, 96, 32}};
  uint32_t seed = 1;
  for (const auto& s : shapes) {
    const int64_t m = s[0], n = s[1], k = s[2];
    Tensor x = rand_f32({m, k}, seed++);
    Tensor w = rand_f32({n, k}, seed++);
    Tensor b = rand_f32({n}, seed++);
    Tensor y = f32({m, n});
    const std::string tag =
        "matmul " + std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k);
    ASSERT_TRUE(cpu().matmul(x, w, Tensor(), y).ok());
    expect_close(tag, y, ref_matmul(x, w, nullptr), 1e-5, 1e-5);
    ASSERT_TRUE(cpu().matmul(x, w, b, y).ok());
    expect_close(tag + " +bias", y, ref_matmul(x, w, &b), 1e-5, 1e-5);
  }
}

TEST(CpuOps, MatmulRank3Activations) {
  Tensor x = rand_f32({2, 7, 48}, 11);
  Tensor w = rand_f32({80, 48}, 12);
  Tensor b = rand_f32({80}, 13);
  Tensor y = f32({2, 7, 80});
  ASSERT_TRUE(cpu().matmul(x, w, b, y).ok());
  expect_close("matmul [2,7,48] x [80,48]", y, ref_matmul(x, w, &b), 1e-5, 1e-5);
}

TEST(CpuOps, MatmulErrors) {
  Tensor x = rand_f32({3, 5}, 1), w = rand_f32({4, 6}, 2), y = f32({3, 4});
  Status s = cpu().matmul(x, w, Tensor(), y);
  expect_invalid(s, "K differs (5 vs 6)");
  EXPECT_NE(s.message().find("x f32[3, 5] and w f32[4, 6]"), std::string::npos) << s.message();

  Tensor w5 = rand_f32({4, 5}, 3);
  Tensor bad_y = f32({3, 5});
  expect_invalid(cpu().matmul(x, w5, Tensor(), bad_y), "y f32[3, 5] must be [3, 4]");
  Tensor bad_b = rand_f32({5}, 4);
  expect_invalid(cpu().matmul(x, w5, bad_b, y), "bias f32[5] must be [4]");
  Tensor xb = Tensor::host(DType::kBF16, {3, 5});
  expect_invalid(cpu().matmul(xb, w5, Tensor(), y), "x bf16[3, 5]: dtype must be f32");
  expect_invalid(cpu().matmul(Tensor(), w5, Tensor(), y), "x is undefined");
  // y aliasing x is refused (the BLAS would read overwritten input).
  Tensor sq = rand_f32({4, 4}, 5), w4 = rand_f32({4, 4}, 6);
  expect_invalid(cpu().matmul(sq, w4, Tensor(), sq), "overlaps x");
  Tensor w3 = rand_f32({2, 2, 5}, 7);
  expect_invalid(cpu().matmul(x, w3, Tensor(), y), "must have rank 2");
  // A tensor claiming more bytes than its storage holds.
  float small[4] = {1, 2, 3, 4};
  Tensor liar(Tensor::wrap(small, DType::kF32, {4}).storage(), 0, DType::kF32, {3, 5});
  expect_invalid(cpu().matmul(liar, w5, Tensor(), y), "exceeds its storage");
}

TEST(CpuOps, MatmulEmptyK) {
  Tensor x = f32({3, 0}), w = f32({4, 0}), b = rand_f32({4}, 9), y = rand_f32({3, 4}, 10);
  ASSERT_TRUE(cpu().matmul(x, w, b, y).ok());
  for (int64_t i = 0; i < 12; ++i) EXPECT_EQ(at(y, i), at(b, i % 4));
}

// silu(x · w1ᵀ) * (x · w3ᵀ) in double, w13 [2F, K] with gate rows first.
std::vector<double> ref_swiglu(const Tensor& x, const Tensor& w13) {
  const int64_t k = w13.dim(1), f = w13.dim(0) / 2, m = x.numel() / k;
  const std::vector<double> h = ref_matmul(x, w13, nullptr);  // [M, 2F]
  std::vector<double> y(static_cast<size_t>(m * f));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < f; ++j) {
      const double g = h[i * 2 * f + j], u = h[i * 2 * f + f + j];
      y[i * f + j] = g / (1.0 + std::exp(-g)) * u;
    }
  return y;
}

// The fused feed-forward op's contract, on the oracle (Backend's GEMM + swiglu): gate rows first
// and every row block that divides F, after set_swiglu_block reordered the weight, which also
// puts every row where the block layout says and restores the files' order bit for bit.
TEST(CpuOps, MatmulSwigluInRowBlocks) {
  const int64_t shapes[][3] = {{1, 8, 16}, {7, 12, 24}, {33, 16, 5}};  // m, f, k
  uint32_t seed = 40;
  for (const auto& s : shapes) {
    const int64_t m = s[0], f = s[1], k = s[2];
    Tensor x = rand_f32({m, k}, seed++);
    const Tensor w13 = rand_f32({2 * f, k}, seed++);
    const std::vector<double> ref = ref_swiglu(x, w13);
    for (int64_t block : {int64_t{0}, int64_t{1}, int64_t{4}, int64_t{8}, f}) {
      if (block > 0 && f % block != 0) continue;
      LinearWeight lw;
      lw.w = copy_of(w13);
      ASSERT_TRUE(set_swiglu_block(cpu(), lw, block).ok());
      EXPECT_EQ(lw.swiglu_block, block);
      for (int64_t r = 0; r < 2 * f; ++r) {  // blocked row r holds files' row `src`
        const int64_t b = block > 0 ? block : f, t = r / (2 * b), p = (r / b) % 2;
        const int64_t src = block > 0 ? p * f + t * b + r % b : r;
        ASSERT_EQ(std::memcmp(lw.w.data_as<float>() + r * k, w13.data_as<float>() + src * k,
                              k * sizeof(float)),
                  0)
            << "row " << r << " of blocks of " << block;
      }
      Tensor y = f32({m, f});
      ASSERT_TRUE(cpu().matmul_swiglu(x, lw.w, block, y).ok());
      expect_close("matmul_swiglu " + std::to_string(m) + "x" + std::to_string(f) + "x" +
                       std::to_string(k) + " blocks of " + std::to_string(block),
                   y, ref, 1e-5, 1e-5);
      ASSERT_TRUE(set_swiglu_block(cpu(), lw, 0).ok());
      EXPECT_EQ(std::memcmp(lw.w.data(), w13.data(), w13.nbytes()), 0);
    }
  }
  Tensor x = rand_f32({3, 8}, 1), w = rand_f32({12, 8}, 2), y = f32({3, 6});
  expect_invalid(cpu().matmul_swiglu(x, w, 4, y), "row block 4 does not divide F = 6");
  Tensor bad_y = f32({3, 12});
  expect_invalid(cpu().matmul_swiglu(x, w, 0, bad_y), "y f32[3, 12] must be [3, 6]");
  LinearWeight lw;
  lw.w = copy_of(w);
  EXPECT_EQ(set_swiglu_block(cpu(), lw, 4).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(lw.swiglu_block, 0);
}

// The W8A8 feed-forward op (matmul_fp8_swiglu) on the oracle, Backend's composition: gate rows
// first and every row block that divides F, after set_swiglu_block moved the FP8 rows together
// with their scales (and back, byte for byte); y is the SwiGLU of the gate-rows-first FP8 GEMM,
// and its FP8 rows are quantize_fp8_rows of that y, also where the input rows were.
TEST(CpuOps, MatmulFp8SwigluInRowBlocks) {
  const int64_t m = 9, f = 12, k = 16;
  const Tensor x = rand_f32({m, k}, 70, -3.f, 3.f);
  const Tensor w = rand_f32({2 * f, k}, 71, -0.5f, 0.5f);
  Tensor x8 = Tensor::host(DType::kF8E4M3, {m, k}), sx = f32({m});
  ASSERT_TRUE(cpu().quantize_fp8_rows(x, x8, sx).ok());
  Tensor w8 = Tensor::host(DType::kF8E4M3, {2 * f, k}), sw = f32({2 * f});
  ASSERT_TRUE(cpu().quantize_fp8_rows(w, w8, sw).ok());
  Tensor h = f32({m, 2 * f}), y_ref = f32({m, f});
  ASSERT_TRUE(cpu().matmul_fp8_quantized(x8, sx, w8, sw, Tensor(), h).ok());
  ASSERT_TRUE(cpu().swiglu(h, y_ref).ok());
  std::vector<double> ref(static_cast<size_t>(m * f));
  for (int64_t i = 0; i < m * f; ++i) ref[i] = at(y_ref, i);
  for (int64_t block : {int64_t{0}, int64_t{1}, int64_t{4}, int64_t{6}, f}) {
    SCOPED_TRACE("blocks of " + std::to_string(block));
    LinearWeight lw;
    lw.w = copy_of(w8);
    lw.scale = copy_of(sw);
    lw.fp8_compute = true;
    ASSERT_TRUE(set_swiglu_block(cpu(), lw, block).ok());
    for (int64_t r = 0; r < 2 * f; ++r) {  // blocked row r holds files' row `src`, scale too
      const int64_t b = block > 0 ? block : f, t = r / (2 * b), p = (r / b) % 2;
      const int64_t src = block > 0 ? p * f + t * b + r % b : r;
      ASSERT_EQ(std::memcmp(static_cast<const uint8_t*>(lw.w.data()) + r * k,
                            static_cast<const uint8_t*>(w8.data()) + src * k, k),
                0)
          << "row " << r;
      ASSERT_EQ(lw.scale.data_as<float>()[r], sw.data_as<float>()[src]) << "scale " << r;
    }
    Tensor y = f32({m, f}), q = Tensor::host(DType::kF8E4M3, {m, f}), sc = f32({m});
    ASSERT_TRUE(cpu().matmul_fp8_swiglu(x8, sx, lw.w, lw.scale, block, y, q, sc).ok());
    expect_close("matmul_fp8_swiglu", y, ref, 1e-5, 1e-5);
    Tensor q_ref = Tensor::host(DType::kF8E4M3, {m, f}), s_ref = f32({m});
    ASSERT_TRUE(cpu().quantize_fp8_rows(y, q_ref, s_ref).ok());
    EXPECT_EQ(std::memcmp(q.data(), q_ref.data(), q.nbytes()), 0);
    EXPECT_EQ(std::memcmp(sc.data(), s_ref.data(), sc.nbytes()), 0);
    // The FP8 rows where the input rows were (the DiT's w2 input after its w1|w3 input).
    Tensor buf = Tensor::host(DType::kF8E4M3, {m * std::max(k, f)});
    std::memcpy(buf.data(), x8.data(), x8.nbytes());
    Tensor in8(buf.storage(), 0, DType::kF8E4M3, {m, k}),
        out8(buf.storage(), 0, DType::kF8E4M3, {m, f});
    Tensor s_io = copy_of(sx), y2 = f32({m, f});
    ASSERT_TRUE(cpu().matmul_fp8_swiglu(in8, s_io, lw.w, lw.scale, block, y2, out8, s_io).ok());
    EXPECT_EQ(std::memcmp(out8.data(), q.data(), q.nbytes()), 0);
    EXPECT_EQ(std::memcmp(s_io.data(), sc.data(), sc.nbytes()), 0);
    ASSERT_TRUE(set_swiglu_block(cpu(), lw, 0).ok());
    EXPECT_EQ(std::memcmp(lw.w.data(), w8.data(), w8.nbytes()), 0);
    EXPECT_EQ(std::memcmp(lw.scale.data(), sw.data(), sw.nbytes()), 0);
  }
  Tensor y = f32({m, f}), q = Tensor::host(DType::kF8E4M3, {m, f}), none;
  expect_invalid(cpu().matmul_fp8_swiglu(x8, sx, w8, sw, 5, y, q, none), "row block 5");
  expect_invalid(cpu().matmul_fp8_swiglu(x8, sx, w8, sw, 0, y, q, none), "y8 and y_scale");
  LinearWeight stored;  // FP8 rows widened before a bf16 GEMM (--weights fp8): files' order
  stored.w = copy_of(w8);
  stored.scale = copy_of(sw);
  EXPECT_EQ(set_swiglu_block(cpu(), stored, 4).code(), ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace zimage::test

#if defined(ZIMAGE_WITH_CUDA)
#include "backend/cuda/kernels/row_tuning.h"
#include "backend/cuda/libs/gemm_algo_config.h"
#include "backend/cuda/libs/gemm_cutlass.h"

namespace zimage::test {
namespace {

// ZIMAGE_SWIGLU_GEMM / ZIMAGE_QKV_GEMM: every part parsed, and a bad value named in the error.
TEST(GemmTuning, ParsesAndNamesWhatIsWrong) {
  auto t = cuda::parse_gemm_tuning("pingpong-narrow,m,4");
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_EQ(t->schedule, cuda::GemmSchedule::kPingpongNarrow);
  EXPECT_EQ(t->raster, cuda::GemmRaster::kAlongM);
  EXPECT_EQ(t->swizzle, 4);
  auto d = cuda::parse_gemm_tuning("coop-tall");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->schedule, cuda::GemmSchedule::kCooperativeTall);
  EXPECT_EQ(d->raster, cuda::GemmRaster::kHeuristic);
  EXPECT_EQ(d->swizzle, 1);
  auto w = cuda::parse_gemm_tuning("coop-256x192,n,2");
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  EXPECT_EQ(w->schedule, cuda::GemmSchedule::kCooperative256x192);
  EXPECT_EQ(w->raster, cuda::GemmRaster::kAlongN);
  EXPECT_EQ(w->swizzle, 2);
  EXPECT_EQ(cuda::gemm_swiglu_block(cuda::GemmSchedule::kCooperative256x192), 8);
  EXPECT_EQ(cuda::gemm_swiglu_block(cuda::GemmSchedule::kCooperative), 128);
  EXPECT_EQ(cuda::gemm_swiglu_block(cuda::GemmSchedule::kPingpongNarrow), 64);
  for (const auto& [text, needle] :
       {std::pair<std::string, std::string>{"fast", "unknown schedule 'fast'"},
        {"coop,x", "unknown raster order 'x'"},
        {"coop,n,3", "swizzle '3'"},
        {"coop,n,2,1", "too many parts"},
        {"", "unknown schedule ''"}}) {
    auto r = cuda::parse_gemm_tuning(text);
    EXPECT_FALSE(r.ok()) << text;
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().to_string();
  }
}

// ZIMAGE_GEMM_ORDER: RASTER[,SWIZZLE] parsed and named back; a bad one names its part and the
// form.
TEST(GemmTuning, ParsesAndNamesOrders) {
  auto o = cuda::parse_gemm_order("n,8");
  ASSERT_TRUE(o.ok()) << o.status().to_string();
  EXPECT_EQ(o->raster, cuda::GemmRaster::kAlongN);
  EXPECT_EQ(o->swizzle, 8);
  EXPECT_EQ(cuda::gemm_order_name(*o), "n,8");
  EXPECT_EQ(cuda::gemm_order_name(*cuda::parse_gemm_order("auto")), "auto,1");
  EXPECT_EQ(cuda::gemm_order_name(*cuda::parse_gemm_order("m,2")), "m,2");
  for (const auto& [text, needle] :
       {std::pair<std::string, std::string>{"", "unknown raster order ''"},
        {"x", "unknown raster order 'x'"},
        {"m,3", "swizzle '3'"},
        {"m,8,1", "one or two parts"},
        {"n,", "swizzle ''"}}) {
    auto r = cuda::parse_gemm_order(text);
    EXPECT_FALSE(r.ok()) << text;
    if (r.ok()) continue;
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().to_string();
    EXPECT_NE(r.status().message().find("RASTER[,SWIZZLE]"), std::string::npos);
  }
}

// ZIMAGE_FP8_GEMM: every tile name round-trips; a bad one is named with the choices.
TEST(Fp8Tile, ParsesEveryNameAndNamesWhatIsWrong) {
  std::vector<cuda::Fp8Tile> tiles(std::begin(cuda::kFp8Tiles), std::end(cuda::kFp8Tiles));
  tiles.push_back(cuda::Fp8Tile::kAuto);
  tiles.push_back(cuda::Fp8Tile::kAutoWaves);
  EXPECT_EQ(tiles.size(), 7u);
  for (cuda::Fp8Tile t : tiles) {
    auto r = cuda::parse_fp8_tile(cuda::fp8_tile_name(t));
    ASSERT_TRUE(r.ok()) << cuda::fp8_tile_name(t);
    EXPECT_EQ(*r, t);
  }
  auto bad = cuda::parse_fp8_tile("wide");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("'wide'"), std::string::npos);
  EXPECT_NE(bad.status().message().find("coop-tall"), std::string::npos);
  EXPECT_NE(bad.status().message().find("coop-256x192"), std::string::npos);
  // The measured choices (session 24): 256 × 192 from 1024 rows, 128 × 128 below.
  EXPECT_EQ(cuda::fp8_tile_for(16448, 11520, 3840), cuda::Fp8Tile::kCoop256x192);
  EXPECT_EQ(cuda::fp8_tile_for(4160, 3840, 10240), cuda::Fp8Tile::kCoop256x192);
  EXPECT_EQ(cuda::fp8_tile_for(1024, 20480, 3840), cuda::Fp8Tile::kCoop256x192);
  EXPECT_EQ(cuda::fp8_tile_for(1023, 20480, 3840), cuda::Fp8Tile::kPingpong128);
  EXPECT_EQ(cuda::fp8_tile_for(64, 20480, 3840), cuda::Fp8Tile::kPingpong128);
  // kAuto resolves to a real tile at every DiT shape.
  for (int64_t m : {int64_t{64}, int64_t{4160}, int64_t{16448}})
    for (int64_t n : {int64_t{3840}, int64_t{11520}, int64_t{20480}})
      EXPECT_NE(cuda::fp8_tile_for(m, n, 3840), cuda::Fp8Tile::kAuto);
}

// ZIMAGE_GEMM_CONFIG's parser: the five fields, each once, numbers from 0 to 65535; a bad part
// is named.
TEST(GemmAlgoConfig, ParsesAndNamesWhatIsWrong) {
  auto c = cuda::parse_gemm_algo_config("cluster=6,swizzle=1");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->cluster, 6);
  EXPECT_EQ(c->swizzle, 1);
  EXPECT_EQ(c->tile, -1);
  EXPECT_TRUE(c->any());
  EXPECT_EQ(c->str(), "cluster=6,swizzle=1");
  c = cuda::parse_gemm_algo_config("custom=0,tile=209,stages=35");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->str(), "tile=209,stages=35,custom=0");
  c = cuda::parse_gemm_algo_config("");
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(c->any());
  EXPECT_EQ(c->str(), "none");
  for (const auto& [bad, needle] : std::vector<std::pair<std::string, std::string>>{
           {"cluster", "cluster takes a number"},
           {"cluster=", "cluster takes a number"},
           {"cluster=-1", "not '-1'"},
           {"cluster=x", "not 'x'"},
           {"tile=70000", "from 0 to 65535"},
           {"cluster=6,", "'' is not tile="},
           {",swizzle=1", "'' is not tile="},
           {"size=3", "'size=3' is not tile="},
           {"swizzle=1,swizzle=0", "swizzle is given twice"}}) {
    const auto r = cuda::parse_gemm_algo_config(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument) << bad;
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().to_string();
    EXPECT_NE(r.status().message().find("'" + bad + "'"), std::string::npos) << bad;
  }
}

// ZIMAGE_FP8_GEMM=waves: the wave fill it computes, and the tiles it picks at the DiT's shapes on
// 132 multiprocessors (H100 / H200 SXM).
TEST(Fp8Tile, WavesRuleFillsTheLastWave) {
  // 4160 x 3840 in 256 x 192: 17 x 20 = 340 tiles, 3 waves of 132 = 396 slots, 4160·3840 useful.
  EXPECT_NEAR(cuda::tile_wave_efficiency(4160, 3840, 256, 192, 132),
              4160.0 * 3840 / (396.0 * 256 * 192), 1e-12);
  // 128 x 256: 33 x 15 = 495 tiles, 4 waves = 528 slots.
  EXPECT_NEAR(cuda::tile_wave_efficiency(4160, 3840, 128, 256, 132),
              4160.0 * 3840 / (528.0 * 128 * 256), 1e-12);
  EXPECT_DOUBLE_EQ(cuda::tile_wave_efficiency(256, 192, 256, 192, 1), 1.0);
  EXPECT_DOUBLE_EQ(cuda::tile_wave_efficiency(0, 192, 256, 192, 132), 0.0);
  EXPECT_DOUBLE_EQ(cuda::tile_wave_efficiency(256, 192, 256, 192, 0), 0.0);
  using cuda::Fp8Tile;
  // 1024²: w2 and out (3840 wide) move to 128 x 256 (92 % against 82 %); w1|w3 (98.5 against
  // 93.8 %) and q|k|v (92 % both) stay.
  EXPECT_EQ(cuda::fp8_tile_by_waves(4160, 3840, 10240, 132), Fp8Tile::kCoopWide);
  EXPECT_EQ(cuda::fp8_tile_by_waves(4160, 3840, 3840, 132), Fp8Tile::kCoopWide);
  EXPECT_EQ(cuda::fp8_tile_by_waves(4160, 20480, 3840, 132), Fp8Tile::kCoop256x192);
  EXPECT_EQ(cuda::fp8_tile_by_waves(4160, 11520, 3840, 132), Fp8Tile::kCoop256x192);
  // 2048²: every shape stays on 256 x 192 (the tile order rule was measured on it).
  for (int64_t n : {int64_t{3840}, int64_t{11520}, int64_t{20480}})
    EXPECT_EQ(cuda::fp8_tile_by_waves(16448, n, 3840, 132), Fp8Tile::kCoop256x192) << n;
  // Few rows: fp8_tile_for's ping-pong tile.
  EXPECT_EQ(cuda::fp8_tile_by_waves(64, 3840, 3840, 132), Fp8Tile::kPingpong128);
}

// ZIMAGE_ROW_KERNELS: three parts, each checked, a bad one named.
TEST(RowKernelTuning, ParsesAndNamesWhatIsWrong) {
  auto t = cuda::parse_row_kernel_tuning("2,4,2");
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_EQ(t->norm_ppt, 2);
  EXPECT_EQ(t->prologue_items, 4);
  EXPECT_EQ(t->row_walk, 2);
  auto d = cuda::parse_row_kernel_tuning("0,0,0");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->norm_ppt, 0);
  for (const auto& [text, needle] :
       {std::pair<std::string, std::string>{"2,4", "expected three parts"},
        {"3,1,1", "packs per thread '3'"},
        {"1,8,1", "items per warp '8'"},
        {"1,1,4", "row walk '4'"},
        {"1,1,", "row walk ''"}}) {
    auto r = cuda::parse_row_kernel_tuning(text);
    EXPECT_FALSE(r.ok()) << text;
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().to_string();
  }
}

}  // namespace
}  // namespace zimage::test
#endif
