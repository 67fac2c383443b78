/* op_defs_gemma.h — GeGLU with the tanh GELU (swiglu.cu), the activation Gemma 3 adds, for the op table of
 * tests/test_ops_gpu.c (see op_harness.h for what a row checks). Gemma's other kernels run the plain ops' row code
 * in op_defs_kernels.h: OP_RMS1P_* (RMSNorm with (1 + w)), OP_EMB_SCALED_* (the scaled embedding), OP_LMHEAD
 * with s[3] = cap (the soft-capped loss); GeGLU's fused fp8 backward is OP_GEGLU_QT (op_defs_lib.h).
 *
 * Each op also has a planted-formula check that runs on the CPU (test_gemma_planted): the device result of the
 * formula a port could plausibly get wrong (erf GELU, plain w, no scale, no tanh derivative), rounded as the
 * device stores it, must fail the row's bounds. */
#ifndef OP_DEFS_GEMMA_H
#define OP_DEFS_GEMMA_H

#include "op_defs_kernels.h"

/* ---- GeGLU (swiglu.cu): s = n f; +inplace: dgu written over gu. One rounding of an fp32 result whose tanhf
 * differs from the CPU's by up to ~3 fp32 ulps: 4e-3 relative (one bf16 ulp of room). Absolute: the outputs
 * (out, h, the up half of dgu) take 2e-5, where 1 + tanh cancels in the tail (|gelu| < 1e-3 there); the gate
 * half of dgu takes 5e-4: gelu' = 0.5 (1 + t) + 0.5 g (1 - t^2) ... in torch's order turns an ulp of t into
 * ~1e-5 of gelu' at g = -8, times |dout * up| (a float simulation of +-3 ulps needs 3e-4). Tighter than
 * SwiGLU's 1e-2 so that the erf GELU (10% away at g = -3, more below) fails the forward rows. */
#define GG_ATOL 2e-5
#define GG_ATOL_DGU 5e-4
#define GG_RTOL 4e-3
static void geglu_fwd_build(op_run *r) {
    t_in(r, "gu", QT_DT_BF16, S(0) * 2 * S(1), 2.0f);
    t_out(r, "out", QT_DT_BF16, S(0) * S(1), GG_ATOL, GG_RTOL, 0);
    t_amax(r);
}
static void geglu_fwd_ref(op_run *r) { qt_ref_geglu_fwd(REF(r, "out"), H(r, "gu"), S(0), (int)S(1)); }
static void geglu_fwd_launch(op_run *r, int pass) {
    (void)pass;
    qt_geglu_fwd(D(r, "out"), D(r, "gu"), S(0), (int)S(1), D(r, "amax"), 0);
}
static const op_def OP_GEGLU_FWD = {"geglu_fwd", "n f", 0, NULL, geglu_fwd_build, geglu_fwd_ref, geglu_fwd_launch,
                                    swiglu_fwd_derive, NULL, 0, 0, 0};

