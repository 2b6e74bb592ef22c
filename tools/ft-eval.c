/* ft-eval: evaluate a model (with an optional LoRA adapter) on a JSONL data set: loss,
 * perplexity and counted tokens, and with --generate greedy generation scored by ROUGE-L
 * and exact match; with --preference, preference accuracy (and DPO's, or with --objective
 * orpo ORPO's, loss and metrics)
 * on prompt / chosen / rejected pairs (lib/data/pref_data.h, lib/train/pref.h). The
 * logic lives in lib/eval/evaluate.c, lib/model/generate.c, lib/eval/rouge.c and
 * lib/eval/eval_records.c.
 *
 * Output: the summary on stdout (a few "name value" lines, or with --json one line of
 * JSON); on stderr (rank 0 only) a line per event (the data read, each phase done) and,
 * on a terminal, a progress bar (lib/eval/eval_progress.c), never a line per sample. */
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/cli.h"
#include "core/numparse.h"
#include "core/cpu_env.h"
#include "data/data.h"
#include "data/pref_data.h"
#include "dist/dist.h"
#include "eval/eval_progress.h"
#include "eval/evaluate.h"
#include "formats/lora.h"
#include "model/model.h"
#include "formats/model_path.h"
#include "device/run_device.h"
#include "tokenizer/tokenizer.h"
#include "train/pref.h"

static const char usage[] =
    "usage: ft-eval --model DIR [--adapter DIR] --data FILE|- [options]\n"
    "\n"
    "Runs the model (with a PEFT LoRA adapter when given) forward over a JSONL data set,\n"
    "prepared exactly as for training, and prints the loss (mean cross-entropy over all\n"
    "counted tokens), the perplexity (exp(loss)), the counted tokens and the samples. With\n"
    "--generate it also decodes greedily from each record's prompt and scores the\n"
    "prediction against the reference completion (ROUGE-L F1 as rouge_score computes it,\n"
    "and exact match after stripping whitespace). The logits are computed in chunks of\n"
    "tokens (train.loss_chunk_tokens auto), never for the whole batch at once.\n"
    "\n"
    "A mixture-of-experts model with output_router_logits (mixtral, qwen3_moe, qwen2_moe)\n"
    "also gets aux_loss, the router's load-balancing loss (transformers' aux_loss, the\n"
    "padding left out), a mean over the --batch-size batches weighted by their rows (as\n"
    "the HF Trainer averages its evaluation) since it is a batch's figure, and\n"
    "loss_with_aux = loss + router_aux_loss_coef x aux_loss: what transformers reports\n"
    "as model(...).loss (and its Trainer as eval_loss), equal to it when the data are one\n"
    "batch. The loss stays the cross-entropy alone, the perplexity's, which does not\n"
    "depend on the batches.\n"
    "\n"
    "The summary goes to stdout; stderr gets a line when the data are read and when each\n"
    "phase (loss, generation) is done, and on a terminal a progress bar.\n"
    "\n"
    "Under mpirun (or srun) the ranks share the data (rank r takes every n-th sample) and\n"
    "the metrics are summed across them: the result equals one process over all of it.\n"
    "Rank 0 prints; --data must then be a file, and --predictions writes FILE.rank<r>.\n"
    "\n"
    "  --model DIR            Hugging Face model dir (config.json, safetensors, tokenizer)\n"
    "  --adapter DIR          PEFT LoRA adapter dir (adapter_config.json + weights)\n"
    "  --tokenizer DIR        tokenizer dir or tokenizer.json (default: the adapter dir\n"
    "                         when it holds a tokenizer.json, as PEFT users save one with\n"
    "                         added tokens there; else the model dir)\n"
    "  --data FILE|-          JSONL records (- reads standard input)\n"
    "  --format F             auto|text|prompt_completion|alpaca|chat|sharegpt|tokens\n"
    "                         (data.format)\n"
    "  --template T           auto (the model's own)|chatml|plain|alpaca\n"
    "                         (data.chat_template)\n"
    "  --template-name NAME   with auto: the model's template of that name for every chat\n"
    "                         (default, tool_use, rag, ...; data.chat_template_name;\n"
    "                         default: tool_use for records with tools when the model\n"
    "                         has it, else default)\n"
    "  --template-kwargs JSON\n"
    "                         more template variables, a JSON object, e.g.\n"
    "                         '{\"enable_thinking\": false}' (data.chat_template_kwargs)\n"
    "  --max-seq-len N        truncate samples to N tokens (model.max_seq_len, default 2048)\n"
    "  --train-on-all         count prompt / user tokens too (data.train_on_all)\n"
    "  --no-add-eos           text format: do not append EOS (data.add_eos=false)\n"
    "  --skip-bad-lines       skip and count malformed lines (data.skip_bad_lines)\n"
    "  --batch-size B         samples per forward (default 4; the loss does not depend on it)\n"
    "  --generate             greedy generation on prompt/reference records\n"
    "                         (prompt_completion, alpaca, chat: the last assistant turn)\n"
    "  --max-new-tokens N     generation stops at EOS or after N tokens (default 64)\n"
    "  --predictions FILE     with --generate: one JSON line per sample {\"prompt\",\n"
    "                         \"reference\",\"prediction\",\"rougeL\",...}\n"
    "  --device D             auto|cpu|cuda (train.device): auto takes the GPU when this\n"
    "                         build has CUDA and one is visible (each rank the GPU of its\n"
    "                         node-local rank), else the CPU; default auto\n"
    "  --fp32                 on the GPU compute in fp32 (default bf16, as train.bf16)\n"
    "  --preference           the data are preference pairs {\"prompt\", \"chosen\",\n"
    "                         \"rejected\"} (strings or messages, as train.objective dpo\n"
    "                         reads them): prints the pairs, the preference accuracy (the\n"
    "                         share of pairs whose chosen completion gets the larger DPO\n"
    "                         reward beta (log p - log p_ref), TRL's rewards/accuracies),\n"
    "                         DPO's sigmoid loss and TRL's other metrics (rewards/chosen,\n"
    "                         rewards/rejected, rewards/margins, logps/chosen,\n"
    "                         logps/rejected). The reference p_ref: --reference DIR; else\n"
    "                         with --adapter the base model with the adapter off, as PEFT's\n"
    "                         disable_adapter(): the LoRA pairs off, an embedding / head the\n"
    "                         adapter trains in full (modules_to_save, tokens added) at its\n"
    "                         original values (the adapter's original_module.weight where it\n"
    "                         holds one, else the checkpoint's, a grown vocabulary's new rows\n"
    "                         their mean); else none (log p_ref = 0: the accuracy is\n"
    "                         log p(chosen) > log p(rejected))\n"
    "  --reference DIR        with --preference: the reference model dir (e.g. the base of a\n"
    "                         fully fine-tuned --model)\n"
    "  --beta B               with --preference: DPO's beta (train.pref.beta, default 0.1;\n"
    "                         ORPO's with --objective orpo)\n"
    "  --objective O          with --preference: dpo (default, as above) or orpo: the pairs\n"
    "                         prepared ORPO's way (as train.objective orpo reads them) and\n"
    "                         TRL ORPOTrainer.evaluate()'s figures: loss (the chosen NLL less\n"
    "                         beta log sigmoid of the log odds), nll_loss, log_odds_ratio,\n"
    "                         log_odds_chosen, rewards/* = beta times the completion's mean\n"
    "                         log p (logps/*); no reference (--reference is refused). Each\n"
    "                         --batch-size batch's NLL is its chosen tokens' mean, weighted\n"
    "                         by its pairs (TRL's mean over batches when all are full)\n"
    "  --json                 print one JSON object on one line: {\"loss\",\"perplexity\",\n"
    "                         \"tokens\",\"samples\"} (+ \"aux_loss\",\"loss_with_aux\";\n"
    "                         + \"rougeL\",\"exact_match\",\"generated\"); a non-finite\n"
    "                         value (a perplexity past the double range) is null\n"
    "  -h, --help             this text\n"
    "\n"
    "Results go to stdout, progress to stderr. Exit status: 0 done, 1 error, 2 usage.\n";

