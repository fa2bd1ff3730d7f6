"""zimage.Engine against the `zimage` program and diffusers' golden images: pixels, progress,
cancellation, errors, threads, numpy and PIL forms."""

import os
import threading

import numpy as np
import pytest

import zimage
from conftest import max_diff, read_case, run_cli

PROMPT = "a red fox in snow"


def test_builtin_equals_cli_png(engine, cli, tmp_path):
    ours = engine.generate(PROMPT, width=64, height=48, steps=3, seed=42, output_type="np")
    ref = run_cli(cli, ["--prompt", PROMPT, "--width", "64", "--height", "48", "--steps", "3",
                        "--seed", "42"], tmp_path)
    assert len(ours) == 1
    assert ours[0].dtype == np.uint8 and ours[0].shape == (48, 64, 3)
    assert max_diff(ours[0], ref[0]) == 0


def test_batch_cfg_equals_cli_png(engine, cli, tmp_path):
    prompts = ["a red fox in snow", "冰雪女王"]
    ours = engine.generate(prompts, "blurry", width=32, height=32, steps=2, guidance=3.5,
                           seed=2**64 - 1, images_per_prompt=2, output_type="np")
    ref = run_cli(cli, ["--prompt", prompts[0], "--prompt", prompts[1], "--negative-prompt",
                        "blurry", "--width", "32", "--height", "32", "--steps", "2",
                        "--guidance", "3.5", "--seed", str(2**64 - 1), "--images-per-prompt",
                        "2"], tmp_path, n_images=4)
    assert len(ours) == 4
    assert max(max_diff(a, b) for a, b in zip(ours, ref)) == 0
    assert max_diff(ours[0], ours[1]) > 0  # images of one prompt get their own noise


def test_pil_output_equals_numpy(engine):
    from PIL import Image

    pil = engine.generate(PROMPT, steps=2, seed=7)  # 64x64: the built-in model's default
    arr = engine.generate(PROMPT, steps=2, seed=7, output_type="np")
    assert isinstance(pil[0], Image.Image) and pil[0].mode == "RGB" and pil[0].size == (64, 64)
    assert max_diff(np.asarray(pil[0]), arr[0]) == 0


def test_inpaint_pil_inputs_equal_cli(engine, cli, golden_dir, tmp_path):
    from PIL import Image

    inputs = os.path.join(golden_dir, "image", "inp_turbo", "inputs")
    init, mask = os.path.join(inputs, "init.png"), os.path.join(inputs, "mask.png")
    ours = engine.generate(PROMPT, width=48, height=40, steps=3, seed=5,
                           init_image=Image.open(init), mask=Image.open(mask), output_type="np")
    ref = run_cli(cli, ["--prompt", PROMPT, "--width", "48", "--height", "40", "--steps", "3",
                        "--seed", "5", "--init-image", init, "--mask", mask], tmp_path)
    assert max_diff(ours[0], ref[0]) == 0
    # numpy inputs (mask as [H, W]) are the same images
    mask_l = np.asarray(Image.open(mask).convert("L"))
    ours_np = engine.generate(PROMPT, width=48, height=40, steps=3, seed=5,
                              init_image=np.asarray(Image.open(init).convert("RGB")),
                              mask=mask_l, output_type="np")
    assert max_diff(ours_np[0], ref[0]) == 0


