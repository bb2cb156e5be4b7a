"""
Tests of scripts/compare_loss.py and scripts/plot_fp8_stats.py on synthetic logs written here.

Run from the repo root: python -m pytest dev/test/test_compare_loss.py. The scripts run as subprocesses,
as users run them; the expected numbers come from an independent numpy computation over the values this
file wrote. Random inputs come from a seed printed by each test (set LLM8_TEST_SEED to replay one).
The two-run output of compare_loss.py is also checked against the script as it was before it took N runs
(read from git), both run in this process with their plots left out, which keeps that check cheap; only
the train row's max rel and its step differ from it (the train curve became a centred moving average, at
most a quarter of the run wide, with a line under the table when that narrows it), while the final train
values and the verdict (the means over the last --smooth aligned steps, which is what the old trailing
mean ended on) are the old ones; all of them are checked against numpy here. The
downstream-score tests build metrics.jsonl by hand and run the script in this process (a few seconds in
all, the plot's matplotlib import included).
"""
import contextlib
import importlib.util
import io
import json
import math
import os
import re
import secrets
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
COMPARE = REPO / "scripts" / "compare_loss.py"
PLOT_STATS = REPO / "scripts" / "plot_fp8_stats.py"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
STATS_HEADER = "step,layer,gemm,operand,format,amax,scale,saturated_frac,underflow_frac"
NUMBER = r"([-+0-9.eE]+|nan|inf)"
# The last commit of scripts/compare_loss.py before it took N runs: its two-run output is the reference.
TWO_RUN_COMMIT = "dd6a85283f31aa9fd5fbe4b52b1243eab844db2d"


@pytest.fixture
def rng():
    seed = int(os.environ.get("LLM8_TEST_SEED", secrets.randbits(32)))
    print(f"LLM8_TEST_SEED={seed}")
    return np.random.default_rng(seed)


def run(script, *args, cwd=None):
    return subprocess.run([sys.executable, str(script), *map(str, args)], capture_output=True, text=True,
                          cwd=cwd or REPO)


# --- compare_loss.py -------------------------------------------------------------------------------


def random_walk(rng, n, start=10.4, drift=-0.01, noise=0.03):
    return start + np.cumsum(drift + noise * rng.standard_normal(n))


def write_main_log(path, train, val):
    """Write {step: loss} dicts as the logger does ("%f"), val first at shared steps, and return the
    values as read back (rounded to 6 decimals), which is what the script sees."""
    lines, read_train, read_val = [], {}, {}
    for step in sorted(set(train) | set(val)):
        if step in val:
            lines.append(f"s:{step} tel:{val[step]:f}")
            read_val[step] = float(f"{val[step]:f}")
        if step in train:
            lines.append(f"s:{step} trl:{train[step]:f}")
            read_train[step] = float(f"{train[step]:f}")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return read_train, read_val


def make_runs(rng, tmp_path, n=150, scale_a=1.003):
    """Baseline B and a perturbed A with partly different step sets; return the read-back curves."""
    base = random_walk(rng, n + 30)
    # B: steps 0..n-1 with a few missing; A: steps 0..n+29 (ran longer), loss = B * scale_a + noise.
    b_steps = sorted(set(range(n)) - set(rng.choice(np.arange(1, n - 1), size=7, replace=False).tolist()))
    a_steps = list(range(n + 30))
    b_train = {s: base[s] for s in b_steps}
    a_train = {s: base[s] * scale_a + 0.01 * rng.standard_normal() for s in a_steps}
    b_val = {s: base[s] - 0.05 for s in range(0, n, 20)} | {n - 1: base[n - 1] - 0.05}
    a_val = {s: base[s] * scale_a - 0.05 + 0.002 * rng.standard_normal() for s in list(range(0, n + 30, 10)) + [n - 1]}
    a = write_main_log(tmp_path / "run_a" / "main.log", a_train, a_val)
    b = write_main_log(tmp_path / "run_b" / "main.log", b_train, b_val)
    return a, b


def centred_mean(x, window):
    """The centred moving average, from its definition: entry i averages x[i - h .. i + h], h = window // 2,
    with weights 1 (an odd window) or 1/2, 1, ..., 1, 1/2 over `window` (an even one: the centred
    2 x window average); where the window does not fit (i < h or i > n - 1 - h) it shrinks to the
    symmetric x[i - r .. i + r], r = min(i, n - 1 - i), equal weights. The full windows are a convolution."""
    x = np.asarray(x, dtype=np.float64)
    n, h = len(x), window // 2
    if h == 0:
        return x.copy()
    out = np.array([x[i - min(i, n - 1 - i):i + min(i, n - 1 - i) + 1].mean() for i in range(n)])
    if n >= 2 * h + 1:
        kernel = np.ones(2 * h + 1)
        if window % 2 == 0:
            kernel[[0, -1]] = 0.5
        out[h:n - h] = np.convolve(x, kernel / kernel.sum(), mode="valid")
    return out


def last_mean(x, window):
    """The mean of the last `window` entries of x, or of all of them when there are fewer: their sum over
    their count. Summed by np.sum, not math.fsum: a mean of W values logged to 6 decimals is a multiple of
    1e-6 / W, so at 6 decimals it often sits on a rounding tie that one ulp of a different sum would flip."""
    count = min(window, len(x))
    return float(np.sum(np.asarray(x, dtype=np.float64)[len(x) - count:]) / count)


