/*
 * Optimizer pieces shared by both builds: the learning-rate schedule, the global-norm clipping factor,
 * the AdamW element update (the GPU's AdamW kernel calls the same function per element) and the
 * storage formats of the AdamW moments (--optim-state), the gradient buffer (--grad-buffer) and the master
 * weights (--master-weights), whose encode and decode both builds share.
 */
#pragma once

#include <math.h>
#include <string.h>

#include "../core/common.h"
#include "../comm/grad_fp8.h"
#include "../fp8/fp8.h"

#define ADAMW_BETA1 0.9f
#define ADAMW_BETA2 0.95f
#define ADAMW_EPS 1e-8f
/* torch.nn.utils.clip_grad_norm_ divides by (norm + 1e-6); we do the same to match the HF reference. */
#define CLIP_NORM_EPS 1e-6f

/* -k: the learning-rate schedule after the warmup. */
typedef enum { LR_COSINE = 0, LR_LINEAR = 1, LR_CONSTANT = 2 } LrSchedule;
static const char* const LR_SCHEDULE_NAMES[] = {"cosine", "linear", "constant"};

/*
 * Learning rate at optimizer step `step` (0-based) of `total` steps: linear warmup from lr/warmup to lr
 * over `warmup` steps (llm.c), then cosine or linear decay to lr * final_frac at the last step, or
 * constant.
 */
static inline float lr_at_step(LrSchedule schedule, float lr, int warmup, float final_frac, int step, int total) {
    if (step < warmup) return lr * (float)(step + 1) / (float)warmup;
    if (schedule == LR_CONSTANT) return lr;
    int decay_steps = total - warmup;
    if (decay_steps <= 1) return lr;
    float progress = (float)(step - warmup) / (float)(decay_steps - 1);
    if (progress > 1.0f) progress = 1.0f;
    float frac;
    if (schedule == LR_LINEAR) {
        frac = 1.0f - progress;
    } else {
        frac = 0.5f * (1.0f + cosf(3.14159265358979f * progress));
    }
    float min_lr = lr * final_frac;
    return min_lr + frac * (lr - min_lr);
}

/* Gradient multiplier for global-norm clipping (torch semantics): min(1, clip / (norm + 1e-6)); clip 0 = off. */
static inline float clip_factor(float grad_norm, float clip) {
    if (clip <= 0.0f) return 1.0f;
    float f = clip / (grad_norm + CLIP_NORM_EPS);
    return f < 1.0f ? f : 1.0f;
}

/*
 * One AdamW update of one parameter, as torch.optim.AdamW computes it (Loshchilov & Hutter, "Decoupled
 * Weight Decay Regularization", 2019): p *= 1 - lr*wd; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
 * p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps). bc1 = 1 - b1^t, bc2_sqrt = sqrt(1 - b2^t).
 * g is the gradient already multiplied by the clipping factor.
 */
LLM8_HD static inline void adamw_update(float* p, float* m, float* v, float g, float lr, float wd, float bc1,
                                        float bc2_sqrt) {
    float param = *p * (1.0f - lr * wd);
    float mt = ADAMW_BETA1 * *m + (1.0f - ADAMW_BETA1) * g;
    float vt = ADAMW_BETA2 * *v + (1.0f - ADAMW_BETA2) * g * g;
    *m = mt;
    *v = vt;
    *p = param - (lr / bc1) * mt / (sqrtf(vt) / bc2_sqrt + ADAMW_EPS);
}

/* ---------------------------------------------------------------- the moments' storage (--optim-state) */

/*
 * How the AdamW moments m and v are stored between steps (FP8-LM, Peng et al. 2023, section 2.3; MS-AMP's
 * O2 level). The update itself always runs in FP32 (adamw_update); only what is kept changes:
 *   fp32  m, v FP32 (8 bytes per parameter): torch.optim.AdamW.
 *   bf16  m, v BF16, rounded to nearest even (4 bytes): no scale, BF16 has FP32's range.
 *   fp8   m E4M3 and v FP16, each with one scale per ADAMW_CHUNK elements (3 bytes, plus 8 bytes per
 *         chunk): MS-AMP O2's "FP8 + FP16". Per chunk, scale = 2^floor(log2(max / amax)) over the chunk's
 *         new values (fp8_scale_for with pow2; amax 0 gives 1), max being 448 for m and 65504 for v, so
 *         that no value overflows and the power of two leaves the mantissas untouched; the chunk stores
 *         scale_inv = 1 / scale (exact). v is FP16, not FP8: v is a square, so its dynamic range is twice
 *         m's in binades, and FP8-LM found an FP8 v loses accuracy.
 * A chunk is ZERO_CHUNK elements, the granule of the ZeRO shard pieces, so every chunk lies in one piece
 * of one segment, and its scales move with it when a run resumes on another rank count.
 */
