/*
 * The op record of one optimizer step (docs/performance.md#the-steps-ops): when on, every backend op, GEMM,
 * collective and host copy the step runs appends one record (its name, kind, shape, the bytes of device
 * memory it reads and writes in the GPU's storage types, its FLOPs) at its head. Two modes, CPU build only:
 * RECORD_TRACE records the ops as they run (LLM8_TRACE_OPS=FILE: the first step of a run); RECORD_PLAN
 * records them and returns before they touch memory, over buffers mapped but never backed (--dry-run 2),
 * so that a 7B step is listed on a laptop. Identical records of a step are kept once, with a count, and
 * the order the ops ran as a sequence of their indices.
 * Off by default: a record call then returns at once and changes nothing.
 */
#pragma once

#include "common.h"

typedef enum { RECORD_OFF = 0, RECORD_TRACE, RECORD_PLAN } RecordMode;

/* Bytes of an activation element on the GPU (cuda/backend.cuh's act_t, BF16): records count GPU bytes. */
#define RECORD_ACT_BYTES 2.0

typedef struct {
    const char* op;     /* the backend function without its op_ / comm_ prefix */
    const char* kind;   /* "gemm", "kernel", "collective" (over the ranks), "host" (host <-> device, host reductions)
                           or "sync" (comm_mark / comm_wait of a slot: what waits for which collective) */
    size_t shape[5];    /* the op's dimensions, as its prototype names them (unused ones 0) */
    double read, write; /* bytes of device memory; a collective's read is its buffer, its write 0 */
    double flops;
    const char* detail; /* GEMM: operand and output types; collective: the wire; else "" */
} OpRecord;

typedef struct {
    OpRecord r;
    const char* phase; /* forward, backward, optimizer (backend_timer_start's), or step (between them) */
    size_t count;
} OpRecordEntry;

static RecordMode g_record_mode = RECORD_OFF;
static int g_record_collect = 0;          /* the step is being recorded (the set-up before it is not) */
static const char* g_record_phase = "step";
static OpRecordEntry* g_records = NULL;
static size_t g_num_records = 0, g_records_cap = 0;
static uint32_t* g_record_sequence = NULL; /* the entry of every op, in the order they ran */
static size_t g_sequence_len = 0, g_sequence_cap = 0;

static inline int op_record_same(const OpRecord* a, const OpRecord* b) {
    return strcmp(a->op, b->op) == 0 && strcmp(a->kind, b->kind) == 0 && strcmp(a->detail, b->detail) == 0 &&
           memcmp(a->shape, b->shape, sizeof(a->shape)) == 0 && a->read == b->read && a->write == b->write &&
           a->flops == b->flops;
}

/* Records r when the step is being recorded; returns 1 when the op must return without running (plan). */
static inline int op_record(OpRecord r) {
    if (g_record_mode == RECORD_OFF) return 0;
    if (r.detail == NULL) r.detail = "";
    if (g_record_collect) {
        size_t i = 0;
        while (i < g_num_records && !(strcmp(g_records[i].phase, g_record_phase) == 0 && op_record_same(&g_records[i].r, &r)))
            i++;
        if (i == g_num_records) {
            if (g_num_records == g_records_cap) {
                g_records_cap = g_records_cap ? 2 * g_records_cap : 256;
                g_records = (OpRecordEntry*)realloc(g_records, g_records_cap * sizeof(OpRecordEntry));
                if (g_records == NULL) die("op record: out of host memory");
            }
            g_records[g_num_records++] = (OpRecordEntry){r, g_record_phase, 0};
        }
        g_records[i].count++;
        if (g_sequence_len == g_sequence_cap) {
            g_sequence_cap = g_sequence_cap ? 2 * g_sequence_cap : 4096;
            g_record_sequence = (uint32_t*)realloc(g_record_sequence, g_sequence_cap * sizeof(uint32_t));
            if (g_record_sequence == NULL) die("op record: out of host memory");
        }
        g_record_sequence[g_sequence_len++] = (uint32_t)i;
    }
    return g_record_mode == RECORD_PLAN;
}

/* An op's or collective's first statement: records it (OpRecord's fields, in order) and, in plan-only
   mode, returns before it touches memory or the network. Evaluates nothing when recording is off. */
#define RECORD(...)                                                                       \
    do {                                                                                  \
        if (g_record_mode != RECORD_OFF && op_record((OpRecord){__VA_ARGS__})) return; \
    } while (0)

/* Sets the phase of the records that follow (the trainer's profile phases; "step" between them). */
static inline void op_record_phase(const char* phase) { g_record_phase = phase; }

