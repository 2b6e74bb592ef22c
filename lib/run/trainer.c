/* The training loop (see trainer.h). */
#include "run/trainer.h"

#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "memory/auto_batch.h"
#include "train/checkpoint.h"
#include "data/data_setup.h"
#include "dist/dist_engine.h"
#include "eval/evaluate.h"
#include "core/fsutil.h"
#include "device/gpu_monitor.h"
#include "memory/memplan.h"
#include "model/merge.h"
#include "model/model.h"
#include "formats/model_path.h"
#include "memory/oom_advice.h"
#include "train/optim.h"
#include "device/run_device.h"
#include "train/schedule.h"
#include "formats/tb_writer.h"
#include "run/run_internal.h"
#include "train/train_step.h"
#include "train/pref.h"

/* Set by SIGINT/SIGTERM; the loop saves a checkpoint and stops at the next step
 * boundary. A signal handler can only reach static storage: this is the one piece of
 * process-wide state, and nothing but the handler writes it. */
static volatile sig_atomic_t stop_requested;

static void on_signal(int sig)
{
    (void)sig;
    stop_requested = 1;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* A micro-batch copied out of the loader (whose arrays live until its next call). */
typedef struct owned_batch {
    ft_batch b;
    int32_t *ids, *labels, *pos, *mask;
    size_t cap;
} owned_batch;

static int own(owned_batch *o, const ft_batch *b, ft_err *err)
{
    size_t n = (size_t)b->B * b->T;
    if (n > o->cap || !o->mask) {
        free(o->ids);
        free(o->labels);
        free(o->pos);
        free(o->mask);
        o->ids = malloc(n * sizeof(int32_t));
        o->labels = malloc(n * sizeof(int32_t));
        o->pos = malloc(n * sizeof(int32_t));
        o->mask = malloc(n * sizeof(int32_t));
        o->cap = n;
        if (!o->ids || !o->labels || !o->pos || !o->mask)
            return ft_fail(err, "out of memory");
    }
    memcpy(o->ids, b->input_ids, n * sizeof(int32_t));
    memcpy(o->labels, b->labels ? b->labels : b->input_ids, n * sizeof(int32_t));
    if (b->position_ids)
        memcpy(o->pos, b->position_ids, n * sizeof(int32_t));
    if (b->attention_mask)
        memcpy(o->mask, b->attention_mask, n * sizeof(int32_t));
    o->b = (ft_batch){b->B, b->T, o->ids, o->labels, b->position_ids ? o->pos : NULL,
                      b->attention_mask ? o->mask : NULL};
    return 0;
}

typedef struct trainer {
    const ft_run_config *cfg;
    FILE *log;
    FILE *quiet;         /* ranks other than 0 log here (/dev/null) */
    const char *out_dir;
    char model_dir[4096];
    ft_comm *comm, *own_comm; /* own_comm: made here when the caller gave none */
    int rank, world;
    ft_run_device_choice place; /* train.device resolved */
    int gpu;             /* the GPU this rank took; -1 on the CPU */
    size_t mem_limit;    /* FT_MEM_LIMIT: the model allocator's limit (0: none) */
    ft_gpu_monitor *gpu_mon; /* NVML on this rank's GPU; NULL on the CPU or without NVML */
    ft_engine *eng;
    ft_model *m;         /* the engine's */
    ft_run_data data;
    ft_loader *train_loader;
    /* train.objective dpo: batches of pairs (in place of train_loader), the objective
     * (its reference: the frozen copy ref in full fine-tuning, else the policy with its
     * adapter off) and the metric sums of the logging window */
    bool pref, orpo; /* orpo: the preference objective is ORPO (no reference model) */
    /* LoRA from a fresh adapter that trains the embedding or the head in full
     * (modules_to_save, or tokens added): DPO's reference keeps their starting values */
    bool fresh_saved;
    ft_pref_loader *pref_loader, *pref_eval_loader; /* (eval: the whole set, in order) */
    ft_pref_objective pref_obj;
    ft_model *ref;
    double window_pref[FT_PREF_NSUM];
    int eval_batch_size;
    ft_tb_writer *tb;
    ft_lr_schedule sched;
    bool measuring;      /* ft_trainer_options.measure: one step, no outputs */
    int batch_size;      /* rows per micro-batch */
    ft_train_state state;
    long last_eval_step; /* -1: none yet */
    bool tty;            /* log is a terminal: keep a progress bar on its last line */
    int accum, n_batches;
    owned_batch *micro;  /* [accum] */
    ft_batch *mb;        /* [accum]: the micro-batches of a step */
    ft_eval_records gen_records; /* predict_with_generate: prompts and references */
    ft_gen_options gen;
    FILE *metrics;       /* metrics.jsonl (rank 0) */
    double t_start, last_loss, last_eval_loss, last_rate, comm_bytes;
    long steps_done, tokens_done;
    bool have_eval;
    bool fresh;          /* a new run (not resumed): its run dir held none of our outputs */
    /* the logging window: the finite step losses since the last log line (their mean is
     * the logged train loss, as the HF Trainer logs it) */
    double window_loss_sum;
    long window_loss_n;
} trainer;

/* A JSON number, or null when v is not finite (JSON has no NaN or Infinity). */
static void json_number(FILE *f, const char *fmt, double v)
{
    if (isfinite(v))
        fprintf(f, fmt, v);
    else
        fputs("null", f);
}

static void begin_line(trainer *t);

/* dist.strategy (and dist.zero_stage for "zero") as the engine's options. */
static int dist_options(const ft_run_config *c, int world, ft_dist_options *o, ft_err *err)
{
    memset(o, 0, sizeof *o);
    switch (c->dist.strategy) {
    case FT_CFG_STRATEGY_AUTO:
        o->strategy = world > 1 ? FT_STRATEGY_DDP : FT_STRATEGY_NONE;
        break;
    case FT_CFG_STRATEGY_NONE: o->strategy = FT_STRATEGY_NONE; break;
    case FT_CFG_STRATEGY_DDP: o->strategy = FT_STRATEGY_DDP; break;
    case FT_CFG_STRATEGY_FSDP: o->strategy = FT_STRATEGY_FSDP; break;
    case FT_CFG_STRATEGY_MODEL_PARALLEL: o->strategy = FT_STRATEGY_PIPELINE; break;
    case FT_CFG_STRATEGY_ZERO:
    case FT_CFG_STRATEGY_ZERO1:
    case FT_CFG_STRATEGY_ZERO2:
    case FT_CFG_STRATEGY_ZERO3: {
        static const ft_strategy stages[] = {FT_STRATEGY_DDP, FT_STRATEGY_ZERO1, FT_STRATEGY_ZERO2,
                                             FT_STRATEGY_ZERO3};
        int stage = ft_run_config_zero_stage(&c->dist);
        if (stage < 0 || stage > 3)
            return ft_fail(err, "config: dist.zero_stage = %d: stages are 0-3", stage);
        o->strategy = stages[stage];
        break;
    }
    }
    o->offload_optimizer = c->dist.offload_optimizer == FT_CFG_OFFLOAD_CPU;
    o->offload_params = c->dist.offload_params == FT_CFG_OFFLOAD_CPU;
    o->bucket_bytes = (size_t)c->train.ddp_bucket_cap_mb << 20;
    o->overlap_comm = c->dist.overlap_comm;
    o->prefetch = c->dist.prefetch;
    o->pipeline_chunks = (int)c->dist.pipeline_micro_batches;
    return 0;
}

static int setup_model(trainer *t, const ft_dist_options *dopt, ft_err *err)
{
    const ft_tuning_section *tu = &t->cfg->tuning;
    const ft_train_section *tr = &t->cfg->train;
    ft_model_options mo = {.grad_ckpt = tr->gradient_checkpointing,
                           .seed = (uint64_t)tr->seed,
                           .device = t->place.device,
                           .dtype = t->place.dtype,
                           .mem_limit = t->mem_limit,
                           .loss_chunk_rows = ft_memplan_loss_chunk(tr)};
    if (tu->mode == FT_TUNING_FULL) {
        mo.mode = FT_TRAIN_FULL;
    } else {
        /* qlora: LoRA on a base quantized on load (a checkpoint quantized already, by
         * ft-quantize or bitsandbytes, is read as it is in either LoRA mode) */
        if (tu->mode == FT_TUNING_QLORA) {
            mo.quant = ft_quant_options_of(tu);
            if (mo.quant.blocksize & (mo.quant.blocksize - 1))
                return ft_fail(err, "config: key 'tuning.quant.blocksize': %d is not a power "
                                    "of two (32, 64, ..., 4096)",
                               mo.quant.blocksize);
            mo.quant_skip = tu->quant.skip_modules;
        }
        mo.mode = FT_TRAIN_LORA;
        mo.lora = (ft_lora_config){.r = (int)tu->lora.r,
                                   .alpha = (float)tu->lora.alpha,
                                   .dropout = (float)tu->lora.dropout,
                                   .rslora = tu->lora.rslora,
                                   .dora = tu->lora.use_dora};
        if (ft_lora_targets_parse(tu->lora.target_modules, &mo.lora.targets, err))
            return ft_fail_prefix(err, "config: key 'tuning.lora.target_modules'");
        if (ft_lora_target_parameters_parse(tu->lora.target_parameters, &mo.lora, err))
            return ft_fail_prefix(err, "config: key 'tuning.lora.target_parameters'");
        if (ft_lora_patterns_parse(tu->lora.rank_pattern, true, "tuning.lora.rank_pattern",
                                   &mo.lora.rank_pattern, err) ||
            ft_lora_patterns_parse(tu->lora.alpha_pattern, false, "tuning.lora.alpha_pattern",
                                   &mo.lora.alpha_pattern, err))
            return ft_fail_prefix(err, "config");
        if (ft_lora_modules_to_save_parse(tu->lora.modules_to_save, &mo.lora.modules_to_save,
                                          err))
            return ft_fail_prefix(err, "config: key 'tuning.lora.modules_to_save'");
        mo.lora.weight_tying_set = tu->lora.ensure_weight_tying != FT_CFG_TYING_AUTO;
        mo.lora.ensure_weight_tying = tu->lora.ensure_weight_tying == FT_CFG_TYING_TRUE;
    }
    const char *adapter =
        mo.mode == FT_TRAIN_LORA && tu->lora.init_adapter[0] ? tu->lora.init_adapter : NULL;
    if (run_tokens_setup(t->cfg, &t->data, t->model_dir, adapter, &mo, t->log, err))
        return -1;
    t->fresh_saved = mo.mode == FT_TRAIN_LORA && !adapter && mo.lora.modules_to_save;
    ft_adamw_hparams hp = {.lr = (float)tr->learning_rate,
                           .beta1 = (float)tr->adam_beta1,
                           .beta2 = (float)tr->adam_beta2,
                           .eps = (float)tr->adam_epsilon,
                           .weight_decay = (float)tr->weight_decay};
    if (ft_engine_new(&t->eng, t->comm, t->model_dir, &mo, adapter, hp, dopt, err))
        return ft_fail_prefix(err, adapter ? "model.name '%s' with tuning.lora.init_adapter"
                                           : "model.name '%s'",
                              t->model_dir);
    t->m = ft_engine_model(t->eng);
    /* the final model of a full fine-tuning holds the trained weights only: of a
     * multimodal gemma3 it would lack the vision tower transformers needs to load it */
    if (mo.mode == FT_TRAIN_FULL && ft_model_cfg(t->m)->multimodal)
        return ft_fail(err, "model.name '%s': tuning.mode full on a multimodal gemma3 "
                       "checkpoint is not supported (its final model would lack the vision "
                       "tower): use lora or qlora and ft-merge, which carries it through",
                       t->model_dir);
    if (t->pref && ft_model_cfg(t->m)->num_experts > 0)
        return ft_fail(err, "model.name '%s': train.objective %s on a mixture-of-experts "
                       "model is not supported yet (TRL adds the router's load-balancing "
                       "loss to the preference loss; use sft)",
                       t->model_dir, t->orpo ? "orpo" : "dpo");
    if (t->pref && !t->orpo && mo.mode == FT_TRAIN_FULL &&
        dopt->strategy != FT_STRATEGY_PIPELINE) {
        /* the DPO reference of a full fine-tuning: the base, frozen, beside the policy */
        ft_model_options ro = {.mode = FT_TRAIN_NONE,
                               .device = mo.device,
                               .dtype = mo.dtype,
                               .mem_limit = mo.mem_limit,
                               .loss_chunk_rows = mo.loss_chunk_rows,
                               .grow_vocab = mo.grow_vocab};
        if (ft_model_load(&t->ref, t->model_dir, &ro, err))
            return ft_fail_prefix(err, "the DPO reference model (model.name '%s')",
                                  t->model_dir);
        ft_model_set_training(t->ref, false);
    }
    return 0;
}

static int setup_schedule(trainer *t, ft_err *err)
{
    const ft_train_section *c = &t->cfg->train;
    long total = c->max_steps > 0 ? c->max_steps
                                   : (long)ceil(c->epochs * t->n_batches / (double)t->accum);
    if (total <= 0)
        return ft_fail(err, "config: train.epochs = %g over %d batches gives no optimizer step",
                       c->epochs, t->n_batches);
    int warmup = (int)c->warmup_steps;
    if (warmup == 0)
        warmup = (int)ceil(c->warmup_ratio * (double)total);
    static const ft_lr_kind kinds[] = {[FT_CFG_LR_CONSTANT] = FT_LR_CONSTANT,
                                       [FT_CFG_LR_LINEAR] = FT_LR_LINEAR,
                                       [FT_CFG_LR_COSINE] = FT_LR_COSINE};
    t->sched = (ft_lr_schedule){.kind = kinds[c->lr_scheduler],
                                .base_lr = c->learning_rate,
                                .warmup_steps = warmup,
                                .total_steps = (int)total};
    return 0;
}

static void stamp_of(const trainer *t, ft_ckpt_stamp *s)
{
    memset(s, 0, sizeof *s);
    snprintf(s->device, sizeof s->device, "%s", ft_device_name(t->place.device));
    snprintf(s->dtype, sizeof s->dtype, "%s", ft_dtype_name(t->place.dtype));
    snprintf(s->mode, sizeof s->mode, "%s", ft_tuning_mode_name(t->cfg->tuning.mode));
    snprintf(s->quant, sizeof s->quant, "%s", ft_quant_name(ft_model_quant(t->m).type));
    snprintf(s->strategy, sizeof s->strategy, "%s",
             ft_strategy_name(ft_engine_strategy(t->eng)));
    s->world_size = t->world;
}

/* The eval set's loss: ft-eval's loss run (forward only), without dropout. r->loss is the
 * cross-entropy (the token mean of the whole set); a MoE model with output_router_logits
 * also has aux_loss and loss_with_aux (evaluate.h): the HF Trainer's eval_loss adds the
 * load-balancing term of each eval batch, weighted by its samples. */
static int evaluate(trainer *t, ft_eval_loss *r, ft_err *err)
{
    ft_model_set_training(t->m, false);
    int rc = ft_eval_loss_run(t->m, &t->data.eval, t->eval_batch_size, t->data.pad_id, NULL, r,
                              err);
    ft_model_set_training(t->m, true);
    if (rc)
        return ft_fail_prefix(err, "evaluation");
    /* every rank evaluated the whole set in step (zero3 and the pipeline need all of them
     * in each forward; the load-balancing statistics of each batch are summed over the
     * ranks, which all ran that batch or, as pipeline stages, its layers); the
     * pipeline's loss is on its last stage */
    double v[3] = {r->loss, r->aux_loss, r->loss_with_aux};
    if (t->world > 1 &&
        ft_comm_broadcast(t->comm, v, 3, FT_COMM_F64, ft_engine_loss_rank(t->eng), err))
        return -1;
    r->loss = v[0], r->aux_loss = v[1], r->loss_with_aux = v[2];
    r->perplexity = exp(r->loss);
    return 0;
}

static int log_scalar(trainer *t, const char *tag, double v, ft_err *err)
{
    return t->tb ? ft_tb_scalar(t->tb, tag, t->state.global_step, v, err) : 0;
}

/* The end of the run's metric sums (pref.h): DPO's stop at the pairs, ORPO's go on. */
static int pref_metric_end(const trainer *t) { return t->orpo ? FT_PREF_NSUM : FT_PREF_PAIRS; }

/* DPO's evaluation: the loss and metrics over every held-out pair, without dropout (every
 * rank evaluates the whole set, as the token loss's evaluation does). */
static int run_eval_pref(trainer *t, ft_err *err)
{
    double sums[FT_PREF_NSUM] = {0};
    ft_model_set_training(t->m, false);
    int rc = 0, nb = ft_pref_loader_n_batches(t->pref_eval_loader, 0);
    for (int i = 0; i < nb && rc == 0; i++) {
        ft_batch b;
        rc = ft_pref_loader_batch(t->pref_eval_loader, 0, i, &b, err) ||
             ft_pref_eval_batch(&t->pref_obj, t->m, &b, sums, err);
    }
    ft_model_set_training(t->m, true);
    if (rc)
        return ft_fail_prefix(err, "evaluation");
    /* every rank evaluated the whole set in step; model_parallel's sums are on its last
     * stage */
    if (t->world > 1 && ft_comm_broadcast(t->comm, sums, FT_PREF_NSUM, FT_COMM_F64,
                                          ft_engine_loss_rank(t->eng), err))
        return -1;
    double v[FT_PREF_NSUM];
    for (int k = 0; k < FT_PREF_NSUM; k++)
        v[k] = sums[k] / sums[FT_PREF_PAIRS];
    begin_line(t);
    fprintf(t->log, "eval step %ld | loss %.4f | rewards/accuracies %.4f | rewards/margins %.4f | "
                    "%.0f pairs\n",
            t->state.global_step, v[FT_PREF_LOSS], v[FT_PREF_ACCURACY], v[FT_PREF_MARGIN],
            sums[FT_PREF_PAIRS]);
    t->last_eval_loss = v[FT_PREF_LOSS];
    t->have_eval = true;
    if (t->metrics) {
        fprintf(t->metrics, "{\"step\": %ld, \"eval_loss\": ", t->state.global_step);
        json_number(t->metrics, "%.8g", v[FT_PREF_LOSS]);
        for (int k = FT_PREF_REWARD_CHOSEN; k < pref_metric_end(t); k++) {
            if (k == FT_PREF_PAIRS)
                continue;
            fprintf(t->metrics, ", \"eval_%s\": ", ft_pref_metric_names[k]);
            json_number(t->metrics, "%.8g", v[k]);
        }
        fprintf(t->metrics, ", \"elapsed_s\": %.3f}\n", now() - t->t_start);
        fflush(t->metrics);
    }
    for (int k = 0; k < pref_metric_end(t); k++) {
        if (k == FT_PREF_PAIRS)
            continue;
        char tag[64];
        snprintf(tag, sizeof tag, "eval/%s", ft_pref_metric_names[k]);
        if (log_scalar(t, tag, v[k], err))
            return -1;
    }
    return t->tb ? ft_tb_flush(t->tb, err) : 0;
}

static int run_eval(trainer *t, ft_err *err)
{
    if (t->pref) {
        if (!t->data.pref_eval.n || t->last_eval_step == t->state.global_step)
            return 0;
        t->last_eval_step = t->state.global_step;
        return run_eval_pref(t, err);
    }
    if (!t->data.eval.n || t->last_eval_step == t->state.global_step)
        return 0;
    t->last_eval_step = t->state.global_step;
    ft_eval_loss r;
    if (evaluate(t, &r, err))
        return -1;
    /* the logged loss is the HF Trainer's eval_loss: with a MoE router's load-balancing
     * term when the model adds it to its loss; the perplexity is the cross-entropy's */
    double loss = r.has_aux ? r.loss_with_aux : r.loss;
    begin_line(t);
    fprintf(t->log, "eval step %ld | loss %.4f | perplexity %.3f | %ld tokens",
            t->state.global_step, loss, r.perplexity, r.tokens);
    if (r.has_aux)
        fprintf(t->log, " | aux_loss %.4f (cross-entropy %.4f)", r.aux_loss, r.loss);
    fputc('\n', t->log);
    t->last_eval_loss = loss;
    t->have_eval = true;
    if (t->metrics) {
        fprintf(t->metrics, "{\"step\": %ld, \"eval_loss\": ", t->state.global_step);
        json_number(t->metrics, "%.6g", loss);
        if (r.has_aux) {
            fputs(", \"eval_aux_loss\": ", t->metrics);
            json_number(t->metrics, "%.6g", r.aux_loss);
        }
        fprintf(t->metrics, ", \"elapsed_s\": %.3f}\n", now() - t->t_start);
        fflush(t->metrics);
    }
    if (log_scalar(t, "eval/loss", loss, err) ||
        log_scalar(t, "eval/perplexity", r.perplexity, err) ||
        (r.has_aux && log_scalar(t, "eval/aux_loss", r.aux_loss, err)))
        return -1;
    if (t->gen_records.n) {
        ft_eval_gen g;
        ft_model_set_training(t->m, false);
        int rc = ft_eval_generate_run(t->m, t->data.tok, &t->gen_records, &t->gen, NULL, NULL,
                                      &g, err);
        ft_model_set_training(t->m, true);
        if (rc)
            return ft_fail_prefix(err, "evaluation generation");
        fprintf(t->log, "eval step %ld | rougeL %.4f | exact_match %.4f | %zu generated\n",
                t->state.global_step, g.rouge_l, g.exact_match, g.generated);
        if (log_scalar(t, "eval/rougeL", g.rouge_l, err) ||
            log_scalar(t, "eval/exact_match", g.exact_match, err))
            return -1;
    }
    return t->tb ? ft_tb_flush(t->tb, err) : 0;
}

static int save_checkpoint(trainer *t, char *out, size_t out_len, ft_err *err)
{
    t->state.rng_counter = ft_model_rng_counter(t->m);
    int rc = ft_engine_save_checkpoint(t->eng, t->out_dir, &t->state, t->model_dir,
                                       (int)t->cfg->train.save_total_limit, out,
                                       out_len, err);
    if (rc == 0 && t->rank == 0)
        rc = run_tokens_save(t->cfg, t->model_dir, out, ft_model_cfg(t->m)->vocab_size, false,
                             err);
    if (rc == 0) {
        begin_line(t);
        fprintf(t->log, "saved %s\n", out);
    }
    return rc;
}

/* The train loader's batches: of samples, or of preference pairs. */
static int loader_n_batches(trainer *t, int epoch)
{
    return t->pref ? ft_pref_loader_n_batches(t->pref_loader, epoch)
                   : ft_loader_n_batches(t->train_loader, epoch);
}

static int loader_batch(trainer *t, int epoch, int index, ft_batch *b, ft_err *err)
{
    return t->pref ? ft_pref_loader_batch(t->pref_loader, epoch, index, b, err)
                   : ft_loader_batch(t->train_loader, epoch, index, b, err);
}

/* Gathers accum micro-batches, moving through epochs. */
static int next_micro_batches(trainer *t, ft_err *err)
{
    for (int i = 0; i < t->accum; i++) {
        /* with packing and shuffling, an epoch's batch count depends on the epoch */
        if (t->state.batch_in_epoch >= loader_n_batches(t, t->state.epoch)) {
            t->state.epoch++;
            t->state.batch_in_epoch = 0;
        }
        ft_batch b;
        if (loader_batch(t, t->state.epoch, t->state.batch_in_epoch++, &b, err) ||
            own(&t->micro[i], &b, err))
            return -1;
    }
    return 0;
}

/* On a terminal: "[#####-----] step 10/100 | loss 2.3456 | 1234 tok/s | eta 12s", redrawn
 * in place after every step. */
static void draw_progress(trainer *t, double loss, double tok_per_s, double eta)
{
    long step = t->state.global_step, total = t->sched.total_steps;
    char bar[21];
    int filled = (int)(20.0 * (double)step / (double)total);
    for (int i = 0; i < 20; i++)
        bar[i] = i < filled ? '#' : '-';
    bar[20] = '\0';
    fprintf(t->log, "\r\033[K[%s] step %ld/%ld | loss %.4f | %.0f tok/s | eta %.0fs", bar, step,
            total, loss, tok_per_s, eta);
    fflush(t->log);
}

/* Starts a full log line: on a terminal, clears the progress bar first. */
static void begin_line(trainer *t)
{
    if (t->tty)
        fputs("\r\033[K", t->log);
}

/* Per-rank figures of this rank: tokens/s, the peak bytes of each memory category of
 * the device (the process's memory on CPU ranks) and the peak of the host memory an
 * offloaded optimizer holds; its own loss of the last step; on a GPU, NVML's
 * utilization and the device memory in use (-1 when unknown). */
enum {
    RANK_RATE = 0,
    RANK_LOSS,
    RANK_HOST,
    RANK_GPU_UTIL,
    RANK_GPU_USED,
    RANK_QUANT, /* bytes of the quantized base this rank keeps (ft_engine_quant_bytes) */
    RANK_MEM,
    RANK_NVAL = RANK_MEM + FT_MEM_NCAT
};

static void rank_values(trainer *t, double rate, double *v)
{
    const ft_mem *mem = ft_engine_mem(t->eng), *host = ft_engine_host_mem(t->eng);
    v[RANK_RATE] = rate;
    v[RANK_LOSS] = ft_engine_rank_loss(t->eng);
    v[RANK_HOST] = (double)host->peak_total;
    v[RANK_QUANT] = (double)ft_engine_quant_bytes(t->eng);
    ft_gpu_monitor_sample(t->gpu_mon, &v[RANK_GPU_UTIL], &v[RANK_GPU_USED]);
    for (int c = 0; c < FT_MEM_NCAT; c++)
        v[RANK_MEM + c] = (double)mem->peak[c];
    /* DPO's frozen reference (full fine-tuning) is a model of its own beside the engine's:
     * loaded once and its buffers kept, so its peaks add to the rank's */
    for (int c = 0; t->ref && c < FT_MEM_NCAT; c++)
        v[RANK_MEM + c] += (double)ft_model_mem(t->ref)->peak[c];
}

/* Every rank's values on every rank: [world][RANK_NVAL] (collective). */
static int gather_rank_values(trainer *t, double rate, double *all, ft_err *err)
{
    memset(all, 0, (size_t)t->world * RANK_NVAL * sizeof *all);
    rank_values(t, rate, all + (size_t)t->rank * RANK_NVAL);
    return t->world > 1 ? ft_comm_allreduce(t->comm, all, (size_t)t->world * RANK_NVAL,
                                            FT_COMM_F64, FT_COMM_SUM, err)
                        : 0;
}

/* The fractional epoch, as the HF Trainer logs it: epochs done plus the part of the
 * current one consumed. */
static double epoch_progress(trainer *t)
{
    int n = loader_n_batches(t, t->state.epoch);
    return t->state.epoch + (n > 0 ? (double)t->state.batch_in_epoch / n : 0.0);
}

/* A log line, TensorBoard scalars and a metrics.jsonl row for the steps since the last
 * one: the mean of their finite losses (NAN when none was), and the last step's learning
 * rate and gradient norm (collective: the ranks' figures are gathered). */
static int log_step(trainer *t, const ft_step_stats *st, double tok_per_s, double elapsed,
                    long first_step, ft_err *err)
{
    long step = t->state.global_step, total = t->sched.total_steps;
    double loss = t->window_loss_n ? t->window_loss_sum / (double)t->window_loss_n : NAN;
    double epoch = epoch_progress(t);
    t->window_loss_sum = 0;
    t->window_loss_n = 0;
    double eta = (double)(total - step) * elapsed / (double)(step - first_step);
    /* tok_per_s is this rank's; the run's is the sum over data-parallel ranks */
    double *all = malloc((size_t)t->world * RANK_NVAL * sizeof *all);
    if (!all)
        return ft_fail(err, "out of memory");
    if (gather_rank_values(t, tok_per_s, all, err)) {
        free(all);
        return -1;
    }
    double global_rate = 0;
    for (int r = 0; r < ft_engine_data_world(t->eng); r++)
        global_rate += all[(size_t)r * RANK_NVAL + RANK_RATE];
    t->last_rate = global_rate;
    begin_line(t);
    fprintf(t->log, "step %ld/%ld | loss %.4f | lr %.3e | grad_norm %.4f | %.0f tok/s | eta %.0fs",
            step, total, loss, st->lr, st->grad_norm, global_rate, eta);
    if (t->state.skipped_steps)
        fprintf(t->log, " | %ld skipped", t->state.skipped_steps);
    fputc('\n', t->log);
    /* DPO: the window's means over its pairs, as TRL logs them */
    double pref[FT_PREF_NSUM];
    double pairs = t->window_pref[FT_PREF_PAIRS];
    for (int k = 0; k < FT_PREF_NSUM; k++)
        pref[k] = pairs > 0 ? t->window_pref[k] / pairs : NAN;
    memset(t->window_pref, 0, sizeof t->window_pref);
    if (t->pref)
        fprintf(t->log, "step %ld/%ld | rewards/chosen %.4f | rewards/rejected %.4f | "
                        "rewards/accuracies %.4f | rewards/margins %.4f | logps/chosen %.4f | "
                        "logps/rejected %.4f\n",
                step, total, pref[FT_PREF_REWARD_CHOSEN], pref[FT_PREF_REWARD_REJECTED],
                pref[FT_PREF_ACCURACY], pref[FT_PREF_MARGIN], pref[FT_PREF_LOGP_CHOSEN],
                pref[FT_PREF_LOGP_REJECTED]);
    if (t->orpo)
        fprintf(t->log, "step %ld/%ld | nll_loss %.4f | log_odds_ratio %.4f | log_odds_chosen "
                        "%.4f\n",
                step, total, pref[FT_PREF_NLL], pref[FT_PREF_LOG_ODDS_RATIO],
                pref[FT_PREF_LOG_ODDS_CHOSEN]);
    int rc = 0;
    for (int k = FT_PREF_REWARD_CHOSEN; t->pref && k < pref_metric_end(t) && rc == 0; k++) {
        if (k == FT_PREF_PAIRS)
            continue;
        char tag[64];
        snprintf(tag, sizeof tag, "train/%s", ft_pref_metric_names[k]);
        rc = log_scalar(t, tag, pref[k], err);
    }
    if (log_scalar(t, "train/loss", loss, err) || log_scalar(t, "train/epoch", epoch, err) ||
        log_scalar(t, "train/learning_rate", st->lr, err) ||
        log_scalar(t, "train/grad_norm", st->grad_norm, err) ||
        log_scalar(t, "train/tokens_per_second", global_rate, err))
        rc = -1;
    for (int c = 0; c < FT_MEM_NCAT && rc == 0; c++) {
        char tag[64];
        snprintf(tag, sizeof tag, "memory/%s_peak_bytes", ft_mem_cat_name((ft_mem_cat)c));
        rc = log_scalar(t, tag, all[(size_t)t->rank * RANK_NVAL + RANK_MEM + c], err);
    }
    /* GPU runs: how busy this rank's GPU was, and its memory as the device counts it */
    const double *mine = all + (size_t)t->rank * RANK_NVAL;
    if (rc == 0 && mine[RANK_GPU_UTIL] >= 0)
        rc = log_scalar(t, "gpu/utilization_percent", mine[RANK_GPU_UTIL], err);
    if (rc == 0 && mine[RANK_GPU_USED] >= 0)
        rc = log_scalar(t, "gpu/memory_used_bytes", mine[RANK_GPU_USED], err);
    /* per rank, in distributed runs */
    for (int r = 0; t->world > 1 && r < t->world && rc == 0; r++) {
        char tag[96];
        snprintf(tag, sizeof tag, "rank%d/tokens_per_second", r);
        rc = log_scalar(t, tag, all[(size_t)r * RANK_NVAL + RANK_RATE], err);
        double loss = all[(size_t)r * RANK_NVAL + RANK_LOSS];
        if (rc == 0 && !isnan(loss)) {
            snprintf(tag, sizeof tag, "rank%d/loss", r);
            rc = log_scalar(t, tag, loss, err);
        }
        for (int c = 0; c < FT_MEM_NCAT && rc == 0; c++) {
            snprintf(tag, sizeof tag, "rank%d/memory/%s_peak_bytes", r,
                     ft_mem_cat_name((ft_mem_cat)c));
            rc = log_scalar(t, tag, all[(size_t)r * RANK_NVAL + RANK_MEM + c], err);
        }
        if (rc == 0 && ft_engine_host_mem(t->eng)->peak_total) {
            snprintf(tag, sizeof tag, "rank%d/memory/host_offload_peak_bytes", r);
            rc = log_scalar(t, tag, all[(size_t)r * RANK_NVAL + RANK_HOST], err);
        }
        if (rc == 0 && all[(size_t)r * RANK_NVAL + RANK_GPU_UTIL] >= 0) {
            snprintf(tag, sizeof tag, "rank%d/gpu_utilization_percent", r);
            rc = log_scalar(t, tag, all[(size_t)r * RANK_NVAL + RANK_GPU_UTIL], err);
        }
    }
    if (t->world > 1 && rc == 0)
        rc = log_scalar(t, "dist/comm_bytes_per_step", ft_engine_step_comm_bytes(t->eng), err);
    if (t->world > 1 && rc == 0) {
        /* rank 0's last step: wall time, and the part of it blocked in communication */
        ft_comm_stats cs;
        double step_s = ft_engine_step_profile(t->eng, &cs);
        rc = log_scalar(t, "dist/step_seconds", step_s, err) ||
             log_scalar(t, "dist/comm_wait_seconds", cs.wait_s, err);
    }
    if (rc == 0 && t->state.skipped_steps)
        rc = log_scalar(t, "train/skipped_steps", (double)t->state.skipped_steps, err);
    free(all);
    if (rc == 0 && t->metrics) {
        FILE *f = t->metrics;
        fprintf(f, "{\"step\": %ld, \"epoch\": ", step);
        json_number(f, "%.6g", epoch);
        fputs(", \"loss\": ", f);
        json_number(f, "%.8g", loss);
        fputs(", \"learning_rate\": ", f);
        json_number(f, "%.6g", st->lr);
        fputs(", \"grad_norm\": ", f);
        json_number(f, "%.6g", st->grad_norm);
        fputs(", \"tokens_per_second\": ", f);
        json_number(f, "%.6g", global_rate);
        for (int k = FT_PREF_REWARD_CHOSEN; t->pref && k < pref_metric_end(t); k++) {
            if (k == FT_PREF_PAIRS)
                continue;
            fprintf(f, ", \"%s\": ", ft_pref_metric_names[k]);
            json_number(f, "%.8g", pref[k]);
        }
        fprintf(f, ", \"skipped_steps\": %ld, \"elapsed_s\": %.3f}\n", t->state.skipped_steps,
                now() - t->t_start);
        fflush(f);
    }
    return rc ? -1 : t->tb ? ft_tb_flush(t->tb, err) : 0;
}

/* run_summary.json (rank 0 writes; every rank takes part in the memory gather). */
static int write_summary(trainer *t, ft_err *err)
{
    double *all = malloc((size_t)t->world * RANK_NVAL * sizeof *all);
    if (!all)
        return ft_fail(err, "out of memory");
    int rc = gather_rank_values(t, 0, all, err);
    if (rc || t->rank != 0) {
        free(all);
        return rc;
    }
    double wall = now() - t->t_start;
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) {
        free(all);
        return ft_fail(err, "out of memory");
    }
    fprintf(f, "{\"strategy\": \"%s\", \"world_size\": %d, \"mode\": \"%s\", \"device\": \"%s\", "
               "\"dtype\": \"%s\", ",
            ft_strategy_name(ft_engine_strategy(t->eng)), t->world,
            ft_tuning_mode_name(t->cfg->tuning.mode), ft_device_name(t->place.device),
            ft_dtype_name(t->place.dtype));
    /* the resolved batch (train.batch_size / grad_accum auto are numbers by now) */
    fprintf(f, "\"batch_size\": %d, \"grad_accum\": %d, \"global_batch_size\": %ld, ",
            t->batch_size, t->accum,
            (long)t->batch_size * t->accum * ft_engine_data_world(t->eng));
    fprintf(f, "\"run_id\": \"%s\", \"steps\": %ld, \"skipped_steps\": %ld, ", t->state.run_id,
            t->steps_done, t->state.skipped_steps);
    fprintf(f, "\"wall_time_s\": %.3f, \"steps_per_second\": ", wall);
    json_number(f, "%.6g", wall > 0 ? t->steps_done / wall : 0.0);
    fputs(", \"tokens_per_second\": ", f);
    json_number(f, "%.6g",
                wall > 0 ? (double)t->tokens_done * ft_engine_data_world(t->eng) / wall : 0.0);
    /* the last step's loss (the log's train loss is the mean of a window) */
    fputs(", \"final_train_loss\": ", f);
    json_number(f, "%.6g", t->steps_done ? t->last_loss : NAN);
    fputs(", \"final_eval_loss\": ", f);
    json_number(f, "%.6g", t->have_eval ? t->last_eval_loss : NAN);
    fputs(", \"comm_bytes_per_step\": ", f);
    json_number(f, "%.6g", t->steps_done ? t->comm_bytes / t->steps_done : 0.0);
    fprintf(f, ", \"peak_memory_bytes\": [");
    for (int r = 0; r < t->world; r++) {
        double sum = 0;
        for (int c = 0; c < FT_MEM_NCAT; c++)
            sum += all[(size_t)r * RANK_NVAL + RANK_MEM + c];
        fprintf(f, "%s%.0f", r ? ", " : "", sum);
    }
    fprintf(f, "], \"peak_memory_by_category\": {");
    for (int c = 0; c < FT_MEM_NCAT; c++) {
        fprintf(f, "%s\"%s\": [", c ? ", " : "", ft_mem_cat_name((ft_mem_cat)c));
        for (int r = 0; r < t->world; r++)
            fprintf(f, "%s%.0f", r ? ", " : "", all[(size_t)r * RANK_NVAL + RANK_MEM + c]);
        fprintf(f, "]");
    }
    fprintf(f, "}, \"host_offload_bytes\": [");
    for (int r = 0; r < t->world; r++)
        fprintf(f, "%s%.0f", r ? ", " : "", all[(size_t)r * RANK_NVAL + RANK_HOST]);
    fprintf(f, "], \"quantized_base_bytes\": [");
    for (int r = 0; r < t->world; r++)
        fprintf(f, "%s%.0f", r ? ", " : "", all[(size_t)r * RANK_NVAL + RANK_QUANT]);
    fprintf(f, "]}\n");
    fclose(f);
    free(all);
    char path[4200];
    snprintf(path, sizeof path, "%s/run_summary.json", t->out_dir);
    rc = ft_write_file_atomic(path, text, len, err);
    free(text);
    return rc;
}

