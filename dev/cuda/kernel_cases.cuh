/*
 * Kernel cases: every GPU op of the CUDA backend (cuda/backend.cuh) checked against the CPU op of the same
 * name (llama/backend.h is the contract both follow), one case per op family (one file of cuda/ or of
 * the FP8 library each), optionally timed. Used by the kernel playground dev/cuda/bench_kernels.cu
 * (Llama-2 7B/13B shapes, with timings) and by test_llama.cu (a small shape, no timings).
 *
 * The GPU ops take device pointers; the CPU ops are the CPU backend compiled on its own
 * (build/cpu_reference.o, names cpu_ref_*: dev/cuda/cpu_reference.h) and take host floats. The CPU side
 * runs in BF16 mode (cpu_ref_init(PRECISION_BF16), done by run_kernel_case) so that it rounds to BF16
 * wherever the GPU stores BF16.
 *
 * Every case draws fresh inputs from its seed (core/rng.h), rounds them to BF16 values where the GPU
 * reads BF16 so that both sides see identical inputs, poisons the outputs (0xFF bytes on the GPU = NaN
 * in BF16 and FP32; NaN on the CPU), runs both ops, compares every output against a stated tolerance
 * and prints one line per output; with iters > 0 it then times the GPU op with CUDA events. A case
 * returns its number of failed comparisons. This header must not include model/model.h or trainer.h:
 * test_llama.cu includes it after train_llama.cu.
 */
#pragma once

#include <math.h>
#include <omp.h>

#include "cpu_reference.h"
#include "../../core/rng.h"
#include "../../cuda/backend.cuh"
#include "../../comm/grad_fp8.cuh"
#include "../../comm/zero.h"

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

/* x (n) = mean + std * N(0, 1), rounded to BF16 values when bf16 (what a BF16 tensor can hold). */
static inline void kc_fill_normal(float* x, size_t n, uint64_t seed, float mean, float std, int bf16) {
    size_t chunks = ceil_div(n, KC_FILL_CHUNK);
#pragma omp parallel for schedule(static)
    for (size_t k = 0; k < chunks; k++) {
        Rng r = kc_chunk_rng(seed, k);
        size_t end = (k + 1) * KC_FILL_CHUNK < n ? (k + 1) * KC_FILL_CHUNK : n;
        for (size_t i = k * KC_FILL_CHUNK; i < end; i++) {
            float v = mean + std * rng_normal(&r);
            x[i] = bf16 ? bf16_round(v) : v;
        }
    }
}

/* BF16 values of random sign and magnitudes log-uniform in [2^-20, 2^2): exercises FP8 underflow. */
static inline void kc_fill_log_uniform(float* x, size_t n, uint64_t seed) {
    size_t chunks = ceil_div(n, KC_FILL_CHUNK);
#pragma omp parallel for schedule(static)
    for (size_t k = 0; k < chunks; k++) {
        Rng r = kc_chunk_rng(seed, k);
        size_t end = (k + 1) * KC_FILL_CHUNK < n ? (k + 1) * KC_FILL_CHUNK : n;
        for (size_t i = k * KC_FILL_CHUNK; i < end; i++) {
            float v = exp2f(-20.0f + 22.0f * rng_uniform(&r));
            x[i] = bf16_round(rng_uniform(&r) < 0.5f ? -v : v);
        }
    }
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

/* ------------------------------------------------------------ params: op_params_from_master, op_adamw */

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
    float* master = kc_host(n);
    float* grads = kc_host(n);
    kc_fill_normal(master, n, splitmix64(&stream), 0.0f, 0.02f, 0);
    kc_fill_normal(grads, n, splitmix64(&stream), 0.0f, 1e-2f, 0);
    void* hm = callocCheck(mb, 1);
    void* hv = callocCheck(vb, 1);
    float* hsinv = sc ? kc_host(sc) : NULL;
    for (size_t k = 0; k < sc; k++) hsinv[k] = 1.0f;
    float* d_master = kc_dev_f32(master, n);
    float* d_grads = kc_dev_f32(grads, n);
    AdamwMoments hs = {format, hm, hv, hsinv};
    AdamwMoments ds = {format, kc_dev_bytes(hm, mb), kc_dev_bytes(hv, vb), sc ? kc_dev_f32(hsinv, sc) : NULL};
    float lr = 3e-4f, wd = 0.1f, grad_scale = 0.5f;
    for (int step = 1; step <= 2; step++) {
        float bc1 = 1.0f - powf(ADAMW_BETA1, (float)step), bc2_sqrt = sqrtf(1.0f - powf(ADAMW_BETA2, (float)step));
        cpu_ref_adamw(master, hs, grads, n, lr, wd, bc1, bc2_sqrt, grad_scale);
        op_adamw(d_master, ds, d_grads, n, lr, wd, bc1, bc2_sqrt, grad_scale);
    }
    printf("    --optim-state %s:\n", optim_state_name(format));
    float* got_master = kc_get_f32(d_master, n);
    failed += kc_compare_ulps("adamw master", got_master, master, n, KC_F32_MANT, 4.0, 1e-9);
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
            [&] { op_adamw(d_master, ds, d_grads, n, lr, wd, 0.5f, 0.5f, grad_scale); });
    free(got_master);
    free(gm);
    free(gv);
    free(gsinv);
    free(master);
    free(grads);
    free(hm);
    free(hv);
    free(hsinv);
    dev_free(d_master);
    dev_free(d_grads);
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
    float* master = kc_host(n);
    kc_fill_normal(master, n, splitmix64(&stream), 0.0f, 0.02f, 0);
    float* d_master = kc_dev_f32(master, n);

    float* ref = kc_host(n);
    kc_nan_fill(ref, n);
    cpu_ref_params_from_master(ref, master, n);
    act_t* d_out = (act_t*)dev_alloc(n * sizeof(act_t));
    kc_poison(d_out, n * sizeof(act_t));
    op_params_from_master(d_out, d_master, n);
    float* got = kc_get_act(d_out, n);
    failed += kc_compare_ulps("params_from_master", got, ref, n, KC_BF16_MANT, 0.0, 0.0);
    kc_time("params_from_master", iters, 6.0 * n, 0.0, [&] { op_params_from_master(d_out, d_master, n); });
    free(got);
    free(ref);
    dev_free(d_out);

    float* m = kc_host(n);
    float* v = kc_host(n);
    float* grads = kc_host(n);
    kc_fill_normal(m, n, splitmix64(&stream), 0.0f, 1e-3f, 0);
    /* second moments of gradients ~1e-3, as after some steps: m / sqrt(v) stays O(1), so the update does
       not dwarf (and cancel against) the master weight, which an ulp tolerance could not absorb */
    kc_fill_normal(v, n, splitmix64(&stream), 1e-6f, 1e-7f, 0);
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) v[i] = fabsf(v[i]);
    kc_fill_normal(grads, n, splitmix64(&stream), 0.0f, 1e-2f, 0);
    float* d_m = kc_dev_f32(m, n);
    float* d_v = kc_dev_f32(v, n);
    float* d_grads = kc_dev_f32(grads, n);
    const int step = 10;
    float lr = 3e-4f, wd = 0.1f, grad_scale = 0.5f;
    float bc1 = 1.0f - powf(ADAMW_BETA1, (float)step), bc2_sqrt = sqrtf(1.0f - powf(ADAMW_BETA2, (float)step));
    AdamwMoments host_s = {OPTIM_STATE_FP32, m, v, NULL}, dev_s = {OPTIM_STATE_FP32, d_m, d_v, NULL};
    cpu_ref_adamw(master, host_s, grads, n, lr, wd, bc1, bc2_sqrt, grad_scale);
    op_adamw(d_master, dev_s, d_grads, n, lr, wd, bc1, bc2_sqrt, grad_scale);
    float* got_master = kc_get_f32(d_master, n);
    float* got_m = kc_get_f32(d_m, n);
    float* got_v = kc_get_f32(d_v, n);
    failed += kc_compare_ulps("adamw master", got_master, master, n, KC_F32_MANT, 4.0, 1e-9);
    failed += kc_compare_ulps("adamw m", got_m, m, n, KC_F32_MANT, 4.0, 1e-9);
    failed += kc_compare_ulps("adamw v", got_v, v, n, KC_F32_MANT, 4.0, 1e-12);
    kc_time("adamw", iters, 28.0 * n, 0.0,
            [&] { op_adamw(d_master, dev_s, d_grads, n, lr, wd, bc1, bc2_sqrt, grad_scale); });
    free(got_master);
    free(got_m);
    free(got_v);
    free(master);
    free(m);
    free(v);
    free(grads);
    dev_free(d_master);
    dev_free(d_m);
    dev_free(d_v);
    dev_free(d_grads);
    failed += kc_adamw_lowp(s, iters, splitmix64(&stream), OPTIM_STATE_BF16);
    failed += kc_adamw_lowp(s, iters, splitmix64(&stream), OPTIM_STATE_FP8);
    return failed;
}

/* ------------------------------------------------------------ encoder: op_encoder_forward, op_encoder_backward */

/* Distinct tokens that about half of the positions draw from, so that backward sums repeated rows. */
#define KC_TOKEN_POOL 64

/*
 * Tolerances: forward is a copy (bit-identical). Backward sums each token's rows in position order,
 * starting from dwte's value, on both sides (the GPU buckets by token on the host): bit-identical too.
 */
