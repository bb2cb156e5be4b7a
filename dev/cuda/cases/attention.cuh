/*
 * Families attention and attention_fallback (cuda/attention.cuh, cuDNN SDPA): forward and backward,
 * causal, with grouped-query heads.
 */
#pragma once

#include "common.cuh"

/* CPU work allowed for one attention comparison (cpu_reference.h). */
#ifndef KC_ATT_CPU_WORK
#define KC_ATT_CPU_WORK CPU_REF_ATT_WORK
#endif
/* T of the extra GQA check when the shape itself has NKV == NH. */
#define KC_ATT_GQA_T 512

/* Copies `width` columns of `rows` rows: dst[r][dst_col + j] = src[r][src_col + j] (row strides in elements). */
static inline void kc_copy_cols(float* dst, size_t dst_stride, size_t dst_col, const float* src, size_t src_stride,
                                size_t src_col, size_t width, size_t rows) {
#pragma omp parallel for schedule(static)
    for (size_t r = 0; r < rows; r++) memcpy(dst + r * dst_stride + dst_col, src + r * src_stride + src_col, width * sizeof(float));
}

/*
 * One attention comparison. The GPU runs the full (B, T, NH, NKV, HS) problem; the CPU reference (O(T^2)
 * per head, with a (B, NH, T, T) probability matrix) runs on the subset of it that fits KC_ATT_CPU_WORK:
 * batch 0 only when all batches do not fit, and the first NKVc kv heads with all their query heads.
 * Causal attention of a head reads only its own q and its kv head, and a kv head's gradient only its
 * group's query heads, so that subset is exactly the sliced problem. Every GPU output is also checked to
 * be finite over the full size.
 *
 * Tolerances: cuDNN's flash attention rounds P to BF16 before P V, rounds dS to BF16 before dS K and
 * dS^T Q, takes D = rowsum(dO * O) from the BF16 output, and sums in tile order; the CPU keeps all of these
 * in FP32. Each gives ~2^-9 relative error per element (rel L2 ~2e-3 expected for random inputs), so
 * rel L2 1e-2 for out and 2e-2 for dq, dk, dv (the backward compounds two roundings), max abs 2e-2 /
 * 3e-2 x max|cpu|. A layout or masking bug gives errors of order 1.
 */
/* The ops a comparison runs: the build's (op_attention_*), or on the emulated GPU with cuDNN also the
   fallback kernels, which that build keeps (cuda/attention.cuh). */
typedef void (*KcAttForward)(act_t*, float*, const act_t*, int, int, int, int, int);
typedef void (*KcAttBackward)(act_t*, const act_t*, const act_t*, const act_t*, const float*, int, int, int, int, int);
#if defined(USE_CUDNN) && defined(ATTENTION_FALLBACK)
static inline void kc_attention_backward_fallback(act_t* dqkv, const act_t* dout, const act_t* qkv, const act_t*, const float* stats,
                                                  int B, int T, int NH, int NKV, int HS) {
    attention_backward_fallback(dqkv, dout, qkv, stats, B, T, NH, NKV, HS);
}
#endif

