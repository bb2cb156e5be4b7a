/*
 * Family optimizer (cuda/optimizer.cuh): op_params_from_master, op_adamw in every moment format,
 * op_sum_squares_chunks, op_sum_f64, op_sum_f32_in_order, op_store_add / op_store_load.
 */
#pragma once

#include "common.cuh"

/* The moments of s (n elements, host) decoded to FP32 (moment `which`). */
static inline float* kc_moments_decoded(const AdamwMoments* s, int which, size_t n) {
    float* x = kc_host(n);
    for (size_t i = 0; i < n; i++)
        x[i] = adamw_moment_load(s, which, i, s->scale_inv ? s->scale_inv[2 * (i / ADAMW_CHUNK) + which] : 1.0f);
    return x;
}

/*
 * AdamW with moments stored in `format` (bf16 or fp8, --optim-state), two steps from zero moments on both
 * sides (the second decodes the first's codes and scales), over a partial last chunk. Tolerances: the
 * master weights as the FP32 case; a decoded moment within one ulp of its format (E4M3 m: 3 mantissa
 * bits, FP16 v: 10, BF16: 7), since an FMA's last-bit difference may round a code the other way, plus the
 * format's subnormal floor; the fp8 scale_inv bit-identical (powers of two from the chunk's amax, which
 * moves by an ulp only at a power-of-two boundary).
 */
static int kc_adamw_lowp(const KernelShape* s, int iters, uint64_t seed, OptimState format) {
    uint64_t stream = seed;
    int failed = 0;
    size_t n = (size_t)2 * s->C * s->F - ADAMW_CHUNK / 3; /* a partial last chunk */
    size_t mb = n * adamw_moment_bytes(format, 0), vb = n * adamw_moment_bytes(format, 1), sc = adamw_scale_count(format, n);
    KcSet set = {};
    KcBuf* master = kc_input(&set, n, splitmix64(&stream), 0.0f, 0.02f, KC_F32);
    KcBuf* grads = kc_input(&set, n, splitmix64(&stream), 0.0f, 1e-2f, KC_F32);
    void* hm = callocCheck(mb, 1);
    void* hv = callocCheck(vb, 1);
    float* hsinv = sc ? kc_host(sc) : NULL;
    for (size_t k = 0; k < sc; k++) hsinv[k] = 1.0f;
    AdamwMoments hs = {format, hm, hv, hsinv};
    AdamwMoments ds = {format, kc_dev_bytes(hm, mb), kc_dev_bytes(hv, vb), sc ? kc_dev_f32(hsinv, sc) : NULL};
    float lr = 3e-4f, wd = 0.1f, grad_scale = 0.5f;
    for (int step = 1; step <= 2; step++) {
        float bc1 = 1.0f - powf(ADAMW_BETA1, (float)step), bc2_sqrt = sqrtf(1.0f - powf(ADAMW_BETA2, (float)step));
        cpu_ref_adamw(master->h, hs, grads->h, n, lr, wd, bc1, bc2_sqrt, grad_scale);
        op_adamw(master->f, ds, grads->f, n, lr, wd, bc1, bc2_sqrt, grad_scale);
    }
    printf("    --optim-state %s:\n", optim_state_name(format));
    failed += kc_check_ulps("adamw master", master, KC_F32_MANT, 4.0, 1e-9);
    void* gm = mallocCheck(mb);
    void* gv = mallocCheck(vb);
    dev_download(gm, ds.m, mb);
    dev_download(gv, ds.v, vb);
    float* gsinv = sc ? kc_get_f32(ds.scale_inv, sc) : NULL;
    AdamwMoments gs = {format, gm, gv, gsinv};
    for (int which = 0; which < 2; which++) {
        float* ref = kc_moments_decoded(&hs, which, n);
        float* got = kc_moments_decoded(&gs, which, n);
        int mant = format == OPTIM_STATE_BF16 ? KC_BF16_MANT : which == 0 ? 3 : 10;
        double amax = 0.0;
        for (size_t i = 0; i < n; i++) amax = fmax(amax, fabs(ref[i]));
        double floor = format == OPTIM_STATE_BF16 ? 0.0 : amax * (which == 0 ? 0x1p-9 / E4M3_MAX * 2 : 0x1p-24 / FP16_MAX * 2);
        failed += kc_compare_ulps(which == 0 ? "adamw m (decoded)" : "adamw v (decoded)", got, ref, n, mant, 1.0, floor);
        free(ref);
        free(got);
    }
    if (sc) failed += kc_compare_ulps("adamw scale_inv", gsinv, hsinv, sc, KC_F32_MANT, 0.0, 0.0);
    kc_time(format == OPTIM_STATE_FP8 ? "adamw fp8 state" : "adamw bf16 state", iters,
            (12.0 + 2.0 * (double)(adamw_moment_bytes(format, 0) + adamw_moment_bytes(format, 1))) * n, 0.0,
            [&] { op_adamw(master->f, ds, grads->f, n, lr, wd, 0.5f, 0.5f, grad_scale); });
    kc_set_free(&set);
    free(gm);
    free(gv);
    free(gsinv);
    free(hm);
    free(hv);
    free(hsinv);
    dev_free(ds.m);
    dev_free(ds.v);
    if (ds.scale_inv) dev_free(ds.scale_inv);
    return failed;
}

