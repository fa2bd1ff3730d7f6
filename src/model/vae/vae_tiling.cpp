// diffusers' AutoencoderKL.tiled_decode on top of VaeDecoder; see vae_tiling.h for the geometry
// and why the blend runs on the host.
#include "model/vae/vae_tiling.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "core/log.h"

namespace zimage {

namespace {

// Tile starts along one latent side: range(0, n, stride) in Python.
std::vector<int64_t> tile_starts(int64_t n, int64_t stride) {
  std::vector<int64_t> s;
  for (int64_t i = 0; i < n; i += stride) s.push_back(i);
  return s;
}

// The pixels a tiled decode produces along a latent side of n: the kept part of every tile.
int64_t tiled_side(const VaeTileGeometry& g, int64_t n) {
  int64_t total = 0;
  for (int64_t s : tile_starts(n, g.stride))
    total += std::min(g.row_limit, std::min(g.latent, n - s) * g.factor);
  return total;
}

std::string gib(uint64_t bytes) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2f GiB", static_cast<double>(bytes) / (1u << 30));
  return b;
}

// One decoded tile of every batch item, raw decoder output, host f32 NHWC [B, th, tw, C].
struct Tile {
  int64_t th = 0, tw = 0;
  Tensor px;
  float* at(int64_t b, int64_t y, int64_t x, int64_t c) {
    return px.data_as<float>() + ((b * th + y) * tw + x) * px.dim(3) + c;
  }
};

// The rounding of one PyTorch op's result in the compute dtype (the host computes in float).
float (*rounder(DType act))(float) {
  if (act == DType::kBF16) return [](float v) { return round_bf16(v); };
  return [](float v) { return v; };
}

// blend_v(a, b, extent): b's first e rows become a's last e rows · (1 - y/e) + b · (y/e),
// e = min(a rows, b rows, extent). Weights as Python computes them (double), then cast to float
// as PyTorch casts a scalar operand; each product and the sum rounded to the compute dtype.
void blend_v(Tile& a, Tile& b, int64_t extent, float (*r)(float)) {
  const int64_t e = std::min({a.th, b.th, extent});
  const int64_t nb = b.px.dim(0), c = b.px.dim(3);
  for (int64_t y = 0; y < e; ++y) {
    const double t = static_cast<double>(y) / static_cast<double>(e);
    const float wa = static_cast<float>(1.0 - t), wb = static_cast<float>(t);
    for (int64_t k = 0; k < nb; ++k) {
      const float* src = a.at(k, a.th - e + y, 0, 0);
      float* dst = b.at(k, y, 0, 0);
      for (int64_t i = 0; i < b.tw * c; ++i) dst[i] = r(r(src[i] * wa) + r(dst[i] * wb));
    }
  }
}

// blend_h(a, b, extent): the same over b's first e columns with a's last e columns.
void blend_h(Tile& a, Tile& b, int64_t extent, float (*r)(float)) {
  const int64_t e = std::min({a.tw, b.tw, extent});
  const int64_t nb = b.px.dim(0), c = b.px.dim(3);
  for (int64_t x = 0; x < e; ++x) {
    const double t = static_cast<double>(x) / static_cast<double>(e);
    const float wa = static_cast<float>(1.0 - t), wb = static_cast<float>(t);
    for (int64_t k = 0; k < nb; ++k) {
      for (int64_t y = 0; y < b.th; ++y) {
        const float* src = a.at(k, y, a.tw - e + x, 0);
        float* dst = b.at(k, y, x, 0);
        for (int64_t i = 0; i < c; ++i) dst[i] = r(r(src[i] * wa) + r(dst[i] * wb));
      }
    }
  }
}

// z[k, :, y0:y0+th, x0:x0+tw] of a host f32 [B, C, h, w] as a new [1, C, th, tw].
Result<Tensor> crop_latent(const Tensor& z, int64_t k, int64_t y0, int64_t x0, int64_t th,
                           int64_t tw) {
  const int64_t ch = z.dim(1), h = z.dim(2), w = z.dim(3);
  Tensor t = Tensor::host(DType::kF32, {1, ch, th, tw});
  if (!t.defined()) return OutOfMemory("vae tile latents");
  const float* src = z.data_as<const float>();
  float* dst = t.data_as<float>();
  for (int64_t c = 0; c < ch; ++c)
    for (int64_t y = 0; y < th; ++y)
      std::copy_n(src + ((k * ch + c) * h + y0 + y) * w + x0, tw, dst + (c * th + y) * tw);
  return t;
}

}  // namespace

