/*
 * Command-line arguments of the trainers, shared by train_llama (GPU) and train_llama_cpu. llm.c's
 * single-letter flags where llm.c has one (docs/cli.md), long flags for the rest. Every flag takes exactly
 * one value; an unknown flag, a missing value or a malformed number or name stops with one line naming
 * the flag. Each flag is written once, as a row of TRAIN_ARGS: its name, type, field, default and help;
 * the rows make the TrainArgs struct, the parser's table, the defaults (train_args_default parses each
 * row's default as if it had been given) and the --help text. Enum flags are parsed here, once, into
 * their typed enums.
 */
#pragma once

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>

#include "shadow_policy.h"
#include "../comm/wire.h"
#include "../dataloader/eval_sets.h"
#include "../fp8/gemm.h"
#include "../llama/config.h"
#include "../llama/model_file.h"
#include "../llama/optim.h"
#include "../model/options.h"

/*
 * Every flag, once: ARG(flag, type, field, default, help) or, for a flag that names one of several values,
 * ARG_NAMES(flag, enum type, field, names, default, help). The default is written as it would be given
 * (ARG_STR: NULL for none; ARG_NAMES: one of its names). This list makes the TrainArgs fields, the
 * parser's table, the defaults and the --help text.
 */
#define TRAIN_ARGS(ARG, ARG_NAMES) \
    ARG("-i", ARG_STR, train_pattern, "dev/data/tinyshakespeare/tiny_shakespeare_train.bin", "train shard glob") \
    ARG("-j", ARG_STR, val_pattern, "dev/data/tinyshakespeare/tiny_shakespeare_val.bin", "validation shard glob") \
    ARG("-o", ARG_STR, output_dir, NULL, "output dir for main.log, metrics, checkpoints") \
    ARG("-e", ARG_STR, model, "tiny", "model: a preset name (see below) or a model checkpoint .bin") \
    ARG("--tokenizer", ARG_STR, tokenizer_path, NULL, "tokenizer.bin for samples (none: beside the train shards)") \
    ARG("-b", ARG_INT, B, "8", "micro-batch size, sequences per rank") \
    ARG("-t", ARG_INT, T, "256", "sequence length") \
    ARG("-d", ARG_I64, total_batch, "-1", "total batch in tokens per optimizer step, all ranks (-1: B*T*ranks)") \
    ARG("-l", ARG_FLOAT, lr, "0.001", "peak learning rate") \
    ARG("-u", ARG_INT, warmup, "20", "learning-rate warmup steps") \
    ARG("-q", ARG_FLOAT, final_lr_frac, "0.1", "final learning rate as a fraction of -l") \
    ARG_NAMES("-k", LrSchedule, schedule, LR_SCHEDULE_NAMES, "cosine", "learning-rate schedule: cosine | linear | constant") \
    ARG("-c", ARG_FLOAT, weight_decay, "0.1", "AdamW weight decay (2-D weights only)") \
    ARG("--clip", ARG_FLOAT, grad_clip, "1", "gradient clipping: max global L2 norm (0: off)") \
    ARG("-x", ARG_INT, steps, "-1", "optimizer steps (-1: one epoch of the train data)") \
    ARG("-v", ARG_INT, val_every, "25", "validation loss every N steps (0: only at the end)") \
    ARG("-m", ARG_INT, val_batches, "20", "validation batches (of -d tokens) per evaluation (-1: all)") \
    ARG("-h", ARG_INT, hellaswag, "0", "1: HellaSwag accuracy at every evaluation (as llm.c; -h or --help alone: this help)") \
    ARG("--hellaswag", ARG_STR, hellaswag_path, "dev/data/hellaswag/hellaswag_val.bin", \
        "HellaSwag file for -h 1 (llm.c's eval format: dev/data/hellaswag.py)") \
    ARG("--eval-lambada", ARG_STR, eval_lambada, NULL, "LAMBADA file (dev/data/lambada.py): last-word accuracy and perplexity") \
    ARG("--eval-wikitext", ARG_STR, eval_wikitext, NULL, "WikiText file (dev/data/wikitext.py): word/byte perplexity, bits per byte") \
    ARG("--eval-every", ARG_INT, eval_every, "-1", "downstream evaluations every N steps (0: only at the end; -1: as -v)") \
    ARG("--eval-limit", ARG_INT, eval_limit, "-1", "evaluate the first N examples (documents) of each set (-1: all)") \
    ARG("--eval-dump", ARG_STR, eval_dump, NULL, "write the evaluations' scored logits under DIR (tests' independent scorer)") \
    ARG_NAMES("--eval-compat", EvalCompat, eval_compat, EVAL_COMPAT_NAMES, "harness", \
              "rules of the eval files and scores: harness (lm-evaluation-harness's for an HF Llama-2: no BOS, its WikiText " \
              "detokenizer, acc_norm per character) | llm8 (BOS first, llm8's detokenizer, acc_norm per byte); each file " \
              "records its mode (dev/data/*.py --eval-compat)") \
    ARG("-s", ARG_INT, sample_every, "0", "print a sample every N steps (0: never)") \
    ARG("-g", ARG_INT, sample_tokens, "64", "tokens per sample") \
    ARG("-n", ARG_INT, ckpt_every, "0", "checkpoint every N steps (0: only at the end; needs -o; -1: never, e.g. benchmarks)") \
    ARG("-y", ARG_INT, resume, "0", "1: resume from the latest checkpoint in -o") \
    ARG("-z", ARG_INT, zero_stage, "0", "ZeRO stage: 0 all-reduce, 1 optimizer state sharded, 2 gradients sharded too") \
    ARG_NAMES("--grad-reduce", CommWire, grad_reduce, COMM_WIRE_NAMES, "fp32", \
              "gradients on the wire: fp32 (4 B/element, exact rank-order sums) | bf16 (2 B, each contribution rounded to BF16) " \
              "| fp8 (1 B + 4 B per 4096-element chunk: E4M3 with a scale per chunk, ~2^-4 relative rounding per contribution, " \
              "summed in FP32); bf16 and fp8 change the sums") \
    ARG_NAMES("--optim-state", OptimState, optim_state, OPTIM_STATE_NAMES, "fp32", \
              "AdamW moments stored as fp32 (8 B/param) | bf16 (4 B) | fp8 (E4M3 m + FP16 v, a scale per 4096: 3 B; MS-AMP O2)") \
    ARG_NAMES("--grad-buffer", GradFormat, grad_buffer, GRAD_FORMAT_NAMES, "fp32", \
              "gradients accumulated over micro-steps stored as fp32 (4 B/param) | bf16 (2 B, ~2^-8 relative rounding per " \
              "micro-step) | fp8 (E4M3, a scale per 4096: 1 B, ~2^-4 per micro-step); -z 1, or -z 0 on one rank; adds FP32 " \
              "bucket buffers") \
    ARG_NAMES("--master-weights", MasterFormat, master_weights, MASTER_FORMAT_NAMES, "fp32", \
              "master weights stored as fp32 (4 B/param of the shard) | fp16 (2 B, a scale per 4096; MS-AMP O3: updates below " \
              "~2^-12 of a weight are lost)") \
    ARG("--comm-timeout", ARG_FLOAT, comm_timeout, "900", "seconds without progress before a rank aborts the job (0: off)") \
    ARG("-r", ARG_INT, recompute, "0", "recompute in backward: 0 none, 1 norm and SwiGLU outputs, 2 whole blocks") \
    ARG_NAMES("-p", Precision, precision, PRECISION_NAMES, "fp8", "precision recipe: fp8 | bf16 | fp32") \
    ARG("-a", ARG_INT, overfit, "0", "1: overfit the first batch (debugging)") \
    ARG("--shuffle", ARG_INT, shuffle, "1", "1: shuffle shards and samples each epoch") \
    ARG("--seed", ARG_I64, seed, "1337", "seed for init, shuffling and sampling") \
    ARG("--fp8-stats", ARG_INT, fp8_stats_every, "0", "log FP8 amax/scale/saturation/underflow every N steps (0: off)") \
    ARG("--pow2-scales", ARG_INT, pow2_scales, "0", "1: round FP8 scales down to powers of two") \
    ARG_NAMES("--fp8-accum", Fp8Accum, fp8_accum, FP8_ACCUM_NAMES, "exact", \
              "fp8 GEMM accumulation: exact (FP32) | hopper (model of H100 tensor cores; CPU build only)") \
    ARG("--fp8-fast-accum", ARG_INT, fp8_fast_accum, "1", "fp8: 1 fprop GEMMs with fast accumulation (as TE), 0 without") \
    ARG_NAMES("--fp8-recipe", Fp8Recipe, fp8_recipe, FP8_RECIPE_NAMES, "current", \
              "fp8 scaling of X and dY: current (each tensor's own amax) | delayed (TE DelayedScaling: amax history)") \
    ARG("--amax-history", ARG_INT, amax_history, "1024", "delayed: amax history length, entries per operand, one per applied step (TE: 1024)") \
    ARG_NAMES("--amax-algo", Fp8AmaxAlgo, amax_algo, FP8_AMAX_ALGO_NAMES, "max", \
              "delayed: amax of the history: max (of every entry) | most_recent (the last step's)") \
    ARG("--fp8-margin", ARG_INT, fp8_margin, "0", "delayed: scale = (fp8 max / amax) / 2^margin, margin >= 0") \
    ARG("--max-skips", ARG_INT, max_skips, "5", "stop after this many consecutive non-finite steps") \
    ARG("--n-layers", ARG_INT, n_layers, "0", "override the preset's layer count (benchmarks)") \
    ARG("--profile", ARG_INT, profile_every, "0", "print forward/backward/optimizer/FP8-cast ms of every N-th step (0: off)") \
    ARG("--warmup-pass", ARG_INT, warmup_pass, "1", "GPU: 1 runs every kernel, GEMM shape and collective of a step once before step 1, 0 not") \
    ARG("--dry-run", ARG_INT, dry_run, "0", "0, 1 or 2. 1: print the per-rank memory plan of these settings and exit (allocates and reads nothing); 2: also the ops of one optimizer step (train_llama_cpu)") \
    ARG("--ranks", ARG_INT, plan_ranks, "0", "with --dry-run: the rank count to plan for (0: 1)") \
    ARG("--gpu-mem", ARG_FLOAT, gpu_mem_gib, "0", "with --dry-run: device memory in GiB to plan against (0: the device's, or host RAM)") \
    ARG("--bf16-layers", ARG_STR, bf16_layers, "none", "fp8: blocks kept in BF16: none | first,last | indices and ranges (0,2-5)") \
    ARG("--shadow-every", ARG_INT, shadow_every, "0", "fp8: every K steps also run the first micro-batch in BF16 and compare (0: off)") \
    ARG("--shadow-grad", ARG_INT, shadow_grad, "0", "1: the shadow check compares gradients too (-z 0/1)") \
    ARG_NAMES("--shadow-policy", ShadowPolicyKind, shadow_policy, SHADOW_POLICY_NAMES, "warn", \
              "on shadow checks over --shadow-tol: warn | fallback (train in BF16)") \
    ARG("--shadow-tol", ARG_FLOAT, shadow_tol, "0.01", "shadow check: largest relative FP8-vs-BF16 loss difference") \
    ARG("--shadow-patience", ARG_INT, shadow_patience, "3", "fallback after this many checks over --shadow-tol in a row") \
    ARG("--shadow-recover", ARG_INT, shadow_recover, "100", "fallback: BF16 steps before returning to FP8 (0: never)") \
    ARG("--alert-saturated", ARG_FLOAT, alert_saturated, "0.01", "--fp8-stats steps: alert above this saturated share (0: off)") \
    ARG("--alert-underflow", ARG_FLOAT, alert_underflow, "0.01", "--fp8-stats steps: alert above this underflow share (0: off)") \
    ARG("--alert-amax-growth", ARG_FLOAT, alert_amax_growth, "8", "--fp8-stats steps: alert when a W or X amax grows by this factor (0: off)")

