/*
 * The Llama-2 model (HF LlamaForCausalLM) as both builds run it, over the Llama struct of llama.h: the
 * linear layers, the forward and backward passes, the gradient norm and the AdamW update (docs/model.md).
 * Compiled after a backend (cpu/backend.h or cuda/backend.cuh), whose ops (llama/backend.h) are all it
 * calls; pointers are device pointers on the GPU. N = B*T tokens; C, QKV, F as in llama/config.h.
 *
 *   x = embed(tokens); per layer: h = x + wo(attn(rope(wqkv(rmsnorm(x)))));
 *                                 x = h + w2(swiglu(w13(rmsnorm(h))));   logits = output(rmsnorm(x))
 */
#pragma once

#include <math.h>

#include "llama.h"

/* ---------------------------------------------------------------- linear layers */

/* Does linear `lin` run FP8 GEMMs now? The block linears of a -p fp8 run do, but those of the blocks
   --bf16-layers names and all of them while llama_set_linear_precision has them in BF16. */
static inline int llama_linear_is_fp8(const Llama* m, const Linear* lin) { return lin->w8 != NULL && m->fp8.slot_on[lin->slot]; }

/* Where the producer of linear `lin`'s input (the RMSNorm before wqkv and w13, the SwiGLU before w2)
   computes its amax as it writes it, so that the cast needs no separate read: the X record of an FP8
   linear under current scaling; NULL otherwise, in a replay, and with the fused amax switched off. */
static inline Fp8Scale* llama_fused_x_amax(Llama* m, const Linear* lin) {
    if (lin->id == LIN_WO || m->replaying || m->mode.unfused_amax || !llama_linear_is_fp8(m, lin)) return NULL;
    return fp8_scales_from_history(&m->fp8) ? NULL : fp8_record(&m->fp8, lin->slot, FP8_OP_X);
}

/*
 * fprop: out (N, OC) = inp (N, C) W^T. An FP8 linear casts inp to E4M3 as its recipe says (keeping the
 * X^T copy for wgrad when the run keeps it) and multiplies the E4M3 W with fast accumulation unless
 * --fp8-fast-accum 0; any other multiplies its weight in the activation type (llama_bf16_weight).
 */
static inline void linear_forward(Llama* m, const Linear* lin, act_t* out, const act_t* inp) {
    size_t N = llama_tokens(m), C = lin->in_dim, OC = lin->out_dim;
    int fp8 = llama_linear_is_fp8(m, lin), fused = llama_fused_x_amax(m, lin) != NULL;
    Fp8Quant x = fp8 ? fp8_quant(&m->fp8, lin->slot, FP8_OP_X, fused, m->replaying) : (Fp8Quant){0};
    const act_t* w = fp8 ? NULL : llama_bf16_weight(m, lin);
    if (fp8) op_fp8_quantize(m->fp8_operand, lin->xt8, inp, N, C, FP8_E4M3, &x);                            /* (N, C) */
    GemmOperand a = gemm_operand(w, DT_ACT), b = gemm_operand(inp, DT_ACT);
    if (fp8) {
        a = gemm_operand_fp8(lin->w8, DT_E4M3, lin->w_scale_inv);
        b = gemm_operand_fp8(m->fp8_operand, DT_E4M3, &x.s->scale_inv);
    }
    GemmCall g = gemm_fprop(out, DT_ACT, a, b, N, C, OC);
    g.fast_accum = fp8 && m->opt.fp8.fprop_fast_accum;
    g.accum = fp8 ? m->opt.fp8.accum : FP8_ACCUM_EXACT;
    op_gemm(&g);
}

/*
 * dgrad and wgrad: dinp (N, C) = dout (N, OC) W and dW (OC, C) FP32 += dout^T inp. An FP8 linear casts
 * dout to E5M2 (and dout^T); dgrad multiplies the E4M3 W^T, wgrad the E4M3 X^T fprop kept or inp recast
 * with fprop's scale (the same bytes, no statistics); no fast accumulation (TE's default for the backward
 * GEMMs). Any other linear: GEMMs in the activation type.
 */
