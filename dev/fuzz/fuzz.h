/*
 * The common part of llm8's libFuzzer harnesses (dev/fuzz/fuzz_*.c, built and run by `make fuzz`).
 * A harness includes this file first, then the product header it fuzzes, and defines fuzz_target(),
 * which feeds one input to a reader the way the trainer calls it.
 *
 * The readers stop on a bad input through die(), which exits; a fuzzing process must survive that. So:
 *   - die_hook (core/common.h) longjmps back here: the rejection ends the input, not the process. The
 *     hook also checks what the product promises of every rejection: one line, naming the file (or,
 *     for the command line, the flag); a message that breaks this aborts, which libFuzzer reports.
 *   - A reader that stops halfway leaves files open and memory allocated, which the real program gives
 *     back by exiting. The macros below route the readers' fopen/fclose, malloc/calloc/realloc/free/
 *     strdup and glob/globfree (the only resources they take) through trackers; a rejection releases what is left,
 *     and an accepted input must have released everything itself (the product's *_free functions), so
 *     a leak on the success path aborts too.
 * Inputs reach the file readers through a memfd named by its /proc/self/fd path: no disk traffic.
 */
#pragma once

#include <glob.h>
#include <setjmp.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* ---- trackers (defined before the macros, so they call the real functions) ---- */

/* Header of a tracked allocation: links in the list of live blocks, padded to malloc's alignment. */
typedef union FuzzBlock {
    struct {
        union FuzzBlock* prev;
        union FuzzBlock* next;
        size_t size; /* the caller's bytes, for realloc */
    } link;
    max_align_t align;
} FuzzBlock;

#define FUZZ_MAX_FILES 8 /* the readers hold at most two files open at once */
#define FUZZ_MAX_GLOBS 4

static FuzzBlock fuzz_blocks = {{&fuzz_blocks, &fuzz_blocks, 0}}; /* circular list of live blocks */
static FILE* fuzz_files[FUZZ_MAX_FILES];
static glob_t fuzz_globs[FUZZ_MAX_GLOBS];
static int fuzz_glob_live[FUZZ_MAX_GLOBS];

static inline void fuzz_fail(const char* what, const char* detail) {
    fprintf(stderr, "fuzz: %s: %s\n", what, detail);
    abort();
}

static inline void* fuzz_malloc(size_t size) {
    FuzzBlock* b = (FuzzBlock*)malloc(sizeof(FuzzBlock) + size);
    if (b == NULL) return NULL;
    b->link.prev = fuzz_blocks.link.prev;
    b->link.next = &fuzz_blocks;
    b->link.size = size;
    fuzz_blocks.link.prev->link.next = b;
    fuzz_blocks.link.prev = b;
    return b + 1;
}

static inline void fuzz_free(void* p) {
    if (p == NULL) return;
    FuzzBlock* b = (FuzzBlock*)p - 1;
    b->link.prev->link.next = b->link.next;
    b->link.next->link.prev = b->link.prev;
    free(b);
}

static inline void* fuzz_calloc(size_t count, size_t size) {
    size_t bytes;
    if (__builtin_mul_overflow(count, size, &bytes)) return NULL;
    void* p = fuzz_malloc(bytes);
    if (p != NULL) memset(p, 0, bytes);
    return p;
}

/* realloc as a tracked malloc, copy and free (the readers grow arrays with it). */
static inline void* fuzz_realloc(void* p, size_t size) {
    void* q = fuzz_malloc(size);
    if (q == NULL || p == NULL) return q;
    size_t old = ((FuzzBlock*)p - 1)->link.size;
    memcpy(q, p, old < size ? old : size);
    fuzz_free(p);
    return q;
}

static inline char* fuzz_strdup(const char* s) {
    size_t n = strlen(s) + 1;
    char* p = (char*)fuzz_malloc(n);
    if (p != NULL) memcpy(p, s, n);
    return p;
}

static inline FILE* fuzz_fopen(const char* path, const char* mode) {
    FILE* f = fopen(path, mode);
    if (f == NULL) return NULL;
    for (int i = 0; i < FUZZ_MAX_FILES; i++) {
        if (fuzz_files[i] == NULL) {
            fuzz_files[i] = f;
            return f;
        }
    }
    fuzz_fail("fopen", "more files open at once than the harness tracks (FUZZ_MAX_FILES)");
    return NULL;
}

