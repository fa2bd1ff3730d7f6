// Data parallelism in the server (zimage serve --devices cuda:0,cuda:1,...): several whole
// engines, one per device, behind the one queue. Why this shape: the Scheduler stays the single
// JobSource; each engine gets its own executor (serial or batching, as configured) on its own
// worker thread, and pulls through an EngineSlot, a view of the queue that counts what that
// engine did (jobs, images, busy time) for /readyz and /metrics. Nothing else changes: an
// Engine binds its device at every call and owns its LoRA state, so every per-request option
// works the same whichever engine takes the job.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "serve/scheduler.h"
#include "zimage/zimage.h"

namespace zimage::serve {

// One engine of the server and what it did. Thread-safe.
class EngineSlot : public JobSource {
 public:
  // `queue` and `engine` must outlive the slot. `device`: as listed ("cuda:1", "cpu"); empty or
  // "auto": the device the engine picked ("cuda:0", "cpu").
  EngineSlot(JobSource& queue, int index, std::string device, Engine* engine);

  int index() const { return index_; }
  const std::string& device() const { return device_; }
  Engine* engine() const { return engine_; }
  const EngineInfo& info() const { return info_; }

  uint64_t jobs() const { return jobs_.load(); }      // taken and finished, any outcome
  uint64_t images() const { return images_.load(); }  // in jobs that succeeded
  double busy_seconds() const;                        // with at least one job taken

  // JobSource: the queue's, counted.
  std::shared_ptr<Job> wait_pop() override;
  std::shared_ptr<Job> try_pop_if(const std::function<bool(const Job&)>& pred) override;
  void done(const std::shared_ptr<Job>& job) override;

 private:
  using Clock = std::chrono::steady_clock;
  void took(const std::shared_ptr<Job>& job);

  JobSource& queue_;
  const int index_;
  const std::string device_;
  Engine* const engine_;
  const EngineInfo info_;
  std::atomic<uint64_t> jobs_{0};
  std::atomic<uint64_t> images_{0};
  mutable std::mutex mu_;
  std::vector<const Job*> in_flight_;  // jobs taken and not done (the batching executor: many)
  Clock::time_point busy_since_;
  Clock::duration busy_{0};
};

using EngineSlots = std::vector<std::unique_ptr<EngineSlot>>;

// Runs fn(0) .. fn(n - 1) at once, one thread each (fn(0) on the calling thread); where no
// thread can be had, the rest run here one after another. `fn` must not throw.
void run_each(size_t n, const std::function<void(size_t)>& fn);

// Warms `engine` up: one tiny generation (the first call's one-time costs: plans, graphs).
Status warm_up(Engine& engine);

// /readyz's "devices": one object per engine (engine, device, backend, jobs, images, busy_s).
nlohmann::json engines_json(const EngineSlots& slots);
// Prometheus text: zimage_engines, and per engine (labels engine="i", device="...")
// zimage_engine_jobs_total, zimage_engine_images_total, zimage_engine_busy_seconds_total; the
// device memory gauge (zimage_gpu_memory_bytes) per engine when there are several.
std::string engines_metrics(const EngineSlots& slots);

// Engines that share a device, as log lines ("engines 0 and 2 share cuda:0"); none when every
// device is listed once.
std::vector<std::string> shared_device_notes(const std::vector<std::string>& devices);

}  // namespace zimage::serve
