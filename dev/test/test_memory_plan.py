"""
The memory plan (--dry-run 1, train/memory_plan.h) against what the trainer really allocates, and the
memory targets of DESIGN.md section 9 as the plan computes them.

A plan prints the trainer's buffer tables as a run prints them at start-up, so the CPU build's plan of a
setting is compared line by line with a real run of the same setting, on one process and on 2 and 3
ranks under mpirun (rank 0's tables against --ranks N). The verdict and the micro-batch search are
checked against plans of neighbouring micro-batches; the targets (an fp8 run never needs more than the
bf16 run of its shape; Llama-2 7B fp8 at B 1, T 4096 on one 141 GB H200; 7B ZeRO-1 and 13B ZeRO-2 on
8 x 80 GB) on the GPU build's plan, which needs no GPU, and the CPU build's.
"""
import json
import os
import re

import numpy as np
import pytest

from conftest import REPO, run
from test_distributed import MPIRUN, mpirun

TABLE_TITLES = ("| weights, gradients and optimizer state:", "| activations:", "| scales, RoPE tables and tokens:")
BASE = ["-e", "tiny", "-b", "2", "-t", "32", "--shuffle", "0", "-v", "0", "-m", "1"]
# Memory the GPUs report (nvidia-smi memory.total): 80 GB parts 81559 MiB, the H200 143771 MiB.
GIB_80GB = 81559 / 1024
GIB_H200 = 143771 / 1024
GPU_TRAINER = REPO / "train_llama"


def tables(text):
    """The buffer tables a run or a plan printed: each title line and its entries, in order."""
    lines, inside = [], False
    for line in text.splitlines():
        if line.startswith(TABLE_TITLES):
            inside = True
        elif not line.startswith("|   "):
            inside = False
        if inside:
            lines.append(line)
    assert [line.split(":")[0] + ":" for line in lines if line.startswith(TABLE_TITLES)] == list(TABLE_TITLES), text[-3000:]
    return lines


def plan(binary, *args):
    """(stdout, the plan's JSON line) of a dry run."""
    r = run([binary, "--dry-run", "1", *map(str, args)])
    assert r.returncode == 0, r.stderr
    last = r.stdout.strip().splitlines()[-1]
    assert last.startswith("plan: "), r.stdout[-2000:]
    return r.stdout, json.loads(last[len("plan: "):])


def plans_7b_zero1(binary, flag, values):
    """{value: plan JSON} of Llama-2 7B (B 1, T 4096) under ZeRO-1 over 8 ranks of 80 GB, with `flag value`;
    skips where the binary is not built (the CUDA build needs nvcc)."""
    path = REPO / binary
    if not path.exists():
        pytest.skip(f"{binary} is not built (the CUDA build needs nvcc)")
    args = ["-e", "llama2-7b", "-b", 1, "-t", 4096, "--ranks", 8, "-z", 1, "-d", 8 * 4096, "--gpu-mem", 80]
    return {v: plan(path, *args, flag, v)[1] for v in values}


@pytest.fixture
def shards(tmp_path, rng):
    """Train and validation shards of random tokens (a dry run must not need them; a real run does)."""
    paths = []
    for name in ["train.bin", "val.bin"]:
        header = np.zeros(256, dtype=np.int32)
        header[:3] = [20240520, 1, 4096]
        (tmp_path / name).write_bytes(header.tobytes() + rng.integers(3, 32000, size=4096).astype(np.uint16).tobytes())
        paths.append(tmp_path / name)
    return ["-i", paths[0], "-j", paths[1]]


@pytest.mark.parametrize("flags", [["-p", "fp8"], ["-p", "bf16", "-r", "1"], ["-p", "fp8", "-r", "2"], ["-p", "fp32", "-z", "1"],
                                   ["-p", "fp8", "--optim-state", "fp8"], ["-p", "bf16", "--optim-state", "bf16"],
                                   ["-p", "fp8", "--grad-buffer", "fp8"], ["-p", "bf16", "--grad-buffer", "bf16"],
                                   ["-p", "fp8", "--master-weights", "fp16"]])
