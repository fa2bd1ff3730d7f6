"""zimage.Engine: load a Z-Image model once, then turn prompts into images."""

from __future__ import annotations

import os
import threading
from typing import Callable, Iterable, Optional, Sequence, Union

from . import _zimage
from ._errors import invalid
from ._images import to_pil, to_rgb_array

_UINT64_MAX = (1 << 64) - 1

LoraArg = Union[None, str, os.PathLike, Sequence, dict]


def _path(value, field: str) -> str:
    if value is None:
        return ""
    try:
        return os.fspath(value)
    except TypeError:
        raise invalid(field, f"expected a path, got {type(value).__name__}") from None


def _loras(value: LoraArg, field: str = "loras") -> list:
    """LoRAs as (path, scale) pairs. Accepted: a path; a list of paths or (path, scale) pairs;
    a {path: scale} dict."""
    if value is None:
        return []
    if isinstance(value, (str, os.PathLike)):
        value = [value]
    items = value.items() if isinstance(value, dict) else value
    out = []
    for i, item in enumerate(items):
        if isinstance(item, (str, os.PathLike)):
            path, scale = item, 1.0
        else:
            try:
                path, scale = item
            except (TypeError, ValueError):
                raise invalid(f"{field}[{i}]", "expected a path or a (path, scale) pair") from None
        if isinstance(scale, bool) or not isinstance(scale, (int, float)):
            raise invalid(f"{field}[{i}]", f"the scale must be a number, got {scale!r}")
        out.append((_path(path, f"{field}[{i}]"), float(scale)))
    return out


def _int(value, field: str, bits: int = 32) -> int:
    """An integer argument; outside a C int (or uint64 for bits=64) it is the engine's range
    error, named by its field, rather than a Python type error."""
    if isinstance(value, bool) or not isinstance(value, int):
        if not hasattr(value, "__index__"):  # numpy integers have it
            raise invalid(field, f"expected an integer, got {value!r}")
        value = int(value.__index__())
    if bits == 32 and not -(1 << 31) <= value < (1 << 31):
        raise invalid(field, f"{value} is out of range")
    return value


