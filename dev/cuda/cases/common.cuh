/*
 * What every kernel case shares (dev/cuda/kernel_cases.cuh): the shape and case types, random inputs,
 * device transfers, the comparisons with their output lines, and timing.
 */
#pragma once

#include <math.h>
#include <omp.h>

#include "../cpu_reference.h"
#include "../../../core/rng.h"
#include "../../../cuda/backend.cuh"
#include "../../../comm/grad_fp8.cuh"
#include "../../../comm/zero.h"

/* Shape of a case: batch, sequence, model width, query heads, kv heads, SwiGLU hidden size, vocabulary. */
typedef struct {
    int B, T, C, NH, NKV, F, V;
} KernelShape;

/* One family of ops: run() returns the number of failed comparisons; iters > 0 also times the GPU ops. */
typedef struct {
    const char* family;
    const char* ops;
    int (*run)(const KernelShape* s, int iters, uint64_t seed);
} KernelCase;

/* The slowest timed op of the last run_kernel_case (0 when nothing was timed), for summaries. */
static double g_kernel_case_slowest_us = 0.0;
static char g_kernel_case_slowest_op[64] = "";

/* ------------------------------------------------------------ inputs */

/* Values per independently seeded chunk of a random fill: the values do not depend on the thread count. */
#define KC_FILL_CHUNK ((size_t)1 << 16)
#define KC_RMS_EPS 1e-5f

static inline float* kc_host(size_t n) { return (float*)mallocCheck(n * sizeof(float)); }

static inline void kc_nan_fill(float* x, size_t n) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) x[i] = NAN;
}

static inline Rng kc_chunk_rng(uint64_t seed, size_t chunk) {
    Rng r;
    rng_seed(&r, seed ^ (0x9e3779b97f4a7c15ull * (chunk + 1)));
    return r;
}

/* x (n) = draw(&r) value by value, with r seeded per KC_FILL_CHUNK values (chunks run in parallel). */
template <typename Draw>
static inline void kc_fill_chunked(float* x, size_t n, uint64_t seed, Draw draw) {
    size_t chunks = ceil_div(n, KC_FILL_CHUNK);
#pragma omp parallel for schedule(static)
    for (size_t k = 0; k < chunks; k++) {
        Rng r = kc_chunk_rng(seed, k);
        size_t end = (k + 1) * KC_FILL_CHUNK < n ? (k + 1) * KC_FILL_CHUNK : n;
        for (size_t i = k * KC_FILL_CHUNK; i < end; i++) x[i] = draw(&r);
    }
}

/* x (n) = mean + std * N(0, 1), rounded to BF16 values when bf16 (what a BF16 tensor can hold). */
static inline void kc_fill_normal(float* x, size_t n, uint64_t seed, float mean, float std, int bf16) {
    kc_fill_chunked(x, n, seed, [&](Rng* r) {
        float v = mean + std * rng_normal(r);
        return bf16 ? bf16_round(v) : v;
    });
}

/*
 * x (n) in chunks of ZERO_CHUNK values with magnitudes 2^U(-40, 40) per chunk times 2^U(-12, 0) per value,
 * times N(0, 1), from one stream: gradients of every scale, for the formats scaled per chunk.
 */
static inline void kc_fill_chunk_scaled(float* x, size_t n, uint64_t seed) {
    Rng r;
    rng_seed(&r, seed);
    for (size_t c = 0; c < ceil_div(n, ZERO_CHUNK); c++) {
        float mag = exp2f(-40.0f + 80.0f * rng_uniform(&r));
        size_t end = (c + 1) * ZERO_CHUNK < n ? (c + 1) * ZERO_CHUNK : n;
        for (size_t i = c * ZERO_CHUNK; i < end; i++) x[i] = mag * exp2f(-12.0f * rng_uniform(&r)) * rng_normal(&r);
    }
}

/* BF16 values of random sign and magnitudes log-uniform in [2^-20, 2^2): exercises FP8 underflow. */
static inline void kc_fill_log_uniform(float* x, size_t n, uint64_t seed) {
    kc_fill_chunked(x, n, seed, [](Rng* r) {
        float v = exp2f(-20.0f + 22.0f * rng_uniform(r));
        return bf16_round(rng_uniform(r) < 0.5f ? -v : v);
    });
}

