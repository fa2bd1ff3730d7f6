// Typed configs of the published Z-Image diffusers folder (see docs/ARCHITECTURE.md and the
// model spec). Defaults are the real Z-Image-Turbo values; smaller consistent configs (the test
// models) are accepted. Parsing and validation live in io/model/model_folder.cpp.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

namespace zimage {

// transformer/config.json (ZImageTransformer2DModel)
struct TransformerConfig {
  int patch_size = 2;    // all_patch_size[0]
  int f_patch_size = 1;  // all_f_patch_size[0]
  int in_channels = 16;  // out_channels = in_channels
  int dim = 3840;
  int n_layers = 30;
  int n_refiner_layers = 2;
  int n_heads = 30;
  int n_kv_heads = 30;  // ignored by the model (no GQA in the DiT)
  float norm_eps = 1e-5f;
  bool qk_norm = true;
  int cap_feat_dim = 2560;
  float rope_theta = 256.0f;
  float t_scale = 1000.0f;
  std::vector<int> axes_dims{32, 48, 48};
  std::vector<int> axes_lens{1536, 512, 512};

  int head_dim() const { return dim / n_heads; }
  int ffn_hidden() const { return static_cast<int>(dim / 3.0 * 8); }  // int(dim/3*8)
  int adaln_dim() const { return std::min(dim, 256); }
  int token_features() const { return patch_size * patch_size * f_patch_size * in_channels; }
};

// text_encoder/config.json (Qwen3Model)
struct TextEncoderConfig {
  int hidden_size = 2560;
  int intermediate_size = 9728;
  int num_hidden_layers = 36;
  int num_attention_heads = 32;
  int num_key_value_heads = 8;
  int head_dim = 128;
  float rms_norm_eps = 1e-6f;
  double rope_theta = 1000000.0;  // top level or rope_parameters.rope_theta
  int vocab_size = 151936;
  int max_position_embeddings = 40960;
  bool tie_word_embeddings = true;
  bool attention_bias = false;
};

// vae/config.json (AutoencoderKL)
struct VaeConfig {
  int in_channels = 3;
  int out_channels = 3;
  int latent_channels = 16;
  std::vector<int> block_out_channels{128, 256, 512, 512};
  int layers_per_block = 2;
  int norm_num_groups = 32;
  float scaling_factor = 0.3611f;
  float shift_factor = 0.1159f;  // 0 when the config has null
  bool use_quant_conv = false;
  bool use_post_quant_conv = false;
  bool mid_block_add_attention = true;
  // diffusers' sample_size: the tile size in pixels of AutoencoderKL's tiled decode
  // (tile_sample_min_size; model/vae/vae_tiling.h). The class default is 32; Z-Image's is 1024.
  int sample_size = 1024;

  int spatial_factor() const { return 1 << (static_cast<int>(block_out_channels.size()) - 1); }
};

// scheduler/scheduler_config.json (FlowMatchEulerDiscreteScheduler); class defaults for absent
// keys.
struct SchedulerConfig {
  int num_train_timesteps = 1000;
  float shift = 1.0f;
  bool use_dynamic_shifting = false;
  float base_shift = 0.5f;
  float max_shift = 1.15f;
  int base_image_seq_len = 256;
  int max_image_seq_len = 4096;
  bool invert_sigmas = false;
  bool shift_terminal_set = false;  // shift_terminal non-null: unsupported, rejected at load
  bool use_karras_sigmas = false;   // true: unsupported, rejected at load
  bool use_exponential_sigmas = false;
  bool use_beta_sigmas = false;
  bool stochastic_sampling = false;
};

}  // namespace zimage
