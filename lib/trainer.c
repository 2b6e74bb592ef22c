/* The training loop (see trainer.h). */
#include "trainer.h"

#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "checkpoint.h"
#include "data_setup.h"
#include "evaluate.h"
#include "fsutil.h"
#include "merge.h"
#include "model.h"
#include "model_path.h"
#include "optim.h"
#include "schedule.h"
#include "tb_writer.h"
#include "train_step.h"

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
    int32_t *ids, *labels, *pos;
    size_t cap;
} owned_batch;

static int own(owned_batch *o, const ft_batch *b, ft_err *err)
{
    size_t n = (size_t)b->B * b->T;
    if (n > o->cap) {
        free(o->ids);
        free(o->labels);
        free(o->pos);
        o->ids = malloc(n * sizeof(int32_t));
        o->labels = malloc(n * sizeof(int32_t));
        o->pos = malloc(n * sizeof(int32_t));
        o->cap = n;
        if (!o->ids || !o->labels || !o->pos)
            return ft_fail(err, "out of memory");
    }
    memcpy(o->ids, b->input_ids, n * sizeof(int32_t));
    memcpy(o->labels, b->labels ? b->labels : b->input_ids, n * sizeof(int32_t));
    if (b->position_ids)
        memcpy(o->pos, b->position_ids, n * sizeof(int32_t));
    o->b = (ft_batch){b->B, b->T, o->ids, o->labels, b->position_ids ? o->pos : NULL};
    return 0;
}

typedef struct trainer {
    const ft_config *cfg;
    FILE *log;
    const char *out_dir;
    char model_dir[4096];
    ft_model *m;
    ft_optimizer opt;
    ft_run_data data;
    ft_loader *train_loader;
    int eval_batch_size;
    ft_tb_writer *tb;
    ft_lr_schedule sched;
    ft_train_state state;
    long last_eval_step; /* -1: none yet */
    bool tty;            /* log is a terminal: keep a progress bar on its last line */
    int accum, n_batches;
    owned_batch *micro;
    ft_eval_records gen_records; /* predict_with_generate: prompts and references */
    ft_gen_options gen;
} trainer;

static void begin_line(trainer *t);

static int setup_model(trainer *t, ft_err *err)
{
    const ft_config *c = t->cfg;
    const char *mode = ft_config_str(c, "tuning.mode");
    ft_model_options mo = {.grad_ckpt = ft_config_bool(c, "train.gradient_checkpointing"),
                           .seed = (uint64_t)ft_config_int(c, "train.seed")};
    if (strcmp(mode, "full") == 0) {
        mo.mode = FT_TRAIN_FULL;
    } else if (strcmp(mode, "lora") == 0) {
        mo.mode = FT_TRAIN_LORA;
        mo.lora = (ft_lora_config){.r = (int)ft_config_int(c, "tuning.lora.r"),
                                   .alpha = (float)ft_config_float(c, "tuning.lora.alpha"),
                                   .dropout = (float)ft_config_float(c, "tuning.lora.dropout"),
                                   .rslora = ft_config_bool(c, "tuning.lora.rslora")};
        if (ft_lora_targets_parse(ft_config_str(c, "tuning.lora.target_modules"),
                                  &mo.lora.targets, err))
            return ft_fail_prefix(err, "config: key 'tuning.lora.target_modules'");
    } else {
        return ft_fail(err, "config: tuning.mode '%s' needs 4-bit quantization, which is not "
                            "implemented yet (use lora or full)",
                       mode);
    }
    if (ft_model_load(&t->m, t->model_dir, &mo, err))
        return ft_fail_prefix(err, "model.name '%s'", t->model_dir);
    if (mo.mode == FT_TRAIN_LORA && ft_config_has(c, "tuning.lora.init_adapter") &&
        ft_model_load_adapter(t->m, ft_config_str(c, "tuning.lora.init_adapter"), err))
        return ft_fail_prefix(err, "config: key 'tuning.lora.init_adapter'");
    size_t n;
    ft_model_trainable(t->m, &n);
    ft_adamw_hparams hp = {.lr = (float)ft_config_float(c, "train.learning_rate"),
                           .beta1 = (float)ft_config_float(c, "train.adam_beta1"),
                           .beta2 = (float)ft_config_float(c, "train.adam_beta2"),
                           .eps = (float)ft_config_float(c, "train.adam_epsilon"),
                           .weight_decay = (float)ft_config_float(c, "train.weight_decay")};
    return ft_optimizer_init(&t->opt, ft_model_mem(t->m), n, hp, err);
}