@pytest.mark.parametrize("case", ["v_cfg", "v_batch_cfg"])
def test_golden_model_matches_diffusers_and_cli(case, cli, golden_dir, tmp_path):
    path = os.path.join(golden_dir, case)
    c = read_case(path)
    norm = c.get("cfg_normalization", 0.0)
    kwargs = dict(width=c["W"], height=c["H"], steps=c["steps"], guidance=c["guidance"],
                  seed=c["seed"], images_per_prompt=c.get("images_per_prompt", 1),
                  cfg_truncation=c.get("cfg_truncation", 1.0),
                  cfg_normalization=float(norm), output_type="np",
                  max_sequence_length=c.get("max_sequence_length", 512))
    eng = zimage.Engine(os.path.join(path, "model"), device="cpu")
    ours = eng.generate(c["prompts"], c.get("neg"), **kwargs)
    ref = np.load(os.path.join(path, "image.npy"))  # diffusers' image, [n, H, W, 3] in [0, 1]
    assert ref.shape == (len(ours), c["H"], c["W"], 3)
    ref_u8 = np.clip(np.round(ref.astype(np.float64) * 255), 0, 255).astype(np.uint8)
    worst = max(max_diff(a, b) for a, b in zip(ours, ref_u8))
    print(f"{case}: max |ours - round(255 * diffusers)| = {worst}")
    assert worst <= 1  # off by one only where diffusers' value sits on a rounding edge
    args = ["--model", os.path.join(path, "model"), "--width", str(c["W"]), "--height",
            str(c["H"]), "--steps", str(c["steps"]), "--guidance", repr(float(c["guidance"])),
            "--seed", str(c["seed"]), "--images-per-prompt", str(kwargs["images_per_prompt"]),
            "--cfg-truncation", repr(float(kwargs["cfg_truncation"])), "--cfg-normalization",
            repr(float(norm)), "--max-sequence-length", str(kwargs["max_sequence_length"])]
    for p in c["prompts"]:
        args += ["--prompt", p]
    if c.get("neg") is not None:
        args += ["--negative-prompt", c["neg"]]
    cli_images = run_cli(cli, args, tmp_path, n_images=len(ours))
    assert max(max_diff(a, b) for a, b in zip(ours, cli_images)) == 0


def test_progress_order(engine):
    calls = []
    engine.generate(PROMPT, steps=4, seed=1, on_step=lambda step, total: calls.append((step, total)))
    assert calls == [(1, 4), (2, 4), (3, 4), (4, 4)]


def test_cancel_by_returning_false(engine):
    calls = []

    def stop_after_two(step, total):
        calls.append(step)
        return step < 2  # True continues; False stops

    with pytest.raises(zimage.Cancelled) as info:
        engine.generate(PROMPT, steps=5, seed=1, on_step=stop_after_two)
    assert calls == [1, 2]
    assert "on_step returned False after step 2 of 5" in str(info.value)
    assert info.value.code == "cancelled"
    # The engine is unharmed: the next call gives the uncancelled images.
    a = engine.generate(PROMPT, steps=2, seed=3, output_type="np")[0]
    b = engine.generate(PROMPT, steps=2, seed=3, output_type="np", on_step=lambda s, t: None)[0]
    assert max_diff(a, b) == 0


def test_cancel_by_raising(engine):
    stop = zimage.Cancelled("stop here")

    def raise_cancelled(step, total):
        raise stop

    with pytest.raises(zimage.Cancelled) as info:
        engine.generate(PROMPT, steps=3, seed=1, on_step=raise_cancelled)
    assert info.value is stop

    class Mine(Exception):
        pass

    calls = []

    def raise_mine(step, total):
        calls.append(step)
        if step == 2:
            raise Mine("from the callback")

    with pytest.raises(Mine, match="from the callback"):
        engine.generate(PROMPT, steps=3, seed=1, on_step=raise_mine)
    assert calls == [1, 2]


@pytest.mark.parametrize("kwargs, field, text", [
    (dict(width=63), "width", "multiple of"),
    (dict(height=0), "height", ""),
    (dict(steps=0), "steps", ""),
    (dict(seed=-1), "seed", "2**64-1"),
    (dict(seed=2**64), "seed", ""),
    (dict(width=2**40), "width", "out of range"),
    (dict(strength=0.5), "strength", ""),  # needs an init_image
    (dict(images_per_prompt=0), "images_per_prompt", ""),
    (dict(output_type="latent"), "output_type", ""),
    (dict(init_image="not an image"), "init_image", "PIL image or a numpy array"),
    (dict(mask=np.zeros((64, 64), np.uint8)), "mask", "init_image"),
    (dict(init_image=np.zeros((8, 8, 2), np.uint8)), "init_image", "[H, W, 3]"),
    (dict(loras=[("x.safetensors", "big")]), "loras[0]", "number"),
])
def test_error_names_field(engine, kwargs, field, text):
    with pytest.raises(zimage.InvalidArgument) as info:
        engine.generate(PROMPT, **kwargs)
    err = info.value
    assert err.field == field, (err.field, str(err))
    assert str(err).startswith(field), str(err)
    assert text in str(err)
    assert isinstance(err, ValueError) and isinstance(err, zimage.Error)


