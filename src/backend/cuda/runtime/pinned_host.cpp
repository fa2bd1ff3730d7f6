// See pinned_host.h.
#include "backend/cuda/runtime/pinned_host.h"

#include <cuda_runtime_api.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "backend/cuda/runtime/capture_guard.h"

namespace zimage::cuda {
namespace {

constexpr size_t kHugePage = size_t{2} << 20;

bool registering_allowed() {
  const char* v = std::getenv("ZIMAGE_HOST_PIN");
  return v == nullptr || std::string(v) != "alloc";
}

// Zeroes [p, p + n) on up to 8 threads (the page faults, 2 MiB each, are most of the cost); what
// no thread could be started for, the caller zeroes.
void zero_parallel(uint8_t* p, size_t n) {
  const size_t parts = std::clamp<size_t>(n / (size_t{32} << 20), 1, 8);
  const size_t per = ((n + parts - 1) / parts + kHugePage - 1) / kHugePage * kHugePage;
  std::vector<std::thread> ts;
  size_t next = per;  // the first byte no thread has taken; the caller keeps [0, per)
  try {
    ts.reserve(parts);
    for (; next < n; next += per) {
      const size_t a = next, b = std::min(n, next + per);
      ts.emplace_back([=] { std::memset(p + a, 0, b - a); });
    }
  } catch (...) {  // no thread to spare: the caller zeroes the rest
  }
  std::memset(p, 0, std::min(n, per));
  if (next < n) std::memset(p + next, 0, n - next);
  for (std::thread& t : ts) t.join();
}

}  // namespace

PinnedHost& PinnedHost::operator=(PinnedHost&& o) noexcept {
  if (this != &o) {
    reset();
    std::swap(data_, o.data_);
    std::swap(bytes_, o.bytes_);
    std::swap(map_, o.map_);
    std::swap(map_bytes_, o.map_bytes_);
    std::swap(method_, o.method_);
  }
  return *this;
}

Result<PinnedHost> PinnedHost::allocate(size_t bytes) {
  if (bytes == 0) return InvalidArgument("pinned host memory: zero bytes asked for");
  PinnedHost h;
  if (registering_allowed()) {
    // A mapping one huge page longer than needed, so that the range used starts on one.
    const size_t used = (bytes + kHugePage - 1) / kHugePage * kHugePage;
    const size_t map_bytes = used + kHugePage;
    void* map =
        mmap(nullptr, map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (map != MAP_FAILED) {
      auto* start = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(map) + kHugePage - 1) /
                                               kHugePage * kHugePage);
      (void)madvise(start, used, MADV_HUGEPAGE);  // advice: small pages where THP is off
      zero_parallel(start, used);
      if (cudaHostRegister(start, used, cudaHostRegisterDefault) == cudaSuccess) {
        h.data_ = start;
        h.bytes_ = bytes;
        h.map_ = map;
        h.map_bytes_ = map_bytes;
        h.method_ = Method::kRegistered;
        return h;
      }
      cudaGetLastError();  // a refused registration must not poison the next call
      munmap(map, map_bytes);
    }
  }
  void* p = nullptr;
  const cudaError_t e = cudaHostAlloc(&p, bytes, cudaHostAllocDefault);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return OutOfMemory("cannot page-lock " + std::to_string(bytes >> 20) +
                       " MiB of host memory: " + cudaGetErrorString(e));
  }
  h.data_ = p;
  h.bytes_ = bytes;
  h.method_ = Method::kHostAlloc;
  return h;
}

void PinnedHost::reset() noexcept {
  if (data_ == nullptr) return;
  {
    std::lock_guard<std::mutex> sync_lock(device_sync_mutex());  // capture_guard.h
    if (method_ == Method::kRegistered) {
      cudaHostUnregister(data_);
    } else {
      cudaFreeHost(data_);
    }
  }
  cudaGetLastError();
  if (method_ == Method::kRegistered) munmap(map_, map_bytes_);
  data_ = map_ = nullptr;
  bytes_ = map_bytes_ = 0;
  method_ = Method::kNone;
}

}  // namespace zimage::cuda
