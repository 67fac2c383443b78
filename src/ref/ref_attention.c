/* ref_attention.c — CPU fp32 reference of causal grouped-query attention, forward and backward.
 *
 * qkv[B,T,(H+2*Hkv)*D]: q heads, k heads, v heads; query head h reads kv head h / (H/Hkv).
 * Query t attends to keys j with lo(t) <= j <= t: lo = 0 (causal), or t - W + 1 with a sliding window
 * W > 0 (transformers' sliding_window_overlay: kv_idx > q_idx - W; W keys, the query's own included),
 * raised to kv_lo[b*T + t] when a packed batch's attention is per document (the query's document start).
 * fwd: out[B,T,H*D], lse[B,H,T] (natural log of the softmax denominator, the scale applied: 1/sqrt(D),
 * or the caller's in the _scaled forms).
 * bwd: dS = P * (dP - rowsum(dO * O)) with P recomputed from lse; no T x T matrix is stored.
 * Dot products and sums accumulate in double; results are rounded to fp32 once. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "qt_error.h"
#include "qt_ref.h"

static double dot(const float *a, const float *b, int D) {
    double s = 0;
    for (int i = 0; i < D; i++) s += (double)a[i] * b[i];
    return s;
}

/* The first key query t of row b sees under window W (0: none) and the document bounds kv_lo (NULL: none). */
static int first_key(int t, int W, const int32_t *kv_lo, int b, int T) {
    int lo = W > 0 && t >= W ? t - W + 1 : 0;
    if (kv_lo && kv_lo[(long)b * T + t] > lo) lo = kv_lo[(long)b * T + t];
    return lo;
}

/* Every document bound lies in [0, t] (checked before the parallel loops, which must not leave early). */
static void check_kv_lo(const int32_t *kv_lo, int B, int T) {
    for (long n = 0; kv_lo && n < (long)B * T; n++)
        QT_CHECK(kv_lo[n] >= 0 && kv_lo[n] <= n % T, "attention: query %ld of row %ld: document start %d: expected "
                 "[0, %ld]", n % T, n / T, kv_lo[n], n % T);
}

void qt_ref_attention_fwd(float *out, float *lse, const float *qkv, int B, int T, int H, int Hkv, int D, int W) {
    qt_ref_attention_docs_fwd(out, lse, qkv, B, T, H, Hkv, D, W, NULL);
}

void qt_ref_attention_docs_fwd(float *out, float *lse, const float *qkv, int B, int T, int H, int Hkv, int D, int W,
                               const int32_t *kv_lo) {
    qt_ref_attention_scaled_fwd(out, lse, qkv, B, T, H, Hkv, D, W, kv_lo, 1.0 / sqrt((double)D));
}

void qt_ref_attention_scaled_fwd(float *out, float *lse, const float *qkv, int B, int T, int H, int Hkv, int D, int W,
                                 const int32_t *kv_lo, double scale) {
    QT_CHECK(Hkv > 0 && H % Hkv == 0, "attention: H=%d is not a multiple of Hkv=%d", H, Hkv);
    QT_CHECK(W >= 0, "attention: sliding window %d: expected >= 0 (0 = none)", W);
    check_kv_lo(kv_lo, B, T);
    long row = (long)(H + 2 * Hkv) * D;
    int grp = H / Hkv;
#pragma omp parallel
    {
        double *s = malloc((size_t)T * sizeof *s), *acc = malloc((size_t)D * sizeof *acc);
        QT_CHECK(s && acc, "out of memory for attention scratch (T=%d)", T);
#pragma omp for collapse(3) schedule(static)
        for (int b = 0; b < B; b++)
            for (int h = 0; h < H; h++)
                for (int t = 0; t < T; t++) {
                    int g = h / grp;
                    const float *base = qkv + (long)b * T * row, *q = base + t * row + (long)h * D;
                    double m = -INFINITY, sum = 0;
                    int lo = first_key(t, W, kv_lo, b, T);
                    for (int j = lo; j <= t; j++) {
                        s[j] = scale * dot(q, base + j * row + (long)(H + g) * D, D);
                        if (s[j] > m) m = s[j];
                    }
                    memset(acc, 0, (size_t)D * sizeof *acc);
                    for (int j = lo; j <= t; j++) {
                        double p = exp(s[j] - m);
                        const float *v = base + j * row + (long)(H + Hkv + g) * D;
                        sum += p;
                        for (int i = 0; i < D; i++) acc[i] += p * v[i];
                    }
                    float *o = out + ((long)b * T + t) * H * D + (long)h * D;
                    for (int i = 0; i < D; i++) o[i] = (float)(acc[i] / sum);
                    lse[((long)b * H + h) * T + t] = (float)(m + log(sum));
                }
        free(s);
        free(acc);
    }
}

