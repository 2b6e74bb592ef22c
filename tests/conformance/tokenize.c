/* ft-tokenize: a command-line harness over lib/tokenizer/tokenizer.h, for the tokenizer
 * conformance suite (tests/conformance/test_tokenizer.py) and the benchmark
 * (tests/bench/bench_tokenizer.py).
 *
 *   ft-tokenize encode TOKENIZER_PATH [--no-special] [--raw] < lines
 *       Each input line is a JSON string (or, with --raw, the line's raw bytes without
 *       its newline); prints one JSON array of ids per line.
 *   ft-tokenize decode TOKENIZER_PATH [--skip-special] < ids.jsonl
 *       Each input line is a JSON array of ids; prints one JSON string per line.
 *   ft-tokenize tokens TOKENIZER_PATH < ids.jsonl
 *       Each input line is a JSON array of ids; prints the JSON array of their token
 *       strings (null where an id is out of range).
 *   ft-tokenize info TOKENIZER_PATH [TOKEN...]
 *       Prints one JSON object: vocab_size, bos/eos/pad ids, bos/eos tokens, adds_bos,
 *       chat_template, and "token_ids" {TOKEN: id or -1} for the tokens named.
 *   ft-tokenize bench TOKENIZER_PATH FILE [--repeat N]
 *       Splits FILE into lines (each keeping its newline), encodes each line separately
 *       without special tokens, N times over, and prints one JSON line
 *       {"bytes","repeat","seconds","mb_per_s","tokens"}: bytes of FILE, seconds for all
 *       N passes (CLOCK_MONOTONIC), MB/s = bytes * N / seconds / 1e6, tokens per pass.
 *
 * With FT_TOKENIZE_ADD set to a JSON array of strings, every command loads the tokenizer
 * with those tokens added as special tokens (ft_tokenizer_load_adding).
 *
 * Errors: "ft-tokenize: error: <msg>" on stderr, exit status 1. */
#include <jansson.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tokenizer/tokenizer.h"

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

