/* rng.c — xoshiro256** seeded through splitmix64; Box-Muller normals. */
#include "qt_rng.h"

#include <math.h>

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

void qt_rng_seed(qt_rng *r, uint64_t seed) {
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&seed);
}

uint64_t qt_rng_u64(qt_rng *r) {
    uint64_t *s = r->s, out = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return out;
}

double qt_rng_uniform(qt_rng *r) { return (double)(qt_rng_u64(r) >> 11) * 0x1.0p-53; }

float qt_rng_normal(qt_rng *r) {
    double u1 = 1.0 - qt_rng_uniform(r), u2 = qt_rng_uniform(r); /* u1 in (0, 1] */
    return (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
}

uint64_t qt_rng_below(qt_rng *r, uint64_t n) {
    uint64_t lim = -n % n; /* reject the low 2^64 mod n values so every residue is equally likely */
    for (;;) {
        uint64_t x = qt_rng_u64(r);
        if (x >= lim) return x % n;
    }
}

uint64_t qt_hash64(uint64_t seed, uint64_t i) {
    uint64_t x = seed ^ (i * 0xd1342543de82ef95ull);
    return splitmix64(&x);
}
