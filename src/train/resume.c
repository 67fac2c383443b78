/* resume.c — a resumed run's checkpoint and config (qt_resume.h). */
#include "qt_resume.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "qt_ckpt.h"
#include "qt_error.h"

static int is_dir(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

int qt_resume_target(const char *which, char *out, size_t cap, char *err, size_t errlen) {
    struct stat sb;
    if (stat(which, &sb)) return qt_errf(err, errlen, "resume: %s: no such checkpoint or folder", which);
    snprintf(out, cap, "%s", which);
    if (!S_ISDIR(sb.st_mode)) return 1;
    long *steps = NULL;
    int n = qt_ckpt_list(which, &steps);
    free(steps);
    char sub[QT_PATH_MAX + 8];
    snprintf(sub, sizeof sub, "%s/ckpt", which);
    if (n <= 0 && is_dir(sub)) snprintf(out, cap, "%s", sub); /* a run.dir */
    return 0;
}

/* The stored config of the newest checkpoint in dir that opens (or of the file path), malloc'ed into
 * *yaml; its path into path. */
static int stored_config(const char *target, int file, char **yaml, char *path, size_t cap, char *err, size_t errlen) {
    long *steps = NULL;
    int n = file ? 1 : qt_ckpt_list(target, &steps);
    qt_ckpt *ck = NULL;
    for (int i = 0; i < n && !ck; i++) {
        if (file) snprintf(path, cap, "%s", target);
        else snprintf(path, cap, "%s/ckpt_%08ld.qtc", target, steps[i]);
        ck = qt_ckpt_open(path, err, errlen); /* a damaged newest one: the trainer's load says so */
    }
    free(steps);
    if (!ck && n <= 0) return qt_errf(err, errlen, "resume: no checkpoint (ckpt_*.qtc) in %s", target);
    if (!ck) return -1;
    size_t nb;
    const char *text = qt_ckpt_get(ck, "config", &nb, NULL);
    int rc = 0;
    if (!text) rc = qt_errf(err, errlen, "%s: holds no config: give the config to resume it with", path);
    else if (!(*yaml = malloc(nb + 1))) rc = qt_errf(err, errlen, "out of host memory");
    else {
        memcpy(*yaml, text, nb);
        (*yaml)[nb] = 0;
    }
    qt_ckpt_close(ck);
    return rc;
}

/* "key='value'" (YAML single quotes: any path reads back as itself) into a malloc'ed string. */
static char *quoted_override(const char *key, const char *value) {
    size_t n = strlen(key) + 2 * strlen(value) + 4;
    char *s = malloc(n), *p = s;
    if (!s) return NULL;
    p += sprintf(p, "%s='", key);
    for (const char *v = value; *v; v++) {
        if (*v == '\'') *p++ = '\'';
        *p++ = *v;
    }
    strcpy(p, "'");
    return s;
}

int qt_resume_config(qt_config *c, const char *which, const char *const *overrides, int n_overrides, char *ckpt,
                     size_t cap, char *err, size_t errlen) {
    char target[QT_PATH_MAX + 8], path[QT_PATH_MAX + 64];
    int file = qt_resume_target(which, target, sizeof target, err, errlen);
    char *yaml = NULL;
    if (file < 0 || stored_config(target, file, &yaml, path, sizeof path, err, errlen)) return -1;
    /* a folder: the run lives where it is now, wherever the stored config says it was */
    const char **ovr = malloc((size_t)(n_overrides + 2) * sizeof *ovr);
    int n = 0, rc = -1;
    if (ovr && !file && strcmp(target, which)) ovr[n++] = quoted_override("run.dir", which);
    if (ovr && !file) ovr[n++] = quoted_override("checkpoint.dir", target);
    int ok = ovr != NULL;
    for (int i = 0; i < n; i++) ok &= ovr[i] != NULL;
    if (ok) {
        for (int i = 0; i < n_overrides; i++) ovr[n + i] = overrides[i];
        char name[QT_PATH_MAX + 80];
        snprintf(name, sizeof name, "%s:config", path);
        rc = qt_config_load_string(c, yaml, name, ovr, n + n_overrides, err, errlen) ? -2 : 0;
        snprintf(ckpt, cap, "%s", file ? target : "latest");
    } else qt_errf(err, errlen, "out of host memory");
    for (int i = 0; ovr && i < n; i++) free((void *)ovr[i]);
    free(ovr);
    free(yaml);
    return rc;
}
