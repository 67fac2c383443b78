/* test_ops.c — the CPU reference ops: each backward against central finite differences of <u, f(x)>
 * (random directions and single coordinates), each forward against a naive double implementation,
 * "=" outputs fully written (poisoned with NaN first), "+=" outputs accumulating, odd shapes. */
#include <stdint.h>

#include "qt_ref.h"
#include "qt_rng.h"
#include "qt_test.h"

static qt_rng R;

static float *rnd(long n, float s) {
    float *p = malloc((size_t)(n ? n : 1) * sizeof *p);
    for (long i = 0; i < n; i++) p[i] = s * qt_rng_normal(&R);
    return p;
}
static float *nans(long n) {
    float *p = malloc((size_t)(n ? n : 1) * sizeof *p);
    for (long i = 0; i < n; i++) p[i] = NAN;
    return p;
}
static float *zeros(long n) { return calloc((size_t)(n ? n : 1), sizeof(float)); }
static float *copy(const float *x, long n) {
    float *p = malloc((size_t)(n ? n : 1) * sizeof *p);
    memcpy(p, x, (size_t)n * sizeof *p);
    return p;
}
static double dotd(const float *a, const float *b, long n) {
    double s = 0;
    for (long i = 0; i < n; i++) s += (double)a[i] * b[i];
    return s;
}
static int all_finite(const float *p, long n) {
    for (long i = 0; i < n; i++)
        if (!isfinite(p[i])) return 0;
    return 1;
}

/* ---- finite differences ---- */

typedef double (*obj_fn)(void *ctx); /* <u, f(current inputs)> in double */
typedef struct {
    float *x;        /* the input, perturbed in place and restored */
    const float *g;  /* the analytic gradient of the objective w.r.t. x */
    long n;
    const char *name;
} fd_in;

/* Checks every input along 3 random directions (rel 1e-2) and at 3 coordinates (the largest-|g| of
 * a sample, and two random ones). Returns the largest relative error seen on directions. */
static double fd_check(const char *op, obj_fn f, void *ctx, fd_in *in, int nin) {
    const double eps = 1e-3, tol = 1e-2;
    double worst = 0;
    for (int k = 0; k < nin; k++) {
        fd_in *p = &in[k];
        float *x0 = copy(p->x, p->n);
        double rms = sqrt(dotd(p->g, p->g, p->n) / p->n);
        for (int dir = 0; dir < 3; dir++) {
            float *d = rnd(p->n, 1);
            for (long i = 0; i < p->n; i++) p->x[i] = (float)(x0[i] + eps * d[i]);
            double jp = f(ctx);
            for (long i = 0; i < p->n; i++) p->x[i] = (float)(x0[i] - eps * d[i]);
            double jm = f(ctx);
            memcpy(p->x, x0, (size_t)p->n * sizeof *x0);
            /* the perturbation actually applied, after rounding x0 +- eps d to fp32 */
            double ana = 0;
            for (long i = 0; i < p->n; i++) ana += p->g[i] * (((double)(float)(x0[i] + eps * d[i]) -
                                                              (double)(float)(x0[i] - eps * d[i])) / (2 * eps));
            double num = (jp - jm) / (2 * eps), rel = fabs(num - ana) / fmax(fabs(ana), 1e-12);
            worst = fmax(worst, rel);
            QT_EXPECT(fabs(num - ana) <= tol * fabs(ana) + 1e-6 * sqrt((double)p->n) * rms,
                      "%s d/d%s direction %d: analytic %.7g numeric %.7g", op, p->name, dir, ana, num);
            free(d);
        }
        long best = (long)qt_rng_below(&R, p->n);
        for (int s = 0; s < 8; s++) {
            long i = (long)qt_rng_below(&R, p->n);
            if (fabsf(p->g[i]) > fabsf(p->g[best])) best = i;
        }
        long pick[3] = {best, (long)qt_rng_below(&R, p->n), (long)qt_rng_below(&R, p->n)};
        for (int c = 0; c < 3; c++) {
            long i = pick[c];
            float hp = (float)(x0[i] + eps), hm = (float)(x0[i] - eps);
            p->x[i] = hp;
            double jp = f(ctx);
            p->x[i] = hm;
            double jm = f(ctx);
            p->x[i] = x0[i];
            double num = (jp - jm) / ((double)hp - hm), ana = p->g[i];
            QT_EXPECT(fabs(num - ana) <= tol * fabs(ana) + 2e-3 * rms, "%s d/d%s[%ld]: analytic %.7g numeric %.7g",
                      op, p->name, i, ana, num);
        }
        free(x0);
    }
    return worst;
}

