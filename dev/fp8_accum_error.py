"""
Per-GEMM output error of the FP8 accumulation models at Llama-2 7B / 13B reduction lengths
(docs/precision.md's "FP8 accumulation" table; a measurement, not a test). For each K, an FP8 GEMM of a
small M x N slice is computed by build/tools/numerics --fp8-gemm three ways: `exact` (FP32 accumulation,
today's CPU emulation), `hopper` with fast accumulation (fprop's setting) and `hopper` without (dgrad's
and wgrad's), and rounded to BF16 as the GPU stores it. Each is compared with the float64 product of the
same FP8 operands: relative RMS error, and the fraction of BF16 outputs that differ from `exact`'s.

Operands, cast with the current-scaling policy (amax -> fp8 max): fprop X (M, K) E4M3 ~ N(0, 1) with one
outlier channel in 256 scaled by 30 (as LLM activations have them) times W (N, K) E4M3 ~ N(0, 0.02);
dgrad dY (M, K) E5M2 ~ N(0, 1) times W^T (N, K) E4M3. Fresh inputs per seed; the figures are means over
--seeds seeds. Needs numpy and ml_dtypes (scripts/setup.sh) and a built build/tools/numerics.

    nice -n 10 python3 dev/fp8_accum_error.py --m 64 --n 256 --seeds 3
"""
import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import ml_dtypes
import numpy as np

REPO = Path(__file__).resolve().parents[1]
FORMATS = {"e4m3": (ml_dtypes.float8_e4m3fn, 448.0), "e5m2": (ml_dtypes.float8_e5m2, 57344.0)}


def cast(t, fmt):
    """Codes and scale_inv of t cast with current scaling (saturating RNE)."""
    dtype, fmax = FORMATS[fmt]
    scale = np.float32(fmax / np.abs(t).max())
    codes = np.clip(t.astype(np.float32) * scale, -fmax, fmax).astype(dtype)
    return codes, np.float32(1.0 / scale)


def gemm(tmp, accum, x8, fx, w8, fw, sx, sw, fast):
    M, K = x8.shape
    N = w8.shape[0]
    xf, wf, yf = tmp / "x.u8", tmp / "w.u8", tmp / "y.f32"
    x8.view(np.uint8).tofile(xf)
    w8.view(np.uint8).tofile(wf)
    cmd = [REPO / "build/tools/numerics", "--fp8-gemm", accum, fx, fw, M, N, K, int(fast), 1, repr(float(sx)), repr(float(sw)), xf, wf, yf]
    subprocess.run([str(c) for c in cmd], check=True)
    return np.fromfile(yf, dtype=np.float32).reshape(M, N)


def bf16(y):
    return y.astype(ml_dtypes.bfloat16)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--m", type=int, default=64)
    ap.add_argument("--n", type=int, default=256)
    ap.add_argument("--k", type=int, nargs="+", default=[4096, 5120, 11008, 13824])
    ap.add_argument("--seeds", type=int, default=3)
    a = ap.parse_args()
    print("| GEMM | K | BF16 out, rel. RMS error vs float64: exact | hopper fast | hopper slow "
          "| FP32 out: exact | hopper fast | hopper slow | BF16 outputs != exact: hopper fast | hopper slow |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for gemm_kind, fx in (("fprop E4M3xE4M3", "e4m3"), ("dgrad E5M2xE4M3", "e5m2")):
            for K in a.k:
                err = {k: [] for k in ("exact", "fast", "slow")}
                err32 = {k: [] for k in ("exact", "fast", "slow")}
                diff = {k: [] for k in ("fast", "slow")}
                for seed in range(a.seeds):
                    rng = np.random.default_rng(1000 * K + seed)
                    x = rng.standard_normal((a.m, K))
                    if fx == "e4m3":
                        x[:, rng.integers(0, K, K // 256)] *= 30.0
                    w = rng.standard_normal((a.n, K)) * 0.02
                    x8, sx = cast(x, fx)
                    w8, sw = cast(w, "e4m3")
                    ref = (x8.astype(np.float64) * float(sx)) @ (w8.astype(np.float64) * float(sw)).T
                    out = {"exact": gemm(tmp, "exact", x8, fx, w8, "e4m3", sx, sw, 1),
                           "fast": gemm(tmp, "hopper", x8, fx, w8, "e4m3", sx, sw, 1),
                           "slow": gemm(tmp, "hopper", x8, fx, w8, "e4m3", sx, sw, 0)}
                    for k, y in out.items():
                        yb = bf16(y).astype(np.float64)
                        err[k].append(np.sqrt(np.mean((yb - ref) ** 2) / np.mean(ref ** 2)))
                        err32[k].append(np.sqrt(np.mean((y.astype(np.float64) - ref) ** 2) / np.mean(ref ** 2)))
                    for k in ("fast", "slow"):
                        diff[k].append(np.mean(bf16(out[k]).view(np.uint16) != bf16(out["exact"]).view(np.uint16)))
                e = {k: np.mean(v) for k, v in err.items()}
                e32 = {k: np.mean(v) for k, v in err32.items()}
                f = {k: np.mean(v) for k, v in diff.items()}
                print(f"| {gemm_kind} | {K} | {e['exact']:.2e} | {e['fast']:.2e} | {e['slow']:.2e} | "
                      f"{e32['exact']:.1e} | {e32['fast']:.2e} | {e32['slow']:.2e} | {100 * f['fast']:.1f}% | {100 * f['slow']:.1f}% |")
                sys.stdout.flush()


if __name__ == "__main__":
    main()
