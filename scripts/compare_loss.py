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
the relative difference at a step is |run - baseline| / |baseline|. The train loss is noisy, so its
curve (the table's max rel and its step, and the plot) is first smoothed by a centred moving average over
--smooth W aligned steps (moving_average: unlike a trailing mean, which lags the loss by (W - 1) / 2
steps, it does not lag; near the ends the window shrinks symmetrically, so the last step's smoothed value
is its raw one). On a short run the curve's window is at most a quarter of the aligned steps
(curve_window: a 40-step run is smoothed over 10, not 20): a centred window still bends a curved loss
(the steep start of training) by about its second derivative times W^2 / 24, and one as wide as the run
would flatten it to the run's mean; a line under the table says when this happens. The val loss is
compared as logged. The final train values are not that one noisy raw step but each run's mean over the
last W aligned steps (all of them when fewer; last_window_mean): the train row's final columns show those
two means and their relative difference. Both runs are averaged over the same steps, so the window's lag
does not bias the comparison. A run agrees with the baseline when its FINAL val-loss relative difference
(at the last aligned val step) and its FINAL smoothed train-loss relative difference (of the last-W
means) are both <= --tolerance (docs/design.md#targets asks for 1%).
Each run gets the same summary (table and PASS/FAIL line); with more than one run to check, a last
`overall` line names the runs that do not agree. The plot shows every run's curves and each run's relative
difference.

Downstream scores: when a run's metrics.jsonl (beside its main.log) holds evaluation objects
(`{"step", "eval": <set>, <metric>: <number or null>, ..., "examples"}`, train/logger.h logger_eval), a
table follows the loss comparison: the scores at the last step every run with evaluations evaluated,
one row per (set, metric), a column per run (the baseline last), each other run's difference from the
baseline (absolute for accuracies, relative for perplexities and bits_per_byte), the binomial standard
error sqrt(p (1 - p) / n) of the baseline's accuracies (a small set's accuracy is noisy: a difference of
a few SE can be chance) and the number of examples; "-" where a run lacks the set. The plot then gets
one panel per set (its main metric against step, MAIN_METRIC). The scores are reported, not judged:
they do not enter the PASS/FAIL verdict or the exit status. Other metrics.jsonl lines are not read.

--labels takes one label per run, in the runs' order; it takes every word up to the next flag, so it
goes after the runs (or ends with `--`).

Exit status: 0 every run within tolerance, 1 some run not within tolerance (a NaN counts as not
within), 2 bad input (fewer than 2 runs, a --labels count or --baseline index that does not fit the
runs, missing file, malformed line, an evaluation line of metrics.jsonl that is not a JSON object with an
integer step, a set name and numeric or null scores, no aligned steps, unwritable plot), with a one-line
message on stderr.
"""
import argparse
import json
import math
import os
import re
import sys
from dataclasses import dataclass, field

import numpy as np

PROG = "compare_loss.py"
STEP_FIELD = re.compile(r"s:(\d+)$")
KEY_VALUE_FIELD = re.compile(r"([A-Za-z_]+):(\S+)$")
TRAIN_KEY = "trl"
VAL_KEY = "tel"
# The train curve's centred window is at most this fraction of the run's aligned steps (curve_window).
CURVE_WINDOW_MAX_FRACTION = 0.25
# The relative-difference panel is linear below this fraction of the tolerance and logarithmic above.
REL_LINEAR_BELOW = 1e-3
BASELINE_COLOR = "tab:blue"
RUN_COLORS = ("tab:red", "tab:orange", "tab:green", "tab:purple", "tab:brown", "tab:pink", "tab:olive",
              "tab:cyan", "tab:gray")
# metrics.jsonl evaluation objects: the keys that are not scores, and the scores that are accuracies (a
# fraction of examples right: absolute differences, binomial standard error); any other score (perplexity,
# bits_per_byte) is compared relatively.
EVAL_KEY = "eval"
EVAL_NON_SCORES = ("step", "eval", "examples")
ACCURACY_PREFIX = "acc"
# The score drawn per set in the plot; a set not named here draws its first score.
MAIN_METRIC = {"hellaswag": "acc_norm", "lambada": "acc", "wikitext": "word_perplexity"}
EVAL_PANEL_HEIGHT = 3.0  # inches added to the figure per evaluation set's panel
DEFAULT_DPI = 110  # the PNG's pixels per inch (--dpi): the 9 x 11 inch figure is 990 x 1210 pixels
MISSING = "-"     # a run without the set (or without evaluations)
NOT_FINITE = "null"  # the trainer writes null for a score that is not finite


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


def save_figure(fig, out, dpi=DEFAULT_DPI):
    """Write a matplotlib figure as PNG at `dpi` pixels per inch and close it; InputError when `out` cannot
    be written."""
    import matplotlib.pyplot as plt
    try:
        fig.savefig(out, dpi=dpi)
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
    """Centred moving average of a (n,) float64 array over `window` entries; returns (n,) float64.

    Entry i is the mean of entries i - h .. i + h, h = window // 2: for an odd window that is `window`
    entries; for an even one the two outermost are weighted 1/2 (the centred "2 x window" moving average,
    Hyndman & Athanasopoulos, Forecasting: Principles and Practice, section 3.3), so the weights still sum to
    `window`. Near the ends the half-width shrinks to r = min(h, i, n - 1 - i), equal weights: the window
    stays symmetric, so a linear ramp is returned unchanged (a trailing mean lags it by (window - 1) / 2
    entries) and the first and last entries are the raw values. A NaN spoils only the windows holding it.
    """
    half = window // 2
    out = np.empty(len(values))
    for i in range(len(values)):
        r = min(half, i, len(values) - 1 - i)
        part = values[i - r:i + r + 1]
        if window % 2 == 0 and r == half and r > 0:
            out[i] = (part.sum() - 0.5 * (part[0] + part[-1])) / window
        else:
            out[i] = part.mean()
    return out


def curve_window(n, window):
    """The centred window the train curve of n aligned steps is smoothed over: `window`, at most a quarter of
    the n steps (CURVE_WINDOW_MAX_FRACTION), at least 1. A centred mean does not lag, but it bends a curved
    loss by ~ its second derivative x window^2 / 24, and a window as wide as the run flattens the curve to
    the run's mean; a quarter keeps that bias small on a short run and leaves a long run's window alone."""
    return max(1, min(window, int(n * CURVE_WINDOW_MAX_FRACTION)))


def last_window_mean(values, window):
    """Mean of the last `window` entries of a (n,) float64 array (n >= 1; all n when fewer); a float.

    The train verdict's final value: both runs are averaged over the same aligned steps, so the window's lag
    shifts both alike, and the verdict does not rest on one noisy step (the centred moving average's last
    entry is the raw last step). A NaN in the window makes it NaN."""
    return float(values[max(0, len(values) - window):].mean())


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
    evals: dict = field(default_factory=dict)  # {set: {step: EvalScores}} from metrics.jsonl; {} without

    @property
    def letter(self):
        return run_letter(self.index)

    @property
    def name(self):
        return f"{self.letter} [{self.label}]"


@dataclass
class CurveDifference:
    """One curve of a run against the baseline's, over their common steps (float64 arrays, one entry a step),
    and the final values the verdict compares."""
    steps: np.ndarray      # (n,) int64, increasing
    run: np.ndarray        # (n,) the run's curve (the train loss: its centred moving average)
    baseline: np.ndarray   # (n,) the baseline's, likewise
    rel: np.ndarray        # (n,) |run - baseline| / |baseline|
    final_run: float       # the run's final value: val, the last common step's; train, the last-W mean
    final_baseline: float  # the baseline's, likewise
    final: float           # |final_run - final_baseline| / |final_baseline|
    worst: float           # the largest rel (NaN when any is NaN) ...
    worst_step: int        # ... and its step
    within: bool           # final <= tolerance (False for NaN)


@dataclass
class Comparison:
    """The result of compare(): a run against the baseline, curve by curve, at one smoothing and tolerance."""
    run: Run
    baseline: Run
    smooth: int
    tolerance: float
    train: CurveDifference  # train loss: centred curve, final values the last-`smooth` means
    val: CurveDifference
    curve_window: int       # the train curve's centred window: curve_window(aligned train steps, smooth)

    @property
    def within(self):
        return self.train.within and self.val.within


def curve_difference(steps, run_values, baseline_values, final_run, final_baseline, tolerance):
    """CurveDifference of two aligned (n,) arrays (n >= 1) over `steps`, judged on the final values
    `final_run` against `final_baseline` (floats)."""
    rel = relative_difference(run_values, baseline_values)
    worst_rel, worst_step = worst(steps, rel)
    final = float(relative_difference(np.float64(final_run), np.float64(final_baseline)))
    return CurveDifference(steps, run_values, baseline_values, rel, final_run, final_baseline, final, worst_rel,
                           worst_step, final <= tolerance)  # False for NaN


def compare(run, baseline, smooth, tolerance):
    """Compare `run` against `baseline` over the steps both logged: the val loss as logged, judged at the last
    common step; the train curve smoothed by a centred moving average over `smooth` aligned steps (at most a
    quarter of them: curve_window), judged on the two runs' means over their last `smooth` aligned steps.
    Returns a Comparison; raises InputError when a curve has no step in common."""
    t_steps, t_run, t_base = align(run.train, baseline.train)
    v_steps, v_run, v_base = align(run.val, baseline.val)
    for name, steps, run_curve, base_curve in (("train", t_steps, run.train, baseline.train),
                                               ("val", v_steps, run.val, baseline.val)):
        if len(steps) == 0:
            raise InputError(f"{run.log} and {baseline.log}: no aligned {name} steps ({len(run_curve)} {name} "
                             f"steps in {run.letter}, {len(base_curve)} in {baseline.letter}, none in common)")
    window = curve_window(len(t_steps), smooth)
    train = curve_difference(t_steps, moving_average(t_run, window), moving_average(t_base, window),
                             last_window_mean(t_run, smooth), last_window_mean(t_base, smooth), tolerance)
    val = curve_difference(v_steps, v_run, v_base, float(v_run[-1]), float(v_base[-1]), tolerance)
    return Comparison(run, baseline, smooth, tolerance, train, val, window)


@dataclass
class EvalScores:
    """One evaluation object of metrics.jsonl: one set's scores at one step."""
    scores: dict   # {metric: float, or None where the trainer wrote null (not finite)}, in the file's order
    examples: int  # examples scored (documents for wikitext)


def is_accuracy(metric):
    return metric.startswith(ACCURACY_PREFIX)


def is_score(value):
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))


