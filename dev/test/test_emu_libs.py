"""
The emulated GPU's vendor-library doubles (emu/cublaslt.cpp, emu/nccl.cpp; docs/emulated-gpu.md),
each tested on its own: small C++ drivers (emu/tests/lib_gemm.cpp, lib_nccl.cpp) compiled with g++
against the double and emu/tests/lib_stub_runtime.cpp (an eager stand-in for emu-core's runtime), or
against the real emulated runtime (emu/runtime.cpp) where CUDA's stream ordering is the point.

- the cuBLASLt double's GEMMs against a float64 numpy reference written from the operand map
  (docs/design.md#the-operand-map: fprop, dgrad, wgrad in FP8 and BF16), on fresh random inputs, FP8 codes
  made with ml_dtypes;
- every refusal rule of Hopper's cuBLASLt the double enforces (emu/LIBS_NOTES.md's table), with the status
  the library returns, beside a valid neighbour of the same call that must not be refused, and each shown
  to be what makes its test pass: on a copy of the double with the tagged checks ("check:NAME") disabled the
  same call is not refused with that status;
- planted faults for the doubles: an FP8 GEMM in NN layout given to the double directly
  (past gemm_check) is refused; a missing cudaStreamWaitEvent before a NCCL result is read gives a wrong
  result under the late schedule; NCCL all-reduce / reduce-scatter / all-gather / broadcast / grouped
  send-recv over `mpirun -np 2` (and 3) against numpy. Each planted fault is rerun on a copy of the double
  without its check, where the test must fail.
"""
import functools
import os
import re
import shutil
import subprocess

import ml_dtypes
import numpy as np
import pytest

from conftest import REPO, plant_switched

CUDA_INCLUDE = os.environ.get("CUDA_INCLUDE", "/usr/local/cuda/include")
MPICXX = shutil.which("mpicxx")
MPIRUN = shutil.which("mpirun")
MPI_ENV = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_rmaps_base_oversubscribe": "1", "ASAN_OPTIONS": "detect_leaks=0"}
RUN_TIMEOUT = 120
E4M3, E5M2, BF16 = ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2, ml_dtypes.bfloat16
FP8_MAX = {E4M3: 448.0, E5M2: 57344.0}
TYPE_ARG = {E4M3: "e4m3", E5M2: "e5m2", BF16: "bf16", np.float32: "f32"}

pytestmark = pytest.mark.skipif(not os.path.exists(f"{CUDA_INCLUDE}/cublasLt.h") or MPICXX is None,
                                reason="needs the CUDA toolkit headers (cublasLt.h, nccl.h) and mpicxx (make setup)")


@functools.cache
def mpi_flags(kind):
    return subprocess.run([MPICXX, f"--showme:{kind}"], capture_output=True, text=True, check=True).stdout.split()


FLAGS = ["-std=c++17", "-O1", "-g", "-Wall", "-Wextra", "-fsanitize=address,undefined", "-DLLM8_MPI",
         "-DOMPI_SKIP_MPICXX=1", f"-I{REPO / 'emu'}", f"-I{CUDA_INCLUDE}"]


def compile_objects(folder, sources):
    """g++ as `make emu` builds the doubles (C++17, MPI's C API, the toolkit headers), with ASan + UBSan:
    each source becomes an object in `folder` once (the doubles and the runtime are linked several times),
    the missing ones two at a time (CI's 2 cores). Returns the objects' paths."""
    objects, running = [], []

    def finish(proc, cmd):
        _, err = proc.communicate()
        assert proc.returncode == 0, f"{' '.join(cmd)}\n{err[-4000:]}"

    for src in map(str, sources):
        obj = folder / (src.replace("/", "_").strip("_") + ".o")
        objects.append(str(obj))
        if obj.exists() or any(cmd[-1] == str(obj) for _, cmd in running):
            continue
        werror = [] if src.endswith("emu/runtime.cpp") else ["-Werror"]  # emu-core's runtime keeps its own warnings
        cmd = ["nice", "g++", *FLAGS, *werror, *mpi_flags("compile"), "-c", src, "-o", str(obj)]
        if len(running) == 2:
            finish(*running.pop(0))
        running.append((subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True), cmd))
    for proc, cmd in running:
        finish(proc, cmd)
    return objects


def compile_program(out, sources, libs=()):
    """`out` linked from the objects of `sources` (compile_objects, beside `out`)."""
    objects = compile_objects(out.parent, sources)
    cmd = ["nice", "g++", "-fsanitize=address,undefined", *objects, "-o", str(out), *mpi_flags("link"), *libs, "-lpthread"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, f"{' '.join(cmd)}\n{r.stderr[-4000:]}"
    return out


def disable_checks(src, names, dst):
    """A copy of src whose `if (COND) /* check:NAME */` lines for `names` read `if (false && (COND))`."""
    lines, hit = [], set()
    for line in src.read_text().splitlines(keepends=True):
        m = re.search(r"/\* check:(\w+) \*/", line)
        if m and m.group(1) in names:
            if "if (" in line:
                line = line.replace("if (", "if (false && (", 1).replace(f") /* check:{m.group(1)}", f")) /* check:{m.group(1)}")
            hit.add(m.group(1))
        lines.append(line)
    assert hit == set(names), f"checks not found in {src.name}: {set(names) - hit}"
    dst.write_text("".join(lines))
    return dst


CUBLASLT_CHECKS = sorted(set(re.findall(r"/\* check:(\w+) \*/", (REPO / "emu/cublaslt.cpp").read_text())))


@pytest.fixture(scope="module")
def tools(request, tmp_path_factory):
    d = tmp_path_factory.mktemp("emu_libs")
    planted = start_planted_cudnn_att(request, d / "planted_cudnn_att")  # builds beside the module's tests
    stub = REPO / "emu/tests/lib_stub_runtime.cpp"
    gemm = REPO / "emu/tests/lib_gemm.cpp"
    unchecked = disable_checks(REPO / "emu/cublaslt.cpp", CUBLASLT_CHECKS, d / "cublaslt_unchecked.cpp")
    compile_objects(d, [gemm, REPO / "emu/cublaslt.cpp", unchecked, stub, REPO / "emu/tests/lib_nccl.cpp", REPO / "emu/nccl.cpp"])
    yield {"dir": d, "planted_cudnn_att": planted,
           "gemm": compile_program(d / "lib_gemm", [gemm, REPO / "emu/cublaslt.cpp", stub]),
           "gemm_unchecked": compile_program(d / "lib_gemm_unchecked", [gemm, unchecked, stub]),
           "nccl": compile_program(d / "lib_nccl", [REPO / "emu/tests/lib_nccl.cpp", REPO / "emu/nccl.cpp", stub])}
    if planted is not None and planted[0].poll() is None:  # its tests were not run
        planted[0].kill()
        planted[0].communicate()


# ---------------------------------------------------------------------------------------------- GEMMs

def fp8(x, fmt):
    """(codes, scale_inv): x cast with Transformer Engine's current scaling (scale = fp8_max / amax)."""
    scale = np.float32(FP8_MAX[fmt] / np.abs(x).max())
    return (x * scale).astype(np.float32).astype(fmt), np.float32(1.0) / scale


def run_gemm(exe, work, a, b, c=None, sa=1.0, sb=1.0, **args):
    """Writes the operands (arrays in column-major memory order, i.e. their C order is ld * cols), runs
    the driver, returns (status lines, D bytes or None)."""
    work.mkdir(parents=True, exist_ok=True)
    a.tofile(work / "a.bin")
    b.tofile(work / "b.bin")
    if c is not None:
        c.tofile(work / "c.bin")
    np.float32(sa).tofile(work / "sa.f32")
    np.float32(sb).tofile(work / "sb.f32")
    cmd = [str(exe), f"dir={work}", *(f"{k}={v}" for k, v in args.items())]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=RUN_TIMEOUT, env=MPI_ENV)
    out = dict(line.split(" ", 1) for line in r.stdout.splitlines() if " " in line)
    d = (work / "d.bin").read_bytes() if (work / "d.bin").exists() else None
    return r, out, d


