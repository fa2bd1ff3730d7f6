// Page-locked staging for weight streaming (Backend::stream_in) from ordinary host memory: views
// of the memory-mapped weight files (a block streamed from the files, WeightPlacement::
// stream_from_files) and host copies over the host-memory limit.
//
// Why: a cudaMemcpyAsync from pageable memory is synchronous in practice (the driver copies
// through its own small pinned buffer on the calling thread, one piece at a time, and reading a
// file mapping faults its pages in on that one thread). Here several threads copy the host bytes
// into a page-locked buffer and each piece's DMA is queued on the copy stream as soon as it is in,
// so the disk cache is read in parallel and the DMA of one piece overlaps the copy of the next.
//
// One buffer per stream slot, as large as the slot's largest staged unit (a DiT block in bf16:
// ~0.35 GB; two slots per model): a slot's buffer is refilled only for the slot's next unit,
// whose copy into the device waits for the compute that last read the slot anyway, so the host
// waits (for the previous DMA out of the buffer) only when the link, not the host, is behind. A
// ring smaller than a unit would make the host wait for the slot's compute instead, and the
// compute thread could not queue the next block meanwhile. The buffers live as long as the
// backend; pinned_bytes() reports them (the memory plan counts them).
//
// If page-locked memory cannot be had, one warning is logged and copies take the driver's path.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <future>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "backend/cuda/runtime/pinned_host.h"
#include "core/status.h"
#include "core/thread_pool.h"

namespace zimage::cuda {

class SlotStager {
 public:
  struct Copy {
    void* dst = nullptr;        // device
    const void* src = nullptr;  // host, ordinary memory
    size_t bytes = 0;
  };
  // `slots` buffers; `threads` host copy threads including the caller (<= 0: the hardware
  // threads, at most 16); `piece` bytes per queued DMA.
  SlotStager(int device, int slots, int threads = 0, size_t piece = size_t{16} << 20);
  ~SlotStager();
  SlotStager(const SlotStager&) = delete;
  SlotStager& operator=(const SlotStager&) = delete;

  // Queues `copies` for `slot` on `stream` (in stream order after what is queued there). Returns
  // once every host byte has been read.
  Status copy(int slot, const std::vector<Copy>& copies, cudaStream_t stream);

  uint64_t pinned_bytes() const;

  // Page-locks `slot`'s buffer for copies of up to `bytes` on a thread of its own (a load knows
  // the largest unit before the first copy; cudaHostAlloc costs ~0.3-0.6 s a GiB), without
  // waiting: requests queue for that one thread. copy() and pinned_bytes() wait for them.
  // Without a thread to spare, it is done here. Failure is not an error: copy() then allocates
  // (or falls back) as before.
  void prepare(int slot, size_t bytes) noexcept;

 private:
  struct Buffer {
    PinnedHost mem;
    uint8_t* data = nullptr;  // mem's
    size_t bytes = 0;
    cudaEvent_t done = nullptr;  // recorded after the last DMA out of the buffer
  };
  // A buffer of at least `bytes` for `slot` (the old one freed once its DMA is done); false when
  // page-locked memory is not available.
  Result<bool> reserve(Buffer& b, size_t bytes);
  // Waits until no prepare() request for `slot` (-1: for any slot) is queued or running.
  void wait_prepared(int slot) const;
  // Waits for prepare()'s requests and joins its thread.
  void join_prepared() const;

  int device_;
  int threads_;
  size_t piece_;
  std::vector<Buffer> buffers_;
  std::unique_ptr<ThreadPool> pool_;
  // cudaHostAlloc failed: the driver's path from then on (prepare()'s thread may set it).
  std::atomic<bool> unavailable_{false};
  // prepare()'s requests and the thread working through them (running while `preparing_`).
  mutable std::mutex prepare_mu_;
  mutable std::condition_variable prepare_cv_;
  std::vector<std::pair<int, size_t>> requests_;
  std::vector<int> pending_;  // per slot: its requests queued or running
  bool preparing_ = false;
  mutable std::future<void> prepared_;
};

}  // namespace zimage::cuda
