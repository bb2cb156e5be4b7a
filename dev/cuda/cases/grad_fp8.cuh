/*
 * Family grad_fp8 (comm/grad_fp8.cuh): the FP8 gradient wire's pack and sum kernels.
 */
#pragma once

#include "common.cuh"

/*
 * Tolerance: none. The pack kernel's amax is a max (order-free) and its scale, codes and scale_inv are
 * grad_fp8.h's functions; the sum kernel adds the same dequantized values in the same rank order: blocks
 * and sums must be bit-identical to grad_fp8_pack / grad_fp8_sum (the CPU build's wire). Inputs: W = 3
 * pieces of a ragged size (each piece's last chunk short), chunk magnitudes 2^U(-40, 40) with a factor
 * 2^U(-12, 0) per element, one chunk of zeros, a NaN in piece 1's chunk 0 and an Inf in piece 2's chunk
 * 1: exactly those two chunks of the sums are NaN. The sums run on the CPU's blocks, with and without
 * accumulation into a random recv. The blocks lie grad_fp8_block_stride apart (256-byte aligned): the pack
 * must leave the padding after each block as it found it (0xFF here).
 */
static int kc_case_grad_fp8(const KernelShape* s, int iters, uint64_t seed) {
    uint64_t stream = seed;
    const int W = 3;
    size_t n = (size_t)s->C * s->F / 4 + 123;
    if (n < 2 * ZERO_CHUNK) n = 2 * ZERO_CHUNK + 123;
    size_t total = (size_t)W * n, bytes = grad_fp8_block_bytes(n), stride = grad_fp8_block_stride(n), all = (size_t)W * stride;
    KcSet set = {};
    KcBuf* x = kc_buf(&set, total, KC_F32);
    kc_fill_chunk_scaled(x->h, total, splitmix64(&stream));
    for (size_t i = ZERO_CHUNK; i < 2 * ZERO_CHUNK; i++) x->h[i] = 0.0f;
    x->h[n + 17] = NAN;
    x->h[2 * n + ZERO_CHUNK + 5] = -INFINITY;
    kc_upload(x);
    uint8_t* ref = (uint8_t*)mallocCheck(all);
    memset(ref, 0xFF, all);
    for (int p = 0; p < W; p++) grad_fp8_pack(ref + (size_t)p * stride, x->h + (size_t)p * n, n);

    uint8_t* d_blocks = (uint8_t*)dev_alloc(all);
    kc_poison(d_blocks, all);
    grad_fp8_pack_cuda(d_blocks, x->f, n, (size_t)W, 0);
    uint8_t* got = (uint8_t*)mallocCheck(all);
    dev_download(got, d_blocks, all);
    size_t first = 0, bad = kc_count_diff(got, ref, all, &first);
    int failed = bad != 0 || stride % GRAD_FP8_BLOCK_ALIGN != 0;
    printf("    grad_fp8_pack: %d pieces of %zu, %zu bytes each, %zu apart: %zu differ, tol bit-identical%s\n", W, n, bytes, stride,
           bad, failed ? "  FAIL" : "");
    if (bad) printf("      FAIL: first byte at %zu (piece %zu, %s): gpu 0x%02x, cpu 0x%02x\n", first, first / stride,
                    first % stride < n ? "code" : first % stride < bytes ? "scale_inv" : "padding", got[first], ref[first]);

    KcBuf* recv = kc_input(&set, n, splitmix64(&stream), 0.0f, 1.0f, KC_HOST);
    uint8_t* d_ref = (uint8_t*)kc_dev_bytes(ref, all);
    KcBuf* out = kc_buf(&set, n, KC_F32);
    for (int acc = 0; acc <= 1; acc++) {
        memcpy(out->h, recv->h, n * sizeof(float));
        if (acc) kc_upload(out);
        else kc_poison(out->f, n * sizeof(float));
        grad_fp8_sum(out->h, ref, W, n, acc);
        grad_fp8_sum_cuda(out->f, d_ref, W, n, acc, 0);
        failed += kc_check_bits(acc ? "grad_fp8_sum (accumulate)" : "grad_fp8_sum", out, 2 * ZERO_CHUNK);
    }
    kc_time("grad_fp8_pack", iters, 4.0 * total + (double)W * bytes, 0.0,
            [&] { grad_fp8_pack_cuda(d_blocks, x->f, n, (size_t)W, 0); });
    kc_time("grad_fp8_sum", iters, (double)W * bytes + 8.0 * n, 0.0, [&] { grad_fp8_sum_cuda(out->f, d_ref, W, n, 1, 0); });
    kc_set_free(&set);
    free(ref);
    free(got);
    dev_free(d_blocks);
    dev_free(d_ref);
    return failed;
}
