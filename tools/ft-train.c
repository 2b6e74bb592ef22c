/* ft-train: fine-tune a model (LoRA or full) from a YAML run config; prints the output
 * dir on stdout. --print-config shows the resolved config, --get prints one value,
 * --dump-data writes the samples exactly as the model will see them, --plan prints the
 * memory plan and --measure the peaks of one real step beside it, --check checks the
 * config for a launch before it starts. --set-var takes the Make-style variables of
 * `make train SECTION_KEY=value`. The loop is lib/run/trainer.c, the auto batch size
 * lib/memory/auto_batch.c, the checks before launch lib/run/run_check.c. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/cli.h"
#include "core/numparse.h"
#include "core/cpu_env.h"
#include "memory/auto_batch.h"
#include "config/run_config.h"
#include "dist/dist.h"
#include "data/data_setup.h"
#include "memory/memcheck.h"
#include "memory/memplan.h"
#include "formats/model_path.h"
#include "run/run_check.h"
#include "run/trainer.h"

static const char usage[] =
    "usage: ft-train --config FILE.yaml [--set-var NAME=value ...] [--set key=value ...]\n"
    "                [--resume auto|DIR] [--dump-data FILE|-] [--print-config] [--get KEY]\n"
    "                [--plan [N]] [--measure] [--check [N]]\n"
    "\n"
    "Trains a LoRA adapter or the full model as the YAML run config describes (keys:\n"
    "configs/README.md), with the --set-var and then the --set overrides applied after\n"
    "the file, each in order, and prints the output dir (train.output_dir/final) on\n"
    "stdout. The run dir gets config.yaml, TensorBoard event files and checkpoint-N/\n"
    "dirs. SIGINT or SIGTERM saves a checkpoint and exits 130. A run dir holding another\n"
    "run's outputs is refused unless --resume continues it or train.overwrite_output_dir\n"
    "is true. A loss or gradient norm that is not finite stops the run (exit 1) before\n"
    "anything of that step is written; train.skip_nonfinite_steps skips such steps.\n"
    "\n"
    "  --config FILE       the run config (YAML)\n"
    "  --set key=value     override one key, e.g. --set train.batch_size=4\n"
    "  --set-var NAME=value  override the key a Make-style variable names, as in\n"
    "                      `make train NAME=value`: TRAIN_BATCH_SIZE=4 is\n"
    "                      train.batch_size=4, TUNING_LORA_R=8 is tuning.lora.r=8; a NAME\n"
    "                      that matches no key is an error\n"
    "  --resume auto|DIR   continue from the newest checkpoint of the run dir, or DIR\n"
    "  --dump-data FILE|-  write the training rows as the model sees them, one\n"
    "                      {\"input_ids\",\"labels\"(,\"position_ids\")} JSON object a line,\n"
    "                      after templates, truncation, shuffling and packing; then exit\n"
    "  --print-config      print the resolved config (YAML) on stdout and exit; batch_size\n"
    "                      and grad_accum auto are resolved for this process (or the ranks\n"
    "                      of the launch it runs in) when the model's config.json is here\n"
    "  --plan [N]          print the planned memory per category (weights, gradients,\n"
    "                      optimizer, activations, workspace) for this config on N ranks\n"
    "                      (default 1), then full vs lora vs qlora for the same model,\n"
    "                      and exit: exact for the CPU engine (cpu-* rows), predicted for\n"
    "                      the GPU strategies; batch_size auto is resolved for N ranks on\n"
    "                      this machine (planned for 1 when nothing fits)\n"
    "  --measure           --plan for the ranks of this launch (mpirun -np N ft-train ...\n"
    "                      --measure), with what they measure beside it: load the model\n"
    "                      and data, run exactly one training step (forward, backward,\n"
    "                      optimizer; micro-batches padded to batch_size x\n"
    "                      model.max_seq_len), write nothing to the run dir, and print per\n"
    "                      rank and category the planned, measured and difference bytes\n"
    "  --check [N]         check the config for a launch on N ranks (default 1) and exit:\n"
    "                      what a rank would refuse before training (the model dir and\n"
    "                      its config.json, the data files, the global batch at N ranks,\n"
    "                      the strategy at N ranks, ...); every rank also checks at start\n"
    "  --get KEY           print the value of KEY (e.g. model.name) and exit, auto as auto;\n"
    "                      repeatable, one value a line; an unset required key is an error\n"
    "  --config-reference  print the reference of every config key (Markdown) and exit\n"
    "  -h, --help          this text\n"
    "\n"
    "train.batch_size auto picks the largest micro-batch whose planned per-rank peak fits\n"
    "train.memory_budget (auto: the host's available memory x 0.8 / ranks on the node),\n"
    "train.grad_accum auto the accumulation that reaches train.global_batch_size; ft-train\n"
    "prints the chosen values on stderr (configs/README.md).\n"
    "\n"
    "tuning.mode qlora trains LoRA on a base quantized on load (tuning.quant.*), or on a\n"
    "checkpoint quantized already (ft-quantize, or transformers + bitsandbytes); several\n"
    "ranks: start it with mpirun or srun (dist.strategy).\n"
    "\n"
    "train.device auto (the default) trains on the GPU when this build has CUDA and one is\n"
    "visible (each rank takes the GPU of its node-local rank; bf16 with train.bf16, else\n"
    "fp32), on the CPU otherwise; cpu or cuda force it. Every dist.strategy is accepted on\n"
    "GPUs, one rank per GPU over NCCL. The CUDA backend is written but has not yet run on a\n"
    "GPU (docs/gpu.md). When a run runs out of memory, ft-train prints its memory plan and\n"
    "the overrides that fit before the error; FT_MEM_LIMIT=size in the environment caps the\n"
    "tracked allocator to rehearse that.\n";

static int fail(const char *msg)
{
    fprintf(stderr, "ft-train: error: %s\n", msg);
    return 1;
}

/* --get KEY: one value, as YAML would spell it ("" for an empty string). */
static int get_value(const ft_run_config *cfg, const char *key)
{
    char text[FT_CFG_PATH_MAX];
    ft_err err;
    if (ft_run_config_key_text(cfg, key, text, sizeof text, &err)) {
        fprintf(stderr, "ft-train: error: --get '%s': %s\n", key, err.msg);
        return 1;
    }
    printf("%s\n", text);
    return 0;
}

