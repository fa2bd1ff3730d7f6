"""Image conversions between Python's forms (PIL images, numpy arrays) and the engine's
(C-contiguous uint8 RGB arrays [H, W, 3])."""

from __future__ import annotations

import numpy as np

from ._errors import invalid


def _is_pil(image) -> bool:
    try:
        from PIL import Image
    except ImportError:
        return False
    return isinstance(image, Image.Image)


def to_rgb_array(image, field: str):
    """``image`` as the engine takes it, or None. A PIL image is converted as diffusers'
    ``load_image`` does (``convert("RGB")``: gray replicated, alpha dropped); a numpy array may be
    [H, W] (gray), [H, W, 1], [H, W, 3] or [H, W, 4] (alpha dropped), uint8, or float in [0, 1]
    (scaled by 255 and rounded, as diffusers' ``numpy_to_pil``)."""
    if image is None:
        return None
    if _is_pil(image):
        array = np.asarray(image.convert("RGB"))
    elif isinstance(image, np.ndarray):
        array = image
    elif hasattr(image, "__array__"):  # e.g. a CPU torch tensor [H, W, C]
        array = np.asarray(image)
    else:
        raise invalid(field, f"expected a PIL image or a numpy array, got {type(image).__name__}")
    if array.ndim == 2:
        array = array[:, :, None]
    if array.ndim != 3 or array.shape[2] not in (1, 3, 4):
        raise invalid(field, f"expected an array [H, W], [H, W, 1], [H, W, 3] or [H, W, 4], "
                             f"got shape {list(array.shape)}")
    if array.shape[2] == 1:
        array = np.repeat(array, 3, axis=2)
    elif array.shape[2] == 4:
        array = array[:, :, :3]
    if array.dtype != np.uint8:
        if not np.issubdtype(array.dtype, np.floating):
            raise invalid(field, f"expected uint8 or float values, got {array.dtype}")
        if not np.all(np.isfinite(array)) or array.min(initial=0) < 0 or array.max(initial=0) > 1:
            raise invalid(field, "float values must be finite and in [0, 1]")
        array = np.round(array.astype(np.float64) * 255).astype(np.uint8)
    if array.shape[0] == 0 or array.shape[1] == 0:
        raise invalid(field, "the image is empty")
    return np.ascontiguousarray(array)


def to_pil(arrays):
    from PIL import Image

    return [Image.fromarray(a, "RGB") for a in arrays]
