/*
 * Unit tests of the emulated GPU's device side and runtime rules (run by dev/test/test_emu.py), each
 * expectation written from NVIDIA's documentation, not from emu/'s code:
 *   - __byte_perm: libdevice User's Guide, __nv_byte_perm (result[n] = input[s<4n+2:4n>], input bytes 0-3
 *     from x, 4-7 from y), and the example of CUB's PRMT documentation (0x03020100, 0x07060504, 0x7531 ->
 *     0x07050301);
 *   - __vmaxu2: CUDA Math API, SIMD Intrinsics (per-halfword unsigned maximum);
 *   - __uint_as_float: CUDA Math API, Type Casting Intrinsics (reinterpretation: 0x3f800000 is 1.0f);
 *   - atomicAdd / atomicMax: CUDA C++ Programming Guide, Atomic Functions (returns the old value);
 *   - __syncthreads: the Programming Guide's barrier: every write before it is seen by every thread after;
 *   - cub::BlockReduce: CUB's BLOCK_REDUCE_WARP_REDUCTIONS, i.e. per warp the shuffle-down tree, which on
 *     lane 0 is the balanced pairwise tree of adjacent lanes, then the warp aggregates in warp order;
 *   - launch limits: Programming Guide, Compute Capabilities 9.0 (1024 threads, 48 KiB dynamic shared
 *     memory without the opt-in).
 * `test_intrinsics` runs the passing checks; `test_intrinsics FAULT` runs one that must stop the run.
 */
#include <cub/block/block_reduce.cuh>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

static int g_failures = 0;
#define EXPECT(cond, ...)                                          \
    do {                                                           \
        if (!(cond)) {                                             \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
            fprintf(stderr, __VA_ARGS__);                          \
            fprintf(stderr, "\n");                                 \
            g_failures++;                                          \
        }                                                          \
    } while (0)

static void test_scalar_intrinsics() {
    /* every selector nibble picks its byte of {y, x}; bit 3 of a nibble is ignored in the default mode */
    EXPECT(__byte_perm(0x03020100u, 0x07060504u, 0x7531u) == 0x07050301u, "CUB PRMT example");
    EXPECT(__byte_perm(0x33221100u, 0x77665544u, 0x3210u) == 0x33221100u, "identity selector returns x");
    EXPECT(__byte_perm(0x33221100u, 0x77665544u, 0x7654u) == 0x77665544u, "selector 0x7654 returns y");
    EXPECT(__byte_perm(0x33221100u, 0x77665544u, 0x0123u) == 0x00112233u, "byte reversal of x");
    EXPECT(__byte_perm(0x33221100u, 0x77665544u, 0x5410u) == 0x55441100u, "low halves of x and y");
    EXPECT(__byte_perm(0x33221100u, 0x77665544u, 0xFFFF7632u) == 0x77663322u, "upper 16 bits of s unused");
    EXPECT(__vmaxu2(0x0001FFFFu, 0x00020000u) == 0x0002FFFFu, "halfwords compared separately, unsigned");
    EXPECT(__vmaxu2(0x80000001u, 0x7FFF0002u) == 0x80000002u, "0x8000 is the larger unsigned halfword");
    EXPECT(__uint_as_float(0x3f800000u) == 1.0f, "0x3f800000 is 1.0f");
    EXPECT(std::isnan(__uint_as_float(0xFFFFFFFFu)), "all-ones is a NaN");
    EXPECT(__float_as_uint(-2.0f) == 0xC0000000u, "-2.0f is 0xC0000000");
}

__global__ void atomics_kernel(unsigned int* sum, unsigned int* maxv, unsigned long long* wide) {
    unsigned int t = blockIdx.x * blockDim.x + threadIdx.x;
    atomicAdd(sum, 1u);
    atomicMax(maxv, t * 7u % 1000u);
    atomicAdd(wide, (unsigned long long)t << 32);
}

/* thread t writes slot t, then after the barrier reads slot t + 1: correct only with a real barrier */
__global__ void barrier_kernel(int* out) {
    __shared__ int slots[256];
    slots[threadIdx.x] = (int)(threadIdx.x * 3 + blockIdx.x);
    __syncthreads();
    out[blockIdx.x * blockDim.x + threadIdx.x] = slots[(threadIdx.x + 1) % blockDim.x];
}

__global__ void index_kernel(unsigned int* out) {
    unsigned int linear = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    unsigned int block = blockIdx.x + gridDim.x * blockIdx.y;
    out[block * blockDim.x * blockDim.y * blockDim.z + linear] = (threadIdx.z << 16) | (threadIdx.y << 8) | threadIdx.x;
}

template <int THREADS>
__global__ void reduce_kernel(float* out, const float* in) {
    typedef cub::BlockReduce<float, THREADS> Reduce;
    __shared__ typename Reduce::TempStorage storage;
    float r = Reduce(storage).Reduce(in[threadIdx.x], [](const float& a, const float& b) { return a + b; });
    out[threadIdx.x] = r;
}

