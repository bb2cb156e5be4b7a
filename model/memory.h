/*
 * The model's memory, as both builds hold it (compiled after a backend, as model.h): the Llama struct,
 * the buffer tables (one allocation each for the weights, gradients and optimizer state, the activations
 * and the small buffers, printed in MiB), the parameter segments in comm/zero.h's layouts with the
 * bucket they belong to, where each segment's weights, master weights and gradients live in every
 * format (--optim-state, --grad-buffer, --master-weights), and the FP8 weight copies cast from the
 * master weights. model.h runs the passes over it.
 */
#pragma once

#include <math.h>

#include "../llama/backend.h"
#include "../llama/config.h"
#include "../llama/optim.h"
#include "../llama/params.h"
#include "../core/buffers.h"
#include "../comm/zero.h"
#include "../fp8/fp8.h"
#include "../fp8/gemm.h"

/*
 * The linear layers: four per block (wqkv, wo, w13, w2: the FP8 GEMMs of -p fp8, slot = layer *
 * LIN_PER_LAYER + which) and the output layer, which stays in the activation type (DESIGN.md section 3).
 */
typedef enum { LIN_QKV, LIN_WO, LIN_W13, LIN_W2, LIN_OUTPUT } LinearId;
#define LIN_PER_LAYER 4
static const char* const LINEAR_NAMES[] = {"wqkv", "wo", "w13", "w2", "output"};
/* The `layer` argument of the output layer, which belongs to no block. */
#define NO_LAYER (-1)
/* The three FP8 operands of a linear layer: weight (E4M3), input X (E4M3), output gradient dY (E5M2). */
enum { FP8_OP_W, FP8_OP_X, FP8_OP_DY, FP8_OPS };
static const char* const FP8_OPERAND_NAMES[FP8_OPS] = {"W", "X", "dY"};

/* FP8 buffers of one linear layer (device pointers), for Y (N, OC) = X (N, C) W^T with W (OC, C). */
typedef struct {
    uint8_t* w;   /* (OC, C) E4M3 copy of W, cast from the master weights once per optimizer step: fprop's A operand */
    uint8_t* wt;  /* (C, OC) E4M3 copy of W^T with the same codes: dgrad's A operand */
    uint8_t* xt;  /* (C, N) E4M3 copy of X^T saved by fprop for wgrad, or NULL when backward recasts X (see Recompute) */
} Fp8Linear;

/*
 * Recompute (-r): what backward reads from memory and what it rebuilds, from the cheapest to the leanest.
 *   0  everything backward reads is kept: per layer the residuals, the norms' rstd, q/k/v, the attention
 *      output and statistics, the w1/w3 outputs and the inputs of the linear layers, in BF16 (bf16, fp32)
 *      or, in fp8, as the E4M3 X^T copies wgrad reads (wo's X^T is recast from the kept attention output).
 *   1  the norm and SwiGLU outputs are not kept: backward rebuilds them with the forward's ops, and in fp8
 *      recasts their X^T.
 *   2  whole blocks: only each block's input (resid) is kept; backward replays the block's forward from it
 *      into one layer's buffers (a "replay") before running its backward.
 * Every FP8 cast that backward repeats uses the forward's amax and scale (no other cast writes a layer's X
 * scale between its forward and its backward) and gathers no statistics, and the ops are deterministic,
 * so the BF16 values, the E4M3 bytes and therefore the gradients are bit-identical at every level
 * (torchtitan#1056 and TransformerEngine#1190 are what a replay with fresh scales does instead). The
 * levels are config.h's RECOMPUTE_*.
 */

typedef struct {
    act_t* resid;      /* (L+1, N, C) residual stream: resid[l] enters layer l, resid[L] enters the final norm */
    act_t* resid_mid;  /* (L, N, C) residual after the attention half of each layer; one layer's under -r 2 */
    float* rstd_attn;  /* (L, N) 1 / rms of resid[l]; one layer's under -r 2, as all "block" buffers below */
    float* rstd_ffn;   /* (L, N) 1 / rms of resid_mid[l]; block */
    float* rstd_final; /* (N) */
    act_t* ln_attn;    /* (L, N, C) when backward reads it (bf16/fp32, -r 0), else one (N, C) slice that
                          backward rebuilds where it needs it (-r 1, a BF16 linear of an fp8 run) */
    act_t* qkv;        /* (L, N, QKV) q, k after RoPE, v; block */
    act_t* att;        /* (L, N, C) attention output, before wo; block */
    float* att_stats;  /* (L, att_stats_size(B, NH, T)) what attention backward needs, backend-specific; block */
    act_t* ln_ffn;     /* (L, N, C) or (N, C), as ln_attn */
    act_t* fc;         /* (L, N, 2F) [w1 x, w3 x]; block */
    act_t* swiglu;     /* (L, N, F) or (N, F), as ln_attn */
    act_t* branch;     /* (N, C) scratch: output of wo or w2 before the residual add */
    act_t* ln_final;   /* (N, C) */
    act_t* logits;     /* (N, V), replaced by d(loss)/d(logits) when targets are given; in fp8 also the FP8
                          operand scratch of the blocks (llama_fp8_operand_bytes), at least that large */
    float* losses;     /* (N) per-token cross-entropy */
    act_t* d_resid;    /* (N, C) gradient of the residual stream */
    act_t* d_ln;       /* (N, C) gradient of a norm's output */
    act_t* d_att;      /* (N, C) */
    act_t* d_qkv;      /* (N, QKV) */
    act_t* d_fc;       /* (N, 2F) */
    act_t* d_swiglu;   /* (N, F) */
    uint8_t* xt8;      /* (L, N (2 C + F)) E4M3 X^T of wqkv, w13 and w2 saved by fprop for wgrad (fp8, -r 0) */
} Acts;

/* The moments' scale granule must be the shard pieces' (optim.h ADAMW_CHUNK, comm/zero.h ZERO_CHUNK): a
   compile-time check (an array of size -1 does not compile). */
typedef char adamw_chunk_is_zero_chunk[ADAMW_CHUNK == ZERO_CHUNK ? 1 : -1];

/* How the parameters are spread over the data-parallel ranks (-z, DESIGN.md section 6). */
typedef struct {
    int world;      /* data-parallel ranks */
    int rank;       /* this one */
    int zero_stage; /* 0: everything everywhere; 1: optimizer state sharded; 2: gradients sharded too */
} Sharding;

/* Buckets: the embedding (0), each layer (1 + layer), the final norm with the output layer (L + 1). */
#define BUCKET_EMBEDDING 0
static inline int bucket_of_layer(int layer) { return 1 + layer; }

/* The three FP32 bucket buffers (llama_grads_bucketed): two for alternating layers, one for the embedding and the head. */
enum { GRAD_BUFFER_EVEN, GRAD_BUFFER_ODD, GRAD_BUFFER_OTHER, GRAD_BUFFERS };

