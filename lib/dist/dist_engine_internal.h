/* The inside of ft_engine, shared by dist_engine.c (setup, the step, checkpoints),
 * dist_dp.c (DDP and ZeRO hooks) and dist_pipeline.c (layer-split stages). */
#ifndef FT_DIST_ENGINE_INTERNAL_H
#define FT_DIST_ENGINE_INTERNAL_H

#include <stdio.h>

#include "dist/dist_engine.h"
#include "quant/quant_shard.h"
#include "train/optim.h"

/* zero3 / fsdp: a gathered unit (its trainable and frozen parameters). */
typedef struct param_window {
    int unit;           /* -1: empty */
    int refs;           /* acquired and not yet released */
    long last_use;
    float *train, *frozen;
    ft_comm_req *req_t, *req_f; /* the gather in flight (NULL when done) */
    size_t *counts_t, *counts_f; /* [world]: kept alive while the gather runs */
    unsigned char *quant; /* a quantized base: the unit's gathered arrays (qshard_param) */
    ft_comm_req **req_q;  /* [max_q_arrays]: their gathers in flight */
    int n_req_q;
} param_window;

/* zero3 / fsdp of a quantized base (dist_qshard.c): one quantized weight, sharded by
 * whole blocks (quant/quant_shard.h). Each array of it is gathered whole into a unit's
 * quant window at win_off[a]; this rank keeps its range of every array back to back in
 * the engine's qshard buffer from shard_off. */
typedef struct qshard_param {
    size_t param;             /* the model's parameter index */
    int unit;
    ft_qtensor meta;          /* type, shape, blocks, nested offset; no arrays */
    int n_arrays;
    size_t win_off[FT_QSHARD_MAX_ARRAYS];
    size_t shard_off;
    size_t *counts;           /* [n_arrays * world]: each rank's bytes of each array */
    float *map;               /* nested: the 256-value map, then the nested absmax (the
                               * same on every rank) */
} qshard_param;

/* zero2 / zero3: a unit's gradient before it is reduce-scattered into the shard. */
typedef struct grad_window {
    float *grad;        /* the unit's gradient (model binds it) */
    float *land;        /* reduce-scatter result, added into the shard gradient */
    float *dst;         /* where land goes in shard_grad */
    size_t n;           /* elements of land */
    ft_comm_req *req;
    size_t *counts;     /* [world] */
} grad_window;

/* ddp / zero1: consecutive units whose gradients travel together. */
typedef struct bucket {
    size_t begin, end;  /* range of the flat trainable buffer */
    int units_left;     /* units with trainables still in backward this micro-batch */
    int units;          /* units with trainables */
    ft_comm_req *req;
    size_t *counts;     /* [world] (zero1) */
} bucket;

struct ft_engine {
    ft_comm *comm;
    int rank, world;
    ft_dist_options o;
    ft_model *m;
    ft_mem *mem;  /* the model's allocator: this rank's device memory */
    ft_device dev; /* the model's device: where train, grad, frozen and the shards live */
    /* The model's compute dtype: frozen buffers, windows of gathered parameters and the
     * compute copies of trainables hold it (bf16 on a bf16 GPU model, else fp32);
     * ccomm is the same as a collective's dtype. split_compute: the compute copies are
     * buffers of their own beside the fp32 masters (a bf16 model; FT_DIST_SPLIT_COMPUTE=1
     * does it in fp32 too, so the CPU ranks test when the copies are refreshed). */
    ft_dtype cdt;
    size_t cesize;
    ft_comm_dtype ccomm;
    bool split_compute;
    /* zero1 / zero2 in bf16: after the step each rank sends the others the bf16 copy of its
     * shard, not the fp32 master (half the bytes); the fp32 masters of the other ranks'
     * shards are then stale here (masters_stale) until a save gathers them. */
    bool gather_compute, masters_stale;
    /* none, ddp, zero1: a whole replica in the model's own buffers (train, grad and frozen
     * point into them; the model is loaded bound and keeps its compute copy). The other
     * strategies load the model unbound and bind it to buffers of their own. */
    bool whole;
    ft_mem host;  /* offloaded optimizer and parameters */
    int n_units;
    size_t n_train, n_frozen;
    size_t *ub, *fb; /* [n_units + 1]: unit ranges in the trainable / frozen buffers */

