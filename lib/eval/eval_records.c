/* Prompt / reference pairs for generation (see eval_records.h).
 *
 * ft_dataset_load has already validated every record it kept, so a record that reaches
 * the prompt builders here is well formed; the checks below still name FILE:LINE rather
 * than trust it, since the two readers could diverge. */
#include "eval/eval_records.h"

#include <errno.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/grow.h"
#include "core/jsonl.h"

typedef struct ctx {
    const char *path;
    long line;
    const ft_tokenizer *tok;
    ft_data_format fmt;
    ft_chat *chat;
} ctx;

static ft_data_format detect(const json_t *rec)
{
    /* The same order as data.c's detection. */
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

static const char *str_field(const json_t *rec, const char *key)
{
    json_t *v = json_object_get(rec, key);
    return json_is_string(v) ? json_string_value(v) : NULL;
}

static char *str_dup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d)
        memcpy(d, s, n);
    return d;
}

/* Sets r->prompt and r->reference (malloc'ed); *add_special says how to encode. */
static int prompt_of(const ctx *c, const json_t *rec, ft_eval_record *r, bool *add_special,
                     ft_err *err)
{
    *add_special = true;
    switch (c->fmt) {
    case FT_DATA_PROMPT_COMPLETION: {
        const char *p = str_field(rec, "prompt"), *ref = str_field(rec, "completion");
        if (!p || !ref)
            return ft_fail(err, "%s:%ld: \"prompt\" and \"completion\" must be strings",
                           c->path, c->line);
        r->prompt = str_dup(p);
        r->reference = str_dup(ref);
        break;
    }
    case FT_DATA_ALPACA: {
        const char *ins = str_field(rec, "instruction"), *out = str_field(rec, "output");
        if (!ins || !out)
            return ft_fail(err, "%s:%ld: \"instruction\" and \"output\" must be strings",
                           c->path, c->line);
        if (ft_alpaca_prompt(ins, str_field(rec, "input"), &r->prompt, err))
            return ft_fail_prefix(err, "%s:%ld", c->path, c->line);
        r->reference = str_dup(out);
        break;
    }
    case FT_DATA_CHAT:
    case FT_DATA_SHAREGPT: {
        *add_special = false;
        json_t *msgs = json_object_get(rec, "messages"), *owned = NULL;
        if (c->fmt == FT_DATA_SHAREGPT &&
            ft_sharegpt_messages(json_object_get(rec, "conversations"), &owned, err))
            return ft_fail_prefix(err, "%s:%ld", c->path, c->line);
        if (owned)
            msgs = owned;
        size_t k = json_is_array(msgs) ? json_array_size(msgs) : 0;
        while (k > 0) {
            const char *role = str_field(json_array_get(msgs, k - 1), "role");
            if (role && strcmp(role, "assistant") == 0)
                break;
            k--;
        }
        const char *ref = k ? str_field(json_array_get(msgs, k - 1), "content") : NULL;
        int rc = 0;
        if (k == 0)
            rc = ft_fail(err, "%s:%ld: the chat has no assistant message to use as the "
                              "reference", c->path, c->line);
        else if (!ref)
            rc = ft_fail(err, "%s:%ld: the last assistant message has no string "
                              "\"content\"", c->path, c->line);
        json_t *extra = json_object(); /* the record's tools and documents, as in training */
        if (json_object_get(rec, "tools"))
            json_object_set(extra, "tools", json_object_get(rec, "tools"));
        if (json_object_get(rec, "documents"))
            json_object_set(extra, "documents", json_object_get(rec, "documents"));
        if (rc == 0 &&
            ft_chat_render(c->chat, msgs, k - 1, true, extra, &r->prompt, NULL, NULL, err))
            rc = ft_fail_prefix(err, "%s:%ld", c->path, c->line);
        json_decref(extra);
        if (rc == 0)
            r->reference = str_dup(ref);
        json_decref(owned);
        if (rc)
            return rc;
        break;
    }
    default:
        return ft_fail(err, "%s: generation needs records with a prompt and a reference "
                            "(prompt_completion, alpaca or chat), not the %s format",
                       c->path, ft_data_format_name(c->fmt));
    }
    if (!r->prompt || !r->reference)
        return ft_fail(err, "out of memory");
    return 0;
}

static void record_free(ft_eval_record *r)
{
    free(r->prompt);
    free(r->reference);
    free(r->ids);
    memset(r, 0, sizeof *r);
}

/* Whether line is one of keep's sample lines (keep's samples are in file order). */
static bool kept(const ft_dataset *keep, size_t *cursor, long line)
{
    while (*cursor < keep->n && keep->samples[*cursor].line < line)
        (*cursor)++;
    return *cursor < keep->n && keep->samples[*cursor].line == line;
}

