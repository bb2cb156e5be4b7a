/*
 * The FP8 step state of a model (docs/model.md): one scale record per operand of every block linear
 * (W, X and dY of each slot), the cast statistics, the delayed recipe's amax histories and step amaxes,
 * and which slots run FP8 now. The passes ask it how to cast an operand (fp8_quant: the recipe resolved
 * into one Fp8Quant that the backend's op_fp8_quantize runs); the trainer asks it, once a step, for the
 * non-finite flags, the statistics and the delayed update. Compiled after a backend, as model.h.
 */
#pragma once

#include "options.h"
#include "../core/buffers.h"
#include "../llama/backend.h"
#include "../llama/params.h"

/* The three FP8 operands of a linear layer: weight (E4M3), input X (E4M3), output gradient dY (E5M2). */
enum { FP8_OP_W, FP8_OP_X, FP8_OP_DY, FP8_OPS };
static const char* const FP8_OPERAND_NAMES[FP8_OPS] = {"W", "X", "dY"};
/* The records the delayed recipe keeps a history for: X, then dY. */
#define FP8_DELAYED_OPS (FP8_OPS - FP8_OP_X)

typedef struct {
    Fp8Settings set;
    int on;              /* -p fp8 */
    size_t slots;        /* L * LIN_PER_LAYER */
    Fp8Scale* scales;    /* (FP8_OPS, slots) operand-major */
    Fp8Counts* counts;   /* (FP8_OPS, slots) as scales */
    float* history;      /* (FP8_DELAYED_OPS, slots, H) delayed: the amax history of each X, then dY, record */
    float* step_amax;    /* (FP8_DELAYED_OPS, slots) delayed: this step's amax of each X, then dY, record */
    int history_steps;   /* delayed: applied FP8 steps the histories hold (host; the ring's count) */
    int stats_due;       /* this step's casts gather Fp8Counts */
    char* slot_on;       /* (slots) host: the slot's linear runs FP8 now (the model's modes set it) */
} Fp8State;

/* Sets up the state of `slots` slots (allocates only the host array; the buffers come from fp8_state_table). */
static inline void fp8_state_init(Fp8State* f, const Fp8Settings* set, int on, size_t slots) {
    memset(f, 0, sizeof(*f));
    f->set = *set;
    f->on = on;
    f->slots = slots;
    f->slot_on = (char*)callocCheck(slots + 1, 1);
}

static inline void fp8_state_free(Fp8State* f) {
    free(f->slot_on);
    f->slot_on = NULL;
}

static inline int fp8_is_delayed(const Fp8State* f) { return f->on && f->set.recipe == FP8_RECIPE_DELAYED; }

/* Do the X and dY casts take the history's scales now? A delayed run's first step has no history yet
   and is current-scaled: it equals the current recipe's first step (TE starts from scale 1 instead). */
static inline int fp8_scales_from_history(const Fp8State* f) { return fp8_is_delayed(f) && f->history_steps > 0; }

/* The device buffers, as entries of the model's small table. */
#define FP8_STATE_BUFFERS 4
static inline int fp8_state_table(Fp8State* f, BufferSpec* s) {
    size_t records = f->on ? f->slots * FP8_OPS : 0, delayed = fp8_is_delayed(f) ? f->slots * FP8_DELAYED_OPS : 0;
    s[0] = (BufferSpec){"fp8_scales", (void**)&f->scales, records, sizeof(Fp8Scale), "other"};
    s[1] = (BufferSpec){"fp8_counts", (void**)&f->counts, records, sizeof(Fp8Counts), "other"};
    s[2] = (BufferSpec){"fp8_history", (void**)&f->history, delayed * (size_t)f->set.amax_history, sizeof(float), "other"};
    s[3] = (BufferSpec){"fp8_step_amax", (void**)&f->step_amax, delayed, sizeof(float), "other"};
    return FP8_STATE_BUFFERS;
}

