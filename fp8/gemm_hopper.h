/*
 * A model of how Hopper's tensor cores accumulate an FP8 GEMM (`--fp8-accum hopper`), for the CPU
 * emulation (gemm_cpu.h calls gemm_hopper for an FP8 GemmCall whose accum is FP8_ACCUM_HOPPER). The
 * default, FP8_ACCUM_EXACT, multiplies the decoded operands with FP32 BLAS and is more accurate than
 * the GPU; this model computes the bits an H100's cuBLASLt FP8 GEMM returns, so that the cost of the
 * GPU's accumulation, and of fast accumulation in particular, can be measured without a GPU.
 *
 * Sources (the model is written from their descriptions, not from anyone's code):
 *   - M. Fasi, N. J. Higham, M. Mikaitis, S. Pranesh, "Numerical behavior of NVIDIA tensor cores",
 *     PeerJ Comput. Sci. 7:e330 (2021): block FMA, products aligned to the largest exponent and
 *     truncated, the accumulator taking part in the alignment;
 *   - F. A. Khattak, M. Mikaitis, "Accurate Models of NVIDIA Tensor Cores", ACM TACO 23(3) (2026),
 *     arXiv:2512.07004: the FP8 block size and the retained bits on Hopper;
 *   - DeepSeek-V3 technical report (arXiv:2412.19437) section 3.3: about 14 retained bits on H800, and
 *     partial sums promoted to FP32 every 128 elements;
 *   - mmaemu 0.1.0 (PyPI, Apache-2.0), its semantics page and its "hopper" preset: nfma 32, frac 13,
 *     frac_out 13, min_exp -132, the accumulator in the alignment; slow accumulation restarts the chain
 *     every 128 K elements and adds the chunk results in FP32; split-K "contiguous" (128-wide k-tiles,
 *     split s owns tiles [s q, (s+1) q), q = ceil(T / S), partials added serially in FP32); the
 *     epilogue y = RN32(acc * RN32(scale_a scale_b)), then RNE to BF16 (the double rounding). mmaemu
 *     validated these bit for bit on an H100 PCIe with cuBLASLt 12.8.3.14; an H200 or H800 with another
 *     cuBLASLt runs the same tensor cores, but its split-K decisions may differ.
 *
 * One block step, d = block(c, a[0..31], b[0..31]) (every quantity exact):
 *   - each operand's exponent is floor(log2 |x|) clamped below at its format's emin (E4M3 -6, E5M2 -14,
 *     so subnormals keep a denormalised significand); a product's exponent is ea + eb; zero products
 *     take no part in the maximum;
 *   - E = max(largest product exponent, exponent of c (when c != 0), -132);
 *   - every product and c is truncated toward zero to a multiple of 2^(E - 13) and the terms are added
 *     exactly;
 *   - the sum is truncated toward zero to 13 fraction bits below its own leading bit (exponent clamped
 *     below at -126); a zero result is +0.
 * A K-long chain runs the step over consecutive blocks of 32 from c = +0 (a ragged last block is zero
 * padded, which leaves the result unchanged). Fast accumulation (TE's fprop): one chain per split-K
 * part. Without it (dgrad, wgrad): one chain per 128 elements, the chain results added in FP32 (RNE).
 *
 * The arithmetic is integer: an FP8 value is s * 2^(e - f) with an integer significand s (|s| <= 15)
 * and f its mantissa bits, so a product truncated to 2^(E - 13) is (|sa sb| << (13 - fa - fb)) >>
 * (E - ea - eb), and the accumulator is carried as an integer times a power of two. Every output is
 * computed by one thread from its K in order, so results do not depend on the thread count.
 * Not modelled: BF16 GEMMs (they stay FP32-exact), non-finite FP8 codes (a GEMM with one falls back to
 * the exact path; the trainer's casts saturate and never make one), cuBLASLt's choice of split-K
 * (gemm_hopper takes the split count; the trainer passes 1), the accumulator's beta = 1 path (an
 * accumulating call adds RN32(alpha acc) to D, as op_gemm does for the exact path).
 */
#pragma once

#include <stdint.h>

#include "gemm.h"

