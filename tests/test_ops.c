/* test_ops.c — the CPU reference ops: each backward against central finite differences of <u, f(x)>
 * (random directions and single coordinates), each forward against a naive double implementation,
 * "=" outputs fully written (poisoned with NaN first), "+=" outputs accumulating, odd shapes. */
#include <stdint.h>

#include "fd_check.h"
#include "qt_ref.h"
#include "qt_rope.h"

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

typedef struct { float *x, *y, *u; int B, T, H, Hkv, D; const double *inv; double attn; } rope_ctx;
static double rope_obj(void *p) {
    rope_ctx *c = p;
    long n = (long)c->B * c->T * (c->H + 2 * c->Hkv) * c->D;
    memcpy(c->y, c->x, n * sizeof(float));
    qt_ref_rope_fwd(c->y, c->B, c->T, c->H, c->Hkv, c->D, c->inv, c->attn);
    return dotd(c->u, c->y, n);
}

static void test_rope_hand(void) {
    /* H=1, Hkv=1, D=4, theta=100: angles at position t are t*1 and t*100^(-1/2) = t/10 */
    float qkv[3 * 12];
    for (int i = 0; i < 36; i++) qkv[i] = (float)(i % 12 + 1);
    const double inv[2] = {1.0, 0.1};
    qt_ref_rope_fwd(qkv, 1, 3, 1, 1, 4, inv, 1.0);
    const float *t0 = qkv, *t2 = qkv + 24;
    for (int i = 0; i < 12; i++) QT_EXPECT(t0[i] == (float)(i + 1), "position 0 must not rotate: [%d] = %g", i, t0[i]);
    double c2 = cos(2.0), s2 = sin(2.0), c02 = cos(0.2), s02 = sin(0.2);
    float want[12] = {(float)(1 * c2 - 3 * s2), (float)(2 * c02 - 4 * s02), (float)(3 * c2 + 1 * s2),
                      (float)(4 * c02 + 2 * s02), (float)(5 * c2 - 7 * s2), (float)(6 * c02 - 8 * s02),
                      (float)(7 * c2 + 5 * s2), (float)(8 * c02 + 6 * s02), 9, 10, 11, 12};
    QT_EXPECT(qt_t_close("rope t=2", t2, want, 12, 1e-6, 1e-6), "rotate-half at t=2 (q, k rotated; v untouched)");
}

/* attn != 1 (yarn) scales the rotation: bwd(fwd(x)) = attn^2 x on the q and k heads, x on the v heads. */
static void rope_case(int B, int T, int H, int Hkv, int D, const double *inv, double attn) {
    long n = (long)B * T * (H + 2 * Hkv) * D;
    rope_ctx c = {rnd(n, 1), malloc(n * sizeof(float)), rnd(n, 1), B, T, H, Hkv, D, inv, attn};
    float *g = copy(c.u, n);
    qt_ref_rope_bwd(g, B, T, H, Hkv, D, inv, attn);
    float *x2 = copy(c.x, n), *want = copy(c.x, n);
    for (long k = 0; k < n; k++)
        if ((k / D) % (H + 2 * Hkv) < H + Hkv) want[k] = (float)(want[k] * attn * attn);
    qt_ref_rope_fwd(x2, B, T, H, Hkv, D, inv, attn);
    qt_ref_rope_bwd(x2, B, T, H, Hkv, D, inv, attn);
    QT_EXPECT(qt_t_close("bwd(fwd(x))", x2, want, n, 1e-5, 1e-5), "rope bwd is not the transpose");
    fd_in in[] = {{c.x, g, n, "qkv"}};
    double e = fd_check("rope", rope_obj, &c, in, 1);
    printf("  rope B=%d T=%d H=%d Hkv=%d D=%d attn=%g: max rel err %.2e\n", B, T, H, Hkv, D, attn, e);
    free(c.x), free(c.y), free(c.u), free(g), free(x2), free(want);
}
static void test_rope(void) {
    double inv[8];
    for (int i = 0; i < 8; i++) inv[i] = pow(10000.0, -2.0 * i / 16);
    rope_case(2, 7, 6, 2, 8, inv, 1.0);
    rope_case(1, 1, 2, 1, 16, inv, 1.0);
    rope_case(2, 9, 2, 1, 16, inv, 1.2);
}

