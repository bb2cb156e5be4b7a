/*
 * The emulated GPU's NCCL, over MPI: the calls comm/comm_nccl.cuh makes (unique id, init, destroy, abort,
 * async error, error strings, all-reduce sum/max/min of float/double/bf16, reduce-scatter, all-gather,
 * broadcast) plus ncclGroupStart/End with ncclSend/ncclRecv for the FP8 gradient all-to-all, compiled
 * against the toolkit's real nccl.h. Emulated device memory is host memory, so MPI moves it directly.
 *
 * Stream semantics are the point: a collective is queued on the stream it is given (emu_stream_enqueue)
 * and its MPI calls run when the emulated runtime runs that stream, so a compute stream that reads the
 * result without waiting for the collective's event reads stale data, as it would on a GPU. Every rank
 * runs the same program, so the runtime runs a communicator's collectives in issue order on every rank;
 * the double checks both (the order on this rank, and with one small MPI_Allreduce per collective that
 * every rank runs the same collective, a mismatch that would hang or corrupt real NCCL).
 *
 * Reductions are computed in rank order, ((x0 op x1) op x2) ..., rounded to the element type after each
 * step (a BF16 sum adds in FP32 and rounds to BF16 per step, as NCCL's BF16 reduction does). With two
 * ranks that is exactly what real NCCL gives (a + b is commutative in IEEE arithmetic); with more ranks
 * real NCCL's ring or tree order may differ, so results agree up to summation order. Max and min return
 * NaN when any input is NaN (NCCL leaves NaN unspecified; NaN keeps an amax non-finite).
 *
 * A one-rank communicator needs no MPI (builds without LLM8_MPI, or runs without mpirun). Communicators
 * span MPI_COMM_WORLD, ordered by NCCL rank (MPI_Comm_split), which is what llm8's bootstrap makes.
 */
#include <nccl.h>
#ifdef LLM8_MPI
#define OMPI_SKIP_MPICXX 1 /* the C API only (Open MPI's C++ bindings do not compile warning-free) */
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#endif
#include <cuda_bf16.h>

#include <chrono>
#include <climits>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

#include "emu_runtime.h"

/* Marks a unique id made by this double (the first 8 bytes of ncclUniqueId.internal). */
#define EMU_NCCL_ID_MAGIC 0x6e63636c38656d75ULL