/* -n -1: a run with -o writes logs but no checkpoint, not even the last one (benchmarks). */
#define NO_CHECKPOINTS (-1)

typedef enum { ARG_STR, ARG_INT, ARG_I64, ARG_FLOAT, ARG_ENUM } ArgType;

/* The C type of each ArgType's field. */
#define ARG_C_TYPE_ARG_STR const char*
#define ARG_C_TYPE_ARG_INT int
#define ARG_C_TYPE_ARG_I64 long long
#define ARG_C_TYPE_ARG_FLOAT float
#define TRAIN_ARG_FIELD(flag, type, field, def, help) ARG_C_TYPE_##type field;
#define TRAIN_ARG_ENUM_FIELD(flag, type, field, names, def, help) type field;

/* The parsed command line: one field per row of TRAIN_ARGS, named and typed there. */
typedef struct {
    TRAIN_ARGS(TRAIN_ARG_FIELD, TRAIN_ARG_ENUM_FIELD)
} TrainArgs;

typedef struct {
    const char* flag;
    ArgType type;
    size_t offset, size; /* the TrainArgs field */
    const char* def;     /* the default, as it would be given (ARG_STR: NULL for none) */
    const char* help;
    const char* const* names; /* ARG_ENUM: the values, indexed by the enum */
    int num_names;
} ArgSpec;

