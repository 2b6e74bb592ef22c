/* safetensors: reader (mmap, validated), writer (atomic), sharded checkpoints.
 *
 * File layout:
 *
 *   bytes 0..7        N, the header length, u64 little-endian; N <= 100,000,000
 *   bytes 8..8+N      UTF-8 JSON object, padded with spaces (the writer pads so that
 *                     8 + N is a multiple of 8):
 *                       name -> {"dtype": "F32", "shape": [d0, d1, ...],
 *                                "data_offsets": [begin, end]}
 *                       "__metadata__" -> {str: str}                   (optional)
 *   bytes 8+N..EOF    the data buffer. A tensor is bytes [begin, end) of it,
 *                     little-endian, row-major, no strides.
 *
 * The tensors tile the data buffer exactly, as the reference (Rust) reader demands:
 * sorted by (begin, end), the first begins at 0, each begins where the previous one
 * ends, the last ends at EOF, and end - begin == prod(shape) * dtype size, computed
 * with overflow checks. Shape [] is a scalar (1 element); a 0 dimension is 0 bytes.
 *
 * The reference writer sorts tensors by dtype, descending in the enum order of
 * ft_st_dtype (the reference's own order, increasing alignment), then by name
 * byte-wise, so that each tensor begins aligned to its element size once the header
 * is padded to a multiple of 8. We do the same, and emit the same compact JSON
 * ("__metadata__" first, then the tensors with keys dtype, shape, data_offsets).
 *
 * Sharded checkpoint: <base>-00001-of-0000n.safetensors ... plus
 * <base>.safetensors.index.json = {"metadata": {"total_size": bytes of tensor data},
 * "weight_map": {tensor name: shard file name}}.
 */
#include "formats/safetensors.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/fsutil.h"
#include "formats/json_file.h"

#define ST_MAX_HEADER 100000000ull

/* ---------------------------------------------------------------- dtypes */

static const struct {
    const char *name;
    size_t size;
} dtype_info[FT_ST_NDTYPES] = {
    [FT_ST_BOOL] = {"BOOL", 1},       [FT_ST_U8] = {"U8", 1},
    [FT_ST_I8] = {"I8", 1},           [FT_ST_F8_E5M2] = {"F8_E5M2", 1},
    [FT_ST_F8_E4M3] = {"F8_E4M3", 1}, [FT_ST_I16] = {"I16", 2},
    [FT_ST_U16] = {"U16", 2},         [FT_ST_F16] = {"F16", 2},
    [FT_ST_BF16] = {"BF16", 2},       [FT_ST_I32] = {"I32", 4},
    [FT_ST_U32] = {"U32", 4},         [FT_ST_F32] = {"F32", 4},
    [FT_ST_F64] = {"F64", 8},         [FT_ST_I64] = {"I64", 8},
    [FT_ST_U64] = {"U64", 8},
};

static bool dtype_valid(ft_st_dtype dt)
{
    return (unsigned)dt < FT_ST_NDTYPES;
}

const char *ft_st_dtype_name(ft_st_dtype dt)
{
    return dtype_valid(dt) ? dtype_info[dt].name : NULL;
}

int ft_st_dtype_parse(const char *name)
{
    if (!name)
        return -1;
    for (int i = 0; i < FT_ST_NDTYPES; i++)
        if (strcmp(name, dtype_info[i].name) == 0)
            return i;
    return -1;
}

size_t ft_st_dtype_size(ft_st_dtype dt)
{
    return dtype_valid(dt) ? dtype_info[dt].size : 0;
}

/* ---------------------------------------------------------------- fp16 / bf16
 *
 * bf16 is the upper half of an fp32. fp16 (IEEE binary16): 1 sign, 5 exponent
 * (bias 15), 10 mantissa bits; exponent 0 holds zero and subnormals (mant * 2^-24),
 * exponent 31 holds inf and NaN. Narrowing rounds to nearest, ties to even; NaN stays
 * a (quiet) NaN with its sign, values too large become inf. */

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

float ft_bf16_to_f32(uint16_t h)
{
    return bits_f32((uint32_t)h << 16);
}

float ft_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    if (exp == 0) {
        float v = (float)mant * 0x1p-24f; /* zero or subnormal, exact in fp32 */
        return sign ? -v : v;
    }
    if (exp == 31)
        return bits_f32(sign | 0x7f800000u | (mant << 13));
    return bits_f32(sign | ((exp + 112u) << 23) | (mant << 13));
}

uint16_t ft_f32_to_bf16(float f)
{
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep sign and payload top, set quiet */
        return (uint16_t)((u >> 16) | 0x0040u);
    /* Adding 0x7fff plus the lowest kept bit rounds to nearest even; a carry out of
     * the mantissa bumps the exponent, and past the largest finite value gives inf. */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* Rounds m >> shift to nearest even (1 <= shift <= 31). */
static uint32_t shift_round_even(uint32_t m, unsigned shift)
{
    uint32_t r = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1u)))
        r++;
    return r;
}

uint16_t ft_f32_to_f16(float f)
{
    uint32_t u = f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t x = u & 0x7fffffffu;
    if (x > 0x7f800000u) /* NaN */
        return (uint16_t)(sign | 0x7e00u | ((x >> 13) & 0x3ffu));
    if (x >= 0x477ff000u) /* >= 65520 = 65504 + half an ulp (ties to even: up): inf */
        return (uint16_t)(sign | 0x7c00u);
    if (x >= 0x38800000u) { /* >= 2^-14: a normal half; rebias the exponent 127 -> 15 */
        uint32_t h = (x >> 13) - (112u << 10), rem = x & 0x1fffu;
        if (rem > 0x1000u || (rem == 0x1000u && (h & 1u)))
            h++; /* a carry into the exponent is the correct rounding */
        return (uint16_t)(sign | h);
    }
    /* Subnormal half: round(x / 2^-24). An fp32 with biased exponent e and 24-bit
     * significand m is m * 2^(e - 150), so the quotient is m >> (126 - e). Below
     * 2^-25 (e < 102) everything rounds to zero. */
    uint32_t e = x >> 23;
    if (e < 102)
        return sign;
    uint32_t m = (x & 0x7fffffu) | 0x800000u;
    return (uint16_t)(sign | shift_round_even(m, 126u - e));
}