static inline Fp8Scale* fp8_record(Fp8State* f, size_t slot, int op) { return &f->scales[(size_t)op * f->slots + slot]; }

/*
 * How operand op (FP8_OP_X or FP8_OP_DY) of `slot` is cast now: current scaling computes its amax first
 * unless the producer fused it or `repeat` (a replay under -r 2, or wgrad's recast of X: the forward's
 * amax and scale, no statistics, nothing recorded); the delayed recipe casts with the history's scale and
 * records the amax into the step's entry.
 */
static inline Fp8Quant fp8_quant(Fp8State* f, size_t slot, int op, int amax_fused, int repeat) {
    Fp8Quant q;
    q.s = fp8_record(f, slot, op);
    q.counts = f->stats_due && !repeat ? &f->counts[(size_t)op * f->slots + slot] : NULL;
    q.record = fp8_is_delayed(f) && !repeat ? &f->step_amax[(size_t)(op - FP8_OP_X) * f->slots + slot] : NULL;
    q.history = fp8_scales_from_history(f);
    q.amax = !q.history && !amax_fused && !repeat;
    q.pow2 = f->set.pow2_scales;
    return q;
}

/* Zeroes the amax of every record of `ops` operands from op on (operand-major: one strided memset; each
   amax op then skips its own, fp8/cast_cuda.cuh). Asynchronous. */
static inline void fp8_reset_amaxes(Fp8State* f, int op, int ops) {
    if (f->on) op_fp8_reset_amax(fp8_record(f, 0, op), (size_t)ops * f->slots);
}

/* Starts a step: clears the X and dY non-finite flags (the W flags describe the weights in use) and, when
   delayed, the step amaxes. Asynchronous. */
static inline void fp8_begin_step(Fp8State* f) {
    if (!f->on) return;
    op_fp8_clear_nonfinite(fp8_record(f, 0, FP8_OP_X), FP8_DELAYED_OPS * f->slots); /* X rows, then dY rows */
    if (fp8_is_delayed(f)) dev_zero(f->step_amax, FP8_DELAYED_OPS * f->slots * sizeof(float));
}

/* A host copy of the step amaxes (the caller frees it), or NULL unless delayed. */
static inline float* fp8_step_amaxes_host(Fp8State* f) {
    if (!fp8_is_delayed(f)) return NULL;
    size_t bytes = FP8_DELAYED_OPS * f->slots * sizeof(float);
    float* host = (float*)mallocCheck(bytes);
    dev_download(host, f->step_amax, bytes);
    return host;
}

/*
 * After an applied FP8 step of a delayed run: every X and dY record's history gets the step's amax (its
 * max over the micro-batches, then over the ranks: one entry per step, so the history is the same on any
 * rank count, where TE records one per forward) and its scale for the next step (fp8.h
 * fp8_delayed_update). Asynchronous.
 */
static inline void fp8_delayed_push(Fp8State* f) {
    if (!fp8_is_delayed(f)) return;
    int H = f->set.amax_history, pos = f->history_steps % H;
    int len = f->history_steps + 1 < H ? f->history_steps + 1 : H;
    const Fp8Settings* s = &f->set;
    op_fp8_delayed_update(fp8_record(f, 0, FP8_OP_X), f->history, f->step_amax, f->slots, H, pos, len, s->amax_algo, FP8_E4M3,
                          s->margin, s->pow2_scales);
    op_fp8_delayed_update(fp8_record(f, 0, FP8_OP_DY), f->history + f->slots * (size_t)H, f->step_amax + f->slots, f->slots, H,
                          pos, len, s->amax_algo, FP8_E5M2, s->margin, s->pow2_scales);
    f->history_steps++;
}

/* Bytes of the delayed recipe's training state: the X and dY records, then the histories; 0 unless delayed. */
static inline size_t fp8_state_bytes(const Fp8State* f) {
    return fp8_is_delayed(f) ? fp8_delayed_state_bytes(FP8_DELAYED_OPS * f->slots, f->set.amax_history) : 0;
}

