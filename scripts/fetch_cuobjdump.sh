#!/usr/bin/env bash
# Fetches NVIDIA's cuobjdump and nvdisasm into third_party/cuobjdump/ (git-ignored): cuobjdump for
# the test that lists the GPU architectures embedded in the built program
# (tests/check_cuda_archs.sh), both for reading kernels' SASS (cuobjdump -sass runs nvdisasm from
# its own folder or PATH; tools/sass_diff.py compares two builds' kernels). The CUDA install
# here has nvcc but no cuobjdump, and Debian packages none for CUDA 13; the binary comes from the
# pinned PyPI wheel (nvidia-cuda-cuobjdump; 13.2 is the oldest CUDA 13 one and reads 13.0's
# binaries). Only with nvcc: a CPU-only build has nothing to list.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=13.2.51
STAMP="$VERSION (cuobjdump, nvdisasm)"  # what VERSION holds: an older fetch lacks nvdisasm
DEST=third_party/cuobjdump
if [ -x "$DEST/cuobjdump" ] && [ "$(cat "$DEST/VERSION" 2>/dev/null)" = "$STAMP" ]; then
  echo "setup: cuobjdump and nvdisasm $VERSION present"; exit 0
fi
command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ] || {
  echo "setup: no nvcc, cuobjdump not needed"; exit 0; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if ! python3 -m pip download -q --no-deps --only-binary=:all: -d "$tmp" \
     "nvidia-cuda-cuobjdump==$VERSION" "nvidia-cuda-nvdisasm==$VERSION" >/dev/null 2>&1; then
  echo "setup: could not download cuobjdump and nvdisasm $VERSION;" \
       "the architecture and SASS checks will be skipped"
  exit 0
fi
rm -rf "$DEST" && mkdir -p "$DEST"
python3 - "$tmp" "$DEST" <<'PY'
import glob, os, shutil, sys, zipfile
for tool in ("cuobjdump", "nvdisasm"):
    whl = glob.glob(sys.argv[1] + "/nvidia_cuda_" + tool + "-*.whl")[0]
    with zipfile.ZipFile(whl) as z:
        with z.open("nvidia/cu13/bin/" + tool) as src, open(sys.argv[2] + "/" + tool, "wb") as dst:
            shutil.copyfileobj(src, dst)
        lic = [n for n in z.namelist() if n.endswith("License.txt")]
        if lic:  # the same NVIDIA licence in both wheels
            with z.open(lic[0]) as src, open(sys.argv[2] + "/License.txt", "wb") as dst:
                shutil.copyfileobj(src, dst)
    os.chmod(sys.argv[2] + "/" + tool, 0o755)
PY
echo "$STAMP" > "$DEST/VERSION"
echo "setup: cuobjdump and nvdisasm $VERSION in $DEST (licence: $DEST/License.txt)"
