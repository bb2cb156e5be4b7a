/*
 * Model-level checks shared by test_llama.c (CPU) and test_llama.cu (GPU), written against model.h's API
 * only, so each runs on whichever backend was included:
 *   - the reference run: the model of dev/reference/llama_ref_model.bin on the reference batch (logits,
 *     loss, every gradient, the losses of the reference's AdamW steps), compared with a reference state
 *     (HF transformers' float64 run, or a CPU run dumped in the same format for the GPU to match);
 *   - save -> load -> continue is bit-identical; gradient accumulation; recompute; the ZeRO stages on
 *     one rank (the GPU build's NCCL path with one rank against the path without it);
 *   - the FP8 safety net: an fp8 run with its block linears in BF16 is the bf16 recipe; the shadow
 *     check's gradient comparison against a direct one.
 * Included after a backend and a communication implementation (the trainer's entry point).
 */
#pragma once

#include "testing.h"
#include "../../model/model.h"
#include "../../train/data_parallel.h"
#include "../../train/shadow.h"
#include "../../train/shard_io.h"

typedef struct {
    double logits_max_abs;  /* max |logit - ref| */
    double loss_abs;        /* |loss - ref| */
    double grad_rel_l2;     /* worst ||g - ref|| / ||ref|| over gradient segments */
    double step_loss_rel;   /* worst |loss_s - ref_s| / ref_s over the AdamW steps */
} RefTolerance;

/*
 * The CPU build against HF's float64 run (test_llama.c), about 3x the errors measured when they were set
 * (fp32: logits 1.8e-7, gradients 6.6e-7, steps 1.1e-7; bf16: logits 4.0e-3, loss 5.7e-5, gradients
 * 1.1e-2, steps 1.0e-4; fp8: logits 3.4e-2, loss 5.9e-4, gradients 1.4e-1, steps 1.8e-3) and in line with
 * the formats: fp32 is FP32 rounding against HF's float64; bf16 rounds every stored activation to 8
 * significant bits (2^-9 relative); fp8 rounds the block's GEMM operands to 4 (E4M3) / 3 (E5M2)
 * significant bits (2^-4 / 2^-3 per element). The fixture is fixed, so these measured errors repeat
 * exactly; the tolerances leave room for another compiler or BLAS.
 */
static const RefTolerance CPU_REF_TOL_FP32 = {1e-5, 1e-5, 1e-5, 1e-5};
static const RefTolerance CPU_REF_TOL_BF16 = {1.5e-2, 2e-4, 4e-2, 4e-4};
static const RefTolerance CPU_REF_TOL_FP8 = {1e-1, 2e-3, 4e-1, 6e-3};

/*
 * The GPU against the CPU build on the same recipe (test_llama.cu): both round at the same places, so what
 * is left is summation order, accumulator width (FP8 fast accumulation in fprop), cuDNN's flash attention
 * (P and dS rounded to BF16) and the odd value on the other side of a BF16/FP8 rounding boundary.
 */
static const RefTolerance GPU_CPU_TOL_BF16 = {2e-2, 1e-3, 5e-2, 1e-3};
static const RefTolerance GPU_CPU_TOL_FP8 = {5e-2, 1e-2, 2e-1, 1e-2};

/*
 * The GPU against HF: whatever the CPU build may differ from HF plus whatever the GPU may differ from the
 * CPU build, by the triangle inequality. Absolute errors add; for a relative error e_gh = |g - h| / |h|
 * with e_ch = |c - h| / |h| and e_gc = |g - c| / |c|: e_gh <= e_ch + e_gc |c| / |h| <= e_ch + e_gc (1 + e_ch).
 * So this tolerance is never tighter than the CPU build's, and the GPU can fail it only by differing from
 * the CPU build more than GPU_CPU_TOL_* allows or by a CPU build that fails its own.
 */
static inline RefTolerance gpu_ref_tolerance(RefTolerance cpu_vs_ref, RefTolerance gpu_vs_cpu) {
    RefTolerance t;
    t.logits_max_abs = cpu_vs_ref.logits_max_abs + gpu_vs_cpu.logits_max_abs;
    t.loss_abs = cpu_vs_ref.loss_abs + gpu_vs_cpu.loss_abs;
    t.grad_rel_l2 = cpu_vs_ref.grad_rel_l2 + gpu_vs_cpu.grad_rel_l2 * (1.0 + cpu_vs_ref.grad_rel_l2);
    t.step_loss_rel = cpu_vs_ref.step_loss_rel + gpu_vs_cpu.step_loss_rel * (1.0 + cpu_vs_ref.step_loss_rel);
    return t;
}

/* Loads the reference model into a fresh model built as `opt` says (precision, micro-batch, recompute,
   state formats, ...). */
static inline void reference_model_opt(Llama* m, const LlamaConfig* cfg, const ModelOptions* opt) {
    backend_init(opt->precision);
    llama_build(m, cfg, opt);
    float* params = (float*)mallocCheck(m->num_params * sizeof(float));
    checkpoint_read_params(REF_MODEL_PATH, cfg, params);
    llama_set_params(m, params);
    free(params);
}

/* The reference model in precision p for micro-batches of B rows of the reference's T, at recompute
   level `recompute`; a -p fp8 model can switch its linears to BF16. */
static inline void reference_model(Llama* m, Precision p, const LlamaConfig* cfg, const RefState* r, int B, int recompute) {
    ModelOptions o = model_options(p, B, r->T);
    o.recompute = recompute;
    o.bf16_linears = p == PRECISION_FP8;
    reference_model_opt(m, cfg, &o);
}

