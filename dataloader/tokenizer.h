/*
 * Token decoding for printed samples. Reads the decode table `tokenizer.bin` that the data scripts export
 * from the SentencePiece model (docs/formats.md "Tokenizer decode table"): each id maps to the bytes it
 * stands for, with SentencePiece's conventions already applied. Decoding is a table lookup; the only rule
 * left is SentencePiece's: the piece right after BOS loses its leading space.
 */
#pragma once

#include "../core/common.h"

#define TOKENIZER_MAGIC 20251202
#define TOKENIZER_HEADER_INTS 256

typedef struct {
    int vocab_size;
    int bos_id, eos_id;
    char** pieces;        /* NUL-terminated bytes of each id */
    int ok;               /* 0 when no table was found: decoding prints ids instead */
} Tokenizer;

/*
 * Loads `path`; a missing file leaves the tokenizer unusable (ok = 0) with a warning, a bad one stops:
 * wrong magic or version, a vocabulary larger than the file could hold (checked before allocating for
 * it), a piece cut short, or bytes left after the last piece.
 */
static inline void tokenizer_init(Tokenizer* t, const char* path) {
    memset(t, 0, sizeof(*t));
    FILE* f = fopen(path, "rb");
    if (f == NULL) {
        printf("| warning: no tokenizer decode table at %s: samples print token ids (run dev/data/tinyshakespeare.py or dev/data/tokenize.py to write it)\n", path);
        return;
    }
    int32_t header[TOKENIZER_HEADER_INTS];
    size_t bytes = file_size(f, path);
    freadCheck(header, sizeof(int32_t), TOKENIZER_HEADER_INTS, f, path); /* stops on a file shorter than the header */
    size_t table_bytes = bytes - sizeof(header);
    if (header[0] != TOKENIZER_MAGIC) die("%s: bad magic %d in tokenizer header (expected %d)", path, header[0], TOKENIZER_MAGIC);
    if (header[1] != 1) die("%s: unsupported tokenizer version %d (expected 1)", path, header[1]);
    if (header[2] <= 0) die("%s: bad vocabulary size %d", path, header[2]);
    /* every piece takes at least its length byte */
    if ((size_t)header[2] > table_bytes)
        die("%s: vocabulary size %d does not fit the %zu bytes after the header", path, header[2], table_bytes);
    t->vocab_size = header[2];
    t->bos_id = header[3];
    t->eos_id = header[4];
    t->pieces = (char**)mallocCheck((size_t)t->vocab_size * sizeof(char*));
    for (int i = 0; i < t->vocab_size; i++) {
        unsigned char len;
        freadCheck(&len, 1, 1, f, path);
        t->pieces[i] = (char*)mallocCheck((size_t)len + 1);
        if (len > 0) freadCheck(t->pieces[i], 1, len, f, path);
        t->pieces[i][len] = '\0';
    }
    if (ftell(f) != (long)bytes) die("%s: %zu bytes after the last of the %d pieces", path, bytes - (size_t)ftell(f), t->vocab_size);
    fcloseCheck(f, path);
    t->ok = 1;
}

/*
 * The bytes token `token` prints as, given the token before it (-1 at the start). Returns NULL for an
 * id outside the table.
 */
static inline const char* tokenizer_decode(const Tokenizer* t, int prev_token, int token) {
    if (!t->ok || token < 0 || token >= t->vocab_size) return NULL;
    const char* piece = t->pieces[token];
    if (prev_token == t->bos_id && piece[0] == ' ') piece++;
    return piece;
}

/* Prints the decoded bytes of `token`, dropping control characters other than newline and tab. */
static inline void tokenizer_print(const Tokenizer* t, int prev_token, int token) {
    const char* piece = tokenizer_decode(t, prev_token, token);
    if (piece == NULL) {
        printf("<%d>", token);
        return;
    }
    for (const unsigned char* p = (const unsigned char*)piece; *p; p++) {
        if (*p >= 0x20 || *p == '\n' || *p == '\t') putchar(*p);
    }
}

static inline void tokenizer_free(Tokenizer* t) {
    if (t->pieces) {
        for (int i = 0; i < t->vocab_size; i++) free(t->pieces[i]);
        free(t->pieces);
    }
    memset(t, 0, sizeof(*t));
}