    /* who updates what: rank r owns [own[r], own[r + 1]) of the trainable buffer (ddp:
     * rank 0 owns all for the purpose of gathering) */
    size_t *own;
    size_t opt_begin, opt_end; /* the range this rank's optimizer updates */
    size_t *fshard; /* zero3: [world + 1] ranges of the frozen buffer */

    /* storage */
    float *train, *grad, *frozen; /* whole (ddp, zero1, zero2) or the stage's (pipeline);
                                   * frozen has the model's compute dtype */
    float *train_c;                    /* zero2, pipeline: compute copy of train */
    float *shard_train, *shard_frozen; /* zero3 */
    float *shard_train_c;              /* zero3: compute copy of shard_train (gathered) */
    /* zero3: a quantized base's shard (on the host with offload_params) */
    qshard_param *qp;                  /* [n_qp], by unit */
    int n_qp;
    int *qunit;                        /* [n_units + 1]: unit u's weights are qp[qunit[u]..] */
    unsigned char *qshard;             /* this rank's blocks of every quantized weight */
    size_t qshard_bytes;
    float *qmaps;                      /* the nested state (map, nested absmax) of each
                                        * double-quantized weight */
    size_t q_replicated;               /* its bytes */
    float *qcode;                      /* on a GPU: the 16 code values of the 4-bit format */
    size_t max_qwin;                   /* bytes of the largest unit's quant window */
    int max_q_arrays;                  /* arrays of the unit with most */
    float *shard_grad;                 /* zero1/2/3: this rank's summed gradient */
    ft_optimizer opt;                  /* over [own[rank], own[rank + 1]) */
    float *host_master, *host_grad;    /* offload: the shard on the host */

    /* zero3 windows */
    param_window *pw;
    int n_pw;
    long use_clock;
    size_t max_unit_train, max_unit_frozen;
    /* zero2/3 gradient windows (a ring) */
    grad_window gw[2];
    int next_gw;
    int *unit_gw; /* [n_units]: the window bound to a unit in backward, -1 none */
    /* ddp / zero1 */
    bucket *buckets;
    int n_buckets;
    int *unit_bucket; /* [n_units] */
    bool sync;        /* this micro-batch reduces gradients */

    /* pipeline */
    int stage_first, stage_last; /* this rank's units */
    int *stage_of_unit;
    float *tied_train, *tied_grad, *tied_frozen; /* last stage's copy of a tied embedding */
    float *tied_train_c;
    int loss_rank;

    /* the last step's profile (ft_engine_step_profile), and its FT_DIST_PROFILE file */
    double step_s;
    ft_comm_stats step_comm;
    FILE *profile;
    double rank_loss;

    /* LoRA's tied pair under ensure_weight_tying on a split step (dist_tied.c) */
    bool tied_pairs;
    ft_tied_pair tied[2];

    struct engine_ref *ref; /* DPO's kept reference adapter (dist_ref.c), or NULL */
};

/* Buffers on the engine's device (dist_engine.c). fp32: zeroed (n elements), dst += src.
 * engine_at: p + i elements of the compute dtype (NULL stays NULL). engine_alloc: n
 * elements of the compute dtype (cdt) or fp32, counted in cat; NULL for n == 0, else
 * NULL with *oom set when it does not fit. engine_compute_copy: a buffer for the
 * compute copy of n masters (the master itself unless split_compute).
 * engine_refresh_compute: every compute copy from its master, after the masters changed. */
void engine_zero(const ft_engine *e, float *p, size_t n);
void engine_add(const ft_engine *e, float *dst, const float *src, size_t n);
float *engine_at(const ft_engine *e, float *p, size_t i);
/* Copies the part of the flat range [b, end) that falls in [lo, hi) from src (element b at
 * src, on e->dev) to dst (element lo at dst, on dst_dev); esize bytes an element. */
