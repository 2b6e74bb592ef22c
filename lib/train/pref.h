/* Preference objectives: DPO (TRL 1.16's DPOTrainer) on batches of pairs (data/pref_data.h:
 * 2P rows, the P chosen sequences then the P rejected ones).
 *
 * A sequence's log-probability is the sum of log p over its counted labels (the
 * completion: labels -100 on the prompt and the padding), from ft_model_forward_rows.
 * For pair i, with pc, pr the policy's and rc, rr the reference's log-probabilities of
 * chosen and rejected, and d = (pc - rc) - (pr - rr):
 *   sigmoid  loss = -log sigmoid(beta d)
 *   robust   loss = (-(1 - e) log sigmoid(beta d) + e log sigmoid(-beta d)) / (1 - 2e),
 *            e = label_smoothing (the probability the pair's labels are flipped)
 *   ipo      loss = (d' - 1 / (2 beta))^2, d' = (pc - rc) / nc - (pr - rr) / nr with nc,
 *            nr the completion tokens of each (at least 1)
 * The step's loss is the mean over the batch's pairs (over every rank's, in a distributed
 * step). Metrics (means over pairs, as TRL logs them): rewards/chosen = beta (pc - rc),
 * rewards/rejected = beta (pr - rr), rewards/accuracies = [chosen reward > rejected
 * reward], rewards/margins = their difference, logps/chosen = pc, logps/rejected = pr.
 *
 * The reference, as TRL's: with LoRA (QLoRA) on a fresh adapter the policy's own base,
 * its adapter switched off for one forward (no second copy of the weights; TRL given a
 * peft_config); with LoRA from an adapter (tuning.lora.init_adapter) that adapter as it
 * was at the start (TRL's frozen "ref" copy of a PeftModel's adapter): the LoRA weights
 * are kept (ft_pref_objective_keep_adapter, adapter-sized; in the trainer by its engine,
 * each rank what its forward reads: the whole adapter, or its zero3 / fsdp shard, or its
 * pipeline stage's part) and put in place of the policy's for the reference forward;
 * with a fresh adapter that trains the embedding or the head in full (modules_to_save,
 * tokens added) the adapter is switched off as above, and those modules compute with
 * their starting values, kept the same way (a fresh adapter's copies are the original
 * modules, which PEFT's ModulesToSaveWrapper uses with the adapter disabled;
 * ref_lora_off; the trainer's engine keeps only the embedding's and the head's units;
 * ft-eval, whose adapter is read from disk, keeps the base's or the adapter's saved
 * originals, ft_pref_objective_keep_originals); in full fine-tuning a frozen copy of
 * the base model loaded beside the policy (ref; TRL
 * loads the same; under model_parallel each stage keeps its own part of the base through
 * the engine instead, use_ref). Either way the reference forward keeps no activation past
 * itself: the policy's forward reuses the same buffers. */
#ifndef FT_PREF_H
#define FT_PREF_H

#include <stdbool.h>

#include "model/model.h"
#include "train/train_step.h"

/* FT_PREF_ORPO: ORPO (TRL's experimental ORPOTrainer), reference-free, on batches
 * prepared ORPO's way (pref_data.h FT_PREF_DATA_ORPO). With the completion's mean log p
 * per token, lc and lr (the prompt's tokens not counted), the log odds
 * o = (lc - lr) - (log(1 - e^lc) - log(1 - e^lr)) and NLL the chosen sequences' mean token
 * loss over the micro-batch, prompt included (TRL's chosen_nll_loss):
 *   loss = NLL - beta mean_i log sigmoid(o_i)    (beta: TRL's ORPO beta, the paper's lambda)
 * per micro-batch, averaged over the micro-batches of a step (as the HF Trainer divides a
 * loss by the accumulation steps and DDP averages over ranks). Metrics as TRL's:
 * rewards/chosen = beta lc, rewards/rejected = beta lr, rewards/accuracies,
 * rewards/margins, logps/chosen = lc, logps/rejected = lr, nll_loss, log_odds_ratio =
 * log sigmoid(o), log_odds_chosen = o. */
typedef enum ft_pref_loss {
    FT_PREF_SIGMOID = 0,
    FT_PREF_IPO,
    FT_PREF_ROBUST,
    FT_PREF_ORPO
} ft_pref_loss;

typedef struct ft_pref_options {
    ft_pref_loss loss;
    double beta;
    double label_smoothing; /* robust only (0 elsewhere) */
} ft_pref_options;

/* Sums over pairs (divide by pairs for the means above). */
enum {
    FT_PREF_LOSS = 0,
    FT_PREF_REWARD_CHOSEN,
    FT_PREF_REWARD_REJECTED,
    FT_PREF_ACCURACY,
    FT_PREF_MARGIN,
    FT_PREF_LOGP_CHOSEN,
    FT_PREF_LOGP_REJECTED,
    FT_PREF_PAIRS,
    FT_PREF_NLL,             /* ORPO: nll_loss (weighted by the micro-batch's pairs) */
    FT_PREF_LOG_ODDS_RATIO,  /* ORPO: log_odds_ratio */
    FT_PREF_LOG_ODDS_CHOSEN, /* ORPO: log_odds_chosen */
    FT_PREF_NSUM
};
/* The metric names as TRL logs them ("loss", "rewards/chosen", ...; [FT_PREF_PAIRS] is
 * "pairs"). */
