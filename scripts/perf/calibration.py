"""Calibration (--calibrate PATH ...): measured rates replace assumed ones. Reads what the device check
writes (files, folders read recursively, and the logs inside .tar.gz archives such as its logs.tar.gz):
`build/tools/bench_gemm` lines (TFLOP/s per GEMM shape and precision), `dev/cuda/bench_kernels` timing
lines (GB/s of each memory-bound op, named as the trainer's op list names them, TFLOP/s of attention and of
its GEMM case), and trainer logs (`step k/N | ... | X ms | Y tok/s`), which are not fitted but predicted at
their own shape and compared. Measured rates are kept as fractions of the measuring GPU's peak (compute) or
HBM bandwidth (memory-bound ops), so that they carry to other GPUs."""
import os
import re
import tarfile
from dataclasses import dataclass, field

from .assumptions import ATTENTION_EFFICIENCY, GEMM_EFFICIENCY, GPUS, HBM_EFFICIENCY, WARMUP_STEPS
from .step import KERNEL_CATEGORY, MODEL_LINE, InputError, Rates, Run, peak_flops, predict

BENCH_GEMM_LINE = re.compile(r"^(\S+)\s+(wqkv|wo|w13|w2)\s+(fprop|dgrad|wgrad)\s+(\d+)\s+(\d+)\s+(\d+)\s*\|"
                             r"\s*([0-9.]+)\s+([0-9.]+)\s*\|\s*([0-9.]+)x?\s*$")
BENCH_GEMM_BLOCK = re.compile(r"^gemm (\S+) block: bf16 ([0-9.]+) ms, fp8 ([0-9.]+) ms, speedup ([0-9.]+)x?\s*$")
KERNEL_SHAPE = re.compile(r"^\[ (\w+) \] .*; B (\d+) T (\d+) C (\d+) NH (\d+) NKV (\d+) F (\d+) V (\d+)")
KERNEL_TIME = re.compile(r"^\s+(.+): ([0-9.]+) us, ([0-9.]+) (TFLOP/s|GB/s)\s*$")
KERNEL_GEMM_NAME = re.compile(r"^gemm (bf16|fp8) (fprop|dgrad|wgrad)\b")
TRAIN_HEADER = re.compile(r"^\| llm8 train_llama \((\w+) build\), precision (\w+)")
TRAIN_FROM = re.compile(r"^\| model from: (\S+)")
TRAIN_BATCH = re.compile(r"^\| micro-batch (\d+) x (\d+), (\d+) rank\(s\), grad accumulation (\d+) -> (\d+) tokens")
TRAIN_STEP = re.compile(r"^step\s+\d+/\d+ \|.*\| ([0-9.]+) ms \| [0-9.]+ tok/s")
DEVICE_NAME = re.compile(r"\bNVIDIA (H100|H800|H200)\b([^,;]*)")
# bench_kernels' timed names that are not the trainer's op names -> the op of the trainer's list they time:
# the E4M3 cast-transpose of an activation is the list's fp8_quantize, the weight cases name their tensor,
# and the FP8 wire's pack (amax and cast of a bucket) is the wire-kernel rate the model assumes beside the
# list (step.collective_time). Other timed names are the list's own (op_ prefix dropped).
KERNEL_OP_NAMES = {"amax x": "amax", "cast_transpose x E4M3": "fp8_quantize", "amax_master w13": "amax_master",
                   "cast_transpose_master w13": "cast_transpose_master", "transpose_fp8 w13": "transpose_fp8",
                   "grad_fp8_pack": "grad_wire fp8"}


@dataclass
class TrainRun:
    path: str
    model: str        # the preset it was built from ('| model from: ...')
    dims: tuple       # (C, L, NH, NKV, F, V)
    precision: str
    B: int
    T: int
    grad_accum: int
    device: str
    step_ms: list  # of every step line


