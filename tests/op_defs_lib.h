/* op_defs_lib.h — the ops of qt_quant.h (cuda/quant.cu), qt_matmul.h (cuBLASLt) and qt_attention.h (cuDNN)
 * for the op table of tests/test_ops_gpu.c. References: the CPU fp8 codec (src/ref/fp8_ref.c, itself checked
 * against cuda_fp8.h by test_quant), qt_ref_matmul_*, qt_ref_attention_*, and an fp64 dot product of the
 * decoded fp8 values for the fp8 GEMM (written here: the CPU trainer has no fp8 GEMM). */
#ifndef OP_DEFS_LIB_H
#define OP_DEFS_LIB_H

#include <float.h>

#include "op_defs_kernels.h"
#include "qt_attention.h"
#include "qt_matmul.h"

/* A float with random sign, exponent in [emin, emax] and random mantissa. */
static float rand_wide(qt_rng *g, int emin, int emax) {
    float v = ldexpf(1.0f + (float)qt_rng_uniform(g), emin + (int)qt_rng_below(g, (uint64_t)(emax - emin + 1)));
    return qt_rng_below(g, 2) ? -v : v;
}

/* ---- abs-max (quant.cu): s = n special (1: an Inf, 2: a -NaN at a random place); dt = x's dtype;
 * +acc: max with the previous value f * max|x| (2: it stays, 0.5: it is raised). Bitwise. ---- */
static void amax_build(op_run *r) {
    long n = S(0);
    float *x = t_in(r, "x", r->c->dt, n, 0);
    for (long i = 0; i < n; i++) x[i] = op_round(r->c->dt, rand_wide(&r->rng, -20, 10));
    long at = n ? (long)qt_rng_below(&r->rng, (uint64_t)n) : 0;
    if (n && S(1) == 1) x[at] = INFINITY;
    if (n && S(1) == 2) x[at] = op_round(r->c->dt, -NAN);
    if (OPT(O_ACC)) t_upd(r, "amax", QT_DT_F32, 1, 0, 0, 0, 0)[0] = r->c->f * op_absmax(x, n, QT_DT_F32);
    else t_out(r, "amax", QT_DT_F32, 1, 0, 0, 0);
}
static void amax_ref(op_run *r) {
    float x = op_absmax(H(r, "x"), S(0), QT_DT_F32), prev = REF(r, "amax")[0];
    REF(r, "amax")[0] = OPT(O_ACC) && (op_bits(prev) & 0x7fffffffu) > op_bits(x) ? prev : x;
}
static void amax_launch(op_run *r, int pass) {
    (void)pass;
    qt_quant_amax(r->c->dt, D(r, "x"), S(0), D(r, "amax"), OPT(O_ACC), 0);
}
static const op_def OP_AMAX = {"quant_amax", "n special", 1, "prev", amax_build, amax_ref, amax_launch, NULL, NULL, 0, 0, 0};

/* ---- scales: reset (s = records) and qt_quant_scale (s = special prior: amax finite / 1 NaN / 2 Inf /
 * 3 zero; the flag already holding 41 or not). sc is {descale, amax, scale, pad} as fp32. Bitwise. ---- */
static void reset_build(op_run *r) { t_out(r, "sc", QT_DT_F32, 4 * S(0), 0, 0, 0); }
static void reset_ref(op_run *r) { (void)r; }
static void reset_launch(op_run *r, int pass) {
    (void)pass;
    qt_quant_scale_reset(D(r, "sc"), (int)S(0), 0);
}
static const op_def OP_SCALE_RESET = {"quant_scale_reset", "records", 0, NULL, reset_build, reset_ref, reset_launch,
                                      NULL, NULL, 0, 0, 0};