/* ---------------------------------------------------------------- small helpers */

static char *str_printf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *str_printf(const char *fmt, ...)
{
    va_list ap;
    char *s;
    va_start(ap, fmt);
    int n = vasprintf(&s, fmt, ap);
    va_end(ap);
    return n < 0 ? NULL : s;
}

/* calloc that never returns NULL for a successful zero-length request. */
static void *alloc_array(size_t n, size_t size)
{
    return calloc(n ? n : 1, size);
}

/* "[4, 3]" into buf. */
static void format_shape(char *buf, size_t cap, const int64_t *shape, int ndim)
{
    size_t len = 0;
    buf[0] = '\0';
    for (int i = 0; i < ndim && len < cap; i++)
        len += (size_t)snprintf(buf + len, cap - len, "%s%lld", i ? ", " : "[",
                                (long long)shape[i]);
    if (len < cap)
        snprintf(buf + len, cap - len, "%s", ndim ? "]" : "[]");
}

/* prod(shape) and prod(shape) * elem_size, failing on overflow the way the reference
 * does (multiplying left to right, so [2^62, 8, 0] overflows although it is empty). */
static bool shape_bytes(const int64_t *shape, int ndim, size_t elem_size, size_t *numel,
                        size_t *nbytes)
{
    size_t n = 1;
    for (int i = 0; i < ndim; i++)
        if (shape[i] < 0 || __builtin_mul_overflow(n, (uint64_t)shape[i], &n))
            return false;
    *numel = n;
    return !__builtin_mul_overflow(n, elem_size, nbytes);
}

static int cmp_tensor_ptr_name(const void *a, const void *b)
{
    const ft_st_tensor *x = *(const ft_st_tensor *const *)a;
    const ft_st_tensor *y = *(const ft_st_tensor *const *)b;
    return strcmp(x->name, y->name);
}

/* A name index is an array of tensor pointers sorted by name, searched by bisection. */
static const ft_st_tensor **name_index_build(const ft_st_tensor *const *items, size_t n)
{
    const ft_st_tensor **idx = alloc_array(n, sizeof *idx);
    if (!idx)
        return NULL;
    if (n)
        memcpy(idx, items, n * sizeof *idx);
    qsort(idx, n, sizeof *idx, cmp_tensor_ptr_name);
    return idx;
}

static const ft_st_tensor *name_index_find(const ft_st_tensor *const *idx, size_t n,
                                           const char *name)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(name, idx[mid]->name);
        if (c == 0)
            return idx[mid];
        if (c < 0)
            hi = mid;
        else
            lo = mid + 1;
    }
    return NULL;
}

/* ---------------------------------------------------------------- reading */

struct ft_st_file {
    char *path;
    void *map;
    size_t map_len;
    ft_st_tensor *tensors; /* n of them, in data-offset order */
    size_t n;
    const ft_st_tensor **by_name; /* n, sorted by name */
    json_t *meta;                 /* the "__metadata__" object, or NULL */
};

/* A tensor entry while parsing: its offsets travel with it through the sort. */
typedef struct st_slot {
    uint64_t begin, end;
    ft_st_tensor t;
} st_slot;

static int cmp_slot(const void *a, const void *b)
{
    const st_slot *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end)
        return x->end < y->end ? -1 : 1;
    return strcmp(x->t.name, y->t.name);
}

static bool json_u64(const json_t *v, uint64_t *out)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return false;
    *out = (uint64_t)json_integer_value(v);
    return true;
}

static int map_file(ft_st_file *f, ft_err *err)
{
    int fd = ft_open_regular(f->path, err); /* a FIFO would block the open */
    if (fd < 0)
        return -1;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return ft_fail(err, "%s: cannot stat: %s", f->path, strerror(e));
    }
    if (st.st_size < 8) {
        close(fd);
        return ft_fail(err, "%s: file is %lld bytes, too short for the 8-byte header length",
                       f->path, (long long)st.st_size);
    }
    f->map_len = (size_t)st.st_size;
    void *map = mmap(NULL, f->map_len, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (map == MAP_FAILED)
        return ft_fail(err, "%s: cannot mmap: %s", f->path, strerror(e));
    f->map = map;
    return 0;
}

static int check_metadata(const char *path, json_t *m, ft_err *err)
{
    const char *key;
    json_t *v;
    if (!json_is_object(m))
        return ft_fail(err, "%s: \"__metadata__\" is not an object of strings", path);
    json_object_foreach(m, key, v) {
        if (!json_is_string(v))
            return ft_fail(err, "%s: \"__metadata__\" value of '%s' is not a string", path,
                           key);
    }
    return 0;
}

