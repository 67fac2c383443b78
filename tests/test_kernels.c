/* test_kernels.c — every cuda/ kernel of qt_kernels.h against its CPU reference (qt_ref.h, qt_optim.h).
 *
 * Inputs are drawn fresh, rounded to bf16 where the kernel reads bf16 (so the comparison measures the
 * kernel's own error), outputs are poisoned with NaN (0xff bytes) before each call. Bounds: bf16
 * outputs rtol 1e-2; fp32 outputs 1e-5 unless a comment says why more. Odd shapes throughout
 * (N=1, N=7, C=24, C not a multiple of 8, misaligned pointers for the scalar paths). The fused fp8
 * abs-maxes (RMSNorm, RoPE bwd, SwiGLU) must match max |v| over the kernel's own bf16 output and a
 * separate qt_quant_amax pass bit for bit, and the outputs must not depend on whether one is asked
 * for. Skips without a GPU. */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "qt_dtype.h"
#include "qt_error.h"
#include "qt_gpu_optim.h"
#include "qt_kernels.h"
#include "qt_optim.h"
#include "qt_quant.h"
#include "qt_ref.h"
#include "qt_rng.h"
#include "qt_test.h"

static qt_rng R;

static int have_gpu(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n > 0;
}
#define NEED_GPU()                                                                                 \
    do {                                                                                           \
        if (!have_gpu()) QT_SKIP("no CUDA device");                                                \
    } while (0)

static float *h_rand(long n, float std) {
    float *x = malloc((size_t)(n ? n : 1) * sizeof *x);
    QT_CHECK(x, "out of memory");
    for (long i = 0; i < n; i++) x[i] = std * qt_rng_normal(&R);
    return x;
}
static float *h_copy(const float *x, long n) {
    float *y = malloc((size_t)(n ? n : 1) * sizeof *y);
    QT_CHECK(y, "out of memory");
    memcpy(y, x, (size_t)n * sizeof *y);
    return y;
}
static void h_round(float *x, long n) {
    for (long i = 0; i < n; i++) x[i] = qt_bf16_to_f32(qt_f32_to_bf16(x[i]));
}
/* Device buffer of `bytes` filled with 0xff: NaN as fp32 and as bf16. */
static void *d_poison(size_t bytes) {
    void *p;
    QT_CUDA(cudaMalloc(&p, bytes ? bytes : 16));
    QT_CUDA(cudaMemset(p, 0xff, bytes ? bytes : 16));
    return p;
}
static void *d_bf16(const float *x, long n) {
    uint16_t *h = malloc((size_t)(n ? n : 1) * 2);
    QT_CHECK(h, "out of memory");
    for (long i = 0; i < n; i++) h[i] = qt_f32_to_bf16(x[i]);
    void *d = d_poison((size_t)n * 2);
    QT_CUDA(cudaMemcpy(d, h, (size_t)n * 2, cudaMemcpyHostToDevice));
    free(h);
    return d;
}
static float *d_f32(const float *x, long n) {
    float *d = d_poison((size_t)n * 4);
    QT_CUDA(cudaMemcpy(d, x, (size_t)n * 4, cudaMemcpyHostToDevice));
    return d;
}
static float *g_bf16(const void *d, long n) {
    uint16_t *h = malloc((size_t)(n ? n : 1) * 2);
    float *x = malloc((size_t)(n ? n : 1) * sizeof *x);
    QT_CHECK(h && x, "out of memory");
    QT_CUDA(cudaDeviceSynchronize());
    QT_CUDA(cudaMemcpy(h, d, (size_t)n * 2, cudaMemcpyDeviceToHost));
    for (long i = 0; i < n; i++) x[i] = qt_bf16_to_f32(h[i]);
    free(h);
    return x;
}
static float *g_f32(const void *d, long n) {
    float *x = malloc((size_t)(n ? n : 1) * sizeof *x);
    QT_CHECK(x, "out of memory");
    QT_CUDA(cudaDeviceSynchronize());
    QT_CUDA(cudaMemcpy(x, d, (size_t)n * 4, cudaMemcpyDeviceToHost));
    return x;
}

/* A zeroed device abs-max slot, as the fused kernels expect. */
static float *d_amax(void) {
    float *d = d_poison(4);
    QT_CUDA(cudaMemset(d, 0, 4));
    return d;
}
/* 1 when the fused abs-max in damax equals, bit for bit, both max |v| over out (the kernel's bf16 output
 * read back, n values) and a separate qt_quant_amax pass over the device copy dout. */
static int amax_exact(const char *what, float *damax, const void *dout, const float *out, long n) {
    float *sep = d_poison(4), ref = 0.0f;
    qt_quant_amax(QT_DT_BF16, dout, n, sep, 0, 0);
    float *g = g_f32(damax, 1), *gs = g_f32(sep, 1);
    for (long i = 0; i < n; i++) ref = fabsf(out[i]) > ref ? fabsf(out[i]) : ref;
    int ok = memcmp(g, &ref, 4) == 0 && memcmp(gs, &ref, 4) == 0;
    if (!ok) printf("  %s: fused amax %.9g, separate pass %.9g, max |out| %.9g\n", what, *g, *gs, ref);
    free(g); free(gs);
    cudaFree(sep);
    return ok;
}

/* ---- casts ---- */
static void test_casts(void) {
    NEED_GPU();
    long n = 1000003;
    float *x = h_rand(n, 3.0f);
    x[0] = 1.00390625f; /* a tie: RNE keeps 1.0 */
    for (int off = 0; off < 2; off++) { /* off 1: misaligned pointers take the scalar path */
        long m = n - off;
        float *dx = d_f32(x, n);
        void *db = d_poison((size_t)n * 2);
        qt_cast_f32_to_bf16((uint16_t *)db + off, dx + off, (size_t)m, 0);
        uint16_t *h = malloc((size_t)m * 2);
        QT_CUDA(cudaDeviceSynchronize());
        QT_CUDA(cudaMemcpy(h, (uint16_t *)db + off, (size_t)m * 2, cudaMemcpyDeviceToHost));
        long bad = -1;
        for (long i = 0; i < m && bad < 0; i++)
            if (h[i] != qt_f32_to_bf16(x[i + off])) bad = i;
        QT_EXPECT(bad < 0, "off %d: f32->bf16 differs at %ld: %04x vs %04x", off, bad, h[bad],
                  qt_f32_to_bf16(x[bad + off]));
        float *back = d_poison((size_t)n * 4);
        qt_cast_bf16_to_f32(back + off, (uint16_t *)db + off, (size_t)m, 0);
        float *hb = g_f32(back + off, m);
        bad = -1;
        for (long i = 0; i < m && bad < 0; i++)
            if (hb[i] != qt_bf16_to_f32(h[i])) bad = i;
        QT_EXPECT(bad < 0, "off %d: bf16->f32 differs at %ld", off, bad);
        /* fp32 y += bf16 x */
        float *y = h_rand(n, 1.0f), *dy = d_f32(y, n);
        qt_add_inplace(dy + off, QT_DT_F32, (uint16_t *)db + off, QT_DT_BF16, (size_t)m, 0);
        float *gy = g_f32(dy + off, m);
        bad = -1;
        for (long i = 0; i < m && bad < 0; i++)
            if (gy[i] != y[i + off] + qt_bf16_to_f32(h[i])) bad = i;
        QT_EXPECT(bad < 0, "off %d: add_inplace differs at %ld", off, bad);
        qt_fill((uint16_t *)db + off, QT_DT_BF16, -2.5f, (size_t)m, 0);
        qt_fill(dy + off, QT_DT_F32, 0.125f, (size_t)m, 0);
        float *fb = g_bf16((uint16_t *)db + off, m), *fy = g_f32(dy + off, m);
        bad = -1;
        for (long i = 0; i < m && bad < 0; i++)
            if (fb[i] != -2.5f || fy[i] != 0.125f) bad = i;
        QT_EXPECT(bad < 0, "off %d: fill differs at %ld", off, bad);
        qt_zero(dy, (size_t)n * 4, 0);
        float *z = g_f32(dy, n);
        QT_EXPECT(z[0] == 0 && z[n - 1] == 0, "zero left %g %g", z[0], z[n - 1]);
        free(h); free(hb); free(y); free(gy); free(fb); free(fy); free(z);
        cudaFree(dx); cudaFree(db); cudaFree(back); cudaFree(dy);
    }
    free(x);
}

