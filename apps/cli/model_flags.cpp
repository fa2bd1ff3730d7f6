// See model_flags.h.
#include "model_flags.h"

#include <filesystem>

#include "builtin_model.h"

namespace zimage::cli {

void add_single_file_flags(CLI::App* cmd, ModelFlags& f) {
  cmd->add_option("--dit", f.dit,
                  "Transformer as one .safetensors file (ComfyUI / original names, FP8 or scaled "
                  "FP8, or an all-in-one checkpoint); replaces --model's transformer");
  cmd->add_option("--text-encoder", f.text_encoder,
                  "Qwen3 text encoder as one .safetensors file (transformers names, FP8 / "
                  "fp8_mixed included); replaces --model's text encoder");
  cmd->add_option(
      "--vae", f.vae,
      "VAE as one .safetensors file (diffusers or Flux/LDM names, e.g. ae.safetensors); "
      "replaces --model's VAE");
}

Result<ModelChoice> apply_model_flags(const ModelFlags& f, EngineOptions& eo) {
  ModelChoice choice;
  eo.model_dir = f.model;
  const std::pair<const char*, const std::string*> files[] = {
      {"--dit", &f.dit}, {"--text-encoder", &f.text_encoder}, {"--vae", &f.vae}};
  int given = 0;
  for (const auto& [flag, path] : files) {
    if (path->empty()) continue;
    ++given;
    std::error_code ec;
    const auto st = std::filesystem::status(*path, ec);
    if (!std::filesystem::exists(st))
      return InvalidArgument(std::string(flag) + ": '" + *path + "' does not exist");
    if (!std::filesystem::is_regular_file(st))
      return InvalidArgument(std::string(flag) + ": '" + *path +
                             "' is not a file (give one .safetensors file)");
  }
  eo.dit_file = f.dit;
  eo.text_encoder_file = f.text_encoder;
  eo.vae_file = f.vae;
  if (!eo.model_dir.empty()) {  // a path of the wrong kind is a usage error, whatever kind it is
    std::error_code ec;
    const auto st = std::filesystem::status(eo.model_dir, ec);
    if (!std::filesystem::exists(st))
      return InvalidArgument("--model: '" + eo.model_dir + "' does not exist");
    if (!std::filesystem::is_directory(st))
      return InvalidArgument("--model: '" + eo.model_dir +
                             "' is not a folder (give the diffusers model folder, with "
                             "model_index.json; a single file goes with --dit, --text-encoder "
                             "or --vae)");
    return choice;
  }
  if (given > 0 && given < 3)
    return InvalidArgument(
        "--dit, --text-encoder and --vae without --model: give all three (or a --model folder "
        "for the components not given)");
  // All three files, or nothing: both need the built-in model (its tokenizer, or all of it).
  auto builtin = builtin_model_dir();
  if (!builtin.ok()) return builtin.status();
  if (given == 3) {
    eo.tokenizer_dir = *builtin + "/tokenizer";  // the Qwen3 tokenizer (Apache-2.0)
  } else {
    eo.model_dir = *builtin;
    choice.builtin = true;
  }
  return choice;
}

}  // namespace zimage::cli
