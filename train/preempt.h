/*
 * Preemption (docs/checkpoints.md): Slurm sends SIGTERM before it kills a job, and SIGUSR1 at
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

static volatile sig_atomic_t g_stop_signal = 0; /* the first signal that asked to stop, or 0 */
static volatile sig_atomic_t g_sigint_count = 0; /* SIGINTs received */

/* Writes a message from a signal handler (write(2) is async-signal-safe, stdio is not). */
static void signal_say(const char* msg, size_t len) {
    ssize_t ignored = write(STDERR_FILENO, msg, len);
    (void)ignored;
}

/*
 * The handler may run in any thread that does not block the signal (OpenMP's workers too), so a second
 * signal can enter it in another thread while the first is still inside: the count and the flag change by
 * lock-free atomic read-modify-writes (async-signal-safe), and the flag is set before the message is
 * written, so a SIGINT sent on reading the message always finds the first one counted.
 */
static void preempt_handler(int sig) {
    static const char now[] = "\nsecond SIGINT: stopping now, without a checkpoint\n";
    static const char later[] = "\nstop signal: finishing this step, then a checkpoint (Ctrl-C again stops at once)\n";
    if (sig == SIGINT && __atomic_fetch_add(&g_sigint_count, 1, __ATOMIC_SEQ_CST) >= 1) {
        signal_say(now, sizeof(now) - 1);
        _exit(EXIT_INTERRUPTED);
    }
    sig_atomic_t none = 0;
    if (__atomic_compare_exchange_n(&g_stop_signal, &none, sig, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
        signal_say(later, sizeof(later) - 1);
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
