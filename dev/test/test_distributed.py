"""
Data-parallel training on the CPU build under mpirun (docs/design.md#the-distributed-design): the same
global batch on any rank count gives bit-identical losses, gradient norms and weights; checkpoints move
between rank counts; faults end the job with one clear message instead of a hang; and the same runs across
two simulated hosts (../shared/tools/netns_cluster.sh).

Runs are tiny (the `tiny` preset, 64-token micro-batches, a few steps) because 2 cores carry all ranks.
Exactness is checked on metrics.jsonl's losses and norms (printed round-trippable, %.9g) and on the
bytes of the model checkpoints. The two-rank equivalence and the two-host tests run twice: with one
OpenMP thread per rank, and with the default (OMP_NUM_THREADS unset: one rank takes both cores, two ranks
share them), since users run the default and the CPU build promises results that do not depend on the
thread count; the others run the default.
"""
import functools
import json
import os
import platform
import shutil
import signal
import struct
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO, program_env, requires_data

MPIRUN = shutil.which("mpirun")
NETNS = REPO.parent / "shared" / "tools" / "netns_cluster.sh"
pytestmark = [pytest.mark.skipif(MPIRUN is None, reason="mpirun not found (make setup installs Open MPI)"), requires_data]

# tiny model, 64-token micro-batches, validation on one global batch, fixed data order
BASE = ["-e", "tiny", "-b", "2", "-t", "32", "-v", "2", "-m", "1", "-u", "2", "--shuffle", "0"]
MICRO_TOKENS = 64
RUN_TIMEOUT = 300
MPI_ENV = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_rmaps_base_oversubscribe": "1", "OMP_NUM_THREADS": "1"}
# The thread settings the equivalence tests run under: pinned to one thread per rank, and the default
# (users' setting). Both for the two-rank equivalence and the two hosts; the three-rank and resume tests
# take the default alone (what they add does not depend on the threads: CI's time budget).
THREADS = ["1", "default"]
# The delayed FP8 recipe with a history of 2 (the ring wraps within a test's steps); its runs take the
# default threads (what it adds, the amax reduction over the ranks, does not depend on them).
DELAYED = ["--fp8-recipe", "delayed", "--amax-history", 2]


def mpi_env(threads="1"):
    """MPI_ENV with OMP_NUM_THREADS=threads, or without it for "default": the trainer shares the cores, and
    mpirun binds nothing, as scripts/launch.sh (--bind-to none) runs it; mpirun's own default binds each
    of 1 or 2 ranks to one core, which would leave every rank one thread."""
    env = dict(MPI_ENV)
    if threads == "default":
        env.pop("OMP_NUM_THREADS")
        env["OMPI_MCA_hwloc_base_binding_policy"] = "none"
    else:
        env["OMP_NUM_THREADS"] = threads
    return env


def forwarded(env):
    """mpirun -x options for what the CPU build's numerics depend on (the BLAS kernel's OPENBLAS_* settings,
    OMP_NUM_THREADS) where `env` sets it: remote ranks start in a clean environment, as under ssh."""
    names = sorted(name for name in env if name.startswith("OPENBLAS_") or name == "OMP_NUM_THREADS")
    return [opt for name in names for opt in ("-x", name)]


def mpirun(ranks, args, exe=REPO / "train_llama_cpu", env=None, **kw):
    cmd = [MPIRUN, "--oversubscribe", "-np", str(ranks), str(exe), *map(str, args)]
    return subprocess.run(cmd, cwd=REPO, env=program_env(exe, env or mpi_env()), capture_output=True, text=True,
                          timeout=RUN_TIMEOUT, **kw)


def train(ranks, out, *extra, steps=3, global_micro=2, exe=REPO / "train_llama_cpu", env=None):
    """A run of `steps` steps whose global batch is `global_micro` micro-batches, on `ranks` ranks."""
    args = [*BASE, "-x", steps, "-d", global_micro * MICRO_TOKENS, "-o", out, *extra]
    r = mpirun(ranks, args, exe, env)
    assert r.returncode == 0, f"{ranks} rank(s) {extra} failed:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
    return r


