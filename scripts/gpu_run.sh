#!/usr/bin/env bash
# Everything zimage does on a GPU machine, in stages (each appends its log under $OUT):
#   unpack    unpack what scripts/stage_gpu_carry.sh packed here (binaries + libraries), the
#             golden cases and the tiny model where the binaries expect them
#   build     or: configure (preset gpu: sm_90a) and build there (needs the project's -dev packages)
#   test      GPU tests: every CUDA op against the CPU op, golden cases on the GPU (fp32, bf16)
#   model     write the full-size random-weight model folder (once) to $ZR
#   bench     zimage bench on that folder (+ ablation rows) -> $OUT/zimage_bench.{json,md}
#   parity    zimage generate (seeded, 1024², 8 steps) with the step-0 DiT output dumped
#   diffusers upstream diffusers on the same folder, same GPU (carried wheel in .whl/)
#   compare   cosine / PSNR of zimage vs diffusers -> $OUT/parity.json
#   pymodule  the Python module linked here for this machine's python3 (scripts/gpu_pymodule) ->
#             ${PYMOD:-/tmp/zimage-py}/zimage
#   ditbench  diffusers' DiT forward alone, eager and torch.compile, at ${DIT_SIZES:-1024,1536,2048}
#             (tools/diffusers_dit_bench.py) -> $OUT/diffusers_dit.json
#   table     issue 22's table in one run: diffusers' DiT eager and torch.compile at
#             ${TABLE_SIZES:-1024,1536,2048} (skipped where $OUT/diffusers_dit.json exists), then
#             zimage bench ${TABLE_RUNS:-2} times: bf16 at those sizes (DiT, VAE, image), FP8
#             (all,sdpa) at ${TABLE_FP8_SIZES:-1024,2048}; once 4 images at the first size ->
#             $OUT/table/*.{json,log}, tools/same_run_table.py -> $OUT/issue22_table.{md,json}.
#             TABLE_DEVICE=cpu with a tiny model and small sizes: a smoke of the stage itself
#   parity8, compare8   the same with --precision fp8 -> $OUT/parity_fp8.json
#   lorabench per-request LoRA: merge/unmerge vs side GEMM on the full-size model -> $OUT/lora_bench.*
#   variants  zimage bench under each opt-in setting (VARIANTS) against the defaults -> $OUT/variants.md
#   ncu       hardware counters of the w1|w3 GEMM at M 4160: cuBLASLt, CUTLASS with its own
#             epilogue, CUTLASS with SwiGLU in ours -> $OUT/ncu_{cublaslt,cutlass,fused}.txt
#   probe     host memory costs: page-locking, registering file mappings, H2D rates, CUDA start-up
#             (tools/host_transfer_probe.cpp) -> $OUT/probe.{json,txt}
#   startup   whole generate processes with a per-phase breakdown (tools/startup_bench.py):
#             STARTUP_ROWS (warm,empty,budget12,...,files4,...,cold,single_fp8)
#             -> $OUT/startup.{json,md}
#   warmup    a new process's first image with the plan cache empty, then filled -> $OUT/warmup.txt
#   warmvariants  new processes (plan cache filled) under each of WARM_VARIANTS (';'-separated
#             "VAR=value ..." settings, default the warm-up levels 1, 0, 2 twice), with the
#             phases and the debug lines that explain them -> $OUT/warm_variants.txt
#   exec      EXEC_CMD run with this script's environment (the CUDA library path, $BIN, $ZR)
#   fp8q      --precision fp8 quality and speed per group of DiT linears against bf16, on $ZR and
#             on a folder with outlier channels ($ZRO) -> $OUT/fp8_quality{,_outliers}.{json,md}
#   serve     zimage serve on that folder with --batching on, then off: tools/serve_bench.py
#             (1/4/16 clients, 512² and 1024²) -> $OUT/serve_bench.jsonl, and the batched
#             images against the one-by-one images (max pixel difference) -> $OUT/serve_diff.txt
#   formats   the full-size random folder converted (zimage convert) to a bf16 single-file DiT,
#             ComfyUI scaled FP8 (DiT + text encoder), GGUF Q8_0 and Q4_K DiTs, one at a time in
#             $ZF (deleted after its rows: the disk holds 64 GiB); for each and the folder: load
#             time, s / image at 1024² 8 steps (median of 3) and driver-side peak GPU memory
#             (zimage bench --vram-budget 0) -> $OUT/formats.json, $OUT/formats.md, conversion
#             times -> $OUT/formats_convert.txt
#   pipelines img2img, inpainting and ControlNet (issue 13) against diffusers, same GPU, same files:
#             writes the full-size random model ($ZR, once) and a full-size random 2.1 ControlNet
#             ($ZC, once, 6.7 GB), runs zimage bench --pipeline (t2i, img2img, inpaint,
#             controlnet, controlnet-inpaint; 1024², 8 steps, strength 0.6, median of
#             ${PIPE_ITERS:-3}) writing its inputs to $OUT/pipe_inputs, then
#             tools/diffusers_pipelines_bench.py on the same folders and inputs (carried wheel in
#             .whl/) -> $OUT/pipelines.json, $OUT/pipelines.md (side by side; the raw rows in
#             $OUT/pipelines_zimage.{json,md}, $OUT/pipelines_diffusers.{json,log})
# Usage: scripts/gpu_run.sh STAGE [STAGE ...]   (e.g. build test, or model bench parity diffusers compare)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-/tmp/zimage-out}
ZR=${ZR:-/tmp/zimage-random-turbo}
ZF=${ZF:-/tmp/zimage-formats}
ZC=${ZC:-/tmp/zimage-random-controlnet}
# The build folder the carried binaries were configured in (PRESET of stage_gpu_carry.sh).
BUILD_DIR=build/${PRESET:-gpu}
BIN=$BUILD_DIR/zimage
TESTS=$BUILD_DIR/tests/zimage_gpu_tests
# CUDA libraries: the toolkit's, or the ones PyTorch's wheels bring.
LIBS=/usr/local/cuda/lib64
for m in cudnn cublas cuda_runtime nccl; do
  d=$(python3 -c "import nvidia.$m as x; print(list(x.__path__)[0])" 2>/dev/null) && LIBS=$LIBS:$d/lib
