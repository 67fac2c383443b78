/* lora_ref.c — the CPU fp32 forward and backward of one LoRA module beside its base matmul.
 *
 * fwd: u[N,r] = xd[N,in] A[r,in]^T,  y[n, row0 + o] += scale * sum_k u[n,k] B[o,k]   (+=)
 * bwd: g[N,r] = scale * dy_m B, dB += scale * dy_m^T u, dA += g^T xd, dx += mask * (g A)   (+=)
 * where xd = x * mask (the dropout mask, 1 when p = 0) and dy_m the module's rows of the fused dy.
 * Sums in double, rounded to fp32 once; parallel over rows (u, y, g, dx) or blocks of B's rows and A's columns (dB,
 * dA), each sum in a fixed order (thread-count free). */
#include <stdlib.h>

#include "qt_error.h"
#include "qt_lora_cpu.h"

/* Every sum adds its terms in index order into a double of its own; the loops keep many such sums side by side
 * (over k, o or i innermost, `omp simd`) so they vectorize without reordering any one of them. The weight-gradient
 * sums run over blocks of LORA_OB outputs (dB) or LORA_IB inputs (dA), the rows n outermost, so dy, u, g and xd
 * are each read once per block. */
enum { LORA_OB = 8, LORA_IB = 32 };

/* A thread's sums: n doubles; caller frees. */
static double *scratch(int n) {
    double *p = malloc((size_t)n * sizeof *p);
    QT_CHECK(p, "out of memory for %d LoRA sums", n);
    return p;
}

/* m[rows, cols] transposed to [cols, rows]; caller frees. */
static float *transposed(const float *m, int rows, int cols) {
    float *t = malloc((size_t)rows * cols * sizeof *t);
    QT_CHECK(t, "out of memory for a LoRA matrix (%d x %d)", rows, cols);
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < cols; j++) t[(size_t)j * rows + i] = m[(size_t)i * cols + j];
    return t;
}

/* s[p, q] = sum_n X[n, p] Y[n, q] for p < np, q < nq (row strides ldx, ldy), each sum over n = 0 .. N-1 in order;
 * returns s [np, nq], which the caller frees. */
static double *outer_sums(const float *X, long ldx, int np, const float *Y, long ldy, int nq, long N) {
    double *acc = calloc((size_t)np * nq, sizeof *acc);
    QT_CHECK(acc, "out of memory for the LoRA backward (%d x %d)", np, nq);
    for (long n = 0; n < N; n++)
        for (int p = 0; p < np; p++) {
            double xp = X[(size_t)n * ldx + p];
#pragma omp simd
            for (int q = 0; q < nq; q++) acc[(size_t)p * nq + q] += xp * Y[(size_t)n * ldy + q];
        }
    return acc;
}

/* xd[N, in] = x masked by mseed (a copy of x when p is 0); caller frees. */
static float *dropped(float p, const float *x, long N, int in, uint64_t mseed) {
    float ks = 1.0f / (1.0f - p);
    float *xd = malloc((size_t)N * in * sizeof *xd);
    QT_CHECK(xd, "out of memory for the LoRA input (%ld x %d)", N, in);
#pragma omp parallel for schedule(static)
    for (long n = 0; n < N; n++)
        for (int i = 0; i < in; i++) {
            size_t j = (size_t)n * in + i;
            xd[j] = p > 0 ? x[j] * qt_lora_mask(mseed, j, p, ks) : x[j];
        }
    return xd;
}

