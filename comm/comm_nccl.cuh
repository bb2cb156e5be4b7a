/*
 * comm/comm.h on NCCL, for the GPU build (DESIGN.md section 6). MPI only bootstraps: cudaSetDevice from
 * the launcher's local rank before MPI_Init_thread (then checked against the local rank from
 * MPI_Comm_split_type(MPI_COMM_TYPE_SHARED), which chooses when no launcher variable is set), rank 0's
 * ncclUniqueId sent by MPI_Bcast, then MPI_Barrier before ncclCommInitRank (a broadcast still in flight
 * can deadlock against the blocking init: NVIDIA/cuDecomp#24). Every collective of the step loop is
 * NCCL's, host values included, so no MPI call runs inside it. Built without MPI (make USE_MPI=0), or
 * started without a launcher, the job is one rank, and one rank starts no NCCL: each collective is then
 * what NCCL computes over one rank (a sum or max of one contribution is that contribution, bit for bit),
 * a copy on the communication stream or nothing, so that NCCL's own start-up (bootstrap sockets, /dev/shm)
 * cannot fail a one-GPU run or check. comm_nccl_start creates a one-rank communicator on demand (the
 * nccl_one_rank check of test_llama); streams, events and conversions are the same with or without it.
 *
 * Collectives run on their own non-blocking, high-priority stream, after an event recorded on the
 * compute stream (the legacy default stream, which a non-blocking stream does not synchronize with), so
 * they overlap the kernels queued after them; comm_wait makes the compute stream wait for a marked
 * point, timed with a pair of events so that the time not hidden can be reported per step. Scratch for
 * the FP32 <-> BF16 conversions of --grad-reduce bf16, for the blocks of --grad-reduce fp8 and for
 * accumulating reductions is used by one collective at a time (they are serialized on the stream).
 *
 * --grad-reduce fp8 (comm/grad_fp8.h): NCCL has no FP8 sum (and a sum in FP8 could overflow), so each
 * rank packs its W destination pieces into E4M3 blocks (grad_fp8_pack_cuda), a group of ncclSend /
 * ncclRecv exchanges them with every rank (an all-to-all), and each rank sums the W blocks it received,
 * dequantized, in rank order in FP32 (grad_fp8_sum_cuda): the CPU build's comm_mpi.h bit for bit.
 */
#pragma once

#include <nccl.h>

#include "comm.h"
#include "grad_fp8.cuh"
#include "mpi_bootstrap.h"
#include "../core/cuda_utils.cuh"

static inline void nccl_check(ncclResult_t r, const char* call, const char* file, int line) {
    if (r != ncclSuccess) die("NCCL error at %s:%d: %s: %s (%s)", file, line, call, ncclGetErrorString(r), ncclGetLastError(NULL));
}
#define ncclCheck(call) nccl_check((call), #call, __FILE__, __LINE__)

/* comm_wait timings kept per step; beyond this many waits a step reports what it measured. */
#define COMM_TIMED_WAITS 4096

static ncclComm_t g_nccl = NULL;
static cudaStream_t g_comm_stream = NULL;
static cudaEvent_t g_issue_event;             /* compute stream reached a collective's call */
static cudaEvent_t g_done_event;              /* everything issued so far is done (comm_wait_all) */
static cudaEvent_t g_slot_event[COMM_SLOTS];  /* comm_mark */
static cudaEvent_t g_wait_event[2 * COMM_TIMED_WAITS];
static int g_waits = 0;                       /* timed waits since comm_exposed_ms */
static DeviceScratch g_comm_scratch = {NULL, 0, "comm_scratch"}; /* conversions and accumulation */
static DeviceScratch g_host_scratch = {NULL, 0, "comm_host"};     /* comm_host_* values, COMM_HOST_BYTES */

/* The device buffer of the host-value collectives (comm_host_*), which go through it in pieces: 1 MiB,
   a start-up agreement of 2000 ranks in one piece. */
#define COMM_HOST_BYTES ((size_t)1 << 20)