/* sc (4 fp32, amax set) and the nonfinite flag; ref: the scale the kernel must derive from amax. */
static void t_scale(op_run *r, float amax, float prior) {
    float *sc = t_upd(r, "sc", QT_DT_F32, 4, 0, 0, 0, 0);
    sc[0] = sc[2] = 5.0f, sc[1] = amax, sc[3] = 0.0f;
    t_upd(r, "flag", DT_I32, 1, 0, 0, 0, 0)[0] = prior;
}
static void scale_ref_of(op_run *r, qt_dtype ydt, float tag) {
    float *sc = REF(r, "sc");
    qt_fp8_scale_ref(ydt, sc[1], &sc[2], &sc[0]);
    if (isnan(sc[2]) && REF(r, "flag")[0] == 0) REF(r, "flag")[0] = tag;
}
static void scale_build(op_run *r) {
    static const float special[4] = {0, NAN, INFINITY, 0.0f};
    t_scale(r, S(0) ? special[S(0)] : fabsf(rand_wide(&r->rng, -30, 30)), (float)S(1));
}
static void scale_ref(op_run *r) { scale_ref_of(r, r->c->dt, 42); }
static void scale_launch(op_run *r, int pass) {
    (void)pass;
    qt_quant_scale(r->c->dt, D(r, "sc"), D(r, "flag"), 42, 0);
}
static const op_def OP_SCALE = {"quant_scale", "special prior", 1, NULL, scale_build, scale_ref, scale_launch, NULL,
                                NULL, 0, 0, 0};

/* ---- quantize (quant.cu): y = sat(rne(x * scale)) in fp8, bit for bit with the CPU codec (any NaN code
 * for a NaN). s = n gen: 0 wide random values with exact fp8 ties every third element (when the scale is
 * a power of two), 1 all 256 codes of dt decoded (NaN, Inf: saturate), 2 values past the fp8 range
 * (3, the transpose's: N(0, 3) values; 4: those with one NaN, which +cur turns into a NaN scale and the flag).
 * dt = fp8 type, dt2 = x's type; f = scale (0: random); +cur: the scale comes from sc->amax (= max|x|),
 * written back with descale and the flag. ---- */
static void quant_input(op_run *r, long n, long gen) {
    static const float big[] = {449.0f, 464.0f, 465.0f, 480.0f, 57344.0f, 61440.0f, 70000.0f, 1e6f, FLT_MAX, INFINITY};
    float *x = t_in(r, "x", r->c->dt2, n, 3.0f), s = r->c->f != 0 ? r->c->f : 1.0f;
    qt_dtype dt = r->c->dt;
    if (gen == 4 && n) x[n / 2] = NAN;
    for (long i = 0; i < n && gen < 3; i++) {
        if (gen == 1) x[i] = qt_fp8_decode(dt, (uint8_t)i);
        else if (gen == 2) x[i] = (i & 1 ? -1 : 1) * big[(i / 2) % 10];
        else if (i % 3 == 0) {
            int c = (int)qt_rng_below(&r->rng, dt == QT_DT_E4M3 ? 0x7e : 0x7b);
            x[i] = (qt_fp8_decode(dt, (uint8_t)c) + qt_fp8_decode(dt, (uint8_t)(c + 1))) / 2 / s;
        } else x[i] = rand_wide(&r->rng, -25, 12);
        x[i] = op_round(r->c->dt2, x[i]);
    }
}
static float quant_scale_of(op_run *r) {
    if (OPT(O_CUR)) return REF(r, "sc")[2];
    return H(r, "scale")[0];
}
static void quant_build_common(op_run *r, long n, long gen) {
    quant_input(r, n, gen);
    if (OPT(O_CUR)) t_scale(r, op_absmax(H(r, "x"), n, QT_DT_F32), 0);
    else t_in(r, "scale", QT_DT_F32, 1, 0)[0] = r->c->f != 0 ? r->c->f : ldexpf(1.0f + (float)qt_rng_uniform(&r->rng),
                                                                                  (int)qt_rng_below(&r->rng, 21) - 10);
}
static void quant_build(op_run *r) {
    quant_build_common(r, S(0), S(1));
    t_out(r, "y", r->c->dt, S(0), 0, 0, 0);
}
static void quant_ref(op_run *r) {
    if (OPT(O_CUR)) scale_ref_of(r, r->c->dt, 7);
    float s = quant_scale_of(r);
    for (long i = 0; i < S(0); i++) REF(r, "y")[i] = qt_fp8_decode(r->c->dt, qt_fp8_encode(r->c->dt, H(r, "x")[i] * s, 1));
}
static void quant_launch(op_run *r, int pass) {
    (void)pass;
    if (OPT(O_CUR)) qt_quant_fp8_cur(r->c->dt, D(r, "y"), r->c->dt2, D(r, "x"), S(0), D(r, "sc"), D(r, "flag"), 7, 0);
    else qt_quant_fp8(r->c->dt, D(r, "y"), r->c->dt2, D(r, "x"), S(0), D(r, "scale"), 0);
}
static const op_def OP_QUANT = {"quant_fp8", "n gen", 2, "scale", quant_build, quant_ref, quant_launch, NULL, NULL, 0, 0, 0};

