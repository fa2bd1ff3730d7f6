// What the bench modes share (cmd_bench.cpp, bench_fp8.cpp): timing, memory counters, and the
// whole model loaded component by component so a mode can reach each model.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "model/common/linear.h"
#include "model/text_encoder/qwen3_encoder.h"
#include "model/vae/vae.h"
#include "model/dit/zimage_dit.h"
#include "parallel_args.h"
#include "pipeline/text_to_image.h"
#include "pipeline/tokenizer/tokenizer.h"

#ifdef ZIMAGE_WITH_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace zimage::cli::bench {

using json = nlohmann::json;

struct Options {
  std::string model;
  std::vector<double> budgets;  // --vram-budget rows (GiB; 0 = no limit)
  std::string weights = "bf16";
  // Single files replacing components of --model (--dit, --text-encoder, --vae; budget rows only).
  std::string dit_file, text_encoder_file, vae_file;
  bool keep_quantized = true;  // --widen-quantized: false
  bool random_weights = false;
  std::string random_dir = "/tmp/zimage-random-turbo";
  std::string device = "cuda";
  std::vector<int> sizes{1024, 512};
  std::vector<int> batches{1, 4};
  int steps = 8;
  int iters = 5;
  int threads = 0;
  bool ablation = false;
  bool profile = false;
  std::string json_path;
  // --fp8-quality: DiT-output and image quality of --precision fp8 per layer group, against bf16
  std::vector<std::string> fp8_groups;
  std::string lora;  // --lora FILE: the per-request LoRA rows (bench_lora.cpp) instead
  float lora_scale = 1.0f;
  // --pipeline t2i,img2img,...: the image-conditioned pipelines' rows (bench_pipelines.cpp)
  std::vector<std::string> pipelines;
  std::string controlnet;                       // ControlNet of the controlnet rows
  std::string init_image, mask, control_image;  // given inputs (else generated)
  std::string inputs_dir;                       // where generated inputs are written
  double strength = 0.6;                        // img2img / inpaint
  float control_scale = 0.75f;
  ParallelArgs parallel;  // --devices LIST --parallel sequence: the scaling rows (bench_seqpar.cpp)
};

// The prompt diffusers_baseline.py and diffusers_compare.py use (35 tokens after the template).
extern const char* const kPrompt;

double now_s();

struct Stats {
  double median_ms = 0, min_ms = 0, max_ms = 0;
  json to_json() const {
    return {{"median_ms", median_ms}, {"min_ms", min_ms}, {"max_ms", max_ms}};
  }
};

// Prints "zimage bench: <status>" and ends the command with exit status 1.
[[noreturn]] void fail(const Status& s);
void check(const Status& s);

// Runs fn `warm` times, then `iters` timed times (the backend synchronised around each).
Stats timed(Backend& be, int warm, int iters, const std::function<Status()>& fn);

// GPU memory the process holds (device total - free), GiB; 0 on the CPU.
double gpu_used_gib();

// The CUDA caching allocator's counters, in GiB (all zero on the CPU): bytes in live tensors now
// and their high-water mark since the last reset (what torch.cuda.max_memory_allocated reports for
// diffusers); the high-water mark of the device memory it holds (cudaMalloc'd segments), which the
// cudaMemGetInfo reading after a phase can miss now that idle segments are given back; and the
// cudaMalloc + cudaFree calls so far (a steady state makes none).
struct AllocCounters {
  double in_use_gib = 0, peak_gib = 0, reserved_peak_gib = 0;
  uint64_t device_calls = 0;
};
AllocCounters alloc_counters(Backend& be);
void reset_alloc_peak(Backend& be);
#ifdef ZIMAGE_WITH_CUDA
cuda::CudaBackend* as_cuda(Backend& be);
#endif

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

// `zimage bench --pipeline ...` (bench_pipelines.cpp): per pipeline (text-to-image, img2img,
// inpainting, ControlNet, ControlNet inpainting) s / image and peak GPU memory at the first
// --sizes, --steps, on `dir` (+ o.controlnet); Markdown on stdout, JSON to o.json_path.
void run_pipeline_bench(const Options& o, const std::string& dir, json& R);

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

// `zimage bench --fp8-quality GROUPS...` (bench_fp8.cpp): per layer group, --precision fp8's
// DiT output and image against bf16 (cosine, relative L2, PSNR) and its speed.
void run_fp8_quality(const Options& o, const std::string& dir, json& R);

}  // namespace zimage::cli::bench
