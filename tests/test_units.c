/* test_units.c — the padded layout of a sharded run (qt_layout_init_units): every shard unit at a multiple of the
 * unit alignment, each tensor's compact offset that of the compact layout, the compact <-> flat maps, the seeded
 * init equal per tensor at every alignment (the padding zero), whole or by ranges; and the checkpoints: the CPU
 * engine on a padded layout writes the file the compact layout writes, and resumes one bit for bit. */
#include <stdint.h>
#include <unistd.h>

#include "qt_ckpt.h"
#include "qt_config.h"
#include "qt_engine.h"
#include "qt_model.h"
#include "qt_rng.h"
#include "qt_test.h"
#include "qt_weight_src.h"

static qt_model_cfg cfg_of(int which) {
    qt_model_cfg c = {.arch = QT_ARCH_QWEN2, .vocab_size = 37, .hidden_size = 24, .num_layers = 3, .num_heads = 6,
                      .num_kv_heads = 2, .head_dim = 8, .intermediate_size = 40, .max_seq_len = 32,
                      .rope_theta = 10000.0f, .rms_norm_eps = 1e-6f, .tie_embeddings = 1, .qkv_bias = 1};
    if (which == 1) { /* untied llama, C not a multiple of 64 */
        c.arch = QT_ARCH_LLAMA, c.vocab_size = 41, c.hidden_size = 40, c.num_heads = 4, c.num_kv_heads = 2;
        c.head_dim = 0, c.intermediate_size = 56, c.tie_embeddings = 0, c.qkv_bias = 0;
    } else if (which == 2) { /* qwen3: q/k norms last in the layer */
        c.arch = QT_ARCH_QWEN3, c.num_heads = 4, c.head_dim = 12, c.hidden_size = 20, c.tie_embeddings = 0, c.qkv_bias = 0;
    } else if (which == 3) { /* gemma3: the sandwich norms, one layer */
        c.arch = QT_ARCH_GEMMA3, c.num_layers = 1, c.num_heads = 4, c.num_kv_heads = 1, c.head_dim = 16, c.qkv_bias = 0;
    }
    return c;
}

static const size_t ALIGNS[] = {64, 128, 64 * 3, 64 * 6, 64 * 8 * 64};

/* The tensors keep their order, names and sizes; each one's compact offset is its offset in the compact layout;
 * units start at multiples of the alignment and hold the same tensors; nothing overlaps. */
