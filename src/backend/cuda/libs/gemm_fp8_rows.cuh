// The W8A8 FP8 GEMM's CUTLASS template (gemm_cutlass.h cutlass_fp8_rows), shared by the units
// that instantiate its tile configurations (gemm_cutlass.cu: the default and the fp32-promoted
// one; gemm_fp8_tiles.cu: the other fast-accumulation tiles), so that each unit compiles only the
// kernels it runs. Included by CUDA units built with CUTLASS only.
#pragma once

#include <cutlass/cutlass.h>
#include <cutlass/gemm/device/gemm_universal_adapter.h>

#include <cute/tensor.hpp>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/dispatch_policy.hpp>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <string>

#include "backend/cuda/libs/cutlass_order.cuh"
#include "backend/cuda/libs/gemm_cutlass.h"
#include "core/status.h"

namespace zimage::cuda {

// ---- W8A8 FP8 with per-row (token) and per-column (output channel) scales -----------------------
namespace fp8rows {

using namespace cute;

using ElementA = cutlass::float_e4m3_t;  // activations x8 [m, k], row-major (K-major)
using ElementB = cutlass::float_e4m3_t;  // weights w8 [n, k]: column-major k×n (K-major)
using ElementD = cutlass::bfloat16_t;    // y [m, n], row-major
using ElementAcc = float;
using LayoutA = cutlass::layout::RowMajor;
using LayoutB = cutlass::layout::ColumnMajor;
using LayoutD = cutlass::layout::RowMajor;
constexpr int kAlignA = 16;  // elements: 16 bytes
constexpr int kAlignB = 16;
constexpr int kAlignD = 8;

// The configurations, all with 128-deep K steps and two CTAs per cluster, 2 × 1 (sharing the
// weight tile's TMA multicast) except 256 × 192 (1 × 2, sharing the activation tile's):
//  * Fast (128 × 128, ping-pong): each consumer warp group owns a tile, so one's epilogue
//    overlaps the other's MMAs; with FP8FastAccum, the sums stay in the tensor cores'
//    reduced-precision accumulator (what vLLM and SGLang ship for W8A8). Normwise 2.0e-3 (K 3840)
//    and 2.7e-3 (K 10240) against exact sums; the DiT's cosine against bf16 is unchanged (0.99259
//    against 0.99256 with the cuBLASLt path, H200, session 6).
//  * Accurate (128 × 128, ZIMAGE_FP8_ACCUM=fp32): cooperative consumers (two warp groups split
//    each tile); the mainloop promotes the FP8 sums into fp32 registers every few MMAs, as
//    cuBLASLt does by default; normwise 1.7e-3, 8-11 % slower. The promotion keeps a second
//    accumulator in registers, which a ping-pong warp group owning a whole 128×128 tile cannot
//    hold without spilling (measured: 2.5× slower), hence the cooperative schedule.
struct Accurate {
  using TileShape = Shape<_128, _128, _128>;
  using ClusterShape = Shape<_2, _1, _1>;
  using KernelSchedule = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
  using EpilogueSchedule = cutlass::epilogue::TmaWarpSpecializedCooperative;
};
struct Fast {
  using TileShape = Shape<_128, _128, _128>;
  using ClusterShape = Shape<_2, _1, _1>;
  using KernelSchedule = cutlass::gemm::KernelTmaWarpSpecializedPingpongFP8FastAccum;
  using EpilogueSchedule = cutlass::epilogue::TmaWarpSpecialized;
};
// Other fast-accumulation tiles (Fp8Tile in gemm_cutlass.h; instantiated in gemm_fp8_tiles.cu):
// larger tiles read each operand byte fewer times per FLOP (the shared-memory and L2 traffic
// that, at the board's power limit, costs clock), at the price of coarser waves over the SMs.
//  * 128 × 256, cooperative: two warp groups of 64 × 256 each (128 accumulator registers each).
struct FastWide {
  using TileShape = Shape<_128, _256, _128>;
  using ClusterShape = Shape<_2, _1, _1>;
  using KernelSchedule = cutlass::gemm::KernelTmaWarpSpecializedCooperativeFP8FastAccum;
  using EpilogueSchedule = cutlass::epilogue::TmaWarpSpecializedCooperative;
};
//  * 256 × 128, cooperative: two warp groups of 128 × 128.
struct FastTall {
  using TileShape = Shape<_256, _128, _128>;
  using ClusterShape = Shape<_2, _1, _1>;
  using KernelSchedule = cutlass::gemm::KernelTmaWarpSpecializedCooperativeFP8FastAccum;
  using EpilogueSchedule = cutlass::epilogue::TmaWarpSpecializedCooperative;
};
//  * 64 × 256, ping-pong: each warp group owns a whole 64 × 256 tile.
struct FastPingWide {
  using TileShape = Shape<_64, _256, _128>;
  using ClusterShape = Shape<_2, _1, _1>;
  using KernelSchedule = cutlass::gemm::KernelTmaWarpSpecializedPingpongFP8FastAccum;
  using EpilogueSchedule = cutlass::epilogue::TmaWarpSpecialized;
};

//  * 256 × 192, cooperative, 1 × 2 clusters (the cluster's CTAs side by side along N, sharing the
//    activation tile's multicast: 1-15 % faster than 2 × 1 for CUTLASS's bf16 256 × 192 at
//    M 16448, CudaOpsPerf.MatmulLargeTiles, session 24): two warp groups of 128 × 192 (192
//    accumulator registers each); (256 + 192) × 128 operand bytes for 256 · 192 · 128 products,
//    22 % less than 128 × 256. fp8_tile_for's choice from 1024 rows.
struct Fast256x192 {
  using TileShape = Shape<_256, _192, _128>;
  using ClusterShape = Shape<_1, _2, _1>;
  using KernelSchedule = cutlass::gemm::KernelTmaWarpSpecializedCooperativeFP8FastAccum;
  using EpilogueSchedule = cutlass::epilogue::TmaWarpSpecializedCooperative;
};

template <class Config>
struct Fp8Rows {
  using TileShape = typename Config::TileShape;
  using ClusterShape = typename Config::ClusterShape;

