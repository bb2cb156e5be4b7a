/*
 * The FP8 wire format of gradient reductions (--grad-reduce fp8; issue 19, after FP8-LM / MS-AMP "FP8
 * gradient communication"), shared by the host code of both builds (comm/comm_mpi.h packs and sums with
 * these functions; comm/grad_fp8.cuh's kernels call the same per-element functions, so the GPU's bytes
 * and sums are the CPU's bit for bit).
 *
 * A piece of n FP32 gradient elements travels as one block: n E4M3 code bytes, then one FP32 scale_inv
 * per ZERO_CHUNK-element chunk (4 * ceil(n / ZERO_CHUNK) bytes; the last chunk may be short); the W blocks
 * of a reduction, one per peer, start GRAD_FP8_BLOCK_ALIGN-byte aligned. Each chunk has its own
 * power-of-two scale 2^floor(log2(448 / amax)) from its own amax (amax 0: scale 1), and its
 * codes are fp8.h's cast (the forward cast's rounding and saturation). A chunk holding a NaN or an Inf
 * gets scale_inv NaN, so every element the receiver sums from it is NaN and the non-finite gradient
 * norm skips the step on every rank, as a non-finite FP32 gradient does.
 *
 * Why this format. FP8-LM (Peng et al. 2023, "FP8-LM: Training FP8 Large Language Models", sec. 2.2)
 * reduces FP8 gradients with "automatic scaling", a scale shared by the ranks, because its sum is taken
 * in FP8 and must not overflow. Here the receiver dequantizes and sums in FP32 (NCCL has no FP8 sum
 * anyway: ColossalAI#5926), so the sum cannot overflow and no scale has to be shared: a per-chunk amax
 * scale, the alternative the paper discusses, gives each chunk the whole E4M3 range, whatever the
 * dynamic range across a layer. E4M3 rather than E5M2: per-chunk scaling removes the need for E5M2's
 * range, and E4M3 has one more mantissa bit. The scale is a power of two so that x * scale and
 * code * scale_inv are exact in FP32 (an FMA contraction of the sum then changes nothing either).
 *
 * Error. With s a chunk's scale and y = x * s (exact, |y| <= 448 since amax * s <= 448, so nothing
 * saturates), the E4M3 rounding of y is off by at most half a step: 2^-4 |y| where y is normal (3
 * mantissa bits, step 2^(e-3) in [2^e, 2^(e+1))), 2^-10 where y is below the smallest normal 2^-6 (the
 * subnormal step is the smallest subnormal 2^-9). So per element
 *     |dequant(q(x)) - x| <= 2^-4 |x| + 2^-10 / s,
 * and a sum over W ranks is off the exact sum by at most the sum over r of that bound for x_r plus
 * the FP32 rounding of the W (W - 1 without accumulation) additions, each <= 2^-24 of its partial sum.
 */
#pragma once

#include "zero.h"
#include "../fp8/fp8.h"

/* The code format on the wire. */
#define GRAD_FP8_FORMAT FP8_E4M3

/* Bytes of a piece's block: n codes, then one FP32 scale_inv per chunk. */
LLM8_HD static inline size_t grad_fp8_block_bytes(size_t n) { return n + sizeof(float) * zero_chunks(n); }

/* Where a reduction's W blocks start, one per peer: every grad_fp8_block_stride(n) bytes, each block padded
   to 256 bytes, cudaMalloc's alignment, so that every peer's block is as aligned for NCCL's copies and the
   kernels' loads as the first. */
#define GRAD_FP8_BLOCK_ALIGN 256
LLM8_HD static inline size_t grad_fp8_block_stride(size_t n) {
    return (grad_fp8_block_bytes(n) + GRAD_FP8_BLOCK_ALIGN - 1) / GRAD_FP8_BLOCK_ALIGN * GRAD_FP8_BLOCK_ALIGN;
}

/* A chunk's scale from its amax (amax_combine of |x|: NaN when any element is NaN): 2^floor(log2(448 /
   amax)), 1 for amax 0 or non-finite. */
LLM8_HD static inline float grad_fp8_scale(float amax) { return fp8_compute_scale(amax, GRAD_FP8_FORMAT, 1); }

/* The scale_inv a chunk travels with: 1 / scale, NaN when the chunk holds a NaN or Inf. */
LLM8_HD static inline float grad_fp8_scale_inv(float amax, float scale) {
    return fp8_amax_is_finite(amax) ? 1.0f / scale : NAN;
}

/* Elements of each of the W pieces an FP8 all-reduce of n elements cuts (whole chunks, zero-padded). */
static inline size_t comm_fp8_piece(size_t n, int W) { return ceil_div(zero_chunks(n), (size_t)W) * ZERO_CHUNK; }

/* The scale_inv of chunk c in a block of n elements (memcpy: the block's tail need not be aligned). */
LLM8_HD static inline float grad_fp8_block_scale_inv(const uint8_t* block, size_t n, size_t c) {
    float v;
    memcpy(&v, block + n + c * sizeof(float), sizeof(v));
    return v;
}

/* Stores v as the scale_inv of chunk c in a block of n elements (memcpy, as grad_fp8_block_scale_inv). */
LLM8_HD static inline void grad_fp8_block_set_scale_inv(uint8_t* block, size_t n, size_t c, float v) {
    memcpy(block + n + c * sizeof(float), &v, sizeof(v));
}

/* Element i of a block of n elements, dequantized: E4M3 value * scale_inv (exact). */
LLM8_HD static inline float grad_fp8_block_value(const uint8_t* block, size_t n, size_t i) {
    return fp8_to_float(block[i], GRAD_FP8_FORMAT) * grad_fp8_block_scale_inv(block, n, i / ZERO_CHUNK);
}

/* block (grad_fp8_block_bytes(n)) = x (n FP32) quantized chunk by chunk (see the banner). */
static inline void grad_fp8_pack(uint8_t* block, const float* x, size_t n) {
    size_t chunks = zero_chunks(n);
#pragma omp parallel for schedule(static)
    for (size_t c = 0; c < chunks; c++) {
        size_t begin = c * ZERO_CHUNK, end = begin + ZERO_CHUNK < n ? begin + ZERO_CHUNK : n;
        float amax = 0.0f;
        for (size_t i = begin; i < end; i++) amax = amax_combine(amax, fabsf(x[i]));
        float scale = grad_fp8_scale(amax);
        for (size_t i = begin; i < end; i++) block[i] = fp8_quantize(x[i], scale, GRAD_FP8_FORMAT);
        grad_fp8_block_set_scale_inv(block, n, c, grad_fp8_scale_inv(amax, scale));
    }
}

/*
 * out (n FP32) = sum over r of blocks[r] dequantized, in rank order, in FP32: out = ((out + v_0) + v_1)
 * + ... when accumulate, else (v_0 + v_1) + ...; blocks: W blocks of n elements, grad_fp8_block_stride(n)
 * bytes apart.
 */
static inline void grad_fp8_sum(float* out, const uint8_t* blocks, int W, size_t n, int accumulate) {
    size_t bytes = grad_fp8_block_stride(n);
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        float v = grad_fp8_block_value(blocks, n, i);
        float acc = accumulate ? out[i] + v : v;
        for (int r = 1; r < W; r++) acc += grad_fp8_block_value(blocks + (size_t)r * bytes, n, i);
        out[i] = acc;
    }
}