#define ARG_FIELD(field) offsetof(TrainArgs, field), sizeof(((TrainArgs*)0)->field)
#define TRAIN_ARG_SPEC(flag, type, field, def, help) {flag, type, ARG_FIELD(field), def, help, NULL, 0},
#define TRAIN_ARG_ENUM_SPEC(flag, type, field, names, def, help) \
    {flag, ARG_ENUM, ARG_FIELD(field), def, help, names, (int)(sizeof(names) / sizeof(names[0]))},
static const ArgSpec TRAIN_ARG_SPECS[] = {TRAIN_ARGS(TRAIN_ARG_SPEC, TRAIN_ARG_ENUM_SPEC)};
#define NUM_TRAIN_ARGS (sizeof(TRAIN_ARG_SPECS) / sizeof(TRAIN_ARG_SPECS[0]))

static inline long long parse_integer(const char* flag, const char* value, long long lo, long long hi) {
    char* end;
    errno = 0;
    long long v = strtoll(value, &end, 10);
    if (errno != 0 || end == value || *end != '\0') die("flag %s: '%s' is not an integer", flag, value);
    if (v < lo || v > hi) die("flag %s: %lld is out of range [%lld, %lld]", flag, v, lo, hi);
    return v;
}

/* Sets the field of `spec` in *a from `value` as given on the command line; stops naming the flag. */
static inline void train_arg_set(TrainArgs* a, const ArgSpec* spec, const char* value) {
    char* field = (char*)a + spec->offset;
    const char* flag = spec->flag;
    switch (spec->type) {
        case ARG_STR: memcpy(field, &value, sizeof(value)); break;
        case ARG_INT:
        case ARG_ENUM: {
            int v = 0;
            if (spec->type == ARG_INT) {
                v = (int)parse_integer(flag, value, INT_MIN, INT_MAX);
            } else if ((v = name_index(spec->names, spec->num_names, value)) < 0) {
                char list[256] = "";
                for (int i = 0; i < spec->num_names; i++)
                    snprintf(list + strlen(list), sizeof(list) - strlen(list), "%s%s", i == 0 ? "" : i == spec->num_names - 1 ? " or " : ", ",
                             spec->names[i]);
                die("flag %s: '%s' is not %s", flag, value, list);
            }
            if (spec->size != sizeof(int)) die("flag %s: its field is not an int (TRAIN_ARG_SPECS)", flag);
            memcpy(field, &v, sizeof(v));
            break;
        }
        case ARG_I64: {
            long long v = parse_integer(flag, value, LLONG_MIN, LLONG_MAX);
            memcpy(field, &v, sizeof(v));
            break;
        }
        case ARG_FLOAT: {
            char* end;
            errno = 0;
            float v = strtof(value, &end);
            if (errno != 0 || end == value || *end != '\0' || !isfinite(v)) die("flag %s: '%s' is not a finite number", flag, value);
            memcpy(field, &v, sizeof(v));
            break;
        }
    }
}

