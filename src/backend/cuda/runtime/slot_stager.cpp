// See slot_stager.h for why and how.
#include "backend/cuda/runtime/slot_stager.h"

#include <algorithm>
#include <string>
#include <thread>

#include "backend/cuda/runtime/capture_guard.h"
#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/upload_plan.h"
#include "core/log.h"

namespace zimage::cuda {

SlotStager::SlotStager(int device, int slots, int threads, size_t piece)
    : device_(device), threads_(threads), piece_(std::max<size_t>(piece, size_t{1} << 20)) {
  if (threads_ <= 0)
    threads_ = std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 1, 16);
  buffers_.resize(static_cast<size_t>(std::max(slots, 0)));
}

SlotStager::~SlotStager() {
  join_prepared();
  // A destructor cannot report; it still waits for every DMA before freeing its buffer.
  int prev = -1;
  if (cudaGetDevice(&prev) == cudaSuccess && prev != device_) cudaSetDevice(device_);
  for (Buffer& b : buffers_) {
    if (b.done) {
      cudaEventSynchronize(b.done);
      cudaEventDestroy(b.done);
    }
    b.mem.reset();  // unlocked under capture_guard.h's lock
    b.data = nullptr;
  }
  if (prev >= 0 && prev != device_) cudaSetDevice(prev);
}

void SlotStager::wait_prepared(int slot) const {
  std::unique_lock<std::mutex> lock(prepare_mu_);
  prepare_cv_.wait(lock, [&] {
    if (slot >= 0) return slot >= static_cast<int>(pending_.size()) || pending_[slot] == 0;
    return std::all_of(pending_.begin(), pending_.end(), [](int n) { return n == 0; });
  });
}

void SlotStager::join_prepared() const {
  for (;;) {
    std::future<void> f;
    {
      std::lock_guard<std::mutex> lock(prepare_mu_);
      if (!prepared_.valid()) return;
      f = std::move(prepared_);
    }
    try {
      f.get();
    } catch (...) {  // the worker is noexcept; nothing to report
    }
  }
}

void SlotStager::prepare(int slot, size_t bytes) noexcept {
  if (slot < 0 || slot >= static_cast<int>(buffers_.size()) || bytes == 0) return;
  // The worker takes the requests in order until none is left; a request made while it runs
  // joins its queue, so the caller (a load) never waits here, and copy() waits only for its own
  // slot's requests (a text encoder's first layer need not wait for the DiT's slots).
  auto work = [this]() noexcept {
    int prev = -1;
    const bool switched = cudaGetDevice(&prev) == cudaSuccess && prev != device_;
    if (switched) cudaSetDevice(device_);
    for (;;) {
      std::pair<int, size_t> r;
      try {
        std::lock_guard<std::mutex> lock(prepare_mu_);
        if (requests_.empty()) {
          preparing_ = false;
          break;
        }
        r = requests_.front();
        requests_.erase(requests_.begin());
      } catch (...) {  // a lock that cannot be taken: leave the rest to copy()
        break;
      }
      try {
        // A failure here is met again (and reported) by copy(), which reserves as before.
        (void)reserve(buffers_[static_cast<size_t>(r.first)], r.second);
      } catch (...) {  // nothing to report: copy() tries again
      }
      cudaGetLastError();
      try {
        std::lock_guard<std::mutex> lock(prepare_mu_);
        --pending_[static_cast<size_t>(r.first)];
      } catch (...) {
      }
      prepare_cv_.notify_all();
    }
    if (switched) cudaSetDevice(prev);  // the inline fallback runs on the caller's thread
  };
  std::future<void> previous;  // a finished worker's, destroyed (joined) after the lock
  bool here = false;
  try {
    std::lock_guard<std::mutex> lock(prepare_mu_);
    // The copy threads, made here before any worker: the worker and copy() only read pool_.
    if (!pool_) {
      pool_ = std::make_unique<ThreadPool>(threads_);
      if (!pool_->start_status().ok())  // fewer copy threads only slow the copies down
        ZI_WARN("cuda streaming: %s", pool_->start_status().message().c_str());
    }
    pending_.resize(buffers_.size(), 0);
    requests_.emplace_back(slot, bytes);
    ++pending_[static_cast<size_t>(slot)];
    if (!preparing_) {
      // Decided, launched and stored in one critical section: the worker waits for the lock
      // before it looks at the queue.
      preparing_ = true;
      previous = std::move(prepared_);
      try {
        prepared_ = std::async(std::launch::async, work);
      } catch (...) {  // no thread to spare: the requests are served on this thread below
        here = true;
      }
    }
  } catch (...) {  // no memory for the request: copy() allocates at first use
    return;
  }
  if (here) work();
}

