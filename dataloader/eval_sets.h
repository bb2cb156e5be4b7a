/*
 * The downstream-evaluation sets (HellaSwag, LAMBADA, WikiText), read from their files and laid out as
 * the rows the trainer scores (train/evals.h runs them), and the scores from the rows' log-likelihoods;
 * docs/evaluation.md and docs/formats.md. The files come from dev/data/hellaswag.py (llm.c's
 * eval format), dev/data/lambada.py and dev/data/wikitext.py (llm8's continuation format).
 *
 * Every set becomes rows: a token sequence of at most T + 1 tokens whose last n_score tokens are
 * scored, each by the logits at the position before it. A multiple-choice example gives one row per
 * ending (context + ending, tokenized jointly by the data script); a context too long for -t is cut
 * from the left, as lm-evaluation-harness does; an ending longer than -t is refused. A WikiText
 * document gives lm-evaluation-harness's rolling windows of T predictions (loglikelihood_rolling with
 * context length 1): the first window predicts its first T tokens after BOS, each next one the next T
 * tokens with the tokens just before as context, the last one its remaining tokens with a full window of
 * context. A bad file stops with one line naming it (dev/fuzz/fuzz_evals.c holds the readers to that).
 *
 * Every file records the rules its tokens follow (--eval-compat, docs/evaluation.md): harness, as
 * lm-evaluation-harness scores an HF Llama-2 (no BOS before a context; acc_norm per character, the counts
 * stored at the end of the HellaSwag file), or llm8 (BOS first; acc_norm per UTF-8 byte of the decoded
 * ending). The trainer scores a file only under the mode it was written for.
 */
#pragma once

#include <math.h>

#include "tokenizer.h"
#include "../core/common.h"

#define EVAL_MC_MAGIC 20240522      /* llm.c dev/data/data_common.py write_evalfile, version 1 */
#define EVAL_MC_START UINT16_MAX     /* <START_EXAMPLE> */
#define EVAL_MC_MAX_TOKENS 65535    /* a context or an ending: its length is one uint16 */
#define EVAL_CONT_MAGIC 20261202    /* llm8's continuation file (dev/data/llm8_evals.py) */
#define EVAL_HEADER_INTS 256
#define EVAL_MAX_CHOICES 64
#define EVAL_MC_COMPAT_WORD 4       /* llm.c's eval file: header word of the mode (0 in llm.c's own files) */
#define EVAL_MC_ENDINGS_WORD 5      /* harness mode: the file's endings, one uint16 character count each at its end */
#define EVAL_CONT_COMPAT_WORD 5     /* llm8's continuation file: header word of the mode */

typedef enum { EVAL_HELLASWAG, EVAL_LAMBADA, EVAL_WIKITEXT, EVAL_KINDS } EvalKind;
static const char* const EVAL_NAMES[EVAL_KINDS] = {"hellaswag", "lambada", "wikitext"};

/* --eval-compat: the rules of the files' tokens and of acc_norm (the banner); the header value is the enum's. */
typedef enum { EVAL_COMPAT_LLM8 = 0, EVAL_COMPAT_HARNESS = 1, EVAL_COMPATS } EvalCompat;
static const char* const EVAL_COMPAT_NAMES[EVAL_COMPATS] = {"llm8", "harness"};

typedef struct {
    int record, choice;     /* example (or document) and ending; choice 0 for LAMBADA and WikiText */
    size_t offset;          /* of the row's tokens in EvalSet.tokens */
    int len;                /* tokens in the row, 2 .. T + 1 */
    int n_score;            /* its last n_score tokens are scored */
    int target_from;        /* index of the first scored token within the record's continuation */
} EvalRow;

