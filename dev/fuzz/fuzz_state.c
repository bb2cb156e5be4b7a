/*
 * Fuzzes the training-state reader (train/checkpoint.h) as resume uses it: state_open with the settings
 * of the run in fuzz_inputs.h (magic, version, build, config hash, layout, size, step counters, every
 * run setting), then the moments and master weights of the shard, as many as the header says.
 */
#include "fuzz.h"
#include "fuzz_inputs.h"

static void fuzz_target(const uint8_t* data, size_t size) {
    const char* path = fuzz_input_file(data, size);
    fuzz_must_name = path;
    RunIdentity expect = fuzz_run_identity();
    TrainState s;
    FILE* f = state_open(path, &s, &expect);
    float* arrays = (float*)mallocCheck(3 * s.shard_elems * sizeof(float)); /* m, v, master: the size was checked */
    freadCheck(arrays, sizeof(float), 3 * s.shard_elems, f, path);
    fcloseCheck(f, path);
    free(arrays);
    fuzz_require(run_identity_hash(&s.id) == run_identity_hash(&expect), "an accepted state holds other run settings");
    /* resume makes AdamW's step count step - total_skips; it must stay >= 0 */
    fuzz_require(s.step >= 0 && 0 <= s.consecutive_skips && s.consecutive_skips <= s.total_skips && s.total_skips <= s.step,
                 "an accepted state counts more skipped steps than steps");
}
