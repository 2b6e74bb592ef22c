/* Datasets: JSONL records -> (ids, labels) samples, following the rules in data.h.
 *
 * The format is set by the options or detected from the keys of the first record:
 * "messages" -> chat, "conversations" -> sharegpt, "input_ids" -> tokens, "instruction" +
 * "output" -> alpaca, "prompt" + "completion" -> prompt_completion, "text" -> text. Every
 * later record is checked against that format. Per-record errors name FILE:LINE; with skip_bad_lines the
 * record is counted in skipped_lines instead.
 *
 * Details the header leaves open:
 *   - EOS (text with add_eos, prompt_completion, alpaca) is appended unless the ids
 *     already end with it (a completion that ends with the EOS text, or a post-processor
 *     that adds it), so a sample never ends with two.
 *   - A counted token is a label != -100 at position >= 1: the loss predicts label t from
 *     position t-1, so a label at position 0 never counts.
 *   - tokens format: ids must be in [0, vocab) when a tokenizer is given (>= 0 without);
 *     labels, when present, are -100 or a valid id. train_on_all counts every token.
 *   - chat (and sharegpt, mapped to messages): ids = encode(render(messages),
 *     add_special=false). When the template has {% generation %} blocks, each block
 *     [start, end) of the rendered text labels the tokens [len(encode(text[:start])),
 *     len(encode(text[:end]))): the tokens return_assistant_tokens_mask marks. Otherwise
 *     the span of assistant turn k is [len(encode(render(messages[:k], generation
 *     prompt))), len(encode(render(messages[:k+1])))): its content and the template's
 *     end-of-turn marker. Each of those prefixes must encode to a prefix of the full ids
 *     (a BPE merge across the boundary would move the span): otherwise the line is an
 *     error. */
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/data.h"
#include "core/grow.h"
#include "core/jsonl.h"

/* ---- names ---------------------------------------------------------------------------- */

static const char *const fmt_names[] = {"auto", "text", "prompt_completion", "alpaca", "chat",
                                        "tokens", "sharegpt"};

int ft_data_format_parse(const char *name, ft_data_format *f, ft_err *err)
{
    for (int i = 0; i < (int)(sizeof fmt_names / sizeof *fmt_names); i++)
        if (strcmp(name, fmt_names[i]) == 0) {
            *f = (ft_data_format)i;
            return 0;
        }
    return ft_fail(err, "unknown data format \"%s\" (known: auto, text, prompt_completion, "
                        "alpaca, chat, sharegpt, tokens)", name);
}

const char *ft_data_format_name(ft_data_format f)
{
    return (unsigned)f < sizeof fmt_names / sizeof *fmt_names ? fmt_names[f] : "?";
}

/* ---- per-file context ------------------------------------------------------------------ */

typedef struct ctx {
    const char *path;
    const ft_tokenizer *tok;
    const ft_data_options *o;
    ft_data_format fmt;
    ft_chat *chat;
    int32_t eos_id;
    int vocab;
    long line;
} ctx;

