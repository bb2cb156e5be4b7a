"""One training step as the trainer runs it, timed: the ops come from `./train_llama_cpu --dry-run 2` (its last
line, `ops: {...}`: every GEMM, kernel, collective, host copy and sync of one optimizer step of rank 0, with
shapes, bytes, FLOPs and the order they run in; docs/performance.md#the-steps-ops), the memory from the GPU
build's `./train_llama --dry-run 1 --gpu-mem G` (`plan: {...}`). Each op gets a time from the assumptions
(scripts/perf/assumptions.py); the sequence, with the communication's marks and waits, gives the overlap."""
import json
import re
import subprocess
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path

from . import assumptions as A

REPO = Path(__file__).resolve().parents[2]
CPU_TRAINER = "train_llama_cpu"  # lists the step's ops (--dry-run 2)
GPU_TRAINER = "train_llama"      # plans the GPU's memory (--dry-run 1), without a GPU
CATEGORIES = ("gemm", "attention", "memory", "fp8_cast", "optimizer", "comm", "other")
CATEGORY_TITLES = {"gemm": "GEMM", "attention": "attn", "memory": "mem", "fp8_cast": "cast",
                   "optimizer": "optim", "comm": "comm", "other": "other"}


class InputError(Exception):
    """Bad flags, a missing binary, an op the model has no rate for, or bad calibration input: the message
    names the flag, file or op and is printed as one line."""


@dataclass(frozen=True)
class Run:
    """One configuration: the trainer's flags (model, precision, batch, ZeRO, -r, formats) and where it runs."""
    model: str
    precision: str
    gpu: str                  # key of assumptions.GPUS
    nodes: int
    gpus_per_node: int
    B: int
    T: int
    tokens: int               # per optimizer step, all ranks (the trainer's -d)
    zero: int
    recompute: object = "auto"  # the trainer's -r, or "auto": the plan's cheapest that fits
    grad_reduce: str = "fp32"
    optim_state: str = "fp32"
    grad_buffer: str = "fp32"
    master_weights: str = "fp32"
    fp8_recipe: str = "current"
    n_layers: int = 0         # the trainer's --n-layers (0: the preset's)
    overlap: bool = True
    nics_per_node: int = A.DEFAULT_NICS_PER_NODE
    nic_bytes_s: float = A.DEFAULT_NIC_GBITS * 1e9 / 8

    @property
    def world(self):
        return self.nodes * self.gpus_per_node

    def label(self):
        return f"{self.nodes}x{self.gpus_per_node} {self.gpu}"

    def flags(self, recompute):
        f = ["-e", self.model, "-p", self.precision, "-b", self.B, "-t", self.T, "-d", self.tokens,
             "--ranks", self.world, "-z", self.zero, "-r", recompute, "--grad-reduce", self.grad_reduce,
             "--optim-state", self.optim_state, "--grad-buffer", self.grad_buffer, "--master-weights", self.master_weights]
        if self.fp8_recipe != "current":
            f += ["--fp8-recipe", self.fp8_recipe]
        if self.n_layers:
            f += ["--n-layers", self.n_layers]
        return tuple(map(str, f))


@lru_cache(maxsize=None)
def run_trainer(binary, flags):
    """stdout of `./binary --dry-run ... flags` in the repository root."""
    path = REPO / binary
    if not path.exists():
        raise InputError(f"{path} is not built: run `make {binary}` first")
    r = subprocess.run([str(path), *flags], capture_output=True, text=True, cwd=REPO)
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["(no message)"])[-1]
        raise InputError(f"{binary} {' '.join(flags)}: {last}")
    return r.stdout


def json_line(text, prefix, what):
    for line in reversed(text.splitlines()):
        if line.startswith(prefix):
            return json.loads(line[len(prefix):])
    raise InputError(f"{what}: no '{prefix}...' line in its output")


MODEL_LINE = re.compile(r"^\| model: dim (\d+), layers (\d+), heads (\d+), kv heads (\d+), head dim \d+, ffn (\d+), "
                        r"vocab (\d+)", re.M)


