/* op_defs_lora.h — the LoRA module kernels (cuda/lora.cu) for the op table of tests/test_ops_gpu.c (see
 * op_harness.h for what a row checks), against the CPU engine's qt_lora_fwd_cpu / qt_lora_bwd_cpu.
 *
 * s = n in out r row0: N tokens, the module's input and output widths, the rank, and its first row in the fused
 * output, whose width is ld = row0 + out + row0 / 2 (rows on both sides that must keep their bits). f: the dropout
 * rate p (the mask's seed is drawn per row); the scale is 1.5. A and B are bf16 inputs (the kernels multiply the
 * adapters' bf16 copy; the cast is the cast kernel's job), so the bounds measure the kernels' own rounding:
 *   - a bf16 output written once (u, g): one RNE of an fp32 sum, 2^-9 relative, within 8e-3 (two bf16 units);
 *     fp32 sums over in / out terms against the CPU's double ones (absolute, growing with the count of terms);
 *   - dB: bf16 inputs (dy, u), an fp32 sum over N tokens: 4e-6 * N absolute, 1e-4 relative;
 *   - y, dA, dx read an operand the same launch rounded to bf16 (u in the forward, g in the backward), where the
 *     CPU keeps fp32: each term u_k B_k (or g_k A_k, g_n xd_n) is off by at most 2^-9 of itself, so every element
 *     is within 2^-8 * (the largest sum of |terms| of the tensor) — computed from the reference in lora_*_ref —
 *     plus rtol |ref| (bf16 outputs: their own RNE; dx with p > 0 is rounded twice, the term in the scratch, then
 *     dx + term); the relative L2 errors (about 2^-9 / sqrt(3)) stay within rtol: 8e-3 for y and dx, 4e-3 for dA.
 * Backward +cur: the launch order of a recomputed SwiGLU (dA after dx, from the same g). test_lora_planted checks
 * that the dropout mask, its 1/(1-p) and the scale are each caught when left out. */
#ifndef OP_DEFS_LORA_H
#define OP_DEFS_LORA_H

#include "op_defs_gemma.h"
#include "op_defs_lib.h"
#include "qt_lora_cpu.h"
#include "qt_lora_kernels.h"

#define LORA_SCALE 1.5f
static long lora_ld(const op_run *r) { return S(4) + S(2) + S(4) / 2; }
static uint64_t lora_mseed(const op_run *r) { return qt_hash64(r->seed, 0x10a); }
/* The kernels' dropout scratch: declared only when p > 0 (NULL otherwise). */
static void lora_ws_decl(op_run *r) {
    if (r->c->f > 0) t_ws(r, "ws", qt_lora_ws_bytes(S(0), (int)S(1), r->c->f));
}
static void *lora_ws(op_run *r) { return r->c->f > 0 ? D(r, "ws") : NULL; }
/* 2^-8 * the largest over (a, b) of sum_k |P[a*pa + k*pk] * Q[b*qb + k*qk]| * w: the bound of a sum of K terms
 * each of whose P factors the kernel rounded to bf16 (see the top). */
static double lora_term_bound(const float *P, long pa, long pk, long na, const float *Q, long qb, long qk, long nb,
                              long K, double w) {
    double m = 0;
    for (long a = 0; a < na; a++)
        for (long b = 0; b < nb; b++) {
            double acc = 0;
            for (long k = 0; k < K; k++) acc += fabs((double)P[a * pa + k * pk] * Q[b * qb + k * qk]);
            m = acc > m ? acc : m;
        }
    return 0x1.0p-8 * m * w;
}

/* A one-module layout over the row's shapes: A at 0, B after it (the flat array qt_lora_*_cpu read). */
static void lora_module(const op_run *r, qt_lora_layout *A, qt_lora_module *md) {
    memset(A, 0, sizeof *A);
    A->cfg.rank = (int)S(3);
    A->scale = LORA_SCALE;
    *md = (qt_lora_module){0, QT_LORA_SITE_QKV, (int)S(1), (int)S(2), (int)S(4), (int)lora_ld(r), 0, (size_t)(S(3) * S(1))};
}
static float *lora_flat(op_run *r, const char *a, const char *b, int ref) {
    long na = S(3) * S(1), nb = S(2) * S(3);
    float *f = op_alloc(na + nb);
    memcpy(f, ref ? REF(r, a) : H(r, a), (size_t)na * 4);
    memcpy(f + na, ref ? REF(r, b) : H(r, b), (size_t)nb * 4);
    return f;
}

