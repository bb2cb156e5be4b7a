"""
Tokenize WikiText-2's raw test split with the Llama-2 tokenizer into llm8's continuation eval file
(kind 2), for the trainer's --eval-wikitext (word and byte perplexity, as lm-evaluation-harness's
wikitext task).

INPUT is wiki.test.raw, or wikitext-2-raw-v1.zip holding wikitext-2-raw/wiki.test.raw; without it, the
zip is downloaded into dev/data/cache/ from
https://s3.amazonaws.com/research.metamind.io/wikitext/wikitext-2-raw-v1.zip.

The split is cut into pages at its level-1 headings (" = Title = " lines; " = = Sub = = " stays in its
page), each page running from its heading to the next, lines as they are. A record per page: n_words
(re.split(r"\\s+")) and n_bytes (UTF-8) of the original page; no context (n_context = 0: the scorer
starts the first window after the header's BOS); the target sp.encode(detokenized page), no BOS. The
detokenizer (llm8_evals.wikitext_detokenize) undoes WikiText's artefacts (" @-@ " -> "-", spaces before
punctuation and inside brackets, "= =" heading runs): --eval-compat harness (the default) by
lm-evaluation-harness's wikitext_detokenizer, rule by rule; llm8 by llm8's own shorter rules, which also
drop the spaces that start and end every line. The file format is in dev/data/llm8_evals.py.
"""
import os
import sys

# dev/data/tokenize.py would shadow the standard library's `tokenize` (imported by numpy through
# inspect -> linecache), so this folder must not be first on sys.path; keep it last for llm8_data.
_HERE = os.path.dirname(os.path.abspath(__file__))
if sys.path and os.path.abspath(sys.path[0] or os.curdir) == _HERE:
    sys.path.append(sys.path.pop(0))

import zipfile  # noqa: E402

import llm8_data  # noqa: E402
import llm8_evals  # noqa: E402
from llm8_data import DataError  # noqa: E402

URL = "https://s3.amazonaws.com/research.metamind.io/wikitext/wikitext-2-raw-v1.zip"
CACHE_NAME = "wikitext-2-raw-v1.zip"
ZIP_MEMBER = "wikitext-2-raw/wiki.test.raw"
DEFAULT_OUT = llm8_data.REPO_ROOT / "dev/data/wikitext/wikitext2_test.bin"


def read_split(path):
    """The text of wiki.test.raw, from the file itself or from the zip holding it."""
    if zipfile.is_zipfile(path):
        return llm8_evals.read_zip_member(path, ZIP_MEMBER)
    return llm8_evals.read_text(path)


def make_record(sp, path, index, page, compat):
    """The record write_continuations takes for one original page under `compat`."""
    target = sp.encode(llm8_evals.wikitext_detokenize(page, compat))
    if not target:
        raise DataError(f"{path}: page {index} has no tokens")
    n_words, n_bytes = llm8_evals.wikitext_counts(page)
    return {"context": [], "target": target, "n_words": n_words, "n_bytes": n_bytes}


def main():
    parser = llm8_evals.arg_parser(__doc__, f"wiki.test.raw or {CACHE_NAME} (default: download the zip)",
                                   DEFAULT_OUT)
    args = parser.parse_args()
    try:
        path = args.input or llm8_evals.fetch_input(
            URL, CACHE_NAME, llm8_evals.offline_hint("wikitext.py", "PATH/wiki.test.raw (or the zip)"))
        pages = llm8_evals.wikitext_pages(read_split(path), path)[:args.limit]
        sp = llm8_evals.load_tokenizer(args.tokenizer)
        records = [make_record(sp, path, index, page, args.eval_compat) for index, page in enumerate(pages)]
        llm8_evals.write_continuations(args.out, llm8_evals.KIND_WIKITEXT, sp.bos_id(), records, sp.vocab_size(),
                                       args.eval_compat)
    except (DataError, OSError) as e:
        llm8_evals.fail(e)
    n_tokens = sum(len(r["target"]) for r in records)
    print(f"{len(records)} WikiText pages, {n_tokens:,} tokens (--eval-compat {args.eval_compat}) -> {args.out}")


if __name__ == "__main__":
    main()
