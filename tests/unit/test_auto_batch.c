/* train.batch_size auto / train.grad_accum auto (lib/memory/auto_batch.h): the chosen micro-batch
 * fits the budget and the next one does not, at the boundaries (budget = the plan of b
 * exactly, and one byte less); the accumulation reaches the global batch exactly; the
 * error when nothing fits; sizes; the per-rank cpu rows of the planner the chooser uses
 * (shards add up to the whole). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "tiny_model.h"
#include "memory/auto_batch.h"
#include "config/config.h"
#include "memory/memplan.h"

static char root[256], model_dir[300], tied_dir[300];
static ft_model_config mc;

/* The run config of model_dir with sets applied (free() it). */
static ft_run_config *make_config(const char *const *sets)
{
    ft_config *c = ft_config_new();
    ft_err err;
    char name[400];
    snprintf(name, sizeof name, "model.name=%s", model_dir);
    CHECK(ft_config_set(c, name, NULL, &err) == 0);
    CHECK(ft_config_set(c, "model.max_seq_len=16", NULL, &err) == 0);
    for (int i = 0; sets[i]; i++)
        if (ft_config_set(c, sets[i], NULL, &err)) {
            fprintf(stderr, "  --set %s: %s\n", sets[i], err.msg);
            CHECK(0);
        }
    ft_run_config *rc = malloc(sizeof *rc);
    *rc = *ft_config_values(c);
    free(c);
    return rc;
}

/* The per-rank peak the chooser compares with the budget: the selected cpu row. */
static size_t peak(const ft_run_config *c, int world, int b)
{
    ft_memplan_result r;
    ft_err err;
    CHECK(ft_memplan_batch(c, &mc, world, b, &r, &err) == 0);
    int i = r.selected_cpu >= 0 ? r.selected_cpu : FT_PLAN_CPU;
    return r.rows[i].total + r.rows[i].host;
}

static ft_mem_budget budget_of(size_t bytes)
{
    ft_mem_budget b = {.bytes = bytes};
    snprintf(b.source, sizeof b.source, "test");
    return b;
}

static void test_parse_size(void)
{
    size_t b = 0;
    CHECK(ft_parse_size("512MiB", &b) == 0 && b == 512ull << 20);
    CHECK(ft_parse_size("6GiB", &b) == 0 && b == 6ull << 30);
    CHECK(ft_parse_size("8GB", &b) == 0 && b == 8000000000ull);
    CHECK(ft_parse_size("1.5 gib", &b) == 0 && b == 3ull << 29);
    CHECK(ft_parse_size("100kb", &b) == 0 && b == 100000);
    CHECK(ft_parse_size("4096", &b) == 0 && b == 4096);
    CHECK(ft_parse_size("12B", &b) == 0 && b == 12);
    CHECK(ft_parse_size("", &b) != 0);
    CHECK(ft_parse_size("GiB", &b) != 0);
    CHECK(ft_parse_size("-1GiB", &b) != 0);
    CHECK(ft_parse_size("0MiB", &b) != 0);
    CHECK(ft_parse_size("10XB", &b) != 0);
    CHECK(ft_parse_size("10 MiB extra", &b) != 0);
    CHECK(ft_parse_size("auto", &b) != 0);
}