static int kc_case_encoder(const KernelShape* s, int iters, uint64_t seed) {
    uint64_t stream = seed;
    int failed = 0;
    size_t N = (size_t)s->B * s->T, C = (size_t)s->C, V = (size_t)s->V;
    Rng rng;
    rng_seed(&rng, splitmix64(&stream));
    int pool[KC_TOKEN_POOL];
    for (int i = 0; i < KC_TOKEN_POOL; i++) pool[i] = (int)rng_below(&rng, V);
    int* tokens = (int*)mallocCheck(N * sizeof(int));
    for (size_t i = 0; i < N; i++)
        tokens[i] = rng_uniform(&rng) < 0.5f ? pool[rng_below(&rng, KC_TOKEN_POOL)] : (int)rng_below(&rng, V);
    tokens[0] = (int)V - 1; /* the last row of wte */
    size_t distinct = 0;
    {
        char* seen = (char*)callocCheck(V, 1);
        for (size_t i = 0; i < N; i++) {
            distinct += !seen[tokens[i]];
            seen[tokens[i]] = 1;
        }
        free(seen);
    }
    int* d_tokens = (int*)kc_dev_bytes(tokens, N * sizeof(int));

    float* wte = kc_host(V * C);
    kc_fill_normal(wte, V * C, splitmix64(&stream), 0.0f, 1.0f, 1);
    act_t* d_wte = kc_dev_act(wte, V * C);
    float* ref = kc_host(N * C);
    kc_nan_fill(ref, N * C);
    cpu_ref_encoder_forward(ref, tokens, wte, N, (int)C);
    act_t* d_out = (act_t*)dev_alloc(N * C * sizeof(act_t));
    kc_poison(d_out, N * C * sizeof(act_t));
    op_encoder_forward(d_out, d_tokens, d_wte, N, (int)C);
    float* got = kc_get_act(d_out, N * C);
    failed += kc_compare_ulps("encoder_forward", got, ref, N * C, KC_BF16_MANT, 0.0, 0.0);
    kc_time("encoder_forward", iters, 4.0 * N * C, 0.0, [&] { op_encoder_forward(d_out, d_tokens, d_wte, N, (int)C); });
    free(got);
    free(ref);
    free(wte);
    dev_free(d_out);
    dev_free(d_wte);

    float* dwte = kc_host(V * C);
    kc_fill_normal(dwte, V * C, splitmix64(&stream), 0.0f, 1e-2f, 0); /* accumulates into earlier gradients */
    float* dout = kc_host(N * C);
    kc_fill_normal(dout, N * C, splitmix64(&stream), 0.0f, 1.0f, 1);
    float* d_dwte = kc_dev_f32(dwte, V * C);
    act_t* d_dout = kc_dev_act(dout, N * C);
    cpu_ref_encoder_backward(dwte, dout, tokens, N, (int)C);
    op_encoder_backward(d_dwte, d_dout, d_tokens, tokens, N, (int)C);
    got = kc_get_f32(d_dwte, V * C);
    failed += kc_compare_ulps("encoder_backward dwte", got, dwte, V * C, KC_F32_MANT, 0.0, 0.0);
    kc_time("encoder_backward", iters, 2.0 * N * C + 8.0 * distinct * C, 0.0,
            [&] { op_encoder_backward(d_dwte, d_dout, d_tokens, tokens, N, (int)C); });
    free(got);
    free(dwte);
    free(dout);
    free(tokens);
    dev_free(d_dwte);
    dev_free(d_dout);
    dev_free(d_tokens);
    return failed;
}

/* ------------------------------------------------------------ fused amax (rmsnorm, swiglu) */

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

/* ------------------------------------------------------------ rmsnorm */

/*
 * Tolerances. rstd: the GPU sums x^2 in FP32 (per thread, then a block tree), the CPU in double: relative
 * error ~1e-6 at C = 5120, so 64 FP32 ulps. out = x * rstd * w stored BF16: that rstd difference can
 * move a value across a BF16 rounding boundary, so 2 BF16 ulps (+1e-6). resid_out is one FP32 add and
 * one rounding on both sides: bit-identical. dinp: besides the rounding, g*w - xh*mean and the += can
 * cancel, where FMA contraction (GPU) leaves ~1e-7 absolute differences: 2 BF16 ulps + 1e-5.
 * dweight sums N rows: serially in FP32 on the CPU (random-walk error ~2^-24 * N * |dout*xh|, i.e. ~2e-6
 * relative at N = 4096), in per-block partials on the GPU: rel L2 3e-5, max abs 3e-5 x max|cpu|.
 */
static int kc_case_rmsnorm(const KernelShape* s, int iters, uint64_t seed) {
    uint64_t stream = seed;
    int failed = 0;
    size_t N = (size_t)s->B * s->T, C = (size_t)s->C, NC = N * C;
    float* inp = kc_host(NC);
    float* weight = kc_host(C);
    kc_fill_normal(inp, NC, splitmix64(&stream), 0.0f, 1.0f, 1);
    kc_fill_normal(weight, C, splitmix64(&stream), 1.0f, 0.1f, 1);
    act_t* d_inp = kc_dev_act(inp, NC);
    act_t* d_weight = kc_dev_act(weight, C);
    float* out = kc_host(NC);
    float* rstd = kc_host(N);
    act_t* d_out = (act_t*)dev_alloc(NC * sizeof(act_t));
    float* d_rstd = (float*)dev_alloc(N * sizeof(float));

    /* forward */
    kc_nan_fill(out, NC);
    kc_nan_fill(rstd, N);
    Fp8Scale cpu_amax;
    cpu_ref_rmsnorm_forward(out, rstd, inp, weight, N, (int)C, KC_RMS_EPS, &cpu_amax);
    Fp8Scale* d_amax = (Fp8Scale*)dev_alloc(sizeof(Fp8Scale));
    kc_poison(d_amax, sizeof(Fp8Scale));
    kc_poison(d_out, NC * sizeof(act_t));
    kc_poison(d_rstd, N * sizeof(float));
    op_rmsnorm_forward(d_out, d_rstd, d_inp, d_weight, N, (int)C, KC_RMS_EPS, d_amax);
    float* got = kc_get_act(d_out, NC);
    float* got_rstd = kc_get_f32(d_rstd, N);
    failed += kc_compare_ulps("rmsnorm_forward out", got, out, NC, KC_BF16_MANT, 2.0, 1e-6);
    failed += kc_compare_ulps("rmsnorm_forward rstd", got_rstd, rstd, N, KC_F32_MANT, 64.0, 0.0);
    failed += kc_compare_fused_amax("rmsnorm_forward", d_amax, d_out, NC, cpu_amax.amax, out);
    kc_time("rmsnorm_forward", iters, 4.0 * NC + 4.0 * N, 0.0,
            [&] { op_rmsnorm_forward(d_out, d_rstd, d_inp, d_weight, N, (int)C, KC_RMS_EPS, NULL); });
    kc_time("rmsnorm_forward + fused amax", iters, 4.0 * NC + 4.0 * N, 0.0,
            [&] { op_rmsnorm_forward(d_out, d_rstd, d_inp, d_weight, N, (int)C, KC_RMS_EPS, d_amax); });
    free(got);
    free(got_rstd);

    /* a NaN input: its row is NaN, and so is the fused amax (into scratch: out and rstd serve below) */
    float* inp_nan = kc_host(NC);
    float* out_nan = kc_host(NC);
    float* rstd_nan = kc_host(N);
    memcpy(inp_nan, inp, NC * sizeof(float));
    inp_nan[(N / 2) * C + 3] = NAN;
    act_t* d_inp_nan = kc_dev_act(inp_nan, NC);
    cpu_ref_rmsnorm_forward(out_nan, rstd_nan, inp_nan, weight, N, (int)C, KC_RMS_EPS, &cpu_amax);
    kc_poison(d_amax, sizeof(Fp8Scale));
    op_rmsnorm_forward(d_out, d_rstd, d_inp_nan, d_weight, N, (int)C, KC_RMS_EPS, d_amax);
    failed += kc_compare_fused_amax("rmsnorm_forward (a NaN input)", d_amax, d_out, NC, cpu_amax.amax, out_nan);
    if (fp8_amax_is_finite(cpu_amax.amax)) {
        printf("      FAIL: rmsnorm_forward: a NaN input gave a finite fused amax %g\n", cpu_amax.amax);
        failed++;
    }
    free(inp_nan);
    free(out_nan);
    free(rstd_nan);
    dev_free(d_inp_nan);

    /* fused residual + forward */
    float* branch = kc_host(NC);
    kc_fill_normal(branch, NC, splitmix64(&stream), 0.0f, 0.5f, 1);
    act_t* d_branch = kc_dev_act(branch, NC);
    float* resid = kc_host(NC);
    float* norm = kc_host(NC);
    float* rstd2 = kc_host(N);
    kc_nan_fill(resid, NC);
    kc_nan_fill(norm, NC);
    kc_nan_fill(rstd2, N);
    cpu_ref_residual_rmsnorm_forward(resid, norm, rstd2, inp, branch, weight, N, (int)C, KC_RMS_EPS, &cpu_amax);
    act_t* d_resid = (act_t*)dev_alloc(NC * sizeof(act_t));
    kc_poison(d_resid, NC * sizeof(act_t));
    kc_poison(d_out, NC * sizeof(act_t));
    kc_poison(d_rstd, N * sizeof(float));
    kc_poison(d_amax, sizeof(Fp8Scale));
    op_residual_rmsnorm_forward(d_resid, d_out, d_rstd, d_inp, d_branch, d_weight, N, (int)C, KC_RMS_EPS, d_amax);
    float* got_resid = kc_get_act(d_resid, NC);
    got = kc_get_act(d_out, NC);
    got_rstd = kc_get_f32(d_rstd, N);
    failed += kc_compare_ulps("residual_rmsnorm_forward resid_out", got_resid, resid, NC, KC_BF16_MANT, 0.0, 0.0);
    failed += kc_compare_ulps("residual_rmsnorm_forward norm_out", got, norm, NC, KC_BF16_MANT, 2.0, 1e-6);
    failed += kc_compare_ulps("residual_rmsnorm_forward rstd", got_rstd, rstd2, N, KC_F32_MANT, 64.0, 0.0);
    failed += kc_compare_fused_amax("residual_rmsnorm_forward norm_out", d_amax, d_out, NC, cpu_amax.amax, norm);
    kc_time("residual_rmsnorm_forward", iters, 8.0 * NC + 4.0 * N, 0.0, [&] {
        op_residual_rmsnorm_forward(d_resid, d_out, d_rstd, d_inp, d_branch, d_weight, N, (int)C, KC_RMS_EPS, NULL);
    });
    kc_time("residual_rmsnorm_forward + fused amax", iters, 8.0 * NC + 4.0 * N, 0.0, [&] {
        op_residual_rmsnorm_forward(d_resid, d_out, d_rstd, d_inp, d_branch, d_weight, N, (int)C, KC_RMS_EPS, d_amax);
    });
    free(got);
    free(got_rstd);
    free(got_resid);
    free(branch);
    free(resid);
    free(norm);
    free(rstd2);
    dev_free(d_branch);
    dev_free(d_resid);
    dev_free(d_amax);

    /* backward, accumulating into non-zero dinp and dweight; rstd is the CPU forward's on both sides */
    float* dinp = kc_host(NC);
    float* dweight = kc_host(C);
    float* dout = kc_host(NC);
    kc_fill_normal(dinp, NC, splitmix64(&stream), 0.0f, 1.0f, 1);
    kc_fill_normal(dweight, C, splitmix64(&stream), 0.0f, 1.0f, 0);
    kc_fill_normal(dout, NC, splitmix64(&stream), 0.0f, 1.0f, 1);
    act_t* d_dinp = kc_dev_act(dinp, NC);
    float* d_dweight = kc_dev_f32(dweight, C);
    act_t* d_dout = kc_dev_act(dout, NC);
    dev_upload(d_rstd, rstd, N * sizeof(float));
    cpu_ref_rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, N, (int)C);
    op_rmsnorm_backward(d_dinp, d_dweight, d_dout, d_inp, d_weight, d_rstd, N, (int)C);
    got = kc_get_act(d_dinp, NC);
    float* got_dw = kc_get_f32(d_dweight, C);
    failed += kc_compare_ulps("rmsnorm_backward dinp", got, dinp, NC, KC_BF16_MANT, 2.0, 1e-5);
    failed += kc_compare_norm("rmsnorm_backward dweight", got_dw, dweight, C, 3e-5, 3e-5);
    kc_time("rmsnorm_backward", iters, 8.0 * NC + 4.0 * N, 0.0,
            [&] { op_rmsnorm_backward(d_dinp, d_dweight, d_dout, d_inp, d_weight, d_rstd, N, (int)C); });
    free(got);
    free(got_dw);
    free(dinp);
    free(dweight);
    free(dout);
    free(inp);
    free(weight);
    free(out);
    free(rstd);
    dev_free(d_dinp);
    dev_free(d_dweight);
    dev_free(d_dout);
    dev_free(d_inp);
    dev_free(d_weight);
    dev_free(d_out);
    dev_free(d_rstd);
    return failed;
}

