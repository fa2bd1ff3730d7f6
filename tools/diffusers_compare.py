"""Reference side of zimage's speed and parity comparison (runs on the GPU machine).

Loads a Z-Image model folder (normally the full-size random-weight folder written by
`zimage make-random-model`) with upstream diffusers in bf16 on CUDA, exactly as a user would, and
measures what zimage's `bench` measures, on the same GPU in the same session:
  load (from_pretrained + .to('cuda')), text encoder at true length, one DiT forward (1024² and
  512², batch 1 and 4), VAE decode, the whole pipeline (8 DiT forwards, guidance 0) for 1 and 4
  images, peak GPU memory. It also saves the raw DiT output of step 0 and the final image of a
  seeded run (torch.Generator('cpu').manual_seed(seed), as zimage draws its noise) so that
  tools/compare_outputs.py can state cosine similarity and PSNR against zimage's dumps.

  python3 tools/diffusers_compare.py --model DIR --out OUTDIR [--size 1024] [--skip-batch4]
                                     [--compile] [--skip-eager]
Writes OUTDIR/diffusers.json, OUTDIR/diffusers_dit_out_step0.npy, OUTDIR/diffusers_image.npy.
Needs torch, transformers and diffusers (carry the diffusers wheel; see docs/BENCHMARKS.md).
"""
import argparse
import json
import os
import statistics
import time

import numpy as np
import torch

PROMPT = ("A snow fairy with long silver hair in a blue dress standing in a snowy forest, "
          "anime style, soft lighting, intricate details, masterpiece")


def timed(fn, warm=1, iters=3):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        s = torch.cuda.Event(enable_timing=True)
        e = torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
        ts.append(s.elapsed_time(e))
    return {"median_ms": statistics.median(ts), "min_ms": min(ts), "max_ms": max(ts)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--skip-batch4", action="store_true")
    ap.add_argument("--compile", action="store_true",
                    help="then torch.compile the transformer and time its forward and the whole "
                         "image again (the first, compiling call reported on its own)")
    ap.add_argument("--skip-eager", action="store_true",
                    help="only the load, the parity run and (with --compile) the compiled rows")
    a = ap.parse_args()
    from diffusers import ZImagePipeline

    R = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "prompt": PROMPT}
    import diffusers
    R["diffusers"] = diffusers.__version__
    torch.cuda.synchronize()
    t0 = time.time()
    pipe = ZImagePipeline.from_pretrained(a.model, torch_dtype=torch.bfloat16).to("cuda")
    torch.cuda.synchronize()
    R["load_s"] = time.time() - t0
    pipe.set_progress_bar_config(disable=True)

    # Parity run: raw DiT output of step 0 and the final image, CPU generator like zimage.
    outs = []
    hook = pipe.transformer.register_forward_hook(
        lambda m, i, o: outs.append(torch.stack([v.float() for v in o[0]]).cpu()))
    with torch.inference_mode():
        img = pipe(PROMPT, height=a.size, width=a.size, num_inference_steps=a.steps, guidance_scale=0.0,
                   generator=torch.Generator("cpu").manual_seed(a.seed), output_type="np").images
    hook.remove()
    np.save(os.path.join(a.out, "diffusers_dit_out_step0.npy"), outs[0].numpy())
    np.save(os.path.join(a.out, "diffusers_image.npy"), img.astype(np.float32))
    R["image_finite"] = bool(np.isfinite(img).all())
    R["dit_out_step0_std"] = float(outs[0].std())

    if not a.skip_eager:
        with torch.inference_mode():
            tok = pipe.tokenizer
            templ = tok.apply_chat_template([{"role": "user", "content": PROMPT}], tokenize=False,
                                            add_generation_prompt=True, enable_thinking=True)
            ids = tok([templ], return_tensors="pt").input_ids.to("cuda")
            R["prompt_tokens"] = int(ids.shape[1])
            R["text_encoder_true_len"] = timed(lambda: pipe.text_encoder(input_ids=ids, output_hidden_states=True),
                                               2, 5)
            R["encode_prompt_pipeline"] = timed(lambda: pipe.encode_prompt(PROMPT, device="cuda",
                                                                          do_classifier_free_guidance=False), 2, 5)
            cap = pipe.encode_prompt(PROMPT, device="cuda", do_classifier_free_guidance=False)[0][0]
            t = torch.tensor([0.5], device="cuda")
            for res in (512, 1024):
                for bs in ((1,) if a.skip_batch4 else (1, 4)):
                    lat = [torch.randn(16, 1, res // 8, res // 8, device="cuda", dtype=torch.bfloat16)
                           for _ in range(bs)]
                    torch.cuda.reset_peak_memory_stats()
                    r = timed(lambda: pipe.transformer(lat, t.expand(bs), [cap] * bs, return_dict=False), 2, 5)
                    r["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
                    R[f"dit_forward_{res}_bs{bs}"] = r
            for res in (512, 1024):
                z = torch.randn(1, 16, res // 8, res // 8, device="cuda", dtype=torch.bfloat16)
                torch.cuda.reset_peak_memory_stats()
                r = timed(lambda: pipe.vae.decode(z, return_dict=False), 1, 3)
                r["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
                R[f"vae_decode_{res}"] = r
            for bs in ((1,) if a.skip_batch4 else (1, 4)):
                gen = torch.Generator("cpu").manual_seed(a.seed)
                run = lambda: pipe([PROMPT] * bs, height=a.size, width=a.size, num_inference_steps=a.steps,
                                   guidance_scale=0.0, generator=gen, output_type="pt")
                torch.cuda.reset_peak_memory_stats()
                r = timed(run, 1, 3)
                r["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
                R[f"pipeline_{a.size}_bs{bs}"] = r
    if a.compile:
        # torch.compile (default mode) of the transformer, as users and SGLang run it: the first
        # call compiles (timed on its own), then medians of the steady state.
        with torch.inference_mode():
            pipe.transformer = torch.compile(pipe.transformer)
            cap = pipe.encode_prompt(PROMPT, device="cuda", do_classifier_free_guidance=False)[0][0]
            t = torch.tensor([0.5], device="cuda")
            lat = [torch.randn(16, 1, a.size // 8, a.size // 8, device="cuda", dtype=torch.bfloat16)]
            torch.cuda.synchronize()
            t0 = time.time()
            pipe.transformer(lat, t, [cap], return_dict=False)
            torch.cuda.synchronize()
            R["compile_first_call_s"] = time.time() - t0
            R[f"compiled_dit_forward_{a.size}_bs1"] = timed(
                lambda: pipe.transformer(lat, t, [cap], return_dict=False), 2, 5)
            gen = torch.Generator("cpu").manual_seed(a.seed)
            run = lambda: pipe([PROMPT], height=a.size, width=a.size, num_inference_steps=a.steps,
                               guidance_scale=0.0, generator=gen, output_type="pt")
            torch.cuda.reset_peak_memory_stats()
            r = timed(run, 1, 3)
            r["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
            R[f"compiled_pipeline_{a.size}_bs1"] = r
    R["process_peak_reserved_gib"] = torch.cuda.max_memory_reserved() / 2**30
    with open(os.path.join(a.out, "diffusers.json"), "w") as f:
        json.dump(R, f, indent=1)
    print(json.dumps(R, indent=1), flush=True)


if __name__ == "__main__":
    main()
