"""
The emulated GPU's vendor-library doubles (emu/cublaslt.cpp, emu/nccl.cpp; docs/emulated-gpu.md),
each tested on its own: small C++ drivers (emu/tests/lib_gemm.cpp, lib_nccl.cpp) compiled with g++
against the double and emu/tests/lib_stub_runtime.cpp (an eager stand-in for emu-core's runtime), or
against the real emulated runtime (emu/runtime.cpp) where CUDA's stream ordering is the point.

- the cuBLASLt double's GEMMs against a float64 numpy reference written from DESIGN.md section 3's operand
  map (fprop, dgrad, wgrad in FP8 and BF16), on fresh random inputs, FP8 codes made with ml_dtypes;
- every refusal rule of Hopper's cuBLASLt the double enforces, with the status the library returns, and
  each shown to be what makes its test pass: the same case run on a copy of the double with the tagged
  checks ("check:NAME") disabled must not be refused;
- the planted faults of issue 18 for the doubles: an FP8 GEMM in NN layout given to the double directly
  (past gemm_check) is refused; a missing cudaStreamWaitEvent before a NCCL result is read gives a wrong
  result under the late schedule; NCCL all-reduce / reduce-scatter / all-gather / broadcast / grouped
  send-recv over `mpirun -np 2` (and 3) against numpy. Each planted fault is rerun on a copy of the double
  without its check, where the test must fail.
"""
import os
import re
import shutil
import subprocess

import ml_dtypes
import numpy as np
import pytest

from conftest import REPO

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


def mpi_flags(kind):
    return subprocess.run([MPICXX, f"--showme:{kind}"], capture_output=True, text=True, check=True).stdout.split()


FLAGS = ["-std=c++17", "-O1", "-g", "-Wall", "-Wextra", "-fsanitize=address,undefined", "-DLLM8_MPI",
         "-DOMPI_SKIP_MPICXX=1", f"-I{REPO / 'emu'}", f"-I{CUDA_INCLUDE}"]


def compile_program(out, sources, libs=()):
    """g++ as `make emu` builds the doubles (C++17, MPI's C API, the toolkit headers), with ASan + UBSan.
    Each source becomes an object beside `out` once (the doubles and the runtime are linked several times)."""
    objects = []
    for src in map(str, sources):
        obj = out.parent / (src.replace("/", "_").strip("_") + ".o")
        if not obj.exists():
            werror = [] if src.endswith("emu/runtime.cpp") else ["-Werror"]  # emu-core's runtime keeps its own warnings
            cmd = ["nice", "g++", *FLAGS, *werror, *mpi_flags("compile"), "-c", src, "-o", str(obj)]
            r = subprocess.run(cmd, capture_output=True, text=True)
            assert r.returncode == 0, f"{' '.join(cmd)}\n{r.stderr[-4000:]}"
        objects.append(str(obj))
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
def tools(tmp_path_factory):
    d = tmp_path_factory.mktemp("emu_libs")
    stub = REPO / "emu/tests/lib_stub_runtime.cpp"
    gemm = REPO / "emu/tests/lib_gemm.cpp"
    unchecked = disable_checks(REPO / "emu/cublaslt.cpp", CUBLASLT_CHECKS, d / "cublaslt_unchecked.cpp")
    return {"dir": d,
            "gemm": compile_program(d / "lib_gemm", [gemm, REPO / "emu/cublaslt.cpp", stub]),
            "gemm_unchecked": compile_program(d / "lib_gemm_unchecked", [gemm, unchecked, stub]),
            "nccl": compile_program(d / "lib_nccl", [REPO / "emu/tests/lib_nccl.cpp", REPO / "emu/nccl.cpp", stub])}


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


