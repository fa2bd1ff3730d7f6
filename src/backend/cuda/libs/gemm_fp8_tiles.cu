// The W8A8 FP8 GEMM's fast-accumulation tiles other than the default 128 × 128 ping-pong
// (gemm_cutlass.h Fp8Tile, gemm_fp8_rows.cuh): a unit of their own so that they compile beside
// gemm_cutlass.cu rather than after it.
#include "backend/cuda/libs/gemm_cutlass.h"

#if defined(ZIMAGE_WITH_CUTLASS)

#include <algorithm>

#include "backend/cuda/libs/gemm_fp8_rows.cuh"

namespace zimage::cuda::detail {

Status cutlass_fp8_rows_tile(Fp8Tile tile, const void* x8, const void* w8, const float* sx,
                             const float* sw, const void* bias, void* y, int m, int n, int k,
                             void* workspace, size_t workspace_bytes, cudaStream_t stream,
                             const GemmOrder& order) {
  using namespace fp8rows;
  switch (tile) {
    case Fp8Tile::kCoopWide:
      return Fp8Rows<FastWide>::run(x8, w8, sx, sw, bias, y, m, n, k, workspace, workspace_bytes,
                                    stream, order);
    case Fp8Tile::kCoopTall:
      return Fp8Rows<FastTall>::run(x8, w8, sx, sw, bias, y, m, n, k, workspace, workspace_bytes,
                                    stream, order);
    case Fp8Tile::kPingpongWide:
      return Fp8Rows<FastPingWide>::run(x8, w8, sx, sw, bias, y, m, n, k, workspace,
                                        workspace_bytes, stream, order);
    case Fp8Tile::kCoop256x192:
      return Fp8Rows<Fast256x192>::run(x8, w8, sx, sw, bias, y, m, n, k, workspace, workspace_bytes,
                                       stream, order);
    default:
      return InvalidArgument(std::string("CUTLASS FP8 GEMM: no kernel for tile ") +
                             fp8_tile_name(tile) + " in this unit");
  }
}

size_t cutlass_fp8_tiles_workspace(int m, int n, int k) {
  using namespace fp8rows;
  return std::max({Fp8Rows<FastWide>::workspace(m, n, k), Fp8Rows<FastTall>::workspace(m, n, k),
                   Fp8Rows<FastPingWide>::workspace(m, n, k),
                   Fp8Rows<Fast256x192>::workspace(m, n, k)});
}

}  // namespace zimage::cuda::detail

#endif  // ZIMAGE_WITH_CUTLASS
