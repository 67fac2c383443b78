/* op_defs_nf4.h — the NF4 kernels (cuda/nf4.cu, include/qt_nf4.h) for the op table of tests/test_ops_gpu.c (see
 * op_harness.h for what a row checks). Reference: src/ref/nf4_ref.c; every output bit for bit (its arithmetic is
 * the kernels', one IEEE fp32 operation per step). Packed codes are uint8 tensors (DT_U8).
 *
 * s = rows cols dq: a [rows, cols] matrix; dq 1: double-quantized block scales (qabsmax, absmax2, offset), 0: fp32
 * absmax. dt: the dequant's output (bf16 / fp32), the quantize's input.
 *
 * Planted formulas (test_nf4_planted, on the CPU): a device result with the nibbles swapped, the offset left out,
 * the scale taken with an FMA (dyn * absmax2 + offset contracted), or a block of zeros coded 0x77 (bitsandbytes'
 * CPU backend), rounded as the device stores it, must fail its row. */
#ifndef OP_DEFS_NF4_H
#define OP_DEFS_NF4_H

#include "op_defs_gemma.h"
#include "qt_nf4.h"

static long nf4_n(op_run *r) { return S(0) * S(1); }

/* Random bytes (every code pair) into a DT_U8 input. */
static void t_bytes(op_run *r, const char *name, long n) {
    float *h = t_in(r, name, DT_U8, n, 0);
    for (long i = 0; i < n; i++) h[i] = (float)qt_rng_below(&r->rng, 256);
}
/* Positive block scales spread over 1e-3..1e2. */
static void t_scales(op_run *r, const char *name, long n) {
    float *h = t_in(r, name, QT_DT_F32, n, 0);
    for (long i = 0; i < n; i++)
        h[i] = (float)(pow(10.0, -3.0 + 5.0 * qt_rng_uniform(&r->rng)) * (0.5 + qt_rng_uniform(&r->rng)));
}

/* ---- dequant: y[rows, cols] (dt) from codes and the scales ---- */
static void nf4_dequant_build(op_run *r) {
    long n = nf4_n(r), nb = qt_nf4_blocks(n);
    t_bytes(r, "codes", qt_nf4_code_bytes(n));
    if (S(2)) {
        t_bytes(r, "qabsmax", nb);
        t_scales(r, "absmax2", qt_nf4_blocks2(n));
        t_scales(r, "offset", 1);
    } else {
        t_scales(r, "absmax", nb);
    }
    t_out(r, "y", r->c->dt, n, 0, 0, 0);
}
/* The block scales the kernel uses (caller frees). */
static float *nf4_scales(op_run *r) {
    long nb = qt_nf4_blocks(nf4_n(r));
    float *a = op_alloc(nb);
    if (!S(2)) {
        memcpy(a, H(r, "absmax"), (size_t)nb * sizeof *a);
        return a;
    }
    uint8_t *q = malloc((size_t)nb);
    QT_CHECK(q, "out of host memory");
    for (long b = 0; b < nb; b++) q[b] = (uint8_t)H(r, "qabsmax")[b];
    qt_nf4_absmax_ref(a, q, H(r, "absmax2"), H(r, "offset")[0], nb);
    free(q);
    return a;
}
static uint8_t *nf4_codes(op_run *r, const char *name) {
    op_tensor *t = T(r, name);
    uint8_t *c = malloc((size_t)t->n);
    QT_CHECK(c, "out of host memory");
    for (long i = 0; i < t->n; i++) c[i] = (uint8_t)t->h[i];
    return c;
}
/* y of the codes and scales, rounded to the row's dtype. */
static void nf4_dequant_into(op_run *r, float *y, const uint8_t *codes, const float *absmax) {
    long n = nf4_n(r);
    void *raw = malloc((size_t)n * (size_t)op_es(r->c->dt));
    QT_CHECK(raw, "out of host memory");
    qt_nf4_dequant_ref(r->c->dt, raw, codes, absmax, n);
    op_decode(r->c->dt, raw, n, y);
    free(raw);
}
static void nf4_dequant_ref(op_run *r) {
    uint8_t *codes = nf4_codes(r, "codes");
    float *a = nf4_scales(r);
    nf4_dequant_into(r, REF(r, "y"), codes, a);
    free(codes);
    free(a);
}
static void nf4_dequant_launch(op_run *r, int pass) {
    (void)pass;
    qt_nf4_dequant(r->c->dt, D(r, "y"), D(r, "codes"), D(r, "absmax"), D(r, "qabsmax"), D(r, "absmax2"),
                   D(r, "offset"), S(0), S(1), 0);
}
static const op_def OP_NF4_DEQUANT = {"nf4_dequant", "rows cols dq", 1, NULL, nf4_dequant_build, nf4_dequant_ref,
                                      nf4_dequant_launch, NULL, NULL, 0, 0, 0};

/* ---- quantize: x[rows, cols] (dt) -> codes, absmax (+ qabsmax, absmax2, offset). x: N(0, 1) times 10^u per
 * block of 64 (u in [-3, 2]); a block of zeros when there are three blocks or more. ---- */