def trajectory(out):
    """(step, loss, grad_norm) of every step and (step, val_loss) of every evaluation, as written."""
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [(r["step"], r["loss"], r["grad_norm"], r["lr"]) for r in rows if "loss" in r]
    val = [(r["step"], r["val_loss"]) for r in rows if "val_loss" in r]
    return train, val


def assert_same_run(a, b, step):
    ta, va = trajectory(a)
    tb, vb = trajectory(b)
    assert ta == tb, f"train trajectories differ:\n{ta}\n{tb}"
    assert va == vb, f"validation losses differ:\n{va}\n{vb}"
    name = f"model_{step:08d}.bin"
    assert (a / name).read_bytes() == (b / name).read_bytes(), f"{a / name} and {b / name} differ"


def weight_stats(out):
    """The W rows of fp8_stats.csv: amax, scale and cast counts of the FP8 weight copies of every step."""
    rows = (out / "fp8_stats.csv").read_text().splitlines()[1:]
    return [row for row in rows if row.split(",")[3] == "W"]


@pytest.mark.parametrize("precision, threads", [(p, t) for p in ["fp8", "bf16"] for t in THREADS] + [("delayed", "default")])
def test_one_rank_accumulating_equals_two_ranks(tmp_path, precision, threads):
    """1 rank x accum 2 = 2 ranks x accum 1, and ZeRO 0 = 1 = 2 at 2 ranks (fp8), with block recompute
    under ZeRO-2. In fp8 the FP8 weight copies that ZeRO-1/2 cast from sharded master weights (a MAX
    all-reduce of the amaxes, E4M3 pieces gathered) have the one-rank run's scales and cast statistics;
    with delayed scaling every operand's do (the step amaxes MAX-all-reduced into one history).
    With the default threads the single rank runs 2 OpenMP threads and each of the two ranks 1."""
    flags = ["-p", "fp8", *DELAYED] if precision == "delayed" else ["-p", precision]
    stats = ["--fp8-stats", 1] if precision != "bf16" else []
    train(1, tmp_path / "r1", *flags, *stats, env=mpi_env(threads))
    stages = [0, 1, 2] if precision != "bf16" else [0]
    for z in stages:
        recompute = ["-r", 2] if z == 2 else []
        train(2, tmp_path / f"r2z{z}", *flags, "-z", z, *recompute, *stats, env=mpi_env(threads))
        assert_same_run(tmp_path / "r1", tmp_path / f"r2z{z}", 3)
        if precision == "fp8":
            assert len(weight_stats(tmp_path / "r1")) == 3 * 4 * 4
            assert weight_stats(tmp_path / f"r2z{z}") == weight_stats(tmp_path / "r1")
        elif precision == "delayed":
            # every operand's amax (the step's history entry) and, from step 1 on, its scale (step 0 is
            # current-scaled: a rank's last cast shows its own micro-batch's; the X and dY counts are
            # rank 0's micro-batches' in both recipes)
            rows = [[row.split(",")[:7] for row in (tmp_path / name / "fp8_stats.csv").read_text().splitlines()[1:]]
                    for name in ["r1", f"r2z{z}"]]
            assert len(rows[0]) == 3 * 4 * 4 * 3
            assert [r[:6] if r[0] == "0" else r for r in rows[0]] == [r[:6] if r[0] == "0" else r for r in rows[1]]


@pytest.mark.parametrize("precision", ["fp8", "bf16"])
def test_default_threads_larger_micro_batches(tmp_path, precision):
    """Micro-batches of 256 tokens, where OpenBLAS would split a GEMM by the thread count: 1 rank on both
    cores (2 OpenMP threads) = 2 ranks with one each (ZeRO-1), bit for bit, over 6 steps with validation.
    A single multi-threaded BLAS call per GEMM made these runs differ from step 5 on."""
    args = ["-b", 4, "-t", 64, "-x", 6, "-v", 3, "-m", 2, "-p", precision, "--seed", 5, "-d", 512]
    for ranks, name in [(1, "r1"), (2, "r2")]:
        r = mpirun(ranks, [*args, "-z", 1, "-o", tmp_path / name], env=mpi_env("default"))
        assert r.returncode == 0, r.stderr[-2000:]
    assert_same_run(tmp_path / "r1", tmp_path / "r2", 6)


