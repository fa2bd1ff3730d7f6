// A plain bf16 GEMM through CUTLASS (gemm_cutlass.h cutlass_bf16_gemm): the same mainloops as the
// fused GEMMs (gemm_swiglu.cu, gemm_qkv.cu: TMA loads, warp-specialised wgmma, 2×1 clusters, a
// persistent scheduler, the same four tile configurations) with CUTLASS's own epilogue, which
// stages each tile through shared memory and stores it with TMA. It is a measuring stick, not a
// path the engine takes: set beside cuBLASLt's kernel and the fused GEMMs in CudaOpsPerf, it says
// whether the fused GEMMs lose to cuBLASLt in the mainloop or in our register epilogue.
#include "backend/cuda/libs/gemm_cutlass.h"

#if defined(ZIMAGE_WITH_CUTLASS)

#include <cutlass/cutlass.h>
#include <cutlass/gemm/device/gemm_universal_adapter.h>

#include <algorithm>
#include <cute/tensor.hpp>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/dispatch_policy.hpp>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <string>

#include "backend/cuda/libs/cutlass_register_epilogue.cuh"

namespace zimage::cuda {
namespace {

using namespace cute;
using Bf16 = cutlass::bfloat16_t;

template <class TileShape, class KernelSchedule, class EpilogueSchedule,
          class ClusterShape = Shape<_2, _1, _1>>
struct Plain {
  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void,
      cutlass::layout::RowMajor, 8, Bf16, cutlass::layout::RowMajor, 8,
      EpilogueSchedule>::CollectiveOp;
  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Bf16, cutlass::layout::RowMajor, 8, Bf16,
      cutlass::layout::ColumnMajor, 8, float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      KernelSchedule>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, CollectiveMainloop,
                                                      CollectiveEpilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  static typename Gemm::Arguments arguments(const void* x, const void* w, void* y, int m, int n,
                                            int k, const GemmTuning& tuning) {
    using StrideA = typename Gemm::GemmKernel::StrideA;
    using StrideB = typename Gemm::GemmKernel::StrideB;
    using StrideC = typename Gemm::GemmKernel::StrideC;
    using StrideD = typename Gemm::GemmKernel::StrideD;
    StrideA sa = make_stride(static_cast<int64_t>(k), Int<1>{}, static_cast<int64_t>(m) * k);
    StrideB sb = make_stride(static_cast<int64_t>(k), Int<1>{}, static_cast<int64_t>(n) * k);
    StrideD sd = make_stride(static_cast<int64_t>(n), Int<1>{}, static_cast<int64_t>(m) * n);
    typename Gemm::Arguments args{
        cutlass::gemm::GemmUniversalMode::kGemm,
        {m, n, k, 1},
        {static_cast<const Bf16*>(x), sa, static_cast<const Bf16*>(w), sb},
        {{1.f, 0.f}, nullptr, StrideC{}, static_cast<Bf16*>(y), sd}};
    register_epilogue::apply_tuning(args, tuning);
    return args;
  }

  static size_t workspace(int m, int n, int k) {
    return Gemm::get_workspace_size(arguments(nullptr, nullptr, nullptr, m, n, k, {}));
  }

