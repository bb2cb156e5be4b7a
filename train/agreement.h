/*
 * Start-up agreement of the ranks (docs/cluster.md): before anything that communicates, every rank
 * contributes the settings that must be equal everywhere (the run identity of train/checkpoint.h, the
 * ZeRO stage and every setting that decides when the ranks communicate or what they decide: steps,
 * validation, checkpoint and sample intervals, the schedule, the shadow check and its policy, the data's
 * token counts, the downstream evaluations' sets as loaded (their rows decide each rank's forwards), the build, and the math libraries, since two ranks computing with different BLAS kernels
 * would silently train different runs), and every rank compares all of them. On a difference every rank
 * stops: rank 0 says which setting differs on which ranks, in one line, and all exit non-zero within
 * seconds, where a mismatch would otherwise hang in a collective or die deep inside the loader
 * (llm.c#727).
 */
#pragma once

#include "checkpoint.h"
#include "../comm/comm.h"

/* Longest text setting compared (git describe of the build, backend_math_identity). */
#define SETTING_TEXT_LEN 128

typedef struct {
    RunIdentity id;
    int32_t zero_stage, steps, grad_accum_steps, val_every, val_batches, ckpt_every, sample_every;
    int32_t resume, fp8_stats_every, max_skips, overfit, warmup, schedule;
    int32_t shadow_every, shadow_grad, shadow_fallback, shadow_patience, shadow_recover;
    int32_t eval_every, eval_hellaswag, eval_lambada, eval_wikitext; /* the sets: eval_set_hash, 0 when off */
    int32_t warmup_pass; /* --warmup-pass: its collectives run on every rank or on none */
    float lr, final_lr_frac, weight_decay, grad_clip, shadow_tol;
    int64_t train_tokens, val_tokens;
    char build[SETTING_TEXT_LEN];
    char math[SETTING_TEXT_LEN];
} RankSettings;

typedef enum { SETTING_I32, SETTING_I64, SETTING_F32, SETTING_STR } SettingKind;

typedef struct {
    const char* flag;
    size_t offset;
    SettingKind kind;
} AgreedSetting;

#define AGREED(flag, field, kind) {flag, offsetof(RankSettings, field), kind}
static const AgreedSetting AGREED_SETTINGS[] = {
    AGREED("-z", zero_stage, SETTING_I32),
    AGREED("-x (steps)", steps, SETTING_I32),
    AGREED("gradient accumulation steps", grad_accum_steps, SETTING_I32),
    AGREED("-v", val_every, SETTING_I32),
    AGREED("-m", val_batches, SETTING_I32),
    AGREED("-n", ckpt_every, SETTING_I32),
    AGREED("-s", sample_every, SETTING_I32),
    AGREED("-y", resume, SETTING_I32),
    AGREED("--fp8-stats", fp8_stats_every, SETTING_I32),
    AGREED("--max-skips", max_skips, SETTING_I32),
    AGREED("-a", overfit, SETTING_I32),
    AGREED("-u", warmup, SETTING_I32),
    AGREED("-k", schedule, SETTING_I32),
    AGREED("--shadow-every", shadow_every, SETTING_I32),
    AGREED("--shadow-grad", shadow_grad, SETTING_I32),
    AGREED("--shadow-policy fallback", shadow_fallback, SETTING_I32),
    AGREED("--shadow-patience", shadow_patience, SETTING_I32),
    AGREED("--shadow-recover", shadow_recover, SETTING_I32),
    AGREED("--shadow-tol", shadow_tol, SETTING_F32),
    AGREED("--eval-every", eval_every, SETTING_I32),
    AGREED("--warmup-pass", warmup_pass, SETTING_I32),
    AGREED("-h 1 / --hellaswag (hash of its rows)", eval_hellaswag, SETTING_I32),
    AGREED("--eval-lambada (hash of its rows)", eval_lambada, SETTING_I32),
    AGREED("--eval-wikitext (hash of its rows)", eval_wikitext, SETTING_I32),
    AGREED("-l", lr, SETTING_F32),
    AGREED("-q", final_lr_frac, SETTING_F32),
    AGREED("-c", weight_decay, SETTING_F32),
    AGREED("--clip", grad_clip, SETTING_F32),
    AGREED("train data tokens (-i)", train_tokens, SETTING_I64),
    AGREED("validation data tokens (-j)", val_tokens, SETTING_I64),
    AGREED("build id", build, SETTING_STR),
    AGREED(LLM8_BACKEND_MATH, math, SETTING_STR),
};
#define NUM_AGREED_SETTINGS (sizeof(AGREED_SETTINGS) / sizeof(AGREED_SETTINGS[0]))

