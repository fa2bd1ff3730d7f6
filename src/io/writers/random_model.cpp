#include "io/writers/random_model.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "io/fs/file_io.h"
#include "io/weights/safetensors.h"

namespace zimage {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string layer(const std::string& prefix, int i) {
  return prefix + "." + std::to_string(i) + ".";
}

void add(std::vector<TensorSpec>& v, std::string name, Shape shape, InitKind init) {
  v.push_back(TensorSpec{std::move(name), std::move(shape), init});
}

// A ResnetBlock2D of the VAE (spec §8.2).
void add_resnet(std::vector<TensorSpec>& v, const std::string& p, int64_t cin, int64_t cout) {
  add(v, p + "norm1.weight", {cin}, InitKind::kNormGain);
  add(v, p + "norm1.bias", {cin}, InitKind::kBias);
  add(v, p + "conv1.weight", {cout, cin, 3, 3}, InitKind::kFanIn);
  add(v, p + "conv1.bias", {cout}, InitKind::kBias);
  add(v, p + "norm2.weight", {cout}, InitKind::kNormGain);
  add(v, p + "norm2.bias", {cout}, InitKind::kBias);
  add(v, p + "conv2.weight", {cout, cout, 3, 3}, InitKind::kFanIn);
  add(v, p + "conv2.bias", {cout}, InitKind::kBias);
  if (cin != cout) {
    add(v, p + "conv_shortcut.weight", {cout, cin, 1, 1}, InitKind::kFanIn);
    add(v, p + "conv_shortcut.bias", {cout}, InitKind::kBias);
  }
}

void add_mid(std::vector<TensorSpec>& v, const std::string& p, int64_t c) {
  add_resnet(v, p + "mid_block.resnets.0.", c, c);
  const std::string a = p + "mid_block.attentions.0.";
  add(v, a + "group_norm.weight", {c}, InitKind::kNormGain);
  add(v, a + "group_norm.bias", {c}, InitKind::kBias);
  for (const char* n : {"to_q", "to_k", "to_v", "to_out.0"}) {
    add(v, a + n + ".weight", {c, c}, InitKind::kFanIn);
    add(v, a + n + ".bias", {c}, InitKind::kBias);
  }
  add_resnet(v, p + "mid_block.resnets.1.", c, c);
}

// splitmix64: a counter-based generator, so any element is computable from (seed, index) alone.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t name_hash(const std::string& s) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

Status write_text(const fs::path& path, const std::string& text) {
  return write_output_file(path.string(), text);
}

json dit_config_json(const TransformerConfig& c) {
  return json{{"_class_name", "ZImageTransformer2DModel"},
              {"_diffusers_version", "0.36.0.dev0"},
              {"all_f_patch_size", {c.f_patch_size}},
              {"all_patch_size", {c.patch_size}},
              {"axes_dims", c.axes_dims},
              {"axes_lens", c.axes_lens},
              {"cap_feat_dim", c.cap_feat_dim},
              {"dim", c.dim},
              {"in_channels", c.in_channels},
              {"n_heads", c.n_heads},
              {"n_kv_heads", c.n_kv_heads},
              {"n_layers", c.n_layers},
              {"n_refiner_layers", c.n_refiner_layers},
              {"norm_eps", c.norm_eps},
              {"qk_norm", c.qk_norm},
              {"rope_theta", c.rope_theta},
              {"t_scale", c.t_scale}};
}

json te_config_json(const TextEncoderConfig& c) {
  return json{{"architectures", {"Qwen3ForCausalLM"}},
              {"attention_bias", c.attention_bias},
              {"attention_dropout", 0.0},
              {"bos_token_id", 151643},
              {"eos_token_id", 151645},
              {"head_dim", c.head_dim},
              {"hidden_act", "silu"},
              {"hidden_size", c.hidden_size},
              {"initializer_range", 0.02},
              {"intermediate_size", c.intermediate_size},
              {"max_position_embeddings", c.max_position_embeddings},
              {"max_window_layers", c.num_hidden_layers},
              {"model_type", "qwen3"},
              {"num_attention_heads", c.num_attention_heads},
              {"num_hidden_layers", c.num_hidden_layers},
              {"num_key_value_heads", c.num_key_value_heads},
              {"rms_norm_eps", c.rms_norm_eps},
              {"rope_scaling", nullptr},
              {"rope_theta", c.rope_theta},
              {"sliding_window", nullptr},
              {"tie_word_embeddings", c.tie_word_embeddings},
              {"torch_dtype", "bfloat16"},
              {"transformers_version", "4.51.0"},
              {"use_cache", true},
              {"use_sliding_window", false},
              {"vocab_size", c.vocab_size}};
}

json vae_config_json(const VaeConfig& c) {
  const size_t n = c.block_out_channels.size();
  return json{{"_class_name", "AutoencoderKL"},
              {"_diffusers_version", "0.36.0.dev0"},
              {"act_fn", "silu"},
              {"block_out_channels", c.block_out_channels},
              {"down_block_types", std::vector<std::string>(n, "DownEncoderBlock2D")},
              {"force_upcast", true},
              {"in_channels", c.in_channels},
              {"latent_channels", c.latent_channels},
              {"latents_mean", nullptr},
              {"latents_std", nullptr},
              {"layers_per_block", c.layers_per_block},
              {"mid_block_add_attention", c.mid_block_add_attention},
              {"norm_num_groups", c.norm_num_groups},
              {"out_channels", c.out_channels},
              {"sample_size", c.sample_size},
              {"scaling_factor", c.scaling_factor},
              {"shift_factor", c.shift_factor},
              {"up_block_types", std::vector<std::string>(n, "UpDecoderBlock2D")},
              {"use_post_quant_conv", false},
              {"use_quant_conv", false}};
}

// Writes one component's tensors as one file or as shards plus an index.
Status write_component(const fs::path& dir, const std::string& stem, const std::string& index_name,
                       const std::vector<TensorSpec>& specs, const RandomModelOptions& o,
                       const std::function<void(const std::string&)>& progress) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return IoError("cannot create " + dir.string() + ": " + ec.message());
  const size_t esize = dtype_size(o.dtype);
  // Group tensors into shards in name order (as save_pretrained does), each below max_shard_bytes.
  std::vector<TensorSpec> sorted = specs;
  std::sort(sorted.begin(), sorted.end(),
            [](const TensorSpec& a, const TensorSpec& b) { return a.name < b.name; });
  std::vector<std::vector<const TensorSpec*>> shards(1);
  uint64_t cur = 0, total = 0;
  for (const auto& s : sorted) {
    const uint64_t bytes = static_cast<uint64_t>(shape_numel(s.shape)) * esize;
    if (cur > 0 && cur + bytes > o.max_shard_bytes) {
      shards.emplace_back();
      cur = 0;
    }
    shards.back().push_back(&s);
    cur += bytes;
    total += bytes;
  }
  const int nthreads =
      o.threads > 0 ? o.threads : std::max(1u, std::thread::hardware_concurrency());
  json weight_map = json::object();
  for (size_t si = 0; si < shards.size(); ++si) {
    std::string fname = stem + ".safetensors";
    if (shards.size() > 1) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "-%05zu-of-%05zu", si + 1, shards.size());
      fname = stem + buf + ".safetensors";
    }
    std::vector<SafetensorsEntry> entries;
    for (const TensorSpec* s : shards[si]) {
      entries.push_back(SafetensorsEntry{s->name, o.dtype, s->shape});
      weight_map[s->name] = fname;
    }
    ZI_ASSIGN_OR_RETURN(auto writer, SafetensorsWriter::create((dir / fname).string(), entries,
                                                               {{"format", "pt"}}));
    constexpr size_t kChunk = size_t{1} << 24;  // elements per parallel chunk
    std::vector<float> vals(kChunk);
    std::vector<uint8_t> bytes(kChunk * esize);
    for (const TensorSpec* s : shards[si]) {
      const uint64_t n = static_cast<uint64_t>(shape_numel(s->shape));
      for (uint64_t off = 0; off < n; off += kChunk) {
        const size_t m = static_cast<size_t>(std::min<uint64_t>(kChunk, n - off));
        const size_t per = (m + nthreads - 1) / nthreads;
        std::vector<std::thread> pool;
        for (int t = 0; t < nthreads; ++t) {
          const size_t b = t * per, e = std::min(m, b + per);
          if (b >= e) break;
          pool.emplace_back([&, b, e] {
            random_tensor_values(*s, o.seed, off + b, vals.data() + b, e - b);
            if (s->outlier_columns && o.outlier_fraction > 0 && s->shape.size() == 2) {
              const int64_t k = s->shape[1];
              for (size_t i = b; i < e; ++i)
                if (is_outlier_channel(o.seed, static_cast<int64_t>((off + i) % k),
                                       o.outlier_fraction))
                  vals[i] *= o.outlier_scale;
            }
            convert_from_f32(o.dtype, vals.data() + b, bytes.data() + b * esize, e - b);
          });
        }
        for (auto& th : pool) th.join();
        ZI_TRY(writer->write(bytes.data(), m * esize));
      }
    }
    ZI_TRY(writer->finish());
    if (progress) progress((dir / fname).string());
  }
  if (shards.size() > 1) {
    json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    ZI_TRY(write_text(dir / index_name, index.dump(2)));
  }
  return Status::Ok();
}

}  // namespace

