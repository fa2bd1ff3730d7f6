// A caching allocator for device memory, written without any device API so that it is built
// and unit tested everywhere (the CUDA backend wraps it, src/backend/cuda/runtime/allocator.h).
//
// Memory comes from the backend in segments (cudaMalloc in the CUDA build), through the
// injected `segment_alloc` / `segment_free` callbacks, and is handed out as blocks carved from
// them:
//   - requests are rounded to 512 bytes;
//   - small requests (<= 1 MiB) share 2 MiB segments; medium requests (<= 10 MiB) share 20 MiB
//     segments; larger requests get a segment of their own size rounded up to 2 MiB (the
//     granularity at which the driver backs large allocations anyway, so the tail costs nothing
//     extra and, split off, can serve a later request);
//   - a request takes the smallest free block that fits (best fit, ties by address); the rest
//     of the block is split off when it is worth keeping (any remainder in the small pool,
//     >= 1 MiB in the large pool); a freed block merges with free neighbours of its segment;
//   - a free block over 128 MiB is split only for a request of at least a quarter of its size
//     (BlockAllocatorOptions::oversize_block_bytes says why).
//
// Why memory stays close to the memory in live tensors: a cache that never gives memory back
// ends up holding every phase's working set at once (the text encoder's, the DiT's, the VAE's),
// because blocks shaped for one phase rarely fit the next. So when a request misses the cache
// and a new segment is needed, segments that are entirely free are given back first (least
// recently used first) until the memory held, counting the new segment, is at most
// max(the highest bytes ever in use, bytes in use now + the new segment) + `cache_slack_bytes`
// (the highest bytes ever in use, not the peak that reset_peak() resets).
// In a steady state (the same sequence of requests every denoising step) nothing misses, so
// nothing is given back or obtained; at a change of phase the old phase's segments are
// exchanged for the new one's. The memory held is thus bounded by the peak in use, the slack,
// and the free parts of segments that still hold a live block (fragmentation).
//
// Repeated work (the same VAE decode image after image, a server's requests): when the memory
// a phase needs exceeds that budget by its fragmentation (a VAE decode: stages of different
// sizes, each freed when the next begins), every repetition gives back segments it will ask for
// again, and each cudaMalloc / cudaFree synchronises the device (measured on an H100 at 1024²:
// 28 such calls a decode, 35-56 ms a decode against 23.5 ms without them). So a segment size given
// back by that rule and asked for again where the rule would give segments back once more
// (within `repeat_window` give-backs) is churn: the budget grows by that segment instead, up to
// `repeat_slack_max_bytes`, and never shrinks (empty_cache() gives the idle segments back, not
// the budget). Only segments of their own count (larger than 20 MiB): the small and medium
// segments all have one size, which any phase asks for. A change of phase that does not come
// back asks for other sizes and still exchanges its segments (a size it shares with the phase
// before, by chance, grows the budget by that segment). Under a held limit (set_held_limit: the
// memory planner's budget, `--vram-budget`) the budget is the fixed one, capped by the limit: there
// the plan decides what the memory holds (measured: a driver peak of 4.02 GiB under a 4 GiB budget
// with the growth, 3.89 GiB without, at the same speed). A private pool's misses give nothing
// back (below), so the CUDA backend gives the general pool's idle segments back down to the
// fixed budget (trim_to_fixed_budget) before it records a graph once the budget has grown.
//
// Private pools (for CUDA graph capture): between begin_pool(id) and end_pool(), allocations
// come from pool `id`, whose segments serve nobody else, and blocks freed later (even after
// end_pool) return to it. A graph captured in the pool bakes in addresses that no allocation
// outside the pool can be given, so it can be replayed while other code allocates. Graphs may
// share a pool only if they are replayed in the order they were captured (a block one graph used
// as a temporary may hold a later graph's output). release_pool(id) hands the pool's segments to
// general use once the graphs are gone. While a private pool is active nothing is ever given
// back to the backend (cudaFree is not allowed during capture): a miss obtains a new segment, and
// running out of memory is an error.
//
// Out of memory: when `segment_alloc` reports kOutOfMemory, every entirely free segment of the
// general pool is given back and the request is retried once; then OutOfMemory names the
// request, the bytes in use and the bytes held.
//
// Thread safe: one mutex guards everything; the callbacks run under it and must not call back
// into the allocator.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>

