// Caching block allocator: see block_allocator.h for the policy and why.
#include "core/block_allocator.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "core/log.h"

namespace zimage {

namespace {

std::string bytes_str(size_t n) {
  return std::to_string(n) + " bytes";
}

}  // namespace

BlockAllocator::BlockAllocator(SegmentAlloc segment_alloc, SegmentFree segment_free,
                               BlockAllocatorOptions options)
    : segment_alloc_(std::move(segment_alloc)),
      segment_free_(std::move(segment_free)),
      options_(options) {}

BlockAllocator::~BlockAllocator() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!live_.empty())
    ZI_WARN("block allocator destroyed with %zu blocks (%zu bytes) still in use", live_.size(),
            stats_.in_use_bytes);
  auto release = [&](Pool& pool) {
    for (Segment* seg : pool.segments) {
      Status s = segment_free_(seg->base, seg->size);
      if (!s.ok()) ZI_WARN("block allocator: %s", s.to_string().c_str());
      for (Block* b = seg->head; b != nullptr;) {
        Block* next = b->next;
        delete b;
        b = next;
      }
      delete seg;
    }
    pool.segments.clear();
  };
  release(general_);
  for (auto& [id, pool] : private_pools_) release(*pool);
}

size_t BlockAllocator::round_size(size_t bytes) {
  if (bytes == 0) return kAlignment;
  return (bytes + kAlignment - 1) / kAlignment * kAlignment;
}

size_t BlockAllocator::segment_size(size_t rounded) {
  if (rounded <= kSmallRequest) return kSmallSegment;
  // Medium requests share 20 MiB segments: fewer cudaMalloc calls for the many 1-10 MiB
  // tensors (small weights, per-head buffers), at most 10 MiB of a segment left unused.
  if (rounded <= kMediumRequest) return kMediumSegment;
  return (rounded + kLargeRounding - 1) / kLargeRounding * kLargeRounding;
}

Result<void*> BlockAllocator::allocate(size_t bytes) {
  if (bytes > kMaxRequest)
    return OutOfMemory("cannot allocate " + bytes_str(bytes) + ": larger than any device");
  const size_t rounded = round_size(bytes);
  const bool small = rounded <= kSmallRequest;
  std::lock_guard<std::mutex> lock(mu_);
  Pool& pool = *active_;
  Block* block = find_free(pool, rounded, small);
  if (block != nullptr) {
    ++stats_.num_cache_hits;
  } else {
    ZI_ASSIGN_OR_RETURN(block, grow(pool, bytes, rounded, small));
  }
  hand_out(pool, block, rounded);
  return static_cast<void*>(block->ptr);
}

BlockAllocator::Block* BlockAllocator::find_free(Pool& pool, size_t rounded, bool small) {
  FreeSet& set = pool.free_set(small);
  Block key;
  key.size = rounded;  // with ptr == nullptr: before every block of this size
  auto it = set.lower_bound(&key);
  if (it == set.end()) return nullptr;
  Block* b = *it;
  // Best fit: every later block is larger, so if this one is an oversize block that the request
  // would use too little of, so is every other.
  if (!small && b->size > options_.oversize_block_bytes && rounded * kOversizeRatio < b->size)
    return nullptr;
  return b;
}

Result<BlockAllocator::Block*> BlockAllocator::grow(Pool& pool, size_t requested, size_t rounded,
                                                    bool small) {
  const size_t bytes = small ? kSmallSegment : segment_size(rounded);
  // Nothing is given back while a private pool is active (graph capture forbids cudaFree).
  const bool may_free = &pool == &general_;
  if (may_free) ZI_TRY(trim_for(bytes));
  Result<void*> got = segment_alloc_(bytes);
  if (!got.ok() && got.status().code() == ErrorCode::kOutOfMemory && may_free) {
    ZI_TRY(free_all_free_segments());
    got = segment_alloc_(bytes);
  }
  if (!got.ok()) {
    const std::string what = "cannot allocate " + bytes_str(requested) + " (a new segment of " +
                             bytes_str(bytes) + "); " + describe_usage();
    if (got.status().code() != ErrorCode::kOutOfMemory) return got.status().with_context(what);
    return OutOfMemory(what +
                       (may_free ? "; free cached segments were given back and the request retried"
                                 : "; private pool " + std::to_string(pool.id) +
                                       " is active, so nothing cached was given back") +
                       ": " + got.status().message());
  }
  if (got.value() == nullptr) return InternalError("segment allocator returned a null pointer");

  auto* seg = new Segment;
  seg->base = static_cast<char*>(got.value());
  seg->size = bytes;
  seg->small = small;
  seg->pool = &pool;
  auto* block = new Block;
  block->ptr = seg->base;
  block->size = bytes;
  block->segment = seg;
  seg->head = block;
  pool.segments.insert(seg);
  pool.free_set(small).insert(block);
  stats_.reserved_bytes += bytes;
  stats_.peak_reserved_bytes = std::max(stats_.peak_reserved_bytes, stats_.reserved_bytes);
  ++stats_.num_segment_allocs;
  return block;
}

