"""
Tests of scripts/plot_shadow.py on synthetic metrics.jsonl files written here (the trainer's format,
train/logger.h): the summary's numbers against numpy on the same values, the BF16 stretches, events and
alerts it reports, the PNG, and one-line errors for bad input.
"""
import json
import sys

import numpy as np
import pytest

from conftest import REPO, run

SCRIPT = REPO / "scripts" / "plot_shadow.py"
BF16_STEPS = [8, 9, 10]
CHECKS = [0, 5, 15]


def write_metrics(path, rng, rel, grads=True):
    """20 steps, the block linears in BF16 at BF16_STEPS, checks at CHECKS with relative differences `rel`
    (None: null), a fallback after step 7 and a recovery after step 10, three alerts."""
    lines = []
    for step in range(20):
        lines.append({"step": step, "loss": float(10 - 0.1 * step + rng.normal(0, 0.01)), "ms": 100.0,
                      "linears": "bf16" if step in BF16_STEPS else "fp8"})
        if step in CHECKS:
            k = CHECKS.index(step)
            check = {"step": step, "shadow_loss_fp8": 9.0, "shadow_loss_bf16": 9.0, "shadow_rel_diff": rel[k],
                     "shadow_over_tol": int(rel[k] is None or rel[k] > 1e-3), "shadow_ms": 10.0 * (k + 1),
                     "shadow_share": 0.05 + 0.01 * k}
            if grads:
                check.update({"grad_cosine": 0.999 - 0.001 * k, "grad_norm_rel_diff": 0.01, "grad_worst_layer": k,
                              "grad_worst_cosine": 0.99 - 0.001 * k, "grad_worst_norm_rel_diff": 0.02})
            lines.append(check)
        if step == 7:
            lines.append({"step": 7, "event": "fallback", "reason": "over"})
        if step == 10:
            lines.append({"step": 10, "event": "recover", "reason": "done"})
        if step in (5, 15):
            lines.append({"step": step, "alert": "underflow", "layer": 1, "gemm": "w2", "operand": "X", "value": 0.2,
                          "threshold": 0.01})
        if step == 5:
            lines.append({"step": 5, "alert": "saturated", "layer": 0, "gemm": "wo", "operand": "W", "value": 0.1,
                          "threshold": 0.01})
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))


def test_summary_and_plot(tmp_path, rng):
    rel = [float(x) for x in rng.uniform(1e-5, 1e-3, size=3)]
    rel[1] = 5e-3  # over the tolerance (1e-3 in write_metrics)
    write_metrics(tmp_path / "metrics.jsonl", rng, rel)
    r = run([sys.executable, SCRIPT, tmp_path, "--tolerance", "1e-3"])
    assert r.returncode == 0, r.stderr
    out = r.stdout
    a = np.array(rel)
    assert "shadow checks: 3 (steps 0..15)" in out
    assert (f"mean {a.mean():.3e}, median {np.median(a):.3e}, max {a.max():.3e} at step 5, "
            f"last {a[-1]:.3e} at step 15") in out, out
    assert "over the tolerance: 1 check(s) (steps 5)" in out
    assert "gradient cosine: mean 0.998000, min 0.997000 at step 15; worst block 2: 0.988000 at step 15" in out, out
    assert "cost: 20.0 ms per check on average, 7.00% of the step time up to the last check" in out, out
    assert "fallback after step 7: over" in out and "recover after step 10: done" in out
    assert "steps with the block linears in BF16: 3 of 20" in out
    assert "alerts: 3" in out and "w2[layer 1] X underflow: 2 at steps 5, 15" in out and "wo[layer 0] W saturated: 1 at steps 5" in out
    png = tmp_path / "shadow.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_nonfinite_difference_and_no_gradients(tmp_path, rng):
    write_metrics(tmp_path / "metrics.jsonl", rng, [1e-4, None, 2e-4], grads=False)
    r = run([sys.executable, SCRIPT, tmp_path / "metrics.jsonl", "--out", tmp_path / "s.png"])
    assert r.returncode == 0, r.stderr
    assert "non-finite differences: 1 check(s)" in r.stdout and "max 2.000e-04 at step 15" in r.stdout
    assert "gradient cosine" not in r.stdout
    assert (tmp_path / "s.png").stat().st_size > 0


@pytest.mark.parametrize("case, needle", [
    ("missing", "no such file"),
    ("malformed", "metrics.jsonl:2: not a metrics object"),
    ("no_checks", "no shadow checks"),
])
def test_bad_input(tmp_path, case, needle):
    metrics = tmp_path / "metrics.jsonl"
    if case == "malformed":
        metrics.write_text('{"step": 0, "loss": 1.0}\n{"loss": 2.0}\n')
    elif case == "no_checks":
        metrics.write_text('{"step": 0, "loss": 1.0}\n')
    r = run([sys.executable, SCRIPT, tmp_path])
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("plot_shadow.py: error: ") and needle in lines[0], r.stderr
