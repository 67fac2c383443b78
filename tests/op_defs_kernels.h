/* op_defs_kernels.h — the ops of qt_kernels.h (the cuda/ kernels) for the op table of tests/test_ops_gpu.c: each
 * op's tensors with their bounds, its CPU reference (qt_ref.h, qt_optim.h; a few lines here where the
 * reference is a cast or a sum) and its launch. See op_harness.h for what a row checks.
 *
 * Bounds: bf16 outputs 1e-2 (one rounding of an fp32 result: 2^-9 relative, with room for fp32
 * reordering); fp32 outputs 1e-5 or tighter; exact (0, 0) where the kernel's arithmetic is the
 * reference's (casts, gathers, in-place adds, fused abs-max: the max of the kernel's own output). */
#ifndef OP_DEFS_KERNELS_H
#define OP_DEFS_KERNELS_H

#include "op_harness.h"
#include "qt_kernels.h"
#include "qt_optim.h"
#include "qt_rope.h"
#include "qt_ref.h"

#define S(k) (r->c->s[k])
#define OPT(bit) ((r->c->opt & (bit)) != 0)

/* max |v| over x as the kernels fold it: on the bits of |v| (order-free; a NaN wins). */
static float op_absmax(const float *x, long n, qt_dtype round_to) {
    uint32_t m = 0;
    for (long i = 0; i < n; i++) {
        uint32_t b = op_bits(op_round(round_to, x[i])) & 0x7fffffffu;
        m = b > m ? b : m;
    }
    float f;
    memcpy(&f, &m, 4);
    return f;
}
/* A zeroed fp32 abs-max slot (T_PASS0: pass 1 passes NULL); its ref comes from the kernel's output. */
static void t_amax(op_run *r) {
    if (OPT(O_AMAX)) t_upd(r, "amax", QT_DT_F32, 1, 0, 0, 0, T_PASS0 | T_DERIVED)[0] = 0.0f;
}
static void derive_amax_of(op_run *r, const char *out, int pass) {
    if (T(r, "amax")) REF(r, "amax")[0] = op_absmax(GOT(r, out, pass), T(r, out)->n, QT_DT_BF16);
}

/* ---- casts, fill, zero, add (cast.cu). cast: dt is the destination (bf16: from fp32, fp32: from bf16). */
static void cast_build(op_run *r) {
    float *x = t_in(r, "x", r->c->dt == QT_DT_BF16 ? QT_DT_F32 : QT_DT_BF16, S(0), 3.0f);
    if (S(0) > 0) x[0] = 1.00390625f; /* a tie: RNE keeps 1.0 */
    t_out(r, "y", r->c->dt, S(0), 0, 0, 0);
}
static void cast_ref(op_run *r) {
    for (long i = 0; i < S(0); i++) REF(r, "y")[i] = op_round(r->c->dt, H(r, "x")[i]);
}
static void cast_launch(op_run *r, int pass) {
    (void)pass;
    if (r->c->dt == QT_DT_BF16) qt_cast_f32_to_bf16(D(r, "y"), D(r, "x"), (size_t)S(0), 0);
    else qt_cast_bf16_to_f32(D(r, "y"), D(r, "x"), (size_t)S(0), 0);
}
static const op_def OP_CAST = {"cast", "n", 1, NULL, cast_build, cast_ref, cast_launch, NULL, NULL, 0, 0, 0};

static void fill_build(op_run *r) { t_out(r, "y", r->c->dt, S(0), 0, 0, 0); }
static void fill_ref(op_run *r) {
    for (long i = 0; i < S(0); i++) REF(r, "y")[i] = r->c->op->fname ? op_round(r->c->dt, r->c->f) : 0.0f;
}
static void fill_launch(op_run *r, int pass) {
    (void)pass;
    if (r->c->op->fname) qt_fill(D(r, "y"), r->c->dt, r->c->f, (size_t)S(0), 0);
    else qt_zero(D(r, "y"), (size_t)S(0) * (size_t)qt_dtype_size(r->c->dt), 0);
}
static const op_def OP_FILL = {"fill", "n", 1, "value", fill_build, fill_ref, fill_launch, NULL, NULL, 0, 0, 0};
static const op_def OP_ZERO = {"zero", "n", 1, NULL, fill_build, fill_ref, fill_launch, NULL, NULL, 0, 0, 0};

/* y (dt) += x (dt2), in fp32, one rounding to y's dtype: exact. */
static void add_build(op_run *r) {
    t_upd(r, "y", r->c->dt, S(0), 1.0f, 0, 0, T_ADD);
    t_in(r, "x", r->c->dt2, S(0), 1.0f);
}
static void add_ref(op_run *r) {
    float *y = REF(r, "y"), *x = H(r, "x");
    for (long i = 0; i < S(0); i++) y[i] = op_round(r->c->dt, y[i] + x[i]);
}
static void add_launch(op_run *r, int pass) {
    (void)pass;
    qt_add_inplace(D(r, "y"), r->c->dt, D(r, "x"), r->c->dt2, (size_t)S(0), 0);
}
static const op_def OP_ADD = {"add_inplace", "n", 2, NULL, add_build, add_ref, add_launch, NULL, NULL, 0, 0, 0};

/* ---- embedding (embedding.cu): s = n c v hot (% of rows on token 3: one bucket larger than shared
 * memory); +bad: the first row's token is -1 and the last one's v (zero row / skipped). ---- */
static void tokens(op_run *r) {
    long n = S(0);
    float *tok = t_in(r, "tok", DT_I32, n, 0);
    for (long i = 0; i < n; i++)
        tok[i] = (float)((long)qt_rng_below(&r->rng, 100) < S(3) ? 3 : (long)qt_rng_below(&r->rng, (uint64_t)S(2)));
    if (OPT(O_BAD) && n > 1) tok[0] = -1, tok[n - 1] = (float)S(2);
}
static int tok_ok(long t, long v) { return t >= 0 && t < v; }
/* The scaled ops (Gemma, qt_embedding_scaled_*) run the same rows with scale = qt_ref_embed_scale(c, 1), the bf16
 * sqrt(c) transformers multiplies by; the plain ones with 1. fwd: bf16(wte * scale), exact (the fp32 product of
 * two bf16 is exact, one RNE); bwd: an fmaf per term on both sides, the plain rows' bounds. */
