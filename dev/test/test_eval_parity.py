"""
--eval-compat harness scores exactly as lm-evaluation-harness v0.4.9.1 scores an HF Llama-2 with its default
settings (docs/evaluation.md): its wikitext, lambada_openai and hellaswag tasks, on a random HF-layout
Llama imported with scripts/convert_hf.py.

The test writes HellaSwag-, LAMBADA- and WikiText-format inputs holding what each of the harness's rules
handles (WikiText's @-@ joins, spaced punctuation, brackets and quotes, heading runs, a page longer than
-t; HellaSwag's [title] and bracket tags, double spaces, a context ending in a space; a LAMBADA context
ending in one), makes the eval files with the data scripts (their default mode, harness), scores them with
`train_llama_cpu -x 0 -p fp32`, and scores the inputs here, independently: the harness's rules rewritten
below from its sources (lm_eval/tasks/hellaswag/utils.py, lambada/lambada_openai.yaml,
wikitext/preprocess_wikitext.py; lm_eval/api/model.py TemplateLM._encode_pair and loglikelihood;
lm_eval/models/huggingface.py HFLM.tok_encode, loglikelihood_rolling and _loglikelihood_tokens;
lm_eval/utils.py get_rolling_token_windows and make_disjoint_window; lm_eval/api/task.py's
multiple-choice acc_norm; lm_eval/api/metrics.py), HF's Llama-2 tokenizer (transformers'
LlamaTokenizerFast) and HF's Llama (transformers' FlaxLlamaForCausalLM) in float64. The rows the trainer
scored (--eval-dump) must be the harness's, token for token; the accuracies must be the same counts and the
perplexities agree to 1e-6 relative (FP32 against float64, see PPL_RTOL). Planted faults, each in a copy of
the source (a detokenizer rule dropped, BOS added, a rolling window one token short), are each caught.
"""
import json
import math
import os
import re
import secrets
import shutil
import subprocess
import sys

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from transformers import FlaxLlamaForCausalLM, LlamaTokenizerFast
from transformers.models.llama import modeling_flax_llama

from conftest import REPO, run
from data_helpers import DATA
from test_evals import evals_of, read_dump

import llm8_evals  # noqa: E402  (dev/data, on sys.path through data_helpers)

jax.config.update("jax_enable_x64", True)

T = 32                    # -t, and the model's max_position_embeddings: the harness's default max_length
B = 4
BOS = 1
# The trainer's FP32 forward and FP32 per-token losses against float64 here: a token's log-likelihood is off
# by ~5e-7 (std, measured, no bias; a logit by up to ~8e-6), so a perplexity, exp(-mean), by that over the
# square root of the records it averages: ~1e-7 for 24 LAMBADA passages, less for WikiText (per word).
# Decisions (argmax) must clear MARGIN: relative for HellaSwag's sums, absolute for a logit.
PPL_RTOL = 1e-6
MARGIN = 1e-4
FORWARD_ROWS = 8
HF = dict(vocab_size=32000, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
          num_key_value_heads=2, max_position_embeddings=T, rms_norm_eps=1e-5, rope_theta=10000.0)

