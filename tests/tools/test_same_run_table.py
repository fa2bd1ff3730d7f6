"""tools/same_run_table.py on results shaped as the GPU machine writes them.

The diffusers file has tools/diffusers_dit_bench.py's layout and the zimage files `zimage bench
--json`'s keys (dit_forward_<size>_bs1, vae_decode_<size>, pipeline_1024_bs<n>, fp8_layers,
device); the figures are made up so that each verdict can be told apart.

  python3 tests/tools/test_same_run_table.py TOOL.py
"""
import contextlib
import importlib.util
import io
import json
import os
import sys
import tempfile
import unittest

TOOL = sys.argv.pop(1) if len(sys.argv) > 1 else os.path.join(
    os.path.dirname(__file__), "..", "..", "tools", "same_run_table.py")
spec = importlib.util.spec_from_file_location("same_run_table", TOOL)
srt = importlib.util.module_from_spec(spec)
spec.loader.exec_module(srt)

BOARD = "NVIDIA H100 80GB HBM3"


def diffusers(compile_ms, compile_j=None, eager_ms=None, device=BOARD):
    sizes = {}
    for s, ms in compile_ms.items():
        c = {"median_ms": ms, "iters": 5, "sm_mhz_median": 1600.0}
        if compile_j and s in compile_j:
            c["joules_per_call"] = compile_j[s]
        sizes[str(s)] = {"eager": {"median_ms": (eager_ms or {}).get(s, 1.5 * ms)}, "compile": c}
    return {"device": device, "torch": "2.11.0+cu130", "diffusers": "0.42.1",
            "prompt_tokens": 35, "sizes": sizes}


def zrun(dit, vae=None, image=None, batch4=None, fp8=None, joules=None, device=BOARD):
    r = {"device": "cuda:0 %s (bf16)" % device, "prompt_tokens": 35}
    for s, ms in dit.items():
        row = {"median_ms": ms, "min_ms": ms - 0.5, "max_ms": ms + 0.5, "sm_mhz_median": 1530.0}
        if joules and s in joules:
            row["joules_per_run"] = joules[s]
        r["dit_forward_%d_bs1" % s] = row
    for s, ms in (vae or {}).items():
        r["vae_decode_%d" % s] = {"median_ms": ms, "min_ms": ms, "max_ms": ms}
    if image is not None:
        r["pipeline_1024_bs1"] = {"median_ms": image, "min_ms": image, "max_ms": image}
    if batch4 is not None:
        r["pipeline_1024_bs4"] = {"median_ms": batch4, "min_ms": batch4, "max_ms": batch4}
    if fp8:
        r["fp8_layers"] = fp8
    return r