static void test_units_layout(void) {
    char err[256];
    for (int which = 0; which < 4; which++) {
        qt_model_cfg c = cfg_of(which);
        qt_layout K;
        QT_REQUIRE(qt_layout_init(&K, &c, err, sizeof err) == 0, "%s", err);
        QT_EXPECT(K.unit_align == QT_LAYOUT_ALIGN && K.compact_numel == K.numel && K.n_units == c.num_layers + 2,
                  "compact layout: align %zu, %zu of %zu, %d units", K.unit_align, K.compact_numel, K.numel, K.n_units);
        for (size_t ai = 0; ai < sizeof ALIGNS / sizeof *ALIGNS; ai++) {
            size_t A = ALIGNS[ai];
            qt_layout P;
            QT_REQUIRE(qt_layout_init_units(&P, &c, A, err, sizeof err) == 0, "%s", err);
            QT_EXPECT(P.n_tensors == K.n_tensors && P.n_params == K.n_params && P.compact_numel == K.numel &&
                      P.numel % A == 0 && P.numel >= K.numel, "model %d, A %zu: %d tensors, numel %zu", which, A,
                      P.n_tensors, P.numel);
            QT_EXPECT(P.unit_at[0] == 0 && P.unit_at[P.n_units] == P.numel && P.unit_compact[P.n_units] == K.numel,
                      "model %d, A %zu: unit ends", which, A);
            for (int u = 0; u <= P.n_units; u++)
                QT_EXPECT(P.unit_at[u] % A == 0 && P.unit_compact[u] == K.unit_compact[u], "model %d, A %zu: unit %d at %zu",
                          which, A, u, P.unit_at[u]);
            for (int l = 0; l < c.num_layers; l++) QT_EXPECT(P.layers[l].ln1 == P.unit_at[1 + l], "layer %d", l);
            QT_EXPECT(P.final_norm == P.unit_at[c.num_layers + 1], "final norm at %zu", P.final_norm);
            size_t end = 0;
            for (int k = 0; k < P.n_tensors; k++) {
                const qt_tensor *p = &P.tensors[k], *q = &K.tensors[k];
                QT_EXPECT(!strcmp(p->name, q->name) && p->numel == q->numel && p->compact == q->offset &&
                              q->compact == q->offset && p->offset % QT_LAYOUT_ALIGN == q->offset % QT_LAYOUT_ALIGN &&
                              p->offset >= end,
                          "model %d, A %zu: %s at %zu (compact %zu, expected %zu)", which, A, p->name, p->offset, p->compact,
                          q->offset);
                end = p->offset + p->numel;
                /* the maps, at the tensor's first and last elements */
                QT_EXPECT(qt_layout_compact(&P, p->offset) == q->offset && qt_layout_flat(&P, q->offset) == p->offset &&
                              qt_layout_compact(&P, end - 1) == q->offset + q->numel - 1 &&
                              qt_layout_flat(&P, q->offset + q->numel - 1) == end - 1,
                          "model %d, A %zu: %s maps", which, A, p->name);
            }
            QT_EXPECT(end <= P.numel, "tensors end at %zu past %zu", end, P.numel);
            qt_layout_free(&P);
        }
        qt_layout_free(&K);
    }
    qt_layout L;
    QT_EXPECT(qt_layout_init_units(&L, &(qt_model_cfg){0}, 96, err, sizeof err) == -1 && strstr(err, "multiple of 64"),
              "%s", err);
}

/* The init of a padded layout: each tensor's values those of the compact layout, the padding zero; any range of
 * the padded array the same values as that part of the whole. */
static void test_units_init(void) {
    char err[256];
    qt_rng r;
    qt_rng_seed(&r, 52);
    for (int which = 0; which < 4; which++) {
        qt_model_cfg c = cfg_of(which);
        qt_layout K;
        QT_REQUIRE(qt_layout_init(&K, &c, err, sizeof err) == 0, "%s", err);
        float *wk = malloc(K.numel * sizeof *wk);
        QT_REQUIRE(wk, "out of memory");
        qt_layout_init_weights(&K, wk, 1234, 0.02f);
        for (size_t ai = 1; ai < sizeof ALIGNS / sizeof *ALIGNS; ai++) {
            qt_layout P;
            QT_REQUIRE(qt_layout_init_units(&P, &c, ALIGNS[ai], err, sizeof err) == 0, "%s", err);
            float *wp = malloc(P.numel * sizeof *wp), *part = malloc(P.numel * sizeof *part);
            unsigned char *real = calloc(P.numel, 1);
            QT_REQUIRE(wp && part && real, "out of memory");
            qt_layout_init_weights(&P, wp, 1234, 0.02f);
            for (int k = 0; k < P.n_tensors; k++) {
                const qt_tensor *t = &P.tensors[k];
                QT_EXPECT(!memcmp(wp + t->offset, wk + t->compact, t->numel * sizeof *wp), "model %d, A %zu: %s differs",
                          which, ALIGNS[ai], t->name);
                memset(real + t->offset, 1, t->numel);
            }
            size_t nz = 0;
            for (size_t i = 0; i < P.numel; i++) nz += !real[i] && wp[i] != 0.0f;
            QT_EXPECT(nz == 0, "model %d, A %zu: %zu padding elements not zero", which, ALIGNS[ai], nz);
            for (int k = 0; k < 8; k++) { /* odd ranges, across units */
                size_t lo = qt_rng_below(&r, P.numel), n = 1 + qt_rng_below(&r, P.numel - lo);
                qt_layout_init_range(&P, lo, n, part, 1234, 0.02f);
                QT_EXPECT(!memcmp(part, wp + lo, n * sizeof *part), "model %d, A %zu: range [%zu, %zu)", which,
                          ALIGNS[ai], lo, lo + n);
            }
            free(wp);
            free(part);
            free(real);
            qt_layout_free(&P);
        }
        free(wk);
        qt_layout_free(&K);
    }
}

