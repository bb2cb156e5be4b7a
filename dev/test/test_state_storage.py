"""
The stored FP32 arrays of --grad-buffer and --master-weights (llama/optim.h StoreCodec; the gradient
buffer's accumulation in train/data_parallel.h dp_stage_grads, the master's decode and store in
model/llama.h llama_master_piece / llama_master_store).

The codecs against a numpy / ml_dtypes transcription of their description (not read from the C): after
each row, stored = round(decoded stored + new), the addition in FP32; bf16 rounds to nearest even; e4m3
(the gradient buffer's fp8) gives each 4096-element chunk the scale 2^floor(log2(448 / amax)) of its
values' amax and E4M3 codes of x * scale (comm/grad_fp8.h's wire format, transcribed in
test_grad_reduce_fp8.py); fp16 (the master's) the scale 2^floor(log2(65504 / amax)) and numpy's float16
of x * scale; a scaled chunk holding a NaN or an Inf gets scale_inv NaN. The C side is dev/tools/numerics.c's
tool mode --store (the CPU build's op_store_add and op_store_load; the GPU kernels are checked against
them bit for bit in dev/cuda/kernel_cases.cuh, family optimizer). Then the trainer's gradient buffer:
with one micro-step per step ZeRO-1 never rounds (the last micro-step's gradients reach the reduction
in FP32), so the run is the FP32 buffer's bit for bit; with several, the gradient norm and the losses
stay within the format's rounding of the FP32 buffer's; resume is bit-exact on the same rank count; and
what the buffer cannot do is refused with one line. (The fp16 master's resume: dev/test/reference_check.h
check_resume_in, and test_distributed.py's resume across rank counts.)
"""
import math
import subprocess

import ml_dtypes
import numpy as np
import pytest

from conftest import REPO, requires_data, run
from test_distributed import BASE, MPI_ENV, MPIRUN, RUN_TIMEOUT, copy_checkpoint, mpi_env, mpirun, trajectory, train
from test_grad_reduce_fp8 import ref_pack

CHUNK = 4096
E4M3 = ml_dtypes.float8_e4m3fn
needs_mpi = pytest.mark.skipif(MPIRUN is None, reason="mpirun not found (make setup installs Open MPI)")


def ref_scale(seg, max_value):
    """(scale, scale_inv) of one chunk: 2^floor(log2(max / amax)), 1 for amax 0, scale_inv NaN when not finite."""
    if not np.all(np.isfinite(seg)):
        return 1.0, math.nan
    amax = float(np.max(np.abs(seg))) if seg.size else 0.0
    if amax == 0.0:
        return 1.0, 1.0
    e = min(math.floor(math.log2(max_value / amax)), 127)  # a float32 scale: at most 2^127
    return 2.0 ** e, 2.0 ** -e