static int fail(const char *msg)
{
    fprintf(stderr, "ft-eval: error: %s\n", msg);
    return 1;
}

static int usage_error(const char *fmt, const char *arg)
{
    return ft_cli_usage_error("ft-eval", usage, fmt, arg);
}

typedef struct args {
    const char *model, *adapter, *tokenizer, *data, *predictions;
    const char *device; /* auto, cpu, cuda */
    bool json, generate, fp32, preference;
    const char *reference; /* --preference: the reference model dir (NULL: see usage) */
    double beta;
    bool orpo; /* --objective orpo */
    bool objective_set;
    int batch_size, max_new_tokens;
    ft_data_options data_opt;
} args;

enum {
    OPT_HELP, OPT_JSON, OPT_FP32, OPT_GENERATE, OPT_TRAIN_ON_ALL, OPT_NO_ADD_EOS,
    OPT_SKIP_BAD_LINES, OPT_MODEL, OPT_DEVICE, OPT_ADAPTER, OPT_TOKENIZER, OPT_DATA,
    OPT_PREDICTIONS, OPT_FORMAT, OPT_TEMPLATE, OPT_TEMPLATE_NAME, OPT_TEMPLATE_KWARGS,
    OPT_MAX_SEQ_LEN, OPT_BATCH_SIZE,
    OPT_MAX_NEW_TOKENS, OPT_PREFERENCE, OPT_REFERENCE, OPT_BETA, OPT_OBJECTIVE
};

