"""Reference side of `zimage bench --pipeline ...`: diffusers' image-conditioned pipelines, timed.

Runs upstream diffusers (0.42.1) on the same model folder and ControlNet folder as zimage, with the
same input files (zimage bench --inputs-dir DIR writes init.png, mask.png and control.png there),
and measures per pipeline what zimage's rows measure:
  t2i                 ZImagePipeline (for reference)
  img2img             ZImageImg2ImgPipeline, strength (default 0.6)
  inpaint             ZImageInpaintPipeline, the same strength
  controlnet          ZImageControlNetPipeline + ZImageControlNetModel.from_pretrained
  controlnet-inpaint  ZImageControlNetInpaintPipeline (init image, mask, control image)
at --size² (1024), --steps (8), guidance 0, the zimage prompt, seed 42 (torch.Generator('cpu'),
as zimage draws), controlnet_conditioning_scale 0.75: one warm-up call, then the median of --iters
calls, each synchronised (torch.cuda.synchronize) before and after, timed on the host clock as
zimage times its rows. Every call is a whole request as a user makes it: PIL images in, PIL image
out (output_type "pil"; zimage returns RGB8 too). Memory per pipeline: torch.cuda.max_memory_
allocated / max_memory_reserved (reset before each pipeline) and the driver's view (total - free
from torch.cuda.mem_get_info, sampled every millisecond on a thread during the warm-up call, CUDA
context included; the thread sleeps through the timed calls so that it does not compete for the
GIL), the figure zimage's `driver peak` column reports (zimage samples from a C++ thread over the
warm-up and the timed images). The pipelines share one set of modules (constructed from base.components);
the ControlNet is loaded after the rows without it, as zimage does, so their memory excludes it.

  python3 tools/diffusers_pipelines_bench.py --model DIR --controlnet DIR --inputs-dir DIR
      [--pipelines t2i,img2img,inpaint,controlnet,controlnet-inpaint] [--size 1024] [--steps 8]
      [--strength 0.6] [--iters 3] [--device cuda|cpu] [--dtype bf16|fp32] [--compile]
      [--json OUT.json]
--compile: torch.compile of the transformer (the ControlNet stays eager: it shares the
transformer's embedders and refiners); the warm-up call then compiles and is reported as
first_call_s. --device cpu with the tiny golden models checks
that the script runs (no memory figures on the CPU).
"""
import argparse
import json
import os
import statistics
import threading
import time

import torch

PROMPT = ("A snow fairy with long silver hair in a blue dress standing in a snowy forest, "
          "anime style, soft lighting, intricate details, masterpiece")
ORDER = ["t2i", "img2img", "inpaint", "controlnet", "controlnet-inpaint"]
GIB = float(2 ** 30)


class DriverPeak:
    """Samples total - free device memory every millisecond (the driver's view)."""

    def __init__(self, device):
        self.on = device.startswith("cuda")
        self.peak = 0
        self.stop = False
        self.active = threading.Event()  # cleared: the thread blocks (no GIL) until set
        if self.on:
            self.thread = threading.Thread(target=self.loop, daemon=True)
            self.thread.start()

    def loop(self):
        while not self.stop:
            if not self.active.wait(timeout=0.2):
                continue
            free, total = torch.cuda.mem_get_info()
            self.peak = max(self.peak, total - free)
            time.sleep(0.001)

    def reset(self):
        self.peak = 0

    def close(self):
        self.stop = True
        if self.on:
            self.thread.join()


