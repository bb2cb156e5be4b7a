"""
The ops of one optimizer step as the trainer records them (core/op_record.h, docs/performance.md#the-steps-ops):
`--dry-run 2` lists them without running the step (plan-only mode), LLM8_TRACE_OPS records a real step.
The drift test holds the two equal over flag combinations (fp8 and bf16, recompute, gradient accumulation,
ZeRO-1/2 on 2 ranks under mpirun, the FP8 wire, stored formats), so that what scripts/perf_model.py reads
is what a run does; a planted divergence (the plan skipping the gradient reductions) proves it fails. A few
records are checked by hand against the formulas (float64 arithmetic from the model's dimensions), and every
op of the backend and communication contracts is checked to record itself at its head.
"""
import json
import re
import shutil
import subprocess

import pytest

from conftest import REPO, requires_data, run
from test_distributed import MPI_ENV

MPIRUN = shutil.which("mpirun")
# tiny model, 64-token micro-batches (128 tokens per micro-step), two steps: the trace records the second
BASE = ["-e", "tiny", "-b", "2", "-t", "64", "-m", "1", "-v", "0"]
MICRO_TOKENS = 128
GPU_ACT_BYTES = 2  # the GPU stores activations as BF16

# (ranks, flags): each is run for two steps with the trace on and listed by --dry-run 2
COMBOS = [
    (1, ["-p", "fp8", "-r", "1", "-d", 2 * MICRO_TOKENS]),
    (1, ["-p", "bf16", "-r", "2", "--grad-buffer", "bf16", "--optim-state", "fp8"]),
    (2, ["-p", "fp8", "-z", "2", "--fp8-recipe", "delayed", "--grad-reduce", "fp8", "-d", 4 * MICRO_TOKENS]),
    (2, ["-p", "bf16", "-z", "1", "--master-weights", "fp16"]),
]


def ops_line(stdout):
    """The JSON of --dry-run 2's "ops: {...}" line."""
    lines = [line for line in stdout.splitlines() if line.startswith("ops: ")]
    assert len(lines) == 1, stdout[-3000:]
    return json.loads(lines[0][len("ops: "):])


def plan(trainer, ranks, flags):
    r = run([trainer, *BASE, *flags, "--dry-run", 2, "--ranks", ranks])
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return ops_line(r.stdout)