static const ft_cli_option options[] = {
    {"--help", 'h', FT_CLI_FLAG, OPT_HELP},
    {"--json", 0, FT_CLI_FLAG, OPT_JSON},
    {"--fp32", 0, FT_CLI_FLAG, OPT_FP32},
    {"--generate", 0, FT_CLI_FLAG, OPT_GENERATE},
    {"--train-on-all", 0, FT_CLI_FLAG, OPT_TRAIN_ON_ALL},
    {"--no-add-eos", 0, FT_CLI_FLAG, OPT_NO_ADD_EOS},
    {"--skip-bad-lines", 0, FT_CLI_FLAG, OPT_SKIP_BAD_LINES},
    {"--model", 0, FT_CLI_VALUE, OPT_MODEL},
    {"--device", 0, FT_CLI_VALUE, OPT_DEVICE},
    {"--adapter", 0, FT_CLI_VALUE, OPT_ADAPTER},
    {"--tokenizer", 0, FT_CLI_VALUE, OPT_TOKENIZER},
    {"--data", 0, FT_CLI_VALUE, OPT_DATA},
    {"--predictions", 0, FT_CLI_VALUE, OPT_PREDICTIONS},
    {"--format", 0, FT_CLI_VALUE, OPT_FORMAT},
    {"--template", 0, FT_CLI_VALUE, OPT_TEMPLATE},
    {"--template-name", 0, FT_CLI_VALUE, OPT_TEMPLATE_NAME},
    {"--template-kwargs", 0, FT_CLI_VALUE, OPT_TEMPLATE_KWARGS},
    {"--max-seq-len", 0, FT_CLI_VALUE, OPT_MAX_SEQ_LEN},
    {"--batch-size", 0, FT_CLI_VALUE, OPT_BATCH_SIZE},
    {"--max-new-tokens", 0, FT_CLI_VALUE, OPT_MAX_NEW_TOKENS},
    {"--preference", 0, FT_CLI_FLAG, OPT_PREFERENCE},
    {"--reference", 0, FT_CLI_VALUE, OPT_REFERENCE},
    {"--beta", 0, FT_CLI_VALUE, OPT_BETA},
    {"--objective", 0, FT_CLI_VALUE, OPT_OBJECTIVE},
    {NULL, 0, 0, 0},
};

/* The value of a count option (--batch-size, ...): an int >= 1. */
static int parse_count(const char *val, int *out)
{
    long v;
    if (ft_parse_long(val, 1, INT_MAX, &v))
        return -1;
    *out = (int)v;
    return 0;
}

static int parse_args(int argc, char **argv, args *a)
{
    *a = (args){.batch_size = 4, .max_new_tokens = 64, .device = "auto", .beta = 0.1,
                .data_opt = {.max_seq_len = 2048, .add_eos = true}};
    ft_err err;
    bool max_new_set = false;
    ft_cli_parser cli;
    ft_cli_init(&cli, argc, argv, options, 0);
    for (int opt; (opt = ft_cli_next(&cli)) != FT_CLI_END;) {
        const char *val = cli.value;
        switch (opt) {
        case OPT_HELP:
            fputs(usage, stdout);
            return 0;
        case OPT_JSON:
            a->json = true;
            break;
        case OPT_FP32:
            a->fp32 = true;
            break;
        case OPT_GENERATE:
            a->generate = true;
            break;
        case OPT_TRAIN_ON_ALL:
            a->data_opt.train_on_all = true;
            break;
        case OPT_NO_ADD_EOS:
            a->data_opt.add_eos = false;
            break;
        case OPT_SKIP_BAD_LINES:
            a->data_opt.skip_bad_lines = true;
            break;
        case OPT_MODEL:
            a->model = val;
            break;
        case OPT_DEVICE:
            if (!ft_run_device_known(val))
                return usage_error("--device: '%s' is not auto, cpu or cuda", val);
            a->device = val;
            break;
        case OPT_ADAPTER:
            a->adapter = val;
            break;
        case OPT_TOKENIZER:
            a->tokenizer = val;
            break;
        case OPT_DATA:
            a->data = val;
            break;
        case OPT_PREDICTIONS:
            a->predictions = val;
            break;
        case OPT_FORMAT:
            if (ft_data_format_parse(val, &a->data_opt.format, &err))
                return usage_error("--format: %s", err.msg);
            break;
        case OPT_TEMPLATE:
            if (ft_chat_template_parse(val, &a->data_opt.chat_template, &err))
                return usage_error("--template: %s", err.msg);
            break;
        case OPT_TEMPLATE_NAME:
            a->data_opt.chat_template_name = val;
            break;
        case OPT_TEMPLATE_KWARGS: {
            json_t *kw;
            if (ft_chat_kwargs_parse(val, NULL, &kw, &err))
                return usage_error("--template-kwargs: %s", err.msg);
            json_decref(kw);
            a->data_opt.chat_template_kwargs = val;
            break;
        }
        case OPT_MAX_SEQ_LEN:
            if (parse_count(val, &a->data_opt.max_seq_len))
                return usage_error("--max-seq-len: '%s' is not an integer >= 1", val);
            break;
        case OPT_BATCH_SIZE:
            if (parse_count(val, &a->batch_size))
                return usage_error("--batch-size: '%s' is not an integer >= 1", val);
            break;
        case OPT_MAX_NEW_TOKENS:
            if (parse_count(val, &a->max_new_tokens))
                return usage_error("--max-new-tokens: '%s' is not an integer >= 1", val);
            max_new_set = true;
            break;
        case OPT_PREFERENCE:
            a->preference = true;
            break;
        case OPT_REFERENCE:
            a->reference = val;
            break;
        case OPT_BETA: {
            char *end;
            errno = 0;
            a->beta = strtod(val, &end);
            if (errno || end == val || *end || !(a->beta > 0) || !isfinite(a->beta))
                return usage_error("--beta: '%s' is not a number > 0", val);
            break;
        }
        case OPT_OBJECTIVE:
            if (strcmp(val, "dpo") && strcmp(val, "orpo"))
                return usage_error("--objective: '%s' is not dpo or orpo", val);
            a->orpo = strcmp(val, "orpo") == 0;
            a->objective_set = true;
            break;
        default:
            return ft_cli_error(&cli, opt, "ft-eval", usage);
        }
    }
    if (!a->model)
        return usage_error("%s is required", "--model DIR");
    if (!a->data)
        return usage_error("%s is required", "--data FILE|-");
    if (a->data_opt.chat_template_name && *a->data_opt.chat_template_name &&
        a->data_opt.chat_template != FT_TMPL_AUTO)
        return usage_error("--template-name names one of the model's templates: it needs "
                           "--template auto, not %s",
                           ft_chat_template_name(a->data_opt.chat_template));
    if (!a->generate && (a->predictions || max_new_set))
        return usage_error("%s need --generate", "--predictions and --max-new-tokens");
    if (a->preference && (a->generate || a->data_opt.format != FT_DATA_AUTO ||
                          a->data_opt.train_on_all))
        return usage_error("%s: preference pairs have their own format; it does not go with "
                           "--generate, --format or --train-on-all", "--preference");
    if (!a->preference && a->reference)
        return usage_error("%s needs --preference", "--reference");
    if (!a->preference && a->objective_set)
        return usage_error("%s needs --preference", "--objective");
    if (a->orpo && a->reference)
        return usage_error("%s: ORPO has no reference model", "--reference");
    return -1; /* go on */
}

