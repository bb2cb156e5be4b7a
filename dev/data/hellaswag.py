"""
Tokenize HellaSwag's validation set with the Llama-2 tokenizer into llm.c's eval file, for the trainer's
-h 1 (train/evals.h).

INPUT is a JSON-lines file with HellaSwag's fields (activity_label, ctx_a, ctx_b, endings: 4 strings,
label: 0..3); without it, hellaswag_val.jsonl is downloaded into dev/data/cache/ from
https://raw.githubusercontent.com/rowanz/hellaswag/master/data/hellaswag_val.jsonl.

Text, as lm-evaluation-harness's hellaswag task (lm_eval/tasks/hellaswag/utils.py): the context is
"activity_label: ctx_a Ctx_b" and each ending the ending itself, both preprocessed (strip, " [title]" ->
". ", [...] tags removed, double spaces made single). Tokens (llm8_evals.encode_pair): each ending
" " + ending is tokenized jointly with the context, its tokens those of sp.encode(context + " " + ending)
after the context's; --eval-compat harness (the default) moves spaces that end the context onto the
endings and stores each ending's characters (acc_norm's length), llm8 puts BOS before the context. The
file format is in dev/data/llm8_evals.py; an example's index is its position in INPUT.
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

URL = "https://raw.githubusercontent.com/rowanz/hellaswag/master/data/hellaswag_val.jsonl"
CACHE_NAME = "hellaswag_val.jsonl"
DEFAULT_OUT = llm8_data.REPO_ROOT / "dev/data/hellaswag/hellaswag_val.bin"
N_ENDINGS = 4


def parse_example(path, number, obj):
    """(context text, [ending texts], label) of one HellaSwag line, preprocessed; DataError naming the
    file and line when a field is missing or wrong."""
    activity_label, ctx_a, ctx_b = (llm8_evals.require_str(path, number, obj, f)
                                    for f in ("activity_label", "ctx_a", "ctx_b"))
    for field in ("endings", "label"):
        if field not in obj:
            raise DataError(f"{path}:{number}: missing field {field!r}")
    endings = obj["endings"]
    if not (isinstance(endings, list) and len(endings) == N_ENDINGS and all(isinstance(e, str) for e in endings)):
        raise DataError(f"{path}:{number}: 'endings' must be a list of {N_ENDINGS} strings")
    label = obj["label"]
    try:
        label = int(label) if not isinstance(label, bool) else None
    except (TypeError, ValueError):
        label = None
    if label is None or not 0 <= label < N_ENDINGS:
        raise DataError(f"{path}:{number}: 'label' is {obj['label']!r}, not 0..{N_ENDINGS - 1}")
    context = llm8_evals.hellaswag_context(activity_label, ctx_a, ctx_b)
    return context, [llm8_evals.hellaswag_preprocess(e) for e in endings], label


def tokenize_example(sp, path, number, index, context, endings, label, compat):
    """The example as write_evalfile takes it for `compat`: the context ids, each ending tokenized jointly
    (llm8_evals.encode_pair), and for harness each ending's characters."""
    ctx_ids, ending_ids = None, []
    for c, ending in enumerate(endings):
        ctx_ids, ids = llm8_evals.encode_pair(sp, context, " " + ending, compat)
        if not ctx_ids:
            raise DataError(f"{path}:{number}: example {index}: the context is only whitespace")
        if not ids:
            raise DataError(f"{path}:{number}: example {index}: ending {c} ({ending!r}) adds no tokens "
                            "to the context")
        if compat == "harness" and not ending:
            raise DataError(f"{path}:{number}: example {index}: ending {c} is empty (acc_norm divides by its length)")
        ending_ids.append(ids)
    example = {"label": label, "context": ctx_ids, "endings": ending_ids}
    if compat == "harness":
        example["chars"] = [len(e) for e in endings]  # the harness's acc_norm: len(choice), in characters
    return example


def main():
    parser = llm8_evals.arg_parser(__doc__, f"HellaSwag jsonl (default: download {CACHE_NAME})", DEFAULT_OUT)
    args = parser.parse_args()
    try:
        path = args.input or llm8_evals.fetch_input(
            URL, CACHE_NAME, llm8_evals.offline_hint("hellaswag.py", "PATH/hellaswag_val.jsonl"))
        rows = llm8_evals.read_jsonl(path, args.limit)
        sp = llm8_evals.load_tokenizer(args.tokenizer)
        examples = [tokenize_example(sp, path, number, index, *parse_example(path, number, obj), args.eval_compat)
                    for index, (number, obj) in enumerate(rows)]
        longest = llm8_evals.write_evalfile(args.out, examples, sp.vocab_size(), args.eval_compat)
    except (DataError, OSError) as e:
        llm8_evals.fail(e)
    print(f"{len(examples)} HellaSwag examples (longest {longest} bytes, --eval-compat {args.eval_compat}) -> {args.out}")


if __name__ == "__main__":
    main()
