/* train.batch_size auto / train.grad_accum auto (see auto_batch.h). */
#include "memory/auto_batch.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "device/gpu_probe.h"
#include "device/run_device.h"
#include "memory/memplan.h"
#include "formats/model_path.h"

enum { BATCH_CAP = 1024 };

/* MemAvailable x 0.8 on CPU ranks; free device memory x 0.9 on a GPU */
#define HOST_SHARE 0.8
#define DEVICE_SHARE 0.9

ft_mem_device ft_run_device(const ft_train_section *t)
{
    /* a config whose train.device cannot be honoured fails where the run starts */
    ft_run_device_choice c;
    return ft_run_device_resolve(t, &c, NULL) == 0 && c.device == FT_DEV_CUDA
               ? FT_MEM_DEVICE_CUDA
               : FT_MEM_DEVICE_CPU;
}

int ft_parse_size(const char *text, size_t *bytes)
{
    static const struct {
        const char *unit;
        double scale;
    } units[] = {{"", 1},           {"b", 1},          {"kb", 1e3},
                 {"mb", 1e6},       {"gb", 1e9},       {"tb", 1e12},
                 {"kib", 1024.0},   {"mib", 1048576.0}, {"gib", 1073741824.0},
                 {"tib", 1099511627776.0}};
    if (!text || !isdigit((unsigned char)text[0]))
        return -1;
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (errno || !isfinite(v))
        return -1;
    if (*end == ' ')
        end++;
    char unit[8];
    size_t n = strlen(end);
    if (n >= sizeof unit)
        return -1;
    for (size_t i = 0; i <= n; i++)
        unit[i] = (char)tolower((unsigned char)end[i]);
    for (size_t i = 0; i < sizeof units / sizeof *units; i++)
        if (!strcmp(unit, units[i].unit)) {
            double b = v * units[i].scale;
            if (b < 1 || b > 1e18)
                return -1;
            *bytes = (size_t)b;
            return 0;
        }
    return -1;
}

/* MemAvailable of /proc/meminfo in bytes; 0 when it cannot be read. */
static size_t host_available(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    size_t kib = 0;
    if (f) {
        char line[256];
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "MemAvailable: %zu kB", &kib) == 1)
                break;
        fclose(f);
    }
    if (kib)
        return kib * 1024;
    long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? (size_t)pages * (size_t)page : 0;
}

/* train.memory_budget is auto */
static bool budget_auto(const ft_train_section *t) { return !strcmp(t->memory_budget, "auto"); }

int ft_memory_budget_check(const ft_train_section *t, ft_err *err)
{
    size_t bytes;
    if (budget_auto(t) || !ft_parse_size(t->memory_budget, &bytes))
        return 0;
    return ft_fail(err, "config: key 'train.memory_budget' must be a size such as 512MiB, 6GiB "
                        "or 8GB, or auto; got '%s'",
                   t->memory_budget);
}

int ft_rank_memory_budget(const ft_train_section *t, ft_mem_device dev, int device_index,
                          int local_ranks, ft_mem_budget *out, ft_err *err)
{
    memset(out, 0, sizeof *out);
    if (budget_auto(t))
        return ft_memory_available(dev, device_index, local_ranks, out, err);
    const char *v = t->memory_budget;
    if (ft_memory_budget_check(t, err) || ft_parse_size(v, &out->bytes))
        return -1;
    snprintf(out->source, sizeof out->source, "train.memory_budget = %s", v);
    return 0;
}

int ft_memory_available(ft_mem_device dev, int device_index, int local_ranks,
                        ft_mem_budget *out, ft_err *err)
{
    memset(out, 0, sizeof *out);
    if (local_ranks < 1)
        local_ranks = 1;
    if (dev == FT_MEM_DEVICE_CUDA) {
        ft_gpu_probe *p = malloc(sizeof *p);
        if (!p)
            return ft_fail(err, "out of memory");
        ft_gpu_probe_run_device(p, device_index); /* a context on this rank's GPU only */
        int n = p->num_gpus < FT_GPU_MAX ? p->num_gpus : FT_GPU_MAX;
        int rc = 0;
        if (device_index < 0 || device_index >= n || !p->gpus[device_index].mem_free_known) {
            rc = ft_fail(err, "the free memory of GPU %d is unknown (%s); set "
                              "train.memory_budget",
                         device_index, p->reason[0] ? p->reason : "no context");
        } else {
            out->bytes = (size_t)((double)p->gpus[device_index].mem_free * DEVICE_SHARE);
            snprintf(out->source, sizeof out->source, "free memory of GPU %d, %.1f MiB x %.1f",
                     device_index, ft_mib(p->gpus[device_index].mem_free), DEVICE_SHARE);
        }
        free(p);
        return rc;
    }
    size_t avail = host_available();
    if (!avail)
        return ft_fail(err, "the available host memory is unknown (no /proc/meminfo); set "
                            "train.memory_budget");
    out->bytes = (size_t)((double)avail * HOST_SHARE / local_ranks);
    snprintf(out->source, sizeof out->source, "MemAvailable %.1f MiB x %.1f%s", ft_mib(avail),
             HOST_SHARE, local_ranks > 1 ? " / ranks on this node" : "");
    if (local_ranks > 1) {
        size_t len = strlen(out->source) - strlen(" / ranks on this node");
        snprintf(out->source + len, sizeof out->source - len, " / %d ranks on this node",
                 local_ranks);
    }
    return 0;
}