/* Creates the NCCL communicator of the job's g_dist.world ranks (once): rank 0's unique id, broadcast
   and a barrier under MPI, then ncclCommInitRank. Called by comm_init when world > 1; a one-rank job
   calls it only to test NCCL itself. */
static inline void comm_nccl_start(void) {
    if (g_nccl != NULL) return;
    ncclUniqueId id;
    if (g_dist.rank == 0) ncclCheck(ncclGetUniqueId(&id));
#ifdef LLM8_MPI
    if (mpi_active()) {
        mpiCheck(MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD));
        mpiCheck(MPI_Barrier(MPI_COMM_WORLD));
    }
#endif
    /* connections (and their buffers, the memory plan's nccl_* rows) made here rather than by the first
       collective of each algorithm in step 1 (NCCL 2.22+, NCCL_RUNTIME_CONNECT), unless the user chose; the
       p2p connections of the FP8 wire are made by the trainer's warm-up (dp_warmup) */
    setenv("NCCL_RUNTIME_CONNECT", "0", 0);
    ncclCheck(ncclCommInitRank(&g_nccl, g_dist.world, id, g_dist.rank));
}

/*
 * Selects this process's GPU from the launcher's node-local rank (launcher_local_rank) before MPI_Init:
 * a CUDA-aware MPI (UCX, for one) creates a CUDA context on the current device during init, which is
 * GPU 0 for every local rank unless the device is set first. Returns the index of the variable used in
 * LAUNCHER_LOCAL_RANK_VARS, -1 when the process was not launched, none is set, or its value is not a
 * visible GPU (comm_init's checks after MPI_Init then choose, or name the problem); *local gets the value.
 */
static inline int comm_select_device_before_mpi(int* local) {
    int var = -1, gpus = 0;
    *local = launcher_world() > 0 ? launcher_local_rank(&var) : -1;
    if (*local < 0 || cudaGetDeviceCount(&gpus) != cudaSuccess || *local >= gpus) {
        cudaGetLastError(); /* no device: comm_init names the problem */
        return -1;
    }
    cudaCheck(cudaSetDevice(*local));
    return var;
}

/*
 * After MPI_Init: the device each rank chose before it must be its node-local rank by MPI
 * (MPI_COMM_TYPE_SHARED), the one comm_init uses. Every rank gathers every rank's choice, so all take the
 * same decision: on a mismatch rank 0 names the ranks in one line and every rank exits. Rank 0 says which
 * way the device was chosen, or that no variable chose it and MPI's split does, after MPI_Init.
 */
static inline void comm_check_device_choice(int var, int local) {
    if (!g_dist.launched) return;
    int W = g_dist.world, mine[3] = {var, local, g_dist.local_rank};
    int* all = (int*)mallocCheck((size_t)W * sizeof(mine));
    memcpy(all, mine, sizeof(mine));
#ifdef LLM8_MPI
    if (mpi_active()) mpiCheck(MPI_Allgather(mine, 3, MPI_INT, all, 3, MPI_INT, MPI_COMM_WORLD));
#endif
    int first = -1;
    char ranks[256] = "";
    size_t used = 0;
    for (int r = 0; r < W; r++) {
        if (all[3 * r] < 0 || all[3 * r + 1] == all[3 * r + 2]) continue;
        if (first < 0) first = r;
        if (used + 16 < sizeof(ranks)) used += (size_t)snprintf(ranks + used, sizeof(ranks) - used, "%s%d", used ? ", " : "", r);
    }
    if (first >= 0) {
        const char* name = LAUNCHER_LOCAL_RANK_VARS[all[3 * first]];
        if (g_dist.rank == 0)
            fprintf(stderr, "error: the launcher's node-local rank is not MPI's (MPI_COMM_TYPE_SHARED) on rank(s) %s: rank %d has "
                    "%s=%d where MPI's node-local rank is %d, so the GPU it selected before MPI_Init is not its own; unset %s "
                    "or fix the launch's rank mapping\n", ranks, first, name, all[3 * first + 1], all[3 * first + 2], name);
        fflush(stderr);
        exit(EXIT_FAILURE);
    }
    free(all);
    if (g_dist.rank != 0) return;
    if (var >= 0)
        printf("| GPU selection: %s=%d before MPI_Init, MPI's node-local rank\n", LAUNCHER_LOCAL_RANK_VARS[var], local);
    else
        printf("| GPU selection: MPI's node-local rank %d after MPI_Init: no launcher variable (OMPI_COMM_WORLD_LOCAL_RANK, "
               "MPI_LOCALRANKID, SLURM_LOCALID, LOCAL_RANK) names a visible GPU, so a CUDA-aware MPI may have put a context "
               "on GPU 0\n", g_dist.local_rank);
}

