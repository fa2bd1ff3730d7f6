#!/usr/bin/env python3
"""Whole-process start-up of `zimage generate` (issue 24): one row per configuration, each a new
process as a user runs it (one 1024² image), with the per-phase breakdown read from `--verbose`.

  tools/startup_bench.py --bin build/ci/zimage --model DIR --out DIR [--rows warm,empty,...]
      [--dit FILE --text-encoder FILE] [--iters N]

Rows (each a median of --iters processes unless said):
  warm          kernel and plan caches warm (one unmeasured process first), files in the page cache
  empty         $XDG_CACHE_HOME and $CUDA_CACHE_PATH new empty folders for every process
  budget12/8/4  --vram-budget 12 / 8 / 4 (bf16 weights)
  fp8b8/fp8b4   --vram-budget 8 / 4 --weights fp8
  files12/8/4   --vram-budget 12 / 8 / 4 --streamed-weights files (streamed blocks read from the
                weight files at every step, no load-time copy)
  locked12/8/4  --vram-budget 12 / 8 / 4 --streamed-weights locked-files (the files' pages
                page-locked in place)
  uplocked      as warm, with ZIMAGE_UPLOAD=locked (each weight file's pages locked in place while
                it uploads: no staging copies)
  reg12/8/4     --vram-budget 12 / 8 / 4 with ZIMAGE_HOST_PIN=register (copies page-locked in
                place by cudaHostRegister instead of cudaHostAlloc)
  single_fp8    --dit FILE --text-encoder FILE (ComfyUI scaled-FP8 single files)
  cold          the model's files dropped from the page cache before every process
                (posix_fadvise(POSIX_FADV_DONTNEED) on each file; the residency left is measured
                with mincore), beside a `dd` read of the same files dropped the same way
Writes <tag>.json and <tag>.md under --out (--tag, default "startup"), and each process's log as
<tag>_<row>_<i>.log; run it with --bin of a build before a change and --tag startup_before for the
before/after pair.
"""
import argparse
import ctypes
import ctypes.util
import json
import mmap
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

PROMPT = ("A snow fairy with long silver hair in a blue dress standing in a snowy forest, anime "
          "style, soft lighting, intricate details, masterpiece")

LIBC = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
LIBC.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]


def model_files(paths):
    out = []
    for p in paths:
        if os.path.isfile(p):
            out.append(p)
            continue
        for root, _, names in os.walk(p):
            out += [os.path.join(root, n) for n in names]
    return sorted(out)


def drop_from_page_cache(files):
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


LIBC.mmap.restype = ctypes.c_void_p
LIBC.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                      ctypes.c_long]
LIBC.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]


LOW_BIT = bytes(i & 1 for i in range(256))  # mincore's other bits are reserved


