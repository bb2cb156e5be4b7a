/*
 * The emulated GPU's cuda_runtime.h: what nvcc's cuda_runtime.h gives our CUDA sources, for g++ (see
 * docs/emulated-gpu.md). The toolkit's own headers still declare the runtime API (cuda_runtime_api.h,
 * implemented by emu/runtime.cpp) and provide the host paths of cuda_bf16.h and cuda_fp8.h. This header
 * adds what only nvcc provides: the execution-space keywords, threadIdx/blockIdx/blockDim/gridDim (per
 * emulated thread, kept in the fiber's own state), __syncthreads, the intrinsics the project uses, the
 * C++ overloads of the runtime (cudaMalloc(T**), cudaFuncGetAttributes(attr, kernel), ...), and LAUNCH /
 * DYNAMIC_SHARED, the two spellings core/cuda_utils.cuh gives `<<<...>>>` and `extern __shared__`.
 */
#pragma once

#define LLM8_EMU 1

/* the toolkit's host paths first: they are written against its own execution-space macros */
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime_api.h>
#include <vector_types.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <math.h>

#undef __global__
#undef __device__
#undef __host__
#undef __shared__
#undef __constant__
#undef __forceinline__
#undef __noinline__
#undef __launch_bounds__
#define __global__
#define __device__
#define __host__
#define __constant__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
/*
 * __launch_bounds__(max_threads, ...): the kernel goes into a code section named after its bound, which
 * the runtime reads from the executable's section headers to refuse a launch with more threads per block
 * (emu_launch_spec). g++ drops section attributes from template instantiations, so a template kernel's
 * bound is not enforced (docs/emulated-gpu.md, limits). The bound must be an integer literal or a macro
 * of one.
 */
#define EMU_STR2(x) #x
#define EMU_STR(x) EMU_STR2(x)
#define EMU_FIRST(first, ...) first
#define __launch_bounds__(...) __attribute__((section("emu_launch_bounds_" EMU_STR(EMU_FIRST(__VA_ARGS__, 0)))))
/*
 * Static shared memory: one instance, in static storage (the blocks of a launch run one after the other,
 * all on the host thread that runs the stream), re-poisoned with NaN bytes at every block start, so each
 * block sees its own uninitialized copy. The declaration also emits an unused marker, a static char array
 * named emu_static_shared_<n>: at the first launch the runtime finds the markers in the executable's
 * symbol table and poisons every static local of the functions that hold one (CUDA allows no other
 * static locals in device code; a section attribute would be simpler, but g++ drops it on template
 * statics). Not thread_local, so ASan puts its redzone after each array of a plain function; g++'s ASan
 * leaves template statics without one, and there the runtime ASan-poisons the marker when g++ placed it
 * right after the array (it does so far), so an access beyond the end is reported either way.
 */
#define EMU_CAT2(a, b) a##b
#define EMU_CAT(a, b) EMU_CAT2(a, b)
#define EMU_SHARED_REDZONE 32
#define __shared__ __attribute__((used)) static char EMU_CAT(emu_static_shared_, __COUNTER__)[EMU_SHARED_REDZONE]; static

/* ---------------------------------------------------------------- execution state */

/* One emulated thread: its index, kept in the fiber's own record (thread_local is shared by fibers). */
struct EmuThread {
    uint3 idx;
};
/* The block being run on this host thread. */
struct EmuBlock {
    uint3 idx;
    dim3 dim;
    dim3 grid;
    unsigned char* dynamic_smem;
};
extern __thread EmuThread* emu_current_thread;
extern __thread EmuBlock* emu_current_block;

#define threadIdx (emu_current_thread->idx)
#define blockIdx (emu_current_block->idx)
#define blockDim (emu_current_block->dim)
#define gridDim (emu_current_block->grid)

/* Suspends the calling emulated thread until every thread of its block has arrived (emu/runtime.cpp). */
void __syncthreads();
/* The launch's dynamic shared memory of the current block, NaN-poisoned at block start. */
unsigned char* emu_dynamic_shared();

#define LAUNCH(kernel, ...) emu_launch(kernel, #kernel, __VA_ARGS__)
#define DYNAMIC_SHARED(T, name) T* name = reinterpret_cast<T*>(emu_dynamic_shared())

/* ---------------------------------------------------------------- intrinsics (CUDA Math API) */

/* Reinterprets the bits (CUDA Math API, Type Casting Intrinsics). */
static inline float __uint_as_float(unsigned int x) { float f; memcpy(&f, &x, 4); return f; }
static inline unsigned int __float_as_uint(float x) { unsigned int u; memcpy(&u, &x, 4); return u; }
static inline float __int_as_float(int x) { float f; memcpy(&f, &x, 4); return f; }
static inline int __float_as_int(float x) { int i; memcpy(&i, &x, 4); return i; }

/*
 * __byte_perm(x, y, s) (CUDA Math API, Integer Intrinsics): byte n of the result is byte s[4n+2:4n] of
 * the 8-byte value {y, x} (x holds bytes 0-3, y bytes 4-7); only the low 3 bits of each selector nibble
 * count (the default mode; the nibble's high bit selects sign replication only in prmt's other modes).
 */