typedef struct {
    EvalKind kind;
    EvalCompat compat;      /* the run's --eval-compat, which the file must record */
    const char* path;
    int records;
    int* label;             /* (records) HellaSwag: the correct ending */
    int* choice_begin;      /* (records + 1): record r's endings are choices [choice_begin[r], choice_begin[r + 1]) */
    double* words;          /* (records) LAMBADA, WikiText: words of the original text */
    double* bytes;          /* (records) LAMBADA, WikiText: its UTF-8 bytes; (choices) HellaSwag: an ending's
                               acc_norm length, its UTF-8 bytes (llm8) or characters (harness) */
    int* choice_tokens;     /* (choices) scored tokens of each ending or continuation */
    int* tokens;
    size_t n_tokens, cap_tokens;
    EvalRow* rows;
    int n_rows, cap_rows;
    int truncated;          /* rows whose context was cut from the left to fit -t */
} EvalSet;

#define EVAL_METRICS_MAX 3
typedef struct {
    const char* names[EVAL_METRICS_MAX];
    double values[EVAL_METRICS_MAX];
    int n;
    int records;
} EvalScores;

/* Appends n tokens to the set's token pool (grown as needed). */
static inline void eval_push_tokens(EvalSet* s, const int* tokens, size_t n) {
    if (s->n_tokens + n > s->cap_tokens) {
        s->cap_tokens = 2 * (s->n_tokens + n);
        s->tokens = (int*)realloc(s->tokens, s->cap_tokens * sizeof(int));
        if (s->tokens == NULL) die("%s: out of host memory for the eval tokens", s->path);
    }
    memcpy(s->tokens + s->n_tokens, tokens, n * sizeof(int));
    s->n_tokens += n;
}

/* Appends a row of `len` tokens (seq) whose last n_score are scored (targets from target_from on). */
static inline void eval_add_row(EvalSet* s, int record, int choice, const int* seq, int len, int n_score, int target_from) {
    if (s->n_rows == s->cap_rows) {
        s->cap_rows = s->cap_rows ? 2 * s->cap_rows : 256;
        s->rows = (EvalRow*)realloc(s->rows, (size_t)s->cap_rows * sizeof(EvalRow));
        if (s->rows == NULL) die("%s: out of host memory for the eval rows", s->path);
    }
    EvalRow r = {record, choice, s->n_tokens, len, n_score, target_from};
    s->rows[s->n_rows++] = r;
    eval_push_tokens(s, seq, (size_t)len);
}

/*
 * The row of context (n_ctx tokens, BOS first) + continuation (n_cont >= 1 tokens), cut from the left to
 * T + 1 tokens; stops when the continuation alone does not fit -t. scratch: T + 1 ints.
 */
static inline void eval_add_continuation(EvalSet* s, int record, int choice, const int* ctx, int n_ctx, const int* cont,
                                         int n_cont, int T, int* scratch) {
    if (n_cont > T)
        die("%s: example %d: a continuation of %d tokens does not fit -t %d (raise -t or drop the example)", s->path, record,
            n_cont, T);
    int keep_ctx = n_ctx + n_cont > T + 1 ? T + 1 - n_cont : n_ctx;
    if (keep_ctx < n_ctx) s->truncated++;
    memcpy(scratch, ctx + (n_ctx - keep_ctx), (size_t)keep_ctx * sizeof(int));
    memcpy(scratch + keep_ctx, cont, (size_t)n_cont * sizeof(int));
    eval_add_row(s, record, choice, scratch, keep_ctx + n_cont, n_cont, 0);
}

/* lm-evaluation-harness's rolling windows of document x (n >= 1 tokens) for T predictions each. */
static inline void eval_add_rolling(EvalSet* s, int record, const int* x, int n, int bos, int T, int* scratch) {
    int first = n < T ? n : T;
    scratch[0] = bos;
    memcpy(scratch + 1, x, (size_t)first * sizeof(int));
    eval_add_row(s, record, 0, scratch, first + 1, first, 0);
    for (int predicted = first; predicted < n;) {
        int count = n - predicted < T ? n - predicted : T;
        int end = predicted + count;
        eval_add_row(s, record, 0, x + (end - T - 1), T + 1, count, predicted);
        predicted = end;
    }
}

