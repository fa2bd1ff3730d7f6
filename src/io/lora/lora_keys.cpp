// LoRA key grammar (see lora.h): suffixes, prefixes and module paths of every layout zimage reads,
// and PEFT's per-module scaling from diffusers' lora_adapter_metadata. Pure string work.
#include <cctype>
#include <cmath>
#include <cstring>
#include <regex>

#include "io/fs/json_util.h"
#include "io/lora/lora.h"

namespace zimage {

namespace {

bool starts_with(const std::string& s, std::string_view p) {
  return s.size() >= p.size() && s.compare(0, p.size(), p) == 0;
}
bool ends_with(const std::string& s, std::string_view p) {
  return s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
}

struct SuffixRule {
  const char* suffix;
  LoraPart part;
};

// Longest suffixes first where one ends another.
constexpr SuffixRule kSuffixes[] = {
    {".lora_A.default.weight", LoraPart::kDown},
    {".lora_B.default.weight", LoraPart::kUp},
    {".lora_A.weight", LoraPart::kDown},
    {".lora_B.weight", LoraPart::kUp},
    {".lora_down.weight", LoraPart::kDown},
    {".lora_up.weight", LoraPart::kUp},
    {".lora.down.weight", LoraPart::kDown},
    {".lora.up.weight", LoraPart::kUp},
    {".lora_linear_layer.down.weight", LoraPart::kDown},
    {".lora_linear_layer.up.weight", LoraPart::kUp},
    {".alpha", LoraPart::kAlpha},
    {".hada_w1_a", LoraPart::kHadaW1A},
    {".hada_w1_b", LoraPart::kHadaW1B},
    {".hada_w2_a", LoraPart::kHadaW2A},
    {".hada_w2_b", LoraPart::kHadaW2B},
    {".lokr_w1_a", LoraPart::kLokrW1A},
    {".lokr_w1_b", LoraPart::kLokrW1B},
    {".lokr_w2_a", LoraPart::kLokrW2A},
    {".lokr_w2_b", LoraPart::kLokrW2B},
    {".lokr_w1", LoraPart::kLokrW1},
    {".lokr_w2", LoraPart::kLokrW2},
    // Known, not applied: DoRA magnitudes, LyCORIS Tucker cores (convolutions), LoRA biases,
    // LoCon mid weights, full-weight diffs.
    {".dora_scale", LoraPart::kUnsupported},
    {".hada_t1", LoraPart::kUnsupported},
    {".hada_t2", LoraPart::kUnsupported},
    {".lokr_t2", LoraPart::kUnsupported},
    {".lora_B.bias", LoraPart::kUnsupported},
    {".lora_up.bias", LoraPart::kUnsupported},
    {".lora_mid.weight", LoraPart::kUnsupported},
    {".diff_b", LoraPart::kUnsupported},
    {".diff", LoraPart::kUnsupported},
};

// Text-encoder LoRA prefixes: diffusers' Z-Image loader applies transformer LoRAs only.
constexpr const char* kTextEncoderPrefixes[] = {"lora_te",   "text_encoder.", "text_encoders.",
                                                "lora_qwen", "text_model.",   "te."};

// Dotted prefixes are removed as they are; underscore prefixes leave the kohya form, where an
// extra leading '_' (lora_unet__layers_0_...) is removed too.
constexpr const char* kDottedPrefixes[] = {"model.diffusion_model.", "diffusion_model.",
                                           "base_model.model.", "transformer."};
constexpr const char* kUnderscorePrefixes[] = {"lora_unet_", "lycoris_", "lora_transformer_"};

struct Leaf {
  const char* underscored;
  const char* module;  // diffusers name under the block; nullptr: fused qkv
  bool comfy;
};
constexpr Leaf kBlockLeaves[] = {
    {"attention_to_q", "attention.to_q", false},
    {"attention_to_k", "attention.to_k", false},
    {"attention_to_v", "attention.to_v", false},
    {"attention_to_out_0", "attention.to_out.0", false},
    {"attention_out", "attention.to_out.0", true},
    {"attention_qkv", nullptr, true},
    {"feed_forward_w1", "feed_forward.w1", false},
    {"feed_forward_w2", "feed_forward.w2", false},
    {"feed_forward_w3", "feed_forward.w3", false},
    {"adaLN_modulation_0", "adaLN_modulation.0", false},
};
constexpr Leaf kTopLevel[] = {
    {"t_embedder_mlp_0", "t_embedder.mlp.0", false},
    {"t_embedder_mlp_2", "t_embedder.mlp.2", false},
    {"cap_embedder_1", "cap_embedder.1", false},
    // ComfyUI's single-patch-size names; diffusers keys them by "<patch>-<f_patch>" (Z-Image: 2-1).
    {"x_embedder", "all_x_embedder.2-1", true},
    {"final_layer_linear", "all_final_layer.2-1.linear", true},
    {"final_layer_adaLN_modulation_1", "all_final_layer.2-1.adaLN_modulation.1", true},
};

// "<digits>-<digits>" (a patch-size key such as "2-1"), at most 4 digits each.
bool is_patch_key(const std::string& s) {
  const size_t dash = s.find('-');
  if (dash == std::string::npos || dash == 0 || dash + 1 >= s.size()) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    if (i == dash) continue;
    if (!std::isdigit(static_cast<unsigned char>(s[i]))) return false;
  }
  return dash <= 4 && s.size() - dash - 1 <= 4;
}

// Modules under all_x_embedder.<key> and all_final_layer.<key>.
bool map_patch_keyed(const std::string& u, LoraModuleMap& out) {
  static const std::string xe = "all_x_embedder_", fl = "all_final_layer_";
  if (starts_with(u, xe) && is_patch_key(u.substr(xe.size()))) {
    out.targets.push_back({"all_x_embedder." + u.substr(xe.size()), -1});
    return true;
  }
  if (!starts_with(u, fl)) return false;
  const std::string rest = u.substr(fl.size());
  for (const char* leaf : {"_linear", "_adaLN_modulation_1"}) {
    if (!ends_with(rest, leaf)) continue;
    const std::string key = rest.substr(0, rest.size() - std::strlen(leaf));
    if (!is_patch_key(key)) return false;
    out.targets.push_back({"all_final_layer." + key +
                               (std::string(leaf) == "_linear" ? ".linear" : ".adaLN_modulation.1"),
                           -1});
    return true;
  }
  return false;
}

}  // namespace