def sync(device):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--controlnet", default="")
    ap.add_argument("--inputs-dir", required=True, help="init.png, mask.png, control.png (zimage bench --inputs-dir)")
    ap.add_argument("--pipelines", default=",".join(ORDER))
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--strength", type=float, default=0.6)
    ap.add_argument("--control-scale", type=float, default=0.75)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    ap.add_argument("--output-type", default="pil", choices=["pil", "np", "pt"])
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    todo = [p for p in ORDER if p in a.pipelines.split(",")]
    unknown = set(a.pipelines.split(",")) - set(ORDER)
    if unknown:
        raise SystemExit("unknown pipelines: %s (known: %s)" % (sorted(unknown), ", ".join(ORDER)))
    if any(p.startswith("controlnet") for p in todo) and not a.controlnet:
        raise SystemExit("--controlnet DIR is needed for the controlnet rows")

    import diffusers
    from diffusers import (ZImageControlNetInpaintPipeline, ZImageControlNetModel, ZImageControlNetPipeline,
                           ZImageImg2ImgPipeline, ZImageInpaintPipeline, ZImagePipeline)
    from diffusers.utils import load_image

    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    cuda = a.device.startswith("cuda")
    R = {"diffusers": diffusers.__version__, "torch": torch.__version__, "device": a.device,
         "device_name": torch.cuda.get_device_name(0) if cuda else "cpu", "dtype": a.dtype,
         "size": a.size, "steps": a.steps, "strength": a.strength, "control_scale": a.control_scale,
         "iters": a.iters, "compile": a.compile, "output_type": a.output_type, "prompt": PROMPT}
    inputs = {k: os.path.join(a.inputs_dir, f) for k, f in
              (("init_image", "init.png"), ("mask", "mask.png"), ("control_image", "control.png"))}
    R["inputs"] = inputs
    init, mask, control = (load_image(inputs[k]) for k in ("init_image", "mask", "control_image"))

    peak = DriverPeak(a.device)
    sync(a.device)
    t0 = time.perf_counter()
    base = ZImagePipeline.from_pretrained(a.model, torch_dtype=dtype).to(a.device)
    sync(a.device)
    R["load_s"] = time.perf_counter() - t0
    base.set_progress_bar_config(disable=True)
    if a.compile:
        base.transformer = torch.compile(base.transformer)
    if cuda:
        R["driver_gib_after_load"] = (lambda f, t: (t - f) / GIB)(*torch.cuda.mem_get_info())

    common = dict(height=a.size, width=a.size, num_inference_steps=a.steps, guidance_scale=0.0,
                  output_type=a.output_type)
    cn = None
    rows = []
    for name in todo:
        if name.startswith("controlnet") and cn is None:
            sync(a.device)
            t0 = time.perf_counter()
            cn = ZImageControlNetModel.from_pretrained(a.controlnet, torch_dtype=dtype).to(a.device)
            sync(a.device)
            R["controlnet_load_s"] = time.perf_counter() - t0
            R["controlnet_config"] = dict(cn.config)
        # The same modules in every pipeline (no copies, no casts: from_pipe would cast to its
        # default float32).
        c = {k: base.components[k] for k in ("scheduler", "vae", "text_encoder", "tokenizer", "transformer")}
        kw = {}
        if name == "t2i":
            pipe = base
        elif name == "img2img":
            pipe = ZImageImg2ImgPipeline(**c)
            kw = dict(image=init, strength=a.strength)
        elif name == "inpaint":
            pipe = ZImageInpaintPipeline(**c)
            kw = dict(image=init, mask_image=mask, strength=a.strength)
        else:
            cls = ZImageControlNetPipeline if name == "controlnet" else ZImageControlNetInpaintPipeline
            pipe = cls(**c, controlnet=cn)
            kw = dict(control_image=control, controlnet_conditioning_scale=a.control_scale)
            if name == "controlnet-inpaint":
                kw.update(image=init, mask_image=mask)
        dtypes = {m.dtype for m in (pipe.transformer, pipe.vae, pipe.text_encoder)}
        assert dtypes == {dtype}, "%s: modules in %s, expected %s" % (name, dtypes, dtype)
        pipe.set_progress_bar_config(disable=True)
        steps_run = []
        cb = lambda p, i, t, d: (steps_run.append(i), d)[1]

        def call():
            steps_run.clear()
            with torch.inference_mode():
                return pipe(PROMPT, generator=torch.Generator("cpu").manual_seed(a.seed),
                            callback_on_step_end=cb, **common, **kw).images

        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        peak.reset()
        peak.active.set()
        sync(a.device)
        t0 = time.perf_counter()
        call()
        sync(a.device)
        row = {"pipeline": name, "first_call_s": time.perf_counter() - t0}
        peak.active.clear()  # the timed calls run without the sampling thread taking the GIL
        ts = []
        for _ in range(a.iters):
            sync(a.device)
            t0 = time.perf_counter()
            call()
            sync(a.device)
            ts.append(time.perf_counter() - t0)
        row.update(denoising_steps=len(steps_run), image_s=statistics.median(ts), image_s_min=min(ts),
                   image_s_max=max(ts))
        if cuda:
            row.update(driver_peak_gib=peak.peak / GIB,
                       max_memory_allocated_gib=torch.cuda.max_memory_allocated() / GIB,
                       max_memory_reserved_gib=torch.cuda.max_memory_reserved() / GIB)
        print("%s: %.3f s / image (first call %.2f s, %d denoising steps)%s" % (
            name, row["image_s"], row["first_call_s"], row["denoising_steps"],
            ", driver peak %.2f GiB, allocated %.2f GiB" % (row["driver_peak_gib"], row["max_memory_allocated_gib"])
            if cuda else ""), flush=True)
        rows.append(row)
    peak.close()
    R["pipelines"] = rows
    if a.json:
        with open(a.json, "w") as f:
            json.dump(R, f, indent=1)
    print(json.dumps(R, indent=1), flush=True)


if __name__ == "__main__":
    main()
