/*
 * Family gemm (fp8/gemm_cublaslt.cuh): op_gemm in BF16 and FP8, fprop, dgrad and wgrad.
 */
#pragma once

#include "common.cuh"

/* One GEMM on both sides: the same call on host operands (CPU) and device operands (GPU); D is set by kc_gemm_run. */
typedef struct {
    const char* name;
    GemmCall cpu, gpu;
    const float* D0; /* initial FP32 D when accumulating */
    double rel_l2_tol, max_abs_frac;
} KcGemm;

/* CPU multiply-adds allowed for one GEMM comparison, with and without BLAS (cpu_reference.h). */
static inline double kc_gemm_cpu_work(void) { return cpu_ref_has_blas() ? CPU_REF_GEMM_WORK_BLAS : CPU_REF_GEMM_WORK_LOOP; }

/*
 * Runs g on both sides and compares D. When m n k exceeds kc_gemm_cpu_work() the CPU computes only the first
 * nc columns of D (nc rows of the row-major output: op(B) restricted to its first nc columns), compared
 * with the same columns of the full-size GPU D, all of which must be finite.
 */
static inline int kc_gemm_run(const KcGemm* g, int iters) {
    GemmCall cpu = g->cpu, gpu = g->gpu;
    size_t nd = gpu.m * gpu.n;
    size_t elem = gpu.d_type == DT_F32 ? sizeof(float) : sizeof(act_t);
    double mk = (double)gpu.m * gpu.k;
    /* a multiple of 16, as FP8 GEMM dimensions must be (gemm_check runs on the CPU side too) */
    size_t nc = gpu.n;
    double work = kc_gemm_cpu_work();
    if (mk * gpu.n > work) nc = (size_t)fmin((double)gpu.n, 16.0 * fmax(1.0, floor(work / mk / 16.0)));
    float* B_sub = NULL;
    if (nc < gpu.n && cpu.trans_b) {
        /* op(B) = B^T with B (n x k, ld n): its first nc columns are the first nc rows of B, re-packed with ld nc */
        if (cpu.b.dtype != DT_ACT) die("kernel case %s: transposed B must be BF16", g->name);
        B_sub = kc_host(nc * cpu.k);
        const float* b = (const float*)cpu.b.data;
#pragma omp parallel for schedule(static)
        for (size_t p = 0; p < cpu.k; p++) memcpy(B_sub + p * nc, b + p * gpu.n, nc * sizeof(float));
        cpu.b.data = B_sub;
    }
    cpu.n = nc;
    size_t ndc = cpu.m * nc;
    float* ref = kc_host(ndc);
    void* d = dev_alloc(nd * elem);
    if (gpu.accumulate) {
        if (gpu.d_type != DT_F32) die("kernel case %s: accumulation is checked into FP32 only", g->name);
        memcpy(ref, g->D0, ndc * sizeof(float));
        dev_upload(d, g->D0, nd * sizeof(float));
    } else {
        kc_nan_fill(ref, ndc);
        kc_poison(d, nd * elem);
    }
    cpu.d = ref;
    gpu.d = d;
    cpu_ref_gemm(&cpu);
    op_gemm(&gpu);
    float* got = gpu.d_type == DT_F32 ? kc_get_f32((const float*)d, nd) : kc_get_act((const act_t*)d, nd);
    int failed = 0;
    if (nc < gpu.n) {
        size_t nonfinite = kc_count_nonfinite(got, nd);
        printf("    %s: CPU reference on columns 0..%zu of %zu; full-size GPU output: %zu non-finite of %zu, tol 0%s\n", g->name,
               nc - 1, gpu.n, nonfinite, nd, nonfinite ? "  FAIL" : "");
        failed += nonfinite != 0;
    }
    failed += kc_compare_norm(g->name, got, ref, ndc, g->rel_l2_tol, g->max_abs_frac);
    kc_time(g->name, iters, 0.0, 2.0 * gpu.m * gpu.n * (double)gpu.k, [&] { op_gemm(&gpu); });
    free(got);
    free(ref);
    free(B_sub);
    dev_free(d);
    return failed;
}

/* Smallest rel L2 tolerance of a fast-accumulating FP8 GEMM, and its growth per unit of k (see below). */
#define KC_FP8_FAST_ACCUM_MIN_REL 2e-2
#define KC_FP8_FAST_ACCUM_REL_PER_K 0x1p-16

