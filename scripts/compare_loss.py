"""Compare the loss curves of training runs against one baseline (typically FP8 against BF16).

    python scripts/compare_loss.py runs/cmp_fp8 runs/cmp_bf16 --labels fp8 bf16
    python scripts/compare_loss.py runs/fp8_a runs/fp8_b runs/bf16              # two runs against bf16
    python scripts/compare_loss.py runs/bf16 runs/fp8_a runs/fp8_b --baseline 0  # the same

Each RUN is a run directory (holding main.log) or a main.log file, in llm.c's format: lines
`s:<step> trl:<train loss>` and `s:<step> tel:<val loss>` (other `key:value` fields on a line, such as
llm.c's `lr:` or `norm:`, are ignored). When a step appears twice (a resumed run appends to its log),
the later line wins. Runs are named A, B, C, ... by their position on the command line.

The baseline is the run at 0-based position --baseline (default: the last, so `A B` checks A against
B). Every other run is compared with it on its own, over the steps present in both of the two logs:
the relative difference at a step is |run - baseline| / |baseline|. The train loss is noisy, so it is
first smoothed by a trailing moving average over --smooth aligned steps (fewer at the start); the val
loss is compared as logged. A run agrees with the baseline when its FINAL val-loss relative difference
and its FINAL smoothed train-loss relative difference are both <= --tolerance (DESIGN.md section 9
asks for 1%). Each run gets the same summary (table and PASS/FAIL line); with more than one run to
check, a last `overall` line names the runs that do not agree. The plot shows every run's curves and
each run's relative difference.

--labels takes one label per run, in the runs' order; it takes every word up to the next flag, so it
goes after the runs (or ends with `--`).

Exit status: 0 every run within tolerance, 1 some run not within tolerance (a NaN counts as not
within), 2 bad input (fewer than 2 runs, a --labels count or --baseline index that does not fit the
runs, missing file, malformed line, no aligned steps, unwritable plot), with a one-line message on
stderr.
"""
import argparse
import os
import re
import sys
from dataclasses import dataclass

import numpy as np

PROG = "compare_loss.py"
STEP_FIELD = re.compile(r"s:(\d+)$")
KEY_VALUE_FIELD = re.compile(r"([A-Za-z_]+):(\S+)$")
TRAIN_KEY = "trl"
VAL_KEY = "tel"
# The relative-difference panel is linear below this fraction of the tolerance and logarithmic above.
REL_LINEAR_BELOW = 1e-3
BASELINE_COLOR = "tab:blue"
RUN_COLORS = ("tab:red", "tab:orange", "tab:green", "tab:purple", "tab:brown", "tab:pink", "tab:olive",
              "tab:cyan", "tab:gray")


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


def run_letter(index):
    """A run's name by its 0-based position on the command line: A, B, ..., Z, AA, AB, ..."""
    letters = ""
    index += 1
    while index:
        index, digit = divmod(index - 1, 26)
        letters = chr(ord("A") + digit) + letters
    return letters


def default_label(path, fallback):
    """The run directory's name (the parent directory for a main.log path)."""
    full = os.path.abspath(path)
    name = os.path.basename(full if os.path.isdir(full) else os.path.dirname(full))
    return name or fallback


@dataclass
class Run:
    """One run of the command line: its position, the main.log read, its label and its curves."""
    index: int   # 0-based position on the command line
    path: str    # as given: a run directory or a main.log
    log: str     # the main.log read
    label: str
    train: dict  # {step: train loss}
    val: dict    # {step: val loss}

    @property
    def letter(self):
        return run_letter(self.index)

    @property
    def name(self):
        return f"{self.letter} [{self.label}]"


@dataclass
class CurveDifference:
    """One curve of a run against the baseline's, over their common steps (float64 arrays, one entry a step)."""
    steps: np.ndarray     # (n,) int64, increasing
    run: np.ndarray       # (n,) the run's values as compared (the train loss smoothed)
    baseline: np.ndarray  # (n,) the baseline's, likewise
    rel: np.ndarray       # (n,) |run - baseline| / |baseline|
    final: float          # rel at the last common step
    worst: float          # the largest rel (NaN when any is NaN) ...
    worst_step: int       # ... and its step
    within: bool          # final <= tolerance (False for NaN)


@dataclass
class Comparison:
    """The result of compare(): a run against the baseline, curve by curve, at one smoothing and tolerance."""
    run: Run
    baseline: Run
    smooth: int
    tolerance: float
    train: CurveDifference  # smoothed train loss
    val: CurveDifference

    @property
    def within(self):
        return self.train.within and self.val.within


def curve_difference(steps, run_values, baseline_values, tolerance):
    """CurveDifference of two aligned (n,) arrays (n >= 1) over `steps`."""
    rel = relative_difference(run_values, baseline_values)
    worst_rel, worst_step = worst(steps, rel)
    final = float(rel[-1])
    return CurveDifference(steps, run_values, baseline_values, rel, final, worst_rel, worst_step,
                           final <= tolerance)  # False for NaN