def resident_fraction(files):
    """Bytes of `files` in the page cache / their size (mincore on a mapping of each)."""
    page = os.sysconf("SC_PAGE_SIZE")
    total = resident = 0
    for f in files:
        size = os.path.getsize(f)
        if size == 0:
            continue
        fd = os.open(f, os.O_RDONLY)
        try:
            p = LIBC.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
            vec = ctypes.create_string_buffer((size + page - 1) // page)
            if LIBC.mincore(p, size, vec) == 0:  # one byte a page; bit 0: resident
                raw = vec.raw[:(size + page - 1) // page].translate(LOW_BIT)
                resident += min(size, (len(raw) - raw.count(0)) * page)
            LIBC.munmap(p, size)
        finally:
            os.close(fd)
        total += size
    return resident / total if total else 0.0


def read_into_page_cache(files):
    """Reads into the page cache each of `files` that is not wholly resident (mincore), whole: a
    re-read of all 20 GB before every process cost seconds each, most of a GPU call's startup
    stage."""
    t = time.monotonic()
    read = 0
    for f in files:
        if resident_fraction([f]) >= 1.0:
            continue
        with open(f, "rb") as fh:
            while True:
                chunk = fh.read(64 << 20)
                if not chunk:
                    break
                read += len(chunk)
    if read:
        sys.stderr.write("page cache: read %.2f GB in %.2f s\n" % (read / 1e9, time.monotonic() - t))


PHASES = [
    ("backend_s", re.compile(r"cuda backend .* ready in ([0-9.]+) s")),
    ("tokenizer_load_s", re.compile(r"tokenizer loaded in ([0-9.]+) s")),
    ("opened_s", re.compile(r"model sources opened (?:and tokenizer parsed )?in ([0-9.]+) s")),
    ("tokenizer_wait_s", re.compile(r"tokenizer ready \(waited ([0-9.]+) s")),
    ("text_encoder_load_s", re.compile(r"text_encoder loaded in ([0-9.]+) s")),
    ("transformer_load_s", re.compile(r"transformer loaded in ([0-9.]+) s")),
    ("vae_load_s", re.compile(r"vae loaded in ([0-9.]+) s")),
    ("load_s", re.compile(r"\] loaded .* in ([0-9.]+) s")),
    ("text_encoder_s", re.compile(r"^text encoder +([0-9.]+) s", re.M)),
    ("step0_s", re.compile(r"^  step 0 +([0-9.]+) s", re.M)),
    ("step1_s", re.compile(r"^  step 1 +([0-9.]+) s", re.M)),
    ("denoise_s", re.compile(r"^denoise +([0-9.]+) s", re.M)),
    ("vae_decode_s", re.compile(r"^vae decode +([0-9.]+) s", re.M)),
    ("image_s", re.compile(r"^total +([0-9.]+) s", re.M)),
    ("read_ahead_gb", re.compile(r"prefetch: ([0-9.]+) GB read ahead")),
    ("gate_wait_s", re.compile(r"the load waited for it [0-9]+ times, ([0-9.]+) s")),
]
STAMP = re.compile(r"^\[zimage (?:info|debug) ([0-9.]+)s\] (.*)$", re.M)


def parse(log):
    row = {}
    for key, rx in PHASES:
        m = rx.search(log)
        if m:
            row[key] = float(m.group(1))
    for t, msg in STAMP.findall(log):
        if msg.startswith("loaded ") and " in " in msg:
            row["loaded_at_s"] = float(t)  # process clock when loading ended
        if msg.startswith("cuda backend"):
            row["backend_at_s"] = float(t)
    return row


IMAGE_DIR = tempfile.mkdtemp(prefix="zimage-startup-images-")


def run_once(args, name, i, extra, env):
    # The pictures go to a scratch folder: --out is what a GPU call brings back (a few files).
    out_png = os.path.join(IMAGE_DIR, "%s_%s_%d.png" % (args.tag, name, i))
    cmd = [args.bin, "generate", "--prompt", PROMPT, "--seed", "42", "--width", str(args.size),
           "--height", str(args.size), "--steps", "8", "--device", args.device, "--verbose",
           "--output", out_png] + extra
    if not any(a in ("--dit",) for a in extra):
        cmd += ["--model", args.model]
    t = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    log = p.stdout.read().decode(errors="replace")
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.monotonic() - t
    with open(os.path.join(args.out, "%s_%s_%d.log" % (args.tag, name, i)), "w") as f:
        f.write(" ".join(cmd) + "\n" + log)
    row = parse(log)
    row.update(wall_s=round(wall, 3), max_rss_gib=round(ru.ru_maxrss / 2**20, 2),
               rc=os.waitstatus_to_exitcode(status))
    if "loaded_at_s" in row and "image_s" in row:
        row["after_image_s"] = round(wall - row["loaded_at_s"] - row["image_s"], 3)
    sys.stderr.write("%s #%d: %s\n" % (name, i, json.dumps(row)))
    return row


def median_row(rows):
    keys = set().union(*rows)
    med = {}
    for k in keys:
        vals = [r[k] for r in rows if k in r]
        med[k] = round(statistics.median(vals), 3) if vals else None
    med["n"] = len(rows)
    med["walls"] = [r.get("wall_s") for r in rows]
    return med


def write_results(args, results, dd_result):
    """<tag>.json and <tag>.md: every row measured so far (medians in the table)."""
    with open(os.path.join(args.out, args.tag + ".json"), "w") as f:
        json.dump(results, f, indent=1)
    cols = ["wall_s", "backend_s", "load_s", "text_encoder_load_s", "transformer_load_s",
            "text_encoder_s", "step0_s", "step1_s", "vae_decode_s", "image_s", "after_image_s",
            "max_rss_gib"]
    with open(os.path.join(args.out, args.tag + ".md"), "w") as f:
        f.write("| row | " + " | ".join(cols) + " |\n|" + " --- |" * (len(cols) + 1) + "\n")
        for name, r in results["rows"].items():
            m = r["median"]
            f.write("| %s | " % name + " | ".join(
                "%.3f" % m[c] if isinstance(m.get(c), (int, float)) else "-" for c in cols) + " |\n")
        if dd_result is not None:
            d = dd_result
            f.write("\ncold: dd of the same files after the same drop: %.2f s, %.2f GB/s "
                    "(resident before %.4f)\n" % (d["seconds"], d["gbps"], d["resident_before"]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--rows", default="warm,empty,budget12,budget8,budget4,files12,files8,"
                    "files4,fp8b8,fp8b4,cold")
    ap.add_argument("--dit")
    ap.add_argument("--text-encoder")
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--label", default="")
    ap.add_argument("--tag", default="startup")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--size", type=int, default=1024)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    base = dict(os.environ)
    warm_cache = tempfile.mkdtemp(prefix="zimage-startup-xdg-")
    base["XDG_CACHE_HOME"] = warm_cache
    files = model_files([args.model] + [f for f in (args.dit, args.text_encoder) if f])
    configs = {
        "warm": [],
        "empty": [],
        "budget12": ["--vram-budget", "12"],
        "budget8": ["--vram-budget", "8"],
        "budget4": ["--vram-budget", "4"],
        "fp8b8": ["--vram-budget", "8", "--weights", "fp8"],
        "fp8b4": ["--vram-budget", "4", "--weights", "fp8"],
        "files12": ["--vram-budget", "12", "--streamed-weights", "files"],
        "files8": ["--vram-budget", "8", "--streamed-weights", "files"],
        "files4": ["--vram-budget", "4", "--streamed-weights", "files"],
        "locked12": ["--vram-budget", "12", "--streamed-weights", "locked-files"],
        "locked8": ["--vram-budget", "8", "--streamed-weights", "locked-files"],
        "locked4": ["--vram-budget", "4", "--streamed-weights", "locked-files"],
        "uplocked": [],
        "reg12": ["--vram-budget", "12"],
        "reg8": ["--vram-budget", "8"],
        "reg4": ["--vram-budget", "4"],
        "single_fp8": ["--dit", args.dit or "", "--text-encoder", args.text_encoder or "",
                       "--model", args.model],
        "cold": [],
    }
    results = {"label": args.label, "rows": {}}
    read_into_page_cache(files)
    run_once(args, "fill", 0, [], base)  # fills the plan and kernel caches: unmeasured
    # A row name may carry settings after its configuration's name: "<row>+alloc" page-locks
    # with cudaHostAlloc (ZIMAGE_HOST_PIN=alloc) instead of registered huge pages, "<row>+noexec"
    # keeps the warm-up from executing the first decode's convolutions (ZIMAGE_WARM_EXECUTE=0),
    # "<row>+gate" makes the uploads wait for the read-ahead rather than fault the files in
    # (ZIMAGE_PREFETCH_GATE=1; "+nogate" the default, explicitly), "<row>+blasserial" loads
    # cuBLAS after the CUDA context rather than beside the driver's start (ZIMAGE_CUBLAS_THREAD=0),
    # "<row>+nograph" runs every DiT forward eagerly (ZIMAGE_DIT_GRAPHS=0), "<row>+warmup2" also records the first image's
    # linears during the load (ZIMAGE_WARM_UP=2), "<row>+nohuge" keeps large host buffers in small
    # pages (ZIMAGE_HOST_HUGE_PAGES=0).
    suffixes = {"alloc": ("ZIMAGE_HOST_PIN", "alloc"), "noexec": ("ZIMAGE_WARM_EXECUTE", "0"),
                "nogate": ("ZIMAGE_PREFETCH_GATE", "0"), "gate": ("ZIMAGE_PREFETCH_GATE", "1"),
                "blasserial": ("ZIMAGE_CUBLAS_THREAD", "0"),
                "nograph": ("ZIMAGE_DIT_GRAPHS", "0"), "warmup2": ("ZIMAGE_WARM_UP", "2"),
                "nohuge": ("ZIMAGE_HOST_HUGE_PAGES", "0")}
    dd_result = None  # `dd` of the dropped files, once per run however many cold rows
    for name in args.rows.split(","):
        rows = []
        config, *extras = name.split("+")
        for i in range(args.iters):
            env = dict(base)
            for x in extras:
                key, value = suffixes[x]
                env[key] = value
            if config.startswith("reg"):
                env["ZIMAGE_HOST_PIN"] = "register"
            if config == "uplocked":
                env["ZIMAGE_UPLOAD"] = "locked"
            if config == "empty":
                env["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="zimage-startup-empty-")
                env["CUDA_CACHE_PATH"] = tempfile.mkdtemp(prefix="zimage-startup-cuda-")
            if config == "cold":
                drop_from_page_cache(files)
                rows_extra = {"resident_before": round(resident_fraction(files), 4)}
            else:
                read_into_page_cache(files)
                rows_extra = {}
            r = run_once(args, name, i, configs[config], env)
            r.update(rows_extra)
            rows.append(r)
            results["rows"][name] = {"median": median_row(rows), "runs": list(rows)}
            write_results(args, results, dd_result)
            if config == "empty":
                shutil.rmtree(env["XDG_CACHE_HOME"], ignore_errors=True)
                shutil.rmtree(env["CUDA_CACHE_PATH"], ignore_errors=True)
        results["rows"][name] = {"median": median_row(rows), "runs": rows}
        if config == "cold" and dd_result is not None:
            results["rows"][name]["dd"] = dd_result
        elif config == "cold":
            drop_from_page_cache(files)
            before = resident_fraction(files)
            total = sum(os.path.getsize(f) for f in files)
            t = time.monotonic()
            for f in files:
                subprocess.run(["dd", "if=" + f, "of=/dev/null", "bs=16M", "status=none"],
                               check=False)
            dd = time.monotonic() - t
            dd_result = {"bytes": total, "seconds": round(dd, 3),
                         "gbps": round(total / dd / 1e9, 2), "resident_before": round(before, 4)}
            results["rows"][name]["dd"] = dd_result
            read_into_page_cache(files)
        # After every row, so that a run cut short (a stage's timeout) keeps the rows it finished.
        write_results(args, results, dd_result)
    write_results(args, results, dd_result)
    shutil.rmtree(warm_cache, ignore_errors=True)
    print(open(os.path.join(args.out, args.tag + ".md")).read())


if __name__ == "__main__":
    main()
