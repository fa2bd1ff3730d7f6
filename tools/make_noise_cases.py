#!/usr/bin/env python3
"""Writes PyTorch reference values for the CPU-noise and scheduler tests.

Why: zimage reproduces `torch.randn(..., generator=torch.Generator('cpu').manual_seed(s))` and the
diffusers Z-Image sigma schedule bit-for-bit (or within 1e-6); the C++ tests need the real torch
values, but torch is too big for the build machine. Run this where torch exists (the GPU machine):

    OUT=/some/dir python3 tools/make_noise_cases.py
    cp $OUT/noise_cases.json.gz tests/data/noise/

Output: $OUT/noise_cases.json.gz, a gzip'd JSON object:
  torch_version, cpu_capability
  noise: list of {name, seed, draws: [{shape, n, values | (index, values), sum, sumsq}]}
         (consecutive draws of one case come from one generator; large draws keep a sample of
          values, with `index` naming their flat positions, plus the float64 sum/sumsq of all)
  linspace: list of {n, start, end, values}   torch.linspace(1.0, 1/n, n) in float32
  schedules: list of {n, shift, mu, dynamic, sigmas, timesteps, t_model}
         the diffusers ZImagePipeline + FlowMatchEulerDiscreteScheduler arithmetic on torch/numpy
         (sigmas include the terminal 0)
Only torch and numpy are needed.
"""

import gzip
import json
import math
import os
import sys

import numpy as np
import torch


def f32_list(t):
    return [float(v) for v in t.reshape(-1).tolist()]


def draw_record(t, full_limit=1024):
    flat = t.reshape(-1).to(torch.float64)
    rec = {"shape": list(t.shape), "n": int(t.numel()),
           "sum": float(flat.sum().item()), "sumsq": float((flat * flat).sum().item())}
    if t.numel() <= full_limit:
        rec["values"] = f32_list(t)
    else:
        n = t.numel()
        idx = sorted(set(list(range(64)) + list(range(0, n, 61)) + list(range(n - 64, n))))
        flat32 = t.reshape(-1)
        rec["index"] = idx
        rec["values"] = [float(flat32[i].item()) for i in idx]
    return rec


def noise_case(name, seed, shapes):
    g = torch.Generator("cpu").manual_seed(seed)
    draws = [draw_record(torch.randn(s, generator=g, dtype=torch.float32)) for s in shapes]
    return {"name": name, "seed": seed, "draws": draws}


def noise_cases():
    cases = []
    for n in range(1, 41):
        for seed in (0, 1234):
            cases.append(noise_case(f"n{n}_s{seed}", seed, [[n]]))
    for k in (3, 64, 250):
        for r in (0, 1, 4, 8, 9, 15):
            n = 16 * k + r
            cases.append(noise_case(f"n{n}", 1000 + n, [[n]]))
    cases.append(noise_case("latent_1x16x128x128", 42, [[1, 16, 128, 128]]))
    cases.append(noise_case("latent_2x16x4x6", 123, [[2, 16, 4, 6]]))
    cases.append(noise_case("seed_2p32_plus_17", 2**32 + 17, [[1, 16, 4, 4], [5]]))
    cases.append(noise_case("seed_17", 17, [[1, 16, 4, 4], [5]]))
    cases.append(noise_case("seed_2p64_minus_1", 2**64 - 1, [[37], [3]]))
    cases.append(noise_case("seed_123456789", 123456789, [[1000]]))
    # Consecutive draws from one generator: the MT19937 state and the cached double normal carry.
    cases.append(noise_case("twice_3_3", 7, [[3], [3]]))
    cases.append(noise_case("cache_survives_big_draw", 8, [[5], [20], [1]]))
    cases.append(noise_case("twice_latent", 9, [[1, 16, 8, 8], [1, 16, 8, 8]]))
    cases.append(noise_case("mixed_sizes", 10, [[17], [2], [33], [15], [16], [1]]))
    cases.append(noise_case("empty_then_small", 11, [[0], [4], [2, 0, 3], [4]]))
    return cases


def linspace_cases():
    out = []
    for n in list(range(1, 65)) + [100, 127, 128, 250, 1000]:
        t = torch.linspace(1.0, 1.0 / n, n)
        out.append({"n": n, "start": 1.0, "end": 1.0 / n, "values": f32_list(t)})
    return out


def calculate_shift(image_seq_len, base_seq_len=256, max_seq_len=4096, base_shift=0.5,
                    max_shift=1.15):
    m = (max_shift - base_shift) / (max_seq_len - base_seq_len)
    b = base_shift - m * base_seq_len
    return image_seq_len * m + b


def schedule(n, shift, dynamic, mu):
    # ZImagePipeline: sigmas = torch.linspace(1.0, 1/N, N).tolist(); scheduler.set_timesteps:
    sigmas = np.array(torch.linspace(1.0, 1.0 / n, n).tolist()).astype(np.float32)
    if dynamic:
        sigmas = math.exp(mu) / (math.exp(mu) + (1 / sigmas - 1) ** 1.0)
    else:
        sigmas = shift * sigmas / (1 + (shift - 1) * sigmas)
    sigmas = torch.from_numpy(sigmas).to(dtype=torch.float32)
    timesteps = sigmas * 1000
    sigmas = torch.cat([sigmas, torch.zeros(1)])
    t_model = (1000 - timesteps) / 1000
    return {"n": n, "shift": shift, "mu": mu, "dynamic": dynamic, "sigmas": f32_list(sigmas),
            "timesteps": f32_list(timesteps), "t_model": f32_list(t_model)}


def schedule_cases():
    out = []
    for n in list(range(1, 51)) + [100]:
        out.append(schedule(n, 3.0, False, 0.0))
    for n in (1, 4, 8, 9, 28, 50):
        out.append(schedule(n, 1.0, False, 0.0))
        out.append(schedule(n, 6.0, False, 0.0))
    for seq in (256, 1024, 4096, 16384):
        mu = calculate_shift(seq)
        for n in (4, 8, 28):
            rec = schedule(n, 1.0, True, mu)
            rec["image_seq_len"] = seq
            out.append(rec)
    return out


def main():
    out_dir = os.environ.get("OUT")
    if not out_dir:
        sys.exit("set OUT to the output directory")
    os.makedirs(out_dir, exist_ok=True)
    cap = torch.backends.cpu.get_cpu_capability() if hasattr(torch.backends, "cpu") else "?"
    doc = {"torch_version": torch.__version__, "cpu_capability": cap,
           "numpy_version": np.__version__, "noise": noise_cases(),
           "linspace": linspace_cases(), "schedules": schedule_cases()}
    path = os.path.join(out_dir, "noise_cases.json.gz")
    with gzip.open(path, "wt", encoding="utf-8", compresslevel=9) as f:
        json.dump(doc, f, separators=(",", ":"))
    print(f"wrote {path} ({os.path.getsize(path)} bytes): torch {torch.__version__}, cpu {cap}, "
          f"{len(doc['noise'])} noise cases, {len(doc['schedules'])} schedules")


if __name__ == "__main__":
    main()
