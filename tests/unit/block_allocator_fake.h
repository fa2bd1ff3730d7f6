// The block allocator's test kit (core/block_allocator.h against a fake device): segments are
// address ranges that are never touched, so sequences of many GiB run anywhere; the fake records
// every segment call, checks that frees match allocations, and can run out of memory. Used by
// test_block_allocator.cpp and test_block_allocator_repeat.cpp.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/block_allocator.h"

namespace zimage::alloc_test {

inline constexpr size_t kKiB = size_t{1} << 10;
inline constexpr size_t kMiB = size_t{1} << 20;

inline uintptr_t addr(const void* p) {
  return reinterpret_cast<uintptr_t>(p);
}

// A fake device: hands out address ranges 512-aligned but deliberately not 2 MiB-aligned, with
// gaps between them so that two segments are never contiguous.
struct FakeDevice {
  size_t capacity = SIZE_MAX;  // bytes it can hold at once; more is OutOfMemory
  int fail_next = 0;           // the next N allocations fail (OutOfMemory) regardless
  ErrorCode fail_code = ErrorCode::kOutOfMemory;
  uintptr_t next = (uintptr_t{1} << 40) + 512;
  std::map<uintptr_t, size_t> live;  // base -> size
  size_t live_bytes = 0;
  int allocs = 0;  // successful
  int failed = 0;
  int frees = 0;
  std::vector<std::string> errors;  // frees that match no allocation

  Result<void*> alloc(size_t n) {
    if (fail_next > 0 || live_bytes + n > capacity) {
      if (fail_next > 0) --fail_next;
      ++failed;
      return Status(fail_code, "fake device: no room for " + std::to_string(n) + " bytes");
    }
    const uintptr_t base = next;
    next += n + 64 * kKiB;
    live[base] = n;
    live_bytes += n;
    ++allocs;
    return reinterpret_cast<void*>(base);
  }
  Status free(void* p, size_t n) {
    auto it = live.find(addr(p));
    if (it == live.end() || it->second != n) {
      errors.push_back("bad free of " + std::to_string(addr(p)) + " (" + std::to_string(n) + ")");
      return InternalError("fake device: bad free");
    }
    live_bytes -= n;
    live.erase(it);
    ++frees;
    return Status::Ok();
  }
  // The segment that holds [p, p + n), or 0.
  uintptr_t segment_of(const void* p, size_t n) const {
    auto it = live.upper_bound(addr(p));
    if (it == live.begin()) return 0;
    --it;
    return addr(p) + n <= it->first + it->second ? it->first : 0;
  }
};

inline std::unique_ptr<BlockAllocator> make(FakeDevice& dev, BlockAllocatorOptions o = {}) {
  return std::make_unique<BlockAllocator>([&dev](size_t n) { return dev.alloc(n); },
                                          [&dev](void* p, size_t n) { return dev.free(p, n); }, o);
}

inline void* take(BlockAllocator& a, size_t bytes) {
  Result<void*> r = a.allocate(bytes);
  EXPECT_TRUE(r.ok()) << bytes << ": " << r.status().to_string();
  return r.ok() ? r.value() : nullptr;
}

inline void give(BlockAllocator& a, void* p) {
  Status s = a.deallocate(p);
  EXPECT_TRUE(s.ok()) << s.to_string();
}

#define ZI_EXPECT_OK_ALLOC(expr)            \
  do {                                      \
    const Status s_ = (expr);               \
    EXPECT_TRUE(s_.ok()) << s_.to_string(); \
  } while (0)

// Stages of one tensor size (32-512 MB, a new size every stage, not multiples of anything), a
// few tensors live at a time of that size, half of it or double it (at most 512 MB), everything
// of a stage freed when the next begins: the shape of a VAE decoder's requests.
inline void vae_like_stages(BlockAllocator& a, std::mt19937_64& rng, int stages) {
  for (int stage = 0; stage < stages; ++stage) {
    const size_t size = 32 * 1000 * 1000 + rng() % (480 * 1000 * 1000);
    std::vector<void*> live;
    const int ops = 10 + static_cast<int>(rng() % 30);
    for (int k = 0; k < ops; ++k) {
      if (live.size() < 2 || (live.size() < 5 && rng() % 2 == 0)) {
        static constexpr double kScale[] = {0.5, 1, 1, 1, 2};
        const size_t n =
            std::min<size_t>(static_cast<size_t>(size * kScale[rng() % 5]), 512 * 1000 * 1000);
        live.push_back(take(a, n));
      } else {
        const size_t i = rng() % live.size();
        give(a, live[i]);
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
      }
    }
    for (void* p : live) give(a, p);
  }
}

}  // namespace zimage::alloc_test
