// Which streamed sources the CUDA backend may send straight to the DMA engine
// (backend/cuda/runtime/locked_ranges.h): only those lying wholly inside one page-locked range; a
// tensor that shares its first or last page with a locked neighbour but runs past it is "partly"
// (staged). Pure host code, so it runs in every build.
#include <gtest/gtest.h>

#include <cstdint>
#include <thread>
#include <vector>

#include "backend/cuda/runtime/locked_ranges.h"

using zimage::cuda::LockedRanges;
using Cover = LockedRanges::Cover;

namespace {

const void* at(uintptr_t a) {
  return reinterpret_cast<const void*>(a);
}

TEST(LockedRanges, InsidePartlyOrNone) {
  LockedRanges r;
  EXPECT_EQ(r.find(at(4096), 10), Cover::kNone);
  r.add(at(4096), 8192);                              // [4096, 12288)
  r.add(at(20480), 4096);                             // [20480, 24576)
  EXPECT_EQ(r.find(at(4096), 8192), Cover::kInside);  // exactly the range
  EXPECT_EQ(r.find(at(5000), 100), Cover::kInside);
  EXPECT_EQ(r.find(at(12287), 1), Cover::kInside);     // its last byte
  EXPECT_EQ(r.find(at(12288), 100), Cover::kNone);     // right after it
  EXPECT_EQ(r.find(at(4000), 96), Cover::kNone);       // right before it
  EXPECT_EQ(r.find(at(4000), 97), Cover::kPartly);     // its first byte too
  EXPECT_EQ(r.find(at(12000), 1000), Cover::kPartly);  // runs past its end
  // Starts in one locked range, ends in the next, the pages between not locked.
  EXPECT_EQ(r.find(at(12000), 9000), Cover::kPartly);
  EXPECT_EQ(r.find(at(13000), 7480), Cover::kNone);    // the gap exactly
  EXPECT_EQ(r.find(at(13000), 7481), Cover::kPartly);  // and the next range's first byte
  EXPECT_EQ(r.find(at(0), 100000), Cover::kPartly);    // around both
  r.remove(at(4096));
  EXPECT_EQ(r.find(at(5000), 100), Cover::kNone);
  EXPECT_EQ(r.find(at(20480), 4096), Cover::kInside);
}

TEST(LockedRanges, ConcurrentUse) {
  LockedRanges r;
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([&r, t] {
      for (uintptr_t i = 0; i < 500; ++i) {
        const uintptr_t b = (static_cast<uintptr_t>(t) * 1000 + i + 1) * 8192;
        r.add(at(b), 4096);
        EXPECT_EQ(r.find(at(b + 10), 100), Cover::kInside);
        r.remove(at(b));
      }
    });
  for (auto& th : ts) th.join();
  EXPECT_EQ(r.find(at(0), uintptr_t{1} << 40), Cover::kNone);
}

}  // namespace
