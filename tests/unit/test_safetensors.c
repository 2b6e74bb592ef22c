/* Unit tests of lib/formats/safetensors.c: write/read round trips (single file and sharded),
 * byte-exact agreement with the reference writer's own test vectors, every rejection
 * of the reference reader on files built byte by byte, a mutation fuzz, and the
 * fp16/bf16 conversions (against the compiler's _Float16 where it has one). */
#include <dirent.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "fifo_guard.h"
#include "formats/safetensors.h"

static char tmp_dir[64];

/* "<tmp_dir>/<name>" into buf. */
static void tmp_path(char *buf, size_t cap, const char *name)
{
    snprintf(buf, cap, "%s/%s", tmp_dir, name);
}

static bool write_bytes(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return false;
    bool ok = fwrite(p, 1, n, f) == n;
    return fclose(f) == 0 && ok;
}

static unsigned char *read_all(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *p = malloc(len > 0 ? (size_t)len : 1);
    if (p && fread(p, 1, (size_t)len, f) != (size_t)len) {
        free(p);
        p = NULL;
    }
    fclose(f);
    *n = (size_t)len;
    return p;
}

static bool file_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* A safetensors file: u64 LE header length, the header as given, then data_len
 * bytes 0, 1, 2, ... */
static bool write_st(const char *path, uint64_t header_len, const char *header,
                     size_t data_len)
{
    size_t hl = strlen(header), n = 8 + hl + data_len;
    unsigned char *b = malloc(n);
    for (int i = 0; i < 8; i++)
        b[i] = (unsigned char)(header_len >> (8 * i));
    memcpy(b + 8, header, hl);
    for (size_t i = 0; i < data_len; i++)
        b[8 + hl + i] = (unsigned char)i;
    bool ok = write_bytes(path, b, n);
    free(b);
    return ok;
}

/* Opening must fail, with a message naming the file and containing `want`. */
static void expect_reject_path(const char *path, const char *want)
{
    ft_st_file *f = (ft_st_file *)1;
    ft_err err = {0};
    int rc = ft_st_open(&f, path, &err);
    CHECK(rc == -1);
    CHECK(f == NULL);
    if (rc == 0)
        ft_st_close(f);
    CHECK(strstr(err.msg, path) != NULL);
    CHECK(want == NULL || strstr(err.msg, want) != NULL);
    if (rc == 0 || !strstr(err.msg, path) || (want && !strstr(err.msg, want)))
        fprintf(stderr, "  rejecting %s: got \"%s\", wanted \"%s\"\n", path, err.msg,
                want ? want : "");
}

/* Writes header (length = its length, unless header_len says otherwise) plus data
 * and expects a rejection. */
static void expect_reject(const char *name, const char *header, size_t data_len,
                          const char *want)
{
    char path[256];
    tmp_path(path, sizeof path, name);
    CHECK(write_st(path, strlen(header), header, data_len));
    expect_reject_path(path, want);
}

/* ---------------------------------------------------------------- round trips */

static void fill_bytes(unsigned char *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (unsigned char)(seed * 131u + i * 7u + (i >> 8));
}

static void test_roundtrip(void)
{
    static const struct {
        const char *name;
        ft_st_dtype dt;
        int ndim;
        int64_t shape[4];
    } spec[] = {
        {"model.embed.weight", FT_ST_F32, 2, {3, 5}},
        {"b.bf16", FT_ST_BF16, 1, {7}},
        {"a.f16", FT_ST_F16, 3, {2, 1, 3}},
        {"scalar.i64", FT_ST_I64, 0, {0}},
        {"bytes", FT_ST_U8, 1, {5}},
        {"empty", FT_ST_F32, 2, {0, 4}},
        {"mask", FT_ST_BOOL, 1, {3}},
        {"ints", FT_ST_I32, 2, {2, 2}},
        {"double", FT_ST_F64, 1, {1}},
        {"u16", FT_ST_U16, 1, {3}},
    };
    enum { NT = sizeof spec / sizeof spec[0] };
    unsigned char *data[NT];
    ft_st_writer *w = ft_st_writer_new();
    ft_err err = {0};
    CHECK(w != NULL);
    for (int i = 0; i < NT; i++) {
        size_t n = ft_st_dtype_size(spec[i].dt);
        for (int d = 0; d < spec[i].ndim; d++)
            n *= (size_t)spec[i].shape[d];
        data[i] = malloc(n ? n : 1);
        fill_bytes(data[i], n, (unsigned)i);
        CHECK(ft_st_writer_add(w, spec[i].name, spec[i].dt, spec[i].ndim, spec[i].shape,
                               n ? data[i] : NULL, &err) == 0);
    }
    CHECK(ft_st_writer_metadata(w, "format", "pt", &err) == 0);
    CHECK(ft_st_writer_metadata(w, "note", "r\xc3\xa9sum\xc3\xa9 \"quoted\"", &err) == 0);
    CHECK(ft_st_writer_metadata(w, "format", "pt", &err) == 0); /* set twice: one entry */

    char path[256];
    tmp_path(path, sizeof path, "roundtrip.safetensors");
    CHECK(ft_st_writer_save(w, path, &err) == 0);
    ft_st_writer_free(w);

    char tmp[300];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    CHECK(!file_exists(tmp));

    size_t flen;
    unsigned char *raw = read_all(path, &flen);
    CHECK(raw != NULL && flen >= 8);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = (hlen << 8) | raw[i];
    CHECK(hlen % 8 == 0);
    CHECK(raw[8] == '{');
    CHECK(memmem(raw + 8, hlen, "{\"__metadata__\":{", 17) == raw + 8);
    free(raw);

    ft_st_file *f = NULL;
    CHECK(ft_st_open(&f, path, &err) == 0);
    if (!f) {
        fprintf(stderr, "  %s\n", err.msg);
        for (int i = 0; i < NT; i++)
            free(data[i]);
        return;
    }
    CHECK(ft_st_count(f) == NT);
    CHECK(strcmp(ft_st_metadata(f, "format"), "pt") == 0);
    CHECK(strcmp(ft_st_metadata(f, "note"), "r\xc3\xa9sum\xc3\xa9 \"quoted\"") == 0);
    CHECK(ft_st_metadata(f, "absent") == NULL);
    CHECK(ft_st_find(f, "absent") == NULL);
    CHECK(ft_st_at(f, NT) == NULL);
    for (int i = 0; i < NT; i++) {
        const ft_st_tensor *t = ft_st_find(f, spec[i].name);
        CHECK(t != NULL);
        if (!t)
            continue;
        CHECK(strcmp(t->name, spec[i].name) == 0);
        CHECK(t->dtype == spec[i].dt);
        CHECK(t->ndim == spec[i].ndim);
        size_t numel = 1;
        for (int d = 0; d < t->ndim; d++) {
            CHECK(t->shape[d] == spec[i].shape[d]);
            numel *= (size_t)spec[i].shape[d];
        }
        CHECK(t->numel == numel);
        CHECK(t->nbytes == numel * ft_st_dtype_size(spec[i].dt));
        CHECK(t->nbytes == 0 || memcmp(t->data, data[i], t->nbytes) == 0);
        CHECK((uintptr_t)t->data % ft_st_dtype_size(t->dtype) == 0);
        CHECK(strcmp(t->file, path) == 0);
    }
    /* File order is the reference writer's: dtype descending, then name. */
    for (size_t i = 1; i < ft_st_count(f); i++) {
        const ft_st_tensor *a = ft_st_at(f, i - 1), *b = ft_st_at(f, i);
        CHECK(a->dtype > b->dtype || (a->dtype == b->dtype && strcmp(a->name, b->name) < 0));
        CHECK((const char *)a->data + a->nbytes == (const char *)b->data);
    }
    CHECK(ft_st_at(f, 0)->dtype == FT_ST_I64);
    ft_st_close(f);
    for (int i = 0; i < NT; i++)
        free(data[i]);
}