def curve_width(n, smooth):
    """The train curve's centred window over n aligned steps: `smooth`, at most a quarter of n, at least 1."""
    return max(1, min(smooth, n // 4))


def expected_train(a_train, b_train, smooth):
    """The train figures from numpy over the aligned train steps: (steps, centred a, centred b (over
    curve_width steps), their |a - b| / |b| per step, a's and b's means over the last `smooth` steps, those
    means' |a - b| / |b|)."""
    steps = np.array(sorted(a_train.keys() & b_train.keys()))
    raw_a, raw_b = [a_train[s] for s in steps], [b_train[s] for s in steps]
    width = curve_width(len(steps), smooth)
    ta, tb = centred_mean(raw_a, width), centred_mean(raw_b, width)
    fa, fb = last_mean(raw_a, smooth), last_mean(raw_b, smooth)
    return steps, ta, tb, np.abs(ta - tb) / np.abs(tb), fa, fb, abs(fa - fb) / abs(fb)


def expected_differences(a, b, smooth):
    """Independent computation: aligned steps, |a-b|/|b|; train: the max over the centred moving average, the
    final value of the means over the last `smooth` aligned steps."""
    (a_train, a_val), (b_train, b_val) = a, b
    t_steps, _, _, t_rel, _, _, t_final = expected_train(a_train, b_train, smooth)
    v_steps = np.array(sorted(a_val.keys() & b_val.keys()))
    va = np.array([a_val[s] for s in v_steps])
    vb = np.array([b_val[s] for s in v_steps])
    v_rel = np.abs(va - vb) / np.abs(vb)
    return {"train": (len(t_steps), t_final, t_rel.max(), t_steps[np.argmax(t_rel)]),
            "val": (len(v_steps), v_rel[-1], v_rel.max(), v_steps[np.argmax(v_rel)])}


def parse_summary(stdout):
    """{curve: (steps, final rel, max rel, at step)} from the printed table."""
    rows = {}
    for curve, pattern in (("train", r"train \(smoothed \d+\)"), ("val", r"val")):
        m = re.search(rf"^{pattern}\s+(\d+)\s+{NUMBER}\s+{NUMBER}\s+{NUMBER}\s+{NUMBER}\s+(\d+)\s*$", stdout,
                      re.MULTILINE)
        assert m, f"no {curve} row in:\n{stdout}"
        rows[curve] = (int(m.group(1)), float(m.group(4)), float(m.group(5)), int(m.group(6)))
    return rows


@pytest.mark.parametrize("smooth", [1, 20])
def test_relative_differences_match_numpy(rng, tmp_path, smooth):
    a, b = make_runs(rng, tmp_path)
    out = tmp_path / "plot.png"
    r = run(COMPARE, tmp_path / "run_a", tmp_path / "run_b" / "main.log", "--smooth", smooth, "--out", out,
            "--tolerance", "1")
    assert r.returncode == 0, r.stdout + r.stderr
    got = parse_summary(r.stdout)
    want = expected_differences(a, b, smooth)
    for curve in ("train", "val"):
        n, final, worst, at = got[curve]
        w_n, w_final, w_worst, w_at = want[curve]
        assert n == w_n, curve
        assert final == pytest.approx(w_final, rel=1e-3, abs=1e-9), curve
        assert worst == pytest.approx(w_worst, rel=1e-3, abs=1e-9), curve
        assert at == w_at, curve
    assert out.read_bytes().startswith(PNG_MAGIC) and out.stat().st_size > 10_000


def test_exit_status_on_both_sides_of_tolerance(rng, tmp_path):
    a, b = make_runs(rng, tmp_path, scale_a=1.004)
    want = expected_differences(a, b, 20)
    val_final, train_final = want["val"][1], want["train"][1]
    assert val_final > 0 and train_final > 0
    hi, lo = max(val_final, train_final), min(val_final, train_final)
    cases = [(hi * 1.01, 0), (lo * 0.99, 1)]
    if hi > lo * 1.01:  # a tolerance between the two: one of val/train is out, so the check fails
        cases.append(((hi + lo) / 2, 1))
    for tolerance, status in cases:
        r = run(COMPARE, tmp_path / "run_a", tmp_path / "run_b", "--tolerance", repr(float(tolerance)),
                "--out", tmp_path / "p.png")
        assert r.returncode == status, f"tolerance {tolerance}: {r.stdout}{r.stderr}"
        assert ("PASS" if status == 0 else "FAIL") in r.stdout


def test_val_and_train_each_can_fail_alone(tmp_path):
    """Identical train curves with differing val, and the reverse: either alone fails the check."""
    steps = range(40)
    train = {s: 10.0 - 0.05 * s for s in steps}
    val = {s: 10.0 - 0.05 * s for s in (0, 20, 39)}
    write_main_log(tmp_path / "b" / "main.log", train, val)
    write_main_log(tmp_path / "val_off" / "main.log", train, {s: v * 1.02 for s, v in val.items()})
    write_main_log(tmp_path / "train_off" / "main.log", {s: v * 1.02 for s, v in train.items()}, val)
    write_main_log(tmp_path / "same" / "main.log", train, val)
    for name, status in (("val_off", 1), ("train_off", 1), ("same", 0)):
        r = run(COMPARE, tmp_path / name, tmp_path / "b")
        assert r.returncode == status, name + r.stdout + r.stderr
        assert (tmp_path / name / "compare_loss.png").stat().st_size > 0  # default --out: A/compare_loss.png


def test_default_out_for_a_file_is_in_cwd(tmp_path):
    write_main_log(tmp_path / "a" / "main.log", {0: 5.0, 1: 4.0}, {1: 4.5})
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    r = run(COMPARE, tmp_path / "a" / "main.log", tmp_path / "a" / "main.log", cwd=cwd)
    assert r.returncode == 0, r.stderr
    assert (cwd / "compare_loss.png").read_bytes().startswith(PNG_MAGIC)


def assert_bad_input(result, *fragments):
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


@pytest.mark.parametrize("bad", ["s:12 trl:oops", "step 12 loss 3.2", "s:x trl:3.0", "s:12", "s:12 trl3.0"])
def test_malformed_line(tmp_path, bad):
    write_main_log(tmp_path / "b" / "main.log", {s: 3.0 for s in range(20)}, {19: 3.0})
    log = tmp_path / "a" / "main.log"
    write_main_log(log, {s: 3.0 for s in range(20)}, {19: 3.0})
    lines = log.read_text().splitlines()
    lines.insert(6, bad)
    log.write_text("\n".join(lines) + "\n")
    r = run(COMPARE, tmp_path / "a", tmp_path / "b", "--out", tmp_path / "p.png")
    assert_bad_input(r, f"{log}:7", "malformed")
    assert not (tmp_path / "p.png").exists()


def test_missing_file_and_directory_without_log(tmp_path):
    write_main_log(tmp_path / "b" / "main.log", {0: 3.0}, {0: 3.0})
    missing = tmp_path / "nope" / "main.log"
    assert_bad_input(run(COMPARE, missing, tmp_path / "b"), str(missing))
    (tmp_path / "empty_dir").mkdir()
    assert_bad_input(run(COMPARE, tmp_path / "b", tmp_path / "empty_dir"), str(tmp_path / "empty_dir"), "main.log")


def test_no_overlapping_steps(tmp_path):
    write_main_log(tmp_path / "a" / "main.log", {s: 3.0 for s in range(10)}, {9: 3.0})
    write_main_log(tmp_path / "b" / "main.log", {s: 3.0 for s in range(100, 110)}, {109: 3.0})
    assert_bad_input(run(COMPARE, tmp_path / "a", tmp_path / "b"), "no aligned train steps")
    # Train overlaps but val does not: the verdict needs a val loss, so still bad input.
    write_main_log(tmp_path / "c" / "main.log", {s: 3.0 for s in range(10)}, {5: 3.0})
    assert_bad_input(run(COMPARE, tmp_path / "a", tmp_path / "c"), "no aligned val steps")


def test_nan_loss_fails_the_check(tmp_path):
    train = {s: 3.0 for s in range(10)}
    write_main_log(tmp_path / "b" / "main.log", train, {9: 3.0})
    write_main_log(tmp_path / "a" / "main.log", train, {9: float("nan")})
    r = run(COMPARE, tmp_path / "a", tmp_path / "b")
    assert r.returncode == 1, r.stdout + r.stderr


def perturbed_run(rng, path, base, scale, train_steps, val_steps):
    """A run whose losses are the baseline walk `base` times `scale` plus noise; returns the read-back curves."""
    train = {s: base[s] * scale + 0.01 * rng.standard_normal() for s in train_steps}
    val = {s: base[s] * scale - 0.05 + 0.002 * rng.standard_normal() for s in val_steps}
    return write_main_log(path / "main.log", train, val)


def parse_blocks(stdout):
    """{label: (letter, baseline label, rows as parse_summary gives them, PASS or FAIL)}, one per checked run."""
    blocks = {}
    for chunk in stdout.split("\n\n"):
        lines = chunk.splitlines()
        if len(lines) < 2 or "(baseline);" not in lines[1]:
            continue
        run = re.match(r"^(\w+) = .+ \[(.+)\]$", lines[0])
        base = re.match(r"^\w+ = .+ \[(.+)\] \(baseline\); ", lines[1])
        assert run and base, chunk
        blocks[run.group(2)] = (run.group(1), base.group(1), parse_summary(chunk), lines[-1].split(":")[0])
    return blocks


def assert_rows_match(rows, want):
    for curve in ("train", "val"):
        n, final, worst, at = rows[curve]
        w_n, w_final, w_worst, w_at = want[curve]
        assert (n, at) == (w_n, w_at), curve
        assert final == pytest.approx(w_final, rel=1e-3, abs=1e-9), curve
        assert worst == pytest.approx(w_worst, rel=1e-3, abs=1e-9), curve


def three_runs(rng, tmp_path, scales):
    """The baseline (steps 0..149, a few missing) and two runs at `scales` of it, each over its own step set,
    so each pair's common steps differ. Returns {name: read-back curves} for names bf16, r1, r2."""
    base = random_walk(rng, 200)
    missing = set(rng.choice(np.arange(1, 149), size=7, replace=False).tolist())
    runs = {"bf16": write_main_log(tmp_path / "bf16" / "main.log", {s: base[s] for s in set(range(150)) - missing},
                                   {s: base[s] - 0.05 for s in list(range(0, 150, 20)) + [149]})}
    runs["r1"] = perturbed_run(rng, tmp_path / "r1", base, scales[0], range(180), list(range(0, 180, 10)) + [149])
    runs["r2"] = perturbed_run(rng, tmp_path / "r2", base, scales[1], [s for s in range(160) if s % 11],
                               list(range(0, 160, 20)) + [149])
    return runs


def test_three_runs_one_within_one_not(rng, tmp_path):
    runs = three_runs(rng, tmp_path, scales=(1.002, 1.03))
    want = {name: expected_differences(runs[name], runs["bf16"], 20) for name in ("r1", "r2")}
    assert max(want["r1"]["train"][1], want["r1"]["val"][1]) < 0.01 < min(want["r2"]["train"][1],
                                                                          want["r2"]["val"][1])
    # The baseline in the middle: r1 is A, bf16 is B, r2 is C.
    r = run(COMPARE, tmp_path / "r1", tmp_path / "bf16", tmp_path / "r2", "--baseline", 1,
            "--labels", "r1", "bf16", "r2", "--tolerance", 0.01)
    assert r.returncode == 1, r.stdout + r.stderr
    blocks = parse_blocks(r.stdout)
    assert sorted(blocks) == ["r1", "r2"], r.stdout
    for name, letter, verdict in (("r1", "A", "PASS"), ("r2", "C", "FAIL")):
        got_letter, baseline, rows, got_verdict = blocks[name]
        assert (got_letter, baseline, got_verdict) == (letter, "bf16", verdict), name
        assert_rows_match(rows, want[name])
    overall = [line for line in r.stdout.splitlines() if line.startswith("overall")]
    assert len(overall) == 1 and overall[0].startswith("overall FAIL"), r.stdout
    assert overall[0].endswith("of baseline B [bf16]: C [r2]"), overall[0]  # r2 alone named as not within
    # default --out: the first checked run's directory
    assert (tmp_path / "r1" / "compare_loss.png").read_bytes().startswith(PNG_MAGIC)
    assert not (tmp_path / "bf16" / "compare_loss.png").exists()


def test_three_runs_all_within(rng, tmp_path):
    runs = three_runs(rng, tmp_path, scales=(1.002, 0.997))
    want = {name: expected_differences(runs[name], runs["bf16"], 5) for name in ("r1", "r2")}
    tolerance = 1.5 * float(max(want[name][curve][1] for name in want for curve in ("train", "val")))
    out = tmp_path / "plot.png"
    # The baseline last (the default); labels from the directories' names.
    r = run(COMPARE, tmp_path / "r1", tmp_path / "r2", tmp_path / "bf16", "--smooth", 5,
            "--tolerance", repr(tolerance), "--out", out)
    assert r.returncode == 0, r.stdout + r.stderr
    blocks = parse_blocks(r.stdout)
    assert sorted(blocks) == ["r1", "r2"], r.stdout
    for name, letter in (("r1", "A"), ("r2", "B")):
        got_letter, baseline, rows, verdict = blocks[name]
        assert (got_letter, baseline, verdict) == (letter, "bf16", "PASS"), name
        assert_rows_match(rows, want[name])
    assert re.search(r"^overall PASS: all 2 runs within .* of baseline C \[bf16\]$", r.stdout, re.MULTILINE), r.stdout
    assert out.read_bytes().startswith(PNG_MAGIC) and out.stat().st_size > 10_000


@pytest.mark.parametrize("args, fragments", [
    (["r1"], ["RUN:", "1 run given", "at least 2"]),
    (["r1", "r2", "bf16", "--labels", "x", "y"], ["--labels:", "2 labels for 3 runs"]),
    (["r1", "r2", "bf16", "--baseline", "3"], ["--baseline:", "0..2"]),
    (["--labels", "x", "y", "r1", "bf16"], ["RUN:", "0 runs given", "--labels", "after the runs"]),
])
def test_bad_run_count_labels_or_baseline(tmp_path, args, fragments):
    for name in ("r1", "r2", "bf16"):
        write_main_log(tmp_path / name / "main.log", {0: 3.0, 1: 2.9}, {1: 2.9})
    out = tmp_path / "p.png"
    assert_bad_input(run(COMPARE, *args, "--out", out, cwd=tmp_path), *fragments)
    assert not out.exists()


def load_script(path, module_name):
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def two_run_script(tmp_path_factory):
    """compare_loss.py as of TWO_RUN_COMMIT, loaded as a module (skips when the clone lacks that commit)."""
    shown = subprocess.run(["git", "-C", str(REPO), "show", f"{TWO_RUN_COMMIT}:scripts/compare_loss.py"],
                           capture_output=True, text=True)
    if shown.returncode != 0:
        pytest.skip(f"the two-run compare_loss.py (commit {TWO_RUN_COMMIT[:12]}) is not in this clone: "
                    f"{shown.stderr.strip()}")
    path = tmp_path_factory.mktemp("two_run") / "compare_loss_two_run.py"
    path.write_text(shown.stdout)
    return load_script(path, "compare_loss_two_run")


def call_main(module, args):
    """(exit status, stdout, stderr) of a compare_loss.py module's main() as its __main__ block gives them."""
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout):
        try:
            status = module.main([str(arg) for arg in args])
        except module.InputError as e:
            print(f"compare_loss.py: error: {e}", file=stderr)
            status = 2
    return status, stdout.getvalue(), stderr.getvalue()


def run_in_process(module, args, monkeypatch):
    """call_main() with the module's plot left out (no PNG is written; the plot line is still printed)."""
    monkeypatch.setattr(module, "plot", lambda *a, **k: None)
    return call_main(module, args)


@pytest.fixture(scope="module")
def compare_module():
    return load_script(COMPARE, "compare_loss_n_runs")


TRAIN_ROW = re.compile(r"^train \(smoothed \d+\) .*$", re.MULTILINE)
VERDICT_LINE = re.compile(r"^(PASS|FAIL)(: at step \d+ val rel \S+ (<=|not <=) \S+; at step \d+ smoothed train rel )"
                          r"(\S+) (<=|not <=) (\S+)$", re.MULTILINE)


def with_numpy_train_figures(two_run_output, a_train, b_train, smooth, tolerance):
    """(stdout, status) of the two-run script with its train figures replaced by numpy's: the train row's
    final A / final B / final rel (the means over the last `smooth` aligned steps) and max rel / at step
    (the centred moving average), and the verdict line's smoothed train rel (of those means), its `<=` and
    the PASS/FAIL word; and, where the run is too short for a centred window of `smooth`, the line under the
    table that says so. Everything else is the two-run script's."""
    status, stdout = two_run_output
    if not TRAIN_ROW.search(stdout):  # bad input: no table
        return stdout, status
    steps, _, _, rel, final_a, final_b, final = expected_train(a_train, b_train, smooth)
    row = (f"{f'train (smoothed {smooth})':<22} {len(steps):>6d} {final_a:>10.6f} {final_b:>10.6f} "
           f"{final:>11.4e} {rel.max():>11.4e} {int(steps[np.argmax(rel)]):>8d}")
    width = curve_width(len(steps), smooth)
    note = "" if width == smooth else (
        f"train max rel: centred mean over {width} steps (a quarter of the {len(steps)} aligned steps, not "
        f"--smooth {smooth}); final columns: means over the last {min(smooth, len(steps))}\n")
    stdout = TRAIN_ROW.sub(row, stdout)
    train_within = bool(final <= tolerance)
    verdict = VERDICT_LINE.search(stdout)
    passed = verdict.group(3) == "<=" and train_within
    stdout = VERDICT_LINE.sub(lambda m: f"{note}{'PASS' if passed else 'FAIL'}{m.group(2)}{final:.4e} "
                                        f"{'<=' if train_within else 'not <='} {m.group(6)}", stdout)
    return stdout, 0 if passed else 1


def final_columns(stdout):
    """The train row up to its max rel (label, steps, final A, final B, final rel) and the verdict line."""
    row, verdict = TRAIN_ROW.search(stdout), VERDICT_LINE.search(stdout)
    return row and row.group(0).split()[:7], verdict and verdict.group(0)


def test_two_runs_print_as_before(rng, tmp_path, monkeypatch, two_run_script, compare_module):
    """Two runs, A against baseline B: the same stdout, stderr and exit status as the two-run script of
    TWO_RUN_COMMIT, except for the train row's max rel and its step. That script smoothed with a trailing
    mean, which lags the loss by (window - 1) / 2 steps; the train curve is now a centred moving average
    (centred_mean() here), while the final train values and the verdict are the means over the last
    --smooth aligned steps (last_mean() here), which is what the trailing mean ended on: the final columns,
    the verdict line and the exit status are the old script's again. The train figures are expected from
    numpy, not from either script's output; that they give back the old final columns is checked too."""
    a, b = make_runs(rng, tmp_path, scale_a=1.004)
    want = expected_differences(a, b, 20)
    tight = min(want["train"][1], want["val"][1]) * 0.5  # both curves out: a FAIL
    nan = write_main_log(tmp_path / "nan" / "main.log", {s: 3.0 for s in range(10)}, {9: float("nan")})
    same = write_main_log(tmp_path / "same" / "main.log", {s: 3.0 for s in range(10)}, {9: 3.0})
    write_main_log(tmp_path / "late" / "main.log", {s: 3.0 for s in range(100, 110)}, {109: 3.0})
    monkeypatch.chdir(tmp_path)
    # (arguments, the checked run's and the baseline's train curves, --smooth, --tolerance)
    cases = [
        (["run_a", "run_b"], a, b, 20, 0.01),  # relative paths, default labels, default --out (run_a/...)
        (["run_a", "run_b/main.log", "--tolerance", repr(float(tight))], a, b, 20, tight),
        (["run_a", "run_b", "--labels", "fp8", "bf16", "--smooth", "5", "--out", "x.png"], a, b, 5, 0.01),
        (["run_a", "--smooth", "3", "run_b"], a, b, 3, 0.01),  # a flag between the runs
        (["run_a/main.log", "run_a/main.log"], a, a, 20, 0.01),  # one name twice; default --out in cwd
        (["nan", "same"], nan, same, 20, 0.01),
        (["same", "late"], same, same, 20, 0.01),  # no aligned steps
        (["run_a", "missing"], a, a, 20, 0.01),
    ]
    statuses = set()
    for args, run_curves, base_curves, smooth, tolerance in cases:
        status, stdout, stderr = run_in_process(compare_module, args, monkeypatch)
        old_status, old_stdout, old_stderr = run_in_process(two_run_script, args, monkeypatch)
        want_stdout, want_status = with_numpy_train_figures((old_status, old_stdout), run_curves[0],
                                                            base_curves[0], smooth, tolerance)
        assert (status, stdout, stderr) == (want_status, want_stdout, old_stderr), args
        assert (status, final_columns(stdout)) == (old_status, final_columns(old_stdout)), args
        statuses.add(status)
    assert statuses == {0, 1, 2}
    assert not list(tmp_path.rglob("*.png"))


def test_centred_smoothing_does_not_lag(compare_module):
    """A linear ramp's smoothed curve is the ramp (at every step: the window is symmetric, also where it
    shrinks at the ends); a trailing mean would lag it by (window - 1) / 2 steps."""
    ramp = 10.0 - 0.05 * np.arange(40)
    for window in (1, 2, 5, 20, 39, 40, 100):
        smoothed = compare_module.moving_average(ramp, window)
        np.testing.assert_allclose(smoothed, ramp, rtol=0, atol=1e-12, err_msg=f"window {window}")
        trailing = np.array([ramp[max(0, i - window + 1):i + 1].mean() for i in range(len(ramp))])
        lag = (window - 1) / 2
        if window < len(ramp):  # a full trailing window: it reads the ramp `lag` steps back
            np.testing.assert_allclose(trailing[window - 1:], 10.0 - 0.05 * (np.arange(window - 1, 40) - lag))
    noisy = np.random.default_rng(0).standard_normal(50)
    for window in (2, 3, 8, 9):
        np.testing.assert_allclose(compare_module.moving_average(noisy, window), centred_mean(noisy, window),
                                   rtol=1e-12, atol=1e-12)


def test_short_run_curve_neither_lags_nor_flattens(tmp_path, compare_module, monkeypatch):
    """A 40-step run whose loss decays as training's does (10.4 -> ~4, steep first): with the default
    --smooth 20, the train curve from step 20 on is within 0.05 nat of the loss. A trailing mean of 20
    reads it ~10 steps back (over a nat high at step 20: a plot that lags); a centred mean of 20 does not
    lag but on this curve still sits ~0.16 nat high there, which is why the curve's window is capped at a
    quarter of the run (10 here). (Over the steepest first steps any centred mean still sits above the
    curve, by ~ its second derivative x the window's variance / 2: 0.23 nat at step 5 here.) The verdict
    still averages the last 20 steps; the table and plot say which window is which."""
    steps = np.arange(40)
    loss = 4.0 + 6.4 * np.exp(-steps / 8.0)
    trailing = np.array([loss[max(0, i - 19):i + 1].mean() for i in steps])
    assert trailing[20] - loss[20] > 1.0 and centred_mean(loss, 20)[20] - loss[20] > 0.1  # what the cap avoids
    a, _ = write_main_log(tmp_path / "a" / "main.log", dict(zip(steps.tolist(), loss * 1.001)), {39: 4.1})
    b, _ = write_main_log(tmp_path / "b" / "main.log", dict(zip(steps.tolist(), loss)), {39: 4.1})
    run_a, run_b = compare_module.read_runs([tmp_path / "a", tmp_path / "b"], None)
    c = compare_module.compare(run_a, run_b, 20, 0.01)
    for raw, curve in ((a, c.train.run), (b, c.train.baseline)):
        raw = np.array([raw[s] for s in steps])
        assert abs(curve[20:] - raw[20:]).max() < 0.05, f"step 20: curve {curve[20]:.4f}, loss {raw[20]:.4f}"
        np.testing.assert_allclose(curve, centred_mean(raw, 10), rtol=0, atol=1e-12)
    assert c.curve_window == 10
    assert (c.train.final_run, c.train.final_baseline) == (pytest.approx(last_mean([a[s] for s in steps], 20)),
                                                           pytest.approx(last_mean([b[s] for s in steps], 20)))
    legends, save = [], compare_module.save_figure

    def save_and_record(fig, out, *args):  # the legends of the train and relative-difference panels
        legends.append([[t.get_text() for t in fig.axes[i].get_legend().get_texts()] for i in (0, 2)])
        save(fig, out, *args)
    monkeypatch.setattr(compare_module, "save_figure", save_and_record)
    status, stdout, stderr = call_main(compare_module, [tmp_path / "a", tmp_path / "b", "--out", tmp_path / "p.png"])
    assert status == 0, stdout + stderr
    assert ("train max rel: centred mean over 10 steps (a quarter of the 40 aligned steps, not --smooth 20); "
            "final columns: means over the last 20") in stdout
    assert legends == [[["a, centred mean of 10", "b, centred mean of 10"],
                        ["train, centred mean of 10", "val", "tolerance 0.01"]]]
    assert [compare_module.curve_window(n, 20) for n in (1, 3, 4, 40, 79, 80, 161)] == [1, 1, 1, 10, 19, 20, 20]


def test_title_and_dpi(tmp_path, compare_module, monkeypatch):
    """--title is a first line above the figure's own title (the runs and the train step count); --dpi sets
    the PNG's pixels (9 x 11 inches: 990 x 1210 at the default 110)."""
    import matplotlib.image
    for name, scale in (("a", 1.001), ("b", 1.0)):
        write_main_log(tmp_path / name / "main.log", {s: scale * (3.0 - 0.01 * s) for s in range(50)}, {49: 2.5})
    titles, save = [], compare_module.save_figure

    def save_and_record(fig, out, *args):
        titles.append(fig._suptitle.get_text())
        save(fig, out, *args)
    monkeypatch.setattr(compare_module, "save_figure", save_and_record)
    out = tmp_path / "t.png"
    status, stdout, stderr = call_main(compare_module, [tmp_path / "a", tmp_path / "b", "--title", "tiny, CPU build",
                                                        "--dpi", "50", "--out", out])
    assert status == 0, stdout + stderr
    assert matplotlib.image.imread(out).shape[:2] == (11 * 50, 9 * 50)
    status, stdout, stderr = call_main(compare_module, [tmp_path / "a", tmp_path / "b", "--out", out])
    assert status == 0 and matplotlib.image.imread(out).shape[:2] == (11 * 110, 9 * 110)
    assert titles == ["tiny, CPU build\na vs b (baseline), 50 train steps", "a vs b (baseline), 50 train steps"]


@pytest.mark.parametrize("smooth, status", [(20, 0), (100, 0), (1, 1)])
def test_train_verdict_is_the_last_window_means(tmp_path, compare_module, monkeypatch, smooth, status):
    """The train verdict compares the two runs' means over their last `smooth` aligned steps (all of them
    when fewer), not the last step: A is 0.2% above a ramp B but 5% above it at the last aligned step, and
    logged 10 steps more (at loss 100: not aligned, so not averaged); B lacks step 30, which the window
    skips.
    The means are within 1%, the last step is not (the verdict for smooth 1); the centred curve still
    shows the last step's 5% as its max rel, there, where its window has shrunk to that step."""
    b_steps = [s for s in range(40) if s != 30]
    b_train = {s: 3.0 - 0.01 * s for s in b_steps}
    a_train = {s: v * 1.002 for s, v in b_train.items()} | {39: b_train[39] * 1.05} | {s: 100.0 for s in range(40, 50)}
    a, _ = write_main_log(tmp_path / "a" / "main.log", a_train, {39: 2.6})
    b, _ = write_main_log(tmp_path / "b" / "main.log", b_train, {39: 2.6})
    status_got, stdout, stderr = run_in_process(compare_module, [tmp_path / "a", tmp_path / "b", "--smooth", smooth],
                                                monkeypatch)
    assert status_got == status, stdout + stderr
    raw_a, raw_b = [a[s] for s in b_steps], [b[s] for s in b_steps]
    want_a, want_b = last_mean(raw_a, smooth), last_mean(raw_b, smooth)
    want = abs(want_a - want_b) / abs(want_b)
    assert (want < 0.01) == (status == 0) and abs(raw_a[-1] - raw_b[-1]) / raw_b[-1] > 0.01
    cells = TRAIN_ROW.search(stdout).group(0).split()
    assert cells[:4] == ["train", "(smoothed", f"{smooth})", str(len(b_steps))], stdout
    final_a, final_b, final, worst = map(float, cells[4:8])
    assert (final_a, final_b) == (pytest.approx(want_a, abs=1e-6), pytest.approx(want_b, abs=1e-6)), stdout
    assert final == pytest.approx(want, rel=1e-3), stdout
    assert worst == pytest.approx(abs(raw_a[-1] - raw_b[-1]) / raw_b[-1], rel=1e-3) and cells[8] == "39", stdout
    verdict = VERDICT_LINE.search(stdout)
    assert verdict.group(1) == ("PASS" if status == 0 else "FAIL") and "at step 39 smoothed" in verdict.group(2)
    assert float(verdict.group(4)) == pytest.approx(want, rel=1e-3), stdout


# --- compare_loss.py: downstream scores (metrics.jsonl) ------------------------------------------

OTHER_METRICS_LINES = [  # the objects of metrics.jsonl the score table must skip
    {"step": 0, "loss": 10.39, "lr": 5e-05, "grad_norm": 2.7, "linears": "fp8"},
    {"step": 0, "val_loss": 10.40},
    {"step": 0, "shadow_loss_fp8": 10.39, "shadow_loss_bf16": 10.38, "shadow_rel_diff": 1e-3},
    {"step": 0, "event": "fallback", "reason": "eval"},  # "eval" as text, not as a key
    {"step": 0, "alert": "saturation", "layer": 0, "gemm": "wo", "operand": "X", "value": 0.1},
]


def write_metrics(path, evals):
    """metrics.jsonl with `evals` ([(step, set, {metric: value or None}, examples)]) as the trainer writes
    them (JSON numbers that round-trip; null for not finite), among the other objects a run writes."""
    lines = [json.dumps(row) for row in OTHER_METRICS_LINES]
    for step, name, scores, examples in evals:
        lines.append(json.dumps({"step": step, "eval": name, **scores, "examples": examples}))
        lines.append(json.dumps({"step": step, "loss": 3.0}))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


def random_scores(rng, name, examples):
    """One evaluation's scores as train/evals.h names them: accuracies k / n, perplexities > 1."""
    acc = lambda: int(rng.integers(0, examples + 1)) / examples
    if name == "hellaswag":
        return {"acc": acc(), "acc_norm": acc(), "acc_llmc": acc()}
    if name == "lambada":
        return {"acc": acc(), "perplexity": float(10 ** rng.uniform(1, 4))}
    bpb = float(rng.uniform(1, 5))
    return {"word_perplexity": float(10 ** rng.uniform(2, 6)), "byte_perplexity": 2 ** bpb, "bits_per_byte": bpb}


def parse_cell(text):
    """A printed score cell: None for "-" (missing), "null", a fraction for "+1.234%", else the number."""
    if text == "-":
        return None
    if text == "null":
        return "null"
    return float(text[:-1]) / 100 if text.endswith("%") else float(text)


def parse_scores(stdout):
    """(header cells, step, {(set, metric): [cells]}) of the printed downstream-score table."""
    lines = stdout.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("downstream scores"))
    step = int(re.match(r"downstream scores at step (\d+),", lines[first]).group(1))
    header = re.split(r"\s{2,}", lines[first + 2].strip())
    assert set(lines[first + 3]) == {"-"}, lines[first + 3]
    rows = {}
    for line in lines[first + 4:]:
        if line.startswith("differences:"):
            break
        cells = line.split()
        assert len(cells) == len(header), line
        rows[(cells[0], cells[1])] = [parse_cell(c) for c in cells[2:-1]] + [cells[-1]]  # examples as printed
    return header, step, rows


