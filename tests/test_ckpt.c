/* test_ckpt.c — checkpoint round trip, retention, latest, corruption/truncation detection, write
 * failures, and the blob checksum against published XXH64 values. */
#include "qt_ckpt.h"
#include "qt_dtype.h"
#include "qt_planner.h"
#include "qt_rng.h"
#include "qt_test.h"
#include "qt_test_data.h"
#include "qt_test_hooks.h"
#include "qt_train_ckpt.h"

#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

static char g_root[256];

/* A fresh empty directory under the test's temp root. */
static void fresh_dir(char *out, size_t cap, const char *name) {
    snprintf(out, cap, "%s/%s", g_root, name);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", out);
    if (system(cmd) != 0) fprintf(stderr, "warning: %s failed\n", cmd);
}

static int file_exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0;
}

static void test_hash64_known_values(void) {
    /* XXH64 (seed 0) values: the first three are the published ones; the 40- and 1000-byte ones
     * (four-lane stripe path) come from the reference libxxhash 0.8.1 via ctypes. */
    QT_EXPECT(qt_ckpt_hash64("", 0) == 0xEF46DB3751D8E999ull, "'' -> %016llx", (unsigned long long)qt_ckpt_hash64("", 0));
    QT_EXPECT(qt_ckpt_hash64("a", 1) == 0xD24EC4F1A98C6E5Bull, "'a' -> %016llx", (unsigned long long)qt_ckpt_hash64("a", 1));
    QT_EXPECT(qt_ckpt_hash64("abc", 3) == 0x44BC2CF5AD770999ull, "'abc' -> %016llx",
              (unsigned long long)qt_ckpt_hash64("abc", 3));
    unsigned char buf[1000];
    for (int i = 0; i < 40; i++) buf[i] = (unsigned char)i;
    QT_EXPECT(qt_ckpt_hash64(buf, 40) == 0xF5DA40F1B11741E9ull, "0..39 -> %016llx",
              (unsigned long long)qt_ckpt_hash64(buf, 40));
    for (int i = 0; i < 1000; i++) buf[i] = (unsigned char)(i * 7 + 3);
    uint64_t h = qt_ckpt_hash64(buf, 1000);
    QT_EXPECT(h == 0x5F235FA033F1A3FBull, "1000 bytes -> %016llx", (unsigned long long)h);
    buf[517] ^= 1;
    QT_EXPECT(qt_ckpt_hash64(buf, 1000) != h, "one flipped bit not seen");
}

static void test_roundtrip(void) {
    char dir[512], path[600], err[512];
    fresh_dir(dir, sizeof dir, "rt/nested"); /* nested: save creates both levels */
    size_t nbig = (3u << 20) / 4 + 5;       /* > 1 MiB, not a multiple of 64 bytes */
    float *big = malloc(nbig * 4);
    QT_REQUIRE(big, "oom");
    qt_rng r;
    qt_rng_seed(&r, 3);
    for (size_t i = 0; i < nbig; i++) big[i] = qt_rng_normal(&r);
    uint16_t small[7] = {1, 2, 3, 4, 5, 6, 7};
    long long step_blob = 1234567890123ll;
    const char *cfg = "model:\n  hidden_size: 64\n";
    qt_ckpt_item items[] = {
        {"model.embed_tokens.weight", QT_DT_F32, big, nbig * 4, 0},
        {"empty", -1, NULL, 0, 0},
        {"m.small", QT_DT_BF16, small, sizeof small, 0},
        {"loader.pos", -1, &step_blob, sizeof step_blob, 0},
        {"config", -1, cfg, strlen(cfg) + 1, 0},
    };
    int n = (int)(sizeof items / sizeof items[0]);
    QT_REQUIRE(qt_ckpt_save(dir, 42, 3, items, n, err, sizeof err) == 0, "save: %s", err);
    QT_REQUIRE(qt_ckpt_latest(dir, path, sizeof path) == 0, "no latest");
    QT_EXPECT(strstr(path, "ckpt_00000042.qtc") != NULL, "latest %s", path);
    qt_ckpt *ck = qt_ckpt_open(path, err, sizeof err);
    QT_REQUIRE(ck, "open: %s", err);
    QT_EXPECT(qt_ckpt_step(ck) == 42, "step %ld", qt_ckpt_step(ck));
    for (int i = 0; i < n; i++) {
        size_t bytes = 99;
        int dt = 99;
        const void *p = qt_ckpt_get(ck, items[i].name, &bytes, &dt);
        QT_EXPECT(p != NULL, "%s missing", items[i].name);
        QT_EXPECT(bytes == items[i].bytes && dt == items[i].dtype, "%s: bytes %zu dtype %d", items[i].name, bytes, dt);
        if (p && bytes == items[i].bytes && bytes)
            QT_EXPECT(memcmp(p, items[i].data, bytes) == 0, "%s: data differs", items[i].name);
        if (p) QT_EXPECT(((uintptr_t)p & 63) == 0, "%s: not 64-byte aligned", items[i].name);
    }
    QT_EXPECT(qt_ckpt_get(ck, "nope", NULL, NULL) == NULL, "absent blob found");
    qt_ckpt_close(ck);
    free(big);
}

