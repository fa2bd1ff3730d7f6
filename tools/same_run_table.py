"""Issue 22's table from one GPU run: diffusers eager and torch.compile against zimage.

  python3 tools/same_run_table.py --diffusers diffusers_dit.json --zimage Z1.json [Z2.json ...] \
      --md OUT.md --json OUT.json

--diffusers is tools/diffusers_dit_bench.py's output (per size: eager and compile medians, each
with its energy a forward). Each --zimage file is one `zimage bench --json` run on the same
board; the tool sorts them by what they hold:
  bf16 runs (no "fp8_layers"): the DiT rows dit_forward_<size>_bs1 at every size, the VAE rows
      vae_decode_<size>, and the 1024² image pipeline_1024_bs1;
  FP8 runs ("fp8_layers" set): dit_forward_<size>_bs1 and pipeline_1024_bs1;
  any run with pipeline_1024_bs4: the 4-image row (bf16 runs only).
Several runs of one kind are listed side by side, run by run (each already a median of its
--iters), never averaged, so the spread between runs stays visible.

What it writes: the DiT table (eager, compile, zimage, zimage's speed-up over compile, the bar
compile / 1.2, both stacks' joules a forward where NVML gave them, and compile's joules over
zimage's), the other rows against issue 22's targets (met in every run, in some, or in none),
and whether the bar holds: every bf16 run at 1024² and at 2048² at least 1.2× compile's forward.
The same as JSON for scripts. A missing input, or a size one side lacks, leaves a dash and a
line saying what is missing; an unreadable file fails with its name.
"""
import argparse
import json
import os
import sys

BAR = 1.2  # issue 22: the bf16 DiT forward at least 1.2x torch.compile's
BAR_SIZES = (1024, 2048)
# Issue 22's other targets (ms): key, label, kind of run, JSON key, target.
TARGETS = [
    ("fp8_1024", "DiT 1024² FP8", "fp8", "dit_forward_1024_bs1", 55.0),
    ("fp8_2048", "DiT 2048² FP8", "fp8", "dit_forward_2048_bs1", 320.0),
    ("vae_1024", "VAE decode 1024²", "bf16", "vae_decode_1024", 25.0),
    ("vae_2048", "VAE decode 2048²", "bf16", "vae_decode_2048", 170.0),
    ("image_bf16", "image 1024², 8 steps, bf16", "bf16", "pipeline_1024_bs1", 720.0),
    ("image_fp8", "image 1024², 8 steps, FP8", "fp8", "pipeline_1024_bs1", 520.0),
    ("images_4", "4 images 1024², one batch", "bf16", "pipeline_1024_bs4", 2800.0),
]


class InputError(Exception):
    pass


def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except OSError as e:
        raise InputError("cannot read %s: %s" % (path, e.strerror or e))
    except ValueError as e:
        raise InputError("%s is not JSON: %s" % (path, e))


def fmt_ms(v):
    if v is None:
        return "–"
    return "%.0f ms" % v if v >= 1000 else "%.1f ms" % v


def fmt_j(v):
    return "–" if v is None else "%.1f J" % v


def joined(values, fmt):
    return " / ".join(fmt(v) for v in values) if values else fmt(None)


def row_of(run, key):
    r = run.get(key)
    return r if isinstance(r, dict) and isinstance(r.get("median_ms"), (int, float)) else None


def sizes_of(runs, prefix, suffix):
    """The sizes that dit_forward_<size>_bs1-style keys name in any of the runs."""
    out = set()
    for run in runs:
        for k in run:
            if k.startswith(prefix) and k.endswith(suffix):
                mid = k[len(prefix):len(k) - len(suffix)]
                if mid.isdigit():
                    out.add(int(mid))
    return out


