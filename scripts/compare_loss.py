"""Compare the loss curves of two training runs (typically FP8 against its BF16 baseline).

    python scripts/compare_loss.py runs/cmp_fp8 runs/cmp_bf16 --labels fp8 bf16

A and B are run directories (holding main.log) or main.log files, in llm.c's format: lines
`s:<step> trl:<train loss>` and `s:<step> tel:<val loss>` (other `key:value` fields on a line, such as
llm.c's `lr:` or `norm:`, are ignored). When a step appears twice (a resumed run appends to its log),
the later line wins. Only steps present in both runs are compared.

B is the baseline: the relative difference at a step is |A - B| / |B|. The train loss is noisy, so it
is first smoothed by a trailing moving average over --smooth aligned steps (fewer at the start); the
val loss is compared as logged. The runs agree when the FINAL val-loss relative difference and the
FINAL smoothed train-loss relative difference are both <= --tolerance (DESIGN.md section 9 asks for 1%).

Exit status: 0 within tolerance, 1 not within tolerance (a NaN counts as not within), 2 bad input
(missing file, malformed line, no aligned steps, unwritable plot), with a one-line message on stderr.
"""
import argparse
import os
import re
import sys

import numpy as np

PROG = "compare_loss.py"
STEP_FIELD = re.compile(r"s:(\d+)$")
KEY_VALUE_FIELD = re.compile(r"([A-Za-z_]+):(\S+)$")
TRAIN_KEY = "trl"
VAL_KEY = "tel"
# The relative-difference panel is linear below this fraction of the tolerance and logarithmic above.
REL_LINEAR_BELOW = 1e-3


class InputError(Exception):
    """Bad input: the message names the file (and line) and is printed as one line."""


def resolve_log(path):
    """main.log inside a run directory, or the path itself when it is a file."""
    if os.path.isdir(path):
        log = os.path.join(path, "main.log")
        if not os.path.isfile(log):
            raise InputError(f"{path}: no main.log in this run directory")
        return log
    if not os.path.isfile(path):
        raise InputError(f"{path}: no such file or directory")
    return path


def resolve_run_file(path, name):
    """The file `name` inside a run directory, or the path itself when it is a file."""
    if os.path.isdir(path):
        path = os.path.join(path, name)
    if not os.path.isfile(path):
        raise InputError(f"{path}: no such file")
    return path


def read_lines(path):
    """The lines of a text file; InputError naming it when it cannot be read."""
    try:
        with open(path, "r", encoding="utf-8", errors="replace") as f:
            return f.read().splitlines()
    except OSError as e:
        raise InputError(f"{path}: {e.strerror}")


def save_figure(fig, out):
    """Write a matplotlib figure as PNG and close it; InputError when `out` cannot be written."""
    import matplotlib.pyplot as plt
    try:
        fig.savefig(out, dpi=110)
    except OSError as e:
        raise InputError(f"{out}: cannot write the plot: {e.strerror or e}")
    finally:
        plt.close(fig)


def parse_main_log(path):
    """Read an llm.c main.log into ({step: train loss}, {step: val loss}); a later step overrides.

    Raises InputError naming the file and line for a line that is not `s:<step>` followed by one or
    more `key:<number>` fields. Blank lines are skipped; "nan"/"inf" values are kept as such.
    """
    train, val = {}, {}
    for lineno, line in enumerate(read_lines(path), start=1):
        fields = line.split()
        if not fields:
            continue
        step_match = STEP_FIELD.match(fields[0])
        pairs = [KEY_VALUE_FIELD.match(field) for field in fields[1:]]
        values = {}
        ok = step_match is not None and len(pairs) > 0 and all(pairs)
        if ok:
            try:
                values = {m.group(1): float(m.group(2)) for m in pairs}
            except ValueError:
                ok = False
        if not ok:
            shown = line if len(line) <= 60 else line[:57] + "..."
            raise InputError(f"{path}:{lineno}: malformed line {shown!r} "
                             f"(expected 's:<step> trl:<loss>' or 's:<step> tel:<loss>')")
        step = int(step_match.group(1))
        if TRAIN_KEY in values:
            train[step] = values[TRAIN_KEY]
        if VAL_KEY in values:
            val[step] = values[VAL_KEY]
    return train, val


