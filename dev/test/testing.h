/*
 * Test helpers shared by test_llama.c (CPU) and test_llama.cu (GPU): a tiny named-check registry with
 * `--list` / `--only NAME` so that pytest can run every check as its own test, error measures between a
 * tensor and its reference, and the reader of the HF reference state (docs/formats.md "Reference state").
 */
#pragma once

#include <math.h>

#include "../../core/common.h"
#include "../../llama/model_file.h"

/* ------------------------------------------------------------ registry */

typedef int (*CheckFn)(void); /* returns 0 on pass */

typedef struct {
    const char* name;
    CheckFn fn;
    const char* what;
} Check;

/* Prints a failure reason (one line) and returns 1 so that checks can `return fail(...)`. */
static inline int fail(const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("    FAIL: ");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    return 1;
}

/*
 * Runs the checks named on the command line (--only NAME, repeatable), or all; --list prints the names.
 * Ends with the line "N passed, N failed" and returns the exit status.
 */
static inline int run_checks(const Check* checks, int n, int argc, char** argv) {
    int only_count = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--list") == 0) {
            for (int k = 0; k < n; k++) printf("%s\n", checks[k].name);
            return 0;
        }
        if (strcmp(argv[i], "--only") == 0 && i + 1 < argc) {
            only_count++;
            i++;
            int found = 0;
            for (int k = 0; k < n; k++) found |= strcmp(checks[k].name, argv[i]) == 0;
            if (!found) die("unknown check '%s' (see --list)", argv[i]);
        } else if (strcmp(argv[i], "--only") == 0) {
            die("flag --only needs a check name");
        } else {
            die("unknown flag '%s' (use --list or --only NAME)", argv[i]);
        }
    }
    int passed = 0, failed = 0;
    for (int k = 0; k < n; k++) {
        int selected = only_count == 0;
        for (int i = 1; i < argc; i++) {
            if (strcmp(argv[i], "--only") == 0 && strcmp(argv[i + 1], checks[k].name) == 0) selected = 1;
        }
        if (!selected) continue;
        printf("[ %s ] %s\n", checks[k].name, checks[k].what);
        fflush(stdout);
        int rc = checks[k].fn();
        printf("%s %s\n", rc == 0 ? "ok  " : "FAIL", checks[k].name);
        fflush(stdout);
        if (rc == 0) passed++;
        else failed++;
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

/*
 * The run's random seed: $LLM8_TEST_SEED when set (to replay a run), else a fresh one; printed unless
 * the run only lists the checks.
 */
static inline uint64_t test_seed(int argc, char** argv) {
    const char* env = getenv("LLM8_TEST_SEED");
    uint64_t seed = env ? strtoull(env, NULL, 10) : (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 20);
    if (!(argc == 2 && strcmp(argv[1], "--list") == 0)) printf("LLM8_TEST_SEED=%llu\n", (unsigned long long)seed);
    return seed;
}

/* ------------------------------------------------------------ error measures */

typedef struct {
    double max_abs;  /* max |x - ref| */
    double rel_l2;   /* ||x - ref|| / ||ref|| */
    double ref_max;  /* max |ref| */
    int nonfinite;   /* x has a NaN or Inf */
} ErrorStats;

static inline ErrorStats error_stats(const float* x, const float* ref, size_t n) {
    ErrorStats e = {0.0, 0.0, 0.0, 0};
    double diff2 = 0.0, ref2 = 0.0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(x[i])) e.nonfinite = 1;
        double d = fabs((double)x[i] - (double)ref[i]);
        if (d > e.max_abs) e.max_abs = d;
        if (fabs((double)ref[i]) > e.ref_max) e.ref_max = fabs((double)ref[i]);
        diff2 += d * d;
        ref2 += (double)ref[i] * ref[i];
    }
    e.rel_l2 = ref2 > 0.0 ? sqrt(diff2 / ref2) : sqrt(diff2);
    return e;
}

/* ------------------------------------------------------------ reference state */

#define REF_MAGIC 20251201
#define REF_MODEL_PATH "dev/reference/llama_ref_model.bin"
#define REF_STATE_PATH "dev/reference/llama_ref_state.bin"

typedef struct {
    int B, T, steps;
    float lr, weight_decay, beta1, beta2, eps, clip;
    size_t num_params;
    int* inputs;   /* (B, T) */
    int* targets;  /* (B, T) */
    float* logits; /* (B, T, V) */
    float loss;
    float* grads;  /* (P) */
    float* losses; /* (steps) */
} RefState;