/*
 * Runs the reference model in precision p on the batch and hyper-parameters of `ref`; fills `out` with
 * the same fields (logits of the initial model, its loss and gradients, the step losses). Free with
 * ref_state_free.
 */
static inline void reference_run(Precision p, const LlamaConfig* cfg, const RefState* ref, RefState* out) {
    *out = *ref;
    size_t N = (size_t)ref->B * ref->T, V = (size_t)cfg->vocab_size;
    out->inputs = (int*)mallocCheck(2 * N * sizeof(int));
    out->targets = out->inputs + N;
    memcpy(out->inputs, ref->inputs, N * sizeof(int));
    memcpy(out->targets, ref->targets, N * sizeof(int));
    out->logits = (float*)mallocCheck(N * V * sizeof(float));
    out->grads = (float*)mallocCheck(ref->num_params * sizeof(float));
    out->losses = (float*)mallocCheck((size_t)ref->steps * sizeof(float));
    for (size_t i = 0; i < N * V; i++) out->logits[i] = NAN; /* poison: every value must be written */
    for (size_t i = 0; i < ref->num_params; i++) out->grads[i] = NAN;
    Llama m;
    reference_model(&m, p, cfg, ref, ref->B, 0);
    /* logits first, before the classifier replaces them with their gradient */
    llama_forward(&m, ref->inputs, NULL, ref->B, ref->T, 0.0f);
    for (size_t row = 0; row < N; row++) llama_logits_row(&m, row, out->logits + row * V);
    llama_zero_grads(&m);
    out->loss = llama_forward(&m, ref->inputs, ref->targets, ref->B, ref->T, 1.0f / (float)N);
    llama_backward(&m);
    llama_get_grads(&m, out->grads);
    for (int s = 0; s < ref->steps; s++) {
        llama_zero_grads(&m);
        out->losses[s] = llama_forward(&m, ref->inputs, ref->targets, ref->B, ref->T, 1.0f / (float)N);
        llama_backward(&m);
        int bad;
        float norm = llama_grad_norm(&m, &bad);
        llama_update(&m, ref->lr, ref->weight_decay, s, clip_factor(norm, ref->clip));
    }
    llama_free(&m);
}

/* Compares a run with a reference state; prints every measured error; returns 0 when within tol. */
static inline int reference_compare(const RefState* got, const RefState* want, const LlamaConfig* cfg, RefTolerance tol) {
    int failures = 0;
    size_t N = (size_t)want->B * want->T, V = (size_t)cfg->vocab_size;
    ErrorStats le = error_stats(got->logits, want->logits, N * V);
    printf("    logits: max abs err %.3e (max |ref| %.3e)%s\n", le.max_abs, le.ref_max, le.nonfinite ? " NON-FINITE" : "");
    if (le.nonfinite || le.max_abs > tol.logits_max_abs) failures += fail("logits max abs err %.3e > %.1e", le.max_abs, tol.logits_max_abs);
    double loss_err = fabs((double)got->loss - want->loss);
    printf("    loss: %.7f vs ref %.7f, abs err %.3e\n", got->loss, want->loss, loss_err);
    if (!(loss_err <= tol.loss_abs)) failures += fail("loss abs err %.3e > %.1e", loss_err, tol.loss_abs);

    int nseg = param_segment_count(cfg);
    ParamSegment* seg = (ParamSegment*)mallocCheck((size_t)nseg * sizeof(ParamSegment));
    param_segments(cfg, seg);
    double worst = -1.0;
    int worst_seg = 0;
    for (int i = 0; i < nseg; i++) {
        ErrorStats ge = error_stats(got->grads + seg[i].param_offset, want->grads + seg[i].param_offset, seg[i].count);
        double e = ge.nonfinite ? INFINITY : ge.rel_l2;
        if (e > worst) {
            worst = e;
            worst_seg = i;
        }
    }
    char name[64];
    param_segment_name(&seg[worst_seg], name, sizeof(name));
    free(seg);
    printf("    gradients: worst relative L2 error %.3e in %s (%d tensors)\n", worst, name, nseg);
    if (!(worst <= tol.grad_rel_l2)) failures += fail("gradient of %s: relative L2 error %.3e > %.1e", name, worst, tol.grad_rel_l2);

    double worst_step = 0.0;
    for (int s = 0; s < want->steps; s++) {
        double rel = fabs((double)got->losses[s] - want->losses[s]) / fabs((double)want->losses[s]);
        if (!(rel <= worst_step)) worst_step = isfinite(rel) ? rel : INFINITY;
        printf("    step %d: loss %.7f ref %.7f rel err %.2e\n", s, got->losses[s], want->losses[s], rel);
    }
    if (!(worst_step <= tol.step_loss_rel)) failures += fail("AdamW step losses: worst relative error %.3e > %.1e", worst_step, tol.step_loss_rel);
    return failures != 0;
}

/*
 * Runs the reference model in precision p and compares it with the reference state at `state_path`
 * (HF's float64 run: REF_STATE_PATH). Also checks that the reference's AdamW constants are ours.
 */
static inline int reference_check(Precision p, const char* state_path, RefTolerance tol) {
    LlamaConfig cfg;
    checkpoint_read_config(REF_MODEL_PATH, &cfg);
    RefState want, got;
    ref_state_read(&want, state_path, &cfg);
    int failures = 0;
    if (want.beta1 != ADAMW_BETA1 || want.beta2 != ADAMW_BETA2 || want.eps != ADAMW_EPS)
        failures += fail("reference AdamW betas/eps (%g, %g, %g) differ from ours (%g, %g, %g)", want.beta1, want.beta2,
                         want.eps, ADAMW_BETA1, ADAMW_BETA2, ADAMW_EPS);
    reference_run(p, &cfg, &want, &got);
    failures += reference_compare(&got, &want, &cfg, tol);
    ref_state_free(&got);
    ref_state_free(&want);
    return failures != 0;
}

