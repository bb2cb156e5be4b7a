/*
 * The training program both builds run: arguments, the ranks' start-up agreement, model and data
 * set-up, the step loop (validation, samples, checkpoints, gradient accumulation, the data-parallel
 * reduction, clipping, AdamW, skip of non-finite steps), logging and exact resume. Included after a
 * backend and a communication implementation (cpu/backend.h + comm/comm_mpi.h, or cuda/backend.cuh +
 * comm/comm_nccl.cuh): train_llama.c and train_llama.cu are this file plus those two.
 *
 * Step k (0-based) of -x K: validation when k % -v == 0 or k == K; at k == K also the final checkpoint;
 * then, for k < K, grad_accum_steps micro-steps of forward + backward on every rank, the global
 * gradient norm, and the update. A step whose loss, gradient norm or FP8 amax is not finite on any rank
 * is skipped on every rank (docs/safety-net.md). On -p fp8 runs the FP8 safety net acts around the steps: the
 * shadow check and its fallback policy (shadow.h, shadow_policy.h) and the FP8 health alerts
 * (fp8_alerts.h). Rank 0 prints and logs; every rank takes every decision from values reduced over all
 * ranks, so all ranks decide the same.
 */
#pragma once

#include <omp.h>

#include "agreement.h"
#include "checkpoint.h"
#include "cli.h"
#include "data_parallel.h"
#include "evals.h"
#include "fp8_alerts.h"
#include "logger.h"
#include "memory_plan.h"
#include "preempt.h"
#include "shadow.h"
#include "shard_io.h"
#include "../dataloader/dataloader.h"
#include "../dataloader/manifest.h"
#include "../dataloader/tokenizer.h"
#include "../comm/watchdog.h"
#include "../core/op_record.h"
#include "../model/model.h"

/* Identifies the build in the start-up agreement (the Makefile passes git describe). */
#ifndef LLM8_BUILD_ID
#define LLM8_BUILD_ID "unknown"
#endif

typedef struct {
    TrainArgs args;
    LlamaConfig cfg;
    int from_checkpoint;
    int rank, world;
    int grad_accum_steps;
    int steps;
    DataLoader train, val;
    Llama model;
    DataParallel dp;
    Tokenizer tokenizer;
    Logger logger;
    Rng sample_rng;
    int step;               /* next step to run */
    int consecutive_skips;
    int total_skips;
    int overfit_loaded;     /* -a 1: the one batch is in tr->train */
    int stop_signal;        /* a stop signal reached some rank: checkpoint and exit (train/preempt.h) */
    double main_time;       /* wall_seconds when main began */
    double warmup_seconds;  /* trainer_warmup's */
    double start_time;      /* wall_seconds when the step loop began */
    double step_seconds;    /* time of the steps run by this process, for the ETA */
    int steps_run;
    char* bf16_blocks;      /* (L) --bf16-layers */
    ShadowPolicy shadow_policy;
    ShadowState shadow_state;
    Shadow shadow;
    Fp8Alerts alerts;
    int shadow_checks;      /* checks run by this process, their time, and the time of all its steps */
    double shadow_ms, step_ms;
    EvalSet evals[EVAL_KINDS];
    int eval_on[EVAL_KINDS]; /* the downstream evaluations this run does (train/evals.h) */
    double* loss_sums;      /* (grad_accum_steps) backend FP64: each micro-step's sum of token losses, read once a
                               step (8 bytes per micro-step, outside the memory plan) */
} Trainer;

/* Mixed into --seed for the sampling generator, so samples do not replay the init's draws ("sample" in ASCII). */
#define SAMPLE_SEED_SALT 0x73616d706c65ull

/* llm.c / PaLM (Chowdhery et al. 2022, appendix B) FLOPs per token of a training step: 6 N + 12 L C T. */
static inline double flops_per_token(const LlamaConfig* c, int T) {
    double n = (double)param_count(c) - (double)c->vocab_size * c->dim; /* the embedding lookup costs no FLOPs */
    return 6.0 * n + 12.0 * c->n_layers * c->dim * (double)T;
}

/* "1h02m", "3m10s" or "42s". */
static inline void format_duration(char* out, size_t len, double seconds) {
    long s = seconds > 0.0 ? (long)(seconds + 0.5) : 0;
    if (s >= 3600) snprintf(out, len, "%ldh%02ldm", s / 3600, (s % 3600) / 60);
    else if (s >= 60) snprintf(out, len, "%ldm%02lds", s / 60, s % 60);
    else snprintf(out, len, "%lds", s);
}

static inline RunIdentity trainer_identity(const Trainer* tr) {
    RunIdentity id;
    memset(&id, 0, sizeof(id));
    id.cfg = tr->cfg;
    id.B = tr->args.B;
    id.T = tr->args.T;
    const TrainArgs* a = &tr->args;
    id.precision = a->precision;
    id.shuffle = a->shuffle;
    id.pow2_scales = a->pow2_scales;
    id.recompute = a->recompute;
    id.fp8_accum = (int16_t)a->fp8_accum;
    id.fp8_fprop_slow_accum = (int16_t)!a->fp8_fast_accum;
    id.total_batch = (int64_t)tr->grad_accum_steps * a->B * a->T * tr->world;
    id.seed = a->seed;
    run_identity_set_bf16_blocks(&id, tr->bf16_blocks, tr->cfg.n_layers);
    id.fp8_recipe = a->fp8_recipe;
    id.amax_history = a->amax_history;
    id.amax_algo = a->amax_algo;
    id.fp8_margin = a->fp8_margin;
    id.optim_state = a->optim_state;
    id.grad_reduce = a->grad_reduce;
    id.grad_buffer = a->grad_buffer;
    id.master_weights = a->master_weights;
    return id;
}

/* The global fields of a checkpoint's state (checkpoint_save adds the layout). */
static inline TrainState trainer_state(const Trainer* tr) {
    TrainState s;
    memset(&s, 0, sizeof(s));
    s.step = tr->step;
    s.consecutive_skips = tr->consecutive_skips;
    s.total_skips = tr->total_skips;
    s.shadow = tr->shadow_state;
    s.data = dataloader_position(&tr->train);
    s.sample_rng = tr->sample_rng;
    s.id = trainer_identity(tr);
    s.fp8_history_steps = llama_fp8_history_steps(&tr->model);
    return s;
}

/* Writes the checkpoint of the current step (every rank). */
static inline void trainer_save(Trainer* tr) {
    watchdog_phase("checkpoint", tr->step);
    backend_range_push("checkpoint");
    TrainState s = trainer_state(tr);
    checkpoint_save(tr->args.output_dir, &tr->model, &s);
    backend_range_pop();
    printf("| checkpoint: step %d written to %s\n", tr->step, tr->args.output_dir);
}