/* ------------------------------------------------------------ rope */

/*
 * Tolerance: x1*c - x2*s is computed in FP32 on both sides, contracted into an FMA on the GPU, then
 * stored BF16: a rounding boundary can fall between them (2 BF16 ulps), and where the two products
 * cancel the FP32 difference is absolute (~1e-7 for O(1) inputs): + 1e-5. The v part must come back
 * untouched.
 */
static int kc_case_rope(const KernelShape* s, int iters, uint64_t seed) {
    uint64_t stream = seed;
    int failed = 0;
    int B = s->B, T = s->T, NH = s->NH, NKV = s->NKV, HS = s->C / s->NH;
    size_t n = (size_t)B * T * (NH + 2 * NKV) * HS, half = (size_t)HS / 2;
    float* cos_t = kc_host((size_t)T * half);
    float* sin_t = kc_host((size_t)T * half);
    rope_tables(T, HS, LLAMA_ROPE_THETA, cos_t, sin_t);
    float* d_cos = kc_dev_f32(cos_t, (size_t)T * half);
    float* d_sin = kc_dev_f32(sin_t, (size_t)T * half);
    double bytes = 4.0 * B * T * (NH + NKV) * HS + 8.0 * T * half;
    const char* names[2] = {"rope_forward qkv", "rope_backward dqkv"};
    for (int dir = 0; dir < 2; dir++) {
        float* x = kc_host(n);
        kc_fill_normal(x, n, splitmix64(&stream), 0.0f, 1.0f, 1);
        act_t* d_x = kc_dev_act(x, n); /* in place: the input is the output */
        if (dir == 0) {
            cpu_ref_rope_forward(x, cos_t, sin_t, B, T, NH, NKV, HS);
            op_rope_forward(d_x, d_cos, d_sin, B, T, NH, NKV, HS);
        } else {
            cpu_ref_rope_backward(x, cos_t, sin_t, B, T, NH, NKV, HS);
            op_rope_backward(d_x, d_cos, d_sin, B, T, NH, NKV, HS);
        }
        float* got = kc_get_act(d_x, n);
        failed += kc_compare_ulps(names[dir], got, x, n, KC_BF16_MANT, 2.0, 1e-5);
        if (dir == 0) kc_time("rope_forward", iters, bytes, 0.0, [&] { op_rope_forward(d_x, d_cos, d_sin, B, T, NH, NKV, HS); });
        else kc_time("rope_backward", iters, bytes, 0.0, [&] { op_rope_backward(d_x, d_cos, d_sin, B, T, NH, NKV, HS); });
        free(got);
        free(x);
        dev_free(d_x);
    }
    free(cos_t);
    free(sin_t);
    dev_free(d_cos);
    dev_free(d_sin);
    return failed;
}

/* ------------------------------------------------------------ attention */

/* CPU work allowed for one attention comparison (cpu_reference.h). */
#ifndef KC_ATT_CPU_WORK
#define KC_ATT_CPU_WORK CPU_REF_ATT_WORK
#endif
/* T of the extra GQA check when the shape itself has NKV == NH. */
#define KC_ATT_GQA_T 512

/* Copies `width` columns of `rows` rows: dst[r][dst_col + j] = src[r][src_col + j] (row strides in elements). */
static inline void kc_copy_cols(float* dst, size_t dst_stride, size_t dst_col, const float* src, size_t src_stride,
                                size_t src_col, size_t width, size_t rows) {
#pragma omp parallel for schedule(static)
    for (size_t r = 0; r < rows; r++) memcpy(dst + r * dst_stride + dst_col, src + r * src_stride + src_col, width * sizeof(float));
}

/*
 * One attention comparison. The GPU runs the full (B, T, NH, NKV, HS) problem; the CPU reference (O(T^2)
 * per head, with a (B, NH, T, T) probability matrix) runs on the subset of it that fits KC_ATT_CPU_WORK:
 * batch 0 only when all batches do not fit, and the first NKVc kv heads with all their query heads.
 * Causal attention of a head reads only its own q and its kv head, and a kv head's gradient only its
 * group's query heads, so that subset is exactly the sliced problem. Every GPU output is also checked to
 * be finite over the full size.
 *
 * Tolerances: cuDNN's flash attention rounds P to BF16 before P V, rounds dS to BF16 before dS K and
 * dS^T Q, takes D = rowsum(dO * O) from the BF16 output, and sums in tile order; the CPU keeps all of these
 * in FP32. Each gives ~2^-9 relative error per element (rel L2 ~2e-3 expected for random inputs), so
 * rel L2 1e-2 for out and 2e-2 for dq, dk, dv (the backward compounds two roundings), max abs 2e-2 /
 * 3e-2 x max|cpu|. A layout or masking bug gives errors of order 1.
 */
