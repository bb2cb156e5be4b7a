"""
--grad-reduce fp8 (comm/grad_fp8.h, comm/comm_mpi.h): the FP8 gradient wire of the CPU build against an
independent numpy / ml_dtypes transcription of its description, and against the float64 exact sum with
the error bound the header derives.

The format, as described (not read from the C): a piece of n FP32 elements is cut into 4096-element
chunks (ZERO_CHUNK, the last one short); a chunk with amax = max |x| gets scale 2^floor(log2(448 / amax))
(1 when amax is 0), its codes are E4M3 of x * scale (round to nearest even; nothing saturates since
amax * scale <= 448), and it travels with scale_inv = 1 / scale, or NaN when the chunk holds a NaN or an
Inf. The receiver sums the dequantized contributions (code value * scale_inv) in FP32, in rank order:
acc = recv (accumulating) + v_0 + v_1 + ... Under ZeRO-0 (all-reduce) the buffer is zero-padded to W
pieces of ceil(chunks / W) whole chunks, reduce-scattered so, and the FP32 sums all-gathered.

Error bound per contribution: |dequant(q(x)) - x| <= 2^-4 |x| + 2^-10 / scale (half a step of 3
mantissa bits; half the smallest E4M3 subnormal 2^-9 below the normal range), plus the FP32 rounding of
the additions. The C side runs under mpirun with 2 and 3 ranks through dev/tools/numerics.c's modes
--grad-fp8-pack and --grad-reduce-fp8. Inputs are fresh random numbers (the `rng` fixture's seed is
printed) with a wide dynamic range across chunks (2^-60 .. 2^60) and within them, plus a zero chunk, a NaN
on one rank and an Inf on another in the same run. Last, the trainer on 2 ranks with --grad-reduce fp8.
"""
import json
import math
import os
import shutil
import subprocess

import ml_dtypes
import numpy as np
import pytest

from conftest import REPO, requires_data, run
from test_distributed import assert_same_run, mpi_env, train, trajectory

MPIRUN = shutil.which("mpirun")
CHUNK = 4096
E4M3 = ml_dtypes.float8_e4m3fn
MPI_ENV = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_rmaps_base_oversubscribe": "1", "OMP_NUM_THREADS": "1"}
needs_mpi = pytest.mark.skipif(MPIRUN is None, reason="mpirun not found (make setup installs Open MPI)")


# ---------------------------------------------------------------- the reference, from the description

def ref_chunk_scale(seg):
    """(scale, scale_inv) of one chunk (float64 math, exact for powers of two)."""
    if not np.all(np.isfinite(seg)):
        return 1.0, math.nan
    amax = float(np.max(np.abs(seg))) if seg.size else 0.0
    if amax == 0.0:
        return 1.0, 1.0
    e = min(math.floor(math.log2(448.0 / amax)), 127)  # a float32 scale: at most 2^127
    return 2.0 ** e, 2.0 ** -e


