"""
End-to-end tests of train_llama_cpu as a user runs it: bad flags, bad shards and bad checkpoints stop
with one line naming the flag or file; a run resumed from a checkpoint repeats the uninterrupted run
exactly; checkpoints load back as models; --profile splits a step into its phases.
"""
import json
import re
import shutil
import struct

import numpy as np
import pytest

from conftest import REPO, run, run_side_by_side

REF_MODEL = REPO / "dev/reference/llama_ref_model.bin"
# A fast configuration of the `tiny` preset for end-to-end runs.
FAST = ["-b", "4", "-t", "64", "-v", "0", "-m", "2"]


def assert_one_line_error(result, *needles):
    assert result.returncode != 0, f"expected failure, got success:\n{result.stdout[-2000:]}"
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, f"expected a one-line error, got:\n{result.stderr}"
    assert lines[0].startswith("error: "), lines[0]
    for needle in needles:
        assert needle in lines[0], f"{needle!r} not in {lines[0]!r}"


@pytest.mark.sanitize
@pytest.mark.parametrize("args, needle", [
    (["--bogus", "1"], "--bogus"),
    (["-q"], "-q"),
    (["-b", "abc"], "-b"),
    (["-l", "nan"], "-l"),
    (["-x", "12x"], "-x"),
    (["-p", "fp16"], "-p"),
    (["-k", "step"], "-k"),
    (["-z", "3"], "-z"),
    (["--grad-reduce", "fp16"], "--grad-reduce"),
    (["--comm-timeout", "-1"], "--comm-timeout"),
    (["-y", "1"], "-o"),
    (["-i", "mine_*.bin"], "-j"),
    (["-n", "5"], "-o"),
    (["-r", "3"], "-r"),
    (["-n", "-2"], "-n"),
    (["--ranks", "2"], "--ranks"),
    (["--gpu-mem", "80"], "--gpu-mem"),
    (["--dry-run", "3"], "--dry-run"),
    (["--fp8-accum", "fast"], "--fp8-accum"),
    (["--fp8-fast-accum", "2"], "--fp8-fast-accum"),
    (["-p", "bf16", "--fp8-accum", "hopper"], "--fp8-accum"),
    (["-p", "bf16", "--fp8-fast-accum", "0"], "--fp8-fast-accum"),
    (["--fp8-recipe", "late"], "--fp8-recipe"),
    (["--amax-history", "0"], "--amax-history"),
    (["--amax-algo", "mean"], "--amax-algo"),
    (["--fp8-margin", "-1"], "--fp8-margin"),
    (["-p", "bf16", "--fp8-recipe", "delayed"], "--fp8-recipe"),
])
def test_bad_flags_rejected(trainer, args, needle):
    assert_one_line_error(run([trainer, *args]), needle)


def test_help_documents_the_llmc_flags(trainer):
    r = run([trainer, "--help"])
    assert r.returncode == 0
    for flag in ["-i", "-j", "-o", "-e", "-b", "-t", "-d", "-l", "-x", "-v", "-m", "-s", "-n", "-y", "-z", "-r", "-p",
                 "--fp8-accum", "--fp8-fast-accum"]:
        assert f"  {flag} " in r.stdout, f"--help does not document {flag}"
    for preset in ["llama2-7b", "llama2-13b", "llama2-70b", "tiny"]:
        assert preset in r.stdout


GPU_TRAINER = REPO / "train_llama"


@pytest.mark.skipif(not GPU_TRAINER.exists(), reason="train_llama is not built (the CUDA build needs nvcc)")
@pytest.mark.parametrize("args, needle", [(["-x", "-2"], "flag -x"), (["-b", "0"], "flag -b"), (["-z", "3"], "flag -z"),
                                          (["-p", "fp8", "-b", "1", "-t", "8"], "B*T"),
                                          (["--fp8-accum", "hopper"], "flag --fp8-accum hopper")])
def test_gpu_trainer_needs_no_gpu_for_help_and_flag_errors(args, needle):
    """A cluster's login node has no GPU: train_llama's --help prints the usage and a flag out of range
    gives its one-line flag error, not "no usable CUDA GPU" (this machine has no GPU, so it shows)."""
    r = run([GPU_TRAINER, "--help"])
    assert r.returncode == 0 and "usage:" in r.stdout and "  -x " in r.stdout and r.stderr == "", r.stderr
    r = run([GPU_TRAINER, *args])
    assert_one_line_error(r, needle)
    assert "GPU" not in r.stderr, r.stderr


def write_shard(path, tokens, magic=20240520, version=1, count=None):
    header = np.zeros(256, dtype=np.int32)
    header[:3] = [magic, version, len(tokens) if count is None else count]
    dtype = np.uint16 if version == 1 else np.uint32
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(np.asarray(tokens, dtype=dtype).tobytes())


