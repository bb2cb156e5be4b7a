/*
 * RMSNorm on the GPU: forward, the fused residual add + RMSNorm forward, and backward with a deterministic
 * weight-gradient reduction (per-block partials, then a column sum). Kernel family "rmsnorm".
 */
#pragma once

#include "../core/cuda_utils.cuh"
#include "../fp8/cast_cuda.cuh"
#include "../llama/op_math.h"

/* Shared by the two forward kernels: normalizes row x (C) already in memory, folding the row's output
   into the fused amax when amax_bits is not NULL (fp8/cast_cuda.cuh); returns rstd. */
__device__ __forceinline__ float rmsnorm_row(act_t* out, const act_t* x, const act_t* weight, int C, float eps,
                                             float sum_sq, unsigned int* amax_bits) {
    float ss = block_reduce<BLOCK_THREADS>(sum_sq, SumOp());
    float r = 1.0f / sqrtf(ss / (float)C + eps);
    unsigned int m = 0;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        act_t y = f_to_bf16(bf16_to_f(x[c]) * r * bf16_to_f(weight[c]));
        out[c] = y;
        m = fp8_amax_fold(m, y);
    }
    if (amax_bits) fp8_amax_fused_block_end<BLOCK_THREADS>(amax_bits, m);
    return r;
}

__global__ void rmsnorm_forward_kernel(act_t* out, float* rstd, const act_t* inp, const act_t* weight, int C, float eps,
                                       unsigned int* amax_bits) {
    size_t row = blockIdx.x;
    const act_t* x = inp + row * C;
    float ss = 0.0f;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float v = bf16_to_f(x[c]);
        ss += v * v;
    }
    float r = rmsnorm_row(out + row * C, x, weight, C, eps, ss, amax_bits);
    if (threadIdx.x == 0) rstd[row] = r;
}

/* out (N, C) = inp * rstd * weight, rstd (N) = 1 / sqrt(mean(inp^2) + eps) (HF LlamaRMSNorm). One block per row.
   amax (may be NULL): the fused amax of out (llama/backend.h). */
static inline void op_rmsnorm_forward(act_t* out, float* rstd, const act_t* inp, const act_t* weight, size_t N, int C,
                                      float eps, Fp8Scale* amax) {
    unsigned int* amax_bits = fp8_amax_fused_begin(amax);
    if (N == 0) return;
    LAUNCH(rmsnorm_forward_kernel, (unsigned int)N, BLOCK_THREADS)(out, rstd, inp, weight, C, eps, amax_bits);
    launchCheck();
}

__global__ void residual_rmsnorm_forward_kernel(act_t* resid_out, act_t* norm_out, float* rstd, const act_t* resid_in,
                                                const act_t* branch, const act_t* weight, int C, float eps,
                                                unsigned int* amax_bits) {
    size_t row = blockIdx.x;
    act_t* x = resid_out + row * C;
    float ss = 0.0f;
    /* each thread later reads back only the elements it wrote, so no barrier is needed in between */
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        act_t v = f_to_bf16(bf16_to_f(resid_in[row * C + c]) + bf16_to_f(branch[row * C + c]));
        x[c] = v;
        float f = bf16_to_f(v);
        ss += f * f;
    }
    float r = rmsnorm_row(norm_out + row * C, x, weight, C, eps, ss, amax_bits);
    if (threadIdx.x == 0) rstd[row] = r;
}

/* resid_out (N, C) = resid_in + branch (stored BF16), then norm_out, rstd = RMSNorm(resid_out), fused;
   amax (may be NULL): the fused amax of norm_out. */
static inline void op_residual_rmsnorm_forward(act_t* resid_out, act_t* norm_out, float* rstd, const act_t* resid_in,
                                               const act_t* branch, const act_t* weight, size_t N, int C, float eps,
                                               Fp8Scale* amax) {
    unsigned int* amax_bits = fp8_amax_fused_begin(amax);
    if (N == 0) return;
    LAUNCH(residual_rmsnorm_forward_kernel, (unsigned int)N, BLOCK_THREADS)(resid_out, norm_out, rstd, resid_in, branch, weight,
                                                                        C, eps, amax_bits);
    launchCheck();
}

