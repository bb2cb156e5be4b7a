"""
Tests of the downstream-evaluation data scripts (dev/data/hellaswag.py, lambada.py, wikitext.py) and
their formats (dev/data/llm8_evals.py), in both --eval-compat modes. Inputs are tiny hand-written files in
the public sets' formats; the outputs are read by readers written here from the format descriptions (not
llm8_evals'), and their content checked against texts written out by hand: the preprocessed HellaSwag
contexts and endings, the LAMBADA passages, the WikiText pages detokenized by each mode's rules and their
original word and byte counts. Uses the real Llama-2 tokenizer. dev/test/test_eval_parity.py scores the
harness mode's files against lm-evaluation-harness's rules end to end.
"""
import importlib
import json
import os
import re
import struct
import subprocess
import sys
import zipfile

import numpy as np
import pytest

from conftest import requires_data
from data_helpers import BOS, REPO, run_script

import llm8_evals  # noqa: E402  (dev/data, appended to sys.path by data_helpers)

pytestmark = requires_data

# --------------------------------------------------------------------------------------------------
# inputs and what they must become

HELLASWAG = [
    {"activity_label": "Cooking", "ctx_a": "A man pours flour into a bowl.", "ctx_b": "he",
     "endings": ["adds two eggs and stirs.", "it", "throws the bowl [title] at the wall.", "sings to the flour."],
     "label": 1, "ind": 7},
    {"activity_label": "Baking", "ctx_a": "[header] How to bake bread [title] Preheat the oven.",
     "ctx_b": "mix the flour [substeps] with water.",
     "endings": ["Knead the dough [step] for ten minutes.", "Eat it.", "Sell the oven.", " Bake a gâteau. "],
     "label": 0},
    {"activity_label": "Sailing", "ctx_a": "The boat leaves the café at noon.", "ctx_b": "the NASA crew",
     "endings": ["waves.", "sails away from the harbour.", "sinks.", "sings a song."], "label": "3"},
]
# lm-evaluation-harness's preprocessing, done by hand: "label: ctx_a Ctx_b" (str.capitalize lowers the
# rest), " [title]" -> ". ", tags dropped, double spaces made single
HELLASWAG_EXPECTED = [
    ("Cooking: A man pours flour into a bowl. He",
     ["adds two eggs and stirs.", "it", "throws the bowl. at the wall.", "sings to the flour."], 1),
    ("Baking: How to bake bread. Preheat the oven. Mix the flour with water.",
     ["Knead the dough for ten minutes.", "Eat it.", "Sell the oven.", "Bake a gâteau."], 0),
    ("Sailing: The boat leaves the café at noon. The nasa crew",
     ["waves.", "sails away from the harbour.", "sinks.", "sings a song."], 3),
]
LAMBADA = ["The ship left the harbour at dawn and the crowd watched the ship",
           "He spoke of Rome and of the people, and they called him Coriolanus",
           "She said the idea was charming but naïve"]
WIKI_PAGES = [
    " = Alpha Ship = \n"
    "\n"
    " The Alpha Ship was built in 1901 @-@ 02 for 1 @,@ 200 sailors , and it sailed at 3 @.@ 5 knots . \n"
    "\n"
    " = = Service = = \n"
    "\n"
    " It served ( mostly ) in the north ; the crew 's songs were \" loud \" . It did n't sink ! \n"
    "\n",
    " = Beta Town = \n"
    "\n"
    " Beta is a town of 4 @,@ 000 people and a café . \n"
    "\n"
    " = = History = = \n"
    "\n"
    " = = = Early years = = = \n"
    "\n"
    " Founded in 1850 @-@ 60 , it grew : slowly . \n"
    "\n",
]
WIKI_RAW = " \n\n" + "".join(WIKI_PAGES)   # the real file starts with " \n" too
# llm8's rules, and lm-evaluation-harness's (which keep the space that opens a page and "n't")
WIKI_DETOKENIZED = [
    "= Alpha Ship =\n\nThe Alpha Ship was built in 1901-02 for 1,200 sailors, and it sailed at 3.5 knots.\n\n"
    "== Service ==\n\nIt served (mostly) in the north; the crew's songs were \"loud\". It didn't sink!\n\n",
    "= Beta Town =\n\nBeta is a town of 4,000 people and a café.\n\n== History ==\n\n=== Early years ===\n\n"
    "Founded in 1850-60, it grew: slowly.\n\n",
]
WIKI_HARNESS = [
    " = Alpha Ship =\n\nThe Alpha Ship was built in 1901-02 for 1,200 sailors, and it sailed at 3.5 knots.\n\n"
    "== Service ==\n\nIt served (mostly) in the north; the crew's songs were \"loud\". It did n't sink!\n\n",
    " = Beta Town =\n\nBeta is a town of 4,000 people and a café.\n\n== History ==\n\n=== Early years ===\n\n"
    "Founded in 1850-60, it grew: slowly.\n\n",
]
ZIP_MEMBER = "wikitext-2-raw/wiki.test.raw"


