"""zimage's ComfyUI nodes: a loader giving a ZIMAGE_ENGINE, and a text-to-image node (with
image-to-image, inpainting and ControlNet inputs) giving ComfyUI IMAGEs, both on zimage.Engine.

ComfyUI's modules (folder_paths, comfy.utils, comfy.model_management) are imported where they
are used, so this file imports without ComfyUI (its unit test, python/tests/test_comfyui.py).
Progress goes to ComfyUI's progress bar (comfy.utils.ProgressBar) and ComfyUI's cancel is
honoured between denoising steps: on_step calls
comfy.model_management.throw_exception_if_processing_interrupted(), whose exception stops the
engine and reaches ComfyUI unchanged.
"""

from __future__ import annotations

import os

import numpy as np

import zimage

NONE = "(none)"
MAX_SEED = 2**64 - 1
# The loaders' fp8_layers input (zimage generate --fp8-layers).
FP8_LAYERS_TIP = ("with precision fp8: the DiT layers in FP8, e.g. all (every linear), or "
                  "all,sdpa to run the attention in FP8 too (H100/H200; quality in zimage's "
                  "docs/BENCHMARKS.md)")


def _folder_files(kind: str) -> list:
    """ComfyUI's model files of one kind (diffusion_models, text_encoders, vae), or none
    outside ComfyUI."""
    try:
        import folder_paths
    except ImportError:
        return [NONE]
    try:
        return [NONE] + list(folder_paths.get_filename_list(kind))
    except Exception:  # noqa: BLE001 - an unknown kind in an older ComfyUI
        return [NONE]


def _full_path(kind: str, name: str) -> str | None:
    if not name or name == NONE:
        return None
    if os.path.isabs(name):
        return name
    import folder_paths

    path = folder_paths.get_full_path(kind, name)
    if path is None:
        raise zimage.InvalidArgument(f"{kind}: '{name}' is not in ComfyUI's {kind} folders", kind)
    return path


def _to_numpy_images(image) -> list:
    """A ComfyUI IMAGE (torch [B, H, W, C] float in [0, 1]) as uint8 arrays, rounded so an image
    loaded from an 8-bit file comes back with its own bytes."""
    array = image.detach().cpu().numpy() if hasattr(image, "detach") else np.asarray(image)
    if array.ndim == 3:
        array = array[None]
    return [np.round(np.clip(a, 0.0, 1.0) * 255.0).astype(np.uint8) for a in array]


def _to_comfy_images(arrays: list):
    """uint8 [H, W, 3] arrays as one ComfyUI IMAGE: [B, H, W, 3] float32 in [0, 1] (a torch
    tensor; numpy when torch is missing, i.e. outside ComfyUI)."""
    batch = np.stack(arrays).astype(np.float32) / 255.0
    try:
        import torch
    except ImportError:
        return batch
    return torch.from_numpy(batch)


class ZImageLoader:
    """Loads Z-Image once: a diffusers folder, or single files from ComfyUI's model folders
    (diffusion_models / text_encoders / vae; plain, FP8 or scaled FP8), each replacing that part
    of the folder. An empty folder and no files: zimage's tiny built-in test model."""

    CATEGORY = "zimage"
    RETURN_TYPES = ("ZIMAGE_ENGINE",)
    RETURN_NAMES = ("engine",)
    FUNCTION = "load"

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "model_folder": ("STRING", {"default": "", "tooltip":
                                 "a diffusers Z-Image folder (empty: the single files below)"}),
                "device": (["auto", "cuda", "cpu"], {"default": "auto"}),
                "precision": (["auto", "bf16", "fp8", "f32"], {"default": "auto"}),
                "weights": (["bf16", "fp8"], {"default": "bf16"}),
                "vram_budget_gib": ("FLOAT", {"default": 0.0, "min": 0.0, "max": 1024.0,
                                              "step": 0.5, "tooltip": "0: no limit"}),
            },
            "optional": {
                "dit": (_folder_files("diffusion_models"), {"default": NONE}),
                "text_encoder": (_folder_files("text_encoders"), {"default": NONE}),
                "vae": (_folder_files("vae"), {"default": NONE}),
                "controlnet": ("STRING", {"default": ""}),
                "streamed_weights": (["copy", "files", "locked-files"], {"default": "copy",
                                     "tooltip": "under a VRAM budget, where the streamed layers "
                                                "come from: host copies made at load, or the "
                                                "weight files (no load-time copy)"}),
                "fp8_layers": ("STRING", {"default": "all", "tooltip": FP8_LAYERS_TIP}),
            },
        }

    def load(self, model_folder, device, precision, weights, vram_budget_gib, dit=NONE,
             text_encoder=NONE, vae=NONE, controlnet="", streamed_weights="copy",
             fp8_layers="all"):
        engine = zimage.Engine(
            model_folder.strip() or None, device, dit=_full_path("diffusion_models", dit),
            text_encoder=_full_path("text_encoders", text_encoder), vae=_full_path("vae", vae),
            precision=precision, weights=weights, vram_budget=vram_budget_gib,
            streamed_weights=streamed_weights, controlnet=controlnet.strip() or None,
            fp8_layers=fp8_layers.strip() or "all")
        return (engine,)


