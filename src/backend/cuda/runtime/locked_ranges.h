// The host ranges a CUDA backend has page-locked in place (CudaBackend::lock_host_range): which
// sources stream_in may hand straight to the DMA engine. Why a list of our own: the driver says
// whether a pointer lies in registered memory, not whether a whole range does, and a tensor of a
// weight file may share its first and last pages with locked neighbours while the pages between
// are not locked. Thread-safe; no CUDA calls (unit-tested on the CPU).
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <mutex>

namespace zimage::cuda {

class LockedRanges {
 public:
  enum class Cover { kNone, kInside, kPartly };

  void add(const void* p, size_t n) {
    const auto b = reinterpret_cast<uintptr_t>(p);
    std::lock_guard<std::mutex> lock(mu_);
    ranges_[b] = b + n;
  }
  void remove(const void* p) {
    std::lock_guard<std::mutex> lock(mu_);
    ranges_.erase(reinterpret_cast<uintptr_t>(p));
  }
  // Whether [p, p + n) lies inside one range, overlaps some without lying inside one, or touches
  // none. Ranges never overlap each other (the driver refuses to register a page twice).
  Cover find(const void* p, size_t n) const {
    const auto b = reinterpret_cast<uintptr_t>(p), e = b + n;
    std::lock_guard<std::mutex> lock(mu_);
    auto it = ranges_.upper_bound(b);  // the first range starting after b
    if (it != ranges_.begin()) {
      const auto prev = std::prev(it);
      if (prev->second > b) return e <= prev->second ? Cover::kInside : Cover::kPartly;
    }
    return it != ranges_.end() && it->first < e ? Cover::kPartly : Cover::kNone;
  }

 private:
  mutable std::mutex mu_;
  std::map<uintptr_t, uintptr_t> ranges_;  // begin -> end
};

}  // namespace zimage::cuda