const char* lora_kind_name(LoraKind k) {
  switch (k) {
    case LoraKind::kLowRank:
      return "LoRA";
    case LoraKind::kLoHa:
      return "LoHa";
    case LoraKind::kLoKr:
      return "LoKr";
  }
  return "?";
}

std::optional<LoraKey> split_lora_key(const std::string& key) {
  for (const SuffixRule& r : kSuffixes) {
    if (ends_with(key, r.suffix) && key.size() > std::strlen(r.suffix)) {
      return LoraKey{key.substr(0, key.size() - std::strlen(r.suffix)), r.part, r.suffix};
    }
  }
  return std::nullopt;
}

LoraModuleMap map_lora_module(const std::string& module) {
  LoraModuleMap out;
  for (const char* p : kTextEncoderPrefixes) {
    if (starts_with(module, p)) {
      out.reason =
          "a text-encoder LoRA module (zimage, like diffusers' Z-Image loader, applies LoRAs to "
          "the transformer only)";
      return out;
    }
  }
  std::string rest = module;
  for (const char* p : kDottedPrefixes) {
    if (starts_with(rest, p)) {
      out.prefix = p;
      rest = rest.substr(std::strlen(p));
      break;
    }
  }
  if (out.prefix.empty()) {
    for (const char* p : kUnderscorePrefixes) {
      if (starts_with(rest, p)) {
        out.prefix = p;
        rest = rest.substr(std::strlen(p));
        if (starts_with(rest, "_")) {
          out.prefix += "_";
          rest = rest.substr(1);
        }
        break;
      }
    }
  }
  // One spelling for both forms: dots become underscores ("layers.0.attention.to_q" and
  // "layers_0_attention_to_q" both read "layers_0_attention_to_q").
  std::string u = rest;
  for (char& c : u)
    if (c == '.') c = '_';

  for (const char* block : {"layers_", "noise_refiner_", "context_refiner_"}) {
    if (!starts_with(u, block)) continue;
    size_t i = std::strlen(block), j = i;
    while (j < u.size() && std::isdigit(static_cast<unsigned char>(u[j]))) ++j;
    if (j == i || j - i > 6 || j >= u.size() || u[j] != '_') break;
    const std::string index = std::to_string(std::stol(u.substr(i, j - i)));
    const std::string leaf = u.substr(j + 1);
    const std::string name =
        std::string(block).substr(0, std::strlen(block) - 1) + "." + index + ".";
    for (const Leaf& l : kBlockLeaves) {
      if (leaf != l.underscored) continue;
      out.comfy_name = l.comfy;
      if (l.module) {
        out.targets.push_back({name + l.module, -1});
      } else {
        out.fused_qkv = true;
        out.targets = {{name + "attention.to_q", 0},
                       {name + "attention.to_k", 1},
                       {name + "attention.to_v", 2}};
      }
      return out;
    }
    break;
  }
  for (const Leaf& l : kTopLevel) {
    if (u == l.underscored) {
      out.comfy_name = l.comfy;
      out.targets.push_back({l.module, -1});
      return out;
    }
  }
  if (map_patch_keyed(u, out)) return out;
  out.reason = "no Z-Image transformer module has this name";
  return out;
}

