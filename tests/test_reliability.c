/* test_reliability.c — how a training run ends badly and what survives, on the CPU path: signals
 * (a checkpoint, exit 75, bit-exact resume after SIGINTs at random times), 50 SIGKILLs at random
 * times, each followed by a resume from a valid checkpoint, a used or locked checkpoint.dir, resume
 * fallback, identity keys and past-the-end resumes, problems found at start (checkpoint.dir,
 * log.file), a data error mid-run, non-finite weights never saved, the JSONL log on a kill, an export
 * without data.
 *
 * Most tests drive the qtrain program (beside this test's build folder, or argv[1]) in child
 * processes (qt_test_run.h; QT_MATMUL_AUTOTUNE=0, so that GPU runs in different processes stay
 * bitwise comparable).
 * Random times come from a seed printed at the start (argv[2] repeats a run). */
#include <dirent.h>

#include "qt_device.h"
#include "qt_dtype.h"
#include "qt_engine.h"
#include "qt_json.h"
#include "qt_test_hooks.h"
#include "qt_test_run.h"
#include "qt_train_ckpt.h"

static unsigned g_seed;

static void test_fresh_run_refuses_used_dir(void) {
    char cfg[512], out[512];
    QT_REQUIRE(run_to_end("used", 4, 0, 2, NULL) == 0, "first run failed");
    write_cfg(cfg, sizeof cfg, "used", 4, 0, 2, NULL);
    snprintf(out, sizeof out, "%s/used2.out", g_dir);
    const char *args[] = {cfg, NULL};
    int st = run_qtrain(out, args);
    QT_EXPECT(st == 1 && file_has(out, "already holds") && file_has(out, "--resume"),
              "a fresh run in a used checkpoint.dir: status %d (see %s)", st, out);
    QT_EXPECT(!file_has(out, "step      1/"), "the refused run trained");
}

static void test_resume_past_steps_refused(void) {
    char cfg[512], out[512];
    QT_REQUIRE(newest_step("used") == 4 || run_to_end("used", 4, 0, 2, NULL) == 0, "first run failed");
    write_cfg(cfg, sizeof cfg, "used", 4, 0, 2, NULL);
    snprintf(out, sizeof out, "%s/used3.out", g_dir);
    const char *args[] = {cfg, "--resume", NULL};
    int st = run_qtrain(out, args);
    QT_EXPECT(st == 1 && file_has(out, "nothing to train") && file_has(out, "optim.steps"),
              "--resume at step 4 of 4: status %d (see %s)", st, out);
}

static void test_resume_changed_keys_refused(void) {
    char cfg[512], out[512];
    QT_REQUIRE(newest_step("used") == 4 || run_to_end("used", 4, 0, 2, NULL) == 0, "first run failed");
    write_cfg(cfg, sizeof cfg, "used", 4, 0, 2, NULL);
    snprintf(out, sizeof out, "%s/used4.out", g_dir);
    const char *args[] = {cfg, "--resume", "--set", "optim.steps=6", "--set", "data.seq_len=8", "--set", "seed=7", NULL};
    int st = run_qtrain(out, args);
    QT_EXPECT(st == 1 && file_has(out, "data.seq_len: checkpoint 16, config 8") &&
              file_has(out, "seed: checkpoint 1234, config 7") && file_has(out, "--allow-changed data.seq_len,seed"),
              "changed seq_len and seed: status %d (see %s)", st, out);
    QT_EXPECT(!file_has(out, "step      5/"), "the refused resume trained");
    const char *ok[] = {cfg, "--resume", "--set", "optim.steps=6", "--set", "data.seq_len=8", "--set", "seed=7",
                        "--allow-changed", "data.seq_len,seed", NULL};
    st = run_qtrain(out, ok);
    QT_EXPECT(st == 0 && file_has(out, "the data changed") && newest_step("used") == 6,
              "accepted change: status %d, newest step %ld (see %s)", st, newest_step("used"), out);
    const char *typo[] = {cfg, "--resume", "--set", "optim.steps=8", "--allow-changed", "optim.lr", NULL};
    st = run_qtrain(out, typo);
    QT_EXPECT(st == 1 && file_has(out, "not a key a resume checks"), "--allow-changed optim.lr: status %d", st);
}

static void test_resume_falls_back_to_valid(void) {
    char cfg[512], out[512], p[512], bad[600];
    QT_REQUIRE(run_to_end("fb", 6, 2, 5, NULL) == 0, "first run failed");
    ckpt_file(p, sizeof p, "fb", 6);
    FILE *f = fopen(p, "r+b");
    QT_REQUIRE(f, "open %s", p);
    fseek(f, 1000, SEEK_SET);
    int c = fgetc(f);
    fseek(f, 1000, SEEK_SET);
    fputc(c ^ 0x40, f);
    fclose(f);
    write_cfg(cfg, sizeof cfg, "fb", 6, 2, 5, NULL);
    snprintf(out, sizeof out, "%s/fb2.out", g_dir);
    const char *args[] = {cfg, "--resume", "--set", "optim.steps=8", NULL}; /* a resume changes --set keys only */
    int st = run_qtrain(out, args);
    snprintf(bad, sizeof bad, "%s.bad", p);
    QT_EXPECT(st == 0 && file_has(out, "warning") && file_has(out, "ckpt_00000006.qtc") &&
              file_has(out, "resumed from") && file_has(out, "ckpt_00000004.qtc at step 4"),
              "resume past a damaged newest checkpoint: status %d (see %s)", st, out);
    QT_EXPECT(exists(bad) && newest_step("fb") == 8, "moved aside: %d, newest %ld", exists(bad), newest_step("fb"));
}