void qt_lora_fwd_cpu(const qt_lora_layout *A, const qt_lora_module *md, const float *a, const float *x, float *u,
                     float *y, long N, float p, uint64_t mseed) {
    int r = A->cfg.rank, in = md->in;
    const float *Am = a + md->a, *Bm = a + md->b;
    float *xd = dropped(p, x, N, in, mseed);
    float *At = transposed(Am, r, in), *Bt = transposed(Bm, md->out, r); /* [in, r], [r, out] */
    int na = r > md->out ? r : md->out;
#pragma omp parallel
    {
        double *acc = scratch(na);
#pragma omp for schedule(static)
        for (long n = 0; n < N; n++) {
            const float *xr = xd + (size_t)n * in;
            float *ur = u + (size_t)n * r, *yr = y + (size_t)n * md->out_ld + md->out_row0;
            for (int k = 0; k < r; k++) acc[k] = 0;
            for (int i = 0; i < in; i++) { /* u[n,k] = sum_i xd[n,i] A[k,i] */
                double xi = xr[i];
#pragma omp simd
                for (int k = 0; k < r; k++) acc[k] += xi * At[(size_t)i * r + k];
            }
            for (int k = 0; k < r; k++) ur[k] = (float)acc[k];
            for (int o = 0; o < md->out; o++) acc[o] = 0;
            for (int k = 0; k < r; k++) { /* y[n,o] += scale * sum_k u[n,k] B[o,k] */
                double uk = ur[k];
#pragma omp simd
                for (int o = 0; o < md->out; o++) acc[o] += uk * Bt[(size_t)k * md->out + o];
            }
            for (int o = 0; o < md->out; o++) yr[o] += A->scale * (float)acc[o];
        }
        free(acc);
    }
    free(At), free(Bt);
    free(xd);
}

void qt_lora_bwd_cpu(const qt_lora_layout *A, const qt_lora_module *md, const float *a, float *ga, const float *x,
                     const float *u, const float *dy, float *dx, long N, float p, uint64_t mseed) {
    int r = A->cfg.rank, in = md->in, out = md->out;
    float ks = 1.0f / (1.0f - p), s = A->scale;
    const float *Am = a + md->a, *Bm = a + md->b;
    float *gA = ga + md->a, *gB = ga + md->b;
    float *xd = dropped(p, x, N, in, mseed), *g = malloc((size_t)N * r * sizeof *g);
    QT_CHECK(g, "out of memory for the LoRA backward (%ld x %d)", N, r);
#define DY(n, o) dy[(size_t)(n) * md->out_ld + md->out_row0 + (o)]
    /* dB[o,k] += scale * sum_n dy[n,o] u[n,k]: LORA_OB outputs at a time, each row of dy and u read once per block */
#pragma omp parallel for schedule(static)
    for (int o0 = 0; o0 < out; o0 += LORA_OB) {
        int no = out - o0 < LORA_OB ? out - o0 : LORA_OB;
        double *acc = outer_sums(dy + md->out_row0 + o0, md->out_ld, no, u, r, r, N);
        for (int oo = 0; oo < no; oo++)
            for (int k = 0; k < r; k++) gB[(size_t)(o0 + oo) * r + k] += s * (float)acc[(size_t)oo * r + k];
        free(acc);
    }
#pragma omp parallel
    {
        double *acc = scratch(r);
#pragma omp for schedule(static)
        for (long n = 0; n < N; n++) { /* g[n,k] = scale * sum_o dy[n,o] B[o,k] */
            for (int k = 0; k < r; k++) acc[k] = 0;
            for (int o = 0; o < out; o++) {
                double d = DY(n, o);
#pragma omp simd
                for (int k = 0; k < r; k++) acc[k] += d * Bm[(size_t)o * r + k];
            }
            for (int k = 0; k < r; k++) g[(size_t)n * r + k] = s * (float)acc[k];
        }
        free(acc);
    }
#undef DY
    /* dA[k,i] += sum_n g[n,k] xd[n,i]: LORA_IB inputs at a time, each row of g and xd read once per block */
#pragma omp parallel for schedule(static)
    for (int i0 = 0; i0 < in; i0 += LORA_IB) {
        int ni = in - i0 < LORA_IB ? in - i0 : LORA_IB;
        double *acc = outer_sums(g, r, r, xd + i0, in, ni, N);
        for (int k = 0; k < r; k++)
            for (int ii = 0; ii < ni; ii++) gA[(size_t)k * in + i0 + ii] += (float)acc[(size_t)k * ni + ii];
        free(acc);
    }
#pragma omp parallel
    {
        double *acc = scratch(in);
#pragma omp for schedule(static)
        for (long n = 0; n < N; n++) { /* dx[n,i] += mask * sum_k g[n,k] A[k,i] */
            for (int i = 0; i < in; i++) acc[i] = 0;
            for (int k = 0; k < r; k++) {
                double gk = g[(size_t)n * r + k];
#pragma omp simd
                for (int i = 0; i < in; i++) acc[i] += gk * Am[(size_t)k * in + i];
            }
            for (int i = 0; i < in; i++) {
                size_t j = (size_t)n * in + i;
                dx[j] += (p > 0 ? qt_lora_mask(mseed, j, p, ks) : 1.0f) * (float)acc[i];
            }
        }
        free(acc);
    }
    free(xd);
    free(g);
}