/* "+=": out(base) - base must equal out(0) */
static int accumulates(const char *what, const float *from_base, const float *base, const float *from_zero, long n) {
    float *diff = malloc((size_t)n * sizeof *diff);
    for (long i = 0; i < n; i++) diff[i] = from_base[i] - base[i];
    int ok = qt_t_close(what, diff, from_zero, n, 1e-5, 1e-5);
    free(diff);
    return ok;
}

/* ---- embedding ---- */

typedef struct { float *wte, *out, *u; const int32_t *tok; long N; int C; } emb_ctx;
static double emb_obj(void *p) {
    emb_ctx *c = p;
    qt_ref_embedding_fwd(c->out, c->tok, c->wte, c->N, c->C);
    return dotd(c->u, c->out, c->N * c->C);
}

static void test_embedding(void) {
    int V = 5, C = 24;
    long N = 13; /* more rows than vocab: repeated tokens sum */
    int32_t tok[13];
    for (long n = 0; n < N; n++) tok[n] = (int32_t)qt_rng_below(&R, V);
    tok[0] = tok[1] = 3;
    emb_ctx c = {rnd(V * C, 1), nans(N * C), rnd(N * C, 1), tok, N, C};
    emb_obj(&c);
    for (long n = 0; n < N; n++)
        QT_EXPECT(!memcmp(c.out + n * C, c.wte + tok[n] * C, C * sizeof(float)), "row %ld is not wte[%d]", n, tok[n]);
    float *g = zeros(V * C), *base = rnd(V * C, 1), *acc = copy(base, V * C);
    qt_ref_embedding_bwd(g, c.u, tok, N, C, V);
    qt_ref_embedding_bwd(acc, c.u, tok, N, C, V);
    QT_EXPECT(accumulates("dwte +=", acc, base, g, V * C), "embedding_bwd does not accumulate");
    fd_in in[] = {{c.wte, g, V * C, "wte"}};
    double e = fd_check("embedding", emb_obj, &c, in, 1);
    printf("  embedding: max rel err %.2e\n", e);
    free(c.wte), free(c.out), free(c.u), free(g), free(base), free(acc);
}

/* ---- rmsnorm ---- */

typedef struct { float *x, *w, *y, *rstd, *u; long N; int C; float eps; } rms_ctx;
static double rms_obj(void *p) {
    rms_ctx *c = p;
    qt_ref_rmsnorm_fwd(c->y, c->rstd, c->x, c->w, c->N, c->C, c->eps);
    return dotd(c->u, c->y, c->N * c->C);
}

