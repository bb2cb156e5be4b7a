"""
Reading text corpora for llm8's data preparation (dev/data/tokenize.py, tinyshakespeare.py): which files
an input argument names, how each format is read, and the documents a file holds. docs/data.md is the
user's side of this.

Formats, by suffix: .txt (one document per file, or one per paragraph with split_paragraphs), .jsonl (one
JSON object per line, the document under text_key), either of them compressed as .gz or .zst, and
.parquet (the text_key column, read one row group at a time). A directory stands for the files below it
in these formats, a glob for its matches, each in sorted order.

The work is split so that the main process only reads and the workers do the rest in parallel:
file_chunks() cuts a file into Chunks of about CHUNK_BYTES (whole lines, whole paragraphs, batches of
rows), and parse() turns one into documents: decoded, normalised by llm8_data.normalize_text, stripped,
the empty ones dropped. Positions are record numbers within a file (lines; rows; for a whole .txt file,
the file), so a run can stop and resume at any document. Bad input gives a one-line DataError naming the
file and the line (counted from 1) or row (counted from 0, as pyarrow does).
"""
import glob
import gzip
import hashlib
import json
import re
import zlib
from dataclasses import dataclass
from pathlib import Path

import zstandard

import llm8_data
from llm8_data import DataError

CHUNK_BYTES = 1 << 20   # text per worker task: amortises the hand-off to a worker, bounds memory
READ_BYTES = 1 << 16    # per read of a file: small, so an error in a compressed file is placed within
                        # a few lines (what a failing read decompressed is lost) and memory stays bounded
FORMATS = {             # suffix -> (kind, compression)
    ".txt": ("txt", None), ".txt.gz": ("txt", "gz"), ".txt.zst": ("txt", "zst"),
    ".jsonl": ("jsonl", None), ".jsonl.gz": ("jsonl", "gz"), ".jsonl.zst": ("jsonl", "zst"),
    ".parquet": ("parquet", None),
}
UTF8_BOM = b"\xef\xbb\xbf"
# What reading a corrupt or truncated file raises: gzip (BadGzipFile is an OSError; EOFError when it ends
# early; zlib.error), zstandard, and I/O errors.
READ_ERRORS = (OSError, EOFError, zlib.error, zstandard.ZstdError)


def one_line(error):
    """An exception's message on one line (pyarrow's span several)."""
    return " ".join(str(error).split())


def input_format(path):
    """(kind, compression) of a corpus file by its suffix, or None when it is not one."""
    return next((fmt for suffix, fmt in FORMATS.items() if Path(path).name.endswith(suffix)), None)


# ----------------------------------------------------------------------------------------------------
# which files

def _files_below(folder):
    return sorted((p for p in folder.rglob("*") if p.is_file() and input_format(p)), key=lambda p: p.parts)


def expand_inputs(specs):
    """The corpus files named by `specs`, in order: a file itself, a directory the corpus files below it,
    a glob (recursive with **) its matches; directories and globs sorted by path. Raises DataError for a
    name that matches nothing, a file of another format, or a file named twice."""
    files = []
    for spec in map(str, specs):
        path = Path(spec)
        if path.is_dir():
            found = _files_below(path)
            if not found:
                raise DataError(f"{spec}: no {', '.join(FORMATS)} files in this directory")
        elif path.is_file():
            found = [path]
        elif any(c in spec for c in "*?["):
            found = []
            for match in sorted((Path(m) for m in glob.glob(spec, recursive=True)), key=lambda p: p.parts):
                found += _files_below(match) if match.is_dir() else [match]
            if not found:
                raise DataError(f"{spec}: no file matches")
        else:
            raise DataError(f"input file not found: {spec}")
        for p in found:
            if input_format(p) is None:
                raise DataError(f"{p}: unsupported input type (expected {', '.join(FORMATS)})")
        files += found
    seen = {}
    for p in files:
        other = seen.setdefault(p.resolve(), p)
        if other is not p:
            raise DataError(f"{p}: named twice in the inputs (also as {other})")
    return files


def check_input(path, text_key):
    """Checks that can be made before reading (a parquet file's footer and its text column), so that a
    bad file late in the list stops the run before hours of work; raises DataError."""
    if input_format(path)[0] == "parquet":
        _open_parquet(path, text_key)


