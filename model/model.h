/*
 * The Llama-2 model as both builds run it, over the buffers of memory.h (the Llama struct, its tables,
 * layouts and FP8 weight copies): the linear layers with their FP8 recipe, the forward and backward
 * passes as straight sequences of named ops, the gradient norm and the AdamW update. This header is compiled twice: by gcc into
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
 * comm/zero.h's layouts: the working weights and full gradients in the padded full layout, the master
 * weights (FP32, or fp16 with --master-weights), AdamW moments and reduced gradients in this rank's shard
 * (all of it under ZeRO-0).
 * The model itself never communicates: around each bucket of segments (the embedding, each layer, the
 * final norm and output layer) it calls the hooks a data-parallel driver (train/data_parallel.h) sets,
 * before the forward reads the bucket's weights and before and after the backward writes its
 * gradients. Under ZeRO-2, and with a bf16/fp8 --grad-buffer, the backward writes a bucket's gradients to
 * one of three reused FP32 bucket buffers.
 */
#pragma once

#include <math.h>

#include "memory.h"

/* ---------------------------------------------------------------- hooks */

/* Before the forward reads bucket b's weights: the driver's hook, then the FP8 copies of a layer bucket. */
static inline void llama_weights_needed(Llama* m, int bucket);

static inline void llama_grads_needed(Llama* m, int bucket) {
    if (m->hooks.grads_needed) m->hooks.grads_needed(m->hooks.ctx, bucket);
    else if (llama_grads_bucketed(m))
        die("llama_backward: the bucket buffers of ZeRO-2 or a bf16/fp8 --grad-buffer need the data-parallel driver's hooks");
}

static inline void llama_grads_ready(Llama* m, int bucket) {
    if (m->hooks.grads_ready) m->hooks.grads_ready(m->hooks.ctx, bucket);
}

/* A linear layer as its GEMMs see it: y (N, OC) = x (N, C) weight^T. */
typedef struct {
    float* dweight; /* (OC, C) FP32 gradient */
    size_t in_dim;  /* C */
    size_t out_dim; /* OC */
    Fp8Linear* fp8; /* its FP8 buffers when it runs FP8 GEMMs, else NULL */
    size_t slot;    /* index of its FP8 scales and counts (fp8 only) */
} Linear;

/*
 * Does linear layer `lin` of block `layer` run FP8 GEMMs now? The block linears of a -p fp8 run do, but
 * for the blocks --bf16-layers keeps in BF16 and while linears_bf16 is set (the shadow check's BF16 run,
 * the fallback policy); the output layer never does. The one place that decides. A block linear running
 * BF16 reads llama_bf16_weight (rebuilt from the master weights) and has its input rebuilt in backward.
 */
static inline int llama_linear_is_fp8(const Llama* m, int layer, LinearId lin) {
    if (m->precision != PRECISION_FP8 || lin == LIN_OUTPUT || m->linears_bf16) return 0;
    return !m->bf16_block[layer];
}

/* Must backward rebuild the input of linear `lin` of block `layer` (keep: llama_keeps_linear_inputs)?
   Yes where the run keeps neither it nor an X^T copy of it: -r 1, and a BF16 linear of an fp8 run;
   never under -r 2, whose replay has just rebuilt the whole block. */
static inline int llama_rebuilds_input(const Llama* m, int layer, LinearId lin, int keep) {
    if (keep || m->recompute == RECOMPUTE_BLOCKS) return 0;
    return m->recompute == RECOMPUTE_NORMS || !llama_linear_is_fp8(m, layer, lin);
}

/*
 * The BF16 (activation type) weight (OC, C) of linear layer `lin` of block `layer` (NO_LAYER for
 * LIN_OUTPUT), for any consumer outside the layer's own GEMMs (a BF16 shadow forward, a BF16 fallback of
 * an FP8 layer): the one way to read it, whether or not the layer keeps a working copy. Read-only.
 * A layer with a working copy returns it (no cost; valid until the next update). An FP8 layer has none:
 * the BF16 rounding of its master weights is rebuilt into bf16_scratch (the largest FP8 weight, padded;
 * Llama-2 7B: w13, 172 MiB; in the memory plan of a run whose flags can run a block linear in BF16,
 * --bf16-layers or --shadow-every, which reserves it at start-up; else allocated on the first call) and, under
 * ZeRO-1/2, all-gathered through the all_gather hook (2 bytes per element over the wire, waited for: a
 * sharded run pays a blocking gather per call). Every rank must then call it, in the same order. Valid
 * until the next call.
 */
static inline void llama_reserve_bf16_weight(Llama* m);
static inline const act_t* llama_bf16_weight(Llama* m, int layer, LinearId lin) {
    ModelSegment* s = llama_segment(m, llama_linear_tensor(lin), layer);
    if (!s->fp8) return m->weights + s->weight_offset;
    llama_reserve_bf16_weight(m);
    size_t b, n;
    llama_own_piece(m, s, &b, &n);
    if (n > 0) op_params_from_master(m->bf16_scratch + b, llama_master_piece(m, s, 1), n);
    if (m->layout.shards > 1) {
        if (m->hooks.all_gather == NULL) die("llama_bf16_weight: a sharded model needs the data-parallel driver's all_gather hook");
        m->hooks.all_gather(m->hooks.ctx, m->bf16_scratch, s->shard.piece * sizeof(act_t));
    }
    return m->bf16_scratch;
}

