/*
 * The emulated GPU's runtime (docs/emulated-gpu.md): the CUDA runtime API calls llm8 makes, on host
 * memory, and kernel launches that run every thread of every block as its own fiber (Boost.Context's
 * fcontext: user-space switches) with real __syncthreads barriers. Streams are lazy: queued work runs
 * only when CUDA's ordering rules force it, so a missing wait gives a wrong result instead of a lucky
 * one. Environment:
 *   LLM8_EMU_SCHEDULE=late|early  non-blocking streams run as late as the rules allow (default) or at once
 *   LLM8_EMU_RACE=1               every launch runs twice, in two thread and block orders, compared bit for bit
 *   LLM8_EMU_MEMORY=<GiB>         device capacity for cudaMalloc and cudaMemGetInfo (default 80, an H100 SXM)
 *   LLM8_EMU_STATS=1              at exit, per kernel: launches, blocks, threads, thread resumes, CPU time
 *   LLM8_EMU_COUNTS=1             at exit, the allocations, device synchronizations and kernel loads of each
 *                                 NVTX range of the program (emu/nvtx.cpp)
 * Violations a GPU would fault on or leave undefined stop with "emu: ..." naming the call or kernel.
 */
#include <boost/context/detail/fcontext.hpp>
#include <cuda_runtime.h>
#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <deque>
#include <map>
#include <set>
#include <string>

#include "emu_runtime.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define EMU_ASAN 1
#else
#define EMU_ASAN 0
#endif
/* The thread switch's own code (docs/emulated-gpu.md, "Speed"): uninstrumented, since its shadow checks of
 * the block's fibers and of its locals land on the cold shadow of the stack it arrives on; the kernels,
 * the barrier checks and ASan's fiber calls are unchanged. */
#define EMU_SWITCH_PATH __attribute__((no_sanitize_address))

namespace ctx = boost::context::detail;

/* ---------------------------------------------------------------- failures and errors */

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

static cudaError_t g_last_error = cudaSuccess;
static cudaError_t set_error(cudaError_t e) {
    if (e != cudaSuccess) g_last_error = e;
    return e;
}

static const char* env_or(const char* name, const char* fallback) {
    const char* v = getenv(name);
    return v && *v ? v : fallback;
}
static bool g_race = std::string(env_or("LLM8_EMU_RACE", "0")) == "1";
static bool g_early = std::string(env_or("LLM8_EMU_SCHEDULE", "late")) == "early";
static bool g_stats = std::string(env_or("LLM8_EMU_STATS", "0")) == "1";

/* ---------------------------------------------------------------- statistics (LLM8_EMU_STATS=1) */

/* What one kernel's launches cost the emulator (docs/emulated-gpu.md, "Speed"): a resume is one switch
 * into a thread's fiber, from run_block or from the thread before it (a thread run as a plain call has
 * none); ms is this host thread's CPU time, so a busy machine does not inflate it. */
struct KernelStats {
    uint64_t launches = 0, blocks = 0, threads = 0, resumes = 0;
    double ms = 0.0;
};
static std::map<std::string, KernelStats> g_kernel_stats;
static uint64_t g_resumes = 0; /* switches into threads' fibers so far */
static const char* const LIBRARY_WORK = "(library doubles: cuBLASLt, NCCL)";

static double cpu_ms() {
    timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec * 1e3 + t.tv_nsec * 1e-6;
}

static void print_stats() {
    std::vector<std::pair<std::string, KernelStats>> rows(g_kernel_stats.begin(), g_kernel_stats.end());
    std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.ms > b.second.ms; });
    KernelStats sum;
    for (const auto& r : rows)
        sum.launches += r.second.launches, sum.blocks += r.second.blocks, sum.threads += r.second.threads,
            sum.resumes += r.second.resumes, sum.ms += r.second.ms;
    rows.emplace_back("total", sum);
    fprintf(stderr, "emu stats (pid %d): %-44s %9s %10s %12s %12s %10s\n", (int)getpid(), "kernel", "launches", "blocks",
            "threads", "resumes", "cpu ms");
    for (const auto& r : rows)
        fprintf(stderr, "emu stats (pid %d): %-44.44s %9llu %10llu %12llu %12llu %10.1f\n", (int)getpid(), r.first.c_str(),
                (unsigned long long)r.second.launches, (unsigned long long)r.second.blocks,
                (unsigned long long)r.second.threads, (unsigned long long)r.second.resumes, r.second.ms);
}

/* Adds one launch (kernel name) or one piece of library work (LIBRARY_WORK) that took [t0, now). */
static void count(const char* name, double t0, uint64_t blocks, uint64_t threads, uint64_t resumes) {
    static bool registered = false;
    if (!registered) {
        registered = true;
        atexit(print_stats);
    }
    KernelStats& k = g_kernel_stats[name];
    k.launches++;
    k.blocks += blocks;
    k.threads += threads;
    k.resumes += resumes;
    k.ms += cpu_ms() - t0;
}

/* ---------------------------------------------------------------- H100 SXM limits */

/* H100 SXM5 80GB (NVIDIA H100 Tensor Core GPU Architecture whitepaper; CUDA C++ Programming Guide,
 * "Compute Capabilities", 9.0): the limits a launch is checked against. */
static const int MAX_THREADS_PER_BLOCK = 1024;
static const int MAX_BLOCK_DIM[3] = {1024, 1024, 64};
static const unsigned int MAX_GRID_DIM[3] = {2147483647u, 65535u, 65535u};
static const size_t SMEM_DEFAULT = 48 * 1024;
static const size_t SMEM_OPTIN_MAX = 227 * 1024;
static const int DEVICE_COUNT = 8; /* an 8-GPU node: each rank of mpirun selects its own */