/*
 * A parameter segment with its place in the layouts of this run. The weights of the FP8 linear layers
 * (llama_linear_is_fp8) have no BF16 working copy: their E4M3 W and W^T are cast straight from the master
 * weights (see "FP8 weights"); every other segment has a working copy.
 */
typedef struct {
    ParamSegment param;   /* tensor, layer, checkpoint offset, count */
    ShardSegment shard;   /* full / shard / chunk layouts (comm/zero.h) */
    int bucket;           /* the bucket it belongs to */
    int grad_buffer;      /* bucketed gradients: the bucket buffer of its bucket */
    size_t buffer_offset; /* bucketed gradients: its offset there */
    int fp8;              /* the weight of an FP8 linear layer */
    size_t weight_offset; /* not fp8: its working copy in `weights`, padded as the full layout (elements) */
    size_t fp8_offset;    /* fp8: its E4M3 W in `fp8_weights`, padded as the full layout, then W^T (bytes) */
} ModelSegment;

/* Called by the model around each bucket (see the banner); any may be NULL but all_gather, which a
   sharded model (ZeRO-1/2 over several ranks) needs. */
typedef struct {
    void* ctx;
    void (*weights_needed)(void* ctx, int bucket); /* before the forward first reads the bucket's weights */
    void (*grads_needed)(void* ctx, int bucket);   /* before the backward first writes its gradients */
    void (*grads_ready)(void* ctx, int bucket);    /* after the backward last writes them */
    /* in place: buf holds one piece of `bytes` per rank, this rank's at rank * bytes; returns when every
       rank's piece is there (comm/comm.h comm_all_gather, waited for) */
    void (*all_gather)(void* ctx, void* buf, size_t bytes);
} ModelHooks;

typedef struct {
    LlamaConfig cfg;
    Precision precision;
    int pow2_scales;           /* round FP8 scales down to powers of two */
    int fp8_recipe;            /* --fp8-recipe: Fp8Recipe (fp8/fp8.h; see "Delayed scaling") */
    int amax_history;          /* --amax-history: H, history entries per X / dY record (delayed) */
    int amax_algo;             /* --amax-algo: Fp8AmaxAlgo (delayed) */
    int fp8_margin;            /* --fp8-margin (delayed) */
    int fp8_history_steps;     /* delayed: applied FP8 steps the history holds so far (host; the ring's count) */
    int fp8_fprop_fast_accum;  /* --fp8-fast-accum: fprop's FP8 GEMMs use fast accumulation (default 1) */
    int fp8_accum;             /* --fp8-accum: Fp8Accum of the FP8 GEMMs (fp8/gemm.h; hopper: CPU build only) */
    int recompute;             /* -r: RECOMPUTE_* (see Recompute) */
    int replaying;             /* backward is replaying a block's forward (-r 2) */
    int unfused_amax;          /* tests: every FP8 X amax by a separate op_amax read (see llama_fused_x_amax) */
    int B, T;                  /* the largest micro-batch the buffers hold */
    Sharding sharding;
    OptimState optim_state;    /* --optim-state: how adam_m and adam_v are stored (optim.h) */
    GradFormat grad_format;    /* --grad-buffer: how `grads` is stored (optim.h; bf16 and fp8 under ZeRO-0/1 only) */
    MasterFormat master_format; /* --master-weights: how `master` is stored (optim.h) */
    int shard_index;           /* the shard this rank holds: its rank, or 0 under ZeRO-0 */
    size_t num_params;         /* P, in checkpoint order */
    ModelSegment* segs;        /* (num_segs) in checkpoint order */
    int num_segs;
    int seg_base[NUM_PARAM_TENSORS]; /* index of each tensor's first segment */
    ShardLayout layout;
    size_t grad_buffer_elems[GRAD_BUFFERS]; /* bucketed gradients (llama_grads_bucketed) */
    size_t working_elems;      /* elements of the working weights */
    size_t fp8_weight_bytes;   /* bytes of the FP8 weight copies */
    size_t bf16_scratch_elems; /* llama_bf16_weight's scratch: the largest FP8 weight, padded */
    void* state_memory;        /* one allocation: the buffers below */
    act_t* weights;            /* (working_elems) working weights (BF16 on the GPU) of the segments that have them */
    uint8_t* fp8_weights;      /* (fp8_weight_bytes) E4M3 W and W^T of every FP8 linear layer */
    void* master;              /* (layout.shard) master weights of this rank's shard, in master_format (llama_master_piece) */
    float* master_scale_inv;   /* (store_scale_count(master_codec(master_format), layout.shard)) their scale_inv (fp16) */
    float* master_scratch;     /* (largest piece) FP32: an fp16 master's segment decoded (llama_master_piece) */
    void* adam_m;              /* (layout.shard) AdamW first moment, in optim_state's format (optim.h) */
    void* adam_v;              /* (layout.shard) AdamW second moment, likewise */
    float* adam_scale_inv;     /* (adamw_scale_count(optim_state, layout.shard)) the moments' scale_inv (fp8) */
    void* grads;               /* (layout.full) gradients accumulated over micro-steps, in grad_format (ZeRO-0/1) */
    float* grad_scale_inv;     /* (store_scale_count(grad_codec(grad_format), layout.full)) their scale_inv (fp8) */
    float* grad_buffer[GRAD_BUFFERS]; /* FP32 bucket buffers the backward writes (ZeRO-2, or a bf16/fp8 `grads`) */
    float* grad_shard;         /* (layout.shard) reduced gradients of this rank's shard (ZeRO-1/2) */
    double* norm_partials;     /* (layout.chunks) sums of squares of the reduced gradient per chunk */
    ModelHooks hooks;
    void* acts_memory;
    Acts acts;
    size_t acts_bytes;
    uint8_t* fp8_operand;      /* (N, Dmax) the E4M3 X of the running fprop; in backward E5M2 dY, then the
                                  recast X^T (fp8; in the logits buffer, see llama_fp8_operand_bytes) */
    uint8_t* fp8_operand_t;    /* (Dmax, N) E5M2 dY^T (fp8; after fp8_operand) */
    Fp8Linear* fp8_linear;     /* (L * LIN_PER_LAYER) host array of device pointers */
    char* fp8_wt_pending;      /* (L) host: the layer's W^T copies are still to be made from its gathered W */
    char* bf16_block;          /* (L) host: the block runs its linears in BF16 in -p fp8 (--bf16-layers) */
    int linears_bf16;          /* every block linear runs BF16 for now (the shadow check, the fallback policy) */
    int fp8_stats_due;         /* this step's casts gather Fp8Counts */
    void* small_memory;        /* one allocation: the buffers below */
    Fp8Scale* fp8_scales;      /* (FP8_OPS, L * LIN_PER_LAYER) operand-major (fp8) */
    Fp8Counts* fp8_counts;     /* (FP8_OPS, L * LIN_PER_LAYER) as fp8_scales */
    float* fp8_history;        /* (2, L * LIN_PER_LAYER, H) delayed: the amax history of each X, then dY, record */
    float* fp8_step_amax;      /* (2, L * LIN_PER_LAYER) delayed: this step's amax of each X, then dY, record */
    float* rope_cos;           /* (T, HS/2) */
    float* rope_sin;           /* (T, HS/2) */
    int* inputs;               /* (B, T) device copy of the micro-batch's tokens */
    int* targets;              /* (B, T) */
    act_t* bf16_scratch;       /* (bf16_scratch_elems) llama_bf16_weight's (fp8: a block linear running BF16), at
                                  start-up when the flags allow one (the memory plan counts it), else on first use */
    const int* inputs_host;    /* the host tokens of the last forward */
    float* losses_host;        /* (B*T) */
    int last_B, last_T;        /* shape of the last forward */
} Llama;

