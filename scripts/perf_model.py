"""Performance model of one llm8 training step: predicted tokens/s/GPU of Llama-2 7B and 13B, bf16 and fp8,
on one or two nodes of 8 H100 or H800 GPUs, op by op, and where the time goes.

    python3 scripts/perf_model.py                                  # datasheet rates, the default table
    python3 scripts/perf_model.py --calibrate build/device_check   # rates measured by the device check
    python3 scripts/perf_model.py --models llama2-7b --gpus H100 --topologies 1x8 --json

The step is the one model/model.h runs (docs/design.md): per micro-step the embedding, per
layer RMSNorm, the fused q/k/v, o, w1|w3 and w2 linear layers (fprop, dgrad, wgrad GEMMs; in fp8 with
an amax pass and a cast-transpose pass of X and of dY before them), RoPE, causal attention (cuDNN flash
attention), SwiGLU and the residual adds, then the BF16 output layer and classifier and the same
backward; per optimizer step the gradient zeroing, the gradient norm, AdamW on the rank's ZeRO shard,
the BF16 working-weight refresh and the FP8 weight casts; the ZeRO collectives (reduce-scatter of the
gradients, all-gather of the updated weights) over NVLink and InfiniBand with NCCL's ring formulas,
overlapped with backward and forward layer by layer, and the element-wise kernels of a BF16 or FP8
reduction. `--grad-reduce fp8` (after FP8-LM / MS-AMP; the trainer's comm/grad_fp8.h): E4M3
pieces with a scale per 4096-element chunk exchanged by all-to-all (its own formula: no ring, half of each
bucket over InfiniBand on 2 nodes), dequantized and summed in FP32. `--grad-buffer bf16|fp8` stores the
gradients the micro-steps accumulate in BF16 or E4M3 (ZeRO-0 on one GPU, ZeRO-1): FP32 bucket buffers
beside them, and a requantizing add after each bucket's backward; `--master-weights fp16` stores the
master weights in FP16, decoded into FP32 for AdamW and the weight refreshes and stored again. GEMMs and
attention run at a fraction of the tensor-core peak, memory-bound ops at a fraction of the HBM bandwidth;
every such number is a named assumption below, with its source or reasoning. Multi-GPU training is built
and tested on the CPU build but has not run on GPUs (README "Status"), so its rows model the code as
written (docs/design.md#the-distributed-design), not measurements.

Calibration (--calibrate PATH ...: files or directories, read recursively, and the logs inside .tar.gz
archives such as the device check's logs.tar.gz) takes what the device check writes and replaces the datasheet-derived rates with measured ones: `build/tools/bench_gemm` lines
(TFLOP/s per GEMM shape and precision), `dev/cuda/bench_kernels` timing lines (GB/s of each memory-bound
op, TFLOP/s of attention and of its GEMM case), and trainer logs (`step k/N | ... | X ms | Y tok/s`),
which are not fitted but predicted at their own shape and compared. Measured rates are carried to
other GPUs as fractions of the measuring GPU's peak (compute) or HBM bandwidth (memory-bound ops).

Prints a table (plan, predicted tokens/s/GPU, MFU by llm.c's and by Megatron's FLOP count, the step's time
by kind of work; --json for machines), with --calibrate the rates it replaced and predicted against
measured, what it would take for 7B fp8 on 8 H100 to reach 18,000 tokens/s/GPU, and last fp8 training of
13B and 7B on 2 x 8 H800 (and 13B on 1 x 8) with each gradient reduction, fp32, bf16 and fp8: bytes on
the wire and per NIC, the communication stream's time, what of it is exposed, tokens/s/GPU. Activation
recompute is, unless --recompute says otherwise, the least with which the plan fits the GPU's memory by
the model's own memory estimate.

Exit status 0; 2 with a one-line message on stderr for bad flags or unreadable calibration input.
"""
import argparse
import json
import math
import os
import re
import sys
import tarfile
from dataclasses import dataclass, field, replace

PROG = "perf_model.py"

# ------------------------------------------------------------------------------------------------
# Assumptions. Every number the predictions rest on is here, with where it comes from.
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Gpu:
    name: str
    bf16_flops: float    # dense BF16 tensor-core peak, FLOP/s
    fp8_flops: float     # dense FP8 tensor-core peak, FLOP/s
    hbm_bytes_s: float   # HBM bandwidth, bytes/s
    memory_gib: float    # device memory as nvidia-smi reports memory.total, GiB
    nvlink_bytes_s: float  # NVLink bandwidth per GPU, both directions together, bytes/s


MIB_PER_GIB = 1024.0
# NVIDIA datasheets, dense (no sparsity): H100 SXM5 989.4 TFLOP/s BF16, 1978.9 FP8 (the PEAK_SXM_* of
# cuda/backend.cuh), 3.35 TB/s HBM3, NVLink 900 GB/s; the H800 SXM is the H100 with NVLink cut to
# 400 GB/s; the H200 SXM has the H100's compute with 141 GB HBM3e at 4.8 TB/s. Memory: nvidia-smi's
# memory.total, 81559 MiB on the 80 GB parts, 143771 MiB on the H200.
GPUS = {
    "H100": Gpu("H100 SXM", 989.4e12, 1978.9e12, 3.35e12, 81559 / MIB_PER_GIB, 900e9),
    "H800": Gpu("H800 SXM", 989.4e12, 1978.9e12, 3.35e12, 81559 / MIB_PER_GIB, 400e9),
    "H200": Gpu("H200 SXM", 989.4e12, 1978.9e12, 4.8e12, 143771 / MIB_PER_GIB, 900e9),
}

# cuBLASLt GEMM throughput as a fraction of the dense peak at Llama-2 shapes with B*T = 4096 tokens.
# BF16 reaches ~75-85% of peak on H100 SXM at these sizes (sustained clocks sit below the boost clock
# the peak assumes): we take the low end. FP8 rarely exceeds ~65-75% (the same tiles finish twice as
# fast, so prologue, epilogue and wave quantization weigh twice as much). dgrad and wgrad run without
# fast accumulation (partial sums promoted to FP32 every few k-blocks, TE's default for backward),
# taken as ~8% slower than fprop.
GEMM_EFFICIENCY = {
    ("bf16", "fprop"): 0.75, ("bf16", "dgrad"): 0.75, ("bf16", "wgrad"): 0.75,
    ("fp8", "fprop"): 0.65, ("fp8", "dgrad"): 0.60, ("fp8", "wgrad"): 0.60,
}
# cuDNN flash attention (BF16, causal, head dim 128, sequence 4096), as a fraction of the BF16 peak,
# counting causal FLOPs (half the T x T scores) and backward = 2.5 x forward, as bench_kernels does.
# FlashAttention-3 (Shah et al. 2024) reaches 60-75% of the H100's BF16 peak forward at long sequences,
# less with a causal mask at 4k and less backward; cuDNN's SDPA is in the same class. We take 55% / 45%.
ATTENTION_EFFICIENCY = {"forward": 0.55, "backward": 0.45}
ATTENTION_BACKWARD_FLOPS = 2.5  # backward FLOPs per forward FLOP: 5 GEMMs per tile (S, dP, dV, dQ, dK) against 2
# Achievable fraction of the HBM bandwidth for streaming element-wise and reduction kernels: copy-like
# kernels reach ~85-90% of the H100's 3.35 TB/s; kernels that also reduce rows (RMSNorm, amax) less.
HBM_EFFICIENCY = 0.80

# NCCL ring collectives. NVLink's per-direction bandwidth is half the datasheet's bidirectional figure;
# nccl-tests' all-reduce bus bandwidth on 8x H100 SXM rings (without NVLink SHARP) is of the order of
# 360 GB/s of the 450 per direction, i.e. ~0.8.
NVLINK_EFFICIENCY = 0.80
# Inter-node: one NIC per GPU (DGX H100/H800 style, 8x 400 Gb/s ConnectX-7); NCCL rings one per NIC, so
# the inter-node bus bandwidth is the node's NICs together (nics x nic rate x efficiency per direction).
DEFAULT_NICS_PER_NODE = 8
DEFAULT_NIC_GBITS = 400.0
NIC_EFFICIENCY = 0.80
COLLECTIVE_LATENCY_S = {"intra": 20e-6, "inter": 40e-6}  # per NCCL call, large messages (nccl-tests' small sizes)
# While a collective runs beside compute it takes SMs (NCCL's channels, capped) and
# HBM bandwidth from the kernels it overlaps: those kernels are taken to run this fraction slower.
COMM_OVERLAP_SLOWDOWN = 0.08
# The element-wise kernels a gradient reduction runs on the communication stream (the BF16 conversions of
# comm/comm_nccl.cuh; FP8's quantize and dequantize-and-sum) are HBM-bound like the compute stream's own
# memory-bound kernels and take SMs at full grid: beside compute they are taken to delay it by their
# whole duration, not hidden the way a link transfer is.
COMM_KERNEL_OVERLAP_COST = 1.0

# Gradient reductions (--grad-reduce). fp32 and bf16 are the trainer's: NCCL ring reduce-scatter (ZeRO-1/2)
# or all-reduce (ZeRO-0) of FP32 or BF16 gradients. fp8 is the trainer's too (after FP8-LM /
# MS-AMP O1; comm/grad_fp8.h, comm/comm_nccl.cuh): every rank quantizes its bucket piece by piece (piece r:
# the 1/W of the bucket rank r reduces) to E4M3 with one FP32 scale per ZERO_CHUNK-element chunk from that
# chunk's amax, exchanges the pieces by all-to-all (grouped ncclSend/ncclRecv), and each rank dequantizes the
# W pieces of its chunk and sums them in FP32 in rank order; ZeRO-0 then all-gathers the sums in FP32, so
# that every rank's gradients equal the reduce-scatter's bit for bit (ZeRO-0 = ZeRO-1 relies on it).
# Format: E4M3, as MS-AMP quantizes weight gradients for its FP8 all-reduce (msamp/nn/distributed.py,
# Dtypes.kfloat8_e4m3). MS-AMP needs a scale shared by all ranks (amax MAX-all-reduced, times 1/sqrt(W))
# because its NCCL sums the FP8 bytes; here the sum is FP32 after dequantization, so it cannot overflow and
# each chunk can take its own amax scale, with no amax all-reduce. With the top of the range set by the
# chunk's own amax, E4M3 keeps normals down to 2^-14.8 of it (E5M2 2^-29.8) and rounds them to 2^-4
# relative, not E5M2's 2^-3: the format follows MS-AMP, and dev/test/test_grad_reduce_fp8.py checks its
# error bound (the model's bytes are the same for both).
GRAD_REDUCTIONS = ("fp32", "bf16", "fp8")
GRAD_WIRE_BYTES = {"fp32": 4, "bf16": 2, "fp8": 1}   # bytes per gradient element, scales aside
ZERO_CHUNK = 4096            # elements per chunk: the granule of the shard pieces and of every scale (comm/zero.h)
CHUNK_SCALE_BYTES = 4        # one FP32 scale_inv per chunk: the fp8 wire's, a stored array's (llama/optim.h)
ZERO0_FP8_GATHER_BYTES = 4                            # FP32 all-gather of the FP8 reduction's sums (ZeRO-0)
# NCCL's all-to-all is W-1 point-to-point sends, no ring: a rank's piece for a rank on its node crosses
# NVLink once, its piece for a rank on another node crosses InfiniBand once. With PXN (NCCL_P2P_PXN_LEVEL,
# default 2 since NCCL 2.12: always) an off-node piece first crosses NVLink to the local GPU on the
# destination's rail and leaves through that GPU's NIC, so the NICs share the node's off-node bytes evenly
# and NVLink also carries the forwarded pieces. Links run at the ring's efficiencies (NVLINK_EFFICIENCY,
# NIC_EFFICIENCY): an assumption, nothing here is measured.

