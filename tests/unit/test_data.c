/* Unit tests of lib/core/jsonl.c, lib/data/data.c, lib/data/chat_template.c and lib/data/loader.c: the line
 * reader, every per-line error (each naming FILE:LINE), each record format, skipping and
 * dropping counts, truncation, the split, the chat templates on hand-checked strings
 * (tests/conformance checks them against transformers), and the loader's shuffling,
 * sharding, padding, packing and dump. The formats that need a tokenizer use a tiny
 * byte-level tokenizer.json written here. */
#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "data/data.h"
#include "core/jsonl.h"

static char tmp_dir[64];
static ft_tokenizer *tok;

static const char *write_file(const char *name, const char *text)
{
    static char path[8][256];
    static int k;
    char *p = path[k++ % 8];
    snprintf(p, 256, "%s/%s", tmp_dir, name);
    FILE *f = fopen(p, "wb");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
    return p;
}

static bool has(const char *hay, const char *needle)
{
    bool ok = strstr(hay, needle) != NULL;
    if (!ok)
        fprintf(stderr, "  expected \"%s\" in \"%s\"\n", needle, hay);
    return ok;
}

static ft_data_options opts(ft_data_format f)
{
    ft_data_options o = {.format = f, .chat_template = FT_TMPL_AUTO, .max_seq_len = 0,
                         .add_eos = true};
    return o;
}

/* Loading `text` must fail with an error containing each of the needles. */
static bool load_fails(const char *text, ft_data_format f, const ft_tokenizer *t,
                       const char *n1, const char *n2)
{
    const char *p = write_file("bad.jsonl", text);
    ft_dataset ds;
    ft_err err = {0};
    ft_data_options o = opts(f);
    if (ft_dataset_load(&ds, p, t, &o, &err) == 0) {
        fprintf(stderr, "  loaded, expected an error: %s\n", text);
        ft_dataset_free(&ds);
        return false;
    }
    return has(err.msg, n1) && (!n2 || has(err.msg, n2));
}

/* ---- the tiny tokenizer ----------------------------------------------------------------
 * Byte-level BPE with no merges (one token per byte, GPT-2's byte-to-unicode mapping),
 * added special tokens, and a post-processor that prepends <s>. */
static int write_tokenizer(const char *dir)
{
    json_t *vocab = json_object();
    int n = 0;
    for (int b = 0; b < 256; b++) {
        bool direct = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        unsigned cp = direct ? (unsigned)b : 256u + (unsigned)n++;
        char s[4];
        if (cp < 0x80) {
            s[0] = (char)cp;
            s[1] = 0;
        } else {
            s[0] = (char)(0xC0 | (cp >> 6));
            s[1] = (char)(0x80 | (cp & 0x3F));
            s[2] = 0;
        }
        json_object_set_new(vocab, s, json_integer(b));
    }
    static const char *sp[] = {"<s>", "</s>", "<|im_start|>", "<|im_end|>",
                               "<|begin_of_text|>", "<|start_header_id|>",
                               "<|end_header_id|>", "<|eot_id|>"};
    json_t *added = json_array();
    for (int i = 0; i < 8; i++)
        json_array_append_new(added, json_pack("{s:i,s:s,s:b,s:b,s:b,s:b,s:b}", "id", 256 + i,
                                               "content", sp[i], "single_word", 0, "lstrip", 0,
                                               "rstrip", 0, "normalized", 0, "special", 1));
    json_t *tj = json_loads(
        "{\"version\": \"1.0\", \"truncation\": null, \"padding\": null, "
        "\"normalizer\": null,"
        " \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false,"
        "   \"trim_offsets\": true, \"use_regex\": true},"
        " \"post_processor\": {\"type\": \"TemplateProcessing\","
        "   \"single\": [{\"SpecialToken\": {\"id\": \"<s>\", \"type_id\": 0}},"
        "              {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}],"
        "   \"pair\": [{\"SpecialToken\": {\"id\": \"<s>\", \"type_id\": 0}},"
        "            {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}},"
        "            {\"SpecialToken\": {\"id\": \"<s>\", \"type_id\": 1}},"
        "            {\"Sequence\": {\"id\": \"B\", \"type_id\": 1}}],"
        "   \"special_tokens\": {\"<s>\": {\"id\": \"<s>\", \"ids\": [256],"
        "                                  \"tokens\": [\"<s>\"]}}},"
        " \"decoder\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true,"
        "   \"trim_offsets\": true, \"use_regex\": true},"
        " \"model\": {\"type\": \"BPE\", \"dropout\": null, \"unk_token\": null,"
        "   \"continuing_subword_prefix\": null, \"end_of_word_suffix\": null,"
        "   \"fuse_unk\": false, \"byte_fallback\": false, \"ignore_merges\": false,"
        "   \"merges\": []}}",
        0, NULL);
    if (tj) {
        json_object_set_new(tj, "added_tokens", added);
        json_object_set_new(json_object_get(tj, "model"), "vocab", vocab);
    }
    if (!tj)
        return -1;
    char p[256];
    snprintf(p, sizeof p, "%s/tokenizer.json", dir);
    int rc = json_dump_file(tj, p, 0);
    json_decref(tj);
    json_t *cfg = json_pack(
        "{s:s,s:s,s:s,s:s}", "bos_token", "<s>", "eos_token", "</s>", "chat_template",
        "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' "
        "%}{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif "
        "%}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + "
        "'\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% "
        "endif %}",
        "tokenizer_class", "PreTrainedTokenizerFast");
    snprintf(p, sizeof p, "%s/tokenizer_config.json", dir);
    rc |= json_dump_file(cfg, p, 0);
    json_decref(cfg);
    return rc;
}

static ft_ids enc(const char *s, bool special)
{
    ft_ids v = {0};
    ft_err err;
    FT_CHECK(ft_tokenizer_encode(tok, s, strlen(s), special, &v, &err) == 0);
    return v;
}

/* ---- jsonl -------------------------------------------------------------------------------- */