uint64_t SlotStager::pinned_bytes() const {
  wait_prepared(-1);
  uint64_t n = 0;
  for (const Buffer& b : buffers_) n += b.bytes;
  return n;
}

Result<bool> SlotStager::reserve(Buffer& b, size_t bytes) {
  if (b.bytes >= bytes) return true;
  if (unavailable_) return false;
  if (!b.done) ZI_CUDA_TRY(cudaEventCreateWithFlags(&b.done, cudaEventDisableTiming));
  ZI_CUDA_TRY(cudaEventSynchronize(b.done));  // no DMA may still read the old buffer
  b.mem.reset();                              // unlocked under capture_guard.h's lock
  b.data = nullptr;
  b.bytes = 0;
  const size_t want = (bytes + (size_t{2} << 20) - 1) / (size_t{2} << 20) * (size_t{2} << 20);
  Result<PinnedHost> mem = PinnedHost::allocate(want);
  if (!mem.ok()) {
    unavailable_ = true;
    ZI_WARN("cuda streaming: %s; streaming weights from pageable memory instead (slower)",
            mem.status().message().c_str());
    return false;
  }
  b.mem = std::move(mem).value();
  b.data = static_cast<uint8_t*>(b.mem.data());
  b.bytes = want;
  if (!pool_) {
    pool_ = std::make_unique<ThreadPool>(threads_);
    if (!pool_->start_status().ok())  // fewer copy threads only slow the copies down
      ZI_WARN("cuda streaming: %s", pool_->start_status().message().c_str());
  }
  return true;
}

Status SlotStager::copy(int slot, const std::vector<Copy>& copies, cudaStream_t stream) {
  if (slot < 0 || slot >= static_cast<int>(buffers_.size()))
    return InvalidArgument("stream_in: staging slot " + std::to_string(slot) + " out of range");
  size_t total = 0;
  for (const Copy& c : copies) total += c.bytes;
  if (total == 0) return Status::Ok();
  wait_prepared(slot);
  Buffer& b = buffers_[static_cast<size_t>(slot)];
  ZI_ASSIGN_OR_RETURN(bool staged, reserve(b, total));
  if (!staged) {
    for (const Copy& c : copies)
      ZI_CUDA_TRY(cudaMemcpyAsync(c.dst, c.src, c.bytes, cudaMemcpyHostToDevice, stream));
    return Status::Ok();
  }
  // The buffer's previous DMA ran before the slot's previous compute could start; it is done
  // unless the link is behind.
  ZI_CUDA_TRY(cudaEventSynchronize(b.done));
  auto queue = [&]() -> Status {
    size_t at = 0;
    for (const Copy& c : copies) {
      const auto* src = static_cast<const uint8_t*>(c.src);
      auto* dst = static_cast<uint8_t*>(c.dst);
      for (size_t o = 0; o < c.bytes; o += piece_) {
        const size_t n = std::min(piece_, c.bytes - o);
        parallel_copy(*pool_, b.data + at, src + o, n, size_t{256} << 10);
        ZI_CUDA_TRY(cudaMemcpyAsync(dst + o, b.data + at, n, cudaMemcpyHostToDevice, stream));
        at += n;
      }
    }
    ZI_CUDA_TRY(cudaEventRecord(b.done, stream));
    return Status::Ok();
  };
  const Status s = queue();
  if (!s.ok()) {
    // The event may not cover every DMA queued out of the buffer: wait for them here, so the
    // next fill cannot overwrite bytes still being read.
    cudaStreamSynchronize(stream);
    cudaGetLastError();
  }
  return s;
}

}  // namespace zimage::cuda