/* Validates one header entry (everything but its place in the buffer) into s. */
static int parse_entry(const char *path, const char *name, const json_t *v, st_slot *s,
                       ft_err *err)
{
    ft_st_tensor *t = &s->t;
    if (!json_is_object(v))
        return ft_fail(err, "%s: tensor '%s': header entry is not a JSON object", path, name);

    const json_t *jd = json_object_get(v, "dtype");
    if (!json_is_string(jd))
        return ft_fail(err, "%s: tensor '%s': \"dtype\" is missing or not a string", path,
                       name);
    int dt = ft_st_dtype_parse(json_string_value(jd));
    if (dt < 0)
        return ft_fail(err, "%s: tensor '%s': unknown dtype '%s'", path, name,
                       json_string_value(jd));
    t->dtype = (ft_st_dtype)dt;

    const json_t *js = json_object_get(v, "shape");
    if (!json_is_array(js))
        return ft_fail(err, "%s: tensor '%s': \"shape\" is missing or not an array", path,
                       name);
    size_t nd = json_array_size(js);
    if (nd > FT_ST_MAX_DIMS)
        return ft_fail(err, "%s: tensor '%s': shape has %zu dimensions, at most %d supported",
                       path, name, nd, FT_ST_MAX_DIMS);
    t->ndim = (int)nd;
    for (size_t i = 0; i < nd; i++) {
        uint64_t d;
        if (!json_u64(json_array_get(js, i), &d))
            return ft_fail(err, "%s: tensor '%s': shape[%zu] is not a non-negative integer",
                           path, name, i);
        t->shape[i] = (int64_t)d;
    }

    const json_t *jo = json_object_get(v, "data_offsets");
    if (!json_is_array(jo) || json_array_size(jo) != 2 ||
        !json_u64(json_array_get(jo, 0), &s->begin) ||
        !json_u64(json_array_get(jo, 1), &s->end))
        return ft_fail(err,
                       "%s: tensor '%s': \"data_offsets\" is missing or not [begin, end] "
                       "with non-negative integers",
                       path, name);

    char shape_str[256];
    format_shape(shape_str, sizeof shape_str, t->shape, t->ndim);
    if (!shape_bytes(t->shape, t->ndim, dtype_info[dt].size, &t->numel, &t->nbytes))
        return ft_fail(err, "%s: tensor '%s': shape %s of %s overflows the element or byte "
                            "count",
                       path, name, shape_str, dtype_info[dt].name);
    if (s->end < s->begin)
        return ft_fail(err, "%s: tensor '%s': data_offsets [%llu, %llu) end before they begin",
                       path, name, (unsigned long long)s->begin, (unsigned long long)s->end);
    if (s->end - s->begin != t->nbytes)
        return ft_fail(err, "%s: tensor '%s': data_offsets [%llu, %llu) hold %llu bytes but "
                            "shape %s of %s needs %zu",
                       path, name, (unsigned long long)s->begin, (unsigned long long)s->end,
                       (unsigned long long)(s->end - s->begin), shape_str,
                       dtype_info[dt].name, t->nbytes);
    t->name = strdup(name);
    if (!t->name)
        return ft_fail(err, "%s: tensor '%s': out of memory", path, name);
    t->file = path;
    return 0;
}

/* Checks that the sorted slots tile [0, data_len) exactly. */
static int check_tiling(const char *path, const st_slot *s, size_t n, uint64_t data_len,
                        ft_err *err)
{
    uint64_t pos = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i].begin > pos)
            return ft_fail(err, "%s: tensor '%s': data_offsets [%llu, %llu) leave a gap "
                                "after offset %llu (tensors must be contiguous)",
                           path, s[i].t.name, (unsigned long long)s[i].begin,
                           (unsigned long long)s[i].end, (unsigned long long)pos);
        if (s[i].begin < pos)
            return ft_fail(err, "%s: tensor '%s': data_offsets [%llu, %llu) overlap the "
                                "previous tensor, which ends at %llu",
                           path, s[i].t.name, (unsigned long long)s[i].begin,
                           (unsigned long long)s[i].end, (unsigned long long)pos);
        pos = s[i].end;
    }
    if (pos > data_len)
        return ft_fail(err, "%s: tensor '%s': data_offsets end at %llu, past the end of the "
                            "file (the data buffer holds %llu bytes)",
                       path, s[n - 1].t.name, (unsigned long long)pos,
                       (unsigned long long)data_len);
    if (pos < data_len)
        return ft_fail(err, "%s: %llu trailing bytes after the last tensor (the tensors end "
                            "at %llu, the data buffer holds %llu bytes)",
                       path, (unsigned long long)(data_len - pos), (unsigned long long)pos,
                       (unsigned long long)data_len);
    return 0;
}

static int parse_entries(ft_st_file *f, json_t *root, const unsigned char *data,
                         size_t data_len, ft_err *err)
{
    size_t cap = json_object_size(root), n = 0;
    st_slot *slots = alloc_array(cap, sizeof *slots);
    if (!slots)
        return ft_fail(err, "%s: out of memory for %zu header entries", f->path, cap);

    int rc = 0;
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        if (strcmp(key, "__metadata__") == 0) {
            if (json_is_null(v)) /* the reference reads null as "no metadata" */
                continue;
            if ((rc = check_metadata(f->path, v, err)) != 0)
                break;
            f->meta = json_incref(v);
            continue;
        }
        if ((rc = parse_entry(f->path, key, v, &slots[n], err)) != 0)
            break;
        n++;
    }
    if (rc == 0) {
        qsort(slots, n, sizeof *slots, cmp_slot);
        rc = check_tiling(f->path, slots, n, data_len, err);
    }
    if (rc == 0) {
        f->tensors = alloc_array(n, sizeof *f->tensors);
        const ft_st_tensor **ptrs = alloc_array(n, sizeof *ptrs);
        if (f->tensors && ptrs) {
            for (size_t i = 0; i < n; i++) {
                f->tensors[i] = slots[i].t;
                f->tensors[i].data = data + slots[i].begin; /* in bounds: tiling checked */
                ptrs[i] = &f->tensors[i];
            }
            f->n = n;
            n = 0; /* names now owned by f->tensors */
            f->by_name = name_index_build(ptrs, f->n);
        }
        free(ptrs);
        if (!f->tensors || !f->by_name)
            rc = ft_fail(err, "%s: out of memory", f->path);
    }
    for (size_t i = 0; i < n; i++)
        free(slots[i].t.name);
    free(slots);
    return rc;
}

static int parse_header(ft_st_file *f, ft_err *err)
{
    const unsigned char *p = f->map;
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--)
        n = (n << 8) | p[i];
    if (n > ST_MAX_HEADER)
        return ft_fail(err, "%s: header length %llu exceeds the limit of %llu bytes", f->path,
                       (unsigned long long)n, ST_MAX_HEADER);
    if (n > f->map_len - 8)
        return ft_fail(err, "%s: header of %llu bytes runs past the end of the file (%zu "
                            "bytes)",
                       f->path, (unsigned long long)n, f->map_len);

    /* json_loadb takes a length (the header is not NUL-terminated), checks UTF-8,
     * allows trailing whitespace (the padding) and, with this flag, rejects a name
     * given twice. */
    json_error_t je;
    json_t *root = json_loadb((const char *)p + 8, (size_t)n, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return ft_fail(err, "%s: header is not valid JSON: %s (at byte %d of the header)",
                       f->path, je.text, je.position);
    int rc = 0;
    if (!json_is_object(root))
        rc = ft_fail(err, "%s: header is not a JSON object", f->path);
    else
        rc = parse_entries(f, root, p + 8 + n, f->map_len - 8 - (size_t)n, err);
    json_decref(root);
    return rc;
}