/* host (fp8_state_bytes) = the X and dY records and the histories. */
static inline void fp8_state_download(Fp8State* f, void* host) {
    size_t records = FP8_DELAYED_OPS * f->slots;
    dev_download(host, fp8_record(f, 0, FP8_OP_X), records * sizeof(Fp8Scale));
    dev_download((char*)host + records * sizeof(Fp8Scale), f->history, records * (size_t)f->set.amax_history * sizeof(float));
}

/* The inverse of fp8_state_download, with the histories' count; the non-finite flags are cleared. */
static inline void fp8_state_upload(Fp8State* f, const void* host, int history_steps) {
    size_t records = FP8_DELAYED_OPS * f->slots;
    dev_upload(fp8_record(f, 0, FP8_OP_X), host, records * sizeof(Fp8Scale));
    dev_upload(f->history, (const char*)host + records * sizeof(Fp8Scale), records * (size_t)f->set.amax_history * sizeof(float));
    op_fp8_clear_nonfinite(fp8_record(f, 0, FP8_OP_X), records);
    f->history_steps = history_steps;
}

/* "w13[layer 2] dY" */
static inline void fp8_operand_name(size_t slot, int op, char* out, size_t len) {
    snprintf(out, len, "%s[layer %zu] %s", LINEAR_NAMES[slot % LIN_PER_LAYER], slot / LIN_PER_LAYER, FP8_OPERAND_NAMES[op]);
}

/*
 * Returns 1 and names the first operand (slot order, then W, X, dY) of a slot running FP8 whose flag is
 * set, or 0 when none is: a cast of X or dY since fp8_begin_step, or the cast of the weights in use. The
 * delayed casts flag nothing themselves: their step amaxes tell. One download: call it once per step.
 */
static inline int fp8_nonfinite(Fp8State* f, char* out, size_t len) {
    if (!f->on) return 0;
    Fp8Scale* s = (Fp8Scale*)mallocCheck(f->slots * FP8_OPS * sizeof(Fp8Scale));
    dev_download(s, f->scales, f->slots * FP8_OPS * sizeof(Fp8Scale));
    float* step_amax = fp8_step_amaxes_host(f);
    int found = 0;
    for (size_t slot = 0; slot < f->slots && !found; slot++) {
        if (!f->slot_on[slot]) continue;
        for (int op = 0; op < FP8_OPS && !found; op++) {
            int bad = s[(size_t)op * f->slots + slot].nonfinite != 0.0f;
            if (step_amax && op >= FP8_OP_X) bad |= !fp8_amax_is_finite(step_amax[(size_t)(op - FP8_OP_X) * f->slots + slot]);
            if (bad) fp8_operand_name(slot, op, out, len);
            found = bad;
        }
    }
    free(s);
    free(step_amax);
    return found;
}

/* ---------------------------------------------------------------- weights */

/* A linear running FP8 keeps no BF16 working copy: its E4M3 W and W^T are cast from the BF16 rounding of
   the master weights once per optimizer step, in pieces when sharded (docs/model.md "FP8 weights"). */

/* The W records of every slot, contiguous: what the sharded amax all-reduce reduces. */
static inline Fp8Scale* fp8_weight_records(Fp8State* f) { return fp8_record(f, 0, FP8_OP_W); }

/* The W counts of every slot, contiguous: per rank those of its pieces, which a sharded driver sums over the ranks. */
static inline Fp8Counts* fp8_weight_counts(Fp8State* f) { return f->counts + (size_t)FP8_OP_W * f->slots; }

/* New weights: their casts alone decide the W flags. */
static inline void fp8_clear_weight_flags(Fp8State* f) {
    if (f->on) op_fp8_clear_nonfinite(fp8_weight_records(f), f->slots);
}

/* W record of `slot`: amax of the BF16 roundings of master (n) FP32, this rank's piece of the weight. */
static inline void fp8_weight_amax(Fp8State* f, size_t slot, const float* master, size_t n) {
    op_amax_master(fp8_record(f, slot, FP8_OP_W), master, n);
}

