#!/usr/bin/env bash
# The device check (docs/device-check.md): the one command run on a lent GPU machine (one H100/H200, no
# network, under 8 minutes), and all the evidence the project gets from it. Every phase runs in its own
# process under its own timeout, so a crash, a die() or a hang costs only its own row, and the table is
# printed (and appended to OUT_DIR/summary.txt) row by row, so even a killed run leaves it. The phases run
# in the order of their value per second, so that when the budget runs out only the least valuable rows say
# "no time left":
#   1. environment: nvidia-smi; the CUDA toolkit, cuDNN, nvrtc and NCCL (the system's, else those of
#      PyTorch's nvidia-* wheels), MPI, OpenBLAS, compute-sanitizer (on PATH or in the toolkit);
#   2. the files `make device-prepare` made on a machine without a GPU (build/device: the cuDNN glue
#      object, the tiny-shakespeare shards, the CPU build's fp8 loss curve);
#   3. the build of train_llama, test_llama, test_llama_cpu and two dev/tools/ programs on the device;
#   4. test_llama --device-info: GPU, CUDA / cuBLASLt / cuDNN versions and the attention path (must be
#      cuDNN SDPA: the fallback kernels would make every number below measure the wrong thing);
#   5. test_llama checks, each in a process of its own (--only NAME), in four groups placed among the
#      other phases: a smoke check (SMOKE_CHECKS: cuBLASLt BF16/FP8 at a small shape), the production
#      shapes (PROD_CHECKS: the FP8 linear layers of Llama-2 7B and 13B, cuDNN attention at T 4096, HS 128
#      with both backward algorithms), after the throughput rows the model-level checks (HF's reference,
#      the CPU build, resume, recompute, ZeRO on one rank without NCCL, and nccl_one_rank, the one check
#      that starts NCCL), after the resume phase the Hopper accumulation model's oracle (ORACLE_CHECKS:
#      cuBLASLt FP8 GEMMs against fp8/gemm_hopper.h, the fraction of bit-equal outputs in its row), and last
#      the kernel families at a small shape; every check of --list gets a row;
#   6. FP8 vs BF16 GEMM TFLOP/s at the 7B and 13B shapes;
#   7. throughput of a 7B-shaped model (LAYERS layers, T 4096, 32768 tokens per step: 8 micro-steps) in bf16
#      and fp8: mean tokens/s and MFU of the steps after warm-up (skipped steps excluded) and the trainer's
#      own per-phase profile (--profile), and the device memory in use against the memory plan (--dry-run 1);
#      at the end, the cost of the FP8 safety net's shadow check (with gradients) at that shape;
#   8. real text: `tiny` on tiny-shakespeare on the GPU in bf16 and fp8 with the flags of the carried CPU
#      run: fp8 within 1% of bf16, and within 0.5% of the CPU build's emulated fp8 curve;
#   9. a GPU run resumed from its step-3 checkpoint against the uninterrupted run;
#  10. compute-sanitizer memcheck of the checks that run only our own kernels, limited to those kernels,
#      MEMCHECK_S seconds at most (a skip row with the reason where the sanitizer cannot run);
# then the whole table again. OUT_DIR (default $OUT when set, else build/device_check) receives two files:
# summary.txt (the table) and logs.tar.gz (every log, each cut to LOG_CAP bytes, re-packed after each
# phase); bulky files (shards, checkpoints, runs) live in a folder under /tmp, removed at the end.
#   usage: scripts/device_check.sh [--emulated] [OUT_DIR]     env: LAYERS (4), STEPS (10), JOBS (nproc), BUDGET_S (480)
# --emulated (or LLM8_DEVICE_CHECK_EMU=1) rehearses the check on the emulated GPU (docs/emulated-gpu.md),
# without a GPU: build/emu/train_llama and build/emu/test_llama (built beforehand: make emu) at
# scaled-down shapes, within BUDGET_S 95 by default (dev/test/test_device_check_emu.py runs it in CI).
# Every row whose only need is an execution model gives a real answer: the kernel and model checks
# (EMU_CHECKS), the memory plan against what the emulated run allocated (cudaMemGetInfo of emu/, whose
# capacity LLM8_EMU_MEMORY sets), the real-text curves against a CPU fp8 curve computed here at the same
# flags, resume. Rows that need the hardware (nvidia-smi, the cuDNN attention path, the production shapes,
# throughput, the GEMM benchmark, the shadow check's cost, compute-sanitizer) say "emulated: not measured".
# Exit status 0 when no row says FAIL. docs/device-check.md says how to prepare, carry and read it.
#
# Budget, in run order: expected seconds on one H200 with 16 cores, the phase's own timeout, and where the
# expectation comes from. "Measured" means measured on the 2-core CI machine without a GPU (shared, so
# times are upper bounds): CPU seconds of the build (`time make`, user), and the CPU side of the
# production checks on one thread with the device's BLAS=none build (build/time_cpu_reference, make
# build/time_cpu_reference BLAS=none; OMP_NUM_THREADS=1), divided by the threads that share the work there.
# What runs on the GPU could not be measured here: those figures are estimates.
#   phase                                      expected   timeout  basis
#   environment, prepared files                     5 s     60 s  tool calls
#   build (cudnn_att.o carried)                    30 s    180 s  measured: test_llama.cu 19 s, train_llama.cu 17 s,
#                                                                 test_llama_cpu + cpu_reference.o 9 s of CPU, one
#                                                                 translation unit each, in parallel (-j JOBS);
#                                                                 dev/tools/bench_gemm.cu 12 s of CPU
#   --device-info                                   5 s     60 s  estimate: CUDA context, cuBLASLt, cuDNN handle
#   smoke: kernel_gemm                             10 s     60 s  estimate
#   prod_fp8_linear_7b                             20 s    120 s  measured: CPU side 119 s on 1 thread (fills 61,
#                                                                 casts 23, emulated GEMMs 36), OpenMP over 16: ~8 s
#   prod_attention, prod_attention_deterministic 2x 45 s   120 s  measured: CPU side 279 s on 1 thread (forward
#                                                                 178, backward 95, fills 6), parallel over its 8
#                                                                 heads only: ~35 s each
#   prod_fp8_linear_13b                            25 s    120 s  measured: CPU side 134 s on 1 thread: ~9 s
#   throughput bf16, fp8, fp8-delayed (+ plans) 3x 40 s    150 s  estimate: 10 steps of ~0.6 s (scripts/perf_model.py's
#                                                                 7B on one H200, scaled to 4 of 32 blocks plus the
#                                                                 classifier), model set-up
#   GEMM benchmark                                 15 s     60 s  estimate: 24 GEMM shapes x 23 runs each
#   -- ~320 s so far: the rows above are the ones the 480 s must hold --
#   model-level checks (15)                    15x 10 s     60 s  estimate; cpu_vs_gpu_* run test_llama_cpu
#                                                                 --dump-run: measured 0.6 s on 1 thread
#   real text bf16, fp8 (+ comparisons)         2x 30 s    150 s  estimate: 200 steps of 2048 tokens of `tiny`
#   resume (2 runs)                             2x 10 s     60 s  estimate
#   hopper_accum_oracle                            10 s     60 s  measured: the model's CPU side ~20 s on 1
#                                                                 thread (8 GEMMs m 1024 n 64 K 4096/11008,
#                                                                 split-K 1..4), OpenMP over 16: ~2 s
#   -- ~510 s: the 460 s left after RESERVE_S end about here, so the rows below (and the last of the
#      ones above) are the ones that may say "no time left" --
#   kernel families (11, one smoke already run) 10x 6 s     60 s  estimate
#   shadow check cost                              40 s    150 s  estimate
#   memcheck                                   up to 90 s   90 s  MEMCHECK_S