/* Quantize + transpose of x[rows, cols]: y (NULL in pass 1) and yT[cols, rows]. s = rows cols. */
static void quantT_build(op_run *r) {
    quant_build_common(r, S(0) * S(1), 3);
    t_out(r, "y", r->c->dt, S(0) * S(1), 0, 0, T_PASS0);
    t_out(r, "yT", r->c->dt, S(0) * S(1), 0, 0, 0);
}
static void quantT_ref(op_run *r) {
    if (OPT(O_CUR)) scale_ref_of(r, r->c->dt, 3);
    float s = quant_scale_of(r);
    long R = S(0), C = S(1);
    for (long i = 0; i < R; i++)
        for (long j = 0; j < C; j++) {
            float q = qt_fp8_decode(r->c->dt, qt_fp8_encode(r->c->dt, H(r, "x")[i * C + j] * s, 1));
            REF(r, "y")[i * C + j] = q;
            REF(r, "yT")[j * R + i] = q;
        }
}
static void quantT_launch(op_run *r, int pass) {
    (void)pass;
    if (OPT(O_CUR))
        qt_quant_fp8_transpose_cur(r->c->dt, D(r, "y"), D(r, "yT"), r->c->dt2, D(r, "x"), S(0), S(1), D(r, "sc"),
                                   D(r, "flag"), 3, 0);
    else qt_quant_fp8_transpose(r->c->dt, D(r, "y"), D(r, "yT"), r->c->dt2, D(r, "x"), S(0), S(1), D(r, "scale"), 0);
}
static const op_def OP_QUANT_T = {"quant_fp8_transpose", "rows cols", 2, "scale", quantT_build, quantT_ref,
                                  quantT_launch, NULL, NULL, 0, 0, 0};

/* SwiGLU backward + quantize-transpose (the fp8 recompute's pass that also makes down's Xq^T): swiglu_bwd's
 * tensors and bounds (dgu, +inplace over gu, +amax its fold), and yT[cols, rows] = fp8(bf16(silu(g) * u) *
 * scale), the scale from sc->amax (= max |h|, h the CPU SwiGLU rounded to bf16) written back with descale
 * and the flag. s = rows cols; dt = fp8 type. The CPU's expf may differ from the GPU's by an ulp, which can
 * move h by one bf16 ulp and so a code by one: yT's bound is one fp8 step (2^-3 relative, 2^-9 near zero).
 * Bitwise equality with the kernels it replaces (what the recompute relies on) is test_kernels'
 * swiglu_bwd_quant_t_bitwise and test_recompute's. OP_GEGLU_QT: the same for GeGLU (gelu_tanh for silu). */