/* The FP8 recipe of an fp8 run: --pow2-scales, --fp8-recipe (Fp8Recipe) and the delayed recipe's
   --amax-history, --amax-algo (Fp8AmaxAlgo) and --fp8-margin. */
typedef struct {
    int pow2_scales, recipe, amax_history, amax_algo, margin;
} Fp8Settings;
/* The defaults: current scaling; for the delayed recipe TE DelayedScaling's (history 1024, max, margin 0). */
static const Fp8Settings FP8_DEFAULTS = {0, FP8_RECIPE_CURRENT, AMAX_HISTORY_DEFAULT, FP8_AMAX_MAX, 0};

/* One process, everything on it: the sharding of tests and single-rank runs. */
static const Sharding SINGLE_PROCESS = {1, 0, 0};

/* Activation buffers (the fields of Acts): the size of the table llama_acts_table fills. */
#define NUM_ACT_BUFFERS (sizeof(Acts) / sizeof(void*))

static inline size_t llama_slot(int layer, int lin) { return (size_t)layer * LIN_PER_LAYER + lin; }
/* FP8 slots: one per linear layer of the blocks. */
static inline size_t llama_fp8_slots(const Llama* m) { return (size_t)m->cfg.n_layers * LIN_PER_LAYER; }
static inline Fp8Scale* fp8_scale(Llama* m, size_t slot, int op) { return &m->fp8_scales[(size_t)op * llama_fp8_slots(m) + slot]; }
/* The records of the delayed recipe (X, then dY): FP8_DELAYED_OPS per slot. */
#define FP8_DELAYED_OPS (FP8_OPS - FP8_OP_X)
/* Is this an fp8 run with the delayed recipe (Fp8Recipe)? */
static inline int llama_fp8_is_delayed(const Llama* m) { return m->precision == PRECISION_FP8 && m->fp8_recipe == FP8_RECIPE_DELAYED; }
/* Do the X and dY casts take the history's scales now (delayed, with at least one entry)? Before the
   first entry they are current-scaled (see "Delayed scaling"). */
static inline int llama_fp8_scales_delayed(const Llama* m) { return llama_fp8_is_delayed(m) && m->fp8_history_steps > 0; }
/* Where a cast of operand op (FP8_OP_X or FP8_OP_DY) of `slot` records its amax for the step: NULL
   unless delayed, and for a replayed cast. */
static inline float* fp8_step_amax(Llama* m, size_t slot, int op) {
    if (!llama_fp8_is_delayed(m) || m->replaying) return NULL;
    return &m->fp8_step_amax[(size_t)(op - FP8_OP_X) * llama_fp8_slots(m) + slot];
}
/* The counts a cast adds to: NULL unless statistics are due, and never for a replayed cast. */
static inline Fp8Counts* fp8_counts(Llama* m, size_t slot, int op) {
    return m->fp8_stats_due && !m->replaying ? &m->fp8_counts[(size_t)op * llama_fp8_slots(m) + slot] : NULL;
}

/* Does backward read the BF16 inputs of the linear layers (ln_attn, ln_ffn, swiglu) from memory? */
static inline int llama_keeps_linear_inputs(const Llama* m) {
    return m->precision != PRECISION_FP8 && m->recompute == RECOMPUTE_NONE;
}
/* Does fprop keep the E4M3 X^T of wqkv, w13 and w2 for wgrad (else backward recasts their rebuilt inputs)? */
static inline int llama_keeps_xt(const Llama* m) { return m->precision == PRECISION_FP8 && m->recompute == RECOMPUTE_NONE; }
/* Are the block buffers kept per layer (else backward replays each block's forward, -r 2)? */
static inline int llama_keeps_blocks(const Llama* m) { return m->recompute != RECOMPUTE_BLOCKS; }

/* Dmax: the widest row of an FP8 GEMM operand, the largest OC (dY) or C (X) of the blocks' linear layers. */
static inline size_t llama_fp8_operand_dim(const LlamaConfig* c) {
    size_t C = (size_t)c->dim, F = (size_t)c->ffn_dim, QKV = (size_t)llama_qkv_dim(c);
    size_t d = QKV > 2 * F ? QKV : 2 * F;
    return d > C ? d : C; /* 2F >= F */
}

/*
 * Bytes of the FP8 operand scratch, fp8_operand and fp8_operand_t of N Dmax bytes each (0 outside fp8).
 * It lives in the logits buffer, which is dead whenever a block runs: the forward's blocks run before the
 * output layer writes the logits, the backward's after the output layer's backward has read them, and the
 * FP8 casts and GEMMs are all the blocks'. The logits buffer grows when the scratch is larger
 * (max(QKV, 2F) > V, as in Llama-2 70B).
 */
static inline size_t llama_fp8_operand_bytes(const Llama* m) {
    if (m->precision != PRECISION_FP8) return 0;
    return 2 * (size_t)m->B * m->T * llama_fp8_operand_dim(&m->cfg);
}

