// The host-side half of staged (pinned) uploads, kept free of CUDA so the CPU unit tests cover it
// (tests/unit/test_upload_plan.cpp): how an upload is cut into pieces that go through a ring of
// staging buffers, and the multithreaded copy that fills a piece.
//
// The ring: N buffers of B bytes. Uploads are packed one after another into the current buffer;
// when it is full the next one becomes current, and before it is written again the host must wait
// until the copy engine has finished reading it (StagePiece::wait). Packing matters because most
// weights are far smaller than a buffer (a norm vector, a 29 MB projection next to a 64 MiB
// buffer): each one starting a buffer of its own would let the host run only N tensors ahead of the
// DMA instead of N buffers' worth of bytes.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/thread_pool.h"

namespace zimage::cuda {

// One piece of an upload: source bytes [src_offset, src_offset + bytes) go through staging
// buffer `buffer` at [buffer_offset, buffer_offset + bytes).
struct StagePiece {
  int buffer = 0;
  size_t buffer_offset = 0;
  size_t src_offset = 0;
  size_t bytes = 0;
  // First piece written into `buffer` since the ring last moved to it: the DMA that last read the
  // buffer must be complete before the host writes it.
  bool wait = false;
};

class StageRing {
 public:
  // Piece starts in a buffer are rounded up to this, so slices of the parallel copy never share
  // a cache line with the previous upload's tail.
  static constexpr size_t kAlign = 4096;

  StageRing(size_t buffer_bytes, int buffers)
      : buffer_bytes_(std::max(buffer_bytes, kAlign) / kAlign * kAlign),
        buffers_(std::max(buffers, 1)) {}

  size_t buffer_bytes() const { return buffer_bytes_; }
  int buffers() const { return buffers_; }

  // Appends to `out` the pieces of an upload of `bytes` bytes, continuing where the previous
  // upload stopped. Pieces cover [0, bytes) in order, each within one buffer.
  void plan(size_t bytes, std::vector<StagePiece>* out) {
    size_t done = 0;
    while (done < bytes) {
      bool wait = false;
      if (current_ < 0 || fill_ >= buffer_bytes_) {  // move on to the next buffer
        current_ = (current_ + 1) % buffers_;
        fill_ = 0;
        wait = true;
      }
      const size_t n = std::min(bytes - done, buffer_bytes_ - fill_);
      out->push_back({current_, fill_, done, n, wait});
      done += n;
      fill_ = std::min(buffer_bytes_, (fill_ + n + kAlign - 1) / kAlign * kAlign);
    }
  }

  // Starts over at buffer 0 (call once no DMA reads any buffer: after a stream sync).
  void reset() {
    current_ = -1;
    fill_ = 0;
  }

 private:
  size_t buffer_bytes_;
  int buffers_;
  int current_ = -1;  // buffer being filled; -1 before the first piece
  size_t fill_ = 0;   // bytes of it in use (rounded up to kAlign)
};

// Copies `bytes` from `src` to `dst` (not overlapping) in slices of at least `grain` bytes spread
// over `pool`'s threads. From a memory-mapped file in the page cache most of the time goes into
// page faults (mapping the cached pages), which run in parallel on different cores, so this is
// what makes reading a mapped file fast; for already-mapped memory it is bounded by memory
// bandwidth. Small copies (< 2 * grain) run on the calling thread.
inline void parallel_copy(ThreadPool& pool, void* dst, const void* src, size_t bytes,
                          size_t grain) {
  auto* d = static_cast<uint8_t*>(dst);
  const auto* s = static_cast<const uint8_t*>(src);
  pool.parallel_for(static_cast<int64_t>(bytes), static_cast<int64_t>(std::max<size_t>(grain, 1)),
                    [&](int64_t begin, int64_t end) {
                      std::memcpy(d + begin, s + begin, static_cast<size_t>(end - begin));
                    });
}

}  // namespace zimage::cuda
