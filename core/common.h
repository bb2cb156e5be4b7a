/*
 * Common helpers for every llm8 translation unit: the host/device qualifier, the error-stopping
 * wrappers around stdio and malloc, and a one-line fatal error. Compiled as C11 by gcc and as C++17
 * by nvcc, so it uses only the intersection of both languages.
 *
 * Errors stop loudly at the call: each wrapper prints "error: <what>: <why> (<file>:<line>)" on one
 * line and exits with status 1. Nothing here returns an error code. The fuzz harnesses (dev/fuzz) watch
 * those stops through die_hook instead of exiting.
 */
#pragma once

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* Longest path the programs build (checkpoint names, temporaries with a ".tmp" suffix). */
#define PATH_LEN 1024
#define TMP_PATH_LEN (PATH_LEN + 8)

#ifdef __CUDACC__
#define LLM8_HD __host__ __device__
#else
#define LLM8_HD
#endif

#ifdef __cplusplus
#define LLM8_NORETURN [[noreturn]]
#else
#define LLM8_NORETURN _Noreturn
#endif

/*
 * When set (never in the programs), die() first calls it with its formatted message (no "error: " prefix,
 * no newline). The libFuzzer harnesses (dev/fuzz) set a hook that longjmps back to the harness, so that a
 * reader rejecting an input ends that input rather than the fuzzing process, which cannot survive exit().
 * A hook that returns lets die() go on as usual. One per translation unit, like everything here.
 */
typedef void (*DieHook)(const char* message);
static DieHook die_hook = NULL;
#define DIE_HOOK_MESSAGE_LEN (4 * PATH_LEN)

/* Prints "error: " + the formatted message on one line to stderr and exits with status 1. */
LLM8_NORETURN static inline void die(const char* fmt, ...) {
    /* Formatted once and written in one write: under mpirun, several ranks' lines (and a library's own log
     * lines) share one stderr, and a line written in pieces can be split by another rank's. */
    char line[DIE_HOOK_MESSAGE_LEN + 16] = "error: ";
    const size_t prefix = strlen(line);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line + prefix, sizeof(line) - prefix - 1, fmt, ap);
    va_end(ap);
    if (die_hook != NULL) die_hook(line + prefix);
    size_t at = strlen(line);
    line[at++] = '\n';
    fflush(stdout);
    fwrite(line, 1, at, stderr);
    exit(EXIT_FAILURE);
}

static inline FILE* fopen_check(const char* path, const char* mode, const char* file, int line) {
    FILE* f = fopen(path, mode);
    if (f == NULL) die("%s: cannot open (%s) (%s:%d)", path, strerror(errno), file, line);
    return f;
}
#define fopenCheck(path, mode) fopen_check(path, mode, __FILE__, __LINE__)

/* Reads exactly `count` items or stops naming `what` (usually the file path). */
static inline void fread_check(void* ptr, size_t size, size_t count, FILE* f, const char* what,
                               const char* file, int line) {
    size_t got = fread(ptr, size, count, f);
    if (got != count) {
        if (feof(f)) die("%s: truncated: wanted %zu items of %zu bytes, got %zu (%s:%d)", what, count, size, got, file, line);
        die("%s: read failed (%s) (%s:%d)", what, strerror(errno), file, line);
    }
}
#define freadCheck(ptr, size, count, f, what) fread_check(ptr, size, count, f, what, __FILE__, __LINE__)

static inline void fwrite_check(const void* ptr, size_t size, size_t count, FILE* f, const char* what,
                                const char* file, int line) {
    if (fwrite(ptr, size, count, f) != count) die("%s: write failed (%s) (%s:%d)", what, strerror(errno), file, line);
}
#define fwriteCheck(ptr, size, count, f, what) fwrite_check(ptr, size, count, f, what, __FILE__, __LINE__)

static inline void fseek_check(FILE* f, long offset, int whence, const char* what, const char* file, int line) {
    if (fseek(f, offset, whence) != 0) die("%s: seek failed (%s) (%s:%d)", what, strerror(errno), file, line);
}
#define fseekCheck(f, offset, whence, what) fseek_check(f, offset, whence, what, __FILE__, __LINE__)

static inline void fclose_check(FILE* f, const char* what, const char* file, int line) {
    if (fclose(f) != 0) die("%s: close failed (%s) (%s:%d)", what, strerror(errno), file, line);
}
#define fcloseCheck(f, what) fclose_check(f, what, __FILE__, __LINE__)

static inline void* malloc_check(size_t size, const char* file, int line) {
    void* p = malloc(size > 0 ? size : 1);
    if (p == NULL) die("out of host memory allocating %zu bytes (%s:%d)", size, file, line);
    return p;
}
#define mallocCheck(size) malloc_check(size, __FILE__, __LINE__)

static inline void* calloc_check(size_t count, size_t size, const char* file, int line) {
    void* p = calloc(count > 0 ? count : 1, size > 0 ? size : 1);
    if (p == NULL) die("out of host memory allocating %zu x %zu bytes (%s:%d)", count, size, file, line);
    return p;
}
#define callocCheck(count, size) calloc_check(count, size, __FILE__, __LINE__)