def check_close(d, ref, bound, what):
    """D within its own rounding (2^-8 relative for BF16, 2^-23 for FP32, one rounding allowed twice), plus
    the FP32 epilogue's two roundings before it (the accumulator to FP32, then the scaled product: each at
    most 2^-24 of |scale * products| <= bound; they do not shrink with |D| when C cancels the product),
    plus float64's summation-order error (1e-12 of the sum of |products|)."""
    assert np.isfinite(d).all(), f"{what}: D has non-finite elements (unwritten?)"
    rel = 2.0 ** -8 if d.dtype == BF16 else 2.0 ** -23
    err = np.abs(d.astype(np.float64) - ref)
    tol = rel * np.abs(ref) + (2 * 2.0 ** -24 + 1e-12) * bound + 1e-30
    worst = np.argmax(err / tol)
    assert (err <= tol).all(), f"{what}: |D - ref| {err.flat[worst]:.3g} > {tol.flat[worst]:.3g} at {worst}"


@pytest.mark.parametrize("gemm", ["fprop", "dgrad", "wgrad"])
@pytest.mark.parametrize("precision", ["fp8", "bf16"])
def test_gemm_matches_operand_map(tools, tmp_path, gemm, precision):
    """Each GEMM of a linear layer, called as fp8/gemm.h's operand map calls it, equals float64 numpy."""
    rng = np.random.default_rng()
    N, C, OC = 48, 32, 64
    x = rng.standard_normal((N, C)).astype(np.float32)
    w = (rng.standard_normal((OC, C)) * 0.05).astype(np.float32)
    dy = (rng.standard_normal((N, OC)) * 1e-3).astype(np.float32)
    fp = precision == "fp8"
    if fp:
        (x8, sx), (w8, sw), (dy8, sdy) = fp8(x, E4M3), fp8(w, E4M3), fp8(dy, E5M2)
    else:
        x8, w8, dy8 = x.astype(BF16), w.astype(BF16), dy.astype(BF16)
        sx = sw = sdy = np.float32(1.0)
    X, W, DY = (v.astype(np.float64) for v in (x8, w8, dy8))
    c = None
    common = dict(atype=TYPE_ARG[w8.dtype.type], scales="before" if fp else "none")
    if gemm == "fprop":  # Y (N, OC) = X W^T: m OC, n N, k C; A = W (T, ld C), B = X (N, ld C)
        args = dict(ta="T", tb="N", m=OC, n=N, k=C, btype=TYPE_ARG[x8.dtype.type], dtype="bf16", fast=int(fp))
        a, b, sa, sb = w8, x8, sw, sx
        ref, bound = (X @ W.T) * sw * sx, (np.abs(X) @ np.abs(W).T) * sw * sx
        shape = (N, OC)
    elif gemm == "dgrad":  # dX (N, C) = dY W: m C, n N, k OC; FP8: A = W^T copy (T, ld OC); BF16: A = W (N, ld C)
        args = dict(ta="T" if fp else "N", tb="N", m=C, n=N, k=OC, btype=TYPE_ARG[dy8.dtype.type], dtype="bf16")
        a, b, sa, sb = (np.ascontiguousarray(w8.T) if fp else w8), dy8, sw, sdy
        ref, bound = (DY @ W) * sw * sdy, (np.abs(DY) @ np.abs(W)) * sw * sdy
        shape = (N, C)
    else:  # dW (OC, C) += dY^T X: m C, n OC, k N; FP8: A = X^T (T, ld N), B = dY^T (N, ld N); BF16: A = X (N), B = dY (T)
        args = dict(ta="T" if fp else "N", tb="N" if fp else "T", m=C, n=OC, k=N, btype=TYPE_ARG[dy8.dtype.type],
                    dtype="f32", beta=1, inplace=1)
        a = np.ascontiguousarray(x8.T) if fp else x8
        b = np.ascontiguousarray(dy8.T) if fp else dy8
        sa, sb = sx, sdy
        c = rng.standard_normal((OC, C)).astype(np.float32)  # the FP32 gradient accumulated into
        ref = c.astype(np.float64) + (DY.T @ X) * sx * sdy
        bound = np.abs(c) + (np.abs(DY).T @ np.abs(X)) * sx * sdy
        shape = (OC, C)
    r, out, d = run_gemm(tools["gemm"], tmp_path, a, b, c, sa, sb, **common, **args)
    assert out.get("matmul") == "CUBLAS_STATUS_SUCCESS", r.stdout + r.stderr
    dtype = np.float32 if args["dtype"] == "f32" else BF16
    check_close(np.frombuffer(d, dtype=dtype).reshape(shape), ref, bound, f"{precision} {gemm}")


def test_gemm_alpha_beta_leading_dims(tools, tmp_path):
    """alpha, beta and leading dimensions above the rows (BF16 NT into a BF16 C = D with ld > m)."""
    rng = np.random.default_rng()
    m, n, k, lda, ldb, ldc = 24, 20, 40, 32, 24, 40
    a = rng.standard_normal((k, lda)).astype(BF16)  # column-major (lda, k): a[p, i] is A[i][p]
    b = rng.standard_normal((k, ldb)).astype(BF16)  # op T: B is n x k, column-major (ldb, k)
    c = rng.standard_normal((n, ldc)).astype(BF16)
    alpha, beta = 0.75, -0.5
    A, B, Cm = (v.astype(np.float64) for v in (a[:, :m].T, b[:, :n].T, c[:, :m].T))  # A m x k, B^T n x k, C m x n
    ref = alpha * (A @ B.T) + beta * Cm
    bound = np.abs(alpha) * (np.abs(A) @ np.abs(B).T) + np.abs(beta * Cm)
    r, out, d = run_gemm(tools["gemm"], tmp_path, a, b, c, ta="N", tb="T", m=m, n=n, k=k, lda=lda, ldb=ldb, ldc=ldc,
                         atype="bf16", btype="bf16", dtype="bf16", alpha=alpha, beta=beta, scales="none")
    assert out.get("matmul") == "CUBLAS_STATUS_SUCCESS", r.stdout + r.stderr
    dm = np.frombuffer(d, dtype=BF16).reshape(n, ldc)
    check_close(dm[:, :m].T, ref, bound, "alpha/beta/ld")
    np.testing.assert_array_equal(dm[:, m:], c[:, m:], "rows between m and ldc must stay untouched")


