#!/usr/bin/env bash
# Fetches the C++/CUDA headers of FlashInfer (Apache-2.0; its Hopper attention kernels descend
# from FlashAttention-3, BSD-3-Clause) into third_party/flashinfer/ (git-ignored). zimage uses
# its Hopper prefill kernel (warp-specialised, TMA loads, wgmma, softmax overlapped with the two
# GEMMs) for the DiT's and the text encoder's attention on sm_90a, where it is faster than
# cuDNN's fused attention at Z-Image's shapes (docs/BENCHMARKS.md). There is no Debian package;
# the headers come from the pinned PyPI wheel (flashinfer-python ships them under
# flashinfer/data/include for its own JIT). Without them (no network, no nvcc) the CUDA backend
# builds without that kernel and uses cuDNN's fused attention; CMake says so. Pinned to 0.6.4:
# its kernels are written against CUTLASS 4.2, the version scripts/fetch_cutlass.sh pins, and later
# releases need a CUDA 13.1 libcu++ (cuda::fast_mod_div) that CUDA 13.0 lacks.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=0.6.4
DEST=third_party/flashinfer
if [ -f "$DEST/include/flashinfer/attention/hopper/prefill_sm90.cuh" ] &&
   [ "$(cat "$DEST/VERSION" 2>/dev/null)" = "$VERSION" ]; then
  echo "setup: FlashInfer $VERSION headers present"; exit 0
fi
command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ] || {
  echo "setup: no nvcc, FlashInfer not needed"; exit 0; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if ! python3 -m pip download -q --no-deps --only-binary=:all: -d "$tmp" \
     "flashinfer-python==$VERSION" >/dev/null 2>&1; then
  echo "setup: could not download FlashInfer $VERSION; building without its Hopper attention"
  exit 0
fi
rm -rf "$DEST" && mkdir -p "$DEST/include"
python3 - "$tmp" "$DEST" <<'PY'
import glob, os, sys, zipfile
whl = glob.glob(sys.argv[1] + "/*.whl")[0]
src = "flashinfer/data/include/"
with zipfile.ZipFile(whl) as z:
    for n in z.namelist():
        if n.startswith(src + "flashinfer/") and not n.endswith("/"):
            out = os.path.join(sys.argv[2], "include", n[len(src):])
            os.makedirs(os.path.dirname(out), exist_ok=True)
            with z.open(n) as i, open(out, "wb") as o:
                o.write(i.read())
        elif n.endswith(".dist-info/licenses/LICENSE"):
            with z.open(n) as i, open(os.path.join(sys.argv[2], "LICENSE"), "wb") as o:
                o.write(i.read())
PY
echo "$VERSION" > "$DEST/VERSION"
echo "setup: FlashInfer $VERSION headers in $DEST"