/* A JSON number; non-finite values (a perplexity that overflows) become null, as JSON
 * has no infinity. */
static json_t *num(double x) { return isfinite(x) ? json_real(x) : json_null(); }

/* One "name value" line of the text summary; a NaN prints as "nan" whatever its sign
 * bit (printf may write "-nan"). */
static void print_row(const char *name, double x, int decimals)
{
    if (isnan(x))
        printf("%-11s nan\n", name);
    else
        printf("%-11s %.*f\n", name, decimals, x);
}

static int print_result(const args *a, const ft_eval_loss *l, const ft_eval_gen *g)
{
    if (!a->json) {
        printf("samples     %zu\ntokens      %ld\n", l->samples, l->tokens);
        print_row("loss", l->loss, 6);
        print_row("perplexity", l->perplexity, 4);
        if (l->has_aux) {
            print_row("aux_loss", l->aux_loss, 6);
            print_row("loss_with_aux", l->loss_with_aux, 6);
        }
        if (a->generate) {
            printf("generated   %zu\n", g->generated);
            print_row("rougeL", g->rouge_l, 4);
            print_row("exact_match", g->exact_match, 4);
        }
        return 0;
    }
    json_t *o = json_object();
    int bad = !o || json_object_set_new(o, "loss", num(l->loss)) ||
              json_object_set_new(o, "perplexity", num(l->perplexity)) ||
              json_object_set_new(o, "tokens", json_integer(l->tokens)) ||
              json_object_set_new(o, "samples", json_integer((json_int_t)l->samples));
    if (!bad && l->has_aux)
        bad = json_object_set_new(o, "aux_loss", num(l->aux_loss)) ||
              json_object_set_new(o, "loss_with_aux", num(l->loss_with_aux));
    if (!bad && a->generate)
        bad = json_object_set_new(o, "rougeL", num(g->rouge_l)) ||
              json_object_set_new(o, "exact_match", num(g->exact_match)) ||
              json_object_set_new(o, "generated", json_integer((json_int_t)g->generated));
    /* no indent: one line, which a shell reads with one `read` */
    char *s = bad ? NULL : json_dumps(o, 0);
    json_decref(o);
    if (!s)
        return fail("out of memory building the JSON output");
    printf("%s\n", s);
    free(s);
    return 0;
}

/* An error about the data: spooled data (standard input, a pipe) show as "<stdin>" or
 * the name given, not as the temporary copy's path. */
static int fail_data(const args *a, const char *data_path, ft_err *err)
{
    if (strcmp(a->data, data_path) != 0)
        ft_err_replace(err, data_path, strcmp(a->data, "-") == 0 ? "<stdin>" : a->data);
    return fail(err->msg);
}

