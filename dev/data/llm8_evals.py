"""
Shared pieces of the downstream-evaluation data scripts (hellaswag.py, lambada.py, wikitext.py): the two
eval file formats (writer and validating reader of each), the joint tokenization of a context and its
continuation, HellaSwag's and WikiText's text preprocessing, and reading and fetching their inputs.
All integers are little-endian. train/evals.h reads both formats.

Each file is written for one --eval-compat mode (docs/evaluation.md), recorded in its header (0 llm8,
1 harness): harness writes the tokens lm-evaluation-harness (HARNESS_VERSION) scores on an HF Llama-2 with
its default settings, llm8 those of llm8's own rules. The trainer refuses a file of the other mode.

llm.c's eval file (multiple choice; HellaSwag), as llm.c's dev/data/data_common.py write_evalfile:
    header: 256 int32: [0] 20240522 (magic), [1] 1 (version), [2] examples, [3] the longest example's
            bytes, [4] the mode (0 in llm.c's own files), [5] harness: the number of endings in the
            file, the rest 0
    then per example a stream of uint16:
            65535 (start of example), the example's bytes (its whole stream, these two words included),
            its index (0, 1, ... in file order), the label (the correct ending), the number of endings,
            the number of context tokens, the context tokens,
            then per ending: its number of tokens, its tokens
    harness: then one uint16 per ending of the file, in file order: its characters (acc_norm's length)
    Limits: fewer than 65535 examples, token ids below 65535, an example below 65536 bytes, an ending
    below 65536 characters.
    HellaSwag: the context is the preprocessed context (after BOS in llm8 mode), each ending " " + the
    ending, tokenized jointly with it; 4 endings.

llm8's continuation eval file (LAMBADA, WikiText):
    header: 256 int32: [0] 20261202 (magic), [1] 1 (version), [2] kind (1 LAMBADA, 2 WikiText),
            [3] records, [4] the BOS id, [5] the mode, the rest 0
    then per record int32: n_context, n_target, n_words, n_bytes, the n_context context token ids, the
            n_target target token ids
    A record scores its target tokens after its context. LAMBADA: the context is the passage without its
    last word (after BOS in llm8 mode), the target that word (" " + word, tokenized jointly); n_words =
    1, n_bytes = the word's UTF-8 bytes. WikiText: one record per page, n_context = 0 (the scorer puts
    the header's BOS before the first window, in both modes), the target the whole page detokenized by
    the mode's rules; n_words and n_bytes count the original page (lm-evaluation-harness's word and byte
    perplexity). Limits: n_context >= 0,
    n_target >= 1, n_words and n_bytes >= 0, every id (and BOS) below the vocabulary size, fewer than
    2^31 records.

Tokenization, as lm-evaluation-harness's _encode_pair (encode_pair below): the context's ids are
sp.encode(context), the continuation's (it starts with the delimiter space) are those of
sp.encode(context + continuation) after the first len(context ids). harness: spaces that end the context
move to the start of the continuation first, and the stored context is the context's ids (BOS alone for
an empty context); llm8: the context is tokenized as it is, and stored as BOS + its ids.
"""
import argparse
import http.client
import io
import json
import os
import re
import shutil
import sys
import urllib.request
import zipfile
from pathlib import Path

import numpy as np

import llm8_data
from llm8_data import DataError

HEADER_INTS = llm8_data.HEADER_INTS
HEADER_BYTES = llm8_data.HEADER_BYTES

MC_MAGIC = 20240522                # llm.c's eval file
MC_VERSION = 1
MC_START = 65535                   # first uint16 of every example
MC_MAX_EXAMPLES = 65535            # the example index is a uint16 (llm.c asserts fewer than 2^16)
MC_MAX_TOKEN = 65534               # 65535 is the start marker
MC_MAX_EXAMPLE_BYTES = 65535       # the example's byte count is a uint16
MC_PREFIX_WORDS = 6                # start, bytes, index, label, endings, context length

