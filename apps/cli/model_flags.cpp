// See model_flags.h.
#include "model_flags.h"

#include <filesystem>

#include "builtin/builtin_model.h"
#include "number_flags.h"

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

void add_model_flags(CLI::App* cmd, ModelFlags& f, const std::string& model_help) {
  cmd->add_option("--model,-m", f.model, model_help);
  add_single_file_flags(cmd, f);
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

namespace {

const char* common_help(EngineFlag flag) {
  switch (flag) {
    case EngineFlag::kDevice:
      return "cpu, cuda, cuda:N or auto (default auto)";
    case EngineFlag::kPrecision:
      return "auto, bf16, f32 or fp8 (default auto)";
    case EngineFlag::kFp8Layers:
      return "With --precision fp8: the DiT layers in FP8, a comma-separated list of qkv, out, "
             "w13, w2, refiners, sdpa (the attention itself, opt-in: FlashAttention-3's FP8 "
             "kernel on H100/H200), ffn, attn, all (default all: every linear, not sdpa)";
    case EngineFlag::kWeights:
      return "bf16 or fp8 weight storage (default bf16)";
    case EngineFlag::kVaeTiling:
      return "auto, on or off (default auto)";
    case EngineFlag::kVramBudget:
      return "GPU memory budget in GiB (0 = no limit)";
    case EngineFlag::kHostMemory:
      return "Host memory in GiB that weights streamed under --vram-budget may page-lock "
             "(default 0 = half of the machine's; with --streamed-weights files, none: the FP8 "
             "rows that mode still copies stay pageable); the rest stream from pageable memory";
    case EngineFlag::kStreamedWeights:
      return "Where weights streamed under --vram-budget come from: copy (host copies made at "
             "load, the fastest steps), files (read from the weight files each step, no "
             "load-time copy) or locked-files (experimental: the files' pages page-locked in place "
             "up to --host-memory; very slow to lock on some hosts) (default copy)";
    case EngineFlag::kThreads:
      return "CPU threads (default 0 = all)";
  }
  return "";
}

}  // namespace

void add_engine_flags(CLI::App* cmd, EngineFlags& f, std::initializer_list<EngineFlagHelp> flags) {
  EngineOptions& o = f.options;
  for (const EngineFlagHelp& e : flags) {
    const std::string help = e.help.empty() ? common_help(e.flag) : e.help;
    switch (e.flag) {
      case EngineFlag::kDevice:
        cmd->add_option("--device,-d", o.device, help);
        break;
      case EngineFlag::kPrecision:
        cmd->add_option("--precision", o.precision, help);
        break;
      case EngineFlag::kFp8Layers:
        cmd->add_option("--fp8-layers", o.fp8_layers, help);
        break;
      case EngineFlag::kWeights:
        cmd->add_option("--weights", o.weights, help)->check(CLI::IsMember({"bf16", "fp8"}));
        break;
      case EngineFlag::kVaeTiling:
        cmd->add_option("--vae-tiling", o.vae_tiling, help)
            ->check(CLI::IsMember({"auto", "on", "off"}));
        break;
      case EngineFlag::kVramBudget:
        cmd->add_option("--vram-budget", o.vram_budget_gib, help)
            ->check(CLI::Range(0.0, 1e6))
            ->check(finite_number(false));
        break;
      case EngineFlag::kHostMemory:
        cmd->add_option("--host-memory", o.host_memory_gib, help)
            ->check(CLI::Range(0.0, 1e6))
            ->check(finite_number(false));
        break;
      case EngineFlag::kStreamedWeights:
        cmd->add_option("--streamed-weights", o.streamed_weights, help)
            ->check(CLI::IsMember({"copy", "files", "locked-files"}));
        break;
      case EngineFlag::kThreads:
        cmd->add_option("--threads,-t", o.threads, help);
        break;
    }
  }
}

EngineOptions engine_options(const EngineFlags& f) {
  EngineOptions eo = f.options;
  eo.lora_lenient = f.lora.lenient;
  return eo;
}

}  // namespace zimage::cli
