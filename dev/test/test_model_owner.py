"""
Only model/ writes a field of the Llama struct (docs/model.md "Modes"): the trainer, the data-parallel
driver, the shadow check and the tests switch the model's modes through its functions. The scan reads
every C/C++/CUDA source outside model/ for an assignment (=, op=, ++, --) or a memset/memcpy into a field
reached from a Llama: any name some source declares as a Llama or a pointer to one (a variable, a
parameter, a struct member such as the trainer's tr->model). The planted writes prove it sees them.
"""
import re
import subprocess

from conftest import REPO

COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)
DECLARED = re.compile(r"\bLlama\b\s*\**\s*([A-Za-z_]\w*)\s*[;,)=\[]")
FIELD = r"(?:\[[^\]]*\])?(?:\.|->)[A-Za-z_]\w*(?:\[[^\]]*\])?(?:(?:\.|->)[A-Za-z_]\w*(?:\[[^\]]*\])?)*"


def llama_names(texts):
    """Every name declared as a Llama or a pointer to one in the C source texts."""
    return {name for text in texts for name in DECLARED.findall(COMMENT.sub("", text))}


def writes(text, names):
    """(line number, line) of every write to a field of a Llama called one of `names` in C source text."""
    llama = r"\b(?:" + "|".join(sorted(map(re.escape, names))) + r")\b"
    assign = re.compile(llama + FIELD + r"\s*(?:=(?!=)|\+\+|--|\+=|-=|\*=|/=|\|=|&=)")
    mem = re.compile(r"\b(?:memset|memcpy)\s*\(\s*&?\(?" + llama + r"(?:\.|->)[A-Za-z_]")
    found = []
    for number, line in enumerate(COMMENT.sub(lambda c: "\n" * c.group().count("\n"), text).split("\n"), 1):
        if assign.search(line) or mem.search(line):
            found.append((number, line.strip()))
    return found


def sources():
    names = subprocess.run(["git", "ls-files", "*.h", "*.c", "*.cu", "*.cuh", "*.cpp"], cwd=REPO, capture_output=True,
                           text=True, check=True).stdout.split()
    return {n: (REPO / n).read_text(errors="replace") for n in names}


def test_no_llama_field_written_outside_model():
    texts = sources()
    names = llama_names(texts.values())
    assert {"m", "model"} <= names, f"the scan finds the Llama declarations no longer: {sorted(names)}"
    found = [f"{name}:{n}: {line}" for name, text in texts.items() if not name.startswith("model/")
             for n, line in writes(text, names)]
    assert not found, "Llama fields written outside model/ (use the model's functions):\n" + "\n".join(found)


def test_planted_writes_are_found():
    texts = sources()
    names = llama_names(texts.values())
    shadow = texts["train/shadow.h"]
    assert not writes(shadow, names)
    planted = shadow.replace("    llama_set_linear_precision(m, PRECISION_BF16);", "    m->mode.linears_bf16 = 1;", 1)
    assert planted != shadow, "the line to plant the write at is gone from train/shadow.h"
    assert [line for _, line in writes(planted, names)] == ["m->mode.linears_bf16 = 1;"]
    assert writes("static void f(Llama* m) { memset(&m->mode.hooks, 0, sizeof(m->mode.hooks)); }", names)
    assert writes("    tr->model.fp8.history_steps++;", names)
    # a Llama under a new name: the declaration makes it one
    alias = "static void f(Trainer* tr) {\n    Llama* net = &tr->model;\n    net->replaying = 1;\n}\n"
    assert writes(alias, llama_names([alias])) == [(3, "net->replaying = 1;")]
    assert not writes("    m->mode.linears_bf16 == 1;  /* m->replaying = 1; */", names)