static void test_retention_and_latest(void) {
    char dir[512], path[600], err[512];
    fresh_dir(dir, sizeof dir, "keep");
    int x = 7;
    qt_ckpt_item it = {"x", -1, &x, sizeof x, 0};
    long steps[4] = {100, 200, 300, 400};
    for (int i = 0; i < 4; i++) {
        x = (int)steps[i];
        QT_REQUIRE(qt_ckpt_save(dir, steps[i], 2, &it, 1, err, sizeof err) == 0, "save %ld: %s", steps[i], err);
    }
    for (int i = 0; i < 4; i++) {
        snprintf(path, sizeof path, "%s/ckpt_%08ld.qtc", dir, steps[i]);
        QT_EXPECT(file_exists(path) == (i >= 2), "step %ld: exists %d", steps[i], file_exists(path));
    }
    /* A leftover temp file with a higher step (a crash mid-save) is not a checkpoint. */
    snprintf(path, sizeof path, "%s/ckpt_00000900.qtc.tmp", dir);
    FILE *f = fopen(path, "wb");
    QT_REQUIRE(f, "cannot create %s", path);
    fputs("partial", f);
    fclose(f);
    snprintf(path, sizeof path, "%s/ckpt_abc.qtc", dir);
    f = fopen(path, "wb");
    QT_REQUIRE(f, "cannot create %s", path);
    fclose(f);
    QT_REQUIRE(qt_ckpt_latest(dir, path, sizeof path) == 0, "no latest");
    QT_EXPECT(strstr(path, "ckpt_00000400.qtc") && !strstr(path, ".tmp"), "latest %s", path);
    qt_ckpt *ck = qt_ckpt_open(path, err, sizeof err);
    QT_REQUIRE(ck, "open: %s", err);
    const int *px = qt_ckpt_get(ck, "x", NULL, NULL);
    QT_EXPECT(px && *px == 400 && qt_ckpt_step(ck) == 400, "content of latest");
    qt_ckpt_close(ck);
    /* Saving an older step after newer ones (a resume from an older file) never deletes it. */
    QT_REQUIRE(qt_ckpt_save(dir, 50, 2, &it, 1, err, sizeof err) == 0, "save 50: %s", err);
    snprintf(path, sizeof path, "%s/ckpt_00000050.qtc", dir);
    QT_EXPECT(file_exists(path), "the just-written older checkpoint was deleted");
    /* An empty directory and a missing one have no latest. */
    fresh_dir(dir, sizeof dir, "empty");
    QT_EXPECT(qt_ckpt_latest(dir, path, sizeof path) == -1, "latest in a missing dir");
}

/* Saves one checkpoint with two blobs and returns its path in out. */
static int save_two(const char *name, char *out, size_t cap, char *err, size_t errlen) {
    char dir[512];
    fresh_dir(dir, sizeof dir, name);
    static float a[1000], b[300];
    for (int i = 0; i < 1000; i++) a[i] = (float)i;
    for (int i = 0; i < 300; i++) b[i] = -(float)i;
    qt_ckpt_item items[] = {{"adam.m", QT_DT_F32, a, sizeof a, 0}, {"adam.v", QT_DT_F32, b, sizeof b, 0}};
    if (qt_ckpt_save(dir, 7, 0, items, 2, err, errlen)) return -1;
    return qt_ckpt_latest(dir, out, cap);
}

static void test_corruption_detected(void) {
    char path[600], err[512] = "";
    QT_REQUIRE(save_two("corrupt", path, sizeof path, err, sizeof err) == 0, "save: %s", err);
    qt_ckpt *ck = qt_ckpt_open(path, err, sizeof err);
    QT_REQUIRE(ck, "clean file rejected: %s", err);
    const unsigned char *v = qt_ckpt_get(ck, "adam.v", NULL, NULL);
    const unsigned char *base = qt_ckpt_get(ck, "adam.m", NULL, NULL);
    QT_REQUIRE(v && base, "blobs missing");
    /* adam.m starts at a fixed offset in the file; find adam.v's offset relative to it. */
    long off_v = (long)(v - base);
    qt_ckpt_close(ck);
    FILE *f = fopen(path, "r+b");
    QT_REQUIRE(f, "reopen");
    /* header + 2 table entries = 320 bytes: adam.m begins at 320, adam.v at 320 + off_v. */
    long pos = 320 + off_v + 100;
    fseek(f, pos, SEEK_SET);
    int c = fgetc(f);
    fseek(f, pos, SEEK_SET);
    fputc(c ^ 0x10, f);
    fclose(f);
    err[0] = 0;
    ck = qt_ckpt_open(path, err, sizeof err);
    QT_EXPECT(ck == NULL, "corrupted file accepted");
    QT_EXPECT(strstr(err, "adam.v") && strstr(err, "checksum") && strstr(err, path), "message: %s", err);
    qt_ckpt_close(ck);
    /* A flipped byte in the table (a blob's size) is caught by the table checksum. */
    QT_REQUIRE(save_two("corrupt2", path, sizeof path, err, sizeof err) == 0, "save: %s", err);
    f = fopen(path, "r+b");
    QT_REQUIRE(f, "reopen");
    fseek(f, 64 + 104, SEEK_SET);
    fputc(0x11, f);
    fclose(f);
    ck = qt_ckpt_open(path, err, sizeof err);
    QT_EXPECT(ck == NULL && strstr(err, path) && strstr(err, "checksum"), "table corruption: %s", err);
    qt_ckpt_close(ck);
}

