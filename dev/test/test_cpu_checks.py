"""
Runs every check of test_llama_cpu (the C checks of the CPU reference build: HF reference comparison,
FP8 policy and GEMM, data loader, checkpoints, resume) as its own pytest test.
"""
import subprocess

import pytest

from conftest import REPO


def check_names():
    exe = REPO / "test_llama_cpu"
    if not exe.exists():
        return ["<test_llama_cpu not built>"]
    out = subprocess.run([str(exe), "--list"], capture_output=True, text=True, check=True).stdout
    return out.split()


@pytest.mark.sanitize
@pytest.mark.parametrize("name", check_names())
def test_check(name, checker):
    result = subprocess.run([str(checker), "--only", name], cwd=REPO, capture_output=True, text=True)
    print(result.stdout[-4000:], result.stderr[-2000:])
    assert result.returncode == 0, f"check {name} failed:\n{result.stdout[-3000:]}\n{result.stderr[-1000:]}"
    assert "1 passed, 0 failed" in result.stdout