static void rmsnorm_case(long N, int C) {
    rms_ctx c = {rnd(N * C, 1), rnd(C, 1), nans(N * C), nans(N), rnd(N * C, 1), N, C, 1e-5f};
    for (int i = 0; i < C; i++) c.x[i] += 3; /* a row with a large mean */
    rms_obj(&c);
    float *ref = malloc(N * C * sizeof *ref), *rref = malloc(N * sizeof *rref);
    for (long n = 0; n < N; n++) {
        double ss = 0;
        for (int i = 0; i < C; i++) ss += (double)c.x[n * C + i] * c.x[n * C + i];
        double r = 1 / sqrt(ss / C + c.eps);
        rref[n] = (float)r;
        for (int i = 0; i < C; i++) ref[n * C + i] = (float)(c.x[n * C + i] * r * c.w[i]);
    }
    QT_EXPECT(qt_t_close("rmsnorm y", c.y, ref, N * C, 1e-6, 1e-5) && qt_t_close("rstd", c.rstd, rref, N, 0, 1e-6),
              "rmsnorm forward N=%ld C=%d", N, C);
    float *dx = zeros(N * C), *dw = zeros(C), *bx = rnd(N * C, 1), *bw = rnd(C, 1);
    float *ax = copy(bx, N * C), *aw = copy(bw, C);
    qt_ref_rmsnorm_bwd(dx, dw, c.u, c.x, c.w, c.rstd, N, C);
    qt_ref_rmsnorm_bwd(ax, aw, c.u, c.x, c.w, c.rstd, N, C);
    QT_EXPECT(accumulates("dx +=", ax, bx, dx, N * C) && accumulates("dw +=", aw, bw, dw, C), "rmsnorm_bwd +=");
    fd_in in[] = {{c.x, dx, N * C, "x"}, {c.w, dw, C, "w"}};
    double e = fd_check("rmsnorm", rms_obj, &c, in, 2);
    printf("  rmsnorm N=%ld C=%d: max rel err %.2e\n", N, C, e);
    free(c.x), free(c.w), free(c.y), free(c.rstd), free(c.u), free(ref), free(rref);
    free(dx), free(dw), free(bx), free(bw), free(ax), free(aw);
}
static void test_rmsnorm(void) {
    rmsnorm_case(7, 24);
    rmsnorm_case(1, 37);
}

/* ---- q/k norm: per-head RMSNorm of the q and k heads of qkv rows; v passes through ---- */

typedef struct { float *x, *w, *y, *rstd, *u; long N; int H, Hkv, D; float eps; } qkn_ctx;
static double qkn_obj(void *p) {
    qkn_ctx *c = p;
    qt_ref_qknorm_fwd(c->y, c->rstd, c->x, c->w, c->N, c->H, c->Hkv, c->D, c->eps);
    return dotd(c->u, c->y, c->N * (c->H + 2 * c->Hkv) * c->D);
}

static void qknorm_case(long N, int H, int Hkv, int D) {
    int QKV = (H + 2 * Hkv) * D, NH = H + Hkv;
    long n_all = N * QKV;
    qkn_ctx c = {rnd(n_all, 1), rnd(2 * D, 1), nans(n_all), nans(N * NH), rnd(n_all, 1), N, H, Hkv, D, 1e-6f};
    for (int i = 0; i < D; i++) c.x[H * D + i] += 3; /* a k head with a large mean */
    qkn_obj(&c);
    float *ref = malloc(n_all * sizeof *ref), *rref = malloc(N * NH * sizeof *rref);
    for (long n = 0; n < N; n++)
        for (int h = 0; h < H + 2 * Hkv; h++) {
            const float *xh = c.x + n * QKV + (long)h * D;
            double ss = 0;
            for (int i = 0; i < D; i++) ss += (double)xh[i] * xh[i];
            double r = h < NH ? 1 / sqrt(ss / D + c.eps) : 1;
            if (h < NH) rref[n * NH + h] = (float)r;
            for (int i = 0; i < D; i++)
                ref[n * QKV + (long)h * D + i] = h < NH ? (float)(xh[i] * r * c.w[(h < H ? 0 : D) + i]) : xh[i];
        }
    QT_EXPECT(qt_t_close("qknorm y", c.y, ref, n_all, 1e-6, 1e-5) && qt_t_close("rstd", c.rstd, rref, N * NH, 0, 1e-6),
              "qknorm forward N=%ld H=%d Hkv=%d D=%d", N, H, Hkv, D);
    float *inpl = copy(c.x, n_all), *rs2 = nans(N * NH); /* in place: the same bits */
    qt_ref_qknorm_fwd(inpl, rs2, inpl, c.w, N, H, Hkv, D, c.eps);
    QT_EXPECT(!memcmp(inpl, c.y, n_all * sizeof *inpl), "qknorm forward in place differs");
    float *dx = nans(n_all), *dw = zeros(2 * D), *bw = rnd(2 * D, 1), *aw = copy(bw, 2 * D), *dxa = copy(c.u, n_all);
    qt_ref_qknorm_bwd(dx, dw, c.u, c.x, c.w, c.rstd, N, H, Hkv, D);
    QT_EXPECT(all_finite(dx, n_all), "qknorm dx not fully written");
    qt_ref_qknorm_bwd(dxa, aw, dxa, c.x, c.w, c.rstd, N, H, Hkv, D); /* in place over dy */
    QT_EXPECT(!memcmp(dxa, dx, n_all * sizeof *dx), "qknorm backward in place differs");
    QT_EXPECT(accumulates("dw +=", aw, bw, dw, 2 * D), "qknorm_bwd dw +=");
    fd_in in[] = {{c.x, dx, n_all, "x"}, {c.w, dw, 2 * D, "w"}};
    double e = fd_check("qknorm", qkn_obj, &c, in, 2);
    printf("  qknorm N=%ld H=%d Hkv=%d D=%d: max rel err %.2e\n", N, H, Hkv, D, e);
    free(c.x), free(c.w), free(c.y), free(c.rstd), free(c.u), free(ref), free(rref), free(inpl), free(rs2);
    free(dx), free(dw), free(bw), free(aw), free(dxa);
}
static void test_qknorm(void) {
    qknorm_case(5, 6, 2, 8);
    qknorm_case(1, 2, 2, 6);
    qknorm_case(3, 4, 1, 34);
}

