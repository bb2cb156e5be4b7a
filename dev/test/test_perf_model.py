"""
Tests of scripts/perf_model.py and scripts/perf/, the performance model of a training step.

Run from the repo root: python -m pytest dev/test/test_perf_model.py. The model times the trainer's own op
list (train_llama_cpu --dry-run 2) and reads its memory plan (train_llama --dry-run 1): the tests check that
it times every op of the list and nothing else, a tiny list timed by hand, the FLOP counts, ring and
all-to-all formulas against cases computed by hand, that an op it has no rate for is refused, calibration
against sample logs in the device check's formats (random measured rates from a seed printed by each test;
set LLM8_TEST_SEED to replay one), and orderings that must hold whatever the rates. The dry runs of a
configuration run once per module (the step module's cache); the command line runs in-process.
"""
import copy
import importlib.util
import json
import math
import os
import secrets
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


pm = load_perf_model()  # puts scripts/ on sys.path
from perf import assumptions as A  # noqa: E402
from perf import calibration as CAL  # noqa: E402
from perf import report as R  # noqa: E402
from perf import step as S  # noqa: E402

# A tiny GQA config: C 64, L 2, 4 heads of 16, 2 kv heads, ffn 96, vocab 128; sequence 32.
TINY = (64, 2, 4, 2, 96, 128)
TINY_T = 32
H100 = S.Rates(A.GPUS["H100"])


@pytest.fixture
def rng():
    seed = int(os.environ.get("LLM8_TEST_SEED", secrets.randbits(32)))
    print(f"LLM8_TEST_SEED={seed}")
    return np.random.default_rng(seed)


@pytest.fixture(scope="module", autouse=True)
def built():
    for name in (S.CPU_TRAINER, S.GPU_TRAINER):
        if not (REPO / name).exists():
            pytest.fail(f"{REPO / name} is not built: run `make {name}` first")


def run(capsys, *args):
    """perf_model.py's main in this process (so that the dry runs stay cached): (exit status, stdout, stderr)."""
    capsys.readouterr()
    status = pm.main([str(a) for a in args])
    out = capsys.readouterr()
    return status, out.out, out.err


def run_of(model="llama2-7b", precision="fp8", gpu="H100", nodes=1, per_node=8, accum=4, zero=1, recompute=0, **kw):
    world = nodes * per_node
    return S.Run(model=model, precision=precision, gpu=gpu, nodes=nodes, gpus_per_node=per_node, B=1, T=4096,
                 tokens=accum * world * 4096, zero=zero, recompute=recompute, **kw)


# --- FLOP counts ------------------------------------------------------------------------------------

def test_llmc_flops_tiny_by_hand():
    # parameters without the embedding, tensor by tensor (docs/formats.md "Model checkpoint"), HS 16, KVC 32:
    # per layer attn_norm 64 + wqkv (64+2*32)*64 = 8192 + wo 64*64 = 4096 + ffn_norm 64
    #   + w13 2*96*64 = 12288 + w2 64*96 = 6144 = 30848; two layers 61696; + norm 64 + output 128*64 = 8192
    n = 61696 + 64 + 8192
    assert n == 69952
    expected = 6 * 69952 + 12 * 2 * 64 * 32  # 419712 + 49152
    assert S.flops_per_token_llmc(TINY, TINY_T) == expected == 468864


def test_megatron_flops_tiny_matmul_by_matmul():
    # one forward pass over a sequence of T tokens, every matmul 2 m n k, attention full T x T as
    # Megatron counts it; backward twice the forward
    C, L, NH, NKV, F, V = TINY
    T, HS = TINY_T, C // NH
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
    assert S.flops_per_token_megatron(TINY, T) == pytest.approx(3 * forward / T, rel=1e-12)