/* ---- embedding ---- */
static void embedding_case(long n, int c, int v, int hot, qt_dtype ddt) {
    int32_t *tok = malloc((size_t)n * sizeof *tok);
    for (long i = 0; i < n; i++) /* `hot`% of the rows share token 3: a bucket larger than shared memory */
        tok[i] = (int)qt_rng_below(&R, 100) < hot ? 3 : (int32_t)qt_rng_below(&R, (uint64_t)v);
    float *wte = h_rand((long)v * c, 1.0f), *dout = h_rand(n * c, 1.0f), *dw0 = h_rand((long)v * c, 0.1f);
    h_round(wte, (long)v * c);
    if (ddt == QT_DT_BF16) h_round(dout, n * c);
    int32_t *dtok;
    QT_CUDA(cudaMalloc((void **)&dtok, (size_t)n * 4));
    QT_CUDA(cudaMemcpy(dtok, tok, (size_t)n * 4, cudaMemcpyHostToDevice));
    void *dwte = d_bf16(wte, (long)v * c), *dout_d = ddt == QT_DT_BF16 ? d_bf16(dout, n * c) : d_f32(dout, n * c);
    void *out = d_poison((size_t)n * c * 2);
    qt_embedding_fwd(out, dtok, dwte, n, c, v, 0);
    float *got = g_bf16(out, n * c), *ref = malloc((size_t)n * c * sizeof *ref);
    qt_ref_embedding_fwd(ref, tok, wte, n, c);
    QT_EXPECT(qt_t_close("embedding fwd", got, ref, n * c, 0, 0), "n=%ld c=%d: gather not exact", n, c);
    /* backward twice from the same dwte: same result, bit for bit */
    float *ddw = d_f32(dw0, (long)v * c), *ddw2 = d_f32(dw0, (long)v * c);
    void *ws = d_poison(qt_embedding_bwd_ws_bytes(n, v));
    qt_embedding_bwd(ddw, dout_d, ddt, dtok, n, c, v, ws, 0);
    QT_CUDA(cudaMemset(ws, 0xff, qt_embedding_bwd_ws_bytes(n, v)));
    qt_embedding_bwd(ddw2, dout_d, ddt, dtok, n, c, v, ws, 0);
    float *g1 = g_f32(ddw, (long)v * c), *g2 = g_f32(ddw2, (long)v * c), *rw = h_copy(dw0, (long)v * c);
    qt_ref_embedding_bwd(rw, dout, tok, n, c, v);
    /* Both sum in row order starting from dwte in fp32: the only difference could be FMA-free adds. */
    QT_EXPECT(qt_t_close("embedding bwd", g1, rw, (long)v * c, 1e-6, 1e-5), "n=%ld c=%d v=%d %s", n, c, v,
              qt_dtype_name(ddt));
    QT_EXPECT(memcmp(g1, g2, (size_t)v * c * 4) == 0, "n=%ld c=%d: two runs differ", n, c);
    /* a rank's piece [lo, hi) of the table (64-element multiples, cutting rows): exactly the full
     * backward's bits inside, the old values outside */
    size_t total = (size_t)v * c, lo = total / 3 / 64 * 64, hi = (total - total / 5) / 64 * 64;
    QT_CUDA(cudaMemcpy(ddw2, dw0, total * 4, cudaMemcpyHostToDevice));
    QT_CUDA(cudaMemset(ws, 0xff, qt_embedding_bwd_ws_bytes(n, v)));
    qt_embedding_bwd_range(ddw2, lo, hi, dout_d, ddt, dtok, n, c, v, ws, 0);
    float *g3 = g_f32(ddw2, (long)total);
    size_t bad = SIZE_MAX;
    for (size_t i = 0; i < total && bad == SIZE_MAX; i++)
        if (memcmp(&g3[i], i >= lo && i < hi ? &g1[i] : &dw0[i], 4)) bad = i;
    QT_EXPECT(bad == SIZE_MAX, "n=%ld c=%d v=%d: range [%zu, %zu) wrong at element %zu", n, c, v, lo, hi, bad);
    free(tok); free(wte); free(dout); free(dw0); free(got); free(ref); free(g1); free(g2); free(g3); free(rw);
    cudaFree(dtok); cudaFree(dwte); cudaFree(dout_d); cudaFree(out); cudaFree(ddw); cudaFree(ddw2); cudaFree(ws);
}
static void test_embedding(void) {
    NEED_GPU();
    embedding_case(1, 24, 50, 0, QT_DT_BF16);
    embedding_case(7, 896, 1000, 30, QT_DT_BF16);
    embedding_case(5000, 24, 1000, 60, QT_DT_BF16); /* bucket of ~3000 rows: sorted in global memory */
    embedding_case(777, 20, 300, 10, QT_DT_F32);    /* c % 8 != 0: scalar path, fp32 dout */
    embedding_case(2048, 64, 151936, 5, QT_DT_F32);
    embedding_case(3000, 16, 2049, 0, QT_DT_BF16); /* the id scan's last tile holds one id */
}

/* ---- RMSNorm ---- */
static void rmsnorm_case(long n, int c, int with_x) {
    float *res = h_rand(n * c, 1.0f), *x = h_rand(n * c, 1.0f), *w = h_rand(c, 0.5f);
    h_round(res, n * c); h_round(x, n * c); h_round(w, c);
    void *dres = d_bf16(res, n * c), *dx = d_bf16(x, n * c), *dw = d_bf16(w, c), *y = d_poison((size_t)n * c * 2);
    float *rstd = d_poison((size_t)n * 4), *amax = d_amax();
    qt_rmsnorm_fwd(y, rstd, dres, with_x ? dx : NULL, dw, n, c, 1e-6f, amax, 0);
    if (with_x)
        for (long i = 0; i < n * c; i++) res[i] = qt_bf16_to_f32(qt_f32_to_bf16(res[i] + x[i]));
    float *gres = g_bf16(dres, n * c), *gy = g_bf16(y, n * c), *gr = g_f32(rstd, n);
    float *ry = malloc((size_t)n * c * 4), *rr = malloc((size_t)n * 4);
    qt_ref_rmsnorm_fwd(ry, rr, res, w, n, c, 1e-6f);
    QT_EXPECT(qt_t_close("res", gres, res, n * c, 0, 0), "n=%ld c=%d: residual sum not exact", n, c);
    QT_EXPECT(qt_t_close("y", gy, ry, n * c, 1e-2, 1e-2), "n=%ld c=%d x=%d", n, c, with_x);
    QT_EXPECT(qt_t_close("rstd", gr, rr, n, 0, 1e-5), "n=%ld c=%d", n, c);
    QT_EXPECT(amax_exact("rmsnorm fwd", amax, y, gy, n * c), "n=%ld c=%d x=%d", n, c, with_x);
    /* no abs-max, a plain norm of the updated res: the same y */
    void *y2 = d_poison((size_t)n * c * 2);
    qt_rmsnorm_fwd(y2, rstd, dres, NULL, dw, n, c, 1e-6f, NULL, 0);
    float *gy2 = g_bf16(y2, n * c);
    QT_EXPECT(memcmp(gy, gy2, (size_t)n * c * 4) == 0, "n=%ld c=%d: y differs without amax", n, c);
    free(res); free(x); free(w); free(gres); free(gy); free(gr); free(ry); free(rr); free(gy2);
    cudaFree(dres); cudaFree(dx); cudaFree(dw); cudaFree(y); cudaFree(rstd); cudaFree(amax); cudaFree(y2);
}
static void test_rmsnorm_fwd(void) {
    NEED_GPU();
    rmsnorm_case(1, 896, 1);
    rmsnorm_case(7, 24, 1);
    rmsnorm_case(300, 896, 0);
    rmsnorm_case(33, 100, 1); /* c % 8 != 0: scalar path */
}