/* The records as one JSON object: the run's description (a JSON fragment ending in ", "), "ops" (the distinct
   records with their counts, in the order they first ran) and "sequence" (each op's index in "ops", in the
   order the ops ran: what overlaps what). */
static inline void op_record_write(FILE* f, const char* run) {
    fprintf(f, "{%s\"act_bytes\": %g, \"ops\": [", run, RECORD_ACT_BYTES);
    for (size_t i = 0; i < g_num_records; i++) {
        const OpRecordEntry* e = &g_records[i];
        const size_t* d = e->r.shape;
        fprintf(f, "%s{\"op\": \"%s\", \"kind\": \"%s\", \"phase\": \"%s\", \"detail\": \"%s\", ", i ? ", " : "", e->r.op,
                e->r.kind, e->phase, e->r.detail);
        fprintf(f, "\"shape\": [%zu, %zu, %zu, %zu, %zu], \"read\": %.17g, \"write\": %.17g, \"flops\": %.17g, \"count\": %zu}",
                d[0], d[1], d[2], d[3], d[4], e->r.read, e->r.write, e->r.flops, e->count);
    }
    fprintf(f, "], \"sequence\": [");
    for (size_t i = 0; i < g_sequence_len; i++) fprintf(f, "%s%u", i ? ", " : "", g_record_sequence[i]);
    fprintf(f, "]}\n");
}

/* LLM8_TRACE_OPS=FILE (CPU build): the first step after this process's first that is `eligible` (the
   caller's: no statistics or check due) is recorded as it runs and written to FILE by rank 0. Called once
   per step; returns 1 when this step is the one (recording then starts). */
static inline int op_trace_begin(int eligible) {
    static int done = 0, steps = 0;
    if (done || steps++ == 0 || !eligible || getenv("LLM8_TRACE_OPS") == NULL) return 0;
    done = 1;
    g_record_mode = RECORD_TRACE;
    g_record_collect = 1;
    return 1;
}

/* Ends the traced step and writes its records (rank 0); run: as op_record_write's. */
static inline void op_trace_end(int rank, const char* run) {
    g_record_mode = RECORD_OFF;
    g_record_collect = 0;
    if (rank != 0) return;
    const char* path = getenv("LLM8_TRACE_OPS");
    FILE* f = fopen(path, "w");
    if (f == NULL) die("LLM8_TRACE_OPS %s: cannot write (%s)", path, strerror(errno));
    op_record_write(f, run);
    if (fclose(f) != 0) die("LLM8_TRACE_OPS %s: cannot write (%s)", path, strerror(errno));
}

/* A lasting copy of s (records keep their detail text after the caller's buffer is gone). */
static inline const char* op_record_intern(const char* s) {
    static char* kept[256];
    static int n = 0;
    for (int i = 0; i < n; i++)
        if (strcmp(kept[i], s) == 0) return kept[i];
    if (n == 256) die("op record: more than 256 distinct details");
    kept[n] = strdup(s);
    if (kept[n] == NULL) die("op record: out of host memory");
    return kept[n++];
}

/* The ranges of device memory that hold activation-type values, for the records of the ops that take bytes
   (zero, copy, all-gather): a build whose act_t is wider than the GPU's counts them at the GPU's size. */
#define RECORD_ACT_RANGES 16
static struct {
    const char* begin;
    size_t bytes;
    double ratio; /* GPU bytes per byte here */
} g_record_act[RECORD_ACT_RANGES];
static int g_record_num_act = 0;

/* p holds n values of the build's act_t (host_elem bytes each). */
static inline void op_record_mark_act(const void* p, size_t n, size_t host_elem) {
    if (p == NULL || n == 0 || (g_record_mode != RECORD_PLAN && getenv("LLM8_TRACE_OPS") == NULL)) return;
    if (g_record_num_act == RECORD_ACT_RANGES) die("op record: more than %d act ranges", RECORD_ACT_RANGES);
    g_record_act[g_record_num_act].begin = (const char*)p;
    g_record_act[g_record_num_act].bytes = n * host_elem;
    g_record_act[g_record_num_act].ratio = RECORD_ACT_BYTES / (double)host_elem;
    g_record_num_act++;
}

/* GPU bytes of `bytes` bytes of device memory at p. */
static inline double op_record_bytes(const void* p, size_t bytes) {
    const char* c = (const char*)p;
    for (int i = 0; i < g_record_num_act; i++)
        if (c >= g_record_act[i].begin && c < g_record_act[i].begin + g_record_act[i].bytes) return bytes * g_record_act[i].ratio;
    return (double)bytes;
}
