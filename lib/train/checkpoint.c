/* Training checkpoints (see checkpoint.h for the layout and the atomicity argument). */
#include "train/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/fsutil.h"
#include "core/numparse.h"
#include "formats/safetensors.h"
#ifdef FT_HAVE_CUDA
#include "cuda/device_memory.h"
#endif

/* trainer_state.json's version (checkpoint.h): 2 added skipped_steps, run_id and
 * base_model; 1 still loads. */
enum { STATE_VERSION = 2, STATE_VERSION_MIN = 1 };

/* dir/name into out; -1 (err set) when it does not fit. */
static int join(char *out, size_t n, const char *dir, const char *name, ft_err *err)
{
    if ((size_t)snprintf(out, n, "%s/%s", dir, name) >= n)
        return ft_fail(err, "%s/%s: path too long", dir, name);
    return 0;
}


/* Whether n fp32 values at p are all finite (a sum of squares in double is finite exactly
 * when they are: a float's square cannot overflow a double). p is on the model's device
 * dev, but for the saves of a GPU model whose strategy bound host storage to it (ZeRO-3,
 * FSDP and model parallelism gather the weights on the host): the sum runs where the
 * values are. */
static bool all_finite(const float *p, size_t n, ft_device dev)
{
#ifdef FT_HAVE_CUDA
    if (dev == FT_DEV_CUDA && !ft_cuda_is_device(p))
        dev = FT_DEV_CPU;
#endif
    return n == 0 || isfinite(ft_sumsq(ft_view((float *)p, n, FT_F32, dev), n));
}

/* The first trainable weight of m holding a non-finite value: an error naming it. */
static int check_weights_finite(ft_model *m, ft_err *err)
{
    for (size_t i = 0; i < ft_model_param_count(m); i++) {
        const ft_param *p = ft_model_param(m, i);
        if (p->trainable && !all_finite(p->data, p->numel, ft_model_device(m)))
            return ft_fail(err, "weight '%s' holds non-finite values (inf or nan): training "
                                "diverged; refusing to write it",
                           p->name);
    }
    return 0;
}

int ft_checkpoint_save_weights(const char *dir, ft_model *m, const char *base_model,
                               ft_err *err)
{
    if (check_weights_finite(m, err) || ft_mkdir_p(dir, err))
        return -1;
    bool lora = false;
    for (size_t i = 0; i < ft_model_param_count(m); i++)
        lora |= ft_model_param(m, i)->is_lora;
    if (lora)
        return ft_model_save_adapter(m, dir, base_model, err);
    char path[4200];
    if (join(path, sizeof path, dir, "model.safetensors", err))
        return -1;
    ft_st_writer *w = ft_st_writer_new();
    if (!w)
        return ft_fail(err, "out of memory");
    int rc = ft_st_writer_metadata(w, "format", "pt", err);
    for (size_t i = 0; i < ft_model_param_count(m) && rc == 0; i++) {
        const ft_param *p = ft_model_param(m, i);
        if (p->trainable)
            rc = ft_model_param_to_writer(m, p, w, err);
    }
    if (rc == 0)
        rc = ft_st_writer_save(w, path, err);
    ft_st_writer_free(w);
    return rc;
}

static int save_optimizer(const char *dir, const ft_optimizer *o, ft_err *err)
{
    char path[4200];
    if (join(path, sizeof path, dir, "optimizer.safetensors", err))
        return -1;
    ft_st_writer *w = ft_st_writer_new();
    if (!w)
        return ft_fail(err, "out of memory");
    char step[32];
    snprintf(step, sizeof step, "%d", o->step);
    int64_t shape[1] = {(int64_t)o->n};
    /* moments on a GPU are written from host copies */
    const float *m = o->m, *v = o->v;
    float *staged = NULL;
    int rc = 0;
    if (o->device != FT_DEV_CPU) {
        staged = malloc(2 * o->n * sizeof *staged);
        if (!staged)
            rc = ft_fail(err, "out of host memory staging the optimizer state");
        else if (ft_copy_bytes(staged, FT_DEV_CPU, o->m, o->device, o->n * sizeof *staged, err) ||
                 ft_copy_bytes(staged + o->n, FT_DEV_CPU, o->v, o->device,
                               o->n * sizeof *staged, err))
            rc = -1;
        m = staged;
        v = staged + o->n;
    }
    if (rc == 0)
        rc = ft_st_writer_metadata(w, "step", step, err);
    if (rc == 0)
        rc = ft_st_writer_add(w, "exp_avg", FT_ST_F32, 1, shape, m, err);
    if (rc == 0)
        rc = ft_st_writer_add(w, "exp_avg_sq", FT_ST_F32, 1, shape, v, err);
    if (rc == 0)
        rc = ft_st_writer_save(w, path, err);
    ft_st_writer_free(w);
    free(staged);
    return rc;
}

