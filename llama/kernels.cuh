/*
 * CUDA kernels of the model's non-GEMM ops (embedding, RMSNorm, RoPE, SwiGLU, the fused classifier),
 * the gradient-norm reduction and AdamW, each behind the op_* host function whose contract is written in
 * llama/ops_cpu.h. Storage is BF16 (act_t), math FP32; every BF16 store rounds to nearest even like the
 * CPU reference. Reductions that feed gradients or the gradient norm are deterministic: fixed grids
 * that depend only on the tensor shape, block reductions in a fixed order, no float atomics.
 */
#pragma once

#include <algorithm>
#include <vector>

#include "cuda_common.cuh"
#include "op_math.h"
#include "optim.h"

/* ---------------------------------------------------------------- weights */

__global__ void params_from_master_kernel(act_t* out, const float* master, size_t n) {
    for (size_t i = grid_index(); i < n; i += grid_stride()) out[i] = f_to_bf16(master[i]);
}

/* out (n) BF16 = master (n) FP32, rounded to nearest even. */
static inline void op_params_from_master(act_t* out, const float* master, size_t n) {
    params_from_master_kernel<<<grid_for(n, BLOCK_THREADS), BLOCK_THREADS>>>(out, master, n);
    launchCheck();
}

/* ---------------------------------------------------------------- embedding */

__global__ void encoder_forward_kernel(act_t* out, const int* tokens, const act_t* wte, size_t N, int C) {
    size_t total = N * (size_t)C;
    for (size_t i = grid_index(); i < total; i += grid_stride()) {
        size_t row = i / (size_t)C, c = i % (size_t)C;
        out[i] = wte[(size_t)tokens[row] * C + c];
    }
}

/* out (N, C) = wte[tokens] with wte (V, C); tokens (N) on the device. */
static inline void op_encoder_forward(act_t* out, const int* tokens, const act_t* wte, size_t N, int C) {
    encoder_forward_kernel<<<grid_for(N * (size_t)C, BLOCK_THREADS), BLOCK_THREADS>>>(out, tokens, wte, N, C);
    launchCheck();
}

/*
 * One block column-strip per distinct token: starts dwte's row from its current value and adds the rows
 * of dout at that token's positions in position order, the CPU reference's exact summation order.
 */
__global__ void encoder_backward_kernel(float* dwte, const act_t* dout, const int* positions, const int* starts,
                                        const int* bucket_tokens, int C) {
    int bucket = blockIdx.x;
    int c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= C) return;
    size_t dst = (size_t)bucket_tokens[bucket] * C + c;
    float acc = dwte[dst];
    for (int k = starts[bucket]; k < starts[bucket + 1]; k++) acc += bf16_to_f(dout[(size_t)positions[k] * C + c]);
    dwte[dst] = acc;
}

static DeviceScratch g_encoder_scratch;

/*
 * dwte (V, C) FP32 += scatter of dout (N, C) by token. Deterministic without atomics: the host tokens
 * (N) are bucketed by token on the host (positions sorted by (token, position)), and each distinct token
 * is summed by one block column-strip. tokens (device copy) is unused; both backends take it.
 */
static inline void op_encoder_backward(float* dwte, const act_t* dout, const int* tokens, const int* tokens_host, size_t N,
                                       int C) {
    (void)tokens;
    if (N == 0) return;
    std::vector<int> order(N);
    for (size_t i = 0; i < N; i++) order[i] = (int)i;
    std::sort(order.begin(), order.end(), [tokens_host](int a, int b) {
        return tokens_host[a] != tokens_host[b] ? tokens_host[a] < tokens_host[b] : a < b;
    });
    /* upload layout: positions (N) | bucket starts (U + 1) | bucket tokens (U), U distinct tokens <= N */
    std::vector<int> host(order);
    std::vector<int> bucket_tokens;
    for (size_t k = 0; k < N; k++) {
        if (k == 0 || tokens_host[order[k]] != tokens_host[order[k - 1]]) {
            host.push_back((int)k);
            bucket_tokens.push_back(tokens_host[order[k]]);
        }
    }
    size_t U = bucket_tokens.size();
    host.push_back((int)N);
    host.insert(host.end(), bucket_tokens.begin(), bucket_tokens.end());
    int* dev = (int*)scratch_reserve(&g_encoder_scratch, host.size() * sizeof(int));
    cudaCheck(cudaMemcpy(dev, host.data(), host.size() * sizeof(int), cudaMemcpyHostToDevice));
    dim3 grid((unsigned int)U, (unsigned int)ceil_div((size_t)C, BLOCK_THREADS));
    encoder_backward_kernel<<<grid, BLOCK_THREADS>>>(dwte, dout, dev, dev + N, dev + N + U + 1, C);
    launchCheck();
}