/* Restores the newest complete checkpoint of -o (DONE marker, as rank 0 sees it) on every rank. */
static inline void trainer_resume(Trainer* tr) {
    const char* dir = tr->args.output_dir;
    int step = g_dist.rank == 0 ? checkpoint_latest_step(dir) : 0;
    comm_host_broadcast(&step, sizeof(step), 0);
    if (step < 0) die("%s: no complete checkpoint (DONE_<step> marker) to resume from", dir);
    if (step > tr->steps && tr->steps > 0) die("%s: the newest checkpoint is at step %d, past the run's -x %d steps", dir, step, tr->steps);
    TrainState s;
    RunIdentity id = trainer_identity(tr);
    checkpoint_load(dir, step, &tr->model, &id, &s);
    dp_refresh_weights(&tr->dp);
    dataloader_restore(&tr->train, s.data);
    tr->sample_rng = s.sample_rng;
    tr->step = s.step;
    tr->consecutive_skips = s.consecutive_skips;
    tr->total_skips = s.total_skips;
    tr->shadow_state = s.shadow;
    printf("| resumed from %s at step %d (saved by %d rank(s) with ZeRO-%d, now %d with ZeRO-%d)\n", dir, step, s.world,
           s.zero_stage, tr->world, tr->args.zero_stage);
    if (s.shadow.bf16) printf("| resumed in a BF16 fallback: %d BF16 step(s) done\n", s.shadow.bf16_steps);
}

/* The initial master weights: a checkpoint's (-e FILE) or a fresh init (-e PRESET), this rank's pieces. */
static inline void trainer_load_weights(Trainer* tr) {
    if (tr->from_checkpoint) model_load(tr->args.model, &tr->model);
    else model_init(&tr->model, (uint64_t)tr->args.seed);
    dp_refresh_weights(&tr->dp);
}

/*
 * Sum over every rank of the values that rank `rank` writes into slots [rank * per_rank, +per_rank) of
 * a vector of world * per_rank doubles (zero elsewhere), then summed in slot order: exact and
 * independent of the rank count, since each slot has one contributor.
 */
static inline double trainer_sum_slots(double* slots, size_t n) {
    comm_host_sum(slots, n);
    double total = 0.0;
    for (size_t i = 0; i < n; i++) total += slots[i];
    return total;
}

/*
 * Mean loss over -m global validation batches (all of them with -m -1), each of -d tokens as a training
 * step's, every rank its micro-batches: the same samples and the same sum for any rank count.
 */
static inline float trainer_val_loss(Trainer* tr) {
    DataLoader* d = &tr->val;
    long long available = dataloader_epoch_batches(d);
    long long n = tr->args.val_batches < 0 || tr->args.val_batches > available ? available : tr->args.val_batches;
    size_t W = (size_t)tr->world, A = (size_t)d->accum, slots_n = (size_t)n * A * W;
    double* slots = (double*)callocCheck(slots_n, sizeof(double));
    dataloader_reset(d);
    for (size_t i = 0; i < (size_t)n * A; i++) {
        watchdog_phase("validation", tr->step);
        dataloader_next_batch(d);
        slots[i * W + (size_t)tr->rank] = llama_forward(&tr->model, d->inputs, d->targets, d->B, d->T, 0.0f);
    }
    watchdog_phase("validation reduction", tr->step);
    double sum = trainer_sum_slots(slots, slots_n);
    free(slots);
    return (float)(sum / (double)slots_n);
}

/*
 * Prints -g tokens sampled from the model after BOS (temperature 1), one forward of (1, T) per token;
 * positions after the current one hold EOS and, attention being causal, do not affect it. Every rank
 * runs it (a forward's BF16 weights of an fp8 run may be all-gathered: llama_bf16_weight), drawing the
 * same tokens from the same logits and generator; rank 0 prints.
 */
static inline void trainer_sample(Trainer* tr) {
    Llama* m = &tr->model;
    int T = tr->args.T, V = tr->cfg.vocab_size;
    int* tokens = (int*)mallocCheck((size_t)T * sizeof(int));
    float* logits = (float*)mallocCheck((size_t)V * sizeof(float));
    for (int t = 0; t < T; t++) tokens[t] = LLAMA_EOS;
    tokens[0] = LLAMA_BOS;
    int n = tr->args.sample_tokens < T - 1 ? tr->args.sample_tokens : T - 1;
    printf("| sample: ");
    for (int t = 1; t <= n; t++) {
        llama_forward(m, tokens, NULL, 1, T, 0.0f);
        llama_logits_row(m, (size_t)t - 1, logits);
        float maxv = -INFINITY;
        for (int v = 0; v < V; v++) maxv = logits[v] > maxv ? logits[v] : maxv;
        double sum = 0.0;
        for (int v = 0; v < V; v++) sum += exp((double)(logits[v] - maxv));
        double coin = (double)rng_uniform(&tr->sample_rng) * sum, cdf = 0.0;
        int next = V - 1;
        for (int v = 0; v < V; v++) {
            cdf += exp((double)(logits[v] - maxv));
            if (coin < cdf) {
                next = v;
                break;
            }
        }
        tokens[t] = next;
        if (tr->rank == 0) tokenizer_print(&tr->tokenizer, tokens[t - 1], next);
        fflush(stdout);
    }
    printf("\n");
    free(tokens);
    free(logits);
}

/* One FP8 operand's statistics: a row of fp8_stats.csv, and the alerts it raises (console and metrics). */
static void trainer_emit_fp8(void* ctx, const Fp8OperandStats* o) {
    Trainer* tr = (Trainer*)ctx;
    logger_fp8(&tr->logger, tr->step, o->layer, o->gemm, o->operand, o->format, o->amax, o->scale, o->saturated_frac,
               o->underflow_frac);
    Fp8Alert alerts[ALERT_KINDS];
    int n = fp8_alerts_check(&tr->alerts, o, alerts);
    for (int i = 0; i < n; i++) {
        const char* kind = ALERT_NAMES[alerts[i].kind];
        printf("FP8 alert: step %d: %s[layer %d] %s: %s %.4g > %g\n", tr->step + 1, o->gemm, o->layer, o->operand, kind,
               alerts[i].value, alerts[i].threshold);
        logger_alert(&tr->logger, tr->step, kind, o->layer, o->gemm, o->operand, alerts[i].value, alerts[i].threshold);
    }
}

/* Path of tokenizer.bin: --tokenizer, else beside the first train shard. */
static inline void trainer_tokenizer_path(const Trainer* tr, char* out, size_t len) {
    if (tr->args.tokenizer_path) {
        snprintf(out, len, "%s", tr->args.tokenizer_path);
        return;
    }
    const char* first = tr->train.paths[0];
    const char* slash = strrchr(first, '/');
    if (slash == NULL) snprintf(out, len, "tokenizer.bin");
    else snprintf(out, len, "%.*s/tokenizer.bin", (int)(slash - first), first);
}

/* The start-up banner's lines on the FP8 safety net: which blocks run FP8, the shadow check, the alerts. */
static inline void trainer_print_safety_net(const Trainer* tr) {
    const TrainArgs* a = &tr->args;
    int L = tr->cfg.n_layers;
    char* fp8 = (char*)mallocCheck((size_t)L);
    for (int l = 0; l < L; l++) fp8[l] = !tr->bf16_blocks[l];
    char fp8_text[256], bf16_text[256];
    block_set_text(fp8, L, fp8_text, sizeof(fp8_text));
    block_set_text(tr->bf16_blocks, L, bf16_text, sizeof(bf16_text));
    free(fp8);
    printf("| FP8 blocks: %s of %d (BF16 by --bf16-layers: %s)\n", fp8_text, L, bf16_text);
    const ShadowPolicy* p = &tr->shadow_policy;
    if (p->every > 0) {
        printf("| shadow check every %d steps: the first micro-batch also in BF16%s; policy %s, tolerance %g", p->every,
               a->shadow_grad ? ", gradients compared" : "", p->fallback ? "fallback" : "warn", p->tol);
        if (p->fallback)
            printf(", patience %d, back to FP8 after %d BF16 steps%s", p->patience, p->recover, p->recover ? "" : " (never)");
        printf("\n");
    }
    if (a->fp8_stats_every > 0)
        printf("| FP8 alerts every %d steps: saturated share > %g, underflow share > %g, W or X amax growth > %g (0: off)\n",
               a->fp8_stats_every, a->alert_saturated, a->alert_underflow, a->alert_amax_growth);
}

