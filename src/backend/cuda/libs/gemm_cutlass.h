// GEMMs cuBLASLt cannot do with the epilogue zimage needs, written with CUTLASS 3.x's Hopper
// collectives (TMA loads, warp-specialised wgmma mainloop, an epilogue visitor tree): only the
// epilogue is ours, the GEMM itself is CUTLASS's. Built when scripts/setup.sh fetched the CUTLASS
// headers and the CUDA code targets sm_90a (CMake defines ZIMAGE_WITH_CUTLASS); otherwise every
// call answers kUnsupported and the caller takes its cuBLASLt path.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/text.h"

namespace zimage::cuda {

// True when this build carries the CUTLASS kernels.
bool cutlass_available();
// Whether this build has the fused GEMMs and the bf16 256 × 192 tile (gemm_swiglu.cu, gemm_qkv.cu,
// gemm_bf16_tiles.cu; the ZIMAGE_FUSED_GEMMS build option): false, their entry points answer
// kUnsupported.
bool fused_gemms_available();
// True when the current device is sm_90 (the CUTLASS kernels' target); used by their units.
bool cutlass_device_is_sm90();

// The persistent scheduler's walk over a GEMM's output tiles: along M (down a column of tiles,
// then the next) or along N, or CUTLASS's heuristic (along M when the output has more tile
// columns than rows, else along N); and its swizzle: 1, 2, 4 or 8 tiles of the other dimension
// taken side by side. They decide how often the operands come back from memory rather than L2
// (at M 16448 neither operand of the wider DiT linears fits the 50 MB L2), not the sums: each tile
// computes the same bytes in any order.
enum class GemmRaster { kHeuristic, kAlongM, kAlongN };
struct GemmOrder {
  GemmRaster raster = GemmRaster::kHeuristic;
  int swizzle = 1;
};
// "RASTER[,SWIZZLE]": auto, m or n; 1, 2, 4 or 8 (ZIMAGE_GEMM_ORDER). An error names what is wrong.
inline Result<GemmOrder> parse_gemm_order(const std::string& text) {
  const std::vector<std::string> parts = split(text, ',');
  const auto bad = [&](const std::string& what) {
    return InvalidArgument("GEMM order '" + text + "': " + what + " (RASTER[,SWIZZLE]: auto|m|n, " +
                           "1|2|4|8)");
  };
  if (parts.empty() || parts.size() > 2) return bad("one or two parts");
  GemmOrder o;
  if (parts[0] == "auto")
    o.raster = GemmRaster::kHeuristic;
  else if (parts[0] == "m")
    o.raster = GemmRaster::kAlongM;
  else if (parts[0] == "n")
    o.raster = GemmRaster::kAlongN;
  else
    return bad("unknown raster order '" + parts[0] + "'");
  if (parts.size() == 2) {
    const std::string& z = parts[1];
    if (z != "1" && z != "2" && z != "4" && z != "8") return bad("swizzle '" + z + "'");
    o.swizzle = z[0] - '0';
  }
  return o;
}
inline std::string gemm_order_name(const GemmOrder& o) {  // "n,8"
  const char* r = o.raster == GemmRaster::kAlongM   ? "m"
                  : o.raster == GemmRaster::kAlongN ? "n"
                                                    : "auto";
  return std::string(r) + "," + std::to_string(o.swizzle);
}

// W8A8 FP8 linear with its scales in the epilogue: row-major bf16
//   y[m, n] = bf16( sx[m] · (sw[n] · Σ_k x8[m, k] · w8[n, k]) + bias[n] )
// e4m3 operands (x8 row-major [m, k], w8 row-major [n, k]), the scales and bias applied to the
// float sums and rounded once. sx [m], sw [n] f32 and bias [n] bf16 (may be null) in device
// memory. kUnsupported when the build has no CUTLASS, the device is not sm_90, or the shape or
// alignment does not suit the kernel (k % 16, n % 8, 16-byte aligned operands).
// `workspace` of `workspace_bytes` (cutlass_fp8_rows_workspace(m, n, k) at least).
// `fast_accum`: leave the sums in the tensor cores' reduced-precision FP8 accumulator
// (CUTLASS's FP8FastAccum; faster, less exact for long K) instead of promoting them to fp32
// (CudaBackend passes true unless ZIMAGE_FP8_ACCUM=fp32).
// `tile` (fast accumulation only; the fp32-promoted sums always run cooperative 128 × 128): the
// output tile and kernel schedule, kAuto for fp8_tile_for's choice.
enum class Fp8Tile {
  kAuto,
  kPingpong128,   // 128 × 128, ping-pong (each consumer warp group owns a tile)
  kCoopWide,      // 128 × 256, cooperative (two warp groups split each tile)
  kCoopTall,      // 256 × 128, cooperative
  kPingpongWide,  // 64 × 256, ping-pong
  kCoop256x192,   // 256 × 192, cooperative, 1 × 2 clusters
  kAutoWaves,     // fp8_tile_by_waves' choice (a measuring switch, ZIMAGE_FP8_GEMM=waves)
};
// Every tile kAuto may stand for (the tests run each).
inline constexpr Fp8Tile kFp8Tiles[] = {Fp8Tile::kPingpong128, Fp8Tile::kCoopWide,
                                        Fp8Tile::kCoopTall, Fp8Tile::kPingpongWide,
                                        Fp8Tile::kCoop256x192};
// `order`: the tiles' order (GemmOrder; the same bytes in any).
Status cutlass_fp8_rows(const void* x8, const void* w8, const float* sx, const float* sw,
                        const void* bias, void* y, int64_t m, int64_t n, int64_t k, void* workspace,
                        size_t workspace_bytes, cudaStream_t stream, bool fast_accum = false,
                        Fp8Tile tile = Fp8Tile::kAuto, const GemmOrder& order = {});
size_t cutlass_fp8_rows_workspace(int64_t m, int64_t n, int64_t k);

// The W8A8 feed-forward's w1|w3 linear with SwiGLU in its epilogue (gemm_fp8_swiglu.cu):
//   y[m, j] = silu(g[m, j]) · u[m, j],  j < f
// where g and u are what cutlass_fp8_rows would write for the gate and up rows (no bias), each
// rounded to bf16, silu rounded to bf16 and the product rounded once: the bytes of that GEMM then
// Backend::swiglu, given the same sums. w13_8 [2f, k] e4m3 holds w1 and w3 with their rows
// interleaved in blocks of kFp8SwigluBlock (gate block t at rows 2·t·B.., up block t at
// 2·t·B + B..; set_swiglu_block, model/common/linear.h) and sw13 [2f] its row scales in that
// order. y [m, f] bf16. row_amax [m] (may be null): each row's max |y| as float bits folded in with
// atomicMax, so it must hold zeros (or a lower bound) before the call. The mainloop is the FP8
// fast-accumulation 128 × 256 cooperative tile of cutlass_fp8_rows (Fp8Tile::kCoopWide), so its
// sums are that GEMM's in that tile. kUnsupported when the build has no fused GEMMs, the device is
// not sm_90, f % kFp8SwigluBlock != 0, k % 16 != 0 or an operand is misaligned (x8, w13_8, y:
// 16 bytes; sw13: 8). `workspace` of cutlass_fp8_swiglu_rows_workspace(m, f, k) bytes at least.
constexpr int64_t kFp8SwigluBlock = 128;
Status cutlass_fp8_swiglu_rows(const void* x8, const void* w13_8, const float* sx,
                               const float* sw13, void* y, unsigned int* row_amax, int64_t m,
                               int64_t f, int64_t k, void* workspace, size_t workspace_bytes,
                               cudaStream_t stream);
size_t cutlass_fp8_swiglu_rows_workspace(int64_t m, int64_t f, int64_t k);

// The tile kAuto runs for an m × n × k FP8 GEMM: 256 × 192 (cooperative, 1 × 2 clusters) from
// 1024 rows, 128 × 128 ping-pong below (few rows: larger tiles would leave SMs idle).
// Measured on H100s (docs/BENCHMARKS.md, sessions 23 and 24). Timed alone, back to back
// (CudaOpsPerf.Fp8GemmTiles), 128 × 256 cooperative is the fastest at most of the DiT's eight
// shapes (M 4160, 16448) and 256 × 192 1-19 % behind it. In whole forwards, where the board runs at
// its 700 W limit with attention between the GEMMs, 256 × 192 everywhere was faster in both calls
// that ran it: 2048² 349.4 / 354.6 ms against 356.0-364.6, 1024² 60.7 / 61.1 against 61.5-62.0,
// at higher clocks (1635-1680 against 1590-1635 MHz). It loads (256 + 192) × 128 operand bytes
// for 256 · 192 · 128 products, 22 % less than 128 × 256; moving fewer bytes plausibly leaves more
// of the power budget to the clock, which short back-to-back timings do not see (inferred, not
// measured).
inline Fp8Tile fp8_tile_for(int64_t m, int64_t /*n*/, int64_t /*k*/) {
  return m < 1024 ? Fp8Tile::kPingpong128 : Fp8Tile::kCoop256x192;
}
// The share of the tile slots that do useful work when an m × n output in tm × tn tiles runs as
// waves of one tile per multiprocessor over `sms` of them: the partial tiles at the edges and the
// last wave's idle multiprocessors lower it. At M 4160 (a 1024² image), 256 × 192 tiles fill 82 %
// of the slots for the 3840-wide outputs (w2, out: 340 tiles, 2.6 waves of 132) where 128 × 256
// fill 92 %; at M 16448 both fill 97-99 % at every DiT shape.
inline double tile_wave_efficiency(int64_t m, int64_t n, int64_t tm, int64_t tn, int64_t sms) {
  if (m <= 0 || n <= 0 || tm <= 0 || tn <= 0 || sms <= 0) return 0.0;
  const int64_t tiles = ((m + tm - 1) / tm) * ((n + tn - 1) / tn);
  const int64_t waves = (tiles + sms - 1) / sms;
  return static_cast<double>(m) * static_cast<double>(n) /
         (static_cast<double>(waves * sms) * static_cast<double>(tm * tn));
}
// ZIMAGE_FP8_GEMM=waves (a measuring switch): fp8_tile_for's choice, except that 128 × 256
// (cooperative) replaces 256 × 192 where it fills the waves at least 5 points better
// (tile_wave_efficiency on `sms` multiprocessors): at M 4160 the 3840-wide outputs, w2 and out.
inline Fp8Tile fp8_tile_by_waves(int64_t m, int64_t n, int64_t k, int64_t sms) {
  const Fp8Tile t = fp8_tile_for(m, n, k);
  if (t != Fp8Tile::kCoop256x192) return t;
  return tile_wave_efficiency(m, n, 128, 256, sms) >=
                 tile_wave_efficiency(m, n, 256, 192, sms) + 0.05
             ? Fp8Tile::kCoopWide
             : t;
}
inline const char* fp8_tile_name(Fp8Tile t) {
  switch (t) {
    case Fp8Tile::kPingpong128:
      return "pingpong";
    case Fp8Tile::kCoopWide:
      return "coop-wide";
    case Fp8Tile::kCoopTall:
      return "coop-tall";
    case Fp8Tile::kPingpongWide:
      return "pingpong-wide";
    case Fp8Tile::kCoop256x192:
      return "coop-256x192";
    case Fp8Tile::kAutoWaves:
      return "waves";
    default:
      return "auto";
  }
}
// "auto", "pingpong", "coop-wide", "coop-tall", "pingpong-wide", "coop-256x192" or "waves"
// (ZIMAGE_FP8_GEMM); an error names a bad value and the choices.
inline Result<Fp8Tile> parse_fp8_tile(const std::string& text) {
  for (Fp8Tile t : {Fp8Tile::kAuto, Fp8Tile::kPingpong128, Fp8Tile::kCoopWide, Fp8Tile::kCoopTall,
                    Fp8Tile::kPingpongWide, Fp8Tile::kCoop256x192, Fp8Tile::kAutoWaves})
    if (text == fp8_tile_name(t)) return t;
  return InvalidArgument(
      "FP8 GEMM tile '" + text +
      "': auto, pingpong, coop-wide, coop-tall, pingpong-wide, coop-256x192 or waves");
}

namespace detail {
// The tiles other than kPingpong128 (gemm_fp8_tiles.cu), behind cutlass_fp8_rows' checks.
Status cutlass_fp8_rows_tile(Fp8Tile tile, const void* x8, const void* w8, const float* sx,
                             const float* sw, const void* bias, void* y, int m, int n, int k,
                             void* workspace, size_t workspace_bytes, cudaStream_t stream,
                             const GemmOrder& order);
size_t cutlass_fp8_tiles_workspace(int m, int n, int k);
}  // namespace detail

// How the GEMMs with an epilogue of ours are run on Hopper (CudaOpsPerf.MatmulSwiglu and
// MatmulQkvNormRope time the choices):
//  * the tile and kernel schedule: cooperative (two consumer warp groups split each tile) or
//    ping-pong (each owns a tile; one's epilogue overlaps the other's MMAs), in two tile shapes
//    each (the SwiGLU GEMM's tile is as wide as two of its row blocks: gemm_swiglu_block), and
//    for SwiGLU a 256 × 192 cooperative tile whose width holds twelve pairs of 8-row blocks;
//  * the persistent scheduler's order over the output tiles (along M or N, or CUTLASS's heuristic)
//    and its swizzle (1, 2, 4 or 8 tiles), which decide how often the operands come back from
//    memory rather than L2.
enum class GemmSchedule {
  kCooperative,      // SwiGLU 128 x 256, q|k|v 128 x 128
  kCooperativeTall,  // SwiGLU 256 x 128, q|k|v 256 x 128
  kPingpong,         // SwiGLU 64 x 256,  q|k|v 128 x 128
  kPingpongNarrow,   // SwiGLU 128 x 128, q|k|v 64 x 128
  // SwiGLU only: 256 x 192 in 1 x 2 clusters, the mainloop of gemm_bf16_tiles.cu's tile (level
  // with cuBLASLt on w1|w3 in session 25's whole forwards), on rows interleaved in blocks of 8 so
  // that any 16-column slice holds whole gate/up pairs (192 does not divide 2 x 10240). The
  // q|k|v GEMM refuses it (kUnsupported; ZIMAGE_QKV_GEMM: an error).
  kCooperative256x192,
};
struct GemmTuning {
  GemmSchedule schedule = GemmSchedule::kCooperative;
  GemmRaster raster = GemmRaster::kHeuristic;
  int swizzle = 1;
};
// "SCHEDULE[,RASTER[,SWIZZLE]]": coop, coop-tall, pingpong, pingpong-narrow or coop-256x192; auto,
// m or n; 1, 2, 4 or 8 (the ZIMAGE_SWIGLU_GEMM / ZIMAGE_QKV_GEMM settings). An error names what is
// wrong.
inline Result<GemmTuning> parse_gemm_tuning(const std::string& text) {
  GemmTuning t;
  const std::vector<std::string> parts = split(text, ',');
  const auto bad = [&](const std::string& what) {
    return InvalidArgument("GEMM tuning '" + text + "': " + what +
                           " (SCHEDULE[,RASTER[,SWIZZLE]]: coop|coop-tall|pingpong|"
                           "pingpong-narrow|coop-256x192, auto|m|n, 1|2|4|8)");
  };
  if (parts.size() > 3) return bad("too many parts");
  const std::string& s = parts[0];
  if (s == "coop") {
    t.schedule = GemmSchedule::kCooperative;
  } else if (s == "coop-tall") {
    t.schedule = GemmSchedule::kCooperativeTall;
  } else if (s == "pingpong") {
    t.schedule = GemmSchedule::kPingpong;
  } else if (s == "pingpong-narrow") {
    t.schedule = GemmSchedule::kPingpongNarrow;
  } else if (s == "coop-256x192") {
    t.schedule = GemmSchedule::kCooperative256x192;
  } else {
    return bad("unknown schedule '" + s + "'");
  }
  if (parts.size() > 1) {  // RASTER[,SWIZZLE]: a GemmOrder
    auto o = parse_gemm_order(text.substr(text.find(',') + 1));
    if (!o.ok()) return bad(o.status().message());
    t.raster = o->raster;
    t.swizzle = o->swizzle;
  }
  return t;
}

// bf16 linear with SwiGLU in the epilogue, row-major:
//   y[m, j] = silu(x · w1[j]) · (x · w3[j]),  j < f
// where w13 [2f, k] holds w1 and w3 with their rows interleaved in blocks of B rows (gate
// block t at rows 2·t·B.., up block t at 2·t·B + B..; backend.h matmul_swiglu; B =
// gemm_swiglu_block(tuning.schedule)). The sums are
// rounded to bf16, silu rounded to bf16, the product rounded once: the roundings of a GEMM
// followed by Backend::swiglu. x [m, k], y [m, f]. kUnsupported when the build has no
// CUTLASS, the device is not sm_90, f % B != 0, k % 8 != 0 or an operand is not
// 16-byte aligned. `workspace` of cutlass_bf16_swiglu_workspace(m, f, k) bytes at least.
inline int64_t gemm_swiglu_block(GemmSchedule schedule) {
  if (schedule == GemmSchedule::kCooperative256x192) return 8;  // twelve pairs a 192-wide tile
  return schedule == GemmSchedule::kCooperative || schedule == GemmSchedule::kPingpong ? 128 : 64;
}
Status cutlass_bf16_swiglu(const void* x, const void* w13, void* y, int64_t m, int64_t f, int64_t k,
                           void* workspace, size_t workspace_bytes, cudaStream_t stream,
                           const GemmTuning& tuning = {});
size_t cutlass_bf16_swiglu_workspace(int64_t m, int64_t f, int64_t k);

// Plain bf16 y[m, n] = x[m, k] · w[n, k]ᵀ through CUTLASS with its own TMA epilogue, in the four
// tile configurations of the fused GEMMs (tuning.schedule, raster, swizzle): a measuring stick
// for them against cuBLASLt (CudaOpsPerf), not a path the engine takes. kUnsupported without
// CUTLASS, off sm_90, for n or k not a multiple of 8 or operands not 16-byte aligned.
Status cutlass_bf16_gemm(const void* x, const void* w, void* y, int64_t m, int64_t n, int64_t k,
                         void* workspace, size_t workspace_bytes, cudaStream_t stream,
                         const GemmTuning& tuning = {});
size_t cutlass_bf16_gemm_workspace(int64_t m, int64_t n, int64_t k);
// The same in a tile larger than cuBLASLt's (gemm_bf16_tiles.cu; built with the fused GEMMs):
// back to back it runs at 0.89-1.01× cuBLASLt's rate at the DiT's shapes (session 24,
// CudaOpsPerf.MatmulLargeTiles); whether it wins whole forwards at the power limit, as the FP8
// 256 × 192 tile did, is what ZIMAGE_BF16_GEMM=cutlass-256x192 measures. kUnsupported as
// cutlass_bf16_gemm, or when the build has no fused GEMMs. `workspace` of
// cutlass_bf16_gemm_tile_workspace(m, n, k) bytes at least.
enum class PlainTile {
  kCoop256x192,  // cooperative, 1 × 2 clusters
};
size_t cutlass_bf16_gemm_tile_workspace(int64_t m, int64_t n, int64_t k);
Status cutlass_bf16_gemm_tile(PlainTile tile, const void* x, const void* w, void* y, int64_t m,
                              int64_t n, int64_t k, void* workspace, size_t workspace_bytes,
                              cudaStream_t stream, const GemmOrder& order = {});

// bf16 q|k|v linear with the attention prologue in its epilogue (Backend::qkv_split_norm_rope
// for head_dim kQkvHeadDim): t = x · wqkvᵀ, rounded to bf16, [m, (hq + 2·hkv)·128], split per
// 128-wide head into q [m, hq·128], k and v [m, hkv·128]; the heads of q and k RMS-normalised
// with norm_q / norm_k [128] bf16 (both null: none) and rotated by the interleaved RoPE with
// freqs (f32, 64 (cos, sin) pairs per token row; row r takes row r % seq_if_shared when that is
// > 0; null: none). The same roundings as the GEMM followed by the prologue kernel.
// kUnsupported when the build has no CUTLASS, the device is not sm_90, k % 8 != 0 or an operand
// is misaligned (16 bytes; freqs 8). `workspace` of cutlass_bf16_qkv_norm_rope_workspace(m,
// n, k) bytes at least, n = (hq + 2·hkv)·128.
constexpr int kQkvHeadDim = 128;
struct QkvPrologue {
  void* q = nullptr;
  void* k = nullptr;
  void* v = nullptr;
  const void* norm_q = nullptr;
  const void* norm_k = nullptr;
  const float* freqs = nullptr;
  int64_t seq_if_shared = 0;
  int hq = 0, hkv = 0;
  float eps = 0.f;
};
Status cutlass_bf16_qkv_norm_rope(const void* x, const void* wqkv, const QkvPrologue& p, int64_t m,
                                  int64_t k, void* workspace, size_t workspace_bytes,
                                  cudaStream_t stream, const GemmTuning& tuning = {});
size_t cutlass_bf16_qkv_norm_rope_workspace(int64_t m, int64_t n, int64_t k);

}  // namespace zimage::cuda
