/* test_model.c — the parameter layout and the CPU fp32 model: whole-model finite-difference gradient
 * checks (qwen2-style and llama-style), loss = mean CE of the logits, "+=" gradients, bit-identical
 * results for 1 and 2 OpenMP threads, and the fwd+bwd time of the tiny-cpu shape. */
#include <omp.h>
#include <stdint.h>
#include <time.h>

#include "qt_cpu_model.h"
#include "qt_error.h"
#include "qt_model.h"
#include "qt_partition.h"
#include "qt_ref.h"
#include "qt_rng.h"
#include "qt_test.h"

static qt_model_cfg cfg_qwen(void) { /* GQA 6:2, qkv bias, tied, head_dim != C/H */
    qt_model_cfg c = {.arch = QT_ARCH_QWEN2, .vocab_size = 37, .hidden_size = 24, .num_layers = 2, .num_heads = 6,
                      .num_kv_heads = 2, .head_dim = 8, .intermediate_size = 40, .max_seq_len = 32,
                      .rope_theta = 10000.0f, .rms_norm_eps = 1e-6f, .tie_embeddings = 1, .qkv_bias = 1};
    return c;
}

static qt_model_cfg cfg_llama(void) { /* GQA 4:2, no bias, untied, head_dim from C/H */
    qt_model_cfg c = {.arch = QT_ARCH_LLAMA, .vocab_size = 41, .hidden_size = 32, .num_layers = 2, .num_heads = 4,
                      .num_kv_heads = 2, .intermediate_size = 56, .max_seq_len = 16, .rope_theta = 500.0f,
                      .rms_norm_eps = 1e-5f, .tie_embeddings = 0, .qkv_bias = 0};
    return c;
}

static qt_model_cfg cfg_qwen3(void) { /* q/k norm per head, GQA 4:2, no bias, untied, head_dim 12, C/H = 5 */
    qt_model_cfg c = {.arch = QT_ARCH_QWEN3, .vocab_size = 43, .hidden_size = 20, .num_layers = 2, .num_heads = 4,
                      .num_kv_heads = 2, .head_dim = 12, .intermediate_size = 36, .max_seq_len = 16,
                      .rope_theta = 1000.0f, .rms_norm_eps = 1e-6f, .tie_embeddings = 0};
    return c;
}

static qt_model_cfg cfg_tiny_cpu(void) {
    qt_model_cfg c = {.arch = QT_ARCH_LLAMA, .vocab_size = 256, .hidden_size = 128, .num_layers = 4, .num_heads = 4,
                      .num_kv_heads = 2, .intermediate_size = 384, .max_seq_len = 128, .rope_theta = 10000.0f,
                      .rms_norm_eps = 1e-5f, .tie_embeddings = 1};
    return c;
}

/* Weights with every tensor kind perturbed away from its init (norms != 1, biases != 0), so that a
 * backward that ignored one of them would show. Caller frees. */
static float *random_weights(const qt_layout *L, uint64_t seed, float std) {
    float *w = malloc(L->numel * sizeof *w);
    qt_layout_init_weights(L, w, seed, std);
    qt_rng r;
    qt_rng_seed(&r, seed + 1);
    for (int k = 0; k < L->n_tensors; k++) {
        const qt_tensor *t = &L->tensors[k];
        if (t->ndim == 1)
            for (size_t i = 0; i < t->numel; i++) w[t->offset + i] += 0.2f * qt_rng_normal(&r);
    }
    return w;
}

static void random_tokens(int32_t *tok, int32_t *tgt, long N, int V, uint64_t seed) {
    qt_rng r;
    qt_rng_seed(&r, seed);
    for (long n = 0; n < N; n++) {
        tok[n] = (int32_t)qt_rng_below(&r, V);
        tgt[n] = (int32_t)qt_rng_below(&r, V);
    }
    if (tgt) tgt[N / 2] = tgt[N - 1] = -1; /* ignored rows */
}

static double loss_at(qt_cpu_model *m, const float *w, const int32_t *tok, const int32_t *tgt) {
    return qt_cpu_model_forward(m, w, tok, tgt);
}

static void fd_model(qt_model_cfg c, const char *what) {
    char err[256];
    qt_layout L;
    QT_REQUIRE(qt_layout_init(&L, &c, err, sizeof err) == 0, "%s", err);
    int B = 2, T = 11;
    long N = (long)B * T;
    qt_cpu_model *m = qt_cpu_model_create(&L, B, T);
    float *w = random_weights(&L, 11, 0.15f), *g = calloc(L.numel, sizeof *g), *w2 = malloc(L.numel * sizeof *w2);
    int32_t tok[64], tgt[64];
    random_tokens(tok, tgt, N, c.vocab_size, 5);
    double l0 = loss_at(m, w, tok, tgt);
    qt_cpu_model_backward(m, w, g, 1.0f / qt_cpu_model_targets(m)); /* d(mean loss) */
    QT_EXPECT(isfinite(l0) && l0 > 0, "loss %g", l0);
    qt_rng r;
    qt_rng_seed(&r, 99);
    /* random directions over all parameters (padding stays 0) */
    double worst_dir = 0;
    for (int k = 0; k < 4; k++) {
        double ana = 0;
        float eps = 2.5e-4f; /* 1e-3 leaves 2% of truncation error on Gemma's (1 + w) sandwich norms and cap */
        float *d = calloc(L.numel, sizeof *d);
        for (int t = 0; t < L.n_tensors; t++)
            for (size_t i = 0; i < L.tensors[t].numel; i++) d[L.tensors[t].offset + i] = qt_rng_normal(&r);
        for (size_t i = 0; i < L.numel; i++) ana += (double)g[i] * d[i];
        for (size_t i = 0; i < L.numel; i++) w2[i] = w[i] + eps * d[i];
        double lp = loss_at(m, w2, tok, tgt);
        for (size_t i = 0; i < L.numel; i++) w2[i] = w[i] - eps * d[i];
        double num = (lp - loss_at(m, w2, tok, tgt)) / (2.0 * eps);
        double rel = fabs(num - ana) / fabs(ana);
        if (rel > worst_dir) worst_dir = rel;
        QT_EXPECT(rel < 1e-2, "%s direction %d: analytic %.6g numeric %.6g", what, k, ana, num);
        free(d);
    }
    /* per tensor: the largest-gradient coordinate of a random sample, and one random coordinate */
    double worst_coord = 0;
    memcpy(w2, w, L.numel * sizeof *w2);
    for (int t = 0; t < L.n_tensors; t++) {
        const qt_tensor *ts = &L.tensors[t];
        size_t best = ts->offset + qt_rng_below(&r, ts->numel), pick[2];
        for (int s = 0; s < 12; s++) {
            size_t i = ts->offset + qt_rng_below(&r, ts->numel);
            if (fabsf(g[i]) > fabsf(g[best])) best = i;
        }
        pick[0] = best;
        pick[1] = ts->offset + qt_rng_below(&r, ts->numel);
        for (int p = 0; p < 2; p++) {
            size_t i = pick[p];
            float eps = 1e-2f;
            w2[i] = w[i] + eps;
            double lp = loss_at(m, w2, tok, tgt);
            w2[i] = w[i] - eps;
            double lm = loss_at(m, w2, tok, tgt);
            w2[i] = w[i];
            double num = (lp - lm) / (2.0 * eps), ana = g[i], err_abs = fabs(num - ana);
            if (p == 0 && fabs(ana) > 0) worst_coord = fmax(worst_coord, err_abs / fabs(ana));
            QT_EXPECT(err_abs <= 2e-2 * fabs(ana) + 2e-5, "%s %s[%zu]: analytic %.6g numeric %.6g", what, ts->name,
                      i - ts->offset, ana, num);
        }
        QT_EXPECT(fabsf(g[best]) > 1e-5f, "%s %s: no gradient (max sampled |g| = %g)", what, ts->name, g[best]);
    }
    printf("  %s: loss %.5f, max rel err: directions %.2e, largest-|g| coordinates %.2e\n", what, l0, worst_dir,
           worst_coord);
    for (size_t i = 0; i < L.numel; i++) QT_EXPECT(isfinite(g[i]), "%s grad[%zu] = %g", what, i, g[i]);
    free(w);
    free(w2);
    free(g);
    qt_cpu_model_free(m);
    qt_layout_free(&L);
}