EMULATED=${LLM8_DEVICE_CHECK_EMU:-0}
if [ "${1:-}" = --emulated ]; then EMULATED=1; shift; fi
[ "$EMULATED" = 1 ] || EMULATED=0
OUT_DIR=${1:-${OUT:-build/device_check}}
LAYERS=${LAYERS:-4}
STEPS=${STEPS:-10}
JOBS=${JOBS:-$(nproc)}
BUDGET_S=${BUDGET_S:-480}  # the whole check under 8 minutes (docs/design.md#the-test-strategy)
RESERVE_S=20               # kept back for the final table and the log archive
MIN_PHASE_S=10             # a phase that would get less than this is skipped
KILL_AFTER_S=10            # a command still running this long after its TERM is killed
TOOL_S=60                  # a short command: nvidia-smi, --device-info, writing a shard, a loss comparison
BUILD_S=180                # the build on the device
CHECK_S=60                 # one test_llama check
PROD_CHECK_S=120           # one production-shape check (CPU references at 7B/13B sizes)
BENCH_S=60                 # the GEMM benchmark
TRAIN_S=150                # one training run
RESUME_S=60                # each of the two resume runs
ORACLE_S=60                # the Hopper accumulation model's oracle (hopper_accum_oracle)
MEMCHECK_S=90              # all memcheck runs together
LOG_CAP=$((1 << 20))       # bytes kept of one log in the archive (its head and tail)
ARCHIVE_MAX=$((16 << 20))  # the largest file the device machine gives back
TOKENS_PER_STEP=32768      # throughput runs: 8 micro-steps of 4096 tokens
SHARD_TOKENS=2000000       # the random shard of the throughput and resume runs (uint16 tokens: 4 MB)
WARMUP_STEPS=2             # throughput: steps left out of the means (cuBLASLt and cuDNN set-up)
PROFILE_EVERY=5            # throughput: --profile
PREP=build/device          # what `make device-prepare` made (scripts/device_prepare.sh)
LIB_LINKS=$PWD/build/device_libs
TEST_BIN=./test_llama
BENCH_BIN=build/tools/bench_gemm    # dev/tools/bench_gemm.cu
SHARD_BIN=build/tools/write_shard   # dev/tools/write_shard.c (a CPU program: the emulated run uses it too)
TRAIN_BIN=./train_llama
TRAIN_WARMUP=()            # the trainer's warm-up before step 1 (docs/performance.md): on, its default
NOT_MEASURED="emulated: not measured"
if [ "$EMULATED" -eq 1 ]; then
    # the rehearsal: the emulated binaries, tiny shapes, and the rows it runs (each check takes seconds there)
    TEST_BIN=build/emu/test_llama
    TRAIN_BIN=build/emu/train_llama
    BUDGET_S=${LLM8_DEVICE_CHECK_BUDGET_S:-95}
    RESERVE_S=5
    MIN_PHASE_S=20         # a training run killed by its timeout would be a FAIL row, not a "no time left" one
    SHARD_TOKENS=65536
    # an emulated step of `tiny` costs ~2.5 s at any small B x T (AdamW over its 9M parameters and the
    # 32000-wide classifier under ASan), so the runs are few steps at 2 x 32 tokens
    EMU_STEPS=1            # the memory-plan runs
    EMU_TRAIN_ARGS=(-e tiny -b 2 -t 32)
    # the emulated GPU loads nothing lazily and its budget is CPU time: no warm-up (dev/test/test_emu.py checks it)
    TRAIN_WARMUP=(--warmup-pass 0)
    EMU_REAL_FLAGS="-e tiny -b 2 -t 32 -x 3 -v 3 -m 1 -l 1e-3 -u 2 --seed 1337"
    EMU_DATA=${EMU_DATA:-dev/data/tinyshakespeare}
    # the test_llama checks the rehearsal runs, about a second each (the others: a skip row; dev/test/test_emu.py
    # runs them all): every kernel family, and the cheap model-level ones
    EMU_CHECKS=(kernel_gemm kernel_optimizer kernel_encoder kernel_rmsnorm kernel_rope kernel_swiglu kernel_classifier
        kernel_fp8_cast kernel_fp8_cast_vec kernel_fp8_weight kernel_attention kernel_attention_fallback kernel_grad_fp8
        fp8_weights forward_deferred grad_accumulation)
fi
# the smoke check, run right after the build: cuBLASLt BF16 and FP8 GEMMs and the FP8 casts at a small shape
SMOKE_CHECKS=(kernel_gemm)
# the production-shape checks, the most valuable rows after the throughput ones, in this order
PROD_CHECKS=(prod_fp8_linear_7b prod_attention prod_attention_deterministic prod_fp8_linear_13b)
# the checks whose GPU work is our own kernels only (no cuBLASLt, no cuDNN): what memcheck runs
# the oracle of the CPU model of Hopper's FP8 accumulation (--fp8-accum hopper): a table row, after resume
ORACLE_CHECKS=(hopper_accum_oracle)
MEMCHECK_CHECKS=(kernel_optimizer kernel_encoder kernel_rmsnorm kernel_rope kernel_swiglu kernel_classifier kernel_fp8_cast kernel_fp8_weight
    kernel_grad_fp8)

START=$(date +%s)
mkdir -p "$OUT_DIR" || exit 1
WORK=$(mktemp -d /tmp/llm8_device_check.XXXXXX) || exit 1
LOGS=$WORK/logs
mkdir -p "$LOGS"
SUMMARY=$OUT_DIR/summary.txt
ARCHIVE=$OUT_DIR/logs.tar.gz
rm -f "$SUMMARY" "$ARCHIVE"

# ---------------------------------------------------------------- table, time, processes

ROW_FORMAT='%-46s | %-6s | %s\n'
ROWS=()
FAILED=0
# row NAME STATUS DETAIL: one row (status ok, FAIL, skip, info or bench), printed and saved at once
row() {
    local line
    line=$(printf "$ROW_FORMAT" "$1" "$2" "$(printf '%s' "$3" | tr -s '\n\t ' ' ' | sed 's/ *$//' | cut -c1-150)")
    ROWS+=("$line")
    [ "$2" = FAIL ] && FAILED=$((FAILED + 1))
    echo "$line" | tee -a "$SUMMARY"
}
header() { printf "$ROW_FORMAT" check status detail; printf '%s\n' "$(printf -- '-%.0s' $(seq 100))"; }

elapsed() { echo $(( $(date +%s) - START )); }
# budget WANTED: the seconds a phase may take: WANTED, less when the budget runs short, 0 when too little is left
budget() {
    local left=$(( BUDGET_S - RESERVE_S - $(elapsed) ))
    if [ "$left" -lt "$MIN_PHASE_S" ]; then echo 0; elif [ "$left" -lt "$1" ]; then echo "$left"; else echo "$1"; fi
}
NO_TIME="no time left in the ${BUDGET_S}s budget"

# limited SECONDS LOG CMD...: CMD with its output in LOG, stopped after SECONDS (killed KILL_AFTER_S later); its status.
# Waited for in the background, so that a TERM to this script stops it at once (the trap below).
CHILD=""
LAST_S=0 # how long the last limited command ran
limited() {
    local seconds=$1 log=$2 rc started
    shift 2
    started=$(date +%s)
    timeout -k "$KILL_AFTER_S" "$seconds" "$@" > "$log" 2>&1 &
    CHILD=$!
    wait "$CHILD"
    rc=$?
    CHILD=""
    LAST_S=$(( $(date +%s) - started ))
    return "$rc"
}

# why_failed STATUS SECONDS LOG: one line on a failed process: timed out (124; 137 when it had to be killed
# after its TERM: the trainer checkpoints on a TERM), killed by a signal, or its last words
why_failed() {
    local rc=$1 seconds=$2 log=$3 last
    last=$(grep -v '^[[:space:]]*$' "$log" 2> /dev/null | tail -1)
    if [ "$rc" -eq 124 ] || { [ "$rc" -eq 137 ] && [ "$LAST_S" -ge "$seconds" ]; }; then
        echo "timed out after ${seconds}s; last line: $last"
    elif [ "$rc" -gt 128 ]; then echo "killed by signal $((rc - 128)): $last"
    else echo "exit $rc: $last"; fi
}

