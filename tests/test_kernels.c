/* test_kernels.c — kernel properties that the op table (test_ops_gpu.c) cannot express: the fused SwiGLU
 * backward + quantize-transpose of the fp8 recompute bit for bit against the three kernels it replaces, and the
 * bf16 recompute's SwiGLU backward that writes h against the two; AdamW: a ZeRO-1 rank's
 * sharded plan against the whole array's, the offloaded optimizer state (src/gpu/gpu_optim.c) streamed
 * through device slots against the state kept on the device, and a bf16 master's stochastic rounding
 * under every cut, bit for bit. Every kernel's own check
 * against its CPU reference lives in test_ops_gpu.c's table. Skips without a GPU. */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "qt_dtype.h"
#include "qt_error.h"
#include "qt_gpu_optim.h"
#include "qt_kernels.h"
#include "qt_quant.h"
#include "qt_rng.h"
#include "qt_test.h"
#include "qt_test_hooks.h"

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


/* ---- SwiGLU backward that also writes h ---- */
/* qt_swiglu_bwd_h must give qt_swiglu_bwd's dgu and abs-max and, over dh, qt_swiglu_fwd's h: a bf16 backward
 * with the SwiGLU recomputed swaps the two for it (down's wgrad reads that h) and claims the same bits. dgu
 * over gu as the model writes it; vector and scalar shapes. The same for GeGLU's three entries. */
typedef void (*glu_fwd_fn)(void *, const void *, long, int, float *, cudaStream_t);
typedef void (*glu_bwd_fn)(void *, const void *, const void *, long, int, float *, cudaStream_t);
typedef void (*glu_bwd_h_fn)(void *, void *, const void *, long, int, float *, cudaStream_t);
static void glu_bwd_h_bitwise(glu_fwd_fn fwd, glu_bwd_fn bwd, glu_bwd_h_fn bwd_h) {
    static const long SH[][2] = {{1024, 4864}, {2048, 18944}, {33, 13}, {7, 24}};
    for (int c = 0; c < 4; c++) {
        long R = SH[c][0], C = SH[c][1], n = R * C;
        float *gu = h_rand(2 * n, 4.0f), *dh = h_rand(n, 1.0f), *am;
        void *gu1 = d_bf16(gu, 2 * n), *gu2 = d_bf16(gu, 2 * n), *dh1 = d_bf16(dh, n), *dh2 = d_bf16(dh, n);
        void *h1 = d_poison((size_t)n * 2);
        QT_CUDA(cudaMalloc((void **)&am, 2 * sizeof *am));
        QT_CUDA(cudaMemset(am, 0, 2 * sizeof *am));
        fwd(h1, gu1, R, (int)C, NULL, 0);
        bwd(gu1, dh1, gu1, R, (int)C, &am[0], 0);
        bwd_h(gu2, dh2, gu2, R, (int)C, &am[1], 0);
        uint16_t *a = malloc((size_t)n * 4), *b = malloc((size_t)n * 4);
        float a2[2];
        QT_CHECK(a && b, "out of memory");
        QT_CUDA(cudaDeviceSynchronize());
        long gdiff = 0, hdiff = 0;
        QT_CUDA(cudaMemcpy(a, gu1, (size_t)n * 4, cudaMemcpyDeviceToHost));
        QT_CUDA(cudaMemcpy(b, gu2, (size_t)n * 4, cudaMemcpyDeviceToHost));
        for (long i = 0; i < 2 * n; i++) gdiff += a[i] != b[i];
        QT_CUDA(cudaMemcpy(a, h1, (size_t)n * 2, cudaMemcpyDeviceToHost));
        QT_CUDA(cudaMemcpy(b, dh2, (size_t)n * 2, cudaMemcpyDeviceToHost));
        for (long i = 0; i < n; i++) hdiff += a[i] != b[i];
        QT_CUDA(cudaMemcpy(a2, am, sizeof a2, cudaMemcpyDeviceToHost));
        QT_EXPECT(gdiff == 0, "%ld x %ld: %ld of %ld dgu values differ", R, C, gdiff, 2 * n);
        QT_EXPECT(hdiff == 0, "%ld x %ld: %ld of %ld h values differ", R, C, hdiff, n);
        QT_EXPECT(!memcmp(&a2[0], &a2[1], 4), "%ld x %ld: dgu abs-max %g vs %g", R, C, a2[0], a2[1]);
        if (c == 0) printf("  %ld x %ld: %ld dgu and %ld h values, dgu abs-max %g: bitwise equal\n", R, C, 2 * n, n, a2[0]);
        free(a), free(b), free(gu), free(dh);
        cudaFree(gu1), cudaFree(gu2), cudaFree(dh1), cudaFree(dh2), cudaFree(h1), cudaFree(am);
    }
}
static void test_swiglu_bwd_h_bitwise(void) {
    NEED_GPU();
    glu_bwd_h_bitwise(qt_swiglu_fwd, qt_swiglu_bwd, qt_swiglu_bwd_h);
}
static void test_geglu_bwd_h_bitwise(void) {
    NEED_GPU();
    glu_bwd_h_bitwise(qt_geglu_fwd, qt_geglu_bwd, qt_geglu_bwd_h);
}

/* ---- SwiGLU backward + quantize-transpose ---- */
/* qt_swiglu_bwd_quant_transpose_cur must give the bytes of qt_swiglu_bwd (dgu and its abs-max) and of
 * qt_swiglu_fwd followed by qt_quant_fp8_transpose_cur over its bf16 output with the same scale record:
 * the fp8 recompute swaps the three kernels for it and claims the same training bits. dgu is written over
 * gu as the model does (one case out of place), vector and scalar shapes, gate values wide enough for
 * silu's saturation, both fp8 types. The same for GeGLU's (qt_geglu_*). */
typedef void (*glu_qt_fn)(void *, const void *, const void *, long, long, float *, qt_dtype, void *, qt_fp8_scale *,
                          int *, int, cudaStream_t);
