/*
 * Families fp8_cast and fp8_cast_vec (fp8/cast_cuda.cuh): op_amax, op_cast_transpose and its two kernels,
 * the delayed recipe's cast and update.
 */
#pragma once

#include "common.cuh"

enum { KC_CAST_LOG_UNIFORM, KC_CAST_NORMAL, KC_CAST_NAN, KC_CAST_INF, KC_CAST_ZERO };

typedef struct {
    char name[48];
    size_t rows, cols;
    int kind;
} KcCastTensor;

typedef struct {
    int tensor;
    Fp8Format f;
    int pow2, out, out_t, counts, timed;
} KcCastVariant;

/*
 * op_fp8_reset_amax ahead of the amax ops (the model's one strided memset per forward, which spares each
 * op its own): four poisoned records, records 0-2 reset, then op_amax of x into record 1 (it skips its own
 * zeroing), of y (x / 1024, smaller) into record 1 again (a second use must zero it again, or x's amax
 * would stay) and of y into record 3, outside the reset. Each amax must be the CPU's of its tensor, bit for
 * bit, and records 0 and 2 must hold amax 0 with their other fields untouched.
 */
static int kc_amax_reset_check(uint64_t seed) {
    const size_t n = 1000;
    float* x = kc_host(n);
    kc_fill_normal(x, n, seed, 0.0f, 1.0f, 1);
    float* y = kc_host(n);
    for (size_t i = 0; i < n; i++) y[i] = x[i] / 1024.0f;
    act_t* d_x = kc_dev_act(x, n);
    act_t* d_y = kc_dev_act(y, n);
    Fp8Scale want_x = {NAN, NAN, NAN, NAN}, want_y = {NAN, NAN, NAN, NAN}, got[4];
    cpu_ref_amax(&want_x, x, n);
    cpu_ref_amax(&want_y, y, n);
    Fp8Scale* d = (Fp8Scale*)dev_alloc(4 * sizeof(Fp8Scale));
    kc_poison(d, 4 * sizeof(Fp8Scale));
    op_fp8_reset_amax(d, 3);
    op_amax(&d[1], d_x, n);
    dev_download(got, d, 4 * sizeof(Fp8Scale));
    float first = got[1].amax;
    int ok = float_bits(first) == float_bits(want_x.amax);
    op_amax(&d[1], d_y, n);
    op_amax(&d[3], d_y, n);
    dev_download(got, d, 4 * sizeof(Fp8Scale));
    ok = ok && float_bits(got[1].amax) == float_bits(want_y.amax) && float_bits(got[3].amax) == float_bits(want_y.amax);
    for (int r = 0; r < 3; r += 2) ok = ok && got[r].amax == 0.0f && float_bits(got[r].scale) == 0xFFFFFFFFu;
    printf("    amax after op_fp8_reset_amax: first use %.9g, second use %.9g, outside the reset %.9g, cpu %.9g / %.9g, "
           "tol bit-identical%s\n", first, got[1].amax, got[3].amax, want_x.amax, want_y.amax, ok ? "" : "  FAIL");
    free(x);
    free(y);
    dev_free(d_x);
    dev_free(d_y);
    dev_free(d);
    return !ok;
}

/*
 * Tolerance: none. amax is a max (order-free), the scale comes from fp8.h's policy on both sides (IEEE
 * division, exact frexp/ldexp), and the cast is cuda_fp8.h's conversion, which the CPU emulates bit for
 * bit: codes, amax, scale, scale_inv and the counts must be bit-identical (two NaN amaxes count as equal).
 * The tensors: the shape's activation (N, C) with log-uniform magnitudes (underflows), an odd-sized one
 * (rows and cols not multiples of the 64 x 64 tile), one with a NaN, one with -Inf, one all zeros (+0
 * and -0). The counts start non-zero on both sides, to check that they accumulate.
 */