static const op_def OP_EMB_SCALED_FWD, OP_EMB_SCALED_BWD;
static float emb_scale(const op_run *r) {
    int scaled = r->c->op == &OP_EMB_SCALED_FWD || r->c->op == &OP_EMB_SCALED_BWD;
    return scaled ? qt_ref_embed_scale((int)S(1), 1) : 1.0f;
}
static void emb_fwd_build(op_run *r) {
    tokens(r);
    t_in(r, "wte", QT_DT_BF16, S(2) * S(1), 1.0f);
    t_out(r, "out", QT_DT_BF16, S(0) * S(1), 0, 0, 0);
}
static void emb_fwd_ref(op_run *r) {
    long n = S(0), c = S(1);
    int32_t *tok = op_ints(r, "tok");
    for (long i = 0; i < n; i++) tok[i] = tok_ok(tok[i], S(2)) ? tok[i] : 0;
    qt_ref_embedding_scaled_fwd(REF(r, "out"), tok, H(r, "wte"), n, (int)c, emb_scale(r));
    for (long i = 0; i < n * c; i++) REF(r, "out")[i] = op_round(QT_DT_BF16, REF(r, "out")[i]);
    for (long i = 0; i < n; i++)
        if (!tok_ok((long)H(r, "tok")[i], S(2))) memset(REF(r, "out") + i * c, 0, (size_t)c * sizeof(float));
    free(tok);
}
static void emb_fwd_launch(op_run *r, int pass) {
    (void)pass;
    if (r->c->op == &OP_EMB_SCALED_FWD)
        qt_embedding_scaled_fwd(D(r, "out"), D(r, "tok"), D(r, "wte"), S(0), (int)S(1), (int)S(2), emb_scale(r), 0);
    else qt_embedding_fwd(D(r, "out"), D(r, "tok"), D(r, "wte"), S(0), (int)S(1), (int)S(2), 0);
}
static const op_def OP_EMB_FWD = {"embedding_fwd", "n c v hot", 0, NULL, emb_fwd_build, emb_fwd_ref, emb_fwd_launch,
                                  NULL, NULL, 0, 0, 0};
static const op_def OP_EMB_SCALED_FWD = {"embedding_scaled_fwd", "n c v hot", 0, NULL, emb_fwd_build, emb_fwd_ref,
                                         emb_fwd_launch, NULL, NULL, 0, 0, 0};

/* dwte (dt2: fp32, or bf16 = the fp32 sum from its old value rounded once) += rows of dout (dt); +range:
 * only table elements [lo, hi) (a rank's piece). fp32 sums in row order on both sides: 1e-6 absolute for
 * FMA-free adds; bf16 adds one rounding (2^-9 relative, 1e-2 as every bf16 output). */
static void emb_range(const op_run *r, size_t *lo, size_t *hi) {
    size_t total = (size_t)S(2) * (size_t)S(1);
    *lo = OPT(O_RANGE) ? total / 3 / 64 * 64 : 0;
    *hi = OPT(O_RANGE) ? (total - total / 5) / 64 * 64 : total;
}
static void emb_bwd_build(op_run *r) {
    tokens(r);
    t_in(r, "dout", r->c->dt, S(0) * S(1), 1.0f);
    double rt = r->c->dt2 == QT_DT_BF16 || OPT(O_G16) ? 1e-2 : 1e-5; /* g16: an fp32 table holding bf16 sums */
    float *dw = t_upd(r, "dwte", r->c->dt2, S(2) * S(1), 0.1f, 1e-6, rt, T_ADD);
    if (OPT(O_RANGE)) /* the whole backward from the same start, for the bitwise comparison in derive */
        memcpy(t_upd(r, "dwte_full", r->c->dt2, S(2) * S(1), 0, 1e-6, rt, T_ADD), dw, (size_t)(S(2) * S(1)) * sizeof *dw);
    t_ws(r, "ws", qt_embedding_bwd_ws_bytes(S(0), (int)S(2)));
}
static void emb_bwd_ref(op_run *r) {
    long n = S(0), c = S(1), k = 0;
    int32_t *tok = op_ints(r, "tok");
    float *dout = op_alloc(n * c);
    for (long i = 0; i < n; i++) /* the valid rows only */
        if (tok_ok(tok[i], S(2))) {
            memcpy(dout + k * c, H(r, "dout") + i * c, (size_t)c * sizeof(float));
            tok[k++] = tok[i];
        }
    qt_ref_embedding_scaled_bwd(REF(r, "dwte"), dout, tok, k, (int)c, (int)S(2), emb_scale(r));
    if (OPT(O_G16)) /* the touched rows stored rounded to bf16 */
        for (long i = 0; i < k; i++)
            for (long j = 0; j < c; j++) REF(r, "dwte")[(long)tok[i] * c + j] = op_round(QT_DT_BF16, REF(r, "dwte")[(long)tok[i] * c + j]);
    if (T(r, "dwte_full")) memcpy(REF(r, "dwte_full"), REF(r, "dwte"), (size_t)(S(2) * c) * sizeof(float));
    free(tok);
    free(dout);
}
static void emb_bwd_launch(op_run *r, int pass) {
    (void)pass;
    size_t lo, hi;
    emb_range(r, &lo, &hi);
    if (r->c->op == &OP_EMB_SCALED_BWD) { /* the plain entries are these with scale 1 */
        if (OPT(O_RANGE)) {
            qt_embedding_scaled_bwd_range(D(r, "dwte"), r->c->dt2, OPT(O_G16) != 0, lo, hi, D(r, "dout"), r->c->dt,
                                          D(r, "tok"), S(0), (int)S(1), (int)S(2), emb_scale(r), D(r, "ws"), 0);
            qt_embedding_scaled_bwd_range(D(r, "dwte_full"), r->c->dt2, OPT(O_G16) != 0, 0, (size_t)S(2) * S(1),
                                          D(r, "dout"), r->c->dt, D(r, "tok"), S(0), (int)S(1), (int)S(2), emb_scale(r),
                                          D(r, "ws"), 0);
        } else
            qt_embedding_scaled_bwd(D(r, "dwte"), r->c->dt2, D(r, "dout"), r->c->dt, D(r, "tok"), S(0), (int)S(1),
                                    (int)S(2), emb_scale(r), D(r, "ws"), 0);
    } else if (OPT(O_RANGE)) {
        qt_embedding_bwd_range(D(r, "dwte"), r->c->dt2, OPT(O_G16) != 0, lo, hi, D(r, "dout"), r->c->dt, D(r, "tok"), S(0),
                               (int)S(1), (int)S(2), D(r, "ws"), 0);
        qt_embedding_bwd_range(D(r, "dwte_full"), r->c->dt2, OPT(O_G16) != 0, 0, (size_t)S(2) * S(1), D(r, "dout"), r->c->dt,
                               D(r, "tok"), S(0), (int)S(1), (int)S(2), D(r, "ws"), 0);
    } else
        qt_embedding_bwd(D(r, "dwte"), r->c->dt2, D(r, "dout"), r->c->dt, D(r, "tok"), S(0), (int)S(1), (int)S(2), D(r, "ws"), 0);
}
/* A rank's piece holds exactly the whole backward's bits (the ranks' pieces must add up to it). */
static void emb_bwd_derive(op_run *r, int pass) {
    size_t lo, hi;
    emb_range(r, &lo, &hi);
    if (!T(r, "dwte_full")) return;
    for (size_t i = lo; i < hi; i++)
        if (op_bits(GOT(r, "dwte", pass)[i]) != op_bits(GOT(r, "dwte_full", pass)[i])) {
            op_fail(r, "  pass %d: range [%zu, %zu): element %zu is %.9g, the whole backward's %.9g", pass, lo, hi, i,
                    GOT(r, "dwte", pass)[i], GOT(r, "dwte_full", pass)[i]);
            return;
        }
}
static int emb_bwd_keep(const op_run *r, const op_tensor *t, long i) {
    size_t lo, hi;
    emb_range(r, &lo, &hi);
    return !strcmp(t->name, "dwte") && ((size_t)i < lo || (size_t)i >= hi);
}
static const op_def OP_EMB_BWD = {"embedding_bwd", "n c v hot", 2, NULL, emb_bwd_build, emb_bwd_ref, emb_bwd_launch,
                                  emb_bwd_derive, emb_bwd_keep, 0, 0, 0};
