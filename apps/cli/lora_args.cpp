// --lora / --lora-lenient (lora_args.h).
#include "lora_args.h"

#include <charconv>
#include <cmath>
#include <filesystem>
#include <system_error>

namespace zimage::cli {

namespace {

// The whole of `s` as a decimal number (an optional sign, no spaces), or false.
bool read_number(const std::string& s, double* out) {
  const char* begin = s.data();
  const char* end = s.data() + s.size();
  if (begin != end && *begin == '+') ++begin;  // from_chars takes '-' only
  if (begin == end || (*begin == '-' && begin != s.data())) return false;
  auto [ptr, ec] = std::from_chars(begin, end, *out);
  return ec == std::errc() && ptr == end;
}

}  // namespace

void add_lora_options(CLI::App* cmd, LoraArgs& args) {
  cmd->add_option("--lora", args.loras,
                  "LoRA for the transformer, FILE or FILE:SCALE (default scale 1); repeat to "
                  "stack several (they add up). Any common key layout: diffusers/PEFT, "
                  "ai-toolkit, kohya, ComfyUI fused qkv, LoHa, LoKr")
      ->allow_extra_args(false);
  cmd->add_flag("--lora-lenient", args.lenient,
                "LoRA keys that match no transformer weight: warn and skip them instead of "
                "failing");
}

bool parse_lora_arg(const std::string& text, LoraSpec* out, std::string* error) {
  out->path = text;
  out->scale = 1.0f;
  const size_t colon = text.rfind(':');
  double scale = 0;
  if (colon != std::string::npos && read_number(text.substr(colon + 1), &scale)) {
    if (!std::isfinite(scale) || std::fabs(scale) > 1e6) {
      *error = "--lora: '" + text + "': the scale " + text.substr(colon + 1) +
               " is not a finite number of sensible size";
      return false;
    }
    out->path = text.substr(0, colon);
    out->scale = static_cast<float>(scale);
  }
  if (out->path.empty()) {
    *error = "--lora: '" + text + "': no file before the scale";
    return false;
  }
  return true;
}

bool parse_lora_args(const LoraArgs& args, std::vector<LoraSpec>* out, std::string* error) {
  out->clear();
  for (const std::string& text : args.loras) {
    LoraSpec spec;
    if (!parse_lora_arg(text, &spec, error)) return false;
    std::error_code ec;
    const auto st = std::filesystem::status(spec.path, ec);
    if (!std::filesystem::exists(st)) {
      *error = "--lora: '" + spec.path + "' does not exist";
      const size_t colon = text.rfind(':');
      if (spec.path == text && colon != std::string::npos &&
          std::filesystem::exists(text.substr(0, colon), ec))
        *error += " ('" + text.substr(0, colon) + "' does, but '" + text.substr(colon + 1) +
                  "' is not a number: write FILE:SCALE, e.g. FILE:0.8)";
      return false;
    }
    if (!std::filesystem::is_regular_file(st)) {
      *error = "--lora: '" + spec.path + "' is not a file (give a .safetensors LoRA)";
      return false;
    }
    out->push_back(std::move(spec));
  }
  return true;
}

}  // namespace zimage::cli
