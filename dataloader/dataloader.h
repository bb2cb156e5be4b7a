/*
 * The multi-rank data loader for llm.c-format token shards (docs/formats.md "Token shards").
 *
 * A shard of n tokens holds S = (n - 1) / T samples; sample s is the T + 1 tokens starting at s * T
 * (inputs are the first T, targets the last T). A global batch (one optimizer step) is
 * B * world * accum consecutive entries of the shard's sample order, accum being the micro-steps of
 * gradient accumulation; micro-step k of rank r reads the B entries starting at (k * world + r) * B. So
 * the ranks never overlap, a run on one rank with accum = world reads exactly the micro-batches a run on
 * `world` ranks does (in the order a rank-ordered reduction adds them), and, in one epoch, every sample
 * of every shard is read once except the < B * world * accum left at the end of each shard. Every rank
 * derives the number of global batches of a shard from the header alone, so all ranks move to the next
 * shard at the same step. With shuffling on, the shard order of each epoch and the sample order of each
 * shard are permutations drawn from (seed, epoch, shard), identical on all ranks; the position between
 * steps is then (epoch, shard, batch), the same for any rank count with the same global batch: what a
 * checkpoint saves, and what a run resumed on another rank count continues from.
 *
 * Checks, each a one-line error naming the file: no file matches the glob; wrong magic; unknown version;
 * token count not matching the file size; a shard with fewer than one global batch (all at start-up);
 * a token id >= the vocabulary size, with its position (every token, when the shard is first opened).
 */
#pragma once

#include <glob.h>
#include <stdint.h>

#include "../core/common.h"
#include "../core/rng.h"

/*
 * The shard formats read, by header (magic, version), each with its token width. The first two are
 * llm.c's (dev/data/data_common.py write_datafile: "gpt-2" writes 20240520 / 1 with uint16 tokens,
 * "llama-3" 20240801 / 7 with uint32); the third is what llm8 wrote for uint32 tokens before it followed
 * llm.c, still read. Versions are distinct across formats, so the version alone names the format.
 */
#define SHARD_MAGIC 20240520       /* llm.c's uint16 shard and llm8's earlier uint32 one */
#define SHARD_MAGIC_U32 20240801   /* llm.c's uint32 shard */
#define SHARD_VERSION_U16 1
#define SHARD_VERSION_U32 7        /* llm.c's; what llm8 writes for uint32 tokens */
#define SHARD_VERSION_U32_LLM8 2   /* llm8's earlier uint32 shard, read only */
typedef struct {
    int32_t magic, version;
    size_t token_bytes;
} ShardFormat;
static const ShardFormat SHARD_FORMATS[] = {
    {SHARD_MAGIC, SHARD_VERSION_U16, 2},
    {SHARD_MAGIC_U32, SHARD_VERSION_U32, 4},
    {SHARD_MAGIC, SHARD_VERSION_U32_LLM8, 4},
};
#define NUM_SHARD_FORMATS (sizeof(SHARD_FORMATS) / sizeof(SHARD_FORMATS[0]))
#define SHARD_HEADER_INTS 256
#define SHARD_HEADER_BYTES (SHARD_HEADER_INTS * sizeof(int32_t))

typedef struct {
    /* what is read */
    int B, T, rank, world, vocab_size;
    int accum;             /* micro-batches per global batch (gradient accumulation) */
    int shuffle;
    uint64_t seed;
    int num_shards;
    char** paths;
    size_t* shard_tokens;  /* token count of each shard */
    int* shard_version;    /* the header's version: SHARD_FORMATS gives its token width */
    char* shard_checked;   /* every token of the shard was checked against the vocabulary */
    /* position: the next micro-batch is micro-batch `micro` of global batch `batch` of shard
       shard_order[shard] in epoch `epoch` */
    int epoch, shard, batch, micro;
    int* shard_order;      /* (num_shards) this epoch's shard order */
    int* sample_order;     /* (samples of the current shard) */
    int loaded_shard;      /* shard whose sample order is in sample_order, -1 if none */
    FILE* file;            /* the shard file_shard, open */
    int file_shard;
    /* the batch */
    int* inputs;           /* (B, T) */
    int* targets;          /* (B, T) */
    uint8_t* buffer;       /* raw tokens of one sample, (T + 1) * 4 bytes */
} DataLoader;

/* Writes a version-1 shard (uint16 tokens) atomically; the data scripts write shards in Python, this is
   for the C tests and tools. */
