/*
 * FP8 formats and the per-tensor current-scaling recipe, shared by the CPU reference and the CUDA build
 * (every function is host + device). This file is the single definition of:
 *   - the two OCP FP8 formats (E4M3 "fn": no infinities, max 448; E5M2: IEEE-like, max 57344),
 *   - the scaling policy amax -> scale (Transformer Engine's Float8CurrentScaling semantics),
 *   - the cast: y = x * scale in FP32, then round-to-nearest-even with saturation to +-max
 *     (cuda_fp8.h's __nv_cvt_float_to_fp8 with __NV_SATFINITE, the conversion the GPU uses, bit for bit),
 *   - BF16 round-to-nearest-even, which the CPU build applies wherever the GPU stores BF16.
 * Vocabulary: `scale` multiplies before the cast, `scale_inv` = 1 / scale is what the GEMM receives.
 * The rest of the FP8 library builds on this file: the GEMM contract and operand map (gemm.h), the casts
 * and GEMMs of the CPU emulation (cast_cpu.h, gemm_cpu.h) and of the GPU (cast_cuda.cuh,
 * gemm_cublaslt.cuh). The library depends on core/ only and knows nothing of the model.
 * References: OCP 8-bit Floating Point Specification (OFP8) rev 1.0; Micikevicius et al., "FP8 Formats
 * for Deep Learning" (2022); Transformer Engine docs, "Using FP8 with Transformer Engine".
 */
#pragma once

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <cuda_fp8.h>

#include "../core/common.h"

typedef enum { FP8_E4M3 = 0, FP8_E5M2 = 1 } Fp8Format;

#define E4M3_MAX 448.0f
#define E5M2_MAX 57344.0f

/* FP8 GEMMs (cuBLASLt on Hopper) need every dimension to be a multiple of this. */
#define FP8_DIM_MULTIPLE 16

/* Largest finite magnitude of a format. */
LLM8_HD static inline float fp8_max(Fp8Format f) { return f == FP8_E4M3 ? E4M3_MAX : E5M2_MAX; }

static inline const char* fp8_format_name(Fp8Format f) { return f == FP8_E4M3 ? "E4M3" : "E5M2"; }

LLM8_HD static inline uint32_t float_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof(u));
    return u;
}

LLM8_HD static inline float bits_float(uint32_t u) {
    float x;
    memcpy(&x, &u, sizeof(x));
    return x;
}

/* Rounds a float to the nearest BF16 value (ties to even); NaN stays NaN (quieted), +-Inf stays. */
LLM8_HD static inline float bf16_round(float x) {
    uint32_t u = float_bits(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return bits_float((u | 0x00400000u) & 0xffff0000u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return bits_float(u & 0xffff0000u);
}

/* FP32 -> FP8 code: round to nearest even, saturating finite values and +-Inf to +-max; NaN -> a NaN code. */
LLM8_HD static inline uint8_t fp8_from_float(float x, Fp8Format f) {
    return (uint8_t)__nv_cvt_float_to_fp8(x, __NV_SATFINITE, f == FP8_E4M3 ? __NV_E4M3 : __NV_E5M2);
}

/* IEEE binary16 bits -> float (exact for every half value, subnormals included). */
LLM8_HD static inline float half_bits_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    if (exp == 0x1f) return bits_float(sign | 0x7f800000u | (man << 13));
    if (exp != 0) return bits_float(sign | ((exp + 112u) << 23) | (man << 13));
    /* subnormal half: man * 2^-24, exact in float */
    float v = (float)man * 0x1p-24f;
    return sign ? -v : v;
}

/* FP8 code -> float; exact (every FP8 value is a binary16 value, and cuda_fp8.h converts exactly). */
LLM8_HD static inline float fp8_to_float(uint8_t code, Fp8Format f) {
    __half_raw h = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)code, f == FP8_E4M3 ? __NV_E4M3 : __NV_E5M2);
    return half_bits_to_float(h.x);
}

/*
 * The cast every FP8 operand goes through: code = fp8(x * scale). NaN inputs become +0 so that no NaN
 * byte ever reaches a GEMM; a NaN (or Inf) in a tensor is reported through its amax instead (see
 * fp8_amax_is_finite), and the step is not applied. Inf saturates to +-max like any large value.
 */
LLM8_HD static inline uint8_t fp8_quantize(float x, float scale, Fp8Format f) {
    float y = x * scale;
    if (y != y) y = 0.0f;
    return fp8_from_float(y, f);
}

/* True when code is +-0. */
LLM8_HD static inline int fp8_is_zero(uint8_t code) { return (code & 0x7f) == 0; }