/* Activation buffers for micro-batch (B, T) at the run's recompute level. */
static inline int llama_acts_table(Llama* m, BufferSpec* s) {
    const LlamaConfig* c = &m->cfg;
    size_t N = (size_t)m->B * m->T, C = (size_t)c->dim, L = (size_t)c->n_layers, F = (size_t)c->ffn_dim;
    size_t QKV = (size_t)llama_qkv_dim(c), V = (size_t)c->vocab_size;
    size_t keep = llama_keeps_linear_inputs(m) ? L : 1, blocks = llama_keeps_blocks(m) ? L : 1;
    size_t a = sizeof(act_t), f = sizeof(float);
    size_t logits = N * V, operand = ceil_div(llama_fp8_operand_bytes(m), a);
    Acts* x = &m->acts;
    int n = 0;
#define SPEC(field, count, elem) s[n++] = (BufferSpec){#field, (void**)&x->field, (count), (elem), "activations"}
    SPEC(resid, (L + 1) * N * C, a);
    SPEC(resid_mid, blocks * N * C, a);
    SPEC(rstd_attn, blocks * N, f);
    SPEC(rstd_ffn, blocks * N, f);
    SPEC(rstd_final, N, f);
    SPEC(ln_attn, keep * N * C, a);
    SPEC(qkv, blocks * N * QKV, a);
    SPEC(att, blocks * N * C, a);
    SPEC(att_stats, blocks * att_stats_size((size_t)m->B, c->n_heads, m->T), f);
    SPEC(ln_ffn, keep * N * C, a);
    SPEC(fc, blocks * N * 2 * F, a);
    SPEC(swiglu, keep * N * F, a);
    SPEC(branch, N * C, a);
    SPEC(ln_final, N * C, a);
    SPEC(logits, logits > operand ? logits : operand, a);
    SPEC(losses, N, f);
    SPEC(d_resid, N * C, a);
    SPEC(d_ln, N * C, a);
    SPEC(d_att, N * C, a);
    SPEC(d_qkv, N * QKV, a);
    SPEC(d_fc, N * 2 * F, a);
    SPEC(d_swiglu, N * F, a);
    SPEC(xt8, llama_keeps_xt(m) ? L * N * (2 * C + F) : 0, 1);
#undef SPEC
    if ((size_t)n != NUM_ACT_BUFFERS) die("activation table has %d buffers, Acts has %zu fields", n, NUM_ACT_BUFFERS);
    return n;
}

/* Elements of the largest shard piece of any segment. */
static inline size_t llama_largest_piece(const Llama* m) {
    size_t largest = 0;
    for (int i = 0; i < m->num_segs; i++) largest = m->segs[i].shard.piece > largest ? m->segs[i].shard.piece : largest;
    return largest;
}

/* Does the backward write FP32 bucket buffers (ZeRO-2's, also a bf16/fp8 --grad-buffer's) rather than `grads`? */
static inline int llama_grads_bucketed(const Llama* m) {
    return m->sharding.zero_stage == 2 || m->grad_format != GRAD_FORMAT_FP32;
}

/* Weights, gradients and optimizer state (this rank's, as sharding lays them out): at most NUM_STATE_BUFFERS. */
#define NUM_STATE_BUFFERS 15
static inline int llama_state_table(Llama* m, BufferSpec* s) {
    size_t full = m->layout.full, shard = m->layout.shard;
    int z = m->sharding.zero_stage, n = 0;
    const size_t* gb = m->grad_buffer_elems;
    s[n++] = (BufferSpec){"weights", (void**)&m->weights, m->working_elems, sizeof(act_t), "working weights"};
    s[n++] = (BufferSpec){"fp8_weights", (void**)&m->fp8_weights, m->fp8_weight_bytes, 1, "FP8 weight copies"};
    StoreCodec mc = master_codec(m->master_format);
    s[n++] = (BufferSpec){"master", (void**)&m->master, shard, store_bytes(mc), "master weights"};
    s[n++] = (BufferSpec){"master_scale_inv", (void**)&m->master_scale_inv, store_scale_count(mc, shard), sizeof(float), "master weights"};
    s[n++] = (BufferSpec){"master_scratch", (void**)&m->master_scratch, mc == STORE_FP32 ? 0 : llama_largest_piece(m), sizeof(float),
                          "master weights"};
    s[n++] = (BufferSpec){"adam_m", (void**)&m->adam_m, shard, adamw_moment_bytes(m->optim_state, 0), "AdamW moments"};
    s[n++] = (BufferSpec){"adam_v", (void**)&m->adam_v, shard, adamw_moment_bytes(m->optim_state, 1), "AdamW moments"};
    s[n++] = (BufferSpec){"adam_scale_inv", (void**)&m->adam_scale_inv, adamw_scale_count(m->optim_state, shard), sizeof(float),
                          "AdamW moments"};
    int buckets = llama_grads_bucketed(m);
    s[n++] = (BufferSpec){"grads", (void**)&m->grads, z < 2 ? full : 0, store_bytes(grad_codec(m->grad_format)), "gradients"};
    s[n++] = (BufferSpec){"grad_scale_inv", (void**)&m->grad_scale_inv, z < 2 ? store_scale_count(grad_codec(m->grad_format), full) : 0,
                          sizeof(float), "gradients"};
    s[n++] = (BufferSpec){"grad_bucket_0", (void**)&m->grad_buffer[GRAD_BUFFER_EVEN], buckets ? gb[GRAD_BUFFER_EVEN] : 0, sizeof(float), "gradients"};
    s[n++] = (BufferSpec){"grad_bucket_1", (void**)&m->grad_buffer[GRAD_BUFFER_ODD], buckets ? gb[GRAD_BUFFER_ODD] : 0, sizeof(float), "gradients"};
    s[n++] = (BufferSpec){"grad_bucket_2", (void**)&m->grad_buffer[GRAD_BUFFER_OTHER], buckets ? gb[GRAD_BUFFER_OTHER] : 0, sizeof(float), "gradients"};
    s[n++] = (BufferSpec){"grad_shard", (void**)&m->grad_shard, z > 0 ? shard : 0, sizeof(float), "gradients"};
    s[n++] = (BufferSpec){"norm_partials", (void**)&m->norm_partials, m->layout.chunks, sizeof(double), "workspaces"};
    if (n != NUM_STATE_BUFFERS) die("state table has %d buffers, NUM_STATE_BUFFERS is %d", n, NUM_STATE_BUFFERS);
    return n;
}

/* The small buffers: FP8 scales and statistics, RoPE tables, the micro-batch's tokens. */
#define NUM_SMALL_BUFFERS 8
static inline int llama_small_table(Llama* m, BufferSpec* s) {
    size_t slots = m->precision == PRECISION_FP8 ? llama_fp8_slots(m) * FP8_OPS : 0;
    size_t delayed = llama_fp8_is_delayed(m) ? llama_fp8_slots(m) * FP8_DELAYED_OPS : 0;
    size_t rope = (size_t)m->T * (size_t)(llama_head_dim(&m->cfg) / 2), N = (size_t)m->B * m->T;
    int n = 0;
    s[n++] = (BufferSpec){"fp8_scales", (void**)&m->fp8_scales, slots, sizeof(Fp8Scale), "other"};
    s[n++] = (BufferSpec){"fp8_counts", (void**)&m->fp8_counts, slots, sizeof(Fp8Counts), "other"};
    s[n++] = (BufferSpec){"fp8_history", (void**)&m->fp8_history, delayed * (size_t)m->amax_history, sizeof(float), "other"};
    s[n++] = (BufferSpec){"fp8_step_amax", (void**)&m->fp8_step_amax, delayed, sizeof(float), "other"};
    s[n++] = (BufferSpec){"rope_cos", (void**)&m->rope_cos, rope, sizeof(float), "other"};
    s[n++] = (BufferSpec){"rope_sin", (void**)&m->rope_sin, rope, sizeof(float), "other"};
    s[n++] = (BufferSpec){"inputs", (void**)&m->inputs, N, sizeof(int), "other"};
    s[n++] = (BufferSpec){"targets", (void**)&m->targets, N, sizeof(int), "other"};
    if (n != NUM_SMALL_BUFFERS) die("small-buffer table has %d buffers, NUM_SMALL_BUFFERS is %d", n, NUM_SMALL_BUFFERS);
    return n;
}