void append_dit_block_specs(std::vector<TensorSpec>& v, const TransformerConfig& c,
                            const std::string& p, bool modulated) {
  const int64_t d = c.dim, f = c.ffn_hidden(), hd = c.head_dim(), a = c.adaln_dim();
  for (const char* n : {"to_q", "to_k", "to_v", "to_out.0"})
    add(v, p + "attention." + n + ".weight", {d, d}, InitKind::kFanIn);
  add(v, p + "attention.norm_q.weight", {hd}, InitKind::kNormGain);
  add(v, p + "attention.norm_k.weight", {hd}, InitKind::kNormGain);
  add(v, p + "feed_forward.w1.weight", {f, d}, InitKind::kFanIn);
  add(v, p + "feed_forward.w2.weight", {d, f}, InitKind::kFanIn);
  add(v, p + "feed_forward.w3.weight", {f, d}, InitKind::kFanIn);
  for (const char* n : {"attention_norm1", "attention_norm2", "ffn_norm1", "ffn_norm2"})
    add(v, p + n + ".weight", {d}, InitKind::kNormGain);
  if (modulated) {
    add(v, p + "adaLN_modulation.0.weight", {4 * d, a}, InitKind::kFanIn);
    add(v, p + "adaLN_modulation.0.bias", {4 * d}, InitKind::kBias);
  }
}

