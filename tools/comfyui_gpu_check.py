#!/usr/bin/env python3
"""End-to-end check of zimage's ComfyUI nodes in a real, headless ComfyUI (GPU machine).

ComfyUI: the pinned commit below, unpacked (tests and CI files stripped) under .comfy/ComfyUI
with the wheels it lacks on the GPU machine in .comfy/whl, a stand-in for PyAV in .comfy/av_stub
(comfy_api imports av at start-up; no video node runs) and an empty front end in
.comfy/frontend (only the HTTP API is used). .comfy is git-ignored, laid out by
tools/comfyui_prepare.sh from a ComfyUI checkout at COMFYUI_COMMIT: carry it.

    PYTHONPATH=$PYMOD python3 tools/comfyui_gpu_check.py --json /tmp/comfy.json

What it does (all waits bounded; the whole run under --deadline seconds, default 240):
 0. `pip install --no-index --no-deps --target /tmp/comfy-site .comfy/whl/*.whl` (nothing from the
    network); links comfyui/ -> ComfyUI/custom_nodes/zimage and the test-only nodes
    tools/comfyui_workflows/zimage_check_nodes -> custom_nodes/zimage_check; starts
    `python3 main.py --listen 127.0.0.1 --port P --disable-auto-launch --front-end-root
    .comfy/frontend --disable-api-nodes ...`, waits for /object_info.
 a. text to image: ZImageLoader + ZImageTextToImage + SaveImage vs `build/ci/zimage generate`
    with the same settings: max pixel difference must be 0 (--a-max).
 b. MODEL node: ZImageModelLoader (zimage's DiT) under ComfyUI's KSampler (euler, simple, cfg 1)
    vs the same workflow with ComfyUI's own NextDiT holding the same weights
    (ZImageCheckComfyDiT), in bf16 and f32. ComfyUI's own loaders cannot read the tiny random
    test model (see zimage_check_nodes: its detection only knows the real dimensions), so the
    test-only nodes build ComfyUI's own NextDiT / VAE classes with the tiny dimensions and
    encode the prompt with transformers' Qwen3. The MODEL image is also compared with (a)'s,
    for information only (ComfyUI's sigmas and VAE path differ from the engine's).
 c. progress: the websocket's `progress` messages reach steps/steps for ZImageTextToImage and
    KSampler, every node reports `executing`, /history says success.
Prints a table last, writes --json, exits 1 when a bound fails (2 when ComfyUI does not start).
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid

COMFYUI_REPO = "comfyanonymous/ComfyUI"
COMFYUI_COMMIT = "3cd7b32f1b7e7e90395cefe7d9f9b1f89276d8ce"  # v0.8.0 era, 2026-01-07
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKFLOWS = os.path.join(ROOT, "tools", "comfyui_workflows")


class Deadline:
    def __init__(self, seconds):
        self.end = time.monotonic() + seconds

    def left(self, cap=None):
        left = self.end - time.monotonic()
        if left <= 0:
            raise TimeoutError("the run's deadline passed")
        return left if cap is None else min(left, cap)


def http(base, path, data=None, timeout=10.0):
    body = None if data is None else json.dumps(data).encode()
    req = urllib.request.Request(base + path, data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read() or b"null")


def fill(obj, values):
    """The workflow with "$NAME" strings replaced (whole strings keep the value's type)."""
    if isinstance(obj, dict):
        return {k: fill(v, values) for k, v in obj.items()}
    if isinstance(obj, list):
        return [fill(v, values) for v in obj]
    if isinstance(obj, str) and "$" in obj:
        if obj[1:] in values:
            return values[obj[1:]]
        for k in sorted(values, key=len, reverse=True):
            obj = obj.replace("$" + k, str(values[k]))
    return obj


def load_workflow(name, values):
    with open(os.path.join(WORKFLOWS, name)) as f:
        return fill(json.load(f), values)


class WsListener:
    """ComfyUI's /ws messages (JSON text ones), collected on a thread."""

    def __init__(self, url):
        self.url, self.messages, self.ready, self.error = url, [], threading.Event(), None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        try:
            asyncio.run(self._main())
        except Exception as e:  # noqa: BLE001
            self.error = repr(e)
            self.ready.set()

    async def _main(self):
        import aiohttp

        async with aiohttp.ClientSession() as s:
            async with s.ws_connect(self.url) as ws:
                self.ready.set()
                async for m in ws:
                    if m.type == aiohttp.WSMsgType.TEXT:
                        self.messages.append(json.loads(m.data))
                    elif m.type in (aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.ERROR):
                        break

    def for_prompt(self, prompt_id):
        return [m for m in list(self.messages)
                if isinstance(m.get("data"), dict) and m["data"].get("prompt_id") == prompt_id]


def run_prompt(base, workflow, client_id, deadline, out_dir, timeout=90.0):
    """Posts a workflow, waits for its history; returns (prompt_id, images, seconds, history)."""
    t0 = time.monotonic()
    try:
        r = http(base, "/prompt", {"prompt": workflow, "client_id": client_id})
    except urllib.error.HTTPError as e:
        raise RuntimeError(f"/prompt refused the workflow: {e.read().decode()[:2000]}") from None
    pid = r["prompt_id"]
    if r.get("node_errors"):
        raise RuntimeError(f"node errors: {r['node_errors']}")
    end = time.monotonic() + deadline.left(timeout)
    while True:
        h = http(base, f"/history/{pid}")
        if pid in h and h[pid].get("status", {}).get("completed") is not None and (
                h[pid]["status"].get("status_str") in ("success", "error")):
            break
        if time.monotonic() > end:
            raise TimeoutError(f"prompt {pid} did not finish in {timeout:.0f} s")
        time.sleep(0.05)
    wall = time.monotonic() - t0
    entry = h[pid]
    status = entry["status"]
    if status.get("status_str") != "success":
        raise RuntimeError(f"prompt {pid} failed: {json.dumps(status.get('messages'))[:3000]}")
    images = []
    for out in entry.get("outputs", {}).values():
        for im in out.get("images", []):
            images.append(os.path.join(out_dir, im.get("subfolder", ""), im["filename"]))
    # ComfyUI's own timing: execution_start .. execution_success timestamps (ms).
    stamps = {m[0]: m[1].get("timestamp") for m in status.get("messages", [])}
    exec_s = None
    if stamps.get("execution_start") and stamps.get("execution_success"):
        exec_s = (stamps["execution_success"] - stamps["execution_start"]) / 1000.0
    return pid, images, exec_s if exec_s is not None else wall, entry


def read_rgb(path):
    import numpy as np
    from PIL import Image

    return np.asarray(Image.open(path).convert("RGB")).astype(np.int16)


def diff(a, b):
    import numpy as np

    x, y = read_rgb(a), read_rgb(b)
    if x.shape != y.shape:
        return {"shape_a": list(x.shape), "shape_b": list(y.shape), "max": 255, "mean": 255.0}
    d = np.abs(x - y)
    return {"max": int(d.max()), "mean": round(float(d.mean()), 4),
            "frac_over_8": round(float((d > 8).mean()), 4)}


def progress_summary(listener, pid, node_ids):
    msgs = listener.for_prompt(pid)
    executing = {m["data"].get("node") for m in msgs if m["type"] == "executing"}
    progress = {}
    for m in msgs:
        if m["type"] == "progress":
            n = m["data"].get("node")
            progress[n] = max(progress.get(n, (0, 0)), (m["data"]["value"], m["data"]["max"]))
    return {"executing": sorted(x for x in executing if x is not None),
            "progress": {k: list(v) for k, v in progress.items()},
            "success_msg": any(m["type"] == "execution_success" for m in msgs),
            "cached": [n for m in msgs if m["type"] == "execution_cached"
                       for n in m["data"].get("nodes", [])],
            "all_nodes_seen": all(n in executing for n in node_ids)}


def prepare(args):
    comfy = os.path.abspath(args.comfy)
    comfy_ui = os.path.join(comfy, "ComfyUI")
    if not os.path.exists(os.path.join(comfy_ui, "main.py")):
        sys.exit(f"no ComfyUI at {comfy_ui} (unpack {COMFYUI_REPO}@{COMFYUI_COMMIT} there)")
    site = args.site
    if not os.path.exists(os.path.join(site, ".zimage-check-done")):
        wheels = sorted(glob.glob(os.path.join(comfy, "whl", "*.whl")))
        subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--no-deps",
                        "--disable-pip-version-check", "-q", "--target", site, *wheels],
                       check=True, timeout=120)
        open(os.path.join(site, ".zimage-check-done"), "w").close()
    nodes = os.path.join(comfy_ui, "custom_nodes")
    for name, src in (("zimage", os.path.join(ROOT, "comfyui")),
                      ("zimage_check", os.path.join(WORKFLOWS, "zimage_check_nodes"))):
        dst = os.path.join(nodes, name)
        if os.path.islink(dst) or os.path.isfile(dst):
            os.remove(dst)
        elif os.path.isdir(dst):
            shutil.rmtree(dst)
        os.symlink(src, dst)
    # ZImageModelLoader's unet_name must be in ComfyUI's diffusion_models list; its `path`
    # input (the tiny model's transformer/ folder, with its config) is what it loads.
    dm = os.path.join(comfy_ui, "models", "diffusion_models")
    os.makedirs(dm, exist_ok=True)
    unet = os.path.join(dm, "zimage_tiny_transformer.safetensors")
    if os.path.lexists(unet):
        os.remove(unet)
    os.symlink(os.path.join(os.path.abspath(args.model), "transformer",
                            "diffusion_pytorch_model.safetensors"), unet)
    return comfy, comfy_ui, site


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="build/ci/golden/v_turbo/model")
    p.add_argument("--zimage", default="build/ci/zimage", help="the zimage CLI")
    p.add_argument("--cli-png", default=None,
                   help="the CLI's image made beforehand with the same settings (instead of "
                        "running --zimage here)")
    p.add_argument("--comfy", default=".comfy")
    p.add_argument("--site", default="/tmp/comfy-site")
    p.add_argument("--port", type=int, default=8188)
    p.add_argument("--prompt", default="a red fox in snow")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--height", type=int, default=64)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--deadline", type=float, default=230.0)
    p.add_argument("--a-max", type=int, default=0, help="(a) bound: max pixel difference")
    p.add_argument("--b-f32-max", type=int, default=4)
    p.add_argument("--b-bf16-mean", type=float, default=4.0)
    p.add_argument("--b-bf16-max", type=int, default=64)
    p.add_argument("--json", default=None)
    p.add_argument("--keep", action="store_true", help="keep the work folder")
    args = p.parse_args()
    deadline = Deadline(args.deadline)
    os.chdir(ROOT)
    args.model = os.path.abspath(args.model)
    comfy, comfy_ui, site = prepare(args)

    work = tempfile.mkdtemp(prefix="zimage-comfy-")
    out_dir = os.path.join(work, "output")
    for d in ("output", "input", "temp", "user"):
        os.makedirs(os.path.join(work, d))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [site, os.path.join(comfy, "av_stub")] + [x for x in [env.get("PYTHONPATH")] if x])
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    env["DO_NOT_TRACK"] = "1"
    cmd = [sys.executable, "main.py", "--listen", "127.0.0.1", "--port", str(args.port),
           "--disable-auto-launch", "--front-end-root", os.path.join(comfy, "frontend"),
           "--disable-api-nodes", "--output-directory", out_dir,
           "--input-directory", os.path.join(work, "input"),
           "--temp-directory", os.path.join(work, "temp"),
           "--user-directory", os.path.join(work, "user"), "--log-stdout"]
    log_path = os.path.join(work, "comfyui.log")
    log = open(log_path, "w")
    t_start = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=comfy_ui, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    base = f"http://127.0.0.1:{args.port}"
    result = {"comfyui": f"{COMFYUI_REPO}@{COMFYUI_COMMIT}", "model": args.model,
              "settings": {"prompt": args.prompt, "seed": args.seed, "width": args.width,
                           "height": args.height, "steps": args.steps},
              "checks": {}, "times_s": {}, "diffs": {}}
    failures = []
    rc = 0

    def bound(name, ok, detail):
        result["checks"][name] = {"ok": bool(ok), "detail": detail}
        if not ok:
            failures.append(name)

    try:
        # --- start-up ---------------------------------------------------------------------
        info = None
        end = time.monotonic() + deadline.left(150)
        while time.monotonic() < end:
            if proc.poll() is not None:
                raise RuntimeError(f"ComfyUI exited with {proc.returncode} at start-up")
            try:
                info = http(base, "/object_info", timeout=5)
                break
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                time.sleep(0.5)
        if info is None:
            raise RuntimeError("ComfyUI did not answer /object_info in time")
        result["times_s"]["comfyui_startup"] = round(time.monotonic() - t_start, 2)
        wanted = ["ZImageLoader", "ZImageTextToImage", "ZImageModelLoader", "ZImageCheckComfyDiT",
                  "ZImageCheckVAE", "ZImageCheckTextEncode", "ZImageCheckEmptyLatent",
                  "KSampler", "VAEDecode", "SaveImage"]
        missing = [n for n in wanted if n not in info]
        bound("nodes_registered", not missing, {"missing": missing})
        if missing:
            raise RuntimeError(f"nodes not registered: {missing}")

        client_id = uuid.uuid4().hex
        listener = WsListener(f"ws://127.0.0.1:{args.port}/ws?clientId={client_id}")
        listener.ready.wait(deadline.left(10))
        result["checks"]["websocket"] = {"ok": listener.error is None, "detail": listener.error}

        values = {"MODEL": args.model, "PROMPT": args.prompt, "WIDTH": args.width,
                  "HEIGHT": args.height, "STEPS": args.steps, "SEED": args.seed,
                  "UNET_NAME": "zimage_tiny_transformer.safetensors"}

        # --- (a) text to image node vs the CLI -------------------------------------------
        cli_png = args.cli_png or os.path.join(work, "cli.png")
        t0 = time.monotonic()
        cli = subprocess.CompletedProcess([], 0, "", "") if args.cli_png else subprocess.run(
            [os.path.abspath(args.zimage), "generate", "--model", args.model, "--prompt",
             args.prompt, "--seed", str(args.seed), "--width", str(args.width), "--height",
             str(args.height), "--steps", str(args.steps), "--guidance", "0", "--device", "cuda",
             "--output", cli_png], capture_output=True, text=True, timeout=deadline.left(60))
        result["times_s"]["cli_generate_process"] = round(time.monotonic() - t0, 3)
        if cli.returncode != 0:
            raise RuntimeError(f"zimage generate failed: {cli.stderr[-2000:]}")
        wf_a = load_workflow("t2i_node.json", {**values, "PREFIX": "a_t2i"})
        pid_a, imgs_a, secs_a_cold, _ = run_prompt(base, wf_a, client_id, deadline, out_dir)
        # again with another prefix: the loader is cached, this times one image
        wf_a2 = load_workflow("t2i_node.json", {**values, "PREFIX": "a_t2i_warm",
                                                "SEED": args.seed + 1})
        pid_a2, imgs_a2, secs_a_warm, _ = run_prompt(base, wf_a2, client_id, deadline, out_dir)
        result["times_s"]["a_t2i_node_first_incl_load"] = round(secs_a_cold, 3)
        result["times_s"]["a_t2i_node_per_image"] = round(secs_a_warm, 3)
        d_a = diff(imgs_a[0], cli_png)
        result["diffs"]["a_t2i_node_vs_cli"] = d_a
        bound("a_t2i_equals_cli", d_a["max"] <= args.a_max, d_a)

        # --- (b) MODEL node (zimage DiT) vs ComfyUI's own NextDiT, same ComfyUI pipeline ----
        b_imgs = {}
        pids_b = {}
        for dtype in ("bf16", "f32"):
            for kind, wf_name in (("zimage", "model_zimage_dit.json"),
                                  ("comfy", "model_comfy_dit.json")):
                v = {**values, "DTYPE": dtype, "PREFIX": f"b_{kind}_{dtype}"}
                pid, imgs, secs_cold, _ = run_prompt(base, load_workflow(wf_name, v), client_id,
                                                     deadline, out_dir)
                # per image: the loaders are cached, a new seed re-runs the sampler and decode
                v2 = {**v, "SEED": args.seed + 1, "PREFIX": f"b_{kind}_{dtype}_warm"}
                _, _, secs_warm, _ = run_prompt(base, load_workflow(wf_name, v2), client_id,
                                                deadline, out_dir)
                b_imgs[(kind, dtype)] = imgs[0]
                pids_b[(kind, dtype)] = pid
                result["times_s"][f"b_{kind}_dit_{dtype}_first_incl_load"] = round(secs_cold, 3)
                result["times_s"][f"b_{kind}_dit_{dtype}_per_image"] = round(secs_warm, 3)
        for dtype in ("bf16", "f32"):
            d = diff(b_imgs[("zimage", dtype)], b_imgs[("comfy", dtype)])
            result["diffs"][f"b_zimage_dit_vs_comfy_dit_{dtype}"] = d
            if dtype == "f32":
                bound("b_f32_close", d["max"] <= args.b_f32_max, d)
            else:
                bound("b_bf16_close", d["mean"] <= args.b_bf16_mean and d["max"] <= args.b_bf16_max,
                      d)
        # information only: ComfyUI's sigmas ("simple" on 1000 shifted steps) and its own VAE
        # path differ from the engine's, and the test model's random weights amplify that.
        result["diffs"]["b_zimage_dit_bf16_vs_a_t2i_info"] = diff(b_imgs[("zimage", "bf16")],
                                                                  imgs_a[0])

        # --- (c) progress / completion -----------------------------------------------------
        time.sleep(0.2)
        prog_a = progress_summary(listener, pid_a, ["1", "2", "3"])
        prog_b = progress_summary(listener, pids_b[("zimage", "bf16")],
                                  ["1", "2", "3", "4", "5", "6", "7", "8"])
        result["progress"] = {"a": prog_a, "b_zimage_bf16": prog_b}
        if listener.error is None:
            bound("c_progress_t2i", prog_a["progress"].get("2") == [args.steps, args.steps]
                  and prog_a["all_nodes_seen"] and prog_a["success_msg"], prog_a)
            bound("c_progress_ksampler", prog_b["progress"].get("5") == [args.steps, args.steps]
                  and prog_b["all_nodes_seen"] and prog_b["success_msg"], prog_b)
        else:
            bound("c_websocket", False, listener.error)
    except Exception as e:  # noqa: BLE001
        result["error"] = f"{type(e).__name__}: {e}"
        failures.append("error")
    finally:
        result["times_s"]["total"] = round(time.monotonic() - t_start, 2)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=15)
        log.close()
        with open(log_path, errors="replace") as f:
            tail = f.read()[-6000:]
        result["comfyui_log_tail"] = tail
        result["work_dir"] = work
        if "error" in result:
            print("---- ComfyUI log (tail) ----\n" + tail, file=sys.stderr)
            if "nodes_registered" not in result["checks"]:
                rc = 2
    result["failures"] = failures
    result["ok"] = not failures
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    print("\n%-44s %s" % ("check / measure", "value"))
    for k, v in result["checks"].items():
        print("%-44s %s %s" % (k, "PASS" if v["ok"] else "FAIL",
                               json.dumps(v["detail"])[:120] if not v["ok"] or "diff" in k else ""))
    for k, v in result["diffs"].items():
        print("%-44s max %s mean %s" % ("diff " + k, v.get("max"), v.get("mean")))
    for k, v in result["times_s"].items():
        print("%-44s %s s" % ("time " + k, v))
    if "error" in result:
        print("%-44s %s" % ("ERROR", result["error"][:300]))
    print("%-44s %s" % ("RESULT", "PASS" if not failures else "FAIL: " + ", ".join(failures)))
    if not args.keep and not failures:
        shutil.rmtree(work, ignore_errors=True)
    return rc or (1 if failures else 0)


if __name__ == "__main__":
    sys.exit(main())
