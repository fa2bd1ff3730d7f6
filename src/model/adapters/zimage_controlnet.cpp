// ZImageControlNet: config (folder or inferred from a single file), weights and forward; read it
// next to diffusers' controlnet_z_image.py (see zimage_controlnet.h for the data flow).
#include "model/adapters/zimage_controlnet.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <new>

#include "io/fs/json_util.h"
#include "model/common/load_util.h"

namespace zimage {

namespace {

Result<std::vector<int>> int_list(const nlohmann::json& v, const std::string& key,
                                  const std::string& path) {
  std::vector<int> out;
  if (v.is_null()) return out;
  if (!v.is_array())
    return FormatError(path + ": \"" + key + "\" must be a list of integers or null");
  for (const auto& e : v) {
    if (!e.is_number_integer() || e.get<int64_t>() < 0 || e.get<int64_t>() > 100000)
      return FormatError(path + ": \"" + key + "\" must hold non-negative integers");
    out.push_back(e.get<int>());
  }
  return out;
}

}  // namespace

// One control block: the DiT block's weights plus the control projections.
struct ZImageControlNet::ControlBlock {
  ZImageDiT::Block blk;
  Tensor before_w, before_b;  // block 0 of a chain only: [D, D], [D]
  Tensor after_w, after_b;    // [D, D], [D]; undefined for 1.0's plain refiner blocks
};

ZImageControlNet::ZImageControlNet(const ControlNetConfig& cfg, ZImageDiT& dit, Backend& be,
                                   std::string path)
    : cfg_(cfg), dit_(dit), be_(be), path_(std::move(path)) {}

ZImageControlNet::~ZImageControlNet() = default;

Result<ControlNetConfig> parse_controlnet_config(const std::string& text, const std::string& path) {
  ZI_ASSIGN_OR_RETURN(nlohmann::json j, json_util::parse_strict(text, path));
  if (!j.is_object()) return FormatError(path + ": not a JSON object");
  ControlNetConfig c;
  auto get_int = [&](const char* k, int& dst) -> Status {
    if (!j.contains(k)) return Status::Ok();
    if (!j[k].is_number_integer() || j[k].get<int64_t>() < 1 || j[k].get<int64_t>() > 1000000)
      return FormatError(path + ": \"" + k + "\" must be a positive integer");
    dst = j[k].get<int>();
    return Status::Ok();
  };
  if (j.contains("control_layers_places")) {
    ZI_ASSIGN_OR_RETURN(c.control_layers_places,
                        int_list(j["control_layers_places"], "control_layers_places", path));
  }
  if (j.contains("control_refiner_layers_places")) {
    ZI_ASSIGN_OR_RETURN(
        c.control_refiner_layers_places,
        int_list(j["control_refiner_layers_places"], "control_refiner_layers_places", path));
  }
  ZI_TRY(get_int("control_in_dim", c.control_in_dim));
  ZI_TRY(get_int("dim", c.dim));
  ZI_TRY(get_int("n_refiner_layers", c.n_refiner_layers));
  ZI_TRY(get_int("n_heads", c.n_heads));
  for (const char* k : {"all_patch_size", "all_f_patch_size"}) {
    if (!j.contains(k)) continue;
    ZI_ASSIGN_OR_RETURN(std::vector<int> v, int_list(j[k], k, path));
    if (v.size() != 1) return Unsupported(path + ": \"" + k + "\" must hold exactly one size");
    (std::string(k) == "all_patch_size" ? c.patch_size : c.f_patch_size) = v[0];
  }
  if (j.contains("norm_eps")) {
    if (!j["norm_eps"].is_number() || !(j["norm_eps"].get<double>() > 0))
      return FormatError(path + ": \"norm_eps\" must be a positive number");
    c.norm_eps = j["norm_eps"].get<float>();
  }
  if (j.contains("qk_norm")) {
    if (!j["qk_norm"].is_boolean()) return FormatError(path + ": \"qk_norm\" must be a boolean");
    c.qk_norm = j["qk_norm"].get<bool>();
  }
  if (j.contains("add_control_noise_refiner") && !j["add_control_noise_refiner"].is_null()) {
    const auto& v = j["add_control_noise_refiner"];
    const std::string s = v.is_string() ? v.get<std::string>() : "";
    if (s == "control_layers") {
      c.refiner = ControlNetConfig::Refiner::kControlLayers;
    } else if (s == "control_noise_refiner") {
      c.refiner = ControlNetConfig::Refiner::kControlNoiseRefiner;
    } else {
      return FormatError(path +
                         ": \"add_control_noise_refiner\" must be null, \"control_layers\" or "
                         "\"control_noise_refiner\"");
    }
  }
  return c;
}

Result<ControlNetConfig> infer_controlnet_config(const WeightStore& ws, int dit_layers,
                                                 std::vector<std::string>* unused) {
  const std::string file = ws.files().empty() ? std::string("ControlNet") : ws.files().front();
  const std::string emb = "control_all_x_embedder.2-1.weight";
  ControlNetConfig c;
  if (!ws.contains(emb))
    return FormatError(file + ": not a Z-Image ControlNet (no " + emb +
                       "; expected the Fun-Controlnet-Union keys control_layers.<i>.*, "
                       "control_all_x_embedder.2-1.*)");
  ZI_ASSIGN_OR_RETURN(WeightInfo ei, ws.info(emb));
  if (ei.shape.size() != 2 || ei.shape[1] % 4 != 0)
    return FormatError(file + ": " + emb + " must be [dim, 4 * control_in_dim], got " +
                       shape_string(ei.shape));
  c.dim = static_cast<int>(ei.shape[0]);
  c.control_in_dim = static_cast<int>(ei.shape[1] / 4);
  auto count = [&](const std::string& prefix) {
    int n = 0;
    while (ws.contains(prefix + std::to_string(n) + ".attention_norm1.weight")) ++n;
    return n;
  };
  const int n_layers = count("control_layers.");
  const int n_refiner = count("control_noise_refiner.");
  if (n_layers < 1) return FormatError(file + ": no control_layers.0.* tensors");
  // before_proj of the first control refiner block: present and not all zero = 2.1.
  bool refiner_proj = false;
  const std::string bp = "control_noise_refiner.0.before_proj.weight";
  if (ws.contains(bp)) {
    ZI_ASSIGN_OR_RETURN(WeightInfo bi, ws.info(bp));
    ZI_ASSIGN_OR_RETURN(Tensor w, load::host_f32(ws, bp, bi.shape));
    const float* p = w.data_as<float>();
    refiner_proj = std::any_of(p, p + w.numel(), [](float v) { return v != 0.0f; });
  }
  const bool v2 = ws.contains("control_layers.14.adaLN_modulation.0.weight");
  if (v2 && !refiner_proj) {
    c.version = "2.0";
    c.refiner = ControlNetConfig::Refiner::kControlLayers;
    if (unused != nullptr)
      for (const std::string& n : ws.names())
        if (n.rfind("control_noise_refiner.", 0) == 0) unused->push_back(n);
  } else if (refiner_proj && c.control_in_dim != 16) {
    c.version = v2 ? "2.1" : "2.1-lite";
    c.refiner = ControlNetConfig::Refiner::kControlNoiseRefiner;
  } else {
    c.version = "1.0";
    c.refiner = ControlNetConfig::Refiner::kNone;
  }
  c.n_refiner_layers = n_refiner > 0 ? n_refiner : 2;
  if (c.refiner != ControlNetConfig::Refiner::kNone) {  // [0, 1], or [0] for one refiner block
    const int places = c.refiner == ControlNetConfig::Refiner::kControlNoiseRefiner
                           ? std::min(2, c.n_refiner_layers)
                           : 2;
    for (int r = 0; r < places; ++r) c.control_refiner_layers_places.push_back(r);
  }
  // Places: evenly over the DiT's layers (6 of 30 -> every 5th, 15 -> every 2nd, 3 -> every
  // 10th); a count that does not divide the DiT's depth takes the published 30-layer spacing
  // (the load then names the places the transformer lacks).
  const int span = dit_layers % n_layers == 0 ? dit_layers / n_layers
                   : 30 % n_layers == 0       ? 30 / n_layers
                                              : 0;
  if (span == 0)
    return FormatError(file + ": " + std::to_string(n_layers) +
                       " control layers cannot be spread evenly over the transformer's " +
                       std::to_string(dit_layers) + " layers; use a diffusers folder with a " +
                       "config.json naming control_layers_places");
  for (int k = 0; k < n_layers; ++k) c.control_layers_places.push_back(k * span);
  ZI_ASSIGN_OR_RETURN(WeightInfo ni, ws.info("control_layers.0.attention.norm_q.weight"));
  if (ni.shape.size() != 1 || ni.shape[0] < 1 || c.dim % ni.shape[0] != 0)
    return FormatError(file + ": control_layers.0.attention.norm_q.weight has shape " +
                       shape_string(ni.shape));
  c.n_heads = static_cast<int>(c.dim / ni.shape[0]);
  return c;
}

namespace {

// A ControlNet folder's config.json, read and parsed as load() reads it.
Result<ControlNetConfig> read_folder_config(const std::string& path) {
  const std::string cj = (std::filesystem::path(path) / "config.json").string();
  auto text = json_util::read_file(cj);
  if (!text.ok()) return text.status().with_context("--controlnet " + path);
  return parse_controlnet_config(text->dump(), cj);
}

}  // namespace

Status check_controlnet_files(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(path, ec)) return NotFound("--controlnet " + path + ": no such file or folder");
  try {
    if (fs::is_directory(path, ec)) {
      ZI_TRY(read_folder_config(path).status());
      return WeightStore::open(path).status();
    }
    ZI_ASSIGN_OR_RETURN(WeightStore ws, WeightStore::open(path));
    auto cfg = infer_controlnet_config(ws, 30, nullptr);
    if (!cfg.ok()) return cfg.status().with_context("--controlnet " + path);
    return Status::Ok();
  } catch (const std::bad_alloc&) {
    return OutOfMemory("--controlnet " + path);
  }
}

