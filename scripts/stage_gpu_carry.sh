#!/usr/bin/env bash
# Packs what a GPU-machine run needs into build/carry (device tool: carry ["build/carry", ".whl"]).
# The GPU machine's image has CUDA but not the project's -dev packages (PCRE2, utf8proc, OpenBLAS,
# CLI11...), so zimage is built here with the gpu preset and carried with its non-system shared
# libraries, xz-compressed; scripts/gpu_run.sh unpacks them there. PRESET=ci reuses the CI
# build (same sm_90a code, warnings as errors) instead of a second CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PRESET=${PRESET:-gpu}
cmake --preset "$PRESET" >/dev/null
cmake --build "build/$PRESET" -j "$(nproc)" --target zimage zimage_gpu_tests
# CARRY_BINS: which programs travel (default both). The device tool's 64 MiB holds the tracked
# tree, both programs and their libraries, but not also the diffusers wheel (.whl/): a call that
# needs the wheel stages CARRY_BINS=zimage, a test-only call CARRY_BINS=zimage_gpu_tests.
CARRY_BINS=${CARRY_BINS:-zimage zimage_gpu_tests}
bins=()
for b in $CARRY_BINS; do
  case "$b" in
    zimage) bins+=("build/$PRESET/zimage") ;;
    zimage_gpu_tests) bins+=("build/$PRESET/tests/zimage_gpu_tests") ;;
    *) echo "stage_gpu_carry: CARRY_BINS names '$b' (zimage, zimage_gpu_tests)" >&2; exit 2 ;;
  esac
done
rm -rf build/carry && mkdir -p build/carry/lib
for b in "${bins[@]}"; do
  xz -T0 -c "$b" > "build/carry/$(basename "$b").xz"
done
for l in $(ldd "${bins[@]}" | awk '/=> \//{print $3}' | sort -u |
           grep -vE 'cuda|cudnn|cublas|/libc\.|/libm\.|libdl|libpthread|librt|libgcc_s|libstdc|ld-linux'); do
  xz -T0 -c "$(readlink -f "$l")" > "build/carry/lib/$(basename "$l").xz"
done
# The engine's static libraries, for the Python module linked there (scripts/gpu_pymodule), when
# this build has the module (position-independent objects).
if [ -d "build/$PRESET/python" ]; then
  mkdir -p build/carry/static
  for a in builtin api core pipeline model backend io; do
    xz -T0 -c "build/$PRESET/libzimage_$a.a" > "build/carry/static/libzimage_$a.a.xz"
  done
fi
# BEFORE_BIN: a zimage built before a change, for before/after rows (gpu_run.sh startup).
if [ -n "${BEFORE_BIN:-}" ]; then
  xz -T0 -c "$BEFORE_BIN" > build/carry/zimage_before.xz
fi
du -sh build/carry