typedef enum { OPTIM_STATE_FP32 = 0, OPTIM_STATE_BF16 = 1, OPTIM_STATE_FP8 = 2 } OptimState;
static const char* const OPTIM_STATE_NAMES[] = {"fp32", "bf16", "fp8"};

/* Elements per scale of the fp8 format: comm/zero.h's ZERO_CHUNK (model/model.h checks that they agree). */
#define ADAMW_CHUNK ((size_t)4096)
#define FP16_MAX 65504.0f

/* --optim-state's spelling of OptimState s ("?" for none). */
static inline const char* optim_state_name(int s) { return s >= 0 && s <= OPTIM_STATE_FP8 ? OPTIM_STATE_NAMES[s] : "?"; }

/* Bytes per element of moment `which` (0: m, 1: v) in format f. */
LLM8_HD static inline size_t adamw_moment_bytes(OptimState f, int which) {
    if (f == OPTIM_STATE_FP32) return 4;
    if (f == OPTIM_STATE_BF16) return 2;
    return which == 0 ? 1 : 2;
}

/* scale_inv values (FP32) that n elements of moments need: 2 per chunk (m's, then v's) in fp8, else 0. */
static inline size_t adamw_scale_count(OptimState f, size_t n) { return f == OPTIM_STATE_FP8 ? 2 * ceil_div(n, ADAMW_CHUNK) : 0; }

/* The moments of some elements: m and v in format `format`; scale_inv (fp8 only) holds 2 values per chunk,
   chunk k's m scale_inv at 2 k and v's at 2 k + 1. */
typedef struct {
    OptimState format;
    void* m;
    void* v;
    float* scale_inv;
} AdamwMoments;

/* The moments from element `offset` on (a multiple of ADAMW_CHUNK when the format is fp8). */
static inline AdamwMoments adamw_moments_at(AdamwMoments s, size_t offset) {
    s.m = (char*)s.m + offset * adamw_moment_bytes(s.format, 0);
    s.v = (char*)s.v + offset * adamw_moment_bytes(s.format, 1);
    if (s.scale_inv != NULL) s.scale_inv += adamw_scale_count(s.format, offset);
    return s;
}

/* IEEE binary16 bits of x, rounded to nearest even; overflow to +-Inf, NaN to a quiet NaN. */
LLM8_HD static inline uint16_t half_bits_from_float(float x) {
    uint32_t u = float_bits(x), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 rounds past 65504 */
    if (a >= 0x38800000u) {                                    /* normal: >= 2^-14 */
        uint32_t r = a - 0x38000000u;                          /* exponent bias 127 -> 15 */
        r += 0xfffu + ((r >> 13) & 1u);
        return (uint16_t)(sign | (r >> 13));
    }
    uint32_t e = a >> 23;
    if (e < 102) return (uint16_t)sign; /* below 2^-25: rounds to 0 */
    /* subnormal: |x| / 2^-24 = mant * 2^(e - 126), rounded to nearest even */
    uint32_t mant = (a & 0x7fffffu) | 0x800000u, shift = 126u - e;
    uint32_t q = mant >> shift, rem = mant & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u))) q++;
    return (uint16_t)(sign | q);
}

/* Moment element i of s as FP32; sinv: its chunk's scale_inv (fp8; ignored otherwise). */
LLM8_HD static inline float adamw_moment_load(const AdamwMoments* s, int which, size_t i, float sinv) {
    const void* p = which == 0 ? s->m : s->v;
    if (s->format == OPTIM_STATE_FP32) return ((const float*)p)[i];
    if (s->format == OPTIM_STATE_BF16) return bits_float((uint32_t)((const uint16_t*)p)[i] << 16);
    if (which == 0) return fp8_to_float(((const uint8_t*)p)[i], FP8_E4M3) * sinv;
    return half_bits_to_float(((const uint16_t*)p)[i]) * sinv;
}

