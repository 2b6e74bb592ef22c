/* Chat templates: the model's own Jinja template rendered by lib/jinja/ with the
 * variables transformers' apply_chat_template gives it (messages, add_generation_prompt,
 * tools, documents, the special token strings), and three fallbacks of ours for models
 * without a template, written in Jinja below so that one path renders everything.
 *
 * Why no family templates in C any more: a template recognised by a few strings could
 * render differently from the model's own (a ChatML variant that trims each message),
 * silently; the interpreter renders what the model ships (tests/conformance/
 * test_chat_templates.py compares it with transformers id for id). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/run_config.h"
#include "data/data.h"

/* ---- the fallbacks -------------------------------------------------------------------- */

/* transformers' documented ChatML template (no default system message). */
static const char CHATML[] =
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/* "role: content" lines; generation prompt "assistant: ". No special tokens. */
static const char PLAIN[] =
    "{% for message in messages %}{{ message['role'] + ': ' + message['content'] + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ 'assistant: ' }}{% endif %}";

/* An optional system message (it replaces the Alpaca preamble), then one user turn (the
 * instruction) and one assistant turn (the response, then eos_token): the prompt of
 * ft_alpaca_prompt without an input. */
static const char ALPACA[] =
    "{%- set ns = namespace(i=0, system=none) -%}\n"
    "{%- if messages and messages[0]['role'] == 'system' -%}\n"
    "  {%- set ns.system = messages[0]['content'] -%}\n"
    "  {%- set ns.i = 1 -%}\n"
    "{%- endif -%}\n"
    "{%- set rest = messages[ns.i:] -%}\n"
    "{%- if rest | length > 2 or (rest | length > 0 and rest[0]['role'] != 'user') or\n"
    "       (rest | length > 1 and rest[1]['role'] != 'assistant') -%}\n"
    "  {{- raise_exception('alpaca chat template: expected an optional system message, "
    "then one user and one assistant message') -}}\n"
    "{%- endif -%}\n"
    "{%- if rest | length > 0 -%}\n"
    "  {{- ns.system if ns.system is not none else 'Below is an instruction that describes "
    "a task. Write a response that appropriately completes the request.' -}}\n"
    "  {{- '\\n\\n### Instruction:\\n' + rest[0]['content'] + '\\n\\n' -}}\n"
    "  {%- if add_generation_prompt or rest | length == 2 -%}{{- '### Response:\\n' -}}"
    "{%- endif -%}\n"
    "  {%- if rest | length == 2 -%}{{- rest[1]['content'] + eos_token -}}{%- endif -%}\n"
    "{%- elif ns.system is not none -%}\n"
    "  {{- ns.system + '\\n\\n' -}}\n"
    "{%- endif -%}\n";

static const char *const tmpl_names[] = {"auto", "chatml", "plain", "alpaca"};

int ft_chat_template_parse(const char *name, ft_chat_template *t, ft_err *err)
{
    for (int i = 0; i < (int)(sizeof tmpl_names / sizeof *tmpl_names); i++)
        if (strcmp(name, tmpl_names[i]) == 0) {
            *t = (ft_chat_template)i;
            return 0;
        }
    if (!strcmp(name, "llama3") || !strcmp(name, "llama2") || !strcmp(name, "mistral"))
        return ft_fail(err, "chat template \"%s\" is no longer built in: the model's own "
                            "template (tokenizer_config.json's chat_template) is rendered "
                            "as transformers renders it; use auto", name);
    return ft_fail(err, "unknown chat template \"%s\" (known: auto (the model's own), "
                        "chatml, plain, alpaca)", name);
}

const char *ft_chat_template_name(ft_chat_template t)
{
    return (unsigned)t < sizeof tmpl_names / sizeof *tmpl_names ? tmpl_names[t] : "?";
}

/* ---- compiled templates ----------------------------------------------------------------- */