Result<std::unique_ptr<ZImageControlNet>> ZImageControlNet::load(const std::string& path,
                                                                 ZImageDiT& dit, Backend& be) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(path, ec)) return NotFound("--controlnet " + path + ": no such file or folder");
  try {
    if (fs::is_directory(path, ec)) {
      ControlNetConfig cfg;
      { ZI_ASSIGN_OR_RETURN(cfg, read_folder_config(path)); }
      ZI_ASSIGN_OR_RETURN(WeightStore ws, WeightStore::open(path));
      return load(cfg, ws, dit, be, path);
    }
    ZI_ASSIGN_OR_RETURN(WeightStore ws, WeightStore::open(path));
    std::vector<std::string> unused;
    auto cfg = infer_controlnet_config(ws, dit.config().n_layers, &unused);
    if (!cfg.ok()) return cfg.status().with_context("--controlnet " + path);
    for (const std::string& n : unused) (void)ws.get(n);  // 2.0's unused refiner: dropped
    const TransformerConfig& t = dit.config();
    cfg->n_heads = cfg->n_heads > 0 ? cfg->n_heads : t.n_heads;
    cfg->norm_eps = t.norm_eps;
    cfg->qk_norm = t.qk_norm;
    return load(*cfg, ws, dit, be, path);
  } catch (const std::bad_alloc&) {
    return OutOfMemory("--controlnet " + path);
  }
}

