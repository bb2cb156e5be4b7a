/*
 * The Llama-2 model as both builds run it: the buffers (one allocation each for the weights and
 * optimizer state, the activations and the FP8 copies, laid out by tables and printed in MiB), the
 * linear layers with their FP8 recipe, the forward and backward passes as straight sequences of named
 * ops, the gradient norm and the AdamW update. This header is compiled twice: by gcc into
 * train_llama_cpu, after cpu/backend.h, and by nvcc into train_llama, after cuda/backend.cuh. The
 * backend defines `act_t` (float on the CPU, __nv_bfloat16 on the GPU) and the functions of the contract
 * llama/backend.h, which is all this file calls; pointers below are device pointers on the GPU.
 *
 * Model (HF LlamaForCausalLM): x = embed(tokens); per layer
 *   h = x + wo(attn(rope(wqkv(rmsnorm(x)))));  x = h + w2(silu(w1 rmsnorm(h)) * w3 rmsnorm(h));
 * logits = output(rmsnorm(x)). FP8 recipe (DESIGN.md section 3): the four linear layers of each block
 * (wqkv, wo, w13, w2) run FP8 GEMMs in -p fp8, the embedding, attention and output layer stay in the
 * activation type; N = B*T tokens; C, QKV = C + 2*KVC, F as in config.h.
 *
 * Data parallelism (DESIGN.md section 6). The parameter vector is held segment by segment (params.h) in
 * dist/zero.h's layouts: the working weights and full gradients in the padded full layout, the FP32
 * master weights, AdamW moments and reduced gradients in this rank's shard (all of it under ZeRO-0).
 * The model itself never communicates: around each bucket of segments (the embedding, each layer, the
 * final norm and output layer) it calls the hooks a data-parallel driver (train/data_parallel.h) sets,
 * before the forward reads the bucket's weights and before and after the backward writes its
 * gradients. Under ZeRO-2 the gradients of a bucket live in one of three reused bucket buffers only.
 */
#pragma once

#include <math.h>

#include "backend.h"
#include "config.h"
#include "optim.h"
#include "params.h"
#include "../core/buffers.h"
#include "../dist/zero.h"
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
    uint8_t* w;   /* (OC, C) E4M3 copy of W, made once per optimizer step: fprop's A operand */
    uint8_t* wt;  /* (C, OC) E4M3 copy of W^T from the same cast: dgrad's A operand */
    uint8_t* xt;  /* (C, N) E4M3 copy of X^T saved by fprop: wgrad's A operand */
} Fp8Linear;

typedef struct {
    act_t* resid;      /* (L+1, N, C) residual stream: resid[l] enters layer l, resid[L] enters the final norm */
    act_t* resid_mid;  /* (L, N, C) residual after the attention half of each layer */
    float* rstd_attn;  /* (L, N) 1 / rms of resid[l] */
    float* rstd_ffn;   /* (L, N) 1 / rms of resid_mid[l] */
    float* rstd_final; /* (N) */
    act_t* ln_attn;    /* (L, N, C), or (N, C) scratch when backward does not read it (FP8 keeps xt; BF16 linears of
                          -r 1 and of fp8 runs rebuild it in backward) */
    act_t* qkv;        /* (L, N, QKV) q, k after RoPE, v */
    act_t* att;        /* (L, N, C) attention output, before wo */
    float* att_stats;  /* (L, att_stats_size(B, NH, T)) what attention backward needs, backend-specific */
    act_t* ln_ffn;     /* (L, N, C) or (N, C) scratch, as ln_attn */
    act_t* fc;         /* (L, N, 2F) [w1 x, w3 x] */
    act_t* swiglu;     /* (L, N, F) or (N, F) scratch, as ln_attn */
    act_t* branch;     /* (N, C) scratch: output of wo or w2 before the residual add */
    act_t* ln_final;   /* (N, C) */
    act_t* logits;     /* (N, V), replaced by d(loss)/d(logits) when targets are given */
    float* losses;     /* (N) per-token cross-entropy */
    act_t* d_resid;    /* (N, C) gradient of the residual stream */
    act_t* d_ln;       /* (N, C) gradient of a norm's output */
    act_t* d_att;      /* (N, C) */
    act_t* d_qkv;      /* (N, QKV) */
    act_t* d_fc;       /* (N, 2F) */
    act_t* d_swiglu;   /* (N, F) */
    uint8_t* x8;       /* (N, max(C, F)) E4M3 X of the running fprop: its B operand (fp8 only) */
    uint8_t* xt8;      /* (L, N * (3 C + F)) E4M3 X^T of the four linear layers, saved for wgrad (fp8 only) */
    uint8_t* dy8;      /* (N, max(QKV, 2F, C)) E5M2 dY: dgrad's B operand (fp8 only) */
    uint8_t* dyt8;     /* (max(QKV, 2F, C), N) E5M2 dY^T: wgrad's B operand (fp8 only) */
} Acts;

/* How the parameters are spread over the data-parallel ranks (-z, DESIGN.md section 6). */
typedef struct {
    int world;      /* data-parallel ranks */
    int rank;       /* this one */
    int zero_stage; /* 0: everything everywhere; 1: optimizer state sharded; 2: gradients sharded too */
} Sharding;

/* Buckets: the embedding (0), each layer (1 + layer), the final norm with the output layer (L + 1). */
#define BUCKET_EMBEDDING 0
static inline int bucket_of_layer(int layer) { return 1 + layer; }

/* The three ZeRO-2 gradient buffers: two for alternating layers, one for the embedding and the head. */
enum { GRAD_BUFFER_EVEN, GRAD_BUFFER_ODD, GRAD_BUFFER_OTHER, GRAD_BUFFERS };

/* A parameter segment with its place in the layouts of this run. */
typedef struct {
    ParamSegment param;   /* tensor, layer, checkpoint offset, count */
    ShardSegment shard;   /* full / shard / chunk layouts (dist/zero.h) */
    int bucket;           /* the bucket it belongs to */
    int grad_buffer;      /* ZeRO-2: the gradient buffer of its bucket */
    size_t buffer_offset; /* ZeRO-2: its offset there */
} ModelSegment;

/* Called by the model around each bucket (see the banner); any may be NULL. */
typedef struct {
    void* ctx;
    void (*weights_needed)(void* ctx, int bucket); /* before the forward first reads the bucket's weights */
    void (*grads_needed)(void* ctx, int bucket);   /* before the backward first writes its gradients */
    void (*grads_ready)(void* ctx, int bucket);    /* after the backward last writes them */
} ModelHooks;

