"""
The FP8 codec, BF16 rounding and the current-scaling policy of fp8/fp8.h against independent
implementations: ml_dtypes' float8_e4m3fn / float8_e5m2 / bfloat16 conversions and a numpy float32
transcription of the policy in docs/design.md#current-scaling. The C side is reached through the modes of
dev/tools/numerics.c (--fp8-decode, --fp8-encode, --bf16-round, --fp8-scale).

Our cast saturates (cuda_fp8.h __NV_SATFINITE): finite values beyond +-max and +-Inf become +-max, where
ml_dtypes would give NaN (E4M3) or Inf (E5M2); the reference therefore clips to +-max before casting.
fp8_quantize additionally maps NaN to +0 (no NaN byte reaches a GEMM; the amax flags the step).
"""
import ml_dtypes
import numpy as np
import pytest

from conftest import run

FORMATS = {
    "e4m3": (ml_dtypes.float8_e4m3fn, 448.0),
    "e5m2": (ml_dtypes.float8_e5m2, 57344.0),
}
FLT_MAX = np.finfo(np.float32).max


def c_decode(numerics, fmt, tmp_path):
    out = tmp_path / f"decode_{fmt}.f32"
    r = run([numerics, "--fp8-decode", fmt, out])
    assert r.returncode == 0, r.stderr
    return np.fromfile(out, dtype=np.float32)


def c_encode(numerics, fmt, scale, x, tmp_path):
    inp, out = tmp_path / "in.f32", tmp_path / "out.u8"
    x.astype(np.float32).tofile(inp)
    r = run([numerics, "--fp8-encode", fmt, repr(float(scale)), inp, out])
    assert r.returncode == 0, r.stderr
    return np.fromfile(out, dtype=np.uint8)


def reference_encode(fmt, scale, x):
    """Saturating RNE cast of float32(x) * float32(scale) with NaN -> +0, through ml_dtypes."""
    dtype, fmax = FORMATS[fmt]
    y = x.astype(np.float32) * np.float32(scale)
    y = np.where(np.isnan(y), np.float32(0.0), y)
    y = np.clip(y, -fmax, fmax).astype(np.float32)
    return y.astype(dtype).view(np.uint8)


@pytest.mark.parametrize("fmt", FORMATS)
def test_decode_all_codes(numerics, fmt, tmp_path):
    dtype, _ = FORMATS[fmt]
    ours = c_decode(numerics, fmt, tmp_path)
    ref = np.arange(256, dtype=np.uint8).view(dtype).astype(np.float32)
    assert ours.shape == (256,)
    nan = np.isnan(ref)
    assert np.array_equal(np.isnan(ours), nan), "NaN codes differ"
    assert np.array_equal(ours[~nan].view(np.uint32), ref[~nan].view(np.uint32)), "decoded values differ (bitwise, -0 included)"


def edge_values(fmt, numerics, tmp_path):
    """+-max, just above max, halfway points between neighbours (ties), subnormals, +-0, NaN, +-Inf."""
    dtype, fmax = FORMATS[fmt]
    values = np.arange(256, dtype=np.uint8).view(dtype).astype(np.float64)
    finite = np.unique(values[np.isfinite(values)])
    mids = (finite[:-1] + finite[1:]) / 2  # exact in float32: neighbours differ in few bits
    tiny = float(ml_dtypes.finfo(dtype).smallest_subnormal)
    extra = [fmax, -fmax, np.nextafter(np.float32(fmax), np.float32(np.inf)), fmax * 1.0625, fmax * 1.07, 1e30,
             tiny, tiny / 2, tiny * 0.49, tiny * 0.51, tiny * 1.5, -tiny * 2.5, 0.0, -0.0, np.nan, np.inf, -np.inf]
    return np.concatenate([finite, mids, np.nextafter(mids, 0), np.nextafter(mids, np.inf), extra]).astype(np.float32)


@pytest.mark.parametrize("fmt", FORMATS)
def test_encode_edge_values(numerics, fmt, tmp_path):
    x = edge_values(fmt, numerics, tmp_path)
    ours = c_encode(numerics, fmt, 1.0, x, tmp_path)
    ref = reference_encode(fmt, 1.0, x)
    bad = np.nonzero(ours != ref)[0]
    assert bad.size == 0, [(float(x[i]), hex(ours[i]), hex(ref[i])) for i in bad[:10]]


