// What the bench modes share (src/bench/*.cpp): timing, memory counters, failing out of a mode,
// and the whole model loaded component by component so a mode can reach each model.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "bench/bench.h"
#include "bench/gpu_sampler.h"
#include "model/common/linear.h"
#include "model/dit/zimage_dit.h"
#include "model/text_encoder/qwen3_encoder.h"
#include "model/vae/vae.h"
#include "pipeline/text_to_image.h"
#include "pipeline/tokenizer/tokenizer.h"

namespace zimage::bench {

using json = nlohmann::json;

// The prompt diffusers_baseline.py and diffusers_compare.py use (35 tokens after the template).
extern const char* const kPrompt;

double now_s();

struct Stats {
  double median_ms = 0, min_ms = 0, max_ms = 0;
  GpuSampler::Reading gpu;  // SM clock and board power over the timed runs (samples 0: none)
  int runs = 0;             // timed runs the energy counter covered
  // The board's energy per timed run (J) and the window's mean power (W) from NVML's energy
  // counter; 0 without one. At the power limit, time per run >= J per run / limit. The power is
  // the counter's between its first and last step inside the window where it stepped at least
  // twice over kMinStepSeconds (GpuSampler::Reading), else the counter's difference over the
  // window; a run's energy is that power times the window's time a run.
  static constexpr double kMinStepSeconds = 0.1;
  bool steps_used() const {
    return gpu.energy_j > 0 && gpu.energy_steps >= 2 && gpu.step_seconds >= kMinStepSeconds;
  }
  double mean_power_w() const {
    if (steps_used()) return gpu.step_power_w;
    return gpu.energy_seconds > 0 ? gpu.energy_j / gpu.energy_seconds : 0;
  }
  double joules_per_run() const {
    if (runs <= 0) return 0;
    return steps_used() ? gpu.step_power_w * gpu.energy_seconds / runs : gpu.energy_j / runs;
  }
  json to_json() const {
    json j = {{"median_ms", median_ms}, {"min_ms", min_ms}, {"max_ms", max_ms}};
    if (gpu.samples > 0) {
      j["sm_mhz_median"] = gpu.sm_mhz_median;
      j["sm_mhz_min"] = gpu.sm_mhz_min;
    }
    if (gpu.power_samples > 0) {
      j["power_w_mean"] = gpu.power_w_mean;  // NVML's reading: a 1 s running average on Hopper
      j["power_w_max"] = gpu.power_w_max;
      j["power_limit_w"] = gpu.power_limit_w;
    }
    if (gpu.energy_j > 0) {
      j["joules_per_run"] = joules_per_run();
      j["energy_power_w"] = mean_power_w();
      j["energy_window_j"] = gpu.energy_j;  // the counter's difference over the whole window
      j["energy_window_s"] = gpu.energy_seconds;
      j["energy_steps"] = gpu.energy_steps;
      j["energy_from_steps"] = steps_used();
    }
    return j;
  }
  // " (SM 1575 MHz, 690 W of 700, 64.2 J a run)", or "" without samples.
  std::string clock_note() const;
};

// Thrown by fail() once the message is printed; run() (bench.cpp) catches it and returns the
// Status, so it never leaves the library.
struct Abort {
  Status status;
};

// Prints "<who>: <status>" on stderr and ends the measurement (throws Abort).
[[noreturn]] void fail(const Status& s, const char* who = "zimage bench");
void check(const Status& s);

// The figures as JSON: to o.json_path, or after a blank line on stdout without one (a failed
// write fails as `who`).
void emit_json(const Options& o, const json& R, const char* who = "zimage bench");

// Runs fn `warm` times, then `iters` timed times (the backend synchronised around each).
// Runs fn warm times, then iters timed times (each to completion); with a sampler, the GPU's
// clock and power over the timed runs too.
Stats timed(Backend& be, int warm, int iters, const std::function<Status()>& fn,
            GpuSampler* sampler = nullptr);

// Memory used on the current CUDA device (device total - free), GiB; 0 without one.
double gpu_used_gib();

// The caching allocator's counters, in GiB (all zero on the CPU): bytes in live tensors now
// and their high-water mark since the last reset (what torch.cuda.max_memory_allocated reports for
// diffusers); the high-water mark of the device memory it holds (cudaMalloc'd segments), which the
// cudaMemGetInfo reading after a phase can miss now that idle segments are given back; and the
// cudaMalloc + cudaFree calls so far (a steady state makes none).
struct AllocCounters {
  double in_use_gib = 0, peak_gib = 0, reserved_peak_gib = 0;
  uint64_t device_calls = 0;
};
AllocCounters alloc_counters(const Backend& be);

// Samples the driver's view of device memory (total - free) every millisecond on its own thread:
// the peak of a run as the driver sees it, the CUDA context and library memory included. Zero on
// the CPU (no device memory to read).
class DriverPeak {
 public:
  explicit DriverPeak(Backend& be) : be_(be), thread_([this] { loop(); }) {}
  ~DriverPeak() {
    stop_ = true;
    thread_.join();
  }
  DriverPeak(const DriverPeak&) = delete;
  DriverPeak& operator=(const DriverPeak&) = delete;
  uint64_t peak() const { return peak_.load(); }
  void reset() { peak_ = 0; }