std::vector<TensorSpec> dit_tensor_specs(const TransformerConfig& c) {
  std::vector<TensorSpec> v;
  const int64_t d = c.dim, a = c.adaln_dim();
  auto block = [&](const std::string& p, bool modulated) {
    append_dit_block_specs(v, c, p, modulated);
  };
  for (int i = 0; i < c.n_refiner_layers; ++i) block(layer("noise_refiner", i), true);
  for (int i = 0; i < c.n_refiner_layers; ++i) block(layer("context_refiner", i), false);
  for (int i = 0; i < c.n_layers; ++i) block(layer("layers", i), true);
  const int64_t tf = c.token_features();
  const std::string pf = std::to_string(c.patch_size) + "-" + std::to_string(c.f_patch_size);
  add(v, "all_x_embedder." + pf + ".weight", {d, tf}, InitKind::kFanIn);
  add(v, "all_x_embedder." + pf + ".bias", {d}, InitKind::kBias);
  add(v, "all_final_layer." + pf + ".linear.weight", {tf, d}, InitKind::kFanIn);
  add(v, "all_final_layer." + pf + ".linear.bias", {tf}, InitKind::kBias);
  add(v, "all_final_layer." + pf + ".adaLN_modulation.1.weight", {d, a}, InitKind::kFanIn);
  add(v, "all_final_layer." + pf + ".adaLN_modulation.1.bias", {d}, InitKind::kBias);
  add(v, "t_embedder.mlp.0.weight", {1024, 256}, InitKind::kFanIn);
  add(v, "t_embedder.mlp.0.bias", {1024}, InitKind::kBias);
  add(v, "t_embedder.mlp.2.weight", {a, 1024}, InitKind::kFanIn);
  add(v, "t_embedder.mlp.2.bias", {a}, InitKind::kBias);
  add(v, "cap_embedder.0.weight", {c.cap_feat_dim}, InitKind::kNormGain);
  add(v, "cap_embedder.1.weight", {d, c.cap_feat_dim}, InitKind::kFanIn);
  add(v, "cap_embedder.1.bias", {d}, InitKind::kBias);
  add(v, "x_pad_token", {1, d}, InitKind::kUnit);
  add(v, "cap_pad_token", {1, d}, InitKind::kUnit);
  return v;
}

