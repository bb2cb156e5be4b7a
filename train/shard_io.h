/*
 * Checkpoints of a sharded model (docs/checkpoints.md), for any rank count and ZeRO stage:
 *   - the model file (llama/model_file.h) holds every parameter in checkpoint order; rank 0 writes it,
 *     the other ranks' pieces of the master weights reaching it by all-gather, a bounded chunk at a time;
 *   - every rank that holds a shard of the ZeRO layout writes its state file (train/checkpoint.h): the
 *     global fields and its shard's AdamW moments (in their --optim-state format), master weights (in
 *     their --master-weights format) and the scale_inv per chunk of fp8 moments and an fp16 master, as
 *     laid out in memory;
 *   - after a barrier rank 0 writes DONE_<step>, so a checkpoint is either complete or ignored.
 * Loading reads, for each of this rank's pieces, the parts of the saved files that hold it: the saved
 * layout (its shard count, recorded in the files) need not be this run's, so a run saved on N ranks
 * resumes on M ranks or another ZeRO stage. Shard pieces are whole ZERO_CHUNK chunks, which is the moments'
 * scale granule (llama/optim.h ADAMW_CHUNK), so each chunk's scales travel with it. Weights and state stream between files and backend memory
 * through STREAM_CHUNK_FLOATS-float host buffers: no host copy of the model is ever made.
 * Included after a backend, a communication implementation and model/model.h.
 */
#pragma once

#include "checkpoint.h"
#include "../comm/comm.h"
#include "../model/model.h"

/* Host staging buffer between files and backend memory: 64 MiB, so checkpointing a 13B model needs no
   host copy of it. */
#define STREAM_CHUNK_FLOATS ((size_t)1 << 24)

/* model_save's device staging, ranks > 1: chunk k of every rank's piece of a segment at once (S x at most
   STREAM_CHUNK_FLOATS / S floats); 0 bytes for one shard. */
static inline size_t checkpoint_staging_bytes(const Llama* m) {
    size_t S = (size_t)m->layout.shards, piece = 0;
    if (S == 1) return 0;
    for (int i = 0; i < m->num_segs; i++) piece = m->segs[i].shard.piece > piece ? m->segs[i].shard.piece : piece;
    size_t step = STREAM_CHUNK_FLOATS / S;
    return S * (piece < step ? piece : step) * sizeof(float);
}

/* The staging, reserved at start-up by the trainer (checkpoint_reserve_staging), so that writing a
   checkpoint allocates nothing; a program that reserved none gets one per model_save. */
static void* g_checkpoint_staging = NULL;

static inline void checkpoint_reserve_staging(const Llama* m) {
    size_t bytes = checkpoint_staging_bytes(m);
    if (bytes > 0 && g_checkpoint_staging == NULL) g_checkpoint_staging = dev_alloc(bytes);
}
static inline void checkpoint_release_staging(void) {
    if (g_checkpoint_staging) dev_free(g_checkpoint_staging);
    g_checkpoint_staging = NULL;
}

/* Byte offset of parameter i (checkpoint order) in a model file. */
static inline long model_param_offset(size_t i) { return (long)(HEADER_INTS * sizeof(int32_t) + i * sizeof(float)); }

/*
 * Rank 0 writes the FP32 master weights of the whole model to `path` (atomically); every rank must call
 * it (the pieces of other ranks arrive by all-gather of at most STREAM_CHUNK_FLOATS floats in all).
 */