static void test_truncation_detected(void) {
    char path[600], err[512] = "";
    QT_REQUIRE(save_two("trunc", path, sizeof path, err, sizeof err) == 0, "save: %s", err);
    struct stat st;
    QT_REQUIRE(stat(path, &st) == 0, "stat");
    long sizes[] = {(long)st.st_size - 1, (long)st.st_size / 2, 100, 10, 0};
    for (int i = 0; i < 5; i++) {
        QT_REQUIRE(truncate(path, sizes[i]) == 0, "truncate");
        err[0] = 0;
        qt_ckpt *ck = qt_ckpt_open(path, err, sizeof err);
        QT_EXPECT(ck == NULL, "file truncated to %ld accepted", sizes[i]);
        QT_EXPECT(strstr(err, path) != NULL, "size %ld: message lacks the file: %s", sizes[i], err);
        qt_ckpt_close(ck);
    }
    QT_EXPECT(strstr(err, "not a qtrain checkpoint") != NULL, "empty file message: %s", err);
}

static void test_write_failures(void) {
    char dir[512], file[600], sub[700], path[800], err[512];
    fresh_dir(dir, sizeof dir, "fail");
    int x = 1;
    qt_ckpt_item it = {"x", -1, &x, sizeof x, 0};
    char e2[512];
    QT_REQUIRE(qt_ckpt_mkdirs(dir, e2, sizeof e2) == 0, "mkdirs: %s", e2);
    snprintf(file, sizeof file, "%s/a_file", dir);
    FILE *f = fopen(file, "wb");
    QT_REQUIRE(f, "create");
    fclose(f);
    err[0] = 0;
    QT_EXPECT(qt_ckpt_save(file, 1, 2, &it, 1, err, sizeof err) == -1, "saved into a regular file");
    QT_EXPECT(strstr(err, file) != NULL, "message: %s", err);
    snprintf(sub, sizeof sub, "%s/below", file);
    err[0] = 0;
    QT_EXPECT(qt_ckpt_save(sub, 1, 2, &it, 1, err, sizeof err) == -1, "saved below a regular file");
    QT_EXPECT(err[0] != 0, "no message");
    /* Bad item names are refused before anything is written. */
    qt_ckpt_item dup[2] = {{"x", -1, &x, 4, 0}, {"x", -1, &x, 4, 0}};
    err[0] = 0;
    QT_EXPECT(qt_ckpt_save(dir, 1, 2, dup, 2, err, sizeof err) == -1 && strstr(err, "duplicate"), "dup: %s", err);
    QT_EXPECT(qt_ckpt_latest(dir, path, sizeof path) == -1, "a failed save left a checkpoint: %s", path);
    /* A read-only directory (meaningless as root, who may write anyway). */
    if (geteuid() != 0) {
        char ro[600];
        snprintf(ro, sizeof ro, "%s/ro", dir);
        QT_REQUIRE(qt_ckpt_mkdirs(ro, e2, sizeof e2) == 0, "mkdirs: %s", e2);
        chmod(ro, 0500);
        err[0] = 0;
        QT_EXPECT(qt_ckpt_save(ro, 1, 2, &it, 1, err, sizeof err) == -1, "saved into a read-only dir");
        QT_EXPECT(strstr(err, ro) != NULL, "message: %s", err);
        chmod(ro, 0700);
    }
}

/* The background writer: a write in flight refuses a second one, its outcome (file, step, failure)
 * comes back from wait, and qt_ckpt_list sees the result newest first. */
static void test_background_writer(void) {
    char dir[512], bad[600], err[512], path[600];
    fresh_dir(dir, sizeof dir, "bg");
    size_t n = (8u << 20) / 4;
    float *big = malloc(n * 4);
    QT_REQUIRE(big, "oom");
    for (size_t i = 0; i < n; i++) big[i] = (float)i;
    qt_ckpt_item it = {"weights", QT_DT_F32, big, n * 4, 0};
    qt_ckpt_writer *w = qt_ckpt_writer_create(NULL, NULL);
    QT_REQUIRE(w, "create");
    QT_EXPECT(qt_ckpt_writer_wait(w, NULL, NULL, err, sizeof err) == 1, "wait with nothing in flight");
    for (long step = 10; step <= 30; step += 10) {
        QT_REQUIRE(qt_ckpt_writer_start(w, dir, step, 2, &it, 1, err, sizeof err) == 0, "start: %s", err);
        err[0] = 0;
        QT_EXPECT(qt_ckpt_writer_start(w, dir, step + 1, 2, &it, 1, err, sizeof err) == -1 && strstr(err, "in flight"),
                  "a second write while one is in flight: %s", err);
        long got = -1;
        double sec = -1;
        QT_EXPECT(qt_ckpt_writer_wait(w, &got, &sec, err, sizeof err) == 0 && got == step && sec >= 0, "wait: %s", err);
        QT_EXPECT(!qt_ckpt_writer_running(w), "still running after wait");
    }
    long *steps = NULL;
    int k = qt_ckpt_list(dir, &steps);
    QT_EXPECT(k == 2 && steps[0] == 30 && steps[1] == 20, "list: %d checkpoints, newest %ld", k, k ? steps[0] : -1);
    free(steps);
    snprintf(path, sizeof path, "%s/ckpt_00000030.qtc", dir);
    qt_ckpt *ck = qt_ckpt_open(path, err, sizeof err);
    size_t nb = 0;
    const void *p = ck ? qt_ckpt_get(ck, "weights", &nb, NULL) : NULL;
    QT_EXPECT(p && nb == n * 4 && memcmp(p, big, nb) == 0, "content of the background write: %s", ck ? "differs" : err);
    qt_ckpt_close(ck);
    /* a failing write comes back from wait with its message */
    snprintf(bad, sizeof bad, "%s/ckpt_00000030.qtc/below", dir);
    QT_REQUIRE(qt_ckpt_writer_start(w, bad, 40, 2, &it, 1, err, sizeof err) == 0, "start: %s", err);
    err[0] = 0;
    QT_EXPECT(qt_ckpt_writer_wait(w, NULL, NULL, err, sizeof err) == -1 && strstr(err, bad), "failed write: %s", err);
    QT_EXPECT(qt_ckpt_list("/nonexistent/qt", &steps) == 0 && steps == NULL, "list of a missing dir");
    qt_ckpt_writer_free(w);
    free(big);
}

