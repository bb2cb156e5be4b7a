"""
The FP8 safety net end to end on train_llama_cpu (docs/safety-net.md): a shadow check never changes
the run; its BF16 loss is the loss of the bf16 recipe's forward at the same weights; a forced fallback
switches to BF16 and back at the steps the policy implies, in the console and in metrics.jsonl; a run
resumed in the middle takes the same decisions; --bf16-layers is part of the run identity and the
banner; an outlier planted in the w2 input raises the alert naming its layer; bad flags stop with one
line naming them. The 2-rank decision test is in test_distributed.py.
"""
import json
import shutil
import sys

import pytest

from conftest import REPO, load_llm8_data, run, run_side_by_side
from test_trainer import FAST, assert_one_line_error

sys.path.insert(0, str(REPO / "scripts"))
import llm8_checkpoint as ckpt  # noqa: E402

REF_MODEL = REPO / "dev/reference/llama_ref_model.bin"
# every check over the tolerance: a fallback after the second check, two BF16 steps, then FP8 again
FORCED = ["--shadow-every", "3", "--shadow-policy", "fallback", "--shadow-tol", "0", "--shadow-patience", "2",
          "--shadow-recover", "2"]
# metrics fields that measure time, not the run
TIMING = {"ms", "tokens_per_s", "shadow_ms", "shadow_share"}