def model_dims(text):
    """(C, L, NH, NKV, F, V) from a trainer's '| model: dim ...' line (dry runs and logs print it)."""
    m = MODEL_LINE.search(text)
    if m is None:
        raise InputError("trainer dry run: no '| model: dim ...' line")
    return tuple(int(m.group(i)) for i in range(1, 7))


def memory_plan(run, recompute):
    """The GPU build's memory plan of the run (its `plan: {...}` JSON) against the GPU's memory."""
    flags = ("--dry-run", "1", "--gpu-mem", f"{A.GPUS[run.gpu].memory_gib:.4f}") + run.flags(recompute)
    return json_line(run_trainer(GPU_TRAINER, flags), "plan: ", GPU_TRAINER)


def resolve_recompute(run):
    """The run's -r: as given, or "auto": the plan's cheapest that fits (the most, 2, when none does)."""
    if run.recompute != "auto":
        return int(run.recompute)
    cheapest = memory_plan(run, 0)["cheapest_recompute"]
    return 2 if cheapest < 0 else cheapest


def step_ops(run, recompute):
    """The trainer's op list of the run (the `ops: {...}` JSON of --dry-run 2) and its model's dims."""
    text = run_trainer(CPU_TRAINER, ("--dry-run", "2") + run.flags(recompute))
    return json_line(text, "ops: ", CPU_TRAINER), model_dims(text)


# --- rates --------------------------------------------------------------------------------------------

# The category each kernel of the trainer's list counts in; every one runs at the HBM rate (its bytes).
# An op missing here has no rate: the model refuses the list until it is added.
KERNEL_CATEGORY = {
    **dict.fromkeys(("encoder_forward", "encoder_backward", "rmsnorm_forward", "residual_rmsnorm_forward",
                     "rmsnorm_backward", "rope_forward", "rope_backward", "swiglu_forward", "swiglu_backward",
                     "classifier", "sum_f32_in_order", "zero", "copy", "store_add", "store_load"), "memory"),
    **dict.fromkeys(("fp8_quantize", "amax", "cast_transpose", "cast_transpose_delayed", "transpose_fp8", "amax_master",
                     "cast_transpose_master", "fp8_reset_amax", "fp8_clear_nonfinite", "fp8_delayed_update"),
                    "fp8_cast"),
    **dict.fromkeys(("adamw", "params_from_master", "sum_squares_chunks"), "optimizer"),
}
ATTENTION_OPS = {"attention_forward": "forward", "attention_backward": "backward"}
RING_COLLECTIVES = {"reduce_scatter": "reduce_scatter", "all_gather": "all_gather", "all_reduce": "all_reduce",
                    "all_reduce_f64": "all_reduce", "all_reduce_max": "all_reduce"}
HOST_COLLECTIVES = ("host_sum", "host_max", "host_broadcast", "host_all_gather", "barrier")
HOST_COPIES = {"download": True, "act_to_float_host": True, "upload": True, "upload_async": False}  # -> syncs
HOST_REDUCTIONS = ("sum_f64",)
SYNC_OPS = ("mark", "wait", "wait_all")


def gemm_key(op):
    """(precision, fprop|dgrad|wgrad) of a GEMM record: FP8 when an operand is E4M3/E5M2; wgrad when it
    accumulates into FP32 gradients, fprop in the forward phase, dgrad otherwise."""
    precision = "fp8" if "E4M3" in op["detail"] or "E5M2" in op["detail"] else "bf16"
    if "+=" in op["detail"]:
        return precision, "wgrad"
    return precision, "fprop" if op["phase"] == "forward" else "dgrad"


def peak_flops(gpu, precision):
    return gpu.fp8_flops if precision == "fp8" else gpu.bf16_flops