/* ---- matmul ---- */

typedef struct { float *x, *w, *b, *y, *u; long N; int I, O; } mm_ctx;
static double mm_obj(void *p) {
    mm_ctx *c = p;
    qt_ref_matmul_fwd(c->y, c->x, c->w, c->b, c->N, c->I, c->O);
    return dotd(c->u, c->y, c->N * c->O);
}

static void matmul_case(long N, int I, int O, int bias) {
    mm_ctx c = {rnd(N * I, 1), rnd((long)O * I, 1), bias ? rnd(O, 1) : NULL, nans(N * O), rnd(N * O, 1), N, I, O};
    mm_obj(&c);
    float *ref = malloc(N * O * sizeof *ref);
    for (long n = 0; n < N; n++)
        for (int o = 0; o < O; o++) {
            double s = bias ? c.b[o] : 0;
            for (int i = 0; i < I; i++) s += (double)c.x[n * I + i] * c.w[(long)o * I + i];
            ref[n * O + o] = (float)s;
        }
    QT_EXPECT(qt_t_close("matmul y", c.y, ref, N * O, 1e-5, 1e-5), "matmul forward N=%ld I=%d O=%d", N, I, O);
    float *dx = nans(N * I), *dw = zeros((long)O * I), *db = zeros(O);
    float *bw = rnd((long)O * I, 1), *bb = rnd(O, 1), *aw = copy(bw, (long)O * I), *ab = copy(bb, O);
    qt_ref_matmul_bwd(dx, dw, bias ? db : NULL, c.u, c.x, c.w, N, I, O);
    QT_EXPECT(all_finite(dx, N * I), "dx not fully written");
    qt_ref_matmul_bwd(NULL, aw, bias ? ab : NULL, c.u, c.x, c.w, N, I, O);
    QT_EXPECT(accumulates("dw +=", aw, bw, dw, (long)O * I), "matmul dw +=");
    if (bias) QT_EXPECT(accumulates("db +=", ab, bb, db, O), "matmul db +=");
    fd_in in[] = {{c.x, dx, N * I, "x"}, {c.w, dw, (long)O * I, "w"}, {c.b, db, O, "b"}};
    double e = fd_check("matmul", mm_obj, &c, in, bias ? 3 : 2);
    printf("  matmul N=%ld I=%d O=%d%s: max rel err %.2e\n", N, I, O, bias ? " +bias" : "", e);
    free(c.x), free(c.w), free(c.b), free(c.y), free(c.u), free(ref);
    free(dx), free(dw), free(db), free(bw), free(bb), free(aw), free(ab);
}
static void test_matmul(void) {
    matmul_case(13, 24, 35, 1); /* full vector tiles and edges in all three products */
    matmul_case(1, 24, 19, 0);
    matmul_case(7, 5, 3, 1);
}

