/*
 * Times the CPU reference's share of test_llama's production-shape checks on this machine, no GPU
 * needed: what the CPU does in prod_fp8_linear_7b / _13b (per linear layer: BF16-valued normal fills of
 * W, X, dY and dW0, the amax and cast-transpose of each, and the emulated FP8 fprop, dgrad and wgrad on
 * the columns kc_gemm_run computes within CPU_REF_GEMM_WORK_*) and in each prod_attention check (fills of
 * qkv and dout, then the forward and backward on the kv heads that fit CPU_REF_ATT_WORK, as
 * kc_attention_compare slices them). scripts/device_check.sh's header budgets its phases from these
 * numbers; the device runs the CPU side built with BLAS=none (no OpenBLAS there) on 16 cores.
 *   make build/time_cpu_reference [BLAS=none]; build/time_cpu_reference [linear_7b|linear_13b|attention]...
 * Prints one line per part with its wall seconds and OpenMP's thread count.
 */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../../core/common.h"
#include "../../core/rng.h"
#include "../../fp8/fp8.h"
#include "../../fp8/gemm.h"
#include "../../llama/config.h"
#include "cpu_reference.h"

/* The production checks' micro-batch (test_llama.cu PROD_B, PROD_T). */
#define PROD_TOKENS 4096
#define FILL_CHUNK ((size_t)1 << 16)

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static float* host(size_t n) { return (float*)mallocCheck(n * sizeof(float)); }

/* x (n) = N(0, std^2) rounded to BF16 values, in chunks of independent streams over the OpenMP threads
   (the cost of kernel_cases.cuh's kc_fill_normal; the values need not be the same). */
static void fill_normal(float* x, size_t n, uint64_t seed, float std) {
    size_t chunks = ceil_div(n, FILL_CHUNK);
#pragma omp parallel for schedule(static)
    for (size_t k = 0; k < chunks; k++) {
        Rng r;
        rng_seed(&r, seed ^ (k * 0x9e3779b97f4a7c15ull));
        size_t end = (k + 1) * FILL_CHUNK < n ? (k + 1) * FILL_CHUNK : n;
        for (size_t i = k * FILL_CHUNK; i < end; i++) x[i] = bf16_round(std * rng_normal(&r));
    }
}

static double g_part_start;
static void part_begin(void) { g_part_start = now(); }
static double part_end(double* total, const char* what) {
    double s = now() - g_part_start;
    *total += s;
    printf("  %-44s %7.2f s\n", what, s);
    fflush(stdout);
    return s;
}

/* An operand cast on the CPU: codes in both layouts and its scale. */
typedef struct {
    uint8_t *codes, *codes_t;
    Fp8Scale scale;
} Operand;

static void cast(Operand* o, const float* x, size_t rows, size_t cols, Fp8Format f) {
    o->codes = (uint8_t*)mallocCheck(rows * cols);
    o->codes_t = (uint8_t*)mallocCheck(rows * cols);
    cpu_ref_amax(&o->scale, x, rows * cols);
    o->scale.nonfinite = 0.0f;
    cpu_ref_cast_transpose(o->codes, o->codes_t, x, rows, cols, f, &o->scale, 0, NULL);
}

/* g on the first columns of D that the comparison's CPU work allows (kc_gemm_run's rule; every FP8 GEMM
   of the recipe has an untransposed B, so its first nc columns are the first nc k-long rows). */
static size_t gemm_on_columns(GemmCall g, const float* D0) {
    double work = cpu_ref_has_blas() ? CPU_REF_GEMM_WORK_BLAS : CPU_REF_GEMM_WORK_LOOP, mk = (double)g.m * (double)g.k;
    size_t nc = g.n;
    if (mk * (double)g.n > work) nc = (size_t)fmin((double)g.n, 16.0 * fmax(1.0, floor(work / mk / 16.0)));
    g.n = nc;
    float* d = host(g.m * nc);
    if (g.accumulate) memcpy(d, D0, g.m * nc * sizeof(float));
    g.d = d;
    cpu_ref_gemm(&g);
    free(d);
    return nc;
}

