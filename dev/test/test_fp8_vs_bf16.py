"""
FP8 against BF16 on tiny-shakespeare (docs/design.md#targets): the same seed, data and model trained 100
steps in each recipe; the final validation loss (and smoothed train loss) must agree within 1%,
as judged by scripts/compare_loss.py, and both runs must learn (val loss far below ln 32000 = 10.37).
scripts/fp8_vs_bf16.sh's choice of downstream evaluations is checked on a copy of it, dry (DRY_RUN=1:
no training run, well under a second).
"""
import math
import os
import re
import shutil
import subprocess
import sys

from conftest import REPO, run, run_side_by_side

# The `tiny` preset with small micro-batches: 100 steps (val rel 4.1e-3), the two runs side by side
# (conftest.run_side_by_side; on a shared 2-core machine 0.27x the wall time of one after the other).
FLAGS = ["-b", "4", "-t", "64", "-x", "100", "-v", "50", "-m", "16", "-u", "30", "-l", "2e-3", "--seed", "4242"]


def final_val_loss(log):
    values = [float(v) for v in re.findall(r"tel:(\S+)", log.read_text())]
    assert values, f"no val loss in {log}"
    return values[0], values[-1]


def test_fp8_tracks_bf16(trainer, tmp_path, shakespeare):
    dirs = {precision: tmp_path / precision for precision in ["bf16", "fp8"]}
    runs = run_side_by_side([[trainer, *FLAGS, "-p", precision, "-o", out, *(["--fp8-stats", "50"] if precision == "fp8" else [])]
                             for precision, out in dirs.items()])
    for precision, r in zip(dirs, runs):
        assert r.returncode == 0, f"{precision}: {r.stderr}"
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


EVAL_FILES = {"hellaswag": "dev/data/hellaswag/hellaswag_val.bin", "lambada": "dev/data/lambada/lambada_test.bin",
              "wikitext": "dev/data/wikitext/wikitext2_test.bin"}


def dry_run(root, evals=None):
    """(evaluations line, {run name: its trainer arguments}) of fp8_vs_bf16.sh copied under `root`, DRY_RUN=1."""
    env = {k: v for k, v in os.environ.items() if k != "EVALS"} | {"DRY_RUN": "1", "TRAINER": shutil.which("true")}
    if evals is not None:
        env["EVALS"] = evals
    r = subprocess.run(["bash", str(root / "scripts" / "fp8_vs_bf16.sh"), "-x", "3"], capture_output=True, text=True,
                       env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    runs = {m.group(1): m.group(2).split() for m in re.finditer(r"^=== (.+?): \S+ (.*) ===$", r.stdout, re.MULTILINE)}
    assert lines[0].startswith("evaluations: ") and list(runs) == ["bf16", "fp8", "fp8 delayed"], r.stdout
    assert not (root / "runs").exists()
    return lines[0], runs


def test_script_passes_evaluations(tmp_path):
    """Each eval file present at its default path adds its flags to every run, a missing one is named with
    the script that makes it; EVALS replaces the flags (EVALS="" runs none)."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(REPO / "scripts" / "fp8_vs_bf16.sh", tmp_path / "scripts")
    for name in ("hellaswag", "wikitext"):
        (tmp_path / EVAL_FILES[name]).parent.mkdir(parents=True)
        (tmp_path / EVAL_FILES[name]).write_bytes(b"")
    line, runs = dry_run(tmp_path)
    assert line == ("evaluations: hellaswag, wikitext (lambada: no dev/data/lambada/lambada_test.bin, make it "
                    "with python dev/data/lambada.py)"), line
    for name, args in runs.items():
        assert args[-2:] == ["-x", "3"] and args[-6:-2] == ["-h", "1", "--eval-wikitext", EVAL_FILES["wikitext"]], name
        assert "--eval-lambada" not in args, name
    line, runs = dry_run(tmp_path, evals="--eval-lambada /data/l.bin")
    assert line == "evaluations: --eval-lambada /data/l.bin (from EVALS)", line
    assert all(args[-4:] == ["--eval-lambada", "/data/l.bin", "-x", "3"] and "-h" not in args for args in runs.values())
    line, runs = dry_run(tmp_path, evals="")
    assert line == "evaluations: none (from EVALS)", line
    assert all(not {"-h", "--eval-lambada", "--eval-wikitext"} & set(args) for args in runs.values())