class Rates:
    """Seconds of each op of the list on one GPU: the assumed fractions of peak and of HBM bandwidth, or the
    measured ones of a calibration (scripts/perf/calibration.py) where it measured the same op."""

    def __init__(self, gpu, calibration=None, gemm_scale=None):
        self.gpu = gpu
        self.calibration = calibration
        self.gemm_scale = gemm_scale or {}  # precision -> factor on GEMM throughput (a lever)

    def with_gemm_scale(self, precision, factor):
        return Rates(self.gpu, self.calibration, {**self.gemm_scale, precision: factor})

    def gemm_fraction(self, key, shape):
        c = self.calibration
        exact = (*key, *shape[:3])
        if c is not None and exact in c.gemm_exact:
            frac = c.gemm_exact[exact]
        elif c is not None and key in c.gemm_kind:
            frac = c.gemm_kind[key]
        else:
            frac = A.GEMM_EFFICIENCY[key]
        return frac * self.gemm_scale.get(key[0], 1.0)

    def attention_fraction(self, direction):
        c = self.calibration
        return c.attention[direction] if c is not None and direction in c.attention else A.ATTENTION_EFFICIENCY[direction]

    def bandwidth(self, name):
        c = self.calibration
        frac = c.bandwidth[name] if c is not None and name in c.bandwidth else A.HBM_EFFICIENCY
        return frac * self.gpu.hbm_bytes_s

    def gemm_time(self, key, shape, flops, nbytes):
        """A GEMM: the slower of its tensor-core time and its operand traffic (a roofline); a measured shape
        is its measured time, which includes both."""
        compute = flops / (peak_flops(self.gpu, key[0]) * self.gemm_fraction(key, shape))
        exact = self.calibration is not None and (*key, *shape[:3]) in self.calibration.gemm_exact
        return compute if exact else max(compute, nbytes / (A.HBM_EFFICIENCY * self.gpu.hbm_bytes_s))

    def time(self, op):
        """(category, seconds) of one compute-stream op of the list (gemm, kernel, host); InputError for an
        op the model has no rate for."""
        name, kind = op["op"], op["kind"]
        nbytes = op["read"] + op["write"]
        if kind == "gemm":
            return "gemm", self.gemm_time(gemm_key(op), op["shape"], op["flops"], nbytes)
        if kind == "kernel" and name in ATTENTION_OPS:
            return "attention", op["flops"] / (self.gpu.bf16_flops * self.attention_fraction(ATTENTION_OPS[name]))
        if kind == "kernel" and name in KERNEL_CATEGORY:
            return KERNEL_CATEGORY[name], nbytes / self.bandwidth(name)
        if kind == "host" and name in HOST_COPIES:
            return "other", (A.HOST_SYNC_S if HOST_COPIES[name] else 0.0) + nbytes / A.PCIE_BYTES_S
        if kind == "host" and name in HOST_REDUCTIONS:
            return "other", A.HOST_SYNC_S + nbytes / A.HOST_REDUCE_BYTES_S
        raise InputError(f"the trainer's op list has a {kind} op '{name}' the model has no rate for "
                         f"(add it to scripts/perf/step.py)")


# --- collectives -----------------------------------------------------------------------------------

def ring_time(kind, size_bytes, n, bus_bytes_s, latency_s):
    """Seconds of an NCCL ring collective over n ranks of a buffer of size_bytes (the full buffer: the
    all-reduced one, the input of a reduce-scatter, the output of an all-gather). nccl-tests'
    definitions (PERFORMANCE.md): algbw = size / time, busbw = algbw * 2(n-1)/n for all-reduce and
    algbw * (n-1)/n for reduce-scatter and all-gather, busbw being what every link carries, so
    time = size * factor / busbw, plus the call's latency."""
    if n <= 1:
        return 0.0
    factors = {"all_reduce": 2.0 * (n - 1) / n, "reduce_scatter": (n - 1) / n, "all_gather": (n - 1) / n}
    if kind not in factors:
        raise ValueError(f"unknown collective {kind}")
    return latency_s + size_bytes * factors[kind] / bus_bytes_s


