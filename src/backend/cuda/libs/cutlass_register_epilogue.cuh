// What the CUTLASS GEMMs with an epilogue of ours share (gemm_swiglu.cu, gemm_qkv.cu): CUTLASS
// 3.x's Hopper mainloop (TMA loads, warp-specialised wgmma, a persistent tile scheduler) and a
// collective epilogue that takes each thread's accumulators straight from its registers, run
// through CUTLASS's Sm90 adapter for such epilogues (what its NoSmemWarpSpecialized schedule
// does with DefaultEpilogue). Such an epilogue sees every value of a thread's rows at once, which
// the elementwise epilogue visitor trees do not offer: SwiGLU pairs two columns, the attention
// prologue normalises 128-wide rows. Also the launch and tuning helpers gemm_plain.cu shares.
// Included only by the sm_90a CUTLASS units.
#pragma once

#include <cutlass/cutlass.h>
#include <cutlass/epilogue/thread/linear_combination.h>
#include <cutlass/gemm/device/gemm_universal_adapter.h>

#include <algorithm>
#include <cute/tensor.hpp>
#include <cutlass/epilogue/collective/detail.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/dispatch_policy.hpp>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <string>

#include "backend/cuda/libs/cutlass_order.cuh"
#include "backend/cuda/libs/gemm_cutlass.h"
#include "core/status.h"

namespace zimage::cuda::register_epilogue {

using Bf16 = cutlass::bfloat16_t;

__device__ __forceinline__ float round_bf16(float v) {
  return static_cast<float>(Bf16(v));
}

// The raster order and swizzle of a GemmTuning on a persistent kernel's arguments.
template <class Arguments>
void apply_tuning(Arguments& args, const GemmTuning& tuning) {
  apply_gemm_order(args, GemmOrder{tuning.raster, tuning.swizzle});
}

// Checks, initialises and launches a CUTLASS 3.x GEMM (a GemmUniversalAdapter) on `stream`;
// kUnsupported where the kernel cannot take the problem, the error named after `what`.
template <class Adapter>
Status run_adapter(const char* what, const typename Adapter::Arguments& args, int m, int n, int k,
                   void* ws, size_t ws_bytes, cudaStream_t stream) {
  Adapter gemm;
  if (gemm.can_implement(args) != cutlass::Status::kSuccess)
    return Unsupported(std::string(what) + ": cannot implement " + std::to_string(m) + "x" +
                       std::to_string(n) + "x" + std::to_string(k));
  if (Adapter::get_workspace_size(args) > ws_bytes)
    return InternalError(std::string(what) + ": workspace too small");
  cutlass::Status st = gemm.initialize(args, ws, stream);
  if (st == cutlass::Status::kSuccess) st = gemm.run(stream);
  if (st != cutlass::Status::kSuccess)
    return DeviceError(std::string(what) + ": " + cutlassGetStatusString(st));
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return DeviceError(std::string(what) + ": " + cudaGetErrorString(e));
  return Status::Ok();
}

// The accumulator layout these epilogues read, checked once: per thread ((2, 2, V), MMA_M, 1) in
// wgmma's layout (two adjacent columns, two rows 8 apart, V groups of 8 columns; MM row groups),
// one MMA atom across the kTileN-wide tile of a kTileM × kTileN block.
template <class FrgLayout, class BlockShapeMNK, int kTileM, int kTileN>
struct AccLayout {
  static_assert(cute::size<0>(BlockShapeMNK{}) == kTileM &&
                cute::size<1>(BlockShapeMNK{}) == kTileN);
  static_assert(cute::rank(FrgLayout{}) == 3 && cute::size<0, 0>(FrgLayout{}) == 2 &&
                    cute::size<0, 1>(FrgLayout{}) == 2 && cute::size<2>(FrgLayout{}) == 1,
                "the wgmma accumulator layout ((2, 2, V), MMA_M, 1)");
  static constexpr int V = cute::size<0, 2>(FrgLayout{});
  static constexpr int MM = cute::size<1>(FrgLayout{});
  static_assert(V * 8 == kTileN, "one MMA atom spans the tile's width");
};

// Whether output column tile n_blk of kTileN columns lies wholly past the problem's N. CUTLASS's
// persistent scheduler rounds the tile counts up to a multiple of its swizzle times the cluster's
// shape (PersistentTileSchedulerSm90Params::initialize, tile_scheduler_params.h) and hands those
// tiles out like any other; CUTLASS's own epilogues clip them by TMA, these must skip them, or a
// row's extra columns land in the next row's and past the end of the output.
template <class ProblemShapeMNKL>
CUTLASS_DEVICE bool past_columns(ProblemShapeMNKL const& problem_shape_mnkl, int n_blk,
                                 int kTileN) {
  return static_cast<int64_t>(n_blk) * kTileN >=
         static_cast<int64_t>(cute::get<1>(problem_shape_mnkl));
}

// The interface CUTLASS's DefaultEpilogue has (types, arguments, workspace) for a bf16-output
// epilogue with `Args` as its arguments and no source tensor C; a derived class adds
// can_implement and the operator() that writes the tile.
template <class Args>
class Base {
 public:
  using EpilogueSchedule = cutlass::gemm::EpilogueDefault;
  using DispatchPolicy = EpilogueSchedule;
  using ThreadEpilogueOp = cutlass::epilogue::thread::LinearCombination<Bf16, 1, float, float>;
  using ElementOutput = Bf16;
  using ElementAccumulator = float;
  using ElementCompute = float;
  using ElementScalar = float;
  using ElementC = void;
  using ElementD = Bf16;
  using StrideC = cute::Stride<int64_t, cute::Int<1>, int64_t>;
  using StrideD = StrideC;
  using GmemElementC = Bf16;
  using GmemTiledCopyC = void;
  using GmemTiledCopyD = void;
  struct SharedStorage {};
  using TensorStorage = SharedStorage;
  using Arguments = Args;
  using Params = Args;

