"""
Tests of dev/data/tokenize.py on pretraining corpora and of the text normalisation of the data
scripts: every input format gives the same shards; directories and globs; bad input stops with
one line; a killed run resumes to the uninterrupted result; mixtures; the validation draw; the manifest
and the progress line; BOMs, CR and CRLF line ends, control characters, invalid UTF-8, empty inputs and a
document spanning many shards. Expected tokens come from sentencepiece applied to the expected text.
Random inputs come from a seed printed by each test (LLM8_TEST_SEED replays it).
"""
import gzip
import hashlib
import json
import os
import re
import signal
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from conftest import REPO
from data_helpers import (BOS, DATA, assert_partition, error_line, raw_shard, run_script, split_docs,
                          split_stream)
import llm8_corpus  # noqa: E402  (dev/data, put on sys.path by data_helpers)
import llm8_data  # noqa: E402
import sample_corpus  # noqa: E402

WORDS = ["the", "king", "Ünïcödé", "世界", "😀", "emoji🦙", "x", "don't", "1234", "ꙮ", "queen", "a\tb",
         "naïve", "page\x0cbreak"]
FORMATS = [".txt", ".txt.gz", ".txt.zst", ".jsonl", ".jsonl.gz", ".jsonl.zst", ".parquet"]


def random_doc(rng, words=WORDS, lines=(1, 4), line_words=(1, 12)):
    """Lines of random words: no blank line inside, no whitespace around it."""
    return "\n".join(" ".join(rng.choice(words, size=int(rng.integers(*line_words))))
                     for _ in range(int(rng.integers(*lines))))


def tokenize(*args, workers=2):
    """Run tokenize.py; asserts success and returns the CompletedProcess."""
    result = run_script("tokenize.py", "--workers", workers, *args)
    assert result.returncode == 0, result.stderr
    return result


def shard_files(out):
    """{name: bytes} of the shards and tokenizer.bin in `out`."""
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.suffix == ".bin"}


def splits(out):
    """(val documents, train documents) of the data set in `out`, each a list of token lists."""
    return tuple(split_docs(s) if s.size else [] for s in (split_stream(out, "val"), split_stream(out, "train")))


def published(out):
    """What a shard glob or a reader of `out` sees (the work folder is hidden)."""
    return [p.name for p in out.iterdir() if not p.name.startswith(".")] if out.exists() else []


def encoded(sp, docs):
    return [sp.encode(d) for d in docs]


