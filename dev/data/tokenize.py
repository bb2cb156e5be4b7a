"""
Tokenize text corpora into llm.c token shards with a SentencePiece tokenizer (Llama-2's by default).

Inputs are .txt files (one document each, or one per paragraph with --split-paragraphs) and .jsonl files
(one JSON object per line, the document in --text-key), read in the order given. A document is its
text stripped of surrounding whitespace; empty documents are dropped; each starts with BOS. The first
--val-docs documents go to {prefix}_val_000000.bin, the rest to {prefix}_train_000000.bin, ...; every
shard but the last of a split holds exactly --shard-size tokens (documents may straddle shards, as in
llm.c). Output is the same for any --workers. tokenizer.bin is written beside the shards.

A run is all or nothing: everything is written into a temporary folder inside --out-dir and moved into
place only when the run succeeds, which also removes an earlier run's {prefix} shards that this run did
not replace; a failed run removes its temporary folder and leaves the previous data set as it was.
"""
import os
import sys

# This file shares its name with the standard library's `tokenize` (imported by linecache, traceback,
# multiprocessing...), so its folder must not be first on sys.path; keep it last for llm8_data.
_HERE = os.path.dirname(os.path.abspath(__file__))
if sys.path and os.path.abspath(sys.path[0] or os.curdir) == _HERE:
    sys.path.append(sys.path.pop(0))

import argparse  # noqa: E402
import json  # noqa: E402
import multiprocessing  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

import llm8_data  # noqa: E402
from llm8_data import DataError  # noqa: E402

DEFAULT_SHARD_SIZE = 100_000_000   # tokens per shard, as llm.c's fineweb.py
MAX_SHARD_SIZE = 2**31 - 1         # the header's token count is an int32
CHUNKSIZE = 64                     # documents per worker task: amortizes pickling, keeps order
PROGRESS_EVERY_S = 5.0


# ----------------------------------------------------------------------------------------------------
# reading documents (main process)

def decode_utf8(raw, where):
    """Decode bytes as UTF-8 or raise DataError naming `where`."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{where}: not valid UTF-8 ({e.reason} at byte {e.start})") from None


def txt_documents(path, split_paragraphs):
    """Documents of a .txt file: the whole file, or its paragraphs."""
    if split_paragraphs:
        with open(path, "rb") as f:
            lines = (decode_utf8(raw, f"{path}:{n}") for n, raw in enumerate(f, 1))
            yield from llm8_data.split_paragraphs(lines)
    else:
        yield decode_utf8(path.read_bytes(), path).strip()


def jsonl_documents(path, text_key):
    """Documents of a .jsonl file: the `text_key` string of each non-blank line's object."""
    with open(path, "rb") as f:
        for n, raw in enumerate(f, 1):
            where = f"{path}:{n}"
            line = decode_utf8(raw, where)
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{where}: malformed JSON ({e.msg}, column {e.colno})") from None
            if not isinstance(obj, dict):
                raise DataError(f"{where}: expected a JSON object, got {type(obj).__name__}")
            if text_key not in obj:
                raise DataError(f"{where}: no {text_key!r} key (see --text-key)")
            text = obj[text_key]
            if not isinstance(text, str):
                raise DataError(f"{where}: {text_key!r} is {type(text).__name__}, not a string")
            yield text.strip()


def documents(paths, split_paragraphs, text_key):
    """All non-empty documents of the inputs, in order."""
    for path in paths:
        docs = (jsonl_documents(path, text_key) if path.suffix == ".jsonl"
                else txt_documents(path, split_paragraphs))
        yield from (doc for doc in docs if doc)


# ----------------------------------------------------------------------------------------------------
# tokenizing (worker processes, or the main one with --workers 1)

_sp = None
_dtype = None


def init_tokenizer(model_path, dtype):
    """Load the tokenizer into this process (Pool initializer)."""
    global _sp, _dtype
    _sp = llm8_data.load_tokenizer(model_path)
    _dtype = dtype


def encode(text):
    """BOS followed by the token ids of `text`."""
    return np.array([_sp.bos_id()] + _sp.encode(text), dtype=_dtype)


# ----------------------------------------------------------------------------------------------------
# writing shards

class ShardWriter:
    """Cuts a stream of token arrays into shards of exactly `shard_size` tokens (the last may be
    shorter) named {prefix}_{split}_{index:06d}.bin in `out_dir`."""

    def __init__(self, out_dir, prefix, split, shard_size, version):
        self.out_dir, self.prefix, self.split = out_dir, prefix, split
        self.shard_size, self.version = shard_size, version
        self.parts, self.count, self.index, self.tokens = [], 0, 0, 0

    def add(self, ids):
        while ids.size:
            take = min(self.shard_size - self.count, ids.size)
            self.parts.append(ids[:take])
            self.count += take
            ids = ids[take:]
            if self.count == self.shard_size:
                self.flush()

    def flush(self):
        if self.count == 0:
            return
        path = self.out_dir / f"{self.prefix}_{self.split}_{self.index:06d}.bin"
        llm8_data.write_shard(path, np.concatenate(self.parts), self.version)
        print(f"wrote {path.name} ({self.count:,} tokens)", file=sys.stderr)
        self.tokens += self.count
        self.parts, self.count, self.index = [], 0, self.index + 1