static int kc_attention_compare(const char* label, int B, int T, int NH, int NKV, int HS, int iters, uint64_t seed) {
    uint64_t stream = seed;
    int failed = 0;
    size_t C = (size_t)NH * HS, KVC = (size_t)NKV * HS, QKV = C + 2 * KVC, BT = (size_t)B * T;
    int group = NH / NKV;
    double head_work = (double)T * T * HS;
    int Bc = (double)B * NH * head_work > KC_ATT_CPU_WORK ? 1 : B;
    double fit = floor(KC_ATT_CPU_WORK / ((double)Bc * group * head_work));
    int NKVc = fit < 1.0 ? 1 : fit > NKV ? NKV : (int)fit;
    int NHc = NKVc * group;
    size_t Cc = (size_t)NHc * HS, KVCc = (size_t)NKVc * HS, QKVc = Cc + 2 * KVCc, BTc = (size_t)Bc * T;
    printf("    %s: B %d T %d NH %d NKV %d HS %d; CPU reference on %s%d of %d batches, kv heads 0..%d of %d\n", label, B, T,
           NH, NKV, HS, Bc < B ? "the first " : "", Bc, B, NKVc - 1, NKV);

    float* qkv = kc_host(BT * QKV);
    float* dout = kc_host(BT * C);
    kc_fill_normal(qkv, BT * QKV, splitmix64(&stream), 0.0f, 1.0f, 1);
    kc_fill_normal(dout, BT * C, splitmix64(&stream), 0.0f, 1.0f, 1);
    act_t* d_qkv = kc_dev_act(qkv, BT * QKV);
    act_t* d_dout = kc_dev_act(dout, BT * C);
    act_t* d_out = (act_t*)dev_alloc(BT * C * sizeof(act_t));
    float* d_stats = (float*)dev_alloc(att_stats_size((size_t)B, NH, T) * sizeof(float));
    act_t* d_dqkv = (act_t*)dev_alloc(BT * QKV * sizeof(act_t));
    kc_poison(d_out, BT * C * sizeof(act_t));
    kc_poison(d_stats, att_stats_size((size_t)B, NH, T) * sizeof(float));
    kc_poison(d_dqkv, BT * QKV * sizeof(act_t));
    op_attention_forward(d_out, d_stats, d_qkv, B, T, NH, NKV, HS);
    op_attention_backward(d_dqkv, d_dout, d_qkv, d_out, d_stats, B, T, NH, NKV, HS);
    float* got_out = kc_get_act(d_out, BT * C);
    float* got_dqkv = kc_get_act(d_dqkv, BT * QKV);
    size_t nonfinite = kc_count_nonfinite(got_out, BT * C) + kc_count_nonfinite(got_dqkv, BT * QKV);
    printf("    attention out, dqkv (full size): %zu non-finite of %zu, tol 0%s\n", nonfinite, BT * (C + QKV),
           nonfinite ? "  FAIL" : "");
    failed += nonfinite != 0;

    /* the CPU subset: batches < Bc, query heads < NHc and kv heads < NKVc, in qkv's layout with QKVc columns */
    float* qkv_c = kc_host(BTc * QKVc);
    kc_copy_cols(qkv_c, QKVc, 0, qkv, QKV, 0, Cc, BTc);                   /* q */
    kc_copy_cols(qkv_c, QKVc, Cc, qkv, QKV, C, KVCc, BTc);                /* k */
    kc_copy_cols(qkv_c, QKVc, Cc + KVCc, qkv, QKV, C + KVC, KVCc, BTc);   /* v */
    float* dout_c = kc_host(BTc * Cc);
    kc_copy_cols(dout_c, Cc, 0, dout, C, 0, Cc, BTc);
    float* out_c = kc_host(BTc * Cc);
    float* probs = kc_host(cpu_ref_att_stats_size((size_t)Bc, NHc, T));
    float* dqkv_c = kc_host(BTc * QKVc);
    kc_nan_fill(out_c, BTc * Cc);
    kc_nan_fill(dqkv_c, BTc * QKVc);
    cpu_ref_attention_forward(out_c, probs, qkv_c, Bc, T, NHc, NKVc, HS);
    cpu_ref_attention_backward(dqkv_c, dout_c, qkv_c, out_c, probs, Bc, T, NHc, NKVc, HS);

    float* got = kc_host(BTc * Cc);
    float* ref = kc_host(BTc * Cc);
    kc_copy_cols(got, Cc, 0, got_out, C, 0, Cc, BTc);
    failed += kc_compare_norm("attention_forward out", got, out_c, BTc * Cc, 1e-2, 2e-2);
    kc_copy_cols(got, Cc, 0, got_dqkv, QKV, 0, Cc, BTc);
    kc_copy_cols(ref, Cc, 0, dqkv_c, QKVc, 0, Cc, BTc);
    failed += kc_compare_norm("attention_backward dq", got, ref, BTc * Cc, 2e-2, 3e-2);
    kc_copy_cols(got, KVCc, 0, got_dqkv, QKV, C, KVCc, BTc);
    kc_copy_cols(ref, KVCc, 0, dqkv_c, QKVc, Cc, KVCc, BTc);
    failed += kc_compare_norm("attention_backward dk", got, ref, BTc * KVCc, 2e-2, 3e-2);
    kc_copy_cols(got, KVCc, 0, got_dqkv, QKV, C + KVC, KVCc, BTc);
    kc_copy_cols(ref, KVCc, 0, dqkv_c, QKVc, Cc + KVCc, KVCc, BTc);
    failed += kc_compare_norm("attention_backward dv", got, ref, BTc * KVCc, 2e-2, 3e-2);

    /* causal: half of the T x T scores; forward 2 GEMMs (QK^T, PV), backward 5 (S, dP, dV, dQ, dK) */
    double fwd_flops = 2.0 * B * NH * (double)T * T * HS;
    kc_time("attention_forward", iters, 0.0, fwd_flops, [&] { op_attention_forward(d_out, d_stats, d_qkv, B, T, NH, NKV, HS); });
    kc_time("attention_backward", iters, 0.0, 2.5 * fwd_flops,
            [&] { op_attention_backward(d_dqkv, d_dout, d_qkv, d_out, d_stats, B, T, NH, NKV, HS); });

    free(got);
    free(ref);
    free(qkv_c);
    free(dout_c);
    free(out_c);
    free(probs);
    free(dqkv_c);
    free(got_out);
    free(got_dqkv);
    free(qkv);
    free(dout);
    dev_free(d_qkv);
    dev_free(d_dout);
    dev_free(d_out);
    dev_free(d_stats);
    dev_free(d_dqkv);
    return failed;
}

/*
 * The shape's attention (timed), plus, when the shape has no grouped-query heads (Llama-2 7B/13B), an
 * untimed GQA check at B 1, T <= KC_ATT_GQA_T with NH/4 (or NH/2) kv heads, so that the group mapping is
 * always covered.
 */
static int kc_case_attention(const KernelShape* s, int iters, uint64_t seed) {
    uint64_t stream = seed;
    int HS = s->C / s->NH;
    int failed = kc_attention_compare("shape", s->B, s->T, s->NH, s->NKV, HS, iters, splitmix64(&stream));
    if (s->NKV == s->NH && s->NH > 1) {
        int nkv = s->NH % 4 == 0 ? s->NH / 4 : s->NH % 2 == 0 ? s->NH / 2 : 1;
        int T = s->T < KC_ATT_GQA_T ? s->T : KC_ATT_GQA_T;
        failed += kc_attention_compare("GQA", 1, T, s->NH, nkv, HS, 0, splitmix64(&stream));
    }
    return failed;
}

/* ------------------------------------------------------------ swiglu */

/*
 * Tolerance: the GPU's expf (2 ulp, CUDA programming guide) is not glibc's, and nvcc contracts FMAs, so
 * the FP32 values differ in their last bits and may round to neighbouring BF16 values: 2 BF16 ulps.
 * Backward's 1 + a (1 - s) cancels near a = -1.28, where the difference is absolute: + 1e-5.
 */
static int kc_case_swiglu(const KernelShape* s, int iters, uint64_t seed) {
    uint64_t stream = seed;
    int failed = 0;
    size_t N = (size_t)s->B * s->T, F = (size_t)s->F;
    float* inp = kc_host(N * 2 * F);
    kc_fill_normal(inp, N * 2 * F, splitmix64(&stream), 0.0f, 2.0f, 1);
    act_t* d_inp = kc_dev_act(inp, N * 2 * F);
    float* out = kc_host(N * F);
    kc_nan_fill(out, N * F);
    Fp8Scale cpu_amax;
    cpu_ref_swiglu_forward(out, inp, N, (int)F, &cpu_amax);
    act_t* d_out = (act_t*)dev_alloc(N * F * sizeof(act_t));
    Fp8Scale* d_amax = (Fp8Scale*)dev_alloc(sizeof(Fp8Scale));
    kc_poison(d_out, N * F * sizeof(act_t));
    kc_poison(d_amax, sizeof(Fp8Scale));
    op_swiglu_forward(d_out, d_inp, N, (int)F, d_amax);
    float* got = kc_get_act(d_out, N * F);
    failed += kc_compare_ulps("swiglu_forward out", got, out, N * F, KC_BF16_MANT, 2.0, 1e-5);
    failed += kc_compare_fused_amax("swiglu_forward", d_amax, d_out, N * F, cpu_amax.amax, out);
    kc_time("swiglu_forward", iters, 6.0 * N * F, 0.0, [&] { op_swiglu_forward(d_out, d_inp, N, (int)F, NULL); });
    kc_time("swiglu_forward + fused amax", iters, 6.0 * N * F, 0.0, [&] { op_swiglu_forward(d_out, d_inp, N, (int)F, d_amax); });
    /* a NaN input: the fused amax is NaN */
    float* inp_nan = kc_host(N * 2 * F);
    memcpy(inp_nan, inp, N * 2 * F * sizeof(float));
    inp_nan[(N / 2) * 2 * F + F + 5] = NAN;
    act_t* d_inp_nan = kc_dev_act(inp_nan, N * 2 * F);
    cpu_ref_swiglu_forward(out, inp_nan, N, (int)F, &cpu_amax);
    kc_poison(d_amax, sizeof(Fp8Scale));
    op_swiglu_forward(d_out, d_inp_nan, N, (int)F, d_amax);
    failed += kc_compare_fused_amax("swiglu_forward (a NaN input)", d_amax, d_out, N * F, cpu_amax.amax, out);
    if (fp8_amax_is_finite(cpu_amax.amax)) {
        printf("      FAIL: swiglu_forward: a NaN input gave a finite fused amax %g\n", cpu_amax.amax);
        failed++;
    }
    free(inp_nan);
    dev_free(d_inp_nan);
    dev_free(d_amax);
    free(got);
    free(out);
    dev_free(d_out);

    float* dout = kc_host(N * F);
    kc_fill_normal(dout, N * F, splitmix64(&stream), 0.0f, 1.0f, 1);
    act_t* d_dout = kc_dev_act(dout, N * F);
    float* dinp = kc_host(N * 2 * F);
    kc_nan_fill(dinp, N * 2 * F);
    cpu_ref_swiglu_backward(dinp, dout, inp, N, (int)F);
    act_t* d_dinp = (act_t*)dev_alloc(N * 2 * F * sizeof(act_t));
    kc_poison(d_dinp, N * 2 * F * sizeof(act_t));
    op_swiglu_backward(d_dinp, d_dout, d_inp, N, (int)F);
    got = kc_get_act(d_dinp, N * 2 * F);
    failed += kc_compare_ulps("swiglu_backward dinp", got, dinp, N * 2 * F, KC_BF16_MANT, 2.0, 1e-5);
    kc_time("swiglu_backward", iters, 10.0 * N * F, 0.0, [&] { op_swiglu_backward(d_dinp, d_dout, d_inp, N, (int)F); });
    free(got);
    free(dinp);
    free(dout);
    free(inp);
    dev_free(d_dinp);
    dev_free(d_dout);
    dev_free(d_inp);
    return failed;
}

/* ------------------------------------------------------------ classifier */

/*
 * Tolerances. losses: the GPU's online softmax sums exp in FP32 (per thread, then a block tree), the CPU
 * in double: log-sum-exp differs by ~1e-6 absolute on losses of ~10: rel L2 1e-5, max abs 1e-5 x max|cpu|.
 * dlogits = (softmax - onehot) * dloss: that lse difference moves p by ~1e-6 relative, so a BF16
 * rounding boundary may fall between them: 2 BF16 ulps (+ dloss * 1e-9, tiny against p ~ 1/V).
 */