class Table(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()

    def tearDown(self):
        self.dir.cleanup()

    def write(self, name, obj):
        p = os.path.join(self.dir.name, name)
        with open(p, "w") as f:
            f.write(obj if isinstance(obj, str) else json.dumps(obj))
        return p

    def run_tool(self, *args):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = srt.main(list(args))
        return rc, out.getvalue(), err.getvalue()

    def test_speedups_energies_and_bar_not_met(self):
        d = self.write("d.json", diffusers({1024: 98.5, 1536: 269.6, 2048: 556.4},
                                           compile_j={1024: 71.5, 2048: 390.1}))
        z1 = self.write("z1.json", zrun({1024: 89.0, 1536: 235.4, 2048: 491.3},
                                        joules={1024: 62.0, 2048: 340.0}))
        z2 = self.write("z2.json", zrun({1024: 89.2, 2048: 491.6}))
        js = os.path.join(self.dir.name, "t.json")
        rc, md, _ = self.run_tool("--diffusers", d, "--zimage", z1, z2, "--json", js)
        self.assertEqual(rc, 0)
        with open(js) as f:
            t = json.load(f)
        r1024 = t["dit"][0]
        self.assertEqual(r1024["size"], 1024)
        self.assertEqual(r1024["zimage_ms"], [89.0, 89.2])
        self.assertAlmostEqual(r1024["speedup"][0], 98.5 / 89.0, places=9)
        self.assertAlmostEqual(r1024["speedup"][1], 98.5 / 89.2, places=9)
        self.assertAlmostEqual(r1024["bar_ms"], 98.5 / 1.2, places=9)
        self.assertAlmostEqual(r1024["energy_ratio"][0], 71.5 / 62.0, places=9)
        self.assertEqual(len(r1024["energy_ratio"]), 1)  # the second run has no joules
        self.assertEqual(t["dit"][1]["zimage_ms"], [235.4])  # 1536² in one run only
        self.assertTrue(t["bar"]["measured"])
        self.assertFalse(t["bar"]["met"])
        self.assertIn("| 1024² | 147.8 ms | 98.5 ms | 89.0 ms / 89.2 ms | 1.107× / 1.104× |", md)
        self.assertIn("≤ 82.1 ms", md)
        self.assertIn("71.5 J / 62.0 J", md)
        self.assertIn("**not met**", md)

    def test_bar_met_only_when_every_run_at_both_sizes_reaches_it(self):
        d = self.write("d.json", diffusers({1024: 98.5, 2048: 556.4}))
        fast = self.write("a.json", zrun({1024: 80.0, 2048: 460.0}))
        slow = self.write("b.json", zrun({1024: 80.0, 2048: 470.0}))  # 1.184x at 2048²
        rc, md, _ = self.run_tool("--diffusers", d, "--zimage", fast)
        self.assertEqual(rc, 0)
        self.assertIn("**met**", md)
        rc, md, _ = self.run_tool("--diffusers", d, "--zimage", fast, slow)
        self.assertIn("**not met**", md)

    def test_other_rows_sorted_by_kind_with_verdicts(self):
        bf = self.write("bf.json", zrun({1024: 89.0, 2048: 491.0}, vae={1024: 23.6, 2048: 121.6},
                                        image=756.0))
        b4 = self.write("b4.json", {"device": "cuda:0 %s (bf16)" % BOARD,
                                    "pipeline_1024_bs4": {"median_ms": 2935.0}})
        f1 = self.write("f1.json", zrun({1024: 54.9, 2048: 319.6}, image=502.0, fp8="all,sdpa"))
        f2 = self.write("f2.json", zrun({1024: 57.2, 2048: 321.4}, image=506.0, fp8="all,sdpa"))
        js = os.path.join(self.dir.name, "t.json")
        rc, md, _ = self.run_tool("--zimage", bf, b4, f1, f2, "--json", js)
        self.assertEqual(rc, 0)
        with open(js) as f:
            t = json.load(f)
        o = {r["key"]: r for r in t["others"]}
        self.assertEqual(o["fp8_1024"]["ms"], [54.9, 57.2])
        self.assertEqual(o["fp8_1024"]["verdict"], "met in 1 of 2 runs")
        self.assertEqual(o["fp8_2048"]["verdict"], "met in 1 of 2 runs")
        self.assertEqual(o["vae_1024"]["verdict"], "met")
        self.assertEqual(o["vae_2048"]["verdict"], "met")
        self.assertEqual(o["image_bf16"]["ms"], [756.0])  # the FP8 images are not bf16 images
        self.assertEqual(o["image_bf16"]["verdict"], "not met")
        self.assertEqual(o["image_fp8"]["ms"], [502.0, 506.0])
        self.assertEqual(o["image_fp8"]["verdict"], "met")
        self.assertEqual(o["images_4"]["ms"], [2935.0])
        self.assertEqual(o["images_4"]["verdict"], "not met")
        self.assertIn("| DiT 1024² FP8 (all,sdpa) | 54.9 ms / 57.2 ms | ≤ 55.0 ms | met in 1 of 2 "
                      "runs |", md)
        # The FP8 forwards are not bf16 forwards: the DiT table holds the bf16 run only.
        self.assertEqual([r["zimage_ms"] for r in t["dit"]], [[89.0], [491.0]])
        # No diffusers file: no ratio, and the bar is not called either way.
        self.assertFalse(t["bar"]["measured"])
        self.assertIn("not measured", md)
        self.assertIn("no torch.compile figure at 1024²", md)

    def test_missing_and_mismatched_inputs_are_named(self):
        d = self.write("d.json", diffusers({1024: 98.5}, device="NVIDIA H200"))
        z = self.write("z.json", zrun({1024: 89.0, 2048: 491.0}))
        rc, md, err = self.run_tool("--diffusers", d, "--zimage", z,
                                    os.path.join(self.dir.name, "absent.json"))
        self.assertEqual(rc, 0)
        self.assertIn("absent.json is missing", err)
        self.assertIn("boards differ: diffusers ran on NVIDIA H200", md)
        self.assertIn("| 2048² | – | – | 491.0 ms | – |", md)
        bad = self.write("bad.json", "{ not json")
        rc, _, err = self.run_tool("--diffusers", d, "--zimage", bad)
        self.assertEqual(rc, 2)
        self.assertIn("bad.json is not JSON", err)
        lst = self.write("list.json", [1, 2])
        rc, _, err = self.run_tool("--zimage", lst)
        self.assertEqual(rc, 2)
        self.assertIn("list.json is not a zimage bench result", err)


if __name__ == "__main__":
    unittest.main(verbosity=1)