  static Status run(const void* x, const void* w, void* y, int m, int n, int k,
                    const GemmTuning& tuning, void* ws, size_t ws_bytes, cudaStream_t stream) {
    return register_epilogue::run_adapter<Gemm>(
        "CUTLASS bf16 GEMM", arguments(x, w, y, m, n, k, tuning), m, n, k, ws, ws_bytes, stream);
  }
};

using CoopSched = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
using PingSched = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
using CoopEpi = cutlass::epilogue::TmaWarpSpecializedCooperative;
using PingEpi = cutlass::epilogue::TmaWarpSpecialized;
using Cooperative = Plain<Shape<_128, _256, _64>, CoopSched, CoopEpi>;
using CooperativeTall = Plain<Shape<_256, _128, _64>, CoopSched, CoopEpi>;
using Pingpong = Plain<Shape<_64, _256, _64>, PingSched, PingEpi>;
using PingpongNarrow = Plain<Shape<_128, _128, _64>, PingSched, PingEpi>;
// A larger tile (PlainTile): each warp group holds 128 × 192 fp32 sums (192 registers a thread),
// and a tile loads (256 + 192) × 64 operand elements for 256 · 192 · 64 products, 12 % less than
// cuBLASLt's 192 × 192 and 22 % less than 128 × 256. Session 24 (CudaOpsPerf.MatmulLargeTiles, an
// H100, back to back) measured it at 0.90-1.01× cuBLASLt's rate over the DiT's eight shapes with
// 1 × 2 clusters; with 2 × 1 clusters, and computing yᵀ = w · xᵀ instead (the wave quantisation on
// the weights' side), at 0.83-0.96×. Only the 1 × 2 form is kept, as the measuring stick.
using Coop256x192 = Plain<Shape<_256, _192, _64>, CoopSched, CoopEpi, Shape<_1, _2, _1>>;

bool fits(int64_t m, int64_t n, int64_t k) {
  return m > 0 && n > 0 && k > 0 && m <= INT32_MAX && n <= INT32_MAX && k <= INT32_MAX &&
         n % 8 == 0 && k % 8 == 0;
}

}  // namespace

size_t cutlass_bf16_gemm_workspace(int64_t m, int64_t n, int64_t k) {
  if (!fits(m, n, k)) return 0;
  const int mi = static_cast<int>(m), ni = static_cast<int>(n), ki = static_cast<int>(k);
  return std::max({Cooperative::workspace(mi, ni, ki), CooperativeTall::workspace(mi, ni, ki),
                   Pingpong::workspace(mi, ni, ki), PingpongNarrow::workspace(mi, ni, ki),
                   Coop256x192::workspace(mi, ni, ki)});
}

Status cutlass_bf16_gemm_tile(PlainTile tile, const void* x, const void* w, void* y, int64_t m,
                              int64_t n, int64_t k, void* workspace, size_t workspace_bytes,
                              cudaStream_t stream) {
  static const bool sm90 = cutlass_device_is_sm90();
  if (!sm90) return Unsupported("CUTLASS bf16 GEMM: the device is not sm_90");
  if (!fits(m, n, k))
    return Unsupported("CUTLASS bf16 GEMM: shape " + std::to_string(m) + "x" + std::to_string(n) +
                       "x" + std::to_string(k) + " (needs n % 8 == 0, k % 8 == 0)");
  using register_epilogue::aligned16;
  if (!aligned16(x) || !aligned16(w) || !aligned16(y))
    return Unsupported("CUTLASS bf16 GEMM: operands not 16-byte aligned");
  const int mi = static_cast<int>(m), ni = static_cast<int>(n), ki = static_cast<int>(k);
  switch (tile) {
    case PlainTile::kCoop256x192:
      return Coop256x192::run(x, w, y, mi, ni, ki, {}, workspace, workspace_bytes, stream);
  }
  return InvalidArgument("CUTLASS bf16 GEMM: unknown tile");
}

Status cutlass_bf16_gemm(const void* x, const void* w, void* y, int64_t m, int64_t n, int64_t k,
                         void* workspace, size_t workspace_bytes, cudaStream_t stream,
                         const GemmTuning& tuning) {
  static const bool sm90 = cutlass_device_is_sm90();
  if (!sm90) return Unsupported("CUTLASS bf16 GEMM: the device is not sm_90");
  if (!fits(m, n, k))
    return Unsupported("CUTLASS bf16 GEMM: shape " + std::to_string(m) + "x" + std::to_string(n) +
                       "x" + std::to_string(k) + " (needs n % 8 == 0, k % 8 == 0)");
  using register_epilogue::aligned16;
  if (!aligned16(x) || !aligned16(w) || !aligned16(y))
    return Unsupported("CUTLASS bf16 GEMM: operands not 16-byte aligned");
  const int mi = static_cast<int>(m), ni = static_cast<int>(n), ki = static_cast<int>(k);
  switch (tuning.schedule) {
    case GemmSchedule::kCooperativeTall:
      return CooperativeTall::run(x, w, y, mi, ni, ki, tuning, workspace, workspace_bytes, stream);
    case GemmSchedule::kPingpong:
      return Pingpong::run(x, w, y, mi, ni, ki, tuning, workspace, workspace_bytes, stream);
    case GemmSchedule::kPingpongNarrow:
      return PingpongNarrow::run(x, w, y, mi, ni, ki, tuning, workspace, workspace_bytes, stream);
    default:
      return Cooperative::run(x, w, y, mi, ni, ki, tuning, workspace, workspace_bytes, stream);
  }
}

}  // namespace zimage::cuda

#else  // !ZIMAGE_WITH_CUTLASS

namespace zimage::cuda {

size_t cutlass_bf16_gemm_workspace(int64_t, int64_t, int64_t) {
  return 0;
}

Status cutlass_bf16_gemm(const void*, const void*, void*, int64_t, int64_t, int64_t, void*, size_t,
                         cudaStream_t, const GemmTuning&) {
  return Unsupported("this build has no CUTLASS kernels (run scripts/setup.sh, target sm_90a)");
}

Status cutlass_bf16_gemm_tile(PlainTile, const void*, const void*, void*, int64_t, int64_t, int64_t,
                              void*, size_t, cudaStream_t) {
  return Unsupported("this build has no CUTLASS kernels (run scripts/setup.sh, target sm_90a)");
}

}  // namespace zimage::cuda

#endif
