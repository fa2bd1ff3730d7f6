// A caching device allocator. cudaMalloc/cudaFree synchronise the device and cannot be captured
// into a CUDA graph, so freed blocks go back to per-size-class free lists and are handed out again;
// cudaMalloc runs only on a miss, and in a steady state (the same sequence of shapes every DiT
// step) never. Memory is returned in stream order: every op runs on the backend's single stream,
// so a block freed by the host while kernels that read it are still queued can only be reused by
// work queued later on the same stream.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"

namespace zimage::cuda {

struct AllocatorStats {
  size_t in_use_bytes = 0;       // held by live tensors (size-class rounded)
  size_t peak_in_use_bytes = 0;  // high-water mark of in_use_bytes since the last reset
  size_t reserved_bytes = 0;     // obtained from cudaMalloc: in use + cached
  uint64_t num_device_mallocs = 0;
  uint64_t num_cache_hits = 0;
};

class CachingAllocator : public std::enable_shared_from_this<CachingAllocator> {
 public:
  static std::shared_ptr<CachingAllocator> create(int device);
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // The size class a request of `bytes` is served from (>= bytes, 512-byte multiple).
  static size_t round_size(size_t bytes);

  // A block of at least `bytes` as Storage; the block returns to the cache when the last
  // Tensor holding the storage goes away. OutOfMemory after emptying the cache and retrying.
  Result<std::shared_ptr<Storage>> allocate(size_t bytes);

  // Frees every cached (unused) block with cudaFree. Not allowed during graph capture.
  Status empty_cache();

  AllocatorStats stats() const;
  void reset_peak();

 private:
  friend class CudaStorage;
  explicit CachingAllocator(int device) : device_(device) {}
  void release(void* ptr, size_t rounded);
  Status empty_cache_locked();

  int device_;
  mutable std::mutex mu_;
  std::map<size_t, std::vector<void*>> free_;  // size class -> cached blocks
  AllocatorStats stats_;
};

}  // namespace zimage::cuda