enum { CK_B = 2, CK_T = 8 };

/* Steps [from, to] of a CPU engine on the tokens of each step's seed (the same for every layout). */
static int train_steps(qt_engine *e, int from, int to, char *err, size_t errlen) {
    int32_t in[CK_B * CK_T], tgt[CK_B * CK_T];
    for (int s = from; s <= to; s++) {
        qt_rng r;
        qt_rng_seed(&r, 1000 + (uint64_t)s);
        for (int i = 0; i < CK_B * CK_T; i++) in[i] = (int32_t)qt_rng_below(&r, 41), tgt[i] = (int32_t)qt_rng_below(&r, 41);
        float loss, gnorm;
        if (qt_engine_micro_step(e, in, tgt, qt_loss_scale(1, 1, CK_B * CK_T), err, errlen) ||
            qt_engine_opt_step(e, 1e-2f, s, &loss, &gnorm, err, errlen))
            return -1;
    }
    return 0;
}

/* The checkpoint file of e's state at `step` in dir (ckpt_<step>.qtc), read whole into *bytes (caller frees). */
static unsigned char *save_read(qt_engine *e, const char *dir, long step, size_t *bytes, char *err, size_t errlen) {
    qt_ckpt_item items[QT_ENGINE_MAX_ITEMS];
    int n = qt_engine_state_items(e, items, QT_ENGINE_MAX_ITEMS, err, errlen);
    if (n < 0 || qt_ckpt_save(dir, step, 0, items, n, err, errlen)) return NULL;
    char path[512];
    snprintf(path, sizeof path, "%s/ckpt_%08ld.qtc", dir, step);
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    *bytes = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc(*bytes);
    if (b && fread(b, 1, *bytes, f) != *bytes) free(b), b = NULL;
    fclose(f);
    return b;
}

/* The compact layout trains 5 steps, saving at 3; the padded layout (6 ranks' alignment) resumes that file at 3,
 * trains to 5 and saves: each tensor's weights bit for bit those of the compact run, the padding zero, and both
 * files of step 5 byte for byte the same (the compact layout's arrays, as every qtrain wrote them). A padded run
 * from the start saves at 3 the compact run's file too. grad_clip 0: the CPU's blocked norm groups a padded array
 * differently (its last bit may move), which a clipped step would carry into the weights. */
