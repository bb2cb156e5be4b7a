/*
 * Family rmsnorm (cuda/rmsnorm.cuh): op_rmsnorm_forward, op_residual_rmsnorm_forward, op_rmsnorm_backward.
 */
#pragma once

#include "common.cuh"

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
    KcSet set = {};
    KcBuf* inp = kc_input(&set, NC, splitmix64(&stream), 0.0f, 1.0f, KC_BF16);
    KcBuf* weight = kc_input(&set, C, splitmix64(&stream), 1.0f, 0.1f, KC_BF16);
    Fp8Scale* d_amax = (Fp8Scale*)dev_alloc(sizeof(Fp8Scale));

    /* forward */
    KcBuf* out = kc_output(&set, NC, KC_BF16);
    KcBuf* rstd = kc_output(&set, N, KC_F32);
    Fp8Scale cpu_amax;
    cpu_ref_rmsnorm_forward(out->h, rstd->h, inp->h, weight->h, N, (int)C, KC_RMS_EPS, &cpu_amax);
    kc_poison(d_amax, sizeof(Fp8Scale));
    op_rmsnorm_forward(out->a, rstd->f, inp->a, weight->a, N, (int)C, KC_RMS_EPS, d_amax);
    failed += kc_check_ulps("rmsnorm_forward out", out, KC_BF16_MANT, 2.0, 1e-6);
    failed += kc_check_ulps("rmsnorm_forward rstd", rstd, KC_F32_MANT, 64.0, 0.0);
    failed += kc_compare_fused_amax("rmsnorm_forward", d_amax, out->a, NC, cpu_amax.amax, out->h);
    kc_time("rmsnorm_forward", iters, 4.0 * NC + 4.0 * N, 0.0,
            [&] { op_rmsnorm_forward(out->a, rstd->f, inp->a, weight->a, N, (int)C, KC_RMS_EPS, NULL); });
    kc_time("rmsnorm_forward + fused amax", iters, 4.0 * NC + 4.0 * N, 0.0,
            [&] { op_rmsnorm_forward(out->a, rstd->f, inp->a, weight->a, N, (int)C, KC_RMS_EPS, d_amax); });

    /* a NaN input: its row is NaN, and so is the fused amax (into the GPU's out and rstd, which serve as
       scratch below, and the CPU's host-only scratch: its rstd serves below) */
    KcBuf* inp_nan = kc_buf(&set, NC, KC_BF16);
    KcBuf* out_nan = kc_buf(&set, NC, KC_HOST);
    KcBuf* rstd_nan = kc_buf(&set, N, KC_HOST);
    memcpy(inp_nan->h, inp->h, NC * sizeof(float));
    inp_nan->h[(N / 2) * C + 3] = NAN;
    kc_upload(inp_nan);
    cpu_ref_rmsnorm_forward(out_nan->h, rstd_nan->h, inp_nan->h, weight->h, N, (int)C, KC_RMS_EPS, &cpu_amax);
    kc_poison(d_amax, sizeof(Fp8Scale));
    op_rmsnorm_forward(out->a, rstd->f, inp_nan->a, weight->a, N, (int)C, KC_RMS_EPS, d_amax);
    failed += kc_compare_fused_amax("rmsnorm_forward (a NaN input)", d_amax, out->a, NC, cpu_amax.amax, out_nan->h);
    if (fp8_amax_is_finite(cpu_amax.amax)) {
        printf("      FAIL: rmsnorm_forward: a NaN input gave a finite fused amax %g\n", cpu_amax.amax);
        failed++;
    }

    /* fused residual + forward */
    KcBuf* branch = kc_input(&set, NC, splitmix64(&stream), 0.0f, 0.5f, KC_BF16);
    KcBuf* resid = kc_output(&set, NC, KC_BF16);
    KcBuf* norm = kc_output(&set, NC, KC_BF16);
    KcBuf* rstd2 = kc_output(&set, N, KC_F32);
    cpu_ref_residual_rmsnorm_forward(resid->h, norm->h, rstd2->h, inp->h, branch->h, weight->h, N, (int)C, KC_RMS_EPS, &cpu_amax);
    kc_poison(d_amax, sizeof(Fp8Scale));
    op_residual_rmsnorm_forward(resid->a, norm->a, rstd2->f, inp->a, branch->a, weight->a, N, (int)C, KC_RMS_EPS, d_amax);
    failed += kc_check_ulps("residual_rmsnorm_forward resid_out", resid, KC_BF16_MANT, 0.0, 0.0);
    failed += kc_check_ulps("residual_rmsnorm_forward norm_out", norm, KC_BF16_MANT, 2.0, 1e-6);
    failed += kc_check_ulps("residual_rmsnorm_forward rstd", rstd2, KC_F32_MANT, 64.0, 0.0);
    failed += kc_compare_fused_amax("residual_rmsnorm_forward norm_out", d_amax, norm->a, NC, cpu_amax.amax, norm->h);
    kc_time("residual_rmsnorm_forward", iters, 8.0 * NC + 4.0 * N, 0.0, [&] {
        op_residual_rmsnorm_forward(resid->a, norm->a, rstd2->f, inp->a, branch->a, weight->a, N, (int)C, KC_RMS_EPS, NULL);
    });
    kc_time("residual_rmsnorm_forward + fused amax", iters, 8.0 * NC + 4.0 * N, 0.0, [&] {
        op_residual_rmsnorm_forward(resid->a, norm->a, rstd2->f, inp->a, branch->a, weight->a, N, (int)C, KC_RMS_EPS, d_amax);
    });
    dev_free(d_amax);

    /* backward, accumulating into non-zero dinp and dweight; rstd is the CPU forward's on both sides */
    KcBuf* dinp = kc_input(&set, NC, splitmix64(&stream), 0.0f, 1.0f, KC_BF16);
    KcBuf* dweight = kc_input(&set, C, splitmix64(&stream), 0.0f, 1.0f, KC_F32);
    KcBuf* dout = kc_input(&set, NC, splitmix64(&stream), 0.0f, 1.0f, KC_BF16);
    kc_upload(rstd);
    cpu_ref_rmsnorm_backward(dinp->h, dweight->h, dout->h, inp->h, weight->h, rstd->h, N, (int)C);
    op_rmsnorm_backward(dinp->a, dweight->f, dout->a, inp->a, weight->a, rstd->f, N, (int)C);
    failed += kc_check_ulps("rmsnorm_backward dinp", dinp, KC_BF16_MANT, 2.0, 1e-5);
    failed += kc_check_norm("rmsnorm_backward dweight", dweight, 3e-5, 3e-5);
    kc_time("rmsnorm_backward", iters, 8.0 * NC + 4.0 * N, 0.0,
            [&] { op_rmsnorm_backward(dinp->a, dweight->f, dout->a, inp->a, weight->a, rstd->f, N, (int)C); });
    kc_set_free(&set);
    return failed;
}
