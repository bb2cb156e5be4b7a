#!/usr/bin/env python3
"""The device check (docs/device-check.md): the one command run on a lent GPU machine (one H100/H200, no
network, under 8 minutes), and all the evidence the project gets from it. PHASES is its table, in run order
(the order of value per second, so that when the budget runs out only the least valuable rows say "no time
left"): each row names a phase, the timeout of each of its processes in seconds, and the function that runs
it. docs/device-check.md gives each budget's reason (dev/test/test_device_check_emu.py keeps the two tables equal).
Every process runs under its own timeout, so a crash, a die() or a hang costs only its own row; the table
is printed (and appended to OUT_DIR/summary.txt) row by row, so even a killed run leaves it, and again at
the end. OUT_DIR (default $OUT when set, else build/device_check) receives summary.txt and logs.tar.gz
(every log, each cut to LOG_CAP bytes, re-packed after each phase); bulky files live in a folder under /tmp.
The standard library only: the GPU machine has the system's python3 and none of our packages.

    usage: scripts/device_check.py [--emulated] [OUT_DIR]
    env: LAYERS (4), STEPS (10), JOBS (nproc), BUDGET_S (480), LLM8_DEVICE_CHECK_EMU=1 (as --emulated)

--emulated rehearses the check on the emulated GPU (docs/emulated-gpu.md) after `make emu`, at scaled-down
shapes within LLM8_DEVICE_CHECK_BUDGET_S (95): rows that need the hardware say "emulated: not measured".
Exit status 0 when no row says FAIL, 1 otherwise, 143 when interrupted, 2 on a bad argument.
"""
import collections
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time

# Per-process timeouts, in seconds (docs/device-check.md#budget says where each comes from).
TOOL_S = 60        # a short command: nvidia-smi, --device-info, writing a shard, a loss comparison
BUILD_S = 180      # the build on the device
CHECK_S = 60       # one test_llama check
PROD_CHECK_S = 120  # one production-shape check (CPU references at 7B/13B sizes)
BENCH_S = 60       # the GEMM benchmark
TRAIN_S = 150      # one training run
RESUME_S = 60      # each of the two resume runs
ORACLE_S = 60      # the Hopper accumulation model's oracle (hopper_accum_oracle)
MEMCHECK_S = 90    # all memcheck runs together
KILL_AFTER_S = 10  # a command still running this long after its TERM is killed
LOG_CAP = 1 << 20  # bytes kept of one log in the archive (its head and tail)
ARCHIVE_MAX = 16 << 20  # the largest file the device machine gives back
TOKENS_PER_STEP = 32768  # throughput runs: 8 micro-steps of 4096 tokens
WARMUP_STEPS = 2   # throughput: steps left out of the means (cuBLASLt and cuDNN set-up)
PROFILE_EVERY = 5  # throughput: --profile
PREP = "build/device"  # what `make device-prepare` made (scripts/device_prepare.sh)
NOT_MEASURED = "emulated: not measured"
ROW_FORMAT = "%-46s | %-6s | %s"
USAGE = "usage: scripts/device_check.py [--emulated] [OUT_DIR]"

# the smoke check, run right after the build: cuBLASLt BF16 and FP8 GEMMs and the FP8 casts at a small shape
SMOKE_CHECKS = ["kernel_gemm"]
# the production-shape checks, the most valuable rows after the throughput ones, in this order
PROD_CHECKS = ["prod_fp8_linear_7b", "prod_attention", "prod_attention_deterministic", "prod_fp8_linear_13b"]
# the oracle of the CPU model of Hopper's FP8 accumulation (--fp8-accum hopper): a table row, after resume
ORACLE_CHECKS = ["hopper_accum_oracle"]
# the checks whose GPU work is our own kernels only (no cuBLASLt, no cuDNN): what memcheck runs
MEMCHECK_CHECKS = ["kernel_optimizer", "kernel_encoder", "kernel_rmsnorm", "kernel_rope", "kernel_swiglu", "kernel_classifier",
                   "kernel_fp8_cast", "kernel_fp8_weight", "kernel_grad_fp8"]
# the test_llama checks the rehearsal runs, about a second each (the others: a skip row; dev/test/test_emu.py
# runs them all): every kernel family, and the cheap model-level ones
EMU_CHECKS = ["kernel_gemm", "kernel_optimizer", "kernel_encoder", "kernel_rmsnorm", "kernel_rope", "kernel_swiglu",
              "kernel_classifier", "kernel_fp8_cast", "kernel_fp8_cast_vec", "kernel_fp8_weight", "kernel_attention",
              "kernel_attention_fallback", "kernel_grad_fp8", "fp8_weights", "forward_deferred", "grad_accumulation"]
# an emulated step of `tiny` costs ~2.5 s at any small B x T (AdamW over its 9M parameters and the 32000-wide
# classifier under ASan), so the rehearsal's runs are few steps at 2 x 32 tokens
EMU_TRAIN_ARGS = ["-e", "tiny", "-b", "2", "-t", "32"]
EMU_STEPS = 1  # the rehearsal's memory-plan runs
EMU_REAL_FLAGS = "-e tiny -b 2 -t 32 -x 3 -v 3 -m 1 -l 1e-3 -u 2 --seed 1337"


class Settings:
    """What the command line and the environment chose; filled by configure()."""
    emulated = False
    out_dir = "build/device_check"
    layers, steps, jobs = 4, 10, 1
    budget_s = 480      # the whole check under 8 minutes (docs/design.md#the-test-strategy)
    reserve_s = 20      # kept back for the final table and the log archive
    min_phase_s = 10    # a phase that would get less than this is skipped
    shard_tokens = 2000000  # the random shard of the throughput and resume runs (uint16 tokens: 4 MB)
    test_bin, train_bin = "./test_llama", "./train_llama"
    bench_bin, shard_bin = "build/tools/bench_gemm", "build/tools/write_shard"  # dev/tools/ programs
    train_warmup = []   # the trainer's warm-up before step 1 (docs/performance.md): on, its default
    emu_data = "dev/data/tinyshakespeare"


S = Settings()


class Run:
    """The state of one check: its rows, scratch folder, found tools and test_llama's checks."""
    start = 0
    rows = []
    failed = 0
    work = logs = summary = archive = shard = ""
    child = None        # the running process, stopped by a TERM to the driver
    last_s = 0          # how long the last limited command ran
    finished = False
    make_vars = []
    sanitizer = ""
    cuda_home = "/usr/local/cuda"
    checks = []
    no_run = ""
    check_done = set()
    toks = {}


R = Run()

# ---------------------------------------------------------------- table, time, processes


def say(text=""):
    print(text, flush=True)


def row(name, status, detail):
    """One row (status ok, FAIL, skip, info or bench), printed and saved at once; whitespace squeezed, 150 characters."""
    detail = re.sub(r"[\n\t ]+", " ", detail).rstrip(" ")[:150]
    line = (ROW_FORMAT % (name, status, detail)).rstrip("\n")
    R.rows.append(line)
    if status == "FAIL":
        R.failed += 1
    say(line)
    with open(R.summary, "a") as f:
        f.write(line + "\n")


