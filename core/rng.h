/*
 * A small deterministic random number generator (xoshiro256**, Blackman & Vigna 2018, seeded through
 * splitmix64), identical on every platform and build, so that initialisation, data shuffling and
 * sampling are reproducible and their state can be saved for exact resume.
 */
#pragma once

#include <math.h>
#include <stdint.h>

typedef struct {
    uint64_t s[4];
} Rng;

static inline uint64_t splitmix64(uint64_t* x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline void rng_seed(Rng* r, uint64_t seed) {
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&x);
}

static inline uint64_t rotl64(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static inline uint64_t rng_u64(Rng* r) {
    uint64_t* s = r->s;
    uint64_t result = rotl64(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl64(s[3], 45);
    return result;
}

/* Uniform in [0, 1) with 24 random bits. */
static inline float rng_uniform(Rng* r) { return (float)(rng_u64(r) >> 40) * 0x1p-24f; }

/* Uniform integer in [0, n) (n > 0), by rejection so that it is unbiased. */
static inline uint64_t rng_below(Rng* r, uint64_t n) {
    uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do {
        x = rng_u64(r);
    } while (x >= limit);
    return x % n;
}

/* Standard normal sample (Box-Muller in double precision). */
static inline float rng_normal(Rng* r) {
    double u1 = ((double)(rng_u64(r) >> 11) + 1.0) * 0x1p-53; /* (0, 1] so log() is finite */
    double u2 = (double)(rng_u64(r) >> 11) * 0x1p-53;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

/* Fisher-Yates shuffle of idx[0..n) with a generator seeded by `seed` (same permutation on every rank). */
static inline void rng_permutation(int* idx, int n, uint64_t seed) {
    Rng r;
    rng_seed(&r, seed);
    for (int i = 0; i < n; i++) idx[i] = i;
    for (int i = n - 1; i > 0; i--) {
        int j = (int)rng_below(&r, (uint64_t)i + 1);
        int t = idx[i];
        idx[i] = idx[j];
        idx[j] = t;
    }
}
