/* The run dir's ownership (run_internal.h): a new run never mixes into, nor silently
 * drops, the outputs of another run in train.output_dir. */
#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "core/fsutil.h"
#include "run/run_internal.h"
#include "train/checkpoint.h"

bool run_dir_is_output(const char *name)
{
    /* ft-train's own, and what make's default job adds from them (the evaluations
     * before and after, the merged model); not lora-init/, which a run may start from */
    static const char *const files[] = {"final", "metrics.jsonl", "config.yaml",
                                        "run_summary.json", "run_summary.json.tmp",
                                        "merged", "eval-before.json", "eval-after.json",
                                        "eval-before.log", "eval-after.log",
                                        "predictions-before.jsonl",
                                        "predictions-after.jsonl"};
    for (size_t i = 0; i < sizeof files / sizeof *files; i++)
        if (strcmp(name, files[i]) == 0)
            return true;
    return ft_checkpoint_name(name) || strncmp(name, "events.out.tfevents.", 20) == 0;
}

/* The outputs of an earlier run in dir: how many, and the first few names joined into
 * list ("checkpoint-6, final, metrics.jsonl, ..."). */
static int find_outputs(const char *dir, int *count, char *list, size_t n, ft_err *err)
{
    *count = 0;
    list[0] = '\0';
    DIR *d = opendir(dir);
    if (!d)
        return errno == ENOENT ? 0 : ft_fail(err, "train.output_dir '%s': %s", dir, strerror(errno));
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!run_dir_is_output(e->d_name))
            continue;
        if (++*count <= 4) {
            size_t used = strlen(list);
            snprintf(list + used, n - used, "%s%s", used ? ", " : "", e->d_name);
        }
    }
    closedir(d);
    if (*count > 4) {
        size_t used = strlen(list);
        snprintf(list + used, n - used, ", ... (%d in all)", *count);
    }
    return 0;
}

/* Removes the outputs of an earlier run from dir (train.overwrite_output_dir); any other
 * file stays. */
static int remove_outputs(const char *dir, ft_err *err)
{
    DIR *d = opendir(dir);
    if (!d)
        return ft_fail(err, "train.output_dir '%s': %s", dir, strerror(errno));
    int rc = 0;
    struct dirent *e;
    while ((e = readdir(d)) && rc == 0) {
        if (!run_dir_is_output(e->d_name))
            continue;
        char path[4400];
        if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, e->d_name) >= sizeof path)
            rc = ft_fail(err, "%s/%s: path too long", dir, e->d_name);
        else if (ft_remove_tree(path) != 0)
            rc = ft_fail(err, "train.overwrite_output_dir: cannot remove %s: %s", path,
                         strerror(errno));
    }
    closedir(d);
    return rc;
}

/* Whether the checkpoint at path is a checkpoint-N of dir. */
static bool checkpoint_in(const char *path, const char *dir)
{
    char parent[4200];
    snprintf(parent, sizeof parent, "%s", path);
    size_t len = strlen(parent);
    while (len > 1 && parent[len - 1] == '/')
        parent[--len] = '\0';
    char *slash = strrchr(parent, '/');
    if (!slash)
        snprintf(parent, sizeof parent, ".");
    else if (slash == parent)
        parent[1] = '\0';
    else
        *slash = '\0';
    return ft_same_path(parent, dir);
}

int run_dir_claim(const char *out_dir, const char *resume_path, bool overwrite, FILE *log,
                  ft_err *err)
{
    bool continues = resume_path && checkpoint_in(resume_path, out_dir);
    if (!continues) {
        int count;
        char list[512];
        if (find_outputs(out_dir, &count, list, sizeof list, err))
            return -1;
        if (count && !overwrite) {
            /* resuming is advice only where --resume auto would find a checkpoint-N (a
             * run killed before its first save, or one saving none, has none) */
            char latest[4200];
            int found = ft_checkpoint_latest(out_dir, latest, sizeof latest, err);
            if (found < 0)
                return -1;
            return ft_fail(err,
                           "train.output_dir '%s' holds the outputs of an earlier run (%s)%s: "
                           "refusing to mix a new run into it. %s give this one another dir "
                           "(train.output_dir; make TRAIN_OUTPUT_DIR=...), or remove the earlier "
                           "outputs first (train.overwrite_output_dir=true; make "
                           "TRAIN_OVERWRITE_OUTPUT_DIR=true)",
                           out_dir, list,
                           resume_path ? " and this run resumes a checkpoint of another dir" : "",
                           found ? "Resume that run (ft-train --resume auto; make RESUME=auto),"
                                 : "That run left no checkpoint-N to resume from (it saved "
                                   "none, or was killed before its first save):");
        }
        if (count) {
            if (remove_outputs(out_dir, err))
                return -1;
            fprintf(log, "train.overwrite_output_dir: removed the earlier run's outputs from %s "
                         "(%s)\n",
                    out_dir, list);
        }
    }
    int removed;
    if (ft_checkpoint_cleanup(out_dir, &removed, err))
        return -1;
    if (removed)
        fprintf(log, "removed %d leftover%s of a killed save or checkpoint removal in %s\n",
                removed, removed == 1 ? "" : "s", out_dir);
    return 0;
}