/* Stores x as moment element i of s; scale: its chunk's (fp8; ignored otherwise). */
LLM8_HD static inline void adamw_moment_store(const AdamwMoments* s, int which, size_t i, float x, float scale) {
    void* p = which == 0 ? s->m : s->v;
    if (s->format == OPTIM_STATE_FP32) ((float*)p)[i] = x;
    else if (s->format == OPTIM_STATE_BF16) ((uint16_t*)p)[i] = (uint16_t)(float_bits(bf16_round(x)) >> 16);
    else if (which == 0) ((uint8_t*)p)[i] = fp8_from_float(x * scale, FP8_E4M3);
    else ((uint16_t*)p)[i] = half_bits_from_float(x * scale);
}

/* The fp8 format's scale of moment `which` for a chunk whose new values have amax `amax` (see OptimState). */
LLM8_HD static inline float adamw_moment_scale(int which, float amax) {
    if (!(amax > 0.0f) || !fp8_amax_is_finite(amax)) return 1.0f;
    return fp8_scale_for(which == 0 ? E4M3_MAX : FP16_MAX, amax, 1);
}

/* ---------------------------------------------------------------- stored FP32 arrays (--grad-buffer, --master-weights) */

/*
 * How an FP32 array is kept between its updates (the gradient buffer, the master weights), chunk by
 * chunk of ZERO_CHUNK elements, the granule of the shard pieces, so a chunk's scale travels with it:
 *   STORE_FP32  as is.
 *   STORE_BF16  rounded to BF16, nearest even; no scale: BF16 has FP32's range.
 *   STORE_E4M3  E4M3 codes of x * scale, scale = 2^floor(log2(448 / amax)) from the chunk's amax:
 *               --grad-reduce fp8's wire format (comm/grad_fp8.h grad_fp8_scale).
 *   STORE_FP16  FP16 of x * scale, scale = 2^floor(log2(65504 / amax)) (as the fp8 AdamW v's).
 * A scaled chunk keeps scale_inv = 1 / scale (exact: a power of two), NaN when the chunk holds a NaN or an
 * Inf, so that every element of it decodes to NaN; amax 0 gives scale 1. Error per store: half an ulp of
 * the format, 2^-8 |x| in BF16 (7 mantissa bits), 2^-4 |x| + 2^-10 / scale in E4M3 (comm/grad_fp8.h),
 * 2^-11 |x| + 2^-25 / scale in FP16.
 */
typedef enum { STORE_FP32, STORE_BF16, STORE_E4M3, STORE_FP16 } StoreCodec;

/* Bytes per element of codec c. */
LLM8_HD static inline size_t store_bytes(StoreCodec c) { return c == STORE_FP32 ? 4 : c == STORE_E4M3 ? 1 : 2; }

/* Does codec c keep a scale_inv per chunk? */
LLM8_HD static inline int store_is_scaled(StoreCodec c) { return c == STORE_E4M3 || c == STORE_FP16; }

/* scale_inv values (FP32) that n elements in codec c need: one per ZERO_CHUNK chunk when scaled, else 0. */
static inline size_t store_scale_count(StoreCodec c, size_t n) { return store_is_scaled(c) ? zero_chunks(n) : 0; }

/* The scale of a chunk whose values have amax `amax` (amax_combine: NaN when one is NaN); 1 unscaled. */
LLM8_HD static inline float store_scale(StoreCodec c, float amax) {
    if (c == STORE_E4M3) return grad_fp8_scale(amax);
    if (c == STORE_FP16) return !(amax > 0.0f) || !fp8_amax_is_finite(amax) ? 1.0f : fp8_scale_for(FP16_MAX, amax, 1);
    return 1.0f;
}

/* Element i of an array p in codec c as FP32; sinv: its chunk's scale_inv (ignored unscaled). */
LLM8_HD static inline float store_load(StoreCodec c, const void* p, size_t i, float sinv) {
    if (c == STORE_FP32) return ((const float*)p)[i];
    if (c == STORE_BF16) return bits_float((uint32_t)((const uint16_t*)p)[i] << 16);
    if (c == STORE_E4M3) return fp8_to_float(((const uint8_t*)p)[i], FP8_E4M3) * sinv;
    return half_bits_to_float(((const uint16_t*)p)[i]) * sinv;
}

