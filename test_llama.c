/*
 * test_llama_cpu: checks of the CPU reference build. It includes the trainer under TESTING and drives the
 * same model, optimizer, data and checkpoint code against independent references: HF transformers'
 * float64 run (dev/reference/), float64 GEMMs, error bounds derived from the FP8 formats, and rules
 * written out from the OCP FP8 spec. `./test_llama_cpu --list` names the checks, `--only NAME` runs one.
 * `--dump-run PREC OUT` writes this build's run of the HF reference batch, in the reference-state format:
 * what test_llama (GPU) compares the GPU with. (The codecs and other numerics the Python tests compare
 * with their references are reached through dev/tools/numerics.c.)
 * Random inputs are drawn from a fresh seed each run (printed; set LLM8_TEST_SEED to replay one).
 */
#define TESTING
#include "train_llama.c"              // the CPU trainer: backend, model, training program
#include "dev/test/reference_check.h" // defines: reference_check, check_*_in (model-level checks, both builds)
#include "dev/test/testing.h"         // defines: run_checks, fail, error_stats, RefState

static uint64_t g_seed;

/* A generator for one check, seeded from the run's seed and the check's own salt. */
static Rng test_rng(uint64_t salt) {
    Rng r;
    rng_seed(&r, g_seed ^ (salt * 0x9e3779b97f4a7c15ull));
    return r;
}

/* ------------------------------------------------------------ HF reference */

/* Tolerances: CPU_REF_TOL_* (dev/test/reference_check.h), with the errors they were set from. */
static int check_reference_fp32(void) { return reference_check(PRECISION_FP32, REF_STATE_PATH, CPU_REF_TOL_FP32); }

static int check_reference_bf16(void) { return reference_check(PRECISION_BF16, REF_STATE_PATH, CPU_REF_TOL_BF16); }

static int check_reference_fp8(void) { return reference_check(PRECISION_FP8, REF_STATE_PATH, CPU_REF_TOL_FP8); }

/* ------------------------------------------------------------ FP8 scaling policy */

static int has_nan_code(const uint8_t* codes, size_t n, Fp8Format f) {
    for (size_t i = 0; i < n; i++) {
        uint8_t c = codes[i] & 0x7f;
        if (f == FP8_E4M3 ? c == 0x7f : c > 0x7c) return 1;
    }
    return 0;
}

/* Casts x (rows, cols) with the policy; returns the codes (malloc'd) and fills *s. */
static uint8_t* policy_cast(const float* x, size_t rows, size_t cols, Fp8Format f, int pow2, Fp8Scale* s) {
    uint8_t* codes = (uint8_t*)mallocCheck(rows * cols);
    memset(codes, 0x7f, rows * cols); /* poison: a NaN code in both formats */
    op_amax(s, x, rows * cols);
    op_cast_transpose(codes, NULL, x, rows, cols, f, s, pow2, NULL);
    return codes;
}

static int check_fp8_scale_policy(void) {
    int failures = 0;
    enum { R = 4, K = 32 };
    float x[R * K];
    Rng rng = test_rng(1);
    for (int fmt = 0; fmt < 2; fmt++) {
        Fp8Format f = (Fp8Format)fmt;
        float fmax = f == FP8_E4M3 ? 448.0f : 57344.0f;
        Fp8Scale s;
        /* all zeros: scale 1, zero codes, not flagged */
        memset(x, 0, sizeof(x));
        uint8_t* c = policy_cast(x, R, K, f, 0, &s);
        if (s.scale != 1.0f || s.scale_inv != 1.0f || !fp8_amax_is_finite(s.amax)) failures += fail("%s all-zero: scale %g", fp8_format_name(f), s.scale);
        for (int i = 0; i < R * K; i++) if (!fp8_is_zero(c[i])) { failures += fail("%s all-zero: non-zero code", fp8_format_name(f)); break; }
        free(c);
        /* one zero row: scale = fmax / amax, the largest element lands exactly on +-max, zeros stay 0 */
        for (int i = 0; i < R * K; i++) x[i] = (rng_uniform(&rng) * 2.0f - 1.0f) * 3.0f;
        for (int j = 0; j < K; j++) x[2 * K + j] = 0.0f;
        float amax = 0.0f;
        int arg = 0;
        for (int i = 0; i < R * K; i++) if (fabsf(x[i]) > amax) { amax = fabsf(x[i]); arg = i; }
        c = policy_cast(x, R, K, f, 0, &s);
        if (s.amax != amax || s.scale != fmax / amax) failures += fail("%s zero row: amax %g scale %g, want %g %g", fp8_format_name(f), s.amax, s.scale, amax, fmax / amax);
        if (!fp8_is_max(c[arg], f)) failures += fail("%s zero row: largest element code 0x%02x is not +-max", fp8_format_name(f), c[arg]);
        for (int j = 0; j < K; j++) if (!fp8_is_zero(c[2 * K + j])) { failures += fail("%s zero row: zero row not cast to 0", fp8_format_name(f)); break; }
        if (has_nan_code(c, R * K, f)) failures += fail("%s zero row: NaN code", fp8_format_name(f));
        free(c);
        /* pow2: a power of two in (fmax / amax / 2, fmax / amax] */
        c = policy_cast(x, R, K, f, 1, &s);
        int e;
        float m = frexpf(s.scale, &e);
        if (m != 0.5f || s.scale > fmax / amax || 2.0f * s.scale <= fmax / amax) failures += fail("%s pow2: scale %g for fmax/amax %g", fp8_format_name(f), s.scale, fmax / amax);
        free(c);
        /* only a subnormal float32 non-zero: fmax / amax overflows, the scale clamps to FLT_MAX (finite) */
        memset(x, 0, sizeof(x));
        x[5] = 1e-40f;
        c = policy_cast(x, R, K, f, 0, &s);
        if (s.scale != FLT_MAX || !isfinite(s.scale_inv)) failures += fail("%s subnormal: scale %g (want FLT_MAX)", fp8_format_name(f), s.scale);
        if (fp8_is_zero(c[5]) || has_nan_code(c, R * K, f)) failures += fail("%s subnormal: code 0x%02x", fp8_format_name(f), c[5]);
        free(c);
        /* NaN and Inf: amax not finite (flagged), no NaN code reaches the GEMM */
        for (int i = 0; i < R * K; i++) x[i] = rng_uniform(&rng) - 0.5f;
        x[7] = NAN;
        c = policy_cast(x, R, K, f, 0, &s);
        if (fp8_amax_is_finite(s.amax)) failures += fail("%s NaN: amax %g not flagged", fp8_format_name(f), s.amax);
        if (has_nan_code(c, R * K, f)) failures += fail("%s NaN: a NaN code reached the GEMM operand", fp8_format_name(f));
        free(c);
        x[7] = -INFINITY;
        c = policy_cast(x, R, K, f, 0, &s);
        if (fp8_amax_is_finite(s.amax)) failures += fail("%s Inf: amax %g not flagged", fp8_format_name(f), s.amax);
        if (has_nan_code(c, R * K, f) || !fp8_is_max(c[7], f) || !(c[7] & 0x80)) failures += fail("%s Inf: code 0x%02x, want -max", fp8_format_name(f), c[7]);
        free(c);
    }
    return failures != 0;
}