/* The titles of the three tables, as llama_build prints them and the memory plan reprints them. */
#define STATE_TABLE_TITLE "weights, gradients and optimizer state"
#define ACTS_TABLE_TITLE "activations"
#define SMALL_TABLE_TITLE "scales, RoPE tables and tokens"

/* Output width OC and input width C of linear layer `lin`. */
static inline void llama_linear_dims(const LlamaConfig* c, LinearId lin, size_t* out_dim, size_t* in_dim) {
    size_t C = (size_t)c->dim, F = (size_t)c->ffn_dim;
    size_t outs[] = {(size_t)llama_qkv_dim(c), C, 2 * F, C, (size_t)c->vocab_size};
    size_t ins[] = {C, C, C, F, C};
    *out_dim = outs[lin];
    *in_dim = ins[lin];
}

/* ---------------------------------------------------------------- segments and layouts */

static inline int llama_num_buckets(const Llama* m) { return m->cfg.n_layers + 2; }

/* The bucket of a segment: the embedding, its layer, or the head (final norm and output layer). */
static inline int llama_bucket_of(const LlamaConfig* c, const ParamSegment* p) {
    if (p->tensor == P_TOK_EMBEDDINGS) return BUCKET_EMBEDDING;
    return p->layer >= 0 ? bucket_of_layer(p->layer) : c->n_layers + 1;
}

/* ZeRO-2 gradient buffer of a bucket: layers alternate between two, so one can be reduced while the
   next layer's backward writes the other; the embedding and the head share the third. */
static inline int llama_grad_buffer_of(const Llama* m, int bucket) {
    if (bucket == BUCKET_EMBEDDING || bucket == llama_num_buckets(m) - 1) return GRAD_BUFFER_OTHER;
    return (bucket - 1) % 2 == 0 ? GRAD_BUFFER_EVEN : GRAD_BUFFER_ODD;
}

/* The segment of (tensor, layer); layer is ignored for tensors that are not per layer. */
static inline ModelSegment* llama_segment(Llama* m, int tensor, int layer) {
    return &m->segs[m->seg_base[tensor] + (param_is_per_layer(tensor) ? layer : 0)];
}

/* The parameter tensor (P_*) of linear layer `lin`. */
static inline int llama_linear_tensor(LinearId lin) {
    static const int tensors[] = {P_WQKV, P_WO, P_W13, P_W2, P_OUTPUT};
    return tensors[lin];
}

/* Is segment `p` the weight of a linear layer that can run FP8 (a block linear of a -p fp8 run)? Such a
   segment keeps E4M3 copies and no working copy, also for the blocks that run BF16 (llama_linear_is_fp8). */
static inline int llama_segment_is_fp8(const Llama* m, const ParamSegment* p) {
    if (m->precision != PRECISION_FP8) return 0;
    for (int lin = 0; lin < LIN_PER_LAYER; lin++) {
        if (p->tensor == llama_linear_tensor((LinearId)lin)) return 1;
    }
    return 0;
}

/*
 * Cuts the parameters into segments and places them: the full and shard layouts for the sharding, the
 * buckets, under ZeRO-2 the segments' places in their gradient buffers, and the working weights or (FP8
 * linear layers) the E4M3 W and W^T of each segment. Allocates host metadata only.
 */
static inline void llama_layout(Llama* m) {
    const LlamaConfig* c = &m->cfg;
    m->num_segs = param_segment_count(c);
    ParamSegment* params = (ParamSegment*)mallocCheck((size_t)m->num_segs * sizeof(ParamSegment));
    ShardSegment* shards = (ShardSegment*)mallocCheck((size_t)m->num_segs * sizeof(ShardSegment));
    param_segments(c, params);
    for (int i = 0; i < m->num_segs; i++) shards[i].count = params[i].count;
    int sharded = m->sharding.zero_stage > 0;
    m->layout = zero_layout(shards, m->num_segs, sharded ? m->sharding.world : 1);
    m->shard_index = sharded ? m->sharding.rank : 0;
    m->segs = (ModelSegment*)callocCheck((size_t)m->num_segs, sizeof(ModelSegment));
    for (int i = 0; i < m->num_segs; i++) {
        ModelSegment* s = &m->segs[i];
        s->param = params[i];
        s->shard = shards[i];
        s->bucket = llama_bucket_of(c, &params[i]);
        s->grad_buffer = llama_grad_buffer_of(m, s->bucket);
        if (i == 0 || params[i].tensor != params[i - 1].tensor) m->seg_base[params[i].tensor] = i;
    }
    /* bucketed: a bucket's segments back to back in its buffer, each with its padding (the reduce-scatter
       reads shards * piece elements); a buffer is as large as the largest bucket it serves */
    for (int b = 0; b < llama_num_buckets(m); b++) {
        size_t used = 0;
        for (int i = 0; i < m->num_segs; i++) {
            ModelSegment* s = &m->segs[i];
            if (s->bucket != b) continue;
            s->buffer_offset = used;
            used += s->shard.piece * (size_t)m->layout.shards;
        }
        int buf = llama_grad_buffer_of(m, b);
        if (used > m->grad_buffer_elems[buf]) m->grad_buffer_elems[buf] = used;
    }
    /* working copies and E4M3 W padded as the full layout, which their all-gathers fill piece by piece;
       W^T is made from the whole W after the gather (BUFFER_ALIGN keeps every GEMM operand aligned) */
    for (int i = 0; i < m->num_segs; i++) {
        ModelSegment* s = &m->segs[i];
        size_t padded = s->shard.piece * (size_t)m->layout.shards;
        s->fp8 = llama_segment_is_fp8(m, &s->param);
        if (!s->fp8) {
            s->weight_offset = m->working_elems;
            m->working_elems += padded;
            continue;
        }
        s->fp8_offset = m->fp8_weight_bytes;
        m->fp8_weight_bytes += ceil_div(padded, BUFFER_ALIGN) * BUFFER_ALIGN + ceil_div(s->param.count, BUFFER_ALIGN) * BUFFER_ALIGN;
        if (padded > m->bf16_scratch_elems) m->bf16_scratch_elems = padded;
    }
    free(params);
    free(shards);
}

/* The E4M3 W (OC, C) of an FP8 segment, padded to shards * piece bytes, and its W^T (C, OC) after it. */
static inline uint8_t* llama_segment_fp8_w(Llama* m, const ModelSegment* s) { return m->fp8_weights + s->fp8_offset; }
static inline uint8_t* llama_segment_fp8_wt(Llama* m, const ModelSegment* s) {
    return m->fp8_weights + s->fp8_offset + ceil_div(s->shard.piece * (size_t)m->layout.shards, BUFFER_ALIGN) * BUFFER_ALIGN;
}

