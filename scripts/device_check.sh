#!/usr/bin/env bash
# The device check (DESIGN.md section 8): one command on one H100/H200, under 8 minutes, no network.
#   1. builds train_llama, test_llama and test_llama_cpu on the device (times the build);
#   2. runs every check of test_llama: the GPU against HF transformers' reference and against the CPU
#      build on the same recipe, each kernel family against its CPU op, resume, recompute, accumulation;
#      then, when compute-sanitizer is on PATH, the checks of the hand-written kernels under memcheck;
#   3. measures FP8 vs BF16 GEMM TFLOP/s at Llama-2 7B and 13B shapes (test_llama --bench-gemm);
#   4. trains a 7B-shaped model with fewer layers (seq 4096) for a few steps in bf16 and fp8 and reports
#      tokens/s and MFU;
#   5. measures the FP8 safety net's shadow check (with gradients) at that shape: its time against a step's;
#   6. resumes a `tiny` run from its step-3 checkpoint and compares steps 3..5 with the uninterrupted run;
# and prints one table last. Logs go to OUT_DIR (default $OUT if set, else build/device_check).
#   usage: scripts/device_check.sh [OUT_DIR]      env: LAYERS (default 4), STEPS (default 10), JOBS
# Needs only the CUDA toolkit, cuDNN and NCCL found on the machine (and the cuDNN frontend headers for
# cuDNN attention; without them the build falls back to the plain attention kernels, noted in the table).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${1:-${OUT:-build/device_check}}
LAYERS=${LAYERS:-4}
STEPS=${STEPS:-10}
JOBS=${JOBS:-$(nproc)}
TIME_LIMIT_S=480          # DESIGN.md section 8: the whole check in under 8 minutes
MEMCHECK_TIMEOUT_S=240
AFTER_MEMCHECK_S=180      # what the GEMM benchmark, the throughput, shadow and resume runs take, with margin
MEMCHECK_CHECKS=(kernel_encoder kernel_rmsnorm kernel_fp8_cast kernel_classifier kernel_attention)
START=$(date +%s)
mkdir -p "$OUT_DIR"
ROWS=()
row() { ROWS+=("$(printf '%-46s | %-6s | %s' "$1" "$2" "$3")"); }
elapsed() { echo "$(( $(date +%s) - $1 ))s"; }
# The attention path a binary runs, from its start-up line "| device: ...; attention: <mode>" in a log.
attention_of() { sed -n 's/^| device: .*; attention: //p' "$@" 2>/dev/null | head -1; }

echo "== device"
nvidia-smi --query-gpu=name,compute_cap,memory.total,driver_version --format=csv,noheader | tee "$OUT_DIR/device.txt"
row "device" "info" "$(head -1 "$OUT_DIR/device.txt")"

echo "== build"
# Nothing can be installed on a GPU host without network: skip `make setup` and use what is there.
mkdir -p build && touch build/.setup-done
MAKE_VARS=()
if ! { echo '#include <cblas.h>' | gcc -E -x c - >/dev/null 2>&1 && ldconfig -p | grep -q libopenblas; }; then
    MAKE_VARS+=(BLAS=none) # the CPU side of the checks then uses a slow built-in GEMM
fi
# cuDNN: the system's, else the one PyTorch's nvidia-cudnn wheel carries (it has no unversioned .so).
if ! ldconfig -p | grep -q 'libcudnn\.so ' && [ ! -e /usr/local/cuda/lib64/libcudnn.so ]; then
    dir=$(python3 -c "import nvidia.cudnn, os; print(os.path.join(list(nvidia.cudnn.__path__)[0], 'lib'))" 2>/dev/null)
    if [ -n "$dir" ] && [ -e "$dir/libcudnn.so.9" ]; then
        mkdir -p build/cudnn_lib && ln -sf "$dir/libcudnn.so.9" build/cudnn_lib/libcudnn.so
        export LIBRARY_PATH="$PWD/build/cudnn_lib:$dir:${LIBRARY_PATH:-}" LD_LIBRARY_PATH="$dir:${LD_LIBRARY_PATH:-}"
    else
        MAKE_VARS+=(USE_CUDNN=0)
    fi