/* Writes the run of the reference batch in precision p as a reference state (for cross-build checks). */
static inline void reference_dump(Precision p, const char* out_path) {
    LlamaConfig cfg;
    checkpoint_read_config(REF_MODEL_PATH, &cfg);
    RefState ref, got;
    ref_state_read(&ref, REF_STATE_PATH, &cfg);
    reference_run(p, &cfg, &ref, &got);
    ref_state_write(out_path, &got, cfg.vocab_size);
    ref_state_free(&got);
    ref_state_free(&ref);
}

/* How a reference model of -p fp8 runs its block linears in BF16 (the FP8 safety net): not at all, by
   the run-wide switch (the shadow check's BF16 run, a fallback), by --bf16-layers naming every block, or
   naming the last block only (BF16 and FP8 blocks mixed). */
typedef enum { BF16_LINEARS_NONE, BF16_LINEARS_SWITCH, BF16_LINEARS_EVERY_BLOCK, BF16_LINEARS_LAST_BLOCK } Bf16Linears;

/*
 * The reference model's gradient after accumulating `micro` micro-batches that split the batch by rows,
 * its block linears in BF16 as `bf16` says; *loss (when not NULL) gets the last micro-batch's loss.
 */
static inline float* reference_gradient(Precision p, int micro, int recompute, Bf16Linears bf16, float* loss) {
    LlamaConfig cfg;
    checkpoint_read_config(REF_MODEL_PATH, &cfg);
    RefState r;
    ref_state_read(&r, REF_STATE_PATH, &cfg);
    Llama m;
    int Bm = r.B / micro;
    ModelOptions o = model_options(p, Bm, r.T);
    o.recompute = recompute;
    o.bf16_linears = bf16 == BF16_LINEARS_SWITCH;
    char* blocks = (char*)callocCheck((size_t)cfg.n_layers, 1);
    if (bf16 == BF16_LINEARS_EVERY_BLOCK) memset(blocks, 1, (size_t)cfg.n_layers);
    if (bf16 == BF16_LINEARS_LAST_BLOCK) blocks[cfg.n_layers - 1] = 1;
    o.bf16_blocks = blocks;
    reference_model_opt(&m, &cfg, &o);
    free(blocks);
    if (bf16 == BF16_LINEARS_SWITCH) llama_set_linear_precision(&m, PRECISION_BF16);
    llama_zero_grads(&m);
    for (int k = 0; k < micro; k++) {
        size_t off = (size_t)k * Bm * r.T;
        float l = llama_forward(&m, r.inputs + off, r.targets + off, Bm, r.T, 1.0f / (float)(r.B * r.T));
        if (loss != NULL) *loss = l;
        llama_backward(&m);
    }
    float* grads = (float*)mallocCheck(m.num_params * sizeof(float));
    llama_get_grads(&m, grads);
    llama_free(&m);
    ref_state_free(&r);
    return grads;
}

/* Two micro-batches of B/2 accumulate the gradient of one batch of B, to relative L2 error `tol`. */
static inline int check_grad_accumulation_in(Precision p, double tol) {
    float* one = reference_gradient(p, 1, 0, BF16_LINEARS_NONE, NULL);
    float* two = reference_gradient(p, 2, 0, BF16_LINEARS_NONE, NULL);
    LlamaConfig cfg;
    checkpoint_read_config(REF_MODEL_PATH, &cfg);
    ErrorStats e = error_stats(two, one, param_count(&cfg));
    printf("    %s: accumulated vs single batch: relative L2 %.3e, max abs %.3e\n", precision_name(p), e.rel_l2, e.max_abs);
    free(one);
    free(two);
    return e.nonfinite || e.rel_l2 > tol ? fail("accumulated gradient differs: relative L2 %.3e > %.1e", e.rel_l2, tol) : 0;
}

/*
 * The FP8 weights of an fp8 model against codes computed here from the checkpoint's FP32 weights: for
 * each FP8 linear layer, amax = max |bf16(w)|, the scale of fp8.h's policy, W = E4M3(bf16(w) * scale) and
 * W^T its transpose, byte for byte (the value quantized is the BF16 rounding of the master weight); and
 * llama_bf16_weight, for an FP8 layer (rebuilt from the master weights) and for the output layer (its
 * working copy), equal to bf16(w).
 */