static int save_final(trainer *t, char *out, size_t out_len, ft_err *err)
{
    char dir[4096];
    if ((size_t)snprintf(dir, sizeof dir, "%s/final", t->out_dir) >= sizeof dir)
        return ft_fail(err, "%s: path too long", t->out_dir);
    if (ft_engine_save_weights(t->eng, dir, t->model_dir, err))
        return -1;
    if (t->rank == 0 && t->cfg->tuning.mode == FT_TUNING_FULL) {
        /* a full model dir loads in transformers: config and tokenizer files beside it */
        char src[4300], dst[4300];
        snprintf(src, sizeof src, "%s/config.json", t->model_dir);
        snprintf(dst, sizeof dst, "%s/config.json", dir);
        if (ft_copy_file(src, dst, err) || ft_copy_passthrough_files(t->model_dir, dir, err))
            return -1;
    }
    if (t->rank == 0 &&
        run_tokens_save(t->cfg, t->model_dir, dir, ft_model_cfg(t->m)->vocab_size,
                        t->cfg->tuning.mode == FT_TUNING_FULL, err))
        return -1;
    snprintf(out, out_len, "%s", dir);
    return 0;
}

/* Pads a micro-batch to B rows of T tokens: pad_id with label -100 (not counted) and
 * attention_mask 0, the positions of a packed row continuing its last sequence, a new
 * row's from 0. */
