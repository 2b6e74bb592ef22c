/* Seeded, counter-based random numbers: splitmix64. No hidden state: the caller keeps
 * the counter, so a run is reproducible and a resumed run continues where it stopped. */
#ifndef FT_RNG_H
#define FT_RNG_H

#include <stdint.h>

/* splitmix64 finaliser: a bijective 64-bit mix with good avalanche. */
static inline uint64_t ft_mix64(uint64_t z)
{
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Uniform in [0, 1) from the top 24 bits of mix(seed, i). */
static inline float ft_uniform(uint64_t seed, uint64_t i)
{
    return (float)(ft_mix64(seed ^ ft_mix64(i)) >> 40) * (1.0f / 16777216.0f);
}

#endif