/* The defaults: every row's default, parsed as if given (a small model on tiny-shakespeare: `make train`). */
static inline TrainArgs train_args_default(void) {
    TrainArgs a;
    memset(&a, 0, sizeof(a));
    for (size_t k = 0; k < NUM_TRAIN_ARGS; k++) train_arg_set(&a, &TRAIN_ARG_SPECS[k], TRAIN_ARG_SPECS[k].def);
    return a;
}

static inline void train_args_usage(const char* prog) {
    printf("usage: %s [flags]   (every flag takes one value)\n\n", prog);
    for (size_t i = 0; i < NUM_TRAIN_ARGS; i++) {
        const ArgSpec* s = &TRAIN_ARG_SPECS[i];
        printf("  %-19s %s (default %s)\n", s->flag, s->help, s->def ? s->def : "none");
    }
    printf("\nmodel presets for -e:\n");
    for (size_t i = 0; i < NUM_LLAMA_PRESETS; i++) {
        const LlamaConfig* c = &LLAMA_PRESETS[i].cfg;
        printf("  %-12s dim %d, layers %d, heads %d/%d kv, ffn %d, max seq %d  (%s)\n", LLAMA_PRESETS[i].name, c->dim,
               c->n_layers, c->n_heads, c->n_kv_heads, c->ffn_dim, c->max_seq_len, LLAMA_PRESETS[i].note);
    }
}