/* Size of an open file in bytes. */
static inline size_t file_size(FILE* f, const char* what) {
    struct stat st;
    if (fstat(fileno(f), &st) != 0) die("%s: stat failed (%s)", what, strerror(errno));
    return (size_t)st.st_size;
}

/* Creates `dir` and any missing parents (like `mkdir -p`). */
static inline void make_dir(const char* dir) {
    char path[PATH_LEN];
    if (snprintf(path, sizeof(path), "%s", dir) >= (int)sizeof(path)) die("%s: path too long", dir);
    for (char* p = path + 1;; p++) {
        int end = *p == '\0';
        if (*p == '/' || end) {
            *p = '\0';
            struct stat st;
            if (stat(path, &st) != 0) {
                if (mkdir(path, 0755) != 0 && errno != EEXIST) die("%s: cannot create directory (%s)", path, strerror(errno));
            } else if (!S_ISDIR(st.st_mode)) {
                die("%s: exists and is not a directory", path);
            }
            if (end) break;
            *p = '/';
        }
    }
}

/*
 * Writes go to "<path>.tmp"; atomic_commit() flushes, fsyncs and renames it over <path>, so a crash
 * leaves either the old file or the complete new one, never half of one. A write that fails (a full
 * disk, EIO, the file size limit) stops the program through the checks above, naming the temporary and
 * the error; the temporaries still open are then removed by an exit handler, so that a failed
 * checkpoint leaves nothing behind and, its DONE marker being written last, the previous one stays the
 * latest. (A kill -9 cannot run the handler; the next write of that name truncates the leftover, and
 * resume never reads a file that has no DONE marker.)
 */
#define ATOMIC_MAX_OPEN 4 /* temporaries open at once; the programs write one file at a time */
static char atomic_open_tmp[ATOMIC_MAX_OPEN][TMP_PATH_LEN]; /* "" marks a free slot */

static inline void atomic_remove_open_tmp(void) {
    for (int i = 0; i < ATOMIC_MAX_OPEN; i++) {
        if (atomic_open_tmp[i][0] != '\0') unlink(atomic_open_tmp[i]);
    }
}

static inline FILE* atomic_open(const char* path, char* tmp_path, size_t tmp_len) {
    static int exit_handler_set = 0;
    if ((size_t)snprintf(tmp_path, tmp_len, "%s.tmp", path) >= tmp_len) die("%s: path too long", path);
    int slot = 0;
    while (slot < ATOMIC_MAX_OPEN && atomic_open_tmp[slot][0] != '\0') slot++;
    if (slot == ATOMIC_MAX_OPEN) die("%s: more than %d files written at once", path, ATOMIC_MAX_OPEN);
    if (!exit_handler_set) {
        if (atexit(atomic_remove_open_tmp) != 0) die("%s: cannot register the exit handler that removes temporaries", path);
        exit_handler_set = 1;
    }
    FILE* f = fopenCheck(tmp_path, "wb");
    snprintf(atomic_open_tmp[slot], TMP_PATH_LEN, "%s", tmp_path);
    return f;
}

static inline void atomic_commit(FILE* f, const char* tmp_path, const char* path) {
    if (fflush(f) != 0) die("%s: flush failed (%s)", tmp_path, strerror(errno));
    if (fsync(fileno(f)) != 0) die("%s: fsync failed (%s)", tmp_path, strerror(errno));
    fcloseCheck(f, tmp_path);
    if (rename(tmp_path, path) != 0) die("%s: rename to %s failed (%s)", tmp_path, path, strerror(errno));
    for (int i = 0; i < ATOMIC_MAX_OPEN; i++) {
        if (strcmp(atomic_open_tmp[i], tmp_path) == 0) atomic_open_tmp[i][0] = '\0';
    }
    /* the rename is durable only once the directory entry is: a DONE marker written later must not
       survive a crash that loses this file */
    char dir[PATH_LEN];
    const char* slash = strrchr(path, '/');
    snprintf(dir, sizeof(dir), "%.*s", slash ? (int)(slash - path) : 1, slash ? path : ".");
    if (slash == path) snprintf(dir, sizeof(dir), "/");
    int fd = open(dir, O_RDONLY);
    if (fd < 0 || fsync(fd) != 0) die("%s: cannot sync the directory (%s)", dir, strerror(errno));
    close(fd);
}

/* Monotonic wall-clock time in seconds. */
static inline double wall_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline double mib(size_t bytes) { return (double)bytes / (1024.0 * 1024.0); }

/* Integer ceiling division for sizes. */
static inline size_t ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }

/* The index of s among the n names, or -1: an enum flag's value, parsed once (train/cli.h). */
static inline int name_index(const char* const* names, int n, const char* s) {
    for (int i = 0; i < n; i++)
        if (strcmp(s, names[i]) == 0) return i;
    return -1;
}

/* FNV-1a (32-bit, Fowler-Noll-Vo) of n bytes at p, continuing from h (start from FNV_OFFSET). */
#define FNV_OFFSET 2166136261u
static inline uint32_t fnv1a(uint32_t h, const void* p, size_t n) {
    for (size_t i = 0; i < n; i++) h = (h ^ ((const unsigned char*)p)[i]) * 16777619u;
    return h;
}
