// A small persistent thread pool for the CPU backend's row-parallel ops. Why not std::async or
// OpenMP: ops are called thousands of times per image with microsecond-sized bodies, so threads
// must be created once and woken cheaply; and the engine must not depend on an OpenMP runtime
// that could fight OpenBLAS's own pthreads.
//
// parallel_for blocks until every chunk has run. The calling thread takes part. A call made while
// another parallel_for is running (nested inside a body, or from a second thread) runs inline on
// the calling thread, so the pool can never deadlock on itself.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "core/status.h"

namespace zimage {

class ThreadPool {
 public:
  // Most threads a pool starts (larger requests are clamped): far above any useful count, far
  // below what exhausts a machine's process table.
  static constexpr int kMaxThreads = 1024;

  // threads = total workers including the caller; <= 0 means std::thread::hardware_concurrency().
  // Never throws: when the system refuses a thread, the pool runs with the ones it has and
  // start_status() says what happened (callers that asked for a count turn that into an error).
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }
  // Ok, or why fewer threads than asked were started ("cannot start thread 9 of 64: ...").
  const Status& start_status() const { return start_status_; }

  // Calls fn(begin, end) on disjoint ranges covering [0, n), each at least `grain` long (except
  // possibly the last). Small n (< 2 * grain) or a busy pool runs inline. fn must not throw.
  void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

 private:
  void worker_loop();
  void run_chunks();
  void run_chunks_inner();

  std::vector<std::thread> workers_;
  Status start_status_;
  std::mutex submit_mu_;  // held by the thread that owns the current job

  std::mutex mu_;  // guards everything below except the atomics
  std::condition_variable wake_cv_;
  std::condition_variable done_cv_;
  bool stop_ = false;
  uint64_t generation_ = 0;
  bool open_ = false;  // workers may join the current job
  int active_ = 0;     // workers that joined it and have not finished

  // The current job (written under mu_ before generation_ is bumped).
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t n_ = 0;
  int64_t chunk_ = 1;
  int64_t num_chunks_ = 0;
  std::atomic<int64_t> next_chunk_{0};
};

}  // namespace zimage