static int dump_data(const ft_run_config *cfg, const char *out_path)
{
    ft_err err;
    ft_run_data d;
    if (ft_run_data_load(&d, cfg, stderr, &err))
        return fail(err.msg);
    ft_loader_options lo = ft_run_loader_options(cfg, &d, 0, 1);
    ft_loader *l = NULL;
    int rc = 1;
    FILE *out = strcmp(out_path, "-") == 0 ? stdout : fopen(out_path, "w");
    if (!out) {
        fprintf(stderr, "ft-train: error: %s: cannot open for writing\n", out_path);
    } else if (ft_loader_new(&l, &d.train, &lo, &err) || ft_loader_dump(l, 0, out, &err)) {
        fail(err.msg);
    } else {
        rc = 0;
    }
    if (out && out != stdout && fclose(out) != 0 && rc == 0)
        rc = fail("writing the dump failed");
    if (rc == 0 && out != stdout)
        printf("%s\n", out_path);
    ft_loader_free(l);
    ft_run_data_free(&d);
    return rc;
}

/* Whether a launcher made this process a rank other than 0 (its notices would repeat
 * rank 0's). */
static bool secondary_rank(void)
{
    static const char *const vars[] = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK",
                                        "SLURM_PROCID"};
    long rank;
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++)
        if (getenv(vars[i]))
            return ft_parse_long(getenv(vars[i]), LONG_MIN, LONG_MAX, &rank) == 0 && rank != 0;
    return false;
}

/* The ranks of the launch this process runs in (1 without a launcher). */
static int launch_world(void)
{
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"};
    long n;
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++)
        if (ft_parse_long(getenv(vars[i]), 1, INT_MAX, &n) == 0)
            return (int)n;
    if (getenv("SLURM_PROCID") && ft_parse_long(getenv("SLURM_NTASKS"), 1, INT_MAX, &n) == 0)
        return (int)n;
    return 1;
}

/* --print-config: the auto batch values resolved for the launch's ranks (the line that
 * explains them as a YAML comment on top), or left auto with a note when the model's
 * config.json is not here to plan with. */
