"""
FP8 against BF16 on tiny-shakespeare (DESIGN.md section 9): the same seed, data and model trained 100
steps in each recipe; the final validation loss (and smoothed train loss) must agree within 1%,
as judged by scripts/compare_loss.py, and both runs must learn (val loss far below ln 32000 = 10.37).
"""
import math
import sys
import re

from conftest import run

# The `tiny` preset with small micro-batches: 100 steps, about 30 s for each run on 2 cores (val rel 4.1e-3).
FLAGS = ["-b", "4", "-t", "64", "-x", "100", "-v", "50", "-m", "16", "-u", "30", "-l", "2e-3", "--seed", "4242"]


def final_val_loss(log):
    values = [float(v) for v in re.findall(r"tel:(\S+)", log.read_text())]
    assert values, f"no val loss in {log}"
    return values[0], values[-1]


def test_fp8_tracks_bf16(trainer, tmp_path, shakespeare):
    dirs = {}
    for precision in ["bf16", "fp8"]:
        out = tmp_path / precision
        extra = ["--fp8-stats", "50"] if precision == "fp8" else []
        r = run([trainer, *FLAGS, "-p", precision, "-o", out, *extra])
        assert r.returncode == 0, r.stderr
        dirs[precision] = out
    for precision, out in dirs.items():
        first, last = final_val_loss(out / "main.log")
        print(f"{precision}: val loss {first:.4f} -> {last:.4f}")
        assert first > 0.9 * math.log(32000), f"{precision}: initial val loss {first} is not that of a random model"
        assert last < 0.7 * first, f"{precision}: val loss fell only from {first} to {last}"
    r = run([sys.executable, "scripts/compare_loss.py", dirs["fp8"], dirs["bf16"], "--labels", "fp8", "bf16",
             "--tolerance", "0.01", "--out", tmp_path / "compare.png"])
    print(r.stdout)
    assert r.returncode == 0, f"fp8 vs bf16 not within 1%:\n{r.stdout}\n{r.stderr}"
    assert (tmp_path / "compare.png").stat().st_size > 0
    stats = (dirs["fp8"] / "fp8_stats.csv").read_text().splitlines()
    assert stats[0].startswith("step,layer,gemm,operand,format,amax,scale")
    assert len(stats) > 1 + 4 * 4 * 3, "fp8_stats.csv has fewer rows than one step's operands"
