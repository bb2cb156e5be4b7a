/*
 * Family fp8_weight (fp8/cast_cuda.cuh): the FP8 weights cast from the FP32 master weights,
 * op_amax_master, op_cast_transpose_master, op_transpose_fp8.
 */
#pragma once

#include "common.cuh"

/* Compares GPU and CPU codes of n bytes (bit-identical), printing one line; returns 1 on a difference. */
static inline int kc_codes_line(const char* label, const uint8_t* got, const uint8_t* ref, size_t n) {
    size_t first = 0, bad = kc_count_diff(got, ref, n, &first);
    printf("    %s: %zu of %zu codes differ, tol bit-identical%s\n", label, bad, n, bad ? "  FAIL" : "");
    if (bad) printf("      FAIL: first at %zu: gpu 0x%02x, cpu 0x%02x\n", first, got[first], ref[first]);
    return bad != 0;
}

/* Compares GPU and CPU scale records and counts (bit-identical); returns 1 on a difference. */
static inline int kc_scale_line(const char* label, const Fp8Scale* g, const Fp8Scale* c, const Fp8Counts* gc, const Fp8Counts* cc) {
    int ok = kc_same_bits(g->amax, c->amax) && kc_same_bits(g->scale, c->scale) && kc_same_bits(g->scale_inv, c->scale_inv) &&
             (gc == NULL || memcmp(gc, cc, sizeof(Fp8Counts)) == 0);
    printf("    %s: amax %.9g scale %.9g (gpu %.9g %.9g), tol bit-identical%s\n", label, c->amax, c->scale, g->amax, g->scale,
           ok ? "" : "  FAIL");
    return !ok;
}

/*
 * op_amax_master, op_cast_transpose_master, op_transpose_fp8. Tolerance: none, as fp8_cast: the BF16
 * rounding of the master weight is round-to-nearest-even on both sides, then fp8_cast's cast. The inputs
 * are FP32 values, not BF16 ones (the rounding is part of the ops): the shape's w13 (2F, C), an odd-sized
 * tensor, and one with a NaN. Each is cast whole, W and W^T with counts (as one rank does), and as a ZeRO
 * piece (elements [ZERO_CHUNK, 3 ZERO_CHUNK) as two ZERO_CHUNK rows, or the odd tensor's last 100 as one
 * row, W only, as a shard does); the whole W is then transposed by op_transpose_fp8 (after the gather).
 */
static int kc_case_fp8_weight(const KernelShape* s, int iters, uint64_t seed) {
    uint64_t stream = seed;
    int failed = 0;
    size_t shapes[3][2] = {{2 * (size_t)s->F, (size_t)s->C}, {3 * 64 + 17, 5 * 64 + 33}, {130, 70}};
    const char* kinds[3] = {"w13", "odd", "nan"};
    Fp8Scale* d_scale = (Fp8Scale*)dev_alloc(sizeof(Fp8Scale));
    Fp8Counts* d_counts = (Fp8Counts*)dev_alloc(sizeof(Fp8Counts));
    for (int t = 0; t < 3; t++) {
        size_t rows = shapes[t][0], cols = shapes[t][1], n = rows * cols;
        KcSet set = {};
        KcBuf* w = kc_buf(&set, n, KC_F32);
        kc_fill_normal(w->h, n, splitmix64(&stream), 0.0f, 0.02f, 0);
        if (t == 2) w->h[37 * cols + 11] = NAN;
        kc_upload(w);
        KcCodes c = kc_codes(n);
        char label[96];
        /* whole: W and W^T with counts */
        Fp8Scale sc = {NAN, NAN, NAN, NAN}, sg;
        Fp8Counts cc, cg;
        memset(&cc, 0, sizeof(cc));
        memset(c.ref, 0xFF, n);
        memset(c.ref_t, 0xFF, n);
        cpu_ref_amax_master(&sc, w->h, n);
        cpu_ref_cast_transpose_master(c.ref, c.ref_t, w->h, rows, cols, FP8_E4M3, &sc, 0, &cc);
        kc_poison(d_scale, sizeof(Fp8Scale));
        kc_codes_poison(&c);
        dev_zero(d_counts, sizeof(Fp8Counts));
        op_amax_master(d_scale, w->f, n);
        op_cast_transpose_master(c.d, c.d_t, w->f, rows, cols, FP8_E4M3, d_scale, 0, d_counts);
        dev_download(&sg, d_scale, sizeof(Fp8Scale));
        dev_download(&cg, d_counts, sizeof(Fp8Counts));
        snprintf(label, sizeof(label), "%s (%zu, %zu) whole", kinds[t], rows, cols);
        failed += kc_scale_line(label, &sg, &sc, &cg, &cc);
        kc_codes_download(&c);
        failed += kc_codes_line(label, c.got, c.ref, n);
        snprintf(label, sizeof(label), "%s (%zu, %zu) whole, transposed", kinds[t], rows, cols);
        failed += kc_codes_line(label, c.got_t, c.ref_t, n);
        /* W's transpose from the W codes (the CPU's transpose of its own codes is the reference) */
        cpu_ref_transpose_fp8(c.ref_t, c.ref, rows, cols);
        kc_poison(c.d_t, n);
        op_transpose_fp8(c.d_t, c.d, rows, cols);
        dev_download(c.got_t, c.d_t, n);
        snprintf(label, sizeof(label), "%s (%zu, %zu) op_transpose_fp8", kinds[t], rows, cols);
        failed += kc_codes_line(label, c.got_t, c.ref_t, n);
        /* a piece, W only */
        int chunked = n >= 3 * ZERO_CHUNK;
        size_t begin = chunked ? ZERO_CHUNK : n - 100, len = chunked ? 2 * ZERO_CHUNK : 100;
        size_t prows = chunked ? 2 : 1, pcols = chunked ? ZERO_CHUNK : len;
        cpu_ref_amax_master(&sc, w->h + begin, len);
        cpu_ref_cast_transpose_master(c.ref, NULL, w->h + begin, prows, pcols, FP8_E4M3, &sc, 1, NULL);
        kc_poison(d_scale, sizeof(Fp8Scale));
        kc_poison(c.d, n);
        op_amax_master(d_scale, w->f + begin, len);
        op_cast_transpose_master(c.d, NULL, w->f + begin, prows, pcols, FP8_E4M3, d_scale, 1, NULL);
        dev_download(&sg, d_scale, sizeof(Fp8Scale));
        dev_download(c.got, c.d, len);
        snprintf(label, sizeof(label), "%s piece [%zu, %zu) as (%zu, %zu), pow2", kinds[t], begin, begin + len, prows, pcols);
        failed += kc_scale_line(label, &sg, &sc, NULL, NULL);
        failed += kc_codes_line(label, c.got, c.ref, len);
        if (iters > 0 && t == 0) {
            kc_time("amax_master w13", iters, 4.0 * n, 0.0, [&] { op_amax_master(d_scale, w->f, n); });
            kc_time("cast_transpose_master w13", iters, 6.0 * n, 0.0,
                    [&] { op_cast_transpose_master(c.d, c.d_t, w->f, rows, cols, FP8_E4M3, d_scale, 0, NULL); });
            kc_time("transpose_fp8 w13", iters, 2.0 * n, 0.0, [&] { op_transpose_fp8(c.d_t, c.d, rows, cols); });
        }
        kc_set_free(&set);
        kc_codes_free(&c);
    }
    dev_free(d_scale);
    dev_free(d_counts);
    return failed;
}