@pytest.mark.parametrize("fmt", FORMATS)
def test_encode_random_sample(numerics, fmt, tmp_path, rng):
    n = 400_000
    magnitude = np.exp2(rng.uniform(-40, 24, n))
    x = (magnitude * rng.choice([-1.0, 1.0], n)).astype(np.float32)
    scale = float(np.float32(np.exp2(rng.uniform(-6, 6))))
    ours = c_encode(numerics, fmt, scale, x, tmp_path)
    ref = reference_encode(fmt, scale, x)
    bad = np.nonzero(ours != ref)[0]
    assert bad.size == 0, [(float(x[i]), hex(ours[i]), hex(ref[i])) for i in bad[:10]]
    # the sample exercises saturation, underflow to zero and normal rounding
    max_code = 0x7E if fmt == "e4m3" else 0x7B
    assert ((ours & 0x7F) == max_code).any() and ((ours & 0x7F) == 0).any() and ((ours & 0x7F) == 0x3C).any()


def test_bf16_round(numerics, tmp_path, rng):
    n = 200_000
    x = (np.exp2(rng.uniform(-140, 127, n)) * rng.choice([-1.0, 1.0], n)).astype(np.float32)
    x = np.concatenate([x, np.array([0.0, -0.0, np.inf, -np.inf, np.nan, FLT_MAX, 1.00390625, 1.01171875], np.float32)])
    inp, out = tmp_path / "in.f32", tmp_path / "out.f32"
    x.tofile(inp)
    r = run([numerics, "--bf16-round", inp, out])
    assert r.returncode == 0, r.stderr
    ours = np.fromfile(out, dtype=np.float32)
    ref = x.astype(ml_dtypes.bfloat16).astype(np.float32)
    nan = np.isnan(ref)
    assert np.array_equal(np.isnan(ours), nan)
    bad = np.nonzero(ours[~nan].view(np.uint32) != ref[~nan].view(np.uint32))[0]
    assert bad.size == 0, [(float(x[~nan][i]), float(ours[~nan][i]), float(ref[~nan][i])) for i in bad[:10]]


def reference_scale(amax, fmax, pow2):
    """Current scaling in float32: fmax / amax; amax 0 or non-finite -> 1; overflow -> FLT_MAX; pow2 rounds down."""
    amax = np.float32(amax)
    if not np.isfinite(amax) or amax == 0:
        return np.float32(1.0)
    with np.errstate(over="ignore"):
        scale = np.float32(fmax) / amax
    if np.isinf(scale):
        scale = FLT_MAX
    if pow2:
        _, e = np.frexp(scale)
        scale = np.float32(np.ldexp(np.float32(1.0), int(e) - 1))
    return np.float32(scale)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("pow2", [0, 1])
def test_scale_policy(numerics, fmt, pow2, tmp_path, rng):
    _, fmax = FORMATS[fmt]
    amax = np.concatenate([
        np.array([0.0, 1e-45, 1e-40, 1.17e-38, 1e-30, 1.0, fmax, FLT_MAX, np.inf, np.nan], np.float32),
        np.exp2(rng.uniform(-60, 60, 2000)).astype(np.float32),
    ])
    inp, out = tmp_path / "amax.f32", tmp_path / "scale.f32"
    amax.tofile(inp)
    r = run([numerics, "--fp8-scale", fmt, str(pow2), inp, out])
    assert r.returncode == 0, r.stderr
    got = np.fromfile(out, dtype=np.float32).reshape(-1, 3)
    for a, (scale, scale_inv, finite) in zip(amax, got):
        want = reference_scale(a, fmax, pow2)
        assert scale == want, (float(a), float(scale), float(want))
        assert scale_inv == np.float32(1.0) / want
        assert bool(finite) == bool(np.isfinite(a))
        if np.isfinite(a) and a > 0:
            assert np.isfinite(scale) and np.float32(a) * scale <= fmax * (1 + 2 ** -23)
