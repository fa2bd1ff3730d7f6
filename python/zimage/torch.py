"""zimage's DiT as a drop-in for diffusers' ``ZImageTransformer2DModel``.

    from diffusers import ZImagePipeline
    import zimage.torch

    pipe = ZImagePipeline.from_pretrained("Z-Image-Turbo", torch_dtype=torch.bfloat16).to("cuda")
    pipe.transformer = zimage.torch.ZImageTransformer2DModel.from_pretrained(
        "Z-Image-Turbo/transformer", device="cuda", precision="bf16")
    image = pipe("a red fox in snow", num_inference_steps=8, guidance_scale=0.0).images[0]

The call is diffusers' (``model(x_list, t, cap_feats, return_dict=False)[0]`` is a list of
``[C, 1, H, W]`` tensors); tensors are exchanged through DLPack without copies and the work is
ordered on ``torch.cuda.current_stream()`` (the engine waits for it and makes it wait for the
outputs, no host synchronisation except for reading the B timesteps). Tensors on another device
than the engine's are moved there and the outputs moved back (a copy, said in the docs).
img2img and inpainting pipelines call the transformer the same way and work unchanged; a
ControlNet pipeline passes ``controlnet_block_samples``, which this class refuses (see
docs/PYTHON.md, "Drop-in transformer").
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

import torch

from . import _zimage  # the compiled module (python/src); registers Transformer

__all__ = ["ZImageTransformer2DModel", "Transformer2DModelOutput"]

_PRECISION_DTYPE = {"bf16": torch.bfloat16, "fp8": torch.bfloat16, "f32": torch.float32}


class Transformer2DModelOutput:
    """diffusers' Transformer2DModelOutput: ``.sample`` (here a list of tensors), indexable."""

    def __init__(self, sample: list[torch.Tensor]):
        self.sample = sample

    def __getitem__(self, i: int):
        return (self.sample,)[i]