#define HOPPER_BLOCK 32        /* products per block FMA (mmaemu "hopper": nfma) */
#define HOPPER_FRAC 13         /* fraction bits kept below the block's alignment exponent */
#define HOPPER_FRAC_OUT 13     /* fraction bits of a block result */
#define HOPPER_MIN_EXP (-132)  /* lower clamp of the alignment exponent */
#define HOPPER_RESULT_EMIN (-126) /* a block result's exponent is clamped below at FP32's emin */
#define HOPPER_SLOW_CHUNK 128  /* without fast accumulation, the chain restarts every 128 elements */
#define HOPPER_SPLIT_TILE 128  /* split-K k-tile of the sm_90 kernels */
#define HOPPER_ZERO_EXP (-1000) /* a block without a non-zero product: no exponent */
/* A zero code's exponent in the decoded operands: a product with a zero factor has an exponent of at
   most -100 + 15, below every non-zero product's (>= -6 - 14), so it is never a block's maximum. */
#define HOPPER_ZERO_CODE_EXP (-100)
#define HOPPER_NONZERO_EXP_MIN (-20)

/* An FP8 code as significand and clamped exponent: value = sig * 2^(exp - mantissa bits). */
typedef struct {
    int8_t sig[256];
    int8_t exp[256];
    uint8_t nonfinite[256];
} HopperCodeTable;

/* The decoding table of format f (OCP FP8: E4M3 3 mantissa bits, bias 7; E5M2 2, bias 15). */
static inline void hopper_code_table(HopperCodeTable* t, Fp8Format f) {
    int mbits = f == FP8_E4M3 ? 3 : 2, bias = f == FP8_E4M3 ? 7 : 15, ebits = f == FP8_E4M3 ? 4 : 5;
    for (int c = 0; c < 256; c++) {
        int sign = c >> 7, e = (c >> mbits) & ((1 << ebits) - 1), m = c & ((1 << mbits) - 1);
        int nonfinite = f == FP8_E4M3 ? (c & 0x7f) == 0x7f : e == (1 << ebits) - 1;
        int sig = e == 0 ? m : (1 << mbits) + m;
        t->sig[c] = (int8_t)(nonfinite ? 0 : sign ? -sig : sig);
        t->exp[c] = (int8_t)(sig == 0 || nonfinite ? HOPPER_ZERO_CODE_EXP : e == 0 ? 1 - bias : e - bias);
        t->nonfinite[c] = (uint8_t)nonfinite;
    }
}

/* The chain's accumulator: value = m * 2^u (m = 0: +0). |m| < 2^15 after a block's truncation. */
typedef struct {
    int64_t m;
    int u;
} HopperAcc;

static inline int hopper_bit_length(uint64_t x) { return x == 0 ? 0 : 64 - __builtin_clzll(x); }

/*
 * One block FMA (see the banner): c = block(c, the n products of sa/ea and sb/eb), n 16 or 32 (K is a
 * multiple of 16). base = 13 - (mantissa bits of A + of B). Inlined with n constant, the two loops
 * vectorise (variable shifts on 32-bit lanes).
 */