# The attention path a binary runs, from its start-up line "| device: ...; attention: <path>".
attention_of() { sed -n 's/^| device: .*; attention: //p' "$@" 2>/dev/null | head -1; }
is_cudnn() { case $1 in "cuDNN SDPA"*) return 0 ;; *) return 1 ;; esac; }

# pack_logs CAP: logs.tar.gz from every log, each cut to its first and last CAP/2 bytes
pack_logs() {
    local cap=$1 half=$(($1 / 2)) f size
    for f in "$LOGS"/*; do
        [ -f "$f" ] || continue
        size=$(stat -c %s "$f")
        if [ "$size" -gt "$cap" ]; then
            { head -c "$half" "$f"; printf '\n[... %d bytes cut by device_check.sh ...]\n' $((size - 2 * half)); tail -c "$half" "$f"; } > "$f.cut" &&
                mv "$f.cut" "$f"
        fi
    done
    tar -czf "$ARCHIVE.part" -C "$WORK" logs 2>/dev/null && mv "$ARCHIVE.part" "$ARCHIVE"
}

FINISHED=0
finish() {
    [ "$FINISHED" -eq 1 ] && return
    FINISHED=1
    pack_logs "$LOG_CAP"
    [ "$(stat -c %s "$ARCHIVE" 2>/dev/null || echo 0)" -gt "$ARCHIVE_MAX" ] && pack_logs $((LOG_CAP / 8))
    echo
    echo "== device check summary ($(elapsed)s in all; files in $OUT_DIR)"
    header
    printf '%s\n' "${ROWS[@]}"
    echo
    ls -l "$OUT_DIR"
    rm -rf "$WORK"
}
trap finish EXIT
interrupted() {
    [ -n "$CHILD" ] && kill -TERM "$CHILD" 2> /dev/null && wait "$CHILD"
    row "device check" FAIL "interrupted by a signal after $(elapsed)s"
    exit 143
}
trap interrupted TERM INT

echo "device check: budget ${BUDGET_S}s, output $OUT_DIR, scratch $WORK"
header | tee "$SUMMARY"

# ---------------------------------------------------------------- 1. environment

if [ "$EMULATED" -eq 1 ]; then # the emulated GPU: no GPU, libraries, prepared files or build to check
row "GPU (nvidia-smi)" skip "$NOT_MEASURED: the emulated GPU ($TEST_BIN, $TRAIN_BIN)"
for b in "$TEST_BIN" "$TRAIN_BIN"; do [ -x "$b" ] || row "build $b" FAIL "not built: make emu"; done
[ -x "$TEST_BIN" ] && [ -x "$TRAIN_BIN" ] && row "build (emulated: make emu)" ok "$TEST_BIN $TRAIN_BIN"
else # the device, to the "fi # the device" below
echo "== GPU and libraries"
limited "$TOOL_S" "$LOGS/nvidia-smi_full.log" nvidia-smi
limited "$TOOL_S" "$LOGS/nvidia-smi.log" nvidia-smi --query-gpu=name,compute_cap,memory.total,driver_version --format=csv,noheader
rc=$?
if [ "$rc" -eq 0 ]; then row "GPU (nvidia-smi)" info "$(head -1 "$LOGS/nvidia-smi.log")"
else row "GPU (nvidia-smi)" FAIL "$(why_failed "$rc" "$TOOL_S" "$LOGS/nvidia-smi.log")"; fi

CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
export PATH="$PATH:$CUDA_HOME/bin"
export LD_LIBRARY_PATH="$CUDA_HOME/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"  # cuBLASLt, nvrtc
MAKE_VARS=()
rm -rf "$LIB_LINKS"

# wheel_dir lib|include FILE: the folder of PyTorch's nvidia-* wheels (nvidia/<pkg>/lib, nvidia/cu13/lib, ...) holding FILE
wheel_dir() {
    timeout "$TOOL_S" python3 - "$1" "$2" 2> /dev/null << 'EOF'
import glob, os, sys
try:
    import nvidia
except ImportError:
    sys.exit(0)
kind, name = sys.argv[1], sys.argv[2]
for root in nvidia.__path__:
    for pattern in ("*", os.path.join("*", "*")):
        for hit in sorted(glob.glob(os.path.join(root, pattern, kind, name))):
            print(os.path.dirname(hit))
            sys.exit(0)
EOF
}
have_header() { echo "#include <$1>" | gcc -E -x c - -I"$CUDA_HOME/include" > /dev/null 2>&1; }
# use_lib NAME SONAME: makes -l<NAME minus lib/.so> link and load: the system's library; else its SONAME
# alone, the system's or a wheel's, through an unversioned link in build/device_libs for the linker and its
# folder on the loader path. Sets LIB_WHERE to "system" or SONAME's folder; returns 1 when nothing has it.
use_lib() {
    local name=$1 soname=$2 dir
    LIB_WHERE=system
    if ldconfig -p 2> /dev/null | grep -q "[[:space:]]$name (" || [ -e "$CUDA_HOME/lib64/$name" ]; then return 0; fi
    dir=$(ldconfig -p 2> /dev/null | awk -v n="$soname" '$1 == n {print $NF; exit}')
    if [ -n "$dir" ]; then dir=$(dirname "$dir")
    elif [ -e "$CUDA_HOME/lib64/$soname" ]; then dir=$CUDA_HOME/lib64
    else dir=$(wheel_dir lib "$soname"); fi
    [ -n "$dir" ] || return 1
    mkdir -p "$LIB_LINKS"
    ln -sf "$dir/$soname" "$LIB_LINKS/$name"
    export LIBRARY_PATH="$LIB_LINKS:$dir${LIBRARY_PATH:+:$LIBRARY_PATH}"
    export LD_LIBRARY_PATH="$dir:$LD_LIBRARY_PATH"
    LIB_WHERE=$dir
}

env_notes=()
if use_lib libcudnn.so libcudnn.so.9; then env_notes+=("cuDNN $LIB_WHERE")
else MAKE_VARS+=(USE_CUDNN=0); env_notes+=("cuDNN missing (USE_CUDNN=0)"); fi
# the cuDNN frontend (>= 1.3x) references NVRTC even when only SDPA runs
if use_lib libnvrtc.so libnvrtc.so.13; then env_notes+=("nvrtc $LIB_WHERE")
else MAKE_VARS+=(USE_CUDNN=0); env_notes+=("nvrtc missing (USE_CUDNN=0)"); fi
# NCCL (train_llama links it): the headers and library of the system, else of the nvidia-nccl wheel
nccl_note="NCCL headers system"
if ! have_header nccl.h; then
    dir=$(wheel_dir include nccl.h)
    if [ -n "$dir" ]; then export CPATH="$dir${CPATH:+:$CPATH}"; nccl_note="NCCL headers $dir"; else nccl_note="no nccl.h"; fi
fi
if use_lib libnccl.so libnccl.so.2; then env_notes+=("$nccl_note, library $LIB_WHERE"); else env_notes+=("$nccl_note, no libnccl"); fi
if command -v mpicc > /dev/null; then env_notes+=("MPI $(command -v mpicc)"); else MAKE_VARS+=(USE_MPI=0); env_notes+=("no mpicc (USE_MPI=0)"); fi
if ! { have_header cblas.h && ldconfig -p 2> /dev/null | grep -q libopenblas; }; then
    MAKE_VARS+=(BLAS=none) # the CPU side of the checks then runs its plain GEMM loop on fewer columns
fi
SANITIZER=$(command -v compute-sanitizer)
for candidate in "$CUDA_HOME/bin/compute-sanitizer" "$CUDA_HOME/compute-sanitizer/compute-sanitizer" \
    /usr/local/cuda*/bin/compute-sanitizer /opt/nvidia/*/compute-sanitizer; do
    [ -z "$SANITIZER" ] && [ -x "$candidate" ] && SANITIZER=$candidate
done
row "libraries" info "$(printf '%s; ' "${env_notes[@]}")make ${MAKE_VARS[*]:-(defaults)}; compute-sanitizer ${SANITIZER:-not found}"

# ---------------------------------------------------------------- 2. prepared files

echo "== prepared files ($PREP)"
if [ ! -f "$PREP/MANIFEST" ]; then
    row "prepared files ($PREP)" FAIL "missing: run make device-prepare where the cuDNN frontend is installed, and carry $PREP"
else
    stale=$(sha256sum -c "$PREP/cudnn_att.sha256" 2> /dev/null | grep 'FAILED' | cut -d: -f1 | tr '\n' ' ')
    if [ -n "$stale" ]; then
        row "prepared files ($PREP)" FAIL "cudnn_att.o was built from other sources ($stale): re-run make device-prepare"
    else
        row "prepared files ($PREP)" ok "$(head -1 "$PREP/MANIFEST")"
    fi
    # the GPU build links the carried cuDNN glue when this machine cannot compile it (no frontend headers)
    [ -e build/cudnn_att.o ] || { mkdir -p build && cp "$PREP/cudnn_att.o" build/cudnn_att.o; }
fi

# ---------------------------------------------------------------- 3. build

echo "== build"
mkdir -p build && touch build/.setup-done # no network here: skip `make setup`, use what is installed
s=$(budget "$BUILD_S")
if [ "$s" -eq 0 ]; then
    row "build" skip "$NO_TIME"
else
    t0=$(date +%s)
    limited "$s" "$LOGS/build.log" make -k -j"$JOBS" "${MAKE_VARS[@]}" train_llama test_llama test_llama_cpu "$BENCH_BIN" "$SHARD_BIN"
    rc=$?
    if [ "$rc" -eq 0 ]; then
        row "build train_llama test_llama test_llama_cpu" ok "$(( $(date +%s) - t0 ))s"
    else
        missing=$(for b in train_llama test_llama test_llama_cpu "$BENCH_BIN" "$SHARD_BIN"; do [ -x "$b" ] || echo -n "$b "; done)
        row "build train_llama test_llama test_llama_cpu" FAIL \
            "not built: ${missing:-none}; $(grep -m1 -E '(error|fatal error):|undefined reference|cannot find -l|\*\*\*' "$LOGS/build.log" ||
                why_failed "$rc" "$s" "$LOGS/build.log")"
    fi
fi
pack_logs "$LOG_CAP"
fi # the device

# ---------------------------------------------------------------- 4. device, library versions, attention path

echo "== test_llama --device-info"
ATTENTION=""
if [ ! -x "$TEST_BIN" ]; then
    row "device and library versions" FAIL "test_llama not built"
else
    limited "$TOOL_S" "$LOGS/device_info.log" "$TEST_BIN" --device-info
    rc=$?
    info=$(sed -n 's/^| device: //p' "$LOGS/device_info.log" | head -1)
    ATTENTION=$(attention_of "$LOGS/device_info.log")
    if [ "$rc" -eq 0 ] && [ -n "$info" ]; then row "device and library versions" info "${info%%; attention: *}"
    else row "device and library versions" FAIL "$(why_failed "$rc" "$TOOL_S" "$LOGS/device_info.log")"; fi
fi
if [ "$EMULATED" -eq 1 ]; then row "attention path" skip "$NOT_MEASURED: ${ATTENTION:-unknown} (through the cuDNN double, not cuDNN)"
elif is_cudnn "$ATTENTION"; then row "attention path" ok "$ATTENTION"
else row "attention path" FAIL "${ATTENTION:-unknown} (the GPU path must be cuDNN SDPA; carry build/device with cudnn_att.o)"; fi

# ---------------------------------------------------------------- 5. test_llama checks, one process each

CHECKS=()
no_run=""
if [ -x "$TEST_BIN" ]; then mapfile -t CHECKS < <(timeout "$TOOL_S" "$TEST_BIN" --list 2> /dev/null); fi
if [ ${#CHECKS[@]} -eq 0 ]; then
    # names from the source, so that the table still has one row per check
    mapfile -t CHECKS < <(sed -n 's/^ *{"\([a-z0-9_]*\)", check_[a-z0-9_]*, ".*$/\1/p' test_llama.cu)
    no_run=$([ -x "$TEST_BIN" ] && echo "test_llama --list failed" || echo "test_llama not built (see the build row)")
fi
declare -A CHECK_DONE=() # the checks that have their row

# check_detail LOG: its first failures, else its "table:" line, else its worst norm comparison (rel L2 over its tolerance), else its first measured error
check_detail() {
    local fails
    fails=$(grep -E '^ *FAIL: ' "$1" | head -2 | sed 's/^ *FAIL: //' | paste -sd';')
    if [ -n "$fails" ]; then echo "$fails"; return; fi
    if grep -q '^table: ' "$1"; then grep -m1 '^table: ' "$1" | sed 's/^table: //'; return; fi
    awk 'match($0, /rel L2 [0-9.e+-]+, tol rel L2 [0-9.e+-]+/) {
             split(substr($0, RSTART, RLENGTH), f, /[ ,]+/)
             r = f[3] / f[7]
             if (r >= worst) { worst = r; what = $0 }
         }
         !first && /logits:|gradients:|max abs err|relative L2|bit-identical|uninterrupted/ { first = $0 }
         END {
             if (what != "") { sub(/^ */, "", what); sub(/:.*/, "", what); printf "worst rel L2 = %.2f x tol (%s)", worst, what }
             else { sub(/^ */, "", first); print first }
         }' "$1"
}

