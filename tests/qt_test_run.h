/* qt_test_run.h — tests that drive the qtrain program in child processes (test_reliability.c,
 * test_start.c): a tiny model on a synthetic shard, runs spawned with their output in a file, exit
 * statuses as a shell reports them, and the checkpoints they leave.
 *
 * Runs use OMP_NUM_THREADS=1 so that a loaded machine does not slow the CPU path to a crawl. */
#ifndef QT_TEST_RUN_H
#define QT_TEST_RUN_H

#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "qt_ckpt.h"
#include "qt_data.h"
#include "qt_test.h"
#include "qt_test_data.h"

static char g_dir[256];
static char g_qtrain[512];
static int g_gpu; /* 1: the runs train on the GPU (head_dim 64 for cuDNN's attention) */

static inline double mono_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static inline int exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0;
}

/* The test's yaml for run `name`: a tiny model on the synthetic shard, checkpoint.dir g_dir/name,
 * log.file g_dir/name.jsonl (log.every 1). extra: more YAML lines. Writes it to path. */
static inline void write_cfg(char *path, size_t cap, const char *name, int steps, int every, int keep, const char *extra) {
    snprintf(path, cap, "%s/%s.yaml", g_dir, name);
    FILE *f = fopen(path, "w");
    if (!f) return;
    fprintf(f,
            "model: {vocab_size: 64, hidden_size: %d, num_layers: 1, num_heads: 2, num_kv_heads: 1,\n"
            "        intermediate_size: 32, max_seq_len: 16}\n"
            "data: {train: '%s/tr_*.bin', seq_len: 16, micro_batch: 2}\n"
            "optim: {lr: 0.003, warmup: 3, steps: %d}\n"
            "checkpoint: {dir: '%s/%s', every: %d, keep: %d}\n"
            "log: {file: '%s/%s.jsonl', every: 1}\n"
            "device: %s\n%s\n",
            g_gpu ? 128 : 16, g_dir, steps, g_dir, name, every, keep, g_dir, name, g_gpu ? "cuda\nparallel: {gpus: 1}\nperf: {matmul_autotune: false}" : "cpu",
            extra ? extra : "");
    fclose(f);
}

/* Starts qtrain with args (NULL-terminated, after the program name), stdout and stderr appended to out. */
static inline pid_t spawn(const char *out, const char *const *args) {
    const char *argv[32] = {g_qtrain};
    int n = 1;
    for (; args[n - 1] && n < 31; n++) argv[n] = args[n - 1];
    argv[n] = NULL;
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open(out, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        setenv("OMP_NUM_THREADS", "1", 1);
        signal(SIGINT, SIG_DFL); /* a shell's background job ignores these; the run under test must not */
        signal(SIGTERM, SIG_DFL);
        execv(g_qtrain, (char *const *)argv);
        _exit(127);
    }
    return pid;
}

/* The exit status as a shell reports it (128 + signal when killed); -1 when it outlived timeout_s
 * (it is then killed). */