static inline void shard_write_u16(const char* path, const uint16_t* tokens, size_t n) {
    if (n > INT32_MAX) die("%s: %zu tokens do not fit one shard header", path, n);
    int32_t h[SHARD_HEADER_INTS];
    memset(h, 0, sizeof(h));
    h[0] = SHARD_MAGIC;
    h[1] = SHARD_VERSION_U16;
    h[2] = (int32_t)n;
    char tmp[TMP_PATH_LEN];
    FILE* f = atomic_open(path, tmp, sizeof(tmp));
    fwriteCheck(h, sizeof(int32_t), SHARD_HEADER_INTS, f, tmp);
    fwriteCheck(tokens, sizeof(uint16_t), n, f, tmp);
    atomic_commit(f, tmp, path);
}

/* Number of samples of T + 1 tokens in a shard of n tokens. */
static inline size_t shard_samples(size_t n, int T) { return n > 0 ? (n - 1) / (size_t)T : 0; }

/* Samples of one global batch: B * world * accum. */
static inline size_t dataloader_global_batch(const DataLoader* d) { return (size_t)d->B * d->world * d->accum; }

/* Number of global batches a shard yields. */
static inline int dataloader_shard_batches(const DataLoader* d, int shard) {
    return (int)(shard_samples(d->shard_tokens[shard], d->T) / dataloader_global_batch(d));
}

/* Bytes per token of a shard of header version `version` (one of SHARD_FORMATS; 0 for none). */
static inline size_t shard_token_bytes(int version) {
    for (size_t i = 0; i < NUM_SHARD_FORMATS; i++)
        if (SHARD_FORMATS[i].version == version) return SHARD_FORMATS[i].token_bytes;
    return 0;
}

/* Reads and validates a shard header; returns the token count and stores the version. */
static inline size_t shard_read_header(const char* path, int* version) {
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
        die("%s: is a directory; -i and -j take a file glob such as '%s/*_train_*.bin'", path, path);
    FILE* f = fopenCheck(path, "rb");
    int32_t header[SHARD_HEADER_INTS];
    size_t bytes = file_size(f, path);
    if (bytes < SHARD_HEADER_BYTES) die("%s: not a token shard: %zu bytes, shorter than the 1024-byte header", path, bytes);
    freadCheck(header, sizeof(int32_t), SHARD_HEADER_INTS, f, path);
    fcloseCheck(f, path);
    if (header[0] != SHARD_MAGIC && header[0] != SHARD_MAGIC_U32)
        die("%s: bad magic %d in shard header (expected %d or %d, llm.c's token shards)", path, header[0], SHARD_MAGIC,
            SHARD_MAGIC_U32);
    size_t elem = 0;
    for (size_t i = 0; i < NUM_SHARD_FORMATS; i++)
        if (SHARD_FORMATS[i].magic == header[0] && SHARD_FORMATS[i].version == header[1]) elem = SHARD_FORMATS[i].token_bytes;
    if (elem == 0)
        die("%s: unsupported shard version %d for magic %d (expected %d/%d uint16, %d/%d uint32, or llm8's earlier %d/%d "
            "uint32)", path, header[1], header[0], SHARD_MAGIC, SHARD_VERSION_U16, SHARD_MAGIC_U32, SHARD_VERSION_U32,
            SHARD_MAGIC, SHARD_VERSION_U32_LLM8);
    if (header[2] < 0) die("%s: negative token count %d in shard header", path, header[2]);
    size_t expected = SHARD_HEADER_BYTES + (size_t)(uint32_t)header[2] * elem;
    if (bytes != expected)
        die("%s: header says %d tokens (%zu bytes) but the file has %zu bytes", path, header[2], expected, bytes);
    *version = header[1];
    return (size_t)(uint32_t)header[2];
}

static inline void dataloader_prepare_epoch(DataLoader* d) {
    if (d->shuffle) {
        rng_permutation(d->shard_order, d->num_shards, d->seed ^ (0x5eedull << 32) ^ (uint64_t)d->epoch);
    } else {
        for (int i = 0; i < d->num_shards; i++) d->shard_order[i] = i;
    }
    d->loaded_shard = -1;
}

#define VALIDATE_CHUNK_TOKENS ((size_t)1 << 20)

