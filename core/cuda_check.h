/*
 * The CUDA runtime error checks shared by the nvcc-compiled code and the g++-compiled cuDNN attention
 * (cuda/cudnn_att.cpp): every runtime call goes through cudaCheck, and every kernel launch is followed by
 * launchCheck; both stop with one line naming the file, line, call and the runtime's message.
 */
#pragma once

#include <cuda_runtime_api.h>

#include "common.h"

static inline void cuda_check(cudaError_t err, const char* call, const char* file, int line) {
    if (err != cudaSuccess) die("CUDA error at %s:%d: %s: %s (%s)", file, line, call, cudaGetErrorString(err), cudaGetErrorName(err));
}
#define cudaCheck(call) cuda_check((call), #call, __FILE__, __LINE__)

/* Follows every kernel launch: catches bad launch configurations (and earlier asynchronous faults). */
#define launchCheck() cuda_check(cudaGetLastError(), "kernel launch", __FILE__, __LINE__)
