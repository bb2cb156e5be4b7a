/*
 * Downstream evaluations, during training and standalone (-x 0), in both builds: HellaSwag (-h 1),
 * LAMBADA (--eval-lambada) and WikiText (--eval-wikitext), scored as lm-evaluation-harness scores them
 * (docs/evaluation.md). The sets and their rows: dataloader/eval_sets.h.
 *
 * Rows go into micro-batches of -b rows by their global index, and micro-batch k runs on rank k mod
 * ranks: a micro-batch holds the same rows on every rank count, so FP8 current scaling (one amax per
 * micro-batch) scores the same, and each row's results have one contributor in the sum over ranks.
 * Every rank runs the same number of forwards (the last ones on padding), since a forward may
 * all-gather weights.
 */
#pragma once

#include "../dataloader/eval_sets.h"
#include "../comm/watchdog.h"
#include "../model/model.h"

#define EVAL_DUMP_MAGIC 20261203    /* --eval-dump files */

/*
 * --eval-dump: after a header of int32 {20261203, 2, V, 0}, each of this rank's rows as the model saw
 * it: int32 record, choice, len, n_score, target_from (the index of its first scored token in the
 * record's continuation, or document), its len tokens, then the V logits (FP32) of each of its n_score
 * scored positions. Written to DIR/<set>_step<step>.rank<rank>.bin, for dev/test's independent scorer.
 */
static inline FILE* eval_dump_open(const char* dir, const EvalSet* s, int step, int rank, int V, char* path, size_t len) {
    make_dir(dir);
    snprintf(path, len, "%s/%s_step%d.rank%d.bin", dir, EVAL_NAMES[s->kind], step, rank);
    FILE* f = fopenCheck(path, "wb");
    int32_t header[4] = {EVAL_DUMP_MAGIC, 2, V, 0};
    fwriteCheck(header, sizeof(int32_t), 4, f, path);
    return f;
}

/*
 * Runs set s on the model in micro-batches of B rows of T positions (B, T: the model's) and returns its
 * scores, the same on every rank and for every rank count (see the banner). dump_dir: --eval-dump, or NULL.
 */
static inline EvalScores eval_run(Llama* m, const EvalSet* s, int rank, int world, int step, const char* dump_dir) {
    int B = m->opt.B, T = m->opt.T, V = m->cfg.vocab_size;
    size_t N = (size_t)B * T;
    int batches = (s->n_rows + B - 1) / B, rounds = (batches + world - 1) / world;
    double* ll = (double*)callocCheck((size_t)s->n_rows, sizeof(double));
    double* greedy = (double*)callocCheck((size_t)s->n_rows, sizeof(double));
    int* inputs = (int*)mallocCheck(N * sizeof(int));
    int* targets = (int*)mallocCheck(N * sizeof(int));
    float* row = (float*)mallocCheck((size_t)V * sizeof(float));
    int need_logits = s->kind == EVAL_LAMBADA || dump_dir != NULL;
    char dump_path[PATH_LEN];
    FILE* dump = dump_dir ? eval_dump_open(dump_dir, s, step, rank, V, dump_path, sizeof(dump_path)) : NULL;
    for (int round = 0; round < rounds; round++) {
        watchdog_phase(EVAL_NAMES[s->kind], step);
        int k = round * world + rank;
        /* padding: EOS everywhere (a partial last batch, or a rank's forward past the last batch) */
        for (size_t i = 0; i < N; i++) inputs[i] = targets[i] = LLAMA_EOS;
        for (int b = 0; b < B && k < batches && k * B + b < s->n_rows; b++) {
            const EvalRow* r = &s->rows[k * B + b];
            const int* x = s->tokens + r->offset;
            memcpy(inputs + (size_t)b * T, x, (size_t)(r->len - 1) * sizeof(int));
            memcpy(targets + (size_t)b * T, x + 1, (size_t)(r->len - 1) * sizeof(int));
        }
        llama_forward(m, inputs, NULL, B, T, 0.0f);
        if (k >= batches) continue;
        int first = k * B, count = s->n_rows - first < B ? s->n_rows - first : B;
        for (int b = 0; b < count && need_logits; b++) {
            const EvalRow* r = &s->rows[first + b];
            int hit = 1;
            if (dump) {
                int32_t head[5] = {r->record, r->choice, r->len, r->n_score, r->target_from};
                fwriteCheck(head, sizeof(int32_t), 5, dump, dump_path);
                fwriteCheck(s->tokens + r->offset, sizeof(int), (size_t)r->len, dump, dump_path);
            }
            for (int j = 0; j < r->n_score; j++) {
                size_t p = (size_t)b * T + (size_t)(r->len - 1 - r->n_score + j);
                llama_logits_row(m, p, row);
                int best = 0;
                for (int v = 1; v < V; v++) best = row[v] > row[best] ? v : best;
                hit = hit && best == targets[p];
                if (dump) fwriteCheck(row, sizeof(float), (size_t)V, dump, dump_path);
            }
            greedy[first + b] = hit;
        }
        const float* losses = llama_token_losses(m, targets);
        for (int b = 0; b < count; b++) {
            const EvalRow* r = &s->rows[first + b];
            double sum = 0.0;
            for (int j = r->len - 1 - r->n_score; j < r->len - 1; j++) sum += losses[(size_t)b * T + (size_t)j];
            ll[first + b] = -sum;
        }
    }
    if (dump) fcloseCheck(dump, dump_path);
    watchdog_phase("eval reduction", step);
    comm_host_sum(ll, (size_t)s->n_rows);
    comm_host_sum(greedy, (size_t)s->n_rows);
    EvalScores out = eval_scores(s, ll, greedy);
    free(ll);
    free(greedy);
    free(inputs);
    free(targets);
    free(row);
    return out;
}
