/*
 * Training checkpoints, read and written by both builds (docs/formats.md): a step's model
 * checkpoint (llama/model_file.h), every rank's training state and the DONE marker.
 *
 * A step's training state is one file per shard of the ZeRO layout it was saved in (comm/zero.h: one
 * file under ZeRO-0, one per rank under ZeRO-1/2). Each file holds what exact resume needs beyond the
 * weights, the same in every file (step, data position between global batches, sampling RNG, skip
 * counters, the shadow policy's state, the run settings that must not change across a resume, compared
 * field by field so a mismatch names the setting, and a hash of them), then the shard's AdamW moments
 * as they are stored (--optim-state: FP32, BF16, or E4M3/FP16 codes), the master weights as they are stored
 * (--master-weights: FP32 or FP16 codes) and the scale_inv per chunk of fp8 moments and of an fp16 master,
 * so resume is bit-exact. The layout is recorded (shard count
 * and ZERO_CHUNK), so a run resumes on another rank count or ZeRO stage by reading each of its new pieces
 * from the files that hold them (train/shard_io.h).
 *
 * Every file is written to "<name>.tmp", fsynced and renamed; the step's DONE_<step> marker is written
 * the same way only after the model and every state file exist, and resume picks the newest marker, so
 * a crash mid-write never leaves a half checkpoint that resume would read.
 */
#pragma once

#include <dirent.h>

#include "shadow_policy.h"
#include "../core/rng.h"
#include "../dataloader/dataloader.h"
#include "../comm/wire.h"
#include "../fp8/gemm.h"
#include "../llama/model_file.h"
#include "../llama/optim.h"

#define STATE_MAGIC 20251130
#define STATE_VERSION 6

/* Blocks the run identity records for --bf16-layers (a bit mask of this many bits). */
#define RUN_BF16_BLOCKS_MAX 256
#define RUN_BF16_BLOCK_WORDS (RUN_BF16_BLOCKS_MAX / 64)

/*
 * Settings a resume must keep: changing any of them would change the run's batches or numerics. The
 * rank count and the ZeRO stage may change (the global batch -d may not). Build it from a zeroed struct
 * so that its bytes (hashed) are defined.
 */
typedef struct {
    LlamaConfig cfg;
    int32_t B, T, precision, shuffle, pow2_scales, recompute;
    /* --fp8-accum (Fp8Accum) and !--fp8-fast-accum: in the word that was padding, with 0 for the defaults,
       so the state files of earlier builds (0 there) read as exact accumulation with fast fprop */
    int16_t fp8_accum, fp8_fprop_slow_accum;
    int64_t total_batch, seed;
    uint64_t bf16_blocks[RUN_BF16_BLOCK_WORDS]; /* --bf16-layers: bit l set = block l runs BF16 in -p fp8 */
    /* --fp8-recipe (Fp8Recipe) and the delayed recipe's --amax-history, --amax-algo (Fp8AmaxAlgo), --fp8-margin */
    int32_t fp8_recipe, amax_history, amax_algo, fp8_margin;
    /* --optim-state (llama/optim.h OptimState) and --grad-reduce (comm/wire.h CommWire) */
    int32_t optim_state, grad_reduce;
    /* --grad-buffer (llama/optim.h GradFormat) and --master-weights (MasterFormat) */
    int32_t grad_buffer, master_weights;
} RunIdentity;

/* One setting of RunIdentity besides the model config: the flag that sets it and where it is. */
typedef struct {
    const char* flag;
    size_t offset;
    size_t size; /* 2, 4 or 8 bytes */
} RunSetting;

