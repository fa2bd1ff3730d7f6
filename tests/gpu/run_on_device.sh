#!/usr/bin/env bash
# Staging on the dev machine (the device image lacks the project's -dev packages, so the suite is
# built here and carried; see docs/CUDA_NOTES.md):
#   cmake --preset ci -B build/cuda && cmake --build build/cuda --target zimage_gpu_tests -j2
#   mkdir -p build/carry/lib && cp tests/gpu/run_on_device.sh build/carry/run.sh
#   xz -c build/cuda/tests/zimage_gpu_tests > build/carry/zimage_gpu_tests.xz
#   for l in $(ldd build/cuda/tests/zimage_gpu_tests | awk '/=> \//{print $3}' |
#       grep -vE 'cuda|cudnn|cublas|/libc\.|/libm\.|libdl|libpthread|librt|libgcc_s|libstdc'); do
#     xz -c "$l" > build/carry/lib/$(basename "$l").xz; done
# then run `bash build/carry/run.sh` on the device with carry ["build/carry"].
# Device-machine driver for the CUDA op tests: runs the binary built on the dev machine (carried,
# xz-compressed, with its OpenBLAS) if it starts there, else builds the suite there. Full log in
# $OUT/test.log; a summary (failures, perf lines, tail) on stdout.
set -u
cd "$(dirname "$0")"
CARRY=$PWD
ROOT=$(cd ../.. && pwd)
OUT=${OUT:-/tmp/zi_out}
mkdir -p "$OUT"
nvidia-smi -L
nvidia-smi --query-gpu=clocks.sm,clocks.mem,temperature.gpu,memory.used --format=csv,noheader
LIBS=/usr/local/cuda/lib64:/usr/local/cuda/lib
for m in cudnn cublas cuda_runtime; do
  d=$(python3 -c "import nvidia.$m as x; print(list(x.__path__)[0])" 2>/dev/null)
  [ -n "$d" ] && LIBS=$LIBS:$d/lib
done
python3 - <<'PY'
import glob, lzma, shutil
for f in glob.glob('*.xz') + glob.glob('lib/*.xz'):
    with lzma.open(f) as i, open(f[:-3], 'wb') as o:
        shutil.copyfileobj(i, o)
PY
chmod +x zimage_gpu_tests
BIN=$CARRY/zimage_gpu_tests
RUNLIB=$CARRY/lib:$LIBS:${LD_LIBRARY_PATH:-}
if ! LD_LIBRARY_PATH=$RUNLIB $BIN --gtest_list_tests > "$OUT/list.log" 2>&1; then
  echo "== carried binary does not start; building on the device"; head -5 "$OUT/list.log"
  cd "$ROOT"
  if ! cmake --preset gpu -B build/gpu -DCMAKE_CXX_FLAGS=-Wno-error=restrict \
      -DCMAKE_CUDA20_STANDARD_COMPILE_OPTION=-std=c++20 \
      -DCMAKE_CUDA20_EXTENSION_COMPILE_OPTION=-std=c++20 > "$OUT/configure.log" 2>&1; then
    tail -30 "$OUT/configure.log"; exit 1
  fi
  if ! cmake --build build/gpu -j16 --target zimage_gpu_tests > "$OUT/build.log" 2>&1; then
    grep -E "error|FAILED" "$OUT/build.log" | head -30; exit 1
  fi
  BIN=$ROOT/build/gpu/tests/zimage_gpu_tests
  RUNLIB=$LIBS:${LD_LIBRARY_PATH:-}
fi
LD_LIBRARY_PATH=$RUNLIB ldd "$BIN" | grep -E "cudnn|cublas|cudart|openblas|not found"
start=$(date +%s)
LD_LIBRARY_PATH=$RUNLIB timeout 300 "$BIN" --gtest_color=no ${GTEST_ARGS:---gtest_filter=CudaOps*} \
  > "$OUT/test.log" 2>&1
rc=$?
echo "== tests rc=$rc in $(( $(date +%s) - start )) s"
echo "== failures"; grep -B1 -A5 "Failure$" "$OUT/test.log" | head -120
echo "== worst bf16 / f32 errors (rel_l2)"
for dt in f32 bf16; do
  grep -E " $dt +rel_l2" "$OUT/test.log" |
    awk '{for (i = 1; i <= NF; i++) if ($i == "rel_l2") print $(i + 1), $0}' | \
    sort -g | tail -4 | cut -d' ' -f2-
done
echo "== perf"; grep -E "PERF|cuDNN|allocator:" "$OUT/test.log"
echo "== summary"; grep -E "^\[  (PASSED|FAILED|SKIPPED) |tests ran" "$OUT/test.log" | head -40
if [ "${MEMCHECK:-1}" = 1 ] && command -v compute-sanitizer > /dev/null; then
  LD_LIBRARY_PATH=$RUNLIB timeout ${MEMCHECK_S:-150} compute-sanitizer --tool memcheck \
    --print-limit 20 "$BIN" --gtest_color=no \
    --gtest_filter='CudaOps.*-CudaOps.FlashMatchesGeneralAtDitSize:CudaOps.OutOfMemoryIsAStatus' \
    > "$OUT/memcheck.log" 2>&1
  echo "== memcheck rc=$?"
  grep -E "ERROR SUMMARY|Invalid|out of bounds|^\[  FAILED" "$OUT/memcheck.log" | head -20
fi
exit $rc
