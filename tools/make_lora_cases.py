"""LoRA parity cases for zimage's `--lora`, made with upstream diffusers + PEFT (fp32, CPU).

Why: zimage merges LoRAs into the DiT weights at load time and claims the image diffusers makes
after `pipe.load_lora_weights(file)`. These cases are the evidence: random low-rank LoRAs for the
tiny golden model v_turbo in every common key format, and the images diffusers makes with them.

Base model: the v_turbo golden case (tests/data/golden/v_turbo.tar.gz), with its prompt, seed, size
and steps. Every LoRA is random (ranks 1..4, per-module alphas where the format has them) and
large enough to move the image visibly (the script prints max |image - base| per case).

Formats (file name -> key layout):
  peft.safetensors          transformer.<module>.lora_A/lora_B.weight, no alpha, every Linear of
                            the DiT (attention, feed-forward, adaLN, embedders, refiners, final
                            layer), mixed ranks, f32
  peft_alpha.safetensors    <module>.lora_A/lora_B.weight + <module>.alpha (no prefix), f32
  peft_meta.safetensors     what diffusers' own training scripts write: transformer.<module>...
                            plus the `lora_adapter_metadata` header entry (PEFT LoraConfig with
                            lora_alpha != r, rank_pattern and alpha_pattern), f32
  aitoolkit.safetensors     diffusion_model.<module>.lora_A/lora_B.weight (ai-toolkit,
                            diffusion-pipe), no alpha, attention + feed-forward only, bf16
  kohya.safetensors         lora_unet_<module with '_'>.lora_down/lora_up.weight + .alpha
                            (kohya sd-scripts / musubi-tuner), every Linear, bf16, with kohya's
                            ss_network_dim / ss_network_alpha header metadata
  kohya_qkv.safetensors     kohya on ComfyUI's module tree: lora_unet_layers_N_attention_qkv
                            (fused q|k|v: lora_up has 3*dim rows) and attention_out, + alpha, f16
  unknown_key.safetensors   peft.safetensors plus one key that names no module (error test;
                            with --lora-lenient the image is peft's)
Formats diffusers 0.42 cannot load (it raises, or silently loads nothing); their reference is the
image diffusers makes from the SAME weights written in a layout it loads (noted per case):
  peft_bare.safetensors     <module>.lora_A/B.weight, no prefix, no alpha (diffusers filters on
                            the "transformer." prefix and loads nothing, with a warning)
  kohya_dunder.safetensors  lora_unet__<module> (double underscore), kohya.safetensors' weights
  comfy_peft.safetensors    diffusion_model.layers.N.attention.qkv / attention.out .lora_A/B
                            (PEFT on ComfyUI's tree, common on civitai) + alpha, bf16
  loha.safetensors          LyCORIS LoHa on kohya names (diffusers 0.42 has no LoHa): reference by
                            merging the delta into the weights in float64 (make_lycoris)
And diffusers-loadable again:
  lokr.safetensors          LyCORIS LoKr on ai-toolkit names (diffusion_model.<module>.lokr_w1,
                            lokr_w2_a, lokr_w2_b, alpha)

Cases (cases.json): a list of {name, loras: [{file, scale}], reference: "diffusers" or how it was
made, diffusers_loads: bool}. Files per case: <name>.image.npy (the decoded image, [1, H, W, 3]
float in [0, 1]) and <name>.dit0.npy (the DiT output of step 0, [1, 16, 1, h, w], before the
pipeline negates it). base.image.npy / base.dit0.npy: no LoRA (equal to v_turbo's).

How to run (CPU, about a minute):
  /work/.venv-ref/bin/python tools/make_lora_cases.py [OUT_DIR]
      -> OUT_DIR/lora_cases.tar.gz (default /tmp/out); copy it to tests/data/lora/.
Needs torch, diffusers, peft, safetensors; the v_turbo archive and tokenizer from this repo.
"""
import json
import os
import shutil
import subprocess
import sys
import tarfile

import numpy as np
import torch
from safetensors.torch import save_file

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("OUT", "/tmp/out")
WORK = os.environ.get("WORK", "/tmp/zimage_lora_cases")
torch.set_num_threads(4)

from diffusers import ZImagePipeline  # noqa: E402
from peft import LoraConfig  # noqa: E402
from peft.utils import get_peft_model_state_dict  # noqa: E402

CASE_DIR = os.path.join(WORK, "lora_cases")