/* ---- live items: written in place while a modifier thread changes them behind the writer's mark ---- */

#define LIVE_E 100003 /* elements of each live array (odd) */
#define LIVE_W (LIVE_E - 11) /* the bf16 weights: fewer (the one-GPU shard pads the others) */
typedef struct {
    qt_ckpt_writer *w;
    float *master, *v;
    uint16_t *m, *w16;
    int guarded; /* 0: no wait for the mark (copy mode, and the in-place mutant) */
} modifier;

/* Three "optimizer steps" over the live arrays in chunks of 7919 elements (not the writer's ranges),
 * each chunk changed only once the writer's mark has passed it. */
static void *modify(void *arg) {
    modifier *md = arg;
    for (int pass = 0; pass < 3; pass++)
        for (size_t lo = 0; lo < LIVE_E; lo += 7919) {
            size_t hi = lo + 7919 < LIVE_E ? lo + 7919 : LIVE_E;
            if (md->guarded) qt_ckpt_writer_wait_mark(md->w, hi);
            for (size_t i = lo; i < hi; i++) {
                md->master[i] += 1.0f;
                md->m[i] ^= 0x5a5a;
                md->v[i] = md->v[i] * 0.5f + 1.0f;
                if (i < LIVE_W) md->w16[i] ^= 0x0101; /* stays finite: the exponent's low bit and a mantissa bit */
            }
        }
    return NULL;
}

/* The writer's check of each piece in copy mode: a slow disk (2 ms a piece) the modifier runs ahead of. */
static int slow_disk(const qt_ckpt_item *item, size_t lo, size_t hi, void *ctx, char *err, size_t errlen) {
    (void)item, (void)lo, (void)hi, (void)ctx, (void)err, (void)errlen;
    usleep(2000);
    return 0;
}

/* How the test writes the offloaded arrays: the two checkpoint.offloaded modes and a mutant of each. */
enum { IN_PLACE, IN_PLACE_UNGUARDED, COPY, COPY_MISSING };
static const char *const mode_names[] = {"in_place", "in_place_unguarded", "copy", "copy_missing"};

/* One write of 4 offloaded arrays (fp32, bf16 weights of fewer elements, bf16 bits, fp32) and a snapshot item
 * while a modifier thread changes the arrays; the writer sleeps 2 ms after each range or piece (a slow disk).
 * IN_PLACE: the arrays are live items (ranges of 4099 elements: pieces that are not a multiple of the
 * hash's 32-byte stripes) and the modifier waits for the writer's mark; COPY: they are copied into
 * snapshot buffers first and the modifier does not wait. Mutants: no wait; no copy. widen: "weights" is
 * the bf16 weights widened as written (a bf16 master), live too. Returns 1 when the file is byte for byte
 * the one a synchronous qt_ckpt_save of the state at the start writes. */