def compare(run, baseline, smooth, tolerance):
    """Compare `run` against `baseline` over the steps both logged, the train loss smoothed over `smooth`
    aligned steps. Returns a Comparison; raises InputError when a curve has no step in common."""
    t_steps, t_run, t_base = align(run.train, baseline.train)
    v_steps, v_run, v_base = align(run.val, baseline.val)
    for name, steps, run_curve, base_curve in (("train", t_steps, run.train, baseline.train),
                                               ("val", v_steps, run.val, baseline.val)):
        if len(steps) == 0:
            raise InputError(f"{run.log} and {baseline.log}: no aligned {name} steps ({len(run_curve)} {name} "
                             f"steps in {run.letter}, {len(base_curve)} in {baseline.letter}, none in common)")
    train = curve_difference(t_steps, moving_average(t_run, smooth), moving_average(t_base, smooth), tolerance)
    val = curve_difference(v_steps, v_run, v_base, tolerance)
    return Comparison(run, baseline, smooth, tolerance, train, val)


def print_comparison(c):
    """The summary of one Comparison: the two logs, a table row per curve and the PASS/FAIL line."""
    r, b = c.run, c.baseline
    print(f"{r.letter} = {r.log} [{r.label}]")
    print(f"{b.letter} = {b.log} [{b.label}] (baseline); "
          f"relative difference = |{r.letter} - {b.letter}| / |{b.letter}|")
    header = (f"{'curve':<22} {'steps':>6} {'final ' + r.letter:>10} {'final ' + b.letter:>10} "
              f"{'final rel':>11} {'max rel':>11} {'at step':>8}")
    print(header)
    print("-" * len(header))
    for name, d in ((f"train (smoothed {c.smooth})", c.train), ("val", c.val)):
        print(f"{name:<22} {len(d.steps):>6d} {d.run[-1]:>10.6f} {d.baseline[-1]:>10.6f} "
              f"{d.final:>11.4e} {d.worst:>11.4e} {d.worst_step:>8d}")
    t, v = c.train, c.val
    print(f"{'PASS' if c.within else 'FAIL'}: at step {int(v.steps[-1])} val rel {v.final:.4e} "
          f"{'<=' if v.within else 'not <='} {c.tolerance:g}; at step {int(t.steps[-1])} smoothed train rel "
          f"{t.final:.4e} {'<=' if t.within else 'not <='} {c.tolerance:g}")


def print_overall(comparisons):
    """One line for several comparisons against one baseline: all within, or which runs are not."""
    baseline, tolerance = comparisons[0].baseline, comparisons[0].tolerance
    failed = [c.run.name for c in comparisons if not c.within]
    if failed:
        print(f"overall FAIL: {len(failed)} of {len(comparisons)} runs not within {tolerance:g} of baseline "
              f"{baseline.name}: {', '.join(failed)}")
    else:
        print(f"overall PASS: all {len(comparisons)} runs within {tolerance:g} of baseline {baseline.name}")


