"""Golden cases for image-to-image and inpainting, made with upstream diffusers (fp32, CPU).

Why: zimage claims that `--init-image` / `--mask` give the image diffusers' ZImageImg2ImgPipeline and
ZImageInpaintPipeline give, stage for stage; these cases are the evidence. They reuse the tiny random
models of the text-to-image goldens (tools/make_goldens.py): each case names its model case
("v_turbo", "v_vae8", "v_cfg") and holds no weights of its own, so the archives stay small.

Two kinds of archive, both written to $OUT and committed under tests/data/golden/image/:
  <case>.tar.gz   one pipeline run: the input files as a user hands them over (inputs/init.png|jpg|webp,
                  inputs/mask.png), every intermediate, the image.
  image_io.tar.gz the image reader and the image processor alone: files in many PNG / JPEG / WebP
                  variants (bit depths, palettes, alpha, EXIF / XMP orientation) with the RGB array
                  diffusers.utils.load_image gives for each, and PIL Lanczos resizes (what
                  VaeImageProcessor.resize runs) of RGB and grayscale images to many sizes.

How to run (CPU, about a minute), after a build unpacked the text-to-image goldens:
  GOLDEN_DIR=build/cpu/golden OUT=/tmp/out /work/.venv-ref/bin/python tools/make_image_goldens.py [names]
then copy $OUT/*.tar.gz to tests/data/golden/image/.

The RNG order matters and is what the cases pin down. With ONE torch.Generator('cpu') seeded once:
  img2img: vae.encode(image).latent_dist.sample(g)  -> randn [1, 16, h, w]   (the image's posterior)
           randn_tensor([B, 16, h, w], g)             -> the noise
  inpaint: the same two draws, then vae.encode(masked image).latent_dist.sample(g) -> randn [1, 16, h, w]
           (masked_image_latents: computed by the pipeline, never read by its loop)
Files of a pipeline case (n = prompts x images_per_prompt; arrays are float32 .npy):
  case.json            name, model, kind (img2img | inpaint), seed, steps, strength, guidance, neg,
                       prompts, images_per_prompt, width, height (the output size), init (file name),
                       mask (file name or null), t_start, timesteps (the T values the loop ran),
                       explicit_size (true: the output size was asked for, the image resized to it)
  init_image.npy       [1, 3, H, W] the preprocessed image in [-1, 1] (VaeImageProcessor.preprocess)
  vae_mean.npy, vae_logvar.npy   [1, 16, h, w] the encoder's posterior of the image (logvar clamped)
  image_latents.npy    [n, 16, h, w] (sample - shift) * scale, repeated over the batch
  init_noise.npy       [n, 16, h, w] the noise
  init_latents.npy     [n, 16, h, w] scale_noise(image_latents, T_start, noise): the loop's input
  mask_image.npy       [1, 1, H, W] inpaint: the binarised mask (mask_processor.preprocess)
  mask_latent.npy      [n, 1, h, w] inpaint: the mask at the latent size (nearest)
  masked_image_latents.npy [n, 16, h, w] inpaint: the third draw's latents (unused by the loop)
  debug/dit_out_step<k>.npy, debug/latents_after_step<k>.npy   per step k of the loop (after the
                       inpaint blend), as make_goldens.py records them
  image.npy            [n, H, W, 3] the decoded image in [0, 1]
"""
import io
import json
import os
import shutil
import sys
import tarfile
import zlib
import struct

import numpy as np
import torch
from PIL import Image, ImageOps, PngImagePlugin
from diffusers import ZImageImg2ImgPipeline, ZImageInpaintPipeline
from diffusers.image_processor import VaeImageProcessor
from diffusers.utils import load_image

GOLDEN = os.environ.get("GOLDEN_DIR", "build/cpu/golden")
OUT = os.environ.get("OUT", "/tmp/out")
WORK = os.environ.get("WORK", "/tmp/zimage_image_goldens")
torch.set_num_threads(8)

CAT = "a cat sitting on a red sofa, photo"
FOX = "a watercolor painting of a fox"
QUEEN = "冰雪女王，坐在冰冻的王座上，精致细节，奇幻艺术"