# HellaSwag's fields: [title] ending a context (its ". " leaves a space the harness moves onto the endings),
# tags, double spaces, an ending that starts with a tag (a space once it is gone), non-ASCII endings
# (characters < bytes), a context longer than -t, an ending of one token
HELLASWAG = [
    {"activity_label": "Baking", "ctx_a": "[header] How to bake bread [title] Preheat the oven.",
     "ctx_b": "mix the flour [substeps] with  water [title]",
     "endings": ["[step] Knead the dough for ten minutes.", "Eat the whole loaf at once.", "Bake a gâteau au chocolat.",
                 "Sell  the oven [title] today."], "label": 0},
    {"activity_label": "Sailing", "ctx_a": " ".join(["The boat sails on across the wide grey sea under a low sky."] * 3),
     "ctx_b": "the sailor", "endings": ["pulls the rope.", "eats a café crème.", "sleeps.", "is a naïve cat."], "label": 2},
    {"activity_label": "Cooking", "ctx_a": "A man pours flour into a bowl.", "ctx_b": "he",
     "endings": ["adds two eggs and stirs.", "it", "throws the bowl at the wall.", "sings to the flour."], "label": 1},
    {"activity_label": "Music", "ctx_a": "A woman sits at a piano.", "ctx_b": "she",
     "endings": ["plays a slow tune.", "plays.", "opens the lid and plays a scale.", "leaves the room."], "label": 3},
]
# LAMBADA passages: a last word of several tokens, a context ending in a space, one longer than -t, and
# 20 plain ones (the mean of FP32 per-token errors of ~6e-7 over n passages shrinks as 1/sqrt(n): with 8,
# LAMBADA's perplexity was off by up to 9.5e-7, too near PPL_RTOL); a last word the model predicts is
# appended to GREEDY_CONTEXTS' first usable one
LAMBADA = ["He spoke of Rome and of the people, and they called him Coriolanus",
           "She opened the door and saw the  garden",
           " ".join(["It rained all night on the roofs of the old town by the river."] * 3) + " Nobody left the house"] + [
    f"{who} {did} {what}" for who in ("The farmer", "A young girl", "The old sailor", "My brother", "The teacher")
    for did, what in (("opened the box and found a", "key"), ("looked out of the window at the", "rain"),
                      ("walked into the kitchen and took the", "bread"), ("sat down by the fire with a", "book"))]
GREEDY_CONTEXTS = ["The old man looked at the sea and said", "In the morning the children ran to the",
                   "After the war the soldiers went back to their", "The king gave the order and the",
                   "When the letter came she read it by the", "They walked for hours through the dark"]
# WikiText pages: every rule of the harness's detokenizer has something to change in one of them
WIKI_PAGES = [
    " = Valkyria Chronicles III = \n \n Senjō no Valkyria 3 : Unrecorded Chronicles ( Japanese : 戦場のヴァルキュリア3 ) "
    "is a tactical role @-@ playing game developed by Sega for the PlayStation Portable . Released in January 2011 in "
    "Japan , it is the third game in the series . The game 's sales were 1 @,@ 200 @,@ 000 copies ; its score was 8 @.@ 5 "
    "! Was it good ? The guide said \" yes \" and ' maybe ' . [ citation needed ] { note } It is set at 20 ° N "
    "and the N th level /' 5/ of the war . \n \n = = Gameplay = = \n \n = = = Combat = = = \n \n = = = = Units = = = = \n"
    " \n = = = = = Details = = = = = \n \n Units move in turns . \n \n",
    " = Short Page = \n \n The players ' guide . \n \n",
]


# ---------------------------------------------------------------------------------------------------
# lm-evaluation-harness v0.4.9.1's task rules, rewritten from its sources (see the banner)

def hellaswag_preprocess(text):
    """hellaswag/utils.py preprocess."""
    text = text.strip().replace(" [title]", ". ")
    return re.sub(r"\[.*?\]", "", text).replace("  ", " ")


def hellaswag_doc(doc):
    """hellaswag/utils.py process_docs: (query, choices, gold)."""
    query = hellaswag_preprocess(doc["activity_label"] + ": " + doc["ctx_a"] + " " + doc["ctx_b"].capitalize())
    return query, [hellaswag_preprocess(e) for e in doc["endings"]], int(doc["label"])


def lambada_doc(text):
    """lambada_openai.yaml: doc_to_text, doc_to_target."""
    words = text.split(" ")
    return " ".join(words[:-1]), " " + words[-1]


