/*
 * Causal grouped-query attention through cuDNN's fused SDPA (flash attention) kernels, behind a plain C
 * interface. The implementation (cuda/cudnn_att.cpp) is host-only C++ on the cuDNN frontend graph API,
 * compiled once by g++ into build/cudnn_att.o: the frontend headers take minutes to compile, so the CUDA
 * trainer's translation unit never includes them (DESIGN.md section 9, build targets).
 *
 * Layouts (all BF16, row-major, device pointers): qkv (B, T, QKV) with rows [q (NH*HS) | k (NKV*HS) |
 * v (NKV*HS)], QKV = (NH + 2*NKV) * HS, read in place through strides; out (B, T, NH*HS); dqkv has qkv's
 * layout. Query head h attends with kv head h / (NH / NKV) (HF repeat_kv), scale 1 / sqrt(HS), causal
 * mask; FP32 softmax and accumulation. stats (B, NH, T) FP32: the softmax log-sum-exp per query row,
 * written by the forward and read by the backward. Every call runs on the default stream and stops the
 * program with one line naming the failing cuDNN / frontend call on error.
 */
#pragma once

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Creates the cuDNN handle (once) and takes the backward algorithm from LLM8_DETERMINISTIC (1: deterministic). */
void cudnn_att_init(void);

/*
 * Selects cuDNN's deterministic SDPA backward (on != 0) or its fastest one, which accumulates dQ with
 * atomics and is not bit-reproducible (on == 0); both kinds of graphs are cached. Returns the previous choice.
 */
int cudnn_att_set_deterministic(int on);

/* "cuDNN X.Y.Z (built with X.Y.Z), frontend X.Y.Z": the library at run time, its headers at build time. */
void cudnn_att_versions(char* out, size_t len);

/* out (B, T, NH*HS), stats (B, NH, T) = causal softmax(q k^T / sqrt(HS)) v, q, k, v read from qkv. */
void cudnn_att_forward(void* out, float* stats, const void* qkv, int B, int T, int NH, int NKV, int HS);

/*
 * dqkv (B, T, QKV) = gradients of q, k, v (k and v summed over the query heads of their group) given
 * dout (B, T, NH*HS) and the forward's qkv, out and stats. Every element of dqkv is written.
 */
void cudnn_att_backward(void* dqkv, const void* dout, const void* qkv, const void* out, const float* stats, int B, int T,
                        int NH, int NKV, int HS);

#ifdef __cplusplus
}
#endif