@pytest.mark.sanitize
@pytest.mark.parametrize("case, needle", [
    ("magic", "bad magic"),
    ("version", "version"),
    ("count", "header says"),
    ("token", "vocabulary size"),
])
def test_bad_shards_rejected(trainer, tmp_path, rng, case, needle):
    tokens = rng.integers(0, 32000, 5000)
    kwargs = {}
    if case == "magic":
        kwargs["magic"] = 20240521
    elif case == "version":
        kwargs["version"] = 3
    elif case == "count":
        kwargs["count"] = 5001
    elif case == "token":
        tokens[1234] = 32000 + int(rng.integers(0, 30000))
    bad = tmp_path / "bad.bin"
    write_shard(bad, tokens, **kwargs)
    r = run([trainer, "-i", bad, "-j", bad, *FAST, "-x", "2", "--shuffle", "0"])
    assert_one_line_error(r, str(bad), needle)
    if case == "token":
        assert "position 1234" in r.stderr


@pytest.mark.parametrize("magic, version", [(20240801, 1), (20240520, 7), (20240801, 2)])
def test_shard_magic_and_version_must_pair(trainer, tmp_path, rng, magic, version):
    """A version of one format under the other format's magic is refused, naming both."""
    bad = tmp_path / "bad.bin"
    write_shard(bad, rng.integers(0, 32000, 5000), magic=magic, version=version)
    assert_one_line_error(run([trainer, "-i", bad, "-j", bad, *FAST, "-x", "1"]), str(bad), f"version {version} for magic {magic}")


def test_every_shard_format_trains_alike(trainer, tmp_path, rng):
    """The same tokens as llm.c's uint16 shard (20240520 / 1), llm.c's uint32 shard (20240801 / 7, its
    write_datafile(..., "llama-3")) and llm8's earlier uint32 shard (20240520 / 2), each written here from
    the format's description: the three runs read the same tokens, so their losses are identical."""
    tokens = rng.integers(3, 32000, 5000)
    tokens[::100] = 1  # documents start with BOS
    losses = {}
    for magic, version in [(20240520, 1), (20240801, 7), (20240520, 2)]:
        shard = tmp_path / f"shard_{version}.bin"
        write_shard(shard, tokens, magic=magic, version=version)
        assert shard.stat().st_size == 1024 + (2 if version == 1 else 4) * tokens.size
        out = tmp_path / f"run_{version}"
        r = run([trainer, "-i", shard, "-j", shard, *FAST, "-x", "2", "-o", out])
        assert r.returncode == 0, r.stderr
        losses[version] = [row["loss"] for row in metrics(out).values()]
    assert len(losses[1]) == 2 and losses[1] == losses[7] == losses[2], losses


@pytest.mark.sanitize
def test_empty_glob_rejected(trainer, tmp_path):
    pattern = str(tmp_path / "nothing_*.bin")
    assert_one_line_error(run([trainer, "-i", pattern, "-j", pattern]), pattern, "no file matches")


@pytest.mark.sanitize
@pytest.mark.parametrize("case, needle", [("truncated", "truncated"), ("magic", "bad magic"), ("missing", "neither")])
def test_bad_checkpoints_rejected(trainer, tmp_path, case, needle):
    path = tmp_path / "model.bin"
    data = REF_MODEL.read_bytes()
    if case == "truncated":
        path.write_bytes(data[: len(data) - 4096])
    elif case == "magic":
        path.write_bytes(struct.pack("<i", 1234) + data[4:])
    r = run([trainer, "-e", path, *FAST, "-x", "1"])
    assert_one_line_error(r, str(path), needle)


def test_fp8_shape_rule_names_the_dimension(trainer):
    assert_one_line_error(run([trainer, "-b", "1", "-t", "8", "-p", "fp8"]), "B*T", "multiple of 16")


def metrics(run_dir):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {row["step"]: row for row in rows if "loss" in row}


RECIPES = {"current": [], "delayed": ["--fp8-recipe", "delayed", "--amax-history", "2"]}


