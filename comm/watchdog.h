/*
 * The communication watchdog (--comm-timeout, docs/design.md#faults-and-checkpoints): a thread that checks once
 * a second whether the main thread has stayed in one phase of one step longer than the timeout (a rank
 * that died or hangs leaves the others waiting in a collective) or whether the communicator reports an
 * asynchronous error (NCCL). Either way it prints one line with rank, host, step and phase, aborts the
 * communicator and exits non-zero (comm_abort), never destroying or finalizing anything: those can hang
 * on a broken communicator. The main thread names its phase with watchdog_phase at every boundary that
 * can block (collectives, synchronizations, checkpoint writes), which also restarts the clock.
 * Included after a communication implementation (comm/comm_mpi.h or comm/comm_nccl.cuh).
 */
#pragma once

#include <pthread.h>

#include "comm.h"

/* How often the watchdog looks (seconds). */
#define WATCHDOG_POLL_S 1

/* Shared between the main thread and the watchdog through GCC's __atomic builtins (C and C++ alike). */
typedef struct {
    double timeout_s;  /* 0: no watchdog */
    int64_t since_ms;  /* when the current phase began (wall_seconds, ms) */
    int step;
    const char* phase; /* a string literal */
    pthread_t thread;
    int stopped; /* under g_watchdog_lock: set by watchdog_stop; the watchdog makes no communicator call after it */
} Watchdog;

static Watchdog g_watchdog;
static pthread_mutex_t g_watchdog_lock = PTHREAD_MUTEX_INITIALIZER;

/* The main thread enters `phase` (a string literal) of step `step`; restarts the clock. */
static inline void watchdog_phase(const char* phase, int step) {
    __atomic_store_n(&g_watchdog.phase, phase, __ATOMIC_RELAXED);
    __atomic_store_n(&g_watchdog.step, step, __ATOMIC_RELAXED);
    __atomic_store_n(&g_watchdog.since_ms, (int64_t)(wall_seconds() * 1e3), __ATOMIC_RELEASE);
}

static void* watchdog_main(void* arg) {
    (void)arg;
    for (;;) {
        sleep(WATCHDOG_POLL_S);
        char why[256];
        pthread_mutex_lock(&g_watchdog_lock);
        if (g_watchdog.stopped) {
            pthread_mutex_unlock(&g_watchdog_lock);
            return NULL;
        }
        double stalled = wall_seconds() - 1e-3 * (double)__atomic_load_n(&g_watchdog.since_ms, __ATOMIC_ACQUIRE);
        int error = comm_async_error(why, sizeof(why));
        if (!error && stalled <= g_watchdog.timeout_s) {
            pthread_mutex_unlock(&g_watchdog_lock);
            continue;
        }
        if (!error) snprintf(why, sizeof(why), "no progress for %.0f s (--comm-timeout %g)", stalled, g_watchdog.timeout_s);
        fprintf(stderr, "error: rank %d on %s: step %d, phase %s: %s; aborting the job\n", g_dist.rank, g_dist.host,
                __atomic_load_n(&g_watchdog.step, __ATOMIC_RELAXED), __atomic_load_n(&g_watchdog.phase, __ATOMIC_RELAXED), why);
        comm_abort(EXIT_FAILURE);
    }
    return NULL;
}

/*
 * Ends the watchdog's communicator calls before the communicator is destroyed: comm_finalize's
 * ncclCommDestroy while the watchdog polls ncclCommGetAsyncError is a use after free (found by the
 * emulated GPU under ASan: mpirun -np 2 build/emu/train_llama). Waits at most for one poll in progress.
 */
static inline void watchdog_stop(void) {
    pthread_mutex_lock(&g_watchdog_lock);
    g_watchdog.stopped = 1;
    pthread_mutex_unlock(&g_watchdog_lock);
}

/* Starts the watchdog thread (timeout_s > 0) in phase "startup"; it lives until the process exits. */
static inline void watchdog_start(double timeout_s) {
    g_watchdog.timeout_s = timeout_s;
    watchdog_phase("startup", 0);
    if (timeout_s <= 0.0) return;
    if (pthread_create(&g_watchdog.thread, NULL, watchdog_main, NULL) != 0) die("cannot start the watchdog thread (%s)", strerror(errno));
    pthread_detach(g_watchdog.thread);
}