/* ---------------------------------------------------------------- RMSNorm */

/* Shared by the two forward kernels: normalizes row x (C) already in memory; returns rstd. */
__device__ __forceinline__ float rmsnorm_row(act_t* out, const act_t* x, const act_t* weight, int C, float eps,
                                             float sum_sq) {
    float ss = block_reduce<BLOCK_THREADS>(sum_sq, SumOp());
    float r = 1.0f / sqrtf(ss / (float)C + eps);
    for (int c = threadIdx.x; c < C; c += blockDim.x) out[c] = f_to_bf16(bf16_to_f(x[c]) * r * bf16_to_f(weight[c]));
    return r;
}

__global__ void rmsnorm_forward_kernel(act_t* out, float* rstd, const act_t* inp, const act_t* weight, int C, float eps) {
    size_t row = blockIdx.x;
    const act_t* x = inp + row * C;
    float ss = 0.0f;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float v = bf16_to_f(x[c]);
        ss += v * v;
    }
    float r = rmsnorm_row(out + row * C, x, weight, C, eps, ss);
    if (threadIdx.x == 0) rstd[row] = r;
}

/* out (N, C) = inp * rstd * weight, rstd (N) = 1 / sqrt(mean(inp^2) + eps) (HF LlamaRMSNorm). One block per row. */
static inline void op_rmsnorm_forward(act_t* out, float* rstd, const act_t* inp, const act_t* weight, size_t N, int C,
                                      float eps) {
    if (N == 0) return;
    rmsnorm_forward_kernel<<<(unsigned int)N, BLOCK_THREADS>>>(out, rstd, inp, weight, C, eps);
    launchCheck();
}

__global__ void residual_rmsnorm_forward_kernel(act_t* resid_out, act_t* norm_out, float* rstd, const act_t* resid_in,
                                                const act_t* branch, const act_t* weight, int C, float eps) {
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
    float r = rmsnorm_row(norm_out + row * C, x, weight, C, eps, ss);
    if (threadIdx.x == 0) rstd[row] = r;
}

/* resid_out (N, C) = resid_in + branch (stored BF16), then norm_out, rstd = RMSNorm(resid_out), fused. */
static inline void op_residual_rmsnorm_forward(act_t* resid_out, act_t* norm_out, float* rstd, const act_t* resid_in,
                                               const act_t* branch, const act_t* weight, size_t N, int C, float eps) {
    if (N == 0) return;
    residual_rmsnorm_forward_kernel<<<(unsigned int)N, BLOCK_THREADS>>>(resid_out, norm_out, rstd, resid_in, branch, weight,
                                                                        C, eps);
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
    extern __shared__ float dw[];
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

static DeviceScratch g_rmsnorm_scratch;

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
    rmsnorm_backward_kernel<<<blocks, BLOCK_THREADS, smem>>>(dinp, partial, dout, inp, weight, rstd, N, C, rows_per_block);
    launchCheck();
    column_sum_kernel<<<(unsigned int)ceil_div((size_t)C, BLOCK_THREADS), BLOCK_THREADS>>>(dweight, partial, blocks, C);
    launchCheck();
}

