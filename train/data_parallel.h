/*
 * Data-parallel training with ZeRO (docs/cluster.md): the driver of model/model.h's bucket hooks.
 *
 *   -z 0  every rank holds everything; on the step's last micro-step each bucket's gradients are
 *         all-reduced as soon as the backward has written them; every rank runs AdamW on all of it.
 *   -z 1  optimizer state sharded: on the last micro-step each bucket is reduce-scattered into this
 *         rank's gradient shard; AdamW updates the rank's shard of the master weights and moments; the
 *         new weights are all-gathered bucket by bucket, in the order the next forward needs them: BF16
 *         working copies, and the E4M3 bytes of the FP8 linear layers, cast by every rank from its pieces
 *         with scales whose amax is MAX-all-reduced first, one collective for all of them (model/fp8_state.h),
 *         so they are bit-identical to one rank's; once a layer's gather has arrived, its W^T is made.
 *   -z 2  gradients sharded too: every micro-step reduce-scatters each bucket, added into the shard
 *         (the model's gradients for a bucket live in one of three reused buffers), then as -z 1.
 * --grad-buffer bf16|fp8 (ZeRO-1, or ZeRO-0 on one rank) stores the gradients the micro-steps accumulate
 * in BF16 or E4M3 (llama/optim.h "the gradient buffer"): the backward writes ZeRO-2's FP32 bucket buffers,
 * each bucket is then added into the stored sum, and on ZeRO-1's last micro-step the stored sum is added
 * into the bucket buffer instead, which is reduce-scattered as under -z 2 (dp_stage_grads).
 * Gradients are summed in FP32 (Megatron's grad_reduce_in_fp32) or, with --grad-reduce bf16, sent as
 * BF16, or with --grad-reduce fp8 as E4M3 blocks with a scale per chunk (comm/grad_fp8.h), dequantized
 * and summed in FP32 (under ZeRO-0 a reduce-scatter then an FP32 all-gather, comm/comm.h); the loss was
 * scaled by 1 / (global tokens) at its source, so the sum is the global mean gradient. On the GPU the collectives overlap the backward (a layer is reduced while the next one
 * computes) and the next step's forward (a layer's weights are gathered ahead of its use); the time the
 * compute stream still waits is what the trainer reports as exposed communication.
 *
 * Included after a backend, a communication implementation (comm/comm_mpi.h or comm/comm_nccl.cuh) and
 * model/model.h.
 */
#pragma once

#include "../comm/comm.h"
#include "../model/model.h"

/* Communication slots (comm/comm.h comm_mark): a bucket's weight all-gather, and its gradient reduction. */
#define SLOT_GATHER(bucket) (bucket)
#define SLOT_REDUCE(bucket) (COMM_SLOTS / 2 + (bucket))

typedef struct {
    Llama* m;
    CommWire wire;
    int last_micro;                /* the running micro-step is the step's last: ZeRO-0/1 reduce now */
    int local;                     /* the warm-up's micro-step: stage gradients as a step does, reduce nothing */
    int buffer_user[GRAD_BUFFERS]; /* ZeRO-2: the slot of the reduction last reading each buffer, or -1 */
    char* gather_pending;          /* (buckets) a weight all-gather was issued and not yet waited for */
} DataParallel;

/* Elements of bucket b's part of its ZeRO-2 gradient buffer (its segments with their padding). */
static inline size_t dp_bucket_elems(const Llama* m, int bucket) {
    size_t end = 0;
    for (int i = 0; i < m->num_segs; i++) {
        const ModelSegment* s = &m->segs[i];
        size_t e = s->buffer_offset + s->shard.piece * (size_t)m->layout.shards;
        if (s->bucket == bucket && e > end) end = e;
    }
    return end;
}

static void dp_weights_needed(void* ctx, int bucket) {
    DataParallel* dp = (DataParallel*)ctx;
    if (!dp->gather_pending[bucket]) return;
    comm_wait(SLOT_GATHER(bucket));
    dp->gather_pending[bucket] = 0;
    llama_fp8_weights_gathered(dp->m, bucket);
}

static void dp_all_gather(void* ctx, void* buf, size_t bytes) {
    (void)ctx;
    comm_all_gather(buf, bytes);
    comm_wait_all();
}

static void dp_grads_needed(void* ctx, int bucket) {
    DataParallel* dp = (DataParallel*)ctx;
    Llama* m = dp->m;
    if (!llama_grads_bucketed(m)) return;
    int buf = llama_grad_buffer_of(m, bucket);
    /* the buffer's previous bucket must have been reduced before the backward overwrites it */
    if (dp->buffer_user[buf] >= 0) comm_wait(dp->buffer_user[buf]);
    dp->buffer_user[buf] = -1;
    dev_zero(m->grad_buffer[buf], dp_bucket_elems(m, bucket) * sizeof(float));
}

