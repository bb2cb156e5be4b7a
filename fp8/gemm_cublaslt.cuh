/*
 * gemm.h's column-major contract on cuBLASLt, for BF16 x BF16 and the FP8 GEMMs of the recipe
 * (E4M3 x E4M3 fprop, E4M3 x E5M2 dgrad/wgrad), FP32 compute and scale type, output BF16 (DT_ACT) or FP32
 * (wgrad accumulates into the FP32 gradient with beta = 1, C = D). FP8 operands carry per-tensor
 * scale_inv values in device memory that cuBLASLt reads as its A/B scale pointers, so no host
 * synchronization is needed between the cast that produces a scale and the GEMM that uses it. The
 * heuristic's algorithm is looked up once per GEMM shape and kept in a small table; for FP8 it is asked
 * with the A/B scale pointers already set (to a device 1.0f), and each call then points them at its
 * operands' scale_inv. Split-K reductions are limited to those that round D once (gemm_reduction_mask).
 */
#pragma once

#include <cublasLt.h>

#include "gemm.h"
#include "../core/cuda_utils.cuh"

/* The cuBLAS / cuBLASLt status check every cuBLASLt call goes through. */
static inline void cublas_check(cublasStatus_t status, const char* call, const char* file, int line) {
    if (status != CUBLAS_STATUS_SUCCESS)
        die("cuBLASLt error at %s:%d: %s: %s (%s)", file, line, call, cublasLtGetStatusString(status), cublasLtGetStatusName(status));
}
#define cublasCheck(call) cublas_check((call), #call, __FILE__, __LINE__)

/* cuBLASLt workspace; 32 MiB is what NVIDIA recommends for Hopper (cuBLAS docs, cublasSetWorkspace). */
#define CUBLASLT_WORKSPACE_BYTES ((size_t)32 << 20)
/* Plans kept at once: a model uses ~15 GEMM shapes per (B, T); beyond this the oldest is replaced. */
#define GEMM_CACHE_SIZE 64
/* The largest operand alignment cuBLASLt asks about (its default assumption). */
#define GEMM_MAX_ALIGNMENT 256u

static cublasLtHandle_t g_cublaslt = NULL;
static void* g_cublaslt_workspace = NULL;
/* A device 1.0f: the A/B scale an FP8 plan's heuristic query sees (gemm_plan_build). */
static float* g_gemm_unit_scale = NULL;

/* One cached GEMM: the key (everything the algorithm choice depends on) and its descriptors. */
typedef struct {
    int used;
    DType dt, at, bt;
    int transA, transB, accumulate, fast_accum;
    size_t m, n, k;
    unsigned int align_a, align_b, align_d;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a_layout, b_layout, d_layout;
    cublasLtMatmulAlgo_t algo;
} GemmPlan;

static GemmPlan g_gemm_plans[GEMM_CACHE_SIZE];
static int g_gemm_next_victim = 0;

/* Creates the cuBLASLt handle and workspace (once). */
static inline void gemm_cublaslt_init(void) {
    if (g_cublaslt) return;
    cublasCheck(cublasLtCreate(&g_cublaslt));
    cudaCheck(device_alloc(&g_cublaslt_workspace, CUBLASLT_WORKSPACE_BYTES));
    const float one = 1.0f;
    cudaCheck(device_alloc((void**)&g_gemm_unit_scale, sizeof(float)));
    cudaCheck(cudaMemcpy(g_gemm_unit_scale, &one, sizeof(float), cudaMemcpyHostToDevice));
}

/*
 * The split-K reduction schemes (cublasLt.h, cublasLtReductionScheme_t) a GEMM with D of type dt may
 * use, so that D is rounded once, from the FP32 sum of all k, as llama/backend.h's op_gemm promises and
 * the CPU emulation (fp8/gemm_cpu.h) computes:
 *   - INPLACE reduces "in place - using the output buffer (and output data type)": each split adds its
 *     partial sum into D, so an accumulating FP32 D (wgrad, beta = 1) becomes ((D + p1) + p2) + ..., one
 *     rounding per split instead of one, and a BF16 D holds BF16-rounded partial sums: never allowed;
 *   - OUTPUT_TYPE stores the partial sums "in output type in the workspace": BF16 for a BF16 D (a
 *     rounding of every partial sum before the final one), exact for FP32 D: allowed for FP32 D only;
 *   - COMPUTE_TYPE keeps them in FP32 and reduces them in a separate step, then applies alpha, beta and C
 *     once, like NONE (no split-K): always allowed (only the order of the FP32 summation over k changes).
 */