static inline void linear_backward(Llama* m, const Linear* lin, act_t* dinp, const act_t* dout, const act_t* inp) {
    size_t N = llama_tokens(m), C = lin->in_dim, OC = lin->out_dim;
    if (!llama_linear_is_fp8(m, lin)) {
        const act_t* w = llama_bf16_weight(m, lin);
        GemmCall dgrad = gemm_dgrad(dinp, DT_ACT, gemm_operand(w, DT_ACT), gemm_operand(dout, DT_ACT), N, C, OC);
        op_gemm(&dgrad);
        GemmCall wgrad = gemm_wgrad(lin->dweight, gemm_operand(inp, DT_ACT), gemm_operand(dout, DT_ACT), N, C, OC);
        op_gemm(&wgrad);
        return;
    }
    Fp8Quant dy = fp8_quant(&m->fp8, lin->slot, FP8_OP_DY, 0, 0), x = fp8_quant(&m->fp8, lin->slot, FP8_OP_X, 0, 1);
    op_fp8_quantize(m->fp8_operand, m->fp8_operand_t, dout, N, OC, FP8_E5M2, &dy);                    /* (N, OC), (OC, N) */
    GemmCall dgrad = gemm_dgrad(dinp, DT_ACT, gemm_operand_fp8(lin->wt8, DT_E4M3, lin->w_scale_inv),
                                gemm_operand_fp8(m->fp8_operand, DT_E5M2, &dy.s->scale_inv), N, C, OC);
    dgrad.accum = m->opt.fp8.accum;
    op_gemm(&dgrad);
    const uint8_t* xt = lin->xt8;
    if (xt == NULL) { /* into fp8_operand, which dgrad no longer needs */
        op_fp8_quantize(NULL, m->fp8_operand, inp, N, C, FP8_E4M3, &x);                                 /* (C, N) */
        xt = m->fp8_operand;
    }
    GemmCall wgrad = gemm_wgrad(lin->dweight, gemm_operand_fp8(xt, DT_E4M3, &x.s->scale_inv),
                                gemm_operand_fp8(m->fp8_operand_t, DT_E5M2, &dy.s->scale_inv), N, C, OC);
    wgrad.accum = m->opt.fp8.accum;
    op_gemm(&wgrad);
}

/* ---------------------------------------------------------------- buckets */

/* Before the forward reads bucket b's weights: the driver's hook (which waits for their gather). */
static inline void llama_weights_needed(Llama* m, int bucket) {
    if (m->mode.hooks.weights_needed) m->mode.hooks.weights_needed(m->mode.hooks.ctx, bucket);
}

static inline void llama_grads_needed(Llama* m, int bucket) {
    if (m->mode.hooks.grads_needed) m->mode.hooks.grads_needed(m->mode.hooks.ctx, bucket);
    else if (llama_grads_bucketed(m))
        die("llama_backward: the bucket buffers of ZeRO-2 or a bf16/fp8 --grad-buffer need the data-parallel driver's hooks");
}

static inline void llama_grads_ready(Llama* m, int bucket) {
    if (m->mode.hooks.grads_ready) m->mode.hooks.grads_ready(m->mode.hooks.ctx, bucket);
}

/* ---------------------------------------------------------------- activations of a block */

/* Layer l's slices of the activation buffers for the last forward's (B, T): its own, or the one shared
   slice of a buffer the run does not keep per layer (docs/model.md "Recompute"). */
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
    act_t* next;      /* (N, C) the next block's input, resid[l + 1] */
} BlockActs;

static inline BlockActs llama_block_acts(Llama* m, int l) {
    const LlamaConfig* c = &m->cfg;
    size_t N = llama_tokens(m), NC = N * (size_t)c->dim, NF = N * (size_t)c->ffn_dim;
    size_t stats_per = att_stats_size((size_t)m->opt.B, c->n_heads, m->opt.T);
    size_t keep = llama_keeps_linear_inputs(m) ? (size_t)l : 0, blocks = llama_keeps_blocks(m) ? (size_t)l : 0;
    Acts* a = &m->acts;
    BlockActs k = {a->resid + (size_t)l * NC, a->ln_attn + keep * NC, a->rstd_attn + blocks * N,
                   a->qkv + blocks * N * (size_t)llama_qkv_dim(c), a->att + blocks * NC, a->att_stats + blocks * stats_per,
                   a->resid_mid + blocks * NC, a->rstd_ffn + blocks * N, a->ln_ffn + keep * NC, a->fc + blocks * 2 * NF,
                   a->swiglu + keep * NF, a->resid + (size_t)(l + 1) * NC};
    return k;
}

