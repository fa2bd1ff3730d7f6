#!/usr/bin/env bash
# The Python package's build tools (python/, docs/PYTHON.md), for the tests' in-tree build: a
# virtual environment in third_party/python (git-ignored) made from Debian's python3 with its
# system packages visible (python3-numpy, python3-pil, python3-pytest from scripts/setup.sh), plus
# nanobind and scikit-build-core from PyPI (neither is packaged by Debian 12). CMake's
# ZIMAGE_PYTHON builds the module with this interpreter; `pip install .` does not need it (pip
# fetches the build tools itself). Idempotent: does nothing when the pinned versions are present.
# Without network the module is not built and its tests say so (ctest: skipped, with the reason).
set -euo pipefail
cd "$(dirname "$0")/.."
NANOBIND=2.9.2
SKBUILD=0.11.6
DEST=third_party/python
want="nanobind==$NANOBIND scikit-build-core==$SKBUILD"
if [ -x "$DEST/bin/python3" ] && [ "$(cat "$DEST/VERSIONS" 2>/dev/null)" = "$want" ]; then
  echo "setup: Python build tools present ($want)"; exit 0
fi
rm -rf "$DEST"
/usr/bin/python3 -m venv --system-site-packages "$DEST"
# shellcheck disable=SC2086
if ! "$DEST/bin/python3" -m pip install -q --disable-pip-version-check $want; then
  rm -rf "$DEST"
  echo "setup: could not install $want from PyPI; the Python module will not be built"
  exit 0
fi
echo "$want" > "$DEST/VERSIONS"
echo "setup: Python build tools in $DEST ($want)"
