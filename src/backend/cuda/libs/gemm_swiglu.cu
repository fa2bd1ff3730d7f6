// The bf16 GEMM with SwiGLU in its epilogue (gemm_cutlass.h cutlass_bf16_swiglu): CUTLASS 3.x's
// Hopper mainloop (TMA loads, warp-specialised wgmma) with an epilogue of ours. Its own unit so
// the two CUTLASS units compile in parallel.
#include "backend/cuda/libs/gemm_cutlass.h"

#if defined(ZIMAGE_WITH_CUTLASS)

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

namespace zimage::cuda {
namespace {

using namespace cute;

// ---- bf16 GEMM with SwiGLU in the epilogue ----------------------------------------------------
// y[m, j] = silu(x·w1[j]) · (x·w3[j]) for a w1|w3 weight whose rows are interleaved in blocks of
// kSwigluBlock: gate block t at rows [2·t·B, 2·t·B + B), up block t at [2·t·B + B, 2·(t+1)·B).
// An output tile of 2·B columns then holds a gate block and its up block, so every thread of the
// epilogue owns both sums of each of its outputs (below) and the [m, 2f] intermediate never
// reaches memory. Why not cuBLASLt: it has no epilogue that pairs two output columns.
namespace swiglu {

using ElementA = cutlass::bfloat16_t;  // x [m, k], row-major (K-major)
using ElementB = cutlass::bfloat16_t;  // w13 [2f, k], row-major: column-major k×2f (K-major)
using ElementOut = cutlass::bfloat16_t;
using ElementAcc = float;
using LayoutA = cutlass::layout::RowMajor;
using LayoutB = cutlass::layout::ColumnMajor;
constexpr int kAlign = 8;  // elements: 16 bytes
constexpr int kBlock = kSwigluBlock;

__device__ __forceinline__ float round_bf16(float v) {
  return static_cast<float>(cutlass::bfloat16_t(v));
}

// The collective epilogue (the interface of CUTLASS's DefaultEpilogue, run through its Sm90
// adapter as the NoSmemWarpSpecialized schedule does): each thread takes its accumulators
// straight from the registers. The wgmma accumulator layout per thread is ((2, 2, V), MMA_M,
// MMA_N): two adjacent columns, two rows 8 apart, V groups of 8 columns. With MMA_N = 1 and a
// 2·B wide tile, the group v + V/2 is 8·V/2 = B columns right of group v, which is where the up
// sum of the gate sum in group v lies. Roundings as the two-kernel path makes them (the GEMM's
// bf16 outputs, silu rounded to bf16, the product rounded once), so the two differ only in the
// GEMMs' order of summation.
template <int kTileM, int kTileN>
class SwigluEpilogue {
 public:
  using EpilogueSchedule = cutlass::gemm::EpilogueDefault;
  using DispatchPolicy = EpilogueSchedule;
  using ThreadEpilogueOp =
      cutlass::epilogue::thread::LinearCombination<ElementOut, 1, float, float>;
  using ElementOutput = ElementOut;
  using ElementAccumulator = float;
  using ElementCompute = float;
  using ElementScalar = float;
  using ElementC = void;
  using ElementD = ElementOut;
  using StrideC = cute::Stride<int64_t, cute::Int<1>, int64_t>;
  using StrideD = StrideC;
  using GmemElementC = ElementOut;
  using GmemTiledCopyC = void;
  using GmemTiledCopyD = void;
  static_assert(kTileN == 2 * kBlock, "a tile holds one gate block and its up block");

  struct SharedStorage {};
  using TensorStorage = SharedStorage;
  struct Arguments {
    ElementOut* ptr_D = nullptr;
    int64_t ld = 0;  // elements between rows of y (f for a packed y)
  };
  using Params = Arguments;

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
  template <class ProblemShape>
  static bool can_implement(ProblemShape const& problem_shape, Arguments const& args) {
    const auto n = cute::get<1>(problem_shape);
    return args.ptr_D != nullptr && n % kTileN == 0 && args.ld >= n / 2 && args.ld % 2 == 0;
  }

  CUTLASS_HOST_DEVICE
  SwigluEpilogue(Params const& params, SharedStorage const& = SharedStorage()) : params_(params) {}

  CUTLASS_DEVICE bool is_source_needed() { return false; }