#include "core/status.h"

namespace zimage {

// Names a private pool; 0 is the general pool and cannot be begun or released.
using PoolId = uint64_t;

struct BlockAllocatorStats {
  size_t in_use_bytes = 0;       // in blocks handed out (512-byte rounded, unsplit tails included)
  size_t peak_in_use_bytes = 0;  // high-water mark of in_use_bytes since the last reset_peak()
  size_t reserved_bytes = 0;     // in segments: in use + cached
  size_t peak_reserved_bytes = 0;  // high-water mark of reserved_bytes since the last reset_peak()
  uint64_t num_segment_allocs = 0;
  uint64_t num_segment_frees = 0;
  uint64_t num_cache_hits = 0;    // requests served without a new segment
  size_t repeat_slack_bytes = 0;  // what churn has added to the budget (never reset)
};

struct BlockAllocatorOptions {
  // How far the memory held may exceed the highest bytes ever in use before entirely free
  // segments are given back on a miss. Larger: fewer cudaMalloc/cudaFree at phase changes;
  // smaller: less memory held. 256 MiB is about 1% of what one 1024² image needs in bf16.
  size_t cache_slack_bytes = size_t{256} << 20;
  // A free block larger than this is split only for a request of at least a quarter of its
  // size (smaller requests get a segment of their own). A small tensor that outlives its phase,
  // placed in a huge block, would pin the whole segment (it could never be given back); and the
  // rest of a huge block is usually wanted whole by the next request of the phase that made it.
  size_t oversize_block_bytes = size_t{128} << 20;
  // How far churn may grow the budget (see "Repeated work" above); 0: never. The CUDA backend
  // sets a tenth of the device's memory.
  size_t repeat_slack_max_bytes = 0;
  // How many of the latest segments given back by the budget rule are remembered for that.
  size_t repeat_window = 256;
};

class BlockAllocator {
 public:
  using SegmentAlloc = std::function<Result<void*>(size_t bytes)>;
  using SegmentFree = std::function<Status(void* ptr, size_t bytes)>;

  static constexpr size_t kAlignment = 512;
  static constexpr size_t kSmallRequest = size_t{1} << 20;    // <= this: small pool
  static constexpr size_t kSmallSegment = size_t{2} << 20;    // segment size of the small pool
  static constexpr size_t kMediumRequest = size_t{10} << 20;  // <= this: shared 20 MiB segments
  static constexpr size_t kMediumSegment = size_t{20} << 20;
  static constexpr size_t kLargeRounding = size_t{2} << 20;  // larger: own segment, 2 MiB steps
  static constexpr size_t kMinLargeSplit = size_t{1} << 20;  // smallest tail split off (large)
  // Larger requests fail at once with OutOfMemory (no device has this much; keeps the rounding
  // arithmetic far from overflow).
  static constexpr size_t kMaxRequest = size_t{1} << 56;
  static constexpr size_t kOversizeRatio = 4;  // see BlockAllocatorOptions::oversize_block_bytes

  BlockAllocator(SegmentAlloc segment_alloc, SegmentFree segment_free,
                 BlockAllocatorOptions options = {});
  // Gives every segment back. The owner guarantees that no block is still in use.
  ~BlockAllocator();
  BlockAllocator(const BlockAllocator&) = delete;
  BlockAllocator& operator=(const BlockAllocator&) = delete;

  // The block size a request of `bytes` gets at least (512-byte multiple, >= 512).
  static size_t round_size(size_t bytes);
  // The size of the segment obtained when a request rounded to `rounded` misses the cache.
  static size_t segment_size(size_t rounded);

  // A block of at least `bytes`, 512-byte aligned relative to its segment's base.
  Result<void*> allocate(size_t bytes);
  // Returns a block from allocate() to its pool; InvalidArgument for an unknown pointer.
  Status deallocate(void* ptr);