struct ft_chat {
    ft_jinja *jinja;
    ft_jinja *tool_use; /* the model's "tool_use" template, for chats with tools (no name
                         * chosen) */
    json_t *special;    /* {"bos_token": ..., ...}: the tokenizer's special_tokens_map */
    json_t *kwargs;     /* more template variables (data.chat_template_kwargs), or NULL */
};

/* transformers' get_chat_template: the "tool_use" template when tools are given and the
 * model has one, else the default. */
static const ft_jinja *pick(const ft_chat *c, const json_t *extra)
{
    json_t *tools = extra ? json_object_get(extra, "tools") : NULL;
    return c->tool_use && tools && !json_is_null(tools) ? c->tool_use : c->jinja;
}

int ft_chat_open_source(ft_chat **out, ft_chat_template t, const char *source,
                        const json_t *special, ft_err *err)
{
    *out = NULL;
    const char *src = t == FT_TMPL_CHATML ? CHATML : t == FT_TMPL_PLAIN ? PLAIN
                    : t == FT_TMPL_ALPACA ? ALPACA : source;
    if (!src)
        return ft_fail(err, "the tokenizer has no chat_template (tokenizer_config.json's "
                            "chat_template or chat_template.jinja): set data.chat_template "
                            "to one of chatml, plain, alpaca");
    ft_chat *c = calloc(1, sizeof *c);
    if (!c)
        return ft_fail(err, "out of memory");
    if (ft_jinja_compile(&c->jinja, src, err)) {
        free(c);
        return ft_fail_prefix(err, "chat template%s%s", t == FT_TMPL_AUTO ? "" : " ",
                              t == FT_TMPL_AUTO ? "" : ft_chat_template_name(t));
    }
    c->special = special ? json_deep_copy(special) : json_object();
    if (!c->special) {
        ft_chat_free(c);
        return ft_fail(err, "out of memory");
    }
    *out = c;
    return 0;
}

/* "a, b, c": the names of tok's templates, into out. */
static void template_names(const ft_tokenizer *tok, char *out, size_t n)
{
    const char *names[64];
    size_t count = ft_tokenizer_chat_template_names(tok, names, 64), len = 0;
    out[0] = '\0';
    for (size_t i = 0; i < count && i < 64 && len < n; i++)
        len += (size_t)snprintf(out + len, n - len, "%s%s", i ? ", " : "", names[i]);
}

int ft_chat_check_name(const ft_tokenizer *tok, ft_chat_template t, const char *name,
                       ft_err *err)
{
    if (!name || !*name)
        return 0;
    if (t != FT_TMPL_AUTO)
        return ft_fail(err, "'%s' names one of the model's templates, which chat template "
                            "%s (ours) does not use: set the chat template to auto, or "
                            "leave the name empty", name, ft_chat_template_name(t));
    if (tok && ft_tokenizer_chat_template_named(tok, name))
        return 0;
    char names[1024];
    if (tok)
        template_names(tok, names, sizeof names);
    if (!tok || !names[0])
        return ft_fail(err, "the model has no chat template named '%s' (it has no chat "
                            "template at all)", name);
    return ft_fail(err, "the model has no chat template named '%s' (its templates: %s)", name,
                   names);
}

int ft_chat_kwargs_parse(const char *text, const ft_tokenizer *tok, json_t **out, ft_err *err)
{
    *out = NULL;
    if (!text || !*text)
        return 0;
    json_error_t je;
    json_t *j = json_loads(text, JSON_REJECT_DUPLICATES, &je);
    if (!j)
        return ft_fail(err, "not JSON: %s (column %d)", je.text, je.column);
    if (!json_is_object(j)) {
        json_decref(j);
        return ft_fail(err, "not a JSON object (a mapping of names to values)");
    }
    const json_t *special = tok ? ft_tokenizer_special_tokens(tok) : NULL;
    const char *k;
    json_t *v;
    json_object_foreach(j, k, v) {
        (void)v;
        for (size_t i = 0; ft_chat_template_reserved[i]; i++)
            if (!strcmp(k, ft_chat_template_reserved[i])) {
                json_decref(j);
                return ft_fail(err, "'%s' is a variable transformers' apply_chat_template "
                                    "sets itself (or one of its parameters), not a template "
                                    "kwarg", k);
            }
        if (json_object_get(special, k)) {
            json_decref(j);
            return ft_fail(err, "'%s' is a special token of the tokenizer, which "
                                "apply_chat_template gives the template itself", k);
        }
    }
    *out = j;
    return 0;
}

