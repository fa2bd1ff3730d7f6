"""Single-file and FP8 parity references (diffusers + transformers, fp32, CPU).

Why: `zimage generate --dit/--text-encoder/--vae` loads the files people download (ComfyUI split
files, all-in-one checkpoints, FP8 casts, ComfyUI's scaled FP8 formats). These references show the
engine reads them as upstream does. The files are made from the tiny golden model v_turbo
(tests/data/golden/v_turbo.tar.gz); the C++ tests write the same files again at test time
(tests/common/single_files.h) and first check, tensor by tensor (name, dtype, shape, CRC-32 of the
bytes), that they equal the files this script made: so the references below apply to exactly
what the engine then loads, and the repository holds only the small manifest and images.

Files (ComfyUI naming: x_embedder, final_layer, fused attention.qkv, attention.out, q_norm/k_norm;
Qwen3 with a leading "model."; the VAE in LDM/Flux names):
  dit_bf16            the transformer, bf16                   -> diffusers from_single_file
  te_bf16             the text encoder, bf16                  -> transformers Qwen3Model (state dict)
  vae_ldm             the VAE, LDM names, bf16                -> diffusers AutoencoderKL.from_single_file
  all_in_one          the three under model.diffusion_model. / text_encoders.qwen3_4b.transformer. /
                      vae. (+ the unused norm_final.weight)   -> same tensors as above: reference "bf16"
  dit_fp8_e4m3        block linear weights cast to float8_e4m3fn (no scales)  -> diffusers from_single_file
  dit_fp8_e5m2        the same in float8_e5m2                                  -> diffusers from_single_file
  dit_scaled_legacy   ComfyUI legacy scaled FP8: `scaled_fp8` marker, <layer>.scale_weight (per tensor),
                      <layer>.scale_input = 1                 -> reference "scaled_tensor"
  dit_scaled          ComfyUI current: <layer>.weight_scale (per tensor), <layer>.comfy_quant JSON,
                      an input_scale on two layers            -> reference "scaled_tensor"
  dit_scaled_rows     one weight_scale per output row [N, 1], formats in the header metadata
                      `_quantization_metadata`                -> reference "scaled_rows"
  te_fp8_mixed        the "fp8_mixed" text encoder: layer 0's q/k/v/o/gate/up scaled FP8 with
                      comfy_quant, down_proj left bf16; layer 1 (unused by Z-Image) all FP8
                                                              -> reference "te_fp8_mixed"
Quantiser (written identically in C++): scale = float32(amax) / float32(448) (per tensor, or per
row), 1 when amax is 0; inv = float32(1) / scale; q = float8_e4m3fn(w * inv) (round to nearest
even). Diffusers cannot read scaled FP8, so those references run diffusers on the folder model whose
weights were dequantised in numpy: W = float32(q) * scale.

References (diffusers ZImagePipeline in float32 with the case's prompt, seed, size and steps):
  <ref>/image.npy (1, H, W, 3), <ref>/dit_out_step<k>.npy (the raw transformer output per step),
  for "te_fp8_mixed" also prompt_embeds_0.npy.
Output: $OUT (default tests/data/single_file): manifest.json and the reference folders.

How to run (CPU, a minute):
  QWEN3_TOKENIZER_DIR=path/to/qwen3-tokenizer python3 tools/make_single_file_cases.py
(tests/data/qwen3-tokenizer holds tokenizer_config.json and a gzipped tokenizer.json: gunzip it.)
"""
import json
import os
import shutil
import sys
import tarfile
import zlib

import numpy as np
import torch
from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, ZImagePipeline, ZImageTransformer2DModel
from diffusers.loaders.single_file_utils import convert_z_image_transformer_checkpoint_to_diffusers
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from transformers import AutoTokenizer, Qwen3Config, Qwen3Model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.environ.get("OUT", os.path.join(ROOT, "tests", "data", "single_file"))
WORK = os.environ.get("WORK", "/tmp/zimage_single_file_cases")
torch.set_num_threads(4)

F8_MAX = {torch.float8_e4m3fn: np.float32(448.0)}


# ---- name mappings ---------------------------------------------------------------------------

