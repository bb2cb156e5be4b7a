"""
Tokenize text corpora into llm.c token shards with a SentencePiece tokenizer (Llama-2's by default).

Inputs (read by llm8_corpus.py): .txt, .jsonl, .jsonl.gz, .jsonl.zst (and .txt.gz, .txt.zst) and .parquet
files, directories and globs, in the order given; or, with --mix, named sources interleaved by token
weight. Each document is normalised (llm8_data.normalize_text), stripped of surrounding whitespace,
dropped when empty, and starts with BOS. A document goes to the validation split when a hash of its text
keyed by --seed is below a threshold (--val-fraction; --val-docs N takes the N smallest hashes, found in a
first pass), so a text that occurs twice is in one split only. Each split is cut into
{prefix}_{split}_{index:06d}.bin shards of exactly --shard-size tokens but the last (documents straddle
shards, as in llm.c); beside them go tokenizer.bin and manifest.json (docs/formats.md). Output
is the same for any --workers.

Interruption and resume. A run works in {out-dir}/.{prefix}.work, which shard globs do not see. Shards
grow there by appending; whenever one is complete, the open shards are fsynced and journal.json is
replaced atomically: the settings, the inputs, for each source the position after its last document, the
counts, the complete shards and how many tokens of each open one count. A run that finds a journal with
the same settings, and unchanged the inputs it had read from, continues it: open shards are cut back to
the journal's length, shards begun later are deleted, and each source resumes after its last document,
so the result equals an uninterrupted run. Otherwise it starts over. Only when every shard is complete
are the shards and tokenizer.bin moved into --out-dir, then any stale {prefix} shards removed, then
manifest.json moved in last (the previous one is removed first): a folder without a manifest is being
published or was written by an older version. A failed or interrupted run leaves the published data set
as it was and keeps its work folder for the next run; delete the folder to drop that work.
"""
import os
import sys

# This file shares its name with the standard library's `tokenize` (imported by linecache, traceback,
# multiprocessing...), so its folder must not be first on sys.path; keep it last for llm8_data.
_HERE = os.path.dirname(os.path.abspath(__file__))
if sys.path and os.path.abspath(sys.path[0] or os.curdir) == _HERE:
    sys.path.append(sys.path.pop(0))

import argparse  # noqa: E402
import collections  # noqa: E402
import concurrent.futures  # noqa: E402
import copy  # noqa: E402
import fcntl  # noqa: E402
import hashlib  # noqa: E402
import heapq  # noqa: E402
import itertools  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import multiprocessing  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from concurrent.futures.process import BrokenProcessPool  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

import llm8_corpus  # noqa: E402
import llm8_data  # noqa: E402
from llm8_data import DataError  # noqa: E402

DEFAULT_SHARD_SIZE = 100_000_000   # tokens per shard, as llm.c's fineweb.py
MAX_SHARD_SIZE = 2**31 - 1         # the header's token count is an int32
JOURNAL_VERSION = 1                # a journal of another version is not resumed
MANIFEST_VERSION = 1
SPLITS = ("val", "train")
ALL_INPUTS = "all"                 # the name of the one source without --mix
SPLIT_HASH = b"llm8 split"         # blake2b personalisations: the split and the mixture draw
MIX_HASH = b"llm8 mix"             # independent numbers from one seed
WRITE_BUFFER = 1 << 20
DEFAULT_PROGRESS_S = 5.0
PARENT_POLL_S = 1.0


def seeded_hash(data, seed, person):
    """A uniform 64-bit number from `data` and `seed`: blake2b keyed by the seed (8 bytes,
    little-endian), personalised by `person`, the first 8 digest bytes read little-endian."""
    digest = hashlib.blake2b(data, digest_size=8, key=seed.to_bytes(8, "little"), person=person).digest()
    return int.from_bytes(digest, "little")


# ----------------------------------------------------------------------------------------------------
# parsing and tokenizing (worker processes, or the main one with --workers 1)

_worker = {}


def load_worker(model_path, dtype, text_key, seed):
    """Load what encode_chunk needs into this process."""
    _worker.update(sp=llm8_data.load_tokenizer(model_path), dtype=dtype, text_key=text_key, seed=seed)


