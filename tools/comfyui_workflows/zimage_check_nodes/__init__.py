"""Test-only ComfyUI nodes for tools/comfyui_gpu_check.py (copied into custom_nodes/ by it).

ComfyUI's own loaders cannot read zimage's tiny test model: its Z-Image detection
(comfy/model_detection.py) only configures the real DiT (dim 3840: 30 heads, axes [32, 48, 48]),
its Qwen3 text encoder config is fixed at Qwen3-4B (comfy/text_encoders/llama.py Qwen3_4BConfig,
hidden 2560), and its VAE detection assumes the real 4-level AutoencoderKL (ch 128). These nodes
build ComfyUI's own classes with the tiny model's dimensions instead:

- ZImageCheckComfyDiT: ComfyUI's own NextDiT (comfy.supported_models.ZImage / model_base.Lumina2)
  with the folder's transformer/config.json, weights renamed diffusers -> ComfyUI with ComfyUI's
  own map (comfy.utils.z_image_to_diffusers). The reference for the zimage MODEL node.
- ZImageCheckVAE: ComfyUI's own VAE class (comfy.sd.VAE, AutoencoderKL) sized from vae/config.json,
  weights converted with ComfyUI's diffusers_convert (its up-block numbering assumes 4 levels,
  renumbered here), no quant convs (as the Flux / Z-Image VAE).
- ZImageCheckTextEncode: CONDITIONING from the folder's Qwen3 text encoder run by transformers,
  as diffusers' ZImagePipeline does (chat template, enable_thinking, hidden_states[-2], the
  prompt's real tokens).
- ZImageCheckEmptyLatent: an empty 16-channel latent at the tiny VAE's scale.
"""

from __future__ import annotations

import json
import os

import torch

import comfy.model_management
import comfy.model_patcher
import comfy.ops
import comfy.sd
import comfy.supported_models
import comfy.utils
from comfy import diffusers_convert


def _load_safetensors(path):
    return comfy.utils.load_torch_file(path, safe_load=True)


def _dtype(name):
    return {"bf16": torch.bfloat16, "f32": torch.float32}[name]


def _one_file(folder):
    for name in ("diffusion_pytorch_model.safetensors", "model.safetensors"):
        p = os.path.join(folder, name)
        if os.path.exists(p):
            return p
    raise FileNotFoundError(f"no safetensors in {folder}")


def diffusers_to_comfy_dit(sd, unet_config):
    """The diffusers Z-Image transformer's weights under ComfyUI's NextDiT names (q/k/v packed
    into qkv), by inverting ComfyUI's own diffusers map."""
    key_map = comfy.utils.z_image_to_diffusers(unet_config, output_prefix="")
    out, packed = {}, {}
    for k, v in sd.items():
        target = key_map.get(k)
        if target is None:
            raise KeyError(f"ComfyUI has no name for diffusers key {k}")
        if isinstance(target, str):
            out[target] = v
        else:
            name, (dim, offset, size) = target[0], target[1]
            packed.setdefault(name, []).append((offset, v))
    for name, parts in packed.items():
        out[name] = torch.cat([v for _, v in sorted(parts, key=lambda p: p[0])], dim=0)
    return out