static float pairwise(const float* x, int n) { return n == 1 ? x[0] : pairwise(x, n / 2) + pairwise(x + n / 2, n / 2); }

template <typename T>
static T* device_copy(const T* host, size_t n) {
    T* d;
    cudaMalloc(&d, n * sizeof(T));
    cudaMemcpy(d, host, n * sizeof(T), cudaMemcpyHostToDevice);
    return d;
}

static void test_kernels() {
    unsigned int zero[2] = {0, 0};
    unsigned long long wide0 = 0;
    unsigned int* counters = device_copy(zero, 2);
    unsigned long long* wide = device_copy(&wide0, 1);
    LAUNCH(atomics_kernel, 4, 256)(counters, counters + 1, wide);
    unsigned int got[2];
    unsigned long long wide_got;
    cudaMemcpy(got, counters, sizeof(got), cudaMemcpyDeviceToHost);
    cudaMemcpy(&wide_got, wide, sizeof(wide_got), cudaMemcpyDeviceToHost);
    unsigned int expect_max = 0;
    unsigned long long expect_wide = 0;
    for (unsigned int t = 0; t < 1024; t++) {
        expect_max = t * 7u % 1000u > expect_max ? t * 7u % 1000u : expect_max;
        expect_wide += (unsigned long long)t << 32;
    }
    EXPECT(got[0] == 1024 && got[1] == expect_max && wide_got == expect_wide, "atomics: %u %u", got[0], got[1]);

    int* out;
    cudaMalloc(&out, 3 * 256 * sizeof(int));
    LAUNCH(barrier_kernel, 3, 256)(out);
    int host[3 * 256];
    cudaMemcpy(host, out, sizeof(host), cudaMemcpyDeviceToHost);
    for (int b = 0; b < 3; b++)
        for (int t = 0; t < 256; t++) EXPECT(host[b * 256 + t] == ((t + 1) % 256) * 3 + b, "barrier: block %d thread %d", b, t);

    unsigned int* idx;
    cudaMalloc(&idx, 2 * 3 * 4 * 5 * sizeof(unsigned int));
    LAUNCH(index_kernel, dim3(2, 1, 1), dim3(3, 4, 5))(idx);
    unsigned int hidx[120];
    cudaMemcpy(hidx, idx, sizeof(hidx), cudaMemcpyDeviceToHost);
    for (unsigned int b = 0; b < 2; b++)
        for (unsigned int z = 0; z < 5; z++)
            for (unsigned int y = 0; y < 4; y++)
                for (unsigned int x = 0; x < 3; x++)
                    EXPECT(hidx[b * 60 + x + 3 * (y + 4 * z)] == ((z << 16) | (y << 8) | x), "threadIdx (%u, %u, %u)", x, y, z);

    /* 2^24 and -2^24 among values near 1: any other combination order changes the bits */
    float in[256];
    uint32_t state = 12345;
    for (int i = 0; i < 256; i++) {
        state = state * 1664525u + 1013904223u;
        in[i] = 1.0f + (float)(state >> 8) / (1 << 24);
    }
    in[3] = 16777216.0f;
    in[200] = -16777216.0f;
    float* din = device_copy(in, 256);
    float* dout;
    cudaMalloc(&dout, 256 * sizeof(float));
    LAUNCH(reduce_kernel<256>, 1, 256)(dout, din);
    float res[256];
    cudaMemcpy(res, dout, sizeof(res), cudaMemcpyDeviceToHost);
    float expect = pairwise(in, 32);
    for (int w = 1; w < 8; w++) expect = expect + pairwise(in + 32 * w, 32);
    float sequential = 0;
    for (int i = 0; i < 256; i++) sequential += in[i];
    EXPECT(memcmp(&res[0], &expect, 4) == 0, "BlockReduce tree: %.9g, expected %.9g", res[0], expect);
    EXPECT(sequential != expect, "test inputs do not tell the orders apart");
    for (int t = 1; t < 256; t++) EXPECT(std::isnan(res[t]), "BlockReduce result outside thread 0 is poisoned (thread %d)", t);
    cudaFree(din);
    cudaFree(dout);
    cudaFree(out);
    cudaFree(idx);
    cudaFree(counters);
    cudaFree(wide);
}

__global__ void smem_kernel(float* out) {
    DYNAMIC_SHARED(float, s);
    s[threadIdx.x] = 1.0f;
    out[0] = s[0];
}

