/*
 * Attention ops of the CUDA backend. With USE_CUDNN (the default when the cuDNN frontend headers are
 * installed) they call cuDNN's fused SDPA through cuda/cudnn_att.h. Without it, a plain fallback runs
 * here: correct and deterministic but slow (one block per query or key row, O(T^2 HS) work per head, no
 * tensor cores); it is meant for builds without the frontend, not for throughput.
 *
 * Both paths keep between forward and backward stats (B, NH, T) FP32: each query row's softmax
 * log-sum-exp (cuDNN's "Stats"), not the probability matrix, so backward recomputes the probabilities
 * (flash-attention style, Dao et al. 2022). Kernel family "attention".
 */
#pragma once

#include "../core/cuda_utils.cuh"

#ifdef USE_CUDNN
#include "cudnn_att.h"
#endif

static inline void attention_init(void) {
#ifdef USE_CUDNN
    cudnn_att_init();
#endif
}

/* The attention path of this build for the start-up line: cuDNN SDPA with its versions, or the fallback. */
static inline void attention_describe(char* out, size_t len) {
#ifdef USE_CUDNN
    char versions[128];
    cudnn_att_versions(versions, sizeof(versions));
    snprintf(out, len, "cuDNN SDPA (%s)", versions);
#else
    snprintf(out, len, "fallback kernels (built without cuDNN)");
#endif
}

/*
 * Selects the deterministic attention backward (on != 0) or the fastest one, which with cuDNN is not
 * bit-reproducible; returns the previous choice. The fallback kernels are always deterministic.
 */
static inline int attention_set_deterministic(int on) {
#ifdef USE_CUDNN
    return cudnn_att_set_deterministic(on);
#else
    (void)on;
    return 1;
#endif
}

#ifndef USE_CUDNN

/* Threads per row of the fallback kernels. */
#define ATT_THREADS 128

/* Dot product of two HS-long BF16 vectors in FP32. */
__device__ __forceinline__ float dot_bf16(const act_t* a, const act_t* b, int HS) {
    float s = 0.0f;
    for (int d = 0; d < HS; d++) s += bf16_to_f(a[d]) * bf16_to_f(b[d]);
    return s;
}

/* Where query row `row` (= (b * NH + h) * T + t, the stats order) of qkv (B, T, QKV) reads from: its q
   and row 0 of the k and v of its kv head (h / (NH / NKV)); key s is s * QKV further. */
struct QueryRow {
    size_t b, C, QKV;
    int t, h;
    const act_t *q, *k0, *v0;
};

__device__ __forceinline__ QueryRow query_row(const act_t* qkv, size_t row, int T, int NH, int NKV, int HS) {
    QueryRow r;
    r.t = (int)(row % T);
    r.h = (int)((row / T) % NH);
    r.b = row / ((size_t)T * NH);
    size_t KVC = (size_t)NKV * HS;
    r.C = (size_t)NH * HS;
    r.QKV = r.C + 2 * KVC;
    r.q = qkv + (r.b * T + r.t) * r.QKV + (size_t)r.h * HS;
    r.k0 = qkv + r.b * T * r.QKV + r.C + (size_t)(r.h / (NH / NKV)) * HS;
    r.v0 = r.k0 + KVC;
    return r;
}

/*
 * One block per query row (b, h, t), rows ordered as stats: scores of keys 0..t in shared memory, softmax,
 * then out[d] = sum_s p_s v_s[d] with threads over d.
 */
