#!/usr/bin/env bash
# Inside a Slurm allocation: starts ./train_llama on every task with srun --mpi=pmix when Slurm has
# PMIx (one rank per task; --kill-on-bad-exit=1 so a dead rank ends the job), else with mpirun across the
# allocation's nodes. Resumes automatically (-y 1) when the run folder (-o) already holds a checkpoint.
# Preemption: the sbatch files ask Slurm for SIGUSR1 120 s before the time limit (--signal); the trainer
# then checkpoints and exits with status 75, and this script requeues the job (--requeue), which resumes.
# srun exports this environment to every task (--export=ALL, Slurm's default, said explicitly): NCCL_*,
# OMP_NUM_THREADS and OPENBLAS_* reach every rank, as scripts/launch.sh forwards them under mpirun.
# Used by the train_*.sbatch files.
set -euo pipefail
[ -n "${SLURM_JOB_ID:-}" ] || { echo "error: not inside a Slurm allocation (use sbatch)" >&2; exit 2; }
args=("$@")
out=""
for ((i = 0; i < ${#args[@]} - 1; i++)); do [ "${args[i]}" = "-o" ] && out=${args[i + 1]}; done
if [ -n "$out" ] && compgen -G "$out/DONE_*" >/dev/null; then
    echo "run.sh: $out holds a checkpoint: resuming (-y 1)" >&2
    args+=(-y 1)
fi
EXIT_PREEMPTED=75
rc=0
if srun --mpi=list 2>&1 | grep -qw pmix; then
    srun --mpi=pmix --kill-on-bad-exit=1 --export=ALL ./train_llama "${args[@]}" || rc=$?
else
    hostfile=$(mktemp)
    scontrol show hostnames "$SLURM_JOB_NODELIST" | sed "s/\$/ slots=${SLURM_NTASKS_PER_NODE:-8}/" > "$hostfile"
    bash scripts/launch.sh "$hostfile" "${SLURM_NTASKS_PER_NODE:-8}" -- ./train_llama "${args[@]}" || rc=$?
fi
if [ "$rc" -eq "$EXIT_PREEMPTED" ]; then
    echo "run.sh: checkpointed after a stop signal: requeueing job $SLURM_JOB_ID" >&2
    scontrol requeue "$SLURM_JOB_ID"
fi
exit "$rc"
