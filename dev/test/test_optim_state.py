"""
The AdamW moments' storage formats of --optim-state (llama/optim.h) against independent references:
numpy's float16 conversion for the FP16 encoder, and a float64 AdamW (torch.optim.AdamW's formula, written
from its documentation) whose moments are requantized after every step with ml_dtypes' bfloat16 /
float8_e4m3fn and numpy's float16, with the per-chunk power-of-two scales optim.h documents. The C side is
dev/tools/numerics.c's modes --half-encode and --adamw (the CPU build's op_adamw; the GPU kernel is checked
against it in dev/cuda/kernel_cases.cuh).
"""
import ml_dtypes
import numpy as np
import pytest

from conftest import run

CHUNK = 4096
BETA1, BETA2, EPS = 0.9, 0.95, 1e-8
E4M3_MAX, FP16_MAX = 448.0, 65504.0
MOMENT_DTYPES = {"fp32": (np.float32, np.float32), "bf16": (np.uint16, np.uint16), "fp8": (np.uint8, np.uint16)}


def c_half(numerics, x, tmp_path):
    inp, out = tmp_path / "h.f32", tmp_path / "h.u16"
    x.astype(np.float32).tofile(inp)
    r = run([numerics, "--half-encode", inp, out])
    assert r.returncode == 0, r.stderr
    return np.fromfile(out, dtype=np.uint16)


def test_half_encoder_matches_numpy(numerics, tmp_path, rng):
    """Round to nearest even over every binade of FP16 and past it: normals, subnormals, ties, overflow."""
    exps = rng.uniform(-30.0, 17.0, 200_000)
    x = (np.sign(rng.standard_normal(exps.size)) * 2.0 ** exps).astype(np.float32)
    # exact ties: every FP16 value (normals and subnormals) plus half its spacing
    h = np.arange(0, 0x7C00, 7, dtype=np.uint16).view(np.float16).astype(np.float32)
    spacing = np.spacing(h.astype(np.float16)).astype(np.float32)
    ties = (h + spacing / 2).astype(np.float32)
    specials = np.array([0.0, -0.0, 65504.0, 65519.99, 65520.0, 1e9, np.inf, -np.inf, 2.0 ** -25, 2.0 ** -24,
                         1.5 * 2.0 ** -25, 2.0 ** -14, np.finfo(np.float32).tiny], dtype=np.float32)
    x = np.concatenate([x, ties, -ties, specials])
    ours = c_half(numerics, x, tmp_path)
    with np.errstate(over="ignore"):
        ref = x.astype(np.float16).view(np.uint16)
    bad = np.flatnonzero(ours != ref)
    assert bad.size == 0, f"{bad.size} of {x.size} differ; first {x[bad[0]]!r}: ours {ours[bad[0]]:#06x}, numpy {ref[bad[0]]:#06x}"
    nan = c_half(numerics, np.array([np.nan], dtype=np.float32), tmp_path)
    assert np.isnan(nan.view(np.float16)).all()


def pow2_scale(target, amax):
    """2^floor(log2(target / amax)) per chunk; 1 where amax is 0 (optim.h adamw_moment_scale)."""
    safe = np.where(amax > 0, amax, 1.0)
    return np.where(amax > 0, 2.0 ** np.floor(np.log2(target / safe)), 1.0)


