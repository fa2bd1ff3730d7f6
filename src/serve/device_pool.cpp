// Per-engine views of the queue and their reports (see device_pool.h).
#include "serve/device_pool.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <thread>

#include "serve/metrics.h"

namespace zimage::serve {

namespace {
std::string num(double v) {
  return prom_number(v);
}
// Label values are device names ("cuda:1", "cpu"): nothing to escape, but stay safe.
std::string label(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}
// "cuda:0 NVIDIA H200 (bf16)" -> "cuda:0"; "cpu (OpenBLAS, 2 threads)" -> "cpu".
std::string first_word(const std::string& s) {
  return s.substr(0, s.find(' '));
}
}  // namespace

EngineSlot::EngineSlot(JobSource& queue, int index, std::string device, Engine* engine)
    : queue_(queue),
      index_(index),
      device_(device.empty() || device == "auto" ? first_word(engine->info().device)
                                                 : std::move(device)),
      engine_(engine),
      info_(engine->info()) {}

void run_each(size_t n, const std::function<void(size_t)>& fn) {
  std::vector<std::thread> threads;
  size_t started = 1;
  try {
    for (; started < n; ++started) threads.emplace_back(fn, started);
  } catch (...) {  // no thread to be had: the rest run on this one
  }
  if (n > 0) fn(0);
  for (size_t i = started; i < n; ++i) fn(i);
  for (auto& t : threads) t.join();
}

double EngineSlot::busy_seconds() const {
  std::lock_guard<std::mutex> lock(mu_);
  Clock::duration d = busy_;
  if (!in_flight_.empty()) d += Clock::now() - busy_since_;
  return std::chrono::duration<double>(d).count();
}

void EngineSlot::took(const std::shared_ptr<Job>& job) {
  std::lock_guard<std::mutex> lock(mu_);
  if (in_flight_.empty()) busy_since_ = Clock::now();
  in_flight_.push_back(job.get());
}

std::shared_ptr<Job> EngineSlot::wait_pop() {
  std::shared_ptr<Job> job = queue_.wait_pop();
  if (job) took(job);
  return job;
}

std::shared_ptr<Job> EngineSlot::try_pop_if(const std::function<bool(const Job&)>& pred) {
  std::shared_ptr<Job> job = queue_.try_pop_if(pred);
  if (job) took(job);
  return job;
}

void EngineSlot::done(const std::shared_ptr<Job>& job) {
  // Counted before the queue hears of it: a client that saw the job final and then the queue
  // drained also sees it in this engine's counters.
  const JobSnapshot s = job->snapshot();
  bool counted = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = std::find(in_flight_.begin(), in_flight_.end(), job.get());
    if (it != in_flight_.end()) {  // once per job, whatever the executor reports
      in_flight_.erase(it);
      counted = true;
      if (in_flight_.empty()) busy_ += Clock::now() - busy_since_;
    }
  }
  if (counted) {
    ++jobs_;
    if (s.state == JobState::kSucceeded) images_ += s.image_count;
  }
  queue_.done(job);
}

Status warm_up(Engine& engine) {
  const EngineInfo info = engine.info();
  GenerateRequest req;
  req.prompts = {"warm-up"};
  const int m = std::max(1, info.size_multiple);
  req.width = req.height = std::min(info.max_side, (64 + m - 1) / m * m);
  req.steps = 1;
  auto r = engine.generate(req);
  return r.ok() ? Status::Ok() : r.status().with_context("warm-up generation");
}

nlohmann::json engines_json(const EngineSlots& slots) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& s : slots)
    out.push_back({{"engine", s->index()},
                   {"device", s->device()},
                   {"backend", s->info().device},
                   {"jobs", s->jobs()},
                   {"images", s->images()},
                   {"busy_s", s->busy_seconds()}});
  return out;
}

std::string engines_metrics(const EngineSlots& slots) {
  std::string o =
      "# HELP zimage_engines Engines serving the queue (one per --devices entry)\n"
      "# TYPE zimage_engines gauge\nzimage_engines " +
      std::to_string(slots.size()) + "\n";
  auto family = [&](const char* name, const char* help, auto value) {
    o += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " counter\n";
    for (const auto& s : slots)
      o += std::string(name) + "{engine=\"" + std::to_string(s->index()) + "\",device=\"" +
           label(s->device()) + "\"} " + value(*s) + "\n";
  };
  family("zimage_engine_jobs_total", "Jobs an engine finished (any outcome)",
         [](const EngineSlot& s) { return std::to_string(s.jobs()); });
  family("zimage_engine_images_total", "Images of the jobs an engine finished successfully",
         [](const EngineSlot& s) { return std::to_string(s.images()); });
  family("zimage_engine_busy_seconds_total", "Seconds an engine had at least one job",
         [](const EngineSlot& s) { return num(s.busy_seconds()); });
  if (slots.size() > 1) {
    std::string mem;
    for (const auto& s : slots) {
      const Engine::Memory m = s->engine()->memory();
      if (m.reserved_bytes == 0) continue;
      const std::string l =
          "engine=\"" + std::to_string(s->index()) + "\",device=\"" + label(s->device()) + "\",";
      mem += "zimage_gpu_memory_bytes{" + l + "kind=\"in_use\"} " + std::to_string(m.in_use_bytes) +
             "\n";
      mem += "zimage_gpu_memory_bytes{" + l + "kind=\"reserved\"} " +
             std::to_string(m.reserved_bytes) + "\n";
      mem += "zimage_gpu_memory_bytes{" + l + "kind=\"peak_in_use\"} " +
             std::to_string(m.peak_in_use_bytes) + "\n";
    }
    if (!mem.empty())
      o += "# HELP zimage_gpu_memory_bytes Device memory each engine's allocator holds (CUDA "
           "context and library workspaces not included)\n# TYPE zimage_gpu_memory_bytes gauge\n" +
           mem;
  }
  return o;
}

std::vector<std::string> shared_device_notes(const std::vector<std::string>& devices) {
  std::map<std::string, std::vector<size_t>> by_device;
  for (size_t i = 0; i < devices.size(); ++i) by_device[devices[i]].push_back(i);
  std::vector<std::string> notes;
  for (const auto& [dev, engines] : by_device) {
    if (engines.size() < 2) continue;
    std::string who;
    for (size_t k = 0; k < engines.size(); ++k) {
      if (k > 0) who += k + 1 == engines.size() ? " and " : ", ";
      who += std::to_string(engines[k]);
    }
    notes.push_back("engines " + who + " share " + dev +
                    " (each holds its own weights and memory plan there)");
  }
  return notes;
}

}  // namespace zimage::serve