/* Must backward rebuild the input of `lin` (keep: llama_keeps_linear_inputs)? Where the run keeps neither
   it nor an X^T copy of it: -r 1, and a BF16 linear of an fp8 run; never under -r 2, whose replay has
   just rebuilt the whole block. */
static inline int llama_rebuilds_input(const Llama* m, const Linear* lin, int keep) {
    if (keep || m->opt.recompute == RECOMPUTE_BLOCKS) return 0;
    return m->opt.recompute == RECOMPUTE_NORMS || !llama_linear_is_fp8(m, lin);
}

/* ---------------------------------------------------------------- forward */

/* A block from its attention norm's output to its SwiGLU output: the forward runs it between the norms,
   a replay (-r 2) alone. Reads only weights the forward has waited for. */
static inline void llama_block_forward(Llama* m, const LayerParams* p, const BlockActs* k) {
    const LlamaConfig* c = &m->cfg;
    int B = m->last_B, T = m->last_T, NH = c->n_heads, NKV = c->n_kv_heads, HS = llama_head_dim(c);
    size_t N = llama_tokens(m);
    Fp8Scale* w13_amax = llama_fused_x_amax(m, &p->lin[LIN_W13]);
    Fp8Scale* w2_amax = llama_fused_x_amax(m, &p->lin[LIN_W2]);
    linear_forward(m, &p->lin[LIN_QKV], k->qkv, k->ln_attn);                                           /* (N, QKV) */
    op_rope_forward(k->qkv, m->rope_cos, m->rope_sin, B, T, NH, NKV, HS);
    op_attention_forward(k->att, k->stats, k->qkv, B, T, NH, NKV, HS);                                   /* (N, C) */
    linear_forward(m, &p->lin[LIN_WO], m->acts.branch, k->att);                                          /* (N, C) */
    op_residual_rmsnorm_forward(k->mid, k->ln_ffn, k->rstd_ffn, k->x, m->acts.branch, p->ffn_norm, N, c->dim, c->norm_eps,
                                w13_amax);                                                               /* (N, C) */
    linear_forward(m, &p->lin[LIN_W13], k->fc, k->ln_ffn);                                               /* (N, 2F) */
    op_swiglu_forward(k->sw, k->fc, N, c->ffn_dim, w2_amax);                                             /* (N, F) */
}

/* -r 2: a block's activations rebuilt in the shared slices from its kept input, by the forward's ops (its
   attention norm unfused: the same values) with the forward's FP8 scales (docs/model.md "Recompute"). */
static inline void llama_replay_block(Llama* m, const LayerParams* p, const BlockActs* k) {
    m->replaying = 1;
    op_rmsnorm_forward(k->ln_attn, k->rstd_attn, k->x, p->attn_norm, llama_tokens(m), m->cfg.dim, m->cfg.norm_eps, NULL);
    llama_block_forward(m, p, k);
    m->replaying = 0;
}

/*
 * The forward pass of llama_forward, up to the per-token losses in acts.losses (with targets); queues
 * its work and reads nothing back (the token uploads are asynchronous).
 */