static inline __attribute__((always_inline)) void hopper_block(HopperAcc* c, const int8_t* sa, const int8_t* ea,
                                                               const int8_t* sb, const int8_t* eb, int n, int base) {
    int32_t emax = 2 * HOPPER_ZERO_CODE_EXP;
    for (int t = 0; t < n; t++) {
        int32_t ep = (int32_t)ea[t] + (int32_t)eb[t];
        emax = ep > emax ? ep : emax;
    }
    if (emax < HOPPER_NONZERO_EXP_MIN) emax = HOPPER_ZERO_EXP; /* every product is zero */
    int E = emax > HOPPER_MIN_EXP ? emax : HOPPER_MIN_EXP;
    uint64_t cmag = (uint64_t)(c->m < 0 ? -c->m : c->m);
    if (cmag != 0) {
        int ec = hopper_bit_length(cmag) - 1 + c->u; /* floor(log2 |c|) */
        if (ec > E) E = ec;
    }
    int32_t s = 0;
    for (int t = 0; t < n; t++) {
        int32_t p = (int32_t)sa[t] * (int32_t)sb[t];
        int32_t sh = E - ((int32_t)ea[t] + (int32_t)eb[t]);
        sh = sh < 31 ? sh : 31;                    /* |p| << base < 2^16: a shift of 31 leaves 0 */
        sh = sh > 0 ? sh : 0; /* negative only for a zero product in an all-zero block (E below its code's exponent) */
        int32_t q = ((p < 0 ? -p : p) << base) >> sh;
        s += p < 0 ? -q : q;
    }
    /* c truncated toward zero to a multiple of 2^(E - 13); |c| < 2^(E + 1), so it fits */
    int64_t ct = 0;
    if (cmag != 0) {
        int sh = E - HOPPER_FRAC - c->u;
        uint64_t q = sh >= 0 ? (sh < 63 ? cmag >> sh : 0) : cmag << -sh;
        ct = c->m < 0 ? -(int64_t)q : (int64_t)q;
    }
    int64_t sum = (int64_t)s + ct;
    uint64_t mag = (uint64_t)(sum < 0 ? -sum : sum);
    if (mag == 0) {
        c->m = 0; /* +0 */
        c->u = 0;
        return;
    }
    /* keep HOPPER_FRAC_OUT fraction bits below the result's leading bit (exponent clamped at -126) */
    int ed = hopper_bit_length(mag) - 1 + E - HOPPER_FRAC;
    int keep = (ed > HOPPER_RESULT_EMIN ? ed : HOPPER_RESULT_EMIN) - HOPPER_FRAC_OUT - (E - HOPPER_FRAC);
    if (keep > 0) mag = (mag >> keep) << keep;
    c->m = sum < 0 ? -(int64_t)mag : (int64_t)mag;
    c->u = E - HOPPER_FRAC;
}

/* The accumulator's value as a float (exact: at most 14 significant bits, a multiple of 2^-139). */
static inline float hopper_acc_value(const HopperAcc* c) { return c->m == 0 ? 0.0f : (float)ldexp((double)c->m, c->u); }

/* One chain from +0 over elements [k0, k1) of a and b (decoded rows). */
static inline float hopper_chain(const int8_t* sa, const int8_t* ea, const int8_t* sb, const int8_t* eb, size_t k0,
                                 size_t k1, int base) {
    HopperAcc c = {0, 0};
    for (size_t k = k0; k < k1; k += HOPPER_BLOCK) {
        if (k1 - k >= HOPPER_BLOCK) hopper_block(&c, sa + k, ea + k, sb + k, eb + k, HOPPER_BLOCK, base);
        else hopper_block(&c, sa + k, ea + k, sb + k, eb + k, HOPPER_BLOCK / 2, base); /* K % 16 == 0 */
    }
    return hopper_acc_value(&c);
}

/*
 * The FP32 accumulator of one output, before the scales: the K products of a and b (decoded rows) as
 * cuBLASLt adds them with `splits` contiguous split-K parts (1: unsplit) and fast accumulation on or off.
 */
static inline float hopper_dot(const int8_t* sa, const int8_t* ea, const int8_t* sb, const int8_t* eb, size_t K, int fast,
                               int splits, int base) {
    size_t tiles = (K + HOPPER_SPLIT_TILE - 1) / HOPPER_SPLIT_TILE;
    size_t per_split = splits > 1 ? (tiles + (size_t)splits - 1) / (size_t)splits : tiles;
    float total = 0.0f;
    for (int s = 0; s < (splits > 1 ? splits : 1); s++) {
        size_t k0 = (size_t)s * per_split * HOPPER_SPLIT_TILE, k1 = k0 + per_split * HOPPER_SPLIT_TILE;
        if (splits <= 1) k0 = 0, k1 = K;
        if (k1 > K) k1 = K;
        float part = 0.0f; /* an empty split gives +0 */
        if (fast) {
            if (k0 < k1) part = hopper_chain(sa, ea, sb, eb, k0, k1, base);
        } else {
            for (size_t k = k0; k < k1; k += HOPPER_SLOW_CHUNK)
                part += hopper_chain(sa, ea, sb, eb, k, k + HOPPER_SLOW_CHUNK < k1 ? k + HOPPER_SLOW_CHUNK : k1, base);
        }
        total = s == 0 ? part : total + part; /* partials combined serially in FP32 */
    }
    return total;
}

/* Grow-only scratch of the decoded operands (significands and exponents of A, then of B). */
static int8_t* g_hopper_scratch = NULL;
static size_t g_hopper_scratch_len = 0;

