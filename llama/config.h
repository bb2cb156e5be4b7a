/*
 * Llama-2 model configuration: the hyper-parameters, the named presets (-e NAME), the precision
 * recipes (-p), and the start-up checks every build runs before allocating anything.
 * Dimensions follow Meta's Llama-2 release and HF `LlamaConfig` (hidden_size = dim, intermediate_size =
 * ffn_dim, num_key_value_heads = n_kv_heads).
 */
#pragma once

#include <math.h>
#include <string.h>

#include "../core/common.h"
#include "../fp8/fp8.h"

typedef struct {
    int dim;          /* C, model width */
    int n_layers;     /* L */
    int n_heads;      /* NH, query heads */
    int n_kv_heads;   /* NKV, key/value heads (grouped-query attention when < NH) */
    int ffn_dim;      /* F, SwiGLU hidden size */
    int vocab_size;   /* V */
    int max_seq_len;  /* longest T the RoPE tables cover */
    float norm_eps;   /* RMSNorm epsilon */
    float rope_theta; /* RoPE base */
} LlamaConfig;

#define LLAMA_VOCAB_SIZE 32000
#define LLAMA_NORM_EPS 1e-5f
#define LLAMA_ROPE_THETA 10000.0f
#define LLAMA_BOS 1
#define LLAMA_EOS 2

typedef struct {
    const char* name;
    LlamaConfig cfg;
    const char* note;
} LlamaPreset;

/* llama2-* are Meta's shapes; stories* are llama2.c's TinyStories shapes; tiny is the CI/demo model. */
static const LlamaPreset LLAMA_PRESETS[] = {
    {"llama2-7b", {4096, 32, 32, 32, 11008, LLAMA_VOCAB_SIZE, 4096, LLAMA_NORM_EPS, LLAMA_ROPE_THETA}, "Llama-2 7B"},
    {"llama2-13b", {5120, 40, 40, 40, 13824, LLAMA_VOCAB_SIZE, 4096, LLAMA_NORM_EPS, LLAMA_ROPE_THETA}, "Llama-2 13B"},
    {"llama2-70b", {8192, 80, 64, 8, 28672, LLAMA_VOCAB_SIZE, 4096, LLAMA_NORM_EPS, LLAMA_ROPE_THETA}, "Llama-2 70B (GQA)"},
    {"stories110m", {768, 12, 12, 12, 2048, LLAMA_VOCAB_SIZE, 1024, LLAMA_NORM_EPS, LLAMA_ROPE_THETA}, "llama2.c 110M"},
    {"stories42m", {512, 8, 8, 8, 1376, LLAMA_VOCAB_SIZE, 1024, LLAMA_NORM_EPS, LLAMA_ROPE_THETA}, "llama2.c 42M"},
    {"stories15m", {288, 6, 6, 6, 768, LLAMA_VOCAB_SIZE, 256, LLAMA_NORM_EPS, LLAMA_ROPE_THETA}, "llama2.c 15M"},
    {"tiny", {128, 4, 4, 2, 384, LLAMA_VOCAB_SIZE, 256, LLAMA_NORM_EPS, LLAMA_ROPE_THETA}, "demo/CI model, GQA"},
};
#define NUM_LLAMA_PRESETS (sizeof(LLAMA_PRESETS) / sizeof(LLAMA_PRESETS[0]))

/* Returns the preset called `name`, or NULL. */
static inline const LlamaConfig* llama_preset(const char* name) {
    for (size_t i = 0; i < NUM_LLAMA_PRESETS; i++) {
        if (strcmp(LLAMA_PRESETS[i].name, name) == 0) return &LLAMA_PRESETS[i].cfg;
    }
    return NULL;
}

static inline int llama_head_dim(const LlamaConfig* c) { return c->dim / c->n_heads; }
static inline int llama_kv_dim(const LlamaConfig* c) { return c->n_kv_heads * llama_head_dim(c); }
/* Output width of the fused q/k/v projection: C + 2 * KVC. */
static inline int llama_qkv_dim(const LlamaConfig* c) { return c->dim + 2 * llama_kv_dim(c); }

/* -p: which numeric recipe the run uses (docs/design.md#the-fp8-recipe). */
typedef enum { PRECISION_FP32 = 0, PRECISION_BF16 = 1, PRECISION_FP8 = 2 } Precision;
static const char* const PRECISION_NAMES[] = {"fp32", "bf16", "fp8"};

static inline const char* precision_name(Precision p) { return p >= PRECISION_FP32 && p <= PRECISION_FP8 ? PRECISION_NAMES[p] : "?"; }

/* -r: what backward rebuilds instead of reading it from memory (docs/memory.md "Recompute"). */
enum { RECOMPUTE_NONE, RECOMPUTE_NORMS, RECOMPUTE_BLOCKS, RECOMPUTE_LEVELS };

