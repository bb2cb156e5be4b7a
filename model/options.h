/*
 * How a model is built: the one options struct llama_build takes besides the config. The trainer fills
 * it from the command line (train/cli.h train_args_model_options), the memory plan from the same flags,
 * the tests by hand from model_options(). Nothing in it changes after the build; what does change while
 * a run trains (the linears' precision, the data-parallel hooks) are the model's modes (model/llama.h).
 */
#pragma once

#include "../llama/config.h"
#include "../llama/optim.h"
#include "../fp8/fp8.h"
#include "../fp8/gemm.h"

/* How the parameters are spread over the data-parallel ranks (-z; docs/cluster.md). */
typedef struct {
    int world;      /* data-parallel ranks */
    int rank;       /* this one */
    int zero_stage; /* 0: everything everywhere; 1: optimizer state sharded; 2: gradients sharded too */
} Sharding;

/* One process, everything on it: the sharding of tests and single-rank runs. */
static const Sharding SINGLE_PROCESS = {1, 0, 0};

/* The FP8 recipe of an fp8 run (docs/precision.md). */
typedef struct {
    int pow2_scales;       /* --pow2-scales: round scales down to powers of two */
    Fp8Recipe recipe;      /* --fp8-recipe */
    int amax_history;      /* --amax-history: entries per X / dY record (delayed) */
    Fp8AmaxAlgo amax_algo; /* --amax-algo (delayed) */
    int margin;            /* --fp8-margin (delayed) */
    int fprop_fast_accum;  /* --fp8-fast-accum: fprop's GEMMs with Hopper's fast accumulation */
    Fp8Accum accum;        /* --fp8-accum: how the FP8 GEMMs accumulate (the Hopper model: CPU build only) */
} Fp8Settings;

/* Transformer Engine's: current scaling, fast accumulation in fprop; DelayedScaling's history 1024, max, margin 0. */
static const Fp8Settings FP8_DEFAULTS = {0, FP8_RECIPE_CURRENT, AMAX_HISTORY_DEFAULT, FP8_AMAX_MAX, 0, 1, FP8_ACCUM_EXACT};

typedef struct {
    Precision precision;     /* -p */
    int B, T;                /* the largest micro-batch the buffers hold */
    int recompute;           /* -r: RECOMPUTE_* (docs/model.md "Recompute") */
    Sharding sharding;       /* -z and the ranks */
    StateFormats formats;    /* --optim-state, --grad-buffer, --master-weights */
    Fp8Settings fp8;         /* -p fp8 */
    const char* bf16_blocks; /* (n_layers) non-zero: the block's linears run BF16 in -p fp8 (--bf16-layers); NULL: none */
    int bf16_linears;        /* -p fp8: every block linear may be switched to BF16 (the shadow check, the fallback),
                                so the build allocates the BF16 weight scratch (llama_bf16_weight) */
} ModelOptions;

/* A single-process model of precision p for micro-batches up to (B, T), every other option at its default. */
static inline ModelOptions model_options(Precision p, int B, int T) {
    ModelOptions o;
    memset(&o, 0, sizeof(o));
    o.precision = p;
    o.B = B;
    o.T = T;
    o.recompute = RECOMPUTE_NONE;
    o.sharding = SINGLE_PROCESS;
    o.formats = STATE_FORMATS_FP32;
    o.fp8 = FP8_DEFAULTS;
    return o;
}
