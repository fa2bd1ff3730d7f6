#include "core/host_memory.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

namespace zimage {
namespace {

// A cgroup limit file's value; 0 for "max", absent or unreadable.
uint64_t cgroup_limit(const char* path) {
  std::FILE* f = std::fopen(path, "r");
  if (!f) return 0;
  unsigned long long v = 0;
  const bool ok = std::fscanf(f, "%llu", &v) == 1;
  std::fclose(f);
  return ok ? static_cast<uint64_t>(v) : 0;
}

}  // namespace

uint64_t host_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  uint64_t bytes = pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * page : 0;
  for (const char* p :
       {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    const uint64_t limit = cgroup_limit(p);
    // v1 reports "no limit" as a huge number, which the min below ignores.
    if (limit > 0) bytes = bytes == 0 ? limit : std::min(bytes, limit);
  }
  return bytes;
}

uint64_t default_pinned_limit() {
  return host_memory_bytes() / 2;
}

}  // namespace zimage