typedef struct {
    LlamaConfig cfg;
    Precision precision;
    int pow2_scales;           /* round FP8 scales down to powers of two */
    int recompute;             /* -r 1: norm and SwiGLU outputs are recomputed in backward */
    int B, T;                  /* the largest micro-batch the buffers hold */
    Sharding sharding;
    int shard_index;           /* the shard this rank holds: its rank, or 0 under ZeRO-0 */
    size_t num_params;         /* P, in checkpoint order */
    ModelSegment* segs;        /* (num_segs) in checkpoint order */
    int num_segs;
    int seg_base[NUM_PARAM_TENSORS]; /* index of each tensor's first segment */
    ShardLayout layout;
    size_t grad_buffer_elems[GRAD_BUFFERS]; /* ZeRO-2 */
    void* state_memory;        /* one allocation: the buffers below */
    act_t* weights;            /* (layout.full) working weights (BF16 on the GPU) */
    float* master;             /* (layout.shard) FP32 master weights of this rank's shard */
    float* adam_m;             /* (layout.shard) AdamW first moment */
    float* adam_v;             /* (layout.shard) AdamW second moment */
    float* grads;              /* (layout.full) FP32 gradients, accumulated over micro-steps (ZeRO-0/1) */
    float* grad_buffer[GRAD_BUFFERS]; /* ZeRO-2: the gradient buffers */
    float* grad_shard;         /* (layout.shard) reduced gradients of this rank's shard (ZeRO-1/2) */
    double* norm_partials;     /* (layout.chunks) sums of squares of the reduced gradient per chunk */
    ModelHooks hooks;
    void* acts_memory;
    Acts acts;
    size_t acts_bytes;
    uint8_t* fp8_weights;      /* E4M3 W and W^T of every linear layer (fp8 only) */
    Fp8Linear* fp8_linear;     /* (L * LIN_PER_LAYER) host array of device pointers */
    Fp8Scale* fp8_scales;      /* (L * LIN_PER_LAYER * FP8_OPS) device */
    Fp8Counts* fp8_counts;     /* (L * LIN_PER_LAYER * FP8_OPS) device */
    char* fp8_layer_valid;     /* (L) host: the layer's FP8 weight copies match its working weights */
    char* bf16_block;          /* (L) host: the block runs its linears in BF16 in -p fp8 (--bf16-layers) */
    int linears_bf16;          /* every block linear runs BF16 for now (the shadow check, the fallback policy) */
    int fp8_stats_due;         /* this step's casts gather Fp8Counts */
    float* rope_cos;           /* (T, HS/2) */
    float* rope_sin;           /* (T, HS/2) */
    int* inputs;               /* (B, T) device copy of the micro-batch's tokens */
    int* targets;              /* (B, T) */
    const int* inputs_host;    /* the host tokens of the last forward */
    float* losses_host;        /* (B*T) */
    int last_B, last_T;        /* shape of the last forward */
} Llama;

/* One process, everything on it: the sharding of tests and single-rank runs. */
static const Sharding SINGLE_PROCESS = {1, 0, 0};

/* Activation buffers (the fields of Acts): the size of the table llama_acts_table fills. */
#define NUM_ACT_BUFFERS (sizeof(Acts) / sizeof(void*))

static inline size_t llama_slot(int layer, int lin) { return (size_t)layer * LIN_PER_LAYER + lin; }
static inline Fp8Scale* fp8_scale(Llama* m, size_t slot, int op) { return &m->fp8_scales[slot * FP8_OPS + op]; }
static inline Fp8Counts* fp8_counts(Llama* m, size_t slot, int op) {
    return m->fp8_stats_due ? &m->fp8_counts[slot * FP8_OPS + op] : NULL;
}

/* Does backward read the BF16 inputs of the linear layers (ln_attn, ln_ffn, swiglu) from memory? */
static inline int llama_keeps_linear_inputs(const Llama* m) { return m->precision != PRECISION_FP8 && !m->recompute; }

/* Activation buffers for micro-batch (B, T). */
static inline int llama_acts_table(Llama* m, BufferSpec* s) {
    const LlamaConfig* c = &m->cfg;
    size_t N = (size_t)m->B * m->T, C = (size_t)c->dim, L = (size_t)c->n_layers, F = (size_t)c->ffn_dim;
    size_t QKV = (size_t)llama_qkv_dim(c), V = (size_t)c->vocab_size;
    size_t keep = llama_keeps_linear_inputs(m) ? L : 1;
    int fp8 = m->precision == PRECISION_FP8;
    size_t dmax = QKV > 2 * F ? QKV : 2 * F;
    size_t a = sizeof(act_t), f = sizeof(float);
    Acts* x = &m->acts;
    int n = 0;
#define SPEC(field, count, elem) s[n++] = (BufferSpec){#field, (void**)&x->field, (count), (elem)}
    SPEC(resid, (L + 1) * N * C, a);
    SPEC(resid_mid, L * N * C, a);
    SPEC(rstd_attn, L * N, f);
    SPEC(rstd_ffn, L * N, f);
    SPEC(rstd_final, N, f);
    SPEC(ln_attn, keep * N * C, a);
    SPEC(qkv, L * N * QKV, a);
    SPEC(att, L * N * C, a);
    SPEC(att_stats, L * att_stats_size((size_t)m->B, c->n_heads, m->T), f);
    SPEC(ln_ffn, keep * N * C, a);
    SPEC(fc, L * N * 2 * F, a);
    SPEC(swiglu, keep * N * F, a);
    SPEC(branch, N * C, a);
    SPEC(ln_final, N * C, a);
    SPEC(logits, N * V, a);
    SPEC(losses, N, f);
    SPEC(d_resid, N * C, a);
    SPEC(d_ln, N * C, a);
    SPEC(d_att, N * C, a);
    SPEC(d_qkv, N * QKV, a);
    SPEC(d_fc, N * 2 * F, a);
    SPEC(d_swiglu, N * F, a);
    SPEC(x8, fp8 ? N * (C > F ? C : F) : 0, 1);
    SPEC(xt8, fp8 ? L * N * (3 * C + F) : 0, 1);
    SPEC(dy8, fp8 ? N * (dmax > C ? dmax : C) : 0, 1);
    SPEC(dyt8, fp8 ? N * (dmax > C ? dmax : C) : 0, 1);
#undef SPEC
    if ((size_t)n != NUM_ACT_BUFFERS) die("activation table has %d buffers, Acts has %zu fields", n, NUM_ACT_BUFFERS);
    return n;
}

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

