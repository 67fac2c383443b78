/* fd_check.h — helpers of the CPU reference-op tests (test_ops.c, test_ops_gemma.c): random and poisoned
 * buffers, and the finite-difference check of a backward against its forward. One rng, R, seeded by main. */
#ifndef FD_CHECK_H
#define FD_CHECK_H

#include <stdint.h>

#include "qt_rng.h"
#include "qt_test.h"

static qt_rng R;

static inline float *rnd(long n, float s) {
    float *p = malloc((size_t)(n ? n : 1) * sizeof *p);
    for (long i = 0; i < n; i++) p[i] = s * qt_rng_normal(&R);
    return p;
}
static inline float *nans(long n) {
    float *p = malloc((size_t)(n ? n : 1) * sizeof *p);
    for (long i = 0; i < n; i++) p[i] = NAN;
    return p;
}
static inline float *zeros(long n) { return calloc((size_t)(n ? n : 1), sizeof(float)); }
static inline float *copy(const float *x, long n) {
    float *p = malloc((size_t)(n ? n : 1) * sizeof *p);
    memcpy(p, x, (size_t)n * sizeof *p);
    return p;
}
static inline double dotd(const float *a, const float *b, long n) {
    double s = 0;
    for (long i = 0; i < n; i++) s += (double)a[i] * b[i];
    return s;
}
static inline int all_finite(const float *p, long n) {
    for (long i = 0; i < n; i++)
        if (!isfinite(p[i])) return 0;
    return 1;
}

/* ---- finite differences ---- */

typedef double (*obj_fn)(void *ctx); /* <u, f(current inputs)> in double */
typedef struct {
    float *x;        /* the input, perturbed in place and restored */
    const float *g;  /* the analytic gradient of the objective w.r.t. x */
    long n;
    const char *name;
} fd_in;

/* Checks every input along 3 random directions (rel 1e-2) and at 3 coordinates (the largest-|g| of
 * a sample, and two random ones). Returns the largest relative error seen on directions. */
static inline double fd_check(const char *op, obj_fn f, void *ctx, fd_in *in, int nin) {
    const double eps = 1e-3, tol = 1e-2;
    double worst = 0;
    for (int k = 0; k < nin; k++) {
        fd_in *p = &in[k];
        float *x0 = copy(p->x, p->n);
        double rms = sqrt(dotd(p->g, p->g, p->n) / p->n);
        for (int dir = 0; dir < 3; dir++) {
            float *d = rnd(p->n, 1);
            for (long i = 0; i < p->n; i++) p->x[i] = (float)(x0[i] + eps * d[i]);
            double jp = f(ctx);
            for (long i = 0; i < p->n; i++) p->x[i] = (float)(x0[i] - eps * d[i]);
            double jm = f(ctx);
            memcpy(p->x, x0, (size_t)p->n * sizeof *x0);
            /* the perturbation actually applied, after rounding x0 +- eps d to fp32 */
            double ana = 0;
            for (long i = 0; i < p->n; i++) ana += p->g[i] * (((double)(float)(x0[i] + eps * d[i]) -
                                                              (double)(float)(x0[i] - eps * d[i])) / (2 * eps));
            double num = (jp - jm) / (2 * eps), rel = fabs(num - ana) / fmax(fabs(ana), 1e-12);
            worst = fmax(worst, rel);
            QT_EXPECT(fabs(num - ana) <= tol * fabs(ana) + 1e-6 * sqrt((double)p->n) * rms,
                      "%s d/d%s direction %d: analytic %.7g numeric %.7g", op, p->name, dir, ana, num);
            free(d);
        }
        long best = (long)qt_rng_below(&R, p->n);
        for (int s = 0; s < 8; s++) {
            long i = (long)qt_rng_below(&R, p->n);
            if (fabsf(p->g[i]) > fabsf(p->g[best])) best = i;
        }
        long pick[3] = {best, (long)qt_rng_below(&R, p->n), (long)qt_rng_below(&R, p->n)};
        for (int c = 0; c < 3; c++) {
            long i = pick[c];
            float hp = (float)(x0[i] + eps), hm = (float)(x0[i] - eps);
            p->x[i] = hp;
            double jp = f(ctx);
            p->x[i] = hm;
            double jm = f(ctx);
            p->x[i] = x0[i];
            double num = (jp - jm) / ((double)hp - hm), ana = p->g[i];
            QT_EXPECT(fabs(num - ana) <= tol * fabs(ana) + 2e-3 * rms, "%s d/d%s[%ld]: analytic %.7g numeric %.7g",
                      op, p->name, i, ana, num);
        }
        free(x0);
    }
    return worst;
}

/* "+=": out(base) - base must equal out(0) */
static inline int accumulates(const char *what, const float *from_base, const float *base, const float *from_zero, long n) {
    float *diff = malloc((size_t)n * sizeof *diff);
    for (long i = 0; i < n; i++) diff[i] = from_base[i] - base[i];
    int ok = qt_t_close(what, diff, from_zero, n, 1e-5, 1e-5);
    free(diff);
    return ok;
}

#endif