static int pad_micro(owned_batch *o, int B, int T, int32_t pad_id, ft_err *err)
{
    const ft_batch *b = &o->b;
    if (b->B > B || b->T > T)
        return ft_fail(err, "memory check: a micro-batch of %d x %d tokens is larger than "
                            "train.batch_size x model.max_seq_len = %d x %d",
                       b->B, b->T, B, T);
    size_t n = (size_t)B * (size_t)T;
    int32_t *ids = malloc(n * sizeof *ids), *labels = malloc(n * sizeof *labels);
    int32_t *pos = b->position_ids ? malloc(n * sizeof *pos) : NULL;
    int32_t *mask = malloc(n * sizeof *mask);
    if (!ids || !labels || (b->position_ids && !pos) || !mask) {
        free(ids);
        free(labels);
        free(pos);
        free(mask);
        return ft_fail(err, "out of memory");
    }
    for (int r = 0; r < B; r++)
        for (int c = 0; c < T; c++) {
            size_t i = (size_t)r * T + c, j = (size_t)r * b->T + c;
            bool in = r < b->B && c < b->T;
            ids[i] = in ? b->input_ids[j] : pad_id;
            labels[i] = in ? b->labels[j] : -100;
            mask[i] = in && (!b->attention_mask || b->attention_mask[j]);
            if (pos)
                pos[i] = in ? b->position_ids[j]
                         : r < b->B ? b->position_ids[(size_t)r * b->T + b->T - 1] + (c - b->T + 1)
                                    : c;
        }
    free(o->ids);
    free(o->labels);
    free(o->pos);
    free(o->mask);
    o->ids = ids;
    o->labels = labels;
    o->pos = pos;
    o->mask = mask;
    o->cap = n;
    o->b = (ft_batch){B, T, ids, labels, pos, mask};
    return 0;
}

