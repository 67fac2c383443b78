/* ref_ops.c — CPU fp32 reference ops (embedding, RMSNorm, matmul, RoPE, SwiGLU, GeGLU, cross-entropy), forward and
 * backward, with Gemma 3's variants (scaled embedding, (1 + w) RMSNorm, logit soft-cap); attention lives in
 * ref_attention.c.
 *
 * Determinism: every output element is reduced by exactly one thread in a fixed order; parallel
 * loops split outputs, never a sum. Matmuls accumulate in fp32 in k order (vectorised across output
 * columns, never across the sum, so SIMD width does not change the result); row reductions of
 * norms and softmaxes accumulate in double. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "qt_error.h"
#include "qt_ref.h"

/* ---- C[M,Nc] (= or +=) A[M,K] . B[K,Nc], all row-major, fp32 accumulation in k order ---- */

/* Register-blocked tiles: the accumulators of one tile stay in vector registers over the whole K.
 * Each output element is still sum_k a*b added in k order with separate multiply and add (no FMA:
 * -std=c11 keeps contraction off), so the AVX2 and the SSE paths give bit-identical results. */
typedef float v8 __attribute__((vector_size(32)));
typedef float v4 __attribute__((vector_size(16)));

#define MR_AVX 6  /* 6 x 16 tile: 12 ymm accumulators */
#define NR_AVX 16
#define MR_SSE 4  /* 4 x 8 tile: 8 xmm accumulators */
#define NR_SSE 8

__attribute__((target("avx2"))) static void tile_avx2(float *Cp, long ldc, const float *A, long lda,
                                                      const float *B, long ldb, long K, int acc) {
    v8 c[MR_AVX][2], b[2];
    memset(c, 0, sizeof c);
    for (long k = 0; k < K; k++) {
        memcpy(b, B + k * ldb, sizeof b);
#pragma GCC unroll 8
        for (int r = 0; r < MR_AVX; r++) {
            float a = A[r * lda + k];
            c[r][0] += a * b[0];
            c[r][1] += a * b[1];
        }
    }
    for (int r = 0; r < MR_AVX; r++) {
        if (acc) {
            memcpy(b, Cp + r * ldc, sizeof b);
            c[r][0] += b[0];
            c[r][1] += b[1];
        }
        memcpy(Cp + r * ldc, c[r], sizeof c[r]);
    }
}

static void tile_sse(float *Cp, long ldc, const float *A, long lda, const float *B, long ldb, long K, int acc) {
    v4 c[MR_SSE][2], b[2];
    memset(c, 0, sizeof c);
    for (long k = 0; k < K; k++) {
        memcpy(b, B + k * ldb, sizeof b);
#pragma GCC unroll 8
        for (int r = 0; r < MR_SSE; r++) {
            float a = A[r * lda + k];
            c[r][0] += a * b[0];
            c[r][1] += a * b[1];
        }
    }
    for (int r = 0; r < MR_SSE; r++) {
        if (acc) {
            memcpy(b, Cp + r * ldc, sizeof b);
            c[r][0] += b[0];
            c[r][1] += b[1];
        }
        memcpy(Cp + r * ldc, c[r], sizeof c[r]);
    }
}

/* An edge tile of mr rows and nr columns (any size); same summation order as the vector tiles. */
static void tile_edge(float *Cp, long ldc, const float *A, long lda, const float *B, long ldb, long K, int mr,
                      int nr, int acc) {
    float c[MR_AVX][NR_AVX];
    memset(c, 0, sizeof c);
    for (long k = 0; k < K; k++) {
        const float *b = B + k * ldb;
        for (int r = 0; r < mr; r++) {
            float a = A[r * lda + k];
            for (int j = 0; j < nr; j++) c[r][j] += a * b[j];
        }
    }
    for (int r = 0; r < mr; r++)
        for (int j = 0; j < nr; j++) Cp[r * ldc + j] = acc ? Cp[r * ldc + j] + c[r][j] : c[r][j];
}

