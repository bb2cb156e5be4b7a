"""
Downstream evaluation in the trainer (train/evals.h): HellaSwag (-h 1), LAMBADA and WikiText, during
training and standalone (-x 0), on 1, 2 and 3 ranks.

The eval files are made by the data scripts (dev/data/hellaswag.py, lambada.py, wikitext.py, with
--eval-compat llm8; dev/test/test_eval_parity.py holds harness mode to lm-evaluation-harness) from small
hand-written inputs that hold the edge cases: an ending of one token, a context longer than -t (cut from
the left), a LAMBADA target of several tokens, a document of several rolling windows with a partial
last one, and a document shorter than one window. The scores are checked against an independent numpy
scorer written from lm-evaluation-harness's definitions, over the logits the trainer dumps
(--eval-dump): log-softmax in float64, argmax, and the metrics from the raw texts' words and bytes; and,
where torch and transformers are installed, against HF transformers on the exported checkpoint, with
the rows (context cuts, rolling windows) built here from the definitions.
"""
import json
import math
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO, run
from data_helpers import run_script
from test_distributed import mpi_env, mpirun
from test_trainer import assert_one_line_error

import llm8_evals  # noqa: E402  (dev/data, on sys.path through data_helpers)

MPIRUN = shutil.which("mpirun")
T = 32
# -b 3: the rows do not fill the last micro-batch; -m 1: one validation batch
FLAGS = ["-b", "3", "-t", str(T), "-m", "1", "--shuffle", "0"]
DUMP_MAGIC = 20261203

# HellaSwag's fields; the texts need no preprocessing beyond strip, so the test knows each ending's bytes
HELLASWAG = [
    {"activity_label": "Cooking", "ctx_a": "A man pours flour into a bowl.", "ctx_b": "he",
     "endings": ["adds two eggs and stirs.", "throws the bowl at the wall.", "it", "sings to the flour."], "label": 0},
    {"activity_label": "Sailing", "ctx_a": " ".join(["The boat sails on across the wide grey sea under a low sky."] * 4),
     "ctx_b": "the sailor", "endings": ["pulls the rope.", "eats a café crème.", "sleeps.", "is a cat."], "label": 2},
    {"activity_label": "Music", "ctx_a": "A woman sits at a piano.", "ctx_b": "she",
     "endings": ["plays a slow tune.", "plays.", "opens the lid and plays a scale.", "leaves."], "label": 3},
]
LAMBADA = ["The ship left the harbour at dawn and the crowd watched the ship",
           "He spoke of Rome and of the people, and they called him Coriolanus",
           "She opened the door and saw the garden"]
WIKI_PAGES = [
    " = Valkyria Test = \n\n Valkyria is a game of 2011 @-@ 12 , made by a team of 1 @,@ 000 people . "
    + " ".join(["It was well received by critics and players , who praised its story ."] * 6) + " \n"
    " = = Plot = = \n\n The story follows a squad of soldiers in a war . \n\n",
    " = Short Page = \n\n A short page ( with brackets ) . \n\n",
]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def eval_files(tmp_path_factory, shakespeare):
    d = tmp_path_factory.mktemp("eval_files")
    write_jsonl(d / "hellaswag.jsonl", HELLASWAG)
    write_jsonl(d / "lambada.jsonl", [{"text": t} for t in LAMBADA])
    (d / "wiki.test.raw").write_text(" \n" + "".join(WIKI_PAGES), encoding="utf-8")
    out = {}
    for name, script, src in [("hellaswag", "hellaswag.py", "hellaswag.jsonl"), ("lambada", "lambada.py", "lambada.jsonl"),
                              ("wikitext", "wikitext.py", "wiki.test.raw")]:
        r = run_script(script, d / src, "--out", d / f"{name}.bin", "--eval-compat", "llm8")
        assert r.returncode == 0, r.stderr
        out[name] = d / f"{name}.bin"
    return out


def eval_flags(files, compat="llm8"):
    return ["-h", "1", "--hellaswag", files["hellaswag"], "--eval-lambada", files["lambada"], "--eval-wikitext",
            files["wikitext"], "--eval-compat", compat]