static int pref_step(trainer *t, double max_norm, ft_step_stats *st, ft_err *err);

/* A preference micro-batch of P pairs (2P rows) padded to batch_size pairs of T tokens:
 * each half (chosen rows, then rejected rows) padded to batch_size rows with copies of its
 * own, each row to T tokens with pad_id (label -100). */
static int pad_pairs(owned_batch *o, int B, int T, int32_t pad_id, ft_err *err)
{
    const ft_batch *b = &o->b;
    int P = b->B / 2;
    if (P > B || b->T > T)
        return ft_fail(err, "memory check: a micro-batch of %d pairs of %d tokens is larger "
                            "than train.batch_size x model.max_seq_len = %d x %d",
                       P, b->T, B, T);
    size_t n = 2 * (size_t)B * (size_t)T;
    int32_t *ids = malloc(n * sizeof *ids), *labels = malloc(n * sizeof *labels);
    if (!ids || !labels) {
        free(ids);
        free(labels);
        return ft_fail(err, "out of memory");
    }
    for (int r = 0; r < 2 * B; r++) {
        /* the added pairs repeat the batch's (ORPO needs a prompt and a completion) */
        int half = r / B, k = r % B, src = half * P + k % P;
        for (int c = 0; c < T; c++) {
            size_t i = (size_t)r * T + c, j = (size_t)src * b->T + c;
            bool in = c < b->T;
            ids[i] = in ? b->input_ids[j] : pad_id;
            labels[i] = in ? b->labels[j] : -100;
        }
    }
    free(o->ids);
    free(o->labels);
    free(o->pos);
    free(o->mask);
    o->ids = ids;
    o->labels = labels;
    o->pos = NULL;
    o->mask = NULL; /* (own() allocates one again) */
    o->cap = n;
    o->b = (ft_batch){2 * B, T, ids, labels, NULL, NULL};
    return 0;
}

