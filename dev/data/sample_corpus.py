"""
Write a small generated corpus in every input format of dev/data/tokenize.py: docs/data.md's worked example,
the tests and dev/data/bench_tokenize.py use it.

--out DIR receives the same documents as sample.txt (paragraphs: use --split-paragraphs), sample.jsonl,
sample.jsonl.gz, sample.jsonl.zst and sample.parquet, and mix/{web,code,books}/, three sources of
different kinds of text for a --mix example. The text is random words, not language: it exercises the
formats and gives realistic token counts, nothing more.
"""
import os
import sys

# dev/data/tokenize.py would shadow the standard library's `tokenize` (imported by numpy through
# inspect -> linecache), so this folder must not be first on sys.path.
_HERE = os.path.dirname(os.path.abspath(__file__))
if sys.path and os.path.abspath(sys.path[0] or os.curdir) == _HERE:
    sys.path.append(sys.path.pop(0))

import argparse  # noqa: E402
import gzip  # noqa: E402
import json  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import zstandard  # noqa: E402

WORDS = ("the of and to in is was for that on as with by he it at from his an were are which this be "
         "or has had first one their its after new who they two her she been other when there all also "
         "into during time would more may over some most years only would school city world year state "
         "between about people under music made game several later known where film these while many "
         "through river house since season team part such early against called both well american "
         "Zürich naïve café façade ĳssel Øresund Ελλάδα Москва 東京 北京 서울 😀 ≈ → € — “quoted” "
         "data model token learning paper train value number 1984 2024 3.14 42 100,000").split()
CODE_WORDS = ("def return if else for in range import from class self None True False while print "
              "x y i j n len append dict list str int float = == += ( ) [ ] { } : , . -> # ' \"").split()
ZSTD_LEVEL = 3


def words_text(rng, words, n_words, line_words):
    """`n_words` random words, a line break every `line_words`."""
    picked = rng.choice(words, size=n_words)
    lines = [" ".join(picked[i:i + line_words]) for i in range(0, n_words, line_words)]
    return "\n".join(lines)


def web_document(rng):
    return words_text(rng, WORDS, int(rng.integers(20, 300)), int(rng.integers(8, 40)))


def code_document(rng):
    return words_text(rng, CODE_WORDS, int(rng.integers(30, 200)), int(rng.integers(4, 12)))


def book_document(rng):
    return words_text(rng, WORDS, int(rng.integers(500, 2000)), 15)


def write_documents(path, docs, text_key="text", row_group_size=100):
    """Write `docs` to `path` in the format its suffix names (.txt: paragraphs separated by blank lines,
    so no document may hold one; .jsonl, .jsonl.gz, .jsonl.zst; .parquet with row groups of
    `row_group_size`). .zst files are two frames with checksums, as `zstd` and `pzstd` write them."""
    path = Path(path)
    name = path.name.removesuffix(".gz").removesuffix(".zst")
    if name.endswith(".parquet"):
        import pyarrow as pa
        import pyarrow.parquet as pq
        pq.write_table(pa.table({"id": list(range(len(docs))), text_key: list(docs)}), path,
                       row_group_size=row_group_size)
        return path
    if name.endswith(".txt"):
        data = "".join(doc + "\n\n" for doc in docs).encode("utf-8")
    else:
        data = "".join(json.dumps({"id": i, text_key: doc}, ensure_ascii=False) + "\n"
                       for i, doc in enumerate(docs)).encode("utf-8")
    if path.name.endswith(".gz"):
        data = gzip.compress(data)
    elif path.name.endswith(".zst"):
        half = data.rfind(b"\n", 0, len(data) // 2) + 1
        compressor = zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_checksum=True)
        data = compressor.compress(data[:half]) + compressor.compress(data[half:])
    path.write_bytes(data)
    return path


def write_sample(out, n_docs, seed):
    """The sample corpus (see the module's docstring) in `out`; returns its documents."""
    rng = np.random.default_rng(seed)
    docs = [web_document(rng) for _ in range(n_docs)]
    out.mkdir(parents=True, exist_ok=True)
    for suffix in (".txt", ".jsonl", ".jsonl.gz", ".jsonl.zst", ".parquet"):
        write_documents(out / f"sample{suffix}", docs)
    for source, make, suffix, files, docs_per_file in (("web", web_document, ".jsonl.zst", 4, n_docs // 4),
                                                       ("code", code_document, ".parquet", 2, n_docs // 4),
                                                       ("books", book_document, ".txt", 3, n_docs // 60)):
        (out / "mix" / source).mkdir(parents=True, exist_ok=True)
        for k in range(files):
            write_documents(out / "mix" / source / f"{source}_{k:02d}{suffix}",
                            [make(rng) for _ in range(max(1, docs_per_file))])
    return docs


def main():
    parser = argparse.ArgumentParser(description=__doc__.strip(),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="output folder")
    parser.add_argument("--docs", type=int, default=2000, help="documents per format (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the text (default: %(default)s)")
    args = parser.parse_args()
    write_sample(args.out, args.docs, args.seed)
    for path in sorted(args.out.rglob("*")):
        if path.is_file():
            print(f"{path.stat().st_size:>10,} {path}")


if __name__ == "__main__":
    main()