std::vector<TensorSpec> qwen3_tensor_specs(const TextEncoderConfig& c) {
  std::vector<TensorSpec> v;
  const int64_t h = c.hidden_size, q = int64_t{c.num_attention_heads} * c.head_dim,
                kv = int64_t{c.num_key_value_heads} * c.head_dim, ff = c.intermediate_size;
  add(v, "embed_tokens.weight", {c.vocab_size, h}, InitKind::kEmbed);
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = layer("layers", i);
    add(v, p + "input_layernorm.weight", {h}, InitKind::kNormGain);
    add(v, p + "post_attention_layernorm.weight", {h}, InitKind::kNormGain);
    add(v, p + "self_attn.q_proj.weight", {q, h}, InitKind::kFanIn);
    add(v, p + "self_attn.k_proj.weight", {kv, h}, InitKind::kFanIn);
    add(v, p + "self_attn.v_proj.weight", {kv, h}, InitKind::kFanIn);
    add(v, p + "self_attn.o_proj.weight", {h, q}, InitKind::kFanIn);
    add(v, p + "self_attn.q_norm.weight", {c.head_dim}, InitKind::kNormGain);
    add(v, p + "self_attn.k_norm.weight", {c.head_dim}, InitKind::kNormGain);
    add(v, p + "mlp.gate_proj.weight", {ff, h}, InitKind::kFanIn);
    add(v, p + "mlp.up_proj.weight", {ff, h}, InitKind::kFanIn);
    add(v, p + "mlp.down_proj.weight", {h, ff}, InitKind::kFanIn);
  }
  add(v, "norm.weight", {h}, InitKind::kNormGain);
  return v;
}