static void rmsnorm_bwd_case(long n, int c, qt_dtype dxdt) {
    float *res = h_rand(n * c, 1.0f), *w = h_rand(c, 0.5f), *dy = h_rand(n * c, 1.0f), *dx0 = h_rand(n * c, 1.0f);
    float *dw0 = h_rand(c, 1.0f), *rstd = malloc((size_t)n * 4), *tmp = malloc((size_t)n * c * 4);
    h_round(res, n * c); h_round(w, c); h_round(dy, n * c);
    if (dxdt == QT_DT_BF16) h_round(dx0, n * c);
    qt_ref_rmsnorm_fwd(tmp, rstd, res, w, n, c, 1e-6f);
    void *dres = d_bf16(res, n * c), *dw_ = d_bf16(w, c), *ddy = d_bf16(dy, n * c);
    void *ddx = dxdt == QT_DT_BF16 ? d_bf16(dx0, n * c) : d_f32(dx0, n * c);
    float *drstd = d_f32(rstd, n), *ddw = d_f32(dw0, c), *ddw2 = d_f32(dw0, c);
    void *ws = d_poison(qt_colreduce_ws_bytes(c)), *ddxb = d_poison((size_t)n * c * 2);
    float *amax = d_amax();
    qt_rmsnorm_bwd(ddx, dxdt, ddxb, amax, ddw, ddy, dres, dw_, drstd, n, c, ws, 0);
    float *gdx = dxdt == QT_DT_BF16 ? g_bf16(ddx, n * c) : g_f32(ddx, n * c), *gdw = g_f32(ddw, c);
    /* the bf16 copy is exactly the RNE rounding of the new dx */
    float *gdxb = g_bf16(ddxb, n * c), *rdxb = h_copy(gdx, n * c);
    h_round(rdxb, n * c);
    long bad = -1;
    for (long i = 0; i < n * c && bad < 0; i++)
        if (memcmp(&gdxb[i], &rdxb[i], 4) != 0) bad = i;
    QT_EXPECT(bad < 0, "n=%ld c=%d: dx_bf16[%ld] = %g, expected bf16(dx) = %g", n, c, bad,
              bad < 0 ? 0.0 : gdxb[bad], bad < 0 ? 0.0 : rdxb[bad]);
    QT_EXPECT(amax_exact("rmsnorm bwd", amax, ddxb, gdxb, n * c), "n=%ld c=%d dx %s", n, c, qt_dtype_name(dxdt));
    float *rdx = h_copy(dx0, n * c), *rdw = h_copy(dw0, c);
    qt_ref_rmsnorm_bwd(rdx, rdw, dy, res, w, rstd, n, c);
    /* fp32 dx: the row dot product runs over c terms in fp32 (the reference in double), and the
     * result cancels two terms of size ~1: 1e-5 absolute fits. dw sums n rows in fp32 vs double. */
    double tol = dxdt == QT_DT_BF16 ? 1e-2 : 1e-5;
    QT_EXPECT(qt_t_close("dx", gdx, rdx, n * c, tol, tol), "n=%ld c=%d dx %s", n, c, qt_dtype_name(dxdt));
    QT_EXPECT(qt_t_close("dw", gdw, rdw, c, 1e-5, 1e-5), "n=%ld c=%d", n, c);
    qt_rmsnorm_bwd(ddx, dxdt, NULL, NULL, ddw2, ddy, dres, dw_, drstd, n, c, ws, 0);
    float *gdw2 = g_f32(ddw2, c);
    QT_EXPECT(memcmp(gdw, gdw2, (size_t)c * 4) == 0, "n=%ld c=%d: dw differs between runs", n, c);
    free(res); free(w); free(dy); free(dx0); free(dw0); free(rstd); free(tmp); free(gdx); free(gdw);
    free(rdx); free(rdw); free(gdw2); free(gdxb); free(rdxb);
    cudaFree(ddxb); cudaFree(dres); cudaFree(dw_); cudaFree(ddy); cudaFree(ddx); cudaFree(drstd); cudaFree(ddw);
    cudaFree(ddw2); cudaFree(ws); cudaFree(amax);
}
static void test_rmsnorm_bwd(void) {
    NEED_GPU();
    rmsnorm_bwd_case(1, 896, QT_DT_F32);
    rmsnorm_bwd_case(7, 24, QT_DT_BF16);
    rmsnorm_bwd_case(1000, 896, QT_DT_F32);
    rmsnorm_bwd_case(65, 100, QT_DT_F32); /* scalar path */
    rmsnorm_bwd_case(129, 896, QT_DT_BF16);
    rmsnorm_bwd_case(1537, 200, QT_DT_F32);  /* several rows per dw partial, uneven last chunk */
    rmsnorm_bwd_case(3, 12296, QT_DT_F32);   /* dw row too big for shared memory: separate pass */
    rmsnorm_bwd_case(300, 1536, QT_DT_F32);  /* widest row held in registers (6 vectors per lane) */
    rmsnorm_bwd_case(40, 1544, QT_DT_BF16);  /* just past it: the looped vector path */
}