fi
t0=$(date +%s)
if make -j"$JOBS" "${MAKE_VARS[@]}" train_llama test_llama test_llama_cpu > "$OUT_DIR/build.log" 2>&1; then
    # the attention path is filled in from the binaries' start-up line (an up-to-date build logs nothing)
    BUILD_ROW=${#ROWS[@]}
    BUILD_TIME=$(elapsed "$t0")
    row "build train_llama test_llama test_llama_cpu" "ok" ""
else
    tail -30 "$OUT_DIR/build.log"
    row "build" "FAIL" "see $OUT_DIR/build.log"
    printf '\n%s\n' "${ROWS[@]}"
    exit 1
fi

echo "== test_llama"
t0=$(date +%s)
# test_llama_full.log keeps the start-up lines ("| device: ...; attention: ...") the table reads
./test_llama 2>&1 | tee "$OUT_DIR/test_llama_full.log" | grep --line-buffered -v '^|' | tee "$OUT_DIR/test_llama.log"
while read -r status name; do
    detail=$(awk -v n="[ $name ]" 'index($0, n) == 1 {on = 1; next} on && /^(ok  |FAIL) / {exit} on && /FAIL:|max abs err|relative L2|rel err/ {print}' "$OUT_DIR/test_llama.log" |
        grep -E 'FAIL:|gradients:|logits:|max abs' | head -2 | sed 's/^ *//' | tr '\n' ';' | cut -c1-110)
    row "test_llama $name" "$status" "$detail"
done < <(grep -E '^(ok  |FAIL) ' "$OUT_DIR/test_llama.log" | awk '{print $1, $2}')
summary=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$OUT_DIR/test_llama.log" | tail -1)
row "test_llama (all)" "$([ -n "$summary" ] && echo "$summary" | grep -q ' 0 failed' && echo ok || echo FAIL)" "${summary:-no summary: crashed?} in $(elapsed "$t0")"

echo "== compute-sanitizer memcheck: ${MEMCHECK_CHECKS[*]}"
name="compute-sanitizer memcheck (${#MEMCHECK_CHECKS[@]} kernel checks)"
limit=$(( TIME_LIMIT_S - AFTER_MEMCHECK_S - ($(date +%s) - START) ))
[ "$limit" -gt "$MEMCHECK_TIMEOUT_S" ] && limit=$MEMCHECK_TIMEOUT_S
if ! command -v compute-sanitizer >/dev/null; then
    row "$name" "skip" "compute-sanitizer not on PATH"
elif [ "$limit" -lt 30 ]; then
    row "$name" "skip" "no time left for it within the ${TIME_LIMIT_S}s budget"
else
    t0=$(date +%s)
    only=()
    for check in "${MEMCHECK_CHECKS[@]}"; do only+=(--only "$check"); done
    timeout "$limit" compute-sanitizer --tool memcheck ./test_llama "${only[@]}" > "$OUT_DIR/memcheck.log" 2>&1
    rc=$?
    summary=$(grep -o 'ERROR SUMMARY: [0-9]* error[s]*' "$OUT_DIR/memcheck.log" | tail -1)
    if [ "$rc" -eq 124 ]; then
        row "$name" "FAIL" "timed out after ${limit}s, see $OUT_DIR/memcheck.log"
    elif [ -z "$summary" ]; then
        row "$name" "FAIL" "exit $rc, no ERROR SUMMARY: see $OUT_DIR/memcheck.log"
    else
        status=$([ "$rc" -eq 0 ] && echo "$summary" | grep -q 'SUMMARY: 0 errors' && echo ok || echo FAIL)
        row "$name" "$status" "$summary, exit $rc, in $(elapsed "$t0")"
    fi
fi

echo "== GEMM FP8 vs BF16"
./test_llama --bench-gemm 2>&1 | grep -v '^|' | tee "$OUT_DIR/gemm.log"
while read -r line; do
    row "$(echo "$line" | cut -d: -f1)" "bench" "$(echo "$line" | cut -d: -f2- | sed 's/^ *//')"
done < <(grep '^gemm ' "$OUT_DIR/gemm.log")
[ -n "$(grep '^gemm ' "$OUT_DIR/gemm.log")" ] || row "GEMM benchmark" "FAIL" "see $OUT_DIR/gemm.log"

echo "== training throughput: llama2-7b shape, $LAYERS layers, seq 4096"
SHARD="$OUT_DIR/random_tokens.bin"
./test_llama --write-shard "$SHARD" 2000000 1 || row "random shard" "FAIL" ""
declare -A TOKS
for p in bf16 fp8; do
    log="$OUT_DIR/train_$p.log"
    ./train_llama -e llama2-7b --n-layers "$LAYERS" -b 1 -t 4096 -x "$STEPS" -v 0 -m 1 -u 2 -i "$SHARD" -j "$SHARD" -p "$p" > "$log" 2>&1
    rc=$?
    # mean tokens/s and MFU over the steps after the first two (cuBLASLt / cuDNN set-up)
    stats=$(awk '/^step/ {n++; for (i = 1; i <= NF; i++) {if ($i == "tok/s") t = $(i-1); if ($i == "MFU") m = $(i+1)}
                 if (n > 2) {st += t; sm += m; c++}} END {if (c) printf "%.0f %.1f", st / c, sm / c}' "$log")
    toks=${stats%% *}
    mfu=${stats##* }
    TOKS[$p]=${toks:-0}
    if [ "$rc" -eq 0 ] && [ -n "$toks" ]; then
        row "train 7b-shape L$LAYERS T4096 -p $p" "ok" "$toks tok/s, MFU ${mfu%\%}%, final $(grep '^val loss' "$log" | tail -1)"
    else
        row "train 7b-shape L$LAYERS T4096 -p $p" "FAIL" "exit $rc: $(tail -1 "$log" | cut -c1-100)"
    fi
done
if [ "${TOKS[bf16]:-0}" -gt 0 ] && [ "${TOKS[fp8]:-0}" -gt 0 ]; then
    row "train fp8 / bf16 tokens/s" "bench" "$(awk -v a="${TOKS[fp8]}" -v b="${TOKS[bf16]}" 'BEGIN {printf "%.2fx", a / b}')"
fi

echo "== shadow check cost: llama2-7b shape, $LAYERS layers, seq 4096, checks with gradients at steps 0 and 2"
log="$OUT_DIR/train_shadow.log"
# no -o: a checkpoint of this shape would take minutes and ~17 GB; the console has what is needed
if ./train_llama -e llama2-7b --n-layers "$LAYERS" -b 1 -t 4096 -x 4 -v 0 -m 1 -u 2 -i "$SHARD" -j "$SHARD" -p fp8 \
       --shadow-every 2 --shadow-grad 1 > "$log" 2>&1; then
    # the check after step 3 (console numbering; the first pays the set-up) against steps 2 and 4, which have none
    cost=$(python3 - "$log" <<'PY' 2>&1 | tail -1
import re, sys
text = open(sys.argv[1]).read()
steps = {int(m[1]): float(m[2]) for m in re.finditer(r"^step +(\d+)/\d+ \|.*?\| ([\d.]+) ms", text, re.M)}
checks = re.findall(r"^shadow check: .*rel diff (\S+) \| grad cos (\S+),.*\| ([\d.]+) ms", text, re.M)
rel, cos, ms = checks[1]
print(f"{float(ms):.0f} ms per check vs {(steps[2] + steps[4]) / 2:.0f} ms per step; rel loss diff {rel}, grad cos {cos}")
PY
)
    row "shadow check 7b-shape L$LAYERS T4096 --shadow-grad 1" "bench" "$cost"
else
    row "shadow check 7b-shape L$LAYERS T4096 --shadow-grad 1" "FAIL" "$(tail -1 "$log" | cut -c1-100)"
fi

echo "== resume: tiny, 6 steps, checkpoint at step 3, resumed in a second folder"
FULL="$OUT_DIR/resume_full"
RESUMED="$OUT_DIR/resume_resumed"
rm -rf "$FULL" "$RESUMED"
mkdir -p "$RESUMED"
RESUME_ARGS=(-e tiny -b 4 -t 256 -x 6 -n 3 -v 0 -m 1 -i "$SHARD" -j "$SHARD")
# "step loss lr" of steps 3..5 in a metrics.jsonl
steps_3_to_5() { grep -E '^\{"step": [345], "loss":' "$1" 2>/dev/null | awk -F'[:,] *' '{print $2, $4, $6}'; }
# cuDNN's default attention backward is not bit-reproducible; both runs take the deterministic one
if LLM8_DETERMINISTIC=1 ./train_llama "${RESUME_ARGS[@]}" -o "$FULL" > "$OUT_DIR/resume_full.log" 2>&1 &&
   cp "$FULL/model_00000003.bin" "$FULL/state_00000003_00000.bin" "$FULL/DONE_00000003" "$RESUMED/" &&
   LLM8_DETERMINISTIC=1 ./train_llama "${RESUME_ARGS[@]}" -y 1 -o "$RESUMED" > "$OUT_DIR/resume_resumed.log" 2>&1; then
    full=$(steps_3_to_5 "$FULL/metrics.jsonl")
    resumed=$(steps_3_to_5 "$RESUMED/metrics.jsonl")
    if [ "$(echo "$full" | grep -c .)" -eq 3 ] && [ "$full" = "$resumed" ]; then
        row "resume tiny from step 3 (LLM8_DETERMINISTIC=1)" "ok" "loss and lr of steps 3..5 identical: $(echo "$full" | awk '{print $2}' | tr '\n' ' ')"
    else
        row "resume tiny from step 3 (LLM8_DETERMINISTIC=1)" "FAIL" "steps 3..5 (step loss lr) differ: [$(echo "$full" | tr '\n' ' ')] vs [$(echo "$resumed" | tr '\n' ' ')]"
    fi
else
    row "resume tiny from step 3 (LLM8_DETERMINISTIC=1)" "FAIL" "a run failed: see $OUT_DIR/resume_*.log"
fi

if [ -n "${BUILD_ROW:-}" ]; then
    attention=$(attention_of "$OUT_DIR/test_llama_full.log" "$OUT_DIR"/train_*.log "$OUT_DIR"/resume_*.log)
    ROWS[BUILD_ROW]="$(printf '%-46s | %-6s | %s' "build train_llama test_llama test_llama_cpu" "ok" \
        "$BUILD_TIME, attention: ${attention:-unknown (no start-up line in the logs)} ${MAKE_VARS[*]}")"
fi

echo
echo "== device check summary (logs in $OUT_DIR, $(elapsed "$START") in all)"
printf '%-46s | %-6s | %s\n' "check" "status" "detail"
printf '%s\n' "${ROWS[@]}"
! printf '%s\n' "${ROWS[@]}" | grep -q '| FAIL '
