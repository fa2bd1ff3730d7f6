#!/usr/bin/env bash
# Lays out .comfy/ (git-ignored) for tools/comfyui_gpu_check.py, on a machine with PyPI, for a GPU
# machine without network (carry .comfy there):
#   tools/comfyui_prepare.sh PATH_TO_COMFYUI_CHECKOUT
# The checkout must be at the commit tools/comfyui_gpu_check.py pins (COMFYUI_COMMIT). What it
# copies: ComfyUI without its tests, CI files, script examples and the tokenizers Z-Image does not
# use; the wheels ComfyUI needs at start-up that the GPU machine's image lacks (for CPython 3.12);
# a stand-in for PyAV (comfy_api imports `av` at start-up, no video node runs) and an empty front
# end (only the HTTP API is used), both from tools/comfyui_workflows/stubs.
set -euo pipefail
cd "$(dirname "$0")/.."
src=${1:?usage: tools/comfyui_prepare.sh PATH_TO_COMFYUI_CHECKOUT}
rm -rf .comfy && mkdir -p .comfy/whl
cp -a "$src" .comfy/ComfyUI
(cd .comfy/ComfyUI && rm -rf .git .github tests tests-unit script_examples comfy/sd1_tokenizer \
  comfy/text_encoders/t5_tokenizer comfy/text_encoders/t5_pile_tokenizer \
  comfy/text_encoders/hydit_clip_tokenizer comfy/text_encoders/ace_lyrics_tokenizer)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .comfy/whl torchsde==0.2.6 trampoline==0.1.2 pydantic==2.11.7 pydantic-core==2.33.2 \
  annotated-types==0.7.0 typing-inspection==0.4.1 pydantic-settings==2.10.1 python-dotenv==1.1.1 \
  spandrel==0.4.1
cp -r tools/comfyui_workflows/stubs/av_stub tools/comfyui_workflows/stubs/frontend .comfy/
du -sh .comfy
