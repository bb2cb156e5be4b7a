"""
The emulated GPU (`make emu`, emu/, docs/emulated-gpu.md): the CUDA build's own sources run by
build/emu/test_llama and build/emu/train_llama on the CPU, one fiber per GPU thread.

- The emulator's device side and runtime rules against NVIDIA's documentation (build/emu/test_intrinsics).
- Every kernel check of test_llama (dev/cuda/kernel_cases.cuh) at test_llama's small shape, and again in
  race mode (LLM8_EMU_RACE=1: each launch twice, in opposite thread and block orders, compared bit for bit),
  and every model check; two at a time, as the emulator runs each on one thread.
- Planted faults, each applied to a copy of the real source, each caught by the emulator; the same
  command on the unmodified source passes, so each test fails if the emulator's check is removed.
- train_llama on the emulated GPU against train_llama_cpu, on 1 and 2 ranks through the NCCL double, every
  run under STEPS_FORBID: from the start of the step loop to its end (checkpoints apart) nothing allocates
  or frees device or pinned memory, synchronizes the whole device or loads a kernel (emu/nvtx.cpp counts
  them per NVTX range), across the runs for every ZeRO stage, wire format and recompute level, with
  validation, evaluations, samples, the shadow check and checkpoints.
Skipped, with the reason, when build/emu was not built (`make emu`).
"""
import functools
import json
import math
import os
import re
import shutil
import subprocess

import pytest

from conftest import REPO, plant_switched, run, two_at_a_time
from test_evals import eval_files, eval_flags, evals_of  # noqa: F401 (eval_files: a fixture)

EMU = REPO / "build/emu"
pytestmark = pytest.mark.skipif(not (EMU / "test_llama").exists(), reason="build/emu is not built (make emu)")


def emu_env(**extra):
    env = dict(os.environ)
    env.update(extra)
    return env


# What the step loop must not do (the trainer's NVTX range "step loop"; checkpoints have a range of their
# own): emu/nvtx.cpp stops the run at the first, naming it. Kernel loads are what the warm-up (--warmup-pass 1,
# the default) prevents.
NO_ALLOCATION = "cudaMalloc,cudaFree,cudaMallocHost,cudaFreeHost,cudaDeviceSynchronize"
STEPS_FORBID = f"step loop={NO_ALLOCATION},kernel loads"


def trainer_env(**extra):
    """emu_env for train_llama runs: the step loop's rule enforced."""
    return emu_env(LLM8_EMU_FORBID=STEPS_FORBID, **extra)


def kernel_checks():
    exe = EMU / "test_llama"
    if not exe.exists():
        return []
    r = subprocess.run([str(exe), "--list"], capture_output=True, text=True, cwd=REPO)
    return [c for c in r.stdout.split() if c.startswith("kernel_")]