  template <class ProblemShapeMNKL, class BlockShapeMNK, class BlockCoordMNKL, class FrgEngine,
            class FrgLayout, class TiledMma, class ResidueMNK>
  CUTLASS_DEVICE void operator()(ProblemShapeMNKL problem_shape_mnkl, BlockShapeMNK,
                                 BlockCoordMNKL blk_coord_mnkl,
                                 cute::Tensor<FrgEngine, FrgLayout> const& acc, TiledMma tiled_mma,
                                 ResidueMNK, int thread_idx, char*) {
    using namespace cute;
    static_assert(size<0>(BlockShapeMNK{}) == kTileM && size<1>(BlockShapeMNK{}) == kTileN);
    static_assert(rank(FrgLayout{}) == 3 && size<0, 0>(FrgLayout{}) == 2 &&
                      size<0, 1>(FrgLayout{}) == 2 && size<2>(FrgLayout{}) == 1,
                  "the wgmma accumulator layout ((2, 2, V), MMA_M, 1)");
    constexpr int V = size<0, 2>(FrgLayout{});
    static_assert(V * 8 == kTileN, "one MMA atom spans the tile's width");
    constexpr int MM = size<1>(FrgLayout{});

    const int m_blk = static_cast<int>(get<0>(blk_coord_mnkl));
    const int n_blk = static_cast<int>(get<1>(blk_coord_mnkl));
    const int rows_left = static_cast<int>(get<0>(problem_shape_mnkl)) - m_blk * kTileM;
    Tensor coords = make_identity_tensor(make_shape(Int<kTileM>{}, Int<kTileN>{}));
    Tensor tc = tiled_mma.get_thread_slice(thread_idx).partition_C(coords);
    ElementOut* out = params_.ptr_D + static_cast<int64_t>(m_blk) * kTileM * params_.ld +
                      static_cast<int64_t>(n_blk) * kBlock;
    CUTLASS_PRAGMA_UNROLL
    for (int mm = 0; mm < MM; ++mm) {
      CUTLASS_PRAGMA_UNROLL
      for (int r = 0; r < 2; ++r) {
        CUTLASS_PRAGMA_UNROLL
        for (int v = 0; v < V / 2; ++v) {
          const auto gate0 = make_coord(make_coord(0, r, v), mm, 0);
          const auto gate1 = make_coord(make_coord(1, r, v), mm, 0);
          const auto up0 = make_coord(make_coord(0, r, v + V / 2), mm, 0);
          const auto up1 = make_coord(make_coord(1, r, v + V / 2), mm, 0);
          const int row = get<0>(tc(gate0)), col = get<1>(tc(gate0));
          if (row >= rows_left) continue;
          const float g0 = round_bf16(acc(gate0)), g1 = round_bf16(acc(gate1));
          const float s0 = round_bf16(g0 / (1.0f + expf(-g0)));
          const float s1 = round_bf16(g1 / (1.0f + expf(-g1)));
          cutlass::Array<ElementOut, 2> pair;
          pair[0] = ElementOut(s0 * round_bf16(acc(up0)));
          pair[1] = ElementOut(s1 * round_bf16(acc(up1)));
          *reinterpret_cast<cutlass::Array<ElementOut, 2>*>(out + row * params_.ld + col) = pair;
        }
      }
    }
  }

 private:
  Params params_;
};

// Two schedules over the same 2·B-wide tiles: cooperative (two consumer warp groups split a
// 128×256 tile) and ping-pong (each consumer warp group owns a 64×256 tile; one's epilogue
// overlaps the other's MMAs). CudaOpsPerf.MatmulSwiglu times both.
struct Cooperative {
  using TileShape = Shape<_128, Int<2 * kBlock>, _64>;
  using ClusterShape = Shape<_2, _1, _1>;
  using KernelSchedule = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
};
struct Pingpong {
  using TileShape = Shape<_64, Int<2 * kBlock>, _64>;
  using ClusterShape = Shape<_2, _1, _1>;
  using KernelSchedule = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
};

template <class Config>
struct Swiglu {
  using TileShape = typename Config::TileShape;
  using Epi = SwigluEpilogue<size<0>(TileShape{}), size<1>(TileShape{})>;
  using CollectiveEpilogue =
      cutlass::epilogue::collective::detail::Sm90TmaWarpSpecializedAdapter<Epi>;
  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementA, LayoutA, kAlign, ElementB,
      LayoutB, kAlign, ElementAcc, TileShape, typename Config::ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      typename Config::KernelSchedule>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, CollectiveMainloop,
                                                      CollectiveEpilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  static typename Gemm::Arguments arguments(const void* x, const void* w13, void* y, int m, int n2,
                                            int k) {
    using StrideA = typename Gemm::GemmKernel::StrideA;
    using StrideB = typename Gemm::GemmKernel::StrideB;
    StrideA sa = make_stride(static_cast<int64_t>(k), Int<1>{}, static_cast<int64_t>(m) * k);
    StrideB sb = make_stride(static_cast<int64_t>(k), Int<1>{}, static_cast<int64_t>(n2) * k);
    return typename Gemm::Arguments{
        cutlass::gemm::GemmUniversalMode::kGemm,
        {m, n2, k, 1},
        {static_cast<const ElementA*>(x), sa, static_cast<const ElementB*>(w13), sb},
        {static_cast<ElementOut*>(y), static_cast<int64_t>(n2 / 2)}};
  }