static inline int wait_status(pid_t pid, double timeout_s) {
    int st = 0;
    double t0 = mono_s();
    while (waitpid(pid, &st, WNOHANG) == 0) {
        if (mono_s() - t0 > timeout_s) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            return -1;
        }
        usleep(2000);
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static inline int run_qtrain(const char *out, const char *const *args) {
    unlink(out);
    return wait_status(spawn(out, args), 120);
}

/* 1 once file holds text; 0 when pid ended or timeout_s passed first. */
static inline int wait_text(const char *file, const char *text, pid_t pid, double timeout_s) {
    double t0 = mono_s();
    while (mono_s() - t0 < timeout_s) {
        size_t n;
        char *s = qt_t_read_file(file, &n);
        int found = s && n && (s[n] = 0, strstr(s, text) != NULL);
        free(s);
        if (found) return 1;
        if (waitpid(pid, NULL, WNOHANG) != 0) return 0;
        usleep(2000);
    }
    return 0;
}

static inline int file_has(const char *file, const char *text) {
    size_t n;
    char *s = qt_t_read_file(file, &n);
    int found = s && (s[n] = 0, strstr(s, text) != NULL);
    free(s);
    return found;
}

/* The newest checkpoint's step in g_dir/name, -1 when none. */
static inline long newest_step(const char *name) {
    char d[512];
    long *steps = NULL;
    snprintf(d, sizeof d, "%s/%s", g_dir, name);
    int n = qt_ckpt_list(d, &steps);
    long s = n ? steps[0] : -1;
    free(steps);
    return s;
}

static inline void ckpt_file(char *p, size_t cap, const char *name, long step) {
    snprintf(p, cap, "%s/%s/ckpt_%08ld.qtc", g_dir, name, step);
}

/* 1 when the checkpoints of step of runs a and b hold the same state bytes (the config blob names
 * other folders, so it is left out). */
static inline int same_state(const char *a, const char *b, long step, char *why, size_t cap) {
    char pa[512], pb[512], err[1024];
    ckpt_file(pa, sizeof pa, a, step);
    ckpt_file(pb, sizeof pb, b, step);
    qt_ckpt *ca = qt_ckpt_open(pa, err, sizeof err), *cb = ca ? qt_ckpt_open(pb, err, sizeof err) : NULL;
    int same = ca && cb;
    if (!same) snprintf(why, cap, "%s", err);
    const char *names[] = {"weights", "adam_m", "adam_v", "step", "rng", "loader_pos", "model_cfg"};
    for (int i = 0; same && i < 7; i++) {
        size_t na = 0, nb = 0;
        const void *x = qt_ckpt_get(ca, names[i], &na, NULL), *y = qt_ckpt_get(cb, names[i], &nb, NULL);
        same = x && y && na == nb && memcmp(x, y, na) == 0;
        if (!same) snprintf(why, cap, "blob %s differs", names[i]);
    }
    qt_ckpt_close(ca);
    qt_ckpt_close(cb);
    return same;
}

/* Runs `name` to the end; returns its exit status. */
static inline int run_to_end(const char *name, int steps, int every, int keep, const char *extra) {
    char cfg[512], out[512];
    write_cfg(cfg, sizeof cfg, name, steps, every, keep, extra);
    snprintf(out, sizeof out, "%s/%s.out", g_dir, name);
    const char *args[] = {cfg, NULL};
    return run_qtrain(out, args);
}

/* A shard of 4000 tokens (vocab 64) at path; damaged: one payload byte changed, its header intact, so
 * the checks at start pass and the loader's first read of it fails. 0 or -1 with err. */
static inline int write_shard(const char *path, int damaged, char *err, size_t errlen) {
    uint32_t *t = malloc(4000 * sizeof *t);
    if (!t) return -1;
    for (int i = 0; i < 4000; i++) t[i] = (uint32_t)(i * 7 % 64);
    int rc = qt_tokens_write(path, t, 4000, 2, 64, 0, err, errlen);
    free(t);
    FILE *f = rc || !damaged ? NULL : fopen(path, "r+b");
    if (f) {
        fseek(f, 64 + 100, SEEK_SET);
        fputc(63, f);
        fclose(f);
    }
    return rc || (damaged && !f) ? -1 : 0;
}

/* The qtrain program (argv[1], else beside this test's build folder), a temp folder g_dir and the
 * synthetic shard g_dir/tr_0.bin (20000 tokens of vocab 64). Returns 0, or -1 after printing why. */
static inline int qt_t_run_setup(int argc, char **argv, const char *prefix) {
    if (argc > 1) snprintf(g_qtrain, sizeof g_qtrain, "%s", argv[1]);
    else {
        snprintf(g_qtrain, sizeof g_qtrain, "%s", argv[0]);
        char *slash = strrchr(g_qtrain, '/');
        snprintf(slash ? slash + 1 : g_qtrain, sizeof g_qtrain - (slash ? (size_t)(slash + 1 - g_qtrain) : 0), "../qtrain");
    }
    if (access(g_qtrain, X_OK)) {
        printf("FAIL setup: %s is not built\n", g_qtrain);
        return -1;
    }
    if (!qt_t_mkdtemp(g_dir, sizeof g_dir, prefix)) return -1;
    uint32_t *t = malloc(20000 * sizeof *t);
    uint64_t x = 1;
    for (int i = 0; i < 20000; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        t[i] = (x >> 60) == 0 || i == 0 ? (uint32_t)((x >> 33) % 64) : (t[i - 1] * 7 + 3) % 64;
    }
    char p[512], err[512];
    snprintf(p, sizeof p, "%s/tr_0.bin", g_dir);
    int rc = qt_tokens_write(p, t, 20000, 2, 64, 0, err, sizeof err);
    if (rc) printf("FAIL setup: %s\n", err);
    free(t);
    return rc ? -1 : 0;
}

#endif