#define RUN_SETTING(flag, field) {flag, offsetof(RunIdentity, field), sizeof(((RunIdentity*)0)->field)}
static const RunSetting RUN_SETTINGS[] = {
    RUN_SETTING("-b", B),
    RUN_SETTING("-t", T),
    RUN_SETTING("-p", precision),
    RUN_SETTING("--shuffle", shuffle),
    RUN_SETTING("--pow2-scales", pow2_scales),
    RUN_SETTING("-r", recompute),
    RUN_SETTING("-d", total_batch),
    RUN_SETTING("--seed", seed),
    RUN_SETTING("--fp8-accum", fp8_accum),
    RUN_SETTING("--fp8-fast-accum", fp8_fprop_slow_accum),
    RUN_SETTING("--fp8-recipe", fp8_recipe),
    RUN_SETTING("--amax-history", amax_history),
    RUN_SETTING("--amax-algo", amax_algo),
    RUN_SETTING("--fp8-margin", fp8_margin),
    RUN_SETTING("--optim-state", optim_state),
    RUN_SETTING("--grad-reduce", grad_reduce),
    RUN_SETTING("--grad-buffer", grad_buffer),
    RUN_SETTING("--master-weights", master_weights),
};
#define NUM_RUN_SETTINGS (sizeof(RUN_SETTINGS) / sizeof(RUN_SETTINGS[0]))

static inline long long run_setting_value(const RunIdentity* id, const RunSetting* s) {
    const char* p = (const char*)id + s->offset;
    if (s->size == sizeof(int64_t)) {
        int64_t v;
        memcpy(&v, p, sizeof(v));
        return v;
    }
    if (s->size == sizeof(int16_t)) {
        int16_t v;
        memcpy(&v, p, sizeof(v));
        return v;
    }
    int32_t v;
    memcpy(&v, p, sizeof(v));
    return v;
}

/* A setting's value as its flag spells it (-p fp8, --fp8-accum hopper, --fp8-fast-accum 0), else the number. */
static inline void run_setting_text(const RunIdentity* id, const RunSetting* s, char* out, size_t len) {
    long long v = run_setting_value(id, s);
    if (s->offset == offsetof(RunIdentity, precision)) snprintf(out, len, "%s", precision_name((Precision)v));
    else if (s->offset == offsetof(RunIdentity, fp8_accum)) snprintf(out, len, "%s", fp8_accum_name((int)v));
    else if (s->offset == offsetof(RunIdentity, fp8_fprop_slow_accum)) snprintf(out, len, "%d", v ? 0 : 1);
    else if (s->offset == offsetof(RunIdentity, fp8_recipe)) snprintf(out, len, "%s", fp8_recipe_name((int)v));
    else if (s->offset == offsetof(RunIdentity, amax_algo)) snprintf(out, len, "%s", fp8_amax_algo_name((int)v));
    else if (s->offset == offsetof(RunIdentity, optim_state)) snprintf(out, len, "%s", optim_state_name((int)v));
    else if (s->offset == offsetof(RunIdentity, grad_buffer)) snprintf(out, len, "%s", grad_format_name((int)v));
    else if (s->offset == offsetof(RunIdentity, master_weights)) snprintf(out, len, "%s", master_format_name((int)v));
    else if (s->offset == offsetof(RunIdentity, grad_reduce) && v >= 0 && v < COMM_WIRES)
        snprintf(out, len, "%s", COMM_WIRE_NAMES[v]);
    else snprintf(out, len, "%lld", v);
}

/* Records the BF16 blocks (L, non-zero = BF16) in the identity; stops naming the flag past RUN_BF16_BLOCKS_MAX. */
static inline void run_identity_set_bf16_blocks(RunIdentity* id, const char* blocks, int L) {
    memset(id->bf16_blocks, 0, sizeof(id->bf16_blocks));
    for (int l = 0; l < L; l++) {
        if (!blocks[l]) continue;
        if (l >= RUN_BF16_BLOCKS_MAX) die("flag --bf16-layers: block %d: blocks 0..%d only", l, RUN_BF16_BLOCKS_MAX - 1);
        id->bf16_blocks[l / 64] |= 1ull << (l % 64);
    }
}

/* The blocks l < n with set[l] non-zero as text: "none", or indices and ranges ("0,5-7"); ends in "..."
   when longer than len bytes. */
static inline void block_set_text(const char* set, int n, char* out, size_t len) {
    size_t used = 0;
    out[0] = '\0';
    for (int l = 0; l < n; l++) {
        if (!set[l]) continue;
        int last = l;
        while (last + 1 < n && set[last + 1]) last++;
        int k = last == l ? snprintf(out + used, len - used, "%s%d", used ? "," : "", l)
                          : snprintf(out + used, len - used, "%s%d-%d", used ? "," : "", l, last);
        if (k < 0 || (size_t)k >= len - used) { /* truncated: say so */
            if (len > 4) snprintf(out + len - 4, 4, "...");
            return;
        }
        used += (size_t)k;
        l = last;
    }
    if (used == 0) snprintf(out, len, "none");
}

