// Server metrics in the Prometheus text format (version 0.0.4). Why hand-rolled: a handful of
// counters, gauges and fixed-bucket histograms do not justify a client library (prometheus-cpp is
// not packaged for Debian 12); the format itself is four line shapes. Thread-safe.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "zimage/zimage.h"

namespace zimage::serve {

class Histogram {
 public:
  static constexpr std::array<double, 14> kBounds = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                                     1,     2.5,  5,     10,   30,  60,   120};
  void observe(double v);
  // The "_bucket", "_sum" and "_count" lines for `name` with `labels` ("phase=\"vae\"").
  std::string render(const std::string& name, const std::string& labels) const;
  uint64_t count() const;

 private:
  mutable std::mutex mu_;
  std::array<uint64_t, kBounds.size()> buckets_{};
  uint64_t count_ = 0;
  double sum_ = 0;
};

// A sample value as Prometheus writes it (shortest round-trip form, "%.17g").
std::string prom_number(double v);

// The engine's device memory as Prometheus gauges (zimage_gpu_memory_bytes{kind=...}).
std::string device_memory_metrics(const Engine::Memory& m);

class Metrics {
 public:
  std::atomic<int64_t> queue_depth{0};
  std::atomic<int64_t> jobs_running{0};
  std::atomic<uint64_t> jobs_succeeded{0};
  std::atomic<uint64_t> jobs_failed{0};
  std::atomic<uint64_t> jobs_cancelled{0};
  std::atomic<uint64_t> rejected_queue_full{0};
  std::atomic<uint64_t> rejected_invalid{0};
  std::atomic<uint64_t> images_generated{0};
  // Live previews the engines computed (only for jobs that asked: docs/SERVER.md).
  std::atomic<uint64_t> previews{0};
  // Continuous batching: denoising steps run, and the requests (engine runs) active at each; their
  // ratio is the mean batch size when all requests have one size. max_step_requests: the most.
  std::atomic<uint64_t> batch_steps{0};
  std::atomic<uint64_t> batch_step_requests{0};
  std::atomic<uint64_t> max_step_requests{0};
  std::atomic<int> ready{0};

  // Phases: queue_wait, tokenize, text_encoder, denoise, vae, encode, total.
  void observe_phase(const std::string& phase, double seconds);
  void count_http(int status);
  std::string render() const;

 private:
  mutable std::mutex mu_;
  std::map<std::string, Histogram> phases_;
  std::map<int, uint64_t> http_;
};

}  // namespace zimage::serve
