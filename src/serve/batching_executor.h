// Continuous batching of jobs on the worker thread (zimage serve --batching on, the default).
// Why: one image at a time leaves the GPU under-used at small sizes, and a request that arrives
// while another is denoising should not wait for it to finish. The engine's batch API
// (Engine::batch_add / batch_step) lets requests of the same size share each DiT forward; this
// executor feeds it: between two steps it admits queued jobs of the running size (up to
// `max_images` images in the batch), reports each job's own progress, retires the runs whose
// steps are done, and finishes a job when all its runs are done. A request's image does not
// depend on its company beyond the rounding of the DiT's GEMMs over more rows (measured in
// docs/SERVER.md); --batching off (SerialExecutor) gives exactly zimage generate's image.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <vector>

#include "serve/executor.h"
#include "serve/metrics.h"
#include "serve/scheduler.h"
#include "zimage/zimage.h"

namespace zimage::serve {

// The engine's batch API (a seam so tests can make a step fail on demand).
class BatchRunner {
 public:
  virtual ~BatchRunner() = default;
  virtual Result<uint64_t> batch_add(const GenerateRequest& req, const GenerateHooks& hooks) = 0;
  virtual std::vector<BatchOutcome> batch_step() = 0;
  virtual int batch_active() const = 0;
};

class EngineBatchRunner : public BatchRunner {
 public:
  explicit EngineBatchRunner(Engine* engine) : engine_(engine) {}
  Result<uint64_t> batch_add(const GenerateRequest& req, const GenerateHooks& hooks) override {
    return engine_->batch_add(req, hooks);
  }
  std::vector<BatchOutcome> batch_step() override { return engine_->batch_step(); }
  int batch_active() const override { return engine_->batch_active(); }

 private:
  Engine* engine_;
};

class BatchingExecutor : public Executor {
 public:
  // `runner` and `metrics` must outlive the executor. `max_images`: images per DiT step, >= 1.
  BatchingExecutor(BatchRunner* runner, Metrics* metrics, int max_images)
      : runner_(runner), metrics_(metrics), max_images_(max_images < 1 ? 1 : max_images) {}
  void run(JobSource& jobs) override;

 private:
  using Clock = std::chrono::steady_clock;
  struct Active {
    std::shared_ptr<Job> job;
    Clock::time_point start;
    std::vector<int> run_steps;                     // steps done per run
    std::vector<std::vector<EncodedImage>> images;  // per run, once done
    size_t runs_left = 0;
    int width = 0, height = 0, images_in_batch = 0;
    std::vector<LoraSpec> loras;  // jobs join the running batch only with the same LoRA set
    JobTimings timings;
    bool over = false;  // finished (any outcome): remaining outcomes are ignored
  };

  // Adds every run of `job` to the engine's batch; false when the job ended at the door.
  bool admit(const std::shared_ptr<Job>& job, JobSource& jobs) noexcept;
  void on_outcome(BatchOutcome& o, JobSource& jobs) noexcept;
  void end(Active& a, JobSource& jobs) noexcept;
  void fail(Active& a, const ApiError& e, JobSource& jobs) noexcept;
  int images_running() const;

  BatchRunner* runner_;
  Metrics* metrics_;
  const int max_images_;
  std::map<uint64_t, std::shared_ptr<Active>> actives_;  // by job id order of admission
  std::map<uint64_t, std::pair<std::shared_ptr<Active>, size_t>> tickets_;  // engine id -> run
  uint64_t next_active_ = 0;
};

}  // namespace zimage::serve
