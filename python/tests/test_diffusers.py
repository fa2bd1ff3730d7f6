"""zimage.diffusers.ZImagePipeline answers diffusers' call with the engine's images."""

import numpy as np
import pytest

import zimage
from conftest import max_diff
from zimage.diffusers import ZImagePipeline, ZImagePipelineOutput

PROMPT = "a red fox in snow"


@pytest.fixture(scope="module")
def pipe():
    return ZImagePipeline.from_pretrained(None, device="cpu")


def test_numpy_output_equals_engine(pipe, engine):
    out = pipe(PROMPT, height=48, width=64, num_inference_steps=3, guidance_scale=0.0,
               generator=42, output_type="np")
    assert isinstance(out, ZImagePipelineOutput)
    images = out.images
    assert images.dtype == np.float32 and images.shape == (1, 48, 64, 3)
    assert 0.0 <= images.min() and images.max() <= 1.0
    ours = engine.generate(PROMPT, width=64, height=48, steps=3, seed=42, output_type="np")
    assert max_diff(np.round(images * 255).astype(np.uint8), np.stack(ours)) == 0


def test_batch_cfg_pil_equals_engine(pipe, engine):
    out = pipe([PROMPT, "a cat"], negative_prompt=["ugly", "ugly"], height=32, width=32,
               num_inference_steps=2, guidance_scale=4.0, num_images_per_prompt=2,
               generator=[9])
    ours = engine.generate([PROMPT, "a cat"], "ugly", width=32, height=32, steps=2,
                           guidance=4.0, seed=9, images_per_prompt=2, output_type="np")
    assert len(out.images) == 4
    assert max(max_diff(np.asarray(a), b) for a, b in zip(out.images, ours)) == 0
    (images,) = pipe(PROMPT, height=32, width=32, num_inference_steps=2, generator=9,
                     return_dict=False)
    assert len(images) == 1


def test_callback_on_step_end_and_interrupt(pipe):
    seen = []

    def callback(p, i, t, kwargs):
        assert p is pipe
        seen.append(i)
        return {}

    pipe(PROMPT, num_inference_steps=3, guidance_scale=0.0, generator=1,
         callback_on_step_end=callback)
    assert seen == [0, 1, 2]

    def interrupt(p, i, t, kwargs):
        p._interrupt = True
        return {}

    with pytest.raises(zimage.Cancelled):
        pipe(PROMPT, num_inference_steps=3, generator=1, callback_on_step_end=interrupt)


def test_refused_arguments_name_themselves(pipe):
    for kwargs, field in [(dict(latents=np.zeros(3)), "latents"),
                          (dict(output_type="latent"), "output_type"),
                          (dict(generator=[1, 2]), "generator"),
                          (dict(generator="7"), "generator"),
                          (dict(negative_prompt=["a", "b"]), "negative_prompt"),
                          (dict(height=50), "height")]:
        with pytest.raises(zimage.InvalidArgument) as info:
            pipe(PROMPT, num_inference_steps=2, **kwargs)
        assert info.value.field == field, (kwargs, str(info.value))
    with pytest.raises(zimage.InvalidArgument) as info:
        ZImagePipeline.from_pretrained(None, device="cpu", torch_dtype="int8")
    assert info.value.field == "torch_dtype"


def test_torch_generator_and_pt_output(pipe, engine):
    torch = pytest.importorskip("torch", reason="torch is not installed (optional)")
    out = pipe(PROMPT, height=32, width=32, num_inference_steps=2, guidance_scale=0.0,
               generator=torch.Generator("cpu").manual_seed(5), output_type="pt")
    assert out.images.shape == (1, 3, 32, 32)
    ours = engine.generate(PROMPT, width=32, height=32, steps=2, seed=5, output_type="np")[0]
    got = (out.images[0].permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
    assert max_diff(got, ours) == 0