@pytest.mark.parametrize("recipe, threads", [("current", "default"), ("delayed", "default")])
def test_three_ranks_padding(tmp_path, recipe, threads):
    """1 rank x accum 3 = 3 ranks x accum 1 for ZeRO 0, 1, 2 (shards padded: nothing divides by 3)."""
    flags = DELAYED if recipe == "delayed" else []
    train(1, tmp_path / "r1", *flags, global_micro=3, env=mpi_env(threads))
    for z in [0, 1, 2]:
        train(3, tmp_path / f"r3z{z}", "-z", z, *flags, global_micro=3, env=mpi_env(threads))
        assert_same_run(tmp_path / "r1", tmp_path / f"r3z{z}", 3)
    # the optimizer state really is sharded: three state files, one third of the elements each
    states = sorted((tmp_path / "r3z1").glob("state_00000003_*.bin"))
    assert len(states) == 3 and len({p.stat().st_size for p in states}) == 1
    single = (tmp_path / "r1" / "state_00000003_00000.bin").stat().st_size
    assert states[0].stat().st_size < single / 2


@pytest.mark.sanitize
def test_zero2_any_split_of_the_batch(tmp_path, trainer):
    """ZeRO-2 reduces every micro-step in rank order: 2 ranks x accum 2 = 1 rank x accum 4."""
    train(1, tmp_path / "r1", "-z", 2, global_micro=4, steps=2, exe=trainer)
    train(2, tmp_path / "r2", "-z", 2, global_micro=4, steps=2, exe=trainer)
    assert_same_run(tmp_path / "r1", tmp_path / "r2", 2)


def copy_checkpoint(src, dst, step):
    dst.mkdir()
    for f in src.iterdir():
        if f"{step:08d}" in f.name:
            shutil.copy2(f, dst / f.name)


@pytest.mark.parametrize("recipe, threads", [("current", "default"), ("delayed", "default")])
def test_resume_across_rank_counts(tmp_path, recipe, threads):
    """Saved on 2 ranks: resumed on 2 ranks bit-exact; on 1 and 3 ranks (same global batch) it continues
    exactly as the uninterrupted run (ZeRO-2, whose sums do not depend on how the batch is split). The
    delayed case also keeps its AdamW moments in fp8 (--optim-state fp8) and its master weights in fp16
    (--master-weights fp16): the amax history and scales come back on any rank count, and so do the
    moments' and the master's codes and per-chunk scales, each chunk read from the shard that saved it."""
    flags = [*DELAYED, "--optim-state", "fp8", "--master-weights", "fp16"] if recipe == "delayed" else []
    full = tmp_path / "full"
    train(2, full, "-z", 2, "-n", 2, *flags, steps=4, global_micro=6, env=mpi_env(threads))
    for ranks, z in [(2, 2), (1, 2), (3, 1)]:
        resumed = tmp_path / f"resumed{ranks}"
        copy_checkpoint(full, resumed, 2)
        r = train(ranks, resumed, "-z", z, "-n", 2, "-y", 1, *flags, steps=4, global_micro=6, env=mpi_env(threads))
        assert "resumed from" in r.stdout and "saved by 2 rank(s)" in r.stdout
        ta = [row for row in trajectory(full)[0] if row[0] >= 2]
        tb, _ = trajectory(resumed)
        assert [row[0] for row in tb] == [2, 3]
        if z == 2:
            assert ta == tb, f"{ranks} ranks: the resumed run differs:\n{ta}\n{tb}"
            assert (full / "model_00000004.bin").read_bytes() == (resumed / "model_00000004.bin").read_bytes()
        else:
            # ZeRO-1 accumulates each rank's micro-batches first: the same run up to rounding
            for (sa, la, na, _), (sb, lb, nb, _) in zip(ta, tb):
                assert sa == sb and abs(la - lb) < 1e-5 * abs(la) and abs(na - nb) < 1e-4 * abs(na)