static void lora_fwd_build(op_run *r) {
    t_in(r, "x", QT_DT_BF16, S(0) * S(1), 1.0f);
    t_in(r, "A", QT_DT_BF16, S(3) * S(1), 1.0f / sqrtf((float)S(1)));
    t_in(r, "B", QT_DT_BF16, S(2) * S(3), 0.5f);
    t_out(r, "u", QT_DT_BF16, S(0) * S(3), 2e-6 * S(1), 8e-3, 0);
    t_upd(r, "y", QT_DT_BF16, S(0) * lora_ld(r), 1.0f, 0 /* lora_fwd_ref */, 8e-3, T_ADD);
    lora_ws_decl(r);
}
static void lora_fwd_ref(op_run *r) {
    qt_lora_layout A;
    qt_lora_module md;
    lora_module(r, &A, &md);
    float *a = lora_flat(r, "A", "B", 0);
    qt_lora_fwd_cpu(&A, &md, a, H(r, "x"), REF(r, "u"), REF(r, "y"), S(0), r->c->f, lora_mseed(r));
    T(r, "y")->atol = 1e-3 + lora_term_bound(REF(r, "u"), S(3), 1, S(0), H(r, "B"), S(3), 1, S(2), S(3), LORA_SCALE);
    free(a);
}
static void lora_fwd_launch(op_run *r, int pass) {
    (void)pass;
    qt_lora_down_fwd(mm_ctx(), D(r, "u"), lora_ws(r), D(r, "x"), D(r, "A"), S(0), (int)S(1), (int)S(3), r->c->f,
                     lora_mseed(r), 0);
    qt_lora_up_fwd(mm_ctx(), D(r, "y"), D(r, "u"), D(r, "B"), S(0), (int)S(2), (int)S(3), (int)S(4), (int)lora_ld(r),
                   LORA_SCALE, 0);
}
/* y's columns outside the module's rows keep their bits. */
static int lora_keep(const op_run *r, const op_tensor *t, long i) {
    long c = i % lora_ld(r);
    return (!strcmp(t->name, "y") || !strcmp(t->name, "dy")) && (c < S(4) || c >= S(4) + S(2));
}
static const op_def OP_LORA_FWD = {"lora_fwd", "n in out r row0", 0, "p", lora_fwd_build, lora_fwd_ref, lora_fwd_launch,
                                   NULL, lora_keep, 0, 0, 0};

static void lora_bwd_build(op_run *r) {
    long n = S(0);
    t_in(r, "x", QT_DT_BF16, n * S(1), 1.0f);
    t_in(r, "A", QT_DT_BF16, S(3) * S(1), 1.0f / sqrtf((float)S(1)));
    t_in(r, "B", QT_DT_BF16, S(2) * S(3), 0.5f);
    t_in(r, "u", QT_DT_BF16, n * S(3), 1.0f);
    t_in(r, "dy", QT_DT_BF16, n * lora_ld(r), 1.0f);
    t_out(r, "g", QT_DT_BF16, n * S(3), 2e-6 * S(2), 8e-3, 0);
    /* dA starts at the scale of its sum (g ~ 0.75 sqrt(out), N tokens): "=" for "+=" must stand out of its bound */
    t_upd(r, "dA", QT_DT_F32, S(3) * S(1), 0.75f * sqrtf((float)(n * S(2))), 0 /* lora_bwd_ref */, 4e-3, T_ADD);
    t_upd(r, "dB", QT_DT_F32, S(2) * S(3), 1.0f, 4e-6 * n, 1e-4, T_ADD);
    t_upd(r, "dx", QT_DT_BF16, n * S(1), 1.0f, 0 /* lora_bwd_ref */, 8e-3, T_ADD);
    lora_ws_decl(r);
}
/* g is what qt_lora_bwd_cpu computes inside: scale * dy_m B, summed in double; dA's and dx's bounds from it. */
static void lora_bwd_ref(op_run *r) {
    qt_lora_layout A;
    qt_lora_module md;
    lora_module(r, &A, &md);
    float *a = lora_flat(r, "A", "B", 0), *ga = lora_flat(r, "dA", "dB", 1);
    qt_lora_bwd_cpu(&A, &md, a, ga, H(r, "x"), H(r, "u"), H(r, "dy"), REF(r, "dx"), S(0), r->c->f, lora_mseed(r));
    long na = S(3) * S(1), ld = lora_ld(r);
    memcpy(REF(r, "dA"), ga, (size_t)na * 4);
    memcpy(REF(r, "dB"), ga + na, (size_t)(S(2) * S(3)) * 4);
    for (long n = 0; n < S(0); n++)
        for (long k = 0; k < S(3); k++) {
            double acc = 0;
            for (long o = 0; o < S(2); o++) acc += (double)H(r, "dy")[n * ld + S(4) + o] * H(r, "B")[o * S(3) + k];
            REF(r, "g")[n * S(3) + k] = LORA_SCALE * (float)acc;
        }
    float p = r->c->f, ks = p > 0 ? 1.0f / (1.0f - p) : 1.0f, *xd = op_alloc(S(0) * S(1));
    for (long e = 0; e < S(0) * S(1); e++) xd[e] = H(r, "x")[e] * qt_lora_mask(lora_mseed(r), (uint64_t)e, p, ks);
    /* dA[k, i] sums g[n, k] xd[n, i] over n; dx[n, i] sums g[n, k] A[k, i] over k (times the mask) */
    T(r, "dA")->atol = 4e-6 * S(0) + lora_term_bound(REF(r, "g"), 1, S(3), S(3), xd, 1, S(1), S(1), S(0), 1.0);
    T(r, "dx")->atol = 1e-3 + lora_term_bound(REF(r, "g"), S(3), 1, S(0), H(r, "A"), 1, S(1), S(1), S(3), ks);
    free(a), free(ga), free(xd);
}
/* +cur: the order of a recomputed SwiGLU (block_backward): g and dB without x, dx, then dA on its own. */
static void lora_bwd_launch(op_run *r, int pass) {
    (void)pass;
    int split = OPT(O_CUR);
    qt_matmul_ctx *mm = mm_ctx();
    void *ws = lora_ws(r);
    qt_lora_bwd_w(mm, D(r, "g"), D(r, "dA"), D(r, "dB"), ws, D(r, "dy"), D(r, "u"), split ? NULL : D(r, "x"), D(r, "B"),
                  S(0), (int)S(1), (int)S(2), (int)S(3), (int)S(4), (int)lora_ld(r), LORA_SCALE, r->c->f, lora_mseed(r), 0);
    qt_lora_bwd_x(mm, D(r, "dx"), ws, D(r, "g"), D(r, "A"), S(0), (int)S(1), (int)S(3), r->c->f, lora_mseed(r), 0);
    if (split)
        qt_lora_bwd_a(mm, D(r, "dA"), ws, D(r, "g"), D(r, "x"), S(0), (int)S(1), (int)S(3), r->c->f, lora_mseed(r), 0);
}
static const op_def OP_LORA_BWD = {"lora_bwd", "n in out r row0", 0, "p", lora_bwd_build, lora_bwd_ref, lora_bwd_launch,
                                   NULL, NULL, 0, 0, 0};