static void test_jsonl_lines(void)
{
    static char big[200000];
    memset(big, 'x', sizeof big - 1);
    char *text = malloc(sizeof big + 100);
    snprintf(text, sizeof big + 100, "{\"a\":1}\r\n\n   \r\n\xEF\xBB\xBF{\"b\":2}\n\"%s\"\n"
                                     "\"\xC3\xA9\"", big);
    const char *p = write_file("lines.jsonl", text);
    free(text);
    ft_jsonl *r;
    ft_err err;
    CHECK(ft_jsonl_open(&r, p, &err) == 0);
    const char *line;
    size_t len;
    long ln;
    CHECK(ft_jsonl_next(r, &line, &len, &ln, &err) == 1 && ln == 1 && len == 7 &&
          strcmp(line, "{\"a\":1}") == 0);
    /* the BOM is skipped only on line 1: here it is on line 4 and stays */
    CHECK(ft_jsonl_next(r, &line, &len, &ln, &err) == 1 && ln == 4 && len == 10);
    CHECK(ft_jsonl_next(r, &line, &len, &ln, &err) == 1 && ln == 5 && len == sizeof big + 1);
    CHECK(ft_jsonl_next(r, &line, &len, &ln, &err) == 1 && ln == 6 && len == 4);
    CHECK(ft_jsonl_next(r, &line, &len, &ln, &err) == 0);
    ft_jsonl_close(r);

    p = write_file("bom.jsonl", "\xEF\xBB\xBF{}\n");
    CHECK(ft_jsonl_open(&r, p, &err) == 0);
    CHECK(ft_jsonl_next(r, &line, &len, &ln, &err) == 1 && strcmp(line, "{}") == 0);
    ft_jsonl_close(r);

    CHECK(ft_jsonl_open(&r, "/nonexistent/x.jsonl", &err) == -1 &&
          has(err.msg, "/nonexistent/x.jsonl"));
}

static void test_jsonl_utf8(void)
{
    static const char *badseq[] = {"\x80", "\xC0\xAF", "\xE0\x80\xAF", "\xED\xA0\x80",
                                   "\xF4\x90\x80\x80", "\xC3", "\xFF", "\xE2\x82"};
    for (size_t i = 0; i < sizeof badseq / sizeof *badseq; i++)
        CHECK(!ft_utf8_valid(badseq[i], strlen(badseq[i])));
    CHECK(ft_utf8_valid("a\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80", 10));
    const char *p = write_file("u.jsonl", "{}\n{\"a\":\"\xC3\x28\"}\n{}\n");
    ft_jsonl *r;
    ft_err err;
    const char *line;
    size_t len;
    long ln;
    CHECK(ft_jsonl_open(&r, p, &err) == 0);
    CHECK(ft_jsonl_next(r, &line, &len, &ln, &err) == 1);
    CHECK(ft_jsonl_next(r, &line, &len, &ln, &err) == -1 && ft_jsonl_bad_line(r) && ln == 2);
    CHECK(has(err.msg, "u.jsonl:2: invalid UTF-8"));
    CHECK(ft_jsonl_next(r, &line, &len, &ln, &err) == 1 && ln == 3);
    ft_jsonl_close(r);
}

static void test_names(void)
{
    ft_data_format f;
    ft_chat_template t;
    ft_err err;
    CHECK(ft_data_format_parse("prompt_completion", &f, &err) == 0 &&
          f == FT_DATA_PROMPT_COMPLETION);
    CHECK(ft_data_format_parse("tokens", &f, &err) == 0 && f == FT_DATA_TOKENS);
    CHECK(ft_data_format_parse("json", &f, &err) == -1 && has(err.msg, "\"json\"") &&
          has(err.msg, "prompt_completion"));
    CHECK(ft_data_format_parse("sharegpt", &f, &err) == 0 && f == FT_DATA_SHAREGPT);
    CHECK(ft_chat_template_parse("auto", &t, &err) == 0 && t == FT_TMPL_AUTO);
    CHECK(ft_chat_template_parse("alpaca", &t, &err) == 0 && t == FT_TMPL_ALPACA);
    /* the family templates written in C are gone: the model's own is rendered */
    CHECK(ft_chat_template_parse("llama3", &t, &err) == -1 && has(err.msg, "auto") &&
          has(err.msg, "own template"));
    CHECK(ft_chat_template_parse("vicuna", &t, &err) == -1 && has(err.msg, "vicuna") &&
          has(err.msg, "chatml"));
}

/* ---- tokens format (no tokenizer) ------------------------------------------------------ */

static void test_tokens_format(void)
{
    const char *p = write_file("tok.jsonl",
                               "{\"input_ids\": [1, 2, 3]}\n"
                               "\n"
                               "{\"input_ids\": [4, 5, 6, 7], \"labels\": [-100, -100, 6, 7]}\n");
    ft_dataset ds;
    ft_err err;
    ft_data_options o = opts(FT_DATA_AUTO);
    CHECK(ft_dataset_load(&ds, p, NULL, &o, &err) == 0);
    CHECK(ds.n == 2 && ds.skipped_lines == 0 && ds.dropped_empty == 0);
    if (ds.n == 2) {
        CHECK(ds.samples[0].n == 3 && ds.samples[0].labels[0] == 1 && ds.samples[0].line == 1);
        CHECK(ds.samples[1].n == 4 && ds.samples[1].labels[1] == -100 &&
              ds.samples[1].labels[3] == 7 && ds.samples[1].line == 3);
    }
    ft_dataset_free(&ds);
    o.train_on_all = true;
    CHECK(ft_dataset_load(&ds, p, NULL, &o, &err) == 0 && ds.n == 2 &&
          ds.samples[1].labels[0] == 4);
    ft_dataset_free(&ds);
}

static void test_tokens_errors(void)
{
    CHECK(load_fails("{\"input_ids\": [1]}\n{\"input_ids\": 3}\n", 0, NULL,
                     "bad.jsonl:2:", "\"input_ids\" is not an array"));
    CHECK(load_fails("{\"input_ids\": []}\n", 0, NULL, "bad.jsonl:1:", "empty \"input_ids\""));
    CHECK(load_fails("{\"input_ids\": [1, \"a\"]}\n", 0, NULL, "bad.jsonl:1:",
                     "input_ids[1] is not an integer"));
    CHECK(load_fails("{\"input_ids\": [1, -2]}\n", 0, NULL, "bad.jsonl:1:", "input_ids[1] = -2"));
    CHECK(load_fails("{\"input_ids\": [1, 2], \"labels\": [1]}\n", 0, NULL, "bad.jsonl:1:",
                     "\"labels\" has 1 entries"));
    CHECK(load_fails("{\"input_ids\": [1, 2], \"labels\": [1, -5]}\n", 0, NULL, "bad.jsonl:1:",
                     "labels[1] = -5"));
    CHECK(load_fails("{\"input_ids\": [1, 2]}\n{\"text\": \"a\"}\n", 0, NULL, "bad.jsonl:2:",
                     "missing \"input_ids\""));
    CHECK(load_fails("{\"input_ids\": [1]}\n\n{\"input_ids\": [1]\n", 0, NULL, "bad.jsonl:3:",
                     "invalid JSON"));
    CHECK(load_fails("[1, 2]\n", 0, NULL, "bad.jsonl:1:", "not a JSON object"));
    CHECK(load_fails("{\"foo\": 1, \"bar\": 2}\n", 0, NULL, "bad.jsonl:1:", "\"foo\", \"bar\""));
    CHECK(load_fails("{\"input_ids\": [1]}\n{\"input_ids\": [\xC3\x28]}\n", 0, NULL,
                     "bad.jsonl:2: invalid UTF-8", NULL));
    /* a format needing a tokenizer, without one */
    CHECK(load_fails("{\"text\": \"a\"}\n", 0, NULL, "bad.jsonl", "needs a tokenizer"));
}

