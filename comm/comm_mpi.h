/*
 * comm/comm.h on MPI, for the CPU build: collectives on host memory, each finished before it returns.
 * Sums over ranks are computed here, in rank order, rather than by MPI_Allreduce / MPI_Reduce_scatter
 * (whose order MPI leaves open): the pieces are exchanged with MPI_Alltoall / MPI_Allgather and added
 * one rank after the other, so results do not depend on the rank count (comm/comm.h, Determinism).
 * --grad-reduce fp8 exchanges comm/grad_fp8.h's blocks (E4M3 codes and per-chunk scale_inv) with
 * MPI_Alltoall and sums them dequantized, in rank order, in FP32 (deterministic for a fixed rank count;
 * the quantization itself depends on how the ranks split the gradient).
 * Built without MPI (make USE_MPI=0) the job is one rank; a launcher announcing more is an error.
 */
#pragma once

#include <limits.h>

#include "comm.h"
#include "grad_fp8.h"
#include "mpi_bootstrap.h"
#include "../core/op_record.h"
#include "../fp8/fp8.h"

/* Elements per MPI call: MPI counts are ints. (dev/tools/numerics.c defines a small one, so that its
   collectives under mpirun cross the split with small inputs.) */
#ifndef MPI_MAX_COUNT
#define MPI_MAX_COUNT ((size_t)1 << 28)
#endif

static double g_comm_seconds = 0.0; /* time spent in collectives since comm_exposed_ms last read it */

/* Bytes n elements of a gradient reduction send on the wire (grad_fp8.h's blocks on the FP8 wire). */
static inline double comm_wire_bytes(size_t n, CommWire wire) {
    return wire == WIRE_FP8 ? (double)grad_fp8_block_stride(n) : (wire == WIRE_BF16 ? 2.0 : 4.0) * n;
}

static inline void comm_init(int* argc, char*** argv) { mpi_bootstrap(argc, argv); }

static inline void comm_finalize(void) { mpi_finalize(); }

LLM8_NORETURN static inline void comm_abort(int status) { mpi_abort_exit(status); }

static inline int comm_async_error(char* why, size_t len) {
    (void)why;
    (void)len;
    return 0; /* MPI reports errors at the call, which stops there */
}

/* ---------------------------------------------------------------- collectives */

/* BF16 on the wire: what a contribution becomes when it travels as BF16. */
static inline float wire_value(float x, CommWire wire) { return wire == WIRE_BF16 ? bf16_round(x) : x; }

/*
 * all (world * n) = every rank's x (n), in rank order, in pieces of at most MPI_MAX_COUNT elements
 * (all is laid out rank-major for each piece: piece p of rank r at r * len).
 */
static inline void comm_exchange(const float* x, float* all, size_t begin, size_t len) {
#ifdef LLM8_MPI
    if (mpi_active()) {
        mpiCheck(MPI_Allgather(x + begin, (int)len, MPI_FLOAT, all, (int)len, MPI_FLOAT, MPI_COMM_WORLD));
        return;
    }
#endif
    memcpy(all, x + begin, len * sizeof(float));
}

/* Elements per FP8 exchange: whole chunks (a chunk's scale must not depend on the split), few enough that
   a rank's block stays within MPI's int count. */
static inline size_t comm_fp8_step(int W) {
    size_t step = MPI_MAX_COUNT / (size_t)W / ZERO_CHUNK * ZERO_CHUNK;
    return step > 0 ? step : ZERO_CHUNK;
}

/*
 * comm_reduce_scatter on the FP8 wire, world > 1: each rank packs its W destination pieces
 * (grad_fp8_pack), MPI_Alltoall swaps the blocks, and each rank sums the W blocks it received
 * (grad_fp8_sum, rank order, FP32), in exchanges of comm_fp8_step elements. recv may be send's own
 * piece (rank * n): each exchange packs its elements before writing them.
 */