/* Larger shapes against double: the tiled kernel's edges in both directions. */
static void test_matmul_forward_large(void) {
    long N = 45;
    int I = 130, O = 83;
    float *x = rnd(N * I, 1), *w = rnd((long)O * I, 1), *y = nans(N * O), *ref = malloc(N * O * sizeof *ref);
    qt_ref_matmul_fwd(y, x, w, NULL, N, I, O);
    for (long n = 0; n < N; n++)
        for (int o = 0; o < O; o++) ref[n * O + o] = (float)dotd(x + n * I, w + (long)o * I, I);
    QT_EXPECT(qt_t_close("matmul y", y, ref, N * O, 1e-4, 1e-5), "matmul forward 45x130x83");
    free(x), free(w), free(y), free(ref);
}

/* ---- rope ---- */

typedef struct { float *x, *y, *u; int B, T, H, Hkv, D; float theta; } rope_ctx;
static double rope_obj(void *p) {
    rope_ctx *c = p;
    long n = (long)c->B * c->T * (c->H + 2 * c->Hkv) * c->D;
    memcpy(c->y, c->x, n * sizeof(float));
    qt_ref_rope_fwd(c->y, c->B, c->T, c->H, c->Hkv, c->D, c->theta);
    return dotd(c->u, c->y, n);
}

static void test_rope_hand(void) {
    /* H=1, Hkv=1, D=4, theta=100: angles at position t are t*1 and t*100^(-1/2) = t/10 */
    float qkv[3 * 12];
    for (int i = 0; i < 36; i++) qkv[i] = (float)(i % 12 + 1);
    qt_ref_rope_fwd(qkv, 1, 3, 1, 1, 4, 100.0f);
    const float *t0 = qkv, *t2 = qkv + 24;
    for (int i = 0; i < 12; i++) QT_EXPECT(t0[i] == (float)(i + 1), "position 0 must not rotate: [%d] = %g", i, t0[i]);
    double c2 = cos(2.0), s2 = sin(2.0), c02 = cos(0.2), s02 = sin(0.2);
    float want[12] = {(float)(1 * c2 - 3 * s2), (float)(2 * c02 - 4 * s02), (float)(3 * c2 + 1 * s2),
                      (float)(4 * c02 + 2 * s02), (float)(5 * c2 - 7 * s2), (float)(6 * c02 - 8 * s02),
                      (float)(7 * c2 + 5 * s2), (float)(8 * c02 + 6 * s02), 9, 10, 11, 12};
    QT_EXPECT(qt_t_close("rope t=2", t2, want, 12, 1e-6, 1e-6), "rotate-half at t=2 (q, k rotated; v untouched)");
}

static void rope_case(int B, int T, int H, int Hkv, int D) {
    long n = (long)B * T * (H + 2 * Hkv) * D;
    rope_ctx c = {rnd(n, 1), malloc(n * sizeof(float)), rnd(n, 1), B, T, H, Hkv, D, 10000.0f};
    float *g = copy(c.u, n);
    qt_ref_rope_bwd(g, B, T, H, Hkv, D, c.theta);
    /* the rotation is orthogonal: the backward of the forward is the identity */
    float *x2 = copy(c.x, n);
    qt_ref_rope_fwd(x2, B, T, H, Hkv, D, c.theta);
    qt_ref_rope_bwd(x2, B, T, H, Hkv, D, c.theta);
    QT_EXPECT(qt_t_close("bwd(fwd(x))", x2, c.x, n, 1e-5, 1e-5), "rope bwd is not the inverse");
    fd_in in[] = {{c.x, g, n, "qkv"}};
    double e = fd_check("rope", rope_obj, &c, in, 1);
    printf("  rope B=%d T=%d H=%d Hkv=%d D=%d: max rel err %.2e\n", B, T, H, Hkv, D, e);
    free(c.x), free(c.y), free(c.u), free(g), free(x2);
}
static void test_rope(void) {
    rope_case(2, 7, 6, 2, 8);
    rope_case(1, 1, 2, 1, 16);
}

