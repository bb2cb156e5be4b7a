/*
 * The training program both builds run: arguments, model and data set-up, the step loop (validation,
 * samples, checkpoints, gradient accumulation, clipping, AdamW, skip of non-finite steps), logging and
 * exact resume. Included after a backend (cpu/backend.h or cuda/backend.cuh): train_llama.c and
 * train_llama.cu are this file plus a backend.
 *
 * Step k (0-based) of -x K: validation when k % -v == 0 or k == K; at k == K also the final checkpoint;
 * then, for k < K, grad_accum_steps micro-steps of forward + backward, the global gradient norm, and
 * the update. A step whose loss, gradient norm or FP8 amax is not finite is skipped (DESIGN.md 7).
 */
#pragma once

#include "checkpoint.h"
#include "cli.h"
#include "logger.h"
#include "../dataloader/dataloader.h"
#include "../dataloader/tokenizer.h"
#include "../llama/model.h"

typedef struct {
    TrainArgs args;
    LlamaConfig cfg;
    int from_checkpoint;
    int rank, world;
    int grad_accum_steps;
    int steps;
    DataLoader train, val;
    Llama model;
    Tokenizer tokenizer;
    Logger logger;
    Rng sample_rng;
    int step;               /* next step to run */
    int consecutive_skips;
    int total_skips;
    int overfit_loaded;     /* -a 1: the one batch is in tr->train */
} Trainer;

/* Mixed into --seed for the sampling generator, so samples do not replay the init's draws ("sample" in ASCII). */
#define SAMPLE_SEED_SALT 0x73616d706c65ull

/* llm.c / PaLM (Chowdhery et al. 2022, appendix B) FLOPs per token of a training step: 6 N + 12 L C T. */
static inline double flops_per_token(const LlamaConfig* c, int T) {
    double n = (double)param_count(c) - (double)c->vocab_size * c->dim; /* the embedding lookup costs no FLOPs */
    return 6.0 * n + 12.0 * c->n_layers * c->dim * (double)T;
}

static inline RunIdentity trainer_identity(const Trainer* tr) {
    RunIdentity id;
    memset(&id, 0, sizeof(id));
    id.cfg = tr->cfg;
    id.B = tr->args.B;
    id.T = tr->args.T;
    id.world = tr->world;
    id.zero_stage = tr->args.zero_stage;
    id.precision = tr->args.precision;
    id.shuffle = tr->args.shuffle;
    id.pow2_scales = tr->args.pow2_scales;
    id.recompute = tr->args.recompute;
    id.total_batch = (int64_t)tr->grad_accum_steps * tr->args.B * tr->args.T * tr->world;
    id.seed = tr->args.seed;
    return id;
}

/* Host staging buffer for moving weights and optimizer state between files and the device: 64 MiB, so
   that checkpointing a 13B model needs no host copy of it. */
#define STREAM_CHUNK_FLOATS ((size_t)1 << 24)

/* Writes n floats of device (or, in the CPU build, host) memory to f through buf (STREAM_CHUNK_FLOATS). */
static inline void stream_to_file(FILE* f, const float* src, size_t n, float* buf, const char* what) {
    for (size_t off = 0; off < n; off += STREAM_CHUNK_FLOATS) {
        size_t count = n - off < STREAM_CHUNK_FLOATS ? n - off : STREAM_CHUNK_FLOATS;
        dev_download(buf, src + off, count * sizeof(float));
        fwriteCheck(buf, sizeof(float), count, f, what);
    }
}

/* Reads n floats from f into device (or host) memory through buf. */
static inline void stream_from_file(FILE* f, float* dst, size_t n, float* buf, const char* what) {
    for (size_t off = 0; off < n; off += STREAM_CHUNK_FLOATS) {
        size_t count = n - off < STREAM_CHUNK_FLOATS ? n - off : STREAM_CHUNK_FLOATS;
        freadCheck(buf, sizeof(float), count, f, what);
        dev_upload(dst + off, buf, count * sizeof(float));
    }
}

