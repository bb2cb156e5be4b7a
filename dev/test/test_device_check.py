"""
scripts/device_check.sh on a machine without a GPU (CI's): it must still run to the end and print its
table, with one row per test_llama check (each FAIL or skip, with the reason), in the order of value per
second of docs/device-check.md#budget (build, smoke check, production shapes, throughput, ..., kernel
families, memcheck), and leave in its output folder no more than the device machine gives back: at most 8
files of at most 16 MiB.
"""
import re
import subprocess
import tarfile

import pytest

from conftest import REPO, run

MAX_FILES = 8
MAX_FILE_BYTES = 16 << 20
ROW = re.compile(r"^(.{46}) \| (ok|FAIL|skip|info|bench) +\| (.*)$")
SUMMARY_MARK = "== device check summary"


def gpu_present():
    try:
        return subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode == 0
    except FileNotFoundError:
        return False


def test_device_check_without_gpu(tmp_path):
    if not (REPO / "test_llama").exists():
        pytest.skip("test_llama is not built (no nvcc here): nothing for the device check to run")
    if gpu_present():
        pytest.skip("a GPU is present: run scripts/device_check.sh itself")
    out = tmp_path / "out"
    r = run(["bash", "scripts/device_check.sh", out], timeout=300)
    assert r.returncode == 1, f"without a GPU some rows must say FAIL:\n{r.stdout[-3000:]}\n{r.stderr[-2000:]}"
    assert SUMMARY_MARK in r.stdout, r.stdout[-3000:]
    table = r.stdout.split(SUMMARY_MARK, 1)[1].splitlines()
    rows, order = {}, []
    for line in table:
        m = ROW.match(line)
        if m and m[1].strip() != "check":
            rows[m[1].strip()] = (m[2], m[3])
            order.append(m[1].strip())
    checks = run([REPO / "test_llama", "--list"]).stdout.split()
    assert "prod_fp8_linear_13b" in checks and "prod_attention" in checks and "nccl_one_rank" in checks
    for name in checks:
        status, reason = rows[f"test_llama {name}"]
        assert status in ("FAIL", "skip") and reason.strip(), (name, status, reason)
        assert order.count(f"test_llama {name}") == 1, name
    for name in ["GPU (nvidia-smi)", "attention path"]:
        assert name in rows, f"no row {name!r}"
    assert any(name.startswith("memcheck ") for name in rows)
    assert not any("not a check of test_llama" in reason for _, reason in rows.values()), rows

    # the order of value per second: what the budget must hold first, what it may cut last
    def first(prefix):
        return next(i for i, name in enumerate(order) if name.startswith(prefix))

    phases = ["build ", "device and library versions", "test_llama kernel_gemm", "test_llama prod_fp8_linear_7b",
              "test_llama prod_attention", "test_llama prod_fp8_linear_13b", "train 7b-shape", "test_llama reference_bf16",
              "test_llama nccl_one_rank", "real text", "resume ", "test_llama hopper_accum_oracle",
              "test_llama kernel_optimizer", "shadow check", "memcheck "]
    at = [first(p) for p in phases]
    assert at == sorted(at), list(zip(phases, at))
    kernel_rows = [i for i, name in enumerate(order) if name.startswith("test_llama kernel_") and name != "test_llama kernel_gemm"]
    model_rows = [i for i, name in enumerate(order) if name.startswith("test_llama ") and "kernel_" not in name and "prod_" not in name]
    assert max(model_rows) < min(kernel_rows) and max(kernel_rows) < first("memcheck ")

    files = [p for p in out.rglob("*") if p.is_file()]
    assert 0 < len(files) <= MAX_FILES, files
    for p in files:
        assert p.stat().st_size <= MAX_FILE_BYTES, p
    summary = (out / "summary.txt").read_text().splitlines()
    for line in table:
        if ROW.match(line):
            assert line in summary, f"summary.txt lacks {line!r}"
    with tarfile.open(out / "logs.tar.gz") as archive:
        logs = set(archive.getnames())
    for name in checks:
        assert f"logs/test_llama_{name}.log" in logs, f"no log of {name} in logs.tar.gz"