/* ------------------------------------------------------------ device transfers */

static inline void kc_poison(void* d, size_t bytes) { cudaCheck(cudaMemset(d, 0xFF, bytes)); }

/*
 * d (n BF16) = x (n), which must hold BF16 values already (both sides then see the same inputs). The
 * BF16 bits are the float's upper half, exact for BF16 values and keeping a NaN's payload (unlike
 * __float2bfloat16_rn, which returns a canonical NaN).
 */
static inline void kc_upload_act(act_t* d, const float* x, size_t n) {
    uint16_t* tmp = (uint16_t*)mallocCheck(n * sizeof(uint16_t));
    size_t inexact = 0;
#pragma omp parallel for schedule(static) reduction(+ : inexact)
    for (size_t i = 0; i < n; i++) {
        float r = bf16_round(x[i]);
        inexact += !(float_bits(r) == float_bits(x[i]) || (x[i] != x[i] && r != r));
        tmp[i] = (uint16_t)(float_bits(x[i]) >> 16);
    }
    if (inexact) die("kernel case: %zu of %zu inputs are not BF16 values (round them before uploading)", inexact, n);
    dev_upload(d, tmp, n * sizeof(act_t));
    free(tmp);
}

static inline act_t* kc_dev_act(const float* x, size_t n) {
    act_t* d = (act_t*)dev_alloc(n * sizeof(act_t));
    kc_upload_act(d, x, n);
    return d;
}

static inline float* kc_dev_f32(const float* x, size_t n) {
    float* d = (float*)dev_alloc(n * sizeof(float));
    dev_upload(d, x, n * sizeof(float));
    return d;
}

static inline void* kc_dev_bytes(const void* x, size_t bytes) {
    void* d = dev_alloc(bytes);
    dev_upload(d, x, bytes);
    return d;
}

/* Host floats (malloc'd) of a device tensor; waits for the queued work first (synchronous copy). */
static inline float* kc_get_act(const act_t* d, size_t n) {
    float* x = kc_host(n);
    act_to_float_host(x, d, n);
    return x;
}

static inline float* kc_get_f32(const float* d, size_t n) {
    float* x = kc_host(n);
    dev_download(x, d, n * sizeof(float));
    return x;
}

/* ------------------------------------------------------------ buffer sets */

/*
 * A case's buffer set: each buffer is one tensor on both sides, the host floats the CPU op reads or
 * writes and, unless it is host-only, the device tensor the GPU op reads or writes (BF16 or FP32). The
 * set owns its buffers (kc_set_free frees them all), so a case reads: inputs, the CPU op, the GPU op,
 * the comparisons.
 */
typedef enum { KC_HOST, KC_BF16, KC_F32 } KcStore;

typedef struct {
    float* h;  /* n host floats */
    act_t* a;  /* the device tensor when KC_BF16, else NULL */
    float* f;  /* the device tensor when KC_F32, else NULL */
    size_t n;
    KcStore store;
} KcBuf;

#define KC_SET_MAX 16
typedef struct {
    KcBuf bufs[KC_SET_MAX];
    int count;
} KcSet;

/* A new buffer of n elements: host and device memory, neither written. */
static inline KcBuf* kc_buf(KcSet* set, size_t n, KcStore store) {
    if (set->count == KC_SET_MAX) die("kernel case: more than %d buffers in one set", KC_SET_MAX);
    KcBuf* b = &set->bufs[set->count++];
    b->h = kc_host(n);
    b->a = store == KC_BF16 ? (act_t*)dev_alloc(n * sizeof(act_t)) : NULL;
    b->f = store == KC_F32 ? (float*)dev_alloc(n * sizeof(float)) : NULL;
    b->n = n;
    b->store = store;
    return b;
}

/* Copies the host values to the device tensor (BF16 values only when KC_BF16: kc_upload_act). */
static inline void kc_upload(KcBuf* b) {
    if (b->a) kc_upload_act(b->a, b->h, b->n);
    if (b->f) dev_upload(b->f, b->h, b->n * sizeof(float));
}