/*
 * Tolerances. params_from_master is one round-to-nearest-even on both sides: bit-identical. AdamW runs
 * optim.h's adamw_update on both sides, but nvcc contracts a*b+c into FMAs in the moment updates and gcc
 * (baseline x86-64) does not: a few FP32 ulps, plus an atol of 1e-9 (~10 ulps of the ~1e-3 moments and
 * ~3e-4 updates) for values that cancel to near zero.
 */
static int kc_case_params(const KernelShape* s, int iters, uint64_t seed) {
    uint64_t stream = seed;
    int failed = 0;
    size_t n = (size_t)2 * s->C * s->F; /* one w1|w3 weight */
    KcSet set = {};
    KcBuf* master = kc_input(&set, n, splitmix64(&stream), 0.0f, 0.02f, KC_F32);
    KcBuf* out = kc_output(&set, n, KC_BF16);
    cpu_ref_params_from_master(out->h, master->h, n);
    op_params_from_master(out->a, master->f, n);
    failed += kc_check_ulps("params_from_master", out, KC_BF16_MANT, 0.0, 0.0);
    kc_time("params_from_master", iters, 6.0 * n, 0.0, [&] { op_params_from_master(out->a, master->f, n); });

    KcBuf* m = kc_input(&set, n, splitmix64(&stream), 0.0f, 1e-3f, KC_F32);
    /* second moments of gradients ~1e-3, as after some steps: m / sqrt(v) stays O(1), so the update does
       not dwarf (and cancel against) the master weight, which an ulp tolerance could not absorb */
    KcBuf* v = kc_buf(&set, n, KC_F32);
    kc_fill_normal(v->h, n, splitmix64(&stream), 1e-6f, 1e-7f, 0);
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) v->h[i] = fabsf(v->h[i]);
    kc_upload(v);
    KcBuf* grads = kc_input(&set, n, splitmix64(&stream), 0.0f, 1e-2f, KC_F32);
    const int step = 10;
    float lr = 3e-4f, wd = 0.1f, grad_scale = 0.5f;
    float bc1 = 1.0f - powf(ADAMW_BETA1, (float)step), bc2_sqrt = sqrtf(1.0f - powf(ADAMW_BETA2, (float)step));
    AdamwMoments host_s = {OPTIM_STATE_FP32, m->h, v->h, NULL}, dev_s = {OPTIM_STATE_FP32, m->f, v->f, NULL};
    cpu_ref_adamw(master->h, host_s, grads->h, n, lr, wd, bc1, bc2_sqrt, grad_scale);
    op_adamw(master->f, dev_s, grads->f, n, lr, wd, bc1, bc2_sqrt, grad_scale);
    failed += kc_check_ulps("adamw master", master, KC_F32_MANT, 4.0, 1e-9);
    failed += kc_check_ulps("adamw m", m, KC_F32_MANT, 4.0, 1e-9);
    failed += kc_check_ulps("adamw v", v, KC_F32_MANT, 4.0, 1e-12);
    kc_time("adamw", iters, 28.0 * n, 0.0,
            [&] { op_adamw(master->f, dev_s, grads->f, n, lr, wd, bc1, bc2_sqrt, grad_scale); });
    kc_set_free(&set);
    failed += kc_adamw_lowp(s, iters, splitmix64(&stream), OPTIM_STATE_BF16);
    failed += kc_adamw_lowp(s, iters, splitmix64(&stream), OPTIM_STATE_FP8);
    return failed;
}