def read_evals(path):
    """{set: {step: EvalScores}} from the evaluation objects of a metrics.jsonl; a later step overrides.

    Only lines holding an "eval" key are parsed (train steps, val losses, shadow checks, events and alerts
    are skipped unread). Raises InputError naming the file and line for an evaluation line that is not a
    JSON object with an integer "step", a string "eval", an integer "examples" and scores that are numbers
    or null.
    """
    evals = {}
    for lineno, line in enumerate(read_lines(path), start=1):
        if f'"{EVAL_KEY}"' not in line:
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            row = None
        if isinstance(row, dict) and EVAL_KEY not in row:
            continue  # "eval" inside another object's text
        scores = {k: v for k, v in row.items() if k not in EVAL_NON_SCORES} if isinstance(row, dict) else {}
        ok = (isinstance(row, dict) and type(row.get("step")) is int and isinstance(row[EVAL_KEY], str)
              and type(row.get("examples")) is int and len(scores) > 0 and all(map(is_score, scores.values())))
        if not ok:
            shown = line if len(line) <= 60 else line[:57] + "..."
            raise InputError(f"{path}:{lineno}: malformed evaluation line {shown!r} (expected a JSON object "
                             f"with an integer step, a string eval, numeric or null scores and integer examples)")
        scores = {k: None if v is None or not math.isfinite(v) else float(v) for k, v in scores.items()}
        evals.setdefault(row[EVAL_KEY], {})[row["step"]] = EvalScores(scores, row["examples"])
    return evals


