/*
 * The optimizer's kernels on the GPU: the BF16 working weights from the FP32 master weights, the
 * deterministic per-chunk sums of squares and their sum behind the gradient norm, the in-order sum of a
 * micro-batch's losses (op_sum_f32_in_order), AdamW (optim.h's adamw_update per element), and the stored
 * arrays' (re)quantizing add and decode (--grad-buffer, --master-weights; optim.h store_load / store_put).
 * Kernel family "optimizer".
 */
#pragma once

#include "../core/cuda_utils.cuh"
#include "../comm/grad_fp8.cuh"
#include "../llama/optim.h"

__global__ void params_from_master_kernel(act_t* out, const float* master, size_t n) {
    for (size_t i = grid_index(); i < n; i += grid_stride()) out[i] = f_to_bf16(master[i]);
}

/* out (n) BF16 = master (n) FP32, rounded to nearest even. */
static inline void op_params_from_master(act_t* out, const float* master, size_t n) {
    LAUNCH(params_from_master_kernel, grid_for(n, BLOCK_THREADS), BLOCK_THREADS)(out, master, n);
    launchCheck();
}

/* One block per chunk: its sum of squares in double, reduced in a fixed order (CUB block reduce). */
__global__ void sum_squares_chunks_kernel(double* partials, const float* x, size_t n, size_t chunk) {
    size_t begin = (size_t)blockIdx.x * chunk, end = begin + chunk < n ? begin + chunk : n;
    double s = 0.0;
    for (size_t i = begin + threadIdx.x; i < end; i += blockDim.x) s += (double)x[i] * x[i];
    s = block_reduce<BLOCK_THREADS>(s, SumOp());
    if (threadIdx.x == 0) partials[blockIdx.x] = s;
}

/* partials (ceil(n / chunk)) = sums of squares of x's chunks; the grid depends on n and chunk only. */
static inline void op_sum_squares_chunks(double* partials, const float* x, size_t n, size_t chunk) {
    size_t chunks = ceil_div(n, chunk);
    if (chunks == 0) return;
    if (chunks > INT32_MAX) die("op_sum_squares_chunks: %zu chunks exceed one grid", chunks);
    LAUNCH(sum_squares_chunks_kernel, (unsigned int)chunks, BLOCK_THREADS)(partials, x, n, chunk);
    launchCheck();
}

/* Doubles summed per block of F64_SUM_BLOCK elements; repeated until one value is left. */
#define F64_SUM_BLOCK 4096

__global__ void sum_f64_kernel(double* out, const double* x, size_t n) {
    size_t begin = (size_t)blockIdx.x * F64_SUM_BLOCK, end = begin + F64_SUM_BLOCK < n ? begin + F64_SUM_BLOCK : n;
    double s = 0.0;
    for (size_t i = begin + threadIdx.x; i < end; i += blockDim.x) s += x[i];
    s = block_reduce<BLOCK_THREADS>(s, SumOp());
    if (threadIdx.x == 0) out[blockIdx.x] = s;
}

static DeviceScratch g_sum_f64_scratch = {NULL, 0, "grad_norm_sum"};

/*
 * Sum of x (n) doubles, returned to the host (synchronizes). Deterministic for a given n: levels of
 * fixed blocks of F64_SUM_BLOCK elements, each reduced in a fixed order, until one value is left.
 */
static inline double op_sum_f64(const double* x, size_t n) {
    if (n == 0) return 0.0;
    size_t level = ceil_div(n, F64_SUM_BLOCK);
    double* buf = (double*)scratch_reserve(&g_sum_f64_scratch, 2 * level * sizeof(double));
    double* out = buf;
    LAUNCH(sum_f64_kernel, (unsigned int)level, BLOCK_THREADS)(out, x, n);
    launchCheck();
    while (level > 1) {
        double* next = out == buf ? buf + level : buf;
        size_t blocks = ceil_div(level, F64_SUM_BLOCK);
        LAUNCH(sum_f64_kernel, (unsigned int)blocks, BLOCK_THREADS)(next, out, level);
        launchCheck();
        out = next;
        level = blocks;
    }
    double total;
    cudaCheck(cudaMemcpy(&total, out, sizeof(double), cudaMemcpyDeviceToHost));
    return total;
}

/* One thread: the host loop's order, so the bits are the host sum's. */
__global__ void sum_f32_in_order_kernel(double* sum, const float* x, size_t n) {
    double total = 0.0;
    for (size_t i = 0; i < n; i++) total += (double)x[i];
    *sum = total;
}

/* *sum (device) = sum of x (n) FP32 as FP64 in index order, asynchronously; n is a micro-batch's tokens
   (a few thousand), so one thread is enough. */
