// The Z-Image ControlNet (diffusers' ZImageControlNetModel, the Fun-Controlnet-Union checkpoints):
// from the latents, the timestep, the captions and a control context (VAE latents of the control
// image, plus mask and masked-image latents for 2.x inpainting) it computes one residual ("hint")
// per controlled DiT layer, which ZImageDiT adds to its unified sequence after that layer.
//
// It shares the DiT's t_embedder, x_embedder, cap_embedder, pad tokens, RoPE, noise refiner and
// context refiner (diffusers: ZImageControlNetModel.from_transformer), so it is loaded against a
// ZImageDiT and holds only its own weights:
//   control_all_x_embedder.<p>-<f>   Linear(p*p*f*control_in_dim -> D)
//   control_layers.<i>               control blocks (a DiT block + after_proj; block 0 also
//                                    before_proj), one per place in control_layers_places
//   control_noise_refiner.<i>        1.0: plain modulated DiT blocks run on the control tokens;
//                                    2.1: control blocks that feed hints into the noise refiner
// Forward (batch of B, image tokens Np, unified length S), as controlnet_z_image.py:
//   c   = t_embedder(t); x = x_embedder(latents) (+ pads); cc = control_x_embedder(ctx) (+ x pads)
//   mode None (1.0):                x = noise_refiner(x); cc = control_noise_refiner(cc)
//   mode "control_layers" (2.0):    cc, h = control_layers(cc, x) over the image tokens;
//                                   x = noise_refiner(x) (+ scale·h[j] after refiner layer
//                                   refiner_places[j]); cc = the last control state
//   mode "control_noise_refiner" (2.1): the same with the control_noise_refiner blocks
//   cap = context_refiner(cap_embedder(caps)); u = [x ; cap]; cu = [cc ; cap]
//   control block k: (k = 0: cu = before_proj(cu) + u) cu = block(cu); hint_k = after_proj(cu)
//   output: scale·hint_k for DiT layer control_layers_places[k]                   [B, S, D]
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/status.h"
#include "io/weights/weights.h"
#include "model/common/debug.h"
#include "model/dit/zimage_dit.h"

namespace zimage {

// config.json of a diffusers ControlNet folder, or inferred from a single file's tensors.
struct ControlNetConfig {
  enum class Refiner { kNone, kControlLayers, kControlNoiseRefiner };
  std::vector<int> control_layers_places;
  std::vector<int> control_refiner_layers_places;
  int control_in_dim = 16;
  Refiner refiner = Refiner::kNone;  // add_control_noise_refiner
  int patch_size = 2, f_patch_size = 1;
  int dim = 3840, n_refiner_layers = 2, n_heads = 30;
  float norm_eps = 1e-5f;
  bool qk_norm = true;
  // How the layout was recognised: "folder", or the single file's version ("1.0", "2.0", "2.1",
  // "2.1-lite" = 2.1 with fewer control layers than 15).
  std::string version = "folder";
};

// Parses a folder's config.json (`path` names it in errors).
Result<ControlNetConfig> parse_controlnet_config(const std::string& text, const std::string& path);

// The single-file layouts, told apart as diffusers' single-file loader does (infer_diffusers_model_
// type + convert_z_image_controlnet_checkpoint_to_diffusers), with the config from the shapes:
//   control_layers.14.adaLN_modulation.0.weight present -> 2.x: 2.1 when
//     control_noise_refiner.0.before_proj.weight exists and is not all zero, else 2.0 (its
//     control_noise_refiner tensors, if any, are unused: `unused` lists them);
//   else control_all_x_embedder.2-1.weight present -> 1.0, unless the file holds 33-channel
//     control inputs with a non-zero control_noise_refiner.0.before_proj (2.1-lite: diffusers'
//     detection would take it for 1.0 and fail on the shapes; zimage reads it as 2.1).
// Control layer places are not stored in the files: N control layers sit at every (30 / N)-th
// DiT layer scaled to the DiT's depth (1.0: 6 -> 0,5,..,25; 2.x: 15 -> 0,2,..,28; lite: 3 ->
// 0,10,20), the refiner places are 0..n-1 of the control refiner.
Result<ControlNetConfig> infer_controlnet_config(const WeightStore& ws, int dit_layers,
                                                 std::vector<std::string>* unused);

// What ZImageControlNet::load checks of `path` before it needs the transformer, worded as load
// words it (`zimage info` runs it on a ControlNet folder or file): the path exists, a folder's
// config.json is read and parsed, the weights open; a single file's config is inferred from its
// tensors against the published 30-layer transformer.
Status check_controlnet_files(const std::string& path);

class ZImageControlNet {
 public:
  // Loads a ControlNet from `path`: a diffusers folder (config.json + weights) or a single
  // .safetensors file. `dit` is the transformer it controls (it must outlive the ControlNet, and
  // dims, heads, patch size and layer indices must agree: errors name the file and the field).
  static Result<std::unique_ptr<ZImageControlNet>> load(const std::string& path, ZImageDiT& dit,
                                                        Backend& be);
  static Result<std::unique_ptr<ZImageControlNet>> load(const ControlNetConfig& cfg,
                                                        const WeightStore& ws, ZImageDiT& dit,
                                                        Backend& be, const std::string& path);
  ~ZImageControlNet();

  // latents [B, C, h, w] f32, t_model B host floats, caps B × [L_i, cap_feat_dim] (as
  // ZImageDiT::forward), control [B, control_in_dim, h, w] f32, scale finite. Fills `out` with
  // one hint per controlled layer ([B, S, D], act dtype, already scaled).
  // Intermediates: <prefix>.hint.<layer>. `refined` (optional): the DiT's caption tokens for
  // these captions (ZImageDiT::refine_captions), which the ControlNet then reads instead of
  // running the DiT's caption embedder and context refiner again (the same hints bit for bit).
  Status forward(const Tensor& latents, const std::vector<float>& t_model,
                 const std::vector<Tensor>& caps, const Tensor& control, float scale,
                 ControlResiduals& out, DebugSink* dbg = nullptr,
                 const std::string& dbg_prefix = "controlnet",
                 const ZImageDiT::RefinedCaptions* refined = nullptr);

  const ControlNetConfig& config() const { return cfg_; }
  const std::string& path() const { return path_; }

 private:
  struct ControlBlock;  // zimage_controlnet.cpp
  ZImageControlNet(const ControlNetConfig& cfg, ZImageDiT& dit, Backend& be, std::string path);
  Status load_weights(const WeightStore& ws);
  Status run_control(const std::vector<ControlBlock>& blocks, Tensor& cc, const Tensor& x,
                     const Tensor& freqs, const Tensor& c, const AttentionParams& ap,
                     std::vector<Tensor>& hints);

  ControlNetConfig cfg_;
  ZImageDiT& dit_;
  Backend& be_;
  std::string path_;
  Tensor cx_w_, cx_b_;  // control_all_x_embedder: [D, p*p*Cc], [D]
  std::vector<ControlBlock> layers_, refiner_;
};

}  // namespace zimage