/* The memory check: one optimizer step on micro-batches padded to the plan's batch_size
 * x max_seq_len, then every rank's allocator peaks to rank 0's m. */
static int measure_step(trainer *t, ft_mem_measured *m, ft_err *err)
{
    if (t->rank == 0 && m->world != t->world)
        return ft_fail(err, "memory check: measuring %d ranks with room for %d", t->world,
                       m->world);
    int T = (int)t->cfg->model.max_seq_len;
    if (next_micro_batches(t, err))
        return -1;
    for (int i = 0; i < t->accum; i++) {
        if (t->pref ? pad_pairs(&t->micro[i], t->batch_size, T, t->data.pad_id, err)
                    : pad_micro(&t->micro[i], t->batch_size, T, t->data.pad_id, err))
            return -1;
        t->mb[i] = t->micro[i].b;
    }
    ft_step_stats st;
    if (pref_step(t, t->cfg->train.max_grad_norm, &st, err))
        return ft_fail_prefix(err, "memory check step");
    double *all = malloc((size_t)t->world * RANK_NVAL * sizeof *all);
    if (!all)
        return ft_fail(err, "out of memory");
    int rc = gather_rank_values(t, 0, all, err);
    if (rc == 0 && t->rank == 0) {
        snprintf(m->strategy, sizeof m->strategy, "%s",
                 ft_strategy_name(ft_engine_strategy(t->eng)));
        m->batch_size = t->batch_size;
        m->seq_len = T;
        m->grad_accum = t->accum;
        for (int r = 0; r < t->world; r++) {
            const double *v = all + (size_t)r * RANK_NVAL;
            m->host[r] = (size_t)v[RANK_HOST];
            for (int c = 0; c < FT_MEM_NCAT; c++)
                m->peak[(size_t)r * FT_MEM_NCAT + c] = (size_t)v[RANK_MEM + c];
        }
        fprintf(t->log, "memory check: one step of %s on %d rank%s, loss %.4f\n", m->strategy,
                t->world, t->world == 1 ? "" : "s", st.loss);
    }
    free(all);
    return rc;
}