def test_megatron_formula_reduces_to_gpt():
    # QKV = 3h and a two-matrix 4h MLP (6 h F = 16 h^2 with F = 8h/3): Narayanan et al.'s GPT formula
    h, L, V, s = 768 * 3, 12, 51200, 2048
    megatron = 72 * L * h * h * (1 + s / (6 * h) + V / (12 * h * L))
    assert S.flops_per_token_megatron((h, L, 12, 12, 8 * h // 3, V), s) == pytest.approx(megatron, rel=1e-12)


# --- the trainer's op list, timed ----------------------------------------------------------------------

def gemm_seconds_by_hand(op, gpu):
    """One GEMM record: 2mnk at the assumed fraction of its precision's peak, or its bytes at 80% of HBM."""
    m, n, k = op["shape"][:3]
    fp8 = "E4M3" in op["detail"]
    kind = "wgrad" if "+=" in op["detail"] else ("fprop" if op["phase"] == "forward" else "dgrad")
    peak = gpu.fp8_flops if fp8 else gpu.bf16_flops
    assert op["flops"] == 2.0 * m * n * k
    return max(op["flops"] / (peak * A.GEMM_EFFICIENCY[("fp8" if fp8 else "bf16", kind)]),
               (op["read"] + op["write"]) / (0.8 * gpu.hbm_bytes_s))


@pytest.mark.parametrize("model, precision, zero", [("llama2-7b", "fp8", 1), ("llama2-13b", "bf16", 2)])
def test_the_model_times_the_trainers_ops(model, precision, zero):
    """The GEMM and attention time of a step is the trainer's list's records, each at its rate, times its
    count: the model adds, drops or reshapes no GEMM and no attention."""
    r = run_of(model, precision, zero=zero)
    listing, _ = S.step_ops(r, 0)
    gpu = A.GPUS["H100"]
    gemm = sum(o["count"] * gemm_seconds_by_hand(o, gpu) for o in listing["ops"] if o["kind"] == "gemm")
    attention = sum(o["count"] * o["flops"] / (gpu.bf16_flops * (0.55 if o["op"] == "attention_forward" else 0.45))
                    for o in listing["ops"] if o["op"].startswith("attention"))
    assert sum(o["count"] for o in listing["ops"]) == len(listing["sequence"])
    totals, _ = S.simulate(listing["ops"], listing["sequence"], r, H100)
    assert 1e3 * totals["gemm"] == pytest.approx(1e3 * gemm, rel=1e-12)
    assert totals["attention"] == pytest.approx(attention, rel=1e-12)
    result = S.predict(r, H100)
    assert result["split_ms"]["gemm"] == pytest.approx(1e3 * gemm, rel=1e-12)
    assert result["ops"] == sum(o["count"] for o in listing["ops"] if o["kind"] != "sync")
    # planted: a model that skips one GEMM of the step differs
    first = next(i for i, o in enumerate(listing["ops"]) if o["kind"] == "gemm")
    seq = list(listing["sequence"])
    seq.remove(first)
    short, _ = S.simulate(listing["ops"], seq, r, H100)
    assert short["gemm"] != pytest.approx(gemm, rel=1e-12)


def tiny_list():
    """A hand-made list: a BF16 fprop GEMM, an RMSNorm, a reduce-scatter marked as slot 0, a SwiGLU, a wait
    for slot 0, a download (host sync)."""
    def op(name, kind, shape=(0,), read=0.0, write=0.0, flops=0.0, detail="", phase="forward"):
        return {"op": name, "kind": kind, "phase": phase, "detail": detail, "shape": list(shape) + [0] * (5 - len(shape)),
                "read": read, "write": write, "flops": flops, "count": 1}
    ops = [op("gemm", "gemm", (1000, 2000, 3000), 1.8e7, 4e6, 1.2e10, "act x act -> act"),
           op("rmsnorm_forward", "kernel", (1,), 2.68e9),
           op("reduce_scatter", "collective", (25_000_000, 8, 0), 8e8, detail="fp32", phase="backward"),
           op("mark", "sync"), op("swiglu_forward", "kernel", (1,), 1.34e9), op("wait", "sync"),
           op("download", "host", (128,), 128)]
    return ops, list(range(len(ops)))


def test_tiny_list_timed_by_hand():
    # H100, one node of 8. GEMM: 1.2e10 FLOP at 75% of 989.4e12 = 16.1714 us (its 2.2e7 bytes at 80% of
    # 3.35e12 would take 8.2 us); RMSNorm 2.68e9 bytes at 2.68e12 B/s = 1 ms; SwiGLU 0.5 ms; 1 us gap after
    # each kernel; the download 20 us + 128 B at 50 GB/s.
    gemm = 1.2e10 / (989.4e12 * 0.75)
    assert gemm == pytest.approx(16.1714e-6, rel=1e-5)
    compute = gemm + 1e-3 + 0.5e-3 + 3 * 1e-6 + 20e-6 + 128 / 50e9
    # the reduce-scatter starts when the RMSNorm ends: 8e8 bytes x 7/8 over 360 GB/s (450 x 0.8) + 20 us
    rs = 20e-6 + 8e8 * 7 / 8 / 360e9
    # the SwiGLU (and its gap) runs beside it, then compute waits for the mark: what is left is exposed
    exposed = rs - (0.5e-3 + 1e-6)
    hidden = rs - exposed
    step = compute + exposed + 0.08 * hidden
    ops, seq = tiny_list()
    r = run_of("tiny", "bf16")
    totals, comm = S.simulate(ops, seq, r, H100)
    assert totals["gemm"] == pytest.approx(gemm, rel=1e-12)
    assert totals["memory"] == pytest.approx(1.5e-3, rel=1e-12)
    assert comm["comm_exposed_s"] == pytest.approx(exposed, rel=1e-9)
    assert sum(totals.values()) == pytest.approx(step, rel=1e-12)
    # without overlap compute waits for the collective: all of it exposed, nothing hidden
    totals, comm = S.simulate(ops, seq, replace(r, overlap=False), H100)
    assert sum(totals.values()) == pytest.approx(compute + rs, rel=1e-12)
    # planted: without the wait, the step ends with compute and the collective still running
    totals, _ = S.simulate(ops, [0, 1, 2, 3, 4, 6], r, H100)
    assert sum(totals.values()) != pytest.approx(step, rel=1e-6)


@pytest.mark.parametrize("kind", ["kernel", "collective", "host", "sync"])
def test_an_op_without_a_rate_is_refused(kind, monkeypatch, capsys):
    """A new op in the trainer fails the model until the model knows it: planted by renaming a record of the
    trainer's list (a copy of its JSON)."""
    r = run_of()
    listing, dims = S.step_ops(r, 0)
    planted = copy.deepcopy(listing)
    victim = next(o for o in planted["ops"] if o["kind"] == kind)
    victim["op"] = "brand_new_op"
    with pytest.raises(S.InputError, match=f"'brand_new_op'"):
        S.simulate(planted["ops"], planted["sequence"], r, H100)
    S.simulate(listing["ops"], listing["sequence"], r, H100)  # the list as the trainer gives it is known
    monkeypatch.setattr(S, "step_ops", lambda run, recompute: (planted, dims))
    status, out, err = run(capsys, "--models", "llama2-7b", "--gpus", "H100", "--topologies", "1x8")
    assert status == 2 and "brand_new_op" in err and len(err.strip().splitlines()) == 1, err


def test_a_missing_binary_is_one_line(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(S, "REPO", tmp_path)
    S.run_trainer.cache_clear()
    try:
        status, _, err = run(capsys, "--models", "llama2-7b", "--gpus", "H100", "--topologies", "1x8")
    finally:
        S.run_trainer.cache_clear()
    assert status == 2 and "is not built: run `make train_llama" in err and len(err.strip().splitlines()) == 1, err


def test_memory_is_the_gpu_builds_plan():
    """Memory and fit are train_llama --dry-run 1's, against the GPU's memory; -r auto is its cheapest."""
    r = run_of("llama2-13b", "bf16", zero=2, accum=16, recompute="auto")
    text = S.run_trainer(S.GPU_TRAINER, ("--dry-run", "1", "--gpu-mem", f"{A.GPUS['H100'].memory_gib:.4f}")
                         + r.flags(0))
    plan = json.loads(text.splitlines()[-1][len("plan: "):])
    assert plan["backend"] == "cuda"
    result = S.predict(r, H100)
    assert result["recompute"] == max(plan["cheapest_recompute"], 0)
    chosen = S.memory_plan(r, result["recompute"])
    assert result["memory_gib"] == chosen["total_gib"] and result["fits"] == bool(chosen["fits"])


def test_recompute_trades_time_for_memory():
    results = [S.predict(run_of("llama2-13b", "bf16", zero=2, recompute=k), H100) for k in (0, 1, 2)]
    for a, b in zip(results, results[1:]):
        assert b["memory_gib"] < a["memory_gib"]
        assert b["tokens_per_s_per_gpu"] < a["tokens_per_s_per_gpu"]


# --- collectives ----------------------------------------------------------------------------------

def test_ring_time_by_hand():
    # 8 ranks, a 2 GB buffer, bus bandwidth 100 GB/s, latency 30 us:
    # reduce-scatter / all-gather: 2e9 * 7/8 / 1e11 = 17.5 ms; all-reduce twice that: 35 ms
    assert S.ring_time("reduce_scatter", 2e9, 8, 100e9, 30e-6) == pytest.approx(0.0175 + 30e-6, rel=1e-12)
    assert S.ring_time("all_gather", 2e9, 8, 100e9, 30e-6) == pytest.approx(0.0175 + 30e-6, rel=1e-12)
    assert S.ring_time("all_reduce", 2e9, 8, 100e9, 30e-6) == pytest.approx(0.035 + 30e-6, rel=1e-12)
    assert S.ring_time("all_reduce", 2e9, 1, 100e9, 30e-6) == 0.0
    with pytest.raises(ValueError):
        S.ring_time("broadcast", 2e9, 8, 100e9, 30e-6)


def test_bus_bandwidth():
    # NVLink 900 / 400 GB/s both ways -> 450 / 200 per direction; across nodes, 8 NICs of 50 GB/s
    eff, nic = A.NVLINK_EFFICIENCY, A.NIC_EFFICIENCY
    assert S.bus_bandwidth(run_of(gpu="H100")) == pytest.approx(450e9 * eff)
    assert S.bus_bandwidth(run_of(gpu="H800")) == pytest.approx(200e9 * eff)
    assert S.bus_bandwidth(run_of(gpu="H800", nodes=2)) == pytest.approx(min(200e9 * eff, 400e9 * nic))
    assert S.bus_bandwidth(run_of(gpu="H100", nodes=2, nics_per_node=1)) == pytest.approx(50e9 * nic)


def test_all_to_all_time_by_hand():
    # 2 nodes x 4 GPUs (W 8), 1.6 GB per rank in 8 pieces of 0.2 GB, NVLink 100 GB/s per direction, the
    # node's NICs 80 GB/s together, latency 30 us. Off-node: each GPU sends 4 pieces, the node 16 pieces
    # = 3.2 GB through its NICs: 40 ms. NVLink: 3 on-node pieces + 3 forwarded to the other node's rails
    # (PXN) = 1.2 GB: 12 ms. The NICs set it: 40 ms.
    assert S.all_to_all_time(1.6e9, 2, 4, 100e9, 80e9, 30e-6) == pytest.approx(0.040 + 30e-6, rel=1e-12)
    # NVLink-bound when the NICs are fast: 2 x 3 pieces of 0.2 GB over 100 GB/s = 12 ms
    assert S.all_to_all_time(1.6e9, 2, 4, 100e9, 1e15, 0.0) == pytest.approx(0.012, rel=1e-12)
    # one node of 8: 7 pieces of 0.2 GB over NVLink, 14 ms, what the ring reduce-scatter of the buffer takes
    assert S.all_to_all_time(1.6e9, 1, 8, 100e9, 80e9, 0.0) == pytest.approx(0.014, rel=1e-12)
    assert S.all_to_all_time(1.6e9, 1, 8, 100e9, 80e9, 0.0) == pytest.approx(
        S.ring_time("reduce_scatter", 1.6e9, 8, 100e9, 0.0), rel=1e-12)
    assert S.all_to_all_time(1.6e9, 1, 1, 100e9, 80e9, 30e-6) == 0.0


def test_inter_node_bytes_by_hand():
    # per NIC out of the node, per element: a ring reduce-scatter 15/16 of the buffer over 8 NICs; an
    # all-reduce (ZeRO-0) twice that; the all-to-all 8 GPUs x 8 off-node pieces of 1/16 over 8 NICs = 1/2
    r = run_of(nodes=2)
    assert S.inter_node_bytes_per_element(r, 4) == pytest.approx(4 * 15 / 16 / 8)
    assert S.inter_node_bytes_per_element(replace(r, zero=0), 2) == pytest.approx(2 * 2 * 15 / 16 / 8)
    assert S.inter_node_bytes_per_element(replace(r, grad_reduce="fp8"), 1) == pytest.approx(0.5)
    assert S.inter_node_bytes_per_element(replace(r, nodes=1, grad_reduce="fp8"), 1) == 0.0


def test_wire_collectives_by_hand():
    """A reduce-scatter record on the BF16 wire: the ring over its buffer, plus the GPU build's conversions
    (the bucket to BF16, 6 bytes per element; the piece stored into the FP32 shard, 6 + 4 accumulating);
    on the FP8 wire the all-to-all over 2 x 8 H800 (the NICs: 8 x 40 GB/s)."""
    piece, W = 2**20, 16
    r = run_of(gpu="H800", nodes=2, zero=2)
    rates = S.Rates(A.GPUS["H800"])
    bf16 = {"op": "reduce_scatter", "detail": "bf16", "shape": [piece, W, 1, 0, 0], "read": 2.0 * piece * W}
    link, kernels = S.collective_time(bf16, r, rates)
    assert link == pytest.approx(40e-6 + 2.0 * piece * W * 15 / 16 / 160e9, rel=1e-12)  # NVLink-bound ring
    assert kernels == pytest.approx((6 * piece * W + 10 * piece) / (0.8 * 3.35e12), rel=1e-12)
    fp8 = dict(bf16, detail="fp8", read=(1 + 4 / 4096) * piece * W)
    link, kernels = S.collective_time(fp8, r, rates)
    # half of the buffer leaves the node, over its 8 NICs at 40 GB/s x 0.8 x 8 = 256 GB/s... per node: 8 GPUs'
    # off-node halves, 8 x 0.5 x buffer over 256 GB/s
    assert link == pytest.approx(40e-6 + 8 * 0.5 * fp8["read"] / (8 * 50e9 * 0.8), rel=1e-12)
    assert kernels == pytest.approx((9 * piece * W + 8 * piece) / (0.8 * 3.35e12), rel=1e-12)
    assert S.collective_time(dict(bf16, detail="fp32", read=4.0 * piece * W), r, rates)[1] == 0.0


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
        f"[ fp8_weight ] op_amax_master, op_cast_transpose_master, op_transpose_fp8; {SHAPE_7B}, seed 5",
        f"    transpose_fp8 w13: 52.0 us, {norm_gbs / 2:.2f} GB/s",
    ]) + "\n")
    (tmp_path / "shard.bin").write_bytes(b"\x00\x01binary")  # a binary file beside the logs is skipped
    c = CAL.parse_calibration([str(tmp_path)], "auto")
    assert c.device == "H200"
    h100 = A.GPUS["H100"]
    calibrated, sheet = S.Rates(h100, c), S.Rates(h100)

    def gemm(detail, phase, m, n, k):
        return {"op": "gemm", "kind": "gemm", "phase": phase, "detail": detail, "shape": [m, n, k, 0, 0],
                "read": 0.0, "write": 0.0, "flops": 2.0 * m * n * k}

    def kernel(name, nbytes=1e9, flops=0.0):
        return {"op": name, "kind": "kernel", "phase": "forward", "detail": "", "shape": [0] * 5, "read": nbytes,
                "write": 0.0, "flops": flops}

    # exact GEMM shapes (as the trainer's records name them): the measured TFLOP/s, carried as a fraction
    fprop = gemm("E4M3 x E4M3 -> act", "forward", 3 * 4096, 4096, 4096)
    assert calibrated.time(fprop)[1] == pytest.approx(fprop["flops"] / (fp8_tf * 1e12), rel=1e-9)
    wgrad = gemm("act x act -> f32 +=", "backward", 4096, 2 * 11008, 4096)
    assert calibrated.time(wgrad)[1] == pytest.approx(wgrad["flops"] / (bf16_tf * 1e12), rel=1e-9)
    # an unmeasured shape of a measured kind: the mean measured fraction
    output = gemm("act x act -> act", "forward", 32000, 4096, 4096)
    assert calibrated.time(output)[1] == pytest.approx(output["flops"] / (bf16_tf * 1e12), rel=1e-9)
    # memory-bound: the measured fraction of the H200's 4.8 TB/s, applied to the H100's 3.35 TB/s
    norm = kernel("rmsnorm_forward")
    assert calibrated.time(norm)[1] == pytest.approx(1e9 / (norm_gbs * 1e9 / 4.8e12 * 3.35e12), rel=1e-9)
    assert S.Rates(A.GPUS["H200"], c).time(norm)[1] == pytest.approx(1 / norm_gbs, rel=1e-9)  # where it was measured
    # bench_kernels' weight case names its tensor: the list's transpose_fp8
    transpose = kernel("transpose_fp8")
    assert calibrated.time(transpose)[1] == pytest.approx(2e9 / (norm_gbs * 1e9 / 4.8e12 * 3.35e12), rel=1e-9)
    attention = kernel("attention_forward", 0.0, 1.7e13)
    assert calibrated.time(attention)[1] == pytest.approx(1.7e13 / (att_tf * 1e12), rel=1e-9)
    # what was not measured keeps its assumed rate
    for op in (kernel("swiglu_forward"), kernel("attention_backward", 0.0, 1e13)):
        assert calibrated.time(op) == sheet.time(op)
    replaced = CAL.replaced_rates(c)
    assert len(replaced) == 2 * 3 + 1 + 2  # GEMMs: 2 precisions x 3 kinds, attention forward, two kernels
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


