/*
 * Family rope (cuda/rope.cuh): op_rope_forward, op_rope_backward.
 */
#pragma once

#include "common.cuh"

/*
 * Tolerance: x1*c - x2*s is computed in FP32 on both sides, contracted into an FMA on the GPU, then
 * stored BF16: a rounding boundary can fall between them (2 BF16 ulps), and where the two products
 * cancel the FP32 difference is absolute (~1e-7 for O(1) inputs): + 1e-5. The v part must come back
 * untouched.
 */
static int kc_case_rope(const KernelShape* s, int iters, uint64_t seed) {
    uint64_t stream = seed;
    int failed = 0;
    int B = s->B, T = s->T, NH = s->NH, NKV = s->NKV, HS = s->C / s->NH;
    size_t n = (size_t)B * T * (NH + 2 * NKV) * HS, half = (size_t)HS / 2;
    KcSet set = {};
    KcBuf* cos_t = kc_buf(&set, (size_t)T * half, KC_F32);
    KcBuf* sin_t = kc_buf(&set, (size_t)T * half, KC_F32);
    rope_tables(T, HS, LLAMA_ROPE_THETA, cos_t->h, sin_t->h);
    kc_upload(cos_t);
    kc_upload(sin_t);
    double bytes = 4.0 * B * T * (NH + NKV) * HS + 8.0 * T * half;
    for (int dir = 0; dir < 2; dir++) {
        KcBuf* x = kc_input(&set, n, splitmix64(&stream), 0.0f, 1.0f, KC_BF16); /* in place: the input is the output */
        if (dir == 0) {
            cpu_ref_rope_forward(x->h, cos_t->h, sin_t->h, B, T, NH, NKV, HS);
            op_rope_forward(x->a, cos_t->f, sin_t->f, B, T, NH, NKV, HS);
            failed += kc_check_ulps("rope_forward qkv", x, KC_BF16_MANT, 2.0, 1e-5);
            kc_time("rope_forward", iters, bytes, 0.0, [&] { op_rope_forward(x->a, cos_t->f, sin_t->f, B, T, NH, NKV, HS); });
        } else {
            cpu_ref_rope_backward(x->h, cos_t->h, sin_t->h, B, T, NH, NKV, HS);
            op_rope_backward(x->a, cos_t->f, sin_t->f, B, T, NH, NKV, HS);
            failed += kc_check_ulps("rope_backward dqkv", x, KC_BF16_MANT, 2.0, 1e-5);
            kc_time("rope_backward", iters, bytes, 0.0, [&] { op_rope_backward(x->a, cos_t->f, sin_t->f, B, T, NH, NKV, HS); });
        }
    }
    kc_set_free(&set);
    return failed;
}