def test_plan_is_what_a_run_allocates(trainer, tmp_path, shards, flags):
    real = run([trainer, *BASE, *shards, *flags, "-x", "1"])
    assert real.returncode == 0, real.stderr
    text, summary = plan(trainer, *BASE, *flags)
    assert tables(text) == tables(real.stdout)
    # the summary adds up: every table's bytes plus the workspaces, once
    assert sum(summary["bytes"].values()) == summary["total_bytes"]


@pytest.mark.skipif(MPIRUN is None, reason="mpirun not found (make setup installs Open MPI)")
@pytest.mark.parametrize("ranks, zero, extra", [(2, 2, []), (3, 1, []),
                                                 (2, 1, ["--grad-buffer", "fp8", "--master-weights", "fp16"])])
def test_plan_of_ranks_is_what_rank_0_allocates(trainer, tmp_path, shards, ranks, zero, extra):
    """--ranks N plans rank 0 of an mpirun -np N run: the sharded master weights, moments, gradient shard
    and bucket buffers (ZeRO-2's, and those of an fp8 gradient buffer), an fp16 master with its scales
    and scratch, padded pieces included."""
    flags = [*BASE, *shards, "-p", "fp8", "-z", zero, *extra]
    real = mpirun(ranks, [*flags, "-x", "1"])
    assert real.returncode == 0, real.stderr
    text, summary = plan(trainer, *flags, "--ranks", ranks)
    assert tables(text) == tables(real.stdout)
    assert summary["ranks"] == ranks and summary["zero"] == zero


@pytest.mark.parametrize("binary", ["train_llama_cpu", "train_llama"])
def test_optim_state_bytes(binary):
    """--optim-state: the AdamW moments of Llama-2 7B (ZeRO-1 over 8 ranks: one shard) take 8 bytes per
    element of the shard in fp32, 4 in bf16, and 3 in fp8 plus two FP32 scale_inv per 4096 elements; the
    plan's other categories do not move."""
    found = plans_7b_zero1(binary, "--optim-state", ("fp32", "bf16", "fp8"))
    moments = {f: p["bytes"]["AdamW moments"] for f, p in found.items()}
    shard = moments["fp32"] / 8
    assert shard == int(shard) and int(shard) % 4096 == 0, moments
    align = 3 * 256  # each of the (up to) 3 buffers is padded to core/buffers.h's BUFFER_ALIGN
    assert abs(moments["bf16"] - 4 * shard) < align, moments
    assert abs(moments["fp8"] - (3 * shard + 8 * shard / 4096)) < align, moments
    for f in ("bf16", "fp8"):
        assert found[f]["optim_state"] == f
        rest = {k: v for k, v in found[f]["bytes"].items() if k != "AdamW moments"}
        assert rest == {k: v for k, v in found["fp32"]["bytes"].items() if k != "AdamW moments"}, f