/* budget = plan(b) exactly: b is chosen and b + 1 would not fit; one byte less: b - 1 */
static void test_budget_boundaries(void)
{
    const char *const sets[] = {"train.batch_size=auto", NULL};
    ft_run_config *c = make_config(sets);
    ft_err err;
    for (int want = 1; want <= 9; want += 4) {
        ft_mem_budget bud = budget_of(peak(c, 1, want));
        ft_auto_batch a;
        CHECK(ft_auto_batch_choose(c, &mc, 1, FT_MEM_DEVICE_CPU, &bud, 1024, &a, &err) == 0);
        CHECK(a.batch_size == want && a.grad_accum == 1);
        CHECK(a.planned == bud.bytes && a.planned <= bud.bytes);
        CHECK(a.next_batch == want + 1 && a.next > bud.bytes);
        CHECK(a.next == peak(c, 1, want + 1));
        CHECK(!strcmp(a.row, "cpu-fp32"));
        if (want > 1) {
            bud.bytes--;
            CHECK(ft_auto_batch_choose(c, &mc, 1, FT_MEM_DEVICE_CPU, &bud, 1024, &a, &err) ==
                  0);
            CHECK(a.batch_size == want - 1 && a.planned <= bud.bytes && a.next > bud.bytes);
        }
    }
    /* the cap: a huge budget stops at it */
    ft_mem_budget big = budget_of((size_t)1 << 50);
    ft_auto_batch a;
    CHECK(ft_auto_batch_choose(c, &mc, 1, FT_MEM_DEVICE_CPU, &big, 7, &a, &err) == 0);
    CHECK(a.batch_size == 7 && a.next_batch == 0 && a.cap == 7);
    free(c);
}

/* The strategy's row at the world size decides: zero3 on 4 ranks fits a larger batch in
 * the same budget than one process; model_parallel plans with its stages (cpu-mp). */
static void test_strategy_rows(void)
{
    const char *const one[] = {"train.batch_size=auto", "tuning.mode=full", NULL};
    const char *const z3[] = {"train.batch_size=auto", "tuning.mode=full", "dist.strategy=zero3",
                              NULL};
    const char *const mp[] = {"train.batch_size=auto", "dist.strategy=model_parallel", NULL};
    ft_run_config *c1 = make_config(one), *c3 = make_config(z3), *cm = make_config(mp);
    ft_err err;
    ft_mem_budget bud = budget_of(peak(c1, 1, 3));
    ft_auto_batch a1, a3, am;
    CHECK(ft_auto_batch_choose(c1, &mc, 1, FT_MEM_DEVICE_CPU, &bud, 1024, &a1, &err) == 0);
    CHECK(ft_auto_batch_choose(c3, &mc, 4, FT_MEM_DEVICE_CPU, &bud, 1024, &a3, &err) == 0);
    CHECK(a1.batch_size == 3 && !strcmp(a1.row, "cpu-fp32"));
    CHECK(!strcmp(a3.row, "cpu-zero3") && a3.world == 4);
    CHECK(a3.batch_size >= a1.batch_size && a3.planned <= bud.bytes && a3.next > bud.bytes);
    CHECK(ft_auto_batch_choose(cm, &mc, 2, FT_MEM_DEVICE_CPU, &bud, 1024, &am, &err) == 0);
    CHECK(!strcmp(am.row, "cpu-mp") && am.planned <= bud.bytes && am.next > bud.bytes);
    free(c1);
    free(c3);
    free(cm);
}

