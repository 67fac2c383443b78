/* test_ckpt_forged.c — checkpoints whose checksums are valid but whose contents are forged: each known
 * bad case (a short or 1-byte step blob, a short rng or loader_pos, a duplicated blob name, a loader
 * epoch of 2^63, a config blob that is not a config, a step blob that disagrees with the header, a copy
 * under another step's name) is refused with its message naming the file and the blob, both by the
 * reader (qt_ckpt_open, qt_ckpt_state_read) and by `qtrain --resume`, which must not resume from it.
 *
 * The forged files are made from the step-2 checkpoint of a real run: its blobs rewritten through
 * qt_ckpt_save (which computes the checksums), or its table edited and the checksums recomputed
 * (tests/fuzz/ckpt_forge.h). Run under `make test-asan`, this is the sanitizers' forged-checkpoint
 * corpus: a reader that copied past a blob's end would be reported there. */
#include "fuzz/ckpt_forge.h"
#include "qt_ckpt_state.h"
#include "qt_dtype.h"
#include "qt_error.h"
#include "qt_test_run.h"

static const char *const ENGINE_BLOBS[] = {"weights", "adam_m", "adam_v"}; /* the CPU engine's */

/* A forgery: the state blobs of the base checkpoint with one change, or a table edit. */
typedef struct {
    const char *name;   /* also the checkpoint.dir of its resume */
    int blob;           /* -1: none; else the index (in qt_ckpt_state_items order) of the blob cut to cut bytes */
    size_t cut;
    uint64_t epoch;     /* != 0: the loader epoch */
    const char *config; /* non-NULL: the config blob's text */
    int64_t step;       /* >= 0: the step blob's value */
    int dup;            /* 1: the rng blob's table entry renamed to "step" */
    const char *want;   /* what the refusal says */
    const char *resume; /* what --resume says, when not want (it loads the stored config first) */
} forgery;

/* Writes the forged file g_dir/<f->name>/ckpt_00000002.qtc from the base checkpoint ck into path. */
static int forge(const qt_ckpt *ck, const forgery *f, char *path, size_t cap, char *err, size_t errlen) {
    char dir[512];
    qt_ckpt_state cs;
    if (qt_ckpt_state_read(ck, "base", &cs, NULL, err, errlen)) return -1;
    if (f->epoch) cs.pos.epoch = f->epoch;
    if (f->config) cs.config = f->config, cs.config_bytes = strlen(f->config);
    if (f->step >= 0) cs.step = f->step;
    qt_ckpt_item items[16];
    int n = 0;
    for (int i = 0; i < 3; i++) {
        size_t nb;
        const void *p = qt_ckpt_get(ck, ENGINE_BLOBS[i], &nb, NULL);
        if (!p) return qt_errf(err, errlen, "base: no blob %s", ENGINE_BLOBS[i]);
        items[n++] = (qt_ckpt_item){ENGINE_BLOBS[i], QT_DT_F32, p, nb, 0};
    }
    int first = n;
    n += qt_ckpt_state_items(&cs, items + n);
    if (f->blob >= 0) items[first + f->blob].bytes -= f->cut;
    snprintf(dir, sizeof dir, "%s/%s", g_dir, f->name);
    if (qt_ckpt_save(dir, 2, 0, items, n, err, errlen)) return -1;
    snprintf(path, cap, "%s/ckpt_00000002.qtc", dir);
    if (!f->dup) return 0;
    size_t len;
    uint8_t *b = (uint8_t *)qt_t_read_file(path, &len);
    int e = b ? forge_find(b, len, "rng") : -1;
    if (e < 0) return qt_errf(err, errlen, "%s: no rng entry to rename", path);
    memset(forge_entry(b, (uint32_t)e), 0, FORGE_NAME);
    memcpy(forge_entry(b, (uint32_t)e), "step", 4);
    forge_fix(b, len);
    FILE *o = fopen(path, "wb");
    int bad = !o || fwrite(b, 1, len, o) != len;
    if (o) fclose(o);
    free(b);
    return bad ? qt_errf(err, errlen, "%s: cannot rewrite", path) : 0;
}

static const forgery CASES[] = {
    {"short_step", 0, 4, 0, NULL, -1, 0, "blob step: 4 bytes, expected 8", NULL},
    {"byte_step", 0, 7, 0, NULL, -1, 0, "blob step: 1 bytes, expected 8", NULL},
    {"short_rng", 1, 16, 0, NULL, -1, 0, "blob rng: 16 bytes, expected 32", NULL},
    {"short_pos", 2, 8, 0, NULL, -1, 0, "blob loader_pos: 16 bytes, expected 24", NULL},
    {"dup_name", -1, 0, 0, NULL, -1, 1, "blob step: its name appears twice", NULL},
    {"epoch_2_63", -1, 0, (uint64_t)1 << 63, NULL, -1, 0, "blob loader_pos: epoch 9223372036854775808", NULL},
    {"garbage_config", -1, 0, 0, "\x01\x7f: [unclosed\n", -1, 0, "blob config: does not load as a config", ".qtc:config"},
    {"text_config", -1, 0, 0, "just some words\n", -1, 0, "blob config: does not load as a config", ".qtc:config"},
    {"step_vs_header", -1, 0, 0, NULL, 5, 0, "blob step: 5, but the file's header holds step 2", NULL},
    {"model_cfg_under_base", 3, sizeof(qt_model_cfg) - QT_MODEL_CFG_BASE_BYTES + 4, 0, NULL, -1, 0,
     "blob model_cfg: ", NULL},
};

static qt_ckpt *g_base;