def test_resume_under_fp8_comm_on_other_rank_counts(tmp_path):
    """--grad-reduce fp8 quantizes each rank's contribution, so the reduction depends on the rank count:
    saved on 2 ranks, a resume on 2 ranks repeats the run bit for bit; on 3 ranks it restores the same
    state (its first step's loss, computed before any reduction, is the uninterrupted run's) and then
    reduces as 3 ranks do, not as 2 ranks did (the gradient norms differ), within FP8's rounding of the
    uninterrupted run. (For a fixed rank count the reduction is deterministic: the 2-rank resume.)"""
    flags = ["--grad-reduce", "fp8", "-z", 1, "-n", 2]
    full = tmp_path / "full"
    train(2, full, *flags, steps=4, global_micro=6)
    ta = [row for row in trajectory(full)[0] if row[0] >= 2]
    runs = {}
    for name, ranks in [("two", 2), ("three", 3)]:
        resumed = tmp_path / name
        copy_checkpoint(full, resumed, 2)
        train(ranks, resumed, *flags, "-y", 1, steps=4, global_micro=6)
        runs[name] = trajectory(resumed)[0]
        assert [row[0] for row in runs[name]] == [2, 3]
    assert runs["two"] == ta and (full / "model_00000004.bin").read_bytes() == (tmp_path / "two" / "model_00000004.bin").read_bytes()
    (s2, l2, n2, _), (s3, l3, n3, _) = runs["three"]
    assert abs(l2 - ta[0][1]) <= 1e-6 * abs(ta[0][1]), (runs["three"], ta)
    assert n2 != ta[0][2] and abs(n2 - ta[0][2]) < 2e-2 * ta[0][2], (runs["three"], ta)
    assert abs(l3 - ta[1][1]) < 1e-3 * ta[1][1], (runs["three"], ta)


@pytest.mark.parametrize("flag, value0, value1, shown0, shown1", [
    ("-b", "4", "8", "4", "8"),
    ("--bf16-layers", "first", "1-2", "0", "1-2"),
    ("--fp8-accum", "exact", "hopper", "exact", "hopper"),
    ("--fp8-fast-accum", "1", "0", "1", "0"),
    ("--optim-state", "fp32", "fp8", "fp32", "fp8"),
])
def test_mismatched_flags_stop_every_rank(tmp_path, flag, value0, value1, shown0, shown1):
    """MPMD launch with another value of a flag on each rank: one message naming it, non-zero, fast."""
    args = [*BASE, "-x", "2", "-o", tmp_path / "run"]
    cmd = [MPIRUN, "--oversubscribe", "-np", "1", REPO / "train_llama_cpu", *args, flag, value0, ":",
           "-np", "1", REPO / "train_llama_cpu", *args, flag, value1]
    start = time.time()
    r = subprocess.run([str(c) for c in cmd], cwd=REPO, env=MPI_ENV, capture_output=True, text=True, timeout=RUN_TIMEOUT)
    assert r.returncode != 0
    lines = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and f"disagree on {flag}:" in lines[0], r.stderr
    assert f"rank 0 has {shown0}," in lines[0] and f"rank 1 has {shown1} " in lines[0], r.stderr
    assert time.time() - start < 60


X86_64 = platform.machine() == "x86_64"
HAS_AVX2 = X86_64 and " avx2" in Path("/proc/cpuinfo").read_text()


@functools.cache
def default_blas():
    """The BLAS identity a rank reports with this machine's environment (the trainer's '| math:' line),
    probed once per session."""
    probe = subprocess.run([str(REPO / "train_llama_cpu"), *map(str, [*BASE, "-x", 1, "-v", 0])], cwd=REPO,
                           env=mpi_env(), capture_output=True, text=True, timeout=RUN_TIMEOUT)
    line = next((line for line in probe.stdout.splitlines() if line.startswith("| math:")), "")
    if "built-in loop" in line:
        pytest.skip("built with BLAS=none: no BLAS kernel to choose")
    return line


def other_coretype():
    """An x86-64 OpenBLAS core (OPENBLAS_CORETYPE) whose kernels are not the ones this machine gets by
    default: Prescott, the oldest, unless OpenBLAS fell back to it by itself (a CPU it does not know, as
    a virtual 'Intel(R) Xeon(R) Processor' can be), then Core2."""
    return "Core2" if " Prescott " in default_blas() else "Prescott"