static int live_write_matches(int mode, int widen, char *why, size_t cap) {
    char dir[512], ref[512], pa[600], pb[600], err[512];
    snprintf(pa, sizeof pa, "live_%s", mode_names[mode]);
    fresh_dir(dir, sizeof dir, pa);
    snprintf(pa, sizeof pa, "live_%s_ref", mode_names[mode]);
    fresh_dir(ref, sizeof ref, pa);
    int guarded = mode == IN_PLACE;
    qt_rng r;
    qt_rng_seed(&r, 7);
    modifier md = {qt_ckpt_writer_create(mode >= COPY ? slow_disk : NULL, NULL), malloc(LIVE_E * 4), malloc(LIVE_E * 4),
                   malloc(LIVE_E * 2), malloc(LIVE_W * 2), guarded};
    uint16_t *w16 = md.w16;
    if (!md.w || !md.master || !md.v || !md.m || !w16) return snprintf(why, cap, "out of memory"), 0;
    for (size_t i = 0; i < LIVE_E; i++) {
        md.master[i] = (float)qt_rng_normal(&r);
        md.v[i] = (float)qt_rng_uniform(&r);
        md.m[i] = (uint16_t)qt_rng_u64(&r);
    }
    for (int i = 0; i < LIVE_W; i++) w16[i] = 0x3f80 ^ ((uint16_t)qt_rng_u64(&r) & 0x00ff); /* finite bf16 near 1 */
    int64_t step = 12;
    qt_ckpt_item items[5] = {{"weights", QT_DT_F32, md.master, LIVE_E * 4, 0}, {"weights_bf16", QT_DT_BF16, w16, LIVE_W * 2, 0},
                             {"adam_m", QT_DT_BF16, md.m, LIVE_E * 2, 0}, {"adam_v", QT_DT_F32, md.v, LIVE_E * 4, 0},
                             {"step", -1, &step, 8, 0}};
    if (widen) items[0] = (qt_ckpt_item){"weights", QT_DT_F32, w16, LIVE_W * 4, QT_CKPT_WIDEN_BF16};
    int ok = qt_ckpt_save(ref, 12, 0, items, 5, err, sizeof err) == 0;
    qt_ckpt_live live = {4, {0, 1, 2, 3}, LIVE_E, 4099}, none = {0};
    char *copies = mode == COPY ? malloc(LIVE_E * 12) : NULL; /* master, w16, m, v: the snapshot buffers */
    if (mode == COPY && !copies) return snprintf(why, cap, "out of memory"), 0;
    for (int j = widen, off = 0; copies && j < 4; off += (int)qt_ckpt_item_data_bytes(&items[live.idx[j]]), j++) {
        memcpy(copies + off, items[live.idx[j]].data, qt_ckpt_item_data_bytes(&items[live.idx[j]]));
        items[live.idx[j]].data = copies + off;
    }
    if (copies && widen) items[0].data = items[1].data; /* the widened view of the copied weights */
    qt_test_hooks h = {.ckpt_write_delay_ms = 2};
    qt_test_hooks_set(&h);
    pthread_t th;
    ok = ok && qt_ckpt_writer_start_live(md.w, dir, 12, 0, items, 5, mode <= IN_PLACE_UNGUARDED ? &live : &none, err,
                                         sizeof err) == 0;
    if (ok) {
        pthread_create(&th, NULL, modify, &md);
        pthread_join(th, NULL);
        ok = qt_ckpt_writer_wait(md.w, NULL, NULL, err, sizeof err) == 0;
    }
    qt_test_hooks_set(NULL);
    if (!ok) snprintf(why, cap, "%s", err);
    snprintf(pa, sizeof pa, "%s/ckpt_00000012.qtc", dir);
    snprintf(pb, sizeof pb, "%s/ckpt_00000012.qtc", ref);
    size_t na = 0, nb = 0;
    char *a = ok ? qt_t_read_file(pa, &na) : NULL, *b = ok ? qt_t_read_file(pb, &nb) : NULL;
    if (ok && (!a || !b || na != nb || memcmp(a, b, na))) {
        size_t at = 0;
        while (a && b && at < na && at < nb && a[at] == b[at]) at++;
        snprintf(why, cap, "the %s write differs from the synchronous save (%zu vs %zu bytes, first at byte %zu)",
                 mode_names[mode], na, nb, at);
        ok = 0;
    }
    qt_ckpt *ck = ok ? qt_ckpt_open(pa, err, sizeof err) : NULL;
    if (ok && !ck) snprintf(why, cap, "%s", err), ok = 0;
    qt_ckpt_close(ck);
    free(a), free(b), free(md.master), free(md.v), free(md.m), free(md.w16), free(copies);
    qt_ckpt_writer_free(md.w);
    return ok;
}

/* The mode writes the file a synchronous save writes, and its mutant (what: the mutant's fault) does not. */
static void mode_and_mutant(int mode, int mutant, const char *what) {
    char why[512];
    for (int widen = 0; widen < 2; widen++) {
        QT_EXPECT(live_write_matches(mode, widen, why, sizeof why), "%s%s", widen ? "widened: " : "", why);
        int caught = !live_write_matches(mutant, widen, why, sizeof why);
        printf("  %smutant that %s: %s%s\n", widen ? "widened weights, " : "", what, caught ? "caught: " : "NOT caught",
               caught ? why : "");
        QT_EXPECT(caught, "the test passes with the mutant that %s", what);
    }
}

static void test_live_items_written_in_place(void) {
    mode_and_mutant(IN_PLACE, IN_PLACE_UNGUARDED, "changes the state without waiting for the mark");
}

/* checkpoint.offloaded: copy — the same file as in place and as a synchronous save, the state changing
 * at once behind the copy; the mutant that skips the copy must fail. */
static void test_live_items_copied(void) {
    mode_and_mutant(COPY, COPY_MISSING, "writes the state without copying it");
}

/* checkpoint.offloaded resolved from the available host bytes: auto copies exactly when the copy plus
 * an eighth plus 1 GiB fits; copy and in_place are kept whatever the host has. */
static void test_offload_mode_choice(void) {
    const size_t G = (size_t)1 << 30, b = 6 * G; /* ~0.5B parameters' master, m, v */
    struct { qt_ckpt_offload want; size_t bytes, avail; qt_ckpt_offload got; } c[] = {
        {QT_CKPT_OFFLOAD_AUTO, b, 128 * G, QT_CKPT_OFFLOAD_COPY},
        {QT_CKPT_OFFLOAD_AUTO, b, b + b / 8 + G, QT_CKPT_OFFLOAD_COPY},
        {QT_CKPT_OFFLOAD_AUTO, b, b + b / 8 + G - 1, QT_CKPT_OFFLOAD_IN_PLACE},
        {QT_CKPT_OFFLOAD_AUTO, 91 * G, 30 * G, QT_CKPT_OFFLOAD_IN_PLACE}, /* 7B on a 128 GiB host */
        {QT_CKPT_OFFLOAD_AUTO, b, 0, QT_CKPT_OFFLOAD_IN_PLACE},          /* MemAvailable unreadable */
        {QT_CKPT_OFFLOAD_AUTO, 0, G, QT_CKPT_OFFLOAD_COPY},
        {QT_CKPT_OFFLOAD_COPY, b, 0, QT_CKPT_OFFLOAD_COPY},
        {QT_CKPT_OFFLOAD_IN_PLACE, b, 1024 * G, QT_CKPT_OFFLOAD_IN_PLACE},
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        qt_ckpt_offload got = qt_trainer_offload_mode(c[i].want, c[i].bytes, c[i].avail);
        QT_EXPECT(got == c[i].got, "case %zu: want %d, %zu bytes, %zu available: got %d, expected %d", i, c[i].want,
                  c[i].bytes, c[i].avail, got, c[i].got);
    }
    size_t avail = qt_host_mem_available();
    QT_EXPECT(avail > ((size_t)64 << 20) && avail < ((size_t)1 << 50), "MemAvailable read as %zu bytes", avail);
}

