/* The host side of a GPU model (ft_model_options.device = FT_DEV_CUDA): moving parameter
 * values, the batch and the logits between host memory and the model's device buffers,
 * converting fp32 <-> bf16 on the host where the device buffer is bf16, and keeping the
 * bf16 compute copy of the trainable parameters in step with the fp32 master.
 *
 * On the CPU model every function here is a plain copy (or nothing), so callers need no
 * device test of their own. */
#include <stdlib.h>
#include <string.h>

#include "model/model_internal.h"
#include "formats/safetensors.h"
#ifdef FT_HAVE_CUDA
#include "cuda/device_memory.h"
#endif

/* Copies bytes between host memory and a buffer of the model (on its device, or on the
 * host where a strategy bound host storage for a checkpoint: ft_model_bind_unit). */
static int transfer(const ft_model *m, void *dst, const void *src, size_t bytes, ft_err *err)
{
    if (m->dev == FT_DEV_CPU) {
        memmove(dst, src, bytes);
        return 0;
    }
#ifdef FT_HAVE_CUDA
    return ft_cuda_memcpy_any(dst, src, bytes, err);
#else
    return ft_fail(err, "a GPU model in a build without CUDA");
#endif
}

/* n values of dtype dt at dev (a device buffer) -> fp32 host. */
static int download_values(const ft_model *m, float *host, const void *dev, size_t n,
                           ft_dtype dt, ft_err *err)
{
    if (dt == FT_F32)
        return transfer(m, host, dev, n * sizeof(float), err);
    uint16_t *tmp = malloc(n * sizeof *tmp + 1);
    if (!tmp)
        return ft_fail(err, "out of host memory (%zu values)", n);
    int rc = transfer(m, tmp, dev, n * sizeof *tmp, err);
    for (size_t i = 0; rc == 0 && i < n; i++)
        host[i] = ft_bf16_to_f32(tmp[i]);
    free(tmp);
    return rc;
}

/* fp32 host -> n values of dtype dt at dev (rounded to nearest even for bf16). */
static int upload_values(const ft_model *m, void *dev, const float *host, size_t n,
                         ft_dtype dt, ft_err *err)
{
    if (dt == FT_F32)
        return transfer(m, dev, host, n * sizeof(float), err);
    uint16_t *tmp = malloc(n * sizeof *tmp + 1);
    if (!tmp)
        return ft_fail(err, "out of host memory (%zu values)", n);
    for (size_t i = 0; i < n; i++)
        tmp[i] = ft_f32_to_bf16(host[i]);
    int rc = transfer(m, dev, tmp, n * sizeof *tmp, err);
    free(tmp);
    return rc;
}

ft_device ft_model_device(const ft_model *m) { return m->dev; }
ft_dtype ft_model_dtype(const ft_model *m) { return m->cdt; }

/* The dtype a parameter's data pointer holds: the fp32 master for trainable ones, the
 * compute dtype for frozen ones. */
static ft_dtype param_dtype(const ft_model *m, const ft_param *p)
{
    return p->trainable ? FT_F32 : m->cdt;
}

int ft_model_param_get(ft_model *m, const ft_param *p, float *host, ft_err *err)
{
    /* a quantized weight: its layer dequantized into the window first */
    if (p->quantized && ft_model_materialize(m, p->unit, err))
        return ft_fail_prefix(err, "parameter '%s'", p->name);
    if (!p->data)
        return ft_fail(err, "parameter '%s' is not bound", p->name);
    return download_values(m, host, p->data, p->numel, param_dtype(m, p), err);
}

int ft_model_grad_get(ft_model *m, const ft_param *p, float *host, ft_err *err)
{
    if (!p->grad)
        return ft_fail(err, "parameter '%s' has no gradient", p->name);
    return download_values(m, host, p->grad, p->numel, FT_F32, err);
}