# Host-side costs. Back-to-back kernels on one stream leave a gap of ~1 us when the host runs ahead;
# each blocking copy (a synchronization) drains the stream and then refills it.
KERNEL_GAP_S = 1.0e-6
HOST_SYNC_S = 20e-6
# Blocking transfers per micro-step in train/trainer.h + model/model.h: inputs and targets uploaded,
# losses downloaded, and in fp8 the FP8 amax check's download of the scales.
SYNCS_PER_MICRO_STEP = {"bf16": 3, "fp8": 4}

# Memory: CUDA context, cuBLASLt/cuDNN workspaces, NCCL buffers and allocator slack beside the model's
# own buffers (a rough figure; it only decides how much recompute the automatic plan needs).
MEMORY_OVERHEAD_GIB = 3.0
# ZeRO-2, and a bf16/fp8 gradient buffer, keep full-size FP32 gradients of the buckets in flight: one being
# reduced while the next accumulates. Counted as two of the largest bucket; model/memory.h has three
# (grad_bucket_*: two for alternating blocks, one for the embedding and the head), 0.5 / 0.6 GiB more at 7B /
# 13B, left out so that the ZeRO-2 rows stay the ones docs/performance.md quotes until they are next refreshed.
ZERO2_GRAD_BUCKETS = 2

# Stored FP32 arrays (llama/optim.h StoreCodec): bytes per element, and the codecs that keep a
# CHUNK_SCALE_BYTES scale_inv per ZERO_CHUNK chunk. --grad-buffer (GradFormat) and --master-weights
# (MasterFormat) name their codecs.
STORE_BYTES = {"fp32": 4, "bf16": 2, "e4m3": 1, "fp16": 2}
STORE_SCALED = ("e4m3", "fp16")
GRAD_BUFFER_CODEC = {"fp32": "fp32", "bf16": "bf16", "fp8": "e4m3"}
MASTER_CODEC = {"fp32": "fp32", "fp16": "fp16"}

# The plans (docs/design.md#targets): 8xH100/H800 at sequence 4096, micro-batch 1; 7B with ZeRO-1, 13B with
# ZeRO-2; the global batch of NVIDIA's published NeMo Llama-2 runs (24.07/24.09 performance summary:
# GBS 128 sequences of 4096 for 7B and 13B).
DEFAULT_SEQ_LEN = 4096
DEFAULT_MICRO_BATCH = 1
DEFAULT_GLOBAL_BATCH_TOKENS = 128 * 4096
ZERO_STAGE_OF = {"llama2-7b": 1, "llama2-13b": 2}
DEFAULT_ZERO_STAGE = 1
# Targets (docs/design.md#targets).
TARGET_7B_FP8 = 18000.0
TARGET_13B_FP8 = 9500.0
TARGET_FP8_SPEEDUP = 1.45
# Steps a trainer log's mean leaves out: cuBLASLt's heuristics and cuDNN's plans are built in the first
# ones (scripts/device_check.sh does the same).
WARMUP_STEPS = 2

BYTES = {"bf16": 2, "fp8": 1, "fp32": 4}
CATEGORIES = ("gemm", "attention", "memory", "fp8_cast", "optimizer", "comm", "other")
CATEGORY_TITLES = {"gemm": "GEMM", "attention": "attn", "memory": "mem", "fp8_cast": "cast",
                   "optimizer": "optim", "comm": "comm", "other": "other"}


class InputError(Exception):
    """Bad flags or calibration input: the message names the flag or file and is printed as one line."""


# ------------------------------------------------------------------------------------------------
# The model's shapes and FLOP counts
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    """A Llama-2 configuration (llama/config.h): dim C, layers L, heads NH, kv heads NKV, ffn F, vocab V."""
    name: str
    C: int
    L: int
    NH: int
    NKV: int
    F: int
    V: int

    @property
    def HS(self):
        return self.C // self.NH

    @property
    def QKV(self):
        return self.C + 2 * self.NKV * self.HS

    def linear_dims(self):
        """(OC, C_in) of the four linear layers of a block, as llama_linear_dims gives them."""
        return {"wqkv": (self.QKV, self.C), "wo": (self.C, self.C), "w13": (2 * self.F, self.C), "w2": (self.C, self.F)}

    def layer_linear_params(self):
        return sum(oc * c for oc, c in self.linear_dims().values())

    def layer_params(self):
        return self.layer_linear_params() + 2 * self.C  # + attn_norm, ffn_norm

    def linear_params(self):
        return self.L * self.layer_linear_params()

    def params(self):
        """param_count of llama/params.h: embedding, L blocks, final norm, output layer."""
        return self.V * self.C + self.L * self.layer_params() + self.C + self.V * self.C


PRESETS = {
    "llama2-7b": Shape("llama2-7b", 4096, 32, 32, 32, 11008, 32000),
    "llama2-13b": Shape("llama2-13b", 5120, 40, 40, 40, 13824, 32000),
    "llama2-70b": Shape("llama2-70b", 8192, 80, 64, 8, 28672, 32000),
}


def flops_per_token_llmc(shape, T):
    """llm.c's count (train/trainer.h flops_per_token; PaLM appendix B): 6 N + 12 L C T, N without the embedding."""
    n = shape.params() - shape.V * shape.C
    return 6.0 * n + 12.0 * shape.L * shape.C * T


def flops_per_token_megatron(shape, T):
    """Megatron's count (Narayanan et al. 2021, section 5.1: 72 B s l h^2 (1 + s/6h + V/12hl) per batch of B
    sequences of s tokens, GPT blocks), adapted to Llama: per layer and token the forward costs
    2 h QKV (fused q/k/v, GQA-aware) + 2 h^2 (o) + 6 h F (SwiGLU's three matrices) + 4 s h (QK^T and PV,
    full T x T as Megatron counts), plus 2 h V for the logits; backward twice the forward:
    6 L (h QKV + h^2 + 3 h F + 2 s h) + 6 h V per token. With QKV = 3h and a 4h two-matrix MLP it is
    Megatron's 72 l h^2 (1 + s/6h + V/12hl)."""
    h = shape.C
    return 6.0 * shape.L * (h * shape.QKV + h * h + 3.0 * h * shape.F + 2.0 * T * h) + 6.0 * h * shape.V


# ------------------------------------------------------------------------------------------------
# Plans: what runs where
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    shape: Shape
    precision: str          # "bf16" or "fp8"
    gpu: str                # key of GPUS
    nodes: int
    gpus_per_node: int
    B: int
    T: int
    grad_accum: int         # micro-steps per optimizer step on each GPU
    zero: int               # 0 all-reduce, 1 sharded optimizer, 2 sharded gradients too
    recompute: str          # "none", "cheap" (norm and SwiGLU outputs, bf16 only), "full"
    recompute_layers: int   # blocks recomputed in full (recompute "full"), the first ones
    grad_reduce: str        # "fp32", "bf16" (ring collectives) or "fp8" (all-to-all: GRAD_REDUCTIONS)
    weight_gather: str      # "bf16" or "e4m3" (fp8 only: linear weights gathered as E4M3)
    overlap: bool           # collectives overlapped with compute, layer by layer
    nics_per_node: int
    nic_bytes_s: float
    fused_amax: bool = False  # amax computed by the producing kernels (a lever, not llm8 today)
    fp8_recipe: str = "current"  # "delayed" (--fp8-recipe): X and dY cast with the history's scale, no amax pass
    optim_state: str = "fp32"    # --optim-state: how the AdamW moments are stored (MOMENT_BYTES)
    grad_buffer: str = "fp32"    # --grad-buffer: how the accumulated gradients are stored (GRAD_BUFFER_CODEC)
    master_weights: str = "fp32"  # --master-weights: how the master weights are stored (MASTER_CODEC)

    @property
    def world(self):
        return self.nodes * self.gpus_per_node

    @property
    def N(self):
        return self.B * self.T

    @property
    def fp8(self):
        return self.precision == "fp8"

    @property
    def grad_bytes(self):
        """Bytes of one gradient element on the wire, scales aside (GRAD_WIRE_BYTES)."""
        return GRAD_WIRE_BYTES[self.grad_reduce]

    @property
    def shard_params(self):
        """Parameters of this rank's master weights and moments: a 1/W shard under ZeRO-1/2, all under ZeRO-0."""
        return self.shape.params() / self.world if self.zero >= 1 else self.shape.params()

    def label(self):
        return f"{self.nodes}x{self.gpus_per_node} {self.gpu}"


def recompute_label(plan):
    """"none", "cheap", "full K/L", or in bf16 "cheap+full K/L" (the other blocks rebuild norm and SwiGLU outputs)."""
    if plan.recompute == "full":
        return f"{'' if plan.fp8 else 'cheap+'}full {plan.recompute_layers}/{plan.shape.L}"
    return plan.recompute


# ------------------------------------------------------------------------------------------------
# Ops of a step
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Op:
    """One kernel: a contract op of llama/backend.h (bytes moved), a GEMM or attention (FLOPs)."""
    name: str
    category: str
    bytes: float = 0.0
    flops: float = 0.0
    gemm: tuple = None       # (precision, kind, m, n, k) in cuBLASLt's terms (docs/design.md#the-operand-map)
    attention: str = None    # "forward" or "backward"


def mem_op(name, nbytes, category="memory"):
    return Op(name, category, bytes=float(nbytes))


def gemm_op(precision, kind, m, n, k, label):
    """A GEMM D (m x n) = op(A) (m x k) op(B) (k x n); wgrad accumulates into FP32 (read and written)."""
    e = BYTES[precision]
    d_bytes = 2 * BYTES["fp32"] if kind == "wgrad" else BYTES["bf16"]
    return Op(label, "gemm", bytes=float(m * k * e + n * k * e + m * n * d_bytes), flops=2.0 * m * n * k,
              gemm=(precision, kind, m, n, k))


# Linear layers whose FP8 input X or output gradient dY could get its amax from the kernel that produces
# it (RMSNorm, SwiGLU, RMSNorm/SwiGLU/RoPE backward), as Transformer Engine's fused norms do; wo's X is
# cuDNN attention's output, which reports no amax. Used only by the "what it would take" lever.
AMAX_FROM_PRODUCER_X = ("wqkv", "w13", "w2")
AMAX_FROM_PRODUCER_DY = ("wqkv", "wo", "w13", "w2")


def linear_forward_ops(plan, lin, OC, Cin, N):
    """linear_forward of model/model.h: in fp8 amax + cast-transpose of X (E4M3), then the GEMM."""
    if not plan.fp8 or lin == "output":
        return [gemm_op("bf16", "fprop", OC, N, Cin, f"{lin} fprop")]
    ops = []
    if plan.fp8_recipe == "current" and not (plan.fused_amax and lin in AMAX_FROM_PRODUCER_X):
        ops.append(stream_op("amax", N * Cin, "fp8_cast"))
    ops.append(stream_op("cast_transpose E4M3", N * Cin, "fp8_cast"))
    ops.append(gemm_op("fp8", "fprop", OC, N, Cin, f"{lin} fprop"))
    return ops


def linear_backward_ops(plan, lin, OC, Cin, N):
    """linear_backward of model/model.h: in fp8 amax + cast-transpose of dY (E5M2), then dgrad and wgrad."""
    precision = "fp8" if plan.fp8 and lin != "output" else "bf16"
    ops = []
    if precision == "fp8":
        if plan.fp8_recipe == "current" and not (plan.fused_amax and lin in AMAX_FROM_PRODUCER_DY):
            ops.append(stream_op("amax", N * OC, "fp8_cast"))
        ops.append(stream_op("cast_transpose E5M2", N * OC, "fp8_cast"))
    ops.append(gemm_op(precision, "dgrad", Cin, N, OC, f"{lin} dgrad"))
    ops.append(gemm_op(precision, "wgrad", Cin, OC, N, f"{lin} wgrad"))
    return ops