/* A step whose loss or gradient norm is not finite (the engine did not apply it; every
 * rank knows it alike): skipped and counted with train.skip_nonfinite_steps, else the
 * end of the run, before anything of the step is written. */
static int nonfinite_step(trainer *t, const ft_step_stats *st, ft_err *err)
{
    long step = t->state.global_step + 1;
    const char *what = !isfinite(st->loss) && !isfinite(st->grad_norm)
                           ? "loss and the gradient norm are"
                       : !isfinite(st->loss) ? "loss is"
                                             : "gradient norm is";
    if (!t->cfg->train.skip_nonfinite_steps && t->rank != 0) /* (rank 0 says why) */
        return ft_fail(err, "step %ld: stopped with rank 0: training diverged", step);
    if (!t->cfg->train.skip_nonfinite_steps)
        return ft_fail(err, "step %ld: the %s not finite (loss %g, gradient norm %g): "
                            "training diverged. The step was not applied and nothing of it was "
                            "written (earlier checkpoints are intact). Lower train.learning_rate, "
                            "or set train.skip_nonfinite_steps=true to skip such steps",
                       step, what, st->loss, st->grad_norm);
    t->state.skipped_steps++;
    begin_line(t);
    fprintf(t->log, "step %ld: the %s not finite (loss %g, gradient norm %g): skipped, not "
                    "applied (%ld skipped so far)\n",
            step, what, st->loss, st->grad_norm, t->state.skipped_steps);
    return 0;
}

/* One optimizer step of the run's objective; DPO's metric sums of the step, summed
 * over the data-parallel ranks, join the logging window. */
static int pref_step(trainer *t, double max_norm, ft_step_stats *st, ft_err *err)
{
    if (!t->pref)
        return ft_engine_step(t->eng, &t->sched, t->mb, t->accum, max_norm, st, err);
    memset(t->pref_obj.sums, 0, sizeof t->pref_obj.sums);
    ft_objective obj = ft_pref_objective_of(&t->pref_obj);
    if (ft_engine_step_objective(t->eng, &obj, &t->sched, t->mb, t->accum, max_norm, st, err))
        return -1;
    double *sums = t->pref_obj.sums;
    /* (model_parallel: the stage with the head holds them, the others zeros) */
    if (t->world > 1 &&
        ft_comm_allreduce(t->comm, sums, FT_PREF_NSUM, FT_COMM_F64, FT_COMM_SUM, err))
        return -1;
    if (!st->nonfinite)
        for (int k = 0; k < FT_PREF_NSUM; k++)
            t->window_pref[k] += sums[k];
    return 0;
}

static int train_loop(trainer *t, ft_train_outcome *outcome, char *out, size_t out_len,
                      ft_err *err)
{
    const ft_train_section *c = &t->cfg->train;
    long log_every = c->logging_steps;
    long save_every = c->save_steps;
    long eval_every = c->eval_strategy == FT_EVAL_STEPS ? c->eval_steps : 0;
    bool eval_epochs = c->eval_strategy == FT_EVAL_EPOCH;
    double max_norm = c->max_grad_norm;
    long first_step = t->state.global_step;
    double t0 = now(), window_t = t0;
    long window_tokens = 0;
    while (t->state.global_step < t->sched.total_steps) {
        int epoch_before = t->state.epoch;
        if (next_micro_batches(t, err))
            return -1;
        for (int i = 0; i < t->accum; i++) {
            t->mb[i] = t->micro[i].b;
            window_tokens += (long)t->mb[i].B * t->mb[i].T;
        }
        ft_step_stats st;
        if (pref_step(t, max_norm, &st, err))
            return ft_fail_prefix(err, "step %ld", t->state.global_step + 1);
        if (st.nonfinite && nonfinite_step(t, &st, err))
            return -1;
        t->state.global_step++;
        t->steps_done++;
        t->last_loss = st.loss;
        if (isfinite(st.loss)) {
            t->window_loss_sum += st.loss;
            t->window_loss_n++;
        }
        t->comm_bytes += ft_engine_step_comm_bytes(t->eng);
        for (int i = 0; i < t->accum; i++)
            t->tokens_done += (long)t->mb[i].B * t->mb[i].T;
        /* a signal reaches the ranks at different moments: stop when any has one */
        if (t->world > 1) {
            int64_t stop = stop_requested;
            if (ft_comm_allreduce(t->comm, &stop, 1, FT_COMM_I64, FT_COMM_MAX, err))
                return -1;
            stop_requested = (sig_atomic_t)stop;
        }
        long step = t->state.global_step;
        double tnow = now();
        double rate = window_tokens / (tnow - window_t);
        if (step % log_every == 0 || step == 1 || step == t->sched.total_steps) {
            if (log_step(t, &st, rate, tnow - t0, first_step, err))
                return -1;
            window_t = tnow;
            window_tokens = 0;
        }
        if (t->tty)
            draw_progress(t, st.loss, rate,
                          (double)(t->sched.total_steps - step) * (tnow - t0) /
                              (double)(step - first_step));
        if ((eval_every && step % eval_every == 0) || (eval_epochs && t->state.epoch != epoch_before))
            if (run_eval(t, err))
                return -1;
        if (stop_requested) {
            begin_line(t);
            fprintf(t->log, "interrupted: saving a checkpoint at step %ld\n", step);
            *outcome = FT_TRAIN_INTERRUPTED;
            return save_checkpoint(t, out, out_len, err);
        }
        if (step % save_every == 0 && save_checkpoint(t, out, out_len, err))
            return -1;
    }
    begin_line(t);
    /* the closing evaluation of a run that evaluates (train.eval_strategy no: none) */
    if (c->eval_strategy != FT_EVAL_NO && run_eval(t, err))
        return -1;
    *outcome = FT_TRAIN_DONE;
    return save_final(t, out, out_len, err);
}

/* train.device (and this rank's GPU), and FT_MEM_LIMIT. */
static int setup_device(trainer *t, ft_err *err)
{
    const char *limit = getenv("FT_MEM_LIMIT");
    if (limit && *limit && ft_parse_size(limit, &t->mem_limit))
        return ft_fail(err, "FT_MEM_LIMIT=%s: not a size (512MiB, 6GiB, 8GB)", limit);
    if (ft_run_device_resolve(&t->cfg->train, &t->place, err) ||
        ft_run_device_select(&t->place, ft_comm_local_rank(t->comm), &t->gpu, err))
        return -1;
    if (t->place.device != FT_DEV_CUDA)
        return 0;
    fprintf(t->log, "ft-train: %s; rank %d takes GPU %d\n", t->place.why, t->rank, t->gpu);
    char why[128];
    if (!(t->gpu_mon = ft_gpu_monitor_open(t->gpu, why, sizeof why)))
        fprintf(t->log, "ft-train: no GPU utilization in the logs: %s\n", why);
    return 0;
}

/* The checkpoint this run resumes into path ("" for none: no --resume, or --resume auto
 * in a dir without one); then the run dir made this run's (run_dir_claim: rank 0
 * decides, before anything is loaded or written; every rank learns the outcome). */