static inline int check_fp8_weights_in(void) {
    LlamaConfig cfg;
    checkpoint_read_config(REF_MODEL_PATH, &cfg);
    RefState r;
    ref_state_read(&r, REF_STATE_PATH, &cfg);
    Llama m;
    reference_model(&m, PRECISION_FP8, &cfg, &r, r.B, 0);
    float* params = (float*)mallocCheck(m.num_params * sizeof(float));
    checkpoint_read_params(REF_MODEL_PATH, &cfg, params);
    int failures = 0;
    for (int l = 0; l < cfg.n_layers; l++) {
        for (int lin = 0; lin < LIN_PER_LAYER + 1; lin++) {
            int layer = lin == LIN_OUTPUT ? NO_LAYER : l;
            if (lin == LIN_OUTPUT && l > 0) continue;
            const Linear* x = llama_linear(&m, layer, (LinearId)lin);
            const float* w = params + x->seg->param.param_offset;
            size_t OC = x->out_dim, C = x->in_dim, n = x->seg->param.count;
            float* bf16 = (float*)mallocCheck(n * sizeof(float));
            act_to_float_host(bf16, llama_bf16_weight(&m, x), n);
            size_t wrong = 0;
            for (size_t i = 0; i < n; i++) wrong += float_bits(bf16[i]) != float_bits(bf16_round(w[i]));
            if (wrong) failures += fail("%s[layer %d]: llama_bf16_weight differs from bf16(master) in %zu of %zu", LINEAR_NAMES[lin], layer, wrong, n);
            free(bf16);
            if (lin == LIN_OUTPUT) continue;
            float amax = 0.0f;
            for (size_t i = 0; i < n; i++) amax = fmaxf(amax, fabsf(bf16_round(w[i])));
            float scale = fp8_compute_scale(amax, FP8_E4M3, 0);
            uint8_t* codes = (uint8_t*)mallocCheck(2 * n);
            dev_download(codes, x->w8, n);
            dev_download(codes + n, x->wt8, n);
            size_t bad = 0, bad_t = 0;
            for (size_t o = 0; o < OC; o++) {
                for (size_t c = 0; c < C; c++) {
                    uint8_t want = fp8_from_float(bf16_round(w[o * C + c]) * scale, FP8_E4M3);
                    bad += codes[o * C + c] != want;
                    bad_t += codes[n + c * OC + o] != want;
                }
            }
            if (bad || bad_t) failures += fail("%s[layer %d]: %zu W and %zu W^T codes differ from E4M3(bf16(w) * %g)", LINEAR_NAMES[lin], l, bad, bad_t, scale);
            free(codes);
        }
    }
    printf("    %d layers x 4 FP8 weights: E4M3 W and W^T of bf16(master); llama_bf16_weight = bf16(master)\n", cfg.n_layers);
    free(params);
    llama_free(&m);
    ref_state_free(&r);
    return failures != 0;
}

/* The FP8 statistics rows of a step, as llama_fp8_stats_end emits them: (amax, scale, saturated, underflow). */
typedef struct {
    double* rows;
    size_t n;
} StatsRows;

static void collect_stats_row(void* ctx, const Fp8OperandStats* o) {
    StatsRows* r = (StatsRows*)ctx;
    r->rows = (double*)realloc(r->rows, (r->n + 1) * 4 * sizeof(double));
    if (r->rows == NULL) die("out of host memory collecting FP8 statistics");
    double row[4] = {o->amax, o->scale, o->saturated_frac, o->underflow_frac};
    memcpy(r->rows + 4 * r->n++, row, sizeof(row));
}

/* What a recompute level must not change: step losses, the first step's gradient, final weights, the FP8
   statistics rows and the raw counts behind them (a cast counted twice keeps the fractions). */
#define RECOMPUTE_STEPS 2
typedef struct {
    float losses[RECOMPUTE_STEPS];
    float* grads;
    float* weights;
    StatsRows stats;
    Fp8Counts* counts;
    size_t num_counts;
} RecomputeRun;

/*
 * RECOMPUTE_STEPS AdamW steps of two accumulated micro-batches on the reference batch at recompute level
 * `level`, FP8 statistics gathered on the first and read before its update, in the trainer's order (every
 * cast counted once, a replayed one not at all); unfused: every X amax by a separate op_amax.
 */
static inline RecomputeRun recompute_run(Precision p, int level, int unfused) {
    LlamaConfig cfg;
    checkpoint_read_config(REF_MODEL_PATH, &cfg);
    RefState r;
    ref_state_read(&r, REF_STATE_PATH, &cfg);
    enum { MICRO = 2 };
    int Bm = r.B / MICRO;
    Llama m;
    reference_model(&m, p, &cfg, &r, Bm, level);
    llama_set_fused_amax(&m, !unfused);
    RecomputeRun out;
    memset(&out, 0, sizeof(out));
    out.grads = (float*)mallocCheck(m.num_params * sizeof(float));
    out.weights = (float*)mallocCheck(m.num_params * sizeof(float));
    for (int step = 0; step < RECOMPUTE_STEPS; step++) {
        if (step == 0) llama_fp8_stats_begin(&m);
        llama_zero_grads(&m);
        double loss = 0.0;
        for (int k = 0; k < MICRO; k++) {
            size_t off = (size_t)k * Bm * r.T;
            loss += llama_forward(&m, r.inputs + off, r.targets + off, Bm, r.T, 1.0f / (float)(r.B * r.T));
            llama_backward(&m);
        }
        if (step == 0) {
            llama_get_grads(&m, out.grads);
            out.num_counts = p == PRECISION_FP8 ? llama_fp8_slots(&m) * FP8_OPS : 0;
            out.counts = (Fp8Counts*)mallocCheck(out.num_counts * sizeof(Fp8Counts) + 1);
            if (out.num_counts) dev_download(out.counts, m.fp8.counts, out.num_counts * sizeof(Fp8Counts));
            llama_fp8_stats_end(&m, collect_stats_row, &out.stats);
        }
        int bad;
        float norm = llama_grad_norm(&m, &bad);
        llama_update(&m, r.lr, r.weight_decay, step, clip_factor(norm, r.clip));
        out.losses[step] = (float)(loss / MICRO);
    }
    llama_get_params(&m, out.weights);
    llama_free(&m);
    ref_state_free(&r);
    return out;
}

/*
 * -r 1 and -r 2 against -r 0 in precision p: rebuilding norm and SwiGLU outputs, or replaying whole blocks
 * with the forward's FP8 scales, must leave the losses, gradients, weights and FP8 statistics bit for bit.
 */
