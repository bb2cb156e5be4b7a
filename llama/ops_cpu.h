/*
 * The CPU backend of llama/model.h: memory functions (plain malloc) and every op of the model, in FP32
 * with OpenMP over rows and OpenBLAS for the GEMMs. It is the reference the GPU build is checked
 * against, so it emulates the GPU's numerics: in -p bf16 and fp8 every op rounds the values it stores
 * to BF16 (bf16_round) exactly where the GPU stores BF16, FP8 operands go through the same casts
 * (fp8/fp8.h) and an FP8 GEMM multiplies the exact FP8 values with FP32 accumulation before applying
 * scale_inv_a * scale_inv_b, as cuBLASLt does. The casts are bit-identical to the GPU's; the rest differs
 * in the last bits: summation order, the tensor cores' accumulators (FP8 fast accumulation), cuDNN's
 * flash attention rounding P and dS to BF16, RMSNorm and softmax sums in double here against FP32
 * there, and glibc's expf against CUDA's. dev/cuda/kernel_cases.cuh states each op's tolerance.
 * Reductions use fixed chunking, so results do not depend on the thread count and a resumed run repeats
 * the uninterrupted one bit for bit.
 *
 * Contracts (shared with llama/ops_cuda.cuh): tensors are row-major; "store" means the value is written
 * in the activation type (BF16-rounded here in bf16/fp8 mode); gradient outputs named "+=" accumulate.
 */
#pragma once

#include <math.h>
#include <omp.h>

#ifndef LLM8_NO_BLAS
#include <cblas.h>
#endif

#include "common.h"
#include "config.h"
#include "op_math.h"
#include "optim.h"
#include "../fp8/fp8.h"
#include "../fp8/gemm.h"

typedef float act_t;

/* Attention backward needs the softmax probabilities: (B, NH, T, T) floats per layer. */
#define ATT_STATS_SIZE(B, NH, T) ((size_t)(B) * (NH) * (T) * (T))

static int g_round_bf16 = 0; /* set by backend_init from -p: activations are stored as BF16 values */

static inline float store(float x) { return g_round_bf16 ? bf16_round(x) : x; }

/* ---------------------------------------------------------------- memory (host memory here) */

static inline void* dev_alloc(size_t bytes) {
    void* p = NULL;
    if (posix_memalign(&p, 64, bytes > 0 ? bytes : 64) != 0) die("out of host memory allocating %.1f MiB", mib(bytes));
    return p;
}
static inline void dev_free(void* p) { free(p); }
static inline void dev_upload(void* dst, const void* src, size_t bytes) { memcpy(dst, src, bytes); }
static inline void dev_download(void* dst, const void* src, size_t bytes) { memcpy(dst, src, bytes); }
static inline void dev_zero(void* p, size_t bytes) { memset(p, 0, bytes); }
static inline void act_to_float_host(float* out, const act_t* x, size_t n) { memcpy(out, x, n * sizeof(float)); }

/* ---------------------------------------------------------------- backend */

static inline void backend_init(Precision p) { g_round_bf16 = p != PRECISION_FP32; }
static inline void backend_synchronize(void) {}
static inline const char* backend_name(void) { return "cpu"; }
/* No meaningful peak for a CPU: MFU is reported as 0. */
static inline double backend_peak_flops(Precision p) {
    (void)p;
    return 0.0;
}
static inline double backend_memory_mib(void) { return 0.0; }

/* ---------------------------------------------------------------- elementwise and row ops */

/* out (n) = master rounded to the activation type. */
static inline void op_params_from_master(act_t* out, const float* master, size_t n) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) out[i] = store(master[i]);
}

/* out (N, C) = wte[tokens] with wte (V, C). */
static inline void op_encoder_forward(act_t* out, const int* tokens, const act_t* wte, size_t N, int C) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < N; i++) memcpy(out + i * C, wte + (size_t)tokens[i] * C, (size_t)C * sizeof(act_t));
}

