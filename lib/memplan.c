/* The memory planner (see memplan.h for the formulas). The cpu-fp32 row mirrors
 * lib/model.c buffer by buffer: build_layout (parameters), assign_buffers (weights,
 * gradients), model_reserve_activations / alloc_layer_set (activations, backward
 * scratch) and lib/optim.c (AdamW m and v). A change there must be mirrored here; the
 * unit test fails otherwise. */
#include "memplan.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "lora.h"
#include "model_path.h"

enum { MODE_FULL, MODE_LORA, MODE_QLORA };

/* Element counts of the activation and scratch buffers, by storage class. */
typedef struct act_counts {
    size_t tensor; /* h bytes on a GPU */
    size_t stat;   /* fp32 everywhere: rstd, lse */
    size_t logits; /* fp32 everywhere */
    size_t ints;   /* int32 */
} act_counts;

static size_t act_bytes(const act_counts *a, size_t h)
{
    return a->tensor * h + (a->stat + a->logits + a->ints) * 4;
}

typedef struct planner {
    const ft_model_config *mc;
    int mode;
    size_t h;       /* GPU compute bytes per parameter / gradient / activation */
    size_t k;       /* GPU optimizer bytes per trainable parameter */
    size_t N;       /* world size */
    ft_memplan_result *r;
    /* per unit (0..L+1): trainable parameters, frozen bytes at GPU precision, and the
     * FSDP flat-parameter numbers */
    size_t *unit_train, *unit_frozen_bytes;
    /* a quantized base (qlora, or a checkpoint quantized already): the format, the
     * modules left dense, and per unit the elements of its quantized weights (the
     * dequantization window holds one unit's) */
    ft_quant_options quant;
    const char *quant_skip;
    size_t *unit_quantized;
} planner;

static size_t ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }

/* One parameter tensor, as build_layout lists it. */
static void add_tensor(planner *p, int unit, size_t numel, bool trainable, bool quant,
                       int64_t rows, int64_t cols)
{
    ft_memplan_result *r = p->r;
    ft_memplan_row *row = r->rows;
    size_t h = p->h, k = p->k, N = p->N, shard = ceil_div(numel, N);
    if (trainable) {
        r->n_trainable += numel;
        p->unit_train[unit] += numel;
        row[FT_PLAN_CPU].bytes[FT_MEM_WEIGHTS] += 4 * numel;
        row[FT_PLAN_CPU].bytes[FT_MEM_GRADS] += 4 * numel;
        row[FT_PLAN_CPU].bytes[FT_MEM_OPTIM] += 8 * numel;
        for (int i = FT_PLAN_GPU_1; i <= FT_PLAN_GPU_ZERO3; i++) {
            bool shard_w = i == FT_PLAN_GPU_ZERO3;
            bool shard_g = i >= FT_PLAN_GPU_ZERO2;
            bool shard_o = i >= FT_PLAN_GPU_ZERO1;
            row[i].bytes[FT_MEM_WEIGHTS] += h * (shard_w ? shard : numel);
            row[i].bytes[FT_MEM_GRADS] += h * (shard_g ? shard : numel);
            row[i].bytes[FT_MEM_OPTIM] += k * (shard_o ? shard : numel);
        }
        /* FSDP: per unit, below */
    } else {
        size_t qb = quant ? ft_quant_size(&p->quant, rows, cols) : 0;
        size_t fb = quant ? qb : h * numel;
        r->n_frozen += numel;
        if (quant) {
            r->n_quantized += numel;
            r->quant_bytes += qb;
            p->unit_quantized[unit] += numel;
        }
        p->unit_frozen_bytes[unit] += fb;
        row[FT_PLAN_CPU].bytes[FT_MEM_WEIGHTS] += quant ? qb : 4 * numel;
        for (int i = FT_PLAN_GPU_1; i <= FT_PLAN_GPU_ZERO3; i++)
            row[i].bytes[FT_MEM_WEIGHTS] += i == FT_PLAN_GPU_ZERO3 ? ceil_div(fb, N) : fb;
    }
}