class ZImageTextToImage:
    """Text to image on a ZIMAGE_ENGINE; with init_image (and mask, white = repaint) image to
    image / inpainting, with control_image a ControlNet (the loader's controlnet)."""

    CATEGORY = "zimage"
    RETURN_TYPES = ("IMAGE",)
    RETURN_NAMES = ("images",)
    FUNCTION = "generate"

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "engine": ("ZIMAGE_ENGINE",),
                "prompt": ("STRING", {"multiline": True, "default": ""}),
                "negative_prompt": ("STRING", {"multiline": True, "default": ""}),
                "width": ("INT", {"default": 1024, "min": 16, "max": 4096, "step": 16}),
                "height": ("INT", {"default": 1024, "min": 16, "max": 4096, "step": 16}),
                "steps": ("INT", {"default": 8, "min": 1, "max": 1000}),
                "guidance": ("FLOAT", {"default": 0.0, "min": 0.0, "max": 100.0, "step": 0.1}),
                "seed": ("INT", {"default": 0, "min": 0, "max": MAX_SEED}),
                "batch_size": ("INT", {"default": 1, "min": 1, "max": 16}),
            },
            "optional": {
                "init_image": ("IMAGE",),
                "mask": ("MASK",),
                "strength": ("FLOAT", {"default": 0.6, "min": 0.01, "max": 1.0, "step": 0.01}),
                "control_image": ("IMAGE",),
                "control_scale": ("FLOAT", {"default": 0.75, "min": 0.0, "max": 2.0,
                                            "step": 0.05}),
            },
        }

    def generate(self, engine, prompt, negative_prompt, width, height, steps, guidance, seed,
                 batch_size, init_image=None, mask=None, strength=0.6, control_image=None,
                 control_scale=0.75):
        progress = _progress_bar(steps)

        def on_step(step, total):
            if progress is not None:
                progress.update_absolute(step, total)
            _throw_if_interrupted()

        init = _to_numpy_images(init_image)[0] if init_image is not None else None
        mask_array = None
        if mask is not None:  # ComfyUI MASK: [B, H, W] or [H, W] float, 1 = repaint
            m = mask.detach().cpu().numpy() if hasattr(mask, "detach") else np.asarray(mask)
            mask_array = np.round(np.clip(m.reshape(m.shape[-2:]) if m.ndim == 3 else m,
                                          0.0, 1.0) * 255.0).astype(np.uint8)
        control = _to_numpy_images(control_image)[0] if control_image is not None else None
        arrays = engine.generate(
            prompt, negative_prompt or None, width=width, height=height, steps=steps,
            guidance=guidance, seed=seed, images_per_prompt=batch_size, init_image=init,
            mask=mask_array, strength=strength if init is not None else None,
            control_image=control, control_scale=control_scale, on_step=on_step,
            output_type="np")
        return (_to_comfy_images(arrays),)


def _progress_bar(total):
    try:
        import comfy.utils
    except ImportError:
        return None
    return comfy.utils.ProgressBar(total)


def _throw_if_interrupted():
    try:
        import comfy.model_management
    except ImportError:
        return
    comfy.model_management.throw_exception_if_processing_interrupted()


NODE_CLASS_MAPPINGS = {
    "ZImageLoader": ZImageLoader,
    "ZImageTextToImage": ZImageTextToImage,
}
NODE_DISPLAY_NAME_MAPPINGS = {
    "ZImageLoader": "Z-Image loader (zimage)",
    "ZImageTextToImage": "Z-Image text to image (zimage)",
}
