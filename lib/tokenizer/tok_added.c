/* Added tokens of tokenizer.json, as tokenizers' AddedVocabulary: they are matched whole
 * before the model runs, leftmost-longest (a byte trie), first the tokens with
 * normalized=false on the raw text, then the normalized=true ones (their contents
 * normalized too) on the normalized text. A match honours single_word (no word character
 * touching either side, else skipped), lstrip / rstrip (absorbing the whitespace before /
 * after it). */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_internal.h"

typedef struct tk_trie_node {
    int32_t child, sibling, pat;
    unsigned char byte;
} tk_trie_node;

static int32_t new_node(tk_matcher *m, unsigned char byte)
{
    if (m->n == m->cap) {
        size_t nc = m->cap ? m->cap * 2 : 64;
        tk_trie_node *d = realloc(m->nodes, nc * sizeof *d);
        if (!d)
            return -1;
        m->nodes = d;
        m->cap = nc;
    }
    m->nodes[m->n] = (tk_trie_node){-1, -1, -1, byte};
    return (int32_t)m->n++;
}

static int32_t find_child(const tk_matcher *m, int32_t node, unsigned char b)
{
    for (int32_t c = m->nodes[node].child; c >= 0; c = m->nodes[c].sibling)
        if (m->nodes[c].byte == b)
            return c;
    return -1;
}

/* Adds pattern index pat; an empty pattern never matches. A duplicate keeps the first. */
static int matcher_add(tk_matcher *m, const char *s, size_t len, int32_t pat)
{
    if (m->n == 0 && new_node(m, 0) < 0)
        return -1;
    if (len == 0)
        return 0;
    int32_t node = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char b = (unsigned char)s[i];
        int32_t c = find_child(m, node, b);
        if (c < 0) {
            c = new_node(m, b);
            if (c < 0)
                return -1;
            m->nodes[c].sibling = m->nodes[node].child;
            m->nodes[node].child = c;
        }
        node = c;
    }
    if (m->nodes[node].pat < 0)
        m->nodes[node].pat = pat;
    return 0;
}

/* Leftmost-longest match in s[from..len): returns true with [*ms, *me) and *pat. */
static bool matcher_find(const tk_matcher *m, const char *s, size_t len, size_t from, size_t *ms,
                         size_t *me, int32_t *pat)
{
    if (m->n == 0 || m->nodes[0].child < 0)
        return false;
    for (size_t i = from; i < len; i++) {
        int32_t node = 0, best = -1;
        size_t bend = 0;
        for (size_t k = i; k < len; k++) {
            node = find_child(m, node, (unsigned char)s[k]);
            if (node < 0)
                break;
            if (m->nodes[node].pat >= 0) {
                best = m->nodes[node].pat;
                bend = k + 1;
            }
        }
        if (best >= 0) {
            *ms = i;
            *me = bend;
            *pat = best;
            return true;
        }
    }
    return false;
}

/* The token model.vocab gives content, and the vocab's token at id: the two must be this
 * token, or absent (tokenizers would use the vocab's id and warn). */
static int check_against_vocab(const tk_bpe *model, size_t i, const tk_added_token *t, ft_err *err)
{
    int32_t vid = tk_strmap_get(&model->vocab, t->content, t->len);
    if (vid >= 0 && vid != t->id)
        return ft_fail(err, "added_tokens[%zu]: token '%s' has id %d here but id %d in "
                            "model.vocab",
                       i, t->content, t->id, vid);
    const char *other = (size_t)t->id < model->nid ? model->id_to_tok[t->id] : NULL;
    if (other && strcmp(other, t->content) != 0)
        return ft_fail(err, "added_tokens[%zu]: id %d is given to two tokens, '%s' here and '%s' "
                            "in model.vocab",
                       i, t->id, t->content, other);
    return 0;
}