/* Allocates llama_bf16_weight's scratch now: the trainer does so at start-up when its flags can run a
   block linear in BF16, so that no step allocates it. */
static inline void llama_reserve_bf16_weight(Llama* m) {
    if (m->bf16_scratch == NULL) m->bf16_scratch = (act_t*)dev_alloc(m->bf16_scratch_elems * sizeof(act_t));
}

/* Linear layer `lin` of block `layer` (NO_LAYER for LIN_OUTPUT). */
static inline Linear llama_linear(Llama* m, int layer, LinearId lin) {
    Linear x;
    memset(&x, 0, sizeof(x));
    llama_linear_dims(&m->cfg, lin, &x.out_dim, &x.in_dim);
    x.dweight = llama_grad(m, llama_linear_tensor(lin), layer);
    if (lin != LIN_OUTPUT) x.slot = llama_slot(layer, lin);
    /* a linear running BF16 reads llama_bf16_weight */
    if (lin != LIN_OUTPUT && llama_linear_is_fp8(m, layer, lin)) x.fp8 = &m->fp8_linear[x.slot];
    return x;
}

/* Sets the blocks that run their linears in BF16 in -p fp8 (--bf16-layers): blocks (L), non-zero = BF16. */
static inline void llama_set_bf16_blocks(Llama* m, const char* blocks) {
    memcpy(m->bf16_block, blocks, (size_t)m->cfg.n_layers);
}

/* Tokens of the last forward's micro-batch: the N of every GEMM. */
static inline size_t llama_tokens(const Llama* m) { return (size_t)m->last_B * m->last_T; }

static inline void llama_weights_needed(Llama* m, int bucket) {
    if (m->hooks.weights_needed) m->hooks.weights_needed(m->hooks.ctx, bucket);
    if (bucket > BUCKET_EMBEDDING && bucket <= m->cfg.n_layers) llama_fp8_finish_layer(m, bucket - 1);
}

/*
 * Where the forward's producer of linear `lin`'s input computes its amax as it writes it (a fused amax,
 * llama/backend.h): the X scale record of block `layer`'s linear when it runs FP8 and its input comes from
 * an RMSNorm (wqkv, w13) or the SwiGLU (w2), so that linear_forward needs no separate op_amax read; NULL
 * for every other linear, during a replay (which keeps the forward's scale), and with unfused_amax. The
 * producers' calls in the forward pass it; calls that rebuild an input in backward pass NULL.
 */
static inline Fp8Scale* llama_fused_x_amax(Llama* m, int layer, LinearId lin) {
    if (lin == LIN_WO || lin == LIN_OUTPUT || m->replaying || m->unfused_amax || !llama_linear_is_fp8(m, layer, lin)) return NULL;
    if (llama_fp8_scales_delayed(m)) return NULL; /* the delayed cast records the amax itself */
    return fp8_scale(m, llama_slot(layer, lin), FP8_OP_X);
}

/*
 * Delayed scaling (--fp8-recipe delayed, fp8/fp8.h Fp8Recipe), after Transformer Engine's DelayedScaling:
 *   - every X and dY cast of a step uses the scale its record holds, computed after the last applied
 *     step from the record's amax history, and records the tensor's amax as it casts
 *     (op_cast_transpose_delayed): no amax read before the cast, which is the recipe's point;
 *   - the step's entry of a record is the max of those amaxes over the step's micro-batches, then over
 *     the ranks (the driver MAX-all-reduces fp8_step_amax, every record in one collective); TE records
 *     one entry per forward call, i.e. per micro-batch, which would make the history depend on how the
 *     global batch is split, and llm8 gives the same run on any rank count;
 *   - after an applied step every record gets its entry and its next scale (llama_fp8_delayed_push,
 *     fp8.h fp8_delayed_update); a skipped step (a non-finite amax, loss or gradient) and a BF16 step
 *     (the shadow check's fallback) add nothing;
 *   - the first step, with an empty history, is current-scaled (its amaxes are recorded as they are
 *     computed), so it equals the current recipe's first step; TE starts from scale 1 instead, its
 *     buffers' initial value, which would flush most of a first step's E5M2 gradients to zero;
 *   - the weights keep current scaling: they are cast once per optimizer step from the master weights,
 *     whose amax (MAX-all-reduced over the shards, DESIGN.md section 6) costs one read per step, not one
 *     per micro-batch; TE keeps a history for them as well.
 * The history (a ring of --amax-history entries per record), its count and the X / dY records are
 * training state: checkpointed, identical on every rank, so a run resumes on any rank count.
 */

/*
 * The cast of an X or dY operand under the run's recipe into out and/or out_t: current scaling from
 * s->amax (computed before it), or the delayed recipe's (op_cast_transpose_delayed, recording into
 * `record`, which may be NULL). A delayed run's first step (record set, no history yet) is current-scaled:
 * an empty cast sets the scale from s->amax, then the delayed cast records the amax.
 */
static inline void llama_fp8_cast(Llama* m, uint8_t* out, uint8_t* out_t, const act_t* x, size_t rows, size_t cols, Fp8Format f,
                                  Fp8Scale* s, Fp8Counts* counts, float* record) {
    if (llama_fp8_scales_delayed(m)) {
        op_cast_transpose_delayed(out, out_t, x, rows, cols, f, s, counts, record);
    } else if (record == NULL) {
        op_cast_transpose(out, out_t, x, rows, cols, f, s, m->pow2_scales, counts);
    } else {
        op_cast_transpose(NULL, NULL, x, 0, cols, f, s, m->pow2_scales, NULL);
        op_cast_transpose_delayed(out, out_t, x, rows, cols, f, s, counts, record);
    }
}