def ref_encode(codec, total):
    """(stored bytes, scale_inv or None, decoded float32) of float32 `total` in `codec`."""
    if codec == "fp32":
        return total.tobytes(), None, total
    if codec == "bf16":
        q = total.astype(ml_dtypes.bfloat16)
        return q.tobytes(), None, q.astype(np.float32)
    if codec == "e4m3":
        codes, _, scale_inv = ref_pack(total)  # the wire's transcription (test_grad_reduce_fp8.py)
        with np.errstate(invalid="ignore"):
            decoded = codes.view(E4M3).astype(np.float32) * np.repeat(scale_inv, CHUNK)[:total.size]
        return codes.tobytes(), scale_inv, decoded
    n = total.size
    halves = np.empty(n, np.float16)
    scale_inv = np.empty(-(-n // CHUNK), np.float32)
    for c in range(scale_inv.size):
        seg = total[c * CHUNK:(c + 1) * CHUNK]
        sc, scale_inv[c] = ref_scale(seg, 65504.0)
        with np.errstate(over="ignore"):  # a non-finite chunk keeps scale 1: its large values become inf, as in C
            halves[c * CHUNK:(c + 1) * CHUNK] = (seg.astype(np.float64) * sc).astype(np.float32).astype(np.float16)
    with np.errstate(invalid="ignore"):
        decoded = halves.astype(np.float32) * np.repeat(scale_inv, CHUNK)[:n]
    return halves.tobytes(), scale_inv, decoded


def ref_accumulate(codec, rows):
    """What storing rows[0] and adding each next row gives: (stored bytes, scale_inv or None, decoded)."""
    decoded = np.zeros(rows.shape[1], np.float32)
    for t, row in enumerate(rows):
        total = (decoded + row).astype(np.float32) if t else row  # one FP32 addition per element
        stored, scale_inv, decoded = ref_encode(codec, total)
    return stored, scale_inv, decoded


def c_store(numerics, codec, rows, last, tmp_path):
    """numerics --store: (stored bytes, scale_inv, last + decoded, decoded)."""
    inp, out = tmp_path / "g.f32", tmp_path / "g.out"
    np.concatenate([rows.ravel(), last]).astype(np.float32).tofile(inp)
    r = run([numerics, "--store", codec, str(rows.shape[0]), inp, out])
    assert r.returncode == 0, r.stderr
    raw = out.read_bytes()
    n = rows.shape[1]
    nbytes = n * {"fp32": 4, "bf16": 2, "e4m3": 1, "fp16": 2}[codec]
    chunks = -(-n // CHUNK) if codec in ("e4m3", "fp16") else 0
    sinv = np.frombuffer(raw[nbytes:nbytes + 4 * chunks], np.float32)
    tail = np.frombuffer(raw[nbytes + 4 * chunks:], np.float32)
    assert tail.size == 2 * n
    return raw[:nbytes], sinv, tail[:n], tail[n:]


def wide_rows(rng, steps, n):
    """Rows with a dynamic range of 2^-40 .. 2^40 across chunks and 2^-12 within them, a zero chunk, and
    in the second row a NaN in chunk 2."""
    rows = np.empty((steps, n), np.float32)
    for t in range(steps):
        mags = 2.0 ** rng.uniform(-40, 40, -(-n // CHUNK))
        rows[t] = (np.repeat(mags, CHUNK)[:n] * 2.0 ** rng.uniform(-12, 0, n) * rng.standard_normal(n)).astype(np.float32)
    rows[:, CHUNK:2 * CHUNK] = 0.0
    rows[1, 2 * CHUNK + 7] = np.nan
    return rows


@pytest.mark.parametrize("codec", ["fp32", "bf16", "e4m3", "fp16"])
def test_store_matches_the_description(numerics, tmp_path, rng, codec):
    """A poisoned array of 3.6 chunks stores one row, then adds four more, each in two calls split at a
    chunk boundary (as a bucket's segments are): the stored bytes, the scales, the decoded array and the
    last row plus the decoded array (ZeRO-1's last micro-step) are the transcription's, bit for bit; the
    NaN poisons its element (fp32, bf16) or its whole chunk (scaled codecs). bf16 and e4m3 are the
    gradient buffer's, fp16 the master weights'."""
    steps, n = 5, int(3.6 * CHUNK)
    rows = wide_rows(rng, steps, n)
    last = rng.standard_normal(n).astype(np.float32)
    stored, sinv, plus_last, decoded = c_store(numerics, codec, rows, last, tmp_path)
    want_stored, want_sinv, want_decoded = ref_accumulate(codec, rows)
    if codec in ("e4m3", "fp16"):
        assert np.array_equal(sinv, want_sinv, equal_nan=True), (sinv, want_sinv)
        assert np.isnan(sinv[2]) and np.isfinite(np.delete(sinv, 2)).all()
    assert np.array_equal(decoded, want_decoded, equal_nan=True)
    assert np.array_equal(plus_last, (last + want_decoded).astype(np.float32), equal_nan=True)
    bad = np.flatnonzero(np.isnan(decoded))
    want_bad = np.arange(2 * CHUNK, 3 * CHUNK) if codec in ("e4m3", "fp16") else np.array([2 * CHUNK + 7])
    assert np.array_equal(bad, want_bad)
    # bytes: the NaN elements' codes may differ in payload; every other byte is the transcription's
    eb = len(stored) // n
    ours, want = np.frombuffer(stored, np.uint8).reshape(n, eb), np.frombuffer(want_stored, np.uint8).reshape(n, eb)
    keep = ~np.isnan(decoded)
    assert np.array_equal(ours[keep], want[keep]), f"{codec}: stored bytes differ"


@pytest.mark.parametrize("codec", ["bf16", "e4m3", "fp16"])
def test_accumulation_error_bound(numerics, tmp_path, rng, codec):
    """Against the float64 sum of the rows: each stored partial sum is off by at most half an ulp of its
    codec (2^-8 relative in BF16: 7 mantissa bits; 2^-4 relative plus 2^-10 / scale in E4M3; 2^-11 plus
    2^-25 / scale in FP16), so after A rows the error is at most the sum of those bounds over the A
    stored partial sums, plus the FP32 additions' 2^-24. Finite inputs of one magnitude per chunk, as a
    layer's gradients are."""
    steps, n = 8, 3 * CHUNK
    rows = (rng.standard_normal((steps, n)) * np.repeat(2.0 ** rng.uniform(-20, 0, 3), CHUNK)).astype(np.float32)
    _, _, _, decoded = c_store(numerics, codec, rows, np.zeros(n, np.float32), tmp_path)
    exact = rows.astype(np.float64).sum(axis=0)
    partial = np.cumsum(rows.astype(np.float64), axis=0)
    rel, sub, top = {"bf16": (2.0 ** -8, 0.0, 1.0), "e4m3": (2.0 ** -4, 2.0 ** -10, 448.0), "fp16": (2.0 ** -11, 2.0 ** -25, 65504.0)}[codec]
    # 1 / scale of each chunk at each partial sum is below 2 amax / max
    inv_scale = np.repeat(np.abs(partial).reshape(steps, 3, CHUNK).max(axis=2) / top * 2, CHUNK, axis=1)
    bound = (rel * 1.01 * np.abs(partial) + sub * inv_scale + 2.0 ** -23 * np.abs(partial)).sum(axis=0)
    err = np.abs(decoded - exact)
    assert np.all(err <= bound), f"worst {np.max(err / bound):.3f} of the bound"
    assert np.max(err / bound) > 0.01, "nothing is rounded"


# ---------------------------------------------------------------- the trainer

def first_norm(out):
    return trajectory(out)[0][0][2]


@requires_data
@needs_mpi
def test_one_micro_step_never_rounds(tmp_path):
    """ZeRO-1 on 2 ranks, one micro-step per step: the bucket's FP32 gradients plus a zero stored buffer
    are reduce-scattered as they are, so every --grad-buffer gives the FP32 run bit for bit."""
    runs = {}
    for fmt in ["fp32", "bf16", "fp8"]:
        out = tmp_path / fmt
        train(2, out, "-z", 1, "--grad-buffer", fmt, steps=3, global_micro=2)
        runs[fmt] = out
    for fmt in ["bf16", "fp8"]:
        assert trajectory(runs[fmt]) == trajectory(runs["fp32"]), fmt
        assert (runs[fmt] / "model_00000003.bin").read_bytes() == (runs["fp32"] / "model_00000003.bin").read_bytes()


@requires_data
@needs_mpi
@pytest.mark.parametrize("ranks, zero", [(1, 0), (2, 1)])
def test_accumulating_stays_within_rounding(tmp_path, ranks, zero):
    """Four micro-batches per step (4 micro-steps on one rank, 2 per rank on two): the first step's gradient
    norm is within the format's rounding of the FP32 buffer's, and differs from it (the buffer is
    used); the losses of two steps (the second after an update from the buffer) stay close."""
    ref = tmp_path / "fp32"
    train(ranks, ref, "-z", zero, steps=2, global_micro=4)
    for fmt, tol in [("bf16", 2e-3), ("fp8", 3e-2)]:
        out = tmp_path / fmt
        train(ranks, out, "-z", zero, "--grad-buffer", fmt, steps=2, global_micro=4)
        n0, n1 = first_norm(ref), first_norm(out)
        assert n1 != n0 and abs(n1 - n0) < tol * n0, (fmt, n0, n1)
        for (_, la, _, _), (_, lb, _, _) in zip(trajectory(ref)[0], trajectory(out)[0]):
            assert abs(la - lb) < tol * la, (fmt, trajectory(ref)[0], trajectory(out)[0])


@requires_data
@needs_mpi
def test_resume_is_bit_exact(tmp_path):
    """A step starts from zeroed gradients, so nothing of the buffer is saved: saved on 2 ranks under
    ZeRO-1 with --grad-buffer fp8 and 2 micro-steps per rank, a resume on 2 ranks repeats the run bit for
    bit; on 1 rank the state comes back exactly, so the first step's loss is the uninterrupted run's bit
    for bit, and then the run accumulates as one rank does (ZeRO-0: 4 micro-steps, each rounded) and
    continues within E4M3's rounding of the 2-rank run."""
    flags = ["--grad-buffer", "fp8", "-n", 2]
    full = tmp_path / "full"
    train(2, full, "-z", 1, *flags, steps=4, global_micro=4)
    ta = [row for row in trajectory(full)[0] if row[0] >= 2]
    same = tmp_path / "same"
    copy_checkpoint(full, same, 2)
    train(2, same, "-z", 1, *flags, "-y", 1, steps=4, global_micro=4)
    assert trajectory(same)[0] == ta
    assert (same / "model_00000004.bin").read_bytes() == (full / "model_00000004.bin").read_bytes()
    one = tmp_path / "one"
    copy_checkpoint(full, one, 2)
    train(1, one, "-z", 0, *flags, "-y", 1, steps=4, global_micro=4)
    tb = trajectory(one)[0]
    assert tb[0][1] == ta[0][1] and tb[1][1] != ta[1][1] and abs(tb[1][1] - ta[1][1]) < 3e-2 * ta[1][1], (ta, tb)


@requires_data
@pytest.mark.parametrize("flags, message", [
    (["-z", "2", "--grad-buffer", "bf16"], "flag --grad-buffer bf16: -z 2 keeps no full gradient buffer"),
    (["--shadow-every", "1", "--shadow-grad", "1", "--grad-buffer", "fp8"], "flag --shadow-grad 1: needs FP32 full gradients"),
    (["--grad-buffer", "fp4"], "flag --grad-buffer: 'fp4' is not fp32, bf16 or fp8"),
    (["--dry-run", "1", "--ranks", "2", "--grad-buffer", "fp8"], "flag --grad-buffer fp8: -z 0 on 2 ranks"),
])
def test_refused(trainer, tmp_path, flags, message):
    r = run([trainer, "-e", "tiny", "-x", "1", *flags])
    assert r.returncode != 0 and message in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


@requires_data
@needs_mpi
def test_zero0_on_two_ranks_refused_by_every_rank(tmp_path):
    """Each rank decides from the same flags and stops with the one line (mpirun may end the other rank
    before it prints)."""
    r = mpirun(2, ["-e", "tiny", "-b", 2, "-t", 32, "-x", 1, "--grad-buffer", "bf16"], env=mpi_env())
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert r.returncode != 0 and errors, r.stderr
    assert all("flag --grad-buffer bf16: -z 0 on 2 ranks" in line for line in errors), r.stderr


@requires_data
@needs_mpi
def test_ranks_must_agree(tmp_path):
    """MPMD launch with fp32 on rank 0 and fp8 on rank 1 (ZeRO-1): the start-up agreement names the flag."""
    args = [*BASE, "-z", "1", "-x", "2", "-o", tmp_path / "run"]
    exe = REPO / "train_llama_cpu"
    cmd = [MPIRUN, "--oversubscribe", "-np", "1", exe, *args, "--grad-buffer", "fp32", ":", "-np", "1", exe, *args,
           "--grad-buffer", "fp8"]
    r = subprocess.run([str(c) for c in cmd], cwd=REPO, env=MPI_ENV, capture_output=True, text=True, timeout=RUN_TIMEOUT)
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert r.returncode != 0 and len(errors) == 1, r.stderr
    assert "disagree on --grad-buffer: rank 0 has fp32, rank 1 has fp8" in errors[0], r.stderr
