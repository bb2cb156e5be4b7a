"""Plot the FP8 statistics a run logged with --fp8-stats N, and print the worst layers at the last step.

    python scripts/plot_fp8_stats.py runs/cmp_fp8            # reads runs/cmp_fp8/fp8_stats.csv
    python scripts/plot_fp8_stats.py some/fp8_stats.csv --out stats.png

The CSV is train/logger.h's fp8_stats.csv: one row per FP8 GEMM operand and layer on each logged step,
`step,layer,gemm,operand,format,amax,scale,saturated_frac,underflow_frac`. amax is max|x| of the tensor
before the cast; saturated_frac is the fraction of its elements whose FP8 code is +-fp8_max (under
current scaling the amax element itself is one, so it is rarely 0) and underflow_frac the fraction of
non-zero elements the cast flushed to zero (fp8/fp8.h). When a (step, layer, gemm, operand) appears twice (a resumed
run appends), the later row wins.

The PNG has one column per GEMM (wqkv, wo, w13, w2) and, for each operand (W, X, dY), three rows: amax
(log scale), underflow fraction and saturation fraction (symlog scales, so that 0 stays visible), one
line per layer. The table printed gives, per (gemm, operand), the largest underflow and saturation
fraction over the layers at the last logged step, and the layer it occurs in.

Exit status 0, or 2 with a one-line message on stderr for bad input (missing file, wrong header,
malformed row, no rows) or an unwritable PNG.
"""
import argparse
import csv
import os
import sys

PROG = "plot_fp8_stats.py"
COLUMNS = ["step", "layer", "gemm", "operand", "format", "amax", "scale", "saturated_frac", "underflow_frac"]
GEMM_ORDER = ["wqkv", "wo", "w13", "w2"]
OPERAND_ORDER = ["W", "X", "dY"]
# Fractions of a tensor's elements: below this, a symlog axis is linear, so exact zeros are drawn.
FRACTION_LINEAR_BELOW = 1e-7


class InputError(Exception):
    """Bad input: the message names the file (and line) and is printed as one line."""


def resolve_csv(path):
    """fp8_stats.csv inside a run directory, or the path itself when it is a file."""
    if os.path.isdir(path):
        path = os.path.join(path, "fp8_stats.csv")
    if not os.path.isfile(path):
        raise InputError(f"{path}: no such file")
    return path


def read_stats(path):
    """Rows of fp8_stats.csv as dicts keyed by (step, layer, gemm, operand), in file order.

    Raises InputError naming the file and line for a header that is not the logger's, a row with the
    wrong number of fields, a non-integer step/layer, a non-numeric or negative amax, or a fraction
    outside [0, 1]; and when the file holds no rows.
    """
    try:
        with open(path, "r", newline="", encoding="utf-8", errors="replace") as f:
            rows = list(csv.reader(f))
    except OSError as e:
        raise InputError(f"{path}: {e.strerror}")
    if not rows or [c.strip() for c in rows[0]] != COLUMNS:
        raise InputError(f"{path}:1: header is not '{','.join(COLUMNS)}'")
    stats = {}
    for lineno, row in enumerate(rows[1:], start=2):
        if not row or (len(row) == 1 and not row[0].strip()):
            continue
        if len(row) != len(COLUMNS):
            raise InputError(f"{path}:{lineno}: malformed row: {len(row)} fields, expected {len(COLUMNS)}")
        record = dict(zip(COLUMNS, (c.strip() for c in row)))
        try:
            key = (int(record["step"]), int(record["layer"]), record["gemm"], record["operand"])
            values = {name: float(record[name]) for name in ("amax", "scale", "saturated_frac", "underflow_frac")}
        except ValueError:
            raise InputError(f"{path}:{lineno}: malformed row: {','.join(row)[:80]!r}")
        bad_fraction = not all(0.0 <= values[n] <= 1.0 for n in ("saturated_frac", "underflow_frac"))
        bad_amax = values["amax"] < 0.0  # NaN and inf are kept: a non-finite amax is what a bad step logs
        if not key[2] or not key[3] or bad_fraction or bad_amax:
            raise InputError(f"{path}:{lineno}: malformed row: {','.join(row)[:80]!r}")
        stats[key] = dict(values, format=record["format"])
    if not stats:
        raise InputError(f"{path}: no statistics rows (was the run started with --fp8-stats N and -p fp8?)")
    return stats


def ordered(names, preferred):
    """`names` with the known ones first in their usual order, then any others sorted."""
    return [n for n in preferred if n in names] + sorted(n for n in names if n not in preferred)


