"""Golden parity cases, made with upstream diffusers + transformers (fp32, CPU).

Why: the engine claims numerical parity with diffusers; these cases are the evidence. Each case is a
tiny random Z-Image pipeline saved in the published diffusers folder layout (bf16 safetensors, like the
real release), a prompt, a seed and settings, and the image (plus intermediate tensors) that diffusers
makes from them with torch.Generator('cpu').manual_seed(seed).

Needs torch, transformers and diffusers (a diffusers wheel can be carried to the GPU machine, which
has torch and transformers), and the Qwen3 tokenizer folder (tokenizer.json + tokenizer_config.json;
tests/data/qwen3-tokenizer has tokenizer_config.json and a gzipped tokenizer.json: gunzip it).

How to run (on the GPU machine; the run is on the CPU and takes a few minutes):
  QWEN3_TOKENIZER_DIR=path/to/qwen3-tokenizer OUT=/tmp/out python3 tools/make_goldens.py
      -> only the NEW cases (v_wide, v_tall, v_batch_cfg, v_multi, v_cfg_trunc, v_vae8)
  ... python3 tools/make_goldens.py v_wide v_vae8     -> the cases named on the command line
  ... ZIMAGE_GOLDEN_CASES=all python3 tools/make_goldens.py
      -> every case, the three original ones (v_turbo, v_cfg, v_batch) included; they are built
         exactly as before, so they come out identical (same seeds, same construction order).
Output: $OUT/<name>.tar.gz (tokenizer.json left out; the build restores it). Copy the archives to
tests/data/golden/<name>.tar.gz: the build unpacks every archive there and the golden tests glob the
case folders, so nothing else needs changing. Keep each archive under 2.5 MB (printed at the end).
Set DIFFUSERS_SRC to a diffusers source tree's src/ folder to use that instead of an installed one.

case.json holds: name, seed, H, W, steps, guidance, neg (null = none), prompts, and, only where a
case sets them, images_per_prompt, cfg_truncation, cfg_normalization, max_sequence_length (absent =
the pipeline defaults 1, 1.0, False, 512). Files per case: model/ (the tiny pipeline in the diffusers
layout), init_noise.npy, prompt_embeds_<i>.npy, image.npy (the decoded image, float in [0, 1]),
debug/token_ids.json, debug/latents_after_step<k>.npy and debug/dit_out_step<k>.npy
(debug/dit_out_step<k>.npy has 2B rows on CFG steps and B rows on steps cfg_truncation skips;
B = prompts x images_per_prompt).
"""
import json
import os
import shutil
import sys
import tarfile

if os.environ.get("DIFFUSERS_SRC"):
    sys.path.insert(0, os.path.abspath(os.environ["DIFFUSERS_SRC"]))
import numpy as np
import torch
from diffusers import (AutoencoderKL, FlowMatchEulerDiscreteScheduler, ZImagePipeline,
                       ZImageTransformer2DModel)
from transformers import AutoTokenizer, Qwen3Config, Qwen3Model

OUT = os.environ.get("OUT", "/tmp/out")
WORK = os.environ.get("WORK", "/tmp/zimage_goldens")
torch.set_num_threads(8)

SMALL_DIT = dict(dim=64, n_layers=2, n_refiner_layers=1, n_heads=4, n_kv_heads=4, cap_feat_dim=32,
                 axes_dims=[8, 4, 4], axes_lens=[256, 64, 64])
SMALL_TE = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=8)
SMALL_VAE = dict(block_out_channels=[32, 64], layers_per_block=1)
# New cases use an even smaller VAE so that their archives stay under 2.5 MB.
TINY_VAE = dict(block_out_channels=[32, 32], layers_per_block=1)

