"""
Shared pieces of llm8's data preparation: the llm.c token-shard format, the tokenizer decode table
(`tokenizer.bin`), the text normalisation every input gets, durable file writes, and locating the shared
data files (tokenizer, tiny-shakespeare). The formats are specified in docs/formats.md; all
integers are little-endian.
"""
import hashlib
import json
import os
import re
import shutil
import sys
import urllib.request
from pathlib import Path

import numpy as np

HEADER_INTS = 256                 # every llm8 file starts with 256 int32 words
HEADER_BYTES = HEADER_INTS * 4
# Token shard formats by header version: (magic, token dtype). 1 and 7 are llm.c's (dev/data/data_common.py
# write_datafile: "gpt-2" uint16, "llama-3" uint32); 2 is llm8's earlier uint32 shard, read but no longer
# written. Versions are distinct, so the version names the format.
SHARD_MAGIC = 20240520            # llm.c's uint16 shard (and llm8's earlier uint32 one)
SHARD_MAGIC_U32 = 20240801        # llm.c's uint32 shard
SHARD_FORMATS = {1: (SHARD_MAGIC, np.dtype("<u2")), 7: (SHARD_MAGIC_U32, np.dtype("<u4")),
                 2: (SHARD_MAGIC, np.dtype("<u4"))}
SHARD_TOKEN_DTYPES = {version: dtype for version, (_, dtype) in SHARD_FORMATS.items()}
SHARD_WRITTEN_VERSIONS = (1, 7)   # what write_shard and the data scripts write
TOKENIZER_MAGIC = 20251202
TOKENIZER_VERSION = 1
SP_SPACE = "\u2581"               # SentencePiece's '▁' stands for a space

REPO_ROOT = Path(__file__).resolve().parents[2]
CACHE_DIR = REPO_ROOT / "dev" / "data" / "cache"
DATA_DIR_ENV = "LLM8_DATA_DIR"

# kind -> (path under the data folder, public original, sha256 from shared/data/README.md)
DATA_FILES = {
    "tokenizer": (
        "tokenizer/llama2_tokenizer.model",
        "https://raw.githubusercontent.com/karpathy/llama2.c/master/tokenizer.model",
        "9e556afd44213b6bd1be2b850ebbbd98f5481437a8021afaf58ee7fb1818d347",
    ),
    "tinyshakespeare": (
        "tinyshakespeare/input.txt",
        "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt",
        "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed",
    ),
}


class DataError(Exception):
    """A data file is missing, corrupt or cannot be fetched; the message is one line for the user."""


# ----------------------------------------------------------------------------------------------------
# token shards

def shard_version_for(max_id):
    """The version write_shard picks for ids up to `max_id`: llm.c's uint16 (1) when they fit, else its uint32 (7)."""
    return 1 if max_id < 2**16 else 7


def shard_header(count, version):
    """The 1024-byte header of a shard holding `count` tokens of `version` (SHARD_FORMATS: its magic)."""
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[0:3] = (SHARD_FORMATS[version][0], version, count)
    return header.tobytes()


def write_shard(path, tokens, version=None):
    """Write `tokens` (1-D ints, 0 <= id < 2^32) as an llm.c shard at `path`.

    version 1 stores uint16 and 7 uint32, as llm.c does; None picks 1 when every id is below 65536. The file is
    written to `path + ".tmp"` and renamed, so a reader never sees half a shard. Raises ValueError if
    the ids do not fit the version or the count does not fit the header's int32.
    """
    tokens = np.asarray(tokens)
    if tokens.ndim != 1:
        raise ValueError(f"{path}: tokens must be 1-D, got shape {tokens.shape}")
    if tokens.size and (tokens.min() < 0 or tokens.max() >= 2**32):
        raise ValueError(f"{path}: token ids must be in [0, 2^32)")
    max_id = int(tokens.max()) if tokens.size else 0
    if version is None:
        version = shard_version_for(max_id)
    if version not in SHARD_WRITTEN_VERSIONS:
        raise ValueError(f"{path}: shard version {version} is not written (llm.c's are {SHARD_WRITTEN_VERSIONS})")
    if version == 1 and max_id >= 2**16:
        raise ValueError(f"{path}: token id {max_id} does not fit version 1 (uint16)")
    if tokens.size >= 2**31:
        raise ValueError(f"{path}: {tokens.size} tokens do not fit the header's int32 count")
    tmp = f"{path}.tmp"
    with open(tmp, "wb") as f:
        f.write(shard_header(tokens.size, version))
        f.write(tokens.astype(SHARD_TOKEN_DTYPES[version]).tobytes())
    os.replace(tmp, path)