static const op_def OP_GEGLU_QT;
static void swiglu_qt_h(op_run *r, float *h) {
    if (r->c->op == &OP_GEGLU_QT) qt_ref_geglu_fwd(h, H(r, "gu"), S(0), (int)S(1));
    else qt_ref_swiglu_fwd(h, H(r, "gu"), S(0), (int)S(1));
    for (long i = 0; i < S(0) * S(1); i++) h[i] = op_round(QT_DT_BF16, h[i]);
}
static void swiglu_qt_build(op_run *r) {
    long n = S(0) * S(1);
    swiglu_bwd_build(r);
    float *h = malloc((size_t)(n > 0 ? n : 1) * sizeof *h);
    QT_CHECK(h, "out of host memory");
    swiglu_qt_h(r, h);
    t_scale(r, op_absmax(h, n, QT_DT_F32), 0);
    free(h);
    t_out(r, "yT", r->c->dt, n, 0x1p-9, 0.125, 0);
}
static void swiglu_qt_ref(op_run *r) {
    if (r->c->op == &OP_GEGLU_QT) qt_ref_geglu_bwd(REF(r, swiglu_dgu(r)), H(r, "dout"), H(r, "gu"), S(0), (int)S(1));
    else swiglu_bwd_ref(r);
    scale_ref_of(r, r->c->dt, 5);
    long R = S(0), C = S(1);
    float s = REF(r, "sc")[2], *h = malloc((size_t)(R * C > 0 ? R * C : 1) * sizeof *h);
    QT_CHECK(h, "out of host memory");
    swiglu_qt_h(r, h);
    for (long i = 0; i < R; i++)
        for (long j = 0; j < C; j++) REF(r, "yT")[j * R + i] = qt_fp8_decode(r->c->dt, qt_fp8_encode(r->c->dt, h[i * C + j] * s, 1));
    free(h);
}
static void swiglu_qt_launch(op_run *r, int pass) {
    (void)pass;
    (r->c->op == &OP_GEGLU_QT ? qt_geglu_bwd_quant_transpose_cur : qt_swiglu_bwd_quant_transpose_cur)(
        D(r, swiglu_dgu(r)), D(r, "dout"), D(r, "gu"), S(0), S(1), D(r, "amax"), r->c->dt, D(r, "yT"), D(r, "sc"),
        D(r, "flag"), 5, 0);
}
static const op_def OP_SWIGLU_QT = {"swiglu_bwd_quant_t", "rows cols", 1, NULL, swiglu_qt_build, swiglu_qt_ref,
                                    swiglu_qt_launch, swiglu_bwd_derive, NULL, 0, 0, 0};
static const op_def OP_GEGLU_QT = {"geglu_bwd_quant_t", "rows cols", 1, NULL, swiglu_qt_build, swiglu_qt_ref,
                                   swiglu_qt_launch, swiglu_bwd_derive, NULL, 0, 0, 0};

/* Dequantize: y (dt: fp32 or bf16) = decode(x) * descale, one RNE rounding: bitwise. s = n gen (0 random
 * finite codes, 1 all 256); dt2 = fp8 type; f = descale (0: NULL). */
static void dequant_build(op_run *r) {
    float *x = t_in(r, "x", r->c->dt2, S(0), 0);
    for (long i = 0; i < S(0); i++) {
        uint8_t c = (uint8_t)i;
        if (!S(1))
            do c = (uint8_t)qt_rng_below(&r->rng, 256);
            while (!isfinite(qt_fp8_decode(r->c->dt2, c)));
        x[i] = qt_fp8_decode(r->c->dt2, c);
    }
    if (r->c->f != 0) t_in(r, "descale", QT_DT_F32, 1, 0)[0] = r->c->f;
    t_out(r, "y", r->c->dt, S(0), 0, 0, 0);
}
static void dequant_ref(op_run *r) {
    for (long i = 0; i < S(0); i++)
        REF(r, "y")[i] = op_round(r->c->dt, r->c->f != 0 ? H(r, "x")[i] * r->c->f : H(r, "x")[i]);
}
static void dequant_launch(op_run *r, int pass) {
    (void)pass;
    qt_quant_dequant(r->c->dt, D(r, "y"), r->c->dt2, D(r, "x"), S(0), D(r, "descale"), 0);
}
static const op_def OP_DEQUANT = {"quant_dequant", "n gen", 2, "descale", dequant_build, dequant_ref, dequant_launch,
                                  NULL, NULL, 0, 0, 0};