def assert_cell(got, want, metric, kind):
    """A printed cell against the independent value: None (missing) and "null" exactly, numbers to the
    printed precision (accuracies and SE 4 decimals, other scores 6 digits, relative differences 0.001%)."""
    if want is None or want == "null":
        assert got == want, (metric, kind, got, want)
    elif kind == "value" and not metric.startswith("acc"):
        assert got == pytest.approx(want, rel=1e-5), (metric, kind)
    elif kind == "diff" and not metric.startswith("acc"):
        assert got == pytest.approx(want, abs=6e-6), (metric, kind)
    else:
        assert got == pytest.approx(want, abs=6e-5), (metric, kind)


def eval_runs(rng, tmp_path):
    """Three runs with evaluations: fp8 (A: steps 0, 10, 20), delayed (B: steps 0, 10; no lambada; a null
    perplexity at step 10; 40 hellaswag examples) and the baseline bf16 (C: 0, 10, 20, its step 10 logged
    twice, as by a resumed run: the later wins). The last step all three evaluated is 10, not 20.
    Returns {run: {(step, set): (scores, examples)}}, the objects that count."""
    plan = {"fp8": ((0, 10, 20), ("hellaswag", "lambada", "wikitext")),
            "delayed": ((0, 10), ("hellaswag", "wikitext")),
            "bf16": ((0, 10, 20), ("hellaswag", "lambada", "wikitext"))}
    examples = {"hellaswag": 50, "lambada": 30, "wikitext": 2}
    runs = {}
    for run_name, (steps, sets) in plan.items():
        written, kept = [], {}
        for step in steps:
            for name in sets:
                n = 40 if (run_name, name) == ("delayed", "hellaswag") else examples[name]
                scores = random_scores(rng, name, n)
                if (run_name, step, name) == ("delayed", 10, "wikitext"):
                    scores["word_perplexity"] = None
                if (run_name, step) == ("bf16", 10):  # an earlier object of the same step, overridden
                    written.append((step, name, random_scores(rng, name, n), n))
                written.append((step, name, scores, n))
                kept[(step, name)] = (scores, n)
        write_main_log(tmp_path / run_name / "main.log", {s: 3.0 - 0.01 * s for s in range(21)}, {0: 3.0, 20: 2.8})
        write_metrics(tmp_path / run_name / "metrics.jsonl", written)
        runs[run_name] = kept
    return runs


