#!/usr/bin/env python3
"""
Llama-2 7B / 13B throughput, bf16 against fp8 (scripts/bench_llama2.sh is the entry point).

Both precisions run back to back with identical settings: sequence 4096, NeMo's global batch (128 x 4096
tokens), micro-batch 1, and the lowest ZeRO stage and the cheapest recompute level with which the bf16
run (the larger one) fits the GPUs, as the trainer's memory plan (--dry-run 1) says; synthetic tokens;
the first --warmup steps (cuBLASLt heuristics, cuDNN plans) and any skipped step are left out of the
means. It prints one table: tokens/s per GPU, TFLOP/s per GPU and MFU by llm.c's FLOP count (6N + 12LCT)
and by Megatron's (Narayanan et al. 2021, adapted to SwiGLU/GQA; both from scripts/perf/step.py), peak
memory, and fp8/bf16, beside the published numbers; and writes bench.json and bench.png (matplotlib) to
--out. While a run trains, a progress line gives its step and the ETA of the whole benchmark.

--cpu runs the same on train_llama_cpu with the `tiny` model and short sequences: the CI smoke test of
this script (no GPU numbers mean anything there; MFU is not reported).
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]


sys.path.insert(0, str(REPO / "scripts"))
from perf.assumptions import GPUS  # noqa: E402
from perf.calibration import DEVICE_NAME  # noqa: E402
from perf.step import MODEL_LINE, flops_per_token_llmc, flops_per_token_megatron, peak_flops  # noqa: E402

PRESETS = {"7b": "llama2-7b", "13b": "llama2-13b"}
SEQ_LEN = 4096
GLOBAL_BATCH_TOKENS = 128 * 4096  # NeMo's Llama-2 7B/13B runs: 128 sequences of 4096
# The CPU smoke run: the CI model, short sequences, a small global batch.
CPU_MODEL, CPU_SEQ_LEN, CPU_GLOBAL_SEQS = "tiny", 64, 4
# Published rows. NeMo 24.07 performance summary: Llama-2 7B, FP8, 8 x H100, GBS 128, seq 4096:
# 16,600-16,900 tokens/s/GPU. Colossal-AI (HPC-AI Tech, FP8 mixed precision, 2024): FP8 over BF16 on
# 8 x H800: +35% (7B), +39% (13B).
PUBLISHED = [
    {"source": "NeMo 24.07", "model": "7b", "gpus": "8x H100", "precision": "fp8", "tokens_per_s_per_gpu": [16600, 16900]},
    {"source": "Colossal-AI", "model": "7b", "gpus": "8x H800", "speedup": 1.35},
    {"source": "Colossal-AI", "model": "13b", "gpus": "8x H800", "speedup": 1.39},
]
STEP_LINE = re.compile(r"^step\s+(\d+)/(\d+) \|.*\| ([0-9.]+) ms \|")
SHARD_MAGIC, SHARD_VERSION, HEADER_INTS = 20240520, 1, 256
VOCAB, BOS = 32000, 1
DOC_TOKENS = 1024  # a BOS every this many tokens: documents, as real data has
ZERO_OF = {"7b": 1, "13b": 2}  # the stages multi-GPU runs use at most (docs/design.md#targets)


def fail(message):
    print(f"bench_llama2: error: {message}", file=sys.stderr)
    sys.exit(1)


def write_shard(path, tokens, seed):
    """llm.c's shard format (docs/formats.md "Token shards"): random tokens in [3, V), a BOS every DOC_TOKENS."""
    data = np.random.default_rng(seed).integers(3, VOCAB, size=tokens).astype(np.uint16)
    data[::DOC_TOKENS] = BOS
    header = np.zeros(HEADER_INTS, dtype=np.int32)
    header[:3] = [SHARD_MAGIC, SHARD_VERSION, tokens]
    path.write_bytes(header.tobytes() + data.tobytes())


def dry_run(binary, flags):
    r = subprocess.run([str(binary), "--dry-run", "1", *map(str, flags)], capture_output=True, text=True)
    if r.returncode != 0:
        fail(f"memory plan failed: {r.stderr.strip()}")
    return json.loads(r.stdout.strip().splitlines()[-1][len("plan: "):])