static inline unsigned int __byte_perm(unsigned int x, unsigned int y, unsigned int s) {
    uint64_t v = ((uint64_t)y << 32) | x;
    unsigned int r = 0;
    for (int n = 0; n < 4; n++) {
        unsigned int sel = (s >> (4 * n)) & 7;
        r |= (unsigned int)((v >> (8 * sel)) & 0xFF) << (8 * n);
    }
    return r;
}

/* min/max overloads of CUDA's math library (CUDA Math API, Integer Mathematical Functions, and the
 * float/double overloads nvcc declares in crt/math_functions.hpp) */
#define EMU_MINMAX(T)                                         \
    static inline T max(T a, T b) { return a > b ? a : b; } \
    static inline T min(T a, T b) { return a < b ? a : b; }
EMU_MINMAX(int)
EMU_MINMAX(unsigned int)
EMU_MINMAX(long long)
EMU_MINMAX(unsigned long long)
#undef EMU_MINMAX
static inline float max(float a, float b) { return fmaxf(a, b); }
static inline float min(float a, float b) { return fminf(a, b); }
static inline double max(double a, double b) { return fmax(a, b); }
static inline double min(double a, double b) { return fmin(a, b); }

/* __vmaxu2(a, b) (CUDA Math API, SIMD Intrinsics): per-halfword unsigned maximum. */
static inline unsigned int __vmaxu2(unsigned int a, unsigned int b) {
    unsigned int lo = (a & 0xFFFF) > (b & 0xFFFF) ? (a & 0xFFFF) : (b & 0xFFFF);
    unsigned int hi = (a >> 16) > (b >> 16) ? (a >> 16) : (b >> 16);
    return (hi << 16) | lo;
}

/*
 * Atomics (CUDA C++ Programming Guide, "Atomic Functions"): read-modify-write of one word, returning the
 * old value. Blocks run on one host thread at a time, but the builtins keep them atomic if that changes.
 */
template <typename T>
static inline T atomicAdd(T* address, T val) {
    static_assert(std::is_integral<T>::value, "emulated atomicAdd: integer types only (float would be order-dependent)");
    return __atomic_fetch_add(address, val, __ATOMIC_RELAXED);
}
template <typename T>
static inline T atomicMax(T* address, T val) {
    static_assert(std::is_integral<T>::value, "emulated atomicMax: integer types only");
    T old = __atomic_load_n(address, __ATOMIC_RELAXED);
    while (old < val && !__atomic_compare_exchange_n(address, &old, val, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
    return old;
}

/* ---------------------------------------------------------------- the C++ runtime API overloads */

template <typename T>
static inline cudaError_t cudaMalloc(T** p, size_t bytes) { return cudaMalloc(reinterpret_cast<void**>(p), bytes); }
template <typename T>
static inline cudaError_t cudaMallocHost(T** p, size_t bytes) { return cudaMallocHost(reinterpret_cast<void**>(p), bytes); }
template <typename... P>
static inline cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* attr, void (*kernel)(P...)) {
    return cudaFuncGetAttributes(attr, reinterpret_cast<const void*>(kernel));
}
template <typename... P>
static inline cudaError_t cudaFuncSetAttribute(void (*kernel)(P...), cudaFuncAttribute attr, int value) {
    return cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel), attr, value);
}

/* ---------------------------------------------------------------- launches */

/* Everything the runtime needs of one launch; body(i) runs the kernel once with the arguments. */
struct EmuLaunchSpec {
    const char* name;
    const void* kernel;
    dim3 grid, block;
    size_t smem;
    cudaStream_t stream;
    std::function<void()> body;
    /* the pointer arguments: checked to be device memory; in race mode, what the launch may write */
    std::vector<const void*> pointers;
};
/* Checks the launch configuration (sets the error cudaGetLastError returns) and enqueues the grid. */
void emu_launch_spec(EmuLaunchSpec&& spec);

template <typename T>
static inline void emu_collect_pointer(std::vector<const void*>& out, const T& v) {
    if constexpr (std::is_pointer<T>::value) out.push_back(reinterpret_cast<const void*>(v));
}

/* kernel<<<grid, block, smem, stream>>>(args...) is LAUNCH(kernel, grid, block, smem, stream)(args...). */
template <typename... P>
struct EmuLauncher {
    void (*kernel)(P...);
    const char* name;
    dim3 grid, block;
    size_t smem;
    cudaStream_t stream;
    template <typename... A>
    void operator()(A&&... a) const {
        static_assert(sizeof...(A) == sizeof...(P), "kernel launched with the wrong number of arguments");
        /* the arguments as the kernel's parameter types, copied once, as a launch copies them to the GPU */
        auto args = std::make_shared<std::tuple<std::decay_t<P>...>>(std::forward<A>(a)...);
        EmuLaunchSpec spec{name, reinterpret_cast<const void*>(kernel), grid, block, smem, stream, nullptr, {}};
        std::apply([&](const auto&... v) { (emu_collect_pointer(spec.pointers, v), ...); }, *args);
        auto k = kernel;
        /* each thread gets its own copy of the parameters, as on a GPU (kernels may modify them) */
        spec.body = [k, args]() { std::apply(k, *args); };
        emu_launch_spec(std::move(spec));
    }
};
template <typename... P>
static inline EmuLauncher<P...> emu_launch(void (*kernel)(P...), const char* name, dim3 grid, dim3 block, size_t smem = 0,
                                            cudaStream_t stream = 0) {
    return EmuLauncher<P...>{kernel, name, grid, block, smem, stream};
}