static size_t capacity_bytes() {
    static size_t cap = (size_t)(atof(env_or("LLM8_EMU_MEMORY", "80")) * (1ull << 30));
    return cap;
}

/* ---------------------------------------------------------------- memory */

static std::map<uintptr_t, size_t> g_device; /* base -> bytes of each live cudaMalloc */
static std::map<uintptr_t, size_t> g_pinned; /* base -> bytes of each live cudaMallocHost */
static size_t g_device_used = 0;

/* The allocation of `m` holding [p, p + bytes), or m.end(); bytes 0 accepts one past the end. */
static std::map<uintptr_t, size_t>::const_iterator find_alloc(const std::map<uintptr_t, size_t>& m, const void* p,
                                                               size_t bytes) {
    uintptr_t a = (uintptr_t)p;
    auto it = m.upper_bound(a);
    if (it == m.begin()) return m.end();
    --it;
    if (a + bytes <= it->first + it->second) return it;
    return m.end();
}

bool emu_is_device_ptr(const void* p, size_t bytes) { return p && find_alloc(g_device, p, bytes) != g_device.end(); }
static bool is_pinned(const void* p, size_t bytes) { return p && find_alloc(g_pinned, p, bytes) != g_pinned.end(); }

static void sync_all();

/* Kernels loaded so far (emu_count's "kernel loads"): under CUDA's lazy loading a kernel is loaded at its
   first launch or attribute query (CUDA C++ Programming Guide, "Lazy Loading"). */
static std::set<const void*> g_loaded_kernels;
static void load_kernel(const void* kernel) {
    if (g_loaded_kernels.insert(kernel).second) emu_count("kernel loads");
}

extern "C" {

cudaError_t cudaMalloc(void** p, size_t bytes) {
    emu_count("cudaMalloc");
    if (!p) return set_error(cudaErrorInvalidValue);
    if (g_device_used + bytes > capacity_bytes()) {
        *p = nullptr;
        return set_error(cudaErrorMemoryAllocation);
    }
    /* cudaMalloc's alignment: at least 256 bytes (CUDA C++ Programming Guide, "Device Memory Accesses") */
    void* q = aligned_alloc(256, (bytes + 255) / 256 * 256);
    if (!q) return set_error(cudaErrorMemoryAllocation);
    /* NaN bytes (0xFF: a NaN as float, BF16 and E5M2, and E4M3's NaN): memory nobody wrote shows up */
    memset(q, 0xFF, bytes);
#if EMU_ASAN
    /* the rounding tail is not the tensor's: reading it is an overflow */
    ASAN_POISON_MEMORY_REGION((char*)q + bytes, (bytes + 255) / 256 * 256 - bytes);
#endif
    g_device[(uintptr_t)q] = bytes;
    g_device_used += bytes;
    *p = q;
    return cudaSuccess;
}

cudaError_t cudaFree(void* p) {
    if (!p) return cudaSuccess;
    emu_count("cudaFree");
    sync_all(); /* cudaFree synchronizes the device implicitly (CUDA Runtime API, cudaFree) */
    auto it = g_device.find((uintptr_t)p);
    if (it == g_device.end()) emu_fail("cudaFree(%p): not a live cudaMalloc allocation", p);
#if EMU_ASAN
    ASAN_UNPOISON_MEMORY_REGION(p, (it->second + 255) / 256 * 256);
#endif
    g_device_used -= it->second;
    g_device.erase(it);
    free(p);
    return cudaSuccess;
}

cudaError_t cudaMallocHost(void** p, size_t bytes) {
    emu_count("cudaMallocHost");
    void* q = malloc(bytes ? bytes : 1);
    if (!q) return set_error(cudaErrorMemoryAllocation);
    g_pinned[(uintptr_t)q] = bytes;
    *p = q;
    return cudaSuccess;
}

cudaError_t cudaFreeHost(void* p) {
    if (!p) return cudaSuccess;
    emu_count("cudaFreeHost");
    sync_all();
    if (!g_pinned.erase((uintptr_t)p)) emu_fail("cudaFreeHost(%p): not a live cudaMallocHost allocation", p);
    free(p);
    return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total) {
    *free_bytes = capacity_bytes() - g_device_used;
    *total = capacity_bytes();
    return cudaSuccess;
}

}  // extern "C"

/* ---------------------------------------------------------------- streams and events */

struct CUstream_st {
    std::deque<std::function<void()>> queue;
    uint64_t enqueued = 0, done = 0;
    bool nonblocking = false;
    int priority = 0;
    bool running = false;
};
struct CUevent_st {
    CUstream_st* stream = nullptr;
    uint64_t seq = 0;
    bool timing = true;
    double ms = 0.0;
};

static CUstream_st g_legacy_stream;
static std::set<CUstream_st*> g_streams;

static CUstream_st* resolve(cudaStream_t s) {
    /* 0, cudaStreamLegacy (0x1) and cudaStreamPerThread (0x2): this single-threaded host's legacy stream */
    if ((uintptr_t)s <= 2) return &g_legacy_stream;
    if (!g_streams.count(s)) emu_fail("stream %p is not a live stream", (void*)s);
    return s;
}

/* Runs s's queued work up to and including its seq-th item. */
static void flush(CUstream_st* s, uint64_t seq) {
    while (s->done < seq) {
        if (s->running) emu_fail("stream dependency cycle (a stream waits on its own later work)");
        std::function<void()> work = std::move(s->queue.front());
        s->queue.pop_front();
        s->running = true;
        work();
        s->running = false;
        s->done++;
    }
}
static void flush_all(CUstream_st* s) { flush(s, s->enqueued); }