# run_check NAME: test_llama --only NAME in its own process under its own timeout, one row
run_check() {
    local name=$1 label="test_llama $1" want s log t0 rc detail
    CHECK_DONE[$name]=1
    if [ -n "$no_run" ]; then row "$label" FAIL "$no_run"; return; fi
    if [ "$EMULATED" -eq 1 ] && [[ $name == prod_* ]]; then row "$label" skip "$NOT_MEASURED: production shapes are out of a CPU's reach (dev/test/test_emu.py runs attention's at T 512)"; return; fi
    if [ "$EMULATED" -eq 1 ] && [ "$name" = hopper_accum_oracle ]; then
        row "$label" skip "$NOT_MEASURED: the oracle compares the hardware's FP8 accumulation, not the cuBLASLt double's"; return
    fi
    if [ "$EMULATED" -eq 1 ] && ! printf '%s\n' "${EMU_CHECKS[@]}" | grep -qx "$name"; then
        row "$label" skip "emulated: not in the rehearsal's EMU_CHECKS (dev/test/test_emu.py runs it)"; return
    fi
    case $name in prod_*) want=$PROD_CHECK_S ;; hopper_accum_oracle) want=$ORACLE_S ;; *) want=$CHECK_S ;; esac
    s=$(budget "$want")
    if [ "$s" -eq 0 ]; then row "$label" skip "$NO_TIME"; return; fi
    log=$LOGS/test_llama_$name.log
    t0=$(date +%s)
    limited "$s" "$log" "$TEST_BIN" --only "$name"
    rc=$?
    detail="$(( $(date +%s) - t0 ))s$(check_detail "$log" | sed 's/^./; &/')"
    if [ "$rc" -eq 0 ] && grep -q "^ok   $name\$" "$log"; then row "$label" ok "$detail"
    elif grep -q "^FAIL $name\$" "$log"; then row "$label" FAIL "$detail"
    else row "$label" FAIL "$(why_failed "$rc" "$s" "$log")"; fi
}