/* dwte (V, C) += scatter of dout (N, C) by tokens; each column is summed in token order (deterministic). */
static inline void op_encoder_backward(float* dwte, const act_t* dout, const int* tokens, const int* tokens_host, size_t N,
                                       int C) {
    (void)tokens_host;
#pragma omp parallel for schedule(static)
    for (int c = 0; c < C; c++) {
        for (size_t i = 0; i < N; i++) dwte[(size_t)tokens[i] * C + c] += dout[i * C + c];
    }
}

/* One row of RMSNorm: returns rstd = 1 / sqrt(mean(x^2) + eps) (HF LlamaRMSNorm), sum in double. */
static inline float rms_rstd(const act_t* x, int C, float eps) {
    double ss = 0.0;
    for (int c = 0; c < C; c++) ss += (double)x[c] * x[c];
    return (float)(1.0 / sqrt(ss / C + (double)eps));
}

/* out (N, C) = inp * rstd * weight, rstd (N) = 1 / rms(inp). */
static inline void op_rmsnorm_forward(act_t* out, float* rstd, const act_t* inp, const act_t* weight, size_t N, int C,
                                      float eps) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < N; i++) {
        const act_t* x = inp + i * C;
        float r = rms_rstd(x, C, eps);
        rstd[i] = r;
        for (int c = 0; c < C; c++) out[i * C + c] = store(x[c] * r * weight[c]);
    }
}

/* resid_out (N, C) = resid_in + branch (stored), then norm_out, rstd = RMSNorm(resid_out) as above. */
static inline void op_residual_rmsnorm_forward(act_t* resid_out, act_t* norm_out, float* rstd, const act_t* resid_in,
                                               const act_t* branch, const act_t* weight, size_t N, int C, float eps) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < N; i++) {
        act_t* x = resid_out + i * C;
        for (int c = 0; c < C; c++) x[c] = store(resid_in[i * C + c] + branch[i * C + c]);
        float r = rms_rstd(x, C, eps);
        rstd[i] = r;
        for (int c = 0; c < C; c++) norm_out[i * C + c] = store(x[c] * r * weight[c]);
    }
}

/*
 * RMSNorm backward. With xh = x * rstd and y = xh * w: dweight (C) += sum_i dout * xh;
 * dinp (N, C) += rstd * (g - xh * mean(g * xh)) with g = dout * w.
 */
static inline void op_rmsnorm_backward(act_t* dinp, float* dweight, const act_t* dout, const act_t* inp,
                                       const act_t* weight, const float* rstd, size_t N, int C) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < N; i++) {
        const act_t* x = inp + i * C;
        const act_t* dy = dout + i * C;
        float r = rstd[i];
        double dot = 0.0;
        for (int c = 0; c < C; c++) dot += (double)dy[c] * weight[c] * (x[c] * r);
        float mean = (float)(dot / C);
        for (int c = 0; c < C; c++) {
            dinp[i * C + c] = store(dinp[i * C + c] + rmsnorm_dx(dy[c], weight[c], x[c] * r, r, mean));
        }
    }
#pragma omp parallel for schedule(static)
    for (int c = 0; c < C; c++) {
        float s = 0.0f;
        for (size_t i = 0; i < N; i++) s += dout[i * C + c] * (inp[i * C + c] * rstd[i]);
        dweight[c] += s;
    }
}

/*
 * RoPE, HF rotate-half convention, in place on the q (NH heads) and k (NKV heads) parts of qkv
 * (B, T, QKV): for i < HS/2, (x_i, x_{i+HS/2}) rotates by the angle pos * theta^(-2i/HS).
 * direction +1: forward; -1: backward (the transpose rotation, applied to gradients).
 */
static inline void rope_apply(act_t* qkv, const float* cos_t, const float* sin_t, int B, int T, int NH, int NKV, int HS,
                              float direction) {
    int half = HS / 2, heads = NH + NKV;
    size_t QKV = (size_t)(NH + 2 * NKV) * HS;
#pragma omp parallel for schedule(static)
    for (long long bt = 0; bt < (long long)B * T; bt++) {
        int t = (int)(bt % T);
        act_t* row = qkv + (size_t)bt * QKV;
        for (int h = 0; h < heads; h++) {
            act_t* v = row + (size_t)h * HS; /* q heads then k heads are contiguous */
            for (int i = 0; i < half; i++) {
                float c = cos_t[t * half + i], s = direction * sin_t[t * half + i];
                float o1, o2;
                rope_rotate(v[i], v[i + half], c, s, &o1, &o2);
                v[i] = store(o1);
                v[i + half] = store(o2);
            }
        }
    }
}

