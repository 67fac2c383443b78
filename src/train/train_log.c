/* train_log.c — the JSONL run log (qt_train_log.h): created or appended to, locked, one write() per record. */
#include "qt_train_log.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "qt_error.h"
#include "qt_tb_events.h"

static double clock_s(clockid_t c) {
    struct timespec ts;
    clock_gettime(c, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* mkdir -p of path's directory, so log.file may point into a fresh run folder; the shallowest folder
 * it made goes into made ("" when none), for remove_made_dirs. */
static void make_parent_dirs(const char *path, char *made, size_t cap) {
    char buf[QT_PATH_MAX];
    snprintf(buf, sizeof buf, "%s", path);
    made[0] = 0;
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(buf, 0777) == 0 && !made[0]) snprintf(made, cap, "%s", buf);
        *p = '/';
    }
}

/* Removes path's folders up to the shallowest one make_parent_dirs made, each only when empty: a
 * refused start leaves no folder behind. */
static void remove_made_dirs(const char *path, const char *made) {
    char buf[QT_PATH_MAX];
    snprintf(buf, sizeof buf, "%s", path);
    size_t top = strlen(made);
    for (char *slash; made[0] && (slash = strrchr(buf, '/')) && (size_t)(slash - buf) >= top;) {
        *slash = 0;
        if (rmdir(buf)) return;
    }
}

static int fail(qt_train_log *lg, char *err, size_t errlen) {
    return qt_errf(err, errlen, "log.file: %s: write failed: %s", lg->path, strerror(errno ? errno : EIO));
}

/* n bytes with one write() (a short write, as on a full disk, continues, then fails with its errno). */
static int put(qt_train_log *lg, const char *buf, size_t n, char *err, size_t errlen) {
    for (size_t off = 0; off < n;) {
        ssize_t w = write(lg->fd, buf + off, n - off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            if (w == 0) errno = EIO;
            return fail(lg, err, errlen);
        }
        off += (size_t)w;
    }
    return 0;
}

/* Cuts the file back to just after its last newline: a record a full disk cut short is dropped, so the
 * next one starts a line of its own. */