def metrics_path(log):
    """The metrics.jsonl beside a main.log (the run directory's), or None when there is none."""
    path = os.path.join(os.path.dirname(log), "metrics.jsonl")
    return path if os.path.isfile(path) else None


@dataclass
class ScoreTable:
    """The downstream scores of every run at one step: score_table()'s result, printed by print_scores."""
    runs: list  # [Run], the checked runs in command-line order, then the baseline
    step: int   # the last step every run with evaluations evaluated (None when they share none)
    rows: list  # [(set, metric)], in order of first appearance


def score_table(runs, baseline):
    """The ScoreTable of `runs` (their evaluations read) against `baseline`, or None when no run has any."""
    with_evals = [r for r in runs if r.evals]
    if not with_evals:
        return None
    ordered = [r for r in runs if r is not baseline] + [baseline]
    common = set.intersection(*({step for by_step in r.evals.values() for step in by_step} for r in with_evals))
    step = max(common) if common else None
    rows = []
    for r in ordered:
        for name, by_step in r.evals.items():
            for metric in (by_step[step].scores if step in by_step else {}):
                if (name, metric) not in rows:
                    rows.append((name, metric))
    return ScoreTable(ordered, step, rows)


def score_of(run, name, metric, step):
    """(score or None for null, examples) of a run, or None when it lacks the set (or metric) at `step`."""
    entry = run.evals.get(name, {}).get(step)
    if entry is None or metric not in entry.scores:
        return None
    return entry.scores[metric], entry.examples