/* Reads token i (0-based) of a raw token buffer of element size elem. */
static inline uint32_t token_at(const uint8_t* buf, size_t i, size_t elem) {
    if (elem == 2) {
        uint16_t v;
        memcpy(&v, buf + i * 2, 2);
        return v;
    }
    uint32_t v;
    memcpy(&v, buf + i * 4, 4);
    return v;
}

/* Checks every token of an open shard against the vocabulary, once per process; names the first bad one. */
static inline void dataloader_check_tokens(DataLoader* d, int s) {
    if (d->shard_checked[s]) return;
    const char* path = d->paths[s];
    size_t elem = shard_token_bytes(d->shard_version[s]), n = d->shard_tokens[s];
    uint8_t* buf = (uint8_t*)mallocCheck(VALIDATE_CHUNK_TOKENS * elem);
    fseekCheck(d->file, (long)SHARD_HEADER_BYTES, SEEK_SET, path);
    for (size_t start = 0; start < n; start += VALIDATE_CHUNK_TOKENS) {
        size_t count = n - start < VALIDATE_CHUNK_TOKENS ? n - start : VALIDATE_CHUNK_TOKENS;
        freadCheck(buf, elem, count, d->file, path);
        for (size_t i = 0; i < count; i++) {
            uint32_t tok = token_at(buf, i, elem);
            if (tok >= (uint32_t)d->vocab_size)
                die("%s: token %u at position %zu is >= the vocabulary size %d", path, tok, start + i, d->vocab_size);
        }
    }
    free(buf);
    d->shard_checked[s] = 1;
}

/* Opens the current shard (checking its tokens the first time) and draws its sample order for this epoch. */
static inline void dataloader_load_shard(DataLoader* d) {
    int s = d->shard_order[d->shard];
    if (d->loaded_shard == s) return;
    if (d->file == NULL || d->file_shard != s) {
        if (d->file) fcloseCheck(d->file, d->paths[d->file_shard]);
        d->file = fopenCheck(d->paths[s], "rb");
        d->file_shard = s;
    }
    dataloader_check_tokens(d, s);
    int n = (int)shard_samples(d->shard_tokens[s], d->T);
    free(d->sample_order);
    d->sample_order = (int*)mallocCheck((size_t)n * sizeof(int));
    if (d->shuffle) {
        rng_permutation(d->sample_order, n, d->seed ^ ((uint64_t)d->epoch << 32) ^ (uint64_t)(s + 1) * 0x9e3779b97f4a7c15ull);
    } else {
        for (int i = 0; i < n; i++) d->sample_order[i] = i;
    }
    d->loaded_shard = s;
}

/*
 * Opens every shard matching `pattern` (sorted) and checks their headers. B, T: micro-batch and
 * sequence length; rank/world: this process's place among the data-parallel ranks; accum: micro-batches
 * per global batch; vocab_size: tokens must be below it; shuffle/seed: see the banner.
 */
static inline void dataloader_init(DataLoader* d, const char* pattern, int B, int T, int rank, int world, int accum,
                                   int vocab_size, int shuffle, uint64_t seed) {
    memset(d, 0, sizeof(*d));
    d->B = B;
    d->T = T;
    d->rank = rank;
    d->world = world;
    d->accum = accum;
    d->vocab_size = vocab_size;
    d->shuffle = shuffle;
    d->seed = seed;
    glob_t g;
    int rc = glob(pattern, 0, NULL, &g);
    if (rc == GLOB_NOMATCH || (rc == 0 && g.gl_pathc == 0))
        die("%s: no file matches this data pattern (relative to the current directory; `make data` prepares tiny-shakespeare)", pattern);
    if (rc != 0) die("%s: glob failed (code %d)", pattern, rc);
    d->num_shards = (int)g.gl_pathc;
    d->paths = (char**)mallocCheck(g.gl_pathc * sizeof(char*));
    d->shard_tokens = (size_t*)mallocCheck(g.gl_pathc * sizeof(size_t));
    d->shard_version = (int*)mallocCheck(g.gl_pathc * sizeof(int));
    d->shard_order = (int*)mallocCheck(g.gl_pathc * sizeof(int));
    d->shard_checked = (char*)callocCheck(g.gl_pathc, 1);
    for (size_t i = 0; i < g.gl_pathc; i++) {
        d->paths[i] = strdup(g.gl_pathv[i]);
        d->shard_tokens[i] = shard_read_header(d->paths[i], &d->shard_version[i]);
        if (dataloader_shard_batches(d, (int)i) < 1)
            die("%s: %zu tokens is less than one global batch of B*T*ranks*accumulation = %d*%d*%d*%d (+1) tokens",
                d->paths[i], d->shard_tokens[i], B, T, world, accum);
    }
    globfree(&g);
    d->inputs = (int*)mallocCheck((size_t)B * T * sizeof(int));
    d->targets = (int*)mallocCheck((size_t)B * T * sizeof(int));
    d->buffer = (uint8_t*)mallocCheck(((size_t)T + 1) * sizeof(uint32_t));
    d->loaded_shard = -1;
    dataloader_prepare_epoch(d);
}