/* The BF16 blocks of an identity as text (block_set_text). */
static inline void run_identity_bf16_text(const RunIdentity* id, char* out, size_t len) {
    char set[RUN_BF16_BLOCKS_MAX];
    for (int l = 0; l < RUN_BF16_BLOCKS_MAX; l++) set[l] = (char)((id->bf16_blocks[l / 64] >> (l % 64)) & 1);
    block_set_text(set, RUN_BF16_BLOCKS_MAX, out, len);
}

/* FNV-1a hash of the run identity (the "config hash" of the training state). */
static inline uint32_t run_identity_hash(const RunIdentity* id) {
    return fnv1a(FNV_OFFSET, id, sizeof(*id));
}

/*
 * Compares the checkpointed run's settings a with this run's b: returns 0 when they agree (every byte),
 * else 1 with the first differing setting and both values in `why` (e.g. "-b (checkpoint 8, now 4)").
 */
static inline int run_identity_diff(const RunIdentity* a, const RunIdentity* b, char* why, size_t len) {
    if (memcmp(&a->cfg, &b->cfg, sizeof(a->cfg)) != 0) {
        snprintf(why, len, "model config (-e) (checkpoint dim %d / %d layers, now dim %d / %d layers)", a->cfg.dim,
                 a->cfg.n_layers, b->cfg.dim, b->cfg.n_layers);
        return 1;
    }
    for (size_t i = 0; i < NUM_RUN_SETTINGS; i++) {
        const RunSetting* s = &RUN_SETTINGS[i];
        long long x = run_setting_value(a, s), y = run_setting_value(b, s);
        if (x == y) continue;
        char tx[32], ty[32];
        run_setting_text(a, s, tx, sizeof(tx));
        run_setting_text(b, s, ty, sizeof(ty));
        snprintf(why, len, "%s (checkpoint %s, now %s)", s->flag, tx, ty);
        return 1;
    }
    if (memcmp(a->bf16_blocks, b->bf16_blocks, sizeof(a->bf16_blocks)) != 0) {
        char x[64], y[64];
        run_identity_bf16_text(a, x, sizeof(x));
        run_identity_bf16_text(b, y, sizeof(y));
        snprintf(why, len, "--bf16-layers (checkpoint %s, now %s)", x, y);
        return 1;
    }
    /* what no flag sets (the padding word, which this build writes as 0) must agree too */
    if (memcmp(a, b, sizeof(*a)) != 0) {
        snprintf(why, len, "unused word of the run settings (written as 0: a corrupt file)");
        return 1;
    }
    return 0;
}

/* Everything but the big arrays of one state file. */
typedef struct {
    int32_t step;              /* optimizer steps done */
    int32_t shard;             /* the shard of the saved layout this file holds */
    int32_t shards;            /* shards of the saved layout (comm/zero.h): ranks under ZeRO-1/2, 1 under ZeRO-0 */
    int32_t chunk;             /* ZERO_CHUNK of the writer */
    int32_t world;             /* ranks of the run that wrote it */
    int32_t zero_stage;        /* its -z */
    int32_t consecutive_skips;
    int32_t total_skips;       /* skipped steps so far (AdamW's step count excludes them) */
    ShadowState shadow;        /* the shadow check's policy (train/shadow_policy.h) */
    DataLoaderPosition data;
    int32_t fp8_history_steps; /* --fp8-recipe delayed: applied FP8 steps in the amax history (else 0) */
    Rng sample_rng;
    RunIdentity id;
    uint64_t shard_elems;      /* elements of each array: the saved layout's shard size */
} TrainState;

static inline void state_path(char* out, size_t len, const char* dir, int step, int shard) {
    snprintf(out, len, "%s/state_%08d_%05d.bin", dir, step, shard);
}

static inline void model_path(char* out, size_t len, const char* dir, int step) {
    snprintf(out, len, "%s/model_%08d.bin", dir, step);
}

