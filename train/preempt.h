/*
 * Preemption (README "Training on a cluster"): Slurm sends SIGTERM before it kills a job, and SIGUSR1 at
 * the time --signal=USR1@SECONDS asks for; a user presses Ctrl-C (SIGINT). On any of them the trainer
 * finishes the step in flight, writes a checkpoint (with -o) and exits with EXIT_PREEMPTED, which the
 * Slurm scripts take as "requeue and resume with -y 1". A second SIGINT stops at once. The handlers only
 * set a flag; the step loop reads it at the end of each step and every rank takes the largest over all
 * ranks (a signal may reach the ranks at slightly different times), so every rank checkpoints the same
 * step.
 */
#pragma once

#include <signal.h>

#include "../core/common.h"

/* Exit status of a run stopped by a signal after its checkpoint: EX_TEMPFAIL of sysexits.h ("try again"). */
#define EXIT_PREEMPTED 75
/* Exit status of a second SIGINT: the shell's for a SIGINT death (128 + 2). */
#define EXIT_INTERRUPTED 130

static volatile sig_atomic_t g_stop_signal = 0; /* the signal that asked to stop, or 0 */

static void preempt_handler(int sig) {
    if (sig == SIGINT && g_stop_signal == SIGINT) {
        static const char msg[] = "\nsecond SIGINT: stopping now, without a checkpoint\n";
        ssize_t ignored = write(STDERR_FILENO, msg, sizeof(msg) - 1);
        (void)ignored;
        _exit(EXIT_INTERRUPTED);
    }
    g_stop_signal = sig;
}

/* Installs the handlers of SIGTERM, SIGUSR1 and SIGINT. */
static inline void preempt_install(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = preempt_handler;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART; /* reads and writes in flight continue; the loop checks the flag */
    int signals[] = {SIGTERM, SIGUSR1, SIGINT};
    for (size_t i = 0; i < sizeof(signals) / sizeof(signals[0]); i++)
        if (sigaction(signals[i], &sa, NULL) != 0) die("cannot install the handler of signal %d (%s)", signals[i], strerror(errno));
}

static inline const char* signal_name(int sig) {
    return sig == SIGTERM ? "SIGTERM" : sig == SIGUSR1 ? "SIGUSR1" : sig == SIGINT ? "SIGINT" : "a signal";
}
