#!/usr/bin/env python3
"""A stock diffusers ZImagePipeline with zimage's drop-in transformer against the stock one.

    python3 tools/drop_in_transformer_check.py --model DIR [--device cuda] [--dtype bf16]
        [--size 1024] [--steps 8] [--runs 3] [--json out.json]

1. The stock pipeline runs once with its own transformer; every DiT call's inputs and outputs
   are kept (hooked on pipe.transformer.forward).
2. The drop-in (zimage.torch.ZImageTransformer2DModel.from_pretrained(DIR/transformer)) runs on
   exactly those inputs: the DiT cosine and max |diff| per step (the issue asks cosine >= 0.9998
   on the full-size random folder).
3. `pipe.transformer = drop_in`, the same generator: the image against the stock image (PSNR, the
   issue asks >= 45 dB), and the time per image and per DiT call of both (after a warm-up run).

DIR: a diffusers Z-Image folder (e.g. `zimage make-random-model --out DIR` at full size, or a
golden tiny model build/<preset>/golden/v_turbo/model with --device cpu --dtype f32 --size 32).
Exits 1 when a bound fails.
"""

import argparse
import json
import math
import sys
import time

import numpy as np
import torch
from diffusers import ZImagePipeline

import zimage.torch


def sync(device):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return math.inf if mse == 0 else 10 * math.log10(1.0 / mse)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "f32"])
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--guidance", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--prompt", default="a red fox in snow, photo")
    ap.add_argument("--min-cosine", type=float, default=0.9998)
    ap.add_argument("--min-psnr", type=float, default=45.0)
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float32

    pipe = ZImagePipeline.from_pretrained(a.model, torch_dtype=dtype).to(a.device)
    stock = pipe.transformer
    calls = []  # (x, t, cap, out) of every stock DiT call, on the host

    orig_forward = stock.forward

    def recording_forward(x, t, cap_feats, *args, **kwargs):
        out = orig_forward(x, t, cap_feats, *args, **kwargs)
        res = out[0] if isinstance(out, tuple) else out.sample
        calls.append(([v.detach().clone() for v in x], t.detach().clone(),
                      [c.detach().clone() for c in cap_feats], [r.detach().float().cpu() for r in res]))
        return out

    def generate():
        g = torch.Generator("cpu").manual_seed(a.seed)
        sync(a.device)
        t0 = time.perf_counter()
        img = pipe(a.prompt, height=a.size, width=a.size, num_inference_steps=a.steps,
                   guidance_scale=a.guidance, generator=g, output_type="np").images
        sync(a.device)
        return img, time.perf_counter() - t0

    stock.forward = recording_forward
    stock_img, _ = generate()
    stock.forward = orig_forward

    drop_in = zimage.torch.ZImageTransformer2DModel.from_pretrained(
        a.model + "/transformer", device=a.device, precision=a.dtype)
    print(f"drop-in: {drop_in!r}")

    # The DiT on the stock run's own inputs.
    report = {"steps": []}
    worst_cos = 1.0
    for k, (x, t, cap, ref) in enumerate(calls):
        got = drop_in(x, t, cap, return_dict=False)[0]
        g = torch.cat([v.float().cpu().reshape(-1) for v in got])
        r = torch.cat([v.reshape(-1) for v in ref])
        cos = torch.nn.functional.cosine_similarity(g.double(), r.double(), dim=0).item()
        mx = (g - r).abs().max().item()
        worst_cos = min(worst_cos, cos)
        report["steps"].append({"step": k, "cosine": cos, "max_abs": mx})
        print(f"  DiT step {k}: cosine {cos:.6f}, max|diff| {mx:.3e}")

    # Timing: the DiT call alone on the first step's inputs, then whole images.
    def time_dit(model, n=5):
        x, t, cap, _ = calls[0]
        model(x, t, cap, return_dict=False)
        sync(a.device)
        t0 = time.perf_counter()
        for _ in range(n):
            model(x, t, cap, return_dict=False)
        sync(a.device)
        return (time.perf_counter() - t0) / n

    with torch.no_grad():
        report["dit_s_stock"] = time_dit(stock)
        report["dit_s_zimage"] = time_dit(drop_in)

    stock_times = [generate()[1] for _ in range(a.runs)]
    pipe.transformer = drop_in
    zimage_img, _ = generate()  # warm-up (records the CUDA graph)
    zimage_times = [generate()[1] for _ in range(a.runs)]
    p = psnr(stock_img, zimage_img)
    report.update({
        "worst_dit_cosine": worst_cos, "image_psnr_db": p,
        "image_max_abs": float(np.abs(stock_img.astype(np.float64) - zimage_img).max()),
        "s_per_image_stock": min(stock_times), "s_per_image_zimage": min(zimage_times),
    })
    report["speedup_image"] = report["s_per_image_stock"] / report["s_per_image_zimage"]
    report["speedup_dit"] = report["dit_s_stock"] / report["dit_s_zimage"]
    print(json.dumps(report, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)
    ok = worst_cos >= a.min_cosine and p >= a.min_psnr
    print(("PASS" if ok else "FAIL") + f": DiT cosine {worst_cos:.6f} (>= {a.min_cosine}), "
          f"image PSNR {p:.2f} dB (>= {a.min_psnr})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
