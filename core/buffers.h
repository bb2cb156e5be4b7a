/*
 * Memory you can see (STYLE.md): a kind of buffer is one allocation described by a table of named
 * sub-buffers, each aligned to BUFFER_ALIGN bytes; the table gives the allocation's size, points every
 * sub-buffer into it and prints the sizes in MiB at start-up. The model lays out its state, activations
 * and communication buffers this way, and the memory plan (--dry-run) sums the same tables without
 * allocating them. Memory allocated outside such tables (library workspaces, op scratch) is described
 * to the plan as MemoryEstimate entries, and the trainer sizes the scratch from those same entries at
 * start-up, so that nothing is allocated once the steps run (docs/memory.md).
 */
#pragma once

#include "common.h"

/* One named buffer of a layout table: *ptr receives its address (NULL when count is 0). */
typedef struct {
    const char* name;
    void** ptr;
    size_t count;
    size_t elem;
    const char* category; /* what the memory plan sums it under ("master weights", "activations", ...) */
} BufferSpec;

/* Alignment of every sub-buffer: cuBLASLt and vector loads want 16 bytes; 256 keeps cache lines apart. */
#define BUFFER_ALIGN 256

/*
 * The emulated GPU (emu/, docs/emulated-gpu.md) puts a poisoned redzone of BUFFER_REDZONE bytes after
 * every sub-buffer, and poisons each one's alignment tail too, so that an off-by-one store lands in
 * poisoned memory (an AddressSanitizer report naming the kernel) instead of in the next tensor. The
 * redzones count in buffers_bytes; elsewhere BUFFER_REDZONE is 0.
 */
#ifdef LLM8_EMU
#define BUFFER_REDZONE BUFFER_ALIGN
/* Poisons [p, p + bytes) of a device allocation, in order on the legacy stream (emu/runtime.cpp). */
void emu_redzone(void* p, size_t bytes);
#else
#define BUFFER_REDZONE 0
#endif

static inline size_t buffer_bytes(const BufferSpec* spec) {
    return ceil_div(spec->count * spec->elem, BUFFER_ALIGN) * BUFFER_ALIGN;
}

static inline size_t buffers_bytes(const BufferSpec* specs, int n) {
    size_t total = 0;
    for (int i = 0; i < n; i++) total += buffer_bytes(&specs[i]) + BUFFER_REDZONE;
    return total;
}

/* Points every buffer of the table into `base` (one allocation of buffers_bytes), in table order. */
static inline void buffers_point(const BufferSpec* specs, int n, void* base) {
    char* p = (char*)base;
    for (int i = 0; i < n; i++) {
        *specs[i].ptr = specs[i].count > 0 ? (void*)p : NULL;
#ifdef LLM8_EMU
        size_t used = specs[i].count * specs[i].elem;
        emu_redzone(p + used, buffer_bytes(&specs[i]) - used + BUFFER_REDZONE);
#endif
        p += buffer_bytes(&specs[i]) + BUFFER_REDZONE;
    }
}

static inline void buffers_print(const char* title, const BufferSpec* specs, int n) {
    printf("| %s: %.1f MiB\n", title, mib(buffers_bytes(specs, n)));
    for (int i = 0; i < n; i++) {
        if (specs[i].count > 0) printf("|   %-14s %10.2f MiB\n", specs[i].name, mib(specs[i].count * specs[i].elem));
    }
}

/* Device scratch of an op or a collective (core/cuda_utils.cuh scratch_reserve), named as the memory
   plan's entry that sizes it. */
typedef struct {
    void* ptr;
    size_t bytes;
    const char* name;
} DeviceScratch;

/* A named allocation outside the tables, for the memory plan: bytes, exact or an upper bound or an
   estimate (estimate set), with what it is, and the scratch that holds it when the run sizes it at
   start-up from this entry (backend_reserve_workspaces; NULL: allocated elsewhere, or not ours). */
typedef struct {
    const char* name;
    size_t bytes;
    int estimate;
    const char* what;
    DeviceScratch* scratch;
} MemoryEstimate;