static inline int check_recompute_in(Precision p) {
    LlamaConfig cfg;
    checkpoint_read_config(REF_MODEL_PATH, &cfg);
    size_t P = param_count(&cfg);
    RecomputeRun runs[RECOMPUTE_LEVELS];
    for (int level = 0; level < RECOMPUTE_LEVELS; level++) runs[level] = recompute_run(p, level, 0);
    int failures = 0;
    if (p == PRECISION_FP8 && runs[0].stats.n != (size_t)cfg.n_layers * LIN_PER_LAYER * FP8_OPS)
        failures += fail("%zu FP8 statistics rows, want one per operand", runs[0].stats.n);
    /* every element of a statistics step's operands counted once: W (OC, C), X (B T, C), dY (B T, OC) */
    RefState r;
    ref_state_read(&r, REF_STATE_PATH, &cfg);
    size_t tokens = (size_t)r.B * r.T;
    ref_state_free(&r);
    for (size_t i = 0; i < runs[0].num_counts; i++) {
        size_t slots = runs[0].num_counts / FP8_OPS, slot = i % slots, OC, C;
        int op = (int)(i / slots);
        llama_linear_dims(&cfg, (LinearId)(slot % LIN_PER_LAYER), &OC, &C);
        size_t want = op == FP8_OP_W ? OC * C : op == FP8_OP_X ? tokens * C : tokens * OC;
        if (runs[0].counts[i].count != want) {
            failures += fail("%s[layer %zu] %s: %llu elements counted, want %zu", LINEAR_NAMES[slot % LIN_PER_LAYER],
                             slot / LIN_PER_LAYER, FP8_OPERAND_NAMES[op], runs[0].counts[i].count, want);
            break;
        }
    }
    for (int level = 1; level < RECOMPUTE_LEVELS; level++) {
        RecomputeRun* a = &runs[0];
        RecomputeRun* b = &runs[level];
        printf("    %s -r %d: step losses %.9g %.9g (-r 0: %.9g %.9g)\n", precision_name(p), level, b->losses[0], b->losses[1],
               a->losses[0], a->losses[1]);
        if (memcmp(a->losses, b->losses, sizeof(a->losses)) != 0) failures += fail("-r %d: step losses differ from -r 0", level);
        if (memcmp(a->grads, b->grads, P * sizeof(float)) != 0) failures += fail("-r %d: gradients differ from -r 0", level);
        if (memcmp(a->weights, b->weights, P * sizeof(float)) != 0) failures += fail("-r %d: weights differ from -r 0", level);
        if (a->stats.n != b->stats.n || (a->stats.n && memcmp(a->stats.rows, b->stats.rows, a->stats.n * 4 * sizeof(double)) != 0))
            failures += fail("-r %d: FP8 statistics rows differ from -r 0 (another amax or scale)", level);
        if (a->num_counts && memcmp(a->counts, b->counts, a->num_counts * sizeof(Fp8Counts)) != 0)
            failures += fail("-r %d: FP8 cast counts differ from -r 0 (a replayed cast counted)", level);
    }
    for (int level = 0; level < RECOMPUTE_LEVELS; level++) {
        free(runs[level].grads);
        free(runs[level].weights);
        free(runs[level].stats.rows);
        free(runs[level].counts);
    }
    return failures != 0;
}

/*
 * llama_forward_deferred, as the trainer's micro-steps run it (the two halves of the reference batch,
 * each forward and backward, the losses read afterwards), against llama_forward on the same micro-batches:
 * the same losses, bit for bit, in precision p.
 */
static inline int check_forward_deferred_in(Precision p) {
    LlamaConfig cfg;
    checkpoint_read_config(REF_MODEL_PATH, &cfg);
    RefState r;
    ref_state_read(&r, REF_STATE_PATH, &cfg);
    enum { MICRO = 2 };
    int Bm = r.B / MICRO;
    Llama m;
    reference_model(&m, p, &cfg, &r, Bm, 0);
    float dloss = 1.0f / (float)(r.B * r.T);
    double* d_sums = (double*)dev_alloc(MICRO * sizeof(double));
    double sums[MICRO];
    float want[MICRO];
    for (int k = 0; k < MICRO; k++) {
        size_t off = (size_t)k * Bm * r.T;
        llama_forward_deferred(&m, r.inputs + off, r.targets + off, Bm, r.T, dloss, d_sums + k);
        llama_backward(&m);
    }
    dev_download(sums, d_sums, sizeof(sums));
    for (int k = 0; k < MICRO; k++) {
        size_t off = (size_t)k * Bm * r.T;
        want[k] = llama_forward(&m, r.inputs + off, r.targets + off, Bm, r.T, dloss);
    }
    int failures = 0;
    for (int k = 0; k < MICRO; k++) {
        float got = (float)(sums[k] / ((double)Bm * r.T));
        if (float_bits(got) != float_bits(want[k])) failures += fail("micro-step %d: deferred loss %.9g, llama_forward %.9g", k, got, want[k]);
    }
    if (!failures)
        printf("    %s: deferred micro-step losses %.9g %.9g equal llama_forward's bit for bit\n", precision_name(p), want[0], want[1]);
    dev_free(d_sums);
    llama_free(&m);
    ref_state_free(&r);
    return failures != 0;
}

/*
 * The producers' fused amax (llama_fused_x_amax: RMSNorm for wqkv and w13, SwiGLU for w2) against a
 * separate op_amax of every X, at -r 0 and -r 2 (whose replay must keep the forward's scales): losses,
 * gradients, weights, the FP8 statistics rows (amax and scale of every operand) and counts bit for bit.
 */