def evals_of(out_dir):
    """{(step, set): metrics dict} from metrics.jsonl."""
    found = {}
    for line in (out_dir / "metrics.jsonl").read_text().splitlines():
        obj = json.loads(line)
        if "eval" in obj:
            found[(obj["step"], obj["eval"])] = obj
    return found


# ---------------------------------------------------------------------------------------------------
# independent readers of the two eval formats (from their descriptions in docs/formats.md)

def read_mc(path):
    """llm.c's eval file: [(label, context, [ending tokens...])]."""
    header = np.fromfile(path, "<i4", 256)
    assert header[0] == 20240522 and header[1] == 1
    w = np.fromfile(path, "<u2", offset=1024).tolist()
    out, at = [], 0
    for _ in range(header[2]):
        assert w[at] == 65535
        label, nc, nctx = w[at + 3], w[at + 4], w[at + 5]
        at += 6
        ctx = w[at:at + nctx]
        at += nctx
        ends = []
        for _ in range(nc):
            n = w[at]
            ends.append(w[at + 1:at + 1 + n])
            at += 1 + n
        out.append((label, ctx, ends))
    assert at == len(w)
    return out


def read_cont(path):
    """llm8's continuation file: (bos, [(context, target)])."""
    header = np.fromfile(path, "<i4", 256)
    assert header[0] == 20261202 and header[1] == 1
    w = np.fromfile(path, "<i4", offset=1024).tolist()
    out, at = [], 0
    for _ in range(header[3]):
        nctx, ntgt = w[at], w[at + 1]
        at += 4
        out.append((w[at:at + nctx], w[at + nctx:at + nctx + ntgt]))
        at += nctx + ntgt
    assert at == len(w)
    return int(header[4]), out


def read_dump(dump_dir, name, step=0):
    """Every rank's dump of one evaluation: ({(record, choice, index): (target, logits float64)}, the rows as
    (record, choice, tokens, n_score) tuples)."""
    entries, rows = {}, []
    for path in sorted(dump_dir.glob(f"{name}_step{step}.rank*.bin")):
        header = np.fromfile(path, "<i4", 4)
        assert header[0] == DUMP_MAGIC and header[1] == 2
        V = int(header[2])
        raw = np.fromfile(path, np.uint8, offset=16)
        at = 0
        while at < raw.size:
            r, c, n, n_score, first = np.frombuffer(raw[at:at + 20].tobytes(), "<i4").tolist()
            tokens = np.frombuffer(raw[at + 20:at + 20 + 4 * n].tobytes(), "<i4").tolist()
            at += 20 + 4 * n
            rows.append((r, c, tuple(tokens), n_score))
            for j in range(n_score):
                key = (r, c, first + j)
                assert key not in entries, f"{name}: target {key} scored twice"
                logits = np.frombuffer(raw[at:at + 4 * V].tobytes(), "<f4").astype(np.float64)
                entries[key] = (tokens[n - n_score + j], logits)
                at += 4 * V
    return entries, rows


def rolling_windows(bos, x):
    """lm-evaluation-harness's get_rolling_token_windows(x, bos, max_seq_len=T, context_len=1), as rows of
    input tokens + the last target: (tokens, n_score)."""
    first = min(T, len(x))
    windows = [([bos] + x[:first], first)]
    predicted = first
    while predicted < len(x):
        count = min(T, len(x) - predicted)
        end = predicted + count
        windows.append((x[end - T - 1:end], count))
        predicted = end
    return windows