@dataclass
class Calibration:
    device: str = None                               # GPUS key of the GPU that measured
    gemm_exact: dict = field(default_factory=dict)   # (precision, kind, m, n, k) -> fraction of peak
    gemm_kind: dict = field(default_factory=dict)    # (precision, kind) -> mean measured fraction of peak
    attention: dict = field(default_factory=dict)    # direction -> fraction of the BF16 peak
    bandwidth: dict = field(default_factory=dict)    # op name -> fraction of HBM bandwidth
    gemm_lines: list = field(default_factory=list)   # (model, layer, kind, m, n, k, bf16 TF/s, fp8 TF/s)
    gemm_blocks: list = field(default_factory=list)  # (model, bf16 ms, fp8 ms)
    kernel_lines: list = field(default_factory=list)  # (op, shape tuple, us, value, unit)
    train_runs: list = field(default_factory=list)
    files: list = field(default_factory=list)        # (path, what was recognised)


def calibration_files(paths):
    files = []
    for path in paths:
        if os.path.isdir(path):
            for root, dirs, names in os.walk(path):
                dirs.sort()
                files += [os.path.join(root, name) for name in sorted(names)]
        elif os.path.isfile(path):
            files.append(path)
        else:
            raise InputError(f"flag --calibrate: {path}: no such file or directory")
    return files


# Files larger than this under a --calibrate directory are not logs (shards, checkpoints) and are skipped.
CALIBRATION_MAX_FILE_BYTES = 64 << 20


def text_lines(data):
    """The lines of a file's bytes, or None for a binary file (a shard, a checkpoint) beside the logs."""
    return None if b"\0" in data else data.decode("utf-8", errors="replace").splitlines()


def calibration_texts(paths):
    """(name, lines) of every text file under paths, the members of .tar.gz archives included (named
    archive:member); binary and oversized files are skipped."""
    for path in calibration_files(paths):
        try:
            if path.endswith((".tar.gz", ".tgz")):
                with tarfile.open(path) as archive:
                    for member in archive.getmembers():
                        if member.isfile() and member.size <= CALIBRATION_MAX_FILE_BYTES:
                            lines = text_lines(archive.extractfile(member).read())
                            if lines is not None:
                                yield f"{path}:{member.name}", lines
            elif os.path.getsize(path) <= CALIBRATION_MAX_FILE_BYTES:
                with open(path, "rb") as f:
                    lines = text_lines(f.read())
                if lines is not None:
                    yield path, lines
        except (OSError, tarfile.TarError) as e:
            raise InputError(f"flag --calibrate: {path}: {getattr(e, 'strerror', None) or e}")


def parse_train_log(path, lines):
    """A trainer log: its header's precision, model, batch and device, and its step lines; None without steps."""
    steps = []
    header = dims = source = batch = device = None
    for line in lines:
        header = header or TRAIN_HEADER.match(line)
        dims = dims or MODEL_LINE.match(line)
        source = source or TRAIN_FROM.match(line)
        batch = batch or TRAIN_BATCH.match(line)
        if line.startswith("| device:") and device is None:
            device = DEVICE_NAME.search(line)
        m = TRAIN_STEP.match(line)
        if m:
            steps.append(float(m.group(1)))
    if not steps:
        return None
    for found, what in ((header, "'| llm8 train_llama (...) precision ...'"), (dims, "'| model: dim ...'"),
                        (source, "'| model from: ...'"), (batch, "'| micro-batch B x T ...'")):
        if found is None:
            raise InputError(f"flag --calibrate: {path}: step lines without the trainer's header line {what}")
    if header.group(1) != "cuda":
        raise InputError(f"flag --calibrate: {path}: a {header.group(1)} build's log, not a GPU run")
    if int(batch.group(3)) != 1:
        raise InputError(f"flag --calibrate: {path}: a run on {batch.group(3)} ranks; only single-GPU runs are compared")
    if header.group(2) not in ("bf16", "fp8"):
        raise InputError(f"flag --calibrate: {path}: precision {header.group(2)} is not modeled (bf16, fp8)")
    if len(steps) <= WARMUP_STEPS:
        raise InputError(f"flag --calibrate: {path}: {len(steps)} step lines; the comparison leaves out the first "
                         f"{WARMUP_STEPS} (warm-up) and needs at least one more")
    return TrainRun(path, source.group(1), tuple(int(dims.group(i)) for i in range(1, 7)), header.group(2),
                    int(batch.group(1)), int(batch.group(2)), int(batch.group(4)),
                    device_key(device, path) if device else None, steps)


