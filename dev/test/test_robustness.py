"""
The robustness checks' own plumbing (docs/testing.md "Robustness checks"): a short pass of every libFuzzer
harness in dev/fuzz (FUZZ_SECONDS each, default 5, two at a time, from the seeds and the committed regression inputs,
which replay first; `make fuzz FUZZ_SECONDS=N` is the long run), regression inputs that reach a
harness, and sanitized CPU binaries that really carry AddressSanitizer and UBSan (the tests marked
`sanitize` run on them).
"""
import os

import pytest

from conftest import REPO, binary, run, two_at_a_time

FUZZ_DIR = REPO / "dev/fuzz"
HARNESSES = sorted(p.stem.removeprefix("fuzz_") for p in FUZZ_DIR.glob("fuzz_*.c"))
FUZZ_SECONDS = os.environ.get("FUZZ_SECONDS", "5")


def fuzz(harness):
    """fuzz.sh's run of one harness for FUZZ_SECONDS (its own corpus, crashes and log)."""
    return run(["bash", FUZZ_DIR / "fuzz.sh", FUZZ_SECONDS, harness])


@pytest.fixture(scope="module")
def fuzz_runs(request):
    """{(harness,): future of its fuzz run} for the harnesses this session selected: each fuzzes on one
    thread, so they run two at a time, started when the first is asked for."""
    with two_at_a_time(request, ("test_fuzz_harness",), lambda p: (p["harness"],), fuzz) as runs:
        yield runs


@pytest.mark.parametrize("harness", HARNESSES)
def test_fuzz_harness(fuzz_runs, harness):
    binary(f"build/fuzz/fuzz_{harness}")
    r = fuzz_runs[(harness,)].result()
    print(r.stdout, r.stderr)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"fuzz {harness}" in r.stdout and " ok " in r.stdout


def test_regressions_belong_to_harnesses():
    """A regression folder named after no harness would never be replayed."""
    folders = [p.name for p in (FUZZ_DIR / "regressions").iterdir()]
    assert folders and set(folders) <= set(HARNESSES), (folders, HARNESSES)


@pytest.mark.parametrize("name", ["train_llama_cpu", "test_llama_cpu"])
def test_sanitized_binaries_are_instrumented(name):
    path = binary(name, "sanitize")
    libraries = run(["ldd", path]).stdout
    assert "libasan" in libraries and "libubsan" in libraries, libraries
    r = run([path, "--help"], env={**os.environ, "ASAN_OPTIONS": "help=1"})
    assert "Available flags for AddressSanitizer" in r.stdout + r.stderr
