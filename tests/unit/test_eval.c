/* Evaluation: ROUGE-L and exact match against hand-computed values, greedy generation
 * (stops at EOS and at max_new_tokens, every token the argmax of a full forward), the
 * evaluation loss against a mean over counted tokens computed here from the logits, and
 * the prompt / reference records of the generation path. The tiny llama and the tiny
 * byte-level BPE tokenizer are written by the test. Comparisons with transformers and
 * rouge_score are in tests/conformance/test_eval.py. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "tiny_model.h"
#include "data/data.h"
#include "eval/eval_records.h"
#include "eval/evaluate.h"
#include "core/fsutil.h"
#include "model/generate.h"
#include "model/model.h"
#include "core/rng.h"
#include "eval/rouge.h"
#include "formats/safetensors.h"
#include "tokenizer/tokenizer.h"

enum { EOS = 1 };

static char root[256], model_dir[300];

/* ---- fixtures ----------------------------------------------------------------------- */

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

/* A tiny random llama (vocab V, eos_token_id EOS) and, beside it, a byte-level BPE
 * tokenizer with the same vocabulary size: <s> 0, </s> 1, the letters a..z 2..27, "Ġ"
 * (the byte-level space) 28, and three merges: "a b" -> "ab" 29, "Ġ a" -> "Ġa" 30,
 * "ab c" -> "abc" 31. */
static void write_model_and_tokenizer(const char *dir)
{
    char path[512], cfg[96];
    snprintf(cfg, sizeof cfg, ", \"bos_token_id\": 0, \"eos_token_id\": %d", EOS);
    tiny_model_opts o = {.extra_cfg = cfg, .seed = 17, .scale = 1.2f};
    write_tiny_model(dir, &o);

    char vocab[1024] = "\"<s>\": 0, \"</s>\": 1";
    for (int c = 0; c < 26; c++) {
        size_t l = strlen(vocab);
        snprintf(vocab + l, sizeof vocab - l, ", \"%c\": %d", 'a' + c, 2 + c);
    }
    size_t l = strlen(vocab);
    snprintf(vocab + l, sizeof vocab - l,
             ", \"\\u0120\": 28, \"ab\": 29, \"\\u0120a\": 30, \"abc\": 31");
    char json[4096];
    snprintf(json, sizeof json,
             "{\"version\": \"1.0\", \"truncation\": null, \"padding\": null,\n"
             " \"added_tokens\": [\n"
             "  {\"id\": 0, \"content\": \"<s>\", \"single_word\": false, \"lstrip\": false,"
             " \"rstrip\": false, \"normalized\": false, \"special\": true},\n"
             "  {\"id\": 1, \"content\": \"</s>\", \"single_word\": false, \"lstrip\": false,"
             " \"rstrip\": false, \"normalized\": false, \"special\": true}],\n"
             " \"normalizer\": null,\n"
             " \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false,"
             " \"trim_offsets\": true, \"use_regex\": true},\n"
             " \"post_processor\": null,\n"
             " \"decoder\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true,"
             " \"trim_offsets\": true, \"use_regex\": true},\n"
             " \"model\": {\"type\": \"BPE\", \"dropout\": null, \"unk_token\": null,"
             " \"continuing_subword_prefix\": null, \"end_of_word_suffix\": null,"
             " \"fuse_unk\": false, \"byte_fallback\": false,\n"
             "  \"vocab\": {%s},\n"
             "  \"merges\": [\"a b\", \"\\u0120 a\", \"ab c\"]}}\n",
             vocab);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    write_text(path, json);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    write_text(path, "{\"bos_token\": \"<s>\", \"eos_token\": \"</s>\"}\n");
}

static ft_model *load_model(void)
{
    ft_model_options opt = {.mode = FT_TRAIN_NONE};
    ft_model *m = NULL;
    ft_err err;
    if (ft_model_load(&m, model_dir, &opt, &err))
        fprintf(stderr, "  load: %s\n", err.msg);
    return m;
}

/* ---- ROUGE-L and exact match ------------------------------------------------------------ */

static double rl(const char *ref, const char *pred)
{
    double f = -1;
    ft_err err;
    CHECK(ft_rouge_l(ref, pred, &f, &err) == 0);
    return f;
}