Result<std::unique_ptr<ZImageControlNet>> ZImageControlNet::load(const ControlNetConfig& cfg,
                                                                 const WeightStore& ws,
                                                                 ZImageDiT& dit, Backend& be,
                                                                 const std::string& path) {
  const TransformerConfig& t = dit.config();
  auto mismatch = [&](const std::string& what) {
    return InvalidArgument("--controlnet " + path + " does not match the transformer: " + what);
  };
  if (cfg.dim != t.dim)
    return mismatch("dim " + std::to_string(cfg.dim) + " vs " + std::to_string(t.dim));
  if (cfg.n_heads != t.n_heads)
    return mismatch("n_heads " + std::to_string(cfg.n_heads) + " vs " + std::to_string(t.n_heads));
  if (cfg.patch_size != t.patch_size || cfg.f_patch_size != t.f_patch_size)
    return mismatch("patch size " + std::to_string(cfg.patch_size) + "-" +
                    std::to_string(cfg.f_patch_size) + " vs " + std::to_string(t.patch_size) + "-" +
                    std::to_string(t.f_patch_size));
  if (cfg.qk_norm != t.qk_norm) return mismatch("qk_norm differs");
  if (cfg.control_in_dim < t.in_channels)
    return mismatch("control_in_dim " + std::to_string(cfg.control_in_dim) + " < in_channels " +
                    std::to_string(t.in_channels));
  const auto& places = cfg.control_layers_places;
  if (places.empty() || places[0] != 0)
    return mismatch("control_layers_places must start with layer 0");
  for (size_t k = 0; k < places.size(); ++k) {
    if (places[k] >= t.n_layers || (k > 0 && places[k] <= places[k - 1]))
      return mismatch("control_layers_places must increase and stay below n_layers " +
                      std::to_string(t.n_layers) + " (place " + std::to_string(places[k]) + ")");
  }
  if (cfg.refiner != ControlNetConfig::Refiner::kNone) {
    const size_t hints = cfg.refiner == ControlNetConfig::Refiner::kControlLayers
                             ? places.size()
                             : static_cast<size_t>(cfg.n_refiner_layers);
    if (cfg.control_refiner_layers_places.size() > hints)
      return mismatch("more control_refiner_layers_places than refiner hints");
    for (int r : cfg.control_refiner_layers_places)
      if (r >= t.n_refiner_layers)
        return mismatch("control refiner place " + std::to_string(r) + " beyond the " +
                        std::to_string(t.n_refiner_layers) + " noise refiner layers");
  }
  std::unique_ptr<ZImageControlNet> m(new ZImageControlNet(cfg, dit, be, path));
  Status st = m->load_weights(ws);
  if (st.ok())
    st = load::check_all_used(ws, "controlnet", [](const std::string&) { return false; });
  if (!st.ok()) return st.with_context("loading --controlnet " + path);
  return m;
}