def publish(work_dir, out_dir, prefix):
    """Move every file of the finished run in `work_dir` into `out_dir`, then delete the {prefix} shards
    there that the run did not write (left by an earlier, larger run: a glob would pick them up)."""
    pattern = re.compile(rf"{re.escape(prefix)}_(train|val)_\d{{6}}\.bin")
    names = sorted(path.name for path in work_dir.iterdir())
    for name in names:
        os.replace(work_dir / name, out_dir / name)
    for path in sorted(out_dir.iterdir()):
        if pattern.fullmatch(path.name) and path.name not in names:
            print(f"removing stale shard {path}", file=sys.stderr)
            path.unlink()
    print(f"moved {len(names)} files into {out_dir}", file=sys.stderr)


# ----------------------------------------------------------------------------------------------------

def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.strip(),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("inputs", nargs="+", type=Path, help=".txt and/or .jsonl files")
    parser.add_argument("--tokenizer", type=Path,
                        help="SentencePiece .model (default: the Llama-2 tokenizer, found through "
                        f"${llm8_data.DATA_DIR_ENV} or ../shared/data, else downloaded)")
    parser.add_argument("--out-dir", type=Path, required=True, help="folder for shards and tokenizer.bin")
    parser.add_argument("--prefix", default="data", help="shard name prefix (default: %(default)s)")
    parser.add_argument("--shard-size", type=int, default=DEFAULT_SHARD_SIZE,
                        help="tokens per shard (default: %(default)s)")
    parser.add_argument("--val-docs", type=int, default=0,
                        help="the first N documents form the validation split {prefix}_val_*.bin "
                        "(default: 0 = no validation split; how many to hold out depends on the corpus)")
    parser.add_argument("--split-paragraphs", action="store_true",
                        help=".txt files: one document per paragraph (blank-line separated) "
                        "instead of one per file")
    parser.add_argument("--text-key", default="text", help=".jsonl: key of the document text "
                        "(default: %(default)s)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                        help="tokenizer processes (default: all CPUs, %(default)s)")
    args = parser.parse_args()
    if not 1 <= args.shard_size <= MAX_SHARD_SIZE:
        parser.error(f"--shard-size must be in [1, {MAX_SHARD_SIZE}]")
    if args.val_docs < 0:
        parser.error("--val-docs must be >= 0")
    if args.workers < 1:
        parser.error("--workers must be >= 1")
    if not args.prefix or os.sep in args.prefix or "/" in args.prefix:
        parser.error("--prefix must be a non-empty file name part")
    return args


def run(args, work_dir):
    """Tokenize the inputs into shards and tokenizer.bin, all written into `work_dir`."""
    for path in args.inputs:
        if path.suffix not in (".txt", ".jsonl"):
            raise DataError(f"{path}: unsupported input type (expected .txt or .jsonl)")
        if not path.is_file():
            raise DataError(f"input file not found: {path}")
    model_path = args.tokenizer or llm8_data.resolve_data_file("tokenizer")
    sp = llm8_data.load_tokenizer(model_path)
    vocab_size = sp.get_piece_size()
    version = 1 if vocab_size <= 2**16 else 2
    dtype = llm8_data.SHARD_TOKEN_DTYPES[version]
    val = ShardWriter(work_dir, args.prefix, "val", args.shard_size, version)
    train = ShardWriter(work_dir, args.prefix, "train", args.shard_size, version)
    if args.val_docs == 0:
        print("no validation split (--val-docs 0)", file=sys.stderr)

    docs = documents(args.inputs, args.split_paragraphs, args.text_key)
    pool = None
    if args.workers == 1:
        init_tokenizer(model_path, dtype)
        encoded = map(encode, docs)
    else:
        pool = multiprocessing.Pool(args.workers, init_tokenizer, (model_path, dtype))
        encoded = pool.imap(encode, docs, chunksize=CHUNKSIZE)
    n_docs, n_tokens, t0, last = 0, 0, time.time(), time.time()
    try:
        for ids in encoded:
            (val if n_docs < args.val_docs else train).add(ids)
            n_docs += 1
            n_tokens += ids.size
            if time.time() - last > PROGRESS_EVERY_S:
                last = time.time()
                print(f"{n_docs:,} documents, {n_tokens:,} tokens, "
                      f"{n_tokens / (last - t0):,.0f} tokens/s", file=sys.stderr)
    finally:
        if pool is not None:
            pool.terminate()
    if n_docs <= args.val_docs:
        raise DataError(f"the inputs hold {n_docs} documents: none left for training after "
                        f"--val-docs {args.val_docs}")
    val.flush()
    train.flush()
    llm8_data.export_tokenizer(model_path, work_dir / "tokenizer.bin")
    print(f"{n_docs:,} documents in {time.time() - t0:.1f} s: val {args.val_docs:,} documents, "
          f"{val.tokens:,} tokens in {val.index} shards; train {n_docs - args.val_docs:,} documents, "
          f"{train.tokens:,} tokens in {train.index} shards", file=sys.stderr)


def main():
    args = parse_args()
    created = not args.out_dir.exists()
    work_dir = None
    try:
        args.out_dir.mkdir(parents=True, exist_ok=True)
        # Inside --out-dir, so that publishing is a rename on one file system; hidden from shard globs.
        work_dir = Path(tempfile.mkdtemp(prefix=f".{args.prefix}.tmp-", dir=args.out_dir))
        run(args, work_dir)
        publish(work_dir, args.out_dir, args.prefix)
    except (DataError, OSError, ValueError) as e:
        sys.exit(f"{os.path.basename(sys.argv[0])}: error: {e}")
    finally:
        # On failure (an error, Ctrl-C) this drops the partial run; the previous data set is untouched.
        if work_dir is not None:
            shutil.rmtree(work_dir, ignore_errors=True)
        if created and args.out_dir.is_dir() and not any(args.out_dir.iterdir()):
            args.out_dir.rmdir()


if __name__ == "__main__":
    main()
