/*
 * Fuzzes the downstream-evaluation file readers (train/evals.h): the input's first byte picks the set
 * (HellaSwag in llm.c's eval format, LAMBADA or WikiText in llm8's continuation format) and the run's
 * --eval-compat (byte / 3, even: llm8, odd: harness), the rest is the file, loaded for rows of at most
 * FUZZ_T + 1 tokens as the trainer loads it. An accepted file must give rows the evaluation can run: each
 * within T + 1 tokens, scoring at least one token, every token in the vocabulary, and every ending of
 * every example scored.
 */
#include "fuzz.h"
#include "fuzz_inputs.h"
#include "../../dataloader/eval_sets.h"

/* A decode table in which every id decodes to two bytes (HellaSwag's acc_norm counts them). */
static const Tokenizer* fuzz_tokenizer(void) {
    static char* pieces[FUZZ_VOCAB];
    static char piece[] = " a";
    static Tokenizer t;
    if (!t.ok) {
        for (int i = 0; i < FUZZ_VOCAB; i++) pieces[i] = piece;
        t.vocab_size = FUZZ_VOCAB;
        t.bos_id = LLAMA_BOS;
        t.eos_id = LLAMA_EOS;
        t.pieces = pieces;
        t.ok = 1;
    }
    return &t;
}

static void fuzz_target(const uint8_t* data, size_t size) {
    if (size < 1) return;
    EvalKind kind = (EvalKind)(data[0] % EVAL_KINDS);
    EvalCompat compat = (EvalCompat)(data[0] / EVAL_KINDS % EVAL_COMPATS);
    const char* path = fuzz_input_file(data + 1, size - 1);
    fuzz_must_name = path;
    EvalSet s;
    eval_load(&s, kind, compat, path, -1, FUZZ_T, FUZZ_VOCAB, fuzz_tokenizer());
    int* scored = (int*)calloc((size_t)s.choice_begin[s.records], sizeof(int));
    for (int i = 0; i < s.n_rows; i++) {
        const EvalRow* r = &s.rows[i];
        fuzz_require(r->len >= 2 && r->len <= FUZZ_T + 1, "a row does not fit T + 1 tokens");
        fuzz_require(r->n_score >= 1 && r->n_score <= r->len - 1, "a row scores no token, or more than it predicts");
        fuzz_require(r->record >= 0 && r->record < s.records, "a row of no record");
        int c = s.choice_begin[r->record] + r->choice;
        fuzz_require(c < s.choice_begin[r->record + 1], "a row of no ending");
        scored[c] += r->n_score;
        for (int j = 0; j < r->len; j++)
            fuzz_require(s.tokens[r->offset + (size_t)j] >= 0 && s.tokens[r->offset + (size_t)j] < FUZZ_VOCAB, "a token outside the vocabulary");
    }
    for (int c = 0; c < s.choice_begin[s.records]; c++)
        fuzz_require(scored[c] == s.choice_tokens[c], "a continuation's tokens are not each scored once");
    free(scored);
    eval_free(&s);
}
