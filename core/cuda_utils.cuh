/*
 * Device-side helpers shared by every CUDA file of the project (the FP8 kernels in fp8/, the backend's
 * kernels in cuda/): launch geometry of grid-stride loops, BF16 <-> FP32 conversions with the rounding
 * the CPU reference emulates, deterministic block reductions (CUB), llm8's own device allocations
 * (counted), op scratch sized at start-up, and the shared-memory opt-in. Knows nothing of the model: no
 * activation type, no ops. Everything runs on the legacy default stream, so ops are ordered with each
 * other and with the synchronous cudaMemcpy uploads and downloads without explicit events.
 */
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cub/block/block_reduce.cuh>
#include <unordered_map>

#include "buffers.h"
#include "common.h"
#include "cuda_check.h"

/*
 * The two spellings that let the emulated GPU (emu/, docs/emulated-gpu.md) build this source with
 * g++: LAUNCH(kernel, grid, block[, smem[, stream]])(args...) is kernel<<<grid, block, smem, stream>>>(args...),
 * and DYNAMIC_SHARED(T, name) declares the launch's dynamic shared memory as T name[]. emu/cuda_runtime.h
 * defines both for itself.
 */
#ifndef LLM8_EMU
#define LAUNCH(kernel, ...) kernel<<<__VA_ARGS__>>>
#define DYNAMIC_SHARED(T, name) extern __shared__ T name[]
#endif

#define WARP_SIZE 32
/* Threads per block of the row-wise and elementwise kernels. */
#define BLOCK_THREADS 256
/* Upper bound on the blocks of grid-stride kernels: enough to fill an H100 (132 SMs) several times. */
#define MAX_GRID_BLOCKS 1024

/* Blocks for a one-thread-per-element kernel over n elements, capped for grid-stride loops. */
static inline unsigned int grid_for(size_t n, unsigned int threads) {
    size_t blocks = ceil_div(n > 0 ? n : 1, threads);
    return (unsigned int)(blocks < MAX_GRID_BLOCKS ? blocks : MAX_GRID_BLOCKS);
}

__device__ __forceinline__ float bf16_to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
/* Round-to-nearest-even, as the CPU reference's bf16_round (fp8/fp8.h). */
__device__ __forceinline__ __nv_bfloat16 f_to_bf16(float x) { return __float2bfloat16_rn(x); }

/* Global thread index and stride of a 1-D grid-stride loop, in size_t (tensors exceed 2^31 elements). */
__device__ __forceinline__ size_t grid_index(void) { return (size_t)blockIdx.x * blockDim.x + threadIdx.x; }
__device__ __forceinline__ size_t grid_stride(void) { return (size_t)gridDim.x * blockDim.x; }

/*
 * Every cudaMalloc of llm8's own code (dev_alloc, the scratch below, the cuBLASLt workspace) goes through
 * device_alloc, which keeps the live bytes: the memory report after step 1 compares them with the plan
 * and with cudaMemGetInfo, whose remainder is the CUDA context's and the libraries' (docs/memory.md).
 */
static std::unordered_map<void*, size_t> g_device_allocs;
static size_t g_device_bytes = 0;

static inline cudaError_t device_alloc(void** p, size_t bytes) {
    cudaError_t err = cudaMalloc(p, bytes);
    if (err == cudaSuccess) {
        g_device_allocs[*p] = bytes;
        g_device_bytes += bytes;
    }
    return err;
}
static inline void device_free(void* p) {
    if (p == NULL) return;
    auto it = g_device_allocs.find(p);
    if (it != g_device_allocs.end()) {
        g_device_bytes -= it->second;
        g_device_allocs.erase(it);
    }
    cudaCheck(cudaFree(p));
}

/*
 * Scratch is sized once at start-up from the memory plan's entry (scratch_size, called by the trainer's
 * backend_reserve_workspaces); the trainer then fixes every scratch (g_scratch_fixed), so that a step
 * never reallocates: a cudaFree and cudaMalloc mid-step would wait for every stream, the communication
 * stream included. A fixed scratch asked for more stops the run naming it (its plan entry undercounts).
 * Programs that never fix them (test_llama) let a scratch grow.
 */
static int g_scratch_fixed = 0;

/* Makes s exactly `bytes` long (contents lost); waits for pending work that may still read the old buffer. */
static inline void scratch_size(DeviceScratch* s, size_t bytes) {
    if (s->bytes == bytes && (s->ptr != NULL || bytes == 0)) return;
    if (s->ptr) {
        cudaCheck(cudaDeviceSynchronize());
        device_free(s->ptr);
        s->ptr = NULL;
    }
    if (bytes > 0) cudaCheck(device_alloc(&s->ptr, bytes));
    s->bytes = bytes;
}

/* At least `bytes` of s: grows it (scratch_size) unless scratch is fixed, where it stops the run. */
static inline void* scratch_reserve(DeviceScratch* s, size_t bytes) {
    if (s->bytes < bytes) {
        if (g_scratch_fixed)
            die("%s scratch: %zu bytes needed, %zu sized at start-up: its memory plan entry undercounts it", s->name, bytes, s->bytes);
        scratch_size(s, bytes);
    }
    return s->ptr;
}

/* Reduction operators for block_reduce (CCCL 3 dropped cub::Sum / cub::Max). */
struct SumOp {
    template <typename T>
    __device__ __forceinline__ T operator()(const T& a, const T& b) const { return a + b; }
};
struct MaxOp {
    template <typename T>
    __device__ __forceinline__ T operator()(const T& a, const T& b) const { return a > b ? a : b; }
};

/*
 * Reduces v over a 1-D block of THREADS threads with cub::BlockReduce and returns the result to every
 * thread. Deterministic: the combination order depends only on THREADS. Calls within one kernel share
 * the shared storage, hence the barrier before returning.
 */
template <int THREADS, typename T, typename Op>
__device__ __forceinline__ T block_reduce(T v, Op op) {
    typedef cub::BlockReduce<T, THREADS> Reduce;
    __shared__ typename Reduce::TempStorage storage;
    __shared__ T result;
    T r = Reduce(storage).Reduce(v, op);
    if (threadIdx.x == 0) result = r;
    __syncthreads();
    T out = result;
    __syncthreads();
    return out;
}

/* Default-limit of dynamic shared memory per block; kernels that need more must opt in. */
#define SMEM_DEFAULT_LIMIT (48 * 1024)

/* Lets `kernel` use `bytes` of dynamic shared memory (opt-in above 48 KiB; Hopper allows 227 KiB). */
template <typename Kernel>
static inline void smem_opt_in(Kernel kernel, size_t bytes) {
    if (bytes > SMEM_DEFAULT_LIMIT) cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
}
