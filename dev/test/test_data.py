"""
Tests of the data preparation (dev/data/): shard format, tokenizer.bin, tinyshakespeare.py, tokenize.py.
Run from the repo root: python -m pytest dev/test. Uses the real Llama-2 tokenizer and tiny-shakespeare
(found by llm8_data.resolve_data_file: $LLM8_DATA_DIR, ../shared/data or a download). Random inputs come
from a seed printed by each test (set LLM8_TEST_SEED to replay one).
"""
import io
import json
import re
import shutil

import numpy as np
import pytest

from conftest import load_llm8_data, requires_data
from data_helpers import BOS, assert_partition, raw_shard, read_split, run_script, split_docs

pytestmark = requires_data

llm8_data = load_llm8_data()


def paragraphs(text):
    return [p.strip() for p in re.split(r"\n\s*\n", text) if p.strip()]


# ----------------------------------------------------------------------------------------------------
# shard format

def test_shard_header_and_round_trip(tmp_path, rng):
    tokens = rng.integers(0, 32000, size=int(rng.integers(1, 5000)))
    path = tmp_path / "a.bin"
    llm8_data.write_shard(path, tokens)
    header, raw = raw_shard(path)
    assert header[0] == 20240520 and header[1] == 1 and header[2] == tokens.size
    assert not header[3:].any()
    assert path.stat().st_size == 1024 + 2 * tokens.size
    np.testing.assert_array_equal(raw, tokens)
    back = llm8_data.read_shard(path)
    assert back.dtype == np.uint16
    np.testing.assert_array_equal(back, tokens)
    assert not (tmp_path / "a.bin.tmp").exists()


def test_shard_version_by_max_id(tmp_path, rng):
    tokens = rng.integers(0, 2**16, size=1000)
    tokens[int(rng.integers(0, 1000))] = 2**16 - 1
    llm8_data.write_shard(tmp_path / "v1.bin", tokens)
    assert raw_shard(tmp_path / "v1.bin")[0][1] == 1

    tokens[int(rng.integers(0, 1000))] = int(rng.integers(2**16, 2**32))
    path = tmp_path / "v7.bin"
    llm8_data.write_shard(path, tokens)
    header, raw = raw_shard(path)
    # llm.c's uint32 shard (dev/data/data_common.py write_datafile(..., "llama-3")): magic 20240801, version 7
    assert header[0] == 20240801 and header[1] == 7 and header[2] == tokens.size
    assert path.stat().st_size == 1024 + 4 * tokens.size
    np.testing.assert_array_equal(raw, tokens)
    np.testing.assert_array_equal(llm8_data.read_shard(path), tokens)
    with pytest.raises(ValueError):
        llm8_data.write_shard(tmp_path / "bad.bin", tokens, version=1)


def test_earlier_uint32_shards_still_read(tmp_path, rng):
    """llm8's earlier uint32 shard (magic 20240520, version 2), written here from its description, reads."""
    tokens = rng.integers(0, 2**32, size=300, dtype=np.uint64)
    path = tmp_path / "old.bin"
    header = np.zeros(256, dtype="<i4")
    header[:3] = [20240520, 2, tokens.size]
    path.write_bytes(header.tobytes() + tokens.astype("<u4").tobytes())
    np.testing.assert_array_equal(llm8_data.read_shard(path), tokens)
    with pytest.raises(ValueError, match="is not written"):
        llm8_data.write_shard(tmp_path / "no.bin", tokens, version=2)


def corrupt(path, kind):
    data = bytearray(path.read_bytes())
    if kind == "magic":
        data[0:4] = np.int32(20240521).tobytes()
    elif kind == "version":
        data[4:8] = np.int32(3).tobytes()
    elif kind == "truncated":
        del data[-1]
    elif kind == "extra":
        data += b"\0\0"
    elif kind == "count":
        data[8:12] = np.int32(-1).tobytes()
    elif kind == "short_header":
        del data[1000:]
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("kind", ["magic", "version", "truncated", "extra", "count", "short_header"])
def test_read_shard_rejects(tmp_path, rng, kind):
    path = tmp_path / f"shard_{kind}.bin"
    llm8_data.write_shard(path, rng.integers(0, 32000, size=100))
    corrupt(path, kind)
    with pytest.raises(ValueError, match=re.escape(str(path))):
        llm8_data.read_shard(path)