/* Backward of one (batch, kv head): the query heads of the group, then dk and dv of that kv head.
 * dk and dv sum over the group's heads and all later queries: one task owns them, in a fixed order. */
static void attn_bwd_group(float *dqkv, const float *dout, const float *qkv, const float *out, const float *lse,
                           int b, int g, int T, int H, int Hkv, int D, int W, const int32_t *kv_lo, double scale,
                           double *dk, double *dv, double *dq) {
    long row = (long)(H + 2 * Hkv) * D;
    int grp = H / Hkv;
    const float *base = qkv + (long)b * T * row;
    memset(dk, 0, (size_t)T * D * sizeof *dk);
    memset(dv, 0, (size_t)T * D * sizeof *dv);
    for (int h = g * grp; h < (g + 1) * grp; h++)
        for (int t = 0; t < T; t++) {
            long ot = ((long)b * T + t) * H * D + (long)h * D;
            const float *q = base + t * row + (long)h * D, *dO = dout + ot;
            double di = dot(dO, out + ot, D), l = lse[((long)b * H + h) * T + t];
            memset(dq, 0, (size_t)D * sizeof *dq);
            for (int j = first_key(t, W, kv_lo, b, T); j <= t; j++) {
                const float *k = base + j * row + (long)(H + g) * D, *v = base + j * row + (long)(H + Hkv + g) * D;
                double p = exp(scale * dot(q, k, D) - l);
                double ds = p * (dot(dO, v, D) - di) * scale;
                for (int i = 0; i < D; i++) {
                    dq[i] += ds * k[i];
                    dk[(long)j * D + i] += ds * q[i];
                    dv[(long)j * D + i] += p * dO[i];
                }
            }
            float *dqo = dqkv + ((long)b * T + t) * row + (long)h * D;
            for (int i = 0; i < D; i++) dqo[i] = (float)dq[i];
        }
    for (int j = 0; j < T; j++) {
        float *dko = dqkv + ((long)b * T + j) * row + (long)(H + g) * D, *dvo = dko + (long)Hkv * D;
        for (int i = 0; i < D; i++) {
            dko[i] = (float)dk[(long)j * D + i];
            dvo[i] = (float)dv[(long)j * D + i];
        }
    }
}

void qt_ref_attention_bwd(float *dqkv, const float *dout, const float *qkv, const float *out,
                          const float *lse, int B, int T, int H, int Hkv, int D, int W) {
    qt_ref_attention_docs_bwd(dqkv, dout, qkv, out, lse, B, T, H, Hkv, D, W, NULL);
}

void qt_ref_attention_docs_bwd(float *dqkv, const float *dout, const float *qkv, const float *out,
                               const float *lse, int B, int T, int H, int Hkv, int D, int W, const int32_t *kv_lo) {
    qt_ref_attention_scaled_bwd(dqkv, dout, qkv, out, lse, B, T, H, Hkv, D, W, kv_lo, 1.0 / sqrt((double)D));
}

void qt_ref_attention_scaled_bwd(float *dqkv, const float *dout, const float *qkv, const float *out,
                                 const float *lse, int B, int T, int H, int Hkv, int D, int W, const int32_t *kv_lo,
                                 double scale) {
    QT_CHECK(Hkv > 0 && H % Hkv == 0, "attention: H=%d is not a multiple of Hkv=%d", H, Hkv);
    QT_CHECK(W >= 0, "attention: sliding window %d: expected >= 0 (0 = none)", W);
    check_kv_lo(kv_lo, B, T);
#pragma omp parallel
    {
        double *dk = malloc((size_t)T * D * sizeof *dk), *dv = malloc((size_t)T * D * sizeof *dv);
        double *dq = malloc((size_t)D * sizeof *dq);
        QT_CHECK(dk && dv && dq, "out of memory for attention scratch (T=%d, D=%d)", T, D);
#pragma omp for collapse(2) schedule(dynamic, 1)
        for (int b = 0; b < B; b++)
            for (int g = 0; g < Hkv; g++)
                attn_bwd_group(dqkv, dout, qkv, out, lse, b, g, T, H, Hkv, D, W, kv_lo, scale, dk, dv, dq);
        free(dk);
        free(dv);
        free(dq);
    }
}