static int kc_case_fp8_cast(const KernelShape* s, int iters, uint64_t seed) {
    uint64_t stream = seed;
    int failed = 0;
    KcCastTensor tensors[5] = {
        {"", (size_t)s->B * s->T, (size_t)s->C, KC_CAST_LOG_UNIFORM},
        {"", 3 * 64 + 17, 5 * 64 + 33, KC_CAST_NORMAL},
        {"", 130, 70, KC_CAST_NAN},
        {"", 64, 96, KC_CAST_INF},
        {"", 256, 128, KC_CAST_ZERO},
    };
    const char* kinds[5] = {"x", "odd", "nan", "inf", "zero"};
    for (int t = 0; t < 5; t++)
        snprintf(tensors[t].name, sizeof(tensors[t].name), "%s (%zu, %zu)", kinds[t], tensors[t].rows, tensors[t].cols);
    const KcCastVariant variants[] = {
        {0, FP8_E4M3, 0, 1, 1, 1, 1}, {0, FP8_E4M3, 1, 1, 1, 1, 0}, {0, FP8_E5M2, 0, 1, 1, 1, 1},
        {0, FP8_E5M2, 1, 0, 1, 0, 0}, {1, FP8_E4M3, 0, 1, 1, 1, 0}, {1, FP8_E5M2, 1, 1, 1, 1, 0},
        {1, FP8_E4M3, 1, 1, 0, 0, 0}, {2, FP8_E4M3, 0, 1, 1, 1, 0}, {2, FP8_E5M2, 0, 1, 1, 1, 0},
        {3, FP8_E5M2, 0, 1, 1, 1, 0}, {3, FP8_E4M3, 1, 1, 1, 1, 0}, {4, FP8_E4M3, 0, 1, 1, 1, 0},
        {4, FP8_E5M2, 1, 1, 1, 1, 0},
    };
    const Fp8Counts counts0 = {1, 2, 3, 4};
    Fp8Scale* d_scale = (Fp8Scale*)dev_alloc(sizeof(Fp8Scale));
    Fp8Counts* d_counts = (Fp8Counts*)dev_alloc(sizeof(Fp8Counts));
    for (int t = 0; t < 5; t++) {
        const KcCastTensor* ts = &tensors[t];
        size_t n = ts->rows * ts->cols;
        KcSet set = {};
        KcBuf* x = kc_buf(&set, n, KC_BF16);
        if (ts->kind == KC_CAST_LOG_UNIFORM) kc_fill_log_uniform(x->h, n, splitmix64(&stream));
        else kc_fill_normal(x->h, n, splitmix64(&stream), 0.0f, 1.0f, 1);
        if (ts->kind == KC_CAST_NAN) x->h[37 * ts->cols + 11] = NAN;
        if (ts->kind == KC_CAST_INF) x->h[5 * ts->cols + 7] = -INFINITY;
        if (ts->kind == KC_CAST_ZERO) {
            for (size_t i = 0; i < n; i++) x->h[i] = i % 2 ? -0.0f : 0.0f;
        }
        kc_upload(x);
        KcCodes c = kc_codes(n);
        for (size_t v = 0; v < sizeof(variants) / sizeof(variants[0]); v++) {
            const KcCastVariant* va = &variants[v];
            if (va->tensor != t) continue;
            char label[96];
            snprintf(label, sizeof(label), "%.47s %s pow2 %d", ts->name, fp8_format_name(va->f), va->pow2);
            /* CPU: poisoned codes (0xFF is a NaN code in both formats) and scale */
            Fp8Scale sc = {NAN, NAN, NAN, NAN};
            Fp8Counts cc = counts0;
            memset(c.ref, 0xFF, n);
            memset(c.ref_t, 0xFF, n);
            cpu_ref_amax(&sc, x->h, n);
            sc.nonfinite = 0.0f; /* the cast sets the flag for the NaN and Inf tensors */
            cpu_ref_cast_transpose(va->out ? c.ref : NULL, va->out_t ? c.ref_t : NULL, x->h, ts->rows, ts->cols, va->f, &sc,
                                   va->pow2, va->counts ? &cc : NULL);
            /* GPU */
            kc_poison(d_scale, sizeof(Fp8Scale));
            kc_codes_poison(&c);
            dev_upload(d_counts, &counts0, sizeof(Fp8Counts));
            op_amax(d_scale, x->a, n);
            op_fp8_clear_nonfinite(d_scale, 1);
            op_cast_transpose(va->out ? c.d : NULL, va->out_t ? c.d_t : NULL, x->a, ts->rows, ts->cols, va->f, d_scale,
                              va->pow2, va->counts ? d_counts : NULL);
            Fp8Scale sg;
            Fp8Counts cg;
            dev_download(&sg, d_scale, sizeof(Fp8Scale));
            dev_download(&cg, d_counts, sizeof(Fp8Counts));
            kc_codes_download(&c);
            failed += kc_codes_compare(label, &c, va->out, va->out_t, sg, sc);
            int counts_ok = memcmp(&cg, &cc, sizeof(Fp8Counts)) == 0;
            printf("    %s counts sat %llu under %llu nonzero %llu count %llu, tol bit-identical%s\n", label, cc.saturated,
                   cc.underflow, cc.nonzero, cc.count, counts_ok ? "" : "  FAIL");
            if (!counts_ok)
                printf("      FAIL: gpu counts sat %llu under %llu nonzero %llu count %llu\n", cg.saturated, cg.underflow,
                       cg.nonzero, cg.count);
            failed += !counts_ok;
            if (va->timed) {
                char op[64];
                snprintf(op, sizeof(op), "amax %s", kinds[t]);
                kc_time(op, iters, 2.0 * n, 0.0, [&] { op_amax(d_scale, x->a, n); });
                snprintf(op, sizeof(op), "cast_transpose %s %s", kinds[t], fp8_format_name(va->f));
                kc_time(op, iters, 2.0 * n + (va->out ? n : 0) + (va->out_t ? n : 0), 0.0, [&] {
                    op_cast_transpose(va->out ? c.d : NULL, va->out_t ? c.d_t : NULL, x->a, ts->rows, ts->cols, va->f,
                                      d_scale, va->pow2, va->counts ? d_counts : NULL);
                });
            }
        }
        kc_set_free(&set);
        kc_codes_free(&c);
    }
    dev_free(d_scale);
    dev_free(d_counts);
    return failed + kc_amax_reset_check(splitmix64(&stream));
}

