/*
 * write_shard: a shard of random tokens, the input of scripts/device_check.sh's throughput, shadow and
 * resume runs (speed does not depend on the text). Build with `make build/tools/write_shard`.
 *
 *   build/tools/write_shard PATH TOKENS SEED
 *
 * Writes a version-1 (uint16) shard of TOKENS tokens drawn uniformly from [3, 32000) by core/rng.h seeded
 * with SEED, a BOS every 1024 tokens (documents).
 */
#include "../../dataloader/dataloader.h" // defines: shard_write_u16
#include "../../train/cli.h"             // defines: parse_integer

#define DOC_TOKENS 1024

int main(int argc, char** argv) {
    if (argc != 4) die("usage: write_shard PATH TOKENS SEED");
    size_t n = (size_t)parse_integer("TOKENS", argv[2], 2, INT32_MAX);
    Rng rng;
    rng_seed(&rng, (uint64_t)parse_integer("SEED", argv[3], 0, LLONG_MAX));
    uint16_t* tokens = (uint16_t*)mallocCheck(n * sizeof(uint16_t));
    for (size_t i = 0; i < n; i++)
        tokens[i] = i % DOC_TOKENS == 0 ? LLAMA_BOS : (uint16_t)(3 + rng_below(&rng, LLAMA_VOCAB_SIZE - 3));
    shard_write_u16(argv[1], tokens, n);
    free(tokens);
    return 0;
}
