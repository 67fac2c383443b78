/* test_ops_gemma.c — the CPU reference ops Gemma 3 adds (qt_ref.h): GeGLU with the tanh GELU, RMSNorm with
 * (1 + w), the scaled embedding and its scale, the soft-capped cross-entropy. Each forward against a naive
 * double implementation of transformers' formula, each backward against finite differences, "=" outputs
 * poisoned first, "+=" outputs accumulating; and for each, the wrong formula a port could plausibly use
 * (erf GELU, plain w, no scale, no tanh derivative) shown to fail the same check. */
#include <stdint.h>

#include "fd_check.h"
#include "qt_ref.h"

/* The largest relative error of the analytic directional derivative <g, d> against the central difference of
 * f, over 4 random directions d (no assertion: the mutant checks want it large). */
static double fd_dir_err(obj_fn f, void *ctx, float *x, const float *g, long n) {
    const double eps = 1e-3;
    double worst = 0;
    float *x0 = copy(x, n);
    for (int k = 0; k < 4; k++) {
        float *d = rnd(n, 1);
        double ana = 0;
        for (long i = 0; i < n; i++) {
            x[i] = (float)(x0[i] + eps * d[i]);
            ana += g[i] * (((double)x[i] - (double)(float)(x0[i] - eps * d[i])) / (2 * eps));
        }
        double jp = f(ctx);
        for (long i = 0; i < n; i++) x[i] = (float)(x0[i] - eps * d[i]);
        double jm = f(ctx), num = (jp - jm) / (2 * eps);
        memcpy(x, x0, (size_t)n * sizeof *x);
        worst = fmax(worst, fabs(num - ana) / fmax(fabs(ana), 1e-12));
        free(d);
    }
    free(x0);
    return worst;
}

/* ---- GeGLU, tanh GELU (gelu_pytorch_tanh) ---- */

static double gelu_tanh_d(double x) { return 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))); }
static double gelu_erf_d(double x) { return 0.5 * x * (1 + erf(x / sqrt(2.0))); }

typedef struct { float *gu, *out, *u; long N; int F; } gg_ctx;
static double gg_obj(void *p) {
    gg_ctx *c = p;
    qt_ref_geglu_fwd(c->out, c->gu, c->N, c->F);
    return dotd(c->u, c->out, c->N * c->F);
}

static void test_geglu(void) {
    long N = 7;
    int F = 19;
    gg_ctx c = {rnd(N * 2 * F, 2), nans(N * F), rnd(N * F, 1), N, F};
    c.gu[0] = -3.0f, c.gu[1] = -2.0f, c.gu[2] = 0.7f, c.gu[3] = 9.0f, c.gu[4] = -9.0f; /* tails and the middle */
    gg_obj(&c);
    float *ref = malloc(N * F * sizeof *ref), *erfv = malloc(N * F * sizeof *erfv), *g = nans(N * 2 * F);
    for (long n = 0; n < N; n++)
        for (int f = 0; f < F; f++) {
            double x = c.gu[n * 2 * F + f], u = c.gu[n * 2 * F + F + f];
            ref[n * F + f] = (float)(gelu_tanh_d(x) * u);
            erfv[n * F + f] = (float)(gelu_erf_d(x) * u);
        }
    QT_EXPECT(qt_t_close("geglu", c.out, ref, N * F, 1e-6, 1e-5), "geglu forward against the tanh formula");
    /* torch.nn.functional.gelu(tensor([-3., -2.]), approximate="tanh") in fp32 */
    QT_EXPECT(fabs(c.out[0] / c.gu[F] - -0.0036374331) < 1e-8 && fabs(c.out[1] / c.gu[F + 1] - -0.045402288) < 2e-8,
              "gelu(-3) %.9g gelu(-2) %.9g: torch gives -0.0036374331, -0.045402288", c.out[0] / c.gu[F],
              c.out[1] / c.gu[F + 1]);
    printf("  (the erf GELU against the same bound:)\n");
    QT_EXPECT(!qt_t_close("geglu erf", erfv, ref, N * F, 1e-6, 1e-5), "the erf GELU passes the tanh GELU's check");
    qt_ref_geglu_bwd(g, c.u, c.gu, N, F);
    QT_EXPECT(all_finite(g, N * 2 * F), "dgu not fully written");
    fd_in in[] = {{c.gu, g, N * 2 * F, "gu"}};
    printf("  geglu: max rel err %.2e\n", fd_check("geglu", gg_obj, &c, in, 1));
    /* the SwiGLU backward is not GeGLU's: finite differences tell them apart */
    qt_ref_swiglu_bwd(g, c.u, c.gu, N, F);
    QT_EXPECT(fd_dir_err(gg_obj, &c, c.gu, g, N * 2 * F) > 0.05, "SwiGLU's gradient passes for GeGLU's");
    free(c.gu), free(c.out), free(c.u), free(ref), free(erfv), free(g);
}

