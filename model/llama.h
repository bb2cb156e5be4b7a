/*
 * The Llama struct as both builds hold it (compiled after a backend, as model.h): its options, the
 * parameter segments in comm/zero.h's layouts, the buffer tables (one allocation each for the weights,
 * gradients and optimizer state, the activations and the small buffers, printed in MiB), the parameters
 * as the passes read them (LayerParams), the accessors of the stored weights and gradients, and the
 * modes a run switches (the linears' precision, the data-parallel hooks). Only this folder writes a
 * field of Llama; model.h runs the passes over it (docs/model.md; the sizes: docs/memory.md).
 */
#pragma once

#include <math.h>

#include "fp8_state.h"
#include "../core/op_record.h"
#include "../comm/zero.h"

/* The moments' scale granule must be the shard pieces' (optim.h ADAMW_CHUNK, comm/zero.h ZERO_CHUNK): a
   compile-time check (an array of size -1 does not compile). */
typedef char adamw_chunk_is_zero_chunk[ADAMW_CHUNK == ZERO_CHUNK ? 1 : -1];

/* The activations of the last forward (docs/model.md "Recompute" says which ones -r keeps per layer). */
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

/* Activation buffers (the fields of Acts): the size of the table llama_acts_table fills. */
#define NUM_ACT_BUFFERS (sizeof(Acts) / sizeof(void*))

/* Buckets of communication: the embedding (0), each layer (1 + layer), the final norm with the output layer (L + 1). */
#define BUCKET_EMBEDDING 0
static inline int bucket_of_layer(int layer) { return 1 + layer; }

/* The three FP32 bucket buffers (llama_grads_bucketed): two for alternating layers, one for the embedding and the head. */
enum { GRAD_BUFFER_EVEN, GRAD_BUFFER_ODD, GRAD_BUFFER_OTHER, GRAD_BUFFERS };

/*
 * A parameter segment with its place in the layouts of this run. The weight of a block linear of an fp8
 * run (fp8) has no BF16 working copy: its E4M3 W and W^T are cast from the master weights (fp8_state.h);
 * every other segment has a working copy.
 */
typedef struct {
    ParamSegment param;   /* tensor, layer, checkpoint offset, count */
    ShardSegment shard;   /* full / shard / chunk layouts (comm/zero.h) */
    size_t own_begin;     /* this rank's piece: elements [own_begin, own_begin + own_count) of the segment */
    size_t own_count;
    int bucket;           /* the bucket it belongs to */
    int grad_buffer;      /* bucketed gradients: the bucket buffer of its bucket */
    size_t buffer_offset; /* bucketed gradients: its offset there */
    int linear;           /* the LinearId of a linear layer's weight, else -1 */
    int fp8;              /* the weight of a block linear of an fp8 run */
    size_t weight_offset; /* not fp8: its working copy in `weights`, padded as the full layout (elements) */
    size_t fp8_offset;    /* fp8: its E4M3 W in `fp8_weights`, padded as the full layout, then W^T (bytes) */
} ModelSegment;

/* A linear layer as its GEMMs see it: y (N, OC) = x (N, C) W^T, W (OC, C). Device pointers. */
typedef struct {
    LinearId id;
    int layer;              /* NO_LAYER for the output layer */
    size_t in_dim, out_dim; /* C, OC */
    size_t slot;            /* its FP8 records (a block linear) */
    const ModelSegment* seg;
    const act_t* weight;    /* its working copy, or NULL: a block linear of an fp8 run has none (llama_bf16_weight) */
    uint8_t* w8;            /* (OC, C) E4M3 W, fprop's A; NULL unless the linear can run FP8 */
    uint8_t* wt8;           /* (C, OC) E4M3 W^T with the same codes, dgrad's A */
    uint8_t* xt8;           /* (C, N) E4M3 X^T saved by fprop for wgrad, or NULL: backward recasts X */
    const float* w_scale_inv; /* the scale_inv of W's codes (its W record) */
    float* dweight;         /* (OC, C) FP32: where backward accumulates dW */
} Linear;

/* One block's parameters. */
typedef struct {
    const act_t* attn_norm;  /* (C) */
    const act_t* ffn_norm;   /* (C) */
    float* d_attn_norm;      /* (C) FP32 gradients, accumulated by backward */
    float* d_ffn_norm;
    Linear lin[LIN_PER_LAYER]; /* wqkv, wo, w13, w2 */
} LayerParams;

/* Called by the model around each bucket (docs/cluster.md); any may be NULL but all_gather, which a
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

/* What a run switches while it trains (llama_set_*), saved and restored as one (llama_modes). */
typedef struct {
    int linears_bf16;  /* fp8: every block linear runs BF16 (the shadow check's BF16 run, the fallback policy) */
    int unfused_amax;  /* tests: every FP8 X amax by its own read instead of its producer's */
    ModelHooks hooks;
} ModelModes;