static const op_def OP_EMB_SCALED_BWD = {"embedding_scaled_bwd", "n c v hot", 2, NULL, emb_bwd_build, emb_bwd_ref,
                                         emb_bwd_launch, emb_bwd_derive, emb_bwd_keep, 0, 0, 0};

/* ---- bias (bias.cu): s = n o ---- */
static void bias_add_build(op_run *r) {
    t_upd(r, "y", QT_DT_BF16, S(0) * S(1), 1.0f, 0, 0, T_ADD);
    t_in(r, "b", QT_DT_BF16, S(1), 1.0f);
}
static void bias_add_ref(op_run *r) {
    for (long i = 0; i < S(0) * S(1); i++) REF(r, "y")[i] = op_round(QT_DT_BF16, REF(r, "y")[i] + H(r, "b")[i % S(1)]);
}
static void bias_add_launch(op_run *r, int pass) {
    (void)pass;
    qt_bias_add(D(r, "y"), D(r, "b"), S(0), (int)S(1), 0);
}
static const op_def OP_BIAS_ADD = {"bias_add", "n o", 0, NULL, bias_add_build, bias_add_ref, bias_add_launch, NULL, NULL, 0, 0, 0};

/* db (dt: fp32, or bf16 rounded once) += column sums of dy: an fp32 sum of n terms ~1 against a double
 * one, error ~ sqrt(n) ulp; bf16 adds one rounding. */
static void bias_bwd_build(op_run *r) {
    t_in(r, "dy", QT_DT_BF16, S(0) * S(1), 1.0f);
    t_upd(r, "db", r->c->dt, S(1), 1.0f, 1e-5 * (1 + S(0) / 1000), r->c->dt == QT_DT_BF16 ? 1e-2 : 1e-5, T_ADD);
    t_ws(r, "ws", qt_colreduce_ws_bytes((int)S(1)));
}
static void bias_bwd_ref(op_run *r) { qt_ref_matmul_bwd(NULL, NULL, REF(r, "db"), H(r, "dy"), NULL, NULL, S(0), 0, (int)S(1)); }
static void bias_bwd_launch(op_run *r, int pass) {
    (void)pass;
    qt_bias_bwd(D(r, "db"), r->c->dt, D(r, "dy"), S(0), (int)S(1), D(r, "ws"), 0);
}
static const op_def OP_BIAS_BWD = {"bias_bwd", "n o", 1, NULL, bias_bwd_build, bias_bwd_ref, bias_bwd_launch, NULL, NULL, 0, 0, 0};

/* ---- RMSNorm (rmsnorm.cu): s = n c; +resid: res = bf16(res + x) first (exact); +amax: fused abs-max of y
 * (dx_bf16 in the backward), NULL in pass 1. The rmsnorm1p ops (Gemma's (1 + w) scale, qt_rmsnorm1p_*) run the
 * same rows against qt_ref_rmsnorm1p_*. ---- */
static const op_def OP_RMS1P_FWD, OP_RMS1P_BWD;
static int rms_1p(const op_run *r) { return r->c->op == &OP_RMS1P_FWD || r->c->op == &OP_RMS1P_BWD; }
static void rms_fwd_build(op_run *r) {
    long nc = S(0) * S(1);
    t_upd(r, "res", QT_DT_BF16, nc, 1.0f, 0, 0, OPT(O_RES) ? T_ADD : 0);
    if (OPT(O_RES)) t_in(r, "x", QT_DT_BF16, nc, 1.0f);
    t_in(r, "w", QT_DT_BF16, S(1), 0.5f);
    t_out(r, "y", QT_DT_BF16, nc, 1e-2, 1e-2, 0);
    t_out(r, "rstd", QT_DT_F32, S(0), 0, 1e-5, 0);
    t_amax(r);
}
static void rms_fwd_ref(op_run *r) {
    float *res = REF(r, "res");
    if (OPT(O_RES))
        for (long i = 0; i < S(0) * S(1); i++) res[i] = op_round(QT_DT_BF16, res[i] + H(r, "x")[i]);
    (rms_1p(r) ? qt_ref_rmsnorm1p_fwd : qt_ref_rmsnorm_fwd)(REF(r, "y"), REF(r, "rstd"), res, H(r, "w"), S(0), (int)S(1),
                                                          1e-6f);
}
static void rms_fwd_launch(op_run *r, int pass) {
    (void)pass;
    (rms_1p(r) ? qt_rmsnorm1p_fwd : qt_rmsnorm_fwd)(D(r, "y"), D(r, "rstd"), D(r, "res"), D(r, "x"), D(r, "w"), S(0),
                                                    (int)S(1), 1e-6f, D(r, "amax"), 0);
}
static void rms_fwd_derive(op_run *r, int pass) { derive_amax_of(r, "y", pass); }
static const op_def OP_RMS_FWD = {"rmsnorm_fwd", "n c", 0, NULL, rms_fwd_build, rms_fwd_ref, rms_fwd_launch,
                                  rms_fwd_derive, NULL, 0, 0, 0};
static const op_def OP_RMS1P_FWD = {"rmsnorm1p_fwd", "n c", 0, NULL, rms_fwd_build, rms_fwd_ref, rms_fwd_launch,
                                    rms_fwd_derive, NULL, 0, 0, 0};

/* dx (dt) += d/dres, dw (fp32) += ...; dx_bf16 = the new dx rounded (exact), amax of it. fp32 dx: a row
 * dot product over c terms in fp32 vs double that cancels two terms ~1: 1e-5 absolute. */
