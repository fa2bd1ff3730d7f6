"""Golden cases for the tiled VAE decode, made with upstream diffusers (fp32, CPU).

Why: zimage's tiled decode (src/model/vae/vae_tiling.cpp) claims to be diffusers' AutoencoderKL tiled
decode (`pipe.vae.enable_tiling()`): same tiles, overlap, blending and crop. Each case is a tiny
random AutoencoderKL whose config makes tiling happen at a small size (sample_size decides the
tile: tile_sample_min_size = sample_size, tile_latent_min_size = sample_size / 2^(levels-1)),
random latents, and what diffusers decodes from them with tiling on and off.

How to run (CPU, seconds):  python3 tools/make_vae_tiling_goldens.py [OUT_DIR]
  OUT_DIR defaults to tests/data/vae_tiling (next to this script's repository root).
Files per case, in OUT_DIR/<name>/:
  vae/config.json, vae/diffusion_pytorch_model.safetensors  the decoder's weights (bf16, exact:
      the model is rounded to bf16 first; the encoder's tensors are left out to keep it small)
  latents.npy        [B, 16, h, w] f32, the pipeline's latents (before / scaling_factor + shift)
  image_tiled.npy    [B, H, W, 3] f32 in [0, 1]: vae.enable_tiling(); vae.decode(z), then
                     clamp(x / 2 + 0.5, 0, 1), as ZImagePipeline does with output_type="np"
  image_untiled.npy  the same with tiling off (to show that tiling changes the image)
  case.json          name, seed, the latent size and diffusers' tiling attributes
"""
import json
import os
import shutil
import sys

import numpy as np
import torch
from diffusers import AutoencoderKL
from safetensors.torch import save_file

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CASES = [
    # Factor 4, post_quant_conv on, a batch of two. sample_size 32: 8-latent tiles every 6, a
    # blend of 8 px, 24 px kept. 12 x 13 latent: 2 tile rows (8, 6) and 3 columns (8, 7, 1); the
    # last column is 4 px wide, narrower than the blend (blend_h's min()).
    dict(name="tile_f4", seed=7, batch=2, h=12, w=13, sample_size=32,
         vae=dict(block_out_channels=[32, 32, 32], layers_per_block=1, use_post_quant_conv=True)),
    # Factor 8 like Z-Image's VAE (4 levels, no post_quant_conv), sample_size 64: 8-latent tiles
    # every 6, a blend of 16 px, 48 px kept. 10 x 16 latent (80 x 128 px): 2 x 3 tiles.
    dict(name="tile_f8", seed=11, batch=1, h=10, w=16, sample_size=64,
         vae=dict(block_out_channels=[32, 32, 32, 32], layers_per_block=1,
                  use_post_quant_conv=False)),
]


def bf16_exact(module):
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(p.bfloat16().float())
    return module


def to_image(x):
    # ZImagePipeline: image_processor.postprocess(output_type="np") -> NHWC float32
    return (x / 2 + 0.5).clamp(0, 1).permute(0, 2, 3, 1).float().numpy()


def make_case(c, out_dir):
    torch.manual_seed(c["seed"])
    n = len(c["vae"]["block_out_channels"])
    vae = AutoencoderKL(in_channels=3, out_channels=3, down_block_types=["DownEncoderBlock2D"] * n,
                        up_block_types=["UpDecoderBlock2D"] * n, latent_channels=16,
                        norm_num_groups=32, scaling_factor=0.3611, shift_factor=0.1159,
                        use_quant_conv=False, sample_size=c["sample_size"], **c["vae"])
    bf16_exact(vae).eval()
    d = os.path.join(out_dir, c["name"])
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(os.path.join(d, "vae"))
    # The config as save_pretrained writes it; only the decoder side's tensors.
    vae.save_config(os.path.join(d, "vae"))
    keep = {k: v.to(torch.bfloat16).contiguous() for k, v in vae.state_dict().items()
            if k.startswith("decoder.") or k.startswith("post_quant_conv.")}
    save_file(keep, os.path.join(d, "vae", "diffusion_pytorch_model.safetensors"))

    g = torch.Generator("cpu").manual_seed(c["seed"])
    latents = torch.randn((c["batch"], 16, c["h"], c["w"]), generator=g, dtype=torch.float32)
    cfg = vae.config
    with torch.no_grad():
        z = latents / cfg.scaling_factor + cfg.shift_factor  # as ZImagePipeline, once
        vae.disable_tiling()
        untiled = vae.decode(z, return_dict=False)[0]
        vae.enable_tiling()
        tiled = vae.decode(z, return_dict=False)[0]
    f = 2 ** (n - 1)
    assert tiled.shape == (c["batch"], 3, c["h"] * f, c["w"] * f), tiled.shape
    np.save(os.path.join(d, "latents.npy"), latents.numpy())
    np.save(os.path.join(d, "image_tiled.npy"), to_image(tiled))
    np.save(os.path.join(d, "image_untiled.npy"), to_image(untiled))
    spec = dict(name=c["name"], seed=c["seed"], batch=c["batch"], h=c["h"], w=c["w"], factor=f,
                tile_sample_min_size=vae.tile_sample_min_size,
                tile_latent_min_size=vae.tile_latent_min_size,
                tile_overlap_factor=vae.tile_overlap_factor,
                overlap_size=int(vae.tile_latent_min_size * (1 - vae.tile_overlap_factor)),
                blend_extent=int(vae.tile_sample_min_size * vae.tile_overlap_factor),
                row_limit=vae.tile_sample_min_size
                - int(vae.tile_sample_min_size * vae.tile_overlap_factor))
    with open(os.path.join(d, "case.json"), "w") as fh:
        json.dump(spec, fh, indent=1)
    img_t, img_u = to_image(tiled), to_image(untiled)
    inside = float(((img_t > 0) & (img_t < 1)).mean())
    print(c["name"], "image", img_t.shape, "raw range [%.3f, %.3f]" % (tiled.min(), tiled.max()),
          "unclamped %.0f%%" % (100 * inside),
          "max |tiled - untiled| %.3e" % float(np.abs(img_t - img_u).max()), flush=True)


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "tests", "data", "vae_tiling")
    torch.set_num_threads(2)
    for c in CASES:
        make_case(c, out_dir)


if __name__ == "__main__":
    main()