static int claim_run_dir(trainer *t, const ft_trainer_options *o, char *path, size_t n,
                         ft_err *err)
{
    path[0] = '\0';
    if (o->resume && strcmp(o->resume, "auto") == 0) {
        if (ft_checkpoint_latest(t->out_dir, path, n, err) < 0)
            return -1;
    } else if (o->resume && (size_t)snprintf(path, n, "%s", o->resume) >= n) {
        return ft_fail(err, "--resume %s: path too long", o->resume);
    }
    t->fresh = !path[0];
    if (t->measuring)
        return 0; /* writes nothing */
    int rc = t->rank == 0 ? run_dir_claim(t->out_dir, path[0] ? path : NULL,
                                          t->cfg->train.overwrite_output_dir, t->log, err)
                          : 0;
    if (t->world > 1) {
        int64_t v = rc;
        ft_err berr;
        if (ft_comm_broadcast(t->comm, &v, 1, FT_COMM_I64, 0, &berr))
            return ft_fail(err, "%s", berr.msg);
        if (v != 0 && t->rank != 0)
            return ft_fail(err, "rank 0 refused train.output_dir (its error is in its log)");
    }
    return rc;
}

/* A resumed run's position: within this run's steps, and the micro-batches its epoch and
 * batch_in_epoch say were consumed equal to global_step x grad_accum of this run's
 * loader; else the run would not go on with the data it would have seen. */
static int check_data_position(trainer *t, const char *path, ft_err *err)
{
    const ft_train_state *s = &t->state;
    if (s->global_step > t->sched.total_steps)
        return ft_fail(err, "%s is at step %ld, past the %d steps of this run (train.max_steps, "
                            "train.epochs): refusing to resume",
                       path, s->global_step, t->sched.total_steps);
    long want = s->global_step * t->accum, have = s->batch_in_epoch;
    bool ok = s->epoch <= want &&
              s->batch_in_epoch <= loader_n_batches(t, s->epoch);
    for (int e = 0; ok && e < s->epoch && have <= want; e++)
        have += loader_n_batches(t, e);
    if (!ok || have != want)
        return ft_fail(err, "%s: its data position (epoch %d, batch %d) is not where %ld steps of "
                            "%d micro-batch%s end with this run's data: the checkpoint is "
                            "inconsistent, or train.batch_size, train.grad_accum, the number of "
                            "ranks or the data changed since it was saved; refusing to resume",
                       path, s->epoch, s->batch_in_epoch, s->global_step, t->accum,
                       t->accum == 1 ? "" : "es");
    return 0;
}

/* The metrics of TensorBoard's HParams table: scalar tags of the run. */
static const char *const hparam_metrics[] = {"train/loss", "eval/loss", "final/train_loss",
                                             "final/eval_loss", "final/skipped_steps"};

/* The end of the run in TensorBoard: the final metrics and the session's status. */
static int tb_finish(trainer *t, ft_tb_session_status status, ft_err *err)
{
    if (!t->tb)
        return 0;
    int rc = 0;
    if (status == FT_TB_SESSION_SUCCESS) {
        if (t->steps_done && isfinite(t->last_loss))
            rc = log_scalar(t, "final/train_loss", t->last_loss, err);
        if (rc == 0 && t->have_eval && isfinite(t->last_eval_loss))
            rc = log_scalar(t, "final/eval_loss", t->last_eval_loss, err);
        if (rc == 0)
            rc = log_scalar(t, "final/skipped_steps", (double)t->state.skipped_steps, err);
    }
    if (rc == 0)
        rc = ft_tb_hparams_end(t->tb, status, err);
    return rc == 0 ? ft_tb_flush(t->tb, err) : -1;
}

/* train.objective and its options: what is not implemented is refused before the run dir
 * is touched. */
static int check_objective(trainer *t, const ft_dist_options *dopt, ft_err *err)
{
    const ft_train_section *c = &t->cfg->train;
    if (c->objective == FT_CFG_OBJECTIVE_SFT) {
        /* (the schema's defaults: a changed one would be silently unused) */
        if (c->pref.beta != 0.1 || c->pref.loss_type != FT_CFG_PREF_SIGMOID ||
            c->pref.label_smoothing != 0)
            return ft_fail(err, "config: train.pref.* applies to train.objective dpo; this run's "
                                "objective is sft");
        return 0;
    }
    bool orpo = c->objective == FT_CFG_OBJECTIVE_ORPO;
    if (orpo && c->pref.loss_type != FT_CFG_PREF_SIGMOID)
        return ft_fail(err, "config: train.pref.loss_type applies to train.objective dpo (ORPO has "
                            "one loss)");
    static const ft_pref_loss losses[] = {[FT_CFG_PREF_SIGMOID] = FT_PREF_SIGMOID,
                                          [FT_CFG_PREF_IPO] = FT_PREF_IPO,
                                          [FT_CFG_PREF_ROBUST] = FT_PREF_ROBUST};
    ft_pref_options po = {.loss = orpo ? FT_PREF_ORPO : losses[c->pref.loss_type],
                          .beta = c->pref.beta,
                          .label_smoothing = c->pref.label_smoothing};
    if (ft_pref_check(&po, err))
        return -1;
    const char *name = orpo ? "orpo" : "dpo";
    bool pipeline = dopt->strategy == FT_STRATEGY_PIPELINE;
    if (c->predict_with_generate)
        return ft_fail(err, "config: train.predict_with_generate does not work with "
                            "train.objective = %s (its evaluation reports preference accuracy)",
                       name);
    if (t->cfg->data.packing)
        return ft_fail(err, "config: data.packing does not work with train.objective = %s "
                            "(each sequence is its own row, as in TRL's trainers)", name);
    t->pref = true;
    t->orpo = orpo;
    ft_pref_objective_init(&t->pref_obj, &po, NULL);
    if (pipeline) { /* (pref.h: the objective's own GPipe chunks; stages without the head) */
        t->pref_obj.chunks = dopt->pipeline_chunks;
        t->pref_obj.no_loss = t->rank != t->world - 1;
    }
    return 0;
}

static int use_engine_reference(void *ctx, bool on, ft_err *err)
{
    return ft_engine_use_reference(ctx, on, err);
}