def wikitext_detokenizer(page):
    """wikitext/preprocess_wikitext.py wikitext_detokenizer, step by step in its order."""
    page = page.replace("s '", "s'")
    page = re.sub(r"/' [0-9]/", r"/'[0-9]/", page)
    for tokenized, joined in ((" @-@ ", "-"), (" @,@ ", ","), (" @.@ ", ".")):
        page = page.replace(tokenized, joined)
    for mark in ":;.!?,":
        page = page.replace(f" {mark} ", f"{mark} ")
    for left, right in ("()", "[]", "{}"):
        page = re.sub(rf"\{left}\s*([^\{right}]*?)\s*\{right}", rf"{left}\1{right}", page)
    for quote in "\"'":
        page = re.sub(rf"{quote}\s*([^{quote}]*?)\s*{quote}", rf"{quote}\1{quote}", page)
    for n in (4, 3, 2):
        page = page.replace(" ".join("=" * n), "=" * n)
    for spaced, tight in ((" \u00b0 ", "\u00b0"), (" \n", "\n"), ("\n ", "\n"), (" N ", " 1 "), (" 's", "'s")):
        page = page.replace(spaced, tight)
    return page


def wikitext_counts(page):
    """wikitext/preprocess_wikitext.py process_results: words and UTF-8 bytes of the original page."""
    return len(re.split(r"\s+", page)), len(page.encode("utf-8"))


class Harness:
    """HFLM's requests on an HF Llama-2 with its defaults (add_bos_token False, max_length = the config's
    max_position_embeddings), turned into rows: (tokens, n_score), the last n_score tokens scored."""

    def __init__(self, tokenizer):
        self.tok = tokenizer

    def tok_encode(self, text):
        # HFLM.tok_encode of a causal model: add_special_tokens = False or add_bos_token (False)
        return self.tok.encode(text, add_special_tokens=False)

    def encode_pair(self, context, continuation):
        """TemplateLM._encode_pair: trailing spaces of the context move to the continuation."""
        n_spaces = len(context) - len(context.rstrip())
        if n_spaces:
            context, continuation = context[:-n_spaces], context[-n_spaces:] + continuation
        whole, ctx = self.tok_encode(context + continuation), self.tok_encode(context)
        return ctx, whole[len(ctx):]

    def loglikelihood_row(self, context, continuation):
        """TemplateLM.loglikelihood (an empty context is the prefix token, BOS) and the row
        HFLM._loglikelihood_tokens scores: (context + continuation)[-(max_length + 1):]."""
        ctx, cont = ([BOS], self.tok_encode(continuation)) if context == "" else self.encode_pair(context, continuation)
        assert ctx and cont and len(cont) <= T
        return (ctx + cont)[-(T + 1):], len(cont)

    def rolling_rows(self, text):
        """HFLM.loglikelihood_rolling: get_rolling_token_windows(tok_encode(text), prefix BOS, max_length,
        context_len 1), each made disjoint, scored as a loglikelihood request."""
        rows = []
        for ctx, cont in map(make_disjoint_window, rolling_token_windows(self.tok_encode(text), BOS, T, 1)):
            rows.append(((ctx + cont)[-(T + 1):], len(cont)))
        return rows


def rolling_token_windows(tokens, prefix, max_seq_len, context_len):
    """lm_eval/utils.py get_rolling_token_windows: (input tokens, predicted tokens) pairs."""
    pred_len = max_seq_len - context_len + 1
    first = min(max_seq_len, len(tokens))
    yield [prefix] + tokens[:first - 1], tokens[:first]
    predicted = first
    while predicted < len(tokens):
        n = min(len(tokens) - predicted, pred_len)
        end = predicted + n
        yield tokens[end - max_seq_len - 1:end - 1], tokens[end - n:end]
        predicted += n


def make_disjoint_window(pair):
    """lm_eval/utils.py make_disjoint_window."""
    inputs, predicted = pair
    return inputs[:len(inputs) - (len(predicted) - 1)], predicted


# ---------------------------------------------------------------------------------------------------
# HF's Llama in float64

class RMSNormFloat64(modeling_flax_llama.FlaxLlamaRMSNorm):
    """FlaxLlamaRMSNorm without its float32 variance (meant for bf16 runs; a downcast here)."""

    def __call__(self, x):
        return self.weight * (x / jnp.sqrt(jnp.mean(x * x, axis=-1, keepdims=True) + self.epsilon))