static int kc_case_classifier(const KernelShape* s, int iters, uint64_t seed) {
    uint64_t stream = seed;
    int failed = 0;
    size_t N = (size_t)s->B * s->T, V = (size_t)s->V;
    float dloss = 1.0f / (float)N; /* the mean over the batch, as in training */
    Rng rng;
    rng_seed(&rng, splitmix64(&stream));
    int* targets = (int*)mallocCheck(N * sizeof(int));
    for (size_t i = 0; i < N; i++) targets[i] = (int)rng_below(&rng, V);
    targets[0] = (int)V - 1;
    int* d_targets = (int*)kc_dev_bytes(targets, N * sizeof(int));
    float* logits = kc_host(N * V);
    kc_fill_normal(logits, N * V, splitmix64(&stream), 0.0f, 3.0f, 1);
    act_t* d_logits = kc_dev_act(logits, N * V); /* in place: overwritten with dlogits */
    float* losses = kc_host(N);
    kc_nan_fill(losses, N);
    cpu_ref_classifier(logits, losses, targets, N, (int)V, dloss);
    float* d_losses = (float*)dev_alloc(N * sizeof(float));
    kc_poison(d_losses, N * sizeof(float));
    op_classifier(d_logits, d_losses, d_targets, N, (int)V, dloss);
    float* got_losses = kc_get_f32(d_losses, N);
    float* got = kc_get_act(d_logits, N * V);
    failed += kc_compare_norm("classifier losses", got_losses, losses, N, 1e-5, 1e-5);
    failed += kc_compare_ulps("classifier dlogits", got, logits, N * V, KC_BF16_MANT, 2.0, 1e-9 * dloss);
    kc_time("classifier", iters, 4.0 * N * V, 0.0, [&] { op_classifier(d_logits, d_losses, d_targets, N, (int)V, dloss); });
    free(got);
    free(got_losses);
    free(losses);
    free(logits);
    free(targets);
    dev_free(d_logits);
    dev_free(d_losses);
    dev_free(d_targets);
    return failed;
}

/* ------------------------------------------------------------ sum_squares */

/*
 * Tolerance: both sides square FP32 values exactly in double and sum in double, in different orders:
 * random-walk error ~sqrt(n) * 2^-53 (~1e-12 at n = 1e8); relative 1e-10.
 */
static int kc_case_sum_squares(const KernelShape* s, int iters, uint64_t seed) {
    uint64_t stream = seed;
    size_t n = (size_t)2 * s->C * s->F + 12345; /* a w1|w3 gradient, plus a ragged tail */
    size_t chunks = zero_chunks(n);
    float* x = kc_host(n);
    kc_fill_normal(x, n, splitmix64(&stream), 0.0f, 1e-3f, 0);
    float* d_x = kc_dev_f32(x, n);
    double* ref = (double*)mallocCheck(chunks * sizeof(double));
    double* got = (double*)mallocCheck(chunks * sizeof(double));
    double* d_partials = (double*)dev_alloc(chunks * sizeof(double));
    kc_poison(d_partials, chunks * sizeof(double));
    cpu_ref_sum_squares_chunks(ref, x, n, ZERO_CHUNK);
    op_sum_squares_chunks(d_partials, d_x, n, ZERO_CHUNK);
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
    kc_time("sum_squares_chunks", iters, 4.0 * n, 0.0, [&] { op_sum_squares_chunks(d_partials, d_x, n, ZERO_CHUNK); });
    /* the in-order sum of a micro-batch's losses: the same additions on both sides, bit-identical */
    size_t tokens = (size_t)s->B * s->T;
    double in_order_ref, in_order;
    double* d_in_order = (double*)dev_alloc(sizeof(double));
    kc_poison(d_in_order, sizeof(double));
    cpu_ref_sum_f32_in_order(&in_order_ref, x, tokens);
    op_sum_f32_in_order(d_in_order, d_x, tokens);
    dev_download(&in_order, d_in_order, sizeof(double));
    int in_order_ok = memcmp(&in_order, &in_order_ref, sizeof(double)) == 0;
    printf("    sum_f32_in_order of %zu: gpu %.17g, cpu %.17g, tol bit-identical%s\n", tokens, in_order, in_order_ref,
           in_order_ok ? "" : "  FAIL");
    failed += !in_order_ok;
    kc_time("sum_f32_in_order", iters, 4.0 * tokens, 0.0, [&] { op_sum_f32_in_order(d_in_order, d_x, tokens); });
    free(x);
    free(ref);
    free(got);
    dev_free(d_x);
    dev_free(d_partials);
    dev_free(d_in_order);
    return failed;
}

/* ------------------------------------------------------------ fp8_cast: op_amax, op_cast_transpose */

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
        float* x = kc_host(n);
        if (ts->kind == KC_CAST_LOG_UNIFORM) kc_fill_log_uniform(x, n, splitmix64(&stream));
        else kc_fill_normal(x, n, splitmix64(&stream), 0.0f, 1.0f, 1);
        if (ts->kind == KC_CAST_NAN) x[37 * ts->cols + 11] = NAN;
        if (ts->kind == KC_CAST_INF) x[5 * ts->cols + 7] = -INFINITY;
        if (ts->kind == KC_CAST_ZERO) {
            for (size_t i = 0; i < n; i++) x[i] = i % 2 ? -0.0f : 0.0f;
        }
        act_t* d_x = kc_dev_act(x, n);
        uint8_t* codes = (uint8_t*)mallocCheck(n);
        uint8_t* codes_t = (uint8_t*)mallocCheck(n);
        uint8_t* got = (uint8_t*)mallocCheck(n);
        uint8_t* got_t = (uint8_t*)mallocCheck(n);
        uint8_t* d_codes = (uint8_t*)dev_alloc(n);
        uint8_t* d_codes_t = (uint8_t*)dev_alloc(n);
        for (size_t v = 0; v < sizeof(variants) / sizeof(variants[0]); v++) {
            const KcCastVariant* va = &variants[v];
            if (va->tensor != t) continue;
            char label[96];
            snprintf(label, sizeof(label), "%.47s %s pow2 %d", ts->name, fp8_format_name(va->f), va->pow2);
            /* CPU: poisoned codes (0xFF is a NaN code in both formats) and scale */
            Fp8Scale sc = {NAN, NAN, NAN, NAN};
            Fp8Counts cc = counts0;
            memset(codes, 0xFF, n);
            memset(codes_t, 0xFF, n);
            cpu_ref_amax(&sc, x, n);
            sc.nonfinite = 0.0f; /* the cast sets the flag for the NaN and Inf tensors */
            cpu_ref_cast_transpose(va->out ? codes : NULL, va->out_t ? codes_t : NULL, x, ts->rows, ts->cols, va->f, &sc,
                                   va->pow2, va->counts ? &cc : NULL);
            /* GPU */
            kc_poison(d_scale, sizeof(Fp8Scale));
            kc_poison(d_codes, n);
            kc_poison(d_codes_t, n);
            dev_upload(d_counts, &counts0, sizeof(Fp8Counts));
            op_amax(d_scale, d_x, n);
            op_fp8_clear_nonfinite(d_scale, 1);
            op_cast_transpose(va->out ? d_codes : NULL, va->out_t ? d_codes_t : NULL, d_x, ts->rows, ts->cols, va->f, d_scale,
                              va->pow2, va->counts ? d_counts : NULL);
            Fp8Scale sg;
            Fp8Counts cg;
            dev_download(&sg, d_scale, sizeof(Fp8Scale));
            dev_download(&cg, d_counts, sizeof(Fp8Counts));
            dev_download(got, d_codes, n);
            dev_download(got_t, d_codes_t, n);
            failed += kc_compare_cast(label, va->out ? got : NULL, va->out_t ? got_t : NULL, codes, codes_t, n, sg, sc);
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
                kc_time(op, iters, 2.0 * n, 0.0, [&] { op_amax(d_scale, d_x, n); });
                snprintf(op, sizeof(op), "cast_transpose %s %s", kinds[t], fp8_format_name(va->f));
                kc_time(op, iters, 2.0 * n + (va->out ? n : 0) + (va->out_t ? n : 0), 0.0, [&] {
                    op_cast_transpose(va->out ? d_codes : NULL, va->out_t ? d_codes_t : NULL, d_x, ts->rows, ts->cols, va->f,
                                      d_scale, va->pow2, va->counts ? d_counts : NULL);
                });
            }
        }
        free(x);
        free(codes);
        free(codes_t);
        free(got);
        free(got_t);
        dev_free(d_x);
        dev_free(d_codes);
        dev_free(d_codes_t);
    }
    dev_free(d_scale);
    dev_free(d_counts);
    return failed + kc_amax_reset_check(splitmix64(&stream));
}

