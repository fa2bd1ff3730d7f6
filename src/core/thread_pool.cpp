// Persistent pool: workers sleep on a condition variable; a job is published by bumping a
// generation counter and marking it open. A worker joins (active_ += 1, under the mutex) only
// while the job is open. The submitter runs chunks itself, then closes the job and waits for the
// workers that joined to finish: sleeping workers that never got a CPU slice do not delay it
// (this matters on oversubscribed machines), and no worker can still be looking at a job's
// function after parallel_for returns.
#include "core/thread_pool.h"

#include <algorithm>

namespace zimage {

ThreadPool::ThreadPool(int threads) {
  if (threads <= 0) threads = static_cast<int>(std::thread::hardware_concurrency());
  threads = std::clamp(threads, 1, kMaxThreads);
  // A thread the system refuses (EAGAIN: process or memory limits) must not escape as an
  // exception from a constructor (std::terminate on the joinable threads already started) nor
  // leave a half-built pool: the pool keeps the threads it has, which parallel_for handles as
  // it handles any size.
  try {
    workers_.reserve(static_cast<size_t>(threads - 1));
  } catch (const std::exception&) {
    start_status_ =
        OutOfMemory("thread pool: cannot reserve " + std::to_string(threads) + " thread slots");
    return;
  }
  for (int i = 0; i < threads - 1; ++i) {
    try {
      workers_.emplace_back([this] { worker_loop(); });
    } catch (const std::exception& e) {
      start_status_ =
          Status(ErrorCode::kOutOfMemory, "cannot start thread " + std::to_string(i + 2) + " of " +
                                              std::to_string(threads) + ": " + e.what());
      break;
    }
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  wake_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

namespace {
// True while this thread runs chunks of some pool's job: a nested parallel_for then runs inline
// (re-locking submit_mu_ from its owner would be undefined behaviour).
thread_local bool t_in_job = false;
}  // namespace

void ThreadPool::run_chunks() {
  const bool was_in_job = t_in_job;
  t_in_job = true;
  run_chunks_inner();
  t_in_job = was_in_job;
}

void ThreadPool::run_chunks_inner() {
  for (;;) {
    const int64_t c = next_chunk_.fetch_add(1, std::memory_order_relaxed);
    if (c >= num_chunks_) return;
    const int64_t begin = c * chunk_;
    const int64_t end = std::min(n_, begin + chunk_);
    (*fn_)(begin, end);
  }
}

void ThreadPool::worker_loop() {
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lk(mu_);
      wake_cv_.wait(lk, [&] { return stop_ || (open_ && generation_ != seen); });
      if (stop_) return;
      seen = generation_;
      ++active_;
    }
    run_chunks();
    {
      std::lock_guard<std::mutex> lk(mu_);
      --active_;
    }
    done_cv_.notify_one();
  }
}

void ThreadPool::parallel_for(int64_t n, int64_t grain,
                              const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  if (workers_.empty() || n < 2 * grain || t_in_job) {
    fn(0, n);
    return;
  }
  std::unique_lock<std::mutex> submit(submit_mu_, std::try_to_lock);
  if (!submit.owns_lock()) {  // another thread's job is running: run here
    fn(0, n);
    return;
  }
  // About 4 chunks per thread for load balance, never smaller than grain.
  const int64_t target_chunks = static_cast<int64_t>(size()) * 4;
  const int64_t chunk = std::max(grain, (n + target_chunks - 1) / target_chunks);
  {
    std::lock_guard<std::mutex> lk(mu_);
    fn_ = &fn;
    n_ = n;
    chunk_ = chunk;
    num_chunks_ = (n + chunk - 1) / chunk;
    next_chunk_.store(0, std::memory_order_relaxed);
    open_ = true;
    ++generation_;
  }
  wake_cv_.notify_all();
  run_chunks();  // returns once every chunk is claimed; joined workers may still be running some
  std::unique_lock<std::mutex> lk(mu_);
  open_ = false;
  done_cv_.wait(lk, [&] { return active_ == 0; });
  fn_ = nullptr;
}

}  // namespace zimage