static inline void comm_init(int* argc, char*** argv) {
    int local_before = -1, chosen_by = comm_select_device_before_mpi(&local_before);
    mpi_bootstrap(argc, argv);
    comm_check_device_choice(chosen_by, local_before);
    int gpus = 0;
    cudaError_t err = cudaGetDeviceCount(&gpus);
    if (err != cudaSuccess || gpus == 0)
        die("rank %d on %s: no usable CUDA GPU (%s); the CPU build is train_llama_cpu", g_dist.rank, g_dist.host,
            err != cudaSuccess ? cudaGetErrorString(err) : "0 devices");
    if (g_dist.local_world > gpus)
        die("%s runs %d ranks but has %d visible GPU(s): start at most one rank per GPU (mpirun --map-by ppr:%d:node)",
            g_dist.host, g_dist.local_world, gpus, gpus);
    cudaCheck(cudaSetDevice(g_dist.local_rank));
    if (g_dist.world > 1) comm_nccl_start();
    int least, greatest;
    cudaCheck(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    cudaCheck(cudaStreamCreateWithPriority(&g_comm_stream, cudaStreamNonBlocking, greatest));
    cudaCheck(cudaEventCreateWithFlags(&g_issue_event, cudaEventDisableTiming));
    cudaCheck(cudaEventCreateWithFlags(&g_done_event, cudaEventDisableTiming));
    for (int i = 0; i < COMM_SLOTS; i++) cudaCheck(cudaEventCreateWithFlags(&g_slot_event[i], cudaEventDisableTiming));
    for (int i = 0; i < 2 * COMM_TIMED_WAITS; i++) cudaCheck(cudaEventCreate(&g_wait_event[i]));
}

static inline void comm_finalize(void) {
    cudaCheck(cudaStreamSynchronize(g_comm_stream));
    if (g_nccl != NULL) ncclCheck(ncclCommDestroy(g_nccl));
    mpi_finalize();
}

LLM8_NORETURN static inline void comm_abort(int status) {
    if (g_nccl) ncclCommAbort(g_nccl); /* unblocks kernels waiting for a dead peer */
    mpi_abort_exit(status);
}

static inline int comm_async_error(char* why, size_t len) {
    if (g_nccl == NULL) return 0;
    ncclResult_t r, query = ncclCommGetAsyncError(g_nccl, &r);
    /* a communicator that cannot even say whether it failed is reported, not taken for a healthy one */
    if (query != ncclSuccess) {
        snprintf(why, len, "ncclCommGetAsyncError failed: %s", ncclGetErrorString(query));
        return 1;
    }
    if (r == ncclSuccess || r == ncclInProgress) return 0;
    snprintf(why, len, "NCCL asynchronous error: %s", ncclGetErrorString(r));
    return 1;
}

/* ---------------------------------------------------------------- conversion kernels */

__global__ void comm_to_bf16_kernel(__nv_bfloat16* out, const float* x, size_t n) {
    for (size_t i = grid_index(); i < n; i += grid_stride()) out[i] = f_to_bf16(x[i]);
}

/* out (n) FP32 = x, or out += x when accumulate; x FP32 or BF16 */
template <typename T>
__global__ void comm_store_kernel(float* out, const T* x, size_t n, int accumulate) {
    for (size_t i = grid_index(); i < n; i += grid_stride()) {
        float v = (float)x[i];
        out[i] = accumulate ? out[i] + v : v;
    }
}

/* NCCL's max is not specified for NaN; an amax must stay non-finite, so NaN travels as +Inf. */
__global__ void comm_nan_to_inf_kernel(float* x, size_t n) {
    for (size_t i = grid_index(); i < n; i += grid_stride())
        if (x[i] != x[i]) x[i] = INFINITY;
}

/* ---------------------------------------------------------------- collectives */

/* One rank without a communicator: recv = send (bytes), what any NCCL collective over one rank leaves,
   ordered on the communication stream like the collective it stands for; nothing when in place. */
static inline void comm_one_rank_copy(void* recv, const void* send, size_t bytes) {
    if (recv != send) cudaCheck(cudaMemcpyAsync(recv, send, bytes, cudaMemcpyDeviceToDevice, g_comm_stream));
}

/* The communication stream waits until the compute stream reaches this point. */
static inline void comm_issue(void) {
    cudaCheck(cudaEventRecord(g_issue_event, 0));
    cudaCheck(cudaStreamWaitEvent(g_comm_stream, g_issue_event, 0));
}

/*
 * The FP8 wire's reduce-scatter, world > 1, on the communication stream: recv (n) = [recv +] the sum of
 * every rank's piece `rank` of send (W * n), through `blocks` (2 * W * grad_fp8_block_stride(n) bytes of
 * device scratch: the blocks sent, then those received, each peer's 256-byte aligned; only a block's own
 * bytes travel). recv may be send's own piece (rank * n): the pack reads all of send before the sum writes.
 */
static inline void comm_reduce_scatter_fp8(const float* send, float* recv, size_t n, int accumulate, uint8_t* blocks) {
    int W = g_dist.world;
    size_t bytes = grad_fp8_block_bytes(n), stride = grad_fp8_block_stride(n);
    uint8_t *out = blocks, *in = blocks + (size_t)W * stride;
    grad_fp8_pack_cuda(out, send, n, (size_t)W, g_comm_stream);
    ncclCheck(ncclGroupStart());
    for (int r = 0; r < W; r++) {
        ncclCheck(ncclSend(out + (size_t)r * stride, bytes, ncclUint8, r, g_nccl, g_comm_stream));
        ncclCheck(ncclRecv(in + (size_t)r * stride, bytes, ncclUint8, r, g_nccl, g_comm_stream));
    }
    ncclCheck(ncclGroupEnd());
    grad_fp8_sum_cuda(recv, in, W, n, accumulate, g_comm_stream);
}

static inline void comm_reduce_scatter(const float* send, float* recv, size_t n, int accumulate, CommWire wire) {
    size_t W = (size_t)g_dist.world;
    comm_issue();
    if (wire == WIRE_FP8 && W > 1) {
        uint8_t* blocks = (uint8_t*)scratch_reserve(&g_comm_scratch, 2 * W * grad_fp8_block_stride(n));
        comm_reduce_scatter_fp8(send, recv, n, accumulate, blocks);
        return;
    }
    unsigned int blocks = grid_for(W * n, BLOCK_THREADS);
    if (wire == WIRE_BF16) {
        __nv_bfloat16* tmp = (__nv_bfloat16*)scratch_reserve(&g_comm_scratch, (W + 1) * n * sizeof(__nv_bfloat16));
        LAUNCH(comm_to_bf16_kernel, blocks, BLOCK_THREADS, 0, g_comm_stream)(tmp, send, W * n);
        launchCheck();
        if (g_nccl) ncclCheck(ncclReduceScatter(tmp, tmp + W * n, n, ncclBfloat16, ncclSum, g_nccl, g_comm_stream));
        else comm_one_rank_copy(tmp + W * n, tmp, n * sizeof(__nv_bfloat16));
        LAUNCH(comm_store_kernel<__nv_bfloat16>, grid_for(n, BLOCK_THREADS), BLOCK_THREADS, 0, g_comm_stream)(recv, tmp + W * n, n, accumulate);
        launchCheck();
    } else if (accumulate) {
        float* tmp = (float*)scratch_reserve(&g_comm_scratch, n * sizeof(float));
        if (g_nccl) ncclCheck(ncclReduceScatter(send, tmp, n, ncclFloat, ncclSum, g_nccl, g_comm_stream));
        else comm_one_rank_copy(tmp, send, n * sizeof(float));
        LAUNCH(comm_store_kernel<float>, grid_for(n, BLOCK_THREADS), BLOCK_THREADS, 0, g_comm_stream)(recv, tmp, n, 1);
        launchCheck();
    } else {
        if (g_nccl) ncclCheck(ncclReduceScatter(send, recv, n, ncclFloat, ncclSum, g_nccl, g_comm_stream));
        else comm_one_rank_copy(recv, send, n * sizeof(float));
    }
}

static inline void comm_all_reduce(float* buf, size_t n, CommWire wire) {
    comm_issue();
    if (wire == WIRE_FP8 && g_dist.world > 1) {
        /* buf zero-padded to W pieces of whole chunks, reduce-scattered in place, the FP32 sums all-gathered */
        size_t W = (size_t)g_dist.world, piece = comm_fp8_piece(n, g_dist.world);
        char* scratch = (char*)scratch_reserve(&g_comm_scratch, W * piece * sizeof(float) + 2 * W * grad_fp8_block_stride(piece));
        float* padded = (float*)scratch;
        float* mine = padded + (size_t)g_dist.rank * piece;
        cudaCheck(cudaMemsetAsync(padded + n, 0, (W * piece - n) * sizeof(float), g_comm_stream));
        cudaCheck(cudaMemcpyAsync(padded, buf, n * sizeof(float), cudaMemcpyDeviceToDevice, g_comm_stream));
        comm_reduce_scatter_fp8(padded, mine, piece, 0, (uint8_t*)(scratch + W * piece * sizeof(float)));
        ncclCheck(ncclAllGather(mine, padded, piece, ncclFloat, g_nccl, g_comm_stream));
        cudaCheck(cudaMemcpyAsync(buf, padded, n * sizeof(float), cudaMemcpyDeviceToDevice, g_comm_stream));
        return;
    }
    if (wire == WIRE_BF16) {
        __nv_bfloat16* tmp = (__nv_bfloat16*)scratch_reserve(&g_comm_scratch, n * sizeof(__nv_bfloat16));
        LAUNCH(comm_to_bf16_kernel, grid_for(n, BLOCK_THREADS), BLOCK_THREADS, 0, g_comm_stream)(tmp, buf, n);
        launchCheck();
        if (g_nccl) ncclCheck(ncclAllReduce(tmp, tmp, n, ncclBfloat16, ncclSum, g_nccl, g_comm_stream));
        LAUNCH(comm_store_kernel<__nv_bfloat16>, grid_for(n, BLOCK_THREADS), BLOCK_THREADS, 0, g_comm_stream)(buf, tmp, n, 0);
        launchCheck();
    } else {
        if (g_nccl) ncclCheck(ncclAllReduce(buf, buf, n, ncclFloat, ncclSum, g_nccl, g_comm_stream));
    }
}

static inline void comm_all_reduce_f64(double* buf, size_t n) {
    comm_issue();
    if (g_nccl) ncclCheck(ncclAllReduce(buf, buf, n, ncclDouble, ncclSum, g_nccl, g_comm_stream));
}

static inline void comm_all_reduce_max(float* buf, size_t n) {
    comm_issue();
    LAUNCH(comm_nan_to_inf_kernel, grid_for(n, BLOCK_THREADS), BLOCK_THREADS, 0, g_comm_stream)(buf, n);
    launchCheck();
    if (g_nccl) ncclCheck(ncclAllReduce(buf, buf, n, ncclFloat, ncclMax, g_nccl, g_comm_stream));
}

static inline void comm_all_gather(void* buf, size_t bytes) {
    comm_issue();
    const char* mine = (const char*)buf + (size_t)g_dist.rank * bytes;
    if (g_nccl) ncclCheck(ncclAllGather(mine, buf, bytes, ncclUint8, g_nccl, g_comm_stream));
    else comm_one_rank_copy(buf, mine, bytes);
}

/*
 * NCCL's own device memory for a multi-rank communicator, estimated from its defaults (NVIDIA/nccl
 * src/init.cc computeBuffSizes, src/include/device.h, src/graph/paths.cc, src/transport/p2p.cc and nvls.cc;
 * docs/memory.md): a connection to a peer on a channel holds the buffers of NCCL's three protocols,
 * NCCL_BUFFSIZE (Simple, 4 MiB), NCCL_LL_BUFFSIZE (8 lines x 512 threads x 8 steps x 16 B) and
 * NCCL_LL128_BUFFSIZE (120 x 640 threads x 8 steps x 8 B), 9.2 MiB together; the plan reads those
 * variables as NCCL does. The channel counts are those NCCL reports on an 8-GPU H100/H200 SXM node
 * (NVSwitch): 32 collective channels, 32 p2p channels per peer (2 per NVLink's bandwidth, capped at the
 * p2p channels), 16 NVLS channels; NCCL_MAX_NCHANNELS and NCCL_MAX_P2P_NCHANNELS lower them.
 */
#define NCCL_DEFAULT_BUFFSIZE ((size_t)4 << 20)
#define NCCL_DEFAULT_LL_BUFFSIZE ((size_t)8 * 512 * 8 * 16)
#define NCCL_DEFAULT_LL128_BUFFSIZE ((size_t)120 * 640 * 8 * 8)
#define NCCL_DEFAULT_NVLS_CHUNKSIZE ((size_t)128 << 10) /* NCCL_NVLS_CHUNKSIZE */
#define NCCL_PIPELINE_STEPS 8               /* NCCL_STEPS */
#define PLAN_NODE_GPUS 8
#define PLAN_NCCL_COLL_CHANNELS 32
#define PLAN_NCCL_P2P_CHANNELS_PER_PEER 32
#define PLAN_NCCL_NVLS_CHANNELS 16

/* A NCCL variable's value (a size or a count), `fallback` when unset or not a number. */
static inline size_t nccl_env(const char* name, size_t fallback) {
    const char* v = getenv(name);
    char* end = NULL;
    unsigned long long x = v != NULL ? strtoull(v, &end, 0) : 0;
    return v != NULL && end != v && *end == '\0' ? (size_t)x : fallback;
}

/* The buffers of one connection on one channel, in both directions (send and receive), per NCCL's variables. */
static inline size_t nccl_connection_bytes(void) {
    return nccl_env("NCCL_BUFFSIZE", NCCL_DEFAULT_BUFFSIZE) + nccl_env("NCCL_LL_BUFFSIZE", NCCL_DEFAULT_LL_BUFFSIZE) +
           nccl_env("NCCL_LL128_BUFFSIZE", NCCL_DEFAULT_LL128_BUFFSIZE);
}

/* g_comm_scratch's largest use (--grad-reduce bf16 conversions, --grad-reduce fp8 blocks sent and received
   and, under ZeRO-0, the zero-padded FP32 copy; the ZeRO-2 accumulating reduce-scatter), the host-value
   buffer and NCCL's buffers (estimates). One rank sends nothing: FP8 is then FP32. */
static inline int comm_workspaces(int world, int zero_stage, CommWire wire, size_t largest_piece, size_t largest_segment,
                                  MemoryEstimate* out) {
    size_t W = (size_t)world, scratch = 0;
    int n = 0;
    if (wire == WIRE_FP8 && world > 1) {
        size_t piece = zero_stage > 0 ? largest_piece : comm_fp8_piece(largest_segment, world);
        scratch = 2 * W * grad_fp8_block_stride(piece) + (zero_stage == 0 ? W * piece * sizeof(float) : 0);
    } else if (zero_stage > 0 && wire == WIRE_BF16) scratch = (W + 1) * largest_piece * sizeof(__nv_bfloat16);
    else if (zero_stage == 2) scratch = largest_piece * sizeof(float);
    else if (zero_stage == 0 && wire == WIRE_BF16 && world > 1) scratch = largest_segment * sizeof(__nv_bfloat16);
    if (scratch > 0)
        out[n++] = (MemoryEstimate){"comm_scratch", scratch, 0, "gradient reduction scratch (BF16/FP8 wire, accumulation)", &g_comm_scratch};
    out[n++] = (MemoryEstimate){"comm_host", COMM_HOST_BYTES, 0, "host values (losses, flags, agreement) through NCCL", &g_host_scratch};
    if (world == 1) return n;
    size_t conn = nccl_connection_bytes(), local = W < PLAN_NODE_GPUS ? W : PLAN_NODE_GPUS;
    size_t channels = nccl_env("NCCL_MAX_NCHANNELS", PLAN_NCCL_COLL_CHANNELS);
    size_t p2p = nccl_env("NCCL_MAX_P2P_NCHANNELS", PLAN_NCCL_P2P_CHANNELS_PER_PEER);
    channels = channels < PLAN_NCCL_COLL_CHANNELS ? channels : PLAN_NCCL_COLL_CHANNELS;
    p2p = p2p < PLAN_NCCL_P2P_CHANNELS_PER_PEER ? p2p : PLAN_NCCL_P2P_CHANNELS_PER_PEER;
    out[n++] = (MemoryEstimate){"nccl_buffers", channels * 2 * conn, 1,
                                "NCCL ring and tree connections: channels x 2 x protocol buffers (NCCL_MAX_NCHANNELS, NCCL_BUFFSIZE)", NULL};
    /* the FP8 wire's all-to-all connects to every peer (at its first ncclSend/ncclRecv to it, on all of the
       peer's p2p channels); peers on other nodes go through the network's shared buffers, not counted */
    if (wire == WIRE_FP8)
        out[n++] = (MemoryEstimate){"nccl_p2p", (local - 1) * p2p * conn, 1,
                                    "NCCL p2p connections of the FP8 all-to-all: node peers x p2p channels x protocol buffers "
                                    "(NCCL_MAX_P2P_NCHANNELS, NCCL_BUFFSIZE)", NULL};
    /* NVLink SHARP (NVSwitch nodes, CUDA 12.1+; NCCL_NVLS_ENABLE=0 turns it off): per rank a send and a
       receive buffer per channel and per node rank (the heads), NCCL_STEPS chunks each */
    if (local > 1 && nccl_env("NCCL_NVLS_ENABLE", 2) != 0)
        out[n++] = (MemoryEstimate){"nccl_nvls", nccl_env("NCCL_NVLS_NCHANNELS", PLAN_NCCL_NVLS_CHANNELS) * 2 *
                                                     nccl_env("NCCL_NVLS_CHUNKSIZE", NCCL_DEFAULT_NVLS_CHUNKSIZE) * NCCL_PIPELINE_STEPS * local,
                                    1, "NCCL NVLink SHARP buffers where NCCL may use it (NCCL_NVLS_ENABLE, NCCL_NVLS_CHUNKSIZE)", NULL};
    return n;
}

static inline void comm_mark(int slot) { cudaCheck(cudaEventRecord(g_slot_event[slot], g_comm_stream)); }

/* The compute stream waits for `done` (recorded on the communication stream), timed when events remain. */
static inline void comm_wait_event(cudaEvent_t done) {
    int timed = g_waits < COMM_TIMED_WAITS;
    if (timed) cudaCheck(cudaEventRecord(g_wait_event[2 * g_waits], 0));
    cudaCheck(cudaStreamWaitEvent(0, done, 0));
    if (timed) cudaCheck(cudaEventRecord(g_wait_event[2 * g_waits + 1], 0));
    g_waits += timed;
}

static inline void comm_wait(int slot) { comm_wait_event(g_slot_event[slot]); }

static inline void comm_wait_all(void) {
    cudaCheck(cudaEventRecord(g_done_event, g_comm_stream));
    comm_wait_event(g_done_event);
}

static inline double comm_exposed_ms(void) {
    double total = 0.0;
    if (g_waits > 0) cudaCheck(cudaEventSynchronize(g_wait_event[2 * g_waits - 1]));
    for (int i = 0; i < g_waits; i++) {
        float ms;
        cudaCheck(cudaEventElapsedTime(&ms, g_wait_event[2 * i], g_wait_event[2 * i + 1]));
        total += ms;
    }
    g_waits = 0;
    return total;
}

/* ---------------------------------------------------------------- host values */

/* x (n) on every rank = op over ranks, through the host-value buffer and NCCL (no MPI in the step loop),
   COMM_HOST_BYTES at a time (elementwise, so the pieces are independent). */
static inline void comm_host_reduce(double* x, size_t n, ncclRedOp_t op) {
    double* d = (double*)scratch_reserve(&g_host_scratch, COMM_HOST_BYTES);
    for (size_t k = 0; k < n; k += COMM_HOST_BYTES / sizeof(double)) {
        size_t len = n - k < COMM_HOST_BYTES / sizeof(double) ? n - k : COMM_HOST_BYTES / sizeof(double);
        cudaCheck(cudaMemcpy(d, x + k, len * sizeof(double), cudaMemcpyHostToDevice));
        comm_issue();
        if (g_nccl) ncclCheck(ncclAllReduce(d, d, len, ncclDouble, op, g_nccl, g_comm_stream));
        cudaCheck(cudaStreamSynchronize(g_comm_stream));
        cudaCheck(cudaMemcpy(x + k, d, len * sizeof(double), cudaMemcpyDeviceToHost));
    }
}

static inline void comm_host_sum(double* x, size_t n) { comm_host_reduce(x, n, ncclSum); }
static inline void comm_host_max(double* x, size_t n) { comm_host_reduce(x, n, ncclMax); }

static inline void comm_host_broadcast(void* x, size_t bytes, int root) {
    char* d = (char*)scratch_reserve(&g_host_scratch, COMM_HOST_BYTES);
    for (size_t k = 0; k < bytes; k += COMM_HOST_BYTES) {
        size_t len = bytes - k < COMM_HOST_BYTES ? bytes - k : COMM_HOST_BYTES;
        cudaCheck(cudaMemcpy(d, (char*)x + k, len, cudaMemcpyHostToDevice));
        comm_issue();
        if (g_nccl) ncclCheck(ncclBroadcast(d, d, len, ncclUint8, root, g_nccl, g_comm_stream));
        cudaCheck(cudaStreamSynchronize(g_comm_stream));
        cudaCheck(cudaMemcpy((char*)x + k, d, len, cudaMemcpyDeviceToHost));
    }
}

/* Piece by piece of each rank's `mine`: COMM_HOST_BYTES / world bytes of every rank at a time. */
static inline void comm_host_all_gather(const void* mine, void* all, size_t bytes) {
    size_t W = (size_t)g_dist.world, R = (size_t)g_dist.rank, step = COMM_HOST_BYTES / W;
    if (step == 0) die("comm_host_all_gather: %zu ranks do not fit the %zu-byte host-value buffer", W, COMM_HOST_BYTES);
    char* d = (char*)scratch_reserve(&g_host_scratch, COMM_HOST_BYTES);
    for (size_t k = 0; k < bytes; k += step) {
        size_t len = bytes - k < step ? bytes - k : step;
        cudaCheck(cudaMemcpy(d + R * len, (const char*)mine + k, len, cudaMemcpyHostToDevice));
        comm_issue();
        if (g_nccl) ncclCheck(ncclAllGather(d + R * len, d, len, ncclUint8, g_nccl, g_comm_stream));
        cudaCheck(cudaStreamSynchronize(g_comm_stream));
        for (size_t r = 0; r < W; r++) cudaCheck(cudaMemcpy((char*)all + r * bytes + k, d + r * len, len, cudaMemcpyDeviceToHost));
    }
}

/* The all-reduce waits for the compute stream's work so far (comm_issue) and the host for it, so the
   device has finished everything queued before the barrier: no cudaDeviceSynchronize needed. */
static inline void comm_barrier(void) {
    double x = 0.0;
    comm_host_sum(&x, 1);
}
