/* Preference pairs from JSONL, and their batches (pref_data.h). */
#include "data/pref_data.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "core/grow.h"
#include "core/jsonl.h"
#include "core/rng.h"

typedef struct pctx {
    const char *path;
    const ft_tokenizer *tok;
    const ft_data_options *o;
    ft_chat *chat; /* opened on the first conversational record */
    long line;
    ft_pref_style style;
} pctx;

static int bad(const pctx *c, ft_err *err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int bad(const pctx *c, ft_err *err, const char *fmt, ...)
{
    char msg[900];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return ft_fail(err, "%s:%ld: %s", c->path, c->line, msg);
}

static int encode(const pctx *c, const char *text, bool add_special, ft_ids *ids, ft_err *err)
{
    ids->n = 0;
    if (ft_tokenizer_encode(c->tok, text, strlen(text), add_special, ids, err))
        return ft_fail_prefix(err, "%s:%ld", c->path, c->line);
    return 0;
}

/* text + EOS's text unless it ends with it (TRL's add_eos); malloc'ed. */
static char *with_eos(const char *a, const char *b, const char *eos)
{
    size_t la = strlen(a), lb = strlen(b), le = strlen(eos);
    char *s = malloc(la + lb + le + 1);
    if (!s)
        return NULL;
    memcpy(s, a, la);
    memcpy(s + la, b, lb);
    s[la + lb] = '\0';
    if (!(lb >= le && memcmp(b + lb - le, eos, le) == 0) &&
        !(lb < le && la + lb >= le && memcmp(s + la + lb - le, eos, le) == 0))
        memcpy(s + la + lb, eos, le + 1);
    return s;
}

/* Renders messages (a JSON array) with or without the generation prompt and encodes the
 * text without special tokens. */
static int render(const pctx *c, const json_t *msgs, bool agp, const json_t *extra, ft_ids *ids,
                  ft_err *err)
{
    char *text;
    if (ft_chat_render(c->chat, msgs, json_array_size(msgs), agp, extra, &text, NULL, NULL,
                       err))
        return ft_fail_prefix(err, "%s:%ld", c->path, c->line);
    int rc = encode(c, text, false, ids, err);
    free(text);
    return rc;
}

static bool is_messages(const json_t *v)
{
    return json_is_array(v) && json_array_size(v) > 0 &&
           json_is_object(json_array_get(v, 0)) &&
           json_object_get(json_array_get(v, 0), "role");
}

static size_t common_prefix(const ft_ids *a, const ft_ids *b)
{
    size_t n = 0;
    while (n < a->n && n < b->n && a->data[n] == b->data[n])
        n++;
    return n;
}

/* A sequence's sample: ids, labels -100 on the first plen tokens, truncated to max. */
static int to_sample(const ft_ids *ids, size_t plen, int max, long line, ft_sample *s, ft_err *err)
{
    size_t n = ids->n;
    if (max > 0 && n > (size_t)max)
        n = (size_t)max;
    s->n = (int)n;
    s->line = line;
    s->ids = malloc((n ? n : 1) * sizeof *s->ids);
    s->labels = malloc((n ? n : 1) * sizeof *s->labels);
    if (!s->ids || !s->labels)
        return ft_fail(err, "out of memory");
    for (size_t i = 0; i < n; i++) {
        s->ids[i] = ids->data[i];
        s->labels[i] = i < plen ? -100 : ids->data[i];
    }
    return 0;
}

static void sample_free(ft_sample *s)
{
    free(s->ids);
    free(s->labels);
    memset(s, 0, sizeof *s);
}

static void pair_free(ft_pref_pair *p)
{
    sample_free(&p->chosen);
    sample_free(&p->rejected);
}

/* ORPO (TRL's experimental ORPOTrainer.build_tokenized_answer): the tokens of prompt +
 * answer, and where the answer starts: after enc(prompt), one token earlier when the
 * last prompt token merged with the answer's first. */
static int orpo_answer(const pctx *c, const char *prompt, const char *answer, ft_ids *full,
                       size_t *start, ft_err *err)
{
    ft_ids pids = {0};
    size_t lp = strlen(prompt), la = strlen(answer);
    char *t = malloc(lp + la + 1);
    if (!t)
        return ft_fail(err, "out of memory");
    memcpy(t, prompt, lp);
    memcpy(t + lp, answer, la + 1);
    int rc = encode(c, t, false, full, err) || encode(c, prompt, false, &pids, err);
    free(t);
    if (rc == 0) {
        *start = pids.n;
        if (pids.n > full->n || memcmp(pids.data, full->data, pids.n * sizeof *pids.data))
            *start = pids.n ? pids.n - 1 : 0;
        if (*start > full->n)
            *start = full->n;
    }
    ft_ids_free(&pids);
    return rc;
}

/* The chosen (or rejected) sequence ORPO's way: BOS before the prompt unless it starts
 * with it, EOS after the answer unless it ends with it, the answer cut to max_seq_len
 * less the prompt. *empty when no answer token is left. */
static int orpo_sample(const pctx *c, const ft_ids *full, size_t start, ft_sample *s,
                       bool *empty, ft_err *err)
{
    ft_ids seq = {0};
    int32_t bos = ft_tokenizer_bos_id(c->tok), eos = ft_tokenizer_eos_id(c->tok);
    int rc = 0;
    if (bos >= 0 && (start == 0 || full->data[0] != bos))
        rc = ft_ids_push(&seq, bos);
    for (size_t i = 0; rc == 0 && i < full->n; i++)
        rc = ft_ids_push(&seq, full->data[i]);
    size_t plen = start + (seq.n - full->n); /* with the BOS */
    if (rc == 0 && (seq.n == plen || seq.data[seq.n - 1] != eos))
        rc = ft_ids_push(&seq, eos);
    if (rc) {
        ft_ids_free(&seq);
        return ft_fail(err, "out of memory");
    }
    int max = c->o->max_seq_len;
    if (max > 0 && seq.n > (size_t)max) /* the answer only: the prompt stays whole */
        seq.n = plen > (size_t)max ? plen : (size_t)max;
    *empty = seq.n <= plen;
    rc = to_sample(&seq, plen, 0, c->line, s, err);
    ft_ids_free(&seq);
    return rc;
}

/* ORPO's record (TRL's ORPOTrainer: maybe_apply_chat_template, then tokenize_row). */
static int record_orpo(pctx *c, const json_t *rec, const json_t *const v[3], bool conv,
                       ft_pref_pair *p, bool *drop, ft_err *err)
{
    char *text[3] = {NULL, NULL, NULL};
    const char *str[3];
    int rc = 0;
    if (conv) {
        /* prompt = the common prefix of the prompt's rendering (with the generation
         * prompt) and of prompt + chosen and prompt + rejected; the answers the rest */
        const char *last = json_string_value(
            json_object_get(json_array_get(v[0], json_array_size(v[0]) - 1), "role"));
        if (!last || (strcmp(last, "user") != 0 && strcmp(last, "tool") != 0))
            return bad(c, err, "the prompt's last message is from \"%s\": ORPO takes a prompt "
                               "that ends with a user or tool message", last ? last : "?");
        if (!c->chat && ft_chat_open(&c->chat, c->o->chat_template, c->o->chat_template_name,
                                     c->o->chat_template_kwargs, c->tok, err)) {
            ft_fail_prefix(err, "%s", c->path);
            return -2;
        }
        json_t *extra = json_object(), *tools = json_object_get(rec, "tools");
        if (tools)
            json_object_set(extra, "tools", tools);
        for (int i = 0; i < 3 && rc == 0; i++) {
            json_t *msgs = json_copy((json_t *)v[0]);
            if (i)
                json_array_extend(msgs, (json_t *)v[i]);
            if (ft_chat_render(c->chat, msgs, json_array_size(msgs), i == 0, extra, &text[i],
                               NULL, NULL, err))
                rc = ft_fail_prefix(err, "%s:%ld", c->path, c->line);
            json_decref(msgs);
        }
        json_decref(extra);
        if (rc == 0) {
            size_t n = 0;
            while (text[0][n] && text[0][n] == text[1][n] && text[0][n] == text[2][n])
                n++;
            text[0][n] = '\0';
            str[0] = text[0];
            str[1] = text[1] + n;
            str[2] = text[2] + n;
        }
    } else {
        for (int i = 0; i < 3; i++)
            str[i] = json_string_value(v[i]);
    }
    ft_ids fc = {0}, fr = {0};
    size_t sc = 0, sr = 0;
    if (rc == 0 && c->tok && ft_tokenizer_eos_id(c->tok) < 0)
        rc = ft_fail(err, "%s: ORPO appends EOS to each answer, and the tokenizer has no "
                          "eos_token", c->path);
    if (rc == 0)
        rc = orpo_answer(c, str[0], str[1], &fc, &sc, err) ||
             orpo_answer(c, str[0], str[2], &fr, &sr, err);
    if (rc == 0) {
        /* TRL: the two prompts may differ in their last token only */
        size_t diff = 0, n = sc < sr ? sc : sr;
        for (size_t i = 0; i < n; i++)
            diff += fc.data[i] != fr.data[i];
        if (diff > 1 || (sc > sr ? sc - sr : sr - sc) > 1)
            rc = bad(c, err, "the prompt's tokens before \"chosen\" and before \"rejected\" "
                             "differ in more than their last token");
    }
    bool ec = false, er = false;
    if (rc == 0 && (orpo_sample(c, &fc, sc, &p->chosen, &ec, err) ||
                    orpo_sample(c, &fr, sr, &p->rejected, &er, err)))
        rc = -1;
    *drop = ec || er; /* TRL would average over no token: NaN */
    p->line = c->line;
    ft_ids_free(&fc);
    ft_ids_free(&fr);
    for (int i = 0; i < 3; i++)
        free(text[i]);
    return rc;
}

/* One record into p; *drop when the prompt fills max_seq_len. */
static int record(pctx *c, const json_t *rec, ft_pref_pair *p, bool *drop, ft_err *err)
{
    static const char *const KEYS[] = {"prompt", "chosen", "rejected"};
    const json_t *v[3];
    for (int i = 0; i < 3; i++) {
        v[i] = json_object_get(rec, KEYS[i]);
        if (!v[i])
            return bad(c, err, "missing \"%s\" (preference data is {\"prompt\", \"chosen\", "
                               "\"rejected\"}%s)", KEYS[i],
                       i == 0 ? "; a record without \"prompt\" is not supported" : "");
    }
    bool conv = is_messages(v[0]);
    for (int i = 0; i < 3; i++) {
        if (conv ? !is_messages(v[i]) : !json_is_string(v[i]))
            return bad(c, err, "\"%s\" is not %s, as \"prompt\" is", KEYS[i],
                       conv ? "a non-empty list of messages" : "a string");
        if (!conv && i > 0 && json_string_length(v[i]) == 0)
            return bad(c, err, "empty \"%s\"", KEYS[i]);
    }
    if (c->style == FT_PREF_DATA_ORPO)
        return record_orpo(c, rec, v, conv, p, drop, err);
    ft_ids pids = {0}, cids = {0}, rids = {0};
    int rc = 0;
    if (conv) {
        if (!c->chat && ft_chat_open(&c->chat, c->o->chat_template, c->o->chat_template_name,
                                     c->o->chat_template_kwargs, c->tok, err)) {
            ft_fail_prefix(err, "%s", c->path);
            return -2; /* the config's template, not the line: never skipped */
        }
        json_t *extra = json_object(), *tools = json_object_get(rec, "tools");
        if (tools)
            json_object_set(extra, "tools", tools);
        json_t *pc = json_copy((json_t *)v[0]), *pr = json_copy((json_t *)v[0]);
        json_array_extend(pc, (json_t *)v[1]);
        json_array_extend(pr, (json_t *)v[2]);
        rc = render(c, v[0], true, extra, &pids, err) || render(c, pc, false, extra, &cids, err) ||
             render(c, pr, false, extra, &rids, err);
        json_decref(pc);
        json_decref(pr);
        json_decref(extra);
    } else {
        const char *eos = ft_tokenizer_eos_token(c->tok);
        if (!eos) {
            rc = ft_fail(err, "%s: string preference data appends EOS to each completion, and "
                              "the tokenizer has no eos_token", c->path);
        } else {
            const char *prompt = json_string_value(v[0]);
            char *ch = with_eos(prompt, json_string_value(v[1]), eos);
            char *rj = with_eos(prompt, json_string_value(v[2]), eos);
            rc = !ch || !rj ? ft_fail(err, "out of memory")
                            : encode(c, prompt, true, &pids, err) ||
                                      encode(c, ch, true, &cids, err) ||
                                      encode(c, rj, true, &rids, err);
            free(ch);
            free(rj);
        }
    }
    if (rc == 0) {
        size_t a = common_prefix(&pids, &cids), b = common_prefix(&pids, &rids);
        size_t plen = a < b ? a : b;
        int max = c->o->max_seq_len;
        *drop = max > 0 && plen >= (size_t)max;
        if (!*drop && (to_sample(&cids, plen, max, c->line, &p->chosen, err) ||
                       to_sample(&rids, plen, max, c->line, &p->rejected, err)))
            rc = -1;
        p->line = c->line;
    }
    ft_ids_free(&pids);
    ft_ids_free(&cids);
    ft_ids_free(&rids);
    return rc;
}

int ft_pref_dataset_load(ft_pref_dataset *ds, const char *path, const ft_tokenizer *tok,
                         const ft_data_options *o, ft_err *err)
{
    return ft_pref_dataset_load_style(ds, path, tok, o, FT_PREF_DATA_DPO, err);
}

int ft_pref_dataset_load_style(ft_pref_dataset *ds, const char *path, const ft_tokenizer *tok,
                               const ft_data_options *o, ft_pref_style style, ft_err *err)
{
    memset(ds, 0, sizeof *ds);
    if (o->format != FT_DATA_AUTO)
        return ft_fail(err, "preference data: data.format = %s: preference records have their "
                            "own format (prompt/chosen/rejected); leave data.format auto",
                       ft_data_format_name(o->format));
    if (o->train_on_all)
        return ft_fail(err, "preference data: data.train_on_all does not apply (the prompt's "
                            "tokens never count in DPO)");
    if (!tok)
        return ft_fail(err, "preference data needs a tokenizer");
    ft_jsonl *r;
    if (ft_jsonl_open(&r, path, err))
        return -1;
    pctx c = {.path = ft_jsonl_path(r), .tok = tok, .o = o, .style = style};
    size_t cap = 0;
    int rc = 0;
    for (;;) {
        const char *line;
        size_t len;
        int got = ft_jsonl_next(r, &line, &len, &c.line, err);
        if (got == 0)
            break;
        if (got < 0) {
            if (ft_jsonl_bad_line(r) && o->skip_bad_lines) {
                ds->skipped_lines++;
                continue;
            }
            rc = -1;
            break;
        }
        json_error_t je;
        json_t *rec = json_loadb(line, len, 0, &je);
        ft_pref_pair p = {0};
        bool drop = false;
        int brc = 0;
        if (!rec)
            brc = bad(&c, err, "invalid JSON: %s (column %d)", je.text, je.column);
        else if (!json_is_object(rec))
            brc = bad(&c, err, "the record is not a JSON object");
        else
            brc = record(&c, rec, &p, &drop, err);
        json_decref(rec);
        if (brc) {
            pair_free(&p);
            if (o->skip_bad_lines && brc != -2) {
                ds->skipped_lines++;
                continue;
            }
            rc = -1;
            break;
        }
        if (drop) {
            pair_free(&p);
            ds->dropped++;
            continue;
        }
        ft_pref_pair *q = ft_grow(ds->pairs, ds->n, &cap, sizeof *q);
        if (!q) {
            pair_free(&p);
            rc = ft_fail(err, "%s: out of memory", c.path);
            break;
        }
        ds->pairs = q;
        ds->pairs[ds->n++] = p;
    }
    ft_jsonl_close(r);
    ft_chat_free(c.chat);
    if (rc)
        ft_pref_dataset_free(ds);
    return rc;
}

void ft_pref_dataset_free(ft_pref_dataset *ds)
{
    for (size_t i = 0; i < ds->n; i++)
        pair_free(&ds->pairs[i]);
    free(ds->pairs);
    memset(ds, 0, sizeof *ds);
}

int ft_pref_dataset_split(ft_pref_dataset *ds, ft_pref_dataset *eval, double fraction,
                          uint64_t seed, ft_err *err)
{
    memset(eval, 0, sizeof *eval);
    if (!(fraction >= 0.0 && fraction < 1.0))
        return ft_fail(err, "eval fraction %g is not in [0, 1)", fraction);
    if (fraction == 0.0 || ds->n < 2)
        return 0;
    size_t n = ds->n, k = (size_t)llround(fraction * (double)n);
    k = k < 1 ? 1 : k > n - 1 ? n - 1 : k;
    size_t *idx = malloc(n * sizeof *idx);
    bool *pick = calloc(n, sizeof *pick);
    ft_pref_pair *ev = malloc(k * sizeof *ev);
    if (!idx || !pick || !ev) {
        free(idx);
        free(pick);
        free(ev);
        return ft_fail(err, "out of memory");
    }
    for (size_t i = 0; i < n; i++)
        idx[i] = i;
    ft_shuffle_indices(idx, n, seed, 0x5e11ULL); /* the SFT split's draw */
    for (size_t i = 0; i < k; i++)
        pick[idx[i]] = true;
    size_t ne = 0, nt = 0;
    for (size_t i = 0; i < n; i++) {
        if (pick[i])
            ev[ne++] = ds->pairs[i];
        else
            ds->pairs[nt++] = ds->pairs[i];
    }
    ds->n = nt;
    eval->pairs = ev;
    eval->n = ne;
    free(idx);
    free(pick);
    return 0;
}

/* ---- batches of pairs ---- */

struct ft_pref_loader {
    const ft_pref_dataset *ds;
    ft_loader_options o;
    int epoch; /* of the order; -1 before the first */
    size_t n_per;
    size_t *order;
    const ft_pref_pair **batch; /* [batch_size]: the pairs of the current batch */
    int32_t *ids, *labels;      /* [2 batch_size, max_len] */
};

int ft_pref_loader_new(ft_pref_loader **out, const ft_pref_dataset *ds,
                       const ft_loader_options *o, ft_err *err)
{
    *out = NULL;
    if (o->batch_size < 1)
        return ft_fail(err, "loader: batch_size %d < 1", o->batch_size);
    if (o->world < 1 || o->rank < 0 || o->rank >= o->world)
        return ft_fail(err, "loader: rank %d of world %d", o->rank, o->world);
    if (o->packing)
        return ft_fail(err, "config: data.packing does not work with preference data (each "
                            "sequence is its own row, as TRL's DPOTrainer has them)");
    if (ds->n == 0)
        return ft_fail(err, "no preference pairs (the file is empty, or every line was skipped "
                            "or dropped: see the data line above)");
    if (ds->n < (size_t)o->world)
        return ft_fail(err, "%zu preference pairs for %d ranks: every rank needs one", ds->n,
                       o->world);
    size_t max_len = 1;
    for (size_t i = 0; i < ds->n; i++) {
        size_t a = (size_t)ds->pairs[i].chosen.n, b = (size_t)ds->pairs[i].rejected.n;
        max_len = a > max_len ? a : max_len;
        max_len = b > max_len ? b : max_len;
    }
    ft_pref_loader *l = calloc(1, sizeof *l);
    if (!l)
        return ft_fail(err, "out of memory");
    l->ds = ds;
    l->o = *o;
    l->epoch = -1;
    l->n_per = ds->n / (size_t)o->world;
    size_t cells = 2 * (size_t)o->batch_size * max_len;
    l->order = malloc(ds->n * sizeof *l->order);
    l->ids = malloc(cells * sizeof *l->ids);
    l->labels = malloc(cells * sizeof *l->labels);
    l->batch = malloc((size_t)o->batch_size * sizeof *l->batch);
    if (!l->order || !l->ids || !l->labels || !l->batch) {
        ft_pref_loader_free(l);
        return ft_fail(err, "out of memory");
    }
    *out = l;
    return 0;
}

void ft_pref_loader_free(ft_pref_loader *l)
{
    if (!l)
        return;
    free(l->order);
    free(l->batch);
    free(l->ids);
    free(l->labels);
    free(l);
}

int ft_pref_loader_n_batches(ft_pref_loader *l, int epoch)
{
    (void)epoch;
    return (int)((l->n_per + (size_t)l->o.batch_size - 1) / (size_t)l->o.batch_size);
}

static void plan(ft_pref_loader *l, int epoch)
{
    if (l->epoch == epoch)
        return;
    for (size_t i = 0; i < l->ds->n; i++)
        l->order[i] = i;
    if (l->o.shuffle)
        ft_shuffle_indices(l->order, l->ds->n, l->o.seed, (uint64_t)epoch);
    l->epoch = epoch;
}

int ft_pref_loader_batch(ft_pref_loader *l, int epoch, int index, ft_batch *b, ft_err *err)
{
    int nb = ft_pref_loader_n_batches(l, epoch);
    if (index < 0 || index >= nb)
        return ft_fail(err, "loader: batch %d of epoch %d (it has %d)", index, epoch, nb);
    plan(l, epoch);
    size_t k0 = (size_t)index * (size_t)l->o.batch_size;
    size_t P = l->n_per - k0 < (size_t)l->o.batch_size ? l->n_per - k0 : (size_t)l->o.batch_size;
    const ft_pref_pair **pp = l->batch;
    int T = 1;
    for (size_t i = 0; i < P; i++) {
        pp[i] = &l->ds->pairs[l->order[(size_t)l->o.rank + (k0 + i) * (size_t)l->o.world]];
        T = pp[i]->chosen.n > T ? pp[i]->chosen.n : T;
        T = pp[i]->rejected.n > T ? pp[i]->rejected.n : T;
    }
    for (size_t r = 0; r < 2 * P; r++) {
        const ft_sample *s = r < P ? &pp[r]->chosen : &pp[r - P]->rejected;
        for (int t = 0; t < T; t++) {
            size_t i = r * (size_t)T + (size_t)t;
            l->ids[i] = t < s->n ? s->ids[t] : l->o.pad_id;
            l->labels[i] = t < s->n ? s->labels[t] : -100;
        }
    }
    *b = (ft_batch){(int)(2 * P), T, l->ids, l->labels, NULL, NULL};
    return 0;
}
