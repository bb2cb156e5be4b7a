/*
 * Fuzzes the training-state reader (train/checkpoint.h) as resume uses it: state_open with the settings
 * of the run in fuzz_inputs.h (magic, version, build, config hash, layout, size, step counters, every
 * run setting), then the arrays of the shard (fp8 moments, master weights, scale_inv), as many bytes as
 * the header says.
 */
#include "fuzz.h"
#include "fuzz_inputs.h"

static void fuzz_target(const uint8_t* data, size_t size) {
    const char* path = fuzz_input_file(data, size);
    fuzz_must_name = path;
    RunIdentity expect = fuzz_run_identity();
    TrainState s;
    FILE* f = state_open(path, &s, &expect);
    /* the arrays: the file's size was checked against them */
    size_t bytes = (size_t)(state_array_offset(&s.id, s.shard_elems, STATE_ARRAYS, 0) - state_array_offset(&s.id, s.shard_elems, 0, 0));
    char* arrays = (char*)mallocCheck(bytes + 1);
    freadCheck(arrays, 1, bytes, f, path);
    fcloseCheck(f, path);
    free(arrays);
    fuzz_require(run_identity_hash(&s.id) == run_identity_hash(&expect), "an accepted state holds other run settings");
    /* resume makes AdamW's step count step - total_skips; it must stay >= 0 */
    fuzz_require(s.step >= 0 && 0 <= s.consecutive_skips && s.consecutive_skips <= s.total_skips && s.total_skips <= s.step,
                 "an accepted state counts more skipped steps than steps");
}