/* |got - ref| <= rtol |ref| for doubles; prints the worst index on failure. */
static int close_d(const char *what, const double *got, const double *ref, int n, double rtol) {
    int worst = 0;
    double we = -1;
    for (int i = 0; i < n; i++) {
        double e = fabs(got[i] - ref[i]) / fabs(ref[i]);
        if (!(e <= we)) we = e, worst = i;
    }
    if (we <= rtol) return 1;
    printf("  %s: [%d] got %.17g, want %.17g (rel err %.2e > %.0e)\n", what, worst, got[worst], ref[worst], we, rtol);
    return 0;
}

/* qt_rope_inv_freq against the formulas of transformers' ROPE_INIT_FUNCTIONS written out by hand for
 * D = 16, theta = 10000 (wavelengths 2 pi 10000^(i/8)), original_max_position_embeddings 64, factor 8. */
static void test_rope_inv_freq(void) {
    qt_model_cfg c = {.hidden_size = 64, .num_heads = 4, .head_dim = 16, .max_seq_len = 128, .rope_theta = 10000.0f};
    double inv[8], base[8], attn = 0, want[8];
    for (int i = 0; i < 8; i++) base[i] = pow(10000.0, -i / 8.0);
    qt_rope_inv_freq(&c, 100, inv, &attn);
    QT_EXPECT(close_d("default", inv, base, 8, 1e-15) && attn == 1, "default frequencies");
    c.rope = (qt_rope_cfg){.type = QT_ROPE_LINEAR, .factor = 4};
    for (int i = 0; i < 8; i++) want[i] = base[i] / 4;
    qt_rope_inv_freq(&c, 100, inv, &attn);
    QT_EXPECT(close_d("linear", inv, want, 8, 1e-15) && attn == 1, "linear: / factor");
    /* llama3, low 1, high 4: wavelengths > 64 / factor 8; < 16 kept; between: s = (64 / w - 1) / 3 */
    c.rope = (qt_rope_cfg){.type = QT_ROPE_LLAMA3, .factor = 8, .original_max_pos = 64, .low_freq_factor = 1,
                           .high_freq_factor = 4};
    int bands[3] = {0, 0, 0};
    for (int i = 0; i < 8; i++) {
        double w = 2 * M_PI / base[i], s = (64 / w - 1) / 3;
        want[i] = w < 16 ? base[i] : w > 64 ? base[i] / 8 : (1 - s) * base[i] / 8 + s * base[i];
        bands[w < 16 ? 0 : w > 64 ? 2 : 1]++;
    }
    QT_REQUIRE(bands[0] && bands[1] && bands[2], "the shape must have pairs in all three llama3 bands");
    qt_rope_inv_freq(&c, 100, inv, &attn);
    QT_EXPECT(close_d("llama3", inv, want, 8, 1e-14) && attn == 1, "llama3 bands");
    /* dynamic: the base grows only past max_seq_len */
    c.rope = (qt_rope_cfg){.type = QT_ROPE_DYNAMIC, .factor = 2};
    qt_rope_inv_freq(&c, 128, inv, &attn);
    QT_EXPECT(close_d("dynamic at max", inv, base, 8, 1e-15), "dynamic within max_seq_len = default");
    double b2 = 10000.0 * pow(2.0 * 256 / 128 - 1, 16.0 / 14);
    for (int i = 0; i < 8; i++) want[i] = pow(b2, -i / 8.0);
    qt_rope_inv_freq(&c, 256, inv, &attn);
    QT_EXPECT(close_d("dynamic 2x", inv, want, 8, 1e-14), "dynamic NTK base at twice max_seq_len");
    /* yarn, beta 32 / 1: ramp ends floor(16 ln(64 / (64 pi)) / (2 ln 1e4)) and ceil(16 ln(64 / (2 pi)) / (2 ln 1e4)) */
    c.rope = (qt_rope_cfg){.type = QT_ROPE_YARN, .factor = 4, .original_max_pos = 64, .truncate = 1};
    double lo = floor(16 * log(64 / (64 * M_PI)) / (2 * log(1e4))), hi = ceil(16 * log(64 / (2 * M_PI)) / (2 * log(1e4)));
    if (lo < 0) lo = 0;
    for (int i = 0; i < 8; i++) {
        double ramp = fmin(fmax((i - lo) / (hi - lo), 0), 1);
        want[i] = base[i] / 4 * ramp + base[i] * (1 - ramp);
    }
    qt_rope_inv_freq(&c, 100, inv, &attn);
    QT_EXPECT(close_d("yarn", inv, want, 8, 1e-14), "yarn ramp (lo %g hi %g)", lo, hi);
    QT_EXPECT(fabs(attn - (0.1 * log(4.0) + 1)) < 1e-15, "yarn attention factor %.17g", attn);
    c.rope.attention_factor = 1.5f;
    qt_rope_inv_freq(&c, 100, inv, &attn);
    QT_EXPECT(attn == 1.5, "yarn attention_factor given: %g", attn);
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

typedef struct { float *qkv, *out, *lse, *u; int B, T, H, Hkv, D, W; } att_ctx;
static double att_obj(void *p) {
    att_ctx *c = p;
    qt_ref_attention_fwd(c->out, c->lse, c->qkv, c->B, c->T, c->H, c->Hkv, c->D, c->W);
    return dotd(c->u, c->out, (long)c->B * c->T * c->H * c->D);
}

static void attention_case(int B, int T, int H, int Hkv, int D) {
    long nq = (long)B * T * (H + 2 * Hkv) * D, no = (long)B * T * H * D, nl = (long)B * H * T;
    att_ctx c = {rnd(nq, 1), nans(no), nans(nl), rnd(no, 1), B, T, H, Hkv, D, 0};
    att_obj(&c);
    float *ref = malloc(no * sizeof *ref), *lref = malloc(nl * sizeof *lref);
    attn_naive(ref, lref, c.qkv, B, T, H, Hkv, D);
    QT_EXPECT(qt_t_close("attention out", c.out, ref, no, 1e-6, 1e-5) && qt_t_close("lse", c.lse, lref, nl, 1e-6, 1e-6),
              "attention forward B=%d T=%d H=%d Hkv=%d D=%d", B, T, H, Hkv, D);
    float *g = nans(nq);
    qt_ref_attention_bwd(g, c.u, c.qkv, c.out, c.lse, B, T, H, Hkv, D, 0);
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
    qt_ref_attention_fwd(o1, l1, qkv, B, T, H, Hkv, D, 0);
    for (int b = 0; b < B; b++)
        for (long i = (long)(b * T + t0 + 1) * row; i < (long)(b + 1) * T * row; i++) qkv[i] = 5 * qt_rng_normal(&R);
    qt_ref_attention_fwd(o2, l2, qkv, B, T, H, Hkv, D, 0);
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
    qt_ref_attention_fwd(o1, l1, qkv, B, T, H, Hkv, D, 0);
    for (int h = 0; h < H; h++) {
        int changed = 0;
        for (long bt = 0; bt < (long)B * T; bt++)
            changed |= memcmp(o1 + bt * H * D + h * D, o2 + bt * H * D + h * D, D * sizeof(float)) != 0;
        QT_EXPECT(changed == (h / (H / Hkv) == 1), "head %d %s when kv head 1 changed", h, changed ? "changed" : "did not change");
    }
    free(qkv), free(o1), free(o2), free(l1), free(l2);
}

/* Naive masked softmax over all T keys: score -inf where the key is in the future or, with a window
 * W > 0, at or before t - W (transformers: kv_idx <= q_idx and kv_idx > q_idx - W). */
static void attn_naive_masked(float *out, float *lse, const float *qkv, int B, int T, int H, int Hkv, int D, int W) {
    long row = (long)(H + 2 * Hkv) * D;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int t = 0; t < T; t++) {
                const float *q = qkv + ((long)b * T + t) * row + h * D;
                int g = h / (H / Hkv);
                double s[64], m = -INFINITY, z = 0;
                for (int j = 0; j < T; j++) {
                    int seen = j <= t && (W == 0 || j > t - W);
                    s[j] = seen ? dotd(q, qkv + ((long)b * T + j) * row + (H + g) * D, D) / sqrt((double)D) : -INFINITY;
                    m = fmax(m, s[j]);
                }
                for (int j = 0; j < T; j++) z += exp(s[j] - m);
                for (int i = 0; i < D; i++) {
                    double o = 0;
                    for (int j = 0; j < T; j++) o += exp(s[j] - m) / z * qkv[((long)b * T + j) * row + (H + Hkv + g) * D + i];
                    out[((long)b * T + t) * H * D + h * D + i] = (float)o;
                }
                lse[((long)b * H + h) * T + t] = (float)(m + log(z));
            }
}