/* A NaN weight is invisible to the FP8 GEMM (cast to 0) but must be flagged through its amax. */
static int check_fp8_nonfinite_flagged(void) {
    LlamaConfig cfg;
    checkpoint_read_config(REF_MODEL_PATH, &cfg);
    RefState r;
    ref_state_read(&r, REF_STATE_PATH, &cfg);
    backend_init(PRECISION_FP8);
    Llama m;
    ModelOptions o = model_options(PRECISION_FP8, r.B, r.T);
    llama_build(&m, &cfg, &o);
    float* params = (float*)mallocCheck(m.num_params * sizeof(float));
    checkpoint_read_params(REF_MODEL_PATH, &cfg, params);
    size_t offsets[NUM_PARAM_TENSORS];
    param_offsets(&cfg, offsets);
    params[offsets[P_WO] + (size_t)cfg.dim * cfg.dim + 17] = NAN; /* wo of layer 1 */
    llama_set_params(&m, params);
    float loss = llama_forward(&m, r.inputs, r.targets, r.B, r.T, 1.0f / (r.B * r.T));
    char what[128];
    int failures = 0;
    if (!llama_fp8_nonfinite(&m, what, sizeof(what))) failures += fail("NaN in wo[layer 1] not flagged (loss %f)", loss);
    else if (strcmp(what, "wo[layer 1] W") != 0) failures += fail("flagged '%s', want 'wo[layer 1] W'", what);
    else printf("    loss %f stays finite; flagged operand: %s\n", loss, what);
    /* X and dY flags are sticky over the micro-steps of a step: a NaN norm weight makes wqkv[layer 1]'s X
       non-finite in one forward; a later clean forward keeps the flag until llama_fp8_begin_step */
    size_t norm_nan = offsets[P_ATTN_NORM] + (size_t)cfg.dim + 5; /* attention norm of layer 1 */
    params[offsets[P_WO] + (size_t)cfg.dim * cfg.dim + 17] = 0.0f;
    params[norm_nan] = NAN;
    llama_set_params(&m, params);
    llama_fp8_begin_step(&m);
    llama_forward(&m, r.inputs, r.targets, r.B, r.T, 1.0f / (r.B * r.T));
    int flagged = llama_fp8_nonfinite(&m, what, sizeof(what));
    if (!flagged || strcmp(what, "wqkv[layer 1] X") != 0) failures += fail("NaN norm weight: flagged '%s', want 'wqkv[layer 1] X'", flagged ? what : "none");
    params[norm_nan] = 1.0f;
    llama_set_params(&m, params);
    llama_forward(&m, r.inputs, r.targets, r.B, r.T, 1.0f / (r.B * r.T));
    llama_backward(&m);
    flagged = llama_fp8_nonfinite(&m, what, sizeof(what));
    if (!flagged || strcmp(what, "wqkv[layer 1] X") != 0) failures += fail("a later finite micro-step cleared the flag (flagged '%s')", flagged ? what : "none");
    llama_fp8_begin_step(&m);
    llama_forward(&m, r.inputs, r.targets, r.B, r.T, 1.0f / (r.B * r.T));
    llama_backward(&m);
    if (llama_fp8_nonfinite(&m, what, sizeof(what))) failures += fail("after llama_fp8_begin_step, a finite step flagged '%s'", what);
    else printf("    NaN norm weight: flagged wqkv[layer 1] X, sticky over micro-steps, cleared by llama_fp8_begin_step\n");
    /* and a NaN gradient is named by its tensor and layer */
    llama_zero_grads(&m);
    float nan = NAN;
    dev_upload(m.layers[1].lin[LIN_W13].dweight + 3, &nan, sizeof(float));
    int bad;
    float norm = llama_grad_norm(&m, &bad);
    char name[64] = "none";
    if (bad >= 0) llama_segment_name(&m, bad, name, sizeof(name));
    if (isfinite(norm) || strcmp(name, "w13[layer 1]") != 0) failures += fail("NaN gradient: norm %f, named '%s', want w13[layer 1]", norm, name);
    free(params);
    llama_free(&m);
    ref_state_free(&r);
    return failures != 0;
}

/* ------------------------------------------------------------ FP8 GEMM */

/* Quantization error bound of one value: half an ULP at its binade, at least half the smallest subnormal. */
static double fp8_error_bound(double v, double scale, Fp8Format f) {
    double u = f == FP8_E4M3 ? 0x1p-4 : 0x1p-3;          /* half ULP relative: 2^-(mantissa bits + 1) */
    double h = (f == FP8_E4M3 ? 0x1p-9 : 0x1p-16) / 2.0; /* half the smallest subnormal */
    double e = fabs(v) * u;
    return (e > h / scale ? e : h / scale);
}

/*
 * The emulated FP8 GEMM (TN, FP32 out) against a float64 GEMM of the dequantized operands: equal to FP32
 * accumulation error. And against the float64 GEMM of the unquantized inputs: within the bound the two
 * formats' precision implies, sum_k (e_a |b| + |a| e_b + e_a e_b) (+ the FP32 term).
 */
static int gemm_case(Fp8Format fb, int m, int n, int k, Rng* rng) {
    float* a = (float*)mallocCheck((size_t)m * k * sizeof(float));
    float* b = (float*)mallocCheck((size_t)n * k * sizeof(float));
    for (size_t i = 0; i < (size_t)m * k; i++) a[i] = rng_normal(rng) * 0.05f;
    for (size_t i = 0; i < (size_t)n * k; i++) b[i] = rng_normal(rng) * (fb == FP8_E5M2 ? 1e-4f : 2.0f);
    a[3] = 0.0f;
    b[5] = 3e-9f; /* a value that underflows: the subnormal term of the bound must cover it */
    Fp8Scale sa, sb;
    uint8_t* qa = policy_cast(a, (size_t)m, (size_t)k, FP8_E4M3, 0, &sa);
    uint8_t* qb = policy_cast(b, (size_t)n, (size_t)k, fb, 0, &sb);
    float* d = (float*)mallocCheck((size_t)m * n * sizeof(float));
    for (size_t i = 0; i < (size_t)m * n; i++) d[i] = NAN;
    /* D (m, n) = A (m, k) B (n, k)^T: an fprop with OC = m, N = n, C = k */
    GemmCall g = gemm_fprop(d, DT_F32, gemm_operand_fp8(qa, DT_E4M3, &sa.scale_inv),
                            gemm_operand_fp8(qb, fb == FP8_E4M3 ? DT_E4M3 : DT_E5M2, &sb.scale_inv), (size_t)n, (size_t)k, (size_t)m);
    op_gemm(&g);
    int failures = 0;
    double worst_deq = 0.0, worst_q = 0.0, max_q_err = 0.0;
    for (int i = 0; i < m; i++) {
        for (int j = 0; j < n; j++) {
            double ref = 0.0, abs_sum = 0.0, exact = 0.0, bound = 0.0;
            for (int p = 0; p < k; p++) {
                double av = fp8_to_float(qa[(size_t)i * k + p], FP8_E4M3) * (double)sa.scale_inv;
                double bv = fp8_to_float(qb[(size_t)j * k + p], fb) * (double)sb.scale_inv;
                double ar = a[(size_t)i * k + p], br = b[(size_t)j * k + p];
                ref += av * bv;
                abs_sum += fabs(av * bv);
                exact += ar * br;
                double ea = fp8_error_bound(ar, sa.scale, FP8_E4M3), eb = fp8_error_bound(br, sb.scale, fb);
                bound += ea * fabs(br) + fabs(ar) * eb + ea * eb;
            }
            double got = d[(size_t)j * m + i]; /* D is column-major (m, n) */
            double fp32_bound = (k + 2) * 0x1p-24 * abs_sum;
            double deq_err = fabs(got - ref);
            if (!(deq_err <= fp32_bound) && failures < 3) failures += fail("D[%d,%d] = %.9g vs float64 %.9g of the dequantized operands (bound %.3g)", i, j, got, ref, fp32_bound);
            double q_err = fabs(got - exact);
            if (!(q_err <= bound + fp32_bound) && failures < 3) failures += fail("D[%d,%d]: error %.3g vs the unquantized GEMM exceeds the FP8 bound %.3g", i, j, q_err, bound + fp32_bound);
            if (fp32_bound > 0 && deq_err / fp32_bound > worst_deq) worst_deq = deq_err / fp32_bound;
            if (bound > 0 && q_err / bound > worst_q) worst_q = q_err / bound;
            if (q_err > max_q_err) max_q_err = q_err;
        }
    }
    printf("    E4M3 x %s (m %d, n %d, k %d): error vs dequantized float64 <= %.2f of the FP32 bound; vs unquantized <= %.2f of the FP8 bound (max %.3g)\n",
           fp8_format_name(fb), m, n, k, worst_deq, worst_q, max_q_err);
    if (max_q_err == 0.0) failures += fail("quantization changed nothing: the inputs do not exercise FP8 rounding");
    free(a);
    free(b);
    free(qa);
    free(qb);
    free(d);
    return failures;
}