static void test_rouge_l(void)
{
    CHECK_CLOSE(rl("the cat sat on the mat", "the cat sat on the mat"), 1.0, 1e-12);
    /* case and punctuation do not count: lower + [^a-z0-9] -> space */
    CHECK_CLOSE(rl("Hello, World!", "hello world"), 1.0, 1e-12);
    CHECK_CLOSE(rl("the cat", "a dog"), 0.0, 1e-12);
    /* LCS "the cat on mat" = 4 of 6 and 6: P = R = 2/3 */
    CHECK_CLOSE(rl("the cat sat on the mat", "the cat lay on a mat"), 2.0 / 3.0, 1e-12);
    /* LCS "a c" = 2: P = 2/2, R = 2/4, F = 2 * 1 * 0.5 / 1.5 */
    CHECK_CLOSE(rl("a b c d", "a c"), 2.0 / 3.0, 1e-12);
    /* LCS "b d" = 2 of pred 3 and ref 4: P = 2/3, R = 1/2, F = 4/7 */
    CHECK_CLOSE(rl("a b c d", "b x d"), 4.0 / 7.0, 1e-12);
    /* order matters: "c b a" vs "a b c" has LCS 1: F = 1/3 */
    CHECK_CLOSE(rl("a b c", "c b a"), 1.0 / 3.0, 1e-12);
    /* empty on either side (or only separators) is 0, as rouge_score returns */
    CHECK_CLOSE(rl("", ""), 0.0, 1e-12);
    CHECK_CLOSE(rl("", "x"), 0.0, 1e-12);
    CHECK_CLOSE(rl("x", ""), 0.0, 1e-12);
    CHECK_CLOSE(rl("!!! ...", "x"), 0.0, 1e-12);
    /* non-ASCII letters are separators: "caf\u00e9" -> "caf"; digits are tokens */
    CHECK_CLOSE(rl("caf\xc3\xa9 42", "caf 42"), 1.0, 1e-12);
    CHECK_CLOSE(rl("\xe6\x97\xa5\xe6\x9c\xac", "\xe8\xaa\x9e"), 0.0, 1e-12);
}

static void test_exact_match(void)
{
    CHECK(ft_exact_match("  foo bar\n", "foo bar"));
    CHECK(ft_exact_match("", " \t\n"));
    CHECK(!ft_exact_match("foo", "Foo"));
    CHECK(!ft_exact_match("foo  bar", "foo bar"));
    CHECK(ft_exact_match("\xc2\xa0x\xe3\x80\x80", "x")); /* U+00A0, U+3000 strip */
}

/* ---- greedy generation ------------------------------------------------------------------ */

static int32_t argmax_of(const float *x)
{
    int b = 0;
    for (int i = 1; i < V; i++)
        if (x[i] > x[b])
            b = i;
    return b;
}

static void test_generate_max_new_tokens(void)
{
    ft_model *m = load_model();
    CHECK(m != NULL);
    if (!m)
        return;
    ft_err err;
    const int32_t prompt[] = {0, 5, 9, 30};
    ft_gen_options o = {.max_new_tokens = 7, .n_eos = 0};
    ft_ids out = {0};
    bool eos = true;
    CHECK(ft_generate_greedy(m, prompt, 4, &o, &out, &eos, &err) == 0);
    CHECK(out.n == 7 && !eos);
    /* every token is the argmax of the last position of a forward over what precedes it */
    int32_t seq[16];
    memcpy(seq, prompt, sizeof prompt);
    for (size_t i = 0; i < out.n; i++) {
        ft_batch b = {.B = 1, .T = 4 + (int)i, .input_ids = seq};
        CHECK(ft_model_forward(m, &b, NULL, NULL, &err) == 0);
        int32_t want = argmax_of(ft_model_logits(m) + (size_t)(b.T - 1) * V);
        CHECK(out.data[i] == want);
        seq[b.T] = out.data[i];
    }
    /* an empty prompt is an error, not a crash */
    ft_ids none = {0};
    CHECK(ft_generate_greedy(m, prompt, 0, &o, &none, NULL, &err) == -1);
    CHECK(strstr(err.msg, "empty prompt") != NULL);
    ft_ids_free(&none);
    ft_ids_free(&out);
    ft_model_free(m);
}

static void test_generate_stops_at_eos(void)
{
    ft_model *m = load_model();
    CHECK(m != NULL);
    if (!m)
        return;
    ft_err err;
    const int32_t prompt[] = {0, 12, 3};
    ft_gen_options o = {.max_new_tokens = 12, .n_eos = 0};
    ft_ids all = {0}, cut = {0};
    CHECK(ft_generate_greedy(m, prompt, 3, &o, &all, NULL, &err) == 0);
    CHECK(all.n == 12);
    if (all.n != 12)
        return;
    /* Declare the third generated token an end-of-sequence id: generation must stop at
     * its first occurrence, with it included, and produce the same ids before it. */
    int32_t stop = all.data[2];
    size_t k = 0;
    while (all.data[k] != stop)
        k++;
    o.eos[0] = 27; /* an id that does not stop it ... */
    o.eos[1] = stop;
    o.n_eos = all.data[0] == 27 || all.data[1] == 27 ? 1 : 2;
    if (o.n_eos == 1)
        o.eos[0] = stop;
    bool eos = false;
    CHECK(ft_generate_greedy(m, prompt, 3, &o, &cut, &eos, &err) == 0);
    CHECK(eos);
    CHECK(cut.n == k + 1);
    for (size_t i = 0; i < cut.n && i < all.n; i++)
        CHECK(cut.data[i] == all.data[i]);
    /* the EOS ids: config.json's and the tokenizer's, once each */
    ft_tokenizer *tok = NULL;
    CHECK(ft_tokenizer_load(&tok, model_dir, &err) == 0);
    ft_gen_options e = {0};
    ft_gen_eos_ids(ft_model_cfg(m), tok, &e);
    CHECK(e.n_eos == 1 && e.eos[0] == EOS);
    ft_tokenizer_free(tok);
    ft_ids_free(&all);
    ft_ids_free(&cut);
    ft_model_free(m);
}

