#!/usr/bin/env python3
"""Max per-channel pixel difference between images of two labels in one folder, matched by name:
<dir>/<labelA>_<size>_<seed>.png against <dir>/<labelB>_<size>_<seed>.png. Used to measure what
batching changes in a request's image (scripts/gpu_run.sh serve). Needs Pillow and NumPy."""
import glob
import os
import sys

import numpy as np
from PIL import Image


def main():
    folder, a, b = sys.argv[1:4]
    worst, n, differing = 0, 0, 0
    for pa in sorted(glob.glob(os.path.join(folder, f"{a}_*.png"))):
        pb = pa.replace(f"/{a}_", f"/{b}_")
        if not os.path.exists(pb):
            continue
        x = np.asarray(Image.open(pa).convert("RGB"), dtype=np.int16)
        y = np.asarray(Image.open(pb).convert("RGB"), dtype=np.int16)
        d = int(np.abs(x - y).max())
        worst = max(worst, d)
        differing += int((x != y).any(axis=-1).sum())
        n += 1
    print(f"{n} image pairs ({a} vs {b}): max |diff| {worst}/255, {differing} differing pixels")
    return 0 if n > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