static void gemm_nn(float *Cm, const float *A, const float *B, long M, long K, long Nc, int acc) {
    int avx2 = __builtin_cpu_supports("avx2") != 0; /* reads a flag libgcc sets at load time */
    long MR = avx2 ? MR_AVX : MR_SSE, NR = avx2 ? NR_AVX : NR_SSE;
    long mt = (M + MR - 1) / MR, nt = (Nc + NR - 1) / NR;
    /* column tiles outermost so that one B panel (K x NR) is reused from cache by all row tiles */
#pragma omp parallel for collapse(2) schedule(static)
    for (long jt = 0; jt < nt; jt++)
        for (long it = 0; it < mt; it++) {
            long i0 = it * MR, j0 = jt * NR;
            int mr = M - i0 < MR ? (int)(M - i0) : (int)MR, nr = Nc - j0 < NR ? (int)(Nc - j0) : (int)NR;
            float *Cp = Cm + i0 * Nc + j0;
            if (mr < MR || nr < NR) tile_edge(Cp, Nc, A + i0 * K, K, B + j0, Nc, K, mr, nr, acc);
            else if (avx2) tile_avx2(Cp, Nc, A + i0 * K, K, B + j0, Nc, K, acc);
            else tile_sse(Cp, Nc, A + i0 * K, K, B + j0, Nc, K, acc);
        }
}

/* dst[c,r] = src[r,c]; caller frees. */
static float *transpose(const float *src, long R, long Cn) {
    float *t = malloc((size_t)R * Cn * sizeof *t);
    QT_CHECK(t, "out of memory transposing [%ld, %ld]", R, Cn);
#pragma omp parallel for schedule(static)
    for (long c = 0; c < Cn; c++)
        for (long r = 0; r < R; r++) t[c * R + r] = src[r * Cn + c];
    return t;
}

/* ---- embedding ---- */

void qt_ref_embedding_fwd(float *out, const int32_t *tok, const float *wte, long N, int C) {
#pragma omp parallel for schedule(static)
    for (long n = 0; n < N; n++) memcpy(out + n * C, wte + (long)tok[n] * C, (size_t)C * sizeof *out);
}

float qt_ref_embed_scale(int hidden, int round_bf16) {
    float s = (float)sqrt((double)hidden); /* torch.tensor(hidden ** 0.5): fp32 */
    if (!round_bf16) return s;
    uint32_t u;
    memcpy(&u, &s, 4);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u; /* .to(bf16): RNE (s is finite and positive) */
    memcpy(&s, &u, 4);
    return s;
}

void qt_ref_embedding_scaled_fwd(float *out, const int32_t *tok, const float *wte, long N, int C, float scale) {
#pragma omp parallel for schedule(static)
    for (long n = 0; n < N; n++)
        for (int c = 0; c < C; c++) out[n * C + c] = wte[(long)tok[n] * C + c] * scale;
}

void qt_ref_embedding_bwd(float *dwte, const float *dout, const int32_t *tok, long N, int C, int V) {
    qt_ref_embedding_scaled_bwd(dwte, dout, tok, N, C, V, 1.0f);
}

void qt_ref_embedding_scaled_bwd(float *dwte, const float *dout, const int32_t *tok, long N, int C, int V,
                                 float scale) {
    /* bucket the rows by token (counting sort, stable) so each vocab row sums its rows in order */
    long *start = calloc((size_t)V + 1, sizeof *start), *rows = malloc((size_t)(N ? N : 1) * sizeof *rows);
    QT_CHECK(start && rows, "out of memory for the embedding backward (V=%d, N=%ld)", V, N);
    for (long n = 0; n < N; n++) {
        QT_CHECK(tok[n] >= 0 && tok[n] < V, "token %d at row %ld outside the vocabulary [0, %d)", tok[n], n, V);
        start[tok[n] + 1]++;
    }
    for (int v = 0; v < V; v++) start[v + 1] += start[v];
    long *fill = malloc((size_t)V * sizeof *fill);
    QT_CHECK(fill, "out of memory");
    memcpy(fill, start, (size_t)V * sizeof *fill);
    for (long n = 0; n < N; n++) rows[fill[tok[n]]++] = n;
#pragma omp parallel for schedule(dynamic, 16)
    for (int v = 0; v < V; v++) {
        float *d = dwte + (long)v * C;
        for (long k = start[v]; k < start[v + 1]; k++) {
            const float *g = dout + rows[k] * C;
            if (scale == 1.0f)
                for (int c = 0; c < C; c++) d[c] += g[c];
            else /* one rounding per term, as the GPU kernel's fmaf: the same bits */
                for (int c = 0; c < C; c++) d[c] = fmaf(g[c], scale, d[c]);
        }
    }
    free(start);
    free(rows);
    free(fill);
}

