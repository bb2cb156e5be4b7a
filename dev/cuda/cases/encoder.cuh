/*
 * Family encoder (cuda/encoder.cuh): op_encoder_forward, op_encoder_backward.
 */
#pragma once

#include "common.cuh"

/* Distinct tokens that about half of the positions draw from, so that backward sums repeated rows. */
#define KC_TOKEN_POOL 64

/*
 * Tolerances: forward is a copy (bit-identical). Backward sums each token's rows in position order,
 * starting from dwte's value, on both sides (the GPU buckets by token on the host): bit-identical too.
 */
static int kc_case_encoder(const KernelShape* s, int iters, uint64_t seed) {
    uint64_t stream = seed;
    int failed = 0;
    size_t N = (size_t)s->B * s->T, C = (size_t)s->C, V = (size_t)s->V;
    Rng rng;
    rng_seed(&rng, splitmix64(&stream));
    int pool[KC_TOKEN_POOL];
    for (int i = 0; i < KC_TOKEN_POOL; i++) pool[i] = (int)rng_below(&rng, V);
    int* tokens = (int*)mallocCheck(N * sizeof(int));
    for (size_t i = 0; i < N; i++)
        tokens[i] = rng_uniform(&rng) < 0.5f ? pool[rng_below(&rng, KC_TOKEN_POOL)] : (int)rng_below(&rng, V);
    tokens[0] = (int)V - 1; /* the last row of wte */
    size_t distinct = 0;
    {
        char* seen = (char*)callocCheck(V, 1);
        for (size_t i = 0; i < N; i++) {
            distinct += !seen[tokens[i]];
            seen[tokens[i]] = 1;
        }
        free(seen);
    }
    int* d_tokens = (int*)kc_dev_bytes(tokens, N * sizeof(int));

    KcSet set = {};
    KcBuf* wte = kc_input(&set, V * C, splitmix64(&stream), 0.0f, 1.0f, KC_BF16);
    KcBuf* out = kc_output(&set, N * C, KC_BF16);
    cpu_ref_encoder_forward(out->h, tokens, wte->h, N, (int)C);
    op_encoder_forward(out->a, d_tokens, wte->a, N, (int)C);
    failed += kc_check_ulps("encoder_forward", out, KC_BF16_MANT, 0.0, 0.0);
    kc_time("encoder_forward", iters, 4.0 * N * C, 0.0, [&] { op_encoder_forward(out->a, d_tokens, wte->a, N, (int)C); });
    kc_set_free(&set);

    KcBuf* dwte = kc_input(&set, V * C, splitmix64(&stream), 0.0f, 1e-2f, KC_F32); /* accumulates into earlier gradients */
    KcBuf* dout = kc_input(&set, N * C, splitmix64(&stream), 0.0f, 1.0f, KC_BF16);
    cpu_ref_encoder_backward(dwte->h, dout->h, tokens, N, (int)C);
    op_encoder_backward(dwte->f, dout->a, d_tokens, tokens, N, (int)C);
    failed += kc_check_ulps("encoder_backward dwte", dwte, KC_F32_MANT, 0.0, 0.0);
    kc_time("encoder_backward", iters, 2.0 * N * C + 8.0 * distinct * C, 0.0,
            [&] { op_encoder_backward(dwte->f, dout->a, d_tokens, tokens, N, (int)C); });
    kc_set_free(&set);
    free(tokens);
    dev_free(d_tokens);
    return failed;
}
