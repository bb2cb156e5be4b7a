/*
 * The parameter layout: nine tensors packed back to back in one buffer, in the order the checkpoint
 * stores them (docs/formats.md "Model checkpoint"). q/k/v are fused row-wise into wqkv = [wq; wk; wv] and the
 * SwiGLU gate/up projections into w13 = [w1; w3], as Megatron-LM does, so each block runs four linear
 * layers (four FP8 GEMMs per pass) whose weights each get one FP8 scale.
 * Shared by both builds; also the Llama-style initialisation, which runs on the host so that the CPU
 * and GPU builds start from identical weights.
 */
#pragma once

#include <math.h>

#include "config.h"
#include "../core/rng.h"

enum {
    P_TOK_EMBEDDINGS, /* (V, C) */
    P_ATTN_NORM,      /* (L, C) */
    P_WQKV,           /* (L, C + 2*KVC, C) */
    P_WO,             /* (L, C, C) */
    P_FFN_NORM,       /* (L, C) */
    P_W13,            /* (L, 2*F, C) */
    P_W2,             /* (L, C, F) */
    P_NORM,           /* (C) */
    P_OUTPUT,         /* (V, C) */
    NUM_PARAM_TENSORS
};

static const char* const PARAM_NAMES[NUM_PARAM_TENSORS] = {
    "tok_embeddings", "attn_norm", "wqkv", "wo", "ffn_norm", "w13", "w2", "norm", "output",
};

/* Element counts of the nine tensors. */
static inline void param_sizes(const LlamaConfig* c, size_t sizes[NUM_PARAM_TENSORS]) {
    size_t C = (size_t)c->dim, L = (size_t)c->n_layers, V = (size_t)c->vocab_size, F = (size_t)c->ffn_dim;
    size_t QKV = (size_t)llama_qkv_dim(c);
    sizes[P_TOK_EMBEDDINGS] = V * C;
    sizes[P_ATTN_NORM] = L * C;
    sizes[P_WQKV] = L * QKV * C;
    sizes[P_WO] = L * C * C;
    sizes[P_FFN_NORM] = L * C;
    sizes[P_W13] = L * 2 * F * C;
    sizes[P_W2] = L * C * F;
    sizes[P_NORM] = C;
    sizes[P_OUTPUT] = V * C;
}

static inline size_t param_count(const LlamaConfig* c) {
    size_t sizes[NUM_PARAM_TENSORS], total = 0;
    param_sizes(c, sizes);
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) total += sizes[i];
    return total;
}

/* Element offset of each tensor in the packed buffer. */
static inline void param_offsets(const LlamaConfig* c, size_t offsets[NUM_PARAM_TENSORS]) {
    size_t sizes[NUM_PARAM_TENSORS], off = 0;
    param_sizes(c, sizes);
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) {
        offsets[i] = off;
        off += sizes[i];
    }
}

/* Tensors with one slice per layer (attn_norm, wqkv, wo, ffn_norm, w13, w2); the others have one. */
static inline int param_is_per_layer(int tensor) { return tensor != P_TOK_EMBEDDINGS && tensor != P_NORM && tensor != P_OUTPUT; }

/*
 * A segment of the parameter vector: one tensor, or one layer of a per-layer tensor. Segments are the
 * unit of gradient norms and error messages, of ZeRO sharding (comm/zero.h) and of the communication
 * buckets; listed in checkpoint order they tile the vector.
 */
typedef struct {
    int tensor;          /* P_* */
    int layer;           /* its layer, or -1 for a tensor that is not per layer */
    size_t param_offset; /* first element, in checkpoint order */
    size_t count;        /* elements */
} ParamSegment;

/* Number of segments: one per tensor that is not per layer, one per layer of the others. */
static inline int param_segment_count(const LlamaConfig* c) {
    int n = 0;
    for (int t = 0; t < NUM_PARAM_TENSORS; t++) n += param_is_per_layer(t) ? c->n_layers : 1;
    return n;
}

/* Fills the param_segment_count(c) segments in checkpoint order. */
static inline void param_segments(const LlamaConfig* c, ParamSegment* seg) {
    size_t sizes[NUM_PARAM_TENSORS], off = 0;
    param_sizes(c, sizes);
    int n = 0;
    for (int t = 0; t < NUM_PARAM_TENSORS; t++) {
        int parts = param_is_per_layer(t) ? c->n_layers : 1;
        for (int k = 0; k < parts; k++) {
            seg[n].tensor = t;
            seg[n].layer = param_is_per_layer(t) ? k : -1;
            seg[n].param_offset = off;
            seg[n].count = sizes[t] / (size_t)parts;
            off += seg[n].count;
            n++;
        }
    }
}