static void rms_bwd_build(op_run *r) {
    long n = S(0), c = S(1);
    float *res = t_in(r, "res", QT_DT_BF16, n * c, 1.0f), *w = t_in(r, "w", QT_DT_BF16, c, 0.5f);
    float *rstd = t_in(r, "rstd", QT_DT_F32, n, 0), *tmp = op_alloc(n * c);
    qt_ref_rmsnorm_fwd(tmp, rstd, res, w, n, (int)c, 1e-6f);
    free(tmp);
    t_in(r, "dy", QT_DT_BF16, n * c, 1.0f);
    double tol = r->c->dt == QT_DT_BF16 ? 1e-2 : 1e-5;
    t_upd(r, "dx", r->c->dt, n * c, 1.0f, tol, tol, T_ADD);
    if (!OPT(O_NODW)) t_upd(r, "dw", r->c->dt2, c, 1.0f, 1e-5, r->c->dt2 == QT_DT_BF16 ? 1e-2 : 1e-5, T_ADD);
    if (OPT(O_AMAX)) t_out(r, "dx_bf16", QT_DT_BF16, n * c, 0, 0, T_PASS0 | T_DERIVED);
    t_amax(r);
    t_ws(r, "ws", qt_colreduce_ws_bytes((int)c));
}
static void rms_bwd_ref(op_run *r) {
    float *dw = T(r, "dw") ? REF(r, "dw") : op_alloc(S(1));
    if (!T(r, "dw")) memset(dw, 0, (size_t)S(1) * sizeof *dw);
    (rms_1p(r) ? qt_ref_rmsnorm1p_bwd : qt_ref_rmsnorm_bwd)(REF(r, "dx"), dw, H(r, "dy"), H(r, "res"), H(r, "w"),
                                                          H(r, "rstd"), S(0), (int)S(1));
    if (!T(r, "dw")) free(dw);
}
static void rms_bwd_launch(op_run *r, int pass) {
    (void)pass;
    (rms_1p(r) ? qt_rmsnorm1p_bwd : qt_rmsnorm_bwd)(D(r, "dx"), r->c->dt, D(r, "dx_bf16"), D(r, "amax"), D(r, "dw"),
                                                    r->c->dt2, D(r, "dy"), D(r, "res"), D(r, "w"), D(r, "rstd"), S(0),
                                                    (int)S(1), D(r, "ws"), 0);
}
static void rms_bwd_derive(op_run *r, int pass) {
    if (!T(r, "dx_bf16")) return;
    const float *dx = GOT(r, "dx", pass);
    for (long i = 0; i < S(0) * S(1); i++) REF(r, "dx_bf16")[i] = op_round(QT_DT_BF16, dx[i]);
    REF(r, "amax")[0] = op_absmax(dx, S(0) * S(1), QT_DT_BF16);
}
static const op_def OP_RMS_BWD = {"rmsnorm_bwd", "n c", 2, NULL, rms_bwd_build, rms_bwd_ref, rms_bwd_launch,
                                  rms_bwd_derive, NULL, 0, 0, 0};
static const op_def OP_RMS1P_BWD = {"rmsnorm1p_bwd", "n c", 2, NULL, rms_bwd_build, rms_bwd_ref, rms_bwd_launch,
                                    rms_bwd_derive, NULL, 0, 0, 0};

/* ---- RoPE (rope.cu). table: s = T d, f = theta; cos/sin in double, rounded once on both sides. ---- */
/* opt >> 16: the qt_rope_type of the row, with parameters under which every band of it shows at the rows'
 * small T: original_max_position_embeddings 32, factor 8 (llama3 1 / 4; yarn's attention factor derived),
 * max_seq_len 16 (dynamic rows run past it, where its base grows). */
#define ROPE_TYPE(t) ((t) << 16)
static void rope_freqs(const op_run *r, int T, int d, double *inv, double *attn) {
    qt_model_cfg c = {.hidden_size = d, .num_heads = 1, .num_kv_heads = 1, .head_dim = d, .max_seq_len = 16,
                      .rope_theta = r->c->f};
    c.rope = (qt_rope_cfg){.type = (qt_rope_type)(r->c->opt >> 16), .factor = 8, .original_max_pos = 32,
                           .low_freq_factor = 1, .high_freq_factor = 4, .truncate = 1};
    qt_rope_inv_freq(&c, T, inv, attn);
}
static void rope_table_build(op_run *r) { t_out(r, "cs", QT_DT_F32, S(0) * S(1), 1e-7, 1e-6, 0); }
static void rope_table_ref(op_run *r) {
    long half = S(1) / 2;
    double inv[QT_ROPE_MAX_HALF], attn;
    rope_freqs(r, (int)S(0), (int)S(1), inv, &attn);
    for (long k = 0; k < S(0) * half; k++) {
        long t = k / half, i = k % half;
        double a = inv[i] * (double)t;
        REF(r, "cs")[2 * k] = (float)(cos(a) * attn);
        REF(r, "cs")[2 * k + 1] = (float)(sin(a) * attn);
    }
}
static void rope_table_launch(op_run *r, int pass) {
    (void)pass;
    double inv[QT_ROPE_MAX_HALF], attn;
    rope_freqs(r, (int)S(0), (int)S(1), inv, &attn);
    qt_rope_table(D(r, "cs"), (int)S(0), (int)S(1), inv, attn, 0);
}
static const op_def OP_ROPE_TABLE = {"rope_table", "T d", 0, "theta", rope_table_build, rope_table_ref,
                                     rope_table_launch, NULL, NULL, 0, 0, 0};

/* fwd / bwd in place on qkv[B,T,(H+2Hkv)*D]: s = B T H Hkv D, f = theta. The v heads keep their bits;
 * the backward's abs-max covers them (the largest value sits in the last v head). */