/* Stops, naming the file and the example, on a token outside the model's vocabulary. */
static inline void eval_check_token(const EvalSet* s, int record, int token, int vocab) {
    if (token < 0 || token >= vocab) die("%s: example %d: token %d is outside the model's vocabulary of %d", s->path, record, token, vocab);
}

/* Stops unless header word `mode` is the run's --eval-compat (s->compat). */
static inline void eval_check_compat(const EvalSet* s, int32_t mode) {
    if (mode != EVAL_COMPAT_LLM8 && mode != EVAL_COMPAT_HARNESS)
        die("%s: unknown --eval-compat mode %d in the header (0 llm8, 1 harness)", s->path, mode);
    if (mode != (int32_t)s->compat)
        die("%s: written for --eval-compat %s, this run scores --eval-compat %s (pass --eval-compat %s, or rewrite it with "
            "dev/data/%s.py --eval-compat %s)", s->path, EVAL_COMPAT_NAMES[mode], EVAL_COMPAT_NAMES[s->compat],
            EVAL_COMPAT_NAMES[mode], EVAL_NAMES[s->kind], EVAL_COMPAT_NAMES[s->compat]);
}

/* Reads the whole file after its 256-int32 header into a malloc'd buffer; *bytes: its size. */
static inline void* eval_read_file(const char* path, int32_t* header, size_t* bytes) {
    FILE* f = fopenCheck(path, "rb");
    size_t size = file_size(f, path);
    if (size < EVAL_HEADER_INTS * sizeof(int32_t)) die("%s: %zu bytes, shorter than the 1024-byte header", path, size);
    freadCheck(header, sizeof(int32_t), EVAL_HEADER_INTS, f, path);
    *bytes = size - EVAL_HEADER_INTS * sizeof(int32_t);
    void* body = mallocCheck(*bytes ? *bytes : 1);
    if (*bytes) freadCheck(body, 1, *bytes, f, path);
    fcloseCheck(f, path);
    return body;
}

/* The per-record arrays of `records` records and the per-choice ones of at most `choices` choices. */
static inline void eval_alloc_records(EvalSet* s, int records, size_t choices) {
    s->records = records;
    s->label = (int*)callocCheck((size_t)records, sizeof(int));
    s->choice_begin = (int*)callocCheck((size_t)records + 1, sizeof(int));
    s->words = (double*)callocCheck((size_t)records, sizeof(double));
    s->bytes = (double*)callocCheck(choices, sizeof(double));
    s->choice_tokens = (int*)callocCheck(choices, sizeof(int));
}

/*
 * HellaSwag in llm.c's eval format: a header of 256 int32 (magic 20240522, version 1, examples, longest
 * example in bytes, the --eval-compat mode, harness: the file's endings), then per example uint16s: 65535,
 * its bytes, its index, the label, the number of endings, the context length and tokens, and each
 * ending's length and tokens; a harness file ends with one uint16 per ending of the file, its characters.
 * Keeps the first `limit` examples (all when < 0). acc_norm's length of an ending: harness, its
 * characters; llm8, its tokens' decoded bytes without the leading delimiter space, from the decode table.
 * Stops with one line naming the file on any inconsistency.
 */
