// The CUDA backend's caching device allocator: core/block_allocator.h (best-fit blocks carved
// from cudaMalloc'd segments, split and merged, idle segments given back at a change of phase so
// the memory held stays close to the memory in live tensors, private pools for graph capture)
// with cudaMalloc/cudaFree as the segment source. See block_allocator.h for the policy.
//
// Why cache at all: cudaMalloc/cudaFree synchronise the device and cannot be captured into a CUDA
// graph, so freed blocks are kept and handed out again; in a steady state (the same sequence of
// shapes every DiT step) no cudaMalloc or cudaFree runs.
//
// Stream order: every op runs on the backend's single stream, so a block freed by the host while
// kernels that read it are still queued can only be reused by work queued later on the same
// stream, which runs after them. (Giving a segment back with cudaFree waits for the device.)
//
// Graph capture: cudaFree is not allowed while a stream is being captured (it synchronises), so
// empty_cache() must not run during capture, and allocations made during capture should happen
// inside a private pool (begin_pool/end_pool around the capture): there the allocator never
// calls cudaFree, and the captured addresses are never handed to allocations outside the pool,
// so the graph can be replayed while other code allocates. release_pool() once the graph is
// destroyed. (Outside a pool, a capture-time miss could give an idle segment back with cudaFree,
// which would invalidate the capture; warm-up runs before capture avoid misses.)
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "core/block_allocator.h"
#include "core/status.h"
#include "core/tensor.h"

namespace zimage::cuda {

struct AllocatorStats {
  size_t in_use_bytes = 0;         // held by live tensors (512-byte rounded blocks)
  size_t peak_in_use_bytes = 0;    // high-water mark of in_use_bytes since the last reset
  size_t reserved_bytes = 0;       // obtained from cudaMalloc: in use + cached
  size_t peak_reserved_bytes = 0;  // high-water mark of reserved_bytes since the last reset
  uint64_t num_device_mallocs = 0;
  uint64_t num_device_frees = 0;
  uint64_t num_cache_hits = 0;
  size_t repeat_slack_bytes = 0;  // what churn added to the budget (core/block_allocator.h)
};

class CachingAllocator : public std::enable_shared_from_this<CachingAllocator> {
 public:
  // For `device`, which must be the current device whenever the allocator is used (the backend
  // makes it current once; the destructor switches to it to free the segments).
  static std::shared_ptr<CachingAllocator> create(int device, BlockAllocatorOptions options = {});
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // The block size a request of `bytes` is served from (>= bytes, 512-byte multiple).
  static size_t round_size(size_t bytes) { return BlockAllocator::round_size(bytes); }

  // A block of at least `bytes` as Storage; the block returns to the cache (to its pool) when
  // the last Tensor holding the storage goes away. OutOfMemory (with the bytes requested, in
  // use and reserved) after giving idle segments back and retrying.
  Result<std::shared_ptr<Storage>> allocate(size_t bytes);

  // Gives every idle segment back with cudaFree. Not allowed during graph capture; refused while
  // a private pool is active.
  Status empty_cache();
  // BlockAllocator::trim_to_fixed_budget: idle segments back down to the budget without what
  // repeated work added. Not allowed during graph capture.
  Status trim_to_fixed_budget();

  // Private pools for graph capture; see block_allocator.h.
  Status begin_pool(PoolId id);
  Status end_pool();
  Status release_pool(PoolId id);

  AllocatorStats stats() const;
  void reset_peak();
  // At most `bytes` obtained from the driver (0 = no limit): a request that would go beyond it
  // first gets idle segments given back, then fails with OutOfMemory.
  void set_limit(size_t bytes) {
    limit_ = bytes;
    blocks_->set_held_limit(bytes);
  }
  size_t limit() const { return limit_.load(); }

 private:
  friend class CudaStorage;
  CachingAllocator(int device, BlockAllocatorOptions options);
  void release(void* ptr);

  int device_;
  std::atomic<size_t> limit_{0};
  std::atomic<size_t> held_{0};  // bytes in segments from cudaMalloc
  std::unique_ptr<BlockAllocator> blocks_;
};

}  // namespace zimage::cuda
