// Caching device allocator: see allocator.h and core/block_allocator.h for why and how.
#include "backend/cuda/runtime/allocator.h"

#include <cuda_runtime_api.h>

#include <chrono>
#include <string>
#include <utility>

#include "backend/cuda/runtime/capture_guard.h"
#include "backend/cuda/runtime/cuda_check.h"
#include "core/log.h"

namespace zimage::cuda {

// Storage for one block; hands the block back instead of freeing it.
class CudaStorage final : public Storage {
 public:
  CudaStorage(void* p, size_t bytes, std::shared_ptr<CachingAllocator> owner)
      : Storage(p, bytes, Device::kCUDA), owner_(std::move(owner)) {}
  ~CudaStorage() override { owner_->release(data_); }

 private:
  std::shared_ptr<CachingAllocator> owner_;
};

std::shared_ptr<CachingAllocator> CachingAllocator::create(int device,
                                                           BlockAllocatorOptions options) {
  return std::shared_ptr<CachingAllocator>(new CachingAllocator(device, options));
}

CachingAllocator::CachingAllocator(int device, BlockAllocatorOptions options) : device_(device) {
  auto segment_alloc = [this](size_t bytes) -> Result<void*> {
    const size_t limit = limit_.load();
    if (limit != 0 && held_.load() + bytes > limit) {
      return OutOfMemory("the memory budget allows " + std::to_string(limit >> 20) +
                         " MiB for the allocator, " + std::to_string(held_.load() >> 20) +
                         " MiB held");
    }
    void* p = nullptr;
    const auto t0 = std::chrono::steady_clock::now();
    // cuda_status maps cudaErrorMemoryAllocation to OutOfMemory (and clears it), which is what
    // makes the block allocator give idle segments back and retry.
    ZI_TRY(cuda_status(cudaMalloc(&p, bytes), "cudaMalloc"));
    held_ += bytes;
    if (log_level() >= LogLevel::kDebug) {  // what a first call's reservations cost (issue 24)
      const double ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (ms > 1.0) ZI_DEBUG("cudaMalloc of %.1f MiB took %.1f ms", bytes / 1048576.0, ms);
    }
    return p;
  };
  auto segment_free = [this](void* p, size_t bytes) -> Status {
    {
      std::lock_guard<std::mutex> sync_lock(device_sync_mutex());  // capture_guard.h
      ZI_TRY(cuda_status(cudaFree(p), "cudaFree"));
    }
    held_ -= bytes;
    return Status::Ok();
  };
  blocks_ = std::make_unique<BlockAllocator>(segment_alloc, segment_free, options);
}

CachingAllocator::~CachingAllocator() {
  // Every CudaStorage holds a reference to the allocator, so no block is in use any more.
  int prev = 0;
  const bool switch_device = cudaGetDevice(&prev) == cudaSuccess && prev != device_;
  if (switch_device) cudaSetDevice(device_);
  blocks_.reset();  // cudaFree of every segment
  if (switch_device) cudaSetDevice(prev);
}

Result<std::shared_ptr<Storage>> CachingAllocator::allocate(size_t bytes) {
  Result<void*> p = blocks_->allocate(bytes);
  if (!p.ok()) return p.status().with_context("cuda");
  return std::shared_ptr<Storage>(
      std::make_shared<CudaStorage>(p.value(), bytes, shared_from_this()));
}

void CachingAllocator::release(void* ptr) {
  // Cannot fail for a pointer from allocate(); a destructor has nobody to report to anyway.
  Status s = blocks_->deallocate(ptr);
  if (!s.ok()) ZI_ERROR("cuda allocator: %s", s.to_string().c_str());
}

Status CachingAllocator::empty_cache() {
  return blocks_->empty_cache();
}
Status CachingAllocator::trim_to_fixed_budget() {
  return blocks_->trim_to_fixed_budget();
}
Status CachingAllocator::begin_pool(PoolId id) {
  return blocks_->begin_pool(id);
}
Status CachingAllocator::end_pool() {
  return blocks_->end_pool();
}
Status CachingAllocator::release_pool(PoolId id) {
  return blocks_->release_pool(id);
}

AllocatorStats CachingAllocator::stats() const {
  const BlockAllocatorStats b = blocks_->stats();
  AllocatorStats s;
  s.in_use_bytes = b.in_use_bytes;
  s.peak_in_use_bytes = b.peak_in_use_bytes;
  s.reserved_bytes = b.reserved_bytes;
  s.peak_reserved_bytes = b.peak_reserved_bytes;
  s.num_device_mallocs = b.num_segment_allocs;
  s.num_device_frees = b.num_segment_frees;
  s.num_cache_hits = b.num_cache_hits;
  s.repeat_slack_bytes = b.repeat_slack_bytes;
  return s;
}

void CachingAllocator::reset_peak() {
  blocks_->reset_peak();
}

}  // namespace zimage::cuda
