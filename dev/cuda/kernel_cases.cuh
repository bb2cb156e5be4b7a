/*
 * Kernel cases: every GPU op of the CUDA backend (cuda/backend.cuh) checked against the CPU op of the same
 * name (llama/backend.h is the contract both follow), one case per op family (one file of cuda/ or of
 * the FP8 library each), optionally timed. Used by the kernel playground dev/cuda/bench_kernels.cu
 * (Llama-2 7B/13B shapes, with timings) and by test_llama.cu (a small shape, no timings).
 *
 * This file is the index: the cases live one file per family in dev/cuda/cases/, on what they share in
 * cases/common.cuh (inputs, buffer sets, comparisons, timing); the table below names them.
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
 * returns its number of failed comparisons. These headers must not include model/model.h or trainer.h:
 * test_llama.cu includes them after train_llama.cu.
 */
#pragma once

#include "cases/common.cuh"
#include "cases/optimizer.cuh"
#include "cases/encoder.cuh"
#include "cases/rmsnorm.cuh"
#include "cases/rope.cuh"
#include "cases/attention.cuh"
#include "cases/swiglu.cuh"
#include "cases/classifier.cuh"
#include "cases/fp8_cast.cuh"
#include "cases/fp8_weight.cuh"
#include "cases/gemm.cuh"
#include "cases/grad_fp8.cuh"

/* ------------------------------------------------------------ the table */

static const KernelCase KERNEL_CASES[] = {
    {"optimizer", "op_params_from_master, op_sum_squares_chunks, op_sum_f64, op_sum_f32_in_order, op_adamw, op_store_add, op_store_load",
     kc_case_optimizer},
    {"encoder", "op_encoder_forward, op_encoder_backward", kc_case_encoder},
    {"rmsnorm", "op_rmsnorm_forward, op_residual_rmsnorm_forward, op_rmsnorm_backward", kc_case_rmsnorm},
    {"rope", "op_rope_forward, op_rope_backward", kc_case_rope},
    {"attention", "op_attention_forward, op_attention_backward (causal, GQA)", kc_case_attention},
#if defined(USE_CUDNN) && defined(ATTENTION_FALLBACK)
    {"attention_fallback", "the fallback attention kernels (kept beside cuDNN by the emulated build)", kc_case_attention_fallback},
#endif
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
