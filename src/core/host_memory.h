// How much host memory this process can count on: physical memory, or the container's limit when
// that is smaller (cgroup v2 memory.max, v1 memory.limit_in_bytes). Used for the default of the
// host-memory limit on page-locked weights (pipeline/memory_plan.h): page-locked memory cannot be
// swapped out, so pinning more than the machine has takes it down rather than slowing it.
#pragma once

#include <cstdint>

namespace zimage {

// 0 when unknown.
uint64_t host_memory_bytes();

// The default limit on page-locked streamed weights: half of host_memory_bytes() (0, no limit,
// when that is unknown).
uint64_t default_pinned_limit();

}  // namespace zimage
