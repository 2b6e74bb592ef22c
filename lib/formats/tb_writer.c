#include "formats/tb_writer.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/crc32c.h"
#include "core/fsutil.h"

struct ft_tb_writer {
    FILE *f;
    char *path;
    /* errno of the first failed write, 0 if none. After a failed write the file may end
     * in a partial record; anything appended would be unreadable past it, so the writer
     * refuses further records. */
    int failed;
};

/* ---- protobuf encoding -------------------------------------------------------------
 * Just what Event needs: varints (wire type 0), fixed64 (1), length-delimited (2) and
 * fixed32 (5). Nested messages are encoded into their own buffer first, then appended
 * as a length-delimited field. Field numbers are those of tensorboard/compat/proto/
 * {event,summary,tensor,tensor_shape}.proto. */

enum { WT_VARINT = 0, WT_FIXED64 = 1, WT_LEN = 2, WT_FIXED32 = 5 };

enum {
    EVENT_WALL_TIME = 1,         /* double */
    EVENT_STEP = 2,              /* int64 */
    EVENT_FILE_VERSION = 3,      /* string */
    EVENT_SUMMARY = 5,           /* Summary */
    SUMMARY_VALUE = 1,           /* repeated Summary.Value */
    VALUE_TAG = 1,               /* string */
    VALUE_SIMPLE_VALUE = 2,      /* float */
    VALUE_TENSOR = 8,            /* TensorProto */
    VALUE_METADATA = 9,          /* SummaryMetadata */
    METADATA_PLUGIN_DATA = 1,    /* SummaryMetadata.PluginData */
    PLUGIN_DATA_PLUGIN_NAME = 1, /* string */
    TENSOR_DTYPE = 1,            /* DataType enum */
    TENSOR_TENSOR_SHAPE = 2,     /* TensorShapeProto; no dims = a scalar */
    TENSOR_STRING_VAL = 8,       /* repeated bytes */
    DT_STRING = 7,
};

typedef struct {
    unsigned char *p;
    size_t n, cap;
    int oom;
} pbuf;

static void pb_put(pbuf *b, const void *data, size_t n)
{
    if (b->oom)
        return;
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n)
            cap *= 2;
        unsigned char *grown = realloc(b->p, cap);
        if (!grown) {
            b->oom = 1;
            return;
        }
        b->p = grown;
        b->cap = cap;
    }
    if (n)
        memcpy(b->p + b->n, data, n);
    b->n += n;
}

static void pb_varint(pbuf *b, uint64_t v)
{
    unsigned char tmp[10];
    size_t n = 0;
    do {
        tmp[n] = (unsigned char)(v & 0x7F);
        v >>= 7;
        if (v)
            tmp[n] |= 0x80;
        n++;
    } while (v);
    pb_put(b, tmp, n);
}

static void pb_key(pbuf *b, unsigned field, unsigned wire_type)
{
    pb_varint(b, (uint64_t)field << 3 | wire_type);
}

static void pb_uint(pbuf *b, unsigned field, uint64_t v)
{
    pb_key(b, field, WT_VARINT);
    pb_varint(b, v);
}

/* int64 fields are plain varints of the two's complement (negatives take 10 bytes). */
static void pb_int64(pbuf *b, unsigned field, int64_t v)
{
    pb_uint(b, field, (uint64_t)v);
}

static void pb_double(pbuf *b, unsigned field, double v)
{
    uint64_t u;
    memcpy(&u, &v, sizeof u);
    unsigned char le[8];
    for (int i = 0; i < 8; i++)
        le[i] = (unsigned char)(u >> (8 * i));
    pb_key(b, field, WT_FIXED64);
    pb_put(b, le, sizeof le);
}

static void pb_float(pbuf *b, unsigned field, float v)
{
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    unsigned char le[4];
    for (int i = 0; i < 4; i++)
        le[i] = (unsigned char)(u >> (8 * i));
    pb_key(b, field, WT_FIXED32);
    pb_put(b, le, sizeof le);
}

