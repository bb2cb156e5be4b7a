"""
The trainer reads the manifest.json that dev/data/tokenize.py writes beside the shards (docs/formats.md "Data
set manifest"): it prints what it says, accepts a subset of a split's shards, and stops with one line naming
the file when a shard does not match it (another token count, the wrong split).
"""
import json
import shutil

import pytest

from conftest import run
from data_helpers import run_script

ARGS = ["-x", "1", "-v", "0", "-m", "1", "-b", "2", "-t", "64"]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory, model_path):
    """The sample corpus tokenized into two train shards and one val shard, with its manifest."""
    root = tmp_path_factory.mktemp("manifest")
    assert run_script("sample_corpus.py", "--out", root / "sample", "--docs", 300).returncode == 0
    r = run_script("tokenize.py", "--tokenizer", model_path, "--out-dir", root / "data", "--shard-size", 40000,
                   "--val-fraction", 0.1, root / "sample" / "sample.jsonl.zst")
    assert r.returncode == 0, r.stderr
    return root / "data"


def copy_of(dataset, tmp_path):
    out = tmp_path / "data"
    shutil.copytree(dataset, out)
    return out


def train(trainer, data, train_glob="data_train_*.bin", val_glob="data_val_*.bin"):
    return run([trainer, *ARGS, "-i", data / train_glob, "-j", data / val_glob])


def test_manifest_printed_and_checked(trainer, dataset):
    manifest = json.loads((dataset / "manifest.json").read_text())
    r = train(trainer, dataset)
    assert r.returncode == 0, r.stderr
    shards = manifest["splits"]["train"]["shards"]
    assert shards >= 2
    assert f"-i data: {dataset}/manifest.json: {manifest['documents']} documents, {manifest['tokens']} tokens in all; " \
           f"train split {shards} shard(s) of which {shards} matched" in r.stdout, r.stdout
    r = train(trainer, dataset, train_glob="data_train_000000.bin")
    assert r.returncode == 0 and f"of which 1 matched (a subset)" in r.stdout, r.stdout


def one_line_error(result):
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def test_wrong_split_is_refused(trainer, dataset):
    line = one_line_error(train(trainer, dataset, val_glob="data_train_000001.bin"))
    assert "-j" in line and "data_train_000001.bin is a train shard" in line


def test_token_count_mismatch_is_refused(trainer, dataset, tmp_path):
    data = copy_of(dataset, tmp_path)
    manifest = json.loads((data / "manifest.json").read_text())
    entry = next(s for s in manifest["shards"] if s["split"] == "train")
    entry["tokens"] += 1
    (data / "manifest.json").write_text(json.dumps(manifest))
    line = one_line_error(train(trainer, data))
    assert entry["file"] in line and "lists" in line


def test_no_manifest_is_said(trainer, dataset, tmp_path):
    data = copy_of(dataset, tmp_path)
    (data / "manifest.json").unlink()
    r = train(trainer, data)
    assert r.returncode == 0 and "no manifest.json in" in r.stdout