/* ------------------------------------------------------------ fp8_cast_vec: the two cast-transpose kernels */

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
static inline int kc_check_delayed_cast(const char* label, int k, int with_out, int with_t, const act_t* d_x, const float* x,
                                        size_t rows, size_t cols, Fp8Format f, float current_scale, Fp8Scale* d_scale,
                                        uint8_t* d_codes, uint8_t* d_codes_t, uint8_t* got, uint8_t* got_t) {
    size_t n = rows * cols;
    float stale = fp8_amax_is_finite(current_scale) ? 4.0f * current_scale : 1.0f;
    Fp8Scale sc = {NAN, stale, 1.0f / stale, 0.0f}, sg;
    float record_c = 0.5f, record_g;
    float* d_record = kc_dev_f32(&record_c, 1);
    dev_upload(d_scale, &sc, sizeof(Fp8Scale));
    uint8_t* codes = (uint8_t*)mallocCheck(n);
    uint8_t* codes_t = (uint8_t*)mallocCheck(n);
    cpu_ref_cast_transpose_delayed(codes, codes_t, x, rows, cols, f, &sc, NULL, &record_c);
    kc_poison(d_codes, n);
    kc_poison(d_codes_t, n);
    kc_cast_transpose_with(k, with_out ? d_codes : NULL, with_t ? d_codes_t : NULL, d_x, rows, cols, f, d_scale, NULL, 1, d_record);
    dev_download(&sg, d_scale, sizeof(Fp8Scale));
    dev_download(&record_g, d_record, sizeof(float));
    dev_download(got, d_codes, n);
    dev_download(got_t, d_codes_t, n);
    dev_free(d_record);
    char dl[128];
    snprintf(dl, sizeof(dl), "%s delayed", label);
    int failed = kc_compare_cast(dl, with_out ? got : NULL, with_t ? got_t : NULL, codes, codes_t, n, sg, sc);
    if (!kc_same_bits(record_g, record_c)) {
        printf("      FAIL: %s record: gpu %g cpu %g\n", dl, record_g, record_c);
        failed++;
    }
    free(codes);
    free(codes_t);
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
        float* x = kc_host(n);
        kc_fill_normal(x, n, splitmix64(&stream), 0.0f, f == FP8_E5M2 ? 1e-3f : 1.0f, 1);
        if (tensors[t].nan) x[37 * cols + 11] = NAN;
        act_t* d_x = kc_dev_act(x, n);
        uint8_t* codes = (uint8_t*)mallocCheck(n);
        uint8_t* codes_t = (uint8_t*)mallocCheck(n);
        uint8_t* got = (uint8_t*)mallocCheck(n);
        uint8_t* got_t = (uint8_t*)mallocCheck(n);
        uint8_t* d_codes = (uint8_t*)dev_alloc(n);
        uint8_t* d_codes_t = (uint8_t*)dev_alloc(n);
        Fp8Scale sc;
        Fp8Counts cc;
        memset(&cc, 0, sizeof(cc));
        cpu_ref_amax(&sc, x, n);
        sc.nonfinite = 0.0f;
        cpu_ref_cast_transpose(codes, codes_t, x, rows, cols, f, &sc, 0, &cc);
        int vec_ok = fp8_cast_transpose_vec_ok(d_codes, d_codes_t, d_x, rows, cols);
        printf("    %s (%zu, %zu) %s: vectorized kernel %s\n", tensors[t].name, rows, cols, fp8_format_name(f),
               vec_ok ? "takes it" : "refuses it (op_cast_transpose uses the element-wise one)");
        for (int k = 0; k < KC_CT_KERNELS; k++) {
            if (k == KC_CT_VEC && !vec_ok) continue;
            for (int l = 0; l < 3; l++) {
                int with_out = layouts[l][0], with_t = layouts[l][1];
                kc_poison(d_scale, sizeof(Fp8Scale));
                kc_poison(d_codes, n);
                kc_poison(d_codes_t, n);
                dev_zero(d_counts, sizeof(Fp8Counts));
                op_amax(d_scale, d_x, n);
                op_fp8_clear_nonfinite(d_scale, 1);
                kc_cast_transpose_with(k, with_out ? d_codes : NULL, with_t ? d_codes_t : NULL, d_x, rows, cols, f, d_scale, d_counts);
                Fp8Scale sg;
                Fp8Counts cg;
                dev_download(&sg, d_scale, sizeof(Fp8Scale));
                dev_download(&cg, d_counts, sizeof(Fp8Counts));
                dev_download(got, d_codes, n);
                dev_download(got_t, d_codes_t, n);
                char label[96];
                snprintf(label, sizeof(label), "%s %s", KC_CT_KERNEL_NAMES[k], with_out && with_t ? "both" : with_out ? "out" : "out_t");
                failed += kc_compare_cast(label, with_out ? got : NULL, with_t ? got_t : NULL, codes, codes_t, n, sg, sc);
                int counts_ok = memcmp(&cg, &cc, sizeof(Fp8Counts)) == 0;
                if (!counts_ok)
                    printf("      FAIL: %s counts: gpu sat %llu under %llu nonzero %llu count %llu, cpu %llu %llu %llu %llu\n", label,
                           cg.saturated, cg.underflow, cg.nonzero, cg.count, cc.saturated, cc.underflow, cc.nonzero, cc.count);
                failed += !counts_ok;
                failed += kc_check_delayed_cast(label, k, with_out, with_t, d_x, x, rows, cols, f, sc.scale, d_scale, d_codes,
                                                d_codes_t, got, got_t);
            }
        }
        if (tensors[t].timed && iters > 0) {
            double us[KC_CT_KERNELS] = {0.0, 0.0};
            for (int k = 0; k < KC_CT_KERNELS; k++) {
                if (k == KC_CT_VEC && !vec_ok) continue;
                char op[64];
                snprintf(op, sizeof(op), "cast_transpose %s %s", KC_CT_KERNEL_NAMES[k], tensors[t].name);
                us[k] = kc_time(op, iters, 4.0 * n, 0.0,
                                [&] { kc_cast_transpose_with(k, d_codes, d_codes_t, d_x, rows, cols, f, d_scale, NULL); });
            }
            if (us[KC_CT_VEC] > 0.0) printf("    %s: vectorized %.2fx the element-wise kernel's speed\n", tensors[t].name, us[KC_CT_TILED] / us[KC_CT_VEC]);
        }
        free(x);
        free(codes);
        free(codes_t);
        free(got);
        free(got_t);
        dev_free(d_x);
        dev_free(d_codes);
        dev_free(d_codes_t);
    }
    dev_free(d_scale);
    dev_free(d_counts);
    return failed + kc_check_delayed_update(splitmix64(&stream));
}

/* ------------------------------------------------------------ gemm */

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
 * (DESIGN.md section 3's operand map). The FP8 operands, their transposes and scales come from the CPU cast
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
    float* X = kc_host(NC);
    float* W = kc_host(OCC);
    float* dY = kc_host(NOC);
    float* dW0 = kc_host(OCC);
    kc_fill_normal(X, NC, splitmix64(&stream), 0.0f, 1.0f, 1);
    kc_fill_normal(W, OCC, splitmix64(&stream), 0.0f, 0.02f, 1);
    kc_fill_normal(dY, NOC, splitmix64(&stream), 0.0f, 1e-3f, 1);
    kc_fill_normal(dW0, OCC, splitmix64(&stream), 0.0f, 1e-2f, 0);
    act_t* d_X = kc_dev_act(X, NC);
    act_t* d_W = kc_dev_act(W, OCC);
    act_t* d_dY = kc_dev_act(dY, NOC);

    /* FP8 operands: W, X E4M3 (forward), dY E5M2 (gradient), each with its transpose */
    Fp8Scale sc[3];
    uint8_t* W8 = (uint8_t*)mallocCheck(OCC);
    uint8_t* W8t = (uint8_t*)mallocCheck(OCC);
    uint8_t* X8 = (uint8_t*)mallocCheck(NC);
    uint8_t* X8t = (uint8_t*)mallocCheck(NC);
    uint8_t* dY8 = (uint8_t*)mallocCheck(NOC);
    uint8_t* dY8t = (uint8_t*)mallocCheck(NOC);
    cpu_ref_amax(&sc[0], W, OCC);
    cpu_ref_cast_transpose(W8, W8t, W, OC, C, FP8_E4M3, &sc[0], 0, NULL);
    cpu_ref_amax(&sc[1], X, NC);
    cpu_ref_cast_transpose(X8, X8t, X, N, C, FP8_E4M3, &sc[1], 0, NULL);
    cpu_ref_amax(&sc[2], dY, NOC);
    cpu_ref_cast_transpose(dY8, dY8t, dY, N, OC, FP8_E5M2, &sc[2], 0, NULL);
    uint8_t* d_W8 = (uint8_t*)kc_dev_bytes(W8, OCC);
    uint8_t* d_W8t = (uint8_t*)kc_dev_bytes(W8t, OCC);
    uint8_t* d_X8 = (uint8_t*)kc_dev_bytes(X8, NC);
    uint8_t* d_X8t = (uint8_t*)kc_dev_bytes(X8t, NC);
    uint8_t* d_dY8 = (uint8_t*)kc_dev_bytes(dY8, NOC);
    uint8_t* d_dY8t = (uint8_t*)kc_dev_bytes(dY8t, NOC);
    Fp8Scale* d_sc = (Fp8Scale*)kc_dev_bytes(sc, sizeof(sc));

    /* host and device views of every operand: the same values, so both sides multiply the same numbers */
    GemmOperand hW = gemm_operand(W, DT_ACT), hX = gemm_operand(X, DT_ACT), hdY = gemm_operand(dY, DT_ACT);
    GemmOperand gW = gemm_operand(d_W, DT_ACT), gX = gemm_operand(d_X, DT_ACT), gdY = gemm_operand(d_dY, DT_ACT);
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
        {"gemm bf16 wgrad NT (OC,C)+=dY^T.X f32", gemm_wgrad(NULL, hX, hdY, N, C, OC), gemm_wgrad(NULL, gX, gdY, N, C, OC), dW0,
         1e-4, 1e-3},
        kc_fp8_gemm("gemm fp8 fprop E4M3xE4M3 fast_accum bf16", gemm_fprop(NULL, DT_ACT, hW8, hX8, N, C, OC),
                    gemm_fprop(NULL, DT_ACT, gW8, gX8, N, C, OC), NULL),
        kc_fp8_gemm("gemm fp8 dgrad E4M3xE5M2 bf16", gemm_dgrad(NULL, DT_ACT, hW8t, hdY8, N, C, OC),
                    gemm_dgrad(NULL, DT_ACT, gW8t, gdY8, N, C, OC), NULL),
        kc_fp8_gemm("gemm fp8 wgrad E4M3xE5M2 f32 +=", gemm_wgrad(NULL, hX8t, hdY8t, N, C, OC),
                    gemm_wgrad(NULL, gX8t, gdY8t, N, C, OC), dW0),
    };
    printf("    X (%zu, %zu), W (%zu, %zu), dY (%zu, %zu); FP8 scales W %.6g X %.6g dY %.6g\n", N, C, OC, C, N, OC, sc[0].scale,
           sc[1].scale, sc[2].scale);
    for (size_t i = 0; i < sizeof(gemms) / sizeof(gemms[0]); i++) failed += kc_gemm_run(&gemms[i], iters);

    free(X);
    free(W);
    free(dY);
    free(dW0);
    free(W8);
    free(W8t);
    free(X8);
    free(X8t);
    free(dY8);
    free(dY8t);
    dev_free(d_X);
    dev_free(d_W);
    dev_free(d_dY);
    dev_free(d_W8);
    dev_free(d_W8t);
    dev_free(d_X8);
    dev_free(d_X8t);
    dev_free(d_dY8);
    dev_free(d_dY8t);
    dev_free(d_sc);
    return failed;
}

