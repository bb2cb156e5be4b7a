/*
 * The model checkpoint format, read and written by both builds and by scripts/llm8_checkpoint.py
 * (docs/formats.md "Model checkpoint"): a header of HEADER_INTS int32 words (magic, version, every config
 * field, the parameters' dtype; unused words 0) followed by the float32 parameters in params.h's order.
 * Writes go through core/common.h's atomic_open / atomic_commit, so a crash never leaves half a file.
 */
#pragma once

#include "config.h"
#include "params.h"

#define MODEL_MAGIC 20251129
#define MODEL_VERSION 1
/* Every llm8 file header (checkpoints, training state, reference state) is this many int32 words. */
#define HEADER_INTS 256
#define DTYPE_FLOAT32 0

/* Word offsets of the model checkpoint header. */
enum {
    MODEL_HDR_MAGIC,
    MODEL_HDR_VERSION,
    MODEL_HDR_DIM,
    MODEL_HDR_N_LAYERS,
    MODEL_HDR_N_HEADS,
    MODEL_HDR_N_KV_HEADS,
    MODEL_HDR_FFN_DIM,
    MODEL_HDR_VOCAB_SIZE,
    MODEL_HDR_MAX_SEQ_LEN,
    MODEL_HDR_NORM_EPS,   /* float32 bits */
    MODEL_HDR_ROPE_THETA, /* float32 bits */
    MODEL_HDR_DTYPE,
};

/* The bits of a float32 as a header word, and back. */
static inline int32_t f32_word(float x) {
    int32_t w;
    memcpy(&w, &x, 4);
    return w;
}

static inline float word_f32(int32_t w) {
    float x;
    memcpy(&x, &w, 4);
    return x;
}

/*
 * Opens a model checkpoint, checks magic, version, dtype, the model's invariants on the header's config
 * (before any size is computed from it) and that the file size matches the header, and returns the file
 * positioned at the parameters. Stops with one line naming the file otherwise.
 */
static inline FILE* checkpoint_open(const char* path, LlamaConfig* cfg) {
    FILE* f = fopenCheck(path, "rb");
    size_t bytes = file_size(f, path);
    if (bytes < HEADER_INTS * sizeof(int32_t)) die("%s: truncated model checkpoint: %zu bytes, shorter than its header", path, bytes);
    int32_t h[HEADER_INTS];
    freadCheck(h, sizeof(int32_t), HEADER_INTS, f, path);
    if (h[MODEL_HDR_MAGIC] != MODEL_MAGIC)
        die("%s: bad magic %d in model checkpoint (expected %d)", path, h[MODEL_HDR_MAGIC], MODEL_MAGIC);
    if (h[MODEL_HDR_VERSION] != MODEL_VERSION)
        die("%s: unsupported model checkpoint version %d (expected %d)", path, h[MODEL_HDR_VERSION], MODEL_VERSION);
    if (h[MODEL_HDR_DTYPE] != DTYPE_FLOAT32)
        die("%s: unsupported parameter dtype %d (expected 0 = float32)", path, h[MODEL_HDR_DTYPE]);
    cfg->dim = h[MODEL_HDR_DIM];
    cfg->n_layers = h[MODEL_HDR_N_LAYERS];
    cfg->n_heads = h[MODEL_HDR_N_HEADS];
    cfg->n_kv_heads = h[MODEL_HDR_N_KV_HEADS];
    cfg->ffn_dim = h[MODEL_HDR_FFN_DIM];
    cfg->vocab_size = h[MODEL_HDR_VOCAB_SIZE];
    cfg->max_seq_len = h[MODEL_HDR_MAX_SEQ_LEN];
    cfg->norm_eps = word_f32(h[MODEL_HDR_NORM_EPS]);
    cfg->rope_theta = word_f32(h[MODEL_HDR_ROPE_THETA]);
    char why[256];
    if (llama_config_problem(cfg, why, sizeof(why))) die("%s: bad model config in the header: %s", path, why);
    /* compared in parameters, not bytes: a header's count times 4 may not fit a size_t */
    size_t count = param_count(cfg), stored = bytes - HEADER_INTS * sizeof(int32_t);
    if (stored % sizeof(float) != 0 || count != stored / sizeof(float))
        die("%s: truncated or oversized model checkpoint: its config has %zu parameters, %zu bytes follow the header", path, count, stored);
    return f;
}

/* Reads the config of a checkpoint (validating the file). */
static inline void checkpoint_read_config(const char* path, LlamaConfig* cfg) {
    FILE* f = checkpoint_open(path, cfg);
    fcloseCheck(f, path);
}

/* Reads the parameters (float32, param_count(cfg) elements) of a checkpoint whose config is *cfg. */
static inline void checkpoint_read_params(const char* path, const LlamaConfig* cfg, float* params) {
    LlamaConfig file_cfg;
    FILE* f = checkpoint_open(path, &file_cfg);
    if (memcmp(&file_cfg, cfg, sizeof(LlamaConfig)) != 0) die("%s: model config differs from the run's", path);
    freadCheck(params, sizeof(float), param_count(cfg), f, path);
    fcloseCheck(f, path);
}

/*
 * Starts a model checkpoint: opens "<path>.tmp" (name in tmp) and writes the header; the caller writes
 * the param_count(cfg) float32 parameters and finishes with atomic_commit(f, tmp, path).
 */
static inline FILE* checkpoint_write_begin(const char* path, char* tmp, size_t tmp_len, const LlamaConfig* cfg) {
    int32_t h[HEADER_INTS];
    memset(h, 0, sizeof(h));
    h[MODEL_HDR_MAGIC] = MODEL_MAGIC;
    h[MODEL_HDR_VERSION] = MODEL_VERSION;
    h[MODEL_HDR_DIM] = cfg->dim;
    h[MODEL_HDR_N_LAYERS] = cfg->n_layers;
    h[MODEL_HDR_N_HEADS] = cfg->n_heads;
    h[MODEL_HDR_N_KV_HEADS] = cfg->n_kv_heads;
    h[MODEL_HDR_FFN_DIM] = cfg->ffn_dim;
    h[MODEL_HDR_VOCAB_SIZE] = cfg->vocab_size;
    h[MODEL_HDR_MAX_SEQ_LEN] = cfg->max_seq_len;
    h[MODEL_HDR_NORM_EPS] = f32_word(cfg->norm_eps);
    h[MODEL_HDR_ROPE_THETA] = f32_word(cfg->rope_theta);
    h[MODEL_HDR_DTYPE] = DTYPE_FLOAT32;
    FILE* f = atomic_open(path, tmp, tmp_len);
    fwriteCheck(h, sizeof(int32_t), HEADER_INTS, f, tmp);
    return f;
}

/* Writes a model checkpoint atomically. params: float32, param_count(cfg) elements, on the host. */
static inline void checkpoint_write(const char* path, const LlamaConfig* cfg, const float* params) {
    char tmp[TMP_PATH_LEN];
    FILE* f = checkpoint_write_begin(path, tmp, sizeof(tmp), cfg);
    fwriteCheck(params, sizeof(float), param_count(cfg), f, tmp);
    atomic_commit(f, tmp, path);
}
