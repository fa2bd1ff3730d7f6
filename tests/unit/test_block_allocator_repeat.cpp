// The caching allocator's "Repeated work" (core/block_allocator.h): a segment size given back by
// the budget rule and asked for again grows the budget (up to its cap), never under a held limit,
// which also caps the budget; trim_to_fixed_budget gives idle segments back down to the budget
// without that growth. Against the fake device of block_allocator_fake.h.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "core/block_allocator.h"
#include "unit/block_allocator_fake.h"

using namespace zimage;
using namespace zimage::alloc_test;

namespace {

// One decode of a VAE-like sequence (vae_like_stages: the same sizes for the same seed),
// everything freed at its end; the segment calls it made.
uint64_t vae_like_decode(BlockAllocator& a, uint64_t seed) {
  const BlockAllocatorStats before = a.stats();
  std::mt19937_64 rng(seed);
  vae_like_stages(a, rng, 24);
  const BlockAllocatorStats after = a.stats();
  return (after.num_segment_allocs - before.num_segment_allocs) +
         (after.num_segment_frees - before.num_segment_frees);
}

// The same decode again and again (image after image): under the fixed budget every repetition
// gives back segments it asks for again (a cudaMalloc and a cudaFree each, which synchronise the
// device); with repeat_slack_max_bytes the budget grows by what is asked for again, within a few
// decodes nothing is obtained or given back any more, and the memory held grows by at most the
// cap.
TEST(BlockAllocator, RepeatedWorkStopsChurning) {
  constexpr int kDecodes = 6;
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    BlockAllocatorOptions grows;
    grows.repeat_slack_max_bytes = size_t{8} << 30;
    uint64_t repeats_total[2] = {0, 0};  // segment calls of decodes 2..6: fixed, grows
    size_t reserved[2] = {0, 0};
    for (const bool adaptive : {false, true}) {
      FakeDevice dev;
      auto a = make(dev, adaptive ? grows : BlockAllocatorOptions{});
      void* weights = take(*a, 900 * kMiB);
      uint64_t calls[kDecodes];
      std::string line;
      for (uint64_t& c : calls) {
        c = vae_like_decode(*a, seed);
        line += " " + std::to_string(c);
      }
      const BlockAllocatorStats s = a->stats();
      std::printf(
          "  seed %d, %s: segment calls a decode%s; %.0f MiB reserved, peak in use %.0f MiB, "
          "repeat slack %.0f MiB\n",
          static_cast<int>(seed), adaptive ? "repeat slack" : "fixed budget", line.c_str(),
          s.reserved_bytes / double(kMiB), s.peak_in_use_bytes / double(kMiB),
          s.repeat_slack_bytes / double(kMiB));
      for (int i = 1; i < kDecodes; ++i) repeats_total[adaptive] += calls[i];
      reserved[adaptive] = s.reserved_bytes;
      if (adaptive) {
        EXPECT_EQ(calls[kDecodes - 2] + calls[kDecodes - 1], 0u)
            << "seed " << seed << ": still churning at the fifth and sixth decodes";
        EXPECT_GT(s.repeat_slack_bytes, 0u) << "seed " << seed;
        EXPECT_LE(s.repeat_slack_bytes, grows.repeat_slack_max_bytes);
      } else {
        EXPECT_EQ(s.repeat_slack_bytes, 0u);
        // Teeth: the fixed budget churns on these sequences at every decode.
        EXPECT_GT(calls[kDecodes - 1], 0u) << "seed " << seed << ": the sequence does not churn";
      }
      give(*a, weights);
      EXPECT_TRUE(dev.errors.empty());
    }
    EXPECT_LT(repeats_total[1] * 4, repeats_total[0]) << "seed " << seed;
    // What it costs: more held, by at most the cap.
    EXPECT_LE(reserved[1], reserved[0] + grows.repeat_slack_max_bytes);
  }
}

// The cap holds: with room for one segment the budget grows by at most that, and the churn
// goes on.
TEST(BlockAllocator, RepeatSlackStopsAtItsCap) {
  FakeDevice dev;
  BlockAllocatorOptions o;
  o.repeat_slack_max_bytes = 64 * kMiB;
  auto a = make(dev, o);
  uint64_t later = 0;
  for (int i = 0; i < 5; ++i) later = vae_like_decode(*a, 3);
  EXPECT_EQ(a->stats().repeat_slack_bytes, 64 * kMiB);
  EXPECT_GT(later, 0u);
  EXPECT_TRUE(dev.errors.empty());
}

// Under a held limit (the CUDA allocator's set_limit) the budget is at most the limit: idle
// segments go least recently used first, only as many as the new segment needs, however large
// the slack, instead of the limit refusing the segment and every idle one going.
TEST(BlockAllocator, AHeldLimitCapsTheBudget) {
  FakeDevice dev;
  BlockAllocatorOptions o;
  o.cache_slack_bytes = size_t{1} << 40;
  o.repeat_slack_max_bytes = size_t{8} << 30;
  auto a = make(dev, o);
  a->set_held_limit(256 * kMiB);
  std::vector<void*> p;
  for (int i = 0; i < 4; ++i) p.push_back(take(*a, 64 * kMiB));
  for (void* q : p) give(*a, q);
  void* big = take(*a, 100 * kMiB);
  const BlockAllocatorStats s = a->stats();
  EXPECT_EQ(s.num_segment_frees, 2u);
  EXPECT_EQ(s.reserved_bytes, 228 * kMiB);
  EXPECT_FALSE(dev.live.count(addr(p[0])));
  EXPECT_FALSE(dev.live.count(addr(p[1])));
  EXPECT_TRUE(dev.live.count(addr(p[2])));
  give(*a, big);
  // A given-back size asked for again does not grow the budget under a limit: the fourth 64 MiB
  // request (the first three fit the idle blocks) misses, and the limit stays the budget.
  std::vector<void*> q;
  for (int i = 0; i < 4; ++i) q.push_back(take(*a, 64 * kMiB));
  EXPECT_EQ(a->stats().repeat_slack_bytes, 0u);
  for (void* r : q) give(*a, r);
  // Without the limit the slack keeps everything.
  a->set_held_limit(0);
  void* more = take(*a, 300 * kMiB);
  EXPECT_EQ(a->stats().num_segment_frees, 2u);
  give(*a, more);
  EXPECT_TRUE(dev.errors.empty());
}

