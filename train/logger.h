/*
 * Run logs under -o DIR, written by rank 0 of either build:
 *   main.log        llm.c's lines, "s:<step> trl:<train loss>" and "s:<step> tel:<val loss>", so llm.c's
 *                   plotting tools read it unchanged;
 *   metrics.jsonl   one JSON object per optimizer step: step, loss, lr, grad_norm, ms, tokens_per_s, mfu,
 *                   mem_mib, comm_exposed_ms (communication the compute did not hide), skipped, linears
 *                   (the recipe the block linears ran: fp8, or bf16 during a fallback); val_loss objects
 *                   after evaluations; shadow check objects (shadow_loss_fp8, ...), policy events
 *                   (event, reason) and FP8 alerts (alert, layer, gemm, operand, value, threshold), each
 *                   with the step it belongs to (docs/checkpoints.md);
 *   fp8_stats.csv   one row per FP8 GEMM operand on steps where statistics are due (--fp8-stats N):
 *                   step,layer,gemm,operand,format,amax,scale,saturated_frac,underflow_frac.
 * Lines are flushed as written so that a crashed run keeps its log. On resume from step k the files
 * keep their lines of steps < k and are appended to.
 */
#pragma once

#include <limits.h>
#include <math.h>

#include "shadow_policy.h"
#include "../core/common.h"

#define LOG_KEEP_ALL INT_MAX

typedef struct {
    FILE* main_log;
    FILE* metrics;
    FILE* fp8_stats;
    char dir[PATH_LEN];
} Logger;

/* Flushes one log file and stops, naming it, if anything written to it failed (a full disk, say). */
static inline void logger_flush_file(const Logger* lg, FILE* f, const char* name) {
    if (ferror(f) || fflush(f) != 0) die("%s/%s: write failed (%s)", lg->dir, name, strerror(errno));
}

/*
 * On resume from step k, drops the lines of `path` that belong to steps >= k (the interrupted run went
 * past its last checkpoint; the resumed run logs those steps again). step_format reads a line's step
 * with sscanf; lines without one (a CSV header) are kept. Rewritten atomically.
 */
static inline void logger_truncate(const char* path, const char* step_format, int resume_step) {
    FILE* in = fopen(path, "r");
    if (in == NULL) return;
    char tmp[TMP_PATH_LEN];
    FILE* out = atomic_open(path, tmp, sizeof(tmp));
    char line[4096];
    while (fgets(line, sizeof(line), in) != NULL) {
        int step;
        if (sscanf(line, step_format, &step) == 1 && step >= resume_step) continue;
        fputs(line, out);
    }
    fcloseCheck(in, path);
    atomic_commit(out, tmp, path);
}

/*
 * Opens the logs of -o dir (none when dir is NULL). resume_step >= 0: appends to the files of the run
 * being resumed, after dropping their lines of steps >= resume_step (LOG_KEEP_ALL: none, as an
 * evaluation-only run -x 0 does); -1: starts them afresh.
 * fp8_stats: whether this run writes fp8_stats.csv (-p fp8 with --fp8-stats).
 */
static inline void logger_init(Logger* lg, const char* dir, int resume_step, int fp8_stats) {
    memset(lg, 0, sizeof(*lg));
    if (dir == NULL) return;
    make_dir(dir);
    snprintf(lg->dir, sizeof(lg->dir), "%s", dir);
    const char* names[3] = {"main.log", "metrics.jsonl", "fp8_stats.csv"};
    const char* step_formats[3] = {"s:%d", "{\"step\": %d", "%d,"};
    FILE** files[3] = {&lg->main_log, &lg->metrics, &lg->fp8_stats};
    for (int i = 0; i < 3; i++) {
        if (i == 2 && !fp8_stats) continue;
        char path[PATH_LEN];
        snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
        int fresh = resume_step < 0 || access(path, F_OK) != 0;
        if (!fresh) logger_truncate(path, step_formats[i], resume_step);
        *files[i] = fopenCheck(path, fresh ? "w" : "a");
        if (i == 2 && fresh) {
            fprintf(lg->fp8_stats, "step,layer,gemm,operand,format,amax,scale,saturated_frac,underflow_frac\n");
            logger_flush_file(lg, lg->fp8_stats, names[i]);
        }
    }
}

/* A float as JSON: round-trippable (%.9g), and null when not finite (JSON has no NaN or Infinity). */
static inline const char* json_float(char* buf, size_t len, float x) {
    if (isfinite(x)) snprintf(buf, len, "%.9g", x);
    else snprintf(buf, len, "null");
    return buf;
}

static inline void logger_train(Logger* lg, int step, float loss, float lr, float grad_norm, double ms,
                                double tokens_per_s, double mfu, double mem_mib, double comm_ms, int skipped,
                                const char* linears) {
    if (lg->main_log) {
        fprintf(lg->main_log, "s:%d trl:%f\n", step, loss);
        logger_flush_file(lg, lg->main_log, "main.log");
    }
    if (lg->metrics) {
        char l[32], r[32], g[32];
        fprintf(lg->metrics,
                "{\"step\": %d, \"loss\": %s, \"lr\": %s, \"grad_norm\": %s, \"ms\": %.3f, \"tokens_per_s\": %.1f, "
                "\"mfu\": %.4f, \"mem_mib\": %.1f, \"comm_exposed_ms\": %.3f, \"skipped\": %d, \"linears\": \"%s\"}\n",
                step, json_float(l, sizeof(l), loss), json_float(r, sizeof(r), lr), json_float(g, sizeof(g), grad_norm), ms,
                tokens_per_s, mfu, mem_mib, comm_ms, skipped, linears);
        logger_flush_file(lg, lg->metrics, "metrics.jsonl");
    }
}