@pytest.mark.parametrize("recipe", RECIPES)
def test_resume_repeats_the_uninterrupted_run(trainer, tmp_path, shakespeare, recipe):
    """Steps 3..5 after a resume from step 3 match the uninterrupted run: loss, lr, grad norm, weights;
    the logs of the interrupted run lose their lines past the checkpoint instead of repeating them. With
    delayed scaling (a history of 2, so the ring has wrapped) the amax history and the scales are part of
    the state; a resume that drops them, as Megatron-Bridge#1730 did (the history zeroed, the scales
    TE's initial 1), gives another trajectory."""
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    args = [*FAST, "-x", "6", "-n", "3", "-u", "2", "--fp8-stats", "2", *RECIPES[recipe]]
    r = run([trainer, *args, "-o", full])
    assert r.returncode == 0, r.stderr
    resumed.mkdir()
    # the interrupted run: its checkpoint at step 3 and logs that went on to step 5
    for name in ["model_00000003.bin", "state_00000003_00000.bin", "DONE_00000003", "main.log", "metrics.jsonl", "fp8_stats.csv"]:
        shutil.copy(full / name, resumed / name)
    r = run([trainer, *args, "-o", resumed, "-y", "1"])
    assert r.returncode == 0, r.stderr
    assert "resumed from" in r.stdout
    a, b = metrics(full), metrics(resumed)
    for step in range(3, 6):
        for key in ["loss", "lr", "grad_norm"]:
            assert a[step][key] == b[step][key], (step, key, a[step][key], b[step][key])
    assert (full / "model_00000006.bin").read_bytes() == (resumed / "model_00000006.bin").read_bytes()
    for name in ["main.log", "fp8_stats.csv"]:
        assert (full / name).read_text() == (resumed / name).read_text(), f"{name} of the resumed run differs"
    steps = [json.loads(line)["step"] for line in (resumed / "metrics.jsonl").read_text().splitlines()]
    assert sorted(steps) == sorted(json.loads(line)["step"] for line in (full / "metrics.jsonl").read_text().splitlines())
    assert (full / "state_00000006_00000.bin").read_bytes() == (resumed / "state_00000006_00000.bin").read_bytes()
    if recipe == "delayed":
        dropped = tmp_path / "dropped"
        dropped.mkdir()
        for name in ["model_00000003.bin", "state_00000003_00000.bin", "DONE_00000003"]:
            shutil.copy(full / name, dropped / name)
        drop_amax_history(dropped / "state_00000003_00000.bin", layers=4, history=2)
        r = run([trainer, *args, "-o", dropped, "-y", "1"])
        assert r.returncode == 0, r.stderr
        c = metrics(dropped)
        assert c[3]["loss"] != a[3]["loss"], "a resume without the amax history repeated the run"


def drop_amax_history(state, layers, history):
    """Overwrites the delayed recipe's state at the end of a state file (train/checkpoint.h state_fp8_bytes:
    X and dY records {amax, scale, scale_inv, nonfinite} of 4 linears per block, then their histories)
    with what a framework that does not restore it starts from: scale 1, an empty history."""
    records = 2 * layers * 4
    tail = np.concatenate([np.tile(np.float32([0, 1, 1, 0]), records), np.zeros(records * history, np.float32)])
    data = bytearray(state.read_bytes())
    data[-tail.nbytes:] = tail.astype(np.float32).tobytes()
    state.write_bytes(bytes(data))


@pytest.mark.sanitize
def test_resume_rejects_changed_settings(trainer, tmp_path, shakespeare):
    out = tmp_path / "run"
    r = run([trainer, *FAST, "-x", "2", "-o", out])
    assert r.returncode == 0, r.stderr
    assert_one_line_error(run([trainer, *FAST, "-x", "4", "-o", out, "-y", "1", "-p", "bf16"]), "state_00000002_00000.bin", "-p")
    # the moments', the reduction's and the gradient buffer's formats are the run's numerics too:
    # named with both values
    for flag, value, saved in [("--optim-state", "fp8", "fp32"), ("--grad-reduce", "bf16", "fp32"), ("--grad-buffer", "fp8", "fp32"),
                               ("--master-weights", "fp16", "fp32")]:
        assert_one_line_error(run([trainer, *FAST, "-x", "4", "-o", out, "-y", "1", flag, value]), "state_00000002_00000.bin",
                              f"{flag} (checkpoint {saved}, now {value})")


@pytest.mark.parametrize("flags, scales, bad_values, what", [
    (["--optim-state", "fp8"], 2, (0.0, 3.0), "AdamW scale_inv"),
    (["--master-weights", "fp16"], 1, (-0.5, np.nan), "master weights' scale_inv"),
])
def test_resume_rejects_a_corrupt_scale(trainer, tmp_path, shakespeare, flags, scales, bad_values, what):
    """A state file ends in the fp8 moments' scale_inv (2 per 4096-element chunk) or, with an fp16 master,
    the master's (1 per chunk); one that is not a positive power of two stops the resume naming the file
    and the array, instead of turning every later update of its chunk into NaN. The good file resumes."""
    out = tmp_path / "run"
    r = run([trainer, *FAST, "-x", "2", "-o", out, *flags])
    assert r.returncode == 0, r.stderr
    state = out / "state_00000002_00000.bin"
    good = state.read_bytes()
    tail = np.frombuffer(good[-4 * scales:], dtype=np.float32)
    assert np.all(tail > 0) and np.all(np.log2(tail) == np.round(np.log2(tail))), tail
    for bad in bad_values:
        state.write_bytes(good[:-4] + np.float32(bad).tobytes())
        assert_one_line_error(run([trainer, *FAST, "-x", "4", "-o", out, "-y", "1", *flags]), "state_00000002_00000.bin", what,
                              "not a positive power of two")
    state.write_bytes(good)
    r = run([trainer, *FAST, "-x", "4", "-o", out, "-y", "1", *flags])
    assert r.returncode == 0, r.stderr


