// See infer_config.h. Each inference reads a handful of characteristic tensors; the model loaders
// then check every other tensor against the config, so a shape this file does not look at still
// cannot slip through.
#include "io/model/infer_config.h"

#include <algorithm>
#include <set>
#include <vector>

#include "io/model/model_folder.h"

namespace zimage {
namespace {

std::string q(const std::string& s) {
  return "'" + s + "'";
}

// Reads tensor shapes with messages that name the file and what is being inferred.
class Reader {
 public:
  Reader(const TensorShapes& t, std::string file, std::string what)
      : t_(t), file_(std::move(file)), what_(std::move(what)) {}

  bool has(const std::string& n) const { return t_.count(n) != 0; }

  // The first of `names` present.
  const std::string* first_of(const std::vector<std::string>& names) const {
    for (const std::string& n : names)
      if (has(n)) return &n;
    return nullptr;
  }

  // Shape of the first of `names` present, of rank `rank`.
  Result<Shape> shape(const std::vector<std::string>& names, size_t rank) const {
    const std::string* n = first_of(names);
    if (!n) {
      std::string list;
      for (size_t i = 0; i < names.size(); ++i)
        list += (i ? (i + 1 == names.size() ? " or " : ", ") : "") + q(names[i]);
      return error("tensor " + list + " is missing");
    }
    const Shape& s = t_.at(*n);
    if (s.size() != rank) {
      return error("tensor " + q(*n) + " has shape " + shape_string(s) + ", expected " +
                   std::to_string(rank) + " dimensions");
    }
    for (int64_t d : s)
      if (d <= 0) return error("tensor " + q(*n) + " has an empty shape " + shape_string(s));
    return s;
  }

  // Number of blocks `prefix<i>.` (i = 0..n-1); a gap is an error naming the missing index.
  Result<int> count_blocks(const std::string& prefix) const {
    std::set<int64_t> idx;
    for (auto it = t_.lower_bound(prefix); it != t_.end(); ++it) {
      const std::string& n = it->first;
      if (n.compare(0, prefix.size(), prefix) != 0) break;
      size_t p = prefix.size();
      int64_t v = 0;
      bool digits = false;
      while (p < n.size() && n[p] >= '0' && n[p] <= '9' && v < (1 << 20)) {
        v = v * 10 + (n[p++] - '0');
        digits = true;
      }
      if (digits && p < n.size() && n[p] == '.') idx.insert(v);
    }
    if (idx.empty()) return 0;
    const int64_t n = *idx.rbegin() + 1;
    if (static_cast<int64_t>(idx.size()) != n) {
      for (int64_t i = 0; i < n; ++i) {
        if (!idx.count(i)) {
          return error("blocks " + q(prefix + "<i>") + " run to index " + std::to_string(n - 1) +
                       " but block " + std::to_string(i) + " is missing");
        }
      }
    }
    return static_cast<int>(n);
  }

  Status error(const std::string& m) const {
    return FormatError(file_ + ": cannot infer the " + what_ + " config: " + m);
  }