/* Rank r of n keeps every n-th sample starting at r: a view sharing the samples' buffers
 * (free only .samples). */
static int shard_dataset(const ft_dataset *ds, int rank, int n, ft_dataset *view)
{
    *view = (ft_dataset){0};
    view->samples = malloc((ds->n / (size_t)n + 1) * sizeof *view->samples);
    if (!view->samples)
        return -1;
    for (size_t i = (size_t)rank; i < ds->n; i += (size_t)n)
        view->samples[view->n++] = ds->samples[i];
    return 0;
}

static int shard_records(const ft_eval_records *rs, int rank, int n, ft_eval_records *view)
{
    *view = (ft_eval_records){0};
    view->r = malloc((rs->n / (size_t)n + 1) * sizeof *view->r);
    if (!view->r)
        return -1;
    for (size_t i = (size_t)rank; i < rs->n; i += (size_t)n)
        view->r[view->n++] = rs->r[i];
    return 0;
}

/* Sums each rank's loss (and generation) figures over the ranks and recomputes the
 * means: the result of one process over the whole data set. */
static int reduce_metrics(ft_comm *comm, const ft_model *m, ft_eval_loss *l, ft_eval_gen *g,
                          ft_err *err)
{
    double v[9] = {l->loss_sum, (double)l->tokens, (double)l->samples, (double)g->generated,
                   g->rouge_l * (double)g->generated, g->exact_match * (double)g->generated,
                   (double)g->new_tokens, l->aux_sum, (double)l->batches};
    if (ft_comm_allreduce_sum(comm, v, 9, err))
        return -1;
    l->loss_sum = v[0];
    l->tokens = (long)v[1];
    l->samples = (size_t)v[2];
    l->aux_sum = v[7];
    l->batches = (long)v[8];
    ft_eval_loss_finish(m, l);
    g->generated = (size_t)v[3];
    g->rouge_l = g->generated ? v[4] / (double)g->generated : 0;
    g->exact_match = g->generated ? v[5] / (double)g->generated : 0;
    g->new_tokens = (long)v[6];
    return 0;
}

/* --tokenizer; else the adapter dir's tokenizer (tokenizer.save_pretrained beside the
 * adapter: with tokens added, the vocabulary the adapter was made for); else the model's. */
static const char *tokenizer_dir(const args *a)
{
    if (a->tokenizer)
        return a->tokenizer;
    char path[4200];
    snprintf(path, sizeof path, "%s/tokenizer.json", a->adapter ? a->adapter : "");
    return a->adapter && access(path, F_OK) == 0 ? a->adapter : a->model;
}

/* The evaluated model's options before anything is read: no training; with --adapter its
 * LoRA settings (no dropout: evaluation). The loss path and the preference path share
 * this and eval_model_load. */
static int eval_model_options(const args *a, ft_model_options *mo)
{
    ft_err err;
    *mo = (ft_model_options){.mode = FT_TRAIN_NONE};
    if (!a->adapter)
        return 0;
    if (ft_lora_config_load(&mo->lora, a->adapter, &err))
        return fail(err.msg);
    mo->mode = FT_TRAIN_LORA;
    mo->lora.dropout = 0.0f;
    return 0;
}

/* Places this rank (--device, --fp32; on a GPU the line "...; rank r takes GPU g"), sets
 * mo's device, dtype and the head's chunks (auto, as train.loss_chunk_tokens: the logits
 * never for the whole batch at once), and loads --model with --adapter into *m. A
 * reference model loads with mo's device, dtype and chunks. originals (NULL: none): DPO's
 * reference with the adapter off keeps there the original values of the modules the
 * adapter trains in full, taken between the model's load and the adapter's
 * (train/pref.h ft_pref_objective_keep_originals). */
static int eval_model_load(const args *a, ft_comm *comm, ft_eval_meter *meter,
                           ft_model_options *mo, ft_pref_objective *originals, ft_model **m)
{
    ft_err err;
    ft_run_device_choice place;
    int gpu;
    if (ft_run_device_choose(a->device, !a->fp32, "--device", &place, &err) ||
        ft_run_device_select(&place, ft_comm_local_rank(comm), &gpu, &err))
        return fail(err.msg);
    mo->device = place.device;
    mo->dtype = place.dtype;
    mo->loss_chunk_rows = -1;
    if (place.device == FT_DEV_CUDA)
        ft_eval_meter_line(meter, "%s; rank %d takes GPU %d", place.why, ft_comm_rank(comm),
                           gpu);
    if (ft_model_load(m, a->model, mo, &err) ||
        (originals && ft_pref_objective_keep_originals(originals, *m, a->adapter, &err)) ||
        (a->adapter && ft_model_load_adapter(*m, a->adapter, &err)))
        return fail(err.msg);
    return 0;
}