/* This rank's settings for the start-up agreement (train/agreement.h). */
static inline RankSettings trainer_rank_settings(const Trainer* tr) {
    const TrainArgs* a = &tr->args;
    RankSettings r;
    memset(&r, 0, sizeof(r));
    r.id = trainer_identity(tr);
    r.zero_stage = a->zero_stage;
    r.steps = tr->steps;
    r.grad_accum_steps = tr->grad_accum_steps;
    r.val_every = a->val_every;
    r.val_batches = a->val_batches;
    r.ckpt_every = a->ckpt_every;
    r.sample_every = a->sample_every;
    r.resume = a->resume;
    r.fp8_stats_every = a->fp8_stats_every;
    r.max_skips = a->max_skips;
    r.overfit = a->overfit;
    r.warmup = a->warmup;
    r.shadow_every = a->shadow_every;
    r.shadow_grad = a->shadow_grad;
    r.shadow_fallback = tr->shadow_policy.fallback;
    r.shadow_patience = a->shadow_patience;
    r.shadow_recover = a->shadow_recover;
    r.shadow_tol = a->shadow_tol;
    r.eval_every = a->eval_every < 0 ? a->val_every : a->eval_every;
    r.warmup_pass = a->warmup_pass;
    r.eval_hellaswag = eval_set_hash(&tr->evals[EVAL_HELLASWAG]);
    r.eval_lambada = eval_set_hash(&tr->evals[EVAL_LAMBADA]);
    r.eval_wikitext = eval_set_hash(&tr->evals[EVAL_WIKITEXT]);
    r.schedule = a->schedule;
    r.lr = a->lr;
    r.final_lr_frac = a->final_lr_frac;
    r.weight_decay = a->weight_decay;
    r.grad_clip = a->grad_clip;
    r.train_tokens = (int64_t)dataloader_total_tokens(&tr->train);
    r.val_tokens = (int64_t)dataloader_total_tokens(&tr->val);
    snprintf(r.build, sizeof(r.build), "%s %s", LLM8_BUILD_ID, backend_name());
    backend_math_identity(r.math, sizeof(r.math));
    return r;
}

/*
 * Every check of the flags that needs neither the communicator nor the device, so that a cluster's
 * login node (no GPU) and a bad flag get their answer before NCCL starts: the ranges, the model -e
 * names with -b, -t and -p, the tokenizer, and an -o holding an earlier run. Fills cfg; returns whether
 * -e is a checkpoint. Stops naming the flag.
 */
static inline int trainer_check_args(const TrainArgs* a, LlamaConfig* cfg) {
    train_args_check(a);
    /* the GPU's accumulation is its tensor cores': only a backend that emulates them can model Hopper's */
    if (a->fp8_accum == FP8_ACCUM_HOPPER && !BACKEND_MODELS_FP8_ACCUM)
        die("flag --fp8-accum hopper: the %s build accumulates on the tensor cores themselves; the Hopper model runs in train_llama_cpu only",
            backend_name());
    int from_checkpoint = train_args_model(a, cfg);
    if (a->tokenizer_path != NULL && access(a->tokenizer_path, R_OK) != 0)
        die("flag --tokenizer: %s: cannot read (%s)", a->tokenizer_path, strerror(errno));
    if (a->precision == PRECISION_FP8 && a->sample_every > 0 && a->T % FP8_DIM_MULTIPLE != 0)
        die("flag -t %d: with -p fp8 and -s, samples run one sequence of -t tokens, which must be a multiple of %d", a->T,
            FP8_DIM_MULTIPLE);
    if (a->output_dir != NULL && !a->resume && checkpoint_latest_step(a->output_dir) >= 0)
        die("flag -o %s: holds the checkpoints of an earlier run (DONE_%08d); resume it with -y 1 or choose another -o",
            a->output_dir, checkpoint_latest_step(a->output_dir));
    return from_checkpoint;
}

/* This run's memory plan settings (train/memory_plan.h) on the job's ranks. */
static inline PlanSettings trainer_plan_settings(const Trainer* tr) {
    Sharding sharding = {tr->world, tr->rank, tr->args.zero_stage};
    return plan_settings(&tr->args, &tr->cfg, sharding, tr->bf16_blocks);
}

/*
 * Sizes every buffer the steps use outside the model's tables, from the memory plan's entries for this
 * run (plan_workspaces): the ops' and collectives' scratch, the upload staging, the BF16 weight scratch
 * of a run that can run a block linear in BF16, the checkpoint staging. After it no step allocates.
 */
static inline void trainer_reserve(Trainer* tr) {
    PlanSettings s = trainer_plan_settings(tr);
    MemoryEstimate ws[MAX_PLAN_WORKSPACES];
    int n = plan_workspaces(&tr->model, &s, ws);
    /* the options' BF16 weight scratch, also for a run resumed in the shadow policy's fallback without the check */
    if (tr->shadow_state.bf16) llama_reserve_bf16_weight(&tr->model);
    if (s.checkpoints) checkpoint_reserve_staging(&tr->model);
    backend_reserve_workspaces(ws, n, (size_t)tr->args.B * tr->args.T);
}

/*
 * Before the steps, on a backend that loads kernels, plans GEMMs and builds attention graphs at their first
 * use (BACKEND_WARMS_UP; docs/performance.md, "The first step"): otherwise step 1 pays for all of them
 * while its collectives run, and a kernel loaded by CUDA's lazy loading may synchronize the whole context.
 * Runs each once on a throwaway batch: the shadow check's passes where the run checks, a training
 * micro-step (forward, backward with the driver's reductions off, gradient norm) at the training shape,
 * which validation and evaluations share, and a sample's (1, T) forward where the run samples; then the
 * collectives of a step (dp_warmup) and the loading of the update's kernels (backend_load_kernels). cuDNN's
 * attention graphs of these shapes exist already (op_attention_prepare, trainer_init). Everything it
 * writes a step writes again before reading: gradients, activations, the FP8 records, flags and step
 * amaxes are reset when a step begins, so the run's results are those of a run without it.
 */