static void test_fd_qwen2_gqa_bias_tied(void) { fd_model(cfg_qwen(), "qwen2"); }
static void test_fd_llama_gqa_untied(void) { fd_model(cfg_llama(), "llama"); }
/* RoPE scaling reaches the model (another loss than the default RoPE's): llama3 at
 * original_max_position_embeddings 8 smooths pair 0 of head_dim 8 (wavelength 2 pi, between 8 / 4 and
 * 8 / 1) and divides the other three by 8; yarn's attention factor also scales q and k, so its backward is
 * checked against finite differences too (the other types differ from the default in the table alone,
 * which test_ops checks with any frequencies). */
static void test_fd_rope_scaled(void) {
    qt_model_cfg y = cfg_qwen(), l3 = cfg_qwen();
    y.rope = (qt_rope_cfg){.type = QT_ROPE_YARN, .factor = 4, .original_max_pos = 8, .truncate = 1};
    l3.rope = (qt_rope_cfg){.type = QT_ROPE_LLAMA3, .factor = 8, .original_max_pos = 8, .low_freq_factor = 1,
                            .high_freq_factor = 4};
    qt_model_cfg plain[2] = {cfg_qwen(), cfg_qwen()}, *scaled[2] = {&y, &l3};
    for (int k = 0; k < 2; k++) {
        qt_layout L, Lp;
        char err[256];
        QT_REQUIRE(qt_layout_init(&L, scaled[k], err, sizeof err) == 0 && qt_layout_init(&Lp, &plain[k], err, sizeof err) == 0,
                   "%s", err);
        qt_cpu_model *m = qt_cpu_model_create(&L, 2, 11), *mp = qt_cpu_model_create(&Lp, 2, 11);
        float *w = random_weights(&L, 11, 0.15f);
        int32_t tok[22], tgt[22];
        random_tokens(tok, tgt, 22, scaled[k]->vocab_size, 5);
        double ls = loss_at(m, w, tok, tgt), lp = loss_at(mp, w, tok, tgt);
        QT_EXPECT(fabs(ls - lp) > 1e-4 * lp, "%s: loss %.9g equals the default RoPE's %.9g", k ? "llama3" : "yarn", ls, lp);
        qt_cpu_model_free(m), qt_cpu_model_free(mp), free(w), qt_layout_free(&L), qt_layout_free(&Lp);
    }
    fd_model(y, "qwen2 yarn");
}