static inline void llama_forward_pass(Llama* m, const int* inputs, const int* targets, int B, int T, float dloss) {
    if (B > m->opt.B || T > m->opt.T) die("forward on (B %d, T %d) exceeds the allocated (%d, %d)", B, T, m->opt.B, m->opt.T);
    const LlamaConfig* c = &m->cfg;
    size_t N = (size_t)B * T;
    int C = c->dim, L = c->n_layers, V = c->vocab_size;
    Acts* a = &m->acts;
    m->last_B = B;
    m->last_T = T;
    m->inputs_host = inputs;
    BlockActs k = llama_block_acts(m, 0);
    Fp8Scale* qkv_amax = llama_fused_x_amax(m, &m->layers[0].lin[LIN_QKV]);
    llama_weights_needed(m, BUCKET_EMBEDDING);
    /* every X and dY amax of this forward and its backward zeroed at once (the ops then skip theirs) */
    if (!m->mode.linears_bf16) fp8_reset_amaxes(&m->fp8, FP8_OP_X, FP8_DELAYED_OPS);
    dev_upload_async(m->inputs, inputs, N * sizeof(int));
    if (targets != NULL) dev_upload_async(m->targets, targets, N * sizeof(int));
    op_encoder_forward(a->resid, m->inputs, m->embedding, N, C);                                         /* (N, C) */
    llama_weights_needed(m, bucket_of_layer(0));
    op_rmsnorm_forward(k.ln_attn, k.rstd_attn, k.x, m->layers[0].attn_norm, N, C, c->norm_eps, qkv_amax); /* (N, C) */
    for (int l = 0; l < L; l++) {
        const LayerParams* p = &m->layers[l];
        int last = l == L - 1;
        BlockActs next = llama_block_acts(m, last ? l : l + 1);
        const act_t* next_norm = last ? m->final_norm : m->layers[l + 1].attn_norm;
        qkv_amax = last ? NULL : llama_fused_x_amax(m, &m->layers[l + 1].lin[LIN_QKV]);
        llama_block_forward(m, p, &k);
        linear_forward(m, &p->lin[LIN_W2], a->branch, k.sw);                                             /* (N, C) */
        /* the next norm's weight is the next bucket's: the next layer's attn_norm, or the final norm */
        llama_weights_needed(m, bucket_of_layer(l + 1));
        op_residual_rmsnorm_forward(k.next, last ? a->ln_final : next.ln_attn, last ? a->rstd_final : next.rstd_attn, k.mid,
                                    a->branch, next_norm, N, C, c->norm_eps, qkv_amax);                 /* (N, C) */
        k = next;
    }
    linear_forward(m, &m->output, a->logits, a->ln_final);                                              /* (N, V) */
    if (targets != NULL) op_classifier(a->logits, a->losses, m->targets, N, V, dloss);
}

/*
 * Forward pass on a micro-batch of (B, T) tokens, B, T at most the built ones. inputs, targets: host
 * (B, T) ints; targets may be NULL (logits only, e.g. for sampling). With targets, returns the mean
 * cross-entropy and leaves dloss * d(loss_i)/d(logits) in acts.logits for backward (dloss: the weight of
 * one token's loss in the step's objective, 1 / (B*T*grad_accum_steps*ranks)); without, returns 0.
 * Calls the weights_needed hook for each bucket before its weights are first read. Waits for the pass
 * (it reads the losses); llama_forward_deferred does not.
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

/* ---------------------------------------------------------------- backward */

/*
 * Backward pass of the last llama_forward (which must have had targets): accumulates d(loss)/d(param)
 * into the gradients (+= so that micro-steps add up; llama_zero_grads starts a step). Every accumulation
 * is grad = grad + (this micro-step's contribution, summed on its own), so accumulating micro-steps on
 * one rank adds in the order a rank-ordered reduction over ranks would (comm/comm.h). Calls the
 * grads_needed / grads_ready hooks around each bucket, in backward order (head, layers L-1..0,
 * embedding); a bucketed gradient buffer (ZeRO-2, a bf16/fp8 --grad-buffer) needs them. Rebuilds what the
 * run does not keep (docs/model.md "Recompute").
 */