def test_train_logs_predicted_vs_measured(tmp_path, rng, capsys):
    ms = {p: rng.uniform(200, 900, size=6) for p in ("bf16", "fp8")}
    write_train_log(tmp_path / "train_bf16.log", "bf16", ms["bf16"])
    write_train_log(tmp_path / "train_fp8.log", "fp8", ms["fp8"])
    status, out, err = run(capsys, "--calibrate", tmp_path, "--models", "llama2-7b", "--gpus", "H100", "--topologies",
                           "1x8", "--json")
    assert status == 0, err
    rows = json.loads(out)["measured_vs_predicted"]
    by_what = {r["what"].split(",")[0]: r for r in rows}
    for p in ("bf16", "fp8"):
        row = by_what[f"train llama2-7b L4 {p} -b 1 -t 4096 x8 on H200"]
        # the mean leaves out the first two (warm-up) steps
        assert row["measured"] == pytest.approx(np.mean(ms[p][2:]), rel=1e-3)
        # the trainer's own step at the log's flags: one GPU, 4 layers, 8 micro-steps
        single = S.Run(model="llama2-7b", precision=p, gpu="H200", nodes=1, gpus_per_node=1, B=1, T=4096,
                       tokens=8 * 4096, zero=0, recompute=0, n_layers=4)
        listing, dims = S.step_ops(single, 0)
        assert dims[1] == 4 and listing["grad_accum"] == 8
        assert row["datasheet"] == pytest.approx(S.predict(single, S.Rates(A.GPUS["H200"]))["step_ms"])
        assert row["calibrated"] == pytest.approx(row["datasheet"])  # no rates were measured
    speedup = by_what["train llama2-7b L4 fp8 / bf16 tokens/s on H200"]
    assert speedup["measured"] == pytest.approx(np.mean(ms["bf16"][2:]) / np.mean(ms["fp8"][2:]), rel=1e-3)