done
export LD_LIBRARY_PATH=$PWD/build/carry/lib:$LIBS:${LD_LIBRARY_PATH:-}
PROMPT="A snow fairy with long silver hair in a blue dress standing in a snowy forest, anime style, soft lighting, intricate details, masterpiece"
mkdir -p "$OUT"
rc=0
# Writes the full-size random folder $1 (extra make-random-model flags after it) unless a finished
# write is marked ($1.complete: model_index.json comes first, so an interrupted write has one).
random_model() {
  local dir=$1; shift
  [ -f "$dir.complete" ] && return 0
  rm -rf "$dir"
  "$BIN" make-random-model --out "$dir" "$@" 2>&1 | tail -3
  [ "${PIPESTATUS[0]}" -eq 0 ] && touch "$dir.complete"
}
for stage in "$@"; do
  t0=$(date +%s)
  case "$stage" in
    unpack)
      # The binaries were configured in /work/main: make that path lead here.
      [ "$PWD" = /work/main ] || { mkdir -p /work && ln -sfn "$PWD" /work/main; }
      python3 -c "
import glob, lzma, shutil
for f in glob.glob('build/carry/*.xz') + glob.glob('build/carry/lib/*.xz') + glob.glob('build/carry/static/*.xz'):
    with lzma.open(f) as i, open(f[:-3], 'wb') as o: shutil.copyfileobj(i, o)"
      mkdir -p "$BUILD_DIR/tests"
      # Whichever programs were staged (stage_gpu_carry.sh CARRY_BINS).
      [ -f build/carry/zimage ] && cp build/carry/zimage "$BIN" && chmod +x "$BIN"
      [ -f build/carry/zimage_gpu_tests ] && cp build/carry/zimage_gpu_tests "$TESTS" && chmod +x "$TESTS"
      [ -f build/carry/zimage ] || [ -f build/carry/zimage_gpu_tests ] || {
        echo "unpack: no program in build/carry (scripts/stage_gpu_carry.sh)"; rc=1; }
      cmake -DSRC="$PWD" -DDST="$PWD/$BUILD_DIR/golden" -P cmake/unpack_goldens.cmake
      cmake -DSRC="$PWD" -DDST="$PWD/$BUILD_DIR/tiny-model" -P cmake/unpack_tiny_model.cmake
      mkdir -p "$BUILD_DIR/gguf" && tar xzf tests/data/gguf/gguf_cases.tar.gz -C "$BUILD_DIR/gguf"
      mkdir -p "$BUILD_DIR/lora" && tar xzf tests/data/lora/lora_cases.tar.gz -C "$BUILD_DIR/lora"
      [ -f "$BIN" ] && ldd "$BIN" | grep -E "not found|cudnn|cublas" ;;
    build)
      { cmake --preset gpu && cmake --build --preset gpu -j "$(nproc)" --target zimage zimage_gpu_tests; } \
        > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; rc=1; break; } ;;
    test)
      "$TESTS" --gtest_brief=${GTEST_BRIEF:-1} ${GTEST_FILTER:+--gtest_filter=$GTEST_FILTER} 2>&1 | tee "$OUT/gpu_tests.log" | grep -vE '^\[ +(OK|RUN) ' | tail -60
      [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1 ;;
    model)
      random_model "$ZR" ;;
    bench)
      "$BIN" bench --model "$ZR" ${BENCH_ARGS:---ablation} --json "$OUT/zimage_bench.json" 2>&1 | tee "$OUT/zimage_bench.md" || rc=1 ;;
    parity)
      rm -rf /tmp/zdump
      "$BIN" generate --model "$ZR" --device cuda --prompt "$PROMPT" --seed 42 --width 1024 --height 1024 \
        --steps 8 --guidance 0 --dump /tmp/zdump --dump-filter dit_out.step0 --output "$OUT/zimage_1024.png" \
        --verbose 2>&1 | tail -20 || rc=1
      # The shipped path: no dumps, so the DiT forward is recorded once and replayed (CUDA graph).
      "$BIN" generate --model "$ZR" --device cuda --prompt "$PROMPT" --seed 42 --width 1024 --height 1024 \
        --steps 8 --guidance 0 --output "$OUT/zimage_1024_graph.png" 2>&1 | tail -2 || rc=1 ;;
    parity8)
      rm -rf /tmp/zdump8
      "$BIN" generate --model "$ZR" --device cuda --precision fp8 --prompt "$PROMPT" --seed 42 \
        --width 1024 --height 1024 --steps 8 --guidance 0 --dump /tmp/zdump8 \
        --dump-filter dit_out.step0 --output "$OUT/zimage_1024_fp8.png" --verbose 2>&1 | tail -20 || rc=1 ;;
    compare8)
      python3 tools/compare_outputs.py --zimage-dit /tmp/zdump8/dit_out.step0.npy \
        --diffusers-dit "$OUT/diffusers_dit_out_step0.npy" --zimage-png "$OUT/zimage_1024_fp8.png" \
        --diffusers-image "$OUT/diffusers_image.npy" --json "$OUT/parity_fp8.json" || rc=1 ;;
    diffusers)
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
      PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 python3 tools/diffusers_compare.py --model "$ZR" --out "$OUT" \
        ${DIFFUSERS_ARGS:-} 2>&1 | grep -v Warning | tail -60 || rc=1 ;;
    pymodule)
      # The Python module for this machine's python3 (scripts/gpu_pymodule/CMakeLists.txt), with
      # the carried nanobind wheel, into $PYMOD/zimage with the package's .py files.
      PYMOD=${PYMOD:-/tmp/zimage-py}
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
      extra=""
      for m in cudnn cublas cuda_runtime nccl; do
        d=$(python3 -c "import nvidia.$m as x; print(list(x.__path__)[0])" 2>/dev/null) || continue
        extra="$extra;$(ls "$d"/lib/lib*.so* | tr '\n' ';')"
      done
      extra="$extra;$(ls /usr/local/cuda/lib64/libcudart.so /usr/local/cuda/lib64/libcublas.so /usr/local/cuda/lib64/libcublasLt.so /usr/local/cuda/lib64/libculibos.a 2>/dev/null | tr '\n' ';')"
      { PYTHONPATH=/tmp/site cmake -S scripts/gpu_pymodule -B /tmp/zimage-pybuild -G Ninja -DCMAKE_BUILD_TYPE=Release \
          -DPython_EXECUTABLE="$(command -v python3)" -DEXTRA_LIBS="$extra" &&
        PYTHONPATH=/tmp/site cmake --build /tmp/zimage-pybuild -j; } > "$OUT/pymodule.log" 2>&1 || { tail -30 "$OUT/pymodule.log"; rc=1; }
      mkdir -p "$PYMOD/zimage" && cp python/zimage/*.py "$PYMOD/zimage/" && cp /tmp/zimage-pybuild/_zimage*.so "$PYMOD/zimage/" &&
        PYTHONPATH=$PYMOD python3 -c "import zimage; print('zimage module', zimage.__file__, zimage._zimage.cuda_device_count(), 'GPU')" || rc=1 ;;
    ditbench)
      # Issue 22's reference column: diffusers' DiT forward, eager and torch.compile (one
      # specialised graph per size), on the same folder -> $OUT/diffusers_dit.json
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
      PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 python3 tools/diffusers_dit_bench.py --model "$ZR" \
        --sizes ${DIT_SIZES:-1024,1536,2048} --json "$OUT/diffusers_dit.json" 2>&1 | grep -v Warning | tail -20 || rc=1 ;;
    table)
      random_model "$ZR"
      TABLE_SIZES=${TABLE_SIZES:-1024,1536,2048}
      mkdir -p "$OUT/table"
      if [ ! -f "$OUT/diffusers_dit.json" ]; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
        PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 python3 tools/diffusers_dit_bench.py --model "$ZR" \
          --sizes "$TABLE_SIZES" --json "$OUT/diffusers_dit.json" 2>&1 | grep -v Warning | tail -8 || rc=1
      fi
      # One zimage bench run: its JSON and log under $OUT/table, its timing lines on the terminal.
      zrow() {
        local name=$1; shift
        "$BIN" bench --model "$ZR" --device "${TABLE_DEVICE:-cuda}" "$@" --json "$OUT/table/$name.json" \
          > "$OUT/table/$name.log" 2>&1 ||
          { tail -5 "$OUT/table/$name.log"; rc=1; }
        grep -E '^bench: (DiT|VAE decode [0-9]+ [0-9.]+ ms|pipeline)' "$OUT/table/$name.log" | sed "s/^/$name: /"
      }
      for i in $(seq "${TABLE_RUNS:-2}"); do
        zrow "bf16_$i" --iters 5 --batch 1 --sizes "$TABLE_SIZES"
        zrow "fp8_$i" --iters 5 --batch 1 --sizes "${TABLE_FP8_SIZES:-1024,2048}" --fp8-layers all,sdpa
      done
      zrow batch4 --iters 3 --batch 4 --sizes "${TABLE_SIZES%%,*}"
      python3 tools/same_run_table.py --diffusers "$OUT/diffusers_dit.json" --zimage "$OUT"/table/*.json \
        --md "$OUT/issue22_table.md" --json "$OUT/issue22_table.json" && cat "$OUT/issue22_table.md" || rc=1 ;;
    variants)
      # zimage bench (DiT forward 1024² and 2048², VAE decode, image) under each opt-in setting
      # against the defaults, first and last, same machine -> $OUT/variants.md (all of it) and a
      # line per setting on the terminal. VARIANTS: "name:VAR=value ..." items, ';'-separated.
      : > "$OUT/variants.md"
      IFS=';' read -ra vs <<< "${VARIANTS:-base:;walk:ZIMAGE_ROW_KERNELS=0,0,2;rows222:ZIMAGE_ROW_KERNELS=2,2,2;rows442:ZIMAGE_ROW_KERNELS=4,4,2;adaln:ZIMAGE_FUSED_ADALN=1;autotune:ZIMAGE_GEMM_AUTOTUNE=1;base2:}"
      for v in "${vs[@]}"; do
        name=${v%%:*}; envs=${v#*:}
        echo "### $name ($envs)" >> "$OUT/variants.md"
        env $envs "$BIN" bench --model "$ZR" ${VARIANT_ARGS:---iters 5 --sizes 1024,2048 --batch 1} \
          >> "$OUT/variants.md" 2>&1 || rc=1
        echo "$name ($envs): $(sed -n '/^### '"$name"' /,$p' "$OUT/variants.md" |
          grep -E '^bench: (DiT|VAE decode|pipeline)' | tr '\n' ' ')"
      done ;;
    ncu)
      # Hardware counters (ncu, clocks left alone) of the feed-forward's w1|w3 GEMM at M 4160, one
      # launch each: cuBLASLt's kernel, CUTLASS's with its own TMA epilogue, and ours with SwiGLU
      # in the epilogue (CudaOpsPerf.MatmulSwiglu launches all three) -> $OUT/ncu_*.txt
      n="ncu --clock-control none --kernel-name-base demangled --section SpeedOfLight --section Occupancy"
      n="$n --section LaunchStats --section WarpStateStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis"
      for k in cublaslt:'nvjet|xmma|sm90_gemm' cutlass:'CollectiveEpilogue' fused:'SwigluEpilogue'; do
        timeout 200 $n -k regex:"${k#*:}" --launch-skip 2 --launch-count 1 "$TESTS" \
          --gtest_filter=CudaOpsPerf.MatmulSwiglu > "$OUT/ncu_${k%%:*}.txt" 2>&1 || rc=1
        grep -E "Duration|SM Frequency|Compute \(SM\) Throughput|Memory Throughput|L2 Cache Throughput|Registers Per|Achieved Occupancy|Grid Size|Block Size|Dynamic Shared" \
          "$OUT/ncu_${k%%:*}.txt" | sed "s/^/${k%%:*}: /"
      done ;;
    probe)
      # Host memory and transfer costs on this machine (tools/host_transfer_probe.cpp, carried
      # built as build/carry/host_transfer_probe) on the DiT's largest file -> $OUT/probe.json
      f=$(ls -S "$ZR"/transformer/*.safetensors | head -1)
      cat "$f" > /dev/null
      build/carry/host_transfer_probe "$f" ${PROBE_GIB:-4} > "$OUT/probe.json" 2> "$OUT/probe.txt" || rc=1
      cat "$OUT/probe.txt"; df -T /tmp | tee -a "$OUT/probe.txt"; nproc | tee -a "$OUT/probe.txt"
      grep -E "MemTotal|MemAvailable" /proc/meminfo | tee -a "$OUT/probe.txt" ;;
    startup)
      # Whole `zimage generate` processes, per-phase (tools/startup_bench.py): warm and empty
      # caches, the budgets, a cold page cache -> $OUT/startup.{json,md}; with the ComfyUI scaled
      # FP8 files converted first when STARTUP_ROWS names single_fp8.
      rows=${STARTUP_ROWS:-warm,empty,budget12,budget8,budget4,reg12,reg8,reg4,files12,files8,files4,fp8b8,fp8b4,cold}
      extra=()
      if [[ ",$rows," == *",single_fp8,"* ]]; then
        mkdir -p "$ZF"
        for c in transformer text_encoder; do
          [ -f "$ZF/.fp8_$c" ] || { "$BIN" convert --model "$ZR" --format fp8 --component $c \
            --out "$ZF" --quiet && touch "$ZF/.fp8_$c"; }
        done
        extra=(--dit "$ZF/z_image_turbo_fp8_scaled.safetensors" \
               --text-encoder "$ZF/qwen_3_4b_fp8_scaled.safetensors")
      fi
      # A build before the change, carried xz-compressed as build/carry/zimage_before.xz
      # (BEFORE_BIN=... scripts/stage_gpu_carry.sh), runs the same rows first.
      if [ -f build/carry/zimage_before.xz ]; then
        xz -dc build/carry/zimage_before.xz > /tmp/zimage_before && chmod +x /tmp/zimage_before
        # That build has no --streamed-weights nor ZIMAGE_HOST_PIN: those rows are the new
        # build's only.
        before_rows=$(echo "$rows" | tr ',' '\n' | grep -v '^files\|^reg\|^locked\|^uplocked' | paste -sd, -)
        python3 tools/startup_bench.py --bin /tmp/zimage_before --model "$ZR" --out "$OUT" \
          --rows "$before_rows" --iters ${STARTUP_ITERS:-3} --tag startup_before "${extra[@]}" || rc=1
      fi
      python3 tools/startup_bench.py --bin "$BIN" --model "$ZR" --out "$OUT" --rows "$rows" \
        --iters ${STARTUP_ITERS:-3} "${extra[@]}" || rc=1
      # Every process's log in one file: a call brings back at most 8 files.
      ( cd "$OUT" && ls startup*_*.log > /dev/null 2>&1 && tar czf startup_logs.tgz startup*_*.log && \
        rm -f startup*_*.log ) ;;
    warmvariants)
      export XDG_CACHE_HOME=/tmp/zimage-xdg-warmup
      "$BIN" generate --model "$ZR" --device cuda --prompt "$PROMPT" --seed 42 --output /tmp/wv.png -q  # the plan cache
      IFS=';' read -ra wvs <<< "${WARM_VARIANTS:-ZIMAGE_WARM_UP=1;ZIMAGE_WARM_UP=0;ZIMAGE_WARM_UP=2;ZIMAGE_WARM_UP=1;ZIMAGE_WARM_UP=0;ZIMAGE_WARM_UP=2}"
      for v in "${wvs[@]}"; do
        s=$(date +%s.%N)
        env $v ZIMAGE_LOG=debug "$BIN" generate --model "$ZR" --device cuda --prompt "$PROMPT" --seed 42 \
          --width 1024 --height 1024 --steps 8 --output /tmp/wv.png --verbose > /tmp/wv.txt 2>&1 || rc=1
        echo "=== $v: process $(python3 -c "print(round($(date +%s.%N) - $s, 3))") s"
        grep -E "backend start|ready in|memory plan made|loaded in [0-9.]+ s|warm-up|loaded /|first call|first execute|written|^(text encoder|  step 0 |  step 1 |vae decode|total)" /tmp/wv.txt
      done | tee "$OUT/warm_variants.txt"
      rm -f /tmp/wv.png
      unset XDG_CACHE_HOME ;;
    exec)
      BIN="$BIN" ZR="$ZR" OUT="$OUT" PROMPT="$PROMPT" bash -c "${EXEC_CMD:?EXEC_CMD: the command to run}" || rc=1 ;;
    warmup)
      # A new process's first image, plan cache empty then filled by the first run (the CUDA
      # kernel cache warm for both, as for a user's second start): whole-process wall time and
      # the per-phase times.
      export XDG_CACHE_HOME=/tmp/zimage-xdg-warmup
      rm -rf "$XDG_CACHE_HOME"
      for run in empty filled filled; do
        s=$(date +%s.%N)
        "$BIN" generate --model "$ZR" --device cuda --prompt "$PROMPT" --seed 42 --width 1024 \
          --height 1024 --steps 8 --output "$OUT/warmup_$run.png" --verbose 2>&1 \
          | grep -E "^(text encoder|  step 0 |  step 1 |vae decode|total)" | tr '\n' ' '
        echo "| plan cache $run: process $(python3 -c "print(round($(date +%s.%N) - $s, 2))") s"
      done | tee "$OUT/warmup.txt"
      # Once more with debug lines: each convolution plan's load and first launch, the decode's
      # queued / device-done split (where the first decode's extra time goes).
      ZIMAGE_LOG=debug "$BIN" generate --model "$ZR" --device cuda --prompt "$PROMPT" --seed 42 \
        --width 1024 --height 1024 --steps 8 --output "$OUT/warmup_debug.png" --verbose 2>&1 |
        grep -E "^\[zimage (info|debug)|^(text encoder|  step [01] |vae decode|total)" > "$OUT/warmup_debug.txt"
      tail -5 "$OUT/warmup_debug.txt"
      unset XDG_CACHE_HOME ;;
    lorabench)
      # Per-request LoRA on the full-size model: merge/unmerge against the side GEMM (rank 32,
      # every attention and feed-forward linear), switch cost and s/image -> $OUT/lora_bench.*
      [ -f /tmp/zimage-lora-r32.safetensors ] || "$BIN" make-random-lora --out /tmp/zimage-lora-r32.safetensors \
        --rank 32 2>&1 | tail -1
      "$BIN" bench --model "$ZR" --lora /tmp/zimage-lora-r32.safetensors --sizes 1024 --steps 8 \
        --json "$OUT/lora_bench.json" 2>&1 | tee "$OUT/lora_bench.md" | grep -v "^bench:" || rc=1 ;;
    fp8q)
      groups=${FP8_GROUPS:-qkv out w13 w2 qkv,out,w13,w2 all}
      "$BIN" bench --model "$ZR" --fp8-quality $groups --iters 3 --json "$OUT/fp8_quality.json" \
        2>&1 | tee "$OUT/fp8_quality.md" | grep -v "^bench:" || rc=1
      ZRO=${ZRO:-/tmp/zimage-random-outliers}
      random_model "$ZRO" --outlier-channels 0.005 --outlier-scale 30
      "$BIN" bench --model "$ZRO" --fp8-quality $groups --iters 3 --json "$OUT/fp8_quality_outliers.json" \
        2>&1 | tee "$OUT/fp8_quality_outliers.md" | grep -v "^bench:" || rc=1 ;;
    compare)
      python3 tools/compare_outputs.py --zimage-dit /tmp/zdump/dit_out.step0.npy \
        --diffusers-dit "$OUT/diffusers_dit_out_step0.npy" --zimage-png "$OUT/zimage_1024.png" \
        --diffusers-image "$OUT/diffusers_image.npy" --json "$OUT/parity.json" || rc=1
      python3 tools/compare_outputs.py --zimage-dit /tmp/zdump/dit_out.step0.npy \
        --diffusers-dit "$OUT/diffusers_dit_out_step0.npy" --zimage-png "$OUT/zimage_1024_graph.png" \
        --diffusers-image "$OUT/diffusers_image.npy" --json "$OUT/parity_graph.json" || rc=1 ;;
    serve)
      rm -rf "$OUT/serve_img" && mkdir -p "$OUT/serve_img"
      for mode in on off; do
        "$BIN" serve --model "$ZR" --device cuda --port 8190 --batching "$mode" --max-queue 64 \
          --quiet > "$OUT/serve_$mode.log" 2>&1 &
        pid=$!
        for _ in $(seq 1 120); do
          python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:8190/readyz')" \
            2>/dev/null && break; sleep 1
        done
        python3 tools/serve_bench.py --url http://127.0.0.1:8190 --sizes ${SERVE_SIZES:-512,1024} \
          --clients 1,4,16 --requests ${SERVE_REQUESTS:-2} --label "batching-$mode" \
          --json "$OUT/serve_bench.jsonl" --images-dir "$OUT/serve_img" || rc=1
        python3 -c "import urllib.request as u; print(u.urlopen('http://127.0.0.1:8190/metrics').read().decode())" \
          | grep -E '^zimage_batch' >> "$OUT/serve_$mode.log"
        kill -TERM $pid; wait $pid || rc=1
      done
      python3 tools/compare_images.py "$OUT/serve_img" batching-on batching-off \
        | tee "$OUT/serve_diff.txt" || rc=1 ;;
    budget)
      # The memory planner's table: whole 1024² images under device-memory budgets (bf16 and fp8
      # weights), with the driver-side peak and the bytes streamed per image.
      "$BIN" bench --model "$ZR" --vram-budget ${BUDGETS:-0 24 16 12 8 4} --iters 3 \
        --json "$OUT/budget_bf16.json" 2>&1 | tee "$OUT/budget_bf16.md" | grep -v "^bench:" || rc=1
      "$BIN" bench --model "$ZR" --weights fp8 --vram-budget ${BUDGETS8:-0 12 8 4} --iters 3 \
        --json "$OUT/budget_fp8.json" 2>&1 | tee "$OUT/budget_fp8.md" | grep -v "^bench:" || rc=1
      # The same bf16 budgets streamed from the weight files (no load-time copy), their pages
      # staged at every step (SW=locked-files adds the experimental page-locked form, which did
      # not finish in minutes on the H200 in session 11).
      for sw in files ${SW:-}; do
        "$BIN" bench --model "$ZR" --streamed-weights $sw --vram-budget ${BUDGETS:-0 24 16 12 8 4} \
          --iters 3 --json "$OUT/budget_$sw.json" 2>&1 | tee "$OUT/budget_$sw.md" \
          | grep -v "^bench:" || rc=1
      done ;;
    weights8)
      # --weights fp8 against bf16 on the same seed: DiT output (step 0) cosine, image PSNR.
      rm -rf /tmp/zdumpw8
      "$BIN" generate --model "$ZR" --device cuda --weights fp8 --prompt "$PROMPT" --seed 42 \
        --width 1024 --height 1024 --steps 8 --guidance 0 --dump /tmp/zdumpw8 \
        --dump-filter dit_out.step0 --output "$OUT/zimage_1024_w8.png" --verbose 2>&1 | tail -8 || rc=1
      python3 -c "
import json, numpy as np, zlib, struct
def png(p):
    import subprocess
    from PIL import Image
    return np.asarray(Image.open(p).convert('RGB')).astype(np.float64)
a = np.load('/tmp/zdump/dit_out.step0.npy').ravel().astype(np.float64)
b = np.load('/tmp/zdumpw8/dit_out.step0.npy').ravel().astype(np.float64)
cos = float(a @ b / np.sqrt((a @ a) * (b @ b)))
x, y = png('$OUT/zimage_1024.png'), png('$OUT/zimage_1024_w8.png')
mse = float(((x - y) ** 2).mean())
r = {'dit_cosine_fp8_weights_vs_bf16': cos, 'image_psnr_db': 10 * np.log10(255 ** 2 / max(mse, 1e-12)),
     'image_max_abs': float(abs(x - y).max())}
print(r); json.dump(r, open('$OUT/weights_fp8_quality.json', 'w'))" || rc=1 ;;
    offload)
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
      PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 python3 tools/diffusers_offload.py --model "$ZR" \
        --json "$OUT/diffusers_offload.json" ${OFFLOAD_ARGS:-} 2>&1 | grep -v Warning | tail -8 || rc=1 ;;
    formats)
      # One bench row per format; each converted file is deleted before the next is written.
      rm -rf "$ZF" "$OUT"/formats_*.json && mkdir -p "$ZF"
      : > "$OUT/formats_convert.txt"
      bench_row() {  # NAME [bench flags...]
        local name=$1; shift
        "$BIN" bench --model "$ZR" --vram-budget 0 --iters ${FORMAT_ITERS:-3} --steps 8 --sizes 1024 \
          "$@" --json "$OUT/formats_$name.json" 2>&1 | grep -v "^bench:" | tail -3 || rc=1
      }
      convert() {  # FORMAT COMPONENT
        local t
        t=$(date +%s)
        "$BIN" convert --model "$ZR" --format "$1" --component "$2" --out "$ZF" --quiet \
          2>&1 | tee -a "$OUT/formats_convert.txt" || rc=1
        echo "convert $1 $2: $(( $(date +%s) - t )) s, $(du -sh "$ZF" | cut -f1)" | tee -a "$OUT/formats_convert.txt"
      }
      bench_row folder
      convert bf16 transformer
      bench_row bf16_single_file --dit "$ZF/z_image_turbo_bf16.safetensors"
      rm -f "$ZF"/*.safetensors
      convert fp8 transformer && convert fp8 text_encoder
      bench_row fp8_scaled --dit "$ZF/z_image_turbo_fp8_scaled.safetensors" \
        --text-encoder "$ZF/qwen_3_4b_fp8_scaled.safetensors"
      bench_row fp8_scaled_widened --dit "$ZF/z_image_turbo_fp8_scaled.safetensors" \
        --text-encoder "$ZF/qwen_3_4b_fp8_scaled.safetensors" --widen-quantized
      rm -f "$ZF"/*.safetensors
      for q in q8_0 q4_k; do
        convert $q transformer
        bench_row gguf_$q --dit "$ZF"/z_image_turbo-*.gguf
        rm -f "$ZF"/*.gguf
      done
      python3 - "$OUT" <<'PY' || rc=1
import glob, json, os, sys
out = sys.argv[1]
rows = []
for name in ["folder", "bf16_single_file", "fp8_scaled", "fp8_scaled_widened", "gguf_q8_0", "gguf_q4_k"]:
    p = os.path.join(out, "formats_%s.json" % name)
    if not os.path.exists(p):
        rows.append({"format": name, "error": "no result"}); continue
    r = json.load(open(p))["budget_rows"][0]
    r["format"] = name
    rows.append(r)
json.dump({"formats": rows}, open(os.path.join(out, "formats.json"), "w"), indent=1)
with open(os.path.join(out, "formats.md"), "w") as f:
    f.write("| format | load s | s / image (1024², 8 steps, median of 3) | first image s | driver peak GiB |\n| --- | --- | --- | --- | --- |\n")
    for r in rows:
        if "error" in r:
            f.write("| %s | %s | | | |\n" % (r["format"], r["error"])); continue
        f.write("| %s | %.2f | %.3f | %.2f | %.2f |\n" % (r["format"], r["load_s"], r["image_s"], r["first_image_s"], r["driver_peak_gib"]))
print(open(os.path.join(out, "formats.md")).read())
PY
      rm -rf "$ZF" ;;
    pipelines)
      random_model "$ZR"
      # "$ZC.complete" marks a finished write (an interrupted one is written again).
      [ -f "$ZC.complete" ] || { rm -rf "$ZC"; "$BIN" make-random-model --like "$ZR" --controlnet "$ZC" \
        --controlnet-version ${CN_VERSION:-2.1} 2>&1 | tail -3 && touch "$ZC.complete"; }
      du -sh "$ZR" "$ZC"; df -h /tmp | tail -1
      rm -rf "$OUT/pipe_inputs" "$OUT"/pipelines_*.json
      PIPES=${PIPES:-t2i,img2img,inpaint,controlnet,controlnet-inpaint}
      # PIPE_SIZE / PIPE_STEPS / PIPE_DEVICE: other sizes, or a CPU smoke of this stage (tiny model).
      "$BIN" bench --model "$ZR" --controlnet "$ZC" --pipeline "$PIPES" --sizes ${PIPE_SIZE:-1024} \
        --steps ${PIPE_STEPS:-8} --device ${PIPE_DEVICE:-cuda} \
        --strength 0.6 --iters ${PIPE_ITERS:-3} --inputs-dir "$OUT/pipe_inputs" \
        --json "$OUT/pipelines_zimage.json" 2>&1 | tee "$OUT/pipelines_zimage.md" || rc=1
      if [ -f "$OUT/pipe_inputs/control.png" ]; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
        PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 python3 tools/diffusers_pipelines_bench.py --model "$ZR" \
          --controlnet "$ZC" --inputs-dir "$OUT/pipe_inputs" --pipelines "$PIPES" --size ${PIPE_SIZE:-1024} \
          --steps ${PIPE_STEPS:-8} --device ${PIPE_DEVICE:-cuda} \
          --strength 0.6 --iters ${PIPE_ITERS:-3} --json "$OUT/pipelines_diffusers.json" ${PIPE_DIFFUSERS_ARGS:-} \
          2>&1 | grep -v Warning | tee "$OUT/pipelines_diffusers.log" | grep -vE '^ |^[{}]' | tail -20 || rc=1
      fi
      python3 tools/pipelines_table.py --zimage "$OUT/pipelines_zimage.json" \
        --diffusers "$OUT/pipelines_diffusers.json" --json "$OUT/pipelines.json" --md "$OUT/pipelines.md" || rc=1 ;;
    *) echo "unknown stage $stage"; rc=2 ;;
  esac
  echo "== stage $stage: $(( $(date +%s) - t0 )) s"
done
exit $rc
