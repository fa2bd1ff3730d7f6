"""zimage.diffusers.ZImagePipeline: diffusers' ``ZImagePipeline`` call answered by the zimage engine.

    from zimage.diffusers import ZImagePipeline
    pipe = ZImagePipeline.from_pretrained("Z-Image-Turbo", device="cuda")
    image = pipe("a red fox in snow", height=1024, width=1024, num_inference_steps=8,
                 guidance_scale=0.0, generator=torch.Generator("cpu").manual_seed(42)).images[0]

The images are diffusers' for the same generator: zimage draws its starting noise exactly as
``torch.randn(shape, generator=torch.Generator("cpu").manual_seed(seed))`` (PyTorch's CPU
Mersenne Twister and its Box-Muller transform, reimplemented bit for bit), which is what
diffusers' ``randn_tensor`` does with a CPU generator; the engine then matches diffusers' text
encoder, DiT, scheduler and VAE numerically. A CPU ``torch.Generator`` gives its seed
(``initial_seed()``, the ``manual_seed`` value) and must not have been drawn from yet; an int is
that seed. A CUDA generator draws different noise in diffusers (cuRAND's Philox): its seed is
used with a warning. torch is not needed unless you pass a generator or ask for "pt" output.
"""

from __future__ import annotations

import secrets
import warnings
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Union

import numpy as np

from ._engine import Engine
from ._errors import invalid
from ._images import to_pil


@dataclass
class ZImagePipelineOutput:
    """As diffusers' ZImagePipelineOutput: ``images`` is a list of PIL images, a numpy array
    [N, H, W, 3] of float32 in [0, 1], or a torch tensor [N, 3, H, W] (output_type "pt")."""

    images: Any


def _seed_of(generator) -> int:
    if generator is None:
        return secrets.randbits(63)
    if isinstance(generator, (list, tuple)):
        if len(generator) != 1:
            raise invalid("generator", "zimage draws a batch's noise from one generator: give one "
                                       "torch.Generator or a seed, not a list of several")
        generator = generator[0]
    if isinstance(generator, bool):
        raise invalid("generator", "expected a torch.Generator or an int seed")
    if isinstance(generator, (int, np.integer)):
        return int(generator)
    if hasattr(generator, "initial_seed") and hasattr(generator, "device"):
        if str(generator.device) != "cpu":
            warnings.warn("zimage: a CUDA torch.Generator draws other noise in diffusers than its "
                          "seed gives on the CPU; zimage uses its seed as a CPU generator's "
                          "(give torch.Generator('cpu') for diffusers' images)", stacklevel=3)
        return int(generator.initial_seed())
    raise invalid("generator", f"expected a torch.Generator or an int seed, got "
                               f"{type(generator).__name__}")


def _torch_dtype_precision(torch_dtype) -> Optional[str]:
    """diffusers' torch_dtype, checked: bfloat16 / float16 / float32 (or None). The engine picks
    its own compute precision (``precision=``); an explicit float32 asks for f32."""
    if torch_dtype is None:
        return None
    name = str(torch_dtype).replace("torch.", "")
    if name == "float32":
        return "f32"
    if name in ("bfloat16", "float16"):
        return None
    raise invalid("torch_dtype", f"{torch_dtype} is not a dtype zimage runs (bfloat16 or float32)")


