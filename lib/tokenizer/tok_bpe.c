/* The BPE model of tokenizer.json, as tokenizers' models/bpe: vocab (string -> id hash
 * map), merges ("a b" strings or ["a", "b"] pairs) as a (left id, right id) -> (rank,
 * merged id) map, and the merge loop of word.rs merge_all: symbols in a linked list, a
 * min-heap of candidate merges ordered by (rank, position), stale entries skipped when
 * popped. Characters missing from the vocab become <0xNN> byte tokens (byte_fallback) or
 * the unk token (consecutive ones fused with fuse_unk). With ignore_merges a pre-token
 * found whole in the vocab is emitted as is. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_internal.h"

#define CP_TABLE 0x10000

/* ---- word cache: a fixed-size direct-mapped table of short words ---- */

#define CACHE_SLOTS 16384
#define CACHE_MAX_WORD 48
#define CACHE_MAX_IDS 24

typedef struct cache_entry {
    uint64_t hash;
    uint8_t wlen, nids;
    char word[CACHE_MAX_WORD];
    int32_t ids[CACHE_MAX_IDS];
} cache_entry;

struct tk_cache {
    cache_entry e[CACHE_SLOTS];
};

static int add_merge(tk_bpe *m, const char *a, size_t la, const char *b, size_t lb, int32_t rank,
                     const char *path, ft_err *err)
{
    int32_t ia = tk_strmap_get(&m->vocab, a, la), ib = tk_strmap_get(&m->vocab, b, lb);
    if (ia < 0 || ib < 0)
        return ft_fail(err, "%s: model.merges[%d]: token '%.*s' is not in the vocab", path, rank,
                       (int)(ia < 0 ? la : lb), ia < 0 ? a : b);
    char stackbuf[256];
    char *cat = la + lb <= sizeof stackbuf ? stackbuf : malloc(la + lb);
    if (!cat)
        return ft_fail(err, "%s: out of memory", path);
    memcpy(cat, a, la);
    memcpy(cat + la, b, lb);
    int32_t im = tk_strmap_get(&m->vocab, cat, la + lb);
    if (cat != stackbuf)
        free(cat);
    if (im < 0)
        return ft_fail(err, "%s: model.merges[%d]: merged token '%.*s%.*s' is not in the vocab",
                       path, rank, (int)la, a, (int)lb, b);
    if (tk_pairmap_put(&m->merges, ia, ib, rank, im))
        return ft_fail(err, "%s: out of memory", path);
    return 0;
}