static inline uint32_t gemm_reduction_mask(DType dt) {
    uint32_t mask = CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    if (dt == DT_F32) mask |= CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE;
    return mask;
}

static inline cudaDataType_t gemm_cuda_type(DType t) {
    switch (t) {
        case DT_F32: return CUDA_R_32F;
        case DT_ACT: return CUDA_R_16BF;
        case DT_E4M3: return CUDA_R_8F_E4M3;
        case DT_E5M2: return CUDA_R_8F_E5M2;
    }
    die("unknown GEMM operand type %d", (int)t);
}

/* Largest power of two (capped at 256) dividing the address: what cuBLASLt may assume of the pointer. */
static inline unsigned int gemm_alignment(const void* p) {
    uintptr_t a = (uintptr_t)p;
    unsigned int align = 1;
    while (align < GEMM_MAX_ALIGNMENT && a % (2 * align) == 0) align *= 2;
    return align;
}

static inline void gemm_plan_free(GemmPlan* p) {
    if (!p->used) return;
    cublasCheck(cublasLtMatrixLayoutDestroy(p->a_layout));
    cublasCheck(cublasLtMatrixLayoutDestroy(p->b_layout));
    cublasCheck(cublasLtMatrixLayoutDestroy(p->d_layout));
    cublasCheck(cublasLtMatmulDescDestroy(p->desc));
    p->used = 0;
}

static inline int gemm_plan_matches(const GemmPlan* p, const GemmPlan* key) {
    return p->used && p->dt == key->dt && p->at == key->at && p->bt == key->bt && p->transA == key->transA &&
           p->transB == key->transB && p->m == key->m && p->n == key->n && p->k == key->k &&
           p->accumulate == key->accumulate && p->fast_accum == key->fast_accum && p->align_a == key->align_a &&
           p->align_b == key->align_b && p->align_d == key->align_d;
}

/* Builds the descriptors of `key` and asks the heuristic for an algorithm; stops naming the GEMM if none. */
static inline void gemm_plan_build(GemmPlan* p, const GemmPlan* key) {
    *p = *key;
    cublasCheck(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t op_a = p->transA ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = p->transB ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasCheck(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
    cublasCheck(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
    if (dtype_is_fp8(p->at)) {
        int8_t fast = p->fast_accum ? 1 : 0;
        cublasCheck(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof(fast)));
        /* Scale pointers are set before the heuristic query, as Transformer Engine does: cuBLASLt does not
           promise that an algorithm chosen without them works with them (XLA got wrong results and errors
           with cuBLASLt 12.8 until it set them first: openxla/xla#40747). The value does not matter to
           the choice; gemm_cublaslt overwrites both pointers on every call. No C/D scale: D is never FP8. */
        cublasCheck(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &g_gemm_unit_scale,
                                                   sizeof(g_gemm_unit_scale)));
        cublasCheck(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &g_gemm_unit_scale,
                                                   sizeof(g_gemm_unit_scale)));
    }
    /* column-major layouts: op(A) m x k stored (transA ? k x m : m x k), op(B) k x n likewise, D m x n */
    uint64_t a_rows = p->transA ? p->k : p->m, a_cols = p->transA ? p->m : p->k;
    uint64_t b_rows = p->transB ? p->n : p->k, b_cols = p->transB ? p->k : p->n;
    cublasCheck(cublasLtMatrixLayoutCreate(&p->a_layout, gemm_cuda_type(p->at), a_rows, a_cols, (int64_t)a_rows));
    cublasCheck(cublasLtMatrixLayoutCreate(&p->b_layout, gemm_cuda_type(p->bt), b_rows, b_cols, (int64_t)b_rows));
    cublasCheck(cublasLtMatrixLayoutCreate(&p->d_layout, gemm_cuda_type(p->dt), p->m, p->n, (int64_t)p->m));

    cublasLtMatmulPreference_t pref;
    cublasCheck(cublasLtMatmulPreferenceCreate(&pref));
    uint64_t workspace = CUBLASLT_WORKSPACE_BYTES;
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                                     sizeof(workspace)));
    uint32_t aligns[4] = {p->align_a, p->align_b, p->align_d, p->align_d};
    cublasLtMatmulPreferenceAttributes_t align_attrs[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4; i++)
        cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, align_attrs[i], &aligns[i], sizeof(aligns[i])));
    uint32_t reduction = gemm_reduction_mask(p->dt);
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &reduction,
                                                     sizeof(reduction)));
    cublasLtMatmulHeuristicResult_t result;
    int found = 0;
    cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(g_cublaslt, p->desc, p->a_layout, p->b_layout, p->d_layout,
                                                           p->d_layout, pref, 1, &result, &found);
    cublasCheck(cublasLtMatmulPreferenceDestroy(pref));
    if (status != CUBLAS_STATUS_NOT_SUPPORTED) cublasCheck(status);
    /* the heuristic can return a result whose own state says it is unusable (cuBLASLt docs, cublasLtMatmulHeuristicResult_t) */
    if (status == CUBLAS_STATUS_NOT_SUPPORTED || found == 0 || result.state != CUBLAS_STATUS_SUCCESS)
        die("cuBLASLt has no algorithm for the GEMM m %zu n %zu k %zu, A %s%s, B %s%s, D %s%s, fast_accum %d "
            "(pointer alignments A %u B %u D %u bytes)",
            p->m, p->n, p->k, dtype_name(p->at), p->transA ? "^T" : "", dtype_name(p->bt), p->transB ? "^T" : "",
            dtype_name(p->dt), p->accumulate ? " +=" : "", p->fast_accum, p->align_a, p->align_b, p->align_d);
    p->algo = result.algo;
    p->used = 1;
}