/* The cast-transpose kernels of fp8/cast_cuda.cuh: the element-wise one, and the vectorized one. */
enum { KC_CT_TILED, KC_CT_VEC, KC_CT_KERNELS };
static const char* const KC_CT_KERNEL_NAMES[KC_CT_KERNELS] = {"tiled", "vec"};

/* One of the kernels, current-scaled (record unused) or, when delayed, as fp8_cast_transpose_delayed_cuda
   runs it (s->amax reset first, the scale s holds, the amax recorded). */
static inline void kc_cast_transpose_with(int kernel, uint8_t* out, uint8_t* out_t, const act_t* x, size_t rows, size_t cols,
                                          Fp8Format f, Fp8Scale* s, Fp8Counts* counts, int delayed = 0, float* record = NULL) {
    if (delayed) cudaCheck(cudaMemset(&s->amax, 0, sizeof(float)));
    if (kernel == KC_CT_VEC) fp8_cast_transpose_vec_cuda(out, out_t, x, rows, cols, f, s, 0, counts, delayed, (unsigned int*)record);
    else fp8_cast_transpose_tiled_cuda(out, out_t, x, rows, cols, f, s, 0, counts, delayed, (unsigned int*)record);
}

/* The large tensor's side: 7B's width on a GPU; a quarter of it on the emulated GPU (emu/), where each of
 * the 16M elements' threads is a CPU fiber and the six casts of a 4096 x 4096 tensor took a minute. */
#ifdef LLM8_EMU
#define KC_CT_LARGE 1024
#else
#define KC_CT_LARGE 4096
#endif

/*
 * The delayed recipe's cast with kernel k into the given layouts: a stale scale (4x the tensor's own, so
 * that codes saturate), s->amax set from the cast and a record that starts above one part of the tensors
 * (amax_combine of both); codes, the scale left as it was, amax and record against the CPU's, bit for bit.
 */
static inline int kc_check_delayed_cast(const char* label, int k, int with_out, int with_t, const KcBuf* x, size_t rows,
                                        size_t cols, Fp8Format f, float current_scale, Fp8Scale* d_scale, const KcCodes* c) {
    float stale = fp8_amax_is_finite(current_scale) ? 4.0f * current_scale : 1.0f;
    Fp8Scale sc = {NAN, stale, 1.0f / stale, 0.0f}, sg;
    float record_c = 0.5f, record_g;
    float* d_record = kc_dev_f32(&record_c, 1);
    dev_upload(d_scale, &sc, sizeof(Fp8Scale));
    KcCodes dc = *c; /* the GPU's codes, with the delayed cast's own CPU codes */
    dc.ref = (uint8_t*)mallocCheck(c->n);
    dc.ref_t = (uint8_t*)mallocCheck(c->n);
    cpu_ref_cast_transpose_delayed(dc.ref, dc.ref_t, x->h, rows, cols, f, &sc, NULL, &record_c);
    kc_codes_poison(&dc);
    kc_cast_transpose_with(k, with_out ? dc.d : NULL, with_t ? dc.d_t : NULL, x->a, rows, cols, f, d_scale, NULL, 1, d_record);
    dev_download(&sg, d_scale, sizeof(Fp8Scale));
    dev_download(&record_g, d_record, sizeof(float));
    kc_codes_download(&dc);
    dev_free(d_record);
    char dl[128];
    snprintf(dl, sizeof(dl), "%s delayed", label);
    int failed = kc_codes_compare(dl, &dc, with_out, with_t, sg, sc);
    if (!kc_same_bits(record_g, record_c)) {
        printf("      FAIL: %s record: gpu %g cpu %g\n", dl, record_g, record_c);
        failed++;
    }
    free(dc.ref);
    free(dc.ref_t);
    return failed;
}

