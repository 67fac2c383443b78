/* rundir.c — the checkpoint directory's lock, run identity and resume key check (qt_rundir.h). */
#include "qt_rundir.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <time.h>
#include <unistd.h>

#include "qt_ckpt.h"
#include "qt_error.h"

/* Calls fn(key row) for each identity key. */
#define FOR_IDENTITY_KEY(k, body)                                                                  \
    do {                                                                                           \
        char list_[] = QT_RUNDIR_IDENTITY_KEYS, *save_ = NULL;                                     \
        for (char *p_ = strtok_r(list_, ",", &save_); p_; p_ = strtok_r(NULL, ",", &save_)) {      \
            const qt_config_key *k = qt_config_key_find(p_);                                       \
            if (k) body                                                                            \
        }                                                                                          \
    } while (0)

uint64_t qt_rundir_config_hash(const qt_config *cfg) {
    char text[8192], v[QT_PATH_MAX + 64];
    size_t n = 0;
    FOR_IDENTITY_KEY(k, {
        qt_config_key_format(cfg, k, v, sizeof v);
        n += snprintf(text + n, n < sizeof text ? sizeof text - n : 0, "%s=%s\n", k->path, v);
    });
    return qt_ckpt_hash64(text, n < sizeof text ? n : sizeof text - 1);
}

/* Deletes the ckpt_*.qtc.tmp files a killed write left: never a checkpoint. A writer holds an flock on
 * its temp file while it writes (qt_ckpt_save), so one that is locked belongs to a live write and stays. */
static void remove_stale_temps(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t n = strlen(e->d_name);
        if (strncmp(e->d_name, "ckpt_", 5) || n < 9 || strcmp(e->d_name + n - 8, ".qtc.tmp")) continue;
        char p[QT_PATH_MAX + 300];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        int fd = open(p, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
        if (fd < 0) continue;
        if (flock(fd, LOCK_EX | LOCK_NB) == 0) unlink(p);
        close(fd);
    }
    closedir(d);
}

/* The pid written in dir/.lock ("?" when none), for messages. */
static void lock_owner(const char *lock, char pid[32]) {
    int fd = open(lock, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    ssize_t n = fd >= 0 ? pread(fd, pid, 31, 0) : -1;
    pid[n > 0 ? n : 0] = 0;
    pid[strcspn(pid, "\n")] = 0;
    if (!pid[0]) snprintf(pid, 32, "?");
    if (fd >= 0) close(fd);
}

int qt_rundir_open(qt_rundir *r, const char *dir, char *err, size_t errlen) {
    r->lock_fd = r->dir_fd = -1;
    r->run_id[0] = 0;
    r->wrote_identity = 0;
    snprintf(r->dir, sizeof r->dir, "%s", dir);
    r->created = access(dir, F_OK) != 0;
    char p[QT_PATH_MAX + 64], e2[QT_PATH_MAX + 256], pid[32];
    if (qt_ckpt_mkdirs(dir, e2, sizeof e2)) return qt_errf(err, errlen, "checkpoint.dir: %s", e2);
    snprintf(p, sizeof p, "%s/.write_test.%d", dir, (int)getpid());
    int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || write(fd, "x", 1) != 1) {
        int e = errno;
        if (fd >= 0) close(fd);
        unlink(p);
        return qt_errf(err, errlen, "checkpoint.dir: %s: cannot write a file there: %s", dir, strerror(e));
    }
    close(fd);
    unlink(p);
    snprintf(p, sizeof p, "%s/.lock", dir);
    /* the directory's own flock: deleting .lock cannot drop it */
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) return qt_errf(err, errlen, "checkpoint.dir: %s: cannot open: %s", dir, strerror(errno));
    fd = open(p, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
        int e = errno;
        close(dfd);
        return qt_errf(err, errlen, "checkpoint.dir: %s: cannot create: %s", p, strerror(e));
    }
    if (flock(dfd, LOCK_EX | LOCK_NB) != 0 || flock(fd, LOCK_EX | LOCK_NB) != 0) {
        lock_owner(p, pid);
        close(fd);
        close(dfd);
        return qt_errf(err, errlen, "checkpoint.dir: %s is in use by another run (process %s holds its lock): "
                       "wait for it to end or give another checkpoint.dir", dir, pid);
    }
    int n = snprintf(pid, sizeof pid, "%d\n", (int)getpid());
    if (ftruncate(fd, 0) != 0 || pwrite(fd, pid, (size_t)n, 0) != n) { /* the pid is only for messages */ }
    r->lock_fd = fd;
    r->dir_fd = dfd;
    remove_stale_temps(dir);
    return 0;
}