@pytest.mark.parametrize("env", [{}, {"LLM8_EMU_SCHEDULE": "early"}, {"LLM8_EMU_RACE": "1"}], ids=["late", "early", "race"])
def test_intrinsics_and_runtime(env):
    r = run([EMU / "test_intrinsics"], env=emu_env(**env), timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("race", [False, True], ids=["normal", "race"])
def test_stats_count_thread_resumes(race):
    """LLM8_EMU_STATS=1's per-kernel table (emu/runtime.cpp), from test_intrinsics' launches: a kernel with
    one barrier resumes each of its threads twice (start, after the barrier); one without resumes only each
    block's first thread (the rest run as plain calls); race mode runs every launch twice."""
    env = emu_env(LLM8_EMU_STATS="1", **({"LLM8_EMU_RACE": "1"} if race else {}))
    r = run([EMU / "test_intrinsics"], env=env, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = {m[0]: tuple(map(int, m[1:])) for m in re.findall(r"^emu stats \(pid \d+\): (\S+) +(\d+) +(\d+) +(\d+) +(\d+) +[\d.]+$",
                                                          r.stderr, re.M)}
    runs = 2 if race else 1
    assert rows["barrier_kernel"] == (1, 3, 3 * 256, runs * 3 * 256 * 2), rows   # launches, blocks, threads, resumes
    assert rows["index_kernel"] == (1, 2, 2 * 60, runs * 2), rows
    assert rows["total"][0] == sum(v[0] for k, v in rows.items() if k != "total"), rows


@pytest.mark.parametrize(
    "fault, message",
    [
        ("divergent-barrier", r"emu: kernel divergent_barrier_kernel, block \(0, 0, 0\): __syncthreads reached by 16 of the block's 32"),
        ("late-barrier", r"emu: kernel late_barrier_kernel, block \(0, 0, 0\): __syncthreads reached by thread \(1, 0, 0\), but "
                         r"the block's first thread exited without reaching it"),
        ("host-pointer", r"emu: launch of store_kernel: pointer argument .* is not device memory"),
        ("reduce-size", r"emu: cub::BlockReduce<T, 64> used in a block of \(32, 1, 1\) threads"),
    ],
)
def test_runtime_rule_stops_the_run(fault, message):
    r = run([EMU / "test_intrinsics", fault], timeout=60)
    assert r.returncode != 0 and re.search(message, r.stderr), r.stdout + r.stderr[-3000:]
    assert "not caught" not in r.stdout


def run_check(check, race):
    """build/emu/test_llama --only CHECK, in race mode (LLM8_EMU_RACE=1) when `race`."""
    env = emu_env(LLM8_EMU_RACE="1") if race else emu_env()
    return run([EMU / "test_llama", "--only", check], env=env, timeout=600)


@pytest.fixture(scope="module")
def check_runs(request, tmp_path_factory):
    """{(check, race): future of its run} for every kernel and model check this session selected: the
    emulator runs a check on one thread, so they run two at a time, started when the first is asked for.
    Then, on the same two workers, the builds of the planted faults' copy ({("build", targets): future},
    planted_builds): the planted-fault tests come last in this file, so the copy builds while the trainer
    runs between, most of them on one core, leave the other free."""
    with two_at_a_time(request, ("test_kernel_check", "test_model_check"), lambda p: (p["check"], p.get("race", False)),
                       run_check, then=planted_builds(request, tmp_path_factory)) as runs:
        yield runs


@pytest.mark.parametrize("race", [False, True], ids=["normal", "race"])
@pytest.mark.parametrize("check", kernel_checks())
def test_kernel_check(check_runs, check, race):
    r = check_runs[(check, race)].result()
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    assert "1 passed, 0 failed" in r.stdout


# The model-level checks (GPU build vs the reference state and vs the CPU build, resume, recompute, ...);
# of the production-shape ones (prod_*) only attention's, which test_llama.cu shrinks on the emulated GPU
# (T 512, 8 heads of 128: cuDNN's graphs run by the double, GQA too); the others are out of a CPU's reach.


def model_checks():
    exe = EMU / "test_llama"
    if not exe.exists():
        return []
    r = subprocess.run([str(exe), "--list"], capture_output=True, text=True, cwd=REPO)
    names = [c for c in r.stdout.split() if not c.startswith(("kernel_", "prod_")) or c.startswith("prod_attention")]
    return names


@pytest.mark.parametrize("check", model_checks())
def test_model_check(check_runs, check):
    r = check_runs[(check, False)].result()
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    assert "1 passed, 0 failed" in r.stdout


# ---------------------------------------------------------------- planted faults

# (name, file, the source text, its faulty replacement, binary to build, its arguments, environment,
#  what the emulator must say). All of them sit in one copy of the real source, each behind its runtime
# switch (conftest.plant_switched: the lines that differ, whole statements, run as the fault when
# LLM8_PLANTED_FAULT names it), so that one build of each binary serves every fault.
FAULTS = [
    ("removed_syncthreads", "fp8/cast_cuda.cuh",
     "            amax_bits = max(amax_bits, __float_as_uint(v) & 0x7fffffffu);\n        }\n    }\n    if (out_t) {\n"
     "        __syncthreads();\n",
     "            amax_bits = max(amax_bits, __float_as_uint(v) & 0x7fffffffu);\n        }\n    }\n    if (out_t) {\n",
     "test_llama", ["--only", "kernel_fp8_cast"], {"LLM8_EMU_RACE": "1"},
     r"emu: race mode: kernel cast_transpose_kernel<In> .* wrote different bytes"),
    ("off_by_one_store", "cuda/swiglu.cuh",
     "        out[i] = y;\n", "        out[i + 1] = y;\n",
     "test_llama", ["--only", "kernel_swiglu"], {},
     r"AddressSanitizer: heap-buffer-overflow(.|\n)*WRITE of size 2(.|\n)*swiglu_forward_kernel"),
    ("read_unwritten_shared", "cuda/rmsnorm.cuh",
     "    for (int c = threadIdx.x; c < C; c += blockDim.x) dw[c] = 0.0f;\n", "",
     "test_llama", ["--only", "kernel_rmsnorm"], {},
     r"rmsnorm_backward dweight: .*FAIL\n.*first at index 0: gpu -?nan"),
    # a static __shared__ word nobody wrote in this block: the runtime's NaN bytes (0xff, no cast gives it)
    # reach out_t; with the array kept from the previous block (or zero) the codes would be stale instead
    ("read_unwritten_static_shared", "fp8/cast_cuda.cuh",
     "        tile[lr * CTV_PITCH_WORDS + lc / 4 + 1] = codes.y;\n", "",
     "test_llama", ["--only", "kernel_fp8_cast_vec"], {},
     r"FAIL: first transposed code at \d+: gpu 0xff"),
    # one row past the end of a template kernel's static __shared__ tile (g++'s ASan gives template
    # statics no redzone of their own: the runtime poisons the marker that follows the array)
    ("static_shared_overflow", "fp8/cast_cuda.cuh",
     "            tile[lr][lc] = code;\n", "            tile[lr + 1][lc] = code;\n",
     "test_llama", ["--only", "kernel_fp8_cast"], {},
     r"AddressSanitizer: use-after-poison(.|\n)*WRITE of size 1(.|\n)*cast_transpose_kernel"),
    # a launch above the kernel's __launch_bounds__(CT_THREADS): refused as the CUDA runtime does, and
    # launchCheck stops at the launch with the runtime's message
    ("above_launch_bounds", "fp8/cast_cuda.cuh",
     "    LAUNCH(cast_transpose_vec_kernel, (unsigned int)tiles, CT_THREADS)(out, out_t, x, rows, cols, tiles_x, s, f, pow2, counts,\n"
     "                                                                   delayed, record);\n",
     "    LAUNCH(cast_transpose_vec_kernel, (unsigned int)tiles, 2 * CT_THREADS)(out, out_t, x, rows, cols, tiles_x, s, f, pow2, counts,\n"
     "                                                                   delayed, record);\n",
     "test_llama", ["--only", "kernel_fp8_cast_vec"], {},
     r"emu: launch of cast_transpose_vec_kernel: block \(512, 1, 1\) of 512 threads, above the kernel's "
     r"__launch_bounds__\(256\)(.|\n)*too many resources requested for launch"),
    ("smem_without_opt_in", "cuda/attention.cuh",
     "    smem_opt_in(attention_backward_key_kernel, smem_k);\n", "",
     "attention_smem", [], {},
     r"emu: launch of attention_backward_key_kernel: 65664 bytes of dynamic shared memory, above the kernel's "
     r"limit of 49152 \(48 KiB without the opt-in\)(.|\n)*invalid argument"),
]


# The trainer's start-up sizing removed: the first step's backward grows its scratch (a cudaMalloc in the
# step loop). --warmup-pass 0, whose passes would otherwise grow the scratch before the loop, so the rule
# forbids allocations alone here (kernel loads are --warmup-pass's, test_step_kernel_loads_are_caught).
TRAINER_FAULTS = [
    ("step_allocates", "train/trainer.h", "    trainer_reserve(tr);\n", "",
     "train_llama", ["-e", "tiny", "-b", "2", "-t", "32", "-x", "1", "-v", "0", "-m", "1", "--warmup-pass", "0"],
     {"LLM8_EMU_FORBID": f"step loop={NO_ALLOCATION}"}, r'emu: cudaMalloc(Host)? inside NVTX range "step loop"'),
    # the trainer's start-up without the samples' shape (1 x -t): cuDNN would build its graph mid-run
    ("attention_shape_not_prepared", "train/trainer.h",
     "    op_attention_prepare(shapes, a->sample_every > 0 ? 2 : 1, tr->cfg.n_heads, tr->cfg.n_kv_heads, llama_head_dim(&tr->cfg));\n",
     "    op_attention_prepare(shapes, 1, tr->cfg.n_heads, tr->cfg.n_kv_heads, llama_head_dim(&tr->cfg));\n",
     "train_llama", ["-b", "4", "-t", "32", "-x", "0", "-m", "1", "-s", "1", "-g", "2"], {},
     r"error: attention forward \(B 1, T 32, NH \d+, NKV \d+, HS \d+\): not among the shapes cudnn_att_prepare built at start-up"),
]


def faulty_copy(root, faults):
    """A copy of the working tree under `root` with every (name, path, old, new, ...) of `faults` planted
    behind its switch, with this tree's objects (the runtime, the library doubles, the CPU reference);
    returns it and make's arguments to build a target there without rebuilding those objects."""
    copy = root / "src"
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, capture_output=True, text=True,
                           check=True).stdout.split()
    for f in files:
        if (REPO / f).is_file():
            (copy / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / f, copy / f)
    for name, path, old, new, *_ in faults:
        (copy / path).write_text(plant_switched((copy / path).read_text(), name, old, new))
    (copy / "build/emu").mkdir(parents=True)
    (copy / "build/.setup-done").touch()
    planted = {f[1] for f in faults}
    kept = [REPO / "build/cpu_reference.o"] + sorted(EMU.glob("*.o")) + [REPO / "build/cudnn_att.o"] * ("cuda/cudnn_att.cpp" not in planted)
    kept = [obj for obj in kept if obj.exists()]
    for obj in kept:
        shutil.copy2(obj, copy / obj.relative_to(REPO))
    return copy, [a for obj in kept for a in ("-o", str(obj.relative_to(REPO)))]


# Faults caught only with the production build's optimization (make emu's -O1): g++ places a template
# kernel's static __shared__ array right before its marker (the runtime poisons the marker) at -O1, not
# at -O0. The binary that holds one builds as make emu does; the others at -O0, half the compile time.
BUILT_AS_MAKE_EMU = {"static_shared_overflow"}


def planted_builds(request, tmp_path_factory):
    """(("build", targets), job) for the binaries the selected planted faults run, all from one copy that
    holds every one of them: the binary holding a BUILT_AS_MAKE_EMU fault at make emu's optimization, the
    others at -O0; each job returns {target: its binary, or make's output when it did not build}."""
    selected = {item.callspec.params["name"] for item in request.session.items
                if item.originalname in ("test_planted_fault_is_caught", "test_trainer_fault_is_caught")}
    faults = [f for f in FAULTS + TRAINER_FAULTS if f[0] in selected]
    if not faults:
        return []
    copy, keep = faulty_copy(tmp_path_factory.mktemp("planted"), faults)

    def build(targets, extra):
        r = subprocess.run(["make", "-C", str(copy), *keep, *extra, *(f"build/emu/{t}" for t in targets)],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        return {t: copy / "build/emu" / t if r.returncode == 0 else r.stdout[-3000:] for t in targets}

    as_make_emu = tuple(sorted({f[4] for f in faults if f[0] in BUILT_AS_MAKE_EMU}))
    at_o0 = tuple(sorted({f[4] for f in faults} - set(as_make_emu)))
    return [(("build", targets), functools.partial(build, targets, extra))
            for targets, extra in ((as_make_emu, []), (at_o0, ["EMU_O=-O0"])) if targets]


@pytest.fixture(scope="module")
def faulty_builds(check_runs):
    """{target: future of {target: its binary from the planted faults' copy, or make's output}}."""
    return {t: future for key, future in check_runs.items() if key[0] == "build" for t in key[1]}


def assert_fault_caught(faulty_builds, name, target, args, env, caught):
    # the unmodified source passes the same command
    clean = run([EMU / target, *args], env=emu_env(**env), timeout=600)
    assert clean.returncode == 0 and not re.search(caught, clean.stdout + clean.stderr), clean.stdout[-3000:] + clean.stderr[-3000:]
    if name == "attention_shape_not_prepared" and "attention: cuDNN SDPA" not in clean.stdout:
        pytest.skip("the emulated build has no cuDNN (make USE_CUDNN=0 emu): the fallback attention builds no graphs")
    exe = faulty_builds[target].result()[target]
    assert not isinstance(exe, str), f"{name}: the faulty copy's {target} did not build:\n{exe}"
    r = run([exe, *args], env=emu_env(LLM8_PLANTED_FAULT=name, **env), timeout=600)
    out = r.stdout + r.stderr
    assert r.returncode != 0, f"{name}: the faulty source passed:\n{out[-4000:]}"
    assert re.search(caught, out), f"{name}: not caught by the expected check:\n{out[-4000:]}"


# ---------------------------------------------------------------- the GPU trainer on the emulated GPU

STEP = re.compile(r"^step +(\d+)/\d+ \| loss ([0-9.naif]+)", re.M)
# Tolerance on each step's train loss, emulated GPU build vs train_llama_cpu (same seed, same data).
# Both round activations to BF16; they differ in summation order (cuBLASLt double and block reductions
# vs OpenBLAS and sequential loops) and in what cpu/backend.h lists (double-precision RMSNorm and softmax
# sums, glibc's expf, two-pass against online softmax). Such a difference flips the BF16 rounding of a
# few elements by one ulp (2^-8 relative); the loss is a mean over B*T = 256 tokens, so a layer's worth
# of flips moves it by about 2^-8 / sqrt(256) = 2.4e-4, and over the tiny model's few layers and two
# optimizer steps by well under 1e-3. Measured: at most 2.1e-4 over 4 steps; 5.5e-4 at step 2 of the fp8
# 2-rank run with every saving (an FP8 code one BF16 ulp from its neighbour's boundary, FP8 moments and an
# FP16 master round again what differs).
LOSS_TOL = 1e-3
TRAIN_FLAGS = ["-b", "4", "-t", "64", "-x", "2", "-v", "0", "-m", "1", "--shuffle", "0"]


def losses(out):
    found = [(int(s), float(l)) for s, l in STEP.findall(out)]
    assert found, out[-3000:]
    return [l for _, l in found]


def cpu_losses(flags):
    cpu = REPO / "train_llama_cpu"
    if not cpu.exists():
        pytest.skip("train_llama_cpu is not built")
    ref = run([cpu, *flags], timeout=600)
    assert ref.returncode == 0, ref.stdout[-3000:] + ref.stderr[-3000:]
    return losses(ref.stdout)


def assert_close_to_cpu(a, b, precision):
    assert len(a) == len(b) == 2
    for step, (x, y) in enumerate(zip(a, b), 1):
        print(f"{precision} step {step}: cpu {x:.6f} emulated gpu {y:.6f} diff {abs(x - y):.2e}")
        assert abs(x - y) <= LOSS_TOL, f"{precision} step {step}: cpu {x} vs emulated gpu {y}"


# bf16 is the one_rank run below (-r 2: whole blocks recomputed in backward), checked against the CPU by
# test_recompute_bf16_matches_cpu, and -r 0 bf16 is the model check cpu_vs_gpu_bf16: one emulated run
# fewer (CI time). The fp8 -r 2 run takes the delayed recipe (its second step casts with the history's
# scales, replays included); current scaling's -r 2 is the model check recompute_fp8.
@pytest.mark.parametrize("precision, recompute", [("fp8", "0"), ("delayed", "2")])
def test_trainer_matches_cpu(shakespeare, precision, recompute):
    recipe = ["-p", "fp8", "--fp8-recipe", "delayed"] if precision == "delayed" else ["-p", precision]
    flags = TRAIN_FLAGS + [*recipe, "-r", recompute]
    a = cpu_losses(flags)
    emu = run([EMU / "train_llama", *flags], env=trainer_env(), timeout=900)
    assert emu.returncode == 0, emu.stdout[-3000:] + emu.stderr[-3000:]
    assert_close_to_cpu(a, losses(emu.stdout), precision)


def test_evals_match_cpu(eval_files, tmp_path):
    """The downstream evaluations (train/evals.h) through the CUDA trainer: -x 0, one example of each
    set (-b 4 rows of -t 32 a micro-batch), and a sample of 2 tokens (forwards of 1 x 32), against the CPU
    trainer. With cuDNN, every attention graph of the run is built before the first step and none after
    (a shape not prepared would stop the run). The likelihood metrics within
    the two builds' BF16 difference (log-likelihoods of an example summed over its tokens: within 1e-2 nats,
    where the training check allows 1e-3 per token's mean); the accuracies are not compared (a random init's endings can be
    near ties)."""
    flags = ["-b", "4", "-t", "32", "-m", "1", "-x", "0", "--eval-limit", "1", "-s", "1", "-g", "2", *eval_flags(eval_files)]
    found = {}
    for name, exe in (("cpu", REPO / "train_llama_cpu"), ("emu", EMU / "train_llama")):
        r = run([exe, *flags, "-o", tmp_path / name], env=trainer_env(), timeout=900)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        assert "| sample: " in r.stdout, r.stdout[-3000:]
        found[name] = evals_of(tmp_path / name)
    if "attention: cuDNN SDPA" in r.stdout:  # training (B 4) forward and backward, the sample's forward (B 1)
        assert "| attention: 3 cuDNN graph(s) built at start-up" in r.stdout, r.stdout[-3000:]
    assert found["cpu"].keys() == found["emu"].keys() and len(found["cpu"]) == 3
    for key, cpu in found["cpu"].items():
        for metric, value in cpu.items():
            if metric in ("perplexity", "word_perplexity", "byte_perplexity"):
                print(f"{key[1]} {metric}: cpu {value:.6f} emulated gpu {found['emu'][key][metric]:.6f}")
                assert abs(math.log(found["emu"][key][metric]) - math.log(value)) <= 1e-2, (key, metric)


MPIRUN = shutil.which("mpirun")
ONE_RANK_FLAGS = ["-t", "64", "-x", "2", "-v", "0", "-m", "1", "--shuffle", "0", "-p", "bf16", "-d", "256", "-r", "2"]


@pytest.fixture(scope="module")
def one_rank(shakespeare, tmp_path_factory):
    """One emulated rank, -b 4, bf16, -r 2, checkpointing every step: the recompute run checked against
    the CPU trainer, the reference of the ZeRO tests and the uninterrupted run of the resume test.
    Returns its losses and its output folder."""
    out = tmp_path_factory.mktemp("one_rank")
    r = run([EMU / "train_llama", "-b", "4", *ONE_RANK_FLAGS, "-o", out, "-n", "1"], env=trainer_env(), timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return losses(r.stdout), out


def test_recompute_bf16_matches_cpu(one_rank):
    assert_close_to_cpu(cpu_losses(["-b", "4", *ONE_RANK_FLAGS]), one_rank[0], "bf16 -r 2")


def mpi_env(**extra):
    """trainer_env for mpirun, as a user runs it: no sanitizer variables (the binary's own defaults keep
    Open MPI's leftovers at exit out of LeakSanitizer's report, emu/sanitizer_defaults.cpp), so the exit
    status is checked as it is."""
    return {k: v for k, v in trainer_env(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                                         OMPI_MCA_rmaps_base_oversubscribe="1", OMP_NUM_THREADS="1", **extra).items()
            if k not in ("ASAN_OPTIONS", "LSAN_OPTIONS")}


def two_ranks(zero, *extra, exe=EMU / "train_llama"):
    r = run([MPIRUN, "--oversubscribe", "-np", "2", "-x", "LLM8_EMU_FORBID", exe, "-b", "2", "-z", zero, *ONE_RANK_FLAGS, *extra],
            env=mpi_env(), timeout=900)
    assert r.returncode == 0 and "Sanitizer" not in r.stderr, r.stdout[-3000:] + r.stderr[-4000:]
    return losses(r.stdout)


@pytest.mark.skipif(MPIRUN is None, reason="mpirun not found (make setup installs Open MPI)")
@pytest.mark.parametrize("zero", ["1", "2"])
def test_two_ranks_match_one_rank(one_rank, zero):
    """mpirun -np 2 through the NCCL double, ZeRO-1 (gradients all-reduced, optimizer state sharded) and
    ZeRO-2 (gradients reduce-scattered), against one emulated rank with the same global batch: the
    losses bit for bit, as real NCCL's sums of two ranks' gradients would give (each rank runs one
    micro-batch per step, so ZeRO-1 accumulates nothing before its sum), and no ASan report (the
    watchdog's use after free of the destroyed communicator showed here) and no leak report: the run
    exits 0 without any sanitizer variable set."""
    assert two_ranks(zero) == one_rank[0]


@pytest.mark.parametrize("ranks", [1, 2])
@pytest.mark.parametrize("precision, refused", [("fp8", "fp8"), ("bf16", "all")])
def test_no_cublaslt_algorithm_is_a_one_line_error(shakespeare, tmp_path, ranks, precision, refused):
    """fp8/gemm_cublaslt.cuh's exit when cuBLASLt's heuristic finds no algorithm for a GEMM no documented
    rule refuses (the double's LLM8_EMU_CUBLASLT_NO_ALGO, emu/cublaslt.cpp): every rank stops at its
    first GEMM with one line naming the GEMM's shape and types, the run exits non-zero, nothing hangs."""
    if ranks > 1 and MPIRUN is None:
        pytest.skip("mpirun not found")
    env = emu_env(LLM8_EMU_CUBLASLT_NO_ALGO=refused, OMP_NUM_THREADS="1")
    cmd = [EMU / "train_llama", "-e", "tiny", "-b", "2", "-t", "64", "-x", "2", "-p", precision, "-o", tmp_path / "run"]
    if ranks > 1:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_rmaps_base_oversubscribe="1")
        cmd = [MPIRUN, "--oversubscribe", "-np", str(ranks), "-x", "LLM8_EMU_CUBLASLT_NO_ALGO", *cmd]
    r = run(cmd, env=env, timeout=300)
    assert r.returncode != 0, r.stdout[-2000:]
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    operand = "E4M3" if precision == "fp8" else "act"
    assert len(errors) == ranks and all(re.fullmatch(rf"error: cuBLASLt has no algorithm for the GEMM m \d+ n \d+ k \d+, "
                                                     rf"A {operand}\^T, B {operand}, D \w+.*", e) for e in errors), r.stderr[-3000:]
    assert "step    1" not in r.stdout and "Sanitizer" not in r.stderr, r.stderr[-3000:]


def test_error_lines_are_one_write_each(shakespeare, tmp_path):
    """The error line (die, core/common.h) and the cuBLASLt double's log line (emu/cublaslt.cpp) reach stderr
    in one write(2) each, seen by strace: under mpirun the ranks share one stderr, and a line written in
    pieces ("error: ", the message, the newline) was split there by another rank's line."""
    strace = shutil.which("strace")
    if strace is None or run([strace, "-qq", "-o", os.devnull, "true"]).returncode != 0:
        pytest.skip("strace missing or not allowed to trace here (make setup installs it)")
    trace = tmp_path / "trace"
    env = emu_env(LLM8_EMU_CUBLASLT_NO_ALGO="fp8", OMP_NUM_THREADS="1", ASAN_OPTIONS="detect_leaks=0")  # LSan stops under ptrace
    r = run([strace, "-f", "-qq", "-e", "trace=write", "-e", "signal=none", "-s", "4096", "-o", trace,
             EMU / "train_llama", "-e", "tiny", "-b", "2", "-t", "64", "-x", "2", "-p", "fp8", "-o", tmp_path / "run"],
            env=env, timeout=300)
    assert r.returncode != 0, r.stdout[-2000:]
    writes = re.findall(r'write\(2, "((?:[^"\\]|\\.)*)"', trace.read_text())
    lines = [w for w in writes if w.startswith(("error: ", "emu cuBLASLt: "))]
    assert len(lines) == 2 and all(w.endswith("\\n") and w.count("\\n") == 1 for w in lines), writes


@pytest.mark.skipif(MPIRUN is None, reason="mpirun not found (make setup installs Open MPI)")
def test_two_ranks_fp8_wire_matches_cpu(shakespeare):
    """--grad-reduce fp8 under ZeRO-0 through the NCCL double (comm/grad_fp8.cuh's pack kernel, a group of
    ncclSend / ncclRecv, the sum kernel, the FP32 all-gather), with the AdamW moments in fp8 (MS-AMP O2:
    the chunk kernel of cuda/optimizer.cuh), against the CPU build's 2-rank run of the same flags: the
    losses within the two builds' BF16 difference (step 2's loss depends on step 1's reduced gradients
    and update)."""
    cpu = REPO / "train_llama_cpu"
    if not cpu.exists():
        pytest.skip("train_llama_cpu is not built")
    flags = ["--grad-reduce", "fp8", "--optim-state", "fp8"]
    assert_close_to_cpu(two_ranks("0", *flags, exe=cpu), two_ranks("0", *flags), "bf16 2 ranks --grad-reduce fp8 --optim-state fp8")


@pytest.mark.skipif(MPIRUN is None, reason="mpirun not found (make setup installs Open MPI)")
def test_two_ranks_every_saving_matches_cpu(shakespeare):
    """Every saving of MS-AMP's levels on the GPU path, in an fp8 run (-p fp8 -r 2 on 2 ranks: FP8 GEMMs and
    cuDNN's attention through the doubles): ZeRO-1 with two micro-steps per rank into an fp8
    gradient buffer (cuda/optimizer.cuh's requantizing add, then on the last micro-step the stored sum
    added into the FP32 bucket before its reduce-scatter), the fp8 wire, fp8 moments and an fp16 master
    (decoded for AdamW and the weight casts, stored again with new scales), against the CPU
    build's 2-rank run of the same flags (-t 32: half the emulated work): the losses within the two
    builds' BF16 difference."""
    cpu = REPO / "train_llama_cpu"
    if not cpu.exists():
        pytest.skip("train_llama_cpu is not built")
    flags = ["-t", "32", "-d", "256", "-p", "fp8", "--grad-buffer", "fp8", "--grad-reduce", "fp8", "--optim-state", "fp8",
             "--master-weights", "fp16"]
    assert_close_to_cpu(two_ranks("1", *flags, exe=cpu), two_ranks("1", *flags), "fp8 2 ranks ZeRO-1, every saving")


def test_resume_is_bit_exact(one_rank, tmp_path):
    """The emulated trainer resumed (-y 1) from the one-rank run's step-1 checkpoint repeats that run's
    step 2 bit for bit: its loss and the model it saves."""
    full = one_rank[1]
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    for f in full.iterdir():
        if f.is_file() and "00000001" in f.name:
            shutil.copy2(f, resumed / f.name)
    r = run([EMU / "train_llama", "-b", "4", *ONE_RANK_FLAGS, "-o", resumed, "-n", "1", "-y", "1"], env=trainer_env(),
            timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "resumed from" in r.stdout, r.stdout[-3000:]
    assert losses(r.stdout) == one_rank[0][1:]
    assert (full / "model_00000002.bin").read_bytes() == (resumed / "model_00000002.bin").read_bytes()


COUNTS = re.compile(r'^emu counts: pid (\d+): range "([^"]+)": (.*)$', re.M)


@pytest.mark.skipif(MPIRUN is None, reason="mpirun not found (make setup installs Open MPI)")
def test_steps_allocate_nothing(shakespeare, tmp_path):
    """What the other emulated runs leave out, in one run of 2 ranks: ZeRO-0 with the BF16 wire, -r 1, an fp8
    run with the shadow check's BF16 passes, validations, samples and a checkpoint (one step: the loop runs
    step 0's validation and sample, the step, then step 1's, and the final checkpoint). The step loop's
    range counts zero allocations, frees, device synchronizations and kernel loads on each rank
    (STEPS_FORBID would stop the run at the first), and the checkpoint is counted apart, in its own range;
    rank 0's memory report after step 1 is the plan by category, all of it llm8's counted allocations."""
    flags = ["-e", "tiny", "-b", "2", "-t", "32", "-x", "1", "-v", "1", "-m", "1", "-s", "1", "-g", "2", "-z", "0",
             "--grad-reduce", "bf16", "-r", "1", "-p", "fp8", "--shadow-every", "1", "-o", tmp_path / "run", "-n", "1"]
    r = run([MPIRUN, "--oversubscribe", "-np", "2", "-x", "LLM8_EMU_FORBID", "-x", "LLM8_EMU_COUNTS", EMU / "train_llama", *flags],
            env=mpi_env(LLM8_EMU_COUNTS="1"), timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-4000:]
    assert len(losses(r.stdout)) == 1 and "| sample: " in r.stdout and "shadow check: " in r.stdout, r.stdout[-3000:]
    counts = {}
    for pid, name, events in COUNTS.findall(r.stderr):
        counts.setdefault(name, {})[pid] = {k: int(v) for k, v in (e.rsplit(" ", 1) for e in events.split(", "))}
    assert len(counts.get("step loop", {})) == 2 and len(counts.get("checkpoint", {})) == 2, r.stderr[-3000:]
    for pid, events in counts["step loop"].items():
        assert all(events[e] == 0 for e in NO_ALLOCATION.split(",") + ["kernel loads"]), (pid, events)
    # the counts see what they count: start-up allocates, and loads kernels in the warm-up
    for pid, events in counts["(no range)"].items():
        assert events["cudaMalloc"] > 0 and events["kernel loads"] > 0, (pid, events)
    # rank 0's memory report after step 1: what the run allocated is the plan by category (the emulated
    # GPU's 256-byte redzones per buffer aside), and every byte in use is llm8's own, counted allocation
    line = next(l for l in r.stdout.splitlines() if l.startswith("memory after step 1: "))
    report = json.loads(line[len("memory after step 1: "):])
    plan, allocated = report["plan"], report["allocated"]
    for category, planned in plan.items():
        if category not in ("estimates", "total"):
            assert planned <= allocated[category] <= planned + (1 << 19), (category, planned, allocated[category])
    assert report["not_llm8"] == 0 and report["in_use"] == allocated["llm8"], report
    assert plan["estimates"] >= 256 << 20 and plan["total"] == plan["llm8"] + plan["estimates"], plan


def test_step_kernel_loads_are_caught(shakespeare):
    """Without the warm-up (--warmup-pass 0) the first kernel of step 1 is a load inside the step loop: the
    rule stops the run there, naming it; with it (test_steps_allocate_nothing, every run above) none is."""
    r = run([EMU / "train_llama", "-e", "tiny", "-b", "2", "-t", "32", "-x", "1", "-v", "0", "-m", "1", "--warmup-pass", "0"],
            env=trainer_env(), timeout=300)
    assert r.returncode != 0 and 'emu: kernel loads inside NVTX range "step loop"' in r.stderr, r.stdout[-2000:] + r.stderr[-3000:]


# How mpirun's ranks see the launcher's node-local rank: Open MPI's own variable as mpirun sets it, only
# torchrun's LOCAL_RANK (Open MPI's removed, its value moved), LOCAL_RANK 0 on every rank (rank 1's is
# wrong), or no variable at all.
GPU_SELECTION = {
    "launcher": ("exec \"$@\"", "| GPU selection: OMPI_COMM_WORLD_LOCAL_RANK=0 before MPI_Init, MPI's node-local rank"),
    "local_rank": ("LOCAL_RANK=$OMPI_COMM_WORLD_LOCAL_RANK; export LOCAL_RANK; unset OMPI_COMM_WORLD_LOCAL_RANK; exec \"$@\"",
                   "| GPU selection: LOCAL_RANK=0 before MPI_Init, MPI's node-local rank"),
    "mismatch": ("unset OMPI_COMM_WORLD_LOCAL_RANK; LOCAL_RANK=0 exec \"$@\"",
                 "error: the launcher's node-local rank is not MPI's (MPI_COMM_TYPE_SHARED) on rank(s) 1: rank 1 has "
                 "LOCAL_RANK=0 where MPI's node-local rank is 1"),
    "none": ("unset OMPI_COMM_WORLD_LOCAL_RANK; exec \"$@\"",
             "| GPU selection: MPI's node-local rank 0 after MPI_Init: no launcher variable"),
}


@pytest.mark.skipif(MPIRUN is None, reason="mpirun not found (make setup installs Open MPI)")
@pytest.mark.parametrize("case", list(GPU_SELECTION))
def test_gpu_selection_before_mpi(case):
    """comm/comm_nccl.cuh selects each rank's GPU from the launcher's node-local rank before MPI_Init and
    checks it against MPI's shared-memory split after (2 ranks of build/emu/test_llama, one cheap check):
    the variable used is named; a variable that disagrees with MPI's split stops every rank, with one line
    from rank 0 naming the rank and nothing hung; with none set the fallback is said."""
    wrapper, expected = GPU_SELECTION[case]
    r = run([MPIRUN, "--oversubscribe", "-np", "2", "sh", "-c", wrapper, "sh", EMU / "test_llama", "--only", "kernel_rope"],
            env=mpi_env(), timeout=120)
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    if case == "mismatch":
        assert r.returncode != 0 and len(errors) == 1 and errors[0].startswith(expected), r.stdout[-2000:] + r.stderr[-3000:]
        assert "passed" not in r.stdout, r.stdout[-2000:]
    else:
        assert r.returncode == 0 and not errors and r.stdout.count("1 passed, 0 failed") == 2, r.stdout[-2000:] + r.stderr[-3000:]
        assert [line for line in r.stdout.splitlines() if line.startswith("| GPU selection")] == [expected] or \
            any(line.startswith(expected) for line in r.stdout.splitlines()), r.stdout[-2000:]


# The planted faults' tests, last: their copy builds in the background meanwhile (check_runs).
@pytest.mark.parametrize("name, path, old, new, target, args, env, caught", FAULTS, ids=[f[0] for f in FAULTS])
def test_planted_fault_is_caught(faulty_builds, name, path, old, new, target, args, env, caught):
    assert_fault_caught(faulty_builds, name, target, args, env, caught)


@pytest.mark.parametrize("name, path, old, new, target, args, env, caught", TRAINER_FAULTS, ids=[f[0] for f in TRAINER_FAULTS])
def test_trainer_fault_is_caught(faulty_builds, shakespeare, name, path, old, new, target, args, env, caught):
    assert_fault_caught(faulty_builds, name, target, args, env, caught)