def expected_rows(files):
    """The rows the trainer must score, from the definitions: context + continuation cut to its last T + 1
    tokens (lm-evaluation-harness's [-(max_length + 1):]); WikiText's rolling windows."""
    rows = [(e, c, tuple((ctx + t)[-(T + 1):]), len(t)) for e, (_, ctx, ends) in enumerate(read_mc(files["hellaswag"]))
            for c, t in enumerate(ends)]
    lam = [(r, 0, tuple((ctx + t)[-(T + 1):]), len(t)) for r, (ctx, t) in enumerate(read_cont(files["lambada"])[1])]
    bos, docs = read_cont(files["wikitext"])
    wiki = [(r, 0, tuple(w), n) for r, (_, x) in enumerate(docs) for w, n in rolling_windows(bos, x)]
    return {"hellaswag": rows, "lambada": lam, "wikitext": wiki}


def log_softmax_at(logits, target):
    m = logits.max()
    return logits[target] - m - math.log(np.exp(logits - m).sum())


def continuation_ll(entries, record, choice, tokens):
    """Summed log-likelihood of `tokens` and whether each is its position's argmax; checks the dump
    scored exactly these targets."""
    ll, greedy = 0.0, True
    for i, tok in enumerate(tokens):
        target, logits = entries.pop((record, choice, i))
        assert target == tok, (record, choice, i, target, tok)
        ll += log_softmax_at(logits, tok)
        greedy = greedy and int(np.argmax(logits)) == tok
    return ll, greedy


def reference_scores(files, ending_ll, lambada_ll, document_ll):
    """lm-evaluation-harness's metrics (and llm.c's HellaSwag number) from a scorer's log-likelihoods:
    ending_ll(example, ending, context, tokens) -> ll; lambada_ll(record, context, target) -> (ll, greedy);
    document_ll(record, bos, tokens) -> ll. Words and bytes come from the raw texts above."""
    correct = np.zeros(3)
    for e, (label, ctx, ends) in enumerate(read_mc(files["hellaswag"])):
        ll = np.array([ending_ll(e, c, ctx, toks) for c, toks in enumerate(ends)])
        nbytes = np.array([len(x.strip().encode()) for x in HELLASWAG[e]["endings"]], dtype=np.float64)
        ntok = np.array([len(t) for t in ends], dtype=np.float64)
        correct += [np.argmax(ll) == label, np.argmax(ll / nbytes) == label, np.argmax(ll / ntok) == label]
    scores = {"hellaswag": dict(zip(["acc", "acc_norm", "acc_llmc"], correct / len(HELLASWAG)))}
    lam = [lambada_ll(r, ctx, t) for r, (ctx, t) in enumerate(read_cont(files["lambada"])[1])]
    scores["lambada"] = {"acc": sum(g for _, g in lam) / len(LAMBADA), "perplexity": math.exp(-np.mean([x for x, _ in lam]))}
    bos, docs = read_cont(files["wikitext"])
    total = sum(document_ll(r, bos, doc) for r, (_, doc) in enumerate(docs))
    words = sum(len(re.split(r"\s+", p)) for p in WIKI_PAGES)
    nbytes = sum(len(p.encode()) for p in WIKI_PAGES)
    scores["wikitext"] = {"word_perplexity": math.exp(-total / words), "byte_perplexity": math.exp(-total / nbytes),
                          "bits_per_byte": -total / nbytes / math.log(2)}
    return scores


def numpy_scores(files, dump_dir):
    """reference_scores over the dumped logits; checks that each set's dump scored exactly its targets."""
    dumps = {name: read_dump(dump_dir, name)[0] for name in ("hellaswag", "lambada", "wikitext")}
    scores = reference_scores(
        files, lambda e, c, _, toks: continuation_ll(dumps["hellaswag"], e, c, toks)[0],
        lambda r, _, target: continuation_ll(dumps["lambada"], r, 0, target),
        lambda r, _, doc: continuation_ll(dumps["wikitext"], r, 0, doc)[0])
    for name, left in dumps.items():
        assert not left, f"{name}: unexpected targets {sorted(left)[:5]}"
    return scores


def assert_scores_agree(found, expected, rel):
    """Accuracies exactly; the likelihood metrics within `rel` (FP32 classifier vs float64 here)."""
    for name, metrics in expected.items():
        for key, want in metrics.items():
            got = found[name][key]
            if key.startswith("acc"):
                assert got == want, f"{name} {key}: trainer {got}, reference {want}"
            else:
                assert abs(got - want) <= rel * abs(want), f"{name} {key}: trainer {got}, reference {want}"


