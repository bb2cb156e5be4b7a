"""
Tests of scripts/perf_model.py, the performance model of a training step.

Run from the repo root: python -m pytest dev/test/test_perf_model.py. FLOP counts are checked against
sums written out here matmul by matmul for a tiny config, the ring and all-to-all formulas and the
gradient reductions' bytes against cases computed by hand, calibration against sample logs this file writes in the device check's formats (random measured
rates from a seed printed by each test; set LLM8_TEST_SEED to replay one), and the predictions against
orderings that must hold whatever the rates.
"""
import importlib.util
import json
import math
import os
import secrets
import subprocess
import sys
import tarfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "perf_model.py"


def load_perf_model():
    spec = importlib.util.spec_from_file_location("perf_model", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


pm = load_perf_model()
# A tiny GQA config: C 64, L 2, 4 heads of 16, 2 kv heads, ffn 96, vocab 128; sequence 32.
TINY = pm.Shape("tiny-test", C=64, L=2, NH=4, NKV=2, F=96, V=128)
TINY_T = 32


@pytest.fixture
def rng():
    seed = int(os.environ.get("LLM8_TEST_SEED", secrets.randbits(32)))
    print(f"LLM8_TEST_SEED={seed}")
    return np.random.default_rng(seed)


def run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True, cwd=REPO)


def plan(shape=TINY, precision="fp8", gpu="H100", nodes=1, per_node=1, B=1, T=TINY_T, accum=1, zero=0, **kw):
    p = pm.Plan(shape=shape, precision=precision, gpu=gpu, nodes=nodes, gpus_per_node=per_node, B=B, T=T,
                grad_accum=accum, zero=zero, recompute="none", recompute_layers=0, grad_reduce="fp32",
                weight_gather="e4m3" if precision == "fp8" else "bf16", overlap=True, nics_per_node=8,
                nic_bytes_s=50e9)
    return replace(p, **kw)


# --- FLOP counts ------------------------------------------------------------------------------------

def test_llmc_flops_tiny_by_hand():
    # parameters without the embedding, tensor by tensor (docs/formats.md "Model checkpoint"), HS 16, KVC 32:
    # per layer attn_norm 64 + wqkv (64+2*32)*64 = 8192 + wo 64*64 = 4096 + ffn_norm 64
    #   + w13 2*96*64 = 12288 + w2 64*96 = 6144 = 30848; two layers 61696; + norm 64 + output 128*64 = 8192
    n = 61696 + 64 + 8192
    assert n == 69952
    expected = 6 * 69952 + 12 * 2 * 64 * 32  # 419712 + 49152
    assert pm.flops_per_token_llmc(TINY, TINY_T) == expected == 468864


def test_megatron_flops_tiny_matmul_by_matmul():
    # one forward pass over a sequence of T tokens, every matmul 2 m n k, attention full T x T as
    # Megatron counts it; backward twice the forward
    C, L, NH, NKV, F, V, T = 64, 2, 4, 2, 96, 128, TINY_T
    HS = C // NH
    forward = 0
    for _ in range(L):
        for out_features in (C, NKV * HS, NKV * HS):  # q, k, v
            forward += 2 * T * C * out_features
        forward += NH * 2 * T * T * HS  # Q K^T per head
        forward += NH * 2 * T * T * HS  # P V per head
        forward += 2 * T * C * C  # o
        forward += 2 * T * C * F * 2  # gate and up
        forward += 2 * T * F * C  # down
    forward += 2 * T * C * V  # logits
    assert pm.flops_per_token_megatron(TINY, T) == pytest.approx(3 * forward / T, rel=1e-12)