/* ---- RoPE ---- */
static void rope_case(int B, int T, int H, int Hkv, int D) {
    long n = (long)B * T * (H + 2 * Hkv) * D;
    float theta = 1e6f;
    float *q = h_rand(n, 1.0f);
    h_round(q, n);
    float *cs = d_poison((size_t)T * D * 4);
    qt_rope_table(cs, T, D, theta, 0);
    void *d = d_bf16(q, n);
    qt_rope_fwd(d, cs, B, T, H, Hkv, D, 0);
    float *got = g_bf16(d, n), *ref = h_copy(q, n);
    qt_ref_rope_fwd(ref, B, T, H, Hkv, D, theta);
    QT_EXPECT(qt_t_close("rope fwd", got, ref, n, 1e-2, 1e-2), "B=%d T=%d H=%d Hkv=%d D=%d", B, T, H, Hkv, D);
    long v0 = (long)(H + Hkv) * D, row = (long)(H + 2 * Hkv) * D, bad = -1;
    for (long r = 0; r < (long)B * T && bad < 0; r++)
        for (long j = v0; j < row; j++)
            if (got[r * row + j] != q[r * row + j]) { bad = r * row + j; break; }
    QT_EXPECT(bad < 0, "v head changed at %ld", bad);
    /* backward: on a fresh gradient whose largest value sits in the last v head (the abs-max covers
     * the heads RoPE leaves alone) */
    float *g = h_rand(n, 1.0f), *amax = d_amax();
    h_round(g, n);
    g[n - 1] = -9.0f;
    void *dg = d_bf16(g, n), *dg2 = d_bf16(g, n);
    qt_rope_bwd(dg, cs, B, T, H, Hkv, D, amax, 0);
    float *gotb = g_bf16(dg, n), *refb = h_copy(g, n);
    qt_ref_rope_bwd(refb, B, T, H, Hkv, D, theta);
    QT_EXPECT(qt_t_close("rope bwd", gotb, refb, n, 1e-2, 1e-2), "B=%d T=%d D=%d", B, T, D);
    QT_EXPECT(amax_exact("rope bwd", amax, dg, gotb, n), "B=%d T=%d H=%d Hkv=%d D=%d", B, T, H, Hkv, D);
    qt_rope_bwd(dg2, cs, B, T, H, Hkv, D, NULL, 0);
    float *gotb2 = g_bf16(dg2, n);
    QT_EXPECT(memcmp(gotb, gotb2, (size_t)n * 4) == 0, "B=%d T=%d D=%d: bwd differs without amax", B, T, D);
    free(q); free(got); free(ref); free(g); free(gotb); free(refb); free(gotb2);
    cudaFree(cs); cudaFree(d); cudaFree(dg); cudaFree(dg2); cudaFree(amax);
}
static void test_rope(void) {
    NEED_GPU();
    rope_case(1, 1, 2, 1, 64);
    rope_case(2, 7, 14, 2, 64);
    rope_case(1, 37, 4, 2, 24); /* D/2 % 8 != 0: scalar path */
    rope_case(3, 5, 2, 2, 128);
}

/* ---- SwiGLU ---- */
static void swiglu_case(long n, int f) {
    float *gu = h_rand(n * 2 * f, 2.0f), *dout = h_rand(n * f, 1.0f);
    h_round(gu, n * 2 * f); h_round(dout, n * f);
    void *dgu = d_bf16(gu, n * 2 * f), *dd = d_bf16(dout, n * f), *out = d_poison((size_t)n * f * 2);
    void *dgrad = d_poison((size_t)n * 2 * f * 2), *out2 = d_poison((size_t)n * f * 2);
    float *amf = d_amax(), *amb = d_amax();
    qt_swiglu_fwd(out, dgu, n, f, amf, 0);
    qt_swiglu_bwd(dgrad, dd, dgu, n, f, amb, 0);
    float *go = g_bf16(out, n * f), *gg = g_bf16(dgrad, n * 2 * f);
    float *ro = malloc((size_t)n * f * 4), *rg = malloc((size_t)n * 2 * f * 4);
    qt_ref_swiglu_fwd(ro, gu, n, f);
    qt_ref_swiglu_bwd(rg, dout, gu, n, f);
    QT_EXPECT(qt_t_close("swiglu fwd", go, ro, n * f, 1e-2, 1e-2), "n=%ld f=%d", n, f);
    QT_EXPECT(qt_t_close("swiglu bwd", gg, rg, n * 2 * f, 1e-2, 1e-2), "n=%ld f=%d", n, f);
    QT_EXPECT(amax_exact("swiglu fwd", amf, out, go, n * f), "n=%ld f=%d", n, f);
    QT_EXPECT(amax_exact("swiglu bwd", amb, dgrad, gg, n * 2 * f), "n=%ld f=%d", n, f);
    /* without amax the same bits; in place (dgu == gu) too */
    qt_swiglu_fwd(out2, dgu, n, f, NULL, 0);
    float *go2 = g_bf16(out2, n * f);
    QT_EXPECT(memcmp(go2, go, (size_t)n * f * 4) == 0, "n=%ld f=%d: fwd differs without amax", n, f);
    qt_swiglu_bwd(dgu, dd, dgu, n, f, NULL, 0);
    float *gi = g_bf16(dgu, n * 2 * f);
    QT_EXPECT(memcmp(gi, gg, (size_t)n * 2 * f * 4) == 0, "n=%ld f=%d: in-place bwd differs", n, f);
    free(gu); free(dout); free(go); free(gg); free(ro); free(rg); free(gi); free(go2);
    cudaFree(dgu); cudaFree(dd); cudaFree(out); cudaFree(dgrad); cudaFree(out2); cudaFree(amf); cudaFree(amb);
}
static void test_swiglu(void) {
    NEED_GPU();
    swiglu_case(1, 4864);
    swiglu_case(7, 24);
    swiglu_case(33, 13); /* scalar path */
    swiglu_case(64, 4864);
}

/* ---- bias ---- */
static void bias_case(long n, int o) {
    float *y = h_rand(n * o, 1.0f), *b = h_rand(o, 1.0f), *dy = h_rand(n * o, 1.0f), *db0 = h_rand(o, 1.0f);
    h_round(y, n * o); h_round(b, o); h_round(dy, n * o);
    void *dyv = d_bf16(y, n * o), *dbv = d_bf16(b, o), *ddy = d_bf16(dy, n * o);
    qt_bias_add(dyv, dbv, n, o, 0);
    float *gy = g_bf16(dyv, n * o);
    for (long i = 0; i < n * o; i++) y[i] = qt_bf16_to_f32(qt_f32_to_bf16(y[i] + b[i % o]));
    QT_EXPECT(qt_t_close("bias add", gy, y, n * o, 0, 0), "n=%ld o=%d: not exact", n, o);
    float *ddb = d_f32(db0, o), *ddb2 = d_f32(db0, o);
    void *ws = d_poison(qt_colreduce_ws_bytes(o));
    qt_bias_bwd(ddb, ddy, n, o, ws, 0);
    qt_bias_bwd(ddb2, ddy, n, o, ws, 0);
    float *g1 = g_f32(ddb, o), *g2 = g_f32(ddb2, o), *rdb = h_copy(db0, o);
    qt_ref_matmul_bwd(NULL, NULL, rdb, dy, NULL, NULL, n, 0, o);
    /* fp32 sum of n terms of size ~1 against a double sum: error ~ sqrt(n) ulp of the partial sums */
    QT_EXPECT(qt_t_close("db", g1, rdb, o, 1e-5 * (1 + n / 1000), 1e-5), "n=%ld o=%d", n, o);
    QT_EXPECT(memcmp(g1, g2, (size_t)o * 4) == 0, "n=%ld o=%d: two runs differ", n, o);
    free(y); free(b); free(dy); free(db0); free(gy); free(g1); free(g2); free(rdb);
    cudaFree(dyv); cudaFree(dbv); cudaFree(ddy); cudaFree(ddb); cudaFree(ddb2); cudaFree(ws);
}
static void test_bias(void) {
    NEED_GPU();
    bias_case(1, 24);
    bias_case(7, 896);
    bias_case(1000, 1152);
    bias_case(129, 13); /* scalar path */
}

/* ---- LM-head loss ---- */
/* Every implementation (two-pass, cluster, pipelined cluster) on the same inputs, each on a fresh poisoned copy placed
 * `off` elements past a 16-byte boundary, and run twice (bitwise the same). Row 1 is ignored (tgt -1);
 * with bad=1, row 3 has tgt = v (loss NaN, dlogits 0). `want` is the implementation the cluster requests
 * must get on sm_90+ (CLUSTER: the one asked for; TWO_PASS where v is too large for them). */
