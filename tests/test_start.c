/* test_start.c — what a run refuses or survives at start, on the CPU path: checkpoints that cannot be
 * read (told from corrupt ones: never moved aside, the resume stops naming the file), the directory's
 * lock after its .lock file is deleted, temp files of a live write, inputs that are not regular files
 * (a FIFO as config, data shard, log or checkpoint), a stop during start-up or in its first instant,
 * a data error before step 1, data.grad_accum changed on resume, eval.batches past the eval set, a
 * tiny memory limit, and HF config.json files that mean two things (duplicate keys, two rope_thetas).
 *
 * Read errors that are not corruption: the tests run as root, for whom chmod 000 does not stop a read,
 * so a directory or a FIFO stands where a checkpoint file should be (open() of a directory succeeds
 * and its read fails with EISDIR; a FIFO with no writer blocks a plain open() forever). */
#include <dirent.h>
#include <sys/file.h>

#include "qt_hf.h"
#include "qt_model.h"
#include "qt_planner.h"
#include "qt_test_run.h"
#include "qt_train.h"

/* dir/ckpt_<step>.qtc becomes a directory (mkdir) or a FIFO (fifo 1); the file is kept as .orig. */
static int unreadable(const char *name, long step, int fifo) {
    char p[512], keep[600];
    ckpt_file(p, sizeof p, name, step);
    snprintf(keep, sizeof keep, "%s.orig", p);
    if (rename(p, keep) && unlink(p) && rmdir(p)) return -1;
    return fifo ? mkfifo(p, 0644) : mkdir(p, 0755);
}

/* The number of names in g_dir/name ending in suffix. */
static int count_suffix(const char *name, const char *suffix) {
    char d[512];
    snprintf(d, sizeof d, "%s/%s", g_dir, name);
    DIR *dd = opendir(d);
    int n = 0;
    size_t ls = strlen(suffix);
    for (struct dirent *e; dd && (e = readdir(dd));) {
        size_t l = strlen(e->d_name);
        n += l >= ls && !strcmp(e->d_name + l - ls, suffix);
    }
    if (dd) closedir(dd);
    return n;
}

/* An unreadable newest checkpoint stops the resume naming it; nothing is moved aside. */
static void test_unreadable_newest_stops_resume(void) {
    char cfg[512], out[512], p[512], runjson[512];
    QT_REQUIRE(run_to_end("unr", 6, 2, 5, NULL) == 0, "first run failed");
    snprintf(runjson, sizeof runjson, "%s/unr/run.json", g_dir);
    size_t n0, n1;
    char *before = qt_t_read_file(runjson, &n0);
    ckpt_file(p, sizeof p, "unr", 6);
    write_cfg(cfg, sizeof cfg, "unr", 6, 2, 5, NULL);
    snprintf(out, sizeof out, "%s/unr2.out", g_dir);
    const char *args[] = {cfg, "--resume", "--set", "optim.steps=8", NULL};
    for (int fifo = 0; fifo < 2; fifo++) {
        QT_REQUIRE(unreadable("unr", 6, fifo) == 0, "cannot make %s unreadable", p);
        int st = wait_status(spawn(out, args), 60);
        QT_EXPECT(st == 1 && file_has(out, p) && file_has(out, fifo ? "(a FIFO)" : "(a directory)") &&
                  !file_has(out, "resumed from"), "%s as the newest: status %d (see %s)", fifo ? "a FIFO" : "a directory", st, out);
        QT_EXPECT(exists(p) && count_suffix("unr", ".bad") == 0, "the unreadable checkpoint was moved aside");
        unlink(out);
    }
    char *after = qt_t_read_file(runjson, &n1);
    QT_EXPECT(before && after && n0 == n1 && !memcmp(before, after, n0), "run.json rewritten");
    free(before);
    free(after);
}

/* With every checkpoint unreadable, nothing is renamed, so a fresh run is still refused and run.json
 * keeps its run id. */
static void test_all_unreadable_keeps_dir_used(void) {
    char cfg[512], out[512], runjson[512];
    QT_REQUIRE(run_to_end("allu", 4, 2, 5, NULL) == 0, "first run failed");
    snprintf(runjson, sizeof runjson, "%s/allu/run.json", g_dir);
    size_t n0, n1;
    char *before = qt_t_read_file(runjson, &n0);
    QT_REQUIRE(unreadable("allu", 2, 0) == 0 && unreadable("allu", 4, 0) == 0, "mkdir");
    write_cfg(cfg, sizeof cfg, "allu", 4, 2, 5, NULL);
    snprintf(out, sizeof out, "%s/allu2.out", g_dir);
    const char *res[] = {cfg, "--resume", "--set", "optim.steps=6", NULL}, *fresh[] = {cfg, NULL};
    int st = run_qtrain(out, res);
    QT_EXPECT(st == 1 && count_suffix("allu", ".bad") == 0, "resume: status %d, %d moved aside (see %s)", st,
              count_suffix("allu", ".bad"), out);
    st = run_qtrain(out, fresh);
    QT_EXPECT(st == 1 && file_has(out, "already holds"), "a fresh run: status %d (see %s)", st, out);
    char *after = qt_t_read_file(runjson, &n1);
    QT_EXPECT(before && after && n0 == n1 && !memcmp(before, after, n0), "run.json rewritten");
    free(before);
    free(after);
}