// ---- PEFT config ------------------------------------------------------------------------------

namespace {

Result<double> pattern_value(const std::vector<std::pair<std::string, double>>& patterns,
                             const std::string& module, double fallback) {
  for (const auto& [key, value] : patterns) {
    try {
      // PEFT: re.match(rf"(.*\.)?({key})$", module) -- anchored at both ends.
      if (std::regex_match(module, std::regex("(.*\\.)?(" + key + ")"))) return value;
    } catch (const std::exception& e) {
      return FormatError("lora_adapter_metadata: pattern '" + json_util::printable(key) +
                         "' is not a regular expression zimage can use: " + e.what());
    }
  }
  return fallback;
}

Status read_pattern(const nlohmann::json& root, const std::string& key, const std::string& file,
                    std::vector<std::pair<std::string, double>>* out) {
  auto it = root.find(key);
  if (it == root.end() || it->is_null()) return Status::Ok();
  if (!it->is_object())
    return FormatError(file + ": lora_adapter_metadata '" + key + "' is not an object");
  for (const auto& [name, v] : it->items()) {
    if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() <= 0)
      return FormatError(file + ": lora_adapter_metadata '" + key + "' entry '" +
                         json_util::printable(name) + "' is not a positive number");
    out->emplace_back(name, v.get<double>());
  }
  return Status::Ok();
}

}  // namespace

Result<double> PeftScaling::rank_for(const std::string& module) const {
  return pattern_value(rank_pattern, module, r);
}
Result<double> PeftScaling::alpha_for(const std::string& module) const {
  return pattern_value(alpha_pattern, module, lora_alpha);
}

Result<std::optional<PeftScaling>> parse_peft_metadata(const std::string& json_text,
                                                       const std::string& file) {
  ZI_ASSIGN_OR_RETURN(nlohmann::json root,
                      json_util::parse_strict(json_text, file + ": lora_adapter_metadata"));
  if (!root.is_object()) return FormatError(file + ": lora_adapter_metadata is not a JSON object");
  const std::string p = "transformer.";
  if (!root.contains(p + "r")) return std::optional<PeftScaling>();
  auto type = root.find(p + "peft_type");
  if (type != root.end() && type->is_string() && type->get<std::string>() != "LORA")
    return Unsupported(file + ": lora_adapter_metadata describes a " + type->get<std::string>() +
                       " adapter; zimage reads PEFT configs of LoRAs only");
  auto number = [&](const char* k, double* out, bool required) -> Status {
    auto it = root.find(p + k);
    if (it == root.end() || it->is_null()) {
      return required ? FormatError(file + ": lora_adapter_metadata has no '" + p + k + "'")
                      : Status::Ok();
    }
    if (!it->is_number() || !std::isfinite(it->get<double>()) || it->get<double>() <= 0)
      return FormatError(file + ": lora_adapter_metadata '" + p + k + "' is not a positive number");
    *out = it->get<double>();
    return Status::Ok();
  };
  auto flag = [&](const char* k) {
    auto it = root.find(p + k);
    return it != root.end() && it->is_boolean() && it->get<bool>();
  };
  PeftScaling s;
  ZI_TRY(number("r", &s.r, true));
  s.lora_alpha = s.r;
  ZI_TRY(number("lora_alpha", &s.lora_alpha, false));
  s.use_rslora = flag("use_rslora");
  if (flag("use_dora"))
    return Unsupported(file +
                       ": a DoRA adapter (lora_adapter_metadata use_dora); zimage applies "
                       "plain LoRAs only");
  ZI_TRY(read_pattern(root, p + "rank_pattern", file, &s.rank_pattern));
  ZI_TRY(read_pattern(root, p + "alpha_pattern", file, &s.alpha_pattern));
  return std::optional<PeftScaling>(std::move(s));
}

}  // namespace zimage