  template <class ProblemShape>
  static constexpr Params to_underlying_arguments(ProblemShape const&, Arguments const& args,
                                                  void*) {
    return args;
  }
  template <class ProblemShape>
  static size_t get_workspace_size(ProblemShape const&, Arguments const&) {
    return 0;
  }
  template <class ProblemShape>
  static cutlass::Status initialize_workspace(ProblemShape const&, Arguments const&, void*,
                                              cudaStream_t, cutlass::CudaHostAdapter* = nullptr) {
    return cutlass::Status::kSuccess;
  }

  CUTLASS_HOST_DEVICE
  Base(Params const& params, SharedStorage const& = SharedStorage()) : params_(params) {}

  CUTLASS_DEVICE bool is_source_needed() { return false; }

 protected:
  Params params_;
};

// A GEMM y = x · wᵀ (x [m, k] row-major, w [n, k] row-major, both `Element`: bf16, or e4m3 for
// the W8A8 GEMMs) with epilogue `Epi` and the mainloop CUTLASS's builder makes for `TileShape`,
// `ClusterShape` and `KernelSchedule`.
template <class TileShape, class ClusterShape, class KernelSchedule, class Epi,
          class Element = Bf16>
struct Gemm {
  static constexpr int kAlign = 16 / static_cast<int>(sizeof(Element));  // elements: 16 bytes
  using CollectiveEpilogue =
      cutlass::epilogue::collective::detail::Sm90TmaWarpSpecializedAdapter<Epi>;
  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, cutlass::layout::RowMajor,
      kAlign, Element, cutlass::layout::ColumnMajor, kAlign, float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      KernelSchedule>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>,
                                                      CollectiveMainloop, CollectiveEpilogue>;
  using Adapter = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  static typename Adapter::Arguments arguments(const void* x, const void* w, int m, int n, int k,
                                               typename Epi::Arguments const& epi,
                                               const GemmTuning& tuning = {}) {
    using StrideA = typename Adapter::GemmKernel::StrideA;
    using StrideB = typename Adapter::GemmKernel::StrideB;
    StrideA sa =
        cute::make_stride(static_cast<int64_t>(k), cute::Int<1>{}, static_cast<int64_t>(m) * k);
    StrideB sb =
        cute::make_stride(static_cast<int64_t>(k), cute::Int<1>{}, static_cast<int64_t>(n) * k);
    typename Adapter::Arguments args{
        cutlass::gemm::GemmUniversalMode::kGemm,
        {m, n, k, 1},
        {static_cast<const Element*>(x), sa, static_cast<const Element*>(w), sb},
        epi};
    apply_tuning(args, tuning);
    return args;
  }

  static size_t workspace(int m, int n, int k) {
    return Adapter::get_workspace_size(arguments(nullptr, nullptr, m, n, k, {}));
  }

  static Status run(const char* what, const void* x, const void* w, int m, int n, int k,
                    typename Epi::Arguments const& epi, const GemmTuning& tuning, void* ws,
                    size_t ws_bytes, cudaStream_t stream) {
    return run_adapter<Adapter>(what, arguments(x, w, m, n, k, epi, tuning), m, n, k, ws, ws_bytes,
                                stream);
  }
};

// The four tile configurations of one fused GEMM (gemm_cutlass.h GemmSchedule), picked per call.
template <class Coop, class CoopTall, class Ping, class PingNarrow>
struct Configs {
  static size_t workspace(int m, int n, int k) {
    return std::max({Coop::workspace(m, n, k), CoopTall::workspace(m, n, k),
                     Ping::workspace(m, n, k), PingNarrow::workspace(m, n, k)});
  }
  template <class Args>
  static Status run(const char* what, const void* x, const void* w, int m, int n, int k,
                    const Args& args, const GemmTuning& tuning, void* ws, size_t ws_bytes,
                    cudaStream_t stream) {
    switch (tuning.schedule) {
      case GemmSchedule::kCooperativeTall:
        return CoopTall::run(what, x, w, m, n, k, args, tuning, ws, ws_bytes, stream);
      case GemmSchedule::kPingpong:
        return Ping::run(what, x, w, m, n, k, args, tuning, ws, ws_bytes, stream);
      case GemmSchedule::kPingpongNarrow:
        return PingNarrow::run(what, x, w, m, n, k, args, tuning, ws, ws_bytes, stream);
      default:
        return Coop::run(what, x, w, m, n, k, args, tuning, ws, ws_bytes, stream);
    }
  }
};

inline bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

}  // namespace zimage::cuda::register_epilogue