/* ---------------------------------------------------------------- RoPE */

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
    rope_kernel<<<grid_for(BT * (NH + NKV) * (HS / 2), BLOCK_THREADS), BLOCK_THREADS>>>(qkv, cos_t, sin_t, BT, T, NH + NKV,
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

/* ---------------------------------------------------------------- SwiGLU */

__global__ void swiglu_forward_kernel(act_t* out, const act_t* inp, size_t N, int F) {
    size_t total = N * (size_t)F;
    for (size_t i = grid_index(); i < total; i += grid_stride()) {
        size_t row = i / (size_t)F, j = i % (size_t)F;
        out[i] = f_to_bf16(swiglu(bf16_to_f(inp[row * 2 * F + j]), bf16_to_f(inp[row * 2 * F + F + j])));
    }
}

/* out (N, F) = silu(a) * b with inp (N, 2F) = [a | b] per row (SwiGLU, Shazeer 2020). */
static inline void op_swiglu_forward(act_t* out, const act_t* inp, size_t N, int F) {
    swiglu_forward_kernel<<<grid_for(N * (size_t)F, BLOCK_THREADS), BLOCK_THREADS>>>(out, inp, N, F);
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
    swiglu_backward_kernel<<<grid_for(N * (size_t)F, BLOCK_THREADS), BLOCK_THREADS>>>(dinp, dout, inp, N, F);
    launchCheck();
}

/* ---------------------------------------------------------------- classifier */

/* Threads per row of the classifier: a 32000-wide row gives each thread ~31 logits. */
#define CLASSIFIER_THREADS 1024

/* Running max and sum of exp(x - max) of an online softmax (Milakov & Gimelshein 2018). */
struct MaxSum {
    float max;
    float sum;
};
struct MaxSumOp {
    __device__ __forceinline__ MaxSum operator()(const MaxSum& a, const MaxSum& b) const {
        float m = fmaxf(a.max, b.max);
        if (m == -INFINITY) return MaxSum{m, 0.0f};
        return MaxSum{m, a.sum * expf(a.max - m) + b.sum * expf(b.max - m)};
    }
};

__global__ void __launch_bounds__(CLASSIFIER_THREADS) classifier_kernel(act_t* logits, float* losses, const int* targets,
                                                                        int V, float dloss) {
    size_t row = blockIdx.x;
    act_t* x = logits + row * V;
    int target = targets[row];
    /* read before the block's barrier below; the row is overwritten after it */
    float target_logit = bf16_to_f(x[target]);
    MaxSum ms = {-INFINITY, 0.0f};
    for (int v = threadIdx.x; v < V; v += blockDim.x) {
        float xv = bf16_to_f(x[v]);
        if (xv > ms.max) {
            ms.sum = ms.sum * expf(ms.max - xv) + 1.0f;
            ms.max = xv;
        } else {
            ms.sum += expf(xv - ms.max); /* a NaN logit lands here and makes the loss NaN */
        }
    }
    ms = block_reduce<CLASSIFIER_THREADS>(ms, MaxSumOp());
    float lse = ms.max + logf(ms.sum);
    if (threadIdx.x == 0) losses[row] = lse - target_logit;
    for (int v = threadIdx.x; v < V; v += blockDim.x) {
        float p = expf(bf16_to_f(x[v]) - lse);
        x[v] = f_to_bf16((p - (v == target ? 1.0f : 0.0f)) * dloss);
    }
}

/*
 * Fused softmax cross-entropy, one block per row: losses (N) = logsumexp(logits_i) - logits_i[target_i];
 * logits (N, V) is overwritten with dloss * (softmax(logits_i) - onehot(target_i)). targets (N) on the device.
 */
static inline void op_classifier(act_t* logits, float* losses, const int* targets, size_t N, int V, float dloss) {
    if (N == 0) return;
    classifier_kernel<<<(unsigned int)N, CLASSIFIER_THREADS>>>(logits, losses, targets, V, dloss);
    launchCheck();
}

/* ---------------------------------------------------------------- gradient norm and AdamW */

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