static void sync_all() {
    bool again = true;
    while (again) {
        again = false;
        flush_all(&g_legacy_stream);
        for (CUstream_st* s : g_streams) {
            if (s->done < s->enqueued) again = true;
            flush_all(s);
        }
    }
}

static void enqueue(CUstream_st* s, std::function<void()> work) {
    /* a blocking stream and the legacy stream wait for each other (CUDA Runtime API, "Stream
     * synchronization behavior"); cudaStreamNonBlocking streams wait for neither */
    if (!s->nonblocking) {
        if (s == &g_legacy_stream) {
            for (CUstream_st* b : g_streams)
                if (!b->nonblocking) {
                    uint64_t upto = b->enqueued;
                    s->queue.push_back([b, upto] { flush(b, upto); });
                    s->enqueued++;
                }
        } else {
            uint64_t upto = g_legacy_stream.enqueued;
            s->queue.push_back([upto] { flush(&g_legacy_stream, upto); });
            s->enqueued++;
        }
    }
    s->queue.push_back(std::move(work));
    s->enqueued++;
    if (g_early && s->nonblocking) flush_all(s);
}

/* core/buffers.h's redzones between carved tensors: after the allocation's zeroing, in stream order. */
void emu_redzone(void* p, size_t bytes) {
    if (!emu_is_device_ptr(p, bytes)) emu_fail("buffers_point: redzone [%p, +%zu) outside one device allocation", p, bytes);
    enqueue(&g_legacy_stream, [p, bytes] {
        memset(p, 0xFF, bytes);
#if EMU_ASAN
        ASAN_POISON_MEMORY_REGION(p, bytes);
#endif
    });
}

void emu_stream_enqueue(cudaStream_t s, std::function<void()> work) {
    if (g_stats)
        work = [w = std::move(work)] {
            double t0 = cpu_ms();
            w();
            count(LIBRARY_WORK, t0, 0, 0, 0);
        };
    enqueue(resolve(s), std::move(work));
}