CONT_MAGIC = 20261202              # llm8's continuation eval file
CONT_VERSION = 1
KIND_LAMBADA = 1
KIND_WIKITEXT = 2
KIND_NAMES = {KIND_LAMBADA: "LAMBADA", KIND_WIKITEXT: "WikiText"}
CONT_PREFIX_WORDS = 4              # n_context, n_target, n_words, n_bytes
CONT_MAX_RECORDS = 2**31 - 1
MC_COMPAT_WORD = 4                 # header words of the mode
MC_ENDINGS_WORD = 5
CONT_COMPAT_WORD = 5

COMPATS = {"llm8": 0, "harness": 1}  # --eval-compat: the header value of each mode
DEFAULT_COMPAT = "harness"           # the trainer's default --eval-compat too (train/cli.h)
HARNESS_VERSION = "v0.4.9.1"         # the lm-evaluation-harness release harness mode follows


# ----------------------------------------------------------------------------------------------------
# tokenization

def encode_pair(sp, context_text, continuation_text, compat):
    """(context ids, continuation ids) of `continuation_text` scored after `context_text` under `compat`
    (see the banner): the stored context (BOS + its ids for llm8; for harness its ids, or BOS alone when
    context_text is empty, lm-evaluation-harness's TemplateLM.loglikelihood) and the continuation
    tokenized jointly with it (TemplateLM._encode_pair). Either may come back empty (a harness context of
    only whitespace; a continuation that adds no token): the caller says which example that is."""
    if compat == "harness":
        if context_text == "":
            return [sp.bos_id()], sp.encode(continuation_text)
        kept = context_text.rstrip()
        context_text, continuation_text = kept, context_text[len(kept):] + continuation_text
    ctx_ids, whole = sp.encode([context_text, context_text + continuation_text])
    return ([sp.bos_id()] if compat == "llm8" else []) + ctx_ids, whole[len(ctx_ids):]


# ----------------------------------------------------------------------------------------------------
# text preprocessing

_BRACKETED = re.compile(r"\[.*?\]")


def hellaswag_preprocess(text):
    """lm-evaluation-harness's HellaSwag clean-up of WikiHow's markup: strip, " [title]" -> ". ", every
    [...] tag removed, double spaces made single."""
    text = text.strip().replace(" [title]", ". ")
    return _BRACKETED.sub("", text).replace("  ", " ")


def hellaswag_context(activity_label, ctx_a, ctx_b):
    """The context lm-evaluation-harness scores the endings after: "label: ctx_a Ctx_b", preprocessed
    (str.capitalize: the first letter upper, the rest lower, as the harness does)."""
    return hellaswag_preprocess(activity_label + ": " + ctx_a + " " + ctx_b.capitalize())


# A level-1 WikiText heading line: " = Title = " (a level-2 one is " = = Title = = ").
_LEVEL1_HEADING = re.compile(r" = [^=](?:.*[^=])? = ")

# llm8's rules: WikiText's tokenization artefacts and their undoing, in order (wikitext_detokenize):
_DETOKENIZE_RULES = [
    (re.compile(r" @([-,.])@ "), r"\1"),                  # 2011 @-@ 12, 1 @,@ 000, 1 @.@ 5
    (re.compile(r"=(?: =)+"), lambda m: "=" * (m.group().count("="))),  # " = = Sub = = " -> " == Sub == "
    (re.compile(r" ([,.;:!?]+)(?=\s|$)"), r"\1"),          # "word , word ." -> "word, word."
    (re.compile(r" (n't|'(?:s|re|ve|ll|d|m))\b"), r"\1"),  # "do n't", "John 's", "they 're"
    (re.compile(r"s ' "), "s' "),                         # plural possessive: "players ' "
    (re.compile(r"([(\[]) "), r"\1"),                     # "( word" -> "(word"
    (re.compile(r" ([)\]])"), r"\1"),                     # "word )" -> "word)"
    (re.compile(r'" ([^"\n]*?) "'), r'"\1"'),             # '" quoted "' -> '"quoted"'
    (re.compile(r"^ | $", re.MULTILINE), ""),             # the space that starts and ends every line
]