/*
 * Tolerances (rel L2, max abs as a fraction of max|cpu|) of an FP8 GEMM against the CPU emulation, which
 * multiplies the dequantized operands exactly and accumulates in FP32; what differs is the summation order,
 * the tensor cores' accumulator, and the final BF16 rounding of a BF16 D (up to 1 ulp, 2^-8 relative).
 *   Without fast accumulation (dgrad, wgrad) cuBLASLt promotes the partial sums to FP32 every few k-blocks,
 *     so only the short in-block sums run at reduced precision and the error does not grow with k:
 *     rel L2 1e-2 (BF16 D) / 5e-3 (FP32 D), max abs 3e-2 / 2e-2.
 *   With fast accumulation (fprop) the whole k-reduction stays in the tensor cores' accumulator, which
 *     keeps about 14 significant bits and truncates (DeepSeek-V3 technical report, section 3.3.2: nearly 2%
 *     maximum relative error at k 4096), so the error grows with k. A model that truncates the running sum
 *     to 13 mantissa bits after every 4 products gives, on these cases' inputs, rel L2 2.0e-2 at k 4096 and
 *     7.2e-2 at k 13824 (about 5e-6 k, and DeepSeek's figure at 4096): the tolerance is 3x that,
 *     k * 2^-16, at least 2e-2 (small k), with max abs 3x the rel L2 tolerance.
 * A wrong layout, operand or scale gives errors of order 1.
 */
static inline void kc_fp8_gemm_tolerance(const GemmCall* g, double* rel_l2, double* max_abs_frac) {
    if (g->fast_accum) {
        *rel_l2 = fmax(KC_FP8_FAST_ACCUM_MIN_REL, (double)g->k * KC_FP8_FAST_ACCUM_REL_PER_K);
        *max_abs_frac = 3.0 * *rel_l2;
    } else if (g->d_type == DT_ACT) {
        *rel_l2 = 1e-2;
        *max_abs_frac = 3e-2;
    } else {
        *rel_l2 = 5e-3;
        *max_abs_frac = 2e-2;
    }
}

/* An FP8 GEMM comparison with kc_fp8_gemm_tolerance's tolerances. */
static inline KcGemm kc_fp8_gemm(const char* name, GemmCall cpu, GemmCall gpu, const float* D0) {
    KcGemm g = {name, cpu, gpu, D0, 0.0, 0.0};
    kc_fp8_gemm_tolerance(&gpu, &g.rel_l2_tol, &g.max_abs_frac);
    return g;
}

/*
 * The three GEMMs of a linear layer X (N, C) -> Y (N, OC) with OC = F (the w1 shape), in BF16 and in FP8
 * (docs/design.md#the-operand-map). The FP8 operands, their transposes and scales come from the CPU cast
 * (cpu_ref_amax + cpu_ref_cast_transpose) and are uploaded, so both sides multiply the same codes; the
 * GPU gets scale_inv through device pointers.
 *
 * Tolerances. Products of BF16 (or FP8) values are exact in FP32 on both sides; what differs is the
 * summation order, the tensor cores' accumulator, and the final BF16 rounding of a BF16 D (up to 1 ulp,
 * 2^-8 relative, where a rounding boundary falls between the two sums):
 *   BF16 -> BF16: rel L2 5e-3, max abs 2e-2 x max|cpu| (2 BF16 ulps at the largest value);
 *   BF16 -> FP32 (+=): FP32 accumulators in both, ~1e-6: rel L2 1e-4, max abs 1e-3 x max|cpu|;
 *   FP8: kc_fp8_gemm_tolerance.
 */