static void test_units_checkpoint(void) {
    static qt_config c;
    char err[1024], dir[3][64];
    qt_config_defaults(&c);
    c.model = cfg_of(1);
    c.device = QT_DEVICE_CPU;
    c.data.micro_batch = CK_B, c.data.seq_len = CK_T, c.data.grad_accum = 1;
    c.optim.grad_clip = 0;
    for (int i = 0; i < 3; i++) {
        snprintf(dir[i], sizeof dir[i], "/tmp/qt_units_XXXXXX");
        QT_REQUIRE(mkdtemp(dir[i]), "mkdtemp");
    }
    qt_layout K, P;
    QT_REQUIRE(qt_layout_init(&K, &c.model, err, sizeof err) == 0, "%s", err);
    QT_REQUIRE(qt_layout_init_units(&P, &c.model, 64 * 6, err, sizeof err) == 0, "%s", err);
    QT_REQUIRE(P.numel > K.numel, "no padding: %zu vs %zu", P.numel, K.numel);
    qt_weight_src sk, sp;
    qt_weight_src_of_config(&sk, &K, &c);
    qt_weight_src_of_config(&sp, &P, &c);
    qt_engine *ek = qt_engine_create(&K, &c, &sk, err, sizeof err), *ep = qt_engine_create(&P, &c, &sp, err, sizeof err);
    QT_REQUIRE(ek && ep, "%s", err);
    size_t nk3 = 0, np3 = 0, nk5 = 0, np5 = 0;
    unsigned char *fk3 = NULL, *fp3 = NULL, *fk5 = NULL, *fp5 = NULL;
    QT_EXPECT(train_steps(ek, 1, 3, err, sizeof err) == 0 && (fk3 = save_read(ek, dir[0], 3, &nk3, err, sizeof err)),
              "%s", err);
    QT_EXPECT(train_steps(ep, 1, 3, err, sizeof err) == 0 && (fp3 = save_read(ep, dir[1], 3, &np3, err, sizeof err)),
              "%s", err);
    QT_EXPECT(fk3 && fp3 && nk3 == np3 && !memcmp(fk3, fp3, nk3), "step 3: the padded run's file (%zu bytes) differs "
              "from the compact run's (%zu)", np3, nk3);
    qt_engine_free(ep); /* a fresh padded engine resumes the compact run's file */
    ep = qt_engine_create(&P, &c, &sp, err, sizeof err);
    QT_REQUIRE(ep, "%s", err);
    char path[512];
    snprintf(path, sizeof path, "%s/ckpt_%08d.qtc", dir[0], 3);
    qt_ckpt *ck = qt_ckpt_open(path, err, sizeof err);
    QT_REQUIRE(ck, "%s", err);
    QT_EXPECT(qt_engine_load_state(ep, ck, err, sizeof err) == 0, "%s", err);
    qt_ckpt_close(ck);
    QT_EXPECT(train_steps(ek, 4, 5, err, sizeof err) == 0 && train_steps(ep, 4, 5, err, sizeof err) == 0, "%s", err);
    float *wk = malloc(K.numel * sizeof *wk), *wp = malloc(P.numel * sizeof *wp);
    QT_REQUIRE(wk && wp, "out of memory");
    QT_EXPECT(qt_engine_get_weights(ek, wk, err, sizeof err) == 0 && qt_engine_get_weights(ep, wp, err, sizeof err) == 0,
              "%s", err);
    unsigned char *real = calloc(P.numel, 1);
    for (int k = 0; k < P.n_tensors; k++) {
        const qt_tensor *t = &P.tensors[k];
        QT_EXPECT(!memcmp(wp + t->offset, wk + t->compact, t->numel * sizeof *wp), "step 5: %s differs", t->name);
        memset(real + t->offset, 1, t->numel);
    }
    size_t nz = 0;
    for (size_t i = 0; i < P.numel; i++) nz += !real[i] && wp[i] != 0.0f;
    QT_EXPECT(nz == 0, "step 5: %zu padding elements not zero", nz);
    fk5 = save_read(ek, dir[0], 5, &nk5, err, sizeof err);
    fp5 = save_read(ep, dir[2], 5, &np5, err, sizeof err);
    QT_EXPECT(fk5 && fp5 && nk5 == np5 && !memcmp(fk5, fp5, nk5), "step 5: the resumed padded run's file (%zu bytes) "
              "differs from the compact run's (%zu)", np5, nk5);
    free(fk3), free(fp3), free(fk5), free(fp5), free(wk), free(wp), free(real);
    qt_engine_free(ek);
    qt_engine_free(ep);
    qt_layout_free(&K);
    qt_layout_free(&P);
    for (int i = 0; i < 3; i++) {
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir[i]);
        QT_EXPECT(system(cmd) == 0, "%s", cmd);
    }
}

int main(void) {
    QT_RUN(test_units_layout);
    QT_RUN(test_units_init);
    QT_RUN(test_units_checkpoint);
    return qt_test_end();
}
