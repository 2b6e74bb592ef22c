/* Batches from a dataset: shuffling by (seed, epoch), rank sharding, padding or packing
 * (see data.h for the contract).
 *
 * Each epoch has a plan, rebuilt when another epoch is asked for:
 *   order   the dataset's indices, shuffled by Fisher-Yates keyed by (seed, epoch);
 *   shard   this rank's samples: order[rank], order[rank + world], ... -- floor(n / world)
 *           of them on every rank, so every rank has the same number of batches;
 *   rows    (packing) this rank's shard laid greedily, in shard order, into rows of
 *           seq_len tokens: a sample goes into the current row when it fits, else opens
 *           the next row. Ranks can pack into different numbers of rows; every rank
 *           computes all ranks' counts (the data are the same everywhere) and keeps the
 *           smallest, dropping its extra rows, so the batch counts agree.
 * A batch holds batch_size samples (or rows); the epoch's last batch may hold fewer.
 * Packed rows are padded to seq_len with pad_id (label -100); the padding gets positions
 * 0, 1, ... of its own, so it is a sequence apart and attention from real tokens never
 * reaches it. Without packing a batch is right-padded to its longest sample. The
 * attention_mask is 1 on the samples' tokens, 0 on the padding. */
#include <stdlib.h>
#include <string.h>

#include "data/data.h"
#include "core/rng.h"

void ft_shuffle_indices(size_t *idx, size_t n, uint64_t seed, uint64_t stream)
{
    uint64_t key = ft_mix64(seed ^ ft_mix64(stream ^ 0xA5A5A5A5DA7A5EEDull));
    for (size_t i = n; i > 1; i--) {
        uint64_t r = ft_mix64(key + ft_mix64((uint64_t)i));
        size_t j = (size_t)(((unsigned __int128)r * i) >> 64); /* uniform in [0, i) */
        size_t t = idx[i - 1];
        idx[i - 1] = idx[j];
        idx[j] = t;
    }
}

struct ft_loader {
    const ft_dataset *ds;
    ft_loader_options o;
    int epoch; /* of the plan; -1 before the first */
    size_t n_per;
    size_t *order, *shard;
    size_t *row_start, *row_len, n_rows; /* packing: rows as ranges of shard */
    int32_t *ids, *labels, *pos, *mask;
    size_t max_len;
};

int ft_loader_new(ft_loader **out, const ft_dataset *ds, const ft_loader_options *o,
                  ft_err *err)
{
    *out = NULL;
    if (o->batch_size < 1)
        return ft_fail(err, "loader: batch_size %d < 1", o->batch_size);
    if (o->world < 1 || o->rank < 0 || o->rank >= o->world)
        return ft_fail(err, "loader: rank %d of world %d", o->rank, o->world);
    if (o->packing && o->seq_len < 1)
        return ft_fail(err, "loader: packing needs seq_len >= 1 (got %d)", o->seq_len);
    if (ds->n == 0)
        return ft_fail(err, "no samples (the file is empty, or every line was skipped or "
                            "dropped: see the data line above)");
    if (ds->n < (size_t)o->world)
        return ft_fail(err, "%zu samples for %d ranks: every rank needs one", ds->n,
                       o->world);
    size_t max_len = 1;
    for (size_t i = 0; i < ds->n; i++) {
        const ft_sample *s = &ds->samples[i];
        if (o->packing && s->n > o->seq_len)
            return ft_fail(err, "loader: the sample of line %ld has %d tokens, more than the "
                                "packing row length %d (set max_seq_len <= seq_len)",
                           s->line, s->n, o->seq_len);
        if ((size_t)s->n > max_len)
            max_len = (size_t)s->n;
    }
    ft_loader *l = calloc(1, sizeof *l);
    if (!l)
        return ft_fail(err, "out of memory");
    l->ds = ds;
    l->o = *o;
    l->epoch = -1;
    l->n_per = ds->n / (size_t)o->world;
    l->max_len = o->packing ? (size_t)o->seq_len : max_len;
    size_t cells = (size_t)o->batch_size * l->max_len;
    l->order = malloc(ds->n * sizeof *l->order);
    l->shard = malloc(l->n_per * sizeof *l->shard);
    l->row_start = malloc(l->n_per * sizeof *l->row_start);
    l->row_len = malloc(l->n_per * sizeof *l->row_len);
    l->ids = malloc(cells * sizeof *l->ids);
    l->labels = malloc(cells * sizeof *l->labels);
    l->pos = malloc(cells * sizeof *l->pos);
    l->mask = malloc(cells * sizeof *l->mask);
    if (!l->order || !l->shard || !l->row_start || !l->row_len || !l->ids || !l->labels ||
        !l->pos || !l->mask) {
        ft_loader_free(l);
        return ft_fail(err, "out of memory");
    }
    *out = l;
    return 0;
}

void ft_loader_free(ft_loader *l)
{
    if (!l)
        return;
    free(l->order);
    free(l->shard);
    free(l->row_start);
    free(l->row_len);
    free(l->ids);
    free(l->labels);
    free(l->pos);
    free(l->mask);
    free(l);
}

