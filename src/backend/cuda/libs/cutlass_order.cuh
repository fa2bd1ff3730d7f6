// A GemmOrder (gemm_cutlass.h) on the arguments of a CUTLASS 3.x GEMM with the Hopper persistent
// tile scheduler: the one place the project's raster names map to CUTLASS's. Included by CUDA
// units built with CUTLASS only.
#pragma once

#include <cutlass/gemm/kernel/tile_scheduler_detail.hpp>

#include "backend/cuda/libs/gemm_cutlass.h"

namespace zimage::cuda {

template <class Arguments>
void apply_gemm_order(Arguments& args, const GemmOrder& order) {
  using Raster = cutlass::gemm::kernel::detail::RasterOrderOptions;
  args.scheduler.raster_order = order.raster == GemmRaster::kAlongM   ? Raster::AlongM
                                : order.raster == GemmRaster::kAlongN ? Raster::AlongN
                                                                      : Raster::Heuristic;
  args.scheduler.max_swizzle_size = order.swizzle;
}

}  // namespace zimage::cuda