/* ------------------------------------------------------------ fp8_weight: the FP8 weights cast from master weights */

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
        float* w = kc_host(n);
        kc_fill_normal(w, n, splitmix64(&stream), 0.0f, 0.02f, 0);
        if (t == 2) w[37 * cols + 11] = NAN;
        float* d_w = kc_dev_f32(w, n);
        uint8_t* codes = (uint8_t*)mallocCheck(n);
        uint8_t* codes_t = (uint8_t*)mallocCheck(n);
        uint8_t* got = (uint8_t*)mallocCheck(n);
        uint8_t* d_codes = (uint8_t*)dev_alloc(n);
        uint8_t* d_codes_t = (uint8_t*)dev_alloc(n);
        char label[96];
        /* whole: W and W^T with counts */
        Fp8Scale sc = {NAN, NAN, NAN, NAN}, sg;
        Fp8Counts cc, cg;
        memset(&cc, 0, sizeof(cc));
        memset(codes, 0xFF, n);
        memset(codes_t, 0xFF, n);
        cpu_ref_amax_master(&sc, w, n);
        cpu_ref_cast_transpose_master(codes, codes_t, w, rows, cols, FP8_E4M3, &sc, 0, &cc);
        kc_poison(d_scale, sizeof(Fp8Scale));
        kc_poison(d_codes, n);
        kc_poison(d_codes_t, n);
        dev_zero(d_counts, sizeof(Fp8Counts));
        op_amax_master(d_scale, d_w, n);
        op_cast_transpose_master(d_codes, d_codes_t, d_w, rows, cols, FP8_E4M3, d_scale, 0, d_counts);
        dev_download(&sg, d_scale, sizeof(Fp8Scale));
        dev_download(&cg, d_counts, sizeof(Fp8Counts));
        snprintf(label, sizeof(label), "%s (%zu, %zu) whole", kinds[t], rows, cols);
        failed += kc_scale_line(label, &sg, &sc, &cg, &cc);
        dev_download(got, d_codes, n);
        failed += kc_codes_line(label, got, codes, n);
        dev_download(got, d_codes_t, n);
        snprintf(label, sizeof(label), "%s (%zu, %zu) whole, transposed", kinds[t], rows, cols);
        failed += kc_codes_line(label, got, codes_t, n);
        /* W's transpose from the W codes (the CPU's transpose of its own codes is the reference) */
        cpu_ref_transpose_fp8(codes_t, codes, rows, cols);
        kc_poison(d_codes_t, n);
        op_transpose_fp8(d_codes_t, d_codes, rows, cols);
        dev_download(got, d_codes_t, n);
        snprintf(label, sizeof(label), "%s (%zu, %zu) op_transpose_fp8", kinds[t], rows, cols);
        failed += kc_codes_line(label, got, codes_t, n);
        /* a piece, W only */
        int chunked = n >= 3 * ZERO_CHUNK;
        size_t begin = chunked ? ZERO_CHUNK : n - 100, len = chunked ? 2 * ZERO_CHUNK : 100;
        size_t prows = chunked ? 2 : 1, pcols = chunked ? ZERO_CHUNK : len;
        cpu_ref_amax_master(&sc, w + begin, len);
        cpu_ref_cast_transpose_master(codes, NULL, w + begin, prows, pcols, FP8_E4M3, &sc, 1, NULL);
        kc_poison(d_scale, sizeof(Fp8Scale));
        kc_poison(d_codes, n);
        op_amax_master(d_scale, d_w + begin, len);
        op_cast_transpose_master(d_codes, NULL, d_w + begin, prows, pcols, FP8_E4M3, d_scale, 1, NULL);
        dev_download(&sg, d_scale, sizeof(Fp8Scale));
        dev_download(got, d_codes, len);
        snprintf(label, sizeof(label), "%s piece [%zu, %zu) as (%zu, %zu), pow2", kinds[t], begin, begin + len, prows, pcols);
        failed += kc_scale_line(label, &sg, &sc, NULL, NULL);
        failed += kc_codes_line(label, got, codes, len);
        if (iters > 0 && t == 0) {
            kc_time("amax_master w13", iters, 4.0 * n, 0.0, [&] { op_amax_master(d_scale, d_w, n); });
            kc_time("cast_transpose_master w13", iters, 6.0 * n, 0.0,
                    [&] { op_cast_transpose_master(d_codes, d_codes_t, d_w, rows, cols, FP8_E4M3, d_scale, 0, NULL); });
            kc_time("transpose_fp8 w13", iters, 2.0 * n, 0.0, [&] { op_transpose_fp8(d_codes_t, d_codes, rows, cols); });
        }
        free(w);
        free(codes);
        free(codes_t);
        free(got);
        dev_free(d_w);
        dev_free(d_codes);
        dev_free(d_codes_t);
    }
    dev_free(d_scale);
    dev_free(d_counts);
    return failed;
}

/* ------------------------------------------------------------ optimizer: cuda/optimizer.cuh */

static inline size_t kc_count_diff_f32(const float* got, const float* ref, size_t n, size_t* first);

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
    float* x = kc_host((size_t)STEPS * n);
    Rng r;
    rng_seed(&r, splitmix64(&stream));
    for (size_t c = 0; c < ceil_div((size_t)STEPS * n, ZERO_CHUNK); c++) {
        float mag = exp2f(-40.0f + 80.0f * rng_uniform(&r));
        size_t end = (c + 1) * ZERO_CHUNK < (size_t)STEPS * n ? (c + 1) * ZERO_CHUNK : (size_t)STEPS * n;
        for (size_t i = c * ZERO_CHUNK; i < end; i++) x[i] = mag * exp2f(-12.0f * rng_uniform(&r)) * rng_normal(&r);
    }
    for (int t = 0; t < STEPS; t++)
        for (size_t i = ZERO_CHUNK; i < 2 * ZERO_CHUNK; i++) x[(size_t)t * n + i] = 0.0f;
    x[n + 2 * ZERO_CHUNK + 7] = NAN;
    uint8_t* ref = (uint8_t*)mallocCheck(bytes);
    memset(ref, 0x7f, bytes);
    float* ref_sinv = sc ? kc_host(sc) : NULL;
    for (size_t k = 0; k < sc; k++) ref_sinv[k] = NAN;
    void* d_dst = kc_dev_bytes(ref, bytes);
    float* d_sinv = sc ? kc_dev_f32(ref_sinv, sc) : NULL;
    float* d_x = kc_dev_f32(x, (size_t)STEPS * n);
    for (int t = 0; t < STEPS; t++) {
        cpu_ref_store_add(codec, ref, ref_sinv, x + (size_t)t * n, n, t > 0);
        op_store_add(codec, d_dst, d_sinv, d_x + (size_t)t * n, n, t > 0);
    }
    uint8_t* got = (uint8_t*)mallocCheck(bytes);
    dev_download(got, d_dst, bytes);
    size_t first = 0, bad = kc_count_diff(got, ref, bytes, &first), bad_sinv = 0;
    float* got_sinv = sc ? kc_get_f32(d_sinv, sc) : NULL;
    if (sc) bad_sinv = kc_count_diff_f32(got_sinv, ref_sinv, sc, &first);
    int failed = bad != 0 || bad_sinv != 0;
    printf("    %s: %d stores of %zu: %zu bytes and %zu scale_inv differ, tol bit-identical%s\n", name, STEPS, n, bad, bad_sinv,
           failed ? "  FAIL" : "");

    float* bucket = kc_host(n);
    kc_fill_normal(bucket, n, splitmix64(&stream), 0.0f, 1.0f, 0);
    float* d_out = (float*)dev_alloc(n * sizeof(float));
    for (int acc = 0; acc <= 1; acc++) {
        float* want = kc_host(n);
        memcpy(want, bucket, n * sizeof(float));
        cpu_ref_store_load(codec, want, ref, ref_sinv, n, acc);
        if (acc) dev_upload(d_out, bucket, n * sizeof(float));
        else kc_poison(d_out, n * sizeof(float));
        op_store_load(codec, d_out, d_dst, d_sinv, n, acc);
        float* out = kc_get_f32(d_out, n);
        size_t bad_out = kc_count_diff_f32(out, want, n, &first), nan = kc_count_nonfinite(out, n);
        size_t want_nan = store_is_scaled(codec) ? ZERO_CHUNK : 1;
        int ok = bad_out == 0 && nan == want_nan;
        printf("    op_store_load %s%s: %zu of %zu differ, %zu non-finite (want %zu), tol bit-identical%s\n", name,
               acc ? " (accumulate)" : "", bad_out, n, nan, want_nan, ok ? "" : "  FAIL");
        if (bad_out) printf("      FAIL: first at %zu: gpu %.9g, cpu %.9g\n", first, out[first], want[first]);
        failed += !ok;
        free(want);
        free(out);
    }
    kc_time(name, iters, 4.0 * n + 2.0 * (double)bytes + 8.0 * (double)sc, 0.0,
            [&] { op_store_add(codec, d_dst, d_sinv, d_x, n, 1); });
    free(x);
    free(ref);
    free(ref_sinv);
    free(got);
    free(got_sinv);
    free(bucket);
    dev_free(d_dst);
    if (d_sinv) dev_free(d_sinv);
    dev_free(d_x);
    dev_free(d_out);
    return failed;
}