/* The reference writer's own test vectors (safetensors/src/tensor.rs). */
static void test_reference_bytes(void)
{
    static const unsigned char attn[] = {
        64,  0,   0,   0,   0,   0,   0,   0,   123, 34,  97,  116, 116, 110, 46,  48,  34,
        58,  123, 34,  100, 116, 121, 112, 101, 34,  58,  34,  70,  51,  50,  34,  44,  34,
        115, 104, 97,  112, 101, 34,  58,  91,  49,  44,  50,  44,  51,  93,  44,  34,  100,
        97,  116, 97,  95,  111, 102, 102, 115, 101, 116, 115, 34,  58,  91,  48,  44,  50,
        52,  93,  125, 125, 0,   0,   0,   0,   0,   0,   128, 63,  0,   0,   0,   64,  0,
        0,   64,  64,  0,   0,   128, 64,  0,   0,   160, 64};
    static const unsigned char empty[] = {8, 0, 0, 0, 0, 0, 0, 0, 123, 125, 32, 32, 32, 32, 32, 32};
    static const unsigned char empty_meta[] = {
        40,  0,   0,   0,   0,   0,  0,   0,   123, 34,  95,  95,  109, 101, 116, 97,
        100, 97,  116, 97,  95,  95, 34,  58,  123, 34,  102, 114, 97,  109, 101, 119,
        111, 114, 107, 34,  58,  34, 112, 116, 34,  125, 125, 32,  32,  32,  32,  32};
    float v[6] = {0, 1, 2, 3, 4, 5};
    int64_t shape[3] = {1, 2, 3};
    ft_err err = {0};
    char path[256];
    size_t n;
    unsigned char *got;

    ft_st_writer *w = ft_st_writer_new();
    CHECK(ft_st_writer_add(w, "attn.0", FT_ST_F32, 3, shape, v, &err) == 0);
    tmp_path(path, sizeof path, "ref_attn.safetensors");
    CHECK(ft_st_writer_save(w, path, &err) == 0);
    got = read_all(path, &n);
    CHECK(got && n == sizeof attn && memcmp(got, attn, n) == 0);
    free(got);
    ft_st_writer_free(w);

    w = ft_st_writer_new();
    tmp_path(path, sizeof path, "ref_empty.safetensors");
    CHECK(ft_st_writer_save(w, path, &err) == 0);
    got = read_all(path, &n);
    CHECK(got && n == sizeof empty && memcmp(got, empty, n) == 0);
    free(got);
    CHECK(ft_st_writer_metadata(w, "framework", "pt", &err) == 0);
    tmp_path(path, sizeof path, "ref_empty_meta.safetensors");
    CHECK(ft_st_writer_save(w, path, &err) == 0);
    got = read_all(path, &n);
    CHECK(got && n == sizeof empty_meta && memcmp(got, empty_meta, n) == 0);
    free(got);
    ft_st_writer_free(w);

    ft_st_file *f = NULL;
    CHECK(ft_st_open(&f, path, &err) == 0);
    CHECK(f && ft_st_count(f) == 0 && strcmp(ft_st_metadata(f, "framework"), "pt") == 0);
    ft_st_close(f);
}

/* Hand-written files the reference reader accepts. */
static void test_valid_handwritten(void)
{
    char path[256];
    ft_err err = {0};
    ft_st_file *f = NULL;

    /* "{}" with no padding, no data. */
    tmp_path(path, sizeof path, "empty_unpadded.safetensors");
    CHECK(write_st(path, 2, "{}", 0));
    CHECK(ft_st_open(&f, path, &err) == 0 && f && ft_st_count(f) == 0);
    CHECK(f && ft_st_metadata(f, "format") == NULL);
    ft_st_close(f);

    /* Odd header length with trailing spaces: the F32 data start unaligned; extra
     * keys in an entry are ignored; __metadata__ null means none; two zero-size
     * tensors share an offset. */
    const char *h = "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],\"x\":1},"
                    "\"z1\":{\"dtype\":\"F16\",\"shape\":[0],\"data_offsets\":[8,8]},"
                    "\"z0\":{\"dtype\":\"BF16\",\"shape\":[3,0],\"data_offsets\":[8,8]},"
                    "\"__metadata__\":null}   ";
    size_t hl = strlen(h);
    CHECK(hl % 4 != 0);
    unsigned char buf[512];
    for (int i = 0; i < 8; i++)
        buf[i] = (unsigned char)((uint64_t)hl >> (8 * i));
    memcpy(buf + 8, h, hl);
    float vals[2] = {1.5f, -2.25f};
    memcpy(buf + 8 + hl, vals, sizeof vals);
    tmp_path(path, sizeof path, "unaligned.safetensors");
    CHECK(write_bytes(path, buf, 8 + hl + sizeof vals));
    CHECK(ft_st_open(&f, path, &err) == 0);
    if (!f) {
        fprintf(stderr, "  %s\n", err.msg);
        return;
    }
    CHECK(ft_st_count(f) == 3);
    CHECK(ft_st_metadata(f, "x") == NULL);
    const ft_st_tensor *t = ft_st_find(f, "w");
    CHECK(t && (uintptr_t)t->data % 4 != 0);
    float out[2] = {0, 0};
    CHECK(t && ft_st_to_f32(t, out, 2, &err) == 0);
    CHECK(out[0] == 1.5f && out[1] == -2.25f);
    const ft_st_tensor *z = ft_st_find(f, "z0");
    CHECK(z && z->numel == 0 && z->nbytes == 0 && z->ndim == 2);
    CHECK(z && ft_st_to_f32(z, out, 0, &err) == 0);
    ft_st_close(f);
}

