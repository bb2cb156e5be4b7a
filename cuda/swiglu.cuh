/*
 * SwiGLU on the GPU, forward and backward (op_math.h's formulas, one thread per element). Kernel family
 * "swiglu".
 */
#pragma once

#include "../core/cuda_utils.cuh"
#include "../fp8/cast_cuda.cuh"
#include "../llama/op_math.h"

__global__ void swiglu_forward_kernel(act_t* out, const act_t* inp, size_t N, int F, unsigned int* amax_bits) {
    size_t total = N * (size_t)F;
    unsigned int m = 0;
    for (size_t i = grid_index(); i < total; i += grid_stride()) {
        size_t row = i / (size_t)F, j = i % (size_t)F;
        act_t y = f_to_bf16(swiglu(bf16_to_f(inp[row * 2 * F + j]), bf16_to_f(inp[row * 2 * F + F + j])));
        out[i] = y;
        m = fp8_amax_fold(m, y);
    }
    if (amax_bits) fp8_amax_fused_block_end<BLOCK_THREADS>(amax_bits, m);
}

/* out (N, F) = silu(a) * b with inp (N, 2F) = [a | b] per row (SwiGLU, Shazeer 2020); amax (may be NULL):
   the fused amax of out (llama/backend.h). */
static inline void op_swiglu_forward(act_t* out, const act_t* inp, size_t N, int F, Fp8Scale* amax) {
    unsigned int* amax_bits = fp8_amax_fused_begin(amax);
    LAUNCH(swiglu_forward_kernel, grid_for(N * (size_t)F, BLOCK_THREADS), BLOCK_THREADS)(out, inp, N, F, amax_bits);
    launchCheck();
}

__global__ void swiglu_backward_kernel(act_t* dinp, const act_t* dout, const act_t* inp, size_t N, int F) {
    size_t total = N * (size_t)F;
    for (size_t i = grid_index(); i < total; i += grid_stride()) {
        size_t row = i / (size_t)F, j = i % (size_t)F;
        float da, db;
        swiglu_backward(bf16_to_f(inp[row * 2 * F + j]), bf16_to_f(inp[row * 2 * F + F + j]), bf16_to_f(dout[i]), &da, &db);
        dinp[row * 2 * F + j] = f_to_bf16(da);
        dinp[row * 2 * F + F + j] = f_to_bf16(db);
    }
}

/* dinp (N, 2F) = [dout * b * silu'(a) | dout * silu(a)], silu'(a) = s (1 + a (1 - s)), s = sigmoid(a). */
static inline void op_swiglu_backward(act_t* dinp, const act_t* dout, const act_t* inp, size_t N, int F) {
    LAUNCH(swiglu_backward_kernel, grid_for(N * (size_t)F, BLOCK_THREADS), BLOCK_THREADS)(dinp, dout, inp, N, F);
    launchCheck();
}
