#!/usr/bin/env python3
"""Data-parallel scaling of `zimage serve --devices` on one host: for each engine count K, starts
`zimage serve --devices cuda:0,...,cuda:K-1` on a free loopback port, waits until it is ready,
runs C = clients-per-engine x K concurrent clients sending --requests image requests each
(tools/serve_bench.py's load, OpenAI endpoint, one size, fixed seeds), reads each engine's
counters from /readyz, stops the server with SIGTERM, and reports images/s, the speed-up over
K=1 and the parallel efficiency, as JSON lines and a Markdown table. Standard library only.

  tools/dp_scaling.py --zimage build/release/zimage --model Z-Image-Turbo --engines 1,2,4,8 \\
      --size 1024 --steps 8 --requests 4 --json dp_scaling.jsonl

--devices-for K=LIST replaces the device list of count K (e.g. 2=cuda:0,cuda:0 to measure two
engines sharing one GPU). A warm-up round (one request per engine) runs before the timed one,
so every engine has recorded its CUDA graphs for the size.
"""
import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_bench import run_level  # noqa: E402


def start_server(zimage, model, devices, extra, log_path):
    args = [zimage, "serve", "--port", "0", "--devices", devices, "--quiet",
            "--max-queue", "100000"] + (["--model", model] if model else []) + extra
    log = open(log_path, "w")
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=log, text=True)
    lines, port = [], None
    deadline = time.time() + 1800  # eight engines of a 6B model load in minutes, not hours

    def reader():
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))

    threading.Thread(target=reader, daemon=True).start()
    while time.time() < deadline:
        for line in list(lines):
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
            if m:
                port = int(m.group(1))
            if "ready" in line and port:
                return proc, port, lines
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"dp_scaling: server with --devices {devices} did not become ready "
                     f"(exit {proc.poll()}); stdout: {lines}; stderr in {log_path}")


def get_json(port, path):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as r:
        return json.loads(r.read())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--zimage", required=True, help="the zimage binary")
    ap.add_argument("--model", help="model folder (default: the built-in tiny model)")
    ap.add_argument("--engines", default="1,2", help="engine counts to measure, e.g. 1,2,4,8")
    ap.add_argument("--devices-for", action="append", default=[],
                    help="K=LIST: the --devices list for count K (default cuda:0..cuda:K-1)")
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--clients-per-engine", type=int, default=2)
    ap.add_argument("--requests", type=int, default=4, help="requests per client")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--serve-arg", action="append", default=[],
                    help="extra argument for zimage serve (repeat), e.g. --serve-arg=--batching")
    ap.add_argument("--json", help="append the rows as JSON lines here")
    ap.add_argument("--log-dir", default=".", help="server stderr logs go here")
    a = ap.parse_args()
    overrides = {}
    for item in a.devices_for:
        k, _, devs = item.partition("=")
        overrides[int(k)] = devs
    counts = [int(x) for x in a.engines.split(",") if x]
    rows = []
    for k in counts:
        devices = overrides.get(k, ",".join(f"cuda:{i}" for i in range(k)))
        log_path = os.path.join(a.log_dir, f"dp_scaling_serve_{k}.log")
        t0 = time.time()
        proc, port, lines = start_server(a.zimage, a.model, devices, a.serve_arg, log_path)
        load_s = time.time() - t0
        try:
            run_level(f"http://127.0.0.1:{port}", a.size, k, 1, a.steps, a.timeout, 900000)
            before = {d["engine"]: d for d in get_json(port, "/readyz")["devices"]}
            clients = a.clients_per_engine * k
            row, _ = run_level(f"http://127.0.0.1:{port}", a.size, clients, a.requests, a.steps,
                               a.timeout, 1000)
            after = get_json(port, "/readyz")["devices"]
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
        row.update({"engines": k, "devices": devices, "steps": a.steps, "load_s": load_s,
                    "jobs_per_engine": [d["jobs"] - before[d["engine"]]["jobs"] for d in after],
                    "busy_s_per_engine": [round(d["busy_s"] - before[d["engine"]]["busy_s"], 3)
                                          for d in after],
                    "backends": [d["backend"] for d in after]})
        rows.append(row)
        print(json.dumps(row), flush=True)
        if a.json:
            with open(a.json, "a") as f:
                f.write(json.dumps(row) + "\n")
    base = next((r["images_per_s"] for r in rows if r["engines"] == 1), None)
    print(f"\n{a.size}², {a.steps} steps, {a.clients_per_engine} clients per engine, "
          f"{a.requests} requests each\n")
    print("| engines | devices | images/s | speed-up | efficiency | p50 latency | jobs per engine | errors |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        sp = r["images_per_s"] / base if base else float("nan")
        print(f"| {r['engines']} | {r['devices']} | {r['images_per_s']:.3f} | {sp:.2f}× | "
              f"{sp / r['engines']:.0%} | {r['p50_s']:.2f} s | "
              f"{'/'.join(str(j) for j in r['jobs_per_engine'])} | {r['errors']} |")
    if any(r["errors"] for r in rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