def test_checkpoint_loads_as_a_model(trainer, tmp_path, shakespeare):
    out = tmp_path / "run"
    r = run([trainer, *FAST, "-x", "2", "-o", out])
    assert r.returncode == 0, r.stderr
    ckpt = out / "model_00000002.bin"
    r = run([trainer, *FAST, "-x", "1", "-e", ckpt, "-p", "bf16"])
    assert r.returncode == 0, r.stderr
    assert f"model from: {ckpt}" in r.stdout


PROFILE_LINE = re.compile(r"^profile step (\d+): forward ([\d.]+) ms \| backward ([\d.]+) ms \| optimizer ([\d.]+) ms \| "
                          r"other (-?[\d.]+) ms \| fp8 casts ([\d.]+) ms \(inside the others\)$", re.M)
STEP_LINE = re.compile(r"^step +(\d+)/\d+ \|.*\| ([\d.]+) ms \|", re.M)


@pytest.mark.parametrize("precision", ["fp8", "bf16"])
def test_profile_splits_the_step(trainer, shakespeare, precision):
    """--profile 2 prints the phases of steps 2 and 4 (2 micro-steps each): forward, backward and the
    optimizer all take time and, with the rest, add up to the step's time; the FP8 casts are a part of
    them in fp8 and take nothing in bf16."""
    r = run([trainer, *FAST, "-x", "4", "-d", "512", "--profile", "2", "-p", precision])
    assert r.returncode == 0, r.stderr
    profiles = {int(m[0]): [float(v) for v in m[1:]] for m in PROFILE_LINE.findall(r.stdout)}
    assert sorted(profiles) == [2, 4], r.stdout
    step_ms = {int(step): float(ms) for step, ms in STEP_LINE.findall(r.stdout)}
    for step, (forward, backward, optimizer, other, casts) in profiles.items():
        assert forward > 0 and backward > 0 and optimizer > 0, profiles[step]
        assert other >= 0, f"step {step}: the phases take longer than the step ({profiles[step]}, {step_ms[step]} ms)"
        # five values printed to 0.1 ms
        assert abs(forward + backward + optimizer + other - step_ms[step]) <= 0.3, (profiles[step], step_ms[step])
        if precision == "fp8":
            assert 0 < casts < forward + backward + optimizer, profiles[step]
        else:
            assert casts == 0, profiles[step]


def final_losses(out):
    return [line for line in (out / "main.log").read_text().splitlines() if "trl:" in line]


@pytest.mark.parametrize("flag, value, shown", [("--fp8-accum", "hopper", "exact, now hopper"),
                                                ("--fp8-fast-accum", "0", "1, now 0"),
                                                ("--fp8-recipe", "delayed", "current, now delayed")])
def test_fp8_accumulation_flags_in_run_identity(trainer, tmp_path, shakespeare, flag, value, shown):
    """A run resumed with another FP8 accumulation or scaling recipe is refused, naming the flag and both
    values."""
    out = tmp_path / "run"
    r = run([trainer, *FAST, "-o", out, "-x", "2"])
    assert r.returncode == 0, r.stderr
    r = run([trainer, *FAST, "-o", out, "-x", "4", "-y", "1", flag, value])
    assert_one_line_error(r, "state_00000002_00000.bin", f"{flag} (checkpoint {shown})")


def test_hopper_accumulation_trains(trainer, tmp_path, shakespeare):
    """--fp8-accum hopper runs the model in every FP8 GEMM: the losses differ from exact ones (K of 128
    and 384 already show it) but stay close; --fp8-fast-accum 0 changes fprop's and so the losses."""
    variants = {"exact": [], "hopper": ["--fp8-accum", "hopper"], "hopper_slow": ["--fp8-accum", "hopper", "--fp8-fast-accum", "0"]}
    runs = run_side_by_side([[trainer, *FAST, "-o", tmp_path / name, "-x", "3", "-n", "-1", *extra] for name, extra in variants.items()])
    losses = {}
    for name, r in zip(variants, runs):
        assert r.returncode == 0, r.stderr
        losses[name] = [float(line.split("trl:")[1]) for line in final_losses(tmp_path / name)]
    assert losses["exact"] != losses["hopper"] != losses["hopper_slow"]
    for name in ("hopper", "hopper_slow"):
        assert all(abs(a - b) < 1e-2 * a for a, b in zip(losses["exact"], losses[name])), losses