static inline void model_save(const char* path, Llama* m) {
    int lead = g_dist.rank == 0, S = m->layout.shards;
    char tmp[TMP_PATH_LEN];
    FILE* f = lead ? checkpoint_write_begin(path, tmp, sizeof(tmp), &m->cfg) : NULL;
    size_t step = STREAM_CHUNK_FLOATS / (size_t)S;
    float* host = (float*)mallocCheck(STREAM_CHUNK_FLOATS * sizeof(float));
    float* staging = (float*)g_checkpoint_staging;
    if (S > 1 && staging == NULL) staging = (float*)dev_alloc(checkpoint_staging_bytes(m));
    for (int i = 0; i < m->num_segs; i++) {
        ModelSegment* s = &m->segs[i];
        if (S == 1) {
            const float* master = lead ? llama_master_piece(m, s, 1) : NULL; /* an fp16 master: decoded once per segment */
            for (size_t k = 0; lead && k < s->param.count; k += STREAM_CHUNK_FLOATS) {
                size_t n = s->param.count - k < STREAM_CHUNK_FLOATS ? s->param.count - k : STREAM_CHUNK_FLOATS;
                dev_download(host, master + k, n * sizeof(float));
                fwriteCheck(host, sizeof(float), n, f, tmp);
            }
            continue;
        }
        /* chunk k of every rank's piece at once: rank r's floats at staging + r * len */
        const float* piece = llama_master_piece(m, s, 1);
        for (size_t k = 0; k < s->shard.piece; k += step) {
            size_t len = s->shard.piece - k < step ? s->shard.piece - k : step;
            dev_copy(staging + (size_t)g_dist.rank * len, piece + k, len * sizeof(float));
            comm_all_gather(staging, len * sizeof(float));
            comm_wait_all();
            if (!lead) continue;
            dev_download(host, staging, (size_t)S * len * sizeof(float));
            for (int r = 0; r < S; r++) {
                size_t first = (size_t)r * s->shard.piece + k; /* segment-local index of the chunk's first float */
                if (first >= s->param.count) break;
                size_t n = s->param.count - first < len ? s->param.count - first : len;
                fseekCheck(f, model_param_offset(s->param.param_offset + first), SEEK_SET, tmp);
                fwriteCheck(host + (size_t)r * len, sizeof(float), n, f, tmp);
            }
        }
    }
    free(host);
    if (staging && staging != g_checkpoint_staging) dev_free(staging);
    if (lead) atomic_commit(f, tmp, path);
}

/* Produces `count` FP32 parameters starting at `param_begin` (checkpoint order) into out. */
typedef void (*ParamSource)(void* ctx, size_t param_begin, size_t count, float* out);

/* Fills this rank's pieces of the master weights from `source`, through a STREAM_CHUNK_FLOATS buffer. */
static inline void master_fill(Llama* m, ParamSource source, void* ctx) {
    float* host = (float*)mallocCheck(STREAM_CHUNK_FLOATS * sizeof(float));
    for (int i = 0; i < m->num_segs; i++) {
        ModelSegment* s = &m->segs[i];
        size_t b = s->own_begin, n = s->own_count;
        float* piece = llama_master_piece(m, s, 0);
        for (size_t k = 0; k < n; k += STREAM_CHUNK_FLOATS) {
            size_t len = n - k < STREAM_CHUNK_FLOATS ? n - k : STREAM_CHUNK_FLOATS;
            source(ctx, s->param.param_offset + b + k, len, host);
            dev_upload(piece + k, host, len * sizeof(float));
        }
        if (n > 0) llama_master_store(m, s);
    }
    free(host);
}

typedef struct {
    FILE* f;
    const char* path;
} ModelFile;

static void model_file_source(void* ctx, size_t param_begin, size_t count, float* out) {
    ModelFile* mf = (ModelFile*)ctx;
    fseekCheck(mf->f, model_param_offset(param_begin), SEEK_SET, mf->path);
    freadCheck(out, sizeof(float), count, mf->f, mf->path);
}

/* Loads this rank's pieces of the master weights from a model checkpoint (checked against the model's
   config); the caller refreshes the working weights. */
static inline void model_load(const char* path, Llama* m) {
    LlamaConfig file_cfg;
    ModelFile mf = {checkpoint_open(path, &file_cfg), path};
    if (memcmp(&file_cfg, &m->cfg, sizeof(LlamaConfig)) != 0) die("%s: model config differs from the run's", path);
    master_fill(m, model_file_source, &mf);
    fcloseCheck(mf.f, path);
}

typedef struct {
    const LlamaConfig* cfg;
    uint64_t seed;
} ModelInit;

static void model_init_source(void* ctx, size_t param_begin, size_t count, float* out) {
    ModelInit* mi = (ModelInit*)ctx;
    llama_init_params_range(mi->cfg, mi->seed, param_begin, count, out);
}