# run_checks TITLE NAME...: those checks, in that order, that have no row yet (a name test_llama does not
# list gets a FAIL row: this script and test_llama.cu disagree)
run_checks() {
    local title=$1 name
    shift
    echo "== test_llama checks: $title"
    for name in "$@"; do
        [ -n "${CHECK_DONE[$name]:-}" ] && continue
        if printf '%s\n' "${CHECKS[@]}" | grep -qx "$name"; then run_check "$name"
        else CHECK_DONE[$name]=1; row "test_llama $name" FAIL "not a check of test_llama --list (update device_check.sh)"; fi
    done
    pack_logs "$LOG_CAP"
}

# remaining_checks kernels|model: the listed checks without a row yet, kernel_* ones or all others but the
# ORACLE_CHECKS (their own phase), in --list order
remaining_checks() {
    local name
    for name in "${CHECKS[@]}"; do
        [ -n "${CHECK_DONE[$name]:-}" ] && continue
        printf '%s\n' "${ORACLE_CHECKS[@]}" | grep -qx "$name" && continue
        case $name in kernel_*) [ "$1" = kernels ] && echo "$name" ;; *) [ "$1" = model ] && echo "$name" ;; esac
    done
}

# ---------------------------------------------------------------- the random shard (throughput, shadow, resume)

SHARD=$WORK/random_tokens.bin
declare -A TOKS=() # tokens/s of the throughput runs, by precision
make_shard() {
    if [ -x "$SHARD_BIN" ]; then limited "$TOOL_S" "$LOGS/random_shard.log" "$SHARD_BIN" "$SHARD" "$SHARD_TOKENS" 1; fi
}

# ---------------------------------------------------------------- 6. GEMM benchmark

# FP8 vs BF16 GEMM TFLOP/s at the 7B and 13B shapes, one row per model
phase_gemm_bench() {
    echo "== GEMM FP8 vs BF16"
    s=$(budget "$BENCH_S")
    if [ "$EMULATED" -eq 1 ]; then row "GEMM benchmark" skip "$NOT_MEASURED (speed)"
    elif [ ! -x "$BENCH_BIN" ]; then row "GEMM benchmark" FAIL "$BENCH_BIN not built"
    elif [ "$s" -eq 0 ]; then row "GEMM benchmark" skip "$NO_TIME"
    else
        limited "$s" "$LOGS/gemm.log" "$BENCH_BIN"
        rc=$?
        while read -r line; do
            row "$(echo "$line" | cut -d: -f1)" bench "$(echo "$line" | cut -d: -f2- | sed 's/^ *//')"
        done < <(grep '^gemm ' "$LOGS/gemm.log")
        grep -q '^gemm ' "$LOGS/gemm.log" || row "GEMM benchmark" FAIL "$(why_failed "$rc" "$s" "$LOGS/gemm.log")"
    fi
    pack_logs "$LOG_CAP"
}

# ---------------------------------------------------------------- 7. throughput

# The trainer flags of a throughput run: bf16, fp8 (current scaling) or fp8-delayed; and its name in the
# rows (the table's first column holds 46 characters).
precision_flags() {
    case "$1" in
        fp8-delayed) echo "-p fp8 --fp8-recipe delayed" ;;
        *) echo "-p $1" ;;
    esac
}
precision_label() {
    case "$1" in
        fp8-delayed) echo "fp8 delayed" ;;
        *) echo "-p $1" ;;
    esac
}

# The trainer's "memory after step 1: {...}" line of LOG (train/memory_plan.h memory_report) as
# "KEY MiB" lines: plan.<category>, allocated.<category> for the plan's categories, and plan.llm8,
# plan.estimates, allocated.llm8, not_llm8, in_use; nothing when the run printed none.
memory_report_of() {
    grep -m1 '^memory after step 1: ' "$1" 2> /dev/null | awk '{
        for (part = 1; part <= 2; part++) {
            key = part == 1 ? "plan" : "allocated"
            i = index($0, "\"" key "\": {"); rest = substr($0, i); obj = substr(rest, index(rest, "{") + 1); obj = substr(obj, 1, index(obj, "}") - 1)
            n = split(obj, kv, ", ")
            for (k = 1; k <= n; k++) { split(kv[k], p, "\": "); name = substr(p[1], 2); gsub(/ /, "_", name); printf "%s.%s %.2f\n", key, name, p[2] / 1048576 }
        }
        for (j = 1; j <= 2; j++) {
            key = j == 1 ? "not_llm8" : "in_use"
            if (match($0, "\"" key "\": [0-9]+")) { v = substr($0, RSTART, RLENGTH); sub(/.*: /, "", v); printf "%s %.2f\n", key, v / 1048576 }
        }
    }'
}

# Rows of a run's memory report (LOG) under LABEL: with PER_CATEGORY 1 one row per category of the plan
# (plan against the run's tables, workspaces against llm8's allocator total less them), then llm8's
# allocations against the plan without its estimates, and the memory that is not llm8's (context,
# libraries) against the plan's estimates. On the GPU these are measurements (bench); on the emulated GPU
# the plan must match what was allocated (redzones aside) and nothing may be allocated outside llm8's
# counted allocations, while the context and libraries are not modelled.
memory_report_rows() {
    local log=$1 label=$2 per_category=$3 report
    report=$(memory_report_of "$log")
    if [ -z "$report" ]; then row "$label memory after step 1" FAIL "no memory report in $(basename "$log") (the run failed or printed none)"; return; fi
    get() { awk -v k="$1" '$1 == k {print $2}' <<< "$report"; }
    if [ "$per_category" = 1 ]; then
        for c in $(awk '$1 ~ /^plan\./ {sub(/^plan\./, "", $1); print $1}' <<< "$report"); do
            case "$c" in llm8|estimates|total) continue ;; esac
            local p a
            p=$(get "plan.$c"); a=$(get "allocated.$c")
            if [ "$EMULATED" -eq 1 ]; then
                # the emulated GPU's redzones (256 bytes per table buffer) and the trainer's few bytes outside the plan
                row "  $label ${c//_/ }" "$(awk -v p="$p" -v a="$a" 'BEGIN {print (a >= p - 0.005 && a <= p + 0.5) ? "ok" : "FAIL"}')" \
                    "plan $p MiB, allocated $a MiB"
            else row "  $label ${c//_/ }" bench "plan $p MiB, allocated $a MiB"; fi
        done
    fi
    local pl al est nl use
    pl=$(get plan.llm8); al=$(get allocated.llm8); est=$(get plan.estimates); nl=$(get not_llm8); use=$(get in_use)
    if [ "$EMULATED" -eq 1 ]; then
        row "  $label llm8's allocations" "$(awk -v p="$pl" -v a="$al" 'BEGIN {print (a >= p - 0.005 && a <= p * 1.01 + 0.5) ? "ok" : "FAIL"}')" \
            "plan $pl MiB without its estimates, llm8's allocator total $al MiB"
        row "  $label not llm8's (context, libraries)" "$(awk -v n="$nl" 'BEGIN {print n == 0 ? "ok" : "FAIL"}')" \
            "cudaMemGetInfo in use $use MiB less llm8's: $nl MiB (every allocation counted); planned ~$est MiB: $NOT_MEASURED"
    else
        row "  $label llm8's allocations" bench "plan $pl MiB without its estimates, llm8's allocator total $al MiB"
        row "  $label not llm8's (context, libraries)" bench "plan ~$est MiB (estimates), measured $nl MiB (cudaMemGetInfo in use $use MiB less llm8's)"
    fi
}

