#!/usr/bin/env bash
# Installs every Debian package zimage needs to build and test (idempotent; needs root or sudo).
set -euo pipefail
PKGS=(build-essential cmake ninja-build pkg-config git
      nlohmann-json3-dev libpng-dev zlib1g-dev libpcre2-dev libutf8proc-dev libopenblas-dev
      libcli11-dev libgtest-dev libgmock-dev libbenchmark-dev
      # zimage serve: the HTTP transport (Boost.Beast/Asio, header-only), JPEG and WebP output;
      # cpp-httplib (built with OpenSSL/zlib/brotli) is the tests' HTTP client
      libboost-dev libcpp-httplib-dev libssl-dev libbrotli-dev libturbojpeg0-dev libwebp-dev
      # its web-page test: real headless Chromium driven by selenium
      python3 chromium chromium-driver python3-selenium
      # zimage worker / submit (Redis Streams broker): the hiredis client, and redis-server for tests
      libhiredis-dev redis-server
      # the Python package (python/): headers, venv, and what its tests import
      python3-dev python3-venv python3-numpy python3-pil python3-pytest)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi
echo "setup: all build dependencies present"
scripts/fetch_cudnn_frontend.sh
scripts/fetch_cutlass.sh
scripts/fetch_flashinfer.sh
scripts/fetch_flash3.sh
scripts/fetch_cuobjdump.sh
scripts/setup_python.sh