static void test_skip_truncate_drop(void)
{
    const char *p = write_file("mix.jsonl",
                               "{\"input_ids\": [1, 2, 3, 4, 5]}\n"
                               "not json\n"
                               "{\"input_ids\": \"x\"}\n"
                               "{\"input_ids\": [1, 2, 3], \"labels\": [-100, -100, -100]}\n"
                               "{\"input_ids\": [1, 2, 3], \"labels\": [1, -100, -100]}\n"
                               "{\"input_ids\": [1, 2, 3, 4], \"labels\": [-100, -100, -100, 4]}\n"
                               "{\"input_ids\": [9, \xFF]}\n");
    ft_dataset ds;
    ft_err err;
    ft_data_options o = opts(FT_DATA_TOKENS);
    CHECK(ft_dataset_load(&ds, p, NULL, &o, &err) == -1 && has(err.msg, "mix.jsonl:2:"));
    o.skip_bad_lines = true;
    o.max_seq_len = 3;
    CHECK(ft_dataset_load(&ds, p, NULL, &o, &err) == 0);
    /* lines 2, 3, 7 bad; 4 has no label, 5 only a label at position 0, 6 loses its only
     * label to truncation: dropped */
    CHECK(ds.n == 1 && ds.skipped_lines == 3 && ds.dropped_empty == 3);
    if (ds.n == 1)
        CHECK(ds.samples[0].n == 3 && ds.samples[0].line == 1);
    ft_dataset_free(&ds);
}

static void test_split(void)
{
    char text[4096] = "";
    for (int i = 0; i < 20; i++)
        snprintf(text + strlen(text), sizeof text - strlen(text), "{\"input_ids\": [%d, 1]}\n",
                 i);
    const char *p = write_file("split.jsonl", text);
    ft_dataset a, b, ea, eb;
    ft_err err;
    ft_data_options o = opts(FT_DATA_TOKENS);
    CHECK(ft_dataset_load(&a, p, NULL, &o, &err) == 0 && a.n == 20);
    CHECK(ft_dataset_load(&b, p, NULL, &o, &err) == 0);
    CHECK(ft_dataset_split(&a, &ea, 0.25, 7, &err) == 0 && ea.n == 5 && a.n == 15);
    CHECK(ft_dataset_split(&b, &eb, 0.25, 7, &err) == 0 && eb.n == 5);
    bool same = true, seen[20] = {0};
    for (size_t i = 0; i < ea.n && i < eb.n; i++)
        same &= ea.samples[i].ids[0] == eb.samples[i].ids[0];
    CHECK(same);
    for (size_t i = 0; i < a.n; i++)
        seen[a.samples[i].ids[0]] = true;
    for (size_t i = 0; i < ea.n; i++) {
        CHECK(!seen[ea.samples[i].ids[0]]);
        seen[ea.samples[i].ids[0]] = true;
    }
    for (int i = 0; i < 20; i++)
        CHECK(seen[i]);
    ft_dataset_free(&b);
    ft_dataset_free(&eb);
    CHECK(ft_dataset_load(&b, p, NULL, &o, &err) == 0);
    CHECK(ft_dataset_split(&b, &eb, 0.25, 8, &err) == 0);
    same = true;
    for (size_t i = 0; i < ea.n && i < eb.n; i++)
        same &= ea.samples[i].ids[0] == eb.samples[i].ids[0];
    CHECK(!same); /* another seed, another split */
    ft_dataset_free(&eb);
    CHECK(ft_dataset_split(&b, &eb, 0.0001, 8, &err) == 0 && eb.n == 1);
    ft_dataset_free(&eb);
    CHECK(ft_dataset_split(&b, &eb, 1.5, 8, &err) == -1 && has(err.msg, "1.5"));
    ft_dataset_free(&a);
    ft_dataset_free(&ea);
    ft_dataset_free(&b);
}

/* ---- formats with the tokenizer ----------------------------------------------------------- */

static void test_text_format(void)
{
    const char *p = write_file("text.jsonl", "{\"text\": \"hi there\"}\n{\"text\": \"ok</s>\"}\n");
    ft_dataset ds;
    ft_err err;
    ft_data_options o = opts(FT_DATA_AUTO);
    CHECK(ft_dataset_load(&ds, p, tok, &o, &err) == 0 && ds.n == 2);
    ft_ids a = enc("hi there", true), b = enc("ok</s>", true);
    if (ds.n == 2) {
        CHECK((size_t)ds.samples[0].n == a.n + 1 && ds.samples[0].ids[a.n] == 257);
        CHECK(memcmp(ds.samples[0].ids, a.data, a.n * 4) == 0);
        CHECK(memcmp(ds.samples[0].labels, ds.samples[0].ids, a.n * 4) == 0);
        CHECK((size_t)ds.samples[1].n == b.n); /* already ends with EOS */
    }
    ft_dataset_free(&ds);
    o.add_eos = false;
    CHECK(ft_dataset_load(&ds, p, tok, &o, &err) == 0 && (size_t)ds.samples[0].n == a.n);
    ft_dataset_free(&ds);
    ft_ids_free(&a);
    ft_ids_free(&b);
    CHECK(load_fails("{\"text\": \"a\"}\n{\"text\": 5}\n", 0, tok, "bad.jsonl:2:",
                     "\"text\" is not a string"));
}