/*
 * Cuts the parameters into segments and places them: the full and shard layouts for the sharding, the
 * buckets, and under ZeRO-2 the segments' places in their gradient buffers.
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
    /* ZeRO-2: a bucket's segments back to back in its buffer, each with its padding (the reduce-scatter
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
    free(params);
    free(shards);
}

/* The elements [*begin, *begin + *count) of segment s that this rank holds (segment-local). */
static inline void llama_own_piece(const Llama* m, const ModelSegment* s, size_t* begin, size_t* count) {
    zero_piece(&s->shard, m->shard_index, begin, count);
}

/* The working weights of (tensor, layer). */
static inline act_t* llama_param(Llama* m, int tensor, int layer) {
    return m->weights + llama_segment(m, tensor, layer)->shard.offset;
}

/* Where the backward writes the gradient of (tensor, layer): the full gradients, or (ZeRO-2) a bucket buffer. */
static inline float* llama_grad(Llama* m, int tensor, int layer) {
    ModelSegment* s = llama_segment(m, tensor, layer);
    if (m->sharding.zero_stage == 2) return m->grad_buffer[s->grad_buffer] + s->buffer_offset;
    return m->grads + s->shard.offset;
}

/* The reduced gradient of this rank's shard, in shard layout: the full gradients under ZeRO-0 (one shard). */
static inline float* llama_reduced_grads(Llama* m) { return m->sharding.zero_stage == 0 ? m->grads : m->grad_shard; }

/* ---------------------------------------------------------------- buffers */

/*
 * Allocates every buffer of a model for micro-batches up to (B, T) under `sharding` and prints the
 * memory table (per rank). The weights are undefined until llama_set_params or the trainer loads them.
 */
static inline void llama_build(Llama* m, const LlamaConfig* cfg, Precision precision, int B, int T, int pow2_scales,
                               int recompute, Sharding sharding) {
    memset(m, 0, sizeof(*m));
    m->cfg = *cfg;
    m->precision = precision;
    m->pow2_scales = pow2_scales;
    m->recompute = recompute;
    m->B = B;
    m->T = T;
    m->sharding = sharding;
    m->num_params = param_count(cfg);
    llama_layout(m);
    size_t P = m->num_params, L = (size_t)cfg->n_layers, full = m->layout.full, shard = m->layout.shard;
    int z = sharding.zero_stage;
    printf("| parameters: %zu (%.2f M); %d rank(s), ZeRO-%d: this rank holds %zu of %zu elements (%.1f%%)\n", P, P / 1e6,
           sharding.world, z, shard, full, 100.0 * (double)shard / (double)full);

    BufferSpec state[] = {
        {"weights", (void**)&m->weights, full, sizeof(act_t)},
        {"master", (void**)&m->master, shard, sizeof(float)},
        {"adam_m", (void**)&m->adam_m, shard, sizeof(float)},
        {"adam_v", (void**)&m->adam_v, shard, sizeof(float)},
        {"grads", (void**)&m->grads, z < 2 ? full : 0, sizeof(float)},
        {"grad_bucket_0", (void**)&m->grad_buffer[GRAD_BUFFER_EVEN], z == 2 ? m->grad_buffer_elems[GRAD_BUFFER_EVEN] : 0, sizeof(float)},
        {"grad_bucket_1", (void**)&m->grad_buffer[GRAD_BUFFER_ODD], z == 2 ? m->grad_buffer_elems[GRAD_BUFFER_ODD] : 0, sizeof(float)},
        {"grad_bucket_2", (void**)&m->grad_buffer[GRAD_BUFFER_OTHER], z == 2 ? m->grad_buffer_elems[GRAD_BUFFER_OTHER] : 0, sizeof(float)},
        {"grad_shard", (void**)&m->grad_shard, z > 0 ? shard : 0, sizeof(float)},
        {"norm_partials", (void**)&m->norm_partials, m->layout.chunks, sizeof(double)},
    };
    int nstate = (int)(sizeof(state) / sizeof(state[0]));
    buffers_print("weights, gradients and optimizer state", state, nstate); /* first: an out-of-memory stop follows its sizes */
    size_t state_bytes = buffers_bytes(state, nstate);
    m->state_memory = dev_alloc(state_bytes);
    /* zeroed: padding and the parts of other ranks' pieces must hold finite values (collectives read them) */
    dev_zero(m->state_memory, state_bytes);
    buffers_point(state, nstate, m->state_memory);

    BufferSpec acts[NUM_ACT_BUFFERS];
    int nacts = llama_acts_table(m, acts);
    m->acts_bytes = buffers_bytes(acts, nacts);
    buffers_print("activations", acts, nacts);
    m->acts_memory = dev_alloc(m->acts_bytes);
    buffers_point(acts, nacts, m->acts_memory);

    size_t nslots = L * LIN_PER_LAYER;
    m->fp8_linear = (Fp8Linear*)callocCheck(nslots, sizeof(Fp8Linear));
    m->fp8_layer_valid = (char*)callocCheck(L, 1);
    m->bf16_block = (char*)callocCheck(L, 1);
    m->fp8_scales = (Fp8Scale*)dev_alloc(nslots * FP8_OPS * sizeof(Fp8Scale));
    m->fp8_counts = (Fp8Counts*)dev_alloc(nslots * FP8_OPS * sizeof(Fp8Counts));
    dev_zero(m->fp8_scales, nslots * FP8_OPS * sizeof(Fp8Scale));
    dev_zero(m->fp8_counts, nslots * FP8_OPS * sizeof(Fp8Counts));
    if (precision == PRECISION_FP8) {
        size_t per_layer = 0;
        for (int lin = 0; lin < LIN_PER_LAYER; lin++) {
            size_t OC, C;
            llama_linear_dims(cfg, (LinearId)lin, &OC, &C);
            per_layer += 2 * OC * C;
        }
        printf("| FP8 weight copies (W and W^T): %.1f MiB\n", mib(L * per_layer));
        /* a block may run BF16 in this run (--bf16-layers, the shadow check, the fallback policy): its
           linears' BF16 inputs are rebuilt in backward, not kept */
        printf("| BF16 linears of an fp8 run: their inputs (ln_attn, ln_ffn, swiglu) are recomputed in backward: 0 MiB\n");
        m->fp8_weights = (uint8_t*)dev_alloc(L * per_layer);
        uint8_t* w = m->fp8_weights;
        size_t N = (size_t)B * T;
        uint8_t* xt = m->acts.xt8;
        for (size_t l = 0; l < L; l++) {
            for (int lin = 0; lin < LIN_PER_LAYER; lin++) {
                Fp8Linear* f = &m->fp8_linear[llama_slot((int)l, lin)];
                size_t OC, C;
                llama_linear_dims(cfg, (LinearId)lin, &OC, &C);
                f->w = w;
                f->wt = w + OC * C;
                w += 2 * OC * C;
                f->xt = xt;
                xt += C * N;
            }
        }
    }

    size_t half = (size_t)llama_head_dim(cfg) / 2;
    float* cos_host = (float*)mallocCheck((size_t)T * half * sizeof(float));
    float* sin_host = (float*)mallocCheck((size_t)T * half * sizeof(float));
    rope_tables(T, llama_head_dim(cfg), cfg->rope_theta, cos_host, sin_host);
    m->rope_cos = (float*)dev_alloc((size_t)T * half * sizeof(float));
    m->rope_sin = (float*)dev_alloc((size_t)T * half * sizeof(float));
    dev_upload(m->rope_cos, cos_host, (size_t)T * half * sizeof(float));
    dev_upload(m->rope_sin, sin_host, (size_t)T * half * sizeof(float));
    free(cos_host);
    free(sin_host);
    m->inputs = (int*)dev_alloc((size_t)B * T * sizeof(int));
    m->targets = (int*)dev_alloc((size_t)B * T * sizeof(int));
    m->losses_host = (float*)mallocCheck((size_t)B * T * sizeof(float));
}

