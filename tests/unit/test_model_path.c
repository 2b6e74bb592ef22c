/* model.name resolution: a local dir as is; a Hub id through the Hugging Face cache
 * layout (refs/main, or the only snapshot; a refs/main that is a FIFO is not waited on);
 * a clear "how to download" error otherwise. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "check.h"
#include "fifo_guard.h"
#include "core/fsutil.h"
#include "formats/model_path.h"

static char root[64];

static void test_local_dir(void)
{
    char out[4096];
    ft_err err;
    CHECK(ft_resolve_model_dir(root, out, sizeof out, &err) == 0);
    CHECK(strcmp(out, root) == 0);
    CHECK(ft_resolve_model_dir("./no/such/dir", out, sizeof out, &err) != 0);
    CHECK(strstr(err.msg, "no such directory") != NULL);
}

static void test_hub_cache(void)
{
    char cache[256], p[512], out[4096];
    ft_err err;
    snprintf(cache, sizeof cache, "%s/hub", root);
    setenv("HF_HUB_CACHE", cache, 1);
    snprintf(p, sizeof p, "%s/models--Org--Tiny-1B/snapshots/abc123", cache);
    CHECK(ft_mkdir_p(p, &err) == 0);
    /* only one snapshot, no refs: that one */
    CHECK(ft_resolve_model_dir("Org/Tiny-1B", out, sizeof out, &err) == 0);
    CHECK(strcmp(out, p) == 0);
    /* two snapshots: refs/main decides */
    snprintf(p, sizeof p, "%s/models--Org--Tiny-1B/snapshots/def456", cache);
    CHECK(ft_mkdir_p(p, &err) == 0);
    snprintf(p, sizeof p, "%s/models--Org--Tiny-1B/refs", cache);
    CHECK(ft_mkdir_p(p, &err) == 0);
    snprintf(p, sizeof p, "%s/models--Org--Tiny-1B/refs/main", cache);
    FILE *f = fopen(p, "w");
    fputs("def456\n", f);
    fclose(f);
    CHECK(ft_resolve_model_dir("Org/Tiny-1B", out, sizeof out, &err) == 0);
    CHECK(strstr(out, "snapshots/def456") != NULL);
    /* absent: says how to get it */
    CHECK(ft_resolve_model_dir("Org/Missing", out, sizeof out, &err) != 0);
    CHECK(strstr(err.msg, "hf download Org/Missing") != NULL);
    CHECK(strstr(err.msg, cache) != NULL);
    /* refs/main a FIFO: not read (it would block), the only snapshot is taken */
    snprintf(p, sizeof p, "%s/models--Org--Fifo/snapshots/aaa111", cache);
    CHECK(ft_mkdir_p(p, &err) == 0);
    snprintf(p, sizeof p, "%s/models--Org--Fifo/refs", cache);
    CHECK(ft_mkdir_p(p, &err) == 0);
    snprintf(p, sizeof p, "%s/models--Org--Fifo/refs/main", cache);
    CHECK(make_fifo(p));
    fifo_guard(true);
    CHECK(ft_resolve_model_dir("Org/Fifo", out, sizeof out, &err) == 0);
    fifo_guard(false);
    CHECK(strstr(out, "snapshots/aaa111") != NULL);
    unsetenv("HF_HUB_CACHE");
}

int main(void)
{
    snprintf(root, sizeof root, "/tmp/ft-test-mpath-XXXXXX");
    if (!mkdtemp(root))
        return 1;
    RUN(test_local_dir);
    RUN(test_hub_cache);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", root);
    return check_summary("model_path");
}
