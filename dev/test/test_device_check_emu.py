"""
The device check rehearsed on the emulated GPU (scripts/device_check.sh --emulated): the same
driver on build/emu/test_llama and build/emu/train_llama at scaled-down shapes, within its default 95 s
budget. Rows whose only need is an execution model must give a real answer (ok): the kernel checks, the
memory plan against what the emulated run allocated, the real-text curves (emulated fp8 against emulated
bf16 and against train_llama_cpu's fp8 curve at the same flags), resume, the trainer's memory report after
step 1 by category. Rows that need the hardware must say "emulated: not measured", and no row may FAIL.
The budget table of docs/device-check.md holds the driver's phases and budgets.
"""
import importlib.util
import itertools
import os
import re
import subprocess
import time

import pytest

from conftest import REPO, run

EMU = REPO / "build/emu"
ROW = re.compile(r"^(.{46}) \| (ok|FAIL|skip|info|bench) +\| (.*)$")
SUMMARY_MARK = "== device check summary"
NOT_MEASURED = "emulated: not measured"
NO_TIME = "no time left"


def test_device_check_rehearsal(tmp_path, shakespeare):
    for exe in (EMU / "train_llama", EMU / "test_llama", REPO / "train_llama_cpu", REPO / "build/tools/write_shard"):
        if not exe.exists():
            pytest.skip(f"{exe.relative_to(REPO)} is not built (make emu, make test-build)")
    out = tmp_path / "out"
    t0 = time.time()
    r = run(["bash", "scripts/device_check.sh", "--emulated", out], env={**os.environ, "EMU_DATA": str(shakespeare)}, timeout=240)
    wall = time.time() - t0
    print(f"rehearsal: {wall:.0f} s wall")
    assert SUMMARY_MARK in r.stdout, r.stdout[-3000:] + r.stderr[-2000:]
    table = r.stdout.split(SUMMARY_MARK, 1)[1]
    print(table)
    rows = {}
    for line in table.splitlines():
        m = ROW.match(line)
        if m and m[1].strip() != "check":
            rows[m[1].strip()] = (m[2], m[3])
    assert not [n for n, (st, _) in rows.items() if st == "FAIL"], table
    assert r.returncode == 0, table

    checks = subprocess.run([str(EMU / "test_llama"), "--list"], capture_output=True, text=True, cwd=REPO).stdout.split()
    kernels = [c for c in checks if c.startswith("kernel_")]
    assert len(kernels) >= 10
    for name in checks:
        status, detail = rows[f"test_llama {name}"]
        if name.startswith("kernel_"):
            assert status == "ok", (name, status, detail)  # every kernel row is a real answer
        elif name.startswith("prod_"):
            assert status == "skip" and NOT_MEASURED in detail, (name, status, detail)
        else:
            assert status in ("ok", "skip"), (name, status, detail)
    real = ["-p bf16 memory plan (-e tiny -b 2 -t 32)", "-p fp8 memory plan (-e tiny -b 2 -t 32)",
            "fp8 delayed memory plan (-e tiny -b 2 -t 32)",
            "real text: CPU -p fp8 run (train_llama_cpu)", "real text: GPU -p bf16 run", "real text: GPU -p fp8 run",
            "real text: GPU fp8 vs GPU bf16 (1%)", "real text: GPU fp8 vs CPU fp8 curve (0.5%)"]
    for name in real:
        assert rows.get(name, ("missing",))[0] == "ok", (name, rows.get(name))
    assert "in use / plan" in rows[real[0]][1]
    # the trainer's memory report after step 1: every category of the fp8 run's plan against what it allocated,
    # and for each run llm8's allocations and the memory that is not llm8's (0 here: the context and libraries
    # are not emulated, and every allocation is counted)
    for category in ("master weights", "working weights", "FP8 weight copies", "gradients", "AdamW moments", "activations",
                     "other", "workspaces"):
        assert rows.get(f"-p fp8 {category}", ("missing",))[0] == "ok", (category, rows.get(f"-p fp8 {category}"))
    for precision in ("-p bf16", "-p fp8", "fp8 delayed"):
        assert rows.get(f"{precision} llm8's allocations", ("missing",))[0] == "ok", rows.get(f"{precision} llm8's allocations")
        status, detail = rows.get(f"{precision} not llm8's (context, libraries)", ("missing", ""))
        assert status == "ok" and "less llm8's: 0.00 MiB" in detail and NOT_MEASURED in detail, (precision, status, detail)
    # resume is the last training row: a loaded machine may leave it no time, which the row says
    status, detail = rows["resume tiny from step 1 (LLM8_DETERMINISTIC=1)"]
    assert status == "ok" or (status == "skip" and NO_TIME in detail), (status, detail)
    hardware = ["GPU (nvidia-smi)", "attention path", "GEMM benchmark", "train 7b-shape L4 T4096 tokens/s",
                "shadow check 7b-shape L4 T4096 --shadow-grad 1"]
    for name in hardware + [n for n in rows if n.startswith("memcheck ")]:
        status, detail = rows[name]
        assert status == "skip" and NOT_MEASURED in detail, (name, status, detail)


def load_driver():
    spec = importlib.util.spec_from_file_location("device_check", REPO / "scripts/device_check.py")
    driver = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(driver)
    return driver


def docs_budgets(text):
    """(phase, budget) of each row of docs/device-check.md's budget table, in order."""
    section = text.split("\n## Budget\n", 1)[1].split("\n## ", 1)[0]
    return [(m[1], int(m[2])) for m in re.finditer(r"^\| ([^|]+?) \| (\d+) \|", section, re.M)]


def budget_mismatches(docs, phases):
    """Where the docs' table and the driver's PHASES differ, row by row (names, order, budgets)."""
    table = [(p.name, p.budget_s) for p in phases]
    return [(d, t) for d, t in itertools.zip_longest(docs, table) if d != t]


def test_docs_budget_table_is_the_drivers():
    driver = load_driver()
    text = (REPO / "docs/device-check.md").read_text()
    docs = docs_budgets(text)
    assert len(docs) == len(driver.PHASES) >= 15, docs
    assert not budget_mismatches(docs, driver.PHASES)
    # planted: one budget changed in a copy of the docs, then in a copy of the driver's table; a phase dropped
    planted = text.replace("| build | 180 |", "| build | 190 |")
    assert planted != text and budget_mismatches(docs_budgets(planted), driver.PHASES)
    phases = [p._replace(budget_s=p.budget_s + 1) if p.name == "memcheck" else p for p in driver.PHASES]
    assert budget_mismatches(docs, phases) == [(("memcheck", 90), ("memcheck", 91))]
    assert budget_mismatches(docs, driver.PHASES[:-1])


def test_a_failing_phase_costs_its_row(tmp_path):
    """An error of the driver in one phase gives that phase a FAIL row, and the phases after it still run."""
    driver = load_driver()
    driver.R.summary, driver.R.rows, driver.R.failed = str(tmp_path / "summary.txt"), [], 0
    ran = []

    def broken(seconds):
        raise KeyError("planted")

    driver.run_phases([driver.Phase("first", 1, ran.append), driver.Phase("broken", 2, broken), driver.Phase("last", 3, ran.append)])
    assert ran == [1, 3]
    assert driver.R.failed == 1 and "phase broken" in driver.R.rows[0] and "KeyError: 'planted'" in driver.R.rows[0]
    assert (tmp_path / "summary.txt").read_text() == driver.R.rows[0] + "\n"
