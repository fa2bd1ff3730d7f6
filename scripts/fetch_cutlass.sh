#!/usr/bin/env bash
# Fetches the headers of NVIDIA's CUTLASS (BSD-3-Clause, header-only CUDA C++ templates for GEMMs)
# into third_party/cutlass/ (git-ignored). zimage uses CUTLASS 3.x's Hopper GEMMs where cuBLASLt
# has no kernel with the epilogue it needs (FP8 GEMMs with a scale per token and per output
# channel, applied to the fp32 sums). There is no Debian package; the headers come from the pinned
# PyPI wheel (nvidia-cutlass carries them under cutlass_library/source/include). Without them the
# CUDA backend builds without those kernels and falls back to cuBLASLt plus a scaling pass; CMake
# says so.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=4.2.0.0
DEST=third_party/cutlass
if [ -f "$DEST/include/cutlass/cutlass.h" ] && [ -f "$DEST/include/cutlass/util/command_line.h" ] &&
   [ "$(cat "$DEST/VERSION" 2>/dev/null)" = "$VERSION" ]; then
  echo "setup: CUTLASS $VERSION present"; exit 0
fi
command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ] || {
  echo "setup: no nvcc, CUTLASS not needed"; exit 0; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if ! python3 -m pip download -q --no-deps --only-binary=:all: -d "$tmp" \
     "nvidia-cutlass==$VERSION" >/dev/null 2>&1; then
  echo "setup: could not download CUTLASS $VERSION; building without the CUTLASS FP8 GEMMs"
  exit 0
fi
rm -rf "$DEST" && mkdir -p "$DEST/include"
python3 - "$tmp" "$DEST" <<'PY'
import glob, os, sys, zipfile
whl = glob.glob(sys.argv[1] + "/*.whl")[0]
# The library's headers, and its utility headers (cutlass/util/, which FlashInfer's attention
# kernels include) beside them.
srcs = ("cutlass_library/source/include/", "cutlass_library/source/tools/util/include/")
with zipfile.ZipFile(whl) as z:
    for n in z.namelist():
        src = next((s for s in srcs if n.startswith(s)), None)
        if src and not n.endswith("/"):
            out = os.path.join(sys.argv[2], "include", n[len(src):])
            os.makedirs(os.path.dirname(out), exist_ok=True)
            with z.open(n) as i, open(out, "wb") as o:
                o.write(i.read())
        elif n.endswith("licenses/LICENSE.txt"):
            with z.open(n) as i, open(os.path.join(sys.argv[2], "LICENSE.txt"), "wb") as o:
                o.write(i.read())
PY
echo "$VERSION" > "$DEST/VERSION"
echo "setup: CUTLASS $VERSION headers in $DEST (licence: $DEST/LICENSE.txt)"
