/* TensorBoard event files (lib/formats/tb_writer.c, lib/core/crc32c.c): CRC-32C against published
 * vectors and a bit-at-a-time reference; the masked CRC of record headers against values
 * from TensorBoard's own masked_crc32c; the file name TensorBoard's writer gives; and the
 * records read back by a small reader here (length, both CRCs, then the Event fields
 * decoded). Write errors name the file. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "core/crc32c.h"
#include "formats/tb_writer.h"

static char tmp_dir[256];

/* ---- CRC-32C --------------------------------------------------------------------- */

static uint32_t crc32c_bitwise(const unsigned char *p, size_t n)
{
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    }
    return ~c;
}

static void test_crc32c_vectors(void)
{
    /* "123456789": the CRC catalogue's check value; the 32-byte ones: RFC 3720 B.4. */
    CHECK(ft_crc32c("123456789", 9) == 0xE3069283u);
    unsigned char buf[32];
    memset(buf, 0, sizeof buf);
    CHECK(ft_crc32c(buf, 32) == 0x8A9136AAu);
    memset(buf, 0xFF, sizeof buf);
    CHECK(ft_crc32c(buf, 32) == 0x62A8AB43u);
    for (int i = 0; i < 32; i++)
        buf[i] = (unsigned char)i;
    CHECK(ft_crc32c(buf, 32) == 0x46DD794Eu);
    for (int i = 0; i < 32; i++)
        buf[i] = (unsigned char)(31 - i);
    CHECK(ft_crc32c(buf, 32) == 0x113FDB5Cu);
    CHECK(ft_crc32c("", 0) == 0);
}

/* Slice-by-8 against the bitwise definition at every length and alignment that
 * exercises the 8-byte loop and the tail; extend() over any split. */
static void test_crc32c_slices(void)
{
    unsigned char buf[160];
    uint32_t s = 12345;
    for (size_t i = 0; i < sizeof buf; i++) {
        s = s * 1103515245u + 12345u;
        buf[i] = (unsigned char)(s >> 16);
    }
    int bad = 0;
    for (size_t off = 0; off < 8; off++)
        for (size_t n = 0; n + off <= sizeof buf; n++) {
            uint32_t want = crc32c_bitwise(buf + off, n);
            if (ft_crc32c(buf + off, n) != want)
                bad++;
            size_t cut = n / 3;
            if (ft_crc32c_extend(ft_crc32c(buf + off, cut), buf + off + cut, n - cut) != want)
                bad++;
        }
    CHECK(bad == 0);
}

static void put_le64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static void test_masked_header_crc(void)
{
    CHECK(ft_crc32c_mask(0) == 0xA282EAD8u);
    CHECK(ft_crc32c_mask(0x00008000u) == 0xA282EAD9u); /* bit 15 rotates to bit 0 */
    /* masked_crc32c(struct.pack("<Q", n)) from tensorboard.compat.tensorflow_stub. */
    static const struct {
        uint64_t len;
        uint32_t masked;
    } v[] = {{0, 0x07980329u}, {24, 0x224B7FA3u}, {300, 0x9D5BFEF2u}};
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        unsigned char head[8];
        put_le64(head, v[i].len);
        CHECK(ft_crc32c_mask(ft_crc32c(head, 8)) == v[i].masked);
    }
}

/* ---- a small reader -------------------------------------------------------------- */

typedef struct {
    unsigned char *data;
    size_t n;
} record;

static unsigned char *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    unsigned char *buf = NULL;
    size_t cap = 0;
    *n = 0;
    for (;;) {
        if (*n == cap) {
            cap = cap ? 2 * cap : 4096;
            buf = realloc(buf, cap);
            FT_CHECK(buf);
        }
        size_t r = fread(buf + *n, 1, cap - *n, f);
        if (r == 0)
            break;
        *n += r;
    }
    fclose(f);
    return buf;
}