static inline int check_fused_amax_in(Precision p) {
    LlamaConfig cfg;
    checkpoint_read_config(REF_MODEL_PATH, &cfg);
    size_t P = param_count(&cfg);
    int failures = 0;
    const int levels[] = {RECOMPUTE_NONE, RECOMPUTE_BLOCKS};
    for (int i = 0; i < 2; i++) {
        RecomputeRun fused = recompute_run(p, levels[i], 0), unfused = recompute_run(p, levels[i], 1);
        printf("    -r %d: step losses fused %.9g %.9g, separate op_amax %.9g %.9g\n", levels[i], fused.losses[0],
               fused.losses[1], unfused.losses[0], unfused.losses[1]);
        if (memcmp(fused.losses, unfused.losses, sizeof(fused.losses)) != 0) failures += fail("-r %d: step losses differ", levels[i]);
        if (memcmp(fused.grads, unfused.grads, P * sizeof(float)) != 0) failures += fail("-r %d: gradients differ", levels[i]);
        if (memcmp(fused.weights, unfused.weights, P * sizeof(float)) != 0) failures += fail("-r %d: weights differ", levels[i]);
        if (fused.stats.n != unfused.stats.n ||
            (fused.stats.n && memcmp(fused.stats.rows, unfused.stats.rows, fused.stats.n * 4 * sizeof(double)) != 0))
            failures += fail("-r %d: FP8 statistics rows differ (another amax or scale)", levels[i]);
        if (fused.num_counts && memcmp(fused.counts, unfused.counts, fused.num_counts * sizeof(Fp8Counts)) != 0)
            failures += fail("-r %d: FP8 cast counts differ", levels[i]);
        RecomputeRun* runs[2] = {&fused, &unfused};
        for (int k = 0; k < 2; k++) {
            free(runs[k]->grads);
            free(runs[k]->weights);
            free(runs[k]->stats.rows);
            free(runs[k]->counts);
        }
    }
    return failures != 0;
}

/* Overwrites this rank's master weights, moments and their scale_inv with 0x7f bytes (3.4e38 as FP32, NaN
   or a large finite code in the others): whatever a load leaves unrestored then shows in the losses. */
static inline void poison_state(Llama* m) {
    StateFormats f = llama_state_formats(m);
    StoreCodec mc = master_codec(f.master_weights);
    size_t shard = m->layout.shard;
    void* arrays[] = {m->master, m->master_scale_inv, m->adam_m, m->adam_v, m->adam_scale_inv};
    size_t bytes[] = {shard * store_bytes(mc), store_scale_count(mc, shard) * sizeof(float), shard * adamw_moment_bytes(f.optim_state, 0),
                      shard * adamw_moment_bytes(f.optim_state, 1), adamw_scale_count(f.optim_state, shard) * sizeof(float)};
    for (size_t a = 0; a < sizeof(bytes) / sizeof(bytes[0]); a++) {
        if (bytes[a] == 0) continue;
        void* host = mallocCheck(bytes[a]);
        memset(host, 0x7f, bytes[a]);
        dev_upload(arrays[a], host, bytes[a]);
        free(host);
    }
}

/*
 * Save -> load -> continue in precision p: 3 AdamW steps, a checkpoint written with the trainer's
 * functions (train/shard_io.h), 3 more steps; then a fresh model restored from the checkpoint runs the
 * same 3 steps, its state poisoned before the load. Losses and final weights must be bit-identical (in fp8 the FP8 copies and scales are
 * rebuilt from the master weights: current scaling has no history), with the AdamW moments and master
 * weights stored as `formats` says.
 */
static inline int check_resume_with(Precision p, StateFormats formats) {
    LlamaConfig cfg;
    checkpoint_read_config(REF_MODEL_PATH, &cfg);
    RefState r;
    ref_state_read(&r, REF_STATE_PATH, &cfg);
    size_t P = param_count(&cfg), N = (size_t)r.B * r.T;
    char dir[] = "/tmp/llm8_resume_XXXXXX";
    if (mkdtemp(dir) == NULL) die("mkdtemp failed");
    RunIdentity id;
    memset(&id, 0, sizeof(id));
    id.cfg = cfg;
    id.B = r.B;
    id.T = r.T;
    id.precision = p;
    id.optim_state = formats.optim_state;
    id.master_weights = formats.master_weights;
    printf("  --optim-state %s --master-weights %s:\n", optim_state_name(formats.optim_state), master_format_name(formats.master_weights));
    float losses[2][3];
    float* final_weights[2];
    for (int run = 0; run < 2; run++) {
        Llama m;
        ModelOptions o = model_options(p, r.B, r.T);
        o.formats = formats;
        reference_model_opt(&m, &cfg, &o);
        int start = 0;
        if (run == 0) { /* a checkpoint before any update (fresh moments) is a valid state too: it loads */
            TrainState s;
            memset(&s, 0, sizeof(s));
            s.id = id;
            checkpoint_save(dir, &m, &s);
            checkpoint_load(dir, 0, &m, &id, &s);
        }
        if (run == 1) {
            TrainState s;
            poison_state(&m);
            checkpoint_load(dir, 3, &m, &id, &s);
            llama_refresh_working_weights(&m);
            start = s.step;
        }
        for (int step = start; step < 6; step++) {
            llama_zero_grads(&m);
            float l = llama_forward(&m, r.inputs, r.targets, r.B, r.T, 1.0f / (float)N);
            llama_backward(&m);
            int bad;
            float norm = llama_grad_norm(&m, &bad);
            llama_update(&m, r.lr, r.weight_decay, step, clip_factor(norm, r.clip));
            if (step >= 3) losses[run][step - 3] = l;
            if (run == 0 && step == 2) {
                TrainState s;
                memset(&s, 0, sizeof(s));
                s.step = 3;
                s.id = id;
                checkpoint_save(dir, &m, &s);
            }
        }
        final_weights[run] = (float*)mallocCheck(P * sizeof(float));
        llama_get_params(&m, final_weights[run]);
        llama_free(&m);
    }
    int failures = 0;
    for (int i = 0; i < 3; i++) {
        printf("    step %d: uninterrupted %.9g, resumed %.9g\n", i + 3, losses[0][i], losses[1][i]);
        if (memcmp(&losses[0][i], &losses[1][i], sizeof(float)) != 0) failures += fail("step %d loss differs after resume", i + 3);
    }
    if (memcmp(final_weights[0], final_weights[1], P * sizeof(float)) != 0) failures += fail("final weights differ after resume");
    char path[PATH_LEN];
    for (int step = 0; step <= 3; step += 3) {
        model_path(path, sizeof(path), dir, step);
        remove(path);
        state_path(path, sizeof(path), dir, step, 0);
        remove(path);
        snprintf(path, sizeof(path), "%s/DONE_%08d", dir, step);
        remove(path);
    }
    rmdir(dir);
    free(final_weights[0]);
    free(final_weights[1]);
    ref_state_free(&r);
    return failures != 0;
}