/*
 * Starts a state file: opens "<path>.tmp" (name in tmp) and writes the header and *s; the caller writes
 * the shard's arrays (STATE_M .. STATE_MASTER_SCALE_INV: state_array_offset) and finishes
 * with atomic_commit(f, tmp, path).
 */
static inline FILE* state_write_begin(const char* path, char* tmp, size_t tmp_len, const TrainState* s) {
    int32_t h[HEADER_INTS];
    memset(h, 0, sizeof(h));
    h[0] = STATE_MAGIC;
    h[1] = STATE_VERSION;
    h[2] = (int32_t)run_identity_hash(&s->id);
    h[3] = (int32_t)sizeof(TrainState);
    FILE* f = atomic_open(path, tmp, tmp_len);
    fwriteCheck(h, sizeof(int32_t), HEADER_INTS, f, tmp);
    fwriteCheck(s, sizeof(TrainState), 1, f, tmp);
    return f;
}

/* Bytes of the delayed recipe's state after the arrays of a state file of run `id` (model/model.h
   llama_fp8_state_bytes: the X and dY scale records, then their amax histories); 0 for other runs. */
static inline size_t state_fp8_bytes(const RunIdentity* id) {
    if (id->precision != PRECISION_FP8 || id->fp8_recipe != FP8_RECIPE_DELAYED) return 0;
    /* X and dY of the 4 linears of each block (model/model.h LIN_PER_LAYER) */
    return fp8_delayed_state_bytes(2 * (size_t)id->cfg.n_layers * 4, id->amax_history);
}

/* The arrays of a state file, in file order: the moments, the master weights (each as stored), the
   moments' scale_inv (fp8: 2 per chunk) and the master's (fp16: 1 per chunk); STATE_ARRAYS, element 0,
   is where the delayed recipe's state begins (state_fp8_bytes). */
enum { STATE_M, STATE_V, STATE_MASTER, STATE_SCALE_INV, STATE_MASTER_SCALE_INV, STATE_ARRAYS };

/* The storage formats a run identity records. */
static inline StateFormats run_identity_formats(const RunIdentity* id) {
    StateFormats f = {(OptimState)id->optim_state, (GradFormat)id->grad_buffer, (MasterFormat)id->master_weights};
    return f;
}

/* Bytes per element of array a in a state file of a run storing its state in formats f. */
static inline size_t state_elem_bytes(StateFormats f, int a) {
    if (a <= STATE_V) return adamw_moment_bytes(f.optim_state, a);
    return a == STATE_MASTER ? store_bytes(master_codec(f.master_weights)) : sizeof(float);
}

/* Index in array a of the value that element i of the shard (a multiple of ZERO_CHUNK for the scale_inv
   arrays) starts at: i itself, or for a scale_inv array its count of scales before i. */
static inline uint64_t state_array_index(StateFormats f, int a, uint64_t i) {
    if (a == STATE_SCALE_INV) return adamw_scale_count(f.optim_state, i);
    if (a == STATE_MASTER_SCALE_INV) return store_scale_count(master_codec(f.master_weights), i);
    return i;
}

/* Elements of array a in a state file of shard_elems elements per shard. */
static inline uint64_t state_array_elems(StateFormats f, uint64_t shard_elems, int a) { return state_array_index(f, a, shard_elems); }

/* Byte offset of element i of array a (STATE_*) in a state file of run `id` with shard_elems per shard. */
static inline long state_array_offset(const RunIdentity* id, uint64_t shard_elems, int a, uint64_t i) {
    StateFormats f = run_identity_formats(id);
    uint64_t at = HEADER_INTS * sizeof(int32_t) + sizeof(TrainState);
    for (int k = 0; k < a; k++) at += state_array_elems(f, shard_elems, k) * state_elem_bytes(f, k);
    return (long)(at + i * (a < STATE_ARRAYS ? state_elem_bytes(f, a) : 1));
}

/*
 * Opens a state file written for the run `expect` (its settings), reads its header into *s and returns
 * the file. Stops naming the file and the first setting that differs, the size problem, or step counters
 * that cannot be, on mismatch; the caller checks the layout fields against the model's.
 */
