"""
The Hopper accumulation model of the CPU emulation (fp8/gemm_hopper.h, --fp8-accum hopper) against an
independent oracle: mmaemu (PyPI, Apache-2.0), whose scaled_mm(..., profile="hopper") returns the bits an
H100 PCIe's cuBLASLt 12.8 FP8 GEMM returns (validated there on live calls). Both sides get the same FP8
codes and scales; the test compares every FP32 and BF16 output bit for bit, with fast accumulation on
and off, on shapes whose split-K decision mmaemu's recorded table gives: unsplit ones, and one that the
H100 splits in three (our model is told the split; the trainer always runs unsplit). Fresh random
inputs each run (the seed is printed), with outlier channels as LLM activations have them.

A planted fault shows that the comparison detects a one-bit change of the model: mmaemu's chain with a
custom preset keeping 14 instead of 13 fraction bits, or blocks of 16 instead of 32, must disagree with
ours on a good share of outputs.

Optional: needs torch and mmaemu (scripts/setup.sh with LLM8_OPTIONAL_TESTS=1); skips with the reason
elsewhere.
"""
import os
import warnings

import numpy as np
import pytest

from conftest import run

torch = pytest.importorskip("torch", reason="torch not installed (optional: LLM8_OPTIONAL_TESTS=1 bash scripts/setup.sh)")
mmaemu = pytest.importorskip("mmaemu", reason="mmaemu not installed (optional: LLM8_OPTIONAL_TESTS=1 bash scripts/setup.sh)")
from mmaemu.model.chain import chain_gemm  # noqa: E402
from mmaemu.model.presets import Preset, get_preset  # noqa: E402

DTYPES = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
FP8_MAX = {"e4m3": 448.0, "e5m2": 57344.0}

# (M, N, K, W's format, split-K parts the H100's table gives): fprop-like E4M3 x E4M3 and dgrad/wgrad-like
# E4M3 x E5M2; all but the last are unsplit in mmaemu's table.
SHAPES = [
    (32, 256, 1024, "e4m3", 1),
    (32, 128, 4096, "e4m3", 1),
    (16, 256, 2048, "e5m2", 1),
    (16, 64, 8192, "e4m3", 3),
]


def fresh_seed():
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"seed {seed}")
    return seed


def operands(M, N, K, fmt_w, seed):
    """FP8 codes of X (M, K), E4M3 with outlier channels, and W (N, K) of format fmt_w, each cast with the
    current-scaling policy (amax -> fp8_max), and their scale_inv."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=g)
    outliers = torch.randint(0, K, (max(1, K // 256),), generator=g)
    x[:, outliers] *= 30.0
    w = torch.randn(N, K, generator=g) * 0.02
    out = []
    for t, fmt in ((x, "e4m3"), (w, fmt_w)):
        scale = FP8_MAX[fmt] / float(t.abs().max())
        out.append(((t * scale).clamp(-FP8_MAX[fmt], FP8_MAX[fmt]).to(DTYPES[fmt]), np.float32(1.0 / scale)))
    return out


def ours(numerics, tmp_path, x8, w8, sx, sw, fast, splits, fmt_w, accum="hopper"):
    M, K = x8.shape
    N = w8.shape[0]
    xf, wf, yf = tmp_path / "x.u8", tmp_path / "w.u8", tmp_path / "y.f32"
    x8.view(torch.uint8).numpy().tofile(xf)
    w8.view(torch.uint8).numpy().tofile(wf)
    r = run([numerics, "--fp8-gemm", accum, "e4m3", fmt_w, M, N, K, int(fast), splits, repr(float(sx)), repr(float(sw)), xf, wf, yf])
    assert r.returncode == 0, r.stderr
    return np.fromfile(yf, dtype=np.float32).reshape(M, N)


def bf16_bits(y):
    """RNE of float32 to BF16 (torch's conversion), as 16-bit patterns."""
    return torch.from_numpy(y).to(torch.bfloat16).view(torch.int16).numpy()


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "slow"])
@pytest.mark.parametrize("shape", SHAPES, ids=[f"{m}x{n}x{k}-{f}-S{s}" for m, n, k, f, s in SHAPES])
def test_bits_equal_mmaemu(numerics, tmp_path, shape, fast):
    M, N, K, fmt_w, splits = shape
    (x8, sx), (w8, sw) = operands(M, N, K, fmt_w, fresh_seed())
    tx, tw = torch.tensor(sx), torch.tensor(sw)
    warnings.simplefilter("ignore")
    plan = mmaemu.explain(x8, w8.t(), tx, tw, out_dtype=torch.float32, use_fast_accum=fast, profile="hopper").split
    assert plan.source == "table" and plan.S == splits, f"mmaemu's split-K table changed: {plan}"
    y = ours(numerics, tmp_path, x8, w8, sx, sw, fast, splits, fmt_w)
    for out_dtype in (torch.float32, torch.bfloat16):
        ref = mmaemu.scaled_mm(x8, w8.t(), tx, tw, out_dtype=out_dtype, use_fast_accum=fast, profile="hopper")
        if out_dtype == torch.float32:
            equal = y.view(np.uint32) == ref.numpy().view(np.uint32)
        else:
            equal = bf16_bits(y) == ref.view(torch.int16).numpy()
        print(f"{out_dtype}: {equal.mean():.6f} of {equal.size} outputs bit-equal")
        assert equal.all(), f"{(~equal).sum()} of {equal.size} {out_dtype} outputs differ from mmaemu"


def test_exact_differs_from_hopper(numerics, tmp_path):
    """The model is what runs: at K 4096 the exact path and the model disagree on many FP32 outputs."""
    (x8, sx), (w8, sw) = operands(32, 128, 4096, "e4m3", fresh_seed())
    hop = ours(numerics, tmp_path, x8, w8, sx, sw, True, 1, "e4m3")
    exact = ours(numerics, tmp_path, x8, w8, sx, sw, True, 1, "e4m3", accum="exact")
    assert (hop.view(np.uint32) != exact.view(np.uint32)).mean() > 0.5


@pytest.mark.parametrize("fault", [{"frac": 14}, {"nfma": 16}], ids=["14-fraction-bits", "blocks-of-16"])
def test_planted_fault_detected(numerics, tmp_path, fault):
    """mmaemu's chain with a changed preset must disagree with our model: the comparison sees such a change."""
    warnings.simplefilter("ignore")  # mmaemu warns that a custom preset is not validated: that is the point
    (x8, sx), (w8, sw) = operands(32, 128, 1024, "e4m3", fresh_seed())
    y = ours(numerics, tmp_path, x8, w8, np.float32(1.0), np.float32(1.0), True, 1, "e4m3")  # scale 1: y is the accumulator
    hopper = get_preset("hopper")
    fields = {f: getattr(hopper, f) for f in ("nfma", "frac", "frac_out", "min_exp", "late_c", "slow_chunk")}
    good = chain_gemm(x8.view(torch.uint8), w8.view(torch.uint8), fmt_a="e4m3", fmt_b="e4m3", preset=Preset("good", **fields))
    assert np.array_equal(y.view(np.uint32), good.numpy().view(np.uint32)), "the unplanted chain must agree"
    fields.update(fault)
    bad = chain_gemm(x8.view(torch.uint8), w8.view(torch.uint8), fmt_a="e4m3", fmt_b="e4m3", preset=Preset("planted", **fields))
    differ = (y.view(np.uint32) != bad.numpy().view(np.uint32)).mean()
    print(f"planted {fault}: {differ:.3f} of the outputs differ")
    assert differ > 0.1
