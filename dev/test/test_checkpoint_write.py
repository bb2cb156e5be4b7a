"""
A checkpoint write that fails stops the run with one line naming the file and the error, leaves no
temporary file behind and no DONE marker for that step, so `-y 1` resumes from the previous checkpoint
and the run then ends as the uninterrupted one does. The failure is real, not simulated: the run gets a
file size limit (RLIMIT_FSIZE, with SIGXFSZ ignored) below the size of the file to fail, so its write
returns EFBIG exactly as a full disk returns ENOSPC. The limit is per file and both checkpoints have the
same sizes, so the first checkpoint comes from a run without it. The committed reference model (vocab 256,
dim 64, 2 layers) on random shards keeps the files small and needs no shared data.
"""
import errno
import os
import resource
import signal
import sys

import pytest

from conftest import REPO, load_llm8_data, run
from test_trainer import assert_one_line_error

sys.path.insert(0, str(REPO / "scripts"))
import llm8_checkpoint as ckpt  # noqa: E402

REF_MODEL = REPO / "dev/reference/llama_ref_model.bin"
BOS = 1
ARGS = ["-e", REF_MODEL, "-b", "2", "-t", "16", "-v", "0", "-m", "1", "-x", "2"]


def file_size_limit(limit):
    """preexec_fn: writes past `limit` bytes of any file fail with EFBIG instead of killing the process."""
    def apply():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


@pytest.fixture
def shards(tmp_path, rng):
    """(train, val) shards of random tokens below the reference model's vocabulary, documents from BOS."""
    vocab = ckpt.read_model(str(REF_MODEL))[0]["vocab_size"]
    llm8_data = load_llm8_data()
    paths = []
    for split, n_tokens in (("train", 400), ("val", 100)):  # a batch of -b 2 -t 16 reads 33 tokens
        tokens = rng.integers(BOS + 1, vocab, size=n_tokens)
        tokens[[0, n_tokens // 2]] = BOS
        paths.append(tmp_path / f"{split}.bin")
        llm8_data.write_shard(paths[-1], tokens)
    return ["-i", paths[0], "-j", paths[1]]


@pytest.mark.sanitize
@pytest.mark.parametrize("failing", ["model", "state"])
def test_failed_checkpoint_write_keeps_the_previous_one(trainer, tmp_path, shards, failing):
    full, out = tmp_path / "full", tmp_path / "out"
    r = run([trainer, *ARGS, *shards, "-n", "1", "-o", full])
    assert r.returncode == 0, r.stderr
    r = run([trainer, *ARGS, *shards, "-n", "1", "-o", out, "-x", "1"])
    assert r.returncode == 0, r.stderr
    model_bytes = (out / "model_00000001.bin").stat().st_size
    assert (out / "state_00000001_00000.bin").stat().st_size > model_bytes
    # the model is written first: one byte short fails it; exactly its size lets it through and fails the state
    limit = model_bytes - 1 if failing == "model" else model_bytes

    r = run([trainer, *ARGS, *shards, "-n", "1", "-o", out, "-y", "1"], preexec_fn=file_size_limit(limit))
    assert_one_line_error(r, str(out / f"{failing}_00000002"), os.strerror(errno.EFBIG))
    left = sorted(p.name for p in out.iterdir())
    assert not [name for name in left if name.endswith(".tmp")], left
    assert "DONE_00000002" not in left, left
    assert ("model_00000002.bin" in left) == (failing == "state"), left

    r = run([trainer, *ARGS, *shards, "-n", "1", "-o", out, "-y", "1"])
    assert r.returncode == 0, r.stderr
    assert f"resumed from {out} at step 1 " in r.stdout
    for name in ["model_00000002.bin", "state_00000002_00000.bin", "main.log"]:
        assert (out / name).read_bytes() == (full / name).read_bytes(), f"{name} differs from the uninterrupted run's"