static inline void op_rope_forward(act_t* qkv, const float* cos_t, const float* sin_t, int B, int T, int NH, int NKV,
                                   int HS) {
    rope_apply(qkv, cos_t, sin_t, B, T, NH, NKV, HS, 1.0f);
}

static inline void op_rope_backward(act_t* dqkv, const float* cos_t, const float* sin_t, int B, int T, int NH, int NKV,
                                    int HS) {
    rope_apply(dqkv, cos_t, sin_t, B, T, NH, NKV, HS, -1.0f);
}

/*
 * Causal attention with grouped-query heads: qkv (B, T, QKV) rows [q (NH*HS) | k (NKV*HS) | v (NKV*HS)],
 * query head h reads kv head h / (NH / NKV) (HF repeat_kv); out (B, T, NH*HS) = softmax(q k^T / sqrt(HS)) v.
 * probs (B, NH, T, T) keeps the softmax for backward (zeros above the diagonal).
 */
static inline void op_attention_forward(act_t* out, float* probs, const act_t* qkv, int B, int T, int NH, int NKV, int HS) {
    size_t C = (size_t)NH * HS, KVC = (size_t)NKV * HS, QKV = C + 2 * KVC;
    int group = NH / NKV;
    float scale = 1.0f / sqrtf((float)HS);
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            int kvh = h / group;
            for (int t = 0; t < T; t++) {
                const act_t* q = qkv + ((size_t)b * T + t) * QKV + (size_t)h * HS;
                float* p = probs + (((size_t)b * NH + h) * T + t) * T;
                float maxv = -INFINITY;
                for (int s = 0; s <= t; s++) {
                    const act_t* k = qkv + ((size_t)b * T + s) * QKV + C + (size_t)kvh * HS;
                    float dot = 0.0f;
                    for (int d = 0; d < HS; d++) dot += q[d] * k[d];
                    p[s] = dot * scale;
                    if (p[s] > maxv) maxv = p[s];
                }
                float sum = 0.0f;
                for (int s = 0; s <= t; s++) {
                    p[s] = expf(p[s] - maxv);
                    sum += p[s];
                }
                for (int s = 0; s <= t; s++) p[s] /= sum;
                for (int s = t + 1; s < T; s++) p[s] = 0.0f;
                act_t* o = out + ((size_t)b * T + t) * C + (size_t)h * HS;
                for (int d = 0; d < HS; d++) {
                    float acc = 0.0f;
                    for (int s = 0; s <= t; s++) acc += p[s] * qkv[((size_t)b * T + s) * QKV + C + KVC + (size_t)kvh * HS + d];
                    o[d] = store(acc);
                }
            }
        }
    }
}

/*
 * Attention backward: dqkv (B, T, QKV) = gradients of q, k, v given dout (B, T, C) and the saved probs.
 * dS = P * (dP - rowsum(P * dP)) with dP = dout v^T; dq = dS k / sqrt(HS), dk = dS^T q / sqrt(HS),
 * dv = P^T dout; k and v gradients sum over the query heads of their group. out is unused here (cuDNN
 * needs it); it is in the signature so that both backends take the same arguments.
 */