def test_score_table(rng, tmp_path, compare_module, monkeypatch):
    runs = eval_runs(rng, tmp_path)
    status, stdout, stderr = run_in_process(
        compare_module, [tmp_path / "fp8", tmp_path / "delayed", tmp_path / "bf16", "--labels", "fp8", "delayed",
                         "bf16"], monkeypatch)
    assert status == 0 and not stderr, stdout + stderr  # identical losses: the scores do not judge
    header, step, rows = parse_scores(stdout)
    assert step == 10, stdout
    assert header == ["set", "metric", "A", "B", "C", "A - C", "B - C", "SE C", "examples"], header
    assert "runs A [fp8], B [delayed]; baseline C [bf16]" in stdout
    want_rows = [(name, metric) for name in ("hellaswag", "lambada", "wikitext")
                 for metric in runs["fp8"][(10, name)][0]]
    assert list(rows) == want_rows, stdout
    for name, metric in want_rows:
        got = dict(zip(header[2:], rows[(name, metric)]))
        scores = {r: runs[r].get((10, name)) for r in ("fp8", "delayed", "bf16")}
        value = {r: None if s is None else "null" if s[0][metric] is None else s[0][metric] for r, s in scores.items()}
        base = value["bf16"]
        for letter, r in (("A", "fp8"), ("B", "delayed"), ("C", "bf16")):
            assert_cell(got[letter], value[r], metric, "value")
        for letter, r in (("A", "fp8"), ("B", "delayed")):
            v = value[r]
            if v is None:
                diff = None
            elif v == "null":
                diff = "null"
            else:
                diff = v - base if metric.startswith("acc") else (v - base) / base
            assert_cell(got[f"{letter} - C"], diff, metric, "diff")
        n = scores["bf16"][1]
        assert_cell(got["SE C"], math.sqrt(base * (1 - base) / n) if metric.startswith("acc") else None, metric, "se")
        counts = {str(s[1]) for s in scores.values() if s}  # one count, or each run's in column order
        assert got["examples"] == (counts.pop() if len(counts) == 1 else
                                   "/".join(str(s[1]) if s else "-" for s in scores.values())), (name, metric)
    # the cases spelled out: B lacks lambada, its word perplexity is null, its hellaswag count differs
    assert rows[("lambada", "acc")][1] is None and rows[("lambada", "acc")][4] is None
    assert rows[("lambada", "acc")][-1] == "30"
    assert rows[("wikitext", "word_perplexity")][1] == "null" and rows[("wikitext", "word_perplexity")][4] == "null"
    assert rows[("hellaswag", "acc")][-1] == "50/40/50"


