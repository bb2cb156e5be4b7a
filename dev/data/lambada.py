"""
Tokenize LAMBADA's test set (OpenAI's version, as lm-evaluation-harness's lambada_openai) with the
Llama-2 tokenizer into llm8's continuation eval file (kind 1), for the trainer's --eval-lambada.

INPUT is lambada_test.jsonl, one {"text": passage} per line; without it, the file is downloaded into
dev/data/cache/ from https://openaipublic.blob.core.windows.net/gpt-2/data/lambada_test.jsonl.

Each passage is split at its last space, as lm-evaluation-harness's lambada_openai task
(lm_eval/tasks/lambada/lambada_openai.yaml): the context is what comes before, the target the last word.
Tokens (llm8_evals.encode_pair): the target " " + word is tokenized jointly with the context, its tokens
those of sp.encode(context + " " + word) after the context's; --eval-compat harness (the default) moves
spaces that end the context onto the target, llm8 puts BOS before the context. A record's n_words is 1
and n_bytes the word's UTF-8 bytes. The file format is in dev/data/llm8_evals.py.
"""
import os
import sys

# dev/data/tokenize.py would shadow the standard library's `tokenize` (imported by numpy through
# inspect -> linecache), so this folder must not be first on sys.path; keep it last for llm8_data.
_HERE = os.path.dirname(os.path.abspath(__file__))
if sys.path and os.path.abspath(sys.path[0] or os.curdir) == _HERE:
    sys.path.append(sys.path.pop(0))

import llm8_data  # noqa: E402
import llm8_evals  # noqa: E402
from llm8_data import DataError  # noqa: E402

URL = "https://openaipublic.blob.core.windows.net/gpt-2/data/lambada_test.jsonl"
CACHE_NAME = "lambada_test.jsonl"
DEFAULT_OUT = llm8_data.REPO_ROOT / "dev/data/lambada/lambada_test.bin"


def split_passage(path, number, obj):
    """(context, last word) of one LAMBADA line; DataError naming the file and line when there is no
    word to split off."""
    text = llm8_evals.require_str(path, number, obj, "text")
    parts = text.rsplit(" ", 1)
    if len(parts) != 2 or not parts[1]:
        raise DataError(f"{path}:{number}: 'text' has no last word after a space")
    return parts[0], parts[1]


def make_record(sp, path, number, index, context, word, compat):
    """The record write_continuations takes for `compat`: the context ids, the word tokenized jointly
    (llm8_evals.encode_pair)."""
    ctx_ids, target = llm8_evals.encode_pair(sp, context, " " + word, compat)
    if not ctx_ids:
        raise DataError(f"{path}:{number}: example {index}: the context is only whitespace")
    if not target:
        raise DataError(f"{path}:{number}: example {index}: the last word {word!r} adds no tokens to the context")
    return {"context": ctx_ids, "target": target, "n_words": 1,
            "n_bytes": len(word.encode("utf-8"))}


def main():
    parser = llm8_evals.arg_parser(__doc__, f"LAMBADA jsonl (default: download {CACHE_NAME})", DEFAULT_OUT)
    args = parser.parse_args()
    try:
        path = args.input or llm8_evals.fetch_input(
            URL, CACHE_NAME, llm8_evals.offline_hint("lambada.py", "PATH/lambada_test.jsonl"))
        rows = llm8_evals.read_jsonl(path, args.limit)
        sp = llm8_evals.load_tokenizer(args.tokenizer)
        records = [make_record(sp, path, number, index, *split_passage(path, number, obj), args.eval_compat)
                   for index, (number, obj) in enumerate(rows)]
        llm8_evals.write_continuations(args.out, llm8_evals.KIND_LAMBADA, sp.bos_id(), records, sp.vocab_size(),
                                       args.eval_compat)
    except (DataError, OSError) as e:
        llm8_evals.fail(e)
    print(f"{len(records)} LAMBADA passages (--eval-compat {args.eval_compat}) -> {args.out}")


if __name__ == "__main__":
    main()
