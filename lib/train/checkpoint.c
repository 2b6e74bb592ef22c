/* Training checkpoints (see checkpoint.h for the layout and the atomicity argument). */
#include "train/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/fsutil.h"
#include "core/numparse.h"
#include "formats/safetensors.h"

enum { STATE_VERSION = 1 };

/* dir/name into out; -1 (err set) when it does not fit. */
static int join(char *out, size_t n, const char *dir, const char *name, ft_err *err)
{
    if ((size_t)snprintf(out, n, "%s/%s", dir, name) >= n)
        return ft_fail(err, "%s/%s: path too long", dir, name);
    return 0;
}


int ft_checkpoint_save_weights(const char *dir, ft_model *m, const char *base_model,
                               ft_err *err)
{
    if (ft_mkdir_p(dir, err))
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
    json_t *root = json_pack("{s:s, s:i, s:I, s:i, s:i, s:s, s:o}", "format",
                             "ftkit-trainer-state", "version", STATE_VERSION, "global_step",
                             (json_int_t)st->global_step, "epoch", st->epoch, "batch_in_epoch",
                             st->batch_in_epoch, "seed", "", "stamp", stamp);
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
        long step;
        int used = 0;
        if (sscanf(e->d_name, "checkpoint-%ld%n", &step, &used) != 1 ||
            e->d_name[used] != '\0' || step < 0)
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

int ft_checkpoint_save(const char *run_dir, ft_model *m, const ft_optimizer *o,
                       const ft_train_state *st, const char *base_model, int save_total_limit,
                       char *out, size_t out_len, ft_err *err)
{
    char final[4096], tmp[4200];
    snprintf(final, sizeof final, "%s/checkpoint-%ld", run_dir, st->global_step);
    snprintf(tmp, sizeof tmp, "%s.tmp", final);
    if (ft_mkdir_p(run_dir, err) || ft_remove_tree(tmp) != 0 || ft_mkdir_p(tmp, err))
        return ft_fail_prefix(err, "checkpoint %s", final);
    if (ft_checkpoint_save_weights(tmp, m, base_model, err) || save_optimizer(tmp, o, err) ||
        save_state(tmp, st, err) || ft_fsync_dir(tmp, err)) {
        ft_remove_tree(tmp);
        return -1;
    }
    /* A checkpoint of the same step (a re-run) is replaced as a whole. */
    if (ft_remove_tree(final) != 0 || rename(tmp, final) != 0) {
        int e = errno;
        ft_remove_tree(tmp);
        return ft_fail(err, "%s: rename: %s", final, strerror(e));
    }
    if (ft_fsync_dir(run_dir, err))
        return -1;
    if (out)
        snprintf(out, out_len, "%s", final);
    if (save_total_limit > 0) {
        size_t n;
        long *steps = list_checkpoints(run_dir, &n, err);
        for (size_t i = 0; i + (size_t)save_total_limit < n; i++) {
            char old[4096];
            snprintf(old, sizeof old, "%s/checkpoint-%ld", run_dir, steps[i]);
            ft_remove_tree(old);
        }
        free(steps);
    }
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
    const char *format = NULL, *seed = NULL, *counter = NULL;
    json_int_t version = 0, step = 0;
    int epoch = 0, batch = 0, world = 0;
    const char *dev = NULL, *dtype = NULL, *mode = NULL, *quant = NULL, *strategy = NULL;
    int rc = json_unpack_ex(root, &je, 0,
                            "{s:s, s:I, s:I, s:i, s:i, s:s, s:s, s:{s:s, s:s, s:s, s:s, s:s, s:i}}",
                            "format", &format, "version", &version, "global_step", &step,
                            "epoch", &epoch, "batch_in_epoch", &batch, "seed", &seed,
                            "rng_counter", &counter, "stamp",
                            "device", &dev, "dtype", &dtype, "mode", &mode, "quant", &quant,
                            "strategy", &strategy, "world_size", &world);
    if (rc == 0 && (strcmp(format, "ftkit-trainer-state") != 0 || version != STATE_VERSION))
        rc = ft_fail(err, "%s: not an ftkit trainer state of version %d", path, STATE_VERSION);
    else if (rc != 0)
        rc = ft_fail(err, "%s: %s", path, je.text);
    uint64_t seed_v = 0, counter_v = 0;
    if (rc == 0 && (ft_parse_u64(seed, 0, UINT64_MAX, &seed_v) ||
                    ft_parse_u64(counter, 0, UINT64_MAX, &counter_v)))
        rc = ft_fail(err, "%s: seed '%s' and rng_counter '%s' must be decimal numbers", path,
                     seed, counter);
    if (rc == 0) {
        st->global_step = (long)step;
        st->epoch = epoch;
        st->batch_in_epoch = batch;
        st->seed = seed_v;
        st->rng_counter = counter_v;
        snprintf(st->stamp.device, sizeof st->stamp.device, "%s", dev);
        snprintf(st->stamp.dtype, sizeof st->stamp.dtype, "%s", dtype);
        snprintf(st->stamp.mode, sizeof st->stamp.mode, "%s", mode);
        snprintf(st->stamp.quant, sizeof st->stamp.quant, "%s", quant);
        snprintf(st->stamp.strategy, sizeof st->stamp.strategy, "%s", strategy);
        st->stamp.world_size = world;
    }
    json_decref(root);
    return rc;
}

static int check_stamp(const char *dir, const ft_ckpt_stamp *have, const ft_ckpt_stamp *want,
                       ft_err *err)
{
    /* The strategy and world size may differ: every strategy saves the gathered,
     * public format. */
    const char *names[] = {"device", "dtype", "mode", "quant"};
    const char *h[] = {have->device, have->dtype, have->mode, have->quant};
    const char *w[] = {want->device, want->dtype, want->mode, want->quant};
    for (int i = 0; i < 4; i++)
        if (strcmp(h[i], w[i]) != 0)
            return ft_fail(err, "%s was made with %s '%s', this run uses '%s': refusing to resume",
                           dir, names[i], h[i], w[i]);
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
                       const ft_ckpt_stamp *expect, ft_err *err)
{
    if (load_state(path, st, err))
        return -1;
    if (expect && check_stamp(path, &st->stamp, expect, err))
        return -1;
    char probe[4200];
    if (join(probe, sizeof probe, path, "adapter_config.json", err))
        return -1;
    bool adapter = access(probe, F_OK) == 0;
    if ((adapter ? ft_model_load_adapter(m, path, err) : load_full_weights(path, m, err)) ||
        load_optimizer(path, o, err))
        return -1;
    return 0;
}