def header():
    return ROW_FORMAT % ("check", "status", "detail") + "\n" + "-" * 100


def elapsed():
    return int(time.time()) - R.start


def budget(wanted):
    """The seconds a phase may take: WANTED, less when the budget runs short, 0 when too little is left."""
    left = S.budget_s - S.reserve_s - elapsed()
    return 0 if left < S.min_phase_s else min(left, wanted)


def no_time():
    return f"no time left in the {S.budget_s}s budget"


def limited(seconds, log, cmd, env=None):
    """CMD with its output in LOG, stopped after SECONDS (killed KILL_AFTER_S later); its exit status (128 + the
    signal for a killed process: timeout(1) gives 124 for a timed-out one, 137 when it had to kill it)."""
    started = int(time.time())
    with open(log, "w") as out:
        try:
            R.child = subprocess.Popen(["timeout", "-k", str(KILL_AFTER_S), str(seconds)] + [str(c) for c in cmd],
                                       stdout=out, stderr=subprocess.STDOUT, env=env)
            rc = R.child.wait()
        except Interrupted:
            if R.child is not None:
                R.child.wait()
            raise
        except OSError as e:
            out.write(f"{e}\n")
            rc = 127
        finally:
            R.child = None
    R.last_s = int(time.time()) - started
    return 128 - rc if rc < 0 else rc