static int setup_schedule(trainer *t, ft_err *err)
{
    const ft_config *c = t->cfg;
    long max_steps = ft_config_int(c, "train.max_steps");
    double epochs = ft_config_float(c, "train.epochs");
    long total = max_steps > 0
                     ? max_steps
                     : (long)ceil(epochs * t->n_batches / (double)t->accum);
    if (total <= 0)
        return ft_fail(err, "config: train.epochs = %g over %d batches gives no optimizer step",
                       epochs, t->n_batches);
    int warmup = (int)ft_config_int(c, "train.warmup_steps");
    if (warmup == 0)
        warmup = (int)ceil(ft_config_float(c, "train.warmup_ratio") * (double)total);
    t->sched = (ft_lr_schedule){.base_lr = ft_config_float(c, "train.learning_rate"),
                                .warmup_steps = warmup,
                                .total_steps = (int)total};
    return ft_lr_kind_parse(ft_config_str(c, "train.lr_scheduler"), &t->sched.kind, err);
}

static void stamp_of(const trainer *t, ft_ckpt_stamp *s)
{
    memset(s, 0, sizeof *s);
    snprintf(s->device, sizeof s->device, "cpu");
    snprintf(s->dtype, sizeof s->dtype, "fp32");
    snprintf(s->mode, sizeof s->mode, "%s", ft_config_str(t->cfg, "tuning.mode"));
    snprintf(s->quant, sizeof s->quant, "none");
    snprintf(s->strategy, sizeof s->strategy, "none");
    s->world_size = 1;
}

/* Mean loss over the eval set: ft-eval's loss run (forward only), without dropout. */
static int evaluate(trainer *t, double *loss, long *tokens, ft_err *err)
{
    ft_eval_loss r = {0};
    ft_model_set_training(t->m, false);
    int rc = ft_eval_loss_run(t->m, &t->data.eval, t->eval_batch_size, t->data.pad_id, NULL, &r,
                              err);
    ft_model_set_training(t->m, true);
    *loss = r.loss;
    *tokens = r.tokens;
    return rc ? ft_fail_prefix(err, "evaluation") : 0;
}

static int log_scalar(trainer *t, const char *tag, double v, ft_err *err)
{
    return ft_tb_scalar(t->tb, tag, t->state.global_step, v, err);
}

static int run_eval(trainer *t, ft_err *err)
{
    if (!t->data.eval.n || t->last_eval_step == t->state.global_step)
        return 0;
    t->last_eval_step = t->state.global_step;
    double loss = 0;
    long tokens = 0;
    if (evaluate(t, &loss, &tokens, err))
        return -1;
    begin_line(t);
    fprintf(t->log, "eval step %ld | loss %.4f | perplexity %.3f | %ld tokens\n",
            t->state.global_step, loss, exp(loss), tokens);
    if (log_scalar(t, "eval/loss", loss, err) || log_scalar(t, "eval/perplexity", exp(loss), err))
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
    return ft_tb_flush(t->tb, err);
}

static int save_checkpoint(trainer *t, char *out, size_t out_len, ft_err *err)
{
    t->state.rng_counter = ft_model_rng_counter(t->m);
    int rc = ft_checkpoint_save(t->out_dir, t->m, &t->opt, &t->state, t->model_dir,
                                (int)ft_config_int(t->cfg, "train.save_total_limit"), out,
                                out_len, err);
    if (rc == 0) {
        begin_line(t);
        fprintf(t->log, "saved %s\n", out);
    }
    return rc;
}

