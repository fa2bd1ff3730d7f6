// Page-locked (pinned) host memory for DMA: the upload staging, the streaming staging, the
// budgeted loads' page-locked copies.
//
// cudaHostAlloc zeroes and locks memory in 4 KiB pages on the calling thread. Locking ordinary
// memory in transparent huge pages instead (2 MiB pages, madvise(MADV_HUGEPAGE), zeroed on
// several threads, then cudaHostRegister) is what tools/pinning_probe.cpp measured faster on the
// H200's host (docs/BENCHMARKS.md, "Session 19"): 256 MiB locked in 13 ms against 100 ms and
// unlocked in 4 ms against 22 ms; 2 GiB in 0.11 s against 0.75 s (0.05 s against 0.22 s to
// unlock). The kernel pins a few large pages instead of many small ones. Where the kernel has no
// transparent huge pages the same steps still run on small pages (0.21 s for 2 GiB, the zeroing
// being parallel), and where registering fails (a driver or limit that refuses it) the memory
// comes from cudaHostAlloc as before. ZIMAGE_HOST_PIN=alloc keeps cudaHostAlloc (huge, the
// default, and register, CudaBackend::host_copy's copy-then-lock, take this path).
//
// The driver may serialise locking and unlocking with other calls: the free happens under
// capture_guard.h's device_sync_mutex, as cudaFreeHost did everywhere here.
#pragma once

#include <cstddef>

#include "core/status.h"

namespace zimage::cuda {

class PinnedHost {
 public:
  enum class Method { kNone, kHostAlloc, kRegistered };

  PinnedHost() = default;
  // `bytes` > 0 of zeroed page-locked memory, registered huge pages where possible; OutOfMemory
  // naming the size when neither method gives it.
  static Result<PinnedHost> allocate(size_t bytes);
  PinnedHost(PinnedHost&& o) noexcept { *this = std::move(o); }
  PinnedHost& operator=(PinnedHost&& o) noexcept;
  PinnedHost(const PinnedHost&) = delete;
  PinnedHost& operator=(const PinnedHost&) = delete;
  ~PinnedHost() { reset(); }

  void* data() const { return data_; }
  size_t size() const { return bytes_; }
  Method method() const { return method_; }
  explicit operator bool() const { return data_ != nullptr; }
  // Unlocks and frees (nothing when empty). No DMA may still read or write the memory.
  void reset() noexcept;

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
  void* map_ = nullptr;  // kRegistered: the mapping data_ lies in
  size_t map_bytes_ = 0;
  Method method_ = Method::kNone;
};

}  // namespace zimage::cuda
