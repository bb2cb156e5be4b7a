/*
 * Family classifier (cuda/classifier.cuh): op_classifier, the losses and dlogits.
 */
#pragma once

#include "common.cuh"

/*
 * Tolerances. losses: the GPU's online softmax sums exp in FP32 (per thread, then a block tree), the CPU
 * in double: log-sum-exp differs by ~1e-6 absolute on losses of ~10: rel L2 1e-5, max abs 1e-5 x max|cpu|.
 * dlogits = (softmax - onehot) * dloss: that lse difference moves p by ~1e-6 relative, so a BF16
 * rounding boundary may fall between them: 2 BF16 ulps (+ dloss * 1e-9, tiny against p ~ 1/V).
 */
static int kc_case_classifier(const KernelShape* s, int iters, uint64_t seed) {
    uint64_t stream = seed;
    int failed = 0;
    size_t N = (size_t)s->B * s->T, V = (size_t)s->V;
    float dloss = 1.0f / (float)N; /* the mean over the batch, as in training */
    Rng rng;
    rng_seed(&rng, splitmix64(&stream));
    int* targets = (int*)mallocCheck(N * sizeof(int));
    for (size_t i = 0; i < N; i++) targets[i] = (int)rng_below(&rng, V);
    targets[0] = (int)V - 1;
    int* d_targets = (int*)kc_dev_bytes(targets, N * sizeof(int));
    KcSet set = {};
    KcBuf* logits = kc_input(&set, N * V, splitmix64(&stream), 0.0f, 3.0f, KC_BF16); /* in place: overwritten with dlogits */
    KcBuf* losses = kc_output(&set, N, KC_F32);
    cpu_ref_classifier(logits->h, losses->h, targets, N, (int)V, dloss);
    op_classifier(logits->a, losses->f, d_targets, N, (int)V, dloss);
    failed += kc_check_norm("classifier losses", losses, 1e-5, 1e-5);
    failed += kc_check_ulps("classifier dlogits", logits, KC_BF16_MANT, 2.0, 1e-9 * dloss);
    kc_time("classifier", iters, 4.0 * N * V, 0.0, [&] { op_classifier(logits->a, losses->f, d_targets, N, (int)V, dloss); });
    kc_set_free(&set);
    free(targets);
    dev_free(d_targets);
    return failed;
}