static void test_unwritable_ckpt_dir_found_at_start(void) {
    char cfg[512], out[512], file[512], set[600];
    snprintf(file, sizeof file, "%s/afile", g_dir);
    FILE *f = fopen(file, "w");
    QT_REQUIRE(f, "create %s", file);
    fclose(f);
    write_cfg(cfg, sizeof cfg, "afile_run", 4, 0, 2, NULL);
    snprintf(out, sizeof out, "%s/afile.out", g_dir);
    snprintf(set, sizeof set, "checkpoint.dir=%s/ck", file); /* below a regular file */
    const char *args[] = {cfg, "--set", set, NULL};
    int st = run_qtrain(out, args);
    QT_EXPECT(st == 1 && file_has(out, "checkpoint.dir") && !file_has(out, "step      1/"),
              "unusable checkpoint.dir: status %d, trained first: %d (see %s)", st, file_has(out, "step      1/"), out);
    /* a run refused later in its setup (no data) leaves no checkpoint.dir behind */
    char d[512], nodata[600];
    snprintf(nodata, sizeof nodata, "data.train=%s/no_such_*.bin", g_dir);
    const char *args2[] = {cfg, "--set", nodata, NULL};
    st = run_qtrain(out, args2);
    snprintf(d, sizeof d, "%s/afile_run", g_dir);
    QT_EXPECT(st == 1 && file_has(out, "no_such_") && !exists(d), "no data: status %d, %s left: %d", st, d, exists(d));
}

static void test_log_write_failure_is_an_error(void) {
    char cfg[512], out[512];
    write_cfg(cfg, sizeof cfg, "full", 4, 0, 2, NULL);
    snprintf(out, sizeof out, "%s/full.out", g_dir);
    const char *args[] = {cfg, "--set", "log.file=/dev/full", NULL};
    int st = run_qtrain(out, args);
    QT_EXPECT(st == 1 && file_has(out, "log.file") && file_has(out, "/dev/full") && !file_has(out, "step      1/"),
              "log.file /dev/full: status %d (see %s)", st, out);
}

/* A second shard whose payload is damaged (its header is fine, so it passes the checks at start) is
 * found when the loader first reads it: the run saves its last completed step, then fails naming it. */
static void test_data_error_mid_run_saves(void) {
    char cfg[512], out[512], bad[512], err[512];
    snprintf(bad, sizeof bad, "%s/mix_1.bin", g_dir);
    QT_REQUIRE(write_shard(bad, 0, err, sizeof err) == 0, "%s", err);
    snprintf(bad, sizeof bad, "%s/mix_0.bin", g_dir); /* seed 1234 reads mix_1 first */
    QT_REQUIRE(write_shard(bad, 1, err, sizeof err) == 0, "%s", err);
    write_cfg(cfg, sizeof cfg, "mix", 1000, 0, 2, NULL);
    snprintf(out, sizeof out, "%s/mix.out", g_dir);
    char set[600];
    snprintf(set, sizeof set, "data.train=%s/mix_*.bin", g_dir);
    const char *args[] = {cfg, "--set", set, NULL};
    int st = run_qtrain(out, args);
    long s = newest_step("mix");
    char p[512];
    ckpt_file(p, sizeof p, "mix", s);
    qt_ckpt *ck = s >= 0 ? qt_ckpt_open(p, err, sizeof err) : NULL;
    printf("  damaged shard met after %ld steps\n", s);
    QT_EXPECT(st == 1 && file_has(out, "mix_0.bin") && file_has(out, "are saved in") && ck && s > 0,
              "status %d, newest checkpoint %ld (see %s)", st, s, out);
    qt_ckpt_close(ck);
}

/* A step whose update makes weights Inf (lr 3.4e38, weight decay 100: |lr * (update + 100 w)| passes
 * FLT_MAX) while its loss and norm are finite: an error naming a tensor, nothing saved, and the good
 * checkpoint of step 6 stays although keep is 1. */
static void test_nonfinite_state_never_saved(void) {
    char cfg[512], out[512], p[512], err[512];
    QT_REQUIRE(run_to_end("nan", 6, 3, 1, NULL) == 0, "first run failed");
    write_cfg(cfg, sizeof cfg, "nan", 6, 3, 1, NULL);
    snprintf(out, sizeof out, "%s/nan2.out", g_dir);
    const char *args[] = {cfg, "--resume", "--set", "optim.steps=1000000", "--set", "optim.lr=3.4e38", "--set",
                          "optim.warmup=0", "--set", "optim.weight_decay=100", "--set", "checkpoint.every=1", NULL};
    int st = run_qtrain(out, args);
    QT_EXPECT(st == 1 && file_has(out, "NaN/Inf") && file_has(out, "model."), "status %d (see %s)", st, out);
    QT_REQUIRE(newest_step("nan") == 6, "newest checkpoint: step %ld, expected the good one of step 6", newest_step("nan"));
    ckpt_file(p, sizeof p, "nan", 6);
    qt_ckpt *ck = qt_ckpt_open(p, err, sizeof err);
    QT_REQUIRE(ck, "%s", err);
    size_t nb;
    const float *w = qt_ckpt_get(ck, "weights", &nb, NULL);
    size_t bad = 0;
    for (size_t i = 0; w && i < nb / 4; i++) bad += !isfinite(w[i]);
    QT_EXPECT(w && bad == 0, "%zu non-finite weights in the kept checkpoint", bad);
    qt_ckpt_close(ck);
}

