/*
 * Token embedding on the GPU: the lookup (op_encoder_forward) and its deterministic scatter-add backward
 * (op_encoder_backward), as llama/backend.h specifies. Kernel family "encoder" of dev/cuda/kernel_cases.cuh.
 */
#pragma once

#include <algorithm>
#include <vector>

#include "../core/cuda_utils.cuh"

__global__ void encoder_forward_kernel(act_t* out, const int* tokens, const act_t* wte, size_t N, int C) {
    size_t total = N * (size_t)C;
    for (size_t i = grid_index(); i < total; i += grid_stride()) {
        size_t row = i / (size_t)C, c = i % (size_t)C;
        out[i] = wte[(size_t)tokens[row] * C + c];
    }
}

/* out (N, C) = wte[tokens] with wte (V, C); tokens (N) on the device. */
static inline void op_encoder_forward(act_t* out, const int* tokens, const act_t* wte, size_t N, int C) {
    LAUNCH(encoder_forward_kernel, grid_for(N * (size_t)C, BLOCK_THREADS), BLOCK_THREADS)(out, tokens, wte, N, C);
    launchCheck();
}

/*
 * One block column-strip per distinct token: sums the rows of dout at that token's positions in position
 * order, then adds the sum to dwte's row: the CPU reference's exact summation order.
 */
__global__ void encoder_backward_kernel(float* dwte, const act_t* dout, const int* positions, const int* starts,
                                        const int* bucket_tokens, int C) {
    int bucket = blockIdx.x;
    int c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= C) return;
    size_t dst = (size_t)bucket_tokens[bucket] * C + c;
    float acc = 0.0f;
    for (int k = starts[bucket]; k < starts[bucket + 1]; k++) acc += bf16_to_f(dout[(size_t)positions[k] * C + c]);
    dwte[dst] += acc;
}

static DeviceScratch g_encoder_scratch = {NULL, 0, "encoder_backward"};

/*
 * dwte (V, C) FP32 += scatter of dout (N, C) by token. Deterministic without atomics: the host tokens
 * (N) are bucketed by token on the host (positions sorted by (token, position)), and each distinct token
 * is summed by one block column-strip. tokens (device copy) is unused; both backends take it. The
 * bucketing is uploaded asynchronously (dev_upload_async): the host does not wait for the backward.
 */
static inline void op_encoder_backward(float* dwte, const act_t* dout, const int* tokens, const int* tokens_host, size_t N,
                                       int C) {
    (void)tokens;
    if (N == 0) return;
    /* reserved for the most distinct tokens N can hold (U <= N): a batch with more distinct tokens than the
       ones before never grows it, and growing waits for the device */
    int* dev = (int*)scratch_reserve(&g_encoder_scratch, (3 * N + 1) * sizeof(int));
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
    dev_upload_async(dev, host.data(), host.size() * sizeof(int));
    dim3 grid((unsigned int)U, (unsigned int)ceil_div((size_t)C, BLOCK_THREADS));
    LAUNCH(encoder_backward_kernel, grid, BLOCK_THREADS)(dwte, dout, dev, dev + N, dev + N + U + 1, C);
    launchCheck();
}