static inline size_t dataloader_total_tokens(const DataLoader* d) {
    size_t n = 0;
    for (int i = 0; i < d->num_shards; i++) n += d->shard_tokens[i];
    return n;
}

/* Global batches in one epoch (all shards). */
static inline long long dataloader_epoch_batches(const DataLoader* d) {
    long long n = 0;
    for (int i = 0; i < d->num_shards; i++) n += dataloader_shard_batches(d, i);
    return n;
}

/* Reads this rank's next micro-batch into d->inputs / d->targets, (B, T) each. */
static inline void dataloader_next_batch(DataLoader* d) {
    while (d->micro == 0 && d->batch >= dataloader_shard_batches(d, d->shard_order[d->shard])) {
        d->batch = 0;
        if (++d->shard == d->num_shards) {
            d->shard = 0;
            d->epoch++;
            dataloader_prepare_epoch(d);
        }
    }
    dataloader_load_shard(d);
    int s = d->shard_order[d->shard];
    const char* path = d->paths[s];
    size_t elem = shard_token_bytes(d->shard_version[s]);
    size_t first = (size_t)d->batch * dataloader_global_batch(d) + ((size_t)d->micro * d->world + d->rank) * d->B;
    for (int b = 0; b < d->B; b++) {
        size_t start = (size_t)d->sample_order[first + b] * d->T; /* token index in the shard */
        fseekCheck(d->file, (long)(SHARD_HEADER_BYTES + start * elem), SEEK_SET, path);
        freadCheck(d->buffer, elem, (size_t)d->T + 1, d->file, path);
        for (int t = 0; t <= d->T; t++) {
            int tok = (int)token_at(d->buffer, (size_t)t, elem);
            if (t < d->T) d->inputs[b * d->T + t] = tok;
            if (t > 0) d->targets[b * d->T + t - 1] = tok;
        }
    }
    if (++d->micro == d->accum) {
        d->micro = 0;
        d->batch++;
    }
}

/* Back to the first batch of epoch 0 (the eval loader does this before each evaluation). */
static inline void dataloader_reset(DataLoader* d) {
    d->epoch = 0;
    d->shard = 0;
    d->batch = 0;
    d->micro = 0;
    dataloader_prepare_epoch(d);
}

/* The position a checkpoint saves, between global batches; restoring it makes the next batch the one that
   would have come next, on any rank count with the same global batch. */
typedef struct {
    int32_t epoch, shard, batch;
} DataLoaderPosition;

static inline DataLoaderPosition dataloader_position(const DataLoader* d) {
    if (d->micro != 0) die("data loader: position asked in the middle of a global batch (micro-batch %d)", d->micro);
    DataLoaderPosition p = {d->epoch, d->shard, d->batch};
    return p;
}

static inline void dataloader_restore(DataLoader* d, DataLoaderPosition p) {
    if (p.shard < 0 || p.shard >= d->num_shards || p.epoch < 0 || p.batch < 0)
        die("training state: data position (epoch %d, shard %d, batch %d) does not fit the %d shard(s) of this run",
            p.epoch, p.shard, p.batch, d->num_shards);
    d->epoch = p.epoch;
    dataloader_prepare_epoch(d);
    d->shard = p.shard;
    d->batch = p.batch;
    d->micro = 0;
}

static inline void dataloader_free(DataLoader* d) {
    if (d->file) fclose(d->file);
    for (int i = 0; i < d->num_shards; i++) free(d->paths[i]);
    free(d->paths);
    free(d->shard_tokens);
    free(d->shard_version);
    free(d->shard_checked);
    free(d->shard_order);
    free(d->sample_order);
    free(d->inputs);
    free(d->targets);
    free(d->buffer);
    memset(d, 0, sizeof(*d));
}