/* An input: mean + std * N(0, 1) from seed (rounded to BF16 values when stored BF16), uploaded. */
static inline KcBuf* kc_input(KcSet* set, size_t n, uint64_t seed, float mean, float std, KcStore store) {
    KcBuf* b = kc_buf(set, n, store);
    kc_fill_normal(b->h, n, seed, mean, std, store == KC_BF16);
    kc_upload(b);
    return b;
}

/* An output: NaN on the host, poisoned on the device. */
static inline KcBuf* kc_output(KcSet* set, size_t n, KcStore store) {
    KcBuf* b = kc_buf(set, n, store);
    kc_nan_fill(b->h, n);
    if (b->a) kc_poison(b->a, n * sizeof(act_t));
    if (b->f) kc_poison(b->f, n * sizeof(float));
    return b;
}

/* Host floats (malloc'd) of the device tensor. */
static inline float* kc_download(const KcBuf* b) { return b->a ? kc_get_act(b->a, b->n) : kc_get_f32(b->f, b->n); }

/* Frees every buffer of the set; the set is empty again. */
static inline void kc_set_free(KcSet* set) {
    for (int i = 0; i < set->count; i++) {
        free(set->bufs[i].h);
        if (set->bufs[i].a) dev_free(set->bufs[i].a);
        if (set->bufs[i].f) dev_free(set->bufs[i].f);
    }
    set->count = 0;
}

/* ------------------------------------------------------------ comparisons */

/* Explicit mantissa bits of the stored formats, for ulp tolerances. */
#define KC_BF16_MANT 7
#define KC_F32_MANT 23

/* ulp of |x| in a format with `mant` mantissa bits: 2^(floor(log2 |x|) - mant); 0 for x == 0. */
static inline double kc_ulp(double x, int mant) {
    if (x == 0.0 || !isfinite(x)) return 0.0;
    int e;
    frexp(fabs(x), &e);
    return ldexp(1.0, e - 1 - mant);
}

static inline void kc_print_bad(size_t bad, size_t n, size_t first, double g, double c) {
    if (bad) printf("      FAIL: %zu of %zu outside; first at index %zu: gpu %.9g, cpu %.9g\n", bad, n, first, g, c);
}

/*
 * Elementwise check: |gpu - cpu| <= ulps * ulp(cpu) + atol for every element (ulp in the format with `mant`
 * mantissa bits); NaN must meet NaN and an infinity the same infinity. Returns 1 on failure.
 */
static inline int kc_compare_ulps(const char* op, const float* got, const float* ref, size_t n, int mant, double ulps,
                                  double atol) {
    double max_abs = 0.0, diff2 = 0.0, ref2 = 0.0;
    size_t bad = 0, first = (size_t)-1;
#pragma omp parallel for schedule(static) reduction(max : max_abs) reduction(+ : diff2, ref2, bad) reduction(min : first)
    for (size_t i = 0; i < n; i++) {
        double g = got[i], c = ref[i];
        int ok;
        if (isnan(g) || isnan(c)) {
            ok = isnan(g) && isnan(c);
        } else if (isinf(g) || isinf(c)) {
            ok = g == c;
        } else {
            double d = fabs(g - c);
            ok = d <= ulps * kc_ulp(c, mant) + atol;
            max_abs = d > max_abs ? d : max_abs;
            diff2 += d * d;
            ref2 += c * c;
        }
        if (!ok) {
            bad++;
            first = i < first ? i : first;
        }
    }
    double rel = ref2 > 0.0 ? sqrt(diff2 / ref2) : sqrt(diff2);
    char tol[64];
    if (ulps == 0.0 && atol == 0.0) snprintf(tol, sizeof(tol), "bit-identical");
    else snprintf(tol, sizeof(tol), "%g %s ulp + %.0e", ulps, mant == KC_BF16_MANT ? "BF16" : "FP32", atol);
    printf("    %s: max abs err %.3e, rel L2 %.3e, tol %s%s\n", op, max_abs, rel, tol, bad ? "  FAIL" : "");
    if (bad) kc_print_bad(bad, n, first, got[first], ref[first]);
    return bad != 0;
}

/*
 * Norm check for reductions, attention and GEMMs: relative L2 error <= rel_l2_tol and max abs error <=
 * max_abs_frac * max |cpu|; any non-finite value fails. Returns 1 on failure.
 */