def jsonl(rows):
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode()


def write_zip(path, members):
    with zipfile.ZipFile(path, "w") as z:
        for name, text in members.items():
            z.writestr(name, text)
    return path


# --------------------------------------------------------------------------------------------------
# readers written from the format descriptions (llm8_evals.py's banner)

def read_mc_raw(path):
    """llm.c's eval file: (header, [(index, label, nbytes, context, endings)]); asserts the structure (a
    harness file's character counts not included)."""
    data = path.read_bytes()
    header = struct.unpack("<256i", data[:1024])
    words = struct.unpack(f"<{(len(data) - 1024) // 2}H", data[1024:])
    assert 2 * len(words) == len(data) - 1024
    if header[4] == 1:  # harness: the endings' character counts end the file
        words = words[:len(words) - header[5]]
    examples, at = [], 0
    for _ in range(header[2]):
        start, nbytes, index, label, n_endings, n_ctx = words[at:at + 6]
        assert start == 65535
        end = at + nbytes // 2
        at += 6
        context = list(words[at:at + n_ctx])
        at += n_ctx
        endings = []
        for _ in range(n_endings):
            n = words[at]
            endings.append(list(words[at + 1:at + 1 + n]))
            at += 1 + n
        assert at == end, "EXAMPLE_BYTES does not match the example's stream"
        examples.append((index, label, nbytes, context, endings))
    assert at == len(words), "bytes after the last example"
    return header, examples


def read_cont_raw(path):
    """llm8's continuation file: (header, [(context, target, n_words, n_bytes)]); asserts the structure."""
    data = path.read_bytes()
    header = struct.unpack("<256i", data[:1024])
    words = np.frombuffer(data[1024:], dtype="<i4").tolist()
    records, at = [], 0
    for _ in range(header[3]):
        n_ctx, n_tgt, n_words, n_bytes = words[at:at + 4]
        at += 4
        records.append((words[at:at + n_ctx], words[at + n_ctx:at + n_ctx + n_tgt], n_words, n_bytes))
        at += n_ctx + n_tgt
    assert at == len(words), "bytes after the last record"
    return header, records


# --------------------------------------------------------------------------------------------------
# the scripts on good input

@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    d = tmp_path_factory.mktemp("eval_inputs")
    (d / "hellaswag.jsonl").write_bytes(jsonl(HELLASWAG))
    (d / "lambada.jsonl").write_bytes(jsonl([{"text": t} for t in LAMBADA]))
    (d / "wiki.test.raw").write_text(WIKI_RAW, encoding="utf-8")
    write_zip(d / "wikitext-2-raw-v1.zip", {"wikitext-2-raw/wiki.train.raw": " = Other = \n", ZIP_MEMBER: WIKI_RAW})
    return d


def run_ok(script, src, out, *args, compat="llm8"):
    r = run_script(script, src, "--out", out, "--eval-compat", compat, *args)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 1 and str(out) in lines[0], r.stdout
    assert not out.with_name(out.name + ".tmp").exists()
    return lines[0]


@pytest.fixture(scope="module")
def outputs(inputs):
    out = {}
    for name, script, src in [("hellaswag", "hellaswag.py", "hellaswag.jsonl"),
                              ("lambada", "lambada.py", "lambada.jsonl"),
                              ("wikitext", "wikitext.py", "wiki.test.raw")]:
        out[name] = inputs / f"{name}.bin"
        summary = run_ok(script, inputs / src, out[name])
        assert summary.startswith(f"{len(WIKI_PAGES) if name == 'wikitext' else 3} "), summary
    return out