/* True when code is +-max of its format (E4M3 0x7e, E5M2 0x7b, either sign). */
LLM8_HD static inline int fp8_is_max(uint8_t code, Fp8Format f) {
    return (code & 0x7f) == (f == FP8_E4M3 ? 0x7e : 0x7b);
}

/* Combines two amax values; unlike fmaxf, NaN wins, so a NaN anywhere makes the tensor's amax NaN. */
LLM8_HD static inline float amax_combine(float a, float b) {
    if (a != a || b != b) return NAN;
    return a > b ? a : b;
}

LLM8_HD static inline int fp8_amax_is_finite(float amax) { return amax == amax && amax <= FLT_MAX; }

/* target / amax for a finite amax > 0, an overflow to Inf (amax tiny, e.g. subnormal) clamped to FLT_MAX;
   with pow2, rounded down to a power of two (exactly, through the float's exponent), so that amax * scale
   never exceeds target. Both recipes' policies end here. */
LLM8_HD static inline float fp8_scale_for(float target, float amax, int pow2) {
    float scale = target / amax;
    if (scale > FLT_MAX) scale = FLT_MAX;
    if (pow2) {
        int e;
        frexpf(scale, &e); /* scale = m * 2^e, m in [0.5, 1) */
        scale = ldexpf(1.0f, e - 1);
    }
    return scale;
}

/*
 * The current-scaling policy (Transformer Engine Float8CurrentScaling, margin 0):
 *   amax finite and > 0:  scale = fp8_max / amax, an overflow to Inf (amax tiny, e.g. subnormal) clamps
 *                         to FLT_MAX; with pow2, scale is rounded down to a power of two (exactly,
 *                         through the float's exponent) so that amax * scale never exceeds fp8_max.
 *   amax == 0:            scale = 1 (an all-zero tensor casts to zeros).
 *   amax NaN or Inf:      scale = 1; the caller flags the step (fp8_amax_is_finite) and does not apply it.
 */
LLM8_HD static inline float fp8_compute_scale(float amax, Fp8Format f, int pow2) {
    if (!fp8_amax_is_finite(amax) || amax == 0.0f) return 1.0f;
    return fp8_scale_for(fp8_max(f), amax, pow2);
}

/*
 * Per-tensor FP8 scaling state, one per GEMM operand. Lives in device memory on the GPU. `nonfinite` is
 * sticky: every cast sets it to 1 when the amax it casts with is not finite and nothing but its owner
 * clears it, so one read after many casts tells whether any of them was flagged, without a host round
 * trip per cast. A float (0 or 1) so that a MAX reduction over whole records (the sharded weights' amax
 * all-reduce) ORs it.
 */
typedef struct {
    float amax;      /* max |x| of the tensor as cast (NaN if any element is NaN) */
    float scale;     /* multiplies x before the cast */
    float scale_inv; /* 1 / scale: what the GEMM multiplies the product by */
    float nonfinite; /* 1 once a cast used a non-finite amax since the owner last cleared it, else 0 */
} Fp8Scale;

/* Fills scale and scale_inv from amax. */
LLM8_HD static inline void fp8_scale_set(Fp8Scale* s, float amax, Fp8Format f, int pow2) {
    s->amax = amax;
    s->scale = fp8_compute_scale(amax, f, pow2);
    s->scale_inv = 1.0f / s->scale;
}

/*
 * The two scaling recipes (--fp8-recipe). FP8_RECIPE_CURRENT: every cast takes its scale from the amax of
 * the tensor it casts (above). FP8_RECIPE_DELAYED: Transformer Engine's DelayedScaling (TE docs,
 * "transformer_engine.common.recipe.DelayedScaling"; its kernel amax_and_scale_update): an activation
 * or gradient is cast with a scale computed before it exists, from a history of amaxes of earlier
 * steps, and the cast records the tensor's amax as it goes (no separate amax read). llm8's history gets
 * one entry per applied optimizer step per operand (TE: one per forward call), see model/fp8_state.h.
 */
typedef enum { FP8_RECIPE_CURRENT = 0, FP8_RECIPE_DELAYED = 1 } Fp8Recipe;
/* How the delayed recipe reduces its history to one amax (TE's amax_compute_algo). */
typedef enum { FP8_AMAX_MAX = 0, FP8_AMAX_MOST_RECENT = 1 } Fp8AmaxAlgo;

/* --amax-history: TE DelayedScaling's default length, and the most this build takes. */
#define AMAX_HISTORY_DEFAULT 1024
#define AMAX_HISTORY_MAX 65536
/* --fp8-margin's largest value (fp8_max * 2^-margin stays a normal float far beyond it). */
#define FP8_MARGIN_MAX 64

