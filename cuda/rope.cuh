/*
 * RoPE on the GPU (HF rotate-half), forward and its transpose for the gradients. Kernel family "rope".
 */
#pragma once

#include "../core/cuda_utils.cuh"
#include "../llama/op_math.h"

/*
 * One thread per rotated pair (x_i, x_{i+HS/2}) of one q or k head of one token: blockIdx.x is the token
 * (B T < 2^31, the grid's x limit); the block's threads form rows of `lanes` = min(HS/2, blockDim.x), a
 * row per head (blockIdx.y picks the block's heads), a lane per pair. One 32-bit division per thread,
 * none per element.
 */
__global__ void rope_kernel(act_t* qkv, const float* cos_t, const float* sin_t, int T, int heads, int HS, size_t QKV,
                            float direction) {
    int half = HS / 2, lanes = half < (int)blockDim.x ? half : (int)blockDim.x, rows = (int)blockDim.x / lanes;
    int lane = (int)threadIdx.x % lanes, row = (int)threadIdx.x / lanes;
    int bt = (int)blockIdx.x, h = (int)blockIdx.y * rows + row;
    if (row >= rows || h >= heads) return;
    act_t* v = qkv + (size_t)bt * QKV + (size_t)h * HS;
    const float* cos_row = cos_t + (size_t)(bt % T) * half;
    const float* sin_row = sin_t + (size_t)(bt % T) * half;
    for (int i = lane; i < half; i += lanes) {
        float o1, o2;
        rope_rotate(bf16_to_f(v[i]), bf16_to_f(v[i + half]), cos_row[i], direction * sin_row[i], &o1, &o2);
        v[i] = f_to_bf16(o1);
        v[i + half] = f_to_bf16(o2);
    }
}

static inline void rope_apply(act_t* qkv, const float* cos_t, const float* sin_t, int B, int T, int NH, int NKV, int HS,
                              float direction) {
    int heads = NH + NKV, half = HS / 2, rows = BLOCK_THREADS / (half < BLOCK_THREADS ? half : BLOCK_THREADS);
    size_t QKV = (size_t)(NH + 2 * NKV) * HS;
    dim3 grid((unsigned int)((size_t)B * T), (unsigned int)ceil_div((size_t)heads, (size_t)rows));
    LAUNCH(rope_kernel, grid, BLOCK_THREADS)(qkv, cos_t, sin_t, T, heads, HS, QKV, direction);
    launchCheck();
}

/*
 * RoPE in place on the q (NH heads) and k (NKV heads) parts of qkv (B, T, QKV), HF rotate-half: for
 * i < HS/2, (x_i, x_{i+HS/2}) rotates by pos * theta^(-2i/HS); tables cos_t, sin_t (T, HS/2) FP32.
 */
static inline void op_rope_forward(act_t* qkv, const float* cos_t, const float* sin_t, int B, int T, int NH, int NKV,
                                   int HS) {
    rope_apply(qkv, cos_t, sin_t, B, T, NH, NKV, HS, 1.0f);
}

/* The transpose rotation, on the gradients dqkv (B, T, QKV). */
static inline void op_rope_backward(act_t* dqkv, const float* cos_t, const float* sin_t, int B, int T, int NH, int NKV,
                                    int HS) {
    rope_apply(dqkv, cos_t, sin_t, B, T, NH, NKV, HS, -1.0f);
}