@pytest.mark.skipif(not X86_64, reason="OPENBLAS_CORETYPE names x86-64 cores")
def test_blas_mismatch_stops_every_rank(tmp_path):
    """One rank told to use other OpenBLAS kernels (OPENBLAS_CORETYPE on rank 1 only, other_coretype): one
    line naming the BLAS of both ranks, non-zero, fast; a rank computing other bits never trains silently
    beside the others."""
    core = other_coretype()
    args = [*BASE, "-x", "2", "-o", tmp_path / "run"]
    cmd = [MPIRUN, "--oversubscribe", "-np", "1", REPO / "train_llama_cpu", *args, ":",
           "-np", "1", "-x", f"OPENBLAS_CORETYPE={core}", REPO / "train_llama_cpu", *args]
    start = time.time()
    r = subprocess.run([str(c) for c in cmd], cwd=REPO, env=MPI_ENV, capture_output=True, text=True, timeout=RUN_TIMEOUT)
    assert r.returncode != 0, r.stderr
    lines = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "disagree on BLAS" in lines[0], r.stderr
    assert "rank 1 has OpenBLAS" in lines[0] and f" {core} " in lines[0].split("rank 1 has")[1], lines[0]
    assert f" {core} " not in lines[0].split("rank 1 has")[0], lines[0]
    assert time.time() - start < 60


def test_shadow_fallback_decided_by_every_rank(tmp_path):
    """A forced fallback (tolerance 0) on 2 ranks (ZeRO-1, gradients compared) = on 1 rank accumulating the
    same 2 micro-batches: the same events and bit-identical losses, norms and weights, which holds only if
    both ranks ran every step in the same precision as the single rank."""
    policy = ["--shadow-every", 3, "--shadow-policy", "fallback", "--shadow-tol", 0, "--shadow-patience", 2,
              "--shadow-recover", 2, "--shadow-grad", 1]
    train(1, tmp_path / "r1", *policy, steps=7)
    r = train(2, tmp_path / "r2", "-z", 1, *policy, steps=7)
    assert "shadow policy: fallback to BF16 from step 5 on" in r.stdout and "back to FP8 from step 7 on" in r.stdout
    events = {}
    for name in ["r1", "r2"]:
        rows = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        events[name] = [(row["step"], row["event"]) for row in rows if "event" in row]
    assert events["r1"] == events["r2"] == [(3, "fallback"), (5, "recover")]
    assert_same_run(tmp_path / "r1", tmp_path / "r2", 7)


def test_samples_with_bf16_blocks_under_zero(tmp_path):
    """Samples of a 2-rank ZeRO-1 fp8 run with a BF16 block (whose weights every forward all-gathers) run
    on every rank without a hang, and print the tokens of the 1-rank run."""
    extra = ["--bf16-layers", "first", "-s", 2, "-g", 4]
    one = train(1, tmp_path / "r1", *extra)
    two = train(2, tmp_path / "r2", "-z", 1, *extra)
    samples = [[line for line in r.stdout.splitlines() if line.startswith("| sample:")] for r in (one, two)]
    assert len(samples[0]) == 3 and samples[0] == samples[1], samples


def write_shard(path, tokens):
    header = np.zeros(256, dtype=np.int32)
    header[:3] = [20240520, 1, len(tokens)]
    path.write_bytes(header.tobytes() + np.asarray(tokens, dtype=np.uint16).tobytes())


