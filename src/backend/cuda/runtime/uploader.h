// Host -> device copies of large tensors through pinned staging buffers (owned by CudaBackend).
//
// Why: weights are views of memory-mapped safetensors files. A plain cudaMemcpyAsync from such
// pageable memory is synchronous in practice (the driver copies through its own small pinned
// buffer, one piece at a time, on the calling thread), and reading the mapping faults its pages in
// on that one thread. Here the host copy from the mapping into a pinned buffer runs on several
// threads (parallel page faults), and the DMA from pinned memory is asynchronous, so the host
// fills the next buffer while the copy engine drains the previous one.
//
// Pipeline, per piece (upload_plan.h cuts uploads into pieces within a ring of buffers):
//   wait for the buffer's event (only when the ring comes back to a buffer) ->
//   parallel memcpy source -> pinned buffer -> cudaMemcpyAsync(buffer -> device) on the stream ->
//   record the buffer's event.
//
// Stream: the DMA goes on the backend's own stream, not a separate copy stream. The caching
// allocator (allocator.h) relies on a single stream: a block freed by the host may be handed out
// again at once because all work is queued in one order. A side stream writing a fresh block could
// overtake queued kernels that still read that block's previous tenant (concat_rows frees each
// uploaded part while its copy_2d is still queued), and later ops would need an event wait per
// upload. What the pipeline needs is only that copy() returns without waiting for the DMA, which
// the backend stream gives: host reads (the bottleneck) overlap the DMA of earlier pieces. During
// loading the only kernels on the stream are dtype conversions and row copies, so the copy engine
// has nothing to overlap with there anyway.
//
// Sizes: 4 buffers x 64 MiB (256 MiB pinned). 64 MiB keeps the per-piece overhead (an event
// query, a DMA launch, waking the copy threads: tens of microseconds) below 1% of the ~1.2 ms the
// H200 needs to DMA 64 MiB at 55 GB/s, and gives each of 16 threads 4 MiB per piece. The DMA is
// 2-5x faster than the host reads from page cache, so 2 buffers would already keep it fed; 4 let
// the host run ahead over a queued conversion kernel or a cudaMalloc for the next tensor.
// cudaHostAlloc of 256 MiB takes tens of milliseconds, paid once per load.
//
// Memory is allocated on the first copy of at least Options::start_bytes (a weight during
// loading), and freed by release() (CudaBackend::finish_uploads, at the end of loading) or the
// destructor. Smaller copies take the staged path only while the buffers exist, so the per-step
// uploads after loading (latents, a few MiB) never bring 256 MiB of pinned memory back. While
// the buffers exist, small copies (norm weights, biases) go through them too, packed into the
// ring: a pageable cudaMemcpyAsync "may synchronize with the stream" (CUDA's API sync notes),
// which would drain the pipeline at every small weight between two large ones. If cudaHostAlloc
// fails, one warning is logged and copies take the plain path.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "backend/cuda/runtime/locked_ranges.h"
#include "backend/cuda/runtime/pinned_host.h"
#include "backend/cuda/runtime/upload_plan.h"
#include "core/status.h"
#include "core/thread_pool.h"

namespace zimage::cuda {

class PinnedUploader {
 public:
  struct Options {
    size_t buffer_bytes = size_t{64} << 20;
    int buffers = 4;
    // Host copy threads including the caller; <= 0: the hardware threads, at most 16. Each
    // thread adds page-fault throughput, but memory bandwidth is shared, so beyond that threads
    // mostly add wake-up cost (CudaUploadPerf times 1 to 16).
    int threads = 0;
    size_t min_bytes = 0;                   // smaller copies always take the plain path
    size_t start_bytes = size_t{16} << 20;  // a copy this large allocates the staging buffers
    size_t grain = size_t{256} << 10;       // smallest slice one copy thread takes
  };