int ft_st_open(ft_st_file **out, const char *path, ft_err *err)
{
    *out = NULL;
    ft_st_file *f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup(path))) {
        free(f);
        return ft_fail(err, "%s: out of memory", path);
    }
    if (map_file(f, err) != 0 || parse_header(f, err) != 0) {
        ft_st_close(f);
        return -1;
    }
    *out = f;
    return 0;
}

void ft_st_close(ft_st_file *f)
{
    if (!f)
        return;
    if (f->map)
        munmap(f->map, f->map_len);
    for (size_t i = 0; i < f->n; i++)
        free(f->tensors[i].name);
    free(f->tensors);
    free(f->by_name);
    json_decref(f->meta);
    free(f->path);
    free(f);
}

size_t ft_st_count(const ft_st_file *f)
{
    return f->n;
}

const ft_st_tensor *ft_st_at(const ft_st_file *f, size_t i)
{
    return i < f->n ? &f->tensors[i] : NULL;
}

const ft_st_tensor *ft_st_find(const ft_st_file *f, const char *name)
{
    return name_index_find(f->by_name, f->n, name);
}

const char *ft_st_metadata(const ft_st_file *f, const char *key)
{
    return f->meta ? json_string_value(json_object_get(f->meta, key)) : NULL;
}

size_t ft_f32_first_nonfinite(const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, b + 4 * i, sizeof u);
        if ((u & 0x7f800000u) == 0x7f800000u)
            return i;
    }
    return n;
}

/* The index of the first element of t (F32, F16 or BF16) whose exponent bits are all
 * ones (an infinity or a NaN), or t->numel. */
static size_t first_nonfinite(const ft_st_tensor *t)
{
    if (t->dtype == FT_ST_F32)
        return ft_f32_first_nonfinite(t->data, t->numel);
    const unsigned char *src = t->data;
    uint16_t mask = t->dtype == FT_ST_BF16 ? 0x7f80u : 0x7c00u;
    for (size_t i = 0; i < t->numel; i++) {
        uint16_t h;
        memcpy(&h, src + 2 * i, sizeof h);
        if ((h & mask) == mask)
            return i;
    }
    return t->numel;
}

/* Element i of t as "[3, 5]" (row-major) and the value's kind, into an error. */
static int nonfinite_error(const ft_st_tensor *t, const float *dst, size_t i, ft_err *err)
{
    char idx[160], shape[160];
    size_t len = 0, rest = i;
    int64_t sub[FT_ST_MAX_DIMS];
    for (int d = t->ndim - 1; d >= 0; d--) {
        sub[d] = t->shape[d] ? (int64_t)(rest % (uint64_t)t->shape[d]) : 0;
        rest = t->shape[d] ? rest / (uint64_t)t->shape[d] : 0;
    }
    idx[0] = '\0';
    for (int d = 0; d < t->ndim && len < sizeof idx; d++)
        len += (size_t)snprintf(idx + len, sizeof idx - len, "%s%lld", d ? ", " : "[",
                                (long long)sub[d]);
    if (len < sizeof idx)
        snprintf(idx + len, sizeof idx - len, "%s", t->ndim ? "]" : "[]");
    format_shape(shape, sizeof shape, t->shape, t->ndim);
    float v = dst[i];
    return ft_fail(err, "%s: tensor '%s' (shape %s): element %s is %s; weights must be finite",
                   t->file, t->name, shape, idx, isnan(v) ? "NaN" : v > 0 ? "inf" : "-inf");
}

/* The conversion; with `finite`, the exponent bits of every value are checked on the way
 * (or-ed into one flag, so the loop stays a straight copy), and the first bad element is
 * looked up only when there is one. */
static int to_f32(const ft_st_tensor *t, float *dst, size_t n, bool finite, ft_err *err)
{
    if (n != t->numel)
        return ft_fail(err, "%s: tensor '%s': destination holds %zu values, the tensor %zu",
                       t->file, t->name, n, t->numel);
    /* The data may sit at any address in the mapping: load through memcpy. */
    const unsigned char *src = t->data;
    bool bad = false;
    switch (t->dtype) {
    case FT_ST_F32: {
        if (!finite) {
            if (n)
                memcpy(dst, src, n * sizeof *dst);
            break;
        }
        uint32_t any = 0;
        for (size_t i = 0; i < n; i++) {
            uint32_t u;
            memcpy(&u, src + 4 * i, sizeof u);
            any |= (uint32_t)((u & 0x7f800000u) == 0x7f800000u);
            memcpy(dst + i, &u, sizeof u);
        }
        bad = any;
        break;
    }
    case FT_ST_BF16:
    case FT_ST_F16: {
        uint16_t mask = t->dtype == FT_ST_BF16 ? 0x7f80u : 0x7c00u, any = 0;
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, src + 2 * i, sizeof h);
            any |= (uint16_t)((h & mask) == mask);
            dst[i] = t->dtype == FT_ST_BF16 ? ft_bf16_to_f32(h) : ft_f16_to_f32(h);
        }
        bad = finite && any;
        break;
    }
    default:
        return ft_fail(err, "%s: tensor '%s': dtype %s cannot be read as fp32 (only F32, "
                            "F16 and BF16 can)",
                       t->file, t->name, ft_st_dtype_name(t->dtype));
    }
    return bad ? nonfinite_error(t, dst, first_nonfinite(t), err) : 0;
}

int ft_st_to_f32(const ft_st_tensor *t, float *dst, size_t n, ft_err *err)
{
    return to_f32(t, dst, n, false, err);
}