def dit_to_comfy(sd):
    """diffusers ZImageTransformer2DModel names -> ComfyUI / original names (fused qkv)."""
    out = {}
    for k, v in sd.items():
        if ".attention.to_k." in k or ".attention.to_v." in k:
            continue
        n = k.replace("all_x_embedder.2-1.", "x_embedder.").replace("all_final_layer.2-1.", "final_layer.")
        n = n.replace(".attention.to_out.0.", ".attention.out.")
        n = n.replace(".attention.norm_q.", ".attention.q_norm.").replace(".attention.norm_k.", ".attention.k_norm.")
        if ".attention.to_q.weight" in k:
            p = k[: -len("to_q.weight")]
            n = n.replace(".attention.to_q.weight", ".attention.qkv.weight")
            v = torch.cat([sd[p + "to_q.weight"], sd[p + "to_k.weight"], sd[p + "to_v.weight"]], 0)
        out[n] = v.contiguous()
    return out


def vae_to_ldm(sd, levels):
    """diffusers AutoencoderKL names -> LDM / Flux `ae.safetensors` names (attention as 1x1 convs)."""
    out = {}
    for k, v in sd.items():
        n = k
        for side in ("encoder", "decoder"):
            n = n.replace(f"{side}.conv_norm_out.", f"{side}.norm_out.")
            n = n.replace(f"{side}.mid_block.resnets.0.", f"{side}.mid.block_1.")
            n = n.replace(f"{side}.mid_block.resnets.1.", f"{side}.mid.block_2.")
            a = f"{side}.mid_block.attentions.0."
            if n.startswith(a):
                rest = n[len(a):]
                for d, l in (("group_norm.", "norm."), ("to_q.", "q."), ("to_k.", "k."), ("to_v.", "v."),
                             ("to_out.0.", "proj_out.")):
                    if rest.startswith(d):
                        rest = l + rest[len(d):]
                n = f"{side}.mid.attn_1." + rest
                if v.ndim == 2:
                    v = v.reshape(v.shape[0], v.shape[1], 1, 1)
        if n.startswith("encoder.down_blocks."):
            i, rest = n[len("encoder.down_blocks."):].split(".", 1)
            rest = rest.replace("resnets.", "block.").replace("downsamplers.0.", "downsample.")
            n = f"encoder.down.{i}.{rest}"
        if n.startswith("decoder.up_blocks."):
            i, rest = n[len("decoder.up_blocks."):].split(".", 1)
            rest = rest.replace("resnets.", "block.").replace("upsamplers.0.", "upsample.")
            n = f"decoder.up.{levels - 1 - int(i)}.{rest}"
        n = n.replace(".conv_shortcut.", ".nin_shortcut.")
        out[n] = v.contiguous()
    return out


# ---- FP8 quantiser (mirrored by tests/common/single_files.cpp) -------------------------------

def quantise(w, per_row, dtype=torch.float8_e4m3fn):
    a = w.float().numpy()
    amax = np.abs(a).max(axis=1, keepdims=True) if per_row else np.abs(a).max().reshape(())
    amax = amax.astype(np.float32)
    scale = np.where(amax > 0, amax / F8_MAX[dtype], np.float32(1)).astype(np.float32)
    inv = (np.float32(1) / scale).astype(np.float32)
    q = torch.from_numpy((a * inv).astype(np.float32)).to(dtype)
    return q, torch.from_numpy(scale.copy())  # [] per tensor (as ComfyUI writes it), [N, 1] per row


def dequantise(q, scale):
    return torch.from_numpy(q.float().numpy() * scale.numpy())  # numpy: float32(q) * scale


def is_block_linear(name, v):
    blocks = ("layers.", "noise_refiner.", "context_refiner.")
    return name.startswith(blocks) and name.endswith(".weight") and v.ndim == 2


def comfy_quant(fmt="float8_e4m3fn"):
    return torch.tensor(list(json.dumps({"format": fmt}).encode()), dtype=torch.uint8)


# ---- the files -------------------------------------------------------------------------------