// Under a held limit a size given back and asked for again grows nothing; a limit set after the
// budget grew is the budget (idle segments go back down to it).
TEST(BlockAllocator, UnderALimitNothingGrows) {
  FakeDevice dev;
  BlockAllocatorOptions o;
  o.cache_slack_bytes = 0;
  o.repeat_slack_max_bytes = size_t{8} << 30;
  auto a = make(dev, o);
  auto phase_a = [&] {  // two 64 MiB tensors; they do not split an idle 600 MiB block
    void* x = take(*a, 64 * kMiB);
    void* y = take(*a, 64 * kMiB);
    give(*a, x);
    give(*a, y);
  };
  phase_a();
  give(*a, take(*a, 600 * kMiB));  // both 64 MiB segments go back (budget 600 MiB)
  ASSERT_EQ(a->stats().reserved_bytes, 600 * kMiB);
  // Phase A again under a 700 MiB limit: the second 64 MiB segment would pass the limit; it was
  // given back before, yet nothing grows, and the idle 600 MiB segment goes.
  a->set_held_limit(700 * kMiB);
  phase_a();
  EXPECT_EQ(a->stats().repeat_slack_bytes, 0u);
  EXPECT_EQ(a->stats().reserved_bytes, 128 * kMiB);
  // Without the limit: B gives the 64 MiB segments back, A asks for both again and the budget
  // grows by them, keeping B's segment.
  a->set_held_limit(0);
  give(*a, take(*a, 600 * kMiB));
  phase_a();
  EXPECT_EQ(a->stats().repeat_slack_bytes, 128 * kMiB);
  EXPECT_EQ(a->stats().reserved_bytes, 728 * kMiB);
  // The limit again: a 70 MiB request may not keep them; the least recently used (B's) goes.
  a->set_held_limit(700 * kMiB);
  void* c = take(*a, 70 * kMiB);
  EXPECT_EQ(a->stats().reserved_bytes, 198 * kMiB);
  give(*a, c);
  EXPECT_TRUE(dev.errors.empty());
}

// A phase that comes back (the next image's) asks for the segment sizes it gave back: the budget
// grows by them, and the other phase's idle segment is kept where the fixed budget gave it back.
TEST(BlockAllocator, APhaseThatComesBackKeepsTheOthersSegments) {
  for (const bool repeat : {false, true}) {
    FakeDevice dev;
    BlockAllocatorOptions o;
    o.cache_slack_bytes = 0;
    o.repeat_slack_max_bytes = repeat ? size_t{8} << 30 : 0;
    auto a = make(dev, o);
    void* p0 = take(*a, 64 * kMiB);
    void* p1 = take(*a, 64 * kMiB);
    give(*a, p0);
    give(*a, p1);
    // Phase B: 600 MiB fits neither 64 MiB segment; both are given back (the budget is 600).
    void* b = take(*a, 600 * kMiB);
    EXPECT_EQ(a->stats().num_segment_frees, 2u);
    give(*a, b);
    // Phase A again: 64 MiB requests do not split the idle 600 MiB block (oversize), so each
    // misses.
    void* q0 = take(*a, 64 * kMiB);
    void* q1 = take(*a, 64 * kMiB);
    const BlockAllocatorStats s = a->stats();
    if (repeat) {
      EXPECT_EQ(s.repeat_slack_bytes, 128 * kMiB);
      EXPECT_EQ(s.num_segment_frees, 2u);
      EXPECT_EQ(s.reserved_bytes, 728 * kMiB);
      EXPECT_TRUE(dev.live.count(addr(b)));
      // Down to the fixed budget (before a graph's private pool grows): the idle 600 MiB segment
      // goes, the budget stays grown, and nothing is refused while no pool is active.
      ZI_EXPECT_OK_ALLOC(a->trim_to_fixed_budget());
      EXPECT_FALSE(dev.live.count(addr(b)));
      EXPECT_EQ(a->stats().reserved_bytes, 128 * kMiB);
      EXPECT_EQ(a->stats().repeat_slack_bytes, 128 * kMiB);
      ZI_EXPECT_OK_ALLOC(a->begin_pool(5));
      EXPECT_FALSE(a->trim_to_fixed_budget().ok()) << "refused while a pool is active";
      ZI_EXPECT_OK_ALLOC(a->end_pool());
    } else {
      EXPECT_EQ(s.repeat_slack_bytes, 0u);
      EXPECT_EQ(s.num_segment_frees, 3u);
      EXPECT_EQ(s.reserved_bytes, 128 * kMiB);
      EXPECT_FALSE(dev.live.count(addr(b)));
    }
    give(*a, q0);
    give(*a, q1);
    EXPECT_TRUE(dev.errors.empty());
  }
}

}  // namespace
