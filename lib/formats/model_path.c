#include "formats/model_path.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/fsutil.h"

static int is_dir(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static void hub_cache(char *out, size_t n)
{
    const char *v;
    if ((v = getenv("HF_HUB_CACHE")) && *v)
        snprintf(out, n, "%s", v);
    else if ((v = getenv("HF_HOME")) && *v)
        snprintf(out, n, "%s/hub", v);
    else
        snprintf(out, n, "%s/.cache/huggingface/hub", getenv("HOME") ? getenv("HOME") : "");
}

/* The snapshot dir of repo dir `repo`: refs/main's revision, else the only snapshot. */
static int snapshot(const char *repo, char *out, size_t n)
{
    char path[4352], rev[128] = "";
    snprintf(path, sizeof path, "%s/refs/main", repo);
    int fd = ft_open_regular(path, NULL); /* not there (or a FIFO): the only snapshot */
    FILE *f = fd >= 0 ? fdopen(fd, "r") : NULL;
    if (fd >= 0 && !f)
        close(fd);
    if (f) {
        if (!fgets(rev, sizeof rev, f))
            rev[0] = '\0';
        fclose(f);
        rev[strcspn(rev, "\r\n")] = '\0';
    }
    if (rev[0] && (size_t)snprintf(out, n, "%s/snapshots/%s", repo, rev) < n && is_dir(out))
        return 0;
    snprintf(path, sizeof path, "%s/snapshots", repo);
    DIR *d = opendir(path);
    if (!d)
        return -1;
    int found = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        found++;
        snprintf(out, n, "%s/%s", path, e->d_name);
    }
    closedir(d);
    return found == 1 ? 0 : -1;
}

int ft_resolve_model_dir(const char *name, char *out, size_t out_len, ft_err *err)
{
    if (is_dir(name)) {
        snprintf(out, out_len, "%s", name);
        return 0;
    }
    const char *slash = strchr(name, '/');
    bool hub_id = slash && slash != name && !strchr(slash + 1, '/') && slash[1] &&
                  name[0] != '.';
    if (!hub_id)
        return ft_fail(err, "%s: no such directory (expected a Hugging Face model dir with "
                            "config.json, or a Hub id Org/Name in the local cache)",
                       name);
    char cache[2048], repo[2400];
    hub_cache(cache, sizeof cache);
    snprintf(repo, sizeof repo, "%s/models--%.*s--%s", cache, (int)(slash - name), name,
             slash + 1);
    if (is_dir(repo) && snapshot(repo, out, out_len) == 0)
        return 0;
    return ft_fail(err,
                   "model '%s': not a local directory and not in the Hugging Face cache "
                   "(%s). Download it first, e.g. `hf download %s`, or give the "
                   "path of a model dir",
                   name, cache, name);
}
