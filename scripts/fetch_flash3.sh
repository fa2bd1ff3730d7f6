#!/usr/bin/env bash
# Fetches the headers of FlashAttention-3's Hopper forward kernel (Dao-AILab/flash-attention,
# hopper/; BSD-3-Clause, copyright Tri Dao and the authors named in each file) into
# third_party/flash3/ (git-ignored). zimage uses that kernel for the DiT's attention on sm_90a
# (src/backend/cuda/libs/attention_flash3.h). There is no Debian package, and the project's own
# PyPI release (flash-attn) ships only the Python side of hopper/; xFormers' source release on
# PyPI (BSD-3-Clause) carries the whole flash-attention tree it builds FA3 from, so the headers
# come from that archive, pinned by version and SHA-256. Without them (no network, no nvcc) the
# CUDA backend builds without that kernel and uses FlashInfer's; CMake says so.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=xformers-0.0.33
URL=https://files.pythonhosted.org/packages/e1/25/711c9bc1814adbafbb0c1e300a474303fb0c1edb931a18b20a8b448fe443/xformers-0.0.33.tar.gz
SHA256=6e524e0c3fe9d573631060d7cbb31906cb5b030802b1d414906619b5eb67f34c
DEST=third_party/flash3
if [ -f "$DEST/include/flash_fwd_kernel_sm90.h" ] && [ "$(cat "$DEST/VERSION" 2>/dev/null)" = "$VERSION" ]; then
  echo "setup: FlashAttention-3 headers ($VERSION) present"; exit 0
fi
command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ] || {
  echo "setup: no nvcc, FlashAttention-3 not needed"; exit 0; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if ! curl -fsSL --retry 3 -o "$tmp/src.tar.gz" "$URL" ||
   [ "$(sha256sum "$tmp/src.tar.gz" | cut -d' ' -f1)" != "$SHA256" ]; then
  echo "setup: could not download FlashAttention-3's headers ($VERSION); building without them"
  exit 0
fi
top=${VERSION}/third_party/flash-attention/hopper
tar -xzf "$tmp/src.tar.gz" -C "$tmp" --wildcards "$top/*.h" "$top/*.hpp" "${VERSION}/LICENSE"
rm -rf "$DEST" && mkdir -p "$DEST/include"
cp "$tmp/$top"/*.h "$tmp/$top"/*.hpp "$DEST/include/"
cp "$tmp/${VERSION}/LICENSE" "$DEST/LICENSE.xformers"
cat > "$DEST/LICENSE" <<'LIC'
FlashAttention-3 (https://github.com/Dao-AILab/flash-attention, hopper/) is distributed under the
BSD 3-Clause License, Copyright (c) 2022, the respective contributors, as shown by its AUTHORS
file; each header names its authors. These headers were taken from xFormers' source release
(LICENSE.xformers, also BSD 3-Clause), which vendors that tree.
LIC
echo "$VERSION" > "$DEST/VERSION"
echo "setup: FlashAttention-3 headers ($VERSION) in $DEST"