static double now_ms() {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

extern "C" {

cudaError_t cudaStreamCreateWithPriority(cudaStream_t* s, unsigned int flags, int priority) {
    CUstream_st* st = new CUstream_st;
    st->nonblocking = (flags & cudaStreamNonBlocking) != 0;
    st->priority = priority;
    g_streams.insert(st);
    *s = st;
    return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int flags) { return cudaStreamCreateWithPriority(s, flags, 0); }
cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithPriority(s, cudaStreamDefault, 0); }
cudaError_t cudaStreamDestroy(cudaStream_t s) {
    CUstream_st* st = resolve(s);
    flush_all(st); /* work already queued completes (CUDA Runtime API, cudaStreamDestroy) */
    g_streams.erase(st);
    delete st;
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    CUstream_st* st = resolve(s);
    flush_all(st);
    return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize(void) {
    emu_count("cudaDeviceSynchronize");
    sync_all();
    return cudaSuccess;
}
/* H100: priorities 0 (least) to -5 (greatest), lower numbers first */
cudaError_t cudaDeviceGetStreamPriorityRange(int* least, int* greatest) {
    if (least) *least = 0;
    if (greatest) *greatest = -5;
    return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int flags) {
    CUevent_st* ev = new CUevent_st;
    ev->timing = (flags & cudaEventDisableTiming) == 0;
    *e = ev;
    return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t* e) { return cudaEventCreateWithFlags(e, cudaEventDefault); }
cudaError_t cudaEventDestroy(cudaEvent_t e) {
    delete e;
    return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
    CUstream_st* st = resolve(s);
    enqueue(st, [e] { e->ms = now_ms(); });
    /* the event is the stream's last item now (enqueue may flush it at once under the early schedule) */
    e->stream = st;
    e->seq = st->enqueued;
    return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
    if (e->stream) flush(e->stream, e->seq);
    return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t e) {
    return !e->stream || e->stream->done >= e->seq ? cudaSuccess : cudaErrorNotReady;
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
    if (!start->timing || !end->timing) return set_error(cudaErrorInvalidResourceHandle);
    if (!start->stream || !end->stream) return set_error(cudaErrorInvalidResourceHandle);
    if (cudaEventQuery(start) != cudaSuccess || cudaEventQuery(end) != cudaSuccess) return cudaErrorNotReady;
    *ms = (float)(end->ms - start->ms);
    return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int) {
    if (!e->stream) return cudaSuccess; /* never recorded: nothing to wait for */
    CUstream_st* es = e->stream;
    uint64_t seq = e->seq; /* the record at the time of the call, not a later one */
    enqueue(resolve(s), [es, seq] { flush(es, seq); });
    return cudaSuccess;
}

/* ---------------------------------------------------------------- copies and memsets */

}  // extern "C"

static void check_range(const char* call, const void* p, size_t bytes, bool) {
    if (bytes && !emu_is_device_ptr(p, bytes)) emu_fail("%s: [%p, +%zu) is not inside one device allocation", call, p, bytes);
}

static void check_copy(const char* call, void* dst, const void* src, size_t n, cudaMemcpyKind kind) {
    bool dst_dev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    bool src_dev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    if (kind == cudaMemcpyDefault) {
        dst_dev = emu_is_device_ptr(dst, 1);
        src_dev = emu_is_device_ptr(src, 1);
    }
    if (dst_dev) check_range(call, dst, n, true);
    if (src_dev) check_range(call, src, n, true);
    if (n && !dst_dev && emu_is_device_ptr(dst, 1)) emu_fail("%s: destination %p is device memory but the kind says host", call, dst);
    if (n && !src_dev && emu_is_device_ptr(src, 1)) emu_fail("%s: source %p is device memory but the kind says host", call, src);
}

extern "C" {

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t n, cudaMemcpyKind kind, cudaStream_t s) {
    check_copy("cudaMemcpyAsync", dst, src, n, kind);
    /* the copy reads src when it runs, so reusing a staging buffer before its event shows */
    enqueue(resolve(s), [dst, src, n] { memmove(dst, src, n); });
    return cudaSuccess;
}
cudaError_t cudaMemcpy(void* dst, const void* src, size_t n, cudaMemcpyKind kind) {
    cudaMemcpyAsync(dst, src, n, kind, 0);
    flush_all(&g_legacy_stream); /* synchronous: returns once the copy (and all before it) is done */
    return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* p, int value, size_t n, cudaStream_t s) {
    check_range("cudaMemsetAsync", p, n, true);
    enqueue(resolve(s), [p, value, n] { memset(p, value, n); });
    return cudaSuccess;
}
cudaError_t cudaMemset(void* p, int value, size_t n) { return cudaMemsetAsync(p, value, n, 0); }
cudaError_t cudaMemset2DAsync(void* p, size_t pitch, int value, size_t width, size_t height, cudaStream_t s) {
    if (width > pitch) return set_error(cudaErrorInvalidValue);
    if (height) check_range("cudaMemset2DAsync", p, pitch * (height - 1) + width, true);
    enqueue(resolve(s), [=] {
        for (size_t r = 0; r < height; r++) memset((char*)p + r * pitch, value, width);
    });
    return cudaSuccess;
}

/* ---------------------------------------------------------------- device and errors */

cudaError_t cudaGetDeviceCount(int* n) {
    *n = DEVICE_COUNT;
    return cudaSuccess;
}
static int g_device_id = 0;
cudaError_t cudaSetDevice(int d) {
    if (d < 0 || d >= DEVICE_COUNT) return set_error(cudaErrorInvalidDevice);
    g_device_id = d;
    return cudaSuccess;
}
cudaError_t cudaGetDevice(int* d) {
    *d = g_device_id;
    return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int) {
    memset(p, 0, sizeof(*p));
    snprintf(p->name, sizeof(p->name), "NVIDIA H100 80GB HBM3 (emulated)");
    p->totalGlobalMem = capacity_bytes();
    p->sharedMemPerBlock = SMEM_DEFAULT;
    p->sharedMemPerBlockOptin = SMEM_OPTIN_MAX;
    p->sharedMemPerMultiprocessor = 228 * 1024;
    p->reservedSharedMemPerBlock = 1024;
    p->regsPerBlock = 65536;
    p->regsPerMultiprocessor = 65536;
    p->warpSize = 32;
    p->maxThreadsPerBlock = MAX_THREADS_PER_BLOCK;
    p->maxThreadsPerMultiProcessor = 2048;
    p->maxBlocksPerMultiProcessor = 32;
    for (int i = 0; i < 3; i++) {
        p->maxThreadsDim[i] = MAX_BLOCK_DIM[i];
        p->maxGridSize[i] = (int)MAX_GRID_DIM[i];
    }
    p->major = 9;
    p->minor = 0;
    p->multiProcessorCount = 132;
    p->l2CacheSize = 50 * 1024 * 1024;
    p->memoryBusWidth = 5120;
    p->totalConstMem = 65536;
    p->concurrentKernels = 1;
    p->asyncEngineCount = 3;
    p->unifiedAddressing = 1;
    p->streamPrioritiesSupported = 1;
    p->canMapHostMemory = 1;
    return cudaSuccess;
}
/* The attributes the project and the cuDNN frontend read (compute capability, SM count), as the
   properties above give them; any other is refused as a runtime without it would. */
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
    cudaDeviceProp p;
    cudaGetDeviceProperties(&p, device);
    switch (attr) {
        case cudaDevAttrComputeCapabilityMajor: *value = p.major; return cudaSuccess;
        case cudaDevAttrComputeCapabilityMinor: *value = p.minor; return cudaSuccess;
        case cudaDevAttrMultiProcessorCount: *value = p.multiProcessorCount; return cudaSuccess;
        default: return set_error(cudaErrorInvalidValue);
    }
}
cudaError_t cudaRuntimeGetVersion(int* v) {
    *v = CUDART_VERSION;
    return cudaSuccess;
}
cudaError_t cudaDriverGetVersion(int* v) {
    *v = CUDART_VERSION;
    return cudaSuccess;
}
cudaError_t cudaGetLastError(void) {
    cudaError_t e = g_last_error;
    g_last_error = cudaSuccess;
    return e;
}
cudaError_t cudaPeekAtLastError(void) { return g_last_error; }

const char* cudaGetErrorName(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorLaunchOutOfResources: return "cudaErrorLaunchOutOfResources";
    default: return "cudaErrorUnknown";
    }
}
/* the runtime's own messages (CUDA Runtime API, enum cudaError) */
const char* cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorLaunchOutOfResources: return "too many resources requested for launch";
    default: return "unknown error";
    }
}

/* ---------------------------------------------------------------- function attributes */

}  // extern "C"

static int launch_bound(const void* kernel);
static std::map<const void*, int> g_max_dynamic_smem; /* cudaFuncAttributeMaxDynamicSharedMemorySize opt-ins */

extern "C" {

cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
    load_kernel(func);
    if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) {
        if (value < 0 || (size_t)value > SMEM_OPTIN_MAX) return set_error(cudaErrorInvalidValue);
        g_max_dynamic_smem[func] = value;
    }
    return cudaSuccess;
}
cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* a, const void* func) {
    load_kernel(func);
    memset(a, 0, sizeof(*a));
    int bound = launch_bound(func);
    a->maxThreadsPerBlock = bound ? bound : MAX_THREADS_PER_BLOCK;
    auto it = g_max_dynamic_smem.find(func);
    a->maxDynamicSharedSizeBytes = it != g_max_dynamic_smem.end() ? it->second : (int)SMEM_DEFAULT;
    a->binaryVersion = 90;
    a->ptxVersion = 90;
    return cudaSuccess;
}

}  // extern "C"