/*
 * Tolerance: both sides square FP32 values exactly in double and sum in double, in different orders:
 * random-walk error ~sqrt(n) * 2^-53 (~1e-12 at n = 1e8); relative 1e-10.
 */
static int kc_case_sum_squares(const KernelShape* s, int iters, uint64_t seed) {
    uint64_t stream = seed;
    size_t n = (size_t)2 * s->C * s->F + 12345; /* a w1|w3 gradient, plus a ragged tail */
    size_t chunks = zero_chunks(n);
    KcSet set = {};
    KcBuf* x = kc_input(&set, n, splitmix64(&stream), 0.0f, 1e-3f, KC_F32);
    double* ref = (double*)mallocCheck(chunks * sizeof(double));
    double* got = (double*)mallocCheck(chunks * sizeof(double));
    double* d_partials = (double*)dev_alloc(chunks * sizeof(double));
    kc_poison(d_partials, chunks * sizeof(double));
    cpu_ref_sum_squares_chunks(ref, x->h, n, ZERO_CHUNK);
    op_sum_squares_chunks(d_partials, x->f, n, ZERO_CHUNK);
    dev_download(got, d_partials, chunks * sizeof(double));
    /* both sum a chunk's squares exactly-rounded products in double, in different orders: ~1e-16 relative */
    double worst = 0.0;
    for (size_t k = 0; k < chunks; k++) {
        double rel = ref[k] != 0.0 ? fabs(got[k] - ref[k]) / fabs(ref[k]) : fabs(got[k]);
        if (!(rel <= worst)) worst = isnan(rel) ? INFINITY : rel;
    }
    double total_ref = cpu_ref_sum_f64(ref, chunks);
    double total = op_sum_f64(d_partials, chunks);
    double total_rel = fabs(total - total_ref) / fabs(total_ref);
    int failed = !(worst <= 1e-10) + !(total_rel <= 1e-10);
    printf("    sum_squares_chunks: %zu chunks, worst rel err %.3e; sum_f64: gpu %.17g, cpu %.17g, rel err %.3e; tol 1e-10%s\n",
           chunks, worst, total, total_ref, total_rel, failed ? "  FAIL" : "");
    kc_time("sum_squares_chunks", iters, 4.0 * n, 0.0, [&] { op_sum_squares_chunks(d_partials, x->f, n, ZERO_CHUNK); });
    /* the in-order sum of a micro-batch's losses: the same additions on both sides, bit-identical */
    size_t tokens = (size_t)s->B * s->T;
    double in_order_ref, in_order;
    double* d_in_order = (double*)dev_alloc(sizeof(double));
    kc_poison(d_in_order, sizeof(double));
    cpu_ref_sum_f32_in_order(&in_order_ref, x->h, tokens);
    op_sum_f32_in_order(d_in_order, x->f, tokens);
    dev_download(&in_order, d_in_order, sizeof(double));
    int in_order_ok = memcmp(&in_order, &in_order_ref, sizeof(double)) == 0;
    printf("    sum_f32_in_order of %zu: gpu %.17g, cpu %.17g, tol bit-identical%s\n", tokens, in_order, in_order_ref,
           in_order_ok ? "" : "  FAIL");
    failed += !in_order_ok;
    kc_time("sum_f32_in_order", iters, 4.0 * tokens, 0.0, [&] { op_sum_f32_in_order(d_in_order, x->f, tokens); });
    kc_set_free(&set);
    free(ref);
    free(got);
    dev_free(d_partials);
    dev_free(d_in_order);
    return failed;
}

/*
 * A stored array (optim.h StoreCodec: the gradient buffer's bf16 and E4M3, the master weights' FP16): three
 * rows of FP32 stored into a poisoned array, the first without reading it (op_store_add), the next two
 * added, on both sides, then decoded (op_store_load) alone and into a random FP32 bucket. Tolerance:
 * none. Each element is one FP32 addition of the same decoded value (a code times a power-of-two
 * scale_inv: exact, so an FMA contraction changes nothing), the amax is a max and the scale and
 * rounding are optim.h's functions: bytes, scale_inv and decodes bit-identical. Inputs: a ragged size (a
 * short last chunk), chunk magnitudes 2^U(-40, 40) with a factor 2^U(-12, 0) per element, one zero chunk,
 * a NaN in chunk 2 of the second row: exactly that chunk decodes to NaN when scaled, that element else.
 */