static void test_launch_rules() {
    float* out;
    cudaMalloc(&out, sizeof(float));
    cudaGetLastError();
    LAUNCH(smem_kernel, 1, 1025)(out);
    EXPECT(cudaGetLastError() == cudaErrorInvalidConfiguration, "1025 threads per block");
    LAUNCH(smem_kernel, dim3(1, 65536, 1), 32)(out);
    EXPECT(cudaGetLastError() == cudaErrorInvalidConfiguration, "grid y above 65535");
    LAUNCH(smem_kernel, 1, 32, 48 * 1024 + 4)(out);
    EXPECT(cudaGetLastError() == cudaErrorInvalidValue, "dynamic shared memory above 48 KiB without the opt-in");
    EXPECT(cudaFuncSetAttribute(smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024 + 4) == cudaErrorInvalidValue,
           "opt-in above 227 KiB");
    cudaGetLastError();
    EXPECT(cudaFuncSetAttribute(smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * 1024) == cudaSuccess, "opt-in");
    LAUNCH(smem_kernel, 1, 32, 48 * 1024 + 4)(out);
    EXPECT(cudaGetLastError() == cudaSuccess, "dynamic shared memory above 48 KiB with the opt-in");
    cudaDeviceSynchronize();
    cudaFree(out);
}

/* Lazy streams: work on a non-blocking stream runs only when forced, late schedule (the default). */
static void test_lazy_streams() {
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    int* d;
    cudaMalloc(&d, sizeof(int));
    cudaMemset(d, 0, sizeof(int));
    /* without this the memset (legacy stream) and the copy below (non-blocking) are unordered */
    cudaDeviceSynchronize();
    int one = 1, host = -1;
    cudaMemcpyAsync(d, &one, sizeof(int), cudaMemcpyHostToDevice, s);
    /* the legacy stream does not wait for a non-blocking stream: the copy above has not run */
    cudaMemcpy(&host, d, sizeof(int), cudaMemcpyDeviceToHost);
    const char* schedule = getenv("LLM8_EMU_SCHEDULE");
    bool early = schedule && strcmp(schedule, "early") == 0;
    EXPECT(host == (early ? 1 : 0), "the legacy stream read %d before the non-blocking stream was forced", host);
    cudaEvent_t e;
    cudaEventCreate(&e);
    cudaEventRecord(e, s);
    cudaStreamWaitEvent(0, e, 0);
    cudaMemcpy(&host, d, sizeof(int), cudaMemcpyDeviceToHost);
    EXPECT(host == 1, "after cudaStreamWaitEvent the legacy stream sees the copy");
    float ms = -1;
    cudaEvent_t e0;
    cudaEventCreate(&e0);
    cudaEventRecord(e0, s);
    cudaEventRecord(e, s);
    cudaEventSynchronize(e);
    EXPECT(cudaEventElapsedTime(&ms, e0, e) == cudaSuccess && ms >= 0, "event timing");
    size_t free_bytes, total;
    cudaMemGetInfo(&free_bytes, &total);
    EXPECT(total - free_bytes == sizeof(int), "cudaMemGetInfo counts the live allocation (%zu used)", total - free_bytes);
    cudaEventDestroy(e0);
    cudaEventDestroy(e);
    cudaFree(d);
    cudaStreamDestroy(s);
}

__global__ void divergent_barrier_kernel(int* out) {
    if (threadIdx.x < 16) __syncthreads();
    out[threadIdx.x] = 1;
}
__global__ void late_barrier_kernel(int* out) {
    if (threadIdx.x > 0) __syncthreads();
    out[threadIdx.x] = 1;
}
__global__ void store_kernel(int* out) { out[threadIdx.x] = 1; }
__global__ void reduce_wrong_size_kernel(float* out) {
    typedef cub::BlockReduce<float, 64> Reduce;
    __shared__ Reduce::TempStorage storage;
    out[0] = Reduce(storage).Sum(1.0f);
}

int main(int argc, char** argv) {
    if (argc == 2) {
        int* d;
        cudaMalloc(&d, 64 * sizeof(int));
        if (strcmp(argv[1], "divergent-barrier") == 0) LAUNCH(divergent_barrier_kernel, 1, 32)(d);
        if (strcmp(argv[1], "late-barrier") == 0) LAUNCH(late_barrier_kernel, 1, 32)(d);
        if (strcmp(argv[1], "host-pointer") == 0) {
            static int host[64];
            LAUNCH(store_kernel, 1, 32)(host);
        }
        if (strcmp(argv[1], "reduce-size") == 0) LAUNCH(reduce_wrong_size_kernel, 1, 32)((float*)d);
        cudaDeviceSynchronize();
        printf("%s: not caught\n", argv[1]);
        return 0;
    }
    test_scalar_intrinsics();
    test_kernels();
    test_launch_rules();
    test_lazy_streams();
    if (g_failures) {
        fprintf(stderr, "%d failures\n", g_failures);
        return 1;
    }
    printf("emu intrinsics and runtime: all passed\n");
    return 0;
}