static int run(const args *a, const char *data_path, ft_comm *comm)
{
    ft_err err;
    int rank = ft_comm_rank(comm), world = ft_comm_size(comm);
    /* rank 0 tells people; the others' progress is the same and would only repeat it */
    ft_eval_meter meter;
    ft_eval_meter_init(&meter, "ft-eval", rank == 0 ? stderr : NULL,
                       rank == 0 && isatty(STDERR_FILENO) == 1);
    ft_dataset shard = {0};
    ft_eval_records rec_shard = {0};
    ft_model_options mo;
    ft_model *m = NULL;
    ft_tokenizer *tok = NULL;
    ft_dataset ds = {0};
    ft_eval_records recs = {0};
    FILE *pred = NULL;
    int rc = 1;

    if (eval_model_options(a, &mo))
        goto out;
    /* The tokens format needs no tokenizer (as in training); every other one does. */
    if (a->data_opt.format != FT_DATA_TOKENS || a->generate) {
        if (ft_tokenizer_load(&tok, tokenizer_dir(a), &err)) {
            ft_fail_prefix(&err, "tokenizer");
            fail(err.msg);
            goto out;
        }
        /* the template choices, checked against the model before any data is read */
        json_t *kw = NULL;
        const char *bad = NULL;
        if (ft_chat_check_name(tok, a->data_opt.chat_template, a->data_opt.chat_template_name,
                               &err))
            bad = "--template-name";
        else if (ft_chat_kwargs_parse(a->data_opt.chat_template_kwargs, tok, &kw, &err))
            bad = "--template-kwargs";
        if (bad) {
            fprintf(stderr, "ft-eval: error: %s: %s\n", bad, err.msg);
            goto out;
        }
        json_decref(kw);
    }
    if (ft_dataset_load(&ds, data_path, tok, &a->data_opt, &err)) {
        fail_data(a, data_path, &err);
        goto out;
    }
    ft_eval_meter_line(&meter, "data: %s: %zu samples (%zu bad lines skipped, %zu without a "
                               "counted token dropped)%s",
                       a->data, ds.n, ds.skipped_lines, ds.dropped_empty,
                       world > 1 ? ", shared across the ranks" : "");
    if (a->generate &&
        ft_eval_records_load(&recs, data_path, tok, &a->data_opt, &ds, &err)) {
        fail_data(a, data_path, &err);
        goto out;
    }
    /* the second read must find the records of the first (a file changed in between
     * would score other prompts, or none) */
    if (a->generate && recs.n != ds.n) {
        fprintf(stderr, "ft-eval: error: %s: read twice, it gave %zu samples for the loss "
                        "but %zu records for generation (did it change meanwhile?)\n",
                a->data, ds.n, recs.n);
        goto out;
    }
    if (eval_model_load(a, comm, &meter, &mo, NULL, &m))
        goto out;
    int32_t pad = tok ? ft_tokenizer_pad_id(tok) : -1;
    if (pad < 0)
        pad = ft_model_cfg(m)->pad_token_id;
    if (pad < 0)
        pad = tok && ft_tokenizer_eos_id(tok) >= 0 ? ft_tokenizer_eos_id(tok) : 0;

    if (shard_dataset(&ds, rank, world, &shard) ||
        (a->generate && shard_records(&recs, rank, world, &rec_shard))) {
        fail("out of memory");
        goto out;
    }
    ft_eval_loss loss = {0};
    ft_eval_gen gen = {0};
    /* a rank may get no sample when there are more ranks than samples */
    ft_eval_progress progress = ft_eval_meter_begin(&meter, "loss", "samples");
    if (shard.n && ft_eval_loss_run(m, &shard, a->batch_size, pad, &progress, &loss, &err)) {
        ft_eval_meter_clear(&meter);
        fail(err.msg);
        goto out;
    }
    ft_eval_meter_end(&meter, "%zu samples", ds.n);
    if (a->generate) {
        /* under several ranks each writes its share to PATH.rank<r> */
        char pred_path[4200];
        if (a->predictions)
            snprintf(pred_path, sizeof pred_path, world > 1 ? "%s.rank%d" : "%s",
                     a->predictions, rank);
        if (a->predictions && !(pred = fopen(pred_path, "w"))) {
            fprintf(stderr, "ft-eval: error: %s: cannot open for writing: %s\n", pred_path,
                    strerror(errno));
            goto out;
        }
        ft_gen_options go = {.max_new_tokens = a->max_new_tokens};
        ft_gen_eos_ids(ft_model_cfg(m), tok, &go);
        progress = ft_eval_meter_begin(&meter, "generation", "samples");
        if (rec_shard.n &&
            ft_eval_generate_run(m, tok, &rec_shard, &go, pred, &progress, &gen, &err)) {
            ft_eval_meter_clear(&meter);
            fail_data(a, data_path, &err);
            goto out;
        }
        if (pred) {
            FILE *f = pred;
            pred = NULL;
            if (fclose(f) != 0) {
                fprintf(stderr, "ft-eval: error: %s: writing failed\n", pred_path);
                goto out;
            }
        }
        ft_eval_meter_end(&meter, "%zu samples, at most %d new tokens each%s", recs.n,
                          a->max_new_tokens, a->predictions ? ", predictions written" : "");
    }
    if (reduce_metrics(comm, m, &loss, &gen, &err)) {
        fail(err.msg);
        goto out;
    }
    if (loss.tokens == 0) {
        fail("the data have no counted token");
        goto out;
    }
    rc = rank == 0 ? print_result(a, &loss, &gen) : 0;
out:
    free(shard.samples);
    free(rec_shard.r);
    if (pred)
        fclose(pred);
    ft_eval_records_free(&recs);
    ft_dataset_free(&ds);
    ft_model_free(m);
    ft_tokenizer_free(tok);
    return rc;
}

