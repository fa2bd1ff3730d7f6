// --lora FILE[:SCALE] (repeatable) and --lora-lenient, shared by `zimage generate` and
// `zimage serve` (both merge the LoRAs into the transformer at load).
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "zimage/zimage.h"

namespace zimage::cli {

struct LoraArgs {
  std::vector<std::string> loras;  // as given: FILE or FILE:SCALE
  bool lenient = false;
};

void add_lora_options(CLI::App* cmd, LoraArgs& args);

// One --lora value. The scale is the text after the LAST ':' only when all of it reads as a
// number ("a:b.safetensors" is a path; "x.safetensors:0.8" is x.safetensors at 0.8; a file whose
// name ends in ":<number>" needs an explicit ":1"). The scale must be finite. Returns false with a
// message naming the flag and the value (a usage error).
bool parse_lora_arg(const std::string& text, LoraSpec* out, std::string* error);

// Every --lora, each file checked to exist and be a regular file. False: a usage error in *error.
bool parse_lora_args(const LoraArgs& args, std::vector<LoraSpec>* out, std::string* error);

}  // namespace zimage::cli