static inline void op_sum_f32_in_order(double* sum, const float* x, size_t n) {
    LAUNCH(sum_f32_in_order_kernel, 1, 1)(sum, x, n);
    launchCheck();
}

/* The moments' pointers are parameters of their own, not fields of an AdamwMoments argument, so that tools
   that follow a kernel's pointer parameters (the emulator's race mode) see every buffer it writes. */

/* AdamW on the moments of fp32 and bf16, which have no scales: one element per thread. */
__global__ void adamw_kernel(float* master, void* m, void* v, OptimState format, const float* grads, size_t n, float lr, float wd,
                             float bc1, float bc2_sqrt, float grad_scale) {
    AdamwMoments s = {format, m, v, NULL};
    for (size_t i = grid_index(); i < n; i += grid_stride()) {
        float mt = adamw_moment_load(&s, 0, i, 1.0f), vt = adamw_moment_load(&s, 1, i, 1.0f);
        adamw_update(&master[i], &mt, &vt, grads[i] * grad_scale, lr, wd, bc1, bc2_sqrt);
        adamw_moment_store(&s, 0, i, mt, 1.0f);
        adamw_moment_store(&s, 1, i, vt, 1.0f);
    }
}

/* Elements of an fp8 chunk each thread of adamw_chunk_kernel holds in registers between the amax and the store. */
#define ADAMW_PER_THREAD ((int)(ADAMW_CHUNK / BLOCK_THREADS))

/* AdamW on fp8 moments: one block per ADAMW_CHUNK-element chunk, which decodes, updates, reduces the new
   values' amax, then encodes with the chunk's new scales (as cpu/backend.h's loop). */
__global__ void __launch_bounds__(BLOCK_THREADS) adamw_chunk_kernel(float* master, void* m, void* v, float* scale_inv,
                                                                     const float* grads, size_t n, float lr, float wd, float bc1,
                                                                     float bc2_sqrt, float grad_scale) {
    AdamwMoments s = {OPTIM_STATE_FP8, m, v, scale_inv};
    size_t k = blockIdx.x, begin = k * ADAMW_CHUNK;
    float sinv_m = s.scale_inv[2 * k], sinv_v = s.scale_inv[2 * k + 1];
    float mt[ADAMW_PER_THREAD], vt[ADAMW_PER_THREAD];
    float amax_m = 0.0f, amax_v = 0.0f;
#pragma unroll
    for (int j = 0; j < ADAMW_PER_THREAD; j++) {
        size_t i = begin + (size_t)j * BLOCK_THREADS + threadIdx.x;
        mt[j] = vt[j] = 0.0f;
        if (i >= n) continue;
        mt[j] = adamw_moment_load(&s, 0, i, sinv_m);
        vt[j] = adamw_moment_load(&s, 1, i, sinv_v);
        adamw_update(&master[i], &mt[j], &vt[j], grads[i] * grad_scale, lr, wd, bc1, bc2_sqrt);
        amax_m = fmaxf(amax_m, fabsf(mt[j]));
        amax_v = fmaxf(amax_v, fabsf(vt[j]));
    }
    amax_m = block_reduce<BLOCK_THREADS>(amax_m, MaxOp());
    amax_v = block_reduce<BLOCK_THREADS>(amax_v, MaxOp());
    float scale_m = adamw_moment_scale(0, amax_m), scale_v = adamw_moment_scale(1, amax_v);
#pragma unroll
    for (int j = 0; j < ADAMW_PER_THREAD; j++) {
        size_t i = begin + (size_t)j * BLOCK_THREADS + threadIdx.x;
        if (i >= n) continue;
        adamw_moment_store(&s, 0, i, mt[j], scale_m);
        adamw_moment_store(&s, 1, i, vt[j], scale_v);
    }
    if (threadIdx.x == 0) {
        s.scale_inv[2 * k] = 1.0f / scale_m;
        s.scale_inv[2 * k + 1] = 1.0f / scale_v;
    }
}

/*
 * AdamW (optim.h's adamw_update) on n FP32 master weights with moments s (optim.h's formats), gradients
 * multiplied by grad_scale; the BF16 working copy is refreshed afterwards by op_params_from_master (model/model.h).
 */
static inline void op_adamw(float* master, AdamwMoments s, const float* grads, size_t n, float lr, float wd, float bc1,
                            float bc2_sqrt, float grad_scale) {
    static_assert(ADAMW_CHUNK % BLOCK_THREADS == 0, "an fp8 chunk is whole threads' work");
    if (s.format == OPTIM_STATE_FP8)
        LAUNCH(adamw_chunk_kernel, (unsigned int)ceil_div(n, ADAMW_CHUNK), BLOCK_THREADS)(master, s.m, s.v, s.scale_inv, grads, n, lr,
                                                                                        wd, bc1, bc2_sqrt, grad_scale);
    else LAUNCH(adamw_kernel, grid_for(n, BLOCK_THREADS), BLOCK_THREADS)(master, s.m, s.v, s.format, grads, n, lr, wd, bc1,
                                                                        bc2_sqrt, grad_scale);
    launchCheck();
}