  // The epilogue visitor tree: y = sx[row] · (sw[col] · acc) + bias[col], in fp32, rounded once.
  static constexpr auto kRound = cutlass::FloatRoundStyle::round_to_nearest;
  using ScaleCol = cutlass::epilogue::fusion::Sm90RowBroadcast<0, TileShape, float, float,
                                                               Stride<_0, _1, _0>>;  // sw[n]
  using ScaleRow = cutlass::epilogue::fusion::Sm90ColBroadcast<0, TileShape, float, float,
                                                               Stride<_1, _0, _0>>;  // sx[m]
  using Bias = cutlass::epilogue::fusion::Sm90RowBroadcast<0, TileShape, ElementD, float,
                                                           Stride<_0, _1, _0>>;  // bias[n]
  using AccTimesScaleCol = cutlass::epilogue::fusion::Sm90EVT<
      cutlass::epilogue::fusion::Sm90Compute<cutlass::multiplies, float, float, kRound>, ScaleCol,
      cutlass::epilogue::fusion::Sm90AccFetch>;
  using Epilogue = cutlass::epilogue::fusion::Sm90EVT<
      cutlass::epilogue::fusion::Sm90Compute<cutlass::homogeneous_multiply_add, ElementD, float,
                                             kRound>,
      ScaleRow, AccTimesScaleCol, Bias>;

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, ElementAcc, float, void, LayoutD, kAlignD,
      ElementD, LayoutD, kAlignD, typename Config::EpilogueSchedule, Epilogue>::CollectiveOp;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementA, LayoutA, kAlignA, ElementB,
      LayoutB, kAlignB, ElementAcc, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      typename Config::KernelSchedule>::CollectiveOp;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, CollectiveMainloop,
                                                      CollectiveEpilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  static typename Gemm::Arguments arguments(const void* x8, const void* w8, const float* sx,
                                            const float* sw, const void* bias, void* y, int m,
                                            int n, int k, const GemmOrder& order = {}) {
    using StrideA = typename Gemm::GemmKernel::StrideA;
    using StrideB = typename Gemm::GemmKernel::StrideB;
    using StrideC = typename Gemm::GemmKernel::StrideC;
    using StrideD = typename Gemm::GemmKernel::StrideD;
    // Packed strides in (rows, cols, batch) order; the unit stride is static in each type.
    StrideA sa = make_stride(static_cast<int64_t>(k), Int<1>{}, static_cast<int64_t>(m) * k);
    StrideB sb = make_stride(static_cast<int64_t>(k), Int<1>{}, static_cast<int64_t>(n) * k);
    StrideD sd = make_stride(static_cast<int64_t>(n), Int<1>{}, static_cast<int64_t>(m) * n);
    typename Gemm::Arguments args{
        cutlass::gemm::GemmUniversalMode::kGemm,
        {m, n, k, 1},
        {static_cast<const ElementA*>(x8), sa, static_cast<const ElementB*>(w8), sb},
        {{}, nullptr, StrideC{}, static_cast<ElementD*>(y), sd}};
    // The tree's arguments, leaves first and the node's own last (see Sm90TreeVisitor).
    args.epilogue.thread = {
        {sx, 0.f, {}},                                            // sx[m]
        {{sw, 0.f, {}}, {}, {}},                                  // sw[n] · acc
        {static_cast<const ElementD*>(bias), ElementD(0.f), {}},  // bias[n]; null: 0
        {}};
    apply_gemm_order(args, order);
    return args;
  }

  static size_t workspace(int m, int n, int k) {
    return Gemm::get_workspace_size(
        arguments(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, m, n, k));
  }

  static Status run(const void* x8, const void* w8, const float* sx, const float* sw,
                    const void* bias, void* y, int m, int n, int k, void* ws, size_t ws_bytes,
                    cudaStream_t stream, const GemmOrder& order = {}) {
    const auto args = arguments(x8, w8, sx, sw, bias, y, m, n, k, order);
    Gemm gemm;
    if (gemm.can_implement(args) != cutlass::Status::kSuccess)
      return Unsupported("CUTLASS FP8 GEMM: cannot implement " + std::to_string(m) + "x" +
                         std::to_string(n) + "x" + std::to_string(k));
    if (Gemm::get_workspace_size(args) > ws_bytes)
      return InternalError("CUTLASS FP8 GEMM: workspace too small");
    cutlass::Status st = gemm.initialize(args, ws, stream);
    if (st == cutlass::Status::kSuccess) st = gemm.run(stream);
    if (st != cutlass::Status::kSuccess)
      return DeviceError(std::string("CUTLASS FP8 GEMM: ") + cutlassGetStatusString(st));
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
      return DeviceError(std::string("CUTLASS FP8 GEMM: ") + cudaGetErrorString(e));
    return Status::Ok();
  }
};

}  // namespace fp8rows

}  // namespace zimage::cuda
