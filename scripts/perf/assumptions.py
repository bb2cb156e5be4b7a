"""Every assumption the predictions rest on, with where it comes from: GPU peaks, link speeds, efficiencies
per kind of op, latencies and how collectives overlap compute. Facts of the trainer (which ops run, their
shapes and bytes, bucket counts, sync counts, memory) are not here: scripts/perf/step.py reads them from
the trainer's own `--dry-run 1` and `--dry-run 2` output."""
from dataclasses import dataclass


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
# cuDNN flash attention (BF16, causal, head dim 128, sequence 4096), as a fraction of the BF16 peak of
# the FLOPs the trainer's record counts (causal, backward 2.5 x forward, as bench_kernels counts them).
# FlashAttention-3 (Shah et al. 2024) reaches 60-75% of the H100's BF16 peak forward at long sequences,
# less with a causal mask at 4k and less backward; cuDNN's SDPA is in the same class. We take 55% / 45%.
ATTENTION_EFFICIENCY = {"forward": 0.55, "backward": 0.45}
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
# A reduction over the host (MPI on host memory: the loss and norm scalars) costs a round trip per call.
HOST_COLLECTIVE_S = 30e-6
# While a collective runs beside compute it takes SMs (NCCL's channels, capped) and HBM bandwidth from the
# kernels it overlaps: those kernels are taken to run this fraction slower.
COMM_OVERLAP_SLOWDOWN = 0.08

# The GPU build's wire conversions (comm/comm_nccl.cuh) are not in the trainer's op list (the CPU build,
# which lists the step, converts inside its MPI code): the model adds them to each BF16 or FP8-wire
# reduce-scatter on the communication stream, as HBM-bound kernels over the bucket of n FP32 gradients,
# bytes per element read and written: bf16: to BF16 (4 + 2) and the store of the rank's piece (2 + 4, + 4
# read when accumulating); fp8: the chunk amax (4), the cast to E4M3 (4 + 1) and the dequantize-and-sum of
# the rank's piece (1 per element of the bucket + 4 written, + 4 read when accumulating). Beside compute
# they take the same SMs and HBM, so they delay it by their whole duration (not hidden like a transfer).
# (bytes per bucket element, per piece element, + per piece element when accumulating)
WIRE_KERNEL_BYTES = {"bf16": (6.0, 6.0, 4.0), "fp8": (9.0, 4.0, 4.0)}
WIRE_KERNEL_OVERLAP_COST = 1.0

# Host-side costs. Back-to-back kernels on one stream leave a gap of ~1 us when the host runs ahead; each
# blocking copy (a synchronization) drains the stream and then refills it. Copies between host and device
# at PCIe Gen5 x16 (64 GB/s per direction, ~50 in practice); host reductions (sum_f64: summing partial
# sums on the CPU) at one core's streaming rate, ~10 GB/s.
KERNEL_GAP_S = 1.0e-6
HOST_SYNC_S = 20e-6
PCIE_BYTES_S = 50e9
HOST_REDUCE_BYTES_S = 10e9

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
TARGET_FP8_SPEEDUP = 1.45
# Steps a trainer log's mean leaves out: cuBLASLt's heuristics and cuDNN's plans are built in the first
# ones (scripts/device_check.sh does the same).
WARMUP_STEPS = 2


def summary():
    """The assumptions as one JSON-able dict (the report's --json)."""
    return {"gemm_efficiency": {f"{p} {k}": v for (p, k), v in GEMM_EFFICIENCY.items()},
            "attention_efficiency": ATTENTION_EFFICIENCY, "hbm_efficiency": HBM_EFFICIENCY,
            "nvlink_efficiency": NVLINK_EFFICIENCY, "nic_efficiency": NIC_EFFICIENCY,
            "collective_latency_s": COLLECTIVE_LATENCY_S, "host_collective_s": HOST_COLLECTIVE_S,
            "comm_overlap_slowdown": COMM_OVERLAP_SLOWDOWN, "wire_kernel_bytes": WIRE_KERNEL_BYTES,
            "wire_kernel_overlap_cost": WIRE_KERNEL_OVERLAP_COST, "kernel_gap_s": KERNEL_GAP_S,
            "host_sync_s": HOST_SYNC_S, "pcie_bytes_s": PCIE_BYTES_S, "host_reduce_bytes_s": HOST_REDUCE_BYTES_S,
            "gpus": {k: vars(g) for k, g in GPUS.items()}}