/* Mirrors build_layout in lib/model.c. */
static void count_params(planner *p, const unsigned *lora_mask, int r_lora)
{
    const ft_model_config *c = p->mc;
    bool full = p->mode == MODE_FULL;
    size_t L = (size_t)c->num_layers, C = (size_t)c->hidden_size, V = (size_t)c->vocab_size;
    add_tensor(p, 0, V * C, full, false, 0, 0);
    for (size_t l = 0; l < L; l++) {
        int unit = (int)l + 1;
        add_tensor(p, unit, C, full, false, 0, 0); /* input_layernorm */
        add_tensor(p, unit, C, full, false, 0, 0); /* post_attention_layernorm */
        for (int j = 0; j < FT_NPROJ; j++) {
            int q = c->num_heads * c->head_dim, kv = c->num_kv_heads * c->head_dim;
            int in, out;
            bool bias;
            switch ((ft_proj)j) {
            case FT_PROJ_Q: in = c->hidden_size; out = q; bias = c->qkv_bias; break;
            case FT_PROJ_K:
            case FT_PROJ_V: in = c->hidden_size; out = kv; bias = c->qkv_bias; break;
            case FT_PROJ_O: in = q; out = c->hidden_size; bias = c->o_bias; break;
            case FT_PROJ_GATE:
            case FT_PROJ_UP: in = c->hidden_size; out = c->intermediate_size; bias = c->mlp_bias; break;
            default: in = c->intermediate_size; out = c->hidden_size; bias = c->mlp_bias; break;
            }
            char path[160];
            snprintf(path, sizeof path, "model.layers.%zu.%s", l, ft_proj_path((ft_proj)j));
            bool quant = p->quant.type != FT_QUANT_NONE && !ft_quant_skipped(p->quant_skip, path);
            add_tensor(p, unit, (size_t)out * (size_t)in, full, quant, out, in);
            if (bias)
                add_tensor(p, unit, (size_t)out, full, false, 0, 0);
            if (!full && (lora_mask[l] & (1u << j))) {
                add_tensor(p, unit, (size_t)r_lora * (size_t)in, true, false, 0, 0);  /* A */
                add_tensor(p, unit, (size_t)out * (size_t)r_lora, true, false, 0, 0); /* B */
            }
        }
    }
    add_tensor(p, (int)L + 1, C, full, false, 0, 0); /* model.norm */
    if (!c->tie_word_embeddings)
        add_tensor(p, (int)L + 1, V * C, full, false, 0, 0);
}

/* Mirrors model_reserve_activations / alloc_layer_set for N rows while training.
 * *act: the activations category, *ws: the workspace category. */
static void count_activations(const ft_model_config *c, size_t N, bool grad_ckpt, bool lora,
                              int r_lora, unsigned lora_union, bool lora_dropout,
                              act_counts *act, act_counts *ws)
{
    size_t L = (size_t)c->num_layers, C = (size_t)c->hidden_size;
    size_t I = (size_t)c->intermediate_size, V = (size_t)c->vocab_size;
    size_t QD = (size_t)c->num_heads * (size_t)c->head_dim;
    size_t KD = (size_t)c->num_kv_heads * (size_t)c->head_dim;
    memset(act, 0, sizeof *act);
    memset(ws, 0, sizeof *ws);

    /* one layer set: ln1, q, k, v, att, mid, ln2, gate, up, act (+ lora_h), rstd1, rstd2,
     * lse */
    act_counts set = {0};
    set.tensor = N * C * 3 + N * QD * 2 + N * KD * 2 + N * I * 3;
    set.stat = N * 2 + N * (size_t)c->num_heads;
    if (lora)
        for (int j = 0; j < FT_NPROJ; j++)
            if (lora_union & (1u << j))
                set.tensor += N * (size_t)r_lora;
    size_t n_sets = grad_ckpt ? 1 : L;
    act->tensor = L * N * C /* every layer's input */ + n_sets * set.tensor;
    act->stat = n_sets * set.stat;
    act->tensor += 2 * N * C; /* final_in, lnf */
    act->stat += N;           /* rstdf */
    act->logits = N * V;
    act->ints = 4 * N; /* ids, targets, pos, seg */

    ws->tensor = 2 * N * C + 2 * N * QD + 2 * N * KD + 3 * N * I; /* d_h d_ln d_att d_q d_k
                                                                     d_v d_act d_gate d_up */
    if (lora) {
        ws->tensor += N * (size_t)r_lora; /* d_lora_h */
        if (lora_dropout) {
            size_t w = C > I ? (C > QD ? C : QD) : (I > QD ? I : QD);
            ws->tensor += N * w; /* x_drop */
        }
    }
}