Status ZImageControlNet::load_weights(const WeightStore& ws) {
  const int64_t d = cfg_.dim;
  const int64_t tf =
      int64_t{cfg_.patch_size} * cfg_.patch_size * cfg_.f_patch_size * cfg_.control_in_dim;
  const std::string key = std::to_string(cfg_.patch_size) + "-" + std::to_string(cfg_.f_patch_size);
  ZI_ASSIGN_OR_RETURN(cx_w_,
                      load::weight(ws, be_, "control_all_x_embedder." + key + ".weight", {d, tf}));
  ZI_ASSIGN_OR_RETURN(cx_b_, load::weight(ws, be_, "control_all_x_embedder." + key + ".bias", {d}));
  auto load_chain = [&](const std::string& prefix, int n, bool control,
                        std::vector<ControlBlock>& out) -> Status {
    for (int i = 0; i < n; ++i) {
      const std::string p = prefix + std::to_string(i) + ".";
      ControlBlock cb;
      ZI_TRY(dit_.load_block(ws, p, true, /*index=*/-1, cb.blk));  // resident
      ZI_TRY(dit_.block_ffn_weight(cb.blk));  // its feed-forward fused where the backend can
      if (control) {
        if (i == 0) {
          ZI_ASSIGN_OR_RETURN(cb.before_w, load::weight(ws, be_, p + "before_proj.weight", {d, d}));
          ZI_ASSIGN_OR_RETURN(cb.before_b, load::weight(ws, be_, p + "before_proj.bias", {d}));
        }
        ZI_ASSIGN_OR_RETURN(cb.after_w, load::weight(ws, be_, p + "after_proj.weight", {d, d}));
        ZI_ASSIGN_OR_RETURN(cb.after_b, load::weight(ws, be_, p + "after_proj.bias", {d}));
      }
      out.push_back(std::move(cb));
    }
    return Status::Ok();
  };
  ZI_TRY(load_chain("control_layers.", static_cast<int>(cfg_.control_layers_places.size()), true,
                    layers_));
  if (cfg_.refiner == ControlNetConfig::Refiner::kNone) {
    ZI_TRY(load_chain("control_noise_refiner.", cfg_.n_refiner_layers, false, refiner_));
  } else if (cfg_.refiner == ControlNetConfig::Refiner::kControlNoiseRefiner) {
    ZI_TRY(load_chain("control_noise_refiner.", cfg_.n_refiner_layers, true, refiner_));
  }
  return Status::Ok();
}

