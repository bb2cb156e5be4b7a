/*
 * The data set manifest (docs/formats.md, written by dev/data/tokenize.py beside the shards):
 * at start-up the trainer prints what each data folder's manifest says and checks the shards a glob
 * matched against it: each file listed with the split it is read as (-i: train, -j: val), its header's
 * token count and version as listed, the vocabulary no larger than the model's. A glob that matches only
 * some of a split's shards is allowed (training on a subset) and said; a folder without a manifest
 * (older data, tiny-shakespeare's preparation) is said too. Parsed with cJSON (Debian's libcjson-dev);
 * a build without it (make USE_CJSON=0, e.g. a GPU host where nothing can be installed) says that it
 * does not check.
 */
#pragma once

#include "dataloader.h"

#ifdef LLM8_CJSON
#include <cjson/cJSON.h>
#endif

#define MANIFEST_NAME "manifest.json"
#define MANIFEST_FORMAT "llm8 shards"
#define MANIFEST_VERSION 1
#define MANIFEST_EXCERPT_CHARS 40 /* of the text where a manifest stops being JSON, in the error */

/* The folder of a path ("." for a bare file name). */
static inline void path_folder(const char* path, char* out, size_t len) {
    const char* slash = strrchr(path, '/');
    if (slash == NULL) snprintf(out, len, ".");
    else snprintf(out, len, "%.*s", (int)(slash - path), path);
}

#ifdef LLM8_CJSON
/* JSON numbers are doubles: integers are exact up to 2^53, and converting one past long long is undefined. */
#define MANIFEST_MAX_INT 9007199254740992.0

/* The integer member `name` of `obj`, or a one-line stop naming the manifest and the field. */
static inline long long manifest_int(const cJSON* obj, const char* name, const char* path) {
    const cJSON* v = cJSON_GetObjectItemCaseSensitive(obj, name);
    if (!cJSON_IsNumber(v)) die("%s: field '%s' is missing or not a number", path, name);
    if (!(fabs(v->valuedouble) <= MANIFEST_MAX_INT) || v->valuedouble != floor(v->valuedouble))
        die("%s: field '%s' is %g, not an integer within +-2^53", path, name, v->valuedouble);
    return (long long)v->valuedouble;
}

/* Checks the files of loader d that lie in `folder` against its manifest; prints one line. */
static inline void manifest_check_folder(const DataLoader* d, const char* folder, const char* split, const char* flag,
                                         int vocab_size) {
    char path[PATH_LEN + sizeof(MANIFEST_NAME) + 1];
    snprintf(path, sizeof(path), "%s/%s", folder, MANIFEST_NAME);
    FILE* f = fopen(path, "rb");
    if (f == NULL) {
        printf("| %s data: no %s in %s: its shards are checked on their own\n", flag, MANIFEST_NAME, folder);
        return;
    }
    size_t bytes = file_size(f, path);
    char* text = (char*)mallocCheck(bytes + 1);
    freadCheck(text, 1, bytes, f, path);
    fcloseCheck(f, path);
    text[bytes] = '\0';
    cJSON* root = cJSON_Parse(text);
    if (root == NULL) {
        /* the error pointer points into text (so text is freed only after); the excerpt stops at a line end */
        const char* near = cJSON_GetErrorPtr() ? cJSON_GetErrorPtr() : "?";
        size_t n = strcspn(near, "\r\n\v\f");
        die("%s: not valid JSON (near: %.*s)", path, (int)(n < MANIFEST_EXCERPT_CHARS ? n : MANIFEST_EXCERPT_CHARS), near);
    }
    free(text);
    const cJSON* format = cJSON_GetObjectItemCaseSensitive(root, "format");
    if (!cJSON_IsString(format) || strcmp(format->valuestring, MANIFEST_FORMAT) != 0)
        die("%s: 'format' is not \"%s\"", path, MANIFEST_FORMAT);
    if (manifest_int(root, "version", path) != MANIFEST_VERSION)
        die("%s: version %lld is not %d", path, manifest_int(root, "version", path), MANIFEST_VERSION);
    long long shard_version = manifest_int(root, "shard_version", path);
    long long vocab = manifest_int(root, "vocab_size", path);
    if (vocab > vocab_size) die("%s: vocab_size %lld exceeds the model's %d", path, vocab, vocab_size);
    const cJSON* splits = cJSON_GetObjectItemCaseSensitive(root, "splits");
    const cJSON* mine = cJSON_GetObjectItemCaseSensitive(splits, split);
    if (!cJSON_IsObject(mine)) die("%s: no splits.%s", path, split);
    long long listed = manifest_int(mine, "shards", path);
    const cJSON* shards = cJSON_GetObjectItemCaseSensitive(root, "shards");
    if (!cJSON_IsArray(shards)) die("%s: 'shards' is missing or not an array", path);
    int matched = 0;
    for (int i = 0; i < d->num_shards; i++) {
        char dir[PATH_LEN];
        path_folder(d->paths[i], dir, sizeof(dir));
        if (strcmp(dir, folder) != 0) continue;
        const char* name = strrchr(d->paths[i], '/') ? strrchr(d->paths[i], '/') + 1 : d->paths[i];
        const cJSON* entry = NULL;
        const cJSON* s;
        cJSON_ArrayForEach(s, shards) {
            const cJSON* file = cJSON_GetObjectItemCaseSensitive(s, "file");
            if (cJSON_IsString(file) && strcmp(file->valuestring, name) == 0) entry = s;
        }
        if (entry == NULL) die("%s: not listed in %s", d->paths[i], path);
        const cJSON* its_split = cJSON_GetObjectItemCaseSensitive(entry, "split");
        if (!cJSON_IsString(its_split) || strcmp(its_split->valuestring, split) != 0)
            die("flag %s: %s is a %s shard in %s, not a %s shard", flag, d->paths[i],
                cJSON_IsString(its_split) ? its_split->valuestring : "?", path, split);
        if (manifest_int(entry, "tokens", path) != (long long)d->shard_tokens[i])
            die("%s: header holds %zu tokens, %s lists %lld", d->paths[i], d->shard_tokens[i], path, manifest_int(entry, "tokens", path));
        if (shard_version != d->shard_version[i])
            die("%s: header version %d, %s lists shard_version %lld", d->paths[i], d->shard_version[i], path, shard_version);
        matched++;
    }
    printf("| %s data: %s: %lld documents, %lld tokens in all; %s split %lld shard(s) of which %d matched%s\n", flag, path,
           manifest_int(root, "documents", path), manifest_int(root, "tokens", path), split, listed, matched,
           matched < listed ? " (a subset)" : "");
    cJSON_Delete(root);
}
#endif

/*
 * Checks the shards loader d matched (for `flag`, -i or -j, read as split "train" or "val") against the
 * manifest of every folder they lie in; stops with one line naming the file on a mismatch.
 */
static inline void manifest_check(const DataLoader* d, const char* flag, const char* split, int vocab_size) {
#ifdef LLM8_CJSON
    for (int i = 0; i < d->num_shards; i++) {
        char folder[PATH_LEN], earlier[PATH_LEN];
        path_folder(d->paths[i], folder, sizeof(folder));
        int seen = 0;
        for (int k = 0; k < i && !seen; k++) {
            path_folder(d->paths[k], earlier, sizeof(earlier));
            seen = strcmp(earlier, folder) == 0;
        }
        if (!seen) manifest_check_folder(d, folder, split, flag, vocab_size);
    }
#else
    (void)d;
    (void)split;
    (void)vocab_size;
    printf("| %s data: built without cJSON (USE_CJSON=0): manifest.json not checked\n", flag);
#endif
}