static void glu_bwd_quant_t_bitwise(glu_fwd_fn fwd, glu_bwd_fn bwd, glu_qt_fn fused) {
    static const long SH[][2] = {{1024, 4864}, {2048, 18944}, {130, 72}, {33, 13}, {16, 8}};
    for (int c = 0; c < 5; c++)
        for (int e = 0; e < 2; e++) {
            qt_dtype dt = e ? QT_DT_E5M2 : QT_DT_E4M3;
            long R = SH[c][0], C = SH[c][1], n = R * C;
            int inplace = !(c == 2 && e == 1);
            float *gu = h_rand(2 * n, 4.0f), *dh = h_rand(n, 1.0f);
            void *dgu_ref = d_bf16(gu, 2 * n), *gu2 = d_bf16(gu, 2 * n), *dgu2 = inplace ? gu2 : d_poison((size_t)n * 4);
            void *ddh = d_bf16(dh, n), *h = d_poison((size_t)n * 2);
            uint8_t *yt1 = d_poison((size_t)n), *yt2 = d_poison((size_t)n);
            qt_fp8_scale *sc;
            float *am;
            int *flag;
            QT_CUDA(cudaMalloc((void **)&sc, 2 * sizeof *sc));
            QT_CUDA(cudaMalloc((void **)&am, 2 * sizeof *am));
            QT_CUDA(cudaMalloc((void **)&flag, sizeof *flag));
            QT_CUDA(cudaMemset(sc, 0, 2 * sizeof *sc));
            QT_CUDA(cudaMemset(am, 0, 2 * sizeof *am));
            QT_CUDA(cudaMemset(flag, 0, sizeof *flag));
            /* the three kernels: the forward's h and its abs-max, its codes, then the backward in place */
            fwd(h, dgu_ref, R, (int)C, &sc[0].amax, 0);
            qt_quant_fp8_transpose_cur(dt, NULL, yt1, QT_DT_BF16, h, R, C, &sc[0], flag, 1, 0);
            QT_CUDA(cudaMemcpy(&sc[1], &sc[0], sizeof *sc, cudaMemcpyDeviceToDevice));
            bwd(dgu_ref, ddh, dgu_ref, R, (int)C, &am[0], 0);
            fused(dgu2, ddh, gu2, R, C, &am[1], dt, yt2, &sc[1], flag, 1, 0);
            uint8_t *a = malloc((size_t)n), *b = malloc((size_t)n);
            uint16_t *ga = malloc((size_t)n * 4), *gb = malloc((size_t)n * 4);
            qt_fp8_scale s2[2];
            float a2[2];
            QT_CHECK(a && b && ga && gb, "out of memory");
            QT_CUDA(cudaDeviceSynchronize());
            QT_CUDA(cudaMemcpy(a, yt1, (size_t)n, cudaMemcpyDeviceToHost));
            QT_CUDA(cudaMemcpy(b, yt2, (size_t)n, cudaMemcpyDeviceToHost));
            QT_CUDA(cudaMemcpy(ga, dgu_ref, (size_t)n * 4, cudaMemcpyDeviceToHost));
            QT_CUDA(cudaMemcpy(gb, dgu2, (size_t)n * 4, cudaMemcpyDeviceToHost));
            QT_CUDA(cudaMemcpy(s2, sc, sizeof s2, cudaMemcpyDeviceToHost));
            QT_CUDA(cudaMemcpy(a2, am, sizeof a2, cudaMemcpyDeviceToHost));
            long diff = 0, first = -1, gdiff = 0;
            for (long i = 0; i < n; i++)
                if (a[i] != b[i]) diff++, first = first < 0 ? i : first;
            for (long i = 0; i < 2 * n; i++) gdiff += ga[i] != gb[i];
            QT_EXPECT(diff == 0, "%ld x %ld %s: %ld of %ld codes differ (first at %ld: %#x vs %#x)", R, C,
                      qt_dtype_name(dt), diff, n, first, first >= 0 ? a[first] : 0, first >= 0 ? b[first] : 0);
            QT_EXPECT(gdiff == 0, "%ld x %ld: %ld of %ld dgu values differ", R, C, gdiff, 2 * n);
            QT_EXPECT(!memcmp(&a2[0], &a2[1], 4), "%ld x %ld: dgu abs-max %g vs %g", R, C, a2[0], a2[1]);
            QT_EXPECT(!memcmp(&s2[0], &s2[1], sizeof s2[0]), "%ld x %ld: scale records differ", R, C);
            if (c == 0 && e == 0)
                printf("  %ld x %ld: %ld codes, %ld dgu values, h abs-max %g, dgu abs-max %g: bitwise equal\n", R, C, n,
                       2 * n, s2[0].amax, a2[0]);
            free(a), free(b), free(ga), free(gb), free(gu), free(dh);
            cudaFree(dgu_ref), cudaFree(gu2), cudaFree(ddh), cudaFree(h), cudaFree(yt1), cudaFree(yt2), cudaFree(sc);
            cudaFree(am), cudaFree(flag);
            if (!inplace) cudaFree(dgu2);
        }
}
static void test_swiglu_bwd_quant_t_bitwise(void) {
    NEED_GPU();
    glu_bwd_quant_t_bitwise(qt_swiglu_fwd, qt_swiglu_bwd, qt_swiglu_bwd_quant_transpose_cur);
}
static void test_geglu_bwd_quant_t_bitwise(void) {
    NEED_GPU();
    glu_bwd_quant_t_bitwise(qt_geglu_fwd, qt_geglu_bwd, qt_geglu_bwd_quant_transpose_cur);
}

/* ---- AdamW ---- */
#define NT 5
/* the last tensor starts off a multiple of 4: scalar head, groups of 4, scalar tail */
static const qt_adamw_tensor ATAB[NT] = {{0, 5000, 0.1f, 0, 0}, {5056, 7, 0.0f, 5056, 0}, {5120, 10000, 0.1f, 5120, 0},
                                         {15168, 1, 0.0f, 15168, 0}, {15171, 14, 0.1f, 15171, 0}};