def requantize(fmt, m, v):
    """Stored moments (decoded, float64) and scale_inv per chunk for float64 moments m, v."""
    if fmt == "fp32":
        return m.astype(np.float32).astype(np.float64), v.astype(np.float32).astype(np.float64), None
    if fmt == "bf16":
        q = lambda x: x.astype(np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)
        return q(m), q(v), None
    n = m.size
    chunks = -(-n // CHUNK)
    pad = lambda x: np.concatenate([x, np.zeros(chunks * CHUNK - n)]).reshape(chunks, CHUNK)
    sm = pow2_scale(E4M3_MAX, np.abs(pad(m)).max(axis=1))
    sv = pow2_scale(FP16_MAX, np.abs(pad(v)).max(axis=1))
    em, ev = np.repeat(sm, CHUNK)[:n], np.repeat(sv, CHUNK)[:n]
    mq = (m * em).astype(np.float32).astype(ml_dtypes.float8_e4m3fn).astype(np.float64) / em
    vq = (v * ev).astype(np.float32).astype(np.float16).astype(np.float64) / ev
    return mq, vq, np.stack([1.0 / sm, 1.0 / sv], axis=1).reshape(-1)


def reference_adamw(fmt, master, grads, lr, wd, grad_scale):
    """float64 AdamW from zero moments, the moments requantized to `fmt` after every step."""
    p = master.astype(np.float64)
    m = np.zeros_like(p)
    v = np.zeros_like(p)
    sinv = None
    for t, g in enumerate(grads, start=1):
        g = g.astype(np.float64) * grad_scale
        p = p * (1 - lr * wd)
        m = BETA1 * m + (1 - BETA1) * g
        v = BETA2 * v + (1 - BETA2) * g * g
        p = p - lr / (1 - BETA1 ** t) * m / (np.sqrt(v) / np.sqrt(1 - BETA2 ** t) + EPS)
        m, v, sinv = requantize(fmt, m, v)
    return p, m, v, sinv


def c_adamw(numerics, fmt, master, grads, lr, wd, grad_scale, tmp_path):
    inp, out = tmp_path / "adamw.f32", tmp_path / "adamw.out"
    np.concatenate([master] + list(grads)).astype(np.float32).tofile(inp)
    r = run([numerics, "--adamw", fmt, str(len(grads)), repr(lr), repr(wd), repr(grad_scale), inp, out])
    assert r.returncode == 0, r.stderr
    raw = np.fromfile(out, dtype=np.uint8)
    n = master.size
    md, vd = MOMENT_DTYPES[fmt]
    sizes = [n * 4, n * np.dtype(md).itemsize, n * np.dtype(vd).itemsize]
    p = raw[:sizes[0]].view(np.float32).astype(np.float64)
    mraw = raw[sizes[0]:sizes[0] + sizes[1]].view(md)
    vraw = raw[sizes[0] + sizes[1]:sum(sizes)].view(vd)
    sinv = raw[sum(sizes):].view(np.float32).astype(np.float64)
    if fmt == "fp32":
        return p, mraw.astype(np.float64), vraw.astype(np.float64), None
    if fmt == "bf16":
        dec = lambda x: x.view(ml_dtypes.bfloat16).astype(np.float64)
        return p, dec(mraw), dec(vraw), None
    assert sinv.size == 2 * -(-n // CHUNK)
    em, ev = np.repeat(sinv[0::2], CHUNK)[:n], np.repeat(sinv[1::2], CHUNK)[:n]
    return p, mraw.view(ml_dtypes.float8_e4m3fn).astype(np.float64) * em, vraw.view(np.float16).astype(np.float64) * ev, sinv


# per format: relative error of a stored moment (half an ulp: 2^-(mantissa bits + 1)) for m and v
HALF_ULP = {"fp32": (2.0 ** -24, 2.0 ** -24), "bf16": (2.0 ** -8, 2.0 ** -8), "fp8": (2.0 ** -4, 2.0 ** -11)}


@pytest.mark.parametrize("fmt", ["fp32", "bf16", "fp8"])
def test_adamw_state_matches_float64(numerics, tmp_path, rng, fmt):
    """Three steps from zero moments over 2.5 chunks whose gradients differ by 2^10 in scale, so each chunk
    has its own scales; the last chunk is partial."""
    n = 2 * CHUNK + CHUNK // 2 + 17
    master = rng.normal(0.0, 0.02, n)
    chunk_scale = np.repeat(2.0 ** rng.uniform(-10, 0, -(-n // CHUNK)), CHUNK)[:n]
    grads = [rng.normal(0.0, 1e-2, n) * chunk_scale for _ in range(3)]
    lr, wd, grad_scale = 1e-3, 0.1, 0.5
    p, m, v, sinv = c_adamw(numerics, fmt, master, grads, lr, wd, grad_scale, tmp_path)
    rp, rm, rv, rsinv = reference_adamw(fmt, master, grads, lr, wd, grad_scale)
    # the scales: powers of two of the chunk's amax; a float32 vs float64 amax moves one only at a boundary
    if fmt == "fp8":
        assert np.all(np.log2(sinv) == np.round(np.log2(sinv))), "scale_inv is not a power of two"
        assert np.mean(sinv == rsinv) >= 0.99, f"scale_inv differ: {sinv} vs {rsinv}"
    # each stored moment: the reference's code, or (an FP32 rounding apart at a rounding boundary) its neighbour
    for name, got, ref, half_ulp in (("m", m, rm, HALF_ULP[fmt][0]), ("v", v, rv, HALF_ULP[fmt][1])):
        if fmt == "fp32":  # FP32 arithmetic against float64: a few FP32 ulps (m may cancel)
            assert np.all(np.abs(got - ref) <= 1e-6 * np.abs(ref) + 1e-7 * np.abs(ref).max()), f"{name}: beyond FP32 rounding"
            continue
        same = np.mean(got == ref)
        assert same >= 0.99, f"{name}: only {same:.4f} of the stored moments are the reference's"
        # where an earlier step stored the neighbouring code, the moment carries that code's difference
        # (beta times one code of the chunk's largest moment) and m may cancel to below it
        chunks = -(-n // CHUNK)
        chunk_max = np.abs(np.concatenate([ref, np.zeros(chunks * CHUNK - n)]).reshape(chunks, CHUNK)).max(axis=1)
        close = np.abs(got - ref) <= 4 * half_ulp * (np.abs(ref) + np.repeat(chunk_max, CHUNK)[:n])
        i = np.argmax(~close)
        assert close.all(), f"{name}: {np.sum(~close)} moments beyond a code of the reference's: {got[i]!r} vs {ref[i]!r} at {i}"
    # the master weights follow the reference to FP32 rounding, except where a neighbouring code fed the
    # update: then by at most lr * a moment's relative rounding
    err = np.abs(p - rp)
    assert np.mean(err <= 1e-8 + 1e-6 * np.abs(rp)) >= 0.98, f"master weights: max err {err.max():.3e}"
    assert err.max() <= 3 * lr * (HALF_ULP[fmt][0] + HALF_ULP[fmt][1]) * 4 + 1e-7, f"master weights: max err {err.max():.3e}"


@pytest.mark.parametrize("fmt", ["bf16", "fp8"])
def test_stored_moments_within_their_rounding(numerics, tmp_path, rng, fmt):
    """One step: each stored moment is the exact float64 moment within its format's half ulp (relative), or,
    below the format's normal range after scaling, within its subnormal spacing."""
    n = CHUNK + 999
    master = rng.normal(0.0, 0.02, n)
    grads = [rng.normal(0.0, 1e-2, n) * np.exp(rng.uniform(-6, 0, n))]
    p, m, v, _ = c_adamw(numerics, fmt, master, grads, 1e-3, 0.0, 1.0, tmp_path)
    g = grads[0]
    exact_m, exact_v = (1 - BETA1) * g, (1 - BETA2) * g * g
    for name, got, exact, half_ulp, target, sub in (("m", m, exact_m, HALF_ULP[fmt][0], E4M3_MAX, 2.0 ** -9),
                                                    ("v", v, exact_v, HALF_ULP[fmt][1], FP16_MAX, 2.0 ** -24)):
        bound = half_ulp * np.abs(exact) * (1 + 1e-6) + 1e-45
        if fmt == "fp8":
            chunks = -(-n // CHUNK)
            amax = np.abs(np.concatenate([exact, np.zeros(chunks * CHUNK - n)]).reshape(chunks, CHUNK)).max(axis=1)
            bound = bound + np.repeat(sub / 2 / pow2_scale(target, amax), CHUNK)[:n]
        assert np.all(np.abs(got - exact) <= bound), f"{name}: {np.sum(np.abs(got - exact) > bound)} beyond the bound"