Status ZImageControlNet::run_control(const std::vector<ControlBlock>& blocks, Tensor& cc,
                                     const Tensor& x, const Tensor& freqs, const Tensor& c,
                                     const AttentionParams& ap, std::vector<Tensor>& hints) {
  const int64_t b = cc.dim(0), s = cc.dim(1), d = cfg_.dim;
  ZI_ASSIGN_OR_RETURN(auto scratch, dit_.make_scratch(b, s));
  for (const ControlBlock& cb : blocks) {
    if (cb.before_w.defined()) {  // c = before_proj(c) + x
      ZI_ASSIGN_OR_RETURN(Tensor pre, load::alloc(be_, be_.act_dtype(), {b * s, d}, "cn.before"));
      ZI_TRY(be_.matmul(cc.view({b * s, d}), cb.before_w, cb.before_b, pre));
      ZI_TRY(be_.add(pre.view({b, s, d}), x, cc));
    }
    ZI_TRY(dit_.run_block(cb.blk, cc, freqs, c, ap, *scratch));
    if (cb.after_w.defined()) {  // hint = after_proj(c)
      ZI_ASSIGN_OR_RETURN(Tensor h, load::alloc(be_, be_.act_dtype(), {b, s, d}, "cn.hint"));
      Tensor rows = h.view({b * s, d});
      ZI_TRY(be_.matmul(cc.view({b * s, d}), cb.after_w, cb.after_b, rows));
      hints.push_back(h);
    }
  }
  return Status::Ok();
}

