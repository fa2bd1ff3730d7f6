// A Z-Image ControlNet folder (Fun-Controlnet-Union layout, diffusers' ZImageControlNetModel) with
// random weights of realistic scale, for the DiT of a random (or real) model folder: the
// full-size ControlNet cannot be downloaded where zimage is developed, so img2img / inpainting /
// ControlNet speed and memory are measured (against diffusers, which loads the same folder) on
// one written by this. Values come from io/writers/random_model.h's counter-based generator, written a
// chunk at a time (a full-size 2.1 ControlNet is 3.4 B parameters, 6.7 GB in bf16).
//
// The published layouts (tools/make_controlnet_goldens.py holds the same table, and its goldens
// are diffusers' own save_pretrained of each), for a DiT of L layers (30 at full size):
//   version   control layers at          control_in_dim  add_control_noise_refiner
//   1.0       every L/6-th: 0,5,..,25    16              null (own control_noise_refiner blocks)
//   2.0       every L/15-th: 0,2,..,28   33              "control_layers"
//   2.1       every L/15-th: 0,2,..,28   33              "control_noise_refiner" (2 control blocks)
//   2.1-lite  every L/3-rd: 0,10,20      33              "control_noise_refiner"
// 2.x: control_refiner_layers_places [0, 1]; 33 = 16 control latents + 1 mask + 16 masked-image
// latents (the inpainting channels).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/status.h"
#include "io/model/model_config.h"
#include "io/writers/random_model.h"

namespace zimage {

struct RandomControlNetLayout {
  std::vector<int> control_layers_places;
  std::vector<int> control_refiner_layers_places;  // empty for 1.0 (null in config.json)
  int control_in_dim = 33;
  std::string add_control_noise_refiner;  // "", "control_layers" or "control_noise_refiner"
  int n_refiner_layers = 2;
};

// The layout of published `version` ("1.0", "2.0", "2.1", "2.1-lite") for `dit`; an unknown
// version, a DiT whose depth the version's control layers cannot be spread evenly over, or one
// without a noise refiner layer, is an InvalidArgument naming it. 2.x refiner places are the
// published [0, 1], cut to the DiT's refiner layers ([0] for one).
Result<RandomControlNetLayout> controlnet_layout(const std::string& version,
                                                 const TransformerConfig& dit);

// Every tensor of such a ControlNet as diffusers saves it (names and PyTorch shapes).
std::vector<TensorSpec> controlnet_tensor_specs(const TransformerConfig& dit,
                                                const RandomControlNetLayout& layout);

// config.json of the folder, as ZImageControlNetModel.save_pretrained writes it.
std::string controlnet_config_json(const TransformerConfig& dit,
                                   const RandomControlNetLayout& layout);

// Writes config.json and diffusion_pytorch_model.safetensors (sharded with an index past
// options.max_shard_bytes) under `dir`, which must not exist or be empty. options.dit is the
// transformer it controls; seed, dtype, threads and max_shard_bytes as for write_random_model.
Status write_random_controlnet(const std::string& dir, const std::string& version,
                               const RandomModelOptions& options,
                               const std::function<void(const std::string&)>& progress = {});

}  // namespace zimage