static ft_plan_row_id selected_row(const ft_config *cfg, int world_size)
{
    const char *s = ft_config_str(cfg, "dist.strategy");
    if (!strcmp(s, "none"))
        return FT_PLAN_GPU_1;
    if (!strcmp(s, "auto"))
        return world_size > 1 ? FT_PLAN_GPU_DDP : FT_PLAN_GPU_1;
    if (!strcmp(s, "fsdp"))
        return FT_PLAN_GPU_FSDP;
    if (!strcmp(s, "zero")) {
        long st = ft_config_int(cfg, "dist.zero_stage");
        return st >= 3   ? FT_PLAN_GPU_ZERO3
               : st == 2 ? FT_PLAN_GPU_ZERO2
               : st == 1 ? FT_PLAN_GPU_ZERO1
                         : FT_PLAN_GPU_DDP;
    }
    return FT_PLAN_GPU_DDP;
}

/* base_q: the checkpoint's own quantization_config (NULL or not present: a dense
 * checkpoint, quantized on load when tuning.mode is qlora). */
static int plan(const ft_config *cfg, const ft_model_config *mc, const ft_quant_config *base_q,
                int world_size, ft_memplan_result *out, ft_err *err)
{
    memset(out, 0, sizeof *out);
    if (world_size < 1)
        return ft_fail(err, "memory plan: world size must be >= 1 (got %d)", world_size);
    ft_memplan_result *r = out;
    const char *mode = ft_config_str(cfg, "tuning.mode");
    snprintf(r->mode, sizeof r->mode, "%s", mode);
    snprintf(r->model_type, sizeof r->model_type, "%s", mc->model_type);
    r->num_layers = mc->num_layers;
    r->world_size = world_size;
    r->batch_auto = ft_config_is_auto(cfg, "train.batch_size");
    r->batch_size = r->batch_auto ? 1 : (int)ft_config_int(cfg, "train.batch_size");
    r->seq_len = (int)ft_config_int(cfg, "model.max_seq_len");
    r->grad_ckpt = ft_config_bool(cfg, "train.gradient_checkpointing");
    r->half = ft_config_bool(cfg, "train.bf16") || ft_config_bool(cfg, "train.fp16");
    if (r->batch_size < 1 || r->seq_len < 1)
        return ft_fail(err, "memory plan: train.batch_size and model.max_seq_len must be >= 1");

    int pmode = !strcmp(mode, "full") ? MODE_FULL : !strcmp(mode, "qlora") ? MODE_QLORA
                                                                             : MODE_LORA;
    bool lora = pmode != MODE_FULL;
    ft_quant_options quant = {FT_QUANT_NONE, 64, false};
    const char *quant_skip = "";
    if (base_q && base_q->present) {
        quant = base_q->opt;
        quant_skip = base_q->skip;
    } else if (pmode == MODE_QLORA) {
        if (ft_quant_parse(ft_config_str(cfg, "tuning.quant.type"), &quant.type, err))
            return ft_fail_prefix(err, "config: key 'tuning.quant.type'");
        quant.blocksize = (int)ft_config_int(cfg, "tuning.quant.blocksize");
        quant.double_quant = ft_config_bool(cfg, "tuning.quant.double_quant");
        quant_skip = ft_config_str(cfg, "tuning.quant.skip_modules");
    }
    if (quant.type != FT_QUANT_NONE)
        snprintf(r->quant, sizeof r->quant, "%s%s", ft_quant_name(quant.type),
                 quant.double_quant && quant.type != FT_QUANT_INT8 ? "+dq" : "");

    /* LoRA as the trainer sets it up (lib/trainer.c setup_model, lib/model.c setup_lora) */
    ft_lora_config lc = {0};
    unsigned *mask = calloc((size_t)mc->num_layers ? (size_t)mc->num_layers : 1, sizeof *mask);
    unsigned lora_union = 0;
    if (!mask)
        return ft_fail(err, "out of memory");
    if (lora) {
        lc.r = (int)ft_config_int(cfg, "tuning.lora.r");
        lc.dropout = (float)ft_config_float(cfg, "tuning.lora.dropout");
        if (lc.r <= 0 || lc.dropout < 0 || lc.dropout >= 1) {
            free(mask);
            return ft_fail(err, "config: tuning.lora.r must be > 0 and tuning.lora.dropout in "
                                "[0, 1) (got %d, %g)",
                           lc.r, lc.dropout);
        }
        if (ft_lora_targets_parse(ft_config_str(cfg, "tuning.lora.target_modules"), &lc.targets,
                                  err)) {
            free(mask);
            return ft_fail_prefix(err, "config: key 'tuning.lora.target_modules'");
        }
        for (int l = 0; l < mc->num_layers; l++) {
            if (ft_lora_layer_mask(&lc, l, &mask[l], err)) {
                free(mask);
                return ft_fail_prefix(err, "config: key 'tuning.lora.target_modules'");
            }
            lora_union |= mask[l];
        }
        if (!lora_union) {
            free(mask);
            return ft_fail(err, "config: tuning.lora.target_modules selects no linear layer of "
                                "this model");
        }
    }

    size_t n_units = (size_t)mc->num_layers + 2;
    size_t *unit_buf = calloc(3 * n_units, sizeof *unit_buf);
    if (!unit_buf) {
        free(mask);
        return ft_fail(err, "out of memory");
    }
    planner p = {.mc = mc,
                 .mode = pmode,
                 .h = r->half ? 2 : 4,
                 .k = r->half ? 12 : 8,
                 .N = (size_t)world_size,
                 .r = r,
                 .unit_train = unit_buf,
                 .unit_frozen_bytes = unit_buf + n_units,
                 .quant = quant,
                 .quant_skip = quant_skip,
                 .unit_quantized = unit_buf + 2 * n_units};

    static const char *names[FT_PLAN_NROWS] = {"cpu-fp32",  "gpu-1",     "gpu-ddp",  "gpu-zero1",
                                               "gpu-zero2", "gpu-zero3", "gpu-fsdp"};
    for (int i = 0; i < FT_PLAN_NROWS; i++) {
        r->rows[i].name = names[i];
        r->rows[i].predicted = i != FT_PLAN_CPU;
        r->rows[i].world_size = i == FT_PLAN_CPU || i == FT_PLAN_GPU_1 ? 1 : world_size;
    }
    count_params(&p, mask, lc.r);

    /* FSDP: per unit flat parameters, each padded to a multiple of N */
    size_t N = p.N, h = p.h;
    size_t max_unit_g = 0, max_unit_pg = 0;
    for (size_t u = 0; u < n_units; u++) {
        size_t t = ceil_div(p.unit_train[u], N);
        ft_memplan_row *f = &r->rows[FT_PLAN_GPU_FSDP];
        f->bytes[FT_MEM_WEIGHTS] += 4 * t + ceil_div(p.unit_frozen_bytes[u], N);
        f->bytes[FT_MEM_GRADS] += 4 * t;
        f->bytes[FT_MEM_OPTIM] += 8 * t;
        size_t g = h * p.unit_train[u];
        size_t pg = 2 * (h * p.unit_train[u] + p.unit_frozen_bytes[u]) + g;
        if (g > max_unit_g)
            max_unit_g = g;
        if (pg > max_unit_pg)
            max_unit_pg = pg;
    }

    /* activations and backward scratch */
    act_counts act, ws;
    count_activations(mc, (size_t)r->batch_size * (size_t)r->seq_len, r->grad_ckpt, lora, lc.r,
                      lora_union, lora && lc.dropout > 0, &act, &ws);
    for (int i = 0; i < FT_PLAN_NROWS; i++) {
        size_t eh = i == FT_PLAN_CPU ? 4 : h;
        r->rows[i].bytes[FT_MEM_ACTIVATIONS] = act_bytes(&act, eh);
        r->rows[i].bytes[FT_MEM_WORKSPACE] = act_bytes(&ws, eh);
    }
    /* a quantized base: one unit's weights dequantized at a time (model.c's window) */
    size_t max_unit_q = 0;
    for (size_t u = 0; u < n_units; u++)
        if (p.unit_quantized[u] > max_unit_q)
            max_unit_q = p.unit_quantized[u];
    for (int i = 0; i < FT_PLAN_NROWS; i++)
        r->rows[i].bytes[FT_MEM_WORKSPACE] += (i == FT_PLAN_CPU ? 4 : h) * max_unit_q;
    r->rows[FT_PLAN_GPU_ZERO2].bytes[FT_MEM_WORKSPACE] += max_unit_g;
    r->rows[FT_PLAN_GPU_ZERO3].bytes[FT_MEM_WORKSPACE] += max_unit_pg;
    r->rows[FT_PLAN_GPU_FSDP].bytes[FT_MEM_WORKSPACE] += max_unit_pg;

    for (int i = 0; i < FT_PLAN_NROWS; i++) {
        r->rows[i].total = 0;
        for (int c = 0; c < FT_MEM_NCAT; c++)
            r->rows[i].total += r->rows[i].bytes[c];
    }
    r->selected = selected_row(cfg, world_size);
    free(unit_buf);
    free(mask);
    return 0;
}