/* Blocks of the RMSNorm backward: fixed (capped by N) so the dweight summation order depends on N only. */
#define RMSNORM_BWD_BLOCKS 512

/*
 * One block per contiguous range of rows: dinp += rstd * (g - xh * mean(g * xh)), g = dout * w, and this
 * block's column sums of dout * xh into dweight_partial (blocks, C), kept in shared memory meanwhile
 * (each thread owns the columns c = threadIdx.x mod blockDim.x, so no races).
 */
__global__ void rmsnorm_backward_kernel(act_t* dinp, float* dweight_partial, const act_t* dout, const act_t* inp,
                                        const act_t* weight, const float* rstd, size_t N, int C, size_t rows_per_block) {
    DYNAMIC_SHARED(float, dw);
    for (int c = threadIdx.x; c < C; c += blockDim.x) dw[c] = 0.0f;
    size_t begin = (size_t)blockIdx.x * rows_per_block;
    size_t end = begin + rows_per_block < N ? begin + rows_per_block : N;
    for (size_t i = begin; i < end; i++) {
        const act_t* x = inp + i * C;
        const act_t* dy = dout + i * C;
        act_t* dx = dinp + i * C;
        float r = rstd[i];
        float dot = 0.0f;
        for (int c = threadIdx.x; c < C; c += blockDim.x)
            dot += bf16_to_f(dy[c]) * bf16_to_f(weight[c]) * (bf16_to_f(x[c]) * r);
        float mean = block_reduce<BLOCK_THREADS>(dot, SumOp()) / (float)C;
        for (int c = threadIdx.x; c < C; c += blockDim.x) {
            float g = bf16_to_f(dy[c]);
            float xh = bf16_to_f(x[c]) * r;
            dx[c] = f_to_bf16(bf16_to_f(dx[c]) + rmsnorm_dx(g, bf16_to_f(weight[c]), xh, r, mean));
            dw[c] += g * xh;
        }
    }
    for (int c = threadIdx.x; c < C; c += blockDim.x) dweight_partial[(size_t)blockIdx.x * C + c] = dw[c];
}

/* dweight (C) += sum over blocks of partial (blocks, C), in block order. */
__global__ void column_sum_kernel(float* dweight, const float* partial, int blocks, int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float s = 0.0f;
    for (int b = 0; b < blocks; b++) s += partial[(size_t)b * C + c];
    dweight[c] += s;
}

static DeviceScratch g_rmsnorm_scratch = {NULL, 0, "rmsnorm_backward"};

/*
 * RMSNorm backward. With xh = x * rstd: dinp (N, C) += rstd * (g - xh * mean(g * xh)), g = dout * w,
 * stored BF16; dweight (C) FP32 += sum_i dout * xh, deterministic (per-block partials, then a column sum).
 */
static inline void op_rmsnorm_backward(act_t* dinp, float* dweight, const act_t* dout, const act_t* inp,
                                       const act_t* weight, const float* rstd, size_t N, int C) {
    if (N == 0) return;
    size_t rows_per_block = ceil_div(N, N < RMSNORM_BWD_BLOCKS ? N : RMSNORM_BWD_BLOCKS);
    int blocks = (int)ceil_div(N, rows_per_block);
    float* partial = (float*)scratch_reserve(&g_rmsnorm_scratch, (size_t)blocks * C * sizeof(float));
    size_t smem = (size_t)C * sizeof(float);
    smem_opt_in(rmsnorm_backward_kernel, smem);
    LAUNCH(rmsnorm_backward_kernel, blocks, BLOCK_THREADS, smem)(dinp, partial, dout, inp, weight, rstd, N, C, rows_per_block);
    launchCheck();
    LAUNCH(column_sum_kernel, (unsigned int)ceil_div((size_t)C, BLOCK_THREADS), BLOCK_THREADS)(dweight, partial, blocks, C);
    launchCheck();
}
