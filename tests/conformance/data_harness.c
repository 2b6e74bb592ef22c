/* ft-data: the conformance suite's window on lib/data/data.c and lib/data/chat_template.c.
 *
 *   ft-data render TEMPLATE BOS EOS [SOURCE.jinja] < chats.jsonl
 *       TEMPLATE: auto (SOURCE, the model's own template), or a fallback of ours: chatml,
 *       plain, alpaca. BOS / EOS are the special token strings ("" for none). Each input
 *       line is {"messages": [...], "add_generation_prompt": bool, "extra"?: {...}}
 *       (extra: more template variables: tools, documents, enable_thinking, ...); each
 *       output line is the rendered text as a JSON string, or {"error": "..."} when the
 *       template fails (it does not compile, or it raises).
 *   ft-data load TOKENIZER_DIR DATA.jsonl [--format F] [--template T] [--max-seq-len N]
 *                [--template-name NAME] [--template-kwargs JSON]
 *                [--train-on-all] [--skip-bad-lines] [--no-eos]
 *       one {"input_ids": [...], "labels": [...]} line per sample; then on stderr a line
 *       "samples N skipped N dropped N".
 * Exit status 1 with "ft-data: error: ..." on stderr for any other failure. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/data.h"
#include "tokenizer/tokenizer.h"

static int die(const char *msg)
{
    fprintf(stderr, "ft-data: error: %s\n", msg);
    return 1;
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) {
        free(s);
        s = NULL;
    }
    if (s)
        s[n] = 0;
    fclose(f);
    return s;
}

static int cmd_render(int argc, char **argv)
{
    if (argc < 5)
        return die("usage: ft-data render TEMPLATE BOS EOS [SOURCE.jinja]");
    ft_err err;
    ft_chat_template t;
    char *src = NULL;
    if (argc > 5 && !(src = slurp(argv[5])))
        return die("cannot read the template source");
    if (ft_chat_template_parse(argv[2], &t, &err))
        return die(err.msg);
    json_t *special = json_object();
    if (argv[3][0])
        json_object_set_new(special, "bos_token", json_string(argv[3]));
    if (argv[4][0])
        json_object_set_new(special, "eos_token", json_string(argv[4]));
    ft_chat *chat = NULL;
    int open_rc = ft_chat_open_source(&chat, t, src, special, &err);
    ft_err open_err = err;
    json_decref(special);
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    while ((n = getline(&line, &cap, stdin)) > 0) {
        json_error_t je;
        json_t *rec = json_loadb(line, (size_t)n, 0, &je);
        if (!rec)
            return die(je.text);
        char *out;
        json_t *res;
        json_t *msgs = json_object_get(rec, "messages");
        if (open_rc) {
            res = json_pack("{s:s}", "error", open_err.msg);
        } else if (ft_chat_render(chat, msgs, json_array_size(msgs),
                                  json_is_true(json_object_get(rec, "add_generation_prompt")),
                                  json_object_get(rec, "extra"), &out, NULL, NULL,
                                  &err) == 0) {
            res = json_string(out);
            free(out);
        } else {
            res = json_pack("{s:s}", "error", err.msg);
        }
        char *s = json_dumps(res, JSON_ENCODE_ANY | JSON_ENSURE_ASCII);
        puts(s);
        free(s);
        json_decref(res);
        json_decref(rec);
    }
    free(line);
    free(src);
    ft_chat_free(chat);
    return 0;
}

static void put_ints(const int32_t *v, int n)
{
    for (int i = 0; i < n; i++)
        printf(i ? ", %d" : "%d", (int)v[i]);
}

static int cmd_load(int argc, char **argv)
{
    if (argc < 4)
        return die("usage: ft-data load TOKENIZER_DIR DATA.jsonl [options]");
    ft_err err;
    ft_data_options o = {.format = FT_DATA_AUTO, .chat_template = FT_TMPL_AUTO,
                         .add_eos = true};
    for (int i = 4; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--format") && i + 1 < argc) {
            if (ft_data_format_parse(argv[++i], &o.format, &err))
                return die(err.msg);
        } else if (!strcmp(a, "--template") && i + 1 < argc) {
            if (ft_chat_template_parse(argv[++i], &o.chat_template, &err))
                return die(err.msg);
        } else if (!strcmp(a, "--template-name") && i + 1 < argc) {
            o.chat_template_name = argv[++i];
        } else if (!strcmp(a, "--template-kwargs") && i + 1 < argc) {
            o.chat_template_kwargs = argv[++i];
        } else if (!strcmp(a, "--max-seq-len") && i + 1 < argc) {
            o.max_seq_len = atoi(argv[++i]);
        } else if (!strcmp(a, "--train-on-all")) {
            o.train_on_all = true;
        } else if (!strcmp(a, "--skip-bad-lines")) {
            o.skip_bad_lines = true;
        } else if (!strcmp(a, "--no-eos")) {
            o.add_eos = false;
        } else {
            fprintf(stderr, "ft-data: error: unknown option %s\n", a);
            return 1;
        }
    }
    ft_tokenizer *tok = NULL;
    /* the tokens format runs without a tokenizer, as ft-train does */
    if (strcmp(argv[2], "-") && o.format != FT_DATA_TOKENS &&
        ft_tokenizer_load(&tok, argv[2], &err))
        return die(err.msg);
    ft_dataset ds;
    if (ft_dataset_load(&ds, argv[3], tok, &o, &err)) {
        ft_tokenizer_free(tok);
        return die(err.msg);
    }
    for (size_t i = 0; i < ds.n; i++) {
        fputs("{\"input_ids\": [", stdout);
        put_ints(ds.samples[i].ids, ds.samples[i].n);
        fputs("], \"labels\": [", stdout);
        put_ints(ds.samples[i].labels, ds.samples[i].n);
        printf("], \"line\": %ld}\n", ds.samples[i].line);
    }
    fprintf(stderr, "samples %zu skipped %zu dropped %zu\n", ds.n, ds.skipped_lines,
            ds.dropped_empty);
    ft_dataset_free(&ds);
    ft_tokenizer_free(tok);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc >= 2 && !strcmp(argv[1], "render"))
        return cmd_render(argc, argv);
    if (argc >= 2 && !strcmp(argv[1], "load"))
        return cmd_load(argc, argv);
    return die("usage: ft-data render|load ...");
}
