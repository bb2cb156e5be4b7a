/*
 * Fuzzes the data set manifest check (dataloader/manifest.h) as the trainer runs it at start-up: the input
 * is the manifest.json of a folder that holds one train shard (written on the first input, removed at
 * exit), checked against the shard -i matched. cJSON allocates through the harness's trackers
 * (cJSON_InitHooks), so a rejection between cJSON_Parse and cJSON_Delete leaves nothing behind either.
 */
#include "fuzz.h"
#include "fuzz_inputs.h"
#include "../../dataloader/manifest.h"

#ifndef LLM8_CJSON
#error "fuzz_manifest needs cJSON (Debian's libcjson-dev: make setup)"
#endif

static char folder[PATH_LEN], shard[2 * PATH_LEN], manifest[2 * PATH_LEN];

static void remove_folder(void) {
    unlink(manifest);
    unlink(shard);
    rmdir(folder);
}

static void make_folder(void) {
    const char* tmp = getenv("TMPDIR");
    snprintf(folder, sizeof(folder), "%s/llm8-fuzz-manifest-XXXXXX", tmp != NULL ? tmp : "/tmp");
    if (mkdtemp(folder) == NULL) fuzz_fail("mkdtemp", strerror(errno));
    if (atexit(remove_folder) != 0) fuzz_fail("atexit", "cannot register the clean-up");
    snprintf(shard, sizeof(shard), "%s/%s", folder, FUZZ_MANIFEST_SHARD);
    snprintf(manifest, sizeof(manifest), "%s/%s", folder, MANIFEST_NAME);
    uint16_t tokens[FUZZ_MANIFEST_TOKENS];
    for (int i = 0; i < FUZZ_MANIFEST_TOKENS; i++) tokens[i] = (uint16_t)(LLAMA_BOS + i);
    shard_write_u16(shard, tokens, FUZZ_MANIFEST_TOKENS);
    cJSON_Hooks hooks = {fuzz_malloc, fuzz_free};
    cJSON_InitHooks(&hooks);
}

static void fuzz_target(const uint8_t* data, size_t size) {
    if (folder[0] == '\0') make_folder();
    FILE* f = fopenCheck(manifest, "wb");
    fwriteCheck(data, 1, size, f, manifest);
    fcloseCheck(f, manifest);
    fuzz_must_name = folder;
    DataLoader d;
    dataloader_init(&d, shard, FUZZ_B, FUZZ_T, 0, 1, FUZZ_ACCUM, FUZZ_VOCAB, 0, FUZZ_SEED);
    manifest_check(&d, "-i", "train", FUZZ_VOCAB);
    dataloader_free(&d);
}