def padded(count, ranks):
    """A segment's elements in the full layout of `ranks` shards: whole 4096-element chunks per piece."""
    return -(-(-(-count // 4096)) // ranks) * 4096 * ranks


@pytest.mark.parametrize("binary", ["train_llama_cpu", "train_llama"])
def test_grad_buffer_bytes(binary):
    """--grad-buffer: the gradients of Llama-2 7B under ZeRO-1 over 8 ranks are the full buffer (4 bytes
    per element of the full layout in fp32, 2 in bf16, 1 plus a 4-byte scale_inv per 4096 in fp8), the
    FP32 gradient shard and, for bf16 and fp8, three FP32 bucket buffers: two of a layer's padded
    segments, one of the larger of the embedding and the head (final norm + output). The segment sizes
    are Llama-2 7B's shapes, not the plan's; the other categories do not move."""
    found = plans_7b_zero1(binary, "--grad-buffer", ("fp32", "bf16", "fp8"))
    grads = {f: p["bytes"]["gradients"] for f, p in found.items()}
    C, F, V, L, W = 4096, 11008, 32000, 32, 8
    layer = [C, 3 * C * C, C * C, C, 2 * F * C, F * C]  # attn_norm, wqkv, wo, ffn_norm, w1|w3, w2
    full = padded(V * C, W) + L * sum(padded(c, W) for c in layer) + padded(C, W) + padded(V * C, W)
    shard = full // W
    buckets = 2 * sum(padded(c, W) for c in layer) + max(padded(V * C, W), padded(C, W) + padded(V * C, W))
    align = 6 * 256  # each buffer padded to core/buffers.h's BUFFER_ALIGN
    want = {"fp32": 4 * full + 4 * shard, "bf16": 2 * full + 4 * shard + 4 * buckets,
            "fp8": full + 4 * (full // 4096) + 4 * shard + 4 * buckets}
    for f in want:
        assert 0 <= grads[f] - want[f] < align, (f, grads[f], want[f])
        assert found[f]["grad_buffer"] == f
        rest = {k: v for k, v in found[f]["bytes"].items() if k != "gradients"}
        assert rest == {k: v for k, v in found["fp32"]["bytes"].items() if k != "gradients"}, f
    assert (grads["fp32"] - grads["fp8"]) / 2**30 > 16, grads  # of 28 GiB: what the 7B plan saves


@pytest.mark.parametrize("binary", ["train_llama_cpu", "train_llama"])
def test_master_weights_bytes(binary):
    """--master-weights: Llama-2 7B's master shard under ZeRO-1 over 8 ranks takes 4 bytes per element of
    the shard in fp32; in fp16 2, plus a 4-byte scale_inv per 4096 and an FP32 scratch of the largest
    segment piece (the embedding's or the output layer's V x C / 8, padded). Segment sizes from Llama-2
    7B's shapes; the other categories do not move."""
    found = plans_7b_zero1(binary, "--master-weights", ("fp32", "fp16"))
    master = {f: p["bytes"]["master weights"] for f, p in found.items()}
    C, F, V, L, W = 4096, 11008, 32000, 32, 8
    layer = [C, 3 * C * C, C * C, C, 2 * F * C, F * C]
    shard = (padded(V * C, W) + L * sum(padded(c, W) for c in layer) + padded(C, W) + padded(V * C, W)) // W
    piece = padded(V * C, W) // W
    align = 3 * 256
    want = {"fp32": 4 * shard, "fp16": 2 * shard + 4 * (shard // 4096) + 4 * piece}
    for f in want:
        assert 0 <= master[f] - want[f] < align, (f, master[f], want[f])
        assert found[f]["master_weights"] == f
        rest = {k: v for k, v in found[f]["bytes"].items() if k != "master weights"}
        assert rest == {k: v for k, v in found["fp32"]["bytes"].items() if k != "master weights"}, f


def test_plan_needs_no_data(trainer, tmp_path):
    text, summary = plan(trainer, *BASE, "-i", tmp_path / "none_train.bin", "-j", tmp_path / "none_val.bin")
    assert summary["fits"] in (0, 1) and "| memory:" in text


def test_verdict_and_largest_micro_batch(trainer):
    """The verdict flips where the usable memory crosses the plan's total; the largest micro-batch that
    fits a usable memory between the totals of B 3 and B 4 is 3; the cheapest recompute that fits one
    between the totals of -r 1 and -r 0 is 1."""
    plans = {(b, r): plan(trainer, *BASE, "-b", b, "-r", r, "--gpu-mem", 1)[1] for b in (3, 4) for r in (0, 1)}
    total = {key: p["total_bytes"] for key, p in plans.items()}
    usable_fraction = plans[3, 0]["usable_bytes"] / 2**30
    between = (total[3, 0] + total[4, 0]) / 2 / 2**30 / usable_fraction
    _, s = plan(trainer, *BASE, "-b", 3, "--gpu-mem", between)
    assert s["fits"] == 1 and s["largest_B"] == 3 and s["cheapest_recompute"] == 0
    _, s = plan(trainer, *BASE, "-b", 4, "--gpu-mem", between)
    assert s["fits"] == 0 and s["largest_B"] == 3
    assert total[4, 1] < total[4, 0]
    _, s = plan(trainer, *BASE, "-b", 4, "--gpu-mem", (total[4, 1] + total[4, 0]) / 2 / 2**30 / usable_fraction)
    assert s["fits"] == 0 and s["cheapest_recompute"] == 1


LAYERS = {"tiny": 4, "llama2-7b": 32, "llama2-13b": 40}


def scale_record_bytes(layers):
    """fp8_scales (16 bytes) and fp8_counts (32 bytes) of the 3 operands of 4 linear layers per block, each
    table entry padded to 256 bytes (core/buffers.h BUFFER_ALIGN)."""
    return sum(-(-(layers * 4 * 3 * size) // 256) * 256 for size in (16, 32))


def compare_precisions(binary, model, ranks, zero, recompute, memory_gib):
    args = ["-e", model, "-b", 1, "-t", 4096 if model.startswith("llama2") else 256, "--ranks", ranks, "-z", zero,
            "-r", recompute, "--gpu-mem", memory_gib]
    fp8 = plan(binary, *args, "-p", "fp8")[1]
    bf16 = plan(binary, *args, "-p", "bf16")[1]
    return fp8, bf16


def test_plan_counts_the_hopper_model_scratch(trainer):
    """--fp8-accum hopper: the CPU plan adds the Hopper model's decoded operands, 2 (m + n) k bytes of the
    largest block-linear GEMM (tiny, N 64: w13's dgrad, (C + N) 2 F), and nothing else."""
    _, exact = plan(trainer, *BASE, "-p", "fp8")
    _, hopper = plan(trainer, *BASE, "-p", "fp8", "--fp8-accum", "hopper")
    assert "gemm_hopper" not in exact["workspaces"]
    N, C, F = 2 * 32, 128, 384  # BASE's -b 2 -t 32 on tiny (dim 128, ffn_dim 384)
    assert hopper["workspaces"]["gemm_hopper"] == 2 * (C + N) * 2 * F, hopper["workspaces"]
    assert hopper["total_bytes"] - exact["total_bytes"] == hopper["workspaces"]["gemm_hopper"]


@pytest.mark.parametrize("binary", ["train_llama_cpu", "train_llama"])
def test_fp8_never_needs_more_than_bf16(binary):
    """Apart from its per-operand scale and count records (48 bytes per FP8 operand), an fp8 run needs no
    more than the bf16 run of its shape at every recompute level and ZeRO stage; at -r 0, where fp8 keeps
    E4M3 X^T copies instead of BF16 inputs, it needs less."""
    path = REPO / binary
    if not path.exists():
        pytest.skip(f"{binary} is not built (the CUDA build needs nvcc)")
    for model in ["tiny", "llama2-7b", "llama2-13b"]:
        for ranks, zero in [(1, 0), (8, 1), (8, 2)]:
            for recompute in range(3):
                fp8, bf16 = compare_precisions(path, model, ranks, zero, recompute, 80)
                where = f"{binary} {model} {ranks} rank(s) ZeRO-{zero} -r {recompute}"
                records = fp8["bytes"]["other"] - bf16["bytes"]["other"]
                assert records == scale_record_bytes(LAYERS[model]), where
                assert fp8["total_bytes"] - records <= bf16["total_bytes"], where
                if recompute == 0:
                    assert fp8["total_bytes"] < bf16["total_bytes"], where


@pytest.mark.skipif(not GPU_TRAINER.exists(), reason="train_llama is not built (the CUDA build needs nvcc)")
def test_gpu_targets():
    """DESIGN.md section 9 on the GPU build's plan: full 7B at B 1, T 4096 trains on one H200 in fp8 (and
    bf16); 7B with ZeRO-1 and 13B with ZeRO-2 fit 8 x 80 GB at T 4096 in both precisions."""
    for precision in ["fp8", "bf16"]:
        _, s = plan(GPU_TRAINER, "-e", "llama2-7b", "-b", 1, "-t", 4096, "-p", precision, "--gpu-mem", GIB_H200)
        assert s["fits"] == 1, s
        for model, zero in [("llama2-7b", 1), ("llama2-13b", 2)]:
            _, s = plan(GPU_TRAINER, "-e", model, "-b", 1, "-t", 4096, "-p", precision, "--ranks", 8, "-z", zero,
                        "-d", 128 * 4096, "--gpu-mem", GIB_80GB)
            assert s["cheapest_recompute"] >= 0 and s["grad_accum"] == 16, s


@pytest.mark.skipif(MPIRUN is None, reason="mpirun not found (make setup installs Open MPI)")
def test_dry_run_refuses_a_launcher():
    r = mpirun(1, ["--dry-run", "1"])
    assert r.returncode != 0 and "--dry-run" in r.stderr


# cuDNN SDPA backward workspaces, restated from the cuDNN frontend's header
# (cudnn_frontend/node/scaled_dot_product_flash_attention.h, CompositeSDPABackwardNode: expand_node decides,
# get_fe_workspace_size_node sizes): the softmax row sums (b h s_q FP32) always; the FP32 dQ accumulator
# (b h s_q d) off the dP path; dP (b h s_q s_kv BF16, s_q rounded up to 64 and s_kv to 128 on Hopper) on it.
# A deterministic backward takes the dP path unless cuDNN >= 9.25 and the limit variable is set below dP.
DP_LIMIT = "CUDNN_FRONTEND_ATTN_DP_WORKSPACE_LIMIT"


def round_up(x, to):
    return -(-x // to) * to


def gpu_attention_plan(T, deterministic, limit=None):
    env = {k: v for k, v in os.environ.items() if k not in ("LLM8_DETERMINISTIC", DP_LIMIT)}
    if deterministic:
        env["LLM8_DETERMINISTIC"] = "1"
    if limit is not None:
        env[DP_LIMIT] = str(limit)
    r = run([GPU_TRAINER, "--dry-run", "1", "-e", "llama2-7b", "-b", 1, "-t", T, "-p", "fp8", "--gpu-mem", GIB_H200], env=env)
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout.strip().splitlines()[-1][len("plan: "):])
    line = next(l for l in r.stdout.splitlines() if "cudnn_attention" in l and l.startswith("|"))
    return summary, line


@pytest.mark.skipif(not GPU_TRAINER.exists(), reason="train_llama is not built (the CUDA build needs nvcc)")
@pytest.mark.parametrize("T", [4096, 4032])
def test_gpu_plan_counts_the_deterministic_attention_workspace(T):
    """LLM8_DETERMINISTIC=1 makes cuDNN's SDPA backward hold dP on Hopper: 1 GiB more for Llama-2 7B at B 1,
    T 4096 than the FP32 dQ accumulator of the default backward; the plan counts it, in the total too."""
    B, NH, HS = 1, 32, 128
    row_sums = B * NH * T * 4
    fastest, fastest_line = gpu_attention_plan(T, False)
    assert fastest["workspaces"]["cudnn_attention"] == B * NH * T * HS * 4 + row_sums, fastest_line
    dp = B * NH * round_up(T, 64) * round_up(T, 128) * 2
    det, det_line = gpu_attention_plan(T, True)
    assert "dP workspace path" in det_line, det_line
    assert det["workspaces"]["cudnn_attention"] == dp + row_sums, det_line
    assert det["total_bytes"] - fastest["total_bytes"] == dp - B * NH * T * HS * 4
    assert sum(det["workspaces"].values()) <= det["bytes"]["workspaces"]  # the category holds table buffers too
    if T == 4096:
        assert dp == 1 << 30
    # -1 (no limit) changes nothing with cuDNN 9; 0 selects the linear ordered-dQ engine only from cuDNN 9.25
    version = tuple(int(v) for v in re.search(r"cuDNN (\d+)\.(\d+)", det_line).groups())
    assert version >= (9, 0), det_line
    assert gpu_attention_plan(T, False, -1)[0]["workspaces"] == fastest["workspaces"]
    limited, line = gpu_attention_plan(T, True, 0)
    want = fastest["workspaces"]["cudnn_attention"] if version >= (9, 25) else dp + row_sums
    assert limited["workspaces"]["cudnn_attention"] == want, line


# NCCL's defaults, restated from its environment-variable documentation and source (NVIDIA/nccl
# src/init.cc DEFAULT_*_BUFFSIZE, src/include/device.h): one connection's protocol buffers, Simple
# (NCCL_BUFFSIZE, 4 MiB), LL (8 lines x 512 threads x 8 steps x 16-byte lines) and LL128 (120 elements x
# 640 threads x 8 steps x 8 bytes); NVLS: NCCL_NVLS_CHUNKSIZE 128 KiB, 8 steps, 16 channels on Hopper
# (src/transport/nvls.cc). On an 8-GPU H100 node NCCL reports 32 collective and 32 p2p channels per peer.
NCCL_CONNECTION = (4 << 20) + 8 * 512 * 8 * 16 + 120 * 640 * 8 * 8
NCCL_VARS = ("NCCL_BUFFSIZE", "NCCL_LL_BUFFSIZE", "NCCL_LL128_BUFFSIZE", "NCCL_MAX_NCHANNELS", "NCCL_MAX_P2P_NCHANNELS",
             "NCCL_NVLS_ENABLE", "NCCL_NVLS_CHUNKSIZE", "NCCL_NVLS_NCHANNELS")


def gpu_plan(*args, **nccl_env):
    env = {k: v for k, v in os.environ.items() if k not in NCCL_VARS}
    env.update({k: str(v) for k, v in nccl_env.items()})
    r = run([GPU_TRAINER, "--dry-run", "1", "-e", "llama2-7b", "-b", 1, "-t", 4096, "-p", "fp8", "-d", 8 * 4096,
             "--gpu-mem", GIB_80GB, *map(str, args)], env=env)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1][len("plan: "):])["workspaces"]


@pytest.mark.skipif(not GPU_TRAINER.exists(), reason="train_llama is not built (the CUDA build needs nvcc)")
def test_gpu_plan_counts_nccl_checkpoint_staging_and_context(tmp_path):
    """The GPU plan's rows outside the tables that a multi-rank run adds: NCCL's ring and tree buffers, the
    FP8 wire's peer connections (every node peer on 32 p2p channels) and NVLink SHARP's buffers, each as
    NCCL's variables bound them, the checkpoint staging of a sharded run that writes checkpoints, and the
    CUDA context estimate and host-value buffer every run has."""
    one = gpu_plan("--ranks", 1, "-z", 1, "--grad-reduce", "fp8")
    assert one["cuda_context"] >= 256 << 20 and one["comm_host"] == 1 << 20
    assert not {"nccl_buffers", "nccl_p2p", "nccl_nvls", "checkpoint_staging"} & one.keys(), one  # one rank: no NCCL
    eight = gpu_plan("--ranks", 8, "-z", 1, "--grad-reduce", "fp8", "-o", tmp_path / "run")
    assert eight["nccl_buffers"] == 32 * 2 * NCCL_CONNECTION
    assert eight["nccl_p2p"] == 7 * 32 * NCCL_CONNECTION
    assert eight["nccl_nvls"] == 16 * 2 * (128 << 10) * 8 * 8
    # ZeRO-1 pieces of 7B on 8 ranks: the largest (the embedding's, 32000 x 4096 / 8 padded to 4096-element
    # chunks) is below 16 Mi / 8 floats, so the staging holds 8 of them
    piece = -(-32000 * 4096 // 8 // 4096) * 4096
    assert eight["checkpoint_staging"] == 8 * min(piece, (1 << 24) // 8) * 4
    # what bounds them: the variables NCCL reads, and the flags
    bounded = gpu_plan("--ranks", 8, "-z", 1, "--grad-reduce", "fp8", NCCL_MAX_P2P_NCHANNELS=4, NCCL_BUFFSIZE=1 << 20,
                       NCCL_NVLS_ENABLE=0)
    connection = (1 << 20) + 8 * 512 * 8 * 16 + 120 * 640 * 8 * 8
    assert bounded["nccl_p2p"] == 7 * 4 * connection and "nccl_nvls" not in bounded
    assert "checkpoint_staging" not in bounded  # no -o: no checkpoints
    assert "nccl_p2p" not in gpu_plan("--ranks", 8, "-z", 1, "--grad-reduce", "fp32")
    assert "checkpoint_staging" not in gpu_plan("--ranks", 8, "-z", 1, "-o", tmp_path / "run", "-n", -1)
