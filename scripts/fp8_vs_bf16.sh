#!/usr/bin/env bash
# Trains the same model three times, same seed and data: in bf16 (the baseline), in fp8 with current
# scaling and in fp8 with delayed scaling (--fp8-recipe delayed), then compares both fp8 loss curves
# with bf16's and plots the FP8 statistics (`make fp8-vs-bf16` runs it with no flags):
#
#   bash scripts/fp8_vs_bf16.sh [extra train flags]      e.g.  bash scripts/fp8_vs_bf16.sh -x 40 -v 10
#
# Without flags both runs use the trainer's defaults (the `tiny` preset for one epoch of
# tiny-shakespeare, seed 1337); extra flags go to both runs, so they stay comparable (-p and -o are set
# here and refused). Runs land in runs/cmp_bf16, runs/cmp_fp8 and runs/cmp_fp8_delayed (overwritten);
# RECIPES=current runs fp8 with current scaling only. TRAINER picks the
# binary (default ./train_llama_cpu; TRAINER=./train_llama for the GPU build), PYTHON the interpreter,
# TOLERANCE the allowed final relative loss difference (default 0.01, docs/design.md#targets).
# Downstream evaluations go to every run, those whose data file is at its default path: HellaSwag (-h 1,
# dev/data/hellaswag/hellaswag_val.bin), LAMBADA (--eval-lambada dev/data/lambada/lambada_test.bin) and
# WikiText (--eval-wikitext dev/data/wikitext/wikitext2_test.bin); compare_loss.py then tables their
# scores (reported, not judged). EVALS="flags" replaces those flags (EVALS="" runs none). DRY_RUN=1
# prints the evaluations and the trainer commands and runs nothing.
# Exit status: compare_loss.py's (0 within tolerance, 1 not, 2 bad logs), or the trainer's if a run fails.
set -euo pipefail
cd "$(dirname "$0")/.."

TRAINER=${TRAINER:-./train_llama_cpu}
PYTHON=${PYTHON:-python3}
TOLERANCE=${TOLERANCE:-0.01}
RECIPES=${RECIPES:-current delayed}
BF16_DIR=runs/cmp_bf16
FP8_DIR=runs/cmp_fp8
DELAYED_DIR=runs/cmp_fp8_delayed
DRY_RUN=${DRY_RUN:-0}
HELLASWAG_FILE=dev/data/hellaswag/hellaswag_val.bin  # the trainer's default --hellaswag, read with -h 1
LAMBADA_FILE=dev/data/lambada/lambada_test.bin
WIKITEXT_FILE=dev/data/wikitext/wikitext2_test.bin
EVAL_SETS=(  # name|trainer flags|data file|the script that makes the file
    "hellaswag|-h 1|$HELLASWAG_FILE|dev/data/hellaswag.py"
    "lambada|--eval-lambada $LAMBADA_FILE|$LAMBADA_FILE|dev/data/lambada.py"
    "wikitext|--eval-wikitext $WIKITEXT_FILE|$WIKITEXT_FILE|dev/data/wikitext.py"
)

for flag in "$@"; do
    case "$flag" in
        -p|-o) echo "fp8_vs_bf16.sh: error: $flag is set by this script (bf16/fp8 into $BF16_DIR, $FP8_DIR)" >&2
               exit 2 ;;
    esac
done
if [ ! -x "$TRAINER" ]; then
    echo "fp8_vs_bf16.sh: error: trainer $TRAINER not found; build it first (make ${TRAINER#./})" >&2
    exit 2
fi

eval_flags=()
if [ -n "${EVALS+set}" ]; then
    read -r -a eval_flags <<< "$EVALS"
    echo "evaluations: ${EVALS:-none} (from EVALS)"
else
    found=() missing=()
    for entry in "${EVAL_SETS[@]}"; do
        IFS='|' read -r name flags file maker <<< "$entry"
        if [ -f "$file" ]; then
            read -r -a set_flags <<< "$flags"
            eval_flags+=("${set_flags[@]}") found+=("$name")
        else
            missing+=("$name: no $file, make it with python $maker")
        fi
    done
    names="" hints=""
    for name in "${found[@]}"; do names+="${names:+, }$name"; done
    for hint in "${missing[@]}"; do hints+="${hints:+; }$hint"; done
    echo "evaluations: ${names:-none}${hints:+ ($hints)}"
fi

run() {  # run NAME DIR FLAGS...: one training run; stops the script with the trainer's status if it fails
    local name=$1 dir=$2
    shift 2
    echo "=== $name: $TRAINER $* ==="
    [ "$DRY_RUN" = 1 ] && return
    rm -rf "$dir" # this script's own output: the trainer refuses an -o that holds an earlier run's checkpoints
    local rc=0
    "$TRAINER" "$@" || rc=$?
    if [ $rc -ne 0 ]; then
        echo "fp8_vs_bf16.sh: error: the $name run failed (exit $rc); its logs are in $dir" >&2
        exit $rc
    fi
}

run bf16 "$BF16_DIR" -p bf16 -o "$BF16_DIR" "${eval_flags[@]}" "$@"
run fp8 "$FP8_DIR" -p fp8 -o "$FP8_DIR" --fp8-stats 20 "${eval_flags[@]}" "$@"
runs=("$FP8_DIR") labels=(fp8)
case " $RECIPES " in
    *" delayed "*)
        run "fp8 delayed" "$DELAYED_DIR" -p fp8 --fp8-recipe delayed -o "$DELAYED_DIR" --fp8-stats 20 \
            "${eval_flags[@]}" "$@"
        runs+=("$DELAYED_DIR") labels+=(fp8-delayed) ;;
esac
[ "$DRY_RUN" = 1 ] && exit 0

echo "=== loss comparison (fp8 against the bf16 baseline) ==="
compare_rc=0
"$PYTHON" scripts/compare_loss.py "${runs[@]}" "$BF16_DIR" --labels "${labels[@]}" bf16 --tolerance "$TOLERANCE" \
    --out "$FP8_DIR/compare_loss.png" || compare_rc=$?

echo "=== FP8 statistics ==="
stats_rc=0
"$PYTHON" scripts/plot_fp8_stats.py "$FP8_DIR" --out "$FP8_DIR/fp8_stats.png" || stats_rc=$?
if [ $stats_rc -ne 0 ]; then
    echo "fp8_vs_bf16.sh: warning: plot_fp8_stats.py failed (exit $stats_rc); see the message above" >&2
fi

echo "=== plots ==="
[ -s "$FP8_DIR/compare_loss.png" ] && echo "loss comparison: $FP8_DIR/compare_loss.png"
[ -s "$FP8_DIR/fp8_stats.png" ] && echo "fp8 statistics:  $FP8_DIR/fp8_stats.png"
exit $compare_rc