CASES = [
    # img2img, default strength 0.6 of 4 steps (t_start 1); a 70x53 PNG that the image processor
    # floors to 68x52 (multiples of 4 for this 2-block VAE) with a Lanczos resize.
    dict(name="i2i_turbo", model="v_turbo", kind="img2img", seed=7, steps=4, strength=0.6,
         guidance=0.0, neg=None, prompts=[CAT], image=dict(w=70, h=53, fmt="png")),
    # strength 1.0 (the image only through the RNG order), 2 images per prompt (the image latents
    # repeated, the noise drawn for both in one call), at the exact size of a factor-8 VAE.
    dict(name="i2i_full_multi", model="v_vae8", kind="img2img", seed=11, steps=3, strength=1.0,
         guidance=0.0, neg=None, prompts=[FOX], images_per_prompt=2, image=dict(w=64, h=48, fmt="png")),
    # 25 steps x strength 0.56 = 14.000000000000002 in double: t_start 10, 15 steps (exact
    # arithmetic would give 11 and 14, float32 too); a
    # JPEG input (4:2:0) through PIL's libjpeg-turbo.
    dict(name="i2i_edge_jpeg", model="v_turbo", kind="img2img", seed=3, steps=25, strength=0.56,
         guidance=0.0, neg=None, prompts=[CAT], image=dict(w=32, h=32, fmt="jpeg")),
    # a small strength: 8 steps x 0.2 -> t_start 6, two steps; a WebP input resized to an asked-for
    # size (as VaeImageProcessor.preprocess(image, height, width) does) with CFG.
    dict(name="i2i_small_webp_cfg", model="v_cfg", kind="img2img", seed=21, steps=8, strength=0.2,
         guidance=4.0, neg="ugly", prompts=[QUEEN], image=dict(w=50, h=41, fmt="webp"),
         size=(48, 32)),
    # inpaint at the default strength 1.0, a one-channel mask with soft edges (binarised at 0.5).
    dict(name="inp_turbo", model="v_turbo", kind="inpaint", seed=5, steps=3, strength=None,
         guidance=0.0, neg=None, prompts=[CAT], image=dict(w=48, h=40, fmt="png"),
         mask=dict(mode="L")),
    # inpaint with CFG, strength 0.8 and an RGB mask; image and mask 70x50 resized to 64x48.
    dict(name="inp_cfg_resize", model="v_cfg", kind="inpaint", seed=9, steps=3, strength=0.8,
         guidance=4.0, neg="ugly", prompts=[QUEEN], image=dict(w=70, h=50, fmt="png"),
         mask=dict(mode="RGB")),
    # inpaint, 2 images per prompt, strength 0.5 of 4 steps, factor-8 VAE.
    dict(name="inp_multi", model="v_vae8", kind="inpaint", seed=13, steps=4, strength=0.5,
         guidance=0.0, neg=None, prompts=[FOX], images_per_prompt=2, image=dict(w=64, h=64, fmt="png"),
         mask=dict(mode="L")),
]