/* ---- loss ------------------------------------------------------------------------------- */

/* Sum over counted tokens of -log softmax(logits[t-1])[label[t]], in double, from the
 * model's logits of one sample run alone. */
static double ref_sample_loss(ft_model *m, const ft_sample *s, long *count)
{
    ft_err err;
    ft_batch b = {.B = 1, .T = s->n, .input_ids = s->ids, .labels = s->labels};
    CHECK(ft_model_forward(m, &b, NULL, NULL, &err) == 0);
    const float *lg = ft_model_logits(m);
    double sum = 0;
    for (int t = 1; t < s->n; t++) {
        if (s->labels[t] == -100)
            continue;
        const float *x = lg + (size_t)(t - 1) * V;
        double mx = x[0], z = 0;
        for (int v = 1; v < V; v++)
            mx = fmax(mx, x[v]);
        for (int v = 0; v < V; v++)
            z += exp(x[v] - mx);
        sum += -(x[s->labels[t]] - mx - log(z));
        (*count)++;
    }
    return sum;
}

static void test_loss_mean_over_counted(void)
{
    ft_model *m = load_model();
    CHECK(m != NULL);
    if (!m)
        return;
    /* five samples of different lengths, with masked labels (a prompt, a hole) */
    enum { NS = 5 };
    static int32_t ids[NS][9], lab[NS][9];
    const int lens[NS] = {9, 3, 6, 2, 7};
    ft_sample smp[NS];
    for (int i = 0; i < NS; i++) {
        for (int t = 0; t < lens[i]; t++) {
            ids[i][t] = (int32_t)(ft_mix64(100 * i + t) % V);
            lab[i][t] = t < i % 3 || (i == 4 && t == 4) ? -100 : ids[i][t];
        }
        smp[i] = (ft_sample){.ids = ids[i], .labels = lab[i], .n = lens[i], .line = i + 1};
    }
    ft_dataset ds = {.samples = smp, .n = NS};
    double want_sum = 0;
    long want_n = 0;
    for (int i = 0; i < NS; i++)
        want_sum += ref_sample_loss(m, &smp[i], &want_n);
    double want = want_sum / (double)want_n;
    ft_err err;
    for (int bs = 1; bs <= 6; bs++) {
        ft_eval_loss r;
        CHECK(ft_eval_loss_run(m, &ds, bs, 0, NULL, &r, &err) == 0);
        CHECK(r.tokens == want_n);
        CHECK(r.samples == NS);
        CHECK_CLOSE(r.loss, want, 1e-6);
        CHECK_CLOSE(r.perplexity, exp(want), 1e-5);
    }
    ft_dataset empty = {0};
    ft_eval_loss r;
    CHECK(ft_eval_loss_run(m, &empty, 2, 0, NULL, &r, &err) == -1);
    ft_model_free(m);
}

/* ---- records and the generation run ---------------------------------------------------- */