/*
 * Parses argv into *a (which holds the defaults on entry). Returns 1 when --help / -h was given (the
 * caller prints usage and exits 0); stops with one line on any error.
 */
static inline int train_args_parse(TrainArgs* a, int argc, char** argv) {
    for (int i = 1; i < argc; i++) {
        const char* flag = argv[i];
        /* -h takes a value, as llm.c's; alone (last, or before another flag) it still asks for help */
        if (strcmp(flag, "--help") == 0 || (strcmp(flag, "-h") == 0 && (i + 1 >= argc || argv[i + 1][0] == '-'))) return 1;
        const ArgSpec* spec = NULL;
        for (size_t k = 0; k < NUM_TRAIN_ARGS; k++) {
            if (strcmp(TRAIN_ARG_SPECS[k].flag, flag) == 0) spec = &TRAIN_ARG_SPECS[k];
        }
        if (spec == NULL) die("unknown flag '%s' (see --help)", flag);
        if (i + 1 >= argc) die("flag %s needs a value (see --help)", flag);
        train_arg_set(a, spec, argv[++i]);
    }
    return 0;
}

/*
 * The model -e names: a preset (with --n-layers applied) or a checkpoint's config; returns whether it is
 * a checkpoint. Checks the config for -b, -t and -p (llama_config_validate). Stops naming the flag.
 */
static inline int train_args_model(const TrainArgs* a, LlamaConfig* cfg) {
    const LlamaConfig* preset = llama_preset(a->model);
    int from_checkpoint = preset == NULL;
    if (preset != NULL) {
        *cfg = *preset;
    } else {
        if (access(a->model, F_OK) != 0) die("flag -e: '%s' is neither a model preset (see --help) nor an existing checkpoint file", a->model);
        checkpoint_read_config(a->model, cfg);
    }
    if (a->n_layers > 0) {
        if (from_checkpoint) die("flag --n-layers: only applies to presets, not to the checkpoint %s", a->model);
        cfg->n_layers = a->n_layers;
    }
    llama_config_validate(cfg, a->B, a->T, a->precision);
    return from_checkpoint;
}

/* Micro-steps per optimizer step on `world` ranks: -d / (B T world); stops when -d is not a multiple. */
static inline int train_args_grad_accum(const TrainArgs* a, int world) {
    long long micro_tokens = (long long)a->B * a->T * world;
    long long total = a->total_batch < 0 ? micro_tokens : a->total_batch;
    if (total <= 0 || total % micro_tokens != 0)
        die("flag -d: total batch %lld tokens is not a positive multiple of B*T*ranks = %d*%d*%d = %lld", total, a->B, a->T,
            world, micro_tokens);
    return (int)(total / micro_tokens);
}

/* The storage formats of the flags (--optim-state, --grad-buffer, --master-weights). */
static inline StateFormats train_args_state_formats(const TrainArgs* a) {
    StateFormats f = {a->optim_state, a->grad_buffer, a->master_weights};
    return f;
}

/* --grad-buffer bf16/fp8 under -z 0 needs one rank: with several, every rank would keep the whole reduced
   gradient, which -z 1 shards for the same traffic. Every rank takes this decision from the same flags. */