/* The writer's check, the guard for engines without a per-step finiteness hook (GPU): a NaN in an
 * fp32 blob, an Inf in a bf16 one and in a bf16 one widened to fp32 as written (a bf16 master's
 * "weights", QT_CKPT_WIDEN_BF16), a NaN in a gathered fp32 one's second run (QT_CKPT_GATHERED) are refused, naming blob, tensor and element; nothing is written. */
static void test_writer_refuses_nonfinite_blob(void) {
    qt_model_cfg mc = {.vocab_size = 64, .hidden_size = 16, .num_layers = 2, .num_heads = 2, .num_kv_heads = 1,
                       .intermediate_size = 32, .max_seq_len = 16, .qkv_bias = 1, .tie_embeddings = 1};
    qt_model_cfg_finish(&mc);
    qt_layout L;
    char err[1024], dir[512];
    QT_REQUIRE(qt_layout_init(&L, &mc, err, sizeof err) == 0, "%s", err);
    qt_engine eng = {NULL, &L, NULL, 1, NULL};
    qt_trainer t = {.eng = &eng, .ck = {.saved_step = 5}};
    qt_ckpt_writer *w = qt_ckpt_writer_create(qt_trainer_check_finite, &t);
    float *wf = calloc(L.numel, sizeof(float));
    uint16_t *wb = calloc(L.numel, sizeof(uint16_t));
    const qt_tensor *tt = &L.tensors[L.n_tensors / 2];
    snprintf(dir, sizeof dir, "%s/refuse", g_dir);
    /* k 4: the fp32 weights gathered from two runs (a sharded state's pieces), the NaN in the second */
    size_t cut = tt->offset + 1;
    float *second = malloc((L.numel - cut) * sizeof(float));
    qt_ckpt_seg runs[2] = {{0, wf}, {cut * 4, second}};
    qt_ckpt_gather g = {runs, 2};
    for (int k = 0; k < 5; k++) {
        if (k == 1) wf[tt->offset + 3] = NAN;
        if (k == 2) wf[tt->offset + 3] = 0, wb[tt->offset + 3] = 0x7f80; /* bf16 +Inf */
        qt_ckpt_item items[2] = {{"weights", QT_DT_F32, wf, L.numel * 4, 0}, {"weights_bf16", QT_DT_BF16, wb, L.numel * 2, 0}};
        if (k == 3) items[0] = (qt_ckpt_item){"weights", QT_DT_F32, wb, L.numel * 4, QT_CKPT_WIDEN_BF16}; /* written first */
        if (k == 4) {
            wb[tt->offset + 3] = 0;
            memcpy(second, wf + cut, (L.numel - cut) * sizeof(float));
            second[tt->offset + 3 - cut] = NAN;
            items[0] = (qt_ckpt_item){"weights", QT_DT_F32, &g, L.numel * 4, QT_CKPT_GATHERED};
        }
        QT_REQUIRE(qt_ckpt_writer_start(w, dir, 5 + k, 0, items, 2, err, sizeof err) == 0, "%s", err);
        err[0] = 0;
        int rc = qt_ckpt_writer_wait(w, NULL, NULL, err, sizeof err);
        char want[160];
        snprintf(want, sizeof want, "%s[3]", tt->name);
        if (k == 0) QT_EXPECT(rc == 0, "finite state refused: %s", err);
        else QT_EXPECT(rc == -1 && strstr(err, want) && strstr(err, k == 2 ? "weights_bf16 holds" : "weights holds"),
                       "case %d: rc %d: %s", k, rc, err);
    }
    free(second);
    QT_EXPECT(newest_step("refuse") == 5, "newest %ld: a refused state was written", newest_step("refuse"));
    QT_EXPECT(qt_ckpt_writer_wait(w, NULL, NULL, err, sizeof err) == 1, "a wait with nothing in flight");
    qt_ckpt_writer_free(w);
    free(wf);
    free(wb);
    qt_layout_free(&L);
}

static void test_export_needs_no_data(void) {
    char cfg[512], out[512], p[512], set[512];
    write_cfg(cfg, sizeof cfg, "exp", 4, 0, 2, NULL);
    snprintf(out, sizeof out, "%s/exp.out", g_dir);
    snprintf(set, sizeof set, "data.train=%s/no_such_*.bin", g_dir);
    const char *args[] = {cfg, "--export", "--set", set, NULL};
    int st = run_qtrain(out, args);
    snprintf(p, sizeof p, "%s/exp/export/model.safetensors", g_dir);
    QT_EXPECT(st == 0 && exists(p), "--export without data: status %d (see %s)", st, out);
}

/* Starts run `name` with 1,000,000 steps (cfg and out filled) and waits for `text` in its output.
 * Returns the pid, or -1 when the text did not come. */
static pid_t start_long_run(const char *name, char *cfg, char *out, size_t cap, const char *text) {
    write_cfg(cfg, cap, name, 1000000, 0, 2, NULL);
    snprintf(out, cap, "%s/%s.out", g_dir, name);
    unlink(out);
    const char *args[] = {cfg, NULL};
    pid_t pid = spawn(out, args);
    return wait_text(out, text, pid, 60) ? pid : -1;
}