std::vector<TensorSpec> vae_tensor_specs(const VaeConfig& c) {
  std::vector<TensorSpec> v;
  const auto& ch = c.block_out_channels;
  const int n = static_cast<int>(ch.size());
  const int64_t lat = c.latent_channels;
  // Encoder (spec §8.4).
  add(v, "encoder.conv_in.weight", {ch[0], c.in_channels, 3, 3}, InitKind::kFanIn);
  add(v, "encoder.conv_in.bias", {ch[0]}, InitKind::kBias);
  int64_t cin = ch[0];
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < c.layers_per_block; ++j) {
      add_resnet(v,
                 "encoder.down_blocks." + std::to_string(i) + ".resnets." + std::to_string(j) + ".",
                 j == 0 ? cin : ch[i], ch[i]);
    }
    cin = ch[i];
    if (i + 1 < n) {
      const std::string p = "encoder.down_blocks." + std::to_string(i) + ".downsamplers.0.conv.";
      add(v, p + "weight", {ch[i], ch[i], 3, 3}, InitKind::kFanIn);
      add(v, p + "bias", {ch[i]}, InitKind::kBias);
    }
  }
  add_mid(v, "encoder.", ch[n - 1]);
  add(v, "encoder.conv_norm_out.weight", {ch[n - 1]}, InitKind::kNormGain);
  add(v, "encoder.conv_norm_out.bias", {ch[n - 1]}, InitKind::kBias);
  add(v, "encoder.conv_out.weight", {2 * lat, ch[n - 1], 3, 3}, InitKind::kFanIn);
  add(v, "encoder.conv_out.bias", {2 * lat}, InitKind::kBias);
  // Decoder (spec §8.3): up block i works at channel ch[n-1-i] with layers_per_block + 1 resnets.
  add(v, "decoder.conv_in.weight", {ch[n - 1], lat, 3, 3}, InitKind::kFanIn);
  add(v, "decoder.conv_in.bias", {ch[n - 1]}, InitKind::kBias);
  add_mid(v, "decoder.", ch[n - 1]);
  int64_t prev = ch[n - 1];
  for (int i = 0; i < n; ++i) {
    const int64_t co = ch[n - 1 - i];
    for (int j = 0; j < c.layers_per_block + 1; ++j) {
      add_resnet(v,
                 "decoder.up_blocks." + std::to_string(i) + ".resnets." + std::to_string(j) + ".",
                 j == 0 ? prev : co, co);
    }
    prev = co;
    if (i + 1 < n) {
      const std::string p = "decoder.up_blocks." + std::to_string(i) + ".upsamplers.0.conv.";
      add(v, p + "weight", {co, co, 3, 3}, InitKind::kFanIn);
      add(v, p + "bias", {co}, InitKind::kBias);
    }
  }
  add(v, "decoder.conv_norm_out.weight", {ch[0]}, InitKind::kNormGain);
  add(v, "decoder.conv_norm_out.bias", {ch[0]}, InitKind::kBias);
  add(v, "decoder.conv_out.weight", {c.out_channels, ch[0], 3, 3}, InitKind::kFanIn);
  add(v, "decoder.conv_out.bias", {c.out_channels}, InitKind::kBias);
  return v;
}

Status write_random_tensors(const std::string& dir, const std::string& stem,
                            const std::string& index_name, const std::vector<TensorSpec>& specs,
                            const RandomModelOptions& options,
                            const std::function<void(const std::string&)>& progress) {
  return write_component(fs::path(dir), stem, index_name, specs, options, progress);
}

bool is_outlier_channel(uint64_t seed, int64_t column, double fraction) {
  const uint64_t r = mix(mix(seed ^ 0x6f75746c69657273ull) + static_cast<uint64_t>(column));
  return static_cast<double>(r >> 11) * (1.0 / 9007199254740992.0) < fraction;  // 53-bit uniform
}

void random_tensor_values(const TensorSpec& spec, uint64_t seed, uint64_t offset, float* out,
                          size_t n) {
  const uint64_t base = mix(seed ^ name_hash(spec.name));
  float scale = 1.0f, bias = 0.0f;
  switch (spec.init) {
    case InitKind::kFanIn: {
      int64_t fan_in = 1;
      for (size_t i = 1; i < spec.shape.size(); ++i) fan_in *= spec.shape[i];
      scale = 1.0f / std::sqrt(static_cast<float>(std::max<int64_t>(1, fan_in)));
      break;
    }
    case InitKind::kNormGain:
      scale = 0.1f;
      bias = 1.0f;
      break;
    case InitKind::kBias:
      scale = 0.02f;
      break;
    case InitKind::kUnit:
      scale = 1.0f;
      break;
    case InitKind::kEmbed:
      scale = 0.05f;
      break;
  }
  constexpr double kTwoPi = 6.283185307179586;
  for (size_t i = 0; i < n; ++i) {
    // Box-Muller on two 32-bit uniforms of one 64-bit draw; u1 in (0, 1] avoids log(0).
    const uint64_t r = mix(base + offset + i);
    const double u1 = (static_cast<double>(r >> 32) + 1.0) * (1.0 / 4294967296.0);
    const double u2 = static_cast<double>(r & 0xffffffffu) * (1.0 / 4294967296.0);
    const double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(kTwoPi * u2);
    out[i] = bias + scale * static_cast<float>(z);
  }
}