static inline int fuzz_fclose(FILE* f) {
    for (int i = 0; i < FUZZ_MAX_FILES; i++) {
        if (fuzz_files[i] == f) fuzz_files[i] = NULL;
    }
    return fclose(f);
}

static inline int fuzz_glob(const char* pattern, int flags, int (*errfunc)(const char*, int), glob_t* g) {
    int rc = glob(pattern, flags, errfunc, g);
    if (rc != 0) return rc;
    for (int i = 0; i < FUZZ_MAX_GLOBS; i++) {
        if (!fuzz_glob_live[i]) {
            fuzz_globs[i] = *g;
            fuzz_glob_live[i] = 1;
            return rc;
        }
    }
    fuzz_fail("glob", "more glob results live at once than the harness tracks (FUZZ_MAX_GLOBS)");
    return rc;
}

static inline void fuzz_globfree(glob_t* g) {
    for (int i = 0; i < FUZZ_MAX_GLOBS; i++) {
        if (fuzz_glob_live[i] && fuzz_globs[i].gl_pathv == g->gl_pathv) fuzz_glob_live[i] = 0;
    }
    globfree(g);
}

/* After a rejection: gives back what the stopped reader still held. */
static inline void fuzz_release_all(void) {
    while (fuzz_blocks.link.next != &fuzz_blocks) fuzz_free(fuzz_blocks.link.next + 1);
    for (int i = 0; i < FUZZ_MAX_FILES; i++) {
        if (fuzz_files[i] != NULL) fuzz_fclose(fuzz_files[i]);
    }
    for (int i = 0; i < FUZZ_MAX_GLOBS; i++) {
        if (fuzz_glob_live[i]) fuzz_globfree(&fuzz_globs[i]);
    }
}

/* After an accepted input: the product must have released everything. */
static inline void fuzz_check_released(void) {
    if (fuzz_blocks.link.next != &fuzz_blocks) fuzz_fail("leak", "an accepted input left memory allocated");
    for (int i = 0; i < FUZZ_MAX_FILES; i++) {
        if (fuzz_files[i] != NULL) fuzz_fail("leak", "an accepted input left a file open");
    }
    for (int i = 0; i < FUZZ_MAX_GLOBS; i++) {
        if (fuzz_glob_live[i]) fuzz_fail("leak", "an accepted input left a glob result allocated");
    }
}

#define malloc fuzz_malloc
#define calloc fuzz_calloc
#define realloc fuzz_realloc
#define free fuzz_free
#define strdup fuzz_strdup
#define fopen fuzz_fopen
#define fclose fuzz_fclose
#define glob fuzz_glob
#define globfree fuzz_globfree

/* ---- die hook ---- */

#include "../../core/common.h"

static jmp_buf fuzz_rejected;
static const char* fuzz_must_name; /* what every rejection message must contain, NULL: nothing */

static inline void fuzz_die_hook(const char* message) {
    if (message[0] == '\0' || strchr(message, '\n') != NULL) fuzz_fail("rejection is not one line", message);
    if (fuzz_must_name != NULL && strstr(message, fuzz_must_name) == NULL) fuzz_fail("rejection does not name its subject", message);
    longjmp(fuzz_rejected, 1);
}

/* Stops the fuzzer on a broken property of an accepted input. */
static inline void fuzz_require(int ok, const char* property) {
    if (!ok) fuzz_fail("property broken", property);
}

/* ---- inputs as files ---- */

/* Writes the input to a memfd (reused across inputs) and returns a path that opens it. */
static inline const char* fuzz_input_file(const uint8_t* data, size_t size) {
    static int fd = -1;
    static char path[64];
    if (fd < 0) {
        fd = memfd_create("llm8-fuzz-input", 0);
        if (fd < 0) fuzz_fail("memfd_create", strerror(errno));
        snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    }
    if (ftruncate(fd, 0) != 0 || pwrite(fd, data, size, 0) != (ssize_t)size) fuzz_fail("memfd write", strerror(errno));
    return path;
}

/* ---- the libFuzzer entry point ---- */

/* One input through one reader; defined by each harness. Rejections may stop it anywhere (die). */
static void fuzz_target(const uint8_t* data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    die_hook = fuzz_die_hook;
    fuzz_must_name = NULL;
    if (setjmp(fuzz_rejected) == 0) {
        fuzz_target(data, size);
        fuzz_check_released();
    } else {
        fuzz_release_all();
    }
    return 0;
}