typedef struct {
    LlamaConfig cfg;
    ModelOptions opt;          /* as built; opt.bf16_blocks points at bf16_block */
    /* the layout (host) */
    size_t num_params;         /* P, in checkpoint order */
    ModelSegment* segs;        /* (num_segs) in checkpoint order */
    int num_segs;
    int seg_base[NUM_PARAM_TENSORS]; /* index of each tensor's first segment */
    ShardLayout layout;
    int shard_index;           /* the shard this rank holds: its rank, or 0 under ZeRO-0 */
    size_t grad_buffer_elems[GRAD_BUFFERS]; /* bucketed gradients (llama_grads_bucketed) */
    size_t working_elems;      /* elements of the working weights */
    size_t fp8_weight_bytes;   /* bytes of the FP8 weight copies */
    size_t bf16_scratch_elems; /* llama_bf16_weight's scratch: the largest FP8 weight, padded */
    /* the parameters as the passes read them */
    const act_t* embedding;    /* (V, C) */
    float* d_embedding;
    const act_t* final_norm;   /* (C) */
    float* d_final_norm;
    LayerParams* layers;       /* (L) host */
    Linear output;
    /* weights, gradients and optimizer state: one allocation */
    void* state_memory;
    act_t* weights;            /* (working_elems) working weights (BF16 on the GPU) of the segments that have them */
    uint8_t* fp8_weights;      /* (fp8_weight_bytes) E4M3 W and W^T of every block linear of an fp8 run */
    void* master;              /* (layout.shard) master weights of this rank's shard, as --master-weights (llama_master_piece) */
    float* master_scale_inv;   /* (store_scale_count(master codec, layout.shard)) their scale_inv (fp16) */
    float* master_scratch;     /* (largest piece) FP32: an fp16 master's segment decoded (llama_master_piece) */
    void* adam_m;              /* (layout.shard) AdamW first moment, as --optim-state (optim.h) */
    void* adam_v;              /* (layout.shard) AdamW second moment, likewise */
    float* adam_scale_inv;     /* (adamw_scale_count(optim_state, layout.shard)) the moments' scale_inv (fp8) */
    void* grads;               /* (layout.full) gradients accumulated over micro-steps, as --grad-buffer (ZeRO-0/1) */
    float* grad_scale_inv;     /* (store_scale_count(grad codec, layout.full)) their scale_inv (fp8) */
    float* grad_buffer[GRAD_BUFFERS]; /* FP32 bucket buffers the backward writes (ZeRO-2, or a bf16/fp8 `grads`) */
    float* grad_shard;         /* (layout.shard) reduced gradients of this rank's shard (ZeRO-1/2) */
    double* norm_partials;     /* (layout.chunks) sums of squares of the reduced gradient per chunk */
    /* activations: one allocation */
    void* acts_memory;
    Acts acts;
    size_t acts_bytes;
    uint8_t* fp8_operand;      /* (N, Dmax) the E4M3 X of the running fprop; in backward E5M2 dY, then the
                                  recast X^T (fp8; in the logits buffer, see llama_fp8_operand_bytes) */
    uint8_t* fp8_operand_t;    /* (Dmax, N) E5M2 dY^T (fp8; after fp8_operand) */
    act_t* bf16_scratch;       /* (bf16_scratch_elems) llama_bf16_weight's, when the options can run a block linear
                                  of an fp8 run in BF16 (outside the tables: the memory plan's workspace row) */
    /* the small buffers: one allocation */
    void* small_memory;
    Fp8State fp8;              /* the FP8 step state: records, counts, histories */
    float* rope_cos;           /* (T, HS/2) */
    float* rope_sin;           /* (T, HS/2) */
    int* inputs;               /* (B, T) device copy of the micro-batch's tokens */
    int* targets;              /* (B, T) */
    /* host */
    char* bf16_block;          /* (L) the block runs its linears in BF16 in -p fp8 (--bf16-layers) */
    char* fp8_wt_pending;      /* (L) the layer's W^T copies are still to be made from its gathered W */
    ModelModes mode;
    int replaying;             /* backward is replaying a block's forward (-r 2) */
    const int* inputs_host;    /* the host tokens of the last forward */
    float* losses_host;        /* (B*T) */
    int last_B, last_T;        /* shape of the last forward */
} Llama;

/* ---------------------------------------------------------------- what the options imply */

static inline size_t llama_slot(int layer, int lin) { return (size_t)layer * LIN_PER_LAYER + lin; }
/* FP8 slots: one per linear layer of the blocks. */
static inline size_t llama_fp8_slots(const Llama* m) { return (size_t)m->cfg.n_layers * LIN_PER_LAYER; }

/* Does backward read the BF16 inputs of the linear layers (ln_attn, ln_ffn, swiglu) from memory? */
static inline int llama_keeps_linear_inputs(const Llama* m) {
    return m->opt.precision != PRECISION_FP8 && m->opt.recompute == RECOMPUTE_NONE;
}
/* Does fprop keep the E4M3 X^T of wqkv, w13 and w2 for wgrad (else backward recasts their rebuilt inputs)? */
static inline int llama_keeps_xt(const Llama* m) { return m->opt.precision == PRECISION_FP8 && m->opt.recompute == RECOMPUTE_NONE; }
/* Are the block buffers kept per layer (else backward replays each block's forward, -r 2)? */
static inline int llama_keeps_blocks(const Llama* m) { return m->opt.recompute != RECOMPUTE_BLOCKS; }

/* Does the backward write FP32 bucket buffers (ZeRO-2's, also a bf16/fp8 --grad-buffer's) rather than `grads`? */
static inline int llama_grads_bucketed(const Llama* m) {
    return m->opt.sharding.zero_stage == 2 || m->opt.formats.grad_buffer != GRAD_FORMAT_FP32;
}

/* Can a block linear of this fp8 model run BF16 (--bf16-layers, or the switch of llama_set_linear_precision)? */
static inline int llama_has_bf16_linears(const Llama* m) {
    if (m->opt.precision != PRECISION_FP8) return 0;
    int any = m->opt.bf16_linears;
    for (int l = 0; l < m->cfg.n_layers && m->opt.bf16_blocks && !any; l++) any = m->opt.bf16_blocks[l] != 0;
    return any;
}

/* Dmax: the widest row of an FP8 GEMM operand, the largest OC (dY) or C (X) of the blocks' linear layers. */
static inline size_t llama_fp8_operand_dim(const LlamaConfig* c) {
    size_t C = (size_t)c->dim, F = (size_t)c->ffn_dim, QKV = (size_t)llama_qkv_dim(c);
    size_t d = QKV > 2 * F ? QKV : 2 * F;
    return d > C ? d : C; /* 2F >= F */
}

