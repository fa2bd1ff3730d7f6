"""The DiT forward of upstream diffusers, eager and under torch.compile, at several sizes (GPU).

Issue 22's reference column: ZImageTransformer2DModel loaded from a Z-Image folder (normally the
full-size random-weight folder of `zimage make-random-model`) in bf16 on CUDA, called as
ZImagePipeline calls it (a list of [16, 1, H/8, W/8] latents, t, a list of caption features), with
caption features of the benchmark prompt's true token count (the prompt of
tools/diffusers_compare.py, chat template applied by the folder's tokenizer), so the sequence is
the one zimage's `bench` runs. torch.compile in its default mode with dynamic=False: every size
gets its own specialised graph (the compile of each size is timed apart, then medians of the
steady state). Only the transformer is loaded: no text encoder or VAE time is spent.

Beside each median: the board's energy per forward (NVML's energy counter over the timed calls:
the mean power between its first and last step inside them, times the calls' time, divided by
their number) and the median SM clock and mean power sampled every 10 ms, as `zimage
bench` reports them, so that the two stacks' forwards can be compared in joules at the board's
power limit. NVML is read through ctypes (libnvidia-ml.so.1, the driver's); without it the
columns are left out.

  python3 tools/diffusers_dit_bench.py --model DIR --sizes 1024,1536,2048 --json OUT.json
"""
import argparse
import ctypes
import json
import statistics
import threading
import time

import torch

PROMPT = ("A snow fairy with long silver hair in a blue dress standing in a snowy forest, "
          "anime style, soft lighting, intricate details, masterpiece")


def dump(results, path):
    with open(path, "w") as f:
        json.dump(results, f, indent=1)


class Nvml:
    """The board's energy counter, SM clock and power through the driver's NVML (ctypes)."""

    def __init__(self):
        self.h = None
        try:
            self.lib = ctypes.CDLL("libnvidia-ml.so.1")
            if self.lib.nvmlInit_v2() != 0:
                return
            p = torch.cuda.get_device_properties(0)
            bus = f"{p.pci_domain_id:08X}:{p.pci_bus_id:02X}:{p.pci_device_id:02X}.0".encode()
            h = ctypes.c_void_p()
            if (self.lib.nvmlDeviceGetHandleByPciBusId_v2(bus, ctypes.byref(h)) == 0 or
                    self.lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(h)) == 0):
                self.h = h
        except (OSError, AttributeError):
            self.h = None

    def energy_j(self):
        v = ctypes.c_ulonglong()
        if self.h is None or self.lib.nvmlDeviceGetTotalEnergyConsumption(self.h, ctypes.byref(v)):
            return None
        return v.value / 1000.0

    def sample(self):
        mhz, mw = ctypes.c_uint(), ctypes.c_uint()
        ok_c = self.lib.nvmlDeviceGetClockInfo(self.h, 1, ctypes.byref(mhz)) == 0  # NVML_CLOCK_SM
        ok_p = self.lib.nvmlDeviceGetPowerUsage(self.h, ctypes.byref(mw)) == 0
        return (mhz.value if ok_c else None, mw.value / 1000.0 if ok_p else None)


NVML = None


