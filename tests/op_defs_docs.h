/* op_defs_docs.h — packed documents on the GPU for the op table of tests/test_ops_gpu.c (see op_harness.h for
 * what a row checks): cuDNN attention with a per-document key bound (qt_attention_docs_fwd/bwd, kv_lo) and the
 * RoPE kernel with per-token positions (qt_rope_pos_fwd/bwd), against qt_ref_attention_docs_* and
 * qt_ref_rope_pos_*. The documents of a row come from doc_layout: row b's starts cut the window into lengths
 * that cycle through 1, 5, T/3 + 1, 2, 37 and 13 tokens, from token 0 (b even) or from token b + 1 (b odd: the
 * window opens inside a document); kv_lo and the positions are qt_docs_expand's. Bounds as OP_ATT_* / OP_ROPE_*. */
#ifndef OP_DEFS_DOCS_H
#define OP_DEFS_DOCS_H

#include "op_defs_lib.h"
#include "qt_docs.h"

/* kv_lo and pos [B*T] of the rows' documents (either may be NULL). */
static void doc_layout(long B, long T, int32_t *kv_lo, int32_t *pos) {
    const long len[6] = {1, 5, T / 3 + 1, 2, 37, 13};
    int32_t *starts = calloc((size_t)(B * T), sizeof *starts), *n = calloc((size_t)B, sizeof *n);
    QT_CHECK(starts && n, "out of host memory");
    for (long b = 0; b < B; b++)
        for (long t = b % 2 ? b + 1 : 0, k = 0; t < T; t += len[k++ % 6]) starts[b * T + n[b]++] = (int32_t)t;
    qt_docs d = {starts, n, 1, 1};
    char err[256];
    QT_CHECK(qt_docs_expand(&d, (int)B, (int)T, kv_lo, pos, err, sizeof err) == 0, "%s", err);
    free(starts);
    free(n);
}

/* An int32 input [B*T] holding kv_lo (which 0) or the positions (which 1). */
static void t_docs(op_run *r, const char *name, long B, long T, int which) {
    float *h = t_in(r, name, DT_I32, B * T, 0);
    int32_t *v = calloc((size_t)(B * T), sizeof *v);
    QT_CHECK(v, "out of host memory");
    doc_layout(B, T, which ? NULL : v, which ? v : NULL);
    for (long i = 0; i < B * T; i++) h[i] = (float)v[i];
    free(v);
}
/* The int32 copy of an input made by t_docs (caller frees). */
static int32_t *docs_i32(op_run *r, const char *name) {
    op_tensor *t = T(r, name);
    int32_t *v = malloc((size_t)t->n * sizeof *v);
    QT_CHECK(v, "out of host memory");
    for (long i = 0; i < t->n; i++) v[i] = (int32_t)t->h[i];
    return v;
}

/* ---- attention per document: s = B T H Hkv D, f = the sliding window (0: causal), as OP_ATT_*. ---- */
static int att_docs_prepare(op_run *r) {
    char err[1024];
    if (!g_att) g_att = qt_attention_create();
    if (!qt_attention_prepare_docs(g_att, (int)S(0), (int)S(1), (int)S(2), (int)S(3), (int)S(4), ATT_W(r), 1, err,
                                   sizeof err))
        return 1;
    op_fail(r, "  cuDNN rejected the document-masked graph: %s", err);
    return 0;
}
static void att_docs_fwd_build(op_run *r) {
    att_fwd_build(r);
    t_docs(r, "kv_lo", S(0), S(1), 0);
}
static void att_docs_fwd_ref(op_run *r) {
    int32_t *lo = docs_i32(r, "kv_lo");
    qt_ref_attention_docs_fwd(REF(r, "out"), REF(r, "lse"), H(r, "qkv"), (int)S(0), (int)S(1), (int)S(2), (int)S(3),
                              (int)S(4), ATT_W(r), lo);
    free(lo);
}
static void att_docs_fwd_launch(op_run *r, int pass) {
    (void)pass;
    if (att_docs_prepare(r))
        qt_attention_docs_fwd(g_att, D(r, "out"), D(r, "lse"), D(r, "qkv"), D(r, "kv_lo"), (int)S(0), (int)S(1),
                              (int)S(2), (int)S(3), (int)S(4), ATT_W(r), 0);
}
static const op_def OP_ATT_DOCS_FWD = {"attention_docs_fwd", "B T H Hkv D", 0, "window", att_docs_fwd_build,
                                       att_docs_fwd_ref, att_docs_fwd_launch, NULL, NULL, 0, 0, 0};

