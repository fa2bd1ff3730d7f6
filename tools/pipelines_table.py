"""Side-by-side table of `zimage bench --pipeline ...` and tools/diffusers_pipelines_bench.py.

  python3 tools/pipelines_table.py --zimage Z.json --diffusers D.json --json OUT.json --md OUT.md
Either input may be missing (its columns stay empty and the table says so). Per pipeline: denoising
steps, s / image (median) of each, the ratio diffusers / zimage (> 1: zimage faster), the driver's
peak GPU memory of each (total - free, context included) and the tensor peaks (zimage: its
allocator's bytes in tensors; diffusers: torch.cuda.max_memory_allocated).
"""
import argparse
import json
import os

ORDER = ["t2i", "img2img", "inpaint", "controlnet", "controlnet-inpaint"]


def load(path):
    if not path or not os.path.exists(path):
        return None, "no result (%s)" % (path or "not given")
    try:
        with open(path) as f:
            return json.load(f), ""
    except ValueError as e:
        return None, "unreadable %s: %s" % (path, e)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--zimage", required=True)
    ap.add_argument("--diffusers", required=True)
    ap.add_argument("--json", required=True)
    ap.add_argument("--md", required=True)
    a = ap.parse_args()
    z, zerr = load(a.zimage)
    d, derr = load(a.diffusers)
    zr = {r["pipeline"]: r for r in (z or {}).get("pipelines", [])}
    dr = {r["pipeline"]: r for r in (d or {}).get("pipelines", [])}
    rows = []
    for p in ORDER:
        if p not in zr and p not in dr:
            continue
        a_, b_ = zr.get(p, {}), dr.get(p, {})
        row = {"pipeline": p,
               "denoising_steps": a_.get("denoising_steps", b_.get("denoising_steps")),
               "zimage_s": a_.get("image_s"), "diffusers_s": b_.get("image_s"),
               "zimage_first_call_s": a_.get("first_call_s"), "diffusers_first_call_s": b_.get("first_call_s"),
               "zimage_driver_peak_gib": a_.get("driver_peak_gib"),
               "diffusers_driver_peak_gib": b_.get("driver_peak_gib"),
               "zimage_alloc_peak_gib": a_.get("alloc_peak_gib"),
               "diffusers_max_memory_allocated_gib": b_.get("max_memory_allocated_gib"),
               "diffusers_max_memory_reserved_gib": b_.get("max_memory_reserved_gib")}
        if row["zimage_s"] and row["diffusers_s"]:
            row["speedup"] = row["diffusers_s"] / row["zimage_s"]
        if a_.get("denoising_steps") is not None and b_.get("denoising_steps") is not None \
                and a_["denoising_steps"] != b_["denoising_steps"]:
            row["warning"] = "denoising steps differ: zimage %d, diffusers %d" % (
                a_["denoising_steps"], b_["denoising_steps"])
        rows.append(row)
    meta = {k: (z or d or {}).get(k) for k in ("size", "steps", "strength", "control_scale", "iters")}
    out = {"settings": meta, "rows": rows, "zimage_error": zerr, "diffusers_error": derr,
           "zimage": z, "diffusers": d}
    with open(a.json, "w") as f:
        json.dump(out, f, indent=1)

    def num(v, fmt):
        return fmt % v if isinstance(v, (int, float)) else "-"

    dtype = (d or {}).get("dtype", "bf16")
    lines = ["| pipeline (%s², %s steps, %s) | denoising steps | zimage s / image | diffusers s / image | "
             "diffusers / zimage | zimage first call s | diffusers first call s | zimage driver peak GiB | "
             "diffusers driver peak GiB | zimage GiB in tensors (peak) | diffusers max_memory_allocated GiB |"
             % (meta["size"], meta["steps"], dtype),
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            r["pipeline"], num(r["denoising_steps"], "%d"), num(r["zimage_s"], "%.3f"),
            num(r["diffusers_s"], "%.3f"), num(r.get("speedup"), "%.2fx"),
            num(r["zimage_first_call_s"], "%.2f"), num(r["diffusers_first_call_s"], "%.2f"),
            num(r["zimage_driver_peak_gib"], "%.2f"), num(r["diffusers_driver_peak_gib"], "%.2f"),
            num(r["zimage_alloc_peak_gib"], "%.2f"), num(r["diffusers_max_memory_allocated_gib"], "%.2f")))
    notes = []
    if meta["strength"] is not None:
        notes.append("img2img and inpaint at strength %s; median of %s images after one warm-up; "
                     "seed 42, guidance 0." % (meta["strength"], meta["iters"]))
    for r in rows:
        if "warning" in r:
            notes.append("%s: %s" % (r["pipeline"], r["warning"]))
    if zerr:
        notes.append("zimage: " + zerr)
    if derr:
        notes.append("diffusers: " + derr)
    text = "\n".join(lines) + "\n" + "".join("\n" + n for n in notes) + "\n"
    with open(a.md, "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