/* The elements [*begin, *begin + *count) of segment s that this rank holds (segment-local). */
static inline void llama_own_piece(const Llama* m, const ModelSegment* s, size_t* begin, size_t* count) {
    zero_piece(&s->shard, m->shard_index, begin, count);
}

/*
 * Segment s's piece of this rank's master weights as FP32 (s->shard.piece elements, padding zero): the
 * master itself (fp32), or (fp16) the piece decoded into master_scratch when `decode`, to be overwritten
 * otherwise; valid until the next call. After writing it, llama_master_store stores it.
 */
static inline float* llama_master_piece(Llama* m, const ModelSegment* s, int decode) {
    if (m->master_format == MASTER_FP32) return (float*)m->master + s->shard.shard_offset;
    StoreCodec c = master_codec(m->master_format);
    if (decode)
        op_store_load(c, m->master_scratch, (char*)m->master + s->shard.shard_offset * store_bytes(c),
                      m->master_scale_inv + s->shard.shard_offset / ZERO_CHUNK, s->shard.piece, 0);
    return m->master_scratch;
}

/* After the FP32 piece of llama_master_piece was written: an fp16 master stores this rank's part of it
   with its chunks' new scales (fp32: nothing to do). */
static inline void llama_master_store(Llama* m, const ModelSegment* s) {
    if (m->master_format == MASTER_FP32) return;
    StoreCodec c = master_codec(m->master_format);
    size_t b, n;
    llama_own_piece(m, s, &b, &n);
    op_store_add(c, (char*)m->master + s->shard.shard_offset * store_bytes(c), m->master_scale_inv + s->shard.shard_offset / ZERO_CHUNK,
                 m->master_scratch, n, 0);
}

/* The working weights of (tensor, layer); stops for an FP8 linear layer's, which has none (llama_bf16_weight). */
static inline act_t* llama_param(Llama* m, int tensor, int layer) {
    ModelSegment* s = llama_segment(m, tensor, layer);
    if (s->fp8) die("llama_param: %s[layer %d] runs FP8 and has no working copy (use llama_bf16_weight)", PARAM_NAMES[tensor], layer);
    return m->weights + s->weight_offset;
}

/* Segment s's place in its FP32 bucket buffer (llama_grads_bucketed). */
static inline float* llama_bucket_grad(Llama* m, const ModelSegment* s) { return m->grad_buffer[s->grad_buffer] + s->buffer_offset; }

/* Where the backward writes the gradient of (tensor, layer): the FP32 full gradients, or a bucket buffer
   (llama_grads_bucketed). */
static inline float* llama_grad(Llama* m, int tensor, int layer) {
    ModelSegment* s = llama_segment(m, tensor, layer);
    if (llama_grads_bucketed(m)) return llama_bucket_grad(m, s);
    return (float*)m->grads + s->shard.offset;
}

/* Segment s in the full gradients `grads` (format grad_format). */
static inline void* llama_stored_grad(Llama* m, const ModelSegment* s) {
    return (char*)m->grads + s->shard.offset * store_bytes(grad_codec(m->grad_format));
}
/* The scale_inv of segment s's first chunk in `grads` (fp8 buffer), else NULL. */
static inline float* llama_stored_grad_scale_inv(Llama* m, const ModelSegment* s) {
    return m->grad_scale_inv != NULL ? m->grad_scale_inv + s->shard.offset / ZERO_CHUNK : NULL;
}

/*
 * The reduced FP32 gradient of segment s's piece of this rank's shard: in the reduced shard (ZeRO-1/2) or
 * the FP32 full gradients (ZeRO-0); a bf16/fp8 ZeRO-0 buffer (one rank) is first decoded into the
 * segment's place in its bucket buffer, which is free once the backward is done. Asynchronous.
 */
static inline const float* llama_reduced_grad(Llama* m, const ModelSegment* s) {
    if (m->sharding.zero_stage > 0) return m->grad_shard + s->shard.shard_offset;
    if (m->grad_format == GRAD_FORMAT_FP32) return (const float*)m->grads + s->shard.shard_offset;
    float* out = llama_bucket_grad(m, s);
    op_store_load(grad_codec(m->grad_format), out, llama_stored_grad(m, s), llama_stored_grad_scale_inv(m, s), s->param.count, 0);
    return out;
}

/* ---------------------------------------------------------------- buffers */

/*
 * Sets up a model for micro-batches up to (B, T) under `sharding` without allocating any of its buffers:
 * its settings, its layout and the sizes of its tables (llama_state_table, llama_acts_table,
 * llama_small_table), which the memory plan sums. Free with llama_free.
 */
static inline void llama_configure(Llama* m, const LlamaConfig* cfg, Precision precision, int B, int T, const Fp8Settings* fp8,
                                   int recompute, Sharding sharding, StateFormats formats) {
    if (fp8 == NULL) fp8 = &FP8_DEFAULTS;
    memset(m, 0, sizeof(*m));
    m->cfg = *cfg;
    m->precision = precision;
    m->pow2_scales = fp8->pow2_scales;
    m->fp8_recipe = fp8->recipe;
    m->amax_history = fp8->amax_history;
    m->amax_algo = fp8->amax_algo;
    m->fp8_margin = fp8->margin;
    m->fp8_fprop_fast_accum = 1; /* Transformer Engine's fprop; the trainer sets --fp8-fast-accum */
    m->fp8_accum = FP8_ACCUM_EXACT;
    m->recompute = recompute;
    m->B = B;
    m->T = T;
    m->sharding = sharding;
    m->optim_state = formats.optim_state;
    m->grad_format = formats.grad_buffer;
    m->master_format = formats.master_weights;
    if (m->grad_format != GRAD_FORMAT_FP32 && (sharding.zero_stage == 2 || (sharding.zero_stage == 0 && sharding.world > 1)))
        die("--grad-buffer %s: needs -z 1, or -z 0 on one rank (ZeRO-2 keeps no full buffer; -z 0 on %d ranks would store the "
            "reduced gradient again, use -z 1)", grad_format_name(m->grad_format), sharding.world);
    m->num_params = param_count(cfg);
    llama_layout(m);
}

/* Allocates one table's buffers as one (zeroed) allocation and prints its sizes; returns the allocation. */
static inline void* llama_alloc_table(const char* title, BufferSpec* specs, int n) {
    buffers_print(title, specs, n); /* first: an out-of-memory stop follows the sizes */
    size_t bytes = buffers_bytes(specs, n);
    void* memory = dev_alloc(bytes);
    /* zeroed: padding and the parts of other ranks' pieces must hold finite values (collectives read them) */
    dev_zero(memory, bytes);
    buffers_point(specs, n, memory);
    return memory;
}