class AttentionFloat64(modeling_flax_llama.FlaxLlamaAttention):
    """FlaxLlamaAttention with its softmax in the model's dtype (it takes float32 for any other)."""

    def setup(self):
        super().setup()
        self.attention_softmax_in_fp32 = False


def sinusoidal_positions_float64(num_pos, dim):
    """create_sinusoidal_positions without its float32 angles: [sin, cos] of position * theta^(-2i/dim)."""
    angles = np.outer(np.arange(num_pos), 1.0 / HF["rope_theta"] ** (np.arange(0, dim, 2) / dim))
    angles = np.concatenate([angles, angles], axis=-1)
    return jnp.array(np.concatenate([np.sin(angles)[:, None, :], np.cos(angles)[:, None, :]], axis=-1))


def float64_llama(hf_dir):
    """FlaxLlamaForCausalLM of `hf_dir` (PyTorch-layout safetensors) computing in float64 throughout (the
    module's three float32 round trips replaced, as dev/reference/make_reference.py does for torch)."""
    modeling_flax_llama.FlaxLlamaRMSNorm = RMSNormFloat64
    modeling_flax_llama.FlaxLlamaAttention = AttentionFloat64
    modeling_flax_llama.create_sinusoidal_positions = sinusoidal_positions_float64
    model = FlaxLlamaForCausalLM.from_pretrained(hf_dir, dtype=jnp.float64)
    model.params = jax.tree_util.tree_map(lambda x: jnp.asarray(x, jnp.float64), model.params)
    return model


def llama2_tokenizer(model_path):
    """HF's fast Llama-2 tokenizer as meta-llama/Llama-2-7b-hf ships it (tokenizer.json: the normalizer
    prepends '▁' and turns spaces into '▁', no pre-tokenizer), converted from the SentencePiece model."""
    tok = LlamaTokenizerFast(vocab_file=str(model_path), legacy=True, add_prefix_space=True, from_slow=True)
    normalizer = str(tok.backend_tokenizer.normalizer)
    assert "Prepend" in normalizer and tok.backend_tokenizer.pre_tokenizer is None, normalizer
    return tok


def forward(model, inputs):
    """The float64 logits (len(inputs), T, V) of at most FORWARD_ROWS token lists of at most T tokens, run
    as one batch of a fixed shape (JAX compiles each new shape), right-padded: causal, the padding changes
    no logit before it."""
    ids = np.full((FORWARD_ROWS, T), 2, dtype=np.int64)
    for r, tokens in enumerate(inputs):
        ids[r, :len(tokens)] = tokens
    return np.asarray(model(ids).logits, dtype=np.float64)[:len(inputs)]


def log_probs(model, rows):
    """Per row (tokens, n_score): the float64 log-probabilities of its scored tokens and, per scored
    position, the gap between its best and second-best logit and whether the target is the best."""
    out = []
    for i in range(0, len(rows), FORWARD_ROWS):
        chunk = rows[i:i + FORWARD_ROWS]
        logits = forward(model, [tokens[:-1] for tokens, _ in chunk])
        for (tokens, n_score), row_logits in zip(chunk, logits):
            x = row_logits[len(tokens) - 1 - n_score:len(tokens) - 1]
            m = x.max(axis=-1, keepdims=True)
            lp = x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))
            target = np.array(tokens[-n_score:])
            top2 = np.sort(x, axis=-1)[:, -2:]
            out.append((lp[np.arange(n_score), target], top2[:, 1] - top2[:, 0], x.argmax(axis=-1) == target))
    return out


def best(values):
    """np.argmax of `values`, checked to clear the next by MARGIN relative (a decision FP32 cannot flip)."""
    order = np.argsort(values)[::-1]
    assert values[order[0]] - values[order[1]] > MARGIN * abs(values[order[0]]), f"near tie: {values}"
    return int(order[0])


