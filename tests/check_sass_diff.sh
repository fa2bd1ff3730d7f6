#!/usr/bin/env bash
# tools/sass_diff.py on two of the build's own kernel objects: an object against itself is all
# "identical" (exit 0, at least one kernel read), two different objects are reported as different
# (exit 1). Exit 77 (ctest: skipped) without cuobjdump and nvdisasm (scripts/fetch_cuobjdump.sh).
#   tests/check_sass_diff.sh SOURCE_DIR "OBJECT;OBJECT;..."   (the backend's object files)
set -euo pipefail
src=$1 objects=$2
tools=$src/third_party/cuobjdump
if ! { [ -x "$tools/cuobjdump" ] && [ -x "$tools/nvdisasm" ]; } &&
   ! { command -v cuobjdump && command -v nvdisasm; } >/dev/null 2>&1; then
  echo "SKIPPED: no cuobjdump and nvdisasm (run scripts/setup.sh)"; exit 77
fi
export PATH=$tools:$PATH  # cuobjdump -sass runs nvdisasm
pick() { tr ';' '\n' <<< "$objects" | grep -E "/kernels/$1\.cu\.o(bj)?$" | head -1; }
a=$(pick fp8) b=$(pick norm_bf16x2)
[ -n "$a" ] && [ -n "$b" ] || { echo "FAILED: no fp8.cu / norm_bf16x2.cu object in the list"; exit 1; }
out=$(python3 "$src/tools/sass_diff.py" "$a" "$a") || { echo "FAILED: an object against itself: $out"; exit 1; }
echo "$out"
grep -Eq '^[1-9][0-9]* kernels: ([1-9][0-9]*) identical, 0 with the same arithmetic, 0 different$' <<< "$out" ||
  { echo "FAILED: expected every kernel identical"; exit 1; }
set +e
out=$(python3 "$src/tools/sass_diff.py" "$a" "$b"); rc=$?
set -e
echo "$out" | tail -1
[ "$rc" -eq 1 ] || { echo "FAILED: two different objects gave exit $rc, expected 1"; exit 1; }
echo "sass_diff: ok"
