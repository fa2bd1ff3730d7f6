// The bf16 GEMM with SwiGLU in its epilogue (gemm_cutlass.h cutlass_bf16_swiglu).
//
// y[m, j] = silu(x·w1[j]) · (x·w3[j]) for a w1|w3 weight whose rows are interleaved in blocks of
// B (half the tile's width): gate block t at rows [2·t·B, 2·t·B + B), up block t at
// [2·t·B + B, 2·(t+1)·B).
// An output tile of 2·B columns then holds a gate block and its up block, so every thread of the
// epilogue owns both sums of each of its outputs (below) and the [m, 2f] intermediate never
// reaches memory; the 256 × 192 tile (kCooperative256x192) takes B = 8 and twelve such pairs a tile
// (SwigluEpilogue's kBlock). Why not cuBLASLt: it has no epilogue that pairs two output columns.
#include "backend/cuda/libs/gemm_cutlass.h"

#if defined(ZIMAGE_WITH_CUTLASS)

#include <algorithm>

#include "backend/cuda/libs/cutlass_register_epilogue.cuh"

namespace zimage::cuda {
namespace {

using namespace cute;
using register_epilogue::Bf16;
using register_epilogue::round_bf16;

struct SwigluArgs {
  Bf16* y = nullptr;
  int64_t ld = 0;  // elements between rows of y (f for a packed y)
};

// Each thread takes its accumulators straight from the registers. The wgmma accumulator layout
// per thread is ((2, 2, V), MMA_M, MMA_N): two adjacent columns, two rows 8 apart, V groups of 8
// columns (cute's CLayout_64xN, value stride 512: group v + 1 is 8 columns right of group v).
// With MMA_N = 1 and rows in blocks of kBlock (G = kBlock / 8 groups a block), gate pair p's
// group is (p / G)·2G + p % G and its up group G further right, so every thread holds both sums
// of each of its outputs: for kBlock = kTileN / 2 the gate groups are v < V/2 and the up groups
// v + V/2; for kBlock = 8 (the 256 × 192 tile, whose 96 does not divide F = 10240) groups 2j
// and 2j + 1. The output feature of gate column c of column tile n_blk is n_blk·kTileN/2 +
// (c / 2·kBlock)·kBlock + c % 2·kBlock. With kBlock = 8 a tile that starts at a multiple of 16
// columns holds whole pairs, the last, partial one too (at 2F 20480: 106 tiles of 192 and one of
// 128), whose columns past N are skipped. Roundings as the two-kernel path makes them (the GEMM's
// bf16 outputs, silu rounded to bf16, the product rounded once), so the two differ only in the
// GEMMs' order of summation.
template <int kTileM, int kTileN, int kBlock = kTileN / 2>
class SwigluEpilogue : public register_epilogue::Base<SwigluArgs> {
 public:
  using register_epilogue::Base<SwigluArgs>::Base;
  static_assert(kBlock % 8 == 0 && kTileN % (2 * kBlock) == 0, "a tile holds whole pairs");
  static constexpr int kGroups = kBlock / 8;            // value groups a block
  static constexpr bool kWhole = 2 * kBlock == kTileN;  // one pair of blocks fills a tile

  template <class ProblemShape>
  static bool can_implement(ProblemShape const& problem_shape, SwigluArgs const& args) {
    const auto n = cute::get<1>(problem_shape);
    return args.y != nullptr && n % (2 * kBlock) == 0 && args.ld >= n / 2 && args.ld % 2 == 0;
  }

