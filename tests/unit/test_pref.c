/* DPO's pieces (lib/train/pref.h, model.h's per-row forward and backward):
 *
 * - ft_dpo_loss: each loss type's value at hand-computed points (sigmoid and robust at
 *   d = 0 are log 2; ipo at d = 0 is 1/(4 beta^2)), its gradient w.r.t. the four
 *   log-probabilities against central finite differences (the reference's too, by the
 *   loss's antisymmetry), and the metric sums;
 * - ft_pref_check refuses beta <= 0 and label smoothing where TRL does not use it;
 * - the model: ft_model_forward_rows' per-row sums add up to ft_model_forward's loss sum
 *   and equal a forward of each row alone; ft_model_backward_rows with one scale for
 *   every row equals ft_model_backward bitwise, with per-row scales equals the sum of
 *   per-row backward passes, for the whole and the chunked head; with the adapter off
 *   the forward is the base model's (B = 0 gives the same sums) and a backward is
 *   refused; rows split in two (ft_model_forward_split, ORPO) give parts that add up to
 *   the row, and the same scale on both parts is the unsplit backward. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "tiny_model.h"
#include "model/model.h"
#include "train/pref.h"

static double loss_of(const ft_pref_options *o, const double x[4], const long n[2])
{
    return ft_dpo_loss(o, 1, &x[0], &x[1], &x[2], &x[3], &n[0], &n[1], NULL, NULL, NULL);
}

static void test_loss_values_and_gradients(void)
{
    const ft_pref_options opts[] = {
        {FT_PREF_SIGMOID, 0.1, 0}, {FT_PREF_SIGMOID, 2.0, 0}, {FT_PREF_IPO, 0.3, 0},
        {FT_PREF_ROBUST, 0.5, 0.1}, {FT_PREF_ROBUST, 0.2, 0.0}};
    const long n[2] = {3, 5};
    /* at d = 0 */
    double z[4] = {-10, -12, -10, -12};
    CHECK_CLOSE(loss_of(&opts[0], z, n), log(2.0), 1e-15);
    CHECK_CLOSE(loss_of(&opts[3], z, n), log(2.0), 1e-15);
    CHECK_CLOSE(loss_of(&opts[2], z, n), 1.0 / (4 * 0.3 * 0.3), 1e-14);
    /* sigmoid by hand: d = (pc - rc) - (pr - rr) = (-5 + 7) - (-9 + 6) = 5 */
    double x[4] = {-5, -9, -7, -6};
    CHECK_CLOSE(loss_of(&opts[0], x, n), log1p(exp(-0.5)), 1e-14);
    /* robust by hand, e = 0.1, beta 0.5: (-(0.9) log s(2.5) + 0.1 log s(-2.5)) / 0.8 */
    double s = 1 / (1 + exp(-2.5));
    CHECK_CLOSE(loss_of(&opts[3], x, n), (-0.9 * log(s) + 0.1 * log(1 - s)) / 0.8, 1e-14);
    /* ipo by hand: (2/3 - (-3)/5 - 1/(0.6))^2 */
    double u = 2.0 / 3 + 3.0 / 5 - 1 / 0.6;
    CHECK_CLOSE(loss_of(&opts[2], x, n), u * u, 1e-14);
    /* large margins stay finite */
    double big[4] = {-1, -900, -900, -1};
    CHECK(isfinite(loss_of(&opts[1], big, n)));
    double big2[4] = {-900, -1, -1, -900};
    CHECK_CLOSE(loss_of(&opts[1], big2, n), 2.0 * 1798, 1e-12);
    for (size_t k = 0; k < sizeof opts / sizeof *opts; k++) {
        double gc, gr;
        ft_dpo_loss(&opts[k], 1, &x[0], &x[1], &x[2], &x[3], &n[0], &n[1], &gc, &gr, NULL);
        for (int i = 0; i < 4; i++) {
            double h = 1e-5, xp[4], xm[4];
            memcpy(xp, x, sizeof xp);
            memcpy(xm, x, sizeof xm);
            xp[i] += h;
            xm[i] -= h;
            double fd = (loss_of(&opts[k], xp, n) - loss_of(&opts[k], xm, n)) / (2 * h);
            /* d/d(rc) = -d/d(pc) and d/d(rr) = -d/d(pr): the loss depends on pc - rc and
             * pr - rr only */
            double an = i == 0 ? gc : i == 1 ? gr : i == 2 ? -gc : -gr;
            CHECK_CLOSE(an, fd, 1e-8);
        }
    }
    /* sums over two pairs */
    double pc[2] = {-5, -3}, pr[2] = {-9, -2}, rc[2] = {-7, -3}, rr[2] = {-6, -2};
    long nc[2] = {1, 2}, nr[2] = {1, 2};
    double sums[FT_PREF_NSUM] = {0};
    double total = ft_dpo_loss(&opts[0], 2, pc, pr, rc, rr, nc, nr, NULL, NULL, sums);
    CHECK_CLOSE(sums[FT_PREF_LOSS], total, 1e-15);
    CHECK_CLOSE(total, log1p(exp(-0.5)) + log(2.0), 1e-14);
    CHECK(sums[FT_PREF_PAIRS] == 2 && sums[FT_PREF_ACCURACY] == 1); /* the tie does not count */
    CHECK_CLOSE(sums[FT_PREF_REWARD_CHOSEN], 0.1 * 2, 1e-15);
    CHECK_CLOSE(sums[FT_PREF_REWARD_REJECTED], 0.1 * -3, 1e-15);
    CHECK_CLOSE(sums[FT_PREF_MARGIN], 0.5, 1e-15);
    CHECK_CLOSE(sums[FT_PREF_LOGP_CHOSEN], -8, 1e-15);
    CHECK_CLOSE(sums[FT_PREF_LOGP_REJECTED], -11, 1e-15);
}

