"""
Shared pytest set-up for llm8's test suite (`make test` runs `python -m pytest dev/test`).

Fixtures give the repository root and the built CPU binaries. The suite ends with the line
"N passed, N failed" (plus ", N skipped" when some were), after pytest's own summary, so that the test
command's last line reads the same whatever runner produced the counts.
"""
import os
import secrets
import subprocess
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
_counts = {"passed": 0, "failed": 0, "skipped": 0}


def pytest_runtest_logreport(report):
    if report.when == "call" or report.outcome != "passed":
        if report.outcome == "passed":
            _counts["passed"] += 1
        elif report.outcome == "skipped":
            _counts["skipped"] += 1
        else:
            _counts["failed"] += 1


def pytest_unconfigure(config):
    if config.option.collectonly:
        return
    line = f"{_counts['passed']} passed, {_counts['failed']} failed"
    if _counts["skipped"]:
        line += f", {_counts['skipped']} skipped"
    print("\n" + line)


@pytest.fixture(scope="session")
def repo():
    return REPO


def binary(name):
    """Path of a built binary in the repo root; fails the test with the make command when missing."""
    path = REPO / name
    if not path.exists():
        pytest.fail(f"{path} is not built: run `make {name}` first")
    return path


@pytest.fixture(scope="session")
def trainer():
    return binary("train_llama_cpu")


@pytest.fixture(scope="session")
def checker():
    return binary("test_llama_cpu")


@pytest.fixture
def rng():
    """A numpy generator from a fresh seed (printed; LLM8_TEST_SEED replays it)."""
    seed = int(os.environ.get("LLM8_TEST_SEED", secrets.randbits(32)))
    print(f"LLM8_TEST_SEED={seed}")
    return np.random.default_rng(seed)


def run(cmd, **kw):
    """Runs a command from the repo root, capturing text output."""
    return subprocess.run([str(c) for c in cmd], cwd=REPO, capture_output=True, text=True, **kw)