/* The codes of master (rows, cols) FP32 with the W record's amax into w and/or wt (either may be NULL);
   `count`: add the cast to the W statistics (a recount of the weights in use, writing nothing). */
static inline void fp8_cast_weight(Fp8State* f, size_t slot, uint8_t* w, uint8_t* wt, const float* master, size_t rows, size_t cols,
                                   int count) {
    Fp8Counts* counts = count ? &fp8_weight_counts(f)[slot] : NULL;
    op_cast_transpose_master(w, wt, master, rows, cols, FP8_E4M3, fp8_record(f, slot, FP8_OP_W), f->set.pow2_scales, counts);
}

/* ---------------------------------------------------------------- statistics (--fp8-stats) */

/* Starts a step whose casts gather statistics (the caller then recounts the weights in use). */
static inline void fp8_stats_begin(Fp8State* f) {
    if (!f->on) return;
    dev_zero(f->counts, f->slots * FP8_OPS * sizeof(Fp8Counts));
    f->stats_due = 1;
}

/* The statistics of one FP8 operand over a statistics step (fp8_stats_end). */
typedef struct {
    int layer;
    LinearId lin;
    int op;                /* FP8_OP_W, FP8_OP_X or FP8_OP_DY */
    const char* gemm;      /* LINEAR_NAMES[lin] */
    const char* operand;   /* FP8_OPERAND_NAMES[op] */
    const char* format;    /* "E4M3" or "E5M2" */
    float amax, scale;     /* of the operand's last cast in the step; delayed X / dY: amax is the step's
                              history entry (its max over micro-batches and ranks), scale the one it used */
    double saturated_frac; /* codes at +-max */
    double underflow_frac; /* non-zero inputs cast to 0 */
} Fp8OperandStats;

typedef void (*Fp8StatsEmit)(void* ctx, const Fp8OperandStats* stats);

/* Ends a statistics step: `emit` for every operand of the slots running FP8 now. Call it before the
   update, which casts the next step's weights. */
static inline void fp8_stats_end(Fp8State* f, Fp8StatsEmit emit, void* ctx) {
    if (!f->on || !f->stats_due) return;
    f->stats_due = 0;
    size_t n = f->slots * FP8_OPS;
    Fp8Scale* s = (Fp8Scale*)mallocCheck(n * sizeof(Fp8Scale));
    Fp8Counts* k = (Fp8Counts*)mallocCheck(n * sizeof(Fp8Counts));
    dev_download(s, f->scales, n * sizeof(Fp8Scale));
    dev_download(k, f->counts, n * sizeof(Fp8Counts));
    float* step_amax = fp8_step_amaxes_host(f);
    for (size_t slot = 0; slot < f->slots; slot++) {
        if (!f->slot_on[slot]) continue;
        for (int op = 0; op < FP8_OPS; op++) {
            size_t i = (size_t)op * f->slots + slot;
            Fp8OperandStats o;
            o.layer = (int)(slot / LIN_PER_LAYER);
            o.lin = (LinearId)(slot % LIN_PER_LAYER);
            o.op = op;
            o.gemm = LINEAR_NAMES[o.lin];
            o.operand = FP8_OPERAND_NAMES[op];
            o.format = op == FP8_OP_DY ? "E5M2" : "E4M3";
            o.amax = step_amax && op >= FP8_OP_X ? step_amax[(size_t)(op - FP8_OP_X) * f->slots + slot] : s[i].amax;
            o.scale = s[i].scale;
            o.saturated_frac = k[i].count ? (double)k[i].saturated / (double)k[i].count : 0.0;
            o.underflow_frac = k[i].nonzero ? (double)k[i].underflow / (double)k[i].nonzero : 0.0;
            emit(ctx, &o);
        }
    }
    free(s);
    free(k);
    free(step_amax);
}