/* --preference: the pairs shared across the ranks (rank r every n-th), DPO's metric sums
 * over them summed over the ranks, printed by rank 0. */
static int run_pref(const args *a, ft_comm *comm)
{
    ft_err err;
    int rank = ft_comm_rank(comm), world = ft_comm_size(comm);
    ft_eval_meter meter;
    ft_eval_meter_init(&meter, "ft-eval", rank == 0 ? stderr : NULL, false);
    ft_tokenizer *tok = NULL;
    ft_pref_dataset ds = {0}, shard = {0};
    ft_pref_loader *loader = NULL;
    ft_model *m = NULL, *ref = NULL;
    ft_pref_objective po = {0};
    int rc = 1;
    ft_model_options mo;
    if (eval_model_options(a, &mo))
        goto out;
    if (ft_tokenizer_load(&tok, tokenizer_dir(a), &err)) {
        ft_fail_prefix(&err, "tokenizer");
        fail(err.msg);
        goto out;
    }
    if (ft_pref_dataset_load_style(&ds, a->data, tok, &a->data_opt,
                                   a->orpo ? FT_PREF_DATA_ORPO : FT_PREF_DATA_DPO, &err)) {
        fail(err.msg);
        goto out;
    }
    ft_eval_meter_line(&meter, "data: %s: %zu preference pairs (%zu bad lines skipped, %zu "
                               "whose prompt fills --max-seq-len dropped)%s",
                       a->data, ds.n, ds.skipped_lines, ds.dropped,
                       world > 1 ? ", shared across the ranks" : "");
    if (ds.n == 0) {
        fail("the data have no preference pair");
        goto out;
    }
    ft_pref_options o = {.loss = a->orpo ? FT_PREF_ORPO : FT_PREF_SIGMOID, .beta = a->beta};
    ft_pref_objective_init(&po, &o, NULL);
    /* the adapter off as DPO's reference, the adapter training the embedding or the head
     * in full: PEFT's disable_adapter() computes those with their original modules */
    bool originals = a->adapter && !a->reference && !a->orpo && mo.lora.modules_to_save;
    if (eval_model_load(a, comm, &meter, &mo, originals ? &po : NULL, &m))
        goto out;
    if (originals)
        ft_eval_meter_line(&meter, "reference: the base, the adapter off (%s at %s original "
                                   "values, as PEFT's disable_adapter computes them)",
                           mo.lora.modules_to_save == FT_SAVE_EMBED  ? "embed_tokens"
                           : mo.lora.modules_to_save == FT_SAVE_HEAD ? "lm_head"
                                                                     : "embed_tokens and lm_head",
                           mo.lora.modules_to_save == (FT_SAVE_EMBED | FT_SAVE_HEAD) ? "their"
                                                                                     : "its");
    ft_model_options ro = {.mode = FT_TRAIN_NONE, .device = mo.device, .dtype = mo.dtype,
                           .loss_chunk_rows = mo.loss_chunk_rows};
    if (a->reference && ft_model_load(&ref, a->reference, &ro, &err)) {
        fail(err.msg);
        goto out;
    }
    /* (an adapter for a grown vocabulary against its unresized base, say: the added
     * tokens would index past the reference's embedding) */
    if (ref && ft_model_cfg(ref)->vocab_size != ft_model_cfg(m)->vocab_size) {
        fprintf(stderr, "ft-eval: error: --reference %s: a vocabulary of %lld tokens, the "
                        "model%s has %lld\n",
                a->reference, (long long)ft_model_cfg(ref)->vocab_size,
                a->adapter ? " with its adapter" : "", (long long)ft_model_cfg(m)->vocab_size);
        goto out;
    }
    ft_model_set_training(m, false);
    int32_t pad = ft_tokenizer_pad_id(tok);
    if (pad < 0)
        pad = ft_tokenizer_eos_id(tok) >= 0 ? ft_tokenizer_eos_id(tok) : 0;
    /* this rank's pairs: a view sharing their buffers (free only .pairs) */
    shard.pairs = malloc((ds.n / (size_t)world + 1) * sizeof *shard.pairs);
    if (!shard.pairs) {
        fail("out of memory");
        goto out;
    }
    for (size_t i = (size_t)rank; i < ds.n; i += (size_t)world)
        shard.pairs[shard.n++] = ds.pairs[i];
    po.ref = ref;
    po.ref_free = !ref && !a->adapter;
    /* the metric sums reported: DPO's stop at the pairs, ORPO's go on (pref.h) */
    int end = a->orpo ? FT_PREF_NSUM : FT_PREF_PAIRS;
    double sums[FT_PREF_NSUM] = {0};
    ft_loader_options lo = {.batch_size = a->batch_size, .world = 1, .pad_id = pad};
    if (shard.n && ft_pref_loader_new(&loader, &shard, &lo, &err)) {
        fail(err.msg);
        goto out;
    }
    for (int i = 0; loader && i < ft_pref_loader_n_batches(loader, 0); i++) {
        ft_batch b;
        if (ft_pref_loader_batch(loader, 0, i, &b, &err) ||
            ft_pref_eval_batch(&po, m, &b, sums, &err)) {
            fail(err.msg);
            goto out;
        }
    }
    if (ft_comm_allreduce_sum(comm, sums, FT_PREF_NSUM, &err)) {
        fail(err.msg);
        goto out;
    }
    ft_eval_meter_line(&meter, "preference: %.0f pairs", sums[FT_PREF_PAIRS]);
    rc = 0;
    if (rank != 0)
        goto out;
    double n = sums[FT_PREF_PAIRS];
    const char *refname = a->orpo ? "none (orpo)" : ref ? a->reference
                                                    : a->adapter ? "base" : "none";
    if (!a->json) {
        printf("%-17s %.0f\n%-17s %s\n", "pairs", n, "reference", refname);
        printf("%-17s %.4f\n%-17s %.6f\n", "accuracy", sums[FT_PREF_ACCURACY] / n, "loss",
               sums[FT_PREF_LOSS] / n);
        for (int k = FT_PREF_REWARD_CHOSEN; k < end; k++)
            if (k != FT_PREF_ACCURACY && k != FT_PREF_PAIRS)
                printf("%-17s %.6f\n", ft_pref_metric_names[k], sums[k] / n);
        goto out;
    }
    json_t *j = json_object();
    int bad = !j || json_object_set_new(j, "pairs", json_integer((json_int_t)n)) ||
              json_object_set_new(j, "reference", json_string(refname)) ||
              json_object_set_new(j, "beta", json_real(a->beta)) ||
              json_object_set_new(j, "objective", json_string(a->orpo ? "orpo" : "dpo")) ||
              json_object_set_new(j, "accuracy", num(sums[FT_PREF_ACCURACY] / n));
    for (int k = FT_PREF_LOSS; !bad && k < end; k++)
        if (k != FT_PREF_PAIRS)
            bad = json_object_set_new(j, ft_pref_metric_names[k], num(sums[k] / n));
    char *text = bad ? NULL : json_dumps(j, 0);
    json_decref(j);
    if (!text) {
        rc = fail("out of memory building the JSON output");
        goto out;
    }
    printf("%s\n", text);
    free(text);
out:
    ft_pref_loader_free(loader);
    ft_pref_objective_free(&po);
    free(shard.pairs);
    ft_pref_dataset_free(&ds);
    ft_model_free(ref);
    ft_model_free(m);
    ft_tokenizer_free(tok);
    return rc;
}

