"""ComfyUI MODEL node: a Z-Image model whose diffusion forward is zimage's DiT.

ComfyUI runs Z-Image as its Lumina2-family model (``comfy.supported_models.ZImage``: the
``model_base.Lumina2`` wrapper, flow sampling with shift 3.0). This node builds that wrapper
without its own network (``disable_unet_model_creation``, as SGLang's ComfyUI plugin does) and
puts ``ZImageDiffusionModel`` where ComfyUI's ``NextDiT`` would be: ComfyUI's KSampler, samplers,
schedulers, CFG and progress bar drive it; only the DiT forward is zimage's, through
``zimage.torch.ZImageTransformer2DModel`` (DLPack, on ComfyUI's current CUDA stream).

What NextDiT.forward does and this one does too: ``t = 1 - timesteps`` (ComfyUI's timesteps are
the flow sigmas; the model multiplies by t_scale), the latent padded to the patch size and
cropped back, every row of ``context`` used as caption features (NextDiT ignores the attention
mask), the output negated. What it refuses with a clear error: ControlNet residuals, reference
latents (omni) and model patches that reach inside the network (``transformer_options
["patches"]``); LoRAs are given to the loader instead.
"""

from __future__ import annotations

import torch

import comfy.ldm.common_dit
import comfy.model_management
import comfy.model_patcher
import comfy.supported_models
import folder_paths

from zimage.torch import ZImageTransformer2DModel


class ZImageDiffusionModel(torch.nn.Module):
    """Stands in for ComfyUI's NextDiT: forward(x, timesteps, context, num_tokens, ...)."""

    def __init__(self, transformer: ZImageTransformer2DModel):
        super().__init__()
        self.transformer = transformer
        self.patch_size = transformer.all_patch_size[0]
        self.dtype = transformer.dtype

    def forward(self, x, timesteps, context, num_tokens=None, attention_mask=None,
                transformer_options=None, control=None, ref_latents=None, **kwargs):
        if control is not None:
            raise RuntimeError("zimage MODEL: ControlNet residuals are not supported; use the "
                               "zimage text-to-image node's control_image input")
        if ref_latents:
            raise RuntimeError("zimage MODEL: reference latents (omni mode) are not supported")
        patches = (transformer_options or {}).get("patches", {})
        if patches:
            raise RuntimeError("zimage MODEL: model patches (" + ", ".join(sorted(patches)) +
                               ") cannot reach inside zimage's DiT; remove those nodes")
        bs, _, h, w = x.shape
        p = self.patch_size
        x = comfy.ldm.common_dit.pad_to_patch_size(x, (p, p))
        t = 1.0 - timesteps  # as NextDiT: ComfyUI's timesteps are sigmas
        if t.dim() == 0:
            t = t.expand(bs)
        xs = [x[i].unsqueeze(1) for i in range(bs)]       # [C, 1, H, W] each
        caps = [context[i] for i in range(bs)]            # [L, 2560] each, every row
        outs = self.transformer._run(xs, t.float(), caps)  # noqa: SLF001 (same package)
        img = torch.stack([o.squeeze(1) for o in outs], dim=0)[:, :, :h, :w]
        return -img


def zimage_comfy_model(transformer: ZImageTransformer2DModel) -> comfy.model_patcher.ModelPatcher:
    """A ComfyUI MODEL (ModelPatcher around model_base.Lumina2) running ``transformer``."""
    config = comfy.supported_models.ZImage({
        "image_model": "lumina2",
        "dim": transformer.dim,
        "disable_unet_model_creation": True,
    })
    dtype = transformer.dtype
    config.set_inference_dtype(dtype, None)
    model = config.get_model({})
    model.diffusion_model = ZImageDiffusionModel(transformer)
    load_device = comfy.model_management.get_torch_device()
    if transformer.device.type == "cpu":
        load_device = torch.device("cpu")
    return comfy.model_patcher.ModelPatcher(
        model, load_device=load_device,
        offload_device=comfy.model_management.unet_offload_device())


class ZImageModelLoader:
    """Loads a Z-Image DiT into zimage and gives a ComfyUI MODEL for KSampler."""

    @classmethod
    def INPUT_TYPES(cls):  # noqa: N802 (ComfyUI's name)
        return {
            "required": {
                "unet_name": (folder_paths.get_filename_list("diffusion_models"),),
                "device": (["auto", "cuda", "cpu"], {"default": "auto"}),
                "precision": (["auto", "bf16", "fp8", "f32"], {"default": "auto"}),
                "weights": (["bf16", "fp8"], {"default": "bf16"}),
            },
            "optional": {
                # A diffusers folder (model or transformer/) instead of a file from the list.
                "path": ("STRING", {"default": ""}),
                "lora_name": (["None"] + folder_paths.get_filename_list("loras"),),
                "lora_strength": ("FLOAT", {"default": 1.0, "min": -10.0, "max": 10.0,
                                            "step": 0.01}),
                "fp8_layers": ("STRING", {"default": "all", "tooltip":
                               "with precision fp8: the DiT layers in FP8, e.g. all (every "
                               "linear), or all,sdpa to run the attention in FP8 too "
                               "(H100/H200)"}),
            },
        }

    RETURN_TYPES = ("MODEL",)
    FUNCTION = "load"
    CATEGORY = "zimage"

    def load(self, unet_name, device, precision, weights, path="", lora_name="None",
             lora_strength=1.0, fp8_layers="all"):
        src = path.strip() or folder_paths.get_full_path_or_raise("diffusion_models", unet_name)
        loras = []
        if lora_name and lora_name != "None":
            loras.append((folder_paths.get_full_path_or_raise("loras", lora_name), lora_strength))
        transformer = ZImageTransformer2DModel.from_pretrained(
            src, device=device, precision=precision, weights=weights, loras=loras,
            fp8_layers=fp8_layers.strip() or "all")
        return (zimage_comfy_model(transformer),)


NODE_CLASS_MAPPINGS = {"ZImageModelLoader": ZImageModelLoader}
NODE_DISPLAY_NAME_MAPPINGS = {"ZImageModelLoader": "Load Z-Image model (zimage DiT)"}
