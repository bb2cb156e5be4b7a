/*
 * Optimizer pieces shared by both builds: the learning-rate schedule, the global-norm clipping factor
 * and the AdamW element update (the GPU's AdamW kernel calls the same function per element).
 */
#pragma once

#include <math.h>
#include <string.h>

#include "../core/common.h"

#define ADAMW_BETA1 0.9f
#define ADAMW_BETA2 0.95f
#define ADAMW_EPS 1e-8f
/* torch.nn.utils.clip_grad_norm_ divides by (norm + 1e-6); we do the same to match the HF reference. */
#define CLIP_NORM_EPS 1e-6f

/*
 * Learning rate at optimizer step `step` (0-based) of `total` steps: linear warmup from lr/warmup to lr
 * over `warmup` steps (llm.c), then cosine or linear decay to lr * final_frac at the last step, or
 * constant. schedule: "cosine" | "linear" | "constant".
 */
static inline float lr_at_step(const char* schedule, float lr, int warmup, float final_frac, int step, int total) {
    if (step < warmup) return lr * (float)(step + 1) / (float)warmup;
    if (strcmp(schedule, "constant") == 0) return lr;
    int decay_steps = total - warmup;
    if (decay_steps <= 1) return lr;
    float progress = (float)(step - warmup) / (float)(decay_steps - 1);
    if (progress > 1.0f) progress = 1.0f;
    float frac;
    if (strcmp(schedule, "linear") == 0) {
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