/* SIGINT during training: the step ends, a checkpoint is written, exit 75; SIGTERM after a resume
 * the same. Then a second SIGINT while the first one's stop is under way ends the process at once: the
 * run's steps take about a second (a wider model, 16 micro-steps per step), the second signal goes out as
 * soon as the run says it took the first (two signals pending at once would merge into one). Each run has
 * its own output file, so each wait reads only its run's lines. */
static void test_signal_checkpoints_and_exits_75(void) {
    char cfg[512], out[512], out2[512], cfg2[512];
    pid_t pid = start_long_run("sig", cfg, out, sizeof out, "step      2/");
    QT_REQUIRE(pid > 0, "no step 2 (see %s)", out);
    const char *res[] = {cfg, "--resume", NULL};
    kill(pid, SIGINT);
    int st = wait_status(pid, 60);
    long s = newest_step("sig");
    QT_EXPECT(st == QT_EXIT_STOPPED && s >= 2 && file_has(out, "stopped by SIGINT") && file_has(out, "continue with --resume"),
              "SIGINT: status %d, checkpoint step %ld (see %s)", st, s, out);
    snprintf(out2, sizeof out2, "%s/sig_term.out", g_dir);
    unlink(out2);
    pid = spawn(out2, res);
    QT_REQUIRE(wait_text(out2, "resumed from", pid, 60), "no resume (see %s)", out2);
    kill(pid, SIGTERM);
    st = wait_status(pid, 60);
    QT_EXPECT(st == QT_EXIT_STOPPED && file_has(out2, "stopped by SIGTERM") && newest_step("sig") >= s,
              "SIGTERM: status %d (see %s)", st, out2);
    snprintf(cfg2, sizeof cfg2, "%s/sig_two.yaml", g_dir);
    snprintf(out2, sizeof out2, "%s/sig_two.out", g_dir);
    unlink(out2);
    FILE *f = fopen(cfg2, "w");
    QT_REQUIRE(f, "cannot write %s", cfg2);
    fprintf(f,
            "model: {vocab_size: 64, hidden_size: 256, num_layers: 2, num_heads: 2, num_kv_heads: 1,\n"
            "        intermediate_size: 1024, max_seq_len: 16}\n"
            "data: {train: '%s/tr_*.bin', seq_len: 16, micro_batch: 2, grad_accum: 16}\n"
            "optim: {lr: 0.003, warmup: 3, steps: 1000000}\n"
            "checkpoint: {dir: '%s/sig_two'}\nlog: {every: 1}\ndevice: cpu\n",
            g_dir, g_dir);
    fclose(f);
    const char *two[] = {cfg2, NULL};
    pid = spawn(out2, two);
    int took = wait_text(out2, "step      2/", pid, 120) && !kill(pid, SIGINT) && wait_text(out2, "stop requested", pid, 60);
    kill(pid, took ? SIGINT : SIGKILL);
    st = wait_status(pid, 60);
    QT_REQUIRE(took, "no step 2, or the first SIGINT was not taken (see %s)", out2);
    QT_EXPECT(st == 128 + SIGINT, "a second SIGINT during the stop: status %d, expected death by SIGINT (130) (see %s)",
              st, out2);
}

/* The JSONL log of a killed run: a config line first, then one flushed record per printed step, each
 * with time, elapsed_s and tokens; every line parses as JSON. */
static void test_log_survives_kill(void) {
    char cfg[512], out[512], logp[512], err[512];
    snprintf(logp, sizeof logp, "%s/klog.jsonl", g_dir);
    pid_t pid = start_long_run("klog", cfg, out, sizeof out, "step     12/");
    QT_REQUIRE(pid > 0, "no step 12 (see %s)", out);
    kill(pid, SIGKILL);
    wait_status(pid, 10);
    size_t n = 0;
    char *text = qt_t_read_file(logp, &n);
    QT_REQUIRE(text, "no log %s", logp);
    text[n] = 0;
    int lines = 0, train = 0, good = 1;
    for (char *line = text, *next; *line; line = next) {
        next = strchr(line, '\n');
        QT_EXPECT(next, "line %d is not terminated", lines + 1);
        if (!next) break;
        *next++ = 0;
        qt_json *j = qt_json_parse(line, strlen(line), err, sizeof err);
        QT_EXPECT(j, "line %d is not JSON (%s): %s", lines + 1, err, line);
        qt_json_free(j);
        if (lines == 0) QT_EXPECT(strstr(line, "{\"type\":\"config\"") == line && strstr(line, "\"optim.lr\":0.003"),
                                  "first line: %s", line);
        else if (strstr(line, "\"type\":\"train\"")) {
            train++;
            good &= strstr(line, "\"time\":") && strstr(line, "\"elapsed_s\":") &&
                    strstr(line, "\"tokens\":") != NULL;
        }
        lines++;
    }
    free(text);
    QT_EXPECT(train >= 11 && good, "%d train records (12 steps were printed), fields present: %d", train, good);
}

/* Another run on a checkpoint.dir that a run holds is refused. */
static void test_concurrent_run_refused(void) {
    char cfg[512], out[512], out2[512];
    pid_t pid = start_long_run("lock", cfg, out, sizeof out, "step      2/");
    QT_REQUIRE(pid > 0, "no step 2 (see %s)", out);
    snprintf(out2, sizeof out2, "%s/lock2.out", g_dir);
    unlink(out2);
    const char *args[] = {cfg, NULL};
    int st = wait_status(spawn(out2, args), 20);
    QT_EXPECT(st == 1 && file_has(out2, "in use by another run"), "second run: status %d (see %s)", st, out2);
    kill(pid, SIGINT);
    st = wait_status(pid, 60);
    QT_EXPECT(st == QT_EXIT_STOPPED, "first run: status %d", st);
}