static void loss_case(long n, int v, float std, int off, int bad, qt_lmhead_impl want) {
    long nv = n * v;
    float *lg = h_rand(nv, std);
    h_round(lg, nv);
    uint16_t *hb = malloc((size_t)nv * 2);
    int32_t *tgt = malloc((size_t)n * 4), *rtgt = malloc((size_t)n * 4);
    QT_CHECK(hb && tgt && rtgt, "out of memory");
    for (long i = 0; i < nv; i++) hb[i] = qt_f32_to_bf16(lg[i]);
    int valid = 0;
    for (long i = 0; i < n; i++) {
        tgt[i] = i == 1 ? -1 : bad && i == 3 ? v : (int32_t)qt_rng_below(&R, (uint64_t)v);
        rtgt[i] = tgt[i] < v ? tgt[i] : -1; /* the reference takes the bad row as ignored */
        valid += tgt[i] >= 0 && tgt[i] < v;
    }
    float scale = 1.0f / (valid ? valid : 1);
    float *rl = malloc((size_t)n * 4), *rd = malloc((size_t)nv * 4), *rlse = malloc((size_t)n * 4);
    QT_CHECK(rl && rd && rlse, "out of memory");
    qt_ref_cross_entropy_fwd(rl, lg, rtgt, n, v);
    qt_ref_cross_entropy_bwd(rd, lg, rtgt, n, v, scale);
    for (long i = 0; i < n; i++) rlse[i] = rtgt[i] < 0 ? 0.0f : rl[i] + lg[i * v + rtgt[i]];
    int dev, major;
    QT_CUDA(cudaGetDevice(&dev));
    QT_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    int32_t *dt;
    QT_CUDA(cudaMalloc((void **)&dt, (size_t)n * 4));
    QT_CUDA(cudaMemcpy(dt, tgt, (size_t)n * 4, cudaMemcpyHostToDevice));
    void *buf = d_poison((size_t)(nv + off) * 2);
    uint16_t *dl = (uint16_t *)buf + off;
    float *loss = d_poison((size_t)n * 4), *lse = d_poison((size_t)n * 4);
    for (int impl = QT_LMHEAD_TWO_PASS; impl <= QT_LMHEAD_CLUSTER_PIPE; impl++) {
        float *gl[2], *gs[2], *gd[2];
        for (int rep = 0; rep < 2; rep++) {
            QT_CUDA(cudaMemcpy(dl, hb, (size_t)nv * 2, cudaMemcpyHostToDevice));
            QT_CUDA(cudaMemset(loss, 0xff, (size_t)n * 4));
            QT_CUDA(cudaMemset(lse, 0xff, (size_t)n * 4));
            qt_lmhead_impl ran = qt_lmhead_loss_with((qt_lmhead_impl)impl, dl, loss, lse, dt, n, v, scale, 0);
            qt_lmhead_impl expect = impl >= QT_LMHEAD_CLUSTER && major >= 9 && want == QT_LMHEAD_CLUSTER
                                        ? (qt_lmhead_impl)impl : QT_LMHEAD_TWO_PASS;
            QT_EXPECT(ran == expect, "n=%ld v=%d: asked for %d on sm_%d, ran %d", n, v, impl, major, ran);
            gl[rep] = g_f32(loss, n);
            gs[rep] = g_f32(lse, n);
            gd[rep] = g_bf16(dl, nv);
        }
        if (bad) {
            QT_EXPECT(isnan(gl[0][3]), "n=%ld v=%d impl %d: target v gave loss %g, expected NaN", n, v, impl,
                      gl[0][3]);
            gl[0][3] = 0.0f;
        }
        /* loss ~ log(v) ~ 12: an fp32 sum of v exponentials vs a double one */
        QT_EXPECT(qt_t_close("loss", gl[0], rl, n, 1e-5, 1e-5), "n=%ld v=%d impl %d", n, v, impl);
        QT_EXPECT(qt_t_close("lse", gs[0], rlse, n, 1e-5, 1e-5), "n=%ld v=%d impl %d", n, v, impl);
        /* dlogits: bf16 rounding of scale*p; p can be ~1e-8, so atol stays far below scale/v */
        QT_EXPECT(qt_t_close("dlogits", gd[0], rd, nv, 1e-3 * scale / v, 1e-2), "n=%ld v=%d impl %d", n, v, impl);
        QT_EXPECT(memcmp(gd[0], gd[1], (size_t)nv * 4) == 0 && memcmp(gs[0], gs[1], (size_t)n * 4) == 0,
                  "n=%ld v=%d impl %d: two runs differ", n, v, impl);
        if (off) { /* the poison before the first row is untouched */
            uint16_t before = 0;
            QT_CUDA(cudaMemcpy(&before, dl - 1, 2, cudaMemcpyDeviceToHost));
            QT_EXPECT(before == 0xffff, "n=%ld v=%d impl %d: wrote before the logits", n, v, impl);
        }
        for (int rep = 0; rep < 2; rep++) { free(gl[rep]); free(gs[rep]); free(gd[rep]); }
    }
    double *dsum;
    QT_CUDA(cudaMalloc((void **)&dsum, sizeof(double)));
    QT_CUDA(cudaMemset(dsum, 0, sizeof(double)));
    float *gl = g_f32(loss, n);
    qt_sum_f32(dsum, loss, n, 0);
    qt_sum_f32(dsum, loss, n, 0);
    double hs, rs = 0;
    QT_CUDA(cudaDeviceSynchronize());
    QT_CUDA(cudaMemcpy(&hs, dsum, sizeof hs, cudaMemcpyDeviceToHost));
    for (long i = 0; i < n; i++) rs += 2.0 * gl[i];
    QT_EXPECT(bad || fabs(hs - rs) <= 1e-9 * fabs(rs) + 1e-12, "loss sum %.17g vs %.17g", hs, rs);
    free(lg); free(hb); free(tgt); free(rtgt); free(gl); free(rl); free(rd); free(rlse);
    cudaFree(dt); cudaFree(buf); cudaFree(loss); cudaFree(lse); cudaFree(dsum);
}
static void test_lmhead_loss(void) {
    NEED_GPU();
    const qt_lmhead_impl CL = QT_LMHEAD_CLUSTER;
    loss_case(3, 151936, 2.0f, 0, 0, CL);  /* Qwen's vocabulary: 8 CTAs per row */
    loss_case(13, 151936, 2.0f, 3, 1, CL); /* rows start off a 16-byte boundary; a bad target */
    loss_case(11, 50257, 3.0f, 0, 1, CL);  /* odd v: each row's head and tail differ; 4 CTAs */
    loss_case(300, 32000, 2.0f, 0, 0, CL); /* many clusters of 2 */
    /* more rows than resident clusters: the pipelined kernel loops, with ignored and bad rows inside */
    loss_case(70, 151936, 2.0f, 3, 1, CL);
    loss_case(400, 50257, 3.0f, 1, 1, CL);
    loss_case(9, 1009, 4.0f, 1, 0, CL);    /* a prime v, clusters of 1 */
    loss_case(7, 1000, 4.0f, 0, 0, CL);
    loss_case(5, 1003, 1.0f, 0, 1, CL);    /* v % 8 != 0: the two-pass scalar path */
    loss_case(2, 8, 0.5f, 0, 0, CL);       /* the ignored row plus one */
    loss_case(5, 3, 1.0f, 5, 0, CL);       /* rows shorter than the scalar head */
    loss_case(2, 300007, 1.0f, 0, 0, QT_LMHEAD_TWO_PASS); /* past the cluster's registers: falls back */
}