def make_files(model_dir, files_dir):
    dit = dit_to_comfy(load_file(os.path.join(model_dir, "transformer", "diffusion_pytorch_model.safetensors")))
    te = {"model." + k: v for k, v in load_file(os.path.join(model_dir, "text_encoder", "model.safetensors")).items()}
    vae_cfg = json.load(open(os.path.join(model_dir, "vae", "config.json")))
    vae = vae_to_ldm(load_file(os.path.join(model_dir, "vae", "diffusion_pytorch_model.safetensors")),
                     len(vae_cfg["block_out_channels"]))
    files, deq = {}, {}  # deq: reference name -> dequantised component state dict (ComfyUI names)
    files["dit_bf16"] = (dit, {})
    files["te_bf16"] = (te, {})
    files["vae_ldm"] = (vae, {})
    aio = {"model.diffusion_model." + k: v for k, v in dit.items()}
    aio["model.diffusion_model.norm_final.weight"] = torch.ones(dit["x_embedder.weight"].shape[0], dtype=torch.bfloat16)
    aio.update({"text_encoders.qwen3_4b.transformer." + k: v for k, v in te.items()})
    aio.update({"vae." + k: v for k, v in vae.items()})
    files["all_in_one"] = (aio, {})
    for name, dt in (("dit_fp8_e4m3", torch.float8_e4m3fn), ("dit_fp8_e5m2", torch.float8_e5m2)):
        files[name] = ({k: (v.to(dt) if is_block_linear(k, v) else v) for k, v in dit.items()}, {})

    legacy, current, rows, meta = {}, {}, {}, {}
    d_tensor, d_rows = {}, {}
    for k, v in dit.items():
        if not is_block_linear(k, v):
            for sd in (legacy, current, rows, d_tensor, d_rows):
                sd[k] = v
            continue
        layer = k[: -len(".weight")]
        q, s = quantise(v, per_row=False)
        legacy[k], legacy[layer + ".scale_weight"], legacy[layer + ".scale_input"] = q, s, torch.tensor(1.0)
        current[k], current[layer + ".weight_scale"], current[layer + ".comfy_quant"] = q, s, comfy_quant()
        d_tensor[k] = dequantise(q, s)
        qr, sr = quantise(v, per_row=True)
        rows[k], rows[layer + ".weight_scale"] = qr, sr
        meta[layer] = {"format": "float8_e4m3fn"}
        d_rows[k] = dequantise(qr, sr)
    legacy["scaled_fp8"] = torch.empty(0, dtype=torch.float8_e4m3fn)
    for layer in ("layers.0.feed_forward.w1", "layers.0.feed_forward.w3"):
        current[layer + ".input_scale"] = torch.tensor(0.03125)
    files["dit_scaled_legacy"] = (legacy, {})
    files["dit_scaled"] = (current, {})
    files["dit_scaled_rows"] = (rows, {"_quantization_metadata": json.dumps({"format_version": "1.0", "layers": meta})})
    deq["scaled_tensor"] = d_tensor
    deq["scaled_rows"] = d_rows

    mixed, d_te = {}, {}
    for k, v in te.items():
        quant = v.ndim == 2 and k.startswith("model.layers.") and (
            k.startswith("model.layers.1.") or ".down_proj." not in k)
        if not quant:
            mixed[k] = d_te[k] = v
            continue
        layer = k[: -len(".weight")]
        q, s = quantise(v, per_row=False)
        mixed[k], mixed[layer + ".weight_scale"], mixed[layer + ".comfy_quant"] = q, s, comfy_quant()
        d_te[k] = dequantise(q, s)
    files["te_fp8_mixed"] = (mixed, {})
    deq["te_fp8_mixed"] = d_te

    os.makedirs(files_dir, exist_ok=True)
    manifest = {}
    for name, (sd, md) in files.items():
        path = os.path.join(files_dir, name + ".safetensors")
        save_file(sd, path, metadata=md or None)
        entry = {"tensors": {}, "metadata": md}
        with safe_open(path, "pt") as f:
            for k in sorted(f.keys()):
                t = f.get_tensor(k)
                raw = t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
                dtype = str(f.get_slice(k).get_dtype())
                entry["tensors"][k] = [dtype, list(t.shape), zlib.crc32(raw) & 0xFFFFFFFF]
        manifest[name] = entry
    return manifest, deq


# ---- references ------------------------------------------------------------------------------

def run_pipeline(case, model_dir, transformer, text_encoder, vae, out_dir):
    tok = AutoTokenizer.from_pretrained(os.environ.get("QWEN3_TOKENIZER_DIR", "qwen3-tokenizer"))
    sched = FlowMatchEulerDiscreteScheduler.from_pretrained(model_dir, subfolder="scheduler")
    pipe = ZImagePipeline(scheduler=sched, vae=vae.float().eval(), text_encoder=text_encoder.float().eval(),
                          tokenizer=tok, transformer=transformer.float().eval())
    outs = []
    hook = pipe.transformer.register_forward_hook(lambda m, i, o: outs.append(torch.stack([v.float() for v in o[0]])))
    with torch.no_grad():
        img = pipe(list(case["prompts"]), height=case["H"], width=case["W"], num_inference_steps=case["steps"],
                   guidance_scale=case["guidance"], generator=torch.Generator("cpu").manual_seed(case["seed"]),
                   output_type="np").images
        emb = pipe.encode_prompt(list(case["prompts"]), device="cpu", do_classifier_free_guidance=False)[0]
    hook.remove()
    os.makedirs(out_dir, exist_ok=True)
    np.save(os.path.join(out_dir, "image.npy"), img.astype(np.float32))
    for k, o in enumerate(outs):
        np.save(os.path.join(out_dir, f"dit_out_step{k}.npy"), o.numpy())
    return img, emb