int main(int argc, char **argv)
{
    ft_cpu_env_reexec(argv); /* a pool that sleeps while it waits; BLAS kernels for this CPU */
    args a;
    int rc = parse_args(argc, argv, &a);
    if (rc >= 0)
        return rc;
    char model_dir[4096];
    ft_err resolve_err;
    if (ft_resolve_model_dir(a.model, model_dir, sizeof model_dir, &resolve_err))
        return fail(resolve_err.msg);
    a.model = model_dir;
    /* With --generate the records are read twice (loss, then prompts): standard input,
     * or a pipe, is copied into a temporary file first. */
    char *spool = NULL;
    const char *data_path = a.data;
    struct stat st;
    if (a.generate && (strcmp(a.data, "-") == 0 || (stat(a.data, &st) == 0 &&
                                                     !S_ISREG(st.st_mode) &&
                                                     !S_ISDIR(st.st_mode)))) {
        ft_err err;
        if (ft_eval_spool(a.data, &spool, &err))
            return fail(err.msg);
        data_path = spool;
    }
    ft_comm *comm = NULL;
    ft_err cerr;
    if (ft_comm_init(&comm, &cerr)) {
        rc = fail(cerr.msg);
    } else if (ft_comm_size(comm) > 1 && strcmp(a.data, "-") == 0) {
        rc = fail("--data -: under several ranks only rank 0 sees standard input; give a file");
    } else {
        rc = a.preference ? run_pref(&a, comm) : run(&a, data_path, comm);
    }
    ft_comm_finalize(comm);
    if (spool) {
        unlink(spool);
        free(spool);
    }
    if (fflush(stdout) != 0) {
        perror("ft-eval: error: writing the output");
        rc = 1;
    }
    return rc;
}
