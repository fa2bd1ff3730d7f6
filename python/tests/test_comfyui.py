"""Unit test of the ComfyUI nodes' glue (comfyui/nodes.py) outside ComfyUI: a minimal stand-in
`comfy` package records the progress bar's updates and raises ComfyUI's interrupt on request.
This checks the nodes' own code (arguments, image conversions, progress, cancel); a real
ComfyUI run is the GPU machine's job (docs/COMFYUI.md)."""

import importlib
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import max_diff

REPO = Path(__file__).resolve().parents[2]

COMFY_UTILS = '''
updates = []
class ProgressBar:
    def __init__(self, total):
        self.total = total
    def update_absolute(self, value, total=None, preview=None):
        updates.append((value, total))
'''
COMFY_MM = '''
class InterruptProcessingException(Exception):
    pass
interrupt_at = None
polls = 0
def throw_exception_if_processing_interrupted():
    global polls
    polls += 1
    if interrupt_at is not None and polls >= interrupt_at:
        raise InterruptProcessingException()
'''


@pytest.fixture(scope="module")
def comfy(tmp_path_factory):
    root = tmp_path_factory.mktemp("fake_comfy")
    (root / "comfy").mkdir()
    (root / "comfy" / "__init__.py").write_text("")
    (root / "comfy" / "utils.py").write_text(COMFY_UTILS)
    (root / "comfy" / "model_management.py").write_text(COMFY_MM)
    sys.path[:0] = [str(root), str(REPO)]
    try:
        nodes = importlib.import_module("comfyui")
        utils = importlib.import_module("comfy.utils")
        mm = importlib.import_module("comfy.model_management")
        yield nodes, utils, mm
    finally:
        sys.path.remove(str(root))
        sys.path.remove(str(REPO))
        for name in ("comfy", "comfy.utils", "comfy.model_management", "comfyui",
                     "comfyui.nodes"):
            sys.modules.pop(name, None)


def test_text_to_image_node(comfy, engine):
    nodes, utils, mm = comfy
    assert set(nodes.NODE_CLASS_MAPPINGS) == {"ZImageLoader", "ZImageTextToImage"}
    loader = nodes.NODE_CLASS_MAPPINGS["ZImageLoader"]
    t2i = nodes.NODE_CLASS_MAPPINGS["ZImageTextToImage"]
    assert "engine" in t2i.INPUT_TYPES()["required"]
    assert loader.INPUT_TYPES()["optional"]["dit"][0] == [nodes.nodes.NONE]  # no folder_paths
    assert loader.INPUT_TYPES()["optional"]["streamed_weights"][0] == ["copy", "files",
                                                                        "locked-files"]
    (eng,) = loader().load("", "cpu", "auto", "bf16", 0.0, streamed_weights="files")
    utils.updates.clear()
    (images,) = t2i().generate(eng, "a red fox", "", 64, 48, 3, 0.0, 42, 2)
    assert images.shape == (2, 48, 64, 3) and images.dtype == np.float32  # IMAGE layout
    assert utils.updates == [(1, 3), (2, 3), (3, 3)]
    ref = engine.generate("a red fox", width=64, height=48, steps=3, seed=42,
                          images_per_prompt=2, output_type="np")
    assert max_diff(np.round(images * 255).astype(np.uint8), np.stack(ref)) == 0


def test_loader_fp8_layers(comfy):
    """The loader's fp8_layers input reaches the engine (FP8 itself needs a CUDA device; a GPU
    test covers it): a bad list is an error naming the bad item, and a good one asks for
    precision fp8."""
    nodes, _, _ = comfy
    loader = nodes.NODE_CLASS_MAPPINGS["ZImageLoader"]
    assert loader.INPUT_TYPES()["optional"]["fp8_layers"][1]["default"] == "all"
    with pytest.raises(Exception, match="'mlp'"):
        loader().load("", "cpu", "auto", "bf16", 0.0, fp8_layers="all,mlp")
    with pytest.raises(Exception, match="needs precision fp8"):
        loader().load("", "cpu", "auto", "bf16", 0.0, fp8_layers="all,sdpa")


def test_cancel_and_image_inputs(comfy, engine, golden_dir):
    from PIL import Image

    nodes, utils, mm = comfy
    t2i = nodes.NODE_CLASS_MAPPINGS["ZImageTextToImage"]()
    mm.polls, mm.interrupt_at = 0, 2
    utils.updates.clear()
    with pytest.raises(mm.InterruptProcessingException):
        t2i.generate(engine, "a cat", "", 64, 64, 4, 0.0, 1, 1)
    assert utils.updates == [(1, 4), (2, 4)]
    mm.interrupt_at = None

    inputs = os.path.join(golden_dir, "image", "inp_turbo", "inputs")
    init = Image.open(os.path.join(inputs, "init.png")).convert("RGB")
    mask = Image.open(os.path.join(inputs, "mask.png")).convert("L")
    # As ComfyUI's LoadImage gives them: IMAGE [1, H, W, 3] and MASK [1, H, W], float in [0, 1]
    image_in = (np.asarray(init).astype(np.float32) / 255.0)[None]
    mask_in = (np.asarray(mask).astype(np.float32) / 255.0)[None]
    (images,) = t2i.generate(engine, "a cat", "", 48, 40, 3, 0.0, 5, 1, init_image=image_in,
                             mask=mask_in, strength=1.0)
    ref = engine.generate("a cat", width=48, height=40, steps=3, seed=5, init_image=init,
                          mask=mask, strength=1.0, output_type="np")
    assert max_diff(np.round(images[0] * 255).astype(np.uint8), ref[0]) == 0


def test_example_workflow_matches_the_nodes(comfy):
    import json

    nodes = comfy[0]
    with open(REPO / "comfyui" / "workflows" / "text_to_image_api.json", encoding="utf-8") as f:
        workflow = json.load(f)
    for node in workflow.values():
        cls = nodes.NODE_CLASS_MAPPINGS.get(node["class_type"])
        if cls is None:
            continue  # ComfyUI's own SaveImage
        types = cls.INPUT_TYPES()
        given = set(node["inputs"])
        assert set(types["required"]) <= given, node["class_type"]
        assert given <= set(types["required"]) | set(types.get("optional", {})), node["class_type"]