  // Gives back every entirely free segment of the general pool (private pools keep theirs).
  // Refused while a private pool is active: during graph capture cudaFree is not allowed.
  Status empty_cache();
  // Gives back idle segments of the general pool, least recently used first, until the memory
  // held is within the budget without what repeated work added (the fixed one of "Why memory
  // stays close..."; the held limit caps it). The budget itself stays grown. Refused while a
  // private pool is active.
  Status trim_to_fixed_budget();

  // Allocations until end_pool() come from private pool `id` (created on first use; a pool
  // may be begun again to add more graphs to it). One pool is active at a time.
  Status begin_pool(PoolId id);
  Status end_pool();
  // The pool's segments join the general pool, free blocks at once, blocks still in use when
  // they are freed. Call it once no graph captured in the pool will be replayed again.
  Status release_pool(PoolId id);

  BlockAllocatorStats stats() const;
  // The most the segments may hold (0: no limit; the CUDA allocator's set_limit, which also
  // refuses segments past it): the budget above never exceeds it, so under a limit idle segments
  // are given back least recently used first before the limit would refuse a segment and every
  // idle segment would go; and churn does not grow the budget while a limit is set.
  void set_held_limit(size_t bytes) { held_limit_ = bytes; }
  // Resets both high-water marks to the current values.
  void reset_peak();

 private:
  struct Segment;
  struct Pool;
  struct Block {
    char* ptr = nullptr;
    size_t size = 0;
    bool allocated = false;
    Block* prev = nullptr;  // neighbours in the same segment, by address
    Block* next = nullptr;
    Segment* segment = nullptr;
  };
  struct Segment {
    char* base = nullptr;
    size_t size = 0;
    bool small = false;
    Pool* pool = nullptr;
    size_t used_bytes = 0;   // in allocated blocks; 0 means entirely free
    uint64_t last_used = 0;  // allocation tick of the last block handed out from it
    Block* head = nullptr;   // the block at `base`
  };
  // Free blocks ordered by (size, address): lower_bound finds the best fit.
  struct BySizeThenAddress {
    bool operator()(const Block* a, const Block* b) const {
      return a->size != b->size ? a->size < b->size : a->ptr < b->ptr;
    }
  };
  using FreeSet = std::set<Block*, BySizeThenAddress>;
  struct Pool {
    PoolId id = 0;
    FreeSet small_free;
    FreeSet large_free;
    std::set<Segment*> segments;
    FreeSet& free_set(bool small) { return small ? small_free : large_free; }
  };

  Block* find_free(Pool& pool, size_t rounded, bool small);
  Result<Block*> grow(Pool& pool, size_t requested, size_t rounded, bool small);
  // Whether a segment of `segment_bytes` takes part in "Repeated work": one of its own (larger
  // than the shared medium segments, whose single size any phase asks for), while the budget may
  // still grow.
  bool repeats(size_t segment_bytes) const;
  Status trim_for(size_t new_segment_bytes);
  // The budget for `new_segment_bytes` more (see the header), with or without the repeat slack.
  size_t budget_for(size_t new_segment_bytes, size_t limit, bool with_repeat) const;
  // Gives idle general segments back, least recently used first, until reserved +
  // `new_segment_bytes` <= `budget` or none is left; with `remember`, their sizes for repeats.
  Status give_back_idle(size_t new_segment_bytes, size_t budget, bool remember);
  Status free_segment(Segment* seg);
  Status free_all_free_segments();
  // InvalidArgument naming `what` while a private pool is active (nothing may be given back).
  Status no_pool_active(const char* what) const;
  void hand_out(Pool& pool, Block* block, size_t rounded);
  std::string describe_usage() const;

  SegmentAlloc segment_alloc_;
  SegmentFree segment_free_;
  BlockAllocatorOptions options_;

  mutable std::mutex mu_;
  Pool general_;
  std::map<PoolId, std::unique_ptr<Pool>> private_pools_;
  Pool* active_ = &general_;
  std::unordered_map<void*, Block*> live_;  // allocated blocks by address
  BlockAllocatorStats stats_;
  size_t in_use_high_water_ = 0;  // never reset: the budget for the memory held
  uint64_t tick_ = 0;
  std::atomic<size_t> held_limit_{0};
  // Sizes of the latest segments trim_for() gave back, oldest first (at most repeat_window).
  std::deque<size_t> given_back_;
};

}  // namespace zimage