def test_score_table_nulls_and_no_common_step(tmp_path, compare_module, monkeypatch):
    """A baseline score of null: its cells, the differences and the SE read null. Runs whose evaluations
    share no step: one line says so. A metrics.jsonl without evaluations: no table at all."""
    for name in ("a", "b"):
        write_main_log(tmp_path / name / "main.log", {s: 3.0 for s in range(5)}, {4: 3.0})
    write_metrics(tmp_path / "a" / "metrics.jsonl", [(4, "lambada", {"acc": 0.5, "perplexity": 12.0}, 4)])
    write_metrics(tmp_path / "b" / "metrics.jsonl", [(4, "lambada", {"acc": None, "perplexity": None}, 4)])
    status, stdout, _ = run_in_process(compare_module, [tmp_path / "a", tmp_path / "b"], monkeypatch)
    assert status == 0
    _, step, rows = parse_scores(stdout)
    assert step == 4
    assert rows == {("lambada", "acc"): [0.5, "null", "null", "null", "4"],
                    ("lambada", "perplexity"): [12.0, "null", "null", None, "4"]}, stdout
    write_metrics(tmp_path / "b" / "metrics.jsonl", [(3, "lambada", {"acc": 0.25, "perplexity": 9.0}, 4)])
    status, stdout, _ = run_in_process(compare_module, [tmp_path / "a", tmp_path / "b"], monkeypatch)
    assert status == 0
    assert "downstream scores: no step evaluated by every run (A: 4; B: 3)" in stdout, stdout
    write_metrics(tmp_path / "a" / "metrics.jsonl", [])
    (tmp_path / "b" / "metrics.jsonl").unlink()
    with_metrics = run_in_process(compare_module, [tmp_path / "a", tmp_path / "b"], monkeypatch)
    (tmp_path / "a" / "metrics.jsonl").unlink()
    assert with_metrics == run_in_process(compare_module, [tmp_path / "a", tmp_path / "b"], monkeypatch)
    assert "downstream" not in with_metrics[1]