/* "PATH:LINE: message" */
static int bad(const ctx *c, ft_err *err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int bad(const ctx *c, ft_err *err, const char *fmt, ...)
{
    char msg[900];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return ft_fail(err, "%s:%ld: %s", c->path, c->line, msg);
}

static ft_data_format detect(const json_t *rec)
{
    if (json_object_get(rec, "messages"))
        return FT_DATA_CHAT;
    if (json_object_get(rec, "conversations"))
        return FT_DATA_SHAREGPT;
    if (json_object_get(rec, "input_ids"))
        return FT_DATA_TOKENS;
    if (json_object_get(rec, "instruction") && json_object_get(rec, "output"))
        return FT_DATA_ALPACA;
    if (json_object_get(rec, "prompt") && json_object_get(rec, "completion"))
        return FT_DATA_PROMPT_COMPLETION;
    if (json_object_get(rec, "text"))
        return FT_DATA_TEXT;
    return FT_DATA_AUTO;
}

/* A string field: required unless optional (then *out = NULL when absent or null). */
static int get_str(const ctx *c, const json_t *rec, const char *key, bool optional,
                   bool nonempty, const char **out, ft_err *err)
{
    json_t *v = json_object_get(rec, key);
    *out = NULL;
    if (!v || (optional && json_is_null(v))) {
        if (optional)
            return 0;
        return bad(c, err, "missing \"%s\" (%s format)", key, ft_data_format_name(c->fmt));
    }
    if (!json_is_string(v))
        return bad(c, err, "\"%s\" is not a string (%s format)", key,
                   ft_data_format_name(c->fmt));
    *out = json_string_value(v);
    if (nonempty && json_string_length(v) == 0)
        return bad(c, err, "empty \"%s\"", key);
    return 0;
}

static int encode(const ctx *c, const char *text, bool add_special, ft_ids *ids, ft_err *err)
{
    if (ft_tokenizer_encode(c->tok, text, strlen(text), add_special, ids, err))
        return ft_fail_prefix(err, "%s:%ld", c->path, c->line);
    return 0;
}

static int push_eos(const ctx *c, ft_ids *ids, ft_err *err)
{
    if (ids->n > 0 && ids->data[ids->n - 1] == c->eos_id)
        return 0;
    if (ft_ids_push(ids, c->eos_id))
        return ft_fail(err, "out of memory");
    return 0;
}

static int fill_labels(ft_sample *s, const ft_ids *ids, ft_err *err)
{
    s->n = (int)ids->n;
    s->ids = malloc((ids->n ? ids->n : 1) * sizeof *s->ids);
    s->labels = malloc((ids->n ? ids->n : 1) * sizeof *s->labels);
    if (!s->ids || !s->labels)
        return ft_fail(err, "out of memory");
    memcpy(s->ids, ids->data, ids->n * sizeof *s->ids);
    memcpy(s->labels, ids->data, ids->n * sizeof *s->labels);
    return 0;
}

static int prompt_completion(const ctx *c, const char *prompt, const char *completion,
                             ft_sample *s, ft_err *err)
{
    ft_ids ids = {0}, p = {0};
    int rc = -1;
    size_t lp = strlen(prompt), lc = strlen(completion);
    char *full = malloc(lp + lc + 1);
    if (!full) {
        ft_fail(err, "out of memory");
        goto out;
    }
    memcpy(full, prompt, lp);
    memcpy(full + lp, completion, lc + 1);
    if (encode(c, full, true, &ids, err) || push_eos(c, &ids, err) || fill_labels(s, &ids, err))
        goto out;
    if (!c->o->train_on_all) {
        if (encode(c, prompt, true, &p, err))
            goto out;
        for (size_t i = 0; i < p.n && i < ids.n; i++)
            s->labels[i] = -100;
    }
    rc = 0;
out:
    free(full);
    ft_ids_free(&ids);
    ft_ids_free(&p);
    return rc;
}

/* The template variables a chat record adds besides its messages. */
static json_t *record_extra(const json_t *rec)
{
    json_t *extra = json_object();
    static const char *const KEYS[] = {"tools", "documents"};
    for (int i = 0; i < 2; i++) {
        json_t *v = json_object_get(rec, KEYS[i]);
        if (v)
            json_object_set(extra, KEYS[i], v);
    }
    return extra;
}

/* Encodes text[0..len) and checks that the ids are a prefix of full; *n = their number.
 * what says which boundary it is, for the error. */
static int prefix_ids(const ctx *c, const char *text, size_t len, const ft_ids *full,
                      size_t *n, const char *what, size_t count, ft_err *err)
{
    ft_ids ids = {0};
    int rc = 0;
    if (ft_tokenizer_encode(c->tok, text, len, false, &ids, err))
        rc = ft_fail_prefix(err, "%s:%ld", c->path, c->line);
    if (rc == 0 && (ids.n > full->n ||
                    memcmp(ids.data, full->data, ids.n * sizeof *ids.data) != 0))
        rc = bad(c, err, "the tokens of the chat up to %s %zu are not a prefix of the whole "
                         "chat's tokens (a token spans the boundary), so the assistant span "
                         "is ambiguous", what, count);
    *n = ids.n;
    ft_ids_free(&ids);
    return rc;
}

/* Renders the first count messages (with the generation prompt when agp) and measures
 * their tokens (a prefix of full). */
static int prefix_len(const ctx *c, const json_t *msgs, const json_t *extra, size_t count,
                      bool agp, const ft_ids *full, size_t *n, ft_err *err)
{
    char *text;
    if (ft_chat_render(c->chat, msgs, count, agp, extra, &text, NULL, NULL, err))
        return ft_fail_prefix(err, "%s:%ld", c->path, c->line);
    int rc = prefix_ids(c, text, strlen(text), full, n,
                        agp ? "(with the generation prompt) message" : "message", count, err);
    free(text);
    return rc;
}

static int chat_messages(const ctx *c, const json_t *rec, const json_t *msgs, ft_sample *s,
                         ft_err *err)
{
    size_t n = json_array_size(msgs);
    if (n == 0)
        return bad(c, err, "empty \"messages\"");
    bool has_assistant = false;
    for (size_t i = 0; i < n; i++) {
        json_t *m = json_array_get(msgs, i), *r = json_object_get(m, "role");
        if (!json_is_object(m))
            return bad(c, err, "messages[%zu] is not an object", i);
        if (!json_is_string(r))
            return bad(c, err, "messages[%zu] has %s", i,
                       r ? "a \"role\" that is not a string" : "no \"role\"");
        if (strcmp(json_string_value(r), "assistant") == 0)
            has_assistant = true;
    }
    if (!has_assistant)
        return bad(c, err, "the chat has no assistant message (nothing to train on)");
    json_t *extra = record_extra(rec);
    char *text;
    ft_jinja_span *spans = NULL;
    size_t n_spans = 0;
    bool marked = ft_chat_has_generation(c->chat, extra);
    if (ft_chat_render(c->chat, msgs, n, false, extra, &text, marked ? &spans : NULL,
                       &n_spans, err)) {
        json_decref(extra);
        return ft_fail_prefix(err, "%s:%ld", c->path, c->line);
    }
    ft_ids ids = {0};
    int rc = encode(c, text, false, &ids, err);
    if (rc == 0)
        rc = fill_labels(s, &ids, err);
    if (rc == 0 && !c->o->train_on_all) {
        for (int i = 0; i < s->n; i++)
            s->labels[i] = -100;
        if (marked) {
            /* the template's own assistant spans: the tokens of text[start, end) */
            for (size_t k = 0; k < n_spans && rc == 0; k++) {
                size_t a, b;
                rc = prefix_ids(c, text, spans[k].start, &ids, &a, "generation block", k + 1,
                                err);
                if (rc == 0)
                    rc = prefix_ids(c, text, spans[k].end, &ids, &b, "the end of generation "
                                    "block", k + 1, err);
                for (size_t i = a; rc == 0 && i < b; i++)
                    s->labels[i] = ids.data[i];
            }
        } else {
            for (size_t k = 0; k < n && rc == 0; k++) {
                json_t *r = json_object_get(json_array_get(msgs, k), "role");
                if (strcmp(json_string_value(r), "assistant") != 0)
                    continue;
                size_t a, b;
                rc = prefix_len(c, msgs, extra, k, true, &ids, &a, err);
                if (rc == 0)
                    rc = prefix_len(c, msgs, extra, k + 1, false, &ids, &b, err);
                for (size_t i = a; rc == 0 && i < b; i++)
                    s->labels[i] = ids.data[i];
            }
        }
    }
    free(text);
    free(spans);
    json_decref(extra);
    ft_ids_free(&ids);
    return rc;
}

static int chat(const ctx *c, const json_t *rec, ft_sample *s, ft_err *err)
{
    json_t *msgs = json_object_get(rec, "messages");
    if (!msgs)
        return bad(c, err, "missing \"messages\" (chat format)");
    if (!json_is_array(msgs))
        return bad(c, err, "\"messages\" is not an array (chat format)");
    return chat_messages(c, rec, msgs, s, err);
}

static int sharegpt(const ctx *c, const json_t *rec, ft_sample *s, ft_err *err)
{
    json_t *conv = json_object_get(rec, "conversations"), *msgs;
    if (!conv)
        return bad(c, err, "missing \"conversations\" (sharegpt format)");
    if (ft_sharegpt_messages(conv, &msgs, err))
        return ft_fail_prefix(err, "%s:%ld", c->path, c->line);
    int rc = chat_messages(c, rec, msgs, s, err);
    json_decref(msgs);
    return rc;
}

static int tokens(const ctx *c, const json_t *rec, ft_sample *s, ft_err *err)
{
    json_t *ids = json_object_get(rec, "input_ids"), *labels = json_object_get(rec, "labels");
    if (!ids)
        return bad(c, err, "missing \"input_ids\" (tokens format)");
    if (!json_is_array(ids))
        return bad(c, err, "\"input_ids\" is not an array (tokens format)");
    size_t n = json_array_size(ids);
    if (n == 0)
        return bad(c, err, "empty \"input_ids\"");
    if (labels && !json_is_null(labels)) {
        if (!json_is_array(labels))
            return bad(c, err, "\"labels\" is not an array (tokens format)");
        if (json_array_size(labels) != n)
            return bad(c, err, "\"labels\" has %zu entries, \"input_ids\" %zu",
                       json_array_size(labels), n);
    } else {
        labels = NULL;
    }
    if (n > (size_t)INT32_MAX)
        return bad(c, err, "too many tokens");
    s->n = (int)n;
    s->ids = malloc(n * sizeof *s->ids);
    s->labels = malloc(n * sizeof *s->labels);
    if (!s->ids || !s->labels)
        return ft_fail(err, "out of memory");
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_array_get(ids, i);
        if (!json_is_integer(v))
            return bad(c, err, "input_ids[%zu] is not an integer", i);
        json_int_t x = json_integer_value(v);
        if (x < 0 || (c->vocab > 0 && x >= c->vocab) || x > INT32_MAX)
            return bad(c, err, "input_ids[%zu] = %lld is not a token id%s", i, (long long)x,
                       c->vocab > 0 ? " of the tokenizer" : "");
        s->ids[i] = (int32_t)x;
        s->labels[i] = (int32_t)x;
        if (!labels || c->o->train_on_all)
            continue;
        v = json_array_get(labels, i);
        if (!json_is_integer(v))
            return bad(c, err, "labels[%zu] is not an integer", i);
        x = json_integer_value(v);
        if (x != -100 && (x < 0 || (c->vocab > 0 && x >= c->vocab) || x > INT32_MAX))
            return bad(c, err, "labels[%zu] = %lld is neither -100 nor a token id", i,
                       (long long)x);
        s->labels[i] = (int32_t)x;
    }
    return 0;
}

