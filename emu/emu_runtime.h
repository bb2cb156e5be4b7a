/*
 * The emulated GPU's runtime interface for the vendor-library doubles (emu/cublaslt.cpp, emu/nccl.cpp):
 * how a double runs its work in stream order, checks that a pointer is emulated device memory, and
 * reports a broken contract. Implemented by emu/runtime.cpp (see docs/emulated-gpu.md).
 */
#pragma once

#include <cstddef>
#include <functional>

#include "cuda_runtime_api.h"

/* Runs `work` on stream s when CUDA's ordering rules force it (lazy streams); s == 0 is the legacy stream. */
void emu_stream_enqueue(cudaStream_t s, std::function<void()> work);
/* True when [p, p+bytes) lies inside one live emulated device allocation (not host or pinned memory). */
bool emu_is_device_ptr(const void* p, size_t bytes);
/* Reports an emulator-detected violation: prints "emu: <what>" naming the API or kernel, then aborts. */
[[noreturn]] void emu_fail(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
/* Counts one `event` (a string literal: "cudaMalloc", "kernel loads", ...) in the innermost open NVTX
   range (emu/nvtx.cpp), reported at exit with LLM8_EMU_COUNTS=1. */
void emu_count(const char* event);