@pytest.fixture(scope="module")
def one_rank(eval_files, tmp_path_factory):
    """The default recipe (fp8), evaluation only (-x 0) of the tiny preset's init, logits dumped."""
    out = tmp_path_factory.mktemp("one_rank")
    r = run([REPO / "train_llama_cpu", *FLAGS, "-x", "0", *eval_flags(eval_files), "-o", out, "--eval-dump", out / "dump"])
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return r, out


def test_files_hold_the_edge_cases(eval_files, sp):
    mc = read_mc(eval_files["hellaswag"])
    assert any(len(t) == 1 for _, _, ends in mc for t in ends), "no ending of one token"
    assert any(len(ctx) + max(map(len, ends)) > T + 1 for _, ctx, ends in mc), "no context longer than -t"
    assert all(ctx[0] == sp.bos_id() for _, ctx, _ in mc)
    _, lam = read_cont(eval_files["lambada"])
    assert any(len(t) > 1 for _, t in lam), "no LAMBADA target of several tokens"
    _, docs = read_cont(eval_files["wikitext"])
    assert len(docs) == 2 and len(docs[0][1]) > 2 * T and len(docs[0][1]) % T != 0 and len(docs[1][1]) < T


def test_scores_match_numpy_scorer(one_rank, eval_files):
    r, out = one_rank
    assert "contexts cut from the left" in r.stdout, r.stdout[-2000:]
    found = {name: obj for (step, name), obj in evals_of(out).items() if step == 0}
    expected = numpy_scores(eval_files, out / "dump")
    assert_scores_agree(found, expected, 1e-5)
    for name, rows in expected_rows(eval_files).items():
        assert sorted(read_dump(out / "dump", name)[1]) == sorted(rows), f"{name}: the model saw other rows"
    assert found["hellaswag"]["examples"] == len(HELLASWAG) and found["wikitext"]["examples"] == len(WIKI_PAGES)
    # llm.c's own line for HellaSwag
    assert f"s:0 eval:{found['hellaswag']['acc_llmc']:.6f}" in (out / "main.log").read_text()


@pytest.mark.skipif(MPIRUN is None, reason="mpirun not found (make setup installs Open MPI)")
@pytest.mark.parametrize("ranks", [2, 3])
def test_rank_counts_score_the_same(one_rank, eval_files, tmp_path, ranks):
    """2 and 3 ranks (more ranks than the last round has micro-batches): the same scores, bit for bit."""
    r = mpirun(ranks, [*FLAGS, "-x", "0", *eval_flags(eval_files), "-o", tmp_path], env=mpi_env("default"))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert evals_of(tmp_path) == evals_of(one_rank[1])


def test_during_training_and_standalone(eval_files, tmp_path):
    """--eval-every 1 scores steps 0 and 1 of a run; -x 0 on its step-1 model (-e model file, and -y 1 on
    the run, which appends to its logs and drops nothing) scores the same, bit for bit."""
    run_dir = tmp_path / "run"
    r = run([REPO / "train_llama_cpu", *FLAGS, "-x", "1", "-v", "0", "--eval-every", "1", *eval_flags(eval_files),
             "-o", run_dir])
    assert r.returncode == 0, r.stderr[-2000:]
    trained = evals_of(run_dir)
    assert sorted({s for s, _ in trained}) == [0, 1]
    assert trained[(0, "wikitext")] != trained[(1, "wikitext")]
    alone = tmp_path / "alone"
    r = run([REPO / "train_llama_cpu", *FLAGS, "-x", "0", "-e", run_dir / "model_00000001.bin", *eval_flags(eval_files),
             "-o", alone])
    assert r.returncode == 0, r.stderr[-2000:]
    for (_, name), obj in evals_of(alone).items():
        assert {**obj, "step": 1} == trained[(1, name)]
    before = (run_dir / "metrics.jsonl").read_text()
    r = run([REPO / "train_llama_cpu", *FLAGS, "-x", "0", "-y", "1", *eval_flags(eval_files), "-o", run_dir])
    assert r.returncode == 0 and "resumed from" in r.stdout, r.stderr[-2000:]
    after = (run_dir / "metrics.jsonl").read_text()
    assert after.startswith(before)
    added = [json.loads(line) for line in after[len(before):].splitlines()]
    assert [o for o in added if "eval" in o] == [trained[(1, n)] for n in ("hellaswag", "lambada", "wikitext")]