def test_megatron_formula_reduces_to_gpt():
    # QKV = 3h and a two-matrix 4h MLP (6 h F = 16 h^2 with F = 8h/3): Narayanan et al.'s GPT formula
    h, L, V, s = 768 * 3, 12, 51200, 2048
    gpt_like = pm.Shape("gpt", C=h, L=L, NH=12, NKV=12, F=8 * h // 3, V=V)
    megatron = 72 * L * h * h * (1 + s / (6 * h) + V / (12 * h * L))
    assert pm.flops_per_token_megatron(gpt_like, s) == pytest.approx(megatron, rel=1e-12)


def test_micro_step_flops_tiny():
    # GEMMs: every linear layer (the four of each block and the output layer) costs 2 N params forward and
    # twice that backward; attention forward is half of 4 B NH T^2 HS (causal), backward 2.5x that
    B, T = 2, TINY_T
    N = B * T
    linear = 2 * (8192 + 4096 + 12288 + 6144) + 128 * 64
    p = plan(B=B, T=T)
    ops = [op for seg in (lambda m: m.forward + m.backward)(pm.micro_step_ops(p)) for op in seg]
    gemm = sum(op.flops for op in ops if op.gemm is not None)
    attention = sum(op.flops for op in ops if op.attention is not None)
    assert gemm == 3 * 2 * N * linear
    assert attention == 2 * (2 * B * 4 * T * T * 16) * (1 + 2.5)
    fp8_gemms = [op for op in ops if op.gemm is not None and op.gemm[0] == "fp8"]
    assert len(fp8_gemms) == 2 * 4 * 3  # the output layer stays BF16


# The step's GEMMs and attention against the trainer's own list of them (train_llama_cpu --dry-run 2,
# docs/performance.md#the-steps-ops): every GEMM's (precision, m, n, k) with its count, its bytes, and the
# attention FLOPs of a step must be the same. The memory-bound ops, host syncs and collectives are the
# model's own still (the trainer's list differs there: docs/performance.md).
def model_step_work(p):
    gemms, attention = {}, 0.0
    for ops, times in ((pm.micro_step_ops(p), p.grad_accum - 1), (pm.micro_step_ops(p, last=True), 1)):
        for op in (op for seg in ops.forward + ops.backward for op in seg):
            if op.gemm is not None:
                key = (op.gemm[0], *op.gemm[2:], op.bytes)
                gemms[key] = gemms.get(key, 0) + times
            attention += times * op.flops if op.attention is not None else 0.0
    return gemms, attention


def trainer_step_work(trainer, p):
    args = ["--dry-run", 2, "-e", p.shape.name, "-b", p.B, "-t", p.T, "-p", p.precision, "-z", p.zero, "--ranks", p.world,
            "-d", p.grad_accum * p.B * p.T * p.world, "-r", 0]
    r = subprocess.run([str(trainer), *map(str, args)], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stderr
    ops = json.loads([line for line in r.stdout.splitlines() if line.startswith("ops: ")][0][len("ops: "):])["ops"]
    gemms, attention = {}, 0.0
    for o in ops:
        if o["kind"] == "gemm":
            key = ("fp8" if "E4M3" in o["detail"] else "bf16", *o["shape"][:3], o["read"] + o["write"])
            gemms[key] = gemms.get(key, 0) + o["count"]
        attention += o["count"] * o["flops"] if o["op"].startswith("attention") else 0.0
    return gemms, attention


@pytest.mark.parametrize("model, precision, zero", [("llama2-7b", "fp8", 1), ("llama2-13b", "bf16", 2)])
def test_gemms_and_attention_are_the_trainers(trainer, model, precision, zero):
    p = plan(shape=pm.PRESETS[model], precision=precision, per_node=8, T=4096, accum=4, zero=zero)
    assert model_step_work(p) == trainer_step_work(trainer, p)
    # planted: a model that forgets one GEMM of a step differs
    gemms, attention = model_step_work(p)
    first = next(iter(gemms))
    assert ({**gemms, first: gemms[first] - 1}, attention) != trainer_step_work(trainer, p)


# --- collectives ----------------------------------------------------------------------------------

def test_ring_time_by_hand():
    # 8 ranks, a 2 GB buffer, bus bandwidth 100 GB/s, latency 30 us:
    # reduce-scatter / all-gather: 2e9 * 7/8 / 1e11 = 17.5 ms; all-reduce twice that: 35 ms
    assert pm.ring_time("reduce_scatter", 2e9, 8, 100e9, 30e-6) == pytest.approx(0.0175 + 30e-6, rel=1e-12)
    assert pm.ring_time("all_gather", 2e9, 8, 100e9, 30e-6) == pytest.approx(0.0175 + 30e-6, rel=1e-12)
    assert pm.ring_time("all_reduce", 2e9, 8, 100e9, 30e-6) == pytest.approx(0.035 + 30e-6, rel=1e-12)
    assert pm.ring_time("all_reduce", 2e9, 1, 100e9, 30e-6) == 0.0
    with pytest.raises(ValueError):
        pm.ring_time("broadcast", 2e9, 8, 100e9, 30e-6)


def test_bus_bandwidth():
    # NVLink 900 / 400 GB/s both ways -> 450 / 200 per direction; across nodes, 8 NICs of 50 GB/s
    eff, nic = pm.NVLINK_EFFICIENCY, pm.NIC_EFFICIENCY
    assert pm.bus_bandwidth(plan(gpu="H100", per_node=8)) == pytest.approx(450e9 * eff)
    assert pm.bus_bandwidth(plan(gpu="H800", per_node=8)) == pytest.approx(200e9 * eff)
    assert pm.bus_bandwidth(plan(gpu="H800", nodes=2, per_node=8)) == pytest.approx(min(200e9 * eff, 400e9 * nic))
    slow_nics = plan(gpu="H100", nodes=2, per_node=8, nics_per_node=1)
    assert pm.bus_bandwidth(slow_nics) == pytest.approx(50e9 * nic)


def test_overlap_helpers():
    # buckets ready at 1, 2, 3 s taking 0.5 s each: the stream ends at 3.5 s, 0.5 s after compute's 3 s
    assert pm.fifo_exposed([1, 2, 3], [0.5, 0.5, 0.5], 3.0) == pytest.approx(0.5)
    # a slow first bucket: the others queue behind it: ends at 1 + 3 + 0.5 + 0.5 = 5 s
    assert pm.fifo_exposed([1, 2, 3], [3, 0.5, 0.5], 3.0) == pytest.approx(2.0)
    # gathers of 1 s ahead of 0.5 s segments: segment i starts at i + 1, the forward ends at 3.5 s, not 1.5
    assert pm.gated_delay([1, 1, 1], [0.5, 0.5, 0.5]) == pytest.approx(2.0)
    assert pm.gated_delay([0.1, 0.1], [1, 1]) == pytest.approx(0.1)


# --- gradient reductions (--grad-reduce fp32 | bf16 | fp8) ----------------------------------------------

def test_all_to_all_time_by_hand():
    # 2 nodes x 4 GPUs (W 8), 1.6 GB per rank in 8 pieces of 0.2 GB, NVLink 100 GB/s per direction, the
    # node's NICs 80 GB/s together, latency 30 us. Off-node: each GPU sends 4 pieces, the node 16 pieces
    # = 3.2 GB through its NICs: 40 ms. NVLink: 3 on-node pieces + 3 forwarded to the other node's rails
    # (PXN) = 1.2 GB: 12 ms. The NICs set it: 40 ms.
    assert pm.all_to_all_time(1.6e9, 2, 4, 100e9, 80e9, 30e-6) == pytest.approx(0.040 + 30e-6, rel=1e-12)
    # NVLink-bound when the NICs are fast: 2 x 3 pieces of 0.2 GB over 100 GB/s = 12 ms
    assert pm.all_to_all_time(1.6e9, 2, 4, 100e9, 1e15, 0.0) == pytest.approx(0.012, rel=1e-12)
    # one node of 8: 7 pieces of 0.2 GB over NVLink, 14 ms, what the ring reduce-scatter of the buffer takes
    assert pm.all_to_all_time(1.6e9, 1, 8, 100e9, 80e9, 0.0) == pytest.approx(0.014, rel=1e-12)
    assert pm.all_to_all_time(1.6e9, 1, 8, 100e9, 80e9, 0.0) == pytest.approx(
        pm.ring_time("reduce_scatter", 1.6e9, 8, 100e9, 0.0), rel=1e-12)
    assert pm.all_to_all_time(1.6e9, 1, 1, 100e9, 80e9, 30e-6) == 0.0


def test_grad_wire_and_inter_node_bytes_by_hand():
    # 2 x 8 GPUs, 8 NICs per node, a bucket of 16 M elements
    p = plan(nodes=2, per_node=8, zero=1)
    elements = 16 * 2**20
    assert pm.grad_wire_bytes_per_element(p, elements) == 4
    assert pm.grad_wire_bytes_per_element(replace(p, grad_reduce="bf16"), elements) == 2
    # fp8: 1 byte, and one 4-byte scale per 4096-element chunk (comm/grad_fp8.h): pieces of 1 M elements
    # are 256 whole chunks each
    assert pm.grad_wire_bytes_per_element(replace(p, grad_reduce="fp8"), elements) == pytest.approx(1 + 4 / 4096,
                                                                                                    rel=1e-12)
    # a bucket of 16 x 4097 elements: pieces of 4097, two chunks each (rounded up per piece)
    assert pm.grad_wire_bytes_per_element(replace(p, grad_reduce="fp8"), 16 * 4097) == pytest.approx(
        1 + 16 * 2 * 4 / (16 * 4097), rel=1e-12)
    # per NIC out of the node, per element: a ring reduce-scatter 15/16 of the buffer over 8 NICs; an
    # all-reduce twice that; the all-to-all 8 GPUs x 8 off-node pieces of 1/16 over 8 NICs = 1/2
    assert pm.inter_node_bytes_per_element(p) == pytest.approx(4 * 15 / 16 / 8)
    assert pm.inter_node_bytes_per_element(replace(p, grad_reduce="bf16")) == pytest.approx(2 * 15 / 16 / 8)
    assert pm.inter_node_bytes_per_element(replace(p, grad_reduce="bf16", zero=0)) == pytest.approx(2 * 2 * 15 / 16 / 8)
    assert pm.inter_node_bytes_per_element(replace(p, grad_reduce="fp8")) == pytest.approx(0.5)
    # ZeRO-0 adds the ring all-gather of the sums, in FP32 (comm/comm_nccl.cuh comm_all_reduce)
    assert pm.inter_node_bytes_per_element(replace(p, grad_reduce="fp8", zero=0)) == pytest.approx(0.5 + 4 * 15 / 16 / 8)
    assert pm.inter_node_bytes_per_element(replace(p, nodes=1, grad_reduce="fp8")) == 0.0


def test_grad_reduction_kernels_by_hand():
    # W 16, a bucket of 16 M elements, chunk n = 1 M
    p = plan(nodes=2, per_node=8, zero=2)
    elements, n = 16 * 2**20, 2**20

    def kernel_bytes(**kw):
        return sum(op.bytes for op in pm.reduction_kernel_ops(replace(p, **kw), elements))

    assert kernel_bytes() == 0  # fp32: NCCL reduces in its buffers
    # bf16: FP32 -> BF16 of the bucket (4 + 2), the chunk's BF16 added into the FP32 shard (2 + 4 + 4)
    assert kernel_bytes(grad_reduce="bf16") == 6 * elements + 10 * n
    assert kernel_bytes(grad_reduce="bf16", zero=1) == 6 * elements + 6 * n
    # fp8: amax (4) and cast (4 + 1) of the bucket; the 16 E4M3 pieces of the rank's piece and their scales
    # read (16 pieces x 256 chunks x 4 bytes), the FP32 shard read and written (ZeRO-2) or written (ZeRO-1)
    scales = 16 * 256 * 4
    assert kernel_bytes(grad_reduce="fp8") == 9 * elements + elements + scales + 8 * n
    assert kernel_bytes(grad_reduce="fp8", zero=1) == 9 * elements + elements + scales + 4 * n
    # ZeRO-0: the bucket copied into the padded scratch and back (4 + 4 each way), the sums written as FP32
    assert kernel_bytes(grad_reduce="fp8", zero=0) == 8 * elements + 9 * elements + elements + scales + 4 * n + 8 * elements
    # at the model's HBM efficiency, on the communication stream after the link time
    rates = pm.Rates(pm.GPUS["H800"])
    link, kernels = pm.reduction_time(replace(p, gpu="H800", grad_reduce="fp8"), elements, rates)
    assert kernels == pytest.approx(kernel_bytes(grad_reduce="fp8") / (pm.HBM_EFFICIENCY * 3.35e12))
    nvlink, nics = 200e9 * pm.NVLINK_EFFICIENCY, 8 * 50e9 * pm.NIC_EFFICIENCY
    assert nics == pytest.approx(320e9)
    assert link == pytest.approx(pm.all_to_all_time(elements + scales, 2, 8, nvlink, nics, pm.COLLECTIVE_LATENCY_S["inter"]))
    link0, _ = pm.reduction_time(replace(p, gpu="H800", grad_reduce="fp8", zero=0), elements, rates)
    bus = pm.bus_bandwidth(replace(p, gpu="H800"))
    assert bus == pytest.approx(160e9)  # NVLink-bound ring
    # ZeRO-0's all-gather of the sums is FP32: 4 bytes per element, 15/16 of the bucket over the ring
    assert link0 == pytest.approx(link + 40e-6 + 4 * elements * 15 / 16 / 160e9)


def grad_reduce_results(nodes, shape="llama2-13b", gpu="H800", **kw):
    """13B fp8 ZeRO-2 (7B: ZeRO-1) on nodes x 8 GPUs, 128 sequences of 4096 per step, each reduction."""
    s = pm.PRESETS[shape]
    base = dict(shape=s, precision="fp8", gpu=gpu, nodes=nodes, per_node=8, T=4096, accum=16 // nodes,
                zero=pm.ZERO_STAGE_OF[shape], **kw)
    return {g: pm.predict(plan(grad_reduce=g, **base), pm.Rates(pm.GPUS[gpu])) for g in pm.GRAD_REDUCTIONS}


def test_grad_reduce_orderings_13b_h800():
    two, one = grad_reduce_results(2), grad_reduce_results(1)
    # fewer bytes never expose more than FP32 does
    for r in (two, one):
        assert r["fp8"]["comm_exposed_ms"] <= r["fp32"]["comm_exposed_ms"]
        assert r["bf16"]["comm_exposed_ms"] <= r["fp32"]["comm_exposed_ms"]
        assert r["fp32"]["grad_reduction_kernels_ms"] == 0
        assert 0 < r["bf16"]["grad_reduction_kernels_ms"] < r["fp8"]["grad_reduction_kernels_ms"]
    # one node: the all-to-all moves what the ring moves per byte, so a quarter / half of FP32 / BF16's time
    assert one["fp8"]["comm_exposed_ms"] <= one["bf16"]["comm_exposed_ms"] <= one["fp32"]["comm_exposed_ms"]
    # two nodes: the all-to-all sends half of each bucket through the NICs (a ring 15/16 over 8 NICs), so
    # per element its 1 byte over a 40 GB/s NIC (0.5 / 40e9) takes longer than BF16's ring over NVLink
    # (2 x 15/16 / 160e9): this is why fp8 does not beat bf16 on 2 x 8 H800
    layer = pm.PRESETS["llama2-13b"].layer_params()
    p = plan(shape=pm.PRESETS["llama2-13b"], gpu="H800", nodes=2, per_node=8, zero=2)
    rates = pm.Rates(pm.GPUS["H800"])
    fp8_link = pm.reduction_time(replace(p, grad_reduce="fp8"), layer, rates)[0] - 40e-6
    bf16_link = pm.reduction_time(replace(p, grad_reduce="bf16"), layer, rates)[0] - 40e-6
    assert fp8_link == pytest.approx(layer * (1 + 4 / 4096) * 0.5 / 40e9, rel=1e-4)
    assert bf16_link == pytest.approx(layer * 2 * 15 / 16 / 160e9, rel=1e-9)
    assert fp8_link / bf16_link == pytest.approx((0.5 * (1 + 4 / 4096) / 40) / (2 * 15 / 16 / 160), rel=1e-4)


def test_grad_reduce_overlap_and_fp32_unchanged():
    # without overlap everything is exposed; fp32 has no reduction kernels, so its comm term is what it
    # always was: exposed + the hidden part at COMM_OVERLAP_SLOWDOWN
    for g, r in grad_reduce_results(2, overlap=False).items():
        assert r["comm_exposed_ms"] == pytest.approx(r["comm_total_ms"])
        assert r["split_ms"]["comm"] == pytest.approx(r["comm_total_ms"])
    r = grad_reduce_results(2)["fp32"]
    hidden = r["comm_total_ms"] - r["comm_exposed_ms"]
    assert r["split_ms"]["comm"] == pytest.approx(r["comm_exposed_ms"] + hidden * pm.COMM_OVERLAP_SLOWDOWN)
    # overlapped kernels cost their whole duration (COMM_KERNEL_OVERLAP_COST), link time 8%
    fp8 = grad_reduce_results(2)["fp8"]
    assert fp8["split_ms"]["comm"] > fp8["comm_exposed_ms"] + (fp8["comm_total_ms"] - fp8["comm_exposed_ms"]) * 0.08


# --- calibration ----------------------------------------------------------------------------------

DEVICE_LINE = "| device: NVIDIA H200, compute capability 9.0, 139.8 GiB; cuBLASLt workspace 32 MiB; attention: cuDNN SDPA"
SHAPE_7B = "B 1 T 4096 C 4096 NH 32 NKV 32 F 11008 V 32000"


def write_gemm_log(path, fp8_tf, bf16_tf):
    """build/tools/bench_gemm output for llama2-7b's twelve block GEMMs at the given TFLOP/s."""
    C, F, QKV, M = 4096, 11008, 3 * 4096, 4096
    lines = [f"{'model':<11} {'layer':<5} {'gemm':<6} {'m':>6} {'n':>6} {'k':>6} | bf16 TF/s  fp8 TF/s | speedup"]
    for layer, (OC, Cin) in (("wqkv", (QKV, C)), ("wo", (C, C)), ("w13", (2 * F, C)), ("w2", (C, F))):
        for kind, mnk in (("fprop", (OC, M, Cin)), ("dgrad", (Cin, M, OC)), ("wgrad", (Cin, OC, M))):
            lines.append(f"llama2-7b   {layer:<5} {kind:<6} {mnk[0]:6d} {mnk[1]:6d} {mnk[2]:6d} | "
                         f"{bf16_tf:9.1f} {fp8_tf:9.1f} | {fp8_tf / bf16_tf:6.2f}x")
    lines.append("gemm llama2-7b block: bf16 12.345 ms, fp8 6.789 ms, speedup 1.82x")
    path.write_text("\n".join(lines) + "\n")


def test_calibration_replaces_matching_rates(tmp_path, rng):
    # one decimal, as the logs print them
    fp8_tf, bf16_tf, norm_gbs, att_tf = (round(rng.uniform(lo, hi), 1) for lo, hi in ((700, 1500), (400, 800),
                                                                                    (1500, 4000), (300, 600)))
    write_gemm_log(tmp_path / "gemm.log", fp8_tf, bf16_tf)
    (tmp_path / "kernels.log").write_text("\n".join([
        DEVICE_LINE,
        f"[ rmsnorm ] op_rmsnorm_forward, op_residual_rmsnorm_forward, op_rmsnorm_backward; {SHAPE_7B}, seed 3",
        "    rmsnorm_forward: max abs err 0.000e+00, rel L2 0.000e+00, tol bit-identical",
        f"    rmsnorm_forward: 41.2 us, {norm_gbs:.1f} GB/s",
        f"[ attention ] op_attention_forward, op_attention_backward (causal, GQA); {SHAPE_7B}, seed 4",
        f"    attention_forward: 1234.5 us, {att_tf:.1f} TFLOP/s",
        "    some_future_op: 12.0 us, 99.0 GB/s",
    ]) + "\n")
    (tmp_path / "shard.bin").write_bytes(b"\x00\x01binary")  # a binary file beside the logs is skipped
    c = pm.parse_calibration([str(tmp_path)], "auto")
    assert c.device == "H200"
    h100 = pm.GPUS["H100"]
    calibrated, sheet = pm.Rates(h100, c), pm.Rates(h100)

    # exact GEMM shapes: the measured TFLOP/s, carried as a fraction of the (same) peak
    fprop = pm.gemm_op("fp8", "fprop", 3 * 4096, 4096, 4096, "wqkv fprop")
    assert calibrated.time(fprop) == pytest.approx(fprop.flops / (fp8_tf * 1e12), rel=1e-9)
    wgrad = pm.gemm_op("bf16", "wgrad", 4096, 2 * 11008, 4096, "w13 wgrad")
    assert calibrated.time(wgrad) == pytest.approx(wgrad.flops / (bf16_tf * 1e12), rel=1e-9)
    # an unmeasured shape of a measured kind: the mean measured fraction
    output = pm.gemm_op("bf16", "fprop", 32000, 4096, 4096, "output fprop")
    assert calibrated.time(output) == pytest.approx(output.flops / (bf16_tf * 1e12), rel=1e-9)
    # memory-bound: the measured fraction of the H200's 4.8 TB/s, applied to the H100's 3.35 TB/s
    norm = pm.mem_op("rmsnorm_forward", 1e9)
    assert calibrated.time(norm) == pytest.approx(1e9 / (norm_gbs * 1e9 / 4.8e12 * 3.35e12), rel=1e-9)
    assert pm.Rates(pm.GPUS["H200"], c).time(norm) == pytest.approx(1 / norm_gbs, rel=1e-9)  # where it was measured
    attention = pm.attention_ops(1, 4096, pm.PRESETS["llama2-7b"])[0]
    assert calibrated.time(attention) == pytest.approx(attention.flops / (att_tf * 1e12), rel=1e-9)
    # what was not measured keeps its datasheet rate
    for op in (pm.mem_op("swiglu_forward", 1e9), pm.attention_ops(1, 4096, pm.PRESETS["llama2-7b"])[1],
               pm.mem_op("some_future_op", 1e9)):
        assert calibrated.time(op) == sheet.time(op)
    replaced = pm.replaced_rates(c)
    assert len(replaced) == 2 * 3 + 1 + 1  # GEMMs: 2 precisions x 3 kinds, attention forward, rmsnorm_forward
    assert any(line.startswith("GEMM fp8 wgrad: 4 shapes") for line in replaced)
    assert any(line.startswith("rmsnorm_forward:") for line in replaced)
    assert not any("swiglu" in line or "backward" in line or "future" in line for line in replaced)


def write_train_log(path, precision, ms_per_step, layers=4, accum=8, device=DEVICE_LINE):
    lines = ["+-----", f"| llm8 train_llama (cuda build), precision {precision}", device,
             f"| model: dim 4096, layers {layers}, heads 32, kv heads 32, head dim 128, ffn 11008, vocab 32000, "
             "max seq 4096",
             "| model from: llama2-7b",
             f"| micro-batch 1 x 4096, 1 rank(s), grad accumulation {accum} -> {accum * 4096} tokens per step, "
             f"{len(ms_per_step)} steps"]
    for i, ms in enumerate(ms_per_step):
        tok_s = accum * 4096 / (ms / 1e3)
        lines.append(f"step {i + 1:4d}/{len(ms_per_step)} | loss 10.1 | lr 1.00e-04 | norm 1.2000 | {ms:.1f} ms | "
                     f"{tok_s:.0f} tok/s | MFU 30.0%")
    path.write_text("\n".join(lines) + "\n")


def test_train_logs_predicted_vs_measured(tmp_path, rng):
    ms = {p: rng.uniform(200, 900, size=6) for p in ("bf16", "fp8")}
    write_train_log(tmp_path / "train_bf16.log", "bf16", ms["bf16"])
    write_train_log(tmp_path / "train_fp8.log", "fp8", ms["fp8"])
    out = run("--calibrate", tmp_path, "--models", "llama2-7b", "--gpus", "H100", "--topologies", "1x8", "--json")
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)["measured_vs_predicted"]
    by_what = {r["what"].split(",")[0]: r for r in rows}
    for p in ("bf16", "fp8"):
        row = by_what[f"train llama2-7b L4 {p} -b 1 -t 4096 x8 on H200"]
        # the mean leaves out the first two (warm-up) steps
        assert row["measured"] == pytest.approx(np.mean(ms[p][2:]), rel=1e-3)
        single = pm.single_gpu_plan(replace(pm.PRESETS["llama2-7b"], name="llama2-7b L4", L=4), p, "H200", 1, 4096, 8)
        assert row["datasheet"] == pytest.approx(pm.predict(single, pm.Rates(pm.GPUS["H200"]))["step_ms"])
        assert row["calibrated"] == pytest.approx(row["datasheet"])  # no rates were measured
    speedup = by_what["train llama2-7b L4 fp8 / bf16 tokens/s on H200"]
    assert speedup["measured"] == pytest.approx(np.mean(ms["bf16"][2:]) / np.mean(ms["fp8"][2:]), rel=1e-3)


def test_calibration_reads_the_device_checks_archive(tmp_path, rng):
    """The device check packs its logs into logs.tar.gz: calibrating from the archive is calibrating from
    the logs themselves."""
    logs = tmp_path / "logs"
    logs.mkdir()
    write_gemm_log(logs / "gemm.log", round(rng.uniform(700, 1500), 1), round(rng.uniform(400, 800), 1))
    write_train_log(logs / "train_fp8.log", "fp8", rng.uniform(200, 900, size=6))
    (logs / "shard.bin").write_bytes(b"\x00\x01binary")
    out = tmp_path / "out"
    out.mkdir()
    with tarfile.open(out / "logs.tar.gz", "w:gz") as archive:
        archive.add(logs, arcname="logs")
    args = ["--models", "llama2-7b", "--gpus", "H100", "--topologies", "1x8", "--json"]
    from_logs, from_archive = run("--calibrate", logs, *args), run("--calibrate", out, *args)
    assert from_logs.returncode == 0 and from_archive.returncode == 0, from_logs.stderr + from_archive.stderr
    a, b = json.loads(from_logs.stdout), json.loads(from_archive.stdout)
    assert a["predictions"] == b["predictions"] and a["measured_vs_predicted"] == b["measured_vs_predicted"]
    assert len(a["measured_vs_predicted"]) > 0


def test_slow_gemms_give_what_it_would_take(tmp_path):
    # FP8 GEMMs measured at 500 TFLOP/s put 7B below 18,000 tokens/s/GPU: the section says by how much
    write_gemm_log(tmp_path / "gemm.log", 500.0, 400.0)
    (tmp_path / "device.txt").write_text("NVIDIA H100 80GB HBM3, 9.0, 81559 MiB, 570.86\n")
    out = run("--calibrate", tmp_path, "--models", "llama2-7b", "--gpus", "H100", "--topologies", "1x8", "--json")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    takes = result["what_it_takes"]
    assert takes["predicted"] < pm.TARGET_7B_FP8
    tokens = result["predictions"][1]["tokens_per_gpu_step"]
    assert takes["must_lose_ms"] == pytest.approx(takes["step_ms"] - 1e3 * tokens / pm.TARGET_7B_FP8)
    gemm = next(t for t in takes["terms"] if t["term"] == "gemm")
    assert 0 < gemm["alone_change"] < 1
    text = run("--calibrate", tmp_path, "--models", "llama2-7b", "--gpus", "H100", "--topologies", "1x8")
    assert "must lose" in text.stdout and "replaced datasheet rates (6, measured on H100)" in text.stdout


KERNEL_LINES = f"[ rmsnorm ] ops; {SHAPE_7B}, seed 1\n    rmsnorm_forward: 41.2 us, 2000.0 GB/s\n"


@pytest.mark.parametrize("files,message", [
    ({"a.log": DEVICE_LINE + "\n" + KERNEL_LINES, "b.log": DEVICE_LINE.replace("H200", "H800") + "\n"}, "several GPUs"),
    ({"train.log": "step    3/10 | loss 1 | lr 1 | norm 1 | 5.0 ms | 9 tok/s\n" * 4}, "header line"),
    ({"notes.txt": "nothing to see\n"}, "nothing recognised"),
    ({"k.log": KERNEL_LINES}, "--measured-on"),
])
def test_calibration_errors(tmp_path, files, message):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    out = run("--calibrate", tmp_path)
    assert out.returncode == 2
    assert message in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
    missing = run("--calibrate", tmp_path / "absent")
    assert missing.returncode == 2 and "absent: no such file" in missing.stderr


# --- orderings that must hold -----------------------------------------------------------------------

def test_fp8_gemm_faster_than_bf16_at_every_shape():
    for gpu in pm.GPUS.values():
        rates = pm.Rates(gpu)
        for shape in (pm.PRESETS["llama2-7b"], pm.PRESETS["llama2-13b"]):
            fp8 = pm.block_gemm_ops(shape, "fp8", 4096)
            bf16 = pm.block_gemm_ops(shape, "bf16", 4096)
            for a, b in zip(fp8, bf16):
                assert a.gemm[1:] == b.gemm[1:]
                assert rates.time(a) < rates.time(b), a.name


@pytest.mark.parametrize("model", ["llama2-7b", "llama2-13b"])
@pytest.mark.parametrize("precision", ["bf16", "fp8"])
def test_more_gpus_never_beat_one_gpu_compute(model, precision):
    shape = pm.PRESETS[model]
    one = pm.predict(pm.single_gpu_plan(shape, precision, "H100", 1, 4096, 1), pm.Rates(pm.GPUS["H100"]))
    limit = one["compute_bound_tokens_per_s"]
    assert one["tokens_per_s_per_gpu"] < limit
    for gpu in ("H100", "H800"):
        per_gpu = []
        for nodes in (1, 2, 4):
            p = plan(shape=shape, precision=precision, gpu=gpu, nodes=nodes, per_node=8, T=4096, accum=64 // (8 * nodes),
                     zero=pm.ZERO_STAGE_OF[model])
            r = pm.predict(p, pm.Rates(pm.GPUS[gpu]))
            assert r["tokens_per_s_per_gpu"] <= limit
            assert 0 <= r["comm_exposed_ms"] <= r["comm_total_ms"]
            assert sum(r["split_ms"].values()) == pytest.approx(r["step_ms"])
            per_gpu.append(r["tokens_per_s_per_gpu"])
        # the same global batch over more GPUs amortizes the collectives over fewer micro-steps
        assert per_gpu == sorted(per_gpu, reverse=True)


def test_faster_links_and_overlap_never_hurt():
    shape = pm.PRESETS["llama2-13b"]
    base = dict(shape=shape, precision="fp8", per_node=8, T=4096, accum=16, zero=2)
    tok = {}
    for gpu in ("H100", "H800"):
        for overlap in (True, False):
            p = plan(gpu=gpu, overlap=overlap, **base)
            tok[gpu, overlap] = pm.predict(p, pm.Rates(pm.GPUS[gpu]))["tokens_per_s_per_gpu"]
    assert tok["H100", True] > tok["H800", True]
    assert tok["H100", True] > tok["H100", False]
    assert tok["H800", True] > tok["H800", False]
    bf16_wire = pm.predict(plan(gpu="H800", grad_reduce="bf16", **base), pm.Rates(pm.GPUS["H800"]))
    assert bf16_wire["tokens_per_s_per_gpu"] > tok["H800", True]


def test_recompute_trades_time_for_memory():
    p = plan(shape=pm.PRESETS["llama2-13b"], precision="fp8", per_node=8, T=4096, accum=16, zero=2)
    rates = pm.Rates(pm.GPUS["H100"])
    previous = pm.predict(p, rates)
    # one block recomputed saves nothing: recomputing it needs one block's buffers
    one = pm.predict(replace(p, recompute="full", recompute_layers=1), rates)
    assert one["memory_gib"] == pytest.approx(previous["memory_gib"])
    for k in (2, 10, 40):
        r = pm.predict(replace(p, recompute="full", recompute_layers=k), rates)
        assert r["memory_gib"] < previous["memory_gib"]
        assert r["tokens_per_s_per_gpu"] < previous["tokens_per_s_per_gpu"]
        previous = r
    fitted = pm.fit_recompute(p)
    assert fitted.recompute == "none" or pm.memory_gib(fitted) <= pm.GPUS["H100"].memory_gib


def test_optim_state_memory_and_adamw_bytes():
    """--optim-state: the moments take 8, 4 or 3 bytes per parameter of the shard (fp8: plus two FP32 scales
    per 4096), AdamW moves 28, 20 or 18 bytes per element, and nothing else in the plan changes."""
    p = plan(shape=pm.PRESETS["llama2-7b"], precision="fp8", per_node=8, T=4096, accum=16, zero=1)
    shard = p.shape.params() / 8
    gib = {f: pm.memory_gib(replace(p, optim_state=f)) for f in ("fp32", "bf16", "fp8")}
    assert (gib["fp32"] - gib["bf16"]) * 2**30 == pytest.approx(4 * shard)
    assert (gib["fp32"] - gib["fp8"]) * 2**30 == pytest.approx((8 - 3 - 8 / 4096) * shard)
    for f, per_element in (("fp32", 28), ("bf16", 20), ("fp8", 18)):
        adamw = [op for op in pm.optimizer_ops(replace(p, optim_state=f)) if op.name.startswith("adamw")]
        assert len(adamw) == 1 and adamw[0].bytes == pytest.approx(per_element * shard), f
    out = run("--optim-state", "fp8", "--models", "llama2-7b", "--json")
    assert out.returncode == 0, out.stderr
    fp8_state = json.loads(out.stdout)["predictions"]
    base = json.loads(run("--models", "llama2-7b", "--json").stdout)["predictions"]
    for a, b in zip(base, fp8_state):
        assert b["memory_gib"] < a["memory_gib"] and b["tokens_per_s_per_gpu"] >= a["tokens_per_s_per_gpu"], (a, b)


# --- stored state (--grad-buffer, --master-weights) ---------------------------------------------------

# Llama-2 7B by hand: per block wqkv 3 x 4096^2 = 50331648, wo 4096^2 = 16777216, w13 2 x 11008 x 4096 =
# 90177536, w2 45088768 (202375168 linear) and two norms of 4096: 202383360; the embedding and the output
# layer 32000 x 4096 = 131072000 each; the final norm 4096.
LAYER_7B, LINEAR_7B, VC_7B = 202383360, 202375168, 131072000
P_7B = 32 * LAYER_7B + 2 * VC_7B + 4096


def plan_7b_zero1(precision="fp8", **kw):
    """7B (fp8 unless told), ZeRO-1 on 8 GPUs, 16 micro-steps of 4096 tokens."""
    return plan(shape=pm.PRESETS["llama2-7b"], precision=precision, per_node=8, T=4096, accum=16, zero=1, **kw)


def op_bytes(ops, prefix):
    return sum(op.bytes for op in ops if op.name.startswith(prefix))


def test_grad_buffer_and_master_memory_by_hand():
    """7B ZeRO-1 on 8 GPUs: the gradient buffer takes 4, 2 or 1 (+ 4 per 4096) bytes per parameter, bf16 and
    fp8 adding two FP32 bucket buffers of the largest bucket (a block); an fp16 master takes 2 (+ 4 per
    4096) bytes per parameter of the shard instead of 4, plus an FP32 scratch of the largest piece (the
    embedding's 1/8)."""
    assert P_7B == 6738415616 == pm.PRESETS["llama2-7b"].params()
    p = plan_7b_zero1()
    shard, buckets = P_7B / 8, 2 * 4 * LAYER_7B

    def delta(**kw):
        return (pm.memory_gib(replace(p, **kw)) - pm.memory_gib(p)) * 2**30

    assert delta(grad_buffer="bf16") == pytest.approx((2 - 4) * P_7B + buckets)
    assert delta(grad_buffer="fp8") == pytest.approx((1 + 4 / 4096 - 4) * P_7B + buckets)
    assert delta(master_weights="fp16") == pytest.approx((2 + 4 / 4096 - 4) * shard + 4 * VC_7B / 8)
    # the savings add up, and nothing else moves
    both = delta(grad_buffer="fp8", master_weights="fp16")
    assert both == pytest.approx(delta(grad_buffer="fp8") + delta(master_weights="fp16"))


def test_grad_buffer_ops_by_hand():
    """--grad-buffer bf16 / fp8 under ZeRO-1: every bucket of every micro-step zeroes its FP32 bucket buffer
    (4 bytes per element) and, after its backward, adds it into the stored sum (bf16 2 + 4 + 2, fp8 1 + 4 + 1
    bytes per element and the chunk's scale read and written); the last micro-step instead adds the stored
    sum into the bucket (2 + 4 + 4, 1 + 4 + 4 + a scale read), which is reduced from there. Per step the
    buffer is zeroed in its own format; ZeRO-1 reduces into its FP32 shard, so nothing decodes it."""
    buckets = [VC_7B + 4096] + [LAYER_7B] * 32 + [VC_7B]  # backward order: head, blocks, embedding
    assert sum(buckets) == P_7B
    for buffer, add, load, zeroed in (("bf16", 2 + 4 + 2, 2 + 4 + 4, 2),
                                      ("fp8", 1 + 4 + 1 + 8 / 4096, 1 + 4 + 4 + 4 / 4096, 1 + 4 / 4096)):
        q = plan_7b_zero1(grad_buffer=buffer)
        micro = pm.micro_step_ops(q).backward
        last = pm.micro_step_ops(q, last=True).backward
        for seg, last_seg, elements in zip(micro, last, buckets):  # in the bucket's own backward segment
            assert op_bytes(seg, "store_add") == pytest.approx(add * elements), buffer
            assert op_bytes(seg, "store_load") == 0
            assert op_bytes(last_seg, "store_load") == pytest.approx(load * elements), buffer
            assert op_bytes(last_seg, "store_add") == 0
            zeroing = [op for op in seg if op.name == "memset" and op.category == "optimizer"]
            assert len(zeroing) == 1 and zeroing[0].bytes == 4 * elements
        optim = pm.optimizer_ops(q)
        assert optim[0].name == "memset" and optim[0].bytes == pytest.approx(zeroed * P_7B)
        assert op_bytes(optim, "store") == 0
    fp32 = plan_7b_zero1()
    ops = [op for seg in pm.micro_step_ops(fp32, last=True).backward for op in seg]
    assert op_bytes(ops, "store") == 0 and not any(op.category == "optimizer" for op in ops)
    assert pm.optimizer_ops(fp32)[0].bytes == 4 * P_7B


def test_grad_buffer_lengthens_the_step_by_hand():
    """One GPU (ZeRO-0), 7B bf16, 4 micro-steps: --grad-buffer bf16 adds per micro-step 4 + 8 bytes per
    parameter (bucket zeroed, stored again), zeroes 2 bytes per parameter a step instead of 4, and decodes
    the buffer (2 + 4) for each of its two readers, the norm and AdamW; every added op is a launch."""
    p = plan(shape=pm.PRESETS["llama2-7b"], precision="bf16", T=4096, accum=4, zero=0)
    rates = pm.Rates(pm.GPUS["H100"])
    base = pm.predict(p, rates)
    for buffer, add, decode, zeroed in (("bf16", 8, 6, 2), ("fp8", 6 + 8 / 4096, 5 + 4 / 4096, 1 + 4 / 4096)):
        r = pm.predict(replace(p, grad_buffer=buffer), rates)
        extra = 4 * (4 + add) * P_7B + (zeroed - 4) * P_7B + 2 * decode * P_7B
        seconds = extra / (pm.HBM_EFFICIENCY * 3.35e12)
        assert r["split_ms"]["optimizer"] - base["split_ms"]["optimizer"] == pytest.approx(1e3 * seconds, rel=1e-9)
        launches = 4 * 2 * 34 + 2  # two ops per bucket and micro-step, two decodes
        assert r["step_ms"] - base["step_ms"] == pytest.approx(1e3 * (seconds + launches * pm.KERNEL_GAP_S), rel=1e-9)
        assert r["memory_gib"] < base["memory_gib"] and r["grad_buffer"] == buffer


def test_master_fp16_ops_by_hand():
    """--master-weights fp16, 7B fp8 ZeRO-1 on 8 GPUs: the shard is decoded (2 + 4 bytes per element and a
    scale read) by AdamW and by the working-weight refresh, and its linear layers' part once more by the
    FP8 weight cast; stored once (4 + 2 and a scale written). AdamW's own bytes do not change."""
    shard, linear = P_7B / 8, 32 * LINEAR_7B / 8
    per_element = 6 + 4 / 4096
    ops = pm.optimizer_ops(plan_7b_zero1(master_weights="fp16"))
    assert op_bytes(ops, "master decode fp16") == pytest.approx(per_element * (2 * shard + linear))
    stores = [op for op in ops if op.name == "master store fp16"]
    assert len(stores) == 1 and stores[0].bytes == pytest.approx(per_element * shard)
    assert op_bytes(ops, "adamw") == pytest.approx(28 * shard)
    # bf16 training casts no FP8 weights: two decodes
    bf16 = pm.optimizer_ops(plan_7b_zero1("bf16", master_weights="fp16"))
    assert op_bytes(bf16, "master decode fp16") == pytest.approx(per_element * 2 * shard)
    assert op_bytes(pm.optimizer_ops(plan_7b_zero1()), "master") == 0


def test_store_calibration_lines():
    """bench_kernels' store lines (kc_store: the accumulating op_store_add of n = C F / 2 + 321 elements,
    counted as 4 n + 2 n bytes of the codec + 8 bytes per 4096) calibrate the model's store_add ops."""
    shape = (1, 4096, 4096, 32, 32, 11008, 32000)
    n = 4096 * 11008 // 2 + 321
    assert pm.kernel_op("store_add bf16", shape).bytes == 4 * n + 2 * 2 * n
    assert pm.kernel_op("store_add e4m3", shape).bytes == pytest.approx(4 * n + 2 * n + 8 * math.ceil(n / 4096), rel=1e-6)
    assert pm.KERNEL_OP_NAMES["store e4m3 (--grad-buffer fp8)"] == "store_add e4m3"


# --- the command line ---------------------------------------------------------------------------------

def test_default_report():
    out = run()
    assert out.returncode == 0, out.stderr
    for model in ("llama2-7b", "llama2-13b"):
        for gpus in ("1x8 H100", "2x8 H100", "1x8 H800", "2x8 H800"):
            for precision in ("bf16", "fp8"):
                assert any(line.startswith(f"| {model}") and f"| {precision}" in line and gpus in line
                           for line in out.stdout.splitlines()), (model, gpus, precision)
    assert "== What it would take: llama2-7b fp8 1x8 H100, target 18,000 tokens/s/GPU" in out.stdout


def test_json_is_complete_and_finite():
    out = run("--json")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert len(result["predictions"]) == 2 * 2 * 2 * 2
    for r in result["predictions"]:
        for key in ("tokens_per_s_per_gpu", "step_ms", "mfu_llmc", "mfu_megatron", "memory_gib"):
            assert math.isfinite(r[key]) and r[key] > 0, key
        assert 0 < r["mfu_llmc"] < 1 and abs(r["mfu_llmc"] / r["mfu_megatron"] - 1) < 0.01


def test_grad_reduce_flag_and_comparison():
    out = run("--grad-reduce", "fp8", "--models", "llama2-13b", "--gpus", "H800", "--topologies", "2x8", "--json")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    for r in result["predictions"]:
        assert r["grad_reduce"] == "fp8" and r["grad_reduce_built"]
        assert r["grad_wire_bytes_per_element"] == pytest.approx(1 + 4 / 4096, abs=1e-5)  # E4M3 + chunk scales
    rows = result["grad_reduce_comparison"]
    assert [(r["model"], r["gpus"], r["grad_reduce"]) for r in rows] == [
        (m, f"{n}x{g} {gpu}", red) for m, gpu, n, g in pm.GRAD_REDUCE_PLANS for red in pm.GRAD_REDUCTIONS]
    for r in rows:
        for key in ("tokens_per_s_per_gpu", "step_ms", "comm_total_ms", "comm_exposed_ms", "exposed_share", "comm_share"):
            assert math.isfinite(r[key]) and r[key] >= 0, key
    # the comparison's rows are the table's: fp8 13B on 2 x 8 H800
    table_row = next(r for r in result["predictions"] if r["precision"] == "fp8")
    assert table_row["model"] == "llama2-13b" and table_row["gpus"] == "2x8 H800"
    assert rows[2]["tokens_per_s_per_gpu"] == pytest.approx(table_row["tokens_per_s_per_gpu"])
    text = run()
    assert "== Gradient reduction, fp8 training (every multi-GPU row" in text.stdout
    assert any(line.startswith("| llama2-13b | 2x8 H800 | fp8 ") for line in text.stdout.splitlines())
    assert "design" not in text.stdout.split("== Gradient reduction")[1]


def test_grad_buffer_and_master_flags():
    args = ["--models", "llama2-7b", "--gpus", "H800", "--precisions", "fp8", "--json"]
    out = run("--grad-buffer", "fp8", "--master-weights", "fp16", "--topologies", "1x8,1x1", *args)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    base = json.loads(run("--topologies", "1x8,1x1", *args).stdout)
    for r, b in zip(result["predictions"], base["predictions"]):
        assert (r["grad_buffer"], r["master_weights"], b["grad_buffer"], b["master_weights"]) == ("fp8", "fp16", "fp32", "fp32")
        assert r["memory_gib"] < b["memory_gib"]
    assert [r["zero"] for r in result["predictions"]] == [1, 0]  # one GPU: ZeRO-0, which --grad-buffer allows
    # the comparison's 13B plans run ZeRO-2, which --grad-buffer refuses: skipped, saying why
    skipped = [r for r in result["grad_reduce_comparison"] if "skipped" in r]
    assert {r["model"] for r in skipped} == {"llama2-13b"}
    assert all("flag --grad-buffer fp8" in r["skipped"] for r in skipped)
    text = run("--grad-buffer", "bf16", "--master-weights", "fp16", "--models", "llama2-7b", "--topologies", "1x8")
    assert "gradient buffer in bf16, master weights in fp16" in text.stdout


@pytest.mark.parametrize("args,message", [
    (["--grad-reduce", "fp16"], "flag --grad-reduce: 'fp16' is not fp32, bf16 or fp8"),
    (["--grad-buffer", "bf16", "--models", "llama2-13b"],
     "flag --grad-buffer bf16: the trainer needs ZeRO-1, or ZeRO-0 on one GPU; llama2-13b on 8 GPUs runs ZeRO-2"),
    (["--grad-buffer", "fp8", "--models", "llama2-7b", "--zero", "0"],
     "flag --grad-buffer fp8: the trainer needs ZeRO-1, or ZeRO-0 on one GPU; llama2-7b on 8 GPUs runs ZeRO-0"),
    (["--grad-buffer", "fp16"], "argument --grad-buffer: invalid choice"),
    (["--master-weights", "bf16"], "argument --master-weights: invalid choice"),
    (["--models", "llama2-8b"], "flag --models: unknown 'llama2-8b'"),
    (["--topologies", "8"], "flag --topologies: '8'"),
    (["--global-batch", "1000"], "flag --global-batch: 1000 tokens"),
    (["--recompute", "full:99", "--models", "llama2-7b"], "flag --recompute: full:99"),
    (["--recompute", "cheap"], "flag --recompute: cheap is bf16 only"),
])
def test_bad_flags(args, message):
    out = run(*args)
    assert out.returncode == 2 and message in out.stderr, out.stderr
    if args[0] == "--grad-reduce" or message.startswith("flag --grad-buffer"):
        assert len(out.stderr.strip().splitlines()) == 1, out.stderr