/* ---- AdamW ---- */
#define NT 5
/* the last tensor starts off a multiple of 4: scalar head, groups of 4, scalar tail */
static const qt_adamw_tensor ATAB[NT] = {{0, 5000, 0.1f, 0}, {5056, 7, 0.0f, 5056}, {5120, 10000, 0.1f, 5120},
                                         {15168, 1, 0.0f, 15168}, {15171, 14, 0.1f, 15171}};
#define ATOT 15232

static void test_adamw_master(void) {
    NEED_GPU();
    float *w = h_rand(ATOT, 0.5f), *m = calloc(ATOT, 4), *v = calloc(ATOT, 4);
    for (int k = 0; k < NT; k++) /* padding sentinels */
        for (size_t i = ATAB[k].offset + ATAB[k].numel; i < (k + 1 < NT ? ATAB[k + 1].offset : ATOT); i++) w[i] = 7.0f;
    float *dw = d_f32(w, ATOT), *dm = d_f32(m, ATOT), *dv = d_f32(v, ATOT), *dg = d_poison(ATOT * 4);
    void *wb = d_poison(ATOT * 2);
    float *absmax = d_poison(NT * 4), *gs = d_poison(4), hgs = 0.5f;
    QT_CUDA(cudaMemcpy(gs, &hgs, 4, cudaMemcpyHostToDevice));
    qt_adamw_plan *p = qt_adamw_plan_create(ATAB, NT);
    qt_adamw_args a = {1e-2f, 0.9f, 0.95f, 1e-8f, 1, 0, 0};
    qt_adamw_hp hp = {1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f};
    for (long t = 1; t <= 3; t++) {
        float *g = h_rand(ATOT, 1.0f);
        QT_CUDA(cudaMemcpy(dg, g, ATOT * 4, cudaMemcpyHostToDevice));
        a.t = t;
        qt_adamw_step(p, wb, dw, dg, dm, QT_DT_F32, dv, QT_DT_F32, gs, absmax, &a, 0);
        for (int k = 0; k < NT; k++) {
            size_t o = ATAB[k].offset;
            qt_adamw_cpu(w + o, g + o, m + o, v + o, ATAB[k].numel, &hp, ATAB[k].wd, t, hgs);
        }
        free(g);
    }
    float *gw = g_f32(dw, ATOT), *gm = g_f32(dm, ATOT), *gv = g_f32(dv, ATOT), *gb = g_bf16(wb, ATOT);
    float *ga = g_f32(absmax, NT);
    QT_EXPECT(qt_t_close("master", gw, w, ATOT, 0, 1e-6), "fp32 master path");
    QT_EXPECT(qt_t_close("m", gm, m, ATOT, 0, 1e-6), "m");
    QT_EXPECT(qt_t_close("v", gv, v, ATOT, 0, 1e-6), "v");
    for (int k = 0; k < NT; k++) {
        float mx = 0;
        for (size_t i = ATAB[k].offset; i < ATAB[k].offset + ATAB[k].numel; i++) {
            float r = qt_bf16_to_f32(qt_f32_to_bf16(gw[i]));
            QT_REQUIRE(gb[i] == r, "bf16 copy [%zu] %g vs rne(master) %g", i, gb[i], r);
            mx = fabsf(r) > mx ? fabsf(r) : mx;
        }
        QT_EXPECT(ga[k] == mx, "absmax[%d] %g vs %g", k, ga[k], mx);
        size_t end = k + 1 < NT ? ATAB[k + 1].offset : ATOT;
        for (size_t i = ATAB[k].offset + ATAB[k].numel; i < end; i++)
            QT_REQUIRE(gw[i] == 7.0f && isnan(gb[i]), "padding [%zu] touched: %g / %g", i, gw[i], gb[i]);
    }
    qt_adamw_plan_free(p);
    free(w); free(m); free(v); free(gw); free(gm); free(gv); free(gb); free(ga);
    cudaFree(dw); cudaFree(dm); cudaFree(dv); cudaFree(dg); cudaFree(wb); cudaFree(absmax); cudaFree(gs);
}

/* bf16 m/v and bf16-only weights with stochastic rounding. */
static void test_adamw_bf16(void) {
    NEED_GPU();
    float *w = h_rand(ATOT, 0.5f), *g = h_rand(ATOT, 1.0f), *zero = calloc(ATOT, 4);
    h_round(w, ATOT);
    float *m = calloc(ATOT, 4), *v = calloc(ATOT, 4), *wr = h_copy(w, ATOT);
    void *dw = d_bf16(w, ATOT), *dw2 = d_bf16(w, ATOT), *dm = d_bf16(zero, ATOT), *dv = d_bf16(zero, ATOT);
    float *dg = d_f32(g, ATOT);
    qt_adamw_plan *p = qt_adamw_plan_create(ATAB, NT);
    qt_adamw_args a = {1e-3f, 0.9f, 0.95f, 1e-8f, 1, 1234, 1};
    qt_adamw_hp hp = {1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f};
    qt_adamw_step(p, dw, NULL, dg, dm, QT_DT_BF16, dv, QT_DT_BF16, NULL, NULL, &a, 0);
    for (int k = 0; k < NT; k++) {
        size_t o = ATAB[k].offset;
        qt_adamw_cpu(wr + o, g + o, m + o, v + o, ATAB[k].numel, &hp, ATAB[k].wd, 1, 1.0f);
    }
    float *gw = g_bf16(dw, ATOT), *gm = g_bf16(dm, ATOT), *gv = g_bf16(dv, ATOT);
    int up = 0, down = 0;
    for (int k = 0; k < NT; k++)
        for (size_t i = ATAB[k].offset; i < ATAB[k].offset + ATAB[k].numel; i++) {
            /* stochastic rounding lands on one of the two bf16 neighbours of the fp32 result */
            uint32_t u;
            memcpy(&u, &wr[i], 4);
            float a0 = qt_bf16_to_f32((uint16_t)(u >> 16)), a1 = qt_bf16_to_f32((uint16_t)((u >> 16) + 1));
            int ok = gw[i] == a0 || gw[i] == a1 || gw[i] == wr[i];
            QT_REQUIRE(ok, "SR [%zu] %.9g not a neighbour of %.9g", i, gw[i], wr[i]);
            up += gw[i] > wr[i];
            down += gw[i] < wr[i];
        }
    QT_EXPECT(up > ATOT / 4 && down > ATOT / 4, "SR is biased: %d up, %d down", up, down);
    QT_EXPECT(qt_t_close("m bf16", gm, m, ATOT, 1e-6, 1e-2), "bf16 m");
    QT_EXPECT(qt_t_close("v bf16", gv, v, ATOT, 1e-8, 1e-2), "bf16 v");
    /* same seed: same bits */
    QT_CUDA(cudaMemset(dm, 0, ATOT * 2));
    QT_CUDA(cudaMemset(dv, 0, ATOT * 2));
    qt_adamw_step(p, dw2, NULL, dg, dm, QT_DT_BF16, dv, QT_DT_BF16, NULL, NULL, &a, 0);
    float *gw2 = g_bf16(dw2, ATOT);
    QT_EXPECT(memcmp(gw, gw2, ATOT * 4) == 0, "SR with the same seed differs");
    qt_adamw_plan_free(p);
    free(w); free(g); free(zero); free(m); free(v); free(wr); free(gw); free(gm); free(gv); free(gw2);
    cudaFree(dw); cudaFree(dw2); cudaFree(dm); cudaFree(dv); cudaFree(dg);
}

