// Subcommands of the `zimage` program. Each lives in its own apps/cli/cmd_<name>.cpp and adds
// itself to the app here; main.cpp calls every register function. Contract for a command: on
// failure it prints one clear message to stderr and throws CLI::RuntimeError(1) (main turns it
// into the exit code; CLI11 prints nothing more); usage errors are CLI11's and exit with 2.
#pragma once

#include <CLI/CLI.hpp>

#include "zimage/zimage.h"

namespace zimage::cli {

// The engine's messages for a command's --verbose / --quiet: --verbose shows at least the info
// lines (ZIMAGE_LOG=debug keeps the debug lines too; it wins over --quiet, as it always did),
// --quiet errors only, neither leaves the level ZIMAGE_LOG sets (warnings when it is unset).
inline void apply_log_flags(bool verbose, bool quiet) {
  if (verbose) {
    if (log_verbosity() < 2) set_log_verbosity(2);
  } else if (quiet) {
    set_log_verbosity(0);
  }
}

// zimage generate --prompt TEXT ... --output FILE.png (text to image).
void register_generate_command(CLI::App& app);

// zimage make-random-model --out DIR (random-weight model folder for benchmarks).
void register_make_random_model_command(CLI::App& app);

// zimage make-random-lora --out FILE [--rank R] (random LoRA for zimage bench --lora).
void register_make_random_lora_command(CLI::App& app);

// zimage info PATH [--json] [--tensors] (configs, tensor/parameter counts, dtypes, sizes).
void register_info_command(CLI::App& app);

// zimage tokenize --tokenizer DIR [--chat-template] (JSON-string lines on stdin -> id arrays).
void register_tokenize_command(CLI::App& app);

// zimage serve --model DIR [--port N] (HTTP image server, src/serve/).
void register_serve_command(CLI::App& app);

// zimage bench [--model DIR | --random-weights] (speed and memory figures).
void register_bench_command(CLI::App& app);

// zimage convert --format FMT --out DIR (bf16 / scaled FP8 single files, GGUF DiT files).
void register_convert_command(CLI::App& app);

// zimage worker --broker redis://HOST:PORT --model DIR (GPU worker fed by a Redis stream).
void register_worker_command(CLI::App& app);

// zimage submit --broker URL --prompt TEXT [--wait --output F.png] (a job for the workers).
void register_submit_command(CLI::App& app);

}  // namespace zimage::cli