class ZImagePipeline:
    """diffusers' ZImagePipeline on the zimage engine (text to image)."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self._interrupt = False
        self._num_timesteps = 0

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path=None, *, device: str = "auto",
                        torch_dtype=None, **engine_options) -> "ZImagePipeline":
        """Loads a local diffusers Z-Image folder (``None`` or ``"builtin"``: the built-in tiny
        model). ``device``: "auto", "cpu", "cuda", "cuda:N". ``torch_dtype`` is checked (see
        _torch_dtype_precision); other keywords go to zimage.Engine (``precision``, ``weights``,
        ``vram_budget``, ``loras``, ``dit``, ``text_encoder``, ``vae``, ``threads``, ...)."""
        precision = _torch_dtype_precision(torch_dtype)
        if precision is not None:
            engine_options.setdefault("precision", precision)
        return cls(Engine(pretrained_model_name_or_path, device, **engine_options))

    def to(self, device=None, *args, **kwargs) -> "ZImagePipeline":
        """Accepted for diffusers scripts; the engine's device is chosen at load
        (``from_pretrained(..., device=...)``), so this changes nothing."""
        return self

    @property
    def interrupt(self) -> bool:
        return self._interrupt

    @property
    def num_timesteps(self) -> int:
        return self._num_timesteps

    def __call__(self, prompt: Union[str, List[str]] = None, height: Optional[int] = None,
                 width: Optional[int] = None, num_inference_steps: int = 50,
                 sigmas=None, guidance_scale: float = 5.0,
                 cfg_normalization: Union[bool, float] = False, cfg_truncation: float = 1.0,
                 negative_prompt: Optional[Union[str, List[str]]] = None,
                 num_images_per_prompt: int = 1, generator=None, latents=None,
                 prompt_embeds=None, negative_prompt_embeds=None, output_type: str = "pil",
                 return_dict: bool = True, joint_attention_kwargs=None,
                 callback_on_step_end: Optional[Callable] = None,
                 callback_on_step_end_tensor_inputs: Optional[List[str]] = None,
                 max_sequence_length: int = 512):
        """diffusers' call. Differences: ``sigmas``, ``latents``, ``prompt_embeds`` and
        ``negative_prompt_embeds`` are not taken (InvalidArgument naming them); one negative
        prompt serves the batch; ``callback_on_step_end(pipe, i, t, callback_kwargs)`` gets
        ``t=None`` and an empty ``callback_kwargs`` (the latents stay inside the engine) and what
        it returns is ignored; setting ``pipe._interrupt = True`` in it stops the call with
        zimage.Cancelled (diffusers would decode the unfinished latents). ``output_type``: "pil",
        "np" (float32 [N, H, W, 3], the 8-bit image / 255), "pt" (torch float32 [N, 3, H, W],
        needs torch)."""
        for name, value in (("sigmas", sigmas), ("latents", latents),
                            ("prompt_embeds", prompt_embeds),
                            ("negative_prompt_embeds", negative_prompt_embeds)):
            if value is not None:
                raise invalid(name, "not supported by zimage's pipeline (give prompts and a seed)")
        if prompt is None:
            raise invalid("prompt", "a prompt or a list of prompts is required")
        if output_type not in ("pil", "np", "pt"):
            raise invalid("output_type", f"expected 'pil', 'np' or 'pt', got {output_type!r}")
        torch = None
        if output_type == "pt":
            try:
                import torch
            except ImportError:
                raise invalid("output_type", "'pt' needs torch, which is not installed") from None
        if isinstance(negative_prompt, (list, tuple)):
            if len(set(negative_prompt)) > 1:
                raise invalid("negative_prompt", "zimage takes one negative prompt for the batch")
            negative_prompt = negative_prompt[0] if negative_prompt else None
        seed = _seed_of(generator)
        self._interrupt = False
        self._num_timesteps = num_inference_steps
        on_step = None
        if callback_on_step_end is not None:
            if not callable(callback_on_step_end):
                raise invalid("callback_on_step_end", "expected a callable")

            def on_step(step: int, total: int):
                callback_on_step_end(self, step - 1, None, {})
                return False if self._interrupt else None

        arrays = self.engine.generate(
            prompt, negative_prompt, width=width, height=height,
            steps=num_inference_steps, guidance=guidance_scale, seed=seed,
            images_per_prompt=num_images_per_prompt, on_step=on_step, output_type="np",
            cfg_truncation=cfg_truncation, cfg_normalization=float(cfg_normalization),
            max_sequence_length=max_sequence_length)
        if output_type == "pil":
            images = to_pil(arrays)
        else:
            images = np.stack(arrays).astype(np.float32) / 255.0
            if output_type == "pt":
                images = torch.from_numpy(images).permute(0, 3, 1, 2).contiguous()
        if not return_dict:
            return (images,)
        return ZImagePipelineOutput(images=images)