def train_losses(out_dir):
    return [(o["step"], o["loss"]) for o in map(json.loads, (out_dir / "metrics.jsonl").read_text().splitlines())
            if "loss" in o]


@pytest.mark.parametrize("recipe", ["current", "delayed"])
def test_evals_leave_training_unchanged(eval_files, tmp_path, recipe):
    """Evaluating every step changes no training loss: the evaluation forwards' casts (under delayed scaling
    they record amaxes) do not reach the steps' scales."""
    args = [*FLAGS, "-x", "3", "-v", "0", "-n", "-1", "--fp8-recipe", recipe]
    plain, evaluated = tmp_path / "plain", tmp_path / "evaluated"
    assert run([REPO / "train_llama_cpu", *args, "-o", plain]).returncode == 0
    assert run([REPO / "train_llama_cpu", *args, "--eval-every", "1", "--eval-limit", "1", *eval_flags(eval_files),
                "-o", evaluated]).returncode == 0
    assert len(evals_of(evaluated)) == 4 * 3
    assert train_losses(plain) == train_losses(evaluated) and len(train_losses(plain)) == 3


def test_help_and_h(trainer):
    """-h alone (and --help) still print the usage; -h 1 is HellaSwag, as llm.c's."""
    for args in (["-h"], ["--help"], ["-h", "-b", "4"]):
        r = run([trainer, *args])
        assert r.returncode == 0 and "usage:" in r.stdout, args
    for flag in ("-h", "--hellaswag", "--eval-lambada", "--eval-wikitext", "--eval-every", "--eval-limit", "--eval-dump",
                 "--eval-compat"):
        assert f"  {flag} " in r.stdout, flag
    # the data scripts write the trainer's default mode by default
    compat = next(line for line in r.stdout.splitlines() if line.startswith("  --eval-compat "))
    assert compat.endswith(f"(default {llm8_evals.DEFAULT_COMPAT})"), compat


def truncate(src, dst, drop):
    data = src.read_bytes()
    dst.write_bytes(data[:len(data) - drop])
    return dst


def write_mc(path, examples):
    """An llm.c eval file of (label, context, endings) examples, from the format's description."""
    stream, longest = [], 0
    for i, (label, ctx, ends) in enumerate(examples):
        ex = [65535, 0, i, label, len(ends), len(ctx), *ctx]
        for t in ends:
            ex += [len(t), *t]
        ex[1] = 2 * len(ex)
        longest = max(longest, ex[1])
        stream += ex
    header = np.zeros(256, "<i4")
    header[:4] = [20240522, 1, len(examples), longest]
    path.write_bytes(header.tobytes() + np.array(stream, "<u2").tobytes())
    return path


@pytest.fixture(scope="module")
def harness_files(tmp_path_factory, eval_files):
    """The eval files' inputs written for --eval-compat harness (the scripts' default)."""
    d = tmp_path_factory.mktemp("harness_files")
    out = {}
    for name, script, src in [("hellaswag", "hellaswag.py", "hellaswag.jsonl"), ("lambada", "lambada.py", "lambada.jsonl"),
                              ("wikitext", "wikitext.py", "wiki.test.raw")]:
        out[name] = d / f"{name}.bin"
        r = run_script(script, eval_files[name].parent / src, "--out", out[name])
        assert r.returncode == 0 and "--eval-compat harness" in r.stdout, r.stdout + r.stderr
    return out