static inline void llama_free(Llama* m) {
    dev_free(m->state_memory);
    dev_free(m->acts_memory);
    dev_free(m->fp8_weights);
    dev_free(m->fp8_scales);
    dev_free(m->fp8_counts);
    dev_free(m->rope_cos);
    dev_free(m->rope_sin);
    dev_free(m->inputs);
    dev_free(m->targets);
    free(m->fp8_linear);
    free(m->fp8_layer_valid);
    free(m->bf16_block);
    free(m->losses_host);
    free(m->segs);
    memset(m, 0, sizeof(*m));
}

/*
 * Refreshes this rank's pieces of the working weights from its FP32 master weights (the other pieces
 * arrive by all-gather under ZeRO-1/2); the FP8 copies follow lazily, layer by layer.
 */
static inline void llama_refresh_working_weights(Llama* m) {
    for (int i = 0; i < m->num_segs; i++) {
        ModelSegment* s = &m->segs[i];
        size_t b, n;
        llama_own_piece(m, s, &b, &n);
        if (n > 0) op_params_from_master(m->weights + s->shard.offset + b, m->master + s->shard.shard_offset, n);
    }
    memset(m->fp8_layer_valid, 0, (size_t)m->cfg.n_layers);
}

/* Loads this rank's pieces of host FP32 parameters (param_count elements, checkpoint order) as master
   weights and working weights. */
static inline void llama_set_params(Llama* m, const float* params) {
    for (int i = 0; i < m->num_segs; i++) {
        ModelSegment* s = &m->segs[i];
        size_t b, n;
        llama_own_piece(m, s, &b, &n);
        if (n > 0) dev_upload(m->master + s->shard.shard_offset, params + s->param.param_offset + b, n * sizeof(float));
    }
    llama_refresh_working_weights(m);
}

/* Copies the FP32 master weights to the host (param_count elements, checkpoint order); one shard only. */
static inline void llama_get_params(Llama* m, float* params) {
    if (m->layout.shards != 1) die("llama_get_params: the master weights are sharded over %d ranks", m->layout.shards);
    for (int i = 0; i < m->num_segs; i++) {
        ModelSegment* s = &m->segs[i];
        dev_download(params + s->param.param_offset, m->master + s->shard.shard_offset, s->param.count * sizeof(float));
    }
}

/* Copies the gradients the backward accumulated to the host (param_count elements, checkpoint order);
   ZeRO-0/1 only (ZeRO-2 keeps no full gradients). */
static inline void llama_get_grads(Llama* m, float* grads) {
    if (m->sharding.zero_stage == 2) die("llama_get_grads: ZeRO-2 keeps no full gradients");
    for (int i = 0; i < m->num_segs; i++) {
        ModelSegment* s = &m->segs[i];
        dev_download(grads + s->param.param_offset, m->grads + s->shard.offset, s->param.count * sizeof(float));
    }
}

/* ---------------------------------------------------------------- hooks */

/* Before the forward reads bucket b's weights: the driver's hook, then the FP8 copies of a layer bucket. */
static inline void llama_weights_needed(Llama* m, int bucket);

static inline void llama_grads_needed(Llama* m, int bucket) {
    if (m->hooks.grads_needed) m->hooks.grads_needed(m->hooks.ctx, bucket);
}

static inline void llama_grads_ready(Llama* m, int bucket) {
    if (m->hooks.grads_ready) m->hooks.grads_ready(m->hooks.ctx, bucket);
}

/* A linear layer as its GEMMs see it: y (N, OC) = x (N, C) weight^T. */
typedef struct {
    act_t* weight;  /* (OC, C) working weight */
    float* dweight; /* (OC, C) FP32 gradient */
    size_t in_dim;  /* C */
    size_t out_dim; /* OC */
    Fp8Linear* fp8; /* its FP8 buffers when it runs FP8 GEMMs, else NULL */
    size_t slot;    /* index of its FP8 scales and counts (fp8 only) */
} Linear;

/*
 * Does linear layer `lin` of block `layer` run FP8 GEMMs? The block linears of a -p fp8 run do, but for
 * the blocks --bf16-layers keeps in BF16 and while linears_bf16 is set (the shadow check's BF16 run,
 * the fallback policy); the output layer never does. The one place that decides.
 */
static inline int llama_linear_is_fp8(const Llama* m, int layer, LinearId lin) {
    if (m->precision != PRECISION_FP8 || lin == LIN_OUTPUT || m->linears_bf16) return 0;
    return !m->bf16_block[layer];
}

/* Linear layer `lin` of block `layer` (NO_LAYER for LIN_OUTPUT). */
static inline Linear llama_linear(Llama* m, int layer, LinearId lin) {
    Linear x;
    memset(&x, 0, sizeof(x));
    llama_linear_dims(&m->cfg, lin, &x.out_dim, &x.in_dim);
    static const int tensors[] = {P_WQKV, P_WO, P_W13, P_W2, P_OUTPUT};
    x.weight = llama_param(m, tensors[lin], layer);
    x.dweight = llama_grad(m, tensors[lin], layer);
    if (lin == LIN_OUTPUT) return x;
    x.slot = llama_slot(layer, lin);
    if (llama_linear_is_fp8(m, layer, lin)) x.fp8 = &m->fp8_linear[x.slot];
    return x;
}