/*
 * The delayed recipe's update (fp8_delayed_update_cuda) of 37 records with histories of 5, entry 2 of 4
 * in use replaced, both formats and algorithms, margin 1, with and without pow2: scales, scale_inv and
 * histories against the CPU's, bit for bit. Step amaxes are log-uniform with zeros (the scale is kept).
 */
static inline int kc_check_delayed_update(uint64_t seed) {
    enum { R = 37, H = 5 };
    int failed = 0;
    float amax[R], history[R * H];
    kc_fill_log_uniform(amax, R, seed);
    kc_fill_log_uniform(history, R * H, seed + 1);
    for (int i = 0; i < R * H; i++) history[i] = fabsf(history[i]);
    for (int i = 0; i < R; i++) amax[i] = i % 5 ? fabsf(amax[i]) : 0.0f;
    for (int c = 0; c < 8; c++) {
        Fp8Format f = c % 2 ? FP8_E5M2 : FP8_E4M3;
        int algo = (c / 2) % 2 ? FP8_AMAX_MOST_RECENT : FP8_AMAX_MAX, pow2 = c / 4;
        Fp8Scale sc[R], sg[R];
        float hc[R * H], hg[R * H];
        for (int i = 0; i < R; i++) {
            float prev = 1.0f + (float)i;
            Fp8Scale init = {0.0f, prev, 1.0f / prev, 0.0f};
            sc[i] = init;
        }
        memcpy(hc, history, sizeof(hc));
        Fp8Scale* d_s = (Fp8Scale*)kc_dev_bytes(sc, sizeof(sc));
        float* d_h = kc_dev_f32(history, R * H);
        float* d_a = kc_dev_f32(amax, R);
        cpu_ref_fp8_delayed_update(sc, hc, amax, R, H, 2, 4, algo, f, 1, pow2);
        fp8_delayed_update_cuda(d_s, d_h, d_a, R, H, 2, 4, algo, f, 1, pow2);
        dev_download(sg, d_s, sizeof(sg));
        dev_download(hg, d_h, sizeof(hg));
        int ok = memcmp(sg, sc, sizeof(sc)) == 0 && memcmp(hg, hc, sizeof(hc)) == 0;
        printf("    delayed update %s %s pow2 %d: %d records, tol bit-identical%s\n", fp8_format_name(f),
               fp8_amax_algo_name(algo), pow2, R, ok ? "" : "  FAIL");
        failed += !ok;
        dev_free(d_s);
        dev_free(d_h);
        dev_free(d_a);
    }
    return failed;
}

/*
 * Tolerance: none, as fp8_cast. Each kernel that takes the tensor (the vectorized one needs cols % 8 == 0
 * and rows % 4 == 0) casts it after op_amax, into both layouts, one or the other, with counts; codes,
 * amax, scale, scale_inv, the nonfinite flag and the counts are compared with the CPU cast, bit for bit.
 * Tensors: the shape's wqkv/w13 X (N, C), w13 dY (N, 2F) and w2 X (N, F); a 7B-like KC_CT_LARGE square; partial
 * tiles (100, 72) with a NaN; the smallest vector shape (4, 8); and two the vectorized kernel refuses,
 * (130, 64) and (64, 70), which op_cast_transpose sends to the element-wise one. With iters, the shape's
 * three tensors are timed with both kernels (GB/s of 2 bytes read and 2 written per element).
 */