/* ZeRO-1: two ranks, two buckets (as qt_partition cuts them): each rank's master, m, v hold its piece of
 * each bucket back to back and its plan covers only those; they must update exactly like the whole
 * array, stochastic rounding included. */
static void test_adamw_sharded(void) {
    NEED_GPU();
    const size_t bucket[3] = {0, 5120, ATOT}; /* multiples of 128, the second inside tensor 2 */
    float *w = h_rand(ATOT, 0.5f), *zero = calloc(ATOT, 4);
    float *dmaster = d_f32(w, ATOT), *dm = d_f32(zero, ATOT), *dv = d_f32(zero, ATOT), *dg = d_poison(ATOT * 4);
    void *wb = d_bf16(w, ATOT), *wb2 = d_bf16(w, ATOT);
    float *sm[2], *smm[2], *smv[2];
    qt_adamw_plan *whole = qt_adamw_plan_create(ATAB, NT), *part[2];
    for (int r = 0; r < 2; r++) {
        qt_adamw_tensor t[2 * NT];
        int nt = 0;
        float *hw = malloc(ATOT / 2 * 4);
        for (int bk = 0; bk < 2; bk++) {
            size_t len = (bucket[bk + 1] - bucket[bk]) / 2, lo = bucket[bk] + r * len, hi = lo + len, st = bucket[bk] / 2;
            memcpy(hw + st, w + lo, len * 4);
            for (int k = 0; k < NT; k++) {
                size_t a = ATAB[k].offset > lo ? ATAB[k].offset : lo;
                size_t b = ATAB[k].offset + ATAB[k].numel < hi ? ATAB[k].offset + ATAB[k].numel : hi;
                if (a < b) t[nt++] = (qt_adamw_tensor){a, b - a, ATAB[k].wd, st + (a - lo)};
            }
        }
        part[r] = qt_adamw_plan_create(t, nt);
        sm[r] = d_f32(hw, ATOT / 2);
        smm[r] = d_f32(zero, ATOT / 2);
        smv[r] = d_f32(zero, ATOT / 2);
        free(hw);
    }
    qt_adamw_args a = {1e-2f, 0.9f, 0.95f, 1e-8f, 1, 77, 1};
    for (long t = 1; t <= 3; t++) {
        float *g = h_rand(ATOT, 1.0f);
        QT_CUDA(cudaMemcpy(dg, g, ATOT * 4, cudaMemcpyHostToDevice));
        a.t = t;
        qt_adamw_step(whole, wb, dmaster, dg, dm, QT_DT_F32, dv, QT_DT_F32, NULL, NULL, &a, 0);
        for (int r = 0; r < 2; r++)
            qt_adamw_step(part[r], wb2, sm[r], dg, smm[r], QT_DT_F32, smv[r], QT_DT_F32, NULL, NULL, &a, 0);
        free(g);
    }
    float *gw = g_f32(dmaster, ATOT), *gm = g_f32(dm, ATOT), *gv = g_f32(dv, ATOT);
    float *gb = g_bf16(wb, ATOT), *gb2 = g_bf16(wb2, ATOT);
    for (int r = 0; r < 2; r++) {
        float *hm = g_f32(sm[r], ATOT / 2), *hmm = g_f32(smm[r], ATOT / 2), *hmv = g_f32(smv[r], ATOT / 2);
        for (int bk = 0; bk < 2; bk++) {
            size_t len = (bucket[bk + 1] - bucket[bk]) / 2, lo = bucket[bk] + r * len, st = bucket[bk] / 2;
            QT_EXPECT(memcmp(hm + st, gw + lo, len * 4) == 0 && memcmp(hmm + st, gm + lo, len * 4) == 0 &&
                          memcmp(hmv + st, gv + lo, len * 4) == 0,
                      "rank %d, bucket %d: master/m/v differ from the whole array's", r, bk);
        }
        free(hm); free(hmm); free(hmv);
        cudaFree(sm[r]); cudaFree(smm[r]); cudaFree(smv[r]);
        qt_adamw_plan_free(part[r]);
    }
    QT_EXPECT(memcmp(gb, gb2, ATOT * 4) == 0, "bf16 weights (stochastic rounding) differ between sharded and whole");
    qt_adamw_plan_free(whole);
    free(w); free(zero); free(gw); free(gm); free(gv); free(gb); free(gb2);
    cudaFree(dmaster); cudaFree(dm); cudaFree(dv); cudaFree(dg); cudaFree(wb); cudaFree(wb2);
}

/* memory.offload_optimizer: the state in pinned host memory, streamed through the three slots in chunks
 * of 160002 (rounded to 160004) elements — 11 chunks in two groups per step, every slot reused — must
 * update bit for bit as the state on the device does, padding untouched, fp32 moments with RNE and bf16
 * ones with stochastic rounding. Each step's stream first sleeps 5 ms, so the copy streams would run
 * ahead of the updates if a slot were refilled before its chunk went back down; the last chunk's state
 * is copied on the host right after the stream syncs, so it must be back by then. */
#define OT 5
static const qt_adamw_tensor OTAB[OT] = {{0, 400000, 0.1f, 0}, {400032, 7, 0.0f, 400032}, {400096, 1, 0.0f, 400096},
                                         {400099, 14, 0.1f, 400099}, {400128, 1100000, 0.1f, 400128}};