static inline void eval_load_hellaswag(EvalSet* s, const char* path, int limit, int T, int vocab, const Tokenizer* tok) {
    int32_t header[EVAL_HEADER_INTS];
    size_t bytes;
    uint16_t* w = (uint16_t*)eval_read_file(path, header, &bytes);
    if (header[0] != EVAL_MC_MAGIC) die("%s: bad magic %d (expected %d: llm.c's eval file, dev/data/hellaswag.py)", path, header[0], EVAL_MC_MAGIC);
    if (header[1] != 1) die("%s: unsupported eval file version %d (expected 1)", path, header[1]);
    if (header[2] <= 0) die("%s: bad example count %d", path, header[2]);
    if (bytes % 2 != 0) die("%s: %zu bytes after the header, not a whole number of uint16", path, bytes);
    eval_check_compat(s, header[EVAL_MC_COMPAT_WORD]);
    int harness = s->compat == EVAL_COMPAT_HARNESS;
    size_t words = bytes / 2, at = 0;
    int n_endings = header[EVAL_MC_ENDINGS_WORD];
    if (harness && (n_endings < 1 || (size_t)n_endings > words))
        die("%s: bad ending count %d in the header (a harness file ends with each ending's characters)", path, n_endings);
    if (!harness && n_endings != 0) die("%s: header word %d is %d, not 0", path, EVAL_MC_ENDINGS_WORD, n_endings);
    const uint16_t* chars = w + (words - (size_t)n_endings);
    words -= (size_t)n_endings; /* the examples' stream */
    if (!harness && !tok->ok) die("%s: HellaSwag's acc_norm needs the tokenizer decode table (--tokenizer)", path);
    if (!harness && tok->vocab_size != vocab)
        die("%s: the tokenizer decode table has %d pieces, the model's vocabulary %d (acc_norm decodes the endings)", path,
            tok->vocab_size, vocab);
    /* each example takes at least 8 uint16 (its 6 fields, one ending's length and token): checked before
       allocating for the count */
    if ((size_t)header[2] > words / 8) die("%s: %d examples do not fit the file's %zu bytes", path, header[2], bytes);
    int n = limit >= 0 && limit < header[2] ? limit : header[2];
    /* an ending takes at least 2 uint16 (its length and a token): the file bounds the choices too */
    size_t max_choices = (size_t)n * EVAL_MAX_CHOICES < words / 2 ? (size_t)n * EVAL_MAX_CHOICES : words / 2;
    eval_alloc_records(s, n, max_choices);
    int* scratch = (int*)mallocCheck((size_t)(T + 1) * sizeof(int));
    int* ctx = (int*)mallocCheck(EVAL_MC_MAX_TOKENS * sizeof(int));
    int* cont = (int*)mallocCheck(EVAL_MC_MAX_TOKENS * sizeof(int));
    int choices = 0;
    for (int e = 0; e < n; e++) {
        if (at + 6 > words) die("%s: truncated: example %d of %d is missing", path, e, header[2]);
        size_t start = at;
        if (w[at] != EVAL_MC_START) die("%s: example %d: no start marker (65535) at uint16 %zu", path, e, at);
        size_t ex_words = w[at + 1] / 2;
        if (w[at + 1] % 2 != 0 || ex_words < 6 || start + ex_words > words)
            die("%s: example %d: bad example size %d bytes", path, e, w[at + 1]);
        if ((int)w[at + 1] > header[3]) die("%s: example %d: %d bytes, over the header's longest %d", path, e, w[at + 1], header[3]);
        int label = w[at + 3], nc = w[at + 4], nctx = w[at + 5];
        at += 6;
        if (nc < 1 || nc > EVAL_MAX_CHOICES) die("%s: example %d: %d endings (1 to %d)", path, e, nc, EVAL_MAX_CHOICES);
        if (nctx < 1) die("%s: example %d: no context tokens", path, e);
        if (label >= nc) die("%s: example %d: label %d for %d endings", path, e, label, nc);
        if (at + (size_t)nctx > start + ex_words) die("%s: example %d: context runs past the example", path, e);
        for (int i = 0; i < nctx; i++) {
            ctx[i] = w[at + (size_t)i];
            eval_check_token(s, e, ctx[i], vocab);
        }
        at += (size_t)nctx;
        s->label[e] = label;
        s->choice_begin[e] = choices;
        for (int c = 0; c < nc; c++) {
            if (at >= start + ex_words) die("%s: example %d: ending %d runs past the example", path, e, c);
            int len = w[at++];
            if (len < 1 || at + (size_t)len > start + ex_words) die("%s: example %d: ending %d of %d tokens runs past the example", path, e, c, len);
            for (int i = 0; i < len; i++) cont[i] = w[at + (size_t)i];
            at += (size_t)len;
            for (int i = 0; i < len; i++) eval_check_token(s, e, cont[i], vocab);
            if (harness) {
                if (choices >= n_endings) die("%s: example %d: more endings than the header's %d", path, e, n_endings);
                if (chars[choices] == 0) die("%s: example %d: ending %d has no characters (acc_norm divides by them)", path, e, c);
                s->bytes[choices] = chars[choices];
            } else {
                size_t b = 0;
                for (int i = 0; i < len; i++) {
                    const char* piece = tokenizer_decode(tok, i == 0 ? ctx[nctx - 1] : cont[i - 1], cont[i]);
                    size_t pl = piece ? strlen(piece) : 0;
                    if (i == 0 && pl > 0 && piece[0] == ' ') pl--; /* the delimiter: lm-evaluation-harness divides by len(ending) */
                    b += pl;
                }
                s->bytes[choices] = (double)(b > 0 ? b : 1);
            }
            s->choice_tokens[choices] = len;
            eval_add_continuation(s, e, c, ctx, nctx, cont, len, T, scratch);
            choices++;
        }
        if (at != start + ex_words) die("%s: example %d: %zu bytes beyond its endings", path, e, 2 * (start + ex_words - at));
    }
    if (n == header[2] && at != words) die("%s: %zu bytes after the last of %d examples", path, 2 * (words - at), header[2]);
    if (harness && n == header[2] && choices != n_endings)
        die("%s: %d endings, the header says %d (the character counts that end the file)", path, choices, n_endings);
    s->choice_begin[n] = choices;
    free(scratch);
    free(ctx);
    free(cont);
    free(w);
}