/* ---- the chooser --------------------------------------------------------------------- */

typedef struct chooser {
    const ft_run_config *cfg;
    const ft_model_config *mc;
    int world;
    ft_mem_device dev;
    ft_memplan_result plan;
} chooser;

/* The per-rank peak of a plan on dev (see auto_batch.h for the row). */
static size_t plan_peak(const ft_memplan_result *r, ft_mem_device dev, const char **row)
{
    int i = dev == FT_MEM_DEVICE_CPU ? (r->selected_cpu >= 0 ? r->selected_cpu : FT_PLAN_CPU)
                                     : (int)r->selected;
    if (row)
        *row = r->rows[i].name;
    return r->rows[i].total + (dev == FT_MEM_DEVICE_CPU ? r->rows[i].host : 0);
}

int ft_plan_peak(const ft_run_config *cfg, int world_size, ft_mem_device dev, size_t *peak,
                 const char **row, ft_err *err)
{
    ft_memplan_result *r = malloc(sizeof *r);
    if (!r)
        return ft_fail(err, "out of memory");
    int rc = ft_memplan_config(cfg, world_size, r, err);
    if (rc == 0)
        *peak = plan_peak(r, dev, row);
    free(r);
    return rc;
}

/* The planned per-rank peak of a micro-batch of b rows. */
static int peak_of(chooser *ch, int b, size_t *peak, ft_err *err)
{
    if (ft_memplan_batch(ch->cfg, ch->mc, ch->world, b, &ch->plan, err))
        return -1;
    *peak = plan_peak(&ch->plan, ch->dev, NULL);
    return 0;
}

static const char *row_name(const chooser *ch)
{
    const ft_memplan_result *r = &ch->plan;
    if (ch->dev == FT_MEM_DEVICE_CPU)
        return r->rows[r->selected_cpu >= 0 ? r->selected_cpu : FT_PLAN_CPU].name;
    return r->rows[r->selected].name;
}

static int nothing_fits(chooser *ch, int b, size_t peak, const ft_mem_budget *budget,
                        const char *why, ft_err *err)
{
    const ft_memplan_row *w =
        &ch->plan.rows[ch->dev == FT_MEM_DEVICE_CPU
                           ? (ch->plan.selected_cpu >= 0 ? ch->plan.selected_cpu : FT_PLAN_CPU)
                           : (int)ch->plan.selected];
    return ft_fail(err,
                   "train.batch_size auto: %s a micro-batch of %d needs %.1f MiB per rank "
                   "(plan row %s: %.1f weights, %.1f gradients, %.1f optimizer, %.1f "
                   "activations, %.1f workspace%s) but the budget is %.1f MiB (%s): turn on "
                   "train.gradient_checkpointing, use a sharded dist.strategy (zero3, fsdp) or "
                   "more ranks, or shorten model.max_seq_len (now %ld)",
                   why, b, ft_mib(peak), w->name, ft_mib(w->bytes[FT_MEM_WEIGHTS]),
                   ft_mib(w->bytes[FT_MEM_GRADS]), ft_mib(w->bytes[FT_MEM_OPTIM]),
                   ft_mib(w->bytes[FT_MEM_ACTIVATIONS]), ft_mib(w->bytes[FT_MEM_WORKSPACE]),
                   ch->dev == FT_MEM_DEVICE_CPU && w->host ? ", + host offload" : "",
                   ft_mib(budget->bytes), budget->source,
                   ch->cfg->model.max_seq_len);
}

