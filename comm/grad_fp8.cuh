/*
 * The GPU's kernels of the FP8 gradient wire (comm/grad_fp8.h, which defines the format and its error):
 * grad_fp8_pack_cuda quantizes pieces into blocks (one thread block per ZERO_CHUNK chunk: amax by block
 * reduction, then the codes and the chunk's scale_inv), grad_fp8_sum_cuda dequantizes W blocks and sums
 * them in rank order in FP32. Both call grad_fp8.h's per-element functions (fp8.h's cast and decode), so
 * the bytes and the sums are those of the CPU build's grad_fp8_pack / grad_fp8_sum, bit for bit; the
 * amax is a max, exact in any order. Used by comm/comm_nccl.cuh and checked against the CPU functions by
 * dev/cuda/kernel_cases.cuh (family grad_fp8).
 */
#pragma once

#include "grad_fp8.h"
#include "../core/cuda_utils.cuh"

/* amax_combine for block_reduce: NaN wins, so a NaN anywhere in a chunk makes its amax NaN. */
struct AmaxCombineOp {
    __device__ __forceinline__ float operator()(const float& a, const float& b) const { return amax_combine(a, b); }
};

/* pieces pieces of n elements each, piece p at x + p * n, into blocks of grad_fp8_block_bytes(n) at
   blocks + p * grad_fp8_block_stride(n); one thread block of BLOCK_THREADS (block_reduce's size) per
   chunk, grid-stride over the pieces * chunks. */
__global__ void __launch_bounds__(BLOCK_THREADS) grad_fp8_pack_kernel(uint8_t* blocks, const float* x, size_t n, size_t pieces) {
    size_t chunks = zero_chunks(n), bytes = grad_fp8_block_stride(n);
    for (size_t b = blockIdx.x; b < pieces * chunks; b += gridDim.x) {
        size_t p = b / chunks, c = b % chunks;
        const float* xp = x + p * n;
        uint8_t* block = blocks + p * bytes;
        size_t begin = c * ZERO_CHUNK, end = begin + ZERO_CHUNK < n ? begin + ZERO_CHUNK : n;
        float amax = 0.0f;
        for (size_t i = begin + threadIdx.x; i < end; i += blockDim.x) amax = amax_combine(amax, fabsf(xp[i]));
        amax = block_reduce<BLOCK_THREADS>(amax, AmaxCombineOp());
        float scale = grad_fp8_scale(amax);
        for (size_t i = begin + threadIdx.x; i < end; i += blockDim.x) block[i] = fp8_quantize(xp[i], scale, GRAD_FP8_FORMAT);
        if (threadIdx.x == 0) grad_fp8_block_set_scale_inv(block, n, c, grad_fp8_scale_inv(amax, scale));
    }
}

/* out (n) = [out +] sum over r < W of blocks[r] dequantized, in rank order (grad_fp8_sum). */
__global__ void grad_fp8_sum_kernel(float* out, const uint8_t* blocks, int W, size_t n, int accumulate) {
    size_t bytes = grad_fp8_block_stride(n);
    for (size_t i = grid_index(); i < n; i += grid_stride()) {
        float v = grad_fp8_block_value(blocks, n, i);
        float acc = accumulate ? out[i] + v : v;
        for (int r = 1; r < W; r++) acc += grad_fp8_block_value(blocks + (size_t)r * bytes, n, i);
        out[i] = acc;
    }
}

/* blocks (pieces blocks grad_fp8_block_stride(n) bytes apart, device) = the pieces of x (pieces * n FP32,
   device), on `stream`; the padding after each block is not written. */
static inline void grad_fp8_pack_cuda(uint8_t* blocks, const float* x, size_t n, size_t pieces, cudaStream_t stream) {
    size_t work = pieces * zero_chunks(n);
    if (work == 0) return;
    unsigned int grid = (unsigned int)(work < MAX_GRID_BLOCKS ? work : MAX_GRID_BLOCKS);
    LAUNCH(grad_fp8_pack_kernel, grid, BLOCK_THREADS, 0, stream)(blocks, x, n, pieces);
    launchCheck();
}

/* out (n FP32, device) = [out +] the W blocks (device, grad_fp8_block_stride(n) bytes apart) dequantized and
   summed in rank order, on `stream`. */
static inline void grad_fp8_sum_cuda(float* out, const uint8_t* blocks, int W, size_t n, int accumulate, cudaStream_t stream) {
    if (n == 0) return;
    LAUNCH(grad_fp8_sum_kernel, grid_for(n, BLOCK_THREADS), BLOCK_THREADS, 0, stream)(out, blocks, W, n, accumulate);
    launchCheck();
}