static int kc_store(const KernelShape* s, int iters, uint64_t seed, StoreCodec codec, const char* name) {
    uint64_t stream = seed;
    const int STEPS = 3;
    size_t n = (size_t)s->C * s->F / 2 + 321;
    if (n < 3 * ZERO_CHUNK) n = 3 * ZERO_CHUNK + 321;
    size_t bytes = n * store_bytes(codec), sc = store_scale_count(codec, n);
    KcSet set = {};
    KcBuf* x = kc_buf(&set, (size_t)STEPS * n, KC_F32);
    kc_fill_chunk_scaled(x->h, x->n, splitmix64(&stream));
    for (int t = 0; t < STEPS; t++)
        for (size_t i = ZERO_CHUNK; i < 2 * ZERO_CHUNK; i++) x->h[(size_t)t * n + i] = 0.0f;
    x->h[n + 2 * ZERO_CHUNK + 7] = NAN;
    kc_upload(x);
    uint8_t* ref = (uint8_t*)mallocCheck(bytes);
    memset(ref, 0x7f, bytes);
    float* ref_sinv = sc ? kc_host(sc) : NULL;
    for (size_t k = 0; k < sc; k++) ref_sinv[k] = NAN;
    void* d_dst = kc_dev_bytes(ref, bytes);
    float* d_sinv = sc ? kc_dev_f32(ref_sinv, sc) : NULL;
    for (int t = 0; t < STEPS; t++) {
        cpu_ref_store_add(codec, ref, ref_sinv, x->h + (size_t)t * n, n, t > 0);
        op_store_add(codec, d_dst, d_sinv, x->f + (size_t)t * n, n, t > 0);
    }
    uint8_t* got = (uint8_t*)mallocCheck(bytes);
    dev_download(got, d_dst, bytes);
    size_t first = 0, bad = kc_count_diff(got, ref, bytes, &first), bad_sinv = 0;
    float* got_sinv = sc ? kc_get_f32(d_sinv, sc) : NULL;
    if (sc) bad_sinv = kc_count_diff_f32(got_sinv, ref_sinv, sc, &first);
    int failed = bad != 0 || bad_sinv != 0;
    printf("    %s: %d stores of %zu: %zu bytes and %zu scale_inv differ, tol bit-identical%s\n", name, STEPS, n, bad, bad_sinv,
           failed ? "  FAIL" : "");

    KcBuf* bucket = kc_input(&set, n, splitmix64(&stream), 0.0f, 1.0f, KC_HOST);
    KcBuf* out = kc_buf(&set, n, KC_F32);
    for (int acc = 0; acc <= 1; acc++) {
        memcpy(out->h, bucket->h, n * sizeof(float));
        if (acc) kc_upload(out);
        else kc_poison(out->f, n * sizeof(float));
        cpu_ref_store_load(codec, out->h, ref, ref_sinv, n, acc);
        op_store_load(codec, out->f, d_dst, d_sinv, n, acc);
        char op[128];
        snprintf(op, sizeof(op), "op_store_load %s%s", name, acc ? " (accumulate)" : "");
        failed += kc_check_bits(op, out, store_is_scaled(codec) ? ZERO_CHUNK : 1);
    }
    kc_time(name, iters, 4.0 * n + 2.0 * (double)bytes + 8.0 * (double)sc, 0.0,
            [&] { op_store_add(codec, d_dst, d_sinv, x->f, n, 1); });
    kc_set_free(&set);
    free(ref);
    free(ref_sinv);
    free(got);
    free(got_sinv);
    dev_free(d_dst);
    if (d_sinv) dev_free(d_sinv);
    return failed;
}

static int kc_case_optimizer(const KernelShape* s, int iters, uint64_t seed) {
    return kc_case_params(s, iters, seed) + kc_case_sum_squares(s, iters, splitmix64(&seed)) +
           kc_store(s, iters, splitmix64(&seed), STORE_BF16, "store bf16 (--grad-buffer bf16)") +
           kc_store(s, iters, splitmix64(&seed), STORE_E4M3, "store e4m3 (--grad-buffer fp8)") +
           kc_store(s, iters, splitmix64(&seed), STORE_FP16, "store fp16 (--master-weights fp16)");
}