def test_calibration_reads_the_device_checks_archive(tmp_path, rng, capsys):
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
    s1, from_logs, e1 = run(capsys, "--calibrate", logs, *args)
    s2, from_archive, e2 = run(capsys, "--calibrate", out, *args)
    assert s1 == 0 and s2 == 0, e1 + e2
    a, b = json.loads(from_logs), json.loads(from_archive)
    assert a["predictions"] == b["predictions"] and a["measured_vs_predicted"] == b["measured_vs_predicted"]
    assert len(a["measured_vs_predicted"]) > 0


def test_slow_gemms_give_what_it_would_take(tmp_path, capsys):
    # FP8 GEMMs measured at 500 TFLOP/s put 7B below 18,000 tokens/s/GPU: the section says by how much
    write_gemm_log(tmp_path / "gemm.log", 500.0, 400.0)
    (tmp_path / "device.txt").write_text("NVIDIA H100 80GB HBM3, 9.0, 81559 MiB, 570.86\n")
    args = ["--calibrate", tmp_path, "--models", "llama2-7b", "--gpus", "H100", "--topologies", "1x8"]
    status, out, err = run(capsys, *args, "--json")
    assert status == 0, err
    result = json.loads(out)
    takes = result["what_it_takes"]
    assert takes["predicted"] < A.TARGET_7B_FP8
    tokens = result["predictions"][1]["tokens_per_gpu_step"]
    assert takes["must_lose_ms"] == pytest.approx(takes["step_ms"] - 1e3 * tokens / A.TARGET_7B_FP8)
    gemm = next(t for t in takes["terms"] if t["term"] == "gemm")
    assert 0 < gemm["alone_change"] < 1
    status, out, err = run(capsys, *args)
    assert "must lose" in out and "replaced datasheet rates (6, measured on H100)" in out