int tk_added_parse(tk_added *a, const void *json_array, const tk_bpe *model,
                   const tk_normalizer *norm, ft_err *err)
{
    const json_t *arr = json_array;
    memset(a, 0, sizeof *a);
    if (tk_strmap_init(&a->by_content, 64))
        return ft_fail(err, "added_tokens: out of memory");
    if (!arr || json_is_null(arr))
        return 0;
    if (!json_is_array(arr))
        return ft_fail(err, "added_tokens: expected an array");
    size_t n = json_array_size(arr), limit = tk_vocab_limit(model->vocab.n, n);
    a->toks = calloc(n + 1, sizeof *a->toks);
    if (!a->toks)
        return ft_fail(err, "added_tokens: out of memory");
    tk_buf nb = {0};
    tk_work w = {0};
    w.md = pcre2_match_data_create(1, NULL);
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_array_get(arr, i);
        json_t *id = json_object_get(e, "id"), *content = json_object_get(e, "content");
        if (!json_is_integer(id) || json_integer_value(id) < 0 || !json_is_string(content)) {
            rc = ft_fail(err, "added_tokens[%zu]: needs an integer 'id' and a string 'content'", i);
            break;
        }
        if ((uint64_t)json_integer_value(id) >= limit) {
            rc = ft_fail(err, "added_tokens[%zu]: token '%s': id %lld is beyond the vocabulary "
                              "(%zu tokens in model.vocab and %zu added tokens: ids 0..%zu)",
                         i, json_string_value(content), (long long)json_integer_value(id),
                         model->vocab.n, n, limit - 1);
            break;
        }
        tk_added_token *t = &a->toks[a->n++];
        t->content = strdup(json_string_value(content));
        t->len = json_string_length(content);
        t->id = (int32_t)json_integer_value(id);
        if (!t->content) {
            rc = ft_fail(err, "added_tokens: out of memory");
            break;
        }
        int32_t seen = tk_strmap_get(&a->by_content, t->content, t->len);
        if (seen >= 0 && seen != t->id) {
            rc = ft_fail(err, "added_tokens[%zu]: token '%s' is given two ids, %d and %d", i,
                         t->content, seen, t->id);
            break;
        }
        if ((rc = check_against_vocab(model, i, t, err)))
            break;
        t->special = json_is_true(json_object_get(e, "special"));
        t->lstrip = json_is_true(json_object_get(e, "lstrip"));
        t->rstrip = json_is_true(json_object_get(e, "rstrip"));
        t->single_word = json_is_true(json_object_get(e, "single_word"));
        json_t *nz = json_object_get(e, "normalized");
        t->normalized = nz ? json_is_true(nz) : !t->special;
        if (tk_strmap_put(&a->by_content, t->content, t->len, t->id)) {
            rc = ft_fail(err, "added_tokens: out of memory");
            break;
        }
        if ((size_t)t->id + 1 > a->nindex)
            a->nindex = (size_t)t->id + 1;
        if (t->normalized && norm) {
            if (tk_normalize(norm, t->content, t->len, &nb, &w, err)) {
                rc = ft_fail_prefix(err, "added_tokens[%zu]", i);
                break;
            }
            rc = matcher_add(&a->norm, nb.data, nb.n, (int32_t)(a->n - 1));
            if (!rc && !(t->text = malloc(nb.n + 1)))
                rc = -1;
            if (!rc) {
                memcpy(t->text, nb.data, nb.n);
                t->text[nb.n] = '\0';
                t->text_len = nb.n;
            }
        } else {
            rc = matcher_add(t->normalized ? &a->norm : &a->raw, t->content, t->len,
                             (int32_t)(a->n - 1));
        }
        if (rc) {
            rc = ft_fail(err, "added_tokens: out of memory");
            break;
        }
    }
    free(nb.data);
    free(w.tmp.data);
    pcre2_match_data_free(w.md);
    if (rc)
        return -1;
    a->index_of_id = malloc((a->nindex + 1) * sizeof *a->index_of_id);
    if (!a->index_of_id)
        return ft_fail(err, "added_tokens: out of memory");
    for (size_t i = 0; i < a->nindex; i++)
        a->index_of_id[i] = -1;
    /* the same token listed twice is one token (the last entry's flags, as in tokenizers);
     * two different tokens with one id are an error */
    for (size_t i = 0; i < a->n; i++) {
        int32_t *slot = &a->index_of_id[a->toks[i].id];
        if (*slot >= 0 && strcmp(a->toks[*slot].content, a->toks[i].content) != 0)
            return ft_fail(err, "added_tokens[%zu]: id %d is given to two tokens, '%s' and '%s'",
                           i, a->toks[i].id, a->toks[*slot].content, a->toks[i].content);
        *slot = (int32_t)i;
    }
    return 0;
}

