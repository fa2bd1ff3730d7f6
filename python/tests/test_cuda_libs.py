"""zimage/_cuda_libs.py: CUDA libraries found in NVIDIA's wheel layout (site-packages/nvidia/
cu13/lib) are loaded from there. Uses this machine's real CUDA libraries, laid out as the wheels
lay them out, in a child interpreter."""

import importlib.util
import os
import subprocess
import sys

import pytest

SONAMES = ("libcudart.so.13", "libcublasLt.so.13", "libcublas.so.13", "libnccl.so.2",
           "libcudnn.so.9")


def _system_lib(soname):
    for d in ("/usr/local/cuda/lib", "/usr/local/cuda/lib64",
              "/usr/local/cuda/targets/x86_64-linux/lib"):
        if os.path.exists(os.path.join(d, soname)):
            return os.path.join(d, soname)
    return None


def test_missing_library_is_recognised():
    from zimage import _cuda_libs

    assert _cuda_libs.missing_library(ImportError("libcudart.so.13: cannot open shared object file"))
    assert _cuda_libs.missing_library(ImportError("libcudnn.so.9: cannot open shared object file"))
    assert not _cuda_libs.missing_library(ImportError("No module named 'numpy'"))


def test_preload_from_wheel_layout(tmp_path):
    libs = {s: _system_lib(s) for s in SONAMES}
    if not all(libs.values()):
        pytest.skip("no CUDA 13 libraries in /usr/local/cuda (a CPU-only machine)")
    lib = tmp_path / "site" / "nvidia" / "cu13" / "lib"
    lib.mkdir(parents=True)
    for soname, path in libs.items():
        os.symlink(path, lib / soname)
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from zimage import _cuda_libs; "
            "print('\\n'.join(_cuda_libs.preload_from_wheels()))")
    run = subprocess.run([sys.executable, "-c", code, str(tmp_path / "site")],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == [str(lib / s) for s in SONAMES]


def test_cublas_preloaded_from_wheel_layout_only(tmp_path):
    """The engine opens cuBLAS by soname at the backend's start; from NVIDIA's wheels it is loaded
    first (and only from there: without them nothing is loaded)."""
    libs = {s: _system_lib(s) for s in ("libcublasLt.so.13", "libcublas.so.13")}
    if not all(libs.values()):
        pytest.skip("no CUDA 13 cuBLAS in /usr/local/cuda (a CPU-only machine)")
    lib = tmp_path / "site" / "nvidia" / "cu13" / "lib"
    lib.mkdir(parents=True)
    for soname, path in libs.items():
        os.symlink(path, lib / soname)
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from zimage import _cuda_libs; "
            "print('\\n'.join(_cuda_libs.preload_cublas_from_wheels()))")
    run = subprocess.run([sys.executable, "-c", code, str(tmp_path / "site")],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == [str(lib / s) for s in libs]
    if importlib.util.find_spec("nvidia") is None:  # no wheels on this interpreter's path
        empty = tmp_path / "empty"
        empty.mkdir()
        run = subprocess.run([sys.executable, "-c", code, str(empty)], capture_output=True,
                             text=True)
        assert run.returncode == 0, run.stderr
        assert run.stdout.split() == []