ORIGINAL_CASES = [
    dict(name="v_turbo", seed=0, H=32, W=32, steps=2, guidance=0.0, neg=None,
         prompts=["a cat sitting on a red sofa, photo"],
         dit=dict(SMALL_DIT), te=dict(SMALL_TE), vae=dict(SMALL_VAE)),
    dict(name="v_cfg", seed=123, H=32, W=48, steps=3, guidance=4.0, neg="ugly",
         prompts=["冰雪女王，坐在冰冻的王座上，精致细节，奇幻艺术"],
         dit=dict(dim=96, n_layers=2, n_refiner_layers=1, n_heads=6, n_kv_heads=6, cap_feat_dim=48,
                  axes_dims=[4, 6, 6], axes_lens=[256, 64, 64]),
         te=dict(hidden_size=48, intermediate_size=96, num_hidden_layers=3, num_attention_heads=6,
                 num_key_value_heads=3, head_dim=8),
         vae=dict(block_out_channels=[32, 32, 64, 64], layers_per_block=2)),
    dict(name="v_batch", seed=5, H=32, W=32, steps=2, guidance=0.0, neg=None,
         prompts=["snow", "a very long prompt about a lighthouse on a cliff at dusk, waves crashing, "
                  "dramatic clouds, oil painting, warm light from the lamp, seagulls"],
         dit=dict(SMALL_DIT), te=dict(SMALL_TE), vae=dict(SMALL_VAE), save=dict(max_shard_size="1MB")),
]

NEW_CASES = [
    # A wide image (W 64 x H 32: a 8x16 token grid) through a deeper DiT and text encoder.
    dict(name="v_wide", seed=11, H=32, W=64, steps=3, guidance=0.0, neg=None,
         prompts=["a panoramic mountain lake at sunrise, mist over the water"],
         dit=dict(SMALL_DIT, n_layers=4, n_refiner_layers=2),
         te=dict(SMALL_TE, num_hidden_layers=4), vae=dict(TINY_VAE)),
    # A tall image (W 48 x H 80): 20x12 = 240 image tokens, padded to 256 with x_pad_token.
    dict(name="v_tall", seed=2024, H=80, W=48, steps=2, guidance=0.0, neg=None,
         prompts=["a tall glass of iced coffee on a wooden table"],
         dit=dict(SMALL_DIT), te=dict(SMALL_TE), vae=dict(TINY_VAE)),
    # Two prompts of different lengths with CFG: the DiT batch is 2B = 4 with a key-padding mask.
    dict(name="v_batch_cfg", seed=42, H=32, W=32, steps=2, guidance=3.0, neg="blurry, low quality",
         prompts=["a red bicycle", "an astronaut riding a horse on the moon, detailed digital art"],
         dit=dict(SMALL_DIT), te=dict(SMALL_TE), vae=dict(TINY_VAE)),
    # Two prompts x two images each (noise drawn for 4 in one call), and a max_sequence_length that
    # truncates the second prompt (the chat-template suffix is cut off).
    dict(name="v_multi", seed=9, H=32, W=32, steps=2, guidance=0.0, neg=None, images_per_prompt=2,
         max_sequence_length=20,
         prompts=["a bowl of ramen",
                  "an old map of an imaginary island with mountains, rivers, forests and a castle"],
         dit=dict(SMALL_DIT), te=dict(SMALL_TE), vae=dict(TINY_VAE)),
    # CFG with truncation (steps whose t_norm exceeds 0.2 run the positive pass only) and norm
    # clipping (cfg_normalization 1.0: the guided prediction never outgrows the positive one).
    dict(name="v_cfg_trunc", seed=77, H=32, W=48, steps=4, guidance=2.5, neg=None,
         cfg_truncation=0.2, cfg_normalization=1.0,
         prompts=["a lighthouse in a storm"],
         dit=dict(SMALL_DIT), te=dict(SMALL_TE), vae=dict(TINY_VAE)),
    # A 4-block VAE (spatial factor 8, like the real one) at 64x64: an 8x8 latent, 16 image tokens.
    dict(name="v_vae8", seed=3, H=64, W=64, steps=2, guidance=0.0, neg=None,
         prompts=["a watercolor painting of a fox"],
         dit=dict(SMALL_DIT), te=dict(SMALL_TE),
         vae=dict(block_out_channels=[32, 32, 32, 32], layers_per_block=1)),
]