/* bwd and bwd_h (h = the forward's bits written over dh): gu, dgu (or gu in place) as swiglu_bwd's rows. */
static const op_def OP_GEGLU_BWD_H;
static void geglu_bwd_build(op_run *r) {
    long n2f = S(0) * 2 * S(1);
    if (OPT(O_INPLACE)) t_upd(r, "gu", QT_DT_BF16, n2f, 2.0f, GG_ATOL_DGU, GG_RTOL, 0);
    else t_in(r, "gu", QT_DT_BF16, n2f, 2.0f), t_out(r, "dgu", QT_DT_BF16, n2f, GG_ATOL_DGU, GG_RTOL, 0);
    if (r->c->op == &OP_GEGLU_BWD_H) t_upd(r, "dh", QT_DT_BF16, S(0) * S(1), 1.0f, GG_ATOL, GG_RTOL, 0);
    else t_in(r, "dout", QT_DT_BF16, S(0) * S(1), 1.0f);
    t_amax(r);
}
static void geglu_bwd_ref(op_run *r) {
    int h = r->c->op == &OP_GEGLU_BWD_H;
    qt_ref_geglu_bwd(REF(r, swiglu_dgu(r)), H(r, h ? "dh" : "dout"), H(r, "gu"), S(0), (int)S(1));
    if (h) qt_ref_geglu_fwd(REF(r, "dh"), H(r, "gu"), S(0), (int)S(1));
}
static void geglu_bwd_launch(op_run *r, int pass) {
    (void)pass;
    void *dgu = D(r, swiglu_dgu(r)), *gu = D(r, "gu");
    if (r->c->op == &OP_GEGLU_BWD_H) qt_geglu_bwd_h(dgu, D(r, "dh"), gu, S(0), (int)S(1), D(r, "amax"), 0);
    else qt_geglu_bwd(dgu, D(r, "dout"), gu, S(0), (int)S(1), D(r, "amax"), 0);
}
static const op_def OP_GEGLU_BWD = {"geglu_bwd", "n f", 0, NULL, geglu_bwd_build, geglu_bwd_ref, geglu_bwd_launch,
                                    swiglu_bwd_derive, NULL, 0, 0, 0};
static const op_def OP_GEGLU_BWD_H = {"geglu_bwd_h", "n f", 0, NULL, geglu_bwd_build, geglu_bwd_ref, geglu_bwd_launch,
                                      swiglu_bwd_derive, NULL, 0, 0, 0};

/* ---- planted formulas (CPU): each must fail its row ---- */

/* The gelu a port using the erf form would compute, in double. */
static double op_gelu_erf(double x) { return 0.5 * x * (1 + erf(x / sqrt(2.0))); }

/* Fills got[0] of tensor `name` with want[] rounded to its dtype (the rest of the row as a correct device would
 * leave it) and returns 1 when the row's pass-0 check fails on it. */
static int op_planted_caught(op_run *r, const char *name, const float *want) {
    op_emulate(r, 0);
    op_tensor *t = T(r, name);
    for (long i = 0; i < t->n; i++) t->got[0][i] = op_round(t->dt, want[i]);
    r->nfail = 0;
    r->log[0] = 0;
    op_verify(r, 0, t);
    return r->nfail > 0;
}

/* Runs one row (seeded), computes the planted result of tensor `name` with plant(r, out) and expects it caught. */
static void op_expect_planted(const op_case *c, const char *name, void (*plant)(op_run *r, float *out), const char *what) {
    op_run *r = calloc(1, sizeof *r);
    QT_CHECK(r, "out of host memory");
    op_start(r, c, 0x5eed);
    float *out = op_alloc(T(r, name)->n);
    if (T(r, name)->h) memcpy(out, T(r, name)->h, (size_t)T(r, name)->n * sizeof *out);
    else memset(out, 0, (size_t)T(r, name)->n * sizeof *out);
    plant(r, out);
    char label[256];
    op_label(c, label, sizeof label);
    QT_EXPECT(op_planted_caught(r, name, out), "%s: %s passes the row's bounds", label, what);
    free(out);
    op_finish(r);
    free(r);
}