def rows(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def steps_of(run_dir, key):
    return {r["step"]: r for r in rows(run_dir) if key in r}


def train(trainer, out, *args):
    r = run([trainer, *FAST, "-o", out, *args])
    assert r.returncode == 0, r.stderr
    return r


@pytest.mark.parametrize("args, needle", [
    (["--bf16-layers", "4"], "--bf16-layers"),
    (["--bf16-layers", "first,2-x"], "--bf16-layers"),
    (["--bf16-layers", "last", "-p", "bf16"], "--bf16-layers"),
    (["--shadow-every", "5", "-p", "bf16"], "--shadow-every"),
    (["--shadow-grad", "1"], "--shadow-grad"),
    (["--shadow-tol", "0.1"], "--shadow-tol"),
    (["--shadow-every", "5", "--shadow-policy", "stop"], "--shadow-policy"),
    (["--shadow-every", "5", "--shadow-grad", "1", "-z", "2"], "-z 2"),
    (["--alert-underflow", "0.2"], "--fp8-stats"),
    (["--fp8-stats", "5", "--alert-amax-growth", "0.5"], "--alert-amax-growth"),
])
def test_bad_safety_net_flags(trainer, args, needle):
    assert_one_line_error(run([trainer, *args]), needle)


def test_shadow_check_keeps_the_trajectory(trainer, tmp_path, shakespeare):
    """--shadow-every 5 (with gradients) against no checks: the same main.log and weights, bit for bit."""
    args = ["-x", "10", "-v", "5"]
    plain, r = run_side_by_side([[trainer, *FAST, "-o", tmp_path / "plain", *args],
                                 [trainer, *FAST, "-o", tmp_path / "shadow", *args, "--shadow-every", "5", "--shadow-grad", "1"]])
    assert plain.returncode == 0 and r.returncode == 0, plain.stderr + r.stderr
    assert (tmp_path / "plain/main.log").read_bytes() == (tmp_path / "shadow/main.log").read_bytes()
    assert (tmp_path / "plain/model_00000010.bin").read_bytes() == (tmp_path / "shadow/model_00000010.bin").read_bytes()
    checks, losses = steps_of(tmp_path / "shadow", "shadow_loss_fp8"), steps_of(tmp_path / "shadow", "loss")
    assert sorted(checks) == [0, 5]
    for step, c in checks.items():
        # one rank, one micro-step: the check's FP8 loss is the step's loss; the BF16 one is another run
        assert c["shadow_loss_fp8"] == losses[step]["loss"]
        assert c["shadow_loss_bf16"] != c["shadow_loss_fp8"]
        # from the losses as logged (float32: each within 2^-20 of the value near 10)
        rel = abs(c["shadow_loss_fp8"] - c["shadow_loss_bf16"]) / c["shadow_loss_bf16"]
        assert c["shadow_rel_diff"] == pytest.approx(rel, abs=2 * 2**-20 / c["shadow_loss_bf16"])
        assert 0.9 < c["grad_cosine"] < 1.0 and 0.0 < c["grad_norm_rel_diff"] < 0.1
        assert 0 <= c["grad_worst_layer"] < 4 and c["grad_worst_cosine"] <= c["grad_cosine"] + 1e-6
    assert r.stdout.count("shadow check: fp8 loss") == 2 and "| shadow checks: 2," in r.stdout


def test_shadow_bf16_loss_is_the_bf16_forward(trainer, tmp_path, shakespeare):
    """On one batch (-a 1) the check at step k uses the weights after k updates: its BF16 loss is the first
    loss of a -p bf16 run started from those weights (the initial ones, and step 2's checkpoint)."""
    fp8 = tmp_path / "fp8"
    train(trainer, fp8, "-a", "1", "-x", "3", "-n", "2", "--shadow-every", "2")
    checks = steps_of(fp8, "shadow_loss_bf16")
    assert sorted(checks) == [0, 2]
    for step, start in [(0, []), (2, ["-e", fp8 / "model_00000002.bin"])]:
        bf16 = tmp_path / f"bf16_{step}"
        train(trainer, bf16, "-a", "1", "-x", "1", "-p", "bf16", *start)
        assert steps_of(bf16, "loss")[0]["loss"] == checks[step]["shadow_loss_bf16"], step


def test_forced_fallback_and_resume(trainer, tmp_path, shakespeare):
    """Tolerance 0: checks at steps 0, 3, 6, 9; the second over the tolerance in a row (3, then 9) makes the
    next two steps BF16, then FP8 again. Resumed from the checkpoints of steps 4 (in a fallback) and 8 (one
    check over the tolerance pending), the run takes the same decisions and logs the same metrics."""
    full = tmp_path / "full"
    r = train(trainer, full, "-x", "12", "-n", "4", *FORCED)
    assert "shadow policy: fallback to BF16 from step 5 on" in r.stdout
    assert "shadow policy: back to FP8 from step 7 on" in r.stdout
    assert "shadow policy: fallback to BF16 from step 11 on" in r.stdout
    events = [(e["step"], e["event"]) for e in rows(full) if "event" in e]
    assert events == [(3, "fallback"), (5, "recover"), (9, "fallback"), (11, "recover")]
    linears = {s: row["linears"] for s, row in steps_of(full, "loss").items()}
    assert [s for s in range(12) if linears[s] == "bf16"] == [4, 5, 10, 11]
    assert sorted(steps_of(full, "shadow_loss_fp8")) == [0, 3, 6, 9]
    expected = [{k: v for k, v in row.items() if k not in TIMING} for row in rows(full)]
    for step in [4, 8]:
        resumed = tmp_path / f"resumed_{step}"
        resumed.mkdir()
        for f in full.iterdir():  # the checkpoint of `step`, and the logs of the run that went on
            if f"{step:08d}" in f.name or f.name in ("main.log", "metrics.jsonl"):
                shutil.copy(f, resumed / f.name)
        r = train(trainer, resumed, "-x", "12", "-n", "4", "-y", "1", *FORCED)
        assert ("resumed in a BF16 fallback: 0 BF16 step(s) done" in r.stdout) == (step == 4), r.stdout
        got = [{k: v for k, v in row.items() if k not in TIMING} for row in rows(resumed)]
        assert got == expected, f"resumed at step {step}: the metrics differ"
        assert (full / "model_00000012.bin").read_bytes() == (resumed / "model_00000012.bin").read_bytes()


def test_bf16_layers_in_banner_and_run_identity(trainer, tmp_path, shakespeare):
    out = tmp_path / "run"
    r = train(trainer, out, "-x", "2", "--bf16-layers", "first,last")
    assert "| FP8 blocks: 1-2 of 4 (BF16 by --bf16-layers: 0,3)" in r.stdout
    r = run([trainer, *FAST, "-o", out, "-x", "4", "-y", "1", "--bf16-layers", "last"])
    assert_one_line_error(r, "state_00000002_00000.bin", "--bf16-layers (checkpoint 0,3, now 3)")


def write_random_shards(tmp_path, rng, vocab):
    """(train, val) shards of random tokens below `vocab`, documents of 100 tokens."""
    llm8_data = load_llm8_data()
    shards = []
    for split, n in (("train", 600), ("val", 200)):
        tokens = rng.integers(2, vocab, size=n)
        tokens[::100] = 1
        shards.append(tmp_path / f"{split}.bin")
        llm8_data.write_shard(shards[-1], tokens)
    return shards


def test_w2_outlier_raises_the_alert(trainer, tmp_path, rng):
    """One SwiGLU unit of block 1 of the reference model made an outlier (its w1 and w3 rows x 300): the
    statistics step names w2[layer 1] X in an underflow alert; the model without it raises none there."""
    config, tensors = ckpt.read_model(str(REF_MODEL))
    train_shard, val_shard = write_random_shards(tmp_path, rng, config["vocab_size"])
    F = config["ffn_dim"]
    unit = int(rng.integers(0, F))
    tensors["w13"][1, [unit, F + unit], :] *= 300.0
    outlier = tmp_path / "outlier.bin"
    ckpt.write_model(str(outlier), config, tensors)
    found = {}
    for name, model in (("clean", REF_MODEL), ("outlier", outlier)):
        out = tmp_path / name
        r = run([trainer, "-e", model, "-i", train_shard, "-j", val_shard, "-b", "2", "-t", "16", "-x", "1", "-v", "0",
                 "-m", "1", "--fp8-stats", "1", "-o", out])
        assert r.returncode == 0, r.stderr
        found[name] = [a for a in rows(out) if "alert" in a and (a["layer"], a["gemm"], a["operand"]) == (1, "w2", "X")]
        assert (("FP8 alert: step 1: w2[layer 1] X: underflow" in r.stdout) == (name == "outlier")), r.stdout
    assert found["clean"] == []
    assert [a["alert"] for a in found["outlier"]] == ["underflow"]
    assert found["outlier"][0]["value"] > found["outlier"][0]["threshold"] == pytest.approx(0.01)