def folder_te(model_dir):
    cfg = Qwen3Config.from_pretrained(os.path.join(model_dir, "text_encoder"))
    return Qwen3Model(cfg)


def te_from_state(model_dir, sd):
    te = folder_te(model_dir)
    missing, unexpected = te.load_state_dict({k[len("model."):]: v.float() for k, v in sd.items()}, strict=True)
    assert not missing and not unexpected
    return te


def dit_from_comfy_state(model_dir, sd):
    tr = ZImageTransformer2DModel.from_config(ZImageTransformer2DModel.load_config(model_dir, subfolder="transformer"))
    conv = convert_z_image_transformer_checkpoint_to_diffusers({k: v.float() for k, v in sd.items()})
    tr.load_state_dict(conv, strict=True)
    return tr


def main():
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(WORK)
    with tarfile.open(os.path.join(ROOT, "tests", "data", "golden", "v_turbo.tar.gz")) as t:
        t.extractall(WORK)
    case_dir = os.path.join(WORK, "v_turbo")
    model_dir = os.path.join(case_dir, "model")
    case = json.load(open(os.path.join(case_dir, "case.json")))
    files_dir = os.path.join(WORK, "files")
    manifest, deq = make_files(model_dir, files_dir)
    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(OUT)
    with open(os.path.join(OUT, "manifest.json"), "w") as fh:
        json.dump({"source": "tests/data/golden/v_turbo.tar.gz", "files": manifest}, fh, indent=1, sort_keys=True)

    f = lambda n: os.path.join(files_dir, n + ".safetensors")
    vae_file = AutoencoderKL.from_single_file(f("vae_ldm"), config=model_dir, subfolder="vae",
                                              torch_dtype=torch.float32)
    te_bf16 = te_from_state(model_dir, load_file(f("te_bf16")))
    dit_of = lambda n: ZImageTransformer2DModel.from_single_file(f(n), config=model_dir, subfolder="transformer",
                                                                 torch_dtype=torch.float32)
    folder = ZImagePipeline.from_pretrained(model_dir, torch_dtype=torch.float32)
    runs = {
        # diffusers / transformers read the files themselves
        "bf16": (dit_of("dit_bf16"), te_bf16, vae_file),
        "fp8_e4m3": (dit_of("dit_fp8_e4m3"), te_bf16, vae_file),
        "fp8_e5m2": (dit_of("dit_fp8_e5m2"), te_bf16, vae_file),
        # formats diffusers cannot read: the folder model with numpy-dequantised weights
        "scaled_tensor": (dit_from_comfy_state(model_dir, deq["scaled_tensor"]), te_bf16, vae_file),
        "scaled_rows": (dit_from_comfy_state(model_dir, deq["scaled_rows"]), te_bf16, vae_file),
        "te_fp8_mixed": (dit_of("dit_bf16"), te_from_state(model_dir, deq["te_fp8_mixed"]), vae_file),
    }
    golden = np.load(os.path.join(case_dir, "image.npy"))
    for name, (tr, te, vae) in runs.items():
        img, emb = run_pipeline(case, model_dir, tr, te, vae, os.path.join(OUT, name))
        if name == "te_fp8_mixed":
            np.save(os.path.join(OUT, name, "prompt_embeds_0.npy"), emb[0].float().numpy())
        print(f"{name:14s} image max|diff| vs the folder golden {np.abs(img - golden).max():.3g}", flush=True)
    # The single-file loaders must give exactly the folder model for the bf16 files.
    sd_single = runs["bf16"][0].state_dict()
    for k, v in folder.transformer.state_dict().items():
        assert torch.equal(v, sd_single[k]), k
    for k, v in folder.vae.state_dict().items():
        assert torch.equal(v, vae_file.state_dict()[k]), k
    total = sum(os.path.getsize(os.path.join(dp, fn)) for dp, _, fns in os.walk(OUT) for fn in fns)
    print(f"wrote {OUT} ({total / 1e3:.0f} kB)")


if __name__ == "__main__":
    sys.exit(main())
