"""zimage: the Z-Image-Turbo inference engine (C++ / CUDA) from Python.

    import zimage
    engine = zimage.Engine(model="Z-Image-Turbo", device="auto")
    images = engine.generate(prompt="a red fox in snow", width=1024, height=1024, steps=8,
                             guidance=0.0, seed=42)          # -> list of PIL images

``zimage.Engine(model=None)`` uses the tiny built-in random-weight model (its pictures are
noise). ``zimage.diffusers.ZImagePipeline`` answers diffusers' ZImagePipeline call. Errors are
zimage.Error subclasses carrying the engine's message and the field at fault. docs/PYTHON.md.
"""

try:
    from . import _zimage
except ImportError as error:  # a CUDA build without the CUDA libraries on the loader's path
    from . import _cuda_libs

    if not _cuda_libs.missing_library(error):
        raise
    if not _cuda_libs.preload_from_wheels():
        raise ImportError(f"{error} (this zimage was built with CUDA: install CUDA 13 and cuDNN "
                          "9, or `pip install zimage-engine[cuda]` for NVIDIA's wheels)") from error
    from . import _zimage
# cuBLAS is opened by soname when a CUDA backend starts: from NVIDIA's wheels, when installed.
from . import _cuda_libs as _libs  # noqa: E402

_libs.preload_cublas_from_wheels()
from ._engine import Engine
from ._errors import (Cancelled, DeviceError, Error, FormatError, InternalError, InvalidArgument,
                      IOFailure, NotFound, OutOfMemory, Unsupported)

__version__ = _zimage.__version__


def builtin_model_dir() -> str:
    """The built-in model's folder (unpacked into the user's cache on first use)."""
    return _zimage.builtin_model_dir()


def cuda_device_count() -> int:
    """CUDA devices this process can use (0 without CUDA support, a driver or a GPU)."""
    return _zimage.cuda_device_count()


def set_log_verbosity(level: int) -> None:
    """Engine messages on stderr: 0 errors only, 1 warnings (default), 2 info, 3 debug."""
    _zimage.set_log_verbosity(level)


__all__ = ["Engine", "Error", "InvalidArgument", "NotFound", "IOFailure", "FormatError",
           "Unsupported", "OutOfMemory", "DeviceError", "Cancelled", "InternalError",
           "builtin_model_dir", "cuda_device_count", "set_log_verbosity", "__version__"]
