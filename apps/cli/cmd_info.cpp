// zimage info [PATH]: what is in a model folder, a component folder or a single .safetensors
// file, without running anything: configs, tensor and parameter counts, dtypes and on-disk sizes.
// Without PATH, the built-in model. For a model folder it also runs every load-time check
// `generate` runs (TextToImage::check_folder: the real loaders bind every tensor against a backend
// that holds nothing), so `info` is the check to run on a freshly downloaded model: it fails
// (exit 1) with the message `generate` would give. --json prints the same facts, "valid" and the
// errors for scripts. For a component folder, which no config describes, "valid" covers the
// safetensors checks only (headers, offsets, shards against their index). A single file that
// holds Z-Image components (ComfyUI / original names, FP8, all-in-one; docs/FORMATS.md) is
// described per component: prefix, the config inferred from its shapes, its FP8 format, and the
// loaders' checks (TextToImage::check_file), as `generate --dit/--text-encoder/--vae` would run
// them. A ControlNet (folder or file) and a LoRA file get the checks their loaders make before a
// transformer is needed (config.json parsed, every LoRA factor well formed and finite); weights
// holding no tensor at all are an error. Nothing from a file reaches the terminal unescaped:
// names, prefixes and messages go through json_util::printable (control characters and invalid
// UTF-8 as \xNN), --json is ASCII with JSON escapes.
#include <sys/stat.h>

#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "builtin/builtin_model.h"
#include "commands.h"
#include "io/fs/json_util.h"
#include "io/lora/lora.h"
#include "io/model/infer_config.h"
#include "io/model/model_folder.h"
#include "io/weights/single_file.h"
#include "io/weights/weights.h"
#include "model/adapters/zimage_controlnet.h"
#include "model/dit/zimage_dit.h"
#include "model/text_encoder/qwen3_encoder.h"
#include "pipeline/text_to_image.h"