extern const char *const ft_pref_metric_names[FT_PREF_NSUM];

/* Refuses what TRL would not compute (beta <= 0, a label_smoothing outside [0, 0.5), or
 * label_smoothing with a loss that does not use it). */
int ft_pref_check(const ft_pref_options *o, ft_err *err);

/* The loss of P pairs from their log-probabilities (policy pc, pr; reference rc, rr;
 * completion tokens nc, nr for ipo), in double. Returns the summed loss; gc[i], gr[i]
 * (NULL: not wanted) get d loss_i / d pc_i and d loss_i / d pr_i; sums (NULL: not
 * wanted) accumulates the metric sums. */
double ft_dpo_loss(const ft_pref_options *o, int P, const double *pc, const double *pr,
                   const double *rc, const double *rr, const long *nc, const long *nr,
                   double *gc, double *gr, double *sums);

/* The objective for ft_train_step / ft_engine_step_objective: counts pairs, runs the
 * reference forward, the policy's forward and the backward of the mean pair loss, and
 * accumulates the metric sums of every micro-batch into sums (reset them between steps).
 * ref: the frozen reference model, or NULL for the policy with its adapter off. */
typedef struct ft_pref_objective {
    ft_pref_options o;
    ft_model *ref;
    double sums[FT_PREF_NSUM];
    double *buf;  /* scratch: [6 x rows] */
    float *scale; /* [2 x rows] (ORPO: and the prompt parts') */
    long *ntok;   /* [2 x rows] (ORPO: and the prompt parts') */
    int32_t *labels, *split; /* ORPO: the batch's labels with the prompts', [rows x T];
                              * [rows] */
    size_t label_cap;
    double orpo_tok; /* ORPO: the chosen rows' counted tokens of the last forward */
    size_t cap;
    /* keep_adapter: the reference's LoRA weights and a scratch for the policy's, in the
     * compute dtype on the model's device (bytes each) */
    void *ref_lora, *own_lora;
    size_t lora_bytes;
    ft_model *lora_model;
    bool ref_free; /* no reference: its log-probabilities are 0 (ft-eval without one) */
    /* the kept values (keep_adapter or use_ref) are a fresh adapter's modules trained in
     * full: the reference forward also switches the LoRA pairs off (ft_model_set_lora) */
    bool ref_lora_off;
    /* or the reference adapter kept elsewhere (the trainer's engine under every
     * dist.strategy, dist_engine.h ft_engine_keep_reference): use_ref(ctx, true) puts
     * it in place of the policy's LoRA weights, (false) puts theirs back */
    int (*use_ref)(void *ctx, bool on, ft_err *err);
    void *use_ref_ctx;
    /* dist.strategy model_parallel: a training micro-batch's forwards and backward in
     * GPipe chunks of its rows as lib/dist/dist_engine.c's gpipe splits them (chunks > 1,
     * each in its own activation slot; the loss needs every row's log-probability, so
     * every chunk's forward runs before the first backward); no_loss: this rank is a
     * stage without the head, which computes no log-probability: it runs the same
     * forwards and backward (sending and receiving the residual stream) but adds nothing
     * to the loss or the metric sums. */
    int chunks;
    bool no_loss;
} ft_pref_objective;

void ft_pref_objective_init(ft_pref_objective *p, const ft_pref_options *o, ft_model *ref);
void ft_pref_objective_free(ft_pref_objective *p);
/* The reference is m's LoRA weights as they are now (a LoRA model whose whole trainable
 * buffer is bound: one process, as ft-eval and the harness run it; the trainer keeps them
 * through its engine under every dist.strategy, use_ref above). */
int ft_pref_objective_keep_adapter(ft_pref_objective *p, ft_model *m, ft_err *err);
ft_objective ft_pref_objective_of(ft_pref_objective *p);

/* The reference of an adapter read from disk with the adapter off, as PEFT's
 * disable_adapter() computes it, when the adapter trains the embedding or the head in
 * full (modules_to_save; tokens added): the pairs off (ref_lora_off) and those modules at
 * their original values (PEFT's original_module), kept as keep_adapter keeps them. Called
 * on m loaded in LoRA mode with the adapter's settings but before the adapter is read
 * (ft_model_load, not yet ft_model_load_adapter): the modules then hold the base's values,
 * the checkpoint's rows and, for a grown vocabulary, their mean in the new rows (the
 * resized base as ftkit makes it, and as PEFT reloads an adapter that does not hold the
 * originals onto a base resized that way); where the adapter holds a module's
 * <module>.original_module.weight (PEFT's save_embedding_layers after a resize writes it,
 * and its loading puts it back in the wrapper) that is read into it first. */
int ft_pref_objective_keep_originals(ft_pref_objective *p, ft_model *m, const char *adapter_dir,
                                     ft_err *err);

/* One evaluation pass's figures for pairs in batch b (no backward): the metric sums of
 * b's pairs added to sums. m is put in evaluation mode by the caller. */
int ft_pref_eval_batch(ft_pref_objective *p, ft_model *m, const ft_batch *b, double *sums,
                       ft_err *err);

#endif
