"""
A multiple-choice set in HellaSwag's fields from tiny-shakespeare's validation split, for trying the
HellaSwag evaluation (`-h 1`) where HellaSwag itself cannot be downloaded; docs/evaluation.md.

Each example is one speech of the validation paragraphs (the first 10%, as dev/data/tinyshakespeare.py
splits them): the speaker is the activity label, the speech without its last line (its last 300
characters) the context, and the endings are that last line and three other lines of the split, drawn
with --seed. Writes JSON lines for dev/data/hellaswag.py:

    python dev/data/shakespeare_cloze.py --out /tmp/cloze.jsonl
    python dev/data/hellaswag.py /tmp/cloze.jsonl --out /tmp/cloze.bin
"""
import os
import sys

# dev/data/tokenize.py would shadow the standard library's `tokenize`, so this folder must not be first on
# sys.path; keep it last for llm8_data.
_HERE = os.path.dirname(os.path.abspath(__file__))
if sys.path and os.path.abspath(sys.path[0] or os.curdir) == _HERE:
    sys.path.append(sys.path.pop(0))

import argparse  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
from pathlib import Path  # noqa: E402

import llm8_data  # noqa: E402

VAL_FRACTION = 0.1      # as tinyshakespeare.py
CONTEXT_CHARS = 300
MIN_WORDS = 4           # a line shorter than this is too easy to tell apart


def cloze_examples(text, seed):
    """The examples (HellaSwag's fields) of tiny-shakespeare's `text`, in order."""
    paragraphs = [p for p in text.split("\n\n") if p.strip()]
    val = paragraphs[:int(len(paragraphs) * VAL_FRACTION)]
    lines = [line for p in val for line in p.split("\n")[1:] if len(line.split()) >= MIN_WORDS]
    rng = random.Random(seed)
    examples = []
    for p in val:
        speaker, *speech = p.split("\n")
        if len(speech) < 3 or len(speech[-1].split()) < MIN_WORDS:
            continue
        true = speech[-1]
        endings = [true] + rng.sample([line for line in lines if line != true], 3)
        rng.shuffle(endings)
        examples.append({"activity_label": speaker.rstrip(":"), "ctx_a": " ".join(speech[:-1])[-CONTEXT_CHARS:],
                         "ctx_b": "", "endings": endings, "label": endings.index(true)})
    return examples


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="the JSON lines file to write")
    parser.add_argument("--seed", type=int, default=7, help="seed of the wrong endings' draw")
    args = parser.parse_args(argv)
    try:
        text = Path(llm8_data.resolve_data_file("tinyshakespeare")).read_text(encoding="utf-8")
    except llm8_data.DataError as e:
        sys.exit(f"error: {e}")
    examples = cloze_examples(text, args.seed)
    Path(args.out).write_text("".join(json.dumps(e) + "\n" for e in examples), encoding="utf-8")
    print(f"{len(examples)} examples -> {args.out}")


if __name__ == "__main__":
    main()
