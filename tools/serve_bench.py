#!/usr/bin/env python3
"""Load test of a running `zimage serve`: C concurrent clients, each sending R image requests one
after another through the OpenAI endpoint (POST /v1/images/generations, b64_json), on loopback.
Reports images/s over the whole run and the p50/p95 latency of single requests, per size and
client count, as JSON lines and a Markdown table. Bounded: every request has a timeout and the
run stops after its fixed count. Standard library only.

  tools/serve_bench.py --url http://127.0.0.1:8188 --sizes 512,1024 --clients 1,4,16 \
      --requests 4 --label batching-on --json out.json
"""
import argparse
import base64
import json
import statistics
import sys
import threading
import time
import urllib.error
import urllib.request


def one_request(url, size, seed, steps, timeout):
    body = json.dumps({"prompt": "a lighthouse on a cliff at dusk, photo", "size": f"{size}x{size}",
                       "n": 1, "seed": seed, "num_inference_steps": steps,
                       "response_format": "b64_json"}).encode()
    req = urllib.request.Request(url + "/v1/images/generations", data=body,
                                 headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=timeout) as r:
        payload = json.loads(r.read())
    dt = time.perf_counter() - t0
    img = base64.b64decode(payload["data"][0]["b64_json"])
    return dt, img


def run_level(url, size, clients, requests, steps, timeout, seed0):
    lat, errors, images = [], [], {}
    lock = threading.Lock()

    def client(c):
        for k in range(requests):
            seed = seed0 + c * 1000 + k
            try:
                dt, img = one_request(url, size, seed, steps, timeout)
                with lock:
                    lat.append(dt)
                    images[seed] = img
            except (urllib.error.URLError, OSError, KeyError, ValueError) as e:
                with lock:
                    errors.append(str(e))

    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    lat.sort()
    p = lambda q: lat[min(len(lat) - 1, int(round(q * (len(lat) - 1))))] if lat else float("nan")
    return {"size": size, "clients": clients, "requests": clients * requests, "ok": len(lat),
            "errors": len(errors), "wall_s": wall, "images_per_s": len(lat) / wall,
            "p50_s": p(0.50), "p95_s": p(0.95), "mean_s": statistics.mean(lat) if lat else None,
            "first_error": errors[0] if errors else None}, images


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8188")
    ap.add_argument("--sizes", default="512,1024")
    ap.add_argument("--clients", default="1,4,16")
    ap.add_argument("--requests", type=int, default=4, help="requests per client")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--label", default="")
    ap.add_argument("--json", help="append the rows as JSON lines here")
    ap.add_argument("--images-dir", help="write each image as <label>_<size>_<seed>.png here")
    a = ap.parse_args()
    if not a.url.startswith(("http://127.", "http://localhost", "http://[::1]")):
        sys.exit("serve_bench: loopback URLs only")
    rows = []
    for size in [int(s) for s in a.sizes.split(",")]:
        one_request(a.url, size, 1, a.steps, a.timeout)  # warm this size (graphs, plans)
        for clients in [int(c) for c in a.clients.split(",")]:
            row, images = run_level(a.url, size, clients, a.requests, a.steps, a.timeout, 10_000)
            row["label"] = a.label
            rows.append(row)
            print(json.dumps(row), flush=True)
            if a.images_dir:
                for seed, img in images.items():
                    with open(f"{a.images_dir}/{a.label}_{size}_{seed}.png", "wb") as f:
                        f.write(img)
    if a.json:
        with open(a.json, "a") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    print(f"\n| {a.label} | size | clients | requests | images/s | p50 s | p95 s | errors |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| | {r['size']}² | {r['clients']} | {r['requests']} | {r['images_per_s']:.2f} | "
              f"{r['p50_s']:.2f} | {r['p95_s']:.2f} | {r['errors']} |")


if __name__ == "__main__":
    main()