/* ---- attention ---- */

/* Naive double attention with the explicit GQA mapping, for out and lse. */
static void attn_naive(float *out, float *lse, const float *qkv, int B, int T, int H, int Hkv, int D) {
    long row = (long)(H + 2 * Hkv) * D;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            int g = h / (H / Hkv);
            for (int t = 0; t < T; t++) {
                const float *q = qkv + ((long)b * T + t) * row + h * D;
                double s[64], m = -1e300, z = 0;
                for (int j = 0; j <= t; j++) {
                    s[j] = dotd(q, qkv + ((long)b * T + j) * row + (H + g) * D, D) / sqrt((double)D);
                    m = fmax(m, s[j]);
                }
                for (int j = 0; j <= t; j++) z += exp(s[j] - m);
                for (int i = 0; i < D; i++) {
                    double o = 0;
                    for (int j = 0; j <= t; j++) o += exp(s[j] - m) / z * qkv[((long)b * T + j) * row + (H + Hkv + g) * D + i];
                    out[((long)b * T + t) * H * D + h * D + i] = (float)o;
                }
                lse[((long)b * H + h) * T + t] = (float)(m + log(z));
            }
        }
}

typedef struct { float *qkv, *out, *lse, *u; int B, T, H, Hkv, D; } att_ctx;
static double att_obj(void *p) {
    att_ctx *c = p;
    qt_ref_attention_fwd(c->out, c->lse, c->qkv, c->B, c->T, c->H, c->Hkv, c->D);
    return dotd(c->u, c->out, (long)c->B * c->T * c->H * c->D);
}

static void attention_case(int B, int T, int H, int Hkv, int D) {
    long nq = (long)B * T * (H + 2 * Hkv) * D, no = (long)B * T * H * D, nl = (long)B * H * T;
    att_ctx c = {rnd(nq, 1), nans(no), nans(nl), rnd(no, 1), B, T, H, Hkv, D};
    att_obj(&c);
    float *ref = malloc(no * sizeof *ref), *lref = malloc(nl * sizeof *lref);
    attn_naive(ref, lref, c.qkv, B, T, H, Hkv, D);
    QT_EXPECT(qt_t_close("attention out", c.out, ref, no, 1e-6, 1e-5) && qt_t_close("lse", c.lse, lref, nl, 1e-6, 1e-6),
              "attention forward B=%d T=%d H=%d Hkv=%d D=%d", B, T, H, Hkv, D);
    float *g = nans(nq);
    qt_ref_attention_bwd(g, c.u, c.qkv, c.out, c.lse, B, T, H, Hkv, D);
    QT_EXPECT(all_finite(g, nq), "dqkv not fully written");
    fd_in in[] = {{c.qkv, g, nq, "qkv"}};
    double e = fd_check("attention", att_obj, &c, in, 1);
    printf("  attention B=%d T=%d H=%d Hkv=%d D=%d: max rel err %.2e\n", B, T, H, Hkv, D, e);
    free(c.qkv), free(c.out), free(c.lse), free(c.u), free(ref), free(lref), free(g);
}
static void test_attention(void) {
    attention_case(2, 7, 6, 2, 8);
    attention_case(1, 7, 6, 3, 16);
    attention_case(2, 1, 4, 4, 8);
    attention_case(1, 13, 2, 1, 8);
}

