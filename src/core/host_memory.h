// How much host memory this process can count on: physical memory, or the container's limit when
// that is smaller (cgroup v2 memory.max, v1 memory.limit_in_bytes). Used for the default of the
// host-memory limit on page-locked weights (pipeline/memory_plan.h): page-locked memory cannot be
// swapped out, so pinning more than the machine has takes it down rather than slowing it.
#pragma once

#include <cstddef>
#include <cstdint>

namespace zimage {

// 0 when unknown.
uint64_t host_memory_bytes();

// The default limit on page-locked streamed weights: half of host_memory_bytes() (0, no limit,
// when that is unknown).
uint64_t default_pinned_limit();

// Host memory for a large buffer (weights' host copies, big host tensors): `bytes` from a 2 MiB
// boundary, advised into transparent huge pages (madvise MADV_HUGEPAGE on Linux, which takes
// effect where THP runs in its "madvise" mode, as on the lent GPU machines), so that first
// touching it and giving it back at exit cost one page fault and one free per 2 MiB rather than
// per 4 KiB. Released with std::free; nullptr when out of memory.
void* allocate_large(size_t bytes);
// The size from which HostStorage allocates through allocate_large (smaller buffers would waste
// the rounding).
inline constexpr size_t kLargeHostBytes = size_t{8} << 20;

}  // namespace zimage