def test_read_shard_checks_vocab(tmp_path, rng):
    tokens = rng.integers(0, 32000, size=500)
    i = int(rng.integers(0, 500))
    tokens[i] = 32000
    path = tmp_path / "vocab.bin"
    llm8_data.write_shard(path, tokens)
    with pytest.raises(ValueError, match=re.escape(str(path)) + f".*offset {1024 + 2 * i}"):
        llm8_data.read_shard(path, vocab_size=32000)
    llm8_data.read_shard(path, vocab_size=32001)


# ----------------------------------------------------------------------------------------------------
# tokenizer.bin

def read_tokenizer_bin(path):
    data = path.read_bytes()
    header = np.frombuffer(data[:1024], dtype="<i4")
    table, pos = [], 1024
    for _ in range(int(header[2])):
        n = data[pos]
        table.append(data[pos + 1:pos + 1 + n])
        pos += 1 + n
    assert pos == len(data), "trailing bytes after the table"
    return header, table


def table_decode(table, ids):
    """Decode as the C side does: concatenate, dropping the leading space of the first piece after BOS."""
    assert ids[0] == BOS
    pieces = [table[i] for i in ids[1:]]
    if pieces and pieces[0].startswith(b" "):
        pieces[0] = pieces[0][1:]
    return b"".join(pieces)


def random_sequence(rng, sp, normal_ids):
    """BOS, then random normal pieces and byte-fallback groups spelling random non-ASCII characters."""
    ids = [BOS]
    for _ in range(int(rng.integers(1, 40))):
        if rng.random() < 0.7:
            ids.append(int(rng.choice(normal_ids)))
        else:
            cp = int(rng.integers(0x80, 0x10FFFF - 0x800))
            cp += 0x800 if cp >= 0xD800 else 0          # skip the surrogates
            ids += [sp.piece_to_id(f"<0x{b:02X}>") for b in chr(cp).encode("utf-8")]
    return ids


def test_tokenizer_bin(tmp_path, rng, sp, model_path):
    path = tmp_path / "tokenizer.bin"
    llm8_data.export_tokenizer(model_path, path)
    header, table = read_tokenizer_bin(path)
    V = sp.get_piece_size()
    assert list(header[:5]) == [20251202, 1, V, sp.bos_id(), sp.eos_id()]
    assert not header[5:].any()
    assert len(table) == V
    for i in range(V):
        if sp.is_control(i) or sp.is_unknown(i):
            assert table[i] == b"", i
    for b in rng.integers(0, 256, size=20):
        assert table[sp.piece_to_id(f"<0x{int(b):02X}>")] == bytes([int(b)])

    normal_ids = [i for i in range(V) if not (sp.is_control(i) or sp.is_unknown(i) or sp.is_byte(i))]
    texts = ["Hello 😀 world, 世界! ꙮ 𝄞 ∮ E⋅da = Q", " leading space\nand newline\ttab  ",
             "Ünïcödé ünd émojis 🧪🦙 — 日本語のテキスト", "x" + "".join(
                 chr(int(c)) for c in rng.integers(0x4E00, 0x9FFF, size=30))]
    sequences = [[BOS] + sp.encode(t) for t in texts]
    sequences += [random_sequence(rng, sp, normal_ids) for _ in range(300)]
    assert any(sp.is_byte(i) for s in sequences[:len(texts)] for i in s), "no byte-fallback in texts"
    for ids in sequences:
        assert table_decode(table, ids) == sp.decode(ids).encode("utf-8"), ids


# ----------------------------------------------------------------------------------------------------
# tinyshakespeare.py