static int save_state(const char *dir, const ft_train_state *st, ft_err *err)
{
    const ft_ckpt_stamp *s = &st->stamp;
    json_t *stamp = json_pack("{s:s, s:s, s:s, s:s, s:s, s:i}", "device", s->device, "dtype",
                              s->dtype, "mode", s->mode, "quant", s->quant, "strategy",
                              s->strategy, "world_size", s->world_size);
    json_t *base = json_pack("{s:s, s:s}", "path", st->base.path, "fingerprint",
                             st->base.fingerprint);
    json_t *root = json_pack("{s:s, s:i, s:I, s:i, s:i, s:s, s:I, s:s, s:o, s:o}", "format",
                             "ftkit-trainer-state", "version", STATE_VERSION, "global_step",
                             (json_int_t)st->global_step, "epoch", st->epoch, "batch_in_epoch",
                             st->batch_in_epoch, "seed", "", "skipped_steps",
                             (json_int_t)st->skipped_steps, "run_id", st->run_id, "base_model",
                             base, "stamp", stamp);
    if (!root)
        return ft_fail(err, "out of memory");
    /* the seed as a decimal string: JSON integers are not guaranteed 64-bit unsigned */
    char num[32];
    snprintf(num, sizeof num, "%llu", (unsigned long long)st->seed);
    json_object_set_new(root, "seed", json_string(num));
    snprintf(num, sizeof num, "%llu", (unsigned long long)st->rng_counter);
    json_object_set_new(root, "rng_counter", json_string(num));
    char *text = json_dumps(root, JSON_INDENT(2));
    json_decref(root);
    if (!text)
        return ft_fail(err, "out of memory");
    char path[4200];
    if (join(path, sizeof path, dir, "trainer_state.json", err)) {
        free(text);
        return -1;
    }
    int rc = ft_write_file_atomic(path, text, strlen(text), err);
    free(text);
    return rc;
}

int ft_checkpoint_new_run_id(char *id, size_t n, ft_err *err)
{
    unsigned char r[16];
    if (n < 2 * sizeof r + 1)
        return ft_fail(err, "run id: buffer too small");
    if (getrandom(r, sizeof r, 0) != (ssize_t)sizeof r)
        return ft_fail(err, "run id: getrandom: %s", strerror(errno));
    for (size_t i = 0; i < sizeof r; i++)
        snprintf(id + 2 * i, 3, "%02x", r[i]);
    return 0;
}

/* FNV-1a, 64-bit: a fingerprint, not a defence against a forger. */
static uint64_t fnv1a(uint64_t h, const void *data, size_t n)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}

static int by_name(const void *a, const void *b)
{
    return strcmp((*(const ft_st_tensor *const *)a)->name, (*(const ft_st_tensor *const *)b)->name);
}