__global__ void attention_forward_fallback_kernel(act_t* out, float* stats, const act_t* qkv, int T, int NH, int NKV,
                                                  int HS, float scale) {
    DYNAMIC_SHARED(float, p); /* (t + 1) scores, then probabilities */
    size_t row = blockIdx.x;
    QueryRow r = query_row(qkv, row, T, NH, NKV, HS);
    int t = r.t;
    size_t b = r.b, C = r.C, QKV = r.QKV;
    const act_t *q = r.q, *kbase = r.k0, *vbase = r.v0;
    int h = r.h;
    float maxv = -INFINITY;
    for (int s = threadIdx.x; s <= t; s += blockDim.x) {
        p[s] = dot_bf16(q, kbase + (size_t)s * QKV, HS) * scale;
        maxv = fmaxf(maxv, p[s]);
    }
    maxv = block_reduce<ATT_THREADS>(maxv, MaxOp());
    float sum = 0.0f;
    for (int s = threadIdx.x; s <= t; s += blockDim.x) {
        p[s] = expf(p[s] - maxv);
        sum += p[s];
    }
    sum = block_reduce<ATT_THREADS>(sum, SumOp());
    for (int s = threadIdx.x; s <= t; s += blockDim.x) p[s] /= sum;
    if (threadIdx.x == 0) stats[row] = maxv + logf(sum);
    __syncthreads();
    act_t* o = out + (b * T + t) * C + (size_t)h * HS;
    for (int d = threadIdx.x; d < HS; d += blockDim.x) {
        float acc = 0.0f;
        for (int s = 0; s <= t; s++) acc += p[s] * bf16_to_f(vbase[(size_t)s * QKV + d]);
        o[d] = f_to_bf16(acc);
    }
}

/*
 * Backward, query side: one block per query row (b, h, t). Recomputes p_s = exp(q k_s * scale - lse),
 * dp_s = dout v_s, D = sum_s p_s dp_s (kept in dsum for the key side), and writes
 * dq = sum_s p_s (dp_s - D) scale k_s.
 */
__global__ void attention_backward_query_kernel(act_t* dqkv, float* dsum, const act_t* dout, const act_t* qkv,
                                                const float* stats, int T, int NH, int NKV, int HS, float scale) {
    DYNAMIC_SHARED(float, smem);
    float* p = smem;      /* (T) */
    float* dp = smem + T; /* (T) */
    size_t row = blockIdx.x;
    QueryRow r = query_row(qkv, row, T, NH, NKV, HS);
    int t = r.t, h = r.h;
    size_t b = r.b, C = r.C, QKV = r.QKV;
    const act_t *q = r.q, *kbase = r.k0, *vbase = r.v0;
    const act_t* go = dout + (b * T + t) * C + (size_t)h * HS;
    float lse = stats[row];
    float local = 0.0f;
    for (int s = threadIdx.x; s <= t; s += blockDim.x) {
        p[s] = expf(dot_bf16(q, kbase + (size_t)s * QKV, HS) * scale - lse);
        dp[s] = dot_bf16(go, vbase + (size_t)s * QKV, HS);
        local += p[s] * dp[s];
    }
    float D = block_reduce<ATT_THREADS>(local, SumOp());
    if (threadIdx.x == 0) dsum[row] = D;
    act_t* dq = dqkv + (b * T + t) * QKV + (size_t)h * HS;
    for (int d = threadIdx.x; d < HS; d += blockDim.x) {
        float acc = 0.0f;
        for (int s = 0; s <= t; s++) acc += p[s] * (dp[s] - D) * scale * bf16_to_f(kbase[(size_t)s * QKV + d]);
        dq[d] = f_to_bf16(acc);
    }
}

/*
 * Backward, key side: one block per key row (b, kvh, s); for each query head of the group and each query
 * t >= s: dk_s += p (dp - D) scale q_t and dv_s += p dout_t, summed in (head, t) order without atomics.
 */