int ft_chat_open(ft_chat **out, ft_chat_template t, const char *name, const char *kwargs,
                 const ft_tokenizer *tok, ft_err *err)
{
    *out = NULL;
    json_t *kw = NULL;
    if (ft_chat_check_name(tok, t, name, err))
        return ft_fail_prefix(err, "chat template name");
    if (ft_chat_kwargs_parse(kwargs, tok, &kw, err))
        return ft_fail_prefix(err, "chat template kwargs");
    bool named = name && *name;
    const char *src = NULL;
    if (tok && t == FT_TMPL_AUTO) {
        src = ft_tokenizer_chat_template_named(tok, named ? name : "default");
        char names[1024];
        template_names(tok, names, sizeof names);
        if (!src && names[0]) {
            json_decref(kw);
            return ft_fail(err, "the model's chat templates have no default (its templates: "
                                "%s): name one with data.chat_template_name", names);
        }
    }
    int rc = ft_chat_open_source(out, t, src, tok ? ft_tokenizer_special_tokens(tok) : NULL,
                                 err);
    if (rc) {
        json_decref(kw);
        return rc;
    }
    (*out)->kwargs = kw;
    const char *tool_use = tok && t == FT_TMPL_AUTO && !named
                               ? ft_tokenizer_chat_template_named(tok, "tool_use") : NULL;
    if (tool_use && ft_jinja_compile(&(*out)->tool_use, tool_use, err)) {
        ft_chat_free(*out);
        *out = NULL;
        return ft_fail_prefix(err, "chat template tool_use");
    }
    return 0;
}

void ft_chat_free(ft_chat *c)
{
    if (!c)
        return;
    ft_jinja_free(c->jinja);
    ft_jinja_free(c->tool_use);
    json_decref(c->special);
    json_decref(c->kwargs);
    free(c);
}

bool ft_chat_has_generation(const ft_chat *c, const json_t *extra)
{
    return c && ft_jinja_has_generation(pick(c, extra));
}

/* ---- rendering -------------------------------------------------------------------------- */

/* A message as transformers hands it to the template: null-valued keys dropped
 * (_normalize_chat_messages), and the reasoning under its three names when any is given
 * (_alias_reasoning_fields: "thinking" first, the message's keys, then
 * "reasoning_content"). */
static json_t *normalize(const json_t *m)
{
    static const char *const REASONING[] = {"reasoning_content", "thinking", "reasoning"};
    json_t *plain = json_object();
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)m, k, v)
        if (!json_is_null(v))
            json_object_set(plain, k, v);
    json_t *reasoning = NULL;
    for (int i = 0; i < 3 && !reasoning; i++)
        reasoning = json_object_get(plain, REASONING[i]);
    if (!reasoning)
        return plain;
    json_t *out = json_object();
    json_object_set(out, "thinking", reasoning);
    json_object_foreach(plain, k, v)
        json_object_set(out, k, v);
    json_object_set(out, "reasoning_content", reasoning);
    json_decref(plain);
    return out;
}