class ZImageCheckComfyDiT:
    @classmethod
    def INPUT_TYPES(cls):  # noqa: N802
        return {"required": {"model_folder": ("STRING", {"default": ""}),
                             "dtype": (["bf16", "f32"], {"default": "bf16"})}}

    RETURN_TYPES = ("MODEL",)
    FUNCTION = "load"
    CATEGORY = "zimage_check"

    def load(self, model_folder, dtype):
        tdir = os.path.join(model_folder, "transformer")
        with open(os.path.join(tdir, "config.json")) as f:
            cfg = json.load(f)
        sd = _load_safetensors(_one_file(tdir))
        dim = cfg["dim"]
        unet_config = {
            "image_model": "lumina2", "patch_size": cfg["all_patch_size"][0],
            "in_channels": cfg["in_channels"], "dim": dim, "cap_feat_dim": cfg["cap_feat_dim"],
            "n_layers": cfg["n_layers"], "n_refiner_layers": cfg["n_refiner_layers"],
            "n_heads": cfg["n_heads"], "n_kv_heads": cfg["n_kv_heads"], "qk_norm": cfg["qk_norm"],
            "norm_eps": cfg["norm_eps"], "axes_dims": list(cfg["axes_dims"]),
            "axes_lens": list(cfg["axes_lens"]), "rope_theta": cfg["rope_theta"],
            "ffn_dim_multiplier": 8.0 / 3.0, "multiple_of": 1, "z_image_modulation": True,
            "time_scale": cfg["t_scale"],
        }
        if "cap_pad_token" in sd:
            unet_config["pad_tokens_multiple"] = 32
        comfy_sd = diffusers_to_comfy_dit(sd, unet_config)
        ffn = comfy_sd["layers.0.feed_forward.w1.weight"].shape[0]
        if ffn != int(8.0 / 3.0 * dim):  # ComfyUI's FeedForward: int(8/3 * dim), multiple_of 1
            unet_config["ffn_dim_multiplier"] = ffn / dim
        config = comfy.supported_models.ZImage(unet_config)
        dt = _dtype(dtype)
        config.set_inference_dtype(dt, None)
        load_device = comfy.model_management.get_torch_device()
        model = config.get_model({}, device=load_device)
        dm = model.diffusion_model
        # ComfyUI sizes the timestep MLP for the real model (hidden min(dim, 1024), output 256);
        # diffusers' is (hidden 1024, output min(dim, 256)): the same for dim 3840, not for the
        # tiny dim 64. Rebuild that one module (ComfyUI's own class) at the file's sizes.
        w0, w2 = comfy_sd["t_embedder.mlp.0.weight"], comfy_sd["t_embedder.mlp.2.weight"]
        if tuple(dm.t_embedder.mlp[0].weight.shape) != tuple(w0.shape) or \
                tuple(dm.t_embedder.mlp[2].weight.shape) != tuple(w2.shape):
            dm.t_embedder = type(dm.t_embedder)(
                w0.shape[0], frequency_embedding_size=w0.shape[1], output_size=w2.shape[0],
                dtype=dt, device=load_device, operations=comfy.ops.disable_weight_init)
        missing, unexpected = dm.load_state_dict(
            {k: v.to(dt) for k, v in comfy_sd.items()}, strict=False)
        if missing or unexpected:
            raise RuntimeError(f"ComfyUI NextDiT: missing {missing}, unexpected {unexpected}")
        dm.to(load_device)
        patcher = comfy.model_patcher.ModelPatcher(
            model, load_device=load_device,
            offload_device=comfy.model_management.unet_offload_device())
        return (patcher,)