int ft_memplan_config(const ft_config *cfg, int world_size, ft_memplan_result *out,
                      ft_err *err)
{
    if (!ft_config_has(cfg, "model.name"))
        return ft_fail(err, "config: key 'model.name' is required (a Hugging Face model dir)");
    char dir[4096], path[4200];
    if (ft_resolve_model_dir(ft_config_str(cfg, "model.name"), dir, sizeof dir, err))
        return -1;
    snprintf(path, sizeof path, "%s/config.json", dir);
    ft_model_config mc;
    if (ft_model_config_load(&mc, path, err))
        return -1;
    ft_quant_config qc;
    if (ft_quant_config_read(path, &qc, err))
        return -1;
    return plan(cfg, &mc, &qc, world_size, out, err);
}

int ft_memplan(const ft_config *cfg, const ft_model_config *mc, int world_size,
               ft_memplan_result *out, ft_err *err)
{
    return plan(cfg, mc, NULL, world_size, out, err);
}

static double mib(size_t b) { return (double)b / (1024.0 * 1024.0); }

void ft_memplan_print(const ft_memplan_result *r, FILE *out)
{
    char base[64] = "";
    if (r->quant[0])
        snprintf(base, sizeof base, " (%zu in %s)", r->n_quantized, r->quant);
    fprintf(out,
            "memory plan: %s, %s %d layers, %zu trainable + %zu frozen%s parameters, "
            "%d x %d tokens per rank%s, gradient checkpointing %s\n",
            r->mode, r->model_type, r->num_layers, r->n_trainable, r->n_frozen, base, r->batch_size,
            r->seq_len, r->batch_auto ? " (batch_size auto: planned for 1)" : "",
            r->grad_ckpt ? "on" : "off");
    fprintf(out, "%-11s %5s %11s %11s %11s %11s %11s %11s  %s\n", "strategy", "ranks",
            "weights", "gradients", "optimizer", "activations", "workspace", "total", "MiB/rank");
    for (int i = 0; i < FT_PLAN_NROWS; i++) {
        const ft_memplan_row *w = &r->rows[i];
        char name[16];
        snprintf(name, sizeof name, "%s%s", w->name, i == (int)r->selected ? "*" : "");
        fprintf(out, "%-11s %5d", name, w->world_size);
        for (int c = 0; c < FT_MEM_NCAT; c++)
            fprintf(out, " %11.1f", mib(w->bytes[c]));
        fprintf(out, " %11.1f  %s\n", mib(w->total),
                w->predicted ? (r->half ? "predicted, 16-bit" : "predicted, fp32") : "exact");
    }
    fprintf(out,
            "cpu-fp32 is the engine of today (what the allocator measures); gpu-* are "
            "predictions for backends not built yet, without CUDA context and library "
            "workspaces; * = the row dist.strategy selects.\n");
    if (r->note[0])
        fprintf(out, "note: %s\n", r->note);
}

