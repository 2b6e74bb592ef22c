/* Chat templates: the text transformers' apply_chat_template(messages, tokenize=False,
 * add_generation_prompt=...) renders with each family's own Jinja template, written out
 * in C for the messages we accept ({"role": "system"|"user"|"assistant", "content":
 * string}; no tools). The fixtures tests/conformance/templates/ (*.jinja) hold the real
 * templates, and tests/conformance/test_chat_templates.py compares us with transformers.
 *
 * What each template renders (bos/eos are the tokenizer's token strings):
 *   chatml (Qwen2, Qwen2.5): "<|im_start|>ROLE\nCONTENT<|im_end|>\n" for every message;
 *       when the first message is not a system message, the template's default system
 *       message comes first: Qwen2.5 "You are Qwen, created by Alibaba Cloud. You are a
 *       helpful assistant.", Qwen2 "You are a helpful assistant." (told apart by the
 *       template text; a plain ChatML template has none). Generation prompt:
 *       "<|im_start|>assistant\n".
 *   llama3 (3.0): bos, then "<|start_header_id|>ROLE<|end_header_id|>\n\n" +
 *       trim(CONTENT) + "<|eot_id|>" per message. Generation prompt: the assistant header.
 *   llama3 (3.1 / 3.2, the template mentions "Cutting Knowledge Date"): bos, then always a
 *       system header with "Cutting Knowledge Date: December 2023\nToday Date: DATE\n\n" +
 *       trim(first system message or "") + "<|eot_id|>", then the other messages as in
 *       3.0. DATE is "26 Jul 2024", or today's date ("%d %b %Y") when the template calls
 *       strftime_now (3.2), as transformers does.
 *   llama2: an optional first system message is folded into the first turn as
 *       "<<SYS>>\nSYSTEM\n<</SYS>>\n\n" + content; each user turn is
 *       bos + "[INST] " + strip(content) + " [/INST]", each assistant turn
 *       " " + strip(content) + " " + eos. Roles after the system message must alternate
 *       user/assistant (the template raises otherwise; so do we); a later system message
 *       at an assistant position renders nothing, as in the template. No generation
 *       prompt (the template has none).
 *   mistral (Instruct v0.1/v0.2 template): bos, then "[INST] CONTENT [/INST]" per user
 *       turn and CONTENT + eos per assistant turn (the older v0.1 revision adds " " after
 *       eos). Roles must alternate starting with user, and only user and assistant are
 *       supported: a system message is an error, as the template raises.
 *   plain (ours): "ROLE: CONTENT\n" per message; generation prompt "assistant: ". No
 *       special tokens.
 *   alpaca (ours): an optional system message, then exactly one user and one assistant
 *       turn, as the Alpaca prompt format (see ft_alpaca_prompt) with the user content as
 *       the instruction and the system content, when present, in place of the preamble:
 *       PROMPT + CONTENT + eos; generation prompt: the prompt ends with "### Response:\n".
 *
 * trim / strip are Python's str.strip(): Unicode whitespace off both ends. */
#include <ctype.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "data/data.h"

/* ---- a growable string ------------------------------------------------------------ */

typedef struct sbuf {
    char *s;
    size_t n, cap;
    bool oom;
} sbuf;

