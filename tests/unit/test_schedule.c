/* Tests for lib/train/schedule.c: learning rates against transformers' schedule lambdas, schedule
 * name parsing, and the clip_grad_norm_ coefficient against torch.
 *
 * Reference values: transformers.optimization's _get_{linear,cosine,constant}_schedule_with_
 * warmup_lr_lambda transcribed into Python (CPython floats), times base_lr as LambdaLR does;
 * clip coefficients from torch 1.13 clip_grad_norm_'s arithmetic on a float32 norm tensor. */
#include "train/schedule.h"

#include <string.h>

#include "check.h"

/* lr at steps 0, 1, 5, 9, 10, 11, 37, 99, 100 with base_lr 3e-4, 10 warmup, 100 total. */
static const int STEPS[] = {0, 1, 5, 9, 10, 11, 37, 99, 100};
static const double LINEAR_REF[] = {0.0,
                                    2.9999999999999997e-05,
                                    0.00015,
                                    0.00027,
                                    0.0003,
                                    0.00029666666666666665,
                                    0.00020999999999999998,
                                    3.3333333333333333e-06,
                                    0.0};
static const double COSINE_REF[] = {0.0,
                                    2.9999999999999997e-05,
                                    0.00015,
                                    0.00027,
                                    0.0003,
                                    0.00029990862405286433,
                                    0.00023816778784387094,
                                    9.137594713563568e-08,
                                    0.0};

static void check_schedule(ft_lr_kind kind, const double *ref)
{
    ft_lr_schedule s = {.kind = kind, .base_lr = 3e-4, .warmup_steps = 10, .total_steps = 100};
    for (size_t i = 0; i < sizeof STEPS / sizeof STEPS[0]; i++)
        CHECK_CLOSE(ft_lr_at(&s, STEPS[i]), ref[i], 1e-15);
}

static void test_linear(void)
{
    check_schedule(FT_LR_LINEAR, LINEAR_REF);
    /* Past the end the reference clamps at 0. */
    ft_lr_schedule s = {.kind = FT_LR_LINEAR, .base_lr = 1e-3, .warmup_steps = 0,
                        .total_steps = 4};
    CHECK(ft_lr_at(&s, 0) == 1e-3);
    CHECK(ft_lr_at(&s, 7) == 0.0);
}

static void test_cosine(void)
{
    check_schedule(FT_LR_COSINE, COSINE_REF);
    /* No warmup, 7 steps: the first step uses the full lr. */
    static const double ref[] = {2e-05,
                                 1.900968867902419e-05,
                                 1.6234898018587336e-05,
                                 1.2225209339563144e-05,
                                 7.774790660436857e-06,
                                 3.7651019814126656e-06,
                                 9.903113209758098e-07,
                                 0.0};
    ft_lr_schedule s = {.kind = FT_LR_COSINE, .base_lr = 2e-5, .warmup_steps = 0,
                        .total_steps = 7};
    for (int i = 0; i < 8; i++)
        CHECK_CLOSE(ft_lr_at(&s, i), ref[i], 1e-15);
}

static void test_constant(void)
{
    ft_lr_schedule s = {.kind = FT_LR_CONSTANT, .base_lr = 3e-4, .warmup_steps = 10,
                        .total_steps = 100};
    CHECK(ft_lr_at(&s, 0) == 0.0);
    CHECK_CLOSE(ft_lr_at(&s, 5), 0.00015, 1e-15);
    CHECK(ft_lr_at(&s, 10) == 3e-4);
    CHECK(ft_lr_at(&s, 1000) == 3e-4);
    s.warmup_steps = 0;
    CHECK(ft_lr_at(&s, 0) == 3e-4);
}

/* total_steps <= warmup_steps: the max(1, ...) guards keep the formulas finite. */
static void test_degenerate(void)
{
    ft_lr_schedule s = {.kind = FT_LR_LINEAR, .base_lr = 1.0, .warmup_steps = 5,
                        .total_steps = 5};
    CHECK(ft_lr_at(&s, 4) == 0.8);
    CHECK(ft_lr_at(&s, 5) == 0.0);
    s.kind = FT_LR_COSINE;
    CHECK(ft_lr_at(&s, 5) == 1.0);
    s.total_steps = 0;
    s.warmup_steps = 0;
    CHECK(ft_lr_at(&s, 0) == 1.0);
}

static void test_parse(void)
{
    ft_lr_kind k = FT_LR_COSINE;
    ft_err e = {0};
    CHECK(ft_lr_kind_parse("constant", &k, &e) == 0 && k == FT_LR_CONSTANT);
    CHECK(ft_lr_kind_parse("linear", &k, &e) == 0 && k == FT_LR_LINEAR);
    CHECK(ft_lr_kind_parse("cosine", &k, &e) == 0 && k == FT_LR_COSINE);
    CHECK(ft_lr_kind_parse("constant_with_warmup", &k, &e) == 0 && k == FT_LR_CONSTANT);

    k = FT_LR_LINEAR;
    CHECK(ft_lr_kind_parse("cosine_with_restarts", &k, &e) == -1);
    CHECK(strstr(e.msg, "'cosine_with_restarts'") != NULL);
    CHECK(strstr(e.msg, "linear") != NULL && strstr(e.msg, "cosine") != NULL);
    CHECK(k == FT_LR_LINEAR);
    CHECK(ft_lr_kind_parse("", &k, &e) == -1);
    CHECK(ft_lr_kind_parse("Linear", &k, &e) == -1);
    CHECK(ft_lr_kind_parse(NULL, &k, &e) == -1);
    CHECK(ft_lr_kind_parse("polynomial", &k, NULL) == -1);
}

static void test_clip_coef(void)
{
    /* torch 1.13: clamp(max_norm / (norm_f32 + 1e-6), max=1.0), bit for bit. */
    CHECK(ft_clip_coef(2.5, 1.0) == 0x1.99999p-2f);
    CHECK(ft_clip_coef(123.456, 0.7) == 0x1.73976ap-8f);
    CHECK(ft_clip_coef(7.0, 3.0) == 0x1.b6db68p-2f);
    CHECK(ft_clip_coef(1.0, 1.0) == 0x1.ffffep-1f);
    CHECK(ft_clip_coef(0.3, 1.0) == 1.0f);
    CHECK(ft_clip_coef(1e-9, 1.0) == 1.0f);
    CHECK(ft_clip_coef(0.0, 1.0) == 1.0f);
    CHECK(ft_clip_coef(INFINITY, 1.0) == 0.0f);
    CHECK(isnan(ft_clip_coef(NAN, 1.0)));
    /* Clipping off. */
    CHECK(ft_clip_coef(1e6, 0.0) == 1.0f);
    CHECK(ft_clip_coef(1e6, -1.0) == 1.0f);
}

int main(void)
{
    RUN(test_linear);
    RUN(test_cosine);
    RUN(test_constant);
    RUN(test_degenerate);
    RUN(test_parse);
    RUN(test_clip_coef);
    return check_summary("schedule");
}