/* Llama-style random init (params.h) of this rank's pieces of the master weights. */
static inline void model_init(Llama* m, uint64_t seed) {
    ModelInit mi = {&m->cfg, seed};
    master_fill(m, model_init_source, &mi);
}

/* Does this rank write a state file? One per shard of the layout: rank r holds shard r (ZeRO-0: rank 0). */
static inline int state_writer(const Llama* m) { return g_dist.rank < m->layout.shards; }

/*
 * Writes the checkpoint of step s->step to `dir`: the model (rank 0), this rank's state file (if it
 * holds a shard) with the global fields of *s and its layout, then DONE_<step> after a barrier.
 * Every rank must call it.
 */
static inline void checkpoint_save(const char* dir, Llama* m, TrainState* s) {
    char path[PATH_LEN], tmp[TMP_PATH_LEN];
    model_path(path, sizeof(path), dir, s->step);
    model_save(path, m);
    if (state_writer(m)) {
        s->shard = m->shard_index;
        s->shards = m->layout.shards;
        s->chunk = (int32_t)ZERO_CHUNK;
        s->world = m->opt.sharding.world;
        s->zero_stage = m->opt.sharding.zero_stage;
        s->shard_elems = m->layout.shard;
        state_path(path, sizeof(path), dir, s->step, m->shard_index);
        FILE* f = state_write_begin(path, tmp, sizeof(tmp), s);
        float* host = (float*)mallocCheck(STREAM_CHUNK_FLOATS * sizeof(float));
        const void* arrays[STATE_ARRAYS] = {m->adam_m, m->adam_v, m->master, m->adam_scale_inv, m->master_scale_inv};
        StateFormats formats = llama_state_formats(m);
        for (int a = 0; a < STATE_ARRAYS; a++) {
            size_t elems = state_array_elems(formats, m->layout.shard, a), eb = state_elem_bytes(formats, a);
            for (size_t k = 0; k < elems; k += STREAM_CHUNK_FLOATS) {
                size_t n = elems - k < STREAM_CHUNK_FLOATS ? elems - k : STREAM_CHUNK_FLOATS;
                dev_download(host, (const char*)arrays[a] + k * eb, n * eb);
                fwriteCheck(host, eb, n, f, tmp);
            }
        }
        free(host);
        /* the delayed recipe's state, replicated: every file holds it */
        size_t fp8_bytes = llama_fp8_state_bytes(m);
        if (fp8_bytes != state_fp8_bytes(&s->id)) die("%s: FP8 recipe state of %zu bytes, its settings say %zu", tmp, fp8_bytes,
                                                    state_fp8_bytes(&s->id));
        if (fp8_bytes) {
            void* fp8 = mallocCheck(fp8_bytes);
            llama_fp8_state_download(m, fp8);
            fwriteCheck(fp8, 1, fp8_bytes, f, tmp);
            free(fp8);
        }
        atomic_commit(f, tmp, path);
    }
    comm_barrier();
    if (g_dist.rank == 0) checkpoint_mark_done(dir, s->step);
}

/*
 * Loads step `step` of `dir` into this rank's pieces of the master weights and AdamW moments, whatever
 * layout it was saved in, and returns the global fields in *s. Checks every file's settings against
 * `expect` and its layout against the model's config; stops naming the file otherwise.
 */
