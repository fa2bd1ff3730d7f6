"""The Python package on the GPU machine: zimage.Engine against `zimage generate` on the same
device (pixels equal), and zimage.diffusers.ZImagePipeline against stock diffusers on the same
folder and generator (image PSNR), with the time per image of each.

  PYTHONPATH=build/ci/python python3 tools/python_gpu_check.py --model DIR --zimage build/ci/zimage \
      [--device cuda] [--size 1024] [--steps 8] [--seed 42] [--no-diffusers] [--json OUT.json]
"""
import argparse
import json
import os
import subprocess
import tempfile
import time

import numpy as np
from PIL import Image

import zimage
from zimage.diffusers import ZImagePipeline

PROMPT = "a red fox in snow, golden hour, photograph"


def psnr(a, b):
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--zimage", required=True, help="the zimage program of the same build")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--no-diffusers", action="store_true")
    ap.add_argument("--json")
    a = ap.parse_args()
    R = {}
    engine = zimage.Engine(a.model, a.device)
    R["info"] = engine.info()
    kw = dict(width=a.size, height=a.size, steps=a.steps, seed=a.seed, output_type="np")
    engine.generate(PROMPT, **kw)  # warm-up (CUDA graphs, plans)
    t = time.perf_counter()
    ours = engine.generate(PROMPT, **kw)[0]
    R["engine_s_per_image"] = time.perf_counter() - t
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "cli.png")
        subprocess.run([a.zimage, "generate", "--model", a.model, "--device", a.device,
                        "--prompt", PROMPT, "--width", str(a.size), "--height", str(a.size),
                        "--steps", str(a.steps), "--seed", str(a.seed), "--output", out,
                        "--quiet"], check=True)
        cli = np.asarray(Image.open(out).convert("RGB"))
    R["engine_vs_cli_max_diff"] = int(np.abs(ours.astype(int) - cli.astype(int)).max())
    pipe = ZImagePipeline.from_pretrained(a.model, device=a.device)
    got = pipe(PROMPT, height=a.size, width=a.size, num_inference_steps=a.steps,
               guidance_scale=0.0, generator=a.seed, output_type="np").images[0]
    R["pipeline_vs_engine_max_diff"] = int(np.abs(np.round(got * 255) - ours).max())
    if not a.no_diffusers:
        import torch
        from diffusers import ZImagePipeline as Stock

        stock = Stock.from_pretrained(a.model, torch_dtype=torch.bfloat16).to("cuda")
        call = dict(height=a.size, width=a.size, num_inference_steps=a.steps,
                    guidance_scale=0.0, output_type="np")
        stock(PROMPT, generator=torch.Generator("cpu").manual_seed(a.seed), **call)  # warm-up
        torch.cuda.synchronize()
        t = time.perf_counter()
        ref = stock(PROMPT, generator=torch.Generator("cpu").manual_seed(a.seed), **call).images[0]
        torch.cuda.synchronize()
        R["diffusers_s_per_image"] = time.perf_counter() - t
        ref8 = np.round(np.clip(ref, 0, 1) * 255).astype(np.uint8)
        R["pipeline_vs_diffusers_psnr_db"] = psnr(np.round(got * 255), ref8)
    print(json.dumps(R, indent=1, default=str))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(R, f, indent=1, default=str)
    ok = R["engine_vs_cli_max_diff"] == 0 and R["pipeline_vs_engine_max_diff"] == 0
    ok = ok and R.get("pipeline_vs_diffusers_psnr_db", 99) >= 45
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