static int print_resolved(ft_run_config *cfg)
{
    ft_err err;
    bool batch_auto = cfg->train.batch_size == FT_CFG_AUTO;
    bool autos = batch_auto || cfg->train.grad_accum == FT_CFG_AUTO;
    char dir[4096];
    if (ft_memory_budget_check(&cfg->train, &err))
        return fail(err.msg);
    if (batch_auto &&
        (!cfg->model.name[0] || ft_resolve_model_dir(cfg->model.name, dir, sizeof dir, &err))) {
        if (!secondary_rank())
            fprintf(stderr, "note: train.batch_size auto stays auto here: it is planned from "
                            "the model's config.json, which is not available (model.name)\n");
    } else if (autos) {
        char *line = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&line, &len);
        if (!f)
            return fail("out of memory");
        int rc = ft_resolve_batch(cfg, NULL, launch_world(), f, NULL, &err);
        fclose(f);
        if (rc) {
            free(line);
            return fail(err.msg);
        }
        printf("# %s", line);
        free(line);
    }
    return ft_run_config_write_yaml(cfg, stdout, &err) ? fail(err.msg) : 0;
}

/* --measure on rank 0: the plan of this config at the launch's world size with the
 * measured peaks beside it. */
static int measured_plan(const ft_run_config *cfg, const ft_mem_measured *m, ft_err *err)
{
    ft_memplan_result plan;
    if (ft_memplan_config(cfg, m->world, &plan, err))
        return -1;
    ft_memcheck_print(&plan, m, stdout);
    printf("\n");
    return ft_memplan_compare_modes(cfg, m->world, stdout, err);
}

/* Whether the plan fits the memory of every rank (the measurement would run out of it
 * otherwise; collective): *fits, and when it does not, rank 0 prints the plan and why. */
static int plan_fits(const ft_run_config *cfg, ft_comm *comm, bool *fits, ft_err *err)
{
    int world = ft_comm_size(comm);
    ft_memplan_result plan;
    ft_mem_budget avail;
    if (ft_memplan_config(cfg, world, &plan, err) ||
        ft_memory_available(FT_MEM_DEVICE_CPU, ft_comm_local_rank(comm), world, &avail, err))
        return -1;
    int row = plan.selected_cpu >= 0 ? plan.selected_cpu : FT_PLAN_CPU;
    size_t need = plan.rows[row].total + plan.rows[row].host;
    int64_t short_of = need > avail.bytes; /* any rank short of memory: none measures */
    if (world > 1 && ft_comm_allreduce(comm, &short_of, 1, FT_COMM_I64, FT_COMM_MAX, err))
        return -1;
    *fits = !short_of;
    if (!*fits && ft_comm_rank(comm) == 0) {
        ft_memplan_print(&plan, stdout);
        printf("\nnot measured: %s needs %.1f MiB per rank, more than a rank has (here %.1f MiB: "
               "%s)\n",
               plan.rows[row].name, (double)need / 1048576.0, (double)avail.bytes / 1048576.0,
               avail.source);
    }
    return 0;
}

/* The checks before launch (run_check.h) on every rank, agreed on: when every rank
 * fails (the same config and files everywhere, the usual case) rank 0 says it once; when
 * only some do (a file missing on one node) each of those says it with its rank. Then
 * every rank leaves normally, without MPI_Abort: none of them has started anything. */
static int check_on_ranks(const ft_run_config *cfg, ft_comm *comm)
{
    ft_err err, cerr;
    int world = ft_comm_size(comm), rank = ft_comm_rank(comm);
    int failed = ft_run_check(cfg, world, &err) != 0;
    int64_t n_failed = failed;
    if (world > 1 && ft_comm_allreduce(comm, &n_failed, 1, FT_COMM_I64, FT_COMM_SUM, &cerr)) {
        fprintf(stderr, "ft-train: error: rank %d: %s\n", rank, cerr.msg);
        return -1;
    }
    if (n_failed == 0)
        return 0;
    if (failed && n_failed < world)
        fprintf(stderr, "ft-train: error: rank %d: %s\n", rank, err.msg);
    else if (failed && rank == 0)
        fprintf(stderr, "ft-train: error: %s\n", err.msg);
    return -1;
}

/* Trains on the ranks of this run (with measure: one step for --measure). An error on
 * any rank stops every rank (a rank left alone would wait in its next collective until
 * the timeout). */