# harness's rules: lm-evaluation-harness's wikitext_detokenizer (lm_eval/tasks/wikitext/
# preprocess_wikitext.py, HARNESS_VERSION), each step in its order, as (pattern, replacement, regex?): a
# plain pattern is replaced everywhere as it is, a regex one by re.sub. Its second rule matches the
# text "/' 5/" and puts the literal "/'[0-9]/" in its place, as the harness's does.
HARNESS_WIKITEXT_RULES = [
    ("s '", "s'", False),                                  # contractions
    (r"/' [0-9]/", "/'[0-9]/", True),
    (" @-@ ", "-", False),                                 # number separators
    (" @,@ ", ",", False),
    (" @.@ ", ".", False),
    (" : ", ": ", False),                                  # punctuation
    (" ; ", "; ", False),
    (" . ", ". ", False),
    (" ! ", "! ", False),
    (" ? ", "? ", False),
    (" , ", ", ", False),
    (r"\(\s*([^\)]*?)\s*\)", r"(\1)", True),               # brackets and quotes: no space inside
    (r"\[\s*([^\]]*?)\s*\]", r"[\1]", True),
    (r"{\s*([^}]*?)\s*}", r"{\1}", True),
    (r'"\s*([^"]*?)\s*"', r'"\1"', True),
    (r"'\s*([^']*?)\s*'", r"'\1'", True),
    ("= = = =", "====", False),                            # heading runs
    ("= = =", "===", False),
    ("= =", "==", False),
    (" \u00b0 ", "\u00b0", False),                          # degree sign
    (" \n", "\n", False),                                  # the spaces around line breaks
    ("\n ", "\n", False),
    (" N ", " 1 ", False),
    (" 's", "'s", False),
]


def wikitext_detokenize(page, compat):
    """`page` with WikiText's tokenization artefacts undone by `compat`'s rules, llm8's _DETOKENIZE_RULES or
    HARNESS_WIKITEXT_RULES (the text the model scores; its words and bytes are still counted on the
    original)."""
    if compat == "llm8":
        for pattern, replacement in _DETOKENIZE_RULES:
            page = pattern.sub(replacement, page)
        return page
    for pattern, replacement, regex in HARNESS_WIKITEXT_RULES:
        page = re.sub(pattern, replacement, page) if regex else page.replace(pattern, replacement)
    return page


def wikitext_pages(text, path):
    """The pages of a WikiText raw split: each runs from its level-1 heading line to the next one, lines
    kept as they are. Blank lines before the first heading are dropped; raises DataError (naming `path`)
    for other text there, or when there is no heading."""
    lines = text.splitlines(keepends=True)
    starts = [i for i, line in enumerate(lines) if _LEVEL1_HEADING.fullmatch(line.rstrip("\r\n"))]
    if not starts:
        raise DataError(f"{path}: no level-1 heading (' = Title = ' on its own line): not a WikiText raw file")
    for i, line in enumerate(lines[:starts[0]]):
        if line.strip():
            raise DataError(f"{path}:{i + 1}: text before the first level-1 heading")
    ends = starts[1:] + [len(lines)]
    return ["".join(lines[s:e]) for s, e in zip(starts, ends)]


def wikitext_counts(page):
    """(words, UTF-8 bytes) of an original page, as lm-evaluation-harness counts them for perplexity."""
    return len(re.split(r"\s+", page)), len(page.encode("utf-8"))


# ----------------------------------------------------------------------------------------------------
# inputs

def read_text(path):
    """The text of a UTF-8 file; raises DataError naming the file for a missing one or bad UTF-8."""
    data = read_bytes(path)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not UTF-8 (byte offset {e.start}: {e.reason})") from None


