/*
 * Writes the seed corpus of each fuzz harness into DIR/<harness>/ (`make fuzz` runs it into build/fuzz):
 * files the readers accept, made by the product's own writers where it has them, so that the seeds follow
 * the formats as they change and mutations start past the magic numbers and the config hash.
 *   shard/      a uint16 shard (shard_write_u16) and a uint32 one in each uint32 format
 *   model/      a checkpoint of fuzz_config() (checkpoint_write)
 *   state/      a training state of fuzz_run_identity() (state_write_begin), one shard, one skipped step
 *   tokenizer/  a decode table of a few pieces, one of them empty, one raw byte
 *   cli/        every flag of the parser's table with a value of its type, and a typical run's flags
 *   manifest/   the manifest.json of the manifest harness's one-shard folder
 *   evals/      a HellaSwag file of two examples (one context longer than T) and its --eval-compat harness
 *               form (characters at the end), a LAMBADA file and a WikiText file of two documents (one of
 *               several windows), each after its kind byte (+ 3 for harness)
 * Usage: make_seeds DIR
 */
#include "fuzz_inputs.h"
#include "../../dataloader/manifest.h"
#include "../../dataloader/tokenizer.h"
#include "../../train/cli.h"
#include "../../dataloader/eval_sets.h"

#define SEED_SHARD_TOKENS 64
#define SEED_STATE_FLOATS 16 /* elements of each array of the seed state's one shard */

static void seed_path(char* out, size_t len, const char* dir, const char* harness, const char* name) {
    char sub[PATH_LEN];
    snprintf(sub, sizeof(sub), "%s/%s", dir, harness);
    make_dir(sub);
    if ((size_t)snprintf(out, len, "%s/%s", sub, name) >= len) die("%s: path too long", sub);
}

static void write_bytes(const char* path, const void* data, size_t n) {
    char tmp[TMP_PATH_LEN];
    FILE* f = atomic_open(path, tmp, sizeof(tmp));
    fwriteCheck(data, 1, n, f, tmp);
    atomic_commit(f, tmp, path);
}

static void seed_shards(const char* dir) {
    char path[PATH_LEN];
    uint16_t t16[SEED_SHARD_TOKENS];
    struct {
        int32_t header[SHARD_HEADER_INTS];
        uint32_t tokens[SEED_SHARD_TOKENS];
    } u32;
    memset(&u32, 0, sizeof(u32));
    u32.header[2] = SEED_SHARD_TOKENS;
    for (int i = 0; i < SEED_SHARD_TOKENS; i++) {
        t16[i] = (uint16_t)(i % 16 == 0 ? LLAMA_BOS : 100 + i);
        u32.tokens[i] = (uint32_t)(FUZZ_VOCAB - 1 - i);
    }
    seed_path(path, sizeof(path), dir, "shard", "u16.bin");
    shard_write_u16(path, t16, SEED_SHARD_TOKENS);
    /* both uint32 formats: llm.c's and llm8's earlier one */
    u32.header[0] = SHARD_MAGIC_U32;
    u32.header[1] = SHARD_VERSION_U32;
    seed_path(path, sizeof(path), dir, "shard", "u32.bin");
    write_bytes(path, &u32, sizeof(u32));
    u32.header[0] = SHARD_MAGIC;
    u32.header[1] = SHARD_VERSION_U32_LLM8;
    seed_path(path, sizeof(path), dir, "shard", "u32_llm8.bin");
    write_bytes(path, &u32, sizeof(u32));
}

static void seed_model(const char* dir) {
    char path[PATH_LEN];
    LlamaConfig cfg = fuzz_config();
    size_t n = param_count(&cfg);
    float* params = (float*)mallocCheck(n * sizeof(float));
    for (size_t i = 0; i < n; i++) params[i] = (float)i / (float)n;
    seed_path(path, sizeof(path), dir, "model", "tiny.bin");
    checkpoint_write(path, &cfg, params);
    free(params);
}