/* ---- RMSNorm ---- */

/* one_plus: the scale is (1 + w[c]) in fp32 (Gemma), else w[c]. */
static void rmsnorm_fwd(float *y, float *rstd, const float *x, const float *w, long N, int C, float eps, int one_plus) {
#pragma omp parallel for schedule(static)
    for (long n = 0; n < N; n++) {
        const float *xr = x + n * C;
        double ss = 0;
        for (int c = 0; c < C; c++) ss += (double)xr[c] * xr[c];
        float r = (float)(1.0 / sqrt(ss / C + eps));
        rstd[n] = r;
        for (int c = 0; c < C; c++) y[n * C + c] = xr[c] * r * (one_plus ? 1.0f + w[c] : w[c]);
    }
}

void qt_ref_rmsnorm_fwd(float *y, float *rstd, const float *x, const float *w, long N, int C, float eps) {
    rmsnorm_fwd(y, rstd, x, w, N, C, eps, 0);
}

void qt_ref_rmsnorm1p_fwd(float *y, float *rstd, const float *x, const float *w, long N, int C, float eps) {
    rmsnorm_fwd(y, rstd, x, w, N, C, eps, 1);
}

#define COLS 32 /* dw columns per task: rows of x are read in 128-byte pieces */

/* dx through the scale s[c] = w[c] or 1 + w[c] (one_plus); dw is the same for both (d(1 + w)/dw = 1). */
static void rmsnorm_bwd(float *dx, float *dw, const float *dy, const float *x, const float *w, const float *rstd,
                        long N, int C, int one_plus) {
#pragma omp parallel for schedule(static)
    for (long n = 0; n < N; n++) {
        const float *xr = x + n * C, *g = dy + n * C;
        double dot = 0; /* sum_c dy*s*x */
        for (int c = 0; c < C; c++) dot += (double)g[c] * (one_plus ? 1.0f + w[c] : w[c]) * xr[c];
        float r = rstd[n], k = (float)(dot * r * r * r / C);
        for (int c = 0; c < C; c++) dx[n * C + c] += g[c] * (one_plus ? 1.0f + w[c] : w[c]) * r - xr[c] * k;
    }
    int nb = (C + COLS - 1) / COLS;
#pragma omp parallel for schedule(static)
    for (int b = 0; b < nb; b++) {
        int c0 = b * COLS, nc = C - c0 < COLS ? C - c0 : COLS;
        double acc[COLS] = {0};
        for (long n = 0; n < N; n++) {
            const float *xr = x + n * C + c0, *g = dy + n * C + c0;
            for (int c = 0; c < nc; c++) acc[c] += (double)g[c] * xr[c] * rstd[n];
        }
        for (int c = 0; c < nc; c++) dw[c0 + c] += (float)acc[c];
    }
}

void qt_ref_rmsnorm_bwd(float *dx, float *dw, const float *dy, const float *x, const float *w,
                        const float *rstd, long N, int C) {
    rmsnorm_bwd(dx, dw, dy, x, w, rstd, N, C, 0);
}

void qt_ref_rmsnorm1p_bwd(float *dx, float *dw, const float *dy, const float *x, const float *w,
                          const float *rstd, long N, int C) {
    rmsnorm_bwd(dx, dw, dy, x, w, rstd, N, C, 1);
}