def score_text(metric, value):
    return NOT_FINITE if value is None else f"{value:.4f}" if is_accuracy(metric) else f"{value:.6g}"


def score_difference(metric, got, base):
    """The text of a run's difference from the baseline: absolute for an accuracy, relative (in %) else."""
    if got is None or base is None:
        return MISSING
    if got[0] is None or base[0] is None:
        return NOT_FINITE
    if is_accuracy(metric):
        return f"{got[0] - base[0]:+.4f}"
    if base[0] == 0:
        return NOT_FINITE
    return f"{(got[0] - base[0]) / base[0]:+.3%}"


def standard_error(metric, base):
    """sqrt(p (1 - p) / n), the binomial standard error of the baseline's accuracy p over n examples."""
    if not is_accuracy(metric) or base is None:
        return MISSING
    p, n = base
    if p is None or n <= 0:
        return NOT_FINITE
    return f"{math.sqrt(max(p * (1 - p), 0.0) / n):.4f}"


def print_scores(table):
    """The downstream scores table: a row per (set, metric), a column per run, differences, SE, examples."""
    *others, baseline = table.runs
    who = "every run" if all(r.evals for r in table.runs) else "every run with evaluations"
    if table.step is None:
        steps = "; ".join(f"{r.letter}: {', '.join(map(str, sorted({s for b in r.evals.values() for s in b})))}"
                          for r in table.runs if r.evals)
        print(f"downstream scores: no step evaluated by {who} ({steps})")
        return
    print(f"downstream scores at step {table.step}, the last step evaluated by {who} (reported only: not part "
          f"of the PASS/FAIL verdict)")
    print(f"runs {', '.join(r.name for r in others)}; baseline {baseline.name}")
    b = baseline.letter
    header = (["set", "metric"] + [r.letter for r in table.runs] + [f"{r.letter} - {b}" for r in others]
              + [f"SE {b}", "examples"])
    lines = []
    for name, metric in table.rows:
        got = [score_of(r, name, metric, table.step) for r in table.runs]
        counts = [str(g[1]) if g else MISSING for g in got]
        present = {c for c in counts if c != MISSING}
        lines.append([name, metric] + [score_text(metric, g[0]) if g else MISSING for g in got]
                     + [score_difference(metric, g, got[-1]) for g in got[:-1]]
                     + [standard_error(metric, got[-1]), present.pop() if len(present) == 1 else "/".join(counts)])
    widths = [max(len(row[i]) for row in lines + [header]) for i in range(len(header))]

    def show(row):
        left = [f"{row[i]:<{widths[i]}}" for i in range(2)]
        print("  ".join(left + [f"{row[i]:>{widths[i]}}" for i in range(2, len(row))]))
    show(header)
    print("-" * (sum(widths) + 2 * (len(widths) - 1)))
    for row in lines:
        show(row)
    print("differences: accuracies run - baseline; other scores (perplexity, bits_per_byte) (run - baseline) / "
          "baseline")
    print(f"SE {b}: sqrt(p (1 - p) / n), the binomial standard error of {b}'s accuracy p over n examples "
          f"(a difference within ~2 SE can be chance)")
    print(f'"{MISSING}": no such score at step {table.step}; {NOT_FINITE}: not finite')