int tk_bpe_parse(tk_bpe *m, const void *json, size_t n_added, const char *path, ft_err *err)
{
    const json_t *j = json;
    memset(m, 0, sizeof *m);
    m->unk_id = -1;
    pthread_mutex_init(&m->cache_lock, NULL);
    if (!json_is_object(j))
        return ft_fail(err, "%s: missing 'model' object", path);
    const char *type = json_string_value(json_object_get(j, "type"));
    if (type && strcmp(type, "BPE"))
        return ft_fail(err, "%s: model: unsupported type '%s' (only BPE)", path, type);
    json_t *d = json_object_get(j, "dropout");
    if (d && !json_is_null(d))
        return ft_fail(err, "%s: model.dropout: must be null (BPE dropout not supported)", path);
    const char *keys[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int k = 0; k < 2; k++) {
        json_t *v = json_object_get(j, keys[k]);
        if (v && !json_is_null(v) && !(json_is_string(v) && json_string_length(v) == 0))
            return ft_fail(err, "%s: model.%s: not supported", path, keys[k]);
    }
    m->byte_fallback = json_is_true(json_object_get(j, "byte_fallback"));
    m->fuse_unk = json_is_true(json_object_get(j, "fuse_unk"));
    m->ignore_merges = json_is_true(json_object_get(j, "ignore_merges"));

    json_t *vocab = json_object_get(j, "vocab");
    if (!json_is_object(vocab))
        return ft_fail(err, "%s: model.vocab: expected an object", path);
    if (tk_strmap_init(&m->vocab, json_object_size(vocab)))
        return ft_fail(err, "%s: out of memory", path);
    const char *key;
    json_t *val;
    int64_t maxid = -1;
    /* The vocabulary has at most this many ids (see tk_vocab_limit). */
    size_t n_vocab = json_object_size(vocab), limit = tk_vocab_limit(n_vocab, n_added);
    json_object_foreach(vocab, key, val) {
        if (!json_is_integer(val) || json_integer_value(val) < 0)
            return ft_fail(err, "%s: model.vocab['%s']: expected a non-negative integer id", path,
                           key);
        if ((uint64_t)json_integer_value(val) >= limit)
            return ft_fail(err, "%s: model.vocab['%s']: id %lld is beyond the vocabulary (%zu "
                                "tokens in model.vocab and %zu added tokens: ids 0..%zu)",
                           path, key, (long long)json_integer_value(val), n_vocab, n_added,
                           limit - 1);
        if (json_integer_value(val) > maxid)
            maxid = json_integer_value(val);
    }
    m->nid = (size_t)(maxid + 1);
    m->id_to_tok = calloc(m->nid + 1, sizeof *m->id_to_tok);
    m->cp_id = malloc(CP_TABLE * sizeof *m->cp_id);
    if (!m->id_to_tok || !m->cp_id)
        return ft_fail(err, "%s: out of memory", path);
    for (size_t i = 0; i < CP_TABLE; i++)
        m->cp_id[i] = -1;
    for (int b = 0; b < 256; b++)
        m->byte_ids[b] = -1;
    json_object_foreach(vocab, key, val) {
        size_t len = strlen(key);
        int32_t id = (int32_t)json_integer_value(val);
        if (tk_strmap_put(&m->vocab, key, len, id))
            return ft_fail(err, "%s: out of memory", path);
    }
    for (size_t k = 0; k < m->vocab.n; k++) {
        const char *s = m->vocab.keys[k];
        size_t len = m->vocab.klen[k];
        int32_t id = m->vocab.vals[k];
        if (m->id_to_tok[id])
            return ft_fail(err, "%s: model.vocab: id %d is given to two tokens, '%s' and '%s'",
                           path, id, m->id_to_tok[id], s);
        m->id_to_tok[id] = m->vocab.keys[k];
        if (len > 0 && len <= 3) {
            uint32_t cp;
            if ((size_t)tk_utf8_next(s, &cp) == len && cp < CP_TABLE)
                m->cp_id[cp] = id;
        }
    }
    for (int b = 0; b < 256; b++) {
        char code[8];
        snprintf(code, sizeof code, "<0x%02X>", b);
        m->byte_ids[b] = tk_strmap_get(&m->vocab, code, 6);
    }
    json_t *unk = json_object_get(j, "unk_token");
    if (json_is_string(unk)) {
        m->unk_token = strdup(json_string_value(unk));
        m->unk_id = tk_strmap_get(&m->vocab, m->unk_token, strlen(m->unk_token));
    }

    m->cache = calloc(1, sizeof *m->cache);
    if (!m->cache)
        return ft_fail(err, "%s: out of memory", path);
    json_t *merges = json_object_get(j, "merges");
    size_t nm = json_is_array(merges) ? json_array_size(merges) : 0;
    if (merges && !json_is_null(merges) && !json_is_array(merges))
        return ft_fail(err, "%s: model.merges: expected an array", path);
    if (tk_pairmap_init(&m->merges, nm))
        return ft_fail(err, "%s: out of memory", path);
    for (size_t i = 0; i < nm; i++) {
        json_t *e = json_array_get(merges, i);
        if (json_is_string(e)) {
            const char *s = json_string_value(e);
            const char *sp = strchr(s, ' ');
            if (!sp || strchr(sp + 1, ' '))
                return ft_fail(err, "%s: model.merges[%zu]: expected \"a b\", got \"%s\"", path, i,
                               s);
            if (add_merge(m, s, (size_t)(sp - s), sp + 1, strlen(sp + 1), (int32_t)i, path, err))
                return -1;
        } else if (json_is_array(e) && json_array_size(e) == 2 &&
                   json_is_string(json_array_get(e, 0)) && json_is_string(json_array_get(e, 1))) {
            json_t *a = json_array_get(e, 0), *b = json_array_get(e, 1);
            if (add_merge(m, json_string_value(a), json_string_length(a), json_string_value(b),
                          json_string_length(b), (int32_t)i, path, err))
                return -1;
        } else {
            return ft_fail(err, "%s: model.merges[%zu]: expected \"a b\" or [\"a\", \"b\"]", path,
                           i);
        }
    }
    return 0;
}