/* ---- matmul ---- */

void qt_ref_matmul_fwd(float *y, const float *x, const float *w, const float *b, long N, int I, int O) {
    float *wt = transpose(w, O, I); /* [I, O]: the inner loop then runs over contiguous outputs */
    gemm_nn(y, x, wt, N, I, O, 0);
    free(wt);
    if (b) {
#pragma omp parallel for schedule(static)
        for (long n = 0; n < N; n++)
            for (int o = 0; o < O; o++) y[n * O + o] += b[o];
    }
}

void qt_ref_matmul_bwd(float *dx, float *dw, float *db, const float *dy, const float *x, const float *w,
                       long N, int I, int O) {
    if (dx) gemm_nn(dx, dy, w, N, O, I, 0);
    if (dw) {
        float *dyt = transpose(dy, N, O); /* [O, N] */
        gemm_nn(dw, dyt, x, O, N, I, 1);
        free(dyt);
    }
    if (db) {
        int nb = (O + COLS - 1) / COLS;
#pragma omp parallel for schedule(static)
        for (int bk = 0; bk < nb; bk++) {
            int o0 = bk * COLS, no = O - o0 < COLS ? O - o0 : COLS;
            double acc[COLS] = {0};
            for (long n = 0; n < N; n++)
                for (int o = 0; o < no; o++) acc[o] += dy[n * O + o0 + o];
            for (int o = 0; o < no; o++) db[o0 + o] += (float)acc[o];
        }
    }
}

/* ---- rotary embedding ---- */

/* cos/sin[T, D/2] of t * inv_freq[i], times attn, computed in double; caller frees. */
static float *rope_table(int T, int D, const double *inv_freq, double attn) {
    int h = D / 2;
    float *cs = malloc((size_t)T * h * 2 * sizeof *cs);
    QT_CHECK(cs, "out of memory for the rope table (T=%d, D=%d)", T, D);
    for (int t = 0; t < T; t++)
        for (int i = 0; i < h; i++) {
            double a = inv_freq[i] * t;
            cs[((long)t * h + i) * 2] = (float)(cos(a) * attn);
            cs[((long)t * h + i) * 2 + 1] = (float)(sin(a) * attn);
        }
    return cs;
}

/* sign = +1 rotates by +a (forward), -1 by -a (the transpose, for backward). Token bt has position
 * pos[bt] (each in [0, T)), or bt % T when pos is NULL. */
static void rope_apply(float *qkv, int B, int T, int H, int Hkv, int D, const int32_t *pos, const double *inv_freq,
                       double attn, float sign) {
    QT_CHECK(D % 2 == 0, "rope: head_dim %d must be even", D);
    for (long bt = 0; pos && bt < (long)B * T; bt++) /* before the parallel loop, which must not leave early */
        QT_CHECK(pos[bt] >= 0 && pos[bt] < T, "rope: token %ld has position %d: expected [0, %d)", bt, pos[bt], T);
    float *cs = rope_table(T, D, inv_freq, attn);
    int h = D / 2, nh = H + Hkv;
    long row = (long)(H + 2 * Hkv) * D;
#pragma omp parallel for schedule(static)
    for (long bt = 0; bt < (long)B * T; bt++) {
        const float *tab = cs + (pos ? pos[bt] : bt % T) * h * 2;
        for (int k = 0; k < nh; k++) {
            float *v = qkv + bt * row + (long)k * D;
            for (int i = 0; i < h; i++) {
                float c = tab[2 * i], s = sign * tab[2 * i + 1], x0 = v[i], x1 = v[i + h];
                v[i] = x0 * c - x1 * s;
                v[i + h] = x1 * c + x0 * s;
            }
        }
    }
    free(cs);
}

void qt_ref_rope_fwd(float *qkv, int B, int T, int H, int Hkv, int D, const double *inv_freq, double attn) {
    rope_apply(qkv, B, T, H, Hkv, D, NULL, inv_freq, attn, 1.0f);
}