def align(curve_a, curve_b):
    """(steps, a, b) over the steps present in both {step: loss} dicts, in increasing step order."""
    steps = np.array(sorted(set(curve_a) & set(curve_b)), dtype=np.int64)
    a = np.array([curve_a[s] for s in steps], dtype=np.float64)
    b = np.array([curve_b[s] for s in steps], dtype=np.float64)
    return steps, a, b


def moving_average(values, window):
    """Trailing mean over the last `window` entries (fewer at the start); a NaN spoils only its windows."""
    return np.array([values[max(0, i - window + 1):i + 1].mean() for i in range(len(values))])


def relative_difference(a, b):
    """|a - b| / |b| elementwise (b is the baseline); inf or NaN where b is 0."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.abs(a - b) / np.abs(b)


def worst(steps, rel):
    """(max relative difference, its step); a NaN anywhere is the worst, reported at its first step."""
    nan = np.isnan(rel)
    i = int(np.argmax(nan)) if nan.any() else int(np.argmax(rel))
    return float(rel[i]), int(steps[i])


def default_label(path, fallback):
    """The run directory's name (the parent directory for a main.log path)."""
    full = os.path.abspath(path)
    name = os.path.basename(full if os.path.isdir(full) else os.path.dirname(full))
    return name or fallback


