// The bounded job queue in front of the engine, and the seam between HTTP and execution.
// Why this shape: HTTP handlers only submit, cancel and look at jobs; an Executor owns the engine
// and pulls jobs from the queue (JobSource) on the one worker thread. Today's executor
// (SerialExecutor) runs one job at a time through Engine::generate. A batching executor can
// replace it without touching any HTTP code: at each denoising-step boundary it would call
// try_pop_if() for queued jobs with the same size/steps/guidance and join them to the running
// DiT batch. What it needs from the engine (a step-wise pipeline API) is written in executor.h.
// Data parallel (serve --devices): one executor and worker thread per engine, all on this queue.
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "serve/job.h"
#include "serve/metrics.h"

namespace zimage::serve {

// What an executor sees of the queue.
class JobSource {
 public:
  virtual ~JobSource() = default;
  // The next job (now marked running), waiting while the queue is empty; nullptr once the server
  // shuts down. Never returns a cancelled job.
  virtual std::shared_ptr<Job> wait_pop() = 0;
  // The first queued job that satisfies `pred`, without waiting; nullptr if none.
  virtual std::shared_ptr<Job> try_pop_if(const std::function<bool(const Job&)>& pred) = 0;
  // The executor reports a job it took as finished (for the running gauge and shutdown).
  virtual void done(const std::shared_ptr<Job>& job) = 0;
};

// Runs jobs from a JobSource until it returns nullptr. Must not throw (it runs on the worker
// thread); a failing job is marked failed and the next one runs.
class Executor {
 public:
  virtual ~Executor() = default;
  virtual void run(JobSource& jobs) = 0;
};

enum class Admission { kAccepted, kQueueFull, kShuttingDown };

class Scheduler : public JobSource {
 public:
  Scheduler(size_t max_queue, Metrics* metrics) : max_queue_(max_queue), metrics_(metrics) {}
  ~Scheduler() override;

  // Starts a worker thread running `executor` (the scheduler keeps it alive) on `source` (a view
  // of this queue, e.g. one that counts an engine's work; null: the queue itself). Called once
  // per engine: every worker pulls from the one queue (data parallel, serve --devices).
  void start(std::unique_ptr<Executor> executor, JobSource* source = nullptr);
  Admission submit(const std::shared_ptr<Job>& job);
  // Cancels a queued job at once, or a running one at its next step. Idempotent: true when the
  // job is (or will be) cancelled or had already finished.
  void cancel(const std::shared_ptr<Job>& job, const std::string& reason);
  // 0-based position among queued jobs; -1 when not queued.
  int position(const Job& job) const;
  size_t depth() const;
  // A running job that has not finished yet (the oldest taken), if any.
  std::shared_ptr<Job> running() const;
  // Every running job (oldest first) and every queued one (in queue order), at one instant.
  struct Listing {
    std::vector<std::shared_ptr<Job>> running, queued;
  };
  Listing list() const;
  // Stops accepting, cancels every queued and running job with `reason`, joins the workers.
  void shutdown(const std::string& reason);

  // JobSource
  std::shared_ptr<Job> wait_pop() override;
  std::shared_ptr<Job> try_pop_if(const std::function<bool(const Job&)>& pred) override;
  void done(const std::shared_ptr<Job>& job) override;

 private:
  void update_gauges_locked();

  const size_t max_queue_;
  Metrics* metrics_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> queue_;
  std::vector<std::shared_ptr<Job>> running_;
  bool stopping_ = false;
  std::vector<std::unique_ptr<Executor>> executors_;
  std::vector<std::thread> workers_;
};

}  // namespace zimage::serve
