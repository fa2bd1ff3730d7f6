// The benchmarks behind `zimage bench` (docs/BENCHMARKS.md): the numbers the docs report, measured
// the way the reference is (tools/diffusers_compare.py). Why a library apart from the CLI: the
// measurements are engine code (they reach models, pipelines and the backend's counters), the
// command only parses flags. Only the Backend interface is used, so one build measures any backend.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "core/status.h"

namespace zimage::bench {

struct Options {
  std::string model;
  std::vector<double> budgets;  // --vram-budget rows (GiB; 0 = no limit)
  std::string weights = "bf16";
  std::string streamed_weights = "copy";  // --streamed-weights for the --vram-budget rows
  // Single files replacing components of --model (--dit, --text-encoder, --vae; budget rows only).
  std::string dit_file, text_encoder_file, vae_file;
  bool keep_quantized = true;  // --widen-quantized: false
  bool random_weights = false;
  std::string random_dir = "/tmp/zimage-random-turbo";
  // The tokenizer folder a new random-weight folder gets (asked only when one is written).
  std::function<Result<std::string>()> random_tokenizer_dir;
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
  // --fp8-layers LIST: the standard rows with these DiT layers in FP8 (--precision fp8's layers,
  // model/common/linear.h; e.g. "all" or "all,sdpa"); empty = bf16.
  std::string fp8_layers;
  std::string lora;  // --lora FILE: the per-request LoRA rows (lora_costs.cpp) instead
  float lora_scale = 1.0f;
  // --pipeline t2i,img2img,...: the image-conditioned pipelines' rows (pipelines.cpp)
  std::vector<std::string> pipelines;
  std::string controlnet;                       // ControlNet of the controlnet rows
  std::string init_image, mask, control_image;  // given inputs (else generated)
  std::string inputs_dir;                       // where generated inputs are written
  double strength = 0.6;                        // img2img / inpaint
  float control_scale = 0.75f;
  // --devices LIST --parallel sequence: the scaling rows (seqpar.cpp). The caller resolves the
  // list; its error, if any, is reported once the model folder is known.
  struct Parallel {
    bool requested = false;  // --devices or --parallel given
    std::string parallel;    // --parallel; the rows need "sequence"
    std::vector<std::string> devices;
    std::string devices_error;  // why the flags do not give a device list
    std::string comm = "auto";  // --parallel-comm
  } parallel;
};

// Runs the measurement `o` asks for: Markdown on stdout, progress on stderr, the figures as JSON
// on stdout or in o.json_path. A failure is printed on stderr where it happens ("zimage bench:
// ...", as every zimage command does) and returned, so the caller only sets the exit status.
Status run(const Options& o);

}  // namespace zimage::bench