/* check_resume_with every --optim-state, then fp16 master weights with fp8 moments: the codes and scales
   must come back exactly. */
static inline int check_resume_in(Precision p) {
    int failures = 0;
    for (int f = OPTIM_STATE_FP32; f <= OPTIM_STATE_FP8; f++)
        failures += check_resume_with(p, (StateFormats){(OptimState)f, GRAD_FORMAT_FP32, MASTER_FP32});
    failures += check_resume_with(p, (StateFormats){OPTIM_STATE_FP8, GRAD_FORMAT_FP32, MASTER_FP16});
    return failures;
}

/*
 * The data-parallel driver on one rank (train/data_parallel.h): ZeRO-1 and ZeRO-2 (a reduce-scatter
 * into a shard, the ZeRO-2 bucket buffers, the communication library's one-rank collectives) give the
 * losses and weights of ZeRO-0 bit for bit, over steps of two accumulated micro-batches.
 */
static inline int check_zero_stages_in(Precision p) {
    LlamaConfig cfg;
    checkpoint_read_config(REF_MODEL_PATH, &cfg);
    RefState r;
    ref_state_read(&r, REF_STATE_PATH, &cfg);
    enum { STEPS = 3, MICRO = 2 };
    int Bm = r.B / MICRO;
    size_t P = param_count(&cfg);
    float losses[3][STEPS];
    float* weights[3];
    for (int z = 0; z < 3; z++) {
        Llama m;
        backend_init(p);
        ModelOptions o = model_options(p, Bm, r.T);
        o.sharding.zero_stage = z;
        llama_build(&m, &cfg, &o);
        float* params = (float*)mallocCheck(P * sizeof(float));
        checkpoint_read_params(REF_MODEL_PATH, &cfg, params);
        llama_set_params(&m, params);
        free(params);
        DataParallel dp;
        dp_init(&dp, &m, WIRE_F32);
        for (int step = 0; step < STEPS; step++) {
            dp_begin_step(&dp);
            double loss = 0.0;
            for (int k = 0; k < MICRO; k++) {
                dp.last_micro = k == MICRO - 1;
                size_t off = (size_t)k * Bm * r.T;
                loss += llama_forward(&m, r.inputs + off, r.targets + off, Bm, r.T, 1.0f / (float)(r.B * r.T));
                llama_backward(&m);
            }
            int bad;
            float norm = dp_grad_norm(&dp, &bad);
            dp_update(&dp, r.lr, r.weight_decay, step, clip_factor(norm, r.clip));
            losses[z][step] = (float)(loss / MICRO);
        }
        weights[z] = (float*)mallocCheck(P * sizeof(float));
        llama_get_params(&m, weights[z]);
        dp_free(&dp);
        llama_free(&m);
    }
    int failures = 0;
    for (int z = 1; z < 3; z++) {
        if (memcmp(losses[z], losses[0], sizeof(losses[0])) != 0) failures += fail("ZeRO-%d losses differ from ZeRO-0's", z);
        if (memcmp(weights[z], weights[0], P * sizeof(float)) != 0) failures += fail("ZeRO-%d weights differ from ZeRO-0's", z);
    }
    printf("    %s, %d steps of %d micro-batches: ZeRO-0/1/2 losses %.9g / %.9g / %.9g at the last step\n", precision_name(p),
           STEPS, MICRO, losses[0][STEPS - 1], losses[1][STEPS - 1], losses[2][STEPS - 1]);
    for (int z = 0; z < 3; z++) free(weights[z]);
    ref_state_free(&r);
    return failures != 0;
}

/*
 * An fp8 model whose block linears all run BF16 (the fallback, or --bf16-layers naming every block)
 * computes the bf16 recipe bit for bit at every recompute level, backward included (the BF16 inputs
 * rebuilt there, or replayed under -r 2); an fp8 model with only its last block in BF16 gives the same
 * gradient (two micro-batches) at every recompute level.
 */