/* ---- RMSNorm with (1 + w) (Gemma3RMSNorm) ---- */

typedef struct { float *x, *w, *y, *rstd, *u; long N; int C; float eps; } r1_ctx;
static double r1_obj(void *p) {
    r1_ctx *c = p;
    qt_ref_rmsnorm1p_fwd(c->y, c->rstd, c->x, c->w, c->N, c->C, c->eps);
    return dotd(c->u, c->y, c->N * c->C);
}

static void rmsnorm1p_case(long N, int C) {
    r1_ctx c = {rnd(N * C, 1), rnd(C, 0.3f), nans(N * C), nans(N), rnd(N * C, 1), N, C, 1e-6f};
    for (int i = 0; i < C; i++) c.x[i] += 3; /* a row with a large mean */
    r1_obj(&c);
    float *ref = malloc(N * C * sizeof *ref), *plain = nans(N * C), *pr = nans(N);
    for (long n = 0; n < N; n++) {
        double ss = 0;
        for (int i = 0; i < C; i++) ss += (double)c.x[n * C + i] * c.x[n * C + i];
        double r = 1 / sqrt(ss / C + c.eps);
        for (int i = 0; i < C; i++) ref[n * C + i] = (float)(c.x[n * C + i] * r * (1.0 + c.w[i]));
    }
    QT_EXPECT(qt_t_close("rmsnorm1p y", c.y, ref, N * C, 1e-6, 1e-5), "rmsnorm1p forward N=%ld C=%d", N, C);
    qt_ref_rmsnorm_fwd(plain, pr, c.x, c.w, N, C, c.eps);
    QT_EXPECT(!memcmp(pr, c.rstd, N * sizeof *pr), "rstd differs from plain RMSNorm's");
    printf("  (plain RMSNorm against the same bound:)\n");
    QT_EXPECT(!qt_t_close("rmsnorm plain", plain, ref, N * C, 1e-6, 1e-5), "x * rstd * w passes for (1 + w)");
    float *dx = zeros(N * C), *dw = zeros(C), *bx = rnd(N * C, 1), *bw = rnd(C, 1), *pdx = zeros(N * C), *pdw = zeros(C);
    float *ax = copy(bx, N * C), *aw = copy(bw, C);
    qt_ref_rmsnorm1p_bwd(dx, dw, c.u, c.x, c.w, c.rstd, N, C);
    qt_ref_rmsnorm1p_bwd(ax, aw, c.u, c.x, c.w, c.rstd, N, C);
    QT_EXPECT(accumulates("dx +=", ax, bx, dx, N * C) && accumulates("dw +=", aw, bw, dw, C), "rmsnorm1p_bwd +=");
    qt_ref_rmsnorm_bwd(pdx, pdw, c.u, c.x, c.w, c.rstd, N, C);
    QT_EXPECT(!memcmp(pdw, dw, C * sizeof *dw), "dw differs from plain RMSNorm's (d(1 + w)/dw = 1)");
    fd_in in[] = {{c.x, dx, N * C, "x"}, {c.w, dw, C, "w"}};
    double e = fd_check("rmsnorm1p", r1_obj, &c, in, 2);
    QT_EXPECT(fd_dir_err(r1_obj, &c, c.x, pdx, N * C) > 0.05, "plain RMSNorm's dx passes for (1 + w)");
    printf("  rmsnorm1p N=%ld C=%d: max rel err %.2e\n", N, C, e);
    free(c.x), free(c.w), free(c.y), free(c.rstd), free(c.u), free(ref), free(plain), free(pr);
    free(dx), free(dw), free(bx), free(bw), free(ax), free(aw), free(pdx), free(pdw);
}
static void test_rmsnorm1p(void) {
    rmsnorm1p_case(7, 24);
    rmsnorm1p_case(1, 37);
}