def test_score_table_bad_evaluation_line(tmp_path, compare_module, monkeypatch):
    write_main_log(tmp_path / "a" / "main.log", {0: 3.0}, {0: 3.0})
    metrics = tmp_path / "a" / "metrics.jsonl"
    for bad in ['{"step": 0, "eval": "lambada", "acc": "high", "examples": 3}', '{"step": 0, "eval": "lambada", "acc',
                '{"step": "0", "eval": "lambada", "acc": 0.5, "examples": 3}']:
        write_metrics(metrics, [(0, "lambada", {"acc": 0.5}, 3)])
        metrics.write_text(metrics.read_text() + bad + "\n")
        status, _, stderr = run_in_process(compare_module, [tmp_path / "a", tmp_path / "a"], monkeypatch)
        line = len(metrics.read_text().splitlines())
        assert status == 2 and f"{metrics}:{line}: malformed evaluation line" in stderr, (bad, stderr)


def test_plot_panels(rng, tmp_path, compare_module, monkeypatch):
    """The PNG gets one panel per evaluation set under the three loss panels (log scale for wikitext's word
    perplexity); without evaluations it keeps its three panels and size."""
    import matplotlib.image
    eval_runs(rng, tmp_path)
    figures, save = [], compare_module.save_figure

    def save_and_record(fig, out, *args):  # each panel's (y label, y scale, curves drawn), then the real save
        figures.append([(ax.get_ylabel(), ax.get_yscale(), len(ax.get_lines())) for ax in fig.axes])
        save(fig, out, *args)
    monkeypatch.setattr(compare_module, "save_figure", save_and_record)
    out = tmp_path / "evals.png"
    status, stdout, stderr = call_main(compare_module, [tmp_path / "fp8", tmp_path / "delayed", tmp_path / "bf16",
                                                        "--out", out])
    assert status == 0, stdout + stderr
    axes = figures[-1]
    assert len(axes) == 6, axes
    assert [a[0] for a in axes[:3]] == ["train loss", "val loss", "|run - bf16| / |bf16|"]
    assert axes[3:] == [("hellaswag acc_norm", "linear", 3), ("lambada acc", "linear", 2),
                        ("wikitext word_perplexity", "log", 3)], axes
    png = matplotlib.image.imread(out)
    assert out.read_bytes().startswith(PNG_MAGIC) and png.shape[:2] == (round((11 + 3 * 3) * 110), 9 * 110)
    for name in ("fp8", "delayed", "bf16"):
        (tmp_path / name / "metrics.jsonl").unlink()
    status, stdout, stderr = call_main(compare_module, [tmp_path / "fp8", tmp_path / "bf16", "--out", out])
    assert status == 0, stdout + stderr
    assert len(figures[-1]) == 3 and matplotlib.image.imread(out).shape[:2] == (11 * 110, 9 * 110)