/*
 * LAMBADA or WikiText in llm8's continuation format: a header of 256 int32 (magic 20261202, version 1,
 * kind 1 LAMBADA / 2 WikiText, records, BOS id, the --eval-compat mode), then per record int32s:
 * n_context, n_target, n_words, n_bytes, the context tokens, the target tokens. Keeps the first `limit`
 * records (all when < 0). The two modes differ only in the tokens the data script wrote.
 */
static inline void eval_load_continuations(EvalSet* s, const char* path, int limit, int T, int vocab) {
    int32_t header[EVAL_HEADER_INTS];
    size_t bytes;
    int32_t* w = (int32_t*)eval_read_file(path, header, &bytes);
    int want = s->kind == EVAL_LAMBADA ? 1 : 2;
    if (header[0] != EVAL_CONT_MAGIC)
        die("%s: bad magic %d (expected %d: llm8's continuation eval file, dev/data/%s.py)", path, header[0], EVAL_CONT_MAGIC,
            EVAL_NAMES[s->kind]);
    if (header[1] != 1) die("%s: unsupported eval file version %d (expected 1)", path, header[1]);
    if (header[2] != want) die("%s: holds eval kind %d, not %s (%d)", path, header[2], EVAL_NAMES[s->kind], want);
    if (header[3] <= 0) die("%s: bad record count %d", path, header[3]);
    eval_check_compat(s, header[EVAL_CONT_COMPAT_WORD]);
    if (bytes % 4 != 0) die("%s: %zu bytes after the header, not a whole number of int32", path, bytes);
    int bos = header[4];
    if (bos < 0 || bos >= vocab) die("%s: BOS id %d is outside the vocabulary of %d", path, bos, vocab);
    size_t words = bytes / 4, at = 0;
    /* each record takes at least 5 int32 (its 4 sizes and one target token): checked before allocating */
    if ((size_t)header[3] > words / 5) die("%s: %d records do not fit the file's %zu bytes", path, header[3], bytes);
    int n = limit >= 0 && limit < header[3] ? limit : header[3];
    eval_alloc_records(s, n, (size_t)n);
    int* scratch = (int*)mallocCheck((size_t)(T + 1) * sizeof(int));
    int bos_ctx[1] = {bos};
    for (int r = 0; r < n; r++) {
        if (at + 4 > words) die("%s: truncated: record %d of %d is missing", path, r, header[3]);
        int nctx = w[at], ntgt = w[at + 1];
        if (nctx < 0 || ntgt < 1 || w[at + 2] < 0 || w[at + 3] < 0) die("%s: record %d: bad sizes (%d, %d, %d, %d)", path, r, nctx, ntgt, w[at + 2], w[at + 3]);
        if ((size_t)nctx + (size_t)ntgt > words - at - 4) die("%s: truncated: record %d's tokens run past the end", path, r);
        s->words[r] = w[at + 2];
        s->bytes[r] = w[at + 3];
        at += 4;
        const int* ctx = w + at;
        const int* tgt = w + at + nctx;
        for (int i = 0; i < nctx + ntgt; i++) eval_check_token(s, r, w[at + (size_t)i], vocab);
        at += (size_t)nctx + (size_t)ntgt;
        if (s->kind == EVAL_WIKITEXT && nctx != 0) die("%s: record %d: a WikiText document has no context, got %d tokens", path, r, nctx);
        s->choice_begin[r] = r;
        s->choice_tokens[r] = ntgt;
        if (s->kind == EVAL_WIKITEXT) eval_add_rolling(s, r, tgt, ntgt, bos, T, scratch);
        else eval_add_continuation(s, r, 0, nctx ? ctx : bos_ctx, nctx ? nctx : 1, tgt, ntgt, T, scratch);
    }
    if (n == header[3] && at != words) die("%s: %zu bytes after the last of %d records", path, 4 * (words - at), header[3]);
    s->choice_begin[n] = n;
    free(scratch);
    free(w);
}

