/* Planned beside measured (see memcheck.h). */
#include "memory/memcheck.h"

#include <stdlib.h>
#include <string.h>

int ft_mem_measured_init(ft_mem_measured *m, int world, ft_err *err)
{
    memset(m, 0, sizeof *m);
    if (world < 1)
        return ft_fail(err, "memory check: world size must be >= 1 (got %d)", world);
    m->world = world;
    m->peak = calloc((size_t)world * FT_MEM_NCAT, sizeof *m->peak);
    m->host = calloc((size_t)world, sizeof *m->host);
    if (!m->peak || !m->host) {
        ft_mem_measured_free(m);
        return ft_fail(err, "out of memory");
    }
    return 0;
}

void ft_mem_measured_free(ft_mem_measured *m)
{
    free(m->peak);
    free(m->host);
    m->peak = m->host = NULL;
}

static size_t rank_total(const ft_mem_measured *m, int r)
{
    size_t t = 0;
    for (int c = 0; c < FT_MEM_NCAT; c++)
        t += m->peak[(size_t)r * FT_MEM_NCAT + c];
    return t;
}

/* One line of bytes: label, five categories, total, host. */
static void print_bytes(FILE *out, int rank, const char *what, const size_t *b, size_t host)
{
    size_t total = 0;
    fprintf(out, "%-4d %-8s", rank, what);
    for (int c = 0; c < FT_MEM_NCAT; c++) {
        fprintf(out, " %12zu", b[c]);
        total += b[c];
    }
    fprintf(out, " %12zu %12zu\n", total, host);
}

static void print_diff(FILE *out, int rank, const size_t *plan, size_t plan_host,
                       const size_t *meas, size_t meas_host)
{
    long long total = 0;
    fprintf(out, "%-4d %-8s", rank, "diff");
    for (int c = 0; c < FT_MEM_NCAT; c++) {
        long long d = (long long)meas[c] - (long long)plan[c];
        total += d;
        fprintf(out, " %+12lld", d);
    }
    fprintf(out, " %+12lld %+12lld\n", total, (long long)meas_host - (long long)plan_host);
}

static size_t absdiff(size_t a, size_t b) { return a > b ? a - b : b - a; }

size_t ft_memcheck_print(const ft_memplan_result *plan, const ft_mem_measured *m, FILE *out)
{
    int row = ft_memplan_cpu_row_of(m->strategy);
    /* the measured row of the table: the rank with the largest total */
    int big = 0, small = 0;
    for (int r = 1; r < m->world; r++) {
        if (rank_total(m, r) > rank_total(m, big))
            big = r;
        if (rank_total(m, r) < rank_total(m, small))
            small = r;
    }
    ft_memplan_row meas = {.name = "measured", .world_size = m->world, .rank = big,
                           .host = m->host[big]};
    for (int c = 0; c < FT_MEM_NCAT; c++)
        meas.bytes[c] = m->peak[(size_t)big * FT_MEM_NCAT + c];
    meas.total = rank_total(m, big);
    ft_memplan_print_with(plan, &meas, out);

    fprintf(out,
            "\nmeasured after one training step: %s on %d rank%s, %d micro-batch%s of %d x %d "
            "tokens (padded to model.max_seq_len); bytes per rank, planned = %s%s\n",
            m->strategy, m->world, m->world == 1 ? "" : "s", m->grad_accum,
            m->grad_accum == 1 ? "" : "es", m->batch_size, m->seq_len,
            row >= 0 ? plan->rows[row].name : "(no row)", row >= 0 ? " (exact)" : "");
    fprintf(out, "%-4s %-8s %12s %12s %12s %12s %12s %12s %12s\n", "rank", "", "weights",
            "gradients", "optimizer", "activations", "workspace", "total", "host");
    size_t worst = 0;
    for (int r = 0; r < m->world; r++) {
        bool show = m->world <= 8 || r == big || r == small;
        const size_t *got = m->peak + (size_t)r * FT_MEM_NCAT;
        size_t want[FT_MEM_NCAT] = {0}, want_host = 0;
        if (row >= 0) {
            ft_memplan_cpu_rank(plan, (ft_plan_row_id)row, r, want, &want_host);
            for (int c = 0; c < FT_MEM_NCAT; c++)
                if (absdiff(got[c], want[c]) > worst)
                    worst = absdiff(got[c], want[c]);
            if (absdiff(m->host[r], want_host) > worst)
                worst = absdiff(m->host[r], want_host);
        }
        if (!show)
            continue;
        if (row >= 0)
            print_bytes(out, r, "planned", want, want_host);
        print_bytes(out, r, "measured", got, m->host[r]);
        if (row >= 0)
            print_diff(out, r, want, want_host, got, m->host[r]);
    }
    if (m->world > 8)
        fprintf(out, "(ranks %d (largest) and %d (smallest) of %d shown)\n", big, small,
                m->world);
    if (row < 0) {
        fprintf(out, "%s has no exact row: measured only\n", m->strategy);
        return (size_t)-1;
    }
    if (worst == 0)
        fprintf(out, "measured == planned on every rank and category (%s is exact)\n",
                plan->rows[row].name);
    else
        fprintf(out, "measured differs from the exact %s row by up to %zu bytes: the planner "
                     "(lib/memory/memplan.c) and the engine disagree\n",
                plan->rows[row].name, worst);
    return worst;
}
