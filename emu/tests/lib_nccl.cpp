/*
 * Drives the NCCL double (emu/nccl.cpp) for dev/test/test_emu_libs.py, bootstrapped as llm8 does it
 * (comm/comm_nccl.cuh: rank 0's unique id over MPI_Bcast, MPI_Barrier, ncclCommInitRank). Modes:
 *   collectives DIR  every collective llm8 uses plus a grouped send/recv all-to-all, on a non-blocking
 *                    stream; writes each rank's inputs and outputs to DIR/r<rank>_<name>.bin for numpy
 *   stream_wait W    an out-of-place all-reduce on a non-blocking stream, read back on the legacy stream
 *                    with (W=1) or without (W=0) cudaStreamWaitEvent on the collective's event; prints
 *                    "value <first element> expected <sum>"
 *   issue_wait W     the legacy stream copies the input, then an all-reduce on the non-blocking stream
 *                    with (W=1) or without (W=0) waiting for an event recorded after the copy
 *   bad_pointer      an all-reduce of host memory: prints NCCL's result name
 *   overlap          an all-reduce whose buffers overlap without being in place (stops the run)
 *   mismatch         rank 0 and the others issue different all-reduces (stops the run)
 */
#define OMPI_SKIP_MPICXX 1
#include <mpi.h>
#include <nccl.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

static int g_rank = 0, g_world = 1;