static int train(ft_run_config *cfg, const char *resume, bool measure)
{
    ft_err err;
    ft_comm *comm;
    if (ft_comm_init(&comm, &err))
        return fail(err.msg);
    if (check_on_ranks(cfg, comm)) {
        ft_comm_finalize(comm);
        return 1;
    }
    /* dist.timeout_s when the config gives it, else the environment's (FT_DIST_TIMEOUT,
     * else NCCL_TIMEOUT), else its default: what ft_comm_init read */
    if (!cfg->dist.timeout_given)
        cfg->dist.timeout_s = ft_comm_timeout(comm);
    int rc = 0;
    bool root = ft_comm_rank(comm) == 0, fits = true;
    ft_mem_measured m = {0};
    if (ft_resolve_batch(cfg, comm, 0, root ? stderr : NULL, NULL, &err) ||
        (measure && plan_fits(cfg, comm, &fits, &err))) {
        rc = -1;
    } else if (measure && !fits) {
        rc = 0;
    } else if (measure) {
        ft_trainer_options to = {.log = stderr, .comm = comm, .measure = &m};
        ft_train_outcome outcome;
        char out[16];
        if (ft_mem_measured_init(&m, ft_comm_size(comm), &err) ||
            ft_train_run(cfg, &to, &outcome, out, sizeof out, &err) ||
            (root && measured_plan(cfg, &m, &err)))
            rc = -1;
    } else {
        ft_trainer_options to = {.resume = resume, .log = stderr, .comm = comm};
        ft_train_outcome outcome;
        char out[4096];
        rc = ft_train_run(cfg, &to, &outcome, out, sizeof out, &err);
        if (rc == 0) {
            if (root)
                printf("%s\n", out);
            rc = outcome == FT_TRAIN_INTERRUPTED ? 130 : 0;
        }
    }
    ft_mem_measured_free(&m);
    if (rc < 0) {
        if (ft_comm_size(comm) > 1) {
            char msg[sizeof err.msg + 64];
            snprintf(msg, sizeof msg, "ft-train: error: rank %d: %s", ft_comm_rank(comm), err.msg);
            ft_comm_abort(comm, 1, msg);
        }
        rc = fail(err.msg);
    }
    fflush(stdout);
    ft_comm_finalize(comm);
    return rc;
}

enum {
    OPT_HELP, OPT_CONFIG, OPT_RESUME, OPT_DUMP_DATA, OPT_CONFIG_REFERENCE, OPT_PRINT_CONFIG,
    OPT_PLAN, OPT_MEASURE, OPT_GET, OPT_SET, OPT_SET_VAR, OPT_CHECK
};

static const ft_cli_option options[] = {
    {"--help", 'h', FT_CLI_FLAG, OPT_HELP},
    {"--config", 0, FT_CLI_VALUE, OPT_CONFIG},
    {"--resume", 0, FT_CLI_VALUE, OPT_RESUME},
    {"--dump-data", 0, FT_CLI_VALUE, OPT_DUMP_DATA},
    {"--config-reference", 0, FT_CLI_FLAG, OPT_CONFIG_REFERENCE},
    {"--print-config", 0, FT_CLI_FLAG, OPT_PRINT_CONFIG},
    {"--plan", 0, FT_CLI_COUNT, OPT_PLAN},
    {"--measure", 0, FT_CLI_FLAG, OPT_MEASURE},
    {"--get", 0, FT_CLI_VALUE, OPT_GET},
    {"--set", 0, FT_CLI_VALUE, OPT_SET},
    {"--set-var", 0, FT_CLI_VALUE, OPT_SET_VAR},
    {"--check", 0, FT_CLI_COUNT, OPT_CHECK},
    {NULL, 0, 0, 0},
};

