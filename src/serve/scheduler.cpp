// Bounded queue and worker thread (see scheduler.h).
#include "serve/scheduler.h"

#include <algorithm>
#include <cstdio>

namespace zimage::serve {

Scheduler::~Scheduler() {
  shutdown("server shutting down");
}

void Scheduler::start(std::unique_ptr<Executor> executor, JobSource* source) {
  Executor* ex = executor.get();
  JobSource* from = source != nullptr ? source : this;
  executors_.push_back(std::move(executor));
  workers_.emplace_back([ex, from] {
    try {
      ex->run(*from);
    } catch (...) {
      // Executors must not throw; if one does, its engine cannot generate any more.
      std::fprintf(stderr, "zimage serve: a worker stopped on an unexpected exception\n");
    }
  });
}

void Scheduler::update_gauges_locked() {
  if (metrics_ == nullptr) return;
  metrics_->queue_depth = static_cast<int64_t>(queue_.size());
  metrics_->jobs_running = static_cast<int64_t>(running_.size());
}

Admission Scheduler::submit(const std::shared_ptr<Job>& job) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_) return Admission::kShuttingDown;
  if (queue_.size() >= max_queue_) return Admission::kQueueFull;
  queue_.push_back(job);
  update_gauges_locked();
  cv_.notify_all();
  return Admission::kAccepted;
}

void Scheduler::cancel(const std::shared_ptr<Job>& job, const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = std::find(queue_.begin(), queue_.end(), job);
    if (it != queue_.end()) {
      queue_.erase(it);
      update_gauges_locked();
      job->request_cancel(reason);
      if (metrics_ != nullptr) ++metrics_->jobs_cancelled;
      job->finish_cancelled(reason);
      return;
    }
  }
  // Running (the executor sees the flag at the next step) or already final (no effect).
  if (!is_final(job->snapshot().state)) job->request_cancel(reason);
}

int Scheduler::position(const Job& job) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < queue_.size(); ++i)
    if (queue_[i].get() == &job) return static_cast<int>(i);
  return -1;
}

size_t Scheduler::depth() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queue_.size();
}

Scheduler::Listing Scheduler::list() const {
  std::lock_guard<std::mutex> lock(mu_);
  Listing l;
  for (const auto& j : running_)
    if (!is_final(j->snapshot().state)) l.running.push_back(j);
  l.queued.assign(queue_.begin(), queue_.end());
  return l;
}

std::shared_ptr<Job> Scheduler::running() const {
  std::lock_guard<std::mutex> lock(mu_);
  // A job that just turned final is still in running_ until the executor calls done().
  for (const auto& job : running_)
    if (!is_final(job->snapshot().state)) return job;
  return nullptr;
}

std::shared_ptr<Job> Scheduler::wait_pop() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
  if (stopping_) return nullptr;
  std::shared_ptr<Job> job = queue_.front();
  queue_.pop_front();
  running_.push_back(job);
  job->mark_started();
  update_gauges_locked();
  return job;
}

std::shared_ptr<Job> Scheduler::try_pop_if(const std::function<bool(const Job&)>& pred) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_) return nullptr;
  for (auto it = queue_.begin(); it != queue_.end(); ++it) {
    if (!pred(**it)) continue;
    std::shared_ptr<Job> job = *it;
    queue_.erase(it);
    running_.push_back(job);
    job->mark_started();
    update_gauges_locked();
    return job;
  }
  return nullptr;
}

void Scheduler::done(const std::shared_ptr<Job>& job) {
  std::lock_guard<std::mutex> lock(mu_);
  running_.erase(std::remove(running_.begin(), running_.end(), job), running_.end());
  update_gauges_locked();
  cv_.notify_all();
}

void Scheduler::shutdown(const std::string& reason) {
  std::deque<std::shared_ptr<Job>> queued;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    queued.swap(queue_);
    for (const auto& job : running_) job->request_cancel(reason);
    update_gauges_locked();
    cv_.notify_all();
  }
  for (const auto& job : queued) {
    job->request_cancel(reason);
    if (metrics_ != nullptr) ++metrics_->jobs_cancelled;
    job->finish_cancelled(reason);
  }
  for (std::thread& w : workers_)
    if (w.joinable()) w.join();
  workers_.clear();
  executors_.clear();
}

}  // namespace zimage::serve