static uint64_t le(const unsigned char *p, int nbytes)
{
    uint64_t v = 0;
    for (int i = 0; i < nbytes; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* Splits the file into records, checking both masked CRCs of each; returns the count,
 * or -1 if the framing or a CRC is wrong. recs point into buf. */
static int read_records(const unsigned char *buf, size_t n, record *recs, int max)
{
    size_t pos = 0;
    int count = 0;
    while (pos < n) {
        if (n - pos < 12 || count == max)
            return -1;
        uint64_t len = le(buf + pos, 8);
        if (ft_crc32c_mask(ft_crc32c(buf + pos, 8)) != (uint32_t)le(buf + pos + 8, 4))
            return -1;
        if (len > n - pos - 16)
            return -1;
        const unsigned char *data = buf + pos + 12;
        if (ft_crc32c_mask(ft_crc32c(data, len)) != (uint32_t)le(data + len, 4))
            return -1;
        recs[count++] = (record){(unsigned char *)data, len};
        pos += 16 + len;
    }
    return count;
}

/* One protobuf field: its number, wire type, and a varint / fixed value or the bytes of
 * a length-delimited one. */
typedef struct {
    unsigned field, wt;
    uint64_t v;
    const unsigned char *p;
    size_t len;
} pb_field;

static int pb_varint(const unsigned char **p, const unsigned char *end, uint64_t *v)
{
    *v = 0;
    for (int shift = 0; shift < 70 && *p < end; shift += 7) {
        unsigned char b = *(*p)++;
        *v |= (uint64_t)(b & 0x7F) << shift;
        if (!(b & 0x80))
            return 0;
    }
    return -1;
}

/* Reads the next field at *p; 1 if one was read, 0 at the end, -1 if malformed. */
static int pb_next(const unsigned char **p, const unsigned char *end, pb_field *f)
{
    if (*p == end)
        return 0;
    uint64_t key;
    if (pb_varint(p, end, &key))
        return -1;
    f->field = (unsigned)(key >> 3);
    f->wt = key & 7;
    switch (f->wt) {
    case 0:
        return pb_varint(p, end, &f->v) ? -1 : 1;
    case 1:
    case 5: {
        size_t k = f->wt == 1 ? 8 : 4;
        if ((size_t)(end - *p) < k)
            return -1;
        f->v = le(*p, (int)k);
        *p += k;
        return 1;
    }
    case 2:
        if (pb_varint(p, end, &f->v) || f->v > (uint64_t)(end - *p))
            return -1;
        f->p = *p;
        f->len = f->v;
        *p += f->len;
        return 1;
    default:
        return -1;
    }
}

/* The first field numbered `field` in message [p, p+n); 0 if absent or malformed. */
static int pb_find(const unsigned char *p, size_t n, unsigned field, pb_field *out)
{
    const unsigned char *end = p + n;
    pb_field f;
    int r;
    while ((r = pb_next(&p, end, &f)) == 1)
        if (f.field == field) {
            *out = f;
            return 1;
        }
    return 0;
}

static int pb_count_fields(const unsigned char *p, size_t n)
{
    const unsigned char *end = p + n;
    pb_field f;
    int count = 0, r;
    while ((r = pb_next(&p, end, &f)) == 1)
        count++;
    return r < 0 ? -1 : count;
}

static int field_is_str(const pb_field *f, const char *s)
{
    return f->wt == 2 && f->len == strlen(s) && memcmp(f->p, s, f->len) == 0;
}

static double field_double(const pb_field *f)
{
    double d;
    memcpy(&d, &f->v, sizeof d);
    return d;
}

static float field_float(const pb_field *f)
{
    uint32_t u = (uint32_t)f->v;
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- the writer ------------------------------------------------------------------ */

static const char *base_name(const char *path)
{
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

/* events.out.tfevents.<10 digits>.<hostname>.<pid>.<uid>: fills the time and uid. */
static int parse_name(const char *name, long long *t, unsigned *uid)
{
    const char *prefix = "events.out.tfevents.";
    if (strncmp(name, prefix, strlen(prefix)) != 0)
        return -1;
    const char *p = name + strlen(prefix);
    for (int i = 0; i < 10; i++)
        if (p[i] < '0' || p[i] > '9')
            return -1;
    if (p[10] != '.')
        return -1;
    *t = strtoll(p, NULL, 10);
    p += 11;
    char host[256], want[300];
    if (gethostname(host, sizeof host) != 0)
        return -1;
    host[sizeof host - 1] = '\0';
    snprintf(want, sizeof want, "%s.%ld.", host, (long)getpid());
    if (strncmp(p, want, strlen(want)) != 0)
        return -1;
    p += strlen(want);
    char *end;
    *uid = (unsigned)strtoul(p, &end, 10);
    return end != p && *end == '\0' ? 0 : -1;
}

static void test_file_name(void)
{
    char logdir[512];
    snprintf(logdir, sizeof logdir, "%s/names/run1", tmp_dir); /* mkdir -p */
    ft_err err;
    ft_tb_writer *a = NULL, *b = NULL;
    long long t0 = (long long)time(NULL);
    CHECK(ft_tb_open(&a, logdir, &err) == 0);
    CHECK(ft_tb_open(&b, logdir, &err) == 0);
    long long t1 = (long long)time(NULL);
    if (!a || !b) {
        ft_tb_close(a);
        ft_tb_close(b);
        return;
    }
    CHECK(strncmp(ft_tb_path(a), logdir, strlen(logdir)) == 0);
    CHECK(ft_tb_path(a)[strlen(logdir)] == '/');
    long long ta, tb;
    unsigned ua, ub;
    CHECK(parse_name(base_name(ft_tb_path(a)), &ta, &ua) == 0);
    CHECK(parse_name(base_name(ft_tb_path(b)), &tb, &ub) == 0);
    CHECK(ta >= t0 && ta <= t1 && tb >= ta && tb <= t1);
    CHECK(ub == ua + 1);
    CHECK(strcmp(ft_tb_path(a), ft_tb_path(b)) != 0);
    ft_tb_close(a);
    ft_tb_close(b);
    int files = 0;
    DIR *d = opendir(logdir);
    CHECK(d != NULL);
    for (struct dirent *e; d && (e = readdir(d));)
        files += strstr(e->d_name, "tfevents") != NULL;
    if (d)
        closedir(d);
    CHECK(files == 2);
}

/* Checks the Event in r: wall_time in [t0, t1], step, and returns its summary's single
 * value through *value. */
static int check_summary_event(const record *r, double t0, double t1, int64_t step, pb_field *value)
{
    pb_field f;
    int ok = 1;
    ok &= pb_count_fields(r->data, r->n) == 3;
    ok &= pb_find(r->data, r->n, 1, &f) && f.wt == 1 && field_double(&f) >= t0 &&
          field_double(&f) <= t1;
    ok &= pb_find(r->data, r->n, 2, &f) && f.wt == 0 && (int64_t)f.v == step;
    pb_field summary;
    ok &= pb_find(r->data, r->n, 5, &summary) && summary.wt == 2;
    ok &= ok && pb_count_fields(summary.p, summary.len) == 1;
    ok &= ok && pb_find(summary.p, summary.len, 1, value) && value->wt == 2;
    return ok;
}

static void test_records(void)
{
    char logdir[512];
    snprintf(logdir, sizeof logdir, "%s/records", tmp_dir);
    ft_err err;
    ft_tb_writer *w = NULL;
    double t0 = now() - 1e-3;
    CHECK(ft_tb_open(&w, logdir, &err) == 0);
    if (!w)
        return;
    const char *text = "## lr\n| a | b |\n|---|---|\n| 1 | 2 |\ncaf\xc3\xa9";
    CHECK(ft_tb_scalar(w, "train/loss", 0, 2.5, &err) == 0);
    CHECK(ft_tb_scalar(w, "train/lr", 1, 0.1, &err) == 0);
    CHECK(ft_tb_scalar(w, "train/loss", INT64_C(1) << 40, -3.0e-7, &err) == 0);
    CHECK(ft_tb_scalar(w, "neg", -5, 1e39, &err) == 0); /* float overflow: +inf */
    CHECK(ft_tb_text(w, "config", 7, text, &err) == 0);
    CHECK(ft_tb_text(w, "empty", 8, "", &err) == 0);
    CHECK(ft_tb_flush(w, &err) == 0);
    char path[4096];
    snprintf(path, sizeof path, "%s", ft_tb_path(w));
    ft_tb_close(w);
    double t1 = now() + 1e-3;

    size_t n;
    unsigned char *buf = slurp(path, &n);
    CHECK(buf != NULL);
    if (!buf)
        return;
    record r[16];
    int count = read_records(buf, n, r, 16);
    CHECK(count == 7);
    if (count != 7) {
        free(buf);
        return;
    }

    /* Event{wall_time, file_version} */
    pb_field f;
    CHECK(pb_count_fields(r[0].data, r[0].n) == 2);
    CHECK(pb_find(r[0].data, r[0].n, 1, &f) && f.wt == 1);
    CHECK(field_double(&f) >= t0 && field_double(&f) <= t1);
    CHECK(pb_find(r[0].data, r[0].n, 3, &f) && field_is_str(&f, "brain.Event:2"));

    /* Value{tag, simple_value} */
    static const struct {
        const char *tag;
        int64_t step;
        float value;
    } scalars[] = {{"train/loss", 0, 2.5f},
                   {"train/lr", 1, 0.1f},
                   {"train/loss", INT64_C(1) << 40, -3.0e-7f},
                   {"neg", -5, (float)INFINITY}};
    for (int i = 0; i < 4; i++) {
        pb_field v;
        CHECK(check_summary_event(&r[1 + i], t0, t1, scalars[i].step, &v));
        CHECK(pb_count_fields(v.p, v.len) == 2);
        CHECK(pb_find(v.p, v.len, 1, &f) && field_is_str(&f, scalars[i].tag));
        CHECK(pb_find(v.p, v.len, 2, &f) && f.wt == 5);
        float got = field_float(&f);
        CHECK(memcmp(&got, &scalars[i].value, sizeof got) == 0);
    }
    /* step -5 is the 10-byte varint of its two's complement */
    CHECK(pb_find(r[4].data, r[4].n, 2, &f) && f.v == (uint64_t)INT64_C(-5));

    /* Value{tag, tensor{dtype DT_STRING, tensor_shape {}, string_val}, metadata{
     * plugin_data{plugin_name "text"}}} */
    const char *texts[] = {text, ""}, *tags[] = {"config", "empty"};
    for (int i = 0; i < 2; i++) {
        pb_field v, tensor, shape, md, plugin;
        CHECK(check_summary_event(&r[5 + i], t0, t1, 7 + i, &v));
        CHECK(pb_count_fields(v.p, v.len) == 3);
        CHECK(pb_find(v.p, v.len, 1, &f) && field_is_str(&f, tags[i]));
        CHECK(pb_find(v.p, v.len, 8, &tensor) && tensor.wt == 2);
        CHECK(pb_count_fields(tensor.p, tensor.len) == 3);
        CHECK(pb_find(tensor.p, tensor.len, 1, &f) && f.wt == 0 && f.v == 7);
        CHECK(pb_find(tensor.p, tensor.len, 2, &shape) && shape.wt == 2 && shape.len == 0);
        CHECK(pb_find(tensor.p, tensor.len, 8, &f) && field_is_str(&f, texts[i]));
        CHECK(pb_find(v.p, v.len, 9, &md) && md.wt == 2);
        CHECK(pb_count_fields(md.p, md.len) == 1);
        CHECK(pb_find(md.p, md.len, 1, &plugin) && plugin.wt == 2);
        CHECK(pb_count_fields(plugin.p, plugin.len) == 1);
        CHECK(pb_find(plugin.p, plugin.len, 1, &f) && field_is_str(&f, "text"));
    }

    /* A flipped byte anywhere is caught by one of the two CRCs. */
    int caught = 0;
    for (size_t i = 0; i < n; i++) {
        buf[i] ^= 0x20;
        caught += read_records(buf, n, r, 16) < 0;
        buf[i] ^= 0x20;
    }
    CHECK(caught == (int)n);
    free(buf);
}

static void test_write_error(void)
{
    /* /dev/full: every write fails with ENOSPC, so the first record does. */
    ft_err err = {0};
    ft_tb_writer *w = (ft_tb_writer *)&err;
    CHECK(ft_tb_open_path(&w, "/dev/full", &err) == -1);
    CHECK(w == NULL);
    CHECK(strstr(err.msg, "/dev/full") != NULL);
    CHECK(strstr(err.msg, "No space") != NULL);
}

static void test_open_error(void)
{
    char file[512], logdir[600];
    snprintf(file, sizeof file, "%s/plain-file", tmp_dir);
    FILE *f = fopen(file, "w");
    CHECK(f != NULL);
    if (f)
        fclose(f);
    snprintf(logdir, sizeof logdir, "%s/sub", file);
    ft_err err = {0};
    ft_tb_writer *w = NULL;
    CHECK(ft_tb_open(&w, logdir, &err) == -1);
    CHECK(w == NULL);
    CHECK(strstr(err.msg, file) != NULL);
    ft_tb_close(NULL);
}

int main(void)
{
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/ft_tb_test_XXXXXX");
    if (!mkdtemp(tmp_dir)) {
        perror("mkdtemp");
        return 1;
    }
    RUN(test_crc32c_vectors);
    RUN(test_crc32c_slices);
    RUN(test_masked_header_crc);
    RUN(test_file_name);
    RUN(test_records);
    RUN(test_write_error);
    RUN(test_open_error);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp_dir);
    if (system(cmd) != 0)
        fprintf(stderr, "warning: could not remove %s\n", tmp_dir);
    return check_summary("tb_writer");
}