/* --fp8-recipe's and --amax-algo's values, indexed by Fp8Recipe and Fp8AmaxAlgo. */
static const char* const FP8_RECIPE_NAMES[] = {"current", "delayed"};
static const char* const FP8_AMAX_ALGO_NAMES[] = {"max", "most_recent"};
static inline const char* fp8_recipe_name(int r) { return r == FP8_RECIPE_DELAYED ? "delayed" : "current"; }
static inline const char* fp8_amax_algo_name(int a) { return a == FP8_AMAX_MOST_RECENT ? "most_recent" : "max"; }

/*
 * The delayed recipe's scale from the amax its history gives (TE amax_and_scale_update, whose
 * recipe_common.cuh compute_scale_from_amax adds the FP32 overflow rule):
 *   amax finite and > 0:  scale = (fp8_max * 2^-margin) / amax, i.e. TE's (fp8_max / amax) / 2^margin;
 *                         an overflow to Inf clamps to FLT_MAX; with pow2, rounded down to a power of
 *                         two as fp8_compute_scale does;
 *   amax 0 or non-finite: the previous scale, kept (TE keeps scale_ptr[i]).
 * margin >= 0 (--fp8-margin).
 */
LLM8_HD static inline float fp8_delayed_scale(float amax, float prev_scale, Fp8Format f, int margin, int pow2) {
    if (!fp8_amax_is_finite(amax) || amax == 0.0f) return prev_scale;
    return fp8_scale_for(ldexpf(fp8_max(f), -margin), amax, pow2);
}

/* Bytes of the delayed recipe's training state for `records` X / dY records with histories of H: the
   records (Fp8Scale), then the histories (FP32). The model's and the state file's sizes (model/fp8_state.h,
   train/checkpoint.h) both come from here. */
static inline size_t fp8_delayed_state_bytes(size_t records, int H) {
    return records * sizeof(Fp8Scale) + records * (size_t)H * sizeof(float);
}

/*
 * One record's delayed update after an applied step: history (H floats, a ring) gets step_amax at
 * `pos`, of which the first `len` (<= H, len counting the new entry) hold entries; the amax of the
 * history (FP8_AMAX_MAX: the largest of those entries; FP8_AMAX_MOST_RECENT: step_amax) gives s->scale
 * and s->scale_inv for the next step (fp8_delayed_scale, from the scale s holds). step_amax is finite
 * (a step with a non-finite amax is skipped and adds nothing).
 */
LLM8_HD static inline void fp8_delayed_update(Fp8Scale* s, float* history, float step_amax, int H, int pos, int len,
                                              int algo, Fp8Format f, int margin, int pow2) {
    history[pos] = step_amax;
    float amax = step_amax;
    if (algo == FP8_AMAX_MAX)
        for (int i = 0; i < len && i < H; i++) amax = history[i] > amax ? history[i] : amax;
    s->scale = fp8_delayed_scale(amax, s->scale, f, margin, pow2);
    s->scale_inv = 1.0f / s->scale;
}

/*
 * Cast statistics of one operand, gathered on steps where statistics are due (--fp8-stats N):
 * `saturated` counts elements whose code is +-max, `underflow` counts non-zero inputs whose code is
 * +-0, `nonzero` counts non-zero inputs, `count` all elements.
 */
typedef struct {
    unsigned long long saturated;
    unsigned long long underflow;
    unsigned long long nonzero;
    unsigned long long count;
} Fp8Counts;

/*
 * One cast of an activation X or an output gradient dY as its recipe runs it (cast_cpu.h
 * fp8_quantize_cpu, cast_cuda.cuh fp8_quantize_cuda), resolved by the caller for this cast:
 *   amax:     s->amax = max |x| first (current scaling, where no producer has computed it already);
 *   history:  cast with the scale s holds (the delayed recipe, from its history); else the scale from
 *             s->amax (fp8_scale_set), flagging s->nonfinite when that amax is not finite;
 *   record:   after the cast, s->amax = max |x| and *record = max(*record, it) (the delayed recipe's
 *             step entry); a cast with history and no record still sets s->amax;
 *   counts:   the cast statistics (may be NULL).
 * A delayed run's first step (no history yet) sets the scale from the amax and records: it equals the
 * current recipe's step.
 */
typedef struct {
    Fp8Scale* s;
    Fp8Counts* counts;
    float* record;
    int amax;
    int history;
    int pow2;
} Fp8Quant;