static void seed_state(const char* dir) {
    char path[PATH_LEN], tmp[TMP_PATH_LEN];
    TrainState s;
    memset(&s, 0, sizeof(s));
    s.step = 3;
    s.shards = 1;
    s.world = 1;
    s.consecutive_skips = 1;
    s.total_skips = 1;
    s.data.batch = 1;
    rng_seed(&s.sample_rng, FUZZ_SEED);
    s.id = fuzz_run_identity();
    s.shard_elems = SEED_STATE_FLOATS;
    /* E4M3 m, FP16 v, FP32 master, then 2 scale_inv for the one chunk (fuzz_run_identity: --optim-state fp8) */
    unsigned char arrays[(1 + 2 + 4) * SEED_STATE_FLOATS + 2 * sizeof(float)];
    for (size_t i = 0; i < sizeof(arrays); i++) arrays[i] = (unsigned char)(i * 7);
    float one = 1.0f;
    memcpy(arrays + 7 * SEED_STATE_FLOATS, &one, sizeof(one));
    memcpy(arrays + 7 * SEED_STATE_FLOATS + sizeof(one), &one, sizeof(one));
    seed_path(path, sizeof(path), dir, "state", "step3.bin");
    FILE* f = state_write_begin(path, tmp, sizeof(tmp), &s);
    fwriteCheck(arrays, 1, sizeof(arrays), f, tmp);
    atomic_commit(f, tmp, path);
}

static void seed_tokenizer(const char* dir) {
    static const char* const pieces[] = {"", "", "", " the", "\xe2\x96\x81", "\xab", "\n"};
    const int n = (int)(sizeof(pieces) / sizeof(pieces[0]));
    unsigned char table[TOKENIZER_HEADER_INTS * sizeof(int32_t) + 64];
    int32_t header[TOKENIZER_HEADER_INTS];
    memset(header, 0, sizeof(header));
    header[0] = TOKENIZER_MAGIC;
    header[1] = 1;
    header[2] = n;
    header[3] = LLAMA_BOS;
    header[4] = LLAMA_EOS;
    memcpy(table, header, sizeof(header));
    size_t len = sizeof(header);
    for (int i = 0; i < n; i++) {
        table[len++] = (unsigned char)strlen(pieces[i]);
        memcpy(table + len, pieces[i], strlen(pieces[i]));
        len += strlen(pieces[i]);
    }
    char path[PATH_LEN];
    seed_path(path, sizeof(path), dir, "tokenizer", "tokenizer.bin");
    write_bytes(path, table, len);
}

/* Appends "flag\0value\0" to buf at *len. */
static void append_arg(char* buf, size_t cap, size_t* len, const char* flag, const char* value) {
    size_t need = strlen(flag) + strlen(value) + 2;
    if (*len + need > cap) die("cli seed: more than %zu bytes", cap);
    memcpy(buf + *len, flag, strlen(flag) + 1);
    *len += strlen(flag) + 1;
    memcpy(buf + *len, value, strlen(value) + 1);
    *len += strlen(value) + 1;
}

static void seed_cli(const char* dir) {
    char buf[4096], path[PATH_LEN];
    size_t len = 0;
    for (size_t i = 0; i < NUM_TRAIN_ARGS; i++) {
        const ArgSpec* s = &TRAIN_ARG_SPECS[i];
        const char* value = s->type == ARG_STR ? "x" : s->type == ARG_FLOAT ? "0.5" : s->type == ARG_ENUM ? s->names[s->num_names - 1] : "1";
        append_arg(buf, sizeof(buf), &len, s->flag, value);
    }
    seed_path(path, sizeof(path), dir, "cli", "every_flag");
    write_bytes(path, buf, len);
    static const char* const run[][2] = {{"-b", "4"}, {"-t", "64"}, {"-x", "6"}, {"-n", "3"}, {"-o", "runs/x"}, {"-p", "fp8"}};
    len = 0;
    for (size_t i = 0; i < sizeof(run) / sizeof(run[0]); i++) append_arg(buf, sizeof(buf), &len, run[i][0], run[i][1]);
    seed_path(path, sizeof(path), dir, "cli", "typical_run");
    write_bytes(path, buf, len);
}

static void seed_manifest(const char* dir) {
    char text[1024], path[PATH_LEN];
    int n = snprintf(text, sizeof(text),
                     "{\"format\": \"%s\", \"version\": %d, \"shard_version\": 1, \"vocab_size\": %d, \"documents\": 4, "
                     "\"tokens\": %d, \"splits\": {\"train\": {\"documents\": 4, \"tokens\": %d, \"shards\": 1}}, "
                     "\"shards\": [{\"file\": \"%s\", \"split\": \"train\", \"tokens\": %d}]}\n",
                     MANIFEST_FORMAT, MANIFEST_VERSION, FUZZ_VOCAB, FUZZ_MANIFEST_TOKENS, FUZZ_MANIFEST_TOKENS,
                     FUZZ_MANIFEST_SHARD, FUZZ_MANIFEST_TOKENS);
    seed_path(path, sizeof(path), dir, "manifest", "manifest.json");
    write_bytes(path, text, (size_t)n);
}

