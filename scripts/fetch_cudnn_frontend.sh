#!/usr/bin/env bash
# Fetches the headers of NVIDIA's cudnn-frontend (MIT licence, header-only C++ over cuDNN's graph
# API) into third_party/cudnn-frontend/ (git-ignored). zimage uses it for cuDNN's fused attention
# (scaled dot-product attention has no legacy cuDNN call; it exists only in the graph API). There is
# no Debian package, so the headers come from the pinned PyPI wheel. Without them (no network, no
# nvcc) the CUDA backend builds without cuDNN attention and uses its own flash kernel; CMake says so.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=1.32.0
DEST=third_party/cudnn-frontend
if [ -f "$DEST/include/cudnn_frontend.h" ] && [ "$(cat "$DEST/VERSION" 2>/dev/null)" = "$VERSION" ]; then
  echo "setup: cudnn-frontend $VERSION present"; exit 0
fi
command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ] || {
  echo "setup: no nvcc, cudnn-frontend not needed"; exit 0; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if ! python3 -m pip download -q --no-deps --only-binary=:all: --platform manylinux_2_28_x86_64 \
     --python-version 3.11 -d "$tmp" "nvidia-cudnn-frontend==$VERSION" >/dev/null 2>&1; then
  echo "setup: could not download cudnn-frontend $VERSION; building without cuDNN fused attention"
  exit 0
fi
rm -rf "$DEST" && mkdir -p "$DEST"
python3 - "$tmp" "$DEST" <<'PY'
import glob, sys, zipfile
whl = glob.glob(sys.argv[1] + "/*.whl")[0]
with zipfile.ZipFile(whl) as z:
    for n in z.namelist():
        if n.startswith("include/") or n.endswith("licenses/LICENSE.txt"):
            z.extract(n, sys.argv[2])
PY
mv "$DEST"/*.dist-info/licenses/LICENSE.txt "$DEST/LICENSE.txt" 2>/dev/null || true
rm -rf "$DEST"/*.dist-info
echo "$VERSION" > "$DEST/VERSION"
echo "setup: cudnn-frontend $VERSION headers in $DEST (licence: $DEST/LICENSE.txt)"