/* ---------------------------------------------------------------- fibers */

__thread EmuThread* emu_current_thread = nullptr;
__thread EmuBlock* emu_current_block = nullptr;

enum FiberState { FIBER_NEW, FIBER_RUNNING, FIBER_AT_BARRIER, FIBER_DONE };
struct Fiber {
    EmuThread t;
    ctx::fcontext_t ctx = nullptr;
    void* stack = nullptr;
    FiberState state = FIBER_NEW;
    void* fake_stack = nullptr;
};

/* 128 KiB per emulated thread (a GPU gives each thread at most 512 KiB of local memory; ours use little),
 * below it a PROT_NONE page so an overflow faults instead of corrupting the next stack. */
static const size_t STACK_BYTES = 128 * 1024, GUARD_BYTES = 4096, STACK_TOP_BYTES = 2 * 1024;
static std::vector<void*> g_free_stacks;

static void* stack_get() {
    if (!g_free_stacks.empty()) {
        void* s = g_free_stacks.back();
        g_free_stacks.pop_back();
        return s;
    }
    char* m = (char*)mmap(nullptr, STACK_BYTES + GUARD_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) emu_fail("out of host memory for fiber stacks");
    mprotect(m, GUARD_BYTES, PROT_NONE);
    return m + GUARD_BYTES;
}
static void stack_put(void* s) {
#if EMU_ASAN
    /* a finished fiber's kernel frames returned (and unpoisoned themselves); only the frames of
     * fiber_entry and the switch, at the top (256 bytes measured), keep their redzones: the next fiber
     * starts clean */
    ASAN_UNPOISON_MEMORY_REGION((char*)s + STACK_BYTES - STACK_TOP_BYTES, STACK_TOP_BYTES);
#endif
    g_free_stacks.push_back(s);
}

/*
 * One block's run: its threads resumed phase by phase in `reverse` order or not, each phase from every
 * thread's start or barrier to its next barrier or its end. A thread that reaches a barrier switches
 * straight to the next thread of the phase (the last one to the first of the next phase); a thread that
 * ends returns to run_block, which frees its stack. k, at_barrier and done describe the phase so far.
 */
struct BlockRun {
    const EmuLaunchSpec* spec;
    const EmuBlock* block;
    Fiber* fibers;
    size_t n;
    bool reverse;
    size_t k = 0, at_barrier = 0, done = 0;
    ctx::fcontext_t scheduler = nullptr;
    Fiber* fiber = nullptr; /* the thread running, or nullptr in run_block */
    const void* scheduler_stack_bottom = nullptr;
    size_t scheduler_stack_size = 0;
    bool direct = false; /* threads run as plain calls: the block's first thread exited without a barrier */
};
static __thread BlockRun* g_run = nullptr;

static void fiber_entry(ctx::transfer_t tr);

/* The thread at position k of the phase's order. */
EMU_SWITCH_PATH static Fiber& fiber_at(BlockRun& run, size_t k) { return run.fibers[run.reverse ? run.n - 1 - k : k]; }

/* Moves run.k to the next thread to resume, counting the finished ones it passes; at the end of a phase
 * checks the barrier and starts the next phase. Returns nullptr when every thread has ended. */
EMU_SWITCH_PATH static Fiber* next_thread(BlockRun& run) {
    for (;;) {
        for (; run.k < run.n; run.k++) {
            Fiber& f = fiber_at(run, run.k);
            if (f.state != FIBER_DONE) return &f;
            run.done++;
        }
        if (run.done == run.n) return nullptr;
        if (run.done > 0)
            emu_fail("kernel %s, block (%u, %u, %u): __syncthreads reached by %zu of the block's %zu threads (the others exited)",
                     run.spec->name, run.block->idx.x, run.block->idx.y, run.block->idx.z, run.at_barrier, run.n);
        run.k = run.at_barrier = run.done = 0;
    }
}

/* Records where a switch came from: the thread that left (its context, to resume it later) or run_block. */
EMU_SWITCH_PATH static void arrived(ctx::transfer_t tr) {
    Fiber* from = (Fiber*)tr.data;
    if (from)
        from->ctx = tr.fctx;
    else
        g_run->scheduler = tr.fctx;
}

/* Switches from the running thread (`from`, or run_block when nullptr) to thread `to`, which then runs
 * until it switches on. Under ASan both ends tell the sanitizer which stack they run on. */
EMU_SWITCH_PATH static void switch_to(Fiber* from, Fiber& to) {
    if (to.state == FIBER_NEW) {
        to.stack = stack_get();
        to.ctx = ctx::make_fcontext((char*)to.stack + STACK_BYTES, STACK_BYTES, fiber_entry);
    }
    to.state = FIBER_RUNNING;
    g_run->fiber = &to;
    emu_current_thread = &to.t;
    g_resumes++;
#if EMU_ASAN
    void* scheduler_fake = nullptr;
    __sanitizer_start_switch_fiber(from ? &from->fake_stack : &scheduler_fake, to.stack, STACK_BYTES);
#endif
    ctx::transfer_t tr = ctx::jump_fcontext(to.ctx, from);
    arrived(tr);
#if EMU_ASAN
    if (from)
        __sanitizer_finish_switch_fiber(from->fake_stack, nullptr, nullptr);
    else
        __sanitizer_finish_switch_fiber(scheduler_fake, nullptr, nullptr);
#endif
}