def plot(out, labels, train, val, smooth, tolerance):
    """Write the three-panel PNG: train (raw faint + smoothed), val, relative difference."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t_steps, t_a, t_b, t_sa, t_sb, t_rel = train
    v_steps, v_a, v_b, v_rel = val
    fig, axes = plt.subplots(3, 1, figsize=(9, 11), sharex=True)
    colors = ("tab:red", "tab:blue")
    ax = axes[0]
    for raw, smoothed, label, color in ((t_a, t_sa, labels[0], colors[0]), (t_b, t_sb, labels[1], colors[1])):
        ax.plot(t_steps, raw, color=color, alpha=0.25, linewidth=0.8)
        ax.plot(t_steps, smoothed, color=color, linewidth=1.5, label=f"{label} (smoothed {smooth})")
    ax.set_ylabel("train loss")
    ax.legend()
    ax.grid(alpha=0.3)
    ax = axes[1]
    ax.plot(v_steps, v_a, "o-", color=colors[0], markersize=3, label=labels[0])
    ax.plot(v_steps, v_b, "o-", color=colors[1], markersize=3, label=labels[1])
    ax.set_ylabel("val loss")
    ax.legend()
    ax.grid(alpha=0.3)
    ax = axes[2]
    ax.plot(t_steps, t_rel, color="tab:purple", label=f"train (smoothed {smooth})")
    ax.plot(v_steps, v_rel, "o-", color="tab:green", markersize=3, label="val")
    ax.axhline(tolerance, color="black", linestyle="--", linewidth=1, label=f"tolerance {tolerance:g}")
    # symlog: differences span decades below the tolerance, and identical steps (0) must stay visible.
    ax.set_yscale("symlog", linthresh=(tolerance if tolerance > 0 else 1.0) * REL_LINEAR_BELOW)
    ax.set_ylim(bottom=0)
    ax.set_ylabel(f"|{labels[0]} - {labels[1]}| / |{labels[1]}|")
    ax.set_xlabel("step")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.suptitle(f"{labels[0]} vs {labels[1]} (baseline)")
    fig.tight_layout()
    save_figure(fig, out)


def positive_int(text):
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text}")
    return value


def non_negative_float(text):
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Compare the train and val loss curves of run A against baseline run B. "
                    "Relative difference = |A - B| / |B| (B is the baseline), per step, over the steps "
                    "present in both logs; the train loss is smoothed first. Exit 0 when the final val "
                    "and final smoothed train relative differences are both <= --tolerance, 1 when not, "
                    "2 on bad input.")
    parser.add_argument("a", metavar="A", help="run directory (holding main.log) or main.log of the run to check")
    parser.add_argument("b", metavar="B", help="run directory or main.log of the baseline run")
    parser.add_argument("--labels", nargs=2, metavar=("LABEL_A", "LABEL_B"),
                        help="names for A and B in the table and plot (default: the run directories' names)")
    parser.add_argument("--out", help="PNG to write (default: A/compare_loss.png when A is a directory, "
                                      "else compare_loss.png in the current directory)")
    parser.add_argument("--smooth", type=positive_int, default=20,
                        help="train-loss moving-average window, in aligned steps (default 20)")
    parser.add_argument("--tolerance", type=non_negative_float, default=0.01,
                        help="largest allowed final relative difference, val and smoothed train (default 0.01)")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    log_a, log_b = resolve_log(args.a), resolve_log(args.b)
    train_a, val_a = parse_main_log(log_a)
    train_b, val_b = parse_main_log(log_b)
    labels = args.labels or [default_label(args.a, "A"), default_label(args.b, "B")]
    if labels[0] == labels[1] and not args.labels:
        labels = [f"A ({labels[0]})", f"B ({labels[1]})"]

    t_steps, t_a, t_b = align(train_a, train_b)
    v_steps, v_a, v_b = align(val_a, val_b)
    for name, steps, curve_a, curve_b in (("train", t_steps, train_a, train_b), ("val", v_steps, val_a, val_b)):
        if len(steps) == 0:
            raise InputError(f"{log_a} and {log_b}: no aligned {name} steps "
                             f"({len(curve_a)} {name} steps in A, {len(curve_b)} in B, none in common)")

    t_sa, t_sb = moving_average(t_a, args.smooth), moving_average(t_b, args.smooth)
    t_rel = relative_difference(t_sa, t_sb)
    v_rel = relative_difference(v_a, v_b)
    t_max, t_max_step = worst(t_steps, t_rel)
    v_max, v_max_step = worst(v_steps, v_rel)
    t_final, v_final = float(t_rel[-1]), float(v_rel[-1])
    val_ok = v_final <= args.tolerance  # False for NaN
    train_ok = t_final <= args.tolerance

    print(f"A = {log_a} [{labels[0]}]")
    print(f"B = {log_b} [{labels[1]}] (baseline); relative difference = |A - B| / |B|")
    header = f"{'curve':<22} {'steps':>6} {'final A':>10} {'final B':>10} {'final rel':>11} {'max rel':>11} {'at step':>8}"
    print(header)
    print("-" * len(header))
    print(f"{f'train (smoothed {args.smooth})':<22} {len(t_steps):>6d} {t_sa[-1]:>10.6f} {t_sb[-1]:>10.6f} "
          f"{t_final:>11.4e} {t_max:>11.4e} {t_max_step:>8d}")
    print(f"{'val':<22} {len(v_steps):>6d} {v_a[-1]:>10.6f} {v_b[-1]:>10.6f} "
          f"{v_final:>11.4e} {v_max:>11.4e} {v_max_step:>8d}")
    verdict = "PASS" if val_ok and train_ok else "FAIL"
    print(f"{verdict}: at step {int(v_steps[-1])} val rel {v_final:.4e} {'<=' if val_ok else 'not <='} "
          f"{args.tolerance:g}; at step {int(t_steps[-1])} smoothed train rel {t_final:.4e} "
          f"{'<=' if train_ok else 'not <='} {args.tolerance:g}")
    out = args.out or (os.path.join(args.a, "compare_loss.png") if os.path.isdir(args.a) else "compare_loss.png")
    plot(out, labels, (t_steps, t_a, t_b, t_sa, t_sb, t_rel), (v_steps, v_a, v_b, v_rel), args.smooth,
         args.tolerance)
    print(f"plot: {out}")
    return 0 if val_ok and train_ok else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except InputError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        sys.exit(2)