static int record(const ctx *c, const json_t *rec, ft_sample *s, ft_err *err)
{
    const char *a, *b, *in;
    switch (c->fmt) {
    case FT_DATA_TEXT: {
        if (get_str(c, rec, "text", false, false, &a, err))
            return -1;
        ft_ids ids = {0};
        int rc = encode(c, a, true, &ids, err);
        if (rc == 0 && c->o->add_eos)
            rc = push_eos(c, &ids, err);
        if (rc == 0)
            rc = fill_labels(s, &ids, err);
        ft_ids_free(&ids);
        return rc;
    }
    case FT_DATA_PROMPT_COMPLETION:
        if (get_str(c, rec, "prompt", false, false, &a, err) ||
            get_str(c, rec, "completion", false, true, &b, err))
            return -1;
        return prompt_completion(c, a, b, s, err);
    case FT_DATA_ALPACA: {
        if (get_str(c, rec, "instruction", false, false, &a, err) ||
            get_str(c, rec, "input", true, false, &in, err) ||
            get_str(c, rec, "output", false, true, &b, err))
            return -1;
        char *prompt;
        if (ft_alpaca_prompt(a, in, &prompt, err))
            return -1;
        int rc = prompt_completion(c, prompt, b, s, err);
        free(prompt);
        return rc;
    }
    case FT_DATA_CHAT:
        return chat(c, rec, s, err);
    case FT_DATA_SHAREGPT:
        return sharegpt(c, rec, s, err);
    case FT_DATA_TOKENS:
        return tokens(c, rec, s, err);
    default:
        return ft_fail(err, "internal: format %d", (int)c->fmt);
    }
}