def init_pool_worker(parent, *args):
    # Ctrl-C (and a scheduler's SIGTERM) reach the whole process group; the main process handles them,
    # saying so, and the workers end with it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # A worker waits on its task queue forever once the main process is killed (SIGKILL, OOM), since
    # its siblings hold the queue open too: leave when the parent is gone.
    threading.Thread(target=exit_without_parent, args=(parent,), daemon=True).start()
    load_worker(*args)


def exit_without_parent(parent):
    while os.getppid() == parent:
        time.sleep(PARENT_POLL_S)
    os._exit(1)


@dataclass
class Encoded:
    """A chunk's documents: document i is tokens[offsets[i]:offsets[i + 1]], BOS first, ends at record
    ends[i] of its file and has split hash hashes[i]; error: why the chunk stopped early (None: it did not)."""
    tokens: np.ndarray
    offsets: np.ndarray
    ends: list
    hashes: list
    error: str


def encode_chunk(chunk, tokenize=True):
    """Parse, hash and (unless `tokenize` is False: the --val-docs pass) tokenize one llm8_corpus.Chunk."""
    docs, ends, error = llm8_corpus.parse(chunk, _worker["text_key"])
    sp, dtype = _worker["sp"], _worker["dtype"]
    hashes = [seeded_hash(doc.encode("utf-8"), _worker["seed"], SPLIT_HASH) for doc in docs]
    ids = sp.encode(docs) if tokenize else [[] for _ in docs]
    offsets = np.zeros(len(ids) + 1, np.int64)
    np.cumsum([len(x) + 1 for x in ids], out=offsets[1:])
    tokens = np.empty(int(offsets[-1]), dtype)
    is_bos = np.zeros(tokens.size, bool)
    is_bos[offsets[:-1]] = True
    tokens[is_bos] = sp.bos_id()
    tokens[~is_bos] = np.fromiter(itertools.chain.from_iterable(ids), dtype, tokens.size - len(ids))
    return Encoded(tokens, offsets, ends, hashes, error)


class InlineExecutor:
    """concurrent.futures' executor interface, run at once in this process (--workers 1)."""

    def submit(self, fn, *args):
        future = concurrent.futures.Future()
        future.set_result(fn(*args))
        return future

    def shutdown(self, wait=True, cancel_futures=False):
        pass


# ----------------------------------------------------------------------------------------------------
# reading sources (main process)

class Source:
    """One stream of documents (all inputs, or one --mix source) in input order. The main process reads
    chunks, the workers parse and tokenize up to `ahead` of them at a time, and results are taken in
    order, so the stream is the same for any number of workers. `state` (this source's journal entry) and
    `inputs` (its files' entries) are kept up to date as documents are taken."""

    def __init__(self, state, inputs, executor, ahead, args, tokenize=True):
        self.state, self.inputs = state, inputs
        self.executor, self.ahead, self.tokenize = executor, ahead, tokenize
        self.chunks = llm8_corpus.chunks([i["path"] for i in inputs], (state["file"], state["record"]),
                                         args.split_paragraphs, args.text_key)
        self.pending = collections.deque()
        self.chunk, self.encoded, self.next = None, None, 0
        self.file_starts = np.cumsum([0] + [i["bytes"] for i in inputs]).tolist()
        self.total_bytes = self.file_starts[-1]
        self.bytes_read = self.file_starts[state["file"]]

    def next_document(self):
        """(tokens, split hash, the input entry of its file) of the next document, or None at the end;
        raises DataError when the input is bad there."""
        while self.encoded is None or self.next == len(self.encoded.ends):
            if self.encoded is not None:
                self._chunk_done()
            while len(self.pending) < self.ahead and (chunk := next(self.chunks, None)) is not None:
                self.pending.append((chunk, self.executor.submit(encode_chunk, chunk, self.tokenize)))
            if not self.pending:
                self.encoded = None
                return None
            self.chunk, future = self.pending.popleft()
            self.encoded, self.next = future.result(), 0
        e, i = self.encoded, self.next
        self.next += 1
        self.state["file"], self.state["record"] = self.chunk.file_index, e.ends[i]
        return e.tokens[e.offsets[i]:e.offsets[i + 1]], e.hashes[i], self.inputs[self.chunk.file_index]

    def _chunk_done(self):
        chunk = self.chunk
        if self.encoded.error:
            raise DataError(self.encoded.error)
        if chunk.sha256 is None:
            self.state["file"], self.state["record"] = chunk.file_index, chunk.end
            self.bytes_read = self.file_starts[chunk.file_index] + chunk.raw_bytes
        else:                   # the file's last chunk
            self.inputs[chunk.file_index]["sha256"] = chunk.sha256
            self.state["file"], self.state["record"] = chunk.file_index + 1, 0
            self.bytes_read = self.file_starts[chunk.file_index + 1]


