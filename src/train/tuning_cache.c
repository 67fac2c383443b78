/* tuning_cache.c — the engine's autotuned kernel choices kept in a file between runs (perf.tuning_cache).
 *
 * With perf.deterministic, a fresh run loads the file before its first step (so it multiplies with the
 * algorithms an earlier run of the same shapes on the same GPU model timed and picked) and writes it back
 * after its first step, when the training step's shapes have been tuned, and after each checkpoint, with the
 * shapes met later (the evaluation's). The file holds the engine's tuning_save bytes;
 * it is replaced whole (a temporary file renamed over it), so a reader never sees half a file. A file
 * that is missing is no error (the run times its own picks); one that cannot be read or was made by
 * another library version is said once and not used. */
#include "qt_tuning_cache.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "qt_error.h"

int qt_tuning_cache_path(const char *key, const char *home, char *out, size_t cap) {
    out[0] = 0;
    if (!key[0]) return 0;
    if (key[0] == '~' && key[1] == '/') {
        if (!home || !*home) return 0; /* the caller named no home: the run times its own picks */
        snprintf(out, cap, "%s%s", home, key + 1);
    } else {
        snprintf(out, cap, "%s", key);
    }
    return 1;
}

void qt_tuning_cache_load(qt_engine *e, const char *path) {
    char err[512];
    FILE *f;
    if (!e->ops->tuning_load || !path[0] || !(f = fopen(path, "rb"))) return;
    struct stat st;
    void *buf = NULL;
    int ok = fstat(fileno(f), &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0 && st.st_size < (1 << 26) &&
             (buf = malloc((size_t)st.st_size)) && fread(buf, 1, (size_t)st.st_size, f) == (size_t)st.st_size;
    fclose(f);
    if (!ok) printf("qtrain: perf.tuning_cache %s: not read (%s): the matmuls are timed again\n", path, strerror(errno ? errno : EIO));
    else if (e->ops->tuning_load(e, buf, (size_t)st.st_size, err, sizeof err))
        printf("qtrain: perf.tuning_cache %s: not used (%s): the matmuls are timed again\n", path, err);
    free(buf);
}

void qt_tuning_cache_save(qt_engine *e, const char *path_in) {
    char path[QT_TUNING_PATH_MAX], tmp[QT_TUNING_PATH_MAX + 64];
    if (!e->ops->tuning_save || !path_in[0]) return;
    snprintf(path, sizeof path, "%s", path_in);
    size_t n = e->ops->tuning_save(e, NULL, 0);
    void *buf = malloc(n);
    if (!buf) return;
    e->ops->tuning_save(e, buf, n);
    char *slash = strrchr(path, '/'); /* the cache's folder (and its parent) may not exist yet */
    if (slash && slash != path) {
        *slash = 0;
        char *up = strrchr(path, '/');
        if (up && up != path) *up = 0, mkdir(path, 0755), *up = '/';
        mkdir(path, 0755);
        *slash = '/';
    }
    snprintf(tmp, sizeof tmp, "%s.%ld.tmp", path, (long)getpid());
    FILE *f = fopen(tmp, "wb");
    int ok = f && fwrite(buf, 1, n, f) == n;
    if (f && fclose(f)) ok = 0;
    if (!ok || rename(tmp, path)) { /* a cache that cannot be written only costs the next run its timing */
        printf("qtrain: perf.tuning_cache %s: not written (%s)\n", path, strerror(errno ? errno : EIO));
        unlink(tmp);
    }
    free(buf);
}