static inline void checkpoint_load(const char* dir, int step, Llama* m, const RunIdentity* expect, TrainState* s) {
    char path[PATH_LEN];
    state_path(path, sizeof(path), dir, step, 0);
    FILE* first = state_open(path, s, expect);
    size_t fp8_bytes = state_fp8_bytes(&s->id);
    if (fp8_bytes != llama_fp8_state_bytes(m)) die("%s: FP8 recipe state of %zu bytes, the model has %zu", path, fp8_bytes,
                                                   llama_fp8_state_bytes(m));
    if (fp8_bytes) {
        void* fp8 = mallocCheck(fp8_bytes);
        fseekCheck(first, state_array_offset(&s->id, s->shard_elems, STATE_ARRAYS, 0), SEEK_SET, path);
        freadCheck(fp8, 1, fp8_bytes, first, path);
        llama_fp8_state_upload(m, fp8, s->fp8_history_steps);
        free(fp8);
    }
    fcloseCheck(first, path);
    if (s->step != step) die("%s: holds step %d, expected %d", path, s->step, step);
    if (s->chunk != (int32_t)ZERO_CHUNK) die("%s: written with shard granule %d, this build uses %zu", path, s->chunk, ZERO_CHUNK);
    /* the saved layout, from the same segments */
    ShardSegment* saved = (ShardSegment*)mallocCheck((size_t)m->num_segs * sizeof(ShardSegment));
    for (int i = 0; i < m->num_segs; i++) saved[i].count = m->segs[i].param.count;
    ShardLayout lay = zero_layout(saved, m->num_segs, s->shards);
    if (lay.shard != s->shard_elems) die("%s: %llu elements per array, the model's layout of %d shards has %zu", path,
                                         (unsigned long long)s->shard_elems, s->shards, lay.shard);
    FILE** files = (FILE**)callocCheck((size_t)s->shards, sizeof(FILE*));
    float* host = (float*)mallocCheck(STREAM_CHUNK_FLOATS * sizeof(float));
    void* arrays[STATE_ARRAYS] = {m->adam_m, m->adam_v, m->master, m->adam_scale_inv, m->master_scale_inv};
    StateFormats f = llama_state_formats(m);
    for (int i = 0; i < m->num_segs; i++) {
        ModelSegment* seg = &m->segs[i];
        size_t b = seg->own_begin, n = seg->own_count;
        for (size_t x = b; x < b + n;) {
            /* the run of this piece that saved shard r holds, at most a buffer's worth */
            int r = zero_owner(&saved[i], x);
            size_t end = ((size_t)r + 1) * saved[i].piece < b + n ? ((size_t)r + 1) * saved[i].piece : b + n;
            size_t len = end - x < STREAM_CHUNK_FLOATS ? end - x : STREAM_CHUNK_FLOATS;
            state_path(path, sizeof(path), dir, step, r);
            if (files[r] == NULL) {
                TrainState other;
                files[r] = state_open(path, &other, expect);
                if (other.step != step || other.shard != r || other.shards != s->shards || other.shard_elems != s->shard_elems)
                    die("%s: holds shard %d of %d at step %d, expected shard %d of %d at step %d", path, other.shard,
                        other.shards, other.step, r, s->shards, step);
            }
            /* saved-shard and this shard's element positions: both multiples of ZERO_CHUNK (chunk-aligned runs) */
            uint64_t at = saved[i].shard_offset + (x - (size_t)r * saved[i].piece), to = seg->shard.shard_offset + (x - b);
            for (int a = 0; a < STATE_ARRAYS; a++) {
                size_t eb = state_elem_bytes(f, a);
                uint64_t from = state_array_index(f, a, at), into = state_array_index(f, a, to);
                size_t count = (size_t)state_array_index(f, a, len);
                if (count == 0) continue;
                fseekCheck(files[r], state_array_offset(&s->id, s->shard_elems, a, from), SEEK_SET, path);
                freadCheck(host, eb, count, files[r], path);
                /* a scale_inv is a positive power of two (optim.h): anything else would silently poison the update */
                int scales = a == STATE_SCALE_INV || a == STATE_MASTER_SCALE_INV;
                for (size_t k = 0; scales && k < count; k++) {
                    int e;
                    if (!(host[k] > 0.0f) || host[k] > FLT_MAX || frexpf(host[k], &e) != 0.5f)
                        die("%s: %s scale_inv %g of chunk %llu is not a positive power of two (corrupt file)", path,
                            a == STATE_SCALE_INV ? "AdamW" : "master weights'", (double)host[k],
                            (unsigned long long)(a == STATE_SCALE_INV ? (from + k) / 2 : from + k));
                }
                dev_upload((char*)arrays[a] + into * eb, host, count * eb);
            }
            x += len;
        }
    }
    for (int r = 0; r < s->shards; r++) {
        if (files[r] == NULL) continue;
        state_path(path, sizeof(path), dir, step, r);
        fcloseCheck(files[r], path);
    }
    free(files);
    free(host);
    free(saved);
}
