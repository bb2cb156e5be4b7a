/*
 * ZeRO shard arithmetic (docs/design.md#gradients-and-zero; Rajbhandari et al., "ZeRO", 2020), shared by
 * both builds and by every ZeRO stage, so the CPU build tests the layout the GPU runs.
 *
 * The parameter vector is cut into segments (the model's: one per tensor, or per layer of a per-layer
 * tensor). With `shards` shards, a segment of c elements is split into `shards` pieces of
 * s = ceil(ceil(c / ZERO_CHUNK) / shards) * ZERO_CHUNK elements; shard r owns [r s, min((r + 1) s, c))
 * of the segment, possibly nothing (a small segment lives in shard 0). Padding the pieces is what lets
 * any rank count work: nothing has to divide by it. Three layouts follow:
 *   full   every segment at `offset`, padded to shards * s elements: the working weights and the full
 *          gradients, in which a segment's reduce-scatter and all-gather are one contiguous collective;
 *   shard  every segment's piece at `shard_offset` (s elements each): a rank's master weights, AdamW
 *          moments and reduced gradients;
 *   chunks every segment's ZERO_CHUNK-element chunks numbered from `chunk_offset`: the gradient norm
 *          sums squares per chunk, and since pieces are whole chunks, every chunk has one owner and
 *          the norm is the same fixed-order sum for any rank count.
 * ZeRO-0 keeps everything on every rank: its layouts are those of one shard.
 */
#pragma once

#include "../core/common.h"

/* Granule of shard pieces and of the gradient norm's partial sums (elements; 16 KiB of FP32). */
#define ZERO_CHUNK ((size_t)4096)

/* One segment's place in the three layouts (see the banner). */
typedef struct {
    size_t count;        /* c: elements of the segment */
    size_t piece;        /* s: elements per shard piece, a multiple of ZERO_CHUNK */
    size_t offset;       /* in the full layout (padded to shards * piece) */
    size_t shard_offset; /* in a shard */
    size_t chunk_offset; /* index of its first chunk */
} ShardSegment;

typedef struct {
    int shards;    /* pieces per segment: the rank count under ZeRO-1/2, 1 under ZeRO-0 */
    size_t full;   /* elements of the full layout */
    size_t shard;  /* elements of one shard */
    size_t chunks; /* chunks of all segments */
} ShardLayout;

/* Chunks of a segment (or piece) of c elements; also on the device (the FP8 wire's kernels). */
LLM8_HD static inline size_t zero_chunks(size_t count) { return (count + ZERO_CHUNK - 1) / ZERO_CHUNK; }

/*
 * Fills offset, piece, shard_offset and chunk_offset of n segments (count set by the caller) for
 * `shards` shards, in segment order; returns the sizes of the layouts.
 */
static inline ShardLayout zero_layout(ShardSegment* segs, int n, int shards) {
    ShardLayout lay = {shards, 0, 0, 0};
    for (int i = 0; i < n; i++) {
        ShardSegment* s = &segs[i];
        s->piece = ceil_div(zero_chunks(s->count), (size_t)shards) * ZERO_CHUNK;
        s->offset = lay.full;
        s->shard_offset = lay.shard;
        s->chunk_offset = lay.chunks;
        lay.full += s->piece * (size_t)shards;
        lay.shard += s->piece;
        lay.chunks += zero_chunks(s->count);
    }
    return lay;
}

/* The elements [*begin, *begin + *count) of segment s that shard r owns (segment-local; count may be 0). */
static inline void zero_piece(const ShardSegment* s, int r, size_t* begin, size_t* count) {
    size_t b = (size_t)r * s->piece;
    size_t e = b + s->piece < s->count ? b + s->piece : s->count;
    *begin = b < s->count ? b : s->count;
    *count = e > *begin ? e - *begin : 0;
}

/* The shard that owns element i (segment-local) of segment s. */
static inline int zero_owner(const ShardSegment* s, size_t i) { return (int)(i / s->piece); }