/* ---- planted bugs: the reference with a piece left out must fail the row's bounds ---- */
static void plant_lora_no_mask_u(op_run *r, float *out) { /* u without the dropout mask */
    for (long n = 0; n < S(0); n++)
        for (long k = 0; k < S(3); k++) {
            double acc = 0;
            for (long i = 0; i < S(1); i++) acc += (double)H(r, "x")[n * S(1) + i] * H(r, "A")[k * S(1) + i];
            out[n * S(3) + k] = (float)acc;
        }
}
static void plant_lora_no_keep_scale(op_run *r, float *out) { /* dropped, but the kept inputs not scaled by 1/(1-p) */
    float p = r->c->f;
    uint64_t ms = lora_mseed(r);
    for (long n = 0; n < S(0); n++)
        for (long k = 0; k < S(3); k++) {
            double acc = 0;
            for (long i = 0; i < S(1); i++)
                acc += (double)H(r, "x")[n * S(1) + i] * qt_lora_mask(ms, (uint64_t)(n * S(1) + i), p, 1.0f) * H(r, "A")[k * S(1) + i];
            out[n * S(3) + k] = (float)acc;
        }
}
static void plant_lora_no_scale(op_run *r, float *out) { /* y += u B^T without the scale */
    qt_lora_layout A;
    qt_lora_module md;
    lora_module(r, &A, &md);
    A.scale = 1.0f;
    float *a = lora_flat(r, "A", "B", 0), *u = op_alloc(S(0) * S(3));
    qt_lora_fwd_cpu(&A, &md, a, H(r, "x"), u, out, S(0), r->c->f, lora_mseed(r));
    free(a), free(u);
}
static void plant_lora_dx_no_mask(op_run *r, float *out) { /* dx through every input, dropped ones included */
    qt_lora_layout A;
    qt_lora_module md;
    lora_module(r, &A, &md);
    float *a = lora_flat(r, "A", "B", 0), *ga = op_alloc(S(3) * S(1) + S(2) * S(3));
    memset(ga, 0, (size_t)(S(3) * S(1) + S(2) * S(3)) * 4);
    qt_lora_bwd_cpu(&A, &md, a, ga, H(r, "x"), H(r, "u"), H(r, "dy"), out, S(0), 0.0f, 0);
    free(a), free(ga);
}
static void test_lora_planted(void) {
    static const op_case f = {&OP_LORA_FWD, {33, 200, 48, 4, 16}, 0, 0, 0, 0.25f, 0};
    static const op_case b = {&OP_LORA_BWD, {33, 200, 48, 4, 16}, 0, 0, 0, 0.25f, 0};
    op_expect_planted(&f, "u", plant_lora_no_mask_u, "u without the dropout mask");
    op_expect_planted(&f, "u", plant_lora_no_keep_scale, "the kept inputs without 1/(1-p)");
    op_expect_planted(&f, "y", plant_lora_no_scale, "y without the scale");
    op_expect_planted(&b, "dx", plant_lora_dx_no_mask, "dx without the mask");
}

#endif
