"""
Tokenize tiny-shakespeare with the Llama-2 tokenizer into llm.c shards for `make train` and the tests.

Documents are the paragraphs of the text (split on blank lines, normalised as every input of the data
scripts is: llm8_data.normalize_text), each prefixed with BOS. The first 10%
of documents, in order, are the validation split, the rest train. Writes tiny_shakespeare_val.bin,
tiny_shakespeare_train.bin and tokenizer.bin into --out; does nothing if those are newer than the inputs.
"""
import os
import sys

# dev/data/tokenize.py would shadow the standard library's `tokenize` (imported by numpy through
# inspect -> linecache), so this folder must not be first on sys.path; keep it last for llm8_data.
_HERE = os.path.dirname(os.path.abspath(__file__))
if sys.path and os.path.abspath(sys.path[0] or os.curdir) == _HERE:
    sys.path.append(sys.path.pop(0))

import argparse  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

import llm8_corpus  # noqa: E402
import llm8_data  # noqa: E402

VAL_FRACTION = 0.1
OUTPUT_NAMES = ("tiny_shakespeare_val.bin", "tiny_shakespeare_train.bin", "tokenizer.bin")


def up_to_date(outputs, inputs):
    """True if every output exists and is newer than every input."""
    if not all(p.is_file() for p in outputs):
        return False
    return min(p.stat().st_mtime for p in outputs) > max(p.stat().st_mtime for p in inputs)


def tokenize_documents(sp, docs):
    """Token ids of each document, BOS first, as one int array per document."""
    bos = sp.bos_id()
    return [np.array([bos] + ids, dtype=np.int64) for ids in sp.encode(docs)]


def main():
    parser = argparse.ArgumentParser(description=__doc__.strip(),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--input", type=Path, help="tiny-shakespeare input.txt "
                        f"(default: found by llm8_data.resolve_data_file, ${llm8_data.DATA_DIR_ENV})")
    parser.add_argument("--tokenizer", type=Path, help="Llama-2 SentencePiece tokenizer.model "
                        "(default: found like --input)")
    parser.add_argument("--out", type=Path, default=llm8_data.REPO_ROOT / "dev/data/tinyshakespeare",
                        help="output folder (default: %(default)s)")
    args = parser.parse_args()
    try:
        input_path = args.input or llm8_data.resolve_data_file("tinyshakespeare")
        model_path = args.tokenizer or llm8_data.resolve_data_file("tokenizer")
        for p in (input_path, model_path):
            if not p.is_file():
                raise llm8_data.DataError(f"{p} not found")
        outputs = [args.out / name for name in OUTPUT_NAMES]
        scripts = [Path(__file__).resolve(), Path(llm8_data.__file__).resolve(),
                   Path(llm8_corpus.__file__).resolve()]
        if up_to_date(outputs, [input_path, model_path] + scripts):
            print(f"skipped: {args.out} is newer than its inputs")
            return
        sp = llm8_data.load_tokenizer(model_path)
        docs = list(llm8_corpus.read_documents(input_path, split_paragraphs=True))
        if len(docs) < 2:
            raise llm8_data.DataError(f"{input_path}: need at least 2 paragraphs, found {len(docs)}")
        n_val = max(1, int(len(docs) * VAL_FRACTION))
        encoded = tokenize_documents(sp, docs)
        val = np.concatenate(encoded[:n_val])
        train = np.concatenate(encoded[n_val:])
        args.out.mkdir(parents=True, exist_ok=True)
        llm8_data.write_shard(outputs[0], val)
        llm8_data.write_shard(outputs[1], train)
        llm8_data.export_tokenizer(model_path, outputs[2])
    except (llm8_data.DataError, OSError, ValueError) as e:
        sys.exit(f"{os.path.basename(sys.argv[0])}: error: {e}")
    print(f"{len(docs)} documents: val {n_val} documents, {val.size:,} tokens -> {outputs[0]}")
    print(f"train {len(docs) - n_val} documents, {train.size:,} tokens -> {outputs[1]}")
    print(f"decode table ({sp.get_piece_size()} pieces) -> {outputs[2]}")


if __name__ == "__main__":
    main()
