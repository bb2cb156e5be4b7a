/*
 * The optimizer's kernels on the GPU: the BF16 working weights from the FP32 master weights, the
 * deterministic sum of squares behind the gradient norm, and AdamW (optim.h's adamw_update per element).
 * Kernel family "optimizer".
 */
#pragma once

#include "../core/cuda_utils.cuh"
#include "../llama/optim.h"

__global__ void params_from_master_kernel(act_t* out, const float* master, size_t n) {
    for (size_t i = grid_index(); i < n; i += grid_stride()) out[i] = f_to_bf16(master[i]);
}

/* out (n) BF16 = master (n) FP32, rounded to nearest even. */
static inline void op_params_from_master(act_t* out, const float* master, size_t n) {
    params_from_master_kernel<<<grid_for(n, BLOCK_THREADS), BLOCK_THREADS>>>(out, master, n);
    launchCheck();
}

__global__ void sum_squares_partial_kernel(double* partial, const float* x, size_t n) {
    double s = 0.0;
    for (size_t i = grid_index(); i < n; i += grid_stride()) s += (double)x[i] * x[i];
    s = block_reduce<BLOCK_THREADS>(s, SumOp());
    if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

__global__ void sum_squares_final_kernel(double* out, const double* partial, int blocks) {
    double s = 0.0;
    for (int i = threadIdx.x; i < blocks; i += blockDim.x) s += partial[i];
    s = block_reduce<BLOCK_THREADS>(s, SumOp());
    if (threadIdx.x == 0) *out = s;
}

static DeviceScratch g_sum_squares_scratch;

/*
 * Sum of x^2 over n FP32 values, in double; returns to the host (synchronizes). Deterministic: the grid
 * depends on n only, then one block adds the per-block sums.
 */
static inline double op_sum_squares(const float* x, size_t n) {
    unsigned int blocks = grid_for(n, BLOCK_THREADS);
    double* buf = (double*)scratch_reserve(&g_sum_squares_scratch, (MAX_GRID_BLOCKS + 1) * sizeof(double));
    sum_squares_partial_kernel<<<blocks, BLOCK_THREADS>>>(buf + 1, x, n);
    launchCheck();
    sum_squares_final_kernel<<<1, BLOCK_THREADS>>>(buf, buf + 1, (int)blocks);
    launchCheck();
    double total;
    cudaCheck(cudaMemcpy(&total, buf, sizeof(double), cudaMemcpyDeviceToHost));
    return total;
}

__global__ void adamw_kernel(float* master, float* m, float* v, const float* grads, size_t n, float lr, float wd, float bc1,
                             float bc2_sqrt, float grad_scale) {
    for (size_t i = grid_index(); i < n; i += grid_stride())
        adamw_update(&master[i], &m[i], &v[i], grads[i] * grad_scale, lr, wd, bc1, bc2_sqrt);
}

/*
 * AdamW (optim.h's adamw_update) on n FP32 master weights with moments m, v, gradients multiplied by
 * grad_scale; the BF16 working copy is refreshed afterwards by op_params_from_master (model.h).
 */
static inline void op_adamw(float* master, float* m, float* v, const float* grads, size_t n, float lr, float wd, float bc1,
                            float bc2_sqrt, float grad_scale) {
    adamw_kernel<<<grid_for(n, BLOCK_THREADS), BLOCK_THREADS>>>(master, m, v, grads, n, lr, wd, bc1, bc2_sqrt, grad_scale);
    launchCheck();
}