int ft_st_to_f32_finite(const ft_st_tensor *t, float *dst, size_t n, ft_err *err)
{
    return to_f32(t, dst, n, true, err);
}

/* ---------------------------------------------------------------- checkpoints */

struct ft_checkpoint {
    ft_st_file **files;
    size_t nfiles;
    const ft_st_tensor **list; /* n: shard by shard, in file order */
    const ft_st_tensor **by_name;
    size_t n;
};

typedef struct st_mapping {
    const char *name, *file; /* into the index JSON */
} st_mapping;

static int cmp_mapping(const void *a, const void *b)
{
    const st_mapping *x = a, *y = b;
    int c = strcmp(x->file, y->file);
    return c ? c : strcmp(x->name, y->name);
}

static int cmp_ptr(const void *a, const void *b)
{
    uintptr_t x = (uintptr_t)*(const void *const *)a;
    uintptr_t y = (uintptr_t)*(const void *const *)b;
    return x < y ? -1 : x > y;
}

static bool path_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 || errno != ENOENT;
}

static int ckpt_open_single(ft_checkpoint *c, const char *path, ft_err *err)
{
    c->files = calloc(1, sizeof *c->files);
    if (!c->files)
        return ft_fail(err, "%s: out of memory", path);
    if (ft_st_open(&c->files[0], path, err) != 0)
        return -1;
    c->nfiles = 1;
    ft_st_file *f = c->files[0];
    c->list = alloc_array(f->n, sizeof *c->list);
    if (!c->list)
        return ft_fail(err, "%s: out of memory", path);
    for (size_t i = 0; i < f->n; i++)
        c->list[i] = &f->tensors[i];
    c->n = f->n;
    return 0;
}

static bool shard_name_ok(const char *s)
{
    return s[0] != '\0' && !strchr(s, '/') && !strstr(s, "..");
}

/* Opens the shards of one file group (entries m[0..k), all naming the same file) and
 * resolves each entry in it. */
static int ckpt_open_group(ft_checkpoint *c, const char *dir, const char *index,
                           const st_mapping *m, size_t k, ft_err *err)
{
    char *path = str_printf("%s/%s", dir, m[0].file);
    if (!path)
        return ft_fail(err, "%s: out of memory", index);
    ft_st_file *f;
    int rc = ft_st_open(&f, path, err);
    if (rc != 0) {
        free(path);
        return ft_fail_prefix(err, "%s: shard '%s'", index, m[0].file);
    }
    c->files[c->nfiles++] = f;
    const ft_st_tensor **start = c->list + c->n;
    for (size_t i = 0; i < k && rc == 0; i++) {
        const ft_st_tensor *t = ft_st_find(f, m[i].name);
        if (!t)
            rc = ft_fail(err, "%s: tensor '%s' is mapped to '%s', but %s does not contain it",
                         index, m[i].name, m[0].file, path);
        else
            c->list[c->n++] = t;
    }
    qsort(start, (size_t)(c->list + c->n - start), sizeof *start, cmp_ptr);
    free(path);
    return rc;
}

static int ckpt_open_index(ft_checkpoint *c, const char *dir, const char *index,
                           ft_err *err)
{
    json_t *root = ft_json_read_file(index, 0, err);
    if (!root)
        return -1;
    int rc = 0;
    json_t *meta = json_object_get(root, "metadata");
    json_t *wm = json_object_get(root, "weight_map");
    st_mapping *m = NULL;
    if (!json_is_object(root))
        rc = ft_fail(err, "%s: not a JSON object", index);
    else if (meta && !json_is_object(meta) && !json_is_null(meta))
        rc = ft_fail(err, "%s: \"metadata\" is not an object", index);
    else if (!json_is_object(wm))
        rc = ft_fail(err, "%s: \"weight_map\" is missing or not an object", index);
    size_t n = rc == 0 ? json_object_size(wm) : 0;
    if (rc == 0) {
        m = alloc_array(n, sizeof *m);
        c->list = alloc_array(n, sizeof *c->list);
        c->files = alloc_array(n, sizeof *c->files);
        if (!m || !c->list || !c->files)
            rc = ft_fail(err, "%s: out of memory", index);
    }
    size_t k = 0;
    const char *key;
    json_t *v;
    if (rc == 0) {
        json_object_foreach(wm, key, v) {
            if (!json_is_string(v)) {
                rc = ft_fail(err, "%s: weight_map entry of tensor '%s' is not a string", index,
                             key);
                break;
            }
            if (!shard_name_ok(json_string_value(v))) {
                rc = ft_fail(err, "%s: tensor '%s': shard '%s' must be a file name in the "
                                  "checkpoint directory (no '/' or '..')",
                             index, key, json_string_value(v));
                break;
            }
            m[k++] = (st_mapping){key, json_string_value(v)};
        }
    }
    if (rc == 0) {
        qsort(m, n, sizeof *m, cmp_mapping); /* groups each shard's tensors together */
        for (size_t i = 0; i < n && rc == 0;) {
            size_t j = i + 1;
            while (j < n && strcmp(m[j].file, m[i].file) == 0)
                j++;
            rc = ckpt_open_group(c, dir, index, m + i, j - i, err);
            i = j;
        }
    }
    free(m);
    json_decref(root);
    return rc;
}

int ft_ckpt_open(ft_checkpoint **out, const char *dir, const char *basename, ft_err *err)
{
    *out = NULL;
    ft_checkpoint *c = calloc(1, sizeof *c);
    char *single = str_printf("%s/%s.safetensors", dir, basename);
    char *index = str_printf("%s/%s.safetensors.index.json", dir, basename);
    struct stat st;
    int rc;
    if (!c || !single || !index)
        rc = ft_fail(err, "%s: out of memory", dir);
    else if (stat(dir, &st) != 0)
        rc = ft_fail(err, "%s: cannot open checkpoint directory: %s", dir, strerror(errno));
    else if (path_exists(single)) /* the single file wins, as in transformers */
        rc = ckpt_open_single(c, single, err);
    else if (path_exists(index))
        rc = ckpt_open_index(c, dir, index, err);
    else
        rc = ft_fail(err, "%s: no checkpoint: neither %s.safetensors nor "
                          "%s.safetensors.index.json exists",
                     dir, basename, basename);
    if (rc == 0) {
        c->by_name = name_index_build(c->list, c->n);
        if (!c->by_name)
            rc = ft_fail(err, "%s: out of memory", dir);
    }
    free(single);
    free(index);
    if (rc != 0) {
        ft_ckpt_close(c);
        return -1;
    }
    *out = c;
    return 0;
}