def worst_at_last_step(stats):
    """(last step, {(gemm, operand): (format, max underflow, its layer, max saturation, its layer, n layers)})."""
    last = max(key[0] for key in stats)
    table = {}
    for (step, layer, gemm, operand), v in sorted(stats.items()):
        if step != last:
            continue
        fmt, uf, uf_layer, sat, sat_layer, n = table.get((gemm, operand), (v["format"], -1.0, -1, -1.0, -1, 0))
        if v["underflow_frac"] > uf:
            uf, uf_layer = v["underflow_frac"], layer
        if v["saturated_frac"] > sat:
            sat, sat_layer = v["saturated_frac"], layer
        table[(gemm, operand)] = (fmt, uf, uf_layer, sat, sat_layer, n + 1)
    return last, table


def plot(out, stats, gemms, operands):
    """Write the grid: a column per GEMM, rows amax / underflow / saturation for each operand."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layers = sorted({key[1] for key in stats})
    metrics = (("amax", "amax"), ("underflow_frac", "underflow"), ("saturated_frac", "saturated"))
    n_rows = len(operands) * len(metrics)
    fig, axes = plt.subplots(n_rows, len(gemms), figsize=(4 * len(gemms), 2.1 * n_rows), sharex=True,
                             squeeze=False)
    cmap = plt.get_cmap("viridis")
    for col, gemm in enumerate(gemms):
        for o, operand in enumerate(operands):
            for m, (field, name) in enumerate(metrics):
                ax = axes[o * len(metrics) + m][col]
                for i, layer in enumerate(layers):
                    points = sorted((k[0], v[field]) for k, v in stats.items()
                                    if k[1] == layer and k[2] == gemm and k[3] == operand)
                    if field == "amax":  # a log axis cannot show amax 0 (an all-zero tensor)
                        points = [p for p in points if p[1] > 0]
                    if points:
                        color = cmap(i / max(1, len(layers) - 1))
                        ax.plot([p[0] for p in points], [p[1] for p in points], "o-", color=color,
                                markersize=2, linewidth=1, label=f"layer {layer}")
                if field == "amax":
                    ax.set_yscale("log")
                else:
                    ax.set_yscale("symlog", linthresh=FRACTION_LINEAR_BELOW)
                    ax.set_ylim(bottom=0)
                ax.grid(alpha=0.3)
                if o == 0 and m == 0:
                    ax.set_title(gemm)
                if col == 0:
                    ax.set_ylabel(f"{operand} {name}")
                if o == len(operands) - 1 and m == len(metrics) - 1:
                    ax.set_xlabel("step")
    handles, labels = axes[0][0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="upper right", fontsize="small")
    fig.suptitle("FP8 operands per GEMM: amax, underflow and saturation fractions (one line per layer)")
    fig.tight_layout(rect=(0, 0, 0.94, 0.98))
    try:
        fig.savefig(out, dpi=90)
    except OSError as e:
        raise InputError(f"{out}: cannot write the plot: {e.strerror or e}")
    finally:
        plt.close(fig)


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Plot fp8_stats.csv (amax, underflow and saturation fractions per GEMM, operand and "
                    "layer over the logged steps) and print, per (gemm, operand), the worst layer's "
                    "underflow and saturation fraction at the last logged step. Exit 2 on bad input.")
    parser.add_argument("path", metavar="RUN_DIR_or_CSV", help="run directory holding fp8_stats.csv, or the CSV")
    parser.add_argument("--out", help="PNG to write (default: fp8_stats.png beside the CSV)")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    path = resolve_csv(args.path)
    stats = read_stats(path)
    gemms = ordered({k[2] for k in stats}, GEMM_ORDER)
    operands = ordered({k[3] for k in stats}, OPERAND_ORDER)
    last, table = worst_at_last_step(stats)

    steps = sorted({k[0] for k in stats})
    print(f"{path}: {len(steps)} logged steps ({steps[0]}..{last}), {len({k[1] for k in stats})} layers")
    print(f"worst layer at step {last}:")
    header = f"{'gemm':<6} {'operand':<8} {'format':<7} {'underflow_frac':>14} {'layer':>5} {'saturated_frac':>14} {'layer':>5}"
    print(header)
    print("-" * len(header))
    for gemm in gemms:
        for operand in operands:
            if (gemm, operand) not in table:
                continue
            fmt, uf, uf_layer, sat, sat_layer, _ = table[(gemm, operand)]
            print(f"{gemm:<6} {operand:<8} {fmt:<7} {uf:>14.4e} {uf_layer:>5d} {sat:>14.4e} {sat_layer:>5d}")

    out = args.out or os.path.join(os.path.dirname(path), "fp8_stats.png")
    plot(out, stats, gemms, operands)
    print(f"plot: {out}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except InputError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        sys.exit(2)