/* Deleting .lock while a run trains does not let a second run into the directory (one with a log of
 * its own: the first run's log is locked too). */
static void test_lock_survives_lock_file_deletion(void) {
    char cfg[512], out[512], out2[512], lock[512], log2[600];
    write_cfg(cfg, sizeof cfg, "lk", 1000000, 0, 2, NULL);
    snprintf(out, sizeof out, "%s/lk.out", g_dir);
    unlink(out);
    snprintf(log2, sizeof log2, "log.file=%s/lk2.jsonl", g_dir);
    const char *args[] = {cfg, NULL}, *second[] = {cfg, "--set", log2, NULL};
    pid_t pid = spawn(out, args);
    QT_REQUIRE(wait_text(out, "step      2/", pid, 60), "no step 2 (see %s)", out);
    snprintf(lock, sizeof lock, "%s/lk/.lock", g_dir);
    QT_EXPECT(unlink(lock) == 0, "unlink %s", lock);
    snprintf(out2, sizeof out2, "%s/lk2.out", g_dir);
    unlink(out2);
    int st = wait_status(spawn(out2, second), 30);
    QT_EXPECT(st == 1 && file_has(out2, "in use by another run"), "second run: status %d (see %s)", st, out2);
    kill(pid, SIGINT);
    st = wait_status(pid, 60);
    QT_EXPECT(st == QT_EXIT_STOPPED, "first run: status %d", st);
}

/* A starting run deletes the temp files of killed writes, but not one a live write holds (flock). */
static void test_live_temp_file_kept(void) {
    char d[512], live[600], stale[600], cfg[512], out[512];
    snprintf(d, sizeof d, "%s/tmpk", g_dir);
    mkdir(d, 0755);
    snprintf(live, sizeof live, "%s/ckpt_00000005.qtc.tmp", d);
    snprintf(stale, sizeof stale, "%s/ckpt_00000003.qtc.tmp", d);
    int fd = open(live, O_RDWR | O_CREAT, 0644), fs = open(stale, O_RDWR | O_CREAT, 0644);
    QT_REQUIRE(fd >= 0 && fs >= 0 && flock(fd, LOCK_EX) == 0, "temp files");
    close(fs);
    write_cfg(cfg, sizeof cfg, "tmpk", 4, 0, 2, NULL);
    snprintf(out, sizeof out, "%s/tmpk.out", g_dir);
    const char *args[] = {cfg, NULL};
    int st = run_qtrain(out, args);
    QT_EXPECT(st == 0 && exists(live) && !exists(stale), "status %d, live temp kept %d, stale removed %d (see %s)", st,
              exists(live), !exists(stale), out);
    close(fd);
}

/* A FIFO as the config, a data shard or the log is refused at once, named. */
static void test_fifo_inputs_refused(void) {
    char cfg[512], out[512], fifo[512], set[600];
    write_cfg(cfg, sizeof cfg, "ff", 4, 0, 2, NULL);
    snprintf(out, sizeof out, "%s/ff.out", g_dir);
    static const char *const what[3] = {"config", "data", "log"};
    for (int k = 0; k < 3; k++) {
        snprintf(fifo, sizeof fifo, "%s/ff%d_0.%s", g_dir, k, k == 1 ? "bin" : k ? "jsonl" : "yaml");
        QT_REQUIRE(mkfifo(fifo, 0644) == 0, "mkfifo %s", fifo);
        if (k == 1) snprintf(set, sizeof set, "data.train=%s/ff1_*.bin", g_dir);
        else snprintf(set, sizeof set, "log.file=%s", fifo);
        const char *a0[] = {fifo, NULL}, *a1[] = {cfg, "--set", set, NULL};
        unlink(out);
        int st = wait_status(spawn(out, k ? a1 : a0), 30);
        QT_EXPECT(st == 1 && file_has(out, fifo) && file_has(out, "FIFO"), "a FIFO as the %s: status %d (see %s)",
                  what[k], st, out);
    }
}

/* The field `key` ("SigBlk:" in hex, "Threads:" in decimal: base) of /proc/<pid>/status, 0 when unreadable. */
static unsigned long long proc_field(pid_t pid, const char *key, int base) {
    char p[64], line[256];
    unsigned long long v = 0;
    snprintf(p, sizeof p, "/proc/%d/status", (int)pid);
    FILE *f = fopen(p, "r");
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, key, strlen(key))) v = strtoull(line + strlen(key) + 1, NULL, base);
    if (f) fclose(f);
    return v;
}

