// bf16 GEMMs in a CUTLASS tile larger than cuBLASLt's (gemm_cutlass.h cutlass_bf16_gemm_tile;
// the DiT's linears under ZIMAGE_BF16_GEMM=cutlass-256x192). Why CUTLASS here: cuBLASLt picks its
// own kernel (a 192 × 192 tile on Hopper) and offers no larger one; a 256 × 192 tile loads
// (256 + 192) × 64 operand elements for 256 · 192 · 64 products, 12 % less than 192 × 192, which at
// the board's power limit may buy clock (the FP8 GEMM's 256 × 192 won whole forwards that way
// while losing back-to-back timings, session 24). Each warp group holds 128 × 192 fp32 sums (192
// registers a thread); the cluster's two CTAs sit side by side along N (1-15 % faster than 2 × 1
// at M 16448, CudaOpsPerf.MatmulLargeTiles). Built with the fused GEMMs (ZIMAGE_FUSED_GEMMS).
#include "backend/cuda/libs/gemm_cutlass.h"

#if defined(ZIMAGE_WITH_CUTLASS)

#include <string>

#include "backend/cuda/libs/gemm_plain.cuh"

namespace zimage::cuda {
namespace {

using namespace plain_gemm;
using Coop256x192 = Plain<Shape<_256, _192, _64>, CoopSched, CoopEpi, Shape<_1, _2, _1>>;

}  // namespace

size_t cutlass_bf16_gemm_tile_workspace(int64_t m, int64_t n, int64_t k) {
  if (!fits(m, n, k)) return 0;
  return Coop256x192::workspace(static_cast<int>(m), static_cast<int>(n), static_cast<int>(k));
}

Status cutlass_bf16_gemm_tile(PlainTile tile, const void* x, const void* w, void* y, int64_t m,
                              int64_t n, int64_t k, void* workspace, size_t workspace_bytes,
                              cudaStream_t stream, const GemmOrder& order) {
  ZI_TRY(check_plain(x, w, y, m, n, k));
  const GemmTuning tuning{GemmSchedule::kCooperative, order.raster, order.swizzle};
  const int mi = static_cast<int>(m), ni = static_cast<int>(n), ki = static_cast<int>(k);
  switch (tile) {
    case PlainTile::kCoop256x192:
      return Coop256x192::run(x, w, y, mi, ni, ki, tuning, workspace, workspace_bytes, stream);
  }
  return InvalidArgument("CUTLASS bf16 GEMM: unknown tile");
}

}  // namespace zimage::cuda

#else  // !ZIMAGE_WITH_CUTLASS

namespace zimage::cuda {

size_t cutlass_bf16_gemm_tile_workspace(int64_t, int64_t, int64_t) {
  return 0;
}

Status cutlass_bf16_gemm_tile(PlainTile, const void*, const void*, void*, int64_t, int64_t, int64_t,
                              void*, size_t, cudaStream_t, const GemmOrder&) {
  return Unsupported(
      "this build has no CUTLASS bf16 tiles (scripts/setup.sh, sm_90a and "
      "-DZIMAGE_FUSED_GEMMS=ON)");
}

}  // namespace zimage::cuda

#endif