/*
 * Largest value of any config dimension. Llama-2 70B's widest is 28672 (ffn); with every dimension at
 * most 2^20 and the divisibility rules below, q/k/v widths fit an int and the parameter count (< 2^63)
 * a size_t, so a corrupt checkpoint header cannot make the size arithmetic overflow.
 */
#define LLAMA_MAX_DIM (1 << 20)

/*
 * The model's invariants: returns 0 when the config keeps them, else 1 with the first one it breaks in
 * `why` (one line). Checkpoint readers call it on a header before computing any size from it.
 */
static inline int llama_config_problem(const LlamaConfig* c, char* why, size_t len) {
    const int dims[] = {c->dim, c->n_layers, c->n_heads, c->n_kv_heads, c->ffn_dim, c->vocab_size, c->max_seq_len};
    for (size_t i = 0; i < sizeof(dims) / sizeof(dims[0]); i++) {
        if (dims[i] <= 0 || dims[i] > LLAMA_MAX_DIM) {
            snprintf(why, len, "every dimension must be in [1, %d] (dim %d, n_layers %d, n_heads %d, n_kv_heads %d, ffn_dim %d, vocab_size %d, max_seq_len %d)",
                     LLAMA_MAX_DIM, c->dim, c->n_layers, c->n_heads, c->n_kv_heads, c->ffn_dim, c->vocab_size, c->max_seq_len);
            return 1;
        }
    }
    if (c->dim % c->n_heads != 0) {
        snprintf(why, len, "dim %d is not a multiple of n_heads %d", c->dim, c->n_heads);
    } else if (c->n_heads % c->n_kv_heads != 0) {
        snprintf(why, len, "n_heads %d is not a multiple of n_kv_heads %d", c->n_heads, c->n_kv_heads);
    } else if (llama_head_dim(c) % 2 != 0) {
        snprintf(why, len, "head dim %d must be even for RoPE", llama_head_dim(c));
    } else if (!(c->norm_eps > 0.0f) || !(c->rope_theta > 0.0f)) {
        snprintf(why, len, "norm_eps and rope_theta must be positive");
    } else {
        return 0;
    }
    return 1;
}

/*
 * Checks a configuration against the model's invariants and, for -p fp8, against the FP8 GEMM's shape
 * rule; stops with one line naming the first offending dimension. B, T: micro-batch and sequence length.
 */
static inline void llama_config_validate(const LlamaConfig* c, int B, int T, Precision p) {
    char why[256];
    if (llama_config_problem(c, why, sizeof(why))) die("model config: %s", why);
    if (B <= 0 || T <= 0) die("micro-batch size -b %d and sequence length -t %d must be positive", B, T);
    if (T > c->max_seq_len) die("sequence length -t %d exceeds the model's max_seq_len %d", T, c->max_seq_len);
    if (p != PRECISION_FP8) return;
    struct { const char* what; long long value; } dims[] = {
        {"dim (C)", c->dim},
        {"q/k/v output width C + 2*KVC", llama_qkv_dim(c)},
        {"ffn_dim (F)", c->ffn_dim},
        {"micro-batch tokens B*T (-b * -t)", (long long)B * T},
    };
    for (size_t i = 0; i < sizeof(dims) / sizeof(dims[0]); i++) {
        if (dims[i].value % FP8_DIM_MULTIPLE != 0)
            die("-p fp8: %s = %lld is not a multiple of %d (FP8 GEMMs need every dimension to be)", dims[i].what,
                dims[i].value, FP8_DIM_MULTIPLE);
    }
}

/*
 * RoPE tables for positions [0, T), head dim HS: cos/sin (T, HS/2) of pos * inv_freq_i with HF's
 * inv_freq_i = theta^(-2i/HS) (rotate-half convention), computed in float64 then rounded.
 */
static inline void rope_tables(int T, int HS, float theta, float* cos_out, float* sin_out) {
    int half = HS / 2;
    for (int t = 0; t < T; t++) {
        for (int i = 0; i < half; i++) {
            double angle = (double)t / pow((double)theta, (2.0 * i) / (double)HS);
            cos_out[t * half + i] = (float)cos(angle);
            sin_out[t * half + i] = (float)sin(angle);
        }
    }
}

static inline void llama_config_print(const LlamaConfig* c) {
    printf("| model: dim %d, layers %d, heads %d, kv heads %d, head dim %d, ffn %d, vocab %d, max seq %d\n", c->dim,
           c->n_layers, c->n_heads, c->n_kv_heads, llama_head_dim(c), c->ffn_dim, c->vocab_size, c->max_seq_len);
}