def ref_pack(x):
    """(codes uint8 (n), scale (chunks) float64, scale_inv (chunks) float32) of float32 x."""
    n = x.size
    chunks = -(-n // CHUNK)
    codes = np.empty(n, np.uint8)
    scale = np.empty(chunks)
    scale_inv = np.empty(chunks, np.float32)
    for c in range(chunks):
        seg = x[c * CHUNK:(c + 1) * CHUNK]
        s, si = ref_chunk_scale(seg)
        y = seg.astype(np.float64) * s
        y = np.where(np.isnan(y), 0.0, np.clip(y, -448.0, 448.0))  # Inf saturates; NaN codes are +0
        codes[c * CHUNK:(c + 1) * CHUNK] = y.astype(np.float32).astype(E4M3).view(np.uint8)
        scale[c], scale_inv[c] = s, si
    return codes, scale, scale_inv


def ref_dequant(x):
    codes, scale, scale_inv = ref_pack(x)
    per_elem = np.repeat(scale_inv, CHUNK)[:x.size]
    return codes.view(E4M3).astype(np.float32) * per_elem, np.repeat(scale, CHUNK)[:x.size]


def ref_reduce_scatter(sends, n, recv=None):
    """Rank r's output: sum over ranks q of sends[q][r n:(r+1) n] dequantized, float32, in rank order;
    with the per-element float64 error bound against the exact sum of the inputs (and recv)."""
    W = len(sends)
    outs, bounds = [], []
    for r in range(W):
        acc = None if recv is None else recv[r].copy()
        bound = np.zeros(n)
        mags = np.zeros(n) if recv is None else np.abs(recv[r].astype(np.float64))
        for q in range(W):
            x = sends[q][r * n:(r + 1) * n]
            v, s = ref_dequant(x)
            acc = v.copy() if acc is None else (acc + v).astype(np.float32)
            bound += 2.0 ** -4 * np.abs(x.astype(np.float64)) + 2.0 ** -10 / s
            mags += np.abs(v.astype(np.float64))
        adds = W if recv is not None else W - 1
        gamma = adds * 2.0 ** -24 / (1 - adds * 2.0 ** -24)
        outs.append(acc)
        bounds.append(bound + gamma * mags)
    return outs, bounds


def exact_sum(sends, n, r, recv=None):
    s = sum(x[r * n:(r + 1) * n].astype(np.float64) for x in sends)
    return s if recv is None else s + recv[r].astype(np.float64)


# ---------------------------------------------------------------- inputs

def wide_range(rng, n, lo=-60, hi=60):
    """float32 normals with a per-chunk magnitude 2^U(lo, hi) and, within a chunk, a factor 2^U(-12, 0)."""
    chunks = -(-n // CHUNK)
    mag = np.repeat(2.0 ** rng.uniform(lo, hi, chunks), CHUNK)[:n]
    return (rng.standard_normal(n) * mag * 2.0 ** rng.uniform(-12, 0, n)).astype(np.float32)


def rank_inputs(rng, W, n):
    """W inputs of n float32 each, a zero chunk on rank 0, a NaN on rank 0 and an Inf on rank W - 1."""
    xs = [wide_range(rng, n) for _ in range(W)]
    if n > 2 * CHUNK:
        xs[0][CHUNK:2 * CHUNK] = 0.0
    xs[0][int(rng.integers(0, n))] = np.nan
    xs[-1][int(rng.integers(0, n))] = -np.inf if rng.random() < 0.5 else np.inf
    return xs


# ---------------------------------------------------------------- the C side

def c_pack(numerics, x, tmp_path):
    inp, out = tmp_path / "pack_in.f32", tmp_path / "pack_out.u8"
    x.tofile(inp)
    r = run([numerics, "--grad-fp8-pack", inp, out])
    assert r.returncode == 0, r.stderr
    block = np.fromfile(out, np.uint8)
    chunks = -(-x.size // CHUNK)
    assert block.size == x.size + 4 * chunks
    return block[:x.size], block[x.size:].view(np.float32)


def c_collective(numerics, kind, W, n, inputs, tmp_path):
    for r, x in enumerate(inputs):
        x.astype(np.float32).tofile(tmp_path / f"in.{r}")
    cmd = [MPIRUN, "--oversubscribe", "-np", str(W), numerics, "--grad-reduce-fp8", kind, n, tmp_path / "in", tmp_path / "out"]
    r = subprocess.run([str(c) for c in cmd], cwd=REPO, env=MPI_ENV, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return [np.fromfile(tmp_path / f"out.{r}", np.float32) for r in range(W)]


def assert_bits(got, want, what):
    g, w = got.view(np.uint32), want.view(np.uint32)
    nan = np.isnan(got) & np.isnan(want)
    bad = np.flatnonzero((g != w) & ~nan)
    assert bad.size == 0, f"{what}: {bad.size} of {got.size} differ, first at {bad[0]}: {got[bad[0]]!r} vs {want[bad[0]]!r}"


def assert_within_bound(got, exact, bound, what):
    """Outside the poisoned chunks (checked by assert_nonfinite_chunks)."""
    finite = np.isfinite(got)
    err = np.abs(got[finite].astype(np.float64) - exact[finite])
    worst = np.max(err / bound[finite])
    print(f"{what}: worst error / bound {worst:.3f}")
    assert worst <= 1.0, what


def assert_nonfinite_chunks(got, exact, n, what):
    """NaN exactly in the chunks whose exact sum holds a NaN or Inf (a chunk with one poisons it whole)."""
    bad_chunk = np.zeros(-(-n // CHUNK), bool)
    bad_chunk[np.flatnonzero(~np.isfinite(exact)) // CHUNK] = True
    want = np.repeat(bad_chunk, CHUNK)[:n]
    assert np.array_equal(np.isnan(got), want), f"{what}: NaN where the chunk was not poisoned, or a poisoned chunk finite"
    assert np.all(np.isfinite(got[~want])), what


# ---------------------------------------------------------------- tests

def test_pack_matches_reference(numerics, rng, tmp_path):
    """Codes and scale_inv of one block, byte for byte, and each element's error within the bound."""
    n = 5 * CHUNK + 321
    x = wide_range(rng, n, -120, 120)
    x[:CHUNK] = (rng.standard_normal(CHUNK) * 2.0 ** -128).astype(np.float32)  # amax < 448 / FLT_MAX: scale 2^127
    x[2 * CHUNK:3 * CHUNK] = 0.0                 # amax 0: scale 1, codes 0
    x[3 * CHUNK + 7] = np.nan                    # this chunk: scale_inv NaN
    x[4 * CHUNK + 9] = np.inf
    codes, scale_inv = c_pack(numerics, x, tmp_path)
    want_codes, scale, want_inv = ref_pack(x)
    assert np.array_equal(codes, want_codes), f"{np.count_nonzero(codes != want_codes)} codes differ"
    assert_bits(scale_inv, want_inv, "scale_inv")
    assert np.isnan(scale_inv[3]) and np.isnan(scale_inv[4]) and scale_inv[2] == 1.0
    v, s = ref_dequant(x)
    fin = np.repeat(np.isfinite(scale_inv), CHUNK)[:n]
    bound = 2.0 ** -4 * np.abs(x[fin].astype(np.float64)) + 2.0 ** -10 / s[fin]
    worst = np.max(np.abs(v[fin].astype(np.float64) - x[fin]) / bound)
    print(f"pack: worst error / bound {worst:.3f}")
    assert worst <= 1.0


@needs_mpi
@pytest.mark.parametrize("W", [2, 3])
@pytest.mark.parametrize("kind", ["reduce_scatter", "reduce_scatter_acc"])
def test_reduce_scatter(numerics, rng, tmp_path, W, kind):
    """Every rank's piece equals the reference bit for bit and is within the bound of the exact sum."""
    n = 3 * CHUNK + 555
    sends = rank_inputs(rng, W, W * n)
    recv = [wide_range(rng, n) for _ in range(W)] if kind == "reduce_scatter_acc" else None
    inputs = sends if recv is None else [np.concatenate([recv[r], sends[r]]) for r in range(W)]
    got = c_collective(numerics, kind, W, n, inputs, tmp_path)
    want, bound = ref_reduce_scatter(sends, n, recv)
    for r in range(W):
        assert_bits(got[r], want[r], f"rank {r}")
        exact = exact_sum(sends, n, r, recv)
        assert_nonfinite_chunks(got[r], exact, n, f"rank {r}")
        assert_within_bound(got[r], exact, bound[r], f"{kind} W {W} rank {r}")


@needs_mpi
@pytest.mark.parametrize("W", [2, 3])
def test_all_reduce(numerics, rng, tmp_path, W):
    """ZeRO-0: every rank holds the same bits, the reference's (zero-padded pieces of whole chunks
    reduce-scattered, then gathered), within the bound of the exact sum; NaN/Inf chunks NaN everywhere."""
    n = 7 * CHUNK + 1000
    xs = rank_inputs(rng, W, n)
    got = c_collective(numerics, "all_reduce", W, n, xs, tmp_path)
    for r in range(1, W):
        assert got[r].view(np.uint32).tobytes() == got[0].view(np.uint32).tobytes(), f"rank {r} differs from rank 0"
    piece = -(-(-(-n // CHUNK)) // W) * CHUNK
    padded = [np.concatenate([x, np.zeros(W * piece - n, np.float32)]) for x in xs]
    want, bound = ref_reduce_scatter(padded, piece)
    want, bound = np.concatenate(want)[:n], np.concatenate(bound)[:n]
    assert_bits(got[0], want, "all-reduce")
    exact = sum(x.astype(np.float64) for x in xs)
    assert_nonfinite_chunks(got[0], exact, n, "all-reduce")  # pieces are whole chunks: the same chunks as buf's
    assert_within_bound(got[0], exact, bound, f"all_reduce W {W}")


# ---------------------------------------------------------------- the trainer

@needs_mpi
@requires_data
def test_trainer_two_ranks(tmp_path, shakespeare):
    """2 ranks, the tiny model, 2 steps: --grad-reduce fp8 under ZeRO-0 (reduce-scatter + FP32 all-gather)
    and ZeRO-1 (reduce-scatter of the same whole-chunk pieces) train the same run bit for bit (losses,
    norms, the saved model). Against fp32: step 1's loss is the same (no update yet), its gradient norm
    differs (the flag is not ignored) by less than 1% (each element's rounding is at most 2^-4 relative;
    in a norm they mostly cancel: measured 3.5e-4), and step 2's loss stays within 1e-2 of fp32's (measured
    6.4e-4; 2.8e-3 at a third step, where one step moves the loss by 0.2)."""
    train(2, tmp_path / "fp32", "--grad-reduce", "fp32", "-z", 0, steps=2, env=mpi_env())
    for z in (0, 1):
        train(2, tmp_path / f"fp8z{z}", "--grad-reduce", "fp8", "-z", z, steps=2, env=mpi_env())
    assert_same_run(tmp_path / "fp8z0", tmp_path / "fp8z1", 2)
    exact, _ = trajectory(tmp_path / "fp32")
    fp8, _ = trajectory(tmp_path / "fp8z0")
    for (step, la, na, _), (_, lb, nb, _) in zip(exact, fp8):
        print(f"step {step}: loss fp32 {la:.7f} fp8 {lb:.7f} | grad norm fp32 {na:.6f} fp8 {nb:.6f}")
    assert exact[0][1] == fp8[0][1]
    assert exact[0][2] != fp8[0][2] and abs(exact[0][2] - fp8[0][2]) < 1e-2 * exact[0][2]
    assert len(exact) == len(fp8) == 2 and abs(exact[1][1] - fp8[1][1]) < 1e-2


@needs_mpi
@requires_data
def test_ranks_must_agree(tmp_path, shakespeare):
    """One rank with fp32 and one with fp8: the start-up agreement (the run identity's --grad-reduce) stops
    both with one line naming it and both values."""
    args = ["-e", "tiny", "-b", 2, "-t", 32, "-x", 1, "-o", tmp_path / "run"]
    exe = REPO / "train_llama_cpu"
    cmd = [MPIRUN, "--oversubscribe", "-np", 1, exe, *args, "--grad-reduce", "fp32", ":", "-np", 1, exe, *args,
           "--grad-reduce", "fp8"]
    r = subprocess.run([str(c) for c in cmd], cwd=REPO, env=MPI_ENV, capture_output=True, text=True, timeout=120)
    lines = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert r.returncode != 0 and len(lines) == 1, r.stderr[-2000:]
    assert "disagree on --grad-reduce: rank 0 has fp32, rank 1 has fp8 " in lines[0], lines[0]



# ---------------------------------------------------------------- the memory plan

def plan_workspaces(exe, zero, wire, ranks=16):
    r = run([exe, "--dry-run", "1", "-e", "llama2-7b", "-b", 1, "-t", 1024, "-p", "fp8", "--ranks", ranks, "-z", zero,
             "--grad-reduce", wire, "--gpu-mem", 80])
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1][len("plan: "):])["workspaces"]


def block_bytes(n):
    return n + 4 * -(-n // CHUNK)


def block_stride(n):
    """Where a reduction's blocks start, one per peer: every 256 bytes (a block padded to cudaMalloc's alignment)."""
    return -(-block_bytes(n) // 256) * 256


def fp8_piece(segment, W):
    return -(-(-(-segment // CHUNK)) // W) * CHUNK


@pytest.mark.parametrize("exe_name", ["train_llama_cpu", "train_llama"])
@pytest.mark.parametrize("zero", [0, 2])
def test_memory_plan_counts_the_fp8_wire(exe_name, zero):
    """The plan's workspaces on 16 ranks: the FP8 blocks sent and received (2 W per piece, each block's start
    256-byte aligned), and under ZeRO-0
    the zero-padded FP32 copy (and on the CPU the gathered FP32 pieces), sized from the largest piece or
    segment that the fp32 / bf16 plan of the same run implies (Llama-2 7B: the embedding's 32000 x 4096)."""
    exe = REPO / exe_name
    if not exe.exists():
        pytest.skip(f"{exe_name} is not built")
    W = 16
    fp8 = plan_workspaces(exe, zero, "fp8", W)
    if exe_name == "train_llama_cpu":
        if zero:
            piece = plan_workspaces(exe, zero, "fp32", W)["mpi_reduce_scatter"] // (2 * W * 4)
            assert fp8["mpi_fp8_reduce_scatter"] == 2 * W * block_stride(piece)
        else:
            p = fp8_piece(plan_workspaces(exe, zero, "fp32", W)["mpi_all_reduce"] // (W * 4), W)
            assert fp8["mpi_fp8_all_reduce"] == 2 * W * p * 4 + 2 * W * block_stride(p)
    else:
        if zero:
            piece = plan_workspaces(exe, zero, "fp32", W)["comm_scratch"] // 4  # ZeRO-2's accumulation scratch
            assert fp8["comm_scratch"] == 2 * W * block_stride(piece)
        else:
            p = fp8_piece(plan_workspaces(exe, zero, "bf16", W)["comm_scratch"] // 2, W)
            assert fp8["comm_scratch"] == W * p * 4 + 2 * W * block_stride(p)
    assert 32000 * 4096 // W <= (piece if zero else p) < 32000 * 4096 // W + CHUNK