def plot(out, comparisons, smooth, tolerance):
    """Write the three-panel PNG: every run's train loss (raw faint + smoothed), val loss, and each run's
    relative difference against the baseline. Runs are drawn over the steps they share with the baseline;
    the baseline over the steps it shares with any run."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    baseline = comparisons[0].baseline
    # (run, color, train steps, raw train, smoothed train, val steps, val), in command-line order
    drawn = [(c.run, RUN_COLORS[i % len(RUN_COLORS)], c.train.steps,
              np.array([c.run.train[s] for s in c.train.steps]), c.train.run, c.val.steps, c.val.run)
             for i, c in enumerate(comparisons)]
    t_steps = np.array(sorted(set().union(*(c.train.steps.tolist() for c in comparisons))), dtype=np.int64)
    v_steps = np.array(sorted(set().union(*(c.val.steps.tolist() for c in comparisons))), dtype=np.int64)
    t_raw = np.array([baseline.train[s] for s in t_steps], dtype=np.float64)
    drawn.append((baseline, BASELINE_COLOR, t_steps, t_raw, moving_average(t_raw, smooth), v_steps,
                  np.array([baseline.val[s] for s in v_steps], dtype=np.float64)))
    drawn.sort(key=lambda entry: entry[0].index)

    fig, axes = plt.subplots(3, 1, figsize=(9, 11), sharex=True)
    ax = axes[0]
    for run, color, steps, raw, smoothed, _, _ in drawn:
        ax.plot(steps, raw, color=color, alpha=0.25, linewidth=0.8)
        ax.plot(steps, smoothed, color=color, linewidth=1.5, label=f"{run.label} (smoothed {smooth})")
    ax.set_ylabel("train loss")
    ax.legend()
    ax.grid(alpha=0.3)
    ax = axes[1]
    for run, color, _, _, _, steps, val in drawn:
        ax.plot(steps, val, "o-", color=color, markersize=3, label=run.label)
    ax.set_ylabel("val loss")
    ax.legend()
    ax.grid(alpha=0.3)
    ax = axes[2]
    for i, c in enumerate(comparisons):
        # One run: train and val in two colours. Several: the colour is the run's, the markers mark val.
        if len(comparisons) == 1:
            colors, prefix = ("tab:purple", "tab:green"), ""
        else:
            colors, prefix = (RUN_COLORS[i % len(RUN_COLORS)],) * 2, f"{c.run.label}: "
        ax.plot(c.train.steps, c.train.rel, color=colors[0], label=f"{prefix}train (smoothed {smooth})")
        ax.plot(c.val.steps, c.val.rel, "o-", color=colors[1], markersize=3, label=f"{prefix}val")
    ax.axhline(tolerance, color="black", linestyle="--", linewidth=1, label=f"tolerance {tolerance:g}")
    # symlog: differences span decades below the tolerance, and identical steps (0) must stay visible.
    ax.set_yscale("symlog", linthresh=(tolerance if tolerance > 0 else 1.0) * REL_LINEAR_BELOW)
    ax.set_ylim(bottom=0)
    checked = comparisons[0].run.label if len(comparisons) == 1 else "run"
    ax.set_ylabel(f"|{checked} - {baseline.label}| / |{baseline.label}|")
    ax.set_xlabel("step")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.suptitle(f"{', '.join(c.run.label for c in comparisons)} vs {baseline.label} (baseline)")
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
        description="Compare the train and val loss curves of each RUN against the baseline run (the last, "
                    "or --baseline). Relative difference = |run - baseline| / |baseline|, per step, over the "
                    "steps present in both logs; the train loss is smoothed first. Exit 0 when, for every "
                    "run, the final val and final smoothed train relative differences are both <= "
                    "--tolerance, 1 when not, 2 on bad input.")
    parser.add_argument("runs", nargs="*", metavar="RUN",
                        help="run directory (holding main.log) or main.log; two or more, one the baseline")
    parser.add_argument("--baseline", type=int, metavar="K",
                        help="0-based position of the baseline among the runs (default: the last)")
    parser.add_argument("--labels", nargs="+", metavar="LABEL",
                        help="one name per run, in order, for the table and plot (default: the run "
                             "directories' names); give it after the runs")
    parser.add_argument("--out", help="PNG to write (default: compare_loss.png in the first checked run's "
                                      "directory when it is one, else in the current directory)")
    parser.add_argument("--smooth", type=positive_int, default=20,
                        help="train-loss moving-average window, in aligned steps (default 20)")
    parser.add_argument("--tolerance", type=non_negative_float, default=0.01,
                        help="largest allowed final relative difference, val and smoothed train (default 0.01)")
    # intermixed: a run may follow a flag (`A --smooth 5 B`), as when the runs were two positionals
    return parser.parse_intermixed_args(argv)


def check_args(args):
    """The baseline's index, once the run count, --labels and --baseline fit; InputError naming the flag."""
    n = len(args.runs)
    if n < 2:
        hint = " (--labels takes every word up to the next flag: give it after the runs)" if args.labels else ""
        raise InputError(f"RUN: {n} run{'' if n == 1 else 's'} given, at least 2 needed "
                         f"(the runs to check and their baseline){hint}")
    if args.labels is not None and len(args.labels) != n:
        raise InputError(f"--labels: {len(args.labels)} labels for {n} runs (one label per run)")
    baseline = n - 1 if args.baseline is None else args.baseline
    if not 0 <= baseline < n:
        raise InputError(f"--baseline: {baseline} is not a run's position (0..{n - 1} for {n} runs)")
    return baseline


def read_runs(paths, labels):
    """Run records for the command line's paths, their logs read; default labels when `labels` is None."""
    logs = [resolve_log(path) for path in paths]
    curves = [parse_main_log(log) for log in logs]
    if labels is None:
        labels = [default_label(path, run_letter(i)) for i, path in enumerate(paths)]
        if len(set(labels)) < len(labels):  # the same directory name twice: tell the runs apart by position
            labels = [f"{run_letter(i)} ({label})" for i, label in enumerate(labels)]
    return [Run(i, path, log, label, train, val)
            for i, (path, log, label, (train, val)) in enumerate(zip(paths, logs, labels, curves))]


def main(argv=None):
    args = parse_args(argv)
    baseline_index = check_args(args)
    runs = read_runs(args.runs, args.labels)
    baseline = runs[baseline_index]
    comparisons = [compare(run, baseline, args.smooth, args.tolerance) for run in runs if run is not baseline]

    for i, c in enumerate(comparisons):
        if i > 0:
            print()
        print_comparison(c)
    if len(comparisons) > 1:
        print()
        print_overall(comparisons)
    first = comparisons[0].run.path
    out = args.out or (os.path.join(first, "compare_loss.png") if os.path.isdir(first) else "compare_loss.png")
    plot(out, comparisons, args.smooth, args.tolerance)
    print(f"plot: {out}")
    return 0 if all(c.within for c in comparisons) else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except InputError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        sys.exit(2)