static uint64_t word_hash(const char *s, size_t len)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < len; i++)
        h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h | 1;
}

void tk_bpe_free(tk_bpe *m)
{
    tk_strmap_free(&m->vocab);
    tk_pairmap_free(&m->merges);
    free(m->id_to_tok);
    free(m->cp_id);
    free(m->unk_token);
    free(m->cache);
    pthread_mutex_destroy(&m->cache_lock);
    memset(m, 0, sizeof *m);
}

typedef struct sym {
    int32_t id, prev, next, len;
} sym;

typedef struct hent {
    int32_t rank, pos, new_id;
} hent;

static inline bool hless(hent a, hent b)
{
    return a.rank < b.rank || (a.rank == b.rank && a.pos < b.pos);
}

static void hpush(hent *h, size_t *n, hent x)
{
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!hless(x, h[p]))
            break;
        h[i] = h[p];
        i = p;
    }
    h[i] = x;
}

static hent hpop(hent *h, size_t *n)
{
    hent top = h[0], x = h[--(*n)];
    size_t i = 0, m = *n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= m)
            break;
        if (c + 1 < m && hless(h[c + 1], h[c]))
            c++;
        if (!hless(h[c], x))
            break;
        h[i] = h[c];
        i = c;
    }
    h[i] = x;
    return top;
}

static int32_t char_id(const tk_bpe *m, const char *s, size_t k, uint32_t cp)
{
    if (cp < CP_TABLE)
        return m->cp_id[cp];
    return tk_strmap_get(&m->vocab, s, k);
}

