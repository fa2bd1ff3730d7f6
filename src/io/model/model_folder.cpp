// Parsing and validation of the diffusers Z-Image folder configs (see model_folder.h for the
// rules on absent keys). Class defaults quoted here are those of diffusers'
// ZImageTransformer2DModel, AutoencoderKL, FlowMatchEulerDiscreteScheduler and transformers'
// Qwen3Config.
#include "io/model/model_folder.h"

#include <sys/stat.h>

#include <cmath>
#include <numeric>
#include <set>

#include "io/fs/file_io.h"
#include "io/fs/json_util.h"

namespace zimage {
namespace {

using json_util::JsonObjectReader;
using nlohmann::json;

constexpr int64_t kMaxWidth = 1 << 16;   // any channel / hidden width
constexpr int64_t kMaxLayers = 1 << 10;  // any layer count
constexpr int64_t kMaxVocab = 1 << 24;
constexpr int64_t kMaxPositions = 1 << 24;

Status bad(const std::string& file, const std::string& key, const std::string& what) {
  return FormatError(file + ": key '" + key + "': " + what);
}

Status unsupported(const std::string& file, const std::string& key, const std::string& what) {
  return Unsupported(file + ": key '" + key + "': " + what);
}

std::string list_string(const std::vector<int>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

// A config string quoted for a message (control bytes escaped).
std::string q(const std::string& s) {
  std::string out(1, '\'');
  out += json_util::printable(s);
  out += '\'';
  return out;
}

bool positive_finite(double v) {
  return std::isfinite(v) && v > 0;
}

Result<json> parse_object(std::string_view text, const std::string& file) {
  ZI_ASSIGN_OR_RETURN(json root, json_util::parse_strict(text, file));
  if (!root.is_object()) {
    return FormatError(file + ": expected a JSON object, got " + json_util::type_name(root));
  }
  return root;
}

// `_class_name`, when present, must be `expected`.
Status check_class(const JsonObjectReader& r, const char* expected) {
  std::string cls;
  ZI_TRY(r.get_string("_class_name", &cls, false));
  if (!cls.empty() && cls != expected) {
    return unsupported(r.file(), "_class_name", q(cls) + " is not " + expected);
  }
  return Status::Ok();
}

}  // namespace

// ---- validation ---------------------------------------------------------------------------------

Status validate_transformer_config(const TransformerConfig& c, const std::string& file) {
  const std::pair<const char*, int> sizes[] = {
      {"all_patch_size", c.patch_size}, {"all_f_patch_size", c.f_patch_size},
      {"in_channels", c.in_channels},   {"dim", c.dim},
      {"n_layers", c.n_layers},         {"n_heads", c.n_heads},
      {"n_kv_heads", c.n_kv_heads},     {"cap_feat_dim", c.cap_feat_dim}};
  for (const auto& [key, v] : sizes) {
    if (v <= 0) return bad(file, key, "must be positive, got " + std::to_string(v));
  }
  if (c.n_refiner_layers < 0) return bad(file, "n_refiner_layers", "must not be negative");
  if (c.dim % c.n_heads != 0) {
    return bad(file, "dim",
               std::to_string(c.dim) + " is not divisible by n_heads " + std::to_string(c.n_heads));
  }
  if (c.axes_dims.size() != 3) {
    return bad(file, "axes_dims",
               "expected 3 axes (frame, height, width), got " + list_string(c.axes_dims));
  }
  if (c.axes_lens.size() != 3) {
    return bad(file, "axes_lens",
               "expected 3 axes (frame, height, width), got " + list_string(c.axes_lens));
  }
  for (int d : c.axes_dims) {
    if (d <= 0 || d % 2 != 0) {
      return bad(file, "axes_dims",
                 list_string(c.axes_dims) + ": every axis needs a positive even size (RoPE pairs)");
    }
  }
  for (int l : c.axes_lens) {
    if (l <= 0) return bad(file, "axes_lens", list_string(c.axes_lens) + ": must be positive");
  }
  const int sum = std::accumulate(c.axes_dims.begin(), c.axes_dims.end(), 0);
  if (sum != c.head_dim()) {
    return bad(file, "axes_dims",
               list_string(c.axes_dims) + " sums to " + std::to_string(sum) +
                   " but head_dim = dim / n_heads = " + std::to_string(c.head_dim()));
  }
  if (!positive_finite(c.norm_eps)) return bad(file, "norm_eps", "must be positive");
  if (!positive_finite(c.rope_theta)) return bad(file, "rope_theta", "must be positive");
  if (!positive_finite(c.t_scale)) return bad(file, "t_scale", "must be positive");
  return Status::Ok();
}

Status validate_text_encoder_config(const TextEncoderConfig& c, const std::string& file) {
  const std::pair<const char*, int> sizes[] = {
      {"hidden_size", c.hidden_size},
      {"intermediate_size", c.intermediate_size},
      {"num_hidden_layers", c.num_hidden_layers},
      {"num_attention_heads", c.num_attention_heads},
      {"num_key_value_heads", c.num_key_value_heads},
      {"head_dim", c.head_dim},
      {"vocab_size", c.vocab_size},
      {"max_position_embeddings", c.max_position_embeddings}};
  for (const auto& [key, v] : sizes) {
    if (v <= 0) return bad(file, key, "must be positive, got " + std::to_string(v));
  }
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    return bad(file, "num_key_value_heads",
               std::to_string(c.num_key_value_heads) + " does not divide num_attention_heads " +
                   std::to_string(c.num_attention_heads));
  }
  if (c.head_dim % 2 != 0) {
    return bad(file, "head_dim", std::to_string(c.head_dim) + " must be even (RoPE halves)");
  }
  if (!positive_finite(c.rms_norm_eps)) return bad(file, "rms_norm_eps", "must be positive");
  if (!positive_finite(c.rope_theta)) return bad(file, "rope_theta", "must be positive");
  return Status::Ok();
}

Status validate_vae_config(const VaeConfig& c, const std::string& file) {
  const std::pair<const char*, int> sizes[] = {{"in_channels", c.in_channels},
                                               {"out_channels", c.out_channels},
                                               {"latent_channels", c.latent_channels},
                                               {"layers_per_block", c.layers_per_block},
                                               {"norm_num_groups", c.norm_num_groups}};
  for (const auto& [key, v] : sizes) {
    if (v <= 0) return bad(file, key, "must be positive, got " + std::to_string(v));
  }
  if (c.block_out_channels.empty() || c.block_out_channels.size() > 8) {
    return bad(file, "block_out_channels",
               "expected 1 to 8 levels, got " + list_string(c.block_out_channels));
  }
  for (int ch : c.block_out_channels) {
    if (ch <= 0 || ch % c.norm_num_groups != 0) {
      return bad(file, "block_out_channels",
                 list_string(c.block_out_channels) + ": " + std::to_string(ch) +
                     " is not a positive multiple of norm_num_groups " +
                     std::to_string(c.norm_num_groups));
    }
  }
  if (!std::isfinite(c.scaling_factor) || c.scaling_factor == 0.0f) {
    return bad(file, "scaling_factor", "must be finite and non-zero");
  }
  if (!std::isfinite(c.shift_factor)) return bad(file, "shift_factor", "must be finite");
  return Status::Ok();
}

Status validate_scheduler_config(const SchedulerConfig& c, const std::string& file) {
  if (c.num_train_timesteps <= 0) return bad(file, "num_train_timesteps", "must be positive");
  if (!positive_finite(c.shift)) return bad(file, "shift", "must be positive");
  if (!std::isfinite(c.base_shift)) return bad(file, "base_shift", "must be finite");
  if (!std::isfinite(c.max_shift)) return bad(file, "max_shift", "must be finite");
  if (c.use_dynamic_shifting && c.max_image_seq_len <= c.base_image_seq_len) {
    return bad(file, "max_image_seq_len", "must exceed base_image_seq_len for dynamic shifting");
  }
  if (c.base_image_seq_len <= 0) return bad(file, "base_image_seq_len", "must be positive");
  if (c.shift_terminal_set) {
    return unsupported(file, "shift_terminal", "terminal shifting is not supported (use null)");
  }
  if (c.use_karras_sigmas) return unsupported(file, "use_karras_sigmas", "karras sigmas");
  if (c.use_exponential_sigmas) {
    return unsupported(file, "use_exponential_sigmas", "exponential sigmas");
  }
  if (c.use_beta_sigmas) return unsupported(file, "use_beta_sigmas", "beta sigmas");
  if (c.stochastic_sampling) {
    return unsupported(file, "stochastic_sampling", "stochastic sampling is not supported");
  }
  return Status::Ok();
}

Status validate_configs(const ZImageConfigs& c, const std::string& where) {
  ZI_TRY(validate_transformer_config(c.transformer, where + "transformer/config.json"));
  ZI_TRY(validate_text_encoder_config(c.text_encoder, where + "text_encoder/config.json"));
  ZI_TRY(validate_vae_config(c.vae, where + "vae/config.json"));
  ZI_TRY(validate_scheduler_config(c.scheduler, where + "scheduler/scheduler_config.json"));
  if (c.transformer.cap_feat_dim != c.text_encoder.hidden_size) {
    return bad(where + "transformer/config.json", "cap_feat_dim",
               std::to_string(c.transformer.cap_feat_dim) +
                   " differs from the text encoder's hidden_size " +
                   std::to_string(c.text_encoder.hidden_size));
  }
  if (c.transformer.in_channels != c.vae.latent_channels) {
    return bad(where + "transformer/config.json", "in_channels",
               std::to_string(c.transformer.in_channels) +
                   " differs from the VAE's latent_channels " +
                   std::to_string(c.vae.latent_channels));
  }
  return Status::Ok();
}

// ---- parsers
// -------------------------------------------------------------------------------------

Status check_model_index(std::string_view text, const std::string& file) {
  ZI_ASSIGN_OR_RETURN(json root, parse_object(text, file));
  JsonObjectReader r(root, file);
  std::string cls;
  ZI_TRY(r.get_string("_class_name", &cls, true));
  if (cls != "ZImagePipeline") {
    return unsupported(file, "_class_name", q(cls) + " is not ZImagePipeline");
  }
  const std::pair<const char*, std::set<std::string>> components[] = {
      {"scheduler", {"FlowMatchEulerDiscreteScheduler"}},
      {"text_encoder", {"Qwen3Model", "Qwen3ForCausalLM"}},
      {"tokenizer", {"Qwen2Tokenizer", "Qwen2TokenizerFast"}},
      {"transformer", {"ZImageTransformer2DModel"}},
      {"vae", {"AutoencoderKL"}}};
  for (const auto& [key, classes] : components) {
    const json* v = r.find(key);
    if (!v) return NotFound(file + ": required component '" + key + "' is missing");
    if (!v->is_array() || v->size() != 2 || !(*v)[1].is_string()) {
      return bad(file, key, "expected [library, class], got " + v->dump());
    }
    const std::string c = (*v)[1].get<std::string>();
    if (!classes.count(c)) {
      std::string allowed;
      for (const std::string& a : classes) allowed += (allowed.empty() ? "" : " or ") + a;
      return unsupported(file, key, "class " + q(c) + " is not " + allowed);
    }
  }
  return Status::Ok();
}

Result<TransformerConfig> parse_transformer_config(std::string_view text, const std::string& file) {
  ZI_ASSIGN_OR_RETURN(json root, parse_object(text, file));
  JsonObjectReader r(root, file);
  ZI_TRY(check_class(r, "ZImageTransformer2DModel"));
  TransformerConfig c;
  c.axes_lens = {1024, 512, 512};  // class default; the published config overrides it
  std::vector<int> patch, f_patch;
  ZI_TRY(r.get_int_list("all_patch_size", &patch, true, 1, 64));
  ZI_TRY(r.get_int_list("all_f_patch_size", &f_patch, true, 1, 64));
  if (patch.size() != 1) {
    return unsupported(file, "all_patch_size",
                       "exactly one patch size is supported, got " + list_string(patch));
  }
  if (f_patch.size() != 1) {
    return unsupported(file, "all_f_patch_size",
                       "exactly one patch size is supported, got " + list_string(f_patch));
  }
  c.patch_size = patch[0];
  c.f_patch_size = f_patch[0];
  ZI_TRY(r.get_int("in_channels", &c.in_channels, true, 1, 4096));
  ZI_TRY(r.get_int("dim", &c.dim, true, 1, kMaxWidth));
  ZI_TRY(r.get_int("n_layers", &c.n_layers, true, 1, kMaxLayers));
  ZI_TRY(r.get_int("n_refiner_layers", &c.n_refiner_layers, true, 0, kMaxLayers));
  ZI_TRY(r.get_int("n_heads", &c.n_heads, true, 1, kMaxWidth));
  ZI_TRY(r.get_int("n_kv_heads", &c.n_kv_heads, false, 1, kMaxWidth));
  ZI_TRY(r.get_float("norm_eps", &c.norm_eps, false));
  ZI_TRY(r.get_bool("qk_norm", &c.qk_norm, false));
  ZI_TRY(r.get_int("cap_feat_dim", &c.cap_feat_dim, true, 1, kMaxWidth));
  ZI_TRY(r.get_float("rope_theta", &c.rope_theta, false));
  ZI_TRY(r.get_float("t_scale", &c.t_scale, false));
  ZI_TRY(r.get_int_list("axes_dims", &c.axes_dims, false, 1, kMaxWidth));
  ZI_TRY(r.get_int_list("axes_lens", &c.axes_lens, false, 1, 1 << 20));
  if (r.has("siglip_feat_dim")) {
    return unsupported(file, "siglip_feat_dim", "SigLIP (Omni) conditioning is not supported");
  }
  ZI_TRY(validate_transformer_config(c, file));
  return c;
}

Result<TextEncoderConfig> parse_text_encoder_config(std::string_view text,
                                                    const std::string& file) {
  ZI_ASSIGN_OR_RETURN(json root, parse_object(text, file));
  JsonObjectReader r(root, file);
  std::string model_type, act = "silu";
  ZI_TRY(r.get_string("model_type", &model_type, false));
  if (!model_type.empty() && model_type != "qwen3") {
    return unsupported(file, "model_type", q(model_type) + " is not qwen3");
  }
  TextEncoderConfig c;
  // Qwen3Config defaults for the optional keys.
  c.head_dim = 128;
  c.rms_norm_eps = 1e-6f;
  c.rope_theta = 10000.0;
  c.max_position_embeddings = 32768;
  c.tie_word_embeddings = false;
  c.attention_bias = false;
  ZI_TRY(r.get_int("hidden_size", &c.hidden_size, true, 1, kMaxWidth));
  ZI_TRY(r.get_int("intermediate_size", &c.intermediate_size, true, 1, 4 * kMaxWidth));
  ZI_TRY(r.get_int("num_hidden_layers", &c.num_hidden_layers, true, 1, kMaxLayers));
  ZI_TRY(r.get_int("num_attention_heads", &c.num_attention_heads, true, 1, kMaxWidth));
  ZI_TRY(r.get_int("num_key_value_heads", &c.num_key_value_heads, true, 1, kMaxWidth));
  ZI_TRY(r.get_int("vocab_size", &c.vocab_size, true, 1, kMaxVocab));
  ZI_TRY(r.get_int("head_dim", &c.head_dim, false, 1, kMaxWidth));
  ZI_TRY(r.get_float("rms_norm_eps", &c.rms_norm_eps, false));
  ZI_TRY(r.get_int("max_position_embeddings", &c.max_position_embeddings, false, 1, kMaxPositions));
  ZI_TRY(r.get_bool("tie_word_embeddings", &c.tie_word_embeddings, false));
  ZI_TRY(r.get_bool("attention_bias", &c.attention_bias, false));
  ZI_TRY(r.get_string("hidden_act", &act, false));
  if (act != "silu") return unsupported(file, "hidden_act", q(act) + " is not silu");
  bool sliding = false;
  ZI_TRY(r.get_bool("use_sliding_window", &sliding, false));
  if (sliding) return unsupported(file, "use_sliding_window", "sliding-window attention");

  // rope_theta: top level (transformers 4) or inside rope_parameters (transformers 5).
  const bool top_theta = r.has("rope_theta");
  ZI_TRY(r.get_double("rope_theta", &c.rope_theta, false));
  if (const json* rp = r.find("rope_parameters"); rp && !rp->is_null()) {
    if (!rp->is_object()) {
      return bad(file, "rope_parameters",
                 std::string("expected an object, got ") + json_util::type_name(*rp));
    }
    JsonObjectReader pr(*rp, file + " (rope_parameters)");
    std::string type = "default";
    ZI_TRY(pr.get_string("rope_type", &type, false));
    if (type != "default") {
      return unsupported(file, "rope_parameters.rope_type", q(type) + " is not default");
    }
    double theta = c.rope_theta;
    ZI_TRY(pr.get_double("rope_theta", &theta, false));
    if (top_theta && pr.has("rope_theta") && theta != c.rope_theta) {
      return bad(file, "rope_parameters.rope_theta", "disagrees with the top-level rope_theta");
    }
    c.rope_theta = theta;
  }
  if (const json* rs = r.find("rope_scaling"); rs && !rs->is_null()) {
    std::string type;
    if (rs->is_object()) {
      JsonObjectReader sr(*rs, file + " (rope_scaling)");
      ZI_TRY(sr.get_string("rope_type", &type, false));
      if (type.empty()) ZI_TRY(sr.get_string("type", &type, false));
    }
    if (type != "default") return unsupported(file, "rope_scaling", "RoPE scaling " + rs->dump());
  }
  ZI_TRY(validate_text_encoder_config(c, file));
  return c;
}

Result<VaeConfig> parse_vae_config(std::string_view text, const std::string& file) {
  ZI_ASSIGN_OR_RETURN(json root, parse_object(text, file));
  JsonObjectReader r(root, file);
  ZI_TRY(check_class(r, "AutoencoderKL"));
  VaeConfig c;
  // AutoencoderKL defaults for the optional keys.
  c.norm_num_groups = 32;
  c.scaling_factor = 0.18215f;
  c.shift_factor = 0.0f;  // None
  c.use_quant_conv = true;
  c.use_post_quant_conv = true;
  c.mid_block_add_attention = true;
  ZI_TRY(r.get_int("in_channels", &c.in_channels, true, 1, 64));
  ZI_TRY(r.get_int("out_channels", &c.out_channels, true, 1, 64));
  ZI_TRY(r.get_int("latent_channels", &c.latent_channels, true, 1, 4096));
  ZI_TRY(r.get_int_list("block_out_channels", &c.block_out_channels, true, 1, kMaxWidth));
  ZI_TRY(r.get_int("layers_per_block", &c.layers_per_block, true, 1, 64));
  ZI_TRY(r.get_int("norm_num_groups", &c.norm_num_groups, false, 1, kMaxWidth));
  ZI_TRY(r.get_float("scaling_factor", &c.scaling_factor, false));
  ZI_TRY(r.get_float("shift_factor", &c.shift_factor, false));  // null -> 0
  ZI_TRY(r.get_bool("use_quant_conv", &c.use_quant_conv, false));
  ZI_TRY(r.get_bool("use_post_quant_conv", &c.use_post_quant_conv, false));
  ZI_TRY(r.get_bool("mid_block_add_attention", &c.mid_block_add_attention, false));
  // sample_size: an int, or a list whose first entry diffusers uses (absent: the class default).
  c.sample_size = 32;
  if (const json* ss = r.find("sample_size"); ss != nullptr && ss->is_array()) {
    std::vector<int> sizes;
    ZI_TRY(r.get_int_list("sample_size", &sizes, true, 1, 1 << 20));
    if (sizes.empty()) return bad(file, "sample_size", "is an empty list");
    c.sample_size = sizes[0];
  } else {
    ZI_TRY(r.get_int("sample_size", &c.sample_size, false, 1, 1 << 20));
  }
  std::string act = "silu";
  ZI_TRY(r.get_string("act_fn", &act, false));
  if (act != "silu") return unsupported(file, "act_fn", q(act) + " is not silu");
  const std::pair<const char*, const char*> block_types[] = {
      {"down_block_types", "DownEncoderBlock2D"}, {"up_block_types", "UpDecoderBlock2D"}};
  for (const auto& [key, expected] : block_types) {
    std::vector<std::string> types;
    ZI_TRY(r.get_string_list(key, &types, false));
    if (!r.has(key)) continue;
    if (types.size() != c.block_out_channels.size()) {
      return bad(file, key,
                 std::to_string(types.size()) + " blocks but block_out_channels has " +
                     std::to_string(c.block_out_channels.size()));
    }
    for (const std::string& t : types) {
      if (t != expected) return unsupported(file, key, q(t) + " is not " + expected);
    }
  }
  ZI_TRY(validate_vae_config(c, file));
  return c;
}

Result<SchedulerConfig> parse_scheduler_config(std::string_view text, const std::string& file) {
  ZI_ASSIGN_OR_RETURN(json root, parse_object(text, file));
  JsonObjectReader r(root, file);
  ZI_TRY(check_class(r, "FlowMatchEulerDiscreteScheduler"));
  SchedulerConfig c;  // the struct's defaults are the class defaults
  ZI_TRY(r.get_int("num_train_timesteps", &c.num_train_timesteps, false, 1, 1 << 20));
  ZI_TRY(r.get_float("shift", &c.shift, false));
  ZI_TRY(r.get_bool("use_dynamic_shifting", &c.use_dynamic_shifting, false));
  ZI_TRY(r.get_float("base_shift", &c.base_shift, false));
  ZI_TRY(r.get_float("max_shift", &c.max_shift, false));
  ZI_TRY(r.get_int("base_image_seq_len", &c.base_image_seq_len, false, 1, 1 << 30));
  ZI_TRY(r.get_int("max_image_seq_len", &c.max_image_seq_len, false, 1, 1 << 30));
  ZI_TRY(r.get_bool("invert_sigmas", &c.invert_sigmas, false));
  if (r.has("shift_terminal")) {
    float unused = 0;
    ZI_TRY(r.get_float("shift_terminal", &unused, false));
    c.shift_terminal_set = true;
  }
  ZI_TRY(r.get_bool("use_karras_sigmas", &c.use_karras_sigmas, false));
  ZI_TRY(r.get_bool("use_exponential_sigmas", &c.use_exponential_sigmas, false));
  ZI_TRY(r.get_bool("use_beta_sigmas", &c.use_beta_sigmas, false));
  ZI_TRY(r.get_bool("stochastic_sampling", &c.stochastic_sampling, false));
  std::string shift_type = "exponential";
  ZI_TRY(r.get_string("time_shift_type", &shift_type, false));
  if (shift_type != "exponential" && shift_type != "linear") {
    return bad(file, "time_shift_type", q(shift_type) + " is not exponential or linear");
  }
  if (shift_type == "linear" && c.use_dynamic_shifting) {
    return unsupported(file, "time_shift_type", "linear dynamic shifting is not supported");
  }
  ZI_TRY(validate_scheduler_config(c, file));
  return c;
}

ZImageConfigs zimage_turbo_reference_configs() {
  ZImageConfigs c;           // the struct defaults are the published Turbo values...
  c.scheduler.shift = 3.0f;  // ...except the scheduler, whose struct defaults are class defaults
  c.scheduler.use_dynamic_shifting = false;
  return c;
}

// ---- the folder ---------------------------------------------------------------------------------

std::string ModelFolder::component_dir(const std::string& component) const {
  return dir_ + "/" + component;
}

Result<ModelFolder> ModelFolder::open(const std::string& dir_in) {
  std::string dir = dir_in;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) return NotFound(dir + ": no such model folder");
  if (!S_ISDIR(st.st_mode)) return InvalidArgument(dir + ": not a folder");