#define OTOT 1500128
#define OCHUNK 160002
static void CUDART_CB sleep_5ms(void *unused) {
    (void)unused;
    struct timespec t = {0, 5000000L};
    nanosleep(&t, NULL);
}
static void test_adamw_offload(void) {
    NEED_GPU();
    cudaStream_t s;
    QT_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    const size_t tail = OTOT - OTOT / (OCHUNK + 2) * (OCHUNK + 2); /* the last chunk: 60092 elements */
    for (int bf = 0; bf < 2; bf++) {
        qt_dtype dt = bf ? QT_DT_BF16 : QT_DT_F32;
        size_t es = qt_dtype_size(dt);
        float *w = h_rand(OTOT, 0.5f);
        for (int k = 0; k < OT; k++) /* padding sentinels */
            for (size_t i = OTAB[k].offset + OTAB[k].numel; i < (k + 1 < OT ? OTAB[k + 1].offset : OTOT); i++) w[i] = 7.0f;
        float *dmaster = d_f32(w, OTOT), *dg = d_poison(OTOT * 4), *hmaster;
        void *dm = d_poison(OTOT * es), *dv = d_poison(OTOT * es), *hm, *hv;
        void *wb = d_bf16(w, OTOT), *wb2 = d_bf16(w, OTOT), *slots = d_poison(qt_gpu_optim_slot_bytes(OCHUNK, dt, dt));
        QT_CUDA(cudaMemset(dm, 0, OTOT * es));
        QT_CUDA(cudaMemset(dv, 0, OTOT * es));
        QT_CUDA(cudaHostAlloc((void **)&hmaster, OTOT * 4, cudaHostAllocDefault));
        QT_CUDA(cudaHostAlloc(&hm, OTOT * es, cudaHostAllocDefault));
        QT_CUDA(cudaHostAlloc(&hv, OTOT * es, cudaHostAllocDefault));
        memcpy(hmaster, w, OTOT * 4);
        memset(hm, 0, OTOT * es);
        memset(hv, 0, OTOT * es);
        const int start[2] = {0, 2};
        qt_gpu_optim *dev = qt_gpu_optim_create(OTAB, OT, start, 2, dmaster, dm, dt, dv, dt, NULL, 0);
        qt_gpu_optim *off = qt_gpu_optim_create(OTAB, OT, start, 2, hmaster, hm, dt, hv, dt, slots, OCHUNK);
        QT_EXPECT(qt_gpu_optim_groups(dev) == 2 && qt_gpu_optim_groups(off) == 2, "two groups expected");
        qt_adamw_args a = {1e-2f, 0.9f, 0.95f, 1e-8f, 1, 99, bf};
        float *snap = malloc(tail * 4);
        for (long t = 1; t <= 3; t++) {
            float *g = h_rand(OTOT, 1.0f);
            QT_CUDA(cudaMemcpyAsync(dg, g, OTOT * 4, cudaMemcpyHostToDevice, s));
            QT_CUDA(cudaLaunchHostFunc(s, sleep_5ms, NULL));
            a.t = t;
            for (int k = 0; k < 2; k++) {
                qt_gpu_optim_step(dev, k, wb, dg, NULL, &a, s);
                qt_gpu_optim_step(off, k, wb2, dg, NULL, &a, s);
            }
            QT_CUDA(cudaStreamSynchronize(s));
            memcpy(snap, hmaster + OTOT - tail, tail * 4);
            free(g);
        }
        float *gw = g_f32(dmaster, OTOT), *gb = g_bf16(wb, OTOT), *gb2 = g_bf16(wb2, OTOT);
        void *gm = malloc(OTOT * es), *gv = malloc(OTOT * es);
        QT_CUDA(cudaMemcpy(gm, dm, OTOT * es, cudaMemcpyDeviceToHost));
        QT_CUDA(cudaMemcpy(gv, dv, OTOT * es, cudaMemcpyDeviceToHost));
        int moved = 0;
        for (size_t i = 0; i < OTOT; i++) moved += gw[i] != w[i];
        QT_EXPECT(moved > OTOT / 2, "%s: only %d weights changed", qt_dtype_name(dt), moved);
        QT_EXPECT(memcmp(snap, gw + OTOT - tail, tail * 4) == 0, "%s: the last chunk was not back when the stream synced",
                  qt_dtype_name(dt));
        QT_EXPECT(memcmp(hmaster, gw, OTOT * 4) == 0, "%s: offloaded master differs from the device's", qt_dtype_name(dt));
        QT_EXPECT(memcmp(hm, gm, OTOT * es) == 0 && memcmp(hv, gv, OTOT * es) == 0, "%s: offloaded m / v differ",
                  qt_dtype_name(dt));
        QT_EXPECT(memcmp(gb, gb2, OTOT * 4) == 0, "%s: bf16 weights differ", qt_dtype_name(dt));
        for (int k = 0; k < OT; k++)
            for (size_t i = OTAB[k].offset + OTAB[k].numel; i < (k + 1 < OT ? OTAB[k + 1].offset : OTOT); i++)
                QT_REQUIRE(hmaster[i] == 7.0f, "padding [%zu] of the offloaded master: %g", i, hmaster[i]);
        qt_gpu_optim_free(dev);
        qt_gpu_optim_free(off);
        free(w); free(gw); free(gb); free(gb2); free(gm); free(gv); free(snap);
        cudaFree(dmaster); cudaFree(dg); cudaFree(dm); cudaFree(dv); cudaFree(wb); cudaFree(wb2); cudaFree(slots);
        cudaFreeHost(hmaster); cudaFreeHost(hm); cudaFreeHost(hv);
    }
    QT_CUDA(cudaStreamDestroy(s));
}

/* ---- gradient norm ---- */
static void test_grad_norm(void) {
    NEED_GPU();
    long n = 3000001;
    float *g = h_rand(n, 0.01f);
    float *dg = d_f32(g, n), *out = d_poison(8), *ws = d_poison(qt_grad_norm_ws_bytes());
    for (int off = 0; off < 2; off++) { /* off 1: misaligned, scalar path */
        double ref = qt_grad_norm_cpu(g + off, (size_t)(n - off));
        float maxn[3] = {0.0f, (float)(ref / 2), (float)(ref * 2)};
        for (int k = 0; k < 3; k++) {
            QT_CUDA(cudaMemset(out, 0xff, 8));
            qt_grad_norm(out, out + 1, dg + off, (size_t)(n - off), maxn[k], ws, 0);
            float *h = g_f32(out, 2);
            float rs = qt_clip_scale(ref, maxn[k]);
            QT_EXPECT(fabs(h[0] - ref) <= 1e-6 * ref, "off %d: norm %.9g vs %.9g", off, h[0], ref);
            QT_EXPECT(fabsf(h[1] - rs) <= 1e-6f * rs, "off %d max %g: scale %.9g vs %.9g", off, maxn[k], h[1], rs);
            qt_grad_norm(out, out + 1, dg + off, (size_t)(n - off), maxn[k], ws, 0);
            float *h2 = g_f32(out, 2);
            QT_EXPECT(memcmp(h, h2, 8) == 0, "off %d: two runs differ", off);
            free(h); free(h2);
        }
    }
    /* split over ranks: sums of squares of two slices, added in order; one part is qt_grad_norm itself */
    double *sq = (double *)d_poison(16);
    size_t half = 1500032;
    qt_grad_sumsq(sq, dg, half, ws, 0);
    qt_grad_sumsq(sq + 1, dg + half, (size_t)n - half, ws, 0);
    qt_clip_from_sumsq(out, out + 1, sq, 2, 1.0f, 0);
    float *h = g_f32(out, 2);
    double ref = qt_grad_norm_cpu(g, (size_t)n);
    QT_EXPECT(fabs(h[0] - ref) <= 1e-6 * ref, "2 parts: norm %.9g vs %.9g", h[0], ref);
    QT_EXPECT(fabsf(h[1] - qt_clip_scale(ref, 1.0f)) <= 1e-6f, "2 parts: scale %.9g", h[1]);
    qt_grad_sumsq(sq, dg, (size_t)n, ws, 0);
    qt_clip_from_sumsq(out, out + 1, sq, 1, 1.0f, 0);
    float *h1 = g_f32(out, 2);
    qt_grad_norm(out, out + 1, dg, (size_t)n, 1.0f, ws, 0);
    float *h2 = g_f32(out, 2);
    QT_EXPECT(memcmp(h1, h2, 8) == 0, "one part %.9g differs from qt_grad_norm %.9g", h1[0], h2[0]);
    free(h); free(h1); free(h2);
    cudaFree(sq);
    free(g);
    cudaFree(dg); cudaFree(out); cudaFree(ws);
}

int main(void) {
    qt_rng_seed(&R, 20261121);
    QT_RUN(test_casts);
    QT_RUN(test_embedding);
    QT_RUN(test_rmsnorm_fwd);
    QT_RUN(test_rmsnorm_bwd);
    QT_RUN(test_rope);
    QT_RUN(test_swiglu);
    QT_RUN(test_bias);
    QT_RUN(test_lmhead_loss);
    QT_RUN(test_adamw_master);
    QT_RUN(test_adamw_sharded);
    QT_RUN(test_adamw_offload);
    QT_RUN(test_adamw_bf16);
    QT_RUN(test_grad_norm);
    return qt_test_end();
}