/* Gathers accum micro-batches, moving through epochs. */
static int next_micro_batches(trainer *t, ft_err *err)
{
    for (int i = 0; i < t->accum; i++) {
        /* with packing and shuffling, an epoch's batch count depends on the epoch */
        if (t->state.batch_in_epoch >= ft_loader_n_batches(t->train_loader, t->state.epoch)) {
            t->state.epoch++;
            t->state.batch_in_epoch = 0;
        }
        ft_batch b;
        if (ft_loader_batch(t->train_loader, t->state.epoch, t->state.batch_in_epoch++, &b, err) ||
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

static int log_step(trainer *t, const ft_step_stats *st, double tok_per_s, double elapsed,
                    long first_step, ft_err *err)
{
    long step = t->state.global_step, total = t->sched.total_steps;
    double eta = (double)(total - step) * elapsed / (double)(step - first_step);
    begin_line(t);
    fprintf(t->log, "step %ld/%ld | loss %.4f | lr %.3e | grad_norm %.4f | %.0f tok/s | eta %.0fs\n",
            step, total, st->loss, st->lr, st->grad_norm, tok_per_s, eta);
    const ft_mem *mem = ft_model_mem(t->m);
    if (log_scalar(t, "train/loss", st->loss, err) ||
        log_scalar(t, "train/learning_rate", st->lr, err) ||
        log_scalar(t, "train/grad_norm", st->grad_norm, err) ||
        log_scalar(t, "train/tokens_per_second", tok_per_s, err))
        return -1;
    for (int c = 0; c < FT_MEM_NCAT; c++) {
        char tag[64];
        snprintf(tag, sizeof tag, "memory/%s_peak_bytes", ft_mem_cat_name((ft_mem_cat)c));
        if (log_scalar(t, tag, (double)mem->peak[c], err))
            return -1;
    }
    return ft_tb_flush(t->tb, err);
}

static int save_final(trainer *t, char *out, size_t out_len, ft_err *err)
{
    char dir[4096];
    if ((size_t)snprintf(dir, sizeof dir, "%s/final", t->out_dir) >= sizeof dir)
        return ft_fail(err, "%s: path too long", t->out_dir);
    if (ft_checkpoint_save_weights(dir, t->m, t->model_dir, err))
        return -1;
    if (strcmp(ft_config_str(t->cfg, "tuning.mode"), "full") == 0) {
        /* a full model dir loads in transformers: config and tokenizer files beside it */
        char src[4300], dst[4300];
        snprintf(src, sizeof src, "%s/config.json", t->model_dir);
        snprintf(dst, sizeof dst, "%s/config.json", dir);
        if (ft_copy_file(src, dst, err) || ft_copy_passthrough_files(t->model_dir, dir, err))
            return -1;
    }
    snprintf(out, out_len, "%s", dir);
    return 0;
}

static int train_loop(trainer *t, ft_train_outcome *outcome, char *out, size_t out_len,
                      ft_err *err)
{
    const ft_config *c = t->cfg;
    long log_every = ft_config_int(c, "train.logging_steps");
    long save_every = ft_config_int(c, "train.save_steps");
    long eval_every = strcmp(ft_config_str(c, "train.eval_strategy"), "steps") == 0
                          ? ft_config_int(c, "train.eval_steps")
                          : 0;
    bool eval_epochs = strcmp(ft_config_str(c, "train.eval_strategy"), "epoch") == 0;
    double max_norm = ft_config_float(c, "train.max_grad_norm");
    long first_step = t->state.global_step;
    double t0 = now(), window_t = t0;
    long window_tokens = 0;
    while (t->state.global_step < t->sched.total_steps) {
        int epoch_before = t->state.epoch;
        if (next_micro_batches(t, err))
            return -1;
        ft_batch mb[64];
        for (int i = 0; i < t->accum; i++) {
            mb[i] = t->micro[i].b;
            window_tokens += (long)mb[i].B * mb[i].T;
        }
        ft_step_stats st;
        if (ft_train_step(t->m, &t->opt, &t->sched, mb, t->accum, max_norm, &st, err))
            return ft_fail_prefix(err, "step %ld", t->state.global_step + 1);
        t->state.global_step++;
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
    if (run_eval(t, err))
        return -1;
    *outcome = FT_TRAIN_DONE;
    return save_final(t, out, out_len, err);
}

static int setup(trainer *t, const ft_trainer_options *o, ft_err *err)
{
    const ft_config *c = t->cfg;
    if (!ft_config_has(c, "model.name"))
        return ft_fail(err, "config: key 'model.name' is required (a Hugging Face model dir)");
    if (ft_resolve_model_dir(ft_config_str(c, "model.name"), t->model_dir, sizeof t->model_dir,
                             err))
        return -1;
    t->out_dir = ft_config_str(c, "train.output_dir");
    if (ft_run_data_load(&t->data, c, t->log, err))
        return -1;
    t->accum = ft_config_is_auto(c, "train.grad_accum") ? 1 : (int)ft_config_int(c, "train.grad_accum");
    if (t->accum > 64)
        return ft_fail(err, "config: train.grad_accum %d is above the supported 64", t->accum);
    ft_loader_options lo = ft_run_loader_options(c, &t->data, 0, 1);
    if (ft_loader_new(&t->train_loader, &t->data.train, &lo, err))
        return -1;
    t->n_batches = ft_loader_n_batches(t->train_loader, 0);
    t->eval_batch_size = lo.batch_size;
    if (ft_config_int(c, "train.generation_num_beams") != 1)
        return ft_fail(err, "config: train.generation_num_beams = %ld: only greedy decoding "
                            "(1) is implemented",
                       ft_config_int(c, "train.generation_num_beams"));
    if (ft_config_bool(c, "train.predict_with_generate") && t->data.eval.n) {
        ft_data_options dopt;
        const char *path = ft_config_has(c, "data.eval_path") ? ft_config_str(c, "data.eval_path")
                                                              : ft_config_str(c, "data.train_path");
        if (ft_run_data_options(c, &dopt, err) ||
            ft_eval_records_load(&t->gen_records, path, t->data.tok, &dopt, &t->data.eval, err))
            return ft_fail_prefix(err, "predict_with_generate");
        t->gen.max_new_tokens = (int)ft_config_int(c, "train.generation_max_new_tokens");
    }
    t->micro = calloc((size_t)t->accum, sizeof *t->micro);
    if (!t->micro)
        return ft_fail(err, "out of memory");
    if (setup_model(t, err) || setup_schedule(t, err))
        return -1;
    if (t->gen_records.n)
        ft_gen_eos_ids(ft_model_cfg(t->m), t->data.tok, &t->gen);
    stamp_of(t, &t->state.stamp);
    t->state.seed = (uint64_t)ft_config_int(c, "train.seed");
    if (o->resume) {
        char path[4096];
        int found = 1;
        if (strcmp(o->resume, "auto") == 0)
            found = ft_checkpoint_latest(t->out_dir, path, sizeof path, err);
        else
            snprintf(path, sizeof path, "%s", o->resume);
        if (found < 0)
            return -1;
        if (found) {
            ft_ckpt_stamp want = t->state.stamp;
            if (ft_checkpoint_load(path, t->m, &t->opt, &t->state, &want, err))
                return -1;
            ft_model_set_rng_counter(t->m, t->state.rng_counter);
            fprintf(t->log, "resumed from %s at step %ld\n", path, t->state.global_step);
        }
    }
    if (ft_mkdir_p(t->out_dir, err))
        return -1;
    char path[4200];
    snprintf(path, sizeof path, "%s/config.yaml", t->out_dir);
    FILE *f = fopen(path, "w");
    if (!f)
        return ft_fail(err, "%s: cannot write", path);
    int rc = ft_config_write_yaml(c, f, err);
    if (fclose(f) != 0 && rc == 0)
        rc = ft_fail(err, "%s: write failed", path);
    if (rc || ft_tb_open(&t->tb, t->out_dir, err))
        return -1;
    char *text = NULL;
    size_t len = 0;
    FILE *mf = open_memstream(&text, &len);
    if (mf) {
        ft_config_write_yaml(c, mf, err);
        fclose(mf);
        rc = ft_tb_text(t->tb, "config", t->state.global_step, text, err);
        free(text);
    }
    return rc;
}

int ft_train_run(const ft_config *cfg, const ft_trainer_options *o, ft_train_outcome *outcome,
                 char *out, size_t out_len, ft_err *err)
{
    trainer t = {.cfg = cfg, .log = o->log ? o->log : stderr, .last_eval_step = -1};
    t.tty = isatty(fileno(t.log));
    stop_requested = 0;
    struct sigaction sa = {0}, old_int, old_term;
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    int rc = setup(&t, o, err);
    if (rc == 0)
        rc = train_loop(&t, outcome, out, out_len, err);
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    if (t.tb)
        ft_tb_close(t.tb);
    for (int i = 0; t.micro && i < t.accum; i++) {
        free(t.micro[i].ids);
        free(t.micro[i].labels);
        free(t.micro[i].pos);
    }
    free(t.micro);
    ft_loader_free(t.train_loader);
    ft_optimizer_free(&t.opt);
    ft_model_free(t.m);
    ft_eval_records_free(&t.gen_records);
    ft_run_data_free(&t.data);
    return rc;
}