void qt_ref_rope_pos_fwd(float *qkv, int B, int T, int H, int Hkv, int D, const int32_t *pos, const double *inv_freq,
                         double attn) {
    rope_apply(qkv, B, T, H, Hkv, D, pos, inv_freq, attn, 1.0f);
}

void qt_ref_rope_pos_bwd(float *dqkv, int B, int T, int H, int Hkv, int D, const int32_t *pos,
                         const double *inv_freq, double attn) {
    rope_apply(dqkv, B, T, H, Hkv, D, pos, inv_freq, attn, -1.0f);
}

void qt_ref_rope_bwd(float *dqkv, int B, int T, int H, int Hkv, int D, const double *inv_freq, double attn) {
    rope_apply(dqkv, B, T, H, Hkv, D, NULL, inv_freq, attn, -1.0f);
}

/* ---- SwiGLU ---- */

void qt_ref_swiglu_fwd(float *out, const float *gu, long N, int F) {
#pragma omp parallel for schedule(static)
    for (long n = 0; n < N; n++) {
        const float *g = gu + n * 2 * F, *u = g + F;
        for (int f = 0; f < F; f++) out[n * F + f] = g[f] / (1.0f + expf(-g[f])) * u[f];
    }
}

void qt_ref_swiglu_bwd(float *dgu, const float *dout, const float *gu, long N, int F) {
#pragma omp parallel for schedule(static)
    for (long n = 0; n < N; n++) {
        const float *g = gu + n * 2 * F, *u = g + F, *d = dout + n * F;
        float *dg = dgu + n * 2 * F, *du = dg + F;
        for (int f = 0; f < F; f++) {
            float sg = 1.0f / (1.0f + expf(-g[f]));
            du[f] = d[f] * g[f] * sg;
            dg[f] = d[f] * u[f] * sg * (1.0f + g[f] * (1.0f - sg));
        }
    }
}

/* ---- GeGLU with the tanh-approximate GELU (transformers' gelu_pytorch_tanh = torch gelu(approximate="tanh")) ---- */

/* gelu(x) = 0.5 x (1 + tanh(b (x + k x^3))), b = sqrt(2/pi), k = 0.044715, in torch's fp32 operation order
 * (aten GeluCUDAKernelImpl, tanh branch); *t receives the tanh. */
#define GELU_BETA 0.7978845608028654f /* M_SQRT2 * M_2_SQRTPI * 0.5 */
#define GELU_KAPPA 0.044715f
static float gelu_tanh(float x, float *t) {
    float x_cube = x * x * x, inner = GELU_BETA * (x + GELU_KAPPA * x_cube);
    *t = tanhf(inner);
    return 0.5f * x * (1.0f + *t);
}
/* d gelu / dx, the same way (aten GeluBackwardCUDAKernelImpl, tanh branch). */
static float gelu_tanh_grad(float x) {
    float x_sq = x * x, t = tanhf(GELU_BETA * (x + GELU_KAPPA * (x_sq * x)));
    float left = 0.5f * x, right = 1.0f + t;
    return 0.5f * right + left * (1.0f - t * t) * (GELU_BETA * (1.0f + 3.0f * GELU_KAPPA * x_sq));
}

void qt_ref_geglu_fwd(float *out, const float *gu, long N, int F) {
#pragma omp parallel for schedule(static)
    for (long n = 0; n < N; n++) {
        const float *g = gu + n * 2 * F, *u = g + F;
        float t;
        for (int f = 0; f < F; f++) out[n * F + f] = gelu_tanh(g[f], &t) * u[f];
    }
}

void qt_ref_geglu_bwd(float *dgu, const float *dout, const float *gu, long N, int F) {
#pragma omp parallel for schedule(static)
    for (long n = 0; n < N; n++) {
        const float *g = gu + n * 2 * F, *u = g + F, *d = dout + n * F;
        float *dg = dgu + n * 2 * F, *du = dg + F, t;
        for (int f = 0; f < F; f++) {
            float a = gelu_tanh(g[f], &t), da = gelu_tanh_grad(g[f]);
            du[f] = d[f] * a;
            dg[f] = d[f] * u[f] * da;
        }
    }
}