static inline FILE* state_open(const char* path, TrainState* s, const RunIdentity* expect) {
    FILE* f = fopenCheck(path, "rb");
    size_t bytes = file_size(f, path);
    size_t head = HEADER_INTS * sizeof(int32_t) + sizeof(TrainState);
    if (bytes < head) die("%s: truncated training state (%zu bytes)", path, bytes);
    int32_t h[HEADER_INTS];
    freadCheck(h, sizeof(int32_t), HEADER_INTS, f, path);
    if (h[0] != STATE_MAGIC) die("%s: bad magic %d in training state (expected %d)", path, h[0], STATE_MAGIC);
    if (h[1] != STATE_VERSION) die("%s: unsupported training state version %d (expected %d)", path, h[1], STATE_VERSION);
    if (h[3] != (int32_t)sizeof(TrainState)) die("%s: training state written by an incompatible build", path);
    freadCheck(s, sizeof(TrainState), 1, f, path);
    if ((uint32_t)h[2] != run_identity_hash(&s->id)) die("%s: config hash does not match its settings (corrupt file)", path);
    if (s->shards < 1 || s->shard < 0 || s->shard >= s->shards || s->shard_elems > (bytes - head) / sizeof(float))
        die("%s: bad layout in training state (shard %d of %d, %llu elements per array)", path, s->shard, s->shards,
            (unsigned long long)s->shard_elems);
    if (s->id.amax_history < 0 || s->id.amax_history > AMAX_HISTORY_MAX || s->id.cfg.n_layers < 0)
        die("%s: bad FP8 recipe settings in training state (corrupt file)", path);
    if (s->id.optim_state < 0 || s->id.optim_state > OPTIM_STATE_FP8 || s->id.grad_reduce < 0 || s->id.grad_reduce >= COMM_WIRES ||
        s->id.grad_buffer < 0 || s->id.grad_buffer > GRAD_FORMAT_FP8 || s->id.master_weights < 0 || s->id.master_weights > MASTER_FP16)
        die("%s: bad --optim-state %d, --grad-reduce %d, --grad-buffer %d or --master-weights %d in training state (corrupt file)",
            path, s->id.optim_state, s->id.grad_reduce, s->id.grad_buffer, s->id.master_weights);
    size_t expected = (size_t)state_array_offset(&s->id, s->shard_elems, STATE_ARRAYS, 0) + state_fp8_bytes(&s->id);
    if (bytes != expected) die("%s: truncated or oversized training state: expected %zu bytes, found %zu", path, expected, bytes);
    /* skipped steps count as steps (AdamW's step count is their difference) */
    if (s->step < 0 || s->consecutive_skips < 0 || s->consecutive_skips > s->total_skips || s->total_skips > s->step)
        die("%s: step %d with %d skipped steps, %d of them in a row, cannot be (corrupt file)", path, s->step, s->total_skips,
            s->consecutive_skips);
    if (s->fp8_history_steps < 0 || s->fp8_history_steps > s->step - s->total_skips)
        die("%s: %d steps in the FP8 amax history at step %d with %d skipped, cannot be (corrupt file)", path, s->fp8_history_steps,
            s->step, s->total_skips);
    char diff[256];
    if (run_identity_diff(&s->id, expect, diff, sizeof(diff)))
        die("%s: the checkpointed run used a different %s; resume with the same settings", path, diff);
    return f;
}

/* Writes the empty DONE_<step> marker (atomically): the step's checkpoint is complete. */
static inline void checkpoint_mark_done(const char* dir, int step) {
    char path[PATH_LEN], tmp[TMP_PATH_LEN];
    snprintf(path, sizeof(path), "%s/DONE_%08d", dir, step);
    FILE* f = atomic_open(path, tmp, sizeof(tmp));
    atomic_commit(f, tmp, path);
}

/* The newest step with a DONE marker in `dir`, or -1 when there is none. */
static inline int checkpoint_latest_step(const char* dir) {
    DIR* d = opendir(dir);
    if (d == NULL) return -1;
    int best = -1;
    struct dirent* e;
    while ((e = readdir(d)) != NULL) {
        int step;
        char extra;
        if (sscanf(e->d_name, "DONE_%d%c", &step, &extra) == 1 && step > best) best = step;
    }
    closedir(d);
    return best;
}
