// Caching device allocator: see allocator.h for why it exists and what it guarantees.
#include "backend/cuda/allocator.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <string>

#include "backend/cuda/cuda_check.h"

namespace zimage::cuda {

// Storage for one cached block; hands the block back instead of freeing it.
class CudaStorage final : public Storage {
 public:
  CudaStorage(void* p, size_t bytes, size_t rounded, std::shared_ptr<CachingAllocator> owner)
      : Storage(p, bytes, Device::kCUDA), rounded_(rounded), owner_(std::move(owner)) {}
  ~CudaStorage() override { owner_->release(data_, rounded_); }

 private:
  size_t rounded_;
  std::shared_ptr<CachingAllocator> owner_;
};

std::shared_ptr<CachingAllocator> CachingAllocator::create(int device) {
  return std::shared_ptr<CachingAllocator>(new CachingAllocator(device));
}

CachingAllocator::~CachingAllocator() {
  std::lock_guard<std::mutex> lock(mu_);
  int prev = 0;
  cudaGetDevice(&prev);
  cudaSetDevice(device_);
  for (auto& [size, blocks] : free_)
    for (void* p : blocks) cudaFree(p);
  free_.clear();
  cudaSetDevice(prev);
}

size_t CachingAllocator::round_size(size_t bytes) {
  constexpr size_t kSmall = size_t{1} << 20;
  if (bytes == 0) bytes = 1;
  if (bytes < kSmall) return (bytes + 511) / 512 * 512;
  // Eight classes per power of two: at most 12.5% rounding waste for large blocks.
  size_t pow2 = size_t{1} << (63 - __builtin_clzll(static_cast<unsigned long long>(bytes)));
  const size_t step = pow2 / 8;
  return (bytes + step - 1) / step * step;
}

Result<std::shared_ptr<Storage>> CachingAllocator::allocate(size_t bytes) {
  const size_t rounded = round_size(bytes);
  void* ptr = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_.find(rounded);
    if (it != free_.end() && !it->second.empty()) {
      ptr = it->second.back();
      it->second.pop_back();
      ++stats_.num_cache_hits;
    } else {
      cudaError_t e = cudaMalloc(&ptr, rounded);
      if (e == cudaErrorMemoryAllocation) {
        cudaGetLastError();
        ZI_TRY(empty_cache_locked());
        e = cudaMalloc(&ptr, rounded);
      }
      if (e == cudaErrorMemoryAllocation) {
        cudaGetLastError();
        return OutOfMemory("cuda: cannot allocate " + std::to_string(rounded) + " bytes (" +
                           std::to_string(stats_.in_use_bytes) + " bytes in use)");
      }
      ZI_TRY(cuda_status(e, "cudaMalloc"));
      ++stats_.num_device_mallocs;
      stats_.reserved_bytes += rounded;
    }
    stats_.in_use_bytes += rounded;
    stats_.peak_in_use_bytes = std::max(stats_.peak_in_use_bytes, stats_.in_use_bytes);
  }
  return std::shared_ptr<Storage>(
      std::make_shared<CudaStorage>(ptr, bytes, rounded, shared_from_this()));
}

void CachingAllocator::release(void* ptr, size_t rounded) {
  std::lock_guard<std::mutex> lock(mu_);
  free_[rounded].push_back(ptr);
  stats_.in_use_bytes -= rounded;
}

Status CachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mu_);
  return empty_cache_locked();
}

Status CachingAllocator::empty_cache_locked() {
  Status first;
  for (auto& [size, blocks] : free_) {
    for (void* p : blocks) {
      Status s = cuda_status(cudaFree(p), "cudaFree");
      if (s.ok()) stats_.reserved_bytes -= size;
      if (!s.ok() && first.ok()) first = s;
    }
    blocks.clear();
  }
  free_.clear();
  return first;
}

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void CachingAllocator::reset_peak() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.peak_in_use_bytes = stats_.in_use_bytes;
}

}  // namespace zimage::cuda
