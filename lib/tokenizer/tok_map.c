/* Hash maps for the tokenizer: string -> id (vocabulary, added tokens) and
 * (left id, right id) -> (rank, merged id) (BPE merges). Both use open addressing with
 * linear probing and a power-of-two capacity kept at most half full. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_internal.h"

static uint64_t hash_bytes(const char *s, size_t len)
{
    uint64_t h = 0x9E3779B97F4A7C15ull ^ len;
    while (len >= 8) {
        uint64_t x;
        memcpy(&x, s, 8);
        h = (h ^ x) * 0xBF58476D1CE4E5B9ull;
        h ^= h >> 31;
        s += 8;
        len -= 8;
    }
    uint64_t x = 0;
    memcpy(&x, s, len);
    h = (h ^ x) * 0x94D049BB133111EBull;
    h ^= h >> 29;
    h *= 0xBF58476D1CE4E5B9ull;
    return h ^ (h >> 32);
}

static size_t pow2_at_least(size_t n)
{
    size_t c = 16;
    while (c < n)
        c <<= 1;
    return c;
}

int tk_strmap_init(tk_strmap *m, size_t expected)
{
    memset(m, 0, sizeof *m);
    m->cap = pow2_at_least(expected * 2 + 1);
    m->slots = calloc(m->cap, sizeof *m->slots);
    return m->slots ? 0 : -1;
}

void tk_strmap_free(tk_strmap *m)
{
    for (size_t i = 0; i < m->n; i++)
        free(m->keys[i]);
    free(m->keys);
    free(m->klen);
    free(m->vals);
    free(m->slots);
    memset(m, 0, sizeof *m);
}

static size_t strmap_find(const tk_strmap *m, const char *key, size_t len)
{
    size_t mask = m->cap - 1, i = hash_bytes(key, len) & mask;
    for (;;) {
        uint32_t s = m->slots[i];
        if (!s)
            return i;
        if (m->klen[s - 1] == len && memcmp(m->keys[s - 1], key, len) == 0)
            return i;
        i = (i + 1) & mask;
    }
}

static int strmap_grow(tk_strmap *m)
{
    size_t ncap = m->cap * 2;
    uint32_t *ns = calloc(ncap, sizeof *ns);
    if (!ns)
        return -1;
    for (size_t k = 0; k < m->n; k++) {
        size_t i = hash_bytes(m->keys[k], m->klen[k]) & (ncap - 1);
        while (ns[i])
            i = (i + 1) & (ncap - 1);
        ns[i] = (uint32_t)(k + 1);
    }
    free(m->slots);
    m->slots = ns;
    m->cap = ncap;
    return 0;
}

int tk_strmap_put(tk_strmap *m, const char *key, size_t len, int32_t val)
{
    size_t i = strmap_find(m, key, len);
    if (m->slots[i]) {
        m->vals[m->slots[i] - 1] = val;
        return 0;
    }
    if ((m->n + 1) * 2 > m->cap) {
        if (strmap_grow(m))
            return -1;
        i = strmap_find(m, key, len);
    }
    if (m->n == m->kcap) {
        size_t nc = m->kcap ? m->kcap * 2 : 64;
        char **k = realloc(m->keys, nc * sizeof *k);
        if (!k)
            return -1;
        m->keys = k;
        uint32_t *l = realloc(m->klen, nc * sizeof *l);
        if (!l)
            return -1;
        m->klen = l;
        int32_t *v = realloc(m->vals, nc * sizeof *v);
        if (!v)
            return -1;
        m->vals = v;
        m->kcap = nc;
    }
    char *copy = malloc(len + 1);
    if (!copy)
        return -1;
    memcpy(copy, key, len);
    copy[len] = 0;
    m->keys[m->n] = copy;
    m->klen[m->n] = (uint32_t)len;
    m->vals[m->n] = val;
    m->slots[i] = (uint32_t)(++m->n);
    return 0;
}

int32_t tk_strmap_get(const tk_strmap *m, const char *key, size_t len)
{
    if (!m->slots)
        return -1;
    uint32_t s = m->slots[strmap_find(m, key, len)];
    return s ? m->vals[s - 1] : -1;
}

static inline uint64_t mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xFF51AFD7ED558CCDull;
    x ^= x >> 33;
    x *= 0xC4CEB9FE1A85EC53ull;
    x ^= x >> 33;
    return x;
}

int tk_pairmap_init(tk_pairmap *m, size_t expected)
{
    m->cap = pow2_at_least(expected * 2 + 1);
    m->n = 0;
    m->keys = malloc(m->cap * sizeof *m->keys);
    m->rank = malloc(m->cap * sizeof *m->rank);
    m->merged = malloc(m->cap * sizeof *m->merged);
    if (!m->keys || !m->rank || !m->merged)
        return -1;
    memset(m->keys, 0xff, m->cap * sizeof *m->keys);
    return 0;
}

void tk_pairmap_free(tk_pairmap *m)
{
    free(m->keys);
    free(m->rank);
    free(m->merged);
    memset(m, 0, sizeof *m);
}

int tk_pairmap_put(tk_pairmap *m, int32_t a, int32_t b, int32_t rank, int32_t merged)
{
    if ((m->n + 1) * 2 > m->cap) {
        tk_pairmap old = *m;
        if (tk_pairmap_init(m, old.cap))
            return -1;
        for (size_t i = 0; i < old.cap; i++)
            if (old.keys[i] != UINT64_MAX)
                tk_pairmap_put(m, (int32_t)(old.keys[i] >> 32), (int32_t)(uint32_t)old.keys[i],
                               old.rank[i], old.merged[i]);
        tk_pairmap_free(&old);
    }
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    size_t mask = m->cap - 1, i = mix64(key) & mask;
    while (m->keys[i] != UINT64_MAX && m->keys[i] != key)
        i = (i + 1) & mask;
    if (m->keys[i] == UINT64_MAX)
        m->n++;
    m->keys[i] = key;
    m->rank[i] = rank;
    m->merged[i] = merged;
    return 0;
}

bool tk_pairmap_get(const tk_pairmap *m, int32_t a, int32_t b, int32_t *rank, int32_t *merged)
{
    if (!m->keys)
        return false;
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    size_t mask = m->cap - 1, i = mix64(key) & mask;
    for (;;) {
        uint64_t k = m->keys[i];
        if (k == key) {
            *rank = m->rank[i];
            *merged = m->merged[i];
            return true;
        }
        if (k == UINT64_MAX)
            return false;
        i = (i + 1) & mask;
    }
}
