// The flags that choose and set up the engine, registered once for `generate`, `serve` and
// `worker` (and the model flags for `convert`): --model DIR and the single files --dit,
// --text-encoder, --vae (docs/FORMATS.md), then --device, --precision, --fp8-layers, --weights,
// --vae-tiling, --vram-budget and --threads. Why one place: every command must pick the same
// model from the same flags, with the same names, checks and usage errors.
//
// Rules: a file flag replaces that component of --model; with all three and no --model, the
// configs come from the tensor shapes and the program's built-in Qwen3 tokenizer is used; one or
// two file flags without --model is a usage error; without any, the tiny built-in model.
#pragma once

#include <CLI/CLI.hpp>
#include <initializer_list>
#include <string>
#include <utility>

#include "lora_args.h"
#include "zimage/zimage.h"

namespace zimage::cli {

struct ModelFlags {
  std::string model;
  std::string dit, text_encoder, vae;
};

// Adds --dit, --text-encoder and --vae to `cmd`.
void add_single_file_flags(CLI::App* cmd, ModelFlags& f);

// Adds --model,-m with the command's help text, then the single-file flags.
void add_model_flags(CLI::App* cmd, ModelFlags& f, const std::string& model_help);

struct ModelChoice {
  bool builtin = false;  // the tiny built-in model (no --model, no files)
};

// Fills eo's model_dir / dit_file / text_encoder_file / vae_file / tokenizer_dir from the flags.
// A usage error (a path that does not exist or is of the wrong kind, file flags that cannot
// stand alone) is kInvalidArgument naming the flag; a failure to unpack the built-in model is
// returned as it is.
Result<ModelChoice> apply_model_flags(const ModelFlags& f, EngineOptions& eo);

// The engine's flags: the model, EngineOptions' device ... threads (their defaults are the flags'
// defaults) and --lora (add_lora_options).
struct EngineFlags {
  ModelFlags model;
  EngineOptions options;
  LoraArgs lora;
};

enum class EngineFlag {
  kDevice,
  kPrecision,
  kFp8Layers,
  kWeights,
  kVaeTiling,
  kVramBudget,
  kHostMemory,
  kStreamedWeights,
  kThreads
};

// A flag a command offers, with its help text (empty: the common one, `zimage worker`'s). The
// commands word some flags for their own readers and list them in their own order, so each
// one's --help reads as it did.
struct EngineFlagHelp {
  EngineFlagHelp(EngineFlag f, std::string h = {}) : flag(f), help(std::move(h)) {}  // NOLINT
  EngineFlag flag;
  std::string help;
};

// Adds `flags` to `cmd` in that order, each with its names, value checks and field of `f`.
void add_engine_flags(CLI::App* cmd, EngineFlags& f, std::initializer_list<EngineFlagHelp> flags);

// The EngineOptions the flags set: device ... threads and lora_lenient (the model goes with
// apply_model_flags, the --lora files with parse_lora_args).
EngineOptions engine_options(const EngineFlags& f);

}  // namespace zimage::cli