static int check_fp8_gemm(void) {
    backend_init(PRECISION_FP32);
    Rng rng = test_rng(2);
    int failures = 0;
    failures += gemm_case(FP8_E4M3, 48, 32, 96, &rng);
    failures += gemm_case(FP8_E5M2, 32, 64, 160, &rng);
    /* the shape and layout rules cuBLASLt imposes are rejected, naming what is wrong */
    char why[256];
    float one = 1.0f;
    struct { DType a; int ta; DType b; int tb; size_t m, n, k; const char* expect; } bad[] = {
        {DT_E4M3, 1, DT_E4M3, 0, 100, 32, 32, "m = 100"},
        {DT_E4M3, 1, DT_E4M3, 0, 32, 40, 32, "n = 40"},
        {DT_E4M3, 1, DT_E5M2, 0, 32, 32, 8, "k = 8"},
        {DT_E4M3, 0, DT_E4M3, 0, 32, 32, 32, "TN layout"},
        {DT_E5M2, 1, DT_E5M2, 0, 32, 32, 32, "E5M2 x E5M2"},
        {DT_E4M3, 1, DT_ACT, 0, 32, 32, 32, "mixed operand types"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        GemmCall g = {NULL, DT_F32, 0, {NULL, bad[i].a, &one}, {NULL, bad[i].b, &one}, bad[i].ta, bad[i].tb, bad[i].m, bad[i].n, bad[i].k, 0, FP8_ACCUM_EXACT};
        if (!gemm_check(&g, why, sizeof(why)) || strstr(why, bad[i].expect) == NULL)
            failures += fail("bad GEMM %zu not rejected with '%s' (got '%s')", i, bad[i].expect, why);
    }
    /* the operand map's FP8 GEMMs of a linear layer (N 48, C 64, OC 32) pass */
    uint8_t codes[1];
    GemmOperand e4 = gemm_operand_fp8(codes, DT_E4M3, &one), e5 = gemm_operand_fp8(codes, DT_E5M2, &one);
    GemmCall ok[3] = {gemm_fprop(NULL, DT_ACT, e4, e4, 48, 64, 32), gemm_dgrad(NULL, DT_ACT, e4, e5, 48, 64, 32),
                      gemm_wgrad(NULL, e4, e5, 48, 64, 32)};
    for (int i = 0; i < 3; i++)
        if (gemm_check(&ok[i], why, sizeof(why))) failures += fail("valid FP8 GEMM %d of a linear layer rejected: %s", i, why);
    return failures != 0;
}

/*
 * The CPU GEMM's result does not depend on the OpenMP thread count (fp8/gemm_cpu.h's fixed tiles): the
 * same product on 1, 2, 3 and 5 threads, bit for bit, at shapes that are not multiples of the tiles or
 * of OpenBLAS's kernel blocks, in each transpose layout the model uses, plain and accumulating. A single
 * multi-threaded BLAS call fails this (OpenBLAS splits the work by the thread count, and the elements
 * at the seams of its splits are computed by other kernels).
 */
static int check_gemm_threads(void) {
    backend_init(PRECISION_FP32);
    Rng rng = test_rng(17);
    int failures = 0, saved = omp_get_max_threads();
    const int threads[] = {1, 2, 3, 5};
    struct { int ta, tb; size_t m, n, k; } shapes[] = {{1, 0, 613, 389, 301}, {0, 0, 257, 530, 611}, {0, 1, 340, 517, 499}};
    for (size_t c = 0; c < sizeof(shapes) / sizeof(shapes[0]); c++) {
        size_t m = shapes[c].m, n = shapes[c].n, k = shapes[c].k;
        float* a = (float*)mallocCheck(m * k * sizeof(float));
        float* b = (float*)mallocCheck(k * n * sizeof(float));
        float* d = (float*)mallocCheck(m * n * sizeof(float));
        float* first = (float*)mallocCheck(m * n * sizeof(float));
        for (size_t i = 0; i < m * k; i++) a[i] = rng_normal(&rng);
        for (size_t i = 0; i < k * n; i++) b[i] = rng_normal(&rng);
        for (int accumulate = 0; accumulate < 2; accumulate++) {
            for (size_t t = 0; t < sizeof(threads) / sizeof(threads[0]); t++) {
                omp_set_num_threads(threads[t]);
                for (size_t i = 0; i < m * n; i++) d[i] = accumulate ? (float)(i % 13) - 6.0f : NAN; /* poison when overwritten */
                GemmCall g = {d, DT_F32, accumulate, gemm_operand(a, DT_F32), gemm_operand(b, DT_F32), shapes[c].ta, shapes[c].tb,
                              m, n, k, 0, FP8_ACCUM_EXACT};
                gemm_cpu(&g);
                if (t == 0) {
                    memcpy(first, d, m * n * sizeof(float));
                    continue;
                }
                size_t differ = 0;
                for (size_t i = 0; i < m * n; i++) differ += memcmp(&d[i], &first[i], sizeof(float)) != 0;
                if (differ)
                    failures += fail("GEMM %zu x %zu x %zu (trans %d%d, accumulate %d): %zu of %zu outputs differ between 1 and %d threads",
                                     m, n, k, shapes[c].ta, shapes[c].tb, accumulate, differ, m * n, threads[t]);
            }
        }
        free(a);
        free(b);
        free(d);
        free(first);
    }
    omp_set_num_threads(saved);
    return failures != 0;
}

/* ------------------------------------------------------------ Hopper accumulation model */

/* The model's FP32 accumulator (scales 1) of one E4M3 x E4M3 dot product of K codes (K % 16 == 0): an
   fprop of a 16 x 16 output whose row 0 and column 0 hold a and b, the rest zeros. */
static float hopper_case_dot(const uint8_t* a, const uint8_t* b, size_t K, int fast) {
    const size_t R = 16;
    uint8_t* w = (uint8_t*)callocCheck(R * K, 1);
    uint8_t* x = (uint8_t*)callocCheck(R * K, 1);
    memcpy(w, a, K);
    memcpy(x, b, K);
    float one = 1.0f, d[16 * 16];
    GemmCall g = gemm_fprop(d, DT_F32, gemm_operand_fp8(w, DT_E4M3, &one), gemm_operand_fp8(x, DT_E4M3, &one), R, K, R);
    g.fast_accum = fast;
    g.accum = FP8_ACCUM_HOPPER;
    gemm_cpu(&g);
    free(w);
    free(x);
    return d[0];
}

/*
 * The model on products whose result the published semantics fix by hand (fp8/gemm_hopper.h), each
 * case failing for the model that lacks one rule: (a) products below 2^(E - 13) of the block's largest
 * are truncated away (a model keeping 14 bits, or none truncating, gives 1 + 31 2^-14); (b) the block
 * result keeps 13 fraction bits (2 + 2^-13 -> 2); (c) without fast accumulation the chain restarts every
 * 128 elements (fast: 256, the small products lost against the accumulator; slow: 257); (d) E4M3
 * subnormals take part with the clamped exponent -6. Then a random GEMM: bit-identical at 1, 2 and 3
 * threads, different from the exact path on most outputs, and within 2^-8 relative RMS of float64 (the
 * model measures 9e-4 here: truncation to 14 bits of the running sum, against 2^-24 for FP32).
 */
static int check_hopper_accum(void) {
    backend_init(PRECISION_FP32);
    const uint8_t ONE = 0x38, SIXTEEN = 0x58, P2M6 = 0x08, P2M7 = 0x04, P2M9 = 0x01; /* 1, 16, 2^-6, 2^-7, 2^-9 */
    int failures = 0;
    uint8_t a[256], b[256];
    struct { const char* what; float want_fast, want_slow; } cases[4] = {
        {"(a) 1 + 31 products of 2^-14", 1.0f, 1.0f},
        {"(b) 1 + 1 + 2^-13", 2.0f, 2.0f},
        {"(c) 256, then 128 products of 2^-7 past element 128", 256.0f, 257.0f},
        {"(d) 32 products of 2^-9 x 2^-6", 0x1p-10f, 0x1p-10f},
    };
    for (int c = 0; c < 4; c++) {
        size_t K = c == 2 ? 256 : 32;
        memset(a, 0, sizeof(a));
        memset(b, 0, sizeof(b));
        if (c == 0) {
            a[0] = b[0] = ONE;
            for (int i = 1; i < 32; i++) a[i] = b[i] = P2M7;
        } else if (c == 1) {
            a[0] = b[0] = a[1] = b[1] = ONE;
            a[2] = P2M6, b[2] = P2M7;
        } else if (c == 2) {
            a[0] = b[0] = SIXTEEN;
            for (int i = 128; i < 256; i++) a[i] = ONE, b[i] = P2M7;
        } else {
            for (int i = 0; i < 32; i++) a[i] = P2M9, b[i] = P2M6;
        }
        for (int fast = 1; fast >= 0; fast--) {
            float got = hopper_case_dot(a, b, K, fast), want = fast ? cases[c].want_fast : cases[c].want_slow;
            if (got != want) failures += fail("%s, fast accumulation %d: %.9g, want %.9g", cases[c].what, fast, got, want);
        }
    }

    const size_t M = 48, N = 32, K = 2048;
    Rng rng = test_rng(23);
    float* x = (float*)mallocCheck(N * K * sizeof(float));
    float* w = (float*)mallocCheck(M * K * sizeof(float));
    for (size_t i = 0; i < N * K; i++) x[i] = rng_normal(&rng) * (i % K == 7 ? 30.0f : 1.0f); /* an outlier channel */
    for (size_t i = 0; i < M * K; i++) w[i] = rng_normal(&rng) * 0.02f;
    Fp8Scale sx, sw;
    uint8_t* qx = policy_cast(x, N, K, FP8_E4M3, 0, &sx);
    uint8_t* qw = policy_cast(w, M, K, FP8_E4M3, 0, &sw);
    float* d[4];
    int saved = omp_get_max_threads();
    for (int r = 0; r < 4; r++) {
        d[r] = (float*)mallocCheck(M * N * sizeof(float));
        omp_set_num_threads(r < 3 ? r + 1 : saved);
        GemmCall g = gemm_fprop(d[r], DT_F32, gemm_operand_fp8(qw, DT_E4M3, &sw.scale_inv), gemm_operand_fp8(qx, DT_E4M3, &sx.scale_inv),
                                N, K, M);
        g.accum = r < 3 ? FP8_ACCUM_HOPPER : FP8_ACCUM_EXACT;
        gemm_cpu(&g);
    }
    omp_set_num_threads(saved);
    if (memcmp(d[0], d[1], M * N * sizeof(float)) || memcmp(d[0], d[2], M * N * sizeof(float)))
        failures += fail("the Hopper model's GEMM depends on the thread count");
    size_t differ = 0;
    double err2 = 0.0, ref2 = 0.0;
    for (size_t j = 0; j < N; j++) {
        for (size_t i = 0; i < M; i++) {
            double ref = 0.0;
            for (size_t k = 0; k < K; k++)
                ref += (double)fp8_to_float(qw[i * K + k], FP8_E4M3) * fp8_to_float(qx[j * K + k], FP8_E4M3);
            ref *= (double)sw.scale_inv * sx.scale_inv;
            double got = d[0][j * M + i];
            err2 += (got - ref) * (got - ref);
            ref2 += ref * ref;
            differ += memcmp(&d[0][j * M + i], &d[3][j * M + i], sizeof(float)) != 0;
        }
    }
    double rel = sqrt(err2 / ref2);
    printf("    Hopper model, E4M3 fprop m %zu n %zu k %zu: relative RMS error vs float64 %.3g; %zu of %zu outputs differ from exact\n",
           M, N, K, rel, differ, M * N);
    if (!(rel < 0x1p-8)) failures += fail("relative RMS error %.3g vs float64 exceeds 2^-8", rel);
    if (differ < M * N / 2) failures += fail("only %zu of %zu outputs differ from the exact path: is the model running?", differ, M * N);
    for (int r = 0; r < 4; r++) free(d[r]);
    free(x);
    free(w);
    free(qx);
    free(qw);
    return failures != 0;
}

/* The cast-transpose writes both layouts of the same codes, and its statistics count them right. */
static int check_cast_transpose(void) {
    backend_init(PRECISION_FP32);
    Rng rng = test_rng(3);
    size_t rows = 48, cols = 80;
    float* x = (float*)mallocCheck(rows * cols * sizeof(float));
    for (size_t i = 0; i < rows * cols; i++) x[i] = rng_normal(&rng) * (i % 7 == 0 ? 1e-7f : 1.0f);
    x[11] = 0.0f;
    int failures = 0;
    for (int fmt = 0; fmt < 2; fmt++) {
        Fp8Format f = (Fp8Format)fmt;
        uint8_t* out = (uint8_t*)mallocCheck(rows * cols);
        uint8_t* out_t = (uint8_t*)mallocCheck(rows * cols);
        memset(out, 0x7f, rows * cols);
        memset(out_t, 0x7f, rows * cols);
        Fp8Scale s = {0};
        Fp8Counts k = {0, 0, 0, 0};
        op_amax(&s, x, rows * cols);
        op_cast_transpose(out, out_t, x, rows, cols, f, &s, 0, &k);
        /* amax and scale against the definitions: max |x| and fp8_max / amax (docs/precision.md) */
        float amax = 0.0f;
        for (size_t i = 0; i < rows * cols; i++) amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
        float want_scale = (f == FP8_E4M3 ? 448.0f : 57344.0f) / amax;
        if (s.amax != amax || s.scale != want_scale || s.scale_inv != 1.0f / want_scale)
            failures += fail("%s amax %g scale %g scale_inv %g, want %g %g %g", fp8_format_name(f), s.amax, s.scale, s.scale_inv,
                             amax, want_scale, 1.0f / want_scale);
        unsigned long long sat = 0, under = 0, nonzero = 0;
        for (size_t i = 0; i < rows; i++) {
            for (size_t j = 0; j < cols; j++) {
                float v = x[i * cols + j];
                uint8_t want = fp8_from_float(v * want_scale, f);
                if (out[i * cols + j] != want || out_t[j * rows + i] != want) {
                    failures += fail("%s code (%zu, %zu): 0x%02x / 0x%02x, want 0x%02x", fp8_format_name(f), i, j, out[i * cols + j], out_t[j * rows + i], want);
                    i = rows;
                    break;
                }
                sat += fp8_is_max(want, f);
                nonzero += v != 0.0f;
                under += v != 0.0f && fp8_is_zero(want);
            }
        }
        if (k.saturated != sat || k.underflow != under || k.nonzero != nonzero || k.count != rows * cols)
            failures += fail("%s counts %llu/%llu/%llu/%llu, want %llu/%llu/%llu/%zu", fp8_format_name(f), k.saturated, k.underflow, k.nonzero, k.count, sat, under, nonzero, rows * cols);
        if (f == FP8_E4M3 && under == 0) failures += fail("the input has no underflow to count");
        printf("    %s: saturated %llu, underflow %llu of %llu non-zero\n", fp8_format_name(f), sat, under, nonzero);
        free(out);
        free(out_t);
    }
    free(x);
    return failures != 0;
}

/* BF16 rounding cases written out from IEEE 754 round-to-nearest-even on 8 significant bits. */
static int check_bf16_round(void) {
    struct { float in, want; } cases[] = {
        {1.0f, 1.0f},
        {1.0f + 0x1p-8f, 1.0f},                     /* tie, even is 1.0 */
        {1.0f + 3 * 0x1p-8f, 1.0f + 0x1p-6f},       /* tie, rounds up to even */
        {1.0f + 0x1p-8f + 0x1p-20f, 1.0f + 0x1p-7f}, /* above the tie */
        {-2.5f, -2.5f},
        {FLT_MAX, INFINITY},                         /* rounds past the largest BF16 */
        {0x1p-130f, 0x1p-130f},                      /* subnormal, exactly representable */
        {INFINITY, INFINITY},
    };
    int failures = 0;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        float got = bf16_round(cases[i].in);
        if (got != cases[i].want) failures += fail("bf16_round(%a) = %a, want %a", cases[i].in, got, cases[i].want);
    }
    if (!isnan(bf16_round(NAN))) failures += fail("bf16_round(NaN) is not NaN");
    return failures != 0;
}

