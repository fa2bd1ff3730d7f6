"""Golden cases for ControlNet (Fun-Controlnet-Union layouts), made with upstream diffusers (fp32, CPU).

Why: zimage claims that `--controlnet PATH --control-image FILE [--control-scale S]` gives the image
diffusers' ZImageControlNetPipeline / ZImageControlNetInpaintPipeline give, stage for stage, for each
published ControlNet version; these cases are the evidence.

The published ControlNets hang off a 30-layer DiT (control layers at places up to 28, two noise-refiner
layers), so the cases use a tiny DiT with the real depth: dim 32, 2 heads, 30 layers, 2 refiner layers
("cn_model.tar.gz": its transformer folder only, bf16). Text encoder, tokenizer, VAE and scheduler are the
ones of the text-to-image golden case "v_turbo" (tools/make_goldens.py): the tests assemble the model
folder from both (symlinks), as this script does.

Each ControlNet case (<case>.tar.gz) holds a tiny random ControlNet in the version's layout, twice:
  controlnet/               the diffusers folder (config.json + diffusion_pytorch_model.safetensors, bf16)
  controlnet.safetensors    2.0 only: the single file as published; the 1.0, 2.1 and lite files hold
                            exactly the folder's tensors, so controlnet/diffusion_pytorch_model.
                            safetensors is their single file (diffusers' single-file loader tells the version
                            apart by its keys: control_layers.14 present = 2.x; a non-zero
                            control_noise_refiner.0.before_proj = 2.1; 2.0 files carry an unused
                            control_noise_refiner with zero before_proj, dropped on load)
Versions: 1.0 (control_in_dim 16, layers [0,5,..,25], own control_noise_refiner on the control tokens),
2.0 (33 channels, layers [0,2,..,28], add_control_noise_refiner="control_layers"), 2.1 (the same places,
"control_noise_refiner"), 2.1-lite (3 layers [0,10,20], "control_noise_refiner"; no control_layers.14,
so diffusers' single-file loader would classify it as 1.0: zimage infers it from the shapes).

Files of a case (n = prompts x images_per_prompt; arrays float32 .npy):
  case.json            name, version, kind (controlnet | controlnet_inpaint), seed, steps, guidance, neg,
                       prompts, images_per_prompt, width, height, scale, timesteps, control (file name),
                       init, mask (file names or null), controlnet config
  control_image.npy    [1, 3, H, W] the preprocessed control image in [-1, 1]
  control_context.npy  [n, Cc, 1, h, w] what the ControlNet is given: VAE mean latents ((z - shift) * scale),
                       zero channels up to control_in_dim (1.0: none, t2i 2.x: 17), or for inpaint
                       [control | 1 - mask | masked-image latents]
  init_noise.npy       [n, 16, h, w]
  debug/hint_step0_layer<l>.npy     [B, S, D] the ControlNet's output for DiT layer l at step 0 (scaled)
  debug/dit_out_step<k>.npy, debug/latents_after_step<k>.npy
  image.npy            [n, H, W, 3] in [0, 1]

How to run (CPU, about a minute), after a build unpacked the text-to-image goldens:
  GOLDEN_DIR=build/cpu/golden OUT=/tmp/out /work/.venv-ref/bin/python tools/make_controlnet_goldens.py
then copy $OUT/*.tar.gz to tests/data/golden/controlnet/.
"""
import json
import os
import shutil
import sys
import tarfile

import numpy as np
import torch
from PIL import Image
from safetensors.torch import save_file
from diffusers import (AutoencoderKL, FlowMatchEulerDiscreteScheduler, ZImageControlNetInpaintPipeline,
                       ZImageControlNetModel, ZImageControlNetPipeline, ZImageTransformer2DModel)
from diffusers.utils import load_image
from transformers import AutoTokenizer, Qwen3Model

GOLDEN = os.environ.get("GOLDEN_DIR", "build/cpu/golden")
OUT = os.environ.get("OUT", "/tmp/out")
WORK = os.environ.get("WORK", "/tmp/zimage_controlnet_goldens")
torch.set_num_threads(8)