static inline int kc_compare_norm(const char* op, const float* got, const float* ref, size_t n, double rel_l2_tol,
                                  double max_abs_frac) {
    double max_abs = 0.0, diff2 = 0.0, ref2 = 0.0, ref_max = 0.0;
    size_t nonfinite = 0, first = (size_t)-1, arg = 0;
#pragma omp parallel for schedule(static) reduction(max : max_abs, ref_max) reduction(+ : diff2, ref2, nonfinite) \
    reduction(min : first)
    for (size_t i = 0; i < n; i++) {
        double g = got[i], c = ref[i];
        if (!isfinite(g) || !isfinite(c)) {
            nonfinite++;
            first = i < first ? i : first;
            continue;
        }
        double d = fabs(g - c);
        max_abs = d > max_abs ? d : max_abs;
        ref_max = fabs(c) > ref_max ? fabs(c) : ref_max;
        diff2 += d * d;
        ref2 += c * c;
    }
    double rel = ref2 > 0.0 ? sqrt(diff2 / ref2) : sqrt(diff2);
    double abs_tol = max_abs_frac * ref_max;
    int failed = nonfinite != 0 || rel > rel_l2_tol || max_abs > abs_tol;
    printf("    %s: max abs err %.3e, rel L2 %.3e, tol rel L2 %.0e, max abs %.3e (%.0e x max|cpu| %.3e)%s\n", op, max_abs, rel,
           rel_l2_tol, abs_tol, max_abs_frac, ref_max, failed ? "  FAIL" : "");
    if (nonfinite) kc_print_bad(nonfinite, n, first, got[first], ref[first]);
    if (failed && !nonfinite) {
        for (size_t i = 0; i < n; i++) {
            if (fabs((double)got[i] - ref[i]) == max_abs) {
                arg = i;
                break;
            }
        }
        printf("      FAIL: largest error at index %zu: gpu %.9g, cpu %.9g\n", arg, got[arg], ref[arg]);
    }
    return failed;
}

/* The device tensor of b against its host values (the CPU op's output), as kc_compare_ulps. */
static inline int kc_check_ulps(const char* op, const KcBuf* b, int mant, double ulps, double atol) {
    float* got = kc_download(b);
    int failed = kc_compare_ulps(op, got, b->h, b->n, mant, ulps, atol);
    free(got);
    return failed;
}

/* The device tensor of b against its host values, as kc_compare_norm. */
static inline int kc_check_norm(const char* op, const KcBuf* b, double rel_l2_tol, double max_abs_frac) {
    float* got = kc_download(b);
    int failed = kc_compare_norm(op, got, b->h, b->n, rel_l2_tol, max_abs_frac);
    free(got);
    return failed;
}

/* Number of differing bytes (prints the first); n == 0 compares nothing. */
static inline size_t kc_count_diff(const uint8_t* got, const uint8_t* ref, size_t n, size_t* first) {
    size_t bad = 0, f = (size_t)-1;
#pragma omp parallel for schedule(static) reduction(+ : bad) reduction(min : f)
    for (size_t i = 0; i < n; i++) {
        if (got[i] != ref[i]) {
            bad++;
            f = i < f ? i : f;
        }
    }
    *first = f;
    return bad;
}

/* Bit-identical floats; two NaNs count as equal whatever their payloads (a NaN's bits carry no meaning here). */
static inline int kc_same_bits(float a, float b) { return float_bits(a) == float_bits(b) || (a != a && b != b); }

/* Number of non-finite values among n. */
static inline size_t kc_count_nonfinite(const float* x, size_t n) {
    size_t bad = 0;
#pragma omp parallel for schedule(static) reduction(+ : bad)
    for (size_t i = 0; i < n; i++) bad += !isfinite(x[i]);
    return bad;
}

/*
 * A GPU cast against the CPU cast of the same values, bit for bit: the codes (rows, cols) and the
 * transposed codes (got or got_t NULL: that layout was not written), amax, scale and scale_inv (two NaN
 * amaxes count as equal). Prints a line for the codes and one for the scale; returns the failures.
 */
