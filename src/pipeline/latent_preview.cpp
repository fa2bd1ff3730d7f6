#include "pipeline/latent_preview.h"

#include <atomic>
#include <string>

namespace zimage {

namespace {

std::atomic<uint64_t> g_previews{0};

LatentRgbMap make_flux_map() {
  // Source of the numbers: ComfyUI, comfy/latent_formats.py, class Flux (latent_rgb_factors and
  // latent_rgb_factors_bias), the previewer ComfyUI uses for the 16-channel Flux VAE, which
  // Z-Image shares (same scaling 0.3611 and shift 0.1159). ComfyUI is licensed GPL-3.0; only
  // these 51 measured coefficients are taken (a fitted least-squares map from latents to RGB), no
  // code. docs/SERVER.md ("Live previews") records the same.
  static constexpr float kWeight[16][3] = {
      {-0.0346f, 0.0244f, 0.0681f},   {0.0034f, 0.0210f, 0.0687f},
      {0.0275f, -0.0668f, -0.0433f},  {-0.0174f, 0.0160f, 0.0617f},
      {0.0859f, 0.0721f, 0.0329f},    {0.0004f, 0.0383f, 0.0115f},
      {0.0405f, 0.0861f, 0.0915f},    {-0.0236f, -0.0185f, -0.0259f},
      {-0.0245f, 0.0250f, 0.1180f},   {0.1008f, 0.0755f, -0.0421f},
      {-0.0515f, 0.0201f, 0.0011f},   {0.0428f, -0.0012f, -0.0036f},
      {0.0817f, 0.0765f, 0.0749f},    {-0.1264f, -0.0522f, -0.1103f},
      {-0.0280f, -0.0881f, -0.0499f}, {-0.1262f, -0.0982f, -0.0778f},
  };
  static constexpr float kBias[3] = {-0.0329f, -0.0718f, -0.0851f};
  LatentRgbMap m;
  m.channels = 16;
  for (int c = 0; c < 16; ++c)
    for (int k = 0; k < 3; ++k) m.weight[c][k] = kWeight[c][k];
  for (int k = 0; k < 3; ++k) m.bias[k] = kBias[k];
  return m;
}

}  // namespace

const LatentRgbMap& flux_latent_rgb_map() {
  static const LatentRgbMap map = make_flux_map();
  return map;
}

Result<Preview> latent_preview(Backend& be, const Tensor& latents, int step, int total) {
  const LatentRgbMap& map = flux_latent_rgb_map();
  if (latents.rank() != 4 || latents.dim(1) != map.channels) {
    return Unsupported("live previews need " + std::to_string(map.channels) +
                       "-channel latents, this model has " +
                       std::to_string(latents.rank() == 4 ? latents.dim(1) : 0));
  }
  g_previews.fetch_add(1, std::memory_order_relaxed);
  const int64_t h = latents.dim(2), w = latents.dim(3);
  ZI_ASSIGN_OR_RETURN(Tensor rgb, be.alloc(DType::kU8, {1, h, w, 3}));
  ZI_TRY(be.latent_to_rgb(latents.slice0(0, 1), map, rgb));
  Tensor host = Tensor::host(DType::kU8, rgb.shape());
  if (!host.defined()) return OutOfMemory("host buffer for a live preview");
  ZI_TRY(be.download(rgb, host));
  Preview p;
  p.step = step;
  p.total = total;
  p.width = static_cast<int>(w);
  p.height = static_cast<int>(h);
  const auto* bytes = static_cast<const uint8_t*>(host.data());
  p.rgb.assign(bytes, bytes + host.numel());
  return p;
}

uint64_t latent_previews_computed() {
  return g_previews.load(std::memory_order_relaxed);
}

}  // namespace zimage