/* The output at t does not depend on tokens after t; query head h only reads kv head h/(H/Hkv). */
static void test_attention_causal_gqa(void) {
    int B = 2, T = 9, H = 6, Hkv = 3, D = 8, t0 = 4;
    long row = (long)(H + 2 * Hkv) * D, no = (long)B * T * H * D;
    float *qkv = rnd(B * T * row, 1), *o1 = nans(no), *o2 = nans(no), *l1 = nans(B * H * T), *l2 = nans(B * H * T);
    qt_ref_attention_fwd(o1, l1, qkv, B, T, H, Hkv, D);
    for (int b = 0; b < B; b++)
        for (long i = (long)(b * T + t0 + 1) * row; i < (long)(b + 1) * T * row; i++) qkv[i] = 5 * qt_rng_normal(&R);
    qt_ref_attention_fwd(o2, l2, qkv, B, T, H, Hkv, D);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            int same = !memcmp(o1 + ((long)b * T + t) * H * D, o2 + ((long)b * T + t) * H * D, H * D * sizeof(float));
            QT_EXPECT(same == (t <= t0), "b=%d t=%d: output %s after changing tokens > %d", b, t,
                      same ? "unchanged" : "changed", t0);
        }
    /* change kv head 1's keys and values only: heads 2 and 3 (group 1) change, the others do not */
    for (long bt = 0; bt < (long)B * T; bt++)
        for (int i = 0; i < D; i++) {
            qkv[bt * row + (H + 1) * D + i] += 1;
            qkv[bt * row + (H + Hkv + 1) * D + i] += 1;
        }
    qt_ref_attention_fwd(o1, l1, qkv, B, T, H, Hkv, D);
    for (int h = 0; h < H; h++) {
        int changed = 0;
        for (long bt = 0; bt < (long)B * T; bt++)
            changed |= memcmp(o1 + bt * H * D + h * D, o2 + bt * H * D + h * D, D * sizeof(float)) != 0;
        QT_EXPECT(changed == (h / (H / Hkv) == 1), "head %d %s when kv head 1 changed", h, changed ? "changed" : "did not change");
    }
    free(qkv), free(o1), free(o2), free(l1), free(l2);
}

/* ---- swiglu ---- */

typedef struct { float *gu, *out, *u; long N; int F; } sw_ctx;
static double sw_obj(void *p) {
    sw_ctx *c = p;
    qt_ref_swiglu_fwd(c->out, c->gu, c->N, c->F);
    return dotd(c->u, c->out, c->N * c->F);
}

static void test_swiglu(void) {
    long N = 7;
    int F = 19;
    sw_ctx c = {rnd(N * 2 * F, 2), nans(N * F), rnd(N * F, 1), N, F};
    sw_obj(&c);
    float *ref = malloc(N * F * sizeof *ref), *g = nans(N * 2 * F);
    for (long n = 0; n < N; n++)
        for (int f = 0; f < F; f++) {
            double x = c.gu[n * 2 * F + f];
            ref[n * F + f] = (float)(x / (1 + exp(-x)) * c.gu[n * 2 * F + F + f]);
        }
    QT_EXPECT(qt_t_close("swiglu", c.out, ref, N * F, 1e-6, 1e-5), "swiglu forward");
    qt_ref_swiglu_bwd(g, c.u, c.gu, N, F);
    QT_EXPECT(all_finite(g, N * 2 * F), "dgu not fully written");
    fd_in in[] = {{c.gu, g, N * 2 * F, "gu"}};
    printf("  swiglu: max rel err %.2e\n", fd_check("swiglu", sw_obj, &c, in, 1));
    free(c.gu), free(c.out), free(c.u), free(ref), free(g);
}

/* ---- cross-entropy ---- */

typedef struct { float *logits, *loss; const int32_t *tgt; long N; int V; float scale; } ce_ctx;
static double ce_obj(void *p) {
    ce_ctx *c = p;
    qt_ref_cross_entropy_fwd(c->loss, c->logits, c->tgt, c->N, c->V);
    double s = 0;
    for (long n = 0; n < c->N; n++) s += c->loss[n];
    return c->scale * s;
}