def print_comparison(c):
    """The summary of one Comparison: the two logs, a table row per curve and the PASS/FAIL line. The train
    row's final columns and the verdict's smoothed train rel are the last-`smooth` means (CurveDifference's
    final values); its max rel and step are the centred curve's, and a line under the table gives that curve's
    window when curve_window narrowed it."""
    r, b = c.run, c.baseline
    print(f"{r.letter} = {r.log} [{r.label}]")
    print(f"{b.letter} = {b.log} [{b.label}] (baseline); "
          f"relative difference = |{r.letter} - {b.letter}| / |{b.letter}|")
    header = (f"{'curve':<22} {'steps':>6} {'final ' + r.letter:>10} {'final ' + b.letter:>10} "
              f"{'final rel':>11} {'max rel':>11} {'at step':>8}")
    print(header)
    print("-" * len(header))
    for name, d in ((f"train (smoothed {c.smooth})", c.train), ("val", c.val)):
        print(f"{name:<22} {len(d.steps):>6d} {d.final_run:>10.6f} {d.final_baseline:>10.6f} "
              f"{d.final:>11.4e} {d.worst:>11.4e} {d.worst_step:>8d}")
    t, v = c.train, c.val
    if c.curve_window < c.smooth:
        print(f"train max rel: centred mean over {c.curve_window} steps (a quarter of the {len(t.steps)} aligned "
              f"steps, not --smooth {c.smooth}); final columns: means over the last {min(c.smooth, len(t.steps))}")
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


def plot_evals(axes, runs, colors):
    """One panel per evaluation set of `runs` (a panel in `axes` each, in order of first appearance): the
    set's MAIN_METRIC against step for every run that has it, a perplexity on a log scale; for an accuracy,
    the band of +-1 binomial standard error around the baseline (the last run), to show the noise."""
    sets = list(dict.fromkeys(name for r in runs for name in r.evals))
    baseline = runs[-1]
    for ax, name in zip(axes, sets):
        first = next(r.evals[name] for r in runs if name in r.evals)
        metric = MAIN_METRIC.get(name, next(iter(next(iter(first.values())).scores)))
        for r in runs:
            by_step = r.evals.get(name, {})
            steps = sorted(s for s in by_step if metric in by_step[s].scores)
            if not steps:
                continue
            values = np.array([np.nan if by_step[s].scores[metric] is None else by_step[s].scores[metric]
                               for s in steps])
            ax.plot(steps, values, "o-", color=colors[r.index], markersize=3, label=r.label)
            if r is baseline and is_accuracy(metric):
                n = np.array([max(by_step[s].examples, 1) for s in steps])
                se = np.sqrt(np.clip(values * (1 - values), 0, None) / n)
                ax.fill_between(steps, values - se, values + se, color=colors[r.index], alpha=0.15,
                                label=f"{r.label} +-1 SE")
        if "perplexity" in metric:
            ax.set_yscale("log")
        ax.set_ylabel(f"{name} {metric}")
        ax.legend()
        ax.grid(alpha=0.3)