static void test_to_f32(void)
{
    uint16_t bf[4] = {ft_f32_to_bf16(1.0f), ft_f32_to_bf16(-2.5f), 0x7f80, 0x0001};
    uint16_t hf[4] = {ft_f32_to_f16(1.0f), ft_f32_to_f16(-2.5f), 0xfc00, 0x0001};
    float f32[3] = {3.25f, -0.0f, 1e30f};
    int32_t i32[2] = {1, 2};
    int64_t s4[1] = {4}, s3[1] = {3}, s2[1] = {2};
    ft_err err = {0};
    ft_st_writer *w = ft_st_writer_new();
    CHECK(ft_st_writer_add(w, "bf", FT_ST_BF16, 1, s4, bf, &err) == 0);
    CHECK(ft_st_writer_add(w, "hf", FT_ST_F16, 1, s4, hf, &err) == 0);
    CHECK(ft_st_writer_add(w, "f", FT_ST_F32, 1, s3, f32, &err) == 0);
    CHECK(ft_st_writer_add(w, "layer.ints", FT_ST_I32, 1, s2, i32, &err) == 0);
    char path[256];
    tmp_path(path, sizeof path, "to_f32.safetensors");
    CHECK(ft_st_writer_save(w, path, &err) == 0);
    ft_st_writer_free(w);

    ft_st_file *f = NULL;
    CHECK(ft_st_open(&f, path, &err) == 0);
    if (!f)
        return;
    float out[4];
    CHECK(ft_st_to_f32(ft_st_find(f, "bf"), out, 4, &err) == 0);
    CHECK(out[0] == 1.0f && out[1] == -2.5f && isinf(out[2]) && out[2] > 0);
    CHECK(out[3] == 0x1p-133f);
    CHECK(ft_st_to_f32(ft_st_find(f, "hf"), out, 4, &err) == 0);
    CHECK(out[0] == 1.0f && out[1] == -2.5f && isinf(out[2]) && out[2] < 0);
    CHECK(out[3] == 0x1p-24f);
    CHECK(ft_st_to_f32(ft_st_find(f, "f"), out, 3, &err) == 0);
    CHECK(out[0] == 3.25f && out[1] == 0.0f && signbit(out[1]) && out[2] == 1e30f);

    CHECK(ft_st_to_f32(ft_st_find(f, "layer.ints"), out, 2, &err) == -1);
    CHECK(strstr(err.msg, "layer.ints") && strstr(err.msg, "I32") && strstr(err.msg, path));
    CHECK(ft_st_to_f32(ft_st_find(f, "f"), out, 2, &err) == -1);
    CHECK(strstr(err.msg, "'f'") && strstr(err.msg, path));

    /* the finite variant: the same values, and a NaN or infinity is an error naming the
       element (row-major index) */
    CHECK(ft_st_to_f32_finite(ft_st_find(f, "f"), out, 3, &err) == 0 && out[2] == 1e30f);
    CHECK(ft_st_to_f32_finite(ft_st_find(f, "bf"), out, 4, &err) == -1);
    CHECK(strstr(err.msg, path) && strstr(err.msg, "'bf'") && strstr(err.msg, "element [2] is inf"));
    CHECK(ft_st_to_f32_finite(ft_st_find(f, "hf"), out, 4, &err) == -1);
    CHECK(strstr(err.msg, "'hf'") && strstr(err.msg, "element [2] is -inf"));
    CHECK(ft_st_to_f32_finite(ft_st_find(f, "layer.ints"), out, 2, &err) == -1);
    ft_st_close(f);

    float cube[24] = {0};
    cube[1 * 12 + 1 * 4 + 3] = NAN;
    int64_t s234[3] = {2, 3, 4};
    w = ft_st_writer_new();
    CHECK(ft_st_writer_add(w, "cube", FT_ST_F32, 3, s234, cube, &err) == 0);
    CHECK(ft_st_writer_save(w, path, &err) == 0);
    ft_st_writer_free(w);
    CHECK(ft_st_open(&f, path, &err) == 0);
    float out24[24];
    CHECK(f && ft_st_to_f32_finite(ft_st_find(f, "cube"), out24, 24, &err) == -1);
    CHECK(strstr(err.msg, "element [1, 1, 3] is NaN") && strstr(err.msg, "shape [2, 3, 4]"));
    ft_st_close(f);
    CHECK(ft_f32_first_nonfinite(cube, 24) == 19 && ft_f32_first_nonfinite(cube, 19) == 19);
}

/* ---------------------------------------------------------------- hostile input */

#define ENTRY(name, dt, shape, b, e) \
    "\"" name "\":{\"dtype\":\"" dt "\",\"shape\":" shape ",\"data_offsets\":[" #b "," #e "]}"