CAT = "a cat sitting on a red sofa, photo"  # a v_turbo prompt: its tokens have embeddings
DIT = dict(dim=32, n_heads=2, n_kv_heads=2, n_layers=30, n_refiner_layers=2, cap_feat_dim=32,
           axes_dims=[8, 4, 4], axes_lens=[256, 64, 64])
EVEN = list(range(0, 30, 2))
VERSIONS = {
    "1.0": dict(control_layers_places=[0, 5, 10, 15, 20, 25], control_refiner_layers_places=None,
                control_in_dim=16, add_control_noise_refiner=None),
    "2.0": dict(control_layers_places=EVEN, control_refiner_layers_places=[0, 1], control_in_dim=33,
                add_control_noise_refiner="control_layers"),
    "2.1": dict(control_layers_places=EVEN, control_refiner_layers_places=[0, 1], control_in_dim=33,
                add_control_noise_refiner="control_noise_refiner"),
    "2.1-lite": dict(control_layers_places=[0, 10, 20], control_refiner_layers_places=[0, 1],
                     control_in_dim=33, add_control_noise_refiner="control_noise_refiner"),
}
CASES = [
    # 1.0, no guidance, control image 40x36 resized (Lanczos) to the asked-for 32x32
    dict(name="cn_v1", version="1.0", kind="controlnet", seed=3, steps=2, guidance=0.0, neg=None,
         prompts=[CAT], size=(32, 32), scale=0.75, control=(40, 36)),
    # 2.0 with CFG (ragged captions: the positive and the empty negative), scale 0.6, 48x32
    dict(name="cn_v2_cfg", version="2.0", kind="controlnet", seed=8, steps=2, guidance=3.0, neg="",
         prompts=[CAT], size=(48, 32), scale=0.6, control=(48, 32)),
    # 2.1 ControlNet inpainting: control, image and mask
    dict(name="cn_v21_inpaint", version="2.1", kind="controlnet_inpaint", seed=5, steps=2, guidance=0.0,
         neg=None, prompts=[CAT], size=(32, 32), scale=1.0, control=(32, 32)),
    # 2.1-lite, two images per prompt, scale 0.9
    dict(name="cn_lite_multi", version="2.1-lite", kind="controlnet", seed=12, steps=2, guidance=0.0,
         neg=None, prompts=[CAT], images_per_prompt=2, size=(32, 32), scale=0.9, control=(30, 34)),
]


def bf16_exact(module):
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(p.bfloat16().float())
    return module


def randomize(module, seed):
    """Every parameter random (the zero-initialised projections would hide bugs)."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for _, p in module.named_parameters():
            p.copy_(torch.randn_like(p) * (0.5 if p.ndim == 1 else 1.0 / max(1, p.shape[-1]) ** 0.5))
    return bf16_exact(module).eval()


def picture(w, h, seed):
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    r = 255 * ((np.hypot(x - w / 2, y - h / 2) // 5) % 2)
    g = 128 + 120 * np.sin(x / 4.0 + seed)
    b = 255 * y / max(1, h - 1)
    img = np.stack([r, g, b], -1) + rng.normal(0, 10, (h, w, 3))
    return np.clip(np.round(img), 0, 255).astype(np.uint8)


def mask_picture(w, h, seed):
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    d = np.hypot((x - w * 0.4) / (w * 0.3), (y - h * 0.5) / (h * 0.3))
    return Image.fromarray(np.clip(np.round((1.2 - d) * 255), 0, 255).astype(np.uint8), "L")


def model_dir():
    """v_turbo's folder with the tiny 30-layer transformer (symlinks, as the tests assemble it)."""
    src = os.path.abspath(os.path.join(GOLDEN, "v_turbo", "model"))
    if not os.path.exists(os.path.join(src, "tokenizer", "tokenizer.json")):
        sys.exit(f"{src}: no unpacked v_turbo model (build first, set GOLDEN_DIR)")
    d = os.path.join(WORK, "cn_model")
    if os.path.exists(os.path.join(d, "model", "transformer", "config.json")):
        return os.path.join(d, "model")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(os.path.join(d, "model"))
    for part in ("text_encoder", "tokenizer", "vae", "scheduler", "model_index.json"):
        os.symlink(os.path.join(src, part), os.path.join(d, "model", part))
    tr = ZImageTransformer2DModel(all_patch_size=(2,), all_f_patch_size=(1,), in_channels=16, norm_eps=1e-5,
                                  qk_norm=True, rope_theta=256.0, t_scale=1000.0, **DIT)
    randomize(tr, 1234)
    tr.to(torch.bfloat16).save_pretrained(os.path.join(d, "model", "transformer"), safe_serialization=True)
    os.makedirs(OUT, exist_ok=True)
    with tarfile.open(os.path.join(OUT, "cn_model.tar.gz"), "w:gz") as t:
        t.add(os.path.join(d, "model", "transformer"), arcname="cn_model/transformer")
    return os.path.join(d, "model")


