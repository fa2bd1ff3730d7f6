"""diffusers' low-memory modes, measured on the GPU machine beside `zimage bench --vram-budget`.

Loads the Z-Image folder with diffusers in bf16 and times one 1024² image (8 steps, guidance 0) with
`enable_model_cpu_offload()` and with `enable_sequential_cpu_offload()`, each in a fresh pipeline:
the median of --iters images after one warm-up, torch's peak allocated bytes and the driver-side
peak (total - free, sampled every millisecond on a thread, the CUDA context included).

  python3 tools/diffusers_offload.py --model DIR --json OUT.json [--iters 2] [--modes model,sequential]
"""
import argparse
import json
import statistics
import threading
import time

import torch

PROMPT = ("A snow fairy with long silver hair in a blue dress standing in a snowy forest, "
          "anime style, soft lighting, intricate details, masterpiece")


class DriverPeak:
    def __init__(self):
        self.peak = 0
        self.stop = False
        self.t = threading.Thread(target=self.loop, daemon=True)
        self.t.start()

    def loop(self):
        while not self.stop:
            free, total = torch.cuda.mem_get_info()
            self.peak = max(self.peak, total - free)
            time.sleep(0.001)

    def close(self):
        self.stop = True
        self.t.join()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--json", required=True)
    ap.add_argument("--iters", type=int, default=2)
    ap.add_argument("--modes", default="model,sequential")
    a = ap.parse_args()
    from diffusers import ZImagePipeline
    rows = []
    for mode in a.modes.split(","):
        pipe = ZImagePipeline.from_pretrained(a.model, torch_dtype=torch.bfloat16)
        if mode == "model":
            pipe.enable_model_cpu_offload()
        else:
            pipe.enable_sequential_cpu_offload()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        peak = DriverPeak()

        def one():
            g = torch.Generator("cpu").manual_seed(42)
            pipe(PROMPT, height=1024, width=1024, num_inference_steps=8, guidance_scale=0.0,
                 generator=g, output_type="np")
            torch.cuda.synchronize()

        t0 = time.time()
        one()
        first = time.time() - t0
        ts = []
        for _ in range(a.iters):
            t0 = time.time()
            one()
            ts.append(time.time() - t0)
        peak.close()
        row = {"mode": f"enable_{mode}_cpu_offload", "first_image_s": first,
               "image_s": statistics.median(ts), "torch_peak_allocated_gib":
               torch.cuda.max_memory_allocated() / 2**30, "driver_peak_gib": peak.peak / 2**30}
        print(json.dumps(row), flush=True)
        rows.append(row)
        del pipe
        torch.cuda.empty_cache()
    with open(a.json, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(0), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