def test_missing_lora_file(engine):
    with pytest.raises(zimage.NotFound) as info:
        engine.generate(PROMPT, loras={"/nonexistent/lora.safetensors": 0.5})
    assert "/nonexistent/lora.safetensors" in str(info.value)
    assert isinstance(info.value, LookupError) and info.value.code == "not_found"


def test_prompt_errors(engine):
    with pytest.raises(zimage.InvalidArgument) as info:
        engine.generate(["ok", 3])
    assert info.value.field == "prompts[1]"
    with pytest.raises(zimage.InvalidArgument) as info:
        engine.generate([])
    assert info.value.field == "prompts"


def test_load_errors(tmp_path):
    with pytest.raises(zimage.Error) as info:
        zimage.Engine(str(tmp_path / "missing"), device="cpu")
    assert "missing" in str(info.value)
    with pytest.raises(zimage.InvalidArgument) as info:
        zimage.Engine(device="tpu")
    assert "tpu" in str(info.value)
    with pytest.raises(zimage.InvalidArgument) as info:
        zimage.Engine(dit=str(tmp_path / "dit.safetensors"))
    assert info.value.field == "model"
    for bad in (-1, float("nan"), "8"):
        with pytest.raises(zimage.InvalidArgument) as info:
            zimage.Engine(device="cpu", host_memory=bad)
        assert "host_memory" in str(info.value), info.value
    for bad in ("file", 3):
        with pytest.raises(zimage.InvalidArgument) as info:
            zimage.Engine(device="cpu", streamed_weights=bad)
        assert "streamed_weights" in str(info.value), info.value


def test_two_threads_share_an_engine(engine):
    seeds = [11, 12, 13, 14]
    serial = {s: engine.generate(PROMPT, steps=2, seed=s, output_type="np")[0] for s in seeds}
    results, errors = {}, []
    barrier = threading.Barrier(2)

    def work(my_seeds):
        try:
            barrier.wait()
            for s in my_seeds:
                results[s] = engine.generate(PROMPT, steps=2, seed=s, output_type="np",
                                             on_step=lambda step, total: None)[0]
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(seeds[0::2],)),
               threading.Thread(target=work, args=(seeds[1::2],))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert max(max_diff(results[s], serial[s]) for s in seeds) == 0


def test_on_step_must_not_reenter(engine):
    def reenter(step, total):
        engine.generate(PROMPT, steps=1)

    with pytest.raises(zimage.InvalidArgument) as info:
        engine.generate(PROMPT, steps=2, on_step=reenter)
    assert info.value.field == "on_step"
    engine.generate(PROMPT, steps=1)  # and the engine is free again


def test_info_while_another_thread_generates(engine):
    """info() from one thread while another generates with an on_step (which takes the GIL)."""
    done = threading.Event()
    seen = []

    def poll():
        while not done.is_set():
            seen.append(engine.info()["device"])

    poller = threading.Thread(target=poll)
    poller.start()
    try:
        steps = []
        engine.generate(PROMPT, width=128, height=128, steps=4, seed=2,
                        on_step=lambda s, t: steps.append(s))
    finally:
        done.set()
        poller.join(timeout=60)
    assert not poller.is_alive() and steps == [1, 2, 3, 4] and seen


def test_gil_released_while_generating():
    """A Python thread keeps running while the engine works: the GIL is not held. The counting
    thread's rate alone is measured first; with the GIL held through the call it would count
    only in the moments around it (a few switch intervals of 5 ms)."""
    import time

    one_thread = zimage.Engine(device="cpu", threads=1)
    done = threading.Event()
    ticks = [0]

    def count():
        while not done.is_set():
            ticks[0] += 1

    counter = threading.Thread(target=count)
    counter.start()
    try:
        t0, n0 = time.perf_counter(), ticks[0]
        time.sleep(0.2)
        rate = (ticks[0] - n0) / (time.perf_counter() - t0)
        t0, n0 = time.perf_counter(), ticks[0]
        one_thread.generate(PROMPT, width=128, height=128, steps=6, seed=1)
        seconds, during = time.perf_counter() - t0, ticks[0] - n0
    finally:
        done.set()
        counter.join()
    print(f"generate: {seconds:.2f} s; the other thread ran {during / (rate * seconds):.0%} "
          f"of its free rate")
    assert seconds > 0.1, "too short to tell"
    assert during > 0.2 * rate * seconds


