// Tiled VAE decode, exactly as diffusers' AutoencoderKL does it after `vae.enable_tiling()`
// (autoencoder_kl.py: _decode, tiled_decode, blend_v, blend_h), so that a large image decodes in
// the memory of one tile and a tiled decode gives diffusers' tiled image.
//
// The geometry comes from the VAE config alone (sample_size decides the tile size):
//   tile_sample_min_size = sample_size                         (pixels; 1024 for Z-Image)
//   tile_latent_min_size = int(sample_size / 2^(len(block_out_channels) - 1))      (128)
//   overlap_size         = int(tile_latent_min_size * (1 - 0.25))    latent step   (96)
//   blend_extent         = int(tile_sample_min_size * 0.25)          pixels        (256)
//   row_limit            = tile_sample_min_size - blend_extent       pixels kept   (768)
// diffusers tiles only a latent larger than one tile (h or w > tile_latent_min_size). Tiles start
// every overlap_size latent rows / columns (the last ones are cut by the border), each is decoded
// alone, then, in row-major order and in place, each tile is blended with the (already blended)
// tile above over `blend_extent` rows (blend_v) and then with the tile to its left over
// `blend_extent` columns (blend_h), with the linear ramp weights (1 - y/e, y/e); the top-left
// row_limit x row_limit of every tile is kept. The blending works on the decoder's raw output,
// before clamp(x/2 + 0.5, 0, 1).
//
// Where the work is done: the decoder runs on the backend, one tile and one batch item at a
// time (the device holds one tile's activations: that is the point of tiling); each raw tile is
// downloaded and blended on the host. The host is the natural place: the tiles have only 3
// channels (a 1024² tile is 12 MiB in f32), the blend is a few element-wise passes, and the
// host arithmetic reproduces PyTorch's roundings exactly (f32: products and sum in float; bf16:
// every product and the sum rounded to bf16, as PyTorch's bf16 ops do), whatever the backend.
// The post-processing then runs on the host with the same roundings as VaeDecoder::postprocess.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/status.h"
#include "core/tensor.h"
#include "io/model/model_config.h"
#include "model/common/debug.h"
#include "model/vae/vae.h"

namespace zimage {

// --vae-tiling: kOn = diffusers' enable_tiling() (tiles when the latent is larger than a tile);
// kOff = never; kAuto = tile when the untiled decode would not fit the memory budget.
enum class VaeTiling { kAuto, kOn, kOff };
// "auto", "on" or "off"; anything else is kInvalidArgument naming `field`.
Result<VaeTiling> parse_vae_tiling(std::string_view text, const std::string& field = "vae_tiling");
const char* vae_tiling_name(VaeTiling t);

struct VaeTileGeometry {
  int64_t factor = 1;     // image pixels per latent pixel
  int64_t sample = 0;     // tile_sample_min_size (pixels)
  int64_t latent = 0;     // tile_latent_min_size (latent pixels)
  int64_t stride = 0;     // overlap_size: latent pixels between tile starts
  int64_t blend = 0;      // blend_extent (pixels)
  int64_t row_limit = 0;  // pixels kept of each tile (rows and columns)
};
VaeTileGeometry vae_tile_geometry(const VaeConfig& cfg);

// Whether diffusers' enable_tiling() tiles an h x w latent: only when it is larger than a tile.
bool vae_tiling_applies(const VaeTileGeometry& g, int64_t h, int64_t w);

// kOk when the tiles of an h x w latent decode to exactly (h·f) x (w·f) pixels. Configs whose
// sample_size is not a multiple of 4·f can make diffusers' tiles overlap wrongly (its output then
// has another size) and a sample_size below 2·f leaves no step between tiles: kUnsupported,
// naming sample_size.
Status check_vae_tiling(const VaeTileGeometry& g, int64_t h, int64_t w);

// The tiled decode: same contract as VaeDecoder::decode (latents [B, C, h, w] f32 on the
// backend -> image [B, H, W, 3] f32 in [0, 1] on the host), for a latent where
// vae_tiling_applies() and check_vae_tiling() passes (kInvalidArgument otherwise). Intermediates
// of tile (r, c) of batch item k are named vae.tile<r>_<c>.<k>.conv_in, ... (see
// VaeDecoder::decode_scaled); the blended raw output is not dumped.
Result<Tensor> vae_decode_tiled(VaeDecoder& vae, const Tensor& latents, DebugSink* dbg = nullptr,
                                const std::atomic<bool>* cancel = nullptr);

// How the pipeline decodes.
struct VaeTilingPolicy {
  VaeTiling mode = VaeTiling::kAuto;
  // kAuto tiles when VaeDecoder::estimate_decode_bytes exceeds this. 0: ask the backend at
  // decode time (Backend::available_memory() minus kVaeTilingMargin); a backend that cannot
  // say (the CPU) never tiles in auto.
  uint64_t budget_bytes = 0;
};
// Kept free for what the estimate leaves out (convolution workspaces, the attention's score
// buffer, allocator rounding).
inline constexpr uint64_t kVaeTilingMargin = uint64_t{1} << 30;

// Whether `policy` tiles a [batch, C, h, w] latent on `vae` (also false where tiling does not
// apply, as diffusers). Auto with a geometry check_vae_tiling() refuses: untiled, with a warning.
// `reason` (optional) gets a one-line explanation of the choice.
bool vae_should_tile(const VaeDecoder& vae, const VaeTilingPolicy& policy, int64_t batch, int64_t h,
                     int64_t w, std::string* reason = nullptr);

// VaeDecoder::decode or vae_decode_tiled, as `policy` decides. mode kOn with a geometry
// check_vae_tiling() refuses is an error (kUnsupported), not a silent untiled decode.
Result<Tensor> vae_decode_with_policy(VaeDecoder& vae, const Tensor& latents,
                                      const VaeTilingPolicy& policy, DebugSink* dbg = nullptr,
                                      const std::atomic<bool>* cancel = nullptr);

}  // namespace zimage