/*
 * The BF16 weight (OC, C) of linear layer `lin` of block `layer` (NO_LAYER for LIN_OUTPUT), for the
 * GEMMs of a linear that does not run FP8 now. Provided by issue 10 (lean FP8 memory); keep this
 * signature.
 */
static inline const act_t* llama_bf16_weight(Llama* m, int layer, LinearId lin) { return llama_linear(m, layer, lin).weight; }

/* Sets the blocks that run their linears in BF16 in -p fp8 (--bf16-layers): blocks (L), non-zero = BF16. */
static inline void llama_set_bf16_blocks(Llama* m, const char* blocks) {
    memcpy(m->bf16_block, blocks, (size_t)m->cfg.n_layers);
    memset(m->fp8_layer_valid, 0, (size_t)m->cfg.n_layers);
}

/* Tokens of the last forward's micro-batch: the N of every GEMM. */
static inline size_t llama_tokens(const Llama* m) { return (size_t)m->last_B * m->last_T; }

/*
 * Casts the FP8 linear weights of one layer to E4M3, each with its own current scale, writing W and W^T
 * in one pass (DESIGN.md: once per optimizer step, reused by every micro-batch, bytes and scale always
 * in step), unless the copies already match the working weights.
 */
static inline void llama_fp8_refresh_layer(Llama* m, int layer) {
    if (m->precision != PRECISION_FP8 || m->fp8_layer_valid[layer]) return;
    int cast = 0;
    for (int lin = 0; lin < LIN_PER_LAYER; lin++) {
        Linear x = llama_linear(m, layer, (LinearId)lin);
        if (x.fp8 == NULL) continue;
        Fp8Scale* s = fp8_scale(m, x.slot, FP8_OP_W);
        op_amax(s, x.weight, x.out_dim * x.in_dim);
        op_cast_transpose(x.fp8->w, x.fp8->wt, x.weight, x.out_dim, x.in_dim, FP8_E4M3, s, m->pow2_scales,
                          fp8_counts(m, x.slot, FP8_OP_W));
        cast = 1;
    }
    /* a block running BF16 now casts nothing: its copies stay stale until it next runs FP8 */
    m->fp8_layer_valid[layer] = (char)cast;
}

static inline void llama_weights_needed(Llama* m, int bucket) {
    if (m->hooks.weights_needed) m->hooks.weights_needed(m->hooks.ctx, bucket);
    if (bucket > BUCKET_EMBEDDING && bucket <= m->cfg.n_layers) llama_fp8_refresh_layer(m, bucket - 1);
}

/*
 * fprop of linear layer `lin` of block `layer`: out (N, OC) = inp (N, C) W^T, N = the forward's B*T.
 * An FP8 layer casts inp to E4M3 with its just-in-time scale, keeping the X^T copy for wgrad, and runs
 * E4M3 x E4M3 with fast accumulation; any other layer runs a GEMM in the activation type.
 */
static inline void linear_forward(Llama* m, int layer, LinearId lin, act_t* out, const act_t* inp) {
    Linear x = llama_linear(m, layer, lin);
    size_t N = llama_tokens(m), C = x.in_dim, OC = x.out_dim;
    if (x.fp8 == NULL) {
        GemmCall g = gemm_fprop(out, DT_ACT, gemm_operand(llama_bf16_weight(m, layer, lin), DT_ACT), gemm_operand(inp, DT_ACT),
                                N, C, OC);
        op_gemm(&g);
        return;
    }
    Fp8Scale* sw = fp8_scale(m, x.slot, FP8_OP_W);
    Fp8Scale* sx = fp8_scale(m, x.slot, FP8_OP_X);
    op_amax(sx, inp, N * C);
    op_cast_transpose(m->acts.x8, x.fp8->xt, inp, N, C, FP8_E4M3, sx, m->pow2_scales, fp8_counts(m, x.slot, FP8_OP_X));
    GemmCall g = gemm_fprop(out, DT_ACT, gemm_operand_fp8(x.fp8->w, DT_E4M3, &sw->scale_inv),
                            gemm_operand_fp8(m->acts.x8, DT_E4M3, &sx->scale_inv), N, C, OC);
    op_gemm(&g);
}

/*
 * dgrad and wgrad of linear layer `lin` of block `layer`: dinp (N, C) = dout (N, OC) W and
 * dW (OC, C) FP32 += dout^T inp. An FP8 layer casts dout to E5M2 (and dout^T) with its just-in-time
 * scale; dgrad multiplies the E4M3 W^T copy, wgrad the E4M3 X^T saved by fprop (inp is not read); fast
 * accumulation is off for both (TE's default for the backward GEMMs). Otherwise GEMMs in the activation
 * type.
 */
static inline void linear_backward(Llama* m, int layer, LinearId lin, act_t* dinp, const act_t* dout, const act_t* inp) {
    Linear x = llama_linear(m, layer, lin);
    size_t N = llama_tokens(m), C = x.in_dim, OC = x.out_dim;
    if (x.fp8 == NULL) {
        GemmCall dgrad = gemm_dgrad(dinp, DT_ACT, gemm_operand(llama_bf16_weight(m, layer, lin), DT_ACT),
                                    gemm_operand(dout, DT_ACT), N, C, OC);
        op_gemm(&dgrad);
        GemmCall wgrad = gemm_wgrad(x.dweight, gemm_operand(inp, DT_ACT), gemm_operand(dout, DT_ACT), N, C, OC);
        op_gemm(&wgrad);
        return;
    }
    Fp8Scale* sw = fp8_scale(m, x.slot, FP8_OP_W);
    Fp8Scale* sx = fp8_scale(m, x.slot, FP8_OP_X);
    Fp8Scale* sdy = fp8_scale(m, x.slot, FP8_OP_DY);
    op_amax(sdy, dout, N * OC);
    op_cast_transpose(m->acts.dy8, m->acts.dyt8, dout, N, OC, FP8_E5M2, sdy, m->pow2_scales,
                      fp8_counts(m, x.slot, FP8_OP_DY));
    GemmCall dgrad = gemm_dgrad(dinp, DT_ACT, gemm_operand_fp8(x.fp8->wt, DT_E4M3, &sw->scale_inv),
                                gemm_operand_fp8(m->acts.dy8, DT_E5M2, &sdy->scale_inv), N, C, OC);
    op_gemm(&dgrad);
    GemmCall wgrad = gemm_wgrad(x.dweight, gemm_operand_fp8(x.fp8->xt, DT_E4M3, &sx->scale_inv),
                                gemm_operand_fp8(m->acts.dyt8, DT_E5M2, &sdy->scale_inv), N, C, OC);
    op_gemm(&wgrad);
}