/* Stores x as element i of p; scale: its chunk's (store_scale; ignored unscaled). */
LLM8_HD static inline void store_put(StoreCodec c, void* p, size_t i, float x, float scale) {
    if (c == STORE_FP32) ((float*)p)[i] = x;
    else if (c == STORE_BF16) ((uint16_t*)p)[i] = (uint16_t)(float_bits(bf16_round(x)) >> 16);
    else if (c == STORE_E4M3) ((uint8_t*)p)[i] = fp8_quantize(x, scale, FP8_E4M3);
    else ((uint16_t*)p)[i] = half_bits_from_float(x * scale);
}

/*
 * The gradient buffer (--grad-buffer): how the gradients that a step's micro-steps accumulate are stored
 * between them (ZeRO-0 on one rank, ZeRO-1: the full, unsharded buffer; MS-AMP O1 keeps weight
 * gradients in FP8 with a scale): fp32 (4 bytes per parameter; the backward accumulates into it
 * directly: the default), bf16 (2 bytes) or fp8 (STORE_E4M3: 1 byte plus a 4-byte scale_inv per chunk).
 * With bf16 or fp8, each micro-step's backward writes FP32 into a bucket buffer (those of ZeRO-2), and
 * after each bucket the sum stored + new is formed in FP32 and stored again (op_store_add): one rounding
 * per micro-step. ZeRO-1's last micro-step instead adds the stored sum into the FP32 bucket
 * (op_store_load), and reduces from there, so the last micro-step's gradients are never rounded. Over A
 * micro-steps the error is at most that of the A - 1 (ZeRO-0: A) stored partial sums, a random walk
 * in practice.
 */
typedef enum { GRAD_FORMAT_FP32 = 0, GRAD_FORMAT_BF16 = 1, GRAD_FORMAT_FP8 = 2 } GradFormat;
static const char* const GRAD_FORMAT_NAMES[] = {"fp32", "bf16", "fp8"};

/* --grad-buffer's spelling of GradFormat f ("?" for none). */
static inline const char* grad_format_name(int f) { return f >= 0 && f <= GRAD_FORMAT_FP8 ? GRAD_FORMAT_NAMES[f] : "?"; }
/* The codec of a gradient buffer in format f. */
static inline StoreCodec grad_codec(GradFormat f) { return f == GRAD_FORMAT_FP32 ? STORE_FP32 : f == GRAD_FORMAT_BF16 ? STORE_BF16 : STORE_E4M3; }

/*
 * The master weights (--master-weights): fp32 (4 bytes per parameter of the shard, the default) or fp16
 * (STORE_FP16: 2 bytes plus a 4-byte scale_inv per chunk; MS-AMP O3's FP16 master weights with a
 * scaling factor). An fp16 master is decoded into an FP32 scratch segment by segment wherever it is read
 * (AdamW, the working and FP8 weights, checkpoints), and AdamW's FP32 result is stored again with the
 * chunk's new scale: the weights a step uses are always those the stored codes decode to, so a resume
 * from the stored codes is bit-exact. An update below half an FP16 ulp of its weight (2^-12 relative) is
 * lost.
 */
typedef enum { MASTER_FP32 = 0, MASTER_FP16 = 1 } MasterFormat;
static const char* const MASTER_FORMAT_NAMES[] = {"fp32", "fp16"};

/* --master-weights's spelling of MasterFormat f ("?" for none). */
static inline const char* master_format_name(int f) { return f >= 0 && f <= MASTER_FP16 ? MASTER_FORMAT_NAMES[f] : "?"; }
/* The codec of master weights in format f. */
static inline StoreCodec master_codec(MasterFormat f) { return f == MASTER_FP16 ? STORE_FP16 : STORE_FP32; }

/* How a run stores its training state: the AdamW moments (--optim-state), the gradient buffer
   (--grad-buffer) and the master weights (--master-weights). */
typedef struct {
    OptimState optim_state;
    GradFormat grad_buffer;
    MasterFormat master_weights;
} StateFormats;
static const StateFormats STATE_FORMATS_FP32 = {OPTIM_STATE_FP32, GRAD_FORMAT_FP32, MASTER_FP32};
