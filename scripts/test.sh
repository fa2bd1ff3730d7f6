#!/usr/bin/env bash
# Builds zimage with warnings as errors and runs the whole CPU test suite.
# GPU tests carry the label "gpu": they are built when nvcc is present and run with
# `ctest --preset gpu` on a machine with a GPU; here they are skipped with a message.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cmake --preset ci
cmake --build --preset ci -j "$(nproc)"
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  echo "test: a GPU is present; run 'ctest --preset gpu' for the GPU tests"
else
  echo "test: SKIPPING GPU tests (label 'gpu'): no CUDA device on this machine"
fi
ctest --preset ci -j "$(nproc)"
# The Python package as a user installs it: pip builds a fresh copy (CPU only) into a new virtual
# environment and the package tests run against it (~5 min on 2 cores: one engine compile).
if [ -x third_party/python/bin/python3 ]; then
  scripts/test_pip_install.sh build/ci
else
  echo "test: SKIPPING the pip install test: no PyPI at set-up (scripts/setup_python.sh)"
fi