static inline void trainer_warmup(Trainer* tr) {
    if (!BACKEND_WARMS_UP || !tr->args.warmup_pass) return;
    double t0 = wall_seconds();
    watchdog_phase("warm-up", tr->step);
    Llama* m = &tr->model;
    int B = tr->args.B, T = tr->args.T;
    size_t N = (size_t)B * T;
    int* tokens = (int*)mallocCheck(N * sizeof(int));
    for (size_t i = 0; i < N; i++) tokens[i] = (int)(i % (size_t)tr->cfg.vocab_size);
    if (tr->shadow_policy.every > 0) shadow_run(&tr->shadow, tokens, tokens, B, T);
    /* the linears as the run has them; a run resumed in the BF16 fallback returns to FP8 later */
    ModelModes saved = llama_modes(m);
    Precision now = llama_linear_precision(m), recipe = tr->args.precision;
    tr->dp.local = 1;
    for (int pass = 0; pass < (now != recipe ? 2 : 1); pass++) {
        llama_set_linear_precision(m, pass == 0 ? now : recipe);
        llama_forward_deferred(m, tokens, tokens, B, T, 1.0f / (float)N, tr->loss_sums);
        llama_backward(m);
    }
    llama_set_modes(m, &saved);
    tr->dp.local = 0;
    int bad;
    llama_grad_norm_partials(m);
    (void)llama_grad_norm_total(m, &bad);
    if (tr->args.sample_every > 0 && B > 1) llama_forward(m, tokens, NULL, 1, T, 0.0f);
    dp_warmup(&tr->dp);
    backend_load_kernels();
    backend_synchronize();
    free(tokens);
    tr->warmup_seconds = wall_seconds() - t0;
}

/* Loads the downstream evaluation sets of -h 1, --eval-lambada and --eval-wikitext (every rank). */
static inline void trainer_load_evals(Trainer* tr) {
    const TrainArgs* a = &tr->args;
    const char* paths[EVAL_KINDS] = {a->hellaswag ? a->hellaswag_path : NULL, a->eval_lambada, a->eval_wikitext};
    for (int k = 0; k < EVAL_KINDS; k++) {
        if (paths[k] == NULL) continue;
        if (access(paths[k], R_OK) != 0)
            die("%s: cannot read the %s eval file (%s); write it with dev/data/%s.py", paths[k], EVAL_NAMES[k], strerror(errno),
                EVAL_NAMES[k]);
        eval_load(&tr->evals[k], (EvalKind)k, a->eval_compat, paths[k], a->eval_limit, a->T, tr->cfg.vocab_size, &tr->tokenizer);
        tr->eval_on[k] = 1;
    }
}

/* The start-up lines of the evaluation sets. */
static inline void trainer_print_evals(const Trainer* tr) {
    for (int k = 0; k < EVAL_KINDS; k++) {
        if (!tr->eval_on[k]) continue;
        const EvalSet* s = &tr->evals[k];
        printf("| eval %s (--eval-compat %s): %s, %d %s in %d rows of up to -t %d", EVAL_NAMES[k], EVAL_COMPAT_NAMES[s->compat],
               s->path, s->records, k == EVAL_WIKITEXT ? "documents" : "examples", s->n_rows, tr->args.T);
        if (s->truncated) printf(" (%d contexts cut from the left to fit)", s->truncated);
        printf("\n");
    }
}

/*
 * Joins the job (trainer_check_args gave cfg and from_checkpoint, then comm_init ran), checks that every
 * rank agrees, loads the model and data, and prepares (or resumes) the run.
 */
static inline void trainer_init(Trainer* tr, const TrainArgs* args, const LlamaConfig* cfg, int from_checkpoint) {
    memset(tr, 0, sizeof(*tr));
    tr->args = *args;
    TrainArgs* a = &tr->args;
    tr->rank = g_dist.rank;
    tr->world = g_dist.world;
    /* rank 0 speaks for the job; the others keep stderr for their errors */
    if (tr->rank != 0 && freopen("/dev/null", "w", stdout) == NULL) die("cannot silence stdout of rank %d", tr->rank);
    setvbuf(stdout, NULL, _IOLBF, 0); /* progress reaches a log file line by line, also when the run is killed */
    watchdog_start(a->comm_timeout);
    if (a->output_dir != NULL && tr->rank == 0) make_dir(a->output_dir);
    backend_init(a->precision);

    tr->cfg = *cfg;
    tr->from_checkpoint = from_checkpoint;
    tr->bf16_blocks = (char*)mallocCheck((size_t)tr->cfg.n_layers);
    bf16_layers_parse(a->bf16_layers, tr->cfg.n_layers, tr->bf16_blocks);
    tr->shadow_policy = (ShadowPolicy){a->shadow_every, a->shadow_policy == SHADOW_FALLBACK, a->shadow_tol, a->shadow_patience,
                                       a->shadow_recover};

    tr->grad_accum_steps = train_args_grad_accum(a, tr->world);
    train_args_check_grad_buffer(a, tr->world);
    long long total = (long long)tr->grad_accum_steps * a->B * a->T * tr->world;

    dataloader_init(&tr->train, a->train_pattern, a->B, a->T, tr->rank, tr->world, tr->grad_accum_steps, tr->cfg.vocab_size,
                    a->shuffle, (uint64_t)a->seed);
    dataloader_init(&tr->val, a->val_pattern, a->B, a->T, tr->rank, tr->world, tr->grad_accum_steps, tr->cfg.vocab_size, 0,
                    (uint64_t)a->seed);
    manifest_check(&tr->train, "-i", "train", tr->cfg.vocab_size);
    manifest_check(&tr->val, "-j", "val", tr->cfg.vocab_size);
    long long epoch_steps = dataloader_epoch_batches(&tr->train);
    tr->steps = a->steps >= 0 ? a->steps : (int)(epoch_steps > 0 ? epoch_steps : 1);
    char tok_path[PATH_LEN];
    trainer_tokenizer_path(tr, tok_path, sizeof(tok_path));
    /* HellaSwag's acc_norm needs each ending's bytes on every rank */
    if ((a->sample_every > 0 && tr->rank == 0) || a->hellaswag) tokenizer_init(&tr->tokenizer, tok_path);
    /* before the agreement, which compares the sets, and the model: a bad file stops before any allocation */
    trainer_load_evals(tr);
    RankSettings mine = trainer_rank_settings(tr);
    watchdog_phase("start-up agreement", 0);
    agreement_check(&mine);

    printf("+-----------------------------------------------------------------------\n");
    printf("| llm8 train_llama (%s build %s), precision %s\n", backend_name(), LLM8_BUILD_ID, precision_name(a->precision));
    printf("| math: %s\n", mine.math);
    llama_config_print(&tr->cfg);
    printf("| model from: %s\n", a->model);
    printf("| train: %s (%d shard(s), %zu tokens); val: %s (%zu tokens)\n", a->train_pattern, tr->train.num_shards,
           dataloader_total_tokens(&tr->train), a->val_pattern, dataloader_total_tokens(&tr->val));
    printf("| ranks: %d on %s (%d on this host), ZeRO-%d, gradients reduced in %s\n", tr->world, g_dist.host,
           g_dist.local_world, a->zero_stage, COMM_WIRE_NAMES[a->grad_reduce]);
    printf("| micro-batch %d x %d, %d rank(s), grad accumulation %d -> %lld tokens per step, %d steps\n", a->B, a->T,
           tr->world, tr->grad_accum_steps, total, tr->steps);
    printf("| lr %g (%s, warmup %d, final x%g), weight decay %g, clip %g, seed %lld, AdamW moments in %s, "
           "gradient buffer in %s, master weights in %s\n", a->lr, LR_SCHEDULE_NAMES[a->schedule], a->warmup, a->final_lr_frac,
           a->weight_decay, a->grad_clip, a->seed, optim_state_name(a->optim_state), grad_format_name(a->grad_buffer),
           master_format_name(a->master_weights));
    if (a->output_dir == NULL) printf("| warning: no -o: no logs, checkpoints or final model will be saved\n");
    if (a->precision == PRECISION_FP8) {
        printf("| FP8 GEMMs: accumulation %s%s, fprop fast accumulation %s\n", fp8_accum_name(a->fp8_accum),
               a->fp8_accum == FP8_ACCUM_HOPPER ? " (model of Hopper's tensor cores, unsplit)" : "",
               a->fp8_fast_accum ? "on" : "off");
        trainer_print_safety_net(tr);
    }

    trainer_print_evals(tr);
    Sharding sharding = {tr->world, tr->rank, a->zero_stage};
    ModelOptions opt = train_args_model_options(a, sharding, tr->bf16_blocks);
    llama_build(&tr->model, &tr->cfg, &opt);
    /* every attention shape of the run before step 1: training (B, T), whose forward validation and the
       evaluations share, and the samples' one sequence (1, T) */
    AttentionShape shapes[2] = {{a->B, a->T, 1}, {1, a->T, 0}};
    op_attention_prepare(shapes, a->sample_every > 0 ? 2 : 1, tr->cfg.n_heads, tr->cfg.n_kv_heads, llama_head_dim(&tr->cfg));
    tr->loss_sums = (double*)dev_alloc((size_t)tr->grad_accum_steps * sizeof(double));
    shadow_init(&tr->shadow, &tr->model, a->shadow_grad);
    Fp8AlertThresholds th = {a->alert_saturated, a->alert_underflow, a->alert_amax_growth};
    fp8_alerts_init(&tr->alerts, th, tr->cfg.n_layers);
    dp_init(&tr->dp, &tr->model, a->grad_reduce);
    watchdog_phase("loading weights", 0);
    trainer_load_weights(tr);
    printf("+-----------------------------------------------------------------------\n");

    rng_seed(&tr->sample_rng, (uint64_t)a->seed ^ SAMPLE_SEED_SALT);
    if (a->resume) trainer_resume(tr);
    trainer_reserve(tr);
    llama_set_linear_precision(&tr->model, tr->shadow_state.bf16 ? PRECISION_BF16 : a->precision);
    trainer_warmup(tr);
    /* -x 0 only evaluates: it appends to the logs of -o and drops nothing */
    if (tr->rank == 0)
        logger_init(&tr->logger, a->output_dir, tr->steps == 0 ? LOG_KEEP_ALL : a->resume ? tr->step : -1,
                    a->precision == PRECISION_FP8 && a->fp8_stats_every > 0);
}