void BlockAllocator::hand_out(Pool& pool, Block* block, size_t rounded) {
  Segment* seg = block->segment;
  FreeSet& set = pool.free_set(seg->small);
  set.erase(block);
  const size_t rest = block->size - rounded;
  // A large-pool tail under 1 MiB stays with the block: it could only serve small requests,
  // which have their own pool.
  const bool split = seg->small ? rest >= kAlignment : rest >= kMinLargeSplit;
  if (split) {
    auto* tail = new Block;
    tail->ptr = block->ptr + rounded;
    tail->size = rest;
    tail->prev = block;
    tail->next = block->next;
    tail->segment = seg;
    if (block->next != nullptr) block->next->prev = tail;
    block->next = tail;
    block->size = rounded;
    set.insert(tail);
  }
  block->allocated = true;
  seg->used_bytes += block->size;
  seg->last_used = ++tick_;
  live_[block->ptr] = block;
  stats_.in_use_bytes += block->size;
  stats_.peak_in_use_bytes = std::max(stats_.peak_in_use_bytes, stats_.in_use_bytes);
  in_use_high_water_ = std::max(in_use_high_water_, stats_.in_use_bytes);
}

Status BlockAllocator::deallocate(void* ptr) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(ptr);
  if (it == live_.end())
    return InvalidArgument(
        "deallocate: pointer was not handed out by this allocator or was "
        "already given back");
  Block* b = it->second;
  live_.erase(it);
  Segment* seg = b->segment;
  FreeSet& set = seg->pool->free_set(seg->small);
  b->allocated = false;
  seg->used_bytes -= b->size;
  stats_.in_use_bytes -= b->size;
  // Merge with free neighbours (erase them from the set before their size changes).
  if (Block* p = b->prev; p != nullptr && !p->allocated) {
    set.erase(p);
    p->size += b->size;
    p->next = b->next;
    if (b->next != nullptr) b->next->prev = p;
    delete b;
    b = p;
  }
  if (Block* n = b->next; n != nullptr && !n->allocated) {
    set.erase(n);
    b->size += n->size;
    b->next = n->next;
    if (n->next != nullptr) n->next->prev = b;
    delete n;
  }
  set.insert(b);
  return Status::Ok();
}

bool BlockAllocator::repeats(size_t segment_bytes) const {
  return segment_bytes > kMediumSegment && options_.repeat_window > 0 &&
         options_.repeat_slack_max_bytes > stats_.repeat_slack_bytes;
}

size_t BlockAllocator::budget_for(size_t new_segment_bytes, size_t limit, bool with_repeat) const {
  // Private pools stay reserved on purpose (recorded graphs replay into them): their segments
  // are part of the budget, or every miss elsewhere would give back the general pool's idle
  // segments and the next call would allocate them again (cudaMalloc/cudaFree churn per call).
  size_t pools_reserved = 0;
  for (const auto& [id, pool] : private_pools_)
    for (const Segment* seg : pool->segments) pools_reserved += seg->size;
  const size_t b = std::max(in_use_high_water_, stats_.in_use_bytes + new_segment_bytes) +
                   options_.cache_slack_bytes +
                   (limit == 0 && with_repeat ? stats_.repeat_slack_bytes : 0) + pools_reserved;
  return limit != 0 ? std::min(b, limit) : b;
}

Status BlockAllocator::give_back_idle(size_t new_segment_bytes, size_t budget, bool remember) {
  std::vector<Segment*> idle;
  for (Segment* seg : general_.segments)
    if (seg->used_bytes == 0) idle.push_back(seg);
  std::sort(idle.begin(), idle.end(), [](const Segment* a, const Segment* b) {
    return a->last_used != b->last_used ? a->last_used < b->last_used : a->base < b->base;
  });
  for (Segment* seg : idle) {
    if (stats_.reserved_bytes + new_segment_bytes <= budget) break;
    const size_t size = seg->size;
    ZI_TRY(free_segment(seg));
    if (remember && repeats(size)) {
      if (given_back_.size() >= options_.repeat_window) given_back_.pop_front();
      given_back_.push_back(size);
    }
  }
  return Status::Ok();
}