@pytest.mark.parametrize("case", ["missing", "truncated_mc", "truncated_cont", "wrong_kind", "too_long", "h2", "limit",
                                  "hellaswag_without_h", "no_context", "harness_file_in_llm8", "llm8_file_in_harness",
                                  "bad_compat", "truncated_harness_mc"])
def test_bad_input_one_line_error(trainer, eval_files, harness_files, tmp_path, case):
    files = dict(eval_files)
    extra = []
    needle = None
    compat = "llm8"
    if case == "missing":
        files["lambada"] = tmp_path / "nope.bin"
        needle = "nope.bin"
    elif case == "truncated_mc":
        files["hellaswag"] = truncate(eval_files["hellaswag"], tmp_path / "hs.bin", 4)
        needle = "hs.bin"
    elif case == "truncated_cont":
        files["wikitext"] = truncate(eval_files["wikitext"], tmp_path / "wiki.bin", 8)
        needle = "wiki.bin"
    elif case == "wrong_kind":
        files["wikitext"] = eval_files["lambada"]
        needle = "not wikitext"
    elif case == "too_long":
        extra = ["-t", "2", "-p", "bf16"]
        needle = "does not fit -t 2"
    elif case == "no_context":
        files["hellaswag"] = write_mc(tmp_path / "noctx.bin", [(0, [1, 5], [[7], [8]]), (1, [], [[7], [8, 9]])])
        needle = "example 1: no context tokens"
    elif case == "harness_file_in_llm8":
        files["wikitext"] = harness_files["wikitext"]
        needle = f"{harness_files['wikitext']}: written for --eval-compat harness, this run scores --eval-compat llm8"
    elif case == "llm8_file_in_harness":
        files = dict(harness_files, hellaswag=eval_files["hellaswag"])
        compat = "harness"
        needle = f"{eval_files['hellaswag']}: written for --eval-compat llm8, this run scores --eval-compat harness"
    elif case == "bad_compat":
        compat = "lm-eval"
        needle = "flag --eval-compat: 'lm-eval' is not llm8 or harness"
    elif case == "truncated_harness_mc":
        # one character count short: the examples' stream ends a word early
        files = dict(harness_files, hellaswag=truncate(harness_files["hellaswag"], tmp_path / "hs_harness.bin", 2))
        compat = "harness"
        needle = "hs_harness.bin"
    if case == "h2":
        args = ["-h", "2"]
        needle = "flag -h"
    elif case == "limit":
        args = ["--eval-limit", "2"]
        needle = "--eval-limit"
    elif case == "hellaswag_without_h":
        args = ["--hellaswag", files["hellaswag"]]
        needle = "--hellaswag"
    else:
        args = eval_flags(files, compat)
    assert_one_line_error(run([trainer, *FLAGS, "-x", "0", *args, *extra]), needle)