class ZImageCheckVAE:
    @classmethod
    def INPUT_TYPES(cls):  # noqa: N802
        return {"required": {"model_folder": ("STRING", {"default": ""})}}

    RETURN_TYPES = ("VAE",)
    FUNCTION = "load"
    CATEGORY = "zimage_check"

    def load(self, model_folder):
        vdir = os.path.join(model_folder, "vae")
        with open(os.path.join(vdir, "config.json")) as f:
            cfg = json.load(f)
        levels = len(cfg["block_out_channels"])
        base = cfg["block_out_channels"][0]
        sd = diffusers_convert.convert_vae_state_dict(_load_safetensors(_one_file(vdir)))
        renamed = {}
        for k, v in sd.items():  # ComfyUI's map numbers diffusers up blocks as up.{3 - i}
            if k.startswith("decoder.up."):
                parts = k.split(".")
                parts[2] = str(int(parts[2]) - (4 - levels))
                k = ".".join(parts)
            renamed[k] = v
        ddconfig = {"double_z": True, "z_channels": cfg["latent_channels"], "resolution": 256,
                    "in_channels": cfg["in_channels"], "out_ch": cfg["out_channels"], "ch": base,
                    "ch_mult": [c // base for c in cfg["block_out_channels"]],
                    "num_res_blocks": cfg["layers_per_block"], "attn_resolutions": [],
                    "dropout": 0.0}
        vae = comfy.sd.VAE(sd=renamed, config={"params": {"ddconfig": ddconfig,
                                                          "embed_dim": cfg["latent_channels"]}})
        fsm = vae.first_stage_model
        fsm.quant_conv = torch.nn.Identity()       # the Flux / Z-Image VAE has no quant convs
        fsm.post_quant_conv = torch.nn.Identity()
        expected = {k for k in fsm.state_dict()}
        missing = sorted(expected - set(renamed))
        if missing:
            raise RuntimeError(f"ComfyUI VAE: weights missing for {missing[:8]}")
        ratio = 2 ** (levels - 1)
        vae.downscale_ratio = vae.upscale_ratio = ratio
        vae.latent_channels = cfg["latent_channels"]
        return (vae,)


class ZImageCheckTextEncode:
    _cache = {}

    @classmethod
    def INPUT_TYPES(cls):  # noqa: N802
        return {"required": {"model_folder": ("STRING", {"default": ""}),
                             "prompt": ("STRING", {"multiline": True, "default": ""})}}

    RETURN_TYPES = ("CONDITIONING",)
    FUNCTION = "encode"
    CATEGORY = "zimage_check"

    def encode(self, model_folder, prompt):
        import transformers

        key = model_folder
        if key not in self._cache:
            tok = transformers.AutoTokenizer.from_pretrained(os.path.join(model_folder,
                                                                          "tokenizer"))
            with open(os.path.join(model_folder, "text_encoder", "config.json")) as f:
                cfg = json.load(f)
            import inspect

            theta = (cfg.get("rope_parameters") or {}).get("rope_theta",
                                                           cfg.get("rope_theta", 1e6))
            cfg.pop("architectures", None)
            if "rope_parameters" in inspect.signature(transformers.Qwen3Config).parameters:
                cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": theta}
                cfg.pop("rope_theta", None)
            else:  # transformers 4.x
                cfg.pop("rope_parameters", None)
                cfg["rope_theta"] = theta
            config = transformers.Qwen3Config(**cfg)
            model = transformers.Qwen3Model(config).to(torch.float32).eval()
            sd = _load_safetensors(_one_file(os.path.join(model_folder, "text_encoder")))
            sd = {k[len("model."):] if k.startswith("model.") else k: v.float()
                  for k, v in sd.items()}
            missing, unexpected = model.load_state_dict(sd, strict=False)
            missing = [m for m in missing if "rotary" not in m]
            if missing or unexpected:
                raise RuntimeError(f"text encoder: missing {missing}, unexpected {unexpected}")
            self._cache[key] = (tok, model)
        tok, model = self._cache[key]
        try:
            text = tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                           add_generation_prompt=True, enable_thinking=True)
        except Exception:  # noqa: BLE001 - a transformers that does not read chat_template.jinja
            text = f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"
        ids = tok([text], return_tensors="pt", truncation=True, max_length=512)
        with torch.no_grad():
            out = model(input_ids=ids.input_ids, attention_mask=ids.attention_mask,
                        output_hidden_states=True)
        feats = out.hidden_states[-2][0][ids.attention_mask[0].bool()]
        return ([[feats[None].to(torch.float32), {}]],)


class ZImageCheckEmptyLatent:
    @classmethod
    def INPUT_TYPES(cls):  # noqa: N802
        return {"required": {"width": ("INT", {"default": 64, "min": 16, "max": 4096}),
                             "height": ("INT", {"default": 64, "min": 16, "max": 4096}),
                             "downscale": ("INT", {"default": 2, "min": 1, "max": 64}),
                             "channels": ("INT", {"default": 16, "min": 1, "max": 64})}}

    RETURN_TYPES = ("LATENT",)
    FUNCTION = "make"
    CATEGORY = "zimage_check"

    def make(self, width, height, downscale, channels):
        latent = torch.zeros([1, channels, height // downscale, width // downscale],
                             device=comfy.model_management.intermediate_device())
        return ({"samples": latent},)


NODE_CLASS_MAPPINGS = {
    "ZImageCheckComfyDiT": ZImageCheckComfyDiT,
    "ZImageCheckVAE": ZImageCheckVAE,
    "ZImageCheckTextEncode": ZImageCheckTextEncode,
    "ZImageCheckEmptyLatent": ZImageCheckEmptyLatent,
}
NODE_DISPLAY_NAME_MAPPINGS = {k: k for k in NODE_CLASS_MAPPINGS}