static inline void train_args_check_grad_buffer(const TrainArgs* a, int world) {
    if (a->grad_buffer != GRAD_FORMAT_FP32 && a->zero_stage == 0 && world > 1)
        die("flag --grad-buffer %s: -z 0 on %d ranks would keep the reduced gradient whole on every rank; use -z 1 "
            "(same traffic, the result sharded), or one rank", grad_format_name(a->grad_buffer), world);
}

/* Range checks that need no model; stops naming the flag. */
static inline void train_args_check(const TrainArgs* a) {
    TrainArgs defaults = train_args_default();
    if (strcmp(a->train_pattern, defaults.train_pattern) != 0 && strcmp(a->val_pattern, defaults.val_pattern) == 0)
        die("flag -i given without -j: the default validation set is tiny-shakespeare's; pass your own with -j");
    if (a->B <= 0) die("flag -b: micro-batch size must be positive, got %d", a->B);
    if (a->T <= 0) die("flag -t: sequence length must be positive, got %d", a->T);
    if (!(a->lr >= 0.0f)) die("flag -l: learning rate must be >= 0");
    if (a->warmup < 0) die("flag -u: warmup steps must be >= 0");
    if (a->final_lr_frac < 0.0f || a->final_lr_frac > 1.0f) die("flag -q: final LR fraction must be in [0, 1]");
    if (a->weight_decay < 0.0f) die("flag -c: weight decay must be >= 0");
    if (a->grad_clip < 0.0f) die("flag --clip: must be >= 0");
    if (a->steps < -1) die("flag -x: steps must be positive, 0 (evaluate only) or -1 (one epoch)");
    if (a->val_every < 0 || a->sample_every < 0 || a->fp8_stats_every < 0 || a->profile_every < 0)
        die("flags -v, -s, --fp8-stats, --profile must be >= 0");
    if (a->ckpt_every < NO_CHECKPOINTS) die("flag -n: must be >= 0, or %d (never)", NO_CHECKPOINTS);
    if (a->warmup_pass != 0 && a->warmup_pass != 1) die("flag --warmup-pass: must be 0 or 1");
    if (a->val_batches < -1 || a->val_batches == 0) die("flag -m: validation batches must be positive or -1 (all)");
    if (a->sample_tokens <= 0) die("flag -g: sample tokens must be positive");
    if (a->hellaswag != 0 && a->hellaswag != 1) die("flag -h: must be 0 or 1 (HellaSwag), or alone for help");
    if (strcmp(a->hellaswag_path, defaults.hellaswag_path) != 0 && !a->hellaswag) die("flag --hellaswag: needs -h 1");
    int evals = a->hellaswag || a->eval_lambada != NULL || a->eval_wikitext != NULL;
    if (a->eval_every < -1) die("flag --eval-every: must be >= 0, or -1 (as -v)");
    if (a->eval_limit < -1 || a->eval_limit == 0) die("flag --eval-limit: must be positive or -1 (all)");
    const char* eval_flag = a->eval_every != defaults.eval_every ? "--eval-every"
                            : a->eval_limit != defaults.eval_limit ? "--eval-limit"
                            : a->eval_dump != NULL ? "--eval-dump"
                            : a->eval_compat != defaults.eval_compat ? "--eval-compat" : NULL;
    if (eval_flag != NULL && !evals) die("flag %s: needs an evaluation (-h 1, --eval-lambada or --eval-wikitext)", eval_flag);
    if (a->resume != 0 && a->resume != 1) die("flag -y: must be 0 or 1");
    if (a->resume && a->output_dir == NULL) die("flag -y 1 needs -o (the directory to resume from)");
    if (a->zero_stage < 0 || a->zero_stage > 2) die("flag -z: ZeRO stage must be 0, 1 or 2, got %d", a->zero_stage);
    if (a->grad_buffer != GRAD_FORMAT_FP32 && a->zero_stage == 2)
        die("flag --grad-buffer %s: -z 2 keeps no full gradient buffer (it accumulates in the FP32 shard); use -z 1",
            grad_format_name(a->grad_buffer));
    if (a->comm_timeout < 0.0f) die("flag --comm-timeout: must be >= 0 seconds");
    if (a->recompute < 0 || a->recompute >= RECOMPUTE_LEVELS)
        die("flag -r: recompute level must be 0 (none), 1 (norm and SwiGLU outputs) or 2 (whole blocks), got %d", a->recompute);
    if (a->ckpt_every > 0 && a->output_dir == NULL) die("flag -n %d needs -o (where checkpoints go)", a->ckpt_every);
    if (a->overfit != 0 && a->overfit != 1) die("flag -a: must be 0 or 1");
    if (a->shuffle != 0 && a->shuffle != 1) die("flag --shuffle: must be 0 or 1");
    if (a->pow2_scales != 0 && a->pow2_scales != 1) die("flag --pow2-scales: must be 0 or 1");
    if (a->fp8_fast_accum != 0 && a->fp8_fast_accum != 1) die("flag --fp8-fast-accum: must be 0 or 1");
    if (a->amax_history < 1 || a->amax_history > AMAX_HISTORY_MAX)
        die("flag --amax-history: must be in [1, %d], got %d", AMAX_HISTORY_MAX, a->amax_history);
    if (a->fp8_margin < 0 || a->fp8_margin > FP8_MARGIN_MAX) die("flag --fp8-margin: must be in [0, %d], got %d", FP8_MARGIN_MAX, a->fp8_margin);
    if (a->max_skips < 1) die("flag --max-skips: must be >= 1");
    if (a->n_layers < 0) die("flag --n-layers: must be >= 0");
    if (a->dry_run < 0 || a->dry_run > 2) die("flag --dry-run: must be 0, 1 or 2");
    if (a->plan_ranks < 0) die("flag --ranks: must be >= 0");
    if (a->plan_ranks > 0 && !a->dry_run) die("flag --ranks: plans for N ranks with --dry-run 1 or 2; a run has the ranks mpirun starts");
    if (a->gpu_mem_gib < 0.0f) die("flag --gpu-mem: must be >= 0 GiB");
    if (a->gpu_mem_gib > 0.0f && !a->dry_run) die("flag --gpu-mem: only --dry-run 1 or 2 plans against a memory size");
    int fp8 = a->precision == PRECISION_FP8;
    if ((a->fp8_accum != defaults.fp8_accum || a->fp8_fast_accum != defaults.fp8_fast_accum) && !fp8)
        die("flag %s: needs -p fp8 (it sets the FP8 GEMMs)", a->fp8_accum != defaults.fp8_accum ? "--fp8-accum" : "--fp8-fast-accum");
    if (!fp8) {
        const char* set = a->fp8_recipe != defaults.fp8_recipe     ? "--fp8-recipe"
                        : a->amax_history != defaults.amax_history ? "--amax-history"
                        : a->amax_algo != defaults.amax_algo       ? "--amax-algo"
                        : a->fp8_margin != defaults.fp8_margin     ? "--fp8-margin"
                                                                   : NULL;
        if (set) die("flag %s: needs -p fp8 (it sets the FP8 scaling recipe)", set);
    }
    if (strcmp(a->bf16_layers, defaults.bf16_layers) != 0 && !fp8)
        die("flag --bf16-layers: needs -p fp8 (every block runs %s already)", precision_name(a->precision));
    if (a->shadow_every < 0) die("flag --shadow-every: must be >= 0");
    if (a->shadow_every > 0 && !fp8) die("flag --shadow-every: needs -p fp8 (the check compares FP8 with BF16)");
    if (a->shadow_grad != 0 && a->shadow_grad != 1) die("flag --shadow-grad: must be 0 or 1");
    if (!(a->shadow_tol >= 0.0f)) die("flag --shadow-tol: must be >= 0");
    if (a->shadow_patience < 1) die("flag --shadow-patience: must be >= 1");
    if (a->shadow_recover < 0) die("flag --shadow-recover: must be >= 0");
    /* the shadow flags only act through the check: without it they would be accepted and ignored */
    const char* unused = a->shadow_grad != defaults.shadow_grad ? "--shadow-grad"
                         : a->shadow_policy != defaults.shadow_policy ? "--shadow-policy"
                         : a->shadow_tol != defaults.shadow_tol ? "--shadow-tol"
                         : a->shadow_patience != defaults.shadow_patience ? "--shadow-patience"
                         : a->shadow_recover != defaults.shadow_recover ? "--shadow-recover" : NULL;
    if (unused != NULL && a->shadow_every == 0) die("flag %s: needs --shadow-every K (the shadow check)", unused);
    if (a->shadow_grad && a->zero_stage == 2)
        die("flag --shadow-grad 1: needs full gradients, which -z 2 does not keep; use -z 0 or 1, or --shadow-grad 0");
    if (a->shadow_grad && a->grad_buffer != GRAD_FORMAT_FP32)
        die("flag --shadow-grad 1: needs FP32 full gradients; --grad-buffer %s stores them rounded (use --grad-buffer fp32)",
            grad_format_name(a->grad_buffer));
    if (!(a->alert_saturated >= 0.0f) || !(a->alert_underflow >= 0.0f) || !(a->alert_amax_growth >= 0.0f))
        die("flags --alert-saturated, --alert-underflow, --alert-amax-growth: must be >= 0 (0: off)");
    if (a->alert_amax_growth > 0.0f && a->alert_amax_growth <= 1.0f)
        die("flag --alert-amax-growth: %g is not a growth; give a factor > 1 (or 0: off)", a->alert_amax_growth);
    const char* alert = a->alert_saturated != defaults.alert_saturated ? "--alert-saturated"
                        : a->alert_underflow != defaults.alert_underflow ? "--alert-underflow"
                        : a->alert_amax_growth != defaults.alert_amax_growth ? "--alert-amax-growth" : NULL;
    if (alert != NULL && (a->fp8_stats_every == 0 || !fp8))
        die("flag %s: alerts are computed on the statistics steps of -p fp8 --fp8-stats N; give --fp8-stats", alert);
}

