// The host side of the persistent row kernels (row_pipeline.cuh): the resident grid, cached, and
// the process-wide switch.
#include <atomic>
#include <map>
#include <mutex>
#include <tuple>

#include "backend/cuda/kernels/row_pipeline.cuh"

namespace zimage::cuda {

namespace {
std::atomic<bool> g_pipelined_rows{true};
}  // namespace

void set_pipelined_row_kernels(bool on) {
  g_pipelined_rows.store(on);
}
bool pipelined_row_kernels() {
  return g_pipelined_rows.load();
}

int64_t resident_blocks(const void* kernel, int threads, size_t smem) {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  using Key = std::tuple<const void*, int, size_t, int>;
  static std::mutex mu;
  static std::map<Key, int64_t> known;
  const Key key{kernel, threads, smem, dev};
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = known.find(key); it != known.end()) return it->second;
  int sms = 0, per_sm = 0;
  bool ok = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess;
  if (ok && smem > 48 * 1024)
    ok = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              static_cast<int>(smem)) == cudaSuccess;
  if (ok)
    ok = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem) ==
         cudaSuccess;
  if (!ok) {
    (void)cudaGetLastError();  // the caller takes its other kernel; nothing is left pending
    per_sm = 0;
  }
  const int64_t blocks = int64_t{per_sm} * sms;
  known.emplace(key, blocks);
  return blocks;
}

}  // namespace zimage::cuda