def picture(w, h, seed):
    """A smooth picture with edges and some noise (uint8 RGB), different per seed."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    r = 128 + 100 * np.sin(x / (3 + seed % 5)) * np.cos(y / 7.0)
    g = 255 * x / max(1, w - 1)
    b = 255 * (((x // 9) + (y // 7)) % 2)
    img = np.stack([r, g, b], -1) + rng.normal(0, 12, (h, w, 3))
    img[h // 4: h // 2, w // 3: 2 * w // 3] = [240, 30, 60]
    return np.clip(np.round(img), 0, 255).astype(np.uint8)


def mask_picture(w, h, seed, mode):
    rng = np.random.default_rng(seed + 100)
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    d = np.hypot((x - w * 0.55) / (w * 0.3), (y - h * 0.45) / (h * 0.35))
    m = np.clip((1.3 - d) * 255, 0, 255) + rng.normal(0, 20, (h, w))
    m = np.clip(np.round(m), 0, 255).astype(np.uint8)
    if mode == "L":
        return Image.fromarray(m, "L")
    tint = np.stack([m, np.clip(m.astype(int) + 25, 0, 255), np.clip(m.astype(int) - 40, 0, 255)], -1)
    return Image.fromarray(tint.astype(np.uint8), "RGB")


def save_npy(d, name, t):
    a = t.detach().float().numpy() if torch.is_tensor(t) else np.asarray(t, dtype=np.float32)
    np.save(os.path.join(d, name), a.astype(np.float32))


def make_case(c):
    model_dir = os.path.abspath(os.path.join(GOLDEN, c["model"], "model"))
    if not os.path.exists(os.path.join(model_dir, "tokenizer", "tokenizer.json")):
        sys.exit(f"{model_dir}: no unpacked model with its tokenizer (build first, set GOLDEN_DIR)")
    d = os.path.join(WORK, c["name"])
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(os.path.join(d, "inputs"))
    os.makedirs(os.path.join(d, "debug"))
    im = c["image"]
    ext = {"png": "png", "jpeg": "jpg", "webp": "webp"}[im["fmt"]]
    init_name = f"init.{ext}"
    pil = Image.fromarray(picture(im["w"], im["h"], c["seed"]), "RGB")
    save_kw = {"png": {}, "jpeg": dict(quality=90, subsampling=2), "webp": dict(quality=80)}[im["fmt"]]
    pil.save(os.path.join(d, "inputs", init_name), **save_kw)
    mask_name = None
    if c["kind"] == "inpaint":
        mask_name = "mask.png"
        mask_picture(im["w"], im["h"], c["seed"], c["mask"]["mode"]).save(os.path.join(d, "inputs", mask_name))

    # What a diffusers user writes: load_image (EXIF orientation, convert("RGB")), then the pipeline.
    image = load_image(os.path.join(d, "inputs", init_name))
    mask = load_image(os.path.join(d, "inputs", mask_name)) if mask_name else None
    cls = ZImageInpaintPipeline if c["kind"] == "inpaint" else ZImageImg2ImgPipeline
    pipe = cls.from_pretrained(model_dir, torch_dtype=torch.float32)
    proc = pipe.image_processor
    explicit = "size" in c
    if explicit:  # the asked-for size: resize first, as preprocess(image, height, width) would
        W, H = c["size"]
        image = proc.resize(image, H, W)
        if mask is not None:
            mask = proc.resize(mask, H, W)
    init_image = proc.preprocess(image)
    H, W = init_image.shape[-2:]

    # Recorders: the encoder's posteriors, scale_noise's arguments, DiT outputs, per-step latents.
    posteriors, noised, vel, steps_lat, ts, extra = [], [], [], [], [], {}
    enc = pipe.vae.encode

    def encode(x, *a, **k):
        out = enc(x, *a, **k)
        posteriors.append((x.clone(), out.latent_dist.mean.clone(), out.latent_dist.logvar.clone()))
        return out
    pipe.vae.encode = encode
    scale = pipe.scheduler.scale_noise

    def scale_noise(sample, timestep, noise=None):
        out = scale(sample, timestep, noise)
        noised.append((sample.clone(), timestep.clone(), noise.clone(), out.clone()))
        return out
    pipe.scheduler.scale_noise = scale_noise
    hook = pipe.transformer.register_forward_hook(
        lambda m, i, o: vel.append([v.float().clone() for v in o[0]]))
    inputs = ["latents", "mask", "masked_image_latents"] if c["kind"] == "inpaint" else ["latents"]

    def on_step(p, i, t, cb):
        steps_lat.append(cb["latents"].clone())
        ts.append(float(t))
        for k in inputs[1:]:
            extra[k] = cb[k].clone()
        return cb

    per = c.get("images_per_prompt", 1)
    kw = dict(image=image, num_inference_steps=c["steps"], guidance_scale=c["guidance"],
              generator=torch.Generator("cpu").manual_seed(c["seed"]), output_type="np",
              num_images_per_prompt=per, callback_on_step_end=on_step,
              callback_on_step_end_tensor_inputs=inputs)
    if c["strength"] is not None:
        kw["strength"] = c["strength"]
    if c["neg"] is not None:
        kw["negative_prompt"] = [c["neg"]] * len(c["prompts"])
    if mask is not None:
        kw["mask_image"] = mask
    with torch.no_grad():
        img = pipe(list(c["prompts"]), **kw).images
    hook.remove()

    strength = c["strength"] if c["strength"] is not None else (1.0 if c["kind"] == "inpaint" else 0.6)
    n = c["steps"]
    t_start = int(max(n - min(n * strength, n), 0))
    assert len(ts) == n - t_start, (len(ts), n, t_start)
    save_npy(d, "init_image.npy", init_image)
    x0, mean0, logvar0 = posteriors[0]
    assert torch.equal(x0, init_image.float()), "the encoder saw another image"
    save_npy(d, "vae_mean.npy", mean0)
    save_npy(d, "vae_logvar.npy", torch.clamp(logvar0, -30.0, 20.0))
    sample, _, noise, lat0 = noised[0]
    save_npy(d, "image_latents.npy", sample)
    save_npy(d, "init_noise.npy", noise)
    save_npy(d, "init_latents.npy", lat0)
    if c["kind"] == "inpaint":
        save_npy(d, "mask_image.npy", pipe.mask_processor.preprocess(mask, height=H, width=W))
        save_npy(d, "mask_latent.npy", extra["mask"])
        save_npy(d, "masked_image_latents.npy", extra["masked_image_latents"])
        assert len(posteriors) == 2
    for k, vs in enumerate(vel):
        np.save(os.path.join(d, "debug", f"dit_out_step{k}.npy"), torch.stack(vs).numpy())
    for k, lt in enumerate(steps_lat):
        np.save(os.path.join(d, "debug", f"latents_after_step{k}.npy"), lt.numpy())
    np.save(os.path.join(d, "image.npy"), img.astype(np.float32))
    spec = {k: c[k] for k in ("name", "model", "kind", "seed", "steps", "guidance", "neg", "prompts")}
    spec.update(strength=c["strength"], images_per_prompt=per, width=int(W), height=int(H),
                init=init_name, mask=mask_name, t_start=t_start, timesteps=ts,
                explicit_size=explicit)
    with open(os.path.join(d, "case.json"), "w") as fh:
        json.dump(spec, fh, ensure_ascii=False, indent=1)
    pack(d, c["name"])
    print(c["name"], c["kind"], f"{W}x{H}", "t_start", t_start, "steps run", len(ts),
          "image", img.shape, float(img.mean()), flush=True)


def pack(d, name):
    os.makedirs(OUT, exist_ok=True)
    archive = os.path.join(OUT, f"{name}.tar.gz")
    with tarfile.open(archive, "w:gz") as t:
        t.add(d, arcname=name)
    size = os.path.getsize(archive)
    print(f"  {archive}: {size / 1e6:.3f} MB", "(TOO BIG)" if size > 2.5e6 else "", flush=True)


# ---- image_io: the file reader and the resize, apart from any model ---------------------------------

def png_chunk(tag, data):
    return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)


def raw_png(pixels, color_type, bit_depth, extra_chunks=()):
    """A PNG written by hand (filter 0 rows), for the colour types / bit depths PIL cannot write.
    `pixels`: [h, w, channels] integer samples."""
    h, w = pixels.shape[:2]
    ch = pixels.shape[2]
    rows = []
    for y in range(h):
        if bit_depth == 16:
            row = pixels[y].astype(">u2").tobytes()
        elif bit_depth == 8:
            row = pixels[y].astype(np.uint8).tobytes()
        else:  # packed samples, one channel
            per = 8 // bit_depth
            vals = pixels[y, :, 0].astype(np.uint8)
            out = bytearray((w + per - 1) // per)
            for i, v in enumerate(vals):
                out[i // per] |= int(v) << (8 - bit_depth * (i % per + 1))
            row = bytes(out)
        rows.append(b"\0" + row)
    ihdr = struct.pack(">IIBBBBB", w, h, bit_depth, color_type, 0, 0, 0)
    body = png_chunk(b"IHDR", ihdr) + b"".join(extra_chunks)
    body += png_chunk(b"IDAT", zlib.compress(b"".join(rows)))
    return b"\x89PNG\r\n\x1a\n" + body + png_chunk(b"IEND", b"")


def exif_bytes(orientation, big_endian=False):
    e = Image.Exif()
    e[0x0112] = orientation
    if not big_endian:
        return e.tobytes()
    # A big-endian TIFF block with one IFD0 entry: Orientation (SHORT, count 1).
    return (b"Exif\x00\x00MM\x00\x2a\x00\x00\x00\x08" + struct.pack(">H", 1) +
            struct.pack(">HHIHH", 0x0112, 3, 1, orientation, 0) + struct.pack(">I", 0))


def make_image_io():
    d = os.path.join(WORK, "image_io")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(os.path.join(d, "decode"))
    os.makedirs(os.path.join(d, "resize"))
    rng = np.random.default_rng(42)
    rgb = picture(29, 21, 4)
    files = {}
    a = rng.integers(0, 256, (21, 29, 1), dtype=np.uint8)
    alpha = rng.integers(0, 256, (21, 29, 1), dtype=np.uint8)
    files["gray8.png"] = raw_png(a, 0, 8)
    files["gray16.png"] = raw_png(a.astype(np.uint16) * 257, 0, 16)  # PIL "I;16": refused by zimage
    for bits in (1, 2, 4):
        files[f"gray{bits}.png"] = raw_png(a >> (8 - bits), 0, bits)
    files["gray_alpha8.png"] = raw_png(np.concatenate([a, alpha], -1), 4, 8)
    files["gray_alpha16.png"] = raw_png(np.concatenate([a, alpha], -1).astype(np.uint16) * 257 + 3, 4, 16)
    files["rgb8.png"] = raw_png(rgb, 2, 8)
    files["rgb16.png"] = raw_png(rgb.astype(np.uint16) * 256 + rng.integers(0, 256, rgb.shape), 2, 16)
    files["rgba8.png"] = raw_png(np.concatenate([rgb, alpha], -1), 6, 8)
    files["rgba16.png"] = raw_png(np.concatenate([rgb, alpha], -1).astype(np.uint16) * 257, 6, 16)
    files["rgb8_trns.png"] = raw_png(rgb, 2, 8, [png_chunk(b"tRNS", struct.pack(">HHH", *[int(v) for v in rgb[0, 0]]))])
    buf = io.BytesIO()
    Image.fromarray(rgb).convert("P", palette=Image.Palette.ADAPTIVE, colors=50).save(buf, "PNG")
    files["palette.png"] = buf.getvalue()
    pal = Image.fromarray(rgb).convert("P", palette=Image.Palette.ADAPTIVE, colors=16)
    buf = io.BytesIO()
    pal.save(buf, "PNG", transparency=3)
    files["palette_trns.png"] = buf.getvalue()
    buf = io.BytesIO()
    pal.save(buf, "PNG", bits=4)
    files["palette4.png"] = buf.getvalue()
    # Orientation: EXIF in PNG (eXIf), JPEG (APP1), WebP (EXIF chunk), both byte orders; XMP; the
    # ImageMagick text chunk.
    for o in range(1, 9):
        buf = io.BytesIO()
        Image.fromarray(rgb).save(buf, "PNG", exif=exif_bytes(o))
        files[f"orient{o}.png"] = buf.getvalue()
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, "PNG", exif=exif_bytes(6, big_endian=True))
    files["orient6_be.png"] = buf.getvalue()
    info = PngImagePlugin.PngInfo()
    info.add_itxt("XML:com.adobe.xmp", '<x:xmpmeta><rdf:Description tiff:Orientation="8"/></x:xmpmeta>')
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, "PNG", pnginfo=info)
    files["orient_xmp.png"] = buf.getvalue()
    raw = exif_bytes(3)[6:]
    info = PngImagePlugin.PngInfo()
    info.add_text("Raw profile type exif", f"\nexif\n{len(raw):8}\n{raw.hex()}\n", zip=True)
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, "PNG", pnginfo=info)
    files["orient_rawprofile.png"] = buf.getvalue()
    for name, kw in {"q90_420": dict(quality=90, subsampling=2), "q95_444": dict(quality=95, subsampling=0),
                     "q75_422": dict(quality=75, subsampling=1),
                     "progressive": dict(quality=85, progressive=True),
                     "orient6": dict(quality=90, exif=exif_bytes(6)),
                     "orient5_be": dict(quality=90, exif=exif_bytes(5, big_endian=True)),
                     "orient_xmp": dict(quality=90, xmp=b'<x:xmpmeta tiff:Orientation="3"/>')}.items():
        buf = io.BytesIO()
        Image.fromarray(rgb).save(buf, "JPEG", **kw)
        files[f"{name}.jpg"] = buf.getvalue()
    buf = io.BytesIO()
    Image.fromarray(a[..., 0], "L").save(buf, "JPEG", quality=90)
    files["gray.jpg"] = buf.getvalue()
    buf = io.BytesIO()
    Image.fromarray(rgb).convert("CMYK").save(buf, "JPEG", quality=90)
    files["cmyk.jpg"] = buf.getvalue()  # PIL "CMYK": refused by zimage
    for name, kw, src in [("lossy", dict(quality=80), Image.fromarray(rgb)),
                          ("lossless", dict(lossless=True), Image.fromarray(rgb)),
                          ("alpha", dict(quality=80), Image.fromarray(np.concatenate([rgb, alpha], -1), "RGBA")),
                          ("alpha_lossless", dict(lossless=True), Image.fromarray(np.concatenate([rgb, alpha], -1), "RGBA")),
                          ("orient7", dict(quality=80, exif=exif_bytes(7)), Image.fromarray(rgb))]:
        buf = io.BytesIO()
        src.save(buf, "WEBP", **kw)
        files[f"{name}.webp"] = buf.getvalue()
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, "WEBP", save_all=True, duration=100,
                              append_images=[Image.fromarray(np.ascontiguousarray(rgb[::-1]))])
    files["animated.webp"] = buf.getvalue()  # refused by zimage (PIL would take frame 0)
    expected = {}
    for name, data in files.items():
        p = os.path.join(d, "decode", name)
        with open(p, "wb") as fh:
            fh.write(data)
        opened = Image.open(p)
        expected[name] = dict(mode=opened.mode, size=list(opened.size))
        np.save(p + ".npy", np.asarray(load_image(p)))  # exif_transpose + convert("RGB")
        # the mask path: exif_transpose, then convert("L") (what the mask processor ends in)
        np.save(p + ".L.npy", np.asarray(ImageOps.exif_transpose(Image.open(p)).convert("L")))
    with open(os.path.join(d, "decode", "modes.json"), "w") as fh:
        json.dump(expected, fh, indent=1)

    # Lanczos resizes (VaeImageProcessor.resize -> PIL Image.resize(LANCZOS, reducing_gap=None)).
    # The tall sources make Pillow 13 run the vertical pass first for some targets.
    proc = VaeImageProcessor(vae_scale_factor=16)
    sources = {"rgb_40x30": Image.fromarray(picture(40, 30, 1)),
               "rgb_97x61": Image.fromarray(rng.integers(0, 256, (61, 97, 3), dtype=np.uint8)),
               "gray_53x77": Image.fromarray(rng.integers(0, 256, (77, 53), dtype=np.uint8), "L"),
               "rgb_1x5": Image.fromarray(rng.integers(0, 256, (5, 1, 3), dtype=np.uint8)),
               "rgb_45x131": Image.fromarray(picture(45, 131, 2))}
    targets = [(32, 32), (16, 48), (64, 48), (80, 64), (33, 17), (1, 1), (7, 130), (40, 30), (45, 64),
               (44, 20)]
    sizes = {}
    for name, im in sources.items():
        im.save(os.path.join(d, "resize", name + ".png"))
        sizes[name] = []
        for (w, h) in targets:
            out = proc.resize(im, h, w)
            np.save(os.path.join(d, "resize", f"{name}_{w}x{h}.npy"), np.asarray(out))
            sizes[name].append([w, h])
    # RGB -> L (ITU-R 601-2 luma, PIL's fixed point) over many colours.
    lum = rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)
    lum[0, :8] = [[0, 0, 0], [255, 255, 255], [255, 0, 0], [0, 255, 0], [0, 0, 255], [1, 1, 1], [128, 128, 127], [254, 255, 254]]
    Image.fromarray(lum).save(os.path.join(d, "resize", "luma.png"))
    np.save(os.path.join(d, "resize", "luma.L.npy"), np.asarray(Image.fromarray(lum).convert("L")))
    with open(os.path.join(d, "resize", "sizes.json"), "w") as fh:
        json.dump(sizes, fh)
    pack(d, "image_io")


def main():
    names = sys.argv[1:]
    by_name = {c["name"]: c for c in CASES}
    unknown = [n for n in names if n not in by_name and n != "image_io"]
    if unknown:
        sys.exit(f"unknown case(s) {unknown}; known: {sorted(by_name)} and image_io")
    if not names or "image_io" in names:
        make_image_io()
    for c in CASES:
        if not names or c["name"] in names:
            make_case(c)


if __name__ == "__main__":
    main()