# One case per row of emu/LIBS_NOTES.md's refusal table: (check tag, driver arguments that break the rule,
# a valid neighbour (the least change that keeps the rule), the line that refuses, the status).
FP8_TN = dict(ta="T", tb="N", m=32, n=16, k=48, atype="e4m3", btype="e4m3", dtype="bf16")
BF16_NN = dict(FP8_TN, ta="N", lda=32, atype="bf16", btype="bf16", scales="none")
NOT_SUPPORTED, INVALID_VALUE = "CUBLAS_STATUS_NOT_SUPPORTED", "CUBLAS_STATUS_INVALID_VALUE"
REFUSALS = [
    ("fp8_tn", dict(FP8_TN, ta="N", lda=32), FP8_TN, "heuristic", NOT_SUPPORTED),
    ("fp8_tn", dict(FP8_TN, tb="T", ldb=16, algo="null"), dict(FP8_TN, algo="null"), "matmul", NOT_SUPPORTED),
    ("e5m2_e5m2", dict(FP8_TN, atype="e5m2", btype="e5m2"), dict(FP8_TN, atype="e5m2"), "heuristic", NOT_SUPPORTED),
    ("fp8_dims", dict(FP8_TN, m=40, ldc=48), dict(FP8_TN, m=48, ldc=48), "heuristic", NOT_SUPPORTED),
    ("fp8_dims", dict(FP8_TN, n=24), dict(FP8_TN, n=32), "heuristic", NOT_SUPPORTED),
    ("fp8_ld", dict(FP8_TN, lda=56), dict(FP8_TN, lda=64), "heuristic", NOT_SUPPORTED),
    ("fp8_cd", dict(FP8_TN, ctype="f32", inplace=0), dict(FP8_TN, ctype="f32", dtype="f32", inplace=0), "heuristic",
     NOT_SUPPORTED),
    ("fp8_compute", dict(FP8_TN, compute="16f"), FP8_TN, "heuristic", NOT_SUPPORTED),
    ("fp8_compute", dict(FP8_TN, scale_type="f16"), FP8_TN, "heuristic", NOT_SUPPORTED),
    ("fp8_bias", dict(FP8_TN, epilogue="bias", bias_type="f32"), dict(FP8_TN, epilogue="bias", bias_type="bf16"),
     "heuristic", NOT_SUPPORTED),
    ("fp8_bias", dict(FP8_TN, dtype="f32", inplace=0, epilogue="gelu_bias", bias_type="f32"),
     dict(FP8_TN, dtype="f32", inplace=0, epilogue="gelu_bias", bias_type="bf16"), "heuristic", NOT_SUPPORTED),
    ("fp8_align", dict(FP8_TN, align_pref=8), dict(FP8_TN, align_pref=16), "heuristic", NOT_SUPPORTED),
    ("fp8_ptr_align", dict(FP8_TN, offset_a=8, algo="null"), dict(FP8_TN, offset_a=16, algo="null"), "matmul",
     NOT_SUPPORTED),
    ("regular_types", dict(BF16_NN, ctype="f32", inplace=0), dict(BF16_NN, ctype="f32", dtype="f32", inplace=0),
     "heuristic", NOT_SUPPORTED),
    ("workspace", dict(FP8_TN, ws=4096), dict(FP8_TN, ws=1 << 20), "matmul", INVALID_VALUE),
    ("workspace", dict(FP8_TN, ws=0), dict(FP8_TN, ws_pref=0, ws=0), "matmul", INVALID_VALUE),
    ("scales_before_heuristic", dict(FP8_TN, scales="after"), FP8_TN, "heuristic", NOT_SUPPORTED),
    ("scale_non_fp8", dict(BF16_NN, scales="before"), BF16_NN, "heuristic", INVALID_VALUE),
    ("in_place", dict(FP8_TN, cld=48), dict(FP8_TN, cld=48, inplace=0), "matmul", INVALID_VALUE),
]


def refusal_operands(args):
    rng = np.random.default_rng()
    ta, tb = args.get("ta", "T") == "T", args.get("tb", "N") == "T"
    m, n, k = args["m"], args["n"], args["k"]
    lda = args.get("lda", k if ta else m)
    ldb = args.get("ldb", n if tb else k)
    types = {"e4m3": E4M3, "e5m2": E5M2, "bf16": BF16}
    a = rng.uniform(-1, 1, (m if ta else k, lda)).astype(types[args["atype"]])
    b = rng.uniform(-1, 1, (k if tb else n, ldb)).astype(types[args["btype"]])
    return a, b


@pytest.mark.parametrize("check,args,valid,where,status", REFUSALS, ids=[f"{c[0]}-{i}" for i, c in enumerate(REFUSALS)])
def test_refusal(tools, tmp_path, check, args, valid, where, status):
    """The double refuses what Hopper's cuBLASLt refuses, with its status, naming the rule; the valid
    neighbour passes the same line (an epilogue's neighbour then stops as not emulated); on the copy with
    the checks disabled the call is no longer refused with that status (so the refusal is the check's)."""
    a, b = refusal_operands(args)
    r, out, _ = run_gemm(tools["gemm"], tmp_path / "checked", a, b, **args)
    assert out.get(where) == status, r.stdout + r.stderr
    assert "emu cuBLASLt:" in r.stderr, "a refusal says why"
    a, b = refusal_operands(valid)
    r, out, _ = run_gemm(tools["gemm"], tmp_path / "valid", a, b, **valid)
    assert out.get(where) == "CUBLAS_STATUS_SUCCESS" and "emu cuBLASLt:" not in r.stderr, \
        f"the valid neighbour of check:{check} must pass\n{r.stdout}{r.stderr[-3000:]}"
    a, b = refusal_operands(args)
    r, out, _ = run_gemm(tools["gemm_unchecked"], tmp_path / "unchecked", a, b, **args)
    assert out.get(where) != status, f"without check:{check} the call must not be refused\n{r.stdout}{r.stderr[-3000:]}"


def test_every_check_has_a_refusal_test():
    assert set(CUBLASLT_CHECKS) == {c[0] for c in REFUSALS}
    notes = (REPO / "emu/LIBS_NOTES.md").read_text()
    assert all(f"`{c}`" in notes for c in CUBLASLT_CHECKS), "every check has its row (and source) in emu/LIBS_NOTES.md"



@pytest.mark.parametrize("args,message", [
    (dict(FP8_TN, host_a=1, algo="null"), "A (0x"),                                    # a host pointer as A
    (dict(FP8_TN, atype="bf16", btype="bf16", scales="none", offset_d=16), "aligned but its algorithm"),
])
def test_gpu_faults_stop_the_run(tools, tmp_path, args, message):
    """What a GPU would fault on (host memory; a pointer less aligned than its algorithm was chosen for)
    stops with "emu: ..." naming cublasLtMatmul, instead of computing."""
    a, b = refusal_operands(args)
    r, out, _ = run_gemm(tools["gemm"], tmp_path, a, b, **args)
    assert r.returncode != 0 and "emu: cublasLtMatmul:" in r.stderr and message in r.stderr, r.stdout + r.stderr


def test_planted_fp8_nn_gemm_is_refused(tools, tmp_path):
    """Planted fault: an FP8 GEMM in NN layout handed to the double directly, past gemm_check,
    is refused with CUBLAS_STATUS_NOT_SUPPORTED at the heuristic and at the matmul; on a copy of the double
    without check:fp8_tn the same GEMM runs, so this test would fail."""
    nn = dict(FP8_TN, ta="N", lda=32)
    a, b = refusal_operands(nn)
    for algo in ("heuristic", "null"):
        r, out, _ = run_gemm(tools["gemm"], tmp_path / algo, a, b, **nn, algo=algo)
        assert out.get("heuristic" if algo == "heuristic" else "matmul") == "CUBLAS_STATUS_NOT_SUPPORTED", r.stdout + r.stderr
        assert "Hopper runs FP8 only as TN" in r.stderr
    mutant = disable_checks(REPO / "emu/cublaslt.cpp", ["fp8_tn"], tools["dir"] / "cublaslt_no_tn.cpp")
    exe = compile_program(tools["dir"] / "lib_gemm_no_tn", [REPO / "emu/tests/lib_gemm.cpp", mutant,
                                                            REPO / "emu/tests/lib_stub_runtime.cpp"])
    r, out, _ = run_gemm(exe, tmp_path / "mutant", a, b, **nn)
    assert out.get("matmul") == "CUBLAS_STATUS_SUCCESS", "without check:fp8_tn the NN GEMM must run\n" + r.stdout + r.stderr