int ft_memplan_compare_modes(ft_config *cfg, int world_size, FILE *out, ft_err *err)
{
    char mode[16];
    snprintf(mode, sizeof mode, "%s", ft_config_str(cfg, "tuning.mode"));
    static const char *const modes[] = {"full", "lora", "qlora"};
    ft_memplan_result r[3];
    int rc = 0;
    for (int i = 0; i < 3 && rc == 0; i++)
        rc = ft_config_set_key(cfg, "tuning.mode", modes[i], "memory plan", NULL, err) ||
             ft_memplan_config(cfg, world_size, &r[i], err);
    if (ft_config_set_key(cfg, "tuning.mode", mode, "memory plan", NULL, err) || rc)
        return -1;
    const ft_memplan_row *sel = &r[0].rows[r[0].selected];
    fprintf(out, "by tuning mode (this model, batch and strategy; MiB per rank):\n");
    fprintf(out, "%-6s %12s %12s %12s %12s  %s\n", "mode", "trainable", "base", "cpu-fp32",
            sel->name, "quantized base");
    for (int i = 0; i < 3; i++) {
        char q[64] = "-";
        if (r[i].n_quantized)
            snprintf(q, sizeof q, "%s, %.3f B/param", r[i].quant,
                     (double)r[i].quant_bytes / (double)r[i].n_quantized);
        fprintf(out, "%-6s %12zu %12zu %12.1f %12.1f  %s%s\n", modes[i], r[i].n_trainable,
                r[i].n_frozen, mib(r[i].rows[FT_PLAN_CPU].total),
                mib(r[i].rows[r[i].selected].total), q,
                !strcmp(modes[i], "full") && r[i].n_quantized
                    ? " (full mode cannot train a quantized checkpoint)"
                    : "");
    }
    return 0;
}