/* Runs the downstream evaluations of the current step; rank 0 prints and logs the scores. */
static inline void trainer_evals(Trainer* tr) {
    for (int k = 0; k < EVAL_KINDS; k++) {
        if (!tr->eval_on[k]) continue;
        double t0 = wall_seconds();
        EvalScores sc = eval_run(&tr->model, &tr->evals[k], tr->rank, tr->world, tr->step, tr->args.eval_dump);
        printf("eval %s", EVAL_NAMES[k]);
        for (int i = 0; i < sc.n; i++) printf(" | %s %.6f", sc.names[i], sc.values[i]);
        printf(" | %d %s, %.1f s (step %d)\n", sc.records, k == EVAL_WIKITEXT ? "documents" : "examples", wall_seconds() - t0,
               tr->step);
        double llmc = NAN; /* llm.c's HellaSwag number, its main.log line */
        for (int i = 0; i < sc.n; i++) llmc = strcmp(sc.names[i], "acc_llmc") == 0 ? sc.values[i] : llmc;
        logger_eval(&tr->logger, tr->step, EVAL_NAMES[k], sc.names, sc.values, sc.n, sc.records, llmc);
    }
}

/* Logs a shadow check of the current step and applies the policy to it. */
static inline void trainer_shadow_report(Trainer* tr, const ShadowResult* r) {
    const ShadowPolicy* p = &tr->shadow_policy;
    ShadowState* st = &tr->shadow_state;
    tr->shadow_checks++;
    tr->shadow_ms += r->ms;
    int over = !(r->rel <= (double)p->tol);
    printf("shadow check: fp8 loss %.6f | bf16 loss %.6f | rel diff %.3e", r->loss_fp8, r->loss_bf16, r->rel);
    if (r->has_grad)
        printf(" | grad cos %.6f, norm rel diff %.3e; worst block %d: cos %.6f, norm rel diff %.3e", r->cosine, r->norm_rel,
               r->worst_layer, r->worst_cosine, r->worst_norm_rel);
    printf(" | %.1f ms%s\n", r->ms, over ? " | OVER --shadow-tol" : "");
    logger_shadow(&tr->logger, tr->step, r, over, tr->shadow_ms / tr->step_ms);
    if (!shadow_after_check(p, st, r->rel)) return;
    char reason[256];
    snprintf(reason, sizeof(reason), "relative loss difference %.3e over --shadow-tol %g in %d check(s) in a row; "
             "%d BF16 step(s) before FP8 again", r->rel, p->tol, p->patience, p->recover);
    printf("shadow policy: fallback to BF16 from step %d on: %s\n", tr->step + 2, reason);
    logger_event(&tr->logger, tr->step, "fallback", reason);
}

/* Counts a step run in BF16 by a fallback; returns the run to FP8 after --shadow-recover of them. */
static inline void trainer_shadow_bf16_step(Trainer* tr) {
    if (!shadow_after_bf16_step(&tr->shadow_policy, &tr->shadow_state)) return;
    char reason[128];
    snprintf(reason, sizeof(reason), "%d BF16 step(s) done (--shadow-recover)", tr->shadow_policy.recover);
    printf("shadow policy: back to FP8 from step %d on: %s\n", tr->step + 2, reason);
    logger_event(&tr->logger, tr->step, "recover", reason);
}

/*
 * Prints the phases of a profiled step (--profile): "profile step k: forward X ms | backward X ms |
 * optimizer X ms | other X ms | fp8 casts X ms (inside the others)", where optimizer runs from the global
 * norm (with its reductions across ranks) to the update, and other is the rest of the step's wall time
 * (loading batches, host time between phases).
 */
static inline void trainer_print_profile(const Trainer* tr, const double* phase_ms, double step_ms) {
    double other = step_ms;
    printf("profile step %d:", tr->step + 1);
    for (int p = 0; p < PROF_FP8_CAST; p++) {
        printf(" %s %.1f ms |", PROF_PHASE_NAMES[p], phase_ms[p]);
        other -= phase_ms[p];
    }
    printf(" other %.1f ms | %s %.1f ms (inside the others)\n", other, PROF_PHASE_NAMES[PROF_FP8_CAST], phase_ms[PROF_FP8_CAST]);
}