static void plant_geglu_erf(op_run *r, float *out) {
    long f = S(1);
    for (long i = 0; i < S(0) * f; i++) {
        const float *g = H(r, "gu") + (i / f) * 2 * f + i % f;
        out[i] = (float)(op_gelu_erf(g[0]) * g[f]);
    }
}
static void plant_geglu_swiglu_bwd(op_run *r, float *out) {
    qt_ref_swiglu_bwd(out, H(r, "dout"), H(r, "gu"), S(0), (int)S(1));
}
static void plant_rms_plain_fwd(op_run *r, float *out) {
    float *rstd = op_alloc(S(0));
    qt_ref_rmsnorm_fwd(out, rstd, H(r, "res"), H(r, "w"), S(0), (int)S(1), 1e-6f);
    free(rstd);
}
static void plant_rms_plain_bwd(op_run *r, float *out) {
    float *dw = op_alloc(S(1));
    memset(dw, 0, (size_t)S(1) * sizeof *dw);
    qt_ref_rmsnorm_bwd(out, dw, H(r, "dy"), H(r, "res"), H(r, "w"), H(r, "rstd"), S(0), (int)S(1));
    free(dw);
}
static void plant_emb_unscaled_fwd(op_run *r, float *out) {
    long c = S(1);
    for (long i = 0; i < S(0) * c; i++) {
        long t = (long)H(r, "tok")[i / c];
        out[i] = tok_ok(t, S(2)) ? H(r, "wte")[t * c + i % c] : 0.0f;
    }
}
static void plant_emb_unscaled_bwd(op_run *r, float *out) {
    int32_t *tok = op_ints(r, "tok");
    qt_ref_embedding_bwd(out, H(r, "dout"), tok, S(0), (int)S(1), (int)S(2));
    free(tok);
}
/* Soft-cap without the tanh derivative: softmax(z) - onehot of the capped logits, taken as d/dx. */
static void plant_softcap_no_deriv(op_run *r, float *out) {
    long n = S(0), v = S(1);
    int32_t *tgt = op_ints(r, "tgt");
    float *z = op_alloc(n * v), cap = (float)S(3);
    for (long i = 0; i < n * v; i++) z[i] = cap * tanhf(H(r, "logits")[i] / cap);
    for (long i = 0; i < n; i++) tgt[i] = tok_ok(tgt[i], v) ? tgt[i] : -1;
    qt_ref_cross_entropy_bwd(out, z, tgt, n, (int)v, lm_scale(r));
    free(z);
    free(tgt);
}
static void plant_softcap_none(op_run *r, float *out) {
    long n = S(0), v = S(1);
    int32_t *tgt = op_ints(r, "tgt");
    for (long i = 0; i < n; i++) tgt[i] = tok_ok(tgt[i], v) ? tgt[i] : -1;
    qt_ref_cross_entropy_fwd(out, H(r, "logits"), tgt, n, (int)v);
    for (long i = 0; i < n; i++)
        if ((long)H(r, "tgt")[i] >= v) out[i] = NAN;
    free(tgt);
}

/* The planted formulas against rows like the table's (test_ops_gpu's CPU part). */
static void test_gemma_planted(void) {
    static const op_case gf = {&OP_GEGLU_FWD, {64, 4864}, 0, 0, 0, 0, 0}, gb = {&OP_GEGLU_BWD, {33, 13}, 0, 0, 0, 0, 0};
    static const op_case rf = {&OP_RMS1P_FWD, {33, 100}, 0, 0, O_RES, 0, 0};
    static const op_case rb = {&OP_RMS1P_BWD, {65, 100}, QT_DT_F32, 0, 0, 0, 0};
    static const op_case ef = {&OP_EMB_SCALED_FWD, {7, 896, 1000, 30}, 0, 0, 0, 0, 0};
    static const op_case eb = {&OP_EMB_SCALED_BWD, {777, 20, 300, 10}, QT_DT_F32, 0, 0, 0, 0};
    static const op_case lm = {&OP_LMHEAD, {11, 1009, QT_LMHEAD_TWO_PASS, 15}, 0, 0, O_BAD, 15.0f, 0};
    op_expect_planted(&gf, "out", plant_geglu_erf, "the erf GELU");
    op_expect_planted(&gb, "dgu", plant_geglu_swiglu_bwd, "the SwiGLU backward");
    op_expect_planted(&rf, "y", plant_rms_plain_fwd, "x * rstd * w (no 1 +)");
    op_expect_planted(&rb, "dx", plant_rms_plain_bwd, "dx through w (no 1 +)");
    op_expect_planted(&ef, "out", plant_emb_unscaled_fwd, "the unscaled embedding");
    op_expect_planted(&eb, "dwte", plant_emb_unscaled_bwd, "the unscaled gradient");
    op_expect_planted(&lm, "logits", plant_softcap_no_deriv, "dlogits without 1 - tanh^2");
    op_expect_planted(&lm, "loss", plant_softcap_none, "the uncapped loss");
}

#endif