def read_bytes(path):
    """The bytes of `path`; DataError naming it when it cannot be read, or is empty."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise DataError(f"{path}: cannot read ({e.strerror or e})") from None
    if not data:
        raise DataError(f"{path}: empty file")
    return data


def read_zip_member(path, member):
    """The UTF-8 text of `member` inside the zip file `path`; DataError naming both on any problem."""
    try:
        with zipfile.ZipFile(path) as z:
            data = z.read(member)
    except KeyError:
        raise DataError(f"{path}: the zip file has no member {member}") from None
    except (zipfile.BadZipFile, OSError, EOFError, zipfile.LargeZipFile) as e:
        raise DataError(f"{path}: bad zip file ({e})") from None
    if not data:
        raise DataError(f"{path}: {member} is empty")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: {member} is not UTF-8 (byte offset {e.start}: {e.reason})") from None


def read_jsonl(path, limit=None):
    """(line number, object) of each non-blank line of a JSON-lines file, the first `limit` (all when
    None); raises DataError naming the file and line for bad UTF-8, invalid JSON or a non-object."""
    data = read_bytes(path)
    rows = []
    for number, raw in enumerate(io.BytesIO(data), start=1):
        if limit is not None and len(rows) >= limit:
            break
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise DataError(f"{path}:{number}: not UTF-8 (byte {e.start} of the line: {e.reason})") from None
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}:{number}: invalid JSON ({e.msg} at column {e.colno})") from None
        if not isinstance(obj, dict):
            raise DataError(f"{path}:{number}: expected a JSON object, got {type(obj).__name__}")
        rows.append((number, obj))
    if not rows:
        raise DataError(f"{path}: no JSON lines")
    return rows


def require_str(path, number, obj, field):
    """obj[field], which must be a string; DataError naming the file and line otherwise."""
    if field not in obj:
        raise DataError(f"{path}:{number}: missing field {field!r}")
    if not isinstance(obj[field], str):
        raise DataError(f"{path}:{number}: field {field!r} is {type(obj[field]).__name__}, not a string")
    return obj[field]


def fetch_input(url, name, hint):
    """dev/data/cache/`name`, downloaded from `url` when not there yet (through a temporary file, so an
    interrupted download leaves nothing). No sha256 is checked: the expected digests of these public
    files are not recorded in this project. Raises DataError (one line, with the URL and `hint`) when
    the download fails."""
    path = llm8_data.CACHE_DIR / name
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    print(f"downloading {url} -> {path}", file=sys.stderr)
    try:
        with urllib.request.urlopen(url, timeout=llm8_data.DOWNLOAD_TIMEOUT_S) as response, open(tmp, "wb") as out:
            shutil.copyfileobj(response, out)
    except (OSError, http.client.HTTPException) as e:
        tmp.unlink(missing_ok=True)
        reason = " ".join(str(getattr(e, "reason", e)).split())
        raise DataError(f"cannot download {url} ({reason}); {hint}") from None
    os.replace(tmp, path)
    return path


def offline_hint(script, example_input):
    """The `hint` of fetch_input: how to run `script` on a local copy instead."""
    return f"without network, pass a local copy: python dev/data/{script} {example_input}"


# ----------------------------------------------------------------------------------------------------
# writing

def write_atomic(path, chunks):
    """Write the byte strings `chunks` to `path` through `path + ".tmp"`, fsynced and renamed (the folder
    too), so `path` is either untouched or whole; the temporary file is removed on failure."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    llm8_data.fsync_dir(path.parent)


def check_ids(path, where, ids, limit):
    """Raises DataError unless every id of `ids` is in [0, limit)."""
    bad = [i for i in ids if not 0 <= i < limit]
    if bad:
        raise DataError(f"{path}: {where}: token id {bad[0]} is outside [0, {limit})")