def plot(out, comparisons, smooth, tolerance, title=None, dpi=DEFAULT_DPI):
    """Write the PNG at `dpi`: every run's train loss (raw faint + its centred curve, over curve_window
    steps), val loss, and each run's relative difference against the baseline; then, when the runs have
    downstream evaluations, one panel per set (plot_evals). Runs are drawn over the steps they share with the
    baseline; the baseline over the steps it shares with any run. `title`, when given, is a first line
    above the figure's own (the runs compared and the step count)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    baseline = comparisons[0].baseline
    # (run, color, train steps, raw train, smoothed train, its window, val steps, val), in command-line order
    drawn = [(c.run, RUN_COLORS[i % len(RUN_COLORS)], c.train.steps,
              np.array([c.run.train[s] for s in c.train.steps]), c.train.run, c.curve_window, c.val.steps,
              c.val.run)
             for i, c in enumerate(comparisons)]
    t_steps = np.array(sorted(set().union(*(c.train.steps.tolist() for c in comparisons))), dtype=np.int64)
    v_steps = np.array(sorted(set().union(*(c.val.steps.tolist() for c in comparisons))), dtype=np.int64)
    t_raw = np.array([baseline.train[s] for s in t_steps], dtype=np.float64)
    t_window = curve_window(len(t_steps), smooth)
    drawn.append((baseline, BASELINE_COLOR, t_steps, t_raw, moving_average(t_raw, t_window), t_window, v_steps,
                  np.array([baseline.val[s] for s in v_steps], dtype=np.float64)))
    drawn.sort(key=lambda entry: entry[0].index)

    runs = [c.run for c in comparisons] + [baseline]
    run_colors = {entry[0].index: entry[1] for entry in drawn}
    n_sets = len({name for r in runs for name in r.evals})
    fig, axes = plt.subplots(3 + n_sets, 1, figsize=(9, 11 + EVAL_PANEL_HEIGHT * n_sets), sharex=True)
    ax = axes[0]
    # The baseline wide and under the runs: where a run agrees with it, it shows as a line inside a band.
    width = {run.index: (3.0 if run is baseline else 1.3) for run, *_ in drawn}
    layer = {run.index: (1 if run is baseline else 2) for run, *_ in drawn}
    for run, color, steps, raw, smoothed, window, _, _ in drawn:
        ax.plot(steps, raw, color=color, alpha=0.25, linewidth=0.8)
        ax.plot(steps, smoothed, color=color, linewidth=width[run.index], zorder=layer[run.index],
                label=f"{run.label}, centred mean of {window}")
    ax.set_ylabel("train loss")
    ax.legend()
    ax.grid(alpha=0.3)
    ax = axes[1]
    for run, color, _, _, _, _, steps, val in drawn:
        ax.plot(steps, val, "o-", color=color, markersize=2 * width[run.index] + 1, linewidth=width[run.index],
                zorder=layer[run.index], label=run.label)
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
        ax.plot(c.train.steps, c.train.rel, color=colors[0],
                label=f"{prefix}train, centred mean of {c.curve_window}")
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
    if n_sets:
        plot_evals(axes[3:], runs, run_colors)
        axes[-1].set_xlabel("step")
    own = (f"{', '.join(c.run.label for c in comparisons)} vs {baseline.label} (baseline), "
           f"{len(t_steps)} train steps")
    fig.suptitle(f"{title}\n{own}" if title else own)
    fig.tight_layout()
    save_figure(fig, out, dpi)


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
                    "steps present in both logs; the train loss is smoothed first (--smooth). Exit 0 when, "
                    "for every run, the final val relative difference (last common step) and the final "
                    "smoothed train one (the means over the last --smooth common steps) are both <= "
                    "--tolerance, 1 when not, 2 on bad input.",
        epilog="When the runs' metrics.jsonl files (beside main.log) hold downstream evaluations (-h 1, "
               "--eval-lambada, --eval-wikitext), a table of their scores at the last step every run evaluated "
               "follows, with each run's difference from the baseline, the binomial standard error of the "
               "baseline's accuracies and the example counts, and the plot gets a panel per set. The scores are "
               "reported only: they do not enter the PASS/FAIL verdict or the exit status.")
    parser.add_argument("runs", nargs="*", metavar="RUN",
                        help="run directory (holding main.log) or main.log; two or more, one the baseline")
    parser.add_argument("--baseline", type=int, metavar="K",
                        help="0-based position of the baseline among the runs (default: the last)")
    parser.add_argument("--labels", nargs="+", metavar="LABEL",
                        help="one name per run, in order, for the table and plot (default: the run "
                             "directories' names); give it after the runs")
    parser.add_argument("--out", help="PNG to write (default: compare_loss.png in the first checked run's "
                                      "directory when it is one, else in the current directory)")
    parser.add_argument("--title", help="a first line for the plot's title, above the runs compared and the "
                                        "step count (e.g. the model, data and build)")
    parser.add_argument("--dpi", type=positive_int, default=DEFAULT_DPI,
                        help=f"the PNG's pixels per inch (default {DEFAULT_DPI}: 990 x 1210 pixels without "
                             f"evaluation panels)")
    parser.add_argument("--smooth", type=positive_int, default=20, metavar="W",
                        help="train-loss smoothing window W, in aligned steps (default 20): the curve "
                             "(max rel, plot) is a centred moving average over W steps, at most a quarter of "
                             "the aligned steps, shrinking symmetrically at the ends; "
                             "the final values (the table's final columns, the verdict) are the two runs' "
                             "means over their last W aligned steps")
    parser.add_argument("--tolerance", type=non_negative_float, default=0.01,
                        help="largest allowed final relative difference, val (last step) and smoothed "
                             "train (last-W means) (default 0.01)")
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
    evals = [read_evals(metrics) if metrics else {} for metrics in map(metrics_path, logs)]
    return [Run(i, path, log, label, train, val, scores)
            for i, (path, log, label, (train, val), scores) in enumerate(zip(paths, logs, labels, curves, evals))]


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
    scores = score_table(runs, baseline)
    if scores is not None:
        print()
        print_scores(scores)
    first = comparisons[0].run.path
    out = args.out or (os.path.join(first, "compare_loss.png") if os.path.isdir(first) else "compare_loss.png")
    plot(out, comparisons, args.smooth, args.tolerance, args.title, args.dpi)
    print(f"plot: {out}")
    return 0 if all(c.within for c in comparisons) else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except InputError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        sys.exit(2)
