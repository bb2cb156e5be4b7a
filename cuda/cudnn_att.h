/*
 * Causal grouped-query attention through cuDNN's fused SDPA (flash attention) kernels, behind a plain C
 * interface. The implementation (cuda/cudnn_att.cpp) is host-only C++ on the cuDNN frontend graph API,
 * compiled once by g++ into build/cudnn_att.o: the frontend headers take minutes to compile, so the CUDA
 * trainer's translation unit never includes them (docs/design.md#targets).
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

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* How the workspace is allocated and freed: the backend's own, counted allocations (core/cuda_utils.cuh's
   device_alloc / device_free), so that the memory report sees cuDNN's workspace as llm8's. */
typedef cudaError_t (*CudnnAttAlloc)(void** p, size_t bytes);
typedef void (*CudnnAttFree)(void* p);

/* Creates the cuDNN handle (once), keeps the workspace's allocator and takes the backward algorithm from
   LLM8_DETERMINISTIC (1: deterministic). */
void cudnn_att_init(CudnnAttAlloc alloc, CudnnAttFree free);

/* 1 when LLM8_DETERMINISTIC=1 asks for the deterministic backward (what cudnn_att_init will select). */
int cudnn_att_deterministic_env(void);

/* The backward's workspace for one shape as the cuDNN frontend decides and sizes it (see cudnn_att.cpp). */
typedef struct {
    size_t bytes;
    int dp_workspace; /* 1: the dP-workspace path (B NH T T BF16 in the engine's workspace, no FP32 dQ) */
    char what[192];   /* the path and its sizes, for the memory plan and the start-up line */
} CudnnAttWorkspace;

/*
 * The workspace cudnn_att_backward takes for (B, T, NH, NKV, HS) with the deterministic (deterministic != 0)
 * or the fastest algorithm on a GPU of compute capability major sm_major, with the cuDNN library loaded now
 * and CUDNN_FRONTEND_ATTN_DP_WORKSPACE_LIMIT as set now: needs no GPU and no handle (the memory plan).
 * Stops where the frontend would fail the graph (a malformed limit with cuDNN 8.9).
 */
CudnnAttWorkspace cudnn_att_backward_workspace(int B, int T, int NH, int NKV, int HS, int deterministic, int sm_major);

/*
 * Selects cuDNN's deterministic SDPA backward (on != 0) or its fastest one, which accumulates dQ with
 * atomics and is not bit-reproducible (on == 0); both kinds of graphs are cached. Returns the previous choice.
 */
int cudnn_att_set_deterministic(int on);

/* One shape a run's attention takes: (B, T), and whether its backward runs too (training) or only its
   forward (validation, evaluations, samples). */
typedef struct {
    int B, T, backward;
} CudnnAttShape;

/*
 * Builds the graphs of every shape a run uses (with the backward algorithm selected now) and sizes the one
 * workspace for the largest, so that no step allocates, frees or synchronizes; afterwards a shape not
 * prepared stops the run naming it. Called once at start-up, after cudnn_att_init.
 */
void cudnn_att_prepare(const CudnnAttShape* shapes, int n, int NH, int NKV, int HS);

/* Makes the workspace at least `bytes`: the memory plan's cudnn_attention entry, so that a run holds what
   its plan counts (more only where cuDNN asks for more, which the graph's start-up line warns of). Start-up
   only, like cudnn_att_prepare. */
void cudnn_att_reserve(size_t bytes);

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
