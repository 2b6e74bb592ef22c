/* DPO on the GPU (train/pref.h, model.h's per-row forward and backward): the same tiny LoRA
 * model on the GPU (fp32 and bf16) against the CPU, for the whole-head and the chunked head
 * (a chunk of 5 rows cuts the batch rows, so a row's log-probability is summed over two
 * chunks and its gradient scale applies in both):
 *
 * - each row's summed token loss (ft_model_forward_rows), with the adapter on and off;
 * - one step of the DPO objective (reference with the adapter off, then the policy's
 *   forward and backward): the loss and every LoRA gradient;
 * - the same with the reference as the starting adapter (ft_pref_objective_keep_adapter:
 *   the adapter copied and swapped on the device): at the start the loss is log 2 and
 *   the LoRA weights are back in place after the step;
 * - ORPO's step (each row's head losses split where its completion starts).
 * The per-row path calls the cross-entropy op on slices of the head's buffer, so the CUDA
 * kernels are those of test_cuda_ops; this checks their use here. */
#include <math.h>

#include "gpu_check.h"
#include "tiny_model.h"

#include "model/model.h"
#include "train/pref.h"

static char root[64];
enum { P = 2, R = 2 * P, T = 6 };
static int32_t ids[R * T] = {1, 5, 9, 3, 30, 2,  7, 7, 0, 31, 12, 4,
                             1, 5, 9, 8, 8, 21,  7, 7, 0, 14, 3, 3};
static int32_t labels[R * T] = {-100, -100, -100, 3, 30, 2,   -100, -100, 0, 31, 12, -100,
                                -100, -100, -100, 8, 8, 21,   -100, -100, 0, 14, 3, -100};

static ft_model *load(const char *dir, ft_device dev, ft_dtype dt, int chunk)
{
    ft_model_options o = {.mode = FT_TRAIN_LORA, .seed = 5, .device = dev, .dtype = dt,
                          .loss_chunk_rows = chunk};
    o.lora = (ft_lora_config){.r = 2, .alpha = 4, .targets = FT_LORA_ALL_LINEAR};
    ft_model *m = NULL;
    ft_err err = {0};
    if (ft_model_load(&m, dir, &o, &err))
        fprintf(stderr, "  load: %s\n", err.msg);
    CHECK(m != NULL);
    for (size_t i = 0; m && i < ft_model_param_count(m); i++) { /* B != 0 */
        ft_param *p = ft_model_param(m, i);
        if (!strstr(p->name, "lora_B"))
            continue;
        float *v = host_alloc(p->numel);
        for (size_t j = 0; j < p->numel; j++)
            v[j] = 0.5f * (ft_uniform(77 + i, j) - 0.5f);
        CHECK(ft_model_param_set(m, p, v, &err) == 0);
        free(v);
    }
    return m;
}

typedef struct result {
    double nll_on[R], nll_off[R], loss;
    float *grads[64];
    size_t n_grads;
} result;

/* keep 0: DPO with the adapter off as the reference; 1: with the starting adapter; 2:
 * ORPO (no reference; each row's head losses split at its completion) */
static void run(ft_model *m, int keep, result *r)
{
    bool keep_adapter = keep == 1;
    ft_batch b = {R, T, ids, labels, NULL, NULL};
    ft_err err = {0};
    memset(r, 0, sizeof *r);
    CHECK(ft_model_forward_rows(m, &b, r->nll_on, &err) == 0);
    CHECK(ft_model_set_adapter(m, false, &err) == 0);
    CHECK(ft_model_forward_rows(m, &b, r->nll_off, &err) == 0);
    CHECK(ft_model_set_adapter(m, true, &err) == 0);
    ft_pref_objective po;
    ft_pref_options o = {.beta = 0.5, .loss = keep == 2 ? FT_PREF_ORPO : FT_PREF_SIGMOID};
    ft_pref_objective_init(&po, &o, NULL);
    if (keep_adapter)
        CHECK(ft_pref_objective_keep_adapter(&po, m, &err) == 0);
    ft_objective obj = ft_pref_objective_of(&po);
    ft_model_zero_grad(m);
    CHECK(obj.run(obj.ctx, m, &b, obj.count(obj.ctx, &b), &r->loss, &err) == 0);
    for (size_t i = 0; i < ft_model_param_count(m) && r->n_grads < 64; i++) {
        ft_param *p = ft_model_param(m, i);
        if (!p->grad)
            continue;
        float *g = host_alloc(p->numel);
        CHECK(ft_model_grad_get(m, p, g, &err) == 0);
        r->grads[r->n_grads++] = g;
    }
    ft_pref_objective_free(&po);
}