Result<VaeTiling> parse_vae_tiling(std::string_view text, const std::string& field) {
  if (text == "auto") return VaeTiling::kAuto;
  if (text == "on") return VaeTiling::kOn;
  if (text == "off") return VaeTiling::kOff;
  return InvalidArgument(field + ": '" + std::string(text) + "' is not one of auto, on, off");
}

const char* vae_tiling_name(VaeTiling t) {
  switch (t) {
    case VaeTiling::kOn:
      return "on";
    case VaeTiling::kOff:
      return "off";
    default:
      return "auto";
  }
}

VaeTileGeometry vae_tile_geometry(const VaeConfig& cfg) {
  VaeTileGeometry g;
  g.factor = cfg.spatial_factor();
  g.sample = cfg.sample_size;
  // Python: int(sample_size / 2 ** (n - 1)), int(latent * (1 - 0.25)), int(sample * 0.25); the
  // doubles are exact here and int() truncates as the casts do.
  g.latent = static_cast<int64_t>(static_cast<double>(g.sample) / static_cast<double>(g.factor));
  g.stride = static_cast<int64_t>(static_cast<double>(g.latent) * (1.0 - 0.25));
  g.blend = static_cast<int64_t>(static_cast<double>(g.sample) * 0.25);
  g.row_limit = g.sample - g.blend;
  return g;
}

bool vae_tiling_applies(const VaeTileGeometry& g, int64_t h, int64_t w) {
  return h > g.latent || w > g.latent;
}

Status check_vae_tiling(const VaeTileGeometry& g, int64_t h, int64_t w) {
  const std::string where = "vae tiling: sample_size " + std::to_string(g.sample) + " (tiles of " +
                            std::to_string(g.latent) + " latent pixels)";
  if (g.stride < 1) {
    return Unsupported(where + " leaves no step between tiles; it must be at least " +
                       std::to_string(2 * g.factor));
  }
  const int64_t th = tiled_side(g, h), tw = tiled_side(g, w);
  if (th != h * g.factor || tw != w * g.factor) {
    return Unsupported(where + " gives a " + std::to_string(tw) + "x" + std::to_string(th) +
                       " tiled image for a " + std::to_string(w * g.factor) + "x" +
                       std::to_string(h * g.factor) + " one (diffusers' tiling needs sample_size" +
                       " a multiple of " + std::to_string(4 * g.factor) + ")");
  }
  return Status::Ok();
}