namespace {

thread_local std::string g_last_error; /* ncclGetLastError */
thread_local int g_group_depth = 0;    /* ncclGroupStart nesting (per thread, as in NCCL) */

/* Returns r after recording (and printing) why, as NCCL's WARN lines do. */
ncclResult_t fail(ncclResult_t r, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
ncclResult_t fail(ncclResult_t r, const char* fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    g_last_error = buf;
    fprintf(stderr, "emu NCCL WARN %s\n", buf);
    return r;
}

enum Kind { ALL_REDUCE, REDUCE_SCATTER, ALL_GATHER, BROADCAST, SEND, RECV };
const char* kind_name(Kind k) {
    static const char* names[] = {"ncclAllReduce", "ncclReduceScatter", "ncclAllGather", "ncclBroadcast", "ncclSend", "ncclRecv"};
    return names[k];
}

/* One queued operation: `count` is the per-rank element count NCCL's signature takes. */
struct Op {
    Kind kind;
    const void* send;
    void* recv;
    size_t count;
    ncclDataType_t type;
    ncclRedOp_t op;
    int root_or_peer;
};

struct CommState {
    int nranks = 1, rank = 0;
#ifdef LLM8_MPI
    MPI_Comm mpi = MPI_COMM_NULL;
    int thread_level = MPI_THREAD_SINGLE;
#endif
    std::thread::id init_thread;
    std::mutex lock;
    uint64_t issued = 0, executed = 0;
    ncclResult_t async = ncclSuccess;
    bool aborted = false, destroyed = false;
};

}  // namespace

struct ncclComm {
    std::shared_ptr<CommState> state;
};

namespace {

struct Group {
    ncclComm_t comm = nullptr;
    cudaStream_t stream = nullptr;
    std::vector<Op> ops;
};
thread_local Group g_group;

size_t type_size(ncclDataType_t t) {
    switch (t) {
        case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
        case ncclFloat16: case ncclBfloat16: return 2;
        case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
        case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
        default: return 0;
    }
}

/* x op y for one element type, rounded to that type. */
template <typename T>
T combine(T x, T y, ncclRedOp_t op) {
    if (op == ncclSum) return x + y;
    if (x != x || y != y) return x != x ? x : y; /* NaN wins max and min */
    return op == ncclMax ? (x > y ? x : y) : (x < y ? x : y);
}

__nv_bfloat16 combine_bf16(__nv_bfloat16 x, __nv_bfloat16 y, ncclRedOp_t op) {
    return __float2bfloat16_rn(combine(__bfloat162float(x), __bfloat162float(y), op));
}

/* out[i] = in[0][i] op in[1][i] op ... in rank order; `in` holds nranks blocks of n elements. */
void reduce_blocks(void* out, const char* in, size_t n, int nranks, ncclDataType_t t, ncclRedOp_t op) {
    size_t block = n * type_size(t);
    std::vector<char> acc(in, in + block);
    for (int r = 1; r < nranks; r++) { /* check:rank_order */
        const char* x = in + (size_t)r * block;
        for (size_t i = 0; i < n; i++) {
            if (t == ncclFloat32) ((float*)acc.data())[i] = combine(((float*)acc.data())[i], ((const float*)x)[i], op);
            else if (t == ncclFloat64) ((double*)acc.data())[i] = combine(((double*)acc.data())[i], ((const double*)x)[i], op);
            else ((__nv_bfloat16*)acc.data())[i] = combine_bf16(((__nv_bfloat16*)acc.data())[i], ((const __nv_bfloat16*)x)[i], op);
        }
    }
    memcpy(out, acc.data(), block);
}

#ifdef LLM8_MPI
/* An FNV-1a summary of an operation, compared across ranks. */
int64_t signature(const Op& o, uint64_t seq) {
    uint64_t h = 1469598103934665603ULL;
    for (uint64_t v : {(uint64_t)o.kind, (uint64_t)o.count, (uint64_t)o.type, (uint64_t)o.op, (uint64_t)o.root_or_peer, seq})
        h = (h ^ v) * 1099511628211ULL;
    return (int64_t)(h >> 1);
}

/* Runs an MPI call of a queued collective; a failure becomes the communicator's async error. */
bool mpi_ok(CommState& s, int rc, const char* what) {
    if (rc == MPI_SUCCESS) return true;
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    std::lock_guard<std::mutex> guard(s.lock);
    s.async = fail(ncclSystemError, "rank %d: %s failed in the NCCL double: %s", s.rank, what, msg);
    return false;
}

int mpi_bytes(size_t bytes, const char* what) {
    if (bytes > (size_t)INT_MAX) emu_fail("%s of %zu bytes: the NCCL double moves at most 2 GiB per rank at once", what, bytes);
    return (int)bytes;
}
#endif

/* Executes one collective (the stream runs this). */
void run_collective(CommState& s, const Op& o, uint64_t seq) {
    size_t es = type_size(o.type), bytes = o.count * es;
    int W = s.nranks;
    (void)seq;
#ifdef LLM8_MPI
    if (W > 1) {
        /* every rank must be running the same collective now, or real NCCL would hang or mix data */
        int64_t sig = signature(o, seq), both[2] = {sig, -sig}, seen[2];
        if (!mpi_ok(s, MPI_Allreduce(both, seen, 2, MPI_INT64_T, MPI_MAX, s.mpi), "signature MPI_Allreduce")) return;
        if (seen[0] != sig || seen[1] != -sig)
            emu_fail("NCCL double: rank %d runs collective #%lu %s(count %zu, type %d, op %d, root %d) but another rank of the "
                     "communicator runs a different one (real NCCL would hang or mix data)",
                     s.rank, (unsigned long)seq, kind_name(o.kind), o.count, (int)o.type, (int)o.op, o.root_or_peer);
    }
#endif
    std::vector<char> all;
    switch (o.kind) {
        case ALL_REDUCE:
            all.resize(W * bytes);
            if (W == 1) memcpy(all.data(), o.send, bytes);
#ifdef LLM8_MPI
            else if (!mpi_ok(s, MPI_Allgather(o.send, mpi_bytes(bytes, "ncclAllReduce"), MPI_BYTE, all.data(), (int)bytes, MPI_BYTE, s.mpi),
                             "MPI_Allgather")) return;
#endif
            reduce_blocks(o.recv, all.data(), o.count, W, o.type, o.op);
            break;
        case REDUCE_SCATTER: /* block r of every rank's send goes to rank r */
            all.resize(W * bytes);
            if (W == 1) memcpy(all.data(), o.send, bytes);
#ifdef LLM8_MPI
            else if (!mpi_ok(s, MPI_Alltoall(o.send, mpi_bytes(bytes, "ncclReduceScatter"), MPI_BYTE, all.data(), (int)bytes, MPI_BYTE, s.mpi),
                             "MPI_Alltoall")) return;
#endif
            reduce_blocks(o.recv, all.data(), o.count, W, o.type, o.op);
            break;
        case ALL_GATHER:
            all.resize(W * bytes);
            if (W == 1) memcpy(all.data(), o.send, bytes);
#ifdef LLM8_MPI
            else if (!mpi_ok(s, MPI_Allgather(o.send, mpi_bytes(bytes, "ncclAllGather"), MPI_BYTE, all.data(), (int)bytes, MPI_BYTE, s.mpi),
                             "MPI_Allgather")) return;
#endif
            memcpy(o.recv, all.data(), W * bytes);
            break;
        case BROADCAST:
            if (s.rank == o.root_or_peer) memmove(o.recv, o.send, bytes);
#ifdef LLM8_MPI
            if (W > 1) mpi_ok(s, MPI_Bcast(o.recv, mpi_bytes(bytes, "ncclBroadcast"), MPI_BYTE, o.root_or_peer, s.mpi), "MPI_Bcast");
#endif
            break;
        default: break;
    }
}

/* Executes a group of operations in issue order: point-to-point first posted, then collectives, then waited. */
void run_ops(const std::shared_ptr<CommState>& sp, const std::vector<Op>& ops, uint64_t seq) {
    CommState& s = *sp;
    {
        std::lock_guard<std::mutex> guard(s.lock);
        if (s.destroyed) emu_fail("NCCL double: a collective ran after ncclCommDestroy of its communicator");
        if (s.executed != seq)
            emu_fail("NCCL double: rank %d runs operation #%lu of a communicator before #%lu; real NCCL needs every rank to "
                     "run a communicator's operations in one order (order the streams it is used on)",
                     s.rank, (unsigned long)seq, (unsigned long)s.executed);
        s.executed++;
        if (s.aborted || s.async != ncclSuccess) return; /* an aborted or failed communicator does no more work */
    }
#ifdef LLM8_MPI
    if (s.nranks > 1 && s.thread_level < MPI_THREAD_MULTIPLE && std::this_thread::get_id() != s.init_thread)
        emu_fail("NCCL double: a stream runs a collective on another thread than ncclCommInitRank's, and MPI was initialized "
                 "below MPI_THREAD_MULTIPLE");
    std::vector<MPI_Request> requests;
#endif
    for (const Op& o : ops) {
        if (o.kind != SEND && o.kind != RECV) continue;
        size_t bytes = o.count * type_size(o.type);
        if (o.root_or_peer == s.rank && s.nranks == 1) continue; /* matched below, without MPI */
#ifdef LLM8_MPI
        requests.emplace_back();
        int rc = o.kind == SEND ? MPI_Isend(o.send, mpi_bytes(bytes, "ncclSend"), MPI_BYTE, o.root_or_peer, 0, s.mpi, &requests.back())
                                : MPI_Irecv(o.recv, mpi_bytes(bytes, "ncclRecv"), MPI_BYTE, o.root_or_peer, 0, s.mpi, &requests.back());
        if (!mpi_ok(s, rc, kind_name(o.kind))) return;
#else
        (void)bytes;
#endif
    }
    if (s.nranks == 1) { /* a one-rank group's sends to itself meet its receives in order */
        std::vector<const Op*> sends;
        for (const Op& o : ops) if (o.kind == SEND) sends.push_back(&o);
        size_t next = 0;
        for (const Op& o : ops) {
            if (o.kind != RECV) continue;
            if (next >= sends.size() || sends[next]->count * type_size(sends[next]->type) != o.count * type_size(o.type))
                emu_fail("NCCL double: a one-rank group's ncclRecv has no matching ncclSend (real NCCL would hang)");
            memcpy(o.recv, sends[next++]->send, o.count * type_size(o.type));
        }
    }
    for (size_t i = 0; i < ops.size(); i++)
        if (ops[i].kind != SEND && ops[i].kind != RECV) run_collective(s, ops[i], seq * 1024 + i);
#ifdef LLM8_MPI
    if (!requests.empty()) mpi_ok(s, MPI_Waitall((int)requests.size(), requests.data(), MPI_STATUSES_IGNORE), "MPI_Waitall");
#endif
}

bool overlaps(const void* a, size_t an, const void* b, size_t bn) {
    const char *x = (const char*)a, *y = (const char*)b;
    return x < y + bn && y < x + an;
}

/* Checks one call's arguments (NCCL's argument checks return ncclInvalidArgument) and queues it. */
ncclResult_t submit(const Op& o, ncclComm_t comm, cudaStream_t stream) {
    const char* api = kind_name(o.kind);
    if (!comm || !comm->state) return fail(ncclInvalidArgument, "%s: comm is NULL", api);
    CommState& s = *comm->state;
    size_t es = type_size(o.type);
    if (es == 0) return fail(ncclInvalidArgument, "%s: invalid datatype %d", api, (int)o.type);
    bool reduce = o.kind == ALL_REDUCE || o.kind == REDUCE_SCATTER;
    if (reduce && o.op != ncclSum && o.op != ncclMax && o.op != ncclMin)
        emu_fail("%s: reduction op %d is not emulated (sum, max, min)", api, (int)o.op);
    if (reduce && o.type != ncclFloat32 && o.type != ncclFloat64 && o.type != ncclBfloat16)
        emu_fail("%s: reductions of datatype %d are not emulated (float, double, bfloat16)", api, (int)o.type);
    if ((o.kind == BROADCAST || o.kind == SEND || o.kind == RECV) && (o.root_or_peer < 0 || o.root_or_peer >= s.nranks))
        return fail(ncclInvalidArgument, "%s: root/peer %d out of range [0, %d)", api, o.root_or_peer, s.nranks);
    size_t W = (size_t)s.nranks, n = o.count * es;
    size_t send_bytes = o.kind == REDUCE_SCATTER ? W * n : o.kind == RECV ? 0 : n;
    size_t recv_bytes = o.kind == ALL_GATHER ? W * n : o.kind == SEND ? 0 : n;
    /* NCCL checks that buffers are device memory (cudaPointerGetAttributes) and returns ncclInvalidArgument */
    bool send_needed = o.kind != RECV && !(o.kind == BROADCAST && s.rank != o.root_or_peer);
    if (send_needed && n > 0 && !emu_is_device_ptr(o.send, send_bytes))
        return fail(ncclInvalidArgument, "%s: sendbuff %p (%zu bytes) is not emulated device memory", api, o.send, send_bytes);
    if (o.kind != SEND && n > 0 && !emu_is_device_ptr(o.recv, recv_bytes))
        return fail(ncclInvalidArgument, "%s: recvbuff %p (%zu bytes) is not emulated device memory", api, o.recv, recv_bytes);
    /* nccl.h names the one in-place form of each collective; any other overlap is undefined */
    if (send_needed && o.kind != SEND && o.kind != RECV && overlaps(o.send, send_bytes, o.recv, recv_bytes)) {
        const char* in_place = nullptr;
        if (o.kind == ALL_REDUCE || o.kind == BROADCAST) in_place = o.send == o.recv ? "" : nullptr;
        if (o.kind == REDUCE_SCATTER) in_place = (const char*)o.recv == (const char*)o.send + s.rank * n ? "" : nullptr;
        if (o.kind == ALL_GATHER) in_place = (const char*)o.send == (const char*)o.recv + s.rank * n ? "" : nullptr;
        if (!in_place) /* check:nccl_overlap */
            emu_fail("%s: sendbuff %p and recvbuff %p overlap without being nccl.h's in-place form (undefined)", api, o.send, o.recv);
    }
    if (g_group_depth > 0) {
        if (g_group.comm && (g_group.comm != comm || g_group.stream != stream))
            emu_fail("%s: a group over several communicators or streams is not emulated", api);
        g_group.comm = comm;
        g_group.stream = stream;
        g_group.ops.push_back(o);
        return ncclSuccess;
    }
    std::shared_ptr<CommState> sp = comm->state;
    uint64_t seq;
    {
        std::lock_guard<std::mutex> guard(s.lock);
        if (s.destroyed) return fail(ncclInvalidUsage, "%s: communicator was destroyed", api);
        seq = s.issued++;
    }
    std::vector<Op> ops{o};
    emu_stream_enqueue(stream, [sp, ops, seq]() { run_ops(sp, ops, seq); }); /* check:nccl_on_stream */
    return ncclSuccess;
}

}  // namespace

extern "C" {

/* ------------------------------------------------------------------ errors */

/* NCCL's one-line description of a result code. */
const char* ncclGetErrorString(ncclResult_t r) {
    switch (r) {
        case ncclSuccess: return "no error";
        case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
        case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
        case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
        case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
        case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
        case ncclRemoteError: return "remote process exited or there was a network error";
        case ncclInProgress: return "NCCL operation in progress";
        default: return "unknown result code";
    }
}

/* The message of this thread's last failed call ("" when none); comm is unused, as in NCCL. */
const char* ncclGetLastError(ncclComm_t) { return g_last_error.c_str(); }

/* ------------------------------------------------------------------ communicators */

/* A unique id: a magic and a random nonce, which ncclCommInitRank checks every rank shares. */
ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
    if (!id) return fail(ncclInvalidArgument, "ncclGetUniqueId: id is NULL");
    memset(id, 0, sizeof(*id));
    uint64_t magic = EMU_NCCL_ID_MAGIC;
    uint64_t nonce = std::random_device{}() ^ ((uint64_t)getpid() << 32) ^
                     (uint64_t)std::chrono::steady_clock::now().time_since_epoch().count();
    memcpy(id->internal, &magic, 8);
    memcpy(id->internal + 8, &nonce, 8);
    return ncclSuccess;
}

/*
 * Rank `rank` of an nranks communicator. One rank needs no MPI; more need MPI initialized with world
 * size nranks (every world rank calls this, as NCCL's init is collective). A different id on some rank
 * returns ncclInvalidUsage on every rank instead of hanging.
 */
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
    if (!comm) return fail(ncclInvalidArgument, "ncclCommInitRank: comm is NULL");
    uint64_t magic, nonce;
    memcpy(&magic, id.internal, 8);
    memcpy(&nonce, id.internal + 8, 8);
    if (magic != EMU_NCCL_ID_MAGIC) return fail(ncclInvalidArgument, "ncclCommInitRank: the id was not made by ncclGetUniqueId");
    if (nranks < 1 || rank < 0 || rank >= nranks)
        return fail(ncclInvalidArgument, "ncclCommInitRank: rank %d of %d ranks", rank, nranks);
    auto state = std::make_shared<CommState>();
    state->nranks = nranks;
    state->rank = rank;
    state->init_thread = std::this_thread::get_id();
    if (nranks > 1) {
#ifdef LLM8_MPI
        int initialized = 0, world = 0;
        MPI_Initialized(&initialized);
        if (!initialized) return fail(ncclInvalidUsage, "ncclCommInitRank: the NCCL double needs MPI for %d ranks (start with mpirun)", nranks);
        MPI_Comm_size(MPI_COMM_WORLD, &world);
        if (world != nranks)
            return fail(ncclInvalidUsage, "ncclCommInitRank: the NCCL double builds communicators of all %d MPI ranks, not %d", world, nranks);
        MPI_Query_thread(&state->thread_level);
        /* the MPI communicator's ranks follow the NCCL ranks */
        MPI_Comm_split(MPI_COMM_WORLD, 0, rank, &state->mpi);
        MPI_Comm_set_errhandler(state->mpi, MPI_ERRORS_RETURN);
        uint64_t mine[2] = {nonce, (uint64_t)rank};
        std::vector<uint64_t> all(2 * (size_t)nranks);
        MPI_Allgather(mine, 2, MPI_UINT64_T, all.data(), 2, MPI_UINT64_T, state->mpi);
        for (int r = 0; r < nranks; r++)
            if (all[2 * r] != nonce || all[2 * r + 1] != (uint64_t)r) {
                MPI_Comm_free(&state->mpi);
                return fail(ncclInvalidUsage, "ncclCommInitRank: ranks disagree on the unique id or on their ranks "
                            "(rank %d has id %016llx and rank %llu)", r, (unsigned long long)all[2 * r], (unsigned long long)all[2 * r + 1]);
            }
#else
        return fail(ncclInvalidUsage, "ncclCommInitRank: %d ranks need the NCCL double built with MPI (LLM8_MPI)", nranks);
#endif
    }
    *comm = new ncclComm{state};
    return ncclSuccess;
}

