#!/usr/bin/env bash
# Loss of fp8 with exact accumulation, fp8 with the Hopper model (fast accumulation on and off) and bf16
# on the same short run (docs/precision.md's "FP8 accumulation" loss table; a measurement, not a test). The
# Hopper model has no BLAS, so keep runs short: with the defaults (stories42m's widths, 2 of its 8
# layers, 48 steps of 256 tokens) a hopper run takes ~10 minutes of one core.
#   usage: dev/fp8_accum_runs.sh OUT_DIR [extra train_llama_cpu flags, e.g. -i/-j of another corpus]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: dev/fp8_accum_runs.sh OUT_DIR [train_llama_cpu flags]}
shift
common=(-e stories42m --n-layers 2 -b 4 -t 64 -x 48 -u 4 -v 12 -m 4 -n -1 --seed 1337 "$@")
declare -A runs=([exact]="-p fp8" [hopper_fast]="-p fp8 --fp8-accum hopper --fp8-fast-accum 1"
                 [hopper_slow]="-p fp8 --fp8-accum hopper --fp8-fast-accum 0" [bf16]="-p bf16")
mkdir -p "$out"
for name in "${!runs[@]}"; do
    # one thread each, all four at once: the results do not depend on the thread count
    # shellcheck disable=SC2086
    OMP_NUM_THREADS=1 nice -n 10 ./train_llama_cpu "${common[@]}" ${runs[$name]} -o "$out/$name" > "$out/$name.out" 2>&1 &
done
wait
echo "train_llama_cpu ${common[*]}, then:"
for name in exact hopper_fast hopper_slow bf16; do echo "  $name: ${runs[$name]}"; done
python3 - "$out" <<'EOF'
import sys
from pathlib import Path
out = Path(sys.argv[1])
names = ["exact", "hopper_fast", "hopper_slow", "bf16"]
val = {n: {int(l.split()[0][2:]): float(l.split("tel:")[1]) for l in (out / n / "main.log").read_text().splitlines() if "tel:" in l}
       for n in names}
print("| step | val loss: fp8 exact | fp8 hopper, fast accum | fp8 hopper, no fast accum | bf16 |")
print("|---|---|---|---|---|")
for s in sorted(val["exact"]):
    print(f"| {s} | " + " | ".join(f"{val[n][s]:.6f}" for n in names) + " |")
EOF