/*
 * fprop of linear layer `lin` of block `layer`: out (N, OC) = inp (N, C) W^T, N = the forward's B*T.
 * An FP8 layer casts inp to E4M3 with its just-in-time scale (amax by the input's producer, fused, or
 * by op_amax here), keeping the X^T copy for wgrad when the run keeps it, and runs E4M3 x E4M3 with fast
 * accumulation unless --fp8-fast-accum 0 (and with the run's --fp8-accum, as the backward GEMMs); a
 * replay (-r 2) casts with the scale of the forward it repeats. Any other layer runs a GEMM in the
 * activation type.
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
    if (!m->replaying && !llama_fp8_scales_delayed(m) && llama_fused_x_amax(m, layer, lin) == NULL) op_amax(sx, inp, N * C);
    llama_fp8_cast(m, m->fp8_operand, x.fp8->xt, inp, N, C, FP8_E4M3, sx, fp8_counts(m, x.slot, FP8_OP_X),
                   fp8_step_amax(m, x.slot, FP8_OP_X));
    GemmCall g = gemm_fprop(out, DT_ACT, gemm_operand_fp8(x.fp8->w, DT_E4M3, &sw->scale_inv),
                            gemm_operand_fp8(m->fp8_operand, DT_E4M3, &sx->scale_inv), N, C, OC);
    g.fast_accum = m->fp8_fprop_fast_accum;
    g.accum = m->fp8_accum;
    op_gemm(&g);
}

/*
 * dgrad and wgrad of linear layer `lin` of block `layer`: dinp (N, C) = dout (N, OC) W and
 * dW (OC, C) FP32 += dout^T inp. An FP8 layer casts dout to E5M2 (and dout^T) with its just-in-time
 * scale; dgrad multiplies the E4M3 W^T copy, wgrad the E4M3 X^T saved by fprop or, when the run keeps
 * none, inp recast with fprop's scale (a replay of its cast: the same bytes, no statistics); fast
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
    if (!llama_fp8_scales_delayed(m)) op_amax(sdy, dout, N * OC);
    llama_fp8_cast(m, m->fp8_operand, m->fp8_operand_t, dout, N, OC, FP8_E5M2, sdy, fp8_counts(m, x.slot, FP8_OP_DY),
                   fp8_step_amax(m, x.slot, FP8_OP_DY));
    GemmCall dgrad = gemm_dgrad(dinp, DT_ACT, gemm_operand_fp8(x.fp8->wt, DT_E4M3, &sw->scale_inv),
                                gemm_operand_fp8(m->fp8_operand, DT_E5M2, &sdy->scale_inv), N, C, OC);
    dgrad.accum = m->fp8_accum;
    op_gemm(&dgrad);
    const uint8_t* xt = x.fp8->xt;
    if (xt == NULL) {
        /* into fp8_operand, which dgrad no longer needs; sx still holds fprop's amax and scale */
        llama_fp8_cast(m, NULL, m->fp8_operand, inp, N, C, FP8_E4M3, sx, NULL, NULL);
        xt = m->fp8_operand;
    }
    GemmCall wgrad = gemm_wgrad(x.dweight, gemm_operand_fp8(xt, DT_E4M3, &sx->scale_inv),
                                gemm_operand_fp8(m->fp8_operand_t, DT_E5M2, &sdy->scale_inv), N, C, OC);
    wgrad.accum = m->fp8_accum;
    op_gemm(&wgrad);
}


/* Pointer to layer l's slice of a per-layer activation buffer of `per` elements per layer. */
#define LAYER(buf, l, per) ((buf) + (size_t)(l) * (per))
/* Slice of a buffer that is per-layer when `keep`, else one shared scratch slice. */
#define KEPT(buf, l, per, keep) ((buf) + ((keep) ? (size_t)(l) * (per) : 0))

/* Layer l's slices of the activation buffers for the last forward's (B, T): its own, or the one shared
   slice of a buffer the run does not keep per layer (see Recompute). */
typedef struct {
    act_t* x;         /* (N, C) the block's input, resid[l] */
    act_t* ln_attn;   /* (N, C) */
    float* rstd_attn; /* (N) */
    act_t* qkv;       /* (N, QKV) */
    act_t* att;       /* (N, C) */
    float* stats;     /* att_stats_size(B, NH, T) of the allocated B, T */
    act_t* mid;       /* (N, C) */
    float* rstd_ffn;  /* (N) */
    act_t* ln_ffn;    /* (N, C) */
    act_t* fc;        /* (N, 2F) */
    act_t* sw;        /* (N, F) */
} BlockActs;