static inline void op_attention_backward(act_t* dqkv, const act_t* dout, const act_t* qkv, const act_t* out,
                                         const float* probs, int B, int T, int NH, int NKV, int HS) {
    (void)out;
    size_t C = (size_t)NH * HS, KVC = (size_t)NKV * HS, QKV = C + 2 * KVC;
    int group = NH / NKV;
    float scale = 1.0f / sqrtf((float)HS);
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++) {
        for (int kvh = 0; kvh < NKV; kvh++) {
            float* dk = (float*)callocCheck((size_t)T * HS, sizeof(float));
            float* dv = (float*)callocCheck((size_t)T * HS, sizeof(float));
            float* dq = (float*)mallocCheck((size_t)HS * sizeof(float));
            float* dp = (float*)mallocCheck((size_t)T * sizeof(float));
            for (int h = kvh * group; h < (kvh + 1) * group; h++) {
                for (int t = 0; t < T; t++) {
                    const act_t* q = qkv + ((size_t)b * T + t) * QKV + (size_t)h * HS;
                    const act_t* go = dout + ((size_t)b * T + t) * C + (size_t)h * HS;
                    const float* p = probs + (((size_t)b * NH + h) * T + t) * T;
                    float rowsum = 0.0f;
                    for (int s = 0; s <= t; s++) {
                        const act_t* v = qkv + ((size_t)b * T + s) * QKV + C + KVC + (size_t)kvh * HS;
                        float dot = 0.0f;
                        for (int d = 0; d < HS; d++) dot += go[d] * v[d];
                        dp[s] = dot;
                        rowsum += p[s] * dot;
                    }
                    for (int d = 0; d < HS; d++) dq[d] = 0.0f;
                    for (int s = 0; s <= t; s++) {
                        const act_t* k = qkv + ((size_t)b * T + s) * QKV + C + (size_t)kvh * HS;
                        float ds = p[s] * (dp[s] - rowsum) * scale;
                        for (int d = 0; d < HS; d++) {
                            dq[d] += ds * k[d];
                            dk[(size_t)s * HS + d] += ds * q[d];
                            dv[(size_t)s * HS + d] += p[s] * go[d];
                        }
                    }
                    act_t* dqo = dqkv + ((size_t)b * T + t) * QKV + (size_t)h * HS;
                    for (int d = 0; d < HS; d++) dqo[d] = store(dq[d]);
                }
            }
            for (int s = 0; s < T; s++) {
                act_t* row = dqkv + ((size_t)b * T + s) * QKV;
                for (int d = 0; d < HS; d++) {
                    row[C + (size_t)kvh * HS + d] = store(dk[(size_t)s * HS + d]);
                    row[C + KVC + (size_t)kvh * HS + d] = store(dv[(size_t)s * HS + d]);
                }
            }
            free(dk);
            free(dv);
            free(dq);
            free(dp);
        }
    }
}

/* out (N, F) = silu(a) * b with inp (N, 2F) = [a | b] per row (SwiGLU, Shazeer 2020). */
static inline void op_swiglu_forward(act_t* out, const act_t* inp, size_t N, int F) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < N; i++) {
        for (int j = 0; j < F; j++) {
            out[i * F + j] = store(swiglu(inp[i * 2 * F + j], inp[i * 2 * F + F + j]));
        }
    }
}

/* dinp (N, 2F) = [dout * b * silu'(a) | dout * silu(a)], silu'(a) = s (1 + a (1 - s)), s = sigmoid(a). */
static inline void op_swiglu_backward(act_t* dinp, const act_t* dout, const act_t* inp, size_t N, int F) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < N; i++) {
        for (int j = 0; j < F; j++) {
            float da, db;
            swiglu_backward(inp[i * 2 * F + j], inp[i * 2 * F + F + j], dout[i * F + j], &da, &db);
            dinp[i * 2 * F + j] = store(da);
            dinp[i * 2 * F + F + j] = store(db);
        }
    }
}

/*
 * Fused softmax cross-entropy: losses (N) = logsumexp(logits_i) - logits_i[target_i]; logits (N, V) is
 * overwritten with dloss * (softmax(logits_i) - onehot(target_i)).
 */
static inline void op_classifier(act_t* logits, float* losses, const int* targets, size_t N, int V, float dloss) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < N; i++) {
        act_t* x = logits + i * V;
        float maxv = -INFINITY;
        for (int v = 0; v < V; v++) maxv = x[v] > maxv ? x[v] : maxv;
        double sum = 0.0;
        for (int v = 0; v < V; v++) sum += exp((double)(x[v] - maxv));
        float lse = maxv + (float)log(sum);
        losses[i] = lse - x[targets[i]];
        for (int v = 0; v < V; v++) {
            float p = expf(x[v] - lse);
            x[v] = store((p - (v == targets[i] ? 1.0f : 0.0f)) * dloss);
        }
    }
}

/* ---------------------------------------------------------------- reductions and optimizer */

#define REDUCE_CHUNK 65536