def read_shard(path, vocab_size=None):
    """Read an llm.c shard; returns its tokens (uint16 or uint32 numpy array).

    Checks the magic, the version, the token count against the file size and, if `vocab_size` is
    given, every id against it; raises ValueError naming the file (and offset) on the first problem.
    """
    size = os.path.getsize(path)
    if size < HEADER_BYTES:
        raise ValueError(f"{path}: {size} bytes is shorter than the {HEADER_BYTES}-byte header")
    header = np.fromfile(path, dtype="<i4", count=HEADER_INTS)
    magic, version, count = (int(x) for x in header[:3])
    if magic not in (SHARD_MAGIC, SHARD_MAGIC_U32):
        raise ValueError(f"{path}: bad magic {magic} (expected {SHARD_MAGIC} or {SHARD_MAGIC_U32}): not a token shard")
    if SHARD_FORMATS.get(version, (None,))[0] != magic:
        raise ValueError(f"{path}: unsupported shard version {version} for magic {magic} (expected "
                         f"{', '.join(f'{m}/{v}' for v, (m, _) in SHARD_FORMATS.items())})")
    dtype = SHARD_TOKEN_DTYPES[version]
    expected = HEADER_BYTES + count * dtype.itemsize
    if count < 0 or size != expected:
        raise ValueError(f"{path}: header says {count} tokens ({expected} bytes) but the file has "
                         f"{size} bytes")
    tokens = np.fromfile(path, dtype=dtype, offset=HEADER_BYTES)
    if vocab_size is not None and tokens.size:
        bad = np.flatnonzero(tokens >= vocab_size)
        if bad.size:
            i = int(bad[0])
            raise ValueError(f"{path}: token {i} (byte offset {HEADER_BYTES + i * dtype.itemsize}) "
                             f"is {int(tokens[i])}, not below the vocabulary size {vocab_size}")
    return tokens


# ----------------------------------------------------------------------------------------------------
# tokenizer

def load_tokenizer(model_path):
    """Load a SentencePiece model; raises DataError with the path if it cannot."""
    import sentencepiece as spm
    if not os.path.isfile(model_path):
        raise DataError(f"tokenizer model not found: {model_path}")
    try:
        return spm.SentencePieceProcessor(model_file=str(model_path))
    except (OSError, RuntimeError) as e:
        raise DataError(f"cannot load tokenizer model {model_path}: {e}") from None


def piece_bytes(sp, token_id):
    """The bytes token `token_id` decodes to in tokenizer.bin (docs/formats.md: '▁' -> space, <0xAB> -> byte
    0xAB, control and unknown pieces -> empty)."""
    if sp.is_control(token_id) or sp.is_unknown(token_id):
        return b""
    piece = sp.id_to_piece(token_id)
    if sp.is_byte(token_id):
        return bytes([int(piece[3:-1], 16)])    # "<0xAB>"
    return piece.replace(SP_SPACE, " ").encode("utf-8")


def export_tokenizer(model_path, out_path):
    """Write the decode table `tokenizer.bin` for the SentencePiece model at `model_path`.

    Header: magic, version, V, BOS id, EOS id; then per id a uint8 length and the bytes. Written to a
    temporary name and renamed. Raises ValueError if a piece is longer than 255 bytes.
    """
    sp = load_tokenizer(model_path)
    vocab_size = sp.get_piece_size()
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[0:5] = (TOKENIZER_MAGIC, TOKENIZER_VERSION, vocab_size, sp.bos_id(), sp.eos_id())
    table = bytearray()
    for token_id in range(vocab_size):
        b = piece_bytes(sp, token_id)
        if len(b) > 255:
            raise ValueError(f"{model_path}: piece {token_id} is {len(b)} bytes, more than 255")
        table.append(len(b))
        table += b
    tmp = f"{out_path}.tmp"
    with open(tmp, "wb") as f:
        f.write(header.tobytes())
        f.write(table)
    os.replace(tmp, out_path)