Status write_random_model(const std::string& dir, const RandomModelOptions& o,
                          const std::function<void(const std::string&)>& progress) {
  const fs::path root(dir);
  std::error_code ec;
  if (fs::exists(root, ec) && !fs::is_empty(root, ec))
    return InvalidArgument("random model: " + dir + " exists and is not empty");
  fs::create_directories(root, ec);
  if (ec) return IoError("cannot create " + dir + ": " + ec.message());

  const json index = {{"_class_name", "ZImagePipeline"},
                      {"_diffusers_version", "0.36.0.dev0"},
                      {"scheduler", {"diffusers", "FlowMatchEulerDiscreteScheduler"}},
                      {"text_encoder", {"transformers", "Qwen3Model"}},
                      {"tokenizer", {"transformers", "Qwen2Tokenizer"}},
                      {"transformer", {"diffusers", "ZImageTransformer2DModel"}},
                      {"vae", {"diffusers", "AutoencoderKL"}}};
  ZI_TRY(write_text(root / "model_index.json", index.dump(2)));
  fs::create_directories(root / "scheduler", ec);
  const json sched = {{"_class_name", "FlowMatchEulerDiscreteScheduler"},
                      {"_diffusers_version", "0.36.0.dev0"},
                      {"num_train_timesteps", 1000},
                      {"shift", o.scheduler_shift},
                      {"use_dynamic_shifting", false}};
  ZI_TRY(write_text(root / "scheduler" / "scheduler_config.json", sched.dump(2)));

  fs::create_directories(root / "tokenizer", ec);
  if (ec) return IoError("cannot create " + (root / "tokenizer").string() + ": " + ec.message());
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja"}) {
    const fs::path src = fs::path(o.tokenizer_dir) / f;
    if (!fs::exists(src)) {
      if (std::string(f) == "chat_template.jinja") continue;
      return NotFound("random model: tokenizer file " + src.string() + " is missing");
    }
    fs::copy_file(src, root / "tokenizer" / f, fs::copy_options::overwrite_existing, ec);
    if (ec) return IoError("cannot copy " + src.string() + ": " + ec.message());
  }

  fs::create_directories(root / "transformer", ec);
  ZI_TRY(write_text(root / "transformer" / "config.json", dit_config_json(o.dit).dump(2)));
  std::vector<TensorSpec> dit_specs = dit_tensor_specs(o.dit);
  if (!(o.outlier_fraction >= 0.0 && o.outlier_fraction <= 1.0) || !std::isfinite(o.outlier_scale))
    return InvalidArgument("random model: outlier fraction must be in [0, 1], scale finite");
  for (TensorSpec& s : dit_specs) {
    const bool block = s.name.rfind("layers.", 0) == 0 || s.name.rfind("noise_refiner.", 0) == 0 ||
                       s.name.rfind("context_refiner.", 0) == 0;
    const bool linear = s.name.find(".attention.to_") != std::string::npos ||
                        s.name.find(".feed_forward.w") != std::string::npos;
    s.outlier_columns = block && linear && s.shape.size() == 2 && s.name.size() > 7 &&
                        s.name.compare(s.name.size() - 7, 7, ".weight") == 0;
  }
  ZI_TRY(write_component(root / "transformer", "diffusion_pytorch_model",
                         "diffusion_pytorch_model.safetensors.index.json", dit_specs, o, progress));
  fs::create_directories(root / "text_encoder", ec);
  ZI_TRY(write_text(root / "text_encoder" / "config.json", te_config_json(o.text_encoder).dump(2)));
  ZI_TRY(write_component(root / "text_encoder", "model", "model.safetensors.index.json",
                         qwen3_tensor_specs(o.text_encoder), o, progress));
  fs::create_directories(root / "vae", ec);
  ZI_TRY(write_text(root / "vae" / "config.json", vae_config_json(o.vae).dump(2)));
  ZI_TRY(write_component(root / "vae", "diffusion_pytorch_model",
                         "diffusion_pytorch_model.safetensors.index.json", vae_tensor_specs(o.vae),
                         o, progress));
  return Status::Ok();
}

}  // namespace zimage
