"""Plot the FP8 safety net of a run: the shadow checks' FP8-vs-BF16 difference, fallbacks and alerts.

    python scripts/plot_shadow.py runs/shadow                  # reads runs/shadow/metrics.jsonl
    python scripts/plot_shadow.py runs/shadow --tolerance 0.01 --out shadow.png

The input is train/logger.h's metrics.jsonl (docs/checkpoints.md) of a run started with
--shadow-every K: step objects (`loss`, `linears`: the recipe the block linears ran), shadow checks
(`shadow_loss_fp8`, `shadow_loss_bf16`, `shadow_rel_diff`, `shadow_over_tol`, `shadow_ms`,
`shadow_share`, and with --shadow-grad 1 `grad_cosine`, `grad_norm_rel_diff`, `grad_worst_layer`,
`grad_worst_cosine`), policy events (`event`: fallback or recover, `reason`) and FP8 alerts (`alert`,
`layer`, `gemm`, `operand`, `value`, `threshold`). An object repeated for the same step (and operand)
counts once, the later one winning.

The summary printed: the checks, their relative loss difference |fp8 - bf16| / |bf16| (mean, median,
largest and its step, last), the checks over the run's tolerance, the gradient cosines when compared,
the cost of the checks, the fallbacks and the BF16 steps, and the alerts per operand. The PNG has the
train loss with the BF16 stretches shaded and the events marked, the relative loss difference of every
check (log scale; over the tolerance in red, alerts as vertical lines) and, with gradients, 1 - cosine
for the whole model and the worst block.

Exit status 0, or 2 with a one-line message on stderr for bad input (missing file, a line that is not a
JSON object with an integer step, no shadow checks) or an unwritable PNG.
"""
import argparse
import json
import os
import sys

import numpy as np

from compare_loss import InputError, non_negative_float, read_lines, resolve_run_file, save_figure

PROG = "plot_shadow.py"