def test_hellaswag_file(outputs, sp):
    path = outputs["hellaswag"]
    header, examples = read_mc_raw(path)
    assert header[:3] == (20240522, 1, len(HELLASWAG)) and not any(header[4:])
    assert header[3] == max(nbytes for _, _, nbytes, _, _ in examples)
    for e, ((index, label, nbytes, context, endings), (ctx_text, end_texts, want_label)) in \
            enumerate(zip(examples, HELLASWAG_EXPECTED)):
        assert (index, label, len(endings)) == (e, want_label, 4)
        assert nbytes == 2 * (6 + len(context) + sum(1 + len(t) for t in endings))
        assert context[0] == BOS and BOS not in context[1:]
        assert sp.decode(context[1:]) == ctx_text
        ctx_ids = sp.encode(ctx_text)
        for tokens, text in zip(endings, end_texts):
            # decoded with the context: tokenized jointly, the delimiter space inside the ending's tokens
            assert sp.decode(context[1:] + tokens) == ctx_text + " " + text
            assert tokens == sp.encode(ctx_text + " " + text)[len(ctx_ids):]
    assert len(examples[0][4][1]) == 1, "the fixture's one-token ending (' it') is not one token"
    compat, back = llm8_evals.read_evalfile(path, sp.vocab_size())
    assert compat == "llm8"
    assert [(x["index"], x["label"], x["context"], x["endings"]) for x in back] == \
           [(i, lab, c, ends) for i, lab, _, c, ends in examples]


def test_lambada_file(outputs, sp):
    path = outputs["lambada"]
    header, records = read_cont_raw(path)
    assert header[:5] == (20261202, 1, 1, len(LAMBADA), BOS) and not any(header[5:])
    for (context, target, n_words, n_bytes), text in zip(records, LAMBADA):
        head, word = text.rsplit(" ", 1)
        assert context[0] == BOS and sp.decode(context[1:]) == head
        assert sp.decode(context[1:] + target) == text
        assert (n_words, n_bytes) == (1, len(word.encode("utf-8")))
    assert len(records[1][1]) > 1, "the fixture's several-token target ('Coriolanus') is one token"
    assert records[2][3] == 6   # "naïve": 5 characters, 6 bytes
    kind, bos, compat, back = llm8_evals.read_continuations(path, sp.vocab_size())
    assert (kind, bos, compat) == (1, BOS, "llm8")
    assert [(r["context"], r["target"], r["n_words"], r["n_bytes"]) for r in back] == records


def test_wikitext_file(outputs, sp):
    path = outputs["wikitext"]
    header, records = read_cont_raw(path)
    assert header[:5] == (20261202, 1, 2, len(WIKI_PAGES), BOS) and not any(header[5:])
    for (context, target, n_words, n_bytes), page, detok in zip(records, WIKI_PAGES, WIKI_DETOKENIZED):
        assert context == []
        assert (n_words, n_bytes) == (len(re.split(r"\s+", page)), len(page.encode("utf-8")))
        assert sp.decode(target) == detok
        assert target == sp.encode(detok)
    assert llm8_evals.read_continuations(path)[3][1]["target"] == records[1][1]


def test_wikitext_from_zip(inputs, outputs):
    out = inputs / "from_zip.bin"
    run_ok("wikitext.py", inputs / "wikitext-2-raw-v1.zip", out)
    assert out.read_bytes() == outputs["wikitext"].read_bytes()


@pytest.mark.parametrize("script, src, kind", [("hellaswag.py", "hellaswag.jsonl", "mc"),
                                               ("lambada.py", "lambada.jsonl", "cont"),
                                               ("wikitext.py", "wiki.test.raw", "cont")])
def test_limit(inputs, outputs, script, src, kind):
    out = inputs / f"limit_{script}.bin"
    run_ok(script, inputs / src, out, "--limit", "1")
    full = outputs[script.removesuffix(".py")]
    if kind == "mc":
        (h1, ex1), (h3, ex3) = read_mc_raw(out), read_mc_raw(full)
        assert h1[2] == 1 and ex1 == ex3[:1] and h1[3] == ex3[0][2]
    else:
        (h1, rec1), (h3, rec3) = read_cont_raw(out), read_cont_raw(full)
        assert h1[3] == 1 and rec1 == rec3[:1]