static inline void comm_reduce_scatter_fp8(const float* send, float* recv, size_t n, int accumulate) {
#ifdef LLM8_MPI
    int W = g_dist.world;
    size_t step = comm_fp8_step(W);
    size_t cap = grad_fp8_block_stride(n < step ? n : step);
    /* zeroed: the padding after each block travels too (MPI_Alltoall's counts are equal) */
    uint8_t* out = (uint8_t*)callocCheck((size_t)W * cap + 1, 1);
    uint8_t* in = (uint8_t*)mallocCheck((size_t)W * cap + 1);
    for (size_t begin = 0; begin < n; begin += step) {
        size_t len = n - begin < step ? n - begin : step, stride = grad_fp8_block_stride(len);
        for (int r = 0; r < W; r++) grad_fp8_pack(out + (size_t)r * stride, send + (size_t)r * n + begin, len);
        mpiCheck(MPI_Alltoall(out, (int)stride, MPI_BYTE, in, (int)stride, MPI_BYTE, MPI_COMM_WORLD));
        grad_fp8_sum(recv + begin, in, W, len, accumulate);
    }
    free(out);
    free(in);
#else
    (void)send;
    (void)recv;
    (void)n;
    (void)accumulate;
    die("--grad-reduce fp8 on %d ranks needs the MPI build", g_dist.world);
#endif
}

/*
 * comm_all_reduce on the FP8 wire, world > 1: buf zero-padded to W pieces of comm_fp8_piece(n, W)
 * elements, reduce-scattered (comm_reduce_scatter_fp8), then the FP32 sums all-gathered, so every rank
 * holds the same bits.
 */
static inline void comm_all_reduce_fp8(float* buf, size_t n) {
#ifdef LLM8_MPI
    int W = g_dist.world;
    size_t piece = comm_fp8_piece(n, W), step = MPI_MAX_COUNT / (size_t)W;
    float* padded = (float*)callocCheck((size_t)W * piece + 1, sizeof(float));
    memcpy(padded, buf, n * sizeof(float));
    float* mine = padded + (size_t)g_dist.rank * piece;
    comm_reduce_scatter_fp8(padded, mine, piece, 0);
    float* all = (float*)mallocCheck((size_t)W * (piece < step ? piece : step) * sizeof(float) + 1);
    for (size_t begin = 0; begin < piece; begin += step) {
        size_t len = piece - begin < step ? piece - begin : step;
        mpiCheck(MPI_Allgather(mine + begin, (int)len, MPI_FLOAT, all, (int)len, MPI_FLOAT, MPI_COMM_WORLD));
        for (int r = 0; r < W; r++) {
            size_t at = (size_t)r * piece + begin; /* where rank r's part lands in buf */
            if (at < n) memcpy(buf + at, all + (size_t)r * len, (n - at < len ? n - at : len) * sizeof(float));
        }
    }
    free(all);
    free(padded);
#else
    (void)buf;
    (void)n;
    die("--grad-reduce fp8 on %d ranks needs the MPI build", g_dist.world);
#endif
}

static inline void comm_reduce_scatter(const float* send, float* recv, size_t n, int accumulate, CommWire wire) {
    RECORD("reduce_scatter", "collective", {n, (size_t)g_dist.world, (size_t)accumulate},
                g_dist.world * comm_wire_bytes(n, wire), 0, 0, COMM_WIRE_NAMES[wire]);
    double t0 = wall_seconds();
    int W = g_dist.world;
    if (wire == WIRE_FP8 && W > 1) {
        comm_reduce_scatter_fp8(send, recv, n, accumulate);
        g_comm_seconds += wall_seconds() - t0;
        return;
    }
    size_t step = MPI_MAX_COUNT / (size_t)W;
    float* parts = (float*)mallocCheck((size_t)W * (n < step ? n : step) * sizeof(float) + 1);
    for (size_t begin = 0; begin < n; begin += step) {
        size_t len = n - begin < step ? n - begin : step;
        if (W == 1) {
            memcpy(parts, send + begin, len * sizeof(float));
        } else {
#ifdef LLM8_MPI
            /* rank r receives every rank's [r * n + begin, + len) */
            float* mine = (float*)mallocCheck((size_t)W * len * sizeof(float));
            for (int r = 0; r < W; r++) memcpy(mine + (size_t)r * len, send + (size_t)r * n + begin, len * sizeof(float));
            mpiCheck(MPI_Alltoall(mine, (int)len, MPI_FLOAT, parts, (int)len, MPI_FLOAT, MPI_COMM_WORLD));
            free(mine);
#endif
        }
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < len; i++) {
            float acc = accumulate ? recv[begin + i] + wire_value(parts[i], wire) : wire_value(parts[i], wire);
            for (int r = 1; r < W; r++) acc += wire_value(parts[(size_t)r * len + i], wire);
            recv[begin + i] = acc;
        }
    }
    free(parts);
    g_comm_seconds += wall_seconds() - t0;
}