/* Saves ref_items[0..n) as step 3 into <tag>_ref, then items[0..n) (the same blobs held another way) three
 * ways, into fresh directories <tag>_whole, <tag>_pieces, <tag>_writer: whole (qt_ckpt_save), in the pieces
 * pc[0..np), and through the background writer behind the live items with the checker check(ctx); each
 * file must equal the reference byte for byte. */
static void save_three_ways(const char *tag, const qt_ckpt_item *ref_items, const qt_ckpt_item *items, int n,
                            const qt_ckpt_piece *pc, int np, const qt_ckpt_live *live, qt_ckpt_check_fn check, void *ctx) {
    static const char *const how_names[] = {"whole", "pieces", "writer"};
    char name[128], dir[512], path[600], err[512];
    snprintf(name, sizeof name, "%s_ref", tag);
    fresh_dir(dir, sizeof dir, name);
    QT_REQUIRE(qt_ckpt_save(dir, 3, 0, ref_items, n, err, sizeof err) == 0, "reference save: %s", err);
    snprintf(path, sizeof path, "%s/ckpt_00000003.qtc", dir);
    size_t nref = 0, blobs = 0;
    char *ref = qt_t_read_file(path, &nref);
    for (int i = 0; i < n; i++) blobs += ref_items[i].bytes;
    QT_REQUIRE(ref && nref > blobs, "reference file %s: %zu bytes for %zu of blobs", path, nref, blobs);
    for (int how = 0; how < 3; how++) {
        snprintf(name, sizeof name, "%s_%s", tag, how_names[how]);
        fresh_dir(dir, sizeof dir, name);
        int rc;
        if (how == 0) {
            rc = qt_ckpt_save(dir, 3, 0, items, n, err, sizeof err);
        } else if (how == 1) {
            rc = qt_ckpt_save_pieces(dir, 3, 0, items, n, pc, np, NULL, err, sizeof err);
        } else {
            qt_ckpt_writer *w = qt_ckpt_writer_create(check, ctx);
            rc = w && qt_ckpt_writer_start_live(w, dir, 3, 0, items, n, live, err, sizeof err) == 0 ? 0 : -1;
            if (rc == 0) rc = qt_ckpt_writer_wait(w, NULL, NULL, err, sizeof err);
            qt_ckpt_writer_free(w);
        }
        QT_REQUIRE(rc == 0, "%s: %s", name, err);
        snprintf(path, sizeof path, "%s/ckpt_00000003.qtc", dir);
        size_t na = 0, at = 0;
        char *f = qt_t_read_file(path, &na);
        while (f && at < na && at < nref && f[at] == ref[at]) at++;
        QT_EXPECT(f && na == nref && at == na, "%s: the file differs from the reference (%zu vs %zu bytes, first at byte %zu)",
                  name, na, nref, at);
        free(f);
    }
    free(ref);
}

/* A checker that adds up the bytes it is shown of widened items (ctx: a size_t). */
static int count_widened(const qt_ckpt_item *item, size_t lo, size_t hi, void *ctx, char *err, size_t errlen) {
    (void)err, (void)errlen;
    if (ctx && (item->flags & QT_CKPT_WIDEN_BF16)) *(size_t *)ctx += hi - lo;
    return 0;
}
/* QT_CKPT_WIDEN_BF16: a bf16 array written as the fp32 "weights" blob (as a bf16-master run's checkpoint)
 * is byte for byte the file written from the fp32 array of the same values (bits << 16), saved whole,
 * cut into pieces (odd multiples of 4 bytes, crossing the writer's 1 MiB chunks and the hash's 32-byte
 * stripes) and through the background writer behind live items; the checksum is verified on load, the
 * checker sees the widened item's ranges; misuse (another dtype, a size or piece not a multiple of 4
 * bytes, an unknown flag) is refused. Values: random bits plus NaN, +-Inf, -0, denormals. */
