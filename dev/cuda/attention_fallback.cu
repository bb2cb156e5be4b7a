/*
 * The fallback attention kernels alone, for the compile-time resource check (scripts/
 * check_kernel_resources.py, dev/test/test_kernel_resources.py): the GPU build with cuDNN compiles them
 * out and the emulated build runs them, so their registers and shared memory are checked from this file.
 *   nvcc -cubin -Xptxas -v dev/cuda/attention_fallback.cu
 */
#undef USE_CUDNN
#include <cuda_bf16.h>
#include "../../core/cuda_utils.cuh"
typedef __nv_bfloat16 act_t; /* as cuda/backend.cuh has it */
typedef struct {
    int B, T, backward;
} AttentionShape; /* as llama/backend.h has it */
#include "../../cuda/attention.cuh"