/*
 * Bytes of the FP8 operand scratch, fp8_operand and fp8_operand_t of N Dmax bytes each (0 outside fp8).
 * It lives in the logits buffer, which is dead whenever a block runs: the forward's blocks run before the
 * output layer writes the logits, the backward's after the output layer's backward has read them. The
 * logits buffer grows when the scratch is larger (max(QKV, 2F) > V, as in Llama-2 70B).
 */
static inline size_t llama_fp8_operand_bytes(const Llama* m) {
    if (m->opt.precision != PRECISION_FP8) return 0;
    return 2 * (size_t)m->opt.B * m->opt.T * llama_fp8_operand_dim(&m->cfg);
}

/* ---------------------------------------------------------------- the tables */

/* Activation buffers for micro-batch (B, T) at the run's recompute level. */
static inline int llama_acts_table(Llama* m, BufferSpec* s) {
    const LlamaConfig* c = &m->cfg;
    size_t N = (size_t)m->opt.B * m->opt.T, C = (size_t)c->dim, L = (size_t)c->n_layers, F = (size_t)c->ffn_dim;
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
    SPEC(att_stats, blocks * att_stats_size((size_t)m->opt.B, c->n_heads, m->opt.T), f);
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

/* Weights, gradients and optimizer state (this rank's, as sharding lays them out): at most NUM_STATE_BUFFERS. */
#define NUM_STATE_BUFFERS 15
static inline int llama_state_table(Llama* m, BufferSpec* s) {
    size_t full = m->layout.full, shard = m->layout.shard;
    int z = m->opt.sharding.zero_stage, n = 0;
    const StateFormats* f = &m->opt.formats;
    const size_t* gb = m->grad_buffer_elems;
    s[n++] = (BufferSpec){"weights", (void**)&m->weights, m->working_elems, sizeof(act_t), "working weights"};
    s[n++] = (BufferSpec){"fp8_weights", (void**)&m->fp8_weights, m->fp8_weight_bytes, 1, "FP8 weight copies"};
    StoreCodec mc = master_codec(f->master_weights);
    s[n++] = (BufferSpec){"master", (void**)&m->master, shard, store_bytes(mc), "master weights"};
    s[n++] = (BufferSpec){"master_scale_inv", (void**)&m->master_scale_inv, store_scale_count(mc, shard), sizeof(float), "master weights"};
    s[n++] = (BufferSpec){"master_scratch", (void**)&m->master_scratch, mc == STORE_FP32 ? 0 : llama_largest_piece(m), sizeof(float),
                          "master weights"};
    s[n++] = (BufferSpec){"adam_m", (void**)&m->adam_m, shard, adamw_moment_bytes(f->optim_state, 0), "AdamW moments"};
    s[n++] = (BufferSpec){"adam_v", (void**)&m->adam_v, shard, adamw_moment_bytes(f->optim_state, 1), "AdamW moments"};
    s[n++] = (BufferSpec){"adam_scale_inv", (void**)&m->adam_scale_inv, adamw_scale_count(f->optim_state, shard), sizeof(float),
                          "AdamW moments"};
    int buckets = llama_grads_bucketed(m);
    StoreCodec gc = grad_codec(f->grad_buffer);
    s[n++] = (BufferSpec){"grads", (void**)&m->grads, z < 2 ? full : 0, store_bytes(gc), "gradients"};
    s[n++] = (BufferSpec){"grad_scale_inv", (void**)&m->grad_scale_inv, z < 2 ? store_scale_count(gc, full) : 0, sizeof(float), "gradients"};
    s[n++] = (BufferSpec){"grad_bucket_0", (void**)&m->grad_buffer[GRAD_BUFFER_EVEN], buckets ? gb[GRAD_BUFFER_EVEN] : 0, sizeof(float), "gradients"};
    s[n++] = (BufferSpec){"grad_bucket_1", (void**)&m->grad_buffer[GRAD_BUFFER_ODD], buckets ? gb[GRAD_BUFFER_ODD] : 0, sizeof(float), "gradients"};
    s[n++] = (BufferSpec){"grad_bucket_2", (void**)&m->grad_buffer[GRAD_BUFFER_OTHER], buckets ? gb[GRAD_BUFFER_OTHER] : 0, sizeof(float), "gradients"};
    s[n++] = (BufferSpec){"grad_shard", (void**)&m->grad_shard, z > 0 ? shard : 0, sizeof(float), "gradients"};
    s[n++] = (BufferSpec){"norm_partials", (void**)&m->norm_partials, m->layout.chunks, sizeof(double), "workspaces"};
    if (n != NUM_STATE_BUFFERS) die("state table has %d buffers, NUM_STATE_BUFFERS is %d", n, NUM_STATE_BUFFERS);
    return n;
}

/* The small buffers: FP8 records and statistics, RoPE tables, the micro-batch's tokens. */
#define NUM_SMALL_BUFFERS (FP8_STATE_BUFFERS + 4)
static inline int llama_small_table(Llama* m, BufferSpec* s) {
    size_t rope = (size_t)m->opt.T * (size_t)(llama_head_dim(&m->cfg) / 2), N = (size_t)m->opt.B * m->opt.T;
    int n = fp8_state_table(&m->fp8, s);
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

/* ---------------------------------------------------------------- segments and layouts */

static inline int llama_num_buckets(const Llama* m) { return m->cfg.n_layers + 2; }

/* The bucket of a segment: the embedding, its layer, or the head (final norm and output layer). */
static inline int llama_bucket_of(const LlamaConfig* c, const ParamSegment* p) {
    if (p->tensor == P_TOK_EMBEDDINGS) return BUCKET_EMBEDDING;
    return p->layer >= 0 ? bucket_of_layer(p->layer) : c->n_layers + 1;
}

/* The gradient buffer of a bucket: layers alternate between two, so one can be reduced while the
   next layer's backward writes the other; the embedding and the head share the third. */
static inline int llama_grad_buffer_of(const Llama* m, int bucket) {
    if (bucket == BUCKET_EMBEDDING || bucket == llama_num_buckets(m) - 1) return GRAD_BUFFER_OTHER;
    return (bucket - 1) % 2 == 0 ? GRAD_BUFFER_EVEN : GRAD_BUFFER_ODD;
}

/* The segment of (tensor, layer); layer is ignored for tensors that are not per layer. */
static inline ModelSegment* llama_segment(Llama* m, int tensor, int layer) {
    return &m->segs[m->seg_base[tensor] + (param_is_per_layer(tensor) ? layer : 0)];
}

/* The LinearId whose weight tensor is `tensor`, or -1. */
static inline int llama_linear_of(int tensor) {
    for (int lin = LIN_QKV; lin <= LIN_OUTPUT; lin++)
        if (llama_linear_tensor((LinearId)lin) == tensor) return lin;
    return -1;
}

/*
 * Cuts the parameters into segments and places them: the full and shard layouts for the sharding, this
 * rank's pieces, the buckets, the segments' places in the bucket buffers, and the working weights or
 * (block linears of an fp8 run) the E4M3 W and W^T of each segment. Allocates host metadata only.
 */
static inline void llama_layout(Llama* m) {
    const LlamaConfig* c = &m->cfg;
    const Sharding* sh = &m->opt.sharding;
    m->num_segs = param_segment_count(c);
    ParamSegment* params = (ParamSegment*)mallocCheck((size_t)m->num_segs * sizeof(ParamSegment));
    ShardSegment* shards = (ShardSegment*)mallocCheck((size_t)m->num_segs * sizeof(ShardSegment));
    param_segments(c, params);
    for (int i = 0; i < m->num_segs; i++) shards[i].count = params[i].count;
    int sharded = sh->zero_stage > 0;
    m->layout = zero_layout(shards, m->num_segs, sharded ? sh->world : 1);
    m->shard_index = sharded ? sh->rank : 0;
    m->segs = (ModelSegment*)callocCheck((size_t)m->num_segs, sizeof(ModelSegment));
    for (int i = 0; i < m->num_segs; i++) {
        ModelSegment* s = &m->segs[i];
        s->param = params[i];
        s->shard = shards[i];
        zero_piece(&s->shard, m->shard_index, &s->own_begin, &s->own_count);
        s->bucket = llama_bucket_of(c, &params[i]);
        s->grad_buffer = llama_grad_buffer_of(m, s->bucket);
        s->linear = llama_linear_of(params[i].tensor);
        s->fp8 = m->opt.precision == PRECISION_FP8 && s->linear >= 0 && s->linear != LIN_OUTPUT;
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

/* "wqkv[layer 3]" style name of segment `index`. */
static inline void llama_segment_name(const Llama* m, int index, char* out, size_t len) {
    param_segment_name(&m->segs[index].param, out, len);
}

/* ---------------------------------------------------------------- accessors of the stored state */

/* The E4M3 W (OC, C) of an FP8 segment, padded to shards * piece bytes, and its W^T (C, OC) after it. */
static inline uint8_t* llama_segment_fp8_w(Llama* m, const ModelSegment* s) { return m->fp8_weights + s->fp8_offset; }
static inline uint8_t* llama_segment_fp8_wt(Llama* m, const ModelSegment* s) {
    return m->fp8_weights + s->fp8_offset + ceil_div(s->shard.piece * (size_t)m->layout.shards, BUFFER_ALIGN) * BUFFER_ALIGN;
}

/*
 * Segment s's piece of this rank's master weights as FP32 (s->shard.piece elements, padding zero): the
 * master itself (fp32), or (fp16) the piece decoded into master_scratch when `decode`, to be overwritten
 * otherwise; valid until the next call. After writing it, llama_master_store stores it.
 */
static inline float* llama_master_piece(Llama* m, const ModelSegment* s, int decode) {
    MasterFormat f = m->opt.formats.master_weights;
    if (f == MASTER_FP32) return (float*)m->master + s->shard.shard_offset;
    StoreCodec c = master_codec(f);
    if (decode)
        op_store_load(c, m->master_scratch, (char*)m->master + s->shard.shard_offset * store_bytes(c),
                      m->master_scale_inv + s->shard.shard_offset / ZERO_CHUNK, s->shard.piece, 0);
    return m->master_scratch;
}

/* After the FP32 piece of llama_master_piece was written: an fp16 master stores this rank's part of it
   with its chunks' new scales (fp32: nothing to do). */
static inline void llama_master_store(Llama* m, const ModelSegment* s) {
    MasterFormat f = m->opt.formats.master_weights;
    if (f == MASTER_FP32) return;
    StoreCodec c = master_codec(f);
    op_store_add(c, (char*)m->master + s->shard.shard_offset * store_bytes(c), m->master_scale_inv + s->shard.shard_offset / ZERO_CHUNK,
                 m->master_scratch, s->own_count, 0);
}

/* Segment s's place in its FP32 bucket buffer (llama_grads_bucketed). */
static inline float* llama_grad_bucket(Llama* m, const ModelSegment* s) { return m->grad_buffer[s->grad_buffer] + s->buffer_offset; }

/* Segment s's accumulated gradients in the full gradients, as --grad-buffer stores them (ZeRO-0/1). */
static inline void* llama_grad_stored(Llama* m, const ModelSegment* s) {
    return (char*)m->grads + s->shard.offset * store_bytes(grad_codec(m->opt.formats.grad_buffer));
}
/* The scale_inv of segment s's first chunk in the full gradients (fp8 buffer), else NULL. */
static inline float* llama_grad_stored_scale_inv(Llama* m, const ModelSegment* s) {
    return m->grad_scale_inv != NULL ? m->grad_scale_inv + s->shard.offset / ZERO_CHUNK : NULL;
}

/* Segment s's piece of the reduced gradient shard (ZeRO-1/2). */
static inline float* llama_grad_shard(Llama* m, const ModelSegment* s) { return m->grad_shard + s->shard.shard_offset; }

/* Where the backward accumulates the gradient of (tensor, layer): the FP32 full gradients, or a bucket
   buffer (llama_grads_bucketed). */
static inline float* llama_grad_accumulator(Llama* m, int tensor, int layer) {
    ModelSegment* s = llama_segment(m, tensor, layer);
    return llama_grads_bucketed(m) ? llama_grad_bucket(m, s) : (float*)llama_grad_stored(m, s);
}

/*
 * The reduced FP32 gradient of segment s's piece of this rank's shard: in the reduced shard (ZeRO-1/2) or
 * the FP32 full gradients (ZeRO-0); a bf16/fp8 ZeRO-0 buffer (one rank) is first decoded into the
 * segment's place in its bucket buffer, which is free once the backward is done. Asynchronous.
 */
static inline const float* llama_grad_reduced(Llama* m, const ModelSegment* s) {
    GradFormat f = m->opt.formats.grad_buffer;
    if (m->opt.sharding.zero_stage > 0) return llama_grad_shard(m, s);
    if (f == GRAD_FORMAT_FP32) return (const float*)llama_grad_stored(m, s);
    float* out = llama_grad_bucket(m, s);
    op_store_load(grad_codec(f), out, llama_grad_stored(m, s), llama_grad_stored_scale_inv(m, s), s->param.count, 0);
    return out;
}

/* The storage formats of the model's state (--optim-state, --grad-buffer, --master-weights). */
static inline StateFormats llama_state_formats(const Llama* m) { return m->opt.formats; }

/* This rank's AdamW moments (layout.shard elements, optim.h's AdamwMoments). */
static inline AdamwMoments llama_moments(const Llama* m) {
    AdamwMoments s = {m->opt.formats.optim_state, m->adam_m, m->adam_v, m->adam_scale_inv};
    return s;
}

/* The linear layer `lin` of block `layer` (NO_LAYER for LIN_OUTPUT). */
static inline const Linear* llama_linear(const Llama* m, int layer, LinearId lin) {
    return lin == LIN_OUTPUT ? &m->output : &m->layers[layer].lin[lin];
}

/*
 * The BF16 (activation type) weight (OC, C) of linear `lin`, for a GEMM in the activation type (a BF16
 * shadow forward, a BF16 fallback of an FP8 layer, --bf16-layers): its working copy, or, for a block
 * linear of an fp8 run, the BF16 rounding of its master weights rebuilt into bf16_scratch and, when
 * sharded, all-gathered through the all_gather hook (docs/model.md "FP8 weights"): every rank must then
 * call it, in the same order. Read-only; valid until the next call.
 */
static inline const act_t* llama_bf16_weight(Llama* m, const Linear* lin) {
    if (lin->weight != NULL) return lin->weight;
    const ModelSegment* s = lin->seg;
    if (m->bf16_scratch == NULL) die("llama_bf16_weight: %s[layer %d] runs FP8; build the model with bf16_linears to run it in BF16",
                                     LINEAR_NAMES[lin->id], lin->layer);
    if (s->own_count > 0) {
        const float* master = llama_master_piece(m, s, 1);
        op_params_from_master(m->bf16_scratch + s->own_begin, master, s->own_count);
    }
    if (m->layout.shards > 1) {
        if (m->mode.hooks.all_gather == NULL) die("llama_bf16_weight: a sharded model needs the data-parallel driver's all_gather hook");
        m->mode.hooks.all_gather(m->mode.hooks.ctx, m->bf16_scratch, s->shard.piece * sizeof(act_t));
    }
    return m->bf16_scratch;
}

/* Tokens of the last forward's micro-batch: the N of every GEMM. */
static inline size_t llama_tokens(const Llama* m) { return (size_t)m->last_B * m->last_T; }

/* ---------------------------------------------------------------- modes */

/* Keeps the FP8 state's list of the slots that run FP8 now in step with the modes. */
static inline void llama_modes_changed(Llama* m) {
    for (size_t slot = 0; slot < llama_fp8_slots(m); slot++)
        m->fp8.slot_on[slot] = m->fp8.on && !m->mode.linears_bf16 && !m->bf16_block[slot / LIN_PER_LAYER];
}

/* The precision of the block linears now: the model's, or PRECISION_BF16 while an fp8 model runs them in BF16. */
static inline Precision llama_linear_precision(const Llama* m) { return m->mode.linears_bf16 ? PRECISION_BF16 : m->opt.precision; }

/* Runs every block linear of an fp8 model in BF16 (p = PRECISION_BF16: the shadow check, the fallback
   policy), or as built (p = the model's precision). Stops for any other p, and for BF16 when the build
   has no BF16 weight scratch (ModelOptions.bf16_linears). */
static inline void llama_set_linear_precision(Llama* m, Precision p) {
    int bf16 = p != m->opt.precision;
    if (bf16 && (p != PRECISION_BF16 || m->opt.precision != PRECISION_FP8))
        die("llama_set_linear_precision: a %s model runs its linears in %s only", precision_name(m->opt.precision),
            precision_name(m->opt.precision));
    if (bf16 && m->bf16_scratch == NULL) die("llama_set_linear_precision: the model was built without bf16_linears");
    m->mode.linears_bf16 = bf16;
    llama_modes_changed(m);
}

/* The data-parallel driver's hooks (NULL: none). */
static inline void llama_set_hooks(Llama* m, const ModelHooks* hooks) {
    if (hooks) m->mode.hooks = *hooks;
    else memset(&m->mode.hooks, 0, sizeof(m->mode.hooks));
}

/* fused 0: every FP8 X amax by a separate op_amax instead of its producer's (tests: the same bytes). */
static inline void llama_set_fused_amax(Llama* m, int fused) { m->mode.unfused_amax = !fused; }

/* The modes now, to restore with llama_set_modes. */
static inline ModelModes llama_modes(const Llama* m) { return m->mode; }
static inline void llama_set_modes(Llama* m, const ModelModes* modes) {
    if (modes->linears_bf16 && m->bf16_scratch == NULL) die("llama_set_modes: the model was built without bf16_linears");
    m->mode = *modes;
    llama_modes_changed(m);
}

/* Allocates the BF16 weight scratch of a model built without bf16_linears whose block linears must run
   BF16 after all (a run resumed in the shadow policy's fallback): at start-up, never in a step. */
static inline void llama_reserve_bf16_weight(Llama* m) {
    if (m->opt.precision == PRECISION_FP8 && m->bf16_scratch == NULL) {
        m->bf16_scratch = (act_t*)dev_alloc(m->bf16_scratch_elems * sizeof(act_t));
        op_record_mark_act(m->bf16_scratch, m->bf16_scratch_elems, sizeof(act_t));
    }
}

/* ---------------------------------------------------------------- build */

/* Linear `lin` of block `layer` (NO_LAYER: the output layer) as the build placed it. */
static inline Linear llama_place_linear(Llama* m, int layer, LinearId lin, uint8_t** xt) {
    Linear x;
    memset(&x, 0, sizeof(x));
    x.id = lin;
    x.layer = layer;
    llama_linear_dims(&m->cfg, lin, &x.out_dim, &x.in_dim);
    ModelSegment* s = llama_segment(m, llama_linear_tensor(lin), layer);
    x.seg = s;
    x.dweight = llama_grad_accumulator(m, llama_linear_tensor(lin), layer);
    if (!s->fp8) {
        x.weight = m->weights + s->weight_offset;
        return x;
    }
    x.slot = llama_slot(layer, lin);
    x.w_scale_inv = &fp8_record(&m->fp8, x.slot, FP8_OP_W)->scale_inv;
    x.w8 = llama_segment_fp8_w(m, s);
    x.wt8 = llama_segment_fp8_wt(m, s);
    /* X^T of wqkv, w13, w2 (-r 0); wo's is recast from the kept attention output */
    if (*xt != NULL && lin != LIN_WO) {
        x.xt8 = *xt;
        *xt += x.in_dim * (size_t)m->opt.B * m->opt.T;
    }
    return x;
}

/* The parameters as the passes read them: pointers into the allocated buffers. */
static inline void llama_place_params(Llama* m) {
    int L = m->cfg.n_layers;
    m->embedding = m->weights + llama_segment(m, P_TOK_EMBEDDINGS, 0)->weight_offset;
    m->d_embedding = llama_grad_accumulator(m, P_TOK_EMBEDDINGS, 0);
    m->final_norm = m->weights + llama_segment(m, P_NORM, 0)->weight_offset;
    m->d_final_norm = llama_grad_accumulator(m, P_NORM, 0);
    m->layers = (LayerParams*)callocCheck((size_t)L, sizeof(LayerParams));
    uint8_t* xt = m->acts.xt8;
    for (int l = 0; l < L; l++) {
        LayerParams* p = &m->layers[l];
        p->attn_norm = m->weights + llama_segment(m, P_ATTN_NORM, l)->weight_offset;
        p->ffn_norm = m->weights + llama_segment(m, P_FFN_NORM, l)->weight_offset;
        p->d_attn_norm = llama_grad_accumulator(m, P_ATTN_NORM, l);
        p->d_ffn_norm = llama_grad_accumulator(m, P_FFN_NORM, l);
        for (int lin = 0; lin < LIN_PER_LAYER; lin++) p->lin[lin] = llama_place_linear(m, l, (LinearId)lin, &xt);
    }
    m->output = llama_place_linear(m, NO_LAYER, LIN_OUTPUT, &xt);
}

/*
 * Sets up a model of config cfg built as `opt` says without allocating any of its buffers: its
 * settings, its layout and the sizes of its tables (llama_state_table, llama_acts_table,
 * llama_small_table), which the memory plan sums. Free with llama_free.
 */
static inline void llama_configure(Llama* m, const LlamaConfig* cfg, const ModelOptions* opt) {
    memset(m, 0, sizeof(*m));
    m->cfg = *cfg;
    m->opt = *opt;
    const Sharding* sh = &opt->sharding;
    GradFormat g = opt->formats.grad_buffer;
    if (g != GRAD_FORMAT_FP32 && (sh->zero_stage == 2 || (sh->zero_stage == 0 && sh->world > 1)))
        die("--grad-buffer %s: needs -z 1, or -z 0 on one rank (ZeRO-2 keeps no full buffer; -z 0 on %d ranks would store the "
            "reduced gradient again, use -z 1)", grad_format_name(g), sh->world);
    size_t L = (size_t)cfg->n_layers;
    m->bf16_block = (char*)callocCheck(L, 1);
    if (opt->bf16_blocks) memcpy(m->bf16_block, opt->bf16_blocks, L);
    m->opt.bf16_blocks = m->bf16_block;
    fp8_state_init(&m->fp8, &opt->fp8, opt->precision == PRECISION_FP8, L * LIN_PER_LAYER);
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
 * Allocates every buffer of a model of config cfg built as `opt` says and prints the memory tables (per
 * rank). The weights are undefined until llama_set_params or the trainer loads them.
 */
static inline void llama_build(Llama* m, const LlamaConfig* cfg, const ModelOptions* opt) {
    llama_configure(m, cfg, opt);
    size_t P = m->num_params, full = m->layout.full, shard = m->layout.shard;
    const Sharding* sh = &m->opt.sharding;
    printf("| parameters: %zu (%.2f M); %d rank(s), ZeRO-%d: this rank holds %zu of %zu elements (%.1f%%)\n", P, P / 1e6,
           sh->world, sh->zero_stage, shard, full, 100.0 * (double)shard / (double)full);

    BufferSpec state[NUM_STATE_BUFFERS], acts[NUM_ACT_BUFFERS], small[NUM_SMALL_BUFFERS];
    int nstate = llama_state_table(m, state), nacts = llama_acts_table(m, acts), nsmall = llama_small_table(m, small);
    m->state_memory = llama_alloc_table(STATE_TABLE_TITLE, state, nstate);
    m->acts_memory = llama_alloc_table(ACTS_TABLE_TITLE, acts, nacts);
    m->acts_bytes = buffers_bytes(acts, nacts);
    m->small_memory = llama_alloc_table(SMALL_TABLE_TITLE, small, nsmall);
    m->fp8_operand = (uint8_t*)m->acts.logits;
    m->fp8_operand_t = m->fp8_operand + llama_fp8_operand_bytes(m) / 2;
    if (llama_has_bf16_linears(m)) m->bf16_scratch = (act_t*)dev_alloc(m->bf16_scratch_elems * sizeof(act_t));
    /* the act buffers that byte-counting ops (dev_zero, all-gathers) see, for the op record (core/op_record.h) */
    op_record_mark_act(m->weights, m->working_elems, sizeof(act_t));
    op_record_mark_act(m->bf16_scratch, m->bf16_scratch_elems, sizeof(act_t));
    op_record_mark_act(m->acts.d_resid, (size_t)m->opt.B * m->opt.T * cfg->dim, sizeof(act_t));
    /* fp8 moments start as zeros with scale_inv 1 (what a chunk's first update decodes, and a valid state);
       so do an fp16 master's chunks that hold no element of this rank (padding) */
    const StateFormats* f = &m->opt.formats;
    size_t scales[2] = {adamw_scale_count(f->optim_state, shard), store_scale_count(master_codec(f->master_weights), shard)};
    float* targets[2] = {m->adam_scale_inv, m->master_scale_inv};
    for (int k = 0; k < 2; k++) {
        if (scales[k] == 0) continue;
        float* ones = (float*)mallocCheck(scales[k] * sizeof(float));
        for (size_t j = 0; j < scales[k]; j++) ones[j] = 1.0f;
        dev_upload(targets[k], ones, scales[k] * sizeof(float));
        free(ones);
    }
    llama_place_params(m);
    m->fp8_wt_pending = (char*)callocCheck((size_t)cfg->n_layers, 1);
    llama_modes_changed(m);

    int T = m->opt.T;
    size_t half = (size_t)llama_head_dim(cfg) / 2;
    float* cos_host = (float*)mallocCheck((size_t)T * half * sizeof(float));
    float* sin_host = (float*)mallocCheck((size_t)T * half * sizeof(float));
    rope_tables(T, llama_head_dim(cfg), cfg->rope_theta, cos_host, sin_host);
    dev_upload(m->rope_cos, cos_host, (size_t)T * half * sizeof(float));
    dev_upload(m->rope_sin, sin_host, (size_t)T * half * sizeof(float));
    free(cos_host);
    free(sin_host);
    m->losses_host = (float*)mallocCheck((size_t)m->opt.B * T * sizeof(float));
}

/* Frees a model of llama_build, or the layout of llama_configure. */
static inline void llama_free(Llama* m) {
    if (m->state_memory) dev_free(m->state_memory);
    if (m->acts_memory) dev_free(m->acts_memory);
    if (m->bf16_scratch) dev_free(m->bf16_scratch);
    if (m->small_memory) dev_free(m->small_memory);
    fp8_state_free(&m->fp8);
    free(m->layers);
    free(m->fp8_wt_pending);
    free(m->bf16_block);
    free(m->losses_host);
    free(m->segs);
    memset(m, 0, sizeof(*m));
}

/* ---------------------------------------------------------------- weights from the master weights */

/* A piece of n elements of a row-major tensor as (rows, cols) for a cast that writes no transpose: whole
   ZERO_CHUNK-element rows when it has them (a segment's last piece may not), so the GPU's tiles are full. */
static inline void llama_piece_shape(size_t n, size_t* rows, size_t* cols) {
    int whole = n > 0 && n % ZERO_CHUNK == 0;
    *rows = whole ? n / ZERO_CHUNK : 1;
    *cols = whole ? ZERO_CHUNK : n;
}

/* The FP8 slot of an FP8 segment. */
static inline size_t llama_segment_slot(const ModelSegment* s) { return llama_slot(s->param.layer, s->linear); }

/* Casts this rank's pieces of the FP8 weights with the W records' amax: W and W^T when the rank holds
   every piece, else W's pieces (the layers' W^T then wait for the gather: llama_fp8_weights_gathered).
   Gathers no statistics: these are the next step's weights, which llama_fp8_stats_begin counts. */
static inline void llama_fp8_cast_weights(Llama* m) {
    fp8_clear_weight_flags(&m->fp8);
    for (int i = 0; i < m->num_segs; i++) {
        ModelSegment* s = &m->segs[i];
        if (!s->fp8) continue;
        size_t OC, C, rows, cols;
        llama_linear_dims(&m->cfg, (LinearId)s->linear, &OC, &C);
        const float* master = llama_master_piece(m, s, 1);
        if (m->layout.shards == 1) {
            fp8_cast_weight(&m->fp8, llama_segment_slot(s), llama_segment_fp8_w(m, s), llama_segment_fp8_wt(m, s), master, OC, C, 0);
            continue;
        }
        /* every rank casts, a rank without a piece an empty one: the cast sets the scale the GEMMs read */
        llama_piece_shape(s->own_count, &rows, &cols);
        fp8_cast_weight(&m->fp8, llama_segment_slot(s), llama_segment_fp8_w(m, s) + s->own_begin, NULL, master, rows, cols, 0);
        m->fp8_wt_pending[s->param.layer] = 1;
    }
}

/* After the all-gather of bucket b's FP8 weights has arrived (the data-parallel driver calls it): the
   layer's W^T copies, transposed from its whole W, when still to be made. */
static inline void llama_fp8_weights_gathered(Llama* m, int bucket) {
    int layer = bucket - 1;
    if (layer < 0 || layer >= m->cfg.n_layers || !m->fp8_wt_pending[layer]) return;
    for (int lin = 0; lin < LIN_PER_LAYER; lin++) {
        const Linear* x = &m->layers[layer].lin[lin];
        if (x->w8 != NULL) op_transpose_fp8(x->wt8, x->w8, x->out_dim, x->in_dim);
    }
    m->fp8_wt_pending[layer] = 0;
}

/*
 * Refreshes this rank's pieces of the working weights from its master weights (as FP32) and, for the FP8
 * weights, their amax (then, when the rank holds every piece, the casts: llama_fp8_cast_weights); the
 * driver reduces the amaxes, casts and all-gathers the rest under ZeRO-1/2.
 */
static inline void llama_refresh_working_weights(Llama* m) {
    fp8_reset_amaxes(&m->fp8, FP8_OP_W, 1);
    for (int i = 0; i < m->num_segs; i++) {
        ModelSegment* s = &m->segs[i];
        const float* master = llama_master_piece(m, s, 1);
        if (s->fp8) fp8_weight_amax(&m->fp8, llama_segment_slot(s), master, s->own_count);
        else if (s->own_count > 0) op_params_from_master(m->weights + s->weight_offset + s->own_begin, master, s->own_count);
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
        if (s->own_count == 0) continue;
        dev_upload(llama_master_piece(m, s, 0), params + s->param.param_offset + s->own_begin, s->own_count * sizeof(float));
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
    int z = m->opt.sharding.zero_stage;
    GradFormat f = m->opt.formats.grad_buffer;
    if (z == 2) die("llama_get_grads: ZeRO-2 keeps no full gradients");
    if (z == 1 && f != GRAD_FORMAT_FP32) die("llama_get_grads: under ZeRO-1 a bf16/fp8 gradient buffer does not hold the step's last micro-step");
    for (int i = 0; i < m->num_segs; i++) {
        ModelSegment* s = &m->segs[i];
        const float* g = (const float*)llama_grad_stored(m, s);
        if (f != GRAD_FORMAT_FP32) {
            float* out = llama_grad_bucket(m, s);
            op_store_load(grad_codec(f), out, llama_grad_stored(m, s), llama_grad_stored_scale_inv(m, s), s->param.count, 0);
            g = out;
        }
        dev_download(grads + s->param.param_offset, g, s->param.count * sizeof(float));
    }
}

/* ---------------------------------------------------------------- the FP8 step state, for the trainer */

/* Starts a step's record of non-finite FP8 activations and gradients (fp8_begin_step). Asynchronous. */
static inline void llama_fp8_begin_step(Llama* m) { fp8_begin_step(&m->fp8); }

/* Starts a step whose FP8 casts gather statistics: counters zeroed, and this rank's pieces of the FP8
   weights, cast at the last update, counted by casting them again without writing (the same codes). */
static inline void llama_fp8_stats_begin(Llama* m) {
    if (!m->fp8.on) return;
    fp8_stats_begin(&m->fp8);
    for (int i = 0; i < m->num_segs; i++) {
        ModelSegment* s = &m->segs[i];
        if (!s->fp8) continue;
        size_t rows, cols;
        llama_piece_shape(s->own_count, &rows, &cols);
        fp8_cast_weight(&m->fp8, llama_segment_slot(s), NULL, NULL, llama_master_piece(m, s, 1), rows, cols, 1);
    }
}

/* fp8_stats_end over the model's FP8 state (a sharded driver first sums the W counts: fp8_weight_counts). */
static inline void llama_fp8_stats_end(Llama* m, Fp8StatsEmit emit, void* ctx) { fp8_stats_end(&m->fp8, emit, ctx); }

/* Is a statistics step running (llama_fp8_stats_begin without its end yet)? */
static inline int llama_fp8_stats_due(const Llama* m) { return m->fp8.on && m->fp8.stats_due; }

/* fp8_nonfinite over the model's FP8 state: the first non-finite operand of a linear running FP8. */
static inline int llama_fp8_nonfinite(Llama* m, char* out, size_t len) { return fp8_nonfinite(&m->fp8, out, len); }

/* The delayed recipe's step amaxes of every X, then dY, record (FP8_DELAYED_OPS * slots, contiguous),
   which the driver MAX-all-reduces over the ranks; NULL unless delayed. */
static inline float* llama_fp8_step_amaxes(Llama* m) { return fp8_is_delayed(&m->fp8) ? m->fp8.step_amax : NULL; }

/* After an applied step whose linears ran FP8: the delayed recipe's histories and next scales. */
static inline void llama_fp8_delayed_push(Llama* m) {
    if (!m->mode.linears_bf16) fp8_delayed_push(&m->fp8);
}

/* The W records and W counts of every slot (the sharded driver reduces them). */
static inline Fp8Scale* llama_fp8_weight_scales(Llama* m) { return fp8_weight_records(&m->fp8); }
static inline Fp8Counts* llama_fp8_weight_counts(Llama* m) { return fp8_weight_counts(&m->fp8); }

/* The delayed recipe's training state: its bytes (0 unless delayed), a copy to the host, a restore with
   the count of steps its histories hold, and that count. */
static inline size_t llama_fp8_state_bytes(const Llama* m) { return fp8_state_bytes(&m->fp8); }
static inline void llama_fp8_state_download(Llama* m, void* host) { fp8_state_download(&m->fp8, host); }
static inline void llama_fp8_state_upload(Llama* m, const void* host, int history_steps) {
    fp8_state_upload(&m->fp8, host, history_steps);
}
static inline int llama_fp8_history_steps(const Llama* m) { return m->fp8.history_steps; }