static void test_widen_bf16(void) {
    char dir[512], pa[600], err[512];
    const size_t n = 600011; /* odd; > 2 chunks of the writer's widening buffer */
    uint16_t *w16 = malloc(n * 2);
    uint32_t *w32 = malloc(n * 4);
    float m[1000];
    QT_REQUIRE(w16 && w32, "oom");
    qt_rng r;
    qt_rng_seed(&r, 11);
    for (size_t i = 0; i < n; i++) w16[i] = (uint16_t)qt_rng_u64(&r);
    const uint16_t special[] = {0x7fc0, 0xffc1, 0x7f80, 0xff80, 0x8000, 0x0001, 0x807f, 0x3f80};
    for (size_t k = 0; k < sizeof special / sizeof special[0]; k++) w16[k * 77777] = special[k];
    for (size_t i = 0; i < n; i++) {
        float f = qt_bf16_to_f32(w16[i]);
        memcpy(&w32[i], &f, 4);
    }
    for (int i = 0; i < 1000; i++) m[i] = (float)i;
    int64_t step = 3;
    qt_ckpt_item plain[4] = {{"weights", QT_DT_F32, w32, n * 4, 0}, {"weights_bf16", QT_DT_BF16, w16, n * 2, 0},
                             {"adam_m", QT_DT_F32, m, sizeof m, 0}, {"step", -1, &step, 8, 0}};
    qt_ckpt_item wide[4];
    memcpy(wide, plain, sizeof wide);
    wide[0] = (qt_ckpt_item){"weights", QT_DT_F32, w16, n * 4, QT_CKPT_WIDEN_BF16};
    QT_EXPECT(qt_ckpt_item_data_bytes(&wide[0]) == n * 2 && qt_ckpt_item_data_bytes(&plain[0]) == n * 4, "data bytes");
    qt_ckpt_piece pc[64];
    int np = 0;
    size_t cut = 4 * 77773; /* 311092 bytes: odd fp32 counts */
    for (size_t lo = 0; lo < n * 4; lo += cut) /* interleaved with weights_bf16's pieces */
        pc[np++] = (qt_ckpt_piece){0, lo, lo + cut < n * 4 ? lo + cut : n * 4};
    pc[np++] = (qt_ckpt_piece){1, 0, n * 2};
    pc[np++] = (qt_ckpt_piece){2, 0, sizeof m};
    pc[np++] = (qt_ckpt_piece){3, 0, 8};
    qt_ckpt_live live = {1, {2}, 1000, 97};
    save_three_ways("widen", plain, wide, 4, pc, np, &live, NULL, NULL);
    for (int how = 0; how < 3; how++) {
        static const char *const names[] = {"widen_whole", "widen_pieces", "widen_writer"};
        snprintf(pa, sizeof pa, "%s/%s/ckpt_00000003.qtc", g_root, names[how]);
        qt_ckpt *ck = qt_ckpt_open(pa, err, sizeof err); /* every checksum verified */
        QT_REQUIRE(ck, "%s: open: %s", names[how], err);
        size_t bytes = 0;
        int dt = -2;
        const void *p = qt_ckpt_get(ck, "weights", &bytes, &dt);
        QT_EXPECT(p && bytes == n * 4 && dt == QT_DT_F32 && !memcmp(p, w32, n * 4), "%s: weights blob", names[how]);
        qt_ckpt_close(ck);
    }
    /* a checker sees the widened item's file ranges */
    fresh_dir(dir, sizeof dir, "widen_check");
    size_t seen = 0;
    qt_ckpt_writer *w = qt_ckpt_writer_create(count_widened, &seen);
    QT_REQUIRE(w && qt_ckpt_writer_start(w, dir, 4, 0, wide, 4, err, sizeof err) == 0, "start: %s", err);
    QT_EXPECT(qt_ckpt_writer_wait(w, NULL, NULL, err, sizeof err) == 0 && seen == n * 4, "checked %zu of %zu bytes: %s",
              seen, n * 4, err);
    qt_ckpt_writer_free(w);
    /* misuse */
    fresh_dir(dir, sizeof dir, "widen_bad");
    qt_ckpt_item bad[3] = {{"w", QT_DT_BF16, w16, 40, QT_CKPT_WIDEN_BF16}, {"w", QT_DT_F32, w16, 42, QT_CKPT_WIDEN_BF16},
                           {"w", QT_DT_F32, w16, 40, 4}};
    for (int k = 0; k < 3; k++) {
        err[0] = 0;
        QT_EXPECT(qt_ckpt_save(dir, 1, 0, &bad[k], 1, err, sizeof err) == -1 && strstr(err, "checkpoint item w"),
                  "bad widened item %d: %s", k, err);
    }
    qt_ckpt_piece half[2] = {{0, 0, 18}, {0, 18, 40}};
    err[0] = 0;
    QT_EXPECT(qt_ckpt_save_pieces(dir, 1, 0, wide, 1, half, 2, NULL, err, sizeof err) == -1 && strstr(err, "whole fp32"),
              "a widened piece inside a value: %s", err);
    snprintf(pa, sizeof pa, "%s/ckpt_00000001.qtc", dir);
    QT_EXPECT(!file_exists(pa), "a refused save wrote %s", pa);
    free(w16);
    free(w32);
}

/* Gathered items (QT_CKPT_GATHERED: the bytes in runs at other addresses, as a sharded state's pieces on
 * several ranks): written whole, in pieces and by the background writer with live items, each the same
 * file as the arrays put together first, fp32 and a bf16 array widened; the checker sees every range;
 * runs out of order, past the end, or not from 0 are refused. */