/* ---- scaled embedding (Gemma3TextScaledWordEmbedding) ---- */

/* torch.tensor(h ** 0.5) and its .to(torch.bfloat16), for Gemma 3 1B / 4B / 12B / 27B and two odd widths. */
static void test_embed_scale(void) {
    static const struct { int h; float f32, bf16; } T[] = {
        {1152, 33.941123962402344f, 34.0f}, {2560, 50.59644317626953f, 50.5f}, {3840, 61.967735290527344f, 62.0f},
        {5376, 73.32121276855469f, 73.5f},  {24, 4.898979663848877f, 4.90625f}, {37, 6.082762718200684f, 6.09375f}};
    for (size_t i = 0; i < sizeof T / sizeof T[0]; i++) {
        float a = qt_ref_embed_scale(T[i].h, 0), b = qt_ref_embed_scale(T[i].h, 1);
        QT_EXPECT(a == T[i].f32 && b == T[i].bf16, "hidden %d: scale %.9g / bf16 %.9g, torch gives %.9g / %.9g", T[i].h, a,
                  b, T[i].f32, T[i].bf16);
    }
}

typedef struct { float *wte, *out, *u; const int32_t *tok; long N; int C; float s; } se_ctx;
static double se_obj(void *p) {
    se_ctx *c = p;
    qt_ref_embedding_scaled_fwd(c->out, c->tok, c->wte, c->N, c->C, c->s);
    return dotd(c->u, c->out, c->N * c->C);
}

static void test_embedding_scaled(void) {
    int V = 5, C = 24;
    long N = 13;
    int32_t tok[13];
    for (long n = 0; n < N; n++) tok[n] = (int32_t)qt_rng_below(&R, V);
    tok[0] = tok[1] = 3;
    se_ctx c = {rnd(V * C, 1), nans(N * C), rnd(N * C, 1), tok, N, C, qt_ref_embed_scale(C, 1)};
    se_obj(&c);
    int exact = 1;
    for (long n = 0; n < N; n++)
        for (int i = 0; i < C; i++) exact &= c.out[n * C + i] == c.wte[tok[n] * C + i] * c.s;
    QT_EXPECT(exact, "out is not wte[tok] * %g", c.s);
    float *g = zeros(V * C), *base = rnd(V * C, 1), *acc = copy(base, V * C), *plain = zeros(V * C), *one = zeros(V * C);
    qt_ref_embedding_scaled_bwd(g, c.u, tok, N, C, V, c.s);
    qt_ref_embedding_scaled_bwd(acc, c.u, tok, N, C, V, c.s);
    QT_EXPECT(accumulates("dwte +=", acc, base, g, V * C), "embedding_scaled_bwd does not accumulate");
    qt_ref_embedding_bwd(plain, c.u, tok, N, C, V);
    qt_ref_embedding_scaled_bwd(one, c.u, tok, N, C, V, 1.0f);
    QT_EXPECT(!memcmp(plain, one, V * C * sizeof *one), "scale 1 is not the plain backward");
    fd_in in[] = {{c.wte, g, V * C, "wte"}};
    printf("  embedding scaled: max rel err %.2e\n", fd_check("embedding_scaled", se_obj, &c, in, 1));
    QT_EXPECT(fd_dir_err(se_obj, &c, c.wte, plain, V * C) > 0.05, "the unscaled gradient passes");
    free(c.wte), free(c.out), free(c.u), free(g), free(base), free(acc), free(plain), free(one);
}