static void test_check(void)
{
    ft_err err;
    CHECK(ft_pref_check(&(ft_pref_options){FT_PREF_SIGMOID, 0.1, 0}, &err) == 0);
    CHECK(ft_pref_check(&(ft_pref_options){FT_PREF_SIGMOID, 0, 0}, &err) != 0);
    CHECK(strstr(err.msg, "train.pref.beta") != NULL);
    CHECK(ft_pref_check(&(ft_pref_options){FT_PREF_SIGMOID, 0.1, 0.1}, &err) != 0);
    CHECK(strstr(err.msg, "robust") != NULL);
    CHECK(ft_pref_check(&(ft_pref_options){FT_PREF_IPO, 0.1, 0.1}, &err) != 0);
    CHECK(ft_pref_check(&(ft_pref_options){FT_PREF_ROBUST, 0.1, 0.49}, &err) == 0);
    CHECK(ft_pref_check(&(ft_pref_options){FT_PREF_ROBUST, 0.1, 0.5}, &err) != 0);
}

/* ---- the model's per-row passes ---------------------------------------------------- */

static char dir[300];
enum { R = 3, T = 7 };
static int32_t ids[R * T] = {1, 5, 9, 3, 30, 2, 7,  7, 7, 0, 31, 12, 4, 4,  9, 8, 8, 21, 3, 3, 1};
static int32_t labels[R * T] = {-100, -100, 9, 3, 30, 2, 7,     -100, 7, 0, 31, 12, -100, -100,
                                -100, -100, -100, 21, 3, 3, 1};

static ft_model *load(int chunk, bool b_nonzero)
{
    ft_model_options o = {.mode = FT_TRAIN_LORA, .seed = 3, .loss_chunk_rows = chunk};
    o.lora = (ft_lora_config){.r = 2, .alpha = 4, .targets = FT_LORA_ALL_LINEAR};
    ft_model *m = NULL;
    ft_err err;
    CHECK(ft_model_load(&m, dir, &o, &err) == 0);
    for (size_t i = 0; m && b_nonzero && i < ft_model_param_count(m); i++) {
        ft_param *p = ft_model_param(m, i);
        if (strstr(p->name, "lora_B"))
            for (size_t j = 0; j < p->numel; j++)
                p->data[j] = 0.4f * (ft_uniform(31 + i, j) - 0.5f);
    }
    return m;
}

static float *grads_copy(ft_model *m)
{
    size_t n;
    const float *g = ft_model_grads(m, &n);
    float *c = malloc(n * sizeof *c);
    memcpy(c, g, n * sizeof *c);
    return c;
}