static inline void comm_all_reduce(float* buf, size_t n, CommWire wire) {
    RECORD("all_reduce", "collective", {n, (size_t)g_dist.world}, comm_wire_bytes(n, wire), 0, 0, COMM_WIRE_NAMES[wire]);
    double t0 = wall_seconds();
    int W = g_dist.world;
    if (wire == WIRE_FP8 && W > 1) {
        comm_all_reduce_fp8(buf, n);
        g_comm_seconds += wall_seconds() - t0;
        return;
    }
    size_t step = MPI_MAX_COUNT / (size_t)W;
    float* all = (float*)mallocCheck((size_t)W * (n < step ? n : step) * sizeof(float) + 1);
    for (size_t begin = 0; begin < n; begin += step) {
        size_t len = n - begin < step ? n - begin : step;
        comm_exchange(buf, all, begin, len);
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < len; i++) {
            float acc = wire_value(all[i], wire);
            for (int r = 1; r < W; r++) acc += wire_value(all[(size_t)r * len + i], wire);
            buf[begin + i] = acc;
        }
    }
    free(all);
    g_comm_seconds += wall_seconds() - t0;
}

/* comm_all_reduce_f64 and comm_host_sum, unrecorded. */
static inline void comm_sum_f64(double* buf, size_t n) {
#ifdef LLM8_MPI
    if (!mpi_active()) return;
    double t0 = wall_seconds();
    for (size_t begin = 0; begin < n; begin += MPI_MAX_COUNT) {
        size_t len = n - begin < MPI_MAX_COUNT ? n - begin : MPI_MAX_COUNT;
        mpiCheck(MPI_Allreduce(MPI_IN_PLACE, buf + begin, (int)len, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD));
    }
    g_comm_seconds += wall_seconds() - t0;
#else
    (void)buf;
    (void)n;
#endif
}

static inline void comm_all_reduce_f64(double* buf, size_t n) {
    RECORD("all_reduce_f64", "collective", {n, (size_t)g_dist.world}, 8.0 * n, 0, 0, "f64");
    comm_sum_f64(buf, n);
}

static inline void comm_all_reduce_max(float* buf, size_t n) {
    RECORD("all_reduce_max", "collective", {n, (size_t)g_dist.world}, 4.0 * n, 0, 0, "fp32");
#ifdef LLM8_MPI
    if (!mpi_active()) return;
    double t0 = wall_seconds();
    /* MPI_MAX of floats drops NaN on some MPIs; amax must stay NaN (fp8.h amax_combine), so gather and combine */
    int W = g_dist.world;
    float* all = (float*)mallocCheck((size_t)W * n * sizeof(float) + 1);
    for (size_t begin = 0; begin < n; begin += MPI_MAX_COUNT / (size_t)W) {
        size_t len = n - begin < MPI_MAX_COUNT / (size_t)W ? n - begin : MPI_MAX_COUNT / (size_t)W;
        comm_exchange(buf, all, begin, len);
        for (size_t i = 0; i < len; i++) {
            float a = all[i];
            for (int r = 1; r < W; r++) a = amax_combine(a, all[(size_t)r * len + i]);
            buf[begin + i] = a;
        }
    }
    free(all);
    g_comm_seconds += wall_seconds() - t0;
#else
    (void)buf;
    (void)n;
#endif
}

static inline void comm_all_gather(void* buf, size_t bytes) {
    RECORD("all_gather", "collective", {bytes, (size_t)g_dist.world}, g_dist.world * op_record_bytes(buf, bytes), 0, 0,
                "bytes");
#ifdef LLM8_MPI
    if (!mpi_active()) return;
    double t0 = wall_seconds();
    if (bytes > (size_t)INT_MAX) die("all-gather of %zu bytes per rank exceeds MPI's int count", bytes);
    mpiCheck(MPI_Allgather(MPI_IN_PLACE, 0, MPI_BYTE, buf, (int)bytes, MPI_BYTE, MPI_COMM_WORLD));
    g_comm_seconds += wall_seconds() - t0;
#else
    (void)buf;
    (void)bytes;
#endif
}

/* The host temporaries of the reductions above (freed after each call, so they count at the peak only):
   a reduce-scatter's received parts and send staging, world pieces each; an all-reduce's world copies;
   on the FP8 wire the blocks sent and received (world each), and for the all-reduce its zero-padded
   copy and the all-gather's FP32 pieces. One rank sends nothing: FP8 is then FP32. */
