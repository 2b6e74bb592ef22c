/* What the emulated-kernel tests (tests/emu/test_..._emu.cc) share: the pass/fail count
 * and its printed line, a seeded uniform generator, bf16 rounding and the normwise
 * relative error their comparisons use. Include after cuda_emu.h. */
#ifndef FT_EMU_CHECK_H
#define FT_EMU_CHECK_H

static int passed, failed;

static void check(bool ok, const char *what, double err, double tol)
{
    printf("  %-48s %.3g (tol %.0e) %s\n", what, err, tol, ok ? "ok" : "FAIL");
    ok ? passed++ : failed++;
}

static uint64_t rng_state = 12345; /* a test may reseed it */
static float uniform(void)         /* [-1, 1) */
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng_state >> 40) * (1.0 / (1ull << 24))) * 2.0f - 1.0f;
}

static float round_bf16(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }

/* normwise relative error; -1 on a NaN or inf */
static double rel_error(const std::vector<float> &got, const std::vector<float> &ref)
{
    double maxdiff = 0, maxref = 0;
    for (size_t i = 0; i < got.size(); i++) {
        if (!std::isfinite(got[i]))
            return -1;
        maxdiff = fmax(maxdiff, fabs((double)got[i] - ref[i]));
        maxref = fmax(maxref, fabs((double)ref[i]));
    }
    return maxref > 0 ? maxdiff / maxref : maxdiff;
}

static void expect_close(const char *name, const char *what, const std::vector<float> &got,
                         const std::vector<float> &ref, double tol)
{
    char label[128];
    snprintf(label, sizeof label, "%s %s", name, what);
    double e = rel_error(got, ref);
    check(e >= 0 && e <= tol, label, e, tol);
}

#endif