int main(int argc, char **argv)
{
    ft_cpu_env_reexec(argv); /* a pool that sleeps while it waits; BLAS kernels for this CPU */
    const char *config_path = NULL, *dump = NULL, *resume = NULL;
    bool print_config = false, measure = false;
    int plan_world = 0;  /* --plan: > 0 */
    int check_world = 0; /* --check: > 0 */
    /* the --set, --set-var and --get arguments, in order (fewer than argc of each) */
    const char **sets = calloc((size_t)argc, sizeof *sets);
    const char **vars = calloc((size_t)argc, sizeof *vars);
    const char **gets = calloc((size_t)argc, sizeof *gets);
    int n_sets = 0, n_vars = 0, n_gets = 0;
    if (!sets || !vars || !gets)
        return fail("out of memory");
    ft_cli_parser cli;
    ft_cli_init(&cli, argc, argv, options, 0);
    for (int opt; (opt = ft_cli_next(&cli)) != FT_CLI_END;) {
        long n;
        switch (opt) {
        case OPT_HELP:
            fputs(usage, stdout);
            return 0;
        case OPT_CONFIG:
            config_path = cli.value;
            break;
        case OPT_RESUME:
            resume = cli.value;
            break;
        case OPT_DUMP_DATA:
            dump = cli.value;
            break;
        case OPT_CONFIG_REFERENCE:
            ft_run_config_write_reference(stdout);
            return 0;
        case OPT_PRINT_CONFIG:
            print_config = true;
            break;
        case OPT_PLAN:
            n = 1; /* a bare --plan: one rank */
            if (cli.value && ft_parse_long(cli.value, 1, INT_MAX, &n))
                return ft_cli_usage_error("ft-train", usage, "--plan: '%s' is not an integer >= 1",
                                          cli.value);
            plan_world = (int)n;
            break;
        case OPT_CHECK:
            n = 1; /* a bare --check: one rank */
            if (cli.value && ft_parse_long(cli.value, 1, INT_MAX, &n))
                return ft_cli_usage_error("ft-train", usage,
                                          "--check: '%s' is not an integer >= 1", cli.value);
            check_world = (int)n;
            break;
        case OPT_MEASURE:
            measure = true;
            break;
        case OPT_GET:
            gets[n_gets++] = cli.value; /* printed after the overrides, below */
            break;
        case OPT_SET:
            sets[n_sets++] = cli.value; /* applied after the file, below */
            break;
        case OPT_SET_VAR:
            vars[n_vars++] = cli.value;
            break;
        default: /* an unknown option, a missing value or an argument: one message */
            return ft_cli_usage_error("ft-train", usage, "unknown or incomplete option '%s'",
                                      cli.arg);
        }
    }
    if (!config_path) {
        fprintf(stderr, "ft-train: error: --config is required\n%s", usage);
        return 2;
    }
    if (measure && resume) {
        fprintf(stderr, "ft-train: error: --measure runs one step from the start; it does not "
                        "take --resume\n");
        return 2;
    }
    if (measure && plan_world > 1 && plan_world != launch_world()) {
        fprintf(stderr,
                "ft-train: error: --plan %d --measure: the measurement runs on the ranks of the "
                "launch (%d here); start %d of them: mpirun -np %d ft-train ... --plan "
                "--measure (make memory-check NUM_GPUS=%d)\n",
                plan_world, launch_world(), plan_world, plan_world, plan_world);
        return 2;
    }
    ft_err err;
    /* the file, the --set-var overrides, then the --set ones, each in command-line order,
     * then a DeepSpeed-style JSON on top (only rank 0 prints its notices) */
    ft_config_sources src = {.yaml_path = config_path,
                             .vars = vars, .n_vars = (size_t)n_vars,
                             .sets = sets, .n_sets = (size_t)n_sets,
                             .notes = secondary_rank() ? NULL : stderr,
                             .deepspeed_notes = secondary_rank() ? NULL : stderr};
    ft_run_config *cfg = malloc(sizeof *cfg);
    if (!cfg)
        return fail("out of memory");
    int rc = 0;
    if (ft_run_config_load(cfg, &src, &err)) {
        rc = fail(err.msg);
        goto done;
    }
    if (check_world > 0) {
        if (ft_run_check(cfg, check_world, &err))
            rc = fail(err.msg);
        else
            printf("%s: ready for %d rank%s\n", config_path, check_world,
                   check_world == 1 ? "" : "s");
    } else if (n_gets) {
        for (int i = 0; i < n_gets && rc == 0; i++)
            rc = get_value(cfg, gets[i]);
    } else if (measure) {
        rc = train(cfg, NULL, true);
    } else if (plan_world > 0) {
        /* an auto batch that cannot be resolved here (nothing fits this machine) still
         * gets its plan, for a micro-batch of 1 */
        ft_memplan_result plan;
        if (ft_memory_budget_check(&cfg->train, &err)) {
            rc = fail(err.msg);
        } else {
            if (ft_resolve_batch(cfg, NULL, plan_world, stderr, NULL, &err))
                fprintf(stderr, "note: %s\n", err.msg);
            if (ft_memplan_config(cfg, plan_world, &plan, &err))
                rc = fail(err.msg);
            else
                ft_memplan_print(&plan, stdout);
            if (rc == 0 && ft_memplan_compare_modes(cfg, plan_world, stdout, &err))
                rc = fail(err.msg);
        }
    } else if (print_config) {
        rc = print_resolved(cfg);
    } else if (dump) {
        rc = dump_data(cfg, dump);
    } else {
        rc = train(cfg, resume, false);
    }
done:
    free(cfg);
    free(sets);
    free(vars);
    free(gets);
    return rc;
}