# tokens/s and MFU of the 7B-shaped model in bf16 and fp8, and its memory against the plan
phase_throughput() {
    echo "== throughput: llama2-7b shape, $LAYERS layers, T 4096, $TOKENS_PER_STEP tokens per step, $STEPS steps"
    for p in bf16 fp8 fp8-delayed; do
        read -r -a flags <<< "$(precision_flags "$p")"
        name=$(precision_label "$p")
        label="train 7b-shape L$LAYERS T4096 -d $TOKENS_PER_STEP $name"
        log=$LOGS/train_$p.log
        s=$(budget "$TRAIN_S")
        if [ ! -x "$TRAIN_BIN" ] || [ ! -f "$SHARD" ]; then row "$label" FAIL "train_llama or the random shard is missing"; continue; fi
        if [ "$s" -eq 0 ]; then row "$label" skip "$NO_TIME"; continue; fi
        TRAIN_ARGS=(-e llama2-7b --n-layers "$LAYERS" -b 1 -t 4096 -d "$TOKENS_PER_STEP" "${flags[@]}")
        # -o for metrics.jsonl (mem_mib: device memory in use), -n -1: no checkpoint
        limited "$s" "$log" "$TRAIN_BIN" "${TRAIN_ARGS[@]}" -x "$STEPS" -v 0 -m 1 -u 2 --profile "$PROFILE_EVERY" \
            -i "$SHARD" -j "$SHARD" -o "$WORK/train_$p" -n -1
        rc=$?
        limited "$TOOL_S" "$LOGS/plan_$p.log" "$TRAIN_BIN" "${TRAIN_ARGS[@]}" --dry-run 1
        planned=$(sed -n 's/^plan: .*"total_gib": \([0-9.]*\).*/\1/p' "$LOGS/plan_$p.log")
        used=$(sed -n 's/.*"mem_mib": \([0-9.]*\).*/\1/p' "$WORK/train_$p/metrics.jsonl" 2> /dev/null | sort -g | tail -1)
        if [ -n "$planned" ] && [ -n "$used" ]; then
            row "  $name memory plan" bench "plan $planned GiB (with estimates), in use $(awk -v u="$used" 'BEGIN {printf "%.2f", u / 1024}') GiB (cudaMemGetInfo)"
        else
            row "  $name memory plan" FAIL "plan ${planned:-missing (see plan_$p.log)} GiB; in use ${used:-not measured (the run failed: next row)}"
        fi
        memory_report_rows "$log" "$name" "$([ "$p" = fp8 ] && echo 1 || echo 0)"
        ttf=$(sed -n 's/^| time to the first step: \([0-9.]* s\) from main.*warm-up \([0-9.]* s\).*the step \([0-9.]* s\)$/\1 (warm-up \2, step 1 \3)/p' "$log" | head -1)
        [ -n "$ttf" ] && row "  $name time to the first step" info "$ttf from main to the end of step 1"
        # cuDNN's attention workspace against the plan's figure (cuda/cudnn_att.cpp prints both at start-up)
        att=$(sed -n 's/^| attention backward [^:]*: \(workspace [0-9.]* MiB, planned [0-9.]* MiB\).*$/\1/p' "$log" | head -1)
        if [ -n "$att" ]; then
            if grep -q '^| attention backward .*more than the memory plan counts' "$log"; then row "  $name attention workspace" FAIL "$att: the plan undercounts it"
            else row "  $name attention workspace" bench "$att"; fi
        fi
        # means over the steps after warm-up, leaving out skipped steps ("step k skipped: ..." precedes step k's line)
        stats=$(awk -v warm="$WARMUP_STEPS" '
            $1 == "step" && $3 == "skipped:" { skipped[$2] = 1 }
            $1 == "step" && / tok\/s/ {
                split($2, f, "/"); k = f[1] + 0
                for (i = 1; i <= NF; i++) { if ($i == "tok/s") t = $(i - 1); if ($i == "MFU") m = $(i + 1) + 0 }
                if (k > warm && !(k in skipped)) { st += t; sm += m; n++ }
                last = k
            }
            END { nskip = 0; for (k in skipped) nskip++; if (n) printf "%.0f %.1f %d %d %d", st / n, sm / n, warm + 1, last, nskip }' "$log")
        read -r toks mfu first last nskip <<< "$stats"
        path=$(attention_of "$log")
        if [ "$rc" -ne 0 ] || [ -z "$toks" ]; then
            row "$label" FAIL "$(why_failed "$rc" "$s" "$log")"
            continue
        fi
        TOKS[$p]=$toks
        detail="$toks tok/s, MFU $mfu% (mean of steps $first-$last, $nskip skipped); $(grep '^val loss' "$log" | tail -1)"
        if is_cudnn "$path"; then row "$label" ok "$detail"
        else row "$label" FAIL "attention: ${path:-unknown}, not cuDNN SDPA: $detail"; fi
        profile=$(grep '^profile step' "$log" | tail -1)
        [ -n "$profile" ] && row "  $name ${profile%%:*}" info "${profile#*: }"
    done
    if [ -n "${TOKS[bf16]:-}" ] && [ -n "${TOKS[fp8]:-}" ]; then
        row "train fp8 / bf16 tokens/s" bench "$(awk -v a="${TOKS[fp8]}" -v b="${TOKS[bf16]}" 'BEGIN {printf "%.2fx", a / b}')"
    fi
    # Colossal-AI reports current scaling within 10% of delayed scaling's speed
    if [ -n "${TOKS[fp8]:-}" ] && [ -n "${TOKS[fp8-delayed]:-}" ]; then
        row "train fp8 delayed / current tokens/s" bench "$(awk -v a="${TOKS[fp8-delayed]}" -v b="${TOKS[fp8]}" 'BEGIN {printf "%.3fx", a / b}')"
    fi
    pack_logs "$LOG_CAP"
}

# The rehearsal's throughput phase: tokens/s is not measured; the memory plan is, against what the emulated
# run allocated (emu/'s cudaMemGetInfo: what cudaMalloc holds, its redzones included, of LLM8_EMU_MEMORY GiB)
phase_throughput_emulated() {
    echo "== throughput (emulated): memory plan of ${EMU_TRAIN_ARGS[*]} against the emulated run"
    row "train 7b-shape L$LAYERS T4096 tokens/s" skip "$NOT_MEASURED (speed)"
    for p in bf16 fp8 fp8-delayed; do
        read -r -a flags <<< "$(precision_flags "$p")"
        label="  $(precision_label "$p") memory plan (${EMU_TRAIN_ARGS[*]})"
        s=$(budget "$TRAIN_S")
        if [ ! -x "$TRAIN_BIN" ] || [ ! -f "$SHARD" ]; then row "$label" FAIL "train_llama or the random shard is missing"; continue; fi
        if [ "$s" -eq 0 ]; then row "$label" skip "$NO_TIME"; continue; fi
        limited "$s" "$LOGS/train_$p.log" "$TRAIN_BIN" "${EMU_TRAIN_ARGS[@]}" "${flags[@]}" "${TRAIN_WARMUP[@]}" -x "$EMU_STEPS" -v 0 -m 1 \
            -i "$SHARD" -j "$SHARD" -o "$WORK/train_$p" -n -1
        rc=$?
        limited "$TOOL_S" "$LOGS/plan_$p.log" "$TRAIN_BIN" "${EMU_TRAIN_ARGS[@]}" "${flags[@]}" --dry-run 1
        # in bytes: total_gib's 4 decimals would round the plan by up to 0.05 MiB
        planned=$(sed -n 's/^plan: .*"total_bytes": \([0-9]*\).*/\1/p' "$LOGS/plan_$p.log")
        # the plan's estimate of the CUDA context (no allocation of ours, so none on the emulated GPU)
        context=$(sed -n 's/^plan: .*"cuda_context": \([0-9]*\).*/\1/p' "$LOGS/plan_$p.log")
        used=$(sed -n 's/.*"mem_mib": \([0-9.]*\).*/\1/p' "$WORK/train_$p/metrics.jsonl" 2> /dev/null | sort -g | tail -1)
        if [ "$rc" -ne 0 ]; then row "$label" FAIL "$(why_failed "$rc" "$s" "$LOGS/train_$p.log")"
        elif [ -z "$planned" ] || [ -z "$used" ] || [ -z "$context" ]; then
            row "$label" FAIL "plan ${planned:-missing (see plan_$p.log)} bytes; in use ${used:-not in metrics.jsonl} MiB"
        else
            # what the plan counts beyond the context must cover what the run allocated (mem_mib is
            # rounded to 0.1 MiB), and not overcount it by more than 5%
            verdict=$(awk -v u="$used" -v p="$planned" -v c="$context" 'BEGIN {
                q = (p - c) / 1048576; r = u / q
                printf "%s %.1f MiB planned without the ~%.0f MiB CUDA context, %.1f MiB in use: %.4f", (u <= q + 0.1 && r >= 0.95) ? "ok" : "FAIL", q, c / 1048576, u, r }')
            row "$label" "${verdict%% *}" "${verdict#* } (in use / plan, must be in [0.95, 1])"
        fi
        [ "$rc" -eq 0 ] && memory_report_rows "$LOGS/train_$p.log" "$(precision_label "$p")" "$([ "$p" = fp8 ] && echo 1 || echo 0)"
    done
    pack_logs "$LOG_CAP"
}

# ---------------------------------------------------------------- 7b. the FP8 safety net's shadow check

# the cost of a shadow check with gradients at the throughput shape
phase_shadow() {
    echo "== shadow check cost: llama2-7b shape, $LAYERS layers, T 4096, checks with gradients after steps 1 and 3"
    label="shadow check 7b-shape L$LAYERS T4096 --shadow-grad 1"
    log=$LOGS/train_shadow.log
    s=$(budget "$TRAIN_S")
    if [ "$EMULATED" -eq 1 ]; then row "$label" skip "$NOT_MEASURED (speed)"
    elif [ ! -x "$TRAIN_BIN" ] || [ ! -f "$SHARD" ]; then row "$label" FAIL "train_llama or the random shard is missing"
    elif [ "$s" -eq 0 ]; then row "$label" skip "$NO_TIME"
    else
        # no -o: a checkpoint of this shape takes minutes; the console has what is needed
        limited "$s" "$log" "$TRAIN_BIN" -e llama2-7b --n-layers "$LAYERS" -b 1 -t 4096 -x 4 -v 0 -m 1 -u 2 -i "$SHARD" \
            -j "$SHARD" -p fp8 --shadow-every 2 --shadow-grad 1
        rc=$?
        # the second check (the first pays the set-up) against steps 2 and 4, which run none
        cost=$(python3 - "$log" << 'PY' 2> /dev/null
import re, sys
text = open(sys.argv[1]).read()
steps = {int(m[1]): float(m[2]) for m in re.finditer(r"^step +(\d+)/\d+ \|.*?\| ([\d.]+) ms", text, re.M)}
checks = re.findall(r"^shadow check: .*rel diff (\S+) \| grad cos (\S+),.*\| ([\d.]+) ms", text, re.M)
rel, cos, ms = checks[1]
print(f"{float(ms):.0f} ms per check vs {(steps[2] + steps[4]) / 2:.0f} ms per step; rel loss diff {rel}, grad cos {cos}")
PY
    )
        if [ "$rc" -eq 0 ] && [ -n "$cost" ]; then row "$label" bench "$cost"
        else row "$label" FAIL "$(why_failed "$rc" "$s" "$log")"; fi
    fi
    pack_logs "$LOG_CAP"
}

# ---------------------------------------------------------------- 8. real text

# tiny on tiny-shakespeare, GPU bf16 and fp8 against each other and the carried CPU fp8 curve
phase_real_text() {
    echo "== real text: tiny-shakespeare, GPU bf16 and fp8 vs the carried CPU fp8 run"
    REAL_DATA=$PREP/tinyshakespeare
    CPU_CURVE=$PREP/cpu_fp8
    real_ok=1
    if [ "$EMULATED" -eq 1 ]; then
        # the rehearsal makes its CPU curve itself, at its own scaled-down flags
        REAL_DATA=$EMU_DATA
        CPU_CURVE=$WORK/cpu_fp8
        read -r -a REAL_FLAGS <<< "$EMU_REAL_FLAGS"
        limited "$TRAIN_S" "$LOGS/real_cpu_fp8.log" ./train_llama_cpu "${REAL_FLAGS[@]}" -i "$REAL_DATA/tiny_shakespeare_train.bin" \
            -j "$REAL_DATA/tiny_shakespeare_val.bin" -p fp8 -o "$CPU_CURVE"
        rc=$?
        if [ "$rc" -eq 0 ]; then row "real text: CPU -p fp8 run (train_llama_cpu)" ok "$EMU_REAL_FLAGS: $(grep '^val loss' "$LOGS/real_cpu_fp8.log" | tail -1)"
        else real_ok=0; row "real text: CPU -p fp8 run (train_llama_cpu)" FAIL "$(why_failed "$rc" "$TRAIN_S" "$LOGS/real_cpu_fp8.log")"; fi
        echo "$EMU_REAL_FLAGS" > "$WORK/real_text.flags"
        PREP_FLAGS=$WORK/real_text.flags
    else
        PREP_FLAGS=$PREP/real_text.flags
    fi
    if [ ! -f "$PREP_FLAGS" ] || [ ! -f "$CPU_CURVE/main.log" ]; then
        real_ok=0
        row "real text runs" FAIL "$PREP/real_text.flags or $PREP/cpu_fp8 missing: run make device-prepare and carry $PREP"
    else
        read -r -a REAL_FLAGS < "$PREP_FLAGS"
        for p in bf16 fp8; do
            label="real text: GPU -p $p run"
            log=$LOGS/real_$p.log
            s=$(budget "$TRAIN_S")
            if [ ! -x "$TRAIN_BIN" ]; then real_ok=0; row "$label" FAIL "train_llama not built"; continue; fi
            if [ "$s" -eq 0 ]; then real_ok=0; row "$label" skip "$NO_TIME"; continue; fi
            rm -rf "$WORK/real_$p"
            limited "$s" "$log" "$TRAIN_BIN" "${REAL_FLAGS[@]}" "${TRAIN_WARMUP[@]}" -i "$REAL_DATA/tiny_shakespeare_train.bin" \
                -j "$REAL_DATA/tiny_shakespeare_val.bin" -p "$p" -o "$WORK/real_$p"
            rc=$?
            cp "$WORK/real_$p/main.log" "$LOGS/real_${p}_main.log" 2> /dev/null
            if [ "$rc" -eq 0 ]; then row "$label" ok "${REAL_FLAGS[*]}: $(grep '^val loss' "$log" | tail -1)"
            else real_ok=0; row "$label" FAIL "$(why_failed "$rc" "$s" "$log")"; fi
        done
    fi
    # compare NAME A B TOLERANCE: scripts/compare_loss.py's verdict on run A against baseline B
    compare() {
        local label=$1 a=$2 b=$3 tolerance=$4 log=$LOGS/compare_$5.log rc
        limited "$TOOL_S" "$log" python3 scripts/compare_loss.py "$a" "$b" --tolerance "$tolerance" --out "$LOGS/compare_$5.png"
        rc=$?
        case $rc in
            0) row "$label" ok "$(grep -E '^PASS' "$log")" ;;
            1) row "$label" FAIL "$(grep -E '^FAIL' "$log" || why_failed "$rc" "$TOOL_S" "$log")" ;;
            *) row "$label" FAIL "$(why_failed "$rc" "$TOOL_S" "$log")" ;;
        esac
    }
    if [ "$real_ok" -eq 1 ]; then
        compare "real text: GPU fp8 vs GPU bf16 (1%)" "$WORK/real_fp8" "$WORK/real_bf16" 0.01 fp8_vs_bf16
        compare "real text: GPU fp8 vs CPU fp8 curve (0.5%)" "$WORK/real_fp8" "$CPU_CURVE" 0.005 gpu_vs_cpu_fp8
    else
        row "real text: comparisons" FAIL "a run is missing (rows above)"
    fi
    pack_logs "$LOG_CAP"
}