def device_key(match, path):
    variant = match.group(2)
    if "PCIe" in variant or "NVL" in variant:
        raise InputError(f"flag --calibrate: {path}: {match.group(0).strip()} is not in the hardware table "
                         f"({', '.join(g.name for g in GPUS.values())}); pass --measured-on")
    return match.group(1)


def parse_calibration(paths, measured_on):
    """Reads every text file under paths; returns the Calibration, rates as fractions of the measuring
    GPU's peaks. The GPU is --measured-on, else the one the logs name ('| device: NVIDIA ...' of the
    binaries, or nvidia-smi's CSV line)."""
    c = Calibration()
    devices = set()
    for path, lines in calibration_texts(paths):
        counts = {"bench_gemm lines": 0, "bench_kernels timings": 0}
        shape = None
        for line in lines:
            if line.startswith("| device:") or line.startswith("NVIDIA "):
                m = DEVICE_NAME.search(line)
                if m:
                    devices.add(device_key(m, path))
            m = BENCH_GEMM_LINE.match(line)
            if m:
                mm, nn, kk = (int(m.group(i)) for i in (4, 5, 6))
                c.gemm_lines.append((m.group(1), m.group(2), m.group(3), mm, nn, kk, float(m.group(7)) * 1e12,
                                     float(m.group(8)) * 1e12))
                counts["bench_gemm lines"] += 1
                continue
            m = BENCH_GEMM_BLOCK.match(line)
            if m:
                c.gemm_blocks.append((m.group(1), float(m.group(2)), float(m.group(3))))
                counts["bench_gemm lines"] += 1
                continue
            m = KERNEL_SHAPE.match(line)
            if m:
                shape = tuple(int(m.group(i)) for i in range(2, 9))
                continue
            m = KERNEL_TIME.match(line)
            if m and shape is not None:
                name = KERNEL_OP_NAMES.get(m.group(1), m.group(1))
                c.kernel_lines.append((name, shape, float(m.group(2)), float(m.group(3)), m.group(4)))
                counts["bench_kernels timings"] += 1
        found = [f"{n} {what}" for what, n in counts.items() if n]
        run = parse_train_log(path, lines)
        if run is not None:
            c.train_runs.append(run)
            found.append(f"trainer log ({run.precision}, {run.model} L{run.dims[1]}, {len(run.step_ms)} steps)")
        if found:
            c.files.append((path, found))
    if not c.files:
        raise InputError(f"flag --calibrate: nothing recognised in {', '.join(paths)} (expected the output of "
                         f"build/tools/bench_gemm, dev/cuda/bench_kernels or train_llama)")
    if measured_on != "auto":
        c.device = measured_on
    elif len(devices) > 1:
        raise InputError(f"flag --calibrate: logs from several GPUs ({', '.join(sorted(devices))}); calibrate from "
                         f"one, or name the one whose rates to take with --measured-on")
    elif devices:
        c.device = devices.pop()
    if c.device is None and (c.gemm_lines or c.kernel_lines):
        raise InputError("flag --calibrate: no line names the GPU that measured (nvidia-smi's CSV line or the "
                         "binaries' '| device: NVIDIA ...'); pass --measured-on H100|H800|H200")
    for run in c.train_runs:
        run.device = run.device or c.device
        if run.device is None:
            raise InputError(f"flag --calibrate: {run.path}: no '| device:' line names the GPU of this run; "
                             f"pass --measured-on")
    if c.device is not None:
        derive_fractions(c, GPUS[c.device])
    return c


def derive_fractions(c, gpu):
    """Turns measured TFLOP/s and GB/s into fractions of the measuring GPU's peaks. Each bench_gemm shape
    replaces the rate of that exact GEMM (precision, kind, m, n, k); the mean over all measured shapes of a
    (precision, kind) replaces the datasheet fraction of the GEMMs nobody measured (the output layer)."""
    samples = {}
    for model, layer, kind, m, n, k, bf16, fp8 in c.gemm_lines:
        for precision, flops_s in (("bf16", bf16), ("fp8", fp8)):
            frac = flops_s / peak_flops(gpu, precision)
            c.gemm_exact[(precision, kind, m, n, k)] = frac
            samples.setdefault((precision, kind), []).append(frac)
    for op, shape, us, value, unit in c.kernel_lines:
        m = KERNEL_GEMM_NAME.match(op)
        if unit == "TFLOP/s" and m:
            samples.setdefault((m.group(1), m.group(2)), []).append(value * 1e12 / peak_flops(gpu, m.group(1)))
        elif unit == "TFLOP/s" and op in ("attention_forward", "attention_backward"):
            c.attention[op.split("_")[1]] = value * 1e12 / gpu.bf16_flops
        elif unit == "GB/s" and (op in KERNEL_CATEGORY or op.startswith("grad_wire ")):
            c.bandwidth[op] = value * 1e9 / gpu.hbm_bytes_s
    for key, fracs in samples.items():
        c.gemm_kind[key] = sum(fracs) / len(fracs)


