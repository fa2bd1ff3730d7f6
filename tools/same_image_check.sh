#!/usr/bin/env bash
# The same seed and prompt through every way a process can hold the weights (issue 24: "images are
# unchanged"): the bf16 rows must give one image (streamed weights equal resident ones bit for
# bit, empty caches change nothing), the two FP8 budgets another. Prints each PNG's md5.
#   BIN=build/ci/zimage ZR=<full-size model folder> PROMPT="..." tools/same_image_check.sh
# (scripts/gpu_run.sh exec sets the three: EXEC_CMD="bash tools/same_image_check.sh").
set -u
D=$(mktemp -d)
i=0
for a in "" "--vram-budget 12" "--vram-budget 8" "--vram-budget 4" "--vram-budget 4 --streamed-weights copy" \
         "--weights fp8 --vram-budget 8" "--weights fp8 --vram-budget 4"; do
  i=$((i+1))
  $BIN generate --model $ZR --prompt "$PROMPT" --seed 42 --width 1024 --height 1024 --steps 8 --quiet --output $D/$i.png $a \
    && echo "$(md5sum < $D/$i.png | cut -c1-32)  ${a:-resident}"
done
XDG_CACHE_HOME=$(mktemp -d) CUDA_CACHE_PATH=$(mktemp -d) $BIN generate --model $ZR --prompt "$PROMPT" --seed 42 --width 1024 --height 1024 --steps 8 --quiet --output $D/e.png \
  && echo "$(md5sum < $D/e.png | cut -c1-32)  resident, empty caches"
