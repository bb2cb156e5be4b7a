#!/usr/bin/env bash
# Runs libFuzzer harnesses (built by `make fuzz-build` into build/fuzz/) for SECONDS each, one after the
# other, and prints one line per harness with its executions; exits non-zero if any found a crash, a
# leak, a timeout or a broken property (the input is saved under build/fuzz/crashes/<harness>/).
# Corpora: build/fuzz/corpus/<harness> (grows across runs, never committed), the seeds written by
# make_seeds, and dev/fuzz/regressions/<harness> (committed inputs that once crashed; each is replayed
# first, at start-up).
# Usage: dev/fuzz/fuzz.sh SECONDS HARNESS...   (from the repository root)
set -uo pipefail
if [ $# -lt 2 ]; then echo "usage: $0 SECONDS HARNESS..." >&2; exit 2; fi
seconds=$1; shift
# -timeout: an input that takes this long is reported as a hang; -rss_limit_mb: libFuzzer's default,
# spelled out because it also caps a single allocation (a header that asks for gigabytes is a finding);
# -close_fd_mask=1: the readers' progress lines on stdout go nowhere (libFuzzer reports on stderr).
TIMEOUT_S=10
RSS_LIMIT_MB=2048
status=0
for h in "$@"; do
    bin=build/fuzz/fuzz_$h
    [ -x "$bin" ] || { echo "error: $bin not built (make fuzz-build)" >&2; exit 1; }
    mkdir -p "build/fuzz/corpus/$h" "build/fuzz/crashes/$h"
    dirs=("build/fuzz/corpus/$h" "build/fuzz/seeds/$h")
    [ -d "dev/fuzz/regressions/$h" ] && dirs+=("dev/fuzz/regressions/$h")
    log=build/fuzz/$h.log
    "$bin" -max_total_time="$seconds" -timeout=$TIMEOUT_S -rss_limit_mb=$RSS_LIMIT_MB -print_final_stats=1 -close_fd_mask=1 \
        -artifact_prefix="build/fuzz/crashes/$h/" "${dirs[@]}" >"$log" 2>&1
    rc=$?
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
    corpus=$(find "build/fuzz/corpus/$h" -type f | wc -l)
    if [ $rc -eq 0 ]; then
        printf 'fuzz %-10s ok      %10s executions in %ss, %s corpus inputs\n' "$h" "${execs:-?}" "$seconds" "$corpus"
    else
        printf 'fuzz %-10s FAILED  (exit %d) after %s executions; log: %s\n' "$h" $rc "${execs:-?}" "$log"
        grep -m1 -E '^==[0-9]+== ?ERROR|^fuzz: |runtime error' "$log"
        status=1
    fi
done
exit $status
