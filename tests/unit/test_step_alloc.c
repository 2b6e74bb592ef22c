/* No allocation inside a training step (issue 25): after the first step of a run, a CPU
 * training step of the library calls no malloc / calloc / realloc / posix_memalign /
 * aligned_alloc. LoRA and full fine-tuning, gradient checkpointing off and on, on the
 * tiny GQA llama (so the attention backward's per-head partials are used), the MoE
 * families (mixtral, qwen3_moe: the load-balancing loss) and families with other norms
 * and fused projections (gemma3_text, olmo2, phi3).
 *
 * This binary defines the allocator's entry points itself (the executable's symbols
 * interpose libc's for the whole process) and forwards them to glibc's __libc_*; while
 * armed, it counts the calls made from the executable's own code (the return address in
 * [__executable_start, etext): libft is linked in statically), not those of OpenBLAS,
 * libgomp or libc, which are shared libraries. OpenBLAS's own per-call allocations are
 * docs/benchmarks.md's subject. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "tiny_model.h"
#include "train/schedule.h"
#include "train/train_step.h"

void *__libc_malloc(size_t);
void *__libc_calloc(size_t, size_t);
void *__libc_realloc(void *, size_t);
void *__libc_memalign(size_t, size_t);
void __libc_free(void *);
extern char __executable_start, etext;

static volatile int armed;
static volatile long ours;          /* calls from our code while armed */
static void *volatile first_caller; /* the first such call's return address */

static void count(void *ra)
{
    if (armed && (char *)ra >= &__executable_start && (char *)ra < &etext) {
        if (__sync_fetch_and_add(&ours, 1) == 0)
            first_caller = ra;
    }
}

__attribute__((noinline)) void *malloc(size_t n)
{
    count(__builtin_return_address(0));
    return __libc_malloc(n);
}

__attribute__((noinline)) void *calloc(size_t a, size_t b)
{
    count(__builtin_return_address(0));
    return __libc_calloc(a, b);
}

__attribute__((noinline)) void *realloc(void *p, size_t n)
{
    count(__builtin_return_address(0));
    return __libc_realloc(p, n);
}

__attribute__((noinline)) int posix_memalign(void **p, size_t align, size_t n)
{
    count(__builtin_return_address(0));
    *p = __libc_memalign(align, n);
    return *p ? 0 : 12; /* ENOMEM */
}

__attribute__((noinline)) void *aligned_alloc(size_t align, size_t n)
{
    count(__builtin_return_address(0));
    return __libc_memalign(align, n);
}

void free(void *p)
{
    __libc_free(p);
}

static char root[256];
static int32_t ids[2 * 12];

/* Loads the model in dir, runs one step, then counts our allocations over two more. */
static long step_allocs(const char *dir, ft_train_mode mode, bool ckpt)
{
    ft_model_options opt = {.mode = mode, .seed = 5, .grad_ckpt = ckpt};
    opt.lora = (ft_lora_config){.r = 2, .alpha = 4, .targets = FT_LORA_ALL_LINEAR};
    ft_err err;
    ft_model *m;
    if (ft_model_load(&m, dir, &opt, &err)) {
        fprintf(stderr, "  %s: %s\n", dir, err.msg);
        check_current_failed = 1;
        return -1;
    }
    size_t n;
    ft_model_trainable(m, &n);
    ft_adamw_hparams hp = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.99f, .eps = 1e-8f};
    ft_optimizer o;
    CHECK(ft_optimizer_init(&o, ft_model_mem(m), n, hp, &err) == 0);
    ft_batch b = {2, 12, ids, NULL, NULL, NULL};
    ft_lr_schedule s = {.kind = FT_LR_CONSTANT, .base_lr = 1e-2, .total_steps = 10};
    ft_step_stats st;
    CHECK(ft_train_step(m, &o, &s, &b, 1, 1.0, &st, &err) == 0);
    ours = 0;
    first_caller = NULL;
    armed = 1;
    for (int i = 0; i < 2; i++)
        CHECK(ft_train_step(m, &o, &s, &b, 1, 1.0, &st, &err) == 0);
    armed = 0;
    if (ours)
        fprintf(stderr, "  %s %s ckpt %d: %ld allocations in steps 2-3, the first from "
                        "`addr2line -f -i -e <this binary> %#lx`\n",
                dir, mode == FT_TRAIN_FULL ? "full" : "lora", ckpt, ours,
                (unsigned long)((char *)first_caller - 1 - &__executable_start));
    ft_optimizer_free(&o);
    ft_model_free(m);
    return ours;
}

static void check_family(const char *type)
{
    char dir[400];
    snprintf(dir, sizeof dir, "%s/%s", root, type);
    write_tiny_model(dir, &(tiny_model_opts){.model_type = type});
    for (int full = 0; full < 2; full++)
        for (int ckpt = 0; ckpt < 2; ckpt++)
            CHECK(step_allocs(dir, full ? FT_TRAIN_FULL : FT_TRAIN_LORA, ckpt) == 0);
}

static void test_llama_steps_allocate_nothing(void)
{
    check_family("llama");
}

static void test_mixtral_steps_allocate_nothing(void)
{
    check_family("mixtral");
}

static void test_other_families_allocate_nothing(void)
{
    check_family("qwen3_moe");
    check_family("gemma3_text");
    check_family("olmo2");
    check_family("phi3");
}

/* The counter itself: an allocation from this file while armed is seen. */
static void *volatile sink;

static void test_counter_sees_our_calls(void)
{
    ours = 0;
    armed = 1;
    sink = malloc(16);
    armed = 0;
    free(sink);
    CHECK(ours == 1);
}

int main(void)
{
    for (int i = 0; i < 2 * 12; i++)
        ids[i] = (i * 7 + 3) % V;
    snprintf(root, sizeof root, "/tmp/ft-test-step-alloc-XXXXXX");
    if (!mkdtemp(root))
        return 1;
    RUN(test_counter_sees_our_calls);
    RUN(test_llama_steps_allocate_nothing);
    RUN(test_mixtral_steps_allocate_nothing);
    RUN(test_other_families_allocate_nothing);
    ft_remove_tree(root);
    return check_summary("step_alloc");
}
