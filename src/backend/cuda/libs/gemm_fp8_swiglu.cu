// The W8A8 w1|w3 GEMM with SwiGLU in its epilogue (gemm_cutlass.h cutlass_fp8_swiglu_rows).
//
// The FP8 feed-forward otherwise writes the GEMM's [m, 2f] bf16 output and reads it back in
// swiglu_fp8 (SwiGLU, the row's max, e4m3 codes): 40 KB written and read per 1024² token row for
// 10 KB of codes. Here the GEMM's epilogue makes the SwiGLU values from its registers (the w1|w3
// rows interleaved in blocks of kFp8SwigluBlock, as gemm_swiglu.cu's bf16 GEMM takes them), writes
// them once as bf16 [m, f] and folds each row's max |value| into row_amax with one atomic per row
// and tile; a streaming pass (launch_quantize_rows_amax) then makes the codes. Why not an
// elementwise epilogue (CUTLASS's visitor trees): SwiGLU pairs two output columns and the max
// reduces a row, which those trees do not express.
#include "backend/cuda/libs/gemm_cutlass.h"

#if defined(ZIMAGE_WITH_CUTLASS)

#include <cuda_bf16.h>

#include "backend/cuda/libs/cutlass_register_epilogue.cuh"

namespace zimage::cuda {
namespace {

using namespace cute;
using register_epilogue::Bf16;
using register_epilogue::round_bf16;

struct Fp8SwigluArgs {
  Bf16* y = nullptr;
  int64_t ld = 0;                // elements between rows of y (f)
  const float* sx = nullptr;     // [m]: the rows' scales
  const float* sw = nullptr;     // [2f]: the weight rows' scales, in the weight's row order
  unsigned int* amax = nullptr;  // [m]: max |y| of each row as float bits (null: not made)
};

// The roundings of the two-op path (the FP8 GEMM's epilogue, gemm_fp8_rows.cuh: sw · acc in fp32,
// then sx times that plus a zero bias, rounded once to bf16; then swiglu_fp8: silu rounded to
// bf16, the product rounded to bf16), so with the same accumulators the same bytes. The
// accumulator layout per thread is ((2, 2, V), MMA_M, 1) as in gemm_swiglu.cu: the up sum of the
// gate sum in group v lies in group v + V/2, kBlock columns to the right; the four threads of a
// quad hold a row's columns, so a row's max over the tile is two shuffles.
template <int kTileM, int kTileN>
class Fp8SwigluEpilogue : public register_epilogue::Base<Fp8SwigluArgs> {
 public:
  using register_epilogue::Base<Fp8SwigluArgs>::Base;
  static constexpr int kBlock = kTileN / 2;