/* Flushes what the streams still hold for comm (as ncclCommFinalize does), then frees it. */
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    if (!comm) return ncclSuccess;
    CommState& s = *comm->state;
    bool pending;
    {
        std::lock_guard<std::mutex> guard(s.lock);
        pending = s.executed != s.issued;
    }
    if (pending && !s.aborted) cudaDeviceSynchronize();
    {
        std::lock_guard<std::mutex> guard(s.lock);
        s.destroyed = true;
    }
#ifdef LLM8_MPI
    if (s.mpi != MPI_COMM_NULL && !s.aborted) MPI_Comm_free(&s.mpi);
#endif
    delete comm;
    return ncclSuccess;
}

/* Marks comm aborted: queued operations do nothing when run. Frees nothing that could block on a peer. */
ncclResult_t ncclCommAbort(ncclComm_t comm) {
    if (!comm) return ncclSuccess;
    std::lock_guard<std::mutex> guard(comm->state->lock);
    comm->state->aborted = true;
    return ncclSuccess;
}

/* The first error an operation of comm hit while its stream ran it (ncclSuccess when none). */
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* async_error) {
    if (!comm || !async_error) return fail(ncclInvalidArgument, "ncclCommGetAsyncError: NULL argument");
    std::lock_guard<std::mutex> guard(comm->state->lock);
    *async_error = comm->state->async;
    return ncclSuccess;
}