/* ------------------------------------------------------------ model-level checks */

/* Two micro-batches of B/2 accumulate the 1-batch gradient; fp32, so to FP32 rounding. */
static int check_grad_accumulation(void) { return check_grad_accumulation_in(PRECISION_FP32, 1e-6); }

static int check_fp8_weights(void) { return check_fp8_weights_in(); }

static int check_recompute_bf16(void) { return check_recompute_in(PRECISION_BF16); }

static int check_recompute_fp8(void) { return check_recompute_in(PRECISION_FP8); }

/* op_rmsnorm_forward, op_residual_rmsnorm_forward and op_swiglu_forward: the fused amax of what each
   wrote against op_amax of it, bit for bit, also with a NaN input (NaN amax); the record's other fields
   are kept. */
static int fused_amax_ops(void) {
    enum { N = 37, C = 96, F = 72, X = 2 * N * C }; /* x: SwiGLU's (N, 2F) input, or the norm's input and branch (N, C) each */
    backend_init(PRECISION_FP8);
    Rng rng;
    rng_seed(&rng, 7);
    float *x = (float*)mallocCheck(X * sizeof(float)), *y = (float*)mallocCheck(X * sizeof(float));
    float *resid = (float*)mallocCheck(N * C * sizeof(float)), *w = (float*)mallocCheck(C * sizeof(float));
    float rstd[N];
    for (int i = 0; i < X; i++) x[i] = bf16_round(3.0f * (rng_uniform(&rng) - 0.5f));
    for (int c = 0; c < C; c++) w[c] = bf16_round(1.0f + 0.1f * rng_uniform(&rng));
    int failures = 0;
    for (int nan = 0; nan < 2; nan++) {
        if (nan) x[5 * C + 7] = NAN;
        const char* names[3] = {"rmsnorm_forward", "residual_rmsnorm_forward", "swiglu_forward"};
        for (int op = 0; op < 3; op++) {
            size_t n = op == 2 ? (size_t)N * F : (size_t)N * C;
            Fp8Scale fused = {-1.0f, 3.0f, 5.0f, 1.0f}, separate = {0};
            if (op == 0) op_rmsnorm_forward(y, rstd, x, w, N, C, 1e-5f, &fused);
            if (op == 1) op_residual_rmsnorm_forward(resid, y, rstd, x, x + N * C, w, N, C, 1e-5f, &fused);
            if (op == 2) op_swiglu_forward(y, x, N, F, &fused);
            op_amax(&separate, y, n);
            if (float_bits(fused.amax) != float_bits(separate.amax) || fp8_amax_is_finite(fused.amax) == nan)
                failures += fail("%s%s: fused amax %g, op_amax %g", names[op], nan ? " (NaN input)" : "", fused.amax, separate.amax);
            if (fused.scale != 3.0f || fused.scale_inv != 5.0f || fused.nonfinite != 1.0f) failures += fail("%s: wrote more than amax", names[op]);
        }
    }
    free(x);
    free(y);
    free(resid);
    free(w);
    return failures;
}