def test_detokenizer_rules():
    assert llm8_evals.wikitext_detokenize(" a @-@ b @,@ c @.@ d \n", "llm8") == "a-b,c.d\n"
    assert llm8_evals.wikitext_detokenize(" = = = = Deep = = = = \n", "llm8") == "==== Deep ====\n"
    assert llm8_evals.wikitext_detokenize(" [ x ] , players ' cup ? \n", "llm8") == "[x], players' cup?\n"
    # the harness's: a line's first space stays unless a line break precedes it; its odd rules too
    assert llm8_evals.wikitext_detokenize(" [ x ] , players ' cup ? \n", "harness") == " [x], players' cup?\n"
    assert llm8_evals.wikitext_detokenize(" = = = = Deep = = = = \n = = = A = = = \n", "harness") == \
        " ==== Deep ====\n=== A ===\n"
    assert llm8_evals.wikitext_detokenize("a 20 ° N , { b } ' c ' /' 5/ the N th", "harness") == \
        "a 20°N, {b} 'c' /'[0-9]/ the 1 th"


# --------------------------------------------------------------------------------------------------
# --eval-compat harness: no BOS, the harness's detokenizer and its trailing-space move, characters

@pytest.fixture(scope="module")
def harness_outputs(inputs):
    out = {}
    for name, script, src in [("hellaswag", "hellaswag.py", "hellaswag.jsonl"),
                              ("lambada", "lambada.py", "lambada.jsonl"),
                              ("wikitext", "wikitext.py", "wiki.test.raw")]:
        out[name] = inputs / f"{name}_harness.bin"
        assert "--eval-compat harness" in run_ok(script, inputs / src, out[name], compat="harness")
    return out


def test_harness_hellaswag_file(harness_outputs, sp):
    header, examples = read_mc_raw(harness_outputs["hellaswag"])
    chars = struct.unpack(f"<{header[5]}H", harness_outputs["hellaswag"].read_bytes()[-2 * header[5]:])
    assert header[4:6] == (1, 12) and not any(header[6:])
    assert list(chars) == [len(t) for _, ends, _ in HELLASWAG_EXPECTED for t in ends]   # characters: "gâteau" is 6
    for (_, _, _, context, endings), (ctx_text, end_texts, _) in zip(examples, HELLASWAG_EXPECTED):
        assert context == sp.encode(ctx_text)   # no BOS; these contexts end in no space
        for tokens, text in zip(endings, end_texts):
            assert tokens == sp.encode(ctx_text + " " + text)[len(context):]
    compat, back = llm8_evals.read_evalfile(harness_outputs["hellaswag"], sp.vocab_size())
    assert compat == "harness" and [c for x in back for c in x["chars"]] == list(chars)


def test_harness_moves_trailing_spaces(sp):
    """A context that ends in spaces gives them to the continuation (the harness's _encode_pair), and an
    empty one is BOS alone (its loglikelihood's prefix token)."""
    ctx, cont = llm8_evals.encode_pair(sp, "He said. ", " Yes", "harness")
    assert ctx == sp.encode("He said.") and cont == sp.encode("He said.  Yes")[len(ctx):]
    assert llm8_evals.encode_pair(sp, "", " Yes", "harness") == ([BOS], sp.encode(" Yes"))
    ctx, cont = llm8_evals.encode_pair(sp, "He said. ", " Yes", "llm8")
    assert ctx == [BOS] + sp.encode("He said. ") and cont == sp.encode("He said.  Yes")[len(ctx) - 1:]