# ----------------------------------------------------------------------------------------------------
# reading (main process)

@dataclass
class Chunk:
    """A piece of one input file, read by the main process, parsed and tokenized by a worker."""
    path: str
    file_index: int           # in the list of files being read
    kind: str                 # payload: "jsonl" whole lines (bytes); "txt" a whole file (bytes);
    payload: object           # "docs" [(document, end)] (paragraphs, split here); "values" parquet values
    first: int                # records of the file before the payload
    end: int                  # records of the file up to the end of the payload
    raw_bytes: int            # bytes of the file read so far (progress)
    sha256: str = None        # set on the file's last chunk only: the hash of the whole file
    error: str = None         # reading stopped after the payload: the one-line message


class _HashingReader:
    """A file read front to back, hashed (for the manifest) and counted (for progress) on the way."""

    def __init__(self, f):
        self.f, self.sha256, self.bytes = f, hashlib.sha256(), 0

    def read(self, size=-1):
        data = self.f.read(size)
        self.sha256.update(data)
        self.bytes += len(data)
        return data


def _blocks(raw, compression):
    """The (decompressed) content of `raw` in blocks."""
    if compression == "gz":     # gzip reads every member of a concatenated file and checks each CRC
        with gzip.GzipFile(fileobj=raw, mode="rb") as f:
            while block := f.read(READ_BYTES):
                yield block
    elif compression == "zst":
        yield from _zstd_blocks(raw)
    else:
        while block := raw.read(READ_BYTES):
            yield block


def _zstd_blocks(raw):
    """zstd content across concatenated frames (as pzstd writes them). zstandard's stream_reader takes a
    truncated file for a short one, so the frames are followed here: one still open at the end is an error.
    Checksums, when the file has them (the zstd tool writes them), are checked by zstandard."""
    dctx = zstandard.ZstdDecompressor()
    frame, started = dctx.decompressobj(), False
    while data := raw.read(READ_BYTES):
        while data:
            started = True
            if block := frame.decompress(data):
                yield block
            if not frame.eof:
                break
            data = frame.unused_data
            frame, started = dctx.decompressobj(), False
    if started:
        raise EOFError("the file ends inside a zstd frame (truncated?)")


def _whole_lines(blocks):
    """`blocks` re-cut so that each ends at a line end (b"\\n"), but perhaps the last."""
    carry = []
    for block in blocks:
        cut = block.rfind(b"\n") + 1
        if not cut:             # a line longer than a block: keep the parts, join once
            carry.append(block)
            continue
        yield b"".join(carry + [block[:cut]])
        carry = [block[cut:]]
    if rest := b"".join(carry):
        yield rest


def _logical_lines(blocks):
    """The lines of the content (bytes, without their ends), a line ending at LF, CRLF or CR."""
    for block in _whole_lines(blocks):
        lines = block.split(b"\n")
        if not lines[-1]:
            lines.pop()
        for line in lines:
            if line.endswith(b"\r"):
                line = line[:-1]
            yield from line.split(b"\r") if b"\r" in line else (line,)


