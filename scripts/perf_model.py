"""Performance model of one llm8 training step: predicted tokens/s/GPU of Llama-2 7B and 13B, bf16 and fp8,
on one or two nodes of 8 H100 or H800 GPUs, op by op, and where the time goes.

    python3 scripts/perf_model.py                                  # assumed (datasheet) rates, the default table
    python3 scripts/perf_model.py --calibrate build/device_check   # rates measured by the device check
    python3 scripts/perf_model.py --models llama2-7b --gpus H100 --topologies 1x8 --json

The step is the trainer's own: `./train_llama_cpu --dry-run 2` lists every GEMM, kernel, collective, host
copy and sync of one optimizer step with its shape, bytes and FLOPs and the order they run in, and the GPU
build's `./train_llama --dry-run 1` plans its memory (both need `make`; neither needs a GPU). The model only
times them: GEMMs and attention at a fraction of the tensor-core peak, memory-bound ops at a fraction of
the HBM bandwidth, collectives by NCCL's ring (all-to-all for the FP8 wire) formulas over NVLink and
InfiniBand, overlapped with compute as the trainer's marks and waits allow (scripts/perf/step.py), with
the assumptions of scripts/perf/assumptions.py. Calibration: scripts/perf/calibration.py; the report:
scripts/perf/report.py; docs/performance.md#performance-model.

What the trainer decides is not a flag here: the weight gather's format (--weight-gather is gone: the
trainer's list says what it gathers) and recompute fitting (--recompute auto takes the cheapest -r its
memory plan fits; the model's own fitting, with its full:K plans the trainer does not have, is gone).

Exit status 0; 2 with a one-line message on stderr for bad flags, a binary not built, an op of the
trainer's list the model has no rate for, or unreadable calibration input.
"""
import argparse
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from perf import assumptions as A  # noqa: E402
from perf.calibration import parse_calibration, replaced_rates  # noqa: E402
from perf.calibration import measured_vs_predicted  # noqa: E402
from perf.report import grad_reduce_comparison, print_grad_reduce_comparison, print_report, what_it_takes  # noqa: E402
from perf.step import InputError, Rates, make_run, predict  # noqa: E402

PROG = "perf_model.py"


def parse_topology(text):
    m = re.fullmatch(r"(\d+)x(\d+)", text)
    if not m or int(m.group(1)) < 1 or int(m.group(2)) < 1:
        raise InputError(f"flag --topologies: '{text}' is not NODESxGPUS (e.g. 1x8, 2x8)")
    return int(m.group(1)), int(m.group(2))


def parse_args(argv):
    parts = __doc__.split("\n\n")
    p = argparse.ArgumentParser(prog=PROG, description=parts[0], epilog="\n\n".join(parts[2:4]),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="llama2-7b,llama2-13b", help="comma-separated presets of the trainer's -e")
    p.add_argument("--precisions", default="bf16,fp8", help="comma-separated: bf16, fp8")
    p.add_argument("--gpus", default="H100,H800", help=f"comma-separated, of {', '.join(A.GPUS)}")
    p.add_argument("--topologies", default="1x8,2x8", help="comma-separated NODESxGPUS_PER_NODE")
    p.add_argument("-b", "--micro-batch", type=int, default=A.DEFAULT_MICRO_BATCH, help="sequences per GPU per micro-step")
    p.add_argument("-t", "--seq-len", type=int, default=A.DEFAULT_SEQ_LEN)
    p.add_argument("--global-batch", type=int, default=A.DEFAULT_GLOBAL_BATCH_TOKENS, help="tokens per optimizer step")
    p.add_argument("--zero", default="auto", choices=["auto", "0", "1", "2"], help="auto: 1 for 7B, 2 for 13B")
    p.add_argument("--recompute", default="auto", choices=["auto", "0", "1", "2"],
                   help="the trainer's -r; auto: the cheapest with which the trainer's memory plan fits the GPU "
                        "(its 'cheapest_recompute'; the model no longer fits recompute itself)")
    p.add_argument("--grad-reduce", default="fp32", help="the trainer's --grad-reduce: fp32, bf16 or fp8")
    p.add_argument("--optim-state", default="fp32", help="the trainer's --optim-state: fp32, bf16 or fp8")
    p.add_argument("--grad-buffer", default="fp32", help="the trainer's --grad-buffer: fp32, bf16 or fp8")
    p.add_argument("--master-weights", default="fp32", help="the trainer's --master-weights: fp32 or fp16")
    p.add_argument("--no-overlap", action="store_true", help="collectives do not overlap compute")
    p.add_argument("--nics-per-node", type=int, default=A.DEFAULT_NICS_PER_NODE)
    p.add_argument("--nic-gbits", type=float, default=A.DEFAULT_NIC_GBITS, help="Gb/s per NIC")
    p.add_argument("--calibrate", nargs="+", metavar="PATH", help="device check logs: files or directories")
    p.add_argument("--measured-on", default="auto", choices=["auto", *A.GPUS], help="the GPU the calibration ran on")
    p.add_argument("--json", action="store_true", help="print JSON instead of the report")
    args = p.parse_args(argv)
    for flag, value in (("--micro-batch", args.micro_batch), ("--seq-len", args.seq_len),
                        ("--global-batch", args.global_batch), ("--nics-per-node", args.nics_per_node)):
        if value < 1:
            p.error(f"argument {flag}: {value} is not a positive integer")
    if not args.nic_gbits > 0:
        p.error(f"argument --nic-gbits: {args.nic_gbits} is not positive")
    return args


def split_list(flag, text, known=None):
    items = [x.strip() for x in text.split(",") if x.strip()]
    for x in items:
        if known is not None and x not in known:
            raise InputError(f"flag {flag}: unknown '{x}' (known: {', '.join(known)})")
    if not items:
        raise InputError(f"flag {flag}: empty list")
    return items


def main(argv=None):
    args = parse_args(argv)
    try:
        models = split_list("--models", args.models)
        precisions = split_list("--precisions", args.precisions, ("bf16", "fp8"))
        gpus = split_list("--gpus", args.gpus, A.GPUS)
        topologies = [parse_topology(t.strip()) for t in args.topologies.split(",") if t.strip()]
        calibration = parse_calibration(args.calibrate, args.measured_on) if args.calibrate else None
        calibrated = calibration if calibration is not None and calibration.device is not None else None

        def rates_for(gpu):
            return Rates(A.GPUS[gpu], calibrated)

        results = [predict(make_run(args, m, p, g, nodes, per_node), rates_for(g))
                   for g in gpus for m in models for nodes, per_node in topologies for p in precisions]
        comparison = measured_vs_predicted(calibration) if calibration is not None else []
        takes = what_it_takes(args, rates_for)
        reductions = grad_reduce_comparison(args, rates_for)
    except InputError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2
    if args.json:
        out = {"assumptions": A.summary(), "predictions": results, "measured_vs_predicted": comparison,
               "what_it_takes": takes, "grad_reduce_comparison": reductions}
        if calibration is not None:
            out["calibration"] = {"device": calibration.device,
                                  "files": [{"path": p, "found": f} for p, f in calibration.files],
                                  "replaced": replaced_rates(calibration)}
        json.dump(out, sys.stdout, indent=1)
        print()
    else:
        print_report(results, calibration, comparison, takes, args)
        print_grad_reduce_comparison(reductions)
    return 0


if __name__ == "__main__":
    sys.exit(main())
