"""
Helpers of the data tests (test_data.py, test_corpus.py): running the dev/data scripts, and reading
shards independently of llm8_data (straight from the bytes, as docs/formats.md says).
dev/data is appended to sys.path (last, so the standard library's `tokenize` still wins over
dev/data/tokenize.py) for the modules the tests drive directly.
"""
import subprocess
import sys

import numpy as np

from conftest import REPO

DATA = REPO / "dev" / "data"
BOS = 1
SHARD_MAGIC = 20240520
sys.path.append(str(DATA))


def run_script(script, *args, timeout=300):
    """Run a dev/data script; returns the CompletedProcess (text mode)."""
    cmd = [sys.executable, str(DATA / script)] + [str(a) for a in args]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=timeout)


def raw_shard(path):
    """(header int32[256], tokens) read straight from the file (llm.c's versions 1 = uint16, 7 = uint32; 2 =
    llm8's earlier uint32)."""
    header = np.fromfile(path, dtype="<i4", count=256)
    dtype = {1: "<u2", 7: "<u4", 2: "<u4"}[int(header[1])]
    return header, np.fromfile(path, dtype=dtype, offset=1024)


def split_docs(tokens):
    """Split a token stream at BOS into the documents' token lists; checks that it starts with BOS."""
    tokens = np.asarray(tokens)
    assert tokens.size and tokens[0] == BOS, "stream does not start with BOS"
    starts = np.flatnonzero(tokens == BOS)
    return [tokens[s + 1:e].tolist() for s, e in zip(starts, list(starts[1:]) + [tokens.size])]


def read_split(out, prefix, split):
    """[(header, tokens)] of the shards {prefix}_{split}_*.bin in `out`, checking they are numbered 0, 1..."""
    paths = sorted(out.glob(f"{prefix}_{split}_*.bin"))
    assert [p.name for p in paths] == [f"{prefix}_{split}_{k:06d}.bin" for k in range(len(paths))]
    return [raw_shard(p) for p in paths]


def split_stream(out, split, prefix="data"):
    """All tokens of a split, its shards concatenated (empty when it has none)."""
    shards = read_split(out, prefix, split)
    return np.concatenate([t for _, t in shards]) if shards else np.zeros(0, np.uint16)


def error_line(result):
    """The one error line of a failed run (asserting there is exactly one and no traceback)."""
    assert result.returncode != 0, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if ": error:" in line]
    assert len(lines) == 1, result.stderr
    return lines[0]


def assert_partition(expected, val, train):
    """`val` and `train` (lists of token lists) split `expected` (the documents' token lists in input
    order) into two subsequences: every document once, in order, in one split."""
    i = j = 0
    for k, ids in enumerate(expected):
        if i < len(val) and val[i] == ids:
            i += 1
        elif j < len(train) and train[j] == ids:
            j += 1
        else:
            raise AssertionError(f"document {k} of the inputs is not next in either split")
    assert (i, j) == (len(val), len(train)), "the splits hold documents the inputs do not"