def read_metrics(path):
    """(steps, checks, events, alerts): dicts keyed by step (alerts by step and operand) of the objects.

    Raises InputError naming the file and line for a line that is not a JSON object with an integer
    "step", and when the file holds no shadow check.
    """
    steps, checks, events, alerts = {}, {}, {}, {}
    for lineno, line in enumerate(read_lines(path), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            row = None
        if not isinstance(row, dict) or not isinstance(row.get("step"), int):
            shown = line if len(line) <= 60 else line[:57] + "..."
            raise InputError(f"{path}:{lineno}: not a metrics object with an integer step: {shown!r}")
        step = row["step"]
        if "loss" in row:
            steps[step] = row
        elif "shadow_rel_diff" in row:
            checks[step] = row
        elif "event" in row:
            events[step] = row
        elif "alert" in row:
            alerts[(step, row.get("layer"), row.get("gemm"), row.get("operand"), row["alert"])] = row
    if not checks:
        raise InputError(f"{path}: no shadow checks (was the run started with --shadow-every K?)")
    return steps, checks, events, alerts


def as_float(value):
    """A JSON number, or NaN for null (the logger writes non-finite values as null)."""
    return float("nan") if value is None else float(value)


def bf16_stretches(steps):
    """[(first, last)] of the runs of consecutive steps whose block linears ran BF16 in an fp8 run."""
    stretches, start = [], None
    ordered = sorted(steps)
    for i, s in enumerate(ordered):
        bf16 = steps[s].get("linears") == "bf16"
        if bf16 and start is None:
            start = s
        last = i + 1 == len(ordered) or steps[ordered[i + 1]].get("linears") != "bf16" or ordered[i + 1] != s + 1
        if bf16 and last:
            stretches.append((start, s))
            start = None
    return stretches


def summarize(steps, checks, events, alerts):
    """The summary's lines (see the module docstring)."""
    order = sorted(checks)
    rel = np.array([as_float(checks[s]["shadow_rel_diff"]) for s in order])
    finite = rel[np.isfinite(rel)]
    worst = int(np.nanargmax(rel)) if finite.size else 0
    lines = [f"shadow checks: {len(order)} (steps {order[0]}..{order[-1]})"]
    if finite.size:
        lines.append(f"relative loss difference |fp8 - bf16| / |bf16|: mean {finite.mean():.3e}, median {np.median(finite):.3e}, "
                     f"max {rel[worst]:.3e} at step {order[worst]}, last {rel[-1]:.3e} at step {order[-1]}")
    if finite.size < rel.size:
        lines.append(f"non-finite differences: {rel.size - finite.size} check(s)")
    over = [s for s in order if checks[s].get("shadow_over_tol")]
    lines.append(f"over the tolerance: {len(over)} check(s)" + (f" (steps {', '.join(map(str, over))})" if over else ""))
    if all("grad_cosine" in checks[s] for s in order):
        cos = np.array([as_float(checks[s]["grad_cosine"]) for s in order])
        wc = np.array([as_float(checks[s]["grad_worst_cosine"]) for s in order])
        i, j = int(np.nanargmin(cos)), int(np.nanargmin(wc))
        lines.append(f"gradient cosine: mean {np.nanmean(cos):.6f}, min {cos[i]:.6f} at step {order[i]}; "
                     f"worst block {checks[order[j]]['grad_worst_layer']}: {wc[j]:.6f} at step {order[j]}")
    ms = np.array([float(checks[s]["shadow_ms"]) for s in order])
    lines.append(f"cost: {ms.mean():.1f} ms per check on average, {100 * float(checks[order[-1]]['shadow_share']):.2f}% "
                 f"of the step time up to the last check")
    for s in sorted(events):
        lines.append(f"{events[s]['event']} after step {s}: {events[s].get('reason', '')}")
    bf16 = sum(last - first + 1 for first, last in bf16_stretches(steps))
    lines.append(f"steps with the block linears in BF16: {bf16} of {len(steps)}")
    per_operand = {}
    for (s, layer, gemm, operand, kind) in sorted(alerts, key=lambda k: (k[0], str(k[1:]))):
        per_operand.setdefault(f"{gemm}[layer {layer}] {operand} {kind}", []).append(s)
    lines.append(f"alerts: {len(alerts)}")
    for name, where in per_operand.items():
        lines.append(f"  {name}: {len(where)} at steps {', '.join(map(str, where))}")
    return lines


def plot(out, steps, checks, events, alerts, tolerance):
    """Write the PNG (see the module docstring)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    grads = all("grad_cosine" in c for c in checks.values())
    fig, axes = plt.subplots(3 if grads else 2, 1, figsize=(9, 10 if grads else 7.5), sharex=True)
    ax = axes[0]
    order = sorted(steps)
    ax.plot(order, [as_float(steps[s]["loss"]) for s in order], color="tab:blue", linewidth=1, label="train loss")
    for i, (first, last) in enumerate(bf16_stretches(steps)):
        ax.axvspan(first - 0.5, last + 0.5, color="tab:orange", alpha=0.25, label="block linears in BF16" if i == 0 else None)
    for s, e in sorted(events.items()):
        ax.axvline(s + 0.5, color="tab:red" if e["event"] == "fallback" else "tab:green", linestyle="--", linewidth=1)
    ax.set_ylabel("train loss")
    ax.legend()
    ax.grid(alpha=0.3)
    ax = axes[1]
    cs = sorted(checks)
    rel = np.array([as_float(checks[s]["shadow_rel_diff"]) for s in cs])
    over = np.array([bool(checks[s].get("shadow_over_tol")) for s in cs])
    ax.plot(cs, rel, "o-", color="tab:purple", markersize=3, label="|fp8 - bf16| / |bf16|, first micro-batch")
    if over.any():
        ax.plot(np.array(cs)[over], rel[over], "o", color="tab:red", markersize=5, label="over the tolerance")
    if tolerance is not None:
        ax.axhline(tolerance, color="black", linestyle="--", linewidth=1, label=f"tolerance {tolerance:g}")
    for i, key in enumerate(sorted(alerts)):
        ax.axvline(key[0], color="tab:orange", alpha=0.5, linewidth=1, label="FP8 alert" if i == 0 else None)
    if np.any(rel > 0):
        ax.set_yscale("log")
    ax.set_ylabel("relative loss difference")
    ax.legend()
    ax.grid(alpha=0.3)
    if grads:
        ax = axes[2]
        ax.plot(cs, [1 - as_float(checks[s]["grad_cosine"]) for s in cs], "o-", markersize=3, label="whole model")
        ax.plot(cs, [1 - as_float(checks[s]["grad_worst_cosine"]) for s in cs], "o-", markersize=3, label="worst block")
        ax.set_yscale("log")
        ax.set_ylabel("1 - gradient cosine")
        ax.legend()
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("step")
    fig.suptitle("FP8 shadow checks against BF16")
    fig.tight_layout()
    save_figure(fig, out)


def main(argv=None):
    parser = argparse.ArgumentParser(prog=PROG, description="Summarize and plot the shadow checks, fallbacks and "
                                                            "FP8 alerts of a run's metrics.jsonl.")
    parser.add_argument("run", help="run directory (holding metrics.jsonl) or a metrics.jsonl file")
    parser.add_argument("--out", help="PNG to write (default: shadow.png beside metrics.jsonl)")
    parser.add_argument("--tolerance", type=non_negative_float, help="draw this --shadow-tol on the difference panel")
    args = parser.parse_args(argv)
    path = resolve_run_file(args.run, "metrics.jsonl")
    steps, checks, events, alerts = read_metrics(path)
    print(f"run: {path}")
    for line in summarize(steps, checks, events, alerts):
        print(line)
    out = args.out or os.path.join(os.path.dirname(path), "shadow.png")
    plot(out, steps, checks, events, alerts, args.tolerance)
    print(f"plot: {out}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except InputError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        sys.exit(2)