static int kc_case_optimizer(const KernelShape* s, int iters, uint64_t seed) {
    return kc_case_params(s, iters, seed) + kc_case_sum_squares(s, iters, splitmix64(&seed)) +
           kc_store(s, iters, splitmix64(&seed), STORE_BF16, "store bf16 (--grad-buffer bf16)") +
           kc_store(s, iters, splitmix64(&seed), STORE_E4M3, "store e4m3 (--grad-buffer fp8)") +
           kc_store(s, iters, splitmix64(&seed), STORE_FP16, "store fp16 (--master-weights fp16)");
}

/* ------------------------------------------------------------ grad_fp8: comm/grad_fp8.cuh */

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
 * Tolerance: none. The pack kernel's amax is a max (order-free) and its scale, codes and scale_inv are
 * grad_fp8.h's functions; the sum kernel adds the same dequantized values in the same rank order: blocks
 * and sums must be bit-identical to grad_fp8_pack / grad_fp8_sum (the CPU build's wire). Inputs: W = 3
 * pieces of a ragged size (each piece's last chunk short), chunk magnitudes 2^U(-40, 40) with a factor
 * 2^U(-12, 0) per element, one chunk of zeros, a NaN in piece 1's chunk 0 and an Inf in piece 2's chunk
 * 1: exactly those two chunks of the sums are NaN. The sums run on the CPU's blocks, with and without
 * accumulation into a random recv. The blocks lie grad_fp8_block_stride apart (256-byte aligned): the pack
 * must leave the padding after each block as it found it (0xFF here).
 */
static int kc_case_grad_fp8(const KernelShape* s, int iters, uint64_t seed) {
    uint64_t stream = seed;
    const int W = 3;
    size_t n = (size_t)s->C * s->F / 4 + 123;
    if (n < 2 * ZERO_CHUNK) n = 2 * ZERO_CHUNK + 123;
    size_t total = (size_t)W * n, bytes = grad_fp8_block_bytes(n), stride = grad_fp8_block_stride(n), all = (size_t)W * stride;
    float* x = kc_host(total);
    Rng r;
    rng_seed(&r, splitmix64(&stream));
    for (size_t c = 0; c < ceil_div(total, ZERO_CHUNK); c++) {
        float mag = exp2f(-40.0f + 80.0f * rng_uniform(&r));
        size_t end = (c + 1) * ZERO_CHUNK < total ? (c + 1) * ZERO_CHUNK : total;
        for (size_t i = c * ZERO_CHUNK; i < end; i++) x[i] = mag * exp2f(-12.0f * rng_uniform(&r)) * rng_normal(&r);
    }
    for (size_t i = ZERO_CHUNK; i < 2 * ZERO_CHUNK; i++) x[i] = 0.0f;
    x[n + 17] = NAN;
    x[2 * n + ZERO_CHUNK + 5] = -INFINITY;
    uint8_t* ref = (uint8_t*)mallocCheck(all);
    memset(ref, 0xFF, all);
    for (int p = 0; p < W; p++) grad_fp8_pack(ref + (size_t)p * stride, x + (size_t)p * n, n);

    float* d_x = kc_dev_f32(x, total);
    uint8_t* d_blocks = (uint8_t*)dev_alloc(all);
    kc_poison(d_blocks, all);
    grad_fp8_pack_cuda(d_blocks, d_x, n, (size_t)W, 0);
    uint8_t* got = (uint8_t*)mallocCheck(all);
    dev_download(got, d_blocks, all);
    size_t first = 0, bad = kc_count_diff(got, ref, all, &first);
    int failed = bad != 0 || stride % GRAD_FP8_BLOCK_ALIGN != 0;
    printf("    grad_fp8_pack: %d pieces of %zu, %zu bytes each, %zu apart: %zu differ, tol bit-identical%s\n", W, n, bytes, stride,
           bad, failed ? "  FAIL" : "");
    if (bad) printf("      FAIL: first byte at %zu (piece %zu, %s): gpu 0x%02x, cpu 0x%02x\n", first, first / stride,
                    first % stride < n ? "code" : first % stride < bytes ? "scale_inv" : "padding", got[first], ref[first]);

    float* recv = kc_host(n);
    kc_fill_normal(recv, n, splitmix64(&stream), 0.0f, 1.0f, 0);
    uint8_t* d_ref = (uint8_t*)kc_dev_bytes(ref, all);
    float* d_out = (float*)dev_alloc(n * sizeof(float));
    for (int acc = 0; acc <= 1; acc++) {
        float* want = kc_host(n);
        memcpy(want, recv, n * sizeof(float));
        grad_fp8_sum(want, ref, W, n, acc);
        if (acc) dev_upload(d_out, recv, n * sizeof(float));
        else kc_poison(d_out, n * sizeof(float));
        grad_fp8_sum_cuda(d_out, d_ref, W, n, acc, 0);
        float* sum = kc_get_f32(d_out, n);
        size_t bad_sum = kc_count_diff_f32(sum, want, n, &first), nan = kc_count_nonfinite(sum, n);
        int ok = bad_sum == 0 && nan == 2 * ZERO_CHUNK;
        printf("    grad_fp8_sum%s: %zu of %zu differ, %zu non-finite (want %zu), tol bit-identical%s\n",
               acc ? " (accumulate)" : "", bad_sum, n, nan, 2 * ZERO_CHUNK, ok ? "" : "  FAIL");
        if (bad_sum) printf("      FAIL: first at %zu: gpu %.9g, cpu %.9g\n", first, sum[first], want[first]);
        failed += !ok;
        free(want);
        free(sum);
    }
    kc_time("grad_fp8_pack", iters, 4.0 * total + (double)W * bytes, 0.0,
            [&] { grad_fp8_pack_cuda(d_blocks, d_x, n, (size_t)W, 0); });
    kc_time("grad_fp8_sum", iters, (double)W * bytes + 8.0 * n, 0.0, [&] { grad_fp8_sum_cuda(d_out, d_ref, W, n, 1, 0); });
    free(x);
    free(ref);
    free(got);
    free(recv);
    dev_free(d_x);
    dev_free(d_blocks);
    dev_free(d_ref);
    dev_free(d_out);
    return failed;
}

/* ------------------------------------------------------------ the table */

static const KernelCase KERNEL_CASES[] = {
    {"optimizer", "op_params_from_master, op_sum_squares_chunks, op_sum_f64, op_sum_f32_in_order, op_adamw, op_store_add, op_store_load",
     kc_case_optimizer},
    {"encoder", "op_encoder_forward, op_encoder_backward", kc_case_encoder},
    {"rmsnorm", "op_rmsnorm_forward, op_residual_rmsnorm_forward, op_rmsnorm_backward", kc_case_rmsnorm},
    {"rope", "op_rope_forward, op_rope_backward", kc_case_rope},
    {"attention", "op_attention_forward, op_attention_backward (causal, GQA)", kc_case_attention},
    {"swiglu", "op_swiglu_forward, op_swiglu_backward", kc_case_swiglu},
    {"classifier", "op_classifier (losses and dlogits)", kc_case_classifier},
    {"fp8_cast", "op_amax, op_cast_transpose (E4M3, E5M2)", kc_case_fp8_cast},
    {"fp8_cast_vec", "the element-wise and vectorized cast-transpose kernels", kc_case_fp8_cast_vec},
    {"fp8_weight", "op_amax_master, op_cast_transpose_master, op_transpose_fp8", kc_case_fp8_weight},
    {"gemm", "op_gemm (BF16 and FP8 fprop, dgrad, wgrad)", kc_case_gemm},
    {"grad_fp8", "the FP8 gradient wire's pack and sum kernels (comm/grad_fp8.cuh)", kc_case_grad_fp8},
};
#define NUM_KERNEL_CASES ((int)(sizeof(KERNEL_CASES) / sizeof(KERNEL_CASES[0])))

/* The case called `family`, or NULL. */
static inline const KernelCase* kernel_case_find(const char* family) {
    for (int i = 0; i < NUM_KERNEL_CASES; i++) {
        if (strcmp(KERNEL_CASES[i].family, family) == 0) return &KERNEL_CASES[i];
    }
    return NULL;
}

/*
 * Runs the case of `family` (stops on an unknown name or an unusable shape) after a header line; returns
 * its number of failed comparisons and leaves its slowest timed op in g_kernel_case_slowest_*.
 * Initializes both backends (the CPU one in BF16 mode; the GPU one is a no-op when already initialized).
 */
static inline int run_kernel_case(const char* family, const KernelShape* s, int iters, uint64_t seed) {
    const KernelCase* kc = kernel_case_find(family);
    if (kc == NULL) {
        fprintf(stderr, "known kernel families:");
        for (int i = 0; i < NUM_KERNEL_CASES; i++) fprintf(stderr, " %s", KERNEL_CASES[i].family);
        fprintf(stderr, "\n");
        die("unknown kernel family '%s'", family);
    }
    if (s->B <= 0 || s->T <= 0 || s->C <= 0 || s->NH <= 0 || s->NKV <= 0 || s->F <= 0 || s->V <= 0)
        die("kernel shape: every dimension must be positive");
    if (s->C % s->NH != 0) die("kernel shape: C %d is not a multiple of NH %d", s->C, s->NH);
    if (s->NH % s->NKV != 0) die("kernel shape: NH %d is not a multiple of NKV %d", s->NH, s->NKV);
    if ((s->C / s->NH) % 2 != 0) die("kernel shape: head size %d is odd (RoPE rotates pairs)", s->C / s->NH);
    backend_init(PRECISION_BF16);
    cpu_ref_init(PRECISION_BF16);
    g_kernel_case_slowest_us = 0.0;
    g_kernel_case_slowest_op[0] = '\0';
    printf("[ %s ] %s; B %d T %d C %d NH %d NKV %d F %d V %d, seed %llu\n", kc->family, kc->ops, s->B, s->T, s->C, s->NH,
           s->NKV, s->F, s->V, (unsigned long long)seed);
    fflush(stdout);
    int failed = kc->run(s, iters, seed);
    backend_synchronize();
    printf("%s %s (%d failed)\n", failed ? "FAIL" : "ok  ", kc->family, failed);
    fflush(stdout);
    return failed;
}
