/* test_docs.c — packed documents on the CPU reference: attention per document and RoPE positions that
 * restart at each one make a packed batch's loss and gradients those of its documents trained one by one. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "qt_cpu_model.h"
#include "qt_docs.h"
#include "qt_error.h"
#include "qt_model.h"
#include "qt_rng.h"
#include "qt_test.h"

static qt_model_cfg cfg_qwen(void) { /* GQA 6:2, qkv bias, tied, head_dim != C/H */
    qt_model_cfg c = {.arch = QT_ARCH_QWEN2, .vocab_size = 37, .hidden_size = 24, .num_layers = 2, .num_heads = 6,
                      .num_kv_heads = 2, .head_dim = 8, .intermediate_size = 40, .max_seq_len = 32,
                      .rope_theta = 10000.0f, .rms_norm_eps = 1e-6f, .tie_embeddings = 1, .qkv_bias = 1};
    return c;
}

static qt_model_cfg cfg_qwen3(void) { /* q/k norm per head, untied, a sliding window on layer 1 */
    qt_model_cfg c = {.arch = QT_ARCH_QWEN3, .vocab_size = 43, .hidden_size = 20, .num_layers = 2, .num_heads = 4,
                      .num_kv_heads = 2, .head_dim = 12, .intermediate_size = 36, .max_seq_len = 32,
                      .rope_theta = 1000.0f, .rms_norm_eps = 1e-6f, .tie_embeddings = 0, .sliding_window = 4,
                      .window_layers_from = 1};
    return c;
}

/* The packed batch: 2 rows of 16 tokens; row 0 holds documents [0,5) [5,11) [11,16), row 1 opens inside a
 * document ([0,3), position 0 at token 0) then [3,9) and [9,16). */
enum { B = 2, T = 16 };
static const int32_t STARTS[B * T] = {0, 5, 11, [T] = 3, 9};
static const int32_t N_STARTS[B] = {3, 2};

static double rel_l2(const float *a, const float *b, size_t n) {
    double d = 0, s = 0;
    for (size_t i = 0; i < n; i++) {
        d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        s += (double)b[i] * b[i];
    }
    return sqrt(d / (s > 0 ? s : 1));
}

typedef struct {
    double loss_rel, grad_rel;
} packed_diff;

/* Trains the packed batch (docs as given, NULL: plain causal) and its documents one by one (each a
 * sequence of its own, positions from 0), both with the packed batch's grad_scale, and returns the
 * relative L2 differences of the mean loss and of the summed gradients. */
static packed_diff packed_vs_separate(qt_model_cfg c, const qt_docs *docs, uint64_t seed) {
    packed_diff r = {INFINITY, INFINITY};
    qt_layout L;
    char err[256];
    QT_CHECK(qt_layout_init(&L, &c, err, sizeof err) == 0, "%s", err);
    float *w = malloc(L.numel * sizeof *w), *g = calloc(L.numel, sizeof *g), *gs = calloc(L.numel, sizeof *gs);
    qt_layout_init_weights(&L, w, seed, 0.2f);
    int32_t tok[B * T], tgt[B * T];
    qt_rng rng;
    qt_rng_seed(&rng, seed + 7);
    long valid = 0;
    for (int n = 0; n < B * T; n++) {
        tok[n] = (int32_t)qt_rng_below(&rng, c.vocab_size);
        tgt[n] = n % 7 == 3 ? -1 : (int32_t)qt_rng_below(&rng, c.vocab_size); /* some targets masked out */
        valid += tgt[n] >= 0;
    }
    float scale = 1.0f / (float)valid;
    qt_cpu_model *m = qt_cpu_model_create(&L, B, T);
    QT_CHECK(qt_cpu_model_set_docs(m, docs, err, sizeof err) == 0, "%s", err);
    double packed = qt_cpu_model_forward(m, w, tok, tgt);
    qt_cpu_model_backward(m, w, g, scale);
    qt_cpu_model_free(m);
    double sum = 0; /* the documents' summed target losses */
    for (int b = 0; b < B; b++)
        for (int k = -1; k < N_STARTS[b]; k++) { /* k = -1: the part before the first start, when there is one */
            int s = k < 0 ? 0 : STARTS[b * T + k], e = k + 1 < N_STARTS[b] ? STARTS[b * T + k + 1] : T;
            if (k < 0 && N_STARTS[b] > 0 && STARTS[b * T] == 0) continue;
            qt_cpu_model *d = qt_cpu_model_create(&L, 1, e - s);
            float l = qt_cpu_model_forward(d, w, tok + b * T + s, tgt + b * T + s);
            sum += (double)l * qt_cpu_model_targets(d);
            qt_cpu_model_backward(d, w, gs, scale);
            qt_cpu_model_free(d);
        }
    float lp = (float)packed, ls = (float)(sum / valid);
    r.loss_rel = rel_l2(&lp, &ls, 1);
    r.grad_rel = rel_l2(g, gs, L.numel);
    free(w);
    free(g);
    free(gs);
    qt_layout_free(&L);
    return r;
}

