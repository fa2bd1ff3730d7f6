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
STAMP="$VERSION (licence 2)"  # what VERSION holds: a change of the licence text refetches
if [ -f "$DEST/include/flash_fwd_kernel_sm90.h" ] && [ "$(cat "$DEST/VERSION" 2>/dev/null)" = "$STAMP" ]; then
  echo "setup: FlashAttention-3 headers ($VERSION) present"; exit 0
fi
command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ] || {
  echo "setup: no nvcc, FlashAttention-3 not needed"; exit 0; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if ! curl -fsSL --retry 3 --connect-timeout 20 --max-time 600 -o "$tmp/src.tar.gz" "$URL" ||
   [ "$(sha256sum "$tmp/src.tar.gz" | cut -d' ' -f1)" != "$SHA256" ]; then
  echo "setup: could not download FlashAttention-3's headers ($VERSION); building without them"
  exit 0
fi
top=${VERSION}/third_party/flash-attention/hopper
tar -xzf "$tmp/src.tar.gz" -C "$tmp" --wildcards "$top/*.h" "$top/*.hpp" "${VERSION}/LICENSE"
rm -rf "$DEST" && mkdir -p "$DEST/include"
cp "$tmp/$top"/*.h "$tmp/$top"/*.hpp "$DEST/include/"
cp "$tmp/${VERSION}/LICENSE" "$DEST/LICENSE.xformers"
# FlashAttention's own licence, as its repository states it (the archive carries only xFormers').
cat > "$DEST/LICENSE" <<'LIC'
The headers in include/ are FlashAttention-3's (https://github.com/Dao-AILab/flash-attention,
hopper/), taken from xFormers' source release, which vendors that tree (its own licence:
LICENSE.xformers). FlashAttention's licence:

BSD 3-Clause License

Copyright (c) 2022, the respective contributors, as shown by the AUTHORS file.
All rights reserved.

Redistribution and use in source and binary forms, with or without
modification, are permitted provided that the following conditions are met:

* Redistributions of source code must retain the above copyright notice, this
  list of conditions and the following disclaimer.

* Redistributions in binary form must reproduce the above copyright notice,
  this list of conditions and the following disclaimer in the documentation
  and/or other materials provided with the distribution.

* Neither the name of the copyright holder nor the names of its
  contributors may be used to endorse or promote products derived from
  this software without specific prior written permission.

THIS SOFTWARE IS PROVIDED BY THE COPYRIGHT HOLDERS AND CONTRIBUTORS "AS IS"
AND ANY EXPRESS OR IMPLIED WARRANTIES, INCLUDING, BUT NOT LIMITED TO, THE
IMPLIED WARRANTIES OF MERCHANTABILITY AND FITNESS FOR A PARTICULAR PURPOSE ARE
DISCLAIMED. IN NO EVENT SHALL THE COPYRIGHT HOLDER OR CONTRIBUTORS BE LIABLE
FOR ANY DIRECT, INDIRECT, INCIDENTAL, SPECIAL, EXEMPLARY, OR CONSEQUENTIAL
DAMAGES (INCLUDING, BUT NOT LIMITED TO, PROCUREMENT OF SUBSTITUTE GOODS OR
SERVICES; LOSS OF USE, DATA, OR PROFITS; OR BUSINESS INTERRUPTION) HOWEVER
CAUSED AND ON ANY THEORY OF LIABILITY, WHETHER IN CONTRACT, STRICT LIABILITY,
OR TORT (INCLUDING NEGLIGENCE OR OTHERWISE) ARISING IN ANY WAY OUT OF THE USE
OF THIS SOFTWARE, EVEN IF ADVISED OF THE POSSIBILITY OF SUCH DAMAGE.
LIC
echo "$STAMP" > "$DEST/VERSION"
echo "setup: FlashAttention-3 headers ($VERSION) in $DEST"