def harness_scores(harness, model, inputs):
    """The harness's metrics of the three sets and the rows it scores: ({set: metrics}, {set: rows as
    (record, choice, tokens, n_score)})."""
    rows = {"hellaswag": [], "lambada": [], "wikitext": []}
    docs = [hellaswag_doc(d) for d in inputs["hellaswag"]]
    for e, (query, choices, _) in enumerate(docs):
        rows["hellaswag"] += [(e, c, *harness.loglikelihood_row(query, " " + choice)) for c, choice in enumerate(choices)]
    rows["lambada"] = [(r, 0, *harness.loglikelihood_row(*lambada_doc(text))) for r, text in enumerate(inputs["lambada"])]
    for r, page in enumerate(inputs["wikitext"]):
        rows["wikitext"] += [(r, 0, *row) for row in harness.rolling_rows(wikitext_detokenizer(page))]
    scored = {name: log_probs(model, [(tokens, n) for _, _, tokens, n in rs]) for name, rs in rows.items()}

    ll = np.array([lp.sum() for lp, _, _ in scored["hellaswag"]]).reshape(len(docs), -1)
    acc = sum(best(ll[e]) == gold for e, (_, _, gold) in enumerate(docs))
    acc_norm = sum(best(ll[e] / [len(c) for c in choices]) == gold for e, (_, choices, gold) in enumerate(docs))
    metrics = {"hellaswag": {"acc": acc / len(docs), "acc_norm": acc_norm / len(docs), "examples": len(docs)}}

    for _, gap, _ in scored["lambada"]:
        assert gap.min() > MARGIN, f"near tie in a LAMBADA argmax: {gap}"
    lam = [(lp.sum(), bool(hit.all())) for lp, _, hit in scored["lambada"]]
    metrics["lambada"] = {"acc": sum(g for _, g in lam) / len(lam), "perplexity": math.exp(-np.mean([x for x, _ in lam])),
                          "examples": len(lam)}

    total = sum(lp.sum() for lp, _, _ in scored["wikitext"])
    words, nbytes = (sum(c) for c in zip(*map(wikitext_counts, inputs["wikitext"])))
    metrics["wikitext"] = {"word_perplexity": math.exp(-total / words), "byte_perplexity": math.exp(-total / nbytes),
                           "bits_per_byte": -total / nbytes / math.log(2), "examples": len(inputs["wikitext"])}
    return metrics, {name: sorted((r, c, tuple(t), n) for r, c, t, n in rs) for name, rs in rows.items()}


def disagreements(found, rows, expected, expected_rows, sets):
    """What the trainer's scores (metrics.jsonl) and dumped rows get wrong against the harness's, per set."""
    problems = []
    for name in sets:
        if sorted(rows[name]) != expected_rows[name]:
            problems.append(f"{name}: the trainer scored other rows than the harness")
        for key, want in expected[name].items():
            got = found[name][key]
            if key == "examples" or key.startswith("acc"):
                if got != want:
                    problems.append(f"{name} {key}: trainer {got}, harness {want}")
            elif not abs(got - want) <= PPL_RTOL * abs(want):
                problems.append(f"{name} {key}: trainer {got!r}, harness {want!r} (relative {abs(got - want) / abs(want):.2e})")
    return problems


# ---------------------------------------------------------------------------------------------------
# the model, the inputs, the files

