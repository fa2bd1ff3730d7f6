"""Finding the CUDA libraries of a CUDA build of the extension.

The extension links the CUDA runtime, cuDNN and NCCL by their sonames, and opens cuBLAS(Lt) by
soname when a CUDA backend starts. When the
system's loader finds them (a CUDA install on the library path), nothing here runs. Otherwise
they may come from NVIDIA's PyPI wheels (``pip install zimage-engine[cuda]``), which put them in
``site-packages/nvidia/.../lib``: they are loaded from there first (globally, so the extension's
references resolve to them), as PyTorch does with the same wheels.
"""

from __future__ import annotations

import ctypes
import glob
import os
import sys

# Load order: each after what it needs.
_SONAMES = ("libcudart.so.13", "libcublasLt.so.13", "libcublas.so.13", "libnccl.so.2",
            "libcudnn.so.9")


def _wheel_lib_dirs() -> list:
    dirs = []
    for base in sys.path:
        nvidia = os.path.join(base or ".", "nvidia")
        if os.path.isdir(nvidia):
            dirs += sorted(glob.glob(os.path.join(nvidia, "cu13", "lib")))
            dirs += sorted(glob.glob(os.path.join(nvidia, "*", "lib")))
    return dirs


def _load_from_wheels(sonames) -> list:
    """Loads each of `sonames` found in NVIDIA's wheels, globally; returns the paths loaded."""
    loaded = []
    dirs = _wheel_lib_dirs()
    for soname in sonames:
        for d in dirs:
            path = os.path.join(d, soname)
            if os.path.exists(path):
                ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
                loaded.append(path)
                break
    return loaded


def preload_from_wheels() -> list:
    """Loads every CUDA library found in NVIDIA's wheels; returns the paths loaded."""
    return _load_from_wheels(_SONAMES)


def preload_cublas_from_wheels() -> list:
    """Loads cuBLAS(Lt) from NVIDIA's wheels when they are installed; returns the paths loaded.

    The engine does not link cuBLAS: it opens libcublasLt and libcublas by soname when a CUDA
    backend starts (src/backend/cuda/libs/cublas_loader.h), which finds a library already loaded
    under that soname. So with the wheels, and no CUDA install on the loader's path, they are
    loaded here first, as for the libraries the extension does link.
    """
    return _load_from_wheels(("libcublasLt.so.13", "libcublas.so.13"))


def missing_library(error: ImportError) -> bool:
    return any(name.split(".so")[0] in str(error) for name in _SONAMES)