static inline int kc_compare_cast(const char* label, const uint8_t* got, const uint8_t* got_t, const uint8_t* ref,
                                  const uint8_t* ref_t, size_t n, Fp8Scale sg, Fp8Scale sc) {
    size_t first = 0, first_t = 0;
    size_t bad = got ? kc_count_diff(got, ref, n, &first) : 0;
    size_t bad_t = got_t ? kc_count_diff(got_t, ref_t, n, &first_t) : 0;
    printf("    %s codes: %zu of %zu differ%s, %zu of %zu transposed differ%s, tol bit-identical%s\n", label, bad,
           got ? n : 0, got ? "" : " (not written)", bad_t, got_t ? n : 0, got_t ? "" : " (not written)",
           bad || bad_t ? "  FAIL" : "");
    if (bad) printf("      FAIL: first code at %zu: gpu 0x%02x, cpu 0x%02x\n", first, got[first], ref[first]);
    if (bad_t) printf("      FAIL: first transposed code at %zu: gpu 0x%02x, cpu 0x%02x\n", first_t, got_t[first_t], ref_t[first_t]);
    int scale_ok = kc_same_bits(sg.amax, sc.amax) && kc_same_bits(sg.scale, sc.scale) &&
                   kc_same_bits(sg.scale_inv, sc.scale_inv) && kc_same_bits(sg.nonfinite, sc.nonfinite);
    printf("    %s amax %.9g scale %.9g scale_inv %.9g nonfinite %g, tol bit-identical%s\n", label, sc.amax, sc.scale,
           sc.scale_inv, sc.nonfinite, scale_ok ? "" : "  FAIL");
    if (!scale_ok)
        printf("      FAIL: gpu amax %.9g scale %.9g scale_inv %.9g nonfinite %g\n", sg.amax, sg.scale, sg.scale_inv, sg.nonfinite);
    return (bad != 0) + (bad_t != 0) + !scale_ok;
}

/* ------------------------------------------------------------ FP8 codes */

/*
 * The FP8 codes of one cast on both sides, n bytes in each layout: the CPU's (ref row-major, ref_t
 * transposed), the GPU's (d, d_t) and their downloads (got, got_t).
 */
typedef struct {
    uint8_t *ref, *ref_t, *got, *got_t, *d, *d_t;
    size_t n;
} KcCodes;

static inline KcCodes kc_codes(size_t n) {
    KcCodes c = {(uint8_t*)mallocCheck(n), (uint8_t*)mallocCheck(n), (uint8_t*)mallocCheck(n), (uint8_t*)mallocCheck(n),
                 (uint8_t*)dev_alloc(n),   (uint8_t*)dev_alloc(n),   n};
    return c;
}

/* Poisons the GPU's codes (0xFF is a NaN code in both formats). */
static inline void kc_codes_poison(KcCodes* c) {
    kc_poison(c->d, c->n);
    kc_poison(c->d_t, c->n);
}

/* got, got_t = the GPU's codes (a synchronous copy). */
static inline void kc_codes_download(KcCodes* c) {
    dev_download(c->got, c->d, c->n);
    dev_download(c->got_t, c->d_t, c->n);
}

/* kc_compare_cast of the downloaded codes in the layouts the cast wrote (out: row-major, out_t: transposed). */
static inline int kc_codes_compare(const char* label, const KcCodes* c, int out, int out_t, Fp8Scale sg, Fp8Scale sc) {
    return kc_compare_cast(label, out ? c->got : NULL, out_t ? c->got_t : NULL, c->ref, c->ref_t, c->n, sg, sc);
}

static inline void kc_codes_free(KcCodes* c) {
    free(c->ref);
    free(c->ref_t);
    free(c->got);
    free(c->got_t);
    dev_free(c->d);
    dev_free(c->d_t);
}

/* ------------------------------------------------------------ timing */

/*
 * Mean time of `launch` over iters calls after one warm-up, with CUDA events on the default stream; prints
 * microseconds and TFLOP/s (flops > 0) or effective GB/s (bytes each call must move at least); returns
 * the microseconds. iters <= 0: nothing, returns 0.
 */