/* What one step carries from phase to phase (trainer_step). */
typedef struct {
    int stats_due, shadow_due, profiled;
    double t0;           /* wall_seconds at its start */
    double* slots;       /* (A W + 1) the micro-batches' losses, slot micro * world + rank */
    float first_loss;    /* this rank's FP8 loss of its first micro-batch: the shadow check's other side */
    double loss;         /* the step's mean loss over every micro-batch of every rank */
    float norm, lr;
    int bad;             /* the first segment with a non-finite gradient, or -1 */
    int fp8_nonfinite;   /* on this rank: fp8_bad names its first non-finite FP8 operand */
    double fp8_flag;     /* on any rank */
    char fp8_bad[128];
    int skip;
    ShadowResult shadow;
} StepState;

static inline StepState trainer_step_begin(Trainer* tr) {
    const TrainArgs* a = &tr->args;
    StepState st;
    memset(&st, 0, sizeof(st));
    st.stats_due = a->fp8_stats_every > 0 && tr->step % a->fp8_stats_every == 0;
    st.shadow_due = shadow_check_due(&tr->shadow_policy, &tr->shadow_state, tr->step);
    st.profiled = a->profile_every > 0 && (tr->step + 1) % a->profile_every == 0;
    if (st.profiled) backend_profile_begin();
    st.t0 = wall_seconds();
    st.slots = (double*)callocCheck((size_t)tr->grad_accum_steps * tr->world + 1, sizeof(double));
    return st;
}

/* The next micro-batch of the train data into tr->train (-a 1: the first one, always). */
static inline void trainer_next_batch(Trainer* tr) {
    int overfit = tr->args.overfit;
    if (overfit && tr->overfit_loaded) return;
    if (overfit) dataloader_reset(&tr->train);
    dataloader_next_batch(&tr->train);
    /* -a 1 keeps this batch; the loader stays at the start, where a checkpoint finds it */
    if (overfit) dataloader_reset(&tr->train);
    tr->overfit_loaded = overfit;
}

/* A due shadow check, on the step's first micro-batch: the BF16 side, before the FP8 step's casts. */
static inline void trainer_shadow_check(Trainer* tr) {
    watchdog_phase("shadow check", tr->step);
    shadow_run(&tr->shadow, tr->train.inputs, tr->train.targets, tr->args.B, tr->args.T);
}

/* Forward and backward of micro-batch `micro` into the gradients; its loss sum stays in loss_sums. */
static inline void trainer_forward_backward(Trainer* tr, int micro, float dloss) {
    Llama* m = &tr->model;
    tr->dp.last_micro = micro == tr->grad_accum_steps - 1;
    watchdog_phase("forward", tr->step);
    backend_timer_start(PROF_FORWARD);
    llama_forward_deferred(m, tr->train.inputs, tr->train.targets, tr->args.B, tr->args.T, dloss, tr->loss_sums + micro);
    backend_timer_stop(PROF_FORWARD);
    watchdog_phase("backward", tr->step);
    backend_timer_start(PROF_BACKWARD);
    llama_backward(m);
    backend_timer_stop(PROF_BACKWARD);
}

/*
 * The step's micro-steps: for each of grad_accum_steps micro-batches, its data, then forward and backward,
 * reading nothing back. A due shadow check runs first, on the first micro-batch; the step's own casts
 * then gather the statistics and the non-finite flags.
 */
static inline void trainer_micro_steps(Trainer* tr, const StepState* st) {
    const TrainArgs* a = &tr->args;
    Llama* m = &tr->model;
    float dloss = 1.0f / ((float)a->B * a->T * tr->grad_accum_steps * tr->world);
    dp_begin_step(&tr->dp);
    for (int micro = 0; micro < tr->grad_accum_steps; micro++) {
        trainer_next_batch(tr);
        if (micro == 0 && st->shadow_due) trainer_shadow_check(tr);
        if (micro == 0) llama_fp8_begin_step(m);
        if (micro == 0 && st->stats_due) llama_fp8_stats_begin(m);
        trainer_forward_backward(tr, micro, dloss);
    }
}

/* The micro-batches' losses, read back once for the whole step (waiting for the backward and its
   reductions) into this rank's slots. */
static inline void trainer_read_losses(Trainer* tr, StepState* st) {
    int A = tr->grad_accum_steps;
    watchdog_phase("gradient reduction", tr->step);
    double* loss_sums = (double*)mallocCheck((size_t)A * sizeof(double));
    dev_download(loss_sums, tr->loss_sums, (size_t)A * sizeof(double));
    for (int micro = 0; micro < A; micro++) {
        float micro_loss = (float)(loss_sums[micro] / ((double)tr->args.B * tr->args.T)); /* llama_forward's mean, bit for bit */
        st->slots[(size_t)micro * tr->world + tr->rank] = micro_loss;
        if (micro == 0) st->first_loss = micro_loss;
    }
    free(loss_sums);
}

/*
 * After the losses, what every rank must see the same: the delayed recipe's step amaxes, the gradient
 * norm, the FP8 non-finite flags and the stop signal (one MAX reduction). Opens the optimizer's profile
 * phase, which trainer_update closes.
 */
static inline void trainer_reduce(Trainer* tr, StepState* st) {
    Llama* m = &tr->model;
    dp_fp8_reduce_step_amax(&tr->dp);
    st->fp8_nonfinite = llama_fp8_nonfinite(m, st->fp8_bad, sizeof(st->fp8_bad));
    backend_timer_start(PROF_OPTIMIZER);
    st->norm = dp_grad_norm(&tr->dp, &st->bad);
    /* rank 0's skip line names its own operand; another rank names the one it saw */
    if (st->fp8_nonfinite && tr->rank != 0)
        fprintf(stderr, "rank %d: step %d: first non-finite FP8 operand: %s\n", tr->rank, tr->step + 1, st->fp8_bad);
    double flags[2] = {(double)st->fp8_nonfinite, (double)g_stop_signal};
    comm_host_max(flags, 2);
    st->fp8_flag = flags[0];
    tr->stop_signal = (int)flags[1];
}

/* From the reduced values, the same on every rank: the step's loss, the shadow check's result, the
   learning rate, and whether the step is skipped (a non-finite loss, gradient norm or FP8 amax). */
static inline void trainer_decide(Trainer* tr, StepState* st) {
    const TrainArgs* a = &tr->args;
    size_t n = (size_t)tr->grad_accum_steps * tr->world;
    st->loss = trainer_sum_slots(st->slots, n) / (double)n;
    if (st->shadow_due) {
        watchdog_phase("shadow check reduction", tr->step);
        shadow_finish(&tr->shadow, st->first_loss, &st->shadow);
    }
    st->lr = lr_at_step(a->schedule, a->lr, a->warmup, a->final_lr_frac, tr->step, tr->steps);
    st->skip = !isfinite(st->loss) || !isfinite(st->norm) || st->fp8_flag != 0.0;
}

/* A statistics step's FP8 rows and alerts, before the update casts the next step's weights (the W rows
   are the copies this step used). */
static inline void trainer_fp8_stats(Trainer* tr) {
    dp_fp8_stats_end(&tr->dp, trainer_emit_fp8, tr);
    logger_flush(&tr->logger);
}

/* AdamW and the delayed recipe's update, or the skip of a non-finite step (stopping after --max-skips in
   a row); closes the optimizer's profile phase. */