int ft_model_param_set(ft_model *m, ft_param *p, const float *host, ft_err *err)
{
    if (p->quantized)
        return ft_fail(err, "parameter '%s' is a quantized base weight: it cannot be set "
                            "(only read, dequantized)",
                       p->name);
    if (!p->data)
        return ft_fail(err, "parameter '%s' is not bound", p->name);
    if (upload_values(m, p->data, host, p->numel, param_dtype(m, p), err))
        return ft_fail_prefix(err, "parameter '%s'", p->name);
    if (p->trainable && m->train_compute && m->train_compute != m->train_data) {
        float *compute = model_at(m, m->train_compute, p->offset);
        ft_copy(model_view(m, compute, p->numel, m->cdt), model_view(m, p->data, p->numel, FT_F32),
                p->numel);
    }
    return 0;
}

void ft_model_sync_compute(ft_model *m)
{
    if (!m->train_compute || m->train_compute == m->train_data || !m->n_train)
        return;
    ft_copy(model_view(m, m->train_compute, m->n_train, m->cdt),
            model_view(m, m->train_data, m->n_train, FT_F32), m->n_train);
}

float *ft_model_trainable_compute(ft_model *m) { return m->train_compute; }

/* The batch arrays prepare_batch fills: the device arrays themselves on the CPU, the
 * host staging on the GPU (then model_upload_batch copies them over). */
void model_batch_arrays(ft_model *m, int32_t **ids, int32_t **targets, int32_t **pos,
                        int32_t **seg)
{
    if (m->dev == FT_DEV_CPU) {
        *ids = m->ids, *targets = m->targets, *pos = m->pos, *seg = m->seg;
        return;
    }
    size_t N = m->max_rows;
    *ids = m->batch_h, *targets = m->batch_h + N, *pos = m->batch_h + 2 * N;
    *seg = m->batch_h + 3 * N;
}

int model_upload_batch(ft_model *m, ft_err *err)
{
    if (m->dev == FT_DEV_CPU)
        return 0;
    size_t N = (size_t)m->B * m->T, bytes = N * sizeof(int32_t);
    int32_t *ids, *targets, *pos, *seg;
    model_batch_arrays(m, &ids, &targets, &pos, &seg);
    if (transfer(m, m->ids, ids, bytes, err) ||
        transfer(m, m->targets, targets, bytes, err) ||
        transfer(m, m->pos, pos, bytes, err) || transfer(m, m->seg, seg, bytes, err))
        return ft_fail_prefix(err, "copying the batch to the GPU");
    return 0;
}

int model_upload_inv_freq(ft_model *m, ft_err *err)
{
    if (m->dev == FT_DEV_CPU) {
        m->inv_freq_dev = m->inv_freq;
        return 0;
    }
    size_t n = model_rope_sets(m) * (size_t)(m->cfg.rotary_dim / 2);
    m->inv_freq_dev = ft_alloc_on(&m->mem, m->dev, FT_MEM_WEIGHTS, n * sizeof(float));
    if (!m->inv_freq_dev)
        return ft_mem_fail(err, &m->mem, m->dev, "the RoPE frequencies");
    return transfer(m, m->inv_freq_dev, m->inv_freq, n * sizeof(float), err);
}

const float *ft_model_logits(ft_model *m)
{
    if (!m->logits_valid || m->logits_first != 0)
        return NULL;
    if (m->dev == FT_DEV_CPU)
        return m->logits;
    if (!m->logits_h_valid) {
        size_t n = (size_t)m->B * m->T * m->cfg.vocab_size;
        free(m->logits_h);
        m->logits_h = malloc(n * sizeof(float) + 1);
        if (!m->logits_h || download_values(m, m->logits_h, m->logits, n, m->cdt, NULL))
            return NULL;
        m->logits_h_valid = true;
    }
    return m->logits_h;
}

const float *ft_model_row_logits(ft_model *m, size_t n)
{
    size_t V = (size_t)m->cfg.vocab_size;
    if (!m->logits_valid || n < m->logits_first || n >= (size_t)m->B * m->T)
        return NULL;
    size_t at = (n - m->logits_first) * V;
    if (m->dev == FT_DEV_CPU)
        return m->logits + at;
    if (m->logits_h_valid) /* the whole logits came back already */
        return m->logits_h + at;
    if (!m->row_logits_h && !(m->row_logits_h = malloc(V * sizeof(float))))
        return NULL;
    const char *row = (const char *)m->logits + at * model_esize(m);
    if (download_values(m, m->row_logits_h, row, V, m->cdt, NULL))
        return NULL;
    return m->row_logits_h;
}
