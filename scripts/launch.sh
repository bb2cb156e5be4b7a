#!/usr/bin/env bash
# Starts a data-parallel llm8 job with Open MPI's mpirun: one rank per GPU, GPUS_PER_NODE ranks on each host
# of the hostfile (docs/cluster.md). MPI only bootstraps the job; the GPUs talk through NCCL.
#
#   scripts/launch.sh HOSTFILE [GPUS_PER_NODE] -- ./train_llama ARGS...
#       HOSTFILE        one host per line ("node01 slots=8"); the binary, data and -o must be on a
#                       file system every host sees at the same path
#       GPUS_PER_NODE   ranks per host (default 8)
#   example: scripts/launch.sh hosts.txt 8 -- ./train_llama -e llama2-7b -b 1 -t 4096 -d 524288 -z 1 \
#                -i "data/fineweb_train_*.bin" -j "data/fineweb_val_*.bin" -o runs/7b
#
# Forwarded to every rank: every NCCL_*, LLM8_* and OPENBLAS_* variable set here (the CPU build's BLAS
# kernel follows OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE, and ranks that run other kernels compute other
# bits: the trainer refuses to start them), OMP_NUM_THREADS, PATH and LD_LIBRARY_PATH (remote ranks start
# with ssh's bare environment otherwise). Binding is left to the
# trainer (--bind-to none): each rank picks its GPU by its local rank. Extra mpirun options: MPIRUN_ARGS.
set -euo pipefail
[ $# -ge 3 ] || { sed -n '2,16p' "$0"; exit 2; }
hostfile=$1
shift
per_node=8
if [ "$1" != "--" ]; then
    per_node=$1
    shift
fi
[ "${1:-}" = "--" ] || { echo "error: expected -- before the trainer command (see $0)" >&2; exit 2; }
shift
[ -r "$hostfile" ] || { echo "error: hostfile $hostfile: cannot read" >&2; exit 2; }
[[ "$per_node" =~ ^[1-9][0-9]*$ ]] || { echo "error: GPUS_PER_NODE must be a positive integer, got '$per_node'" >&2; exit 2; }
command -v mpirun >/dev/null || { echo "error: mpirun not found (Open MPI: apt-get install openmpi-bin)" >&2; exit 2; }

hosts=$(grep -cvE '^[[:space:]]*(#|$)' "$hostfile")
forward=(-x PATH -x LD_LIBRARY_PATH)
[ -n "${OMP_NUM_THREADS:-}" ] && forward+=(-x OMP_NUM_THREADS)
for var in $(compgen -e | grep -E '^(NCCL|LLM8|OPENBLAS)_' || true); do forward+=(-x "$var"); done
root=()
[ "$(id -u)" = 0 ] && root=(--allow-run-as-root)

echo "launch: $hosts host(s) x $per_node rank(s) = $((hosts * per_node)) ranks; forwarding ${forward[*]}" >&2
exec mpirun "${root[@]}" --hostfile "$hostfile" -np "$((hosts * per_node))" --map-by "ppr:${per_node}:node" --bind-to none \
    "${forward[@]}" ${MPIRUN_ARGS:-} "$@"
