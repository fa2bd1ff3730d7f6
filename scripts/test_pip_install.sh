#!/usr/bin/env bash
# The Python package as a user installs it: `pip install` of a fresh copy of the tracked files
# into a new virtual environment (Debian's python3; its numpy, Pillow and pytest visible, the
# build tools fetched by pip from PyPI), then the package tests against the installed module,
# with the program and golden cases of the CI build (build/ci). CPU only (CUDA is the release
# build's business), so it costs one CPU compile of the engine; it prints how long it took.
# Usage: scripts/test_pip_install.sh [BUILD_DIR]   (after scripts/test.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
build=$(realpath "${1:-build/ci}")
[ -x "$build/zimage" ] || { echo "test_pip_install: no $build/zimage (run scripts/test.sh first)"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
start=$(date +%s)
git ls-files -z | tar --null -T - -cf - | (mkdir "$tmp/src" && tar -xf - -C "$tmp/src")
/usr/bin/python3 -m venv --system-site-packages "$tmp/venv"
# `pip wheel` then `pip install` of that wheel: what `pip install .` does, with the wheel kept
# to report its size.
"$tmp/venv/bin/python" -m pip wheel -q --disable-pip-version-check --no-deps -w "$tmp/wheel" \
  --config-settings=cmake.define.ZIMAGE_CUDA=OFF "$tmp/src"
"$tmp/venv/bin/python" -m pip install -q --disable-pip-version-check "$tmp"/wheel/*.whl
built=$(date +%s)
echo "test_pip_install: pip wheel + install took $((built - start)) s; the wheel:"
(cd "$tmp/wheel" && ls -l ./*.whl && python3 -m zipfile -l ./*.whl)
cd "$tmp"  # not the source tree: `import zimage` must find the installed package
"$tmp/venv/bin/python" -c "import zimage, sys; print('installed', zimage.__version__, zimage.__file__)"
rc=0
ZIMAGE_TEST_CLI="$build/zimage" ZIMAGE_TEST_GOLDEN="$build/golden" ZIMAGE_TEST_LORA="$build/lora/lora_cases" \
  "$tmp/venv/bin/python" -m pytest -q -p no:cacheprovider -rs "$tmp/src/python/tests" || rc=$?
if [ "$rc" -eq 5 ]; then  # pytest: nothing collected
  echo "test_pip_install: SKIPPED: pytest collected no tests"; rc=0
fi
[ "$rc" -eq 0 ] || exit "$rc"
echo "test_pip_install: tests took $(( $(date +%s) - built )) s"
