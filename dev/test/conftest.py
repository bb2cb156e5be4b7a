"""
Shared pytest set-up for llm8's test suite (`make test` runs `python -m pytest dev/test`).

Fixtures give the repository root and the built CPU binaries. The suite ends with the line
"N passed, N failed" (plus ", N skipped" when some were), after pytest's own summary, so that the test
command's last line reads the same whatever runner produced the counts.
"""
import importlib.util
import os
import secrets
import subprocess
import sys
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


def load_llm8_data():
    """dev/data/llm8_data.py, loaded by path (dev/data on sys.path would shadow the stdlib's tokenize)."""
    spec = importlib.util.spec_from_file_location("llm8_data", REPO / "dev/data/llm8_data.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _data_error():
    """None when the Llama-2 tokenizer and tiny-shakespeare can be found (or fetched), else why not."""
    llm8_data = load_llm8_data()
    try:
        for kind in ("tokenizer", "tinyshakespeare"):
            llm8_data.resolve_data_file(kind)
    except llm8_data.DataError as e:
        return str(e)
    return None


DATA_ERROR = _data_error()
# Tests that need the real tokenizer and text; skipped, with the reason, on a machine that has neither
# the shared data folder nor network access to the public originals.
requires_data = pytest.mark.skipif(DATA_ERROR is not None, reason=f"shared data unavailable: {DATA_ERROR}")
SHAKESPEARE_TRAIN = REPO / "dev/data/tinyshakespeare/tiny_shakespeare_train.bin"


def shared_data_file(kind):
    """llm8_data.resolve_data_file(kind), or a skip with the reason when the shared data is unavailable."""
    if DATA_ERROR is not None:
        pytest.skip(f"shared data unavailable: {DATA_ERROR}")
    return load_llm8_data().resolve_data_file(kind)


@pytest.fixture(scope="session")
def model_path():
    """The Llama-2 SentencePiece model."""
    return shared_data_file("tokenizer")


@pytest.fixture(scope="session")
def text_path():
    """tiny-shakespeare's input.txt."""
    return shared_data_file("tinyshakespeare")


@pytest.fixture(scope="session")
def sp(model_path):
    """The Llama-2 tokenizer, loaded by sentencepiece itself (the tests' independent reference)."""
    import sentencepiece as spm
    return spm.SentencePieceProcessor(model_file=str(model_path))


@pytest.fixture(scope="session")
def shakespeare():
    """The tokenized tiny-shakespeare shards (the default -i/-j of the trainer), prepared if missing."""
    shared_data_file("tinyshakespeare")
    if not SHAKESPEARE_TRAIN.exists():
        subprocess.run([sys.executable, str(REPO / "dev/data/tinyshakespeare.py")], cwd=REPO, check=True)
    return SHAKESPEARE_TRAIN.parent


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