static void test_prompt_completion(void)
{
    const char *p = write_file("pc.jsonl", "{\"prompt\": \"Q: 2+2?\", \"completion\": \" 4\"}\n");
    ft_dataset ds;
    ft_err err;
    ft_data_options o = opts(FT_DATA_AUTO);
    CHECK(ft_dataset_load(&ds, p, tok, &o, &err) == 0 && ds.n == 1);
    ft_ids full = enc("Q: 2+2? 4", true), pr = enc("Q: 2+2?", true);
    if (ds.n == 1) {
        ft_sample *s = &ds.samples[0];
        CHECK((size_t)s->n == full.n + 1 && s->ids[full.n] == 257);
        for (int i = 0; i < s->n; i++)
            CHECK(s->labels[i] == ((size_t)i < pr.n ? -100 : s->ids[i]));
    }
    ft_dataset_free(&ds);
    o.train_on_all = true;
    CHECK(ft_dataset_load(&ds, p, tok, &o, &err) == 0 && ds.samples[0].labels[1] != -100);
    ft_dataset_free(&ds);
    /* truncation that removes the whole completion drops the sample */
    o.train_on_all = false;
    o.max_seq_len = (int)pr.n;
    CHECK(ft_dataset_load(&ds, p, tok, &o, &err) == 0 && ds.n == 0 && ds.dropped_empty == 1);
    ft_dataset_free(&ds);
    ft_ids_free(&full);
    ft_ids_free(&pr);

    CHECK(load_fails("{\"prompt\": \"a\", \"completion\": \"b\"}\n{\"prompt\": \"a\"}\n",
                     FT_DATA_PROMPT_COMPLETION, tok, "bad.jsonl:2:", "missing \"completion\""));
    CHECK(load_fails("{\"prompt\": \"a\", \"completion\": \"\"}\n", 0, tok, "bad.jsonl:1:",
                     "empty \"completion\""));
    CHECK(load_fails("{\"prompt\": 1, \"completion\": \"x\"}\n", 0, tok, "bad.jsonl:1:",
                     "\"prompt\" is not a string"));
}

static void test_alpaca(void)
{
    const char *p = write_file("al.jsonl",
                               "{\"instruction\": \"Add.\", \"input\": \"2 2\", \"output\": \"4\"}\n"
                               "{\"instruction\": \"Hi.\", \"output\": \"Hello\"}\n");
    ft_dataset ds;
    ft_err err;
    ft_data_options o = opts(FT_DATA_AUTO);
    CHECK(ft_dataset_load(&ds, p, tok, &o, &err) == 0 && ds.n == 2);
    char *pr;
    CHECK(ft_alpaca_prompt("Add.", "2 2", &pr, &err) == 0);
    CHECK(has(pr, "paired with an input") && has(pr, "### Input:\n2 2\n\n### Response:\n"));
    ft_ids pi = enc(pr, true);
    free(pr);
    if (ds.n == 2) {
        CHECK(ds.samples[0].labels[pi.n - 1] == -100 && ds.samples[0].labels[pi.n] == '4');
        CHECK(ds.samples[0].ids[ds.samples[0].n - 1] == 257);
    }
    ft_ids_free(&pi);
    CHECK(ft_alpaca_prompt("Hi.", NULL, &pr, &err) == 0);
    CHECK(!strstr(pr, "### Input") && has(pr, "### Instruction:\nHi.\n\n### Response:\n"));
    free(pr);
    ft_dataset_free(&ds);
    CHECK(load_fails("{\"instruction\": \"a\", \"output\": \"\"}\n", 0, tok, "bad.jsonl:1:",
                     "empty \"output\""));
    CHECK(load_fails("{\"instruction\": \"a\", \"output\": \"b\"}\n{\"instruction\": \"a\", "
                     "\"input\": 3, \"output\": \"b\"}\n", 0, tok, "bad.jsonl:2:",
                     "\"input\" is not a string"));
}

static void test_chat_format(void)
{
    const char *p = write_file(
        "chat.jsonl",
        "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", "
        "\"content\": \"yo\"}, {\"role\": \"user\", \"content\": \"more\"}, {\"role\": "
        "\"assistant\", \"content\": \"ok\"}]}\n");
    ft_dataset ds;
    ft_err err;
    ft_data_options o = opts(FT_DATA_AUTO);
    CHECK(ft_dataset_load(&ds, p, tok, &o, &err) == 0 && ds.n == 1);
    if (ds.n == 1) {
        ft_sample *s = &ds.samples[0];
        const char *text = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
                           "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nyo<|im_end|>\n"
                           "<|im_start|>user\nmore<|im_end|>\n<|im_start|>assistant\nok<|im_end|>\n";
        ft_ids full = enc(text, false);
        CHECK((size_t)s->n == full.n && memcmp(s->ids, full.data, full.n * 4) == 0);
        /* counted: "yo<|im_end|>\n" and "ok<|im_end|>\n" -- 4 tokens each (the template
         * ends a turn with "<|im_end|>\n") */
        int counted = 0;
        for (int i = 0; i < s->n; i++)
            counted += s->labels[i] != -100;
        CHECK(counted == 8);
        int i_end = -1; /* the first <|im_end|> after "yo" */
        for (int i = 0; i + 2 < s->n; i++)
            if (s->ids[i] == 'y' && s->ids[i + 1] == 'o' && s->ids[i + 2] == 259)
                i_end = i + 2;
        CHECK(i_end > 0 && s->labels[i_end] == 259 && s->labels[i_end - 2] == 'y' &&
              s->labels[i_end - 3] == -100 && s->labels[i_end + 1] == '\n' &&
              s->labels[i_end + 2] == -100);
        ft_ids_free(&full);
    }
    ft_dataset_free(&ds);

    static const char u[] = "{\"role\": \"user\", \"content\": \"q\"}";
    static const char a[] = "{\"role\": \"assistant\", \"content\": \"r\"}";
    char text[1024];
    snprintf(text, sizeof text, "{\"messages\": [%s, %s]}\n{\"messages\": []}\n", u, a);
    CHECK(load_fails(text, 0, tok, "bad.jsonl:2:", "empty \"messages\""));
    snprintf(text, sizeof text, "{\"messages\": [%s, %s]}\n{\"messages\": [%s]}\n", u, a, u);
    CHECK(load_fails(text, 0, tok, "bad.jsonl:2:", "no assistant message"));
    /* the template decides what a message may hold: ChatML concatenates the content */
    snprintf(text, sizeof text, "{\"messages\": [%s, {\"role\": \"assistant\", \"content\": 1}]}\n",
             u);
    CHECK(load_fails(text, 0, tok, "bad.jsonl:1:", "line 1"));
    CHECK(load_fails(text, 0, tok, "bad.jsonl:1:", "unsupported operand types for +"));
    snprintf(text, sizeof text, "{\"messages\": [%s, {\"content\": \"x\"}]}\n", u);
    CHECK(load_fails(text, 0, tok, "bad.jsonl:1:", "no \"role\""));
    CHECK(load_fails("{\"messages\": {}}\n", 0, tok, "bad.jsonl:1:", "not an array"));
    /* a template that raises: the line is an error with the template's message, or is
     * skipped with skip_bad_lines */
    snprintf(text, sizeof text, "{\"messages\": [%s, %s]}\n{\"messages\": [%s, %s, %s]}\n", u,
             a, u, a, u);
    p = write_file("m.jsonl", text);
    o.chat_template = FT_TMPL_ALPACA;
    CHECK(ft_dataset_load(&ds, p, tok, &o, &err) == -1 && has(err.msg, "m.jsonl:2:") &&
          has(err.msg, "raise_exception: alpaca chat template: expected an optional system"));
    o.skip_bad_lines = true;
    CHECK(ft_dataset_load(&ds, p, tok, &o, &err) == 0 && ds.n == 1 && ds.skipped_lines == 1);
    ft_dataset_free(&ds);
}

