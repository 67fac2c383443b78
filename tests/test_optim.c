/* test_optim.c — AdamW against hand-computed and independent double values, schedules at chosen
 * steps against literal numbers, clip scale, and the deterministic gradient norm. */
#include "qt_optim.h"
#include "qt_rng.h"
#include "qt_test.h"

#include <omp.h>

/* Independent double AdamW (the textbook formula, written separately from src/ref/optim.c). */
static void adamw_ref(double *w, const double *g, double *m, double *v, int n, double lr, double b1,
                      double b2, double eps, double wd, int t, double scale) {
    for (int i = 0; i < n; i++) {
        double gi = g[i] * scale;
        m[i] = b1 * m[i] + (1 - b1) * gi;
        v[i] = b2 * v[i] + (1 - b2) * gi * gi;
        double mh = m[i] / (1 - pow(b1, t)), vh = v[i] / (1 - pow(b2, t));
        w[i] = w[i] - lr * (mh / (sqrt(vh) + eps) + wd * w[i]);
    }
}

/* With a constant gradient, m/(1-b1^t) == g and v/(1-b2^t) == g^2 at every t, so each step moves
 * w by lr * (sign(g) + wd * w) (eps is negligible). From w0 = 1, g = 0.5, lr = 0.1, wd = 0.1:
 *   w1 = 1 - 0.1 * (1 + 0.1)          = 0.89
 *   w2 = 0.89 - 0.1 * (1 + 0.089)     = 0.7811
 *   w3 = 0.7811 - 0.1 * (1 + 0.07811) = 0.673289
 * and without decay 0.9, 0.8, 0.7. */
static void test_adamw_hand_values(void) {
    qt_adamw_hp hp = {.lr = 0.1f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.1f};
    const double want_wd[3] = {0.89, 0.7811, 0.673289}, want_nowd[3] = {0.9, 0.8, 0.7};
    for (int decay = 0; decay < 2; decay++) {
        float w[2] = {1, -1}, g[2] = {0.5f, -0.5f}, m[2] = {0}, v[2] = {0};
        for (int t = 1; t <= 3; t++) {
            qt_adamw_cpu(w, g, m, v, 2, &hp, decay ? hp.weight_decay : 0, t, 1.0f);
            double want = decay ? want_wd[t - 1] : want_nowd[t - 1];
            QT_EXPECT(fabs(w[0] - want) < 2e-6, "decay %d t %d: w %.9g want %.9g", decay, t, w[0], want);
            QT_EXPECT(fabs(w[1] + want) < 2e-6, "decay %d t %d: -w %.9g want %.9g", decay, t, -w[1], want);
        }
    }
}

static void test_adamw_vs_double(void) {
    enum { N = 37 };
    qt_rng r;
    qt_rng_seed(&r, 11);
    for (int variant = 0; variant < 3; variant++) {
        /* variant 0: no decay, scale 1; 1: decay; 2: decay and grad_scale 1/8 with large grads */
        float wd = variant ? 0.05f : 0.0f, scale = variant == 2 ? 0.125f : 1.0f;
        qt_adamw_hp hp = {.lr = 3e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-6f, .weight_decay = wd};
        float w[N], m[N] = {0}, v[N] = {0}, g[N];
        double wr[N], mr[N] = {0}, vr[N] = {0}, gr[N];
        for (int i = 0; i < N; i++) wr[i] = w[i] = qt_rng_normal(&r);
        for (int t = 1; t <= 3; t++) {
            for (int i = 0; i < N; i++) {
                g[i] = qt_rng_normal(&r) * (variant == 2 ? 8.0f : 1.0f);
                gr[i] = g[i];
            }
            if (t == 2) g[3] = gr[3] = 0; /* a zero gradient after a nonzero one: m, v decay */
            qt_adamw_cpu(w, g, m, v, N, &hp, wd, t, scale);
            adamw_ref(wr, gr, mr, vr, N, hp.lr, hp.beta1, hp.beta2, hp.eps, wd, t, scale);
        }
        float wf[N], mf[N], vf[N];
        for (int i = 0; i < N; i++) { wf[i] = (float)wr[i]; mf[i] = (float)mr[i]; vf[i] = (float)vr[i]; }
        QT_EXPECT(qt_t_close("w", w, wf, N, 1e-6, 1e-5), "variant %d: w", variant);
        QT_EXPECT(qt_t_close("m", m, mf, N, 1e-7, 1e-5), "variant %d: m", variant);
        QT_EXPECT(qt_t_close("v", v, vf, N, 1e-9, 1e-5), "variant %d: v", variant);
    }
}

static float lr_at(qt_sched_kind k, int cooldown, long s) {
    qt_sched sc = {.kind = k, .lr = 1.0f, .final_lr_frac = 0.1f, .warmup = 10, .cooldown = cooldown, .steps = 110};
    return qt_sched_lr(&sc, s);
}