/* 1 when dir/name was modified at or after Unix time t. */
static int modified_since(const char *dir, const char *name, double t) {
    char p[800];
    struct stat fs;
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return stat(p, &fs) == 0 && fs.st_mtim.tv_sec + fs.st_mtim.tv_nsec * 1e-9 >= t;
}

/* Waits until a checkpoint file newer than step `after` appears in dir — the temp file of a write just
 * begun, or (were writes not atomic) the checkpoint itself. 0 when pid ended or timeout_s passed. */
static int wait_new_ckpt_file(const char *dir, long after, pid_t pid, double timeout_s) {
    double t0 = mono_s();
    while (mono_s() - t0 < timeout_s) {
        DIR *d = opendir(dir);
        struct dirent *e;
        int found = 0;
        while (d && !found && (e = readdir(d)))
            /* a step newer than `after` (the newest checkpoint when this run started) is this run's
             * write; file times are not used: the GPU machine's /tmp keeps times the test's clock does
             * not match (the kill loop never saw a write there) */
            found = !strncmp(e->d_name, "ckpt_", 5) && atol(e->d_name + 5) > after;
        if (d) closedir(d);
        if (found) return 1;
        if (waitpid(pid, NULL, WNOHANG) != 0) return 0;
        usleep(100);
    }
    return 0;
}

/* Stops run `name` (steps, checkpoint every 2) with sig until it completes; every process must end as
 * `sig` allows. SIGINT: 0-100 ms after setup. SIGKILL, in turn: 0-startup_s after the start (mostly
 * during setup), as a checkpoint write begins, 0-50 ms after setup, as a write begins. Returns the
 * number of signals sent, -1 on a failure. */
static int interrupt_until_done(const char *name, int steps, int sig, int want_signals, double startup_s,
                                int *mid_write) {
    char cfg[512], out[512], d[512];
    write_cfg(cfg, sizeof cfg, name, steps, 2, 2, NULL);
    snprintf(out, sizeof out, "%s/%s.out", g_dir, name);
    snprintf(d, sizeof d, "%s/%s", g_dir, name);
    int sent = 0;
    for (int attempt = 0; attempt < 400; attempt++) {
        int resume = newest_step(name) >= 0;
        if (newest_step(name) == steps) return sent; /* killed after the last checkpoint */
        const char *a1[] = {cfg, NULL}, *a2[] = {cfg, "--resume", NULL};
        unlink(out);
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        double started = now.tv_sec + now.tv_nsec * 1e-9;
        pid_t pid = spawn(out, resume ? a2 : a1);
        int kind = sig == SIGINT ? 2 : sent % 4; /* 0: from the start, 1 and 3: a write, 2: after setup */
        /* SIGKILL in training: within 50 ms, so that 50 kills fit in one run on a fast machine */
        double delay = kind == 0 ? startup_s : sig == SIGINT ? 0.1 : 0.05;
        int go = sent < want_signals;
        if (go && kind == 2) go = wait_text(out, "qtrain: run ", pid, 60);
        if (go && kind % 2) go = wait_new_ckpt_file(d, newest_step(name), pid, 60);
        else if (go) usleep((useconds_t)(rand() / (RAND_MAX + 1.0) * delay * 1e6));
        if (go) {
            kill(pid, sig);
            sent++;
        }
        int st = wait_status(pid, 120);
        if (sig == SIGKILL && st == 128 + SIGKILL) {
            char tmp[64];
            long *s = NULL;
            int n = qt_ckpt_list(d, &s);
            snprintf(tmp, sizeof tmp, "ckpt_%08ld.qtc.tmp", n ? s[0] + 2 : 2L);
            *mid_write += modified_since(d, tmp, started); /* not one a start-up kill left alone */
            free(s);
        }
        int ok = st == 0 || (sig == SIGINT && st == QT_EXIT_STOPPED) || (sig == SIGKILL && st == 128 + SIGKILL);
        if (!ok || file_has(out, "warning")) {
            printf("  attempt %d: status %d%s; output:\n", attempt, st, ok ? " with a warning" : "");
            char cmd[600];
            snprintf(cmd, sizeof cmd, "tail -5 '%s'", out);
            if (system(cmd)) { /* the output is only a help */ }
            return -1;
        }
        if (st == 0) return sent;
    }
    return -1;
}

/* SIGINTs at random times during training and checkpointing (the writes take longer than the 2
 * steps between them, so many land mid-write): every stop exits 75, and the resumed runs end with a
 * checkpoint and export byte-identical to an uninterrupted run's. */
static void sigint_random_resume_bit_exact(const char *ref, const char *intr) {
    QT_REQUIRE(run_to_end(ref, 60, 2, 2, NULL) == 0, "reference run failed");
    int sent = interrupt_until_done(intr, 60, SIGINT, 20, 0, &(int){0});
    QT_REQUIRE(sent > 0, "interrupted runs failed (see %s/%s.out)", g_dir, intr);
    char why[256] = "", a[512], b[512];
    QT_EXPECT(same_state(ref, intr, 60, why, sizeof why), "final checkpoints differ: %s", why);
    snprintf(a, sizeof a, "%s/%s/export/model.safetensors", g_dir, ref);
    snprintf(b, sizeof b, "%s/%s/export/model.safetensors", g_dir, intr);
    size_t na = 0, nb = 0;
    char *fa = qt_t_read_file(a, &na), *fb = qt_t_read_file(b, &nb);
    QT_EXPECT(fa && fb && na == nb && memcmp(fa, fb, na) == 0, "exports differ (%zu vs %zu bytes)", na, nb);
    free(fa);
    free(fb);
    printf("  %d SIGINTs (random delays 0-100 ms after setup); resumed bit-exactly\n", sent);
}

