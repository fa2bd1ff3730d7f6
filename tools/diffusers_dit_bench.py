"""The DiT forward of upstream diffusers, eager and under torch.compile, at several sizes (GPU).

Issue 22's reference column: ZImageTransformer2DModel loaded from a Z-Image folder (normally the
full-size random-weight folder of `zimage make-random-model`) in bf16 on CUDA, called as
ZImagePipeline calls it (a list of [16, 1, H/8, W/8] latents, t, a list of caption features), with
caption features of the benchmark prompt's true token count (the prompt of
tools/diffusers_compare.py, chat template applied by the folder's tokenizer), so the sequence is
the one zimage's `bench` runs. torch.compile in its default mode with dynamic=False: every size
gets its own specialised graph (the compile of each size is timed apart, then medians of the
steady state). Only the transformer is loaded: no text encoder or VAE time is spent.

  python3 tools/diffusers_dit_bench.py --model DIR --sizes 1024,1536,2048 --json OUT.json
"""
import argparse
import json
import statistics
import time

import torch

PROMPT = ("A snow fairy with long silver hair in a blue dress standing in a snowy forest, "
          "anime style, soft lighting, intricate details, masterpiece")


def dump(results, path):
    with open(path, "w") as f:
        json.dump(results, f, indent=1)


def median_ms(fn, warm, iters):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
        ts.append(s.elapsed_time(e))
    return {"median_ms": statistics.median(ts), "min_ms": min(ts), "max_ms": max(ts), "iters": iters}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--sizes", default="1024,1536,2048")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--json", required=True)
    a = ap.parse_args()
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
            print(f"eager {res}: {r['median_ms']:.1f} ms", flush=True)
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
                print(f"compile {res}: {r['median_ms']:.1f} ms (first call {first:.0f} s)",
                      flush=True)
                dump(R, a.json)
    dump(R, a.json)


if __name__ == "__main__":
    main()