def make_sources(state, executor, ahead, args, tokenize=True):
    return [Source(src, state["inputs"][slice(*src["inputs"])], executor, ahead, args, tokenize)
            for src in state["sources"]]


def pick_source(weights, tokens, step, seed):
    """The index of the source of the next document. Only a source whose share of the tokens so far is
    at most its weight may be picked, so each stays within a few documents' tokens of its weight (the
    realised proportions converge as 1/total); among those, one is drawn with probability proportional to
    its weight from a number keyed by (seed, step), so the order is reproducible by seed."""
    total, weight_sum = sum(tokens), sum(weights)
    eligible = [s for s, w in enumerate(weights) if tokens[s] * weight_sum <= w * total]
    if not eligible:            # rounding of the products only
        eligible = [min(range(len(weights)), key=lambda s: tokens[s] / weights[s])]
    if len(eligible) == 1:
        return eligible[0]
    u = seeded_hash(step.to_bytes(8, "little"), seed, MIX_HASH) / 2**64 * sum(weights[s] for s in eligible)
    for s in eligible:
        u -= weights[s]
        if u < 0:
            return s
    return eligible[-1]


def draw_val_threshold(sources, n):
    """The split hash below which the `n` documents of smallest hash fall (more only where texts repeat):
    a pass over every input that parses and hashes but does not tokenize."""
    largest_kept, count = [], 0     # the n smallest hashes, negated: a max-heap
    for source in sources:
        while (doc := source.next_document()) is not None:
            count += 1
            if len(largest_kept) < n:
                heapq.heappush(largest_kept, -doc[1])
            elif doc[1] < -largest_kept[0]:
                heapq.heapreplace(largest_kept, -doc[1])
    if count <= n:
        raise DataError(f"the inputs hold {count} documents: none left for training after --val-docs {n}")
    return 1 - largest_kept[0]


# ----------------------------------------------------------------------------------------------------
# writing shards and the journal

class ShardWriter:
    """Appends one split's tokens to shards of exactly `shard_size` tokens (the last may be shorter)
    named {prefix}_{split}_{index:06d}.bin in the work folder, so memory does not grow with the shard.
    A shard's header gets its count when the shard is complete. `state` (the split's journal entry) lists
    the complete shards and `open_tokens`, the tokens of the open shard; on a resume, the open shard is
    cut back to that and any later shard deleted."""

    def __init__(self, folder, prefix, split, shard_size, version, state):
        self.folder, self.prefix, self.split, self.shard_size = folder, prefix, split, shard_size
        self.version, self.state, self.file = version, state, None
        index = len(state["shards"])
        pattern = re.compile(rf"{re.escape(prefix)}_{split}_(\d{{6}})\.bin")
        for path in folder.iterdir():
            m = pattern.fullmatch(path.name)
            if m and (int(m[1]) > index or (int(m[1]) == index and not state["open_tokens"])):
                path.unlink()
        if state["open_tokens"]:
            self.file = open(self.path(index), "r+b", buffering=WRITE_BUFFER)
            self.file.truncate(shard_bytes(state["open_tokens"], version))
            self.file.seek(0, os.SEEK_END)

    def path(self, index):
        return self.folder / shard_name(self.prefix, self.split, index)

    def add(self, ids):
        """Append a document's tokens; returns the journal entries of the shards this completed."""
        done = []
        while ids.size:
            if self.file is None:
                self.file = open(self.path(len(self.state["shards"])), "wb", buffering=WRITE_BUFFER)
                self.file.write(bytes(llm8_data.HEADER_BYTES))
            take = min(self.shard_size - self.state["open_tokens"], ids.size)
            self.file.write(ids[:take])
            self.state["open_tokens"] += take
            ids = ids[take:]
            if self.state["open_tokens"] == self.shard_size:
                done.append(self._complete())
        return done

    def _complete(self):
        count, path = self.state["open_tokens"], self.path(len(self.state["shards"]))
        self.file.seek(0)
        self.file.write(llm8_data.shard_header(count, self.version))
        self.sync()
        self.file.close()
        self.file = None
        self.state["shards"].append({"file": path.name, "tokens": count, "sha256": llm8_data.sha256_of(path)})
        self.state["open_tokens"] = 0
        return self.state["shards"][-1]

    def sync(self):
        if self.file is not None:
            self.file.flush()
            os.fsync(self.file.fileno())

    def close(self):
        """Complete the open shard; returns its journal entry in a list (empty when there is none)."""
        return [self._complete()] if self.file is not None else []