static int kc_case_gemm(const KernelShape* s, int iters, uint64_t seed) {
    uint64_t stream = seed;
    int failed = 0;
    size_t N = (size_t)s->B * s->T, C = (size_t)s->C, OC = (size_t)s->F;
    size_t NC = N * C, OCC = OC * C, NOC = N * OC;
    KcSet set = {};
    KcBuf* X = kc_input(&set, NC, splitmix64(&stream), 0.0f, 1.0f, KC_BF16);
    KcBuf* W = kc_input(&set, OCC, splitmix64(&stream), 0.0f, 0.02f, KC_BF16);
    KcBuf* dY = kc_input(&set, NOC, splitmix64(&stream), 0.0f, 1e-3f, KC_BF16);
    KcBuf* dW0 = kc_input(&set, OCC, splitmix64(&stream), 0.0f, 1e-2f, KC_HOST); /* the wgrad's initial FP32 D */

    /* FP8 operands: W, X E4M3 (forward), dY E5M2 (gradient), each with its transpose */
    Fp8Scale sc[3];
    uint8_t* W8 = (uint8_t*)mallocCheck(OCC);
    uint8_t* W8t = (uint8_t*)mallocCheck(OCC);
    uint8_t* X8 = (uint8_t*)mallocCheck(NC);
    uint8_t* X8t = (uint8_t*)mallocCheck(NC);
    uint8_t* dY8 = (uint8_t*)mallocCheck(NOC);
    uint8_t* dY8t = (uint8_t*)mallocCheck(NOC);
    cpu_ref_amax(&sc[0], W->h, OCC);
    cpu_ref_cast_transpose(W8, W8t, W->h, OC, C, FP8_E4M3, &sc[0], 0, NULL);
    cpu_ref_amax(&sc[1], X->h, NC);
    cpu_ref_cast_transpose(X8, X8t, X->h, N, C, FP8_E4M3, &sc[1], 0, NULL);
    cpu_ref_amax(&sc[2], dY->h, NOC);
    cpu_ref_cast_transpose(dY8, dY8t, dY->h, N, OC, FP8_E5M2, &sc[2], 0, NULL);
    uint8_t* d_W8 = (uint8_t*)kc_dev_bytes(W8, OCC);
    uint8_t* d_W8t = (uint8_t*)kc_dev_bytes(W8t, OCC);
    uint8_t* d_X8 = (uint8_t*)kc_dev_bytes(X8, NC);
    uint8_t* d_X8t = (uint8_t*)kc_dev_bytes(X8t, NC);
    uint8_t* d_dY8 = (uint8_t*)kc_dev_bytes(dY8, NOC);
    uint8_t* d_dY8t = (uint8_t*)kc_dev_bytes(dY8t, NOC);
    Fp8Scale* d_sc = (Fp8Scale*)kc_dev_bytes(sc, sizeof(sc));

    /* host and device views of every operand: the same values, so both sides multiply the same numbers */
    GemmOperand hW = gemm_operand(W->h, DT_ACT), hX = gemm_operand(X->h, DT_ACT), hdY = gemm_operand(dY->h, DT_ACT);
    GemmOperand gW = gemm_operand(W->a, DT_ACT), gX = gemm_operand(X->a, DT_ACT), gdY = gemm_operand(dY->a, DT_ACT);
    GemmOperand hW8 = gemm_operand_fp8(W8, DT_E4M3, &sc[0].scale_inv), gW8 = gemm_operand_fp8(d_W8, DT_E4M3, &d_sc[0].scale_inv);
    GemmOperand hW8t = gemm_operand_fp8(W8t, DT_E4M3, &sc[0].scale_inv), gW8t = gemm_operand_fp8(d_W8t, DT_E4M3, &d_sc[0].scale_inv);
    GemmOperand hX8 = gemm_operand_fp8(X8, DT_E4M3, &sc[1].scale_inv), gX8 = gemm_operand_fp8(d_X8, DT_E4M3, &d_sc[1].scale_inv);
    GemmOperand hX8t = gemm_operand_fp8(X8t, DT_E4M3, &sc[1].scale_inv), gX8t = gemm_operand_fp8(d_X8t, DT_E4M3, &d_sc[1].scale_inv);
    GemmOperand hdY8 = gemm_operand_fp8(dY8, DT_E5M2, &sc[2].scale_inv), gdY8 = gemm_operand_fp8(d_dY8, DT_E5M2, &d_sc[2].scale_inv);
    GemmOperand hdY8t = gemm_operand_fp8(dY8t, DT_E5M2, &sc[2].scale_inv), gdY8t = gemm_operand_fp8(d_dY8t, DT_E5M2, &d_sc[2].scale_inv);
    const KcGemm gemms[] = {
        {"gemm bf16 fprop TN (N,OC)=X.W^T", gemm_fprop(NULL, DT_ACT, hW, hX, N, C, OC), gemm_fprop(NULL, DT_ACT, gW, gX, N, C, OC),
         NULL, 5e-3, 2e-2},
        {"gemm bf16 dgrad NN (N,C)=dY.W", gemm_dgrad(NULL, DT_ACT, hW, hdY, N, C, OC), gemm_dgrad(NULL, DT_ACT, gW, gdY, N, C, OC),
         NULL, 5e-3, 2e-2},
        {"gemm bf16 wgrad NT (OC,C)+=dY^T.X f32", gemm_wgrad(NULL, hX, hdY, N, C, OC), gemm_wgrad(NULL, gX, gdY, N, C, OC), dW0->h,
         1e-4, 1e-3},
        kc_fp8_gemm("gemm fp8 fprop E4M3xE4M3 fast_accum bf16", gemm_fprop(NULL, DT_ACT, hW8, hX8, N, C, OC),
                    gemm_fprop(NULL, DT_ACT, gW8, gX8, N, C, OC), NULL),
        kc_fp8_gemm("gemm fp8 dgrad E4M3xE5M2 bf16", gemm_dgrad(NULL, DT_ACT, hW8t, hdY8, N, C, OC),
                    gemm_dgrad(NULL, DT_ACT, gW8t, gdY8, N, C, OC), NULL),
        kc_fp8_gemm("gemm fp8 wgrad E4M3xE5M2 f32 +=", gemm_wgrad(NULL, hX8t, hdY8t, N, C, OC),
                    gemm_wgrad(NULL, gX8t, gdY8t, N, C, OC), dW0->h),
    };
    printf("    X (%zu, %zu), W (%zu, %zu), dY (%zu, %zu); FP8 scales W %.6g X %.6g dY %.6g\n", N, C, OC, C, N, OC, sc[0].scale,
           sc[1].scale, sc[2].scale);
    for (size_t i = 0; i < sizeof(gemms) / sizeof(gemms[0]); i++) failed += kc_gemm_run(&gemms[i], iters);

    kc_set_free(&set);
    free(W8);
    free(W8t);
    free(X8);
    free(X8t);
    free(dY8);
    free(dY8t);
    dev_free(d_W8);
    dev_free(d_W8t);
    dev_free(d_X8);
    dev_free(d_X8t);
    dev_free(d_dY8);
    dev_free(d_dY8t);
    dev_free(d_sc);
    return failed;
}