static void test_cross_entropy(void) {
    long N = 7;
    int V = 50;
    int32_t tgt[7];
    for (long n = 0; n < N; n++) tgt[n] = (int32_t)qt_rng_below(&R, V);
    tgt[3] = -1;
    tgt[6] = V - 1;
    ce_ctx c = {rnd(N * V, 3), nans(N), tgt, N, V, 0.37f};
    c.logits[2 * V + 5] = 80; /* a dominant logit: the max shift must keep exp finite */
    ce_obj(&c);
    for (long n = 0; n < N; n++) {
        double m = -1e300, z = 0;
        for (int v = 0; v < V; v++) m = fmax(m, c.logits[n * V + v]);
        for (int v = 0; v < V; v++) z += exp(c.logits[n * V + v] - m);
        double want = tgt[n] < 0 ? 0 : m + log(z) - c.logits[n * V + tgt[n]];
        QT_EXPECT(fabs(c.loss[n] - want) <= 1e-5 * fabs(want) + 1e-6, "row %ld: loss %.8g want %.8g", n, c.loss[n], want);
    }
    float *g = nans(N * V), *inplace;
    qt_ref_cross_entropy_bwd(g, c.logits, tgt, N, V, c.scale);
    for (long n = 0; n < N; n++) { /* scale * (softmax - onehot) sums to 0 over a row, even saturated */
        double s = 0;
        for (int v = 0; v < V; v++) s += g[n * V + v];
        QT_EXPECT(all_finite(g + n * V, V) && fabs(s) < 1e-6, "row %ld: dlogits sum %g", n, s);
    }
    /* finite differences need a loss of moderate size: fp32 rounding of an 80-nat loss is too coarse */
    c.logits[2 * V + 5] = 4;
    inplace = copy(c.logits, N * V);
    memset(g, 0xff, N * V * sizeof *g); /* NaN */
    qt_ref_cross_entropy_bwd(g, c.logits, tgt, N, V, c.scale);
    qt_ref_cross_entropy_bwd(inplace, inplace, tgt, N, V, c.scale);
    QT_EXPECT(all_finite(g, N * V), "dlogits not fully written");
    QT_EXPECT(!memcmp(g, inplace, N * V * sizeof(float)), "in-place dlogits differ");
    for (int v = 0; v < V; v++) QT_EXPECT(g[3 * V + v] == 0, "ignored row has gradient %g", g[3 * V + v]);
    fd_in in[] = {{c.logits, g, N * V, "logits"}};
    printf("  cross-entropy: max rel err %.2e\n", fd_check("cross_entropy", ce_obj, &c, in, 1));
    free(c.logits), free(c.loss), free(g), free(inplace);
}

static void test_add_inplace(void) {
    long n = 1001;
    float *y = rnd(n, 1), *x = rnd(n, 1), *y0 = copy(y, n);
    qt_ref_add_inplace(y, x, n);
    for (long i = 0; i < n; i++) QT_EXPECT(y[i] == y0[i] + x[i], "[%ld]: %g != %g + %g", i, y[i], y0[i], x[i]);
    free(y), free(x), free(y0);
}

int main(void) {
    qt_rng_seed(&R, 1234);
    QT_RUN(test_embedding);
    QT_RUN(test_rmsnorm);
    QT_RUN(test_matmul);
    QT_RUN(test_matmul_forward_large);
    QT_RUN(test_rope_hand);
    QT_RUN(test_rope);
    QT_RUN(test_attention);
    QT_RUN(test_attention_causal_gqa);
    QT_RUN(test_swiglu);
    QT_RUN(test_cross_entropy);
    QT_RUN(test_add_inplace);
    QT_RUN(test_qknorm); /* last: the other tests keep their random draws */
    return qt_test_end();
}
