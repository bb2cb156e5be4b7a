/*
 * FP8 health alerts (--alert-saturated, --alert-underflow, --alert-amax-growth; docs/safety-net.md):
 * on the statistics steps of --fp8-stats N, each FP8 operand's saturated share and underflow
 * share, and the amax growth of each forward operand (W, X) since the previous statistics step, are
 * compared with thresholds, and every crossing is an alert naming the layer, the GEMM and the operand. Only statistics steps: the casts count saturated
 * and underflowing elements only when statistics are due, because counting costs them a second pass.
 *
 * What they catch: under current scaling the amax element always lands on +-max, so a saturated share
 * well above one element means many equal extreme values; the late-run failure is an outlier growing in
 * an operand, above all the SwiGLU output that feeds w2 (Fishman et al. 2024, "Scaling FP8 training to
 * trillion-token LLMs", arXiv 2409.12517): the scale follows the outlier, the rest of the tensor loses
 * resolution and its small values flush to zero, which the amax growth and the underflow share show.
 * The output gradients dY have no growth alert: their amax follows the loss and the learning rate, not
 * outliers (on tiny-shakespeare it moves 300x between statistics steps 5 apart at the end of warmup,
 * where no forward operand moves 2x). The growth baseline is the previous statistics step of this process: the first statistics step of a
 * run, or of a resumed run, raises no growth alert.
 * Included after model/model.h.
 */
#pragma once

#include "../model/model.h"

/* The thresholds; 0 turns a kind off. */
typedef struct {
    float saturated;   /* share of codes at +-max */
    float underflow;   /* share of non-zero inputs cast to zero */
    float amax_growth; /* amax / amax of the previous statistics step (> 1), W and X only */
} Fp8AlertThresholds;

enum { ALERT_SATURATED, ALERT_UNDERFLOW, ALERT_AMAX_GROWTH, ALERT_KINDS };
static const char* const ALERT_NAMES[ALERT_KINDS] = {"saturated", "underflow", "amax_growth"};

typedef struct {
    int kind;         /* ALERT_* */
    double value;     /* the share, or the growth factor */
    double threshold; /* the one it crossed */
} Fp8Alert;

typedef struct {
    Fp8AlertThresholds th;
    float* last_amax; /* (L * LIN_PER_LAYER * FP8_OPS) each operand's amax at its previous statistics step; 0: none */
} Fp8Alerts;

static inline void fp8_alerts_init(Fp8Alerts* a, Fp8AlertThresholds th, int n_layers) {
    a->th = th;
    a->last_amax = (float*)callocCheck((size_t)n_layers * LIN_PER_LAYER * FP8_OPS, sizeof(float));
}

/* Forgets every operand's previous amax (after a stretch of BF16 steps: the next statistics step starts
   the growth baseline again, as after a resume). */
static inline void fp8_alerts_restart(Fp8Alerts* a, int n_layers) {
    memset(a->last_amax, 0, (size_t)n_layers * LIN_PER_LAYER * FP8_OPS * sizeof(float));
}

static inline void fp8_alerts_free(Fp8Alerts* a) {
    free(a->last_amax);
    memset(a, 0, sizeof(*a));
}

/*
 * Compares one operand's statistics with the thresholds and records its amax as the next baseline.
 * Writes the alerts it raises to out (at most ALERT_KINDS) and returns their number.
 */
static inline int fp8_alerts_check(Fp8Alerts* a, const Fp8OperandStats* o, Fp8Alert* out) {
    int n = 0;
    if (a->th.saturated > 0.0f && o->saturated_frac > a->th.saturated)
        out[n++] = (Fp8Alert){ALERT_SATURATED, o->saturated_frac, a->th.saturated};
    if (a->th.underflow > 0.0f && o->underflow_frac > a->th.underflow)
        out[n++] = (Fp8Alert){ALERT_UNDERFLOW, o->underflow_frac, a->th.underflow};
    float* last = &a->last_amax[llama_slot(o->layer, o->lin) * FP8_OPS + (size_t)o->op];
    if (o->op == FP8_OP_DY || !fp8_amax_is_finite(o->amax)) return n; /* a non-finite step is skipped: keep the baseline */
    double growth = *last > 0.0f ? (double)o->amax / (double)*last : 0.0;
    if (a->th.amax_growth > 0.0f && growth > a->th.amax_growth) out[n++] = (Fp8Alert){ALERT_AMAX_GROWTH, growth, a->th.amax_growth};
    *last = o->amax;
    return n;
}