static void pb_bytes(pbuf *b, unsigned field, const void *data, size_t n)
{
    pb_key(b, field, WT_LEN);
    pb_varint(b, n);
    pb_put(b, data, n);
}

static void pb_string(pbuf *b, unsigned field, const char *s)
{
    pb_bytes(b, field, s, strlen(s));
}

/* Appends the finished submessage `sub` as field `field` of b and frees sub. */
static void pb_message(pbuf *b, unsigned field, pbuf *sub)
{
    if (sub->oom)
        b->oom = 1;
    else
        pb_bytes(b, field, sub->p, sub->n);
    free(sub->p);
    *sub = (pbuf){0};
}

static double wall_time_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- records -----------------------------------------------------------------------
 * TFRecord framing: u64 LE length, u32 LE masked CRC32C of those 8 bytes, the data,
 * u32 LE masked CRC32C of the data. */

static void put_le(unsigned char *p, uint64_t v, int nbytes)
{
    for (int i = 0; i < nbytes; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static int write_record(ft_tb_writer *w, const pbuf *event, ft_err *err)
{
    if (w->failed)
        return ft_fail(err, "%s: an earlier write failed: %s", w->path, strerror(w->failed));
    if (event->oom)
        return ft_fail(err, "%s: out of memory", w->path);
    unsigned char head[12], foot[4];
    put_le(head, event->n, 8);
    put_le(head + 8, ft_crc32c_mask(ft_crc32c(head, 8)), 4);
    put_le(foot, ft_crc32c_mask(ft_crc32c(event->p, event->n)), 4);
    if (fwrite(head, 1, sizeof head, w->f) != sizeof head ||
        fwrite(event->p, 1, event->n, w->f) != event->n ||
        fwrite(foot, 1, sizeof foot, w->f) != sizeof foot || fflush(w->f) != 0) {
        w->failed = errno ? errno : EIO;
        return ft_fail(err, "%s: write: %s", w->path, strerror(w->failed));
    }
    return 0;
}

/* Writes Event{wall_time, step, summary{value}} and frees value. */
static int write_summary_event(ft_tb_writer *w, int64_t step, pbuf *value, ft_err *err)
{
    pbuf summary = {0}, event = {0};
    pb_message(&summary, SUMMARY_VALUE, value);
    pb_double(&event, EVENT_WALL_TIME, wall_time_now());
    pb_int64(&event, EVENT_STEP, step);
    pb_message(&event, EVENT_SUMMARY, &summary);
    int rc = write_record(w, &event, err);
    free(event.p);
    return rc;
}

/* ---- public API --------------------------------------------------------------------- */

int ft_tb_open_path(ft_tb_writer **out, const char *path, ft_err *err)
{
    *out = NULL;
    ft_tb_writer *w = calloc(1, sizeof *w);
    if (!w || !(w->path = strdup(path))) {
        free(w);
        return ft_fail(err, "%s: out of memory", path);
    }
    if (!(w->f = fopen(path, "wbe"))) {
        int e = errno;
        ft_tb_close(w);
        return ft_fail(err, "%s: %s", path, strerror(e));
    }
    pbuf event = {0};
    pb_double(&event, EVENT_WALL_TIME, wall_time_now());
    pb_string(&event, EVENT_FILE_VERSION, "brain.Event:2");
    int rc = write_record(w, &event, err);
    free(event.p);
    if (rc) {
        ft_tb_close(w);
        return -1;
    }
    *out = w;
    return 0;
}

int ft_tb_open(ft_tb_writer **out, const char *logdir, ft_err *err)
{
    /* TensorBoard's EventFileWriter numbers its writers per process from 0; so do we, so
     * two writers opened in the same second get different names. */
    static atomic_uint next_uid;
    *out = NULL;
    if (ft_mkdir_p(logdir, err))
        return -1;
    char host[256];
    if (gethostname(host, sizeof host) != 0)
        snprintf(host, sizeof host, "localhost");
    host[sizeof host - 1] = '\0';
    for (char *c = host; *c; c++)
        if (*c == '/')
            *c = '_';
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    char path[4096];
    int n = snprintf(path, sizeof path, "%s/events.out.tfevents.%010lld.%s.%ld.%u", logdir,
                     (long long)ts.tv_sec, host, (long)getpid(), atomic_fetch_add(&next_uid, 1));
    if (n < 0 || (size_t)n >= sizeof path)
        return ft_fail(err, "%s: path too long", logdir);
    return ft_tb_open_path(out, path, err);
}

const char *ft_tb_path(const ft_tb_writer *w)
{
    return w->path;
}

int ft_tb_scalar(ft_tb_writer *w, const char *tag, int64_t step, double value, ft_err *err)
{
    pbuf v = {0};
    pb_string(&v, VALUE_TAG, tag);
    pb_float(&v, VALUE_SIMPLE_VALUE, (float)value);
    return write_summary_event(w, step, &v, err);
}

int ft_tb_text(ft_tb_writer *w, const char *tag, int64_t step, const char *text, ft_err *err)
{
    /* What TensorBoard's text plugin writes (tensorboard/plugins/text/summary_v2.py):
     * an empty plugin content (TextPluginData{version 0}) and a rank-0 string tensor. */
    pbuf plugin = {0}, metadata = {0}, shape = {0}, tensor = {0}, v = {0};
    pb_string(&plugin, PLUGIN_DATA_PLUGIN_NAME, "text");
    pb_message(&metadata, METADATA_PLUGIN_DATA, &plugin);
    pb_uint(&tensor, TENSOR_DTYPE, DT_STRING);
    pb_message(&tensor, TENSOR_TENSOR_SHAPE, &shape);
    pb_string(&tensor, TENSOR_STRING_VAL, text);
    pb_string(&v, VALUE_TAG, tag);
    pb_message(&v, VALUE_TENSOR, &tensor);
    pb_message(&v, VALUE_METADATA, &metadata);
    return write_summary_event(w, step, &v, err);
}

int ft_tb_flush(ft_tb_writer *w, ft_err *err)
{
    if (w->failed)
        return ft_fail(err, "%s: an earlier write failed: %s", w->path, strerror(w->failed));
    if (fflush(w->f) != 0) {
        w->failed = errno ? errno : EIO;
        return ft_fail(err, "%s: write: %s", w->path, strerror(w->failed));
    }
    /* EINVAL: a pipe or device, which has nothing to sync. */
    if (fsync(fileno(w->f)) != 0 && errno != EINVAL)
        return ft_fail(err, "%s: fsync: %s", w->path, strerror(errno));
    return 0;
}

void ft_tb_close(ft_tb_writer *w)
{
    if (!w)
        return;
    if (w->f)
        fclose(w->f);
    free(w->path);
    free(w);
}

/* ---- HParams (tb_writer.h). Field numbers: tensorboard/plugins/hparams/plugin_data.proto
 * and api.proto, google/protobuf/struct.proto's Value. */

enum {
    PLUGIN_DATA_CONTENT = 2,        /* SummaryMetadata.PluginData.content: bytes */
    SHAPE_DIM = 2,                  /* TensorShapeProto.dim */
    DT_FLOAT = 1,
    HP_DATA_EXPERIMENT = 2,         /* HParamsPluginData */
    HP_DATA_SESSION_START = 3,
    HP_DATA_SESSION_END = 4,
    EXPERIMENT_TIME_CREATED = 3,    /* Experiment */
    EXPERIMENT_HPARAM_INFOS = 4,
    EXPERIMENT_METRIC_INFOS = 5,
    HPARAM_INFO_NAME = 1,           /* HParamInfo */
    HPARAM_INFO_TYPE = 4,
    METRIC_INFO_NAME = 1,           /* MetricInfo: MetricName{group 1, tag 2} */
    METRIC_NAME_TAG = 2,
    START_HPARAMS = 1,              /* SessionStartInfo: map<string, Value> */
    START_TIME_SECS = 5,
    MAP_KEY = 1,
    MAP_VALUE = 2,
    VALUE_NUMBER = 2,               /* google.protobuf.Value */
    VALUE_STRING = 3,
    VALUE_BOOL = 4,
    END_STATUS = 1,                 /* SessionEndInfo */
    END_TIME_SECS = 2,
};

/* Writes Summary.Value{tag, tensor: the plugin's empty float tensor (shape [0]),
 * metadata: plugin "hparams" with data} and frees data. */
static int write_hparams(ft_tb_writer *w, const char *tag, pbuf *data, ft_err *err)
{
    pbuf plugin = {0}, metadata = {0}, dim = {0}, shape = {0}, tensor = {0}, v = {0};
    pb_string(&plugin, PLUGIN_DATA_PLUGIN_NAME, "hparams");
    pb_message(&plugin, PLUGIN_DATA_CONTENT, data);
    pb_message(&metadata, METADATA_PLUGIN_DATA, &plugin);
    pb_message(&shape, SHAPE_DIM, &dim); /* one dim of size 0 (the default, not written) */
    pb_uint(&tensor, TENSOR_DTYPE, DT_FLOAT);
    pb_message(&tensor, TENSOR_TENSOR_SHAPE, &shape);
    pb_string(&v, VALUE_TAG, tag);
    pb_message(&v, VALUE_TENSOR, &tensor);
    pb_message(&v, VALUE_METADATA, &metadata);
    return write_summary_event(w, 0, &v, err);
}

int ft_tb_hparams_start(ft_tb_writer *w, const ft_tb_hparam *hp, size_t n,
                        const char *const *metric_tags, size_t n_metrics, ft_err *err)
{
    double now = wall_time_now();
    pbuf exp = {0}, data = {0};
    pb_double(&exp, EXPERIMENT_TIME_CREATED, now);
    for (size_t i = 0; i < n; i++) {
        pbuf info = {0};
        pb_string(&info, HPARAM_INFO_NAME, hp[i].name);
        pb_uint(&info, HPARAM_INFO_TYPE, (uint64_t)hp[i].type);
        pb_message(&exp, EXPERIMENT_HPARAM_INFOS, &info);
    }
    for (size_t i = 0; i < n_metrics; i++) {
        pbuf name = {0}, info = {0};
        pb_string(&name, METRIC_NAME_TAG, metric_tags[i]);
        pb_message(&info, METRIC_INFO_NAME, &name);
        pb_message(&exp, EXPERIMENT_METRIC_INFOS, &info);
    }
    pb_message(&data, HP_DATA_EXPERIMENT, &exp);
    if (write_hparams(w, "_hparams_/experiment", &data, err))
        return -1;
    pbuf start = {0};
    for (size_t i = 0; i < n; i++) {
        pbuf value = {0}, entry = {0};
        if (hp[i].type == FT_TB_HPARAM_NUMBER)
            pb_double(&value, VALUE_NUMBER, hp[i].num);
        else if (hp[i].type == FT_TB_HPARAM_BOOL)
            pb_uint(&value, VALUE_BOOL, hp[i].b);
        else
            pb_string(&value, VALUE_STRING, hp[i].str ? hp[i].str : "");
        pb_string(&entry, MAP_KEY, hp[i].name);
        pb_message(&entry, MAP_VALUE, &value);
        pb_message(&start, START_HPARAMS, &entry);
    }
    pb_double(&start, START_TIME_SECS, now);
    pb_message(&data, HP_DATA_SESSION_START, &start);
    return write_hparams(w, "_hparams_/session_start_info", &data, err);
}

int ft_tb_hparams_end(ft_tb_writer *w, ft_tb_session_status status, ft_err *err)
{
    pbuf end = {0}, data = {0};
    pb_uint(&end, END_STATUS, (uint64_t)status);
    pb_double(&end, END_TIME_SECS, wall_time_now());
    pb_message(&data, HP_DATA_SESSION_END, &end);
    return write_hparams(w, "_hparams_/session_end_info", &data, err);
}