/* Starts a fresh 100-step run `name`, its output in out. */
static pid_t spawn_run(const char *name, char *out, size_t cap) {
    char cfg[512];
    write_cfg(cfg, sizeof cfg, name, 100, 0, 2, NULL);
    snprintf(out, cap, "%s/%s.out", g_dir, name);
    unlink(out);
    const char *args[] = {cfg, NULL};
    return spawn(out, args);
}

/* A SIGTERM as soon as qtrain holds stop signals: it stops before training, exit 75, and leaves no
 * checkpoint (nothing was trained) and no run.json. */
static void test_stop_during_startup(void) {
    char out[512], d[512];
    pid_t pid = spawn_run("sst", out, sizeof out);
    double t0 = mono_s();
    while (!(proc_field(pid, "SigBlk:", 16) & (1ull << (SIGTERM - 1))) && mono_s() - t0 < 30) usleep(200);
    kill(pid, SIGTERM);
    int st = wait_status(pid, 60);
    snprintf(d, sizeof d, "%s/sst/run.json", g_dir);
    QT_EXPECT(st == QT_EXIT_STOPPED && (file_has(out, "during start-up") || file_has(out, "before the first step")) &&
              newest_step("sst") < 0 && !exists(d), "status %d, newest checkpoint %ld, run.json %d (see %s)", st,
              newest_step("sst"), exists(d), out);
}

/* The first instant: stop signals are blocked before the shared libraries' initializers run (cuDNN's
 * and cuBLASLt's take about 0.1 s, before main() starts its signal thread), so a SIGINT then asks for a
 * stop instead of killing the process. Seen from outside: SIGINT blocked while the process still has
 * one thread, in two looks 5 ms apart (main() blocks and starts its thread within microseconds). */
static void test_sigint_in_first_instant(void) {
    char out[512];
    pid_t pid = spawn_run("sfi", out, sizeof out);
    double t0 = mono_s();
    int seen = 0;
    while (seen < 2 && mono_s() - t0 < 30) {
        unsigned long long threads = proc_field(pid, "Threads:", 10), blocked = proc_field(pid, "SigBlk:", 16) & (1ull << (SIGINT - 1));
        if (threads > 1 || waitpid(pid, NULL, WNOHANG) != 0) break;
        seen = blocked && threads == 1 ? seen + 1 : 0;
        usleep(seen ? 5000 : 500);
    }
    kill(pid, SIGINT);
    int st = wait_status(pid, 60);
    QT_EXPECT(seen == 2, "SIGINT was not blocked before main() (see %s)", out);
    QT_EXPECT(st == QT_EXIT_STOPPED, "status %d, expected 75 (see %s)", st, out);
}

/* A data error before step 1 saves nothing, so the directory takes a fresh run afterwards. */
static void test_data_error_before_step1(void) {
    char cfg[512], out[512], bad[512], err[512], set[600];
    snprintf(bad, sizeof bad, "%s/bad1_0.bin", g_dir);
    QT_REQUIRE(write_shard(bad, 1, err, sizeof err) == 0, "%s", err);
    write_cfg(cfg, sizeof cfg, "de1", 4, 0, 2, NULL);
    snprintf(out, sizeof out, "%s/de1.out", g_dir);
    snprintf(set, sizeof set, "data.train=%s", bad);
    const char *args[] = {cfg, "--set", set, NULL}, *good[] = {cfg, NULL};
    int st = run_qtrain(out, args);
    QT_EXPECT(st == 1 && file_has(out, "bad1_0.bin") && newest_step("de1") < 0, "status %d, newest checkpoint %ld (see %s)",
              st, newest_step("de1"), out);
    st = run_qtrain(out, good);
    QT_EXPECT(st == 0 && newest_step("de1") == 4, "a fresh run after it: status %d (see %s)", st, out);
}

static void test_grad_accum_change_refused(void) {
    char cfg[512], out[512];
    QT_REQUIRE(run_to_end("ga", 4, 0, 2, NULL) == 0, "first run failed");
    write_cfg(cfg, sizeof cfg, "ga", 4, 0, 2, NULL);
    snprintf(out, sizeof out, "%s/ga2.out", g_dir);
    const char *args[] = {cfg, "--resume", "--set", "optim.steps=6", "--set", "data.grad_accum=2", NULL};
    int st = run_qtrain(out, args);
    QT_EXPECT(st == 1 && file_has(out, "data.grad_accum: checkpoint 1, config 2") &&
              file_has(out, "--allow-changed data.grad_accum"), "status %d (see %s)", st, out);
}