namespace zimage::cli {
namespace {

using nlohmann::ordered_json;

// Text that may come from a file (tensor names, prefixes, messages quoting them), safe to print.
std::string safe(const std::string& s) {
  return json_util::printable(s);
}

// --json output: ASCII only (every other character as a JSON escape, so no terminal control
// sequence can pass), invalid UTF-8 replaced rather than thrown on.
void print_json(const ordered_json& j) {
  std::printf("%s\n", j.dump(2, ' ', true, ordered_json::error_handler_t::replace).c_str());
}

[[noreturn]] void fail(const Status& s) {
  std::fprintf(stderr, "zimage info: %s\n", safe(s.to_string()).c_str());
  throw CLI::RuntimeError(1);
}

ordered_json error_list(const std::vector<Status>& errors) {
  ordered_json list = ordered_json::array();
  for (const Status& e : errors) list.push_back(e.to_string());
  return list;
}

// Each error on stderr as `generate` words it; exit 1 when there is one.
void report_errors(const std::vector<Status>& errors) {
  for (const Status& e : errors)
    std::fprintf(stderr, "zimage info: %s\n", safe(e.to_string()).c_str());
  if (!errors.empty()) throw CLI::RuntimeError(1);
}

// A path that cannot even be described (errors not empty): with --json still a JSON answer.
[[noreturn]] void fail_invalid(const std::string& path, const char* kind, bool as_json,
                               const std::vector<Status>& errors) {
  if (as_json) {
    ordered_json j = {
        {"path", path}, {"kind", kind}, {"valid", false}, {"errors", error_list(errors)}};
    print_json(j);
  }
  report_errors(errors);
  throw CLI::RuntimeError(1);
}

// 1234567 -> "1,234,567"
std::string grouped(uint64_t n) {
  std::string digits = std::to_string(n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

std::string human_bytes(uint64_t n) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(n);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", v, units[u]);
  return buf;
}

// A float as the double with the same shortest decimal form (1e-05, not 9.99999974737875e-06).
double num(float f) {
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, f);
  return std::strtod(std::string(buf, r.ptr).c_str(), nullptr);
}

ordered_json weights_json(const WeightStore& w, bool with_tensors) {
  ordered_json j;
  j["path"] = w.path();
  j["tensors"] = w.size();
  j["parameters"] = w.total_params();
  ordered_json dtypes = ordered_json::object();
  for (const auto& [dt, n] : w.dtype_counts()) dtypes[dtype_name(dt)] = n;
  j["dtypes"] = dtypes;
  j["tensor_bytes"] = w.total_bytes();
  j["file_bytes"] = w.file_bytes();
  j["files"] = w.files();
  if (with_tensors) {
    ordered_json list = ordered_json::array();
    for (const std::string& name : w.names()) {
      auto info = w.info(name);
      if (!info.ok()) fail(info.status());
      list.push_back({{"name", name}, {"dtype", dtype_name(info->dtype)}, {"shape", info->shape}});
    }
    j["tensor_list"] = list;
  }
  return j;
}

ordered_json transformer_json(const TransformerConfig& c) {
  return {{"patch_size", c.patch_size},
          {"f_patch_size", c.f_patch_size},
          {"in_channels", c.in_channels},
          {"dim", c.dim},
          {"n_layers", c.n_layers},
          {"n_refiner_layers", c.n_refiner_layers},
          {"n_heads", c.n_heads},
          {"head_dim", c.head_dim()},
          {"ffn_hidden", c.ffn_hidden()},
          {"cap_feat_dim", c.cap_feat_dim},
          {"norm_eps", num(c.norm_eps)},
          {"qk_norm", c.qk_norm},
          {"rope_theta", num(c.rope_theta)},
          {"t_scale", num(c.t_scale)},
          {"axes_dims", c.axes_dims},
          {"axes_lens", c.axes_lens}};
}

ordered_json text_encoder_json(const TextEncoderConfig& c) {
  return {{"hidden_size", c.hidden_size},
          {"intermediate_size", c.intermediate_size},
          {"num_hidden_layers", c.num_hidden_layers},
          {"num_attention_heads", c.num_attention_heads},
          {"num_key_value_heads", c.num_key_value_heads},
          {"head_dim", c.head_dim},
          {"rms_norm_eps", num(c.rms_norm_eps)},
          {"rope_theta", c.rope_theta},
          {"vocab_size", c.vocab_size},
          {"max_position_embeddings", c.max_position_embeddings},
          {"tie_word_embeddings", c.tie_word_embeddings}};
}

ordered_json vae_json(const VaeConfig& c) {
  return {{"in_channels", c.in_channels},
          {"out_channels", c.out_channels},
          {"latent_channels", c.latent_channels},
          {"block_out_channels", c.block_out_channels},
          {"layers_per_block", c.layers_per_block},
          {"norm_num_groups", c.norm_num_groups},
          {"spatial_factor", c.spatial_factor()},
          {"scaling_factor", num(c.scaling_factor)},
          {"shift_factor", num(c.shift_factor)},
          {"use_quant_conv", c.use_quant_conv},
          {"use_post_quant_conv", c.use_post_quant_conv},
          {"mid_block_add_attention", c.mid_block_add_attention}};
}

ordered_json scheduler_json(const SchedulerConfig& c) {
  return {{"num_train_timesteps", c.num_train_timesteps},
          {"shift", num(c.shift)},
          {"use_dynamic_shifting", c.use_dynamic_shifting},
          {"base_shift", num(c.base_shift)},
          {"max_shift", num(c.max_shift)},
          {"base_image_seq_len", c.base_image_seq_len},
          {"max_image_seq_len", c.max_image_seq_len},
          {"invert_sigmas", c.invert_sigmas}};
}

std::string config_line(const ordered_json& cfg) {
  std::string s;
  for (const auto& [k, v] : cfg.items()) {
    if (!s.empty()) s += ", ";
    s += k + " " + v.dump();
  }
  return s;
}

// What the blocks' linear weights take on a bf16 GPU when kept as the file stores them
// (model/common/quantized_linear.h) against widened to bf16; "" when nothing is kept.
std::string kept_line(int64_t stored_per_unit, int64_t wide_per_unit, int units) {
  if (stored_per_unit >= wide_per_unit) return "";
  auto size = [](double b) {
    char s[32];
    std::snprintf(s, sizeof s, b >= (1u << 30) ? "%.2f GiB" : "%.2f MiB",
                  b / (b >= (1u << 30) ? (1u << 30) : (1u << 20)));
    return std::string(s);
  };
  return "block weights kept quantised on the device: about " +
         size(static_cast<double>(stored_per_unit) * units) + " for " + std::to_string(units) +
         " blocks (" + size(static_cast<double>(wide_per_unit) * units) + " widened to bf16)";
}

// Per component of a single file: prefix, inferred config, FP8 format (errors are reported by
// TextToImage::check_file; a component whose config cannot be inferred has no "config").
ordered_json single_file_json(const std::string& path, const SingleFileLayout& layout) {
  ordered_json comps = ordered_json::object();
  for (Component c : {Component::kTransformer, Component::kTextEncoder, Component::kVae}) {
    if (!layout.part(c).present) continue;
    ordered_json j = {{"prefix", layout.part(c).prefix}};
    auto cw = open_component_file(path, c);
    if (cw.ok()) {
      const TensorShapes shapes = tensor_shapes(cw->store);
      if (c == Component::kTransformer) {
        if (auto cfg = infer_transformer_config(shapes, path); cfg.ok()) {
          j["config"] = transformer_json(*cfg);
          const std::string k =
              kept_line(ZImageDiT::stored_block_weight_bytes(*cfg, cw->store, DType::kBF16, {}),
                        ZImageDiT::block_weight_bytes(*cfg, DType::kBF16, false),
                        2 * cfg->n_refiner_layers + cfg->n_layers);
          if (!k.empty()) j["kept_quantized"] = k;
        }
      } else if (c == Component::kTextEncoder) {
        if (auto cfg = infer_text_encoder_config(shapes, path); cfg.ok()) {
          j["config"] = text_encoder_json(*cfg);
          const std::string k =
              kept_line(Qwen3Encoder::stored_layer_weight_bytes(*cfg, cw->store, DType::kBF16, {}),
                        Qwen3Encoder::layer_weight_bytes(*cfg, DType::kBF16, false),
                        cfg->num_hidden_layers - 1);
          if (!k.empty()) j["kept_quantized"] = k;
        }
      } else if (auto cfg = infer_vae_config(shapes, path); cfg.ok()) {
        j["config"] = vae_json(*cfg);
      }
      if (cw->fp8.any()) j["fp8"] = cw->fp8.describe();
    }
    comps[component_name(c)] = j;
  }
  return {{"holds", layout.describe()}, {"components", comps}};
}

// Tensor names of a ControlNet (folder or single file; diffusers' and the published files' names).
bool looks_like_controlnet(const WeightStore& w) {
  for (const std::string& n : w.names())
    if (n.rfind("control_all_x_embedder.", 0) == 0 || n.rfind("control_layers.", 0) == 0)
      return true;
  return false;
}

// A key with a LoRA suffix (lora_A, lora_down, hada_w1_a, lokr_w1, .alpha, ...).
bool looks_like_lora(const WeightStore& w) {
  for (const std::string& n : w.names())
    if (split_lora_key(n)) return true;
  return false;
}

void print_weights(const char* indent, const WeightStore& w, bool with_tensors) {
  std::string dtypes;
  for (const auto& [dt, n] : w.dtype_counts()) {
    dtypes += (dtypes.empty() ? "" : ", ") + std::string(dtype_name(dt)) + " " + grouped(n);
  }
  std::printf("%sweights: %s tensors, %s parameters (%s)\n", indent, grouped(w.size()).c_str(),
              grouped(static_cast<uint64_t>(w.total_params())).c_str(), dtypes.c_str());
  std::printf("%son disk: %s (%s bytes) in %zu file(s)\n", indent,
              human_bytes(w.file_bytes()).c_str(), grouped(w.file_bytes()).c_str(),
              w.files().size());
  if (!with_tensors) return;
  for (const std::string& name : w.names()) {
    auto info = w.info(name);
    if (!info.ok()) fail(info.status());
    std::printf("%s  %-60s %-6s %s\n", indent, safe(name).c_str(), dtype_name(info->dtype),
                shape_string(info->shape).c_str());
  }
}

void run_info(std::string path, bool as_json, bool with_tensors) {
  if (path.empty()) {
    auto builtin = builtin_model_dir();
    if (!builtin.ok()) fail(builtin.status());
    path = *builtin;
  }
  struct stat st {};
  const bool is_model = ::stat((path + "/model_index.json").c_str(), &st) == 0;
  if (!is_model) {  // a component folder or a single file
    auto w = WeightStore::open(path);
    if (!w.ok()) fail_invalid(path, "weights", as_json, {w.status()});
    const bool file = ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
    const SingleFileLayout layout = detect_single_file(w->names());
    std::vector<Status> errors;
    ordered_json single;
    if (file && layout.count() > 0) {
      errors = TextToImage::check_file(path);
      single = single_file_json(path, layout);
    } else if (w->size() == 0) {  // nothing any loader could use (an empty GGUF, ...)
      errors = file ? TextToImage::check_file(path)
                    : std::vector<Status>{NotFound(path + ": holds no tensors")};
    } else if (looks_like_controlnet(*w)) {
      if (Status s = check_controlnet_files(path); !s.ok()) errors.push_back(std::move(s));
    } else if (file && looks_like_lora(*w)) {
      if (auto l = read_lora(path, 1.0f); !l.ok()) errors.push_back(l.status());
    }
    if (as_json) {
      ordered_json j = {{"path", path},
                        {"kind", "weights"},
                        {"valid", errors.empty()},
                        {"errors", error_list(errors)},
                        {"weights", weights_json(*w, with_tensors)}};
      if (!single.is_null()) j["single_file"] = single;
      print_json(j);
    } else {
      std::printf("weights: %s\n", path.c_str());
      print_weights("  ", *w, with_tensors);
      if (!single.is_null()) {
        std::printf("single file holding %s\n", safe(single["holds"].get<std::string>()).c_str());
        for (const auto& [name, c] : single["components"].items()) {
          std::printf("%s%s\n", name.c_str(),
                      c.contains("prefix") && !c["prefix"].get<std::string>().empty()
                          ? (" (prefix " + safe(c["prefix"].get<std::string>()) + ")").c_str()
                          : "");
          if (c.contains("config"))
            std::printf("  config (inferred from the tensor shapes): %s\n",
                        config_line(c["config"]).c_str());
          if (c.contains("fp8"))
            std::printf("  fp8: %s\n", safe(c["fp8"].get<std::string>()).c_str());
          if (c.contains("kept_quantized"))
            std::printf("  %s\n", c["kept_quantized"].get<std::string>().c_str());
        }
        if (errors.empty())
          std::printf(
              "check: ok (every tensor the models bind present with its shape and a float "
              "dtype, none unexpected; FP8 scales consistent)\n");
        else
          std::printf("check: FAILED, %zu problem(s)\n", errors.size());
      }
    }
    report_errors(errors);
    return;
  }

  auto folder = ModelFolder::open(path);
  if (!folder.ok()) fail_invalid(path, "model_folder", as_json, {folder.status()});
  // What generate would reject: the real loaders bind every tensor, nothing is uploaded.
  const std::vector<Status> errors = TextToImage::check_folder(path);
  const std::pair<const char*, ordered_json> components[] = {
      {"transformer", transformer_json(folder->transformer())},
      {"text_encoder", text_encoder_json(folder->text_encoder())},
      {"vae", vae_json(folder->vae())}};
  std::vector<WeightStore> stores;
  for (const auto& [name, cfg] : components) {
    auto w = folder->open_weights(name);  // a failure is among `errors` too
    if (!w.ok())
      fail_invalid(path, "model_folder", as_json,
                   errors.empty() ? std::vector<Status>{w.status()} : errors);
    stores.push_back(std::move(*w));
  }
  uint64_t tensors = 0, file_bytes = 0;
  int64_t params = 0;
  for (const WeightStore& w : stores) {
    tensors += w.size();
    params += w.total_params();
    file_bytes += w.file_bytes();
  }

  if (as_json) {
    ordered_json j = {{"path", folder->dir()},
                      {"kind", "model_folder"},
                      {"valid", errors.empty()},
                      {"errors", error_list(errors)}};
    ordered_json comps = ordered_json::object();
    for (size_t i = 0; i < stores.size(); ++i) {
      comps[components[i].first] = {{"config", components[i].second},
                                    {"weights", weights_json(stores[i], with_tensors)}};
    }
    comps["scheduler"] = {{"config", scheduler_json(folder->scheduler())}};
    comps["tokenizer"] = {{"path", folder->tokenizer_dir()}};
    j["components"] = comps;
    j["total"] = {{"tensors", tensors}, {"parameters", params}, {"file_bytes", file_bytes}};
    print_json(j);
    report_errors(errors);
    return;
  }
  std::printf("model folder: %s (ZImagePipeline)\n", folder->dir().c_str());
  for (size_t i = 0; i < stores.size(); ++i) {
    std::printf("%s\n  config: %s\n", components[i].first,
                config_line(components[i].second).c_str());
    print_weights("  ", stores[i], with_tensors);
  }
  std::printf("scheduler (FlowMatchEulerDiscreteScheduler)\n  config: %s\n",
              config_line(scheduler_json(folder->scheduler())).c_str());
  std::printf("tokenizer: %s\n", folder->tokenizer_dir().c_str());
  std::printf("total: %s tensors, %s parameters, %s (%s bytes) on disk\n", grouped(tensors).c_str(),
              grouped(static_cast<uint64_t>(params)).c_str(), human_bytes(file_bytes).c_str(),
              grouped(file_bytes).c_str());
  if (errors.empty()) {
    std::printf(
        "check: ok (tokenizer parsed; every tensor the models bind present with its shape and a "
        "float dtype, none unexpected; components consistent)\n");
  } else {
    std::printf("check: FAILED, %zu problem(s); `generate` would refuse this folder\n",
                errors.size());
  }
  report_errors(errors);
}

}  // namespace

void register_info_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "info",
      "Describe a model folder, component folder or .safetensors file and run every load-time "
      "check `generate` runs (exit 1 on a problem); without PATH, the built-in model");
  auto path = std::make_shared<std::string>();
  auto as_json = std::make_shared<bool>(false);
  auto with_tensors = std::make_shared<bool>(false);
  cmd->add_option("PATH", *path,
                  "Model folder (with model_index.json), component folder or file (default: the "
                  "built-in model)");
  cmd->add_flag("--json", *as_json, "Print machine-readable JSON");
  cmd->add_flag("--tensors", *with_tensors, "Also list every tensor (name, dtype, shape)");
  cmd->callback([=] { run_info(*path, *as_json, *with_tensors); });
}

}  // namespace zimage::cli