/*
 * Parses --bf16-layers `spec` for a model of L blocks into blocks (L): 1 = the block's linears run BF16.
 * spec: "none", or comma-separated items, each "first", "last", a block index or a range "a-b"
 * (inclusive). Stops naming the flag and the item on an error (unknown item, index out of range).
 */
static inline void bf16_layers_parse(const char* spec, int L, char* blocks) {
    memset(blocks, 0, (size_t)L);
    if (strcmp(spec, "none") == 0) return;
    const char* p = spec;
    for (;;) {
        const char* end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        char item[32];
        if (len == 0 || len >= sizeof(item)) die("flag --bf16-layers: empty or overlong item in '%s'", spec);
        memcpy(item, p, len);
        item[len] = '\0';
        long lo, hi;
        if (strcmp(item, "first") == 0) {
            lo = hi = 0;
        } else if (strcmp(item, "last") == 0) {
            lo = hi = L - 1;
        } else {
            char* rest = NULL;
            lo = hi = isdigit((unsigned char)item[0]) ? strtol(item, &rest, 10) : -1;
            if (lo >= 0 && rest[0] == '-' && isdigit((unsigned char)rest[1])) hi = strtol(rest + 1, &rest, 10);
            if (lo < 0 || *rest != '\0') die("flag --bf16-layers: '%s' is not first, last, a block index or a range a-b", item);
        }
        if (lo > hi || hi >= L) die("flag --bf16-layers: '%s' is not within blocks 0..%d", item, L - 1);
        for (long l = lo; l <= hi; l++) blocks[l] = 1;
        if (end == NULL) break;
        p = end + 1;
    }
}

/*
 * The options the model is built with, from the flags (model/options.h): this rank's sharding and the
 * blocks --bf16-layers names (blocks, L, bf16_layers_parse's); a block linear may run BF16 when the shadow
 * check or --bf16-layers can make it.
 */
static inline ModelOptions train_args_model_options(const TrainArgs* a, Sharding sharding, const char* blocks) {
    ModelOptions o = model_options(a->precision, a->B, a->T);
    o.recompute = a->recompute;
    o.sharding = sharding;
    o.formats = train_args_state_formats(a);
    Fp8Settings f = {a->pow2_scales, a->fp8_recipe, a->amax_history, a->amax_algo, a->fp8_margin, a->fp8_fast_accum, a->fp8_accum};
    o.fp8 = f;
    o.bf16_blocks = blocks;
    o.bf16_linears = a->precision == PRECISION_FP8 && a->shadow_every > 0;
    return o;
}
