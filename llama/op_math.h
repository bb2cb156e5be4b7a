/*
 * The per-element math of the model's ops, written once for both backends (cpu/backend.h loops over
 * it, the kernels of cuda/ run it per thread), so the two builds evaluate the same formulas and differ only
 * in how they sum and where they round. Host + device; inputs and results in FP32.
 */
#pragma once

#include <math.h>

#include "../core/common.h"

/* RoPE, HF rotate-half: (x1, x2) = (x_i, x_{i+HS/2}) rotated by the angle whose cos/sin are c, s. The
   backward pass applies the transpose rotation, i.e. the same with -s. */
LLM8_HD static inline void rope_rotate(float x1, float x2, float c, float s, float* out1, float* out2) {
    *out1 = x1 * c - x2 * s;
    *out2 = x2 * c + x1 * s;
}

/* SwiGLU (Shazeer 2020): silu(a) * b. */
LLM8_HD static inline float swiglu(float a, float b) { return a / (1.0f + expf(-a)) * b; }

/* SwiGLU backward for output gradient g: da = g b silu'(a), db = g silu(a); silu'(a) = s (1 + a (1 - s)),
   s = sigmoid(a). */
LLM8_HD static inline void swiglu_backward(float a, float b, float g, float* da, float* db) {
    float s = 1.0f / (1.0f + expf(-a));
    *da = g * b * s * (1.0f + a * (1.0f - s));
    *db = g * a * s;
}

/* RMSNorm input gradient of one element: rstd * (dy * w - xh * mean), xh = x * rstd, mean = mean(dy w xh). */
LLM8_HD static inline float rmsnorm_dx(float dy, float w, float xh, float rstd, float mean) {
    return rstd * (dy * w - xh * mean);
}