def choose_settings(binary, base, gpus, model_key, gpu_mem, levels, grad_buffer):
    """The lowest ZeRO stage (up to ZERO_OF's for the model) and the cheapest recompute with which both
    precisions fit one GPU at micro-batch 1, per the memory plan (bf16 needs at least fp8's memory);
    levels: each precision's extra trainer flags. A bf16/fp8 --grad-buffer (the fp8 run's) takes only the
    stages the trainer allows it: ZeRO-1, or ZeRO-0 on one GPU."""
    memory = ["--gpu-mem", gpu_mem] if gpu_mem else []
    stages = [0] if gpus == 1 else list(range(ZERO_OF[model_key] + 1))
    if grad_buffer != "fp32":
        stages = [z for z in stages if z == 1 or (z == 0 and gpus == 1)]
    for zero in stages:
        plans = {p: dry_run(binary, [*base, "-p", p, *levels[p], "--ranks", gpus, "-z", zero, *memory]) for p in ("bf16", "fp8")}
        if plans["bf16"]["memory_gib"] == 0:
            fail("no GPU found to plan against: give --gpu-mem GiB")
        recompute = max(plan["cheapest_recompute"] for plan in plans.values())
        if min(plan["cheapest_recompute"] for plan in plans.values()) >= 0:
            return zero, recompute, plans
    fail(f"micro-batch 1 fits no ZeRO stage up to {stages[-1]} with any recompute level on {gpus} GPU(s)")


def launcher(gpus):
    if gpus == 1:
        return []
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        fail(f"{gpus} GPUs need mpirun (make setup installs Open MPI)")
    return [mpirun, "--bind-to", "none", "-np", str(gpus), *(["--oversubscribe"] if os.geteuid() == 0 else [])]


def format_eta(seconds):
    seconds = int(max(seconds, 0))
    return f"{seconds // 60}m{seconds % 60:02d}s"


def run_training(cmd, label, steps, runs_left, env):
    """Runs the trainer, echoing a progress line with the ETA of this run and of the benchmark (each later
    run taken as long as this one); returns (exit status, peak RSS of the process in bytes, its output)."""
    start = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1, env=env)
    lines, tty = [], sys.stdout.isatty()
    for line in proc.stdout:
        lines.append(line)
        m = STEP_LINE.match(line)
        if not m:
            continue
        done, total = int(m.group(1)), int(m.group(2))
        per_step = (time.time() - start) / done
        eta_run = per_step * (total - done)
        eta_all = eta_run + runs_left * per_step * steps
        text = f"  {label}: step {done}/{total}, {float(m.group(3)):.0f} ms/step, ETA {format_eta(eta_run)} (benchmark {format_eta(eta_all)})"
        print(f"\r{text}   " if tty else text, end="" if tty else "\n", flush=True)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.stdout.close()
    if tty:
        print()
    return os.waitstatus_to_exitcode(status), usage.ru_maxrss * 1024, "".join(lines)


def shape_of(output):
    """The model the trainer printed (| model: dim ..., the same line perf_model.py's calibration reads)."""
    for line in output.splitlines():
        m = MODEL_LINE.match(line)
        if m:
            return tuple(map(int, m.groups()))  # (C, L, NH, NKV, F, V)
    fail("the trainer's output has no '| model:' line")