def test_nan_on_one_rank_skips_on_every_rank(tmp_path, rng):
    """A token whose embedding is NaN appears in rank 1's micro-batch of step 1 only: every rank skips."""
    poison = 31999
    n = 33 * 64 + 1
    tokens = rng.integers(3, 31000, size=n)
    tokens[2 * 32 + 5] = poison  # sample 2 = rank 1's first sequence of step 1 (2 ranks x B 2)
    write_shard(tmp_path / "train.bin", tokens)
    write_shard(tmp_path / "val.bin", rng.integers(3, 31000, size=n))
    model = tmp_path / "model.bin"
    r = subprocess.run([str(REPO / "train_llama_cpu"), "-e", "tiny", "-x", "1", "-o", tmp_path / "init", *BASE[2:],
                        "-i", tmp_path / "train.bin", "-j", tmp_path / "val.bin"], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    data = bytearray((tmp_path / "init" / "model_00000001.bin").read_bytes())
    offset = 1024 + poison * 128 * 4  # tok_embeddings row `poison` (dim 128)
    data[offset:offset + 4] = struct.pack("<f", float("nan"))
    model.write_bytes(bytes(data))
    args = ["-e", model, *BASE[2:], "-x", 3, "-d", 2 * MICRO_TOKENS, "-i", tmp_path / "train.bin", "-j", tmp_path / "val.bin",
            "-v", 0, "-o", tmp_path / "run", "-z", 1]
    r = mpirun(2, args)
    assert r.returncode == 0, r.stderr[-2000:]
    # rank 0 prints for the job: its own batch was finite, yet it skipped with rank 1
    assert "step 1 skipped: loss nan" in r.stdout and "first non-finite gradient: tok_embeddings" in r.stdout, r.stdout
    assert "step 2 skipped" not in r.stdout and "step 3 skipped" not in r.stdout
    train_rows, _ = trajectory(tmp_path / "run")
    assert [row[0] for row in train_rows] == [0, 1, 2]


def wait_for(predicate, timeout):
    end = time.time() + timeout
    while time.time() < end:
        if predicate():
            return True
        time.sleep(0.2)
    return False


def start_long_run(out, *extra):
    args = [*BASE, "-x", 200, "-d", 3 * MICRO_TOKENS, "-o", out, "-n", 1, "-z", 2, *extra]
    cmd = [MPIRUN, "--oversubscribe", "-np", "3", str(REPO / "train_llama_cpu"), *map(str, args)]
    return subprocess.Popen(cmd, cwd=REPO, env=MPI_ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def rank_pids(mpirun_pid):
    out = subprocess.run(["pgrep", "-P", str(mpirun_pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def test_killed_rank_ends_the_job(tmp_path):
    """A rank killed mid-run ends the whole job non-zero; the checkpoint written before still loads."""
    out = tmp_path / "run"
    job = start_long_run(out)
    try:
        assert wait_for(lambda: (out / "DONE_00000002").exists(), 120), "no checkpoint appeared"
        pids = rank_pids(job.pid)
        assert len(pids) == 3, pids
        os.kill(pids[1], signal.SIGKILL)
        job.wait(timeout=60)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    assert job.returncode != 0
    done = max(int(p.name[5:]) for p in out.glob("DONE_*"))
    r = train(1, out, "-z", 2, "-n", 1, "-y", 1, steps=done + 1, global_micro=3)
    assert f"resumed from {out} at step {done}" in r.stdout


def test_stalled_rank_trips_the_watchdog(tmp_path):
    """A rank that stops responding: the others' watchdog names rank, host, step and phase and aborts."""
    out = tmp_path / "run"
    job = start_long_run(out, "--comm-timeout", 6)
    try:
        assert wait_for(lambda: (out / "DONE_00000001").exists(), 120), "the run did not start"
        pids = rank_pids(job.pid)
        os.kill(pids[2], signal.SIGSTOP)
        _, stderr = job.communicate(timeout=90)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    assert job.returncode != 0
    lines = [line for line in stderr.splitlines() if "no progress for" in line]
    assert lines, stderr[-2000:]
    assert lines[0].startswith("error: rank ") and " on " in lines[0] and "step " in lines[0] and "phase " in lines[0]


@pytest.fixture(scope="module")
def two_hosts():
    if os.geteuid() != 0:
        pytest.skip("the two-host simulation needs root (network namespaces)")
    if not NETNS.exists() or shutil.which("ip") is None or shutil.which("unshare") is None:
        pytest.skip(f"{NETNS} or iproute2/util-linux is missing")
    subprocess.run(["bash", NETNS, "down"], capture_output=True)
    up = subprocess.run(["bash", NETNS, "up", "2"], capture_output=True, text=True)
    if up.returncode != 0:
        pytest.skip(f"netns_cluster.sh up 2 failed here: {up.stderr.strip()[-300:]}")
    yield
    subprocess.run(["bash", NETNS, "down"], capture_output=True)


def two_host_run(out, env, *extra):
    """4 ranks on the 2 simulated hosts (ZeRO-1), forwarding to the remote ranks what `env` sets of the
    variables the numerics depend on, as a user must."""
    train_dir = REPO / "dev/data/tinyshakespeare"
    args = [*BASE, "-x", 2, "-d", 4 * MICRO_TOKENS, "-z", 1, "-o", out,
            "-i", train_dir / "tiny_shakespeare_train.bin", "-j", train_dir / "tiny_shakespeare_val.bin"]
    return subprocess.run(["bash", str(NETNS), "run", *forwarded(env), *extra, "-wdir", str(REPO), "-np", "4",
                           str(REPO / "train_llama_cpu"), *map(str, args)], env=env, capture_output=True, text=True,
                          timeout=RUN_TIMEOUT)


@pytest.mark.parametrize("threads", THREADS)
@pytest.mark.parametrize("coretype", ["inherited", pytest.param("Haswell", marks=pytest.mark.skipif(
    not HAS_AVX2, reason="OpenBLAS's Haswell kernels need AVX2"))])
def test_two_hosts(tmp_path, two_hosts, threads, coretype):
    """4 ranks on 2 simulated hosts over TCP = 1 rank accumulating 4 micro-batches (ZeRO-1), with this
    machine's environment and with OPENBLAS_CORETYPE set (as some machines must), pinned and default threads."""
    env = mpi_env(threads)
    if coretype != "inherited":
        env["OPENBLAS_CORETYPE"] = coretype
    train(1, tmp_path / "r1", "-z", 1, global_micro=4, steps=2, env=env)
    out = tmp_path / "r4"
    r = two_host_run(out, env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "4 rank(s)" in r.stdout and "(2 on this host)" in r.stdout
    assert_same_run(tmp_path / "r1", out, 2)


@pytest.mark.skipif(not X86_64, reason="OPENBLAS_CORETYPE names x86-64 cores")
def test_two_hosts_unforwarded_blas_setting(tmp_path, two_hosts):
    """OPENBLAS_CORETYPE set on the launch node but not forwarded: the remote ranks pick their own kernels,
    and the start-up agreement stops the job with one line instead of training on mixed bits."""
    env = {**mpi_env(), "OPENBLAS_CORETYPE": other_coretype()}
    r = subprocess.run(["bash", str(NETNS), "run", "-x", "OMP_NUM_THREADS", "-wdir", str(REPO), "-np", "4",
                        str(REPO / "train_llama_cpu"), *map(str, [*BASE, "-x", 2, "-o", tmp_path / "run"])], env=env,
                       capture_output=True, text=True, timeout=RUN_TIMEOUT)
    assert r.returncode != 0
    lines = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "disagree on BLAS" in lines[0] and "ranks that differ from rank 0: 2, 3" in lines[0], r.stderr


def test_launcher(tmp_path):
    """scripts/launch.sh with a one-host hostfile starts one rank per slot and forwards NCCL_ and OPENBLAS_
    variables."""
    hostfile = tmp_path / "hosts"
    hostfile.write_text("localhost slots=2\n")
    out = tmp_path / "run"
    env = {**MPI_ENV, "NCCL_DEBUG": "WARN", "OPENBLAS_VERBOSE": "0", "MPIRUN_ARGS": "--oversubscribe"}
    r = subprocess.run(["bash", str(REPO / "scripts/launch.sh"), str(hostfile), "2", "--", str(REPO / "train_llama_cpu"),
                        *map(str, [*BASE, "-x", 1, "-o", out])], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=RUN_TIMEOUT)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "1 host(s) x 2 rank(s) = 2 ranks" in r.stderr and "-x NCCL_DEBUG" in r.stderr and "-x OPENBLAS_VERBOSE" in r.stderr
    assert "| ranks: 2 on" in r.stdout