static inline void logger_val(Logger* lg, int step, float val_loss) {
    if (lg->main_log) {
        fprintf(lg->main_log, "s:%d tel:%f\n", step, val_loss);
        logger_flush_file(lg, lg->main_log, "main.log");
    }
    if (lg->metrics) {
        char v[32];
        fprintf(lg->metrics, "{\"step\": %d, \"val_loss\": %s}\n", step, json_float(v, sizeof(v), val_loss));
        logger_flush_file(lg, lg->metrics, "metrics.jsonl");
    }
}

/*
 * A downstream evaluation's scores (train/evals.h): one metrics object {"step", "eval": name, each
 * metric, "examples"}; main_log_value, when finite, also as llm.c's "s:<step> eval:<value>" line
 * (HellaSwag: llm.c's own accuracy).
 */
static inline void logger_eval(Logger* lg, int step, const char* name, const char* const* keys, const double* values, int n,
                               int examples, double main_log_value) {
    if (lg->main_log && isfinite(main_log_value)) {
        fprintf(lg->main_log, "s:%d eval:%f\n", step, main_log_value);
        logger_flush_file(lg, lg->main_log, "main.log");
    }
    if (lg->metrics) {
        fprintf(lg->metrics, "{\"step\": %d, \"eval\": \"%s\"", step, name);
        for (int i = 0; i < n; i++) {
            if (isfinite(values[i])) fprintf(lg->metrics, ", \"%s\": %.17g", keys[i], values[i]); /* round-trips a double */
            else fprintf(lg->metrics, ", \"%s\": null", keys[i]);
        }
        fprintf(lg->metrics, ", \"examples\": %d}\n", examples);
        logger_flush_file(lg, lg->metrics, "metrics.jsonl");
    }
}

/* A shadow check (train/shadow.h): its result, whether it was over --shadow-tol, and the checks' share of
   the step time so far. */
static inline void logger_shadow(Logger* lg, int step, const ShadowResult* r, int over_tol, double share) {
    if (lg->metrics == NULL) return;
    char a[32], b[32], c[32];
    fprintf(lg->metrics, "{\"step\": %d, \"shadow_loss_fp8\": %s, \"shadow_loss_bf16\": %s, \"shadow_rel_diff\": %s, "
            "\"shadow_over_tol\": %d, \"shadow_ms\": %.3f, \"shadow_share\": %.6f",
            step, json_float(a, sizeof(a), (float)r->loss_fp8), json_float(b, sizeof(b), (float)r->loss_bf16),
            json_float(c, sizeof(c), (float)r->rel), over_tol, r->ms, share);
    if (r->has_grad) {
        char d[32], e[32], f[32], g[32];
        fprintf(lg->metrics, ", \"grad_cosine\": %s, \"grad_norm_rel_diff\": %s, \"grad_worst_layer\": %d, "
                "\"grad_worst_cosine\": %s, \"grad_worst_norm_rel_diff\": %s",
                json_float(d, sizeof(d), (float)r->cosine), json_float(e, sizeof(e), (float)r->norm_rel), r->worst_layer,
                json_float(f, sizeof(f), (float)r->worst_cosine), json_float(g, sizeof(g), (float)r->worst_norm_rel));
    }
    fprintf(lg->metrics, "}\n");
    logger_flush_file(lg, lg->metrics, "metrics.jsonl");
}

/* A policy event of step `step`: "fallback" (the next steps run BF16) or "recover" (back to FP8). */
static inline void logger_event(Logger* lg, int step, const char* event, const char* reason) {
    if (lg->metrics == NULL) return;
    fprintf(lg->metrics, "{\"step\": %d, \"event\": \"%s\", \"reason\": \"%s\"}\n", step, event, reason);
    logger_flush_file(lg, lg->metrics, "metrics.jsonl");
}

/* An FP8 health alert (train/fp8_alerts.h). */
static inline void logger_alert(Logger* lg, int step, const char* kind, int layer, const char* gemm, const char* operand,
                                double value, double threshold) {
    if (lg->metrics == NULL) return;
    fprintf(lg->metrics, "{\"step\": %d, \"alert\": \"%s\", \"layer\": %d, \"gemm\": \"%s\", \"operand\": \"%s\", "
            "\"value\": %.6g, \"threshold\": %.6g}\n", step, kind, layer, gemm, operand, value, threshold);
    logger_flush_file(lg, lg->metrics, "metrics.jsonl");
}

static inline void logger_fp8(Logger* lg, int step, int layer, const char* gemm, const char* operand, const char* format,
                              float amax, float scale, double saturated_frac, double underflow_frac) {
    if (lg->fp8_stats == NULL) return;
    /* amax and scale to 9 digits: the float values exactly (a reference can recompute the scales bit for bit) */
    fprintf(lg->fp8_stats, "%d,%d,%s,%s,%s,%.9g,%.9g,%.6e,%.6e\n", step, layer, gemm, operand, format, amax, scale,
            saturated_frac, underflow_frac);
}

static inline void logger_flush(Logger* lg) {
    if (lg->fp8_stats) logger_flush_file(lg, lg->fp8_stats, "fp8_stats.csv");
}

static inline void logger_free(Logger* lg) {
    if (lg->main_log) fcloseCheck(lg->main_log, "main.log");
    if (lg->metrics) fcloseCheck(lg->metrics, "metrics.jsonl");
    if (lg->fp8_stats) fcloseCheck(lg->fp8_stats, "fp8_stats.csv");
    memset(lg, 0, sizeof(*lg));
}