def test_info(engine):
    info = engine.info()
    assert info["device"].startswith("cpu")
    assert info["size_multiple"] > 0 and info["precision"] == "f32"
    assert engine.builtin and os.path.isfile(os.path.join(engine.model, "model_index.json"))
    assert zimage.builtin_model_dir() == engine.model


def test_controlnet_golden_matches_diffusers_and_cli(cli, golden_dir, tmp_path):
    """control_image / control_scale on a ControlNet golden case (Fun-Controlnet-Union 2.1-lite):
    the engine's images are diffusers' (<= 1/255) and the program's (equal)."""
    from PIL import Image

    root = os.path.join(golden_dir, "controlnet")
    case = os.path.join(root, "cn_lite_multi")
    c = read_case(case)
    model = tmp_path / "model"  # the v_turbo pipeline with the ControlNet cases' transformer
    model.mkdir()
    base = os.path.join(golden_dir, "v_turbo", "model")
    for part in ("text_encoder", "tokenizer", "vae", "scheduler", "model_index.json"):
        os.symlink(os.path.join(base, part), model / part)
    os.symlink(os.path.join(root, "cn_model", "transformer"), model / "transformer")
    control = os.path.join(case, "inputs", c["control"])
    eng = zimage.Engine(str(model), device="cpu", controlnet=os.path.join(case, "controlnet"))
    ours = eng.generate(c["prompts"], width=c["width"], height=c["height"], steps=c["steps"],
                        guidance=c["guidance"], seed=c["seed"],
                        images_per_prompt=c["images_per_prompt"],
                        control_image=Image.open(control), control_scale=c["scale"],
                        output_type="np")
    ref = np.load(os.path.join(case, "image.npy"))
    ref_u8 = np.clip(np.round(ref.astype(np.float64) * 255), 0, 255).astype(np.uint8)
    worst = max(max_diff(a, b) for a, b in zip(ours, ref_u8))
    print(f"cn_lite_multi: max |ours - round(255 * diffusers)| = {worst}")
    assert len(ours) == ref.shape[0] == 2 and worst <= 1
    args = ["--model", str(model), "--controlnet", os.path.join(case, "controlnet"),
            "--control-image", control, "--control-scale", repr(float(c["scale"])),
            "--width", str(c["width"]), "--height", str(c["height"]), "--steps",
            str(c["steps"]), "--seed", str(c["seed"]), "--images-per-prompt",
            str(c["images_per_prompt"]), "--prompt", c["prompts"][0]]
    cli_images = run_cli(cli, args, tmp_path, n_images=2)
    assert max(max_diff(a, b) for a, b in zip(ours, cli_images)) == 0


def test_loras_at_load_and_per_call(engine, cli, lora_dir, tmp_path):
    """Two stacked LoRAs (PEFT and kohya layouts) merged at load equal the program's --lora
    images; the same LoRAs given to one call equal them too, and the next call without them is
    the base image again."""
    peft, kohya = (os.path.join(lora_dir, f) for f in ("peft.safetensors", "kohya.safetensors"))
    kw = dict(width=48, height=48, steps=3, seed=4, output_type="np")
    loaded = zimage.Engine(device="cpu", loras=[(peft, 0.7), (kohya, -0.5)])
    at_load = loaded.generate(PROMPT, **kw)[0]
    ref = run_cli(cli, ["--prompt", PROMPT, "--width", "48", "--height", "48", "--steps", "3",
                        "--seed", "4", "--lora", f"{peft}:0.7", "--lora", f"{kohya}:-0.5"],
                  tmp_path)
    assert max_diff(at_load, ref[0]) == 0
    base = engine.generate(PROMPT, **kw)[0]
    per_call = engine.generate(PROMPT, loras={peft: 0.7, kohya: -0.5}, **kw)[0]
    assert max_diff(per_call, at_load) == 0 and max_diff(per_call, base) > 10
    assert max_diff(engine.generate(PROMPT, **kw)[0], base) == 0