/* A stored array without scales (fp32, bf16): one element per thread. */
__global__ void store_add_kernel(void* dst, StoreCodec c, const float* x, size_t n, int accumulate) {
    for (size_t i = grid_index(); i < n; i += grid_stride())
        store_put(c, dst, i, accumulate ? store_load(c, dst, i, 1.0f) + x[i] : x[i], 1.0f);
}

/* Elements of a chunk each thread of store_add_chunk_kernel holds between the amax and the store. */
#define STORE_PER_THREAD ((int)(ZERO_CHUNK / BLOCK_THREADS))

/* A scaled stored array (E4M3, FP16): one block per ZERO_CHUNK-element chunk, which decodes and adds,
   reduces the sums' amax (NaN wins), then encodes with the chunk's new scale (as cpu/backend.h's loop). */
__global__ void __launch_bounds__(BLOCK_THREADS) store_add_chunk_kernel(void* dst, StoreCodec c, float* scale_inv, const float* x,
                                                                         size_t n, int accumulate) {
    size_t k = blockIdx.x, begin = k * ZERO_CHUNK;
    float sinv = scale_inv[k], sum[STORE_PER_THREAD], amax = 0.0f;
#pragma unroll
    for (int j = 0; j < STORE_PER_THREAD; j++) {
        size_t i = begin + (size_t)j * BLOCK_THREADS + threadIdx.x;
        sum[j] = 0.0f;
        if (i >= n) continue;
        sum[j] = accumulate ? store_load(c, dst, i, sinv) + x[i] : x[i];
        amax = amax_combine(amax, fabsf(sum[j]));
    }
    amax = block_reduce<BLOCK_THREADS>(amax, AmaxCombineOp());
    float scale = store_scale(c, amax);
#pragma unroll
    for (int j = 0; j < STORE_PER_THREAD; j++) {
        size_t i = begin + (size_t)j * BLOCK_THREADS + threadIdx.x;
        if (i < n) store_put(c, dst, i, sum[j], scale);
    }
    if (threadIdx.x == 0) scale_inv[k] = grad_fp8_scale_inv(amax, scale);
}

static inline void op_store_add(StoreCodec c, void* dst, float* scale_inv, const float* x, size_t n, int accumulate) {
    static_assert(ZERO_CHUNK % BLOCK_THREADS == 0, "a chunk is whole threads' work");
    if (n == 0) return;
    if (store_is_scaled(c))
        LAUNCH(store_add_chunk_kernel, (unsigned int)zero_chunks(n), BLOCK_THREADS)(dst, c, scale_inv, x, n, accumulate);
    else LAUNCH(store_add_kernel, grid_for(n, BLOCK_THREADS), BLOCK_THREADS)(dst, c, x, n, accumulate);
    launchCheck();
}

/* Decodes a stored array element by element (grid-stride), each with its chunk's scale_inv when scaled. */
__global__ void store_load_kernel(float* out, const void* src, StoreCodec c, const float* scale_inv, size_t n, int accumulate) {
    int scaled = store_is_scaled(c);
    for (size_t i = grid_index(); i < n; i += grid_stride()) {
        float v = store_load(c, src, i, scaled ? scale_inv[i / ZERO_CHUNK] : 1.0f);
        out[i] = accumulate ? out[i] + v : v;
    }
}

static inline void op_store_load(StoreCodec c, float* out, const void* src, const float* scale_inv, size_t n, int accumulate) {
    if (n == 0) return;
    LAUNCH(store_load_kernel, grid_for(n, BLOCK_THREADS), BLOCK_THREADS)(out, src, c, scale_inv, n, accumulate);
    launchCheck();
}

/* Loads the update's kernels without running them (cudaFuncGetAttributes loads a kernel under CUDA's lazy
   loading): the trainer's warm-up cannot run an update, which would change the training state. */
static inline void optimizer_load_kernels(void) {
    const void* kernels[] = {(const void*)adamw_kernel, (const void*)adamw_chunk_kernel, (const void*)store_add_kernel,
                             (const void*)store_add_chunk_kernel, (const void*)store_load_kernel};
    cudaFuncAttributes attr;
    for (size_t i = 0; i < sizeof(kernels) / sizeof(kernels[0]); i++) cudaCheck(cudaFuncGetAttributes(&attr, kernels[i]));
}