static const op_def OP_ROPE_BWD;
static void rope_build(op_run *r) {
    long n = S(0) * S(1) * (S(2) + 2 * S(3)) * S(4);
    float *q = t_upd(r, "qkv", QT_DT_BF16, n, 1.0f, 1e-2, 1e-2, 0);
    if (r->c->op == &OP_ROPE_BWD && n > 0) q[n - 1] = -9.0f;
    t_ws(r, "cs", (size_t)S(1) * (size_t)S(4) * sizeof(float));
    if (r->c->op == &OP_ROPE_BWD) t_amax(r);
}
static void rope_ref(op_run *r) {
    double inv[QT_ROPE_MAX_HALF], attn;
    rope_freqs(r, (int)S(1), (int)S(4), inv, &attn);
    if (r->c->op == &OP_ROPE_BWD) qt_ref_rope_bwd(REF(r, "qkv"), (int)S(0), (int)S(1), (int)S(2), (int)S(3), (int)S(4), inv, attn);
    else qt_ref_rope_fwd(REF(r, "qkv"), (int)S(0), (int)S(1), (int)S(2), (int)S(3), (int)S(4), inv, attn);
}
static void rope_launch(op_run *r, int pass) {
    (void)pass;
    double inv[QT_ROPE_MAX_HALF], attn;
    rope_freqs(r, (int)S(1), (int)S(4), inv, &attn);
    qt_rope_table(D(r, "cs"), (int)S(1), (int)S(4), inv, attn, 0);
    if (r->c->op == &OP_ROPE_BWD)
        qt_rope_bwd(D(r, "qkv"), D(r, "cs"), (int)S(0), (int)S(1), (int)S(2), (int)S(3), (int)S(4), D(r, "amax"), 0);
    else
        qt_rope_fwd(D(r, "qkv"), D(r, "cs"), (int)S(0), (int)S(1), (int)S(2), (int)S(3), (int)S(4), 0);
}
static void rope_derive(op_run *r, int pass) { derive_amax_of(r, "qkv", pass); }
static int rope_keep(const op_run *r, const op_tensor *t, long i) {
    long row = (S(2) + 2 * S(3)) * S(4);
    return !strcmp(t->name, "qkv") && (i % row) / S(4) >= S(2) + S(3);
}
static const op_def OP_ROPE_FWD = {"rope_fwd", "B T H Hkv D", 0, "theta", rope_build, rope_ref, rope_launch, NULL,
                                   rope_keep, 0, 0, 0};
static const op_def OP_ROPE_BWD = {"rope_bwd", "B T H Hkv D", 0, "theta", rope_build, rope_ref, rope_launch,
                                   rope_derive, rope_keep, 0, 0, 0};

/* ---- q/k norm (qknorm.cu): s = n H Hkv D. fwd in place on qkv's q and k heads, the pre-norm heads copied to
 * save (exact; T_PASS0: pass 1 passes NULL), rstd (fp32, 1e-5). bwd in place on dqkv from the saved heads,
 * dw (dt: fp32 or bf16; +nodw: NULL) +=, +amax: of the whole dqkv (the last v element is the largest).
 * The v heads keep their bits. ---- */
static const op_def OP_QKN_BWD, OP_QKN1P_FWD, OP_QKN1P_BWD;
/* the (1 + w) form (Gemma 3, qt_qknorm1p_*) against qt_ref_qknorm1p_* */
static int qkn_1p(const op_run *r) { return r->c->op == &OP_QKN1P_FWD || r->c->op == &OP_QKN1P_BWD; }
static long qkn_row(const op_run *r) { return (S(1) + 2 * S(2)) * S(3); }
static long qkn_heads(const op_run *r) { return S(1) + S(2); }
static int qkn_keep(const op_run *r, const op_tensor *t, long i) {
    return (!strcmp(t->name, "qkv") || !strcmp(t->name, "dqkv")) && (i % qkn_row(r)) / S(3) >= qkn_heads(r);
}
static void qkn_fwd_build(op_run *r) {
    long n = S(0), nh = qkn_heads(r);
    t_upd(r, "qkv", QT_DT_BF16, n * qkn_row(r), 1.0f, 1e-2, 1e-2, 0);
    t_in(r, "w", QT_DT_BF16, 2 * S(3), 0.5f);
    t_out(r, "save", QT_DT_BF16, n * nh * S(3), 0, 0, T_PASS0);
    t_out(r, "rstd", QT_DT_F32, n * nh, 0, 1e-5, 0);
}
static void qkn_fwd_ref(op_run *r) {
    long n = S(0), nhd = qkn_heads(r) * S(3);
    const float *x = H(r, "qkv");
    (qkn_1p(r) ? qt_ref_qknorm1p_fwd : qt_ref_qknorm_fwd)(REF(r, "qkv"), REF(r, "rstd"), x, H(r, "w"), n, (int)S(1),
                                                          (int)S(2), (int)S(3), 1e-6f);
    for (long k = 0; k < n; k++) memcpy(REF(r, "save") + k * nhd, x + k * qkn_row(r), (size_t)nhd * sizeof(float));
}
static void qkn_fwd_launch(op_run *r, int pass) {
    (void)pass;
    (qkn_1p(r) ? qt_qknorm1p_fwd : qt_qknorm_fwd)(D(r, "qkv"), D(r, "save"), D(r, "rstd"), D(r, "w"), S(0), (int)S(1),
                                                  (int)S(2), (int)S(3), 1e-6f, 0);
}
static const op_def OP_QKN_FWD = {"qknorm_fwd", "n H Hkv D", 0, NULL, qkn_fwd_build, qkn_fwd_ref, qkn_fwd_launch,
                                  NULL, qkn_keep, 0, 0, 0};
static const op_def OP_QKN1P_FWD = {"qknorm1p_fwd", "n H Hkv D", 0, NULL, qkn_fwd_build, qkn_fwd_ref, qkn_fwd_launch,
                                    NULL, qkn_keep, 0, 0, 0};

static void qkn_bwd_build(op_run *r) {
    long n = S(0), nh = qkn_heads(r), D = S(3), all = n * qkn_row(r);
    float *x = t_in(r, "save", QT_DT_BF16, n * nh * D, 1.0f);
    t_in(r, "w", QT_DT_BF16, 2 * D, 0.5f);
    float *rstd = t_in(r, "rstd", QT_DT_F32, n * nh, 0);
    for (long k = 0; k < n * nh; k++) { /* the forward's rstd of the saved heads */
        double ss = 0;
        for (long i = 0; i < D; i++) ss += (double)x[k * D + i] * x[k * D + i];
        rstd[k] = (float)(1.0 / sqrt(ss / D + 1e-6));
    }
    float *dy = t_upd(r, "dqkv", QT_DT_BF16, all, 1.0f, 1e-2, 1e-2, 0);
    if (OPT(O_AMAX) && all > 0) dy[all - 1] = -9.0f;
    if (!OPT(O_NODW)) t_upd(r, "dw", r->c->dt, 2 * D, 1.0f, 1e-4, r->c->dt == QT_DT_BF16 ? 1e-2 : 1e-4, T_ADD);
    t_amax(r);
    t_ws(r, "ws", qt_qknorm_ws_bytes((int)D));
}
static void qkn_bwd_ref(op_run *r) {
    long n = S(0), nhd = qkn_heads(r) * S(3), row = qkn_row(r);
    float *xf = op_alloc(n * row), *dw = T(r, "dw") ? REF(r, "dw") : op_alloc(2 * S(3));
    memset(xf, 0, (size_t)(n * row) * sizeof *xf);
    for (long k = 0; k < n; k++) memcpy(xf + k * row, H(r, "save") + k * nhd, (size_t)nhd * sizeof *xf);
    (qkn_1p(r) ? qt_ref_qknorm1p_bwd : qt_ref_qknorm_bwd)(REF(r, "dqkv"), dw, H(r, "dqkv"), xf, H(r, "w"), H(r, "rstd"), n,
                                                          (int)S(1), (int)S(2), (int)S(3));
    free(xf);
    if (!T(r, "dw")) free(dw);
}
static void qkn_bwd_launch(op_run *r, int pass) {
    (void)pass;
    (qkn_1p(r) ? qt_qknorm1p_bwd : qt_qknorm_bwd)(D(r, "dqkv"), D(r, "dw"), r->c->dt, D(r, "save"), D(r, "w"), D(r, "rstd"),
                                                  S(0), (int)S(1), (int)S(2), (int)S(3), D(r, "amax"), D(r, "ws"), 0);
}
static void qkn_bwd_derive(op_run *r, int pass) { derive_amax_of(r, "dqkv", pass); }
static const op_def OP_QKN_BWD = {"qknorm_bwd", "n H Hkv D", 1, NULL, qkn_bwd_build, qkn_bwd_ref, qkn_bwd_launch,
                                  qkn_bwd_derive, qkn_keep, 0, 0, 0};