static void sb_addn(sbuf *b, const char *s, size_t n)
{
    if (b->oom)
        return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *p = realloc(b->s, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->s = p;
        b->cap = cap;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = '\0';
}

static void sb_add(sbuf *b, const char *s) { sb_addn(b, s, strlen(s)); }

/* ---- Python's str.strip() ---------------------------------------------------------- */

/* Decodes the code point at s (valid UTF-8, as every input here is), setting *len. */
static unsigned utf8_at(const unsigned char *s, int *len)
{
    if (s[0] < 0x80) { *len = 1; return s[0]; }
    if (s[0] < 0xE0) { *len = 2; return ((s[0] & 0x1Fu) << 6) | (s[1] & 0x3Fu); }
    if (s[0] < 0xF0) {
        *len = 3;
        return ((s[0] & 0x0Fu) << 12) | ((s[1] & 0x3Fu) << 6) | (s[2] & 0x3Fu);
    }
    *len = 4;
    return ((s[0] & 0x07u) << 18) | ((s[1] & 0x3Fu) << 12) | ((s[2] & 0x3Fu) << 6) |
           (s[3] & 0x3Fu);
}

/* str.isspace(): the characters Python strips by default. */
static bool py_space(unsigned c)
{
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
           c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
           c == 0x202F || c == 0x205F || c == 0x3000;
}

static void sb_add_stripped(sbuf *b, const char *s)
{
    const unsigned char *p = (const unsigned char *)s, *end = p + strlen(s);
    int l;
    while (p < end && py_space(utf8_at(p, &l)))
        p += l;
    /* Scan forward, remembering where the last non-space ends. */
    const unsigned char *q = p, *last = p;
    while (q < end) {
        unsigned c = utf8_at(q, &l);
        q += l;
        if (!py_space(c))
            last = q;
    }
    sb_addn(b, (const char *)p, (size_t)(last - p));
}

/* ---- names ---------------------------------------------------------------------------- */

static const char *const tmpl_names[] = {"auto", "chatml", "llama3", "llama2",
                                         "mistral", "plain", "alpaca"};

int ft_chat_template_parse(const char *name, ft_chat_template *t, ft_err *err)
{
    for (int i = 0; i < (int)(sizeof tmpl_names / sizeof *tmpl_names); i++)
        if (strcmp(name, tmpl_names[i]) == 0) {
            *t = (ft_chat_template)i;
            return 0;
        }
    return ft_fail(err, "unknown chat template \"%s\" (known: auto, chatml, llama3, llama2, "
                        "mistral, plain, alpaca)", name);
}

const char *ft_chat_template_name(ft_chat_template t)
{
    return (unsigned)t < sizeof tmpl_names / sizeof *tmpl_names ? tmpl_names[t] : "?";
}

/* ---- variants, told apart by the template source ----------------------------------- */

static const char QWEN25_SYSTEM[] =
    "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";
static const char QWEN2_SYSTEM[] = "You are a helpful assistant.";

typedef struct style {
    ft_chat_template t;
    const char *default_system; /* chatml */
    bool llama31;               /* llama3: 3.1 system header */
    bool date_today;            /* llama3.2: strftime_now */
    bool eos_space;             /* mistral v0.1 */
} style;

static void resolve_style(style *st, ft_chat_template t, const char *src)
{
    memset(st, 0, sizeof *st);
    st->t = t;
    switch (t) {
    case FT_TMPL_CHATML:
        if (!src || strstr(src, QWEN25_SYSTEM))
            st->default_system = QWEN25_SYSTEM;
        else if (strstr(src, QWEN2_SYSTEM))
            st->default_system = QWEN2_SYSTEM;
        break;
    case FT_TMPL_LLAMA3:
        st->llama31 = !src || strstr(src, "Cutting Knowledge Date");
        st->date_today = src && strstr(src, "strftime_now");
        break;
    case FT_TMPL_MISTRAL:
        st->eos_space = src && strstr(src, "eos_token + ' '");
        break;
    default:
        break;
    }
}

int ft_chat_template_detect_source(const char *src, ft_chat_template *t, ft_err *err)
{
    if (!src)
        return ft_fail(err, "the tokenizer has no chat_template: name one (chatml, llama3, "
                            "llama2, mistral, plain, alpaca)");
    if (strstr(src, "<|im_start|>")) {
        /* A ChatML default system message we do not know would render differently. */
        if (strstr(src, "You are") && !strstr(src, QWEN25_SYSTEM) && !strstr(src, QWEN2_SYSTEM))
            goto unknown;
        *t = FT_TMPL_CHATML;
        return 0;
    }
    if (strstr(src, "<|start_header_id|>")) {
        *t = FT_TMPL_LLAMA3;
        return 0;
    }
    if (strstr(src, "<<SYS>>") && strstr(src, "[INST]")) {
        *t = FT_TMPL_LLAMA2;
        return 0;
    }
    if (strstr(src, "[INST]")) {
        /* Later Mistral templates place a system message before the last user turn
         * and change the spacing: not the template we render. */
        if (strstr(src, "system_message") || strstr(src, "[/INST]' }}{% elif") == NULL)
            goto unknown;
        *t = FT_TMPL_MISTRAL;
        return 0;
    }
unknown:
    return ft_fail(err, "chat_template not recognised (known: Qwen2/2.5 ChatML, Llama 3/3.1, "
                        "Llama 2 chat, Mistral Instruct v0.1/v0.2): set chat_template to one "
                        "of chatml, llama3, llama2, mistral, plain, alpaca");
}

int ft_chat_template_detect(const ft_tokenizer *tok, ft_chat_template *t, ft_err *err)
{
    return ft_chat_template_detect_source(tok ? ft_tokenizer_chat_template(tok) : NULL, t, err);
}

/* ---- Alpaca --------------------------------------------------------------------------- */

static const char ALPACA_NO_INPUT[] =
    "Below is an instruction that describes a task. Write a response that appropriately "
    "completes the request.";
static const char ALPACA_INPUT[] =
    "Below is an instruction that describes a task, paired with an input that provides "
    "further context. Write a response that appropriately completes the request.";

static void alpaca_prompt(sbuf *b, const char *preamble, const char *instruction,
                          const char *input, bool response_header)
{
    bool has_input = input && *input;
    sb_add(b, preamble ? preamble : has_input ? ALPACA_INPUT : ALPACA_NO_INPUT);
    sb_add(b, "\n\n### Instruction:\n");
    sb_add(b, instruction);
    sb_add(b, "\n\n");
    if (has_input) {
        sb_add(b, "### Input:\n");
        sb_add(b, input);
        sb_add(b, "\n\n");
    }
    if (response_header)
        sb_add(b, "### Response:\n");
}

int ft_alpaca_prompt(const char *instruction, const char *input, char **out, ft_err *err)
{
    sbuf b = {0};
    alpaca_prompt(&b, NULL, instruction, input, true);
    if (b.oom) {
        free(b.s);
        return ft_fail(err, "out of memory");
    }
    *out = b.s;
    return 0;
}

/* ---- rendering ------------------------------------------------------------------------ */

typedef struct msg {
    const char *role, *content;
} msg;

static int get_messages(const json_t *messages, msg **out, size_t *n, ft_err *err)
{
    if (!json_is_array(messages))
        return ft_fail(err, "\"messages\" is not an array");
    size_t k = json_array_size(messages);
    msg *m = calloc(k ? k : 1, sizeof *m);
    if (!m)
        return ft_fail(err, "out of memory");
    for (size_t i = 0; i < k; i++) {
        json_t *o = json_array_get(messages, i);
        json_t *r = json_object_get(o, "role"), *c = json_object_get(o, "content");
        const char *why = NULL;
        if (!json_is_object(o))
            why = "is not an object";
        else if (!r)
            why = "has no \"role\"";
        else if (!json_is_string(r))
            why = "has a \"role\" that is not a string";
        else if (!c)
            why = "has no \"content\"";
        else if (!json_is_string(c))
            why = "has a \"content\" that is not a string";
        if (why) {
            free(m);
            return ft_fail(err, "messages[%zu] %s", i, why);
        }
        m[i].role = json_string_value(r);
        m[i].content = json_string_value(c);
        if (strcmp(m[i].role, "system") && strcmp(m[i].role, "user") &&
            strcmp(m[i].role, "assistant")) {
            ft_fail(err, "messages[%zu] has unknown role \"%s\" (known: system, user, "
                         "assistant)", i, m[i].role);
            free(m);
            return -1;
        }
    }
    *out = m;
    *n = k;
    return 0;
}

static int need(const char *tok, const char *what, ft_chat_template t, ft_err *err)
{
    if (tok)
        return 0;
    return ft_fail(err, "chat template %s needs the tokenizer's %s", ft_chat_template_name(t),
                   what);
}

static const char ALTERNATE[] = "Conversation roles must alternate user/assistant/user/"
                                "assistant/...";

static int render(const style *st, const char *bos, const char *eos, const msg *m, size_t n,
                  bool agp, sbuf *b, ft_err *err)
{
    switch (st->t) {
    case FT_TMPL_CHATML:
        for (size_t i = 0; i < n; i++) {
            if (i == 0 && strcmp(m[0].role, "system") && st->default_system) {
                sb_add(b, "<|im_start|>system\n");
                sb_add(b, st->default_system);
                sb_add(b, "<|im_end|>\n");
            }
            sb_add(b, "<|im_start|>");
            sb_add(b, m[i].role);
            sb_add(b, "\n");
            sb_add(b, m[i].content);
            sb_add(b, "<|im_end|>\n");
        }
        /* Qwen2.5 writes its default system message even for an empty chat; Qwen2 not. */
        if (n == 0 && st->default_system == QWEN25_SYSTEM) {
            sb_add(b, "<|im_start|>system\n");
            sb_add(b, st->default_system);
            sb_add(b, "<|im_end|>\n");
        }
        if (agp)
            sb_add(b, "<|im_start|>assistant\n");
        return 0;
    case FT_TMPL_LLAMA3: {
        if (need(bos, "bos_token", st->t, err))
            return -1;
        size_t i = 0;
        if (st->llama31) {
            char date[64] = "26 Jul 2024";
            if (st->date_today) {
                time_t now = time(NULL);
                struct tm tm;
                localtime_r(&now, &tm);
                strftime(date, sizeof date, "%d %b %Y", &tm);
            }
            sb_add(b, bos);
            sb_add(b, "<|start_header_id|>system<|end_header_id|>\n\n"
                      "Cutting Knowledge Date: December 2023\nToday Date: ");
            sb_add(b, date);
            sb_add(b, "\n\n");
            if (n > 0 && strcmp(m[0].role, "system") == 0) {
                sb_add_stripped(b, m[0].content);
                i = 1;
            }
            sb_add(b, "<|eot_id|>");
        } else if (n > 0) {
            sb_add(b, bos);
        }
        for (; i < n; i++) {
            sb_add(b, "<|start_header_id|>");
            sb_add(b, m[i].role);
            sb_add(b, "<|end_header_id|>\n\n");
            sb_add_stripped(b, m[i].content);
            sb_add(b, "<|eot_id|>");
        }
        if (agp)
            sb_add(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
        return 0;
    }
    case FT_TMPL_LLAMA2: {
        if (need(bos, "bos_token", st->t, err) || need(eos, "eos_token", st->t, err))
            return -1;
        size_t first = 0;
        const char *system = NULL;
        if (n > 0 && strcmp(m[0].role, "system") == 0) {
            system = m[0].content;
            first = 1;
        }
        for (size_t i = first; i < n; i++) {
            size_t k = i - first;
            if ((strcmp(m[i].role, "user") == 0) != (k % 2 == 0))
                return ft_fail(err, "llama2 chat template: %s (messages[%zu] is %s)",
                               ALTERNATE, i, m[i].role);
            sbuf c = {0};
            if (k == 0 && system) {
                sb_add(&c, "<<SYS>>\n");
                sb_add(&c, system);
                sb_add(&c, "\n<</SYS>>\n\n");
            }
            sb_add(&c, m[i].content);
            if (c.oom) {
                free(c.s);
                return ft_fail(err, "out of memory");
            }
            if (strcmp(m[i].role, "user") == 0) {
                sb_add(b, bos);
                sb_add(b, "[INST] ");
                sb_add_stripped(b, c.s);
                sb_add(b, " [/INST]");
            } else if (strcmp(m[i].role, "assistant") == 0) {
                sb_add(b, " ");
                sb_add_stripped(b, c.s);
                sb_add(b, " ");
                sb_add(b, eos);
            }
            free(c.s);
        }
        return 0;
    }
    case FT_TMPL_MISTRAL:
        if (need(bos, "bos_token", st->t, err) || need(eos, "eos_token", st->t, err))
            return -1;
        sb_add(b, bos);
        for (size_t i = 0; i < n; i++) {
            if ((strcmp(m[i].role, "user") == 0) != (i % 2 == 0))
                return ft_fail(err, "mistral chat template: %s (messages[%zu] is %s; the "
                                    "template supports no system message)", ALTERNATE, i,
                               m[i].role);
            if (strcmp(m[i].role, "user") == 0) {
                sb_add(b, "[INST] ");
                sb_add(b, m[i].content);
                sb_add(b, " [/INST]");
            } else if (strcmp(m[i].role, "assistant") == 0) {
                sb_add(b, m[i].content);
                sb_add(b, eos);
                if (st->eos_space)
                    sb_add(b, " ");
            } else {
                return ft_fail(err, "mistral chat template: Only user and assistant roles "
                                    "are supported! (messages[%zu] is %s)", i, m[i].role);
            }
        }
        return 0;
    case FT_TMPL_PLAIN:
        for (size_t i = 0; i < n; i++) {
            sb_add(b, m[i].role);
            sb_add(b, ": ");
            sb_add(b, m[i].content);
            sb_add(b, "\n");
        }
        if (agp)
            sb_add(b, "assistant: ");
        return 0;
    case FT_TMPL_ALPACA: {
        if (need(eos, "eos_token", st->t, err))
            return -1;
        size_t i = 0;
        const char *system = NULL;
        if (n > 0 && strcmp(m[0].role, "system") == 0)
            system = m[i++].content;
        bool ok = n - i <= 2 && (n == i || strcmp(m[i].role, "user") == 0) &&
                  (n - i < 2 || strcmp(m[i + 1].role, "assistant") == 0);
        if (!ok)
            return ft_fail(err, "alpaca chat template: expected an optional system message, "
                                "then one user and one assistant message");
        if (n > i) {
            alpaca_prompt(b, system, m[i].content, NULL, agp || n - i == 2);
            if (n - i == 2) {
                sb_add(b, m[i + 1].content);
                sb_add(b, eos);
            }
        } else if (system) {
            sb_add(b, system);
            sb_add(b, "\n\n");
        }
        return 0;
    }
    default:
        return ft_fail(err, "chat template %d: not a concrete template (detect it first)",
                       (int)st->t);
    }
}

int ft_chat_render_n(ft_chat_template tmpl, const char *source, const char *bos,
                     const char *eos, const json_t *messages, size_t count,
                     bool add_generation_prompt, char **out, ft_err *err)
{
    *out = NULL;
    msg *m = NULL;
    size_t n = 0;
    if (get_messages(messages, &m, &n, err))
        return -1;
    if (count < n)
        n = count;
    style st;
    resolve_style(&st, tmpl, source);
    sbuf b = {0};
    sb_add(&b, "");
    int rc = render(&st, bos, eos, m, n, add_generation_prompt, &b, err);
    free(m);
    if (rc == 0 && b.oom)
        rc = ft_fail(err, "out of memory");
    if (rc) {
        free(b.s);
        return -1;
    }
    *out = b.s;
    return 0;
}

int ft_chat_render_with(ft_chat_template tmpl, const char *source, const char *bos,
                        const char *eos, const json_t *messages, bool add_generation_prompt,
                        char **out, ft_err *err)
{
    return ft_chat_render_n(tmpl, source, bos, eos, messages, (size_t)-1,
                            add_generation_prompt, out, err);
}

int ft_chat_render(ft_chat_template tmpl, const ft_tokenizer *tok, const json_t *messages,
                   bool add_generation_prompt, char **out, ft_err *err)
{
    *out = NULL;
    const char *src = tok ? ft_tokenizer_chat_template(tok) : NULL;
    if (tmpl == FT_TMPL_AUTO && ft_chat_template_detect_source(src, &tmpl, err))
        return -1;
    return ft_chat_render_with(tmpl, src, tok ? ft_tokenizer_bos_token(tok) : NULL,
                               tok ? ft_tokenizer_eos_token(tok) : NULL, messages,
                               add_generation_prompt, out, err);
}