/* Pointer to layer l's slice of a per-layer activation buffer of `per` elements per layer. */
#define LAYER(buf, l, per) ((buf) + (size_t)(l) * (per))
/* Slice of a buffer that is per-layer when `keep`, else one shared scratch slice. */
#define KEPT(buf, l, per, keep) ((buf) + ((keep) ? (size_t)(l) * (per) : 0))

/*
 * Forward pass on a micro-batch of (B, T) tokens, B <= m->B, T <= m->T. inputs, targets: host (B, T)
 * int arrays; targets may be NULL (logits only, e.g. for sampling). With targets, returns the mean
 * cross-entropy and leaves dloss * d(loss_i)/d(logits) in acts.logits for backward (dloss: the
 * weight of one token's loss in the step's objective, 1 / (B*T*grad_accum_steps*ranks)); without,
 * returns 0. Calls the weights_needed hook for each bucket before its weights are first read.
 */
static inline float llama_forward(Llama* m, const int* inputs, const int* targets, int B, int T, float dloss) {
    const LlamaConfig* c = &m->cfg;
    if (B > m->B || T > m->T) die("forward on (B %d, T %d) exceeds the allocated (%d, %d)", B, T, m->B, m->T);
    size_t N = (size_t)B * T;
    int C = c->dim, L = c->n_layers, NH = c->n_heads, NKV = c->n_kv_heads, HS = llama_head_dim(c);
    int F = c->ffn_dim, V = c->vocab_size, QKV = llama_qkv_dim(c);
    int keep = llama_keeps_linear_inputs(m);
    size_t NC = N * C, NF = N * F, stats_per = att_stats_size((size_t)m->B, NH, m->T);
    Acts* a = &m->acts;
    m->last_B = B;
    m->last_T = T;
    m->inputs_host = inputs;
    dev_upload(m->inputs, inputs, N * sizeof(int));

    llama_weights_needed(m, BUCKET_EMBEDDING);
    op_encoder_forward(a->resid, m->inputs, llama_param(m, P_TOK_EMBEDDINGS, 0), N, C);          /* (N, C) */
    llama_weights_needed(m, bucket_of_layer(0));
    op_rmsnorm_forward(a->ln_attn, a->rstd_attn, a->resid, llama_param(m, P_ATTN_NORM, 0), N, C, c->norm_eps); /* (N, C) */
    for (int l = 0; l < L; l++) {
        act_t* x = LAYER(a->resid, l, NC);               /* (N, C) layer input */
        act_t* ln_attn = KEPT(a->ln_attn, l, NC, keep);  /* (N, C) */
        act_t* qkv = LAYER(a->qkv, l, N * QKV);          /* (N, QKV) */
        act_t* att = LAYER(a->att, l, NC);               /* (N, C) */
        float* stats = LAYER(a->att_stats, l, stats_per);
        act_t* mid = LAYER(a->resid_mid, l, NC);         /* (N, C) */
        act_t* ln_ffn = KEPT(a->ln_ffn, l, NC, keep);    /* (N, C) */
        act_t* fc = LAYER(a->fc, l, 2 * NF);             /* (N, 2F) */
        act_t* sw = KEPT(a->swiglu, l, NF, keep);        /* (N, F) */
        act_t* next = LAYER(a->resid, l + 1, NC);        /* (N, C) next layer's input */
        int last = l == L - 1;
        act_t* next_ln = last ? a->ln_final : KEPT(a->ln_attn, l + 1, NC, keep);
        float* next_rstd = last ? a->rstd_final : LAYER(a->rstd_attn, l + 1, N);

        linear_forward(m, l, LIN_QKV, qkv, ln_attn);
        op_rope_forward(qkv, m->rope_cos, m->rope_sin, B, T, NH, NKV, HS);
        op_attention_forward(att, stats, qkv, B, T, NH, NKV, HS);
        linear_forward(m, l, LIN_WO, a->branch, att);
        op_residual_rmsnorm_forward(mid, ln_ffn, LAYER(a->rstd_ffn, l, N), x, a->branch, llama_param(m, P_FFN_NORM, l), N,
                                    C, c->norm_eps);
        linear_forward(m, l, LIN_W13, fc, ln_ffn);
        op_swiglu_forward(sw, fc, N, F);
        linear_forward(m, l, LIN_W2, a->branch, sw);
        /* the next norm's weight is the next bucket's: the next layer's attn_norm, or the final norm */
        llama_weights_needed(m, bucket_of_layer(l + 1));
        const act_t* next_norm = last ? llama_param(m, P_NORM, 0) : llama_param(m, P_ATTN_NORM, l + 1);
        op_residual_rmsnorm_forward(next, next_ln, next_rstd, mid, a->branch, next_norm, N, C, c->norm_eps);
    }
    linear_forward(m, NO_LAYER, LIN_OUTPUT, a->logits, a->ln_final);                              /* (N, V) */
    if (targets == NULL) return 0.0f;
    dev_upload(m->targets, targets, N * sizeof(int));
    op_classifier(a->logits, a->losses, m->targets, N, V, dloss);
    dev_download(m->losses_host, a->losses, N * sizeof(float));
    double sum = 0.0;
    for (size_t i = 0; i < N; i++) sum += m->losses_host[i];
    return (float)(sum / (double)N);
}

/*
 * Backward pass of the last llama_forward (which must have had targets): accumulates d(loss)/d(param)
 * into the gradients (FP32, += so that micro-steps add up; llama_zero_grads starts a step; under ZeRO-2
 * the grads_needed hook hands out a zeroed bucket buffer instead). Every accumulation is
 * grad = grad + (this micro-step's contribution, summed on its own), so accumulating micro-steps on one
 * rank adds in the order a rank-ordered reduction over ranks would (dist/comm.h, Determinism). Calls the
 * grads_needed / grads_ready hooks around each bucket, in backward order (head, layers L-1..0, embedding).
 */