/* The trainer's deferred losses equal llama_forward's. */
static int check_forward_deferred(void) { return check_forward_deferred_in(PRECISION_FP8); }

/* The producers' fused amax leaves an fp8 run bit-identical to separate op_amax reads. */
static int check_fused_amax(void) {
    int failures = fused_amax_ops();
    if (failures == 0) printf("    fused amax of RMSNorm, residual + RMSNorm, SwiGLU outputs: bit-identical to op_amax (finite and NaN)\n");
    return (failures + check_fused_amax_in(PRECISION_FP8)) != 0;
}

static int check_resume_bit_identical(void) { return check_resume_in(PRECISION_FP8); }

static int check_zero_stages_one_rank(void) { return check_zero_stages_in(PRECISION_FP8); }

/*
 * The dump the GPU build is compared with: a CPU run written in the reference-state format reads back
 * and equals a second CPU run exactly (the writer is right and the CPU build is deterministic).
 */
static int check_dump_roundtrip(void) {
    char path[] = "/tmp/llm8_dump_XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) die("mkstemp failed");
    close(fd);
    reference_dump(PRECISION_FP8, path);
    RefTolerance exact = {0.0, 0.0, 0.0, 0.0};
    int rc = reference_check(PRECISION_FP8, path, exact);
    remove(path);
    return rc;
}

/* Checkpoint write -> read gives the same config and bit-identical parameters. */
static int check_checkpoint_roundtrip(void) {
    const LlamaConfig* cfg = llama_preset("tiny");
    size_t P = param_count(cfg);
    float* a = (float*)mallocCheck(P * sizeof(float));
    float* b = (float*)mallocCheck(P * sizeof(float));
    Rng rng = test_rng(4);
    for (size_t i = 0; i < P; i++) a[i] = rng_normal(&rng);
    char path[] = "/tmp/llm8_ckpt_XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) die("mkstemp failed");
    close(fd);
    checkpoint_write(path, cfg, a);
    LlamaConfig got;
    checkpoint_read_config(path, &got);
    for (size_t i = 0; i < P; i++) b[i] = NAN;
    checkpoint_read_params(path, &got, b);
    int failures = 0;
    if (memcmp(&got, cfg, sizeof(got)) != 0) failures += fail("config differs after round trip");
    if (memcmp(a, b, P * sizeof(float)) != 0) failures += fail("parameters differ after round trip");
    remove(path);
    free(a);
    free(b);
    return failures != 0;
}