/* ---- soft-capped cross-entropy (final_logit_softcapping) ---- */

typedef struct { float *logits, *loss; const int32_t *tgt; long N; int V; float scale, cap; } sc_ctx;
static double sc_obj(void *p) {
    sc_ctx *c = p;
    qt_ref_cross_entropy_capped_fwd(c->loss, c->logits, c->tgt, c->N, c->V, c->cap);
    double s = 0;
    for (long n = 0; n < c->N; n++) s += c->loss[n];
    return c->scale * s;
}

static void test_cross_entropy_capped(void) {
    long N = 7;
    int V = 50;
    int32_t tgt[7];
    for (long n = 0; n < N; n++) tgt[n] = (int32_t)qt_rng_below(&R, V);
    tgt[3] = -1;
    sc_ctx c = {rnd(N * V, 20), nans(N), tgt, N, V, 0.37f, 30.0f}; /* |logits| up to ~60: tanh saturates */
    c.logits[2 * V + tgt[2]] = 45;
    sc_obj(&c);
    float *plain = nans(N), *g = nans(N * V), *p0 = nans(N * V), *inplace;
    for (long n = 0; n < N; n++) {
        double z[50], m = -1e300, s = 0;
        for (int v = 0; v < V; v++) z[v] = 30.0 * tanh(c.logits[n * V + v] / 30.0), m = fmax(m, z[v]);
        for (int v = 0; v < V; v++) s += exp(z[v] - m);
        double want = tgt[n] < 0 ? 0 : m + log(s) - z[tgt[n]];
        QT_EXPECT(fabs(c.loss[n] - want) <= 1e-5 * fabs(want) + 1e-5, "row %ld: loss %.8g want %.8g", n, c.loss[n], want);
    }
    qt_ref_cross_entropy_fwd(plain, c.logits, tgt, N, V);
    QT_EXPECT(fabs(plain[2] - c.loss[2]) > 1e-2, "the cap changes nothing: %g vs %g", plain[2], c.loss[2]);
    qt_ref_cross_entropy_capped_fwd(plain, c.logits, tgt, N, V, 0.0f);
    qt_ref_cross_entropy_fwd(c.loss, c.logits, tgt, N, V);
    QT_EXPECT(!memcmp(plain, c.loss, N * sizeof *plain), "cap 0 is not the plain loss");
    qt_ref_cross_entropy_capped_bwd(g, c.logits, tgt, N, V, c.scale, c.cap);
    inplace = copy(c.logits, N * V);
    qt_ref_cross_entropy_capped_bwd(inplace, inplace, tgt, N, V, c.scale, c.cap);
    QT_EXPECT(all_finite(g, N * V) && !memcmp(g, inplace, N * V * sizeof *g), "dlogits not written, or in place differs");
    for (int v = 0; v < V; v++) QT_EXPECT(g[3 * V + v] == 0, "ignored row has gradient %g", g[3 * V + v]);
    fd_in in[] = {{c.logits, g, N * V, "logits"}};
    printf("  cross-entropy capped: max rel err %.2e\n", fd_check("cross_entropy_capped", sc_obj, &c, in, 1));
    /* the softmax gradient of the capped logits without the tanh derivative */
    float *z = copy(c.logits, N * V);
    for (long i = 0; i < N * V; i++) z[i] = c.cap * tanhf(z[i] / c.cap);
    qt_ref_cross_entropy_bwd(p0, z, tgt, N, V, c.scale);
    double me = fd_dir_err(sc_obj, &c, c.logits, p0, N * V);
    QT_EXPECT(me > 0.05, "dlogits without 1 - tanh^2 pass (rel err %.3g)", me);
    free(c.logits), free(c.loss), free(plain), free(g), free(p0), free(inplace), free(z);
}

int main(void) {
    qt_rng_seed(&R, 4321);
    QT_RUN(test_geglu);
    QT_RUN(test_rmsnorm1p);
    QT_RUN(test_embed_scale);
    QT_RUN(test_embedding_scaled);
    QT_RUN(test_cross_entropy_capped);
    return qt_test_end();
}
