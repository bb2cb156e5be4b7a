"""
Shared pytest set-up for llm8's test suite (`make test` runs `python -m pytest dev/test`).

Fixtures give the repository root and the built CPU binaries. A test marked `sanitize` runs twice: on
the normal binaries and on their AddressSanitizer + UndefinedBehaviorSanitizer build (build/sanitize,
`make SANITIZE=1 cpu`), where any report fails it. The suite ends with the line "N passed, N failed"
(plus ", N skipped" when some were), after pytest's own summary, so that the test command's last line
reads the same whatever runner produced the counts.
"""
import concurrent.futures
import contextlib
import importlib.util
import os
import re
import secrets
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
SANITIZE_DIR = REPO / "build/sanitize"
_counts = {"passed": 0, "failed": 0, "skipped": 0}


def pytest_configure(config):
    config.addinivalue_line("markers", "sanitize: run on the sanitized CPU binaries (build/sanitize) too")


def pytest_generate_tests(metafunc):
    if "build" in metafunc.fixturenames and metafunc.definition.get_closest_marker("sanitize"):
        metafunc.parametrize("build", ["default", "sanitize"])


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


def binary(name, build="default"):
    """Path of a built binary (the repo root's, or build/sanitize's for the sanitize build); fails the
    test with the make command when missing."""
    path = REPO / name if build == "default" else SANITIZE_DIR / name
    if not path.exists():
        pytest.fail(f"{path} is not built: run `make {path.relative_to(REPO)}` first")
    return path


# Function-scoped (a path lookup), so that a test that is not marked `sanitize` never gets the binary
# a marked test asked for before it.
@pytest.fixture
def build():
    """Which build of the CPU binaries the test runs: "default", or also "sanitize" when marked so."""
    return "default"


@pytest.fixture
def trainer(build):
    return binary("train_llama_cpu", build)


@pytest.fixture
def checker(build):
    return binary("test_llama_cpu", build)


@pytest.fixture
def numerics():
    """dev/tools/numerics.c: the CPU build's codecs, AdamW, FP8 GEMM and gradient wire as file commands."""
    return binary("build/tools/numerics")


@pytest.fixture
def rng():
    """A numpy generator from a fresh seed (printed; LLM8_TEST_SEED replays it)."""
    seed = int(os.environ.get("LLM8_TEST_SEED", secrets.randbits(32)))
    print(f"LLM8_TEST_SEED={seed}")
    return np.random.default_rng(seed)


# The trainer stops on every error through die() -> exit(1) with its buffers still allocated, on purpose;
# whether LeakSanitizer calls them leaks then depends on the registers the compiler left them in. Open MPI
# too leaves its own allocations to the process exit (hundreds of small blocks in libmpi and its modules).
# So the trainer's sanitized runs keep ASan and UBSan but not leak checking (unless the caller sets
# ASAN_OPTIONS); test_llama_cpu's checks return from main having freed everything and keep it.
SANITIZED_TRAINER_ASAN_OPTIONS = "detect_leaks=0"


def program_env(exe, env=None):
    """The environment to run `exe` in: `env` (default os.environ), plus the above for the sanitized trainer."""
    env = dict(os.environ if env is None else env)
    if Path(exe) == SANITIZE_DIR / "train_llama_cpu":
        env.setdefault("ASAN_OPTIONS", SANITIZED_TRAINER_ASAN_OPTIONS)
    return env


def run(cmd, **kw):
    """Runs a command from the repo root, capturing text output."""
    kw["env"] = program_env(cmd[0], kw.get("env"))
    return subprocess.run([str(c) for c in cmd], cwd=REPO, capture_output=True, text=True, **kw)


def run_side_by_side(cmds, timeout=600):
    """Runs independent commands (the CPU trainer's) at once, each on one OpenMP thread, from the repo root;
    returns their CompletedProcess in order. The CPU build's results do not depend on the thread count, and
    at the tests' small shapes a run gains little from a second thread: on 2 cores two runs side by side
    take less wall time than the same runs one after the other on both."""
    procs = []
    for cmd in cmds:
        env = program_env(cmd[0], {**os.environ, "OMP_NUM_THREADS": "1"})
        procs.append(subprocess.Popen([str(c) for c in cmd], cwd=REPO, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    results = []
    for cmd, proc in zip(cmds, procs):
        out, err = proc.communicate(timeout=timeout)
        results.append(subprocess.CompletedProcess([str(c) for c in cmd], proc.returncode, out, err))
    return results


# Prepended to a copy of a C++ source whose planted faults sit behind runtime switches (plant_switched):
# one build of the copy serves every fault in it, the one named by LLM8_PLANTED_FAULT being on.
PLANTED_SWITCH = """#ifndef LLM8_PLANTED_SWITCH
#define LLM8_PLANTED_SWITCH
#include <stdlib.h>
#include <string.h>
static inline bool llm8_planted(const char* name) {
    static const char* on = getenv("LLM8_PLANTED_FAULT");
    return on != nullptr && strcmp(on, name) == 0;
}
#endif
"""


def plant_switched(source, name, old, new):
    """`source` (a C++ file's text) with fault `name` planted behind its switch: `old`, whole lines found
    exactly once, and `new` its faulty replacement; the lines after their common leading lines (whole
    statements, nothing they declare used after them) become
    `if (llm8_planted("name")) { the new lines } else { the old lines }`, run as the source or as the
    fault by LLM8_PLANTED_FAULT=name. Prepends PLANTED_SWITCH (once)."""
    assert source.count(old) == 1, f"{name}: the source no longer has exactly one copy of the text it replaces: {old!r}"
    a, b = old.splitlines(keepends=True), new.splitlines(keepends=True)
    assert old.endswith("\n") and new[-1:] in ("", "\n"), f"{name}: old and new must be whole lines"
    same = 0
    while same < min(len(a), len(b)) and a[same] == b[same]:
        same += 1
    indent = re.match(r"[ \t]*", (a[same:] or b[same:])[0]).group(0)
    switched = "".join(a[:same]) + f'{indent}if (llm8_planted("{name}")) {{\n' + "".join(b[same:]) + \
        f"{indent}}} else {{\n" + "".join(a[same:]) + f"{indent}}}\n"
    source = source.replace(old, switched)
    return source if source.startswith(PLANTED_SWITCH) else PLANTED_SWITCH + source


@contextlib.contextmanager
def two_at_a_time(request, tests, key, job, then=()):
    """For a module-scoped fixture whose tests each wait on one single-threaded run: starts job(*key) for
    the key(params) of every item of this session whose test is named in `tests`, two at a time (CI's
    two cores), in the order the tests run, then each (key, callable) of `then` on the same two workers;
    yields {key: future of its result}, cancels what is left."""
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=2)
    futures = {}
    for item in request.session.items:
        if item.originalname in tests:
            k = key(item.callspec.params)
            futures[k] = pool.submit(job, *k)
    for k, fn in then:
        futures[k] = pool.submit(fn)
    try:
        yield futures
    finally:
        pool.shutdown(cancel_futures=True)
