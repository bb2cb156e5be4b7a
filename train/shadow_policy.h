/*
 * The shadow check's policy (--shadow-every, --shadow-policy, docs/safety-net.md): when a check is
 * due, and what its result does to the run. A check compares the FP8 loss of a step's first micro-batch
 * with its BF16 loss at the same weights (train/shadow.h); `warn` only reports, `fallback` switches the
 * run's block linears to BF16 once --shadow-patience checks in a row are over --shadow-tol, and back to
 * FP8 after --shadow-recover BF16 steps (0: never). No check runs while the run is in BF16: it is the
 * baseline then. Under current scaling a switch carries no state: every FP8 cast takes its scale from the
 * tensor it casts, so the first FP8 step after a BF16 stretch scales as if there had been none (delayed
 * scaling would need its amax history kept up to date through the BF16 steps).
 *
 * The state is part of the training state (train/checkpoint.h), so a resumed run takes the decisions
 * the uninterrupted one takes. Every rank feeds the same reduced values in, so every rank decides the
 * same. Plain C, no model: the transitions are tested on their own (test_llama.c), and the logger
 * writes the result.
 */
#pragma once

#include <stdint.h>

/* --shadow-policy: report only, or fall back to BF16. */
typedef enum { SHADOW_WARN = 0, SHADOW_FALLBACK = 1 } ShadowPolicyKind;
static const char* const SHADOW_POLICY_NAMES[] = {"warn", "fallback"};

/* The settings (from the command line). */
typedef struct {
    int every;    /* a check every `every` steps (step % every == 0); 0: none */
    int fallback; /* 1: --shadow-policy fallback; 0: warn */
    float tol;    /* largest relative loss difference |fp8 - bf16| / |bf16| of a clean check */
    int patience; /* checks over tol in a row that make a fallback */
    int recover;  /* BF16 steps after which the run returns to FP8; 0: never */
} ShadowPolicy;

/* The state a resume must continue (checkpointed as is: four int32). */
typedef struct {
    int32_t bf16;       /* 1: the run's block linears are in BF16 (a fallback is in force) */
    int32_t over;       /* checks over tol in a row */
    int32_t bf16_steps; /* steps run in BF16 since the fallback */
    int32_t fallbacks;  /* fallbacks so far */
} ShadowState;

/* A check's result, the same on every rank but ms. Gradient fields only with --shadow-grad 1. */
typedef struct {
    double loss_fp8, loss_bf16; /* means over the ranks of the first micro-batch's losses */
    double rel;                 /* |loss_fp8 - loss_bf16| / |loss_bf16| */
    int has_grad;
    double cosine, norm_rel;    /* whole model: cos(g8, g16) and | |g8| - |g16| | / |g16| */
    int worst_layer;            /* the block of lowest gradient cosine */
    double worst_cosine, worst_norm_rel;
    double ms;                  /* this rank's time for the shadow passes */
} ShadowResult;

/* Is a check due at step `step` (0-based)? */
static inline int shadow_check_due(const ShadowPolicy* p, const ShadowState* s, int step) {
    return p->every > 0 && !s->bf16 && step % p->every == 0;
}

/*
 * Takes a check's relative loss difference (a NaN counts as over the tolerance). Returns 1 when the run
 * falls back: from the next step on, its block linears run BF16.
 */
static inline int shadow_after_check(const ShadowPolicy* p, ShadowState* s, double rel) {
    s->over = rel <= (double)p->tol ? 0 : s->over + 1;
    if (!p->fallback || s->over < p->patience) return 0;
    s->bf16 = 1;
    s->over = 0;
    s->bf16_steps = 0;
    s->fallbacks++;
    return 1;
}

/* Counts a step run in BF16 by a fallback. Returns 1 when the run returns to FP8 from the next step on. */
static inline int shadow_after_bf16_step(const ShadowPolicy* p, ShadowState* s) {
    s->bf16_steps++;
    if (p->recover == 0 || s->bf16_steps < p->recover) return 0;
    s->bf16 = 0;
    s->bf16_steps = 0;
    return 1;
}