static inline void llama_backward(Llama* m) {
    const LlamaConfig* c = &m->cfg;
    int B = m->last_B, T = m->last_T;
    size_t N = (size_t)B * T;
    int C = c->dim, L = c->n_layers, NH = c->n_heads, NKV = c->n_kv_heads, HS = llama_head_dim(c);
    int F = c->ffn_dim, QKV = llama_qkv_dim(c);
    int keep = llama_keeps_linear_inputs(m);
    size_t NC = N * C, NF = N * F, stats_per = att_stats_size((size_t)m->B, NH, m->T);
    Acts* a = &m->acts;
    int head = llama_num_buckets(m) - 1;

    dev_zero(a->d_resid, NC * sizeof(act_t));
    llama_grads_needed(m, head);
    linear_backward(m, NO_LAYER, LIN_OUTPUT, a->d_ln, a->logits, a->ln_final);                   /* (N, C) */
    op_rmsnorm_backward(a->d_resid, llama_grad(m, P_NORM, 0), a->d_ln, LAYER(a->resid, L, NC), llama_param(m, P_NORM, 0),
                        a->rstd_final, N, C);
    llama_grads_ready(m, head);
    for (int l = L - 1; l >= 0; l--) {
        act_t* x = LAYER(a->resid, l, NC);
        act_t* ln_attn = KEPT(a->ln_attn, l, NC, keep);
        act_t* qkv = LAYER(a->qkv, l, N * QKV);
        act_t* att = LAYER(a->att, l, NC);
        float* stats = LAYER(a->att_stats, l, stats_per);
        act_t* mid = LAYER(a->resid_mid, l, NC);
        act_t* ln_ffn = KEPT(a->ln_ffn, l, NC, keep);
        act_t* fc = LAYER(a->fc, l, 2 * NF);
        act_t* sw = KEPT(a->swiglu, l, NF, keep);
        float* rstd_attn = LAYER(a->rstd_attn, l, N);
        float* rstd_ffn = LAYER(a->rstd_ffn, l, N);
        const act_t* attn_norm = llama_param(m, P_ATTN_NORM, l);
        const act_t* ffn_norm = llama_param(m, P_FFN_NORM, l);

        /* a BF16 linear whose input was not kept (-r 1; any BF16 linear of an fp8 run) gets it rebuilt
           with the forward's kernels, same bytes; an FP8 linear reads the X^T copy its fprop saved */
        int rebuild_ffn = !keep && !llama_linear_is_fp8(m, l, LIN_W13);
        int rebuild_sw = !keep && !llama_linear_is_fp8(m, l, LIN_W2);
        int rebuild_attn = !keep && !llama_linear_is_fp8(m, l, LIN_QKV);
        if (rebuild_ffn) op_rmsnorm_forward(ln_ffn, rstd_ffn, mid, ffn_norm, N, C, c->norm_eps);
        if (rebuild_sw) op_swiglu_forward(sw, fc, N, F);
        llama_grads_needed(m, bucket_of_layer(l));
        linear_backward(m, l, LIN_W2, a->d_swiglu, a->d_resid, sw);                               /* (N, F) */
        op_swiglu_backward(a->d_fc, a->d_swiglu, fc, N, F);                                       /* (N, 2F) */
        linear_backward(m, l, LIN_W13, a->d_ln, a->d_fc, ln_ffn);                                 /* (N, C) */
        op_rmsnorm_backward(a->d_resid, llama_grad(m, P_FFN_NORM, l), a->d_ln, mid, ffn_norm, rstd_ffn, N, C);
        linear_backward(m, l, LIN_WO, a->d_att, a->d_resid, att);                                 /* (N, C) */
        op_attention_backward(a->d_qkv, a->d_att, qkv, att, stats, B, T, NH, NKV, HS);            /* (N, QKV) */
        op_rope_backward(a->d_qkv, m->rope_cos, m->rope_sin, B, T, NH, NKV, HS);
        if (rebuild_attn) op_rmsnorm_forward(ln_attn, rstd_attn, x, attn_norm, N, C, c->norm_eps);
        linear_backward(m, l, LIN_QKV, a->d_ln, a->d_qkv, ln_attn);                               /* (N, C) */
        op_rmsnorm_backward(a->d_resid, llama_grad(m, P_ATTN_NORM, l), a->d_ln, x, attn_norm, rstd_attn, N, C);
        llama_grads_ready(m, bucket_of_layer(l));
    }
    llama_grads_needed(m, BUCKET_EMBEDDING);
    op_encoder_backward(llama_grad(m, P_TOK_EMBEDDINGS, 0), a->d_resid, m->inputs, m->inputs_host, N, C);
    llama_grads_ready(m, BUCKET_EMBEDDING);
}


/* Starts a step: zeroes the gradients the micro-steps accumulate into (ZeRO-0/1; under ZeRO-2 the
   data-parallel driver zeroes its reduced-gradient shard and each bucket buffer before use). */
static inline void llama_zero_grads(Llama* m) {
    if (m->grads) dev_zero(m->grads, m->layout.full * sizeof(float));
}

/*
 * Fills norm_partials with the sums of squares of the reduced gradient, one per ZERO_CHUNK-element chunk
 * of every segment, for the chunks of this rank's pieces and zero for all others: summed over ranks
 * (comm_all_reduce_f64, exact since each chunk has one owner) they are the same for any rank count.
 */
static inline void llama_grad_norm_partials(Llama* m) {
    const float* g = llama_reduced_grads(m);
    dev_zero(m->norm_partials, m->layout.chunks * sizeof(double));
    for (int i = 0; i < m->num_segs; i++) {
        ModelSegment* s = &m->segs[i];
        size_t b, n;
        llama_own_piece(m, s, &b, &n);
        if (n > 0) op_sum_squares_chunks(m->norm_partials + s->shard.chunk_offset + b / ZERO_CHUNK, g + s->shard.shard_offset, n, ZERO_CHUNK);
    }
}

/*
 * Global L2 norm of the gradient from the (rank-summed) norm_partials, summed in chunk order. When it is
 * not finite, *bad is the index of the first segment with a non-finite chunk, else -1.
 */
static inline float llama_grad_norm_total(Llama* m, int* bad) {
    double total = op_sum_f64(m->norm_partials, m->layout.chunks);
    *bad = -1;
    if (!isfinite(total)) {
        double* partials = (double*)mallocCheck(m->layout.chunks * sizeof(double));
        dev_download(partials, m->norm_partials, m->layout.chunks * sizeof(double));
        for (int i = 0; i < m->num_segs && *bad < 0; i++) {
            const ShardSegment* s = &m->segs[i].shard;
            for (size_t k = 0; k < zero_chunks(s->count); k++) {
                if (!isfinite(partials[s->chunk_offset + k])) {
                    *bad = i;
                    break;
                }
            }
        }
        free(partials);
    }
    return (float)sqrt(total);
}

