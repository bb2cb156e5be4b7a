/*
 * RoPE on the GPU (HF rotate-half), forward and its transpose for the gradients. Kernel family "rope".
 */
#pragma once

#include "../core/cuda_utils.cuh"
#include "../llama/op_math.h"

/* One thread per rotated pair (x_i, x_{i+HS/2}) of one q or k head of one token. */
__global__ void rope_kernel(act_t* qkv, const float* cos_t, const float* sin_t, size_t BT, int T, int heads, int HS,
                            size_t QKV, float direction) {
    int half = HS / 2;
    size_t total = BT * heads * half;
    for (size_t idx = grid_index(); idx < total; idx += grid_stride()) {
        int i = (int)(idx % half);
        size_t rest = idx / half;
        int h = (int)(rest % heads);
        size_t bt = rest / heads;
        int t = (int)(bt % T);
        act_t* v = qkv + bt * QKV + (size_t)h * HS;
        float c = cos_t[t * half + i], s = direction * sin_t[t * half + i];
        float o1, o2;
        rope_rotate(bf16_to_f(v[i]), bf16_to_f(v[i + half]), c, s, &o1, &o2);
        v[i] = f_to_bf16(o1);
        v[i + half] = f_to_bf16(o2);
    }
}

static inline void rope_apply(act_t* qkv, const float* cos_t, const float* sin_t, int B, int T, int NH, int NKV, int HS,
                              float direction) {
    size_t BT = (size_t)B * T, QKV = (size_t)(NH + 2 * NKV) * HS;
    LAUNCH(rope_kernel, grid_for(BT * (NH + NKV) * (HS / 2), BLOCK_THREADS), BLOCK_THREADS)(qkv, cos_t, sin_t, BT, T, NH + NKV,
                                                                                        HS, QKV, direction);
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
