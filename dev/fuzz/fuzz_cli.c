/*
 * Fuzzes the command-line parser (train/cli.h): the input split at NUL bytes and newlines is argv[1..],
 * parsed by train_args_parse and checked by train_args_check, as the trainer starts. Every rejection must
 * be one line naming a flag; rejections quote the argument, so arguments hold no newline here (a shell
 * user who passes one gets it back verbatim).
 */
#include "fuzz.h"
#include "../../train/cli.h"

#define FUZZ_MAX_ARGS 64

static void fuzz_target(const uint8_t* data, size_t size) {
    char* text = (char*)mallocCheck(size + 1); /* the arguments, NUL-terminated */
    memcpy(text, data, size);
    text[size] = '\0';
    for (size_t i = 0; i < size; i++) {
        if (text[i] == '\n') text[i] = '\0';
    }
    char* argv[FUZZ_MAX_ARGS + 1];
    int argc = 0;
    argv[argc++] = (char*)"train_llama_cpu";
    for (size_t i = 0; i < size && argc < FUZZ_MAX_ARGS; i += strlen(text + i) + 1) argv[argc++] = text + i;
    argv[argc] = NULL;
    fuzz_must_name = "flag";
    TrainArgs a = train_args_default();
    if (train_args_parse(&a, argc, argv) == 0) train_args_check(&a);
    free(text);
}
