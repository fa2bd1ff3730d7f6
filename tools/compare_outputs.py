"""Parity of zimage against diffusers on the same model folder, prompt and seed (GPU machine).

  python3 tools/compare_outputs.py --zimage-dit DUMP/dit_out.step0.npy \
      --diffusers-dit OUT/diffusers_dit_out_step0.npy --zimage-png img.png \
      --diffusers-image OUT/diffusers_image.npy [--json OUT/parity.json]
Prints cosine similarity, relative L2 error and max |diff| of the raw DiT output of step 0, and the
PSNR of zimage's 8-bit image against diffusers' (rounded the same way, round(255*x)).
"""
import argparse
import json

import numpy as np
from PIL import Image


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--zimage-dit", required=True)
    ap.add_argument("--diffusers-dit", required=True)
    ap.add_argument("--zimage-png", required=True)
    ap.add_argument("--diffusers-image", required=True)
    ap.add_argument("--json")
    a = ap.parse_args()
    z = np.load(a.zimage_dit).astype(np.float64).reshape(-1)
    d = np.load(a.diffusers_dit).astype(np.float64).reshape(-1)
    R = {"dit_numel": int(z.size)}
    if z.size != d.size:
        R["error"] = f"DiT output sizes differ: {z.size} vs {d.size}"
    else:
        R["dit_cosine"] = float(z @ d / (np.linalg.norm(z) * np.linalg.norm(d)))
        R["dit_rel_l2"] = float(np.linalg.norm(z - d) / np.linalg.norm(d))
        R["dit_max_abs_diff"] = float(np.abs(z - d).max())
        R["dit_ref_max_abs"] = float(np.abs(d).max())
    zi = np.asarray(Image.open(a.zimage_png).convert("RGB")).astype(np.float64)
    di = np.round(np.load(a.diffusers_image)[0] * 255.0)
    if zi.shape != di.shape:
        R["image_error"] = f"image shapes differ: {zi.shape} vs {di.shape}"
    else:
        mse = float(np.mean((zi - di) ** 2))
        R["image_psnr_db"] = float("inf") if mse == 0 else float(10 * np.log10(255.0 ** 2 / mse))
        R["image_max_abs_diff"] = float(np.abs(zi - di).max())
        R["image_mean_abs_diff"] = float(np.abs(zi - di).mean())
    print(json.dumps(R, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(R, f, indent=1)


if __name__ == "__main__":
    main()
