/* Counter-based random numbers: Philox4x32-10.
 *
 * Philox (Salmon, Moraes, Dror, Shaw: "Parallel random numbers: as easy as
 * 1, 2, 3", SC'11) maps a 128-bit counter through 10 rounds of
 *     (c0, c1, c2, c3) -> (hi(M1*c2) ^ c1 ^ k0, lo(M1*c2), hi(M0*c0) ^ c3 ^ k1, lo(M0*c0))
 * with the 64-bit key (k0, k1) bumped by the Weyl constants after each round.
 * Here the key is the run seed mixed with the stream id, and the counter is
 * (a, b), so every random draw is addressed, not sequential. */
#include <math.h>

#include "dp/core.h"

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

static uint64_t mix64(uint64_t z) { /* splitmix64 finaliser */
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

void dp_rng_philox(uint64_t seed, uint32_t stream, uint64_t a, uint64_t b, uint32_t out[4]) {
    uint64_t key = mix64(seed ^ mix64((uint64_t)stream + 0x632be59bd9b4e019ULL));
    uint32_t k0 = (uint32_t)key, k1 = (uint32_t)(key >> 32);
    uint32_t c0 = (uint32_t)a, c1 = (uint32_t)(a >> 32), c2 = (uint32_t)b, c3 = (uint32_t)(b >> 32);
    for (int r = 0; r < 10; r++) {
        uint64_t p0 = (uint64_t)PHILOX_M0 * c0, p1 = (uint64_t)PHILOX_M1 * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
        uint32_t n1 = (uint32_t)p1;
        uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        uint32_t n3 = (uint32_t)p0;
        c0 = n0, c1 = n1, c2 = n2, c3 = n3;
        k0 += PHILOX_W0;
        k1 += PHILOX_W1;
    }
    out[0] = c0, out[1] = c1, out[2] = c2, out[3] = c3;
}

uint32_t dp_rng_u32(uint64_t seed, uint32_t stream, uint64_t a, uint64_t b) {
    uint32_t o[4];
    dp_rng_philox(seed, stream, a, b, o);
    return o[0];
}

float dp_rng_uniform(uint64_t seed, uint32_t stream, uint64_t a, uint64_t b) {
    return (float)(dp_rng_u32(seed, stream, a, b) >> 8) * (1.0f / 16777216.0f);
}

float dp_rng_normal(uint64_t seed, uint32_t stream, uint64_t a, uint64_t b) {
    uint32_t o[4];
    dp_rng_philox(seed, stream, a, b, o);
    /* u1 in (0, 1] so that log(u1) is finite. */
    double u1 = ((double)o[0] + 1.0) / 4294967296.0;
    double u2 = (double)o[1] / 4294967296.0;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

void dp_rng_permutation(uint64_t seed, uint32_t stream, uint64_t a, int64_t *perm, int64_t n) {
    for (int64_t i = 0; i < n; i++) perm[i] = i;
    /* Fisher-Yates from the end; draw i picks j uniformly in [0, i] from a
     * 64-bit word (bias < 2^-32 for n < 2^32). */
    for (int64_t i = n - 1; i > 0; i--) {
        uint32_t o[4];
        dp_rng_philox(seed, stream, a, (uint64_t)i, o);
        uint64_t r = ((uint64_t)o[0] << 32) | o[1];
        int64_t j = (int64_t)(r % (uint64_t)(i + 1));
        int64_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
}