KERNEL_LINES = f"[ rmsnorm ] ops; {SHAPE_7B}, seed 1\n    rmsnorm_forward: 41.2 us, 2000.0 GB/s\n"


@pytest.mark.parametrize("files,message", [
    ({"a.log": DEVICE_LINE + "\n" + KERNEL_LINES, "b.log": DEVICE_LINE.replace("H200", "H800") + "\n"}, "several GPUs"),
    ({"train.log": "step    3/10 | loss 1 | lr 1 | norm 1 | 5.0 ms | 9 tok/s\n" * 4}, "header line"),
    ({"notes.txt": "nothing to see\n"}, "nothing recognised"),
    ({"k.log": KERNEL_LINES}, "--measured-on"),
])
def test_calibration_errors(tmp_path, files, message, capsys):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    status, _, err = run(capsys, "--calibrate", tmp_path)
    assert status == 2
    assert message in err and len(err.strip().splitlines()) == 1, err
    status, _, err = run(capsys, "--calibrate", tmp_path / "absent")
    assert status == 2 and "absent: no such file" in err


# --- orderings that must hold -----------------------------------------------------------------------

def test_fp8_gemms_faster_than_bf16_at_every_shape():
    """Every GEMM shape of the 7B step runs faster in FP8 than the same shape in BF16, on every GPU."""
    fp8, _ = S.step_ops(run_of(precision="fp8"), 0)
    bf16, _ = S.step_ops(run_of(precision="bf16"), 0)
    shapes = {tuple(o["shape"][:3]): o for o in bf16["ops"] if o["kind"] == "gemm"}
    pairs = [(o, shapes[tuple(o["shape"][:3])]) for o in fp8["ops"] if "E4M3" in o["detail"]]
    assert len(pairs) >= 4 * 3
    for gpu in A.GPUS.values():
        rates = S.Rates(gpu)
        for a, b in pairs:
            assert rates.time(a)[1] < rates.time(b)[1], a


