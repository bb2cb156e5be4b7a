#!/usr/bin/env bash
# Prepares a run of scripts/device_check.sh on the lent GPU machine, which has no network, no cuDNN
# frontend headers and no OpenBLAS (docs/device-check.md), from a machine that has what it lacks (no GPU
# needed). Run by `make device-prepare`, which first builds build/cudnn_att.o, train_llama_cpu and the
# tiny-shakespeare shards. Writes build/device (ignored by git), the one folder to carry:
#   cudnn_att.o, cudnn_att.sha256   the cuDNN SDPA glue compiled here, and the hashes of its sources (the
#                                   device check refuses an object built from other sources)
#   tinyshakespeare/                the tokenized train and val shards and tokenizer.bin
#   real_text.flags                 the trainer flags of the real-text runs (the device check adds -i, -j, -p, -o)
#   cpu_fp8/                        the CPU build's fp8 run with those flags (main.log, metrics.jsonl): the curve
#                                   the GPU's fp8 run must follow within 0.5%
#   MANIFEST                        commit, date, compilers and library versions of this preparation
# then prints the `carry` list and the command to run on the device. The CPU run takes about 5 minutes on
# 2 idle cores. Environment: CUDNN_FRONTEND_INCLUDE (set by make: where the frontend headers are).
set -euo pipefail
cd "$(dirname "$0")/.."

DEST=build/device
DATA=dev/data/tinyshakespeare
# The real-text runs: the `tiny` preset (GQA, so cuDNN's grouped-query path trains too), 200 steps of
# 8 x 256 tokens (about 1.2 epochs), validation on the whole val set every 25 steps.
REAL_TEXT_FLAGS="-e tiny -b 8 -t 256 -x 200 -v 25 -m -1 -l 1e-3 -u 20 --seed 1337"
DEVICE_LIMIT_MIB=64 # what the device tool carries: the working tree and the carried paths together

if [ -z "${CUDNN_FRONTEND_INCLUDE:-}" ]; then
    echo "device_prepare.sh: error: no cuDNN frontend headers (CUDNN_FRONTEND_INCLUDE is empty): run it as" \
        "'make device-prepare' on a machine where 'make setup' installed nvidia-cudnn-frontend" >&2
    exit 1
fi
for f in build/cudnn_att.o train_llama_cpu "$DATA/tiny_shakespeare_train.bin" "$DATA/tiny_shakespeare_val.bin" "$DATA/tokenizer.bin"; do
    [ -e "$f" ] || { echo "device_prepare.sh: error: $f is missing: run it as 'make device-prepare'" >&2; exit 1; }
done

NEXT=$DEST.next
rm -rf "$NEXT"
mkdir -p "$NEXT/tinyshakespeare"
cp build/cudnn_att.o "$NEXT/"
sha256sum cuda/cudnn_att.cpp cuda/cudnn_att.h core/common.h core/cuda_check.h > "$NEXT/cudnn_att.sha256"
cp "$DATA/tiny_shakespeare_train.bin" "$DATA/tiny_shakespeare_val.bin" "$DATA/tokenizer.bin" "$NEXT/tinyshakespeare/"
echo "$REAL_TEXT_FLAGS" > "$NEXT/real_text.flags"

echo "== the CPU build's fp8 run on tiny-shakespeare: ./train_llama_cpu $REAL_TEXT_FLAGS -p fp8"
t0=$(date +%s)
# shellcheck disable=SC2086 # the flags are words
./train_llama_cpu $REAL_TEXT_FLAGS -i "$NEXT/tinyshakespeare/tiny_shakespeare_train.bin" \
    -j "$NEXT/tinyshakespeare/tiny_shakespeare_val.bin" -p fp8 -o "$NEXT/cpu_fp8" > "$NEXT/cpu_fp8.log"
# the curve is all the device needs; the final checkpoint would be most of the carried size
rm -f "$NEXT"/cpu_fp8/model_* "$NEXT"/cpu_fp8/state_* "$NEXT"/cpu_fp8/DONE_*
final=$(grep '^val loss' "$NEXT/cpu_fp8.log" | tail -1)
echo "$final, $(( $(date +%s) - t0 ))s"

commit=$(git rev-parse --short HEAD 2> /dev/null || echo "no git")
git diff --quiet HEAD 2> /dev/null || commit="$commit+uncommitted changes"
frontend=$(sed -n 's/^#define CUDNN_FRONTEND_\(MAJOR\|MINOR\|PATCH\)_VERSION \([0-9]*\)/\2/p' \
    "$CUDNN_FRONTEND_INCLUDE/cudnn_frontend_version.h" | paste -sd.)
cudnn=$(sed -n 's/^#define CUDNN_\(MAJOR\|MINOR\|PATCHLEVEL\) \([0-9]*\)/\2/p' "${CUDA_HOME:-/usr/local/cuda}/include/cudnn_version.h" \
    2> /dev/null | paste -sd.)
{
    echo "commit $commit, prepared $(date -u +%Y-%m-%dT%H:%MZ); CPU fp8 curve: $final"
    echo "cudnn_att.o: $(g++ --version | head -1), cuDNN headers ${cudnn:-unknown}, frontend $frontend"
    echo "real-text flags: $REAL_TEXT_FLAGS"
} > "$NEXT/MANIFEST"
rm -rf "$DEST"
mv "$NEXT" "$DEST"

tree_kib=$(git ls-files -co --exclude-standard -z | du -ck --files0-from=- | tail -1 | cut -f1)
prep_kib=$(du -sk "$DEST" | cut -f1)
echo
cat "$DEST/MANIFEST"
echo "working tree $((tree_kib / 1024)) MiB + $DEST $((prep_kib / 1024)) MiB (the device tool carries at most $DEVICE_LIMIT_MIB MiB)"
[ $(( (tree_kib + prep_kib) / 1024 )) -lt "$DEVICE_LIMIT_MIB" ] ||
    { echo "device_prepare.sh: error: over the ${DEVICE_LIMIT_MIB} MiB the device tool carries" >&2; exit 1; }
echo
echo "carry:   [\"$DEST\"]"
echo "command: bash scripts/device_check.sh      (timeout_s 600; the check keeps to 480 s and writes \$OUT/summary.txt, \$OUT/logs.tar.gz)"