static int kc_case_fp8_cast_vec(const KernelShape* s, int iters, uint64_t seed) {
    uint64_t stream = seed;
    int failed = 0;
    size_t N = (size_t)s->B * s->T;
    struct {
        const char* name;
        size_t rows, cols;
        Fp8Format f;
        int timed, nan;
    } tensors[] = {
        {"X (N, C)", N, (size_t)s->C, FP8_E4M3, 1, 0},         {"dY (N, 2F)", N, 2 * (size_t)s->F, FP8_E5M2, 1, 0},
        {"X (N, F)", N, (size_t)s->F, FP8_E4M3, 1, 0},         {"7B-like", KC_CT_LARGE, KC_CT_LARGE, FP8_E4M3, 0, 0},
        {"partial tiles + NaN", 100, 72, FP8_E5M2, 0, 1},      {"smallest", 4, 8, FP8_E4M3, 0, 0},
        {"rows % 4 != 0", 130, 64, FP8_E4M3, 0, 0},            {"cols % 8 != 0", 64, 70, FP8_E5M2, 0, 0},
    };
    /* written layouts: both, row-major only, transposed only */
    const int layouts[3][2] = {{1, 1}, {1, 0}, {0, 1}};
    Fp8Scale* d_scale = (Fp8Scale*)dev_alloc(sizeof(Fp8Scale));
    Fp8Counts* d_counts = (Fp8Counts*)dev_alloc(sizeof(Fp8Counts));
    for (size_t t = 0; t < sizeof(tensors) / sizeof(tensors[0]); t++) {
        size_t rows = tensors[t].rows, cols = tensors[t].cols, n = rows * cols;
        Fp8Format f = tensors[t].f;
        KcSet set = {};
        KcBuf* x = kc_buf(&set, n, KC_BF16);
        kc_fill_normal(x->h, n, splitmix64(&stream), 0.0f, f == FP8_E5M2 ? 1e-3f : 1.0f, 1);
        if (tensors[t].nan) x->h[37 * cols + 11] = NAN;
        kc_upload(x);
        KcCodes c = kc_codes(n);
        Fp8Scale sc;
        Fp8Counts cc;
        memset(&cc, 0, sizeof(cc));
        cpu_ref_amax(&sc, x->h, n);
        sc.nonfinite = 0.0f;
        cpu_ref_cast_transpose(c.ref, c.ref_t, x->h, rows, cols, f, &sc, 0, &cc);
        int vec_ok = fp8_cast_transpose_vec_ok(c.d, c.d_t, x->a, rows, cols);
        printf("    %s (%zu, %zu) %s: vectorized kernel %s\n", tensors[t].name, rows, cols, fp8_format_name(f),
               vec_ok ? "takes it" : "refuses it (op_cast_transpose uses the element-wise one)");
        for (int k = 0; k < KC_CT_KERNELS; k++) {
            if (k == KC_CT_VEC && !vec_ok) continue;
            for (int l = 0; l < 3; l++) {
                int with_out = layouts[l][0], with_t = layouts[l][1];
                kc_poison(d_scale, sizeof(Fp8Scale));
                kc_codes_poison(&c);
                dev_zero(d_counts, sizeof(Fp8Counts));
                op_amax(d_scale, x->a, n);
                op_fp8_clear_nonfinite(d_scale, 1);
                kc_cast_transpose_with(k, with_out ? c.d : NULL, with_t ? c.d_t : NULL, x->a, rows, cols, f, d_scale, d_counts);
                Fp8Scale sg;
                Fp8Counts cg;
                dev_download(&sg, d_scale, sizeof(Fp8Scale));
                dev_download(&cg, d_counts, sizeof(Fp8Counts));
                kc_codes_download(&c);
                char label[96];
                snprintf(label, sizeof(label), "%s %s", KC_CT_KERNEL_NAMES[k], with_out && with_t ? "both" : with_out ? "out" : "out_t");
                failed += kc_codes_compare(label, &c, with_out, with_t, sg, sc);
                int counts_ok = memcmp(&cg, &cc, sizeof(Fp8Counts)) == 0;
                if (!counts_ok)
                    printf("      FAIL: %s counts: gpu sat %llu under %llu nonzero %llu count %llu, cpu %llu %llu %llu %llu\n", label,
                           cg.saturated, cg.underflow, cg.nonzero, cg.count, cc.saturated, cc.underflow, cc.nonzero, cc.count);
                failed += !counts_ok;
                failed += kc_check_delayed_cast(label, k, with_out, with_t, x, rows, cols, f, sc.scale, d_scale, &c);
            }
        }
        if (tensors[t].timed && iters > 0) {
            double us[KC_CT_KERNELS] = {0.0, 0.0};
            for (int k = 0; k < KC_CT_KERNELS; k++) {
                if (k == KC_CT_VEC && !vec_ok) continue;
                char op[64];
                snprintf(op, sizeof(op), "cast_transpose %s %s", KC_CT_KERNEL_NAMES[k], tensors[t].name);
                us[k] = kc_time(op, iters, 4.0 * n, 0.0,
                                [&] { kc_cast_transpose_with(k, c.d, c.d_t, x->a, rows, cols, f, d_scale, NULL); });
            }
            if (us[KC_CT_VEC] > 0.0) printf("    %s: vectorized %.2fx the element-wise kernel's speed\n", tensors[t].name, us[KC_CT_TILED] / us[KC_CT_VEC]);
        }
        kc_set_free(&set);
        kc_codes_free(&c);
    }
    dev_free(d_scale);
    dev_free(d_counts);
    return failed + kc_check_delayed_update(splitmix64(&stream));
}