/* ---- the adapters beside qt_cpu_model's block matmuls ---- */

_Static_assert((int)QT_LORA_SITE_QKV == (int)QT_CPU_SITE_QKV && (int)QT_LORA_SITE_O == (int)QT_CPU_SITE_O &&
                   (int)QT_LORA_SITE_GU == (int)QT_CPU_SITE_GU && (int)QT_LORA_SITE_DOWN == (int)QT_CPU_SITE_DOWN,
               "a module's site is the cpu model's site");

struct qt_lora_cpu {
    qt_cpu_adapter ad;        /* first: the model calls back with this pointer */
    const qt_lora_layout *A;
    const float *a;
    float *ga;
    float **u;                /* per module [N, r]: xd A^T, kept from the forward for the backward */
    uint64_t seed;
    long step, micro;
};

/* The dropout mask seed of module md of layer l at the current step and micro-batch, and p (0 when
 * evaluating: step < 0). */
static uint64_t mask_seed(const qt_lora_cpu *c, int l, const qt_lora_module *md) {
    return qt_lora_mask_seed(c->seed, c->step, c->micro, l, md->target);
}

static float drop_p(const qt_lora_cpu *c) { return c->step < 0 ? 0.0f : c->A->cfg.dropout; }

static void cpu_fwd(qt_cpu_adapter *ad, int l, qt_cpu_site site, const float *x, float *y, long N) {
    qt_lora_cpu *c = (qt_lora_cpu *)ad;
    for (int i = l * c->A->per_layer; i < (l + 1) * c->A->per_layer; i++) {
        const qt_lora_module *md = &c->A->mods[i];
        if ((int)md->site == (int)site) qt_lora_fwd_cpu(c->A, md, c->a, x, c->u[i], y, N, drop_p(c), mask_seed(c, l, md));
    }
}

static void cpu_bwd(qt_cpu_adapter *ad, int l, qt_cpu_site site, const float *x, const float *dy, float *dx, long N) {
    qt_lora_cpu *c = (qt_lora_cpu *)ad;
    for (int i = l * c->A->per_layer; i < (l + 1) * c->A->per_layer; i++) {
        const qt_lora_module *md = &c->A->mods[i];
        if ((int)md->site == (int)site)
            qt_lora_bwd_cpu(c->A, md, c->a, c->ga, x, c->u[i], dy, dx, N, drop_p(c), mask_seed(c, l, md));
    }
}

qt_lora_cpu *qt_lora_cpu_create(const qt_lora_layout *A, const float *a, float *ga, long N, uint64_t seed) {
    qt_lora_cpu *c = calloc(1, sizeof *c);
    QT_CHECK(c, "out of memory");
    int nm = A->n_layers * A->per_layer;
    c->ad = (qt_cpu_adapter){cpu_fwd, cpu_bwd};
    c->A = A;
    c->a = a;
    c->ga = ga;
    c->seed = seed;
    c->u = calloc((size_t)nm, sizeof *c->u);
    QT_CHECK(c->u, "out of memory");
    for (int i = 0; i < nm; i++) {
        c->u[i] = malloc((size_t)N * A->cfg.rank * sizeof(float));
        QT_CHECK(c->u[i], "out of memory for the LoRA activations (%ld x %d)", N, A->cfg.rank);
    }
    return c;
}

qt_cpu_adapter *qt_lora_cpu_adapter(qt_lora_cpu *c) { return &c->ad; }

void qt_lora_cpu_set_batch(qt_lora_cpu *c, long step, long micro) {
    c->step = step;
    c->micro = micro;
}

void qt_lora_cpu_free(qt_lora_cpu *c) {
    if (!c) return;
    for (int i = 0; i < c->A->n_layers * c->A->per_layer; i++) free(c->u[i]);
    free(c->u);
    free(c);
}

unsigned qt_lora_cpu_grads(int trainable) {
    return (trainable & QT_LORA_X_NORMS ? QT_CPU_GRAD_NORMS : 0u) | (trainable & QT_LORA_X_EMBED ? QT_CPU_GRAD_EMBED : 0u) |
           (trainable & QT_LORA_X_LM_HEAD ? QT_CPU_GRAD_LM_HEAD : 0u);
}