# ---------------------------------------------------------------- 9. resume

# a GPU run resumed from its step-3 checkpoint against the uninterrupted run
phase_resume() {
    # the rehearsal: 3 emulated steps, checkpoint at step 1, at 2 x 32 tokens
    local at=3 steps=6 t=256 b=4
    [ "$EMULATED" -eq 1 ] && { at=1; steps=3; t=32; b=2; }
    local ckpt
    ckpt=$(printf '%08d' "$at")
    echo "== resume: tiny, $steps steps, checkpoint at step $at, resumed in a second folder"
    label="resume tiny from step $at (LLM8_DETERMINISTIC=1)"
    FULL=$WORK/resume_full
    RESUMED=$WORK/resume_resumed
    mkdir -p "$RESUMED"
    RESUME_ARGS=(-e tiny -b "$b" -t "$t" -x "$steps" -n "$at" -v 0 -m 1 -i "$SHARD" -j "$SHARD")
    # "step loss lr" of steps at..steps-1 in a metrics.jsonl
    steps_resumed() { grep -E "^\\{\"step\": [$at-$((steps - 1))], \"loss\":" "$1" 2> /dev/null | awk -F'[:,] *' '{print $2, $4, $6}'; }
    s=$(budget "$RESUME_S")
    if [ ! -x "$TRAIN_BIN" ] || [ ! -f "$SHARD" ]; then row "$label" FAIL "train_llama or the random shard is missing"
    elif [ "$s" -eq 0 ]; then row "$label" skip "$NO_TIME"
    else
        # cuDNN's default attention backward is not bit-reproducible; both runs take the deterministic one
        export LLM8_DETERMINISTIC=1
        limited "$s" "$LOGS/resume_full.log" "$TRAIN_BIN" "${RESUME_ARGS[@]}" "${TRAIN_WARMUP[@]}" -o "$FULL"
        rc=$?
        if [ "$rc" -eq 0 ]; then
            cp "$FULL/model_$ckpt.bin" "$FULL/state_${ckpt}_00000.bin" "$FULL/DONE_$ckpt" "$RESUMED/"
            limited "$s" "$LOGS/resume_resumed.log" "$TRAIN_BIN" "${RESUME_ARGS[@]}" "${TRAIN_WARMUP[@]}" -y 1 -o "$RESUMED"
            rc=$?
        fi
        unset LLM8_DETERMINISTIC
        full=$(steps_resumed "$FULL/metrics.jsonl")
        resumed=$(steps_resumed "$RESUMED/metrics.jsonl")
        if [ "$rc" -ne 0 ]; then
            row "$label" FAIL "$(why_failed "$rc" "$s" "$(ls -t "$LOGS"/resume_*.log | head -1)")"
        elif [ "$(echo "$full" | grep -c .)" -eq $((steps - at)) ] && [ "$full" = "$resumed" ]; then
            row "$label" ok "loss and lr of steps $at..$((steps - 1)) identical: $(echo "$full" | awk '{print $2}' | tr '\n' ' ')"
        else
            row "$label" FAIL "steps $at..$((steps - 1)) (step loss lr) differ: [$(echo "$full" | tr '\n' ' ')] vs [$(echo "$resumed" | tr '\n' ' ')]"
        fi
    fi
    pack_logs "$LOG_CAP"
}

