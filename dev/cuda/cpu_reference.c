/*
 * build/cpu_reference.o: the CPU backend under the cpu_ref_ names of dev/cuda/cpu_reference.h. Each
 * function forwards to the CPU op of the contract (llama/backend.h), so a signature that drifts in either
 * place stops this file from compiling.
 */
#include "../../cpu/backend.h"
#include "cpu_reference.h"

void cpu_ref_init(Precision p) { backend_init(p); }

int cpu_ref_has_blas(void) {
#ifdef LLM8_NO_BLAS
    return 0;
#else
    return 1;
#endif
}

size_t cpu_ref_att_stats_size(size_t B, int NH, int T) { return att_stats_size(B, NH, T); }

void cpu_ref_params_from_master(float* out, const float* master, size_t n) { op_params_from_master(out, master, n); }

void cpu_ref_encoder_forward(float* out, const int* tokens, const float* wte, size_t N, int C) {
    op_encoder_forward(out, tokens, wte, N, C);
}

void cpu_ref_encoder_backward(float* dwte, const float* dout, const int* tokens, size_t N, int C) {
    op_encoder_backward(dwte, dout, tokens, tokens, N, C);
}

void cpu_ref_rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, size_t N, int C, float eps,
                             Fp8Scale* amax) {
    op_rmsnorm_forward(out, rstd, inp, weight, N, C, eps, amax);
}

void cpu_ref_residual_rmsnorm_forward(float* resid_out, float* norm_out, float* rstd, const float* resid_in,
                                      const float* branch, const float* weight, size_t N, int C, float eps, Fp8Scale* amax) {
    op_residual_rmsnorm_forward(resid_out, norm_out, rstd, resid_in, branch, weight, N, C, eps, amax);
}

void cpu_ref_rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                              const float* rstd, size_t N, int C) {
    op_rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, N, C);
}

void cpu_ref_rope_forward(float* qkv, const float* cos_t, const float* sin_t, int B, int T, int NH, int NKV, int HS) {
    op_rope_forward(qkv, cos_t, sin_t, B, T, NH, NKV, HS);
}

void cpu_ref_rope_backward(float* dqkv, const float* cos_t, const float* sin_t, int B, int T, int NH, int NKV, int HS) {
    op_rope_backward(dqkv, cos_t, sin_t, B, T, NH, NKV, HS);
}

void cpu_ref_attention_forward(float* out, float* stats, const float* qkv, int B, int T, int NH, int NKV, int HS) {
    op_attention_forward(out, stats, qkv, B, T, NH, NKV, HS);
}

void cpu_ref_attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* stats, int B,
                                int T, int NH, int NKV, int HS) {
    op_attention_backward(dqkv, dout, qkv, out, stats, B, T, NH, NKV, HS);
}

void cpu_ref_swiglu_forward(float* out, const float* inp, size_t N, int F, Fp8Scale* amax) {
    op_swiglu_forward(out, inp, N, F, amax);
}

void cpu_ref_swiglu_backward(float* dinp, const float* dout, const float* inp, size_t N, int F) {
    op_swiglu_backward(dinp, dout, inp, N, F);
}

void cpu_ref_classifier(float* logits, float* losses, const int* targets, size_t N, int V, float dloss) {
    op_classifier(logits, losses, targets, N, V, dloss);
}

void cpu_ref_sum_squares_chunks(double* partials, const float* x, size_t n, size_t chunk) {
    op_sum_squares_chunks(partials, x, n, chunk);
}

double cpu_ref_sum_f64(const double* x, size_t n) { return op_sum_f64(x, n); }

void cpu_ref_sum_f32_in_order(double* sum, const float* x, size_t n) { op_sum_f32_in_order(sum, x, n); }

void cpu_ref_adamw(float* master, AdamwMoments s, const float* grads, size_t n, float lr, float wd, float bc1, float bc2_sqrt,
                   float grad_scale) {
    op_adamw(master, s, grads, n, lr, wd, bc1, bc2_sqrt, grad_scale);
}

void cpu_ref_store_add(StoreCodec c, void* dst, float* scale_inv, const float* x, size_t n, int accumulate) {
    op_store_add(c, dst, scale_inv, x, n, accumulate);
}

void cpu_ref_store_load(StoreCodec c, float* out, const void* src, const float* scale_inv, size_t n, int accumulate) {
    op_store_load(c, out, src, scale_inv, n, accumulate);
}

void cpu_ref_amax(Fp8Scale* s, const float* x, size_t n) { op_amax(s, x, n); }

void cpu_ref_cast_transpose(uint8_t* out, uint8_t* out_t, const float* x, size_t rows, size_t cols, Fp8Format f,
                            Fp8Scale* s, int pow2, Fp8Counts* counts) {
    op_cast_transpose(out, out_t, x, rows, cols, f, s, pow2, counts);
}

void cpu_ref_cast_transpose_delayed(uint8_t* out, uint8_t* out_t, const float* x, size_t rows, size_t cols, Fp8Format f,
                                    Fp8Scale* s, Fp8Counts* counts, float* record) {
    op_cast_transpose_delayed(out, out_t, x, rows, cols, f, s, counts, record);
}

void cpu_ref_fp8_delayed_update(Fp8Scale* s, float* history, const float* step_amax, size_t n, int H, int pos, int len,
                                int algo, Fp8Format f, int margin, int pow2) {
    op_fp8_delayed_update(s, history, step_amax, n, H, pos, len, algo, f, margin, pow2);
}

void cpu_ref_amax_master(Fp8Scale* s, const float* master, size_t n) { op_amax_master(s, master, n); }

void cpu_ref_cast_transpose_master(uint8_t* out, uint8_t* out_t, const float* master, size_t rows, size_t cols, Fp8Format f,
                                   Fp8Scale* s, int pow2, Fp8Counts* counts) {
    op_cast_transpose_master(out, out_t, master, rows, cols, f, s, pow2, counts);
}

void cpu_ref_transpose_fp8(uint8_t* out_t, const uint8_t* in, size_t rows, size_t cols) { op_transpose_fp8(out_t, in, rows, cols); }

void cpu_ref_gemm(const GemmCall* g) { op_gemm(g); }

int cpu_ref_gemm_hopper(const GemmCall* g, int splits) {
    char why[256];
    if (gemm_check(g, why, sizeof(why))) die("%s", why);
    if (g->accumulate || !dtype_is_fp8(g->a.dtype) || gemm_hopper(g, splits)) return 1;
    if (g->d_type == DT_ACT && g_round_bf16) {
        float* d = (float*)g->d;
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < g->m * g->n; i++) d[i] = bf16_round(d[i]);
    }
    return 0;
}