static void test_records_and_generate_run(void)
{
    ft_err err;
    ft_tokenizer *tok = NULL;
    CHECK(ft_tokenizer_load(&tok, model_dir, &err) == 0);
    ft_model *m = load_model();
    CHECK(m != NULL);
    if (!tok || !m) {
        ft_tokenizer_free(tok);
        ft_model_free(m);
        return;
    }
    char path[400], pred_path[400];
    snprintf(path, sizeof path, "%s/pc.jsonl", root);
    /* line 2 is blank; line 4's completion is truncated away (dropped by max_seq_len) */
    write_text(path, "{\"prompt\": \"ab abc\", \"completion\": \" cab\"}\n"
                     "\n"
                     "{\"prompt\": \"xyz\", \"completion\": \" abc\"}\n"
                     "{\"prompt\": \"abcabcabcabcabcabcabcabc\", \"completion\": \" q\"}\n");
    ft_data_options o = {.max_seq_len = 8, .add_eos = true};
    ft_dataset ds;
    CHECK(ft_dataset_load(&ds, path, tok, &o, &err) == 0);
    CHECK(ds.n == 2 && ds.dropped_empty == 1);
    ft_eval_records recs;
    CHECK(ft_eval_records_load(&recs, path, tok, &o, &ds, &err) == 0);
    CHECK(recs.n == 2);
    if (recs.n == 2) {
        CHECK(recs.r[0].line == 1 && recs.r[1].line == 3);
        CHECK(strcmp(recs.r[0].prompt, "ab abc") == 0);
        CHECK(strcmp(recs.r[1].reference, " abc") == 0);
        /* "ab abc" -> "ab" "Ġ" "abc" (the "Ġ a" merge loses to "a b") */
        CHECK(recs.r[0].n_ids == 3 && recs.r[0].ids[0] == 29 && recs.r[0].ids[1] == 28 &&
              recs.r[0].ids[2] == 31);
        /* the prompt ids are the ones the data pipeline masked */
        for (int t = 0; t < recs.r[0].n_ids; t++)
            CHECK(ds.samples[0].ids[t] == recs.r[0].ids[t] && ds.samples[0].labels[t] == -100);
    }
    snprintf(pred_path, sizeof pred_path, "%s/pred.jsonl", root);
    FILE *pf = fopen(pred_path, "w");
    ft_gen_options go = {.max_new_tokens = 4};
    ft_gen_eos_ids(ft_model_cfg(m), tok, &go);
    ft_eval_gen g;
    CHECK(ft_eval_generate_run(m, tok, &recs, &go, pf, NULL, &g, &err) == 0);
    fclose(pf);
    CHECK(g.generated == 2);
    CHECK(g.rouge_l >= 0 && g.rouge_l <= 1 && g.exact_match >= 0 && g.exact_match <= 1);
    /* each prediction is the decoded greedy continuation */
    FILE *f = fopen(pred_path, "r");
    char line[4096];
    int lines = 0;
    while (f && fgets(line, sizeof line, f)) {
        lines++;
        CHECK(strstr(line, "\"prediction\"") && strstr(line, "\"rougeL\"") &&
              strstr(line, "\"reference\"") && strstr(line, "\"prompt\""));
    }
    if (f)
        fclose(f);
    CHECK(lines == 2);
    if (recs.n == 2) {
        ft_ids out = {0};
        bool eos;
        CHECK(ft_generate_greedy(m, recs.r[0].ids, recs.r[0].n_ids, &go, &out, &eos, &err) == 0);
        char *text;
        size_t len;
        CHECK(ft_tokenizer_decode(tok, out.data, eos ? out.n - 1 : out.n, true, &text, &len,
                                  &err) == 0);
        double f1;
        CHECK(ft_rouge_l(" cab", text, &f1, &err) == 0);
        ft_eval_records one = {.r = recs.r, .n = 1};
        ft_eval_gen g1;
        CHECK(ft_eval_generate_run(m, tok, &one, &go, NULL, NULL, &g1, &err) == 0);
        CHECK_CLOSE(g1.rouge_l, f1, 1e-12);
        CHECK(g1.new_tokens == (long)out.n);
        free(text);
        ft_ids_free(&out);
    }
    ft_eval_records_free(&recs);
    ft_dataset_free(&ds);

    /* text records have no reference: an error naming the file */
    snprintf(path, sizeof path, "%s/text.jsonl", root);
    write_text(path, "{\"text\": \"abc\"}\n");
    CHECK(ft_eval_records_load(&recs, path, tok, &o, NULL, &err) == -1);
    CHECK(strstr(err.msg, "text.jsonl") && strstr(err.msg, "prompt"));
    ft_model_free(m);
    ft_tokenizer_free(tok);
}

static void test_err_replace(void)
{
    ft_err e;
    snprintf(e.msg, sizeof e.msg, "/tmp/x-123:4: bad; /tmp/x-123 again");
    ft_err_replace(&e, "/tmp/x-123", "<stdin>");
    CHECK(strcmp(e.msg, "<stdin>:4: bad; <stdin> again") == 0);
}

int main(void)
{
    snprintf(root, sizeof root, "/tmp/ft-test-eval-XXXXXX");
    if (!mkdtemp(root)) {
        perror("mkdtemp");
        return 1;
    }
    snprintf(model_dir, sizeof model_dir, "%s/model", root);
    write_model_and_tokenizer(model_dir);
    RUN(test_rouge_l);
    RUN(test_exact_match);
    RUN(test_generate_max_new_tokens);
    RUN(test_generate_stops_at_eos);
    RUN(test_loss_mean_over_counted);
    RUN(test_records_and_generate_run);
    RUN(test_err_replace);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", root);
    return check_summary("eval");
}