def test_harness_lambada_and_wikitext_files(harness_outputs, sp):
    header, records = read_cont_raw(harness_outputs["lambada"])
    assert header[:6] == (20261202, 1, 1, len(LAMBADA), BOS, 1) and not any(header[6:])
    for (context, target, _, _), text in zip(records, LAMBADA):
        head = text.rsplit(" ", 1)[0]
        assert context == sp.encode(head) and sp.decode(context + target) == text
    header, records = read_cont_raw(harness_outputs["wikitext"])
    assert header[:6] == (20261202, 1, 2, len(WIKI_PAGES), BOS, 1) and not any(header[6:])
    for (context, target, n_words, n_bytes), page, detok in zip(records, WIKI_PAGES, WIKI_HARNESS):
        assert context == [] and target == sp.encode(detok)
        assert (n_words, n_bytes) == (len(re.split(r"\s+", page)), len(page.encode("utf-8")))
    assert llm8_evals.read_continuations(harness_outputs["wikitext"])[2] == "harness"


# --------------------------------------------------------------------------------------------------
# the scripts on bad input: one line naming the file, status 1, no output

def hellaswag_with(**change):
    return jsonl([HELLASWAG[0], {**HELLASWAG[1], **change}, HELLASWAG[2]])


def without(row, field):
    return {k: v for k, v in row.items() if k != field}


GOOD_HS = jsonl(HELLASWAG)
BAD_INPUTS = {
    "hs_invalid_json": ("hellaswag.py", "h.jsonl", GOOD_HS.replace(b'"Baking"', b'"Baking'), ":2: invalid JSON"),
    "hs_truncated": ("hellaswag.py", "h.jsonl", GOOD_HS[:-30], ":3: invalid JSON"),
    "hs_missing_field": ("hellaswag.py", "h.jsonl", jsonl([HELLASWAG[0], without(HELLASWAG[1], "ctx_b")]),
                         ":2: missing field 'ctx_b'"),
    "hs_missing_label": ("hellaswag.py", "h.jsonl", jsonl([without(HELLASWAG[0], "label")]),
                         ":1: missing field 'label'"),
    "hs_label_4": ("hellaswag.py", "h.jsonl", hellaswag_with(label=4), ":2: 'label'"),
    "hs_label_text": ("hellaswag.py", "h.jsonl", hellaswag_with(label="two"), ":2: 'label'"),
    "hs_3_endings": ("hellaswag.py", "h.jsonl", hellaswag_with(endings=["a", "b", "c"]), ":2: 'endings'"),
    "hs_not_object": ("hellaswag.py", "h.jsonl", b"[1, 2]\n", ":1: expected a JSON object"),
    "hs_empty": ("hellaswag.py", "h.jsonl", b"", "empty file"),
    "hs_not_utf8": ("hellaswag.py", "h.jsonl", GOOD_HS.replace("gâteau".encode(), b"g\xe2teau"), ":2: not UTF-8"),
    # the context ends in a space once "[step]" is dropped, and the ending "[title]" is empty: " " joins it
    "hs_no_tokens": ("hellaswag.py", "h.jsonl",
                     hellaswag_with(ctx_b="stirs [step]", endings=["x", "y", "[title]", "z"]), "example 1: ending 2"),
    "lb_missing_text": ("lambada.py", "l.jsonl", b'{"text": "a b"}\n{"txt": "a b"}\n', ":2: missing field 'text'"),
    "lb_not_utf8": ("lambada.py", "l.jsonl", b'{"text": "a b"}\n{"text": "caf\xe9 b"}\n', ":2: not UTF-8"),
    "lb_no_space": ("lambada.py", "l.jsonl", b'{"text": "word"}\n', ":1: 'text' has no last word"),
    "lb_blank_only": ("lambada.py", "l.jsonl", b"\n\n", "no JSON lines"),
    "lb_missing_file": ("lambada.py", "missing.jsonl", None, "cannot read"),
    "wt_empty": ("wikitext.py", "wiki.test.raw", b"", "empty file"),
    "wt_not_utf8": ("wikitext.py", "wiki.test.raw", WIKI_RAW.encode().replace(b"Beta", b"B\xffta", 1), "not UTF-8"),
    "wt_no_heading": ("wikitext.py", "wiki.test.raw", b" = = Sub = = \n text . \n", "no level-1 heading"),
    "wt_text_first": ("wikitext.py", "wiki.test.raw", b"\n stray text \n" + WIKI_RAW.encode(), ":2: text before"),
    "wt_zip_no_member": ("wikitext.py", "w.zip", {"wikitext-2-raw/wiki.valid.raw": WIKI_RAW},
                         f"no member {ZIP_MEMBER}"),
}