def quiet(cmd, seconds=TOOL_S):
    """stdout of CMD run under a timeout, stderr dropped; '' when it cannot run."""
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=seconds).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def read(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def lines_of(path):
    return read(path).splitlines()


def grep(pattern, path, first=False):
    """The lines of PATH matching PATTERN (re.search), joined by newlines; the first one only with FIRST."""
    hits = [line for line in lines_of(path) if re.search(pattern, line)]
    return (hits[0] if hits else "") if first else "\n".join(hits)


def why_failed(rc, seconds, log):
    """One line on a failed process: timed out (124; 137 when it had to be killed after its TERM: the trainer
    checkpoints on a TERM), killed by a signal, or its last words."""
    words = [line for line in lines_of(log) if line.strip()]
    last = words[-1] if words else ""
    if rc == 124 or (rc == 137 and R.last_s >= seconds):
        return f"timed out after {seconds}s; last line: {last}"
    if rc > 128:
        return f"killed by signal {rc - 128}: {last}"
    return f"exit {rc}: {last}"


def first_group(log, pattern):
    """Group 1 of the first line of LOG that PATTERN matches (re.match); '' when none does."""
    return next((m[1] for m in map(re.compile(pattern).match, lines_of(log)) if m), "")


def attention_of(log):
    """The attention path a binary runs, from its start-up line "| device: ...; attention: <path>"."""
    return first_group(log, r"\| device: .*; attention: (.*)")


def is_cudnn(path):
    return path.startswith("cuDNN SDPA")


def executable(path):
    return os.path.isfile(path) and os.access(path, os.X_OK)


def pack_logs(cap):
    """logs.tar.gz from every log, each cut to its first and last CAP/2 bytes."""
    half = cap // 2
    for path in sorted(glob.glob(os.path.join(R.logs, "*"))):
        size = os.path.getsize(path) if os.path.isfile(path) else 0
        if size > cap:
            with open(path, "rb") as f:
                head = f.read(half)
                f.seek(size - half)
                tail = f.read()
            with open(path, "wb") as f:
                f.write(head + b"\n[... %d bytes cut by device_check.py ...]\n" % (size - 2 * half) + tail)
    try:
        with tarfile.open(R.archive + ".part", "w:gz") as tar:
            tar.add(R.logs, arcname="logs")
        os.replace(R.archive + ".part", R.archive)
    except OSError:
        pass


def finish():
    if R.finished:
        return
    R.finished = True
    pack_logs(LOG_CAP)
    if os.path.exists(R.archive) and os.path.getsize(R.archive) > ARCHIVE_MAX:
        pack_logs(LOG_CAP // 8)
    say()
    say(f"== device check summary ({elapsed()}s in all; files in {S.out_dir})")
    say(header())
    for line in R.rows:
        say(line)
    say()
    subprocess.run(["ls", "-l", S.out_dir])
    shutil.rmtree(R.work, ignore_errors=True)


class Interrupted(BaseException):
    """A TERM or INT to the driver: past every phase's error handling, to the final table."""


def interrupted(signum, frame):
    # the running process gets the TERM too; it is waited for out of this handler (Popen.wait is not reentrant)
    if R.child is not None:
        R.child.terminate()
    raise Interrupted()

# ---------------------------------------------------------------- environment, prepared files, build


def wheel_dir(kind, name):
    """The folder of PyTorch's nvidia-* wheels (nvidia/<pkg>/lib, nvidia/cu13/lib, ...) holding NAME; '' if none."""
    try:
        import nvidia
    except ImportError:
        return ""
    for root in nvidia.__path__:
        for pattern in ("*", os.path.join("*", "*")):
            hits = sorted(glob.glob(os.path.join(root, pattern, kind, name)))
            if hits:
                return os.path.dirname(hits[0])
    return ""


def have_header(name):
    try:
        return subprocess.run(["gcc", "-E", "-x", "c", "-", f"-I{R.cuda_home}/include"], input=f"#include <{name}>\n",
                              capture_output=True, text=True, timeout=TOOL_S).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def prepend_env(var, *dirs):
    os.environ[var] = ":".join(list(dirs) + ([os.environ[var]] if os.environ.get(var) else []))


def use_lib(name, soname, lib_links):
    """Makes -l<NAME minus lib/.so> link and load: the system's library; else its SONAME alone, the system's or a
    wheel's, through an unversioned link in LIB_LINKS for the linker and its folder on the loader path. Returns
    "system" or SONAME's folder; None when nothing has it."""
    ldconfig = quiet(["ldconfig", "-p"])
    if re.search(rf"\s{re.escape(name)} \(", ldconfig) or os.path.exists(f"{R.cuda_home}/lib64/{name}"):
        return "system"
    where = next((line.split()[-1] for line in ldconfig.splitlines() if line.split()[:1] == [soname]), "")
    if where:
        where = os.path.dirname(where)
    elif os.path.exists(f"{R.cuda_home}/lib64/{soname}"):
        where = f"{R.cuda_home}/lib64"
    else:
        where = wheel_dir("lib", soname)
    if not where:
        return None
    os.makedirs(lib_links, exist_ok=True)
    link = os.path.join(lib_links, name)
    if os.path.lexists(link):
        os.remove(link)
    os.symlink(os.path.join(where, soname), link)
    prepend_env("LIBRARY_PATH", lib_links, where)
    prepend_env("LD_LIBRARY_PATH", where)
    return where


def phase_environment(seconds):
    """nvidia-smi, the CUDA toolkit, cuDNN, nvrtc and NCCL (the system's, else those of PyTorch's nvidia-* wheels),
    MPI, OpenBLAS and compute-sanitizer; on the emulated GPU, that make emu built its binaries."""
    if S.emulated:
        row("GPU (nvidia-smi)", "skip", f"{NOT_MEASURED}: the emulated GPU ({S.test_bin}, {S.train_bin})")
        for b in (S.test_bin, S.train_bin):
            if not executable(b):
                row(f"build {b}", "FAIL", "not built: make emu")
        if executable(S.test_bin) and executable(S.train_bin):
            row("build (emulated: make emu)", "ok", f"{S.test_bin} {S.train_bin}")
        return
    say("== GPU and libraries")
    limited(seconds, f"{R.logs}/nvidia-smi_full.log", ["nvidia-smi"])
    log = f"{R.logs}/nvidia-smi.log"
    rc = limited(seconds, log, ["nvidia-smi", "--query-gpu=name,compute_cap,memory.total,driver_version", "--format=csv,noheader"])
    if rc == 0:
        row("GPU (nvidia-smi)", "info", (lines_of(log) or [""])[0])
    else:
        row("GPU (nvidia-smi)", "FAIL", why_failed(rc, seconds, log))

    R.cuda_home = os.environ.get("CUDA_HOME") or "/usr/local/cuda"
    os.environ["PATH"] = os.environ.get("PATH", "") + f":{R.cuda_home}/bin"
    prepend_env("LD_LIBRARY_PATH", f"{R.cuda_home}/lib64")  # cuBLASLt, nvrtc
    lib_links = os.path.join(os.getcwd(), "build/device_libs")
    shutil.rmtree(lib_links, ignore_errors=True)
    notes = []
    # the cuDNN frontend (>= 1.3x) references NVRTC even when only SDPA runs
    for what, name, soname in (("cuDNN", "libcudnn.so", "libcudnn.so.9"), ("nvrtc", "libnvrtc.so", "libnvrtc.so.13")):
        where = use_lib(name, soname, lib_links)
        if where:
            notes.append(f"{what} {where}")
        else:
            R.make_vars.append("USE_CUDNN=0")
            notes.append(f"{what} missing (USE_CUDNN=0)")
    # NCCL (train_llama links it): the headers and library of the system, else of the nvidia-nccl wheel
    nccl = "NCCL headers system"
    if not have_header("nccl.h"):
        where = wheel_dir("include", "nccl.h")
        if where:
            prepend_env("CPATH", where)
            nccl = f"NCCL headers {where}"
        else:
            nccl = "no nccl.h"
    where = use_lib("libnccl.so", "libnccl.so.2", lib_links)
    notes.append(f"{nccl}, library {where}" if where else f"{nccl}, no libnccl")
    if shutil.which("mpicc"):
        notes.append(f"MPI {shutil.which('mpicc')}")
    else:
        R.make_vars.append("USE_MPI=0")
        notes.append("no mpicc (USE_MPI=0)")
    if not (have_header("cblas.h") and "libopenblas" in quiet(["ldconfig", "-p"])):
        R.make_vars.append("BLAS=none")  # the CPU side of the checks then runs its plain GEMM loop on fewer columns
    candidates = [shutil.which("compute-sanitizer") or "", f"{R.cuda_home}/bin/compute-sanitizer",
                  f"{R.cuda_home}/compute-sanitizer/compute-sanitizer"]
    candidates += sorted(glob.glob("/usr/local/cuda*/bin/compute-sanitizer")) + sorted(glob.glob("/opt/nvidia/*/compute-sanitizer"))
    R.sanitizer = next((c for c in candidates if c and executable(c)), "")
    make = " ".join(R.make_vars) or "(defaults)"
    row("libraries", "info", "".join(f"{n}; " for n in notes) + f"make {make}; compute-sanitizer {R.sanitizer or 'not found'}")


def phase_prepared(seconds):
    """The files `make device-prepare` made on a machine without a GPU, the cuDNN glue object among them."""
    if S.emulated:
        return
    say(f"== prepared files ({PREP})")
    label = f"prepared files ({PREP})"
    if not os.path.isfile(f"{PREP}/MANIFEST"):
        row(label, "FAIL", f"missing: run make device-prepare where the cuDNN frontend is installed, and carry {PREP}")
        return
    checked = quiet(["sha256sum", "-c", f"{PREP}/cudnn_att.sha256"], seconds)
    stale = "".join(line.split(":")[0] + " " for line in checked.splitlines() if "FAILED" in line)
    if stale:
        row(label, "FAIL", f"cudnn_att.o was built from other sources ({stale}): re-run make device-prepare")
    else:
        row(label, "ok", (lines_of(f"{PREP}/MANIFEST") or [""])[0])
    # the GPU build links the carried cuDNN glue when this machine cannot compile it (no frontend headers)
    if not os.path.exists("build/cudnn_att.o"):
        os.makedirs("build", exist_ok=True)
        try:
            shutil.copy(f"{PREP}/cudnn_att.o", "build/cudnn_att.o")
        except OSError:
            pass


def phase_build(seconds):
    """train_llama, test_llama and test_llama_cpu, built on the device with the carried cuDNN glue."""
    if S.emulated:
        return
    say("== build")
    os.makedirs("build", exist_ok=True)
    open("build/.setup-done", "a").close()  # no network here: skip `make setup`, use what is installed
    s = budget(seconds)
    if s == 0:
        row("build", "skip", no_time())
    else:
        t0 = int(time.time())
        log = f"{R.logs}/build.log"
        label = "build train_llama test_llama test_llama_cpu"
        targets = ["train_llama", "test_llama", "test_llama_cpu", S.bench_bin, S.shard_bin]
        rc = limited(s, log, ["make", "-k", f"-j{S.jobs}"] + R.make_vars + targets)
        if rc == 0:
            row(label, "ok", f"{int(time.time()) - t0}s")
        else:
            missing = "".join(f"{b} " for b in targets if not executable(b))
            first = grep(r"(error|fatal error):|undefined reference|cannot find -l|\*\*\*", log, first=True)
            row(label, "FAIL", f"not built: {missing or 'none'}; {first or why_failed(rc, s, log)}")
    pack_logs(LOG_CAP)


def phase_device_info(seconds):
    """test_llama --device-info: GPU, CUDA / cuBLASLt / cuDNN versions and the attention path (must be cuDNN SDPA:
    the fallback kernels would make every number below measure the wrong thing); then test_llama --list."""
    say("== test_llama --device-info")
    attention = ""
    if not executable(S.test_bin):
        row("device and library versions", "FAIL", "test_llama not built")
    else:
        log = f"{R.logs}/device_info.log"
        rc = limited(seconds, log, [S.test_bin, "--device-info"])
        info = first_group(log, r"\| device: (.*)")
        attention = attention_of(log)
        if rc == 0 and info:
            row("device and library versions", "info", info.split("; attention: ")[0])
        else:
            row("device and library versions", "FAIL", why_failed(rc, seconds, log))
    if S.emulated:
        row("attention path", "skip", f"{NOT_MEASURED}: {attention or 'unknown'} (through the cuDNN double, not cuDNN)")
    elif is_cudnn(attention):
        row("attention path", "ok", attention)
    else:
        row("attention path", "FAIL", f"{attention or 'unknown'} (the GPU path must be cuDNN SDPA; carry build/device with cudnn_att.o)")

    if executable(S.test_bin):
        R.checks = [c for c in quiet([S.test_bin, "--list"], seconds).splitlines() if c]
    if not R.checks:
        # names from the source, so that the table still has one row per check
        R.checks = re.findall(r'(?m)^ *\{"([a-z0-9_]*)", check_[a-z0-9_]*, ".*$', read("test_llama.cu"))
        R.no_run = "test_llama --list failed" if executable(S.test_bin) else "test_llama not built (see the build row)"

# ---------------------------------------------------------------- test_llama checks, one process each


def awk_num(text):
    """The number at the start of TEXT, as awk reads a string (0 when none)."""
    m = re.match(r"\s*[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?", text or "")
    return float(m[0]) if m else 0.0


def check_detail(log):
    """Its first failures, else its "table:" line, else its worst norm comparison (rel L2 over its tolerance),
    else its first measured error."""
    lines = lines_of(log)
    fails = [re.sub(r"^ *FAIL: ", "", line) for line in lines if re.match(r" *FAIL: ", line)][:2]
    if fails:
        return ";".join(fails)
    table = next((line for line in lines if line.startswith("table: ")), None)
    if table is not None:
        return table[len("table: "):]
    worst, what, first = 0.0, "", ""
    for line in lines:
        m = re.search(r"rel L2 ([0-9.e+-]+), tol rel L2 ([0-9.e+-]+)", line)
        if m:
            tol = awk_num(m[2])
            ratio = awk_num(m[1]) / tol if tol else float("inf")
            if ratio >= worst:
                worst, what = ratio, line
        if not first and re.search(r"logits:|gradients:|max abs err|relative L2|bit-identical|uninterrupted", line):
            first = line
    if what:
        return "worst rel L2 = %.2f x tol (%s)" % (worst, what.lstrip(" ").split(":")[0])
    return first.lstrip(" ")


def run_check(name, seconds):
    """test_llama --only NAME in its own process under its own timeout, one row."""
    label = f"test_llama {name}"
    R.check_done.add(name)
    if R.no_run:
        return row(label, "FAIL", R.no_run)
    if S.emulated and name.startswith("prod_"):
        return row(label, "skip", f"{NOT_MEASURED}: production shapes are out of a CPU's reach (dev/test/test_emu.py runs attention's at T 512)")
    if S.emulated and name == "hopper_accum_oracle":
        return row(label, "skip", f"{NOT_MEASURED}: the oracle compares the hardware's FP8 accumulation, not the cuBLASLt double's")
    if S.emulated and name not in EMU_CHECKS:
        return row(label, "skip", "emulated: not in the rehearsal's EMU_CHECKS (dev/test/test_emu.py runs it)")
    s = budget(seconds)
    if s == 0:
        return row(label, "skip", no_time())
    log = f"{R.logs}/test_llama_{name}.log"
    t0 = int(time.time())
    rc = limited(s, log, [S.test_bin, "--only", name])
    detail = check_detail(log)
    detail = f"{int(time.time()) - t0}s" + (f"; {detail}" if detail else "")
    lines = lines_of(log)
    if rc == 0 and f"ok   {name}" in lines:
        row(label, "ok", detail)
    elif f"FAIL {name}" in lines:
        row(label, "FAIL", detail)
    else:
        row(label, "FAIL", why_failed(rc, s, log))


def run_checks(title, names, seconds):
    """Those checks, in that order, that have no row yet (a name test_llama does not list gets a FAIL row: this
    driver and test_llama.cu disagree)."""
    say(f"== test_llama checks: {title}")
    for name in names:
        if name in R.check_done:
            continue
        if name in R.checks:
            run_check(name, seconds)
        else:
            R.check_done.add(name)
            row(f"test_llama {name}", "FAIL", "not a check of test_llama --list (update scripts/device_check.py)")
    pack_logs(LOG_CAP)


def remaining_checks(kind):
    """The listed checks without a row yet, kernel_* ones or all others but the ORACLE_CHECKS, in --list order."""
    return [n for n in R.checks if n not in R.check_done and n not in ORACLE_CHECKS and n.startswith("kernel_") == (kind == "kernels")]


def phase_smoke(seconds):
    run_checks("smoke", SMOKE_CHECKS, seconds)


def phase_production(seconds):
    run_checks("production shapes", PROD_CHECKS, seconds)


def phase_model_checks(seconds):
    run_checks("model, resume, ZeRO and NCCL on one rank", remaining_checks("model"), seconds)


def phase_kernels_emulated(seconds):
    """The rehearsal runs the kernel rows before the training runs: a second each there, the runs far more."""
    if S.emulated:
        run_checks("kernel families at a small shape", remaining_checks("kernels"), seconds)


def phase_oracle(seconds):
    run_checks("the Hopper accumulation model's oracle", ORACLE_CHECKS, seconds)


def phase_kernels(seconds):
    run_checks("kernel families at a small shape", remaining_checks("kernels"), seconds)


def phase_shard(seconds):
    """The random shard of the throughput, shadow and resume runs."""
    if executable(S.shard_bin):
        limited(seconds, f"{R.logs}/random_shard.log", [S.shard_bin, R.shard, S.shard_tokens, 1])

# ---------------------------------------------------------------- GEMM benchmark


def phase_gemm_bench(seconds):
    """FP8 vs BF16 GEMM TFLOP/s at the 7B and 13B shapes, one row per model."""
    say("== GEMM FP8 vs BF16")
    s = budget(seconds)
    log = f"{R.logs}/gemm.log"
    if S.emulated:
        row("GEMM benchmark", "skip", f"{NOT_MEASURED} (speed)")
    elif not executable(S.bench_bin):
        row("GEMM benchmark", "FAIL", f"{S.bench_bin} not built")
    elif s == 0:
        row("GEMM benchmark", "skip", no_time())
    else:
        rc = limited(s, log, [S.bench_bin])
        results = [line for line in lines_of(log) if line.startswith("gemm ")]
        for line in results:
            name, _, detail = line.partition(":")
            row(name, "bench", detail.lstrip(" "))
        if not results:
            row("GEMM benchmark", "FAIL", why_failed(rc, s, log))
    pack_logs(LOG_CAP)

# ---------------------------------------------------------------- throughput and the memory plan


def precision_flags(p):
    """The trainer flags of a throughput run: bf16, fp8 (current scaling) or fp8-delayed."""
    return ["-p", "fp8", "--fp8-recipe", "delayed"] if p == "fp8-delayed" else ["-p", p]


def precision_label(p):
    """Its name in the rows (the table's first column holds 46 characters)."""
    return "fp8 delayed" if p == "fp8-delayed" else f"-p {p}"


def memory_report_of(log):
    """The trainer's "memory after step 1: {...}" line of LOG (train/memory_plan.h memory_report) as
    {key: "MiB with 2 decimals"}: plan.<category>, allocated.<category>, plan.llm8, plan.estimates, allocated.llm8,
    not_llm8, in_use; {} when the run printed none."""
    line = grep(r"^memory after step 1: ", log, first=True)
    try:
        report = json.loads(line[len("memory after step 1: "):]) if line else {}
    except ValueError:
        return {}
    mib = {}
    for key in ("plan", "allocated"):
        for name, value in report.get(key, {}).items():
            mib[f"{key}.{name.replace(' ', '_')}"] = "%.2f" % (value / 1048576)
    for key in ("not_llm8", "in_use"):
        if key in report:
            mib[key] = "%.2f" % (report[key] / 1048576)
    return mib


def memory_report_rows(log, label, per_category):
    """Rows of a run's memory report under LABEL: with PER_CATEGORY one row per category of the plan (plan against
    the run's tables, workspaces against llm8's allocator total less them), then llm8's allocations against the
    plan without its estimates, and the memory that is not llm8's (context, libraries) against the plan's
    estimates. On the GPU these are measurements (bench); on the emulated GPU the plan must match what was
    allocated (redzones aside) and nothing may be allocated outside llm8's counted allocations, while the
    context and libraries are not modelled."""
    report = memory_report_of(log)
    if not report:
        return row(f"{label} memory after step 1", "FAIL", f"no memory report in {os.path.basename(log)} (the run failed or printed none)")
    get = lambda key: report.get(key, "")  # noqa: E731
    if per_category:
        for key in report:
            if not key.startswith("plan.") or key[5:] in ("llm8", "estimates", "total"):
                continue
            c = key[5:]
            p, a = get(f"plan.{c}"), get(f"allocated.{c}")
            name = f"  {label} {c.replace('_', ' ')}"
            if S.emulated:
                # the emulated GPU's redzones (256 bytes per table buffer) and the trainer's few bytes outside the plan
                ok = awk_num(p) - 0.005 <= awk_num(a) <= awk_num(p) + 0.5
                row(name, "ok" if ok else "FAIL", f"plan {p} MiB, allocated {a} MiB")
            else:
                row(name, "bench", f"plan {p} MiB, allocated {a} MiB")
    pl, al, est, nl, use = get("plan.llm8"), get("allocated.llm8"), get("plan.estimates"), get("not_llm8"), get("in_use")
    if S.emulated:
        ok = awk_num(pl) - 0.005 <= awk_num(al) <= awk_num(pl) * 1.01 + 0.5
        row(f"  {label} llm8's allocations", "ok" if ok else "FAIL", f"plan {pl} MiB without its estimates, llm8's allocator total {al} MiB")
        row(f"  {label} not llm8's (context, libraries)", "ok" if nl and awk_num(nl) == 0 else "FAIL",
            f"cudaMemGetInfo in use {use} MiB less llm8's: {nl} MiB (every allocation counted); planned ~{est} MiB: {NOT_MEASURED}")
    else:
        row(f"  {label} llm8's allocations", "bench", f"plan {pl} MiB without its estimates, llm8's allocator total {al} MiB")
        row(f"  {label} not llm8's (context, libraries)", "bench",
            f"plan ~{est} MiB (estimates), measured {nl} MiB (cudaMemGetInfo in use {use} MiB less llm8's)")


def plan_value(log, key, digits):
    """The number KEY holds in the "plan: {...}" line of a --dry-run log; '' when none."""
    return first_group(log, rf'plan: .*"{key}": ({digits}*)')


def mem_in_use(run_dir):
    """The largest "mem_mib" (device memory in use, MiB) of a run's metrics.jsonl, as written; '' when none."""
    values = [m[1] for m in re.finditer(r'"mem_mib": ([0-9.]+)', read(f"{run_dir}/metrics.jsonl"))]
    return max(values, key=awk_num) if values else ""


def throughput_stats(log):
    """(tok/s, MFU %, first, last, skipped) of the steps after warm-up, skipped steps left out ("step k skipped:
    ..." precedes step k's line); None when no step counts."""
    skipped, total_t, total_m, n, last, t, m = set(), 0.0, 0.0, 0, 0, "", 0.0
    for line in lines_of(log):
        f = line.split()
        if len(f) >= 3 and f[0] == "step" and f[2] == "skipped:":
            skipped.add(f[1])
        if f and f[0] == "step" and " tok/s" in line:
            k = int(awk_num(f[1].split("/")[0]))
            for i, word in enumerate(f):
                if word == "tok/s" and i > 0:
                    t = f[i - 1]
                if word == "MFU" and i + 1 < len(f):
                    m = awk_num(f[i + 1])
            if k > WARMUP_STEPS and str(k) not in skipped:
                total_t, total_m, n = total_t + awk_num(t), total_m + m, n + 1
            last = k
    if not n:
        return None
    return "%.0f" % (total_t / n), "%.1f" % (total_m / n), WARMUP_STEPS + 1, last, len(skipped)


def training_budget(label, seconds):
    """budget(SECONDS) for a run on the random shard; 0 after a FAIL (no trainer or shard) or skip (no time) row."""
    if not executable(S.train_bin) or not os.path.isfile(R.shard):
        row(label, "FAIL", "train_llama or the random shard is missing")
        return 0
    s = budget(seconds)
    if s == 0:
        row(label, "skip", no_time())
    return s


def phase_throughput(seconds):
    """Tokens/s and MFU of the 7B-shaped model in bf16, fp8 and fp8 with delayed scaling, its memory against
    the plan; on the emulated GPU the memory plan only."""
    if S.emulated:
        return phase_throughput_emulated(seconds)
    say(f"== throughput: llama2-7b shape, {S.layers} layers, T 4096, {TOKENS_PER_STEP} tokens per step, {S.steps} steps")
    for p in ("bf16", "fp8", "fp8-delayed"):
        name = precision_label(p)
        label = f"train 7b-shape L{S.layers} T4096 -d {TOKENS_PER_STEP} {name}"
        log = f"{R.logs}/train_{p}.log"
        s = training_budget(label, seconds)
        if not s:
            continue
        args = ["-e", "llama2-7b", "--n-layers", S.layers, "-b", 1, "-t", 4096, "-d", TOKENS_PER_STEP] + precision_flags(p)
        # -o for metrics.jsonl (mem_mib: device memory in use), -n -1: no checkpoint
        rc = limited(s, log, [S.train_bin] + args + ["-x", S.steps, "-v", 0, "-m", 1, "-u", 2, "--profile", PROFILE_EVERY,
                                                     "-i", R.shard, "-j", R.shard, "-o", f"{R.work}/train_{p}", "-n", -1])
        limited(TOOL_S, f"{R.logs}/plan_{p}.log", [S.train_bin] + args + ["--dry-run", 1])
        planned = plan_value(f"{R.logs}/plan_{p}.log", "total_gib", "[0-9.]")
        used = mem_in_use(f"{R.work}/train_{p}")
        if planned and used:
            row(f"  {name} memory plan", "bench", "plan %s GiB (with estimates), in use %.2f GiB (cudaMemGetInfo)" % (planned, awk_num(used) / 1024))
        else:
            row(f"  {name} memory plan", "FAIL",
                f"plan {planned or f'missing (see plan_{p}.log)'} GiB; in use {used or 'not measured (the run failed: next row)'}")
        memory_report_rows(log, name, p == "fp8")
        for line in lines_of(log):
            m = re.match(r"\| time to the first step: ([0-9.]* s) from main.*warm-up ([0-9.]* s).*the step ([0-9.]* s)$", line)
            if m:
                row(f"  {name} time to the first step", "info", f"{m[1]} (warm-up {m[2]}, step 1 {m[3]}) from main to the end of step 1")
                break
        # cuDNN's attention workspace against the plan's figure (cuda/cudnn_att.cpp prints both at start-up)
        att = first_group(log, r"\| attention backward [^:]*: (workspace [0-9.]* MiB, planned [0-9.]* MiB)")
        if att:
            if grep(r"^\| attention backward .*more than the memory plan counts", log):
                row(f"  {name} attention workspace", "FAIL", f"{att}: the plan undercounts it")
            else:
                row(f"  {name} attention workspace", "bench", att)
        stats = throughput_stats(log)
        path = attention_of(log)
        if rc != 0 or stats is None:
            row(label, "FAIL", why_failed(rc, s, log))
            continue
        toks, mfu, first, last, nskip = stats
        R.toks[p] = toks
        val = ([line for line in lines_of(log) if line.startswith("val loss")] or [""])[-1]
        detail = f"{toks} tok/s, MFU {mfu}% (mean of steps {first}-{last}, {nskip} skipped); {val}"
        if is_cudnn(path):
            row(label, "ok", detail)
        else:
            row(label, "FAIL", f"attention: {path or 'unknown'}, not cuDNN SDPA: {detail}")
        profile = ([line for line in lines_of(log) if line.startswith("profile step")] or [""])[-1]
        if profile:
            row(f"  {name} {profile.split(':')[0]}", "info", profile.split(": ", 1)[-1])
    if "bf16" in R.toks and "fp8" in R.toks:
        row("train fp8 / bf16 tokens/s", "bench", "%.2fx" % (awk_num(R.toks["fp8"]) / awk_num(R.toks["bf16"])))
    # Colossal-AI reports current scaling within 10% of delayed scaling's speed
    if "fp8" in R.toks and "fp8-delayed" in R.toks:
        row("train fp8 delayed / current tokens/s", "bench", "%.3fx" % (awk_num(R.toks["fp8-delayed"]) / awk_num(R.toks["fp8"])))
    pack_logs(LOG_CAP)


def phase_throughput_emulated(seconds):
    """The rehearsal's throughput phase: tokens/s is not measured; the memory plan is, against what the emulated run
    allocated (emu/'s cudaMemGetInfo: what cudaMalloc holds, its redzones included, of LLM8_EMU_MEMORY GiB)."""
    say(f"== throughput (emulated): memory plan of {' '.join(EMU_TRAIN_ARGS)} against the emulated run")
    row(f"train 7b-shape L{S.layers} T4096 tokens/s", "skip", f"{NOT_MEASURED} (speed)")
    for p in ("bf16", "fp8", "fp8-delayed"):
        flags = precision_flags(p)
        label = f"  {precision_label(p)} memory plan ({' '.join(EMU_TRAIN_ARGS)})"
        s = training_budget(label, seconds)
        if not s:
            continue
        log = f"{R.logs}/train_{p}.log"
        rc = limited(s, log, [S.train_bin] + EMU_TRAIN_ARGS + flags + S.train_warmup + ["-x", EMU_STEPS, "-v", 0, "-m", 1,
                                                                                       "-i", R.shard, "-j", R.shard, "-o", f"{R.work}/train_{p}", "-n", -1])
        plan_log = f"{R.logs}/plan_{p}.log"
        limited(TOOL_S, plan_log, [S.train_bin] + EMU_TRAIN_ARGS + flags + ["--dry-run", 1])
        # in bytes: total_gib's 4 decimals would round the plan by up to 0.05 MiB
        planned = plan_value(plan_log, "total_bytes", "[0-9]")
        # the plan's estimate of the CUDA context (no allocation of ours, so none on the emulated GPU)
        context = plan_value(plan_log, "cuda_context", "[0-9]")
        used = mem_in_use(f"{R.work}/train_{p}")
        if rc != 0:
            row(label, "FAIL", why_failed(rc, s, log))
        elif not planned or not used or not context:
            row(label, "FAIL", f"plan {planned or f'missing (see plan_{p}.log)'} bytes; in use {used or 'not in metrics.jsonl'} MiB")
        else:
            # what the plan counts beyond the context must cover what the run allocated (mem_mib is rounded to
            # 0.1 MiB), and not overcount it by more than 5%
            u, q = awk_num(used), (awk_num(planned) - awk_num(context)) / 1048576
            r = u / q if q else float("inf")
            row(label, "ok" if u <= q + 0.1 and r >= 0.95 else "FAIL",
                "%.1f MiB planned without the ~%.0f MiB CUDA context, %.1f MiB in use: %.4f (in use / plan, must be in [0.95, 1])"
                % (q, awk_num(context) / 1048576, u, r))
        if rc == 0:
            memory_report_rows(log, precision_label(p), p == "fp8")
    pack_logs(LOG_CAP)

# ---------------------------------------------------------------- the FP8 safety net's shadow check


def shadow_cost(log):
    """The second shadow check (the first pays the set-up) against steps 2 and 4, which run none; '' if missing."""
    try:
        text = read(log)
        steps = {int(m[1]): float(m[2]) for m in re.finditer(r"^step +(\d+)/\d+ \|.*?\| ([\d.]+) ms", text, re.M)}
        checks = re.findall(r"^shadow check: .*rel diff (\S+) \| grad cos (\S+),.*\| ([\d.]+) ms", text, re.M)
        rel, cos, ms = checks[1]
        return f"{float(ms):.0f} ms per check vs {(steps[2] + steps[4]) / 2:.0f} ms per step; rel loss diff {rel}, grad cos {cos}"
    except (IndexError, KeyError, ValueError):
        return ""


def phase_shadow(seconds):
    """The cost of a shadow check with gradients at the throughput shape."""
    say(f"== shadow check cost: llama2-7b shape, {S.layers} layers, T 4096, checks with gradients after steps 1 and 3")
    label = f"shadow check 7b-shape L{S.layers} T4096 --shadow-grad 1"
    log = f"{R.logs}/train_shadow.log"
    if S.emulated:
        row(label, "skip", f"{NOT_MEASURED} (speed)")
    elif s := training_budget(label, seconds):
        # no -o: a checkpoint of this shape takes minutes; the console has what is needed
        rc = limited(s, log, [S.train_bin, "-e", "llama2-7b", "--n-layers", S.layers, "-b", 1, "-t", 4096, "-x", 4, "-v", 0, "-m", 1,
                              "-u", 2, "-i", R.shard, "-j", R.shard, "-p", "fp8", "--shadow-every", 2, "--shadow-grad", 1])
        cost = shadow_cost(log)
        if rc == 0 and cost:
            row(label, "bench", cost)
        else:
            row(label, "FAIL", why_failed(rc, s, log))
    pack_logs(LOG_CAP)

# ---------------------------------------------------------------- real text


def compare(label, a, b, tolerance, tag):
    """scripts/compare_loss.py's verdict on run A against baseline B, one row."""
    log = f"{R.logs}/compare_{tag}.log"
    rc = limited(TOOL_S, log, ["python3", "scripts/compare_loss.py", a, b, "--tolerance", tolerance, "--out", f"{R.logs}/compare_{tag}.png"])
    if rc == 0:
        row(label, "ok", grep(r"^PASS", log))
    elif rc == 1:
        row(label, "FAIL", grep(r"^FAIL", log) or why_failed(rc, TOOL_S, log))
    else:
        row(label, "FAIL", why_failed(rc, TOOL_S, log))


def last_val_loss(log):
    return ([line for line in lines_of(log) if line.startswith("val loss")] or [""])[-1]


def phase_real_text(seconds):
    """`tiny` on tiny-shakespeare in bf16 and fp8, against each other and the carried CPU fp8 curve."""
    say("== real text: tiny-shakespeare, GPU bf16 and fp8 vs the carried CPU fp8 run")
    data, cpu_curve, flags_file, real_ok = f"{PREP}/tinyshakespeare", f"{PREP}/cpu_fp8", f"{PREP}/real_text.flags", True
    if S.emulated:
        # the rehearsal makes its CPU curve itself, at its own scaled-down flags
        data, cpu_curve, flags_file = S.emu_data, f"{R.work}/cpu_fp8", f"{R.work}/real_text.flags"
        log = f"{R.logs}/real_cpu_fp8.log"
        rc = limited(seconds, log, ["./train_llama_cpu"] + EMU_REAL_FLAGS.split() + ["-i", f"{data}/tiny_shakespeare_train.bin",
                                                                                   "-j", f"{data}/tiny_shakespeare_val.bin", "-p", "fp8", "-o", cpu_curve])
        label = "real text: CPU -p fp8 run (train_llama_cpu)"
        if rc == 0:
            row(label, "ok", f"{EMU_REAL_FLAGS}: {last_val_loss(log)}")
        else:
            real_ok = False
            row(label, "FAIL", why_failed(rc, seconds, log))
        with open(flags_file, "w") as f:
            f.write(EMU_REAL_FLAGS + "\n")
    if not os.path.isfile(flags_file) or not os.path.isfile(f"{cpu_curve}/main.log"):
        real_ok = False
        row("real text runs", "FAIL", f"{PREP}/real_text.flags or {PREP}/cpu_fp8 missing: run make device-prepare and carry {PREP}")
    else:
        flags = (lines_of(flags_file) or [""])[0].split()
        for p in ("bf16", "fp8"):
            label = f"real text: GPU -p {p} run"
            log = f"{R.logs}/real_{p}.log"
            s = budget(seconds)
            if not executable(S.train_bin):
                real_ok = False
                row(label, "FAIL", "train_llama not built")
                continue
            if s == 0:
                real_ok = False
                row(label, "skip", no_time())
                continue
            shutil.rmtree(f"{R.work}/real_{p}", ignore_errors=True)
            rc = limited(s, log, [S.train_bin] + flags + S.train_warmup + ["-i", f"{data}/tiny_shakespeare_train.bin",
                                                                          "-j", f"{data}/tiny_shakespeare_val.bin", "-p", p, "-o", f"{R.work}/real_{p}"])
            try:
                shutil.copy(f"{R.work}/real_{p}/main.log", f"{R.logs}/real_{p}_main.log")
            except OSError:
                pass
            if rc == 0:
                row(label, "ok", f"{' '.join(flags)}: {last_val_loss(log)}")
            else:
                real_ok = False
                row(label, "FAIL", why_failed(rc, s, log))
    if real_ok:
        compare("real text: GPU fp8 vs GPU bf16 (1%)", f"{R.work}/real_fp8", f"{R.work}/real_bf16", 0.01, "fp8_vs_bf16")
        compare("real text: GPU fp8 vs CPU fp8 curve (0.5%)", f"{R.work}/real_fp8", cpu_curve, 0.005, "gpu_vs_cpu_fp8")
    else:
        row("real text: comparisons", "FAIL", "a run is missing (rows above)")
    pack_logs(LOG_CAP)

# ---------------------------------------------------------------- resume


def steps_resumed(metrics, at, steps):
    """The "step loss lr" lines of steps at..steps-1 in a metrics.jsonl."""
    out = []
    for line in read(metrics).splitlines():
        if re.match(rf'\{{"step": [{at}-{steps - 1}], "loss":', line):
            f = re.split(r"[:,] *", line)
            out.append(" ".join(f[i] if i < len(f) else "" for i in (1, 3, 5)))
    return out


def phase_resume(seconds):
    """A GPU run resumed from its step-3 checkpoint (the rehearsal: step 1 of 3, at 2 x 32 tokens) against the
    uninterrupted run."""
    at, steps, t, b = (1, 3, 32, 2) if S.emulated else (3, 6, 256, 4)
    ckpt = "%08d" % at
    say(f"== resume: tiny, {steps} steps, checkpoint at step {at}, resumed in a second folder")
    label = f"resume tiny from step {at} (LLM8_DETERMINISTIC=1)"
    full, resumed = f"{R.work}/resume_full", f"{R.work}/resume_resumed"
    os.makedirs(resumed, exist_ok=True)
    args = ["-e", "tiny", "-b", b, "-t", t, "-x", steps, "-n", at, "-v", 0, "-m", 1, "-i", R.shard, "-j", R.shard]
    s = training_budget(label, seconds)
    if s:
        # cuDNN's default attention backward is not bit-reproducible; both runs take the deterministic one
        env = {**os.environ, "LLM8_DETERMINISTIC": "1"}
        rc = limited(s, f"{R.logs}/resume_full.log", [S.train_bin] + args + S.train_warmup + ["-o", full], env)
        if rc == 0:
            for name in (f"model_{ckpt}.bin", f"state_{ckpt}_00000.bin", f"DONE_{ckpt}"):
                try:
                    shutil.copy(f"{full}/{name}", resumed)
                except OSError:
                    pass
            rc = limited(s, f"{R.logs}/resume_resumed.log", [S.train_bin] + args + S.train_warmup + ["-y", 1, "-o", resumed], env)
        a, b = steps_resumed(f"{full}/metrics.jsonl", at, steps), steps_resumed(f"{resumed}/metrics.jsonl", at, steps)
        if rc != 0:
            newest = max(glob.glob(f"{R.logs}/resume_*.log"), key=os.path.getmtime)
            row(label, "FAIL", why_failed(rc, s, newest))
        elif len(a) == steps - at and a == b:
            row(label, "ok", f"loss and lr of steps {at}..{steps - 1} identical: " + " ".join(line.split(" ")[1] for line in a))
        else:
            row(label, "FAIL", f"steps {at}..{steps - 1} (step loss lr) differ: [{' '.join(a)} ] vs [{' '.join(b)} ]")
    pack_logs(LOG_CAP)

# ---------------------------------------------------------------- memcheck


def phase_memcheck(seconds):
    """compute-sanitizer memcheck of the checks that run only our kernels, SECONDS at most in all."""
    say(f"== compute-sanitizer memcheck: {' '.join(MEMCHECK_CHECKS)}")
    end = elapsed() + budget(seconds)
    cannot = ""  # why compute-sanitizer cannot run on this machine, once a run said so
    kernel_filter = []
    if R.sanitizer and "--kernel-name" in quiet([R.sanitizer, "--help"]):
        kernel_filter = ["--kernel-name", "kns=_kernel"]  # ours are all named *_kernel; cuBLASLt's and cuDNN's are not checked
    for name in MEMCHECK_CHECKS:
        label = f"memcheck {name}"
        s = end - elapsed()
        if S.emulated:
            row(label, "skip", f"{NOT_MEASURED} (compute-sanitizer needs a GPU; the emulated build runs under ASan)")
            continue
        if not R.sanitizer:
            row(label, "skip", f"compute-sanitizer not found (PATH, {R.cuda_home}/bin)")
            continue
        if cannot:
            row(label, "skip", f"compute-sanitizer cannot run here: {cannot}")
            continue
        if not executable(S.test_bin):
            row(label, "FAIL", "test_llama not built")
            continue
        if s < S.min_phase_s:
            row(label, "skip", f"no time left (memcheck: {seconds}s at most, within the {S.budget_s}s budget)")
            continue
        log = f"{R.logs}/memcheck_{name}.log"
        rc = limited(s, log, [R.sanitizer, "--tool", "memcheck"] + kernel_filter + [S.test_bin, "--only", name])
        summaries = re.findall(r"ERROR SUMMARY: [0-9]* errors?", read(log))
        summary = summaries[-1] if summaries else ""
        # gVisor: "Device not supported", then the program's first allocation fails
        cannot = next((line for line in lines_of(log) if "not supported" in line.lower()), "")
        if cannot:
            row(label, "skip", f"compute-sanitizer cannot run here: {cannot}")
        elif rc in (124, 137) or not summary:
            row(label, "FAIL", why_failed(rc, s, log))
        elif rc == 0 and summary == "ERROR SUMMARY: 0 errors":
            row(label, "ok", summary + (", " + " ".join(kernel_filter) if kernel_filter else ""))
        else:
            first = grep(r"^=+ +(Invalid|Error|Program hit)", log, first=True)
            row(label, "FAIL", f"{summary}, exit {rc}" + (f": {first}" if first else ""))

# ---------------------------------------------------------------- the phases, by value per second


Phase = collections.namedtuple("Phase", "name budget_s run")
# What matters most runs first, so that the budget cuts only the least valuable rows: the production-shape
# checks and the throughput rows are the evidence no CPU test can give. budget_s: the timeout of each of the
# phase's processes (memcheck: of all of them), cut short when the whole budget runs low.
PHASES = [
    Phase("environment", TOOL_S, phase_environment),
    Phase("prepared files", TOOL_S, phase_prepared),
    Phase("build", BUILD_S, phase_build),
    Phase("device info", TOOL_S, phase_device_info),
    Phase("smoke check", CHECK_S, phase_smoke),
    Phase("production shapes", PROD_CHECK_S, phase_production),
    Phase("random shard", TOOL_S, phase_shard),
    Phase("throughput", TRAIN_S, phase_throughput),
    Phase("GEMM benchmark", BENCH_S, phase_gemm_bench),
    Phase("model checks", CHECK_S, phase_model_checks),
    Phase("kernel families (rehearsal)", CHECK_S, phase_kernels_emulated),
    Phase("real text", TRAIN_S, phase_real_text),
    Phase("resume", RESUME_S, phase_resume),
    Phase("Hopper accumulation oracle", ORACLE_S, phase_oracle),
    Phase("kernel families", CHECK_S, phase_kernels),
    Phase("shadow check cost", TRAIN_S, phase_shadow),
    Phase("memcheck", MEMCHECK_S, phase_memcheck),
]


def run_phases(phases):
    """Each phase in turn; an error of the driver itself in one costs that phase a FAIL row, not the table."""
    for phase in phases:
        try:
            phase.run(phase.budget_s)
        except Exception as e:  # noqa: BLE001 (any bug of a phase: the rows after it still count)
            row(f"phase {phase.name}", "FAIL", f"the driver failed: {type(e).__name__}: {e}")


def env_int(name, default):
    value = os.environ.get(name) or str(default)
    if not re.fullmatch(r"[0-9]+", value):
        print(f"device_check.py: {name}={value!r} is not a whole number", file=sys.stderr)
        sys.exit(2)
    return int(value)


def configure(argv):
    """Settings from ARGV ([--emulated] [OUT_DIR]) and the environment; a one-line error and exit 2 on a bad one."""
    args = list(argv)
    S.emulated = os.environ.get("LLM8_DEVICE_CHECK_EMU", "0") == "1"
    if args and args[0] in ("-h", "--help"):
        print(__doc__)
        sys.exit(0)
    if args and args[0] == "--emulated":
        S.emulated = True
        args.pop(0)
    if len(args) > 1 or (args and args[0].startswith("-")):
        print(f"device_check.py: unexpected argument {args[-1] if len(args) > 1 else args[0]!r} ({USAGE})", file=sys.stderr)
        sys.exit(2)
    S.out_dir = args[0] if args else os.environ.get("OUT") or "build/device_check"
    S.layers, S.steps = env_int("LAYERS", 4), env_int("STEPS", 10)
    S.jobs = env_int("JOBS", len(os.sched_getaffinity(0)))
    S.budget_s = env_int("BUDGET_S", 480)
    if S.emulated:
        # the rehearsal: the emulated binaries, tiny shapes, and the rows it runs (each check takes seconds there)
        S.test_bin, S.train_bin = "build/emu/test_llama", "build/emu/train_llama"
        S.budget_s = env_int("LLM8_DEVICE_CHECK_BUDGET_S", 95)
        S.reserve_s = 5
        S.min_phase_s = 20  # a training run killed by its timeout would be a FAIL row, not a "no time left" one
        S.shard_tokens = 65536
        # the emulated GPU loads nothing lazily and its budget is CPU time: no warm-up (dev/test/test_emu.py checks it)
        S.train_warmup = ["--warmup-pass", "0"]
        S.emu_data = os.environ.get("EMU_DATA") or "dev/data/tinyshakespeare"


def main(argv):
    configure(argv)
    R.start = int(time.time())
    os.makedirs(S.out_dir, exist_ok=True)
    R.work = tempfile.mkdtemp(prefix="llm8_device_check.", dir="/tmp")
    R.logs = f"{R.work}/logs"
    os.makedirs(R.logs)
    R.summary, R.archive = f"{S.out_dir}/summary.txt", f"{S.out_dir}/logs.tar.gz"
    R.shard = f"{R.work}/random_tokens.bin"
    for path in (R.summary, R.archive):
        if os.path.exists(path):
            os.remove(path)
    signal.signal(signal.SIGTERM, interrupted)
    signal.signal(signal.SIGINT, interrupted)
    try:
        say(f"device check: budget {S.budget_s}s, output {S.out_dir}, scratch {R.work}")
        say(header())
        with open(R.summary, "w") as f:
            f.write(header() + "\n")
        run_phases(PHASES)
    except Interrupted:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        row("device check", "FAIL", f"interrupted by a signal after {elapsed()}s")
        return 143
    finally:
        finish()
    return 0 if R.failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