# one case per refusal rule: (check tag, driver arguments, the line that refuses, the status)
FP8_TN = dict(ta="T", tb="N", m=32, n=16, k=48, atype="e4m3", btype="e4m3", dtype="bf16")
REFUSALS = [
    ("fp8_tn", dict(FP8_TN, ta="N", lda=32), "heuristic", "CUBLAS_STATUS_NOT_SUPPORTED"),
    ("fp8_tn", dict(FP8_TN, tb="T", ldb=16, algo="null"), "matmul", "CUBLAS_STATUS_NOT_SUPPORTED"),
    ("e5m2_e5m2", dict(FP8_TN, atype="e5m2", btype="e5m2"), "heuristic", "CUBLAS_STATUS_NOT_SUPPORTED"),
    ("fp8_dims", dict(FP8_TN, m=40, n=24, ldc=48), "heuristic", "CUBLAS_STATUS_NOT_SUPPORTED"),
    ("fp8_ld", dict(FP8_TN, lda=56), "heuristic", "CUBLAS_STATUS_NOT_SUPPORTED"),
    ("fp8_cd", dict(FP8_TN, ctype="f32", inplace=0), "heuristic", "CUBLAS_STATUS_NOT_SUPPORTED"),
    ("fp8_align", dict(FP8_TN, align_pref=8), "heuristic", "CUBLAS_STATUS_NOT_SUPPORTED"),
    ("fp8_ptr_align", dict(FP8_TN, offset_a=8, algo="null"), "matmul", "CUBLAS_STATUS_NOT_SUPPORTED"),
    ("workspace", dict(FP8_TN, ws=4096), "matmul", "CUBLAS_STATUS_INVALID_VALUE"),
    ("workspace", dict(FP8_TN, ws=0), "matmul", "CUBLAS_STATUS_INVALID_VALUE"),
    ("scales_before_heuristic", dict(FP8_TN, scales="after"), "heuristic", "CUBLAS_STATUS_NOT_SUPPORTED"),
    ("scale_non_fp8", dict(FP8_TN, atype="bf16", btype="bf16"), "heuristic", "CUBLAS_STATUS_INVALID_VALUE"),
    ("in_place", dict(FP8_TN, cld=48), "matmul", "CUBLAS_STATUS_INVALID_VALUE"),
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


@pytest.mark.parametrize("check,args,where,status", REFUSALS, ids=[f"{c[0]}-{i}" for i, c in enumerate(REFUSALS)])
def test_refusal(tools, tmp_path, check, args, where, status):
    """The double refuses what Hopper's cuBLASLt refuses, with its status, naming the rule; on the copy
    with the checks disabled the same call is accepted (so the refusal is the check's)."""
    a, b = refusal_operands(args)
    r, out, _ = run_gemm(tools["gemm"], tmp_path / "checked", a, b, **args)
    assert out.get(where) == status, r.stdout + r.stderr
    assert "emu cuBLASLt:" in r.stderr, "a refusal says why"
    r, out, _ = run_gemm(tools["gemm_unchecked"], tmp_path / "unchecked", a, b, **args)
    assert out.get(where) == "CUBLAS_STATUS_SUCCESS", f"without check:{check} the case must pass\n{r.stdout}{r.stderr}"


def test_every_check_has_a_refusal_test():
    assert set(CUBLASLT_CHECKS) == {c[0] for c in REFUSALS}


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
    """Planted fault (issue 18): an FP8 GEMM in NN layout handed to the double directly, past gemm_check,
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
    """Planted-fault test (c) of issue 18 and the double's contract: every collective llm8 uses and the
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
    """Planted fault (issue 18): the compute stream reads an all-reduce's result without cudaStreamWaitEvent
    on the collective's event. Under the late schedule the collective has not run yet, so the value read is
    wrong; with the wait it is right. On a copy of the double that runs collectives at the call instead of on
    their stream (check:nccl_on_stream), the missing wait goes unseen, so this test would fail."""
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

    src = (REPO / "emu/nccl.cpp").read_text()
    line = re.search(r".*/\* check:nccl_on_stream \*/.*", src).group(0)
    eager = tools["dir"] / "nccl_eager.cpp"
    eager.write_text(src.replace(line, "    run_ops(sp, ops, seq); (void)stream;"))
    got, expected = value(build_with_runtime(tools, eager, "lib_nccl_eager"), 0)
    assert got == expected, "a double that ignores the stream hides the missing wait"


@pytest.mark.skipif(not (REPO / "emu/runtime.cpp").exists(), reason="emu-core's lazy runtime (emu/runtime.cpp) is not here yet")
def test_missing_issue_event_before_collective(tools):
    """The other direction (issue 18's early schedule): a collective that reads compute output without
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
    exe = compile_program(tools["dir"] / "leak_after_mpi", [src, REPO / "emu/sanitizer_defaults.cpp"])
    clean = run_without_sanitizer_variables(exe)
    assert clean.returncode == 0 and "Sanitizer" not in clean.stderr and "Suppressions" not in clean.stderr, \
        clean.stdout + clean.stderr[-4000:]
    assert clean.stdout.count("sum 2" if MPIRUN else "sum 1") == (2 if MPIRUN else 1), clean.stdout

    leaky = run_without_sanitizer_variables(exe, "leak")
    assert leaky.returncode != 0, leaky.stdout + leaky.stderr[-4000:]
    reports = re.findall(r"(Direct|Indirect) leak of (\d+) byte", leaky.stderr)
    assert reports and all(size == "4321" for _, size in reports), leaky.stderr[-4000:]
    assert len(reports) == (2 if MPIRUN else 1), leaky.stderr[-4000:]

    bare = compile_program(tools["dir"] / "leak_after_mpi_bare", [src])
    planted = run_without_sanitizer_variables(bare)
    assert planted.returncode != 0 and "LeakSanitizer" in planted.stderr, \
        "without emu/sanitizer_defaults.cpp Open MPI's allocations must show as leaks (else this test proves nothing)"