def unpack_base():
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(CASE_DIR)
    with tarfile.open(os.path.join(REPO, "tests/data/golden/v_turbo.tar.gz")) as t:
        t.extractall(WORK)
    tok = os.path.join(WORK, "v_turbo/model/tokenizer/tokenizer.json")
    with open(tok, "wb") as f:
        f.write(subprocess.check_output(
            ["gzip", "-dc", os.path.join(REPO, "tests/data/qwen3-tokenizer/tokenizer.json.gz")]))
    with open(os.path.join(WORK, "v_turbo/case.json")) as f:
        return json.load(f)


CASE = unpack_base()
PIPE = ZImagePipeline.from_pretrained(os.path.join(WORK, "v_turbo/model"), dtype=torch.float32)
TR = PIPE.transformer
LINEARS = [n for n, m in TR.named_modules() if isinstance(m, torch.nn.Linear)]
GEN = torch.Generator().manual_seed(20240611)


def shape(module):
    return tuple(TR.get_submodule(module).weight.shape)  # [N, K]


def run():
    """The image and the step-0 DiT output of the v_turbo recipe with the adapters now active."""
    outs = []
    hook = TR.register_forward_hook(lambda m, i, o: outs.append(torch.stack([v.float() for v in o[0]])))
    with torch.no_grad():
        img = PIPE(list(CASE["prompts"]), height=CASE["H"], width=CASE["W"],
                   num_inference_steps=CASE["steps"], guidance_scale=CASE["guidance"],
                   generator=torch.Generator("cpu").manual_seed(CASE["seed"]), output_type="np").images
    hook.remove()
    return img.astype(np.float32), outs[0].numpy().astype(np.float32)


def randn(*s, std):
    return torch.randn(*s, generator=GEN) * std


def low_rank(module, rank, gain=1.0):
    """down [r, K], up [N, r] whose product has entries of about gain * 0.5 / sqrt(K)."""
    n, k = shape(module)
    std = (gain * 0.5 / k ** 0.5 / rank ** 0.5) ** 0.5
    return randn(rank, k, std=std), randn(n, rank, std=std)


def pick_rank():
    return int(torch.randint(1, 5, (1,), generator=GEN))


def attn_ff(blocks=("layers", "noise_refiner", "context_refiner")):
    return [m for m in LINEARS if m.split(".")[0] in blocks and (".attention." in m or ".feed_forward." in m)]


# ---------------------------------------------------------------- formats -----------------------

def lr_delta(down, up, scale):
    return (up.double() @ down.double()) * scale


def make_peft(prefix, modules, alpha=False, dtype=torch.float32):
    sd, deltas = {}, {}
    for m in modules:
        r = pick_rank()
        a = float(torch.randint(1, 9, (1,), generator=GEN)) if alpha else None
        down, up = low_rank(m, r, gain=1.0 if a is None else r / a)
        sd[f"{prefix}{m}.lora_A.weight"] = down.to(dtype)
        sd[f"{prefix}{m}.lora_B.weight"] = up.to(dtype)
        if a is not None:
            sd[f"{prefix}{m}.alpha"] = torch.tensor(a, dtype=dtype)
        deltas[m] = lr_delta(down.to(dtype), up.to(dtype), 1.0 if a is None else a / r)
    return sd, deltas


def kohya_name(m):
    return m.replace(".", "_")


def make_kohya(modules, prefix="lora_unet_", dtype=torch.bfloat16):
    sd, deltas = {}, {}
    for m in modules:
        r = pick_rank()
        a = float(torch.randint(1, 9, (1,), generator=GEN))
        down, up = low_rank(m, r, gain=r / a)
        sd[f"{prefix}{kohya_name(m)}.lora_down.weight"] = down.to(dtype)
        sd[f"{prefix}{kohya_name(m)}.lora_up.weight"] = up.to(dtype)
        sd[f"{prefix}{kohya_name(m)}.alpha"] = torch.tensor(a, dtype=dtype)
        deltas[m] = lr_delta(down.to(dtype), up.to(dtype), a / r)
    return sd, deltas


def rename_prefix(sd, old, new):
    return {new + k[len(old):]: v for k, v in sd.items()}


def blocks_of(name):
    return sorted({".".join(m.split(".")[:2]) for m in LINEARS if m.startswith(name + ".")})