/* ShareGPT records are the chat they map to; an unknown "from" names the line. */
static void test_sharegpt_format(void)
{
    const char *sg = write_file(
        "sg.jsonl",
        "{\"conversations\": [{\"from\": \"system\", \"value\": \"S\"}, {\"from\": \"human\","
        " \"value\": \"hi\"}, {\"from\": \"gpt\", \"value\": \"yo\"}]}\n");
    const char *ch = write_file(
        "ch.jsonl",
        "{\"messages\": [{\"role\": \"system\", \"content\": \"S\"}, {\"role\": \"user\","
        " \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"yo\"}]}\n");
    ft_dataset a, b;
    ft_err err;
    ft_data_options o = opts(FT_DATA_AUTO);
    CHECK(ft_dataset_load(&a, sg, tok, &o, &err) == 0 && a.n == 1);
    CHECK(ft_dataset_load(&b, ch, tok, &o, &err) == 0 && b.n == 1);
    if (a.n == 1 && b.n == 1)
        CHECK(a.samples[0].n == b.samples[0].n &&
              !memcmp(a.samples[0].ids, b.samples[0].ids, (size_t)a.samples[0].n * 4) &&
              !memcmp(a.samples[0].labels, b.samples[0].labels, (size_t)a.samples[0].n * 4));
    ft_dataset_free(&a);
    ft_dataset_free(&b);
    CHECK(load_fails("{\"conversations\": [{\"from\": \"human\", \"value\": \"q\"}, "
                     "{\"from\": \"gpt\", \"value\": \"r\"}]}\n{\"conversations\": [{\"from\": "
                     "\"bot\", \"value\": \"x\"}]}\n", 0, tok, "bad.jsonl:2:",
                     "unknown \"from\": \"bot\""));
    CHECK(load_fails("{\"conversations\": [{\"from\": \"human\"}]}\n", 0, tok, "bad.jsonl:1:",
                     "no \"value\""));
}

/* ---- chat rendering ---------------------------------------------------------------------- */

static char *render(ft_chat_template t, const char *src, const char *msgs, bool agp,
                    ft_err *err)
{
    json_t *m = json_loads(msgs, 0, NULL);
    json_t *special = json_pack("{s:s,s:s}", "bos_token", "<s>", "eos_token", "</s>");
    FT_CHECK(m && special);
    char *out = NULL;
    ft_chat *c;
    if (ft_chat_open_source(&c, t, src, special, err) == 0) {
        if (ft_chat_render(c, m, json_array_size(m), agp, NULL, &out, NULL, NULL, err))
            out = NULL;
        ft_chat_free(c);
    }
    json_decref(special);
    json_decref(m);
    return out;
}

static bool render_is(ft_chat_template t, const char *src, const char *msgs, bool agp,
                      const char *want)
{
    ft_err err = {0};
    char *got = render(t, src, msgs, agp, &err);
    bool ok = got && strcmp(got, want) == 0;
    if (!ok)
        fprintf(stderr, "  render: got \"%s\" (%s)\n  want \"%s\"\n", got ? got : "(error)",
                err.msg, want);
    free(got);
    return ok;
}

/* The fallbacks of ours (chatml, plain, alpaca) and what the renderer hands the model's
 * template (null keys dropped, reasoning aliased, tools and documents none); the model
 * templates themselves are compared with transformers in test_chat_templates.py. */