def replaced_rates(c):
    """One line per kind of datasheet rate the calibration replaced, with the measured values."""
    out = []
    for (precision, kind), mean in sorted(c.gemm_kind.items()):
        exact = [frac for key, frac in c.gemm_exact.items() if key[:2] == (precision, kind)]
        shapes = f"{len(exact)} shapes at {min(exact):.1%}-{max(exact):.1%} of peak, " if exact else ""
        out.append(f"GEMM {precision} {kind}: {shapes}other shapes {mean:.1%} (mean measured; datasheet "
                   f"{GEMM_EFFICIENCY[(precision, kind)]:.0%})")
    for direction, frac in sorted(c.attention.items()):
        out.append(f"attention {direction}: {frac:.1%} of BF16 peak (datasheet {ATTENTION_EFFICIENCY[direction]:.0%})")
    for name, frac in sorted(c.bandwidth.items()):
        out.append(f"{name}: {frac:.1%} of HBM bandwidth (datasheet {HBM_EFFICIENCY:.0%})")
    return out


def measured_vs_predicted(c):
    """What one GPU measured against the model on that GPU: rows of what, the assumed-rate prediction, the
    calibrated prediction, the measurement and its unit. GEMM blocks: the twelve bench_gemm shapes of a
    block summed; trainer runs: the trainer's own step at the run's flags (one GPU, --n-layers as logged)."""
    rows = []
    if c.device is not None:
        sheet, calibrated = Rates(GPUS[c.device]), Rates(GPUS[c.device], c)
        for model, bf16_ms, fp8_ms in c.gemm_blocks:
            lines = [g for g in c.gemm_lines if g[0] == model]
            if len(lines) == 12:
                for precision, measured in (("bf16", bf16_ms), ("fp8", fp8_ms)):
                    def block_ms(rates):
                        return 1e3 * sum(rates.gemm_time((precision, kind), (m, n, k), 2.0 * m * n * k, 0.0)
                                         for _, _, kind, m, n, k, _, _ in lines)
                    rows.append({"what": f"GEMMs of one {model} block, {precision}", "datasheet": block_ms(sheet),
                                 "calibrated": block_ms(calibrated), "measured": measured, "unit": "ms"})
    runs = {}
    for run in c.train_runs:
        r = Run(model=run.model, precision=run.precision, gpu=run.device, nodes=1, gpus_per_node=1, B=run.B, T=run.T,
                tokens=run.B * run.T * run.grad_accum, zero=0, recompute=0, n_layers=run.dims[1])
        timed = run.step_ms[WARMUP_STEPS:]
        row = {"what": f"train {run.model} L{run.dims[1]} {run.precision} -b {run.B} -t {run.T} x{run.grad_accum} on "
                       f"{run.device}, ms/step ({os.path.basename(run.path)})",
               "datasheet": predict(r, Rates(GPUS[run.device]))["step_ms"],
               "measured": sum(timed) / len(timed), "unit": "ms"}
        if c.device is not None:
            row["calibrated"] = predict(r, Rates(GPUS[run.device], c))["step_ms"]
        rows.append(row)
        runs[(run.model, run.dims, run.B, run.T, run.grad_accum, run.device, run.precision)] = row
    for key, fp8 in runs.items():
        bf16 = runs.get(key[:-1] + ("bf16",))
        if key[-1] == "fp8" and bf16 is not None:
            speedup = {k: bf16[k] / fp8[k] for k in ("datasheet", "calibrated", "measured") if k in fp8}
            rows.append({"what": f"train {key[0]} L{key[1][1]} fp8 / bf16 tokens/s on {key[5]}", **speedup, "unit": "x"})
    return rows