static inline BlockActs llama_block_acts(Llama* m, int l) {
    const LlamaConfig* c = &m->cfg;
    size_t N = llama_tokens(m), NC = N * (size_t)c->dim, NF = N * (size_t)c->ffn_dim;
    size_t stats_per = att_stats_size((size_t)m->B, c->n_heads, m->T);
    int keep = llama_keeps_linear_inputs(m), blocks = llama_keeps_blocks(m);
    Acts* a = &m->acts;
    BlockActs k;
    k.x = LAYER(a->resid, l, NC);
    k.ln_attn = KEPT(a->ln_attn, l, NC, keep);
    k.rstd_attn = KEPT(a->rstd_attn, l, N, blocks);
    k.qkv = KEPT(a->qkv, l, N * (size_t)llama_qkv_dim(c), blocks);
    k.att = KEPT(a->att, l, NC, blocks);
    k.stats = KEPT(a->att_stats, l, stats_per, blocks);
    k.mid = KEPT(a->resid_mid, l, NC, blocks);
    k.rstd_ffn = KEPT(a->rstd_ffn, l, N, blocks);
    k.ln_ffn = KEPT(a->ln_ffn, l, NC, keep);
    k.fc = KEPT(a->fc, l, 2 * NF, blocks);
    k.sw = KEPT(a->swiglu, l, NF, keep);
    return k;
}

/*
 * Block l of the forward from its attention norm's output (k->ln_attn) to its SwiGLU output (k->sw):
 * wqkv, RoPE, attention, wo, the residual add with the ffn norm, w13, SwiGLU. The forward runs it, then
 * w2 and the next norm; a replay (-r 2) runs it alone. Reads only weights the forward has already waited for.
 */
static inline void llama_block_forward(Llama* m, int l, const BlockActs* k) {
    const LlamaConfig* c = &m->cfg;
    int B = m->last_B, T = m->last_T, NH = c->n_heads, NKV = c->n_kv_heads, HS = llama_head_dim(c);
    size_t N = llama_tokens(m);
    linear_forward(m, l, LIN_QKV, k->qkv, k->ln_attn);                                          /* (N, QKV) */
    op_rope_forward(k->qkv, m->rope_cos, m->rope_sin, B, T, NH, NKV, HS);
    op_attention_forward(k->att, k->stats, k->qkv, B, T, NH, NKV, HS);                           /* (N, C) */
    linear_forward(m, l, LIN_WO, m->acts.branch, k->att);                                         /* (N, C) */
    op_residual_rmsnorm_forward(k->mid, k->ln_ffn, k->rstd_ffn, k->x, m->acts.branch, llama_param(m, P_FFN_NORM, l), N,
                                c->dim, c->norm_eps, llama_fused_x_amax(m, l, LIN_W13));          /* (N, C) */
    linear_forward(m, l, LIN_W13, k->fc, k->ln_ffn);                                              /* (N, 2F) */
    op_swiglu_forward(k->sw, k->fc, N, c->ffn_dim, llama_fused_x_amax(m, l, LIN_W2));             /* (N, F) */
}

/*
 * -r 2: rebuilds block l's activations in the shared slices from its kept input, by the ops of the
 * forward (its attention norm unfused: the same values) with the forward's FP8 scales (see Recompute).
 */
static inline void llama_replay_block(Llama* m, int l, const BlockActs* k) {
    const LlamaConfig* c = &m->cfg;
    op_rmsnorm_forward(k->ln_attn, k->rstd_attn, k->x, llama_param(m, P_ATTN_NORM, l), llama_tokens(m), c->dim, c->norm_eps,
                       NULL);
    m->replaying = 1;
    llama_block_forward(m, l, k);
    m->replaying = 0;
}

/*
 * The forward pass of llama_forward, up to the per-token losses in acts.losses (with targets); queues
 * its work and reads nothing back (the token uploads are asynchronous).
 */
static inline void llama_forward_pass(Llama* m, const int* inputs, const int* targets, int B, int T, float dloss) {
    const LlamaConfig* c = &m->cfg;
    if (B > m->B || T > m->T) die("forward on (B %d, T %d) exceeds the allocated (%d, %d)", B, T, m->B, m->T);
    size_t N = (size_t)B * T;
    int C = c->dim, L = c->n_layers, V = c->vocab_size;
    Acts* a = &m->acts;
    m->last_B = B;
    m->last_T = T;
    m->inputs_host = inputs;
    /* every X and dY amax of this forward and its backward zeroed at once (the ops then skip theirs) */
    if (m->precision == PRECISION_FP8 && !m->linears_bf16)
        op_fp8_reset_amax(fp8_scale(m, 0, FP8_OP_X), FP8_DELAYED_OPS * llama_fp8_slots(m));
    dev_upload_async(m->inputs, inputs, N * sizeof(int));
    if (targets != NULL) dev_upload_async(m->targets, targets, N * sizeof(int));

    llama_weights_needed(m, BUCKET_EMBEDDING);
    op_encoder_forward(a->resid, m->inputs, llama_param(m, P_TOK_EMBEDDINGS, 0), N, C);          /* (N, C) */
    llama_weights_needed(m, bucket_of_layer(0));
    op_rmsnorm_forward(a->ln_attn, a->rstd_attn, a->resid, llama_param(m, P_ATTN_NORM, 0), N, C, c->norm_eps,
                       llama_fused_x_amax(m, 0, LIN_QKV));                                        /* (N, C) */
    for (int l = 0; l < L; l++) {
        BlockActs k = llama_block_acts(m, l);
        int last = l == L - 1;
        BlockActs next = llama_block_acts(m, last ? l : l + 1);
        llama_block_forward(m, l, &k);
        linear_forward(m, l, LIN_W2, a->branch, k.sw);                                            /* (N, C) */
        /* the next norm's weight is the next bucket's: the next layer's attn_norm, or the final norm */
        llama_weights_needed(m, bucket_of_layer(l + 1));
        const act_t* next_norm = last ? llama_param(m, P_NORM, 0) : llama_param(m, P_ATTN_NORM, l + 1);
        op_residual_rmsnorm_forward(LAYER(a->resid, l + 1, N * C), last ? a->ln_final : next.ln_attn,
                                    last ? a->rstd_final : next.rstd_attn, k.mid, a->branch, next_norm, N, C, c->norm_eps,
                                    last ? NULL : llama_fused_x_amax(m, l + 1, LIN_QKV));
    }
    linear_forward(m, NO_LAYER, LIN_OUTPUT, a->logits, a->ln_final);                              /* (N, V) */
    if (targets != NULL) op_classifier(a->logits, a->losses, m->targets, N, V, dloss);
}