static const op_def OP_QKN1P_BWD = {"qknorm1p_bwd", "n H Hkv D", 1, NULL, qkn_bwd_build, qkn_bwd_ref, qkn_bwd_launch,
                                    qkn_bwd_derive, qkn_keep, 0, 0, 0};

/* ---- SwiGLU (swiglu.cu): s = n f; +inplace: dgu written over gu. ---- */
static void swiglu_fwd_build(op_run *r) {
    t_in(r, "gu", QT_DT_BF16, S(0) * 2 * S(1), 2.0f);
    t_out(r, "out", QT_DT_BF16, S(0) * S(1), 1e-2, 1e-2, 0);
    t_amax(r);
}
static void swiglu_fwd_ref(op_run *r) { qt_ref_swiglu_fwd(REF(r, "out"), H(r, "gu"), S(0), (int)S(1)); }
static void swiglu_fwd_launch(op_run *r, int pass) {
    (void)pass;
    qt_swiglu_fwd(D(r, "out"), D(r, "gu"), S(0), (int)S(1), D(r, "amax"), 0);
}
static void swiglu_fwd_derive(op_run *r, int pass) { derive_amax_of(r, "out", pass); }
static const op_def OP_SWIGLU_FWD = {"swiglu_fwd", "n f", 0, NULL, swiglu_fwd_build, swiglu_fwd_ref, swiglu_fwd_launch,
                                     swiglu_fwd_derive, NULL, 0, 0, 0};

static const char *swiglu_dgu(const op_run *r) { return OPT(O_INPLACE) ? "gu" : "dgu"; }
static void swiglu_bwd_build(op_run *r) {
    long n2f = S(0) * 2 * S(1);
    if (OPT(O_INPLACE)) t_upd(r, "gu", QT_DT_BF16, n2f, 2.0f, 1e-2, 1e-2, 0);
    else t_in(r, "gu", QT_DT_BF16, n2f, 2.0f), t_out(r, "dgu", QT_DT_BF16, n2f, 1e-2, 1e-2, 0);
    t_in(r, "dout", QT_DT_BF16, S(0) * S(1), 1.0f);
    t_amax(r);
}
static void swiglu_bwd_ref(op_run *r) {
    qt_ref_swiglu_bwd(REF(r, swiglu_dgu(r)), H(r, "dout"), H(r, "gu"), S(0), (int)S(1));
}
static void swiglu_bwd_launch(op_run *r, int pass) {
    (void)pass;
    qt_swiglu_bwd(D(r, swiglu_dgu(r)), D(r, "dout"), D(r, "gu"), S(0), (int)S(1), D(r, "amax"), 0);
}
static void swiglu_bwd_derive(op_run *r, int pass) { derive_amax_of(r, swiglu_dgu(r), pass); }
static const op_def OP_SWIGLU_BWD = {"swiglu_bwd", "n f", 0, NULL, swiglu_bwd_build, swiglu_bwd_ref, swiglu_bwd_launch,
                                     swiglu_bwd_derive, NULL, 0, 0, 0};

/* SwiGLU backward that also writes h (the SwiGLU output) over dh: a bf16 backward with the SwiGLU recomputed.
 * dgu as swiglu_bwd (+inplace, +amax); "dh" goes in as the gradient and must come out as qt_swiglu_fwd's h.
 * Bitwise against qt_swiglu_fwd + qt_swiglu_bwd: test_kernels swiglu_bwd_h_bitwise. */
static void swiglu_bwd_h_build(op_run *r) {
    long n2f = S(0) * 2 * S(1);
    if (OPT(O_INPLACE)) t_upd(r, "gu", QT_DT_BF16, n2f, 2.0f, 1e-2, 1e-2, 0);
    else t_in(r, "gu", QT_DT_BF16, n2f, 2.0f), t_out(r, "dgu", QT_DT_BF16, n2f, 1e-2, 1e-2, 0);
    t_upd(r, "dh", QT_DT_BF16, S(0) * S(1), 1.0f, 1e-2, 1e-2, 0);
    t_amax(r);
}
static void swiglu_bwd_h_ref(op_run *r) {
    qt_ref_swiglu_bwd(REF(r, swiglu_dgu(r)), H(r, "dh"), H(r, "gu"), S(0), (int)S(1));
    qt_ref_swiglu_fwd(REF(r, "dh"), H(r, "gu"), S(0), (int)S(1));
}
static void swiglu_bwd_h_launch(op_run *r, int pass) {
    (void)pass;
    qt_swiglu_bwd_h(D(r, swiglu_dgu(r)), D(r, "dh"), D(r, "gu"), S(0), (int)S(1), D(r, "amax"), 0);
}
static const op_def OP_SWIGLU_BWD_H = {"swiglu_bwd_h", "n f", 0, NULL, swiglu_bwd_h_build, swiglu_bwd_h_ref,
                                       swiglu_bwd_h_launch, swiglu_bwd_derive, NULL, 0, 0, 0};

/* ---- fused LM-head loss (lmhead_loss.cu): s = n v impl cap (impl 0 = qt_lmhead_loss itself, else the
 * qt_lmhead_impl asked of qt_lmhead_loss_with; cap > 0: Gemma's final-logit soft-cap, qt_lmhead_loss_softcap),
 * f = std of the logits. Row 1 is ignored (tgt -1); +bad: row 3 has tgt = v (loss NaN, dlogits and lse 0).
 * lse is NULL in pass 1. ---- */
