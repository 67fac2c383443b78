/* qt_optim.h — AdamW, learning-rate schedules and global-norm clipping (CPU reference; the GPU
 * kernels are tested against these). */
#ifndef QT_OPTIM_H
#define QT_OPTIM_H

#include <stddef.h>

#include "qt_config.h"

typedef struct {
    float lr, beta1, beta2, eps, weight_decay;
} qt_adamw_hp;

/* One AdamW step on n elements, t = 1-based step count (bias correction):
 *   g' = g * grad_scale;  m = b1 m + (1-b1) g';  v = b2 v + (1-b2) g'^2
 *   w -= lr * ( (m/(1-b1^t)) / (sqrt(v/(1-b2^t)) + eps) + wd * w )      (decoupled decay)
 * wd is hp->weight_decay for decayed tensors and 0 for the others (the caller decides). */
void qt_adamw_cpu(float *w, const float *g, float *m, float *v, size_t n, const qt_adamw_hp *hp,
                  float wd, long t, float grad_scale);

typedef struct {
    qt_sched_kind kind;
    float lr, final_lr_frac;
    int warmup, cooldown, steps;
} qt_sched;

/* Learning rate at 0-based step s: linear warmup lr*(s+1)/warmup for s < warmup, then
 *   cosine: lr_min + (lr-lr_min) * 0.5 * (1 + cos(pi p)),   p = (s-warmup)/(steps-warmup)
 *   linear: lr - (lr-lr_min) * p
 *   wsd:    lr until steps-cooldown, then lr_min + (lr-lr_min) * (1 - sqrt(q)),
 *           q = (s-(steps-cooldown))/cooldown
 * with lr_min = final_lr_frac * lr. */
float qt_sched_lr(const qt_sched *s, long step);

/* sqrt(sum g^2) over n elements, accumulated in double in a fixed order (thread-count independent). */
double qt_grad_norm_cpu(const float *g, size_t n);
/* The factor that clips a gradient of norm `norm` to max_norm (1 when max_norm <= 0 or norm small). */
float qt_clip_scale(double norm, float max_norm);

#endif