static int setup(trainer *t, const ft_trainer_options *o, ft_err *err)
{
    char resume_path[4096];
    const ft_run_config *c = t->cfg;
    if (setup_device(t, err))
        return -1;
    if (!c->model.name[0])
        return ft_fail(err, "config: key 'model.name' is required (a Hugging Face model dir)");
    if (ft_resolve_model_dir(c->model.name, t->model_dir, sizeof t->model_dir, err))
        return -1;
    t->out_dir = c->train.output_dir;
    ft_dist_options dopt;
    if (dist_options(c, t->world, &dopt, err) || check_objective(t, &dopt, err) ||
        claim_run_dir(t, o, resume_path, sizeof resume_path, err))
        return -1;
    ft_comm_set_timeout(t->comm, c->dist.timeout_s);
    if (ft_run_data_load(&t->data, c, t->log, err))
        return -1;
    t->accum = c->train.grad_accum == FT_CFG_AUTO ? 1 : (int)c->train.grad_accum;
    /* data-parallel ranks read disjoint shards; pipeline stages all read the same batches */
    bool pipeline = dopt.strategy == FT_STRATEGY_PIPELINE;
    ft_loader_options lo = ft_run_loader_options(c, &t->data, pipeline ? 0 : t->rank,
                                                 pipeline ? 1 : t->world);
    if (t->pref ? ft_pref_loader_new(&t->pref_loader, &t->data.pref_train, &lo, err)
                : ft_loader_new(&t->train_loader, &t->data.train, &lo, err))
        return ft_fail_prefix(err, "data.train_path %s", c->data.train_path);
    if (t->pref && t->data.pref_eval.n) {
        ft_loader_options eo = lo;
        eo.rank = 0, eo.world = 1, eo.shuffle = false;
        if (ft_pref_loader_new(&t->pref_eval_loader, &t->data.pref_eval, &eo, err))
            return ft_fail_prefix(err, "eval data");
    }
    t->n_batches = loader_n_batches(t, 0);
    t->eval_batch_size = lo.batch_size;
    t->batch_size = lo.batch_size;
    if (c->train.generation_num_beams != 1)
        return ft_fail(err, "config: train.generation_num_beams = %ld: only greedy decoding "
                            "(1) is implemented",
                       c->train.generation_num_beams);
    if (pipeline && c->train.predict_with_generate)
        return ft_fail(err, "config: train.predict_with_generate does not work with dist.strategy "
                            "model_parallel yet (evaluate the saved adapter with ft-eval)");
    if (c->train.predict_with_generate && t->data.eval.n) {
        ft_data_options dopt = ft_run_data_options(c);
        const char *path = c->data.eval_path[0] ? c->data.eval_path : c->data.train_path;
        if (ft_eval_records_load(&t->gen_records, path, t->data.tok, &dopt, &t->data.eval, err))
            return ft_fail_prefix(err, "predict_with_generate");
        t->gen.max_new_tokens = (int)c->train.generation_max_new_tokens;
    }
    t->micro = calloc((size_t)t->accum, sizeof *t->micro);
    t->mb = calloc((size_t)t->accum, sizeof *t->mb);
    if (!t->micro || !t->mb)
        return ft_fail(err, "out of memory");
    if (setup_model(t, &dopt, err) || setup_schedule(t, err))
        return -1;
    t->pref_obj.ref = t->ref;
    /* DPO from a starting adapter: the reference is that adapter as it starts (TRL's "ref"
     * copy); in full fine-tuning under model_parallel each stage keeps its own part of the
     * base (no whole second model on a stage); a fresh adapter with modules trained in
     * full: the pairs off and those modules as they start, the original modules (PEFT's
     * disable_adapter) */
    bool keep = c->tuning.mode == FT_TUNING_FULL ? dopt.strategy == FT_STRATEGY_PIPELINE
                                                 : c->tuning.lora.init_adapter[0] != '\0' ||
                                                       t->fresh_saved;
    if (t->pref && !t->orpo && keep) {
        /* (kept by the engine: the values each rank's forward reads, whole or its shard;
         * of modules trained in full only their units) */
        if (ft_engine_keep_reference(t->eng, t->fresh_saved, err))
            return ft_fail_prefix(err, "the DPO reference");
        t->pref_obj.use_ref = use_engine_reference;
        t->pref_obj.use_ref_ctx = t->eng;
        t->pref_obj.ref_lora_off = t->fresh_saved;
    }
    if (t->gen_records.n)
        ft_gen_eos_ids(ft_model_cfg(t->m), t->data.tok, &t->gen);
    stamp_of(t, &t->state.stamp);
    t->state.seed = (uint64_t)c->train.seed;
    if (ft_checkpoint_base_of(t->model_dir, &t->state.base, err) ||
        ft_checkpoint_new_run_id(t->state.run_id, sizeof t->state.run_id, err))
        return -1;
    if (resume_path[0]) {
        ft_train_state start = t->state;
        if (ft_engine_load_checkpoint(t->eng, resume_path, &t->state, &start, err) ||
            check_data_position(t, resume_path, err))
            return -1;
        ft_model_set_rng_counter(t->m, t->state.rng_counter);
        fprintf(t->log, "resumed from %s at step %ld (saved by %s on %d rank%s)\n", resume_path,
                t->state.global_step, t->state.stamp.strategy, t->state.stamp.world_size,
                t->state.stamp.world_size == 1 ? "" : "s");
        /* the run continues under its id (one written before run ids gets this run's) */
        if (!t->state.run_id[0])
            snprintf(t->state.run_id, sizeof t->state.run_id, "%s", start.run_id);
        t->state.stamp = start.stamp;
        t->state.base = start.base;
    }
    t->t_start = now();
    if (t->rank != 0 || t->measuring)
        return 0; /* rank 0 writes the run dir; a memory check writes nothing */
    if (ft_mkdir_p(t->out_dir, err))
        return -1;
    char path[4200];
    snprintf(path, sizeof path, "%s/metrics.jsonl", t->out_dir);
    /* a resumed run appends to the curve it continues */
    if (!(t->metrics = fopen(path, resume_path[0] ? "a" : "w")))
        return ft_fail(err, "%s: cannot write", path);
    snprintf(path, sizeof path, "%s/config.yaml", t->out_dir);
    FILE *f = fopen(path, "w");
    if (!f)
        return ft_fail(err, "%s: cannot write", path);
    int rc = ft_run_config_write_yaml(c, f, err);
    if (fclose(f) != 0 && rc == 0)
        rc = ft_fail(err, "%s: write failed", path);
    if (rc || ft_tb_open(&t->tb, t->out_dir, err))
        return -1;
    char *text = NULL;
    size_t len = 0;
    FILE *mf = open_memstream(&text, &len);
    if (mf) {
        ft_run_config_write_yaml(c, mf, err);
        fclose(mf);
        rc = ft_tb_text(t->tb, "config", t->state.global_step, text, err);
        free(text);
    }
    if (rc == 0)
        rc = run_hparams_start(t->tb, c, t->world, hparam_metrics,
                               sizeof hparam_metrics / sizeof *hparam_metrics, err);
    return rc;
}

/* Removes what a new run wrote before its first step: its event file, config.yaml and
 * metrics.jsonl (its run dir held none of our outputs when it started, so these are its
 * own). */
static void discard_outputs(trainer *t, const char *events)
{
    const char *names[] = {"config.yaml", "metrics.jsonl"};
    char path[4200];
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s/%s", t->out_dir, names[i]);
        unlink(path);
    }
    if (events[0])
        unlink(events);
    fprintf(t->log, "ft-train: the run stopped before its first step: removed its logs from %s\n",
            t->out_dir);
}

int ft_train_run(const ft_run_config *cfg, const ft_trainer_options *o, ft_train_outcome *outcome,
                 char *out, size_t out_len, ft_err *err)
{
    trainer t = {.cfg = cfg, .log = o->log ? o->log : stderr, .last_eval_step = -1,
                 .comm = o->comm, .measuring = o->measure != NULL};
    if (!t.comm && ft_comm_init(&t.own_comm, err))
        return -1;
    if (!t.comm)
        t.comm = t.own_comm;
    t.rank = ft_comm_rank(t.comm);
    t.world = ft_comm_size(t.comm);
    if (t.rank != 0) {
        if (!(t.quiet = fopen("/dev/null", "w"))) {
            ft_comm_finalize(t.own_comm);
            return ft_fail(err, "/dev/null: cannot open");
        }
        t.log = t.quiet;
    } else if (t.world > 1 || strcmp(ft_comm_backend(t.comm), "single") != 0) {
        fprintf(t.log, "ft-train: %d rank%s (%s)\n", t.world, t.world == 1 ? "" : "s",
                ft_comm_backend(t.comm));
    }
    t.tty = isatty(fileno(t.log));
    stop_requested = 0;
    struct sigaction sa = {0}, ign = {0}, old_int, old_term, old_xfsz;
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    /* a file-size limit (ulimit -f) makes a write fail with EFBIG, reported as any write
     * error (the file named, a partial checkpoint removed), instead of killing the run
     * mid-save */
    ign.sa_handler = SIG_IGN;
    sigaction(SIGXFSZ, &ign, &old_xfsz);
    int rc = setup(&t, o, err);
    if (rc == 0 && t.measuring) {
        rc = measure_step(&t, o->measure, err);
        *outcome = FT_TRAIN_DONE;
        if (out_len)
            out[0] = '\0';
    } else if (rc == 0) {
        rc = train_loop(&t, outcome, out, out_len, err);
        if (rc == 0)
            rc = write_summary(&t, err);
        if (rc == 0)
            rc = tb_finish(&t, *outcome == FT_TRAIN_DONE ? FT_TB_SESSION_SUCCESS
                                                        : FT_TB_SESSION_RUNNING,
                           err);
        else if (t.tb)
            tb_finish(&t, FT_TB_SESSION_FAILURE, &(ft_err){0}); /* best effort */
    }
    bool oom = rc != 0 && err && err->oom;
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    sigaction(SIGXFSZ, &old_xfsz, NULL);
    /* a new run that stopped before its first step (out of memory, bad data) leaves no
     * outputs: the same command with other settings may then use the dir */
    bool discard = rc != 0 && t.fresh && t.steps_done == 0 && t.rank == 0 && !t.measuring &&
                   (t.tb || t.metrics);
    char events[4200] = "";
    if (t.tb) {
        snprintf(events, sizeof events, "%s", ft_tb_path(t.tb));
        ft_tb_close(t.tb);
    }
    for (int i = 0; t.micro && i < t.accum; i++) {
        free(t.micro[i].ids);
        free(t.micro[i].labels);
        free(t.micro[i].pos);
        free(t.micro[i].mask);
    }
    free(t.micro);
    free(t.mb);
    ft_loader_free(t.train_loader);
    ft_pref_loader_free(t.pref_loader);
    ft_pref_loader_free(t.pref_eval_loader);
    ft_pref_objective_free(&t.pref_obj);
    ft_model_free(t.ref);
    ft_engine_free(t.eng);
    if (t.metrics)
        fclose(t.metrics);
    if (discard)
        discard_outputs(&t, events);
    if (t.quiet)
        fclose(t.quiet);
    ft_eval_records_free(&t.gen_records);
    ft_run_data_free(&t.data);
    if (oom) {
        /* after the engine is freed: a GPU's free memory is then the rank's budget */
        ft_oom_context ctx = {.rank = t.rank, .world_size = t.world,
                              .local_ranks = t.world, /* at most */
                              .device_index = t.gpu, .limit = t.mem_limit};
        ctx.dev = t.place.device == FT_DEV_CUDA ? FT_MEM_DEVICE_CUDA : FT_MEM_DEVICE_CPU;
        ft_oom_advice(cfg, &ctx, o->log ? o->log : stderr);
    }
    ft_gpu_monitor_close(t.gpu_mon);
    ft_comm_finalize(t.own_comm);
    return rc;
}