static float lm_scale(op_run *r) {
    long valid = 0;
    for (long i = 0; i < S(0); i++) valid += tok_ok((long)H(r, "tgt")[i], S(1));
    return 1.0f / (float)(valid ? valid : 1);
}
static void lm_build(op_run *r) {
    long n = S(0), v = S(1);
    t_upd(r, "logits", QT_DT_BF16, n * v, r->c->f, 0, 1e-2, 0);
    t_out(r, "loss", QT_DT_F32, n, 1e-5, 1e-5, 0);
    t_out(r, "lse", QT_DT_F32, n, 1e-5, 1e-5, T_PASS0);
    float *tgt = t_in(r, "tgt", DT_I32, n, 0);
    for (long i = 0; i < n; i++) tgt[i] = i == 1 ? -1.0f : OPT(O_BAD) && i == 3 ? (float)v : (float)qt_rng_below(&r->rng, (uint64_t)v);
    /* dlogits: bf16 rounding of scale*p with p down to ~1e-8: atol far below scale/v */
    T(r, "logits")->atol = 1e-3 * lm_scale(r) / (double)v;
}
static void lm_ref(op_run *r) {
    long n = S(0), v = S(1);
    int32_t *tgt = op_ints(r, "tgt");
    for (long i = 0; i < n; i++) tgt[i] = tok_ok(tgt[i], v) ? tgt[i] : -1; /* the bad row as ignored ... */
    float cap = (float)S(3), zt;
    qt_ref_cross_entropy_capped_fwd(REF(r, "loss"), H(r, "logits"), tgt, n, (int)v, cap);
    qt_ref_cross_entropy_capped_bwd(REF(r, "logits"), H(r, "logits"), tgt, n, (int)v, lm_scale(r), cap);
    for (long i = 0; i < n; i++) {
        zt = tgt[i] < 0 ? 0.0f : H(r, "logits")[i * v + tgt[i]];
        if (cap != 0.0f) zt = cap * tanhf(zt / cap); /* the capped target logit: lse = loss + z[tgt] */
        REF(r, "lse")[i] = tgt[i] < 0 ? 0.0f : REF(r, "loss")[i] + zt;
        if ((long)H(r, "tgt")[i] >= v) REF(r, "loss")[i] = NAN; /* ... but its loss NaN */
    }
    free(tgt);
}
static void lm_launch(op_run *r, int pass) {
    (void)pass;
    long v = S(1);
    qt_lmhead_impl impl = (qt_lmhead_impl)S(2);
    if (impl == QT_LMHEAD_AUTO && !S(3)) {
        qt_lmhead_loss(D(r, "logits"), D(r, "loss"), D(r, "lse"), D(r, "tgt"), S(0), (int)v, lm_scale(r), 0);
        return;
    }
    qt_lmhead_impl ran = S(3) ? qt_lmhead_loss_softcap(impl, D(r, "logits"), D(r, "loss"), D(r, "lse"), D(r, "tgt"),
                                                       S(0), (int)v, lm_scale(r), (float)S(3), 0)
                              : qt_lmhead_loss_with(impl, D(r, "logits"), D(r, "loss"), D(r, "lse"), D(r, "tgt"), S(0),
                                                    (int)v, lm_scale(r), 0);
    if (impl == QT_LMHEAD_AUTO) impl = QT_LMHEAD_TWO_PASS; /* what AUTO runs */
    int dev = 0, major = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    /* the cluster kernels run on sm_90+ for v <= 262144 and fall back to the two-pass kernel elsewhere */
    qt_lmhead_impl want = impl != QT_LMHEAD_TWO_PASS && major >= 9 && v <= 262144 ? impl : QT_LMHEAD_TWO_PASS;
    if (ran != want) op_fail(r, "  asked for implementation %d on sm_%d, %d ran (expected %d)", impl, major, ran, want);
}
static const op_def OP_LMHEAD = {"lmhead_loss", "n v impl cap", 0, "std", lm_build, lm_ref, lm_launch, NULL, NULL, 0, 0,
                                 1 << 2};

/* *sum (fp64) += sum of x (fp32) in a fixed order; compared after rounding to fp32. */
static void sum_build(op_run *r) {
    t_in(r, "x", QT_DT_F32, S(0), 3.0f);
    t_upd(r, "sum", DT_F64, 1, 0, 0, 1e-6, T_ADD)[0] = 0.5f;
}
static void sum_ref(op_run *r) {
    double s = H(r, "sum")[0];
    for (long i = 0; i < S(0); i++) s += H(r, "x")[i];
    REF(r, "sum")[0] = (float)s;
}
static void sum_launch(op_run *r, int pass) {
    (void)pass;
    qt_sum_f32(D(r, "sum"), D(r, "x"), S(0), 0);
}
static const op_def OP_SUM = {"sum_f32", "n", 0, NULL, sum_build, sum_ref, sum_launch, NULL, NULL, 0, 0, 0};

/* ---- AdamW (adamw.cu) over the flat array ATAB: s = steps stochastic; dt = m/v dtype; dt2 = fp32:
 * master weights (and their RNE bf16 copy, exact) / bf16: bf16 weights only (stochastic rounding: one of
 * the two bf16 neighbours of the fp32 result, so within 2^-7 relative, unbiased); f = grad scale (0: NULL).
 * Elements outside ATAB (alignment padding) keep their bits. The last tensor starts off a multiple of 4:
 * scalar head, groups of 4, scalar tail. fp32 paths: the CPU's operations in order: 1e-6 relative. ---- */
#define NT 5
static const qt_adamw_tensor ATAB[NT] = {{0, 5000, 0.1f, 0, 0}, {5056, 7, 0.0f, 5056, 0}, {5120, 10000, 0.1f, 5120, 0},
                                         {15168, 1, 0.0f, 15168, 0}, {15171, 14, 0.1f, 15171, 0}};