static void free_result(result *r)
{
    for (size_t i = 0; i < r->n_grads; i++)
        free(r->grads[i]);
}

static void check_rows(const char *what, const double *got, const double *want, double tol)
{
    float g[R], w[R];
    for (int i = 0; i < R; i++)
        g[i] = (float)got[i], w[i] = (float)want[i];
    CHECK_REL(what, g, w, R, tol);
}

static void test_dpo_on_device(void)
{
    char dir[128];
    snprintf(dir, sizeof dir, "%s/tiny", root);
    tiny_model_opts to = {0};
    write_tiny_model(dir, &to);
    static const int chunks[2] = {0, 5};
    for (int ki = 0; ki < 2; ki++)
        for (int keep = 0; keep < 3; keep++) {
            ft_model *cpu = load(dir, FT_DEV_CPU, FT_F32, chunks[ki]);
            if (!cpu)
                return;
            result ref;
            run(cpu, keep, &ref);
            CHECK(ref.nll_on[0] != ref.nll_off[0]); /* the adapter matters */
            if (keep == 1) /* the reference is the policy itself: d = 0 */
                CHECK(fabs(ref.loss - P * log(2.0)) < 1e-6);
            for (int di = 0; di < 2; di++) {
                ft_dtype d = di ? FT_BF16 : FT_F32;
                ft_model *m = load(dir, FT_DEV_CUDA, d, chunks[ki]);
                if (!m)
                    continue;
                double tol = d == FT_F32 ? 1e-5 : 2e-2, gtol = d == FT_F32 ? 1e-4 : 5e-2;
                result r;
                run(m, keep, &r);
                char what[128];
                snprintf(what, sizeof what, "row nll chunk %d %s", chunks[ki], dtype_name(d));
                check_rows(what, r.nll_on, ref.nll_on, tol);
                snprintf(what, sizeof what, "row nll adapter off chunk %d %s", chunks[ki],
                         dtype_name(d));
                check_rows(what, r.nll_off, ref.nll_off, tol);
                float lg = (float)r.loss, lw = (float)ref.loss;
                snprintf(what, sizeof what, "dpo loss chunk %d keep %d %s", chunks[ki], keep,
                         dtype_name(d));
                CHECK_REL(what, &lg, &lw, 1, tol);
                CHECK(r.n_grads == ref.n_grads && r.n_grads > 0);
                for (size_t i = 0, k = 0; i < ft_model_param_count(m) && k < r.n_grads; i++) {
                    ft_param *p = ft_model_param(m, i);
                    if (!p->grad)
                        continue;
                    snprintf(what, sizeof what, "dpo grad %.40s chunk %d keep %d %s",
                             p->name + strlen("base_model.model.model."), chunks[ki], keep,
                             dtype_name(d));
                    CHECK_REL(what, r.grads[k], ref.grads[k], p->numel, gtol);
                    k++;
                }
                free_result(&r);
                ft_model_free(m);
            }
            free_result(&ref);
            ft_model_free(cpu);
        }
}

int main(void)
{
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        fprintf(stderr, "test_cuda_pref: no CUDA device\n");
        return 1;
    }
    snprintf(root, sizeof root, "/tmp/ft-test-cuda-pref-XXXXXX");
    if (!mkdtemp(root)) {
        perror("mkdtemp");
        return 1;
    }
    gpu_seed(9);
    RUN(test_dpo_on_device);
    ft_remove_tree(root);
    return check_summary("cuda_pref");
}