def write_evalfile(path, examples, vocab_size, compat):
    """Write multiple-choice `examples` as llm.c's eval file (see the banner) for `compat` at `path`,
    atomically.

    examples: dicts {"label": int, "context": [ids], "endings": [[ids], ...]}, and for harness "chars":
    [each ending's characters]; each example's index is its position. Ids must be below `vocab_size` and
    65535. Returns the longest example's bytes. Raises DataError naming the file (and example) when a
    limit is exceeded; nothing is written then.
    """
    if not examples:
        raise DataError(f"{path}: no examples to write")
    if len(examples) >= MC_MAX_EXAMPLES:
        raise DataError(f"{path}: {len(examples)} examples, llm.c's eval file holds fewer than {MC_MAX_EXAMPLES}")
    limit = min(vocab_size, MC_MAX_TOKEN + 1)
    streams = []
    for index, ex in enumerate(examples):
        context, endings, label = ex["context"], ex["endings"], ex["label"]
        if not 0 <= label < len(endings):
            raise DataError(f"{path}: example {index}: label {label} for {len(endings)} endings")
        words = [MC_START, 0, index, label, len(endings), len(context), *context]
        check_ids(path, f"example {index}", context, limit)
        for c, ending in enumerate(endings):
            if not ending:
                raise DataError(f"{path}: example {index}: ending {c} has no tokens")
            check_ids(path, f"example {index}", ending, limit)
            words += [len(ending), *ending]
        nbytes = 2 * len(words)
        if nbytes > MC_MAX_EXAMPLE_BYTES:
            raise DataError(f"{path}: example {index} is {nbytes} bytes, more than the uint16 count holds "
                            f"({MC_MAX_EXAMPLE_BYTES})")
        words[1] = nbytes
        streams.append(np.array(words, dtype="<u2"))
    longest = max(2 * s.size for s in streams)
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[:4] = (MC_MAGIC, MC_VERSION, len(examples), longest)
    header[MC_COMPAT_WORD] = COMPATS[compat]
    if compat == "harness":
        chars = [n for ex in examples for n in ex["chars"]]
        for index, ex in enumerate(examples):
            if len(ex["chars"]) != len(ex["endings"]) or not all(0 < n <= MC_MAX_EXAMPLE_BYTES for n in ex["chars"]):
                raise DataError(f"{path}: example {index}: character counts {ex['chars']} (one per ending, 1 to "
                                f"{MC_MAX_EXAMPLE_BYTES})")
        header[MC_ENDINGS_WORD] = len(chars)
        streams.append(np.array(chars, dtype="<u2"))
    write_atomic(path, [header.tobytes()] + [s.tobytes() for s in streams])
    return longest


def write_continuations(path, kind, bos, records, vocab_size, compat):
    """Write `records` as llm8's continuation eval file (see the banner) of `kind` for `compat` at `path`,
    atomically.

    records: dicts {"context": [ids], "target": [ids], "n_words": int, "n_bytes": int}. Raises DataError
    naming the file (and record) when one breaks the format's limits; nothing is written then.
    """
    if kind not in KIND_NAMES:
        raise DataError(f"{path}: unknown eval kind {kind}")
    if not records:
        raise DataError(f"{path}: no records to write")
    if len(records) > CONT_MAX_RECORDS:
        raise DataError(f"{path}: {len(records)} records do not fit the header's int32 count")
    if not 0 <= bos < vocab_size:
        raise DataError(f"{path}: BOS id {bos} is outside [0, {vocab_size})")
    chunks = []
    for r, rec in enumerate(records):
        context, target = rec["context"], rec["target"]
        if not target:
            raise DataError(f"{path}: record {r} has no target tokens")
        if not (0 <= rec["n_words"] < 2**31 and 0 <= rec["n_bytes"] < 2**31):
            raise DataError(f"{path}: record {r}: words {rec['n_words']} or bytes {rec['n_bytes']} "
                            "do not fit an int32")
        check_ids(path, f"record {r}", context, vocab_size)
        check_ids(path, f"record {r}", target, vocab_size)
        words = [len(context), len(target), rec["n_words"], rec["n_bytes"], *context, *target]
        chunks.append(np.array(words, dtype="<i4").tobytes())
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[:5] = (CONT_MAGIC, CONT_VERSION, kind, len(records), bos)
    header[CONT_COMPAT_WORD] = COMPATS[compat]
    write_atomic(path, [header.tobytes()] + chunks)


# ----------------------------------------------------------------------------------------------------
# reading (validating)