static const qt_docs DOCS = {STARTS, N_STARTS, 1, 1};

static void test_packed_equals_separate_documents(void) {
    qt_model_cfg cs[] = {cfg_qwen(), cfg_qwen3()};
    for (int i = 0; i < 2; i++) {
        packed_diff d = packed_vs_separate(cs[i], &DOCS, 11 + i);
        QT_EXPECT(d.loss_rel <= 1e-6 && d.grad_rel <= 1e-6, "model %d: loss rel %.3g, gradients rel L2 %.3g", i,
                  d.loss_rel, d.grad_rel);
    }
}

/* The check sees a missing boundary: without documents, or with positions restarting but attention
 * causal, the gradients are far off. Positions alone do not show in it: RoPE scores depend on position
 * differences only, so with attention per document positions t and t - start give the same maths. */
static void test_packed_check_is_sensitive(void) {
    qt_docs causal = DOCS;
    causal.attention = 0;
    packed_diff a = packed_vs_separate(cfg_qwen(), NULL, 11), b = packed_vs_separate(cfg_qwen(), &causal, 11);
    QT_EXPECT(a.grad_rel > 1e-3 && b.grad_rel > 1e-3, "gradients rel L2: no docs %.3g, causal %.3g", a.grad_rel,
              b.grad_rel);
}

/* Positions reach the model: with causal attention, restarting them changes the gradients. */
static double positions_effect(void) {
    qt_docs causal = DOCS, causal_window = DOCS;
    causal.attention = causal_window.attention = 0;
    causal_window.positions = 0;
    packed_diff a = packed_vs_separate(cfg_qwen(), &causal, 11), b = packed_vs_separate(cfg_qwen(), &causal_window, 11);
    return fabs(a.grad_rel - b.grad_rel);
}

static void test_positions_restart(void) {
    double d = positions_effect();
    QT_EXPECT(d > 1e-3, "positions document vs window under causal attention: gradients' distance differs by %.3g", d);
}

static void test_docs_expand(void) {
    int32_t lo[B * T], pos[B * T];
    char err[256];
    QT_REQUIRE(qt_docs_expand(&DOCS, B, T, lo, pos, err, sizeof err) == 0, "%s", err);
    QT_EXPECT(lo[4] == 0 && lo[5] == 5 && lo[15] == 11 && pos[5] == 0 && pos[15] == 4, "row 0: lo %d %d %d pos %d %d",
              lo[4], lo[5], lo[15], pos[5], pos[15]);
    QT_EXPECT(lo[T + 2] == 0 && pos[T + 2] == 2 && lo[T + 3] == 3 && pos[T + 8] == 5, "row 1: lo %d %d pos %d %d",
              lo[T + 2], lo[T + 3], pos[T + 2], pos[T + 8]);
    qt_docs window = DOCS;
    window.positions = 0;
    QT_REQUIRE(qt_docs_expand(&window, B, T, lo, pos, err, sizeof err) == 0, "%s", err);
    QT_EXPECT(pos[15] == 15 && lo[15] == 11, "window positions: pos %d lo %d", pos[15], lo[15]);
    int32_t bad[T] = {4, 4}, n1 = 2;
    qt_docs d = {bad, &n1, 1, 1};
    QT_EXPECT(qt_docs_expand(&d, 1, T, lo, pos, err, sizeof err) != 0 && strstr(err, "ascending"), "%s", err);
}

/* The planted bugs of docs.c (mutant build): each breaks packed == separate. */
static void test_mutants_caught(void) {
    QT_MUTANT_BUILD_ONLY();
    qt_t_hooks(NULL, QT_MUT_DOCS_BOUNDARY_IGNORED);
    packed_diff d = packed_vs_separate(cfg_qwen(), &DOCS, 11);
    qt_t_hooks(NULL, QT_MUT_DOCS_POS_NOT_RESTARTED);
    double p = positions_effect();
    qt_t_hooks(NULL, QT_MUT_NONE);
    QT_EXPECT(d.grad_rel > 1e-3, "boundary ignored: gradients rel L2 %.3g (not caught)", d.grad_rel);
    QT_EXPECT(p < 1e-3, "positions not restarted: still an effect of %.3g (the mutant did not act)", p);
}

int main(void) {
    QT_RUN(test_docs_expand);
    QT_RUN(test_packed_equals_separate_documents);
    QT_RUN(test_packed_check_is_sensitive);
    QT_RUN(test_positions_restart);
    QT_RUN(test_mutants_caught);
    return qt_test_end();
}
