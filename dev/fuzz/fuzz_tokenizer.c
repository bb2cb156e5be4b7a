/*
 * Fuzzes the tokenizer decode table reader (dataloader/tokenizer.h): tokenizer_init, then every id
 * decoded after BOS and after another token, as samples print them.
 */
#include "fuzz.h"
#include "fuzz_inputs.h"
#include "../../dataloader/tokenizer.h"

static void fuzz_target(const uint8_t* data, size_t size) {
    const char* path = fuzz_input_file(data, size);
    fuzz_must_name = path;
    Tokenizer t;
    tokenizer_init(&t, path);
    fuzz_require(t.ok, "an existing table was not loaded");
    for (int id = 0; id < t.vocab_size; id++) {
        const char* after_bos = tokenizer_decode(&t, t.bos_id, id);
        const char* after_other = tokenizer_decode(&t, -1, id);
        fuzz_require(after_bos != NULL && after_other != NULL && strlen(after_other) <= UINT8_MAX,
                     "a piece of the table does not decode to its bytes");
    }
    tokenizer_free(&t);
}