int tk_bpe_encode(const tk_bpe *m, const char *s, size_t len, ft_ids *out, ft_err *err)
{
    if (len == 0)
        return 0;
    if (m->ignore_merges) {
        int32_t id = tk_strmap_get(&m->vocab, s, len);
        if (id >= 0)
            return ft_ids_push(out, id) ? ft_fail(err, "tokenizer: out of memory") : 0;
    }
    tk_bpe *mm = (tk_bpe *)m; /* the cache is the only mutable state, behind its lock */
    uint64_t h = 0;
    if (len <= CACHE_MAX_WORD && m->cache) {
        h = word_hash(s, len);
        cache_entry *e = &m->cache->e[h % CACHE_SLOTS];
        int32_t ids[CACHE_MAX_IDS];
        int n = -1;
        pthread_mutex_lock(&mm->cache_lock);
        if (e->hash == h && e->wlen == len && memcmp(e->word, s, len) == 0) {
            n = e->nids;
            memcpy(ids, e->ids, (size_t)n * sizeof *ids);
        }
        pthread_mutex_unlock(&mm->cache_lock);
        if (n >= 0) {
            for (int i = 0; i < n; i++)
                if (ft_ids_push(out, ids[i]))
                    return ft_fail(err, "tokenizer: out of memory");
            return 0;
        }
    }

    sym sbuf[64];
    hent hbuf[130];
    sym *sy = len <= 64 ? sbuf : malloc(len * sizeof *sy);
    hent *heap = len <= 64 ? hbuf : malloc(len * 2 * sizeof *heap + sizeof *heap);
    if (!sy || !heap) {
        if (sy != sbuf)
            free(sy);
        if (heap != hbuf)
            free(heap);
        return ft_fail(err, "tokenizer: out of memory");
    }
    size_t heapcap = len <= 64 ? 130 : len * 2 + 1;
    size_t n = 0;
    int32_t unk_len = 0; /* pending unk span (bytes), 0 = none */
    int rc = 0;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        int k = tk_utf8_next(s + i, &cp);
        int32_t id = char_id(m, s + i, (size_t)k, cp);
        if (id >= 0) {
            if (unk_len) {
                sy[n++] = (sym){m->unk_id, 0, 0, unk_len};
                unk_len = 0;
            }
            sy[n++] = (sym){id, 0, 0, k};
        } else {
            bool done = false;
            if (m->byte_fallback) {
                bool all = true;
                for (int b = 0; b < k; b++)
                    all = all && m->byte_ids[(unsigned char)s[i + b]] >= 0;
                if (all) {
                    for (int b = 0; b < k; b++)
                        sy[n++] = (sym){m->byte_ids[(unsigned char)s[i + b]], 0, 0, 1};
                    done = true;
                }
            }
            if (!done && m->unk_token) {
                if (m->unk_id < 0) {
                    rc = ft_fail(err, "tokenizer: unk_token '%s' is not in the vocab",
                                 m->unk_token);
                    goto out;
                }
                if (unk_len && !m->fuse_unk) {
                    sy[n++] = (sym){m->unk_id, 0, 0, unk_len};
                    unk_len = 0;
                }
                unk_len += k;
            }
        }
        i += (size_t)k;
    }
    if (unk_len)
        sy[n++] = (sym){m->unk_id, 0, 0, unk_len};
    for (size_t i = 0; i < n; i++) {
        sy[i].prev = (int32_t)i - 1;
        sy[i].next = i + 1 < n ? (int32_t)i + 1 : -1;
    }

    size_t hn = 0;
    for (size_t i = 0; i + 1 < n; i++) {
        int32_t r, nid;
        if (tk_pairmap_get(&m->merges, sy[i].id, sy[i + 1].id, &r, &nid))
            hpush(heap, &hn, (hent){r, (int32_t)i, nid});
    }
    while (hn > 0) {
        hent top = hpop(heap, &hn);
        sym *cur = &sy[top.pos];
        if (cur->len == 0 || cur->next < 0)
            continue;
        sym *right = &sy[cur->next];
        int32_t r, nid;
        if (!tk_pairmap_get(&m->merges, cur->id, right->id, &r, &nid) || nid != top.new_id)
            continue;
        cur->id = top.new_id;
        cur->len += right->len;
        right->len = 0;
        cur->next = right->next;
        if (cur->next >= 0)
            sy[cur->next].prev = top.pos;
        if (hn + 2 > heapcap) { /* cannot happen: each merge pushes at most 2, removes 1 symbol */
            rc = ft_fail(err, "tokenizer: internal error: merge heap overflow");
            goto out;
        }
        if (cur->prev >= 0 && tk_pairmap_get(&m->merges, sy[cur->prev].id, cur->id, &r, &nid))
            hpush(heap, &hn, (hent){r, cur->prev, nid});
        if (cur->next >= 0 && tk_pairmap_get(&m->merges, cur->id, sy[cur->next].id, &r, &nid))
            hpush(heap, &hn, (hent){r, top.pos, nid});
    }
    int32_t cached[CACHE_MAX_IDS];
    int nc = 0;
    for (int32_t i = n ? 0 : -1; i >= 0; i = sy[i].next) {
        if (ft_ids_push(out, sy[i].id)) {
            rc = ft_fail(err, "tokenizer: out of memory");
            goto out;
        }
        if (nc < CACHE_MAX_IDS)
            cached[nc] = sy[i].id;
        nc++;
    }
    if (h && nc <= CACHE_MAX_IDS) {
        pthread_mutex_lock(&mm->cache_lock);
        cache_entry *e = &m->cache->e[h % CACHE_SLOTS];
        e->hash = h;
        e->wlen = (uint8_t)len;
        memcpy(e->word, s, len);
        e->nids = (uint8_t)nc;
        memcpy(e->ids, cached, (size_t)nc * sizeof *cached);
        pthread_mutex_unlock(&mm->cache_lock);
    }
out:
    if (sy != sbuf)
        free(sy);
    if (heap != hbuf)
        free(heap);
    return rc;
}