def make_fused(style, dtype):
    """LoRAs on ComfyUI's fused attention.qkv (up: [3*dim, r]) and attention.out, + alpha.
    style 'kohya': lora_unet_layers_0_attention_qkv.lora_down.weight; 'peft':
    diffusion_model.layers.0.attention.qkv.lora_A.weight. Returns (file dict, the same LoRA in the
    split diffusers layout with alpha folded as diffusers folds it: what diffusers loads)."""
    sd, split, deltas = {}, {}, {}
    for blk in blocks_of("layers") + blocks_of("noise_refiner") + blocks_of("context_refiner"):
        for leaf, parts in (("attention.qkv", ("to_q", "to_k", "to_v")), ("attention.out", ("to_out.0",))):
            r = pick_rank()
            a = float(torch.randint(1, 9, (1,), generator=GEN))
            n, k = shape(f"{blk}.attention.to_q")
            down, up = low_rank(f"{blk}.attention.to_q", r, gain=r / a)
            up = torch.cat([up] + [randn(n, r, std=float(up.std())) for _ in parts[1:]])
            down, up = down.to(dtype), up.to(dtype)
            if style == "kohya":
                base = "lora_unet_" + f"{blk}.{leaf}".replace(".", "_")
                sd[base + ".lora_down.weight"], sd[base + ".lora_up.weight"] = down, up
            else:
                base = f"diffusion_model.{blk}.{leaf}"
                sd[base + ".lora_A.weight"], sd[base + ".lora_B.weight"] = down, up
            sd[base + ".alpha"] = torch.tensor(a, dtype=dtype)
            for i, p in enumerate(parts):
                t = f"{blk}.attention.{p}"
                split[f"{t}.lora_A.weight"] = down
                split[f"{t}.lora_B.weight"] = up[i * n:(i + 1) * n]
                split[f"{t}.alpha"] = torch.tensor(a, dtype=dtype)
                deltas[t] = lr_delta(down, up[i * n:(i + 1) * n], a / r)
    return sd, split, deltas


def make_meta():
    """A LoRA as diffusers' training scripts save it: PEFT state dict + lora_adapter_metadata."""
    leaves = (".to_q", ".to_k", ".to_v", ".to_out.0", ".w1", ".w2", ".w3", "refiner.0.adaLN_modulation.0")
    targets = [m for m in LINEARS if m.endswith(leaves)]
    cfg = LoraConfig(r=4, lora_alpha=6, target_modules=targets, init_lora_weights=False,
                     rank_pattern={"layers.1.attention.to_k": 2, "w2": 3},
                     alpha_pattern={"noise_refiner.0.feed_forward.w1": 1, "to_v": 12})
    TR.add_adapter(cfg, adapter_name="meta_train")
    with torch.no_grad():
        for name, p in TR.named_parameters():
            if "meta_train" in name:
                p.copy_(randn(*p.shape, std=0.12))
    sd = get_peft_model_state_dict(TR, adapter_name="meta_train")
    meta = TR.peft_config["meta_train"].to_dict()
    TR.delete_adapters("meta_train")
    path = os.path.join(CASE_DIR, "peft_meta.safetensors")
    ZImagePipeline.save_lora_weights(CASE_DIR, transformer_lora_layers=sd, weight_name="peft_meta.safetensors",
                                     transformer_lora_adapter_metadata=meta)
    deltas = {}  # the scale PEFT gives each module, written out by hand: lora_alpha / r by pattern
    for m in {k.split(".lora_")[0] for k in sd}:
        alpha = 1 if m == "noise_refiner.0.feed_forward.w1" else 12 if m.endswith(".to_v") else 6
        down, up = sd[m + ".lora_A.weight"], sd[m + ".lora_B.weight"]
        deltas[m] = lr_delta(down, up, alpha / down.shape[0])
    return path, deltas


# ---------------------------------------------------------------- LyCORIS -----------------------

