#!/usr/bin/env python3
"""Compares the SASS of two builds of a CUDA object or program, kernel by kernel.

For a refactor of shipped kernels that must not change their results (a helper taken out, code
moved), this says, without a GPU, whether each kernel's arithmetic is still the same: it counts
each kernel's instructions by opcode (predicates and operands dropped) and sorts the opcodes into
two kinds:
  value   float and half arithmetic (tensor-core MMAs included), conversions, special functions,
          shuffles, barriers, memory accesses and bulk copies: what decides the bytes a kernel
          writes;
  other   integer address arithmetic, moves, predicates' set-up, branches, NOPs: what the
          compiler's scheduling and register allocation reshuffle.
A kernel whose "value" counts are equal is reported as "same arithmetic" (a necessary condition
for the same results, not a proof: an operand could still differ, so the GPU tests stay the
check); any difference in them is listed.

Usage:
  tools/sass_diff.py BEFORE.o AFTER.o [--kernel REGEX] [--all]
The inputs are anything cuobjdump -sass reads (objects, programs, cubins). cuobjdump is taken from
third_party/cuobjdump/ (scripts/fetch_cuobjdump.sh) or PATH. Exit status: 0 when every kernel has
the same arithmetic, 1 when some differ, 2 on an error.
"""
import argparse
import collections
import os
import re
import shutil
import subprocess
import sys

VALUE_PREFIXES = ("F", "H", "D", "MUFU", "I2F", "SHFL", "BAR", "LD", "ST", "RED", "ATOM", "MEMBAR",
                  "VOTE", "REDUX", "WARPSYNC", "IMMA", "QGMMA", "UTMA", "UBLKCP", "SYNCS")
# Opcodes that start like value ones but are constant loads (kernel parameters) or integer/move
# idioms the compiler picks freely.
OTHER_PREFIXES = ("LDC", "HFMA2.MMA", "FLO")
INSN = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s+(.*?);")
FUNC = re.compile(r"^\s*Function : (\S+)")


def cuobjdump():
    here = os.path.dirname(os.path.abspath(__file__))
    local = os.path.join(here, "..", "third_party", "cuobjdump", "cuobjdump")
    if os.access(local, os.X_OK):
        return local
    found = shutil.which("cuobjdump")
    if not found:
        sys.exit("sass_diff: no cuobjdump (run scripts/fetch_cuobjdump.sh, or put one on PATH)")
    return found


def kernels(path):
    """{kernel name: [opcode, ...]} from cuobjdump -sass PATH."""
    try:
        text = subprocess.run([cuobjdump(), "-sass", path], check=True, capture_output=True,
                              text=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        print(f"sass_diff: cuobjdump could not read {path}: {e}", file=sys.stderr)
        sys.exit(2)
    out, cur = {}, None
    for line in text.splitlines():
        m = FUNC.match(line)
        if m:
            cur = m.group(1)
            out.setdefault(cur, [])
            continue
        m = INSN.match(line)
        if m and cur is not None:
            words = m.group(1).split()
            if words and words[0].startswith("@"):  # a predicate guard
                words = words[1:]
            if words:
                out[cur].append(words[0])
    return out


def is_value(op):
    return op.startswith(VALUE_PREFIXES) and not op.startswith(OTHER_PREFIXES)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--kernel", help="only kernels whose mangled name matches this regex")
    ap.add_argument("--all", action="store_true", help="also list kernels that are unchanged")
    a = ap.parse_args()
    b, c = kernels(a.before), kernels(a.after)
    for path, found in ((a.before, b), (a.after, c)):
        if not found:  # no SASS read: nothing would be compared, which must not pass as "same"
            print(f"sass_diff: no kernels in {path} (is nvdisasm beside cuobjdump or on PATH?)",
                  file=sys.stderr)
            return 2
    pick = re.compile(a.kernel) if a.kernel else None
    names = sorted(n for n in set(b) | set(c) if pick is None or pick.search(n))
    identical = same = differ = 0
    for n in names:
        if n not in b or n not in c:
            print(f"{'only before' if n in b else 'only after'}: {n}")
            differ += 1
            continue
        if b[n] == c[n]:
            identical += 1
            if a.all:
                print(f"identical ({len(b[n])} instructions): {n}")
            continue
        cb, cc = collections.Counter(b[n]), collections.Counter(c[n])
        delta = {op: cc[op] - cb[op] for op in set(cb) | set(cc) if cc[op] != cb[op]}
        value = {op: d for op, d in delta.items() if is_value(op)}
        if value:
            differ += 1
            print(f"ARITHMETIC DIFFERS ({len(b[n])} -> {len(c[n])}): {n}")
            print("    value ops: " + ", ".join(f"{op} {d:+d}" for op, d in sorted(value.items())))
        else:
            same += 1
            other = ", ".join(f"{op} {d:+d}" for op, d in sorted(delta.items())) or "reordered"
            print(f"same arithmetic ({len(b[n])} -> {len(c[n])} instructions; {other}): {n}")
    print(f"{len(names)} kernels: {identical} identical, {same} with the same arithmetic, "
          f"{differ} different")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