static int kc_attention_compare(const char* label, int B, int T, int NH, int NKV, int HS, int iters, uint64_t seed,
                                KcAttForward forward = op_attention_forward, KcAttBackward backward = op_attention_backward) {
    uint64_t stream = seed;
    int failed = 0;
    size_t C = (size_t)NH * HS, KVC = (size_t)NKV * HS, QKV = C + 2 * KVC, BT = (size_t)B * T;
    int group = NH / NKV;
    double head_work = (double)T * T * HS;
    int Bc = (double)B * NH * head_work > KC_ATT_CPU_WORK ? 1 : B;
    double fit = floor(KC_ATT_CPU_WORK / ((double)Bc * group * head_work));
    int NKVc = fit < 1.0 ? 1 : fit > NKV ? NKV : (int)fit;
    int NHc = NKVc * group;
    size_t Cc = (size_t)NHc * HS, KVCc = (size_t)NKVc * HS, QKVc = Cc + 2 * KVCc, BTc = (size_t)Bc * T;
    printf("    %s: B %d T %d NH %d NKV %d HS %d; CPU reference on %s%d of %d batches, kv heads 0..%d of %d\n", label, B, T,
           NH, NKV, HS, Bc < B ? "the first " : "", Bc, B, NKVc - 1, NKV);

    KcSet set = {};
    KcBuf* qkv = kc_input(&set, BT * QKV, splitmix64(&stream), 0.0f, 1.0f, KC_BF16);
    KcBuf* dout = kc_input(&set, BT * C, splitmix64(&stream), 0.0f, 1.0f, KC_BF16);
    act_t* d_out = (act_t*)dev_alloc(BT * C * sizeof(act_t));
    float* d_stats = (float*)dev_alloc(att_stats_size((size_t)B, NH, T) * sizeof(float));
    act_t* d_dqkv = (act_t*)dev_alloc(BT * QKV * sizeof(act_t));
    kc_poison(d_out, BT * C * sizeof(act_t));
    kc_poison(d_stats, att_stats_size((size_t)B, NH, T) * sizeof(float));
    kc_poison(d_dqkv, BT * QKV * sizeof(act_t));
    forward(d_out, d_stats, qkv->a, B, T, NH, NKV, HS);
    backward(d_dqkv, dout->a, qkv->a, d_out, d_stats, B, T, NH, NKV, HS);
    float* got_out = kc_get_act(d_out, BT * C);
    float* got_dqkv = kc_get_act(d_dqkv, BT * QKV);
    size_t nonfinite = kc_count_nonfinite(got_out, BT * C) + kc_count_nonfinite(got_dqkv, BT * QKV);
    printf("    attention out, dqkv (full size): %zu non-finite of %zu, tol 0%s\n", nonfinite, BT * (C + QKV),
           nonfinite ? "  FAIL" : "");
    failed += nonfinite != 0;

    /* the CPU subset: batches < Bc, query heads < NHc and kv heads < NKVc, in qkv's layout with QKVc columns */
    float* qkv_c = kc_host(BTc * QKVc);
    kc_copy_cols(qkv_c, QKVc, 0, qkv->h, QKV, 0, Cc, BTc);                   /* q */
    kc_copy_cols(qkv_c, QKVc, Cc, qkv->h, QKV, C, KVCc, BTc);                /* k */
    kc_copy_cols(qkv_c, QKVc, Cc + KVCc, qkv->h, QKV, C + KVC, KVCc, BTc);   /* v */
    float* dout_c = kc_host(BTc * Cc);
    kc_copy_cols(dout_c, Cc, 0, dout->h, C, 0, Cc, BTc);
    float* out_c = kc_host(BTc * Cc);
    float* probs = kc_host(cpu_ref_att_stats_size((size_t)Bc, NHc, T));
    float* dqkv_c = kc_host(BTc * QKVc);
    kc_nan_fill(out_c, BTc * Cc);
    kc_nan_fill(dqkv_c, BTc * QKVc);
    cpu_ref_attention_forward(out_c, probs, qkv_c, Bc, T, NHc, NKVc, HS);
    cpu_ref_attention_backward(dqkv_c, dout_c, qkv_c, out_c, probs, Bc, T, NHc, NKVc, HS);

    float* got = kc_host(BTc * Cc);
    float* ref = kc_host(BTc * Cc);
    kc_copy_cols(got, Cc, 0, got_out, C, 0, Cc, BTc);
    failed += kc_compare_norm("attention_forward out", got, out_c, BTc * Cc, 1e-2, 2e-2);
    kc_copy_cols(got, Cc, 0, got_dqkv, QKV, 0, Cc, BTc);
    kc_copy_cols(ref, Cc, 0, dqkv_c, QKVc, 0, Cc, BTc);
    failed += kc_compare_norm("attention_backward dq", got, ref, BTc * Cc, 2e-2, 3e-2);
    kc_copy_cols(got, KVCc, 0, got_dqkv, QKV, C, KVCc, BTc);
    kc_copy_cols(ref, KVCc, 0, dqkv_c, QKVc, Cc, KVCc, BTc);
    failed += kc_compare_norm("attention_backward dk", got, ref, BTc * KVCc, 2e-2, 3e-2);
    kc_copy_cols(got, KVCc, 0, got_dqkv, QKV, C + KVC, KVCc, BTc);
    kc_copy_cols(ref, KVCc, 0, dqkv_c, QKVc, Cc + KVCc, KVCc, BTc);
    failed += kc_compare_norm("attention_backward dv", got, ref, BTc * KVCc, 2e-2, 3e-2);

    /* causal: half of the T x T scores; forward 2 GEMMs (QK^T, PV), backward 5 (S, dP, dV, dQ, dK) */
    double fwd_flops = 2.0 * B * NH * (double)T * T * HS;
    kc_time("attention_forward", iters, 0.0, fwd_flops, [&] { forward(d_out, d_stats, qkv->a, B, T, NH, NKV, HS); });
    kc_time("attention_backward", iters, 0.0, 2.5 * fwd_flops, [&] { backward(d_dqkv, dout->a, qkv->a, d_out, d_stats, B, T, NH, NKV, HS); });

    free(got);
    free(ref);
    free(qkv_c);
    free(dout_c);
    free(out_c);
    free(probs);
    free(dqkv_c);
    free(got_out);
    free(got_dqkv);
    kc_set_free(&set);
    dev_free(d_out);
    dev_free(d_stats);
    dev_free(d_dqkv);
    return failed;
}

/*
 * The shape's attention (timed), plus, when the shape has no grouped-query heads (Llama-2 7B/13B), an
 * untimed GQA check at B 1, T <= KC_ATT_GQA_T with NH/4 (or NH/2) kv heads, so that the group mapping is
 * always covered.
 */
static int kc_case_attention(const KernelShape* s, int iters, uint64_t seed) {
    uint64_t stream = seed;
    int HS = s->C / s->NH;
    int failed = kc_attention_compare("shape", s->B, s->T, s->NH, s->NKV, HS, iters, splitmix64(&stream));
    if (s->NKV == s->NH && s->NH > 1) {
        int nkv = s->NH % 4 == 0 ? s->NH / 4 : s->NH % 2 == 0 ? s->NH / 2 : 1;
        int T = s->T < KC_ATT_GQA_T ? s->T : KC_ATT_GQA_T;
        failed += kc_attention_compare("GQA", 1, T, s->NH, nkv, HS, 0, splitmix64(&stream));
    }
    return failed;
}

#if defined(USE_CUDNN) && defined(ATTENTION_FALLBACK)
/* The fallback kernels at the shape, in the emulated build that runs cuDNN's attention (the double). */
static int kc_case_attention_fallback(const KernelShape* s, int iters, uint64_t seed) {
    return kc_attention_compare("fallback kernels", s->B, s->T, s->NH, s->NKV, s->C / s->NH, iters, seed,
                                attention_forward_fallback, kc_attention_backward_fallback);
}
#endif
