/* qt_rng.h — a small, fast, seedable generator (xoshiro256**) whose whole state is 32 bytes, so
 * checkpoints can save it and resume bit-for-bit. Not for cryptography. */
#ifndef QT_RNG_H
#define QT_RNG_H

#include <stdint.h>

typedef struct { uint64_t s[4]; } qt_rng;

void qt_rng_seed(qt_rng *r, uint64_t seed);   /* splitmix64 expansion of seed */
uint64_t qt_rng_u64(qt_rng *r);
double qt_rng_uniform(qt_rng *r);             /* [0, 1) with 53 bits */
float qt_rng_normal(qt_rng *r);               /* N(0,1), Box-Muller, one draw per call */
uint64_t qt_rng_below(qt_rng *r, uint64_t n); /* uniform in [0, n), unbiased; n > 0 */
/* Stateless: a 64-bit hash of (seed, i); for order-free parallel fills. */
uint64_t qt_hash64(uint64_t seed, uint64_t i);

#endif