/* Byte transpose of fp8 codes: yT[cols, rows] = x[rows, cols], every finite code moved unchanged (bitwise).
 * s = rows cols; dt = the fp8 type. */
static void u8t_build(op_run *r) {
    float *x = t_in(r, "x", r->c->dt, S(0) * S(1), 0);
    for (long i = 0; i < S(0) * S(1); i++) {
        uint8_t c;
        do c = (uint8_t)qt_rng_below(&r->rng, 256);
        while (!isfinite(qt_fp8_decode(r->c->dt, c)));
        x[i] = qt_fp8_decode(r->c->dt, c);
    }
    t_out(r, "yT", r->c->dt, S(0) * S(1), 0, 0, 0);
}
static void u8t_ref(op_run *r) {
    for (long i = 0; i < S(0); i++)
        for (long j = 0; j < S(1); j++) REF(r, "yT")[j * S(0) + i] = H(r, "x")[i * S(1) + j];
}
static void u8t_launch(op_run *r, int pass) {
    (void)pass;
    qt_transpose_u8(D(r, "yT"), D(r, "x"), S(0), S(1), 0);
}
static const op_def OP_U8T = {"transpose_u8", "rows cols", 1, NULL, u8t_build, u8t_ref, u8t_launch, NULL, NULL, 0, 0, 0};

/* ---- GEMMs (matmul.c, cuBLASLt): s = N I O; dt = the output's dtype; +bias, +acc (beta = 1), +notune
 * (the heuristic's first algorithm: give the row a shape of its own, the plan cache keys on it). bf16
 * output: one rounding (1e-2); fp32 output: summation order only (2e-5). ---- */
static qt_matmul_ctx *g_mm;
static qt_matmul_ctx *mm_ctx(void) { return g_mm ? g_mm : (g_mm = qt_matmul_create(0)); }
static double mm_tol(qt_dtype t) { return t == QT_DT_BF16 ? 1e-2 : 2e-5; }
static void t_mm_out(op_run *r, const char *name, long n, double atol, double rtol) {
    if (OPT(O_ACC)) t_upd(r, name, r->c->dt, n, 1.0f, atol, rtol, T_ADD);
    else t_out(r, name, r->c->dt, n, atol, rtol, 0);
}
static void mm_fwd_build(op_run *r) {
    t_in(r, "x", QT_DT_BF16, S(0) * S(1), 1.0f);
    t_in(r, "w", QT_DT_BF16, S(2) * S(1), 1.0f / sqrtf((float)S(1)));
    if (OPT(O_BIAS)) t_in(r, "bias", r->c->dt, S(2), 1.0f);
    t_mm_out(r, "y", S(0) * S(2), mm_tol(r->c->dt), mm_tol(r->c->dt));
}
static void mm_fwd_ref(op_run *r) {
    long n = S(0) * S(2);
    float *y = op_alloc(n);
    qt_ref_matmul_fwd(y, H(r, "x"), H(r, "w"), T(r, "bias") ? H(r, "bias") : NULL, S(0), (int)S(1), (int)S(2));
    for (long i = 0; i < n; i++) REF(r, "y")[i] += y[i];
    free(y);
}
static void mm_fwd_launch(op_run *r, int pass) {
    (void)pass;
    qt_matmul_set_autotune(mm_ctx(), !OPT(O_NOTUNE));
    qt_matmul_fwd(mm_ctx(), D(r, "y"), r->c->dt, D(r, "x"), D(r, "w"), D(r, "bias"), S(0), (int)S(1), (int)S(2),
                  OPT(O_ACC), 0);
    qt_matmul_set_autotune(mm_ctx(), 1);
}
static const op_def OP_MM_FWD = {"matmul_fwd", "N I O", 1, NULL, mm_fwd_build, mm_fwd_ref, mm_fwd_launch, NULL, NULL, 0, 0, 0};