def trace(trainer, ranks, flags, path):
    """The ops LLM8_TRACE_OPS records of a real two-step run."""
    cmd = [trainer, *BASE, *flags, "-x", 2]
    env = {**MPI_ENV, "LLM8_TRACE_OPS": str(path)}
    if ranks > 1:
        if MPIRUN is None:
            pytest.skip("mpirun not found")
        cmd = [MPIRUN, "--oversubscribe", "-np", ranks, "-x", "LLM8_TRACE_OPS", "-x", "OMP_NUM_THREADS", *cmd]
    r = run(cmd, env=env, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return json.loads(path.read_text())


def differences(traced, planned):
    """Where two op lists disagree, as lines (empty when they are equal)."""
    out = [f"run: {k}: traced {traced.get(k)!r}, planned {planned.get(k)!r}"
           for k in sorted(set(traced) | set(planned)) if k != "ops" and traced.get(k) != planned.get(k)]
    a, b = traced["ops"], planned["ops"]
    for i in range(max(len(a), len(b))):
        x, y = a[i] if i < len(a) else None, b[i] if i < len(b) else None
        if x != y:
            out.append(f"op {i}: traced {x}, planned {y}")
            break
    return out


@requires_data
@pytest.mark.parametrize("ranks, flags", COMBOS, ids=[f"{r}rank-" + "_".join(map(str, f)) for r, f in COMBOS])
def test_plan_equals_trace(trainer, shakespeare, tmp_path, ranks, flags):
    traced = trace(trainer, ranks, flags, tmp_path / "trace.json")
    assert traced["ops"], "the trace recorded nothing"
    assert differences(traced, plan(trainer, ranks, flags)) == []


# The plan diverging from the run: its gradient reductions skipped (a plan-only branch in the driver).
PLAN_FAULT = ("train/data_parallel.h", "    if (dp->local || (z < 2 && !dp->last_micro)) return;\n",
              "    if (dp->local || (z < 2 && !dp->last_micro) || g_record_mode == RECORD_PLAN) return;\n")
SOURCES = ["train_llama.c", "core", "cpu", "comm", "fp8", "llama", "model", "train", "dataloader"]


def faulty_trainer(root, path, old, new):
    """train_llama_cpu built at -O0 from a copy of its sources with `old` replaced by `new` in `path`."""
    for name in SOURCES:
        (shutil.copytree if (REPO / name).is_dir() else shutil.copy2)(REPO / name, root / name)
    source = (root / path).read_text()
    assert source.count(old) == 1, f"{path} no longer has the text the fault replaces: {old!r}"
    (root / path).write_text(source.replace(old, new))
    compile_line = run(["make", "-s", "-n", "-B", "train_llama_cpu"]).stdout.strip().splitlines()[-1]
    assert " train_llama.c -o train_llama_cpu " in compile_line, compile_line
    b = subprocess.run(compile_line.replace(" -O3 ", " -O0 "), shell=True, cwd=root, capture_output=True, text=True)
    assert b.returncode == 0, b.stderr[-3000:]
    return root / "train_llama_cpu"


def test_a_plan_that_drifts_is_caught(trainer, tmp_path):
    # the real plan equals the real run's trace (test_plan_equals_trace, same flags): the faulty plan must differ
    ranks, flags = COMBOS[2]
    faulty = plan(faulty_trainer(tmp_path, *PLAN_FAULT), ranks, flags)
    assert differences(plan(trainer, ranks, flags), faulty) != []


def test_gpu_build_refuses_dry_run_2():
    exe = REPO / "train_llama"
    if not exe.exists():
        pytest.skip("train_llama (the CUDA build) is not built here")
    r = run([exe, "--dry-run", 2, "-e", "tiny", "--gpu-mem", 80])
    assert r.returncode != 0 and "train_llama_cpu" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_dry_run_refuses_3(trainer):
    r = run([trainer, "--dry-run", 3])
    assert r.returncode != 0 and "--dry-run" in r.stderr and "0, 1 or 2" in r.stderr


# ---------------------------------------------------------------- records by hand

def model_dims(stdout):
    m = re.search(r"\| model: dim (\d+), layers (\d+), heads (\d+), kv heads (\d+), head dim (\d+), ffn (\d+), vocab (\d+)", stdout)
    return dict(zip(("C", "L", "NH", "NKV", "HS", "F", "V"), map(int, m.groups())))


def records(ops, op, shape=None):
    return [o for o in ops["ops"] if o["op"] == op and (shape is None or o["shape"][:len(shape)] == list(shape))]


@pytest.mark.parametrize("precision", ["bf16", "fp8"])
def test_records_match_the_formulas(trainer, precision):
    B, T, A = 4, 64, 3
    r = run([trainer, "-e", "tiny", "-b", B, "-t", T, "-d", A * B * T, "-p", precision, "--dry-run", 2])
    assert r.returncode == 0, r.stderr
    ops, d = ops_line(r.stdout), model_dims(r.stdout)
    C, L, NH, NKV, HS, F, V = (float(d[k]) for k in ("C", "L", "NH", "NKV", "HS", "F", "V"))
    N, QKV = float(B * T), (NH + 2 * NKV) * HS
    assert ops["grad_accum"] == A
    # the sequence names every op once, in the order they ran: the first micro-step's forward begins it
    seq = ops["sequence"]
    assert len(seq) == sum(o["count"] for o in ops["ops"])
    assert all(seq.count(i) == o["count"] for i, o in enumerate(ops["ops"]))
    assert ops["ops"][seq[-1]]["phase"] == "optimizer" and "forward" in [ops["ops"][i]["phase"] for i in seq[:5]]
    # every linear's fprop, dgrad and wgrad: 2 FLOPs per weight per token each (Kaplan et al. 2020, 6 N D)
    linear_weights = L * (QKV * C + C * C + 2 * F * C + F * C) + V * C
    gemms = records(ops, "gemm")
    assert sum(g["count"] for g in gemms) == 3 * (4 * L + 1) * A
    assert sum(g["flops"] * g["count"] for g in gemms) == 6.0 * linear_weights * N * A
    # the wqkv fprop (m = QKV, n = N, k = C): weight and input read once, output written once
    w, x = (1.0, 1.0) if precision == "fp8" else (GPU_ACT_BYTES, GPU_ACT_BYTES)
    (fprop,) = [g for g in records(ops, "gemm", (QKV, N, C)) if g["phase"] == "forward"]
    assert fprop["read"] == w * QKV * C + x * N * C and fprop["write"] == GPU_ACT_BYTES * QKV * N
    assert fprop["count"] == L * A
    # causal attention: q k^T and p v over the lower triangle, 2 B NH T^2 HS FLOPs; backward 5 products
    (fwd,) = records(ops, "attention_forward")
    assert fwd["flops"] == 2.0 * B * NH * T * T * HS and fwd["count"] == L * A
    (bwd,) = records(ops, "attention_backward")
    assert bwd["flops"] == 2.5 * fwd["flops"]
    # RMSNorm forward: reads x (N, C) and the weight, writes y and rstd (N FP32)
    norm = records(ops, "rmsnorm_forward", (N, C))
    assert norm and all(o["read"] == GPU_ACT_BYTES * (N * C + C) and o["write"] == GPU_ACT_BYTES * N * C + 4 * N for o in norm)
    # AdamW on one rank updates every parameter once, FP32 master, moments and gradient
    adam = records(ops, "adamw")
    params = L * (QKV * C + C * C + 3 * F * C + 2 * C) + 2 * V * C + C
    assert sum(o["shape"][0] * o["count"] for o in adam) == params
    assert sum(o["read"] * o["count"] for o in adam) == (4 + 4 + 8) * params
    # the step reads back the micro-steps' loss sums once, not once per micro-step
    assert [o["count"] for o in records(ops, "download", (8 * A,))] == [1]


# ---------------------------------------------------------------- every op records itself

def contract_ops(header, prefixes, exempt):
    """The function names a contract header declares with one of `prefixes`, less `exempt`."""
    names = re.findall(r"^(?:LLM8_NORETURN )?static inline [\w\s\*]+?\b(\w+)\(", (REPO / header).read_text(), re.M)
    return sorted({n for n in names if n.startswith(prefixes) and n not in exempt})


def unrecorded(source, names):
    """The functions among `names` whose definition in `source` does not record itself as its first statement."""
    missing = []
    for name in names:
        m = re.search(r"^(?:LLM8_NORETURN )?static inline [\w\s\*]+?\b" + name + r"\([^;{]*\)\s*\{\s*([^\n]*)", source, re.M)
        if m is None or not re.match(r"(RECORD\(|if \(op_record\()", m.group(1)):
            missing.append(name)
    return missing


BACKEND_EXEMPT = {"dev_alloc", "dev_free", "op_attention_prepare"}  # allocation, and start-up preparation (no step op)
COMM_EXEMPT = {"comm_init", "comm_finalize", "comm_abort", "comm_async_error", "comm_exposed_ms", "comm_workspaces"}


def test_every_contract_op_records_itself():
    backend = contract_ops("llama/backend.h", ("op_", "dev_", "act_to_float_host"), BACKEND_EXEMPT)
    comm = contract_ops("comm/comm.h", ("comm_",), COMM_EXEMPT | {"launcher_world", "launcher_rank", "launcher_local_rank"})
    assert "op_gemm" in backend and "comm_reduce_scatter" in comm and len(backend) > 30
    cpu, mpi = (REPO / "cpu/backend.h").read_text(), (REPO / "comm/comm_mpi.h").read_text()
    assert unrecorded(cpu, backend) == [] and unrecorded(mpi, comm) == []
    # planted: one op's record removed
    line = '    RECORD("swiglu_backward", '
    assert cpu.count(line) == 1
    faulty = "\n".join(l for l in cpu.splitlines() if not l.startswith(line))
    assert unrecorded(faulty, backend) == ["op_swiglu_backward"]