static inline int comm_workspaces(int world, int zero_stage, CommWire wire, size_t largest_piece, size_t largest_segment,
                                  MemoryEstimate* out) {
    size_t W = (size_t)world;
    if (wire == WIRE_FP8 && world > 1) {
        if (zero_stage > 0) {
            out[0] = (MemoryEstimate){"mpi_fp8_reduce_scatter", 2 * W * grad_fp8_block_stride(largest_piece), 0,
                                      "FP8 reduce-scatter blocks (host)", NULL};
            return 1;
        }
        size_t piece = comm_fp8_piece(largest_segment, world);
        out[0] = (MemoryEstimate){"mpi_fp8_all_reduce", 2 * W * piece * sizeof(float) + 2 * W * grad_fp8_block_stride(piece), 0,
                                  "FP8 all-reduce padding, blocks and gather (host)", NULL};
        return 1;
    }
    if (zero_stage > 0) {
        out[0] = (MemoryEstimate){"mpi_reduce_scatter", 2 * W * largest_piece * sizeof(float), 0, "reduce-scatter staging (host)", NULL};
        return 1;
    }
    if (world == 1) return 0;
    out[0] = (MemoryEstimate){"mpi_all_reduce", W * largest_segment * sizeof(float), 0, "all-reduce staging (host)", NULL};
    return 1;
}

/* Nothing to mark or wait for here (every collective has finished); recorded, as the GPU's stream order. */
static inline void comm_mark(int slot) { RECORD("mark", "sync", {(size_t)slot}, 0, 0, 0, ""); }
static inline void comm_wait(int slot) { RECORD("wait", "sync", {(size_t)slot}, 0, 0, 0, ""); }
static inline void comm_wait_all(void) { RECORD("wait_all", "sync", {0}, 0, 0, 0, ""); }

static inline double comm_exposed_ms(void) {
    double ms = g_comm_seconds * 1e3;
    g_comm_seconds = 0.0;
    return ms;
}

/* ---------------------------------------------------------------- host values */

static inline void comm_host_sum(double* x, size_t n) {
    RECORD("host_sum", "collective", {n, (size_t)g_dist.world}, 8.0 * n, 0, 0, "host f64");
    comm_sum_f64(x, n);
}

static inline void comm_host_max(double* x, size_t n) {
    RECORD("host_max", "collective", {n, (size_t)g_dist.world}, 8.0 * n, 0, 0, "host f64");
#ifdef LLM8_MPI
    if (!mpi_active()) return;
    if (n > (size_t)INT_MAX) die("host max over %zu values", n);
    mpiCheck(MPI_Allreduce(MPI_IN_PLACE, x, (int)n, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
#else
    (void)x;
    (void)n;
#endif
}

static inline void comm_host_broadcast(void* x, size_t bytes, int root) {
    RECORD("host_broadcast", "collective", {bytes, (size_t)g_dist.world}, bytes, 0, 0, "host bytes");
#ifdef LLM8_MPI
    if (!mpi_active()) return;
    if (bytes > (size_t)INT_MAX) die("broadcast of %zu bytes exceeds MPI's int count", bytes);
    mpiCheck(MPI_Bcast(x, (int)bytes, MPI_BYTE, root, MPI_COMM_WORLD));
#else
    (void)x;
    (void)bytes;
    (void)root;
#endif
}

static inline void comm_host_all_gather(const void* mine, void* all, size_t bytes) {
    RECORD("host_all_gather", "collective", {bytes, (size_t)g_dist.world}, (double)g_dist.world * bytes, 0, 0,
                "host bytes");
#ifdef LLM8_MPI
    if (mpi_active()) {
        if (bytes > (size_t)INT_MAX) die("all-gather of %zu bytes exceeds MPI's int count", bytes);
        mpiCheck(MPI_Allgather(mine, (int)bytes, MPI_BYTE, all, (int)bytes, MPI_BYTE, MPI_COMM_WORLD));
        return;
    }
#endif
    memcpy(all, mine, bytes);
}

static inline void comm_barrier(void) {
    RECORD("barrier", "collective", {(size_t)g_dist.world}, 0, 0, 0, "");
#ifdef LLM8_MPI
    if (mpi_active()) mpiCheck(MPI_Barrier(MPI_COMM_WORLD));
#endif
}
