"""
The delayed-scaling recipe (--fp8-recipe delayed, fp8/fp8.h) against a numpy implementation of
Transformer Engine's DelayedScaling written from TE's documentation: the recipe's parameters
(margin, amax_history_len, amax_compute_algo "max" | "most_recent"), the per-tensor amax history whose
slot 0 takes the current amax and which rolls by one after each update, and the scale update
scale = (fp8_max / amax) / 2^margin, kept when the amax is 0 or not finite, FP32 max when it
overflows. The C side is reached twice: through build/tools/numerics --fp8-delayed on random amax sequences
with edge values, and through the amaxes and scales a training run records (fp8_stats.csv, every
step), which must follow the reference bit for bit from the second step on; the first step is
current-scaled (docs/precision.md "Delayed scaling").
"""
import csv

import numpy as np
import pytest

from conftest import requires_data, run

FP8_MAX = {"e4m3": np.float32(448.0), "e5m2": np.float32(57344.0)}
FLT_MAX = np.finfo(np.float32).max
# the tiny preset, one 64-token micro-batch per step (so step 0's scales are its own amaxes')
TINY = ["-e", "tiny", "-b", "2", "-t", "32", "-d", "64", "-v", "0", "-s", "0", "--shuffle", "0"]


def pow2_down(scale):
    """A positive normal float32 rounded down to a power of two: its exponent bits alone."""
    return (np.array([scale], np.float32).view(np.uint32) & np.uint32(0xFF800000)).view(np.float32)[0]


def te_scale(amax, prev, fp8_max, margin, pow2):
    scaled_max = np.float32(fp8_max) * np.float32(2.0 ** -margin)
    if not (np.isfinite(amax) and amax > 0):
        return prev
    with np.errstate(over="ignore"):
        scale = np.float32(scaled_max / np.float32(amax))
    if np.isinf(scale):
        scale = FLT_MAX
    return pow2_down(scale) if pow2 else scale


def te_delayed_scaling(amaxes, scale0, fp8_max, history_len, algo, margin, pow2):
    """The scale after each step's update: slot 0 of the history takes the step's amax, the update reads
    max(history) or history[0], then the history rolls so that slot 0 is free again and the oldest entry
    leaves (TE amax_and_scale_update)."""
    history = np.zeros(history_len, np.float32)
    scale, scales = np.float32(scale0), []
    for a in amaxes:
        history[0] = a
        amax = history.max() if algo == "max" else history[0]
        scale = te_scale(amax, scale, fp8_max, margin, pow2)
        scales.append(scale)
        history = np.roll(history, -1)
        history[0] = 0.0
    return np.array(scales, np.float32)


def current_scale(amax, fp8_max, pow2):
    """Current scaling's policy (docs/design.md#current-scaling) for a finite positive amax."""
    scale = np.float32(fp8_max / np.float32(amax))
    scale = FLT_MAX if np.isinf(scale) else scale
    return pow2_down(scale) if pow2 else scale


def random_amaxes(rng, n):
    """Log-uniform amaxes over 20 decades with zeros, subnormals (scale overflows) and repeats mixed in."""
    a = (10.0 ** rng.uniform(-12, 8, n)).astype(np.float32)
    kinds = rng.integers(0, 8, n)
    a[kinds == 0] = 0.0
    a[kinds == 1] = np.float32(1e-44)
    a[kinds == 2] = np.float32(2.0) ** rng.integers(-20, 20, int((kinds == 2).sum()))
    a[:2] = 0.0   # the history starts empty: the first scale must survive zeros
    return a


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("algo", ["max", "most_recent"])
@pytest.mark.parametrize("history_len, margin, pow2", [(1, 0, 0), (3, 0, 1), (16, 2, 0), (5, 7, 1)])
def test_update_matches_te(numerics, tmp_path, rng, fmt, algo, history_len, margin, pow2):
    amaxes = random_amaxes(rng, 64)
    scale0 = np.float32(rng.uniform(0.5, 4.0))
    inp, out = tmp_path / "in.f32", tmp_path / "out.f32"
    np.concatenate([[scale0], amaxes]).astype(np.float32).tofile(inp)
    r = run([numerics, "--fp8-delayed", fmt, algo, margin, pow2, history_len, inp, out])
    assert r.returncode == 0, r.stderr
    got = np.fromfile(out, np.float32).reshape(-1, 2)
    want = te_delayed_scaling(amaxes, scale0, FP8_MAX[fmt], history_len, algo, margin, pow2)
    bad = np.flatnonzero(got[:, 0].view(np.uint32) != want.view(np.uint32))
    assert bad.size == 0, f"step {bad[0]}: amax {amaxes[bad[0]]}, scale {got[bad[0], 0]!r}, TE {want[bad[0]]!r}"
    assert np.array_equal(got[:, 1], np.float32(1.0) / got[:, 0])


def recorded(out):
    """{(layer, gemm, operand): [(amax, scale) of step 0, 1, ...]} of the X and dY rows of fp8_stats.csv."""
    series = {}
    with open(out / "fp8_stats.csv") as f:
        for row in csv.DictReader(f):
            if row["operand"] == "W":
                continue
            key = (int(row["layer"]), row["gemm"], row["operand"])
            assert int(row["step"]) == len(series.setdefault(key, []))
            series[key].append((np.float32(row["amax"]), np.float32(row["scale"])))
    return series


@requires_data
@pytest.mark.parametrize("algo, history_len, margin, pow2", [("max", 3, 0, 0), ("most_recent", 1024, 1, 1)])
def test_training_run_follows_te(trainer, tmp_path, algo, history_len, margin, pow2):
    """Every X and dY operand of a 7-step run: the scale of step t >= 1 is TE's from the amaxes of steps
    0..t-1 (history 3 wraps), and step 0 is current-scaled."""
    out = tmp_path / "run"
    r = run([trainer, *TINY, "-x", 7, "-o", out, "-n", -1, "--fp8-stats", 1, "--fp8-recipe", "delayed",
             "--amax-history", history_len, "--amax-algo", algo, "--fp8-margin", margin, "--pow2-scales", pow2])
    assert r.returncode == 0, r.stderr
    series = recorded(out)
    assert len(series) == 4 * 4 * 2  # tiny: 4 blocks x 4 linears x (X, dY)
    for (layer, gemm, operand), steps in series.items():
        fmt = "e5m2" if operand == "dY" else "e4m3"
        amaxes = np.array([a for a, _ in steps], np.float32)
        scales = np.array([s for _, s in steps], np.float32)
        assert len(steps) == 7 and np.all(amaxes > 0)
        assert scales[0] == current_scale(amaxes[0], FP8_MAX[fmt], pow2), (layer, gemm, operand)
        want = te_delayed_scaling(amaxes[:-1], scales[0], FP8_MAX[fmt], history_len, algo, margin, pow2)
        assert np.array_equal(scales[1:].view(np.uint32), want.view(np.uint32)), (layer, gemm, operand, scales, want)