# Bytes of the memory-bound ops, counted as dev/cuda/kernel_cases.cuh counts them (what each call must move
# at least), so that a GB/s it measured applies here unchanged. Ops streaming one tensor: bytes per element.
# A scaled stored array's scale_inv adds CHUNK_SCALE_BYTES per ZERO_CHUNK elements for each read or write.
CHUNK_SCALE_PER_ELEMENT = CHUNK_SCALE_BYTES / ZERO_CHUNK
BYTES_PER_ELEMENT = {
    "params_from_master": 6,     # FP32 master read, BF16 weight written
    "adamw": 28,                 # FP32 gradient read; master, adam_m, adam_v read and written
    "adamw bf16 state": 20,      # --optim-state bf16: FP32 gradient read, FP32 master and BF16 m, v read and written
    "adamw fp8 state": 18,       # --optim-state fp8: E4M3 m and FP16 v (their scales: 8 bytes per 4096, aside)
    "sum_squares": 4,            # FP32 gradient read
    "amax": 2,                   # BF16 read
    "cast_transpose E4M3": 4,    # BF16 read, FP8 copy and FP8 transposed copy written
    "cast_transpose E5M2": 4,
    "cast E4M3": 3,              # BF16 read, FP8 written
    "transpose E4M3": 2,         # FP8 read and written
    # --grad-buffer (cuda/optimizer.cuh op_store_add, op_store_load): the stored sum plus a bucket's FP32
    # gradients, stored again (E4M3: one block per chunk, its amax in registers, the scale_inv read and written)
    "store_add bf16": 8,                                        # BF16 read, FP32 read, BF16 written
    "store_add e4m3": 6 + 2 * CHUNK_SCALE_PER_ELEMENT,          # E4M3 read, FP32 read, E4M3 written
    # ZeRO-1's last micro-step: the stored sum added into the FP32 bucket
    "store_load bf16 accumulate": 10,                           # BF16 read, FP32 read and written
    "store_load e4m3 accumulate": 9 + CHUNK_SCALE_PER_ELEMENT,  # E4M3 read, FP32 read and written
    # ZeRO-0: the stored sum decoded into a bucket buffer for a reader of the reduced gradient
    "store_load bf16": 6,                                       # BF16 read, FP32 written
    "store_load e4m3": 5 + CHUNK_SCALE_PER_ELEMENT,             # E4M3 read, FP32 written
    # --master-weights fp16 (model/memory.h llama_master_piece, llama_master_store)
    "master decode fp16": 6 + CHUNK_SCALE_PER_ELEMENT,          # FP16 read, FP32 scratch written
    "master store fp16": 6 + CHUNK_SCALE_PER_ELEMENT,           # FP32 scratch read, FP16 and the new scale_inv written
}
ACTIVATION_OPS = ("encoder_forward", "rmsnorm_forward", "residual_rmsnorm_forward", "rmsnorm_backward", "rope_forward",
                  "rope_backward", "swiglu_forward", "swiglu_backward", "classifier")