template <typename Launch>
static inline double kc_time(const char* op, int iters, double bytes, double flops, Launch launch) {
    if (iters <= 0) return 0.0;
    launch();
    cudaCheck(cudaDeviceSynchronize());
    cudaEvent_t start, stop;
    cudaCheck(cudaEventCreate(&start));
    cudaCheck(cudaEventCreate(&stop));
    cudaCheck(cudaEventRecord(start, 0));
    for (int i = 0; i < iters; i++) launch();
    cudaCheck(cudaEventRecord(stop, 0));
    cudaCheck(cudaEventSynchronize(stop));
    float ms = 0.0f;
    cudaCheck(cudaEventElapsedTime(&ms, start, stop));
    cudaCheck(cudaEventDestroy(start));
    cudaCheck(cudaEventDestroy(stop));
    cudaCheck(cudaGetLastError());
    double us = 1000.0 * ms / iters;
    if (flops > 0.0) printf("    %s: %.1f us, %.1f TFLOP/s\n", op, us, flops / (us * 1e-6) / 1e12);
    else printf("    %s: %.1f us, %.1f GB/s\n", op, us, bytes / (us * 1e-6) / 1e9);
    if (us > g_kernel_case_slowest_us) {
        g_kernel_case_slowest_us = us;
        snprintf(g_kernel_case_slowest_op, sizeof(g_kernel_case_slowest_op), "%s", op);
    }
    return us;
}

/* ------------------------------------------------------------ bit-identical floats, fused amax */

/* Floats of got and ref that are not bit-identical (two NaNs are equal); the first in *first. */
static inline size_t kc_count_diff_f32(const float* got, const float* ref, size_t n, size_t* first) {
    size_t bad = 0, f = (size_t)-1;
    for (size_t i = 0; i < n; i++) {
        if (!kc_same_bits(got[i], ref[i])) {
            bad++;
            f = i < f ? i : f;
        }
    }
    *first = f;
    return bad;
}

/*
 * A producer's fused amax against op_amax of what it wrote, on each side: the GPU's fused amax (d_fused
 * after the producer) against op_amax of its output d_out (n), and the CPU's (cpu_fused) against
 * cpu_ref_amax of its output. Tolerance: none; the bits must match exactly (a NaN amax included: both
 * take the largest sign-cleared BF16 pattern on the GPU, amax_combine's NaN on the CPU). Returns the
 * failures.
 */
static inline int kc_compare_fused_amax(const char* label, const Fp8Scale* d_fused, const act_t* d_out, size_t n,
                                        float cpu_fused, const float* cpu_out) {
    Fp8Scale* d_separate = (Fp8Scale*)dev_alloc(sizeof(Fp8Scale));
    kc_poison(d_separate, sizeof(Fp8Scale));
    op_amax(d_separate, d_out, n);
    Fp8Scale fused, separate, cpu_separate;
    dev_download(&fused, d_fused, sizeof(Fp8Scale));
    dev_download(&separate, d_separate, sizeof(Fp8Scale));
    dev_free(d_separate);
    cpu_ref_amax(&cpu_separate, cpu_out, n);
    int gpu_ok = float_bits(fused.amax) == float_bits(separate.amax);
    int cpu_ok = float_bits(cpu_fused) == float_bits(cpu_separate.amax);
    printf("    %s fused amax: gpu %.9g (0x%08x) vs op_amax 0x%08x, cpu %.9g vs op_amax %.9g, tol bit-identical%s\n", label,
           fused.amax, float_bits(fused.amax), float_bits(separate.amax), cpu_fused, cpu_separate.amax,
           gpu_ok && cpu_ok ? "" : "  FAIL");
    return !gpu_ok + !cpu_ok;
}

/*
 * The device tensor of b against its host values bit for bit (two NaNs are equal), with exactly
 * want_nonfinite non-finite values. Returns 1 on failure.
 */
static inline int kc_check_bits(const char* op, const KcBuf* b, size_t want_nonfinite) {
    float* got = kc_download(b);
    size_t first = 0, bad = kc_count_diff_f32(got, b->h, b->n, &first), nonfinite = kc_count_nonfinite(got, b->n);
    int ok = bad == 0 && nonfinite == want_nonfinite;
    printf("    %s: %zu of %zu differ, %zu non-finite (want %zu), tol bit-identical%s\n", op, bad, b->n, nonfinite, want_nonfinite,
           ok ? "" : "  FAIL");
    if (bad) printf("      FAIL: first at %zu: gpu %.9g, cpu %.9g\n", first, got[first], b->h[first]);
    free(got);
    return !ok;
}