int ft_auto_batch_choose(const ft_run_config *cfg, const ft_model_config *mc, int world_size,
                         ft_mem_device dev, const ft_mem_budget *budget, int cap,
                         ft_auto_batch *out, ft_err *err)
{
    memset(out, 0, sizeof *out);
    if (world_size < 1 || cap < 1)
        return ft_fail(err, "auto batch: world size and cap must be >= 1 (got %d, %d)",
                       world_size, cap);
    out->batch_auto = cfg->train.batch_size == FT_CFG_AUTO;
    out->accum_auto = cfg->train.grad_accum == FT_CFG_AUTO;
    out->world = world_size;
    out->cap = cap;
    out->budget = *budget;
    out->global = cfg->train.global_batch_size == FT_CFG_AUTO ? 0 : cfg->train.global_batch_size;
    long W = world_size, G = out->global;
    long accum = out->accum_auto ? 0 : cfg->train.grad_accum;
    if (!out->batch_auto)
        return ft_fail(err, "auto batch: train.batch_size is not auto");

    /* with a global batch, b divides q = G / (W x fixed accumulation) */
    long unit = W * (accum ? accum : 1), q = 0;
    if (G) {
        if (G % unit)
            return ft_fail(err, "train.batch_size auto: train.global_batch_size %ld is not "
                                "divisible by world size %ld%s (the global batch is exact: "
                                "batch_size x grad_accum x world size)",
                           G, W, accum ? " x train.grad_accum" : "");
        q = G / unit;
    }
    chooser ch = {.cfg = cfg, .mc = mc, .world = world_size, .dev = dev};
    size_t peak;
    if (G && accum) {
        /* the rule leaves one micro-batch */
        int b = (int)q;
        if (peak_of(&ch, b, &peak, err))
            return -1;
        if (peak > budget->bytes)
            return nothing_fits(&ch, b, peak, budget,
                                "train.global_batch_size / (train.grad_accum x world size) fixes "
                                "it, but",
                                err);
        out->batch_size = b;
        out->grad_accum = (int)accum;
        out->planned = peak;
        snprintf(out->row, sizeof out->row, "%s", row_name(&ch));
        return 0;
    }
    /* the largest b in 1..cap that fits: the peak grows with b (activations) */
    if (peak_of(&ch, 1, &peak, err))
        return -1;
    if (peak > budget->bytes)
        return nothing_fits(&ch, 1, peak, budget, "even", err);
    int lo = 1, hi = cap; /* lo fits; the answer is in [lo, hi] */
    while (lo < hi) {
        int mid = lo + (hi - lo + 1) / 2;
        if (peak_of(&ch, mid, &peak, err))
            return -1;
        if (peak <= budget->bytes)
            lo = mid;
        else
            hi = mid - 1;
    }
    int b = lo;
    if (G)
        while (q % b)
            b--;
    /* the next candidate above b (b + 1, or the next divisor of q), if not beyond the cap */
    int next = b + 1;
    while (G && next <= cap && q % next)
        next++;
    if (next <= cap && (!G || next <= q)) {
        if (peak_of(&ch, next, &out->next, err))
            return -1;
        out->next_batch = next;
    }
    if (peak_of(&ch, b, &out->planned, err))
        return -1;
    snprintf(out->row, sizeof out->row, "%s", row_name(&ch));
    out->batch_size = b;
    out->grad_accum = accum ? (int)accum : G ? (int)(q / b) : 1;
    return 0;
}

/* ---- ft-train's entry ------------------------------------------------------------------ */

/* Records (non-blank lines) of data.train_path when it is a regular file; 0 otherwise. */
static long train_records(const ft_data_section *d)
{
    const char *path = d->train_path[0] ? d->train_path : NULL;
    struct stat st;
    if (!path || !strcmp(path, "-") || stat(path, &st) || !S_ISREG(st.st_mode))
        return 0;
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    long n = 0;
    bool blank = true;
    for (int c; (c = getc(f)) != EOF;) {
        if (c == '\n') {
            n += !blank;
            blank = true;
        } else if (!isspace(c)) {
            blank = false;
        }
    }
    n += !blank;
    fclose(f);
    return n;
}

