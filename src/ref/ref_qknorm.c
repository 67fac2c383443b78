/* ref_qknorm.c — CPU fp32 reference of the per-head q/k RMSNorm (Qwen3's q_norm / k_norm), forward and
 * backward, on the fused qkv rows.
 *
 * Row n of qkv holds H q heads, Hkv k heads, Hkv v heads of D each. Every q head is normed with wq = w[0, D),
 * every k head with wk = w[D, 2D); v passes through. The 1p forms (Gemma 3) scale by 1 + w, formed in fp32. Sums accumulate in double; each output element is
 * written by one thread in a fixed order (dw: one thread per column over all rows and heads), so results
 * do not depend on the thread count. */
#include <math.h>
#include <string.h>

#include "qt_ref.h"

/* The scale of element i of weight row wh: w or 1 + w (one_plus). */
static inline float sc(const float *wh, int i, int one_plus) { return one_plus ? 1.0f + wh[i] : wh[i]; }

static void qknorm_fwd(float *y, float *rstd, const float *x, const float *w, long N, int H, int Hkv, int D,
                       float eps, int one_plus) {
    int NH = H + Hkv, QKV = (H + 2 * Hkv) * D;
#pragma omp parallel for schedule(static)
    for (long n = 0; n < N; n++) {
        const float *xr = x + n * QKV;
        float *yr = y + n * QKV;
        for (int h = 0; h < NH; h++) {
            const float *xh = xr + (long)h * D, *wh = w + (h < H ? 0 : D);
            double ss = 0;
            for (int i = 0; i < D; i++) ss += (double)xh[i] * xh[i];
            float r = (float)(1.0 / sqrt(ss / D + eps));
            rstd[n * NH + h] = r;
            for (int i = 0; i < D; i++) yr[(long)h * D + i] = xh[i] * r * sc(wh, i, one_plus);
        }
        if (yr != xr) memcpy(yr + (long)NH * D, xr + (long)NH * D, (size_t)Hkv * D * sizeof *yr);
    }
}

static void qknorm_bwd(float *dx, float *dw, const float *dy, const float *x, const float *w, const float *rstd,
                       long N, int H, int Hkv, int D, int one_plus) {
    int NH = H + Hkv, QKV = (H + 2 * Hkv) * D;
    /* dw first: dx may be dy; dw NULL: a frozen norm */
    int nj = dw ? 2 * D : 0;
#pragma omp parallel for schedule(static)
    for (int j = 0; j < nj; j++) {
        int h0 = j < D ? 0 : H, h1 = j < D ? H : NH, i = j % D;
        double acc = 0;
        for (long n = 0; n < N; n++)
            for (int h = h0; h < h1; h++)
                acc += (double)dy[n * QKV + (long)h * D + i] * x[n * QKV + (long)h * D + i] * rstd[n * NH + h];
        dw[j] += (float)acc;
    }
#pragma omp parallel for schedule(static)
    for (long n = 0; n < N; n++) {
        for (int h = 0; h < NH; h++) {
            const float *xh = x + n * QKV + (long)h * D, *g = dy + n * QKV + (long)h * D, *wh = w + (h < H ? 0 : D);
            float *d = dx + n * QKV + (long)h * D;
            double dot = 0; /* sum_i dy*w*x */
            for (int i = 0; i < D; i++) dot += (double)g[i] * sc(wh, i, one_plus) * xh[i];
            float r = rstd[n * NH + h], k = (float)(dot * r * r * r / D);
            for (int i = 0; i < D; i++) d[i] = g[i] * sc(wh, i, one_plus) * r - xh[i] * k;
        }
        if (dx != dy) memcpy(dx + n * QKV + (long)NH * D, dy + n * QKV + (long)NH * D, (size_t)Hkv * D * sizeof *dx);
    }
}

void qt_ref_qknorm_fwd(float *y, float *rstd, const float *x, const float *w, long N, int H, int Hkv, int D,
                       float eps) {
    qknorm_fwd(y, rstd, x, w, N, H, Hkv, D, eps, 0);
}

void qt_ref_qknorm_bwd(float *dx, float *dw, const float *dy, const float *x, const float *w, const float *rstd,
                       long N, int H, int Hkv, int D) {
    qknorm_bwd(dx, dw, dy, x, w, rstd, N, H, Hkv, D, 0);
}

void qt_ref_qknorm1p_fwd(float *y, float *rstd, const float *x, const float *w, long N, int H, int Hkv, int D,
                         float eps) {
    qknorm_fwd(y, rstd, x, w, N, H, Hkv, D, eps, 1);
}

void qt_ref_qknorm1p_bwd(float *dx, float *dw, const float *dy, const float *x, const float *w, const float *rstd,
                         long N, int H, int Hkv, int D) {
    qknorm_bwd(dx, dw, dy, x, w, rstd, N, H, Hkv, D, 1);
}