/* ------------------------------------------------------------ FP8 safety net */

/*
 * The shadow policy's transitions (train/shadow_policy.h) on a scripted run, stepped as trainer_step
 * does; the expected BF16 steps are worked out by hand from the rules: a check every 3 steps, tolerance
 * 0.25 (a difference equal to it is clean, a NaN is over), fallback after 2 checks over in a row, back to
 * FP8 after 4 BF16 steps (or never, or never BF16 under warn).
 */
static int check_shadow_policy(void) {
    enum { STEPS = 30 };
    const double rel[] = {0.5, 0.125, 0.5, 0.75, NAN, 0.25, 1.0, 1.0}; /* at the checks of steps 0, 3, ..., 9, 15, 18, 21, 24 */
    struct { ShadowPolicy p; int bf16_steps[STEPS]; } cases[] = {
        {{3, 1, 0.25f, 2, 4}, {[10] = 1, [11] = 1, [12] = 1, [13] = 1, [25] = 1, [26] = 1, [27] = 1, [28] = 1}},
        {{3, 1, 0.25f, 2, 0}, {[10] = 1, [11] = 1, [12] = 1, [13] = 1, [14] = 1, [15] = 1, [16] = 1, [17] = 1, [18] = 1,
                               [19] = 1, [20] = 1, [21] = 1, [22] = 1, [23] = 1, [24] = 1, [25] = 1, [26] = 1, [27] = 1,
                               [28] = 1, [29] = 1}},
        {{3, 0, 0.25f, 2, 4}, {0}},
    };
    int failures = 0;
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        ShadowState st = {0, 0, 0, 0};
        size_t k = 0;
        for (int step = 0; step < STEPS; step++) {
            if (st.bf16 != cases[c].bf16_steps[step]) failures += fail("case %zu step %d: bf16 %d, want %d", c, step, st.bf16, cases[c].bf16_steps[step]);
            if (shadow_check_due(&cases[c].p, &st, step)) shadow_after_check(&cases[c].p, &st, rel[k++ % (sizeof(rel) / sizeof(rel[0]))]);
            else if (st.bf16) shadow_after_bf16_step(&cases[c].p, &st);
        }
        printf("    case %zu (policy %s, recover %d): %d fallback(s)\n", c, cases[c].p.fallback ? "fallback" : "warn", cases[c].p.recover, st.fallbacks);
    }
    return failures != 0;
}

/* Random tokens in [3, V) for a batch of (B, T): inputs, then the targets (the next tokens). */
static int* random_batch(Rng* rng, int B, int T, int V) {
    int* tokens = (int*)mallocCheck(2 * (size_t)B * T * sizeof(int));
    int* seq = (int*)mallocCheck(((size_t)T + 1) * sizeof(int));
    for (int b = 0; b < B; b++) {
        for (int t = 0; t <= T; t++) seq[t] = 3 + (int)rng_below(rng, (uint64_t)V - 3);
        memcpy(tokens + (size_t)b * T, seq, (size_t)T * sizeof(int));
        memcpy(tokens + (size_t)B * T + (size_t)b * T, seq + 1, (size_t)T * sizeof(int));
    }
    free(seq);
    return tokens;
}

/*
 * --bf16-layers first,last in fp8 against the bf16 recipe (tiny preset, random init and tokens): block 0
 * gets the same input in both runs, so its GEMM outputs and its output are bit-identical; block 1 runs
 * FP8 on that same input, so its GEMM output differs; block L-1's w13 output is the BF16 GEMM of the input
 * it saw, within BF16 rounding of a float64 GEMM (an FP8 GEMM errs by ~2^-4 per operand); the BF16
 * blocks' FP8 scales were never set, the FP8 blocks' were.
 */
static int check_bf16_blocks(void) {
    enum { B = 2, T = 64 };
    const LlamaConfig* cfg = llama_preset("tiny");
    int L = cfg->n_layers, C = cfg->dim, F = cfg->ffn_dim, QKV = llama_qkv_dim(cfg);
    size_t N = (size_t)B * T, NC = N * C;
    Rng rng = test_rng(5);
    int* batch = random_batch(&rng, B, T, cfg->vocab_size);
    uint64_t seed = rng_below(&rng, 1u << 30);
    char* blocks = (char*)mallocCheck((size_t)L);
    bf16_layers_parse("first,last", L, blocks);
    Llama m[2]; /* the bf16 recipe, then fp8 with BF16 blocks */
    for (int k = 0; k < 2; k++) {
        Precision p = k == 0 ? PRECISION_BF16 : PRECISION_FP8;
        backend_init(p);
        ModelOptions o = model_options(p, B, T);
        o.bf16_blocks = k == 1 ? blocks : NULL;
        llama_build(&m[k], cfg, &o);
        model_init(&m[k], seed);
        llama_refresh_working_weights(&m[k]);
        llama_forward(&m[k], batch, batch + N, B, T, 1.0f / (float)N);
    }
    Acts *b = &m[0].acts, *x = &m[1].acts;
    int failures = 0;
    if (!blocks[0] || !blocks[L - 1] || blocks[1]) failures += fail("'first,last' parsed wrong");
    struct { const char* name; const act_t *bf16, *mixed; size_t n; } same[] = {
        {"qkv[0]", b->qkv, x->qkv, N * QKV},
        {"att[0]", b->att, x->att, NC},
        {"fc[0]", b->fc, x->fc, N * 2 * F},
        {"resid[1]", b->resid + NC, x->resid + NC, NC},
    };
    for (size_t i = 0; i < sizeof(same) / sizeof(same[0]); i++)
        if (memcmp(same[i].bf16, same[i].mixed, same[i].n * sizeof(act_t)) != 0) failures += fail("block 0: %s differs from the bf16 recipe", same[i].name);
    if (memcmp(b->fc + N * 2 * F, x->fc + N * 2 * F, N * 2 * F * sizeof(act_t)) == 0) failures += fail("block 1: fc equals the bf16 recipe's: FP8 did not run");
    /* block L-1: fc = ln_ffn w13^T, ln_ffn the scratch its forward left (N, C), w13 (2F, C) */
    const act_t* ln = x->ln_ffn;
    const act_t* w = llama_bf16_weight(&m[1], llama_linear(&m[1], L - 1, LIN_W13));
    const act_t* fc = x->fc + (size_t)(L - 1) * N * 2 * F;
    int outside = 0;
    double worst = 0.0;
    for (size_t n = 0; n < N; n++) {
        for (int o = 0; o < 2 * F; o++) {
            double ref = 0.0, mag = 0.0;
            for (int c = 0; c < C; c++) {
                ref += (double)ln[n * C + c] * w[(size_t)o * C + c];
                mag += fabs((double)ln[n * C + c] * w[(size_t)o * C + c]);
            }
            double err = fabs((double)fc[n * 2 * F + o] - ref), bound = 0x1p-8 * fabs(ref) + (C + 2) * 0x1p-24 * mag;
            outside += !(err <= bound);
            if (fabs(ref) > 0 && err / fabs(ref) > worst) worst = err / fabs(ref);
        }
    }
    printf("    block %d: w13 output vs float64 GEMM of its input: worst relative error %.3e, %d outside the BF16 bound\n", L - 1, worst, outside);
    if (outside) failures += fail("block %d: %d w13 outputs are not the BF16 GEMM of its input", L - 1, outside);
    Fp8Scale* s = (Fp8Scale*)mallocCheck((size_t)L * LIN_PER_LAYER * FP8_OPS * sizeof(Fp8Scale));
    dev_download(s, m[1].fp8.scales, (size_t)L * LIN_PER_LAYER * FP8_OPS * sizeof(Fp8Scale));
    for (int l = 0; l < L; l++) {
        for (int lin = 0; lin < LIN_PER_LAYER; lin++) {
            float amax = s[(size_t)FP8_OP_X * llama_fp8_slots(&m[1]) + llama_slot(l, lin)].amax;
            if (blocks[l] ? amax != 0.0f : !(amax > 0.0f)) failures += fail("block %d %s: X amax %g (BF16 block: %d)", l, LINEAR_NAMES[lin], amax, blocks[l]);
        }
    }
    free(s);
    free(blocks);
    free(batch);
    llama_free(&m[0]);
    llama_free(&m[1]);
    return failures != 0;
}