/* Greedy packing of rank r's shard; when start/len are given, records the rows. */
static size_t pack(const ft_loader *l, int r, size_t *start, size_t *len)
{
    size_t rows = 0, fill = 0, W = (size_t)l->o.world;
    for (size_t k = 0; k < l->n_per; k++) {
        size_t n = (size_t)l->ds->samples[l->order[(size_t)r + k * W]].n;
        if (rows == 0 || fill + n > (size_t)l->o.seq_len) {
            if (start) {
                start[rows] = k;
                len[rows] = 0;
            }
            rows++;
            fill = 0;
        }
        fill += n;
        if (len)
            len[rows - 1]++;
    }
    return rows;
}

static void plan(ft_loader *l, int epoch)
{
    if (l->epoch == epoch)
        return;
    size_t n = l->ds->n;
    for (size_t i = 0; i < n; i++)
        l->order[i] = i;
    if (l->o.shuffle)
        ft_shuffle_indices(l->order, n, l->o.seed, (uint64_t)epoch);
    for (size_t k = 0; k < l->n_per; k++)
        l->shard[k] = l->order[(size_t)l->o.rank + k * (size_t)l->o.world];
    if (l->o.packing) {
        size_t keep = pack(l, l->o.rank, l->row_start, l->row_len);
        for (int r = 0; r < l->o.world; r++) {
            size_t rows = r == l->o.rank ? keep : pack(l, r, NULL, NULL);
            if (rows < keep)
                keep = rows;
        }
        l->n_rows = keep;
    }
    l->epoch = epoch;
}

int ft_loader_n_batches(ft_loader *l, int epoch)
{
    plan(l, epoch);
    size_t units = l->o.packing ? l->n_rows : l->n_per, bs = (size_t)l->o.batch_size;
    return (int)((units + bs - 1) / bs);
}

int ft_loader_batch(ft_loader *l, int epoch, int index, ft_batch *b, ft_err *err)
{
    int nb = ft_loader_n_batches(l, epoch);
    if (index < 0 || index >= nb)
        return ft_fail(err, "loader: batch %d of epoch %d out of range (%d batches)", index,
                       epoch, nb);
    size_t bs = (size_t)l->o.batch_size, first = (size_t)index * bs;
    size_t units = l->o.packing ? l->n_rows : l->n_per;
    size_t B = units - first < bs ? units - first : bs;
    size_t T = 0;
    if (l->o.packing) {
        T = (size_t)l->o.seq_len;
    } else {
        for (size_t i = 0; i < B; i++) {
            size_t n = (size_t)l->ds->samples[l->shard[first + i]].n;
            if (n > T)
                T = n;
        }
    }
    for (size_t i = 0; i < B * T; i++) {
        l->ids[i] = l->o.pad_id;
        l->labels[i] = -100;
        l->mask[i] = 0;
    }
    for (size_t i = 0; i < B; i++) {
        int32_t *ids = l->ids + i * T, *lab = l->labels + i * T, *pos = l->pos + i * T;
        if (!l->o.packing) {
            const ft_sample *s = &l->ds->samples[l->shard[first + i]];
            memcpy(ids, s->ids, (size_t)s->n * sizeof *ids);
            memcpy(lab, s->labels, (size_t)s->n * sizeof *lab);
            for (int p = 0; p < s->n; p++)
                l->mask[i * T + (size_t)p] = 1;
            continue;
        }
        size_t t = 0, row = first + i;
        for (size_t k = 0; k < l->row_len[row]; k++) {
            const ft_sample *s = &l->ds->samples[l->shard[l->row_start[row] + k]];
            memcpy(ids + t, s->ids, (size_t)s->n * sizeof *ids);
            memcpy(lab + t, s->labels, (size_t)s->n * sizeof *lab);
            lab[t] = -100; /* never predicted from the previous sample's last token */
            for (int p = 0; p < s->n; p++) {
                pos[t + (size_t)p] = p;
                l->mask[i * T + t + (size_t)p] = 1;
            }
            t += (size_t)s->n;
        }
        for (int32_t p = 0; t < T; t++, p++)
            pos[t] = p;
    }
    b->B = (int)B;
    b->T = (int)T;
    b->input_ids = l->ids;
    b->labels = l->labels;
    b->position_ids = l->o.packing ? l->pos : NULL;
    b->attention_mask = l->mask;
    return 0;
}

static void put_row(FILE *f, const char *key, const int32_t *v, int T, bool last)
{
    fprintf(f, "\"%s\": [", key);
    for (int t = 0; t < T; t++)
        fprintf(f, t ? ", %d" : "%d", (int)v[t]);
    fputs(last ? "]" : "], ", f);
}

int ft_loader_dump(ft_loader *l, int epoch, FILE *out, ft_err *err)
{
    int nb = ft_loader_n_batches(l, epoch);
    for (int i = 0; i < nb; i++) {
        ft_batch b;
        if (ft_loader_batch(l, epoch, i, &b, err))
            return -1;
        for (int r = 0; r < b.B; r++) {
            size_t o = (size_t)r * (size_t)b.T;
            fputc('{', out);
            put_row(out, "input_ids", b.input_ids + o, b.T, false);
            put_row(out, "labels", b.labels + o, b.T, !b.position_ids);
            if (b.position_ids)
                put_row(out, "position_ids", b.position_ids + o, b.T, true);
            fputs("}\n", out);
        }
    }
    if (fflush(out) || ferror(out))
        return ft_fail(err, "loader: write error while dumping epoch %d", epoch);
    return 0;
}