/* Writes model_<step>.bin (rank 0), this rank's state_<step>_<rank>.bin, then DONE_<step>. */
static inline void trainer_save(Trainer* tr) {
    const char* dir = tr->args.output_dir;
    Llama* m = &tr->model;
    size_t P = m->num_params;
    char path[PATH_LEN], tmp[TMP_PATH_LEN];
    float* buf = (float*)mallocCheck(STREAM_CHUNK_FLOATS * sizeof(float));
    if (tr->rank == 0) {
        model_path(path, sizeof(path), dir, tr->step);
        FILE* f = checkpoint_write_begin(path, tmp, sizeof(tmp), &tr->cfg);
        stream_to_file(f, m->master, P, buf, tmp);
        atomic_commit(f, tmp, path);
    }
    TrainState s;
    memset(&s, 0, sizeof(s));
    s.step = tr->step;
    s.rank = tr->rank;
    s.consecutive_skips = tr->consecutive_skips;
    s.total_skips = tr->total_skips;
    s.data = dataloader_position(&tr->train);
    s.sample_rng = tr->sample_rng;
    s.id = trainer_identity(tr);
    s.shard_begin = 0;
    s.shard_count = P;
    state_path(path, sizeof(path), dir, tr->step, tr->rank);
    FILE* f = state_write_begin(path, tmp, sizeof(tmp), &s);
    stream_to_file(f, m->adam_m, P, buf, tmp);
    stream_to_file(f, m->adam_v, P, buf, tmp);
    stream_to_file(f, m->master, P, buf, tmp);
    atomic_commit(f, tmp, path);
    if (tr->rank == 0) checkpoint_mark_done(dir, tr->step);
    printf("| checkpoint: step %d written to %s\n", tr->step, dir);
    free(buf);
}

/* Restores the newest complete checkpoint of -o (DONE marker) into the trainer. */
static inline void trainer_resume(Trainer* tr) {
    const char* dir = tr->args.output_dir;
    int step = checkpoint_latest_step(dir);
    if (step < 0) die("%s: no complete checkpoint (DONE_<step> marker) to resume from", dir);
    if (step > tr->steps) die("%s: the newest checkpoint is at step %d, past the run's -x %d steps", dir, step, tr->steps);
    Llama* m = &tr->model;
    size_t P = m->num_params;
    char path[PATH_LEN];
    TrainState s;
    RunIdentity id = trainer_identity(tr);
    state_path(path, sizeof(path), dir, step, tr->rank);
    FILE* f = state_open(path, &s, &id, 0, P);
    if (s.step != step || s.rank != tr->rank) die("%s: holds step %d rank %d, expected step %d rank %d", path, s.step, s.rank, step, tr->rank);
    float* buf = (float*)mallocCheck(STREAM_CHUNK_FLOATS * sizeof(float));
    stream_from_file(f, m->adam_m, P, buf, path);
    stream_from_file(f, m->adam_v, P, buf, path);
    stream_from_file(f, m->master, P, buf, path);
    fcloseCheck(f, path);
    free(buf);
    llama_refresh_working_weights(m);
    dataloader_restore(&tr->train, s.data);
    tr->sample_rng = s.sample_rng;
    tr->step = s.step;
    tr->consecutive_skips = s.consecutive_skips;
    tr->total_skips = s.total_skips;
    printf("| resumed from %s at step %d\n", path, step);
}

/* The initial master weights: a checkpoint's (-e FILE) or a fresh init (-e PRESET), streamed to the device. */
static inline void trainer_load_weights(Trainer* tr) {
    Llama* m = &tr->model;
    size_t P = m->num_params;
    float* buf = (float*)mallocCheck(STREAM_CHUNK_FLOATS * sizeof(float));
    if (tr->from_checkpoint) {
        LlamaConfig file_cfg;
        FILE* f = checkpoint_open(tr->args.model, &file_cfg);
        stream_from_file(f, m->master, P, buf, tr->args.model);
        fcloseCheck(f, tr->args.model);
    } else {
        for (size_t off = 0; off < P; off += STREAM_CHUNK_FLOATS) {
            size_t count = P - off < STREAM_CHUNK_FLOATS ? P - off : STREAM_CHUNK_FLOATS;
            llama_init_params_range(&tr->cfg, (uint64_t)tr->args.seed, off, count, buf);
            dev_upload(m->master + off, buf, count * sizeof(float));
        }
    }
    free(buf);
    llama_refresh_working_weights(m);
}