def write_hf_llama(out, rng):
    """A random Llama in HF's LlamaForCausalLM layout (config.json, model.safetensors), at scales that
    spread the logits (std ~2.4), so that scores and argmaxes are well apart."""
    from safetensors.numpy import save_file
    C, F, V, kv = HF["hidden_size"], HF["intermediate_size"], HF["vocab_size"], HF["num_key_value_heads"]
    hs = C // HF["num_attention_heads"]
    w = {"model.embed_tokens.weight": rng.normal(0, 1, (V, C)), "model.norm.weight": 1 + 0.1 * rng.normal(size=C),
         "lm_head.weight": rng.normal(0, 0.2, (V, C))}
    for layer in range(HF["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        for name, shape in [("self_attn.q_proj", (C, C)), ("self_attn.k_proj", (kv * hs, C)), ("self_attn.v_proj", (kv * hs, C)),
                            ("self_attn.o_proj", (C, C)), ("mlp.gate_proj", (F, C)), ("mlp.up_proj", (F, C)),
                            ("mlp.down_proj", (C, F))]:
            w[p + name + ".weight"] = rng.normal(0, 1 / math.sqrt(shape[1]), shape)
        for name in ("input_layernorm", "post_attention_layernorm"):
            w[p + name + ".weight"] = 1 + 0.1 * rng.normal(size=C)
    out.mkdir(parents=True)
    config = dict(HF, architectures=["LlamaForCausalLM"], model_type="llama", hidden_act="silu", tie_word_embeddings=False,
                  bos_token_id=1, eos_token_id=2, torch_dtype="float32")
    (out / "config.json").write_text(json.dumps(config))
    save_file({k: v.astype(np.float32) for k, v in w.items()}, str(out / "model.safetensors"), metadata={"format": "pt"})


def greedy_passage(harness, model):
    """A LAMBADA passage whose last word is the model's greedy continuation of its context (one '▁word'
    token, tokenized the same after the context), so that acc counts a hit."""
    for context in GREEDY_CONTEXTS:
        ctx = harness.tok_encode(context)
        logits = forward(model, [ctx])[0, len(ctx) - 1]
        piece = harness.tok.convert_ids_to_tokens(int(logits.argmax()))
        if piece.startswith("▁") and piece[1:].isalpha() and harness.encode_pair(context, " " + piece[1:])[1] == [logits.argmax()]:
            return context + " " + piece[1:]
    pytest.fail("no context of GREEDY_CONTEXTS has a one-token greedy word: add some")


def write_inputs(d, inputs):
    """The inputs in the public sets' formats: HellaSwag's and LAMBADA's jsonl, WikiText's raw split."""
    (d / "hellaswag.jsonl").write_text("".join(json.dumps(x, ensure_ascii=False) + "\n" for x in inputs["hellaswag"]),
                                       encoding="utf-8")
    (d / "lambada.jsonl").write_text("".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in inputs["lambada"]),
                                     encoding="utf-8")
    (d / "wiki.test.raw").write_text(" \n" + "".join(inputs["wikitext"]), encoding="utf-8")


SCRIPTS = {"hellaswag": ("hellaswag.py", "hellaswag.jsonl"), "lambada": ("lambada.py", "lambada.jsonl"),
           "wikitext": ("wikitext.py", "wiki.test.raw")}


def make_files(d, out, scripts=DATA, sets=tuple(SCRIPTS), *args):
    """The eval files of `sets` written by the data scripts in `scripts` (a faulty copy's, or the tree's) from
    the inputs in `d`, into `out`."""
    out.mkdir(exist_ok=True)
    files = {}
    for name in sets:
        script, src = SCRIPTS[name]
        files[name] = out / f"{name}.bin"
        r = subprocess.run([sys.executable, scripts / script, d / src, "--out", files[name], *args], capture_output=True,
                           text=True, cwd=REPO, timeout=300)
        assert r.returncode == 0, r.stderr
    return files