/* Loads the set of `kind` from `path`, written for `compat`, for rows of at most T + 1 tokens (see the banner). */
static inline void eval_load(EvalSet* s, EvalKind kind, EvalCompat compat, const char* path, int limit, int T, int vocab,
                             const Tokenizer* tok) {
    memset(s, 0, sizeof(*s));
    s->kind = kind;
    s->compat = compat;
    s->path = path;
    if (kind == EVAL_HELLASWAG) eval_load_hellaswag(s, path, limit, T, vocab, tok);
    else eval_load_continuations(s, path, limit, T, vocab);
}

/*
 * FNV-1a (32-bit) of what the set makes each rank do and score: its mode, rows, their tokens, labels, words
 * and bytes; 0 for a set not loaded. Ranks compare it at start-up (train/agreement.h).
 */
static inline int32_t eval_set_hash(const EvalSet* s) {
    if (s->path == NULL) return 0;
    int choices = s->choice_begin[s->records], compat = (int)s->compat;
    uint32_t h = fnv1a(FNV_OFFSET, &s->records, sizeof(int));
    h = fnv1a(h, &compat, sizeof(int));
    h = fnv1a(h, &s->n_rows, sizeof(int));
    for (int i = 0; i < s->n_rows; i++) {
        const EvalRow* r = &s->rows[i];
        int fields[5] = {r->record, r->choice, r->len, r->n_score, r->target_from};
        h = fnv1a(h, fields, sizeof(fields));
        h = fnv1a(h, s->tokens + r->offset, (size_t)r->len * sizeof(int));
    }
    h = fnv1a(h, s->label, (size_t)s->records * sizeof(int));
    h = fnv1a(h, s->words, (size_t)s->records * sizeof(double));
    h = fnv1a(h, s->bytes, (size_t)(s->kind == EVAL_HELLASWAG ? choices : s->records) * sizeof(double));
    return (int32_t)(h | 1u); /* never 0, which means "off" */
}