/* sum of x^2 over n floats, in double, chunked so the result does not depend on the thread count. */
static inline double op_sum_squares(const float* x, size_t n) {
    size_t chunks = ceil_div(n, REDUCE_CHUNK);
    double* part = (double*)mallocCheck(chunks * sizeof(double));
#pragma omp parallel for schedule(static)
    for (size_t k = 0; k < chunks; k++) {
        size_t end = (k + 1) * REDUCE_CHUNK < n ? (k + 1) * REDUCE_CHUNK : n;
        double s = 0.0;
        for (size_t i = k * REDUCE_CHUNK; i < end; i++) s += (double)x[i] * x[i];
        part[k] = s;
    }
    double total = 0.0;
    for (size_t k = 0; k < chunks; k++) total += part[k];
    free(part);
    return total;
}

/* AdamW on n parameters (optim.h's adamw_update), gradients multiplied by grad_scale. */
static inline void op_adamw(float* master, float* m, float* v, const float* grads, size_t n, float lr, float wd, float bc1,
                            float bc2_sqrt, float grad_scale) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) adamw_update(&master[i], &m[i], &v[i], grads[i] * grad_scale, lr, wd, bc1, bc2_sqrt);
}

/* ---------------------------------------------------------------- FP8 */

/* s->amax = max |x| over n values; NaN if any is NaN (amax_combine). */
static inline void op_amax(Fp8Scale* s, const act_t* x, size_t n) {
    size_t chunks = ceil_div(n, REDUCE_CHUNK);
    float* part = (float*)mallocCheck(chunks * sizeof(float));
#pragma omp parallel for schedule(static)
    for (size_t k = 0; k < chunks; k++) {
        size_t end = (k + 1) * REDUCE_CHUNK < n ? (k + 1) * REDUCE_CHUNK : n;
        float a = 0.0f;
        for (size_t i = k * REDUCE_CHUNK; i < end; i++) a = amax_combine(a, fabsf(x[i]));
        part[k] = a;
    }
    float a = 0.0f;
    for (size_t k = 0; k < chunks; k++) a = amax_combine(a, part[k]);
    free(part);
    s->amax = a;
}

/*
 * Sets s->scale / s->scale_inv from s->amax (fp8_compute_scale), then casts x (rows, cols) into codes
 * out (rows, cols) and out_t (cols, rows); either may be NULL. counts (may be NULL) accumulates the
 * cast statistics (fp8.h Fp8Counts).
 */
static inline void op_cast_transpose(uint8_t* out, uint8_t* out_t, const act_t* x, size_t rows, size_t cols, Fp8Format f,
                                     Fp8Scale* s, int pow2, Fp8Counts* counts) {
    fp8_scale_set(s, s->amax, f, pow2);
    float scale = s->scale;
    unsigned long long sat = 0, under = 0, nonzero = 0;
#pragma omp parallel for schedule(static) reduction(+ : sat, under, nonzero)
    for (size_t i = 0; i < rows; i++) {
        for (size_t j = 0; j < cols; j++) {
            float v = x[i * cols + j];
            uint8_t code = fp8_quantize(v, scale, f);
            if (out) out[i * cols + j] = code;
            if (out_t) out_t[j * rows + i] = code;
            sat += (unsigned long long)fp8_is_max(code, f);
            nonzero += v != 0.0f;
            under += v != 0.0f && fp8_is_zero(code);
        }
    }
    if (counts) {
        counts->saturated += sat;
        counts->underflow += under;
        counts->nonzero += nonzero;
        counts->count += (unsigned long long)rows * cols;
    }
}

/* ---------------------------------------------------------------- GEMM */

static float g_fp8_lut[2][256];
static int g_fp8_lut_ready = 0;

/* Decodes n FP8 codes to floats (exact). */
static inline void fp8_decode(float* out, const uint8_t* codes, size_t n, Fp8Format f) {
    if (!g_fp8_lut_ready) {
        for (int c = 0; c < 256; c++) {
            g_fp8_lut[0][c] = fp8_to_float((uint8_t)c, FP8_E4M3);
            g_fp8_lut[1][c] = fp8_to_float((uint8_t)c, FP8_E5M2);
        }
        g_fp8_lut_ready = 1;
    }
    const float* lut = g_fp8_lut[f];
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) out[i] = lut[codes[i]];
}

