/*
 * The GEMM of the CPU emulation, gemm.h's contract in FP32: FP8 operands are decoded to their exact
 * values, multiplied with FP32 accumulation (OpenBLAS sgemm, or a plain loop with make BLAS=none), and
 * the product is multiplied by scale_inv_a * scale_inv_b, as cuBLASLt applies its A/B scales, tile by
 * tile so that the result does not depend on the thread count (sgemm_tiled). What remains different
 * from the GPU is the accumulation order and the tensor cores' truncating FP8 accumulation, unless the
 * call asks for FP8_ACCUM_HOPPER: then gemm_hopper.h models the latter (with the call's fast_accum), bit
 * for bit as mmaemu computes an H100's cuBLASLt FP8 GEMM, unsplit. The output is FP32 in both DT_F32 and
 * DT_ACT (the CPU's activation type is float); the CPU backend rounds a DT_ACT output to BF16 where the
 * GPU would store BF16.
 */
#pragma once

#include <limits.h>
#include <omp.h>

#ifndef LLM8_NO_BLAS
#include <cblas.h>
#endif

#include "gemm.h"
#include "gemm_hopper.h"

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

/* Grow-only scratch of the GEMMs, which run one at a time: the decoded A and B operands, and the product
   of an accumulating GEMM. */
enum { GEMM_SCRATCH_A, GEMM_SCRATCH_B, GEMM_SCRATCH_PRODUCT, GEMM_SCRATCH_SLOTS };
static float* g_gemm_scratch[GEMM_SCRATCH_SLOTS];
static size_t g_gemm_scratch_len[GEMM_SCRATCH_SLOTS];

/* Scratch slot `which`, at least n floats. */
static inline float* gemm_cpu_scratch(int which, size_t n) {
    if (g_gemm_scratch_len[which] < n) {
        free(g_gemm_scratch[which]);
        g_gemm_scratch[which] = (float*)mallocCheck(n * sizeof(float));
        g_gemm_scratch_len[which] = n;
    }
    return g_gemm_scratch[which];
}

/* The operand as floats: itself, or its codes decoded into scratch slot `which`. */
static inline const float* gemm_cpu_operand(const GemmOperand* o, size_t n, int which) {
    if (!dtype_is_fp8(o->dtype)) return (const float*)o->data;
    float* out = gemm_cpu_scratch(which, n);
    fp8_decode(out, (const uint8_t*)o->data, n, o->dtype == DT_E4M3 ? FP8_E4M3 : FP8_E5M2);
    return out;
}

#ifdef LLM8_NO_BLAS
/*
 * Column-major SGEMM for machines without OpenBLAS (make BLAS=none, e.g. a GPU host where nothing can be
 * installed): C (m x n, ldc) = alpha op(A) op(B) + beta C with FP32 accumulation in k order. Serial: the
 * tiles of sgemm_tiled run it in parallel. Slow; enough for the reference model and the kernel checks'
 * small shapes.
 */