static inline void eval_free(EvalSet* s) {
    free(s->label);
    free(s->choice_begin);
    free(s->words);
    free(s->bytes);
    free(s->choice_tokens);
    free(s->tokens);
    free(s->rows);
    memset(s, 0, sizeof(*s));
}

/* The index of the largest of x (n), the first on ties (numpy's argmax). */
static inline int eval_argmax(const double* x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++) best = x[i] > x[best] ? i : best;
    return best;
}

/*
 * The scores from each row's summed log-likelihood ll (n_rows) and greedy flag (1: every scored token
 * is its position's argmax), as lm-evaluation-harness defines them:
 *   HellaSwag: acc (the ending of highest ll), acc_norm (highest ll / the ending's acc_norm length), and llm.c's
 *     number, acc_llmc (lowest mean token loss over the ending);
 *   LAMBADA: acc (the greedy continuation is the whole target word) and perplexity exp(-mean ll);
 *   WikiText: word_perplexity exp(-sum ll / words), byte_perplexity exp(-sum ll / bytes) and
 *     bits_per_byte -sum ll / bytes / ln 2, the words and bytes of the original documents.
 */
static inline EvalScores eval_scores(const EvalSet* s, const double* ll, const double* greedy) {
    EvalScores out;
    memset(&out, 0, sizeof(out));
    out.records = s->records;
    int choices = s->choice_begin[s->records];
    double* per_choice = (double*)callocCheck((size_t)choices, sizeof(double));
    double* per_greedy = (double*)mallocCheck((size_t)choices * sizeof(double));
    for (int c = 0; c < choices; c++) per_greedy[c] = 1.0;
    for (int i = 0; i < s->n_rows; i++) {
        int c = s->choice_begin[s->rows[i].record] + s->rows[i].choice;
        per_choice[c] += ll[i];
        per_greedy[c] = per_greedy[c] != 0.0 && greedy[i] != 0.0 ? 1.0 : 0.0;
    }
    if (s->kind == EVAL_HELLASWAG) {
        double correct[3] = {0.0, 0.0, 0.0}, norm[EVAL_MAX_CHOICES], mean[EVAL_MAX_CHOICES];
        for (int r = 0; r < s->records; r++) {
            int b = s->choice_begin[r], nc = s->choice_begin[r + 1] - b;
            for (int c = 0; c < nc; c++) {
                norm[c] = per_choice[b + c] / s->bytes[b + c];
                mean[c] = per_choice[b + c] / s->choice_tokens[b + c];
            }
            correct[0] += eval_argmax(per_choice + b, nc) == s->label[r];
            correct[1] += eval_argmax(norm, nc) == s->label[r];
            correct[2] += eval_argmax(mean, nc) == s->label[r];
        }
        const char* names[3] = {"acc", "acc_norm", "acc_llmc"};
        for (int k = 0; k < 3; k++) {
            out.names[k] = names[k];
            out.values[k] = correct[k] / s->records;
        }
        out.n = 3;
    } else if (s->kind == EVAL_LAMBADA) {
        double hits = 0.0, sum = 0.0;
        for (int r = 0; r < s->records; r++) {
            hits += per_greedy[r];
            sum += per_choice[r];
        }
        out.names[0] = "acc";
        out.values[0] = hits / s->records;
        out.names[1] = "perplexity";
        out.values[1] = exp(-sum / s->records);
        out.n = 2;
    } else {
        double sum = 0.0, words = 0.0, bytes = 0.0;
        for (int r = 0; r < s->records; r++) {
            sum += per_choice[r];
            words += s->words[r];
            bytes += s->bytes[r];
        }
        out.names[0] = "word_perplexity";
        out.values[0] = exp(-sum / words);
        out.names[1] = "byte_perplexity";
        out.values[1] = exp(-sum / bytes);
        out.names[2] = "bits_per_byte";
        out.values[2] = -sum / bytes / log(2.0);
        out.n = 3;
    }
    free(per_choice);
    free(per_greedy);
    return out;
}