static inline void llama_backward(Llama* m) {
    const LlamaConfig* c = &m->cfg;
    int B = m->last_B, T = m->last_T, C = c->dim, F = c->ffn_dim, L = c->n_layers;
    int NH = c->n_heads, NKV = c->n_kv_heads, HS = llama_head_dim(c);
    size_t N = (size_t)B * T;
    int keep = llama_keeps_linear_inputs(m);
    Acts* a = &m->acts;
    int head = llama_num_buckets(m) - 1;

    dev_zero(a->d_resid, N * C * sizeof(act_t));
    llama_grads_needed(m, head);
    linear_backward(m, &m->output, a->d_ln, a->logits, a->ln_final);                                   /* (N, C) */
    op_rmsnorm_backward(a->d_resid, m->d_final_norm, a->d_ln, a->resid + (size_t)L * N * C, m->final_norm, a->rstd_final, N, C);
    llama_grads_ready(m, head);
    for (int l = L - 1; l >= 0; l--) {
        const LayerParams* p = &m->layers[l];
        BlockActs k = llama_block_acts(m, l);
        if (!llama_keeps_blocks(m)) llama_replay_block(m, p, &k);
        /* the inputs backward reads but the run did not keep, rebuilt by the forward's kernels: the same bytes */
        if (llama_rebuilds_input(m, &p->lin[LIN_W13], keep))
            op_rmsnorm_forward(k.ln_ffn, k.rstd_ffn, k.mid, p->ffn_norm, N, C, c->norm_eps, NULL);
        if (llama_rebuilds_input(m, &p->lin[LIN_W2], keep)) op_swiglu_forward(k.sw, k.fc, N, F, NULL);
        if (llama_rebuilds_input(m, &p->lin[LIN_QKV], keep))
            op_rmsnorm_forward(k.ln_attn, k.rstd_attn, k.x, p->attn_norm, N, C, c->norm_eps, NULL);
        llama_grads_needed(m, bucket_of_layer(l));
        linear_backward(m, &p->lin[LIN_W2], a->d_swiglu, a->d_resid, k.sw);                              /* (N, F) */
        op_swiglu_backward(a->d_fc, a->d_swiglu, k.fc, N, F);                                             /* (N, 2F) */
        linear_backward(m, &p->lin[LIN_W13], a->d_ln, a->d_fc, k.ln_ffn);                                 /* (N, C) */
        op_rmsnorm_backward(a->d_resid, p->d_ffn_norm, a->d_ln, k.mid, p->ffn_norm, k.rstd_ffn, N, C);
        linear_backward(m, &p->lin[LIN_WO], a->d_att, a->d_resid, k.att);                                 /* (N, C) */
        op_attention_backward(a->d_qkv, a->d_att, k.qkv, k.att, k.stats, B, T, NH, NKV, HS);              /* (N, QKV) */
        op_rope_backward(a->d_qkv, m->rope_cos, m->rope_sin, B, T, NH, NKV, HS);
        linear_backward(m, &p->lin[LIN_QKV], a->d_ln, a->d_qkv, k.ln_attn);                               /* (N, C) */
        op_rmsnorm_backward(a->d_resid, p->d_attn_norm, a->d_ln, k.x, p->attn_norm, k.rstd_attn, N, C);
        llama_grads_ready(m, bucket_of_layer(l));
    }
    llama_grads_needed(m, BUCKET_EMBEDDING);
    op_encoder_backward(m->d_embedding, a->d_resid, m->inputs, m->inputs_host, N, C);
    llama_grads_ready(m, BUCKET_EMBEDDING);
}

/* ---------------------------------------------------------------- gradient norm and update */

/* Starts a step: zeroes the gradients the micro-steps accumulate into (ZeRO-0/1; under ZeRO-2 the
   data-parallel driver zeroes its reduced-gradient shard and each bucket buffer before use). */
static inline void llama_zero_grads(Llama* m) {
    StoreCodec g = grad_codec(m->opt.formats.grad_buffer);
    if (m->grads) dev_zero(m->grads, m->layout.full * store_bytes(g));
    if (m->grad_scale_inv) dev_zero(m->grad_scale_inv, store_scale_count(g, m->layout.full) * sizeof(float));
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
        if (s->own_count > 0)
            op_sum_squares_chunks(m->norm_partials + s->shard.chunk_offset + s->own_begin / ZERO_CHUNK, llama_grad_reduced(m, s),
                                  s->own_count, ZERO_CHUNK);
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
            for (size_t k = 0; k < zero_chunks(s->count) && *bad < 0; k++)
                if (!isfinite(partials[s->chunk_offset + k])) *bad = i;
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

/*
 * One AdamW step (t = step + 1) on this rank's pieces of the master weights: gradients (the reduced
 * ones) multiplied by grad_scale (clipping), weight decay on 2-D weights only; then this rank's pieces
 * of the working weights and FP8 weights are refreshed (the driver finishes the FP8 casts and
 * all-gathers the rest under ZeRO-1/2).
 */
static inline void llama_update(Llama* m, float lr, float weight_decay, int step, float grad_scale) {
    float t = (float)(step + 1);
    float bc1 = 1.0f - powf(ADAMW_BETA1, t);
    float bc2_sqrt = sqrtf(1.0f - powf(ADAMW_BETA2, t));
    for (int i = 0; i < m->num_segs; i++) {
        ModelSegment* s = &m->segs[i];
        if (s->own_count == 0) continue;
        float wd = param_is_decayed(s->param.tensor) ? weight_decay : 0.0f;
        op_adamw(llama_master_piece(m, s, 1), adamw_moments_at(llama_moments(m), s->shard.shard_offset), llama_grad_reduced(m, s),
                 s->own_count, lr, wd, bc1, bc2_sqrt, grad_scale);
        llama_master_store(m, s);
    }
    llama_refresh_working_weights(m);
}

/* ---------------------------------------------------------------- logits and losses */

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
