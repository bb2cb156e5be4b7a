/*
 * The CPU backend (cpu/backend.h) as its own object, build/cpu_reference.o, compiled by gcc with OpenMP
 * and BLAS, under names with a cpu_ref_ prefix: what test_llama and the kernel playground
 * (dev/cuda/kernel_cases.cuh) compare every GPU op with. Each function is the CPU op of the same name in
 * llama/backend.h's contract with act_t = float (host pointers); the object is put in BF16 mode by
 * cpu_ref_init(PRECISION_BF16) so that it rounds to BF16 wherever the GPU stores BF16.
 */
#pragma once

#include "../../fp8/gemm.h"
#include "../../llama/config.h"
#include "../../llama/optim.h"

/*
 * The CPU work one GPU-vs-CPU comparison of dev/cuda/kernel_cases.cuh may take (dev/cuda/time_cpu_reference.c
 * times what they cost): multiply-adds of one GEMM on OpenBLAS (every Llama-2 7B/13B linear layer, seconds
 * on 16 cores) and with the plain loop of a build without BLAS (make BLAS=none, as on a GPU host where
 * nothing can be installed); query-head x T x T x HS units of one attention comparison (8 heads at T 4096,
 * HS 128: ~10 s on 16 cores, 0.5 GiB of probabilities).
 */
#define CPU_REF_GEMM_WORK_BLAS 4e11
#define CPU_REF_GEMM_WORK_LOOP 2e9
#define CPU_REF_ATT_WORK (8.0 * 4096.0 * 4096.0 * 128.0)

#ifdef __cplusplus
extern "C" {
#endif

void cpu_ref_init(Precision p);
/* 1 when the CPU GEMMs run on OpenBLAS, 0 with the plain loop of a build without BLAS (make BLAS=none). */
int cpu_ref_has_blas(void);
size_t cpu_ref_att_stats_size(size_t B, int NH, int T);
void cpu_ref_params_from_master(float* out, const float* master, size_t n);
void cpu_ref_encoder_forward(float* out, const int* tokens, const float* wte, size_t N, int C);
void cpu_ref_encoder_backward(float* dwte, const float* dout, const int* tokens, size_t N, int C);
void cpu_ref_rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, size_t N, int C, float eps,
                             Fp8Scale* amax);
void cpu_ref_residual_rmsnorm_forward(float* resid_out, float* norm_out, float* rstd, const float* resid_in,
                                      const float* branch, const float* weight, size_t N, int C, float eps, Fp8Scale* amax);
void cpu_ref_rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                              const float* rstd, size_t N, int C);
void cpu_ref_rope_forward(float* qkv, const float* cos_t, const float* sin_t, int B, int T, int NH, int NKV, int HS);
void cpu_ref_rope_backward(float* dqkv, const float* cos_t, const float* sin_t, int B, int T, int NH, int NKV, int HS);
void cpu_ref_attention_forward(float* out, float* stats, const float* qkv, int B, int T, int NH, int NKV, int HS);
void cpu_ref_attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* stats, int B,
                                int T, int NH, int NKV, int HS);
void cpu_ref_swiglu_forward(float* out, const float* inp, size_t N, int F, Fp8Scale* amax);
void cpu_ref_swiglu_backward(float* dinp, const float* dout, const float* inp, size_t N, int F);
void cpu_ref_classifier(float* logits, float* losses, const int* targets, size_t N, int V, float dloss);
void cpu_ref_sum_squares_chunks(double* partials, const float* x, size_t n, size_t chunk);
double cpu_ref_sum_f64(const double* x, size_t n);
void cpu_ref_sum_f32_in_order(double* sum, const float* x, size_t n);
void cpu_ref_adamw(float* master, AdamwMoments s, const float* grads, size_t n, float lr, float wd, float bc1, float bc2_sqrt,
                   float grad_scale);
void cpu_ref_store_add(StoreCodec c, void* dst, float* scale_inv, const float* x, size_t n, int accumulate);
void cpu_ref_store_load(StoreCodec c, float* out, const void* src, const float* scale_inv, size_t n, int accumulate);
void cpu_ref_amax(Fp8Scale* s, const float* x, size_t n);
void cpu_ref_cast_transpose(uint8_t* out, uint8_t* out_t, const float* x, size_t rows, size_t cols, Fp8Format f,
                            Fp8Scale* s, int pow2, Fp8Counts* counts);
void cpu_ref_cast_transpose_delayed(uint8_t* out, uint8_t* out_t, const float* x, size_t rows, size_t cols, Fp8Format f,
                                    Fp8Scale* s, Fp8Counts* counts, float* record);
void cpu_ref_fp8_delayed_update(Fp8Scale* s, float* history, const float* step_amax, size_t n, int H, int pos, int len,
                                int algo, Fp8Format f, int margin, int pow2);
void cpu_ref_amax_master(Fp8Scale* s, const float* master, size_t n);
void cpu_ref_cast_transpose_master(uint8_t* out, uint8_t* out_t, const float* master, size_t rows, size_t cols, Fp8Format f,
                                   Fp8Scale* s, int pow2, Fp8Counts* counts);
void cpu_ref_transpose_fp8(uint8_t* out_t, const uint8_t* in, size_t rows, size_t cols);
void cpu_ref_gemm(const GemmCall* g);
/* The Hopper model (fp8/gemm_hopper.h) of a non-accumulating FP8 GEMM g with `splits` contiguous split-K
   parts, D rounded to BF16 where op_gemm rounds it; returns 1 without touching D when g accumulates, is not
   FP8 or holds a non-finite code. */
int cpu_ref_gemm_hopper(const GemmCall* g, int splits);

#ifdef __cplusplus
}
#endif
