// A plain bf16 GEMM y[m, n] = x[m, k] · w[n, k]ᵀ through CUTLASS 3.x's Hopper collectives with
// CUTLASS's own epilogue (TMA loads, warp-specialised wgmma mainloop, a persistent scheduler, the
// tile staged through shared memory and stored with TMA), in the tile and cluster given: shared by
// gemm_plain.cu (the test program's measuring stick) and gemm_bf16_tiles.cu (the library's
// ZIMAGE_BF16_GEMM path). Included by the sm_90a CUTLASS units only.
#pragma once

#include <cutlass/cutlass.h>
#include <cutlass/gemm/device/gemm_universal_adapter.h>

#include <cute/tensor.hpp>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/dispatch_policy.hpp>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <string>

#include "backend/cuda/libs/cutlass_register_epilogue.cuh"

namespace zimage::cuda::plain_gemm {

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

// Whether a plain GEMM can take the problem: the device, the shape (int32 extents, n and k
// multiples of 8 for the 16-byte TMA rows) and 16-byte aligned operands; kUnsupported names what
// is not so.
inline bool fits(int64_t m, int64_t n, int64_t k) {
  return m > 0 && n > 0 && k > 0 && m <= INT32_MAX && n <= INT32_MAX && k <= INT32_MAX &&
         n % 8 == 0 && k % 8 == 0;
}
inline Status check_plain(const void* x, const void* w, const void* y, int64_t m, int64_t n,
                          int64_t k) {
  static const bool sm90 = cutlass_device_is_sm90();
  if (!sm90) return Unsupported("CUTLASS bf16 GEMM: the device is not sm_90");
  if (!fits(m, n, k))
    return Unsupported("CUTLASS bf16 GEMM: shape " + std::to_string(m) + "x" + std::to_string(n) +
                       "x" + std::to_string(k) + " (needs n % 8 == 0, k % 8 == 0)");
  using register_epilogue::aligned16;
  if (!aligned16(x) || !aligned16(w) || !aligned16(y))
    return Unsupported("CUTLASS bf16 GEMM: operands not 16-byte aligned");
  return Status::Ok();
}

using CoopSched = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
using PingSched = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
using CoopEpi = cutlass::epilogue::TmaWarpSpecializedCooperative;
using PingEpi = cutlass::epilogue::TmaWarpSpecialized;

}  // namespace zimage::cuda::plain_gemm
