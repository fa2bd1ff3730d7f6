// Execution of queued jobs on the worker thread. Why an interface in front of the engine
// (EngineRunner): the worker's failure handling must itself be testable (a job whose engine call
// fails or throws fails alone, the next one succeeds), so tests can wrap the real engine in one
// that fails on demand. SerialExecutor is this branch's executor: one job at a time through
// Engine::generate, progress from GenerateHooks::on_progress, cancel through GenerateHooks::cancel.
//
// Cross-request batching is the other executor (batching_executor.h, --batching on), over the
// engine's step-wise API (Engine::batch_add / batch_step).
#pragma once

#include <memory>

#include "serve/metrics.h"
#include "serve/scheduler.h"
#include "zimage/zimage.h"

namespace zimage::serve {

class EngineRunner {
 public:
  virtual ~EngineRunner() = default;
  virtual Result<GenerateResult> generate(const GenerateRequest& req,
                                          const GenerateHooks& hooks) = 0;
};

// The real engine.
class EngineAdapter : public EngineRunner {
 public:
  explicit EngineAdapter(Engine* engine) : engine_(engine) {}
  Result<GenerateResult> generate(const GenerateRequest& req, const GenerateHooks& hooks) override {
    return engine_->generate(req, hooks);
  }

 private:
  Engine* engine_;
};

class SerialExecutor : public Executor {
 public:
  // `runner` and `metrics` must outlive the executor.
  SerialExecutor(EngineRunner* runner, Metrics* metrics) : runner_(runner), metrics_(metrics) {}
  void run(JobSource& jobs) override;
  // Runs one job to a final state; never throws.
  void run_job(Job& job) noexcept;

 private:
  // Marks `job` failed from inside a catch block without letting a second exception out.
  void fail_safely(Job& job, const JobTimings& t, int status, const char* what) noexcept;
  EngineRunner* runner_;
  Metrics* metrics_;
};

}  // namespace zimage::serve