static void mm_dgrad_build(op_run *r) {
    t_in(r, "dy", QT_DT_BF16, S(0) * S(2), 1.0f);
    t_in(r, "w", QT_DT_BF16, S(2) * S(1), 1.0f / sqrtf((float)S(2)));
    t_mm_out(r, "dx", S(0) * S(1), mm_tol(r->c->dt), mm_tol(r->c->dt));
}
static void mm_dgrad_ref(op_run *r) {
    long n = S(0) * S(1);
    float *dx = op_alloc(n);
    qt_ref_matmul_bwd(dx, NULL, NULL, H(r, "dy"), NULL, H(r, "w"), S(0), (int)S(1), (int)S(2));
    for (long i = 0; i < n; i++) REF(r, "dx")[i] += dx[i];
    free(dx);
}
static void mm_dgrad_launch(op_run *r, int pass) {
    (void)pass;
    qt_matmul_dgrad(mm_ctx(), D(r, "dx"), r->c->dt, D(r, "dy"), D(r, "w"), S(0), (int)S(1), (int)S(2), OPT(O_ACC), 0);
}
static const op_def OP_MM_DGRAD = {"matmul_dgrad", "N I O", 1, NULL, mm_dgrad_build, mm_dgrad_ref, mm_dgrad_launch,
                                   NULL, NULL, 0, 0, 0};

/* dW (dt) (+)= dY^T X; +bias: the fused bias gradient dbias (=) when cuBLASLt has it, else dbias must
 * stay untouched (the launch notes which in r->aux). fp32: 1e-4 absolute for sums over N of size ~1. */
static void mm_wgrad_build(op_run *r) {
    double tol = r->c->dt == QT_DT_BF16 ? 1e-2 : 1e-5, atol = r->c->dt == QT_DT_BF16 ? 1e-2 : 1e-4;
    t_in(r, "dy", QT_DT_BF16, S(0) * S(2), 1.0f);
    t_in(r, "x", QT_DT_BF16, S(0) * S(1), 1.0f);
    t_mm_out(r, "dw", S(2) * S(1), atol, tol);
    if (OPT(O_BIAS)) t_out(r, "dbias", r->c->dt, S(2), atol, tol, 0);
}
static void mm_wgrad_ref(op_run *r) {
    long n = S(2) * S(1);
    float *dw = calloc((size_t)n, sizeof *dw);
    qt_ref_matmul_bwd(NULL, dw, T(r, "dbias") ? REF(r, "dbias") : NULL, H(r, "dy"), H(r, "x"), NULL, S(0), (int)S(1),
                      (int)S(2));
    for (long i = 0; i < n; i++) REF(r, "dw")[i] += dw[i];
    free(dw);
}
static void mm_wgrad_launch(op_run *r, int pass) {
    (void)pass;
    r->aux = qt_matmul_wgrad(mm_ctx(), D(r, "dw"), r->c->dt, D(r, "dbias"), D(r, "dy"), D(r, "x"), S(0), (int)S(1),
                             (int)S(2), OPT(O_ACC), 0);
}
static int mm_wgrad_keep(const op_run *r, const op_tensor *t, long i) {
    (void)i;
    return !r->aux && !strcmp(t->name, "dbias");
}
static const op_def OP_MM_WGRAD = {"matmul_wgrad", "N I O", 1, NULL, mm_wgrad_build, mm_wgrad_ref, mm_wgrad_launch,
                                   NULL, mm_wgrad_keep, 0, 0, 0};

/* fp8 TN: D[M,N] (+)= (0.5 A[M,K]) . (2 B[N,K])^T (+ bias); A e4m3, B dt2; D dt. Hopper's fp8 MMA keeps
 * ~13-14 mantissa bits between fp32 promotions (5e-4 seen at K=64 on H200), more with fast accumulation:
 * fp32 2e-3 (fast 1e-2), bf16 1e-2 (fast 1.5e-2). M, N, K % 16 == 0 (cuBLASLt's fp8 kernels). */