/* Reads the reference state for a model of config cfg; stops naming the file on a malformed one. */
static inline void ref_state_read(RefState* r, const char* path, const LlamaConfig* cfg) {
    FILE* f = fopenCheck(path, "rb");
    int32_t h[HEADER_INTS];
    freadCheck(h, sizeof(int32_t), HEADER_INTS, f, path);
    if (h[0] != REF_MAGIC || h[1] != 1) die("%s: not a version-1 reference state (magic %d, version %d)", path, h[0], h[1]);
    r->B = h[2];
    r->T = h[3];
    r->steps = h[4];
    r->lr = word_f32(h[5]);
    r->weight_decay = word_f32(h[6]);
    r->beta1 = word_f32(h[7]);
    r->beta2 = word_f32(h[8]);
    r->eps = word_f32(h[9]);
    r->clip = word_f32(h[10]);
    r->num_params = (size_t)(uint32_t)h[11];
    if (r->num_params != param_count(cfg)) die("%s: %zu parameters, the reference model has %zu", path, r->num_params, param_count(cfg));
    size_t N = (size_t)r->B * r->T, V = (size_t)cfg->vocab_size;
    int* tokens = (int*)mallocCheck(N * 2 * sizeof(int));
    int32_t* raw = (int32_t*)mallocCheck((size_t)r->B * (r->T + 1) * sizeof(int32_t));
    freadCheck(raw, sizeof(int32_t), (size_t)r->B * (r->T + 1), f, path);
    r->inputs = tokens;
    r->targets = tokens + N;
    for (int b = 0; b < r->B; b++) {
        for (int t = 0; t < r->T; t++) {
            r->inputs[b * r->T + t] = raw[b * (r->T + 1) + t];
            r->targets[b * r->T + t] = raw[b * (r->T + 1) + t + 1];
        }
    }
    free(raw);
    r->logits = (float*)mallocCheck(N * V * sizeof(float));
    r->grads = (float*)mallocCheck(r->num_params * sizeof(float));
    r->losses = (float*)mallocCheck((size_t)r->steps * sizeof(float));
    freadCheck(r->logits, sizeof(float), N * V, f, path);
    freadCheck(&r->loss, sizeof(float), 1, f, path);
    freadCheck(r->grads, sizeof(float), r->num_params, f, path);
    freadCheck(r->losses, sizeof(float), (size_t)r->steps, f, path);
    char extra;
    if (fread(&extra, 1, 1, f) != 0) die("%s: trailing bytes after the reference state", path);
    fcloseCheck(f, path);
}

/*
 * Writes r in the reference-state format (docs/formats.md), e.g. a CPU run of the reference batch that
 * the GPU build is then compared with. V: vocabulary size of the model.
 */
static inline void ref_state_write(const char* path, const RefState* r, int V) {
    int32_t h[HEADER_INTS];
    memset(h, 0, sizeof(h));
    h[0] = REF_MAGIC;
    h[1] = 1;
    h[2] = r->B;
    h[3] = r->T;
    h[4] = r->steps;
    h[5] = f32_word(r->lr);
    h[6] = f32_word(r->weight_decay);
    h[7] = f32_word(r->beta1);
    h[8] = f32_word(r->beta2);
    h[9] = f32_word(r->eps);
    h[10] = f32_word(r->clip);
    h[11] = (int32_t)r->num_params;
    size_t N = (size_t)r->B * r->T;
    int32_t* raw = (int32_t*)mallocCheck((size_t)r->B * (r->T + 1) * sizeof(int32_t));
    for (int b = 0; b < r->B; b++) {
        for (int t = 0; t < r->T; t++) raw[b * (r->T + 1) + t] = r->inputs[b * r->T + t];
        raw[b * (r->T + 1) + r->T] = r->targets[b * r->T + r->T - 1];
    }
    char tmp[TMP_PATH_LEN];
    FILE* f = atomic_open(path, tmp, sizeof(tmp));
    fwriteCheck(h, sizeof(int32_t), HEADER_INTS, f, tmp);
    fwriteCheck(raw, sizeof(int32_t), (size_t)r->B * (r->T + 1), f, tmp);
    fwriteCheck(r->logits, sizeof(float), N * (size_t)V, f, tmp);
    fwriteCheck(&r->loss, sizeof(float), 1, f, tmp);
    fwriteCheck(r->grads, sizeof(float), r->num_params, f, tmp);
    fwriteCheck(r->losses, sizeof(float), (size_t)r->steps, f, tmp);
    atomic_commit(f, tmp, path);
    free(raw);
}

static inline void ref_state_free(RefState* r) {
    free(r->inputs);
    free(r->logits);
    free(r->grads);
    free(r->losses);
}