  template <class ProblemShapeMNKL, class BlockShapeMNK, class BlockCoordMNKL, class FrgEngine,
            class FrgLayout, class TiledMma, class ResidueMNK>
  CUTLASS_DEVICE void operator()(ProblemShapeMNKL problem_shape_mnkl, BlockShapeMNK,
                                 BlockCoordMNKL blk_coord_mnkl,
                                 cute::Tensor<FrgEngine, FrgLayout> const& acc, TiledMma tiled_mma,
                                 ResidueMNK, int thread_idx, char*) {
    using namespace cute;
    using Acc = register_epilogue::AccLayout<FrgLayout, BlockShapeMNK, kTileM, kTileN>;
    constexpr int V = Acc::V, MM = Acc::MM;

    const int m_blk = static_cast<int>(get<0>(blk_coord_mnkl));
    const int n_blk = static_cast<int>(get<1>(blk_coord_mnkl));
    const int rows_left = static_cast<int>(get<0>(problem_shape_mnkl)) - m_blk * kTileM;
    const int cols_left = static_cast<int>(get<1>(problem_shape_mnkl)) - n_blk * kTileN;
    // The persistent scheduler rounds the column tiles up to a multiple of its swizzle times the
    // cluster's width and hands out the extra ones too: they hold no output (register_epilogue::
    // past_columns). Tile-uniform, before any shuffle.
    if (register_epilogue::past_columns(problem_shape_mnkl, n_blk, kTileN)) return;
    Tensor coords = make_identity_tensor(make_shape(Int<kTileM>{}, Int<kTileN>{}));
    Tensor tc = tiled_mma.get_thread_slice(thread_idx).partition_C(coords);
    Bf16* out = this->params_.y + static_cast<int64_t>(m_blk) * kTileM * this->params_.ld +
                static_cast<int64_t>(n_blk) * (kTileN / 2);
    CUTLASS_PRAGMA_UNROLL
    for (int mm = 0; mm < MM; ++mm) {
      CUTLASS_PRAGMA_UNROLL
      for (int r = 0; r < 2; ++r) {
        CUTLASS_PRAGMA_UNROLL
        for (int p = 0; p < V / 2; ++p) {
          const int gv = (p / kGroups) * 2 * kGroups + p % kGroups, uv = gv + kGroups;
          const auto gate0 = make_coord(make_coord(0, r, gv), mm, 0);
          const auto gate1 = make_coord(make_coord(1, r, gv), mm, 0);
          const auto up0 = make_coord(make_coord(0, r, uv), mm, 0);
          const auto up1 = make_coord(make_coord(1, r, uv), mm, 0);
          const int row = get<0>(tc(gate0)), col = get<1>(tc(gate0));
          if (row >= rows_left) continue;
          // Partial column tiles only where a tile holds several pairs (N % kTileN may be > 0).
          if constexpr (!kWhole) {
            if (col >= cols_left) continue;
          }
          const float g0 = round_bf16(acc(gate0)), g1 = round_bf16(acc(gate1));
          const float s0 = round_bf16(g0 / (1.0f + expf(-g0)));
          const float s1 = round_bf16(g1 / (1.0f + expf(-g1)));
          cutlass::Array<Bf16, 2> pair;
          pair[0] = Bf16(s0 * round_bf16(acc(up0)));
          pair[1] = Bf16(s1 * round_bf16(acc(up1)));
          const int feature = (col / (2 * kBlock)) * kBlock + col % (2 * kBlock);
          *reinterpret_cast<cutlass::Array<Bf16, 2>*>(out + row * this->params_.ld + feature) =
              pair;
        }
      }
    }
  }
};

// The four tile configurations (gemm_cutlass.h GemmSchedule).
using Cluster = Shape<_2, _1, _1>;
using Coop = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
using Ping = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
using Cooperative =
    register_epilogue::Gemm<Shape<_128, _256, _64>, Cluster, Coop, SwigluEpilogue<128, 256>>;
using CooperativeTall =
    register_epilogue::Gemm<Shape<_256, _128, _64>, Cluster, Coop, SwigluEpilogue<256, 128>>;
using Pingpong =
    register_epilogue::Gemm<Shape<_64, _256, _64>, Cluster, Ping, SwigluEpilogue<64, 256>>;
using PingpongNarrow =
    register_epilogue::Gemm<Shape<_128, _128, _64>, Cluster, Ping, SwigluEpilogue<128, 128>>;

using Fused = register_epilogue::Configs<Cooperative, CooperativeTall, Pingpong, PingpongNarrow>;
// kCooperative256x192: the 256 × 192 tile with its 1 × 2 clusters (gemm_bf16_tiles.cu's mainloop).
using Cooperative256x192 = register_epilogue::Gemm<Shape<_256, _192, _64>, Shape<_1, _2, _1>, Coop,
                                                   SwigluEpilogue<256, 192, 8>>;

}  // namespace

bool fused_gemms_available() {
  return true;
}

size_t cutlass_bf16_swiglu_workspace(int64_t m, int64_t f, int64_t k) {
  if (m <= 0 || f <= 0 || k <= 0 || m > INT32_MAX || 2 * f > INT32_MAX || k > INT32_MAX) return 0;
  const int mi = static_cast<int>(m), ni = static_cast<int>(2 * f), ki = static_cast<int>(k);
  return std::max(Fused::workspace(mi, ni, ki), Cooperative256x192::workspace(mi, ni, ki));
}

Status cutlass_bf16_swiglu(const void* x, const void* w13, void* y, int64_t m, int64_t f, int64_t k,
                           void* workspace, size_t workspace_bytes, cudaStream_t stream,
                           const GemmTuning& tuning) {
  constexpr const char* what = "CUTLASS SwiGLU GEMM";
  static const bool sm90 = cutlass_device_is_sm90();
  if (!sm90) return Unsupported(std::string(what) + ": the device is not sm_90");
  const int64_t block = gemm_swiglu_block(tuning.schedule);
  if (m <= 0 || f <= 0 || k <= 0 || m > INT32_MAX || 2 * f > INT32_MAX || k > INT32_MAX ||
      f % block != 0 || k % 8 != 0)
    return Unsupported(std::string(what) + ": shape m " + std::to_string(m) + ", f " +
                       std::to_string(f) + ", k " + std::to_string(k) + " (needs f % " +
                       std::to_string(block) + " == 0, k % 8 == 0)");
  using register_epilogue::aligned16;
  if (!aligned16(x) || !aligned16(w13) || !aligned16(y))
    return Unsupported(std::string(what) + ": operands not 16-byte aligned");
  const int mi = static_cast<int>(m), ni = static_cast<int>(2 * f), ki = static_cast<int>(k);
  const SwigluArgs args{static_cast<Bf16*>(y), f};
  if (tuning.schedule == GemmSchedule::kCooperative256x192)
    return Cooperative256x192::run(what, x, w13, mi, ni, ki, args, tuning, workspace,
                                   workspace_bytes, stream);
  return Fused::run(what, x, w13, mi, ni, ki, args, tuning, workspace, workspace_bytes, stream);
}

}  // namespace zimage::cuda

#else  // !ZIMAGE_WITH_CUTLASS

namespace zimage::cuda {

bool fused_gemms_available() {
  return false;
}

size_t cutlass_bf16_swiglu_workspace(int64_t, int64_t, int64_t) {
  return 0;
}

Status cutlass_bf16_swiglu(const void*, const void*, void*, int64_t, int64_t, int64_t, void*,
                           size_t, cudaStream_t, const GemmTuning&) {
  return Unsupported("this build has no CUTLASS kernels (run scripts/setup.sh, target sm_90a)");
}

}  // namespace zimage::cuda

#endif