/* 50 SIGKILLs (a quarter at random times from the start, a quarter at random times in training, half
 * as a checkpoint write begins): after each, the next run resumes from the newest checkpoint, which
 * must be valid (no fallback warning), and the final state equals an uninterrupted run's. */
static void sigkill_50_always_resumes(const char *ref, const char *killed, int steps, double startup_s) {
    QT_REQUIRE(newest_step(ref) == steps || run_to_end(ref, steps, 2, 2, NULL) == 0, "reference run failed");
    int mid = 0, kills = interrupt_until_done(killed, steps, SIGKILL, 50, startup_s, &mid);
    QT_REQUIRE(kills == 50, "kill loop failed after %d kills (see %s/%s.out)", kills, g_dir, killed);
    char why[256] = "";
    QT_EXPECT(same_state(ref, killed, steps, why, sizeof why), "final checkpoints differ: %s", why);
    printf("  50 SIGKILLs (13 from the start, 12 in training, 25 as a write began), %d left a partial write "
           "(.tmp); every resume found a valid checkpoint\n", mid);
}

static void test_sigint_random_resume_bit_exact(void) { sigint_random_resume_bit_exact("ref", "int"); }
/* 6000 steps: the tiny CPU model runs ~0.5 ms a step on an idle machine, and 50 kills' worth of attempts
 * (up to 0.15 s or 50 ms of training each) trained 2000 steps to the end before the 46th kill there. */
static void test_sigkill_50_always_resumes(void) { sigkill_50_always_resumes("ref6000", "kill", 6000, 0.15); }

/* The same on one GPU (CUDA start-up takes a second or two: the first kind of kill comes within 1.5 s;
 * 6000 steps, so that no attempt trains to the end before its kill on a fast GPU). */
static void test_sigint_random_resume_bit_exact_gpu(void) {
    if (qt_cuda_device_count() == 0) QT_SKIP("no CUDA device");
    g_gpu = 1;
    sigint_random_resume_bit_exact("ref_gpu", "int_gpu");
    g_gpu = 0;
}
static void test_sigkill_50_always_resumes_gpu(void) {
    if (qt_cuda_device_count() == 0) QT_SKIP("no CUDA device");
    g_gpu = 1;
    sigkill_50_always_resumes("ref_gpu6000", "kill_gpu", 6000, 1.5);
    g_gpu = 0;
}

/* ---- GPU: the per-step finiteness check of the updated weights ---- */

static const char *g_ckpt_offloaded = "auto"; /* gpu_run's checkpoint.offloaded */
static int g_ckpt_in_place;                    /* the last gpu_run wrote an offloaded state in place */

/* GPU run `name` (in this process): 12 steps, a checkpoint every `every`, keep `keep`; extra:
 * parallel/precision/memory; losses (may be NULL): [12]. */
static int gpu_run(const char *name, const char *extra, int every, int keep, const char *resume, float *losses,
                   char *err, size_t errlen) {
    char y[2048];
    snprintf(y, sizeof y,
             "model: {vocab_size: 64, hidden_size: 128, num_layers: 2, num_heads: 2, num_kv_heads: 1,\n"
             "        intermediate_size: 256, max_seq_len: 16}\n"
             "data: {train: '%s/tr_*.bin', seq_len: 16, micro_batch: 4}\n"
             "optim: {lr: 0.003, warmup: 3, steps: 12}\n"
             "checkpoint: {dir: '%s/%s', every: %d, keep: %d, offloaded: %s}\nlog: {file: '%s/%s.jsonl', every: 1}\n"
             "device: cuda\nperf: {matmul_autotune: false}\n%s\n", g_dir, g_dir, name, every, keep, g_ckpt_offloaded, g_dir,
             name, extra);
    static qt_config c;
    if (qt_config_load_string(&c, y, name, NULL, 0, err, errlen)) return -2;
    qt_train_opts o = {resume, -1, 0, losses, NULL, NULL};
    qt_train_stats st = {0};
    int rc = qt_train_run(&c, &o, &st, err, errlen);
    g_ckpt_in_place = st.ckpt_in_place;
    if (every > 0) printf("  %s: %d checkpoints, training stopped at most %.3f s for one\n", name, st.ckpts, st.ckpt_stall_max_s);
    return rc;
}

/* A NaN put into one tensor's update at step 9 (a checkpoint step: the ahead-running offloaded AdamW is
 * settled by the save): the run stops with "step 9: <tensor>[i] is NaN/Inf after the update", the
 * newest checkpoint is step 6's, all finite, although keep is 1, and a resume from it trains to the end.
 * 1 when all of that holds; else why. */