def sha256(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ----------------------------------------------------------------------------------------------------
# formats, directories, globs

def test_formats_give_identical_shards(tmp_path, rng, sp, model_path):
    docs = [random_doc(rng) for _ in range(int(rng.integers(200, 300)))]
    common = ["--tokenizer", model_path, "--split-paragraphs", "--val-fraction", 0.1,
              "--seed", int(rng.integers(0, 2**63)), "--shard-size", int(rng.integers(500, 2000))]
    runs = {}
    for k, suffix in enumerate(FORMATS):
        path = sample_corpus.write_documents(tmp_path / f"in{suffix}", docs,
                                             row_group_size=int(rng.integers(5, 50)))
        tokenize(*common, "--out-dir", tmp_path / suffix, path, workers=1 + k % 3)
        runs[suffix] = tmp_path / suffix
    folder = tmp_path / "folder"        # one .txt file per document, created out of order
    folder.mkdir()
    for i in rng.permutation(len(docs)):
        (folder / f"doc_{i:05d}.txt").write_text(docs[i], encoding="utf-8")
    for p, part in enumerate(np.array_split(np.arange(len(docs)), 3)):
        sample_corpus.write_documents(tmp_path / f"part_{p}.jsonl", [docs[i] for i in part])
    for name, inputs in (("folder", [folder]), ("glob", [tmp_path / "part_*.jsonl"])):
        tokenize(*common, "--out-dir", tmp_path / f"out_{name}", *inputs)
        runs[name] = tmp_path / f"out_{name}"

    reference = runs[".jsonl"]
    manifest = json.loads((reference / "manifest.json").read_text())
    del manifest["inputs"]
    for name, out in runs.items():
        assert shard_files(out) == shard_files(reference), name
        other = json.loads((out / "manifest.json").read_text())
        assert sum(entry["documents"] for entry in other.pop("inputs")) == len(docs)
        assert other == manifest, name
    val, train = splits(reference)
    assert_partition(encoded(sp, docs), val, train)
    assert 0 < len(val) < 0.3 * len(docs)
    assert len(shard_files(reference)) > 4


def test_expand_inputs(tmp_path):
    for name in ["b/2.jsonl", "a/10.txt", "a/9.txt", "a/sub/1.parquet", "c.jsonl.zst", "a/notes.md",
                 "a/x.jsonl.gz", "a/empty/.keep"]:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")

    def expand(*specs):
        return [str(p.relative_to(tmp_path)) for p in llm8_corpus.expand_inputs([tmp_path / s for s in specs])]

    assert expand("c.jsonl.zst", "a", "b/*.jsonl") == \
        ["c.jsonl.zst", "a/10.txt", "a/9.txt", "a/sub/1.parquet", "a/x.jsonl.gz", "b/2.jsonl"]
    assert expand("**/*.txt", "b") == ["a/10.txt", "a/9.txt", "b/2.jsonl"]
    assert expand("a/s*") == ["a/sub/1.parquet"]
    for specs, message in ((["nothing.txt"], "not found"), (["*.txt"], "no file matches"),
                           (["a/empty"], "no .txt"), (["a/notes.md"], "unsupported input type"),
                           (["a/*"], "notes.md: unsupported"), (["a", "a/sub/1.parquet"], "named twice")):
        with pytest.raises(llm8_data.DataError, match=message):
            expand(*specs)


# ----------------------------------------------------------------------------------------------------
# bad input

def write_bad_input(path, kind, rng):
    """A corrupt or unsuitable input `kind` at `path` (suffix added); returns (path, extra flags, a
    regex of what the error line must say right after the path)."""
    docs = [random_doc(rng, lines=(5, 20)) for _ in range(1500)]     # several reads of the file
    nth = int(rng.integers(100, 1400))
    if kind.startswith("gz") or kind.startswith("zst"):
        good = sample_corpus.write_documents(path.with_suffix(".jsonl." + kind[:kind.index("_")]), docs)
        data = bytearray(good.read_bytes())
        if kind.endswith("truncated"):
            del data[len(data) // 2:]
        elif kind.endswith("garbage"):
            data[:] = rng.integers(0, 256, size=len(data), dtype=np.uint8).tobytes()
        else:                   # flip bytes in the second half, past the first reads
            for i in rng.integers(len(data) // 2, 3 * len(data) // 4, size=8):
                data[i] ^= 0xFF
        good.write_bytes(bytes(data))
        # flipped bytes may first decode to bad text (gzip checks its CRC at the end): a parse error
        where = {"truncated": r": corrupt or unreadable after line \d+ ",
                 "garbage": r": corrupt or unreadable at the start ",
                 "flipped": r"(: corrupt or unreadable after line \d+ |:\d+: )"}[kind.split("_")[1]]
        return good, [], where
    path = path.with_suffix(".parquet")
    if kind == "parquet_truncated":
        sample_corpus.write_documents(path, docs)
        path.write_bytes(path.read_bytes()[:path.stat().st_size // 2])
        return path, [], ": not a readable parquet file"
    if kind == "parquet_page":      # a data page header of a later row group overwritten
        sample_corpus.write_documents(path, docs, row_group_size=50)
        group = int(rng.integers(1, 8))
        offset = pq.ParquetFile(path).metadata.row_group(group).column(1).data_page_offset
        data = bytearray(path.read_bytes())
        data[offset:offset + 16] = b"\xff" * 16
        path.write_bytes(bytes(data))
        return path, [], rf": corrupt or unreadable in row group {group} \(rows {group * 50}-{group * 50 + 49}\)"
    if kind == "parquet_column":
        sample_corpus.write_documents(path, docs)
        return path, ["--text-key", "body"], r": no column 'body' \(columns: id, text"
    if kind == "parquet_int":
        pq.write_table(pa.table({"text": list(range(10))}), path)
        return path, [], ": column 'text' holds int64, not strings"
    if kind == "parquet_null":
        values = list(docs)
        values[nth] = None
        pq.write_table(pa.table({"text": values}), path, row_group_size=64)
        return path, [], f": row {nth}: 'text' is null, not a string"
    if kind == "jsonl_surrogate":
        path = sample_corpus.write_documents(path.with_suffix(".jsonl"), docs)
        lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
        lines[nth] = '{"text": "half a pair \\ud83d here"}\n'
        path.write_text("".join(lines), encoding="utf-8")
        return path, [], rf":{nth + 1}: 'text' is not valid Unicode"
    raise ValueError(kind)


@pytest.mark.parametrize("kind", ["gz_truncated", "gz_garbage", "gz_flipped", "zst_truncated", "zst_garbage",
                                  "zst_flipped", "parquet_truncated", "parquet_page", "parquet_column",
                                  "parquet_int", "parquet_null", "jsonl_surrogate"])
def test_bad_input_one_line_error(tmp_path, rng, model_path, kind):
    good = sample_corpus.write_documents(tmp_path / "good.jsonl", [random_doc(rng) for _ in range(200)])
    bad, extra, where = write_bad_input(tmp_path / "bad", kind, rng)
    out = tmp_path / "out"
    result = run_script("tokenize.py", "--tokenizer", model_path, "--out-dir", out, "--shard-size", 2000,
                        "--workers", 2, *extra, good, bad)
    line = error_line(result)
    assert re.search(re.escape(str(bad)) + where, line), line
    assert not published(out), "a failed run published files"


# ----------------------------------------------------------------------------------------------------
# interruption

def run_killed(args, after_shards, sig=signal.SIGKILL):
    """Run tokenize.py and signal its process group right after it reports shard number `after_shards`
    complete: SIGKILL as the OOM killer or a lost node would, SIGTERM as a scheduler does (the run
    unwinds, writing out what it had buffered past its last checkpoint); returns its stderr."""
    proc = subprocess.Popen([sys.executable, str(DATA / "tokenize.py"), *map(str, args)], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    lines, done = [], 0
    for line in proc.stderr:
        lines.append(line)
        done += line.startswith("wrote ")
        if done == after_shards:
            os.killpg(proc.pid, sig)
            break
    lines += proc.stderr.read() if sig != signal.SIGKILL else []
    proc.wait(timeout=60)
    expected = -sig if sig == signal.SIGKILL else 1
    assert proc.returncode == expected, "the run was not stopped:\n" + "".join(lines)
    return "".join(lines)


def test_resume_after_kill(tmp_path, rng, sp, model_path):
    """Killed after its first shard, or after a random one, a run resumes to the uninterrupted result,
    also when an input it had not read yet changed; an input it had read changing makes it start over."""
    a, b, c = (tmp_path / name for name in ("a.jsonl.zst", "b.parquet", "c.txt"))
    docs = {path: [random_doc(rng, lines=(1, 8), line_words=(5, 30)) for _ in range(n)]
            for path, n in ((a, 1500), (b, 700), (c, 500))}
    for path, path_docs in docs.items():
        sample_corpus.write_documents(path, path_docs, row_group_size=64)
    shard_size = 4096
    n_shards = sum(len(ids) + 1 for ds in docs.values() for ids in encoded(sp, ds)) // shard_size
    common = ["--tokenizer", model_path, "--split-paragraphs", "--val-fraction", 0.05,
              "--shard-size", shard_size]

    out = tmp_path / "out"
    run_killed([*common, "--workers", 1, "--out-dir", out, a, b, c], after_shards=1)
    assert not published(out), "the killed run published files"
    assert (out / ".data.work" / "journal.json").is_file()
    docs[c] = docs[c][::-1]             # not read before the kill: the resumed run reads the new text
    sample_corpus.write_documents(c, docs[c])
    resumed = tokenize(*common, "--out-dir", out, a, b, c)
    assert "resuming" in resumed.stderr and "starting over" not in resumed.stderr, resumed.stderr
    reference = tmp_path / "reference"
    tokenize(*common, "--out-dir", reference, a, b, c, workers=3)
    assert shard_files(out) == shard_files(reference)
    assert (out / "manifest.json").read_bytes() == (reference / "manifest.json").read_bytes()
    assert not (out / ".data.work").exists()
    assert_partition(encoded(sp, docs[a] + docs[b] + docs[c]), *splits(out))

    out = tmp_path / "random"
    stopped = run_killed([*common, "--workers", 2, "--out-dir", out, a, b, c],
                         int(rng.integers(1, 0.8 * n_shards)), signal.SIGTERM)
    assert stopped.endswith("interrupted; the same command resumes after the last complete shard\n"), stopped
    tokenize(*common, "--out-dir", out, a, b, c)
    assert shard_files(out) == shard_files(reference)

    out = tmp_path / "changed"
    run_killed([*common, "--workers", 1, "--out-dir", out, a, b, c], after_shards=1)
    sample_corpus.write_documents(a, docs[a][1:])
    again = tokenize(*common, "--out-dir", out, a, b, c)
    assert f"{a} changed; starting over" in again.stderr, again.stderr
    assert_partition(encoded(sp, docs[a][1:] + docs[b] + docs[c]), *splits(out))


# ----------------------------------------------------------------------------------------------------
# mixtures and the validation draw

MIX_WORDS = {
    "web": ["the", "king", "queen", "city", "river", "music", "people", "world", "Zürich", "东京"],
    "code": ["def", "return", "if", "else", "self", "None", "==", "+=", "(", ")", "[", "]"],
    "books": ["Kapitel", "dunkel", "Wald", "Morgen", "Licht", "Straße", "Fenster", "ruhig", "Stadt"],
}


def mix_source(rng, sp, words, target_tokens):
    """Documents of `words` until they hold `target_tokens` tokens (BOS included)."""
    docs, tokens = [], 0
    while tokens < target_tokens:
        docs.append(random_doc(rng, words, lines=(1, 4), line_words=(3, 20)))
        tokens += len(sp.encode(docs[-1])) + 1
    return docs


def test_mixture_proportions_and_order(tmp_path, rng, sp, model_path):
    names = list(MIX_WORDS)
    weights = np.round(0.15 + 0.55 * rng.dirichlet([1, 1, 1]), 4)
    weights /= weights.sum()
    total = 400_000
    ends = names[int(rng.integers(0, 3))]      # the source that runs out first: it ends the mixture
    sources, args = {}, []
    for name, weight in zip(names, weights):
        docs = mix_source(rng, sp, MIX_WORDS[name], weight * total * (1.0 if name == ends else 1.5))
        folder = tmp_path / name
        folder.mkdir()
        suffix = {"web": ".jsonl.zst", "code": ".parquet", "books": ".txt"}[name]
        for k, part in enumerate(np.array_split(np.arange(len(docs)), 2)):
            sample_corpus.write_documents(folder / f"{k}{suffix}", [docs[i] for i in part], row_group_size=40)
        sources[name] = docs
        args += [f"{name}={weight:.6f}:{folder}"]
    source_of = {tuple(ids): name for name, docs in sources.items() for ids in encoded(sp, docs)}
    seed = int(rng.integers(0, 2**63))
    common = ["--tokenizer", model_path, "--split-paragraphs", "--val-fraction", 0.05, "--shard-size", 20_000]
    out = tmp_path / "out"
    result = tokenize(*common, "--seed", seed, "--out-dir", out, "--mix", *args)

    val, train = splits(out)
    counts = {name: 0 for name in names}
    for ids in val + train:
        counts[source_of[tuple(ids)]] += len(ids) + 1
    realised = {name: counts[name] / sum(counts.values()) for name in names}
    for name, weight in zip(names, weights):
        assert abs(realised[name] / weight - 1) < 0.01, (name, realised[name], weight, result.stderr)
    manifest = {src["name"]: src for src in json.loads((out / "manifest.json").read_text())["sources"]}
    for name in names:
        assert manifest[name]["tokens"] == counts[name]
        assert manifest[name]["proportion"] == pytest.approx(realised[name], abs=1e-6)
        assert manifest[name]["exhausted"] == (name == ends)
        # each source's documents are taken in input order; the one that ran out is used whole
        used = [ids for ids in val + train if source_of[tuple(ids)] == name]
        expected = encoded(sp, sources[name])[:len(used)]
        assert_partition(expected, [ids for ids in val if source_of[tuple(ids)] == name],
                         [ids for ids in train if source_of[tuple(ids)] == name])
        assert (len(used) == len(sources[name])) == (name == ends)
        # interleaved: every source in the first and the last tenth of the train stream
        for part in (train[:len(train) // 10], train[-len(train) // 10:]):
            assert any(source_of[tuple(ids)] == name for ids in part), name

    again = tmp_path / "again"
    tokenize(*common, "--seed", seed, "--out-dir", again, "--mix", *args, workers=1)
    assert shard_files(again) == shard_files(out)
    other = tmp_path / "other_seed"
    tokenize(*common, "--seed", seed + 1, "--out-dir", other, "--mix", *args)
    assert not np.array_equal(split_stream(other, "train")[:50_000], split_stream(out, "train")[:50_000])


def test_validation_draw(tmp_path, rng, sp, model_path):
    files = [[random_doc(rng) for _ in range(150)] for _ in range(3)]
    for i in rng.choice(150, size=20, replace=False):       # texts that occur in two inputs
        files[2].insert(int(rng.integers(0, len(files[2]))), files[0][i])
    paths = [sample_corpus.write_documents(tmp_path / f"in{k}.jsonl", docs) for k, docs in enumerate(files)]
    all_ids = encoded(sp, [d for docs in files for d in docs])
    file_of = {tuple(ids): k for k, docs in reversed(list(enumerate(files))) for ids in encoded(sp, docs)}
    seed = int(rng.integers(0, 2**63))
    common = ["--tokenizer", model_path, "--val-fraction", 0.2, "--shard-size", 3000]

    tokenize(*common, "--seed", seed, "--out-dir", tmp_path / "a", *paths)
    val, train = splits(tmp_path / "a")
    assert_partition(all_ids, val, train)
    assert not {tuple(ids) for ids in val} & {tuple(ids) for ids in train}, "a text in both splits"
    assert 0.1 < len(val) / len(all_ids) < 0.3
    assert len({file_of[tuple(ids)] for ids in val}) == 3, "the draw does not span the inputs"
    tokenize(*common, "--seed", seed, "--out-dir", tmp_path / "b", *paths, workers=1)
    assert shard_files(tmp_path / "b") == shard_files(tmp_path / "a")
    tokenize(*common, "--seed", seed + 1, "--out-dir", tmp_path / "c", *paths)
    assert splits(tmp_path / "c")[0] != val

    n = int(rng.integers(20, 40))       # --val-docs: exactly n, drawn from both inputs (all from one: 2^-19)
    tokenize("--tokenizer", model_path, "--val-docs", n, "--seed", seed, "--out-dir", tmp_path / "d", *paths[:2])
    val, train = splits(tmp_path / "d")
    assert len(val) == n
    assert_partition(encoded(sp, files[0] + files[1]), val, train)
    assert len({file_of[tuple(ids)] for ids in val}) == 2


# ----------------------------------------------------------------------------------------------------
# manifest and progress

def test_manifest_and_progress(tmp_path, rng, model_path):
    paths = [sample_corpus.write_documents(tmp_path / "a.jsonl.zst", [random_doc(rng) for _ in range(300)]),
             sample_corpus.write_documents(tmp_path / "b.parquet", [random_doc(rng) for _ in range(200)])]
    out, shard_size = tmp_path / "out", int(rng.integers(500, 3000))
    result = tokenize("--tokenizer", model_path, "--out-dir", out, "--prefix", "p", "--val-fraction", 0.1,
                      "--shard-size", shard_size, "--progress-every", 0, *paths)
    progress = re.compile(r"^[\d,]+ documents, [\d,]+ tokens, [\d,]+ tokens/s, [\d.]+ MB/s of input "
                          r"\([\d.]+%\), ETA (\d\d:\d\d:\d\d|\?)$", re.M)
    assert progress.search(result.stderr), result.stderr

    m = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    assert (m["format"], m["version"], m["prefix"], m["shard_version"], m["shard_size"]) == \
        ("llm8 shards", 1, "p", 1, shard_size)
    assert (m["vocab_size"], m["bos_id"], m["tokenizer_sha256"]) == (32000, 1, sha256(model_path))
    on_disk = sorted(p.name for p in out.glob("p_*.bin"))
    assert sorted(shard["file"] for shard in m["shards"]) == on_disk
    for shard in m["shards"]:
        header, tokens = raw_shard(out / shard["file"])
        assert header[2] == shard["tokens"] == tokens.size
        assert shard["split"] == shard["file"].split("_")[1]
        assert shard["sha256"] == sha256(out / shard["file"])
    for split in ("val", "train"):
        stream = split_stream(out, split, "p")
        assert m["splits"][split] == {"documents": int((stream == BOS).sum()), "tokens": stream.size,
                                      "shards": sum(s["split"] == split for s in m["shards"])}
    assert m["tokens"] == sum(s["tokens"] for s in m["shards"])
    assert [(i["path"], i["bytes"], i["sha256"]) for i in m["inputs"]] == \
        [(str(p), p.stat().st_size, sha256(p)) for p in paths]
    assert sum(i["documents"] for i in m["inputs"]) == m["documents"] == 500
    assert m["sources"] == [{"name": "all", "weight": 1.0, "documents": 500, "tokens": m["tokens"],
                             "proportion": 1.0, "exhausted": True}]

    before = shard_files(out)
    refused = run_script("tokenize.py", "--tokenizer", model_path, "--out-dir", out, "--prefix", "q", *paths)
    assert "holds the data set 'p'" in error_line(refused)
    assert shard_files(out) == before


# ----------------------------------------------------------------------------------------------------
# text edge cases

def normalised(text):
    """docs/data.md's rules, character by character: CRLF and CR become LF; U+FEFF, DEL and the C0
    controls but TAB, LF and FF are dropped; everything else stays."""
    out, i = [], 0
    while i < len(text):
        c = text[i]
        i += 1
        if c == "\r":
            out.append("\n")
            i += text[i:i + 1] == "\n"
        elif not (c == "\ufeff" or c == "\x7f" or (c < " " and c not in "\t\n\x0c")):
            out.append(c)
    return "".join(out)


def test_normalize_text(rng):
    alphabet = [chr(c) for c in range(0x20)] + ["\x7f", "\x85", "\x9f", "\ufeff", "\u2028", "\u00a0", "a",
                                                 "Z", " ", "é", "世", "😀", "\r\n", "\r\r"]
    for _ in range(500):
        text = "".join(rng.choice(alphabet, size=int(rng.integers(0, 40))))
        assert llm8_data.normalize_text(text) == normalised(text), repr(text)
    assert llm8_data.normalize_text("\ufeffa\r\nb\rc\x00d\x0c\x85") == "a\nb\ncd\x0c\x85"


CONTROLS = ["\x00", "\x01", "\x08", "\x0b", "\x1b", "\x1f", "\x7f", "\ufeff"]


def with_controls(rng, doc):
    """`doc` with characters that normalisation removes put in."""
    chars = list(doc)
    for _ in range(int(rng.integers(0, 4))):
        chars.insert(int(rng.integers(0, len(chars) + 1)), str(rng.choice(CONTROLS)))
    return "".join(chars)


def dirty(rng, doc):
    """`doc` with removable characters put in, then its line ends made LF, CRLF or CR."""
    return with_controls(rng, doc).replace("\n", str(rng.choice(["\n", "\r\n", "\r"])))


def test_dirty_text_gives_clean_tokens(tmp_path, rng, sp, model_path):
    """BOMs (a file's start, a line's where files were concatenated, inside values), CRLF and CR line
    ends, NUL and other controls: normalised the same way in every format, so the shards equal those of
    the clean text."""
    docs = [[random_doc(rng) for _ in range(int(rng.integers(30, 60)))] for _ in range(4)]
    clean = [sample_corpus.write_documents(tmp_path / f"clean{k}{suffix}", part)
             for k, (suffix, part) in enumerate(zip([".txt", ".jsonl", ".parquet", ".jsonl.zst"], docs))]
    # .txt: two files with BOMs concatenated, CRLF then CR line ends, controls in lines and blank lines
    half = len(docs[0]) // 2
    text = "\ufeff" + "".join(d.replace("\n", "\r\n") + "\r\n\x00\r\n" for d in docs[0][:half])
    text += "\ufeff" + "\r \r".join(with_controls(rng, d).replace("\n", "\r") for d in docs[0][half:])
    (tmp_path / "dirty0.txt").write_text(text, encoding="utf-8")
    # .jsonl: BOM first and where a second file begins, CRLF line ends, dirty values
    lines = [json.dumps({"text": dirty(rng, d)}, ensure_ascii=bool(k % 2)) for k, d in enumerate(docs[1])]
    lines.insert(len(lines) // 2, "\ufeff" + lines.pop(len(lines) // 2))
    (tmp_path / "dirty1.jsonl").write_text("\ufeff" + "\r\n".join(lines) + "\r\n", encoding="utf-8")
    sample_corpus.write_documents(tmp_path / "dirty2.parquet", [dirty(rng, d) for d in docs[2]])
    sample_corpus.write_documents(tmp_path / "dirty3.jsonl.zst", [dirty(rng, d) for d in docs[3]])
    dirty_paths = [tmp_path / name
                   for name in ("dirty0.txt", "dirty1.jsonl", "dirty2.parquet", "dirty3.jsonl.zst")]

    for name, paths in (("clean", clean), ("dirty", dirty_paths)):
        tokenize("--tokenizer", model_path, "--split-paragraphs", "--shard-size", 1000,
                 "--out-dir", tmp_path / name, *paths)
    assert shard_files(tmp_path / "dirty") == shard_files(tmp_path / "clean")
    assert splits(tmp_path / "clean") == ([], encoded(sp, [d for part in docs for d in part]))


def test_bom_adds_no_token(tmp_path, sp, model_path, text_path):
    """A book downloaded as plain text (BOM, CRLF) tokenizes as the same text without."""
    text = text_path.read_text(encoding="utf-8")
    book = text[:30_000]
    (tmp_path / "book.txt").write_text(book, encoding="utf-8")
    (tmp_path / "bom.txt").write_bytes(b"\xef\xbb\xbf" + book.replace("\n", "\r\n").encode("utf-8"))
    for name in ("book", "bom"):
        tokenize("--tokenizer", model_path, "--out-dir", tmp_path / name, tmp_path / f"{name}.txt")
    assert shard_files(tmp_path / "bom") == shard_files(tmp_path / "book")
    assert split_stream(tmp_path / "bom", "train").tolist() == [BOS] + sp.encode(book.strip())

    (tmp_path / "input.txt").write_bytes(b"\xef\xbb\xbf" + text.replace("\n", "\r\n").encode("utf-8"))
    for name, path in (("plain", text_path), ("bom_crlf", tmp_path / "input.txt")):
        result = run_script("tinyshakespeare.py", "--input", path, "--out", tmp_path / name)
        assert result.returncode == 0, result.stderr
    assert shard_files(tmp_path / "bom_crlf") == shard_files(tmp_path / "plain")


@pytest.mark.parametrize("fmt", ["txt", "txt_crlf", "txt_paragraphs", "txt.gz_paragraphs", "jsonl.zst"])
def test_invalid_utf8_names_file_and_line(tmp_path, rng, model_path, fmt):
    n = int(rng.integers(20, 80))
    lines = [" ".join(rng.choice(WORDS[:11], size=5)).encode("utf-8") for _ in range(n)]
    k = int(rng.integers(0, n))
    # a byte that never starts a character, a cut character, an overlong encoding, a surrogate
    bad = [b"\xff", b"\xe4\xb8", b"\xc0\xaf", b"\xed\xa0\x80"][int(rng.integers(0, 4))]
    if fmt.startswith("jsonl"):
        lines = [b'{"text": "' + line + b'"}' for line in lines]
    lines[k] = lines[k][:8] + bad + lines[k][8:]
    data = (b"\r\n" if fmt == "txt_crlf" else b"\n").join(lines) + b"\n"
    path = tmp_path / ("in." + fmt.split("_")[0])
    path.write_bytes(gzip.compress(data) if fmt.startswith("txt.gz") else
                     zstandard.ZstdCompressor().compress(data) if fmt.endswith("zst") else data)
    extra = ["--split-paragraphs"] if fmt.endswith("paragraphs") else []
    result = run_script("tokenize.py", "--tokenizer", model_path, "--out-dir", tmp_path / "out", *extra, path)
    assert f"{path}:{k + 1}: not valid UTF-8" in error_line(result)


def test_empty_inputs(tmp_path, sp, model_path):
    """Empty files of every format and empty or blank values are no documents, and no error."""
    empties = {
        "empty.txt": b"", "blank.txt": "\ufeff \r\n\t\n\x00\n".encode("utf-8"), "empty.jsonl": b"",
        "values.jsonl": ('\ufeff\n{"text": ""}\n\n{"text": "  \\r\\n "}\n'
                         '\ufeff{"text": "\\ufeff\\u0000"}\n').encode("utf-8"),
        "empty.jsonl.gz": gzip.compress(b""), "zero.jsonl.gz": b"", "zero.jsonl.zst": b"",
        "empty.jsonl.zst": zstandard.ZstdCompressor(write_checksum=True).compress(b""),
    }
    for name, data in empties.items():
        (tmp_path / name).write_bytes(data)
    pq.write_table(pa.table({"text": pa.array([], pa.string())}), tmp_path / "empty.parquet")
    pq.write_table(pa.table({"text": ["", " \n ", "\ufeff"]}), tmp_path / "blank.parquet")
    docs = ["first real document", "second, ünïcödé", "third"]
    real = sample_corpus.write_documents(tmp_path / "real.jsonl", docs)
    paths = sorted(tmp_path.iterdir())
    for split_paragraphs in ([], ["--split-paragraphs"]):
        out = tmp_path / f"out{len(split_paragraphs)}"
        tokenize("--tokenizer", model_path, "--out-dir", out, *split_paragraphs, *paths)
        assert splits(out) == ([], encoded(sp, docs))
    paths.remove(real)
    nothing = run_script("tokenize.py", "--tokenizer", model_path, "--out-dir", tmp_path / "none", *paths)
    assert "0 documents: none left for training" in error_line(nothing)


def test_huge_document_spans_many_shards(tmp_path, rng, sp, model_path):
    small = [random_doc(rng) for _ in range(10)]
    huge = random_doc(rng, lines=(2000, 2001), line_words=(5, 30))      # ~100k tokens, one document
    paths = [sample_corpus.write_documents(tmp_path / "before.jsonl", small[:5]), tmp_path / "book.txt",
             sample_corpus.write_documents(tmp_path / "after.parquet", small[5:])]
    paths[1].write_text(huge, encoding="utf-8")
    out, shard_size = tmp_path / "out", int(rng.integers(900, 1100))
    tokenize("--tokenizer", model_path, "--out-dir", out, "--shard-size", shard_size, *paths)
    shards = [raw_shard(p)[1] for p in sorted(out.glob("data_train_*.bin"))]
    expected = np.concatenate([[BOS] + ids for ids in encoded(sp, small[:5] + [huge] + small[5:])])
    assert len(shards) > 50 and all(s.size == shard_size for s in shards[:-1])
    np.testing.assert_array_equal(np.concatenate(shards), expected)


# ----------------------------------------------------------------------------------------------------

def test_readme_worked_example(tmp_path, model_path):
    """docs/data.md, "A worked example": the sample corpus, one format, then a mixture."""
    sample = tmp_path / "sample"
    assert run_script("sample_corpus.py", "--out", sample, "--docs", 400).returncode == 0
    tokenize("--tokenizer", model_path, "--out-dir", tmp_path / "one", "--val-fraction", 0.01,
             sample / "sample.jsonl.zst")
    result = tokenize("--tokenizer", model_path, "--out-dir", tmp_path / "mix", "--split-paragraphs",
                      "--val-fraction", 0.01, "--mix", f"web=0.6:{sample}/mix/web",
                      f"code=0.3:{sample}/mix/code/*.parquet", f"books=0.1:{sample}/mix/books")
    assert "source web: weight 0.6000" in result.stderr, result.stderr
    assert (tmp_path / "mix" / "manifest.json").is_file()