/* With train.global_batch_size: b divides G / W and accum = G / (b x W) exactly. */
static void test_global_batch(void)
{
    const char *const sets[] = {"train.batch_size=auto", "train.grad_accum=auto",
                                "train.global_batch_size=24", NULL};
    ft_run_config *c = make_config(sets);
    ft_err err;
    ft_auto_batch a;
    /* 5 fits, but 5 does not divide 12: 4, accumulated 3 times on 2 ranks */
    ft_mem_budget bud = budget_of(peak(c, 2, 5));
    CHECK(ft_auto_batch_choose(c, &mc, 2, FT_MEM_DEVICE_CPU, &bud, 1024, &a, &err) == 0);
    CHECK(a.batch_size == 4 && a.grad_accum == 3 && a.global == 24);
    CHECK((long)a.batch_size * a.grad_accum * 2 == 24);
    CHECK(a.next_batch == 6 && a.next > bud.bytes);
    /* everything fits: b = G / W, one micro-batch */
    bud = budget_of((size_t)1 << 50);
    CHECK(ft_auto_batch_choose(c, &mc, 2, FT_MEM_DEVICE_CPU, &bud, 1024, &a, &err) == 0);
    CHECK(a.batch_size == 12 && a.grad_accum == 1 && a.next_batch == 0);
    /* the smallest accumulation that reaches the global batch, for every budget */
    for (int fit = 1; fit <= 12; fit++) {
        bud = budget_of(peak(c, 2, fit));
        CHECK(ft_auto_batch_choose(c, &mc, 2, FT_MEM_DEVICE_CPU, &bud, 1024, &a, &err) == 0);
        CHECK(12 % a.batch_size == 0 && a.batch_size <= fit);
        CHECK((long)a.batch_size * a.grad_accum * 2 == 24);
        for (int b = a.batch_size + 1; b <= fit; b++)
            CHECK(12 % b != 0); /* no larger divisor fitted */
    }
    /* not divisible by the world size */
    CHECK(ft_auto_batch_choose(c, &mc, 5, FT_MEM_DEVICE_CPU, &bud, 1024, &a, &err) != 0);
    CHECK(strstr(err.msg, "train.global_batch_size 24 is not divisible by world size 5") !=
          NULL);
    free(c);

    /* a fixed accumulation leaves one micro-batch: G / (W x accum) */
    const char *const fixed[] = {"train.batch_size=auto", "train.grad_accum=3",
                                 "train.global_batch_size=24", NULL};
    c = make_config(fixed);
    bud = budget_of(peak(c, 2, 4));
    CHECK(ft_auto_batch_choose(c, &mc, 2, FT_MEM_DEVICE_CPU, &bud, 1024, &a, &err) == 0);
    CHECK(a.batch_size == 4 && a.grad_accum == 3);
    bud.bytes--;
    CHECK(ft_auto_batch_choose(c, &mc, 2, FT_MEM_DEVICE_CPU, &bud, 1024, &a, &err) != 0);
    CHECK(strstr(err.msg, "fixes it") && strstr(err.msg, "budget"));
    free(c);
}

/* Nothing fits: the planned bytes, the budget and what to do. */
static void test_nothing_fits(void)
{
    const char *const sets[] = {"train.batch_size=auto", NULL};
    ft_run_config *c = make_config(sets);
    ft_err err;
    ft_auto_batch a;
    ft_mem_budget bud = budget_of(peak(c, 1, 1) - 1);
    snprintf(bud.source, sizeof bud.source, "train.memory_budget = tiny");
    CHECK(ft_auto_batch_choose(c, &mc, 1, FT_MEM_DEVICE_CPU, &bud, 1024, &a, &err) != 0);
    CHECK(strstr(err.msg, "train.batch_size auto: even a micro-batch of 1 needs") != NULL);
    CHECK(strstr(err.msg, "train.memory_budget = tiny") != NULL);
    CHECK(strstr(err.msg, "train.gradient_checkpointing") && strstr(err.msg, "zero3") &&
          strstr(err.msg, "model.max_seq_len"));
    free(c);
}

/* ft_resolve_batch writes the chosen values into the config; a fixed batch_size with
 * grad_accum auto follows the global batch rule (or 1); a bad budget names the key. */
static void test_resolve(void)
{
    ft_err err;
    ft_auto_batch a;
    const char *const both[] = {"train.batch_size=auto", "train.grad_accum=auto",
                                "train.memory_budget=1GiB", NULL};
    ft_run_config *c = make_config(both);
    CHECK(ft_resolve_batch(c, NULL, 2, NULL, &a, &err) == 0);
    CHECK(c->train.batch_size != FT_CFG_AUTO && c->train.grad_accum != FT_CFG_AUTO);
    CHECK(c->train.batch_size == a.batch_size && a.batch_size >= 1);
    CHECK(c->train.grad_accum == 1);
    CHECK(a.budget.bytes == 1ull << 30 && strstr(a.budget.source, "train.memory_budget"));
    free(c);

    const char *const accum[] = {"train.batch_size=3", "train.grad_accum=auto",
                                 "train.global_batch_size=12", NULL};
    c = make_config(accum);
    CHECK(ft_resolve_batch(c, NULL, 2, NULL, &a, &err) == 0);
    CHECK(c->train.grad_accum == 2 && a.grad_accum == 2 && a.accum_auto);
    free(c);
    const char *const accum1[] = {"train.batch_size=3", "train.grad_accum=auto", NULL};
    c = make_config(accum1);
    CHECK(ft_resolve_batch(c, NULL, 2, NULL, &a, &err) == 0);
    CHECK(c->train.grad_accum == 1);
    free(c);

    const char *const bad[] = {"train.memory_budget=12 apples", NULL};
    c = make_config(bad);
    CHECK(ft_resolve_batch(c, NULL, 1, NULL, &a, &err) != 0);
    CHECK(strstr(err.msg, "train.memory_budget") && strstr(err.msg, "12 apples"));
    free(c);

    /* the cap: the training file's records per data-parallel rank */
    char data[400], set[450];
    snprintf(data, sizeof data, "%s/train.jsonl", root);
    FILE *f = fopen(data, "w");
    for (int i = 0; i < 9; i++)
        fprintf(f, "{\"text\": \"row %d\"}\n\n", i);
    fclose(f);
    snprintf(set, sizeof set, "data.train_path=%s", data);
    const char *const capped[] = {"train.batch_size=auto", "train.memory_budget=1TiB", set, NULL};
    c = make_config(capped);
    CHECK(ft_resolve_batch(c, NULL, 2, NULL, &a, &err) == 0);
    CHECK(a.cap == 5 && a.batch_size == 5); /* ceil(9 / 2) */
    free(c);
}