def all_to_all_time(size_bytes, nodes, gpus_per_node, nvlink_bytes_s, node_nics_bytes_s, latency_s):
    """Seconds of an NCCL all-to-all in which every rank holds size_bytes in W = nodes x gpus_per_node equal
    pieces and sends each other rank its piece (its own stays): W - 1 point-to-point sends, no ring. With
    PXN (NCCL_P2P_PXN_LEVEL, default since NCCL 2.12) off-node pieces first cross NVLink to the local GPU on
    the destination's rail and leave through its NIC, so node_nics_bytes_s, all NICs of a node together,
    carries gpus_per_node x (W - gpus_per_node) pieces, and NVLink (nvlink_bytes_s per GPU and direction)
    the gpus_per_node - 1 on-node pieces and, per other node, the forwarded ones: nodes x (gpus_per_node - 1)
    pieces. The two run at once; the slower sets the time."""
    W = nodes * gpus_per_node
    if W <= 1:
        return 0.0
    piece = size_bytes / W
    nvlink_s = nodes * (gpus_per_node - 1) * piece / nvlink_bytes_s
    nics_s = gpus_per_node * (W - gpus_per_node) * piece / node_nics_bytes_s if nodes > 1 else 0.0
    return latency_s + max(nvlink_s, nics_s)


def link_rates(run):
    """(NVLink bytes/s per GPU and direction, the node's NICs together in bytes/s), at the assumed efficiencies."""
    return (A.GPUS[run.gpu].nvlink_bytes_s / 2 * A.NVLINK_EFFICIENCY,
            run.nics_per_node * run.nic_bytes_s * A.NIC_EFFICIENCY)


def bus_bandwidth(run):
    """The ring's bus bandwidth: the slower of NVLink per direction and, across nodes, the node's NICs."""
    nvlink, nics = link_rates(run)
    return nvlink if run.nodes == 1 else min(nvlink, nics)


def collective_latency(run):
    return A.COLLECTIVE_LATENCY_S["inter" if run.nodes > 1 else "intra"]


def inter_node_bytes_per_element(run, wire_bytes):
    """Bytes one NIC sends out of its node per gradient element of a bucket with wire_bytes per element. A
    ring (NCCL runs one per NIC) leaves each node once per direction: (W - 1) / W of the buffer on the
    node's NICs together for a reduce-scatter; the FP8 wire's all-to-all sends every off-node piece,
    gpus_per_node x (W - gpus_per_node) / W of the buffer per node."""
    W, g, nics = run.world, run.gpus_per_node, run.nics_per_node
    if run.nodes == 1:
        return 0.0
    if run.grad_reduce == "fp8":
        return wire_bytes * g * (W - g) / W / nics
    return wire_bytes * (W - 1) / W / nics * (2 if run.zero == 0 else 1)


def collective_time(op, run, rates):
    """(link seconds, wire-kernel seconds) of a collective record on the communication stream. Its read is
    the whole buffer in the wire's bytes; shape [elements, ranks, accumulate], the elements a reduce-scatter's
    piece of each rank (its bucket is ranks x that), an all-reduce's whole buffer. A reduce-scatter on the FP8
    wire is the trainer's all-to-all of E4M3 pieces (comm/grad_fp8.h); BF16 and FP8 wires add the GPU
    build's conversion kernels (assumptions.WIRE_KERNEL_BYTES)."""
    name, detail = op["op"], op["detail"]
    if name in HOST_COLLECTIVES:
        return A.HOST_COLLECTIVE_S, 0.0
    if name not in RING_COLLECTIVES:
        raise InputError(f"the trainer's op list has a collective '{name}' the model has no rate for "
                         f"(add it to scripts/perf/step.py)")
    n_ranks, lat = op["shape"][1], collective_latency(run)
    if name == "reduce_scatter" and detail == "fp8":
        link = all_to_all_time(op["read"], run.nodes, run.gpus_per_node, *link_rates(run), lat)
    else:
        link = ring_time(RING_COLLECTIVES[name], op["read"], n_ranks, bus_bandwidth(run), lat)
    kernels = 0.0
    if name in ("reduce_scatter", "all_reduce") and detail in A.WIRE_KERNEL_BYTES:
        per_bucket, per_piece, accumulating = A.WIRE_KERNEL_BYTES[detail]
        piece = op["shape"][0]  # all-reduce: the whole bucket, written whole
        bucket = piece if name == "all_reduce" else piece * n_ranks
        nbytes = per_bucket * bucket + (per_piece + (accumulating if op["shape"][2] else 0.0)) * piece
        kernels = nbytes / rates.bandwidth(f"grad_wire {detail}")
    return link, kernels