/* Every block linear of an fp8 run in BF16 computes the bf16 recipe bit for bit. */
static int check_bf16_linears_in_fp8(void) { return check_bf16_linears_in_fp8_in(); }

/* The shadow check's gradient comparison: the CPU's sums of squares are exact enough for 1e-7. */
static int check_shadow_grad_compare(void) { return check_shadow_grad_compare_in(1e-7); }

typedef struct {
    Fp8Alerts alerts;
    int hits[ALERT_KINDS]; /* alerts on the watched operand */
    int others;            /* alerts on any other operand */
    int layer;             /* the watched operand: w2[layer] X */
} AlertProbe;

static void probe_emit(void* ctx, const Fp8OperandStats* o) {
    AlertProbe* p = (AlertProbe*)ctx;
    Fp8Alert a[ALERT_KINDS];
    int n = fp8_alerts_check(&p->alerts, o, a);
    for (int i = 0; i < n; i++) {
        if (o->layer == p->layer && o->lin == LIN_W2 && o->op == FP8_OP_X) p->hits[a[i].kind]++;
        else p->others++;
    }
}

/*
 * FP8 alerts (train/fp8_alerts.h): two statistics steps on the reference model and batch, the second
 * with an outlier planted in the SwiGLU output of block 1 (one unit's w1 and w3 rows scaled by 300, so
 * that unit's output grows by ~300^2): the second step's w2[layer 1] X raises the underflow and the amax
 * growth alerts, and the first step raises none on it.
 */
static int check_fp8_alerts(void) {
    const float outlier = 300.0f;
    LlamaConfig cfg;
    checkpoint_read_config(REF_MODEL_PATH, &cfg);
    RefState r;
    ref_state_read(&r, REF_STATE_PATH, &cfg);
    Llama m;
    reference_model(&m, PRECISION_FP8, &cfg, &r, r.B, 0);
    float* params = (float*)mallocCheck(m.num_params * sizeof(float));
    llama_get_params(&m, params);
    AlertProbe probe;
    memset(&probe, 0, sizeof(probe));
    probe.layer = 1;
    fp8_alerts_init(&probe.alerts, (Fp8AlertThresholds){0.01f, 0.01f, 8.0f}, cfg.n_layers);
    Rng rng = test_rng(6);
    int unit = (int)rng_below(&rng, (uint64_t)cfg.ffn_dim);
    int failures = 0;
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1) {
            size_t offsets[NUM_PARAM_TENSORS];
            param_offsets(&cfg, offsets);
            float* w13 = params + offsets[P_W13] + (size_t)probe.layer * 2 * cfg.ffn_dim * cfg.dim; /* (2F, C): w1 rows, then w3 */
            for (int c = 0; c < cfg.dim; c++) {
                w13[(size_t)unit * cfg.dim + c] *= outlier;
                w13[((size_t)cfg.ffn_dim + unit) * cfg.dim + c] *= outlier;
            }
            llama_set_params(&m, params);
        }
        memset(probe.hits, 0, sizeof(probe.hits));
        llama_fp8_stats_begin(&m);
        llama_zero_grads(&m);
        llama_forward(&m, r.inputs, r.targets, r.B, r.T, 1.0f / (float)(r.B * r.T));
        llama_backward(&m);
        llama_fp8_stats_end(&m, probe_emit, &probe);
        printf("    pass %d: w2[layer 1] X alerts: saturated %d, underflow %d, amax growth %d\n", pass, probe.hits[ALERT_SATURATED],
               probe.hits[ALERT_UNDERFLOW], probe.hits[ALERT_AMAX_GROWTH]);
        int any = probe.hits[ALERT_SATURATED] + probe.hits[ALERT_UNDERFLOW] + probe.hits[ALERT_AMAX_GROWTH];
        if (pass == 0 && any) failures += fail("the clean model raises alerts on w2[layer 1] X");
        if (pass == 1 && (!probe.hits[ALERT_UNDERFLOW] || !probe.hits[ALERT_AMAX_GROWTH]))
            failures += fail("the outlier (unit %d) raises no underflow or no amax growth alert on w2[layer 1] X", unit);
    }
    fp8_alerts_free(&probe.alerts);
    free(params);
    llama_free(&m);
    ref_state_free(&r);
    return failures != 0;
}

/* ------------------------------------------------------------ data */

/* Writes a shard whose token at position i is `base + i` (so a token names its position). */
static void write_position_shard(const char* path, int n, int base) {
    uint16_t* tokens = (uint16_t*)mallocCheck((size_t)n * sizeof(uint16_t));
    for (int i = 0; i < n; i++) tokens[i] = (uint16_t)(base + i);
    shard_write_u16(path, tokens, (size_t)n);
    free(tokens);
}

/*
 * Three ranks read one epoch of three shards of different sizes, shuffled or not: no sample is read
 * twice, no two ranks read the same sample, every sample but the < B*world left at a shard's end is
 * read, all ranks switch shards at the same step, and targets are inputs shifted by one.
 */