def test_hf_transformers_agrees(eval_files, tmp_path, sp):
    """HF LlamaForCausalLM (float32) on the exported checkpoint of a 1-step run, with the rows built here:
    the context + continuation cut to its last T + 1 tokens, and lm-evaluation-harness's rolling windows;
    against the trainer's -p fp32 scores of the same model."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    run_dir = tmp_path / "run"
    r = run([REPO / "train_llama_cpu", *FLAGS, "-x", "1", "-p", "fp32", "-o", run_dir])
    assert r.returncode == 0, r.stderr[-2000:]
    scored = tmp_path / "scored"
    r = run([REPO / "train_llama_cpu", *FLAGS, "-x", "0", "-p", "fp32", "-e", run_dir / "model_00000001.bin",
             *eval_flags(eval_files), "-o", scored])
    assert r.returncode == 0, r.stderr[-2000:]
    found = {name: obj for (_, name), obj in evals_of(scored).items()}
    hf_dir = tmp_path / "hf"
    r = subprocess.run([sys.executable, REPO / "scripts/convert_hf.py", "export", run_dir / "model_00000001.bin", hf_dir],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    model = transformers.LlamaForCausalLM.from_pretrained(hf_dir, torch_dtype=torch.float32).eval()

    def ll_of(seq, n_score):
        """Summed log-likelihood of the last n_score tokens of seq (at most T + 1 tokens), and greedy."""
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([seq[:-1]]), use_cache=False).logits[0].double()
        logp = torch.log_softmax(logits, -1)
        pos = range(len(seq) - 1 - n_score, len(seq) - 1)
        ll = sum(float(logp[p, seq[p + 1]]) for p in pos)
        greedy = all(int(logits[p].argmax()) == seq[p + 1] for p in pos)
        return ll, greedy

    def cont_ll(ctx, cont):
        return ll_of((ctx + cont)[-(T + 1):], len(cont))

    def document_ll(_, bos, x):
        return sum(ll_of(w, n)[0] for w, n in rolling_windows(bos, x))

    expected = reference_scores(eval_files, lambda e, c, ctx, toks: cont_ll(ctx, toks)[0],
                                lambda r, ctx, target: cont_ll(ctx, target), document_ll)
    assert_scores_agree(found, expected, 1e-4)


def test_shakespeare_cloze(tmp_path):
    """dev/data/shakespeare_cloze.py: each example's label is its speech's own last line, the context is the
    speech before it, the other endings are other lines of the validation split."""
    sys.path.append(str(REPO / "dev/data"))
    import shakespeare_cloze
    speeches = [f"SPEAKER{i}:\nline one of speech {i} here\nline two of speech {i} here\nthe last line of speech {i}"
                for i in range(40)]
    examples = shakespeare_cloze.cloze_examples("\n\n".join(speeches), seed=3)
    assert len(examples) == 4  # the first 10% of the 40 paragraphs
    for i, e in enumerate(examples):
        assert e["endings"][e["label"]] == f"the last line of speech {i}"
        assert e["ctx_a"] == f"line one of speech {i} here line two of speech {i} here" and e["activity_label"] == f"SPEAKER{i}"
        assert len(set(e["endings"])) == 4


@pytest.mark.skipif(MPIRUN is None, reason="mpirun not found (make setup installs Open MPI)")
def test_ranks_with_other_eval_files_stop(eval_files, tmp_path):
    """Two ranks reading different LAMBADA files at start-up (a node with another copy): their rows
    differ, so would their forwards; the start-up agreement stops both, naming the flag, in one line."""
    other = tmp_path / "lambada_other.bin"
    r = run_script("lambada.py", write_jsonl(tmp_path / "other.jsonl", [{"text": t} for t in LAMBADA[:2]]), "--out", other,
                   "--eval-compat", "llm8")
    assert r.returncode == 0, r.stderr
    args = [*FLAGS, "-x", "0", *eval_flags(eval_files)]
    cmd = [MPIRUN, "--oversubscribe", "-np", "1", REPO / "train_llama_cpu", *args, ":",
           "-np", "1", REPO / "train_llama_cpu", *[other if a == eval_files["lambada"] else a for a in args]]
    r = subprocess.run([str(c) for c in cmd], cwd=REPO, env=mpi_env(), capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    lines = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "disagree on --eval-lambada" in lines[0], r.stderr


@pytest.mark.skipif(MPIRUN is None, reason="mpirun not found (make setup installs Open MPI)")
def test_during_training_on_two_ranks(eval_files, tmp_path):
    """Evaluations during training score the same on 2 ranks as on 1 with the same global batch (one rank
    accumulating the two micro-batches the two ranks run), at every step."""
    args = [*FLAGS, "-x", "2", "-v", "0", "-d", str(2 * 3 * T), "--eval-every", "1", *eval_flags(eval_files), "-n", "-1"]
    one, two = tmp_path / "one", tmp_path / "two"
    assert run([REPO / "train_llama_cpu", *args, "-o", one]).returncode == 0
    r = mpirun(2, [*args, "-o", two], env=mpi_env("default"))
    assert r.returncode == 0, r.stderr[-2000:]
    assert evals_of(one) == evals_of(two) and len(evals_of(one)) == 3 * 3
    assert train_losses(one) == train_losses(two)