 private:
  const TensorShapes& t_;
  std::string file_;
  std::string what_;
};

// Published Z-Image-Turbo RoPE split for head_dim 128; the same proportions for other sizes.
Result<std::vector<int>> axes_dims_for(int head_dim, const Reader& r) {
  if (head_dim == 128) return std::vector<int>{32, 48, 48};
  if (head_dim > 0 && head_dim % 16 == 0)
    return std::vector<int>{head_dim / 4, head_dim * 3 / 8, head_dim * 3 / 8};
  return r.error("head_dim " + std::to_string(head_dim) +
                 " has no published RoPE split (axes_dims; 128 -> [32, 48, 48]); give a model "
                 "folder whose transformer/config.json sets it");
}

}  // namespace

TensorShapes tensor_shapes(const WeightStore& ws) {
  TensorShapes out;
  for (const std::string& n : ws.names()) {
    auto info = ws.info(n);
    if (info.ok()) out.emplace(n, info->shape);
  }
  return out;
}

Result<TransformerConfig> infer_transformer_config(const TensorShapes& t, const std::string& file) {
  const Reader r(t, file, "transformer");
  TransformerConfig c = zimage_turbo_reference_configs().transformer;
  // Patch sizes: from a diffusers name all_x_embedder.<p>-<f>.weight, else ComfyUI's 2 and 1.
  std::string xe = "x_embedder.", fl = "final_layer.";
  std::vector<std::string> keyed;
  for (auto it = t.lower_bound("all_x_embedder."); it != t.end(); ++it) {
    if (it->first.rfind("all_x_embedder.", 0) != 0) break;
    const std::string rest = it->first.substr(15);
    const size_t dot = rest.find('.');
    const std::string key = rest.substr(0, dot);
    if (std::find(keyed.begin(), keyed.end(), key) == keyed.end()) keyed.push_back(key);
  }
  if (keyed.size() > 1)
    return Unsupported(file + ": several patch sizes (all_x_embedder." + keyed[0] + ", ." +
                       keyed[1] + "); one is supported");
  if (keyed.size() == 1) {
    const std::string& k = keyed[0];
    const size_t dash = k.find('-');
    int p = 0, f = 0;
    bool ok = dash != std::string::npos && dash > 0 && dash + 1 < k.size() && dash < 4 &&
              k.size() - dash - 1 < 4;
    for (size_t i = 0; ok && i < k.size(); ++i) {
      if (i == dash) continue;
      ok = k[i] >= '0' && k[i] <= '9';
      if (ok) (i < dash ? p : f) = (i < dash ? p : f) * 10 + (k[i] - '0');
    }
    if (!ok || p < 1 || f < 1)
      return r.error("cannot read the patch sizes from 'all_x_embedder." + k + "'");
    c.patch_size = p;
    c.f_patch_size = f;
    xe = "all_x_embedder." + k + ".";
    fl = "all_final_layer." + k + ".";
  } else if (!r.has("x_embedder.weight") && !r.has("cap_embedder.1.weight")) {
    return r.error(
        "no Z-Image transformer tensors (neither x_embedder.weight nor cap_embedder.1.weight)");
  } else {
    c.patch_size = 2;
    c.f_patch_size = 1;
  }
  ZI_ASSIGN_OR_RETURN(Shape xw, r.shape({xe + "weight"}, 2));  // [D, p*p*f*C]
  c.dim = static_cast<int>(xw[0]);
  const int64_t per_token = static_cast<int64_t>(c.patch_size) * c.patch_size * c.f_patch_size;
  if (xw[1] % per_token != 0)
    return r.error(
        q(xe + "weight") + " input width " + std::to_string(xw[1]) +
        " is not a multiple of patch_size^2 x f_patch_size = " + std::to_string(per_token));
  c.in_channels = static_cast<int>(xw[1] / per_token);
  ZI_ASSIGN_OR_RETURN(Shape fw, r.shape({fl + "linear.weight"}, 2));
  if (fw != Shape{xw[1], xw[0]})
    return r.error(q(fl + "linear.weight") + " has shape " + shape_string(fw) + ", expected " +
                   shape_string({xw[1], xw[0]}) + " from " + q(xe + "weight"));
  ZI_ASSIGN_OR_RETURN(Shape cw, r.shape({"cap_embedder.1.weight"}, 2));  // [D, Fc]
  if (cw[0] != c.dim)
    return r.error("'cap_embedder.1.weight' has " + std::to_string(cw[0]) +
                   " rows but the model width (x_embedder rows) is " + std::to_string(c.dim));
  c.cap_feat_dim = static_cast<int>(cw[1]);

  ZI_ASSIGN_OR_RETURN(c.n_layers, r.count_blocks("layers."));
  ZI_ASSIGN_OR_RETURN(c.n_refiner_layers, r.count_blocks("noise_refiner."));
  ZI_ASSIGN_OR_RETURN(int ctx, r.count_blocks("context_refiner."));
  if (ctx != c.n_refiner_layers)
    return r.error(std::to_string(c.n_refiner_layers) + " noise_refiner block(s) but " +
                   std::to_string(ctx) + " context_refiner block(s)");
  if (c.n_layers == 0) return r.error("no 'layers.<i>.' blocks");

  const std::string b = "layers.0.";
  ZI_ASSIGN_OR_RETURN(Shape qn,
                      r.shape({b + "attention.q_norm.weight", b + "attention.norm_q.weight"}, 1));
  const int head_dim = static_cast<int>(qn[0]);
  if (c.dim % head_dim != 0)
    return r.error("the q_norm width (head_dim) " + std::to_string(head_dim) +
                   " does not divide the model width " + std::to_string(c.dim));
  c.n_heads = c.dim / head_dim;
  c.n_kv_heads = c.n_heads;
  c.qk_norm = true;
  ZI_ASSIGN_OR_RETURN(c.axes_dims, axes_dims_for(head_dim, r));

  ZI_ASSIGN_OR_RETURN(Shape w1, r.shape({b + "feed_forward.w1.weight"}, 2));
  if (w1 != Shape{c.ffn_hidden(), c.dim})
    return r.error(q(b + "feed_forward.w1.weight") + " has shape " + shape_string(w1) +
                   ", but a Z-Image block of width " + std::to_string(c.dim) + " has " +
                   shape_string({c.ffn_hidden(), c.dim}) + " (int(dim / 3 * 8) rows)");
  ZI_ASSIGN_OR_RETURN(Shape ada, r.shape({b + "adaLN_modulation.0.weight"}, 2));
  if (ada != Shape{4LL * c.dim, c.adaln_dim()})
    return r.error(q(b + "adaLN_modulation.0.weight") + " has shape " + shape_string(ada) +
                   ", expected " + shape_string({4LL * c.dim, c.adaln_dim()}) +
                   " (adaLN width min(dim, 256))");
  ZI_TRY(validate_transformer_config(c, file));
  return c;
}

Result<TextEncoderConfig> infer_text_encoder_config(const TensorShapes& t,
                                                    const std::string& file) {
  const Reader r(t, file, "text encoder");
  TextEncoderConfig c = zimage_turbo_reference_configs().text_encoder;
  const std::string pre = r.has("model.embed_tokens.weight") ? "model." : "";
  if (!r.has(pre + "embed_tokens.weight"))
    return r.error(
        "no Qwen3 tensors (neither 'model.embed_tokens.weight' nor "
        "'embed_tokens.weight')");
  ZI_ASSIGN_OR_RETURN(Shape emb, r.shape({pre + "embed_tokens.weight"}, 2));  // [V, H]
  c.vocab_size = static_cast<int>(emb[0]);
  c.hidden_size = static_cast<int>(emb[1]);
  ZI_ASSIGN_OR_RETURN(c.num_hidden_layers, r.count_blocks(pre + "layers."));
  if (c.num_hidden_layers < 2)
    return r.error(std::to_string(c.num_hidden_layers) +
                   " decoder layer(s); Z-Image takes the output of the second-to-last layer, so "
                   "at least 2 are needed");
  const std::string b = pre + "layers.0.";
  ZI_ASSIGN_OR_RETURN(Shape qn, r.shape({b + "self_attn.q_norm.weight"}, 1));
  c.head_dim = static_cast<int>(qn[0]);
  ZI_ASSIGN_OR_RETURN(Shape qp, r.shape({b + "self_attn.q_proj.weight"}, 2));
  ZI_ASSIGN_OR_RETURN(Shape kp, r.shape({b + "self_attn.k_proj.weight"}, 2));
  for (const auto& [name, s] : {std::pair{"q_proj", qp}, std::pair{"k_proj", kp}}) {
    if (s[1] != c.hidden_size || s[0] % c.head_dim != 0)
      return r.error("'" + b + "self_attn." + name + ".weight' has shape " + shape_string(s) +
                     ": expected [heads x head_dim " + std::to_string(c.head_dim) + ", hidden " +
                     std::to_string(c.hidden_size) + "]");
  }
  c.num_attention_heads = static_cast<int>(qp[0] / c.head_dim);
  c.num_key_value_heads = static_cast<int>(kp[0] / c.head_dim);
  ZI_ASSIGN_OR_RETURN(Shape gp, r.shape({b + "mlp.gate_proj.weight"}, 2));
  if (gp[1] != c.hidden_size)
    return r.error("'" + b + "mlp.gate_proj.weight' has shape " + shape_string(gp) +
                   ", expected [intermediate, " + std::to_string(c.hidden_size) + "]");
  c.intermediate_size = static_cast<int>(gp[0]);
  if (r.has(b + "self_attn.q_proj.bias"))
    return Unsupported(file + ": the text encoder has attention biases ('" + b +
                       "self_attn.q_proj.bias'); Qwen3 has none");
  ZI_TRY(validate_text_encoder_config(c, file));
  return c;
}

Result<VaeConfig> infer_vae_config(const TensorShapes& t, const std::string& file) {
  const Reader r(t, file, "VAE");
  VaeConfig c = zimage_turbo_reference_configs().vae;
  if (!r.has("decoder.conv_in.weight"))
    return r.error("no VAE decoder tensors ('decoder.conv_in.weight' is missing)");
  const bool ldm = r.has("decoder.mid.block_1.conv1.weight");
  ZI_ASSIGN_OR_RETURN(Shape ci, r.shape({"decoder.conv_in.weight"}, 4));  // [top, lat, 3, 3]
  c.latent_channels = static_cast<int>(ci[1]);
  ZI_ASSIGN_OR_RETURN(int n, r.count_blocks(ldm ? "decoder.up." : "decoder.up_blocks."));
  if (n < 1) return r.error("no decoder up blocks");
  c.block_out_channels.assign(n, 0);
  // Level i (0 = full resolution): LDM up.<i>, diffusers up_blocks.<n-1-i>.
  auto block = [&](int level) {
    return ldm ? "decoder.up." + std::to_string(level) + ".block."
               : "decoder.up_blocks." + std::to_string(n - 1 - level) + ".resnets.";
  };
  for (int i = 0; i < n; ++i) {
    ZI_ASSIGN_OR_RETURN(Shape w, r.shape({block(i) + "0.conv1.weight"}, 4));
    c.block_out_channels[i] = static_cast<int>(w[0]);
  }
  ZI_ASSIGN_OR_RETURN(int resnets, r.count_blocks(block(0)));
  if (resnets < 2)
    return r.error("decoder level 0 has " + std::to_string(resnets) +
                   " resnet(s); a decoder block has layers_per_block + 1 >= 2");
  c.layers_per_block = resnets - 1;
  if (ci[0] != c.block_out_channels[n - 1])
    return r.error("'decoder.conv_in.weight' has " + std::to_string(ci[0]) +
                   " output channels but the deepest decoder level has " +
                   std::to_string(c.block_out_channels[n - 1]));
  ZI_ASSIGN_OR_RETURN(Shape co, r.shape({"decoder.conv_out.weight"}, 4));
  c.out_channels = static_cast<int>(co[0]);
  if (r.has("encoder.conv_in.weight")) {
    ZI_ASSIGN_OR_RETURN(Shape ei, r.shape({"encoder.conv_in.weight"}, 4));
    c.in_channels = static_cast<int>(ei[1]);
  } else {
    c.in_channels = c.out_channels;
  }
  c.mid_block_add_attention =
      r.has(ldm ? "decoder.mid.attn_1.q.weight" : "decoder.mid_block.attentions.0.to_q.weight");
  c.use_post_quant_conv = r.has("post_quant_conv.weight");
  c.use_quant_conv = r.has("quant_conv.weight");
  ZI_TRY(validate_vae_config(c, file));
  return c;
}

SchedulerConfig published_scheduler_config() {
  return zimage_turbo_reference_configs().scheduler;
}

bool same_shapes(const TransformerConfig& a, const TransformerConfig& b) {
  return a.patch_size == b.patch_size && a.f_patch_size == b.f_patch_size &&
         a.in_channels == b.in_channels && a.dim == b.dim && a.n_layers == b.n_layers &&
         a.n_refiner_layers == b.n_refiner_layers && a.n_heads == b.n_heads &&
         a.qk_norm == b.qk_norm && a.cap_feat_dim == b.cap_feat_dim;
}

bool same_shapes(const TextEncoderConfig& a, const TextEncoderConfig& b) {
  return a.hidden_size == b.hidden_size && a.intermediate_size == b.intermediate_size &&
         a.num_hidden_layers == b.num_hidden_layers &&
         a.num_attention_heads == b.num_attention_heads &&
         a.num_key_value_heads == b.num_key_value_heads && a.head_dim == b.head_dim &&
         a.vocab_size == b.vocab_size && a.attention_bias == b.attention_bias;
}

bool same_shapes(const VaeConfig& a, const VaeConfig& b) {
  return a.in_channels == b.in_channels && a.out_channels == b.out_channels &&
         a.latent_channels == b.latent_channels && a.block_out_channels == b.block_out_channels &&
         a.layers_per_block == b.layers_per_block && a.use_quant_conv == b.use_quant_conv &&
         a.use_post_quant_conv == b.use_post_quant_conv &&
         a.mid_block_add_attention == b.mid_block_add_attention;
}

}  // namespace zimage