def write_bad_input(tmp_path, case):
    script, name, content, needle = BAD_INPUTS[case]
    src = tmp_path / name
    if isinstance(content, dict):
        write_zip(src, content)
    elif content is not None:
        src.write_bytes(content)
    return script, src, needle, tmp_path / "out" / "eval.bin"


def assert_refused(line, script, src, needle, out):
    assert line.startswith(f"{script}: error: {src}"), line
    assert needle in line, line
    assert not out.exists() and not out.with_name(out.name + ".tmp").exists()


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_bad_input(tmp_path, monkeypatch, capsys, case):
    """Every case in-process, through the script's main() (a process each would cost half a second)."""
    script, src, needle, out = write_bad_input(tmp_path, case)
    module = importlib.import_module(script.removesuffix(".py"))
    monkeypatch.setattr(sys, "argv", [script, str(src), "--out", str(out)])
    with pytest.raises(SystemExit) as e:
        module.main()
    # sys.exit with a string: Python prints it to stderr and exits with status 1
    assert isinstance(e.value.code, str) and "\n" not in e.value.code, e.value.code
    assert capsys.readouterr() == ("", "")
    assert_refused(e.value.code, script, src, needle, out)


@pytest.mark.parametrize("case", ["hs_invalid_json", "lb_not_utf8", "wt_zip_no_member"])
def test_bad_input_process(tmp_path, case):
    """A few of the cases as processes: status 1, one stderr line, no traceback."""
    script, src, needle, out = write_bad_input(tmp_path, case)
    r = run_script(script, src, "--out", out)
    assert r.returncode == 1, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr and not r.stdout, r.stderr
    assert_refused(lines[0], script, src, needle, out)


def test_offline_download_fails_in_one_line(tmp_path):
    """Without INPUT and without network (a proxy nobody listens on): one line with the URL and the
    local-path form."""
    if (REPO / "dev/data/cache/lambada_test.jsonl").exists():
        pytest.skip("dev/data/cache/lambada_test.jsonl is already downloaded")
    env = {**os.environ, "https_proxy": "http://127.0.0.1:9", "HTTPS_PROXY": "http://127.0.0.1:9", "no_proxy": "",
           "NO_PROXY": ""}
    out = tmp_path / "l.bin"
    r = subprocess.run([sys.executable, str(REPO / "dev/data/lambada.py"), "--out", str(out)], capture_output=True,
                       text=True, cwd=REPO, env=env, timeout=120)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert "https://openaipublic.blob.core.windows.net/gpt-2/data/lambada_test.jsonl" in last, last
    assert "python dev/data/lambada.py PATH/lambada_test.jsonl" in last, last
    assert not out.exists() and not (REPO / "dev/data/cache/lambada_test.jsonl.tmp").exists()


# --------------------------------------------------------------------------------------------------
# the writers and readers

def random_examples(rng, n):
    def ids(low, high):
        return rng.integers(0, 32000, int(rng.integers(low, high))).tolist()
    return [{"label": int(rng.integers(0, 4)), "context": [BOS] + ids(0, 50), "endings": [ids(1, 20) for _ in range(4)]}
            for _ in range(n)]


def random_records(rng, n):
    return [{"context": rng.integers(0, 32000, int(rng.integers(0, 30))).tolist(),
             "target": rng.integers(0, 32000, int(rng.integers(1, 30))).tolist(),
             "n_words": int(rng.integers(0, 1000)), "n_bytes": int(rng.integers(0, 5000))} for _ in range(n)]