# ---------------------------------------------------------------------------------------------- NCCL

def nccl_run(exe, ranks, *args):
    cmd = [str(exe), *map(str, args)] if ranks == 1 and MPIRUN is None else \
          [MPIRUN, "--oversubscribe", "-np", str(ranks), str(exe), *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=RUN_TIMEOUT, env=MPI_ENV)


def load(work, rank, name, dtype):
    return np.fromfile(work / f"r{rank}_{name}.bin", dtype=dtype)


def rank_order(blocks, op):
    """((x0 op x1) op x2) ..., in the blocks' own dtype after every step (NaN wins max)."""
    acc = blocks[0].copy()
    for x in blocks[1:]:
        if op == "sum":
            acc = (acc.astype(np.float32) + x.astype(np.float32)).astype(acc.dtype) if acc.dtype == BF16 else acc + x
        else:
            acc = np.where(np.isnan(acc) | np.isnan(x), np.float32(np.nan), np.maximum(acc, x)).astype(acc.dtype)
    return acc


@pytest.mark.parametrize("ranks", [1, 2, 3])
def test_nccl_collectives_against_numpy(tools, tmp_path, ranks):
    """A planted-fault test and the double's contract: every collective llm8 uses and the
    grouped send/recv all-to-all, on a non-blocking stream, against numpy. Two ranks are bit-exact what real
    NCCL gives (a + b is commutative); three ranks check the double's stated rank order."""
    if ranks > 1 and MPIRUN is None:
        pytest.skip("mpirun not found")
    r = nccl_run(tools["nccl"], ranks, "collectives", tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    compare_collectives(tmp_path, ranks)


@pytest.mark.skipif(MPIRUN is None, reason="mpirun not found")
def test_nccl_collectives_test_can_fail(tools, tmp_path):
    """The comparison above fails on a copy of the double whose reductions drop the other ranks' data
    (the loop over ranks in reduce_blocks, "check:rank_order", never runs)."""
    src = (REPO / "emu/nccl.cpp").read_text()
    line = re.search(r".*/\* check:rank_order \*/.*", src).group(0)
    mutant = tools["dir"] / "nccl_no_reduce.cpp"
    mutant.write_text(src.replace(line, line.replace("r < nranks", "r < 1 + 0 * nranks")))
    exe = compile_program(tools["dir"] / "lib_nccl_no_reduce", [REPO / "emu/tests/lib_nccl.cpp", mutant,
                                                                REPO / "emu/tests/lib_stub_runtime.cpp"])
    r = nccl_run(exe, 2, "collectives", tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    with pytest.raises(AssertionError):
        compare_collectives(tmp_path, 2)


def compare_collectives(tmp_path, ranks):
    """Every rank's outputs of lib_nccl's collectives mode against numpy, from the inputs the ranks wrote."""
    n, W = 1003, ranks
    ins = {name: [load(tmp_path, q, name, dt) for q in range(W)]
           for name, dt in [("f_in", np.float32), ("d_in", np.float64), ("h_in", BF16), ("rs_in", np.float32),
                            ("rsh_in", BF16), ("bytes_in", np.uint8)]}
    f_sum, f_max = rank_order(ins["f_in"], "sum"), rank_order(ins["f_in"], "max")
    assert np.isnan(f_max[5]) == (W > 1) and f_max[6] == (-1.0 if W > 1 else -np.inf)
    for q in range(W):
        np.testing.assert_array_equal(load(tmp_path, q, "f_out", np.float32), f_sum, "all-reduce sum float")
        np.testing.assert_array_equal(load(tmp_path, q, "f_inplace", np.float32), f_sum, "all-reduce sum float, in place")
        np.testing.assert_array_equal(load(tmp_path, q, "f_max", np.float32), f_max, "all-reduce max float")
        np.testing.assert_array_equal(load(tmp_path, q, "d_out", np.float64), rank_order(ins["d_in"], "sum"), "all-reduce double")
        np.testing.assert_array_equal(load(tmp_path, q, "h_out", BF16), rank_order(ins["h_in"], "sum"), "all-reduce bf16")
        np.testing.assert_array_equal(load(tmp_path, q, "rs_out", np.float32),
                                      rank_order([x[q * n:(q + 1) * n] for x in ins["rs_in"]], "sum"), "reduce-scatter float")
        np.testing.assert_array_equal(load(tmp_path, q, "rsh_out", BF16),
                                      rank_order([x[q * n:(q + 1) * n] for x in ins["rsh_in"]], "sum"), "reduce-scatter bf16")
        np.testing.assert_array_equal(load(tmp_path, q, "ag_out", np.uint8),
                                      np.concatenate([x[:n] for x in ins["bytes_in"]]), "all-gather, in place")
        np.testing.assert_array_equal(load(tmp_path, q, "bc_out", np.uint8), ins["bytes_in"][W - 1][:n], "broadcast from the last rank")
        np.testing.assert_array_equal(load(tmp_path, q, "a2a_out", np.uint8),
                                      np.concatenate([x[q * n:(q + 1) * n] for x in ins["bytes_in"]]), "grouped send/recv all-to-all")


def test_nccl_refuses_host_memory(tools):
    """NCCL checks its buffers are device memory and returns ncclInvalidArgument (with a last-error text)."""
    r = nccl_run(tools["nccl"], 1, "bad_pointer")
    assert r.returncode == 0 and "result invalid argument" in r.stdout and "not emulated device memory" in r.stderr, r.stdout + r.stderr


@pytest.mark.parametrize("mode,ranks,message", [
    ("overlap", 1, "overlap without being nccl.h's in-place form"),
    ("mismatch", 2, "another rank of the communicator runs a different one"),
])
def test_nccl_undefined_usage_stops_the_run(tools, mode, ranks, message):
    """What real NCCL leaves undefined or hangs on (overlapping buffers that are not the in-place form;
    ranks issuing different collectives) stops with "emu: ..." instead."""
    if ranks > 1 and MPIRUN is None:
        pytest.skip("mpirun not found")
    r = nccl_run(tools["nccl"], ranks, mode)
    assert r.returncode != 0 and message in r.stderr, r.stdout + r.stderr


def build_with_runtime(tools, nccl_source, name):
    """lib_nccl linked against emu-core's lazy runtime (emu/runtime.cpp, with emu/nvtx.cpp for the counts the
    runtime keeps) instead of the eager stub."""
    return compile_program(tools["dir"] / name, [REPO / "emu/tests/lib_nccl.cpp", nccl_source, REPO / "emu/runtime.cpp",
                                                 REPO / "emu/nvtx.cpp"],
                           ["-lboost_context"])


@pytest.mark.skipif(not (REPO / "emu/runtime.cpp").exists(), reason="emu-core's lazy runtime (emu/runtime.cpp) is not here yet")
def test_planted_missing_stream_wait_before_nccl_result(tools):
    """Planted fault: the compute stream reads an all-reduce's result without cudaStreamWaitEvent
    on the collective's event. Under the late schedule the collective has not run yet, so the value read is
    wrong; with the wait it is right. On a copy of the double that runs collectives at the call instead of on
    their stream (check:nccl_on_stream), the missing wait goes unseen, so this test would fail."""
    src = (REPO / "emu/nccl.cpp").read_text()
    line = re.search(r".*/\* check:nccl_on_stream \*/.*", src).group(0)
    eager = tools["dir"] / "nccl_eager.cpp"
    eager.write_text(src.replace(line, "    run_ops(sp, ops, seq); (void)stream;"))
    compile_objects(tools["dir"], [REPO / "emu/runtime.cpp", REPO / "emu/nvtx.cpp", eager])
    exe = build_with_runtime(tools, REPO / "emu/nccl.cpp", "lib_nccl_lazy")
    env = {**MPI_ENV, "LLM8_EMU_SCHEDULE": "late"}

    def value(program, wait):
        r = subprocess.run([str(program), "stream_wait", str(wait)], capture_output=True, text=True, timeout=RUN_TIMEOUT, env=env)
        assert r.returncode == 0, r.stdout + r.stderr
        got, expected = re.search(r"value (\S+) expected (\S+)", r.stdout).groups()
        return float(got), float(expected)

    got, expected = value(exe, 1)
    assert got == expected, "with the wait the result is the all-reduce's"
    got, expected = value(exe, 0)
    assert got != expected, "without the wait the legacy stream must read the buffer before the collective ran"
    got, expected = value(build_with_runtime(tools, eager, "lib_nccl_eager"), 0)
    assert got == expected, "a double that ignores the stream hides the missing wait"


@pytest.mark.skipif(not (REPO / "emu/runtime.cpp").exists(), reason="emu-core's lazy runtime (emu/runtime.cpp) is not here yet")
def test_missing_issue_event_before_collective(tools):
    """The other direction (the early schedule): a collective that reads compute output without
    waiting for comm_issue's event. With LLM8_EMU_SCHEDULE=early the collective runs before the legacy
    stream's copy, so its result is wrong; with the event it is right. The double's part: it reads its
    buffers when its stream runs it."""
    exe = build_with_runtime(tools, REPO / "emu/nccl.cpp", "lib_nccl_lazy")
    env = {**MPI_ENV, "LLM8_EMU_SCHEDULE": "early"}
    results = {}
    for wait in (1, 0):
        r = subprocess.run([str(exe), "issue_wait", str(wait)], capture_output=True, text=True, timeout=RUN_TIMEOUT, env=env)
        assert r.returncode == 0, r.stdout + r.stderr
        results[wait] = tuple(map(float, re.search(r"value (\S+) expected (\S+)", r.stdout).groups()))
    assert results[1][0] == results[1][1], "with the event the collective reads the copied input"
    assert results[0][0] != results[0][1], "without it the early schedule runs the collective before the copy"


# ---------------------------------------------------------------------------------------------- cuDNN

CUDNN_ATT_OBJ = REPO / "build/cudnn_att.o"
needs_cudnn_att = pytest.mark.skipif(not CUDNN_ATT_OBJ.exists() or not os.path.exists(f"{CUDA_INCLUDE}/cudnn.h"),
                                     reason="needs build/cudnn_att.o (make build/cudnn_att.o: the cuDNN frontend headers) and cudnn.h")


def build_sdpa(tools, cudnn_source=REPO / "emu/cudnn.cpp", name="lib_sdpa", cudnn_att=CUDNN_ATT_OBJ):
    """emu/tests/lib_sdpa.cpp: a cuda/cudnn_att.cpp object (the GPU build's) on the double and the lazy runtime
    (with emu/nvtx.cpp, whose counts the runtime keeps)."""
    return compile_program(tools["dir"] / name, [REPO / "emu/tests/lib_sdpa.cpp", cudnn_source, REPO / "emu/runtime.cpp",
                                                 REPO / "emu/nvtx.cpp"], [str(cudnn_att), "-lboost_context"])


def sdpa_reference(qkv, dout, NH, NKV, HS):
    """Causal grouped-query attention and its gradients in float64, from their definitions (the frontend's
    docs/operations/Attention.md: O = softmax(scale Q K^T + causal mask) V, Stats the natural-log
    logsumexp of each row; query head h reads kv head h // (NH / NKV), HF's repeat_kv), with what the
    tolerances need: P, dS, dP, D."""
    B, T, _ = qkv.shape
    C, KV, g = NH * HS, NKV * HS, NH // NKV
    heads = lambda x, n: x.reshape(B, T, n, HS).transpose(0, 2, 1, 3)  # noqa: E731  (b, h, t, d)
    q, k, v = heads(qkv[..., :C], NH), heads(qkv[..., C:C + KV], NKV), heads(qkv[..., C + KV:], NKV)
    k, v = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
    scale = 1.0 / np.sqrt(HS)
    s = np.where(np.tril(np.ones((T, T), bool)), q @ k.transpose(0, 1, 3, 2) * scale, -np.inf)
    m = s.max(-1, keepdims=True)
    e = np.exp(s - m)
    p = e / e.sum(-1, keepdims=True)
    r = dict(q=q, k=k, v=v, p=p, scale=scale, lse=(m + np.log(e.sum(-1, keepdims=True)))[..., 0], o=p @ v, do=heads(dout, NH))
    r["dp"] = r["do"] @ v.transpose(0, 1, 3, 2)
    r["D"] = (r["do"] * r["o"]).sum(-1, keepdims=True)
    r["ds"] = p * (r["dp"] - r["D"])
    group_sum = lambda x: x.reshape(B, NKV, g, T, HS).sum(2)  # noqa: E731
    r["dq"] = r["ds"] @ k * scale
    r["dk"] = group_sum(r["ds"].transpose(0, 1, 3, 2) @ q * scale)
    r["dv"] = group_sum(p.transpose(0, 1, 3, 2) @ r["do"])
    return r


def check_sdpa(got, bound, ref, what):
    assert np.isfinite(got).all(), f"{what}: non-finite elements (not written?)"
    err = np.abs(got - ref)
    worst = np.unravel_index(np.argmax(err / bound), err.shape)
    assert (err <= bound).all(), f"{what}: |got - ref| {err[worst]:.3g} > bound {bound[worst]:.3g} at {worst}"
    return float((err / bound).max())


def compare_sdpa(work, i, B, T, NH, NKV, HS, qkv, dout):
    """Case i of lib_sdpa against sdpa_reference, element by element within bounds derived from the BF16
    roundings the SDPA kernels make (cudnn_frontend's CompositeSDPANode and its backward declare P BF16
    before P V and P^T dO, dS BF16 before dS^T Q, with GQA each head's dK and dV BF16 before their group's
    sum; O, dQ, dK, dV are stored BF16): a rounding to BF16 (8 significant bits) moves a value by at most
    2^-8 of it, taken twice (2^-7) for margin. Returns the largest err / bound seen."""
    r = sdpa_reference(qkv.astype(np.float64), dout.astype(np.float64), NH, NKV, HS)
    C, KV, g = NH * HS, NKV * HS, NH // NKV
    u = 2.0 ** -7
    heads = lambda x, n: x.astype(np.float64).reshape(B, T, n, HS).transpose(0, 2, 1, 3)  # noqa: E731
    out = np.fromfile(work / f"out{i}.bin", BF16).reshape(B, T, C)
    stats = np.fromfile(work / f"stats{i}.bin", np.float32).reshape(B, NH, T).astype(np.float64)
    dqkv = np.fromfile(work / f"dqkv{i}.bin", BF16).reshape(B, T, C + 2 * KV)
    P, aq, ak, av, ado = r["p"], np.abs(r["q"]), np.abs(r["k"]), np.abs(r["v"]), np.abs(r["do"])
    group_sum = lambda x: x.reshape(B, NKV, g, T, HS).sum(2)  # noqa: E731
    worst = []
    o_bound = u * (P @ av + np.abs(r["o"])) + 1e-6  # P rounded before P V; O rounded
    worst.append(check_sdpa(heads(out, NH), o_bound, r["o"], "O"))
    worst.append(check_sdpa(stats, 1e-5 * (1 + np.abs(r["lse"])), r["lse"], "Stats"))
    # D = rowsum(dO * O) reads the stored O; dS = P (dP - D) then carries P's and D's errors
    d_bound = (ado * o_bound).sum(-1, keepdims=True)
    ds_bound = P * (u * (np.abs(r["dp"]) + np.abs(r["D"])) + d_bound)
    dq_bound = (ds_bound @ ak) * r["scale"] + u * np.abs(r["dq"]) + 1e-6
    # with GQA each query head's dK and dV are BF16 too before their group's sum
    dk_full, dv_full = r["ds"].transpose(0, 1, 3, 2) @ r["q"] * r["scale"], P.transpose(0, 1, 3, 2) @ r["do"]
    full = float(g > 1)
    dk_bound = group_sum(((ds_bound + u * np.abs(r["ds"])).transpose(0, 1, 3, 2) @ aq) * r["scale"] + full * u * np.abs(dk_full)) \
        + u * np.abs(r["dk"]) + 1e-6
    dv_bound = group_sum(u * P.transpose(0, 1, 3, 2) @ ado + full * u * np.abs(dv_full)) + u * np.abs(r["dv"]) + 1e-6
    worst.append(check_sdpa(heads(dqkv[..., :C], NH), dq_bound, r["dq"], "dQ"))
    worst.append(check_sdpa(heads(dqkv[..., C:C + KV], NKV), dk_bound, r["dk"], "dK"))
    worst.append(check_sdpa(heads(dqkv[..., C + KV:], NKV), dv_bound, r["dv"], "dV"))
    return max(worst)


def run_sdpa(exe, work, heads, cases, env=None, **args):
    """Writes fresh BF16 inputs for each (B, T) case, runs lib_sdpa, returns (result, inputs)."""
    rng = np.random.default_rng()
    NH, NKV, HS = heads
    work.mkdir(parents=True, exist_ok=True)
    inputs = []
    for i, (B, T) in enumerate(cases):
        qkv = rng.standard_normal((B, T, (NH + 2 * NKV) * HS)).astype(BF16)
        dout = rng.standard_normal((B, T, NH * HS)).astype(BF16)
        qkv.tofile(work / f"qkv{i}.bin")
        dout.tofile(work / f"dout{i}.bin")
        inputs.append((qkv, dout))
    cmd = [str(exe), f"dir={work}", f"heads={NH},{NKV},{HS}", "cases=" + ",".join(f"{B}x{T}" for B, T in cases),
           *(f"{k}={v}" for k, v in args.items())]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=RUN_TIMEOUT, env={**MPI_ENV, **(env or {})})
    assert "runtime error:" not in r.stderr, r.stderr[-3000:]  # UBSan
    return r, inputs


SDPA_CASES = [  # heads (NH, NKV, HS), (B, T) cases run in one process, deterministic backward
    ((4, 4, 16), [(2, 64)], 0),
    ((4, 4, 16), [(2, 64)], 1),
    ((4, 2, 32), [(1, 96), (2, 32), (1, 96)], 0),  # GQA, T off the 64 tiles, a cached graph run again
    ((8, 2, 16), [(1, 128)], 1),
]


@needs_cudnn_att
@pytest.mark.parametrize("heads,cases,det", SDPA_CASES, ids=[f"{h[0]}x{h[1]}x{h[2]}-{len(c)}cases-det{d}" for h, c, d in SDPA_CASES])
def test_sdpa_through_cudnn_att_matches_float64(tools, tmp_path, heads, cases, det):
    """cuda/cudnn_att.cpp's forward and backward graphs (strided q, k, v in qkv and dq, dk, dv in dqkv,
    the causal mask, GQA), built by the frontend and run by the double, against float64 numpy; every
    element of out, stats and dqkv written (they start as NaN bytes). The planted faults below (a wrong
    stride, the mask shifted by one) make the same comparison fail."""
    exe = build_sdpa(tools)
    r, inputs = run_sdpa(exe, tmp_path, heads, cases, det=det)
    assert r.returncode == 0, r.stdout + r.stderr[-4000:]
    worst = [compare_sdpa(tmp_path, i, B, T, *heads, *inputs[i]) for i, (B, T) in enumerate(cases)]
    print(f"largest |err| / bound: {max(worst):.3f}")


@needs_cudnn_att
def test_sdpa_engine_workspace_is_passed_and_sized(tools, tmp_path):
    """With every plan asking for an engine workspace of its own (LLM8_EMU_CUDNN_WORKSPACE, which execute
    fills with NaN bytes as a kernel's scratch), cudnn_att.cpp still sizes and passes the workspace the
    frontend reports (the engine's part plus the frontend's row sums and dQ accumulator): same results."""
    exe = build_sdpa(tools)
    heads, cases = (4, 2, 16), [(2, 64), (1, 32)]
    r, inputs = run_sdpa(exe, tmp_path, heads, cases, env={"LLM8_EMU_CUDNN_WORKSPACE": "65536"}, prepare=1)
    assert r.returncode == 0, r.stdout + r.stderr[-4000:]
    for i, (B, T) in enumerate(cases):
        compare_sdpa(tmp_path, i, B, T, *heads, *inputs[i])


@needs_cudnn_att
def test_sdpa_shape_not_prepared_stops_the_run(tools, tmp_path):
    """After cudnn_att_prepare, attention at a shape it did not build stops with one line naming it,
    instead of building a graph and growing the workspace mid-run."""
    r, _ = run_sdpa(build_sdpa(tools), tmp_path, (4, 2, 16), [(1, 64)], prepare=1, extra="2x64")
    assert r.returncode != 0 and "case 0 done" in r.stdout, r.stdout + r.stderr[-3000:]
    assert re.search(r"error: attention forward \(B 2, T 64, NH 4, NKV 2, HS 16\): not among the shapes cudnn_att_prepare "
                     r"built at start-up", r.stderr), r.stderr[-3000:]


# Planted faults in cuda/cudnn_att.cpp, all in one copy, each behind its runtime switch
# (conftest.plant_switched), built as make builds build/cudnn_att.o (at -O0) and linked into lib_sdpa once:
# (name, the source text, its faulty replacement, what must catch it).
CUDNN_ATT_FAULTS = [
    # dK's row stride that of a dq row: dK lands on the next rows' q, its own columns stay NaN
    ("dk_stride", "        set_bhsd(dk, UID_DK, B, NKV, T, HS, QKV);\n", "        set_bhsd(dk, UID_DK, B, NKV, T, HS, C);\n",
     r"d[QKV]: "),
    # the forward's mask one key to the right: each query also sees the next one
    ("causal_mask_shifted",
     "        auto opts = fe::graph::SDPA_attributes().set_name(\"sdpa\").set_generate_stats(true).set_causal_mask(true).set_attn_scale(scale);\n",
     "        auto opts = fe::graph::SDPA_attributes().set_name(\"sdpa\").set_generate_stats(true).set_causal_mask(true).set_attn_scale(scale);\n"
     "        opts.set_diagonal_band_right_bound(1);\n",
     r"O: "),
    ("workspace_one_byte_short", "    cudaCheck(g_alloc(&g_workspace, (size_t)need));\n",
     "    cudaCheck(g_alloc(&g_workspace, (size_t)need - 1));\n",
     r"emu: cudnnBackendExecute: tensor .* run past the end of the device allocation they start in"),
]


def start_planted_cudnn_att(request, copy):
    """Starts make's build of build/cudnn_att.o (at -O0) in `copy`, a copy of the sources make needs with
    every selected fault of CUDNN_ATT_FAULTS planted behind its switch; returns (the make process, the
    object), or None when no such test is selected or cuDNN is missing. Started by the tools fixture, so
    that it builds while the module's tests, most on one core, run."""
    selected = {item.callspec.params["name"] for item in request.session.items
                if item.originalname == "test_cudnn_att_planted_fault_is_caught"}
    if not selected or not CUDNN_ATT_OBJ.exists() or not os.path.exists(f"{CUDA_INCLUDE}/cudnn.h"):
        return None
    for f in ["Makefile", "scripts/setup.sh", "cuda/cudnn_att.cpp", "cuda/cudnn_att.h", "core/common.h", "core/cuda_check.h"]:
        (copy / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / f, copy / f)
    source = (copy / "cuda/cudnn_att.cpp").read_text()
    for name, old, new, _ in CUDNN_ATT_FAULTS:
        if name in selected:
            source = plant_switched(source, name, old, new)
    (copy / "cuda/cudnn_att.cpp").write_text(source)
    (copy / "build").mkdir()
    (copy / "build/.setup-done").touch()
    proc = subprocess.Popen(["nice", "make", "-C", str(copy), "CUDNN_ATT_O=-O0", "build/cudnn_att.o"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return proc, copy / "build/cudnn_att.o"


@pytest.fixture(scope="module")
def faulty_sdpa(tools):
    """lib_sdpa on the planted copy's build/cudnn_att.o (start_planted_cudnn_att), or make's output when
    that object did not build."""
    proc, obj = tools["planted_cudnn_att"]
    out, _ = proc.communicate()
    if proc.returncode != 0:
        return out[-3000:]
    return build_sdpa(tools, name="lib_sdpa_planted", cudnn_att=obj)


@needs_cudnn_att
@pytest.mark.parametrize("name, old, new, caught", CUDNN_ATT_FAULTS, ids=[f[0] for f in CUDNN_ATT_FAULTS])
def test_cudnn_att_planted_fault_is_caught(faulty_sdpa, tmp_path, name, old, new, caught):
    """A fault planted in cuda/cudnn_att.cpp is caught through the double: a wrong layout or mask by the
    comparison with float64 numpy (test_sdpa_through_cudnn_att_matches_float64 passes the same cases on
    the real source), a workspace one byte short of what the frontend reports by the double at execute."""
    assert not isinstance(faulty_sdpa, str), f"the faulty copy did not build:\n{faulty_sdpa}"
    heads, cases = (4, 2, 16), [(2, 64)]
    r, inputs = run_sdpa(faulty_sdpa, tmp_path, heads, cases, env={"LLM8_PLANTED_FAULT": name})
    if caught.startswith("emu: "):
        assert r.returncode != 0 and re.search(caught, r.stderr), r.stdout + r.stderr[-3000:]
        return
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    with pytest.raises(AssertionError, match=caught):
        compare_sdpa(tmp_path, 0, *cases[0], *heads, *inputs[0])


CUDNN_CHECKS = sorted(set(re.findall(r"/\* check:(\w+) \*/", (REPO / "emu/cudnn.cpp").read_text())))


@pytest.fixture(scope="module")
def cudnn_tools(tools):
    """emu/tests/lib_cudnn.cpp (the backend API by hand, no frontend) on the double and on a copy of it with
    every tagged check disabled, both on the eager runtime stub."""
    if not os.path.exists(f"{CUDA_INCLUDE}/cudnn.h"):
        pytest.skip("needs cudnn.h (the cuDNN headers of the toolkit)")
    stub, driver = REPO / "emu/tests/lib_stub_runtime.cpp", REPO / "emu/tests/lib_cudnn.cpp"
    unchecked = disable_checks(REPO / "emu/cudnn.cpp", CUDNN_CHECKS, tools["dir"] / "cudnn_unchecked.cpp")
    compile_objects(tools["dir"], [driver, REPO / "emu/cudnn.cpp", unchecked, stub])
    return {"checked": compile_program(tools["dir"] / "lib_cudnn", [driver, REPO / "emu/cudnn.cpp", stub]),
            "unchecked": compile_program(tools["dir"] / "lib_cudnn_unchecked", [driver, unchecked, stub])}


def run_cudnn(exe, env=None, **args):
    r = subprocess.run([str(exe), *(f"{k}={v}" for k, v in args.items())], capture_output=True, text=True, timeout=RUN_TIMEOUT,
                       env={**MPI_ENV, **(env or {})})
    assert "runtime error:" not in r.stderr or "unchecked" in str(exe), r.stderr[-3000:]  # UBSan
    return r, dict(line.split(" ", 1) for line in r.stdout.splitlines() if " " in line)


# One case per rule of the cuDNN API reference ("Backend Descriptor Types": each descriptor's required
# attributes and finalization errors; cudnnBackendSetAttribute/GetAttribute/Execute): (check tag, driver
# arguments, the step that refuses, the status).
SCALARS = dict(x="1,1,1,1", b="1,1,1,1", y="1,1,1,1")
CUDNN_REFUSALS = [
    ("tensor_required", dict(skip="TENSOR_BYTE_ALIGNMENT"), "tensor_x", "CUDNN_STATUS_BAD_PARAM"),
    ("tensor_rank", dict(xs="64,32,8"), "tensor_x", "CUDNN_STATUS_BAD_PARAM"),
    ("tensor_positive", dict(xs="64,32,0,1"), "tensor_x", "CUDNN_STATUS_BAD_PARAM"),
    ("tensor_alignment", dict(align=2), "tensor_x", "CUDNN_STATUS_BAD_PARAM"),
    ("tensor_virtual_by_value", dict(SCALARS, bvirt=1, bvalue=1), "tensor_b", "CUDNN_STATUS_BAD_PARAM"),
    ("tensor_by_value_scalar", dict(bvalue=1), "tensor_b", "CUDNN_STATUS_BAD_PARAM"),
    ("op_required", dict(skip="XDESC"), "op", "CUDNN_STATUS_BAD_PARAM"),
    ("op_rank", dict(y="2,4,8"), "op", "CUDNN_STATUS_BAD_PARAM"),
    ("op_output_by_value", dict(SCALARS, yvalue=1), "op", "CUDNN_STATUS_BAD_PARAM"),
    ("matmul_shape", dict(op="matmul", b="1,2,7,3"), "op", "CUDNN_STATUS_BAD_PARAM"),
    ("pointwise_broadcast", dict(b="1,2,3,8"), "op", "CUDNN_STATUS_BAD_PARAM"),
    ("gen_index_axis", dict(op="gen_index", axis=4), "op", "CUDNN_STATUS_BAD_PARAM"),
    ("reduction_shape", dict(op="reduce", y="1,2,3,1"), "op", "CUDNN_STATUS_BAD_PARAM"),
    ("reshape_elements", dict(op="reshape", y="1,2,8,5", ys="80,40,5,1"), "op", "CUDNN_STATUS_BAD_PARAM"),
    ("graph_required", dict(ops=0), "graph", "CUDNN_STATUS_BAD_PARAM"),
    ("graph_uid", dict(buid=1), "graph", "CUDNN_STATUS_BAD_PARAM"),
    ("graph_single_writer", dict(ops=2), "graph", "CUDNN_STATUS_BAD_PARAM"),
    ("graph_virtual_input", dict(xvirt=1), "graph", "CUDNN_STATUS_BAD_PARAM"),
    ("graph_cycle", dict(cycle=1), "graph", "CUDNN_STATUS_BAD_PARAM"),
    ("plan_required", dict(noconfig=1), "plan", "CUDNN_STATUS_BAD_PARAM"),
    ("engine_index", dict(engine=1), "engine", "CUDNN_STATUS_NOT_SUPPORTED"),
    ("variant_pack_pairs", dict(pairs=2), "pack", "CUDNN_STATUS_BAD_PARAM"),
    ("execute_finalized", dict(unfinalized=1), "execute", "CUDNN_STATUS_BAD_PARAM"),
    ("pack_uid", dict(packuid=99), "execute", "CUDNN_STATUS_BAD_PARAM"),
    ("pack_pointer", dict(nopacky=1), "execute", "CUDNN_STATUS_BAD_PARAM_NULL_POINTER"),
    ("pack_alignment", dict(xoffset=4), "execute", "CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER"),
    ("attribute_type", dict(attrtype=1), "set_uid_int32", "CUDNN_STATUS_BAD_PARAM"),
    ("set_finalized", dict(setafter=1), "set", "CUDNN_STATUS_BAD_PARAM"),
    ("get_finalized", dict(getbefore=1), "get", "CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED"),
]


@pytest.mark.parametrize("op", ["add", "matmul", "reduce", "reshape", "gen_index"])
def test_cudnn_backend_graph_runs(cudnn_tools, op):
    """The driver's valid graph of each operation kind finalizes and executes (Y = X + B checked here)."""
    r, out = run_cudnn(cudnn_tools["checked"], op=op)
    assert out.get("execute") == "CUDNN_STATUS_SUCCESS" and out.get("y") == "ok", r.stdout + r.stderr


@pytest.mark.parametrize("check,args,where,status", CUDNN_REFUSALS, ids=[c[0] for c in CUDNN_REFUSALS])
def test_cudnn_refusal(cudnn_tools, check, args, where, status):
    """The double refuses what the API reference says cuDNN refuses, with that status and one line saying
    why; on the copy with its checks disabled the same step no longer refuses so (so the refusal is the check's)."""
    r, out = run_cudnn(cudnn_tools["checked"], **args)
    assert out.get(where) == status, r.stdout + r.stderr
    assert "emu cuDNN:" in r.stderr, "a refusal says why"
    r, out = run_cudnn(cudnn_tools["unchecked"], **args)
    assert out.get(where) != status, f"without check:{check} the step must not refuse so\n{r.stdout}{r.stderr[-2000:]}"


def test_every_cudnn_check_has_a_refusal_test():
    assert set(CUDNN_CHECKS) == {c[0] for c in CUDNN_REFUSALS}


@pytest.mark.parametrize("args,env,message", [
    (dict(host=1), {}, "are not device memory"),
    (dict(short=1), {}, "run past the end of the device allocation they start in"),
    (dict(workspace=4095), {"LLM8_EMU_CUDNN_WORKSPACE": "4096"}, "is not 4096 bytes of device memory"),
    (dict(unknown="descriptor"), {}, "cudnnBackendCreateDescriptor: descriptor type 1 (cudnn_graph.h) is not emulated"),
    (dict(unknown="attribute"), {}, "attribute 904 (cudnn_graph.h) of a TENSOR descriptor is not emulated"),
])
def test_cudnn_faults_stop_the_run(cudnn_tools, args, env, message):
    """What a GPU would fault on (host memory, a tensor past its allocation, a workspace smaller than the
    plan's EXECUTION_PLAN_WORKSPACE_SIZE) and what the double does not know (a descriptor type, an
    attribute) stop the run with "emu: ..." naming it, instead of computing."""
    r, out = run_cudnn(cudnn_tools["checked"], env=env, **args)
    assert r.returncode != 0 and "emu: " in r.stderr and message in r.stderr, r.stdout + r.stderr[-3000:]


def test_cudnn_workspace_as_the_plan_reports(cudnn_tools):
    """A plan asking for a workspace (LLM8_EMU_CUDNN_WORKSPACE) reports it and runs given that much."""
    r, out = run_cudnn(cudnn_tools["checked"], env={"LLM8_EMU_CUDNN_WORKSPACE": "4096"}, workspace=4096)
    assert "workspace size 4096" in r.stdout, r.stdout
    assert out.get("execute") == "CUDNN_STATUS_SUCCESS" and out.get("y") == "ok", r.stdout + r.stderr


# ------------------------------------------------------------------- the emulated binaries' leak check

def run_without_sanitizer_variables(exe, *args):
    """`mpirun -np 2 exe args` as a user runs it: no ASAN_OPTIONS, LSAN_OPTIONS or Open MPI component
    setting in the environment (removed if this shell has them)."""
    env = {k: v for k, v in MPI_ENV.items() if k not in ("ASAN_OPTIONS", "LSAN_OPTIONS", "OMPI_MCA_mca_base_component_disable_dlclose")}
    cmd = [MPIRUN, "--oversubscribe", "-np", "2", str(exe), *args] if MPIRUN else [str(exe), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=RUN_TIMEOUT, env=env)


def test_emulated_binaries_leak_check_reports_our_leaks_not_open_mpis(tools):
    """emu/sanitizer_defaults.cpp, linked into every emulated binary: an MPI program that frees all it
    allocates exits 0 under LeakSanitizer without any variable set, and one that leaks 4321 bytes of its
    own is still reported, that leak alone. Without the file (the plant), Open MPI's leftovers at exit
    make the clean program exit non-zero, so the first assertion is not vacuous."""
    src = REPO / "emu/tests/leak_after_mpi.cpp"
    # linked as `make emu` links the emulated binaries: the ASan runtime static
    exe = compile_program(tools["dir"] / "leak_after_mpi", [src, REPO / "emu/sanitizer_defaults.cpp"], ["-static-libasan"])
    clean = run_without_sanitizer_variables(exe)
    assert clean.returncode == 0 and "Sanitizer" not in clean.stderr and "Suppressions" not in clean.stderr, \
        clean.stdout + clean.stderr[-4000:]
    assert clean.stdout.count("sum 2" if MPIRUN else "sum 1") == (2 if MPIRUN else 1), clean.stdout

    leaky = run_without_sanitizer_variables(exe, "leak")
    assert leaky.returncode != 0, leaky.stdout + leaky.stderr[-4000:]
    reports = re.findall(r"(Direct|Indirect) leak of (\d+) byte", leaky.stderr)
    assert reports and all(size == "4321" for _, size in reports), leaky.stderr[-4000:]
    assert len(reports) == (2 if MPIRUN else 1), leaky.stderr[-4000:]

    bare = compile_program(tools["dir"] / "leak_after_mpi_bare", [src], ["-static-libasan"])
    planted = run_without_sanitizer_variables(bare)
    assert planted.returncode != 0 and "LeakSanitizer" in planted.stderr, \
        "without emu/sanitizer_defaults.cpp Open MPI's allocations must show as leaks (else this test proves nothing)"