  ModelFolder f;
  f.dir_ = dir;
  const std::string index_path = dir + "/model_index.json";
  ZI_ASSIGN_OR_RETURN(std::string index, json_util::read_text(index_path, 1 << 20));
  ZI_TRY(check_model_index(index, index_path));

  auto read = [&](const char* rel) { return json_util::read_text(dir + "/" + rel, 16 << 20); };
  const std::string tf = dir + "/transformer/config.json";
  const std::string te = dir + "/text_encoder/config.json";
  const std::string vae = dir + "/vae/config.json";
  const std::string sch = dir + "/scheduler/scheduler_config.json";
  ZI_ASSIGN_OR_RETURN(std::string tf_text, read("transformer/config.json"));
  ZI_ASSIGN_OR_RETURN(f.configs_.transformer, parse_transformer_config(tf_text, tf));
  ZI_ASSIGN_OR_RETURN(std::string te_text, read("text_encoder/config.json"));
  ZI_ASSIGN_OR_RETURN(f.configs_.text_encoder, parse_text_encoder_config(te_text, te));
  ZI_ASSIGN_OR_RETURN(std::string vae_text, read("vae/config.json"));
  ZI_ASSIGN_OR_RETURN(f.configs_.vae, parse_vae_config(vae_text, vae));
  ZI_ASSIGN_OR_RETURN(std::string sch_text, read("scheduler/scheduler_config.json"));
  ZI_ASSIGN_OR_RETURN(f.configs_.scheduler, parse_scheduler_config(sch_text, sch));
  ZI_TRY(validate_configs(f.configs_, dir + "/"));

  f.tokenizer_dir_ = dir + "/tokenizer";
  if (!path_is_folder(f.tokenizer_dir_))
    return NotFound(f.tokenizer_dir_ + ": no tokenizer folder");
  if (!path_is_file(f.tokenizer_dir_ + "/tokenizer.json")) {
    return NotFound(f.tokenizer_dir_ + "/tokenizer.json: no such file (the tokenizer is needed)");
  }
  return f;
}

Result<WeightStore> ModelFolder::open_weights(const std::string& component) const {
  if (component != "transformer" && component != "text_encoder" && component != "vae") {
    return InvalidArgument("'" + component +
                           "' is not a weight component (transformer, text_encoder, vae)");
  }
  return WeightStore::open(component_dir(component));
}

}  // namespace zimage