/* ---- cross-entropy (with the optional final-logit soft-cap) ---- */

/* max and log-sum-exp of one row, in double. */
static double row_lse(const float *l, int V) {
    float m = l[0];
    for (int v = 1; v < V; v++) m = l[v] > m ? l[v] : m;
    double s = 0;
    for (int v = 0; v < V; v++) s += exp((double)l[v] - m);
    return m + log(s);
}

/* The row the loss reads: l itself (cap 0), else z = cap * tanh(l / cap) in fp32 into buf (Gemma 3's
 * final_logit_softcapping: logits / cap, tanh, * cap). */
static const float *capped_row(const float *l, int V, float cap, float *buf) {
    if (cap == 0.0f) return l;
    for (int v = 0; v < V; v++) buf[v] = cap * tanhf(l[v] / cap);
    return buf;
}

void qt_ref_cross_entropy_capped_fwd(float *loss, const float *logits, const int32_t *tgt, long N, int V, float cap) {
#pragma omp parallel
    {
        float *buf = cap != 0.0f ? malloc((size_t)V * sizeof *buf) : NULL;
        QT_CHECK(cap == 0.0f || buf, "out of memory for a soft-capped row (V=%d)", V);
#pragma omp for schedule(static)
        for (long n = 0; n < N; n++) {
            if (tgt[n] < 0) { loss[n] = 0; continue; }
            QT_CHECK(tgt[n] < V, "target %d at row %ld outside the vocabulary [0, %d)", tgt[n], n, V);
            const float *z = capped_row(logits + n * V, V, cap, buf);
            loss[n] = (float)(row_lse(z, V) - z[tgt[n]]);
        }
        free(buf);
    }
}

void qt_ref_cross_entropy_capped_bwd(float *dlogits, const float *logits, const int32_t *tgt, long N, int V,
                                     float scale, float cap) {
#pragma omp parallel
    {
        float *buf = cap != 0.0f ? malloc((size_t)V * sizeof *buf) : NULL;
        QT_CHECK(cap == 0.0f || buf, "out of memory for a soft-capped row (V=%d)", V);
#pragma omp for schedule(static)
        for (long n = 0; n < N; n++) {
            const float *l = logits + n * V;
            float *d = dlogits + n * V;
            if (tgt[n] < 0) {
                memset(d, 0, (size_t)V * sizeof *d);
                continue;
            }
            QT_CHECK(tgt[n] < V, "target %d at row %ld outside the vocabulary [0, %d)", tgt[n], n, V);
            const float *z = capped_row(l, V, cap, buf); /* the whole row is read before d overwrites it */
            double lse = row_lse(z, V);
            for (int v = 0; v < V; v++) d[v] = (float)(scale * exp((double)z[v] - lse));
            d[tgt[n]] -= scale;
            if (cap != 0.0f) /* d/dl cap tanh(l / cap) = 1 - tanh^2 = 1 - (z / cap)^2 */
                for (int v = 0; v < V; v++) {
                    float t = z[v] / cap;
                    d[v] *= 1.0f - t * t;
                }
        }
        free(buf);
    }
}

void qt_ref_cross_entropy_fwd(float *loss, const float *logits, const int32_t *tgt, long N, int V) {
    qt_ref_cross_entropy_capped_fwd(loss, logits, tgt, N, V, 0.0f);
}

void qt_ref_cross_entropy_bwd(float *dlogits, const float *logits, const int32_t *tgt, long N, int V,
                              float scale) {
    qt_ref_cross_entropy_capped_bwd(dlogits, logits, tgt, N, V, scale, 0.0f);
}

void qt_ref_add_inplace(float *y, const float *x, long n) {
#pragma omp parallel for schedule(static)
    for (long i = 0; i < n; i++) y[i] += x[i];
}