class _Config(dict):
    """The model's config as diffusers exposes it: ``config.in_channels`` and ``config["dim"]``."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError as e:
            raise AttributeError(name) from e


class ZImageTransformer2DModel(torch.nn.Module):
    """zimage's Z-Image DiT, called as diffusers' ``ZImageTransformer2DModel``.

    A ``torch.nn.Module`` without parameters (the weights live in the engine), so a diffusers
    pipeline accepts it as a component; ``.to()`` and ``.eval()`` change nothing (the device is
    chosen at load).
    """

    _keep_in_fp32_modules = None
    _no_split_modules = None

    def __init__(self, engine: Any):
        super().__init__()
        self._engine = engine
        info = dict(engine.info)
        self._info = info
        config_keys = ("all_patch_size", "all_f_patch_size", "in_channels", "dim", "n_layers",
                       "n_refiner_layers", "n_heads", "n_kv_heads", "norm_eps", "qk_norm",
                       "cap_feat_dim", "rope_theta", "t_scale", "axes_dims", "axes_lens")
        self.config = _Config({k: info[k] for k in config_keys})
        self.config["_class_name"] = "ZImageTransformer2DModel"
        self.config["siglip_feat_dim"] = None
        self.in_channels = info["in_channels"]
        self.out_channels = info["in_channels"]
        self.dim = info["dim"]
        self.n_heads = info["n_heads"]
        self.t_scale = info["t_scale"]
        self.all_patch_size = tuple(info["all_patch_size"])
        self.all_f_patch_size = tuple(info["all_f_patch_size"])
        self.axes_dims = list(info["axes_dims"])
        self.axes_lens = list(info["axes_lens"])
        self.precision = info["precision"]
        self._dtype = _PRECISION_DTYPE[info["precision"]]
        self._device = torch.device(info["memory_device"])
        self.gradient_checkpointing = False

    # ---- loading ----

    @classmethod
    def from_pretrained(cls, path: str, device: str | torch.device = "auto",
                        precision: str = "auto", weights: str = "bf16", fp8_layers: str = "all",
                        loras: Iterable[tuple[str, float]] = (), lora_lenient: bool = False,
                        threads: int = 0, torch_dtype: torch.dtype | None = None,
                        subfolder: str | None = None, **unused: Any) -> "ZImageTransformer2DModel":
        """Loads a model folder (its transformer/), a transformer folder or one DiT file.

        ``torch_dtype`` (diffusers' spelling) picks the precision when ``precision`` is "auto":
        bfloat16 -> "bf16", float32 -> "f32". ``subfolder`` is joined to ``path`` as diffusers
        does. Other diffusers keywords (``low_cpu_mem_usage``, ...) are accepted and ignored.
        """
        if subfolder:
            path = f"{path.rstrip('/')}/{subfolder}"
        if precision == "auto" and torch_dtype is not None:
            precision = {torch.bfloat16: "bf16", torch.float32: "f32"}.get(torch_dtype)
            if precision is None:
                raise ValueError(f"torch_dtype: {torch_dtype} is not torch.bfloat16 or torch.float32")
        engine = _zimage.Transformer(str(path), device=str(device), precision=precision,
                                     weights=weights, fp8_layers=fp8_layers,
                                     loras=[(str(p), float(s)) for p, s in loras],
                                     lora_lenient=lora_lenient, threads=threads)
        return cls(engine)

    # ---- what pipelines read ----

    @property
    def dtype(self) -> torch.dtype:
        return self._dtype

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def info(self) -> dict:
        """Device, precision, source and config of the loaded model."""
        return dict(self._info)

    def to(self, *args: Any, **kwargs: Any) -> "ZImageTransformer2DModel":
        return self  # the engine stays where it was loaded

    def set_attention_backend(self, *args: Any, **kwargs: Any) -> None:
        pass  # the engine picks its own attention kernels

    # ---- the call ----

    def forward(self, x: Sequence[torch.Tensor], t: torch.Tensor,
                cap_feats: Sequence[torch.Tensor], return_dict: bool = True,
                controlnet_block_samples: dict | None = None, siglip_feats: Any = None,
                image_noise_mask: Any = None, patch_size: int = 2, f_patch_size: int = 1,
                joint_attention_kwargs: dict | None = None):
        """diffusers' forward: ``x`` a list of ``[C, 1, H, W]`` latents, ``t`` the B timesteps as
        ZImagePipeline passes them ((1000 - T) / 1000), ``cap_feats`` a list of ``[L_i, D]``.
        Returns ``(list of [C, 1, H, W],)`` or a ``Transformer2DModelOutput``."""
        if joint_attention_kwargs and any(
                k != "scale" or v != 1.0 for k, v in joint_attention_kwargs.items()):
            # diffusers passes the pipeline's joint_attention_kwargs (a peft LoRA scale); the
            # drop-in's LoRAs are merged at load (from_pretrained(loras=...)).
            raise NotImplementedError(
                f"joint_attention_kwargs: {joint_attention_kwargs!r} is not supported; give LoRAs "
                "to from_pretrained(loras=[(file, scale)])")
        if controlnet_block_samples is not None:
            raise NotImplementedError(
                "controlnet_block_samples: zimage's drop-in transformer does not take ControlNet "
                "residuals; use zimage.Engine(controlnet=...) for ControlNet")
        if siglip_feats is not None or (len(x) > 0 and isinstance(x[0], list)):
            raise NotImplementedError("x: the omni (SigLIP) mode is not supported")
        if patch_size not in self.all_patch_size or f_patch_size not in self.all_f_patch_size:
            raise ValueError(f"patch_size: {patch_size}/{f_patch_size} is not this model's "
                             f"{self.all_patch_size[0]}/{self.all_f_patch_size[0]}")
        if len(x) != len(cap_feats):
            raise ValueError(f"cap_feats: has {len(cap_feats)} items, x has {len(x)}")
        out = self._run(list(x), t, list(cap_feats))
        return Transformer2DModelOutput(out) if return_dict else (out,)

    def _run(self, x: list[torch.Tensor], t: torch.Tensor | float,
             cap_feats: list[torch.Tensor]) -> list[torch.Tensor]:
        dev = self._device
        home = x[0].device if x else dev
        if not torch.is_tensor(t):
            t = torch.tensor([float(t)] * len(x), dtype=torch.float32)
        t = t.detach().reshape(-1)
        if t.device.type != "cpu" and t.device != dev:
            t = t.cpu()

        def prepare(v: torch.Tensor) -> torch.Tensor:
            v = v.detach()
            if v.device != dev:
                v = v.to(dev)
            return v.contiguous()

        xs = [prepare(v) for v in x]
        caps = [prepare(v) for v in cap_feats]
        outs = [torch.empty_like(v) for v in xs]  # the output dtype is the input's, as diffusers
        stream = torch.cuda.current_stream(dev).cuda_stream if dev.type == "cuda" else 0
        self._engine.forward(xs, t, caps, outs, stream)
        if home != dev:
            outs = [o.to(home) for o in outs]
        return outs

    def __repr__(self) -> str:
        return (f"zimage.torch.ZImageTransformer2DModel(device={self._info['device']!r}, "
                f"precision={self.precision!r}, source={self._info['source']!r})")