# --- the step ----------------------------------------------------------------------------------------

def simulate(ops, sequence, run, rates):
    """Times the step's ops in the trainer's order on two streams. Compute (GEMMs, kernels, host copies)
    runs one op after another with KERNEL_GAP_S between kernels; a collective starts on the communication
    stream when the compute before it is done and the previous collective has finished (NCCL's FIFO); a
    `mark` of slot s notes when the collectives issued so far end, a `wait` of s holds compute until then,
    `wait_all` until every collective ends; host collectives (scalars over MPI) block compute. Without
    overlap (run.overlap false) compute waits for each collective. The step runs twice and the second is
    timed: its forward waits for the weights the first one gathered at its end (the marks carry over), as
    every step but the first does. Returns the seconds per category of one step and its communication's
    totals (link and wire-kernel time, and what of it the compute stream waited for: exposed)."""
    timed = {}  # op index -> (category or "collective", seconds, wire-kernel seconds): each distinct op once
    for i in set(sequence):
        op = ops[i]
        if op["kind"] == "collective":
            timed[i] = ("host" if op["op"] in HOST_COLLECTIVES else "collective", *collective_time(op, run, rates))
        elif op["kind"] != "sync":
            category, seconds = rates.time(op)
            timed[i] = (category, seconds, A.KERNEL_GAP_S if op["kind"] != "host" else 0.0)
        elif op["op"] not in SYNC_OPS:
            raise InputError(f"the trainer's op list has a sync op '{op['op']}' the model has no rule for")
    t_c = t_m = 0.0
    marks = {}
    for _ in range(2):
        totals = dict.fromkeys(CATEGORIES, 0.0)
        start, link_total, kernel_total = t_c, 0.0, 0.0
        for i in sequence:
            op = ops[i]
            if op["kind"] == "sync":
                if op["op"] == "mark":
                    marks[op["shape"][0]] = t_m
                elif op["op"] == "wait":
                    t_c = max(t_c, marks.get(op["shape"][0], 0.0))
                else:
                    t_c = max(t_c, t_m)
                continue
            what, seconds, extra = timed[i]
            if what == "host":  # a host collective blocks compute
                t_c = max(t_c, t_m) + seconds
                totals["other"] += seconds
            elif what == "collective":
                t_m = max(t_m, t_c) + seconds + extra
                link_total += seconds
                kernel_total += extra
                if not run.overlap:
                    t_c = t_m
            else:
                totals[what] += seconds
                totals["other"] += extra
                t_c += seconds + extra
    exposed = max(0.0, (t_c - start) - sum(totals.values()))  # >= 0 but for rounding
    comm = link_total + kernel_total
    hidden_share = 1.0 - min(exposed / comm, 1.0) if comm > 0 else 0.0
    overlap_cost = hidden_share * (link_total * A.COMM_OVERLAP_SLOWDOWN + kernel_total * A.WIRE_KERNEL_OVERLAP_COST)
    totals["comm"] = exposed + overlap_cost
    return totals, {"comm_total_s": comm, "comm_exposed_s": exposed, "wire_kernels_s": kernel_total}