int ft_checkpoint_base_of(const char *model_dir, ft_ckpt_base *base, ft_err *err)
{
    memset(base, 0, sizeof *base);
    if ((size_t)snprintf(base->path, sizeof base->path, "%s", model_dir) >= sizeof base->path)
        return ft_fail(err, "%s: path too long", model_dir);
    char path[4200];
    if (join(path, sizeof path, model_dir, "config.json", err))
        return -1;
    FILE *f = fopen(path, "rb");
    if (!f)
        return ft_fail(err, "%s: %s", path, strerror(errno));
    uint64_t h = 0xcbf29ce484222325ULL;
    char buf[8192];
    size_t got;
    while ((got = fread(buf, 1, sizeof buf, f)) > 0)
        h = fnv1a(h, buf, got);
    bool bad = ferror(f);
    fclose(f);
    if (bad)
        return ft_fail(err, "%s: read error", path);
    /* the tensors in name order, so that a re-sharded copy of the same model agrees */
    ft_checkpoint *ck;
    if (ft_ckpt_open(&ck, model_dir, "model", err))
        return -1;
    size_t n = ft_ckpt_count(ck);
    const ft_st_tensor **ts = malloc((n ? n : 1) * sizeof *ts);
    if (!ts) {
        ft_ckpt_close(ck);
        return ft_fail(err, "out of memory");
    }
    for (size_t i = 0; i < n; i++)
        ts[i] = ft_ckpt_at(ck, i);
    qsort(ts, n, sizeof *ts, by_name);
    for (size_t i = 0; i < n; i++) {
        const ft_st_tensor *t = ts[i];
        int len = snprintf(buf, sizeof buf, "%s|%s|", t->name, ft_st_dtype_name(t->dtype));
        h = fnv1a(h, buf, len > 0 && (size_t)len < sizeof buf ? (size_t)len : 0);
        for (int d = 0; d < t->ndim; d++) {
            len = snprintf(buf, sizeof buf, "%lld,", (long long)t->shape[d]);
            h = fnv1a(h, buf, (size_t)len);
        }
        h = fnv1a(h, "\n", 1);
    }
    free(ts);
    ft_ckpt_close(ck);
    snprintf(base->fingerprint, sizeof base->fingerprint, "%016llx", (unsigned long long)h);
    return 0;
}

/* The step of a checkpoint dir name with the given suffix ("" for checkpoint-N itself,
 * ".tmp", ".deleting"): >= 0, or -1 when name is not one. */
static long checkpoint_step(const char *name, const char *suffix)
{
    long step;
    int used = 0;
    if (sscanf(name, "checkpoint-%ld%n", &step, &used) != 1 || step < 0 ||
        strncmp(name, "checkpoint-", 11) != 0 || name[11] < '0' || name[11] > '9' ||
        strcmp(name + used, suffix) != 0)
        return -1;
    return step;
}

bool ft_checkpoint_name(const char *name)
{
    return checkpoint_step(name, "") >= 0 || checkpoint_step(name, ".tmp") >= 0 ||
           checkpoint_step(name, ".deleting") >= 0;
}

/* Steps of run_dir's checkpoint-N dirs, ascending; *n of them. */
static long *list_checkpoints(const char *run_dir, size_t *n, ft_err *err)
{
    *n = 0;
    DIR *d = opendir(run_dir);
    if (!d) {
        if (errno != ENOENT)
            ft_fail(err, "%s: %s", run_dir, strerror(errno));
        return NULL;
    }
    long *steps = NULL;
    size_t cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        long step = checkpoint_step(e->d_name, "");
        if (step < 0)
            continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 16;
            long *grown = realloc(steps, cap * sizeof *steps);
            if (!grown)
                break;
            steps = grown;
        }
        steps[(*n)++] = step;
    }
    closedir(d);
    for (size_t i = 1; i < *n; i++) /* insertion sort: a handful of entries */
        for (size_t j = i; j > 0 && steps[j - 1] > steps[j]; j--) {
            long t = steps[j];
            steps[j] = steps[j - 1];
            steps[j - 1] = t;
        }
    return steps;
}