  static size_t workspace(int m, int n2, int k) {
    return Gemm::get_workspace_size(arguments(nullptr, nullptr, nullptr, m, n2, k));
  }

  static Status run(const void* x, const void* w13, void* y, int m, int n2, int k, void* ws,
                    size_t ws_bytes, cudaStream_t stream) {
    const auto args = arguments(x, w13, y, m, n2, k);
    Gemm gemm;
    if (gemm.can_implement(args) != cutlass::Status::kSuccess)
      return Unsupported("CUTLASS SwiGLU GEMM: cannot implement " + std::to_string(m) + "x" +
                         std::to_string(n2) + "x" + std::to_string(k));
    if (Gemm::get_workspace_size(args) > ws_bytes)
      return InternalError("CUTLASS SwiGLU GEMM: workspace too small");
    cutlass::Status st = gemm.initialize(args, ws, stream);
    if (st == cutlass::Status::kSuccess) st = gemm.run(stream);
    if (st != cutlass::Status::kSuccess)
      return DeviceError(std::string("CUTLASS SwiGLU GEMM: ") + cutlassGetStatusString(st));
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
      return DeviceError(std::string("CUTLASS SwiGLU GEMM: ") + cudaGetErrorString(e));
    return Status::Ok();
  }
};

}  // namespace swiglu

bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

}  // namespace

size_t cutlass_bf16_swiglu_workspace(int64_t m, int64_t f, int64_t k) {
  if (m <= 0 || f <= 0 || k <= 0 || m > INT32_MAX || 2 * f > INT32_MAX || k > INT32_MAX) return 0;
  const int mi = static_cast<int>(m), ni = static_cast<int>(2 * f), ki = static_cast<int>(k);
  return std::max(swiglu::Swiglu<swiglu::Cooperative>::workspace(mi, ni, ki),
                  swiglu::Swiglu<swiglu::Pingpong>::workspace(mi, ni, ki));
}

Status cutlass_bf16_swiglu(const void* x, const void* w13, void* y, int64_t m, int64_t f, int64_t k,
                           void* workspace, size_t workspace_bytes, cudaStream_t stream,
                           SwigluSchedule schedule) {
  static const bool sm90 = cutlass_device_is_sm90();
  if (!sm90) return Unsupported("CUTLASS SwiGLU GEMM: the device is not sm_90");
  if (m <= 0 || f <= 0 || k <= 0 || m > INT32_MAX || 2 * f > INT32_MAX || k > INT32_MAX ||
      f % kSwigluBlock != 0 || k % 8 != 0)
    return Unsupported("CUTLASS SwiGLU GEMM: shape m " + std::to_string(m) + ", f " +
                       std::to_string(f) + ", k " + std::to_string(k) + " (needs f % " +
                       std::to_string(kSwigluBlock) + " == 0, k % 8 == 0)");
  if (!aligned16(x) || !aligned16(w13) || !aligned16(y))
    return Unsupported("CUTLASS SwiGLU GEMM: operands not 16-byte aligned");
  const int mi = static_cast<int>(m), ni = static_cast<int>(2 * f), ki = static_cast<int>(k);
  if (schedule == SwigluSchedule::kPingpong)
    return swiglu::Swiglu<swiglu::Pingpong>::run(x, w13, y, mi, ni, ki, workspace, workspace_bytes,
                                                 stream);
  return swiglu::Swiglu<swiglu::Cooperative>::run(x, w13, y, mi, ni, ki, workspace, workspace_bytes,
                                                  stream);
}

}  // namespace zimage::cuda

#else  // !ZIMAGE_WITH_CUTLASS

namespace zimage::cuda {

size_t cutlass_bf16_swiglu_workspace(int64_t, int64_t, int64_t) {
  return 0;
}

Status cutlass_bf16_swiglu(const void*, const void*, void*, int64_t, int64_t, int64_t, void*,
                           size_t, cudaStream_t, SwigluSchedule) {
  return Unsupported("this build has no CUTLASS kernels (run scripts/setup.sh, target sm_90a)");
}

}  // namespace zimage::cuda

#endif