static inline int check_bf16_linears_in_fp8_in(void) {
    float want_loss, got_loss;
    float* want = reference_gradient(PRECISION_BF16, 1, 0, BF16_LINEARS_NONE, &want_loss);
    LlamaConfig cfg;
    checkpoint_read_config(REF_MODEL_PATH, &cfg);
    size_t bytes = param_count(&cfg) * sizeof(float);
    int failures = 0;
    for (int level = 0; level < RECOMPUTE_LEVELS; level++) {
        for (int how = 0; how < 2; how++) {
            float* got = reference_gradient(PRECISION_FP8, 1, level, how == 0 ? BF16_LINEARS_SWITCH : BF16_LINEARS_EVERY_BLOCK, &got_loss);
            const char* name = how == 0 ? "linears_bf16" : "--bf16-layers naming every block";
            if (memcmp(&got_loss, &want_loss, sizeof(float)) != 0) failures += fail("%s -r %d: loss %.9g, bf16 recipe %.9g", name, level, got_loss, want_loss);
            if (memcmp(got, want, bytes) != 0) failures += fail("%s -r %d: gradients differ from the bf16 recipe's", name, level);
            free(got);
        }
    }
    printf("    every block linear BF16 in fp8, -r 0..%d: loss %.9g and gradients = the bf16 recipe's\n", RECOMPUTE_LEVELS - 1, want_loss);
    float* mixed = reference_gradient(PRECISION_FP8, 2, 0, BF16_LINEARS_LAST_BLOCK, NULL);
    for (int level = 1; level < RECOMPUTE_LEVELS; level++) {
        float* got = reference_gradient(PRECISION_FP8, 2, level, BF16_LINEARS_LAST_BLOCK, NULL);
        if (memcmp(got, mixed, bytes) != 0) failures += fail("last block BF16, -r %d: gradients differ from -r 0", level);
        free(got);
    }
    if (memcmp(mixed, want, bytes) == 0) failures += fail("last block BF16: the gradient is the bf16 recipe's (the other blocks ran no FP8)");
    free(mixed);
    free(want);
    return failures != 0;
}

/* Cosine and | |a| - |b| | / |b| of two gradients over the segments of `layer` (-1: all), in float64. */
static inline void grad_compare_direct(const LlamaConfig* cfg, const float* a, const float* b, int layer, double* cosine, double* norm_rel) {
    int nseg = param_segment_count(cfg);
    ParamSegment* seg = (ParamSegment*)mallocCheck((size_t)nseg * sizeof(ParamSegment));
    param_segments(cfg, seg);
    double ab = 0.0, aa = 0.0, bb = 0.0;
    for (int i = 0; i < nseg; i++) {
        if (layer >= 0 && seg[i].layer != layer) continue;
        for (size_t k = seg[i].param_offset; k < seg[i].param_offset + seg[i].count; k++) {
            ab += (double)a[k] * b[k];
            aa += (double)a[k] * a[k];
            bb += (double)b[k] * b[k];
        }
    }
    free(seg);
    *cosine = ab / sqrt(aa * bb);
    *norm_rel = fabs(sqrt(aa) - sqrt(bb)) / sqrt(bb);
}

/*
 * The shadow check's gradient comparison (train/shadow.h: three passes, no gradient copy) against the
 * two gradients computed one at a time and compared in float64, to `tol` in cosine and relative norm
 * difference; the shadow passes leave the gradients zeroed, and its BF16 loss is the bf16 recipe's.
 */
static inline int check_shadow_grad_compare_in(double tol) {
    LlamaConfig cfg;
    checkpoint_read_config(REF_MODEL_PATH, &cfg);
    RefState r;
    ref_state_read(&r, REF_STATE_PATH, &cfg);
    size_t P = param_count(&cfg);
    float loss16, loss8;
    float* g16 = reference_gradient(PRECISION_BF16, 1, 0, BF16_LINEARS_NONE, &loss16);
    float* g8 = reference_gradient(PRECISION_FP8, 1, 0, BF16_LINEARS_NONE, &loss8);
    Llama m;
    reference_model(&m, PRECISION_FP8, &cfg, &r, r.B, 0);
    Shadow sh;
    shadow_init(&sh, &m, 1);
    llama_zero_grads(&m);
    shadow_run(&sh, r.inputs, r.targets, r.B, r.T);
    ShadowResult got;
    shadow_finish(&sh, loss8, &got);
    int failures = 0;
    float* left = (float*)mallocCheck(P * sizeof(float));
    llama_get_grads(&m, left);
    for (size_t i = 0; i < P; i++) {
        if (left[i] != 0.0f) {
            failures += fail("the shadow passes left gradient %zu = %g (want 0)", i, left[i]);
            break;
        }
    }
    if ((float)got.loss_bf16 != loss16) failures += fail("shadow BF16 loss %.9g, bf16 recipe %.9g", got.loss_bf16, loss16);
    double whole, cos, rel;
    grad_compare_direct(&cfg, g8, g16, -1, &whole, &rel);
    printf("    whole model: cosine %.12f (direct %.12f), norm rel diff %.6e (direct %.6e)\n", got.cosine, whole, got.norm_rel, rel);
    if (!(fabs(got.cosine - whole) <= tol) || !(fabs(got.norm_rel - rel) <= tol)) failures += fail("whole-model comparison differs from the direct one");
    if (!(whole < 1.0 - 1e-9)) failures += fail("FP8 and BF16 gradients are equal: the comparison measures nothing");
    int worst = -1;
    double worst_cos = 0.0;
    for (int l = 0; l < cfg.n_layers; l++) {
        grad_compare_direct(&cfg, g8, g16, l, &cos, &rel);
        printf("    block %d: cosine %.12f, norm rel diff %.6e\n", l, cos, rel);
        if (worst < 0 || cos < worst_cos) {
            worst = l;
            worst_cos = cos;
        }
    }
    if (got.worst_layer != worst || !(fabs(got.worst_cosine - worst_cos) <= tol))
        failures += fail("worst block %d (cosine %.12f), direct %d (%.12f)", got.worst_layer, got.worst_cosine, worst, worst_cos);
    shadow_free(&sh);
    llama_free(&m);
    ref_state_free(&r);
    free(g16);
    free(g8);
    free(left);
    return failures != 0;
}
