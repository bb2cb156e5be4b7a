/*
 * Family swiglu (cuda/swiglu.cuh): op_swiglu_forward, op_swiglu_backward.
 */
#pragma once

#include "common.cuh"

/*
 * Tolerance: the GPU's expf (2 ulp, CUDA programming guide) is not glibc's, and nvcc contracts FMAs, so
 * the FP32 values differ in their last bits and may round to neighbouring BF16 values: 2 BF16 ulps.
 * Backward's 1 + a (1 - s) cancels near a = -1.28, where the difference is absolute: + 1e-5.
 */
static int kc_case_swiglu(const KernelShape* s, int iters, uint64_t seed) {
    uint64_t stream = seed;
    int failed = 0;
    size_t N = (size_t)s->B * s->T, F = (size_t)s->F;
    KcSet set = {};
    KcBuf* inp = kc_input(&set, N * 2 * F, splitmix64(&stream), 0.0f, 2.0f, KC_BF16);
    KcBuf* out = kc_output(&set, N * F, KC_BF16);
    Fp8Scale cpu_amax;
    cpu_ref_swiglu_forward(out->h, inp->h, N, (int)F, &cpu_amax);
    Fp8Scale* d_amax = (Fp8Scale*)dev_alloc(sizeof(Fp8Scale));
    kc_poison(d_amax, sizeof(Fp8Scale));
    op_swiglu_forward(out->a, inp->a, N, (int)F, d_amax);
    failed += kc_check_ulps("swiglu_forward out", out, KC_BF16_MANT, 2.0, 1e-5);
    failed += kc_compare_fused_amax("swiglu_forward", d_amax, out->a, N * F, cpu_amax.amax, out->h);
    kc_time("swiglu_forward", iters, 6.0 * N * F, 0.0, [&] { op_swiglu_forward(out->a, inp->a, N, (int)F, NULL); });
    kc_time("swiglu_forward + fused amax", iters, 6.0 * N * F, 0.0, [&] { op_swiglu_forward(out->a, inp->a, N, (int)F, d_amax); });
    /* a NaN input: the fused amax is NaN */
    KcBuf* inp_nan = kc_buf(&set, N * 2 * F, KC_BF16);
    memcpy(inp_nan->h, inp->h, N * 2 * F * sizeof(float));
    inp_nan->h[(N / 2) * 2 * F + F + 5] = NAN;
    kc_upload(inp_nan);
    cpu_ref_swiglu_forward(out->h, inp_nan->h, N, (int)F, &cpu_amax);
    kc_poison(d_amax, sizeof(Fp8Scale));
    op_swiglu_forward(out->a, inp_nan->a, N, (int)F, d_amax);
    failed += kc_compare_fused_amax("swiglu_forward (a NaN input)", d_amax, out->a, N * F, cpu_amax.amax, out->h);
    if (fp8_amax_is_finite(cpu_amax.amax)) {
        printf("      FAIL: swiglu_forward: a NaN input gave a finite fused amax %g\n", cpu_amax.amax);
        failed++;
    }
    dev_free(d_amax);

    KcBuf* dout = kc_input(&set, N * F, splitmix64(&stream), 0.0f, 1.0f, KC_BF16);
    KcBuf* dinp = kc_output(&set, N * 2 * F, KC_BF16);
    cpu_ref_swiglu_backward(dinp->h, dout->h, inp->h, N, (int)F);
    op_swiglu_backward(dinp->a, dout->a, inp->a, N, (int)F);
    failed += kc_check_ulps("swiglu_backward dinp", dinp, KC_BF16_MANT, 2.0, 1e-5);
    kc_time("swiglu_backward", iters, 10.0 * N * F, 0.0, [&] { op_swiglu_backward(dinp->a, dout->a, inp->a, N, (int)F); });
    kc_set_free(&set);
    return failed;
}
