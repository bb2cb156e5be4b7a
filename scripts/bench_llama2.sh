#!/usr/bin/env bash
# Llama-2 7B or 13B throughput, bf16 then fp8 with identical settings chosen by the memory plan, one
# table beside the published numbers, bench.json and bench.png (scripts/bench_llama2.py has the details).
#   usage: scripts/bench_llama2.sh 7b|13b [NGPU] [--layers K] [--steps N] [--warmup N] [--gpu-mem GiB] [--out DIR] [--cpu]
#          [--grad-reduce fp32|bf16|fp8] [--optim-state fp32|bf16|fp8] [--grad-buffer fp32|bf16|fp8]
#          [--master-weights fp32|fp16]     (these four: the fp8 run's; bf16 stays the baseline)
#   e.g.   scripts/bench_llama2.sh 7b 8                 # 8 GPUs of one node
#          scripts/bench_llama2.sh 7b 1 --layers 4      # one GPU, a 7B-shaped model with 4 layers
#          scripts/bench_llama2.sh 7b --cpu --steps 4   # the CPU build on the tiny model (CI's smoke test)
set -euo pipefail
exec "${PYTHON:-python3}" "$(dirname "$0")/bench_llama2.py" "$@"