# ---------------------------------------------------------------- 10. memcheck

# compute-sanitizer memcheck of the checks that run only our kernels
phase_memcheck() {
    echo "== compute-sanitizer memcheck: ${MEMCHECK_CHECKS[*]}"
    memcheck_end=$(( $(elapsed) + $(budget "$MEMCHECK_S") ))
    cannot=""  # why compute-sanitizer cannot run on this machine, once a run said so
    filter=()
    if [ -n "$SANITIZER" ] && timeout "$TOOL_S" "$SANITIZER" --help 2>&1 | grep -q -- '--kernel-name'; then
        filter=(--kernel-name kns=_kernel) # ours are all named *_kernel; cuBLASLt's and cuDNN's are not checked
    fi
    for name in "${MEMCHECK_CHECKS[@]}"; do
        label="memcheck $name"
        s=$(( memcheck_end - $(elapsed) ))
        if [ "$EMULATED" -eq 1 ]; then row "$label" skip "$NOT_MEASURED (compute-sanitizer needs a GPU; the emulated build runs under ASan)"; continue; fi
        if [ -z "$SANITIZER" ]; then row "$label" skip "compute-sanitizer not found (PATH, $CUDA_HOME/bin)"; continue; fi
        if [ -n "$cannot" ]; then row "$label" skip "compute-sanitizer cannot run here: $cannot"; continue; fi
        if [ ! -x "$TEST_BIN" ]; then row "$label" FAIL "test_llama not built"; continue; fi
        if [ "$s" -lt "$MIN_PHASE_S" ]; then row "$label" skip "no time left (memcheck: ${MEMCHECK_S}s at most, within the ${BUDGET_S}s budget)"; continue; fi
        log=$LOGS/memcheck_$name.log
        limited "$s" "$log" "$SANITIZER" --tool memcheck "${filter[@]}" "$TEST_BIN" --only "$name"
        rc=$?
        summary=$(grep -o 'ERROR SUMMARY: [0-9]* error[s]*' "$log" | tail -1)
        # gVisor: "Device not supported", then the program's first allocation fails
        cannot=$(grep -m1 -i 'not supported' "$log")
        if [ -n "$cannot" ]; then
            row "$label" skip "compute-sanitizer cannot run here: $cannot"
        elif [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] || [ -z "$summary" ]; then
            row "$label" FAIL "$(why_failed "$rc" "$s" "$log")"
        elif [ "$rc" -eq 0 ] && [ "$summary" = "ERROR SUMMARY: 0 errors" ]; then
            row "$label" ok "$summary${filter[*]:+, ${filter[*]}}"
        else
            first=$(grep -m1 -E '^=+ +(Invalid|Error|Program hit)' "$log")
            row "$label" FAIL "$summary, exit $rc${first:+: $first}"
        fi
    done
}

# ---------------------------------------------------------------- the phases, by value per second

# What matters most runs first, so that the budget cuts only the least valuable rows (the header's table):
# the production-shape checks and the throughput rows are the evidence no CPU test can give.
run_checks "smoke" "${SMOKE_CHECKS[@]}"
run_checks "production shapes" "${PROD_CHECKS[@]}"
make_shard
if [ "$EMULATED" -eq 1 ]; then phase_throughput_emulated; else phase_throughput; fi
phase_gemm_bench
mapfile -t MODEL_CHECKS < <(remaining_checks model)
run_checks "model, resume, ZeRO and NCCL on one rank" "${MODEL_CHECKS[@]}"
if [ "$EMULATED" -eq 1 ]; then # the rehearsal: the kernel rows cost a second each there, the training runs far more
    mapfile -t KERNEL_CHECKS < <(remaining_checks kernels)
    run_checks "kernel families at a small shape" "${KERNEL_CHECKS[@]}"
fi
phase_real_text
phase_resume
run_checks "the Hopper accumulation model's oracle" "${ORACLE_CHECKS[@]}"
mapfile -t KERNEL_CHECKS < <(remaining_checks kernels)
run_checks "kernel families at a small shape" "${KERNEL_CHECKS[@]}"
phase_shadow
phase_memcheck

finish
[ "$FAILED" -eq 0 ]
