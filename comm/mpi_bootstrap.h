/*
 * MPI as both communication implementations use it: the error check, whether MPI is in use, and the
 * bootstrap (docs/design.md#bootstrap): MPI_Init_thread with MPI_THREAD_MULTIPLE (the watchdog thread may
 * abort while the main thread sits in a collective), the rank and world, and the local rank and count
 * from MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) rather than host names. Only a process started by a
 * launcher (mpirun, srun) initializes MPI; a plain start is one rank. Built without MPI (make USE_MPI=0)
 * a launcher announcing more than one rank is an error.
 */
#pragma once

#ifdef LLM8_MPI
#include <mpi.h>
#endif

#include "comm.h"

#ifdef LLM8_MPI
static inline void mpi_check(int rc, const char* call, const char* file, int line) {
    if (rc == MPI_SUCCESS) return;
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    die("MPI error at %s:%d: %s: %s", file, line, call, msg);
}
#define mpiCheck(call) mpi_check((call), #call, __FILE__, __LINE__)
#endif

/* MPI is in use: built with it and started by a launcher. */
static inline int mpi_active(void) {
#ifdef LLM8_MPI
    return g_dist.launched;
#else
    return 0;
#endif
}

/* Fills g_dist: from MPI when a launcher started this process, else one rank. */
static inline void mpi_bootstrap(int* argc, char*** argv) {
    dist_set_host();
    int announced = launcher_world();
#ifdef LLM8_MPI
    if (announced > 0) {
        int provided;
        mpiCheck(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided));
        if (provided < MPI_THREAD_MULTIPLE) die("MPI on %s does not provide MPI_THREAD_MULTIPLE (the watchdog needs it)", g_dist.host);
        mpiCheck(MPI_Comm_rank(MPI_COMM_WORLD, &g_dist.rank));
        mpiCheck(MPI_Comm_size(MPI_COMM_WORLD, &g_dist.world));
        MPI_Comm local;
        mpiCheck(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, g_dist.rank, MPI_INFO_NULL, &local));
        mpiCheck(MPI_Comm_rank(local, &g_dist.local_rank));
        mpiCheck(MPI_Comm_size(local, &g_dist.local_world));
        mpiCheck(MPI_Comm_free(&local));
        g_dist.launched = 1;
    }
#else
    (void)argc;
    (void)argv;
    if (announced > 1) die("this binary was built without MPI (make USE_MPI=0) but the launcher started %d ranks", announced);
#endif
}

/* Success path: MPI_Finalize when MPI is in use. */
static inline void mpi_finalize(void) {
#ifdef LLM8_MPI
    if (mpi_active()) mpiCheck(MPI_Finalize());
#endif
}

/* Error path: ends the whole job (MPI_Abort when MPI is in use), else this process, with `status`. */
LLM8_NORETURN static inline void mpi_abort_exit(int status) {
    fflush(stdout);
    fflush(stderr);
#ifdef LLM8_MPI
    if (mpi_active()) MPI_Abort(MPI_COMM_WORLD, status);
#endif
    _exit(status);
}