int engine_copy_overlap(const ft_engine *e, void *dst, ft_device dst_dev, size_t lo, size_t hi,
                        const void *src, size_t b, size_t end, size_t esize, ft_err *err);
float *engine_alloc(ft_engine *e, ft_mem_cat cat, size_t n, bool cdt, bool *oom);
float *engine_compute_copy(ft_engine *e, float *master, size_t n, bool *oom);
void engine_free_compute_copy(ft_engine *e, float *master, float *copy);
void engine_refresh_compute(ft_engine *e);

/* dist_ref.c */
void engine_ref_free(ft_engine *e);

/* dist_dp.c */
int dp_setup(ft_engine *e, const char *adapter_dir, ft_err *err);
void dp_bind(ft_engine *e);
void dp_invalidate(ft_engine *e);
int dp_finish_grads(ft_engine *e, ft_err *err);
void dp_begin_step(ft_engine *e);
void dp_begin_micro(ft_engine *e, bool last);
/* The gradient and parameters of this rank's owned range. */
float *dp_owned_grad(ft_engine *e);
float *dp_owned_params(ft_engine *e);
void dp_free(ft_engine *e);

/* dist_qshard.c (zero3 / fsdp of a quantized base; no-ops without one). qs_setup lays
 * the weights out and allocates the shard; qs_take_unit keeps this rank's blocks of a
 * unit the model has just read and frees the model's copy; qs_gather starts gathering a
 * unit into a window, qs_wait finishes it; qs_lend lends the window's arrays to the
 * model; qs_forget takes them back (the window is about to hold another unit). */
int qs_setup(ft_engine *e, ft_err *err);
int qs_take_unit(ft_engine *e, int unit, ft_err *err);
int qs_gather(ft_engine *e, param_window *w, int unit, ft_err *err);
int qs_wait(ft_engine *e, param_window *w, ft_err *err);
void qs_lend(ft_engine *e, param_window *w);
void qs_forget(ft_engine *e, int unit);
void qs_free(ft_engine *e);
/* The memory a rank's shard of the frozen base lives in: the host context with
 * dist.offload_params cpu, else the engine's device. */
ft_mem *engine_param_mem(ft_engine *e);
ft_device engine_param_dev(const ft_engine *e);
/* Page-locks / unlocks an offloaded parameter shard on a GPU engine (no-ops otherwise). */
int engine_pin_params(ft_engine *e, void *p, size_t bytes, ft_err *err);
void engine_unpin_params(ft_engine *e, void *p);

/* dist_tied.c: the tied LoRA pair (lib/model/tied_lora.c) on a strategy whose optimizer
 * steps part of it, or offloaded. tied_setup decides (tied_pairs); tied_setup_sync makes
 * the embedding's pair the head's transposed (params: the owned fp32 masters, flat
 * [opt_begin, opt_end); held: the elements this rank holds, flat [lo, hi)); around the
 * optimizer step, tied_zero_heads (params on dev) and tied_after_step (collective). */
int tied_setup(ft_engine *e, ft_err *err);
int tied_setup_sync(ft_engine *e, float *params, float *held, size_t lo, size_t hi,
                    ft_err *err);
void tied_zero_heads(ft_engine *e, float *params, ft_device dev);
int tied_after_step(ft_engine *e, float *params, float lr, ft_err *err);

/* dist_pipeline.c */
int pipe_setup(ft_engine *e, const char *adapter_dir, ft_err *err);
void pipe_bind(ft_engine *e);
int pipe_finish_grads(ft_engine *e, ft_err *err);
int pipe_after_update(ft_engine *e, ft_err *err);
void pipe_free(ft_engine *e);

/* Whether a rank's ranges [a, b) and [c, d) overlap, and the overlap's length. */
static inline size_t overlap_len(size_t a, size_t b, size_t c, size_t d)
{
    size_t lo = a > c ? a : c, hi = b < d ? b : d;
    return hi > lo ? hi - lo : 0;
}

#endif