/* "wqkv[layer 3]" style name of a segment. */
static inline void param_segment_name(const ParamSegment* s, char* out, size_t len) {
    if (s->layer < 0) snprintf(out, len, "%s", PARAM_NAMES[s->tensor]);
    else snprintf(out, len, "%s[layer %d]", PARAM_NAMES[s->tensor], s->layer);
}

/*
 * The linear layers: four per block (wqkv, wo, w13, w2: the FP8 GEMMs of -p fp8, docs/precision.md) and
 * the output layer, which stays in the activation type. A block linear's FP8 records are its slot,
 * layer * LIN_PER_LAYER + which.
 */
typedef enum { LIN_QKV, LIN_WO, LIN_W13, LIN_W2, LIN_OUTPUT } LinearId;
#define LIN_PER_LAYER 4
static const char* const LINEAR_NAMES[] = {"wqkv", "wo", "w13", "w2", "output"};
/* The `layer` of the output layer, which belongs to no block. */
#define NO_LAYER (-1)

/* The parameter tensor (P_*) of linear layer `lin`. */
static inline int llama_linear_tensor(LinearId lin) {
    static const int tensors[] = {P_WQKV, P_WO, P_W13, P_W2, P_OUTPUT};
    return tensors[lin];
}

/* Output width OC and input width C of linear layer `lin`. */
static inline void llama_linear_dims(const LlamaConfig* c, LinearId lin, size_t* out_dim, size_t* in_dim) {
    size_t C = (size_t)c->dim, F = (size_t)c->ffn_dim;
    size_t outs[] = {(size_t)llama_qkv_dim(c), C, 2 * F, C, (size_t)c->vocab_size};
    size_t ins[] = {C, C, C, F, C};
    *out_dim = outs[lin];
    *in_dim = ins[lin];
}

/* 2-D weight matrices get weight decay; the 1-D norm weights do not (Megatron-LM, llm.c convention). */
static inline int param_is_decayed(int tensor) {
    return tensor != P_ATTN_NORM && tensor != P_FFN_NORM && tensor != P_NORM;
}

#define INIT_STD 0.02f
#define INIT_CHUNK ((size_t)1 << 20)

/*
 * Llama-style random init of the elements [begin, begin + count) of the flat parameter vector (checkpoint
 * order) into out (count floats): every weight matrix N(0, 0.02), the residual output projections wo and
 * w2 N(0, 0.02 / sqrt(2 L)) (GPT-2 / Megatron-LM's scaled init), norm weights 1. Each 2^20-element
 * chunk of a tensor draws from its own stream seeded by (seed, tensor, chunk), so the values depend
 * neither on the thread count nor on how the vector is split into ranges (the trainer initialises the
 * GPU's master weights range by range through a bounded host buffer).
 */
static inline void llama_init_params_range(const LlamaConfig* c, uint64_t seed, size_t begin, size_t count, float* out) {
    size_t sizes[NUM_PARAM_TENSORS], offsets[NUM_PARAM_TENSORS];
    param_sizes(c, sizes);
    param_offsets(c, offsets);
    size_t end = begin + count;
    float residual_std = INIT_STD / sqrtf(2.0f * (float)c->n_layers);
    for (int t = 0; t < NUM_PARAM_TENSORS; t++) {
        size_t lo = offsets[t] > begin ? offsets[t] : begin;
        size_t hi = offsets[t] + sizes[t] < end ? offsets[t] + sizes[t] : end;
        if (lo >= hi) continue;
        if (!param_is_decayed(t)) {
            for (size_t i = lo; i < hi; i++) out[i - begin] = 1.0f;
            continue;
        }
        float std = (t == P_WO || t == P_W2) ? residual_std : INIT_STD;
        long long first = (long long)((lo - offsets[t]) / INIT_CHUNK), last = (long long)((hi - 1 - offsets[t]) / INIT_CHUNK);
#pragma omp parallel for schedule(static)
        for (long long k = first; k <= last; k++) {
            Rng rng;
            rng_seed(&rng, seed ^ ((uint64_t)(t + 1) << 56) ^ (uint64_t)k);
            size_t chunk_begin = offsets[t] + (size_t)k * INIT_CHUNK;
            size_t chunk_end = chunk_begin + INIT_CHUNK < offsets[t] + sizes[t] ? chunk_begin + INIT_CHUNK : offsets[t] + sizes[t];
            for (size_t i = chunk_begin; i < chunk_end && i < hi; i++) {
                float v = std * rng_normal(&rng); /* drawn in order from the chunk's start */
                if (i >= lo) out[i - begin] = v;
            }
        }
    }
}