def median_ms(fn, warm, iters):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    nvml = NVML if NVML is not None and NVML.h is not None else None
    samples, steps, done = [], [], threading.Event()
    e0, w0 = (nvml.energy_j() if nvml else None), time.perf_counter()

    def sampler():  # (SM MHz, W) every 10 ms; the energy counter every 2 ms, kept when it moved
        last, tick = e0, 0
        while not done.wait(0.002):
            e = nvml.energy_j()
            if e is not None and e != last:
                last = e
                steps.append((time.perf_counter() - w0, e))
            tick += 1
            if tick % 5 == 0:
                samples.append(nvml.sample())

    th = threading.Thread(target=sampler) if nvml else None
    if th:
        th.start()
    ts = []
    for _ in range(iters):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
        ts.append(s.elapsed_time(e))
    r = {"median_ms": statistics.median(ts), "min_ms": min(ts), "max_ms": max(ts), "iters": iters}
    if th:
        done.set()
        th.join()
        e1, seconds = nvml.energy_j(), time.perf_counter() - w0
        mhz = [m for m, _ in samples if m is not None]
        watts = [w for _, w in samples if w is not None]
        if mhz:
            r["sm_mhz_median"] = statistics.median(mhz)
        # The counter moves in steps (~100 ms apart on an H100), so the window's two ends can be
        # a step off each: the power between its first and last step inside the window where
        # they span 0.1 s or more (as zimage bench's GpuSampler), else the window's difference.
        if len(steps) >= 2 and steps[-1][0] - steps[0][0] >= 0.1 and steps[-1][1] >= steps[0][1]:
            r["power_w_mean"] = (steps[-1][1] - steps[0][1]) / (steps[-1][0] - steps[0][0])
            r["joules_per_call"] = r["power_w_mean"] * seconds / iters
            r["energy_steps"] = len(steps)
        elif e0 is not None and e1 is not None and e1 > e0:  # the mean power from the counter
            r["joules_per_call"] = (e1 - e0) / iters
            r["power_w_mean"] = (e1 - e0) / seconds
        elif watts:  # no energy counter: the sampled power
            r["power_w_mean"] = statistics.fmean(watts)
    return r


def describe(r):
    extra = []
    if "sm_mhz_median" in r:
        extra.append(f"SM {r['sm_mhz_median']:.0f} MHz")
    if "power_w_mean" in r:
        extra.append(f"{r['power_w_mean']:.0f} W")
    if "joules_per_call" in r:
        extra.append(f"{r['joules_per_call']:.1f} J a run")
    return f"{r['median_ms']:.1f} ms" + (f" ({', '.join(extra)})" if extra else "")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--sizes", default="1024,1536,2048")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--json", required=True)
    a = ap.parse_args()
    global NVML
    NVML = Nvml()
    from diffusers import ZImageTransformer2DModel
    from transformers import AutoTokenizer
    import diffusers

    tok = AutoTokenizer.from_pretrained(f"{a.model}/tokenizer")
    templ = tok.apply_chat_template([{"role": "user", "content": PROMPT}], tokenize=False,
                                    add_generation_prompt=True, enable_thinking=True)
    n_tok = int(tok([templ], return_tensors="pt").input_ids.shape[1])
    dit = ZImageTransformer2DModel.from_pretrained(f"{a.model}/transformer",
                                                   torch_dtype=torch.bfloat16).to("cuda").eval()
    R = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
         "diffusers": diffusers.__version__, "prompt_tokens": n_tok, "sizes": {}}
    g = torch.Generator("cuda").manual_seed(0)
    cap = torch.randn(n_tok, dit.config.cap_feat_dim, device="cuda", dtype=torch.bfloat16,
                      generator=g)
    t = torch.tensor([0.5], device="cuda")
    sizes = [int(s) for s in a.sizes.split(",")]
    with torch.inference_mode():
        for res in sizes:
            lat = [torch.randn(16, 1, res // 8, res // 8, device="cuda", dtype=torch.bfloat16,
                               generator=g)]
            torch.cuda.reset_peak_memory_stats()
            r = median_ms(lambda: dit(lat, t, [cap], return_dict=False), 2, a.iters)
            r["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
            R["sizes"].setdefault(str(res), {})["eager"] = r
            print(f"eager {res}: {describe(r)}", flush=True)
            dump(R, a.json)  # after every row: a run cut short keeps what it measured
        if not a.no_compile:
            cdit = torch.compile(dit, dynamic=False)
            for res in sizes:
                lat = [torch.randn(16, 1, res // 8, res // 8, device="cuda", dtype=torch.bfloat16,
                                   generator=g)]
                torch.cuda.synchronize()
                t0 = time.time()
                cdit(lat, t, [cap], return_dict=False)
                torch.cuda.synchronize()
                first = time.time() - t0
                r = median_ms(lambda: cdit(lat, t, [cap], return_dict=False), 2, a.iters)
                r["first_call_s"] = first
                R["sizes"][str(res)]["compile"] = r
                print(f"compile {res}: {describe(r)} (first call {first:.0f} s)", flush=True)
                dump(R, a.json)
    dump(R, a.json)


if __name__ == "__main__":
    main()