# --- plot_fp8_stats.py -----------------------------------------------------------------------------

GEMMS = ("wqkv", "wo", "w13", "w2")
OPERANDS = (("W", "E4M3", 448.0), ("X", "E4M3", 448.0), ("dY", "E5M2", 57344.0))


def write_stats(path, rng, steps=(0, 20, 40), layers=3):
    """A synthetic fp8_stats.csv (fractions are often exactly 0, as in real runs); returns the rows."""
    rows = []
    for step in steps:
        for layer in range(layers):
            for gemm in GEMMS:
                for operand, fmt, fp8_max in OPERANDS:
                    amax = float(10.0 ** rng.uniform(-5, 1))
                    sat = float(rng.uniform(0, 1e-3)) if rng.random() < 0.7 else 0.0
                    under = float(rng.uniform(0, 1e-2)) if rng.random() < 0.5 else 0.0
                    rows.append((step, layer, gemm, operand, fmt, amax, fp8_max / amax, sat, under))
    path.parent.mkdir(parents=True, exist_ok=True)
    text = [STATS_HEADER] + [f"{s},{l},{g},{o},{f},{a:.6e},{sc:.6e},{sat:.6e},{u:.6e}"
                             for s, l, g, o, f, a, sc, sat, u in rows]
    path.write_text("\n".join(text) + "\n")
    return rows