void ft_ckpt_close(ft_checkpoint *c)
{
    if (!c)
        return;
    for (size_t i = 0; i < c->nfiles; i++)
        ft_st_close(c->files[i]);
    free(c->files);
    free(c->list);
    free(c->by_name);
    free(c);
}

const ft_st_tensor *ft_ckpt_find(const ft_checkpoint *c, const char *name)
{
    return name_index_find(c->by_name, c->n, name);
}

size_t ft_ckpt_count(const ft_checkpoint *c)
{
    return c->n;
}

const ft_st_tensor *ft_ckpt_at(const ft_checkpoint *c, size_t i)
{
    return i < c->n ? c->list[i] : NULL;
}

/* ---------------------------------------------------------------- writing */

typedef struct st_entry {
    char *name;
    ft_st_dtype dtype;
    int ndim;
    int64_t shape[FT_ST_MAX_DIMS];
    const void *data; /* the caller's */
    size_t nbytes;
    bool glued;       /* goes into the shard of the entry before it (ft_st_writer_group) */
} st_entry;

struct ft_st_writer {
    st_entry *e;
    size_t n, cap;
    json_t *names; /* the names added so far, as keys of a JSON object (a hash set) */
    json_t *meta;  /* key -> string */
    void **kept;   /* buffers handed over by ft_st_writer_keep */
    size_t n_kept;
};

ft_st_writer *ft_st_writer_new(void)
{
    ft_st_writer *w = calloc(1, sizeof *w);
    if (!w)
        return NULL;
    w->names = json_object();
    w->meta = json_object();
    if (!w->names || !w->meta) {
        ft_st_writer_free(w);
        return NULL;
    }
    return w;
}

void ft_st_writer_free(ft_st_writer *w)
{
    if (!w)
        return;
    for (size_t i = 0; i < w->n; i++)
        free(w->e[i].name);
    free(w->e);
    for (size_t i = 0; i < w->n_kept; i++)
        free(w->kept[i]);
    free(w->kept);
    json_decref(w->names);
    json_decref(w->meta);
    free(w);
}

int ft_st_writer_keep(ft_st_writer *w, void *buf)
{
    void **k = realloc(w->kept, (w->n_kept + 1) * sizeof *k);
    if (!k)
        return -1;
    w->kept = k;
    w->kept[w->n_kept++] = buf;
    return 0;
}

int ft_st_writer_add(ft_st_writer *w, const char *name, ft_st_dtype dtype, int ndim,
                     const int64_t *shape, const void *data, ft_err *err)
{
    if (!name)
        return ft_fail(err, "safetensors writer: tensor name is NULL");
    if (strcmp(name, "__metadata__") == 0)
        return ft_fail(err, "tensor '%s': the name is reserved for the metadata", name);
    if (json_object_get(w->names, name))
        return ft_fail(err, "tensor '%s': added twice", name);
    if (!dtype_valid(dtype))
        return ft_fail(err, "tensor '%s': invalid dtype %d", name, (int)dtype);
    if (ndim < 0 || ndim > FT_ST_MAX_DIMS)
        return ft_fail(err, "tensor '%s': ndim %d is not in [0, %d]", name, ndim,
                       FT_ST_MAX_DIMS);
    if (ndim > 0 && !shape)
        return ft_fail(err, "tensor '%s': shape is NULL", name);
    st_entry e = {.dtype = dtype, .ndim = ndim, .data = data};
    if (ndim > 0)
        memcpy(e.shape, shape, (size_t)ndim * sizeof *shape);
    size_t numel;
    char shape_str[256];
    format_shape(shape_str, sizeof shape_str, e.shape, ndim);
    if (!shape_bytes(e.shape, ndim, dtype_info[dtype].size, &numel, &e.nbytes))
        return ft_fail(err, "tensor '%s': shape %s is negative or overflows", name, shape_str);
    if (e.nbytes > (uint64_t)INT64_MAX)
        return ft_fail(err, "tensor '%s': shape %s of %s is too large", name, shape_str,
                       dtype_info[dtype].name);
    if (e.nbytes > 0 && !data)
        return ft_fail(err, "tensor '%s': data is NULL", name);
    if (w->n == w->cap) {
        size_t cap = w->cap ? 2 * w->cap : 16;
        st_entry *ne = realloc(w->e, cap * sizeof *ne);
        if (!ne)
            return ft_fail(err, "tensor '%s': out of memory", name);
        w->e = ne;
        w->cap = cap;
    }
    /* json_object_set_new fails on a name that is not valid UTF-8. */
    if (json_object_set_new(w->names, name, json_null()) != 0)
        return ft_fail(err, "tensor '%s': the name is not valid UTF-8", name);
    if (!(e.name = strdup(name))) {
        json_object_del(w->names, name);
        return ft_fail(err, "tensor '%s': out of memory", name);
    }
    w->e[w->n++] = e;
    return 0;
}

int ft_st_writer_metadata(ft_st_writer *w, const char *key, const char *value, ft_err *err)
{
    if (!key || !value)
        return ft_fail(err, "safetensors writer: metadata key or value is NULL");
    json_t *s = json_string(value); /* NULL for invalid UTF-8 */
    if (!s)
        return ft_fail(err, "metadata '%s': the value is not valid UTF-8", key);
    if (json_object_set_new(w->meta, key, s) != 0)
        return ft_fail(err, "metadata '%s': the key is not valid UTF-8", key);
    return 0;
}

size_t ft_st_writer_count(const ft_st_writer *w) { return w->n; }