int ft_resolve_batch(ft_run_config *cfg, ft_comm *comm, int world_size, FILE *log,
                     ft_auto_batch *out, ft_err *err)
{
    ft_auto_batch a;
    memset(&a, 0, sizeof a);
    ft_train_section *t = &cfg->train;
    if (ft_memory_budget_check(t, err))
        return -1;
    int world = comm ? ft_comm_size(comm) : world_size;
    bool batch_auto = t->batch_size == FT_CFG_AUTO;
    bool accum_auto = t->grad_accum == FT_CFG_AUTO;
    if (batch_auto) {
        /* the budget: this rank's, the smallest of all ranks' */
        ft_mem_device dev = ft_run_device(t);
        int64_t local = comm ? ft_comm_local_rank(comm) + 1 : world;
        if (comm && world > 1 &&
            ft_comm_allreduce(comm, &local, 1, FT_COMM_I64, FT_COMM_MAX, err))
            return -1;
        ft_mem_budget budget;
        /* on a GPU, the one this rank takes (which is not local_rank when each rank sees
         * only its own GPU) */
        int local_rank = comm ? ft_comm_local_rank(comm) : 0;
        int index = dev == FT_MEM_DEVICE_CUDA ? ft_rank_gpu(local_rank) : local_rank;
        if (ft_rank_memory_budget(t, dev, index, (int)local, &budget, err))
            return -1;
        int64_t bytes = (int64_t)budget.bytes;
        if (comm && world > 1) {
            /* the smallest: the largest of the negated */
            bytes = -bytes;
            if (ft_comm_allreduce(comm, &bytes, 1, FT_COMM_I64, FT_COMM_MAX, err))
                return -1;
            bytes = -bytes;
            if ((size_t)bytes != budget.bytes) {
                budget.bytes = (size_t)bytes;
                /* (what the other rank measured: its GPU's free memory on a GPU run) */
                bool gpu = dev == FT_MEM_DEVICE_CUDA;
                snprintf(budget.source, sizeof budget.source,
                         "another rank's %s x %.1f, the smallest",
                         gpu ? "free GPU memory" : "MemAvailable", gpu ? DEVICE_SHARE : HOST_SHARE);
            }
        }
        ft_model_config mc;
        char dir[4096], path[4200];
        if (!cfg->model.name[0])
            return ft_fail(err, "config: key 'model.name' is required (a Hugging Face model dir)");
        if (ft_resolve_model_dir(cfg->model.name, dir, sizeof dir, err))
            return -1;
        snprintf(path, sizeof path, "%s/config.json", dir);
        if (ft_model_config_load(&mc, path, err))
            return -1;
        int cap = BATCH_CAP;
        long records = train_records(&cfg->data);
        long dworld = cfg->dist.strategy == FT_CFG_STRATEGY_MODEL_PARALLEL ? 1 : world;
        if (records > 0 && (records + dworld - 1) / dworld < cap)
            cap = (int)((records + dworld - 1) / dworld);
        if (ft_auto_batch_choose(cfg, &mc, world, dev, &budget, cap, &a, err))
            return -1;
        t->batch_size = a.batch_size;
        if (accum_auto)
            t->grad_accum = a.grad_accum;
    }
    /* a fixed batch_size with grad_accum auto: the global batch rule derives it (as
     * DeepSpeed does), else 1 */
    if (ft_run_config_global_batch(t, world, err))
        return -1;
    if (accum_auto && t->grad_accum == FT_CFG_AUTO)
        t->grad_accum = 1;
    if (!batch_auto) {
        a.accum_auto = accum_auto;
        a.world = world;
        a.batch_size = (int)t->batch_size;
        a.grad_accum = (int)t->grad_accum;
        a.global = t->global_batch_size == FT_CFG_AUTO ? 0 : t->global_batch_size;
    }
    if (log && (batch_auto || accum_auto))
        ft_auto_batch_print(&a, log);
    if (out)
        *out = a;
    return 0;
}

void ft_auto_batch_print(const ft_auto_batch *a, FILE *out)
{
    fprintf(out, "ft-train:");
    if (a->batch_auto) {
        fprintf(out,
                " batch_size auto = %d: planned %.1f MiB per rank (%s, %d rank%s) fits the "
                "budget of %.1f MiB (%s)",
                a->batch_size, ft_mib(a->planned), a->row, a->world, a->world == 1 ? "" : "s",
                ft_mib(a->budget.bytes), a->budget.source);
        if (a->next_batch)
            fprintf(out, ", %d would need %.1f MiB", a->next_batch, ft_mib(a->next));
        else if (!a->global && a->batch_size == a->cap)
            fprintf(out, ", capped at %d", a->cap);
    }
    if (a->accum_auto)
        fprintf(out, "%s grad_accum auto = %d", a->batch_auto ? ";" : "", a->grad_accum);
    if (a->global)
        fprintf(out, " (global batch %ld = %d x %d x %d rank%s)", a->global, a->batch_size,
                a->grad_accum, a->world, a->world == 1 ? "" : "s");
    else if (a->accum_auto)
        fprintf(out, " (train.global_batch_size is auto)");
    fprintf(out, "\n");
}
