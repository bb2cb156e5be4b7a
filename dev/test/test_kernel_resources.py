"""
The compile-time resource check (scripts/check_kernel_resources.py): registers, shared memory
and stack of every kernel from ptxas's report (`-Xptxas -v`, which the Makefile keeps for train_llama and
test_llama in build/ptxas/), against the block sizes the source launches them with and the limits of
compute capability 9.0. No GPU is needed, only nvcc; the fallback attention kernels, compiled out of the
cuDNN build, are compiled alone (dev/cuda/attention_fallback.cu). Planted faults show that the check can
fail: a fabricated report line, and a copy of the classifier (1024 threads) without its
__launch_bounds__ and with a register-hungry body, compiled by nvcc.
"""
import os
import shutil
import subprocess
import sys

import pytest

from conftest import REPO

SCRIPT = REPO / "scripts/check_kernel_resources.py"
CUDA_HOME = os.environ.get("CUDA_HOME", "/usr/local/cuda")
NVCC = shutil.which("nvcc") or (f"{CUDA_HOME}/bin/nvcc" if os.access(f"{CUDA_HOME}/bin/nvcc", os.X_OK) else None)
NVCC_FLAGS = ["-cubin", "-O3", "-std=c++17", "-gencode", "arch=compute_90,code=sm_90", "--expt-relaxed-constexpr", "-Xptxas", "-v"]


def checker(*args, root=REPO):
    return subprocess.run([sys.executable, str(SCRIPT), "--root", str(root), *map(str, args)],
                          capture_output=True, text=True, timeout=120)


def ptxas_report(src, tmp_path, *include):
    if NVCC is None:
        pytest.skip("nvcc not found (CUDA toolkit missing)")
    log = tmp_path / (src.stem + ".log")
    r = subprocess.run([NVCC, *NVCC_FLAGS, *[f"-I{i}" for i in include], str(src), "-o", str(tmp_path / "k.cubin")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    log.write_text(r.stdout + r.stderr)
    return log


def test_kernels_within_sm90_limits(tmp_path):
    logs = [REPO / "build/ptxas" / f"{b}.log" for b in ("train_llama", "test_llama")]
    missing = [str(l.relative_to(REPO)) for l in logs if not l.exists()]
    if missing:
        why = "nvcc not found" if NVCC is None else "rebuild them: make -B train_llama test_llama"
        pytest.skip(f"no ptxas report {' '.join(missing)} ({why})")
    fallback = ptxas_report(REPO / "dev/cuda/attention_fallback.cu", tmp_path)
    r = checker(*logs, fallback)
    print(r.stdout)
    assert r.returncode == 0, r.stdout + r.stderr
    # every kernel of the source is in the reports, the classifier at its 1024 threads
    kernels = {line.split()[0].split("<")[0] for line in r.stdout.splitlines()[1:-1]}
    source_kernels = set()
    for p in list(REPO.glob("*.cu")) + [p for d in ("core", "cuda", "fp8", "comm") for p in (REPO / d).glob("*.cuh")]:
        for line in p.read_text().splitlines():
            if line.startswith("__global__"):
                source_kernels.add(line.split("(")[-2].split()[-1] if "__launch_bounds__" in line else line.split("(")[0].split()[-1])
    assert source_kernels and source_kernels <= kernels, f"not in the ptxas reports: {source_kernels - kernels}"
    classifier = [line for line in r.stdout.splitlines() if line.startswith("classifier_kernel")]
    assert classifier and classifier[0].split()[5] == "1024", classifier


def test_fabricated_report_rejected(tmp_path):
    """A report line that gives the classifier 72 registers: 72 x 1024 > 65,536 must fail; 64 must pass."""
    mangled = "_Z17classifier_kernelP13__nv_bfloat16PfPKiif"

    def report(regs, smem=0):
        return (f"ptxas info    : Compiling entry function '{mangled}' for 'sm_90'\n"
                f"ptxas info    : Function properties for {mangled}\n"
                "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
                f"ptxas info    : Used {regs} registers, used 1 barriers, {smem} bytes smem, 400 bytes cmem[0]\n")

    (tmp_path / "ok.log").write_text(report(64))
    r = checker(tmp_path / "ok.log")
    assert r.returncode == 0, r.stdout + r.stderr
    (tmp_path / "regs.log").write_text(report(72))
    r = checker(tmp_path / "regs.log")
    assert r.returncode == 1 and "72 registers x 1024 threads = 73728 > 65536" in r.stdout, r.stdout + r.stderr
    (tmp_path / "smem.log").write_text(report(32, 50000))
    r = checker(tmp_path / "smem.log")
    assert r.returncode == 1 and "static shared memory" in r.stdout, r.stdout + r.stderr


def test_planted_register_hungry_classifier_rejected(tmp_path):
    """The classifier's source, __launch_bounds__(1024) removed and a body that keeps 128 floats live:
    ptxas then gives it more than 64 registers, and 1024 threads of them do not fit in a block."""
    src = (REPO / "cuda/classifier.cuh").read_text()
    bounds = "__global__ void __launch_bounds__(CLASSIFIER_THREADS) classifier_kernel("
    assert bounds in src
    src = src.replace(bounds, "__global__ void classifier_kernel(")
    body = "    size_t row = blockIdx.x;\n"
    assert body in src
    hog = ("    float hog[128];\n"
           "#pragma unroll\n"
           "    for (int i = 0; i < 128; i++) hog[i] = __bfloat162float(logits[(size_t)i * V + threadIdx.x]);\n"
           "#pragma unroll\n"
           "    for (int k = 0; k < 4; k++) {\n"
           "#pragma unroll\n"
           "        for (int i = 0; i < 128; i++) hog[i] = hog[i] * hog[(i + 1) % 128] + dloss;\n"
           "    }\n"
           "    float hsum = 0.0f;\n"
           "#pragma unroll\n"
           "    for (int i = 0; i < 128; i++) hsum += hog[i];\n"
           "    losses[blockIdx.x + gridDim.x] = hsum;\n")
    src = src.replace(body, hog + body, 1)
    tree = tmp_path / "tree"
    (tree / "cuda").mkdir(parents=True)
    (tree / "core").symlink_to(REPO / "core")
    (tree / "cuda/classifier.cuh").write_text(src)
    unit = tree / "cuda/planted.cu"
    unit.write_text('#include <cuda_bf16.h>\ntypedef __nv_bfloat16 act_t;\n#include "classifier.cuh"\n')
    log = ptxas_report(unit, tmp_path)
    r = checker(log, root=tree)
    print(r.stdout)
    assert r.returncode == 1, r.stdout + r.stderr
    line = [l for l in r.stdout.splitlines() if l.startswith("classifier_kernel")][0]
    assert "FAIL" in line and "x 1024 threads" in line, line