static int cut_partial_record(qt_train_log *lg, char *err, size_t errlen) {
    off_t end = lseek(lg->fd, 0, SEEK_END), pos = end, keep = 0;
    char buf[4096];
    while (pos > 0 && !keep) {
        size_t n = pos < (off_t)sizeof buf ? (size_t)pos : sizeof buf;
        if (pread(lg->fd, buf, n, pos - (off_t)n) != (ssize_t)n)
            return qt_errf(err, errlen, "log.file: %s: cannot read: %s", lg->path, strerror(errno ? errno : EIO));
        for (size_t i = n; i-- > 0 && !keep;)
            if (buf[i] == '\n') keep = pos - (off_t)n + (off_t)i + 1;
        pos -= (off_t)n;
    }
    if (end < 0 || keep == end) return 0;
    if (ftruncate(lg->fd, keep))
        return qt_errf(err, errlen, "log.file: %s: cannot cut its partial last record: %s", lg->path, strerror(errno));
    fprintf(stderr, "qtrain: warning: log.file %s ended inside a record (%lld bytes after its last complete line, "
            "as a full disk leaves it): cut back to the last complete record\n", lg->path, (long long)(end - keep));
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

/* 1 when the file open at fd holds a complete line (a record; a run writes its config record first). */
static int holds_a_line(int fd) {
    char buf[4096];
    ssize_t n;
    for (off_t off = 0; (n = pread(fd, buf, sizeof buf, off)) > 0; off += n)
        if (memchr(buf, '\n', (size_t)n)) return 1;
    return 0;
}

/* 1 when the last config record of the log open at fd names checkpoint.dir dir: the log of an earlier
 * attempt of this run folder (the run directory then decides whether a fresh run may use it). */
static int same_run_folder(int fd, const char *dir) {
    static const char tag[] = "{\"type\":\"config\"";
    size_t tl = sizeof tag - 1, chunk = 1 << 20;
    char *buf = malloc(chunk + 1), *want = NULL;
    size_t wl = 0;
    FILE *m = open_memstream(&want, &wl);
    if (!buf || !m) {
        free(buf);
        if (m) fclose(m);
        free(want);
        return 0;
    }
    fputs("\"checkpoint.dir\":", m);
    put_string(m, dir);
    fclose(m);
    off_t last = -1, off = 0;
    for (ssize_t n; (n = pread(fd, buf, chunk, off)) > 0; off += n > (ssize_t)tl ? n - (ssize_t)tl : n) {
        buf[n] = 0;
        for (char *p = buf; (p = memmem(p, (size_t)n - (size_t)(p - buf), tag, tl)); p++)
            if ((p == buf && off == 0) || (p > buf && p[-1] == '\n')) last = off + (p - buf);
        if (n <= (ssize_t)tl) break;
    }
    int same = 0;
    ssize_t n = last >= 0 ? pread(fd, buf, chunk, last) : -1;
    if (n > 0) {
        buf[n] = 0;
        buf[strcspn(buf, "\n")] = 0;
        same = strstr(buf, want) != NULL;
    }
    free(buf);
    free(want);
    return same;
}

/* A fresh run creates the log; a log already there is appended to only when its last config record
 * names this checkpoint.dir (an earlier attempt of this run that the run directory lets a fresh run
 * replace, e.g. one killed before its first checkpoint) or emptied when it holds no complete record (a
 * start killed before its config record was whole), else refused. A resumed run appends. */
static int open_file(qt_train_log *lg, const char *path, const char *ckpt_dir, int resume, char *err, size_t errlen) {
    make_parent_dirs(path, lg->made, sizeof lg->made);
    /* O_NONBLOCK: a FIFO given as the log is refused below instead of blocking the open */
    int flags = O_APPEND | O_CLOEXEC | O_NONBLOCK | O_CREAT | O_RDWR;
    lg->fd = open(path, flags | (resume ? 0 : O_EXCL), 0644);
    lg->created = lg->fd >= 0 && !resume;
    int reuse = lg->fd < 0 && errno == EEXIST;
    if (reuse) lg->fd = open(path, flags & ~O_CREAT);
    if (lg->fd < 0) return qt_errf(err, errlen, "log.file: cannot open %s for writing: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(lg->fd, &sb) == 0 && S_ISCHR(sb.st_mode)) return 0; /* a device (/dev/null): written as it is */
    if (fstat(lg->fd, &sb) || !S_ISREG(sb.st_mode))
        return qt_errf(err, errlen, "log.file: %s: expected a regular file, got %s", path,
                       S_ISFIFO(sb.st_mode) ? "a FIFO" : S_ISDIR(sb.st_mode) ? "a directory" : "another kind of file");
    fcntl(lg->fd, F_SETFL, O_APPEND);
    if (flock(lg->fd, LOCK_EX | LOCK_NB)) goto busy;
    if (reuse && !holds_a_line(lg->fd)) { /* a start killed before its first record: nothing of a run to keep */
        if (ftruncate(lg->fd, 0))
            return qt_errf(err, errlen, "log.file: %s: cannot empty it: %s", path, strerror(errno));
        return 0;
    }
    if (reuse && !same_run_folder(lg->fd, ckpt_dir))
        return qt_errf(err, errlen, "log.file: %s holds another run's log: a fresh run never writes over a log; "
                       "give this run its own (--set run.dir=runs/NAME, or log.file=...) or continue that run "
                       "with --resume", path);
    return resume || reuse ? cut_partial_record(lg, err, errlen) : 0; /* reuse: the same run folder's log */
busy:
    return qt_errf(err, errlen, "log.file: %s is in use by another run (one running now holds the file's lock): give "
                   "this run its own log.file or run.dir", path);
}

int qt_train_log_open(qt_train_log *lg, const qt_config *cfg, int resume, char *err, size_t errlen) {
    const char *path = cfg->log.file, *tb_dir = cfg->log.tensorboard;
    lg->fd = -1;
    lg->created = 0;
    lg->tb = NULL;
    lg->t0 = clock_s(CLOCK_MONOTONIC);
    snprintf(lg->path, sizeof lg->path, "%s", path);
    if (path[0] && open_file(lg, path, cfg->checkpoint.dir, resume, err, errlen)) {
        if (lg->fd >= 0) close(lg->fd);
        if (lg->created) unlink(path);
        remove_made_dirs(path, lg->made);
        lg->fd = -1;
        return -1;
    }
    if (tb_dir[0] && !(lg->tb = qt_tb_open(tb_dir, err, errlen))) return -1;
    return 0;
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
    if (lg->fd < 0) return 0;
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len); /* the line in memory, then one write() */
    if (!f) return qt_errf(err, errlen, "log.file: out of host memory");
    fprintf(f, "{\"type\":\"config\",\"run_id\":\"%s\",\"resume\":%s,\"time\":%.3f,\"config\":{", run_id,
            resume ? "true" : "false", clock_s(CLOCK_REALTIME));
    char v[QT_KEY_TEXT_MAX];
    const qt_config_key *k;
    for (int i = 0; (k = qt_config_key_at(i)); i++) {
        fprintf(f, "%s\"%s\":", i ? "," : "", k->path);
        if (k->type == QT_KEY_STRING) {
            put_string(f, (const char *)cfg + k->offset);
            continue;
        }
        qt_config_key_format(cfg, k, v, sizeof v);
        if (k->type == QT_KEY_BOOL || ((k->type == QT_KEY_INT || k->type == QT_KEY_U64 || k->type == QT_KEY_FLOAT) &&
                                       json_number(v)))
            fputs(v, f);
        else put_string(f, v);
    }
    fputs("}}\n", f);
    int rc = fclose(f) ? qt_errf(err, errlen, "log.file: out of host memory") : put(lg, text, len, err, errlen);
    free(text);
    return rc;
}

/* The record's numeric members ("name":number) as TensorBoard scalars "<type>/<name>". */
static int tb_record(qt_train_log *lg, const char *type, long step, const char *fields, char *err, size_t errlen) {
    char tags[16][96];
    const char *tagp[16];
    float vals[16];
    int n = 0;
    for (const char *p = fields; n < 16 && (p = strchr(p, '"'));) {
        const char *q = strchr(p + 1, '"');
        if (!q || q[1] != ':') break;
        char *end;
        double v = strtod(q + 2, &end);
        if (end != q + 2 && (*end == ',' || !*end)) {
            snprintf(tags[n], sizeof tags[n], "%s/%.*s", type, (int)(q - p - 1), p + 1);
            tagp[n] = tags[n];
            vals[n++] = (float)v;
        }
        p = strchr(q + 2, ',');
        if (!p) break;
    }
    return n ? qt_tb_scalars(lg->tb, clock_s(CLOCK_REALTIME), step, tagp, vals, n, err, errlen) : 0;
}

int qt_train_log_write(qt_train_log *lg, const char *type, long step, double tokens, const char *fields,
                       char *err, size_t errlen) {
    if (lg->tb && tb_record(lg, type, step, fields, err, errlen)) return -1;
    if (lg->fd < 0 && !lg->hook) return 0;
    char line[1024];
    int n = snprintf(line, sizeof line, "{\"type\":\"%s\",\"step\":%ld,%s%s\"tokens\":%.0f,\"elapsed_s\":%.3f,\"time\":%.3f}\n",
                     type, step, fields, fields[0] ? "," : "", tokens, clock_s(CLOCK_MONOTONIC) - lg->t0,
                     clock_s(CLOCK_REALTIME));
    if (n < 0 || n >= (int)sizeof line) return qt_errf(err, errlen, "log.file: a %s record of %d bytes is too long", type, n);
    line[n - 1] = 0;
    if (lg->hook) lg->hook(lg->hook_ctx, line);
    line[n - 1] = '\n';
    return lg->fd < 0 ? 0 : put(lg, line, (size_t)n, err, errlen);
}

int qt_train_log_close(qt_train_log *lg, int discard, char *err, size_t errlen) {
    if (discard && lg->tb) { /* a run that saved nothing leaves no event file (nor the folder it made) */
        char dir[QT_PATH_MAX + 8];
        snprintf(dir, sizeof dir, "%s", qt_tb_path(lg->tb));
        unlink(dir);
        if (strrchr(dir, '/')) *strrchr(dir, '/') = 0;
        rmdir(dir);
    }
    qt_tb_close(lg->tb);
    lg->tb = NULL;
    if (lg->fd < 0) return 0;
    if (discard && lg->created) { /* before the close: the lock still held */
        unlink(lg->path);
        remove_made_dirs(lg->path, lg->made);
    }
    int bad = close(lg->fd) != 0;
    lg->fd = -1;
    return bad ? fail(lg, err, errlen) : 0;
}