/* Grow-only scratch for decoded FP8 operands (ops run one at a time). */
static float* g_gemm_scratch[2] = {NULL, NULL};
static size_t g_gemm_scratch_len[2] = {0, 0};

static inline const float* gemm_operand(const void* p, DType t, size_t n, int which) {
    if (!dtype_is_fp8(t)) return (const float*)p;
    if (g_gemm_scratch_len[which] < n) {
        free(g_gemm_scratch[which]);
        g_gemm_scratch[which] = (float*)mallocCheck(n * sizeof(float));
        g_gemm_scratch_len[which] = n;
    }
    fp8_decode(g_gemm_scratch[which], (const uint8_t*)p, n, t == DT_E4M3 ? FP8_E4M3 : FP8_E5M2);
    return g_gemm_scratch[which];
}

#ifdef LLM8_NO_BLAS
/*
 * Column-major SGEMM for machines without OpenBLAS (make BLAS=none, e.g. a GPU host where nothing can be
 * installed): C (m x n, ldc) = alpha op(A) op(B) + beta C with FP32 accumulation, one column per thread.
 * Slow; enough for the reference model and the kernel checks' small shapes.
 */
static inline void sgemm_fallback(int transA, int transB, int m, int n, int k, float alpha, const float* A, int lda,
                                  const float* B, int ldb, float beta, float* C, int ldc) {
#pragma omp parallel for schedule(static)
    for (int j = 0; j < n; j++) {
        for (int i = 0; i < m; i++) {
            float acc = 0.0f;
            for (int p = 0; p < k; p++) {
                float a = transA ? A[(size_t)i * lda + p] : A[(size_t)p * lda + i];
                float b = transB ? B[(size_t)p * ldb + j] : B[(size_t)j * ldb + p];
                acc += a * b;
            }
            float* c = &C[(size_t)j * ldc + i];
            *c = alpha * acc + (beta != 0.0f ? beta * *c : 0.0f);
        }
    }
}
#endif

/*
 * The GEMM contract of fp8/gemm.h (column-major, cuBLASLt semantics):
 * D (m x n) = scale_a * scale_b * op(A) op(B) [+ D], accumulated in FP32 (OpenBLAS sgemm); a DT_ACT D is
 * then stored in the activation type. scale_inv_a / scale_inv_b point to the FP8 operands' scale_inv
 * (NULL for non-FP8 operands). fast_accum has no CPU counterpart (FP32 accumulation throughout).
 * Stops with gemm_check's reason for a GEMM cuBLASLt could not run.
 */
static inline void op_gemm(void* D, DType dt, const void* A, DType at, int transA, const void* B, DType bt, int transB,
                           int m, int n, int k, const float* scale_inv_a, const float* scale_inv_b, int accumulate,
                           int fast_accum) {
    (void)fast_accum;
    char why[256];
    if (gemm_check(at, transA, bt, transB, m, n, k, why, sizeof(why))) die("%s", why);
    if (dt != DT_F32 && dt != DT_ACT) die("GEMM output type %s is not supported", dtype_name(dt));
    float alpha = 1.0f;
    if (dtype_is_fp8(at)) alpha = *scale_inv_a * *scale_inv_b;
    const float* a = gemm_operand(A, at, (size_t)m * k, 0);
    const float* b = gemm_operand(B, bt, (size_t)k * n, 1);
    float* d = (float*)D;
#ifdef LLM8_NO_BLAS
    sgemm_fallback(transA, transB, m, n, k, alpha, a, transA ? k : m, b, transB ? n : k, accumulate ? 1.0f : 0.0f, d, m);
#else
    cblas_sgemm(CblasColMajor, transA ? CblasTrans : CblasNoTrans, transB ? CblasTrans : CblasNoTrans, m, n, k, alpha, a,
                transA ? k : m, b, transB ? n : k, accumulate ? 1.0f : 0.0f, d, m);
#endif
    if (dt == DT_ACT && g_round_bf16) {
        size_t total = (size_t)m * n;
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < total; i++) d[i] = bf16_round(d[i]);
    }
}