def build(diffusers, zruns):
    """The table as a dict (the JSON output); zruns: [(path, run)] in the order given."""
    notes = []
    bf16 = [(p, r) for p, r in zruns if not r.get("fp8_layers")]
    fp8 = [(p, r) for p, r in zruns if r.get("fp8_layers")]
    d_sizes = {}
    if diffusers is not None:
        for s, v in (diffusers.get("sizes") or {}).items():
            if str(s).isdigit():
                d_sizes[int(s)] = v
    sizes = sorted(set(d_sizes) | sizes_of([r for _, r in bf16], "dit_forward_", "_bs1"))
    devices = sorted({str(r.get("device", "?")) for _, r in zruns})
    d_device = diffusers.get("device") if diffusers else None
    if d_device and any(d_device not in d for d in devices):
        notes.append("boards differ: diffusers ran on %s, zimage on %s" %
                     (d_device, ", ".join(devices)))
    if len(devices) > 1:
        notes.append("zimage's runs name more than one device: " + ", ".join(devices))

    dit = []
    for s in sizes:
        d = d_sizes.get(s, {})
        eager = (d.get("eager") or {}).get("median_ms")
        comp = (d.get("compile") or {}).get("median_ms")
        comp_j = (d.get("compile") or {}).get("joules_per_call")
        z_ms, z_j, z_mhz = [], [], []
        for _, r in bf16:
            row = row_of(r, "dit_forward_%d_bs1" % s)
            if row is None:
                continue
            z_ms.append(row["median_ms"])
            z_j.append(row.get("joules_per_run"))
            z_mhz.append(row.get("sm_mhz_median"))
        speedups = [comp / z for z in z_ms] if comp and z_ms else []
        energy = [comp_j / j for j in z_j if j] if comp_j else []
        if comp is None:
            notes.append("no torch.compile figure at %d²" % s)
        if not z_ms:
            notes.append("no zimage bf16 forward at %d²" % s)
        dit.append({
            "size": s, "eager_ms": eager, "compile_ms": comp, "zimage_ms": z_ms,
            "speedup": speedups, "bar_ms": comp / BAR if comp else None,
            "compile_j": comp_j, "zimage_j": [j for j in z_j if j is not None],
            "compile_sm_mhz": (d.get("compile") or {}).get("sm_mhz_median"),
            "zimage_sm_mhz": [m for m in z_mhz if m is not None],
            "energy_ratio": energy,
        })

    fp8_sets = sorted({str(r["fp8_layers"]) for _, r in fp8})
    others = []
    for key, label, kind, jkey, target in TARGETS:
        if kind == "fp8" and fp8_sets:
            label += " (%s)" % " / ".join(fp8_sets)
        runs = bf16 if kind == "bf16" else fp8
        vals = [row_of(r, jkey)["median_ms"] for _, r in runs if row_of(r, jkey)]
        met = sum(1 for v in vals if v <= target)
        verdict = ("no run" if not vals else "met" if met == len(vals) else
                   "not met" if met == 0 else "met in %d of %d runs" % (met, len(vals)))
        others.append({"key": key, "row": label, "ms": vals, "target_ms": target,
                       "verdict": verdict})

    bar_rows = [r for r in dit if r["size"] in BAR_SIZES]
    have = all(r["speedup"] for r in bar_rows) and len(bar_rows) == len(BAR_SIZES)
    bar_met = have and all(min(r["speedup"]) >= BAR for r in bar_rows)
    return {
        "devices": devices, "diffusers_device": d_device,
        "torch": diffusers.get("torch") if diffusers else None,
        "diffusers": diffusers.get("diffusers") if diffusers else None,
        "bf16_runs": [p for p, _ in bf16], "fp8_runs": [p for p, _ in fp8],
        "dit": dit, "others": others,
        "bar": {"ratio": BAR, "sizes": list(BAR_SIZES), "measured": have, "met": bar_met},
        "notes": notes,
    }


def markdown(t):
    lines = []
    board = ", ".join(t["devices"]) or "?"
    def names(paths):
        return ", ".join(os.path.splitext(os.path.basename(p))[0] for p in paths) or "none"

    lines.append("Board: %s; diffusers %s, torch %s. zimage runs (each figure a median of the "
                 "run's own iterations, listed run by run): bf16 %s; FP8 %s." %
                 (board, t["diffusers"] or "?", t["torch"] or "?", names(t["bf16_runs"]),
                  names(t["fp8_runs"])))
    lines.append("")
    lines.append("| DiT forward, bf16, batch 1 | diffusers eager | `torch.compile` | zimage | "
                 "zimage vs compile | bar (compile / %.1f) | J a forward: compile / zimage | "
                 "compile's J / zimage's |" % BAR)
    lines.append("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in t["dit"]:
        lines.append("| %d² | %s | %s | %s | %s | %s | %s / %s | %s |" % (
            r["size"], fmt_ms(r["eager_ms"]), fmt_ms(r["compile_ms"]),
            joined(r["zimage_ms"], fmt_ms),
            joined(r["speedup"], lambda v: "–" if v is None else "%.3f×" % v),
            "–" if r["bar_ms"] is None else "≤ %.1f ms" % r["bar_ms"],
            fmt_j(r["compile_j"]), joined(r["zimage_j"], fmt_j),
            joined(r["energy_ratio"], lambda v: "–" if v is None else "%.3f" % v)))
    lines.append("")
    lines.append("| row | measured | target | |")
    lines.append("| --- | --- | --- | --- |")
    for o in t["others"]:
        lines.append("| %s | %s | ≤ %s | %s |" % (o["row"], joined(o["ms"], fmt_ms),
                                                  fmt_ms(o["target_ms"]), o["verdict"]))
    lines.append("")
    b = t["bar"]
    if not b["measured"]:
        lines.append("The bar (%.1f× at %s): not measured (a size lacks a figure)." %
                     (b["ratio"], " and ".join("%d²" % s for s in b["sizes"])))
    else:
        lines.append("The bar (%.1f× `torch.compile` at %s, every run): **%s**." %
                     (b["ratio"], " and ".join("%d²" % s for s in b["sizes"]),
                      "met" if b["met"] else "not met"))
    for n in t["notes"]:
        lines.append("")
        lines.append("Note: " + n + ".")
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--diffusers", help="tools/diffusers_dit_bench.py's JSON")
    ap.add_argument("--zimage", nargs="+", required=True, help="zimage bench --json files")
    ap.add_argument("--md", help="write the Markdown table here (else stdout)")
    ap.add_argument("--json", help="write the table as JSON here")
    a = ap.parse_args(argv)
    try:
        diffusers = None
        if a.diffusers:
            if os.path.exists(a.diffusers):
                diffusers = read_json(a.diffusers)
            else:
                print("same_run_table: no diffusers figures (%s is missing)" % a.diffusers,
                      file=sys.stderr)
        zruns = []
        for p in a.zimage:
            if not os.path.exists(p):
                print("same_run_table: %s is missing, left out" % p, file=sys.stderr)
                continue
            run = read_json(p)
            if not isinstance(run, dict):
                raise InputError("%s is not a zimage bench result (not an object)" % p)
            zruns.append((p, run))
    except InputError as e:
        print("same_run_table: %s" % e, file=sys.stderr)
        return 2
    t = build(diffusers, zruns)
    md = markdown(t)
    if a.md:
        with open(a.md, "w") as f:
            f.write(md)
    else:
        sys.stdout.write(md)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(t, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