int ft_checkpoint_cleanup(const char *run_dir, int *removed, ft_err *err)
{
    if (removed)
        *removed = 0;
    DIR *d = opendir(run_dir);
    if (!d)
        return errno == ENOENT ? 0 : ft_fail(err, "%s: %s", run_dir, strerror(errno));
    int rc = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (checkpoint_step(e->d_name, ".tmp") < 0 && checkpoint_step(e->d_name, ".deleting") < 0)
            continue;
        char path[4200];
        if (join(path, sizeof path, run_dir, e->d_name, err)) {
            rc = -1;
            break;
        }
        if (ft_remove_tree(path) != 0) {
            rc = ft_fail(err, "%s: cannot remove the leftover of a killed run: %s", path,
                         strerror(errno));
            break;
        }
        if (removed)
            (*removed)++;
    }
    closedir(d);
    return rc;
}

/* The run id recorded in checkpoint dir's trainer_state.json into id ("" when it has
 * none or the file does not read). */
static void checkpoint_run_id(const char *dir, char *id, size_t n)
{
    id[0] = '\0';
    char path[4200];
    if ((size_t)snprintf(path, sizeof path, "%s/trainer_state.json", dir) >= sizeof path)
        return;
    json_t *root = json_load_file(path, 0, NULL);
    const char *v = root ? json_string_value(json_object_get(root, "run_id")) : NULL;
    if (v)
        snprintf(id, n, "%s", v);
    json_decref(root);
}

/* Removes checkpoint dir `path` so that no half-removed checkpoint-N is ever seen: renamed
 * to path.deleting first (a kill then leaves a leftover that ft_checkpoint_cleanup
 * removes), then removed. */
static int remove_checkpoint(const char *run_dir, const char *path, ft_err *err)
{
    char doomed[4200];
    if ((size_t)snprintf(doomed, sizeof doomed, "%s.deleting", path) >= sizeof doomed)
        return ft_fail(err, "%s: path too long", path);
    if (ft_remove_tree(doomed) != 0 || rename(path, doomed) != 0)
        return ft_fail(err, "%s: cannot remove: %s", path, strerror(errno));
    if (ft_fsync_dir(run_dir, err))
        return -1;
    if (ft_remove_tree(doomed) != 0)
        return ft_fail(err, "%s: cannot remove: %s", doomed, strerror(errno));
    return 0;
}

/* save_total_limit: removes this run's oldest checkpoints beyond limit (others' are not
 * counted and never removed), then leftovers of killed saves and removals. Best effort:
 * what cannot be removed now is tried again at the next save. */
static void rotate(const char *run_dir, const char *run_id, int limit)
{
    ft_err ignored;
    size_t n;
    long *steps = list_checkpoints(run_dir, &n, &ignored);
    if (limit > 0 && run_id[0]) {
        size_t mine = 0;
        char id[64], path[4200];
        /* newest first: the first `limit` of this run's stay */
        for (size_t i = n; i-- > 0;) {
            snprintf(path, sizeof path, "%s/checkpoint-%ld", run_dir, steps[i]);
            checkpoint_run_id(path, id, sizeof id);
            if (strcmp(id, run_id) != 0)
                continue;
            if (++mine > (size_t)limit)
                remove_checkpoint(run_dir, path, &ignored);
        }
    }
    free(steps);
    ft_checkpoint_cleanup(run_dir, NULL, &ignored);
}