static void test_render(void)
{
    const char *su = "[{\"role\":\"system\",\"content\":\" S \"},{\"role\":\"user\",\"content\":"
                     "\" hi\\u00a0\"},{\"role\":\"assistant\",\"content\":\"yo \"}]";
    const char *u = "[{\"role\":\"user\",\"content\":\"hi\"}]";
    CHECK(render_is(FT_TMPL_CHATML, NULL, u, true,
                    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"));
    CHECK(render_is(FT_TMPL_CHATML, NULL, su, false,
                    "<|im_start|>system\n S <|im_end|>\n<|im_start|>user\n hi\xC2\xA0<|im_end|>"
                    "\n<|im_start|>assistant\nyo <|im_end|>\n"));
    CHECK(render_is(FT_TMPL_PLAIN, NULL, su, true,
                    "system:  S \nuser:  hi\xC2\xA0\nassistant: yo \nassistant: "));
    CHECK(render_is(FT_TMPL_ALPACA, NULL,
                    "[{\"role\":\"user\",\"content\":\"Do.\"},{\"role\":\"assistant\","
                    "\"content\":\"Done\"}]", false,
                    "Below is an instruction that describes a task. Write a response that "
                    "appropriately completes the request.\n\n### Instruction:\nDo.\n\n"
                    "### Response:\nDone</s>"));
    CHECK(render_is(FT_TMPL_ALPACA, NULL,
                    "[{\"role\":\"system\",\"content\":\"Pre.\"},{\"role\":\"user\","
                    "\"content\":\"Do.\"}]", true,
                    "Pre.\n\n### Instruction:\nDo.\n\n### Response:\n"));
    CHECK(render_is(FT_TMPL_ALPACA, NULL, "[{\"role\":\"user\",\"content\":\"Do.\"}]", false,
                    "Below is an instruction that describes a task. Write a response that "
                    "appropriately completes the request.\n\n### Instruction:\nDo.\n\n"));
    /* the variables transformers gives */
    CHECK(render_is(FT_TMPL_AUTO,
                    "{{ bos_token }}{{ tools is none }}{{ documents is none }}"
                    "{% for m in messages %}|{{ m.role }}:{{ m.content }}:"
                    "{{ m.keys() | list | join(',') }}{% endfor %}{{ add_generation_prompt }}",
                    "[{\"role\":\"user\",\"content\":\"q\",\"name\":null},"
                    "{\"role\":\"assistant\",\"content\":\"a\",\"reasoning\":\"r\"}]", true,
                    "<s>TrueTrue|user:q:role,content|assistant:a:thinking,role,content,"
                    "reasoning,reasoning_contentTrue"));

    ft_err err = {0};
    char *s = render(FT_TMPL_ALPACA, NULL, "[{\"role\":\"user\",\"content\":\"x\"},{\"role\":"
                                         "\"assistant\",\"content\":\"x\"},{\"role\":\"user\","
                                         "\"content\":\"x\"}]", false, &err);
    CHECK(!s && has(err.msg, "alpaca"));
    /* a template that does not compile names its line and column */
    s = render(FT_TMPL_AUTO, "ok\n{% include 'x' %}", u, false, &err);
    CHECK(!s && has(err.msg, "chat template: line 2, column 4") && has(err.msg, "include"));
    /* a model without a template is refused under auto, naming the fallbacks */
    s = render(FT_TMPL_AUTO, NULL, u, false, &err);
    CHECK(!s && has(err.msg, "no chat_template") && has(err.msg, "chatml"));
}

/* A template with {% generation %} marks the labels itself. */
static void test_generation_labels(void)
{
    ft_chat *c;
    ft_err err;
    CHECK(ft_chat_open(&c, FT_TMPL_AUTO, NULL, NULL, tok, &err) == 0 &&
          !ft_chat_has_generation(c, NULL));
    ft_chat_free(c);
    json_t *sp = json_pack("{s:s}", "eos_token", "</s>");
    CHECK(ft_chat_open_source(&c, FT_TMPL_AUTO,
                              "{% for m in messages %}<{{ m.role }}>{% if m.role == 'assistant' %}"
                              "{% generation %}{{ m.content }}{{ eos_token }}{% endgeneration %}"
                              "{% else %}{{ m.content }}{% endif %}{% endfor %}",
                              sp, &err) == 0 && ft_chat_has_generation(c, NULL));
    json_t *m = json_loads("[{\"role\":\"user\",\"content\":\"q\"},"
                           "{\"role\":\"assistant\",\"content\":\"ab\"}]", 0, NULL);
    char *out;
    ft_jinja_span *spans;
    size_t n;
    CHECK(ft_chat_render(c, m, 2, false, NULL, &out, &spans, &n, &err) == 0);
    CHECK(!strcmp(out, "<user>q<assistant>ab</s>") && n == 1 && spans[0].start == 18 &&
          spans[0].end == 24);
    free(out);
    free(spans);
    json_decref(m);
    json_decref(sp);
    ft_chat_free(c);
}

/* A template chosen by name (as apply_chat_template(chat_template=NAME)), template
 * kwargs, and the special tokens the template sees; and the errors of each. */
static void test_chat_choice(void)
{
    char dir[128];
    snprintf(dir, sizeof dir, "%s/named", tmp_dir);
    FT_CHECK(mkdir(dir, 0700) == 0 && write_tokenizer(dir) == 0);
    json_t *cfg = json_pack(
        "{s:s,s:s,s:s,s:s,s:{s:s,s:s},s:s,s:[{s:s,s:s},{s:s,s:s},{s:s,s:s}]}", "bos_token",
        "<s>", "eos_token", "</s>", "sep_token", "<|im_end|>", "image_token", "<|im_start|>",
        "mask_token", "__type", "AddedToken", "content", "</s>", "cls_token", "<s>",
        "chat_template", "name", "default", "template", "D{{ messages | length }}",
        "name", "tool_use", "template", "T{{ tools | length }}", "name", "other", "template",
        "O{{ sep_token }}{{ cls_token }}{{ mask_token }}{{ image_token }}{{ bos_token }}"
        "{{ x if x is defined }}");
    char p[256];
    snprintf(p, sizeof p, "%s/tokenizer_config.json", dir);
    FT_CHECK(json_dump_file(cfg, p, 0) == 0);
    json_decref(cfg);
    ft_tokenizer *t;
    ft_err err = {0};
    FT_CHECK(ft_tokenizer_load(&t, dir, &err) == 0);
    json_t *m = json_loads("[{\"role\":\"user\",\"content\":\"q\"}]", 0, NULL);
    json_t *tools = json_loads("{\"tools\": [{\"name\": \"f\"}, {\"name\": \"g\"}]}", 0, NULL);
    struct {
        const char *name, *kwargs;
        bool tools;
        const char *want;
    } cases[] = {
        {NULL, NULL, false, "D1"},
        {NULL, NULL, true, "T2"}, /* transformers' rule: tool_use for a chat with tools */
        {"", "{}", true, "T2"},
        {"default", NULL, true, "D1"}, /* a name holds for every chat */
        {"other", NULL, false, "O<|im_end|><s></s><|im_start|><s>"},
        {"other", "{\"x\": [1, 2.5, \"s\", null, true, {\"k\": \"v\"}]}", true,
         "O<|im_end|><s></s><|im_start|><s>[1, 2.5, 's', None, True, {'k': 'v'}]"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        ft_chat *c = NULL;
        char *out = NULL;
        CHECK(ft_chat_open(&c, FT_TMPL_AUTO, cases[i].name, cases[i].kwargs, t, &err) == 0);
        if (c && ft_chat_render(c, m, 1, false, cases[i].tools ? tools : NULL, &out, NULL,
                                NULL, &err) == 0) {
            if (strcmp(out, cases[i].want) != 0) {
                fprintf(stderr, "  case %zu: got '%s', want '%s'\n", i, out, cases[i].want);
                CHECK(0);
            }
        } else {
            fprintf(stderr, "  case %zu: %s\n", i, err.msg);
            CHECK(0);
        }
        free(out);
        ft_chat_free(c);
    }
    /* errors */
    ft_chat *c = NULL;
    CHECK(ft_chat_open(&c, FT_TMPL_AUTO, "nope", NULL, t, &err) != 0 && !c &&
          has(err.msg, "no chat template named 'nope'") &&
          has(err.msg, "its templates: default, tool_use, other"));
    CHECK(ft_chat_open(&c, FT_TMPL_CHATML, "other", NULL, t, &err) != 0 &&
          has(err.msg, "chatml") && has(err.msg, "auto"));
    CHECK(ft_chat_open(&c, FT_TMPL_AUTO, "x", NULL, tok, &err) != 0 &&
          has(err.msg, "its templates: default"));
    CHECK(ft_chat_check_name(NULL, FT_TMPL_AUTO, "x", &err) != 0 &&
          has(err.msg, "no chat template at all"));
    static const struct {
        const char *kwargs, *needle;
    } bad[] = {
        {"[1]", "not a JSON object"},
        {"{", "not JSON"},
        {"{\"add_generation_prompt\": true}", "'add_generation_prompt'"},
        {"{\"documents\": []}", "'documents'"},
        {"{\"cls_token\": \"x\"}", "'cls_token'"},
        {"{\"image_token\": \"x\"}", "special token of the tokenizer"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        CHECK(ft_chat_open(&c, FT_TMPL_AUTO, NULL, bad[i].kwargs, t, &err) != 0 && !c &&
              has(err.msg, "chat template kwargs") && has(err.msg, bad[i].needle));
    }
    /* without the tokenizer only the fixed names are known */
    json_t *kw;
    CHECK(ft_chat_kwargs_parse("{\"image_token\": 1}", NULL, &kw, &err) == 0 && kw);
    json_decref(kw);
    /* through the data options */
    const char *data = write_file("named.jsonl", "{\"messages\": [{\"role\": \"user\", "
                                                 "\"content\": \"q\"}, {\"role\": "
                                                 "\"assistant\", \"content\": \"a\"}]}\n");
    ft_data_options o = opts(FT_DATA_CHAT);
    o.train_on_all = true;
    o.chat_template_name = "other";
    o.chat_template_kwargs = "{\"x\": \"!\"}";
    ft_dataset ds;
    CHECK(ft_dataset_load(&ds, data, t, &o, &err) == 0);
    if (ds.n == 1) {
        ft_ids want = enc("O<|im_end|><s></s><|im_start|><s>!", false);
        CHECK(ds.samples[0].n == (int)want.n &&
              !memcmp(ds.samples[0].ids, want.data, want.n * sizeof *want.data));
        ft_ids_free(&want);
    }
    ft_dataset_free(&ds);
    o.chat_template_name = "rag";
    CHECK(ft_dataset_load(&ds, data, t, &o, &err) != 0 && has(err.msg, "named.jsonl") &&
          has(err.msg, "'rag'"));
    json_decref(m);
    json_decref(tools);
    ft_tokenizer_free(t);
}

/* ---- loader ------------------------------------------------------------------------------- */

/* 23 samples: sample i has ids [100+i, 1, 2, ..] of length 1 + i % 5, labels = ids. */
static void make_ds(ft_dataset *ds)
{
    char text[8192] = "";
    for (int i = 0; i < 23; i++) {
        size_t l = strlen(text);
        l += (size_t)snprintf(text + l, sizeof text - l, "{\"input_ids\": [%d", 100 + i);
        for (int k = 0; k < 1 + i % 5; k++)
            l += (size_t)snprintf(text + l, sizeof text - l, ", %d", k + 1);
        snprintf(text + l, sizeof text - l, "]}\n");
    }
    ft_err err;
    ft_data_options o = opts(FT_DATA_TOKENS);
    FT_CHECK(ft_dataset_load(ds, write_file("ld.jsonl", text), NULL, &o, &err) == 0);
    FT_CHECK(ds->n == 23);
}

/* The first ids of every sample in an epoch, in batch order. */
static int order_of(ft_loader *l, int epoch, int *out)
{
    int k = 0;
    ft_err err;
    for (int i = 0; i < ft_loader_n_batches(l, epoch); i++) {
        ft_batch b;
        FT_CHECK(ft_loader_batch(l, epoch, i, &b, &err) == 0);
        for (int r = 0; r < b.B; r++)
            out[k++] = b.input_ids[r * b.T];
    }
    return k;
}

static void test_loader_shuffle_shard(void)
{
    ft_dataset ds;
    make_ds(&ds);
    ft_err err;
    ft_loader_options o = {.batch_size = 4, .shuffle = true, .seed = 11, .world = 1};
    ft_loader *a, *b;
    CHECK(ft_loader_new(&a, &ds, &o, &err) == 0 && ft_loader_new(&b, &ds, &o, &err) == 0);
    int x[32], y[32], z[32];
    CHECK(ft_loader_n_batches(a, 0) == 6);
    int n = order_of(a, 0, x);
    CHECK(n == 23 && order_of(b, 0, y) == 23 && memcmp(x, y, sizeof(int) * 23) == 0);
    CHECK(order_of(a, 1, z) == 23 && memcmp(x, z, sizeof(int) * 23) != 0);
    CHECK(order_of(a, 0, z) == 23 && memcmp(x, z, sizeof(int) * 23) == 0); /* back to epoch 0 */
    bool seen[23] = {0};
    for (int i = 0; i < 23; i++)
        seen[x[i] - 100] = true;
    for (int i = 0; i < 23; i++)
        CHECK(seen[i]);
    ft_loader_free(b);
    o.seed = 12;
    CHECK(ft_loader_new(&b, &ds, &o, &err) == 0 && order_of(b, 0, y) == 23 &&
          memcmp(x, y, sizeof(int) * 23) != 0);
    ft_loader_free(b);
    ft_loader_free(a);

    /* 4 ranks: 5 samples each, disjoint; with the unsharded order interleaved */
    o.seed = 11;
    o.batch_size = 2;
    int all[23], shard[4][8];
    CHECK(ft_loader_new(&a, &ds, &o, &err) == 0 && order_of(a, 3, all) == 23);
    ft_loader_free(a);
    bool used[23] = {0};
    for (int r = 0; r < 4; r++) {
        o.rank = r;
        o.world = 4;
        CHECK(ft_loader_new(&a, &ds, &o, &err) == 0);
        CHECK(ft_loader_n_batches(a, 3) == 3);
        CHECK(order_of(a, 3, shard[r]) == 5);
        for (int k = 0; k < 5; k++) {
            CHECK(shard[r][k] == all[r + 4 * k]);
            CHECK(!used[shard[r][k] - 100]);
            used[shard[r][k] - 100] = true;
        }
        ft_loader_free(a);
    }
    int n_used = 0;
    for (int i = 0; i < 23; i++)
        n_used += used[i];
    CHECK(n_used == 20); /* 23 % 4 = 3 dropped */
    o.rank = 4;
    CHECK(ft_loader_new(&a, &ds, &o, &err) == -1 && has(err.msg, "rank 4"));
    ft_dataset_free(&ds);
}

static void test_loader_padding(void)
{
    ft_dataset ds;
    make_ds(&ds);
    ft_err err;
    ft_loader_options o = {.batch_size = 5, .world = 1, .pad_id = 77};
    ft_loader *l;
    CHECK(ft_loader_new(&l, &ds, &o, &err) == 0);
    ft_batch b;
    CHECK(ft_loader_batch(l, 0, 0, &b, &err) == 0);
    /* samples 0..4 (unshuffled) have lengths 2..6 */
    CHECK(b.B == 5 && b.T == 6 && b.position_ids == NULL);
    CHECK(b.input_ids[0] == 100 && b.input_ids[2] == 77 && b.labels[2] == -100 &&
          b.labels[1] == 1 && b.input_ids[4 * 6 + 5] == 5);
    /* the attention_mask: 1 on row r's 2 + r tokens, 0 on its padding */
    CHECK(b.attention_mask);
    for (int r = 0; r < 5; r++)
        for (int t = 0; t < 6; t++)
            CHECK(b.attention_mask[r * 6 + t] == (t < 2 + r));
    CHECK(ft_loader_batch(l, 0, 4, &b, &err) == 0 && b.B == 3); /* 23 = 4 * 5 + 3 */
    CHECK(ft_loader_batch(l, 0, 5, &b, &err) == -1 && has(err.msg, "out of range"));
    ft_loader_free(l);
    ft_dataset_free(&ds);
}

static void test_loader_packing(void)
{
    ft_dataset ds;
    make_ds(&ds);
    ft_err err;
    ft_loader_options o = {.batch_size = 2, .seq_len = 8, .packing = true, .world = 1,
                           .pad_id = 0};
    ft_loader *l;
    CHECK(ft_loader_new(&l, &ds, &o, &err) == 0);
    ft_batch b;
    CHECK(ft_loader_batch(l, 0, 0, &b, &err) == 0 && b.T == 8 && b.position_ids);
    /* lengths 2,3,4,5,6,2,...: row 0 = [s0 s1] (5) + pad, row 1 = [s2] (4) + pad */
    static const int32_t ids0[8] = {100, 1, 101, 1, 2, 0, 0, 0};
    static const int32_t lab0[8] = {-100, 1, -100, 1, 2, -100, -100, -100};
    static const int32_t pos0[8] = {0, 1, 0, 1, 2, 0, 1, 2};
    CHECK(memcmp(b.input_ids, ids0, sizeof ids0) == 0);
    CHECK(memcmp(b.labels, lab0, sizeof lab0) == 0);
    CHECK(memcmp(b.position_ids, pos0, sizeof pos0) == 0);
    static const int32_t mask0[8] = {1, 1, 1, 1, 1, 0, 0, 0}; /* the row's tail padded */
    CHECK(b.attention_mask && memcmp(b.attention_mask, mask0, sizeof mask0) == 0);
    CHECK(b.input_ids[8] == 102 && b.position_ids[8 + 3] == 3 && b.position_ids[8 + 4] == 0);
    /* every sample appears exactly once over the epoch */
    int total = 0;
    for (int i = 0; i < ft_loader_n_batches(l, 0); i++) {
        CHECK(ft_loader_batch(l, 0, i, &b, &err) == 0);
        for (int t = 0; t < b.B * b.T; t++)
            total += b.input_ids[t] >= 100;
    }
    CHECK(total == 23);
    ft_loader_free(l);
    o.seq_len = 4;
    CHECK(ft_loader_new(&l, &ds, &o, &err) == -1 && has(err.msg, "line 4"));
    /* two ranks agree on the batch count */
    o.seq_len = 8;
    o.world = 2;
    o.shuffle = true;
    int nb[2];
    for (int r = 0; r < 2; r++) {
        o.rank = r;
        CHECK(ft_loader_new(&l, &ds, &o, &err) == 0);
        nb[r] = ft_loader_n_batches(l, 5);
        ft_loader_free(l);
    }
    CHECK(nb[0] == nb[1] && nb[0] > 0);
    ft_dataset_free(&ds);
}

static void test_loader_dump(void)
{
    const char *p = write_file("d.jsonl", "{\"input_ids\": [5, 6]}\n{\"input_ids\": [7]}\n"
                                          "{\"input_ids\": [8, 9]}\n");
    ft_dataset ds;
    ft_err err;
    ft_data_options dopt = opts(FT_DATA_TOKENS);
    CHECK(ft_dataset_load(&ds, p, NULL, &dopt, &err) == 0 && ds.n == 2); /* [7] dropped */
    ft_loader_options o = {.batch_size = 2, .world = 1, .pad_id = 0, .seq_len = 4,
                           .packing = true};
    ft_loader *l;
    CHECK(ft_loader_new(&l, &ds, &o, &err) == 0);
    char path[256];
    snprintf(path, sizeof path, "%s/dump.jsonl", tmp_dir);
    FILE *f = fopen(path, "w");
    CHECK(ft_loader_dump(l, 0, f, &err) == 0);
    fclose(f);
    char buf[512] = "";
    f = fopen(path, "r");
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    fclose(f);
    CHECK(strcmp(buf, "{\"input_ids\": [5, 6, 8, 9], \"labels\": [-100, 6, -100, 9], "
                      "\"position_ids\": [0, 1, 0, 1]}\n") == 0);
    ft_loader_free(l);
    o.packing = false;
    CHECK(ft_loader_new(&l, &ds, &o, &err) == 0);
    f = fopen(path, "w");
    CHECK(ft_loader_dump(l, 0, f, &err) == 0);
    fclose(f);
    f = fopen(path, "r");
    n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    fclose(f);
    CHECK(strcmp(buf, "{\"input_ids\": [5, 6], \"labels\": [5, 6]}\n"
                      "{\"input_ids\": [8, 9], \"labels\": [8, 9]}\n") == 0);
    ft_loader_free(l);
    ft_dataset_free(&ds);
}

int main(void)
{
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/ft_data_XXXXXX");
    if (!mkdtemp(tmp_dir)) {
        perror("mkdtemp");
        return 1;
    }
    ft_err err;
    if (write_tokenizer(tmp_dir) || ft_tokenizer_load(&tok, tmp_dir, &err)) {
        fprintf(stderr, "tiny tokenizer: %s\n", err.msg);
        return 1;
    }
    RUN(test_jsonl_lines);
    RUN(test_jsonl_utf8);
    RUN(test_names);
    RUN(test_tokens_format);
    RUN(test_tokens_errors);
    RUN(test_skip_truncate_drop);
    RUN(test_split);
    RUN(test_text_format);
    RUN(test_prompt_completion);
    RUN(test_alpaca);
    RUN(test_chat_format);
    RUN(test_sharegpt_format);
    RUN(test_render);
    RUN(test_generation_labels);
    RUN(test_chat_choice);
    RUN(test_loader_shuffle_shard);
    RUN(test_loader_padding);
    RUN(test_loader_packing);
    RUN(test_loader_dump);
    ft_tokenizer_free(tok);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp_dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", tmp_dir);
    return check_summary("data");
}
