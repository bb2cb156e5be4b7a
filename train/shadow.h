/*
 * The shadow check (--shadow-every K; docs/safety-net.md): a BF16 baseline measured inside an FP8
 * run, after the practice 01.AI describes for FP8 pretraining on Megatron-LM + Transformer Engine. On a
 * step where a check is due (train/shadow_policy.h), the step's first micro-batch is run once more with
 * every block linear in BF16 (llama_set_linear_precision), at the same weights, before the step's own
 * micro-steps; its loss is compared with the FP8 loss the step computes for the same micro-batch.
 *
 * With --shadow-grad 1 the gradients of that micro-batch are compared too: cosine similarity and the
 * relative difference of the norms, over the whole model and per block (the worst block is reported).
 * Three extra passes on the model's own gradient buffer give the three sums of squares the comparison
 * needs, so no copy of a gradient is kept: g16 (BF16) gives |g16|^2; adding the FP8 pass run with the
 * loss weight negated, which makes every op of the backward give exactly -g8 (each is odd in dY, FP8
 * casts included: amax and scale ignore the sign), leaves g16 - g8 and |g16 - g8|^2; a fresh FP8 pass
 * gives |g8|^2; then g8 . g16 = (|g8|^2 + |g16|^2 - |g16 - g8|^2) / 2. The sums are per ZERO_CHUNK chunk
 * in the norm's partials buffer, summed per segment on the host in a fixed order. This needs the full
 * gradients of ZeRO-0/1; ZeRO-2 keeps only bucket buffers, so --shadow-grad 1 is refused with -z 2.
 *
 * Nothing of the run changes: the shadow passes write activations and scales the step's own micro-steps
 * rewrite before reading, detach the gradient hooks (no communication of shadow gradients) and leave
 * the gradients zeroed as the step started them, so the run's losses, weights and optimizer state are
 * bit-identical with and without checks (the CPU build; cuDNN's attention backward is deterministic on
 * the GPU only with LLM8_DETERMINISTIC=1). Multi-rank: each rank checks its own first micro-batch; the
 * losses are averaged and the sums of squares added over the ranks, slot by slot (train/trainer.h's
 * rule), so every rank sees the same result and the policy decides the same everywhere. The checked
 * micro-batches, and so the measured differences, depend on the rank count (W ranks check W
 * micro-batches): a run resumed on another rank count may fall back at another step.
 *
 * Cost of a check, against the grad_accum_steps forward + backward passes of a step: one BF16 forward;
 * with --shadow-grad 1 also its backward and two FP8 forward + backward passes. Memory: on the device
 * only the BF16 weight scratch (llama_bf16_weight, in the memory plan; the norm's chunk partials are
 * reused), one double per gradient chunk and three per parameter segment on the host. Under ZeRO-1/2
 * each BF16 GEMM of the check waits for an all-gather of its weight.
 * Included after a backend, a communication implementation and model/model.h.
 */
#pragma once

#include "shadow_policy.h"
#include "../comm/comm.h"
#include "../model/model.h"

/* The three sums of squares of a segment, in the order the passes make them. */
enum { SQ_BF16, SQ_DIFF, SQ_FP8, SQ_KINDS };

typedef struct {
    Llama* m;
    int grad;          /* --shadow-grad 1 */
    double* partials;  /* (layout.chunks) host copy of the last pass's chunk sums */
    double* seg_sq;    /* (num_segs * SQ_KINDS) host: per segment, the sums of squares of the check */
    float loss_bf16;   /* this rank's BF16 loss of its first micro-batch */
    double ms;         /* this rank's time for the shadow passes */
} Shadow;

static inline void shadow_init(Shadow* sh, Llama* m, int grad) {
    memset(sh, 0, sizeof(*sh));
    sh->m = m;
    sh->grad = grad;
    if (!grad) return;
    sh->partials = (double*)mallocCheck(m->layout.chunks * sizeof(double));
    sh->seg_sq = (double*)mallocCheck((size_t)m->num_segs * SQ_KINDS * sizeof(double));
}

static inline void shadow_free(Shadow* sh) {
    free(sh->partials);
    free(sh->seg_sq);
    memset(sh, 0, sizeof(*sh));
}

/* Sums of squares of every segment of the local gradients (full layout) into seg_sq[seg * SQ_KINDS + kind]. */
static inline void shadow_grad_sums(Shadow* sh, int kind) {
    Llama* m = sh->m;
    for (int i = 0; i < m->num_segs; i++) {
        ModelSegment* s = &m->segs[i];
        op_sum_squares_chunks(m->norm_partials + s->shard.chunk_offset, (const float*)llama_grad_stored(m, s), s->param.count, ZERO_CHUNK);
    }
    dev_download(sh->partials, m->norm_partials, m->layout.chunks * sizeof(double));
    for (int i = 0; i < m->num_segs; i++) {
        const ShardSegment* s = &m->segs[i].shard;
        double sum = 0.0;
        for (size_t k = 0; k < zero_chunks(s->count); k++) sum += sh->partials[s->chunk_offset + k];
        sh->seg_sq[(size_t)i * SQ_KINDS + kind] = sum;
    }
}