static inline void trainer_update(Trainer* tr, const StepState* st) {
    const TrainArgs* a = &tr->args;
    Llama* m = &tr->model;
    watchdog_phase("optimizer", tr->step);
    if (!st->skip) {
        dp_update(&tr->dp, st->lr, a->weight_decay, tr->step - tr->total_skips, clip_factor(st->norm, a->grad_clip));
        llama_fp8_delayed_push(m);
        tr->consecutive_skips = 0;
    } else {
        tr->consecutive_skips++;
        tr->total_skips++;
        char name[128] = "none";
        if (st->bad >= 0) llama_segment_name(m, st->bad, name, sizeof(name));
        printf("step %d skipped: loss %f, grad norm %f, first non-finite gradient: %s, first non-finite FP8 operand: %s (%d in a row)\n",
               tr->step + 1, (float)st->loss, st->norm, name,
               st->fp8_flag != 0.0 ? (st->fp8_nonfinite ? st->fp8_bad : "on another rank") : "none", tr->consecutive_skips);
        if (tr->consecutive_skips >= a->max_skips)
            die("%d consecutive steps with a non-finite loss, gradient or FP8 amax (--max-skips %d): stopping", tr->consecutive_skips,
                a->max_skips);
    }
    backend_timer_stop(PROF_OPTIMIZER);
}

/* After the first step of this process: how long it took to get there, and the memory plan against what
   the run holds (train/memory_plan.h memory_report, on a backend that measures it). */
static inline void trainer_first_step_report(Trainer* tr, const StepState* st, double ms) {
    printf("| time to the first step: %.1f s from main to the end of step %d: start-up %.1f s (warm-up %.1f s), "
           "what ran before the step %.1f s, the step %.1f s\n", wall_seconds() - tr->main_time, tr->step + 1,
           tr->start_time - tr->main_time, tr->warmup_seconds, st->t0 - tr->start_time, ms / 1e3);
    PlanSettings plan = trainer_plan_settings(tr);
    if (tr->rank == 0) memory_report(&tr->model, &plan);
}

/* The step's line: loss, learning rate, gradient norm, time, tokens/s, MFU, exposed communication, the
   time elapsed and the ETA. */
static inline void trainer_print_step(Trainer* tr, const StepState* st, double ms, double tok_s, double mfu, double comm_ms) {
    printf("step %4d/%d | loss %.6f | lr %.2e | norm %.4f | %.1f ms | %.0f tok/s", tr->step + 1, tr->steps, (float)st->loss, st->lr,
           st->norm, ms, tok_s);
    if (mfu > 0.0) printf(" | MFU %.1f%%", 100.0 * mfu);
    if (tr->world > 1) printf(" | comm %.1f ms", comm_ms);
    tr->step_seconds += ms / 1e3;
    tr->steps_run++;
    char elapsed[32], eta[32];
    format_duration(elapsed, sizeof(elapsed), wall_seconds() - tr->start_time);
    format_duration(eta, sizeof(eta), tr->step_seconds / tr->steps_run * (tr->steps - tr->step - 1));
    printf(" | %s elapsed, ETA %s\n", elapsed, eta);
}

/* After the step's work has finished: its line, its profile, its metrics row and the shadow check's report. */
static inline void trainer_log_step(Trainer* tr, const StepState* st) {
    const TrainArgs* a = &tr->args;
    backend_synchronize();
    double comm_ms = comm_exposed_ms();
    double ms = (wall_seconds() - st->t0) * 1e3;
    double phase_ms[PROF_PHASES];
    backend_profile_end(phase_ms);
    double tok_s = (double)tr->grad_accum_steps * a->B * a->T * tr->world / (ms / 1e3);
    double peak = backend_peak_flops(a->precision);
    double mfu = peak > 0.0 ? flops_per_token(&tr->cfg, a->T) * tok_s / (peak * tr->world) : 0.0;
    trainer_print_step(tr, st, ms, tok_s, mfu, comm_ms);
    if (st->profiled) trainer_print_profile(tr, phase_ms, ms);
    if (tr->steps_run == 1) trainer_first_step_report(tr, st, ms);
    const char* linears = precision_name(llama_linear_precision(&tr->model));
    logger_train(&tr->logger, tr->step, (float)st->loss, st->lr, st->norm, ms, tok_s, mfu, backend_memory_mib(), comm_ms, st->skip,
                 linears);
    tr->step_ms += ms;
    if (st->shadow_due) trainer_shadow_report(tr, &st->shadow);
}

/* The shadow policy's decision for the next step: its linears in BF16 or FP8 (validation and samples too). */
static inline void trainer_next_recipe(Trainer* tr, const StepState* st) {
    Llama* m = &tr->model;
    if (!st->shadow_due && tr->shadow_state.bf16) trainer_shadow_bf16_step(tr);
    int bf16 = llama_linear_precision(m) != tr->args.precision;
    if (bf16 && !tr->shadow_state.bf16) fp8_alerts_restart(&tr->alerts, tr->cfg.n_layers);
    llama_set_linear_precision(m, tr->shadow_state.bf16 ? PRECISION_BF16 : tr->args.precision);
}

/* The step's work, from its micro-steps to its update: what --dry-run 2 lists (step_ops_main). */
static inline void trainer_step_work(Trainer* tr, StepState* st) {
    trainer_micro_steps(tr, st);
    trainer_read_losses(tr, st);
    trainer_reduce(tr, st);
    trainer_decide(tr, st);
    if (st->stats_due) trainer_fp8_stats(tr);
    trainer_update(tr, st);
}

/* The run an op record describes, as the JSON fields before its "ops" (core/op_record.h). */
static inline void trainer_record_run(const Trainer* tr, char* out, size_t len) {
    const TrainArgs* a = &tr->args;
    snprintf(out, len, "\"model\": \"%s\", \"precision\": \"%s\", \"B\": %d, \"T\": %d, \"ranks\": %d, \"zero\": %d, "
             "\"recompute\": %d, \"grad_accum\": %d, \"grad_reduce\": \"%s\", ", a->model, precision_name(a->precision),
             a->B, a->T, tr->world, a->zero_stage, a->recompute, tr->grad_accum_steps, COMM_WIRE_NAMES[a->grad_reduce]);
}

/*
 * One optimizer step on every rank: the micro-steps (data, shadow check, forward and backward), the
 * losses read back, the reductions, the decisions every rank shares (the skip), the update, the log.
 * The loss of micro-batch (micro, rank) goes to slot micro * world + rank, so the step's loss is the
 * same sum for any rank count.
 */
static inline void trainer_step(Trainer* tr) {
    StepState st = trainer_step_begin(tr);
    int traced = BACKEND_RECORDS && op_trace_begin(!st.stats_due && !st.shadow_due);
    trainer_step_work(tr, &st);
    if (traced) {
        char run[512];
        trainer_record_run(tr, run, sizeof(run));
        op_trace_end(tr->rank, run);
    }
    trainer_log_step(tr, &st);
    trainer_next_recipe(tr, &st);
    free(st.slots);
    tr->step++;
}

/* Ranks sharing a node share its cores: OpenMP threads spinning on more cores than there are slow
   every rank down by orders of magnitude. OMP_NUM_THREADS, when set, decides. */
static inline void share_cores(void) {
    if (g_dist.local_world <= 1 || getenv("OMP_NUM_THREADS") != NULL) return;
    int threads = omp_get_num_procs() / g_dist.local_world;
    omp_set_num_threads(threads > 0 ? threads : 1);
}