def _read_header(path, magic, what):
    """(header int32[256], the bytes after it) of an eval file, checking the size and the magic."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise DataError(f"{path}: cannot read ({e.strerror or e})") from None
    if len(data) < HEADER_BYTES:
        raise DataError(f"{path}: {len(data)} bytes is shorter than the {HEADER_BYTES}-byte header")
    header = np.frombuffer(data[:HEADER_BYTES], dtype="<i4")
    if int(header[0]) != magic:
        raise DataError(f"{path}: bad magic {int(header[0])} (expected {magic}): not {what}")
    if int(header[1]) != 1:
        raise DataError(f"{path}: unsupported version {int(header[1])} (expected 1)")
    return header, data[HEADER_BYTES:]


def _compat_of(path, header, word):
    """The mode name of header word `word`; DataError naming the file for an unknown one."""
    names = {code: name for name, code in COMPATS.items()}
    if int(header[word]) not in names:
        raise DataError(f"{path}: unknown --eval-compat mode {int(header[word])} in header word {word}")
    return names[int(header[word])]


def read_evalfile(path, vocab_size=None):
    """(mode, examples) of llm.c's eval file at `path`: the --eval-compat mode it was written for and a list
    of {"index", "label", "context", "endings"} (ids as lists of int), with "chars" (each ending's
    characters) in a harness file.

    Checks the magic, version, reserved header words, every example's start marker, byte count (against
    the header's longest too), label and lengths, that the examples (and a harness file's character
    counts) fill the file exactly and, if `vocab_size` is given, every id; raises DataError (one line
    naming the file) on the first problem.
    """
    header, body = _read_header(path, MC_MAGIC, "llm.c's eval file")
    count, longest = int(header[2]), int(header[3])
    compat = _compat_of(path, header, MC_COMPAT_WORD)
    n_chars = int(header[MC_ENDINGS_WORD]) if compat == "harness" else 0
    if header[MC_ENDINGS_WORD + 1:].any() or (compat == "llm8" and header[MC_ENDINGS_WORD]):
        raise DataError(f"{path}: reserved header words are not 0")
    if not 0 < count < MC_MAX_EXAMPLES:
        raise DataError(f"{path}: bad example count {count}")
    if len(body) % 2:
        raise DataError(f"{path}: {len(body)} bytes after the header, not a whole number of uint16")
    w = np.frombuffer(body, dtype="<u2").tolist()
    if not 0 <= n_chars <= len(w) or (compat == "harness" and n_chars == 0):
        raise DataError(f"{path}: bad ending count {n_chars} in the header")
    chars, w = w[len(w) - n_chars:], w[:len(w) - n_chars]
    examples, at, seen_longest = [], 0, 0
    for e in range(count):
        if at + MC_PREFIX_WORDS > len(w):
            raise DataError(f"{path}: truncated: example {e} of {count} is missing")
        start, nbytes, index, label, n_endings, n_ctx = w[at:at + MC_PREFIX_WORDS]
        if start != MC_START:
            raise DataError(f"{path}: example {e}: no start marker ({MC_START}) at byte {HEADER_BYTES + 2 * at}")
        end = at + nbytes // 2
        if nbytes % 2 or nbytes > longest or end > len(w):
            raise DataError(f"{path}: example {e}: bad byte count {nbytes} (header's longest {longest}, "
                            f"{2 * (len(w) - at)} bytes left)")
        if not 0 <= label < n_endings:
            raise DataError(f"{path}: example {e}: label {label} for {n_endings} endings")
        at += MC_PREFIX_WORDS
        context = w[at:at + n_ctx]
        at += n_ctx
        endings = []
        for c in range(n_endings):
            n = w[at] if at < end else 0
            if n < 1 or at + 1 + n > end:
                raise DataError(f"{path}: example {e}: ending {c} runs past the example's {nbytes} bytes")
            endings.append(w[at + 1:at + 1 + n])
            at += 1 + n
        if at != end:
            raise DataError(f"{path}: example {e}: {2 * (end - at)} bytes after its endings")
        if vocab_size is not None:
            check_ids(path, f"example {e}", context + sum(endings, []), vocab_size)
        seen_longest = max(seen_longest, nbytes)
        examples.append({"index": index, "label": label, "context": context, "endings": endings})
    if at != len(w):
        raise DataError(f"{path}: {2 * (len(w) - at)} bytes after the last of {count} examples")
    if seen_longest != longest:
        raise DataError(f"{path}: header's longest example is {longest} bytes, the file's is {seen_longest}")
    if compat == "harness":
        if sum(len(ex["endings"]) for ex in examples) != n_chars or 0 in chars:
            raise DataError(f"{path}: {n_chars} character counts for the file's endings, or an ending of 0")
        for ex in examples:
            ex["chars"], chars = chars[:len(ex["endings"])], chars[len(ex["endings"]):]
    return compat, examples


def read_continuations(path, vocab_size=None):
    """(kind, BOS id, mode, records) of llm8's continuation eval file at `path`: mode the --eval-compat it
    was written for, records dicts {"context", "target", "n_words", "n_bytes"} (ids as lists of int).

    Checks the magic, version, kind, reserved header words, every record's sizes, that the records fill
    the file exactly and, if `vocab_size` is given, BOS and every id; raises DataError (one line naming
    the file) on the first problem.
    """
    header, body = _read_header(path, CONT_MAGIC, "llm8's continuation eval file")
    kind, count, bos = (int(x) for x in header[2:5])
    if kind not in KIND_NAMES:
        raise DataError(f"{path}: unknown eval kind {kind} (1 LAMBADA, 2 WikiText)")
    if count <= 0:
        raise DataError(f"{path}: bad record count {count}")
    compat = _compat_of(path, header, CONT_COMPAT_WORD)
    if header[CONT_COMPAT_WORD + 1:].any():
        raise DataError(f"{path}: header words {CONT_COMPAT_WORD + 1}..255 are not 0")
    if vocab_size is not None and not 0 <= bos < vocab_size:
        raise DataError(f"{path}: BOS id {bos} is outside [0, {vocab_size})")
    if len(body) % 4:
        raise DataError(f"{path}: {len(body)} bytes after the header, not a whole number of int32")
    w = np.frombuffer(body, dtype="<i4").tolist()
    records, at = [], 0
    for r in range(count):
        if at + CONT_PREFIX_WORDS > len(w):
            raise DataError(f"{path}: truncated: record {r} of {count} is missing")
        n_ctx, n_tgt, n_words, n_bytes = w[at:at + CONT_PREFIX_WORDS]
        if n_ctx < 0 or n_tgt < 1 or n_words < 0 or n_bytes < 0:
            raise DataError(f"{path}: record {r}: bad sizes (context {n_ctx}, target {n_tgt}, words {n_words}, "
                            f"bytes {n_bytes})")
        at += CONT_PREFIX_WORDS
        if at + n_ctx + n_tgt > len(w):
            raise DataError(f"{path}: truncated: record {r}'s {n_ctx + n_tgt} tokens run past the end")
        context, target = w[at:at + n_ctx], w[at + n_ctx:at + n_ctx + n_tgt]
        at += n_ctx + n_tgt
        if vocab_size is not None:
            check_ids(path, f"record {r}", context + target, vocab_size)
        records.append({"context": context, "target": target, "n_words": n_words, "n_bytes": n_bytes})
    if at != len(w):
        raise DataError(f"{path}: {4 * (len(w) - at)} bytes after the last of {count} records")
    return kind, bos, compat, records


# ----------------------------------------------------------------------------------------------------
# the scripts' command line

def arg_parser(doc, input_help, default_out):
    """The command line the three scripts share: INPUT, --out, --tokenizer, --limit, --eval-compat."""
    parser = argparse.ArgumentParser(description=doc.strip(), formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("input", nargs="?", type=Path, help=input_help)
    parser.add_argument("--out", type=Path, default=default_out, help="output file (default: %(default)s)")
    parser.add_argument("--tokenizer", type=Path, help="Llama-2 SentencePiece tokenizer.model (default: found by "
                        f"llm8_data.resolve_data_file, ${llm8_data.DATA_DIR_ENV})")
    parser.add_argument("--limit", type=positive_int, help="keep only the first N examples (pages for WikiText)")
    parser.add_argument("--eval-compat", choices=sorted(COMPATS), default=DEFAULT_COMPAT,
                        help="whose rules the tokens follow: harness (lm-evaluation-harness %s on an HF Llama-2) or "
                        "llm8 (docs/evaluation.md); the trainer's --eval-compat must match (default: %%(default)s)"
                        % HARNESS_VERSION)
    return parser


def positive_int(text):
    """argparse type: an int >= 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def load_tokenizer(model_path):
    """The SentencePiece model at `model_path`, or the shared Llama-2 one when None."""
    return llm8_data.load_tokenizer(model_path or llm8_data.resolve_data_file("tokenizer"))


def fail(error):
    """Stop the script with one line on stderr naming it, and status 1."""
    sys.exit(f"{os.path.basename(sys.argv[0])}: error: {error}")
