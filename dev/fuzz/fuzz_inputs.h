/*
 * What the fuzz harnesses and their seed writer (make_seeds.c) agree on: the run each reader is fed for
 * (micro-batch, sequence length, accumulation, vocabulary, the training state's run settings), so that
 * the seeds are inputs the harnesses accept and mutations start from a valid file.
 */
#pragma once

#include "../../train/checkpoint.h"

#define FUZZ_B 2                    /* the shard reader's micro-batch, sequence length, micro-steps */
#define FUZZ_T 8
#define FUZZ_ACCUM 2
#define FUZZ_VOCAB LLAMA_VOCAB_SIZE /* shard tokens must be below it */
#define FUZZ_SEED 1337
#define FUZZ_MANIFEST_SHARD "fuzz_train_000000.bin" /* the one shard the manifest harness's folder holds */
#define FUZZ_MANIFEST_TOKENS 64

/* The smallest model the start-up checks accept with every tensor present (head dim 2, for RoPE). */
static inline LlamaConfig fuzz_config(void) {
    LlamaConfig c = {4, 1, 2, 1, 4, 8, FUZZ_T, LLAMA_NORM_EPS, LLAMA_ROPE_THETA};
    return c;
}

/* The settings of the run whose training state the state harness reads. */
static inline RunIdentity fuzz_run_identity(void) {
    RunIdentity id;
    memset(&id, 0, sizeof(id));
    id.cfg = fuzz_config();
    id.B = FUZZ_B;
    id.T = FUZZ_T;
    id.precision = PRECISION_FP8;
    id.shuffle = 1;
    id.total_batch = FUZZ_B * FUZZ_T * FUZZ_ACCUM;
    id.seed = FUZZ_SEED;
    id.optim_state = OPTIM_STATE_FP8; /* the state file's every array: E4M3 m, FP16 v, master, scale_inv */
    return id;
}
