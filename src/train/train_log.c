/* train_log.c — the JSONL run log (qt_train_log.h). */
#include "qt_train_log.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "qt_error.h"

static double clock_s(clockid_t c) {
    struct timespec ts;
    clock_gettime(c, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* mkdir -p of path's directory, so log.file may point into a fresh run folder. */
static void make_parent_dirs(const char *path) {
    char buf[QT_PATH_MAX];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        mkdir(buf, 0777);
        *p = '/';
    }
}

static int fail(qt_train_log *lg, char *err, size_t errlen) {
    return qt_errf(err, errlen, "log.file: %s: write failed: %s", lg->path, strerror(errno ? errno : EIO));
}

int qt_train_log_open(qt_train_log *lg, const char *path, int append, char *err, size_t errlen) {
    lg->f = NULL;
    lg->t0 = clock_s(CLOCK_MONOTONIC);
    snprintf(lg->path, sizeof lg->path, "%s", path);
    if (!path[0]) return 0;
    make_parent_dirs(path);
    lg->f = fopen(path, append ? "a" : "w");
    if (!lg->f) return qt_errf(err, errlen, "log.file: cannot open %s for writing: %s", path, strerror(errno));
    return 0;
}

static int flush(qt_train_log *lg, char *err, size_t errlen) {
    errno = 0;
    if (fflush(lg->f) != 0 || ferror(lg->f)) return fail(lg, err, errlen);
    return 0;
}

static void put_string(FILE *f, const char *s) {
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') fprintf(f, "\\%c", *p);
        else if (*p < 0x20 || *p == 0x7f) fprintf(f, "\\u%04x", *p);
        else fputc(*p, f);
    }
    fputc('"', f);
}

/* 1 when s is a JSON number (-?digits[.digits][e[+-]digits]); "inf" and "nan" are not. */
static int json_number(const char *s) {
    if (*s == '-') s++;
    if (*s < '0' || *s > '9') return 0;
    while (*s >= '0' && *s <= '9') s++;
    if (*s == '.') {
        if (*++s < '0' || *s > '9') return 0;
        while (*s >= '0' && *s <= '9') s++;
    }
    if (*s == 'e' || *s == 'E') {
        s++;
        if (*s == '+' || *s == '-') s++;
        if (*s < '0' || *s > '9') return 0;
        while (*s >= '0' && *s <= '9') s++;
    }
    return *s == 0;
}

int qt_train_log_config(qt_train_log *lg, const qt_config *cfg, const char *run_id, int resume, char *err,
                        size_t errlen) {
    if (!lg->f) return 0;
    fprintf(lg->f, "{\"type\":\"config\",\"run_id\":\"%s\",\"resume\":%s,\"time\":%.3f,\"config\":{", run_id,
            resume ? "true" : "false", clock_s(CLOCK_REALTIME));
    char v[QT_PATH_MAX + 64];
    const qt_config_key *k;
    for (int i = 0; (k = qt_config_key_at(i)); i++) {
        fprintf(lg->f, "%s\"%s\":", i ? "," : "", k->path);
        if (k->type == QT_KEY_STRING) {
            put_string(lg->f, (const char *)cfg + k->offset);
            continue;
        }
        qt_config_key_format(cfg, k, v, sizeof v);
        if (k->type == QT_KEY_BOOL || ((k->type == QT_KEY_INT || k->type == QT_KEY_U64 || k->type == QT_KEY_FLOAT) &&
                                       json_number(v)))
            fputs(v, lg->f);
        else put_string(lg->f, v);
    }
    fputs("}}\n", lg->f);
    return flush(lg, err, errlen);
}

int qt_train_log_write(qt_train_log *lg, const char *type, long step, double tokens, const char *fields,
                       char *err, size_t errlen) {
    if (!lg->f && !lg->hook) return 0;
    char line[1024];
    snprintf(line, sizeof line, "{\"type\":\"%s\",\"step\":%ld,%s%s\"tokens\":%.0f,\"elapsed_s\":%.3f,\"time\":%.3f}",
             type, step, fields, fields[0] ? "," : "", tokens, clock_s(CLOCK_MONOTONIC) - lg->t0, clock_s(CLOCK_REALTIME));
    if (lg->hook) lg->hook(lg->hook_ctx, line);
    if (!lg->f) return 0;
    fprintf(lg->f, "%s\n", line);
    return flush(lg, err, errlen);
}

int qt_train_log_close(qt_train_log *lg, char *err, size_t errlen) {
    if (!lg->f) return 0;
    int bad = fflush(lg->f) != 0 || ferror(lg->f);
    int e = errno;
    bad |= fclose(lg->f) != 0;
    lg->f = NULL;
    if (bad) {
        errno = e;
        return fail(lg, err, errlen);
    }
    return 0;
}
