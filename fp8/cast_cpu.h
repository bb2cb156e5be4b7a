/*
 * The FP8 casts of the CPU emulation: amax (max |x|) and the fused cast-transpose of an FP32 tensor
 * whose values the CPU backend keeps BF16-rounded where the GPU stores BF16, or (round_bf16) of FP32
 * master weights, each rounded to BF16 first as the GPU's casts of master weights do; and the transpose
 * of FP8 codes. The policy and the cast are fp8.h's functions, the ones the GPU kernels (cast_cuda.cuh)
 * run, so the codes, amax and scales are bit-identical to the GPU's. Reductions use fixed chunks, so
 * results do not depend on the thread count.
 */
#pragma once

#include <omp.h>

#include "fp8.h"

/* Elements per independently reduced chunk of the amax. */
#define AMAX_CHUNK 65536

/* The value a cast reads: x, or its BF16 rounding. */
static inline float fp8_cast_input(float x, int round_bf16) { return round_bf16 ? bf16_round(x) : x; }

/* s->amax = max |x| over n floats (each rounded to BF16 first when round_bf16); NaN if any is NaN (amax_combine). */
static inline void fp8_amax_cpu(Fp8Scale* s, const float* x, size_t n, int round_bf16) {
    size_t chunks = ceil_div(n, AMAX_CHUNK);
    float* part = (float*)mallocCheck(chunks * sizeof(float));
#pragma omp parallel for schedule(static)
    for (size_t k = 0; k < chunks; k++) {
        size_t end = (k + 1) * AMAX_CHUNK < n ? (k + 1) * AMAX_CHUNK : n;
        float a = 0.0f;
        for (size_t i = k * AMAX_CHUNK; i < end; i++) {
            float v = fp8_cast_input(x[i], round_bf16);
            a = amax_combine(a, fabsf(v));
        }
        part[k] = a;
    }
    float a = 0.0f;
    for (size_t k = 0; k < chunks; k++) a = amax_combine(a, part[k]);
    free(part);
    s->amax = a;
}

/*
 * Casts x (rows, cols), each value rounded to BF16 first when round_bf16, with `scale` into codes out
 * (rows, cols) and out_t (cols, rows); either may be NULL. counts (may be NULL) accumulates the cast
 * statistics (fp8.h Fp8Counts). Returns max |x| of the values cast (NaN if any is NaN, as
 * amax_combine), computed as they are read: through the bit patterns with the sign cleared, whose
 * unsigned order is that of the magnitudes with every NaN above +Inf, so the reduction is exact in any
 * order.
 */
static inline float fp8_cast_codes_cpu(uint8_t* out, uint8_t* out_t, const float* x, size_t rows, size_t cols, Fp8Format f,
                                       float scale, Fp8Counts* counts, int round_bf16) {
    unsigned long long sat = 0, under = 0, nonzero = 0;
    uint32_t amax_bits = 0;
#pragma omp parallel for schedule(static) reduction(+ : sat, under, nonzero) reduction(max : amax_bits)
    for (size_t i = 0; i < rows; i++) {
        for (size_t j = 0; j < cols; j++) {
            float v = fp8_cast_input(x[i * cols + j], round_bf16);
            uint8_t code = fp8_quantize(v, scale, f);
            if (out) out[i * cols + j] = code;
            if (out_t) out_t[j * rows + i] = code;
            sat += (unsigned long long)fp8_is_max(code, f);
            nonzero += v != 0.0f;
            under += v != 0.0f && fp8_is_zero(code);
            uint32_t b = float_bits(v) & 0x7fffffffu;
            amax_bits = b > amax_bits ? b : amax_bits;
        }
    }
    if (counts) {
        counts->saturated += sat;
        counts->underflow += under;
        counts->nonzero += nonzero;
        counts->count += (unsigned long long)rows * cols;
    }
    return amax_bits > 0x7f800000u ? NAN : bits_float(amax_bits);
}

/* Current scaling's scale: s->scale / s->scale_inv from s->amax (fp8_compute_scale), and s->nonfinite set
   to 1 when that amax is not finite (sticky, fp8.h Fp8Scale). */
static inline void fp8_scale_from_amax_cpu(Fp8Scale* s, Fp8Format f, int pow2) {
    fp8_scale_set(s, s->amax, f, pow2);
    if (!fp8_amax_is_finite(s->amax)) s->nonfinite = 1.0f;
}

/* Current scaling: the scale from s->amax (fp8_scale_from_amax_cpu), then the cast of x (fp8_cast_codes_cpu). */
static inline void fp8_cast_transpose_cpu(uint8_t* out, uint8_t* out_t, const float* x, size_t rows, size_t cols,
                                          Fp8Format f, Fp8Scale* s, int pow2, Fp8Counts* counts, int round_bf16) {
    fp8_scale_from_amax_cpu(s, f, pow2);
    fp8_cast_codes_cpu(out, out_t, x, rows, cols, f, s->scale, counts, round_bf16);
}

/*
 * Delayed scaling: casts x (rows, cols) with the scale s holds (s->scale is only read), sets s->amax to
 * the amax of x and, when record is not NULL, *record = amax_combine(*record, that amax): the step's
 * amax over its micro-batches.
 */
static inline void fp8_cast_transpose_delayed_cpu(uint8_t* out, uint8_t* out_t, const float* x, size_t rows, size_t cols,
                                                  Fp8Format f, Fp8Scale* s, Fp8Counts* counts, float* record) {
    s->amax = fp8_cast_codes_cpu(out, out_t, x, rows, cols, f, s->scale, counts, 0);
    if (record) *record = amax_combine(*record, s->amax);
}

/* x (rows, cols) cast as q says (fp8.h Fp8Quant) into out and/or out_t (either may be NULL). */
static inline void fp8_quantize_cpu(uint8_t* out, uint8_t* out_t, const float* x, size_t rows, size_t cols, Fp8Format f,
                                    const Fp8Quant* q) {
    if (q->amax) fp8_amax_cpu(q->s, x, rows * cols, 0);
    if (!q->history) fp8_scale_from_amax_cpu(q->s, f, q->pow2);
    if (!q->history && q->record == NULL) fp8_cast_codes_cpu(out, out_t, x, rows, cols, f, q->s->scale, q->counts, 0);
    else fp8_cast_transpose_delayed_cpu(out, out_t, x, rows, cols, f, q->s, q->counts, q->record);
}

/* s[i] for the n records and their histories (n rows of H): fp8_delayed_update with step_amax[i]. */
static inline void fp8_delayed_update_cpu(Fp8Scale* s, float* history, const float* step_amax, size_t n, int H, int pos,
                                          int len, int algo, Fp8Format f, int margin, int pow2) {
    for (size_t i = 0; i < n; i++) fp8_delayed_update(&s[i], history + i * (size_t)H, step_amax[i], H, pos, len, algo, f, margin, pow2);
}

/* out_t (cols, rows) = in (rows, cols) transposed (FP8 codes). */
static inline void fp8_transpose_cpu(uint8_t* out_t, const uint8_t* in, size_t rows, size_t cols) {
#pragma omp parallel for schedule(static)
    for (size_t j = 0; j < cols; j++) {
        for (size_t i = 0; i < rows; i++) out_t[j * rows + i] = in[i * cols + j];
    }
}
