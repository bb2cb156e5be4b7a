"""
Only model/ writes a field of the Llama struct (docs/model.md "Modes"): the trainer, the data-parallel
driver, the shadow check and the tests switch the model's modes through its functions. The scan reads
every C/C++/CUDA source outside model/ for an assignment (=, op=, ++, --) or a memset/memcpy into a field
reached from a Llama (a variable m or model, tr->model, dp->m, sh->m); the planted write proves it sees one.
"""
import re
import subprocess

from conftest import REPO

LLAMA = r"(?:\bm\b|\bmodel\b|tr->model|dp->m|sh->m|\bm\[[a-z0-9]+\])"
FIELD = r"(?:\.|->)[a-z_][a-z_0-9]*(?:\[[^\]]*\])?(?:(?:\.|->)[a-z_0-9]+(?:\[[^\]]*\])?)*"
ASSIGN = re.compile(LLAMA + FIELD + r"\s*(?:=(?!=)|\+\+|--|\+=|-=|\*=|/=|\|=)")
MEM = re.compile(r"\b(?:memset|memcpy)\s*\(\s*&?\(?" + LLAMA + r"(?:\.|->)[a-z_]")


def writes(text):
    """(line number, line) of every write to a Llama field in C source text (comments dropped)."""
    found = []
    for number, line in enumerate(text.split("\n"), 1):
        code = re.sub(r"/\*.*?\*/|//.*", "", line)
        if ASSIGN.search(code) or MEM.search(code):
            found.append((number, line.strip()))
    return found


def sources():
    names = subprocess.run(["git", "ls-files", "*.h", "*.c", "*.cu", "*.cuh", "*.cpp"], cwd=REPO, capture_output=True,
                           text=True, check=True).stdout.split()
    return [n for n in names if not n.startswith("model/")]


def test_no_llama_field_written_outside_model():
    found = [f"{name}:{n}: {line}" for name in sources() for n, line in writes((REPO / name).read_text(errors="replace"))]
    assert not found, "Llama fields written outside model/ (use the model's functions):\n" + "\n".join(found)


def test_a_planted_write_is_found():
    shadow = (REPO / "train/shadow.h").read_text()
    assert not writes(shadow)
    planted = shadow.replace("    llama_set_linear_precision(m, PRECISION_BF16);", "    m->mode.linears_bf16 = 1;", 1)
    assert planted != shadow, "the line to plant the write at is gone from train/shadow.h"
    assert [line for _, line in writes(planted)] == ["m->mode.linears_bf16 = 1;"]
    assert writes("static void f(Llama* m) { memset(&m->mode.hooks, 0, sizeof(m->mode.hooks)); }")
    assert writes("    tr->model.fp8.history_steps++;")