static inline void trainer_free(Trainer* tr) {
    if (tr->loss_sums) dev_free(tr->loss_sums);
    checkpoint_release_staging();
    for (int k = 0; k < EVAL_KINDS; k++) eval_free(&tr->evals[k]);
    logger_free(&tr->logger);
    shadow_free(&tr->shadow);
    fp8_alerts_free(&tr->alerts);
    free(tr->bf16_blocks);
    dp_free(&tr->dp);
    llama_free(&tr->model);
    tokenizer_free(&tr->tokenizer);
    dataloader_free(&tr->train);
    dataloader_free(&tr->val);
    free(tr);
}

/*
 * --dry-run 2 (after the memory plan): the ops of one optimizer step of the flags' run on --ranks N, as
 * rank 0 runs them, printed as one line "ops: {...}" (core/op_record.h's JSON). The trainer is set up as
 * trainer_init sets it up, without data, checkpoints or the safety net, over buffers the plan-only mode
 * maps but never backs; then trainer_step_work runs twice, ops skipped, and the second (a step after
 * the first, as LLM8_TRACE_OPS records) is listed. No FP8 statistics or shadow check is due in it.
 */
static inline int step_ops_main(const TrainArgs* args) {
    Trainer* tr = (Trainer*)callocCheck(1, sizeof(Trainer));
    tr->args = *args;
    TrainArgs* a = &tr->args;
    train_args_model(a, &tr->cfg);
    g_dist.world = tr->world = a->plan_ranks > 0 ? a->plan_ranks : 1;
    g_dist.rank = tr->rank = 0;
    tr->grad_accum_steps = train_args_grad_accum(a, tr->world);
    tr->steps = 2;
    tr->bf16_blocks = (char*)mallocCheck((size_t)tr->cfg.n_layers);
    bf16_layers_parse(a->bf16_layers, tr->cfg.n_layers, tr->bf16_blocks);
    backend_init(a->precision);
    g_record_mode = RECORD_PLAN;
    Sharding sharding = {tr->world, 0, a->zero_stage};
    ModelOptions opt = train_args_model_options(a, sharding, tr->bf16_blocks);
    llama_build(&tr->model, &tr->cfg, &opt);
    tr->loss_sums = (double*)dev_alloc((size_t)tr->grad_accum_steps * sizeof(double));
    dp_init(&tr->dp, &tr->model, a->grad_reduce);
    dp_refresh_weights(&tr->dp);
    llama_set_linear_precision(&tr->model, a->precision);
    /* the step's batch: zero tokens, held as -a 1 holds its one batch */
    size_t N = (size_t)a->B * a->T;
    tr->train.inputs = (int*)callocCheck(N, sizeof(int));
    tr->train.targets = (int*)callocCheck(N, sizeof(int));
    a->overfit = tr->overfit_loaded = 1;
    for (tr->step = 0; tr->step < tr->steps; tr->step++) {
        StepState st;
        memset(&st, 0, sizeof(st));
        st.slots = (double*)callocCheck((size_t)tr->grad_accum_steps * tr->world + 1, sizeof(double));
        g_record_collect = tr->step == 1;
        trainer_step_work(tr, &st);
        free(st.slots);
    }
    g_record_collect = 0;
    char run[512];
    trainer_record_run(tr, run, sizeof(run));
    printf("ops: ");
    op_record_write(stdout, run);
    return EXIT_SUCCESS;
}

/* The whole run on this rank. Returns the process exit status: 0, or EXIT_PREEMPTED after a stop signal. */
static inline int train_main(int argc, char** argv) {
    double main_time = wall_seconds();
    TrainArgs args = train_args_default();
    int help = train_args_parse(&args, argc, argv);
    /* --help, every flag check and a dry run come before the communicator and the device: a cluster's
       login node has no GPU, and a bad flag should not wait for NCCL */
    if (help) {
        if (launcher_rank() == 0) train_args_usage(argv[0]);
        return EXIT_SUCCESS;
    }
    if (args.dry_run) {
        train_args_check(&args);
        if (args.dry_run == 2 && !BACKEND_RECORDS)
            die("flag --dry-run 2: the %s build does not record its ops; run train_llama_cpu with the same flags (the list does not "
                "depend on the device)", backend_name());
        int status = memory_plan_main(&args);
        return args.dry_run == 2 ? step_ops_main(&args) : status;
    }
    LlamaConfig cfg;
    int from_checkpoint = trainer_check_args(&args, &cfg);
    comm_init(&argc, &argv);
    share_cores();
    preempt_install();
    Trainer* tr = (Trainer*)callocCheck(1, sizeof(Trainer));
    trainer_init(tr, &args, &cfg, from_checkpoint);
    tr->main_time = main_time;
    TrainArgs* a = &tr->args;
    int start = tr->step;
    tr->start_time = wall_seconds();
    /* the steps allocate nothing and never synchronize the whole device (checkpoints apart: their own
       range); the emulated GPU counts both per range (docs/emulated-gpu.md) */
    backend_range_push("step loop");
    for (;;) {
        int last = tr->step >= tr->steps;
        if (last || (a->val_every > 0 && tr->step % a->val_every == 0)) {
            float val = trainer_val_loss(tr);
            printf("val loss %.6f (step %d)\n", val, tr->step);
            logger_val(&tr->logger, tr->step, val);
        }
        int eval_every = a->eval_every < 0 ? a->val_every : a->eval_every;
        if (last || (eval_every > 0 && tr->step % eval_every == 0)) trainer_evals(tr);
        int due = a->ckpt_every == NO_CHECKPOINTS ? 0 : last || (a->ckpt_every > 0 && tr->step % a->ckpt_every == 0);
        if (a->output_dir && tr->step > start && due) trainer_save(tr);
        /* every rank samples (the same tokens; rank 0 prints them): a forward may all-gather weights */
        if (a->sample_every > 0 && (last || tr->step % a->sample_every == 0)) {
            watchdog_phase("sample", tr->step);
            trainer_sample(tr);
        }
        if (last) break;
        trainer_step(tr);
        if (tr->stop_signal && tr->step < tr->steps) {
            printf("| %s: stopping after step %d\n", signal_name(tr->stop_signal), tr->step);
            if (a->output_dir && a->ckpt_every != NO_CHECKPOINTS) trainer_save(tr);
            else printf("| %s: nothing is saved\n", a->output_dir ? "-n -1" : "no -o");
            backend_range_pop();
            watchdog_phase("shutdown", tr->step);
            comm_barrier();
            trainer_free(tr);
            watchdog_stop();
            comm_finalize();
            return EXIT_PREEMPTED;
        }
    }
    backend_range_pop();
    if (tr->shadow_checks > 0)
        printf("| shadow checks: %d, %.1f ms each on average, %.2f%% of the step time of this run\n", tr->shadow_checks,
               tr->shadow_ms / tr->shadow_checks, 100.0 * tr->shadow_ms / tr->step_ms);
    watchdog_phase("shutdown", tr->step);
    comm_barrier();
    trainer_free(tr);
    watchdog_stop();
    comm_finalize();
    return EXIT_SUCCESS;
}