def test_round_trip(tmp_path, rng):
    examples = random_examples(rng, 20)
    mc = tmp_path / "mc.bin"
    longest = llm8_evals.write_evalfile(mc, examples, 32000, "llm8")
    header, raw = read_mc_raw(mc)
    assert header[3] == longest == max(x[2] for x in raw)
    back = llm8_evals.read_evalfile(mc, 32000)
    assert back == ("llm8", [{"index": i, **{k: x[k] for k in ("label", "context", "endings")}}
                             for i, x in enumerate(examples)])
    for x in examples:
        x["chars"] = rng.integers(1, 500, len(x["endings"])).tolist()
    llm8_evals.write_evalfile(mc, examples, 32000, "harness")
    assert llm8_evals.read_evalfile(mc, 32000) == ("harness", [{"index": i, **x} for i, x in enumerate(examples)])
    records = random_records(rng, 20)
    cont = tmp_path / "cont.bin"
    for compat in ("llm8", "harness"):
        llm8_evals.write_continuations(cont, 2, BOS, records, 32000, compat)
        assert llm8_evals.read_continuations(cont, 32000) == (2, BOS, compat, records)
    assert read_cont_raw(cont)[1] == [(r["context"], r["target"], r["n_words"], r["n_bytes"]) for r in records]


@pytest.mark.parametrize("fmt", ["mc", "mc_harness", "cont"])
@pytest.mark.parametrize("damage", ["cut_2", "cut_record", "header_only", "short_header", "extra", "magic", "version",
                                    "mode"])
def test_reader_rejects(tmp_path, rng, fmt, damage):
    path = tmp_path / f"{fmt}.bin"
    if fmt.startswith("mc"):
        examples = random_examples(rng, 3)
        for x in examples:
            x["chars"] = [7] * len(x["endings"])
        llm8_evals.write_evalfile(path, examples, 32000, "harness" if fmt == "mc_harness" else "llm8")
        read = llm8_evals.read_evalfile
    else:
        llm8_evals.write_continuations(path, 1, BOS, random_records(rng, 3), 32000, "llm8")
        read = llm8_evals.read_continuations
    data = bytearray(path.read_bytes())
    if damage == "cut_2":
        data = data[:-2] if fmt == "mc" else data[:-4]
    elif damage == "cut_record":
        data = data[:len(data) - 40]
    elif damage == "header_only":
        data = data[:1024]
    elif damage == "short_header":
        data = data[:1000]
    elif damage == "extra":
        data += bytes(4)
    elif damage == "magic":
        data[0] ^= 1
    elif damage == "version":
        data[4:8] = struct.pack("<i", 2)
    elif damage == "mode":
        word = 4 if fmt.startswith("mc") else 5
        data[4 * word:4 * word + 4] = struct.pack("<i", 2)
    path.write_bytes(bytes(data))
    with pytest.raises(llm8_evals.DataError) as e:
        read(path)
    assert str(path) in str(e.value) and "\n" not in str(e.value)


def test_reader_rejects_bad_ids_and_sizes(tmp_path):
    path = tmp_path / "c.bin"
    record = {"context": [BOS], "target": [31999], "n_words": 1, "n_bytes": 3}
    llm8_evals.write_continuations(path, 1, BOS, [record], 32000, "llm8")
    with pytest.raises(llm8_evals.DataError, match="outside"):
        llm8_evals.read_continuations(path, 31999)
    data = bytearray(path.read_bytes())
    data[1028:1032] = struct.pack("<i", 0)    # n_target 0
    path.write_bytes(bytes(data))
    with pytest.raises(llm8_evals.DataError, match="bad sizes"):
        llm8_evals.read_continuations(path)


def test_writer_limits(tmp_path):
    path = tmp_path / "e.bin"
    too_long = [{"label": 0, "context": [BOS] * 33000, "endings": [[5]] * 4}]
    with pytest.raises(llm8_evals.DataError, match="more than the uint16 count"):
        llm8_evals.write_evalfile(path, too_long, 32000, "llm8")
    with pytest.raises(llm8_evals.DataError, match="outside"):
        llm8_evals.write_evalfile(path, [{"label": 0, "context": [BOS], "endings": [[32000]] * 4}], 32000, "llm8")
    with pytest.raises(llm8_evals.DataError, match="character counts"):
        llm8_evals.write_evalfile(path, [{"label": 0, "context": [5], "endings": [[7]] * 2, "chars": [3, 0]}], 32000,
                                  "harness")
    with pytest.raises(llm8_evals.DataError, match="no target"):
        no_target = {"context": [BOS], "target": [], "n_words": 1, "n_bytes": 1}
        llm8_evals.write_continuations(path, 1, BOS, [no_target], 32000, "llm8")
    assert list(tmp_path.iterdir()) == []