/* First code of every fiber: under ASan, a switch from run_block tells where run_block's stack is. */
EMU_SWITCH_PATH static void fiber_entry(ctx::transfer_t tr) {
    arrived(tr);
#if EMU_ASAN
    const void** bottom = tr.data ? nullptr : &g_run->scheduler_stack_bottom;
    size_t* size = tr.data ? nullptr : &g_run->scheduler_stack_size;
    __sanitizer_finish_switch_fiber(nullptr, bottom, size);
#endif
    g_run->spec->body();
    /* ended: back to run_block, which frees this stack (a fiber cannot free the stack it runs on) */
    Fiber* self = g_run->fiber;
    self->state = FIBER_DONE;
#if EMU_ASAN
    __sanitizer_start_switch_fiber(nullptr, g_run->scheduler_stack_bottom, g_run->scheduler_stack_size);
#endif
    ctx::jump_fcontext(g_run->scheduler, self);
}

EMU_SWITCH_PATH void __syncthreads() {
    if (g_run && g_run->direct) {
        const EmuBlock* b = emu_current_block;
        emu_fail("kernel %s, block (%u, %u, %u): __syncthreads reached by thread (%u, %u, %u), but the block's first "
                 "thread exited without reaching it",
                 g_run->spec->name, b->idx.x, b->idx.y, b->idx.z, threadIdx.x, threadIdx.y, threadIdx.z);
    }
    if (!g_run || !g_run->fiber) emu_fail("__syncthreads called outside a kernel");
    BlockRun& run = *g_run;
    Fiber* self = run.fiber;
    self->state = FIBER_AT_BARRIER;
    run.at_barrier++;
    run.k++;
    Fiber* next = next_thread(run); /* not nullptr: this thread has not ended */
    if (next == self) {             /* the only thread left in the block: past its barrier at once */
        self->state = FIBER_RUNNING;
        return;
    }
    switch_to(self, *next);
}

unsigned char* emu_dynamic_shared() { return emu_current_block->dynamic_smem; }

/* ---------------------------------------------------------------- static shared memory */

static int main_program_bias(struct dl_phdr_info* info, size_t, void* out) {
    *(uintptr_t*)out = info->dlpi_addr; /* the first object listed is the main program */
    return 1;
}