def test_more_gpus_amortize_the_same_batch():
    """The same global batch over 16 GPUs instead of 8: fewer micro-steps per collective, so no more
    tokens/s/GPU than on 8; every row's split adds up to its step and exposes no more than it sends."""
    per_gpu = []
    for nodes in (1, 2):
        r = S.predict(run_of(gpu="H800", nodes=nodes, accum=16 // nodes), S.Rates(A.GPUS["H800"]))
        assert 0 <= r["comm_exposed_ms"] <= r["comm_total_ms"]
        assert sum(r["split_ms"].values()) == pytest.approx(r["step_ms"])
        per_gpu.append(r["tokens_per_s_per_gpu"])
    assert per_gpu[0] > per_gpu[1]


def test_faster_links_and_overlap_never_hurt():
    base = dict(model="llama2-13b", precision="fp8", accum=16, zero=2)
    tok = {}
    for gpu in ("H100", "H800"):
        for overlap in (True, False):
            tok[gpu, overlap] = S.predict(run_of(gpu=gpu, overlap=overlap, **base),
                                          S.Rates(A.GPUS[gpu]))["tokens_per_s_per_gpu"]
    assert tok["H100", True] > tok["H800", True]
    assert tok["H100", True] > tok["H100", False]
    assert tok["H800", True] > tok["H800", False]


# --- the command line ---------------------------------------------------------------------------------

def test_default_report_and_json(capsys):
    status, out, err = run(capsys)
    assert status == 0, err
    for model in ("llama2-7b", "llama2-13b"):
        for gpus in ("1x8 H100", "2x8 H100", "1x8 H800", "2x8 H800"):
            for precision in ("bf16", "fp8"):
                assert any(line.startswith(f"| {model}") and f"| {precision}" in line and gpus in line
                           for line in out.splitlines()), (model, gpus, precision)
    assert "== What it would take: llama2-7b fp8 1x8 H100, target 18,000 tokens/s/GPU" in out
    assert "== Gradient reduction, fp8 training" in out
    status, out, err = run(capsys, "--json")
    assert status == 0, err
    result = json.loads(out)
    assert len(result["predictions"]) == 2 * 2 * 2 * 2
    for r in result["predictions"]:
        for key in ("tokens_per_s_per_gpu", "step_ms", "mfu_llmc", "mfu_megatron", "memory_gib"):
            assert math.isfinite(r[key]) and r[key] > 0, key
        assert 0 < r["mfu_llmc"] < 1 and abs(r["mfu_llmc"] / r["mfu_megatron"] - 1) < 0.01
    rows = result["grad_reduce_comparison"]
    assert [(r["model"], r["gpus"], r["grad_reduce"]) for r in rows] == [
        (m, f"{n}x{g} {gpu}", red) for m, gpu, n, g in R.GRAD_REDUCE_PLANS for red in R.GRAD_REDUCTIONS]
    # the comparison's rows are the table's: fp8 13B on 2 x 8 H800
    row = next(r for r in result["predictions"] if (r["model"], r["precision"], r["gpus"]) == ("llama2-13b", "fp8",
                                                                                                 "2x8 H800"))
    assert rows[0]["tokens_per_s_per_gpu"] == pytest.approx(row["tokens_per_s_per_gpu"])
    for r in rows:
        assert r["grad_wire_bytes_per_element"] == pytest.approx({"fp32": 4, "bf16": 2, "fp8": 1}[r["grad_reduce"]],
                                                                 rel=1e-3)


def test_formats_flags_reach_the_trainer():
    """--grad-buffer, --master-weights and --optim-state are the trainer's: its plan shrinks on 8 GPUs
    (ZeRO-1) and on one (ZeRO-0), and it refuses --grad-buffer under ZeRO-2, which the model passes on."""
    formats = dict(grad_buffer="fp8", master_weights="fp16", optim_state="fp8")
    for per_node, zero in ((8, 1), (1, 0)):
        base = S.predict(run_of(gpu="H800", per_node=per_node, zero=zero), H100)
        small = S.predict(run_of(gpu="H800", per_node=per_node, zero=zero, **formats), H100)
        assert (small["grad_buffer"], small["master_weights"], small["optim_state"]) == ("fp8", "fp16", "fp8")
        assert small["memory_gib"] < base["memory_gib"]
    with pytest.raises(S.InputError, match="--grad-buffer"):
        S.predict(run_of("llama2-13b", zero=2, **formats), H100)


@pytest.mark.parametrize("args,message", [
    (["--grad-reduce", "fp16"], "--grad-reduce"),
    (["--grad-buffer", "bf16", "--models", "llama2-13b", "--topologies", "1x8"], "--grad-buffer"),
    (["--models", "llama2-8b"], "llama2-8b"),
    (["--topologies", "8"], "flag --topologies: '8'"),
    (["--global-batch", "1000"], "flag --global-batch: 1000 tokens"),
])
def test_bad_flags(args, message, capsys):
    status, _, err = run(capsys, *args)
    assert status == 2 and message in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("args", [["--recompute", "full:3"], ["--gpus", "H100", "--nic-gbits", "0"]])
def test_bad_flags_argparse(args, capsys):
    with pytest.raises(SystemExit) as e:
        pm.main(args)
    assert e.value.code == 2
