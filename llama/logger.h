/*
 * Run logs under -o DIR, written by rank 0 of either build:
 *   main.log        llm.c's lines, "s:<step> trl:<train loss>" and "s:<step> tel:<val loss>", so llm.c's
 *                   plotting tools read it unchanged;
 *   metrics.jsonl   one JSON object per optimizer step: step, loss, lr, grad_norm, ms, tokens_per_s, mfu,
 *                   mem_mib, skipped (and val_loss objects after evaluations);
 *   fp8_stats.csv   one row per FP8 GEMM operand on steps where statistics are due (--fp8-stats N):
 *                   step,layer,gemm,operand,format,amax,scale,saturated_frac,underflow_frac.
 * Lines are flushed as written so that a crashed run keeps its log. On resume the files are appended to.
 */
#pragma once

#include "common.h"

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

static inline void logger_init(Logger* lg, const char* dir, int resume) {
    memset(lg, 0, sizeof(*lg));
    if (dir == NULL) return;
    make_dir(dir);
    snprintf(lg->dir, sizeof(lg->dir), "%s", dir);
    char path[PATH_LEN];
    const char* mode = resume ? "a" : "w";
    snprintf(path, sizeof(path), "%s/main.log", dir);
    lg->main_log = fopenCheck(path, mode);
    snprintf(path, sizeof(path), "%s/metrics.jsonl", dir);
    lg->metrics = fopenCheck(path, mode);
    snprintf(path, sizeof(path), "%s/fp8_stats.csv", dir);
    int new_file = !resume || access(path, F_OK) != 0;
    lg->fp8_stats = fopenCheck(path, resume ? "a" : "w");
    if (new_file) {
        fprintf(lg->fp8_stats, "step,layer,gemm,operand,format,amax,scale,saturated_frac,underflow_frac\n");
        logger_flush_file(lg, lg->fp8_stats, "fp8_stats.csv");
    }
}

static inline void logger_train(Logger* lg, int step, float loss, float lr, float grad_norm, double ms,
                                double tokens_per_s, double mfu, double mem_mib, int skipped) {
    if (lg->main_log) {
        fprintf(lg->main_log, "s:%d trl:%f\n", step, loss);
        logger_flush_file(lg, lg->main_log, "main.log");
    }
    if (lg->metrics) {
        fprintf(lg->metrics,
                "{\"step\": %d, \"loss\": %.6f, \"lr\": %.6e, \"grad_norm\": %.6f, \"ms\": %.3f, \"tokens_per_s\": %.1f, "
                "\"mfu\": %.4f, \"mem_mib\": %.1f, \"skipped\": %d}\n",
                step, loss, lr, grad_norm, ms, tokens_per_s, mfu, mem_mib, skipped);
        logger_flush_file(lg, lg->metrics, "metrics.jsonl");
    }
}

static inline void logger_val(Logger* lg, int step, float val_loss) {
    if (lg->main_log) {
        fprintf(lg->main_log, "s:%d tel:%f\n", step, val_loss);
        logger_flush_file(lg, lg->main_log, "main.log");
    }
    if (lg->metrics) {
        fprintf(lg->metrics, "{\"step\": %d, \"val_loss\": %.6f}\n", step, val_loss);
        logger_flush_file(lg, lg->metrics, "metrics.jsonl");
    }
}

static inline void logger_fp8(Logger* lg, int step, int layer, const char* gemm, const char* operand, const char* format,
                              float amax, float scale, double saturated_frac, double underflow_frac) {
    if (lg->fp8_stats == NULL) return;
    fprintf(lg->fp8_stats, "%d,%d,%s,%s,%s,%.6e,%.6e,%.6e,%.6e\n", step, layer, gemm, operand, format, amax, scale,
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