def save_npy(d, name, t):
    a = t.detach().float().numpy() if torch.is_tensor(t) else np.asarray(t, dtype=np.float32)
    np.save(os.path.join(d, name), a.astype(np.float32))


def make_case(c, mdir):
    d = os.path.join(WORK, c["name"])
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(os.path.join(d, "inputs"))
    os.makedirs(os.path.join(d, "debug"))
    vcfg = VERSIONS[c["version"]]
    cn = ZImageControlNetModel(dim=DIT["dim"], n_heads=DIT["n_heads"], n_kv_heads=DIT["n_kv_heads"],
                               n_refiner_layers=2, norm_eps=1e-5, qk_norm=True, **vcfg)
    randomize(cn, c["seed"] + 77)
    cn.to(torch.bfloat16).save_pretrained(os.path.join(d, "controlnet"), safe_serialization=True)
    sd = {k: v.to(torch.bfloat16).contiguous() for k, v in cn.state_dict().items()}
    if c["version"] == "2.0":  # the published 2.0 file carries an unused refiner, before_proj zero
        torch.manual_seed(c["seed"] + 78)
        for i in range(2):
            for k, v in list(sd.items()):
                if k.startswith(f"control_layers.{i}."):
                    nk = k.replace(f"control_layers.{i}.", f"control_noise_refiner.{i}.")
                    sd[nk] = torch.zeros_like(v) if "before_proj" in k else torch.randn_like(v.float()).bfloat16()
    # 1.0, 2.1 and lite files hold exactly the folder's tensors (diffusers' conversion keeps them
    # as they are): the folder's safetensors file is their single file; 2.0 gets its own.
    single = os.path.join(d, "controlnet", "diffusion_pytorch_model.safetensors")
    if c["version"] == "2.0":
        single = os.path.join(d, "controlnet.safetensors")
        save_file(sd, single)
    # the reference runs the folder, loaded as users load it
    cn = ZImageControlNetModel.from_pretrained(os.path.join(d, "controlnet"), torch_dtype=torch.float32)
    loaded = ZImageControlNetModel.from_single_file(single,
                                                    config=os.path.join(d, "controlnet"),
                                                    torch_dtype=torch.float32)
    for (k, a), (_, b) in zip(sorted(cn.state_dict().items()), sorted(loaded.state_dict().items())):
        assert torch.equal(a, b), k

    tr = ZImageTransformer2DModel.from_pretrained(os.path.join(mdir, "transformer"), torch_dtype=torch.float32)
    vae = AutoencoderKL.from_pretrained(os.path.join(mdir, "vae"), torch_dtype=torch.float32)
    te = Qwen3Model.from_pretrained(os.path.join(mdir, "text_encoder"), torch_dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(os.path.join(mdir, "tokenizer"))
    sched = FlowMatchEulerDiscreteScheduler.from_pretrained(os.path.join(mdir, "scheduler"))
    inpaint = c["kind"] == "controlnet_inpaint"
    cls = ZImageControlNetInpaintPipeline if inpaint else ZImageControlNetPipeline
    pipe = cls(scheduler=sched, vae=vae, text_encoder=te, tokenizer=tok, transformer=tr, controlnet=cn)

    W, H = c["size"]
    cw, ch = c["control"]
    Image.fromarray(picture(cw, ch, c["seed"]), "RGB").save(os.path.join(d, "inputs", "control.png"))
    control = load_image(os.path.join(d, "inputs", "control.png"))
    init_name = mask_name = None
    kw = {}
    if inpaint:
        init_name, mask_name = "init.png", "mask.png"
        Image.fromarray(picture(W, H, c["seed"] + 1)[::-1].copy(), "RGB").save(os.path.join(d, "inputs", init_name))
        mask_picture(W, H, c["seed"]).save(os.path.join(d, "inputs", mask_name))
        kw["image"] = load_image(os.path.join(d, "inputs", init_name))
        kw["mask_image"] = load_image(os.path.join(d, "inputs", mask_name))

    hints, vel, steps_lat, ts, ctx = [], [], [], [], []
    cn_forward = pipe.controlnet.forward

    def controlnet_forward(x, t, cap, control_context, conditioning_scale=1.0, **k):
        ctx.append(torch.as_tensor(control_context).clone() if torch.is_tensor(control_context) else torch.stack(list(control_context)).clone())
        out = cn_forward(x, t, cap, control_context, conditioning_scale=conditioning_scale, **k)
        hints.append({l: h.clone() for l, h in out.items()})
        return out
    pipe.controlnet.forward = controlnet_forward
    hook = pipe.transformer.register_forward_hook(lambda m, i, o: vel.append([v.float().clone() for v in o[0]]))

    def on_step(p, i, t, cb):
        steps_lat.append(cb["latents"].clone())
        ts.append(float(t))
        return cb
    per = c.get("images_per_prompt", 1)
    gen = torch.Generator("cpu").manual_seed(c["seed"])
    if c["neg"] is not None:
        kw["negative_prompt"] = [c["neg"]] * len(c["prompts"])
    noise = torch.randn((len(c["prompts"]) * per, 16, H // 2, W // 2), generator=torch.Generator("cpu").manual_seed(c["seed"]))
    with torch.no_grad():
        img = pipe(list(c["prompts"]), height=H, width=W, control_image=control, num_inference_steps=c["steps"],
                   guidance_scale=c["guidance"], controlnet_conditioning_scale=c["scale"], generator=gen,
                   output_type="np", num_images_per_prompt=per, callback_on_step_end=on_step,
                   callback_on_step_end_tensor_inputs=["latents"], **kw).images
    hook.remove()

    save_npy(d, "control_image.npy", pipe.image_processor.preprocess(control, height=H, width=W))
    save_npy(d, "control_context.npy", ctx[0][: len(c["prompts"]) * per])
    save_npy(d, "init_noise.npy", noise)
    for k, hs in enumerate(hints[:1]):  # the first step's (the archives stay small)
        for l, h in hs.items():
            np.save(os.path.join(d, "debug", f"hint_step{k}_layer{l}.npy"), h.float().numpy())
    for k, vs in enumerate(vel):
        np.save(os.path.join(d, "debug", f"dit_out_step{k}.npy"), torch.stack(vs).numpy())
    for k, lt in enumerate(steps_lat):
        np.save(os.path.join(d, "debug", f"latents_after_step{k}.npy"), lt.numpy())
    np.save(os.path.join(d, "image.npy"), img.astype(np.float32))
    spec = {k: c[k] for k in ("name", "version", "kind", "seed", "steps", "guidance", "neg", "prompts", "scale")}
    spec.update(images_per_prompt=per, width=W, height=H, timesteps=ts, control="control.png",
                single_file=os.path.relpath(single, d),
                init=init_name, mask=mask_name, controlnet=dict(cn.config))
    with open(os.path.join(d, "case.json"), "w") as fh:
        json.dump(spec, fh, ensure_ascii=False, indent=1, default=list)
    os.makedirs(OUT, exist_ok=True)
    archive = os.path.join(OUT, f"{c['name']}.tar.gz")
    with tarfile.open(archive, "w:gz") as t:
        t.add(d, arcname=c["name"])
    size = os.path.getsize(archive)
    print(c["name"], c["version"], f"{W}x{H}", "image", img.shape, float(img.mean()),
          f"{size / 1e6:.3f} MB", "(TOO BIG)" if size > 2.5e6 else "", flush=True)


def main():
    names = sys.argv[1:]
    mdir = model_dir()
    for c in CASES:
        if not names or c["name"] in names:
            make_case(c, mdir)


if __name__ == "__main__":
    main()
