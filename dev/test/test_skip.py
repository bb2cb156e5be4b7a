"""
End-to-end test of the skip of non-finite steps (docs/design.md#non-finite-values) on train_llama_cpu: a
step with a non-finite loss, gradient or FP8 amax is skipped and named, and --max-skips such steps in a
row stop the run with a one-line error. Uses the committed tiny reference model (vocab 256, dim 64, 2
layers) with one weight set to NaN, on a small random shard pair; the same run without the NaN completes.
"""
import re
import sys

import numpy as np
import pytest

from conftest import REPO, load_llm8_data, run

sys.path.insert(0, str(REPO / "scripts"))
import llm8_checkpoint as ckpt  # noqa: E402

REF_MODEL = REPO / "dev/reference/llama_ref_model.bin"
BOS = 1
MAX_SKIPS = 3
ARGS = ["-b", "2", "-t", "16", "-x", "10", "-v", "0", "-m", "1", "--max-skips", str(MAX_SKIPS)]


@pytest.fixture
def data(tmp_path, rng):
    """(model with wo[layer 1] holding a NaN, train shard, val shard): two documents of random tokens each."""
    config, tensors = ckpt.read_model(str(REF_MODEL))
    C = config["dim"]
    tensors["wo"][1, int(rng.integers(0, C)), int(rng.integers(0, C))] = np.nan
    nan_model = tmp_path / "nan.bin"
    ckpt.write_model(str(nan_model), config, tensors)
    llm8_data = load_llm8_data()
    shards = []
    for split, n_tokens in (("train", 600), ("val", 200)):    # a batch of -b 2 -t 16 reads 33 tokens
        tokens = rng.integers(BOS + 1, config["vocab_size"], size=n_tokens)
        tokens[[0, n_tokens // 2]] = BOS
        shards.append(tmp_path / f"{split}.bin")
        llm8_data.write_shard(shards[-1], tokens)
    return nan_model, *shards


@pytest.mark.sanitize
@pytest.mark.parametrize("precision", ["fp8", "bf16"])
def test_nonfinite_steps_are_skipped_then_stop(trainer, data, precision):
    nan_model, train, val = data
    r = run([trainer, "-e", nan_model, "-i", train, "-j", val, *ARGS, "-p", precision])
    assert r.returncode != 0, f"expected the run to stop, got success:\n{r.stdout[-2000:]}"
    skipped = [line for line in r.stdout.splitlines() if line.startswith("step ") and "skipped" in line]
    assert len(skipped) == MAX_SKIPS, r.stdout
    for k, line in enumerate(skipped, 1):
        m = re.fullmatch(r"step (\d+) skipped: loss \S+, grad norm \S+, first non-finite gradient: (.+), "
                         r"first non-finite FP8 operand: (.+) \((\d+) in a row\)", line)
        assert m, line
        assert (int(m[1]), int(m[4])) == (k, k), line
        if precision == "fp8":
            # the weight's amax is NaN: its cast flags the step, and the NaN never reaches an FP8 byte
            assert m[3] == "wo[layer 1] W", line
        else:
            # the NaN reaches the loss, so every gradient is NaN: the first in checkpoint order is named
            assert (m[2], m[3]) == ("tok_embeddings", "none"), line
    errors = r.stderr.strip().splitlines()
    assert len(errors) == 1 and errors[0].startswith("error: ") and "--max-skips" in errors[0], r.stderr


@pytest.mark.parametrize("precision", ["fp8", "bf16"])
def test_finite_model_completes(trainer, data, precision):
    """The same run from the model without the NaN: no step skipped, exit 0."""
    _, train, val = data
    r = run([trainer, "-e", REF_MODEL, "-i", train, "-j", val, *ARGS, "-p", precision])
    assert r.returncode == 0, r.stderr
    assert "skipped" not in r.stdout
    assert len([line for line in r.stdout.splitlines() if line.startswith("step ")]) == 10