/* Writes kind byte + header (256 int32) + body to DIR/evals/name. */
static void write_eval_seed(const char* dir, const char* name, uint8_t kind, const int32_t* header, const void* body,
                            size_t body_bytes) {
    size_t len = 1 + EVAL_HEADER_INTS * sizeof(int32_t) + body_bytes;
    uint8_t* buf = (uint8_t*)mallocCheck(len);
    buf[0] = kind;
    memcpy(buf + 1, header, EVAL_HEADER_INTS * sizeof(int32_t));
    memcpy(buf + 1 + EVAL_HEADER_INTS * sizeof(int32_t), body, body_bytes);
    char path[PATH_LEN];
    seed_path(path, sizeof(path), dir, "evals", name);
    write_bytes(path, buf, len);
    free(buf);
}

static void seed_evals(const char* dir) {
    int32_t header[EVAL_HEADER_INTS];
    /* HellaSwag: example 0 with a context of 2 tokens and endings of 1..4 tokens; example 1 with a context of
       FUZZ_T + 2 tokens (cut from the left) */
    uint16_t mc[128];
    size_t n = 0, longest = 0;
    for (int e = 0; e < 2; e++) {
        size_t start = n;
        int nctx = e == 0 ? 2 : FUZZ_T + 2;
        mc[n++] = EVAL_MC_START;
        mc[n++] = 0;
        mc[n++] = (uint16_t)e;
        mc[n++] = (uint16_t)(e + 1);
        mc[n++] = 4;
        mc[n++] = (uint16_t)nctx;
        for (int i = 0; i < nctx; i++) mc[n++] = (uint16_t)(i == 0 ? LLAMA_BOS : 100 + i);
        for (int c = 0; c < 4; c++) {
            mc[n++] = (uint16_t)(c + 1);
            for (int i = 0; i <= c; i++) mc[n++] = (uint16_t)(200 + 10 * c + i);
        }
        mc[start + 1] = (uint16_t)(2 * (n - start));
        longest = 2 * (n - start) > longest ? 2 * (n - start) : longest;
    }
    memset(header, 0, sizeof(header));
    header[0] = EVAL_MC_MAGIC;
    header[1] = 1;
    header[2] = 2;
    header[3] = (int32_t)longest;
    write_eval_seed(dir, "hellaswag.bin", EVAL_HELLASWAG, header, mc, n * sizeof(uint16_t));
    /* the same examples under --eval-compat harness: each of the 8 endings' characters end the file */
    for (int c = 0; c < 8; c++) mc[n++] = (uint16_t)(3 + c);
    header[EVAL_MC_COMPAT_WORD] = EVAL_COMPAT_HARNESS;
    header[EVAL_MC_ENDINGS_WORD] = 8;
    write_eval_seed(dir, "hellaswag_harness.bin", EVAL_HELLASWAG + EVAL_KINDS * EVAL_COMPAT_HARNESS, header, mc,
                    n * sizeof(uint16_t));
    /* LAMBADA: BOS + 3 tokens, a target of 2; WikiText: a document of 3 * FUZZ_T + 1 tokens and one of 2 */
    int32_t cont[128];
    size_t m = 0;
    int32_t lambada[] = {1, 2, 1, 5, LLAMA_BOS, 300, 301, 302, 400, 401};
    memcpy(cont, lambada, sizeof(lambada));
    m = sizeof(lambada) / sizeof(int32_t);
    memset(header, 0, sizeof(header));
    header[0] = EVAL_CONT_MAGIC;
    header[1] = 1;
    header[2] = 1;
    header[3] = 1;
    header[4] = LLAMA_BOS;
    write_eval_seed(dir, "lambada.bin", EVAL_LAMBADA, header, cont, m * sizeof(int32_t));
    m = 0;
    int docs[2] = {3 * FUZZ_T + 1, 2};
    for (int d = 0; d < 2; d++) {
        cont[m++] = 0;
        cont[m++] = docs[d];
        cont[m++] = docs[d] / 2;
        cont[m++] = docs[d] * 4;
        for (int i = 0; i < docs[d]; i++) cont[m++] = 500 + i;
    }
    header[2] = 2;
    header[3] = 2;
    write_eval_seed(dir, "wikitext.bin", EVAL_WIKITEXT, header, cont, m * sizeof(int32_t));
}

int main(int argc, char** argv) {
    if (argc != 2) die("usage: %s DIR (writes DIR/<harness>/ seed files)", argv[0]);
    seed_shards(argv[1]);
    seed_model(argv[1]);
    seed_state(argv[1]);
    seed_tokenizer(argv[1]);
    seed_cli(argv[1]);
    seed_manifest(argv[1]);
    seed_evals(argv[1]);
    return 0;
}