__global__ void attention_backward_key_kernel(act_t* dqkv, const float* dsum, const act_t* dout, const act_t* qkv,
                                              const float* stats, int T, int NH, int NKV, int HS, float scale) {
    DYNAMIC_SHARED(float, smem);
    float* p = smem;              /* (T) probabilities of this key for each query */
    float* ds = smem + T;         /* (T) */
    float* acc_k = smem + 2 * T;  /* (HS) */
    float* acc_v = acc_k + HS;    /* (HS) */
    size_t row = blockIdx.x;
    int s = (int)(row % T), kvh = (int)((row / T) % NKV);
    size_t b = row / ((size_t)T * NKV);
    int group = NH / NKV;
    size_t C = (size_t)NH * HS, KVC = (size_t)NKV * HS, QKV = C + 2 * KVC;
    const act_t* k = qkv + (b * T + s) * QKV + C + (size_t)kvh * HS;
    const act_t* v = k + KVC;
    for (int d = threadIdx.x; d < HS; d += blockDim.x) acc_k[d] = acc_v[d] = 0.0f;
    for (int h = kvh * group; h < (kvh + 1) * group; h++) {
        size_t stat_row = (b * NH + h) * T;
        for (int t = s + threadIdx.x; t < T; t += blockDim.x) {
            const act_t* q = qkv + (b * T + t) * QKV + (size_t)h * HS;
            const act_t* go = dout + (b * T + t) * C + (size_t)h * HS;
            float pt = expf(dot_bf16(q, k, HS) * scale - stats[stat_row + t]);
            p[t] = pt;
            ds[t] = pt * (dot_bf16(go, v, HS) - dsum[stat_row + t]) * scale;
        }
        __syncthreads();
        for (int d = threadIdx.x; d < HS; d += blockDim.x) {
            float ak = acc_k[d], av = acc_v[d];
            for (int t = s; t < T; t++) {
                ak += ds[t] * bf16_to_f(qkv[(b * T + t) * QKV + (size_t)h * HS + d]);
                av += p[t] * bf16_to_f(dout[(b * T + t) * C + (size_t)h * HS + d]);
            }
            acc_k[d] = ak;
            acc_v[d] = av;
        }
        __syncthreads();
    }
    act_t* dk = dqkv + (b * T + s) * QKV + C + (size_t)kvh * HS;
    for (int d = threadIdx.x; d < HS; d += blockDim.x) {
        dk[d] = f_to_bf16(acc_k[d]);
        dk[KVC + d] = f_to_bf16(acc_v[d]);
    }
}

static DeviceScratch g_attention_scratch = {NULL, 0, "attention"};

#endif /* !USE_CUDNN */

/*
 * Causal attention with grouped-query heads: qkv (B, T, QKV) rows [q (NH*HS) | k (NKV*HS) | v (NKV*HS)],
 * query head h reads kv head h / (NH / NKV); out (B, T, NH*HS) = softmax(q k^T / sqrt(HS)) v, BF16;
 * stats (att_stats_size floats: (B, NH, T)) keeps the softmax log-sum-exp for backward.
 */
static inline void op_attention_forward(act_t* out, float* stats, const act_t* qkv, int B, int T, int NH, int NKV, int HS) {
#ifdef USE_CUDNN
    cudnn_att_forward(out, stats, qkv, B, T, NH, NKV, HS);
#else
    size_t rows = (size_t)B * NH * T, smem = (size_t)T * sizeof(float);
    smem_opt_in(attention_forward_fallback_kernel, smem);
    LAUNCH(attention_forward_fallback_kernel, (unsigned int)rows, ATT_THREADS, smem)(out, stats, qkv, T, NH, NKV, HS,
                                                                                 1.0f / sqrtf((float)HS));
    launchCheck();
#endif
}

/*
 * Attention backward: dqkv (B, T, QKV) = gradients of q, k, v (every element written) given dout
 * (B, T, NH*HS) and the forward's qkv, out and stats. k and v gradients sum over their group's heads.
 */
static inline void op_attention_backward(act_t* dqkv, const act_t* dout, const act_t* qkv, const act_t* out,
                                         const float* stats, int B, int T, int NH, int NKV, int HS) {
#ifdef USE_CUDNN
    cudnn_att_backward(dqkv, dout, qkv, out, stats, B, T, NH, NKV, HS);
#else
    (void)out;
    float scale = 1.0f / sqrtf((float)HS);
    size_t query_rows = (size_t)B * NH * T, key_rows = (size_t)B * NKV * T;
    float* dsum = (float*)scratch_reserve(&g_attention_scratch, query_rows * sizeof(float));
    size_t smem_q = 2 * (size_t)T * sizeof(float), smem_k = (2 * (size_t)T + 2 * (size_t)HS) * sizeof(float);
    smem_opt_in(attention_backward_query_kernel, smem_q);
    smem_opt_in(attention_backward_key_kernel, smem_k);
    LAUNCH(attention_backward_query_kernel, (unsigned int)query_rows, ATT_THREADS, smem_q)(dqkv, dsum, dout, qkv, stats, T, NH,
                                                                                       NKV, HS, scale);
    launchCheck();
    LAUNCH(attention_backward_key_kernel, (unsigned int)key_rows, ATT_THREADS, smem_k)(dqkv, dsum, dout, qkv, stats, T, NH, NKV,
                                                                                   HS, scale);
    launchCheck();
#endif
}
