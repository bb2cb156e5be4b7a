"""
The dev/tools/ programs that need no GPU, beyond what the tests that use them show: write_shard's file is
an llm.c version-1 shard (header read straight from the file: magic 20240520, version 1, count) of the
asked length, a BOS at every 1024th position and uniform random tokens in [3, 32000) elsewhere, the same
for the same seed and different for another; bad input to write_shard and numerics is a one-line error
naming the argument, and a non-zero exit. (numerics' modes are checked against references by
test_fp8_codec.py, test_delayed_scaling.py, test_optim_state.py, test_state_storage.py,
test_hopper_accum.py and test_grad_reduce_fp8.py.)
"""
import numpy as np
import pytest

from conftest import binary, run
from data_helpers import BOS, SHARD_MAGIC, raw_shard

VOCAB = 32000
DOC_TOKENS = 1024


@pytest.fixture
def write_shard():
    return binary("build/tools/write_shard")


def shard(write_shard, tmp_path, n, seed):
    path = tmp_path / f"s{seed}.bin"
    r = run([write_shard, path, n, seed])
    assert r.returncode == 0, r.stderr
    header, tokens = raw_shard(path)
    assert (int(header[0]), int(header[1]), int(header[2])) == (SHARD_MAGIC, 1, n)
    assert not header[3:].any()
    return tokens


def test_random_shard(write_shard, tmp_path, rng):
    n = int(rng.integers(20000, 40000))
    seed = int(rng.integers(0, 2**31))
    tokens = shard(write_shard, tmp_path, n, seed)
    assert tokens.size == n
    docs = np.arange(n) % DOC_TOKENS == 0
    assert (tokens[docs] == BOS).all()
    rest = tokens[~docs].astype(np.int64)
    assert rest.min() >= 3 and rest.max() < VOCAB
    # uniform over [3, VOCAB): the mean within 6 standard errors, and no value far more frequent than others
    mean, sd = (3 + VOCAB - 1) / 2, (VOCAB - 3) / np.sqrt(12)
    assert abs(rest.mean() - mean) < 6 * sd / np.sqrt(rest.size)
    assert np.bincount(rest).max() < 20
    assert np.array_equal(shard(write_shard, tmp_path, n, seed), tokens)
    assert (shard(write_shard, tmp_path, n, seed + 1) != tokens).mean() > 0.9


@pytest.mark.parametrize("args, named", [
    (["PATH", "1", "0"], "TOKENS"),
    (["PATH", "ten", "0"], "TOKENS"),
    (["PATH", "100", "-1"], "SEED"),
    (["PATH", "100"], "usage"),
])
def test_write_shard_bad_input(write_shard, tmp_path, args, named):
    args = [tmp_path / "x.bin" if a == "PATH" else a for a in args]
    r = run([write_shard, *args])
    assert r.returncode != 0 and named in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "x.bin").exists()


@pytest.mark.parametrize("args, named", [
    ([], "usage"),
    (["--fp8-decoder", "e4m3", "OUT"], "usage"),
    (["--fp8-decode", "e4m4", "OUT"], "e4m4"),
    (["--store", "fp64", "1", "IN", "OUT"], "fp64"),
])
def test_numerics_bad_input(tmp_path, args, named):
    args = [tmp_path / a if a in ("IN", "OUT") else a for a in args]
    r = run([binary("build/tools/numerics"), *args])
    assert r.returncode != 0 and named in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