/* The gradient norm of a model held by one rank (no communication): partials, then their sum. */
static inline float llama_grad_norm(Llama* m, int* bad) {
    if (m->layout.shards != 1) die("llama_grad_norm: the gradients are sharded; sum the partials over the ranks");
    llama_grad_norm_partials(m);
    return llama_grad_norm_total(m, bad);
}

/* "wqkv[layer 3]" style name of segment `index`. */
static inline void llama_segment_name(const Llama* m, int index, char* out, size_t len) {
    param_segment_name(&m->segs[index].param, out, len);
}

/*
 * One AdamW step (t = step + 1) on this rank's pieces of the master weights: gradients (the reduced
 * ones) multiplied by grad_scale (clipping), weight decay on 2-D weights only; then this rank's pieces
 * of the working weights are refreshed (the driver all-gathers the rest under ZeRO-1/2).
 */
static inline void llama_update(Llama* m, float lr, float weight_decay, int step, float grad_scale) {
    float t = (float)(step + 1);
    float bc1 = 1.0f - powf(ADAMW_BETA1, t);
    float bc2_sqrt = sqrtf(1.0f - powf(ADAMW_BETA2, t));
    const float* g = llama_reduced_grads(m);
    for (int i = 0; i < m->num_segs; i++) {
        ModelSegment* s = &m->segs[i];
        size_t b, n, o = s->shard.shard_offset;
        llama_own_piece(m, s, &b, &n);
        if (n == 0) continue;
        float wd = param_is_decayed(s->param.tensor) ? weight_decay : 0.0f;
        op_adamw(m->master + o, m->adam_m + o, m->adam_v + o, g + o, n, lr, wd, bc1, bc2_sqrt, grad_scale);
    }
    llama_refresh_working_weights(m);
}

/* Is FP8 slot `slot` (layer * LIN_PER_LAYER + lin) a linear that runs FP8 now? Only those have current scales. */
static inline int llama_slot_is_fp8(const Llama* m, size_t slot) {
    return llama_linear_is_fp8(m, (int)(slot / LIN_PER_LAYER), (LinearId)(slot % LIN_PER_LAYER));
}

/* Returns the first operand of a linear running FP8 whose amax is not finite, as "w13[layer 2] dY", or 0
   when all are. */
static inline int llama_fp8_nonfinite(Llama* m, char* out, size_t len) {
    if (m->precision != PRECISION_FP8) return 0;
    size_t n = (size_t)m->cfg.n_layers * LIN_PER_LAYER * FP8_OPS;
    Fp8Scale* s = (Fp8Scale*)mallocCheck(n * sizeof(Fp8Scale));
    dev_download(s, m->fp8_scales, n * sizeof(Fp8Scale));
    int found = 0;
    for (size_t i = 0; i < n && !found; i++) {
        if (llama_slot_is_fp8(m, i / FP8_OPS) && !fp8_amax_is_finite(s[i].amax)) {
            size_t slot = i / FP8_OPS;
            snprintf(out, len, "%s[layer %zu] %s", LINEAR_NAMES[slot % LIN_PER_LAYER], slot / LIN_PER_LAYER,
                     FP8_OPERAND_NAMES[i % FP8_OPS]);
            found = 1;
        }
    }
    free(s);
    return found;
}

/* Starts a step whose FP8 casts gather statistics: counters zeroed, weights recast to count them too. */
static inline void llama_fp8_stats_begin(Llama* m) {
    if (m->precision != PRECISION_FP8) return;
    dev_zero(m->fp8_counts, (size_t)m->cfg.n_layers * LIN_PER_LAYER * FP8_OPS * sizeof(Fp8Counts));
    m->fp8_stats_due = 1;
    memset(m->fp8_layer_valid, 0, (size_t)m->cfg.n_layers);
}

/* The statistics of one FP8 operand over a statistics step (llama_fp8_stats_end). */
typedef struct {
    int layer;
    LinearId lin;
    int op;                /* FP8_OP_W, FP8_OP_X or FP8_OP_DY */
    const char* gemm;      /* LINEAR_NAMES[lin] */
    const char* operand;   /* FP8_OPERAND_NAMES[op] */
    const char* format;    /* "E4M3" or "E5M2" */
    float amax, scale;     /* of the operand's last cast in the step */
    double saturated_frac; /* codes at +-max */
    double underflow_frac; /* non-zero inputs cast to 0 */
} Fp8OperandStats;

typedef void (*Fp8StatsEmit)(void* ctx, const Fp8OperandStats* stats);

/* Ends a statistics step: calls `emit` for every operand of the linears that ran FP8 in it. */
static inline void llama_fp8_stats_end(Llama* m, Fp8StatsEmit emit, void* ctx) {
    if (m->precision != PRECISION_FP8 || !m->fp8_stats_due) return;
    m->fp8_stats_due = 0;
    size_t n = (size_t)m->cfg.n_layers * LIN_PER_LAYER * FP8_OPS;
    Fp8Scale* s = (Fp8Scale*)mallocCheck(n * sizeof(Fp8Scale));
    Fp8Counts* k = (Fp8Counts*)mallocCheck(n * sizeof(Fp8Counts));
    dev_download(s, m->fp8_scales, n * sizeof(Fp8Scale));
    dev_download(k, m->fp8_counts, n * sizeof(Fp8Counts));
    for (size_t i = 0; i < n; i++) {
        size_t slot = i / FP8_OPS;
        if (!llama_slot_is_fp8(m, slot)) continue;
        Fp8OperandStats o;
        o.layer = (int)(slot / LIN_PER_LAYER);
        o.lin = (LinearId)(slot % LIN_PER_LAYER);
        o.op = (int)(i % FP8_OPS);
        o.gemm = LINEAR_NAMES[o.lin];
        o.operand = FP8_OPERAND_NAMES[o.op];
        o.format = o.op == FP8_OP_DY ? "E5M2" : "E4M3";
        o.amax = s[i].amax;
        o.scale = s[i].scale;
        o.saturated_frac = k[i].count ? (double)k[i].saturated / (double)k[i].count : 0.0;
        o.underflow_frac = k[i].nonzero ? (double)k[i].underflow / (double)k[i].nonzero : 0.0;
        emit(ctx, &o);
    }
    free(s);
    free(k);
}

/* Copies row `row` (0-based, < last B*T) of the last forward's logits to the host as floats (V). */
static inline void llama_logits_row(Llama* m, size_t row, float* out) {
    act_to_float_host(out, m->acts.logits + row * (size_t)m->cfg.vocab_size, (size_t)m->cfg.vocab_size);
}