def test_tinyshakespeare(tmp_path, sp, text_path):
    out = tmp_path / "ts"
    result = run_script("tinyshakespeare.py", "--out", out)
    assert result.returncode == 0, result.stderr
    paras = paragraphs(text_path.read_text(encoding="utf-8"))
    docs = []
    for name in ("tiny_shakespeare_val.bin", "tiny_shakespeare_train.bin"):
        header, tokens = raw_shard(out / name)
        assert header[0] == 20240520 and header[2] == tokens.size
        assert tokens.max() < sp.get_piece_size()
        docs.append(split_docs(tokens))
        assert f"{tokens.size:,}" in result.stdout
    val, train = docs
    assert 0.09 <= len(val) / len(paras) <= 0.11
    assert len(val) + len(train) == len(paras)
    assert [sp.decode(d) for d in val + train] == paras
    assert (out / "tokenizer.bin").is_file()

    again = run_script("tinyshakespeare.py", "--out", out)
    assert again.returncode == 0 and "skipped" in again.stdout

    newer = tmp_path / "input.txt"       # an input newer than the outputs: redo the work
    shutil.copy(text_path, newer)
    redo = run_script("tinyshakespeare.py", "--out", out, "--input", newer)
    assert redo.returncode == 0 and "skipped" not in redo.stdout


# ----------------------------------------------------------------------------------------------------
# tokenize.py

def random_text(rng, words):
    lines = []
    for _ in range(int(rng.integers(1, 4))):
        lines.append(" ".join(rng.choice(words, size=int(rng.integers(1, 12)))))
    return "\n".join(lines)


def make_corpus(tmp_path, rng):
    """Two .txt files of paragraphs and two .jsonl files; returns (paths, expected documents)."""
    words = ["the", "king", "Ünïcödé", "世界", "😀", "emoji🦙", "x", "  ", "don't", "1234", "ꙮ", "\t"]
    paths, expected = [], []
    for k in range(2):
        paras = [random_text(rng, words) for _ in range(int(rng.integers(100, 200)))]
        seps = rng.choice(["\n\n", "\n \n", "\n\n\n", "\n\t\n"], size=len(paras))
        text = "\n" + "".join(p + s for p, s in zip(paras, seps))
        path = tmp_path / f"part{k}.txt"
        path.write_text(text, encoding="utf-8")
        paths.append(path)
        expected += paragraphs(text)
    for k in range(2):
        lines = []
        for _ in range(int(rng.integers(100, 200))):
            doc = random_text(rng, words)
            lines.append(json.dumps({"id": len(lines), "text": " " + doc + "\n"}, ensure_ascii=False))
            expected.append(doc.strip())
            if rng.random() < 0.05:
                lines.append("")
        lines.append(json.dumps({"text": "   "}))       # empty document: dropped
        path = tmp_path / f"part{k}.jsonl"
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        paths.append(path)
    return paths, [d for d in expected if d]


def test_tokenize_shards_and_workers(tmp_path, rng, sp, model_path):
    paths, expected = make_corpus(tmp_path, rng)
    val_docs = int(rng.integers(1, 20))
    shard_size = int(rng.integers(500, 1500))
    common = ["--tokenizer", model_path, "--split-paragraphs", "--val-docs", val_docs, *paths]
    one = run_script("tokenize.py", "--out-dir", tmp_path / "one", "--workers", 1, *common)
    assert one.returncode == 0, one.stderr
    many = run_script("tokenize.py", "--out-dir", tmp_path / "many", "--workers", 3,
                      "--shard-size", shard_size, "--prefix", "corpus", *common)
    assert many.returncode == 0, many.stderr

    streams = {}
    for key, prefix, size in (("one", "data", 100_000_000), ("many", "corpus", shard_size)):
        for split in ("val", "train"):
            shards = read_split(tmp_path / key, prefix, split)
            for i, (header, tokens) in enumerate(shards):
                assert header[0] == 20240520 and header[1] == 1 and header[2] == tokens.size
                assert tokens.size == size if i < len(shards) - 1 else 0 < tokens.size <= size
            streams[key, split] = np.concatenate([t for _, t in shards])
    assert len(read_split(tmp_path / "many", "corpus", "train")) > 3
    for split in ("val", "train"):
        np.testing.assert_array_equal(streams["one", split], streams["many", split])
    # --val-docs draws its documents by seed from all inputs (test_corpus.py tests the draw)
    val, train = (split_docs(streams["many", split]) for split in ("val", "train"))
    assert_partition([sp.encode(d) for d in expected], val, train)
    assert len(val) >= val_docs and len({tuple(d) for d in val}) <= val_docs   # more only if texts repeat
    assert (tmp_path / "many" / "tokenizer.bin").read_bytes() == \
        (tmp_path / "one" / "tokenizer.bin").read_bytes()