Status ZImageControlNet::forward(const Tensor& latents, const std::vector<float>& t_model,
                                 const std::vector<Tensor>& caps, const Tensor& control,
                                 float scale, ControlResiduals& out, DebugSink* dbg,
                                 const std::string& pfx,
                                 const ZImageDiT::RefinedCaptions* refined) {
  const TransformerConfig& tc = dit_.config();
  const int64_t p = tc.patch_size, d = tc.dim, ch = tc.in_channels;
  if (dit_.streamer_)
    return Unsupported(
        "ControlNet with the transformer's weights streamed (--vram-budget below "
        "the resident need) is not supported yet");
  if (!std::isfinite(scale))
    return InvalidArgument("--control-scale must be a finite number, got " + std::to_string(scale));
  if (!latents.defined() || latents.rank() != 4 || latents.dtype() != DType::kF32 ||
      latents.dim(1) != ch || latents.dim(2) % p != 0 || latents.dim(3) % p != 0 ||
      latents.dim(0) < 1 || latents.dim(2) < p || latents.dim(3) < p)
    return InvalidArgument("controlnet: latents must be f32 [B, " + std::to_string(ch) +
                           ", h, w], got " +
                           (latents.defined() ? latents.describe() : std::string("undefined")));
  const int64_t b = latents.dim(0), lh = latents.dim(2), lw = latents.dim(3);
  const Shape cshape{b, cfg_.control_in_dim, lh, lw};
  if (!control.defined() || control.shape() != cshape || control.dtype() != DType::kF32)
    return InvalidArgument("controlnet: control context must be f32 " + shape_string(cshape) +
                           ", got " +
                           (control.defined() ? control.describe() : std::string("undefined")));
  if (static_cast<int64_t>(t_model.size()) != b || static_cast<int64_t>(caps.size()) != b)
    return InvalidArgument("controlnet: batch " + std::to_string(b) + " but " +
                           std::to_string(t_model.size()) + " timesteps and " +
                           std::to_string(caps.size()) + " captions");
  std::vector<int64_t> cap_len(b);
  for (int64_t i = 0; i < b; ++i) {
    if (!caps[i].defined() || caps[i].rank() != 2 || caps[i].dim(1) != tc.cap_feat_dim)
      return InvalidArgument("controlnet: caption " + std::to_string(i) + " has the wrong shape");
    cap_len[i] = caps[i].dim(0);
  }
  if (refined != nullptr) {
    ZI_TRY(dit_.check_refined(*refined, b));
    if (refined->cap_len != cap_len)
      return InvalidArgument("controlnet: refined captions of other caption lengths");
  }
  const DType act = be_.act_dtype();
  const Tensor none;
  ZI_ASSIGN_OR_RETURN(ZImageDiT::Layout L, dit_.make_layout(b, lh, lw, cap_len));
  const int64_t n_img = L.n_img, np = L.np, lp_max = L.lp_max, s_max = L.s_max;
  const float attn_scale = 1.0f / std::sqrt(static_cast<float>(tc.head_dim()));

  // ---- timestep conditioning (the DiT's t_embedder) ----
  Tensor sin_host = dit_.timestep_sinusoid(t_model);
  if (!sin_host.defined()) return OutOfMemory("controlnet: timestep sinusoid");
  ZI_ASSIGN_OR_RETURN(Tensor sinusoid, load::upload_host(be_, sin_host, act));
  Tensor c;
  ZI_TRY(dit_.timestep_embedding(sinusoid, c));  // [B, adaln]

  // ---- image tokens and control tokens, pads = x_pad_token for both ----
  auto embed = [&](const Tensor& src, int64_t feat, const Tensor& w, const Tensor& bias,
                   const char* what) -> Result<Tensor> {
    ZI_ASSIGN_OR_RETURN(Tensor tokens, load::alloc(be_, act, {b, n_img, feat}, what));
    ZI_TRY(be_.patchify(src, static_cast<int>(p), tokens));  // [B, N, p*p*C]
    ZI_ASSIGN_OR_RETURN(Tensor e, load::alloc(be_, act, {b * n_img, d}, what));
    ZI_TRY(be_.matmul(tokens.view({b * n_img, feat}), w, bias, e));  // [B*N, D]
    ZI_ASSIGN_OR_RETURN(Tensor x, load::alloc(be_, act, {b, np, d}, what));
    for (int64_t i = 0; i < b; ++i) {
      ZI_TRY(be_.copy_2d(e, i * n_img * d, d, x, i * np * d, d, n_img, d));
      if (np > n_img)
        ZI_TRY(be_.copy_2d(dit_.x_pad_, 0, d, x, (i * np + n_img) * d, d, np - n_img, d));
    }
    return x;
  };
  ZI_ASSIGN_OR_RETURN(Tensor x, embed(latents, tc.token_features(), dit_.x_w_, dit_.x_b_,
                                      "controlnet.image_tokens"));  // [B, Np, D]
  ZI_ASSIGN_OR_RETURN(Tensor cc, embed(control, p * p * cfg_.control_in_dim, cx_w_, cx_b_,
                                       "controlnet.control_tokens"));  // [B, Np, D]

  // ---- 2.x: control blocks over the image tokens feed the noise refiner ----
  const AttentionParams ap_img{attn_scale, false, {}};
  std::vector<Tensor> refiner_hints;
  if (cfg_.refiner != ControlNetConfig::Refiner::kNone) {
    const auto& chain =
        cfg_.refiner == ControlNetConfig::Refiner::kControlLayers ? layers_ : refiner_;
    ZI_TRY(run_control(chain, cc, x, L.img_freqs, c, ap_img, refiner_hints));
    for (Tensor& h : refiner_hints) ZI_TRY(be_.axpby(scale, h, 0.0f, h, h));
  }
  {
    ZI_ASSIGN_OR_RETURN(auto s, dit_.make_scratch(b, np));
    for (size_t l = 0; l < dit_.noise_refiner_.size(); ++l) {
      const int bi = static_cast<int>(l);
      ZI_ASSIGN_OR_RETURN(ZImageDiT::Block blk, dit_.use_block(bi));
      ZI_TRY(dit_.run_block(blk, x, L.img_freqs, c, ap_img, *s));
      ZI_TRY(dit_.done_block(bi));
      const auto& rp = cfg_.control_refiner_layers_places;
      for (size_t j = 0; j < rp.size() && j < refiner_hints.size(); ++j)
        if (rp[j] == static_cast<int>(l)) ZI_TRY(be_.add(x, refiner_hints[j], x));
    }
  }
  refiner_hints.clear();

  // ---- caption tokens: the DiT's caption embedder and context refiner (its refined tokens) ----
  ZImageDiT::RefinedCaptions own;
  if (refined == nullptr) {
    ZI_ASSIGN_OR_RETURN(own, dit_.refine_captions(caps));
    refined = &own;
  }
  Tensor cap = refined->tokens;  // [B, Lp, D], read only

  // ---- 1.0: the control tokens' own refiner (plain blocks, no hints) ----
  if (cfg_.refiner == ControlNetConfig::Refiner::kNone) {
    std::vector<Tensor> unused;
    ZI_TRY(run_control(refiner_, cc, x, L.img_freqs, c, ap_img, unused));
  }

  // ---- unified [x ; cap] and [cc ; cap], then the control layers ----
  ZI_ASSIGN_OR_RETURN(Tensor u, load::alloc(be_, act, {b, s_max, d}, "controlnet.unified"));
  ZI_ASSIGN_OR_RETURN(Tensor cu, load::alloc(be_, act, {b, s_max, d}, "controlnet.control"));
  if (L.ragged) {
    ZI_TRY(be_.fill(u, 0.0f));
    ZI_TRY(be_.fill(cu, 0.0f));
  }
  for (int64_t i = 0; i < b; ++i) {
    ZI_TRY(be_.copy_2d(x, i * np * d, d, u, i * s_max * d, d, np, d));
    ZI_TRY(be_.copy_2d(cap, i * lp_max * d, d, u, (i * s_max + np) * d, d, L.cap_pad[i], d));
    ZI_TRY(be_.copy_2d(cc, i * np * d, d, cu, i * s_max * d, d, np, d));
    ZI_TRY(be_.copy_2d(cap, i * lp_max * d, d, cu, (i * s_max + np) * d, d, L.cap_pad[i], d));
  }
  x = Tensor();
  cc = Tensor();
  cap = Tensor();
  AttentionParams ap{attn_scale, false, {}};
  if (L.ragged)
    for (int64_t i = 0; i < b; ++i) ap.key_len.push_back(static_cast<int32_t>(L.seq[i]));
  std::vector<Tensor> hints;
  ZI_TRY(run_control(layers_, cu, u, L.uni_freqs, c, ap, hints));
  out.layers = cfg_.control_layers_places;
  out.hints.clear();
  for (size_t k = 0; k < hints.size(); ++k) {
    ZI_TRY(be_.axpby(scale, hints[k], 0.0f, hints[k], hints[k]));  // hint · scale
    debug_tensor(dbg, pfx + ".hint." + std::to_string(out.layers[k]), be_, hints[k]);
    out.hints.push_back(hints[k]);
  }
  return Status::Ok();
}

}  // namespace zimage