/*
 * Allocates every buffer of a model for micro-batches up to (B, T) under `sharding` and prints the
 * memory tables (per rank). The weights are undefined until llama_set_params or the trainer loads them.
 */
static inline void llama_build(Llama* m, const LlamaConfig* cfg, Precision precision, int B, int T, const Fp8Settings* fp8,
                               int recompute, Sharding sharding, StateFormats formats) {
    llama_configure(m, cfg, precision, B, T, fp8, recompute, sharding, formats);
    size_t P = m->num_params, L = (size_t)cfg->n_layers, full = m->layout.full, shard = m->layout.shard;
    printf("| parameters: %zu (%.2f M); %d rank(s), ZeRO-%d: this rank holds %zu of %zu elements (%.1f%%)\n", P, P / 1e6,
           sharding.world, sharding.zero_stage, shard, full, 100.0 * (double)shard / (double)full);

    BufferSpec state[NUM_STATE_BUFFERS], acts[NUM_ACT_BUFFERS], small[NUM_SMALL_BUFFERS];
    int nstate = llama_state_table(m, state), nacts = llama_acts_table(m, acts), nsmall = llama_small_table(m, small);
    m->state_memory = llama_alloc_table(STATE_TABLE_TITLE, state, nstate);
    m->acts_memory = llama_alloc_table(ACTS_TABLE_TITLE, acts, nacts);
    m->acts_bytes = buffers_bytes(acts, nacts);
    m->small_memory = llama_alloc_table(SMALL_TABLE_TITLE, small, nsmall);
    m->fp8_operand = (uint8_t*)m->acts.logits;
    /* fp8 moments start as zeros with scale_inv 1 (what a chunk's first update decodes, and a valid state);
       so do an fp16 master's chunks that hold no element of this rank (padding) */
    size_t scales[2] = {adamw_scale_count(m->optim_state, shard), store_scale_count(master_codec(m->master_format), shard)};
    float* targets[2] = {m->adam_scale_inv, m->master_scale_inv};
    for (int k = 0; k < 2; k++) {
        if (scales[k] == 0) continue;
        float* ones = (float*)mallocCheck(scales[k] * sizeof(float));
        for (size_t j = 0; j < scales[k]; j++) ones[j] = 1.0f;
        dev_upload(targets[k], ones, scales[k] * sizeof(float));
        free(ones);
    }
    m->fp8_operand_t = m->fp8_operand + llama_fp8_operand_bytes(m) / 2;

    m->fp8_linear = (Fp8Linear*)callocCheck(L * LIN_PER_LAYER, sizeof(Fp8Linear));
    m->fp8_wt_pending = (char*)callocCheck(L, 1);
    m->bf16_block = (char*)callocCheck(L, 1);
    size_t N = (size_t)B * T;
    uint8_t* xt = m->acts.xt8;
    for (int l = 0; l < (int)L; l++) {
        for (int lin = 0; lin < LIN_PER_LAYER; lin++) {
            ModelSegment* s = llama_segment(m, llama_linear_tensor((LinearId)lin), l);
            if (!s->fp8) continue;
            Fp8Linear* f = &m->fp8_linear[llama_slot(l, lin)];
            f->w = llama_segment_fp8_w(m, s);
            f->wt = llama_segment_fp8_wt(m, s);
            /* X^T of wqkv, w13, w2 (-r 0); wo's is recast from the kept attention output */
            if (xt != NULL && lin != LIN_WO) {
                size_t OC, C;
                llama_linear_dims(cfg, (LinearId)lin, &OC, &C);
                f->xt = xt;
                xt += C * N;
            }
        }
    }

    size_t half = (size_t)llama_head_dim(cfg) / 2;
    float* cos_host = (float*)mallocCheck((size_t)T * half * sizeof(float));
    float* sin_host = (float*)mallocCheck((size_t)T * half * sizeof(float));
    rope_tables(T, llama_head_dim(cfg), cfg->rope_theta, cos_host, sin_host);
    dev_upload(m->rope_cos, cos_host, (size_t)T * half * sizeof(float));
    dev_upload(m->rope_sin, sin_host, (size_t)T * half * sizeof(float));
    free(cos_host);
    free(sin_host);
    m->losses_host = (float*)mallocCheck(N * sizeof(float));
}

/* Frees a model of llama_build, or the layout of llama_configure. */
static inline void llama_free(Llama* m) {
    if (m->state_memory) dev_free(m->state_memory);
    if (m->acts_memory) dev_free(m->acts_memory);
    if (m->bf16_scratch) dev_free(m->bf16_scratch);
    if (m->small_memory) dev_free(m->small_memory);
    free(m->fp8_linear);
    free(m->fp8_wt_pending);
    free(m->bf16_block);
    free(m->losses_host);
    free(m->segs);
    memset(m, 0, sizeof(*m));
}

/* ---------------------------------------------------------------- FP8 weights */

/*
 * The FP8 linear layers keep no BF16 working copy (DESIGN.md section 9: an fp8 run needs no more memory
 * than the bf16 one): their E4M3 W and W^T are cast from the master weights (as FP32) once per optimizer step.
 * What is quantized is the BF16 rounding of each master weight, the value a working copy would hold, so
 * the codes and scales are those a cast of the working copy gives (and the GPU's and the CPU's agree bit
 * for bit, as for every other cast): amax = max |bf16(master)|, scale from amax (fp8.h), code =
 * E4M3(bf16(master) * scale).
 * One shard (ZeRO-0, or one rank): llama_refresh_working_weights computes each amax and casts W and W^T
 * in one pass. Sharded (ZeRO-1/2 over N ranks) each rank holds pieces of the master weights only:
 *   1. llama_refresh_working_weights: amax of this rank's pieces, into the W scales (fp8_scales[FP8_OP_W]);
 *   2. the driver MAX-all-reduces every W scale record at once (llama_fp8_weight_scales, one collective);
 *   3. llama_fp8_cast_weights: each rank casts its pieces of W with the global scale;
 *   4. the driver all-gathers the E4M3 pieces (1 byte per element where BF16 weights take 2);
 *   5. llama_weights_needed: each layer's W^T is transposed from its gathered W before its first use.
 * The bytes and scales equal the one-shard run's: a max is exact in any order, and so is every cast.
 */

/* A piece of n elements of a row-major tensor as (rows, cols) for a cast that writes no transpose: whole
   ZERO_CHUNK-element rows when it has them (a segment's last piece may not), so the GPU's tiles are full. */
static inline void llama_piece_shape(size_t n, size_t* rows, size_t* cols) {
    int whole = n > 0 && n % ZERO_CHUNK == 0;
    *rows = whole ? n / ZERO_CHUNK : 1;
    *cols = whole ? ZERO_CHUNK : n;
}

/* The slot and dims of FP8 segment s. */
static inline size_t llama_segment_slot(const ModelSegment* s, const LlamaConfig* c, size_t* out_dim, size_t* in_dim) {
    LinearId lin = LIN_QKV;
    while (llama_linear_tensor(lin) != s->param.tensor) lin = (LinearId)(lin + 1);
    llama_linear_dims(c, lin, out_dim, in_dim);
    return llama_slot(s->param.layer, lin);
}