/* Sliding-window attention: the forward against the naive masked softmax, the backward against finite
 * differences, and a window >= T gives the causal attention's bits. */
static void attention_window_case(int B, int T, int H, int Hkv, int D, int W) {
    long nq = (long)B * T * (H + 2 * Hkv) * D, no = (long)B * T * H * D, nl = (long)B * H * T;
    att_ctx c = {rnd(nq, 1), nans(no), nans(nl), rnd(no, 1), B, T, H, Hkv, D, W};
    att_obj(&c);
    float *ref = malloc(no * sizeof *ref), *lref = malloc(nl * sizeof *lref);
    attn_naive_masked(ref, lref, c.qkv, B, T, H, Hkv, D, W);
    QT_EXPECT(qt_t_close("window out", c.out, ref, no, 1e-6, 1e-5) && qt_t_close("window lse", c.lse, lref, nl, 1e-6, 1e-6),
              "attention forward B=%d T=%d H=%d Hkv=%d D=%d W=%d", B, T, H, Hkv, D, W);
    float *g = nans(nq);
    qt_ref_attention_bwd(g, c.u, c.qkv, c.out, c.lse, B, T, H, Hkv, D, W);
    QT_EXPECT(all_finite(g, nq), "dqkv not fully written");
    fd_in in[] = {{c.qkv, g, nq, "qkv"}};
    double e = fd_check("attention window", att_obj, &c, in, 1);
    printf("  attention B=%d T=%d H=%d Hkv=%d D=%d W=%d: max rel err %.2e\n", B, T, H, Hkv, D, W, e);
    free(c.qkv), free(c.out), free(c.lse), free(c.u), free(ref), free(lref), free(g);
}
static void test_attention_window(void) {
    attention_window_case(2, 9, 6, 2, 8, 3);
    attention_window_case(1, 7, 4, 4, 8, 1); /* each query sees only itself: out = v of its own token */
    attention_window_case(2, 13, 2, 1, 8, 12);
    attention_window_case(1, 11, 6, 3, 16, 4);
    /* W >= T changes nothing: the same bits as W = 0, forward and backward */
    int B = 2, T = 7, H = 4, Hkv = 2, D = 8;
    long nq = (long)B * T * (H + 2 * Hkv) * D, no = (long)B * T * H * D, nl = (long)B * H * T;
    float *qkv = rnd(nq, 1), *u = rnd(no, 1), *o[2], *l[2], *d[2];
    for (int k = 0; k < 2; k++) {
        o[k] = nans(no), l[k] = nans(nl), d[k] = nans(nq);
        qt_ref_attention_fwd(o[k], l[k], qkv, B, T, H, Hkv, D, k ? T : 0);
        qt_ref_attention_bwd(d[k], u, qkv, o[k], l[k], B, T, H, Hkv, D, k ? T : 0);
    }
    QT_EXPECT(!memcmp(o[0], o[1], no * sizeof(float)) && !memcmp(l[0], l[1], nl * sizeof(float)) &&
                  !memcmp(d[0], d[1], nq * sizeof(float)),
              "window W = T differs from the causal attention");
    free(qkv), free(u);
    for (int k = 0; k < 2; k++) free(o[k]), free(l[k]), free(d[k]);
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
    QT_RUN(test_rope_inv_freq);
    QT_RUN(test_attention);
    QT_RUN(test_attention_causal_gqa);
    QT_RUN(test_attention_window);
    QT_RUN(test_swiglu);
    QT_RUN(test_cross_entropy);
    QT_RUN(test_add_inplace);
    QT_RUN(test_qknorm); /* last: the other tests keep their random draws */
    return qt_test_end();
}