/*
 * A bf16/fp8 gradient buffer (--grad-buffer, ZeRO-0 on one rank or ZeRO-1) after bucket b's backward:
 * returns 1 when the bucket is reduced now, from its FP32 bucket buffer, into which the stored sum of the
 * earlier micro-steps has been added (ZeRO-1's last micro-step); else the bucket's FP32 gradients are
 * added to the stored ones (op_store_add) and it returns 0.
 */
static int dp_stage_grads(DataParallel* dp, int bucket) {
    Llama* m = dp->m;
    int reduce = m->opt.sharding.zero_stage == 1 && dp->last_micro;
    StoreCodec c = grad_codec(m->opt.formats.grad_buffer);
    for (int i = 0; i < m->num_segs; i++) {
        ModelSegment* s = &m->segs[i];
        if (s->bucket != bucket) continue;
        void* stored = llama_grad_stored(m, s);
        float* sinv = llama_grad_stored_scale_inv(m, s);
        if (reduce) op_store_load(c, llama_grad_bucket(m, s), stored, sinv, s->param.count, 1);
        else op_store_add(c, stored, sinv, llama_grad_bucket(m, s), s->param.count, 1);
    }
    return reduce;
}

static void dp_grads_ready(void* ctx, int bucket) {
    DataParallel* dp = (DataParallel*)ctx;
    Llama* m = dp->m;
    int z = m->opt.sharding.zero_stage, staged = m->opt.formats.grad_buffer != GRAD_FORMAT_FP32;
    if (staged && !dp_stage_grads(dp, bucket)) return;
    if (dp->local || (z < 2 && !dp->last_micro)) return;
    if (z == 0 && m->opt.sharding.world == 1) return;
    for (int i = 0; i < m->num_segs; i++) {
        ModelSegment* s = &m->segs[i];
        if (s->bucket != bucket) continue;
        if (z == 0) {
            comm_all_reduce((float*)llama_grad_stored(m, s), s->param.count, dp->wire);
        } else {
            int bucketed = llama_grads_bucketed(m);
            const float* send = bucketed ? llama_grad_bucket(m, s) : (const float*)llama_grad_stored(m, s);
            comm_reduce_scatter(send, llama_grad_shard(m, s), s->shard.piece, z == 2, dp->wire);
        }
    }
    comm_mark(SLOT_REDUCE(bucket));
    if (llama_grads_bucketed(m)) dp->buffer_user[llama_grad_buffer_of(m, bucket)] = SLOT_REDUCE(bucket);
}

/* Attaches the driver to the model's hooks. wire: how gradients travel (--grad-reduce). */
static inline void dp_init(DataParallel* dp, Llama* m, CommWire wire) {
    memset(dp, 0, sizeof(*dp));
    dp->m = m;
    dp->wire = wire;
    dp->gather_pending = (char*)callocCheck((size_t)llama_num_buckets(m), 1);
    for (int b = 0; b < GRAD_BUFFERS; b++) dp->buffer_user[b] = -1;
    ModelHooks hooks = {dp, dp_weights_needed, dp_grads_needed, dp_grads_ready, dp_all_gather};
    llama_set_hooks(m, &hooks);
}

static inline void dp_free(DataParallel* dp) {
    free(dp->gather_pending);
    llama_set_hooks(dp->m, NULL);
}

/* Starts a step: the gradients the micro-steps accumulate into are zeroed. */
static inline void dp_begin_step(DataParallel* dp) {
    Llama* m = dp->m;
    llama_zero_grads(m);
    if (m->opt.sharding.zero_stage == 2) dev_zero(m->grad_shard, m->layout.shard * sizeof(float));
}

/*
 * After the last micro-step's backward: waits for the reductions and returns the global gradient norm,
 * identical on every rank (and, on the CPU build, for any rank count); *bad as llama_grad_norm_total.
 */
static inline float dp_grad_norm(DataParallel* dp, int* bad) {
    Llama* m = dp->m;
    comm_wait_all();
    llama_grad_norm_partials(m);
    if (m->layout.shards > 1) {
        comm_all_reduce_f64(m->norm_partials, m->layout.chunks);
        comm_wait_all();
    }
    return llama_grad_norm_total(m, bad);
}

/*
 * After llama_refresh_working_weights under ZeRO-1/2: the FP8 weights' amax MAX-all-reduced over the
 * ranks (every W scale record at once: amax is their first float, and the cast rewrites the others from
 * it), this rank's pieces cast, then the all-gather of the new weights, bucket by bucket in forward
 * order; the next forward waits for each bucket just before using it.
 */
