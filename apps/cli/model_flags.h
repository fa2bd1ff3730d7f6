// The model-choosing flags `generate` and `serve` share: --model DIR and the single files --dit,
// --text-encoder, --vae (docs/FORMATS.md). Why one place: both commands must pick the same model
// from the same flags, with the same usage errors.
//
// Rules: a file flag replaces that component of --model; with all three and no --model, the
// configs come from the tensor shapes and the program's built-in Qwen3 tokenizer is used; one or
// two file flags without --model is a usage error; without any, the tiny built-in model.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "zimage/zimage.h"

namespace zimage::cli {

struct ModelFlags {
  std::string model;
  std::string dit, text_encoder, vae;
};

// Adds --dit, --text-encoder and --vae to `cmd` (--model stays the command's own).
void add_single_file_flags(CLI::App* cmd, ModelFlags& f);

struct ModelChoice {
  bool builtin = false;  // the tiny built-in model (no --model, no files)
};

// Fills eo's model_dir / dit_file / text_encoder_file / vae_file / tokenizer_dir from the flags.
// A usage error (a path that does not exist or is of the wrong kind, file flags that cannot
// stand alone) is kInvalidArgument naming the flag; a failure to unpack the built-in model is
// returned as it is.
Result<ModelChoice> apply_model_flags(const ModelFlags& f, EngineOptions& eo);

}  // namespace zimage::cli