static void mm_fp8_build(op_run *r) {
    int fast = OPT(O_FAST);
    double tol = r->c->dt == QT_DT_BF16 ? (fast ? 1.5e-2 : 1e-2) : (fast ? 1e-2 : 2e-3);
    t_in(r, "a", QT_DT_E4M3, S(0) * S(2), 1.0f);
    t_in(r, "b", r->c->dt2, S(1) * S(2), 1.0f / sqrtf((float)S(2)));
    t_in(r, "sa", QT_DT_F32, 1, 0)[0] = 0.5f;
    t_in(r, "sb", QT_DT_F32, 1, 0)[0] = 2.0f;
    if (OPT(O_BIAS)) t_in(r, "bias", QT_DT_BF16, S(1), 1.0f);
    t_mm_out(r, "d", S(0) * S(1), tol, tol);
}
static void mm_fp8_ref(op_run *r) {
    long M = S(0), N = S(1), K = S(2);
    const float *a = H(r, "a"), *b = H(r, "b"), *bias = T(r, "bias") ? H(r, "bias") : NULL;
    float *d = REF(r, "d");
#pragma omp parallel for schedule(static)
    for (long m = 0; m < M; m++)
        for (long n = 0; n < N; n++) {
            double acc = 0;
            for (long k = 0; k < K; k++) acc += (double)a[m * K + k] * b[n * K + k];
            d[m * N + n] += (float)(0.5 * 2.0 * acc + (bias ? bias[n] : 0.0));
        }
}
static void mm_fp8_launch(op_run *r, int pass) {
    (void)pass;
    qt_matmul_fp8(mm_ctx(), D(r, "d"), r->c->dt, D(r, "a"), QT_DT_E4M3, D(r, "sa"), D(r, "b"), r->c->dt2, D(r, "sb"),
                  D(r, "bias"), S(0), (int)S(1), (int)S(2), OPT(O_FAST), OPT(O_ACC), 0);
}
static const op_def OP_MM_FP8 = {"matmul_fp8", "M N K", 2, NULL, mm_fp8_build, mm_fp8_ref, mm_fp8_launch, NULL, NULL,
                                 0, 89, 0};

/* ---- attention (attention.c, cuDNN): s = B T H Hkv D, f = the sliding window (0: causal). The backward takes the reference forward's out
 * (rounded to bf16) and lse, so it is checked on its own; cuDNN's dQ accumulation is not bitwise
 * reproducible, so the two passes are compared to the reference only (OP_NONDET). P and dS are bf16
 * matmul operands in cuDNN's flash kernels: out 1e-2, lse 1e-3, dqkv 2e-2. ---- */
static qt_attention_ctx *g_att;
#define ATT_W(r) ((int)(r)->c->f)
/* The scaled ops (qt_attention_*_scaled, Gemma's query_pre_attn_scalar) take scale (1.3125 D)^-0.5: 27B's 168 at
 * D = 128; the plain ones 1/sqrt(D). */
static const op_def OP_ATTS_FWD, OP_ATTS_BWD;
static double att_scale(const op_run *r) {
    int scaled = r->c->op == &OP_ATTS_FWD || r->c->op == &OP_ATTS_BWD;
    return 1.0 / sqrt((scaled ? 1.3125 : 1.0) * (double)S(4));
}
static int att_prepare(op_run *r) {
    char err[1024];
    if (!g_att) g_att = qt_attention_create();
    if (!qt_attention_prepare(g_att, (int)S(0), (int)S(1), (int)S(2), (int)S(3), (int)S(4), ATT_W(r), err, sizeof err))
        return 1;
    op_fail(r, "  cuDNN rejected the graph: %s", err);
    return 0;
}
static long att_rows(const op_run *r) { return S(0) * S(1); }
static void att_fwd_build(op_run *r) {
    t_in(r, "qkv", QT_DT_BF16, att_rows(r) * (S(2) + 2 * S(3)) * S(4), 1.0f);
    t_out(r, "out", QT_DT_BF16, att_rows(r) * S(2) * S(4), 1e-2, 1e-2, 0);
    t_out(r, "lse", QT_DT_F32, S(0) * S(2) * S(1), 1e-3, 1e-3, 0);
}
static void att_fwd_ref(op_run *r) {
    qt_ref_attention_scaled_fwd(REF(r, "out"), REF(r, "lse"), H(r, "qkv"), (int)S(0), (int)S(1), (int)S(2), (int)S(3),
                                (int)S(4), ATT_W(r), NULL, att_scale(r));
}
static void att_fwd_launch(op_run *r, int pass) {
    (void)pass;
    if (!att_prepare(r)) return;
    if (r->c->op == &OP_ATTS_FWD)
        qt_attention_fwd_scaled(g_att, D(r, "out"), D(r, "lse"), D(r, "qkv"), NULL, (int)S(0), (int)S(1), (int)S(2), (int)S(3),
                                (int)S(4), ATT_W(r), (float)att_scale(r), 0);
    else
        qt_attention_fwd(g_att, D(r, "out"), D(r, "lse"), D(r, "qkv"), (int)S(0), (int)S(1), (int)S(2), (int)S(3),
                         (int)S(4), ATT_W(r), 0);
}
static const op_def OP_ATT_FWD = {"attention_fwd", "B T H Hkv D", 0, "window", att_fwd_build, att_fwd_ref, att_fwd_launch,
                                  NULL, NULL, 0, 0, 0};
