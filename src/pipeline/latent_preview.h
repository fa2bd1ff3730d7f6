// Live previews: a cheap picture of the latents between denoising steps, a fixed linear map of
// the 16 VAE latent channels to RGB at latent resolution (ComfyUI's "latent2rgb" previews),
// computed on the backend (Backend::latent_to_rgb) and downloaded as w·h·3 bytes. It runs only
// for requests whose hooks ask for it (GenerateHooks::on_preview).
#pragma once

#include <cstdint>

#include "backend/backend.h"
#include "zimage/zimage.h"

namespace zimage {

// The projection of the Flux / Z-Image VAE family (16 latent channels), applied to the latents
// the pipeline holds between steps (diffusers' `latents`, i.e. after (z − shift)·scale).
const LatentRgbMap& flux_latent_rgb_map();

// The first image of latents[n, C, h, w] (on `be`) as a preview of step `step` of `total`.
// kUnsupported when C is not the map's channel count.
Result<Preview> latent_preview(Backend& be, const Tensor& latents, int step, int total);

// How many previews latent_preview() computed in this process (tests check that none runs for a
// request that did not ask).
uint64_t latent_previews_computed();

}  // namespace zimage