static void test_model_rows(void)
{
    static const int chunks[] = {0, 5, 1};
    ft_err err;
    for (int k = 0; k < 3; k++) {
        ft_model *m = load(chunks[k], true);
        if (!m)
            return;
        ft_batch b = {R, T, ids, labels, NULL, NULL};
        double nll[R], sum;
        long n;
        CHECK(ft_model_forward(m, &b, &sum, &n, &err) == 0);
        ft_model_zero_grad(m);
        CHECK(ft_model_backward(m, 0.25f, &err) == 0);
        float *g_plain = grads_copy(m);
        CHECK(ft_model_forward_rows(m, &b, nll, &err) == 0);
        CHECK_CLOSE(nll[0] + nll[1] + nll[2], sum, 1e-12);
        float same[R] = {0.25f, 0.25f, 0.25f};
        ft_model_zero_grad(m);
        CHECK(ft_model_backward_rows(m, same, &err) == 0);
        size_t ng;
        const float *g_rows = ft_model_grads(m, &ng);
        CHECK(memcmp(g_rows, g_plain, ng * sizeof *g_rows) == 0);
        /* per-row scales: the sum of each row's own backward */
        float scale[R] = {0.5f, -1.25f, 2.0f};
        ft_model_zero_grad(m);
        CHECK(ft_model_forward_rows(m, &b, nll, &err) == 0);
        CHECK(ft_model_backward_rows(m, scale, &err) == 0);
        float *g_mixed = grads_copy(m);
        ft_model_zero_grad(m);
        for (int r = 0; r < R; r++) {
            ft_batch one = {1, T, ids + r * T, labels + r * T, NULL, NULL};
            double s1;
            CHECK(ft_model_forward(m, &one, &s1, NULL, &err) == 0);
            CHECK_CLOSE(s1, nll[r], 1e-5);
            CHECK(ft_model_backward(m, scale[r], &err) == 0);
        }
        const float *g_each = ft_model_grads(m, &ng);
        double worst = 0, norm = 0;
        for (size_t i = 0; i < ng; i++) {
            worst = fmax(worst, fabs((double)g_mixed[i] - g_each[i]));
            norm = fmax(norm, fabs((double)g_each[i]));
        }
        CHECK(norm > 0 && worst <= 1e-5 * norm);
        /* adapter off: the base's sums (B = 0 makes the LoRA path zero); no backward */
        ft_model *base = load(chunks[k], false);
        double nb[R], noff[R];
        CHECK(ft_model_forward_rows(base, &b, nb, &err) == 0);
        CHECK(ft_model_set_adapter(m, false, &err) == 0);
        CHECK(ft_model_forward_rows(m, &b, noff, &err) == 0);
        CHECK(ft_model_backward_rows(m, scale, &err) != 0);
        CHECK(ft_model_set_adapter(m, true, &err) == 0);
        for (int r = 0; r < R; r++) {
            CHECK(noff[r] == nb[r]);
            CHECK(noff[r] != nll[r]);
        }
        /* split rows (ORPO): the two parts add up to the whole row; one scale for both
         * parts is the unsplit backward, bitwise */
        int32_t split[R] = {0, 3, 7};
        double pre[R], post[R], whole[R];
        CHECK(ft_model_forward_rows(m, &b, whole, &err) == 0);
        CHECK(ft_model_forward_split(m, &b, split, pre, post, &err) == 0);
        for (int r = 0; r < R; r++)
            CHECK_CLOSE(pre[r] + post[r], whole[r], 1e-12);
        CHECK(pre[0] == 0 && post[2] == 0 && pre[1] != 0 && post[1] != 0);
        ft_model_zero_grad(m);
        CHECK(ft_model_backward_split(m, split, scale, scale, &err) == 0);
        g_rows = ft_model_grads(m, &ng);
        CHECK(memcmp(g_rows, g_mixed, ng * sizeof *g_rows) == 0);
        int32_t bad_split[R] = {0, T + 1, 0};
        CHECK(ft_model_forward_split(m, &b, bad_split, pre, post, &err) != 0);
        ft_batch packed = {R, T, ids, labels, ids, NULL};
        CHECK(ft_model_forward_rows(m, &packed, nll, &err) != 0);
        CHECK(strstr(err.msg, "packing") != NULL);
        free(g_plain);
        free(g_mixed);
        ft_model_free(base);
        ft_model_free(m);
    }
}

int main(void)
{
    char root[64];
    snprintf(root, sizeof root, "/tmp/ft-test-pref-XXXXXX");
    if (!mkdtemp(root)) {
        perror("mkdtemp");
        return 1;
    }
    snprintf(dir, sizeof dir, "%s/tiny", root);
    write_tiny_model(dir, &(tiny_model_opts){0});
    RUN(test_loss_values_and_gradients);
    RUN(test_check);
    RUN(test_model_rows);
    ft_remove_tree(root);
    return check_summary("pref");
}