static int nonfinite_case(const char *name, const char *extra, qt_mutant m, char *why, size_t cap) {
    static const char *tensor = "model.layers.1.mlp.down_proj.weight";
    char err[4096], want[160], p[512];
    qt_test_hooks h = {.nonfinite_tensor = tensor, .nonfinite_step = 9};
    qt_t_hooks(&h, m);
    int rc = gpu_run(name, extra, 3, 1, NULL, NULL, err, sizeof err);
    qt_t_hooks(NULL, QT_MUT_NONE);
    snprintf(want, sizeof want, "step 9: %s[", tensor);
    if (rc != -1 || !strstr(err, want) || !strstr(err, "NaN/Inf after the update"))
        return snprintf(why, cap, "%s: rc %d: %s", name, rc, err), 0;
    if (newest_step(name) != 6) return snprintf(why, cap, "%s: newest checkpoint %ld, expected 6", name, newest_step(name)), 0;
    ckpt_file(p, sizeof p, name, 6);
    qt_ckpt *ck = qt_ckpt_open(p, err, sizeof err);
    if (!ck) return snprintf(why, cap, "%s: %s", name, err), 0;
    static const char *blobs[4] = {"weights", "weights_bf16", "adam_m", "adam_v"};
    size_t bad = 0;
    for (int k = 0; k < 4; k++) {
        size_t nb = 0;
        int dt = 0;
        const unsigned char *b = qt_ckpt_get(ck, blobs[k], &nb, &dt);
        for (size_t i = 0; b && dt == QT_DT_F32 && i < nb / 4; i++) {
            float f;
            memcpy(&f, b + 4 * i, 4);
            bad += !isfinite(f);
        }
        for (size_t i = 0; b && dt == QT_DT_BF16 && i < nb / 2; i++) bad += (b[2 * i + 1] & 0x7f) == 0x7f && (b[2 * i] & 0x80);
    }
    qt_ckpt_close(ck);
    if (bad) return snprintf(why, cap, "%s: %zu NaN/Inf values in the kept checkpoint of step 6", name, bad), 0;
    rc = gpu_run(name, extra, 3, 1, "latest", NULL, err, sizeof err);
    if (rc != 0 || newest_step(name) != 12)
        return snprintf(why, cap, "%s: resume: rc %d, newest %ld: %s", name, rc, newest_step(name), err), 0;
    return 1;
}

/* On one GPU (bf16, fp8), two ranks sharing GPU 0 (sharded optimizer), one GPU with the optimizer
 * offloaded (AdamW ahead of the next forward: the count is taken a step late or at the save) and with the
 * weights and gradients offloaded too (streamed through the optimizer's slots: the count reads the host
 * weights after each group's way down). */
static const char *const NONFINITE_MODES[5][2] = {{"nan_bf16", "parallel: {gpus: 1}"},
                                                  {"nan_fp8", "parallel: {gpus: 1}\nprecision: {matmul_dtype: e4m3}"},
                                                  {"nan_dp2", "parallel: {devices: [0, 0], shard_optimizer: true}"},
                                                  {"nan_offload", "parallel: {gpus: 1}\nmemory: {offload_optimizer: true}"},
                                                  {"nan_offload_wg",
                                                   "parallel: {gpus: 1}\nmemory: {offload: [weights, gradients, master, m, v]}"}};

static void test_nonfinite_update_stops_gpu(void) {
    if (qt_cuda_device_count() == 0) QT_SKIP("no CUDA device");
    char why[4096];
    for (int m = 0; m < 5; m++)
        QT_EXPECT(nonfinite_case(NONFINITE_MODES[m][0], NONFINITE_MODES[m][1], QT_MUT_NONE, why, sizeof why), "%s", why);
}

/* The mutant without the per-step count (one GPU; the optimizer offloaded) must fail those cases (the
 * writer's own check then refuses the step-9 checkpoint later, or the NaN loss of step 10 stops the run,
 * neither naming the update). */
static void test_nonfinite_unchecked_mutant_gpu(void) {
    QT_MUTANT_BUILD_ONLY();
    if (qt_cuda_device_count() == 0) QT_SKIP("no CUDA device");
    const char *const(*modes)[2] = NONFINITE_MODES;
    char why[4096];
    for (int m = 0; m < 4; m += 3) {
        char name[64];
        snprintf(name, sizeof name, "%s_mutant", modes[m][0]);
        int caught = !nonfinite_case(name, modes[m][1], QT_MUT_NONFINITE_UNCHECKED, why, sizeof why);
        printf("  mutant without the per-step count (%s): %s%s\n", modes[m][0], caught ? "caught: " : "NOT caught", caught ? why : "");
        QT_EXPECT(caught, "%s: the test passes without the per-step check", modes[m][0]);
    }
}

/* ---- GPU: an offloaded optimizer state written where it lives ---- */

/* 1 when the checkpoints of steps 3, 6, 9, 12 of runs a and b hold the same bytes (all state blobs). */
static int same_ckpts(const char *a, const char *b, char *why, size_t cap) {
    for (long s = 3; s <= 12; s += 3) {
        if (!same_state(a, b, s, why, cap)) return 0;
        char pa[512], pb[512], err[512];
        ckpt_file(pa, sizeof pa, a, s);
        ckpt_file(pb, sizeof pb, b, s);
        qt_ckpt *ca = qt_ckpt_open(pa, err, sizeof err), *cb = ca ? qt_ckpt_open(pb, err, sizeof err) : NULL;
        size_t na = 0, nb = 0;
        const void *x = cb ? qt_ckpt_get(ca, "weights_bf16", &na, NULL) : NULL, *y = cb ? qt_ckpt_get(cb, "weights_bf16", &nb, NULL) : NULL;
        int same = x && y && na == nb && !memcmp(x, y, na);
        qt_ckpt_close(ca);
        qt_ckpt_close(cb);
        if (!same) return snprintf(why, cap, "step %ld: weights_bf16 differ", s), 0;
    }
    return 1;
}