# ----------------------------------------------------------------------------------------------------
# text normalisation (docs/data.md: the rules)

# Removed: U+FEFF (a byte-order mark at the start of a file, and mid-stream where files were concatenated;
# its other use, a zero-width no-break space, is deprecated in favour of U+2060), and the C0 controls and
# DEL except TAB, LF and FF (FF separates pages in plain-text books and source code). NUL and the others
# are corruption or terminal residue and would cost a byte-fallback token each.
_REMOVED = [*range(0x00, 0x09), 0x0B, *range(0x0E, 0x20), 0x7F, 0xFEFF]
_REMOVE_TABLE = dict.fromkeys(_REMOVED)
# Anything normalize_text changes; most text has none of it and is returned untouched.
_NEEDS_NORMALIZING = re.compile(r"[\x00-\x08\x0b\x0d-\x1f\x7f\ufeff]")


def normalize_text(text):
    """`text` with CRLF and CR line ends made LF and the characters in _REMOVED dropped."""
    if not _NEEDS_NORMALIZING.search(text):
        return text
    return text.replace("\r\n", "\n").replace("\r", "\n").translate(_REMOVE_TABLE)


# ----------------------------------------------------------------------------------------------------
# durable writes

def fsync_dir(path):
    """Make the entries of folder `path` (renames into it) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json(path, obj):
    """Write `obj` as JSON to `path` through a temporary file, fsynced and renamed, so a reader (or a
    run after a crash) finds either the old file or the whole new one."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1, ensure_ascii=False)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


# ----------------------------------------------------------------------------------------------------
# shared data files

def sha256_of(path):
    """Hex sha256 of a file."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


DOWNLOAD_TIMEOUT_S = 60

# The project's shared data folder, beside the checkout. A clone made elsewhere (CI) is pointed at it
# with $LLM8_DATA_DIR (.ci/run does that).
SHARED_DATA_DIRS = [REPO_ROOT.parent / "shared" / "data"]


def resolve_data_file(kind):
    """Path of a shared data file, `kind` in DATA_FILES ("tokenizer" or "tinyshakespeare").

    Looks in $LLM8_DATA_DIR if set, else in the first of SHARED_DATA_DIRS that exists, else downloads
    the public original into dev/data/cache/. The file's sha256 must match DATA_FILES; raises DataError
    (one line, naming the file and what to provide) if it is missing, differs or cannot be fetched.
    """
    rel, url, sha = DATA_FILES[kind]
    hint = f"set {DATA_DIR_ENV} to a folder holding {rel}, or pass its path on the command line"
    env_dir = os.environ.get(DATA_DIR_ENV)
    shared_dir = next((d for d in SHARED_DATA_DIRS if d.is_dir()), None)
    if env_dir:
        path = Path(env_dir) / rel
        if not path.is_file():
            raise DataError(f"{path} not found ({DATA_DIR_ENV}={env_dir}); {hint}")
    elif shared_dir is not None:
        path = shared_dir / rel
        if not path.is_file():
            raise DataError(f"{path} not found; {hint}")
    else:
        path = CACHE_DIR / rel
        if not (path.is_file() and sha256_of(path) == sha):
            download(url, path, sha, hint)
    digest = sha256_of(path)
    if digest != sha:
        raise DataError(f"{path}: sha256 {digest} differs from the expected {sha}; {hint}")
    return path


def download(url, path, sha, hint):
    """Fetch `url` to `path` through a temporary file, checking its sha256; raises DataError on
    failure (leaving `path` as it was)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    print(f"downloading {url} -> {path}", file=sys.stderr)
    try:
        with urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as response, open(tmp, "wb") as out:
            shutil.copyfileobj(response, out)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise DataError(f"cannot download {path.name} from {url} ({e}); {hint}") from None
    digest = sha256_of(tmp)
    if digest != sha:
        tmp.unlink()
        raise DataError(f"{url}: downloaded sha256 {digest} differs from the expected {sha}; {hint}")
    os.replace(tmp, path)