static void test_schedules(void) {
    struct { qt_sched_kind k; long s; double want; } c[] = {
        /* warmup: lr * (s+1) / 10 for every kind */
        {QT_SCHED_COSINE, 0, 0.1}, {QT_SCHED_COSINE, 4, 0.5}, {QT_SCHED_COSINE, 9, 1.0},
        {QT_SCHED_LINEAR, 0, 0.1}, {QT_SCHED_WSD, 9, 1.0},
        /* cosine: p = (s-10)/100; 0.1 + 0.9 * 0.5 * (1 + cos(pi p)) */
        {QT_SCHED_COSINE, 10, 1.0}, {QT_SCHED_COSINE, 60, 0.55}, {QT_SCHED_COSINE, 110, 0.1},
        {QT_SCHED_COSINE, 35, 0.1 + 0.45 * (1 + 0.70710678118654752)}, /* p = 1/4 -> 0.86819805 */
        {QT_SCHED_COSINE, 500, 0.1},
        /* linear: 1 - 0.9 p */
        {QT_SCHED_LINEAR, 10, 1.0}, {QT_SCHED_LINEAR, 60, 0.55}, {QT_SCHED_LINEAR, 85, 0.325},
        {QT_SCHED_LINEAR, 110, 0.1},
        /* wsd, cooldown 20: constant 1 until step 90, then 0.1 + 0.9 (1 - sqrt((s-90)/20)) */
        {QT_SCHED_WSD, 50, 1.0}, {QT_SCHED_WSD, 89, 1.0}, {QT_SCHED_WSD, 90, 1.0},
        {QT_SCHED_WSD, 95, 0.55}, /* q = 1/4, sqrt = 1/2 */
        {QT_SCHED_WSD, 99, 0.1 + 0.9 * (1 - 0.67082039324993691)}, /* q = 0.45 -> 0.39626165 */
        {QT_SCHED_WSD, 110, 0.1},
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        float got = lr_at(c[i].k, 20, c[i].s);
        QT_EXPECT(fabs(got - c[i].want) < 1e-6, "kind %d step %ld: got %.8g want %.8g", (int)c[i].k, c[i].s,
                  got, c[i].want);
    }
    /* No warmup: step 0 is the full rate. */
    qt_sched nw = {.kind = QT_SCHED_COSINE, .lr = 2e-3f, .final_lr_frac = 0, .warmup = 0, .steps = 100};
    QT_EXPECT(qt_sched_lr(&nw, 0) == 2e-3f, "no warmup: %g", qt_sched_lr(&nw, 0));
    QT_EXPECT(fabs(qt_sched_lr(&nw, 50) - 1e-3) < 1e-9, "no warmup midpoint: %g", qt_sched_lr(&nw, 50));
}

static void test_clip_scale(void) {
    QT_EXPECT(qt_clip_scale(10.0, 1.0f) == 0.1f, "10 -> %g", qt_clip_scale(10.0, 1.0f));
    QT_EXPECT(qt_clip_scale(4.0, 1.0f) == 0.25f, "4 -> %g", qt_clip_scale(4.0, 1.0f));
    QT_EXPECT(qt_clip_scale(0.5, 1.0f) == 1.0f, "below -> %g", qt_clip_scale(0.5, 1.0f));
    QT_EXPECT(qt_clip_scale(1.0, 1.0f) == 1.0f, "equal -> %g", qt_clip_scale(1.0, 1.0f));
    QT_EXPECT(qt_clip_scale(100.0, 0.0f) == 1.0f, "disabled -> %g", qt_clip_scale(100.0, 0.0f));
    QT_EXPECT(qt_clip_scale(0.0, 1.0f) == 1.0f, "zero norm -> %g", qt_clip_scale(0.0, 1.0f));
}

static void test_grad_norm(void) {
    /* An odd length over several blocks; values of mixed magnitude. */
    const size_t n = 3 * 8192 * 5 + 77;
    float *g = malloc(n * sizeof *g);
    QT_REQUIRE(g, "oom");
    qt_rng r;
    qt_rng_seed(&r, 5);
    double naive = 0;
    for (size_t i = 0; i < n; i++) {
        g[i] = qt_rng_normal(&r) * (i % 1000 == 0 ? 100.0f : 0.01f);
        naive += (double)g[i] * g[i];
    }
    naive = sqrt(naive);
    double got = qt_grad_norm_cpu(g, n);
    QT_EXPECT(fabs(got - naive) <= 1e-12 * naive, "norm %.17g naive %.17g", got, naive);
    /* Same bits whatever the thread count. */
    int nt = omp_get_max_threads();
    for (int t = 1; t <= 4; t++) {
        omp_set_num_threads(t);
        double again = qt_grad_norm_cpu(g, n);
        QT_EXPECT(again == got, "%d threads: %.17g vs %.17g", t, again, got);
    }
    omp_set_num_threads(nt);
    float three_four[2] = {3, 4};
    QT_EXPECT(qt_grad_norm_cpu(three_four, 2) == 5.0, "|(3,4)| = %g", qt_grad_norm_cpu(three_four, 2));
    QT_EXPECT(qt_grad_norm_cpu(g, 0) == 0.0, "empty norm");
    QT_EXPECT(qt_grad_norm_cpu(g, 1) == fabs((double)g[0]), "single");
    free(g);
}

int main(void) {
    QT_RUN(test_adamw_hand_values);
    QT_RUN(test_adamw_vs_double);
    QT_RUN(test_schedules);
    QT_RUN(test_clip_scale);
    QT_RUN(test_grad_norm);
    return qt_test_end();
}
