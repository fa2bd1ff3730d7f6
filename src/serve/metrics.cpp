// Prometheus text rendering (see metrics.h).
#include "serve/metrics.h"

#include <cstdio>

namespace zimage::serve {

std::string prom_number(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.17g", v);
  return buf;
}

namespace {
std::string num(double v) {
  return prom_number(v);
}
std::string bound(double v) {  // bucket bounds as written: 0.025, not 0.025000000000000001
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%g", v);
  return buf;
}
}  // namespace

void Histogram::observe(double v) {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < kBounds.size(); ++i)
    if (v <= kBounds[i]) ++buckets_[i];
  ++count_;
  sum_ += v;
}

uint64_t Histogram::count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return count_;
}

std::string Histogram::render(const std::string& name, const std::string& labels) const {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string sep = labels.empty() ? "" : ",";
  std::string out;
  for (size_t i = 0; i < kBounds.size(); ++i)
    out += name + "_bucket{" + labels + sep + "le=\"" + bound(kBounds[i]) + "\"} " +
           std::to_string(buckets_[i]) + "\n";
  out += name + "_bucket{" + labels + sep + "le=\"+Inf\"} " + std::to_string(count_) + "\n";
  const std::string l = labels.empty() ? "" : "{" + labels + "}";
  out += name + "_sum" + l + " " + num(sum_) + "\n";
  out += name + "_count" + l + " " + std::to_string(count_) + "\n";
  return out;
}

void Metrics::observe_phase(const std::string& phase, double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  phases_[phase].observe(seconds);
}

void Metrics::count_http(int status) {
  std::lock_guard<std::mutex> lock(mu_);
  ++http_[status];
}

std::string device_memory_metrics(const Engine::Memory& m) {
  std::string o =
      "# HELP zimage_gpu_memory_bytes Device memory the engine's allocator holds (CUDA context "
      "and library workspaces not included)\n# TYPE zimage_gpu_memory_bytes gauge\n";
  o += "zimage_gpu_memory_bytes{kind=\"in_use\"} " + std::to_string(m.in_use_bytes) + "\n";
  o += "zimage_gpu_memory_bytes{kind=\"reserved\"} " + std::to_string(m.reserved_bytes) + "\n";
  o +=
      "zimage_gpu_memory_bytes{kind=\"peak_in_use\"} " + std::to_string(m.peak_in_use_bytes) + "\n";
  return o;
}

std::string Metrics::render() const {
  std::string o;
  auto gauge = [&o](const char* name, const char* help, double v) {
    o += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " gauge\n" + name + " " +
         num(v) + "\n";
  };
  gauge("zimage_ready", "1 when the model is loaded and warmed up", ready.load());
  gauge("zimage_queue_depth", "Jobs waiting in the queue", static_cast<double>(queue_depth));
  gauge("zimage_jobs_running", "Jobs being generated", static_cast<double>(jobs_running));
  o += "# HELP zimage_jobs_total Finished jobs by outcome\n# TYPE zimage_jobs_total counter\n";
  o += "zimage_jobs_total{outcome=\"succeeded\"} " + std::to_string(jobs_succeeded) + "\n";
  o += "zimage_jobs_total{outcome=\"failed\"} " + std::to_string(jobs_failed) + "\n";
  o += "zimage_jobs_total{outcome=\"cancelled\"} " + std::to_string(jobs_cancelled) + "\n";
  o += "# HELP zimage_jobs_rejected_total Jobs refused at admission\n"
       "# TYPE zimage_jobs_rejected_total counter\n";
  o += "zimage_jobs_rejected_total{reason=\"queue_full\"} " + std::to_string(rejected_queue_full) +
       "\n";
  o += "zimage_jobs_rejected_total{reason=\"invalid\"} " + std::to_string(rejected_invalid) + "\n";
  o += "# HELP zimage_images_generated_total Images generated\n"
       "# TYPE zimage_images_generated_total counter\n";
  o += "zimage_images_generated_total " + std::to_string(images_generated) + "\n";
  o += "# HELP zimage_previews_total Live previews computed (jobs that asked for them)\n"
       "# TYPE zimage_previews_total counter\n";
  o += "zimage_previews_total " + std::to_string(previews) + "\n";
  o += "# HELP zimage_batch_steps_total Denoising steps run by the batching worker\n"
       "# TYPE zimage_batch_steps_total counter\n";
  o += "zimage_batch_steps_total " + std::to_string(batch_steps) + "\n";
  o +=
      "# HELP zimage_batch_step_requests_total Requests active in the engine at those steps (sum)\n"
      "# TYPE zimage_batch_step_requests_total counter\n";
  o += "zimage_batch_step_requests_total " + std::to_string(batch_step_requests) + "\n";
  gauge("zimage_batch_max_requests", "Most requests active in the engine at one step",
        static_cast<double>(max_step_requests));
  std::lock_guard<std::mutex> lock(mu_);
  o += "# HELP zimage_phase_seconds Latency of each phase of a job\n"
       "# TYPE zimage_phase_seconds histogram\n";
  for (const auto& [phase, h] : phases_)
    o += h.render("zimage_phase_seconds", "phase=\"" + phase + "\"");
  o += "# HELP zimage_http_requests_total HTTP responses by status code\n"
       "# TYPE zimage_http_requests_total counter\n";
  for (const auto& [code, n] : http_)
    o += "zimage_http_requests_total{code=\"" + std::to_string(code) + "\"} " + std::to_string(n) +
         "\n";
  return o;
}

}  // namespace zimage::serve