/* A setting's value as text, for the message. */
static inline void setting_text(const RankSettings* r, const AgreedSetting* s, char* out, size_t len) {
    const char* p = (const char*)r + s->offset;
    if (s->kind == SETTING_STR) {
        snprintf(out, len, "%.*s", SETTING_TEXT_LEN - 1, p); /* stored NUL-terminated */
        return;
    }
    if (s->kind == SETTING_F32) {
        float v;
        memcpy(&v, p, sizeof(v));
        snprintf(out, len, "%g", v);
        return;
    }
    long long v;
    if (s->kind == SETTING_I64) {
        int64_t x;
        memcpy(&x, p, sizeof(x));
        v = x;
    } else {
        int32_t x;
        memcpy(&x, p, sizeof(x));
        v = x;
    }
    snprintf(out, len, "%lld", v);
}

static inline size_t setting_size(SettingKind k) {
    return k == SETTING_I64 ? sizeof(int64_t) : k == SETTING_STR ? SETTING_TEXT_LEN : sizeof(int32_t);
}

/* The first setting on which a and b differ: its flag and both values as text; 0 when they agree. */
static inline int settings_diff(const RankSettings* a, const RankSettings* b, char* flag, size_t flag_len, char* va,
                                char* vb, size_t value_len) {
    if (memcmp(&a->id.cfg, &b->id.cfg, sizeof(LlamaConfig)) != 0) {
        snprintf(flag, flag_len, "model config (-e)");
        snprintf(va, value_len, "dim %d, %d layers", a->id.cfg.dim, a->id.cfg.n_layers);
        snprintf(vb, value_len, "dim %d, %d layers", b->id.cfg.dim, b->id.cfg.n_layers);
        return 1;
    }
    for (size_t k = 0; k < NUM_RUN_SETTINGS; k++) {
        long long x = run_setting_value(&a->id, &RUN_SETTINGS[k]), y = run_setting_value(&b->id, &RUN_SETTINGS[k]);
        if (x == y) continue;
        snprintf(flag, flag_len, "%s", RUN_SETTINGS[k].flag);
        run_setting_text(&a->id, &RUN_SETTINGS[k], va, value_len);
        run_setting_text(&b->id, &RUN_SETTINGS[k], vb, value_len);
        return 1;
    }
    if (memcmp(a->id.bf16_blocks, b->id.bf16_blocks, sizeof(a->id.bf16_blocks)) != 0) {
        snprintf(flag, flag_len, "--bf16-layers");
        run_identity_bf16_text(&a->id, va, value_len);
        run_identity_bf16_text(&b->id, vb, value_len);
        return 1;
    }
    for (size_t k = 0; k < NUM_AGREED_SETTINGS; k++) {
        const AgreedSetting* s = &AGREED_SETTINGS[k];
        if (memcmp((const char*)a + s->offset, (const char*)b + s->offset, setting_size(s->kind)) == 0) continue;
        snprintf(flag, flag_len, "%s", s->flag);
        setting_text(a, s, va, value_len);
        setting_text(b, s, vb, value_len);
        return 1;
    }
    return 0;
}

/*
 * Exchanges `mine` with every rank and stops every rank (exit 1) if any rank's settings differ from rank
 * 0's; rank 0 names the first differing setting, its values and the ranks that differ.
 */
static inline void agreement_check(const RankSettings* mine) {
    int W = g_dist.world;
    if (W == 1) return;
    RankSettings* all = (RankSettings*)callocCheck((size_t)W, sizeof(RankSettings));
    comm_host_all_gather(mine, all, sizeof(RankSettings));
    char flag[96] = "", v0[SETTING_TEXT_LEN] = "", vr[SETTING_TEXT_LEN] = "", ranks[256] = "";
    int first = -1;
    size_t used = 0;
    for (int r = 1; r < W; r++) {
        char f[96], a[SETTING_TEXT_LEN], b[SETTING_TEXT_LEN];
        if (!settings_diff(&all[0], &all[r], f, sizeof(f), a, b, sizeof(a))) continue;
        if (first < 0) {
            first = r;
            snprintf(flag, sizeof(flag), "%s", f);
            snprintf(v0, sizeof(v0), "%s", a);
            snprintf(vr, sizeof(vr), "%s", b);
        }
        if (used + 16 < sizeof(ranks)) used += (size_t)snprintf(ranks + used, sizeof(ranks) - used, "%s%d", used ? ", " : "", r);
    }
    free(all);
    if (first < 0) return;
    if (g_dist.rank == 0)
        fprintf(stderr, "error: the ranks disagree on %s: rank 0 has %s, rank %d has %s (ranks that differ from rank 0: %s); every rank must run with the same settings\n",
                flag, v0, first, vr, ranks);
    fflush(stderr);
    exit(EXIT_FAILURE);
}