def flops_per_token_llmc(dims, T):
    """llm.c's count (train/trainer.h flops_per_token; PaLM appendix B): 6 N + 12 L C T, N the parameters
    without the embedding."""
    C, L, NH, NKV, F, V = dims
    QKV = C + 2 * NKV * (C // NH)
    n = L * (QKV * C + C * C + 3 * C * F + 2 * C) + C + V * C
    return 6.0 * n + 12.0 * L * C * T


def flops_per_token_megatron(dims, T):
    """Megatron's count (Narayanan et al. 2021, section 5.1), adapted to Llama: per layer and token the forward
    costs 2 h QKV (fused q/k/v, GQA-aware) + 2 h^2 (o) + 6 h F (SwiGLU's three matrices) + 4 s h (QK^T and
    PV, full T x T), plus 2 h V for the logits; backward twice the forward."""
    h, L, NH, NKV, F, V = dims
    QKV = h + 2 * NKV * (h // NH)
    return 6.0 * L * (h * QKV + h * h + 3.0 * h * F + 2.0 * T * h) + 6.0 * h * V


def predict(run, rates):
    """The run's step: the trainer's ops timed and overlapped, its memory plan, tokens/s/GPU and MFU."""
    recompute = resolve_recompute(run)
    listing, dims = step_ops(run, recompute)
    plan = memory_plan(run, recompute)
    totals, comm = simulate(listing["ops"], listing["sequence"], run, rates)
    step_s = sum(totals.values())
    G = listing["grad_accum"]
    tokens = G * run.B * run.T
    tok_s = tokens / step_s
    peak = peak_flops(rates.gpu, run.precision)
    wire = [o for o in listing["ops"] if o["op"] in ("reduce_scatter", "all_reduce") and o["phase"] == "backward"]
    largest = max(wire, key=lambda o: o["shape"][0], default=None)
    wire_bytes = 0.0
    if largest is not None:
        elements = largest["shape"][0] * (largest["shape"][1] if largest["op"] == "reduce_scatter" else 1)
        wire_bytes = largest["read"] / elements
    return {
        "model": run.model + (f" L{run.n_layers}" if run.n_layers else ""), "precision": run.precision,
        "gpus": run.label(), "world": run.world, "micro_batch": run.B, "seq_len": run.T, "grad_accum": G,
        "zero": run.zero, "recompute": recompute,
        "grad_reduce": run.grad_reduce, "optim_state": run.optim_state, "grad_buffer": run.grad_buffer,
        "master_weights": run.master_weights, "fp8_recipe": run.fp8_recipe, "overlap": run.overlap,
        "grad_wire_bytes_per_element": wire_bytes,
        "grad_inter_node_bytes_per_element_per_nic": inter_node_bytes_per_element(run, wire_bytes),
        "memory_gib": plan["total_gib"], "fits": bool(plan["fits"]),
        "ops": sum(o["count"] for o in listing["ops"] if o["kind"] != "sync"),
        "host_syncs": sum(o["count"] for o in listing["ops"] if o["kind"] == "host" and HOST_COPIES.get(o["op"], True)),
        "tokens_per_s_per_gpu": tok_s, "step_ms": 1e3 * step_s, "tokens_per_gpu_step": tokens,
        "mfu_llmc": flops_per_token_llmc(dims, run.T) * tok_s / peak,
        "mfu_megatron": flops_per_token_megatron(dims, run.T) * tok_s / peak,
        "comm_total_ms": 1e3 * comm["comm_total_s"], "comm_exposed_ms": 1e3 * comm["comm_exposed_s"],
        "grad_reduction_kernels_ms": 1e3 * comm["wire_kernels_s"],
        "split_ms": {c: 1e3 * totals[c] for c in CATEGORIES},
    }


def make_run(args, model, precision, gpu, nodes, gpus_per_node, **change):
    """The Run the command line asks for; ZeRO "auto" follows docs/design.md#targets (0 on one GPU)."""
    world = nodes * gpus_per_node
    per_step = world * args.micro_batch * args.seq_len
    if args.global_batch % per_step != 0:
        raise InputError(f"flag --global-batch: {args.global_batch} tokens is not a multiple of "
                         f"GPUs x micro-batch x sequence = {world} x {args.micro_batch} x {args.seq_len}")
    zero = A.ZERO_STAGE_OF.get(model, A.DEFAULT_ZERO_STAGE) if args.zero == "auto" else int(args.zero)
    run = Run(model=model, precision=precision, gpu=gpu, nodes=nodes, gpus_per_node=gpus_per_node,
              B=args.micro_batch, T=args.seq_len, tokens=args.global_batch, zero=0 if world == 1 else zero,
              recompute=args.recompute if args.recompute == "auto" else int(args.recompute),
              grad_reduce=args.grad_reduce, optim_state=args.optim_state, grad_buffer=args.grad_buffer,
              master_weights=args.master_weights, overlap=not args.no_overlap, nics_per_node=args.nics_per_node,
              nic_bytes_s=args.nic_gbits * 1e9 / 8)
    return replace(run, **change)