  struct Stats {
    uint64_t staged_copies = 0;
    uint64_t staged_bytes = 0;
    uint64_t plain_copies = 0;
    uint64_t plain_bytes = 0;
    uint64_t allocations = 0;    // times the staging buffers were allocated
    uint64_t locked_copies = 0;  // straight from a locked file range
    uint64_t locked_bytes = 0;
    uint64_t staged_downloads = 0;  // device -> host through the staging (download)
    uint64_t staged_download_bytes = 0;
  };

  // `stream` belongs to the backend on `device`; both must outlive the uploader.
  PinnedUploader(int device, cudaStream_t stream, Options options);
  PinnedUploader(int device, cudaStream_t stream) : PinnedUploader(device, stream, Options{}) {}
  ~PinnedUploader();
  PinnedUploader(const PinnedUploader&) = delete;
  PinnedUploader& operator=(const PinnedUploader&) = delete;

  // Copies `bytes` from host memory `src` (any kind: pageable, mapped, pinned) to device memory
  // `dst`, in stream order: work queued on the stream later sees the data. When copy() returns,
  // `src` has been read completely and may be overwritten or freed; only DMA out of the
  // uploader's own pinned buffers may still be in flight. The one exception: a source lying
  // inside a range of `set_locked_ranges` (a weight file's mapping, page-locked in place and
  // immutable) is handed to the DMA engine directly, which reads it after copy() returns; the
  // range's lock waits for the device before it is released.
  Status copy(void* dst, const void* src, size_t bytes);

  // Device -> host: copies `bytes` from device memory `src` (after the work queued on the stream)
  // into host memory `dst` and returns once `dst` holds them. Meant for large pageable
  // destinations while the staging exists (a load moving weights back to host memory: FP8 rows
  // quantised on the device, layers streamed under a budget): a cudaMemcpy into pageable memory
  // goes through the driver's small bounce buffer on one thread (a few GB/s, and the fresh
  // destination's page faults on that thread); here the DMA fills the staging buffers in turn
  // while the copy threads empty the previous ones into `dst`. Without staging (or under
  // capture), the plain cudaMemcpy path. Synchronises the stream first.
  Status download(void* dst, const void* src, size_t bytes);

  void set_locked_ranges(std::shared_ptr<const LockedRanges> ranges) {
    locked_ = std::move(ranges);
  }

  // Allocates the staging buffers and copy threads now rather than at the first large copy, so
  // that a load can have them ready before its first weight (page-locking 256 MiB costs
  // ~0.09 s on the H100's host, ~0.15 s on the H200's). Not an error when pinned memory is
  // refused: copies then take the plain path, as they would have.
  void prepare() noexcept {
    try {
      (void)ensure_staging();
    } catch (...) {  // its warning could not be allocated: copies take the plain path
    }
  }

  // Waits for the DMA still reading the staging buffers, then frees them and the copy threads.
  // The next copy of at least start_bytes allocates them again.
  Status release();

  bool has_staging() const { return staging_ != nullptr; }
  const Options& options() const { return opt_; }
  const Stats& stats() const { return stats_; }

 private:
  Status plain_copy(void* dst, const void* src, size_t bytes);
  Status staged_copy(void* dst, const void* src, size_t bytes);
  // Allocates the buffers, events and threads; false (after one warning) when pinned memory is
  // not available, and the caller takes the plain path.
  bool ensure_staging();
  void free_staging();

  int device_;
  cudaStream_t stream_;
  Options opt_;
  StageRing ring_;
  PinnedHost staging_mem_;            // buffers * buffer_bytes pinned bytes, one allocation
  uint8_t* staging_ = nullptr;        // its data
  std::vector<cudaEvent_t> events_;   // per buffer: recorded after each DMA out of it
  std::unique_ptr<ThreadPool> pool_;  // the host copy threads
  std::vector<StagePiece> pieces_;    // scratch for one copy's plan
  bool unavailable_ = false;          // pinned allocation failed; retried after release()
  std::shared_ptr<const LockedRanges> locked_;
  Stats stats_;
};

}  // namespace zimage::cuda