/*
 * Forward pass on a micro-batch of (B, T) tokens, B <= m->B, T <= m->T. inputs, targets: host (B, T)
 * int arrays; targets may be NULL (logits only, e.g. for sampling). With targets, returns the mean
 * cross-entropy and leaves dloss * d(loss_i)/d(logits) in acts.logits for backward (dloss: the
 * weight of one token's loss in the step's objective, 1 / (B*T*grad_accum_steps*ranks)); without,
 * returns 0. Calls the weights_needed hook for each bucket before its weights are first read. Waits for
 * the pass (it reads the losses); llama_forward_deferred does not.
 */
static inline float llama_forward(Llama* m, const int* inputs, const int* targets, int B, int T, float dloss) {
    llama_forward_pass(m, inputs, targets, B, T, dloss);
    if (targets == NULL) return 0.0f;
    size_t N = (size_t)B * T;
    dev_download(m->losses_host, m->acts.losses, N * sizeof(float));
    double sum = 0.0;
    for (size_t i = 0; i < N; i++) sum += m->losses_host[i];
    return (float)(sum / (double)N);
}

/*
 * llama_forward with targets (not NULL) that reads nothing back: *loss_sum (one FP64 in backend memory)
 * receives the sum of the B*T token losses, added in llama_forward's order, so (float)(*loss_sum / (B*T))
 * is the loss llama_forward returns, bit for bit. Asynchronous on the GPU: the micro-steps of a training
 * step queue their work without waiting.
 */
static inline void llama_forward_deferred(Llama* m, const int* inputs, const int* targets, int B, int T, float dloss,
                                          double* loss_sum) {
    if (targets == NULL) die("llama_forward_deferred needs targets");
    llama_forward_pass(m, inputs, targets, B, T, dloss);
    op_sum_f32_in_order(loss_sum, m->acts.losses, (size_t)B * T);
}

/*
 * Backward pass of the last llama_forward (which must have had targets): accumulates d(loss)/d(param)
 * into the gradients (+= so that micro-steps add up; llama_zero_grads starts a step). Under ZeRO-2 or a
 * bf16/fp8 --grad-buffer the backward writes FP32 bucket buffers that the grads_needed hook zeroes and
 * grads_ready reduces or stores (without hooks that is an error). Every accumulation is
 * grad = grad + (this micro-step's contribution, summed on its own), so accumulating micro-steps on one
 * rank adds in the order a rank-ordered reduction over ranks would (comm/comm.h, Determinism). Calls the
 * grads_needed / grads_ready hooks around each bucket, in backward order (head, layers L-1..0, embedding).
 * Rebuilds what the run does not keep (see Recompute).
 */
static inline void llama_backward(Llama* m) {
    const LlamaConfig* c = &m->cfg;
    int B = m->last_B, T = m->last_T;
    size_t N = (size_t)B * T;
    int C = c->dim, L = c->n_layers, NH = c->n_heads, NKV = c->n_kv_heads, HS = llama_head_dim(c);
    int F = c->ffn_dim;
    int keep = llama_keeps_linear_inputs(m);
    size_t NC = N * C;
    Acts* a = &m->acts;
    int head = llama_num_buckets(m) - 1;

    dev_zero(a->d_resid, NC * sizeof(act_t));
    llama_grads_needed(m, head);
    linear_backward(m, NO_LAYER, LIN_OUTPUT, a->d_ln, a->logits, a->ln_final);                   /* (N, C) */
    op_rmsnorm_backward(a->d_resid, llama_grad(m, P_NORM, 0), a->d_ln, LAYER(a->resid, L, NC), llama_param(m, P_NORM, 0),
                        a->rstd_final, N, C);
    llama_grads_ready(m, head);
    for (int l = L - 1; l >= 0; l--) {
        BlockActs k = llama_block_acts(m, l);
        const act_t* attn_norm = llama_param(m, P_ATTN_NORM, l);
        const act_t* ffn_norm = llama_param(m, P_FFN_NORM, l);

        if (!llama_keeps_blocks(m)) llama_replay_block(m, l, &k);
        /* the inputs of the linear layers that backward reads but the run did not keep (-r 1; a BF16 linear
           of an fp8 run, which has no X^T copy) are rebuilt with the forward's kernels: the same bytes */
        if (llama_rebuilds_input(m, l, LIN_W13, keep)) op_rmsnorm_forward(k.ln_ffn, k.rstd_ffn, k.mid, ffn_norm, N, C, c->norm_eps, NULL);
        if (llama_rebuilds_input(m, l, LIN_W2, keep)) op_swiglu_forward(k.sw, k.fc, N, F, NULL);
        llama_grads_needed(m, bucket_of_layer(l));
        linear_backward(m, l, LIN_W2, a->d_swiglu, a->d_resid, k.sw);                             /* (N, F) */
        op_swiglu_backward(a->d_fc, a->d_swiglu, k.fc, N, F);                                     /* (N, 2F) */
        linear_backward(m, l, LIN_W13, a->d_ln, a->d_fc, k.ln_ffn);                               /* (N, C) */
        op_rmsnorm_backward(a->d_resid, llama_grad(m, P_FFN_NORM, l), a->d_ln, k.mid, ffn_norm, k.rstd_ffn, N, C);
        linear_backward(m, l, LIN_WO, a->d_att, a->d_resid, k.att);                               /* (N, C) */
        op_attention_backward(a->d_qkv, a->d_att, k.qkv, k.att, k.stats, B, T, NH, NKV, HS);      /* (N, QKV) */
        op_rope_backward(a->d_qkv, m->rope_cos, m->rope_sin, B, T, NH, NKV, HS);
        if (llama_rebuilds_input(m, l, LIN_QKV, keep)) op_rmsnorm_forward(k.ln_attn, k.rstd_attn, k.x, attn_norm, N, C, c->norm_eps, NULL);
        linear_backward(m, l, LIN_QKV, a->d_ln, a->d_qkv, k.ln_attn);                             /* (N, C) */
        op_rmsnorm_backward(a->d_resid, llama_grad(m, P_ATTN_NORM, l), a->d_ln, k.x, attn_norm, k.rstd_attn, N, C);
        llama_grads_ready(m, bucket_of_layer(l));
    }
    llama_grads_needed(m, BUCKET_EMBEDDING);
    op_encoder_backward(llama_grad(m, P_TOK_EMBEDDINGS, 0), a->d_resid, m->inputs, m->inputs_host, N, C);
    llama_grads_ready(m, BUCKET_EMBEDDING);
}


