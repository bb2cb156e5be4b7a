/*
 * Fuzzes the training-state reader (train/checkpoint.h) as resume uses it: state_read with the settings
 * and parameter slice of the run in fuzz_inputs.h (magic, version, build, size, every run setting, the
 * config hash, the slice), then the moments and master weights.
 */
#include "fuzz.h"
#include "fuzz_inputs.h"

static void fuzz_target(const uint8_t* data, size_t size) {
    const char* path = fuzz_input_file(data, size);
    fuzz_must_name = path;
    RunIdentity expect = fuzz_run_identity();
    TrainState s;
    float m[FUZZ_STATE_FLOATS], v[FUZZ_STATE_FLOATS], master[FUZZ_STATE_FLOATS];
    state_read(path, &s, &expect, 0, FUZZ_STATE_FLOATS, m, v, master);
    fuzz_require(run_identity_hash(&s.id) == run_identity_hash(&expect), "an accepted state holds other run settings");
    /* resume makes AdamW's step count step - total_skips; it must stay >= 0 */
    fuzz_require(s.step >= 0 && 0 <= s.consecutive_skips && s.consecutive_skips <= s.total_skips && s.total_skips <= s.step,
                 "an accepted state counts more skipped steps than steps");
}