/* Decodes n codes through t into sig/exp; returns whether any is non-finite. */
static inline int hopper_decode(int8_t* sig, int8_t* exp, const uint8_t* codes, size_t n, const HopperCodeTable* t) {
    int nonfinite = 0;
#pragma omp parallel for schedule(static) reduction(| : nonfinite)
    for (size_t i = 0; i < n; i++) {
        sig[i] = t->sig[codes[i]];
        exp[i] = t->exp[codes[i]];
        nonfinite |= t->nonfinite[codes[i]];
    }
    return nonfinite;
}

/* Outputs per parallel work item: fixed by the shape, so the result does not depend on the thread count. */
#define HOPPER_TILE_ROWS 32
#define HOPPER_TILE_COLS 8

/*
 * Runs the FP8 GEMM g (gemm.h: TN, checked by the caller) with the Hopper model: D (m x n, float) =
 * RN32(acc * RN32(scale_inv_a scale_inv_b)) [+ D], acc the model's accumulator with g->fast_accum and
 * `splits` contiguous split-K parts. Returns 0, or 1 without touching D when an operand holds a
 * non-finite code (the caller then runs the exact path, whose IEEE arithmetic propagates it).
 */
static inline int gemm_hopper(const GemmCall* g, int splits) {
    static HopperCodeTable tables[2];
    static int ready = 0;
    if (!ready) {
        hopper_code_table(&tables[FP8_E4M3], FP8_E4M3);
        hopper_code_table(&tables[FP8_E5M2], FP8_E5M2);
        ready = 1;
    }
    size_t m = g->m, n = g->n, K = g->k, need = 2 * (m + n) * K;
    if (g_hopper_scratch_len < need) {
        free(g_hopper_scratch);
        g_hopper_scratch = (int8_t*)mallocCheck(need);
        g_hopper_scratch_len = need;
    }
    int8_t *sa = g_hopper_scratch, *ea = sa + m * K, *sb = ea + m * K, *eb = sb + n * K;
    Fp8Format fa = g->a.dtype == DT_E4M3 ? FP8_E4M3 : FP8_E5M2, fb = g->b.dtype == DT_E4M3 ? FP8_E4M3 : FP8_E5M2;
    /* TN: row i of op(A) is A + i k, column j of op(B) is B + j k, both contiguous in k */
    int bad = hopper_decode(sa, ea, (const uint8_t*)g->a.data, m * K, &tables[fa]);
    bad |= hopper_decode(sb, eb, (const uint8_t*)g->b.data, n * K, &tables[fb]);
    if (bad) return 1;
    int base = HOPPER_FRAC - (fa == FP8_E4M3 ? 3 : 2) - (fb == FP8_E4M3 ? 3 : 2);
    float alpha = *g->a.scale_inv * *g->b.scale_inv; /* RN32, as the GPU's epilogue forms it */
    float* D = (float*)g->d;
    size_t tiles_m = (m + HOPPER_TILE_ROWS - 1) / HOPPER_TILE_ROWS, tiles_n = (n + HOPPER_TILE_COLS - 1) / HOPPER_TILE_COLS;
#pragma omp parallel for schedule(dynamic)
    for (size_t t = 0; t < tiles_m * tiles_n; t++) {
        size_t i0 = (t % tiles_m) * HOPPER_TILE_ROWS, j0 = (t / tiles_m) * HOPPER_TILE_COLS;
        size_t i1 = i0 + HOPPER_TILE_ROWS < m ? i0 + HOPPER_TILE_ROWS : m, j1 = j0 + HOPPER_TILE_COLS < n ? j0 + HOPPER_TILE_COLS : n;
        for (size_t j = j0; j < j1; j++) {
            for (size_t i = i0; i < i1; i++) {
                float acc = hopper_dot(sa + i * K, ea + i * K, sb + j * K, eb + j * K, K, g->fast_accum, splits, base);
                /* the exact product rounded once to FP32 (+0.0: an exact zero is +0), as cuBLASLt's FFMA with beta 0 */
                float y = (float)((double)acc * (double)alpha + 0.0);
                float* d = &D[j * m + i];
                *d = g->accumulate ? *d + y : y;
            }
        }
    }
    return 0;
}
