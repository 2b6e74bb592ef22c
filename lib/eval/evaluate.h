/* eval/: evaluation.
 *
 * Owns: loss and perplexity over a data set, generation metrics (evaluate.h, rouge.h),
 * the prompt / reference records they score (eval_records.h) and an evaluation's
 * progress as people see it (eval_progress.h).
 * May call: core, data, model.
 * (This is the folder's main header.) */

/* Evaluation of a model on a data set: the loss over the counted tokens, and generation
 * metrics (ROUGE-L, exact match) on prompt / reference records. ft-eval is the tool. */
#ifndef FT_EVALUATE_H
#define FT_EVALUATE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "data/data.h"
#include "eval/eval_records.h"
#include "model/generate.h"
#include "model/model.h"

typedef struct ft_eval_loss {
    double loss_sum; /* summed token cross-entropy */
    long tokens;     /* counted tokens */
    size_t samples;
    double loss;       /* loss_sum / tokens: the mean over every counted token */
    double perplexity; /* exp(loss) */
    /* A MoE model with output_router_logits (has_aux): transformers' loss adds
     * router_aux_loss_coef (aux_coef) times its aux_loss, the router's load-balancing
     * loss, which is a batch's (not a sum over tokens). aux_sum sums each batch's
     * (ft_model_aux_balance) times its samples; aux_loss = aux_sum / samples: the mean
     * over the batches weighted by their samples, as the HF Trainer's evaluation averages
     * its per-batch losses (each repeated batch-size times). loss_with_aux = loss +
     * aux_coef aux_loss: transformers' model(...).loss when the set is one batch, and its
     * Trainer's eval_loss whenever every sample counts as many tokens (the cross-entropy
     * here is the token mean of the whole set, the Trainer's the samples' mean of each
     * batch's token mean). batches counts the batches. */
    bool has_aux;
    double aux_coef, aux_sum, aux_loss, loss_with_aux;
    long batches;
} ft_eval_loss;

/* Progress of a run below: update(ctx, done, total) after each batch (the loss: samples
 * done of ds->n) or each generated sample (of recs->n). A NULL ft_eval_progress, or a NULL
 * update, reports nothing. eval_progress.h turns the reports into what people see. */
typedef struct ft_eval_progress {
    void (*update)(void *ctx, size_t done, size_t total);
    void *ctx;
} ft_eval_progress;

/* Forward passes (no backward) over ds in file order, batch_size samples a batch,
 * right-padded with pad_id (labels -100). The loss is the mean over all counted tokens of
 * the whole set, which is transformers' loss when the whole set is one batch. An empty
 * ds is an error. Prints nothing; progress goes to progress when not NULL. */
int ft_eval_loss_run(ft_model *m, const ft_dataset *ds, int batch_size, int32_t pad_id,
                     const ft_eval_progress *progress, ft_eval_loss *r, ft_err *err);
/* The means of r's sums (loss, perplexity, aux_loss, loss_with_aux; NaN without a token or
 * a sample) and m's has_aux and aux_coef: after ft_eval_loss_run, or after summing the
 * sums of several (ranks). */
void ft_eval_loss_finish(const ft_model *m, ft_eval_loss *r);

typedef struct ft_eval_gen {
    size_t generated;   /* samples generated for */
    double rouge_l;     /* mean ROUGE-L F1 over them */
    double exact_match; /* fraction with prediction == reference after strip */
    long new_tokens;    /* generated ids in all (EOS included) */
} ft_eval_gen;

/* Greedy generation from each record's prompt (see generate.h), the prediction decoded
 * with tok (skipping special tokens, the stopping EOS dropped), scored against the
 * reference. When predictions is not NULL, one JSON object a line is written to it:
 * {"line", "prompt", "reference", "prediction", "rougeL", "exact_match", "generated_ids"}
 * (a non-finite number as null, so every line parses). Errors name the record's line.
 * Prints nothing; progress goes to progress when not NULL. */
int ft_eval_generate_run(ft_model *m, const ft_tokenizer *tok, const ft_eval_records *recs,
                         const ft_gen_options *o, FILE *predictions,
                         const ft_eval_progress *progress, ft_eval_gen *r, ft_err *err);

#endif