/* The executable's own file, mapped once (its symbol table and section headers), and its load bias. */
struct ExeImage {
    const unsigned char* img = nullptr;
    const Elf64_Ehdr* eh = nullptr;
    const Elf64_Shdr* sh = nullptr;
    uintptr_t bias = 0;
};
static const ExeImage& exe_image() {
    static ExeImage x;
    if (x.img) return x;
    int fd = open("/proc/self/exe", O_RDONLY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) emu_fail("cannot read /proc/self/exe (static __shared__, __launch_bounds__)");
    x.img = (const unsigned char*)mmap(nullptr, st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (x.img == MAP_FAILED) emu_fail("cannot map /proc/self/exe (static __shared__, __launch_bounds__)");
    x.eh = (const Elf64_Ehdr*)x.img;
    x.sh = (const Elf64_Shdr*)(x.img + x.eh->e_shoff);
    dl_iterate_phdr(main_program_bias, &x.bias);
    return x;
}

/* The __launch_bounds__ of the kernel at `kernel`, or 0 when it has none (emu/cuda_runtime.h: the kernel's
 * code lies in the section emu_launch_bounds_<max threads per block>). */
static int launch_bound(const void* kernel) {
    static std::map<uintptr_t, std::pair<uintptr_t, int>> sections; /* start -> end, bound */
    static bool found = false;
    if (!found) {
        found = true;
        const ExeImage& x = exe_image();
        const char* names = (const char*)(x.img + x.sh[x.eh->e_shstrndx].sh_offset);
        const char* prefix = "emu_launch_bounds_";
        for (int i = 0; i < x.eh->e_shnum; i++) {
            const char* n = names + x.sh[i].sh_name;
            if (strncmp(n, prefix, strlen(prefix)) != 0) continue;
            char* end = nullptr;
            long bound = strtol(n + strlen(prefix), &end, 10);
            if (*end || bound <= 0) emu_fail("section %s: __launch_bounds__ needs an integer literal (or a macro of one)", n);
            sections[x.bias + x.sh[i].sh_addr] = std::make_pair(x.bias + x.sh[i].sh_addr + x.sh[i].sh_size, (int)bound);
        }
    }
    uintptr_t a = (uintptr_t)kernel;
    auto it = sections.upper_bound(a);
    if (it == sections.begin()) return 0;
    --it;
    return a < it->second.first ? it->second.second : 0;
}

/*
 * The static __shared__ variables of the executable, as (address, bytes): every writable static local
 * of each function that holds an emu_static_shared_<n> marker (emu/cuda_runtime.h), found once in
 * /proc/self/exe's symbol table. A function-local static is the symbol _ZZ<function>E<length><name>,
 * so the marker's symbol up to its length digits is the prefix its siblings share. Under ASan a marker
 * that starts where one of its function's arrays ends is poisoned: the array's redzone.
 */
static const std::vector<std::pair<unsigned char*, size_t>>& static_shared() {
    static std::vector<std::pair<unsigned char*, size_t>> regions;
    static bool found = false;
    if (found) return regions;
    found = true;
    const ExeImage& x = exe_image();
    const unsigned char* img = x.img;
    const Elf64_Ehdr* eh = x.eh;
    const Elf64_Shdr* sh = x.sh;
    const Elf64_Sym* syms = nullptr;
    size_t nsyms = 0;
    const char* names = nullptr;
    for (int i = 0; i < eh->e_shnum; i++)
        if (sh[i].sh_type == SHT_SYMTAB) {
            syms = (const Elf64_Sym*)(img + sh[i].sh_offset);
            nsyms = sh[i].sh_size / sizeof(Elf64_Sym);
            names = (const char*)(img + sh[sh[i].sh_link].sh_offset);
        }
    if (!syms) emu_fail("static __shared__: the executable has no symbol table (stripped?): its shared arrays cannot be poisoned");
    uintptr_t bias = x.bias;
    const char* marker = "emu_static_shared_";
    std::set<std::string> prefixes;
    std::map<uintptr_t, std::pair<std::string, size_t>> markers; /* address -> function prefix, bytes */
    for (size_t i = 0; i < nsyms; i++) {
        const char* n = names + syms[i].st_name;
        const char* m = strstr(n, marker);
        if (strncmp(n, "_ZZ", 3) != 0 || !m) continue;
        const char* digits = m;
        while (digits > n && digits[-1] >= '0' && digits[-1] <= '9') digits--;
        prefixes.insert(std::string(n, digits - n));
        markers[bias + syms[i].st_value] = std::make_pair(std::string(n, digits - n), (size_t)syms[i].st_size);
    }
    for (size_t i = 0; i < nsyms; i++) {
        const Elf64_Sym& y = syms[i];
        const char* n = names + y.st_name;
        if (ELF64_ST_TYPE(y.st_info) != STT_OBJECT || y.st_size == 0 || y.st_shndx == SHN_UNDEF || y.st_shndx >= eh->e_shnum ||
            strncmp(n, "_ZZ", 3) != 0 || strstr(n, marker))
            continue;
        const Elf64_Shdr& sec = sh[y.st_shndx];
        if ((sec.sh_flags & (SHF_WRITE | SHF_ALLOC)) != (SHF_WRITE | SHF_ALLOC) || (sec.sh_flags & SHF_TLS)) continue;
        const char* e = n + strlen(n);
        /* the prefix ends where the local name's length digits begin */
        for (const char* d = n + 3; d < e; d++)
            if (*d >= '0' && *d <= '9' && d[-1] == 'E' && prefixes.count(std::string(n, d - n))) {
                regions.emplace_back((unsigned char*)(bias + y.st_value), (size_t)y.st_size);
#if EMU_ASAN
                auto after = markers.find(bias + y.st_value + y.st_size);
                if (after != markers.end() && after->second.first == std::string(n, d - n))
                    ASAN_POISON_MEMORY_REGION((void*)after->first, after->second.second);
#endif
                break;
            }
    }
    return regions;
}

/* Runs one block: every thread from its start to its first barrier, in `reverse` order or not, then
 * every thread to its next barrier, and so on; a barrier some threads never reach is reported. */
static void run_block(const EmuLaunchSpec& spec, EmuBlock& block, std::vector<Fiber>& fibers, bool reverse) {
    BlockRun run;
    run.spec = &spec;
    run.block = &block;
    run.fibers = fibers.data();
    run.n = fibers.size();
    run.reverse = reverse;
    g_run = &run;
    emu_current_block = &block;
    /* shared memory, dynamic and static, is uninitialized at block start: NaN bytes, as in cudaMalloc */
    if (spec.smem) memset(block.dynamic_smem, 0xFF, spec.smem);
    for (const auto& r : static_shared()) memset(r.first, 0xFF, r.second);
    unsigned int i = 0;
    for (unsigned int z = 0; z < block.dim.z; z++)
        for (unsigned int y = 0; y < block.dim.y; y++)
            for (unsigned int x = 0; x < block.dim.x; x++, i++) {
                fibers[i].t.idx = make_uint3(x, y, z);
                fibers[i].state = FIBER_NEW;
            }
    while (Fiber* f = next_thread(run)) {
        /* the first thread ran to its end without a barrier: in a correct kernel no thread of the block
         * reaches one (all or none must), so the others run as plain calls, without switches; one that
         * does reach a barrier is reported by __syncthreads */
        if (f->state == FIBER_NEW && run.k > 0 && run.done == run.k && run.at_barrier == 0) {
            run.direct = true;
            run.fiber = nullptr;
            emu_current_thread = &f->t;
            spec.body();
            f->state = FIBER_DONE;
            continue; /* next_thread counts it */
        }
        /* runs threads, switching from barrier to barrier, until one ends */
        switch_to(nullptr, *f);
        stack_put(run.fiber->stack);
        run.fiber = nullptr;
    }
    g_run = nullptr;
    emu_current_thread = nullptr;
    emu_current_block = nullptr;
}

static void run_grid(const EmuLaunchSpec& spec, bool reverse) {
    EmuBlock block;
    block.dim = spec.block;
    block.grid = spec.grid;
    unsigned char* smem = (unsigned char*)malloc(spec.smem ? spec.smem : 1);
    block.dynamic_smem = smem;
    std::vector<Fiber> fibers((size_t)spec.block.x * spec.block.y * spec.block.z);
    size_t blocks = (size_t)spec.grid.x * spec.grid.y * spec.grid.z;
    for (size_t k = 0; k < blocks; k++) {
        size_t b = reverse ? blocks - 1 - k : k;
        block.idx = make_uint3((unsigned int)(b % spec.grid.x), (unsigned int)(b / spec.grid.x % spec.grid.y),
                               (unsigned int)(b / ((size_t)spec.grid.x * spec.grid.y)));
        run_block(spec, block, fibers, reverse);
    }
    free(smem);
}

/* Race mode: the launch from the same memory twice, in opposite thread and block orders; every byte of
 * the allocations its pointer arguments point into must come out the same. */
static void run_grid_twice(const EmuLaunchSpec& spec) {
    std::vector<std::pair<void*, size_t>> allocs;
    for (const void* p : spec.pointers) {
        auto it = find_alloc(g_device, p, 0);
        if (it == g_device.end()) continue; /* null, or pinned memory (not snapshot: kernels only read it) */
        std::pair<void*, size_t> a((void*)it->first, it->second);
        bool seen = false;
        for (auto& q : allocs) seen |= q.first == a.first;
        if (!seen) allocs.push_back(a);
    }
    std::vector<std::vector<unsigned char>> before(allocs.size()), first(allocs.size());
    for (size_t i = 0; i < allocs.size(); i++)
        before[i].assign((unsigned char*)allocs[i].first, (unsigned char*)allocs[i].first + allocs[i].second);
    run_grid(spec, false);
    for (size_t i = 0; i < allocs.size(); i++) {
        first[i].assign((unsigned char*)allocs[i].first, (unsigned char*)allocs[i].first + allocs[i].second);
        memcpy(allocs[i].first, before[i].data(), allocs[i].second);
    }
    run_grid(spec, true);
    for (size_t i = 0; i < allocs.size(); i++) {
        const unsigned char* a = first[i].data();
        const unsigned char* b = (const unsigned char*)allocs[i].first;
        if (memcmp(a, b, allocs[i].second) != 0) {
            size_t at = 0;
            while (a[at] == b[at]) at++;
            emu_fail("race mode: kernel %s (grid %u x %u x %u, block %u x %u x %u) wrote different bytes in two thread/block "
                     "orders (allocation %p, first at byte %zu: 0x%02x vs 0x%02x): a missing barrier, a shared-memory "
                     "race or an order-dependent atomic",
                     spec.name, spec.grid.x, spec.grid.y, spec.grid.z, spec.block.x, spec.block.y, spec.block.z,
                     allocs[i].first, at, a[at], b[at]);
        }
    }
}

/* Runs a launch's grid (twice in race mode), counted when LLM8_EMU_STATS asks. */
static void run_launch(const EmuLaunchSpec& spec) {
    double t0 = g_stats ? cpu_ms() : 0.0;
    uint64_t r0 = g_resumes;
    if (g_race)
        run_grid_twice(spec);
    else
        run_grid(spec, false);
    uint64_t blocks = (uint64_t)spec.grid.x * spec.grid.y * spec.grid.z;
    if (g_stats) count(spec.name, t0, blocks, blocks * spec.block.x * spec.block.y * spec.block.z, g_resumes - r0);
}

void emu_launch_spec(EmuLaunchSpec&& spec) {
    load_kernel(spec.kernel);
    const dim3& b = spec.block;
    const dim3& g = spec.grid;
    /* CUDA C++ Programming Guide, "Compute Capabilities" (9.0): block and grid limits */
    if (b.x == 0 || b.y == 0 || b.z == 0 || (int)b.x > MAX_BLOCK_DIM[0] || (int)b.y > MAX_BLOCK_DIM[1] ||
        (int)b.z > MAX_BLOCK_DIM[2] || (size_t)b.x * b.y * b.z > (size_t)MAX_THREADS_PER_BLOCK || g.x == 0 || g.y == 0 ||
        g.z == 0 || g.x > MAX_GRID_DIM[0] || g.y > MAX_GRID_DIM[1] || g.z > MAX_GRID_DIM[2]) {
        fprintf(stderr, "emu: launch of %s: grid (%u, %u, %u), block (%u, %u, %u) is beyond the device's limits\n", spec.name,
                g.x, g.y, g.z, b.x, b.y, b.z);
        set_error(cudaErrorInvalidConfiguration);
        return;
    }
    /* a block above the kernel's __launch_bounds__ fails to launch: cudaFuncAttributes::maxThreadsPerBlock is
     * "the maximum number of threads per block, beyond which a launch of the function would fail", and
     * cudaErrorLaunchOutOfResources is the launch that "specifies too many threads for the kernel's
     * register count" (CUDA Runtime API, struct cudaFuncAttributes and enum cudaError) */
    int bound = launch_bound(spec.kernel);
    if (bound && (size_t)b.x * b.y * b.z > (size_t)bound) {
        fprintf(stderr, "emu: launch of %s: block (%u, %u, %u) of %zu threads, above the kernel's __launch_bounds__(%d)\n",
                spec.name, b.x, b.y, b.z, (size_t)b.x * b.y * b.z, bound);
        set_error(cudaErrorLaunchOutOfResources);
        return;
    }
    /* dynamic shared memory above 48 KiB needs cudaFuncAttributeMaxDynamicSharedMemorySize (CUDA C++
     * Programming Guide, "Shared Memory" for 9.0); without it the launch fails with an invalid argument */
    auto it = g_max_dynamic_smem.find(spec.kernel);
    size_t limit = it != g_max_dynamic_smem.end() ? (size_t)it->second : SMEM_DEFAULT;
    if (limit < SMEM_DEFAULT) limit = SMEM_DEFAULT;
    if (spec.smem > limit) {
        fprintf(stderr, "emu: launch of %s: %zu bytes of dynamic shared memory, above the kernel's limit of %zu (%s)\n",
                spec.name, spec.smem, limit, it != g_max_dynamic_smem.end() ? "its opt-in" : "48 KiB without the opt-in");
        set_error(cudaErrorInvalidValue);
        return;
    }
    /* a kernel dereferencing host memory faults on a GPU (pinned memory is mapped: it is allowed) */
    for (size_t i = 0; i < spec.pointers.size(); i++) {
        const void* p = spec.pointers[i];
        if (p && find_alloc(g_device, p, 0) == g_device.end() && !is_pinned(p, 0))
            emu_fail("launch of %s: pointer argument %p (the kernel's pointer parameter %zu) is not device memory", spec.name, p, i);
    }
    auto shared = std::make_shared<EmuLaunchSpec>(std::move(spec));
    enqueue(resolve(shared->stream), [shared] { run_launch(*shared); });
}