static inline void dp_publish_weights(DataParallel* dp) {
    Llama* m = dp->m;
    if (m->layout.shards == 1) return;
    if (m->opt.precision == PRECISION_FP8) {
        comm_all_reduce_max((float*)llama_fp8_weight_scales(m), llama_fp8_slots(m) * sizeof(Fp8Scale) / sizeof(float));
        comm_wait_all();
        llama_fp8_cast_weights(m);
    }
    for (int b = 0; b < llama_num_buckets(m); b++) {
        for (int i = 0; i < m->num_segs; i++) {
            ModelSegment* s = &m->segs[i];
            if (s->bucket != b) continue;
            size_t bytes;
            void* buf = llama_segment_gather_buffer(m, s, &bytes);
            comm_all_gather(buf, bytes);
        }
        comm_mark(SLOT_GATHER(b));
        dp->gather_pending[b] = 1;
    }
}

/* AdamW on this rank's shard (llama_update), then the new weights published to every rank. */
static inline void dp_update(DataParallel* dp, float lr, float weight_decay, int step, float grad_scale) {
    llama_update(dp->m, lr, weight_decay, step, grad_scale);
    dp_publish_weights(dp);
}

/* After loading master weights into the shards (init, checkpoint, resume): every rank's working weights. */
static inline void dp_refresh_weights(DataParallel* dp) {
    llama_refresh_working_weights(dp->m);
    dp_publish_weights(dp);
}

/*
 * The delayed recipe's step amaxes (llama_fp8_step_amaxes: every X and dY record) MAX-all-reduced over
 * the ranks in one collective, as Transformer Engine reduces amaxes over the data-parallel group, after
 * the step's last micro-step: every rank then pushes the same history entries and computes the same
 * scales. Nothing on one rank or for other recipes.
 */
static inline void dp_fp8_reduce_step_amax(DataParallel* dp) {
    float* step_amax = llama_fp8_step_amaxes(dp->m);
    if (step_amax == NULL || dp->m->opt.sharding.world == 1) return;
    comm_all_reduce_max(step_amax, FP8_DELAYED_OPS * llama_fp8_slots(dp->m));
    comm_wait_all(); /* the step's decisions read them next */
}

/*
 * Ends an FP8 statistics step (llama_fp8_stats_end): the W counts of a sharded model, which each rank
 * gathered for its own pieces, are first summed over the ranks, so that the W rows are the one-rank run's.
 */
static inline void dp_fp8_stats_end(DataParallel* dp, Fp8StatsEmit emit, void* ctx) {
    Llama* m = dp->m;
    if (llama_fp8_stats_due(m) && m->layout.shards > 1) {
        size_t slots = llama_fp8_slots(m), fields = sizeof(Fp8Counts) / sizeof(unsigned long long);
        Fp8Counts* counts = (Fp8Counts*)mallocCheck(slots * sizeof(Fp8Counts));
        double* sums = (double*)mallocCheck(slots * fields * sizeof(double));
        dev_download(counts, llama_fp8_weight_counts(m), slots * sizeof(Fp8Counts));
        /* exact: counts stay far below 2^53 */
        for (size_t i = 0; i < slots * fields; i++) sums[i] = (double)((unsigned long long*)counts)[i];
        comm_host_sum(sums, slots * fields);
        for (size_t i = 0; i < slots * fields; i++) ((unsigned long long*)counts)[i] = (unsigned long long)sums[i];
        dev_upload(llama_fp8_weight_counts(m), counts, slots * sizeof(Fp8Counts));
        free(counts);
        free(sums);
    }
    llama_fp8_stats_end(m, emit, ctx);
}

/*
 * The collectives of a step, once each, before the first (the trainer's warm-up): NCCL then makes its
 * connections (the FP8 wire's all-to-all connects to every peer) and the conversion kernels load before
 * step 1. On the smallest segment's own buffers, which every step rewrites before reading them (ZeRO-0's
 * gradients and ZeRO-2's gradient shard are zeroed when a step begins, ZeRO-1's shard is overwritten,
 * the norm partials are zeroed before use, the delayed recipe's step amaxes when a step begins); the
 * weights are published again, which casts and gathers the same bytes. Waits for all of it.
 */
static inline void dp_warmup(DataParallel* dp) {
    Llama* m = dp->m;
    int z = m->opt.sharding.zero_stage;
    ModelSegment* s = &m->segs[0];
    for (int i = 1; i < m->num_segs; i++) s = m->segs[i].param.count < s->param.count ? &m->segs[i] : s;
    if (z == 0 && m->opt.sharding.world > 1) comm_all_reduce((float*)llama_grad_stored(m, s), s->param.count, dp->wire);
    if (z > 0) {
        const float* send = llama_grads_bucketed(m) ? llama_grad_bucket(m, s) : (const float*)llama_grad_stored(m, s);
        comm_reduce_scatter(send, llama_grad_shard(m, s), s->shard.piece, z == 2, dp->wire);
    }
    if (m->layout.shards > 1) comm_all_reduce_f64(m->norm_partials, m->layout.chunks);
    dp_fp8_reduce_step_amax(dp);
    comm_wait_all();
    dp_publish_weights(dp);
}