/* The cached plan for `key`, built on first use (replacing the oldest when the table is full). */
static inline GemmPlan* gemm_plan_get(const GemmPlan* key) {
    for (int i = 0; i < GEMM_CACHE_SIZE; i++) {
        if (gemm_plan_matches(&g_gemm_plans[i], key)) return &g_gemm_plans[i];
    }
    GemmPlan* p = NULL;
    for (int i = 0; i < GEMM_CACHE_SIZE && p == NULL; i++) {
        if (!g_gemm_plans[i].used) p = &g_gemm_plans[i];
    }
    if (p == NULL) {
        p = &g_gemm_plans[g_gemm_next_victim];
        g_gemm_next_victim = (g_gemm_next_victim + 1) % GEMM_CACHE_SIZE;
        gemm_plan_free(p);
    }
    gemm_plan_build(p, key);
    return p;
}

/*
 * Runs g (gemm.h: column-major, cuBLASLt semantics) on device memory: D (m x n) = scale_a * scale_b *
 * op(A) op(B) [+ D] with FP32 accumulation; for FP8 operands the scale_inv pointers are DEVICE pointers.
 * Stops with gemm_check's reason for a GEMM cuBLASLt cannot run, and names the shape when the heuristic
 * finds no algorithm. Asynchronous (default stream).
 */
static inline void gemm_cublaslt(const GemmCall* g) {
    char why[256];
    if (gemm_check(g, why, sizeof(why))) die("%s", why);
    int fp8 = dtype_is_fp8(g->a.dtype);
    GemmPlan key;
    memset(&key, 0, sizeof(key));
    key.dt = g->d_type;
    key.at = g->a.dtype;
    key.bt = g->b.dtype;
    key.transA = g->trans_a ? 1 : 0;
    key.transB = g->trans_b ? 1 : 0;
    key.m = g->m;
    key.n = g->n;
    key.k = g->k;
    key.accumulate = g->accumulate ? 1 : 0;
    key.fast_accum = fp8 && g->fast_accum ? 1 : 0;
    key.align_a = gemm_alignment(g->a.data);
    key.align_b = gemm_alignment(g->b.data);
    key.align_d = gemm_alignment(g->d);
    key.used = 1;
    GemmPlan* p = gemm_plan_get(&key);
    if (fp8) {
        /* the pointers change per call (one Fp8Scale per operand), replacing the plan's unit scale; the
           algorithm was chosen with scale pointers set, so it supports them */
        cublasCheck(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &g->a.scale_inv,
                                                   sizeof(g->a.scale_inv)));
        cublasCheck(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &g->b.scale_inv,
                                                   sizeof(g->b.scale_inv)));
    }
    float alpha = 1.0f, beta = g->accumulate ? 1.0f : 0.0f;
    cublasCheck(cublasLtMatmul(g_cublaslt, p->desc, &alpha, g->a.data, p->a_layout, g->b.data, p->b_layout, &beta, g->d,
                               p->d_layout, g->d, p->d_layout, &p->algo, g_cublaslt_workspace, CUBLASLT_WORKSPACE_BYTES, 0));
}