static void test_hostile_files(void)
{
    char path[256];

    /* Shorter than the 8-byte length. */
    tmp_path(path, sizeof path, "truncated.safetensors");
    CHECK(write_bytes(path, "\x08\0\0\0\0", 5));
    expect_reject_path(path, "too short");
    tmp_path(path, sizeof path, "zero_bytes.safetensors");
    CHECK(write_bytes(path, "", 0));
    expect_reject_path(path, "too short");

    /* Header length over the limit; absurd; past the end of the file. */
    tmp_path(path, sizeof path, "header_too_large.safetensors");
    CHECK(write_st(path, 100000001ull, "{}", 0));
    expect_reject_path(path, "exceeds the limit");
    tmp_path(path, sizeof path, "header_huge.safetensors");
    CHECK(write_st(path, UINT64_MAX, "{}", 0));
    expect_reject_path(path, "exceeds the limit");
    tmp_path(path, sizeof path, "header_past_eof.safetensors");
    CHECK(write_st(path, 64, "{}      ", 0));
    expect_reject_path(path, "past the end of the file");
    tmp_path(path, sizeof path, "header_empty.safetensors");
    CHECK(write_st(path, 0, "", 0));
    expect_reject_path(path, "not valid JSON");

    /* JSON and schema. */
    expect_reject("bad_json.safetensors", "{\"a\": ", 0, "not valid JSON");
    tmp_path(path, sizeof path, "nul_padding.safetensors"); /* NULs are not whitespace */
    CHECK(write_bytes(path, "\x08\0\0\0\0\0\0\0{}\0\0\0\0\0\0", 16));
    expect_reject_path(path, "not valid JSON");
    expect_reject("top_array.safetensors", "[]      ", 0, "not a JSON object");
    expect_reject("trailing_garbage.safetensors", "{} x", 0, "not valid JSON");
    expect_reject("bad_utf8.safetensors", "{\"\xff\":{}}", 0, "not valid JSON");
    expect_reject("nul_in_name.safetensors",
                  "{" ENTRY("a\\u0000b", "F32", "[1]", 0, 4) "}", 4, "not valid JSON");
    expect_reject("duplicate.safetensors",
                  "{" ENTRY("w", "F32", "[1]", 0, 4) "," ENTRY("w", "F32", "[1]", 0, 4) "}", 4,
                  "duplicate");
    expect_reject("non_object.safetensors", "{\"model.w\": 5}", 0, "'model.w'");
    expect_reject("missing_offsets.safetensors",
                  "{\"model.w\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, "'model.w'");
    expect_reject("missing_dtype.safetensors",
                  "{\"model.w\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "'model.w'");
    expect_reject("dtype_number.safetensors",
                  "{\"model.w\":{\"dtype\":7,\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
                  "'model.w'");
    expect_reject("unknown_dtype.safetensors", "{" ENTRY("model.w", "F31", "[1]", 0, 4) "}", 4,
                  "tensor 'model.w': unknown dtype 'F31'");
    expect_reject("lowercase_dtype.safetensors", "{" ENTRY("model.w", "f32", "[1]", 0, 4) "}",
                  4, "unknown dtype 'f32'");
    expect_reject("shape_missing.safetensors",
                  "{\"model.w\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4, "'model.w'");
    expect_reject("shape_negative.safetensors", "{" ENTRY("model.w", "F32", "[-1]", 0, 4) "}",
                  4, "'model.w'");
    expect_reject("shape_float.safetensors", "{" ENTRY("model.w", "F32", "[1.0]", 0, 4) "}", 4,
                  "'model.w'");
    expect_reject("shape_string.safetensors", "{" ENTRY("model.w", "F32", "\"1\"", 0, 4) "}",
                  4, "'model.w'");
    expect_reject("too_many_dims.safetensors",
                  "{" ENTRY("model.w", "F32", "[1,1,1,1,1,1,1,1,1]", 0, 4) "}", 4, "'model.w'");
    expect_reject("offsets_three.safetensors",
                  "{\"model.w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,4]}}", 4,
                  "'model.w'");
    expect_reject("offsets_negative.safetensors", "{" ENTRY("model.w", "U8", "[1]", -1, 0) "}",
                  1, "'model.w'");
    expect_reject("offsets_huge.safetensors",
                  "{" ENTRY("model.w", "U8", "[1]", 0, 99999999999999999999) "}", 1,
                  "not valid JSON");
    expect_reject("offsets_reversed.safetensors", "{" ENTRY("model.w", "U8", "[0]", 8, 4) "}",
                  8, "'model.w'");

    /* Sizes and offsets. */
    expect_reject("size_mismatch.safetensors",
                  "{" ENTRY("model.norm.weight", "F32", "[4]", 0, 12) "}", 12,
                  "tensor 'model.norm.weight': data_offsets [0, 12) hold 12 bytes but shape "
                  "[4] of F32 needs 16");
    expect_reject("shape_overflow.safetensors",
                  "{" ENTRY("model.w", "F32", "[4611686018427387904,8]", 0, 0) "}", 0,
                  "tensor 'model.w'");
    expect_reject("shape_overflow_bytes.safetensors",
                  "{" ENTRY("model.w", "F64", "[4611686018427387904]", 0, 0) "}", 0,
                  "overflow");
    expect_reject("shape_overflow_zero.safetensors",
                  "{" ENTRY("model.w", "F32", "[4611686018427387904,8,0]", 0, 0) "}", 0,
                  "overflow");
    expect_reject("overlap.safetensors",
                  "{" ENTRY("a", "F32", "[2]", 0, 8) "," ENTRY("b", "F32", "[2]", 4, 12) "}", 12,
                  "tensor 'b'");
    expect_reject("overlap_same.safetensors",
                  "{" ENTRY("a", "F32", "[2]", 0, 8) "," ENTRY("b", "F32", "[2]", 0, 8) "}", 8,
                  "overlap");
    expect_reject("gap.safetensors",
                  "{" ENTRY("a", "F32", "[2]", 0, 8) "," ENTRY("b", "F32", "[1]", 12, 16) "}",
                  16, "tensor 'b'");
    expect_reject("not_at_zero.safetensors", "{" ENTRY("a", "F32", "[1]", 4, 8) "}", 8,
                  "tensor 'a'");
    expect_reject("trailing.safetensors", "{" ENTRY("a", "F32", "[1]", 0, 4) "}", 8,
                  "trailing bytes");
    expect_reject("trailing_no_tensor.safetensors", "{}", 1, "trailing bytes");
    expect_reject("end_past_eof.safetensors", "{" ENTRY("a", "F32", "[4]", 0, 16) "}", 8,
                  "tensor 'a'");
    /* A slot larger than its tensor, with the file otherwise tiled exactly: as the last
     * tensor, and between two others (the next one begins where the large slot ends). */
    expect_reject("slot_larger_last.safetensors",
                  "{" ENTRY("model.norm.weight", "F32", "[2]", 0, 12) "}", 12,
                  "tensor 'model.norm.weight': data_offsets [0, 12) hold 12 bytes but shape "
                  "[2] of F32 needs 8");
    expect_reject("slot_larger_middle.safetensors",
                  "{" ENTRY("a", "F32", "[1]", 0, 4) "," ENTRY("b", "BF16", "[2]", 4, 10) ","
                  ENTRY("c", "U8", "[2]", 10, 12) "}", 12,
                  "tensor 'b': data_offsets [4, 10) hold 6 bytes but shape [2] of BF16 needs 4");
    expect_reject("slot_larger_empty.safetensors",
                  "{" ENTRY("z", "F16", "[0]", 0, 2) "}", 2, "tensor 'z'");

    /* Metadata. */
    expect_reject("meta_number.safetensors", "{\"__metadata__\":{\"format\":1}}", 0,
                  "'format'");
    expect_reject("meta_nested.safetensors", "{\"__metadata__\":{\"format\":{}}}", 0,
                  "__metadata__");
    expect_reject("meta_string.safetensors", "{\"__metadata__\":\"pt\"}", 0, "__metadata__");

    /* Not a file at all. */
    tmp_path(path, sizeof path, "no_such.safetensors");
    expect_reject_path(path, "cannot open");
    expect_reject_path(tmp_dir, "not a regular file");
    /* A FIFO: refused without waiting for a writer (the open itself used to block). */
    tmp_path(path, sizeof path, "fifo.safetensors");
    CHECK(make_fifo(path));
    fifo_guard(true);
    expect_reject_path(path, "not a regular file (a FIFO)");
    fifo_guard(false);
    char dir[200];
    tmp_path(dir, sizeof dir, "fifo_ckpt");
    CHECK(mkdir(dir, 0700) == 0);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    CHECK(make_fifo(path));
    ft_checkpoint *c = NULL;
    ft_err err = {0};
    fifo_guard(true);
    CHECK(ft_ckpt_open(&c, dir, "model", &err) == -1 && c == NULL);
    fifo_guard(false);
    CHECK(strstr(err.msg, path) && strstr(err.msg, "FIFO"));
}

static uint32_t lcg(uint32_t *s)
{
    *s = *s * 1664525u + 1013904223u;
    return *s >> 8;
}

/* Every proper prefix of a valid file is invalid, and random byte mutations must be
 * accepted or rejected cleanly (valgrind watches the reads). */
static void test_fuzz(void)
{
    float a[3] = {1, 2, 3};
    uint16_t b[5] = {1, 2, 3, 4, 5};
    int64_t sa[1] = {3}, sb[2] = {5, 1};
    ft_err err = {0};
    char path[256], mpath[256];
    tmp_path(path, sizeof path, "fuzz_src.safetensors");
    tmp_path(mpath, sizeof mpath, "fuzz.safetensors");
    ft_st_writer *w = ft_st_writer_new();
    CHECK(ft_st_writer_add(w, "a", FT_ST_F32, 1, sa, a, &err) == 0);
    CHECK(ft_st_writer_add(w, "b", FT_ST_BF16, 2, sb, b, &err) == 0);
    CHECK(ft_st_writer_metadata(w, "format", "pt", &err) == 0);
    CHECK(ft_st_writer_save(w, path, &err) == 0);
    ft_st_writer_free(w);
    size_t n;
    unsigned char *src = read_all(path, &n);
    CHECK(src != NULL);
    if (!src)
        return;

    int prefix_accepted = 0;
    for (size_t len = 0; len < n; len++) {
        ft_st_file *f = NULL;
        CHECK(write_bytes(mpath, src, len));
        if (ft_st_open(&f, mpath, &err) == 0) {
            prefix_accepted++;
            ft_st_close(f);
        } else if (!strstr(err.msg, mpath)) {
            prefix_accepted += 1000;
        }
    }
    CHECK(prefix_accepted == 0);

    unsigned char *m = malloc(n);
    uint32_t seed = 12345;
    int bad_msg = 0;
    for (int iter = 0; iter < 400; iter++) {
        memcpy(m, src, n);
        int edits = 1 + (int)(lcg(&seed) % 4);
        for (int e = 0; e < edits; e++) {
            size_t pos = lcg(&seed) % n;
            /* bias towards the header, where the structure is */
            if (iter % 2 == 0)
                pos = 8 + lcg(&seed) % 120;
            m[pos] = (unsigned char)lcg(&seed);
        }
        CHECK(write_bytes(mpath, m, n));
        ft_st_file *f = NULL;
        if (ft_st_open(&f, mpath, &err) == 0) {
            float out[5];
            for (size_t i = 0; i < ft_st_count(f); i++) {
                const ft_st_tensor *t = ft_st_at(f, i);
                if (t->numel <= 5)
                    ft_st_to_f32(t, out, t->numel, &err);
            }
            ft_st_close(f);
        } else if (!strstr(err.msg, mpath)) {
            bad_msg++;
            fprintf(stderr, "  fuzz message without the path: %s\n", err.msg);
        }
    }
    CHECK(bad_msg == 0);
    free(m);
    free(src);
}

/* ---------------------------------------------------------------- writer errors */

static void test_writer_errors(void)
{
    float v[2] = {0, 0};
    int64_t s2[1] = {2}, neg[1] = {-1}, big[2] = {INT64_C(1) << 62, 8};
    int64_t nine[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    ft_err err = {0};
    ft_st_writer *w = ft_st_writer_new();
    CHECK(ft_st_writer_add(w, "x", FT_ST_F32, 1, s2, v, &err) == 0);
    CHECK(ft_st_writer_add(w, "x", FT_ST_F32, 1, s2, v, &err) == -1 && strstr(err.msg, "'x'"));
    CHECK(ft_st_writer_add(w, "__metadata__", FT_ST_F32, 1, s2, v, &err) == -1);
    CHECK(ft_st_writer_add(w, "y", FT_ST_NDTYPES, 1, s2, v, &err) == -1 &&
          strstr(err.msg, "'y'"));
    CHECK(ft_st_writer_add(w, "y", FT_ST_F32, 1, neg, v, &err) == -1);
    CHECK(ft_st_writer_add(w, "y", FT_ST_F32, 2, big, v, &err) == -1);
    CHECK(ft_st_writer_add(w, "y", FT_ST_F32, 9, nine, v, &err) == -1);
    CHECK(ft_st_writer_add(w, "y", FT_ST_F32, 1, s2, NULL, &err) == -1);
    CHECK(ft_st_writer_add(w, "bad\xff", FT_ST_F32, 1, s2, v, &err) == -1);
    CHECK(ft_st_writer_metadata(w, "k", "bad\xff", &err) == -1);
    CHECK(ft_st_writer_add(w, "y", FT_ST_F32, 1, s2, v, &err) == 0); /* failures left no trace */

    char path[256];
    tmp_path(path, sizeof path, "no_such_dir/out.safetensors");
    CHECK(ft_st_writer_save(w, path, &err) == -1 && strstr(err.msg, path));
    CHECK(ft_st_writer_save_sharded(w, tmp_dir, "a/b", 100, &err) == -1);
    CHECK(ft_st_writer_save_sharded(w, tmp_dir, "m", 0, &err) == -1);
    ft_st_writer_free(w);
}

/* ---------------------------------------------------------------- checkpoints */

static void make_dir(char *buf, size_t cap, const char *name)
{
    tmp_path(buf, cap, name);
    mkdir(buf, 0755);
}

static int count_files(const char *dir)
{
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *de;
    while (d && (de = readdir(d)) != NULL)
        n += de->d_name[0] != '.';
    if (d)
        closedir(d);
    return n;
}

static void check_ckpt(const char *dir, const char *const *names, unsigned char *const *data,
                       const size_t *bytes, int n)
{
    ft_checkpoint *c = NULL;
    ft_err err = {0};
    CHECK(ft_ckpt_open(&c, dir, "model", &err) == 0);
    if (!c) {
        fprintf(stderr, "  %s\n", err.msg);
        return;
    }
    CHECK(ft_ckpt_count(c) == (size_t)n);
    for (int i = 0; i < n; i++) {
        const ft_st_tensor *t = ft_ckpt_find(c, names[i]);
        CHECK(t && t->nbytes == bytes[i] && memcmp(t->data, data[i], bytes[i]) == 0);
    }
    size_t sum = 0;
    for (size_t i = 0; i < ft_ckpt_count(c); i++)
        sum += ft_ckpt_at(c, i)->nbytes;
    size_t want = 0;
    for (int i = 0; i < n; i++)
        want += bytes[i];
    CHECK(sum == want);
    CHECK(ft_ckpt_find(c, "absent") == NULL && ft_ckpt_at(c, (size_t)n) == NULL);
    ft_ckpt_close(c);
}

static void test_sharded(void)
{
    /* Sizes 40, 40, 40, 200 (over the 100-byte limit), 8, 0, 60: with max 100 the
     * greedy split is {t0,t1} {t2} {t3} {t4,t5,t6}. */
    enum { NT = 7 };
    static const char *const names[NT] = {"l0.w", "l1.w", "l2.w", "big", "l3.b", "zero", "l4.w"};
    static const int64_t elems[NT] = {10, 10, 10, 50, 2, 0, 15};
    unsigned char *data[NT];
    size_t bytes[NT];
    ft_err err = {0};
    ft_st_writer *w = ft_st_writer_new();
    for (int i = 0; i < NT; i++) {
        bytes[i] = (size_t)elems[i] * 4;
        data[i] = malloc(bytes[i] ? bytes[i] : 1);
        fill_bytes(data[i], bytes[i], 100u + (unsigned)i);
        CHECK(ft_st_writer_add(w, names[i], FT_ST_F32, 1, &elems[i], data[i], &err) == 0);
    }
    CHECK(ft_st_writer_metadata(w, "format", "pt", &err) == 0);
    char dir[256], p[512];
    make_dir(dir, sizeof dir, "sharded");

    CHECK(ft_st_writer_save_sharded(w, dir, "model", 100, &err) == 0);
    static const char *const shard_of[NT] = {
        "model-00001-of-00004.safetensors", "model-00001-of-00004.safetensors",
        "model-00002-of-00004.safetensors", "model-00003-of-00004.safetensors",
        "model-00004-of-00004.safetensors", "model-00004-of-00004.safetensors",
        "model-00004-of-00004.safetensors"};
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    json_error_t je;
    json_t *idx = json_load_file(p, 0, &je);
    CHECK(idx != NULL);
    CHECK(json_integer_value(json_object_get(json_object_get(idx, "metadata"), "total_size")) ==
          40 * 3 + 200 + 8 + 0 + 60);
    json_t *wm = json_object_get(idx, "weight_map");
    CHECK(json_object_size(wm) == NT);
    for (int i = 0; i < NT; i++)
        CHECK(strcmp(json_string_value(json_object_get(wm, names[i])), shard_of[i]) == 0);
    json_decref(idx);
    CHECK(count_files(dir) == 5);
    for (int s = 0; s < 4; s++) {
        snprintf(p, sizeof p, "%s/model-%05d-of-00004.safetensors", dir, s + 1);
        ft_st_file *f = NULL;
        CHECK(ft_st_open(&f, p, &err) == 0);
        CHECK(f && strcmp(ft_st_metadata(f, "format"), "pt") == 0);
        ft_st_close(f);
    }
    check_ckpt(dir, names, data, bytes, NT);

    /* Saving again with one shard replaces the index and the shards by a plain file. */
    CHECK(ft_st_writer_save_sharded(w, dir, "model", 1000, &err) == 0);
    CHECK(count_files(dir) == 1);
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    CHECK(file_exists(p));
    check_ckpt(dir, names, data, bytes, NT);

    /* And back: the plain file must go, or it would shadow the index. */
    CHECK(ft_st_writer_save_sharded(w, dir, "model", 250, &err) == 0);
    CHECK(!file_exists(p));
    CHECK(count_files(dir) == 4); /* {t0, t1, t2} {t3, t4, t5} {t6}, plus the index */
    check_ckpt(dir, names, data, bytes, NT);
    ft_st_writer_free(w);
    for (int i = 0; i < NT; i++)
        free(data[i]);
}

static void test_sharded_groups(void)
{
    /* Sizes 40, 40 | 40, 40, 40 (a group of 120, over the limit) | 40, 20 (a group of
     * 60) | 40. With max 100: {t0, t1} {g1} {g2, t7}; without the groups the split
     * would be {t0, t1} {t2, t3} {t4, t5} {t6, t7}. */
    enum { NT = 8 };
    static const char *const names[NT] = {"a", "b", "g1.w", "g1.s", "g1.t", "g2.w", "g2.s", "z"};
    static const int64_t elems[NT] = {10, 10, 10, 10, 10, 10, 5, 10};
    unsigned char *data[NT];
    size_t bytes[NT];
    ft_err err = {0};
    ft_st_writer *w = ft_st_writer_new();
    for (int i = 0; i < NT; i++) {
        bytes[i] = (size_t)elems[i] * 4;
        data[i] = malloc(bytes[i]);
        fill_bytes(data[i], bytes[i], 300u + (unsigned)i);
        CHECK(ft_st_writer_add(w, names[i], FT_ST_F32, 1, &elems[i], data[i], &err) == 0);
        if (i == 4)
            ft_st_writer_group(w, 2);
        if (i == 6)
            ft_st_writer_group(w, 5);
    }
    CHECK(ft_st_writer_count(w) == NT);
    CHECK(ft_st_writer_bytes(w) == 7 * 40 + 20);
    char dir[256], p[512];
    make_dir(dir, sizeof dir, "sharded_groups");
    CHECK(ft_st_writer_save_sharded(w, dir, "model", 100, &err) == 0);
    static const int shard_of[NT] = {1, 1, 2, 2, 2, 3, 3, 3};
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    json_error_t je;
    json_t *idx = json_load_file(p, 0, &je);
    CHECK(idx != NULL);
    json_t *wm = json_object_get(idx, "weight_map");
    for (int i = 0; i < NT; i++) {
        char want[64];
        snprintf(want, sizeof want, "model-%05d-of-00003.safetensors", shard_of[i]);
        const char *got = json_string_value(json_object_get(wm, names[i]));
        CHECK(got && strcmp(got, want) == 0);
    }
    json_decref(idx);
    check_ckpt(dir, names, data, bytes, NT);
    ft_st_writer_free(w);
    for (int i = 0; i < NT; i++)
        free(data[i]);
}

static void write_text(const char *dir, const char *name, const char *text)
{
    char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    CHECK(write_bytes(p, text, strlen(text)));
}

static void expect_ckpt_reject(const char *dir, const char *want1, const char *want2)
{
    ft_checkpoint *c = (ft_checkpoint *)1;
    ft_err err = {0};
    int rc = ft_ckpt_open(&c, dir, "model", &err);
    CHECK(rc == -1 && c == NULL);
    if (rc == 0)
        ft_ckpt_close(c);
    CHECK(strstr(err.msg, want1) != NULL);
    CHECK(!want2 || strstr(err.msg, want2) != NULL);
    if (!strstr(err.msg, want1) || (want2 && !strstr(err.msg, want2)))
        fprintf(stderr, "  got \"%s\"\n", err.msg);
}

static void test_ckpt_errors(void)
{
    char dir[256], p[512];
    make_dir(dir, sizeof dir, "ckpt_missing");
    expect_ckpt_reject(dir, dir, "model.safetensors.index.json");
    expect_ckpt_reject(dir, "model.safetensors", NULL);
    snprintf(p, sizeof p, "%s/nope", dir);
    expect_ckpt_reject(p, p, NULL);

    /* A valid shard with one tensor "a". */
    float v = 1;
    int64_t s1[1] = {1};
    ft_err err = {0};
    ft_st_writer *w = ft_st_writer_new();
    CHECK(ft_st_writer_add(w, "a", FT_ST_F32, 1, s1, &v, &err) == 0);
    make_dir(dir, sizeof dir, "ckpt_bad");
    snprintf(p, sizeof p, "%s/shard.safetensors", dir);
    CHECK(ft_st_writer_save(w, p, &err) == 0);
    ft_st_writer_free(w);

    write_text(dir, "model.safetensors.index.json",
               "{\"weight_map\": {\"a\": \"shard.safetensors\"}}");
    ft_checkpoint *c = NULL;
    CHECK(ft_ckpt_open(&c, dir, "model", &err) == 0);
    CHECK(c && ft_ckpt_count(c) == 1 && ft_ckpt_find(c, "a"));
    ft_ckpt_close(c);

    write_text(dir, "model.safetensors.index.json",
               "{\"weight_map\": {\"a\": \"shard.safetensors\", \"b\": \"shard.safetensors\"}}");
    expect_ckpt_reject(dir, "'b'", "shard.safetensors");
    write_text(dir, "model.safetensors.index.json",
               "{\"weight_map\": {\"a\": \"../ckpt_bad/shard.safetensors\"}}");
    expect_ckpt_reject(dir, "'a'", "../ckpt_bad/shard.safetensors");
    write_text(dir, "model.safetensors.index.json", "{\"weight_map\": {\"a\": \"/etc/passwd\"}}");
    expect_ckpt_reject(dir, "'a'", "/etc/passwd");
    write_text(dir, "model.safetensors.index.json", "{\"weight_map\": {\"a\": 3}}");
    expect_ckpt_reject(dir, "'a'", "model.safetensors.index.json");
    write_text(dir, "model.safetensors.index.json", "{\"metadata\": {}}");
    expect_ckpt_reject(dir, "weight_map", "model.safetensors.index.json");
    write_text(dir, "model.safetensors.index.json", "{\"weight_map\": ");
    expect_ckpt_reject(dir, "model.safetensors.index.json", "JSON");
    write_text(dir, "model.safetensors.index.json",
               "{\"weight_map\": {\"a\": \"gone.safetensors\"}}");
    expect_ckpt_reject(dir, "gone.safetensors", "cannot open");
    /* A broken shard: its own message, naming it, comes through. */
    snprintf(p, sizeof p, "%s/broken.safetensors", dir);
    CHECK(write_bytes(p, "\x02\0\0\0\0\0\0\0{}x", 11));
    write_text(dir, "model.safetensors.index.json",
               "{\"weight_map\": {\"a\": \"broken.safetensors\"}}");
    expect_ckpt_reject(dir, "broken.safetensors", "trailing bytes");
    /* A name given twice in the index (the shards could disagree on it). */
    write_text(dir, "model.safetensors.index.json",
               "{\"weight_map\": {\"a\": \"shard.safetensors\", \"a\": \"broken.safetensors\"}}");
    expect_ckpt_reject(dir, "model.safetensors.index.json", "duplicate");
    /* An index or a shard that is a FIFO: refused, not waited on. */
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    CHECK(make_fifo(p));
    fifo_guard(true);
    expect_ckpt_reject(dir, "model.safetensors.index.json", "not a regular file (a FIFO)");
    fifo_guard(false);
    unlink(p); /* writing into the FIFO would wait for a reader */
    write_text(dir, "model.safetensors.index.json",
               "{\"weight_map\": {\"a\": \"fifo.safetensors\"}}");
    snprintf(p, sizeof p, "%s/fifo.safetensors", dir);
    CHECK(make_fifo(p));
    fifo_guard(true);
    expect_ckpt_reject(dir, "fifo.safetensors", "not a regular file (a FIFO)");
    fifo_guard(false);
}

/* Thousands of tensors: every lookup must hit, in any order. */
static void test_ckpt_many(void)
{
    enum { NT = 3000 };
    static uint16_t vals[NT];
    char names[NT][32];
    int64_t s1[1] = {1};
    ft_err err = {0};
    ft_st_writer *w = ft_st_writer_new();
    for (int i = 0; i < NT; i++) {
        snprintf(names[i], sizeof names[i], "model.layers.%d.w", (i * 7919) % NT);
        vals[i] = (uint16_t)i;
        CHECK(ft_st_writer_add(w, names[i], FT_ST_BF16, 1, s1, &vals[i], &err) == 0);
    }
    char dir[256];
    make_dir(dir, sizeof dir, "many");
    CHECK(ft_st_writer_save_sharded(w, dir, "model", 2000, &err) == 0); /* 3 shards */
    ft_st_writer_free(w);
    CHECK(count_files(dir) == 4);
    ft_checkpoint *c = NULL;
    CHECK(ft_ckpt_open(&c, dir, "model", &err) == 0);
    if (!c)
        return;
    CHECK(ft_ckpt_count(c) == NT);
    int bad = 0;
    for (int r = 0; r < 10; r++)
        for (int i = 0; i < NT; i++) {
            const ft_st_tensor *t = ft_ckpt_find(c, names[i]);
            uint16_t h;
            if (!t) {
                bad++;
                continue;
            }
            memcpy(&h, t->data, 2);
            bad += h != vals[i];
        }
    CHECK(bad == 0);
    ft_ckpt_close(c);
}

/* ---------------------------------------------------------------- conversions */

static uint32_t bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static void test_bf16(void)
{
    CHECK(ft_f32_to_bf16(1.0f) == 0x3f80);
    CHECK(ft_f32_to_bf16(-0.0f) == 0x8000);
    CHECK(ft_f32_to_bf16(1.0f + 0x1p-8f) == 0x3f80);          /* tie, even below */
    CHECK(ft_f32_to_bf16(1.0f + 3 * 0x1p-8f) == 0x3f82);      /* tie, even above */
    CHECK(ft_f32_to_bf16(1.0f + 0x1p-8f + 0x1p-20f) == 0x3f81); /* above the tie */
    CHECK(ft_f32_to_bf16(1.0f + 0x1p-8f - 0x1p-23f) == 0x3f80);
    CHECK(ft_f32_to_bf16(INFINITY) == 0x7f80);
    CHECK(ft_f32_to_bf16(-INFINITY) == 0xff80);
    CHECK(ft_f32_to_bf16(3.4028235e38f) == 0x7f80);  /* FLT_MAX rounds up to inf */
    CHECK(ft_f32_to_bf16(from_bits(0x7f7f7fff)) == 0x7f7f); /* largest that stays finite */
    CHECK(ft_f32_to_bf16(0x1p-130f) == 0x0008);      /* subnormal */
    CHECK(ft_f32_to_bf16(from_bits(0x00008000)) == 0x0000); /* tie to even: zero */
    CHECK(ft_f32_to_bf16(from_bits(0x00018000)) == 0x0002);
    uint16_t n = ft_f32_to_bf16(NAN);
    CHECK((n & 0x7f80) == 0x7f80 && (n & 0x7f) != 0);
    n = ft_f32_to_bf16(from_bits(0xff800001)); /* payload only in the low bits */
    CHECK((n & 0xff80) == 0xff80 && (n & 0x7f) != 0);
    /* Every bf16 survives the round trip through fp32. */
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = ft_bf16_to_f32((uint16_t)h);
        if (isnan(f))
            bad += !isnan(ft_bf16_to_f32(ft_f32_to_bf16(f)));
        else
            bad += ft_f32_to_bf16(f) != h || bits(f) != h << 16;
    }
    CHECK(bad == 0);
}

static void test_f16(void)
{
    CHECK(ft_f32_to_f16(1.0f) == 0x3c00);
    CHECK(ft_f32_to_f16(-2.0f) == 0xc000);
    CHECK(ft_f32_to_f16(-0.0f) == 0x8000);
    CHECK(ft_f32_to_f16(65504.0f) == 0x7bff);
    CHECK(ft_f32_to_f16(65519.99f) == 0x7bff);
    CHECK(ft_f32_to_f16(65520.0f) == 0x7c00); /* overflow by rounding */
    CHECK(ft_f32_to_f16(1e6f) == 0x7c00);
    CHECK(ft_f32_to_f16(-1e30f) == 0xfc00);
    CHECK(ft_f32_to_f16(INFINITY) == 0x7c00);
    CHECK(ft_f32_to_f16(-INFINITY) == 0xfc00);
    uint16_t n = ft_f32_to_f16(NAN);
    CHECK((n & 0x7c00) == 0x7c00 && (n & 0x3ff) != 0);
    CHECK((ft_f32_to_f16(from_bits(0xff800001)) & 0xfe00) == 0xfe00);
    CHECK(ft_f32_to_f16(1.0f + 0x1p-11f) == 0x3c00);     /* tie, even below */
    CHECK(ft_f32_to_f16(1.0f + 3 * 0x1p-11f) == 0x3c02); /* tie, even above */
    CHECK(ft_f32_to_f16(0x1p-14f) == 0x0400);             /* smallest normal */
    CHECK(ft_f32_to_f16(0x1p-14f - 0x1p-25f) == 0x0400);  /* tie rounds up into normal */
    CHECK(ft_f32_to_f16(0x1p-24f) == 0x0001);             /* smallest subnormal */
    CHECK(ft_f32_to_f16(0x1p-25f) == 0x0000);             /* tie to even: zero */
    CHECK(ft_f32_to_f16(-0x1p-25f) == 0x8000);
    CHECK(ft_f32_to_f16(0x1p-25f * 1.0001f) == 0x0001);
    CHECK(ft_f32_to_f16(3 * 0x1p-25f) == 0x0002);         /* tie between 1 and 2 */
    CHECK(ft_f32_to_f16(5 * 0x1p-25f) == 0x0002);         /* tie between 2 and 3 */
    CHECK(ft_f32_to_f16(1e-10f) == 0x0000);
    CHECK(ft_f32_to_f16(from_bits(1)) == 0x0000);         /* fp32 subnormal */

    CHECK(ft_f16_to_f32(0x0001) == 0x1p-24f);
    CHECK(ft_f16_to_f32(0x03ff) == 1023 * 0x1p-24f);
    CHECK(ft_f16_to_f32(0x0400) == 0x1p-14f);
    CHECK(ft_f16_to_f32(0x7bff) == 65504.0f);
    CHECK(ft_f16_to_f32(0x8000) == 0.0f && signbit(ft_f16_to_f32(0x8000)));
    CHECK(isinf(ft_f16_to_f32(0x7c00)) && ft_f16_to_f32(0x7c00) > 0);
    CHECK(isinf(ft_f16_to_f32(0xfc00)) && ft_f16_to_f32(0xfc00) < 0);
    CHECK(isnan(ft_f16_to_f32(0x7e00)) && isnan(ft_f16_to_f32(0xfc01)));
    CHECK(ft_f16_to_f32(0xc000) == -2.0f);

    /* Every half survives the round trip; every midpoint between neighbours (and a
     * hair either side) rounds as round-to-nearest-even says. */
    int bad = 0;
    for (uint32_t h = 0; h < 0x7c00; h++) {
        for (uint32_t s = 0; s <= 0x8000; s += 0x8000) {
            float f = ft_f16_to_f32((uint16_t)(h | s));
            bad += ft_f32_to_f16(f) != (h | s);
        }
        double lo = ft_f16_to_f32((uint16_t)h);
        /* past 65504 the next step would be 65536 (0x7c00 as if the exponent went on) */
        double hi = h + 1 < 0x7c00 ? ft_f16_to_f32((uint16_t)(h + 1)) : 65536.0;
        float mid = (float)((lo + hi) / 2); /* exact in fp32 */
        uint32_t even = (h & 1) ? h + 1 : h;
        bad += ft_f32_to_f16(mid) != even;
        bad += ft_f32_to_f16(nextafterf(mid, 0)) != h;
        bad += ft_f32_to_f16(nextafterf(mid, INFINITY)) != h + 1;
    }
    for (uint32_t h = 0x7c01; h < 0x8000; h++)
        bad += !isnan(ft_f16_to_f32((uint16_t)h)) || !isnan(ft_f16_to_f32((uint16_t)(h | 0x8000)));
    CHECK(bad == 0);

#ifdef __FLT16_MAX__
    /* Against the compiler's correctly rounded conversion, on a spread of patterns. */
    int diff = 0;
    for (uint64_t u = 0; u <= 0xffffffffu; u += 65521) {
        float f = from_bits((uint32_t)u);
        _Float16 r = (_Float16)f;
        uint16_t want;
        memcpy(&want, &r, 2);
        uint16_t got = ft_f32_to_f16(f);
        if (isnan(f))
            diff += (got & 0x7c00) != 0x7c00 || (got & 0x3ff) == 0;
        else
            diff += got != want;
    }
    CHECK(diff == 0);
#endif
}

/* Every dtype's element size, from the safetensors format (not from the library's own
 * table): a reader and a writer that share one wrong entry would agree with each other. */
static const struct {
    const char *name;
    size_t size;
} format_sizes[] = {
    {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1},
    {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
    {"U32", 4},  {"F32", 4}, {"F64", 8}, {"I64", 8},     {"U64", 8},
};

static void test_dtype_sizes(void)
{
    enum { N = sizeof format_sizes / sizeof format_sizes[0] };
    CHECK((int)N == (int)FT_ST_NDTYPES);
    for (int i = 0; i < N; i++) {
        const char *name = format_sizes[i].name;
        size_t size = format_sizes[i].size;
        int dt = ft_st_dtype_parse(name);
        CHECK(dt >= 0);
        if (dt < 0)
            continue;
        CHECK(ft_st_dtype_size((ft_st_dtype)dt) == size);
        /* the reader: a hand-made file of 3 elements opens with exactly 3 x size bytes */
        char header[160], path[256], file[64];
        snprintf(header, sizeof header,
                 "{\"t\":{\"dtype\":\"%s\",\"shape\":[3],\"data_offsets\":[0,%zu]}}", name,
                 3 * size);
        snprintf(file, sizeof file, "size_%s.safetensors", name);
        tmp_path(path, sizeof path, file);
        CHECK(write_st(path, strlen(header), header, 3 * size));
        ft_st_file *f = NULL;
        ft_err err = {0};
        CHECK(ft_st_open(&f, path, &err) == 0);
        const ft_st_tensor *t = f ? ft_st_find(f, "t") : NULL;
        CHECK(t && t->numel == 3 && t->nbytes == 3 * size && t->dtype == (ft_st_dtype)dt);
        if (!f)
            fprintf(stderr, "  %s: %s\n", name, err.msg);
        ft_st_close(f);
        /* the writer: 3 elements take 3 x size bytes after the header */
        unsigned char data[24] = {0};
        int64_t shape[1] = {3};
        ft_st_writer *w = ft_st_writer_new();
        snprintf(file, sizeof file, "written_%s.safetensors", name);
        tmp_path(path, sizeof path, file);
        CHECK(ft_st_writer_add(w, "t", (ft_st_dtype)dt, 1, shape, data, &err) == 0);
        CHECK(ft_st_writer_save(w, path, &err) == 0);
        ft_st_writer_free(w);
        size_t n = 0;
        unsigned char *bytes = read_all(path, &n);
        uint64_t hl = 0;
        for (int b = 7; bytes && n >= 8 && b >= 0; b--)
            hl = hl << 8 | bytes[b];
        CHECK(bytes && n == 8 + hl + 3 * size);
        free(bytes);
    }
}

static void test_dtype_names(void)
{
    for (int i = 0; i < FT_ST_NDTYPES; i++) {
        CHECK(ft_st_dtype_parse(ft_st_dtype_name((ft_st_dtype)i)) == i);
        CHECK(ft_st_dtype_size((ft_st_dtype)i) >= 1);
    }
    CHECK(ft_st_dtype_name(FT_ST_NDTYPES) == NULL);
    CHECK(ft_st_dtype_name((ft_st_dtype)-1) == NULL);
    CHECK(ft_st_dtype_parse("bf16") == -1 && ft_st_dtype_parse(NULL) == -1);
    CHECK(ft_st_dtype_size(FT_ST_BF16) == 2 && ft_st_dtype_size(FT_ST_U64) == 8);
}

/* ---------------------------------------------------------------- cleanup */

static void remove_tree(const char *path)
{
    DIR *d = opendir(path);
    if (d) {
        struct dirent *de;
        while ((de = readdir(d)) != NULL) {
            if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
                continue;
            char p[1024];
            snprintf(p, sizeof p, "%s/%s", path, de->d_name);
            remove_tree(p);
        }
        closedir(d);
        rmdir(path);
    } else {
        unlink(path);
    }
}

int main(void)
{
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/ft_st_test_XXXXXX");
    if (!mkdtemp(tmp_dir)) {
        perror("mkdtemp");
        return 1;
    }
    RUN(test_dtype_names);
    RUN(test_dtype_sizes);
    RUN(test_roundtrip);
    RUN(test_reference_bytes);
    RUN(test_valid_handwritten);
    RUN(test_to_f32);
    RUN(test_hostile_files);
    RUN(test_fuzz);
    RUN(test_writer_errors);
    RUN(test_sharded);
    RUN(test_sharded_groups);
    RUN(test_ckpt_errors);
    RUN(test_ckpt_many);
    RUN(test_bf16);
    RUN(test_f16);
    remove_tree(tmp_dir);
    return check_summary("safetensors");
}
