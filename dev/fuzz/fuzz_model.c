/*
 * Fuzzes the model checkpoint reader (llama/model_file.h) as `-e FILE` uses it: the header and size
 * checks of checkpoint_open, the start-up checks of the config it yields (llama_config_validate), then
 * the parameters read into a buffer of the size the header implies.
 */
#include "fuzz.h"
#include "fuzz_inputs.h"

static void fuzz_target(const uint8_t* data, size_t size) {
    const char* path = fuzz_input_file(data, size);
    fuzz_must_name = path;
    LlamaConfig cfg;
    checkpoint_read_config(path, &cfg);
    fuzz_must_name = NULL; /* the config checks name the dimension, not the file */
    llama_config_validate(&cfg, 1, 1, PRECISION_FP32);
    fuzz_must_name = path;
    size_t n = param_count(&cfg);
    fuzz_require(HEADER_INTS * sizeof(int32_t) + n * sizeof(float) == size, "an accepted checkpoint's size differs from its header's");
    float* params = (float*)mallocCheck(n * sizeof(float));
    checkpoint_read_params(path, &cfg, params);
    free(params);
}
