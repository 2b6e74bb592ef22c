/* Loss and generation metrics over a data set (see evaluate.h).
 *
 * Loss: the loader batches the samples in file order (no shuffle, no packing, one rank);
 * each forward returns the summed token losses and the counted tokens of its batch, and
 * the result is sum(loss_sum) / sum(tokens) over all batches. That is the mean over every
 * counted token of the set, independent of the batch size (up to float summation order),
 * and equal to what transformers returns for a single batch holding the whole set. */
#include "eval/evaluate.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "eval/rouge.h"

static void report(const ft_eval_progress *p, size_t done, size_t total)
{
    if (p && p->update)
        p->update(p->ctx, done, total);
}

/* A JSON number; null for a non-finite value, which JSON cannot hold (json_real refuses
 * it, which would fail the whole line). */
static json_t *json_number(double x) { return isfinite(x) ? json_real(x) : json_null(); }

void ft_eval_loss_finish(const ft_model *m, ft_eval_loss *r)
{
    const ft_model_config *c = ft_model_cfg(m);
    r->loss = r->tokens ? r->loss_sum / (double)r->tokens : NAN;
    r->perplexity = exp(r->loss);
    r->has_aux = c->num_experts > 0 && c->output_router_logits;
    r->aux_coef = c->router_aux_loss_coef;
    r->aux_loss = r->samples ? r->aux_sum / (double)r->samples : NAN;
    r->loss_with_aux = r->loss + r->aux_coef * r->aux_loss;
}

int ft_eval_loss_run(ft_model *m, const ft_dataset *ds, int batch_size, int32_t pad_id,
                     const ft_eval_progress *progress, ft_eval_loss *r, ft_err *err)
{
    memset(r, 0, sizeof *r);
    if (ds->n == 0)
        return ft_fail(err, "no samples to evaluate (every record was skipped or dropped)");
    ft_loader_options lo = {.batch_size = batch_size, .seq_len = 0, .packing = false,
                            .shuffle = false, .seed = 0, .rank = 0, .world = 1,
                            .pad_id = pad_id};
    ft_loader *l;
    if (ft_loader_new(&l, ds, &lo, err))
        return -1;
    int nb = ft_loader_n_batches(l, 0), rc = 0;
    for (int i = 0; i < nb; i++) {
        ft_batch b;
        double sum;
        long n;
        if (ft_loader_batch(l, 0, i, &b, err) || ft_model_forward(m, &b, &sum, &n, err)) {
            rc = ft_fail_prefix(err, "batch %d of %d", i + 1, nb);
            break;
        }
        r->loss_sum += sum;
        r->tokens += n;
        r->aux_sum += ft_model_aux_balance(m) * (double)b.B; /* (weighted as the Trainer) */
        r->batches++;
        r->samples += (size_t)b.B;
        report(progress, r->samples, ds->n);
    }
    ft_loader_free(l);
    if (rc)
        return -1;
    if (r->tokens == 0)
        return ft_fail(err, "no counted tokens to evaluate");
    ft_eval_loss_finish(m, r);
    return 0;
}

/* One predictions line; -1 on a write or out-of-memory failure. */
static int write_prediction(FILE *f, const ft_eval_record *rec, const char *pred,
                            double rouge, bool exact, const ft_ids *ids)
{
    json_t *o = json_object(), *a = json_array();
    int rc = o && a ? 0 : -1;
    for (size_t i = 0; rc == 0 && i < ids->n; i++)
        rc = json_array_append_new(a, json_integer(ids->data[i]));
    if (rc == 0)
        rc = json_object_set_new(o, "line", json_integer(rec->line)) ||
             json_object_set_new(o, "prompt", json_string(rec->prompt)) ||
             json_object_set_new(o, "reference", json_string(rec->reference)) ||
             json_object_set_new(o, "prediction", json_string(pred)) ||
             json_object_set_new(o, "rougeL", json_number(rouge)) ||
             json_object_set_new(o, "exact_match", json_boolean(exact)) ||
             json_object_set(o, "generated_ids", a);
    char *s = rc == 0 ? json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII) : NULL;
    if (!s || fprintf(f, "%s\n", s) < 0)
        rc = -1;
    free(s);
    json_decref(a);
    json_decref(o);
    return rc;
}

int ft_eval_generate_run(ft_model *m, const ft_tokenizer *tok, const ft_eval_records *recs,
                         const ft_gen_options *o, FILE *predictions,
                         const ft_eval_progress *progress, ft_eval_gen *r, ft_err *err)
{
    memset(r, 0, sizeof *r);
    double rouge_sum = 0;
    long exact = 0;
    for (size_t i = 0; i < recs->n; i++) {
        const ft_eval_record *rec = &recs->r[i];
        ft_ids ids = {0};
        bool eos;
        char *text = NULL;
        size_t len;
        double f1 = 0;
        int rc = ft_generate_greedy(m, rec->ids, rec->n_ids, o, &ids, &eos, err);
        /* The stopping EOS is not part of the prediction's text. */
        size_t n_text = eos ? ids.n - 1 : ids.n;
        if (rc == 0)
            rc = ft_tokenizer_decode(tok, ids.data, n_text, true, &text, &len, err);
        if (rc == 0)
            rc = ft_rouge_l(rec->reference, text, &f1, err);
        bool em = rc == 0 && ft_exact_match(rec->reference, text);
        if (rc == 0 && predictions && write_prediction(predictions, rec, text, f1, em, &ids))
            rc = ft_fail(err, "writing the predictions failed");
        if (rc == 0)
            report(progress, i + 1, recs->n);
        r->new_tokens += (long)ids.n;
        free(text);
        ft_ids_free(&ids);
        if (rc)
            return ft_fail_prefix(err, "line %ld", rec->line);
        rouge_sum += f1;
        exact += em;
    }
    r->generated = recs->n;
    if (recs->n) {
        r->rouge_l = rouge_sum / (double)recs->n;
        r->exact_match = (double)exact / (double)recs->n;
    }
    return 0;
}
