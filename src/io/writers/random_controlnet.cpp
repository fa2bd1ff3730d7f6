#include "io/writers/random_controlnet.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "io/fs/file_io.h"

namespace zimage {
namespace fs = std::filesystem;

Result<RandomControlNetLayout> controlnet_layout(const std::string& version,
                                                 const TransformerConfig& dit) {
  RandomControlNetLayout l;
  int count = 0;
  if (version == "1.0") {
    count = 6;
    l.control_in_dim = 16;
  } else if (version == "2.0" || version == "2.1") {
    count = 15;
    l.add_control_noise_refiner = version == "2.0" ? "control_layers" : "control_noise_refiner";
  } else if (version == "2.1-lite") {
    count = 3;
    l.add_control_noise_refiner = "control_noise_refiner";
  } else {
    return InvalidArgument("--controlnet-version " + version +
                           ": must be one of 1.0, 2.0, 2.1, 2.1-lite");
  }
  if (dit.n_layers < count || dit.n_layers % count != 0)
    return InvalidArgument("--controlnet-version " + version + ": its " + std::to_string(count) +
                           " control layers cannot be spread evenly over the transformer's " +
                           std::to_string(dit.n_layers) + " layers");
  // The ControlNet config's n_refiner_layers must be positive (its own refiner blocks, or the
  // 2.1 control refiner's), and the refiner places must name the transformer's refiner layers.
  if (dit.n_refiner_layers < 1)
    return InvalidArgument("--controlnet-version " + version +
                           ": the transformer has no noise refiner layer; a ControlNet needs one");
  for (int k = 0; k < count; ++k) l.control_layers_places.push_back(k * (dit.n_layers / count));
  // The published [0, 1], cut to the transformer's refiner layers (one: [0]).
  if (!l.add_control_noise_refiner.empty())
    for (int r = 0; r < std::min(2, dit.n_refiner_layers); ++r)
      l.control_refiner_layers_places.push_back(r);
  l.n_refiner_layers = dit.n_refiner_layers;
  return l;
}

std::vector<TensorSpec> controlnet_tensor_specs(const TransformerConfig& dit,
                                                const RandomControlNetLayout& l) {
  std::vector<TensorSpec> v;
  const int64_t d = dit.dim;
  const std::string pf = std::to_string(dit.patch_size) + "-" + std::to_string(dit.f_patch_size);
  const int64_t tf =
      int64_t{dit.patch_size} * dit.patch_size * dit.f_patch_size * int64_t{l.control_in_dim};
  v.push_back({"control_all_x_embedder." + pf + ".weight", {d, tf}, InitKind::kFanIn});
  v.push_back({"control_all_x_embedder." + pf + ".bias", {d}, InitKind::kBias});
  // A control block: a modulated DiT block, after_proj, and before_proj on the first of a chain.
  auto control_block = [&](const std::string& p, bool first) {
    append_dit_block_specs(v, dit, p, true);
    if (first) {
      v.push_back({p + "before_proj.weight", {d, d}, InitKind::kFanIn});
      v.push_back({p + "before_proj.bias", {d}, InitKind::kBias});
    }
    v.push_back({p + "after_proj.weight", {d, d}, InitKind::kFanIn});
    v.push_back({p + "after_proj.bias", {d}, InitKind::kBias});
  };
  for (size_t i = 0; i < l.control_layers_places.size(); ++i)
    control_block("control_layers." + std::to_string(i) + ".", i == 0);
  for (int i = 0; i < l.n_refiner_layers; ++i) {
    const std::string p = "control_noise_refiner." + std::to_string(i) + ".";
    if (l.add_control_noise_refiner.empty()) {
      append_dit_block_specs(v, dit, p, true);  // 1.0: plain modulated blocks
    } else if (l.add_control_noise_refiner == "control_noise_refiner") {
      control_block(p, i == 0);
    }  // "control_layers" (2.0): no refiner tensors in the folder layout
  }
  return v;
}

namespace {
// A float as the shortest decimal that reads back to it (1e-05, not 9.99999974737875e-06).
double short_double(float f) {
  char b[32];
  std::snprintf(b, sizeof b, "%.7g", static_cast<double>(f));
  return std::strtod(b, nullptr);
}
}  // namespace

std::string controlnet_config_json(const TransformerConfig& dit, const RandomControlNetLayout& l) {
  using nlohmann::json;
  const json refiner_places = l.control_refiner_layers_places.empty()
                                  ? json(nullptr)
                                  : json(l.control_refiner_layers_places);
  const json mode =
      l.add_control_noise_refiner.empty() ? json(nullptr) : json(l.add_control_noise_refiner);
  const json j = {{"_class_name", "ZImageControlNetModel"},
                  {"_diffusers_version", "0.42.1"},
                  {"add_control_noise_refiner", mode},
                  {"all_f_patch_size", {dit.f_patch_size}},
                  {"all_patch_size", {dit.patch_size}},
                  {"control_in_dim", l.control_in_dim},
                  {"control_layers_places", l.control_layers_places},
                  {"control_refiner_layers_places", refiner_places},
                  {"dim", dit.dim},
                  {"n_heads", dit.n_heads},
                  {"n_kv_heads", dit.n_kv_heads},
                  {"n_refiner_layers", l.n_refiner_layers},
                  {"norm_eps", short_double(dit.norm_eps)},
                  {"qk_norm", dit.qk_norm}};
  return j.dump(2);
}

Status write_random_controlnet(const std::string& dir, const std::string& version,
                               const RandomModelOptions& o,
                               const std::function<void(const std::string&)>& progress) {
  ZI_ASSIGN_OR_RETURN(RandomControlNetLayout layout, controlnet_layout(version, o.dit));
  const fs::path root(dir);
  std::error_code ec;
  if (fs::exists(root, ec) && !fs::is_empty(root, ec))
    return InvalidArgument("random ControlNet: " + dir + " exists and is not empty");
  fs::create_directories(root, ec);
  if (ec) return IoError("cannot create " + dir + ": " + ec.message());
  ZI_TRY(write_output_file((root / "config.json").string(),
                           controlnet_config_json(o.dit, layout) + "\n"));
  if (progress) progress((root / "config.json").string());
  // A seed of its own per tensor name: the control blocks do not repeat the DiT's values.
  RandomModelOptions co = o;
  co.outlier_fraction = 0.0;
  co.seed = o.seed ^ 0x636f6e74726f6cull;  // "control"
  return write_random_tensors(dir, "diffusion_pytorch_model",
                              "diffusion_pytorch_model.safetensors.index.json",
                              controlnet_tensor_specs(o.dit, layout), co, progress);
}

}  // namespace zimage