static void test_gathered(void) {
    char dir[512], err[512];
    const size_t n = 300007; /* odd */
    float *a = malloc(n * 4), *a2 = malloc(n * 4);
    uint16_t *h = malloc(n * 2), *h2 = malloc(n * 2);
    QT_REQUIRE(a && a2 && h && h2, "oom");
    qt_rng r;
    qt_rng_seed(&r, 5);
    for (size_t i = 0; i < n; i++) a[i] = (float)qt_rng_uniform(&r) - 0.5f, h[i] = (uint16_t)(qt_rng_u64(&r) & 0x7f7f);
    /* the runs: random lengths (1 .. 40000 values), each copied to a shuffled place of a2 / h2 */
    enum { MAXR = 64 };
    qt_ckpt_seg sa[MAXR], sh[MAXR];
    size_t start[MAXR + 1], len[MAXR];
    int nr = 0;
    for (size_t at = 0; at < n && nr < MAXR - 1; nr++) {
        start[nr] = at;
        len[nr] = 1 + qt_rng_u64(&r) % 40000;
        if (len[nr] > n - at) len[nr] = n - at;
        at += len[nr];
    }
    if (start[nr - 1] + len[nr - 1] < n) start[nr] = start[nr - 1] + len[nr - 1], len[nr] = n - start[nr], nr++;
    size_t place = 0;
    for (int k = nr - 1; k >= 0; k--) { /* reversed in memory */
        memcpy(a2 + place, a + start[k], len[k] * 4);
        memcpy(h2 + place, h + start[k], len[k] * 2);
        sa[k] = (qt_ckpt_seg){start[k] * 4, a2 + place};
        sh[k] = (qt_ckpt_seg){start[k] * 2, h2 + place};
        place += len[k];
    }
    QT_REQUIRE(place == n, "runs cover %zu of %zu", place, n);
    qt_ckpt_gather ga = {sa, nr}, gh = {sh, nr};
    int64_t step = 3;
    qt_ckpt_item plain[4] = {{"adam_m", QT_DT_F32, a, n * 4, 0}, {"weights_bf16", QT_DT_BF16, h, n * 2, 0},
                             {"weights", QT_DT_F32, h, n * 4, QT_CKPT_WIDEN_BF16}, {"step", -1, &step, 8, 0}};
    qt_ckpt_item gath[4] = {{"adam_m", QT_DT_F32, &ga, n * 4, QT_CKPT_GATHERED},
                            {"weights_bf16", QT_DT_BF16, &gh, n * 2, QT_CKPT_GATHERED},
                            {"weights", QT_DT_F32, &gh, n * 4, QT_CKPT_WIDEN_BF16 | QT_CKPT_GATHERED}, {"step", -1, &step, 8, 0}};
    size_t run = 0;
    QT_EXPECT(qt_ckpt_item_at(&gath[0], start[nr - 1] * 4 + 4, &run) == (const void *)(a2 + 1) && run == len[nr - 1] * 4 - 4,
              "the last run's second value: at %p (want %p), run %zu", qt_ckpt_item_at(&gath[0], start[nr - 1] * 4 + 4, &run),
              (void *)(a2 + 1), run);
    qt_ckpt_piece pc[64];
    int np = 0;
    for (size_t lo = 0; lo < n * 4; lo += 4 * 77773) { /* interleaved, cuts inside runs and across them */
        size_t hi = lo + 4 * 77773 < n * 4 ? lo + 4 * 77773 : n * 4;
        pc[np++] = (qt_ckpt_piece){0, lo, hi};
        pc[np++] = (qt_ckpt_piece){2, lo, hi};
    }
    pc[np++] = (qt_ckpt_piece){1, 0, n * 2};
    pc[np++] = (qt_ckpt_piece){3, 0, 8};
    size_t seen = 0;
    qt_ckpt_live live = {2, {0, 1}, n, 9973};
    save_three_ways("gather", plain, gath, 4, pc, np, &live, count_widened, &seen);
    QT_EXPECT(seen == n * 4, "the writer's checker saw %zu of the widened item's %zu bytes", seen, n * 4);
    /* misuse: a first run not at 0, runs out of order, a run past the end */
    fresh_dir(dir, sizeof dir, "gather_bad");
    qt_ckpt_seg bad[3][2] = {{{4, a}, {8, a}}, {{0, a}, {0, a}}, {{0, a}, {n * 4, a}}};
    for (int k = 0; k < 3; k++) {
        qt_ckpt_gather g = {bad[k], 2};
        qt_ckpt_item it = {"runs", QT_DT_F32, &g, n * 4, QT_CKPT_GATHERED};
        err[0] = 0;
        QT_EXPECT(qt_ckpt_save(dir, 1, 0, &it, 1, err, sizeof err) == -1 && strstr(err, "checkpoint item runs: run"),
                  "bad runs %d: %s", k, err);
    }
    free(a), free(a2), free(h), free(h2);
}

/* Live items that are not whole arrays of `elems` elements, or repeats, are refused at start. */
static void test_live_items_refused(void) {
    char dir[512], err[512];
    fresh_dir(dir, sizeof dir, "live_bad");
    float x[10] = {0};
    float y[11] = {0};
    qt_ckpt_item items[2] = {{"a", QT_DT_F32, x, 40, 0}, {"b", QT_DT_F32, y, 44, 0}}; /* b: more than 10 elements */
    qt_ckpt_writer *w = qt_ckpt_writer_create(NULL, NULL);
    qt_ckpt_live bad[3] = {{2, {0, 1}, 10, 4}, {2, {0, 0}, 10, 4}, {1, {5}, 10, 4}};
    for (int k = 0; k < 3; k++) {
        err[0] = 0;
        QT_EXPECT(qt_ckpt_writer_start_live(w, dir, 1, 0, items, 2, &bad[k], err, sizeof err) == -1 && strstr(err, "live"),
                  "case %d accepted: %s", k, err);
    }
    QT_EXPECT(qt_ckpt_writer_wait_mark(w, 5) == 0, "a wait with no write in flight blocked");
    qt_ckpt_writer_free(w);
}

int main(void) {
    snprintf(g_root, sizeof g_root, "/tmp/qt_test_ckpt_%d", (int)getpid());
    QT_RUN(test_hash64_known_values);
    QT_RUN(test_roundtrip);
    QT_RUN(test_retention_and_latest);
    QT_RUN(test_corruption_detected);
    QT_RUN(test_truncation_detected);
    QT_RUN(test_write_failures);
    QT_RUN(test_background_writer);
    QT_RUN(test_live_items_written_in_place);
    QT_RUN(test_live_items_copied);
    QT_RUN(test_offload_mode_choice);
    QT_RUN(test_live_items_refused);
    QT_RUN(test_widen_bf16);
    QT_RUN(test_gathered);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_root);
    if (system(cmd) != 0) fprintf(stderr, "warning: cleanup of %s failed\n", g_root);
    return qt_test_end();
}