static const op_def OP_ATTS_FWD = {"attention_scaled_fwd", "B T H Hkv D", 0, "window", att_fwd_build, att_fwd_ref,
                                   att_fwd_launch, NULL, NULL, 0, 0, 0};

static void att_bwd_build(op_run *r) {
    long nqkv = att_rows(r) * (S(2) + 2 * S(3)) * S(4), nout = att_rows(r) * S(2) * S(4);
    float *qkv = t_in(r, "qkv", QT_DT_BF16, nqkv, 1.0f);
    float *out = t_in(r, "out", QT_DT_BF16, nout, 0), *lse = t_in(r, "lse", QT_DT_F32, S(0) * S(2) * S(1), 0);
    qt_ref_attention_scaled_fwd(out, lse, qkv, (int)S(0), (int)S(1), (int)S(2), (int)S(3), (int)S(4), ATT_W(r), NULL,
                                att_scale(r));
    for (long i = 0; i < nout; i++) out[i] = op_round(QT_DT_BF16, out[i]);
    t_in(r, "dout", QT_DT_BF16, nout, 1.0f);
    t_out(r, "dqkv", QT_DT_BF16, nqkv, 2e-2, 2e-2, 0);
}
static void att_bwd_ref(op_run *r) {
    qt_ref_attention_scaled_bwd(REF(r, "dqkv"), H(r, "dout"), H(r, "qkv"), H(r, "out"), H(r, "lse"), (int)S(0), (int)S(1),
                                (int)S(2), (int)S(3), (int)S(4), ATT_W(r), NULL, att_scale(r));
}
static void att_bwd_launch(op_run *r, int pass) {
    (void)pass;
    if (!att_prepare(r)) return;
    if (r->c->op == &OP_ATTS_BWD)
        qt_attention_bwd_scaled(g_att, D(r, "dqkv"), D(r, "dout"), D(r, "qkv"), D(r, "out"), D(r, "lse"), NULL, (int)S(0),
                                (int)S(1), (int)S(2), (int)S(3), (int)S(4), ATT_W(r), (float)att_scale(r), 0);
    else
        qt_attention_bwd(g_att, D(r, "dqkv"), D(r, "dout"), D(r, "qkv"), D(r, "out"), D(r, "lse"), (int)S(0), (int)S(1),
                         (int)S(2), (int)S(3), (int)S(4), ATT_W(r), 0);
}
static const op_def OP_ATT_BWD = {"attention_bwd", "B T H Hkv D", 0, "window", att_bwd_build, att_bwd_ref, att_bwd_launch,
                                  NULL, NULL, OP_NONDET, 0, 0};
static const op_def OP_ATTS_BWD = {"attention_scaled_bwd", "B T H Hkv D", 0, "window", att_bwd_build, att_bwd_ref,
                                   att_bwd_launch, NULL, NULL, OP_NONDET, 0, 0};

#endif