def shard_name(prefix, split, index):
    return f"{prefix}_{split}_{index:06d}.bin"


def shard_bytes(tokens, version):
    return llm8_data.HEADER_BYTES + tokens * llm8_data.SHARD_TOKEN_DTYPES[version].itemsize


def check_shard_files(folder, state):
    """Why the shard files in the work folder disagree with the journal `state`, or None."""
    settings = state["settings"]
    for split in SPLITS:
        split_state = state["splits"][split]
        for shard in split_state["shards"]:
            path = folder / shard["file"]
            size = shard_bytes(shard["tokens"], settings["shard_version"])
            if not path.is_file() or path.stat().st_size != size:
                return f"{path.name} is missing or has another size"
        path = folder / shard_name(settings["prefix"], split, len(split_state["shards"]))
        open_bytes = shard_bytes(split_state["open_tokens"], settings["shard_version"])
        if split_state["open_tokens"] and (not path.is_file() or path.stat().st_size < open_bytes):
            return f"{path.name} is shorter than the journal says"
    return None


class WorkFolder:
    """{out_dir}/.{prefix}.work: the shards of a run in progress and its journal; locked (flock) while
    a run uses it, so two runs cannot write one data set."""

    def __init__(self, out_dir, prefix):
        self.path = out_dir / f".{prefix}.work"
        self.path.mkdir(exist_ok=True)
        self.lock = open(self.path / "lock", "w")
        try:
            fcntl.flock(self.lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise DataError(f"another run is writing {self.path} (its lock is held)") from None
        self.journal = self.path / "journal.json"

    def load(self):
        try:
            return json.loads(self.journal.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None

    def save(self, state):
        llm8_data.write_json(self.journal, state)

    def clear(self):
        for path in self.path.iterdir():
            if path.is_dir():
                shutil.rmtree(path)
            elif path.name != "lock":
                path.unlink()

    def remove(self):
        shutil.rmtree(self.path)
        self.lock.close()


def fresh_state(settings, inputs, sources):
    """The journal of a run that has done nothing yet."""
    firsts = np.cumsum([0] + [len(files) for _, _, files in sources]).tolist()
    return {
        "settings": settings,
        "inputs": [dict(entry, sha256=None, documents=0, tokens=0) for entry in inputs],
        "sources": [{"name": name, "weight": weight, "inputs": [firsts[s], firsts[s + 1]], "file": 0,
                     "record": 0, "documents": 0, "tokens": 0, "exhausted": False}
                    for s, (name, weight, _) in enumerate(sources)],
        "mix_step": 0,
        "val_threshold": None,
        "splits": {split: {"shards": [], "open_tokens": 0, "documents": 0, "tokens": 0} for split in SPLITS},
        "finished": False,
    }


def why_not_resume(old, settings, inputs, folder):
    """Why the journal `old` cannot be continued with these settings and inputs, or None."""
    if old.get("settings") != settings:
        was = old.get("settings", {})
        return f"other settings ({', '.join(sorted(k for k in settings if was.get(k) != settings[k]))})"
    if [(i["source"], i["path"]) for i in old["inputs"]] != [(i["source"], i["path"]) for i in inputs]:
        return "other inputs"
    for k, (was, now) in enumerate(zip(old["inputs"], inputs)):
        src = next(s for s in old["sources"] if s["inputs"][0] <= k < s["inputs"][1])
        local = k - src["inputs"][0]
        was_read = local < src["file"] or (local == src["file"] and src["record"] > 0)
        changed = (was["bytes"], was["mtime_ns"]) != (now["bytes"], now["mtime_ns"])
        if changed and (was_read or settings["val_docs"]):      # the --val-docs draw read every input
            return f"{now['path']} changed"
    return check_shard_files(folder, old)


# ----------------------------------------------------------------------------------------------------
# the run

class Progress:
    """Prints a progress line every `every` seconds: documents, tokens, tokens/s, input MB/s and the ETA
    from the input bytes read (for a mixture, by the source that runs out first, which ends it)."""

    def __init__(self, every, sources, state):
        self.every, self.sources, self.state = every, sources, state
        self.t0 = self.last = time.time()
        self.start = (self.bytes(), self.fraction(), self.totals()[1])

    def bytes(self):
        return sum(s.bytes_read for s in self.sources)

    def fraction(self):
        return max(s.bytes_read / max(1, s.total_bytes) for s in self.sources)

    def totals(self):
        return [sum(self.state["splits"][split][key] for split in SPLITS) for key in ("documents", "tokens")]

    def update(self):
        now = time.time()
        if now - self.last < self.every:
            return
        self.last, elapsed = now, max(now - self.t0, 1e-9)
        (docs, tokens), fraction = self.totals(), self.fraction()
        done = fraction - self.start[1]
        eta = time.strftime("%H:%M:%S", time.gmtime(elapsed * (1 - fraction) / done)) if done > 0 else "?"
        print(f"{docs:,} documents, {tokens:,} tokens, {(tokens - self.start[2]) / elapsed:,.0f} tokens/s, "
              f"{(self.bytes() - self.start[0]) / elapsed / 1e6:.1f} MB/s of input ({100 * fraction:.1f}%), "
              f"ETA {eta}", file=sys.stderr)


def tokenize(args, state, work, executor, sp):
    """Tokenize the sources into the work folder, continuing `state`, checkpointing after every shard."""
    settings = state["settings"]
    ahead = 1 if args.workers == 1 else 2 * args.workers     # enough to keep every worker busy
    if settings["val_docs"] and state["val_threshold"] is None:
        print(f"drawing {settings['val_docs']:,} validation documents: a first pass over the inputs",
              file=sys.stderr)
        scratch = copy.deepcopy(state)
        state["val_threshold"] = draw_val_threshold(make_sources(scratch, executor, ahead, args, False),
                                                    settings["val_docs"])
        work.save(state)
    threshold = state["val_threshold"] or int(settings["val_fraction"] * 2**64)
    writers = {split: ShardWriter(work.path, settings["prefix"], split, settings["shard_size"],
                                  settings["shard_version"], state["splits"][split]) for split in SPLITS}
    sources = make_sources(state, executor, ahead, args)
    weights = [src["weight"] for src in state["sources"]]
    progress = Progress(args.progress_every, sources, state)

    def checkpoint(done):
        for writer in writers.values():
            writer.sync()
        work.save(state)
        for shard in done:      # only now, with the journal saved, is a shard done for a resumed run
            print(f"wrote {shard['file']} ({shard['tokens']:,} tokens)", file=sys.stderr)

    while True:
        index = pick_source(weights, [src["tokens"] for src in state["sources"]], state["mix_step"],
                            settings["seed"])
        doc = sources[index].next_document()
        if doc is None:             # the first source to run out ends a mixture
            state["sources"][index]["exhausted"] = True
            break
        tokens, split_hash, input_entry = doc
        split = "val" if split_hash < threshold else "train"
        done = writers[split].add(tokens)
        for counts in (state["sources"][index], state["splits"][split], input_entry):
            counts["documents"] += 1
            counts["tokens"] += int(tokens.size)
        state["mix_step"] += 1
        if done:
            checkpoint(done)
        progress.update()
    checkpoint([shard for writer in writers.values() for shard in writer.close()])


def finish(state, work, model_path, sp, elapsed):
    """Check the splits, then write tokenizer.bin and manifest.json into the work folder."""
    settings, splits = state["settings"], state["splits"]
    if (settings["val_docs"] or settings["val_fraction"]) and not splits["val"]["documents"]:
        raise DataError(f"--val-fraction {settings['val_fraction']} drew no document of "
                        f"{splits['train']['documents']}: raise it")
    if not splits["train"]["documents"]:
        raise DataError(f"the inputs hold {splits['val']['documents']} documents: none left for training")
    for entry in state["inputs"]:   # files a mixture ended in, before reading them to the end
        if entry["documents"] and entry["sha256"] is None:
            entry["sha256"] = llm8_data.sha256_of(entry["path"])
    llm8_data.export_tokenizer(model_path, work.path / "tokenizer.bin")
    llm8_data.write_json(work.path / "manifest.json", manifest(state, sp))
    state["finished"] = True
    work.save(state)
    docs, tokens = (sum(splits[split][key] for split in SPLITS) for key in ("documents", "tokens"))
    print(f"{docs:,} documents, {tokens:,} tokens in {elapsed:.1f} s: " + "; ".join(
        f"{split} {splits[split]['documents']:,} documents, {splits[split]['tokens']:,} tokens in "
        f"{len(splits[split]['shards'])} shard{'' if len(splits[split]['shards']) == 1 else 's'}"
        for split in SPLITS), file=sys.stderr)
    if len(state["sources"]) > 1:
        for src in state["sources"]:
            print(f"source {src['name']}: weight {src['weight']:.4f}, realised {src['tokens'] / tokens:.4f}, "
                  f"{src['documents']:,} documents" + (" (ran out: the mixture ends here)"
                                                       if src["exhausted"] else ""), file=sys.stderr)


def manifest(state, sp):
    """The data set's description (docs/formats.md: manifest.json)."""
    settings, splits = state["settings"], state["splits"]
    tokens = sum(splits[split]["tokens"] for split in SPLITS)
    return {
        "format": "llm8 shards",
        "version": MANIFEST_VERSION,
        "prefix": settings["prefix"],
        "shard_version": settings["shard_version"],
        "shard_size": settings["shard_size"],
        "vocab_size": sp.get_piece_size(),
        "bos_id": sp.bos_id(),
        "tokenizer_sha256": settings["tokenizer_sha256"],
        "seed": settings["seed"],
        "val_docs": settings["val_docs"],
        "val_fraction": settings["val_fraction"],
        "split_paragraphs": settings["split_paragraphs"],
        "text_key": settings["text_key"],
        "documents": sum(splits[split]["documents"] for split in SPLITS),
        "tokens": tokens,
        "splits": {split: {"documents": splits[split]["documents"], "tokens": splits[split]["tokens"],
                           "shards": len(splits[split]["shards"])} for split in SPLITS},
        "shards": [{"file": shard["file"], "split": split, "tokens": shard["tokens"], "sha256": shard["sha256"]}
                   for split in SPLITS for shard in splits[split]["shards"]],
        "sources": [{"name": src["name"], "weight": src["weight"], "documents": src["documents"],
                     "tokens": src["tokens"], "proportion": round(src["tokens"] / tokens, 6),
                     "exhausted": src["exhausted"]} for src in state["sources"]],
        "inputs": [{key: entry[key] for key in ("path", "source", "bytes", "sha256", "documents", "tokens")}
                   for entry in state["inputs"]],
    }


def publish(work, out_dir, state):
    """Move the finished data set from the work folder into `out_dir` (see the module's docstring); a
    publish cut short is completed by the next run, which finds the journal finished."""
    manifest_path = work.path / "manifest.json"
    if not manifest_path.exists():          # moved last: the rest was moved before it
        return
    prefix = state["settings"]["prefix"]
    names = [shard["file"] for split in SPLITS for shard in state["splits"][split]["shards"]]
    names.append("tokenizer.bin")
    (out_dir / "manifest.json").unlink(missing_ok=True)
    for name in names:
        if (work.path / name).exists():
            os.replace(work.path / name, out_dir / name)
    pattern = re.compile(rf"{re.escape(prefix)}_(train|val)_\d{{6}}\.bin")
    for path in sorted(out_dir.iterdir()):
        if pattern.fullmatch(path.name) and path.name not in names:
            print(f"removing stale shard {path}", file=sys.stderr)
            path.unlink()
    os.replace(manifest_path, out_dir / "manifest.json")
    llm8_data.fsync_dir(out_dir)
    print(f"moved {len(names) + 1} files into {out_dir}", file=sys.stderr)


def start_state(work, settings, inputs, sources):
    """The journal in the work folder when its run can be continued, else a fresh state (the folder
    emptied)."""
    old = work.load()
    if old is not None:
        why = why_not_resume(old, settings, inputs, work.path)
        if why is None:
            for was, now in zip(old["inputs"], inputs):     # inputs not read yet may have changed
                was.update(bytes=now["bytes"], mtime_ns=now["mtime_ns"])
            done = sum(len(old["splits"][split]["shards"]) for split in SPLITS)
            docs = sum(old["splits"][split]["documents"] for split in SPLITS)
            print(f"resuming the interrupted run in {work.path}: {done} shards complete, "
                  f"{docs:,} documents done", file=sys.stderr)
            return old
        print(f"not resuming the run in {work.path}: {why}; starting over", file=sys.stderr)
    work.clear()
    state = fresh_state(settings, inputs, sources)
    work.save(state)
    return state


def check_out_dir(out_dir, prefix):
    """One data set per folder: manifest.json and tokenizer.bin describe all its shards."""
    path = out_dir / "manifest.json"
    if not path.exists():
        return
    try:
        other = json.loads(path.read_text(encoding="utf-8")).get("prefix")
    except (OSError, ValueError, AttributeError) as e:
        raise DataError(f"{path}: unreadable ({llm8_corpus.one_line(e)}); move it away or use another "
                        "--out-dir") from None
    if other != prefix:
        raise DataError(f"{out_dir} holds the data set {other!r} (manifest.json): use --prefix {other} "
                        "to replace it, or another --out-dir")


def make_executor(args, model_path, dtype):
    if args.workers == 1:
        load_worker(model_path, dtype, args.text_key, args.seed)
        return InlineExecutor()
    executor = concurrent.futures.ProcessPoolExecutor(
        args.workers, mp_context=multiprocessing.get_context("fork"), initializer=init_pool_worker,
        initargs=(os.getpid(), model_path, dtype, args.text_key, args.seed))
    # Fork every worker now, before pyarrow starts threads in this process.
    executor.submit(int).result()
    return executor


def run(args):
    if args.mix:
        sources = [(name, weight, llm8_corpus.expand_inputs([pattern])) for name, weight, pattern in args.mix]
        llm8_corpus.expand_inputs([p for _, _, files in sources for p in files])   # a file in two sources
    else:
        sources = [(ALL_INPUTS, 1.0, llm8_corpus.expand_inputs(args.inputs))]
    model_path = args.tokenizer or llm8_data.resolve_data_file("tokenizer")
    sp = llm8_data.load_tokenizer(model_path)
    version = llm8_data.shard_version_for(sp.get_piece_size() - 1)
    dtype = llm8_data.SHARD_TOKEN_DTYPES[version]
    weight_sum = sum(weight for _, weight, _ in sources)
    sources = [(name, round(weight / weight_sum, 12), files) for name, weight, files in sources]
    settings = {
        "journal": JOURNAL_VERSION, "prefix": args.prefix, "shard_size": args.shard_size,
        "shard_version": version, "tokenizer_sha256": llm8_data.sha256_of(model_path), "seed": args.seed,
        "val_docs": args.val_docs, "val_fraction": args.val_fraction,
        "split_paragraphs": args.split_paragraphs, "text_key": args.text_key,
        "sources": [[name, weight] for name, weight, _ in sources],
    }
    inputs = [{"path": str(p), "source": name, "bytes": p.stat().st_size, "mtime_ns": p.stat().st_mtime_ns}
              for name, _, files in sources for p in files]
    check_out_dir(args.out_dir, args.prefix)
    if not settings["val_docs"] and not settings["val_fraction"]:
        print("no validation split (--val-docs 0, --val-fraction 0)", file=sys.stderr)
    t0 = time.time()
    executor = make_executor(args, model_path, dtype)
    try:
        for _, _, files in sources:
            for path in files:
                llm8_corpus.check_input(path, args.text_key)
        args.out_dir.mkdir(parents=True, exist_ok=True)
        work = WorkFolder(args.out_dir, args.prefix)
        state = start_state(work, settings, inputs, sources)
        if not state["finished"]:
            tokenize(args, state, work, executor, sp)
            finish(state, work, model_path, sp, time.time() - t0)
    except BrokenProcessPool:
        raise DataError("a tokenizer process died (out of memory?); run again to resume") from None
    finally:
        # wait=True: the chunks in flight (a few MiB) finish first. With wait=False the executor's manager
        # thread may close its wake-up pipe while the interpreter's exit hook writes to it: a race that
        # CPython 3.11 leaves unlocked (a lock came with gh-125451) and that prints "OSError: [Errno 9]
        # Bad file descriptor" after our one error line.
        executor.shutdown(wait=True, cancel_futures=True)
    publish(work, args.out_dir, state)
    work.remove()


# ----------------------------------------------------------------------------------------------------

def parse_mix(spec):
    """NAME=WEIGHT:PATTERN -> (name, weight, pattern)."""
    m = re.fullmatch(r"([A-Za-z0-9_.-]+)=([^:]+):(.+)", spec)
    try:
        weight = float(m[2]) if m else math.nan
    except ValueError:
        weight = math.nan
    if not (math.isfinite(weight) and weight > 0):
        raise argparse.ArgumentTypeError(f"{spec!r} is not NAME=WEIGHT:PATTERN with a weight > 0")
    return m[1], weight, m[3]


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.strip(),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("inputs", nargs="*", help="files (.txt, .jsonl, .jsonl.gz, .jsonl.zst, .txt.gz, "
                        ".txt.zst, .parquet), directories or quoted globs")
    parser.add_argument("--mix", nargs="+", action="extend", type=parse_mix, default=[],
                        metavar="NAME=WEIGHT:PATTERN",
                        help="instead of inputs: sources (a file, directory or glob each) interleaved by "
                        "token weight; the mixture ends when its first source runs out")
    parser.add_argument("--tokenizer", type=Path,
                        help="SentencePiece .model (default: the Llama-2 tokenizer, found through "
                        f"${llm8_data.DATA_DIR_ENV} or ../shared/data, else downloaded)")
    parser.add_argument("--out-dir", type=Path, required=True,
                        help="folder for the shards, tokenizer.bin and manifest.json (one data set per folder)")
    parser.add_argument("--prefix", default="data", help="shard name prefix (default: %(default)s)")
    parser.add_argument("--shard-size", type=int, default=DEFAULT_SHARD_SIZE,
                        help="tokens per shard (default: %(default)s)")
    parser.add_argument("--val-docs", type=int, default=0,
                        help="N documents, drawn by --seed from all inputs, form the validation split "
                        "{prefix}_val_*.bin (costs a first pass over the inputs; default: 0)")
    parser.add_argument("--val-fraction", type=float, default=0.0,
                        help="instead of --val-docs: each document is drawn for validation with this "
                        "probability (default: 0)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the validation draw and the mixture's order (default: %(default)s)")
    parser.add_argument("--split-paragraphs", action="store_true",
                        help=".txt files: one document per paragraph (blank-line separated) "
                        "instead of one per file")
    parser.add_argument("--text-key", default="text", help=".jsonl key / .parquet column of the document "
                        "text (default: %(default)s)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                        help="tokenizer processes (default: all CPUs, %(default)s)")
    parser.add_argument("--progress-every", type=float, default=DEFAULT_PROGRESS_S, metavar="SECONDS",
                        help="seconds between progress lines (default: %(default)s)")
    args = parser.parse_args()
    if bool(args.inputs) == bool(args.mix):
        parser.error("give input files or --mix sources (not both)")
    if len({name for name, _, _ in args.mix}) != len(args.mix):
        parser.error("--mix: each source needs its own name")
    if not 1 <= args.shard_size <= MAX_SHARD_SIZE:
        parser.error(f"--shard-size must be in [1, {MAX_SHARD_SIZE}]")
    if args.val_docs < 0:
        parser.error("--val-docs must be >= 0")
    if not 0 <= args.val_fraction < 1:
        parser.error("--val-fraction must be in [0, 1)")
    if args.val_docs and args.val_fraction:
        parser.error("give --val-docs or --val-fraction, not both")
    if args.val_docs and args.mix:
        parser.error("--val-docs needs a first pass that a mixture cannot make (which documents it uses "
                     "depends on their tokens): use --val-fraction")
    if not 0 <= args.seed < 2**64:
        parser.error("--seed must be in [0, 2^64)")
    if args.workers < 1:
        parser.error("--workers must be >= 1")
    if not args.prefix or os.sep in args.prefix or "/" in args.prefix:
        parser.error("--prefix must be a non-empty file name part")
    return args


def main():
    args = parse_args()
    # A scheduler's SIGTERM unwinds like Ctrl-C: the workers are stopped, the work folder kept.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    program = os.path.basename(sys.argv[0])
    try:
        run(args)
    except (DataError, OSError, ValueError) as e:
        sys.exit(f"{program}: error: {llm8_corpus.one_line(e)}")
    except KeyboardInterrupt:
        sys.exit(f"{program}: interrupted; the same command resumes after the last complete shard")


if __name__ == "__main__":
    main()