static void att_docs_bwd_build(op_run *r) {
    long nqkv = att_rows(r) * (S(2) + 2 * S(3)) * S(4), nout = att_rows(r) * S(2) * S(4);
    float *qkv = t_in(r, "qkv", QT_DT_BF16, nqkv, 1.0f);
    float *out = t_in(r, "out", QT_DT_BF16, nout, 0), *lse = t_in(r, "lse", QT_DT_F32, S(0) * S(2) * S(1), 0);
    t_docs(r, "kv_lo", S(0), S(1), 0);
    int32_t *lo = docs_i32(r, "kv_lo");
    qt_ref_attention_docs_fwd(out, lse, qkv, (int)S(0), (int)S(1), (int)S(2), (int)S(3), (int)S(4), ATT_W(r), lo);
    free(lo);
    for (long i = 0; i < nout; i++) out[i] = op_round(QT_DT_BF16, out[i]);
    t_in(r, "dout", QT_DT_BF16, nout, 1.0f);
    t_out(r, "dqkv", QT_DT_BF16, nqkv, 2e-2, 2e-2, 0);
}
static void att_docs_bwd_ref(op_run *r) {
    int32_t *lo = docs_i32(r, "kv_lo");
    qt_ref_attention_docs_bwd(REF(r, "dqkv"), H(r, "dout"), H(r, "qkv"), H(r, "out"), H(r, "lse"), (int)S(0),
                              (int)S(1), (int)S(2), (int)S(3), (int)S(4), ATT_W(r), lo);
    free(lo);
}
static void att_docs_bwd_launch(op_run *r, int pass) {
    (void)pass;
    if (att_docs_prepare(r))
        qt_attention_docs_bwd(g_att, D(r, "dqkv"), D(r, "dout"), D(r, "qkv"), D(r, "out"), D(r, "lse"), D(r, "kv_lo"),
                              (int)S(0), (int)S(1), (int)S(2), (int)S(3), (int)S(4), ATT_W(r), 0);
}
static const op_def OP_ATT_DOCS_BWD = {"attention_docs_bwd", "B T H Hkv D", 0, "window", att_docs_bwd_build,
                                       att_docs_bwd_ref, att_docs_bwd_launch, NULL, NULL, OP_NONDET, 0, 0};

/* ---- RoPE with the documents' positions: s = B T H Hkv D, f = theta, as OP_ROPE_*. ---- */
static const op_def OP_ROPE_POS_BWD;
static void rope_pos_build(op_run *r) {
    long n = S(0) * S(1) * (S(2) + 2 * S(3)) * S(4);
    float *q = t_upd(r, "qkv", QT_DT_BF16, n, 1.0f, 1e-2, 1e-2, 0);
    if (r->c->op == &OP_ROPE_POS_BWD && n > 0) q[n - 1] = -9.0f;
    t_ws(r, "cs", (size_t)S(1) * (size_t)S(4) * sizeof(float));
    t_docs(r, "pos", S(0), S(1), 1);
    if (r->c->op == &OP_ROPE_POS_BWD) t_amax(r);
}
static void rope_pos_ref(op_run *r) {
    double inv[QT_ROPE_MAX_HALF], attn;
    int32_t *pos = docs_i32(r, "pos");
    rope_freqs(r, (int)S(1), (int)S(4), inv, &attn);
    if (r->c->op == &OP_ROPE_POS_BWD)
        qt_ref_rope_pos_bwd(REF(r, "qkv"), (int)S(0), (int)S(1), (int)S(2), (int)S(3), (int)S(4), pos, inv, attn);
    else qt_ref_rope_pos_fwd(REF(r, "qkv"), (int)S(0), (int)S(1), (int)S(2), (int)S(3), (int)S(4), pos, inv, attn);
    free(pos);
}
static void rope_pos_launch(op_run *r, int pass) {
    (void)pass;
    double inv[QT_ROPE_MAX_HALF], attn;
    rope_freqs(r, (int)S(1), (int)S(4), inv, &attn);
    qt_rope_table(D(r, "cs"), (int)S(1), (int)S(4), inv, attn, 0);
    if (r->c->op == &OP_ROPE_POS_BWD)
        qt_rope_pos_bwd(D(r, "qkv"), D(r, "cs"), D(r, "pos"), (int)S(0), (int)S(1), (int)S(2), (int)S(3), (int)S(4),
                        D(r, "amax"), 0);
    else
        qt_rope_pos_fwd(D(r, "qkv"), D(r, "cs"), D(r, "pos"), (int)S(0), (int)S(1), (int)S(2), (int)S(3), (int)S(4), 0);
}
static const op_def OP_ROPE_POS_FWD = {"rope_pos_fwd", "B T H Hkv D", 0, "theta", rope_pos_build, rope_pos_ref,
                                       rope_pos_launch, NULL, rope_keep, 0, 0, 0};
static const op_def OP_ROPE_POS_BWD = {"rope_pos_bwd", "B T H Hkv D", 0, "theta", rope_pos_build, rope_pos_ref,
                                       rope_pos_launch, rope_derive, rope_keep, 0, 0, 0};

#endif
