"""Shared fixtures of the Python package tests (run by ctest as Python.pytest, PYTHONPATH at the
module the build made; see python/CMakeLists.txt). The built-in model is unpacked into a
temporary cache for this session, by the module and the program alike."""

import json
import os
import shutil
import subprocess
import tempfile

import numpy as np
import pytest

_CACHE = tempfile.mkdtemp(prefix="zimage_pytest_cache_")
os.environ["XDG_CACHE_HOME"] = _CACHE  # before the first use of the built-in model

import zimage  # noqa: E402


def pytest_sessionfinish(session, exitstatus):
    shutil.rmtree(_CACHE, ignore_errors=True)


@pytest.fixture(scope="session")
def cli():
    """The `zimage` program of the same build."""
    path = os.environ.get("ZIMAGE_TEST_CLI", "")
    if not path or not os.access(path, os.X_OK):
        pytest.skip("ZIMAGE_TEST_CLI does not name the zimage program (run through ctest)")
    return path


@pytest.fixture(scope="session")
def golden_dir():
    path = os.environ.get("ZIMAGE_TEST_GOLDEN", "")
    if not path or not os.path.isdir(path):
        pytest.skip("ZIMAGE_TEST_GOLDEN does not name the unpacked golden cases (run through ctest)")
    return path


@pytest.fixture(scope="session")
def lora_dir():
    path = os.environ.get("ZIMAGE_TEST_LORA", "")
    if not path or not os.path.isfile(os.path.join(path, "peft.safetensors")):
        pytest.skip("ZIMAGE_TEST_LORA does not name the unpacked LoRA cases (run through ctest)")
    return path


@pytest.fixture(scope="session")
def engine():
    """The built-in tiny model on the CPU, shared by the tests (as threads would share it)."""
    return zimage.Engine(device="cpu")


def run_cli(cli, args, tmp_path, n_images=1):
    """Runs `zimage generate ARGS --output tmp/out.png` and returns its images as uint8 arrays."""
    from PIL import Image

    out = tmp_path / "out.png"
    run = subprocess.run([cli, "generate", *args, "--device", "cpu", "--quiet", "--output",
                          str(out)], capture_output=True, text=True, env=os.environ.copy())
    assert run.returncode == 0, run.stderr
    paths = [out] if n_images == 1 else [tmp_path / f"out_{i}.png" for i in range(n_images)]
    return [np.asarray(Image.open(p).convert("RGB")) for p in paths]


def max_diff(a, b) -> int:
    assert a.shape == b.shape, (a.shape, b.shape)
    return int(np.max(np.abs(a.astype(np.int32) - b.astype(np.int32))))


def read_case(path):
    with open(os.path.join(path, "case.json"), encoding="utf-8") as f:
        return json.load(f)