#define CHECK_NCCL(call)                                                                             \
    do {                                                                                             \
        ncclResult_t r_ = (call);                                                                    \
        if (r_ != ncclSuccess) {                                                                     \
            fprintf(stderr, "rank %d: %s: %s (%s)\n", g_rank, #call, ncclGetErrorString(r_), ncclGetLastError(NULL)); \
            exit(1);                                                                                 \
        }                                                                                            \
    } while (0)

/* A float with a full mantissa and a spread of exponents, from (rank, i): sums then round. */
static float value(int rank, size_t i, int salt) {
    uint32_t h = (uint32_t)(rank * 2654435761u) ^ (uint32_t)(i * 40503u + salt * 977u);
    h ^= h >> 15; h *= 2246822519u; h ^= h >> 13; h *= 3266489917u; h ^= h >> 16;
    float mant = (float)(h & 0xffffff) / (float)(1 << 24) - 0.5f;
    return ldexpf(mant, (int)((h >> 24) % 12) - 4);
}

static void* device(const void* host, size_t bytes) {
    void* p;
    cudaMalloc(&p, bytes);
    if (host) cudaMemcpy(p, host, bytes, cudaMemcpyHostToDevice);
    return p;
}

static void dump(const std::string& dir, const char* name, const void* dev, size_t bytes) {
    std::vector<char> host(bytes);
    cudaMemcpy(host.data(), dev, bytes, cudaMemcpyDeviceToHost);
    std::string path = dir + "/r" + std::to_string(g_rank) + "_" + name + ".bin";
    FILE* f = fopen(path.c_str(), "wb");
    fwrite(host.data(), 1, bytes, f);
    fclose(f);
}

static void collectives(ncclComm_t comm, cudaStream_t s, const std::string& dir) {
    const size_t n = 1003; /* not a multiple of anything */
    const size_t W = (size_t)g_world;
    std::vector<float> f(W * n);
    std::vector<double> d(n);
    std::vector<__nv_bfloat16> h(W * n);
    std::vector<uint8_t> bytes(W * n);
    for (size_t i = 0; i < W * n; i++) {
        f[i] = value(g_rank, i, 1);
        h[i] = __float2bfloat16_rn(value(g_rank, i, 2));
        bytes[i] = (uint8_t)(g_rank * 31 + i * 7);
    }
    for (size_t i = 0; i < n; i++) d[i] = (double)value(g_rank, i, 3) * (1.0 + 1e-12 * (double)i);
    f[5] = g_rank == 1 ? NAN : 1.0f; /* max: NaN on one rank must win */
    f[6] = g_rank == 0 ? -INFINITY : -1.0f;

    float* f_in = (float*)device(f.data(), n * 4);
    float* f_out = (float*)device(nullptr, n * 4);
    float* f_inplace = (float*)device(f.data(), n * 4);
    float* f_max = (float*)device(f.data(), n * 4);
    double* d_buf = (double*)device(d.data(), n * 8);
    __nv_bfloat16* h_buf = (__nv_bfloat16*)device(h.data(), n * 2);
    float* rs_in = (float*)device(f.data(), W * n * 4);
    float* rs_out = (float*)device(nullptr, n * 4);
    __nv_bfloat16* rsh_in = (__nv_bfloat16*)device(h.data(), W * n * 2);
    __nv_bfloat16* rsh_out = (__nv_bfloat16*)device(nullptr, n * 2);
    uint8_t* ag = (uint8_t*)device(nullptr, W * n);
    cudaMemcpy(ag + g_rank * n, bytes.data(), n, cudaMemcpyHostToDevice);
    uint8_t* bc = (uint8_t*)device(bytes.data(), n);
    uint8_t* a2a_in = (uint8_t*)device(bytes.data(), W * n);
    uint8_t* a2a_out = (uint8_t*)device(nullptr, W * n);
    dump(dir, "f_in", f_in, n * 4);
    dump(dir, "d_in", d_buf, n * 8);
    dump(dir, "h_in", h_buf, n * 2);
    dump(dir, "rs_in", rs_in, W * n * 4);
    dump(dir, "rsh_in", rsh_in, W * n * 2);
    dump(dir, "bytes_in", a2a_in, W * n);

    CHECK_NCCL(ncclAllReduce(f_in, f_out, n, ncclFloat, ncclSum, comm, s));
    CHECK_NCCL(ncclAllReduce(f_inplace, f_inplace, n, ncclFloat, ncclSum, comm, s));
    CHECK_NCCL(ncclAllReduce(f_max, f_max, n, ncclFloat, ncclMax, comm, s));
    CHECK_NCCL(ncclAllReduce(d_buf, d_buf, n, ncclDouble, ncclSum, comm, s));
    CHECK_NCCL(ncclAllReduce(h_buf, h_buf, n, ncclBfloat16, ncclSum, comm, s));
    CHECK_NCCL(ncclReduceScatter(rs_in, rs_out, n, ncclFloat, ncclSum, comm, s));
    CHECK_NCCL(ncclReduceScatter(rsh_in, rsh_out, n, ncclBfloat16, ncclSum, comm, s));
    CHECK_NCCL(ncclAllGather(ag + g_rank * n, ag, n, ncclUint8, comm, s));
    CHECK_NCCL(ncclBroadcast(bc, bc, n, ncclUint8, g_world - 1, comm, s));
    CHECK_NCCL(ncclGroupStart()); /* the FP8 gradient all-to-all's pattern: block j to rank j */
    for (int peer = 0; peer < g_world; peer++) {
        CHECK_NCCL(ncclSend(a2a_in + peer * n, n, ncclUint8, peer, comm, s));
        CHECK_NCCL(ncclRecv(a2a_out + peer * n, n, ncclUint8, peer, comm, s));
    }
    CHECK_NCCL(ncclGroupEnd());
    cudaStreamSynchronize(s);
    ncclResult_t async;
    CHECK_NCCL(ncclCommGetAsyncError(comm, &async));
    if (async != ncclSuccess) { fprintf(stderr, "async error %d\n", (int)async); exit(1); }
    dump(dir, "f_out", f_out, n * 4);
    dump(dir, "f_inplace", f_inplace, n * 4);
    dump(dir, "f_max", f_max, n * 4);
    dump(dir, "d_out", d_buf, n * 8);
    dump(dir, "h_out", h_buf, n * 2);
    dump(dir, "rs_out", rs_out, n * 4);
    dump(dir, "rsh_out", rsh_out, n * 2);
    dump(dir, "ag_out", ag, W * n);
    dump(dir, "bc_out", bc, n);
    dump(dir, "a2a_out", a2a_out, W * n);
}

/* comm_nccl.cuh's pattern: issue event on the legacy stream, collective on the comm stream, then the
   legacy stream reads the result (after waiting for the collective's event when `wait`). */
static void stream_wait(ncclComm_t comm, cudaStream_t s, int wait) {
    const size_t n = 64;
    std::vector<float> x(n, (float)(g_rank + 1));
    float* in = (float*)device(x.data(), n * 4);
    float* out = (float*)device(nullptr, n * 4);
    cudaEvent_t issue, done;
    cudaEventCreateWithFlags(&issue, cudaEventDisableTiming);
    cudaEventCreateWithFlags(&done, cudaEventDisableTiming);
    cudaEventRecord(issue, 0);
    cudaStreamWaitEvent(s, issue, 0);
    CHECK_NCCL(ncclAllReduce(in, out, n, ncclFloat, ncclSum, comm, s));
    cudaEventRecord(done, s);
    if (wait) cudaStreamWaitEvent(0, done, 0);
    std::vector<float> y(n);
    cudaMemcpy(y.data(), out, n * 4, cudaMemcpyDeviceToHost);
    cudaDeviceSynchronize();
    printf("value %g expected %g\n", y[0], g_world * (g_world + 1) / 2.0);
}

/* comm_issue's pattern: the legacy stream produces the input, the collective on the comm stream reads it,
   after an event recorded on the legacy stream (wait=1) or without it (wait=0, the planted fault). */
static void issue_wait(ncclComm_t comm, cudaStream_t s, int wait) {
    const size_t n = 64;
    std::vector<float> x(n, (float)(g_rank + 1));
    float* src = (float*)device(x.data(), n * 4);
    float* in = (float*)device(nullptr, n * 4);
    float* out = (float*)device(nullptr, n * 4);
    cudaMemcpyAsync(in, src, n * 4, cudaMemcpyDeviceToDevice, 0); /* the "compute" on the legacy stream */
    if (wait) {
        cudaEvent_t issue;
        cudaEventCreateWithFlags(&issue, cudaEventDisableTiming);
        cudaEventRecord(issue, 0);
        cudaStreamWaitEvent(s, issue, 0);
    }
    CHECK_NCCL(ncclAllReduce(in, out, n, ncclFloat, ncclSum, comm, s));
    cudaDeviceSynchronize();
    std::vector<float> y(n);
    cudaMemcpy(y.data(), out, n * 4, cudaMemcpyDeviceToHost);
    printf("value %g expected %g\n", y[0], g_world * (g_world + 1) / 2.0);
}

int main(int argc, char** argv) {
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_world);
    std::string mode = argc > 1 ? argv[1] : "collectives";
    ncclUniqueId id;
    if (g_rank == 0) CHECK_NCCL(ncclGetUniqueId(&id));
    MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD);
    MPI_Barrier(MPI_COMM_WORLD);
    ncclComm_t comm;
    CHECK_NCCL(ncclCommInitRank(&comm, g_world, id, g_rank));
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    if (mode == "collectives") collectives(comm, s, argc > 2 ? argv[2] : ".");
    else if (mode == "stream_wait") stream_wait(comm, s, argc > 2 ? atoi(argv[2]) : 1);
    else if (mode == "issue_wait") issue_wait(comm, s, argc > 2 ? atoi(argv[2]) : 1);
    else if (mode == "overlap") { /* recvbuff one element past sendbuff: not nccl.h's in-place form */
        float* buf = (float*)device(nullptr, 17 * 4);
        CHECK_NCCL(ncclAllReduce(buf, buf + 1, 16, ncclFloat, ncclSum, comm, s));
    } else if (mode == "mismatch") { /* rank 0 reduces 16 elements, the others 32: real NCCL would hang */
        float* buf = (float*)device(nullptr, 32 * 4);
        CHECK_NCCL(ncclAllReduce(buf, buf, g_rank == 0 ? 16 : 32, ncclFloat, ncclSum, comm, s));
    } else if (mode == "bad_pointer") {
        float host[16];
        printf("result %s\n", ncclGetErrorString(ncclAllReduce(host, host, 16, ncclFloat, ncclSum, comm, s)));
    }
    cudaStreamSynchronize(s);
    CHECK_NCCL(ncclCommDestroy(comm));
    MPI_Finalize();
    return 0;
}
