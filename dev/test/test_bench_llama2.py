"""
Smoke test of scripts/bench_llama2.sh on the CPU build (--cpu: the tiny model, short sequences) on two
ranks under mpirun: both precisions run with the settings the memory plan chose, warm-up steps are left
out of the means, the FLOP counts and the speed-up are what their formulas give (written out here from
the model's shape), the FP8-LM levels (--grad-reduce, --optim-state, --grad-buffer, --master-weights)
reach the fp8 run only, and the table, bench.json and bench.png are written.
"""
import json
import os
import subprocess

import numpy as np
import pytest

from conftest import REPO
from test_distributed import MPIRUN

# The tiny preset (llama/config.h): C, L, NH, NKV, F, V; the script's CPU sequence length.
C, L, NH, NKV, F, V = 128, 4, 4, 2, 384, 32000
T = 64
STEPS, WARMUP, RANKS = 3, 1, 2


def flops_llmc():
    """6 N + 12 L C T, N the parameters without the embedding (llm.c, PaLM appendix B)."""
    kv = NKV * (C // NH)
    per_layer = C * (C + 2 * kv) + C * C + 2 * F * C + C * F + 2 * C
    return 6 * (L * per_layer + C + V * C) + 12 * L * C * T


@pytest.mark.skipif(MPIRUN is None, reason="mpirun not found (make setup installs Open MPI)")
def test_bench_script_on_the_cpu_build(trainer, tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run(["bash", str(REPO / "scripts" / "bench_llama2.sh"), "7b", str(RANKS), "--cpu", "--steps", str(STEPS),
                        "--warmup", str(WARMUP), "--out", str(tmp_path), "--grad-reduce", "fp8", "--optim-state", "fp8",
                        "--grad-buffer", "fp8", "--master-weights", "fp16"],
                       cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "ETA" in r.stdout
    assert "NeMo 24.07 (published)" in r.stdout and "1.35x" in r.stdout and "1.39x" not in r.stdout
    report = json.loads((tmp_path / "bench.json").read_text())
    bf16, fp8 = report["results"]
    assert (bf16["precision"], fp8["precision"]) == ("bf16", "fp8")
    for key in ["B", "T", "grad_accum", "zero", "recompute", "gpus"]:
        assert bf16[key] == fp8[key], key
    assert bf16["grad_accum"] == 4 // RANKS and bf16["gpus"] == RANKS
    # the trainer takes a bf16/fp8 gradient buffer under ZeRO-1 only on two ranks: both runs use it
    assert bf16["zero"] == 1
    # the FP8-LM levels reach the fp8 run only: bf16 is the baseline
    levels = ("grad_reduce", "optim_state", "grad_buffer", "master_weights")
    assert [fp8[k] for k in levels] == ["fp8", "fp8", "fp8", "fp16"]
    assert [bf16[k] for k in levels] == ["fp32"] * 4
    for run, moments, buffer, master in ((bf16, "fp32", "fp32", "fp32"), (fp8, "fp8", "fp8", "fp16")):
        log = (tmp_path / f"train_{run['precision']}.log").read_text()
        assert f"AdamW moments in {moments}, gradient buffer in {buffer}, master weights in {master}" in log, run["precision"]
        assert ("--grad-buffer fp8 --master-weights fp16" in run["command"]) == (run["precision"] == "fp8")
        assert ("--grad-buffer" in run["command"]) == (run["precision"] == "fp8")
    for run in (bf16, fp8):
        rows = [json.loads(line) for line in (tmp_path / run["precision"] / "metrics.jsonl").read_text().splitlines()]
        steps = [row for row in rows if "loss" in row]
        assert len(steps) == STEPS
        kept = steps[WARMUP:]
        assert run["steps_measured"] == [row["step"] for row in kept]
        assert run["tokens_per_s_per_gpu"] == pytest.approx(np.mean([row["tokens_per_s"] for row in kept]) / RANKS, rel=1e-12)
        assert run["tflops_per_gpu_llmc"] == pytest.approx(flops_llmc() * run["tokens_per_s_per_gpu"] / 1e12, rel=1e-9)
        assert run["mfu_llmc"] is None and run["peak_memory_gib"] > 0
        assert not list((tmp_path / run["precision"]).glob("model_*.bin")), "a benchmark run writes no checkpoint (-n -1)"
    assert fp8["speedup"] == pytest.approx(fp8["tokens_per_s_per_gpu"] / bf16["tokens_per_s_per_gpu"], rel=1e-12)
    assert (tmp_path / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