/* Mean loss over -m validation batches (all of them with -m -1). */
static inline float trainer_val_loss(Trainer* tr) {
    DataLoader* d = &tr->val;
    long long available = dataloader_epoch_batches(d);
    long long n = tr->args.val_batches < 0 || tr->args.val_batches > available ? available : tr->args.val_batches;
    dataloader_reset(d);
    double sum = 0.0;
    for (long long i = 0; i < n; i++) {
        dataloader_next_batch(d);
        sum += llama_forward(&tr->model, d->inputs, d->targets, d->B, d->T, 0.0f);
    }
    return (float)(sum / (double)n);
}

/*
 * Prints -g tokens sampled from the model after BOS (temperature 1), one forward of (1, T) per token;
 * positions after the current one hold EOS and, attention being causal, do not affect it.
 */
static inline void trainer_sample(Trainer* tr) {
    Llama* m = &tr->model;
    int T = m->T, V = tr->cfg.vocab_size;
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
        tokenizer_print(&tr->tokenizer, tokens[t - 1], next);
        fflush(stdout);
    }
    printf("\n");
    free(tokens);
    free(logits);
}

static void trainer_emit_fp8(void* ctx, int layer, const char* gemm, const char* operand, const char* format, float amax,
                             float scale, double sat, double under) {
    Trainer* tr = (Trainer*)ctx;
    logger_fp8(&tr->logger, tr->step, layer, gemm, operand, format, amax, scale, sat, under);
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

/* Parses arguments, loads the model and data, and prepares (or resumes) the run. */
static inline void trainer_init(Trainer* tr, int argc, char** argv) {
    memset(tr, 0, sizeof(*tr));
    TrainArgs defaults = train_args_default();
    tr->args = defaults;
    if (train_args_parse(&tr->args, argc, argv)) {
        train_args_usage(argv[0], &defaults);
        exit(EXIT_SUCCESS);
    }
    TrainArgs* a = &tr->args;
    train_args_check(a);
    setvbuf(stdout, NULL, _IOLBF, 0); /* progress reaches a log file line by line, also when the run is killed */
    if (a->tokenizer_path != NULL && access(a->tokenizer_path, R_OK) != 0)
        die("flag --tokenizer: %s: cannot read (%s)", a->tokenizer_path, strerror(errno));
    if (a->output_dir != NULL) make_dir(a->output_dir);
    backend_init((Precision)a->precision);
    tr->rank = 0;
    tr->world = 1;

    const LlamaConfig* preset = llama_preset(a->model);
    if (preset != NULL) {
        tr->cfg = *preset;
    } else {
        if (access(a->model, F_OK) != 0) die("flag -e: '%s' is neither a model preset (see --help) nor an existing checkpoint file", a->model);
        checkpoint_read_config(a->model, &tr->cfg);
        tr->from_checkpoint = 1;
    }
    if (a->n_layers > 0) {
        if (tr->from_checkpoint) die("flag --n-layers: only applies to presets, not to the checkpoint %s", a->model);
        tr->cfg.n_layers = a->n_layers;
    }
    llama_config_validate(&tr->cfg, a->B, a->T, (Precision)a->precision);
    if (a->precision == PRECISION_FP8 && a->sample_every > 0 && a->T % FP8_DIM_MULTIPLE != 0)
        die("flag -t %d: with -p fp8 and -s, samples run one sequence of -t tokens, which must be a multiple of %d", a->T,
            FP8_DIM_MULTIPLE);
    if (a->output_dir != NULL && !a->resume && checkpoint_latest_step(a->output_dir) >= 0)
        die("flag -o %s: holds the checkpoints of an earlier run (DONE_%08d); resume it with -y 1 or choose another -o",
            a->output_dir, checkpoint_latest_step(a->output_dir));

    long long micro_tokens = (long long)a->B * a->T * tr->world;
    long long total = a->total_batch < 0 ? micro_tokens : a->total_batch;
    if (total <= 0 || total % micro_tokens != 0)
        die("flag -d: total batch %lld tokens is not a positive multiple of B*T*ranks = %d*%d*%d = %lld", total, a->B, a->T,
            tr->world, micro_tokens);
    tr->grad_accum_steps = (int)(total / micro_tokens);

    dataloader_init(&tr->train, a->train_pattern, a->B, a->T, tr->rank, tr->world, tr->cfg.vocab_size, a->shuffle, (uint64_t)a->seed);
    dataloader_init(&tr->val, a->val_pattern, a->B, a->T, tr->rank, tr->world, tr->cfg.vocab_size, 0, (uint64_t)a->seed);
    long long epoch_steps = dataloader_epoch_batches(&tr->train) / tr->grad_accum_steps;
    tr->steps = a->steps > 0 ? a->steps : (int)(epoch_steps > 0 ? epoch_steps : 1);

    printf("+-----------------------------------------------------------------------\n");
    printf("| llm8 train_llama (%s build), precision %s\n", backend_name(), precision_name((Precision)a->precision));
    llama_config_print(&tr->cfg);
    printf("| model from: %s\n", a->model);
    printf("| train: %s (%d shard(s), %zu tokens); val: %s (%zu tokens)\n", a->train_pattern, tr->train.num_shards,
           dataloader_total_tokens(&tr->train), a->val_pattern, dataloader_total_tokens(&tr->val));
    printf("| micro-batch %d x %d, %d rank(s), grad accumulation %d -> %lld tokens per step, %d steps\n", a->B, a->T,
           tr->world, tr->grad_accum_steps, total, tr->steps);
    printf("| lr %g (%s, warmup %d, final x%g), weight decay %g, clip %g, seed %lld\n", a->lr, a->schedule, a->warmup,
           a->final_lr_frac, a->weight_decay, a->grad_clip, a->seed);

    llama_build(&tr->model, &tr->cfg, (Precision)a->precision, a->B, a->T, a->pow2_scales, a->recompute);
    trainer_load_weights(tr);
    printf("+-----------------------------------------------------------------------\n");

    rng_seed(&tr->sample_rng, (uint64_t)a->seed ^ SAMPLE_SEED_SALT);
    if (a->resume) trainer_resume(tr);
    if (tr->rank == 0)
        logger_init(&tr->logger, a->output_dir, a->resume ? tr->step : -1,
                    a->precision == PRECISION_FP8 && a->fp8_stats_every > 0);
    char tok_path[PATH_LEN];
    trainer_tokenizer_path(tr, tok_path, sizeof(tok_path));
    if (a->sample_every > 0) tokenizer_init(&tr->tokenizer, tok_path);
}

/*
 * Prints the phases of a profiled step (--profile): "profile step k: forward X ms | backward X ms |
 * optimizer X ms | other X ms | fp8 casts X ms (inside the others)", where other is the rest of the step's
 * wall time (loading batches, zeroing the gradients, host time between them).
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

/* One optimizer step (grad_accum_steps micro-steps and the update); prints and logs it. */
static inline void trainer_step(Trainer* tr) {
    TrainArgs* a = &tr->args;
    Llama* m = &tr->model;
    int stats_due = a->fp8_stats_every > 0 && tr->step % a->fp8_stats_every == 0;
    if (stats_due) llama_fp8_stats_begin(m);
    int profiled = a->profile_every > 0 && (tr->step + 1) % a->profile_every == 0;
    if (profiled) backend_profile_begin();
    double t0 = wall_seconds();
    llama_zero_grads(m);
    float dloss = 1.0f / ((float)a->B * a->T * tr->grad_accum_steps);
    double loss = 0.0;
    char fp8_bad[128];
    int fp8_nonfinite = 0;
    for (int micro = 0; micro < tr->grad_accum_steps; micro++) {
        if (!a->overfit || !tr->overfit_loaded) {
            if (a->overfit) dataloader_reset(&tr->train);
            dataloader_next_batch(&tr->train);
            tr->overfit_loaded = 1;
        }
        backend_timer_start(PROF_FORWARD);
        loss += llama_forward(m, tr->train.inputs, tr->train.targets, a->B, a->T, dloss);
        backend_timer_stop(PROF_FORWARD);
        backend_timer_start(PROF_BACKWARD);
        llama_backward(m);
        backend_timer_stop(PROF_BACKWARD);
        /* each micro-step recasts X and dY with fresh scales: check before the next one overwrites them */
        if (!fp8_nonfinite) fp8_nonfinite = llama_fp8_nonfinite(m, fp8_bad, sizeof(fp8_bad));
    }
    loss /= tr->grad_accum_steps;
    int bad;
    backend_timer_start(PROF_OPTIMIZER);
    float norm = llama_grad_norm(m, &bad);
    float lr = lr_at_step(a->schedule, a->lr, a->warmup, a->final_lr_frac, tr->step, tr->steps);
    int skip = !isfinite(loss) || !isfinite(norm) || fp8_nonfinite;
    if (!skip) {
        llama_update(m, lr, a->weight_decay, tr->step - tr->total_skips, clip_factor(norm, a->grad_clip));
        tr->consecutive_skips = 0;
    } else {
        tr->consecutive_skips++;
        tr->total_skips++;
        char name[128] = "none";
        if (bad >= 0) llama_segment_name(m, bad, name, sizeof(name));
        printf("step %d skipped: loss %f, grad norm %f, first non-finite gradient: %s, first non-finite FP8 operand: %s (%d in a row)\n",
               tr->step + 1, (float)loss, norm, name, fp8_nonfinite ? fp8_bad : "none", tr->consecutive_skips);
        if (tr->consecutive_skips >= a->max_skips)
            die("%d consecutive steps with a non-finite loss, gradient or FP8 amax (--max-skips %d): stopping", tr->consecutive_skips, a->max_skips);
    }
    backend_timer_stop(PROF_OPTIMIZER);
    backend_synchronize();
    double ms = (wall_seconds() - t0) * 1e3;
    double phase_ms[PROF_PHASES];
    backend_profile_end(phase_ms);
    double tokens = (double)tr->grad_accum_steps * a->B * a->T * tr->world;
    double tok_s = tokens / (ms / 1e3);
    double peak = backend_peak_flops((Precision)a->precision);
    double mfu = peak > 0.0 ? flops_per_token(&tr->cfg, a->T) * tok_s / (peak * tr->world) : 0.0;
    if (stats_due) {
        llama_fp8_stats_end(m, trainer_emit_fp8, tr);
        logger_flush(&tr->logger);
    }
    printf("step %4d/%d | loss %.6f | lr %.2e | norm %.4f | %.1f ms | %.0f tok/s", tr->step + 1, tr->steps, (float)loss, lr,
           norm, ms, tok_s);
    if (mfu > 0.0) printf(" | MFU %.1f%%", 100.0 * mfu);
    printf("\n");
    if (profiled) trainer_print_profile(tr, phase_ms, ms);
    logger_train(&tr->logger, tr->step, (float)loss, lr, norm, ms, tok_s, mfu, backend_memory_mib(), skip);
    tr->step++;
}

/* The whole run. Returns the process exit status. */
static inline int train_main(int argc, char** argv) {
    Trainer* tr = (Trainer*)callocCheck(1, sizeof(Trainer));
    trainer_init(tr, argc, argv);
    TrainArgs* a = &tr->args;
    int start = tr->step;
    for (;;) {
        int last = tr->step >= tr->steps;
        if (last || (a->val_every > 0 && tr->step % a->val_every == 0)) {
            float val = trainer_val_loss(tr);
            printf("val loss %.6f (step %d)\n", val, tr->step);
            logger_val(&tr->logger, tr->step, val);
        }
        if (a->output_dir && tr->step > start && (last || (a->ckpt_every > 0 && tr->step % a->ckpt_every == 0))) trainer_save(tr);
        if (a->sample_every > 0 && (last || tr->step % a->sample_every == 0)) trainer_sample(tr);
        if (last) break;
        trainer_step(tr);
    }
    logger_free(&tr->logger);
    llama_free(&tr->model);
    tokenizer_free(&tr->tokenizer);
    dataloader_free(&tr->train);
    dataloader_free(&tr->val);
    free(tr);
    return EXIT_SUCCESS;
}