def test_tokenize_whole_files(tmp_path, sp, model_path):
    texts = ["  First file.\n\nStill the first document.\n", "Second 😀 file", "\n \n"]
    paths = []
    for k, t in enumerate(texts):
        paths.append(tmp_path / f"f{k}.txt")
        paths[-1].write_text(t, encoding="utf-8")
    result = run_script("tokenize.py", "--tokenizer", model_path, "--out-dir", tmp_path / "o",
                        "--workers", 2, *paths)
    assert result.returncode == 0, result.stderr
    assert not list((tmp_path / "o").glob("*_val_*"))
    (_, tokens), = read_split(tmp_path / "o", "data", "train")
    assert [sp.decode(d) for d in split_docs(tokens)] == [t.strip() for t in texts[:2]]


@pytest.mark.parametrize("case", ["missing", "malformed", "no_key", "not_string", "not_object",
                                  "extension", "too_many_val", "bad_utf8"])
def test_tokenize_errors(tmp_path, model_path, case):
    good = [json.dumps({"text": f"document number {i}"}) for i in range(300)]
    path = tmp_path / "in.jsonl"
    bad_line = {"malformed": '{"text": "unterminated', "no_key": '{"body": "x"}',
                "not_string": '{"text": 5}', "not_object": '["text"]'}.get(case)
    lines = good + [bad_line] + good if bad_line else good
    path.write_text("\n".join(lines) + "\n")
    extra, expect = [], f"{path}:{len(good) + 1}"
    if case == "missing":
        path, expect = tmp_path / "absent.txt", str(tmp_path / "absent.txt")
    elif case == "extension":
        path = tmp_path / "in.csv"
        path.write_text("a,b\n")
        expect = str(path)
    elif case == "too_many_val":
        extra, expect = ["--val-docs", 1000], "--val-docs"
    elif case == "bad_utf8":
        path.write_bytes(b'{"text": "ok"}\n{"text": "caf\xe9"}\n')
        expect = f"{path}:2"
    out = tmp_path / "out"
    result = run_script("tokenize.py", "--tokenizer", model_path, "--out-dir", out, "--workers", 2,
                        "--shard-size", 50, *extra, path)
    assert result.returncode != 0
    error_lines = [l for l in result.stderr.splitlines() if ": error:" in l]
    assert len(error_lines) == 1 and expect in error_lines[0], result.stderr
    assert "Traceback" not in result.stderr
    if case == "no_key":
        assert "'text'" in error_lines[0]
    assert not list(out.glob("*.bin*")), "partial output left behind"


def write_jsonl(path, docs):
    path.write_text("".join(json.dumps({"text": d}, ensure_ascii=False) + "\n" for d in docs), encoding="utf-8")
    return path


def snapshot(folder, skip=()):
    """{name: bytes} of every entry of `folder` but `skip` (a folder left behind would fail read_bytes)."""
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.name not in skip}


