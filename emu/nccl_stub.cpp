/*
 * Placeholder NCCL for the emulated build until emu/nccl.cpp (the NCCL double over MPI) exists: single-rank
 * runs never call NCCL; any call stops with "emu: ..." naming it. The Makefile drops this file once
 * emu/nccl.cpp is there.
 */
#include <nccl.h>

#include "emu_runtime.h"

#define EMU_NCCL_MISSING(name) emu_fail("%s: the NCCL double (emu/nccl.cpp) is not built in", name)

extern "C" {
const char* ncclGetErrorString(ncclResult_t) { return "emulated NCCL missing"; }
const char* ncclGetLastError(ncclComm_t) { return ""; }
ncclResult_t ncclGetUniqueId(ncclUniqueId*) { EMU_NCCL_MISSING("ncclGetUniqueId"); }
ncclResult_t ncclCommInitRank(ncclComm_t*, int, ncclUniqueId, int) { EMU_NCCL_MISSING("ncclCommInitRank"); }
ncclResult_t ncclCommDestroy(ncclComm_t) { EMU_NCCL_MISSING("ncclCommDestroy"); }
ncclResult_t ncclCommAbort(ncclComm_t) { EMU_NCCL_MISSING("ncclCommAbort"); }
ncclResult_t ncclCommGetAsyncError(ncclComm_t, ncclResult_t*) { EMU_NCCL_MISSING("ncclCommGetAsyncError"); }
ncclResult_t ncclAllReduce(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t) {
    EMU_NCCL_MISSING("ncclAllReduce");
}
ncclResult_t ncclAllGather(const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t) { EMU_NCCL_MISSING("ncclAllGather"); }
ncclResult_t ncclReduceScatter(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t) {
    EMU_NCCL_MISSING("ncclReduceScatter");
}
ncclResult_t ncclBroadcast(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) { EMU_NCCL_MISSING("ncclBroadcast"); }
}