OPTIONAL_KEYS = ("images_per_prompt", "cfg_truncation", "cfg_normalization", "max_sequence_length")


def bf16_exact(module):
    # round every weight to a bf16-representable value so a bf16 file holds it exactly
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(p.bfloat16().float())
    return module


def chat(tok, prompt):
    return tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                   add_generation_prompt=True, enable_thinking=True)


def make_case(c):
    tok = AutoTokenizer.from_pretrained(os.environ.get("QWEN3_TOKENIZER_DIR", "qwen3-tokenizer"))
    msl = c.get("max_sequence_length", 512)
    per_prompt = c.get("images_per_prompt", 1)
    torch.manual_seed(c["seed"] + 1)
    tr = ZImageTransformer2DModel(all_patch_size=(2,), all_f_patch_size=(1,), in_channels=16, norm_eps=1e-5,
                                  qk_norm=True, rope_theta=256.0, t_scale=1000.0, **c["dit"])
    # zero-initialised layers would hide bugs: give every parameter random values
    with torch.no_grad():
        for _, p in tr.named_parameters():
            p.copy_(torch.randn_like(p) * (0.5 if p.ndim == 1 else 1.0 / max(1, p.shape[-1]) ** 0.5))
    te = Qwen3Model(Qwen3Config(vocab_size=151936, max_position_embeddings=1024, rope_theta=1e6,
                                rms_norm_eps=1e-6, tie_word_embeddings=True, **c["te"]))
    n = len(c["vae"]["block_out_channels"])
    vae = AutoencoderKL(in_channels=3, out_channels=3, down_block_types=["DownEncoderBlock2D"] * n,
                        up_block_types=["UpDecoderBlock2D"] * n, latent_channels=16, norm_num_groups=32,
                        scaling_factor=0.3611, shift_factor=0.1159, use_quant_conv=False,
                        use_post_quant_conv=False, **c["vae"])
    for m in (tr, te, vae):
        bf16_exact(m).eval()
    used = {tok.pad_token_id}
    for p in c["prompts"] + ([c["neg"]] if c["neg"] is not None else [""] if c["guidance"] > 0 else []):
        used.update(tok(chat(tok, p)).input_ids)
    with torch.no_grad():
        keep = torch.zeros(te.embed_tokens.weight.shape[0], dtype=torch.bool)
        keep[sorted(used)] = True
        te.embed_tokens.weight[~keep] = 0  # rows no prompt uses: same outputs, the file compresses
    sched = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=False)
    pipe = ZImagePipeline(scheduler=sched, vae=vae, text_encoder=te, tokenizer=tok, transformer=tr)
    d = os.path.join(WORK, c["name"])
    shutil.rmtree(d, ignore_errors=True)
    model_dir = os.path.join(d, "model")
    # saved in bf16, as the real release is
    pipe.to(torch.bfloat16).save_pretrained(model_dir, safe_serialization=True, **c.get("save", {}))
    # compute the reference from the saved folder, loaded as users load it (buffers such as the text
    # encoder's rotary inv_freq stay fp32; a model-wide .to() would round them)
    pipe = ZImagePipeline.from_pretrained(model_dir, torch_dtype=torch.float32)
    tr = pipe.transformer
    gen = torch.Generator("cpu").manual_seed(c["seed"])
    kw = dict(height=c["H"], width=c["W"], num_inference_steps=c["steps"], guidance_scale=c["guidance"],
              generator=gen, output_type="np")
    if c["neg"] is not None:
        kw["negative_prompt"] = [c["neg"]] * len(c["prompts"])
    if "images_per_prompt" in c:
        kw["num_images_per_prompt"] = per_prompt
    for k in ("cfg_truncation", "cfg_normalization", "max_sequence_length"):
        if k in c:
            kw[k] = c[k]
    vel, steps_lat = [], []
    hook = tr.register_forward_hook(lambda m, i, o: vel.append([v.float().clone() for v in o[0]]))
    kw["callback_on_step_end"] = lambda p, i, t, cb: (steps_lat.append(cb["latents"].clone()), cb)[1]
    f = 2 ** (n - 1)  # the VAE's spatial factor
    with torch.no_grad():
        # the pipeline rewrites the list it gets; images: (B, H, W, 3) float32 in [0, 1]
        img = pipe(list(c["prompts"]), **kw).images
        emb = pipe.encode_prompt(list(c["prompts"]), device="cpu", do_classifier_free_guidance=False,
                                 max_sequence_length=msl)[0]
        lat = torch.randn((len(c["prompts"]) * per_prompt, 16, c["H"] // f, c["W"] // f),
                          generator=torch.Generator("cpu").manual_seed(c["seed"]), dtype=torch.float32)
    hook.remove()
    dbg = os.path.join(d, "debug")
    os.makedirs(dbg, exist_ok=True)
    for si, vs in enumerate(vel):
        # [B (or 2B on CFG steps), 16, 1, h, w], before negation
        np.save(os.path.join(dbg, f"dit_out_step{si}.npy"), torch.stack(vs).numpy())
    for si, lt in enumerate(steps_lat):
        np.save(os.path.join(dbg, f"latents_after_step{si}.npy"), lt.numpy())
    templated = [chat(tok, p) for p in c["prompts"]]
    out = {"templated": templated,
           "ids": [tok(x, max_length=msl, truncation=True).input_ids for x in templated]}
    if c["neg"] is not None:
        nt = chat(tok, c["neg"])
        out["negative_templated"] = nt
        out["negative_ids"] = tok(nt, max_length=msl, truncation=True).input_ids
    with open(os.path.join(dbg, "token_ids.json"), "w") as fh:
        json.dump(out, fh, ensure_ascii=False)
    np.save(os.path.join(d, "image.npy"), img.astype(np.float32))
    np.save(os.path.join(d, "init_noise.npy"), lat.numpy())
    for i, e in enumerate(emb):
        np.save(os.path.join(d, f"prompt_embeds_{i}.npy"), e.float().numpy())
    spec = {k: c[k] for k in ("name", "seed", "H", "W", "steps", "guidance", "neg", "prompts")}
    spec.update({k: c[k] for k in OPTIONAL_KEYS if k in c})
    spec["image_u8_sha"] = None
    with open(os.path.join(d, "case.json"), "w") as fh:
        json.dump(spec, fh, ensure_ascii=False, indent=1)
    tj = os.path.join(model_dir, "tokenizer", "tokenizer.json")
    if os.path.exists(tj):
        os.remove(tj)  # 11 MB, identical to the published one; restored at build time
    archive = os.path.join(OUT, f"{c['name']}.tar.gz")
    with tarfile.open(archive, "w:gz") as t:
        t.add(d, arcname=c["name"])
    size = os.path.getsize(archive)
    print(c["name"], "image", img.shape, float(img.mean()), float(img.std()), "dit calls", len(vel),
          "archive %.2f MB" % (size / 1e6), "(TOO BIG: keep under 2.5 MB)" if size > 2.5e6 else "",
          flush=True)


def selected_cases(argv):
    everything = ORIGINAL_CASES + NEW_CASES
    names = argv[1:] or [s for s in os.environ.get("ZIMAGE_GOLDEN_CASES", "").split(",") if s]
    if not names:
        return NEW_CASES
    if names == ["all"]:
        return everything
    by_name = {c["name"]: c for c in everything}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        sys.exit(f"unknown case(s) {unknown}; known: {sorted(by_name)}")
    return [by_name[n] for n in names]


def main():
    os.makedirs(OUT, exist_ok=True)
    for c in selected_cases(sys.argv):
        make_case(c)


if __name__ == "__main__":
    main()
