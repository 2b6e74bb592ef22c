/* FT_CUDA_PROFILE (kernels/cuda/op_profile.cu): each op that kernels/ops.c runs on the GPU
 * is timed under its key, a GEMM's key holding its dtypes and shape; the table counts
 * every call, its times are positive and add up to no more than the span from the first
 * op to the last. The binary turns the profile on for itself before its first op. */
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_ops.h"
#include "gpu_check.h"

typedef struct {
    long calls;
    double total_ms;
} row;

/* The row whose key is `key`: its calls and total ms (the first two of the four numbers
 * after the padded key); calls -1 if none. */
static row find_row(const char *table, const char *key)
{
    row r = {-1, 0};
    size_t n = strlen(key);
    for (const char *line = table; line && *line;) {
        const char *end = strchr(line, '\n');
        size_t len = end ? (size_t)(end - line) : strlen(line);
        char rest[256];
        if (len < sizeof rest && len > n && strncmp(line, key, n) == 0 && line[n] == ' ') {
            memcpy(rest, line + n, len - n);
            rest[len - n] = 0;
            char *tok[8];
            int nt = 0;
            for (char *t = strtok(rest, " "); t && nt < 8; t = strtok(NULL, " "))
                tok[nt++] = t;
            if (nt == 4) { /* calls, total ms, mean us, %: nothing more of a key */
                r.calls = atol(tok[0]);
                r.total_ms = atof(tok[1]);
                return r;
            }
        }
        line = end ? end + 1 : NULL;
    }
    return r;
}

static void test_profile_table(void)
{
    CHECK(ft_cuda_profile_enabled());
    const int N = 4, in = 8, out = 16, out2 = 12;
    float *x = host_random((size_t)N * in, 1.0f), *w = host_random((size_t)out * in, 1.0f);
    ft_tensor gx = dev_upload(x, (size_t)N * in, FT_F32), gw = dev_upload(w, (size_t)out * in, FT_F32);
    ft_tensor gy = dev_upload(host_alloc((size_t)N * out), (size_t)N * out, FT_F32);
    ft_tensor bx = dev_upload(x, (size_t)N * in, FT_BF16), bw = dev_upload(w, (size_t)out2 * in, FT_BF16);
    ft_tensor by = dev_upload(host_alloc((size_t)N * out2), (size_t)N * out2, FT_BF16);
    for (int i = 0; i < 3; i++)
        ft_linear_forward(gy, gx, gw, ft_none(), N, in, out, 1.0f, 0);
    ft_linear_forward(by, bx, bw, ft_none(), N, in, out2, 1.0f, 1);
    ft_add(gy, gy, (size_t)N * out);
    ft_add(gy, gy, (size_t)N * out);
    /* backward with dx only, then dx and dw: two keys */
    ft_tensor gdx = dev_upload(host_alloc((size_t)N * in), (size_t)N * in, FT_F32);
    ft_tensor gdw = dev_upload(host_alloc((size_t)out * in), (size_t)out * in, FT_F32);
    ft_linear_backward(gdx, ft_none(), ft_none(), gy, gx, gw, N, in, out, 1.0f);
    ft_linear_backward(gdx, gdw, ft_none(), gy, gx, gw, N, in, out, 1.0f);
    ft_linear_backward(gdx, gdw, ft_none(), gy, gx, gw, N, in, out, 1.0f);
    double ss = ft_sumsq(gy, (size_t)N * out);
    CHECK(ss > 0);

    FILE *f = tmpfile();
    CHECK(f != NULL);
    if (!f)
        return;
    ft_cuda_profile_write(f);
    long size = ftell(f);
    char *table = (char *)calloc((size_t)size + 1, 1);
    rewind(f);
    CHECK(fread(table, 1, (size_t)size, f) == (size_t)size);
    fclose(f);

    /* a GEMM's key: op, input dtype, shape, each output's dtype, "+=" when accumulating */
    row fwd = find_row(table, "linear_forward fp32 N=4 in=8 out=16 y->fp32");
    row acc = find_row(table, "linear_forward bf16 N=4 in=8 out=12 y->bf16 +=");
    row dx = find_row(table, "linear_backward fp32 N=4 in=8 out=16 dx->fp32");
    row dxdw = find_row(table, "linear_backward fp32 N=4 in=8 out=16 dx->fp32 dw->fp32");
    row add = find_row(table, "add"), sumsq = find_row(table, "sumsq");
    CHECK(fwd.calls == 3 && acc.calls == 1 && add.calls == 2 && sumsq.calls == 1);
    CHECK(dx.calls == 1 && dxdw.calls == 2);
    CHECK(fwd.total_ms > 0 && add.total_ms > 0 && sumsq.total_ms > 0);
    double ops = 0, span = 0;
    const char *last = strstr(table, "FT_CUDA_PROFILE: ops ");
    CHECK(last && sscanf(last, "FT_CUDA_PROFILE: ops %lf ms of a %lf ms span", &ops, &span) == 2);
    /* the printed sums are rounded to 0.01 ms */
    CHECK(ops > 0 && ops <= span + 0.02);
    if (fwd.calls != 3 || acc.calls != 1 || add.calls != 2 || sumsq.calls != 1 ||
        dx.calls != 1 || dxdw.calls != 2)
        fprintf(stderr, "%s", table);
    free(table), free(x), free(w);
    dev_free(gx), dev_free(gw), dev_free(gy), dev_free(bx), dev_free(bw), dev_free(by);
    dev_free(gdx), dev_free(gdw);
}

int main(void)
{
    setenv("FT_CUDA_PROFILE", "1", 1);
    gpu_seed(31);
    RUN(test_profile_table);
    return check_summary("cuda_profile");
}
