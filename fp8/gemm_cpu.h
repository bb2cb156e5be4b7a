/*
 * The GEMM of the CPU emulation, gemm.h's contract in FP32: FP8 operands are decoded to their exact
 * values, multiplied with FP32 accumulation (OpenBLAS sgemm, or a plain loop with make BLAS=none), and
 * the product is multiplied by scale_inv_a * scale_inv_b, as cuBLASLt applies its A/B scales. What
 * remains different from the GPU is the accumulation order and the tensor cores' FP8 fast accumulation,
 * which has no CPU counterpart. The output is FP32 in both DT_F32 and DT_ACT (the CPU's activation type
 * is float); the CPU backend rounds a DT_ACT output to BF16 where the GPU would store BF16.
 */
#pragma once

#include <limits.h>
#include <omp.h>

#ifndef LLM8_NO_BLAS
#include <cblas.h>
#endif

#include "gemm.h"

/* Decoding tables of the two formats (every code's exact value), built on first use. */
static float g_fp8_lut[2][256];
static int g_fp8_lut_ready = 0;

/* Decodes n FP8 codes of format f to floats (exact). */
static inline void fp8_decode(float* out, const uint8_t* codes, size_t n, Fp8Format f) {
    if (!g_fp8_lut_ready) {
        for (int c = 0; c < 256; c++) {
            g_fp8_lut[FP8_E4M3][c] = fp8_to_float((uint8_t)c, FP8_E4M3);
            g_fp8_lut[FP8_E5M2][c] = fp8_to_float((uint8_t)c, FP8_E5M2);
        }
        g_fp8_lut_ready = 1;
    }
    const float* lut = g_fp8_lut[f];
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) out[i] = lut[codes[i]];
}

/* Grow-only scratch for the decoded A and B operands (GEMMs run one at a time). */
static float* g_gemm_scratch[2] = {NULL, NULL};
static size_t g_gemm_scratch_len[2] = {0, 0};

/* The operand as floats: itself, or its codes decoded into scratch slot `which`. */
static inline const float* gemm_cpu_operand(const GemmOperand* o, size_t n, int which) {
    if (!dtype_is_fp8(o->dtype)) return (const float*)o->data;
    if (g_gemm_scratch_len[which] < n) {
        free(g_gemm_scratch[which]);
        g_gemm_scratch[which] = (float*)mallocCheck(n * sizeof(float));
        g_gemm_scratch_len[which] = n;
    }
    fp8_decode(g_gemm_scratch[which], (const uint8_t*)o->data, n, o->dtype == DT_E4M3 ? FP8_E4M3 : FP8_E5M2);
    return g_gemm_scratch[which];
}

#ifdef LLM8_NO_BLAS
/*
 * Column-major SGEMM for machines without OpenBLAS (make BLAS=none, e.g. a GPU host where nothing can be
 * installed): C (m x n, ldc) = alpha op(A) op(B) + beta C with FP32 accumulation, one column per thread.
 * Slow; enough for the reference model and the kernel checks' small shapes.
 */
static inline void sgemm_fallback(int trans_a, int trans_b, size_t m, size_t n, size_t k, float alpha, const float* A,
                                  size_t lda, const float* B, size_t ldb, float beta, float* C, size_t ldc) {
#pragma omp parallel for schedule(static)
    for (size_t j = 0; j < n; j++) {
        for (size_t i = 0; i < m; i++) {
            float acc = 0.0f;
            for (size_t p = 0; p < k; p++) {
                float a = trans_a ? A[i * lda + p] : A[p * lda + i];
                float b = trans_b ? B[p * ldb + j] : B[j * ldb + p];
                acc += a * b;
            }
            float* c = &C[j * ldc + i];
            *c = alpha * acc + (beta != 0.0f ? beta * *c : 0.0f);
        }
    }
}
#endif

/*
 * Runs g (gemm.h: column-major, cuBLASLt semantics) on host memory: D (m x n) float =
 * scale_inv_a * scale_inv_b * op(A) op(B) [+ D]. Stops with gemm_check's reason for a GEMM cuBLASLt
 * could not run, so a shape the GPU would refuse fails on the CPU build too.
 */
static inline void gemm_cpu(const GemmCall* g) {
    char why[256];
    if (gemm_check(g, why, sizeof(why))) die("%s", why);
    float alpha = dtype_is_fp8(g->a.dtype) ? *g->a.scale_inv * *g->b.scale_inv : 1.0f;
    const float* a = gemm_cpu_operand(&g->a, g->m * g->k, 0);
    const float* b = gemm_cpu_operand(&g->b, g->k * g->n, 1);
    size_t lda = g->trans_a ? g->k : g->m, ldb = g->trans_b ? g->n : g->k;
    float beta = g->accumulate ? 1.0f : 0.0f;
#ifdef LLM8_NO_BLAS
    sgemm_fallback(g->trans_a, g->trans_b, g->m, g->n, g->k, alpha, a, lda, b, ldb, beta, (float*)g->d, g->m);
#else
    if (g->m > INT_MAX || g->n > INT_MAX || g->k > INT_MAX)
        die("GEMM m %zu n %zu k %zu exceeds OpenBLAS's int dimensions", g->m, g->n, g->k);
    cblas_sgemm(CblasColMajor, g->trans_a ? CblasTrans : CblasNoTrans, g->trans_b ? CblasTrans : CblasNoTrans, (int)g->m,
                (int)g->n, (int)g->k, alpha, a, (int)lda, b, (int)ldb, beta, (float*)g->d, (int)g->m);
#endif
}
