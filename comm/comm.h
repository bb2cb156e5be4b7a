/*
 * The communication contract of data-parallel training (DESIGN.md section 6), implemented twice: with MPI
 * collectives on host memory for the CPU build (comm/comm_mpi.h) and with NCCL on device memory for the GPU
 * build (comm/comm_nccl.cuh, MPI only to bootstrap). Each implementation includes this header and then
 * defines every function below, so a drifting signature fails to compile as llama/backend.h's contract does.
 *
 * Ordering. A collective is issued after all work queued so far (on the GPU: it runs on the
 * communication stream once the compute stream has reached the call) and may still be running when it
 * returns; comm_mark(slot) remembers "everything issued so far" and comm_wait(slot) makes later compute
 * wait for it; comm_wait_all() waits for everything issued. The CPU implementation finishes every
 * collective before returning, so its marks and waits are no-ops. The comm_host_* functions are
 * synchronous and return the result to every rank's host memory.
 *
 * Determinism. Sums over ranks are taken in rank order: reduce-scatter with accumulation computes
 * acc = (((acc + x_0) + x_1) + ... + x_{world-1}) in FP32 on the CPU build, which is the order one rank
 * accumulating the same micro-batches would use, so the CPU build's results do not depend on the rank
 * count (NCCL's ring order is its own; the GPU build is deterministic for a fixed rank count only).
 *
 * Errors stop with one line naming the call and the library's message. A binary started without a
 * launcher (mpirun, srun) is one rank and needs no MPI.
 */
#pragma once

#include "../core/buffers.h"
#include "../core/common.h"
#include "wire.h" /* CommWire: what gradient reductions send (--grad-reduce) */

/* This process's place in the job, filled by comm_init. */
typedef struct {
    int rank, world;             /* among all processes */
    int local_rank, local_world; /* among the processes of this node (MPI_COMM_TYPE_SHARED) */
    int launched;                /* started by an MPI launcher (otherwise world is 1) */
    char host[256];
} DistInfo;

static DistInfo g_dist = {0, 1, 0, 1, 0, "localhost"};

/* ---------------------------------------------------------------- life cycle */

/* Bootstraps the job (MPI_Init_thread when launched by mpirun/srun) and fills g_dist; on the GPU also
   selects the local rank's device and, when world > 1, creates the NCCL communicator (one rank needs
   none: its collectives are local copies). Stops naming the host when a node has more ranks than GPUs. */
static inline void comm_init(int* argc, char*** argv);
/* Clean shutdown, on the success path only (a failed job must never wait in finalize). */
static inline void comm_finalize(void);
/* Error path: aborts the communicator (NCCL) or the job (MPI) and exits with `status`, without
   destroying or finalizing anything; safe from the watchdog thread. */
LLM8_NORETURN static inline void comm_abort(int status);
/* Polled by the watchdog: 0, or 1 with the communicator's asynchronous error in `why`. */
static inline int comm_async_error(char* why, size_t len);

/* ---------------------------------------------------------------- collectives on backend memory */

/*
 * recv (n) = sum over ranks of rank r's send[rank * n .. (rank + 1) * n), added to recv when accumulate
 * (send: world * n FP32 on every rank). With WIRE_BF16 every rank's contribution travels as BF16; with
 * WIRE_FP8 as comm/grad_fp8.h's blocks (E4M3 codes, one scale_inv per ZERO_CHUNK chunk of the piece),
 * dequantized and summed in FP32 in rank order, so the result is deterministic for a fixed rank count
 * and bit-identical between the two builds. With one rank the FP8 wire sends and quantizes nothing, so
 * it gives the FP32 result (the BF16 wire still rounds each contribution to BF16).
 */
static inline void comm_reduce_scatter(const float* send, float* recv, size_t n, int accumulate, CommWire wire);
/* buf (n) FP32 = sum over ranks of buf, in place. WIRE_FP8 (ZeRO-0): buf, zero-padded, is cut into world
   pieces of whole ZERO_CHUNK chunks, reduce-scattered as above and the FP32 sums all-gathered, so every
   rank holds the same bits. */
static inline void comm_all_reduce(float* buf, size_t n, CommWire wire);
/* buf (n) doubles = sum over ranks; exact when each element has one non-zero contributor (norm partials). */
static inline void comm_all_reduce_f64(double* buf, size_t n);
/* buf (n) FP32 = max over ranks (amax of a tensor cast while sharded). */
static inline void comm_all_reduce_max(float* buf, size_t n);
/* In place: buf holds world pieces of `bytes` each, this rank's at rank * bytes; afterwards every rank
   holds every piece. */
