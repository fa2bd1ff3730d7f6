// Component configs inferred from tensor names and shapes. Why: a single checkpoint file (the
// ComfyUI repack, the original release) carries no config.json, so the architecture has to be
// read off the weights. Every hyperparameter that decides a tensor shape is taken from the
// tensors; the rest cannot be seen in a file and takes the published Z-Image-Turbo value (model
// spec §2), documented per field below and in docs/FORMATS.md.
//
// Names may be diffusers or ComfyUI / original / LDM names, already stripped of any component
// prefix (io/weights/single_file.h does that). A set of tensors that is incomplete or inconsistent is a
// FormatError naming the file, the tensor(s) missing or the two shapes that disagree.
#pragma once

#include <map>
#include <string>

#include "core/status.h"
#include "core/tensor.h"
#include "io/model/model_config.h"
#include "io/weights/weights.h"

namespace zimage {

// name -> shape of every tensor of one component.
using TensorShapes = std::map<std::string, Shape>;
TensorShapes tensor_shapes(const WeightStore& ws);

// ZImageTransformer2DModel. From the tensors: dim, cap_feat_dim, n_layers, n_refiner_layers,
// n_heads (dim / the q_norm width), in_channels and the patch size (x_embedder's input width; a
// diffusers name `all_x_embedder.<p>-<f>` gives the patch sizes, ComfyUI names imply 2 and 1).
// Checked: the feed-forward width is int(dim / 3 * 8), the adaLN width min(dim, 256), every
// block index from 0 to n - 1 is present. Published values: rope_theta 256, norm_eps 1e-5,
// t_scale 1000, axes_lens [1536, 512, 512], axes_dims [32, 48, 48] for head_dim 128 (other
// head_dims divisible by 16 get the same proportions: head_dim x [1/4, 3/8, 3/8]).
Result<TransformerConfig> infer_transformer_config(const TensorShapes& t, const std::string& file);

// Qwen3 (transformers names, with or without a leading "model."). From the tensors:
// hidden_size and vocab_size (embed_tokens), num_hidden_layers, head_dim (q_norm),
// num_attention_heads and num_key_value_heads (q_proj / k_proj rows over head_dim),
// intermediate_size (gate_proj). Published Qwen3-4B values: rms_norm_eps 1e-6, rope_theta 1e6,
// max_position_embeddings 40960, tied embeddings. A projection bias is Unsupported.
Result<TextEncoderConfig> infer_text_encoder_config(const TensorShapes& t, const std::string& file);

// AutoencoderKL (diffusers or LDM / BFL names). From the tensors: latent_channels,
// block_out_channels, layers_per_block, in/out channels, mid-block attention, quant convs.
// Published values (Z-Image uses the Flux VAE): norm_num_groups 32, scaling_factor 0.3611,
// shift_factor 0.1159.
Result<VaeConfig> infer_vae_config(const TensorShapes& t, const std::string& file);

// The published Z-Image-Turbo scheduler: FlowMatch Euler, shift 3.0, no dynamic shifting.
SchedulerConfig published_scheduler_config();

// True when `a` and `b` describe the same tensor shapes (the fields inference reads), so a
// folder's config may stand in for an inferred one and keep its other values.
bool same_shapes(const TransformerConfig& a, const TransformerConfig& b);
bool same_shapes(const TextEncoderConfig& a, const TextEncoderConfig& b);
bool same_shapes(const VaeConfig& a, const VaeConfig& b);

}  // namespace zimage