#define ATOT 15232L
static const qt_adamw_args ADAM_ARGS = {1e-2f, 0.9f, 0.95f, 1e-8f, 1, 1234, 0, 0, 0, NULL};
static int adam_pad(long i) {
    for (int k = 0; k < NT; k++)
        if ((size_t)i >= ATAB[k].offset && (size_t)i < ATAB[k].offset + ATAB[k].numel) return 0;
    return 1;
}
static void adam_build(op_run *r) {
    int master = r->c->dt2 == QT_DT_F32;
    double mt = r->c->dt == QT_DT_BF16 ? 1e-2 : 1e-6;
    float *w = t_upd(r, master ? "master" : "w", r->c->dt2, ATOT, 0.5f, 0, master ? 1e-6 : 0.0078125, 0);
    for (long i = 0; i < ATOT; i++)
        if (adam_pad(i)) w[i] = 7.0f;
    t_upd(r, "m", r->c->dt, ATOT, 0.1f, 1e-6, mt, 0);
    float *v = t_upd(r, "v", r->c->dt, ATOT, 0.1f, 1e-8, mt, 0);
    for (long i = 0; i < ATOT; i++) v[i] = op_round(r->c->dt, v[i] * v[i]);
    t_in(r, "g", OPT(O_G16) ? QT_DT_BF16 : QT_DT_F32, S(0) * ATOT, 1.0f); /* +g16: bf16 gradients */
    if (r->c->f != 0) t_in(r, "gscale", QT_DT_F32, 1, 0)[0] = r->c->f;
    if (master) t_out(r, "w_bf16", QT_DT_BF16, ATOT, 0, 0, T_DERIVED), t_out(r, "absmax", QT_DT_F32, NT, 0, 0, T_DERIVED);
}
static void adam_ref(op_run *r) {
    qt_adamw_hp hp = {ADAM_ARGS.lr, ADAM_ARGS.beta1, ADAM_ARGS.beta2, ADAM_ARGS.eps, 0};
    float *w = REF(r, r->c->dt2 == QT_DT_F32 ? "master" : "w"), *m = REF(r, "m"), *v = REF(r, "v");
    for (long t = 1; t <= S(0); t++)
        for (int k = 0; k < NT; k++) {
            size_t o = ATAB[k].offset;
            qt_adamw_cpu(w + o, H(r, "g") + (t - 1) * ATOT + o, m + o, v + o, ATAB[k].numel, &hp, ATAB[k].wd, t,
                         r->c->f != 0 ? r->c->f : 1.0f);
        }
}
static void adam_launch(op_run *r, int pass) {
    (void)pass;
    qt_adamw_plan *p = qt_adamw_plan_create(ATAB, NT);
    qt_adamw_args a = ADAM_ARGS;
    a.stochastic = (int)S(1);
    for (long t = 1; t <= S(0); t++) {
        a.t = t;
        qt_dtype gdt = OPT(O_G16) ? QT_DT_BF16 : QT_DT_F32;
        qt_adamw_step(p, D(r, r->c->dt2 == QT_DT_F32 ? "w_bf16" : "w"), D(r, "master"),
                      (char *)D(r, "g") + (size_t)(t - 1) * ATOT * qt_dtype_size(gdt), gdt,
                      D(r, "m"), r->c->dt, D(r, "v"), r->c->dt, D(r, "gscale"), D(r, "absmax"), &a, 0);
    }
    cudaDeviceSynchronize();
    qt_adamw_plan_free(p);
}
static void adam_derive(op_run *r, int pass) {
    if (T(r, "w_bf16")) { /* the bf16 copy is the RNE rounding of the new master; absmax its max per tensor */
        const float *w = GOT(r, "master", pass);
        for (long i = 0; i < ATOT; i++) REF(r, "w_bf16")[i] = op_round(QT_DT_BF16, w[i]);
        for (int k = 0; k < NT; k++)
            REF(r, "absmax")[k] = op_absmax(w + ATAB[k].offset, (long)ATAB[k].numel, QT_DT_BF16);
    }
    if (S(1) && pass == 0) { /* stochastic rounding: as many up as down */
        long up = 0, down = 0;
        for (long i = 0; i < ATOT; i++) {
            float g = GOT(r, "w", 0)[i], f = REF(r, "w")[i];
            if (!adam_pad(i)) up += g > f, down += g < f;
        }
        if (!(up > ATOT / 4 && down > ATOT / 4)) op_fail(r, "  stochastic rounding biased: %ld up, %ld down", up, down);
    }
}
static int adam_keep(const op_run *r, const op_tensor *t, long i) {
    (void)r;
    return t->n == ATOT && adam_pad(i);
}
static const op_def OP_ADAMW = {"adamw", "steps sr", 2, "gscale", adam_build, adam_ref, adam_launch, adam_derive,
                                adam_keep, 0, 0, 0};

/* ---- gradient norm (norm.cu): s = n parts; f = max_norm as a multiple of the norm. parts 0: qt_grad_norm;
 * 1 or 2: qt_grad_sumsq over that many slices, then qt_clip_from_sumsq (with one part also qt_grad_norm,
 * which must give the same bits). Squares summed in fp64 on both sides: 1e-6. ---- */
static long gn_cut(const op_run *r) { return S(1) == 2 ? S(0) / 2 / 32 * 32 : S(0); }
static void gn_build(op_run *r) {
    t_in(r, "g", r->c->dt, S(0), 0.01f); /* fp32, or bf16 gradients (read exactly) */
    t_out(r, "norm_scale", QT_DT_F32, 2, 0, 1e-6, 0);
    if (S(1)) t_out(r, "sumsq", DT_F64, S(1), 0, 1e-6, 0);
    if (S(1) == 1) t_out(r, "direct", QT_DT_F32, 2, 0, 0, T_DERIVED);
    t_ws(r, "ws", qt_grad_norm_ws_bytes());
}
static float gn_max(op_run *r) { return (float)(r->c->f * qt_grad_norm_cpu(H(r, "g"), (size_t)S(0))); }
static void gn_ref(op_run *r) {
    double norm = qt_grad_norm_cpu(H(r, "g"), (size_t)S(0));
    REF(r, "norm_scale")[0] = (float)norm;
    REF(r, "norm_scale")[1] = qt_clip_scale(norm, gn_max(r));
    for (long k = 0; k < S(1); k++) {
        double s = 0;
        for (long i = k ? gn_cut(r) : 0; i < (k + 1 < S(1) ? gn_cut(r) : S(0)); i++) s += (double)H(r, "g")[i] * H(r, "g")[i];
        REF(r, "sumsq")[k] = (float)s;
    }
}
static void gn_launch(op_run *r, int pass) {
    (void)pass;
    float *out = D(r, "norm_scale"), *g = D(r, "g");
    if (!S(1)) {
        qt_grad_norm(out, out + 1, g, r->c->dt, (size_t)S(0), gn_max(r), D(r, "ws"), 0);
        return;
    }
    double *sq = D(r, "sumsq");
    size_t es = qt_dtype_size(r->c->dt);
    qt_grad_sumsq(sq, g, r->c->dt, (size_t)gn_cut(r), D(r, "ws"), 0);
    if (S(1) == 2) qt_grad_sumsq(sq + 1, (char *)g + gn_cut(r) * es, r->c->dt, (size_t)(S(0) - gn_cut(r)), D(r, "ws"), 0);
    qt_clip_from_sumsq(out, out + 1, sq, (int)S(1), gn_max(r), 0);
    if (S(1) == 1)
        qt_grad_norm((float *)D(r, "direct"), (float *)D(r, "direct") + 1, g, r->c->dt, (size_t)S(0), gn_max(r), D(r, "ws"), 0);
}
static void gn_derive(op_run *r, int pass) {
    if (T(r, "direct")) memcpy(REF(r, "direct"), GOT(r, "norm_scale", pass), 2 * sizeof(float));
}
static const op_def OP_GRAD_NORM = {"grad_norm", "n parts", 1, "max_norm", gn_build, gn_ref, gn_launch, gn_derive,
                                    NULL, 0, 0, 0};

#endif