static void sample_free(ft_sample *s)
{
    free(s->ids);
    free(s->labels);
    memset(s, 0, sizeof *s);
}

static bool has_counted(const ft_sample *s)
{
    for (int i = 1; i < s->n; i++)
        if (s->labels[i] != -100)
            return true;
    return false;
}

/* Resolves what the format needs from the tokenizer (once, before the first record). */
static int setup(ctx *c, ft_err *err)
{
    if (c->fmt == FT_DATA_TOKENS) {
        c->vocab = c->tok ? ft_tokenizer_vocab_size(c->tok) : 0;
        return 0;
    }
    if (!c->tok)
        return ft_fail(err, "%s: the %s format needs a tokenizer", c->path,
                       ft_data_format_name(c->fmt));
    c->eos_id = ft_tokenizer_eos_id(c->tok);
    bool needs_eos = c->fmt == FT_DATA_PROMPT_COMPLETION || c->fmt == FT_DATA_ALPACA ||
                     (c->fmt == FT_DATA_TEXT && c->o->add_eos);
    if (needs_eos && c->eos_id < 0)
        return ft_fail(err, "%s: the %s format appends EOS, and the tokenizer has no "
                            "eos_token", c->path, ft_data_format_name(c->fmt));
    if ((c->fmt == FT_DATA_CHAT || c->fmt == FT_DATA_SHAREGPT) &&
        ft_chat_open(&c->chat, c->o->chat_template, c->o->chat_template_name,
                     c->o->chat_template_kwargs, c->tok, err))
        return ft_fail_prefix(err, "%s", c->path);
    return 0;
}