/* ------------------------------------------------------------------ collectives */

/* recvbuff (count) on every rank = op over ranks of sendbuff (count); in place when they are equal. */
ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t type, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream) {
    return submit(Op{ALL_REDUCE, sendbuff, recvbuff, count, type, op, 0}, comm, stream);
}

/* recvbuff (recvcount) on rank r = op over ranks of block r of sendbuff (nranks * recvcount). */
ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t type, ncclRedOp_t op,
                               ncclComm_t comm, cudaStream_t stream) {
    return submit(Op{REDUCE_SCATTER, sendbuff, recvbuff, recvcount, type, op, 0}, comm, stream);
}

/* recvbuff (nranks * sendcount) = every rank's sendbuff (sendcount), rank r's at offset r * sendcount. */
ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t type, ncclComm_t comm,
                           cudaStream_t stream) {
    return submit(Op{ALL_GATHER, sendbuff, recvbuff, sendcount, type, ncclSum, 0}, comm, stream);
}

/* recvbuff (count) on every rank = root's sendbuff (count). */
ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t type, int root, ncclComm_t comm,
                           cudaStream_t stream) {
    return submit(Op{BROADCAST, sendbuff, recvbuff, count, type, ncclSum, root}, comm, stream);
}

/* Sends count elements to peer, which must post a matching ncclRecv (grouped when both must progress). */
ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t type, int peer, ncclComm_t comm, cudaStream_t stream) {
    return submit(Op{SEND, sendbuff, nullptr, count, type, ncclSum, peer}, comm, stream);
}

/* Receives count elements from peer's matching ncclSend. */
ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t type, int peer, ncclComm_t comm, cudaStream_t stream) {
    return submit(Op{RECV, nullptr, recvbuff, count, type, ncclSum, peer}, comm, stream);
}

/* Starts (or nests) a group: operations are held until the outermost ncclGroupEnd. */
ncclResult_t ncclGroupStart(void) {
    g_group_depth++;
    return ncclSuccess;
}

/* Ends a group; the outermost end queues the group's operations as one unit on their stream. */
ncclResult_t ncclGroupEnd(void) {
    if (g_group_depth == 0) return fail(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
    if (--g_group_depth > 0 || g_group.ops.empty()) return ncclSuccess;
    Group group;
    std::swap(group, g_group);
    std::shared_ptr<CommState> sp = group.comm->state;
    uint64_t seq;
    {
        std::lock_guard<std::mutex> guard(sp->lock);
        seq = sp->issued++;
    }
    std::vector<Op> ops = std::move(group.ops);
    emu_stream_enqueue(group.stream, [sp, ops, seq]() { run_ops(sp, ops, seq); });
    return ncclSuccess;
}

}  // extern "C"