/* The W scale records of every slot, contiguous: (llama_fp8_slots) Fp8Scale, whose amax fields step 2 reduces. */
static inline Fp8Scale* llama_fp8_weight_scales(Llama* m) { return m->fp8_scales + (size_t)FP8_OP_W * llama_fp8_slots(m); }

/* Casts this rank's pieces of the FP8 weights with the W scales' amax: W and W^T when the rank holds
   every piece, else W's pieces (the layers' W^T then wait for the gather). Gathers no statistics: these
   are the next step's weights, which llama_fp8_stats_begin counts when that step gathers them. */
static inline void llama_fp8_cast_weights(Llama* m) {
    /* new weights: their casts alone decide the W flags (llama_fp8_nonfinite) */
    if (m->precision == PRECISION_FP8) op_fp8_clear_nonfinite(llama_fp8_weight_scales(m), llama_fp8_slots(m));
    for (int i = 0; i < m->num_segs; i++) {
        ModelSegment* s = &m->segs[i];
        if (!s->fp8) continue;
        size_t OC, C, b, n, rows, cols;
        size_t slot = llama_segment_slot(s, &m->cfg, &OC, &C);
        Fp8Scale* sw = fp8_scale(m, slot, FP8_OP_W);
        const float* master = llama_master_piece(m, s, 1);
        if (m->layout.shards == 1) {
            op_cast_transpose_master(llama_segment_fp8_w(m, s), llama_segment_fp8_wt(m, s), master, OC, C, FP8_E4M3, sw,
                                     m->pow2_scales, NULL);
            continue;
        }
        /* every rank casts, a rank without a piece an empty one: the cast sets the scale the GEMMs read */
        llama_own_piece(m, s, &b, &n);
        llama_piece_shape(n, &rows, &cols);
        op_cast_transpose_master(llama_segment_fp8_w(m, s) + b, NULL, master, rows, cols, FP8_E4M3, sw, m->pow2_scales, NULL);
        m->fp8_wt_pending[s->param.layer] = 1;
    }
}

/* Step 5: layer `layer`'s W^T copies from its whole (gathered) W, when still to be made. */
static inline void llama_fp8_finish_layer(Llama* m, int layer) {
    if (!m->fp8_wt_pending[layer]) return;
    for (int lin = 0; lin < LIN_PER_LAYER; lin++) {
        ModelSegment* s = llama_segment(m, llama_linear_tensor((LinearId)lin), layer);
        if (!s->fp8) continue;
        size_t OC, C;
        llama_linear_dims(&m->cfg, (LinearId)lin, &OC, &C);
        op_transpose_fp8(llama_segment_fp8_wt(m, s), llama_segment_fp8_w(m, s), OC, C);
    }
    m->fp8_wt_pending[layer] = 0;
}

/*
 * Refreshes this rank's pieces of the working weights from its master weights (as FP32) and the FP8 weights
 * as the banner above says (steps 1, and 3 when the rank holds every piece); the driver all-gathers the
 * rest under ZeRO-1/2.
 */
static inline void llama_refresh_working_weights(Llama* m) {
    if (m->precision == PRECISION_FP8) op_fp8_reset_amax(fp8_scale(m, 0, FP8_OP_W), llama_fp8_slots(m)); /* one memset for all W amaxes */
    for (int i = 0; i < m->num_segs; i++) {
        ModelSegment* s = &m->segs[i];
        size_t b, n, OC, C;
        llama_own_piece(m, s, &b, &n);
        const float* master = llama_master_piece(m, s, 1);
        if (s->fp8) op_amax_master(fp8_scale(m, llama_segment_slot(s, &m->cfg, &OC, &C), FP8_OP_W), master, n);
        else if (n > 0) op_params_from_master(m->weights + s->weight_offset + b, master, n);
    }
    if (m->layout.shards == 1) llama_fp8_cast_weights(m);
}

/* What the driver all-gathers for segment s after a refresh: its working copy or E4M3 W, one piece of
   *piece_bytes per rank. */
static inline void* llama_segment_gather_buffer(Llama* m, const ModelSegment* s, size_t* piece_bytes) {
    *piece_bytes = s->shard.piece * (s->fp8 ? 1 : sizeof(act_t));
    return s->fp8 ? (void*)llama_segment_fp8_w(m, s) : (void*)(m->weights + s->weight_offset);
}

/* Loads this rank's pieces of host FP32 parameters (param_count elements, checkpoint order) as master
   weights and working weights. */
static inline void llama_set_params(Llama* m, const float* params) {
    for (int i = 0; i < m->num_segs; i++) {
        ModelSegment* s = &m->segs[i];
        size_t b, n;
        llama_own_piece(m, s, &b, &n);
        if (n == 0) continue;
        dev_upload(llama_master_piece(m, s, 0), params + s->param.param_offset + b, n * sizeof(float));
        llama_master_store(m, s);
    }
    llama_refresh_working_weights(m);
}

/* Copies the FP32 master weights to the host (param_count elements, checkpoint order); one shard only. */
static inline void llama_get_params(Llama* m, float* params) {
    if (m->layout.shards != 1) die("llama_get_params: the master weights are sharded over %d ranks", m->layout.shards);
    for (int i = 0; i < m->num_segs; i++) {
        ModelSegment* s = &m->segs[i];
        dev_download(params + s->param.param_offset, llama_master_piece(m, s, 1), s->param.count * sizeof(float));
    }
}

/* Copies the gradients the backward accumulated to the host (param_count elements, checkpoint order).
   ZeRO-0/1 only: ZeRO-2 keeps no full gradients, and under ZeRO-1 a bf16/fp8 --grad-buffer lacks the
   step's last micro-step (data_parallel.h reduces it from the bucket buffers). */
static inline void llama_get_grads(Llama* m, float* grads) {
    if (m->sharding.zero_stage == 2) die("llama_get_grads: ZeRO-2 keeps no full gradients");
    if (m->sharding.zero_stage == 1 && m->grad_format != GRAD_FORMAT_FP32)
        die("llama_get_grads: under ZeRO-1 a bf16/fp8 gradient buffer does not hold the step's last micro-step");
    for (int i = 0; i < m->num_segs; i++) {
        ModelSegment* s = &m->segs[i];
        const float* g = (const float*)llama_stored_grad(m, s);
        if (m->grad_format != GRAD_FORMAT_FP32) {
            float* out = llama_bucket_grad(m, s);
            op_store_load(grad_codec(m->grad_format), out, llama_stored_grad(m, s), llama_stored_grad_scale_inv(m, s), s->param.count, 0);
            g = out;
        }
        dev_download(grads + s->param.param_offset, g, s->param.count * sizeof(float));
    }
}