Result<Tensor> vae_decode_tiled(VaeDecoder& vae, const Tensor& latents, DebugSink* dbg,
                                const std::atomic<bool>* cancel) {
  const auto cancelled = [cancel] { return cancel != nullptr && cancel->load(); };
  const VaeTileGeometry g = vae_tile_geometry(vae.config());
  // z = latents / scaling + shift once for the whole latent, as the pipeline does before
  // vae.decode (scale_latents also checks the latents).
  ZI_ASSIGN_OR_RETURN(Tensor z, vae.scale_latents(latents));  // [B, C, h, w] host f32
  const int64_t nb = z.dim(0), h = z.dim(2), w = z.dim(3), f = g.factor;
  if (!vae_tiling_applies(g, h, w)) {
    return InvalidArgument("vae tiled decode: a " + std::to_string(h) + "x" + std::to_string(w) +
                           " latent fits one tile of " + std::to_string(g.latent));
  }
  ZI_TRY(check_vae_tiling(g, h, w));
  const int64_t out_c = vae.config().out_channels;
  const auto r = rounder(vae.backend().act_dtype());
  Tensor image = Tensor::host(DType::kF32, {nb, h * f, w * f, out_c});  // [B, H, W, 3]
  if (!image.defined()) return OutOfMemory("vae output image");
  const std::vector<int64_t> rows = tile_starts(h, g.stride), cols = tile_starts(w, g.stride);
  std::vector<Tile> above, current;  // the previous row of tiles (blended) and this one
  int64_t out_y = 0;
  for (size_t ri = 0; ri < rows.size(); ++ri) {
    current.assign(cols.size(), Tile());
    for (size_t ci = 0; ci < cols.size(); ++ci) {
      if (cancelled()) return Cancelled("generation cancelled during the VAE decode");
      const int64_t lh = std::min(g.latent, h - rows[ri]), lw = std::min(g.latent, w - cols[ci]);
      Tile& t = current[ci];
      t.th = lh * f;
      t.tw = lw * f;
      t.px = Tensor::host(DType::kF32, {nb, t.th, t.tw, out_c});
      if (!t.px.defined()) return OutOfMemory("vae tile");
      for (int64_t k = 0; k < nb; ++k) {  // one batch item at a time: one tile's activations
        ZI_ASSIGN_OR_RETURN(Tensor zt, crop_latent(z, k, rows[ri], cols[ci], lh, lw));
        const std::string prefix =
            "vae.tile" + std::to_string(ri) + "_" + std::to_string(ci) + "." + std::to_string(k);
        ZI_ASSIGN_OR_RETURN(Tensor raw, vae.decode_scaled(zt, dbg, cancel, prefix));
        Tensor host = Tensor::host(DType::kF32, raw.shape());
        if (!host.defined()) return OutOfMemory("vae tile download");
        ZI_TRY(vae.backend().download(raw, host));
        std::copy_n(host.data_as<const float>(), host.numel(), t.at(k, 0, 0, 0));
      }
      // In diffusers' order, in place: with the (blended) tile above, then the one to the left.
      if (ri > 0) blend_v(above[ci], t, g.blend, r);
      if (ci > 0) blend_h(current[ci - 1], t, g.blend, r);
    }
    // Keep the top-left row_limit x row_limit of each tile, side by side.
    const int64_t keep_h = std::min(g.row_limit, current[0].th);
    int64_t out_x = 0;
    for (Tile& t : current) {
      const int64_t keep_w = std::min(g.row_limit, t.tw);
      for (int64_t k = 0; k < nb; ++k)
        for (int64_t y = 0; y < keep_h; ++y)
          std::copy_n(t.at(k, y, 0, 0), keep_w * out_c,
                      image.data_as<float>() + ((k * h * f + out_y + y) * w * f + out_x) * out_c);
      out_x += keep_w;
    }
    out_y += keep_h;
    above = std::move(current);
  }
  // clamp(x/2 + 0.5, 0, 1) with VaeDecoder::postprocess's roundings (x/2 is exact, the + 0.5
  // rounds to the compute dtype). A non-finite value stays NaN, as the backend ops leave it
  // (0·Inf), so the pipeline's finite check still sees an overflow.
  float* px = image.data_as<float>();
  for (int64_t i = 0, n = image.numel(); i < n; ++i) {
    const float v = px[i];
    px[i] = std::isfinite(v) ? std::clamp(r(r(v * 0.5f) + 0.5f), 0.0f, 1.0f)
                             : std::numeric_limits<float>::quiet_NaN();
  }
  return image;
}

bool vae_should_tile(const VaeDecoder& vae, const VaeTilingPolicy& policy, int64_t batch, int64_t h,
                     int64_t w, std::string* reason) {
  const auto say = [reason](std::string s) {
    if (reason != nullptr) *reason = std::move(s);
  };
  const VaeTileGeometry g = vae_tile_geometry(vae.config());
  if (policy.mode == VaeTiling::kOff) {
    say("vae tiling off");
    return false;
  }
  if (!vae_tiling_applies(g, h, w)) {
    say("the latent fits one tile of " + std::to_string(g.latent));
    return false;
  }
  if (policy.mode == VaeTiling::kOn) {
    say("vae tiling on");
    return true;
  }
  uint64_t budget = policy.budget_bytes;
  if (budget == 0) {
    const std::optional<uint64_t> avail = vae.backend().available_memory();
    if (!avail) {
      say("the backend has no memory limit to keep to");
      return false;
    }
    budget = *avail > kVaeTilingMargin ? *avail - kVaeTilingMargin : 0;
  }
  const uint64_t need = vae.estimate_decode_bytes(batch, h, w);
  if (need <= budget) {
    say("the untiled decode (" + gib(need) + ") fits " + gib(budget));
    return false;
  }
  if (const Status st = check_vae_tiling(g, h, w); !st.ok()) {
    ZI_WARN("%s; decoding untiled", st.message().c_str());
    say(st.message());
    return false;
  }
  say("the untiled decode (" + gib(need) + ") exceeds " + gib(budget));
  return true;
}

Result<Tensor> vae_decode_with_policy(VaeDecoder& vae, const Tensor& latents,
                                      const VaeTilingPolicy& policy, DebugSink* dbg,
                                      const std::atomic<bool>* cancel) {
  if (!latents.defined() || latents.rank() != 4) return vae.decode(latents, dbg, cancel);
  std::string why;
  if (!vae_should_tile(vae, policy, latents.dim(0), latents.dim(2), latents.dim(3), &why))
    return vae.decode(latents, dbg, cancel);
  ZI_INFO("vae: tiled decode (%s)", why.c_str());
  return vae_decode_tiled(vae, latents, dbg, cancel);
}

}  // namespace zimage