def test_tokenize_runs_are_atomic(tmp_path, rng, model_path):
    """A re-run that fails after writing shards leaves the previous data set byte for byte (its work
    kept for a resume, in a folder shard globs do not see); a smaller successful re-run replaces it whole
    (its stale shards removed, other prefixes kept)."""
    words = ["the", "king", "世界", "😀", "don't", "1234", "queen", "ꙮ"]

    def docs(n):
        return [" ".join(rng.choice(words, size=int(rng.integers(2, 12)))) for _ in range(n)]

    out = tmp_path / "out"
    out.mkdir()
    (out / "other_train_000000.bin").write_bytes(b"another data set")
    common = ["--tokenizer", model_path, "--out-dir", out, "--prefix", "c", "--shard-size", 64,
              "--val-fraction", 0.05]
    first = run_script("tokenize.py", *common, "--workers", 2, write_jsonl(tmp_path / "first.jsonl", docs(300)))
    assert first.returncode == 0, first.stderr
    before = snapshot(out)
    assert len(read_split(out, "c", "train")) > 10 and "tokenizer.bin" in before

    # different text, so the shards it writes (same names as the first run's) differ; then a bad line
    bad = write_jsonl(tmp_path / "bad.jsonl", docs(400))
    with open(bad, "a") as f:
        f.write('{"text": 5}\n')
    failed = run_script("tokenize.py", *common, "--workers", 1, bad)
    assert failed.returncode != 0 and f"{bad}:401" in failed.stderr, failed.stderr
    assert re.search(r"wrote \S*c_train_000000\.bin", failed.stderr), "no shard written before the failure"
    assert snapshot(out, skip=[".c.work"]) == before
    assert (out / ".c.work" / "journal.json").is_file()

    # 40 documents: a larger validation fraction, so that the draw is never empty (0.95^40 = 13% would be)
    smaller = run_script("tokenize.py", *common, "--val-fraction", 0.25, "--workers", 2,
                         write_jsonl(tmp_path / "small.jsonl", docs(40)))
    assert smaller.returncode == 0, smaller.stderr
    assert "not resuming" in smaller.stderr, smaller.stderr        # other inputs than the failed run's
    after = snapshot(out)
    shards = read_split(out, "c", "val") + read_split(out, "c", "train")
    assert len(after) == len(shards) + 3 < len(before)  # + tokenizer.bin, manifest.json, other_train_000000.bin
    assert after["other_train_000000.bin"] == b"another data set"
    assert after["tokenizer.bin"] == before["tokenizer.bin"]
    assert "removing stale shard" in smaller.stderr


# ----------------------------------------------------------------------------------------------------
# resolve_data_file

def test_resolve_data_file_env(tmp_path, monkeypatch, model_path):
    monkeypatch.setenv("LLM8_DATA_DIR", str(tmp_path))
    with pytest.raises(llm8_data.DataError, match="LLM8_DATA_DIR"):
        llm8_data.resolve_data_file("tokenizer")
    target = tmp_path / "tokenizer" / "llama2_tokenizer.model"
    target.parent.mkdir()
    shutil.copy(model_path, target)
    assert llm8_data.resolve_data_file("tokenizer") == target
    with open(target, "ab") as f:
        f.write(b"\0")
    with pytest.raises(llm8_data.DataError, match=re.escape(str(target)) + ".*sha256"):
        llm8_data.resolve_data_file("tokenizer")


def test_resolve_data_file_download(tmp_path, monkeypatch, text_path):
    """The download path, with urlopen replaced (no network here)."""
    monkeypatch.delenv("LLM8_DATA_DIR", raising=False)
    monkeypatch.setattr(llm8_data, "SHARED_DATA_DIRS", [tmp_path / "nowhere" / "shared" / "data"])
    monkeypatch.setattr(llm8_data, "CACHE_DIR", tmp_path / "cache")
    cached = tmp_path / "cache" / "tinyshakespeare" / "input.txt"

    def fail(url, timeout):
        raise OSError("network unreachable")
    monkeypatch.setattr(llm8_data.urllib.request, "urlopen", fail)
    with pytest.raises(llm8_data.DataError, match="input.txt.*LLM8_DATA_DIR"):
        llm8_data.resolve_data_file("tinyshakespeare")

    def wrong(url, timeout):
        return io.BytesIO(b"not shakespeare")
    monkeypatch.setattr(llm8_data.urllib.request, "urlopen", wrong)
    with pytest.raises(llm8_data.DataError, match="sha256"):
        llm8_data.resolve_data_file("tinyshakespeare")
    assert not cached.exists()

    def good(url, timeout):
        assert url == "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
        return io.BytesIO(text_path.read_bytes())
    monkeypatch.setattr(llm8_data.urllib.request, "urlopen", good)
    assert llm8_data.resolve_data_file("tinyshakespeare") == cached
    assert cached.read_bytes() == text_path.read_bytes()