static void die(const char *fmt, ...)
{
    va_list ap;
    fflush(stdout);
    fputs("ft-tokenize: error: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(1);
}

static void usage(void)
{
    fputs("usage: ft-tokenize encode TOKENIZER_PATH [--no-special] [--raw] < lines\n"
          "       ft-tokenize decode TOKENIZER_PATH [--skip-special] < ids.jsonl\n"
          "       ft-tokenize tokens TOKENIZER_PATH < ids.jsonl\n"
          "       ft-tokenize info TOKENIZER_PATH [TOKEN...]\n"
          "       ft-tokenize bench TOKENIZER_PATH FILE [--repeat N]\n",
          stderr);
    exit(1);
}

/* FT_TOKENIZE_ADD (a JSON array of strings): tokens added as special tokens on load
 * (ft_tokenizer_load_adding, as run config model.add_special_tokens adds them). */
static ft_tokenizer *load(const char *path)
{
    ft_tokenizer *t = NULL;
    ft_err err = {0};
    const char *add = getenv("FT_TOKENIZE_ADD");
    if ((add && add[0] ? ft_tokenizer_load_adding(&t, path, add, &err)
                       : ft_tokenizer_load(&t, path, &err)) != 0)
        die("%s", err.msg);
    return t;
}

/* Strips the trailing "\n" from a getline() line. */
static size_t chomp(char *line, size_t n)
{
    if (n && line[n - 1] == '\n')
        line[--n] = 0;
    return n;
}

static void print_ids(const ft_ids *ids)
{
    putchar('[');
    for (size_t i = 0; i < ids->n; i++)
        printf(i ? ",%d" : "%d", (int)ids->data[i]);
    fputs("]\n", stdout);
}

static int cmd_encode(int argc, char **argv)
{
    bool add_special = true, raw = false;
    for (int i = 3; i < argc; i++) {
        if (!strcmp(argv[i], "--no-special"))
            add_special = false;
        else if (!strcmp(argv[i], "--raw"))
            raw = true;
        else
            die("encode: unknown option '%s'", argv[i]);
    }
    ft_tokenizer *t = load(argv[2]);
    char *line = NULL;
    size_t cap = 0;
    ssize_t got;
    long lineno = 0;
    ft_ids ids = {0};
    ft_err err = {0};
    while ((got = getline(&line, &cap, stdin)) >= 0) {
        lineno++;
        size_t n = (size_t)got;
        const char *text;
        size_t len;
        json_t *js = NULL;
        if (raw) {
            /* Only the newline is stripped: a "\r" is part of the text. */
            if (n && line[n - 1] == '\n')
                line[--n] = 0;
            text = line;
            len = n;
        } else {
            json_error_t jerr;
            n = chomp(line, n);
            js = json_loadb(line, n, JSON_DECODE_ANY | JSON_ALLOW_NUL, &jerr);
            if (!js)
                die("stdin line %ld: %s", lineno, jerr.text);
            if (!json_is_string(js))
                die("stdin line %ld: expected a JSON string", lineno);
            text = json_string_value(js);
            len = json_string_length(js);
        }
        ids.n = 0;
        if (ft_tokenizer_encode(t, text, len, add_special, &ids, &err) != 0)
            die("stdin line %ld: %s", lineno, err.msg);
        print_ids(&ids);
        json_decref(js);
    }
    free(line);
    ft_ids_free(&ids);
    ft_tokenizer_free(t);
    return 0;
}

/* Parses a JSON array of ids from one input line into *ids (cleared first). */
static void parse_ids(char *line, size_t n, long lineno, ft_ids *ids)
{
    json_error_t jerr;
    json_t *js = json_loadb(line, n, 0, &jerr);
    if (!js)
        die("stdin line %ld: %s", lineno, jerr.text);
    if (!json_is_array(js))
        die("stdin line %ld: expected a JSON array of ids", lineno);
    ids->n = 0;
    size_t i;
    json_t *v;
    json_array_foreach(js, i, v) {
        if (!json_is_integer(v))
            die("stdin line %ld: element %zu is not an integer", lineno, i);
        json_int_t x = json_integer_value(v);
        if (x < INT32_MIN || x > INT32_MAX)
            die("stdin line %ld: id %lld does not fit in int32", lineno, (long long)x);
        if (ft_ids_push(ids, (int32_t)x) != 0)
            die("out of memory");
    }
    json_decref(js);
}

static int cmd_decode(int argc, char **argv)
{
    bool skip = false;
    for (int i = 3; i < argc; i++) {
        if (!strcmp(argv[i], "--skip-special"))
            skip = true;
        else
            die("decode: unknown option '%s'", argv[i]);
    }
    ft_tokenizer *t = load(argv[2]);
    char *line = NULL;
    size_t cap = 0;
    ssize_t got;
    long lineno = 0;
    ft_ids ids = {0};
    ft_err err = {0};
    while ((got = getline(&line, &cap, stdin)) >= 0) {
        lineno++;
        size_t n = chomp(line, (size_t)got);
        parse_ids(line, n, lineno, &ids);
        char *text = NULL;
        size_t len = 0;
        if (ft_tokenizer_decode(t, ids.data, ids.n, skip, &text, &len, &err) != 0)
            die("stdin line %ld: %s", lineno, err.msg);
        if (text[len] != 0)
            die("stdin line %ld: decoded text is not NUL-terminated at its length", lineno);
        json_t *js = json_stringn(text, len);
        if (!js)
            die("stdin line %ld: decoded text is not valid UTF-8", lineno);
        char *out = json_dumps(js, JSON_ENCODE_ANY | JSON_COMPACT);
        if (!out)
            die("out of memory");
        puts(out);
        free(out);
        json_decref(js);
        free(text);
    }
    free(line);
    ft_ids_free(&ids);
    ft_tokenizer_free(t);
    return 0;
}

static int cmd_tokens(int argc, char **argv)
{
    if (argc != 3)
        usage();
    ft_tokenizer *t = load(argv[2]);
    char *line = NULL;
    size_t cap = 0;
    ssize_t got;
    long lineno = 0;
    ft_ids ids = {0};
    while ((got = getline(&line, &cap, stdin)) >= 0) {
        lineno++;
        size_t n = chomp(line, (size_t)got);
        parse_ids(line, n, lineno, &ids);
        json_t *arr = json_array();
        for (size_t i = 0; i < ids.n; i++) {
            const char *tok = ft_tokenizer_id_to_token(t, ids.data[i]);
            json_t *s = tok ? json_string(tok) : json_null();
            if (!s)
                die("stdin line %ld: token of id %d is not valid UTF-8", lineno,
                    (int)ids.data[i]);
            json_array_append_new(arr, s);
        }
        char *out = json_dumps(arr, JSON_COMPACT);
        puts(out);
        free(out);
        json_decref(arr);
    }
    free(line);
    ft_ids_free(&ids);
    ft_tokenizer_free(t);
    return 0;
}

static json_t *str_or_null(const char *s)
{
    json_t *j = s ? json_string(s) : json_null();
    if (!j)
        die("a tokenizer string is not valid UTF-8");
    return j;
}

static int cmd_info(int argc, char **argv)
{
    ft_tokenizer *t = load(argv[2]);
    json_t *o = json_object();
    json_object_set_new(o, "vocab_size", json_integer(ft_tokenizer_vocab_size(t)));
    json_object_set_new(o, "bos_id", json_integer(ft_tokenizer_bos_id(t)));
    json_object_set_new(o, "eos_id", json_integer(ft_tokenizer_eos_id(t)));
    json_object_set_new(o, "pad_id", json_integer(ft_tokenizer_pad_id(t)));
    json_object_set_new(o, "bos_token", str_or_null(ft_tokenizer_bos_token(t)));
    json_object_set_new(o, "eos_token", str_or_null(ft_tokenizer_eos_token(t)));
    json_object_set_new(o, "adds_bos", json_boolean(ft_tokenizer_adds_bos(t)));
    json_object_set_new(o, "chat_template", str_or_null(ft_tokenizer_chat_template(t)));
    json_t *ti = json_object();
    for (int i = 3; i < argc; i++)
        json_object_set_new(ti, argv[i], json_integer(ft_tokenizer_token_to_id(t, argv[i])));
    json_object_set_new(o, "token_ids", ti);
    char *out = json_dumps(o, JSON_COMPACT);
    puts(out);
    free(out);
    json_decref(o);
    ft_tokenizer_free(t);
    return 0;
}

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        die("%s: cannot open", path);
    size_t cap = 1 << 20, n = 0;
    char *buf = malloc(cap + 1);
    if (!buf)
        die("out of memory");
    size_t got;
    while ((got = fread(buf + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap) {
            cap *= 2;
            char *nb = realloc(buf, cap + 1);
            if (!nb)
                die("out of memory");
            buf = nb;
        }
    }
    if (ferror(f))
        die("%s: read error", path);
    fclose(f);
    buf[n] = 0;
    *len = n;
    return buf;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmd_bench(int argc, char **argv)
{
    if (argc < 4)
        usage();
    long repeat = 1;
    for (int i = 4; i < argc; i++) {
        if (!strcmp(argv[i], "--repeat") && i + 1 < argc) {
            char *end;
            repeat = strtol(argv[++i], &end, 10);
            if (*end || repeat < 1)
                die("bench: --repeat wants a positive integer, not '%s'", argv[i]);
        } else {
            die("bench: unknown option '%s'", argv[i]);
        }
    }
    ft_tokenizer *t = load(argv[2]);
    size_t len;
    char *text = read_file(argv[3], &len);
    ft_ids ids = {0};
    ft_err err = {0};
    size_t tokens = 0;
    double t0 = now_s();
    for (long r = 0; r < repeat; r++) {
        tokens = 0;
        size_t pos = 0;
        long lineno = 0;
        while (pos < len) {
            const char *nl = memchr(text + pos, '\n', len - pos);
            size_t end = nl ? (size_t)(nl - text) + 1 : len;
            lineno++;
            ids.n = 0;
            if (ft_tokenizer_encode(t, text + pos, end - pos, false, &ids, &err) != 0)
                die("%s: line %ld: %s", argv[3], lineno, err.msg);
            tokens += ids.n;
            pos = end;
        }
    }
    double secs = now_s() - t0;
    double mbs = secs > 0 ? (double)len * (double)repeat / secs / 1e6 : 0.0;
    printf("{\"bytes\":%zu,\"repeat\":%ld,\"seconds\":%.6f,\"mb_per_s\":%.3f,\"tokens\":%zu}\n",
           len, repeat, secs, mbs, tokens);
    free(text);
    ft_ids_free(&ids);
    ft_tokenizer_free(t);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 3)
        usage();
    const char *cmd = argv[1];
    if (!strcmp(cmd, "encode"))
        return cmd_encode(argc, argv);
    if (!strcmp(cmd, "decode"))
        return cmd_decode(argc, argv);
    if (!strcmp(cmd, "tokens"))
        return cmd_tokens(argc, argv);
    if (!strcmp(cmd, "info"))
        return cmd_info(argc, argv);
    if (!strcmp(cmd, "bench"))
        return cmd_bench(argc, argv);
    usage();
}