int ft_eval_records_load(ft_eval_records *out, const char *path, const ft_tokenizer *tok,
                         const ft_data_options *o, const ft_dataset *keep, ft_err *err)
{
    memset(out, 0, sizeof *out);
    if (!tok)
        return ft_fail(err, "%s: generation needs a tokenizer", path);
    ft_jsonl *rd;
    if (ft_jsonl_open(&rd, path, err))
        return -1;
    ctx c = {.path = ft_jsonl_path(rd), .tok = tok, .fmt = o->format};
    bool ready = false;
    size_t cap = 0, cursor = 0;
    int rc = 0;
    for (;;) {
        const char *line;
        size_t len;
        int got = ft_jsonl_next(rd, &line, &len, &c.line, err);
        if (got == 0)
            break;
        if (got < 0) {
            if (ft_jsonl_bad_line(rd) && o->skip_bad_lines)
                continue;
            rc = -1;
            break;
        }
        if (keep && !kept(keep, &cursor, c.line))
            continue;
        json_error_t je;
        json_t *rec = json_loadb(line, len, 0, &je);
        if (!rec || !json_is_object(rec)) {
            json_decref(rec);
            if (o->skip_bad_lines)
                continue;
            rc = ft_fail(err, "%s:%ld: invalid JSON record", c.path, c.line);
            break;
        }
        if (!ready) {
            if (c.fmt == FT_DATA_AUTO)
                c.fmt = detect(rec);
            if ((c.fmt == FT_DATA_CHAT || c.fmt == FT_DATA_SHAREGPT) &&
                ft_chat_open(&c.chat, o->chat_template, o->chat_template_name,
                             o->chat_template_kwargs, tok, err)) {
                json_decref(rec);
                rc = ft_fail_prefix(err, "%s", c.path);
                break;
            }
            ready = true;
        }
        ft_eval_record r = {.line = c.line};
        bool add_special;
        ft_ids ids = {0};
        rc = prompt_of(&c, rec, &r, &add_special, err);
        json_decref(rec);
        if (rc == 0 && ft_tokenizer_encode(tok, r.prompt, strlen(r.prompt), add_special, &ids,
                                           err))
            rc = ft_fail_prefix(err, "%s:%ld", c.path, c.line);
        if (rc == 0 && ids.n == 0)
            rc = ft_fail(err, "%s:%ld: the prompt has no tokens: nothing to generate from",
                         c.path, c.line);
        if (rc == 0) {
            ft_eval_record *p = ft_grow(out->r, out->n, &cap, sizeof *p);
            if (!p)
                rc = ft_fail(err, "out of memory");
            else
                out->r = p;
        }
        if (rc) {
            ft_ids_free(&ids);
            record_free(&r);
            break;
        }
        r.ids = ids.data;
        r.n_ids = (int)ids.n;
        out->r[out->n++] = r;
    }
    ft_jsonl_close(rd);
    ft_chat_free(c.chat);
    if (rc)
        ft_eval_records_free(out);
    return rc;
}

void ft_eval_records_free(ft_eval_records *rs)
{
    if (!rs)
        return;
    for (size_t i = 0; i < rs->n; i++)
        record_free(&rs->r[i]);
    free(rs->r);
    memset(rs, 0, sizeof *rs);
}

int ft_eval_spool(const char *src, char **path, ft_err *err)
{
    *path = NULL;
    bool is_stdin = strcmp(src, "-") == 0;
    const char *name = is_stdin ? "<stdin>" : src;
    FILE *in = is_stdin ? stdin : fopen(src, "rb");
    if (!in)
        return ft_fail(err, "%s: cannot open: %s", name, strerror(errno));
    const char *dir = getenv("TMPDIR");
    if (!dir || !*dir)
        dir = "/tmp";
    size_t n = strlen(dir) + 32;
    char *p = malloc(n);
    int fd = -1;
    if (p) {
        snprintf(p, n, "%s/ft-eval-%s-XXXXXX", dir, is_stdin ? "stdin" : "pipe");
        fd = mkstemp(p);
    }
    FILE *f = fd >= 0 ? fdopen(fd, "wb") : NULL;
    if (!f) {
        ft_fail(err, "%s: cannot create a temporary copy in %s", name, dir);
        if (fd >= 0) {
            close(fd);
            unlink(p);
        }
        free(p);
        if (!is_stdin)
            fclose(in);
        return -1;
    }
    char buf[1 << 16];
    size_t got;
    bool ok = true;
    while ((got = fread(buf, 1, sizeof buf, in)) > 0)
        ok &= fwrite(buf, 1, got, f) == got;
    ok &= !ferror(in);
    ok &= fclose(f) == 0;
    if (!is_stdin)
        fclose(in);
    if (!ok) {
        unlink(p);
        free(p);
        return ft_fail(err, "%s: copying it into a temporary file failed", name);
    }
    *path = p;
    return 0;
}

void ft_err_replace(ft_err *err, const char *from, const char *to)
{
    if (!err || !*from)
        return;
    char out[sizeof err->msg];
    size_t o = 0, lf = strlen(from), lt = strlen(to);
    for (const char *s = err->msg; *s && o + 1 < sizeof out;) {
        if (strncmp(s, from, lf) == 0 && o + lt + 1 < sizeof out) {
            memcpy(out + o, to, lt);
            o += lt;
            s += lf;
        } else {
            out[o++] = *s++;
        }
    }
    out[o] = '\0';
    memcpy(err->msg, out, o + 1);
}