int ft_checkpoint_save(const char *run_dir, ft_model *m, const ft_optimizer *o,
                       const ft_train_state *st, const char *base_model, int save_total_limit,
                       char *out, size_t out_len, ft_err *err)
{
    char final[4096], tmp[4200];
    if ((size_t)snprintf(final, sizeof final, "%s/checkpoint-%ld", run_dir, st->global_step) >=
        sizeof final)
        return ft_fail(err, "%s: path too long", run_dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", final);
    if (!all_finite(o->m, o->n, o->device) || !all_finite(o->v, o->n, o->device))
        return ft_fail(err, "checkpoint %s: the optimizer state holds non-finite values (inf or "
                            "nan): training diverged; refusing to write it",
                       final);
    if (check_weights_finite(m, err))
        return ft_fail_prefix(err, "checkpoint %s", final);
    /* A checkpoint of the same step is replaced as a whole, and only when it is this
     * run's (a resumed run repeating its steps): another run's work is not ours to drop. */
    struct stat sb;
    bool replace = stat(final, &sb) == 0;
    if (replace) {
        char id[64];
        checkpoint_run_id(final, id, sizeof id);
        if (!st->run_id[0] || strcmp(id, st->run_id) != 0)
            return ft_fail(err, "%s exists and is not this run's (run id '%s', this run's '%s'): "
                                "refusing to replace it",
                           final, id, st->run_id);
    }
    if (ft_mkdir_p(run_dir, err) || ft_remove_tree(tmp) != 0 || ft_mkdir_p(tmp, err))
        return ft_fail_prefix(err, "checkpoint %s", final);
    if (ft_checkpoint_save_weights(tmp, m, base_model, err) || save_optimizer(tmp, o, err) ||
        save_state(tmp, st, err) || ft_fsync_dir(tmp, err)) {
        ft_remove_tree(tmp);
        return ft_fail_prefix(err, "checkpoint %s not written (the earlier ones are intact)",
                              final);
    }
    /* the old one moves aside (not a checkpoint name any more), the new one takes its
     * place, then the old one goes */
    char doomed[4300];
    snprintf(doomed, sizeof doomed, "%s.deleting", final);
    if (replace && (ft_remove_tree(doomed) != 0 || rename(final, doomed) != 0)) {
        int e = errno;
        ft_remove_tree(tmp);
        return ft_fail(err, "%s: cannot move the old checkpoint aside: %s", final, strerror(e));
    }
    if (rename(tmp, final) != 0) {
        int e = errno;
        ft_remove_tree(tmp);
        return ft_fail(err, "%s: rename: %s", final, strerror(e));
    }
    if (ft_fsync_dir(run_dir, err))
        return -1;
    if (replace)
        ft_remove_tree(doomed); /* (a failure leaves a leftover for the cleanup) */
    if (out)
        snprintf(out, out_len, "%s", final);
    rotate(run_dir, st->run_id, save_total_limit);
    return 0;
}

int ft_checkpoint_latest(const char *run_dir, char *path, size_t path_len, ft_err *err)
{
    ft_err local;
    if (!err)
        err = &local;
    err->msg[0] = '\0';
    size_t n;
    long *steps = list_checkpoints(run_dir, &n, err);
    if (!steps)
        return err->msg[0] ? -1 : 0;
    if (n)
        snprintf(path, path_len, "%s/checkpoint-%ld", run_dir, steps[n - 1]);
    free(steps);
    return n ? 1 : 0;
}

static void copy_str(char *dst, size_t n, const char *src)
{
    snprintf(dst, n, "%s", src ? src : "");
}

static int load_state(const char *dir, ft_train_state *st, ft_err *err)
{
    char path[4200];
    if (join(path, sizeof path, dir, "trainer_state.json", err))
        return -1;
    json_error_t je;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return ft_fail(err, "%s:%d: %s", path, je.line, je.text);
    memset(st, 0, sizeof *st);
    const char *format = NULL;
    json_int_t version = 0, step = 0;
    int epoch = 0, batch = 0, world = 0;
    const char *dev = NULL, *dtype = NULL, *mode = NULL, *quant = NULL, *strategy = NULL;
    int rc = json_unpack_ex(root, &je, 0, "{s:s, s:I}", "format", &format, "version", &version);
    if (rc != 0 || strcmp(format, "ftkit-trainer-state") != 0 || version < STATE_VERSION_MIN ||
        version > STATE_VERSION) {
        json_decref(root);
        return ft_fail(err, "%s: not an ftkit trainer state of version %d to %d", path,
                       STATE_VERSION_MIN, STATE_VERSION);
    }
    rc = json_unpack_ex(root, &je, 0, "{s:I, s:i, s:i, s:{s:s, s:s, s:s, s:s, s:s, s:i}}",
                        "global_step", &step, "epoch", &epoch, "batch_in_epoch", &batch, "stamp",
                        "device", &dev, "dtype", &dtype, "mode", &mode, "quant", &quant,
                        "strategy", &strategy, "world_size", &world);
    if (rc != 0)
        rc = ft_fail(err, "%s: %s", path, je.text);
    /* seed and rng_counter are decimal strings (JSON numbers are not 64-bit unsigned) */
    const char *names[] = {"seed", "rng_counter"};
    uint64_t *vals[] = {&st->seed, &st->rng_counter};
    for (int i = 0; i < 2 && rc == 0; i++) {
        json_t *v = json_object_get(root, names[i]);
        if (!json_is_string(v))
            rc = ft_fail(err, "%s: %s must be a decimal number in a string (\"42\"), not %s", path,
                         names[i], v ? "another JSON type" : "missing");
        else if (ft_parse_u64(json_string_value(v), 0, UINT64_MAX, vals[i]))
            rc = ft_fail(err, "%s: %s '%s' must be a decimal number", path, names[i],
                         json_string_value(v));
    }
    if (rc == 0 && version >= 2) {
        json_int_t skipped = 0;
        const char *run_id = NULL, *base = NULL, *fp = NULL;
        if (json_unpack_ex(root, &je, 0, "{s:I, s:s, s:{s:s, s:s}}", "skipped_steps", &skipped,
                           "run_id", &run_id, "base_model", "path", &base, "fingerprint", &fp)) {
            rc = ft_fail(err, "%s: %s", path, je.text);
        } else {
            st->skipped_steps = (long)skipped;
            copy_str(st->run_id, sizeof st->run_id, run_id);
            copy_str(st->base.path, sizeof st->base.path, base);
            copy_str(st->base.fingerprint, sizeof st->base.fingerprint, fp);
        }
    }
    if (rc == 0) {
        st->global_step = (long)step;
        st->epoch = epoch;
        st->batch_in_epoch = batch;
        copy_str(st->stamp.device, sizeof st->stamp.device, dev);
        copy_str(st->stamp.dtype, sizeof st->stamp.dtype, dtype);
        copy_str(st->stamp.mode, sizeof st->stamp.mode, mode);
        copy_str(st->stamp.quant, sizeof st->stamp.quant, quant);
        copy_str(st->stamp.strategy, sizeof st->stamp.strategy, strategy);
        st->stamp.world_size = world;
    }
    if (rc == 0 && (step < 0 || step > LONG_MAX || epoch < 0 || batch < 0 ||
                    st->skipped_steps < 0 || st->skipped_steps > st->global_step))
        rc = ft_fail(err, "%s: global_step %lld, epoch %d, batch_in_epoch %d, skipped_steps %ld: "
                          "out of range (negative, or more steps skipped than done)",
                     path, (long long)step, epoch, batch, st->skipped_steps);
    json_decref(root);
    return rc;
}

/* The checkpoint's state against this run's own (expect): the stamp, the seed and the
 * base model must be the same for the run to continue as it started. */
static int check_expected(const char *dir, const ft_train_state *have,
                          const ft_train_state *want, ft_err *err)
{
    /* The strategy and world size may differ: every strategy saves the gathered,
     * public format. */
    const ft_ckpt_stamp *hs = &have->stamp, *ws = &want->stamp;
    const char *names[] = {"device", "dtype", "mode", "quant"};
    const char *h[] = {hs->device, hs->dtype, hs->mode, hs->quant};
    const char *w[] = {ws->device, ws->dtype, ws->mode, ws->quant};
    for (int i = 0; i < 4; i++)
        if (strcmp(h[i], w[i]) != 0)
            return ft_fail(err, "%s was made with %s '%s', this run uses '%s': refusing to resume",
                           dir, names[i], h[i], w[i]);
    if (have->seed != want->seed)
        return ft_fail(err, "%s was made with train.seed %lld, this run's is %lld: refusing to "
                            "resume (the run would not continue as it started: dropout and "
                            "shuffling follow the seed); set train.seed to %lld",
                       dir, (long long)have->seed, (long long)want->seed, (long long)have->seed);
    if (have->base.fingerprint[0] && want->base.fingerprint[0] &&
        strcmp(have->base.fingerprint, want->base.fingerprint) != 0)
        return ft_fail(err, "%s was trained on the base model '%s' (fingerprint %s), this run's "
                            "model.name is '%s' (fingerprint %s): a different model (config.json "
                            "or tensors differ); refusing to resume",
                       dir, have->base.path, have->base.fingerprint, want->base.path,
                       want->base.fingerprint);
    return 0;
}

static int load_full_weights(const char *dir, ft_model *m, ft_err *err)
{
    ft_checkpoint *ck;
    if (ft_ckpt_open(&ck, dir, "model", err))
        return -1;
    int rc = 0;
    for (size_t i = 0; i < ft_model_param_count(m) && rc == 0; i++) {
        ft_param *p = ft_model_param(m, i);
        if (!p->trainable)
            continue;
        const ft_st_tensor *t = ft_ckpt_find(ck, p->name);
        if (!t)
            rc = ft_fail(err, "%s: tensor '%s' is missing", dir, p->name);
        else
            rc = ft_model_param_from_st(m, p, t, err);
    }
    ft_ckpt_close(ck);
    return rc;
}

static int load_optimizer(const char *dir, ft_optimizer *o, ft_err *err)
{
    char path[4200];
    if (join(path, sizeof path, dir, "optimizer.safetensors", err))
        return -1;
    ft_st_file *f;
    if (ft_st_open(&f, path, err))
        return -1;
    const ft_st_tensor *m = ft_st_find(f, "exp_avg"), *v = ft_st_find(f, "exp_avg_sq");
    const char *step = ft_st_metadata(f, "step");
    /* moments on a GPU are read into host copies first */
    bool staged = o->device != FT_DEV_CPU;
    long step_v;
    float *hm = staged ? malloc(o->n * sizeof *hm + 1) : o->m;
    float *hv = staged ? malloc(o->n * sizeof *hv + 1) : o->v;
    int rc = 0;
    if (!hm || !hv)
        rc = ft_fail(err, "out of host memory reading %s", path);
    else if (!m || !v || !step)
        rc = ft_fail(err, "%s: exp_avg, exp_avg_sq or the step is missing", path);
    else if (m->numel != o->n || v->numel != o->n)
        rc = ft_fail(err, "%s: %zu optimizer entries, the model has %zu trainable parameters",
                     path, m->numel, o->n);
    else if (ft_st_to_f32(m, hm, o->n, err) || ft_st_to_f32(v, hv, o->n, err))
        rc = -1;
    else if (staged && (ft_copy_bytes(o->m, o->device, hm, FT_DEV_CPU, o->n * sizeof *hm, err) ||
                        ft_copy_bytes(o->v, o->device, hv, FT_DEV_CPU, o->n * sizeof *hv, err)))
        rc = -1;
    else if (ft_parse_long(step, 0, INT_MAX, &step_v))
        rc = ft_fail(err, "%s: metadata step '%s' is not a step number", path, step);
    else
        o->step = (int)step_v;
    if (staged) {
        free(hm);
        free(hv);
    }
    ft_st_close(f);
    return rc;
}

int ft_checkpoint_load(const char *path, ft_model *m, ft_optimizer *o, ft_train_state *st,
                       const ft_train_state *expect, ft_err *err)
{
    if (load_state(path, st, err))
        return -1;
    if (expect && check_expected(path, st, expect, err))
        return -1;
    char probe[4200];
    if (join(probe, sizeof probe, path, "adapter_config.json", err))
        return -1;
    bool adapter = access(probe, F_OK) == 0;
    if ((adapter ? ft_model_load_adapter(m, path, err) : load_full_weights(path, m, err)) ||
        load_optimizer(path, o, err))
        return -1;
    /* every step done was either applied (the optimizer counted it) or skipped */
    if ((long)o->step != st->global_step - st->skipped_steps)
        return ft_fail(err, "%s: the optimizer has done %d updates, trainer_state.json says "
                            "global_step %ld with %ld skipped: an inconsistent checkpoint; "
                            "refusing to resume",
                       path, o->step, st->global_step, st->skipped_steps);
    return 0;
}
