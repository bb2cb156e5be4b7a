/*
 * A stand-in for emu-core's runtime (emu/emu_runtime.h) so that the vendor-library doubles
 * (emu/cublaslt.cpp, emu/nccl.cpp) are tested on their own: stream work runs at once (an eager device,
 * no lazy streams), "device memory" is what cudaMalloc here hands out (malloc'd, 256-byte aligned as the
 * CUDA runtime guarantees, filled with NaN bytes as the emulator does), and the few CUDA runtime calls the
 * tests make are synchronous. Tests that need CUDA's ordering rules (a missing stream wait) need the real
 * runtime and skip under this stub.
 */
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include "../emu_runtime.h"

static std::mutex g_lock;
static std::map<const char*, size_t> g_allocs; /* base -> bytes */

void emu_stream_enqueue(cudaStream_t, std::function<void()> work) { work(); }

bool emu_is_device_ptr(const void* p, size_t bytes) {
    std::lock_guard<std::mutex> guard(g_lock);
    const char* c = (const char*)p;
    auto it = g_allocs.upper_bound(c);
    if (it == g_allocs.begin()) return false;
    --it;
    return c >= it->first && c + bytes <= it->first + it->second;
}

void emu_fail(const char* fmt, ...) {
    va_list ap;
    char line[4096] = "emu: "; /* one write of the whole line, so that ranks' lines do not interleave */
    size_t at = strlen(line);
    va_start(ap, fmt);
    vsnprintf(line + at, sizeof(line) - at - 1, fmt, ap);
    va_end(ap);
    at = strlen(line);
    line[at++] = '\n';
    fwrite(line, 1, at, stderr);
    fflush(stderr);
    abort();
}

extern "C" {
cudaError_t cudaMalloc(void** p, size_t bytes) {
    *p = aligned_alloc(256, (bytes + 255) / 256 * 256);
    memset(*p, 0xff, bytes); /* 0xff bytes: NaN in every float format the tests use */
    std::lock_guard<std::mutex> guard(g_lock);
    g_allocs[(const char*)*p] = bytes;
    return cudaSuccess;
}
cudaError_t cudaFree(void* p) {
    std::lock_guard<std::mutex> guard(g_lock);
    g_allocs.erase((const char*)p);
    free(p);
    return cudaSuccess;
}
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind) {
    memcpy(dst, src, bytes);
    return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind, cudaStream_t) {
    memcpy(dst, src, bytes);
    return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int) {
    static char streams[64];
    static int next = 0;
    *s = (cudaStream_t)&streams[next++ % 64];
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaStreamDestroy(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int) {
    static char events[64];
    static int next = 0;
    *e = (cudaEvent_t)&events[next++ % 64];
    return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t) { return cudaSuccess; }
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t, unsigned int) { return cudaSuccess; }
cudaError_t cudaEventDestroy(cudaEvent_t) { return cudaSuccess; }
}