void qt_rundir_close(qt_rundir *r, int discard) {
    if (r->lock_fd < 0) return;
    if (discard) { /* under the lock, so no other run is using these names */
        char p[QT_PATH_MAX + 16];
        snprintf(p, sizeof p, "%s/run.json", r->dir);
        if (r->wrote_identity) unlink(p);
        snprintf(p, sizeof p, "%s/.lock", r->dir);
        unlink(p);
        if (r->created) rmdir(r->dir); /* only when empty */
    }
    close(r->lock_fd); /* drops the flocks */
    close(r->dir_fd);
    r->lock_fd = r->dir_fd = -1;
}

static void new_run_id(char id[17]) {
    uint64_t x = 0;
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd < 0 || read(fd, &x, sizeof x) != (ssize_t)sizeof x) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        x = qt_ckpt_hash64(&ts, sizeof ts) ^ (uint64_t)getpid() << 32;
    }
    if (fd >= 0) close(fd);
    snprintf(id, 17, "%016llx", (unsigned long long)x);
}

/* The run id in dir/run.json, or "" when the file or the field is missing. */
static void read_run_id(const char *dir, char id[17]) {
    char p[QT_PATH_MAX + 16], buf[4096];
    id[0] = 0;
    snprintf(p, sizeof p, "%s/run.json", dir);
    FILE *f = fopen(p, "r");
    if (!f) return;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *q = strstr(buf, "\"run_id\": \"");
    if (q && strspn(q + 11, "0123456789abcdef") == 16) snprintf(id, 17, "%.16s", q + 11);
}

/* Writes a JSON string literal of s. */
static void put_json_string(FILE *f, const char *s) {
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') fprintf(f, "\\%c", *p);
        else if (*p < 0x20) fprintf(f, "\\u%04x", *p);
        else fputc(*p, f);
    }
    fputc('"', f);
}

static int write_run_json(const qt_rundir *r, const qt_config *cfg, char *err, size_t errlen) {
    char tmp[QT_PATH_MAX + 32], final[QT_PATH_MAX + 32], when[32], v[QT_PATH_MAX + 64];
    snprintf(final, sizeof final, "%s/run.json", r->dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", final);
    FILE *f = fopen(tmp, "w");
    if (!f) return qt_errf(err, errlen, "checkpoint.dir: %s: cannot create: %s", tmp, strerror(errno));
    time_t now = time(NULL);
    struct tm tm;
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&now, &tm));
    fprintf(f, "{\"run_id\": \"%s\", \"created\": \"%s\", \"config_hash\": \"%016llx\"", r->run_id, when,
            (unsigned long long)qt_rundir_config_hash(cfg));
    FOR_IDENTITY_KEY(k, {
        fprintf(f, ", ");
        put_json_string(f, k->path);
        fprintf(f, ": ");
        if (k->type == QT_KEY_STRING) put_json_string(f, (const char *)cfg + k->offset);
        else {
            qt_config_key_format(cfg, k, v, sizeof v);
            fputs(v, f);
        }
    });
    fprintf(f, "}\n");
    return qt_ckpt_commit_file(f, tmp, final, err, errlen);
}

