/* optim.c — CPU reference AdamW, learning-rate schedules and deterministic global-norm clipping.
 *
 * AdamW works elementwise in fp32 (bias corrections computed in double, rounded once to fp32), so
 * its result does not depend on the thread count. The gradient norm sums squares in double over
 * fixed blocks of QT_NORM_BLOCK elements and adds the block sums in index order. */
#include "qt_optim.h"

#include <math.h>
#include <stdlib.h>

#define QT_NORM_BLOCK 8192

void qt_adamw_cpu(float *w, const float *g, float *m, float *v, size_t n, const qt_adamw_hp *hp,
                  float wd, long t, float grad_scale) {
    const float b1 = hp->beta1, b2 = hp->beta2, eps = hp->eps, lr = hp->lr;
    /* Dividing by (1 - b^t) rather than multiplying by a rounded reciprocal keeps t=1 exact:
     * m / (1-b1) == g when m == (1-b1) g. */
    const float bc1 = (float)(1.0 - pow((double)b1, (double)t));
    const float bc2 = (float)(1.0 - pow((double)b2, (double)t));
    const long long nn = (long long)n;
#pragma omp parallel for schedule(static) if (nn > 65536)
    for (long long i = 0; i < nn; i++) {
        float gi = g[i] * grad_scale;
        float mi = b1 * m[i] + (1.0f - b1) * gi;
        float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        float upd = (mi / bc1) / (sqrtf(vi / bc2) + eps);
        w[i] -= lr * (upd + wd * w[i]);
    }
}

float qt_sched_lr(const qt_sched *s, long step) {
    const double lr = s->lr, lr_min = (double)s->final_lr_frac * s->lr;
    if (step < 0) step = 0;
    if (step < s->warmup) return (float)(lr * (double)(step + 1) / s->warmup);
    const double span = s->steps - s->warmup;
    double p = span > 0 ? (step - s->warmup) / span : 1.0;
    if (p > 1) p = 1;
    switch (s->kind) {
    case QT_SCHED_COSINE: return (float)(lr_min + (lr - lr_min) * 0.5 * (1.0 + cos(M_PI * p)));
    case QT_SCHED_LINEAR: return (float)(lr - (lr - lr_min) * p);
    case QT_SCHED_WSD: {
        const long start = (long)s->steps - s->cooldown;
        if (s->cooldown <= 0 || step < start) return (float)lr;
        double q = (double)(step - start) / s->cooldown;
        if (q > 1) q = 1;
        return (float)(lr_min + (lr - lr_min) * (1.0 - sqrt(q)));
    }
    }
    return (float)lr;
}

double qt_grad_norm_cpu(const float *g, size_t n) {
    const long long nb = (long long)((n + QT_NORM_BLOCK - 1) / QT_NORM_BLOCK);
    if (nb == 0) return 0.0;
    double *part = malloc((size_t)nb * sizeof *part);
    if (!part) { /* no room for the partials: the same blocks, one after the other */
        double tot = 0;
        for (size_t b = 0; b < (size_t)nb; b++) {
            size_t lo = b * QT_NORM_BLOCK, hi = lo + QT_NORM_BLOCK < n ? lo + QT_NORM_BLOCK : n;
            double s = 0;
            for (size_t i = lo; i < hi; i++) s += (double)g[i] * g[i];
            tot += s;
        }
        return sqrt(tot);
    }
#pragma omp parallel for schedule(static) if (nb > 8)
    for (long long b = 0; b < nb; b++) {
        size_t lo = (size_t)b * QT_NORM_BLOCK, hi = lo + QT_NORM_BLOCK < n ? lo + QT_NORM_BLOCK : n;
        double s = 0;
        for (size_t i = lo; i < hi; i++) s += (double)g[i] * g[i];
        part[b] = s;
    }
    double tot = 0;
    for (long long b = 0; b < nb; b++) tot += part[b];
    free(part);
    return sqrt(tot);
}

float qt_clip_scale(double norm, float max_norm) {
    /* A NaN norm yields 1 here: the caller sees the NaN norm itself and skips the step. */
    if (!(max_norm > 0) || !(norm > max_norm)) return 1.0f;
    return (float)(max_norm / norm);
}