static double time_linear(const char* preset) {
    const LlamaConfig* c = llama_preset(preset);
    size_t N = PROD_TOKENS, C = (size_t)c->dim, F = (size_t)c->ffn_dim;
    size_t QKV = C + 2 * (size_t)llama_kv_dim(c);
    const char* names[4] = {"wqkv", "wo", "w13", "w2"};
    size_t dims[4][2] = {{QKV, C}, {C, C}, {2 * F, C}, {C, F}}; /* (OC, C) as llama_linear_dims gives them */
    double total = 0.0;
    printf("prod_fp8_linear %s, N %zu (%s, %d threads)\n", preset, N, cpu_ref_has_blas() ? "OpenBLAS" : "BLAS=none",
           omp_get_max_threads());
    for (int lin = 0; lin < 4; lin++) {
        size_t OC = dims[lin][0], IC = dims[lin][1];
        char what[96];
        part_begin();
        float* w = host(OC * IC);
        float* x = host(N * IC);
        float* dy = host(N * OC);
        float* dw0 = host(OC * IC);
        fill_normal(w, OC * IC, 1, 0.02f);
        fill_normal(x, N * IC, 2, 1.0f);
        fill_normal(dy, N * OC, 3, 1e-3f);
        fill_normal(dw0, OC * IC, 4, 1e-2f);
        snprintf(what, sizeof(what), "%s (%zu, %zu): fills", names[lin], OC, IC);
        part_end(&total, what);
        part_begin();
        Operand ow, ox, ody;
        cast(&ow, w, OC, IC, FP8_E4M3);
        cast(&ox, x, N, IC, FP8_E4M3);
        cast(&ody, dy, N, OC, FP8_E5M2);
        snprintf(what, sizeof(what), "%s: amax + cast-transpose of W, X, dY", names[lin]);
        part_end(&total, what);
        GemmCall calls[3] = {
            gemm_fprop(NULL, DT_ACT, gemm_operand_fp8(ow.codes, DT_E4M3, &ow.scale.scale_inv),
                       gemm_operand_fp8(ox.codes, DT_E4M3, &ox.scale.scale_inv), N, IC, OC),
            gemm_dgrad(NULL, DT_ACT, gemm_operand_fp8(ow.codes_t, DT_E4M3, &ow.scale.scale_inv),
                       gemm_operand_fp8(ody.codes, DT_E5M2, &ody.scale.scale_inv), N, IC, OC),
            gemm_wgrad(NULL, gemm_operand_fp8(ox.codes_t, DT_E4M3, &ox.scale.scale_inv),
                       gemm_operand_fp8(ody.codes_t, DT_E5M2, &ody.scale.scale_inv), N, IC, OC),
        };
        const char* kinds[3] = {"fprop", "dgrad", "wgrad"};
        for (int g = 0; g < 3; g++) {
            part_begin();
            size_t nc = gemm_on_columns(calls[g], dw0);
            snprintf(what, sizeof(what), "%s %s m %zu n %zu of %zu k %zu", names[lin], kinds[g], calls[g].m, nc, calls[g].n,
                     calls[g].k);
            part_end(&total, what);
        }
        free(w);
        free(x);
        free(dy);
        free(dw0);
        Operand* ops[3] = {&ow, &ox, &ody};
        for (int i = 0; i < 3; i++) {
            free(ops[i]->codes);
            free(ops[i]->codes_t);
        }
    }
    printf("prod_fp8_linear %s: %.1f s of CPU work\n", preset, total);
    return total;
}

/* One prod_attention check's CPU side: Llama-2 7B's heads (NH = NKV 32, HS 128) at T 4096. */
static double time_attention(void) {
    const LlamaConfig* c = llama_preset("llama2-7b");
    int T = PROD_TOKENS, NH = c->n_heads, HS = llama_head_dim(c);
    size_t C = (size_t)NH * HS, QKV = 3 * C;
    double fit = floor(CPU_REF_ATT_WORK / ((double)T * T * HS));
    int NHc = fit < 1.0 ? 1 : fit > NH ? NH : (int)fit;
    size_t Cc = (size_t)NHc * HS, QKVc = 3 * Cc;
    double total = 0.0;
    printf("prod_attention: T %d, HS %d, CPU on %d of %d heads (%d threads)\n", T, HS, NHc, NH, omp_get_max_threads());
    part_begin();
    float* qkv = host((size_t)T * QKV);
    float* dout = host((size_t)T * C);
    fill_normal(qkv, (size_t)T * QKV, 5, 1.0f);
    fill_normal(dout, (size_t)T * C, 6, 1.0f);
    part_end(&total, "fills of qkv, dout (full size)");
    float* qkv_c = host((size_t)T * QKVc);
    float* out_c = host((size_t)T * Cc);
    float* dqkv_c = host((size_t)T * QKVc);
    float* probs = host(cpu_ref_att_stats_size(1, NHc, T));
    for (int t = 0; t < T; t++) /* q, k, v of heads 0..NHc-1, in qkv's row layout */
        for (int part = 0; part < 3; part++)
            memcpy(qkv_c + (size_t)t * QKVc + part * Cc, qkv + (size_t)t * QKV + part * C, Cc * sizeof(float));
    part_begin();
    cpu_ref_attention_forward(out_c, probs, qkv_c, 1, T, NHc, NHc, HS);
    part_end(&total, "attention forward on the slice");
    part_begin();
    cpu_ref_attention_backward(dqkv_c, dout, qkv_c, out_c, probs, 1, T, NHc, NHc, HS);
    part_end(&total, "attention backward on the slice");
    printf("prod_attention: %.1f s of CPU work per check\n", total);
    free(qkv);
    free(dout);
    free(qkv_c);
    free(out_c);
    free(dqkv_c);
    free(probs);
    return total;
}

int main(int argc, char** argv) {
    cpu_ref_init(PRECISION_BF16);
    const char* all[] = {"linear_7b", "linear_13b", "attention"};
    int n = argc > 1 ? argc - 1 : 3;
    for (int i = 0; i < n; i++) {
        const char* what = argc > 1 ? argv[i + 1] : all[i];
        if (strcmp(what, "linear_7b") == 0) time_linear("llama2-7b");
        else if (strcmp(what, "linear_13b") == 0) time_linear("llama2-13b");
        else if (strcmp(what, "attention") == 0) time_attention();
        else die("unknown part '%s' (linear_7b, linear_13b, attention)", what);
    }
    return 0;
}