/* Each scaled rope_type's parameters are checked, naming the YAML key. */
static void test_rope_validate(void) {
    char err[256];
    struct { qt_rope_cfg r; const char *want; } bad[] = {
        {{.type = (qt_rope_type)7}, "model.rope_type: expected default, linear, dynamic, yarn or llama3, got 7"},
        {{.type = QT_ROPE_LINEAR}, "model.rope_factor: expected a finite number > 0 for rope_type linear, got 0"},
        {{.type = QT_ROPE_LLAMA3, .factor = 8, .low_freq_factor = 1, .high_freq_factor = 1},
         "model.rope_high_freq_factor: expected a finite number > rope_low_freq_factor (1), got 1"},
        {{.type = QT_ROPE_LLAMA3, .factor = 8, .high_freq_factor = 4}, "model.rope_low_freq_factor: expected a finite number > 0"},
        {{.type = QT_ROPE_YARN, .factor = 4, .beta_fast = -1}, "model.rope_beta_fast: expected a finite number >= 0"},
        {{.type = QT_ROPE_YARN, .factor = 4, .attention_factor = NAN}, "model.rope_attention_factor: expected a finite number >= 0"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        qt_model_cfg c = cfg_qwen();
        c.rope = bad[i].r;
        qt_model_cfg_finish(&c);
        QT_EXPECT(qt_model_cfg_validate(&c, err, sizeof err) == -1 && strstr(err, bad[i].want), "case %zu: %s", i, err);
    }
    qt_model_cfg c = cfg_qwen();
    c.rope = (qt_rope_cfg){.type = QT_ROPE_YARN, .factor = 4, .truncate = 1};
    qt_model_cfg_finish(&c);
    QT_EXPECT(qt_model_cfg_validate(&c, err, sizeof err) == 0 && c.rope.original_max_pos == c.max_seq_len,
              "yarn without original_max_position_embeddings takes max_seq_len: %s (%d)", err, c.rope.original_max_pos);
}

static void test_fd_qwen3_qknorm(void) { fd_model(cfg_qwen3(), "qwen3"); }

/* Gemma 3: layers local, global, local (window 4 < T), their two RoPE bases with linear scaling on the global
 * one, an attention scalar that is not head_dim, the logit cap, tied, GQA 4:2. */
static qt_model_cfg cfg_gemma3(void) {
    qt_model_cfg c = {.arch = QT_ARCH_GEMMA3, .vocab_size = 39, .hidden_size = 24, .num_layers = 3, .num_heads = 4,
                      .num_kv_heads = 2, .head_dim = 8, .intermediate_size = 36, .max_seq_len = 40,
                      .rope_theta = 1000.0f, .rms_norm_eps = 1e-6f, .tie_embeddings = 1, .sliding_window = 4,
                      .window_pattern = 2, .rope_local_theta = 10.0f, .attn_scalar = 20.0f, .logit_softcap = 2.0f,
                      .rope = {.type = QT_ROPE_LINEAR, .factor = 4.0f}};
    return c;
}

/* Every Gemma piece reaches the loss (turning one off changes it), then the whole model's gradient against
 * finite differences. */
static void test_fd_gemma3(void) {
    qt_model_cfg base = cfg_gemma3(), off[5];
    const char *what[5] = {"window_pattern", "rope_local_theta", "query_pre_attn_scalar", "final_logit_softcapping",
                           "rope scaling of the global layers"};
    for (int k = 0; k < 5; k++) off[k] = base;
    off[0].window_pattern = 0, off[1].rope_local_theta = 0, off[2].attn_scalar = 0, off[3].logit_softcap = 0;
    off[4].rope = (qt_rope_cfg){0};
    qt_layout L;
    char err[256];
    QT_REQUIRE(qt_layout_init(&L, &base, err, sizeof err) == 0, "%s", err);
    float *w = random_weights(&L, 11, 0.3f);
    int32_t tok[22], tgt[22];
    random_tokens(tok, tgt, 22, base.vocab_size, 5);
    qt_cpu_model *m = qt_cpu_model_create(&L, 2, 11);
    double l0 = loss_at(m, w, tok, tgt);
    for (int k = 0; k < 5; k++) {
        qt_layout Lo;
        QT_REQUIRE(qt_layout_init(&Lo, &off[k], err, sizeof err) == 0 && Lo.numel == L.numel, "%s", err);
        qt_cpu_model *mo = qt_cpu_model_create(&Lo, 2, 11);
        double lo = loss_at(mo, w, tok, tgt);
        QT_EXPECT(fabs(lo - l0) > 1e-4 * l0, "without %s the loss %.9g equals gemma3's %.9g", what[k], lo, l0);
        qt_cpu_model_free(mo), qt_layout_free(&Lo);
    }
    qt_cpu_model_free(m), free(w), qt_layout_free(&L);
    fd_model(base, "gemma3");
}

/* The model's loss is the mean of qt_ref_cross_entropy_fwd over its logits; backward is "+=" and scales. */
static void test_loss_and_accumulation(void) {
    char err[256];
    qt_model_cfg c = cfg_qwen();
    qt_layout L;
    QT_REQUIRE(qt_layout_init(&L, &c, err, sizeof err) == 0, "%s", err);
    int B = 2, T = 11, V = c.vocab_size;
    long N = (long)B * T;
    qt_cpu_model *m = qt_cpu_model_create(&L, B, T);
    float *w = random_weights(&L, 3, 0.1f), *g1 = calloc(L.numel, sizeof *g1), *g2 = malloc(L.numel * sizeof *g2);
    float *loss = malloc(N * sizeof *loss);
    int32_t tok[64], tgt[64];
    random_tokens(tok, tgt, N, V, 8);
    float l = qt_cpu_model_forward(m, w, tok, tgt);
    qt_ref_cross_entropy_fwd(loss, qt_cpu_model_logits(m), tgt, N, V);
    double s = 0;
    int cnt = 0;
    for (long n = 0; n < N; n++)
        if (tgt[n] >= 0) s += loss[n], cnt++;
    QT_EXPECT(cnt == N - 2 && fabs(l - s / cnt) <= 1e-6 * fabs(l), "model %.8g vs mean CE %.8g", l, s / cnt);
    /* logits only: returns 0 */
    QT_EXPECT(qt_cpu_model_forward(m, w, tok, NULL) == 0.0f, "no targets must give 0");
    qt_cpu_model_forward(m, w, tok, tgt);
    QT_EXPECT(qt_cpu_model_targets(m) == N - 2, "%ld targets counted, expected %ld", qt_cpu_model_targets(m), N - 2);
    qt_cpu_model_backward(m, w, g1, 1.0f / cnt);
    for (size_t i = 0; i < L.numel; i++) g2[i] = g1[i];
    qt_cpu_model_forward(m, w, tok, tgt);
    qt_cpu_model_backward(m, w, g2, 2.0f / cnt); /* g2 = g1 + 2 g1 */
    for (size_t i = 0; i < L.numel; i++) g1[i] *= 3.0f;
    QT_EXPECT(qt_t_close("3g", g2, g1, (long)L.numel, 1e-7, 1e-5), "grad_scale / += mismatch");
    /* padding gets no gradient */
    size_t end = 0;
    for (int t = 0; t < L.n_tensors; t++) {
        const qt_tensor *ts = &L.tensors[t];
        for (size_t i = end; i < ts->offset; i++) QT_EXPECT(g2[i] == 0.0f, "padding grad[%zu] = %g", i, g2[i]);
        if (ts->offset + ts->numel > end) end = ts->offset + ts->numel;
    }
    free(w);
    free(g1);
    free(g2);
    free(loss);
    qt_cpu_model_free(m);
    qt_layout_free(&L);
}

/* Loss, logits and gradients are bit-identical with 1 and with 2 threads. */
static void thread_determinism(qt_model_cfg c) {
    char err[256];
    qt_layout L;
    QT_REQUIRE(qt_layout_init(&L, &c, err, sizeof err) == 0, "%s", err);
    int B = 3, T = 37;
    long N = (long)B * T;
    float *w = random_weights(&L, 21, 0.05f), *g[2];
    float loss[2];
    int32_t *tok = malloc(N * sizeof *tok), *tgt = malloc(N * sizeof *tgt);
    random_tokens(tok, tgt, N, c.vocab_size, 4);
    int saved = omp_get_max_threads();
    for (int k = 0; k < 2; k++) {
        omp_set_num_threads(k + 1);
        qt_cpu_model *m = qt_cpu_model_create(&L, B, T);
        g[k] = calloc(L.numel, sizeof *g[k]);
        loss[k] = qt_cpu_model_forward(m, w, tok, tgt);
        qt_cpu_model_backward(m, w, g[k], 0.5f / qt_cpu_model_targets(m));
        qt_cpu_model_free(m);
    }
    omp_set_num_threads(saved);
    QT_EXPECT(memcmp(&loss[0], &loss[1], sizeof(float)) == 0, "loss %.9g vs %.9g", loss[0], loss[1]);
    size_t diff = 0;
    for (size_t i = 0; i < L.numel; i++) diff += memcmp(&g[0][i], &g[1][i], sizeof(float)) != 0;
    QT_EXPECT(diff == 0, "%zu of %zu gradient elements differ between 1 and 2 threads", diff, L.numel);
    free(g[0]);
    free(g[1]);
    free(w);
    free(tok);
    free(tgt);
    qt_layout_free(&L);
}
static void test_thread_determinism(void) {
    qt_model_cfg c = {.arch = QT_ARCH_QWEN2, .vocab_size = 70, .hidden_size = 48, .num_layers = 2, .num_heads = 6,
                      .num_kv_heads = 3, .intermediate_size = 72, .max_seq_len = 64, .rope_theta = 1e6f,
                      .rms_norm_eps = 1e-6f, .tie_embeddings = 1, .qkv_bias = 1};
    thread_determinism(c);
    c = cfg_qwen3(); /* the q/k norm's dw: one thread per column */
    c.max_seq_len = 64;
    thread_determinism(c);
}

/* Gemma's extra norms' dw and the capped loss: the same bits for 1 and 2 threads. */
static void test_thread_determinism_gemma3(void) { thread_determinism(cfg_gemma3()); }

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

/* The tiny-cpu shape: time fwd+bwd, and check the init loss is ~ln(V) and a few SGD steps on one
 * batch lower it. */
static void test_tiny_cpu_speed(void) {
    char err[256];
    qt_model_cfg c = cfg_tiny_cpu();
    qt_layout L;
    QT_REQUIRE(qt_layout_init(&L, &c, err, sizeof err) == 0, "%s", err);
    int B = 8, T = 128;
    long N = (long)B * T;
    qt_cpu_model *m = qt_cpu_model_create(&L, B, T);
    float *w = malloc(L.numel * sizeof *w), *g = malloc(L.numel * sizeof *g);
    qt_layout_init_weights(&L, w, 1, 0.02f);
    int32_t *tok = malloc(N * sizeof *tok), *tgt = malloc(N * sizeof *tgt);
    random_tokens(tok, tgt, N, c.vocab_size, 2);
    for (long n = 0; n < N; n++) tgt[n] = (tok[n] * 7 + 3) % c.vocab_size; /* learnable */
    float first = 0, last = 0;
    double t0 = 0;
    int steps = 6;
    for (int s = 0; s <= steps; s++) {
        if (s == 1) t0 = now_s(); /* step 0 warms up */
        memset(g, 0, L.numel * sizeof *g);
        last = qt_cpu_model_forward(m, w, tok, tgt);
        if (s == 0) first = last;
        qt_cpu_model_backward(m, w, g, 1.0f / N);
        for (size_t i = 0; i < L.numel; i++) w[i] -= 0.5f * g[i];
    }
    double ms = (now_s() - t0) * 1e3 / steps;
    double gf = qt_model_flops_per_token(&L.cfg, T) * N / (ms * 1e-3) * 1e-9;
    printf("  tiny-cpu (%.2fM params, B=%d T=%d, %d threads): %.1f ms per fwd+bwd, %.1f GFLOP/s; loss %.4f -> %.4f\n",
           L.n_params * 1e-6, B, T, omp_get_max_threads(), ms, gf, first, last);
    QT_EXPECT(fabs(first - log(256.0)) < 0.05, "init loss %g, expected ~ln(256) = %g", first, log(256.0));
    QT_EXPECT(last < first - 0.05, "loss did not fall: %g -> %g", first, last);
    free(w);
    free(g);
    free(tok);
    free(tgt);
    qt_cpu_model_free(m);
    qt_layout_free(&L);
}

/* ---- layout ---- */

/* Groups start aligned, fused members are adjacent, nothing overlaps and numel covers everything. */
static void check_layout_shape(const qt_layout *L) {
    size_t end = 0;
    for (int t = 0; t < L->n_tensors; t++) {
        const qt_tensor *ts = &L->tensors[t];
        QT_EXPECT(ts->offset >= end, "%s at %zu overlaps the previous tensor (ends %zu)", ts->name, ts->offset, end);
        int follows = ts->kind == QT_T_K || ts->kind == QT_T_V || ts->kind == QT_T_KB || ts->kind == QT_T_VB ||
                      ts->kind == QT_T_UP || ts->kind == QT_T_KNORM;
        if (follows) QT_EXPECT(ts->offset == end, "%s at %zu not adjacent to its group (%zu)", ts->name, ts->offset, end);
        else QT_EXPECT(ts->offset % QT_LAYOUT_ALIGN == 0, "%s at %zu not aligned", ts->name, ts->offset);
        end = ts->offset + ts->numel;
    }
    QT_EXPECT(L->numel >= end && L->numel % QT_LAYOUT_ALIGN == 0, "numel %zu, end %zu", L->numel, end);
}

static void test_layout_qwen05b(void) {
    qt_model_cfg c = {.arch = QT_ARCH_QWEN2, .vocab_size = 151936, .hidden_size = 896, .num_layers = 24,
                      .num_heads = 14, .num_kv_heads = 2, .intermediate_size = 4864, .max_seq_len = 32768,
                      .tie_embeddings = 1, .qkv_bias = 1};
    char err[256];
    qt_layout L;
    QT_REQUIRE(qt_layout_init(&L, &c, err, sizeof err) == 0, "%s", err);
    QT_EXPECT(L.cfg.head_dim == 64 && L.cfg.rope_theta == 1e6f && L.cfg.rms_norm_eps == 1e-6f, "finish: D=%d",
              L.cfg.head_dim);
    QT_EXPECT(L.n_params == 494032768, "Qwen2.5-0.5B has 494032768 parameters, got %zu", L.n_params);
    QT_EXPECT(L.n_tensors == 1 + 24 * 12 + 1, "%d tensors", L.n_tensors);
    QT_EXPECT(L.lm_head == L.embed && !qt_layout_find(&L, "lm_head.weight"), "tied head has its own entry");
    const qt_tensor *q = qt_layout_find(&L, "model.layers.3.self_attn.q_proj.weight");
    const qt_tensor *k = qt_layout_find(&L, "model.layers.3.self_attn.k_proj.weight");
    const qt_tensor *vb = qt_layout_find(&L, "model.layers.3.self_attn.v_proj.bias");
    const qt_tensor *up = qt_layout_find(&L, "model.layers.3.mlp.up_proj.weight");
    const qt_tensor *nrm = qt_layout_find(&L, "model.norm.weight");
    QT_REQUIRE(q && k && vb && up && nrm, "missing tensor names");
    QT_EXPECT(q->shape[0] == 896 && q->shape[1] == 896 && q->is_matrix && q->layer == 3, "q_proj");
    QT_EXPECT(k->shape[0] == 128 && k->offset == q->offset + q->numel, "k_proj");
    QT_EXPECT(L.layers[3].wqkv == q->offset && L.layers[3].bqkv + 896 + 128 == vb->offset, "layer offsets");
    QT_EXPECT(vb->ndim == 1 && !vb->is_matrix && vb->shape[0] == 128, "v bias");
    QT_EXPECT(up->offset == L.layers[3].wgu + (size_t)4864 * 896, "up follows gate");
    QT_EXPECT(nrm->offset == L.final_norm && !nrm->is_matrix && nrm->layer == -1, "final norm");
    QT_EXPECT(!L.tensors[0].is_matrix && L.tensors[0].offset == 0, "embedding");
    check_layout_shape(&L);
    qt_layout_free(&L);
}

static void test_layout_untied_llama(void) {
    qt_model_cfg c = cfg_llama();
    char err[256];
    qt_layout L;
    QT_REQUIRE(qt_layout_init(&L, &c, err, sizeof err) == 0, "%s", err);
    const qt_tensor *h = qt_layout_find(&L, "lm_head.weight");
    QT_REQUIRE(h, "untied model has no lm_head.weight");
    QT_EXPECT(h->offset == L.lm_head && L.lm_head != L.embed && h->shape[0] == 41 && !h->is_matrix, "lm_head");
    QT_EXPECT(L.layers[0].bqkv == SIZE_MAX && !qt_layout_find(&L, "model.layers.0.self_attn.q_proj.bias"), "bias");
    QT_EXPECT(L.cfg.head_dim == 8, "head_dim %d", L.cfg.head_dim);
    size_t want = 41 * 32 * 2 + 32 + 2 * (2 * 32 + 32 * 32 * 2 + 16 * 32 * 2 + 3 * 32 * 56);
    QT_EXPECT(L.n_params == want, "n_params %zu, want %zu", L.n_params, want);
    check_layout_shape(&L);
    qt_layout_free(&L);
}

/* Qwen3-4B: head_dim 128 with hidden 2560 and 32 heads; q_norm / k_norm [128] per layer, the last group
 * of the layer (the other offsets as without them), norms (init 1, no decay); HF's parameter count. */
static void test_layout_qwen3_4b(void) {
    qt_model_cfg c = {.arch = QT_ARCH_QWEN3, .vocab_size = 151936, .hidden_size = 2560, .num_layers = 36,
                      .num_heads = 32, .num_kv_heads = 8, .head_dim = 128, .intermediate_size = 9728,
                      .max_seq_len = 40960, .tie_embeddings = 1};
    char err[256];
    qt_layout L;
    QT_REQUIRE(qt_layout_init(&L, &c, err, sizeof err) == 0, "%s", err);
    QT_EXPECT(L.cfg.qk_norm == 1 && L.cfg.rope_theta == 1e6f && L.cfg.rms_norm_eps == 1e-6f, "finish: qk_norm %d",
              L.cfg.qk_norm);
    QT_EXPECT(L.n_params == 4022468096u, "Qwen3-4B has 4022468096 parameters, got %zu", L.n_params);
    QT_EXPECT(L.n_tensors == 1 + 36 * 11 + 1, "%d tensors", L.n_tensors);
    const qt_tensor *qn = qt_layout_find(&L, "model.layers.5.self_attn.q_norm.weight");
    const qt_tensor *kn = qt_layout_find(&L, "model.layers.5.self_attn.k_norm.weight");
    QT_REQUIRE(qn && kn, "missing q_norm / k_norm");
    QT_EXPECT(qn->ndim == 1 && qn->shape[0] == 128 && !qn->is_matrix && qn->layer == 5 && kn->shape[0] == 128 &&
                  !kn->is_matrix, "q_norm / k_norm shapes");
    QT_EXPECT(qn->offset == L.layers[5].qknorm && kn->offset == qn->offset + 128, "q_norm at %zu, k_norm at %zu",
              qn->offset, kn->offset);
    QT_EXPECT(L.layers[5].qknorm > L.layers[5].wdown && kn->offset + 128 <= qt_layer_end(&L, 5), "not in layer 5");
    const qt_tensor *q = qt_layout_find(&L, "model.layers.5.self_attn.q_proj.weight");
    QT_EXPECT(q && q->shape[0] == 4096 && q->shape[1] == 2560 && L.layers[5].bqkv == SIZE_MAX, "q_proj [4096, 2560]");
    check_layout_shape(&L);
    QT_EXPECT(qt_model_cfg_numel(&L.cfg) >= L.numel, "cfg_numel %llu < numel %zu",
              (unsigned long long)qt_model_cfg_numel(&L.cfg), L.numel);
    float *w = malloc(L.numel * sizeof *w);
    qt_layout_init_range(&L, qn->offset, 256, w, 7, 0.02f);
    for (int i = 0; i < 256; i++) QT_EXPECT(w[i] == 1.0f, "q/k norm init [%d] = %g", i, w[i]);
    free(w);
    /* FLOPs: D = 128, not C/H = 80 */
    double per_layer = 2560.0 * (32 + 16) * 128 + 32 * 128 * 2560.0 + 3 * 2560.0 * 9728;
    double want = 6 * (36 * per_layer + 151936.0 * 2560) + 6.0 * 36 * 32 * 128 * 4096;
    QT_EXPECT(fabs(qt_model_flops_per_token(&L.cfg, 4096) - want) < 1e-9 * want, "flops %.6g, want %.6g",
              qt_model_flops_per_token(&L.cfg, 4096), want);
    qt_layout_free(&L);
}

static void test_cfg_validate(void) {
    char err[256];
    qt_model_cfg c = cfg_qwen();
    QT_EXPECT(qt_model_cfg_validate(&c, err, sizeof err) == 0, "valid config rejected: %s", err);
    c.num_heads = 14;
    c.num_kv_heads = 3;
    QT_EXPECT(qt_model_cfg_validate(&c, err, sizeof err) == -1, "H=14 Hkv=3 accepted");
    QT_EXPECT(!strcmp(err, "model.num_kv_heads: expected a divisor of num_heads (14), got 3"), "message: %s", err);
    c = cfg_qwen();
    c.head_dim = 7;
    QT_EXPECT(qt_model_cfg_validate(&c, err, sizeof err) == -1 && strstr(err, "model.head_dim") && strstr(err, "7"),
              "odd head_dim: %s", err);
    c = cfg_qwen();
    c.vocab_size = 0;
    qt_layout L;
    QT_EXPECT(qt_layout_init(&L, &c, err, sizeof err) == -1 && strstr(err, "model.vocab_size"), "vocab 0: %s", err);
    c = cfg_qwen();
    c.rope_theta = -1;
    QT_EXPECT(qt_model_cfg_validate(&c, err, sizeof err) == -1 && strstr(err, "model.rope_theta"), "theta: %s", err);
}

static void test_flops(void) {
    qt_model_cfg c = cfg_qwen(); /* C=24 H=6 Hkv=2 D=8 F=40 V=37 L=2 */
    double per_layer = 24.0 * 10 * 8 + 48 * 24 + 3 * 24 * 40, want = 6 * (2 * per_layer + 37 * 24) + 6.0 * 2 * 6 * 8 * 11;
    double got = qt_model_flops_per_token(&c, 11);
    QT_EXPECT(fabs(got - want) < 1e-6 * want, "flops %.1f, want %.1f", got, want);
    /* a window of 4 on layer 1 only: that layer's attention counts 4 - 16/22 keys per query, not 11/2 */
    c.sliding_window = 4;
    c.window_layers_from = 1;
    want += 12.0 * 6 * 8 * (4 - 16.0 / 22 - 5.5);
    got = qt_model_flops_per_token(&c, 11);
    QT_EXPECT(fabs(got - want) < 1e-6 * want, "windowed flops %.1f, want %.1f", got, want);
    qt_model_cfg causal = c;
    causal.sliding_window = 0;
    c.sliding_window = 11; /* a window as long as the sequence: the causal count */
    QT_EXPECT(qt_model_flops_per_token(&c, 11) == qt_model_flops_per_token(&causal, 11), "window = T differs from causal");
}

static void test_init_weights(void) {
    qt_model_cfg c = cfg_qwen();
    c.hidden_size = 96;
    c.intermediate_size = 200;
    char err[256];
    qt_layout L;
    QT_REQUIRE(qt_layout_init(&L, &c, err, sizeof err) == 0, "%s", err);
    float *a = malloc(L.numel * sizeof *a), *b = malloc(L.numel * sizeof *b);
    int saved = omp_get_max_threads();
    omp_set_num_threads(1);
    qt_layout_init_weights(&L, a, 7, 0.02f);
    omp_set_num_threads(2);
    for (size_t i = 0; i < L.numel; i++) b[i] = NAN;
    qt_layout_init_weights(&L, b, 7, 0.02f);
    omp_set_num_threads(saved);
    QT_EXPECT(memcmp(a, b, L.numel * sizeof *a) == 0, "init depends on the thread count");
    size_t end = 0;
    double s = 0, s2 = 0, n = 0;
    for (int t = 0; t < L.n_tensors; t++) {
        const qt_tensor *ts = &L.tensors[t];
        for (size_t i = end; i < ts->offset; i++) QT_EXPECT(a[i] == 0, "padding [%zu] = %g", i, a[i]);
        end = ts->offset + ts->numel;
        for (size_t i = ts->offset; i < end; i++) {
            if (ts->kind == QT_T_NORM || ts->kind == QT_T_FINAL_NORM) QT_EXPECT(a[i] == 1, "%s = %g", ts->name, a[i]);
            else if (ts->ndim == 1) QT_EXPECT(a[i] == 0, "%s = %g", ts->name, a[i]);
            else s += a[i], s2 += (double)a[i] * a[i], n++;
        }
    }
    for (size_t i = end; i < L.numel; i++) QT_EXPECT(a[i] == 0, "tail padding [%zu] = %g", i, a[i]);
    double mean = s / n, sd = sqrt(s2 / n - mean * mean);
    QT_EXPECT(fabs(mean) < 5e-4 && fabs(sd - 0.02) < 5e-4, "N(0, 0.02) drew mean %g sd %g over %.0f", mean, sd, n);
    qt_layout_init_weights(&L, b, 8, 0.02f);
    QT_EXPECT(memcmp(a, b, L.numel * sizeof *a) != 0, "seeds 7 and 8 agree");
    free(a);
    free(b);
    qt_layout_free(&L);
}

/* The data-parallel partition: buckets tile the padded array at layer boundaries, every bucket splits
 * into n equal pieces of multiples of 64, a rank's pieces sit back to back in its state, and a bucket
 * is reported final only once the backward has passed every layer in it. */
static void check_partition(const qt_layout *L, int n, int per_layer) {
    size_t q = 64 * (size_t)n, state_end[QT_SHARD_MAX_RANKS] = {0};
    int nl = L->cfg.num_layers;
    for (int r = 0; r < n; r++) {
        qt_shard sh;
        qt_shard_init(&sh, L, n, r, per_layer);
        QT_EXPECT(sh.total == L->numel && sh.total % q == 0 && sh.len * n == sh.total,
                  "n=%d: total %zu, len %zu for %zu parameters", n, sh.total, sh.len, L->numel);
        QT_EXPECT(sh.bucket[0] == 0 && sh.bucket[sh.n_buckets] == sh.total && sh.n_buckets <= QT_SHARD_MAX_BUCKETS,
                  "n=%d: %d buckets from %zu to %zu", n, sh.n_buckets, sh.bucket[0], sh.bucket[sh.n_buckets]);
        /* per layer: embeddings, the layers, the final norm with an untied head */
        int lo = per_layer ? (nl > QT_SHARD_MAX_BUCKETS - 2 ? QT_SHARD_MAX_BUCKETS / 2 : nl + 1) : 1;
        int hi = per_layer ? (nl > QT_SHARD_MAX_BUCKETS - 2 ? QT_SHARD_MAX_BUCKETS : nl + 2) : 1;
        QT_EXPECT(sh.n_buckets >= lo && sh.n_buckets <= hi, "n=%d per_layer=%d: %d buckets, expected %d..%d", n, per_layer,
                  sh.n_buckets, lo, hi);
        size_t next_state = 0;
        for (int b = 0; b < sh.n_buckets; b++) {
            size_t off, len, st;
            qt_shard_piece(&sh, b, &off, &len, &st);
            int unit = 0; /* every bucket starts at a unit */
            for (int u = 0; u < L->n_units; u++) unit |= L->unit_at[u] == sh.bucket[b];
            QT_EXPECT(unit && sh.bucket[b + 1] > sh.bucket[b] && (sh.bucket[b + 1] - sh.bucket[b]) % q == 0,
                      "n=%d bucket %d: [%zu, %zu)", n, b, sh.bucket[b], sh.bucket[b + 1]);
            QT_EXPECT(off == sh.bucket[b] + r * len && len * n == sh.bucket[b + 1] - sh.bucket[b] && len % 64 == 0 &&
                          st == next_state,
                      "n=%d rank %d bucket %d: piece [%zu, +%zu) at state %zu, expected state %zu", n, r, b, off, len, st,
                      next_state);
            QT_EXPECT(qt_shard_params(off, len, L->numel) == (off >= L->numel ? 0 : off + len > L->numel ? L->numel - off : len),
                      "params of the piece");
            next_state += len;
        }
        state_end[r] = next_state;
        /* no tensor straddles two buckets */
        for (int k = 0; k < L->n_tensors; k++) {
            const qt_tensor *t = &L->tensors[k];
            QT_EXPECT(qt_shard_needed(&sh, t->offset + 1) == qt_shard_needed(&sh, t->offset + t->numel),
                      "n=%d: %s at [%zu, +%zu) straddles a bucket bound", n, t->name, t->offset, t->numel);
        }
        /* after layer l's backward (every gradient from its first element up is final) */
        for (int l = 0; l < nl; l++) {
            int b = qt_shard_final_from(&sh, L->layers[l].ln1);
            QT_EXPECT(b == sh.n_buckets || sh.bucket[b] >= L->layers[l].ln1, "layer %d: bucket %d starts below it", l, b);
            QT_EXPECT(b == 0 || sh.bucket[b - 1] < L->layers[l].ln1, "layer %d: bucket %d held back", l, b - 1);
            if (per_layer && nl <= QT_SHARD_MAX_BUCKETS - 2)
                QT_EXPECT(b == l + 1, "layer %d done: buckets from %d final, expected %d", l, b, l + 1);
        }
        if (per_layer) /* the embeddings' bucket holds nothing else (summed before the layers' are final) */
            QT_EXPECT(sh.bucket[1] == L->layers[0].ln1, "n=%d: bucket 0 is [0, %zu), the embeddings [0, %zu)", n,
                      sh.bucket[1], L->layers[0].ln1);
        QT_EXPECT(qt_shard_final_from(&sh, 0) == 0 && qt_shard_final_from(&sh, sh.total + 1) == sh.n_buckets,
                  "the ends");
        /* before layer l's forward (every weight below its end is read next): exactly the buckets that
         * hold part of [0, end) are waited for */
        for (int l = -1; l <= nl; l++) {
            size_t end = l < 0 ? L->layers[0].ln1 : l < nl ? qt_layer_end(L, l) : L->numel;
            int k = qt_shard_needed(&sh, end);
            QT_EXPECT(k >= 1 && sh.bucket[k - 1] < end && (k == sh.n_buckets || sh.bucket[k] >= end),
                      "n=%d weights below %zu: buckets [0, %d) waited for", n, end, k);
            if (per_layer && nl <= QT_SHARD_MAX_BUCKETS - 2 && l >= 0 && l < nl - 1)
                QT_EXPECT(k == l + 2, "layer %d's forward waits for buckets [0, %d), expected [0, %d)", l, k, l + 2);
        }
        QT_EXPECT(qt_shard_needed(&sh, 0) == 0 && qt_shard_needed(&sh, SIZE_MAX) == sh.n_buckets, "the ends (needed)");
    }
    for (int r = 0; r < n; r++) QT_EXPECT(state_end[r] == state_end[0] && state_end[0] * n == L->numel, "state lengths");
}

/* The shards of layouts padded for n ranks (qt_layout_init_units): buckets at units' starts; a compact layout cut
 * for 2 ranks fails its check, naming the unit alignment. */
static void test_partition(void) {
    char err[256];
    qt_model_cfg tiny = {.arch = QT_ARCH_QWEN2, .vocab_size = 64, .hidden_size = 128, .num_layers = 2, .num_heads = 2,
                         .num_kv_heads = 1, .intermediate_size = 96, .max_seq_len = 64, .tie_embeddings = 1};
    qt_model_cfg q05 = {.arch = QT_ARCH_QWEN2, .vocab_size = 151936, .hidden_size = 896, .num_layers = 24,
                        .num_heads = 14, .num_kv_heads = 2, .intermediate_size = 4864, .max_seq_len = 32768,
                        .tie_embeddings = 1, .qkv_bias = 1};
    qt_model_cfg deep = tiny, small = tiny;
    deep.num_layers = 300; /* more layers than buckets: several per bucket */
    small.hidden_size = 8, small.num_heads = 1, small.intermediate_size = 8, small.tie_embeddings = 0;
    qt_model_cfg llama = cfg_llama();
    const qt_model_cfg *cs[5] = {&tiny, &q05, &deep, &small, &llama};
    for (int k = 0; k < 5; k++)
        for (int n = 1; n <= QT_SHARD_MAX_RANKS; n++) {
            qt_layout L;
            QT_REQUIRE(qt_layout_init_units(&L, cs[k], 64 * (size_t)n, err, sizeof err) == 0, "%s", err);
            for (int per_layer = 0; per_layer < 2; per_layer++) check_partition(&L, n, per_layer);
            qt_layout_free(&L);
        }
    qt_layout L;
    QT_REQUIRE(qt_layout_init(&L, &llama, err, sizeof err) == 0, "%s", err);
    qt_catch c;
    qt_catch_push(&c);
    if (setjmp(c.jb) == 0) {
        qt_shard sh;
        qt_shard_init(&sh, &L, 2, 0, 1);
        qt_catch_pop(&c);
        QT_EXPECT(0, "a compact layout cut for 2 ranks");
    } else {
        QT_EXPECT(strstr(c.msg, "not a multiple of 128") && strstr(c.msg, "unit alignment is 64"), "%s", c.msg);
    }
    qt_layout_free(&L);
}

/* Gemma-3-4B's text model: HF's parameter count, the four norms per layer under their HF names, initialised
 * to 0 (they scale by 1 + w), every 6th layer global. */
static void test_layout_gemma3_4b(void) {
    qt_model_cfg c = {.arch = QT_ARCH_GEMMA3, .vocab_size = 262208, .hidden_size = 2560, .num_layers = 34,
                      .num_heads = 8, .num_kv_heads = 4, .head_dim = 256, .intermediate_size = 10240,
                      .max_seq_len = 131072, .tie_embeddings = 1, .sliding_window = 1024, .window_pattern = 6,
                      .rope_local_theta = 10000.0f, .attn_scalar = 256.0f};
    char err[256];
    qt_layout L;
    QT_REQUIRE(qt_layout_init(&L, &c, err, sizeof err) == 0, "%s", err);
    QT_EXPECT(L.n_params == 3880263168u, "Gemma-3-4B's text model has 3880263168 parameters, got %zu", L.n_params);
    QT_EXPECT(L.n_tensors == 1 + 34 * 13 + 1 && L.cfg.qk_norm == 1 && L.cfg.rope_theta == 1e6f, "%d tensors, qk_norm %d",
              L.n_tensors, L.cfg.qk_norm);
    QT_EXPECT(qt_model_cfg_numel(&L.cfg) >= L.numel, "cfg_numel %llu < numel %zu",
              (unsigned long long)qt_model_cfg_numel(&L.cfg), L.numel);
    const char *norms[] = {"input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                           "post_feedforward_layernorm", "self_attn.q_norm"};
    size_t at[] = {L.layers[7].ln1, L.layers[7].post_attn, L.layers[7].ln2, L.layers[7].post_ffn, L.layers[7].qknorm};
    float *w = malloc(2560 * sizeof *w);
    for (int k = 0; k < 5; k++) {
        char name[96];
        snprintf(name, sizeof name, "model.layers.7.%s.weight", norms[k]);
        const qt_tensor *t = qt_layout_find(&L, name);
        QT_REQUIRE(t && t->offset == at[k] && t->offset < qt_layer_end(&L, 7) && !t->is_matrix, "%s", name);
        qt_layout_init_range(&L, t->offset, (size_t)t->numel, w, 7, 0.02f);
        for (size_t i = 0; i < t->numel; i++) QT_EXPECT(w[i] == 0.0f, "%s init [%zu] = %g", name, i, w[i]);
    }
    free(w);
    for (int l = 0; l < 34; l++) {
        int global = (l + 1) % 6 == 0;
        QT_EXPECT(qt_model_layer_window(&L.cfg, l) == (global ? 0 : 1024) && qt_model_layer_local(&L.cfg, l) == !global,
                  "layer %d: window %d", l, qt_model_layer_window(&L.cfg, l));
    }
    check_layout_shape(&L);
    /* the GPU model trains it, as the other families */
    QT_EXPECT(qt_model_gpu_check(&L.cfg, err, sizeof err) == 0, "gemma3 refused on the GPU: %s", err);
    qt_model_cfg qw = cfg_qwen3();
    QT_EXPECT(qt_model_gpu_check(&qw, err, sizeof err) == 0, "qwen3 refused on the GPU: %s", err);
    qt_layout_free(&L);
    /* Gemma's fields are gemma3's alone */
    qt_model_cfg q = cfg_qwen();
    q.window_pattern = 6;
    QT_EXPECT(qt_layout_init(&L, &q, err, sizeof err) == -1 && strstr(err, "model.window_pattern: expected 0 for qwen2"),
              "%s", err);
    q = cfg_qwen(), q.logit_softcap = 30.0f;
    QT_EXPECT(qt_layout_init(&L, &q, err, sizeof err) == -1 && strstr(err, "model.final_logit_softcapping"), "%s", err);
}

int main(void) {
    QT_RUN(test_layout_qwen05b);
    QT_RUN(test_layout_untied_llama);
    QT_RUN(test_layout_qwen3_4b);
    QT_RUN(test_partition);
    QT_RUN(test_cfg_validate);
    QT_RUN(test_flops);
    QT_RUN(test_init_weights);
    QT_RUN(test_fd_qwen2_gqa_bias_tied);
    QT_RUN(test_fd_llama_gqa_untied);
    QT_RUN(test_fd_rope_scaled);
    QT_RUN(test_rope_validate);
    QT_RUN(test_fd_qwen3_qknorm);
    QT_RUN(test_layout_gemma3_4b);
    QT_RUN(test_fd_gemma3);
    QT_RUN(test_loss_and_accumulation);
    QT_RUN(test_thread_determinism);
    QT_RUN(test_thread_determinism_gemma3);
    QT_RUN(test_tiny_cpu_speed);
    return qt_test_end();
}