/* The budget without train.memory_budget: the host's MemAvailable x 0.8 over the ranks. */
static void test_host_budget(void)
{
    ft_mem_budget one, four;
    ft_err err;
    CHECK(ft_memory_available(FT_MEM_DEVICE_CPU, 0, 1, &one, &err) == 0);
    CHECK(ft_memory_available(FT_MEM_DEVICE_CPU, 0, 4, &four, &err) == 0);
    CHECK(one.bytes > 0 && strstr(one.source, "MemAvailable"));
    CHECK(four.bytes <= one.bytes / 4 + one.bytes / 100); /* (MemAvailable moves a little) */
    CHECK(strstr(four.source, "4 ranks"));
}

/* The cpu rows per rank: shards of the balanced split add up to the whole buffers. */
static void test_cpu_rank_rows(void)
{
    const char *const sets[] = {"tuning.mode=full", "dist.strategy=zero3", NULL};
    char tied_set[400];
    snprintf(tied_set, sizeof tied_set, "model.name=%s", tied_dir);
    const char *const tied[] = {"tuning.mode=lora", tied_set, NULL};
    for (int k = 0; k < 2; k++) {
        ft_run_config *c = make_config(k ? tied : sets);
        ft_memplan_result r;
        ft_err err;
        CHECK(ft_memplan_config(c, 3, &r, &err) == 0);
        size_t Pt = r.n_trainable, Pf = r.n_frozen;
        size_t w3 = 0, g3 = 0, o1 = 0, largest = 0;
        for (int rank = 0; rank < 3; rank++) {
            size_t b[FT_MEM_NCAT], host;
            size_t t = ft_memplan_cpu_rank(&r, FT_PLAN_CPU_ZERO3, rank, b, &host);
            w3 += b[FT_MEM_WEIGHTS];
            g3 += b[FT_MEM_GRADS];
            if (t > largest)
                largest = t;
            ft_memplan_cpu_rank(&r, FT_PLAN_CPU_ZERO1, rank, b, &host);
            o1 += b[FT_MEM_OPTIM];
            CHECK(host == 0);
        }
        CHECK(w3 == 4 * (Pt + Pf) && g3 == 4 * Pt && o1 == 8 * Pt);
        CHECK(r.rows[FT_PLAN_CPU_ZERO3].total == largest);
        CHECK(r.rows[FT_PLAN_CPU_ZERO3].world_size == 3 && !r.rows[FT_PLAN_CPU_ZERO3].predicted);
        /* a rank that does not exist */
        size_t b[FT_MEM_NCAT];
        CHECK(ft_memplan_cpu_rank(&r, FT_PLAN_CPU_ZERO3, 3, b, NULL) == 0);
        CHECK(ft_memplan_cpu_rank(&r, FT_PLAN_CPU, 1, b, NULL) == 0);
        CHECK(ft_memplan_cpu_rank(&r, FT_PLAN_GPU_1, 0, b, NULL) == 0);
        /* the whole-model rows equal cpu-fp32 */
        CHECK(r.rows[FT_PLAN_CPU_DDP].total == r.rows[FT_PLAN_CPU].total);
        CHECK(r.selected_cpu == (k ? FT_PLAN_CPU_DDP : FT_PLAN_CPU_ZERO3));
        CHECK(r.selected == (k ? FT_PLAN_GPU_DDP : FT_PLAN_GPU_ZERO3));
        free(c);
    }
    /* offload: the optimizer column moves to the host, 16 bytes per owned parameter */
    const char *const off[] = {"dist.strategy=zero2", "dist.offload_optimizer=cpu", NULL};
    ft_run_config *c = make_config(off);
    ft_memplan_result r;
    ft_err err;
    CHECK(ft_memplan_config(c, 2, &r, &err) == 0);
    size_t b[FT_MEM_NCAT], host = 0, sum = 0;
    for (int rank = 0; rank < 2; rank++) {
        ft_memplan_cpu_rank(&r, FT_PLAN_CPU_ZERO2, rank, b, &host);
        CHECK(b[FT_MEM_OPTIM] == 0);
        sum += host;
    }
    CHECK(sum == 16 * r.n_trainable);
    CHECK(ft_memplan_cpu_row_of("zero2") == FT_PLAN_CPU_ZERO2);
    CHECK(ft_memplan_cpu_row_of("none") == FT_PLAN_CPU);
    CHECK(ft_memplan_cpu_row_of("model_parallel") == FT_PLAN_CPU_MP);
    CHECK(ft_memplan_cpu_row_of("pipeline") == -1);
    free(c);

    /* model_parallel: the stages hold the model once between them; more ranks than units
     * (embeddings, 2 layers, head) has no row */
    const char *const mp[] = {"tuning.mode=full", "dist.strategy=model_parallel", NULL};
    c = make_config(mp);
    CHECK(ft_memplan_config(c, 3, &r, &err) == 0);
    CHECK(r.selected_cpu == FT_PLAN_CPU_MP && r.pipe_stages == 3 && r.selected == FT_PLAN_GPU_1);
    size_t w = 0, o = 0;
    for (int rank = 0; rank < 3; rank++) {
        ft_memplan_cpu_rank(&r, FT_PLAN_CPU_MP, rank, b, &host);
        w += b[FT_MEM_WEIGHTS];
        o += b[FT_MEM_OPTIM];
        CHECK(b[FT_MEM_OPTIM] == 2 * b[FT_MEM_WEIGHTS] && host == 0);
    }
    CHECK(w == 4 * r.n_trainable && o == 8 * r.n_trainable);
    CHECK(ft_memplan_config(c, 5, &r, &err) == 0);
    CHECK(r.selected_cpu == -1 && r.pipe_stages == 0);
    CHECK(ft_memplan_cpu_rank(&r, FT_PLAN_CPU_MP, 0, b, NULL) == 0);
    free(c);
}

int main(void)
{
    snprintf(root, sizeof root, "/tmp/ft_auto_batch_XXXXXX");
    if (!mkdtemp(root)) {
        perror("mkdtemp");
        return 1;
    }
    snprintf(model_dir, sizeof model_dir, "%s/llama", root);
    snprintf(tied_dir, sizeof tied_dir, "%s/tied", root);
    write_tiny_model(model_dir, &(tiny_model_opts){0});
    write_tiny_model(tied_dir, &(tiny_model_opts){.tied = 1});
    char path[400];
    snprintf(path, sizeof path, "%s/config.json", model_dir);
    ft_err err;
    if (ft_model_config_load(&mc, path, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }

    RUN(test_parse_size);
    RUN(test_budget_boundaries);
    RUN(test_strategy_rows);
    RUN(test_global_batch);
    RUN(test_nothing_fits);
    RUN(test_resolve);
    RUN(test_host_budget);
    RUN(test_cpu_rank_rows);

    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", root);
    return check_summary("auto_batch");
}
