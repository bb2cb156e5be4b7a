/*
 * Fuzzes the token shard reader (dataloader/dataloader.h): the header checks of dataloader_init and the
 * token check of the first load, then one epoch of micro-batches plus the step into the next (shuffled,
 * with gradient accumulation), as the trainer reads them. An accepted shard must only ever yield tokens
 * below the vocabulary.
 */
#include "fuzz.h"
#include "fuzz_inputs.h"

static void fuzz_target(const uint8_t* data, size_t size) {
    const char* path = fuzz_input_file(data, size);
    fuzz_must_name = path;
    DataLoader d;
    dataloader_init(&d, path, FUZZ_B, FUZZ_T, 0, 1, FUZZ_ACCUM, FUZZ_VOCAB, 1, FUZZ_SEED);
    long long micro_batches = dataloader_epoch_batches(&d) * FUZZ_ACCUM;
    for (long long i = 0; i <= micro_batches; i++) {
        dataloader_next_batch(&d);
        for (int k = 0; k < FUZZ_B * FUZZ_T; k++) {
            fuzz_require(d.inputs[k] >= 0 && d.inputs[k] < FUZZ_VOCAB && d.targets[k] >= 0 && d.targets[k] < FUZZ_VOCAB,
                         "an accepted shard yielded a token outside the vocabulary");
        }
    }
    dataloader_free(&d);
}