static void nf4_quant_build(op_run *r) {
    long n = nf4_n(r), nb = qt_nf4_blocks(n);
    float *x = t_in(r, "x", r->c->dt, n, 1.0f), scale = 1.0f;
    for (long i = 0; i < n; i++) {
        if (i % QT_NF4_BLOCK == 0) scale = (float)pow(10.0, -3.0 + 5.0 * qt_rng_uniform(&r->rng));
        x[i] = nb >= 3 && i / QT_NF4_BLOCK == 1 ? 0.0f : x[i] * scale;
    }
    t_out(r, "codes", DT_U8, qt_nf4_code_bytes(n), 0, 0, 0);
    t_out(r, "absmax", QT_DT_F32, nb, 0, 0, 0);
    if (S(2)) {
        t_out(r, "qabsmax", DT_U8, nb, 0, 0, 0);
        t_out(r, "absmax2", QT_DT_F32, qt_nf4_blocks2(n), 0, 0, 0);
        t_out(r, "offset", QT_DT_F32, 1, 0, 0, 0);
    }
}
static void nf4_quant_ref(op_run *r) {
    long n = nf4_n(r), nb = qt_nf4_blocks(n);
    uint8_t *codes = malloc((size_t)qt_nf4_code_bytes(n)), *q = malloc((size_t)nb);
    char err[256];
    QT_CHECK(codes && q, "out of host memory");
    /* x holds values exact in dt: the fp32 reference reads the same numbers */
    QT_CHECK(!qt_nf4_quantize_ref(QT_DT_F32, H(r, "x"), n, codes, REF(r, "absmax"), "x", err, sizeof err), "%s", err);
    for (long i = 0; i < qt_nf4_code_bytes(n); i++) REF(r, "codes")[i] = codes[i];
    if (S(2)) {
        qt_nf4_double_quant_ref(REF(r, "absmax"), nb, q, REF(r, "absmax2"), REF(r, "offset"));
        for (long b = 0; b < nb; b++) REF(r, "qabsmax")[b] = q[b];
    }
    free(codes);
    free(q);
}
static void nf4_quant_launch(op_run *r, int pass) {
    (void)pass;
    qt_nf4_quantize(r->c->dt, D(r, "x"), S(0), S(1), D(r, "codes"), D(r, "absmax"), D(r, "qabsmax"), D(r, "absmax2"),
                    D(r, "offset"), 0);
}
static const op_def OP_NF4_QUANT = {"nf4_quantize", "rows cols dq", 1, NULL, nf4_quant_build, nf4_quant_ref,
                                    nf4_quant_launch, NULL, NULL, 0, 0, 0};

/* ---- planted formulas (CPU): each must fail its row ---- */

static void plant_nf4_swapped(op_run *r, float *out) {
    uint8_t *codes = nf4_codes(r, "codes");
    float *a = nf4_scales(r);
    for (long i = 0; i < T(r, "codes")->n; i++) codes[i] = (uint8_t)(codes[i] << 4 | codes[i] >> 4);
    nf4_dequant_into(r, out, codes, a);
    free(codes);
    free(a);
}
static void plant_nf4_no_offset(op_run *r, float *out) {
    float keep = H(r, "offset")[0];
    H(r, "offset")[0] = 0.0f;
    float *a = nf4_scales(r);
    H(r, "offset")[0] = keep;
    uint8_t *codes = nf4_codes(r, "codes");
    nf4_dequant_into(r, out, codes, a);
    free(codes);
    free(a);
}
static void plant_nf4_fma(op_run *r, float *out) {
    long nb = qt_nf4_blocks(nf4_n(r));
    float *a = op_alloc(nb);
    for (long b = 0; b < nb; b++)
        a[b] = fmaf(qt_nf4_dyn_value((int)H(r, "qabsmax")[b]), H(r, "absmax2")[b / QT_NF4_BLOCK2], H(r, "offset")[0]);
    uint8_t *codes = nf4_codes(r, "codes");
    nf4_dequant_into(r, out, codes, a);
    free(codes);
    free(a);
}
static void plant_nf4_zero_block_77(op_run *r, float *out) {
    memcpy(out, REF(r, "codes"), (size_t)T(r, "codes")->n * sizeof *out);
    for (long k = QT_NF4_BLOCK / 2; k < QT_NF4_BLOCK; k++) out[k] = 0x77;
}

static void test_nf4_planted(void) {
    static const op_case dq = {&OP_NF4_DEQUANT, {33, 1000, 1}, QT_DT_F32, 0, 0, 0, 0};
    static const op_case db = {&OP_NF4_DEQUANT, {7, 13, 1}, QT_DT_BF16, 0, 0, 0, 0};
    static const op_case qz = {&OP_NF4_QUANT, {3, 100, 1}, QT_DT_BF16, 0, 0, 0, 0};
    op_expect_planted(&db, "y", plant_nf4_swapped, "nibbles swapped");
    op_expect_planted(&db, "y", plant_nf4_no_offset, "the scales without the offset");
    op_expect_planted(&dq, "y", plant_nf4_fma, "the scales through an FMA");
    op_expect_planted(&qz, "codes", plant_nf4_zero_block_77, "a block of zeros coded 0x77");
}

#endif