def test_fp8_stats_worst_table(rng, tmp_path):
    csv_path = tmp_path / "run" / "fp8_stats.csv"
    rows = write_stats(csv_path, rng)
    r = run(PLOT_STATS, tmp_path / "run")
    assert r.returncode == 0, r.stdout + r.stderr
    last = max(row[0] for row in rows)
    table = {}
    for m in re.finditer(rf"^(\w+)\s+(W|X|dY)\s+(E4M3|E5M2)\s+{NUMBER}\s+(\d+)\s+{NUMBER}\s+(\d+)\s*$", r.stdout,
                         re.MULTILINE):
        table[(m.group(1), m.group(2))] = (float(m.group(4)), float(m.group(6)))
    assert len(table) == len(GEMMS) * len(OPERANDS), r.stdout
    for gemm in GEMMS:
        for operand, _, _ in OPERANDS:
            at_last = np.array([(float(f"{row[8]:.6e}"), float(f"{row[7]:.6e}")) for row in rows
                                if row[0] == last and row[2] == gemm and row[3] == operand])
            under, sat = table[(gemm, operand)]
            assert under == pytest.approx(at_last[:, 0].max(), rel=1e-3, abs=1e-12), (gemm, operand)
            assert sat == pytest.approx(at_last[:, 1].max(), rel=1e-3, abs=1e-12), (gemm, operand)
    png = tmp_path / "run" / "fp8_stats.png"
    assert png.read_bytes().startswith(PNG_MAGIC) and png.stat().st_size > 10_000


def test_fp8_stats_bad_input(rng, tmp_path):
    csv_path = tmp_path / "stats.csv"
    write_stats(csv_path, rng, steps=(0,), layers=1)
    lines = csv_path.read_text().splitlines()
    lines.insert(3, "0,0,wo,X,E4M3,not_a_number,1.0,0,0")
    csv_path.write_text("\n".join(lines) + "\n")
    assert_bad_input(run(PLOT_STATS, csv_path, "--out", tmp_path / "s.png"), f"{csv_path}:4", "malformed")
    lines[3] = "0,0,wo,X,E4M3,1.0,1.0"
    csv_path.write_text("\n".join(lines) + "\n")
    assert_bad_input(run(PLOT_STATS, csv_path), f"{csv_path}:4")
    csv_path.write_text(STATS_HEADER + "\n")
    assert_bad_input(run(PLOT_STATS, csv_path), str(csv_path), "no statistics rows")
    csv_path.write_text("step,layer,amax\n0,0,1.0\n")
    assert_bad_input(run(PLOT_STATS, csv_path), f"{csv_path}:1", "header")
    assert_bad_input(run(PLOT_STATS, tmp_path / "missing"), str(tmp_path / "missing"))