int ft_dataset_load(ft_dataset *ds, const char *path, const ft_tokenizer *tok,
                    const ft_data_options *o, ft_err *err)
{
    memset(ds, 0, sizeof *ds);
    ft_jsonl *r;
    if (ft_jsonl_open(&r, path, err))
        return -1;
    ctx c = {.path = ft_jsonl_path(r), .tok = tok, .o = o, .fmt = o->format};
    bool ready = false;
    size_t cap = 0;
    int rc = 0;
    for (;;) {
        const char *line;
        size_t len;
        ft_sample s = {0};
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
        int bad_rc = 0;
        if (!rec) {
            bad_rc = bad(&c, err, "invalid JSON: %s (column %d)", je.text, je.column);
        } else if (!json_is_object(rec)) {
            bad_rc = bad(&c, err, "the record is not a JSON object");
        } else {
            if (c.fmt == FT_DATA_AUTO) {
                c.fmt = detect(rec);
                if (c.fmt == FT_DATA_AUTO) {
                    char keys[400] = "";
                    const char *k;
                    json_t *v;
                    json_object_foreach(rec, k, v) {
                        (void)v;
                        size_t l = strlen(keys);
                        snprintf(keys + l, sizeof keys - l, "%s\"%s\"", l ? ", " : "", k);
                    }
                    bad_rc = bad(&c, err, "the record fits no data format (keys: %s); "
                                          "expected \"text\", \"prompt\"+\"completion\", "
                                          "\"instruction\"+\"output\", \"messages\" or "
                                          "\"input_ids\"", *keys ? keys : "none");
                }
            }
            if (!bad_rc && !ready) {
                if (setup(&c, err)) {
                    json_decref(rec);
                    rc = -1;
                    break;
                }
                ready = true;
            }
            if (!bad_rc)
                bad_rc = record(&c, rec, &s, err);
        }
        json_decref(rec);
        if (bad_rc) {
            sample_free(&s);
            if (o->skip_bad_lines) {
                ds->skipped_lines++;
                continue;
            }
            rc = -1;
            break;
        }
        if (o->max_seq_len > 0 && s.n > o->max_seq_len)
            s.n = o->max_seq_len;
        s.line = c.line;
        if (!has_counted(&s)) {
            sample_free(&s);
            ds->dropped_empty++;
            continue;
        }
        ft_sample *p = ft_grow(ds->samples, ds->n, &cap, sizeof *p);
        if (!p) {
            sample_free(&s);
            rc = ft_fail(err, "%s: out of memory", c.path);
            break;
        }
        ds->samples = p;
        ds->samples[ds->n++] = s;
    }
    ft_jsonl_close(r);
    ft_chat_free(c.chat);
    if (rc)
        ft_dataset_free(ds);
    return rc;
}

void ft_dataset_free(ft_dataset *ds)
{
    if (!ds)
        return;
    for (size_t i = 0; i < ds->n; i++)
        sample_free(&ds->samples[i]);
    free(ds->samples);
    memset(ds, 0, sizeof *ds);
}

int ft_dataset_split(ft_dataset *ds, ft_dataset *eval, double fraction, uint64_t seed,
                     ft_err *err)
{
    memset(eval, 0, sizeof *eval);
    if (!(fraction >= 0.0 && fraction < 1.0))
        return ft_fail(err, "eval fraction %g is not in [0, 1)", fraction);
    if (fraction == 0.0 || ds->n < 2)
        return 0;
    size_t n = ds->n, k = (size_t)llround(fraction * (double)n);
    if (k < 1)
        k = 1;
    if (k > n - 1)
        k = n - 1;
    size_t *idx = malloc(n * sizeof *idx);
    bool *pick = calloc(n, sizeof *pick);
    ft_sample *ev = malloc(k * sizeof *ev);
    if (!idx || !pick || !ev) {
        free(idx);
        free(pick);
        free(ev);
        return ft_fail(err, "out of memory");
    }
    for (size_t i = 0; i < n; i++)
        idx[i] = i;
    ft_shuffle_indices(idx, n, seed, 0x5e11ULL);
    for (size_t i = 0; i < k; i++)
        pick[idx[i]] = true;
    /* Both parts keep file order. */
    size_t ne = 0, nt = 0;
    for (size_t i = 0; i < n; i++) {
        if (pick[i])
            ev[ne++] = ds->samples[i];
        else
            ds->samples[nt++] = ds->samples[i];
    }
    ds->n = nt;
    eval->samples = ev;
    eval->n = ne;
    free(idx);
    free(pick);
    return 0;
}