def score(trainer, model_bin, files, out, *args):
    """`trainer -x 0 -p fp32` on `files`: ({set: metrics.jsonl object}, {set: the dumped rows})."""
    flags = {"hellaswag": ["-h", "1", "--hellaswag"], "lambada": ["--eval-lambada"], "wikitext": ["--eval-wikitext"]}
    r = run([trainer, "-x", "0", "-p", "fp32", "-e", model_bin, "-b", B, "-t", T, "-m", "1", "--shuffle", "0",
             *[a for name, path in files.items() for a in (*flags[name], path)], "-o", out, "--eval-dump", out / "dump", *args],
            timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    found = {name: obj for (_, name), obj in evals_of(out).items()}
    return found, {name: read_dump(out / "dump", name)[1] for name in files}


@pytest.fixture(scope="module")
def parity(tmp_path_factory, model_path, shakespeare):
    """The random HF Llama and its llm8 import, the reference (tokenizer, float64 model), the inputs and
    the harness's scores of them."""
    seed = int(os.environ.get("LLM8_TEST_SEED", secrets.randbits(32)))
    print(f"LLM8_TEST_SEED={seed}")
    d = tmp_path_factory.mktemp("parity")
    write_hf_llama(d / "hf", np.random.default_rng(seed))
    r = subprocess.run([sys.executable, REPO / "scripts/convert_hf.py", "import", d / "hf", d / "model.bin"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    harness, model = Harness(llama2_tokenizer(model_path)), float64_llama(d / "hf")
    inputs = {"hellaswag": HELLASWAG, "lambada": LAMBADA + [greedy_passage(harness, model)], "wikitext": WIKI_PAGES}
    write_inputs(d, inputs)
    expected, expected_rows = harness_scores(harness, model, inputs)
    return {"dir": d, "model": d / "model.bin", "inputs": inputs, "harness": harness, "expected": expected,
            "rows": expected_rows}


@pytest.fixture(scope="module")
def harness_run(parity):
    """The data scripts' files (default mode) scored by the trainer (default mode)."""
    d = parity["dir"]
    files = make_files(d, d / "files")
    return files, score(REPO / "train_llama_cpu", parity["model"], files, d / "run")


# ---------------------------------------------------------------------------------------------------
# the tests

def test_inputs_hold_the_artefacts(parity, harness_run, sp):
    """The inputs exercise what the rules are for: every rule of the data scripts' detokenizer changes some
    page's tokens (so any dropped one is caught), contexts with trailing spaces, contexts cut to -t, windows."""
    harness, inputs, rows = parity["harness"], parity["inputs"], parity["rows"]
    rules = llm8_evals.HARNESS_WIKITEXT_RULES
    for i, rule in enumerate(rules):
        changed = False
        for page in inputs["wikitext"]:
            text = page
            for pattern, replacement, regex in rules[:i] + rules[i + 1:]:
                text = re.sub(pattern, replacement, text) if regex else text.replace(pattern, replacement)
            changed = changed or sp.encode(text) != sp.encode(llm8_evals.wikitext_detokenize(page, "harness"))
        assert changed, f"no page has something for rule {rule}"
    queries = [hellaswag_doc(x)[0] for x in inputs["hellaswag"]]
    assert any(q != q.rstrip() for q in queries) and any(c.startswith(" ") for x in inputs["hellaswag"] for c in hellaswag_doc(x)[1])
    assert any(lambada_doc(t)[0].endswith(" ") for t in inputs["lambada"])
    assert any(len(harness.encode_pair(q, " x")[0]) > T for q in queries), "no HellaSwag context longer than -t"
    windows = [n for r, _, _, n in rows["wikitext"] if r == 0]   # the predictions of each window of page 0
    assert len(windows) > 2 and min(windows) < T and [n for r, _, _, n in rows["wikitext"] if r == 1][0] < T
    assert parity["expected"]["lambada"]["acc"] > 0


def test_trainer_scores_as_the_harness(parity, harness_run):
    _, (found, rows) = harness_run
    expected = parity["expected"]
    for name, metrics in expected.items():
        print(name, {k: f"{found[name][k]:.9g} ({found[name][k] / v - 1:+.1e})" for k, v in metrics.items() if v})
    assert disagreements(found, rows, expected, parity["rows"], SCRIPTS) == []


def faulty_data_scripts(root, old, new):
    """dev/data copied under `root` with `old` replaced by `new` in llm8_evals.py."""
    copy = root / "data"
    shutil.copytree(DATA, copy, ignore=shutil.ignore_patterns("cache", "*.bin", "__pycache__", "tinyshakespeare", "hellaswag",
                                                              "lambada", "wikitext"))
    source = (copy / "llm8_evals.py").read_text()
    assert source.count(old) == 1, f"llm8_evals.py no longer has exactly one copy of the text this fault replaces: {old!r}"
    (copy / "llm8_evals.py").write_text(source.replace(old, new))
    return copy


def faulty_trainer(root, path, old, new):
    """train_llama_cpu built from a copy of the tree with `old` replaced by `new` in `path`."""
    copy = root / "src"
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, capture_output=True, text=True,
                           check=True).stdout.split()
    for f in files:
        if (REPO / f).is_file() and not f.startswith("dev/"):
            (copy / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / f, copy / f)
    source = (copy / path).read_text()
    assert source.count(old) == 1, f"{path} no longer has exactly one copy of the text this fault replaces: {old!r}"
    (copy / path).write_text(source.replace(old, new))
    (copy / "build").mkdir()
    (copy / "build/.setup-done").touch()
    # -O1 from the environment (make's `CFLAGS ?=` takes it and still appends the required flags): half the time
    r = subprocess.run(["make", "-C", copy, "train_llama_cpu"], capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, CFLAGS="-O1"))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return copy / "train_llama_cpu"


# (name, where: data scripts or the trainer, file, text, its faulty replacement, the sets it must spoil)
FAULTS = [
    ("detokenizer_rule_dropped", "data", "dev/data/llm8_evals.py",
     '    (" ; ", "; ", False),\n', "", ["wikitext"]),
    ("bos_added", "data", "dev/data/llm8_evals.py",
     '    return ([sp.bos_id()] if compat == "llm8" else []) + ctx_ids, whole[len(ctx_ids):]\n',
     '    return [sp.bos_id()] + ctx_ids, whole[len(ctx_ids):]\n', ["hellaswag", "lambada"]),
    ("window_one_token_short", "trainer", "dataloader/eval_sets.h",
     "        int count = n - predicted < T ? n - predicted : T;\n",
     "        int count = n - predicted < T - 1 ? n - predicted : T - 1;\n", ["wikitext"]),
]


@pytest.mark.parametrize("name, where, path, old, new, spoiled", FAULTS, ids=[f[0] for f in FAULTS])
def test_planted_fault_is_caught(parity, harness_run, tmp_path, model_path, name, where, path, old, new, spoiled):
    d = parity["dir"]
    files, (found, rows) = harness_run
    if where == "data":
        scripts = faulty_data_scripts(tmp_path, old, new)
        files = make_files(d, tmp_path / "files", scripts, spoiled, "--tokenizer", model_path)
        found, rows = score(REPO / "train_llama_cpu", parity["model"], files, tmp_path / "run")
    else:
        found, rows = score(faulty_trainer(tmp_path, path, old, new), parity["model"], {s: files[s] for s in spoiled},
                            tmp_path / "run")
    problems = disagreements(found, rows, parity["expected"], parity["rows"], spoiled)
    print("\n".join(problems))
    for s in spoiled:
        assert any(p.startswith(s) for p in problems), f"{name}: {s} not caught: {problems}"


def test_modes_differ(parity, harness_run, tmp_path):
    """The same inputs in --eval-compat llm8: other tokens (BOS, llm8's detokenizer), so other scores; the
    relative differences are what docs/evaluation.md quotes."""
    d = parity["dir"]
    files = make_files(d, tmp_path / "files", DATA, tuple(SCRIPTS), "--eval-compat", "llm8")
    found, rows = score(REPO / "train_llama_cpu", parity["model"], files, tmp_path / "run", "--eval-compat", "llm8")
    harness_found, harness_rows = harness_run[1]
    for name in SCRIPTS:
        assert sorted(rows[name]) != sorted(harness_rows[name]), name
        for key, value in found[name].items():
            if key not in ("step", "eval", "examples"):
                h = harness_found[name][key]
                print(f"{name} {key}: llm8 {value:.6g}, harness {h:.6g}" + (f" ({value / h - 1:+.2%})" if h else ""))
    assert found["wikitext"]["word_perplexity"] != harness_found["wikitext"]["word_perplexity"]