static inline void sgemm_serial(int trans_a, int trans_b, size_t m, size_t n, size_t k, float alpha, const float* A,
                                size_t lda, const float* B, size_t ldb, float beta, float* C, size_t ldc) {
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
#else
/* One OpenBLAS call on one thread: OpenBLAS's OpenMP build runs single-threaded inside an active
   parallel region (and its thread count is the region's, 1, in a team of one); a pthreads build is told
   once to use one thread (gemm_cpu_blas_setup). */
static inline void sgemm_serial(int trans_a, int trans_b, size_t m, size_t n, size_t k, float alpha, const float* A,
                                size_t lda, const float* B, size_t ldb, float beta, float* C, size_t ldc) {
    cblas_sgemm(CblasColMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, (int)m, (int)n,
                (int)k, alpha, A, (int)lda, B, (int)ldb, beta, C, (int)ldc);
}
#endif

/*
 * Tiles of D that the CPU GEMM computes one call each, on one thread. A multi-threaded BLAS call splits
 * its work by the thread count, and OpenBLAS's results change with it (the last bits of a few outputs),
 * so 1 rank x 2 threads and 2 ranks x 1 thread trained apart. With tiles fixed by the shape alone, every
 * element of D is the same single-threaded computation whatever the thread count: results depend on the
 * BLAS kernel (gemm_cpu_blas_identity, which the ranks compare at start-up) but not on OMP_NUM_THREADS. Tiles
 * of 256 x 256 keep OpenBLAS's packing cost small at k >= 64 and give the 2048-token classifier GEMMs of
 * the default run hundreds of tiles to share.
 */
#define GEMM_CPU_TILE_ROWS 256
#define GEMM_CPU_TILE_COLS 256

/* C (m x n, column-major, ldc) = alpha op(A) op(B) + beta C, tile by tile (see GEMM_CPU_TILE_ROWS). */
static inline void sgemm_tiled(int trans_a, int trans_b, size_t m, size_t n, size_t k, float alpha, const float* A,
                               size_t lda, const float* B, size_t ldb, float beta, float* C, size_t ldc) {
    size_t tiles_m = (m + GEMM_CPU_TILE_ROWS - 1) / GEMM_CPU_TILE_ROWS, tiles_n = (n + GEMM_CPU_TILE_COLS - 1) / GEMM_CPU_TILE_COLS;
    /* dynamic: which thread runs a tile does not change its result; edge tiles are cheaper */
#pragma omp parallel for schedule(dynamic)
    for (size_t t = 0; t < tiles_m * tiles_n; t++) {
        size_t i0 = (t % tiles_m) * GEMM_CPU_TILE_ROWS, j0 = (t / tiles_m) * GEMM_CPU_TILE_COLS;
        size_t rows = m - i0 < GEMM_CPU_TILE_ROWS ? m - i0 : GEMM_CPU_TILE_ROWS;
        size_t cols = n - j0 < GEMM_CPU_TILE_COLS ? n - j0 : GEMM_CPU_TILE_COLS;
        /* rows i0.. of op(A) and columns j0.. of op(B), in their stored layouts */
        const float* a = trans_a ? A + i0 * lda : A + i0;
        const float* b = trans_b ? B + j0 : B + j0 * ldb;
        sgemm_serial(trans_a, trans_b, rows, cols, k, alpha, a, lda, b, ldb, beta, C + j0 * ldc + i0, ldc);
    }
}

/* Called once before the first GEMM: a pthreads OpenBLAS would start its own threads inside each tile. */
static inline void gemm_cpu_blas_setup(void) {
#ifndef LLM8_NO_BLAS
    static int done = 0;
    if (done) return;
    done = 1;
    if (openblas_get_parallel() == 1) openblas_set_num_threads(1);
#endif
}

/*
 * The BLAS this process computes its GEMMs with, as text (len >= 64): OpenBLAS's configuration (version,
 * the core whose kernels it chose, which OPENBLAS_CORETYPE overrides, its threading) and the L2 size
 * OPENBLAS_L2_SIZE imposes, or the built-in loop of make BLAS=none. Two ranks with different texts may
 * compute different last bits (another kernel, another blocking), so the start-up agreement compares it.
 */
static inline void gemm_cpu_blas_identity(char* out, size_t len) {
#ifdef LLM8_NO_BLAS
    snprintf(out, len, "built-in loop (BLAS=none)");
#else
    const char* l2 = getenv("OPENBLAS_L2_SIZE");
    snprintf(out, len, "%s%s%s", openblas_get_config(), l2 ? " L2_SIZE=" : "", l2 ? l2 : "");
#endif
}

/*
 * Runs g (gemm.h: column-major, cuBLASLt semantics) on host memory: D (m x n) float =
 * scale_inv_a * scale_inv_b * op(A) op(B) [+ D]. An accumulating GEMM computes its product apart and adds
 * it in one rounding, as cuBLASLt's epilogue does: BLAS would add its K-blocks to D one by one, which
 * makes accumulated micro-steps depend on how they are split. Stops with gemm_check's reason for a GEMM
 * cuBLASLt could not run, so a shape the GPU would refuse fails on the CPU build too.
 */
static inline void gemm_cpu(const GemmCall* g) {
    if (g->accumulate) {
        size_t total = g->m * g->n;
        GemmCall product = *g;
        product.d = gemm_cpu_scratch(GEMM_SCRATCH_PRODUCT, total);
        product.accumulate = 0;
        gemm_cpu(&product);
        float *d = (float*)g->d, *p = (float*)product.d;
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < total; i++) d[i] += p[i];
        return;
    }
    char why[256];
    if (gemm_check(g, why, sizeof(why))) die("%s", why);
    /* a non-finite code (never made by the trainer's saturating casts) falls back to the IEEE path */
    if (g->accum == FP8_ACCUM_HOPPER && dtype_is_fp8(g->a.dtype) && gemm_hopper(g, 1) == 0) return;
    float alpha = dtype_is_fp8(g->a.dtype) ? *g->a.scale_inv * *g->b.scale_inv : 1.0f;
    const float* a = gemm_cpu_operand(&g->a, g->m * g->k, GEMM_SCRATCH_A);
    const float* b = gemm_cpu_operand(&g->b, g->k * g->n, GEMM_SCRATCH_B);
    size_t lda = g->trans_a ? g->k : g->m, ldb = g->trans_b ? g->n : g->k;
#ifndef LLM8_NO_BLAS
    if (g->m > INT_MAX || g->n > INT_MAX || g->k > INT_MAX)
        die("GEMM m %zu n %zu k %zu exceeds OpenBLAS's int dimensions", g->m, g->n, g->k);
#endif
    gemm_cpu_blas_setup();
    sgemm_tiled(g->trans_a, g->trans_b, g->m, g->n, g->k, alpha, a, lda, b, ldb, 0.0f, (float*)g->d, g->m);
}