#define ATOT 15232

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
                if (a < b) t[nt++] = (qt_adamw_tensor){a, b - a, ATAB[k].wd, st + (a - lo), 0};
            }
        }
        part[r] = qt_adamw_plan_create(t, nt);
        sm[r] = d_f32(hw, ATOT / 2);
        smm[r] = d_f32(zero, ATOT / 2);
        smv[r] = d_f32(zero, ATOT / 2);
        free(hw);
    }
    qt_adamw_args a = {1e-2f, 0.9f, 0.95f, 1e-8f, 1, 77, 1, 0, 0, NULL};
    for (long t = 1; t <= 3; t++) {
        float *g = h_rand(ATOT, 1.0f);
        QT_CUDA(cudaMemcpy(dg, g, ATOT * 4, cudaMemcpyHostToDevice));
        a.t = t;
        qt_adamw_step(whole, wb, dmaster, dg, QT_DT_F32, dm, QT_DT_F32, dv, QT_DT_F32, NULL, NULL, &a, 0);
        for (int r = 0; r < 2; r++)
            qt_adamw_step(part[r], wb2, sm[r], dg, QT_DT_F32, smm[r], QT_DT_F32, smv[r], QT_DT_F32, NULL, NULL, &a, 0);
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

/* A layout padded between its units (qt_layout_init_units) rounds as the compact one: the same tensors, each PAD x k
 * elements further on with sr_shift = PAD x k, give the same master, m, v and stochastically rounded bf16 weights
 * bit for bit; the padding is left untouched. With sr_shift 0 the rounding hashes other indices and the bf16
 * weights differ (what the test would catch if the shift were lost). */
#define PAD 256
static void adamw_padded_run(const qt_adamw_tensor *t, const float *w, const float *g3, long n, float **master,
                             float **wbf) {
    float *zero = calloc((size_t)n, 4), *dmaster = d_f32(w, n), *dm = d_f32(zero, n), *dv = d_f32(zero, n);
    float *dg = d_f32(g3, n);
    void *wb = d_bf16(w, n);
    qt_adamw_plan *p = qt_adamw_plan_create(t, NT);
    qt_adamw_args a = {1e-2f, 0.9f, 0.95f, 1e-8f, 1, 123, 1, 0, 0, NULL};
    for (long k = 1; k <= 3; k++) {
        QT_CUDA(cudaMemcpy(dg, g3 + (k - 1) * n, (size_t)n * 4, cudaMemcpyHostToDevice));
        a.t = k;
        qt_adamw_step(p, wb, dmaster, dg, QT_DT_F32, dm, QT_DT_F32, dv, QT_DT_F32, NULL, NULL, &a, 0);
    }
    *master = g_f32(dmaster, n);
    *wbf = g_bf16(wb, n);
    qt_adamw_plan_free(p);
    free(zero);
    cudaFree(dmaster); cudaFree(dm); cudaFree(dv); cudaFree(dg); cudaFree(wb);
}
static void test_adamw_padded_layout(void) {
    NEED_GPU();
    const long np = ATOT + PAD * NT;
    qt_adamw_tensor pad[NT], lost[NT];
    float *w = h_rand(ATOT, 0.5f), *wp = h_rand(np, 0.5f), *g = malloc(3 * ATOT * 4), *gp = calloc(3 * (size_t)np, 4);
    for (int k = 0; k < NT; k++) {
        size_t at = ATAB[k].offset + (size_t)PAD * k;
        pad[k] = (qt_adamw_tensor){at, ATAB[k].numel, ATAB[k].wd, at, (size_t)PAD * k};
        lost[k] = pad[k], lost[k].sr_shift = 0;
        memcpy(wp + at, w + ATAB[k].offset, ATAB[k].numel * 4);
    }
    for (int s = 0; s < 3; s++) {
        float *gs = h_rand(ATOT, 1.0f);
        memcpy(g + s * ATOT, gs, ATOT * 4);
        for (int k = 0; k < NT; k++)
            memcpy(gp + s * np + pad[k].offset, gs + ATAB[k].offset, ATAB[k].numel * 4);
        free(gs);
    }
    float *cm, *cb, *pm, *pb, *lm, *lb;
    adamw_padded_run(ATAB, w, g, ATOT, &cm, &cb);
    adamw_padded_run(pad, wp, gp, np, &pm, &pb);
    adamw_padded_run(lost, wp, gp, np, &lm, &lb);
    int diff_lost = 0;
    for (int k = 0; k < NT; k++) {
        size_t c = ATAB[k].offset, q = pad[k].offset, n = ATAB[k].numel;
        QT_EXPECT(memcmp(cm + c, pm + q, n * 4) == 0 && memcmp(cb + c, pb + q, n * 4) == 0,
                  "tensor %d: the padded layout's master or bf16 weights differ from the compact layout's", k);
        diff_lost |= memcmp(cb + c, lb + q, n * 4) != 0;
    }
    for (int k = 0; k < NT; k++) { /* the padding before tensor k keeps its uploaded bf16 bits */
        size_t lo = k ? pad[k - 1].offset + pad[k - 1].numel : 0, hi = pad[k].offset;
        for (size_t i = lo; i < hi; i++) QT_EXPECT(pb[i] == qt_bf16_to_f32(qt_f32_to_bf16(wp[i])), "padding element %zu changed", i);
    }
    QT_EXPECT(diff_lost, "with sr_shift 0 the stochastic rounding gives the same bits: the test cannot see a lost shift");
    free(w); free(wp); free(g); free(gp); free(cm); free(cb); free(pm); free(pb); free(lm); free(lb);
}

/* AdamW's NaN/Inf count (qt_adamw_args.nonfinite: the engine's per-step finiteness check, made as the weights
 * are written): gradients with NaN / +Inf / -Inf at elements on the vector path, in the scalar head and tails
 * (tensors 1 and 4), a one-element tensor, and in alignment padding (not updated, so not counted); with an fp32
 * master and its bf16 copy, and with bf16 weights only (stochastic rounding). The counter starts at 5 and is
 * added to; a finite step adds nothing; the count equals the NaN/Inf new weights read back; a NULL counter
 * leaves it alone. */
static void test_adamw_counts_nonfinite(void) {
    NEED_GPU();
    static const size_t poison[] = {3, 4097, 5061, 5200, 15168, 15171, 15176, 15184, 5010, 15130};
    const int n_poison = (int)(sizeof poison / sizeof poison[0]), in_padding = 2;
    qt_adamw_plan *p = qt_adamw_plan_create(ATAB, NT);
    unsigned *cnt, got = 0, start = 5;
    QT_CUDA(cudaMalloc((void **)&cnt, sizeof *cnt));
    for (int master = 0; master < 2; master++) {
        float *w = h_rand(ATOT, 0.5f), *zero = calloc(ATOT, 4), *g1 = h_rand(ATOT, 1.0f), *g2 = h_rand(ATOT, 1.0f);
        for (int k = 0; k < n_poison; k++) g2[poison[k]] = k % 3 == 0 ? NAN : k % 3 == 1 ? INFINITY : -INFINITY;
        float *dmaster = master ? d_f32(w, ATOT) : NULL, *dm = d_f32(zero, ATOT), *dv = d_f32(zero, ATOT);
        float *dg1 = d_f32(g1, ATOT), *dg2 = d_f32(g2, ATOT);
        void *wb = d_bf16(w, ATOT);
        QT_CUDA(cudaMemcpy(cnt, &start, sizeof start, cudaMemcpyHostToDevice));
        qt_adamw_args a = {1e-2f, 0.9f, 0.95f, 1e-8f, 1, 5, !master, 0, 0, cnt};
        qt_adamw_step(p, wb, dmaster, dg1, QT_DT_F32, dm, QT_DT_F32, dv, QT_DT_F32, NULL, NULL, &a, 0);
        QT_CUDA(cudaMemcpy(&got, cnt, sizeof got, cudaMemcpyDeviceToHost));
        QT_EXPECT(got == start, "master %d: a finite step counted %u (expected the start, %u)", master, got, start);
        a.t = 2;
        qt_adamw_step(p, wb, dmaster, dg2, QT_DT_F32, dm, QT_DT_F32, dv, QT_DT_F32, NULL, NULL, &a, 0);
        QT_CUDA(cudaMemcpy(&got, cnt, sizeof got, cudaMemcpyDeviceToHost));
        float *hb = g_bf16(wb, ATOT);
        unsigned want = 0;
        for (int i = 0; i < ATOT; i++) want += !isfinite(hb[i]);
        printf("  %s: %u NaN/Inf weights read back (%d poisoned gradients, %d in padding), counted %u - %u\n",
               master ? "fp32 master + bf16 copy" : "bf16 weights (SR)", want, n_poison, in_padding, got, start);
        QT_EXPECT(want == (unsigned)(n_poison - in_padding), "master %d: %u NaN/Inf weights, expected %d", master, want,
                  n_poison - in_padding);
        QT_EXPECT(got == start + want, "master %d: counted %u, expected %u + %u", master, got - start, start, want);
        a.t = 3, a.nonfinite = NULL;
        qt_adamw_step(p, wb, dmaster, dg2, QT_DT_F32, dm, QT_DT_F32, dv, QT_DT_F32, NULL, NULL, &a, 0);
        unsigned after = 0;
        QT_CUDA(cudaMemcpy(&after, cnt, sizeof after, cudaMemcpyDeviceToHost));
        QT_EXPECT(after == got, "master %d: a step without a counter changed it (%u -> %u)", master, got, after);
        free(w), free(zero), free(g1), free(g2), free(hb);
        cudaFree(dmaster), cudaFree(dm), cudaFree(dv), cudaFree(dg1), cudaFree(dg2), cudaFree(wb);
    }
    cudaFree(cnt);
    qt_adamw_plan_free(p);
}

/* memory.offload_optimizer: the state in pinned host memory, streamed through the three slots in chunks
 * of 160002 (rounded to 160004) elements — 11 chunks in two groups per step, every slot reused — must
 * update bit for bit as the state on the device does, padding untouched, fp32 moments with RNE and bf16
 * ones with stochastic rounding. Each step's stream first sleeps 5 ms, so the copy streams would run
 * ahead of the updates if a slot were refilled before its chunk went back down; the last chunk's state
 * is copied on the host right after the stream syncs, so it must be back by then. */
#define OT 5
static const qt_adamw_tensor OTAB[OT] = {{0, 400000, 0.1f, 0, 0}, {400032, 7, 0.0f, 400032, 0}, {400096, 1, 0.0f, 400096, 0},
                                         {400099, 14, 0.1f, 400099, 0}, {400128, 1100000, 0.1f, 400128, 0}};
#define OTOT 1500128
#define OCHUNK 160002
static void CUDART_CB sleep_5ms(void *unused) {
    (void)unused;
    struct timespec t = {0, 5000000L};
    nanosleep(&t, NULL);
}
/* AdamW step t of both optimizers (two groups each) on fresh random gradients behind a 5 ms stall, then a
 * sync; the bf16 weights wb (dev) and wb2 (off). */
static void steps_at(qt_gpu_optim *dev, qt_gpu_optim *off, void *wb, void *wb2, float *dg, float *dg2, qt_adamw_args *a,
                     long t, cudaStream_t s) {
    float *g = h_rand(OTOT, 1.0f);
    QT_CUDA(cudaMemcpyAsync(dg, g, OTOT * 4, cudaMemcpyHostToDevice, s));
    QT_CUDA(cudaLaunchHostFunc(s, sleep_5ms, NULL));
    /* behind the stall, in s's order (device to pinned host is): streamed gradients must be read after it */
    if (dg2 != dg) QT_CUDA(cudaMemcpyAsync(dg2, dg, OTOT * 4, cudaMemcpyDefault, s));
    a->t = t;
    for (int k = 0; k < 2; k++) {
        qt_gpu_optim_step(dev, k, wb, dg, QT_DT_F32, NULL, a, s);
        qt_gpu_optim_step(off, k, wb2, dg2, QT_DT_F32, NULL, a, s);
    }
    QT_CUDA(cudaStreamSynchronize(s));
    free(g);
}
static void two_steps_at(qt_gpu_optim *dev, qt_gpu_optim *off, void *wb, void *wb2, float *dg, qt_adamw_args *a, long t,
                         cudaStream_t s) {
    steps_at(dev, off, wb, wb2, dg, dg, a, t, s);
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
        void *wb = d_bf16(w, OTOT), *wb2 = d_bf16(w, OTOT), *slots = d_poison(qt_gpu_optim_slot_bytes(OCHUNK, QT_OPTIM_ALL, dt, dt, QT_DT_F32));
        QT_CUDA(cudaMemset(dm, 0, OTOT * es));
        QT_CUDA(cudaMemset(dv, 0, OTOT * es));
        QT_CUDA(cudaHostAlloc((void **)&hmaster, OTOT * 4, cudaHostAllocDefault));
        QT_CUDA(cudaHostAlloc(&hm, OTOT * es, cudaHostAllocDefault));
        QT_CUDA(cudaHostAlloc(&hv, OTOT * es, cudaHostAllocDefault));
        memcpy(hmaster, w, OTOT * 4);
        memset(hm, 0, OTOT * es);
        memset(hv, 0, OTOT * es);
        const int start[2] = {0, 2};
        qt_gpu_optim *dev = qt_gpu_optim_create(OTAB, OT, start, 2, dmaster, dm, dt, dv, dt, QT_DT_F32, NULL, 0, 0);
        qt_gpu_optim *off = qt_gpu_optim_create(OTAB, OT, start, 2, hmaster, hm, dt, hv, dt, QT_DT_F32, slots, OCHUNK, QT_OPTIM_ALL);
        QT_EXPECT(qt_gpu_optim_groups(dev) == 2 && qt_gpu_optim_groups(off) == 2, "two groups expected");
        qt_adamw_args a = {1e-2f, 0.9f, 0.95f, 1e-8f, 1, 99, bf, 0, 0, NULL};
        float *snap = malloc(tail * 4);
        for (long t = 1; t <= 3; t++) {
            two_steps_at(dev, off, wb, wb2, dg, &a, t, s);
            memcpy(snap, hmaster + OTOT - tail, tail * 4);
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

/* The three state arrays (fp32 master, m and v of es bytes) twice: ref on the device, arr where mask puts them
 * (host: pinned, else the device); the master from w, the moments zero. */
typedef struct {
    void *ref[3], *arr[3];
    size_t bytes[3];
    int mask;
} state3;
static void state3_make(state3 *st, const float *w, int mask, size_t es) {
    *st = (state3){.bytes = {OTOT * 4, OTOT * es, OTOT * es}, .mask = mask};
    for (int k = 0; k < 3; k++) {
        st->ref[k] = d_poison(st->bytes[k]);
        if (mask >> k & 1) QT_CUDA(cudaHostAlloc(&st->arr[k], st->bytes[k], cudaHostAllocDefault));
        else st->arr[k] = d_poison(st->bytes[k]);
        if (k == 0) {
            QT_CUDA(cudaMemcpy(st->ref[0], w, st->bytes[0], cudaMemcpyHostToDevice));
            QT_CUDA(cudaMemcpy(st->arr[0], w, st->bytes[0], cudaMemcpyDefault));
        } else {
            QT_CUDA(cudaMemset(st->ref[k], 0, st->bytes[k]));
            QT_CUDA(cudaMemset(st->arr[k], 0, st->bytes[k])); /* host or device: memset through UVA */
        }
    }
}
/* 1 when arrays k0..2 of ref and arr hold the same bytes. */
static int state3_same(const state3 *st, int k0) {
    int same = 1;
    for (int k = k0; k < 3; k++) {
        char *x = malloc(st->bytes[k]), *y = malloc(st->bytes[k]);
        QT_CUDA(cudaMemcpy(x, st->ref[k], st->bytes[k], cudaMemcpyDefault));
        QT_CUDA(cudaMemcpy(y, st->arr[k], st->bytes[k], cudaMemcpyDefault));
        same &= !memcmp(x, y, st->bytes[k]);
        free(x), free(y);
    }
    return same;
}
static void state3_free(state3 *st) {
    for (int k = 0; k < 3; k++) {
        cudaFree(st->ref[k]);
        if (st->mask >> k & 1) cudaFreeHost(st->arr[k]);
        else cudaFree(st->arr[k]);
    }
}

/* The bf16 weights (W) and the gradients (G) in pinned host memory, streamed through the slots with the
 * offloaded state (memory.offload [weights] / [gradients] with the optimizer offloaded): with and without
 * an fp32 master, fp32 and bf16 moments, each alone and both; after 3 steps (each behind a 5 ms stall) the
 * host weights, master, m and v are the all-device run's bits. Then the mutants (weights not copied down,
 * gradients not up, the copies up not waiting for the stream that wrote the host gradients behind its
 * stall; the mutant build only) must differ. */
static void test_adamw_offload_streamed(void) {
    NEED_GPU();
    cudaStream_t s;
    QT_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    const struct { int mask, master; qt_mutant mutant; const char *what; } cases[] = {
        {QT_OPTIM_ALL | QT_OPTIM_W | QT_OPTIM_G, 1, QT_MUT_NONE, ""},
        {QT_OPTIM_M | QT_OPTIM_V | QT_OPTIM_W, 1, QT_MUT_NONE, ""},
        {QT_OPTIM_MASTER | QT_OPTIM_G, 1, QT_MUT_NONE, ""},
        {QT_OPTIM_M | QT_OPTIM_V | QT_OPTIM_W | QT_OPTIM_G, 0, QT_MUT_NONE, ""},
        {QT_OPTIM_M | QT_OPTIM_V | QT_OPTIM_W, 0, QT_MUT_NONE, ""},
        {QT_OPTIM_M | QT_OPTIM_V | QT_OPTIM_W | QT_OPTIM_G, 0, QT_MUT_OPT_W_NOT_DOWN, " (MUTANT: weights not down)"},
        {QT_OPTIM_ALL | QT_OPTIM_W | QT_OPTIM_G, 1, QT_MUT_OPT_G_NOT_UP, " (MUTANT: gradients not up)"},
        {QT_OPTIM_M | QT_OPTIM_V | QT_OPTIM_G, 0, QT_MUT_OPT_UP_NO_STREAM_WAIT,
         " (MUTANT: copies up before the gradients are written)"},
    };
    if (!QT_T_MUTANTS) printf("  the mutants: " QT_T_MUTANTS_ONLY "\n");
    for (int bf = 0; bf < 2; bf++)
        for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
            if (cases[ci].mutant != QT_MUT_NONE && !QT_T_MUTANTS) continue;
            int mask = cases[ci].mask, hm = cases[ci].master;
            qt_dtype dt = bf ? QT_DT_BF16 : QT_DT_F32;
            float *w = h_rand(OTOT, 0.5f), *dg = d_poison(OTOT * 4), *dg2;
            void *wb = d_bf16(w, OTOT), *wb2;
            uint16_t *w16 = malloc(OTOT * 2);
            QT_CUDA(cudaMemcpy(w16, wb, OTOT * 2, cudaMemcpyDeviceToHost));
            if (mask & QT_OPTIM_W) {
                QT_CUDA(cudaHostAlloc(&wb2, OTOT * 2, cudaHostAllocDefault));
                memcpy(wb2, w16, OTOT * 2);
            } else {
                wb2 = d_bf16(w, OTOT);
            }
            if (mask & QT_OPTIM_G) QT_CUDA(cudaHostAlloc((void **)&dg2, OTOT * 4, cudaHostAllocDefault));
            else dg2 = d_poison(OTOT * 4);
            void *slots = d_poison(qt_gpu_optim_slot_bytes(OCHUNK, mask & (hm ? ~0 : ~QT_OPTIM_MASTER), dt, dt, QT_DT_F32));
            state3 st;
            state3_make(&st, w, mask, qt_dtype_size(dt));
            const int start[2] = {0, 2};
            qt_t_hooks(NULL, cases[ci].mutant);
            qt_gpu_optim *dev = qt_gpu_optim_create(OTAB, OT, start, 2, hm ? st.ref[0] : NULL, st.ref[1], dt, st.ref[2], dt,
                                                    QT_DT_F32, NULL, 0, 0);
            qt_gpu_optim *off = qt_gpu_optim_create(OTAB, OT, start, 2, hm ? st.arr[0] : NULL, st.arr[1], dt, st.arr[2], dt,
                                                    QT_DT_F32, slots, OCHUNK, mask);
            qt_adamw_args a = {1e-2f, 0.9f, 0.95f, 1e-8f, 1, 99, bf || !hm, 0, 0, NULL};
            for (long t = 1; t <= 3; t++) steps_at(dev, off, wb, wb2, dg, dg2, &a, t, s);
            qt_t_hooks(NULL, QT_MUT_NONE);
            int same = state3_same(&st, hm ? 0 : 1);
            uint16_t *x = malloc(OTOT * 2), *y = malloc(OTOT * 2);
            QT_CUDA(cudaMemcpy(x, wb, OTOT * 2, cudaMemcpyDefault));
            QT_CUDA(cudaMemcpy(y, wb2, OTOT * 2, cudaMemcpyDefault));
            same &= !memcmp(x, y, OTOT * 2);
            int moved = 0;
            for (size_t i = 0; i < OTOT; i++) moved += x[i] != w16[i];
            printf("  %s moments, %s master, streamed%s%s%s%s%s%s: %s\n", qt_dtype_name(dt), hm ? "fp32" : "no",
                   mask & QT_OPTIM_MASTER ? " master" : "", mask & QT_OPTIM_M ? " m" : "", mask & QT_OPTIM_V ? " v" : "",
                   mask & QT_OPTIM_W ? " weights" : "", mask & QT_OPTIM_G ? " gradients" : "", cases[ci].what,
                   same ? "bitwise equal to the device run" : cases[ci].mutant ? "caught" : "DIFFER");
            QT_EXPECT(moved > OTOT / 2, "only %d bf16 weights changed", moved);
            QT_EXPECT(same == !cases[ci].mutant, "%s, case %zu: %s", qt_dtype_name(dt), ci,
                      same ? "the mutant was NOT caught" : "the streamed run differs from the device run");
            qt_gpu_optim_free(dev);
            qt_gpu_optim_free(off);
            state3_free(&st);
            if (mask & QT_OPTIM_W) cudaFreeHost(wb2);
            else cudaFree(wb2);
            if (mask & QT_OPTIM_G) cudaFreeHost(dg2);
            else cudaFree(dg2);
            free(w), free(w16), free(x), free(y);
            cudaFree(dg), cudaFree(wb), cudaFree(slots);
        }
    QT_CUDA(cudaStreamDestroy(s));
}

/* Parts of the state offloaded (memory.offload's master, m, v on their own): the named arrays in pinned host
 * memory streamed through slots of their bytes only, the others read and written on the device at each
 * chunk's state; after 3 steps (the gradients behind a 5 ms stall) master, m, v and the bf16 weights are
 * the all-device run's bits, fp32 and bf16 moments. */
static void test_adamw_offload_parts(void) {
    NEED_GPU();
    cudaStream_t s;
    QT_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    const int masks[4] = {QT_OPTIM_M | QT_OPTIM_V, QT_OPTIM_MASTER, QT_OPTIM_V, QT_OPTIM_MASTER | QT_OPTIM_M};
    for (int bf = 0; bf < 2; bf++)
        for (int mi = 0; mi < 4; mi++) {
            int mask = masks[mi];
            qt_dtype dt = bf ? QT_DT_BF16 : QT_DT_F32;
            float *w = h_rand(OTOT, 0.5f), *dg = d_poison(OTOT * 4);
            void *wb = d_bf16(w, OTOT), *wb2 = d_bf16(w, OTOT);
            void *slots = d_poison(qt_gpu_optim_slot_bytes(OCHUNK, mask, dt, dt, QT_DT_F32));
            state3 st;
            state3_make(&st, w, mask, qt_dtype_size(dt));
            const int start[2] = {0, 2};
            qt_gpu_optim *dev = qt_gpu_optim_create(OTAB, OT, start, 2, st.ref[0], st.ref[1], dt, st.ref[2], dt, QT_DT_F32, NULL, 0, 0);
            qt_gpu_optim *off =
                qt_gpu_optim_create(OTAB, OT, start, 2, st.arr[0], st.arr[1], dt, st.arr[2], dt, QT_DT_F32, slots, OCHUNK, mask);
            qt_adamw_args a = {1e-2f, 0.9f, 0.95f, 1e-8f, 1, 99, bf, 0, 0, NULL};
            for (long t = 1; t <= 3; t++) two_steps_at(dev, off, wb, wb2, dg, &a, t, s);
            int same = state3_same(&st, 0);
            float *gb = g_bf16(wb, OTOT), *gb2 = g_bf16(wb2, OTOT);
            same &= !memcmp(gb, gb2, OTOT * 4);
            printf("  %s moments, offloaded%s%s%s: %s\n", qt_dtype_name(dt), mask & QT_OPTIM_MASTER ? " master" : "",
                   mask & QT_OPTIM_M ? " m" : "", mask & QT_OPTIM_V ? " v" : "", same ? "bitwise equal to the device run" : "DIFFER");
            QT_EXPECT(same, "%s, mask %d: the partly offloaded state differs from the device run's", qt_dtype_name(dt), mask);
            qt_gpu_optim_free(dev);
            qt_gpu_optim_free(off);
            state3_free(&st);
            free(w), free(gb), free(gb2);
            cudaFree(dg), cudaFree(wb), cudaFree(wb2), cudaFree(slots);
        }
    QT_CUDA(cudaStreamDestroy(s));
}

/* precision.master_dtype bf16: no master array, AdamW updates the bf16 weights in place with stochastic
 * rounding. However the update is cut — one launch over the whole array; two ZeRO-1 ranks' pieces (state
 * shifted); the state offloaded to pinned host memory and streamed through the slots in chunks of 3001
 * elements (state indices relative to each slot); plans of 777 elements each, cut off every vector
 * boundary; ZeRO-3: the ranks' pieces of the bf16 weights too, at their state index (w_at_state) — 3
 * steps must give the same bf16 weights, m and v bit for bit, fp32 and bf16 moments: the
 * rounding's random bits come from (seed, step, flat index) alone. A hash of the state index instead
 * (the QT_MUTANT_SR_STATE_INDEX build, tools/gpu-check.sh bf16master) fails the sharded and offloaded
 * cuts. */
static void test_adamw_bf16_master_cuts(void) {
    NEED_GPU();
    enum { CUTS = 5, RANKS = 2, PIECE = 777, CHUNK = 3001 };
    const char *name[CUTS] = {"whole", "ZeRO-1 pieces", "offloaded chunks", "777-element plans", "ZeRO-3 pieces (w too)"};
    const size_t bucket[3] = {0, 5120, ATOT};
    for (int bf = 0; bf < 2; bf++) {
        qt_dtype dt = bf ? QT_DT_BF16 : QT_DT_F32;
        size_t es = qt_dtype_size(dt);
        float *w = h_rand(ATOT, 0.5f);
        void *wb[CUTS], *m[CUTS], *v[CUTS];
        for (int c = 0; c < CUTS; c++) {
            wb[c] = d_bf16(w, ATOT);
            m[c] = d_poison(ATOT * es);
            v[c] = d_poison(ATOT * es);
            QT_CUDA(cudaMemset(m[c], 0, ATOT * es));
            QT_CUDA(cudaMemset(v[c], 0, ATOT * es));
        }
        /* cut 1: rank r's pieces of each bucket, back to back in its own m, v (state = flat - shift) */
        qt_adamw_plan *whole = qt_adamw_plan_create(ATAB, NT), *rank[RANKS], *pieces[ATOT / PIECE + 1];
        for (int r = 0; r < RANKS; r++) {
            qt_adamw_tensor t[2 * NT];
            int nt = 0;
            for (int bk = 0; bk < 2; bk++) {
                size_t len = (bucket[bk + 1] - bucket[bk]) / 2, lo = bucket[bk] + r * len, hi = lo + len, st = bucket[bk] / 2;
                for (int k = 0; k < NT; k++) {
                    size_t a = ATAB[k].offset > lo ? ATAB[k].offset : lo;
                    size_t e = ATAB[k].offset + ATAB[k].numel < hi ? ATAB[k].offset + ATAB[k].numel : hi;
                    if (a < e) t[nt++] = (qt_adamw_tensor){a, e - a, ATAB[k].wd, st + (a - lo), 0};
                }
            }
            rank[r] = qt_adamw_plan_create(t, nt);
        }
        char *rm = (char *)m[1], *rv = (char *)v[1]; /* rank r's state at [r * ATOT/2, ...) */
        /* cut 4 (ZeRO-3): as cut 1, and rank r's bf16 weights at [r * ATOT/2, ...) like its m, v; piece_at(i):
         * where flat element i sits there */
#define PIECE_AT(i) ((i) < bucket[1] ? ((i) / (bucket[1] / 2)) * (ATOT / 2) + (i) % (bucket[1] / 2)                          \
                                     : ((i) - bucket[1]) / ((ATOT - bucket[1]) / 2) * (ATOT / 2) + bucket[1] / 2 +          \
                                           ((i) - bucket[1]) % ((ATOT - bucket[1]) / 2))
        {
            uint16_t *hp = malloc(ATOT * 2);
            for (size_t i = 0; i < ATOT; i++) hp[PIECE_AT(i)] = qt_f32_to_bf16(w[i]);
            QT_CUDA(cudaMemcpy(wb[4], hp, ATOT * 2, cudaMemcpyHostToDevice));
            free(hp);
        }
        /* cut 2: the state in pinned host memory, streamed through the slots */
        void *hm, *hv, *slots = d_poison(qt_gpu_optim_slot_bytes(CHUNK, QT_OPTIM_M | QT_OPTIM_V, dt, dt, QT_DT_F32));
        QT_CUDA(cudaHostAlloc(&hm, ATOT * es, cudaHostAllocDefault));
        QT_CUDA(cudaHostAlloc(&hv, ATOT * es, cudaHostAllocDefault));
        memset(hm, 0, ATOT * es);
        memset(hv, 0, ATOT * es);
        const int start[1] = {0};
        qt_gpu_optim *off = qt_gpu_optim_create(ATAB, NT, start, 1, NULL, hm, dt, hv, dt, QT_DT_F32, slots, CHUNK, QT_OPTIM_M | QT_OPTIM_V);
        /* cut 3: plans of PIECE elements, whole arrays (state = flat index) */
        int np = 0;
        for (size_t lo = 0; lo < ATOT; lo += PIECE) {
            qt_adamw_tensor t[NT];
            int nt = 0;
            for (int k = 0; k < NT; k++) {
                size_t a = ATAB[k].offset > lo ? ATAB[k].offset : lo, hi = lo + PIECE;
                size_t e = ATAB[k].offset + ATAB[k].numel < hi ? ATAB[k].offset + ATAB[k].numel : hi;
                if (a < e) t[nt++] = (qt_adamw_tensor){a, e - a, ATAB[k].wd, a, 0};
            }
            if (nt) pieces[np++] = qt_adamw_plan_create(t, nt);
        }
        qt_adamw_args a = {1e-3f, 0.9f, 0.95f, 1e-8f, 1, 4242, 1, 0, 0, NULL};
        float *dg = d_poison(ATOT * 4);
        for (long t = 1; t <= 3; t++) {
            float *g = h_rand(ATOT, 1.0f);
            QT_CUDA(cudaMemcpy(dg, g, ATOT * 4, cudaMemcpyHostToDevice));
            a.t = t;
            qt_adamw_step(whole, wb[0], NULL, dg, QT_DT_F32, m[0], dt, v[0], dt, NULL, NULL, &a, 0);
            for (int r = 0; r < RANKS; r++)
                qt_adamw_step(rank[r], wb[1], NULL, dg, QT_DT_F32, rm + r * (ATOT / 2) * es, dt, rv + r * (ATOT / 2) * es, dt, NULL,
                              NULL, &a, 0);
            qt_adamw_args a3 = a;
            a3.w_at_state = 1;
            for (int r = 0; r < RANKS; r++)
                qt_adamw_step(rank[r], (char *)wb[4] + r * (ATOT / 2) * 2, NULL, dg, QT_DT_F32, (char *)m[4] + r * (ATOT / 2) * es,
                              dt, (char *)v[4] + r * (ATOT / 2) * es, dt, NULL, NULL, &a3, 0);
            qt_gpu_optim_step(off, 0, wb[2], dg, QT_DT_F32, NULL, &a, 0);
            for (int k = 0; k < np; k++) qt_adamw_step(pieces[k], wb[3], NULL, dg, QT_DT_F32, m[3], dt, v[3], dt, NULL, NULL, &a, 0);
            QT_CUDA(cudaDeviceSynchronize());
            free(g);
        }
        float *ref = g_bf16(wb[0], ATOT);
        int moved = 0;
        for (size_t i = 0; i < ATOT; i++) moved += ref[i] != qt_bf16_to_f32(qt_f32_to_bf16(w[i]));
        QT_EXPECT(moved > ATOT / 2, "%s moments: only %d of %d bf16 weights moved", qt_dtype_name(dt), moved, ATOT);
        char *gm = malloc(ATOT * es), *gv = malloc(ATOT * es), *cm = malloc(ATOT * es), *cv = malloc(ATOT * es);
        QT_CUDA(cudaMemcpy(gm, m[0], ATOT * es, cudaMemcpyDeviceToHost));
        QT_CUDA(cudaMemcpy(gv, v[0], ATOT * es, cudaMemcpyDeviceToHost));
        for (int c = 1; c < CUTS; c++) {
            float *got = g_bf16(wb[c], ATOT);
            if (c == 4) { /* back to flat order */
                float *flat = malloc(ATOT * 4);
                for (size_t i = 0; i < ATOT; i++) flat[i] = got[PIECE_AT(i)];
                free(got);
                got = flat;
            }
            long first = -1, ndiff = 0;
            for (long i = 0; i < ATOT; i++)
                if (memcmp(&got[i], &ref[i], 4)) ndiff++, first = first < 0 ? i : first;
            QT_EXPECT(ndiff == 0, "%s moments, %s: %ld bf16 weights differ from the whole array's, first [%ld] %.9g vs %.9g",
                      qt_dtype_name(dt), name[c], ndiff, first, first >= 0 ? got[first] : 0, first >= 0 ? ref[first] : 0);
            if (c == 2) {
                memcpy(cm, hm, ATOT * es);
                memcpy(cv, hv, ATOT * es);
            } else {
                QT_CUDA(cudaMemcpy(cm, m[c], ATOT * es, cudaMemcpyDeviceToHost));
                QT_CUDA(cudaMemcpy(cv, v[c], ATOT * es, cudaMemcpyDeviceToHost));
            }
            if (c == 1 || c == 4) { /* rank r holds the pieces [r*len, (r+1)*len) of each bucket at bucket/2 + r*ATOT/2 */
                int same = 1;
                for (int r = 0; r < RANKS; r++)
                    for (int bk = 0; bk < 2; bk++) {
                        size_t len = (bucket[bk + 1] - bucket[bk]) / 2, lo = bucket[bk] + r * len;
                        size_t st = r * (ATOT / 2) + bucket[bk] / 2;
                        same &= !memcmp(cm + st * es, gm + lo * es, len * es) && !memcmp(cv + st * es, gv + lo * es, len * es);
                    }
                QT_EXPECT(same, "%s moments, %s: m or v differ from the whole array's", qt_dtype_name(dt), name[c]);
            } else {
                for (int k = 0; k < NT; k++) /* padding is nobody's: compare the tensors */
                    QT_EXPECT(!memcmp(cm + ATAB[k].offset * es, gm + ATAB[k].offset * es, ATAB[k].numel * es) &&
                                  !memcmp(cv + ATAB[k].offset * es, gv + ATAB[k].offset * es, ATAB[k].numel * es),
                              "%s moments, %s: m or v of tensor %d differ", qt_dtype_name(dt), name[c], k);
            }
            free(got);
        }
        for (int r = 0; r < RANKS; r++) qt_adamw_plan_free(rank[r]);
#undef PIECE_AT
        for (int k = 0; k < np; k++) qt_adamw_plan_free(pieces[k]);
        qt_adamw_plan_free(whole);
        qt_gpu_optim_free(off);
        for (int c = 0; c < CUTS; c++) cudaFree(wb[c]), cudaFree(m[c]), cudaFree(v[c]);
        cudaFree(slots), cudaFree(dg), cudaFreeHost(hm), cudaFreeHost(hv);
        free(w), free(ref), free(gm), free(gv), free(cm), free(cv);
    }
}

int main(void) {
    qt_rng_seed(&R, 20261121);
    QT_RUN(test_swiglu_bwd_quant_t_bitwise);
    QT_RUN(test_geglu_bwd_quant_t_bitwise);
    QT_RUN(test_swiglu_bwd_h_bitwise);
    QT_RUN(test_geglu_bwd_h_bitwise);
    QT_RUN(test_adamw_sharded);
    QT_RUN(test_adamw_padded_layout);
    QT_RUN(test_adamw_counts_nonfinite);
    QT_RUN(test_adamw_offload);
    QT_RUN(test_adamw_offload_parts);
    QT_RUN(test_adamw_offload_streamed);
    QT_RUN(test_adamw_bf16_master_cuts);
    return qt_test_end();
}
