// CUTLASS 3.x GEMMs for Hopper (gemm_cutlass.h). Why not cuBLASLt: cuBLAS 13.0 has no sm_90
// algorithm for FP8 with a scale per row of each operand ("outer vector" scaling; measured on the
// H200), and its per-tensor FP8 GEMM followed by a scaling pass reads and writes every output once
// more (about a fifth of the DiT's FP8 GEMM time). CUTLASS builds the same class of kernel (TMA,
// warp-specialised wgmma) with the scales folded into its epilogue, which is what a kept GEMM
// library is for; nothing here is a hand-written GEMM.
#include "backend/cuda/libs/gemm_cutlass.h"

#if defined(ZIMAGE_WITH_CUTLASS)

#include <algorithm>
#include <string>

#include "backend/cuda/libs/gemm_fp8_rows.cuh"

namespace zimage::cuda {

bool cutlass_device_is_sm90() {
  int dev = 0, major = 0, minor = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return false;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess)
    return false;
  return major == 9 && minor == 0;
}

namespace {

bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

}  // namespace

bool cutlass_available() {
  return true;
}

size_t cutlass_fp8_rows_workspace(int64_t m, int64_t n, int64_t k) {
  if (m <= 0 || n <= 0 || k <= 0 || m > INT32_MAX || n > INT32_MAX || k > INT32_MAX) return 0;
  const int mi = static_cast<int>(m), ni = static_cast<int>(n), ki = static_cast<int>(k);
  return std::max({fp8rows::Fp8Rows<fp8rows::Accurate>::workspace(mi, ni, ki),
                   fp8rows::Fp8Rows<fp8rows::Fast>::workspace(mi, ni, ki),
                   detail::cutlass_fp8_tiles_workspace(mi, ni, ki)});
}

Status cutlass_fp8_rows(const void* x8, const void* w8, const float* sx, const float* sw,
                        const void* bias, void* y, int64_t m, int64_t n, int64_t k, void* workspace,
                        size_t workspace_bytes, cudaStream_t stream, bool fast_accum, Fp8Tile tile,
                        const GemmOrder& order) {
  static const bool sm90 = cutlass_device_is_sm90();
  if (!sm90) return Unsupported("CUTLASS FP8 GEMM: the device is not sm_90");
  if (m <= 0 || n <= 0 || k <= 0 || m > INT32_MAX || n > INT32_MAX || k > INT32_MAX ||
      k % 16 != 0 || n % 8 != 0)
    return Unsupported("CUTLASS FP8 GEMM: shape " + std::to_string(m) + "x" + std::to_string(n) +
                       "x" + std::to_string(k) + " (needs k % 16 == 0, n % 8 == 0)");
  if (!aligned16(x8) || !aligned16(w8) || !aligned16(y) || (bias && !aligned16(bias)) ||
      (reinterpret_cast<uintptr_t>(sx) & 3u) || (reinterpret_cast<uintptr_t>(sw) & 15u))
    return Unsupported("CUTLASS FP8 GEMM: operands not 16-byte aligned");
  const int mi = static_cast<int>(m), ni = static_cast<int>(n), ki = static_cast<int>(k);
  if (!fast_accum)
    return fp8rows::Fp8Rows<fp8rows::Accurate>::run(x8, w8, sx, sw, bias, y, mi, ni, ki, workspace,
                                                    workspace_bytes, stream, order);
  if (tile == Fp8Tile::kAuto) tile = fp8_tile_for(m, n, k);
  if (tile == Fp8Tile::kAutoWaves) {
    int device = 0, sms = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess)
      return DeviceError("CUTLASS FP8 GEMM: the device's multiprocessor count could not be read");
    tile = fp8_tile_by_waves(m, n, k, sms);
  }
  if (tile != Fp8Tile::kPingpong128)
    return detail::cutlass_fp8_rows_tile(tile, x8, w8, sx, sw, bias, y, mi, ni, ki, workspace,
                                         workspace_bytes, stream, order);
  return fp8rows::Fp8Rows<fp8rows::Fast>::run(x8, w8, sx, sw, bias, y, mi, ni, ki, workspace,
                                              workspace_bytes, stream, order);
}

}  // namespace zimage::cuda

#else  // !ZIMAGE_WITH_CUTLASS

namespace zimage::cuda {

bool cutlass_available() {
  return false;
}

bool cutlass_device_is_sm90() {
  return false;
}

size_t cutlass_fp8_rows_workspace(int64_t, int64_t, int64_t) {
  return 0;
}

Status cutlass_fp8_rows(const void*, const void*, const float*, const float*, const void*, void*,
                        int64_t, int64_t, int64_t, void*, size_t, cudaStream_t, bool, Fp8Tile,
                        const GemmOrder&) {
  return Unsupported("this build has no CUTLASS kernels (run scripts/setup.sh, target sm_90a)");
}

}  // namespace zimage::cuda

#endif