static inline void comm_all_gather(void* buf, size_t bytes);
/* Marks of issued collectives, by slot (0 <= slot < COMM_SLOTS), and waits for them (see the banner). */
#define COMM_SLOTS 512
static inline void comm_mark(int slot);
static inline void comm_wait(int slot);
static inline void comm_wait_all(void);
/* Milliseconds the compute stream spent waiting for communication since the last call (the time not
   hidden); on the CPU, the time spent in collectives. Synchronizes. */
static inline double comm_exposed_ms(void);

/* ---------------------------------------------------------------- host values */

/* x (n) = elementwise sum / max over ranks, on every rank. */
static inline void comm_host_sum(double* x, size_t n);
static inline void comm_host_max(double* x, size_t n);
/* x (bytes) = root's x on every rank. */
static inline void comm_host_broadcast(void* x, size_t bytes, int root);
/* all (world * bytes) = every rank's `mine`, in rank order (start-up agreement). */
static inline void comm_host_all_gather(const void* mine, void* all, size_t bytes);
/* Every rank waits for all others here. */
static inline void comm_barrier(void);

/* ---------------------------------------------------------------- memory plan */

/* Most MemoryEstimate entries comm_workspaces writes. */
#define MAX_COMM_WORKSPACES 5
/* The memory this implementation allocates for a run's collectives beside the model's buffers (scratch,
   the library's own buffers), as named entries in out; returns how many. largest_piece: elements of the
   largest shard piece of the layout (ZeRO-1/2), largest_segment: of the largest segment (ZeRO-0). */
static inline int comm_workspaces(int world, int zero_stage, CommWire wire, size_t largest_piece, size_t largest_segment,
                                  MemoryEstimate* out);

/* ---------------------------------------------------------------- shared by both implementations */

/* The rank count a launcher announces through the environment (0 when none did). */
static inline int launcher_world(void) {
    const char* vars[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "PMI_SIZE", "MPI_LOCALNRANKS"};
    for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) {
        const char* v = getenv(vars[i]);
        if (v != NULL && atoi(v) > 0) return atoi(v);
    }
    /* srun --mpi=pmix sets PMIX_RANK but not always a size; one rank of a job started by a launcher */
    return getenv("PMIX_RANK") != NULL || getenv("PMI_RANK") != NULL ? 1 : 0;
}

/* This process's rank as the launcher announces it through the environment (0 when none did), for what
   runs before comm_init (--help). */
static inline int launcher_rank(void) {
    const char* vars[] = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"};
    for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) {
        const char* v = getenv(vars[i]);
        if (v != NULL) return atoi(v);
    }
    return 0;
}

/*
 * The variables through which launchers announce a process's node-local rank, in the order read: Open
 * MPI's and MPICH/Intel MPI's own come before Slurm's and torchrun-style LOCAL_RANK, because mpirun started
 * inside a Slurm allocation inherits the batch step's SLURM_LOCALID (0 on every rank) while setting its own.
 */
static const char* const LAUNCHER_LOCAL_RANK_VARS[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID",
                                                       "LOCAL_RANK"};
#define NUM_LAUNCHER_LOCAL_RANK_VARS ((int)(sizeof(LAUNCHER_LOCAL_RANK_VARS) / sizeof(LAUNCHER_LOCAL_RANK_VARS[0])))

/* The node-local rank the first set variable of LAUNCHER_LOCAL_RANK_VARS announces (*var: its index), or
   -1 (*var -1) when none is set to a number. The GPU build selects its device from it before MPI_Init. */
static inline int launcher_local_rank(int* var) {
    for (int i = 0; i < NUM_LAUNCHER_LOCAL_RANK_VARS; i++) {
        const char* v = getenv(LAUNCHER_LOCAL_RANK_VARS[i]);
        char* end = NULL;
        long n = v != NULL ? strtol(v, &end, 10) : -1;
        if (v != NULL && end != v && *end == '\0' && n >= 0 && n < 1 << 20) {
            *var = i;
            return (int)n;
        }
    }
    *var = -1;
    return -1;
}

static inline void dist_set_host(void) {
    if (gethostname(g_dist.host, sizeof(g_dist.host)) != 0) snprintf(g_dist.host, sizeof(g_dist.host), "unknown-host");
    g_dist.host[sizeof(g_dist.host) - 1] = '\0';
}