int ft_chat_render(const ft_chat *c, const json_t *messages, size_t count,
                   bool add_generation_prompt, const json_t *extra, char **out,
                   ft_jinja_span **spans, size_t *n_spans, ft_err *err)
{
    *out = NULL;
    if (!json_is_array(messages))
        return ft_fail(err, "\"messages\" is not an array");
    size_t n = json_array_size(messages);
    if (count > n)
        count = n;
    json_t *msgs = json_array();
    for (size_t i = 0; i < count; i++) {
        json_t *m = json_array_get(messages, i);
        if (!json_is_object(m)) {
            json_decref(msgs);
            return ft_fail(err, "messages[%zu] is not an object", i);
        }
        json_array_append_new(msgs, normalize(m));
    }
    /* template_kwargs = {**special_tokens_map, **kwargs}; then messages, tools,
     * documents and add_generation_prompt */
    json_t *vars = json_deep_copy(c->special);
    if (c->kwargs)
        json_object_update(vars, c->kwargs);
    if (extra) {
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)extra, k, v)
            json_object_set(vars, k, v);
    }
    if (!json_object_get(vars, "tools"))
        json_object_set_new(vars, "tools", json_null());
    if (!json_object_get(vars, "documents"))
        json_object_set_new(vars, "documents", json_null());
    json_object_set_new(vars, "messages", msgs);
    json_object_set_new(vars, "add_generation_prompt", json_boolean(add_generation_prompt));
    int rc = ft_jinja_render(pick(c, extra), vars, NULL, out, NULL, spans, n_spans, err);
    json_decref(vars);
    if (rc)
        return ft_fail_prefix(err, "chat template");
    return 0;
}

/* ---- ShareGPT ----------------------------------------------------------------------- */

int ft_sharegpt_messages(const json_t *conv, json_t **messages, ft_err *err)
{
    *messages = NULL;
    if (!json_is_array(conv))
        return ft_fail(err, "\"conversations\" is not an array (sharegpt format)");
    json_t *msgs = json_array();
    for (size_t i = 0; i < json_array_size(conv); i++) {
        json_t *e = json_array_get(conv, i);
        json_t *from = json_object_get(e, "from"), *value = json_object_get(e, "value");
        const char *why = !json_is_object(e) ? "is not an object"
                        : !from ? "has no \"from\""
                        : !json_is_string(from) ? "has a \"from\" that is not a string"
                        : !value ? "has no \"value\""
                        : !json_is_string(value) ? "has a \"value\" that is not a string"
                        : NULL;
        if (why) {
            json_decref(msgs);
            return ft_fail(err, "conversations[%zu] %s", i, why);
        }
        const char *f = json_string_value(from), *role = NULL;
        if (!strcmp(f, "human"))
            role = "user";
        else if (!strcmp(f, "gpt"))
            role = "assistant";
        else if (!strcmp(f, "system"))
            role = "system";
        if (!role) {
            json_decref(msgs);
            return ft_fail(err, "conversations[%zu] has unknown \"from\": \"%s\" (known: "
                                "human, gpt, system)", i, f);
        }
        json_array_append_new(msgs, json_pack("{s:s,s:O}", "role", role, "content", value));
    }
    *messages = msgs;
    return 0;
}

/* ---- Alpaca ------------------------------------------------------------------------- */

static const char ALPACA_NO_INPUT[] =
    "Below is an instruction that describes a task. Write a response that appropriately "
    "completes the request.";
static const char ALPACA_INPUT[] =
    "Below is an instruction that describes a task, paired with an input that provides "
    "further context. Write a response that appropriately completes the request.";

int ft_alpaca_prompt(const char *instruction, const char *input, char **out, ft_err *err)
{
    bool has_input = input && *input;
    const char *pre = has_input ? ALPACA_INPUT : ALPACA_NO_INPUT;
    size_t n = strlen(pre) + strlen(instruction) + (has_input ? strlen(input) : 0) + 64;
    char *s = malloc(n);
    if (!s)
        return ft_fail(err, "out of memory");
    if (has_input)
        snprintf(s, n, "%s\n\n### Instruction:\n%s\n\n### Input:\n%s\n\n### Response:\n", pre,
                 instruction, input);
    else
        snprintf(s, n, "%s\n\n### Instruction:\n%s\n\n### Response:\n", pre, instruction);
    *out = s;
    return 0;
}