/* One forward + backward of the micro-batch into the local gradients, the loss weighted by dloss. */
static inline void shadow_pass(Llama* m, const int* inputs, const int* targets, int B, int T, float dloss) {
    llama_forward(m, inputs, targets, B, T, dloss);
    llama_backward(m);
}

/*
 * The shadow passes on this rank's first micro-batch (B, T) of the step, host tokens: call after the
 * batch is loaded and before the step's first forward, with the gradients zeroed (they are left so).
 * Every rank calls it on the same steps.
 */
static inline void shadow_run(Shadow* sh, const int* inputs, const int* targets, int B, int T) {
    Llama* m = sh->m;
    backend_synchronize();
    double t0 = wall_seconds();
    float dloss = 1.0f / ((float)B * (float)T);
    ModelModes saved = llama_modes(m);
    llama_set_linear_precision(m, PRECISION_BF16);
    sh->loss_bf16 = llama_forward(m, inputs, targets, B, T, dloss);
    if (sh->grad) {
        /* local FP32 gradients (the shadow is refused where they are bucketed): nothing is reduced */
        ModelModes local = llama_modes(m);
        local.hooks.grads_needed = NULL;
        local.hooks.grads_ready = NULL;
        llama_set_modes(m, &local);
        llama_backward(m);
        shadow_grad_sums(sh, SQ_BF16);
        local.linears_bf16 = saved.linears_bf16;
        llama_set_modes(m, &local);
        shadow_pass(m, inputs, targets, B, T, -dloss); /* adds exactly -g8 */
        shadow_grad_sums(sh, SQ_DIFF);
        llama_zero_grads(m);
        shadow_pass(m, inputs, targets, B, T, dloss);
        shadow_grad_sums(sh, SQ_FP8);
        llama_zero_grads(m);
    }
    llama_set_modes(m, &saved);
    backend_synchronize();
    sh->ms = (wall_seconds() - t0) * 1e3;
}

/* cos(g8, g16) and | |g8| - |g16| | / |g16| from the three sums of squares; NaN where a norm is 0. */
static inline void shadow_grad_compare(const double* sq, double* cosine, double* norm_rel) {
    double n8 = sqrt(sq[SQ_FP8]), n16 = sqrt(sq[SQ_BF16]);
    double dot = 0.5 * (sq[SQ_FP8] + sq[SQ_BF16] - sq[SQ_DIFF]);
    *cosine = n8 > 0.0 && n16 > 0.0 ? dot / (n8 * n16) : NAN;
    *norm_rel = n16 > 0.0 ? fabs(n8 - n16) / n16 : NAN;
}

/*
 * After the step's micro-steps: reduces the check over the ranks (every rank calls it) given this
 * rank's FP8 loss of the same micro-batch, and fills *r, the same on every rank.
 */
static inline void shadow_finish(Shadow* sh, float loss_fp8, ShadowResult* r) {
    Llama* m = sh->m;
    int W = g_dist.world, L = m->cfg.n_layers;
    /* per rank: the two losses, then SQ_KINDS sums for the whole model and for each block */
    size_t per = 2 + (sh->grad ? (size_t)SQ_KINDS * (size_t)(L + 1) : 0);
    double* slots = (double*)callocCheck(per * (size_t)W, sizeof(double));
    double* mine = slots + per * (size_t)g_dist.rank;
    mine[0] = loss_fp8;
    mine[1] = sh->loss_bf16;
    for (int i = 0; sh->grad && i < m->num_segs; i++) {
        int layer = m->segs[i].param.layer;
        for (int k = 0; k < SQ_KINDS; k++) {
            double v = sh->seg_sq[(size_t)i * SQ_KINDS + k];
            mine[2 + k] += v;
            if (layer >= 0) mine[2 + (size_t)SQ_KINDS * (size_t)(1 + layer) + k] += v;
        }
    }
    comm_host_sum(slots, per * (size_t)W);
    double* total = (double*)callocCheck(per, sizeof(double));
    for (int rank = 0; rank < W; rank++) {
        for (size_t j = 0; j < per; j++) total[j] += slots[(size_t)rank * per + j];
    }
    memset(r, 0, sizeof(*r));
    r->loss_fp8 = total[0] / W;
    r->loss_bf16 = total[1] / W;
    r->rel = fabs(r->loss_fp8 - r->loss_bf16) / fabs(r->loss_bf16);
    r->ms = sh->ms;
    r->has_grad = sh->grad;
    if (sh->grad) {
        shadow_grad_compare(total + 2, &r->cosine, &r->norm_rel);
        r->worst_layer = -1;
        for (int l = 0; l < L; l++) {
            double c, n;
            shadow_grad_compare(total + 2 + (size_t)SQ_KINDS * (size_t)(1 + l), &c, &n);
            int worse = r->worst_layer < 0 || (isnan(c) && !isnan(r->worst_cosine)) || c < r->worst_cosine;
            if (worse) {
                r->worst_layer = l;
                r->worst_cosine = c;
                r->worst_norm_rel = n;
            }
        }
    }
    free(slots);
    free(total);
}