def activation_op_bytes(name, B, T, shape):
    """Bytes of an activation op of ACTIVATION_OPS on B x T tokens (BF16 activations, FP32 statistics)."""
    N, C, F = B * T, shape.C, shape.F
    rope = 4 * N * (shape.NH + shape.NKV) * shape.HS + 8 * T * (shape.HS // 2)  # q, k in place, cos/sin tables
    return {
        "encoder_forward": 4 * N * C, "rmsnorm_forward": 4 * N * C + 4 * N,
        "residual_rmsnorm_forward": 8 * N * C + 4 * N, "rmsnorm_backward": 8 * N * C + 4 * N,
        "rope_forward": rope, "rope_backward": rope, "swiglu_forward": 6 * N * F, "swiglu_backward": 10 * N * F,
        "classifier": 4 * N * shape.V,
    }[name]


def act_op(name, plan):
    return mem_op(name, activation_op_bytes(name, plan.B, plan.T, plan.shape))


def stream_op(name, elements, category):
    return mem_op(name, BYTES_PER_ELEMENT[name] * elements, category)


def attention_ops(B, T, shape):
    """cuDNN SDPA forward and backward. Causal FLOPs: QK^T and PV over half the T x T scores,
    2 * 2 B NH T^2 HS / 2, as bench_kernels counts them; backward ATTENTION_BACKWARD_FLOPS times that."""
    forward = 2.0 * B * shape.NH * T * T * shape.HS
    return (Op("attention_forward", "attention", flops=forward, attention="forward"),
            Op("attention_backward", "attention", flops=ATTENTION_BACKWARD_FLOPS * forward, attention="backward"))


def layer_forward_ops(plan):
    """One block of llama_forward: the ops in the order the model issues them."""
    s, N, B, T = plan.shape, plan.N, plan.B, plan.T
    dims = s.linear_dims()
    ops = linear_forward_ops(plan, "wqkv", *dims["wqkv"], N)
    ops.append(act_op("rope_forward", plan))
    ops.append(attention_ops(B, T, s)[0])
    ops += linear_forward_ops(plan, "wo", *dims["wo"], N)
    ops.append(act_op("residual_rmsnorm_forward", plan))
    ops += linear_forward_ops(plan, "w13", *dims["w13"], N)
    ops.append(act_op("swiglu_forward", plan))
    ops += linear_forward_ops(plan, "w2", *dims["w2"], N)
    ops.append(act_op("residual_rmsnorm_forward", plan))
    return ops


def layer_backward_ops(plan, layer):
    """One block of llama_backward with the recompute its plan asks for: a block recomputed in full runs
    its forward again first; in bf16 the other blocks of a recomputing plan rebuild their norm and SwiGLU
    outputs (-r 1), fp8 keeps its X^T copies instead."""
    s, N, B, T = plan.shape, plan.N, plan.B, plan.T
    dims = s.linear_dims()
    full = plan.recompute == "full" and layer < plan.recompute_layers
    cheap = not full and not plan.fp8 and plan.recompute != "none"
    ops = layer_forward_ops(plan) if full else []
    if cheap:
        ops += [act_op("rmsnorm_forward", plan), act_op("swiglu_forward", plan)]
    ops += linear_backward_ops(plan, "w2", *dims["w2"], N)
    ops.append(act_op("swiglu_backward", plan))
    ops += linear_backward_ops(plan, "w13", *dims["w13"], N)
    ops.append(act_op("rmsnorm_backward", plan))
    ops += linear_backward_ops(plan, "wo", *dims["wo"], N)
    ops.append(attention_ops(B, T, s)[1])
    ops.append(act_op("rope_backward", plan))
    if cheap:
        ops.append(act_op("rmsnorm_forward", plan))
    ops += linear_backward_ops(plan, "wqkv", *dims["wqkv"], N)
    ops.append(act_op("rmsnorm_backward", plan))
    return ops


@dataclass
class MicroStepOps:
    """A micro-step's ops in segments, each gated by (forward) or releasing (backward) one ZeRO bucket."""
    forward: list    # [embedding + first norm, block 0, ..., block L-1, output layer + classifier]
    backward: list   # [output layer + final norm, block L-1, ..., block 0, embedding]


def store_bytes(codec, elements):
    """Bytes of elements stored in codec (STORE_BYTES), with their scale_inv per chunk when it keeps them."""
    scales = CHUNK_SCALE_BYTES * elements / ZERO_CHUNK if codec in STORE_SCALED else 0.0
    return STORE_BYTES[codec] * elements + scales


def grad_bucket_elements(shape):
    """Gradients per bucket in backward order: the output layer with the final norm, each block, the embedding."""
    return [shape.V * shape.C + shape.C] + [shape.layer_params()] * shape.L + [shape.V * shape.C]


def grad_buffer_ops(plan, elements, last):
    """(before, after) a bucket's backward of `elements` gradients: what a bf16/fp8 gradient buffer adds on
    the compute stream (train/data_parallel.h dp_grads_needed, dp_stage_grads): the FP32 bucket buffer the
    backward writes is zeroed first, and afterwards added into the stored sum (op_store_add), or on ZeRO-1's
    last micro-step (last) the stored sum is added into it (op_store_load), to be reduced from there. fp32:
    nothing, the wgrad GEMMs accumulate into the buffer itself. (ZeRO-2 zeroes its bucket buffers too; left
    out, as reduction_kernel_ops leaves out its comm_store_kernel.)"""
    if plan.grad_buffer == "fp32":
        return [], []
    codec = GRAD_BUFFER_CODEC[plan.grad_buffer]
    store = f"store_load {codec} accumulate" if last and plan.zero == 1 else f"store_add {codec}"
    return [mem_op("memset", BYTES["fp32"] * elements, "optimizer")], [stream_op(store, elements, "optimizer")]


def micro_step_ops(plan, last=False):
    """One micro-step's ops; last: the step's last micro-step, which under ZeRO-1 reads a bf16/fp8 gradient
    buffer back into the buckets it reduces (grad_buffer_ops)."""
    s, N = plan.shape, plan.N
    forward = [[act_op("encoder_forward", plan), act_op("rmsnorm_forward", plan)]]
    forward += [layer_forward_ops(plan) for _ in range(s.L)]
    forward.append(linear_forward_ops(plan, "output", s.V, s.C, N) + [act_op("classifier", plan)])
    backward = [[mem_op("memset", BYTES["bf16"] * N * s.C)] + linear_backward_ops(plan, "output", s.V, s.C, N)
                + [act_op("rmsnorm_backward", plan)]]
    backward += [layer_backward_ops(plan, layer) for layer in reversed(range(s.L))]
    distinct = min(N, s.V)  # rows of the FP32 embedding gradient a micro-batch reads and writes, at most
    backward.append([mem_op("encoder_backward", 2 * N * s.C + 8 * distinct * s.C)])
    for i, elements in enumerate(grad_bucket_elements(s)):
        before, after = grad_buffer_ops(plan, elements, last)
        backward[i] = before + backward[i] + after
    return MicroStepOps(forward, backward)


def weight_cast_ops(plan):
    """FP8 copies of one block's weights, made once per optimizer step (llama_fp8_refresh_weights): with a
    BF16 all-gather, amax + cast-transpose of the full weights; with an E4M3 all-gather, amax and cast of
    the rank's shard (its amax MAX-reduced, docs/design.md#fp8-under-sharding) and a transpose of the gathered bytes."""
    if not plan.fp8:
        return []
    p = plan.shape.layer_linear_params()
    if plan.weight_gather == "e4m3" and plan.world > 1:
        shard = p / plan.world
        return [stream_op("amax", shard, "fp8_cast"), stream_op("cast E4M3", shard, "fp8_cast"),
                stream_op("transpose E4M3", p, "fp8_cast")]
    return [stream_op("amax", p, "fp8_cast"), stream_op("cast_transpose E4M3", p, "fp8_cast")]


# Bytes per parameter of the AdamW moments m + v (--optim-state; llama/optim.h), per-chunk scales aside
# (fp8: two FP32 scale_inv per ADAMW_CHUNK elements).
MOMENT_BYTES = {"fp32": 8, "bf16": 4, "fp8": 3}
ADAMW_CHUNK = ZERO_CHUNK  # llama/optim.h: the fp8 moments' chunk is the shard's
ADAMW_OP = {"fp32": "adamw", "bf16": "adamw bf16 state", "fp8": "adamw fp8 state"}
# The fp8 and bf16 state kernel checks run on a w1|w3 weight less a third of a 4096-element chunk (a
# partial last chunk: kc_adamw_lowp).
KERNEL_ADAMW_LOWP_SHORT = ADAMW_CHUNK // 3


def optimizer_ops(plan):
    """Per optimizer step: gradients zeroed (the stored buffer under ZeRO-0/1 in its --grad-buffer codec,
    llama_zero_grads; the FP32 shard under ZeRO-2), the gradient norm, AdamW and the working-weight refresh
    on the rank's shard (trainer_step, llama_update). A bf16/fp8 buffer under ZeRO-0 is decoded for each of
    its two readers, the norm and AdamW (llama_reduced_grad). An fp16 master is decoded by AdamW, by the
    working-weight refresh and, in fp8, by the FP8 weight cast of the linear layers (llama_master_piece),
    and stored once after AdamW (llama_master_store); AdamW reads and writes the FP32 scratch as it would
    the FP32 master."""
    P, P_lin, shard = plan.shape.params(), plan.shape.linear_params(), plan.shard_params
    if plan.zero >= 2:
        zeroed = BYTES["fp32"] * P / plan.world
    else:
        zeroed = store_bytes(GRAD_BUFFER_CODEC[plan.grad_buffer], P)
    grad_decode = []
    if plan.zero == 0 and plan.grad_buffer != "fp32":
        grad_decode = [stream_op(f"store_load {GRAD_BUFFER_CODEC[plan.grad_buffer]}", P, "optimizer")]
    decode, store = [], []
    if plan.master_weights != "fp32":
        codec = MASTER_CODEC[plan.master_weights]
        decode = [stream_op(f"master decode {codec}", shard, "optimizer")]
        store = [stream_op(f"master store {codec}", shard, "optimizer")]
    cast_decode = []
    if decode and plan.fp8:
        cast_decode = [stream_op(decode[0].name, P_lin / plan.world if plan.zero >= 1 else P_lin, "optimizer")]
    return ([mem_op("memset", zeroed, "optimizer")] + grad_decode + [stream_op("sum_squares", shard, "optimizer")]
            + grad_decode + decode + [stream_op(ADAMW_OP[plan.optim_state], shard, "optimizer")] + store
            + decode + [stream_op("params_from_master", shard, "optimizer")] + cast_decode)


def grad_segments(shape):
    """llama_grad_segments: one per tensor that is not per layer, one per layer of the others."""
    return 3 + 6 * shape.L


# ------------------------------------------------------------------------------------------------
# Rates: how long an op takes
# ------------------------------------------------------------------------------------------------


def peak_flops(gpu, precision):
    return gpu.fp8_flops if precision == "fp8" else gpu.bf16_flops


class Rates:
    """Throughput of each kind of op on one GPU: the datasheet fractions above, or measured fractions
    (Calibration) where the device check measured the same op. Fractions are of the GPU's peak (GEMMs,
    attention) or of its HBM bandwidth (memory-bound ops), so rates measured on one Hopper GPU carry to
    another."""

    def __init__(self, gpu, calibration=None, gemm_scale=None):
        self.gpu = gpu
        self.calibration = calibration
        self.gemm_scale = gemm_scale or {}  # precision -> factor on GEMM throughput (a lever)

    def with_gemm_scale(self, precision, factor):
        return Rates(self.gpu, self.calibration, {**self.gemm_scale, precision: factor})

    def gemm_fraction(self, key):
        precision, kind = key[0], key[1]
        c = self.calibration
        if c is not None and key in c.gemm_exact:
            frac = c.gemm_exact[key]
        elif c is not None and (precision, kind) in c.gemm_kind:
            frac = c.gemm_kind[(precision, kind)]
        else:
            frac = GEMM_EFFICIENCY[(precision, kind)]
        return frac * self.gemm_scale.get(precision, 1.0)

    def attention_fraction(self, direction):
        c = self.calibration
        if c is not None and direction in c.attention:
            return c.attention[direction]
        return ATTENTION_EFFICIENCY[direction]

    def bandwidth(self, name):
        c = self.calibration
        frac = c.bandwidth[name] if c is not None and name in c.bandwidth else HBM_EFFICIENCY
        return frac * self.gpu.hbm_bytes_s

    def time(self, op):
        """Seconds of one op. A GEMM is the slower of its tensor-core time and its operand traffic
        (a roofline); a calibrated GEMM shape is its measured time, which includes both."""
        if op.gemm is not None:
            compute = op.flops / (peak_flops(self.gpu, op.gemm[0]) * self.gemm_fraction(op.gemm))
            exact = self.calibration is not None and op.gemm in self.calibration.gemm_exact
            return compute if exact else max(compute, op.bytes / (HBM_EFFICIENCY * self.gpu.hbm_bytes_s))
        if op.attention is not None:
            return op.flops / (self.gpu.bf16_flops * self.attention_fraction(op.attention))
        return op.bytes / self.bandwidth(op.name)


# ------------------------------------------------------------------------------------------------
# Collectives
# ------------------------------------------------------------------------------------------------


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


def bus_bandwidth(plan):
    """The ring's bus bandwidth: the slower of NVLink per direction and, across nodes, the node's NICs."""
    gpu = GPUS[plan.gpu]
    intra = gpu.nvlink_bytes_s / 2 * NVLINK_EFFICIENCY
    if plan.nodes == 1:
        return intra
    return min(intra, plan.nics_per_node * plan.nic_bytes_s * NIC_EFFICIENCY)


def collective_latency(plan):
    return COLLECTIVE_LATENCY_S["inter" if plan.nodes > 1 else "intra"]


def all_to_all_time(size_bytes, nodes, gpus_per_node, nvlink_bytes_s, node_nics_bytes_s, latency_s):
    """Seconds of an NCCL all-to-all in which every rank holds size_bytes in W = nodes x gpus_per_node equal
    pieces and sends each other rank its piece (its own stays): W - 1 point-to-point sends, no ring, so no
    pipelining through other ranks. Off-node pieces leave through the node's NICs, PXN spreading them over
    all of them (see GRAD_WIRE_BYTES' notes): node_nics_bytes_s, all NICs of a node together, carries
    gpus_per_node x (W - gpus_per_node) pieces. NVLink (nvlink_bytes_s per GPU and direction) carries the
    gpus_per_node - 1 on-node pieces and, per other node, the gpus_per_node - 1 pieces forwarded to the
    destination's rail: nodes x (gpus_per_node - 1) pieces. The two run at once; the slower sets the time."""
    W = nodes * gpus_per_node
    if W <= 1:
        return 0.0
    piece = size_bytes / W
    nvlink_s = nodes * (gpus_per_node - 1) * piece / nvlink_bytes_s
    nics_s = gpus_per_node * (W - gpus_per_node) * piece / node_nics_bytes_s if nodes > 1 else 0.0
    return latency_s + max(nvlink_s, nics_s)


def link_rates(plan):
    """(NVLink bytes/s per GPU and direction, the node's NICs together in bytes/s), at the assumed efficiencies."""
    return (GPUS[plan.gpu].nvlink_bytes_s / 2 * NVLINK_EFFICIENCY,
            plan.nics_per_node * plan.nic_bytes_s * NIC_EFFICIENCY)


def fp8_scale_bytes(plan, elements):
    """Bytes of the FP32 scales of a bucket of elements gradients sent as W E4M3 pieces: one per ZERO_CHUNK
    chunk of each piece of elements / W, rounded up per piece (comm/grad_fp8.h grad_fp8_block_bytes)."""
    return plan.world * CHUNK_SCALE_BYTES * math.ceil(elements / plan.world / ZERO_CHUNK)


def grad_wire_bytes_per_element(plan, elements):
    """Bytes a rank puts on the wire per gradient element it sends, reducing a bucket of elements: FP32 4,
    BF16 2, FP8 1 plus the scales (fp8_scale_bytes: 4 / 4096 per element; ZeRO-0's FP32 all-gather after
    the FP8 exchange is ZERO0_FP8_GATHER_BYTES more, not counted here)."""
    scales = fp8_scale_bytes(plan, elements) / elements if plan.grad_reduce == "fp8" else 0.0
    return plan.grad_bytes + scales


def inter_node_bytes_per_element(plan):
    """Bytes one NIC sends out of its node per gradient element of a bucket, scales aside. A ring (NCCL
    runs one per NIC) leaves each node once per direction, so a reduce-scatter or all-gather puts
    (W - 1) / W of the buffer on the node's NICs together, an all-reduce twice that; the all-to-all sends
    every off-node piece, gpus_per_node x (W - gpus_per_node) / W of the buffer per node. On 2 x 8: a ring
    0.117 of the buffer per NIC, the all-to-all 0.5."""
    W, g, nics = plan.world, plan.gpus_per_node, plan.nics_per_node
    if plan.nodes == 1:
        return 0.0
    ring = (W - 1) / W / nics
    if plan.grad_reduce == "fp8":
        gather = ZERO0_FP8_GATHER_BYTES * ring if plan.zero == 0 else 0.0
        return plan.grad_bytes * g * (W - g) / W / nics + gather
    return plan.grad_bytes * ring * (2 if plan.zero == 0 else 1)


def reduction_kernel_ops(plan, elements):
    """The element-wise kernels the reduction of a bucket of elements gradients runs on the communication
    stream, bytes as comm/comm_nccl.cuh moves them. n = elements / W is the rank's piece; ZeRO-2 adds it
    into the sharded FP32 accumulator (reads it too), ZeRO-1 writes it, ZeRO-0 writes the whole bucket.
    fp32: none (NCCL reduces in the buffers). Not counted: ZeRO-2's comm_store_kernel adding the
    reduce-scattered FP32 chunk into the shard (12 bytes per chunk element), which would cost 13B fp8 1.4%
    of its step on 2 x 8 H800 and 3% on 1 x 8 here; left out so that the fp32 rows stay the ones docs/performance.md
    quotes until they are next refreshed.
    bf16: comm_to_bf16_kernel over the bucket (FP32 read, BF16 written) and comm_store_kernel of the
    result (BF16 read, FP32 written, + FP32 read when accumulating).
    fp8: the quantize, an amax pass per chunk (FP32 read) and the cast (FP32 read, E4M3 written), and the
    dequantize-and-sum of the W pieces of the rank's piece (E4M3 and their scales read, FP32 written, + read
    when accumulating); ZeRO-0 (comm_all_reduce) first copies the bucket into a padded scratch (FP32 read
    and written), writes its piece's sums as FP32, all-gathers them in place and copies the bucket back."""
    n = elements / plan.world
    accumulate = plan.zero >= 2
    if plan.grad_reduce == "bf16":
        result = elements if plan.zero == 0 else n
        return [mem_op("grad_to_bf16", 6 * elements, "comm"),
                mem_op("grad_store", (10 if accumulate else 6) * result, "comm")]
    if plan.grad_reduce == "fp8":
        ops = [mem_op("grad_amax", 4 * elements, "comm"), mem_op("grad_cast E4M3", 5 * elements, "comm"),
               mem_op("grad_dequantize_sum", elements + fp8_scale_bytes(plan, elements) + (8 if accumulate else 4) * n,
                      "comm")]
        if plan.zero == 0:
            copy = mem_op("grad_copy", 8 * elements, "comm")
            return [copy] + ops + [copy]
        return ops
    return []


def reduction_time(plan, elements, rates):
    """(link seconds, kernel seconds) of reducing one bucket of elements gradients, one after the other on
    the communication stream. fp32 / bf16: the ring reduce-scatter (ZeRO-1/2) or all-reduce (ZeRO-0);
    fp8: the all-to-all of the E4M3 pieces and their scales, and under ZeRO-0 the FP32 ring all-gather."""
    n, bus, lat = plan.world, bus_bandwidth(plan), collective_latency(plan)
    kernels = sum(rates.time(op) for op in reduction_kernel_ops(plan, elements))
    if plan.grad_reduce != "fp8":
        kind = "all_reduce" if plan.zero == 0 else "reduce_scatter"
        return ring_time(kind, elements * plan.grad_bytes, n, bus, lat), kernels
    link = all_to_all_time(elements * grad_wire_bytes_per_element(plan, elements), plan.nodes, plan.gpus_per_node,
                           *link_rates(plan), lat)
    if plan.zero == 0:
        link += ring_time("all_gather", elements * ZERO0_FP8_GATHER_BYTES, n, bus, lat)
    return link, kernels


def fifo_exposed(ready_s, comm_s, compute_end_s):
    """Communication left after compute ends when bucket i is ready at ready_s[i] and the collectives run
    one after another on their own stream: exposed = end of the last one - compute_end_s (>= 0)."""
    t = 0.0
    for ready, duration in zip(ready_s, comm_s):
        t = max(t, ready) + duration
    return max(0.0, t - compute_end_s)


def gated_delay(gather_s, compute_s):
    """Delay of a forward whose segment i may start only when gather i (issued back to back from t = 0)
    has arrived: its end minus the sum of its segments."""
    arrived = t = 0.0
    for g, c in zip(gather_s, compute_s):
        arrived += g
        t = max(t, arrived) + c
    return t - sum(compute_s)


# ------------------------------------------------------------------------------------------------
# Memory (decides the automatic recompute plan)
# ------------------------------------------------------------------------------------------------


def activation_bytes(plan):
    """Bytes of llama_acts_table's buffers for the plan; blocks recomputed in full keep only their input
    (resid), plus one block's buffers for the block being recomputed."""
    s, N, B, T = plan.shape, plan.N, plan.B, plan.T
    C, F, QKV, L, V = s.C, s.F, s.QKV, s.L, s.V
    a, f, e4m3 = BYTES["bf16"], BYTES["fp32"], BYTES["fp8"]
    keep = not plan.fp8 and plan.recompute == "none"  # llama_keeps_linear_inputs
    per_layer = {
        "resid_mid": N * C * a, "rstd_attn": N * f, "rstd_ffn": N * f, "qkv": N * QKV * a, "att": N * C * a,
        "att_stats": B * s.NH * T * f, "fc": N * 2 * F * a,
        "ln_attn": N * C * a if keep else 0, "ln_ffn": N * C * a if keep else 0, "swiglu": N * F * a if keep else 0,
        "xt8": N * (3 * C + F) * e4m3 if plan.fp8 else 0,
    }
    once = {
        "resid": (L + 1) * N * C * a, "ln_attn": 0 if keep else N * C * a, "ln_ffn": 0 if keep else N * C * a,
        "swiglu": 0 if keep else N * F * a, "rstd_final": N * f, "branch": N * C * a, "ln_final": N * C * a,
        "logits": N * V * a, "losses": N * f, "d_resid": N * C * a, "d_ln": N * C * a, "d_att": N * C * a,
        "d_qkv": N * QKV * a, "d_fc": N * 2 * F * a, "d_swiglu": N * F * a,
        "x8": N * max(C, F) * e4m3 if plan.fp8 else 0,
        "dy8 and dyt8": 2 * N * max(QKV, 2 * F, C) * e4m3 if plan.fp8 else 0,
    }
    full = plan.recompute_layers if plan.recompute == "full" else 0
    layers_with_buffers = L - full + (1 if full > 0 else 0)
    return layers_with_buffers * sum(per_layer.values()) + sum(once.values())


def memory_gib(plan):
    """Device memory of the plan: weights and optimizer state under its ZeRO stage, FP8 weight copies,
    activations and MEMORY_OVERHEAD_GIB. With an E4M3 all-gather the rank keeps BF16 copies of its shard of
    the linear weights only (fp8 reads only their E4M3 W and W^T). Gradients: ZeRO-0/1 the full buffer in
    its --grad-buffer codec, plus (bf16, fp8) the FP32 bucket buffers the backward writes; ZeRO-2 its FP32
    shard and those bucket buffers. Master: the shard in its --master-weights codec, plus (fp16) the FP32
    scratch a segment's piece is decoded into, the largest piece (the embedding's or the output layer's)."""
    s, n = plan.shape, plan.world
    a, f = BYTES["bf16"], BYTES["fp32"]
    P, P_lin, shard = s.params(), s.linear_params(), plan.shard_params
    working = P
    if plan.weight_gather == "e4m3" and n > 1:
        working = P - P_lin + P_lin / n
    bucket_buffers = f * ZERO2_GRAD_BUCKETS * max(s.layer_params(), s.V * s.C)
    if plan.zero >= 2:
        grads = f * P / n + bucket_buffers
    else:
        grads = store_bytes(GRAD_BUFFER_CODEC[plan.grad_buffer], P) + (bucket_buffers if plan.grad_buffer != "fp32" else 0)
    master = store_bytes(MASTER_CODEC[plan.master_weights], shard)
    if plan.master_weights != "fp32":
        largest_segment = max(s.V * s.C, *(oc * c for oc, c in s.linear_dims().values()))
        master += f * largest_segment / (n if plan.zero >= 1 else 1)
    moments = MOMENT_BYTES[plan.optim_state] * shard + (2 * CHUNK_SCALE_BYTES * shard / ADAMW_CHUNK
                                                        if plan.optim_state == "fp8" else 0)
    total = (a * working + grads + master + moments  # working weights, gradients, master, adam_m + adam_v
             + (2 * BYTES["fp8"] * P_lin if plan.fp8 else 0)  # E4M3 W and W^T
             + activation_bytes(plan))
    return total / 2**30 + MEMORY_OVERHEAD_GIB


def recompute_candidates(shape, precision):
    """Recompute plans from the cheapest: none; cheap (bf16 only: the trainer refuses -r 1 with fp8,
    whose backward reads the FP8 X^T copies instead); then 1..L blocks in full."""
    plans = [("none", 0)] + ([("cheap", 0)] if precision == "bf16" else [])
    return plans + [("full", k) for k in range(1, shape.L + 1)]


def fit_recompute(plan):
    """The cheapest recompute with which the plan fits the GPU's memory, or the most thorough one."""
    candidate = plan
    for mode, layers in recompute_candidates(plan.shape, plan.precision):
        candidate = replace(plan, recompute=mode, recompute_layers=layers)
        if memory_gib(candidate) <= GPUS[plan.gpu].memory_gib:
            return candidate
    return candidate


# ------------------------------------------------------------------------------------------------
# The step
# ------------------------------------------------------------------------------------------------


def segment_times(segments, rates):
    return [sum(rates.time(op) for op in seg) for seg in segments]


def add_ops(totals, ops, rates, times=1.0):
    for op in ops:
        totals[op.category] += times * rates.time(op)


def predict(plan, rates):
    """Predicted step of the plan: seconds per category, tokens/s/GPU, MFU, memory."""
    s, G = plan.shape, plan.grad_accum
    micro = micro_step_ops(plan)  # the micro-steps before the last
    last = micro_step_ops(plan, last=True)  # the last, which ZeRO-0/1 reduce from
    casts = weight_cast_ops(plan)
    optim = optimizer_ops(plan)
    totals = dict.fromkeys(CATEGORIES, 0.0)
    for ops, times in ((micro, G - 1), (last, 1)):
        for seg in ops.forward + ops.backward:
            add_ops(totals, seg, rates, times)
    add_ops(totals, casts, rates, s.L)
    add_ops(totals, optim, rates)
    forward_s = segment_times(last.forward, rates)
    backward_s = segment_times(last.backward, rates)
    micro_s = ((G - 1) * sum(segment_times(micro.forward + micro.backward, rates)) + sum(forward_s) + sum(backward_s)) / G

    comm_total, comm_exposed, overlap_cost, reduction_kernels = communication(
        plan, forward_s, backward_s, sum(rates.time(op) for op in casts), rates)
    totals["comm"] = comm_exposed + overlap_cost
    launches = sum(times * len(seg) for ops, times in ((micro, G - 1), (last, 1)) for seg in ops.forward + ops.backward)
    launches += s.L * len(casts) + len(optim)
    syncs = G * SYNCS_PER_MICRO_STEP[plan.precision] + grad_segments(s)
    totals["other"] = launches * KERNEL_GAP_S + syncs * HOST_SYNC_S
    step_s = sum(totals.values())
    tokens = G * plan.N
    tok_s = tokens / step_s
    peak = peak_flops(GPUS[plan.gpu], plan.precision)
    memory = memory_gib(plan)
    return {
        "model": s.name, "precision": plan.precision, "gpus": plan.label(), "world": plan.world,
        "micro_batch": plan.B, "seq_len": plan.T, "grad_accum": G, "zero": plan.zero,
        "recompute": recompute_label(plan), "weight_gather": plan.weight_gather,
        "grad_reduce": plan.grad_reduce, "grad_reduce_built": True, "optim_state": plan.optim_state,
        "grad_buffer": plan.grad_buffer, "master_weights": plan.master_weights,
        "grad_wire_bytes_per_element": grad_wire_bytes_per_element(plan, s.layer_params()),
        "grad_inter_node_bytes_per_element_per_nic": inter_node_bytes_per_element(plan), "overlap": plan.overlap,
        "memory_gib": memory, "fits": memory <= GPUS[plan.gpu].memory_gib,
        "tokens_per_s_per_gpu": tok_s, "step_ms": 1e3 * step_s, "tokens_per_gpu_step": tokens,
        "mfu_llmc": flops_per_token_llmc(s, plan.T) * tok_s / peak,
        "mfu_megatron": flops_per_token_megatron(s, plan.T) * tok_s / peak,
        "compute_bound_tokens_per_s": plan.N / micro_s,
        "comm_total_ms": 1e3 * comm_total, "comm_exposed_ms": 1e3 * comm_exposed,
        "grad_reduction_kernels_ms": 1e3 * reduction_kernels,
        "split_ms": {c: 1e3 * totals[c] for c in CATEGORIES},
    }


def communication(plan, forward_s, backward_s, cast_s_per_layer, rates):
    """Seconds of a step's collectives: (total, exposed, overlap cost, reduction kernels). Buckets: the
    output layer (+ final norm), each block, the embedding. Gradients: reduced on the last micro-step
    (ZeRO-0, ZeRO-1) or every micro-step (ZeRO-2), each bucket as soon as its backward is done
    (reduction_time: its link time and its kernels, one after the other on the communication stream);
    weights: ZeRO-1/2 all-gather each bucket ahead of its first forward after the update (fp8: its FP8 cast
    follows the gather). Scalars (loss, gradient norm, the E4M3 gather's amax MAX) cost one latency each,
    exposed. The overlap cost is what the hidden part costs the compute it runs beside: link time at
    COMM_OVERLAP_SLOWDOWN, the reduction's kernels at COMM_KERNEL_OVERLAP_COST (their hidden share taken
    as the reductions' hidden share)."""
    n = plan.world
    if n == 1:
        return 0.0, 0.0, 0.0, 0.0
    s, bus, lat = plan.shape, bus_bandwidth(plan), collective_latency(plan)
    out_params, layer_params, emb_params = s.V * s.C + s.C, s.layer_params(), s.V * s.C
    grad = [reduction_time(plan, p, rates) for p in grad_bucket_elements(s)]
    grad_s = [link + kernels for link, kernels in grad]
    ready, t = [], 0.0
    for seg in backward_s:
        t += seg
        ready.append(t)
    per_reduction = sum(grad_s)
    exposed_reduction = fifo_exposed(ready, grad_s, t) if plan.overlap else per_reduction
    reductions = plan.grad_accum if plan.zero >= 2 else 1
    kernels = reductions * sum(k for _, k in grad)
    hidden_kernels = kernels * (1.0 - exposed_reduction / per_reduction)
    total = reductions * per_reduction
    exposed = reductions * exposed_reduction
    if plan.zero >= 1:
        a = BYTES["bf16"]
        layer_gather_bytes = a * layer_params
        if plan.weight_gather == "e4m3":  # linear weights as E4M3, the two norms' weights as BF16
            layer_gather_bytes = BYTES["fp8"] * s.layer_linear_params() + a * 2 * s.C
        gather_s = [ring_time("all_gather", b, n, bus, lat)
                    for b in [a * emb_params] + [layer_gather_bytes] * s.L + [a * out_params]]
        compute_s = [forward_s[0]] + [f + cast_s_per_layer for f in forward_s[1:-1]] + [forward_s[-1]]
        total += sum(gather_s)
        exposed += gated_delay(gather_s, compute_s) if plan.overlap else sum(gather_s)
    scalars = 2 + (1 if plan.weight_gather == "e4m3" else 0)
    total, exposed = total + scalars * lat, exposed + scalars * lat
    overlap_cost = ((total - exposed - hidden_kernels) * COMM_OVERLAP_SLOWDOWN
                    + hidden_kernels * COMM_KERNEL_OVERLAP_COST)
    return total, exposed, overlap_cost, kernels


# ------------------------------------------------------------------------------------------------
# Building plans from the command line
# ------------------------------------------------------------------------------------------------


def parse_topology(text):
    m = re.fullmatch(r"(\d+)x(\d+)", text)
    if not m or int(m.group(1)) < 1 or int(m.group(2)) < 1:
        raise InputError(f"flag --topologies: '{text}' is not NODESxGPUS (e.g. 1x8, 2x8)")
    return int(m.group(1)), int(m.group(2))


def make_plan(args, shape, precision, gpu, nodes, gpus_per_node):
    """The plan the flags ask for; "auto" settings follow docs/design.md#targets and the GPU's memory."""
    world = nodes * gpus_per_node
    per_step = world * args.micro_batch * args.seq_len
    if args.global_batch % per_step != 0:
        raise InputError(f"flag --global-batch: {args.global_batch} tokens is not a multiple of "
                         f"GPUs x micro-batch x sequence = {world} x {args.micro_batch} x {args.seq_len}")
    zero = ZERO_STAGE_OF.get(shape.name, DEFAULT_ZERO_STAGE) if args.zero == "auto" else int(args.zero)
    if world == 1:
        zero = 0
    gather = "bf16" if precision == "bf16" or args.weight_gather == "bf16" else "e4m3"  # bf16 has no E4M3 copies
    recompute, layers = args.recompute, 0
    if recompute.startswith("full"):
        recompute, _, k = recompute.partition(":")
        layers = int(k) if k else shape.L
        if not 0 < layers <= shape.L:
            raise InputError(f"flag --recompute: full:{k} is not 1..{shape.L} blocks of {shape.name}")
    if recompute == "cheap" and precision == "fp8":
        raise InputError("flag --recompute: cheap is bf16 only (the trainer refuses -r 1 with fp8)")
    if args.grad_buffer != "fp32" and (zero == 2 or (zero == 0 and world > 1)):
        raise InputError(f"flag --grad-buffer {args.grad_buffer}: the trainer needs ZeRO-1, or ZeRO-0 on one GPU; "
                         f"{shape.name} on {world} GPUs runs ZeRO-{zero} (give --zero 1)")
    plan = Plan(shape=shape, precision=precision, gpu=gpu, nodes=nodes, gpus_per_node=gpus_per_node,
                B=args.micro_batch, T=args.seq_len, grad_accum=args.global_batch // per_step, zero=zero,
                recompute="none" if recompute == "auto" else recompute, recompute_layers=layers,
                grad_reduce=args.grad_reduce, weight_gather=gather,
                overlap=not args.no_overlap, nics_per_node=args.nics_per_node, nic_bytes_s=args.nic_gbits * 1e9 / 8,
                optim_state=args.optim_state, grad_buffer=args.grad_buffer, master_weights=args.master_weights)
    return fit_recompute(plan) if args.recompute == "auto" else plan


# ------------------------------------------------------------------------------------------------
# Calibration: parsing what the device check writes
# ------------------------------------------------------------------------------------------------

BENCH_GEMM_LINE = re.compile(r"^(\S+)\s+(wqkv|wo|w13|w2)\s+(fprop|dgrad|wgrad)\s+(\d+)\s+(\d+)\s+(\d+)\s*\|"
                             r"\s*([0-9.]+)\s+([0-9.]+)\s*\|\s*([0-9.]+)x?\s*$")
BENCH_GEMM_BLOCK = re.compile(r"^gemm (\S+) block: bf16 ([0-9.]+) ms, fp8 ([0-9.]+) ms, speedup ([0-9.]+)x?\s*$")
KERNEL_SHAPE = re.compile(r"^\[ (\w+) \] .*; B (\d+) T (\d+) C (\d+) NH (\d+) NKV (\d+) F (\d+) V (\d+)")
KERNEL_TIME = re.compile(r"^\s+(.+): ([0-9.]+) us, ([0-9.]+) (TFLOP/s|GB/s)\s*$")
KERNEL_GEMM_NAME = re.compile(r"^gemm (bf16|fp8) (fprop|dgrad|wgrad)\b")
TRAIN_HEADER = re.compile(r"^\| llm8 train_llama \((\w+) build\), precision (\w+)")
TRAIN_MODEL = re.compile(r"^\| model: dim (\d+), layers (\d+), heads (\d+), kv heads (\d+), head dim \d+, ffn (\d+), "
                         r"vocab (\d+)")
TRAIN_BATCH = re.compile(r"^\| micro-batch (\d+) x (\d+), (\d+) rank\(s\), grad accumulation (\d+) -> (\d+) tokens")
TRAIN_STEP = re.compile(r"^step\s+\d+/\d+ \|.*\| ([0-9.]+) ms \| [0-9.]+ tok/s")
DEVICE_NAME = re.compile(r"\bNVIDIA (H100|H800|H200)\b([^,;]*)")
# bench_kernels' timed op names -> the op names above (the cast cases time their (N, C) tensor "x").
# kc_store times the accumulating op_store_add of --grad-buffer: the model's store_add ops (its fp16 line,
# accumulating too, is not the non-accumulating store of an fp16 master, and is left out).
KERNEL_OP_NAMES = {"amax x": "amax", "cast_transpose x E4M3": "cast_transpose E4M3",
                   "cast_transpose x E5M2": "cast_transpose E5M2", "store bf16 (--grad-buffer bf16)": "store_add bf16",
                   "store e4m3 (--grad-buffer fp8)": "store_add e4m3"}
MEMORY_OPS = ACTIVATION_OPS + tuple(BYTES_PER_ELEMENT) + ("encoder_backward",)


@dataclass
class TrainRun:
    path: str
    shape: Shape
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
    header = model = batch = device = None
    for line in lines:
        header = header or TRAIN_HEADER.match(line)
        model = model or TRAIN_MODEL.match(line)
        batch = batch or TRAIN_BATCH.match(line)
        if line.startswith("| device:") and device is None:
            device = DEVICE_NAME.search(line)
        m = TRAIN_STEP.match(line)
        if m:
            steps.append(float(m.group(1)))
    if not steps:
        return None
    for found, what in ((header, "'| llm8 train_llama (...) precision ...'"), (model, "'| model: dim ...'"),
                        (batch, "'| micro-batch B x T ...'")):
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
    C, L, NH, NKV, F, V = (int(model.group(i)) for i in range(1, 7))
    shape = Shape(shape_name(C, L, NH, NKV, F, V), C, L, NH, NKV, F, V)
    return TrainRun(path, shape, header.group(2), int(batch.group(1)), int(batch.group(2)), int(batch.group(4)),
                    device_key(device, path) if device else None, steps)


def shape_name(C, L, NH, NKV, F, V):
    """The preset a trainer's shape is (with "L4" when --n-layers changed its depth), else its dims."""
    for name, p in PRESETS.items():
        if (p.C, p.NH, p.NKV, p.F, p.V) == (C, NH, NKV, F, V):
            return name if L == p.L else f"{name} L{L}"
    return f"d{C} L{L} H{NH}/{NKV} F{F}"


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
            found.append(f"trainer log ({run.precision}, {run.shape.name}, {len(run.step_ms)} steps)")
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
        elif unit == "GB/s" and op in MEMORY_OPS:
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


def block_gemm_ops(shape, precision, N):
    """The twelve GEMMs of one block (four linear layers x fprop, dgrad, wgrad), as bench_gemm times them."""
    ops = []
    for lin, (OC, Cin) in shape.linear_dims().items():
        ops += [gemm_op(precision, "fprop", OC, N, Cin, f"{lin} fprop"),
                gemm_op(precision, "dgrad", Cin, N, OC, f"{lin} dgrad"),
                gemm_op(precision, "wgrad", Cin, OC, N, f"{lin} wgrad")]
    return ops


# Tokens per GEMM of build/tools/bench_gemm (M = B*T in dev/tools/bench_gemm.cu).
BENCH_GEMM_TOKENS = 4096
# kc_case_sum_squares adds a ragged tail to its w1|w3-sized gradient.
KERNEL_SUM_SQUARES_TAIL = 12345
# kc_store: half a w1|w3 weight plus a ragged tail, at least three chunks.
KERNEL_STORE_TAIL = 321


def kernel_op(name, shape):
    """The model's op for a bench_kernels timing line at that run's shape (B, T, C, NH, NKV, F, V), or None
    for a line this model has no op for."""
    B, T, C, NH, NKV, F, V = shape
    s = Shape("bench_kernels", C, 1, NH, NKV, F, V)
    weight = 2 * C * F  # kc_case_params, kc_case_sum_squares: one w1|w3 weight
    store = weight // 4 + KERNEL_STORE_TAIL
    store = store if store >= 3 * ZERO_CHUNK else 3 * ZERO_CHUNK + KERNEL_STORE_TAIL
    elements = {"params_from_master": weight, "adamw": weight, "sum_squares": weight + KERNEL_SUM_SQUARES_TAIL,
                "adamw bf16 state": weight - KERNEL_ADAMW_LOWP_SHORT, "adamw fp8 state": weight - KERNEL_ADAMW_LOWP_SHORT,
                "store_add bf16": store, "store_add e4m3": store}
    if name in ACTIVATION_OPS:
        return mem_op(name, activation_op_bytes(name, B, T, s))
    if name in BYTES_PER_ELEMENT:
        return stream_op(name, elements.get(name, B * T * C), "memory")  # the casts: the (N, C) tensor "x"
    for op in attention_ops(B, T, s):
        if op.name == name:
            return op
    m = KERNEL_GEMM_NAME.match(name)
    if m:  # kc_case_gemm: X (N, C), W (F, C), dY (N, F)
        dims = {"fprop": (F, B * T, C), "dgrad": (C, B * T, F), "wgrad": (C, F, B * T)}[m.group(2)]
        return gemm_op(m.group(1), m.group(2), *dims, name)
    return None


def single_gpu_plan(shape, precision, gpu, B, T, grad_accum):
    """One GPU, no ZeRO, no recompute: what the device check's trainer runs."""
    return Plan(shape=shape, precision=precision, gpu=gpu, nodes=1, gpus_per_node=1, B=B, T=T, grad_accum=grad_accum,
                zero=0, recompute="none", recompute_layers=0, grad_reduce="fp32", weight_gather="bf16",
                overlap=True, nics_per_node=DEFAULT_NICS_PER_NODE, nic_bytes_s=DEFAULT_NIC_GBITS * 1e9 / 8)


def measured_vs_predicted(c):
    """What one GPU measured against the model on that GPU: rows of what, the datasheet prediction, the
    calibrated prediction (GEMM blocks: the sum of their measured GEMMs; trainer runs: the whole model;
    none for the kernels, whose timings are the calibration), the measurement and its unit."""
    rows = []
    if c.device is not None:
        sheet, calibrated = Rates(GPUS[c.device]), Rates(GPUS[c.device], c)
        for model, bf16_ms, fp8_ms in c.gemm_blocks:
            if model in PRESETS:
                for precision, measured in (("bf16", bf16_ms), ("fp8", fp8_ms)):
                    ops = block_gemm_ops(PRESETS[model], precision, BENCH_GEMM_TOKENS)
                    rows.append({"what": f"GEMMs of one {model} block, {precision}",
                                 "datasheet": 1e3 * sum(sheet.time(op) for op in ops),
                                 "calibrated": 1e3 * sum(calibrated.time(op) for op in ops), "measured": measured,
                                 "unit": "ms"})
        for name, shape, us, value, unit in c.kernel_lines:
            op = kernel_op(name, shape)
            if op is not None:
                rows.append({"what": f"{name} (bench_kernels, C {shape[2]} T {shape[1]})",
                             "datasheet": 1e6 * sheet.time(op), "measured": us, "unit": "us"})
    runs = {}
    for run in c.train_runs:
        plan = single_gpu_plan(run.shape, run.precision, run.device, run.B, run.T, run.grad_accum)
        timed = run.step_ms[WARMUP_STEPS:]
        row = {"what": f"train {run.shape.name} {run.precision} -b {run.B} -t {run.T} x{run.grad_accum} on {run.device}, "
                       f"ms/step ({os.path.basename(run.path)})",
               "datasheet": predict(plan, Rates(GPUS[run.device]))["step_ms"],
               "measured": sum(timed) / len(timed), "unit": "ms"}
        if c.device is not None:
            row["calibrated"] = predict(plan, Rates(GPUS[run.device], c))["step_ms"]
        rows.append(row)
        runs[(run.shape, run.B, run.T, run.grad_accum, run.device, run.precision)] = row
    for key, fp8 in runs.items():
        bf16 = runs.get(key[:-1] + ("bf16",))
        if key[-1] == "fp8" and bf16 is not None:
            speedup = {k: bf16[k] / fp8[k] for k in ("datasheet", "calibrated", "measured") if k in fp8}
            rows.append({"what": f"train {key[0].name} fp8 / bf16 tokens/s on {key[4]}", **speedup, "unit": "x"})
    return rows


# ------------------------------------------------------------------------------------------------
# What it would take
# ------------------------------------------------------------------------------------------------


def what_it_takes(args, rates_for):
    """Llama-2 7B fp8 on one node of 8 H100 against TARGET_7B_FP8: the time the step must lose (or may
    gain), what each term alone would have to become, and the tokens/s of modeled levers, alone and the
    helpful ones together."""
    shape = PRESETS["llama2-7b"]
    plan = make_plan(args, shape, "fp8", "H100", 1, 8)
    rates = rates_for("H100")
    base = predict(plan, rates)
    must_lose_ms = base["step_ms"] - 1e3 * base["tokens_per_gpu_step"] / TARGET_7B_FP8
    terms = [{"term": c, "ms": base["split_ms"][c], "alone_change": must_lose_ms / base["split_ms"][c]}
             for c in CATEGORIES if base["split_ms"][c] > 0]
    fp8_gemm_speedup = 1.10
    levers = [(f"FP8 GEMMs {fp8_gemm_speedup - 1:.0%} faster", {}, fp8_gemm_speedup),
              ("amax computed by the producing kernels (norms, SwiGLU, their backward)", {"fused_amax": True}, 1.0),
              ("gradients reduce-scattered in BF16", {"grad_reduce": "bf16"}, 1.0),
              # the amax pass delayed scaling saves (Colossal-AI: current scaling within 10% of delayed)
              ("delayed scaling (--fp8-recipe delayed): no amax pass before X, dY casts",
               {"fp8_recipe": "delayed"}, 1.0)]
    if plan.grad_accum % 2 == 0:
        levers.append(("micro-batch 2 (recompute as memory needs)",
                       {"B": 2 * plan.B, "grad_accum": plan.grad_accum // 2}, 1.0))
    rows, helpful, helpful_scale = [], {}, 1.0
    for name, change, gemm_scale in levers:
        result = predict(fit_recompute(replace(plan, **change)), rates.with_gemm_scale("fp8", gemm_scale))
        rows.append({"lever": name, **lever_summary(result)})
        if result["tokens_per_s_per_gpu"] > base["tokens_per_s_per_gpu"] and result["fits"]:
            helpful.update(change)
            helpful_scale *= gemm_scale
    together = predict(fit_recompute(replace(plan, **helpful)), rates.with_gemm_scale("fp8", helpful_scale))
    rows.append({"lever": "the helpful ones together", **lever_summary(together)})
    bf16 = predict(make_plan(args, shape, "bf16", "H100", 1, 8), rates)
    speedup = base["tokens_per_s_per_gpu"] / bf16["tokens_per_s_per_gpu"]
    return {"plan": f"{shape.name} fp8 {plan.label()}", "target": TARGET_7B_FP8, "predicted": base["tokens_per_s_per_gpu"],
            "must_lose_ms": must_lose_ms, "step_ms": base["step_ms"], "terms": terms, "levers": rows,
            "fp8_over_bf16": speedup, "speedup_must_lose_ms": base["step_ms"] * (1 - speedup / TARGET_FP8_SPEEDUP)}


def lever_summary(result):
    return {key: result[key] for key in ("tokens_per_s_per_gpu", "memory_gib", "fits", "recompute")}


# The gradient reductions compared (13B on 2 x 8 H800; 7B beside it, and 13B on one node, where
# the all-to-all crosses no InfiniBand).
GRAD_REDUCE_PLANS = (("llama2-13b", "H800", 2, 8), ("llama2-7b", "H800", 2, 8), ("llama2-13b", "H800", 1, 8))


def grad_reduce_comparison(args, rates_for):
    """fp8 training with each gradient reduction of GRAD_REDUCTIONS on GRAD_REDUCE_PLANS, the other flags
    as given: one row per plan and reduction, the prediction's communication terms; a plan the flags do not
    allow (a global batch its GPUs do not divide, a recompute its depth does not have) is a row with
    "skipped" saying why."""
    rows = []
    for model, gpu, nodes, per_node in GRAD_REDUCE_PLANS:
        for reduction in GRAD_REDUCTIONS:
            try:
                plan = make_plan(argparse.Namespace(**{**vars(args), "grad_reduce": reduction}), PRESETS[model],
                                 "fp8", gpu, nodes, per_node)
            except InputError as e:
                rows.append({"model": model, "gpus": f"{nodes}x{per_node} {gpu}", "grad_reduce": reduction,
                             "skipped": str(e)})
                continue
            r = predict(plan, rates_for(gpu))
            rows.append({key: r[key] for key in (
                "model", "gpus", "zero", "grad_accum", "recompute", "grad_reduce", "grad_reduce_built",
                "grad_wire_bytes_per_element", "grad_inter_node_bytes_per_element_per_nic", "comm_total_ms",
                "grad_reduction_kernels_ms", "comm_exposed_ms", "step_ms", "tokens_per_s_per_gpu")}
                        | {"exposed_share": r["comm_exposed_ms"] / r["step_ms"],
                           "comm_share": r["split_ms"]["comm"] / r["step_ms"]})
    return rows


# ------------------------------------------------------------------------------------------------
# Output
# ------------------------------------------------------------------------------------------------


def markdown_table(header, rows):
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    lines = ["| " + " | ".join(str(h).ljust(w) for h, w in zip(header, widths)) + " |",
             "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(str(x).rjust(w) if i >= 3 else str(x).ljust(w)
                                       for i, (x, w) in enumerate(zip(row, widths))) + " |")
    return "\n".join(lines)


def predictions_table(results):
    header = ["model", "prec", "GPUs", "B", "accum", "ZeRO", "recompute", "mem GiB", "tok/s/GPU", "MFU llm.c",
              "MFU Megatron", "step ms"] + [CATEGORY_TITLES[c] + " %" for c in CATEGORIES]
    rows = []
    for r in results:
        mem = f"{r['memory_gib']:.0f}" + ("" if r["fits"] else " (>)")
        rows.append([r["model"], r["precision"], r["gpus"], r["micro_batch"], r["grad_accum"], r["zero"], r["recompute"],
                     mem, f"{r['tokens_per_s_per_gpu']:,.0f}", f"{r['mfu_llmc']:.1%}", f"{r['mfu_megatron']:.1%}",
                     f"{r['step_ms']:,.0f}"] + [f"{100 * r['split_ms'][c] / r['step_ms']:.1f}" for c in CATEGORIES])
    return markdown_table(header, rows)


def print_report(results, calibration, comparison, takes, args):
    source = "datasheet rates"
    if calibration is not None and calibration.device is not None:
        source = f"rates calibrated on {calibration.device} where measured, datasheet elsewhere"
    print(f"llm8 performance model: one training step op by op ({source}); assumptions at the top of "
          f"scripts/perf_model.py")
    print(f"seq {args.seq_len}, global batch {args.global_batch:,} tokens; ZeRO-1 for 7B, ZeRO-2 for 13B "
          f"unless --zero; collectives {'overlapped' if not args.no_overlap else 'not overlapped'}; "
          f"{args.nics_per_node}x {args.nic_gbits:g} Gb/s NICs per node; gradients reduced in {args.grad_reduce}, "
          f"AdamW moments in {args.optim_state}, gradient buffer in {args.grad_buffer}, master weights in "
          f"{args.master_weights}")
    print("MFU: model FLOPs/token x tokens/s over the precision's dense peak (FP8 peak for fp8, as the trainer "
          "reports it); llm.c: 6N + 12LCT; Megatron: 6L(hQKV + h^2 + 3hF + 2sh) + 6hV")
    print("step split, % of the step: GEMM (all linear layers), attn (cuDNN SDPA), mem (norms, RoPE, SwiGLU, residual,"
          " embedding, classifier), cast (FP8 amax + cast-transpose of X, dY, W), optim (zeroing, norm, AdamW, "
          "weight refresh, a bf16/fp8 gradient buffer's and an fp16 master's stores and decodes), comm (exposed collectives + overlap slowdown + a bf16/fp8 reduction's conversion kernels), "
          "other (launch gaps, host syncs); "
          "mem GiB (>) = does not fit\n")
    print(predictions_table(results))
    print()
    for r in results:
        if r["model"] == "llama2-13b" and r["precision"] == "fp8":
            verdict = "meets" if r["tokens_per_s_per_gpu"] >= TARGET_13B_FP8 else "below"
            print(f"13B fp8 on {r['gpus']}: {r['tokens_per_s_per_gpu']:,.0f} tokens/s/GPU, {verdict} the "
                  f"{TARGET_13B_FP8:,.0f} target")
    for fp8 in (r for r in results if r["precision"] == "fp8"):
        bf16 = [r for r in results if r["precision"] == "bf16" and r["model"] == fp8["model"] and r["gpus"] == fp8["gpus"]]
        if bf16:
            print(f"fp8 / bf16, {fp8['model']} on {fp8['gpus']}: "
                  f"{fp8['tokens_per_s_per_gpu'] / bf16[0]['tokens_per_s_per_gpu']:.2f}x (target {TARGET_FP8_SPEEDUP}x)")
    if calibration is not None:
        print("\n== Calibration")
        for path, found in calibration.files:
            print(f"{path}: {', '.join(found)}")
        replaced = replaced_rates(calibration)
        print(f"replaced datasheet rates ({len(replaced)}, measured on {calibration.device}):" if replaced
              else "no rate replaced")
        for line in replaced:
            print(f"  {line}")
        if comparison:
            print("\n== Predicted vs measured on one GPU (datasheet: the model before calibration; calibrated: with "
                  "the measured rates; the ratio takes the calibrated prediction where there is one)")
            rows = []
            for c in comparison:
                fmt = "{:,.2f}" if c["unit"] == "x" else "{:,.1f}"
                rows.append([c["what"], fmt.format(c["datasheet"]),
                             fmt.format(c["calibrated"]) if "calibrated" in c else "-", fmt.format(c["measured"]),
                             c["unit"], f"{c.get('calibrated', c['datasheet']) / c['measured']:.2f}"])
            print(markdown_table(["what", "datasheet", "calibrated", "measured", "unit", "predicted/measured"], rows))
    print_what_it_takes(takes)


def print_what_it_takes(t):
    print(f"\n== What it would take: {t['plan']}, target {t['target']:,.0f} tokens/s/GPU")
    gap = t["must_lose_ms"]
    if gap > 0:
        print(f"predicted {t['predicted']:,.0f}: the {t['step_ms']:,.0f} ms step must lose {gap:,.0f} ms "
              f"({gap / t['step_ms']:.1%}). One term alone would have to shrink by:")
    else:
        print(f"predicted {t['predicted']:,.0f}: meets it with {-gap:,.0f} ms of the {t['step_ms']:,.0f} ms step to "
              f"spare. One term alone could grow by this much before it does not:")
    for term in t["terms"]:
        change = term["alone_change"]
        need = "cannot alone" if change >= 1 else f"{abs(change):.0%}"
        print(f"  {CATEGORY_TITLES[term['term']]:6} {term['ms']:8,.0f} ms  {need}")
    print("levers (modeled), tokens/s/GPU:")
    for lever in t["levers"]:
        fits = "" if lever["fits"] else f", does not fit: {lever['memory_gib']:.0f} GiB"
        print(f"  {lever['lever']:72} {lever['tokens_per_s_per_gpu']:8,.0f}  (recompute {lever['recompute']}{fits})")
    line = f"fp8 / bf16 on this plan: {t['fp8_over_bf16']:.2f}x (target {TARGET_FP8_SPEEDUP}x)"
    if t["speedup_must_lose_ms"] > 0:
        line += f"; for {TARGET_FP8_SPEEDUP}x the fp8 step must lose {t['speedup_must_lose_ms']:,.0f} ms (bf16 as it is)"
    print(line)


def print_grad_reduce_comparison(rows):
    print("\n== Gradient reduction, fp8 training (every multi-GPU row models the trainer's collectives)")
    print("wire B/el: bytes per gradient element sent (fp8: E4M3 + one FP32 scale per 4096-element chunk; ZeRO-0 adds "
          "an FP32 all-gather); IB B/el/NIC: bytes per element each NIC sends out of the node; comm stream: link time "
          "+ the reduction's kernels (BF16 conversions, FP8 quantize and dequantize-and-sum); exposed: comm stream "
          "past compute; comm %: exposed + the cost of what overlaps")
    table, skipped = [], set()
    for r in rows:
        if "skipped" in r:
            if (r["model"], r["gpus"]) not in skipped:  # the same reason for every reduction
                print(f"skipped {r['model']} on {r['gpus']}: {r['skipped']}")
                skipped.add((r["model"], r["gpus"]))
            continue
        wire = f"{r['grad_wire_bytes_per_element']:.2f}"
        if r["grad_reduce"] == "fp8" and r["zero"] == 0:
            wire += f"+{ZERO0_FP8_GATHER_BYTES}"
        table.append([r["model"], r["gpus"], r["grad_reduce"], r["zero"], wire,
                      f"{r['grad_inter_node_bytes_per_element_per_nic']:.3f}", f"{r['comm_total_ms']:,.0f}",
                      f"{r['grad_reduction_kernels_ms']:,.0f}", f"{r['comm_exposed_ms']:,.0f}",
                      f"{r['exposed_share']:.1%}", f"{r['comm_share']:.1%}", f"{r['step_ms']:,.0f}",
                      f"{r['tokens_per_s_per_gpu']:,.0f}"])
    print(markdown_table(["model", "GPUs", "reduce", "ZeRO", "wire B/el", "IB B/el/NIC", "comm stream ms",
                          "of it kernels ms", "exposed ms", "exposed %", "comm %", "step ms", "tok/s/GPU"], table))


def assumptions():
    return {"gemm_efficiency": {f"{p} {k}": v for (p, k), v in GEMM_EFFICIENCY.items()},
            "attention_efficiency": ATTENTION_EFFICIENCY, "hbm_efficiency": HBM_EFFICIENCY,
            "nvlink_efficiency": NVLINK_EFFICIENCY, "nic_efficiency": NIC_EFFICIENCY,
            "collective_latency_s": COLLECTIVE_LATENCY_S, "comm_overlap_slowdown": COMM_OVERLAP_SLOWDOWN,
            "comm_kernel_overlap_cost": COMM_KERNEL_OVERLAP_COST, "grad_wire_bytes": GRAD_WIRE_BYTES,
            "zero_chunk": ZERO_CHUNK, "chunk_scale_bytes": CHUNK_SCALE_BYTES,
            "zero0_fp8_gather_bytes": ZERO0_FP8_GATHER_BYTES,
            "kernel_gap_s": KERNEL_GAP_S, "host_sync_s": HOST_SYNC_S, "memory_overhead_gib": MEMORY_OVERHEAD_GIB,
            "gpus": {k: vars(g) for k, g in GPUS.items()}}


def parse_args(argv):
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="llama2-7b,llama2-13b", help=f"comma-separated, of {', '.join(PRESETS)}")
    p.add_argument("--precisions", default="bf16,fp8", help="comma-separated: bf16, fp8")
    p.add_argument("--gpus", default="H100,H800", help=f"comma-separated, of {', '.join(GPUS)}")
    p.add_argument("--topologies", default="1x8,2x8", help="comma-separated NODESxGPUS_PER_NODE")
    p.add_argument("-b", "--micro-batch", type=int, default=DEFAULT_MICRO_BATCH, help="sequences per GPU per micro-step")
    p.add_argument("-t", "--seq-len", type=int, default=DEFAULT_SEQ_LEN)
    p.add_argument("--global-batch", type=int, default=DEFAULT_GLOBAL_BATCH_TOKENS, help="tokens per optimizer step")
    p.add_argument("--zero", default="auto", choices=["auto", "0", "1", "2"], help="auto: 1 for 7B, 2 for 13B")
    p.add_argument("--recompute", default="auto",
                   help="auto (the least that fits the GPU's memory), none, cheap (bf16), full, full:K (first K blocks)")
    p.add_argument("--grad-reduce", default="fp32",
                   help="gradient reduction: fp32 or bf16 (the trainer's NCCL ring reduce-scatter / all-reduce), "
                        "fp8 (E4M3 pieces with their own scales by all-to-all, summed in FP32)")
    p.add_argument("--weight-gather", default="e4m3", choices=["bf16", "e4m3"],
                   help="all-gather of the updated weights in fp8 rows: linear weights as E4M3, or all as BF16 "
                        "(bf16 rows gather BF16)")
    p.add_argument("--optim-state", default="fp32", choices=list(MOMENT_BYTES),
                   help="AdamW moments as the trainer's --optim-state stores them: fp32 (8 bytes per parameter), "
                        "bf16 (4), fp8 (E4M3 m and FP16 v with per-chunk scales: 3)")
    p.add_argument("--grad-buffer", default="fp32", choices=list(GRAD_BUFFER_CODEC),
                   help="gradients accumulated over micro-steps as the trainer's --grad-buffer stores them: fp32 (4 "
                        "bytes per parameter), bf16 (2), fp8 (E4M3 with per-chunk scales: 1); bf16 and fp8 add FP32 "
                        "bucket buffers and a requantizing add per bucket and micro-step; ZeRO-1, or ZeRO-0 on one GPU")
    p.add_argument("--master-weights", default="fp32", choices=list(MASTER_CODEC),
                   help="master weights as the trainer's --master-weights stores them: fp32 (4 bytes per parameter of "
                        "the shard), fp16 (2, with per-chunk scales; decoded 2-3 times and stored once per step)")
    p.add_argument("--no-overlap", action="store_true", help="collectives do not overlap compute")
    p.add_argument("--nics-per-node", type=int, default=DEFAULT_NICS_PER_NODE)
    p.add_argument("--nic-gbits", type=float, default=DEFAULT_NIC_GBITS, help="Gb/s per NIC")
    p.add_argument("--calibrate", nargs="+", metavar="PATH", help="device check logs: files or directories")
    p.add_argument("--measured-on", default="auto", choices=["auto", *GPUS], help="the GPU the calibration ran on")
    p.add_argument("--json", action="store_true", help="print JSON instead of the report")
    args = p.parse_args(argv)
    for flag, value in (("--micro-batch", args.micro_batch), ("--seq-len", args.seq_len),
                        ("--global-batch", args.global_batch), ("--nics-per-node", args.nics_per_node)):
        if value < 1:
            p.error(f"argument {flag}: {value} is not a positive integer")
    if not args.nic_gbits > 0:
        p.error(f"argument --nic-gbits: {args.nic_gbits} is not positive")
    if not re.fullmatch(r"auto|none|cheap|full(:\d+)?", args.recompute):
        p.error(f"argument --recompute: '{args.recompute}' is not auto, none, cheap, full or full:K")
    return args


def split_list(flag, text, known):
    items = [x.strip() for x in text.split(",") if x.strip()]
    for x in items:
        if x not in known:
            raise InputError(f"flag {flag}: unknown '{x}' (known: {', '.join(known)})")
    if not items:
        raise InputError(f"flag {flag}: empty list")
    return items


def main(argv=None):
    args = parse_args(argv)
    try:
        if args.grad_reduce not in GRAD_REDUCTIONS:
            raise InputError(f"flag --grad-reduce: '{args.grad_reduce}' is not {', '.join(GRAD_REDUCTIONS[:-1])} "
                             f"or {GRAD_REDUCTIONS[-1]}")
        models = split_list("--models", args.models, PRESETS)
        precisions = split_list("--precisions", args.precisions, ("bf16", "fp8"))
        gpus = split_list("--gpus", args.gpus, GPUS)
        topologies = [parse_topology(t.strip()) for t in args.topologies.split(",") if t.strip()]
        calibration = parse_calibration(args.calibrate, args.measured_on) if args.calibrate else None
        calibrated = calibration if calibration is not None and calibration.device is not None else None

        def rates_for(gpu):
            return Rates(GPUS[gpu], calibrated)

        results = [predict(make_plan(args, PRESETS[m], p, g, nodes, per_node), rates_for(g))
                   for g in gpus for m in models for nodes, per_node in topologies for p in precisions]
        comparison = measured_vs_predicted(calibration) if calibration is not None else []
        takes = what_it_takes(args, rates_for)
        reductions = grad_reduce_comparison(args, rates_for)
    except InputError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2
    if args.json:
        out = {"assumptions": assumptions(), "predictions": results, "measured_vs_predicted": comparison,
               "what_it_takes": takes, "grad_reduce_comparison": reductions}
        if calibration is not None:
            out["calibration"] = {"device": calibration.device,
                                  "files": [{"path": p, "found": f} for p, f in calibration.files],
                                  "replaced": replaced_rates(calibration)}
        json.dump(out, sys.stdout, indent=1)
        print()
    else:
        print_report(results, calibration, comparison, takes, args)
        print_grad_reduce_comparison(reductions)
    return 0


if __name__ == "__main__":
    sys.exit(main())