  template <class ProblemShape>
  static bool can_implement(ProblemShape const& problem_shape, Fp8SwigluArgs const& a) {
    const auto n = cute::get<1>(problem_shape);
    return a.y != nullptr && a.sx != nullptr && a.sw != nullptr && n % kTileN == 0 &&
           a.ld >= n / 2 && a.ld % 2 == 0;
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
    const Fp8SwigluArgs& a = this->params_;

    const int m_blk = static_cast<int>(get<0>(blk_coord_mnkl));
    const int n_blk = static_cast<int>(get<1>(blk_coord_mnkl));
    const int64_t rows = get<0>(problem_shape_mnkl);
    // A tile past the columns (register_epilogue::past_columns): nothing to write, and its weight
    // scales would be read past their end. Tile-uniform, before the shuffles.
    if (register_epilogue::past_columns(problem_shape_mnkl, n_blk, kTileN)) return;
    Tensor coords = make_identity_tensor(make_shape(Int<kTileM>{}, Int<kTileN>{}));
    Tensor tc = tiled_mma.get_thread_slice(thread_idx).partition_C(coords);
    const float* sw = a.sw + static_cast<int64_t>(n_blk) * kTileN;  // this tile's weight rows
    // The gate column col (< kBlock) of this tile is output column n_blk · kBlock + col.
    Bf16* out = a.y + static_cast<int64_t>(n_blk) * kBlock;
    CUTLASS_PRAGMA_UNROLL
    for (int mm = 0; mm < MM; ++mm) {
      CUTLASS_PRAGMA_UNROLL
      for (int r = 0; r < 2; ++r) {
        const int row = get<0>(tc(make_coord(make_coord(0, r, 0), mm, 0)));
        const int64_t grow = static_cast<int64_t>(m_blk) * kTileM + row;
        const bool in = grow < rows;
        const float sx = in ? __ldg(a.sx + grow) : 0.f;
        float amax = 0.f;
        CUTLASS_PRAGMA_UNROLL
        for (int v = 0; v < V / 2; ++v) {
          const int col = get<1>(tc(make_coord(make_coord(0, r, v), mm, 0)));
          const float2 sg = __ldg(reinterpret_cast<const float2*>(sw + col));
          const float2 su = __ldg(reinterpret_cast<const float2*>(sw + col + kBlock));
          const float g0 = round_bf16(
              __fmaf_rn(sx, __fmul_rn(sg.x, acc(make_coord(make_coord(0, r, v), mm, 0))), 0.f));
          const float g1 = round_bf16(
              __fmaf_rn(sx, __fmul_rn(sg.y, acc(make_coord(make_coord(1, r, v), mm, 0))), 0.f));
          const float u0 = round_bf16(__fmaf_rn(
              sx, __fmul_rn(su.x, acc(make_coord(make_coord(0, r, v + V / 2), mm, 0))), 0.f));
          const float u1 = round_bf16(__fmaf_rn(
              sx, __fmul_rn(su.y, acc(make_coord(make_coord(1, r, v + V / 2), mm, 0))), 0.f));
          const float y0 = round_bf16(round_bf16(g0 / (1.0f + expf(-g0))) * u0);
          const float y1 = round_bf16(round_bf16(g1 / (1.0f + expf(-g1))) * u1);
          amax = fmaxf(amax, fmaxf(fabsf(y0), fabsf(y1)));
          if (in) {
            cutlass::Array<Bf16, 2> pair;
            pair[0] = Bf16(y0);
            pair[1] = Bf16(y1);
            *reinterpret_cast<cutlass::Array<Bf16, 2>*>(out + grow * a.ld + col) = pair;
          }
        }
        if (a.amax != nullptr) {  // tile-uniform; every lane reaches the shuffles
          amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
          amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
          if (in && (thread_idx & 3) == 0) atomicMax(a.amax + grow, __float_as_uint(amax));
        }
      }
    }
  }
};

// 128 × 256 cooperative with 2 × 1 clusters and FP8 fast accumulation: gemm_fp8_rows.cuh's
// FastWide mainloop (the fastest FP8 tile for the w1|w3 shape timed alone, docs/BENCHMARKS.md
// session 24), so the sums are the plain FP8 GEMM's in that tile.
using Tile = Shape<_128, _256, _128>;
using Cluster = Shape<_2, _1, _1>;
using Schedule = cutlass::gemm::KernelTmaWarpSpecializedCooperativeFP8FastAccum;
using Fused = register_epilogue::Gemm<Tile, Cluster, Schedule, Fp8SwigluEpilogue<128, 256>,
                                      cutlass::float_e4m3_t>;
static_assert(2 * kFp8SwigluBlock == 256, "the tile holds one gate block and its up block");

}  // namespace

size_t cutlass_fp8_swiglu_rows_workspace(int64_t m, int64_t f, int64_t k) {
  if (m <= 0 || f <= 0 || k <= 0 || m > INT32_MAX || 2 * f > INT32_MAX || k > INT32_MAX) return 0;
  return Fused::workspace(static_cast<int>(m), static_cast<int>(2 * f), static_cast<int>(k));
}

Status cutlass_fp8_swiglu_rows(const void* x8, const void* w13_8, const float* sx,
                               const float* sw13, void* y, unsigned int* row_amax, int64_t m,
                               int64_t f, int64_t k, void* workspace, size_t workspace_bytes,
                               cudaStream_t stream) {
  constexpr const char* what = "CUTLASS FP8 SwiGLU GEMM";
  static const bool sm90 = cutlass_device_is_sm90();
  if (!sm90) return Unsupported(std::string(what) + ": the device is not sm_90");
  if (m <= 0 || f <= 0 || k <= 0 || m > INT32_MAX || 2 * f > INT32_MAX || k > INT32_MAX ||
      f % kFp8SwigluBlock != 0 || k % 16 != 0)
    return Unsupported(std::string(what) + ": shape m " + std::to_string(m) + ", f " +
                       std::to_string(f) + ", k " + std::to_string(k) + " (needs f % " +
                       std::to_string(kFp8SwigluBlock) + " == 0, k % 16 == 0)");
  using register_epilogue::aligned16;
  if (!aligned16(x8) || !aligned16(w13_8) || !aligned16(y) ||
      (reinterpret_cast<uintptr_t>(sw13) & 7u) != 0)
    return Unsupported(std::string(what) + ": operands not aligned");
  const Fp8SwigluArgs args{static_cast<Bf16*>(y), f, sx, sw13, row_amax};
  return Fused::run(what, x8, w13_8, static_cast<int>(m), static_cast<int>(2 * f),
                    static_cast<int>(k), args, GemmTuning{}, workspace, workspace_bytes, stream);
}

}  // namespace zimage::cuda

#else  // !ZIMAGE_WITH_CUTLASS

namespace zimage::cuda {

size_t cutlass_fp8_swiglu_rows_workspace(int64_t, int64_t, int64_t) {
  return 0;
}

Status cutlass_fp8_swiglu_rows(const void*, const void*, const float*, const float*, void*,
                               unsigned int*, int64_t, int64_t, int64_t, void*, size_t,
                               cudaStream_t) {
  return Unsupported("this build has no CUTLASS kernels (run scripts/setup.sh, target sm_90a)");
}

}  // namespace zimage::cuda

#endif