static void test_reader_refuses_forgeries(void) {
    QT_REQUIRE(g_base, "no base checkpoint");
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) {
        char path[512], err[2048] = "";
        QT_REQUIRE(forge(g_base, &CASES[i], path, sizeof path, err, sizeof err) == 0, "%s: %s", CASES[i].name, err);
        qt_ckpt *ck = qt_ckpt_open(path, err, sizeof err);
        qt_ckpt_state cs;
        int refused = !ck || qt_ckpt_state_read(ck, path, &cs, NULL, err, sizeof err) != 0;
        qt_ckpt_close(ck);
        QT_EXPECT(refused && strstr(err, path) && strstr(err, CASES[i].want), "%s: refused %d: %s (expected \"%s\")",
                  CASES[i].name, refused, err, CASES[i].want);
    }
}

/* The same files given to qtrain --resume: refused, named, nothing trained. */
static void test_resume_refuses_forgeries(void) {
    QT_REQUIRE(g_base, "no base checkpoint");
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) {
        char path[512], cfg[512], out[512], err[2048] = "";
        QT_REQUIRE(forge(g_base, &CASES[i], path, sizeof path, err, sizeof err) == 0, "%s: %s", CASES[i].name, err);
        write_cfg(cfg, sizeof cfg, CASES[i].name, 4, 2, 5, NULL);
        snprintf(out, sizeof out, "%s/%s.out", g_dir, CASES[i].name);
        const char *args[] = {cfg, "--resume", NULL};
        int st = run_qtrain(out, args);
        const char *want = CASES[i].resume ? CASES[i].resume : CASES[i].want;
        QT_EXPECT(st == 1 && file_has(out, path) && file_has(out, want) && !file_has(out, "resumed from"),
                  "%s: status %d (see %s; expected \"%s\")", CASES[i].name, st, out, want);
    }
}

/* A checkpoint written before qt_model_cfg grew (its model_cfg blob the base bytes only: the default RoPE
 * and nothing added since) resumes, and the run goes on to the steps of an uninterrupted one. */
static void test_base_model_cfg_resumes(void) {
    QT_REQUIRE(g_base, "no base checkpoint");
    forgery f = {"base_model_cfg", 3, sizeof(qt_model_cfg) - QT_MODEL_CFG_BASE_BYTES, 0, NULL, -1, 0, NULL, NULL};
    char path[512], cfg[512], out[512], err[2048] = "";
    QT_REQUIRE(forge(g_base, &f, path, sizeof path, err, sizeof err) == 0, "%s", err);
    qt_ckpt *ck = qt_ckpt_open(path, err, sizeof err);
    qt_ckpt_state cs;
    int rc = ck ? qt_ckpt_state_read(ck, path, &cs, NULL, err, sizeof err) : -1;
    qt_ckpt_close(ck);
    QT_REQUIRE(rc == 0, "read: %s", err);
    write_cfg(cfg, sizeof cfg, f.name, 4, 2, 5, NULL);
    snprintf(out, sizeof out, "%s/%s.out", g_dir, f.name);
    const char *args[] = {cfg, "--resume", NULL};
    int st = run_qtrain(out, args);
    QT_EXPECT(st == 0 && file_has(out, "resumed from") && newest_step(f.name) == 4, "status %d, newest %ld (see %s)", st,
              newest_step(f.name), out);
}

/* A copy of a checkpoint under a newer step's name is not taken for the newest: its header's step
 * disagrees with the name, so it is set aside and the run resumes from the real newest. */
static void test_renamed_copy_not_newest(void) {
    char cfg[512], out[512], src[512], dst[512];
    QT_REQUIRE(run_to_end("copy", 4, 2, 5, NULL) == 0, "first run failed");
    ckpt_file(src, sizeof src, "copy", 4);
    ckpt_file(dst, sizeof dst, "copy", 99999999);
    size_t n;
    char *b = qt_t_read_file(src, &n), err[1024] = "";
    FILE *f = b ? fopen(dst, "wb") : NULL;
    QT_REQUIRE(f && fwrite(b, 1, n, f) == n, "copy %s", src);
    fclose(f);
    free(b);
    qt_ckpt *ck = qt_ckpt_open(dst, err, sizeof err);
    QT_EXPECT(!ck && strstr(err, dst) && strstr(err, "name says step 99999999 but its header holds step 4"), "open: %s", err);
    qt_ckpt_close(ck);
    write_cfg(cfg, sizeof cfg, "copy", 4, 2, 5, NULL);
    snprintf(out, sizeof out, "%s/copy2.out", g_dir);
    const char *args[] = {cfg, "--resume", "--set", "optim.steps=6", NULL};
    int st = run_qtrain(out, args);
    QT_EXPECT(st == 0 && file_has(out, "ckpt_99999999.qtc") && file_has(out, "ckpt_00000004.qtc at step 4") &&
              newest_step("copy") == 6, "status %d, newest %ld (see %s)", st, newest_step("copy"), out);
}

int main(int argc, char **argv) {
    if (qt_t_run_setup(argc, argv, "qt_forged")) return 1;
    char p[512], err[1024];
    if (run_to_end("base", 4, 2, 5, NULL) == 0) { /* the checkpoint of step 2 */
        ckpt_file(p, sizeof p, "base", 2);
        g_base = qt_ckpt_open(p, err, sizeof err);
        if (!g_base) printf("  base: %s\n", err);
    }
    QT_RUN(test_reader_refuses_forgeries);
    QT_RUN(test_resume_refuses_forgeries);
    QT_RUN(test_renamed_copy_not_newest);
    QT_RUN(test_base_model_cfg_resumes);
    qt_ckpt_close(g_base);
    if (!qt_t_nfail) qt_t_rmtree(g_dir);
    else printf("  files kept in %s\n", g_dir);
    return qt_test_end();
}
