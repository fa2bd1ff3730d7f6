// zimage bench --lora FILE (bench_lora.cpp): merge vs side-GEMM costs of per-request LoRAs.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

namespace zimage::cli {

struct LoraBenchOptions {
  std::string model_dir;
  std::string device = "cuda";
  std::string weights = "bf16";  // or fp8 (FP8 rows: merge falls back to side GEMMs)
  std::string lora;
  float scale = 1.0f;
  std::string prompt;
  int size = 1024;
  int steps = 8;
  int iters = 5;
  int threads = 0;
  std::string json_path;
};

// Prints a Markdown table and the JSON figures; failures print one message and throw
// CLI::RuntimeError(1) as the other commands do.
void run_lora_bench(const LoraBenchOptions& o);

}  // namespace zimage::cli