def _float(value, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        if hasattr(value, "__float__") and not isinstance(value, str):
            return float(value)
        raise invalid(field, f"expected a number, got {value!r}")
    return float(value)


class Engine:
    """A loaded Z-Image model on one device.

    ``model``: a diffusers Z-Image folder (``model_index.json``, ``transformer/``, ...), or
    ``None`` / ``"builtin"`` for the tiny built-in random-weight model of the ``zimage`` program
    (its pictures are noise; it shows the path works). ``dit``, ``text_encoder``, ``vae``: single
    ``.safetensors`` files (ComfyUI / original names, FP8, all-in-one checkpoints), each replacing
    that part of ``model``; all three need no ``model``. ``device``: "auto" (CUDA when usable),
    "cpu", "cuda", "cuda:N". ``precision``: "auto", "bf16", "f32", "fp8". ``weights``: "bf16" or
    "fp8" storage. ``vram_budget``: GiB the process may hold on the GPU (0: no limit).
    ``host_memory``: GiB the weights streamed under a budget may page-lock (0: half of the
    machine's memory; with ``streamed_weights="files"``, none: the copies that mode still makes,
    FP8 rows, stay pageable); the rest stream from pageable memory. ``streamed_weights``: "copy" (host
    copies made at load: the fastest steps) or "files" (read from the weight files at each step:
    no load-time copy, a first image sooner; for a short-lived engine) or "locked-files" (those
    file pages page-locked in place up to ``host_memory``).
    ``loras``: merged at load (see ``generate`` for the accepted forms). ``controlnet``: a Z-Image
    ControlNet folder or file. ``threads``: CPU threads (0: all).

    Errors raise zimage.Error subclasses (zimage.NotFound for a missing folder, zimage.InvalidArgument
    naming the option, ...). The engine may be shared by threads: calls run one at a time, and
    the GIL is released while one runs.
    """

    def __init__(self, model: Union[None, str, os.PathLike] = None, device: str = "auto", *,
                 dit=None, text_encoder=None, vae=None, tokenizer=None,
                 precision: str = "auto", weights: str = "bf16", vram_budget: float = 0,
                 host_memory: float = 0, streamed_weights: str = "copy", loras: LoraArg = None, controlnet=None, threads: int = 0,
                 fp8_layers: str = "all", vae_tiling: str = "auto", lora_lenient: bool = False):
        files = {"dit": _path(dit, "dit"), "text_encoder": _path(text_encoder, "text_encoder"),
                 "vae": _path(vae, "vae")}
        given = [k for k, v in files.items() if v]
        model_dir = "" if model is None or model == "builtin" else _path(model, "model")
        tokenizer_dir = _path(tokenizer, "tokenizer")
        self.builtin = False
        if not model_dir:
            if 0 < len(given) < 3:
                raise invalid("model", f"{', '.join(given)} without a model folder: give dit, "
                                       "text_encoder and vae, or a model folder for the rest")
            builtin = _zimage.builtin_model_dir()
            if given:
                tokenizer_dir = tokenizer_dir or os.path.join(builtin, "tokenizer")
            else:
                model_dir = builtin
                self.builtin = True
        for name in ("device", "precision", "weights", "fp8_layers", "vae_tiling",
                     "streamed_weights"):
            if not isinstance(locals()[name], str):
                raise invalid(name, f"expected a string, got {locals()[name]!r}")
        self.model = model_dir
        self._calling = threading.local()  # on_step calling back into this engine would deadlock
        self._native = _zimage.Engine(
            model_dir=model_dir, dit_file=files["dit"], text_encoder_file=files["text_encoder"],
            vae_file=files["vae"], tokenizer_dir=tokenizer_dir, device=device,
            precision=precision, fp8_layers=fp8_layers, weights=weights,
            vram_budget_gib=_float(vram_budget, "vram_budget"),
            host_memory_gib=_float(host_memory, "host_memory"),
            streamed_weights=streamed_weights, vae_tiling=vae_tiling,
            threads=_int(threads, "threads"), loras=_loras(loras), lora_lenient=bool(lora_lenient),
            controlnet=_path(controlnet, "controlnet"))

    def info(self) -> dict:
        """What the loaded model is and accepts: device, precision, weights, size_multiple (width
        and height must be multiples of it), max_side, max_batch, memory plan, device memory."""
        return self._native.info()

    def generate(self, prompt: Union[str, Iterable[str]], negative_prompt: Optional[str] = None,
                 *, width: Optional[int] = None, height: Optional[int] = None, steps: int = 8,
                 guidance: float = 0.0, seed: int = 0, images_per_prompt: int = 1,
                 init_image=None, mask=None, strength: Optional[float] = None,
                 control_image=None, control_scale: float = 0.75, loras: LoraArg = None,
                 on_step: Optional[Callable[[int, int], object]] = None,
                 output_type: str = "pil", cfg_truncation: float = 1.0,
                 cfg_normalization: float = 0.0, max_sequence_length: int = 512) -> list:
        """Images for ``prompt`` (a string or a list: one batch), ``images_per_prompt`` each,
        prompt 0's first: a list of PIL images (``output_type="pil"``) or of numpy uint8 arrays
        [height, width, 3] (``"np"``).

        ``width`` / ``height``: default 1024 (64 with the built-in model); multiples of
        ``info()["size_multiple"]``. ``guidance``: CFG scale in diffusers' form (0: off;
        ``negative_prompt`` is used only above 0). ``seed``: 0 .. 2**64-1; the noise equals
        ``torch.randn(..., generator=torch.Generator("cpu").manual_seed(seed))``.
        ``init_image`` (+ ``mask``, white = repaint; + ``strength`` in (0, 1]): image-to-image
        and inpainting; ``control_image`` / ``control_scale``: ControlNet (the engine needs
        ``controlnet=``). Images are PIL images or numpy arrays (see zimage._images). ``loras``:
        for this call only, on top of the engine's: a path, a list of paths or (path, scale)
        pairs, or a {path: scale} dict.

        ``on_step(step, total)`` is called after each denoising step (step = 1..total), in the
        calling thread. Return False (exactly False; None continues) or raise to stop: the call
        then raises zimage.Cancelled (for False) or the callback's own exception. Errors are
        zimage.Error subclasses; an argument's error names it in ``.field``.
        """
        if isinstance(prompt, str):
            prompts = [prompt]
        else:
            try:
                prompts = list(prompt)
            except TypeError:
                raise invalid("prompt", "expected a string or a list of strings") from None
            for i, p in enumerate(prompts):
                if not isinstance(p, str):
                    raise invalid(f"prompts[{i}]", f"expected a string, got {type(p).__name__}")
        if negative_prompt is not None and not isinstance(negative_prompt, str):
            raise invalid("negative_prompt", "expected a string")
        if output_type not in ("pil", "np"):
            raise invalid("output_type", f"expected 'pil' or 'np', got {output_type!r}")
        if on_step is not None and not callable(on_step):
            raise invalid("on_step", "expected a callable (step, total)")
        seed = _int(seed, "seed", bits=64)
        if not 0 <= seed <= _UINT64_MAX:
            raise invalid("seed", f"{seed} is outside 0 .. 2**64-1")
        if getattr(self._calling, "active", False):
            raise invalid("on_step", "the callback must not call the engine that calls it")
        self._calling.active = True
        try:
            arrays = self._generate(prompts, negative_prompt, width, height, steps, guidance,
                                    seed, images_per_prompt, init_image, mask, strength,
                                    control_image, control_scale, loras, on_step,
                                    cfg_truncation, cfg_normalization, max_sequence_length)
        finally:
            self._calling.active = False
        return to_pil(arrays) if output_type == "pil" else list(arrays)

    def _generate(self, prompts, negative_prompt, width, height, steps, guidance, seed,
                  images_per_prompt, init_image, mask, strength, control_image, control_scale,
                  loras, on_step, cfg_truncation, cfg_normalization, max_sequence_length):
        default_side = 64 if self.builtin else 1024
        return self._native.generate(
            prompts=prompts, negative_prompt=negative_prompt,
            width=_int(default_side if width is None else width, "width"),
            height=_int(default_side if height is None else height, "height"),
            steps=_int(steps, "steps"), guidance=_float(guidance, "guidance"), seed=seed,
            images_per_prompt=_int(images_per_prompt, "images_per_prompt"),
            cfg_truncation=_float(cfg_truncation, "cfg_truncation"),
            cfg_normalization=_float(cfg_normalization, "cfg_normalization"),
            max_sequence_length=_int(max_sequence_length, "max_sequence_length"),
            init_image=to_rgb_array(init_image, "init_image"), mask=to_rgb_array(mask, "mask"),
            strength=None if strength is None else _float(strength, "strength"),
            control_image=to_rgb_array(control_image, "control_image"),
            control_scale=_float(control_scale, "control_scale"), loras=_loras(loras),
            on_step=on_step)