size_t ft_st_writer_bytes(const ft_st_writer *w)
{
    size_t total = 0;
    for (size_t i = 0; i < w->n; i++)
        total += w->e[i].nbytes;
    return total;
}

void ft_st_writer_group(ft_st_writer *w, size_t first)
{
    for (size_t i = first + 1; i < w->n; i++)
        w->e[i].glued = true;
}

typedef struct st_chunk {
    const void *p;
    size_t n;
} st_chunk;

static int write_all(int fd, const void *p, size_t n)
{
    const char *c = p;
    while (n > 0) {
        ssize_t k = write(fd, c, n > (1u << 30) ? (1u << 30) : n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return -1;
        c += k;
        n -= (size_t)k;
    }
    return 0;
}

/* Makes a completed rename durable. Best effort: the data are already safe. */
static void fsync_parent(const char *path)
{
    const char *slash = strrchr(path, '/');
    char *dir = slash ? strndup(path, (size_t)(slash - path) + (slash == path)) : strdup(".");
    if (!dir)
        return;
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
    free(dir);
}

/* Writes the chunks to <path>.tmp, fsyncs, and renames it over path. */
static int write_atomic(const char *path, const st_chunk *c, size_t nc, ft_err *err)
{
    char *tmp = str_printf("%s.tmp", path);
    if (!tmp)
        return ft_fail(err, "%s: out of memory", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        int e = errno;
        free(tmp);
        return ft_fail(err, "%s: cannot create: %s", path, strerror(e));
    }
    const char *what = NULL;
    for (size_t i = 0; i < nc && !what; i++)
        if (write_all(fd, c[i].p, c[i].n) != 0)
            what = "write";
    if (!what && fsync(fd) != 0)
        what = "fsync";
    int e = errno;
    if (close(fd) != 0 && !what) {
        what = "close";
        e = errno;
    }
    if (!what && rename(tmp, path) != 0) {
        what = "rename";
        e = errno;
    }
    if (what) {
        unlink(tmp);
        free(tmp);
        return ft_fail(err, "%s: %s failed: %s", path, what, strerror(e));
    }
    free(tmp);
    fsync_parent(path);
    return 0;
}

static int cmp_write_order(const void *a, const void *b)
{
    const st_entry *x = *(const st_entry *const *)a, *y = *(const st_entry *const *)b;
    if (x->dtype != y->dtype)
        return x->dtype > y->dtype ? -1 : 1;
    return strcmp(x->name, y->name); /* byte-wise, as Rust compares Strings */
}

/* The JSON header of the (already sorted) entries, or NULL on out-of-memory. */
static char *header_json(json_t *meta, const st_entry *const *items, size_t n)
{
    json_t *root = json_object();
    bool ok = root != NULL;
    if (ok && json_object_size(meta) > 0)
        ok = json_object_set(root, "__metadata__", meta) == 0;
    uint64_t off = 0;
    for (size_t i = 0; i < n && ok; i++) {
        const st_entry *e = items[i];
        json_t *shape = json_array();
        for (int d = 0; d < e->ndim && shape; d++)
            if (json_array_append_new(shape, json_integer(e->shape[d])) != 0) {
                json_decref(shape);
                shape = NULL;
            }
        json_t *ent = shape ? json_pack("{s:s, s:o, s:[I, I]}", "dtype",
                                        dtype_info[e->dtype].name, "shape", shape,
                                        "data_offsets", (json_int_t)off,
                                        (json_int_t)(off + e->nbytes))
                            : NULL;
        ok = ent && json_object_set_new(root, e->name, ent) == 0;
        off += e->nbytes;
    }
    char *s = ok ? json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(root);
    return s;
}

/* Writes items (sorted here, in place) as one safetensors file at path. */
static int write_file(const ft_st_writer *w, const st_entry **items, size_t n,
                      const char *path, ft_err *err)
{
    qsort(items, n, sizeof *items, cmp_write_order);
    char *js = header_json(w->meta, items, n);
    st_chunk *chunks = alloc_array(n + 1, sizeof *chunks);
    size_t len = js ? strlen(js) : 0, padded = (len + 7) & ~(size_t)7;
    unsigned char *head = js ? malloc(8 + padded) : NULL;
    int rc;
    if (!js || !chunks || !head) {
        rc = ft_fail(err, "%s: out of memory", path);
    } else {
        for (int i = 0; i < 8; i++)
            head[i] = (unsigned char)((uint64_t)padded >> (8 * i));
        memcpy(head + 8, js, len);
        memset(head + 8 + len, ' ', padded - len);
        chunks[0] = (st_chunk){head, 8 + padded};
        for (size_t i = 0; i < n; i++)
            chunks[i + 1] = (st_chunk){items[i]->data, items[i]->nbytes};
        rc = write_atomic(path, chunks, n + 1, err);
    }
    free(head);
    free(chunks);
    free(js);
    return rc;
}

/* Entries [first, first + n) in insertion order, as a pointer array. */
static const st_entry **entry_ptrs(const ft_st_writer *w, size_t first, size_t n)
{
    const st_entry **p = alloc_array(n, sizeof *p);
    if (p)
        for (size_t i = 0; i < n; i++)
            p[i] = &w->e[first + i];
    return p;
}

int ft_st_writer_save(const ft_st_writer *w, const char *path, ft_err *err)
{
    const st_entry **items = entry_ptrs(w, 0, w->n);
    if (!items)
        return ft_fail(err, "%s: out of memory", path);
    int rc = write_file(w, items, w->n, path, err);
    free(items);
    return rc;
}

/* Parses "<basename>-<digits>-of-<digits>.safetensors" into its shard count. */
static bool parse_shard_name(const char *s, const char *basename, unsigned long *total)
{
    size_t bl = strlen(basename);
    if (strncmp(s, basename, bl) != 0 || s[bl] != '-')
        return false;
    s += bl + 1;
    if (*s < '0' || *s > '9')
        return false;
    while (*s >= '0' && *s <= '9')
        s++;
    if (strncmp(s, "-of-", 4) != 0)
        return false;
    s += 4;
    if (*s < '0' || *s > '9')
        return false;
    char *end;
    *total = strtoul(s, &end, 10);
    return strcmp(end, ".safetensors") == 0;
}

static int remove_if_exists(const char *path, ft_err *err)
{
    if (unlink(path) != 0 && errno != ENOENT)
        return ft_fail(err, "%s: cannot remove stale file: %s", path, strerror(errno));
    return 0;
}

/* Removes what an earlier save with another layout left in dir: shards of another
 * shard count (keep_total 0: all shards), and the plain file or the index as asked.
 * They would otherwise shadow or contradict the new checkpoint. */
static int remove_stale(const char *dir, const char *basename, unsigned long keep_total,
                        const char *stale_file, ft_err *err)
{
    char *p = str_printf("%s/%s", dir, stale_file);
    if (!p)
        return ft_fail(err, "%s: out of memory", dir);
    int rc = remove_if_exists(p, err);
    free(p);
    DIR *d = rc == 0 ? opendir(dir) : NULL;
    if (rc == 0 && !d)
        return ft_fail(err, "%s: cannot list directory: %s", dir, strerror(errno));
    struct dirent *de;
    while (rc == 0 && (de = readdir(d)) != NULL) {
        unsigned long total;
        if (!parse_shard_name(de->d_name, basename, &total) || total == keep_total)
            continue;
        p = str_printf("%s/%s", dir, de->d_name);
        rc = p ? remove_if_exists(p, err) : ft_fail(err, "%s: out of memory", dir);
        free(p);
    }
    if (d)
        closedir(d);
    return rc;
}

/* Greedy split in insertion order: a shard takes tensors while they fit in max bytes;
 * a tensor larger than max gets a shard of its own. A group (an entry and the glued
 * entries after it) is placed as one tensor of their summed size. Shard indices never
 * decrease, so shard s is the range [first[s], first[s + 1]). Returns the shard count. */
static size_t plan_shards(const ft_st_writer *w, size_t max, size_t *first)
{
    size_t ns = 0, used = 0;
    bool open = false;
    for (size_t i = 0, next; i < w->n; i = next) {
        size_t b = w->e[i].nbytes;
        for (next = i + 1; next < w->n && w->e[next].glued; next++)
            b += w->e[next].nbytes;
        if (b > max) {
            first[ns++] = i;
            open = false;
            continue;
        }
        if (!open || b > max - used) {
            first[ns++] = i;
            used = 0;
            open = true;
        }
        used += b;
    }
    if (ns == 0)
        first[ns++] = 0;
    first[ns] = w->n;
    return ns;
}

static int write_index(const char *path, json_t *weight_map, uint64_t total, ft_err *err)
{
    json_t *root = json_pack("{s:{s:I}, s:O}", "metadata", "total_size", (json_int_t)total,
                             "weight_map", weight_map);
    char *js = root ? json_dumps(root, JSON_INDENT(2) | JSON_SORT_KEYS) : NULL;
    json_decref(root);
    if (!js)
        return ft_fail(err, "%s: out of memory", path);
    st_chunk c[2] = {{js, strlen(js)}, {"\n", 1}};
    int rc = write_atomic(path, c, 2, err);
    free(js);
    return rc;
}

static int save_shards(const ft_st_writer *w, const char *dir, const char *basename,
                       const size_t *first, size_t ns, ft_err *err)
{
    json_t *wm = json_object();
    char *index = str_printf("%s/%s.safetensors.index.json", dir, basename);
    int rc = wm && index ? 0 : ft_fail(err, "%s: out of memory", dir);
    uint64_t total = 0;
    for (size_t s = 0; s < ns && rc == 0; s++) {
        size_t cnt = first[s + 1] - first[s];
        char *name = str_printf("%s-%05zu-of-%05zu.safetensors", basename, s + 1, ns);
        char *path = name ? str_printf("%s/%s", dir, name) : NULL;
        const st_entry **items = entry_ptrs(w, first[s], cnt);
        if (!path || !items)
            rc = ft_fail(err, "%s: out of memory", dir);
        for (size_t i = 0; i < cnt && rc == 0; i++) {
            total += items[i]->nbytes;
            if (json_object_set_new(wm, items[i]->name, json_string(name)) != 0)
                rc = ft_fail(err, "%s: out of memory", dir);
        }
        if (rc == 0)
            rc = write_file(w, items, cnt, path, err);
        free(items);
        free(path);
        free(name);
    }
    if (rc == 0)
        rc = write_index(index, wm, total, err);
    char *plain = str_printf("%s.safetensors", basename);
    if (rc == 0)
        rc = plain ? remove_stale(dir, basename, ns, plain, err)
                   : ft_fail(err, "%s: out of memory", dir);
    free(plain);
    free(index);
    json_decref(wm);
    return rc;
}

int ft_st_writer_save_sharded(const ft_st_writer *w, const char *dir, const char *basename,
                              size_t max_shard_bytes, ft_err *err)
{
    if (!basename[0] || strchr(basename, '/'))
        return ft_fail(err, "%s: checkpoint basename '%s' must be a plain, non-empty name",
                       dir, basename);
    if (max_shard_bytes == 0)
        return ft_fail(err, "%s: max_shard_bytes must be positive", dir);
    size_t *first = alloc_array(w->n + 2, sizeof *first);
    if (!first)
        return ft_fail(err, "%s: out of memory", dir);
    size_t ns = plan_shards(w, max_shard_bytes, first);
    int rc;
    if (ns > 1) {
        rc = save_shards(w, dir, basename, first, ns, err);
    } else {
        char *path = str_printf("%s/%s.safetensors", dir, basename);
        char *index = str_printf("%s.safetensors.index.json", basename);
        rc = path && index ? ft_st_writer_save(w, path, err)
                           : ft_fail(err, "%s: out of memory", dir);
        if (rc == 0)
            rc = remove_stale(dir, basename, 0, index, err);
        free(path);
        free(index);
    }
    free(first);
    return rc;
}