void tk_added_free(tk_added *a)
{
    for (size_t i = 0; i < a->n; i++) {
        free(a->toks[i].content);
        free(a->toks[i].text);
    }
    free(a->toks);
    free(a->raw.nodes);
    free(a->norm.nodes);
    free(a->index_of_id);
    tk_strmap_free(&a->by_content);
    memset(a, 0, sizeof *a);
}

/* Whether the text before / after position p ends / starts with a word character. */
static bool ends_with_word(const char *s, size_t p)
{
    if (p == 0)
        return false;
    size_t q = p - 1;
    while (q > 0 && ((unsigned char)s[q] & 0xC0) == 0x80)
        q--;
    uint32_t cp;
    tk_utf8_next(s + q, &cp);
    return tk_is_word_char(cp);
}

static bool starts_with_word(const char *s, size_t p, size_t len)
{
    if (p >= len)
        return false;
    uint32_t cp;
    tk_utf8_next(s + p, &cp);
    return tk_is_word_char(cp);
}

int tk_added_split(const tk_added *a, bool normalized, tk_work *w, ft_err *err)
{
    const tk_matcher *m = normalized ? &a->norm : &a->raw;
    if (m->n == 0 || m->nodes[0].child < 0)
        return 0;
    w->b.n = 0;
    for (size_t i = 0; i < w->a.n; i++) {
        tk_piece pc = w->a.p[i];
        if (pc.id >= 0) {
            if (tk_pieces_push(&w->b, pc.off, pc.len, pc.id, pc.first))
                return ft_fail(err, "tokenizer: out of memory");
            continue;
        }
        const char *s = w->arena.data + pc.off;
        size_t len = pc.len, from = 0, start_offset = 0, ms, me;
        int32_t pat;
        while (matcher_find(m, s, len, from, &ms, &me, &pat)) {
            from = me;
            const tk_added_token *t = &a->toks[pat];
            size_t start = ms, stop = me;
            if (t->single_word && (ends_with_word(s, start) || starts_with_word(s, stop, len)))
                continue;
            if (t->lstrip) {
                size_t ns = start;
                while (ns > 0) {
                    size_t q = ns - 1;
                    while (q > 0 && ((unsigned char)s[q] & 0xC0) == 0x80)
                        q--;
                    uint32_t cp;
                    tk_utf8_next(s + q, &cp);
                    if (!tk_is_whitespace(cp))
                        break;
                    ns = q;
                }
                start = ns > start_offset ? ns : start_offset;
            }
            if (t->rstrip) {
                while (stop < len) {
                    uint32_t cp;
                    int k = tk_utf8_next(s + stop, &cp);
                    if (!tk_is_whitespace(cp))
                        break;
                    stop += (size_t)k;
                }
            }
            if (start_offset < start &&
                tk_pieces_push(&w->b, pc.off + start_offset, start - start_offset, -1,
                               pc.first && start_offset == 0))
                return ft_fail(err, "tokenizer: out of memory");
            if (tk_pieces_push(&w->b, pc.off + start, stop - start, t->id, false))
                return ft_fail(err, "tokenizer: out of memory");
            start_offset = stop;
        }
        if (start_offset < len &&
            tk_pieces_push(&w->b, pc.off + start_offset, len - start_offset, -1,
                           pc.first && start_offset == 0))
            return ft_fail(err, "tokenizer: out of memory");
    }
    tk_pieces t = w->a;
    w->a = w->b;
    w->b = t;
    return 0;
}