def make_lycoris():
    """LoHa on kohya names (lora_unet_<module>.hada_w1_a ..., as LyCORIS writes it through kohya's
    trainer) and LoKr on ai-toolkit's (diffusion_model.<module>.lokr_w1 ...), attention and
    feed-forward of the main layers, + alpha. LoHa: dW = (w1a @ w1b) * (w2a @ w2b) * alpha / r
    (r = w1b rows); diffusers 0.42 has no LoHa, so its reference delta is computed here in float64.
    LoKr: dW = kron(w1, w2a @ w2b) * alpha / r (r = w2b rows; w1 full [2, 2]): diffusers loads it."""
    loha, lokr, deltas_h, deltas_k = {}, {}, {}, {}
    for m in attn_ff(("layers",)):
        n, k = shape(m)
        r = pick_rank()
        a = float(torch.randint(1, 9, (1,), generator=GEN))
        std = (0.5 / k ** 0.5 * r / a) ** 0.5 / r ** 0.25
        w1a, w1b = randn(n, r, std=std), randn(r, k, std=std)
        w2a, w2b = randn(n, r, std=1.0), randn(r, k, std=1.0 / r ** 0.5)
        base = "lora_unet_" + kohya_name(m)
        loha.update({base + ".hada_w1_a": w1a, base + ".hada_w1_b": w1b, base + ".hada_w2_a": w2a,
                     base + ".hada_w2_b": w2b, base + ".alpha": torch.tensor(a)})
        deltas_h[m] = (w1a.double() @ w1b.double()) * (w2a.double() @ w2b.double()) * (a / r)
        r = pick_rank()
        a = float(torch.randint(1, 9, (1,), generator=GEN))
        std = (0.5 / k ** 0.5 * r / a) ** 0.5 / r ** 0.25
        base = "diffusion_model." + m
        w1, w2a, w2b = randn(2, 2, std=1.0), randn(n // 2, r, std=std), randn(r, k // 2, std=std)
        lokr.update({base + ".lokr_w1": w1, base + ".lokr_w2_a": w2a, base + ".lokr_w2_b": w2b,
                     base + ".alpha": torch.tensor(a)})
        deltas_k[m] = torch.kron(w1.double(), w2a.double() @ w2b.double()) * (a / r)
    return loha, deltas_h, lokr, deltas_k


def run_with_deltas(deltas, scale):
    saved = {}
    with torch.no_grad():
        for m, d in deltas.items():
            w = TR.get_submodule(m).weight
            saved[m] = w.detach().clone()
            w.copy_((w.double() + scale * d).float())
    out = run()
    with torch.no_grad():
        for m, w in saved.items():
            TR.get_submodule(m).weight.copy_(w)
    return out


# ---------------------------------------------------------------- driver ------------------------

def save(name, sd, metadata=None):
    save_file({k: v.contiguous() for k, v in sd.items()}, os.path.join(CASE_DIR, name), metadata=metadata)
    return os.path.join(CASE_DIR, name)


def reference(loras):
    """diffusers' image with the given [(path or state dict, scale)] loaded as adapters."""
    names = []
    for i, (src, _) in enumerate(loras):
        PIPE.load_lora_weights(src if isinstance(src, str) else dict(src), adapter_name=f"a{i}")
        names.append(f"a{i}")
    PIPE.set_adapters(names, [s for _, s in loras])
    out = run()
    PIPE.delete_adapters(names)
    return out


def main():
    os.makedirs(OUT, exist_ok=True)
    cases = []
    base_img, base_dit = run()
    golden = np.load(os.path.join(WORK, "v_turbo/image.npy"))
    print("base vs v_turbo golden image: max |diff| %.3g" % np.abs(base_img - golden).max())
    np.save(os.path.join(CASE_DIR, "base.image.npy"), base_img)
    np.save(os.path.join(CASE_DIR, "base.dit0.npy"), base_dit)

    def add(name, loras, ref, diffusers_loads=True, note=None, check=None):
        img, dit = ref
        if check is not None:  # the same LoRA(s) merged here in float64, from the known deltas
            merged = {}
            for deltas, scale in check:
                for m, d in deltas.items():
                    merged[m] = merged.get(m, 0) + scale * d
            mi, md = run_with_deltas(merged, 1.0)
            print("%-14s reference vs float64 merge: image %.2g, dit0 %.2g" %
                  (name, np.abs(mi - img).max(), np.abs(md - dit).max()))
        np.save(os.path.join(CASE_DIR, f"{name}.image.npy"), img)
        np.save(os.path.join(CASE_DIR, f"{name}.dit0.npy"), dit)
        c = {"name": name, "loras": [{"file": f, "scale": s} for f, s in loras],
             "diffusers_loads": diffusers_loads,
             "reference": "diffusers load_lora_weights" + (f" ({note})" if note else "")}
        cases.append(c)
        print("%-14s max |image - base| %.3f  max |dit0 - base| %.3f" %
              (name, np.abs(img - base_img).max(), np.abs(dit - base_dit).max()), flush=True)

    peft, dp = make_peft("transformer.", LINEARS)
    p = save("peft.safetensors", peft)
    add("peft", [("peft.safetensors", 1.0)], reference([(p, 1.0)]), check=[(dp, 1.0)])
    add("peft_scaled", [("peft.safetensors", 0.6)], reference([(p, 0.6)]), check=[(dp, 0.6)])

    sd, d = make_peft("", attn_ff(), alpha=True)
    p = save("peft_alpha.safetensors", sd)
    add("peft_alpha", [("peft_alpha.safetensors", 1.0)], reference([(p, 1.0)]), check=[(d, 1.0)])

    p, d = make_meta()
    add("peft_meta", [("peft_meta.safetensors", 1.0)], reference([(p, 1.0)]), check=[(d, 1.0)])

    sd, d = make_peft("diffusion_model.", attn_ff(), dtype=torch.bfloat16)
    p = save("aitoolkit.safetensors", sd)
    add("aitoolkit", [("aitoolkit.safetensors", 1.0)], reference([(p, 1.0)]), check=[(d, 1.0)])

    kohya, dk = make_kohya(LINEARS)
    p = save("kohya.safetensors", kohya, {"ss_network_dim": "4", "ss_network_alpha": "4.0",
                                         "ss_network_module": "networks.lora"})
    add("kohya", [("kohya.safetensors", 1.0)], reference([(p, 1.0)]), check=[(dk, 1.0)])
    add("stack", [("peft.safetensors", 0.7), ("kohya.safetensors", -0.5)],
        reference([(os.path.join(CASE_DIR, "peft.safetensors"), 0.7), (p, -0.5)]),
        check=[(dp, 0.7), (dk, -0.5)])

    fused, split, d = make_fused("kohya", torch.float16)
    p = save("kohya_qkv.safetensors", fused)
    add("kohya_qkv", [("kohya_qkv.safetensors", 1.0)], reference([(p, 1.0)]), check=[(d, 1.0)])

    unknown = dict(peft)
    unknown["transformer.layers.0.attention.to_x.lora_A.weight"] = torch.zeros(2, 64)
    unknown["transformer.layers.0.attention.to_x.lora_B.weight"] = torch.zeros(64, 2)
    save("unknown_key.safetensors", unknown)

    # Layouts diffusers does not load: the reference is the same weights in a layout it loads.
    save("peft_bare.safetensors", rename_prefix(peft, "transformer.", ""))
    add("peft_bare", [("peft_bare.safetensors", 1.0)], reference([(peft, 1.0)]), False,
        "of peft.safetensors: the same tensors with the transformer. prefix")
    save("kohya_dunder.safetensors", rename_prefix(kohya, "lora_unet_", "lora_unet__"))
    add("kohya_dunder", [("kohya_dunder.safetensors", 1.0)],
        reference([(os.path.join(CASE_DIR, "kohya.safetensors"), 1.0)]), False,
        "of kohya.safetensors: the same tensors with the lora_unet_ prefix")
    fused, split, d = make_fused("peft", torch.bfloat16)
    save("comfy_peft.safetensors", fused)
    add("comfy_peft", [("comfy_peft.safetensors", 1.0)], reference([(split, 1.0)]), False,
        "of the same tensors split into to_q/to_k/to_v with .alpha keys, no prefix", check=[(d, 1.0)])

    loha, dh, lokr, dkr = make_lycoris()
    save("loha.safetensors", loha)
    add("loha", [("loha.safetensors", 0.8)], run_with_deltas(dh, 0.8), False)
    cases[-1]["reference"] = "the LoHa delta merged into the weights in float64 (make_lycoris)"
    p = save("lokr.safetensors", lokr)
    add("lokr", [("lokr.safetensors", 1.0)], reference([(p, 1.0)]), check=[(dkr, 1.0)])

    with open(os.path.join(CASE_DIR, "cases.json"), "w") as f:
        json.dump({"base": "v_turbo", "cases": cases}, f, indent=1)
    archive = os.path.join(OUT, "lora_cases.tar.gz")
    with tarfile.open(archive, "w:gz") as t:
        t.add(CASE_DIR, arcname="lora_cases")
    print("wrote %s (%.0f KB)" % (archive, os.path.getsize(archive) / 1e3))


if __name__ == "__main__":
    main()
