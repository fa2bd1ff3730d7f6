// A plain bf16 GEMM through CUTLASS (gemm_cutlass.h cutlass_bf16_gemm): the same mainloops as the
// fused GEMMs (gemm_swiglu.cu, gemm_qkv.cu: TMA loads, warp-specialised wgmma, 2×1 clusters, a
// persistent scheduler, the same four tile configurations) with CUTLASS's own epilogue, which
// stages each tile through shared memory and stores it with TMA. It is a measuring stick, not a
// path the engine takes: set beside cuBLASLt's kernel and the fused GEMMs in CudaOpsPerf, it says
// whether the fused GEMMs lose to cuBLASLt in the mainloop or in our register epilogue. (The
// larger 256 × 192 tile, which the library can run, is gemm_bf16_tiles.cu's.)
#include "backend/cuda/libs/gemm_cutlass.h"

#if defined(ZIMAGE_WITH_CUTLASS)

#include <algorithm>
#include <string>

#include "backend/cuda/libs/gemm_plain.cuh"

namespace zimage::cuda {
namespace {

using namespace plain_gemm;
using Cooperative = Plain<Shape<_128, _256, _64>, CoopSched, CoopEpi>;
using CooperativeTall = Plain<Shape<_256, _128, _64>, CoopSched, CoopEpi>;
using Pingpong = Plain<Shape<_64, _256, _64>, PingSched, PingEpi>;
using PingpongNarrow = Plain<Shape<_128, _128, _64>, PingSched, PingEpi>;

}  // namespace

size_t cutlass_bf16_gemm_workspace(int64_t m, int64_t n, int64_t k) {
  if (!fits(m, n, k)) return 0;
  const int mi = static_cast<int>(m), ni = static_cast<int>(n), ki = static_cast<int>(k);
  return std::max({Cooperative::workspace(mi, ni, ki), CooperativeTall::workspace(mi, ni, ki),
                   Pingpong::workspace(mi, ni, ki), PingpongNarrow::workspace(mi, ni, ki)});
}

Status cutlass_bf16_gemm(const void* x, const void* w, void* y, int64_t m, int64_t n, int64_t k,
                         void* workspace, size_t workspace_bytes, cudaStream_t stream,
                         const GemmTuning& tuning) {
  ZI_TRY(check_plain(x, w, y, m, n, k));
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

}  // namespace zimage::cuda

#endif