def decode_utf8(raw, path, line):
    """Decode bytes as UTF-8 or raise DataError naming the file and the line (of `raw`'s first byte)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line_ends = list(re.finditer(rb"\r\n?|\n", raw[:e.start]))
        column = e.start - (line_ends[-1].end() if line_ends else 0)
        raise DataError(f"{path}:{line + len(line_ends)}: not valid UTF-8 ({e.reason} at byte {column} "
                        "of the line)") from None


class _Cursor:
    """Where a reader is, for the message when reading fails."""
    where = "at the start"


def _jsonl_chunks(path, file_index, raw, blocks, skip, cursor):
    parts, size, line, first = [], 0, 0, 0
    for block in _whole_lines(blocks):
        n = block.count(b"\n") + (not block.endswith(b"\n"))
        if skip:                # lines before a resume point: counted, not parsed
            if n <= skip:
                skip, line = skip - n, line + n
                continue
            cut = 0
            for _ in range(skip):
                cut = block.index(b"\n", cut) + 1
            block, n, line, skip = block[cut:], n - skip, line + skip, 0
        if not parts:
            first = line
        parts.append(block)
        size, line = size + len(block), line + n
        cursor.where = f"after line {line}"
        if size >= CHUNK_BYTES:
            yield Chunk(path, file_index, "jsonl", b"".join(parts), first, line, raw.bytes)
            parts, size = [], 0
    if not parts:
        first = line
    yield Chunk(path, file_index, "jsonl", b"".join(parts), first, line, raw.bytes, raw.sha256.hexdigest())


def _paragraph_chunks(path, file_index, raw, blocks, skip, cursor):
    """Paragraphs (runs of non-blank lines) are cut here, where the lines are seen in order; a line is
    blank when nothing but whitespace is left after normalising it."""
    docs, size, first, lines, end, n = [], 0, skip, [], 0, 0
    for n, raw_line in enumerate(_logical_lines(blocks), 1):
        if n <= skip:
            continue
        cursor.where = f"at line {n}"
        text = llm8_data.normalize_text(decode_utf8(raw_line, path, n))
        if text.strip():
            lines.append(text)
            end = n
            continue
        if lines:
            docs.append(("\n".join(lines).strip(), end))
            size += len(docs[-1][0])
            lines = []
        if size >= CHUNK_BYTES:
            yield Chunk(path, file_index, "docs", docs, first, n, raw.bytes)
            docs, size, first = [], 0, n
    if lines:
        docs.append(("\n".join(lines).strip(), end))
    yield Chunk(path, file_index, "docs", docs, first, max(n, first), raw.bytes, raw.sha256.hexdigest())


def _whole_txt_chunks(path, file_index, raw, blocks, skip, cursor):
    data = b"".join(blocks)
    yield Chunk(path, file_index, "txt", b"" if skip else data, min(skip, 1), 1, raw.bytes,
                raw.sha256.hexdigest())


def _open_parquet(path, text_key):
    import pyarrow as pa
    import pyarrow.parquet as pq
    try:
        pf = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as e:
        raise DataError(f"{path}: not a readable parquet file ({one_line(e)})") from None
    schema = pf.schema_arrow
    if text_key not in schema.names:
        raise DataError(f"{path}: no column {text_key!r} (columns: {', '.join(schema.names)}; see --text-key)")
    kind = schema.field(text_key).type
    if kind not in (pa.string(), pa.large_string()):
        raise DataError(f"{path}: column {text_key!r} holds {kind}, not strings")
    return pf


def _parquet_chunks(path, file_index, skip, text_key, cursor):
    """Batches of rows of one row group at a time (pyarrow decodes a column chunk whole), each batch
    about CHUNK_BYTES of text by the row group's statistics."""
    import pyarrow as pa
    sha256 = llm8_data.sha256_of(path)      # pyarrow reads the footer first and seeks: hashed on its own
    pf = _open_parquet(path, text_key)
    meta, column = pf.metadata, pf.schema_arrow.get_field_index(text_key)
    size, total, row = Path(path).stat().st_size, max(1, pf.metadata.num_rows), 0
    for g in range(meta.num_row_groups):
        rows = meta.row_group(g).num_rows
        if row + rows <= skip:
            row += rows
            continue
        cursor.where = f"in row group {g} (rows {row}-{row + rows - 1})"
        text_bytes = max(1, meta.row_group(g).column(column).total_uncompressed_size)
        batch_rows = max(1, CHUNK_BYTES * rows // text_bytes)
        try:
            for batch in pf.iter_batches(batch_size=batch_rows, row_groups=[g], columns=[text_key],
                                         use_threads=False):
                values, start = batch.column(0).to_pylist(), row
                row += len(values)
                if row > skip:
                    values = values[max(0, skip - start):]
                    yield Chunk(path, file_index, "values", values, max(start, skip), row, size * row // total)
        except (pa.ArrowException, UnicodeDecodeError) as e:
            raise DataError(f"{path}: {cursor.where}: corrupt parquet data ({one_line(e)})") from None
    yield Chunk(path, file_index, "values", [], row, row, size, sha256)


def file_chunks(path, file_index, skip, split_paragraphs, text_key):
    """The Chunks of the file `path` after its first `skip` records. A reading error ends the file with a
    Chunk carrying it, so it is reported in stream order, after the documents before it."""
    path = str(path)
    kind, compression = input_format(path)
    cursor = _Cursor()
    try:
        if kind == "parquet":
            yield from _parquet_chunks(path, file_index, skip, text_key, cursor)
            return
        reader = (_jsonl_chunks if kind == "jsonl" else
                  _paragraph_chunks if split_paragraphs else _whole_txt_chunks)
        with open(path, "rb") as f:
            raw = _HashingReader(f)
            yield from reader(path, file_index, raw, _blocks(raw, compression), skip, cursor)
    except DataError as e:
        yield Chunk(path, file_index, "docs", [], 0, 0, 0, error=str(e))
    except READ_ERRORS as e:
        yield Chunk(path, file_index, "docs", [], 0, 0, 0,
                    error=f"{path}: corrupt or unreadable {cursor.where} ({one_line(e)})")


def chunks(paths, start, split_paragraphs, text_key):
    """The Chunks of the files `paths` from `start` = (file index, records to skip in that file) on."""
    first_file, skip = start
    for i in range(first_file, len(paths)):
        yield from file_chunks(paths[i], i, skip if i == first_file else 0, split_paragraphs, text_key)


# ----------------------------------------------------------------------------------------------------
# parsing (worker processes)

def _jsonl_values(chunk, text_key):
    """(value of text_key, line) of each non-blank line."""
    lines = chunk.payload.split(b"\n")
    if not lines[-1]:
        lines.pop()
    for n, line in enumerate(lines, chunk.first + 1):
        where = f"{chunk.path}:{n}"
        if line.startswith(UTF8_BOM):   # the start of a file, or of one of several concatenated
            line = line[len(UTF8_BOM):]
        text = decode_utf8(line, chunk.path, n)
        if not text.strip():
            continue
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as e:
            raise DataError(f"{where}: malformed JSON ({e.msg}, column {e.colno})") from None
        if not isinstance(obj, dict):
            raise DataError(f"{where}: expected a JSON object, got {type(obj).__name__}")
        if text_key not in obj:
            raise DataError(f"{where}: no {text_key!r} key (see --text-key)")
        value = obj[text_key]
        if isinstance(value, str) and not value.isascii():
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:      # JSON's \ud800-style escapes can name lone surrogates
                raise DataError(f"{where}: {text_key!r} is not valid Unicode (a lone surrogate)") from None
        yield value, n, where


def _values(chunk, text_key):
    """(value, end record, where) of each record of the chunk, for the kinds parsed here."""
    if chunk.kind == "jsonl":
        yield from _jsonl_values(chunk, text_key)
    elif chunk.kind == "txt":
        if chunk.payload:
            yield decode_utf8(chunk.payload, chunk.path, 1), 1, chunk.path
    elif chunk.kind == "values":
        for row, value in enumerate(chunk.payload, chunk.first):
            yield value, row + 1, f"{chunk.path}: row {row}"


def parse(chunk, text_key):
    """The documents of a chunk: ([document], [end record of each], error or None). Documents before an
    error are returned with it."""
    docs, ends = [], []
    if chunk.kind == "docs":        # paragraphs, normalised where they were cut
        docs = [doc for doc, _ in chunk.payload if doc]
        ends = [end for doc, end in chunk.payload if doc]
        return docs, ends, chunk.error
    try:
        for value, end, where in _values(chunk, text_key):
            if not isinstance(value, str):
                kind = "null" if value is None else type(value).__name__
                raise DataError(f"{where}: {text_key!r} is {kind}, not a string")
            if doc := llm8_data.normalize_text(value).strip():
                docs.append(doc)
                ends.append(end)
    except DataError as e:
        return docs, ends, str(e)
    return docs, ends, chunk.error


def read_documents(path, split_paragraphs=False, text_key="text"):
    """The documents of one file, in order, in this process; raises DataError on bad input."""
    for chunk in file_chunks(path, 0, 0, split_paragraphs, text_key):
        docs, _, error = parse(chunk, text_key)
        yield from docs
        if error:
            raise DataError(error)