/* Starts a step: zeroes the gradients the micro-steps accumulate into (ZeRO-0/1; under ZeRO-2 the
   data-parallel driver zeroes its reduced-gradient shard and each bucket buffer before use). */
static inline void llama_zero_grads(Llama* m) {
    if (m->grads) dev_zero(m->grads, m->layout.full * store_bytes(grad_codec(m->grad_format)));
    if (m->grad_scale_inv) dev_zero(m->grad_scale_inv, store_scale_count(grad_codec(m->grad_format), m->layout.full) * sizeof(float));
}

/*
 * Fills norm_partials with the sums of squares of the reduced gradient, one per ZERO_CHUNK-element chunk
 * of every segment, for the chunks of this rank's pieces and zero for all others: summed over ranks
 * (comm_all_reduce_f64, exact since each chunk has one owner) they are the same for any rank count.
 */
static inline void llama_grad_norm_partials(Llama* m) {
    dev_zero(m->norm_partials, m->layout.chunks * sizeof(double));
    for (int i = 0; i < m->num_segs; i++) {
        ModelSegment* s = &m->segs[i];
        size_t b, n;
        llama_own_piece(m, s, &b, &n);
        if (n > 0) op_sum_squares_chunks(m->norm_partials + s->shard.chunk_offset + b / ZERO_CHUNK, llama_reduced_grad(m, s), n, ZERO_CHUNK);
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

/* The storage formats of the model's state (--optim-state, --grad-buffer, --master-weights). */
static inline StateFormats llama_state_formats(const Llama* m) {
    StateFormats f = {m->optim_state, m->grad_format, m->master_format};
    return f;
}

/* This rank's AdamW moments (layout.shard elements, optim.h's AdamwMoments). */
static inline AdamwMoments llama_moments(const Llama* m) {
    AdamwMoments s = {m->optim_state, m->adam_m, m->adam_v, m->adam_scale_inv};
    return s;
}

/*
 * One AdamW step (t = step + 1) on this rank's pieces of the master weights: gradients (the reduced
 * ones) multiplied by grad_scale (clipping), weight decay on 2-D weights only; then this rank's pieces
 * of the working weights and FP8 weights are refreshed (llama_refresh_working_weights; the driver
 * finishes the FP8 casts and all-gathers the rest under ZeRO-1/2).
 */
static inline void llama_update(Llama* m, float lr, float weight_decay, int step, float grad_scale) {
    float t = (float)(step + 1);
    float bc1 = 1.0f - powf(ADAMW_BETA1, t);
    float bc2_sqrt = sqrtf(1.0f - powf(ADAMW_BETA2, t));
    for (int i = 0; i < m->num_segs; i++) {
        ModelSegment* s = &m->segs[i];
        size_t b, n, o = s->shard.shard_offset;
        llama_own_piece(m, s, &b, &n);
        if (n == 0) continue;
        float wd = param_is_decayed(s->param.tensor) ? weight_decay : 0.0f;
        op_adamw(llama_master_piece(m, s, 1), adamw_moments_at(llama_moments(m), o), llama_reduced_grad(m, s), n, lr, wd, bc1, bc2_sqrt,
                 grad_scale);
        llama_master_store(m, s);
    }
    llama_refresh_working_weights(m);
}

/* Is FP8 slot `slot` (layer * LIN_PER_LAYER + lin) a linear that runs FP8 now? Only those have current scales. */
static inline int llama_slot_is_fp8(const Llama* m, size_t slot) {
    return llama_linear_is_fp8(m, (int)(slot / LIN_PER_LAYER), (LinearId)(slot % LIN_PER_LAYER));
}

/*
 * Non-finite FP8 operands (DESIGN.md section 7) are recorded on the device, not checked per cast: every
 * cast sets its record's sticky nonfinite flag when its amax is not finite (fp8.h Fp8Scale). The W flags
 * are cleared when new weights are cast (llama_fp8_cast_weights), the X and dY flags by
 * llama_fp8_begin_step; llama_fp8_nonfinite reads them all once, after the step's last micro-step.
 */

/* Starts a step's record of non-finite FP8 activations and gradients: clears the X and dY flags of every
   slot (the weights' flags stay, they describe the weights this step uses). Asynchronous. */
static inline void llama_fp8_begin_step(Llama* m) {
    if (m->precision != PRECISION_FP8) return;
    /* operand-major records: the X rows, then the dY rows, contiguous */
    op_fp8_clear_nonfinite(fp8_scale(m, 0, FP8_OP_X), FP8_DELAYED_OPS * llama_fp8_slots(m));
    if (llama_fp8_is_delayed(m)) dev_zero(m->fp8_step_amax, FP8_DELAYED_OPS * llama_fp8_slots(m) * sizeof(float));
}

/* The delayed recipe's step amaxes of every X, then dY, record, contiguous (FP8_DELAYED_OPS slots of
   them), which the driver MAX-all-reduces over the ranks after the step's last micro-step; NULL unless
   delayed. */
static inline float* llama_fp8_step_amaxes(Llama* m) { return llama_fp8_is_delayed(m) ? m->fp8_step_amax : NULL; }

/* A host copy of llama_fp8_step_amaxes (the caller frees it), or NULL unless delayed. */
static inline float* llama_fp8_step_amaxes_host(Llama* m) {
    if (!llama_fp8_is_delayed(m)) return NULL;
    size_t bytes = FP8_DELAYED_OPS * llama_fp8_slots(m) * sizeof(float);
    float* host = (float*)mallocCheck(bytes);
    dev_download(host, m->fp8_step_amax, bytes);
    return host;
}

/*
 * After an applied step of a delayed run whose linears ran FP8: appends the step's amaxes (reduced over
 * the ranks) to the histories and sets every X and dY record's scale for the next step (see "Delayed
 * scaling"). Does nothing otherwise. Asynchronous.
 */
static inline void llama_fp8_delayed_push(Llama* m) {
    if (!llama_fp8_is_delayed(m) || m->linears_bf16) return;
    size_t slots = llama_fp8_slots(m);
    int H = m->amax_history, pos = m->fp8_history_steps % H;
    int len = m->fp8_history_steps + 1 < H ? m->fp8_history_steps + 1 : H;
    op_fp8_delayed_update(fp8_scale(m, 0, FP8_OP_X), m->fp8_history, m->fp8_step_amax, slots, H, pos, len, m->amax_algo,
                          FP8_E4M3, m->fp8_margin, m->pow2_scales);
    op_fp8_delayed_update(fp8_scale(m, 0, FP8_OP_DY), m->fp8_history + slots * (size_t)H, m->fp8_step_amax + slots, slots, H, pos,
                          len, m->amax_algo, FP8_E5M2, m->fp8_margin, m->pow2_scales);
    m->fp8_history_steps++;
}

/* Bytes of the delayed recipe's training state (llama_fp8_state_download): the X and dY scale records,
   then the histories; 0 unless delayed. */
static inline size_t llama_fp8_state_bytes(const Llama* m) {
    return llama_fp8_is_delayed(m) ? fp8_delayed_state_bytes(FP8_DELAYED_OPS * llama_fp8_slots(m), m->amax_history) : 0;
}

/* host (llama_fp8_state_bytes) = the X and dY records and the histories (the count is the caller's:
   m->fp8_history_steps). */
static inline void llama_fp8_state_download(Llama* m, void* host) {
    size_t records = FP8_DELAYED_OPS * llama_fp8_slots(m);
    dev_download(host, fp8_scale(m, 0, FP8_OP_X), records * sizeof(Fp8Scale));
    dev_download((char*)host + records * sizeof(Fp8Scale), m->fp8_history, records * (size_t)m->amax_history * sizeof(float));
}

/* The inverse of llama_fp8_state_download; the non-finite flags of the records are cleared. */
static inline void llama_fp8_state_upload(Llama* m, const void* host) {
    size_t records = FP8_DELAYED_OPS * llama_fp8_slots(m);
    dev_upload(fp8_scale(m, 0, FP8_OP_X), host, records * sizeof(Fp8Scale));
    dev_upload(m->fp8_history, (const char*)host + records * sizeof(Fp8Scale), records * (size_t)m->amax_history * sizeof(float));
    op_fp8_clear_nonfinite(fp8_scale(m, 0, FP8_OP_X), records);
}

/* Returns 1 and writes the first operand (slot order, then W, X, dY) of a linear running FP8 whose flag
   is set, as "w13[layer 2] dY", or returns 0 when none is: any cast of the step so far (since
   llama_fp8_begin_step) of X or dY, or the cast of the weights in use. One download of the records: call
   it once per step. */
static inline int llama_fp8_nonfinite(Llama* m, char* out, size_t len) {
    if (m->precision != PRECISION_FP8) return 0;
    size_t slots = llama_fp8_slots(m);
    Fp8Scale* s = (Fp8Scale*)mallocCheck(slots * FP8_OPS * sizeof(Fp8Scale));
    dev_download(s, m->fp8_scales, slots * FP8_OPS * sizeof(Fp8Scale));
    /* the delayed casts flag nothing themselves: their step amaxes tell */
    float* step_amax = llama_fp8_step_amaxes_host(m);
    int found = 0;
    for (size_t slot = 0; slot < slots && !found; slot++) {
        if (!llama_slot_is_fp8(m, slot)) continue;
        for (int op = 0; op < FP8_OPS && !found; op++) {
            int bad = s[(size_t)op * slots + slot].nonfinite != 0.0f;
            if (step_amax && op >= FP8_OP_X) bad |= !fp8_amax_is_finite(step_amax[(size_t)(op - FP8_OP_X) * slots + slot]);
            if (!bad) continue;
            snprintf(out, len, "%s[layer %zu] %s", LINEAR_NAMES[slot % LIN_PER_LAYER], slot / LIN_PER_LAYER, FP8_OPERAND_NAMES[op]);
            found = 1;
        }
    }
    free(s);
    free(step_amax);
    return found;
}

/* Starts a step whose FP8 casts gather statistics: counters zeroed, and this rank's pieces of the FP8
   weights, cast at the last update, counted by casting them again without writing (the same codes). */
static inline void llama_fp8_stats_begin(Llama* m) {
    if (m->precision != PRECISION_FP8) return;
    dev_zero(m->fp8_counts, llama_fp8_slots(m) * FP8_OPS * sizeof(Fp8Counts));
    m->fp8_stats_due = 1;
    for (int i = 0; i < m->num_segs; i++) {
        ModelSegment* s = &m->segs[i];
        if (!s->fp8) continue;
        size_t OC, C, b, n, rows, cols;
        size_t slot = llama_segment_slot(s, &m->cfg, &OC, &C);
        llama_own_piece(m, s, &b, &n);
        llama_piece_shape(n, &rows, &cols);
        op_cast_transpose_master(NULL, NULL, llama_master_piece(m, s, 1), rows, cols, FP8_E4M3, fp8_scale(m, slot, FP8_OP_W),
                                 m->pow2_scales, fp8_counts(m, slot, FP8_OP_W));
    }
}

/* The W counts of every slot, contiguous (llama_fp8_slots of them): per rank, those of its pieces, which
   the driver sums over the ranks of a sharded model before llama_fp8_stats_end. */
static inline Fp8Counts* llama_fp8_weight_counts(Llama* m) { return m->fp8_counts + (size_t)FP8_OP_W * llama_fp8_slots(m); }

/* The statistics of one FP8 operand over a statistics step (llama_fp8_stats_end). */
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

/* Ends a statistics step: calls `emit` for every operand of the linears that run FP8 now (amax and scale
   of the operand's last cast in the step). Call it before the step's update, which casts the next step's
   weights. */
static inline void llama_fp8_stats_end(Llama* m, Fp8StatsEmit emit, void* ctx) {
    if (m->precision != PRECISION_FP8 || !m->fp8_stats_due) return;
    m->fp8_stats_due = 0;
    size_t slots = llama_fp8_slots(m), n = slots * FP8_OPS;
    Fp8Scale* s = (Fp8Scale*)mallocCheck(n * sizeof(Fp8Scale));
    Fp8Counts* k = (Fp8Counts*)mallocCheck(n * sizeof(Fp8Counts));
    dev_download(s, m->fp8_scales, n * sizeof(Fp8Scale));
    dev_download(k, m->fp8_counts, n * sizeof(Fp8Counts));
    float* step_amax = llama_fp8_step_amaxes_host(m);
    for (size_t slot = 0; slot < slots; slot++) {
        if (!llama_slot_is_fp8(m, slot)) continue;
        for (int op = 0; op < FP8_OPS; op++) {
            size_t i = (size_t)op * slots + slot;
            Fp8OperandStats o;
            o.layer = (int)(slot / LIN_PER_LAYER);
            o.lin = (LinearId)(slot % LIN_PER_LAYER);
            o.op = op;
            o.gemm = LINEAR_NAMES[o.lin];
            o.operand = FP8_OPERAND_NAMES[op];
            o.format = op == FP8_OP_DY ? "E5M2" : "E4M3";
            o.amax = step_amax && op >= FP8_OP_X ? step_amax[(size_t)(op - FP8_OP_X) * slots + slot] : s[i].amax;
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

/* Copies row `row` (0-based, < last B*T) of the last forward's logits to the host as floats (V). */
static inline void llama_logits_row(Llama* m, size_t row, float* out) {
    act_to_float_host(out, m->acts.logits + row * (size_t)m->cfg.vocab_size, (size_t)m->cfg.vocab_size);
}

/*
 * Per-token losses of the logits the last llama_forward without targets left: for each of its B*T
 * positions, logsumexp(logits) - logits[target] in FP32 by the fused classifier, for `targets` (host
 * (B, T) ints). Returns a host array of B*T floats owned by the model (valid until the next forward);
 * the logits are consumed (overwritten as op_classifier does, with dloss 0).
 */
static inline const float* llama_token_losses(Llama* m, const int* targets) {
    size_t N = llama_tokens(m);
    dev_upload(m->targets, targets, N * sizeof(int));
    op_classifier(m->acts.logits, m->acts.losses, m->targets, N, m->cfg.vocab_size, 0.0f);
    dev_download(m->losses_host, m->acts.losses, N * sizeof(float));
    return m->losses_host;
}