/* One GPU, optimizer offloaded in chunks of 4096 elements, a checkpoint every 3 steps, in both modes of
 * checkpoint.offloaded: in_place written by a slow writer (20 ms per chunk of state: the next optimizer
 * step must wait for it), and copy. Every checkpoint equals a synchronous save's (test hook ckpt_sync:
 * training waits for each write) byte for byte, and the loss curve equals that of a run that
 * checkpoints only at its end. The mutant whose optimizer does not wait for the in-place writer must
 * fail (the mutant build only). */
static void test_offloaded_state_written_in_place_gpu(void) {
    if (qt_cuda_device_count() == 0) QT_SKIP("no CUDA device");
    const char *extra = "parallel: {gpus: 1}\nmemory: {offload_optimizer: true}";
    static const char *const modes[2] = {"in_place", "copy"};
    char err[4096], why[512], name[64];
    float la[12], lc[12];
    qt_test_hooks h = {.offload_chunk = 4096, .ckpt_write_delay_ms = 20, .ckpt_sync = 1};
    qt_test_hooks_set(&h);
    g_ckpt_offloaded = "in_place";
    int rc = gpu_run("offl_sync", extra, 3, 100, NULL, NULL, err, sizeof err);
    h.ckpt_sync = 0;
    qt_test_hooks_set(&h);
    rc = rc ? rc : gpu_run("offl_none", extra, 0, 1, NULL, lc, err, sizeof err);
    QT_REQUIRE(rc == 0, "%s", err);
    for (int k = 0; k < 2; k++) {
        g_ckpt_offloaded = modes[k];
        snprintf(name, sizeof name, "offl_%s", modes[k]);
        rc = gpu_run(name, extra, 3, 100, NULL, la, err, sizeof err);
        QT_REQUIRE(rc == 0, "%s: %s", modes[k], err);
        QT_EXPECT(g_ckpt_in_place == (k == 0), "checkpoint.offloaded: %s: the state was %s", modes[k],
                  g_ckpt_in_place ? "written in place" : "copied");
        QT_EXPECT(same_ckpts(name, "offl_sync", why, sizeof why), "%s write vs synchronous save: %s", modes[k], why);
        int same_loss = 1;
        for (int i = 0; i < 12; i++) same_loss &= !memcmp(&la[i], &lc[i], 4);
        QT_EXPECT(same_loss, "%s: the loss curve changed with checkpoints", modes[k]);
    }
    if (!QT_T_MUTANTS) {
        qt_test_hooks_set(NULL);
        g_ckpt_offloaded = "auto";
        printf("  mutant whose optimizer does not wait for the writer: " QT_T_MUTANTS_ONLY "\n");
        return;
    }
    g_ckpt_offloaded = "in_place";
    qt_t_hooks(&h, QT_MUT_CKPT_UNGUARDED);
    rc = gpu_run("offl_mutant", extra, 3, 100, NULL, NULL, err, sizeof err);
    qt_t_hooks(NULL, QT_MUT_NONE);
    g_ckpt_offloaded = "auto";
    QT_REQUIRE(rc == 0, "the mutant run failed instead of training: %s", err); /* it must run, and differ */
    int caught = !same_ckpts("offl_mutant", "offl_sync", why, sizeof why);
    printf("  mutant whose optimizer does not wait for the writer: %s%s\n", caught ? "caught: " : "NOT caught",
           caught ? why : "");
    QT_EXPECT(caught, "the test passes when the optimizer does not wait");
}

int main(int argc, char **argv) {
    if (qt_t_run_setup(argc, argv, "qt_rel")) return 1;
    g_seed = argc > 2 ? (unsigned)atol(argv[2]) : (unsigned)time(NULL);
    srand(g_seed);
    printf("  qtrain %s, random seed %u\n", g_qtrain, g_seed);
    QT_RUN(test_fresh_run_refuses_used_dir);
    QT_RUN(test_resume_past_steps_refused);
    QT_RUN(test_resume_changed_keys_refused);
    QT_RUN(test_resume_falls_back_to_valid);
    QT_RUN(test_unwritable_ckpt_dir_found_at_start);
    QT_RUN(test_log_write_failure_is_an_error);
    QT_RUN(test_data_error_mid_run_saves);
    QT_RUN(test_nonfinite_state_never_saved);
    QT_RUN(test_writer_refuses_nonfinite_blob);
    QT_RUN(test_export_needs_no_data);
    QT_RUN(test_signal_checkpoints_and_exits_75);
    QT_RUN(test_log_survives_kill);
    QT_RUN(test_concurrent_run_refused);
    QT_RUN(test_sigint_random_resume_bit_exact);
    QT_RUN(test_sigkill_50_always_resumes);
    QT_RUN(test_sigint_random_resume_bit_exact_gpu);
    QT_RUN(test_sigkill_50_always_resumes_gpu);
    QT_RUN(test_nonfinite_update_stops_gpu);
    QT_RUN(test_nonfinite_unchecked_mutant_gpu);
    QT_RUN(test_offloaded_state_written_in_place_gpu);
    if (!qt_t_nfail) qt_t_rmtree(g_dir);
    else printf("  files kept in %s\n", g_dir);
    return qt_test_end();
}