static int check_dataloader_ranks(void) {
    enum { WORLD = 3, B = 2, T = 8 };
    int sizes[3] = {1000, 433, 200};
    int base[3] = {0, 10000, 20000};
    char dir[] = "/tmp/llm8_data_XXXXXX";
    if (mkdtemp(dir) == NULL) die("mkdtemp failed");
    char path[PATH_LEN], pattern[PATH_LEN];
    for (int s = 0; s < 3; s++) {
        snprintf(path, sizeof(path), "%s/shard_%d.bin", dir, s);
        write_position_shard(path, sizes[s], base[s]);
    }
    snprintf(pattern, sizeof(pattern), "%s/shard_*.bin", dir);
    int failures = 0;
    for (int shuffle = 0; shuffle < 2; shuffle++) {
        DataLoader d[WORLD];
        for (int r = 0; r < WORLD; r++) dataloader_init(&d[r], pattern, B, T, r, WORLD, 1, 65535, shuffle, g_seed);
        long long steps = dataloader_epoch_batches(&d[0]);
        long long expected_samples = 0;
        for (int s = 0; s < 3; s++) expected_samples += (long long)((sizes[s] - 1) / T / (B * WORLD)) * B * WORLD;
        char* seen = (char*)callocCheck(30000, 1);
        long long samples = 0;
        for (long long step = 0; step < steps; step++) {
            int shard0 = -1;
            for (int r = 0; r < WORLD; r++) {
                dataloader_next_batch(&d[r]);
                int shard = d[r].shard_order[d[r].shard];
                if (r == 0) shard0 = shard;
                else if (shard != shard0) failures += fail("step %lld: rank %d reads shard %d, rank 0 shard %d", step, r, shard, shard0);
                for (int b = 0; b < B; b++) {
                    int first = d[r].inputs[b * T];
                    int pos = first - base[shard];
                    if (pos % T != 0) failures += fail("sample starts at position %d, not a multiple of T", pos);
                    if (seen[first]) failures += fail("sample at token %d read twice (rank %d, step %lld)", first, r, step);
                    seen[first] = 1;
                    samples++;
                    for (int t = 0; t < T; t++) {
                        if (d[r].inputs[b * T + t] != first + t || d[r].targets[b * T + t] != first + t + 1) {
                            failures += fail("inputs/targets of a sample are not consecutive positions");
                            break;
                        }
                    }
                }
                if (failures > 5) break;
            }
        }
        if (samples != expected_samples) failures += fail("shuffle %d: %lld samples read in an epoch, want %lld", shuffle, samples, expected_samples);
        /* the next batch starts epoch 1 on every rank */
        for (int r = 0; r < WORLD; r++) {
            dataloader_next_batch(&d[r]);
            if (d[r].epoch != 1) failures += fail("rank %d did not start epoch 1 after %lld steps", r, steps);
        }
        printf("    shuffle %d: %lld steps, %lld samples, epoch boundary on every rank\n", shuffle, steps, samples);
        free(seen);
        for (int r = 0; r < WORLD; r++) dataloader_free(&d[r]);
    }
    /* restoring a saved position continues with the same batches */
    DataLoader a, b;
    dataloader_init(&a, pattern, B, T, 1, WORLD, 1, 65535, 1, g_seed);
    dataloader_init(&b, pattern, B, T, 1, WORLD, 1, 65535, 1, g_seed);
    for (int i = 0; i < 23; i++) dataloader_next_batch(&a);
    DataLoaderPosition p = dataloader_position(&a);
    dataloader_restore(&b, p);
    for (int i = 0; i < 40; i++) {
        dataloader_next_batch(&a);
        dataloader_next_batch(&b);
        if (memcmp(a.inputs, b.inputs, sizeof(int) * B * T) != 0) {
            failures += fail("batch %d after restore differs", i);
            break;
        }
    }
    dataloader_free(&a);
    dataloader_free(&b);
    for (int s = 0; s < 3; s++) {
        snprintf(path, sizeof(path), "%s/shard_%d.bin", dir, s);
        remove(path);
    }
    rmdir(dir);
    return failures != 0;
}

/* ------------------------------------------------------------ schedule */

static int check_lr_schedule(void) {
    const double lr = 3e-4, frac = 0.1;
    const int warmup = 10, total = 110;
    int failures = 0;
    for (int step = 0; step < total; step++) {
        double want;
        if (step < warmup) want = lr * (step + 1) / warmup;
        else want = lr * frac + 0.5 * (1 + cos(3.14159265358979323846 * (step - warmup) / (double)(total - warmup - 1))) * (lr - lr * frac);
        float got = lr_at_step(LR_COSINE, (float)lr, warmup, (float)frac, step, total);
        if (fabs(got - want) > 1e-6 * lr) failures += fail("cosine step %d: %g, want %g", step, got, want);
        double lin = step < warmup ? want : lr * frac + (1.0 - (step - warmup) / (double)(total - warmup - 1)) * (lr - lr * frac);
        got = lr_at_step(LR_LINEAR, (float)lr, warmup, (float)frac, step, total);
        if (fabs(got - lin) > 1e-6 * lr) failures += fail("linear step %d: %g, want %g", step, got, lin);
        if (failures > 3) break;
    }
    return failures != 0;
}

static Check CHECKS[] = {
    {"hopper_accum", check_hopper_accum, "Hopper FP8 accumulation model: hand cases, thread count, error vs float64"},
    {"reference_fp32", check_reference_fp32, "fp32 forward/backward/AdamW vs HF transformers (float64)"},
    {"reference_bf16", check_reference_bf16, "bf16 recipe vs HF transformers"},
    {"reference_fp8", check_reference_fp8, "fp8 recipe vs HF transformers"},
    {"fp8_scale_policy", check_fp8_scale_policy, "current scaling: zero, zero row, subnormal, NaN, Inf, pow2"},
    {"forward_deferred", check_forward_deferred, "losses summed on the device (llama_forward_deferred) equal llama_forward's"},
    {"fused_amax", check_fused_amax, "fused amax of the RMSNorm and SwiGLU outputs equals op_amax; fp8 runs bit-identical"},
    {"fp8_nonfinite_flagged", check_fp8_nonfinite_flagged, "a NaN weight and a NaN gradient are flagged and named"},
    {"fp8_gemm", check_fp8_gemm, "emulated FP8 GEMM vs float64 and the FP8 error bound; bad shapes rejected"},
    {"gemm_threads", check_gemm_threads, "the CPU GEMM gives the same bits on 1, 2, 3 and 5 threads"},
    {"cast_transpose", check_cast_transpose, "cast-transpose layouts and cast statistics"},
    {"bf16_round", check_bf16_round, "BF16 round-to-nearest-even cases"},
    {"grad_accumulation", check_grad_accumulation, "2 micro-batches accumulate the 1-batch gradient"},
    {"fp8_weights", check_fp8_weights, "E4M3 W, W^T cast from bf16(master weights); llama_bf16_weight"},
    {"recompute_bf16", check_recompute_bf16, "bf16 -r 1 and -r 2: bit-identical losses, gradients, weights"},
    {"recompute_fp8", check_recompute_fp8, "fp8 -r 1 and -r 2: bit-identical losses, gradients, weights, FP8 statistics"},
    {"resume_bit_identical", check_resume_bit_identical, "save -> load -> continue reproduces losses and weights"},
    {"zero_stages_one_rank", check_zero_stages_one_rank, "ZeRO-1/2 through the data-parallel driver on one rank equal ZeRO-0 bit for bit"},
    {"dump_roundtrip", check_dump_roundtrip, "a dumped CPU run reads back equal to a rerun (the GPU's comparison target)"},
    {"checkpoint_roundtrip", check_checkpoint_roundtrip, "model checkpoint write/read round trip"},
    {"dataloader_ranks", check_dataloader_ranks, "rank split, shuffling, epoch coverage, position restore"},
    {"lr_schedule", check_lr_schedule, "warmup + cosine/linear decay against the closed form"},
    {"shadow_policy", check_shadow_policy, "shadow policy: fallback after the patience, back to FP8 after the recovery steps"},
    {"bf16_blocks", check_bf16_blocks, "--bf16-layers first,last in fp8: those blocks compute the bf16 recipe's GEMMs"},
    {"bf16_linears_in_fp8", check_bf16_linears_in_fp8, "fp8 with every block linear in BF16 equals the bf16 recipe bit for bit"},
    {"shadow_grad_compare", check_shadow_grad_compare, "shadow gradient comparison (three passes) vs the gradients compared directly"},
    {"fp8_alerts", check_fp8_alerts, "an outlier planted in the w2 input raises its underflow and amax growth alerts"},
};

int main(int argc, char** argv) {
    if (argc == 4 && strcmp(argv[1], "--dump-run") == 0) {
        int p = name_index(PRECISION_NAMES, 3, argv[2]);
        if (p < 0) die("--dump-run: '%s' is not a precision (fp8 | bf16 | fp32)", argv[2]);
        reference_dump((Precision)p, argv[3]);
        return 0;
    }
    g_seed = test_seed(argc, argv);
    return run_checks(CHECKS, (int)(sizeof(CHECKS) / sizeof(CHECKS[0])), argc, argv);
}
