#include "core/host_memory.h"

#include <unistd.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/log.h"

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

void* allocate_large(size_t bytes) {
  constexpr size_t kHuge = size_t{2} << 20;
  void* p = nullptr;
  if (::posix_memalign(&p, kHuge, std::max<size_t>(bytes, 1)) != 0) return nullptr;
#if defined(MADV_HUGEPAGE)
  // The whole huge pages inside the buffer; advice only (small pages where THP is off).
  // ZIMAGE_HOST_HUGE_PAGES=0 leaves them in small pages (to measure what the advice buys).
  // Another value is named in a warning and the default kept (this runs inside allocations, which
  // have no error to return for a setting).
  static const bool advise = [] {
    const char* v = std::getenv("ZIMAGE_HOST_HUGE_PAGES");
    if (v == nullptr || std::string(v) == "1") return true;
    if (std::string(v) == "0") return false;
    ZI_WARN(
        "ZIMAGE_HOST_HUGE_PAGES='%s' is neither 0 nor 1; large host buffers stay advised into "
        "huge pages",
        v);
    return true;
  }();
  const size_t whole = bytes / kHuge * kHuge;
  if (advise && whole > 0) (void)::madvise(p, whole, MADV_HUGEPAGE);
#endif
  return p;
}

}  // namespace zimage
