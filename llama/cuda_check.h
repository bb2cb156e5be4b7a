/*
 * The CUDA runtime error check shared by the nvcc-compiled backend (llama/cuda_common.cuh) and the
 * g++-compiled cuDNN attention (llama/cudnn_att.cpp): every runtime call goes through cudaCheck, which
 * stops with one line naming the file, line, call and the runtime's message.
 */
#pragma once

#include <cuda_runtime_api.h>

#include "common.h"

static inline void cuda_check(cudaError_t err, const char* call, const char* file, int line) {
    if (err != cudaSuccess) die("CUDA error at %s:%d: %s: %s (%s)", file, line, call, cudaGetErrorString(err), cudaGetErrorName(err));
}
#define cudaCheck(call) cuda_check((call), #call, __FILE__, __LINE__)
