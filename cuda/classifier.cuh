/*
 * The fused softmax cross-entropy of the output layer on the GPU: one block per row, an online softmax
 * (Milakov & Gimelshein 2018) for the log-sum-exp, then the row overwritten with its gradient. Kernel
 * family "classifier".
 */
#pragma once

#include "../core/cuda_utils.cuh"

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
    LAUNCH(classifier_kernel, (unsigned int)N, CLASSIFIER_THREADS)(logits, losses, targets, V, dloss);
    launchCheck();
}