int qt_rundir_identity(qt_rundir *r, const qt_config *cfg, int resume, char *err, size_t errlen) {
    long *steps = NULL;
    int n = qt_ckpt_list(r->dir, &steps);
    long newest = n ? steps[0] : -1;
    free(steps);
    read_run_id(r->dir, r->run_id);
    if (!resume && n > 0)
        return qt_errf(err, errlen, "checkpoint.dir: %s already holds %d checkpoint%s of run %s (newest: step %ld): "
                       "continue that run with --resume, or give a new checkpoint.dir (or delete the old one)",
                       r->dir, n, n == 1 ? "" : "s", r->run_id[0] ? r->run_id : "(no run.json)", newest);
    if (!resume || !r->run_id[0]) new_run_id(r->run_id);
    r->wrote_identity = !resume;
    return write_run_json(r, cfg, err, errlen);
}

/* 1 when key is named in the comma-separated allow list (or allow is "all"). */
static int allowed(const char *allow, const char *key) {
    if (!allow) return 0;
    if (!strcmp(allow, "all")) return 1;
    size_t kl = strlen(key);
    for (const char *p = allow; *p; p += *p == ',') {
        size_t l = strcspn(p, ",");
        if (l == kl && !strncmp(p, key, l)) return 1;
        p += l;
    }
    return 0;
}

int qt_rundir_check_resume(const qt_config *old, const qt_config *cfg, const int64_t mb[2], const char *allow,
                           const char *ckpt, int *data_moved, char *err, size_t errlen) {
    /* allow may only name identity keys: a typo must not pass silently */
    for (const char *p = allow ? allow : ""; *p && strcmp(allow, "all"); p += *p == ',') {
        size_t l = strcspn(p, ",");
        char key[128];
        snprintf(key, sizeof key, "%.*s", (int)l, p);
        char list[] = "," QT_RUNDIR_IDENTITY_KEYS ",", pat[140];
        snprintf(pat, sizeof pat, ",%s,", key);
        if (!strstr(list, pat))
            return qt_errf(err, errlen, "--allow-changed %s: \"%s\" is not a key a resume checks; expected some of %s or all",
                           allow, key, QT_RUNDIR_IDENTITY_KEYS);
        p += l;
    }
    char diff[2048] = "", keys[512] = "", a[QT_PATH_MAX + 64], b[QT_PATH_MAX + 64];
    size_t nd = 0, nk = 0;
    *data_moved = 0;
    FOR_IDENTITY_KEY(k, {
        qt_config_key_format(old, k, a, sizeof a);
        qt_config_key_format(cfg, k, b, sizeof b);
        int per_step = mb[0] > 0 && !strcmp(k->path, "data.grad_accum"); /* judged with the rank counts */
        if (per_step && mb[0] != mb[1])
            snprintf(b + strlen(b), sizeof b - strlen(b), " (micro-batches per optimizer step, grad_accum x ranks: %lld, "
                     "checkpoint's %lld)", (long long)mb[1], (long long)mb[0]);
        if (per_step ? mb[0] != mb[1] : strcmp(a, b) != 0) {
            if (!strcmp(k->path, "data.train") || !strcmp(k->path, "data.seq_len")) *data_moved = 1;
            if (!allowed(allow, k->path)) {
                nd += snprintf(diff + nd, nd < sizeof diff ? sizeof diff - nd : 0, "%s  %s: checkpoint %s, config %s",
                               nd ? "\n" : "", k->path, a, b);
                nk += snprintf(keys + nk, nk < sizeof keys ? sizeof keys - nk : 0, "%s%s", nk ? "," : "", k->path);
            }
        }
    });
    if (!nd) return 0;
    return qt_errf(err, errlen, "--resume: %s was made with other values of keys that change the run:\n%s\n"
                   "to continue with the new values, pass --allow-changed %s", ckpt, diff, keys);
}