def measure(run_dir, warmup, gpus):
    """Means over the steps after the first `warmup` that were not skipped (metrics.jsonl)."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "loss" in r]
    kept = [r for r in steps[warmup:] if not r["skipped"]]
    if not kept:
        fail(f"{run_dir}: no step left after {warmup} warm-up step(s) and skipped ones")
    return {
        "steps_measured": [r["step"] for r in kept],
        "tokens_per_s_per_gpu": float(np.mean([r["tokens_per_s"] for r in kept])) / gpus,
        "step_ms": float(np.mean([r["ms"] for r in kept])),
        "peak_device_mib": max(r["mem_mib"] for r in steps),
    }


def gpu_peak(output, precision):
    """The datasheet peak of the GPU the trainer reported (| device: NVIDIA H100 ...), or None."""
    m = DEVICE_NAME.search(output)
    return peak_flops(GPUS[m.group(1)], precision) if m else None


def table(results, model_key, gpus):
    header = ["run", "GPUs", "prec", "B", "accum", "ZeRO", "-r", "tok/s/GPU", "TFLOP/s/GPU", "MFU llm.c", "MFU Megatron",
              "peak mem GiB", "fp8/bf16"]
    rows = []
    for r in results:
        mfu = lambda key: f"{r[key]:.1%}" if r[key] is not None else "-"
        rows.append(["llm8", str(gpus), r["precision"], str(r["B"]), str(r["grad_accum"]), str(r["zero"]), str(r["recompute"]),
                     f"{r['tokens_per_s_per_gpu']:,.0f}", f"{r['tflops_per_gpu_llmc']:.1f}", mfu("mfu_llmc"),
                     mfu("mfu_megatron"), f"{r['peak_memory_gib']:.1f}", f"{r['speedup']:.2f}x" if "speedup" in r else ""])
    for p in PUBLISHED:
        if p["model"] != model_key:
            continue
        toks = "-".join(f"{t:,}" for t in p["tokens_per_s_per_gpu"]) if "tokens_per_s_per_gpu" in p else "-"
        rows.append([p["source"] + " (published)", p["gpus"], p.get("precision", "fp8/bf16"), "", "", "", "", toks, "", "", "", "",
                     f"{p['speedup']:.2f}x" if "speedup" in p else ""])
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header)]
    line = lambda cells: "| " + " | ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths))) + " |"
    print(line(header))
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in rows:
        print(line(row))


def chart(results, model_key, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4))
    names = [r["precision"] for r in results]
    values = [r["tokens_per_s_per_gpu"] for r in results]
    ax.bar(names, values, color=["#4c72b0", "#dd8452"])
    for p in PUBLISHED:
        if p["model"] == model_key and "tokens_per_s_per_gpu" in p:
            lo, hi = p["tokens_per_s_per_gpu"]
            ax.axhspan(lo, hi, color="grey", alpha=0.3, label=f"{p['source']} {p['precision']} {p['gpus']}")
    ax.set_ylabel("tokens/s per GPU")
    ax.set_title(f"llm8 {results[0]['model']}: bf16 vs fp8 ({results[-1].get('speedup', 0):.2f}x)")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", choices=sorted(PRESETS), help="Llama-2 size: whose published rows to print, and (GPU) the preset")
    ap.add_argument("gpus", nargs="?", type=int, default=1, help="GPUs (ranks) to train on; more than 1 needs mpirun")
    ap.add_argument("--layers", type=int, default=0, help="fewer layers than the preset (one GPU too small for it)")
    ap.add_argument("--steps", type=int, default=12, help="optimizer steps per precision")
    ap.add_argument("--warmup", type=int, default=2, help="first steps left out of the means")
    ap.add_argument("--global-batch", type=int, default=0,
                    help=f"tokens per optimizer step (default {GLOBAL_BATCH_TOKENS}, NeMo's; --cpu: {CPU_GLOBAL_SEQS} sequences)")
    ap.add_argument("--gpu-mem", type=float, default=0.0, help="GiB per GPU to plan against (default: the device's)")
    ap.add_argument("--out", type=Path, default=None, help="output folder (default build/bench_llama2_<model>)")
    ap.add_argument("--cpu", action="store_true", help="train_llama_cpu, tiny model (smoke test of this script)")
    ap.add_argument("--grad-reduce", default="fp32", choices=["fp32", "bf16", "fp8"],
                    help="the fp8 run's gradient reduction (FP8-LM/MS-AMP O1: fp8); the bf16 run keeps fp32")
    ap.add_argument("--optim-state", default="fp32", choices=["fp32", "bf16", "fp8"],
                    help="the fp8 run's AdamW moments (MS-AMP O2: fp8); the bf16 run keeps fp32")
    ap.add_argument("--grad-buffer", default="fp32", choices=["fp32", "bf16", "fp8"],
                    help="the fp8 run's accumulated gradients (MS-AMP O1: fp8; ZeRO-1, or ZeRO-0 on one GPU, which "
                         "both runs then use); the bf16 run keeps fp32")
    ap.add_argument("--master-weights", default="fp32", choices=["fp32", "fp16"],
                    help="the fp8 run's master weights (MS-AMP O3: fp16); the bf16 run keeps fp32")
    args = ap.parse_args()
    if args.gpus < 1:
        ap.error("argument gpus: must be at least 1")
    if args.steps <= args.warmup:
        ap.error(f"argument --steps: {args.steps} leaves no step after --warmup {args.warmup}")
    binary = REPO / ("train_llama_cpu" if args.cpu else "train_llama")
    if not binary.exists():
        fail(f"{binary.name} is not built: run `make {binary.name}`")
    out = args.out or REPO / "build" / f"bench_llama2_{args.model}{'_cpu' if args.cpu else ''}"
    out.mkdir(parents=True, exist_ok=True)
    T = CPU_SEQ_LEN if args.cpu else SEQ_LEN
    global_tokens = args.global_batch or (CPU_GLOBAL_SEQS * T if args.cpu else GLOBAL_BATCH_TOKENS)
    if global_tokens % (T * args.gpus) != 0:
        ap.error(f"argument --global-batch: {global_tokens} tokens is not a multiple of T {T} x {args.gpus} GPU(s)")
    model = CPU_MODEL if args.cpu else PRESETS[args.model]
    base = ["-e", model, "-b", 1, "-t", T, "-d", global_tokens, *(["--n-layers", args.layers] if args.layers else [])]
    # the FP8-LM levels apply to the fp8 run: bf16 stays the baseline the published speedups compare with
    levels = {"bf16": [], "fp8": ["--grad-reduce", args.grad_reduce, "--optim-state", args.optim_state,
                                  "--grad-buffer", args.grad_buffer, "--master-weights", args.master_weights]}
    zero, recompute, plans = choose_settings(binary, base, args.gpus, args.model, args.gpu_mem, levels, args.grad_buffer)
    print(f"bench_llama2: {model}{f' ({args.layers} layers)' if args.layers else ''}, T {T}, global batch {global_tokens} tokens, "
          f"{args.gpus} GPU(s): ZeRO-{zero}, -r {recompute}, {plans['bf16']['grad_accum']} micro-steps per step (memory plan: "
          f"bf16 {plans['bf16']['total_gib']:.1f} GiB, fp8 {plans['fp8']['total_gib']:.1f} GiB of {plans['bf16']['memory_gib']:.1f})")

    shard = out / "random_tokens.bin"
    write_shard(shard, (args.steps + 2) * global_tokens + 1, seed=1)
    env = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    results = []
    for i, precision in enumerate(["bf16", "fp8"]):
        run_dir = out / precision
        shutil.rmtree(run_dir, ignore_errors=True)
        cmd = [*launcher(args.gpus), str(binary), *map(str, base), "-p", precision, *levels[precision], "-z", str(zero), "-r", str(recompute),
               "-x", str(args.steps), "-v", "0", "-m", "1", "-u", "0", "-i", str(shard), "-j", str(shard), "-o", str(run_dir),
               "-n", "-1"]
        status, peak_rss, output = run_training(cmd, precision, args.steps, 1 - i, env)
        (out / f"train_{precision}.log").write_text(output)
        if status != 0:
            fail(f"{precision} run failed (exit {status}): see {out / f'train_{precision}.log'}")
        shape = shape_of(output)
        r = {"model": model, "precision": precision, "B": 1, "T": T, "grad_accum": plans[precision]["grad_accum"], "zero": zero,
             "recompute": recompute, "gpus": args.gpus, "planned_gib": plans[precision]["total_gib"], "run_dir": str(run_dir),
             "grad_reduce": args.grad_reduce if precision == "fp8" else "fp32",
             "optim_state": args.optim_state if precision == "fp8" else "fp32",
             "grad_buffer": args.grad_buffer if precision == "fp8" else "fp32",
             "master_weights": args.master_weights if precision == "fp8" else "fp32",
             "command": " ".join(cmd), **measure(run_dir, args.warmup, args.gpus)}
        flops = {"llmc": flops_per_token_llmc(shape, T), "megatron": flops_per_token_megatron(shape, T)}
        peak = gpu_peak(output, precision)
        for name, per_token in flops.items():
            achieved = per_token * r["tokens_per_s_per_gpu"]
            r[f"tflops_per_gpu_{name}"] = achieved / 1e12
            r[f"mfu_{name}"] = achieved / peak if peak else None
        # device memory in use (GPU), or the process's peak resident memory (CPU, one process)
        r["peak_memory_gib"] = r["peak_device_mib"] / 1024 if r["peak_device_mib"] > 0 else peak_rss / 2**30
        results.append(r)
    results[1]["speedup"] = results[1]["tokens_per_s_per_gpu"] / results[0]["tokens_per_s_per_gpu"]
    print()
    table(results, args.model, args.gpus)
    (out / "bench.json").write_text(json.dumps({"results": results, "published": PUBLISHED, "warmup_steps": args.warmup}, indent=2))
    chart(results, args.model, out / "bench.png")
    print(f"\nbench_llama2: wrote {out / 'bench.json'} and {out / 'bench.png'}")


if __name__ == "__main__":
    main()