Status BlockAllocator::trim_for(size_t new_segment_bytes) {
  const size_t limit = held_limit_.load();  // read once: set_held_limit may run meanwhile
  size_t budget = budget_for(new_segment_bytes, limit, true);
  if (stats_.reserved_bytes + new_segment_bytes <= budget) return Status::Ok();
  // Segments would be given back. If one of this size went back lately, this is repeated work
  // asking for it again (see "Repeated work" in the header): the budget grows instead.
  if (limit == 0 && repeats(new_segment_bytes)) {
    auto it = std::find(given_back_.begin(), given_back_.end(), new_segment_bytes);
    if (it != given_back_.end()) {
      given_back_.erase(it);
      stats_.repeat_slack_bytes =
          std::min(options_.repeat_slack_max_bytes, stats_.repeat_slack_bytes + new_segment_bytes);
      ZI_DEBUG(
          "allocator: a segment of %.1f MiB given back is asked for again; the cache may now "
          "hold %.1f MiB more than the highest bytes in use and the slack",
          new_segment_bytes / 1048576.0, stats_.repeat_slack_bytes / 1048576.0);
      budget = budget_for(new_segment_bytes, limit, true);
      if (stats_.reserved_bytes + new_segment_bytes <= budget) return Status::Ok();
    }
  }
  return give_back_idle(new_segment_bytes, budget, limit == 0);
}

Status BlockAllocator::no_pool_active(const char* what) const {
  if (active_ == &general_) return Status::Ok();
  return InvalidArgument(std::string(what) + ": private pool " + std::to_string(active_->id) +
                         " is active (device memory cannot be given back during graph capture)");
}

Status BlockAllocator::trim_to_fixed_budget() {
  std::lock_guard<std::mutex> lock(mu_);
  ZI_TRY(no_pool_active("trim_to_fixed_budget"));
  // Not remembered: these are given back on purpose, not by a miss.
  return give_back_idle(0, budget_for(0, held_limit_.load(), false), false);
}

Status BlockAllocator::free_segment(Segment* seg) {
  // Entirely free, so its blocks have merged into the head.
  Status s = segment_free_(seg->base, seg->size);
  if (!s.ok()) return s.with_context("giving back a segment of " + bytes_str(seg->size));
  Pool& pool = *seg->pool;
  pool.free_set(seg->small).erase(seg->head);
  pool.segments.erase(seg);
  stats_.reserved_bytes -= seg->size;
  ++stats_.num_segment_frees;
  delete seg->head;
  delete seg;
  return Status::Ok();
}

Status BlockAllocator::free_all_free_segments() {
  std::vector<Segment*> idle;
  for (Segment* seg : general_.segments)
    if (seg->used_bytes == 0) idle.push_back(seg);
  Status first;
  for (Segment* seg : idle) {
    Status s = free_segment(seg);
    if (!s.ok() && first.ok()) first = s;
  }
  return first;
}

Status BlockAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mu_);
  ZI_TRY(no_pool_active("empty_cache"));
  return free_all_free_segments();
}

Status BlockAllocator::begin_pool(PoolId id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (id == 0) return InvalidArgument("begin_pool: pool id 0 is the general pool");
  if (active_ != &general_)
    return InvalidArgument("begin_pool: private pool " + std::to_string(active_->id) +
                           " is still active");
  std::unique_ptr<Pool>& pool = private_pools_[id];
  if (!pool) {
    pool = std::make_unique<Pool>();
    pool->id = id;
  }
  active_ = pool.get();
  return Status::Ok();
}

Status BlockAllocator::end_pool() {
  std::lock_guard<std::mutex> lock(mu_);
  if (active_ == &general_) return InvalidArgument("end_pool: no private pool is active");
  active_ = &general_;
  return Status::Ok();
}

Status BlockAllocator::release_pool(PoolId id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (id == 0) return InvalidArgument("release_pool: pool id 0 is the general pool");
  if (active_->id == id)
    return InvalidArgument("release_pool: pool " + std::to_string(id) +
                           " is active; end_pool() first");
  auto it = private_pools_.find(id);
  if (it == private_pools_.end())
    return NotFound("release_pool: no private pool " + std::to_string(id));
  Pool& pool = *it->second;
  // Blocks still in use find their (new) pool through their segment when they are freed.
  for (Segment* seg : pool.segments) {
    seg->pool = &general_;
    for (Block* b = seg->head; b != nullptr; b = b->next) {
      if (b->allocated) continue;
      pool.free_set(seg->small).erase(b);
      general_.free_set(seg->small).insert(b);
    }
    general_.segments.insert(seg);
  }
  private_pools_.erase(it);
  return Status::Ok();
}

BlockAllocatorStats BlockAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void BlockAllocator::reset_peak() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.peak_in_use_bytes = stats_.in_use_bytes;
  stats_.peak_reserved_bytes = stats_.reserved_bytes;
}

std::string BlockAllocator::describe_usage() const {
  return bytes_str(stats_.in_use_bytes) + " in use, " + bytes_str(stats_.reserved_bytes) +
         " reserved";
}

}  // namespace zimage