 private:
  void loop() {
    if (!be_.bind_thread().ok()) return;
    while (!stop_) {
      auto m = be_.device_memory();
      if (m.ok()) {
        const uint64_t used = m->first - m->second;
        uint64_t p = peak_.load();
        while (used > p && !peak_.compare_exchange_weak(p, used)) {
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  Backend& be_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> peak_{0};
  std::thread thread_;
};

// Latents of `bs` images of res² (latent side res / fac) from TorchCpuGenerator(seed), on `be`
// in f32.
Tensor random_latents(Backend& be, uint64_t seed, int bs, int res, int fac);

// Forget recorded DiT forwards of other shapes and give idle memory back, so a measurement
// starts as a fresh process with its one shape would.
void fresh_memory(Backend& be, ZImageDiT& dit);

struct Loaded {
  std::unique_ptr<Backend> be;
  Qwen3Encoder* te = nullptr;
  ZImageDiT* dit = nullptr;
  VaeDecoder* vae = nullptr;
  std::unique_ptr<Tokenizer> tok;
  std::unique_ptr<TextToImage> pipe;
  double load_s = 0;
};

Result<std::unique_ptr<Backend>> make_backend(const std::string& device, DType act, int threads);
// The folder's tokenizer, text encoder, DiT (placed as `dit_placement` says) and VAE on a new
// backend, timed until every upload landed.
Result<Loaded> load_all(const std::string& dir, const std::string& device, DType act, int threads,
                        const WeightPlacement& dit_placement = {});

// ---- the modes (one file each); `dir` is the model folder, R collects the JSON figures ----

// The default figures (standard.cpp): load, text encoder, DiT forwards, VAE, whole images
// (+ --profile, --ablation), the Markdown table and the JSON.
void run_standard(const Options& o, const std::string& dir, json& R);

// `zimage bench --vram-budget A B ...` (budget.cpp): per budget a fresh pipeline loaded under it.
void run_budget_rows(const Options& o, const std::string& dir, json& R);

// `zimage bench --pipeline ...` (pipelines.cpp): per pipeline (text-to-image, img2img,
// inpainting, ControlNet, ControlNet inpainting) s / image and peak GPU memory at the first
// --sizes, --steps, on `dir` (+ o.controlnet); Markdown on stdout, JSON to o.json_path.
void run_pipeline_bench(const Options& o, const std::string& dir, json& R);

// `zimage bench --fp8-quality GROUPS...` (fp8_quality.cpp): per layer group, --precision fp8's
// DiT output and image against bf16 (cosine, relative L2, PSNR) and its speed.
void run_fp8_quality(const Options& o, const std::string& dir, json& R);

// `zimage bench --lora FILE` (lora_costs.cpp): merge vs side-GEMM costs of per-request LoRAs, its
// own Markdown table and JSON.
void run_lora_bench(const Options& o, const std::string& dir);

// `zimage bench --devices LIST --parallel sequence` (seqpar.cpp): the DiT forward time per rank
// count over o.parallel.devices at each o.sizes entry: a Markdown table on stdout, the rows in
// R["sequence_parallel"].
void run_seqpar_bench(const Options& o, const std::string& dir, json& R);

}  // namespace zimage::bench