/* 200 tokens of seq_len 16 hold 12 windows: 6 batches of micro_batch 2. */
static void test_eval_batches_past_eval_set(void) {
    char cfg[512], out[512], ev[512], err[512], set[600];
    uint32_t t[200];
    for (int i = 0; i < 200; i++) t[i] = (uint32_t)(i * 5 % 64);
    snprintf(ev, sizeof ev, "%s/ev_0.bin", g_dir);
    QT_REQUIRE(qt_tokens_write(ev, t, 200, 2, 64, 0, err, sizeof err) == 0, "%s", err);
    write_cfg(cfg, sizeof cfg, "evb", 4, 0, 2, NULL);
    snprintf(out, sizeof out, "%s/evb.out", g_dir);
    snprintf(set, sizeof set, "data.eval=%s", ev);
    const char *args[] = {cfg, "--set", set, "--set", "eval.every=2", "--set", "eval.batches=50", NULL};
    int st = run_qtrain(out, args);
    QT_EXPECT(st == 1 && file_has(out, "eval.batches: 50") && file_has(out, "give at most") && !file_has(out, "step      1/"),
              "status %d (see %s)", st, out);
}

/* 1e-10 GiB is a limit nothing fits, as 0.0001 (0.1 MiB, less than the tiny model's plan) is: never
 * "no limit". */
static void test_tiny_memory_limit_refused(void) {
    char cfg[512], out[512];
    write_cfg(cfg, sizeof cfg, "mem", 4, 0, 2, NULL);
    snprintf(out, sizeof out, "%s/mem.out", g_dir);
    const char *a[3][6] = {{cfg, "--plan", "--host-mem", "0.0001", NULL},
                           {cfg, "--plan", "--host-mem", "1e-10", NULL},
                           {cfg, "--plan", "--set", "memory.host_limit_gib=1e-10", NULL}};
    for (int k = 0; k < 3; k++) {
        int st = run_qtrain(out, a[k]);
        QT_EXPECT(st == QT_EXIT_NO_FIT && file_has(out, "does not fit"), "%s %s: status %d (see %s)", a[k][2], a[k][3], st, out);
    }
}

static int write_json(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    fputs(text, f);
    return fclose(f);
}

#define HF_HEAD "{\"model_type\": \"llama\", \"hidden_size\": 64, \"num_hidden_layers\": 1, \"num_attention_heads\": 4," \
                " \"intermediate_size\": 96, \"vocab_size\": 100, "

/* config.json that Python's json and qtrain would read differently is refused, naming the key. */
static void test_hf_config_two_meanings_refused(void) {
    char path[512], err[1024];
    qt_model_cfg c;
    snprintf(path, sizeof path, "%s/config.json", g_dir);
    QT_REQUIRE(write_json(path, HF_HEAD "\"rope_theta\": 10000, \"rope_theta\": 1000000}") == 0, "write");
    QT_EXPECT(qt_hf_read_config(path, &c, err, sizeof err) != 0 && strstr(err, path) && strstr(err, "duplicate key \"rope_theta\""),
              "duplicate rope_theta: %s", err);
    QT_REQUIRE(write_json(path, HF_HEAD "\"rope_theta\": 1000000, \"rope_parameters\": {\"rope_theta\": 10000}}") == 0, "write");
    QT_EXPECT(qt_hf_read_config(path, &c, err, sizeof err) != 0 && strstr(err, path) && strstr(err, "rope_theta 1e+06") &&
              strstr(err, "rope_parameters.rope_theta 10000"), "disagreeing rope_theta: %s", err);
    QT_REQUIRE(write_json(path, HF_HEAD "\"rope_theta\": 1000000, \"rope_parameters\": {\"rope_theta\": 1000000.0}}") == 0, "write");
    QT_EXPECT(qt_hf_read_config(path, &c, err, sizeof err) == 0 && c.rope_theta == 1e6f, "agreeing rope_theta: %s", err);
}

int main(int argc, char **argv) {
    if (qt_t_run_setup(argc, argv, "qt_start")) return 1;
    QT_RUN(test_unreadable_newest_stops_resume);
    QT_RUN(test_all_unreadable_keeps_dir_used);
    QT_RUN(test_lock_survives_lock_file_deletion);
    QT_RUN(test_live_temp_file_kept);
    QT_RUN(test_fifo_inputs_refused);
    QT_RUN(test_stop_during_startup);
    QT_RUN(test_sigint_in_first_instant);
    QT_RUN(test_data_error_before_step1);
    QT_RUN(test_grad_accum_change_refused);
    QT_RUN(test_eval_batches_past_eval_set);
    QT_RUN(test_tiny_memory_limit_refused);
    QT_RUN(test_hf_config_two_meanings_refused);
    if (!qt_t_nfail) qt_t_rmtree(g_dir);
    else printf("  files kept in %s\n", g_dir);
    return qt_test_end();
}
